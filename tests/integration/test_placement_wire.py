#!/usr/bin/python3
"""Placement on the wire (issue #17), on real daemons (CPU backend, 4
devices) over real sockets, with an independent client (python3-grpcio).

 - fields:    every `devices` field is checked by the server: an index
              outside the mesh, one given twice, more than the mesh has:
              INVALID_ARGUMENT naming the field and the entry
              ("UploadHeader.devices[1] = 7: the mesh has devices 0..3");
              the whole mesh by default (CreateSessionResponse.devices,
              TensorInfo.devices of uploads, ops and Describe);
              DeviceInfo.gpu.
 - narrowed:  a session narrowed at creation to [1, 2]: its reply, an
              upload without devices lands on [1, 2], one on [0] is
              PERMISSION_DENIED naming device 0, an op placed outside too.
 - jobs:      CreateJobToken gpus = [2, 3] binds the job to devices [2, 3]
              (returned), its session is allowed [2, 3] (narrowing works,
              widening is PERMISSION_DENIED naming the job), refused on
              [0]; gpus and devices both, an unknown GPU: INVALID_ARGUMENT;
              the binding outlives a restart in job_tokens_file; the CLI's
              job-token --gpus.
 - slurm:     deploy/slurm/prolog.sh with SLURM_JOB_GPUS=1,3 (and once with
              only CUDA_VISIBLE_DEVICES=1,3) binds the job to devices
              [1, 3] (the token's session says so), the epilog frees it
              (the token is refused afterwards); GPU lists that are not
              indices, GPUs the daemon does not have, a job without GPUs
              under PARADEV_PROLOG_REQUIRE_GPUS.
 - tenants:   [tenant NAME] devices = 0, 1 bounds the tenant's sessions
              (intersected with a job's binding: never more than either);
              bad values refused by --check-config.
 - halves:    two sessions on disjoint halves, each seeing only its own
              per-device bytes in ListSessions, `paradev admin sessions
              --json` and /metrics (values from the upload sizes).

Checks that need subsets in the engine and the scheduler (an upload landing
on [1, 2], the per-device bytes) probe for them first: before the engine's
and scheduler's placement is built (the engine answers UNIMPLEMENTED "not
built yet" for a subset) they print SKIP-WAITS and pass; after it they run.

Usage: test_placement_wire.py PARADEVD PYTHON_PROTO_DIR PARADEV_ADMIN_CLI DEPLOY_DIR
Exit 0: all passed; 1: a check failed; 77: skipped (grpcio missing).
"""
import json
import os
import re
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_service as ts  # noqa: E402  (parses the same four arguments)
from test_service import (C, Client, Daemon, apb, expect_error, pb,  # noqa: E402
                          write)

PARADEVD, ADMIN_CLI, DEPLOY = ts.PARADEVD, ts.ADMIN_CLI, ts.DEPLOY
NDEV = 4


def open_session(cl, **kw):
    return cl.pd("CreateSession", pb.CreateSessionRequest(**kw), pb.CreateSessionResponse)


def upload(cl, tok, hid, n, devices=(), metadata=None):
    """A float32 [n] value mirrored onto `devices` (none: the default)."""
    data = struct.pack("<%df" % n, *[float(i % 13) for i in range(n)])
    hdr = pb.UploadHeader(session_token=tok, id=hid, dtype=pb.DTYPE_FLOAT32,
                          shape=pb.Shape(dims=[n]), devices=list(devices))
    items = [pb.UploadRequest(header=hdr)]
    for off in range(0, len(data), 60000):
        items.append(pb.UploadRequest(chunk=pb.UploadChunk(offset=off,
                                                           data=data[off:off + 60000])))
    f = cl.ch.stream_unary(ts.SVC + "Upload", request_serializer=lambda m: m.SerializeToString(),
                           response_deserializer=pb.UploadResponse.FromString)
    return f(iter(items), timeout=30, metadata=metadata)


def fill(out_id, dims, value=1.0, devices=()):
    op = ts.fill_op(out_id, dims, value)
    op.devices.extend(devices)
    return op


def listed(adm):
    return adm.admin("ListSessions", apb.ListSessionsRequest(), apb.ListSessionsResponse)


def summary(adm, seq):
    return [s for s in listed(adm).sessions if s.session_id == seq][0]


