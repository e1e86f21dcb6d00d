#!/usr/bin/python3
"""Operators apart from clients, and job ids that are proven (issue #14),
tested on real daemons over real sockets.

 - deploy:   the shipped unit, sysusers file, configuration and DaemonSet
             give clients and operators different groups or places.
 - rights:   every Admin method is refused (PERMISSION_DENIED naming the
             method) to callers on the client listeners, TCP and Unix, with
             no effect, and the refusal is logged; the admin socket is
             accepted. The admin socket goes to [daemon] admin_socket_group,
             the client socket stays the daemon's group; a group that does
             not exist stops the start, a bad name fails --check-config.
 - tokens:   a job token binds sessions to its job; a job id claimed
             without one is a label that KillJob and KillSession(job_id)
             never match (a spoofed job id survives the job's kill), and is
             refused under [auth] require_job_token (reloaded by SIGHUP); a
             job_id that is not the token's, bad tokens, revoked tokens and
             expired ones are refused; tokens are bounded and replaced per
             job; libparadev presents $PARADEV_JOB_TOKEN by itself.
 - slurm:    deploy/slurm/prolog.sh, task_prolog.sh and epilog.sh run for
             real (with the stand-in `paradev`, a temporary admin socket and
             token directory) against a daemon holding sessions of two jobs,
             a spoofed one and a client named not-DRAINING: the prolog mints
             a 0400 token file, the TaskProlog exports it, the epilog ends
             exactly the job's sessions and every byte they held comes back;
             a requeue, a drain and bad environments.

Usage: test_ops.py PARADEVD PYTHON_PROTO_DIR PARADEV_ADMIN_CLI DEPLOY_DIR
Environment: PARADEV_LIBRARY and PARADEV_PYTHON_DIR (libparadev and the
Python package) for the libparadev check, skipped without them.
Exit 0: all passed; 1: a check failed; 77: skipped (grpcio missing).
"""
import grp
import os
import re
import signal
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_service as ts  # noqa: E402  (parses the same four arguments)
from test_service import (C, Client, Daemon, apb, busy_work, expect_error,  # noqa: E402
                          pb, wait_for, write)

PARADEVD, ADMIN_CLI, DEPLOY = ts.PARADEVD, ts.ADMIN_CLI, ts.DEPLOY


def mint(adm, job, uid=-1, lifetime=0):
    return adm.admin("CreateJobToken", apb.CreateJobTokenRequest(
        job_id=job, uid=uid, lifetime_seconds=lifetime), apb.CreateJobTokenResponse)


def alive(cl, tok):
    cl.pd("KeepAlive", pb.KeepAliveRequest(session_token=tok), pb.KeepAliveResponse)
    return True


def gone(cl, tok):
    expect_error(C.NOT_FOUND, cl.pd, "KeepAlive", pb.KeepAliveRequest(session_token=tok),
                 pb.KeepAliveResponse)
    return True


def listed(adm, job=""):
    return adm.admin("ListSessions", apb.ListSessionsRequest(job_id=job),
                     apb.ListSessionsResponse)


def admin_cli(d, *args, env=None):
    return ts.cli(d, *args, env=env)


# --------------------------------------------------------------------------
# rights


ADMIN_CALLS = [
    ("ListSessions", lambda: apb.ListSessionsRequest(), apb.ListSessionsResponse),
    ("KillSession", lambda: apb.KillSessionRequest(session_id=1), apb.KillSessionResponse),
    ("Drain", lambda: apb.DrainRequest(), apb.DrainResponse),
    ("SetLogLevel", lambda: apb.SetLogLevelRequest(spec="debug"), apb.SetLogLevelResponse),
    ("CreateJobToken", lambda: apb.CreateJobTokenRequest(job_id="spoof", uid=-1),
     apb.CreateJobTokenResponse),
    ("KillJob", lambda: apb.KillJobRequest(job_id="7"), apb.KillJobResponse),
]


def other_group():
    """A group of this machine that is not this process's own."""
    for g in grp.getgrall():
        if g.gr_gid != os.getegid() and re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*", g.gr_name):
            return g
    return None


