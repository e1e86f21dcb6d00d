#!/usr/bin/python3
"""Health that tells the truth to its orchestrator (issue #14), on real
daemons over real sockets:

 - drain:       through an Admin drain, liveness (gRPC "paradev.liveness",
                /healthz, paradev_live) stays SERVING while readiness
                ("paradev.readiness", "", "paradev.v1.ParallelDevice",
                /readyz) goes NOT_SERVING; new work (CreateSession, Execute,
                Enqueue execute and gradient items, Upload,
                UploadFromSharedMemory, LoadTensors, Gradient) is refused with
                UNAVAILABLE "draining"; work queued before the drain (held on
                a device by the test hook, so it is queued for sure) finishes
                and is downloaded with the right values; Sync, Describe,
                Delete, KeepAlive and CloseSession still work.
 - long op:     one MatMul that runs longer than stall_timeout_seconds is a
                long kernel, not a stall: liveness stays SERVING; past
                kernel_timeout_seconds (set small by a reload) it counts as
                wedged until it finishes.
 - stall:       ops queued on a device whose executor is held (the
                PARADEV_TEST_HOLD test hook) flip liveness to NOT_SERVING,
                naming the device; released, it comes back.
 - starvation:  idle connections to the metrics port from one address do
                not starve /healthz from another (per-address limit); idle
                ones are closed after metrics_idle_timeout_seconds.
 - slowloris:   64 connections from 8 addresses that trickle header lines
                (never idle) are closed by the request deadline, and
                /healthz answers a 9th address meanwhile.
 - full:        a full listener closes the connection that waited longest
                for a request to take a new one (a probe).
 - wedged:      /healthz names the cause the log names (a kernel past
                kernel_timeout_seconds: "wedged", a queue: "stalled").

No timing threshold is asserted: each check waits (with limits that only
catch hangs) for what the daemon reports, and a long op is sized by
measuring this machine first.

Usage: test_health.py PARADEVD PYTHON_PROTO_DIR PARADEV_ADMIN_CLI DEPLOY_DIR
(test_service.py's arguments: its helpers are reused).
Exit 0: all passed; 1: a check failed; 77: skipped (grpcio missing).
"""
import os
import signal
import socket
import re
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_service as ts  # noqa: E402  (reads the same four arguments)
from test_service import (C, H, Client, Daemon, Watcher, attr, expect_error,  # noqa: E402
                          fill_op, http_get, metric, pb, apb, scrape, wait_for, write)

LIVE, READY = "paradev.liveness", "paradev.readiness"


def health_all(cl):
    return {svc: cl.health(svc) for svc in (LIVE, READY, "", "paradev.v1.ParallelDevice")}