def mint(adm, job, gpus=(), devices=(), uid=-1):
    return adm.admin("CreateJobToken", apb.CreateJobTokenRequest(
        job_id=job, uid=uid, gpus=list(gpus), devices=list(devices)),
        apb.CreateJobTokenResponse)


def placement_built(cl):
    """True once the engine and the scheduler place tensors on subsets: an
    upload and a Fill on [0] of a plain session land on [0] (before, the
    placeholders answer UNIMPLEMENTED, or place on the whole mesh)."""
    r = open_session(cl)
    try:
        u = upload(cl, r.session_token, 9000, 2, devices=[0])
        res = cl.execute(r.session_token, fill(9001, [2], devices=[0]))
        return list(u.tensor.devices) == [0] and \
            list(res.results[0].outputs[0].devices) == [0]
    except ts.grpc.RpcError as e:
        if e.code() == C.UNIMPLEMENTED and "not built yet" in (e.details() or ""):
            return False
        raise
    finally:
        cl.pd("CloseSession", pb.CloseSessionRequest(session_token=r.session_token),
              pb.CloseSessionResponse)


def waits(what):
    print("SKIP-WAITS %s: the engine's and scheduler's placement is not built "
          "yet (the engine answers UNIMPLEMENTED for a subset); runs after merge" % what,
          flush=True)


# --------------------------------------------------------------------------
# fields


def check_fields():
    d = Daemon(ndev=NDEV)
    try:
        cl = Client(d.target)
        info = cl.info()
        assert [x.gpu for x in info.devices] == list(range(NDEV)), info.devices  # cpu: k is GPU k
        r = open_session(cl)
        tok = r.session_token
        # The default: the whole mesh.
        assert list(r.devices) == [0, 1, 2, 3] and r.num_devices == NDEV, r
        u = upload(cl, tok, 1, 8)
        assert list(u.tensor.devices) == [0, 1, 2, 3], u.tensor
        u = upload(cl, tok, 2, 8, devices=[0, 1, 2, 3])  # the whole mesh, named
        assert list(u.tensor.devices) == [0, 1, 2, 3], u.tensor
        res = cl.execute(tok, fill(3, [2, 2]), pb.Operation(op="Add", inputs=[1, 2],
                                                            output_ids=[4]))
        assert [list(o.outputs[0].devices) for o in res.results] == [[0, 1, 2, 3]] * 2, res
        items = [pb.EnqueueRequest(session_token=tok, execute=fill(5, [3]))]
        out = cl.enqueue(items)
        assert out[0].status.code == 0 and list(out[0].outputs[0].devices) == [0, 1, 2, 3], out
        ds = cl.describe(tok, [1, 3, 5])
        assert [list(x.devices) for x in ds] == [[0, 1, 2, 3]] * 3, ds

        # Malformed devices: INVALID_ARGUMENT naming the field and entry.
        bad = r"the mesh has devices 0\.\.3"
        expect_error(C.INVALID_ARGUMENT, open_session, cl, devices=[7],
                     match=r"^CreateSessionRequest\.devices\[0\] = 7: " + bad)
        expect_error(C.INVALID_ARGUMENT, open_session, cl, devices=[1, 1],
                     match=r"CreateSessionRequest\.devices\[1\] = 1: device 1 is "
                           r"listed at \[0\] already")
        expect_error(C.INVALID_ARGUMENT, open_session, cl, devices=[0, 1, 2, 3, 0],
                     match=r"CreateSessionRequest\.devices lists 5 devices: the mesh has 4")
        expect_error(C.INVALID_ARGUMENT, open_session, cl, devices=[-1],
                     match=r"CreateSessionRequest\.devices\[0\] = -1: " + bad)
        expect_error(C.INVALID_ARGUMENT, upload, cl, tok, 10, 4, devices=[1, 7],
                     match=r"UploadHeader\.devices\[1\] = 7: " + bad)
        expect_error(C.INVALID_ARGUMENT, upload, cl, tok, 10, 4, devices=[2, 0, 2],
                     match=r"UploadHeader\.devices\[2\] = 2: device 2 is "
                           r"listed at \[0\] already")
        expect_error(C.INVALID_ARGUMENT, cl.execute, tok, fill(11, [2]),
                     fill(12, [2], devices=[3, 3]),
                     match=r"op 1 \(Fill\): Operation\.devices\[1\] = 3: device 3 is "
                           r"listed at \[0\] already")
        out = cl.enqueue([pb.EnqueueRequest(session_token=tok, execute=fill(13, [2],
                                                                            devices=[4]))])
        assert out[0].status.code == C.INVALID_ARGUMENT.value[0], out
        assert re.search(r"Operation\.devices\[0\] = 4: " + bad, out[0].status.message), out
        expect_error(C.INVALID_ARGUMENT, cl.pd, "UploadFromSharedMemory",
                     pb.UploadFromSharedMemoryRequest(session_token=tok, id=14,
                                                      dtype=pb.DTYPE_FLOAT32,
                                                      shape=pb.Shape(dims=[2]),
                                                      region="none", devices=[9]),
                     pb.UploadResponse,
                     match=r"UploadFromSharedMemoryRequest\.devices\[0\] = 9: " + bad)
        expect_error(C.INVALID_ARGUMENT, cl.pd, "LoadTensors",
                     pb.LoadTensorsRequest(session_token=tok, source="x.npy",
                                           tensors=[pb.LoadTensorSpec(name="", id=15,
                                                                      devices=[0, 8])]),
                     pb.LoadTensorsResponse,
                     match=r"tensor 0: LoadTensorSpec\.devices\[1\] = 8: " + bad)
        expect_error(C.INVALID_ARGUMENT, cl.pd, "LoadTensors",
                     pb.LoadTensorsRequest(session_token=tok, source="x.npy",
                                           default_devices=[5]),
                     pb.LoadTensorsResponse,
                     match=r"LoadTensorsRequest\.default_devices\[0\] = 5: " + bad)
        # Nothing of the refused requests was made.
        expect_error(C.NOT_FOUND, cl.describe, tok, [10])
        expect_error(C.NOT_FOUND, cl.describe, tok, [11])
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# a session narrowed at creation