def check_operator_rights():
    g = other_group()
    tmp = ts._mkdtemp(prefix="paradevd-ops-")
    conf = write(os.path.join(tmp, "p.conf"),
                 "[daemon]\nadmin_socket_group = %s\n" % g.gr_name if g else "")
    d = Daemon("--log", "info", config=conf)
    try:
        cl, cu, adm = Client(d.target), Client("unix:" + d.sock), Client("unix:" + d.admin)
        st = os.stat(d.admin)
        assert stat.S_IMODE(st.st_mode) == 0o660, oct(st.st_mode)
        assert os.stat(d.sock).st_gid == os.getegid()
        if g:
            # Operators' group on the admin socket, clients' on the other.
            assert st.st_gid == g.gr_gid, (st.st_gid, g)
            d.wait_line(r"admin service on unix:%s \(mode 0660, group %s\)"
                        % (re.escape(d.admin), re.escape(g.gr_name)))
        else:
            print("note: no second group on this machine; admin_socket_group not checked")
        victim = cl.session(client_name="victim", job_token=mint(adm, "7").token)
        seq = listed(adm).sessions[0].session_id
        assert seq == 1
        tokens_before = listed(adm).job_tokens
        # A client on either listener: refused, nothing done, logged.
        for who in (cl, cu):
            for meth, req, resp in ADMIN_CALLS:
                expect_error(C.PERMISSION_DENIED, who.admin, meth, req(), resp,
                             match=r"^Admin\.%s needs an operator: identity \"" % meth)
                d.wait_line(r"refused /paradev\.v1\.Admin/%s \(not_operator\): identity "
                            r"\".*\" tenant \".*\": Admin\.%s needs an operator"
                            % (meth, meth))
        assert alive(cl, victim)
        lst = listed(adm)
        assert not lst.draining and lst.job_tokens == tokens_before, lst
        assert cl.health() == ts.H.SERVING
        # The log level is what it was: SetLogLevel reports "info" before.
        r = adm.admin("SetLogLevel", apb.SetLogLevelRequest(spec="info"), apb.SetLogLevelResponse)
        assert r.previous == "info", r
        # The admin socket: every method accepted (KillJob ends the victim).
        for meth, req, resp in ADMIN_CALLS:
            if meth == "KillSession":
                continue  # below, on a real session
            r = adm.admin(meth, req(), resp)
            if meth == "KillJob":
                assert r.sessions_killed == 1 and r.token_revoked, r
        assert gone(cl, victim)
        adm.admin("Drain", apb.DrainRequest(resume=True), apb.DrainResponse)
        other = cl.session(client_name="other")
        r = adm.admin("KillSession", apb.KillSessionRequest(
            session_id=listed(adm).sessions[0].session_id), apb.KillSessionResponse)
        assert r.sessions_killed == 1 and gone(cl, other), r
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()

    # A group that does not exist stops the start, naming it; a name that
    # cannot be a group fails --check-config.
    bad = write(os.path.join(tmp, "nogroup.conf"),
                "[daemon]\nadmin_socket_group = no-such-group-pd\n")
    r = subprocess.run([PARADEVD, "--config", bad, "--listen", "unix:" + tmp + "/n.sock",
                        "--admin-socket", tmp + "/n-admin.sock", "--metrics-listen", "",
                        "--devices", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "cannot give the admin socket" in r.stderr and \
        "'no-such-group-pd': no such group" in r.stderr, (r.returncode, r.stderr)
    r = subprocess.run([PARADEVD, "--check-config", "--config", bad], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr  # checkable where the group is not made yet
    worse = write(os.path.join(tmp, "badgroup.conf"),
                  "[daemon]\nadmin_socket_group = two words\n")
    r = subprocess.run([PARADEVD, "--check-config", "--config", worse], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "admin_socket_group = 'two words': expected a group name" \
        in r.stderr, r.stderr


def check_deploy_files():
    """deploy/ keeps clients and operators apart: the shipped configuration
    gives the admin socket the operators' group, which sysusers makes and
    the unit adds to the daemon's user, and which is not the daemon's (the
    clients') group; it requires job tokens; the Kubernetes admin socket is
    outside the host path client pods mount, and its configuration checks."""
    conf = open(os.path.join(DEPLOY, "paradevd.conf")).read()
    unit = open(os.path.join(DEPLOY, "systemd", "paradevd.service.in")).read()
    users = open(os.path.join(DEPLOY, "systemd", "paradevd.sysusers")).read()
    key = lambda k, text: re.search(r"(?m)^%s\s*=\s*(\S*)" % k, text).group(1)
    key_line = lambda k, text: re.search(r"(?m)^%s\s*=\s*(.*)$" % k, text).group(1)
    admin_group, client_group = key("admin_socket_group", conf), key("Group", unit)
    assert admin_group == "paradev-admin" and client_group == "paradev", \
        (admin_group, client_group)
    assert key("SupplementaryGroups", unit) == admin_group
    assert re.search(r"(?m)^g %s -$" % admin_group, users) and \
        re.search(r"(?m)^g %s -$" % client_group, users), users
    assert key("admin_socket_mode", conf) == "0660" and key("require_job_token", conf) == "true"
    # No TCP listener a local user could reach around the clients' group
    # (the trial's finding 5), and any added one needs identities.
    assert key_line("listen", conf).strip() == "unix:/run/paradev/paradevd.sock", conf
    assert key("require_identity", conf) == "tcp"
    assert os.path.dirname(key("admin_socket", conf)) == "/run/paradev"
    assert key("RuntimeDirectoryMode", unit) == "0755"  # operators outside paradev
    # The job tokens' file is in the unit's state directory, the daemon's.
    assert key("job_tokens_file", conf) == "/var/lib/%s/job-tokens" % key("StateDirectory", unit)
    assert key("StateDirectoryMode", unit) == "0700"
    try:
        import yaml
    except ImportError:
        print("note: python3-yaml missing; the DaemonSet's configuration not checked")
        return
    docs = list(yaml.safe_load_all(open(os.path.join(DEPLOY, "kubernetes",
                                                     "daemonset.yaml"))))
    kconf = [x for x in docs if x["kind"] == "ConfigMap"][0]["data"]["paradevd.conf"]
    tmp = ts._mkdtemp(prefix="paradevd-k8s-")
    # The Secret paradevd-tls is mounted at /etc/paradev-tls in the pod; here
    # a certificate made for the check stands in for it (--check-config reads
    # the files and checks the key is the certificate's).
    crt, keyf = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", keyf,
                    "-out", crt, "-days", "2", "-subj", "/CN=paradevd-k8s"],
                   check=True, capture_output=True, timeout=60)
    assert "/etc/paradev-tls/tls.crt" in kconf and "/etc/paradev-tls/tls.key" in kconf
    # The clients' CA (ca.crt): the self-signed certificate stands in too.
    assert "/etc/paradev-tls/ca.crt" in kconf
    kconf = kconf.replace("/etc/paradev-tls/tls.crt", crt).replace(
        "/etc/paradev-tls/tls.key", keyf).replace("/etc/paradev-tls/ca.crt", crt)
    r = subprocess.run([PARADEVD, "--check-config", "--config",
                        write(os.path.join(tmp, "k.conf"), kconf)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert "client certificates required" in r.stdout, r.stdout
    # Without the clients' CA (the trial's finding 4) no TCP caller could
    # identify: a warning says so, naming the listener and both sources.
    lone = re.sub(r"(?m)^(client_ca_file|require_client_cert) =.*\n", "", kconf)
    r = subprocess.run([PARADEVD, "--check-config", "--config",
                        write(os.path.join(tmp, "lone.conf"), lone)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and (
        "warning: %s: [daemon] listen 0.0.0.0:7478 requires an identity of every TCP caller "
        "([auth] require_identity = tcp) but none can give one: no [tls] client_ca_file "
        "(client certificates) and no [auth] tokens_file (bearer tokens)"
        % os.path.join(tmp, "lone.conf")) in r.stderr, r.stderr
    ds = [x for x in docs if x["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in ds["containers"][0]["volumeMounts"]}
    vols = {v["name"]: v for v in ds["volumes"]}
    admin_dir = os.path.dirname(key("admin_socket", kconf))
    assert "emptyDir" in vols[mounts[admin_dir]], vols[mounts[admin_dir]]
    assert "hostPath" in vols[mounts["/run/paradev"]]
    env = {e["name"]: e.get("value") for e in ds["containers"][0].get("env", [])}
    assert env.get("PARADEV_ADMIN_SOCKET") == key("admin_socket", kconf), env
    # The probes (the trial's finding 3): `paradev health` over a Unix
    # socket that is a listen address in a directory of the pod alone, so
    # no other pod can fill its connections; liveness and startup ask
    # paradev.liveness, readiness paradev.readiness.
    listen = [a.strip() for a in key_line("listen", kconf).split(",")]
    c0 = ds["containers"][0]
    for probe, svc in (("startupProbe", "paradev.liveness"),
                       ("livenessProbe", "paradev.liveness"),
                       ("readinessProbe", "paradev.readiness")):
        cmd = c0[probe]["exec"]["command"]
        assert cmd[0] == "paradev" and cmd[-3:] == ["health", "--service", svc], cmd
        target = cmd[cmd.index("--target") + 1]
        assert target.startswith("unix:") and target in listen, (target, listen)
        assert "emptyDir" in vols[mounts[os.path.dirname(target[5:])]], target
    # Pods of the node use the hostPath socket; TCP callers must identify.
    assert "unix:/run/paradev/paradevd.sock" in listen and \
        key("require_identity", kconf) == "tcp", kconf


# --------------------------------------------------------------------------
# tokens


def check_job_tokens():
    d = Daemon()
    try:
        cl, adm = Client(d.target), Client("unix:" + d.admin)
        t700, t701 = mint(adm, "700"), mint(adm, "701")
        assert t700.token.startswith("pdjob1_") and len(t700.token) == 71, t700
        assert t700.lifetime_seconds == 604800 and not t700.replaced  # the default, 7 days
        assert t700.token != t701.token
        a1 = cl.session(client_name="a1", job_token=t700.token)
        a2 = cl.session(client_name="a2", job_token=t700.token, job_id="700")  # the same job
        b = cl.session(client_name="b", job_token=t701.token)
        spoof = cl.session(client_name="spoof", job_id="700")  # a claim, no token
        for i, tok in enumerate((a1, a2, b, spoof)):
            cl.upload(tok, 1, 100 * (i + 1))
        rows = listed(adm, "700").sessions
        assert [(s.client_name, s.job_id, s.job_proven) for s in rows] == [
            ("a1", "700", True), ("a2", "700", True), ("spoof", "700", False)], rows
        held = sum(s.memory_bytes for s in rows[:2])
        assert held == (400 + 800) * 2, held  # float32, 2 devices, mirrored
        r = admin_cli(d, "sessions", "--job", "700", "--json")
        doc = ts.json.loads(r.stdout)
        assert doc["count"] == 3 and doc["job_sessions"] == 2, doc
        assert [x["job_proven"] for x in doc["sessions"]] == [True, True, False], doc
        assert all("tenant" in x and "identity" in x for x in doc["sessions"]), doc
        r = admin_cli(d, "sessions")
        assert re.search(r"\n\d+ +spoof +700 +\? ", r.stdout), r.stdout  # claimed: '?'
        assert re.search(r"\n\d+ +a1 +700 +- ", r.stdout), r.stdout
        # Mistakes at CreateSession.
        expect_error(C.INVALID_ARGUMENT, cl.session, job_id="701", job_token=t700.token,
                     match=r'job_id "701" is not the job of the job token \(job "700"\)')
        expect_error(C.UNAUTHENTICATED, cl.session, job_token="pdjob1_" + "0" * 64,
                     match="unknown to this paradevd")
        expect_error(C.UNAUTHENTICATED, cl.session, job_token="hunter2",
                     match="not a job token")
        e = expect_error(C.UNAUTHENTICATED, cl.session, job_token=t700.token[:-1] + "x")
        assert t700.token[7:] not in e and t700.token[7:-1] not in e, e  # never echoed
        # The job's kill: its bound sessions, not the claim, not another job.
        r = adm.admin("KillJob", apb.KillJobRequest(job_id="700"), apb.KillJobResponse)
        assert (r.job_id, r.token_revoked, r.sessions_killed, r.job_sessions_remaining) == \
            ("700", True, 2, 0), r
        assert r.bytes_freed == held and r.handles_freed == 2 and r.sessions_remaining == 2, r
        assert gone(cl, a1) and gone(cl, a2) and alive(cl, spoof) and alive(cl, b)
        expect_error(C.UNAUTHENTICATED, cl.session, job_token=t700.token,
                     match="revoked")
        r = adm.admin("KillSession", apb.KillSessionRequest(job_id="700"),
                      apb.KillSessionResponse)
        assert r.sessions_killed == 0 and alive(cl, spoof), r
        r = adm.admin("KillJob", apb.KillJobRequest(job_id="700"), apb.KillJobResponse)
        assert not r.token_revoked and r.sessions_killed == 0, r
        expect_error(C.INVALID_ARGUMENT, adm.admin, "KillJob", apb.KillJobRequest(job_id=""),
                     apb.KillJobResponse, match="job_id is 0 bytes")
        expect_error(C.INVALID_ARGUMENT, adm.admin, "KillJob", apb.KillJobRequest(job_id="a b"),
                     apb.KillJobResponse, match="printable ASCII")
        # Expiry: a session opened in time outlives its token and is still
        # the job's; once past the lifetime the token opens nothing.
        t0 = time.monotonic()
        t702 = mint(adm, "702", lifetime=1)
        assert t702.lifetime_seconds == 1
        early = cl.session(client_name="early", job_token=t702.token)
        time.sleep(max(0.0, t0 + 1.5 - time.monotonic()))
        expect_error(C.UNAUTHENTICATED, cl.session, job_token=t702.token,
                     match=r'job token of job "702" expired')
        assert alive(cl, early)
        r = adm.admin("KillJob", apb.KillJobRequest(job_id="702"), apb.KillJobResponse)
        assert r.sessions_killed == 1 and not r.token_revoked, r
        # Replacing: a requeued job gets a new token, the old one stops.
        n1 = mint(adm, "701")
        assert n1.replaced and n1.token != t701.token
        expect_error(C.UNAUTHENTICATED, cl.session, job_token=t701.token)
        cl.pd("CloseSession", pb.CloseSessionRequest(session_token=cl.session(
            job_token=n1.token)), pb.CloseSessionResponse)
        # Bad mints.
        for kw, what in (({"job_id": ""}, "job_id is 0 bytes"),
                         ({"job_id": "a b"}, "printable ASCII"),
                         ({"job_id": "x" * 65}, "job_id is 65 bytes"),
                         ({"job_id": "ok", "uid": -5}, "uid -5"),
                         ({"job_id": "ok", "lifetime": 2592001}, "30 days")):
            args = {"uid": -1, **kw}
            expect_error(C.INVALID_ARGUMENT, mint, adm, args.pop("job_id"), **args,
                         match=what)
        # The CLI's view: --field for scripts, a missing member is a usage error.
        r = admin_cli(d, "status", "--field", "job_tokens")
        assert r.returncode == 0 and r.stdout == "1\n", (r.stdout, r.stderr)
        r = admin_cli(d, "job-token", "--job", "703", "--uid", "1000", "--lifetime", "90m",
                      "--json")
        doc = ts.json.loads(r.stdout)
        assert (doc["job_id"], doc["uid"], doc["lifetime_seconds"], doc["replaced"]) == \
            ("703", 1000, 5400, False), doc
        r = admin_cli(d, "job-token", "--job", "706", "--lifetime", "30d", "--field",
                      "lifetime_seconds")
        assert r.stdout == "2592000\n", (r.stdout, r.stderr)
        r = admin_cli(d, "job-token", "--job", "704")
        assert r.returncode == 0 and re.fullmatch(r"pdjob1_[0-9a-f]{64}\n", r.stdout), r.stdout
        for args, msg in ((("job-token",), "--job ID is required"),
                          (("job-token", "--job", "1", "--uid", "-1"), "--uid '-1'"),
                          (("job-token", "--job", "1", "--lifetime", "60"), "--lifetime '60'"),
                          (("job-token", "--job", "1", "--lifetime", "31d"), "1s to 30d"),
                          (("job-token", "--job", "1", "--lifetime", "1.5h"), "--lifetime '1.5h'"),
                          (("kill-job",), "--job ID is required"),
                          (("status", "--field", "nope"), "--field 'nope': no such member"),
                          (("kill-job", "--job", "1", "--field"), "--field needs a value")):
            r = admin_cli(d, *args)
            assert r.returncode == 2 and msg in r.stderr, (args, r.returncode, r.stderr)
        # libparadev presents $PARADEV_JOB_TOKEN by itself, and never sends
        # $SLURM_JOB_ID (alone only a claim, which require_job_token refuses).
        lib, pkg = os.environ.get("PARADEV_LIBRARY"), os.environ.get("PARADEV_PYTHON_DIR")
        if lib and pkg:
            t705 = mint(adm, "705").token
            prog = ("import sys; sys.path.insert(0, %r); import paradev\n"
                    "c = paradev.connect(%r)\n"
                    "kw = {'job_token': sys.argv[1]} if len(sys.argv) > 1 else {}\n"
                    "s = c.session('env', **kw)\n"
                    "print('open', flush=True); sys.stdin.read()\n" % (pkg, "unix:" + d.sock))
            t706 = mint(adm, "706").token
            for env, want, argv in (
                    ({"PARADEV_JOB_TOKEN": t705, "SLURM_JOB_ID": "9999"}, ("705", True), []),
                    ({"SLURM_JOB_ID": "9999"}, ("", False), []),
                    ({"PARADEV_JOB_TOKEN": t705}, ("706", True), [t706])):  # the argument wins
                e = {k: v for k, v in os.environ.items()
                     if k not in ("PARADEV_JOB_TOKEN", "SLURM_JOB_ID")}
                e.update(env, PARADEV_LIBRARY=lib)
                p = subprocess.Popen([sys.executable, "-c", prog, *argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=e)
                try:
                    assert p.stdout.readline() == "open\n"
                    got = [(s.job_id, s.job_proven) for s in listed(adm).sessions
                           if s.client_name == "env"]
                    assert got == [want], (env, got)
                finally:
                    p.stdin.close()
                    assert p.wait(120) == 0
        else:
            print("note: PARADEV_LIBRARY/PARADEV_PYTHON_DIR not set; libparadev's "
                  "$PARADEV_JOB_TOKEN not checked")
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()

    # Bounded.
    tmp = ts._mkdtemp(prefix="paradevd-ops-")
    d = Daemon(config=write(os.path.join(tmp, "p.conf"), "[auth]\nmax_job_tokens = 2\n"))
    try:
        adm = Client("unix:" + d.admin)
        mint(adm, "1"), mint(adm, "2")
        expect_error(C.RESOURCE_EXHAUSTED, mint, adm, "3",
                     match=r"2 job tokens are live, the limit \(\[auth\] max_job_tokens\)")
        assert mint(adm, "2").replaced
        adm.admin("KillJob", apb.KillJobRequest(job_id="1"), apb.KillJobResponse)
        mint(adm, "3")
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()

    # job_tokens_file: the hashes outlive a restart; a revoked token stays
    # revoked; the file holds each token's SHA-256 (hashlib's) and no token.
    import hashlib
    jt = os.path.join(tmp, "state", "job-tokens")
    os.mkdir(os.path.dirname(jt))
    fconf = write(os.path.join(tmp, "file.conf"), "[auth]\njob_tokens_file = %s\n" % jt)
    d = Daemon(config=fconf)
    try:
        adm = Client("unix:" + d.admin)
        keep, gone_tok = mint(adm, "900").token, mint(adm, "901").token
        adm.admin("KillJob", apb.KillJobRequest(job_id="901"), apb.KillJobResponse)
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    text = open(jt).read()
    assert stat.S_IMODE(os.stat(jt).st_mode) == 0o600
    assert hashlib.sha256(keep.encode()).hexdigest() in text, text
    assert hashlib.sha256(gone_tok.encode()).hexdigest() not in text, text
    assert keep[7:] not in text and gone_tok[7:] not in text
    d = Daemon(config=fconf)
    try:
        cl, adm = Client(d.target), Client("unix:" + d.admin)
        d.wait_line(r"job tokens: 1 live from %s" % re.escape(jt))
        cl.session(client_name="after-restart", job_token=keep)
        assert [(s.job_id, s.job_proven) for s in listed(adm).sessions] == [("900", True)]
        expect_error(C.UNAUTHENTICATED, cl.session, job_token=gone_tok)
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    os.chmod(jt, 0o666)
    r = subprocess.run([PARADEVD, "--config", fconf, "--listen", "unix:" + tmp + "/f.sock",
                        "--admin-socket", "", "--metrics-listen", "", "--devices", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "another user could add tokens" in r.stderr, r.stderr

    # require_job_token: a claim is refused; a token, or no job id, is fine;
    # SIGHUP applies a change.
    conf = write(os.path.join(tmp, "req.conf"), "[auth]\nrequire_job_token = true\n")
    d = Daemon(config=conf)
    try:
        cl, adm = Client(d.target), Client("unix:" + d.admin)
        expect_error(C.PERMISSION_DENIED, cl.session, job_id="800",
                     match=r"job_id given without a job token.*require_job_token = true")
        assert not listed(adm).sessions
        d.wait_line(r'refused /paradev\.v1\.ParallelDevice/CreateSession \(job_token\): '
                    r'identity ".*" tenant ".*": job_id given without a job token')
        ok = cl.session(client_name="proven", job_token=mint(adm, "800").token)
        cl.session(client_name="no-job")
        assert [(s.job_id, s.job_proven) for s in listed(adm).sessions] == \
            [("800", True), ("", False)]
        r = admin_cli(d, "status", "--field", "require_job_token")
        assert r.stdout == "true\n", r.stdout
        write(conf, "[auth]\nrequire_job_token = false\n")
        d.proc.send_signal(signal.SIGHUP)
        d.wait_line(r"reloaded ")
        cl.session(client_name="claim", job_id="800")
        r = adm.admin("KillJob", apb.KillJobRequest(job_id="800"), apb.KillJobResponse)
        assert r.sessions_killed == 1 and gone(cl, ok), r
        assert [s.client_name for s in listed(adm).sessions] == ["no-job", "claim"]
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# the Slurm scripts


def check_slurm_scripts():
    d = Daemon(ndev=2)
    tmp = ts._mkdtemp(prefix="paradevd-slurm-")
    jobs = os.path.join(tmp, "jobs")
    try:
        cl, adm = Client(d.target), Client("unix:" + d.admin)
        base = sum(cl.mem())
        senv = {"PARADEV": ADMIN_CLI, "PARADEV_ADMIN_SOCKET": d.admin,
                "PARADEV_PROLOG_WAIT": "10", "PARADEV_JOB_TOKEN_DIR": jobs,
                "SLURM_JOB_UID": str(os.getuid())}

        def run(script, job, **extra):
            e = {k: v for k, v in os.environ.items()
                 if not k.startswith(("SLURM_", "PARADEV"))}
            e.update(senv, SLURM_JOB_ID=job, **extra)
            e = {k: v for k, v in e.items() if v is not None}
            return subprocess.run([os.path.join(DEPLOY, "slurm", script)], capture_output=True,
                                  text=True, timeout=300, env=e)

        def token_file(job):
            path = os.path.join(jobs, job)
            st = os.stat(path)
            assert stat.S_IMODE(st.st_mode) == 0o400 and st.st_uid == os.getuid(), \
                (oct(st.st_mode), st.st_uid)
            text = open(path).read()
            assert re.fullmatch(r"pdjob1_[0-9a-f]{64}\n", text), text
            return text.strip()

        # A client named after the prolog's old grep, claiming "DRAINING".
        noisy = cl.session(client_name="not-DRAINING", job_id="DRAINING")
        r = run("prolog.sh", "801")
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(os.stat(jobs).st_mode) == 0o755
        tok801 = token_file("801")
        r = run("task_prolog.sh", "801")
        assert r.returncode == 0 and r.stdout == "export PARADEV_JOB_TOKEN=%s\n" % tok801, \
            (r.stdout, r.stderr)
        assert run("task_prolog.sh", "no-such-job").stdout == ""  # no file: nothing
        assert run("prolog.sh", "802").returncode == 0
        tok802 = token_file("802")
        assert tok802 != tok801
        # The other job, a spoof of job 801, and the noisy client hold memory.
        j2 = cl.session(client_name="job-802", job_token=tok802)
        spoof = cl.session(client_name="spoof", job_id="801")
        for i, tok in enumerate((j2, spoof, noisy)):
            cl.upload(tok, 1, 256 * (i + 1))
        kept = sum(cl.mem())
        # Job 801's sessions, with work still on the devices at its end.
        j1a = cl.session(client_name="job-801-a", job_token=tok801)
        j1b = cl.session(client_name="job-801-b", job_token=tok801)
        cl.upload(j1a, 1, 1000)
        cl.upload(j1b, 1, 3000)
        busy_work(d, cl, j1a, 0.5)
        assert sum(cl.mem()) > kept
        r = run("epilog.sh", "801")
        assert r.returncode == 0, r.stderr
        assert "killed 2 session(s) of job 801" in r.stderr, r.stderr
        assert gone(cl, j1a) and gone(cl, j1b)
        assert alive(cl, j2) and alive(cl, spoof) and alive(cl, noisy)
        assert sum(cl.mem()) == kept  # every byte of job 801 is back
        assert not os.path.exists(os.path.join(jobs, "801"))
        expect_error(C.UNAUTHENTICATED, cl.session, job_token=tok801)
        r = run("epilog.sh", "801")  # nothing left: fine
        assert r.returncode == 0 and r.stderr == "", r.stderr
        # A requeued 802: the prolog ends what is left and mints anew.
        r = run("prolog.sh", "802")
        assert r.returncode == 0 and "ended 1 leftover session(s) of this job id" in r.stderr, \
            r.stderr
        assert gone(cl, j2)
        new802 = token_file("802")
        assert new802 != tok802
        expect_error(C.UNAUTHENTICATED, cl.session, job_token=tok802)
        j2 = cl.session(client_name="job-802-again", job_token=new802)
        # Out of service: the prolog fails (unless told not to); the noisy
        # client never made it fail above.
        adm.admin("Drain", apb.DrainRequest(), apb.DrainResponse)
        r = run("prolog.sh", "803")
        assert r.returncode == 1 and "paradevd is draining (out of service)" in r.stderr, r.stderr
        r = run("prolog.sh", "803", PARADEV_PROLOG_REQUIRE_READY="0")
        assert r.returncode == 0 and "warning: paradevd is draining" in r.stderr, r.stderr
        adm.admin("Drain", apb.DrainRequest(resume=True), apb.DrainResponse)
        # Bad environments.
        for script, extra, msg in (
                ("epilog.sh", {"SLURM_JOB_ID": ""}, "SLURM_JOB_ID is not set"),
                ("prolog.sh", {"SLURM_JOB_ID": ""}, "SLURM_JOB_ID is not set"),
                ("prolog.sh", {"SLURM_JOB_ID": "../x"}, "is not a job id"),
                ("epilog.sh", {"SLURM_JOB_ID": "../x"}, "is not a job id"),
                ("prolog.sh", {"SLURM_JOB_UID": None}, "SLURM_JOB_UID '' is not a uid"),
                ("prolog.sh", {"PARADEV_ADMIN_SOCKET": d.admin + ".nope",
                               "PARADEV_PROLOG_WAIT": "1"}, "did not answer"),
                ("epilog.sh", {"PARADEV_ADMIN_SOCKET": d.admin + ".nope"},
                 "could not be ended")):
            extra = dict(extra)
            job = extra.pop("SLURM_JOB_ID", "804")
            r = run(script, job, **extra)
            assert r.returncode == 1 and msg in r.stderr, (script, extra, r.stderr)
        # A token directory that is a symbolic link is refused.
        link = os.path.join(tmp, "link")
        os.symlink(jobs, link)
        r = run("prolog.sh", "805", PARADEV_JOB_TOKEN_DIR=link)
        assert r.returncode == 1 and "is a symbolic link" in r.stderr, r.stderr
        # A token directory others may write, or another user's: refused.
        os.chmod(jobs, 0o775)
        r = run("prolog.sh", "806")
        assert r.returncode == 1 and "with mode 775; expected" in r.stderr, r.stderr
        os.chmod(jobs, 0o755)
        if os.getuid() == 0:
            os.chown(jobs, 65534, -1)
            r = run("prolog.sh", "806")
            assert r.returncode == 1 and "is owned by uid 65534" in r.stderr, r.stderr
            os.chown(jobs, 0, -1)
        for job in ("802", "803"):
            r = run("epilog.sh", job)
            assert r.returncode == 0, r.stderr
        assert gone(cl, j2) and alive(cl, spoof) and alive(cl, noisy)
        assert sorted(os.listdir(jobs)) == [], os.listdir(jobs)
        for tok in (spoof, noisy):
            cl.pd("CloseSession", pb.CloseSessionRequest(session_token=tok),
                  pb.CloseSessionResponse)
        assert sum(cl.mem()) == base
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


CHECKS = [check_deploy_files, check_operator_rights, check_job_tokens, check_slurm_scripts]


def main():
    return ts.run_checks(CHECKS)


if __name__ == "__main__":
    sys.exit(main())