def floats(msgs):
    data = b"".join(m.chunk.data for m in msgs[1:])
    return list(struct.unpack("<%df" % (len(data) // 4), data))


# --------------------------------------------------------------------------
# drain


def check_drain_liveness_and_work():
    tmp = ts._mkdtemp(prefix="paradevd-health-")
    hold = os.path.join(tmp, "hold")
    d = Daemon("--drain-timeout", "300", env={"PARADEV_TEST_HOLD": hold})
    try:
        cl = Client(d.target)
        adm = Client("unix:" + d.admin)
        assert health_all(cl) == {LIVE: H.SERVING, READY: H.SERVING, "": H.SERVING,
                                  "paradev.v1.ParallelDevice": H.SERVING}
        wl, wr = Watcher(cl, LIVE), Watcher(cl, READY)
        wait_for(lambda: wl.seen == [H.SERVING] and wr.seen == [H.SERVING], "Watch: SERVING")
        tok = cl.session(client_name="collector")
        cl.upload(tok, 1, 40)  # float(i % 17)
        # Hold device 0, so the ops below are still queued when the drain
        # starts, whatever this machine's speed.
        write(hold, "")
        d.wait_line(r"test hook: device 0's executor held")
        cl.execute(tok, pb.Operation(op="Neg", inputs=[1], output_ids=[2]),
                   pb.Operation(op="Add", inputs=[2, 1], output_ids=[3]),
                   fill_op(4, [3], 7.0))
        r = adm.admin("Drain", apb.DrainRequest(), apb.DrainResponse)
        assert r.draining and not r.exiting and r.ops_outstanding >= 3, r

        # Liveness stays, readiness goes, on every channel.
        assert health_all(cl) == {LIVE: H.SERVING, READY: H.NOT_SERVING, "": H.NOT_SERVING,
                                  "paradev.v1.ParallelDevice": H.NOT_SERVING}
        assert http_get(d.http, "/healthz") == (200, "ok\n", "text/plain; charset=utf-8")
        status, body, _ = http_get(d.http, "/readyz")
        assert (status, body) == (503, "not ready: draining\n"), (status, body)
        m = scrape(d.http)
        assert metric(m, "paradev_live") == 1 and metric(m, "paradev_serving") == 0
        wait_for(lambda: wr.seen == [H.SERVING, H.NOT_SERVING], "Watch readiness: NOT_SERVING")

        # New work is refused, saying why and what to do.
        what = r"paradevd is draining for maintenance: it takes no new work \(%s\); the " \
               r"work already queued finishes\. Download your results"
        expect_error(C.UNAVAILABLE, cl.execute, tok, fill_op(10, [3]),
                     match=what % "Execute")
        expect_error(C.UNAVAILABLE, cl.session, client_name="late",
                     match=what % "CreateSession")
        expect_error(C.UNAVAILABLE, cl.upload, tok, 11, 8, match=what % "Upload")
        expect_error(C.UNAVAILABLE, cl.pd, "UploadFromSharedMemory",
                     pb.UploadFromSharedMemoryRequest(session_token=tok, id=12),
                     pb.UploadResponse, match=what % "UploadFromSharedMemory")
        expect_error(C.UNAVAILABLE, cl.pd, "LoadTensors",
                     pb.LoadTensorsRequest(session_token=tok, source="/x.npy"),
                     pb.LoadTensorsResponse, match=what % "LoadTensors")
        expect_error(C.UNAVAILABLE, cl.pd, "Gradient",
                     pb.GradientRequest(session_token=tok), pb.GradientResponse,
                     match=what % "Gradient")
        # Enqueue: work items refused one by one; the stream goes on.
        replies = cl.enqueue([
            pb.EnqueueRequest(session_token=tok, execute=fill_op(13, [2])),
            pb.EnqueueRequest(delete=pb.DeleteItem(ids=[4])),
            pb.EnqueueRequest(gradient=pb.TapeGradient(tape_id=1)),
        ])
        codes = [r.status.code for r in replies]
        unavailable = C.UNAVAILABLE.value[0]
        assert codes == [unavailable, 0, unavailable], replies
        assert "an Enqueue execute item" in replies[0].status.message, replies[0]
        assert "an Enqueue gradient item" in replies[2].status.message, replies[2]
        assert liveness_never_failed(d, wl)

        # The queued work finishes once the device runs again; results can
        # be collected: Sync, Describe, Download; then Delete, KeepAlive and
        # CloseSession.
        os.unlink(hold)
        d.wait_line(r"test hook: device 0's executor released")
        assert cl.sync(tok, timeout=120).error.code == 0
        desc = cl.describe(tok, [2, 3])
        assert [t.ready for t in desc] == [True, True], desc
        want = [-float(i % 17) for i in range(40)]
        assert floats(cl.download(tok, 2)) == want
        assert floats(cl.download(tok, 3)) == [0.0] * 40
        cl.pd("Delete", pb.DeleteRequest(session_token=tok, ids=[2]), pb.DeleteResponse)
        cl.pd("KeepAlive", pb.KeepAliveRequest(session_token=tok), pb.KeepAliveResponse)
        wait_for(lambda: adm.admin("Drain", apb.DrainRequest(),
                                   apb.DrainResponse).ops_outstanding == 0,
                 "no ops outstanding")
        cl.pd("CloseSession", pb.CloseSessionRequest(session_token=tok),
              pb.CloseSessionResponse)

        # Back in service: new work is taken again.
        adm.admin("Drain", apb.DrainRequest(resume=True), apb.DrainResponse)
        assert health_all(cl)[READY] == H.SERVING
        tok = cl.session(client_name="welcome back")
        cl.execute(tok, fill_op(1, [2], 3.0))
        assert floats(cl.download(tok, 1)) == [3.0, 3.0]
        wait_for(lambda: wr.seen == [H.SERVING, H.NOT_SERVING, H.SERVING],
                 "Watch readiness: SERVING again")
        # SIGTERM drains to exit: readiness goes, liveness stays to the end.
        d.proc.send_signal(signal.SIGTERM)
        rc = d.proc.wait(120)
        d.reader.join(5)
        assert rc == 0, d.log()
        wait_for(lambda: wl.end is not None and wr.end is not None, "the Watch streams to end")
        assert wl.seen == [H.SERVING], wl.seen
        assert wr.seen == [H.SERVING, H.NOT_SERVING, H.SERVING, H.NOT_SERVING], wr.seen
        assert not d.find(r"liveness NOT_SERVING"), d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


def liveness_never_failed(d, watcher):
    assert watcher.seen == [H.SERVING], watcher.seen
    assert not d.find(r"liveness NOT_SERVING"), d.log()
    return True


# --------------------------------------------------------------------------
# a long op is not a stall


MAX_N = 8192  # 3 matrices of 256 MiB: within the daemon's 4 GiB below


def matmul_ops(n, first):
    """A (n x n) @ B (n x n) of Fills: one long kernel on each device."""
    return [fill_op(first, [n, n], 1.0), fill_op(first + 1, [n, n], 0.5),
            pb.Operation(op="MatMul", inputs=[first, first + 1], output_ids=[first + 2])]


def seconds_of_matmul(cl, tok, n, first):
    t0 = time.monotonic()
    cl.execute(tok, *matmul_ops(n, first))
    assert cl.sync(tok, [first + 2], timeout=600).error.code == 0
    dt = time.monotonic() - t0
    cl.pd("Delete", pb.DeleteRequest(session_token=tok, ids=[first, first + 1, first + 2]),
          pb.DeleteResponse)
    return dt


def run_long_matmul(d, cl, tok, n, first, until):
    """Runs one MatMul of n x n, larger until the daemon reports log line
    `until` while it runs (it is sized by measurement, and a fast machine
    may need a larger one). Returns (n, the output id, the log match); the
    op may still be running."""
    for _ in range(6):
        before = len(d.lines)
        cl.execute(tok, *matmul_ops(n, first))
        out = first + 2
        seen = wait_for(lambda: d.find_after(until, before) or
                        (cl.describe(tok, [out])[0].ready and "done"),
                        "the long MatMul to run or be reported", 600)
        if seen != "done":
            return n, out, seen
        st = cl.describe(tok, [out])[0].status
        assert st.code == 0, "the long MatMul of %d x %d failed: %s" % (n, n, st.message)
        assert n < MAX_N, "a MatMul of %d x %d ran too fast to be seen" % (n, n)
        # Finished before the daemon saw it pass the bound: larger.
        cl.pd("Delete", pb.DeleteRequest(session_token=tok, ids=[first, first + 1, out]),
              pb.DeleteResponse)
        n = min(int(n * 1.6), MAX_N)
        first += 10
    raise AssertionError("no MatMul ran long enough to be seen (last n = %d)" % n)


def find_after(self, pattern, start):
    for line in list(self.lines)[start:]:
        m = re.search(pattern, line)
        if m:
            return m
    return None


Daemon.find_after = find_after


def check_long_op():
    tmp = ts._mkdtemp(prefix="paradevd-longop-")
    conf = write(os.path.join(tmp, "paradevd.conf"),
                 "[daemon]\nstall_timeout_seconds = 1\n")
    d = Daemon(config=conf, ndev=1, mem=4 << 30)
    try:
        cl = Client(d.target)
        tok = cl.session(client_name="long", memory_quota_bytes=1 << 40)
        wl = Watcher(cl, LIVE)
        wait_for(lambda: wl.seen == [H.SERVING], "Watch: SERVING")
        # Size one MatMul to about 8 stall timeouts on this machine.
        n0 = 512
        t = max(seconds_of_matmul(cl, tok, n0, 10), 1e-3)
        n = min(int(n0 * (8.0 / t) ** (1 / 3.0)) + 1, MAX_N)
        long_line = (r"device 0 \(.*\): one op has run for over 1 s \(stall_timeout_seconds\): "
                     r"a long kernel \(or a collective waiting for its peers\), not a stall; "
                     r"kernel_timeout_seconds \(3600 s\) bounds it")
        n, out, _ = run_long_matmul(d, cl, tok, n, 100, long_line)
        # The daemon saw one kernel run past the stall timeout: alive.
        assert cl.health(LIVE) == H.SERVING and cl.health(READY) == H.SERVING
        assert http_get(d.http, "/healthz")[0] == 200
        assert metric(scrape(d.http), "paradev_live") == 1
        assert cl.sync(tok, [out], timeout=600).error.code == 0
        assert liveness_never_failed(d, wl)
        assert not d.find(r"stalled|wedged"), d.log()
        desc = cl.describe(tok, [out])[0]
        assert list(desc.shape.dims) == [n, n] and desc.status.code == 0, desc
        cl.pd("Delete", pb.DeleteRequest(session_token=tok, ids=[out - 2, out - 1, out]),
              pb.DeleteResponse)

        # The kernel bound: with kernel_timeout_seconds = 2 (a reload), the
        # same kind of op counts as wedged once past it, until it ends.
        conf = write(conf, "[daemon]\nstall_timeout_seconds = 1\nkernel_timeout_seconds = 2\n")
        before = len(d.lines)
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: d.find_after(r"reloaded ", before), "the reload")
        wedged = (r"device 0 \(.*\): one op's kernel has run \d+ s without finishing or a "
                  r"heartbeat \(kernel_timeout_seconds 2\): wedged")
        n, out, _ = run_long_matmul(d, cl, tok, n, 200, wedged)
        # /healthz names the cause the log named (wedged, not stalled):
        # liveness fails here for the kernel bound alone.
        health = wait_for(lambda: (lambda r: r[0] == 503 and r)(http_get(d.http, "/healthz")),
                          "/healthz 503")
        assert health[:2] == (503, "wedged: a kernel has run past kernel_timeout_seconds "
                                   "without finishing or a heartbeat\n"), health
        ready = http_get(d.http, "/readyz")
        assert ready[:2] in ((503, "not ready: wedged\n"), (200, "ready\n")), ready
        wait_for(lambda: cl.health(LIVE) == H.NOT_SERVING, "liveness NOT_SERVING")
        assert cl.sync(tok, [out], timeout=600).error.code == 0
        wait_for(lambda: cl.health(LIVE) == H.SERVING, "liveness SERVING again", 60)
        assert d.find(r"device 0 \(.*\) makes progress again"), d.log()
        assert http_get(d.http, "/healthz")[0] == 200
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# a real stall


def check_stall():
    tmp = ts._mkdtemp(prefix="paradevd-stall-")
    hold = os.path.join(tmp, "hold")
    conf = write(os.path.join(tmp, "paradevd.conf"),
                 "[daemon]\nstall_timeout_seconds = 1\n")
    d = Daemon(config=conf, env={"PARADEV_TEST_HOLD": hold})
    try:
        cl = Client(d.target)
        tok = cl.session(client_name="stuck")
        cl.upload(tok, 1, 8)
        wl = Watcher(cl, LIVE)
        wait_for(lambda: wl.seen == [H.SERVING], "Watch: SERVING")
        write(hold, "")
        d.wait_line(r"test hook: device 0's executor held")
        # Device 1 runs its part of the AllReduce and waits there for its
        # peer (a running kernel); device 0 has it queued and runs nothing.
        cl.execute(tok, pb.Operation(op="AllReduce", inputs=[1], output_ids=[2],
                                     attrs=[attr("reduction", s="sum")]))
        d.wait_line(r"device 0 \(.*\): ops are queued on it but its executor has started "
                    r"none for \d+ s \(stall_timeout_seconds\): stalled")
        wait_for(lambda: cl.health(LIVE) == H.NOT_SERVING, "liveness NOT_SERVING")
        assert cl.health(READY) == H.NOT_SERVING and cl.health("") == H.NOT_SERVING
        status, body, _ = http_get(d.http, "/healthz")
        assert (status, body) == (503, "stalled: runnable work makes no progress\n"), body
        assert http_get(d.http, "/readyz")[1] == "not ready: stalled\n"
        m = scrape(d.http)
        assert metric(m, "paradev_live") == 0
        assert metric(m, "paradev_device_seconds_since_progress", device="0") > 0
        assert not d.find(r"device 1 .*stalled"), d.log()
        wait_for(lambda: wl.seen == [H.SERVING, H.NOT_SERVING], "Watch: NOT_SERVING")
        # Released, the op runs and liveness comes back.
        os.unlink(hold)
        assert cl.sync(tok, [2], timeout=120).error.code == 0
        assert floats(cl.download(tok, 2)) == [2.0 * (i % 17) for i in range(8)]
        wait_for(lambda: cl.health(LIVE) == H.SERVING, "liveness SERVING again")
        d.wait_line(r"device 0 \(.*\) makes progress again")
        assert http_get(d.http, "/healthz")[0] == 200
        wait_for(lambda: wl.seen == [H.SERVING, H.NOT_SERVING, H.SERVING], "Watch: SERVING")
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# probe starvation


def idle_connections(port, n, source):
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        out.append(s)
    return out


def closed_by_peer(s):
    """True once the daemon has closed the connection (EOF or reset)."""
    try:
        return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def check_probe_starvation():
    # Defaults: 64 connections, 8 per client address, 10 s idle timeout.
    d = Daemon()
    conns = []
    try:
        conns = idle_connections(d.http, 80, "127.0.0.2")
        # The ones over the per-address limit are closed at once.
        wait_for(lambda: sum(closed_by_peer(s) for s in conns) == 72,
                 "72 of 80 idle connections from one address closed")
        # A probe from another address answers, as does every path.
        assert http_get(d.http, "/healthz") == (200, "ok\n", "text/plain; charset=utf-8")
        assert http_get(d.http, "/readyz")[0] == 200
        assert scrape(d.http)[("paradev_live", frozenset())] == 1
        # 72 refusals, one log line (a loop of connections cannot flood it).
        refused = [line for line in d.lines if "reached connection limit" in line]
        assert len(refused) == 1 and "metrics_max_connections_per_ip 8" in refused[0], refused
        assert d.stop() == 0, d.log()
    finally:
        for s in conns:
            s.close()
        if d.proc.poll() is None:
            d.proc.kill()
    # From one address with no per-address limit, idle connections that
    # fill the listener are closed after the idle timeout, and the probes
    # answer again.
    tmp = ts._mkdtemp(prefix="paradevd-http-")
    conf = write(os.path.join(tmp, "paradevd.conf"),
                 "[daemon]\nmetrics_max_connections = 16\nmetrics_max_connections_per_ip = 0\n"
                 "metrics_idle_timeout_seconds = 1\n")
    d = Daemon(config=conf)
    conns = []
    try:
        conns = idle_connections(d.http, 16, "127.0.0.1")
        wait_for(lambda: all(closed_by_peer(s) for s in conns),
                 "the idle connections closed by the daemon")
        assert http_get(d.http, "/healthz")[0] == 200
        assert d.stop() == 0, d.log()
    finally:
        for s in conns:
            s.close()
        if d.proc.poll() is None:
            d.proc.kill()


class Trickler:
    """The trial's slowloris: `per` connections from each of `sources`,
    each sending the start of a request and then one header line every
    `every` s, never the end of the headers, so no connection is ever idle
    for libmicrohttpd's idle timeout."""

    def __init__(self, port, sources, per, every):
        self.conns = []
        for src in sources:
            self.conns += idle_connections(port, per, src)
        for c in self.conns:
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        self.every, self.stop, self.sent = every, threading.Event(), 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.wait(self.every):
            for c in self.conns:
                try:
                    c.sendall(b"X-a: b\r\n")
                    self.sent += 1
                except OSError:
                    pass  # closed by the daemon

    def close(self):
        self.stop.set()
        self.thread.join(10)
        for c in self.conns:
            c.close()


def check_probe_slowloris():
    """Issue #14's "probes always answer", the trial's finding 3: 8 client
    addresses x 8 connections fill metrics_max_connections (64), each
    trickling a header line far more often than the idle timeout; the
    request deadline (a whole request within metrics_idle_timeout_seconds)
    closes them all, and a probe from a 9th address is answered meanwhile."""
    tmp = ts._mkdtemp(prefix="paradevd-slowloris-")
    conf = write(os.path.join(tmp, "paradevd.conf"),
                 "[daemon]\nmetrics_max_connections = 64\nmetrics_max_connections_per_ip = 8\n"
                 "metrics_idle_timeout_seconds = 3\n")
    d = Daemon(config=conf)
    t = None
    try:
        t = Trickler(d.http, ["127.0.0.%d" % i for i in range(3, 11)], 8, 0.2)
        # All 64 were taken (none over a limit: no refusal logged) ...
        assert len(t.conns) == 64
        # ... and the probe from 127.0.0.1 is answered although they trickle.
        assert http_get(d.http, "/healthz") == (200, "ok\n", "text/plain; charset=utf-8")
        assert http_get(d.http, "/readyz")[:2] == (200, "ready\n")
        wait_for(lambda: all(closed_by_peer(c) for c in t.conns),
                 "the 64 trickling connections closed by the daemon")
        assert t.sent > 64, t.sent  # they did trickle: never idle
        # Closed by the request deadline, not as idle, and said so once. The
        # daemon's stderr is read by a thread: under load the line may reach
        # d.lines a little after the sockets closed, so wait for it (bounded).
        def deadline_lines():
            return [line for line in list(d.lines) if "that had not sent a whole "
                    "request within metrics_idle_timeout_seconds (3 s)" in line]
        try:
            wait_for(deadline_lines, "the request-deadline log line", limit=20)
        except AssertionError:
            raise AssertionError(d.log())
        time.sleep(0.5)  # a second such line, if any, would be here by now
        cut = deadline_lines()
        assert len(cut) == 1, d.log()
        assert re.search(r"closed (\d+) connections? to the metrics port", cut[0]), cut
        assert not any("reached connection limit" in line for line in d.lines), d.log()
        # The listener is free again: probes are answered at once.
        assert http_get(d.http, "/healthz")[:2] == (200, "ok\n")
        assert d.stop() == 0, d.log()
    finally:
        if t:
            t.close()
        if d.proc.poll() is None:
            d.proc.kill()


def check_probe_full_listener():
    """A full listener makes room: with the request deadline far off (60 s),
    64 trickling connections from 8 addresses fill metrics_max_connections;
    each new connection closes the one that has waited longest for a
    request, so a probe from a 9th address is answered long before any
    deadline, and only the oldest of the others are closed."""
    tmp = ts._mkdtemp(prefix="paradevd-full-")
    conf = write(os.path.join(tmp, "paradevd.conf"),
                 "[daemon]\nmetrics_max_connections = 64\nmetrics_max_connections_per_ip = 8\n"
                 "metrics_idle_timeout_seconds = 60\n")
    d = Daemon(config=conf)
    t = None
    try:
        t = Trickler(d.http, ["127.0.0.%d" % i for i in range(3, 11)], 8, 0.2)
        # http_get gives up after 30 s: a hang, half the deadline.
        assert http_get(d.http, "/healthz") == (200, "ok\n", "text/plain; charset=utf-8")
        closed = [c for c in t.conns if closed_by_peer(c)]
        # One made room for the 64th of them (the listener's last slot),
        # one for the probe: the first two to have connected.
        assert 1 <= len(closed) <= 2, len(closed)
        assert all(c in t.conns[:2] for c in closed), [t.conns.index(c) for c in closed]
        # The daemon's log is read by a thread: wait for the line, then count.
        d.wait_line(r"the metrics port is full \(metrics_max_connections 64\): closed")
        full = [line for line in d.lines if "the metrics port is full "
                "(metrics_max_connections 64): closed" in line]
        assert len(full) == 1, d.log()
        assert not any("had not sent a whole request" in line for line in d.lines), d.log()
        t.close()
        t = None
        assert d.stop() == 0, d.log()
    finally:
        if t:
            t.close()
        if d.proc.poll() is None:
            d.proc.kill()


CHECKS = [check_drain_liveness_and_work, check_stall, check_probe_starvation,
          check_probe_slowloris, check_probe_full_listener, check_long_op]


def main():
    return ts.run_checks(CHECKS)


if __name__ == "__main__":
    sys.exit(main())