def check_narrowed():
    d = Daemon("--default-memory-quota", "unlimited", ndev=NDEV)
    try:
        cl = Client(d.target)
        r = open_session(cl, devices=[1, 2])
        assert list(r.devices) == [1, 2] and r.num_devices == 2, r
        tok = r.session_token
        r2 = open_session(cl, devices=[3, 0])  # order kept
        assert list(r2.devices) == [3, 0] and r2.num_devices == 2, r2
        if not placement_built(cl):
            waits("check_narrowed (uploads and ops on [1, 2], refusals on [0])")
            return
        u = upload(cl, tok, 1, 16)
        assert list(u.tensor.devices) == [1, 2], u.tensor
        assert list(cl.describe(tok, [1])[0].devices) == [1, 2]
        res = cl.execute(tok, fill(2, [4]))
        assert list(res.results[0].outputs[0].devices) == [1, 2], res
        msg = expect_error(C.PERMISSION_DENIED, upload, cl, tok, 3, 4, devices=[0])
        assert re.search(r"\b0\b", msg), msg  # names device 0
        msg = expect_error(C.PERMISSION_DENIED, cl.execute, tok, fill(4, [2], devices=[2, 3]))
        assert re.search(r"\b3\b", msg), msg
        u = upload(cl, tok, 5, 16, devices=[2])  # inside: fine
        assert list(u.tensor.devices) == [2], u.tensor
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# jobs held to their GPUs


def check_job_tokens():
    tmp = ts._mkdtemp(prefix="paradevd-place-")
    jt = os.path.join(tmp, "state", "job-tokens")
    os.mkdir(os.path.dirname(jt))
    conf = write(os.path.join(tmp, "p.conf"), "[auth]\njob_tokens_file = %s\n" % jt)
    d = Daemon("--default-memory-quota", "unlimited", config=conf, ndev=NDEV)
    try:
        cl, adm = Client(d.target), Client("unix:" + d.admin)
        t = mint(adm, "910", gpus=[3, 2])
        assert list(t.devices) == [2, 3], t  # the devices on GPUs 2 and 3, mesh order
        r = open_session(cl, job_token=t.token)
        assert list(r.devices) == [2, 3] and r.num_devices == 2, r
        assert list(open_session(cl, job_token=t.token, devices=[3]).devices) == [3]
        expect_error(C.PERMISSION_DENIED, open_session, cl, job_token=t.token, devices=[0, 2],
                     match=r'device \[0\] is not allocated to this session: job "910" may '
                           r'use devices \[2, 3\] only')
        d.wait_line(r'job token for job "910" \(any uid, devices \[2, 3\],')
        # By device indices; unbound; mistakes.
        assert list(mint(adm, "911", devices=[1]).devices) == [1]
        assert list(mint(adm, "912").devices) == []
        assert list(open_session(cl, job_token=mint(adm, "913").token).devices) == [0, 1, 2, 3]
        expect_error(C.INVALID_ARGUMENT, mint, adm, "914", gpus=[1], devices=[1],
                     match="gpus and devices both given")
        expect_error(C.INVALID_ARGUMENT, mint, adm, "914", gpus=[1, 7],
                     match=r"gpus\[1\] = 7: no device of this paradevd runs on GPU 7 "
                           r"\(its devices 0\.\.3 are on GPUs 0, 1, 2, 3\)")
        expect_error(C.INVALID_ARGUMENT, mint, adm, "914", gpus=[2, 2],
                     match=r"gpus\[1\] = 2: GPU 2 is gpus\[0\] already")
        expect_error(C.INVALID_ARGUMENT, mint, adm, "914", devices=[6],
                     match=r"CreateJobTokenRequest\.devices\[0\] = 6: the mesh has devices 0\.\.3")
        # The CLI: --gpus, the devices in --json.
        c = ts.cli(d, "job-token", "--job", "915", "--gpus", "0,1", "--json")
        assert c.returncode == 0, c.stderr
        doc = json.loads(c.stdout)
        assert doc["devices"] == [0, 1] and doc["token"].startswith("pdjob1_"), doc
        c = ts.cli(d, "job-token", "--job", "915", "--gpus", "1,3", "--field", "devices")
        assert c.returncode == 0 and c.stdout.strip() == "[1,3]", (c.stdout, c.stderr)
        c = ts.cli(d, "job-token", "--job", "916", "--gpus", "1,,3")
        assert c.returncode == 2 and "--gpus '1,,3': expected at most 64 GPU indices" in c.stderr, c.stderr
        c = ts.cli(d, "job-token", "--job", "916", "--gpus", "9")
        assert c.returncode == 1 and "no device of this paradevd runs on GPU 9" in c.stderr, \
            c.stderr
        c = ts.cli(d, "job-token", "--job", "917", "--gpus", "2")
        assert c.returncode == 0 and "devices 2 (give it" in c.stderr, c.stderr
        if placement_built(cl):
            tok = r.session_token
            u = upload(cl, tok, 1, 16)
            assert list(u.tensor.devices) == [2, 3], u.tensor
            msg = expect_error(C.PERMISSION_DENIED, upload, cl, tok, 2, 4, devices=[0])
            assert re.search(r"\b0\b", msg), msg
            s = summary(adm, 1)
            assert list(s.devices) == [2, 3], s
        else:
            waits("check_job_tokens (the job session's uploads on [2, 3], refused on [0])")
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    text = open(jt).read()
    assert re.search(r"^v2 [0-9a-f]{64} \d+ -1 2,3 910$", text, re.M), text
    assert re.search(r"^v1 [0-9a-f]{64} \d+ -1 912$", text, re.M), text
    # The binding outlives a restart.
    d = Daemon(config=conf, ndev=NDEV)
    try:
        cl = Client(d.target)
        assert list(open_session(cl, job_token=t.token).devices) == [2, 3]
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    # A daemon with fewer devices than the binding names.
    d = Daemon(config=conf, ndev=2)
    try:
        expect_error(C.FAILED_PRECONDITION, open_session, Client(d.target), job_token=t.token,
                     match=r'job "910" is bound to device 2, which this paradevd does not '
                           r'have \(devices 0\.\.1\)')
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# the Slurm prolog and epilog


def check_slurm_gpus():
    d = Daemon(ndev=NDEV)
    tmp = ts._mkdtemp(prefix="paradevd-slurm-gpus-")
    jobs = os.path.join(tmp, "jobs")
    try:
        cl = Client(d.target)
        senv = {"PARADEV": ADMIN_CLI, "PARADEV_ADMIN_SOCKET": d.admin,
                "PARADEV_PROLOG_WAIT": "10", "PARADEV_JOB_TOKEN_DIR": jobs,
                "SLURM_JOB_UID": str(os.getuid())}

        def run(script, job, **extra):
            e = {k: v for k, v in os.environ.items()
                 if not k.startswith(("SLURM_", "PARADEV", "CUDA_VISIBLE"))}
            e.update(senv, SLURM_JOB_ID=job, **extra)
            e = {k: v for k, v in e.items() if v is not None}
            return subprocess.run([os.path.join(DEPLOY, "slurm", script)], capture_output=True,
                                  text=True, timeout=300, env=e)

        def token(job):
            return open(os.path.join(jobs, job)).read().strip()

        r = run("prolog.sh", "920", SLURM_JOB_GPUS="1,3", CUDA_VISIBLE_DEVICES="0")
        assert r.returncode == 0, r.stderr
        t920 = token("920")
        s = open_session(cl, job_token=t920)
        assert list(s.devices) == [1, 3], s  # SLURM_JOB_GPUS wins
        expect_error(C.PERMISSION_DENIED, open_session, cl, job_token=t920, devices=[0],
                     match=r'job "920" may use devices \[1, 3\] only')
        r = run("prolog.sh", "921", CUDA_VISIBLE_DEVICES="1,3")
        assert r.returncode == 0, r.stderr
        t921 = token("921")
        assert list(open_session(cl, job_token=t921).devices) == [1, 3]
        r = run("prolog.sh", "922")  # no GPUs: a token bound to none
        assert r.returncode == 0, r.stderr
        assert list(open_session(cl, job_token=token("922")).devices) == [0, 1, 2, 3]
        # A GPU gres without device files: Slurm's CUDA_VISIBLE_DEVICES=NoDevFiles
        # means no GPUs, not a malformed list.
        r = run("prolog.sh", "924", CUDA_VISIBLE_DEVICES="NoDevFiles")
        assert r.returncode == 0, r.stderr
        assert list(open_session(cl, job_token=token("924")).devices) == [0, 1, 2, 3]
        # The epilog frees the binding with the token.
        for job, tok in (("920", t920), ("921", t921)):
            r = run("epilog.sh", job)
            assert r.returncode == 0, r.stderr
            expect_error(C.UNAUTHENTICATED, open_session, cl, job_token=tok,
                         match="unknown to this paradevd")
        # Mistakes fail the prolog, with a token for nobody.
        for extra, msg in (
                ({"SLURM_JOB_GPUS": "GPU-6b2f"}, "SLURM_JOB_GPUS 'GPU-6b2f' is not a list of GPU"),
                ({"CUDA_VISIBLE_DEVICES": "1,,2"}, "CUDA_VISIBLE_DEVICES '1,,2' is not a list"),
                ({"SLURM_JOB_GPUS": "2,5"}, "no device of this paradevd runs on GPU 5"),
                ({"PARADEV_PROLOG_REQUIRE_GPUS": "1"}, "the job has no GPUs")):
            r = run("prolog.sh", "923", **extra)
            assert r.returncode == 1 and msg in r.stderr, (extra, r.stderr)
            assert not os.path.exists(os.path.join(jobs, "923"))
        for job in ("922", "924"):
            r = run("epilog.sh", job)
            assert r.returncode == 0, r.stderr
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# tenants


def check_tenants():
    tmp = ts._mkdtemp(prefix="paradevd-tenant-dev-")
    conf = write(os.path.join(tmp, "t.conf"),
                 "[tenant lab]\nidentities = uid:%d\ndevices = 0, 1\n" % os.getuid())
    d = Daemon(config=conf, ndev=NDEV)
    try:
        cu, adm = Client("unix:" + d.sock), Client("unix:" + d.admin)
        r = open_session(cu)
        assert list(r.devices) == [0, 1] and r.num_devices == 2, r
        assert list(open_session(cu, devices=[1]).devices) == [1]
        expect_error(C.PERMISSION_DENIED, open_session, cu, devices=[1, 2],
                     match=r'device \[2\] is not allocated to this session: tenant "lab" '
                           r'may use devices \[0, 1\] only')
        # A job of the tenant: never more than either.
        t = mint(adm, "930", gpus=[1, 2])
        assert list(open_session(cu, job_token=t.token).devices) == [1]
        expect_error(C.PERMISSION_DENIED, open_session, cu, job_token=t.token, devices=[2],
                     match=r'job "930" \(devices \[1, 2\]\) of tenant "lab" \(devices \[0, 1\]\)')
        t = mint(adm, "931", gpus=[2, 3])
        expect_error(C.FAILED_PRECONDITION, open_session, cu, job_token=t.token,
                     match=r'job "931" was allocated devices \[2, 3\] and tenant "lab" devices '
                           r'\[0, 1\]: they share none')
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    # Values --check-config refuses, naming the file, line and key.
    for value, msg in (("0, 0", "device 0 is listed twice"),
                       ("0,", "expected daemon device indices separated by commas"),
                       ("one", "expected daemon device indices 0 to 63"),
                       ("", "expected daemon device indices"),
                       ("1, 9", "device 9 is not in the mesh, which has devices 0..3")):
        bad = write(os.path.join(tmp, "bad.conf"),
                    "[tenant lab]\nidentities = uid:1\ndevices = %s\n" % value)
        r = subprocess.run([PARADEVD, "--check-config", "--config", bad, "--devices", "4"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and msg in r.stderr and "bad.conf:" in r.stderr, \
            (value, r.stderr)
    ok = write(os.path.join(tmp, "ok.conf"),
               "[tenant lab]\nidentities = uid:1\ndevices = 3,1\n")
    r = subprocess.run([PARADEVD, "--check-config", "--config", ok, "--devices", "4"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------
# disjoint halves


def check_halves():
    d = Daemon("--default-memory-quota", "unlimited", ndev=NDEV)
    try:
        cl, adm = Client(d.target), Client("unix:" + d.admin)
        a = open_session(cl, client_name="left", devices=[0, 1])
        b = open_session(cl, client_name="right", devices=[2, 3])
        if not placement_built(cl):
            waits("check_halves (per-device bytes of sessions on disjoint halves)")
            return
        # Mirrored float32: every component holds the whole value.
        upload(cl, a.session_token, 1, 1024)        # 4096 bytes on 0 and 1
        upload(cl, b.session_token, 1, 3 * 1024)    # 12288 bytes on 2 and 3
        upload(cl, b.session_token, 2, 512, devices=[3])  # 2048 more on 3
        sa, sb = summary(adm, 1), summary(adm, 2)
        assert list(sa.devices) == [0, 1] and list(sb.devices) == [2, 3], (sa, sb)
        assert list(sa.device_memory_bytes) == [4096, 4096, 0, 0], sa
        assert list(sb.device_memory_bytes) == [0, 0, 12288, 12288 + 2048], sb
        assert sa.memory_bytes == 8192 and sb.memory_bytes == 2 * 12288 + 2048, (sa, sb)
        c = ts.cli(d, "sessions", "--json")
        assert c.returncode == 0, c.stderr
        rows = {x["client_name"]: x for x in json.loads(c.stdout)["sessions"]}
        assert rows["left"]["devices"] == [0, 1], rows
        assert rows["right"]["device_memory_bytes"] == [0, 0, 12288, 14336], rows
        c = ts.cli(d, "sessions")
        assert re.search(r"\n1 +left .* 0,1 ", c.stdout), c.stdout
        assert "session 2 per device: 2: 12.0 KiB 3: 14.0 KiB" in c.stdout, c.stdout
        m = ts.scrape(d.http)
        assert ts.metric(m, "paradev_session_device_memory_bytes", session="1",
                         device="0") == 4096
        assert ts.metric(m, "paradev_session_device_memory_bytes", session="2",
                         device="3") == 14336
        assert ts.metric(m, "paradev_session_device_memory_bytes", session="1",
                         device="2") is None  # not its device: no series
        assert ts.metric(m, "paradev_session_devices", session="2", devices="2,3") == 2
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


def check_quota_share():
    """The default quota (half the mesh's memory) of a session allowed
    fewer devices is half of ITS devices' memory; an asked quota stays."""
    d = Daemon(ndev=NDEV, mem=64 << 20)
    try:
        cl = Client(d.target)
        whole = open_session(cl).memory_quota_bytes
        assert whole == 2 * (64 << 20), whole  # 50% of 4 x 64 MiB
        one = open_session(cl, devices=[1]).memory_quota_bytes
        assert one == 32 << 20, one
        assert open_session(cl, devices=[3, 0]).memory_quota_bytes == 64 << 20
        asked = open_session(cl, devices=[1], memory_quota_bytes=8 << 20)
        assert asked.memory_quota_bytes == 8 << 20, asked
        # More than its devices hold is capped at their memory.
        big = open_session(cl, devices=[2], memory_quota_bytes=1 << 30)
        assert big.memory_quota_bytes == 64 << 20, big
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


CHECKS = [check_fields, check_narrowed, check_quota_share, check_job_tokens, check_slurm_gpus, check_tenants,
          check_halves]


def main():
    return ts.run_checks(CHECKS)


if __name__ == "__main__":
    sys.exit(main())
