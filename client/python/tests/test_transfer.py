"""Shared memory and gRPC transfers give identical bytes; collected tensors
free the daemon's memory; sessions of two threads run side by side."""
import gc
import threading
import time

import numpy as np
import pytest

import paradev

BIG = (1 << 20) + 40  # over the default shared memory threshold (1 MiB)


@pytest.fixture
def shm_session(client):
    with client.session("shm", prefer_shared_memory=True,
                        shm_threshold=0) as s:
        yield s


@pytest.fixture
def grpc_session(client):
    with client.session("grpc", prefer_shared_memory=False) as s:
        yield s


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "uint8",
                                   "bool"])
def test_shm_and_grpc_identical(shm_session, grpc_session, dtype):
    rng = np.random.default_rng(5)
    n = BIG // np.dtype(dtype).itemsize
    x = (rng.standard_normal(n) * 100).astype(dtype)
    for layout, down in [(paradev.mirrored(), paradev.mirrored()),
                         (paradev.sharded(0), paradev.concat(0))]:
        a = shm_session.upload(x, layout)
        b = grpc_session.upload(x, layout)
        sa, sb = a.numpy(down), b.numpy(down)
        assert sa.tobytes() == x.tobytes()
        assert sb.tobytes() == x.tobytes()
    parts = [x[: n // 3], x[n // 3:], x[:5]][: shm_session.num_devices]
    parts += [x[:7]] * (shm_session.num_devices - len(parts))
    a = shm_session.upload(parts, paradev.per_component())
    for got, want in zip(a.numpy(paradev.per_component()), parts):
        assert got.tobytes() == want.tobytes()
    assert shm_session.shm_disabled_reason is None
    assert shm_session.stats["shm_upload_bytes"] > 0
    assert shm_session.stats["shm_download_bytes"] > 0
    assert shm_session.stats["grpc_upload_bytes"] == 0
    assert grpc_session.stats["shm_upload_bytes"] == 0
    assert grpc_session.stats["grpc_download_bytes"] > 0


def test_shm_default_threshold(client):
    with client.session("auto") as s:
        s.upload(np.zeros(16, np.float32), paradev.mirrored())
        assert s.stats["grpc_upload_bytes"] == 64
        big = s.upload(np.ones(BIG // 4, np.float32), paradev.sharded(0))
        assert s.stats["shm_upload_bytes"] == (BIG // 4) * 4
        np.testing.assert_array_equal(big.numpy(paradev.concat(0)),
                                      np.ones(BIG // 4, np.float32))


def test_grpc_over_tcp(daemon):
    with paradev.connect(daemon.tcp, prefer_shared_memory=False) as c:
        with c.session() as s:
            x = np.arange(BIG // 8, dtype=np.float64)
            t = s.upload(x, paradev.sharded(0))
            assert t.numpy(paradev.concat(0)).tobytes() == x.tobytes()
            assert s.stats["shm_upload_bytes"] == 0


def _used(client):
    return client.info().memory_used_bytes


def test_gc_frees_daemon_memory(client):
    with client.session("gc") as s:
        s.sync()
        before = _used(client)
        ts = [s.upload(np.ones((256, 1024), np.float32), paradev.mirrored())
              for _ in range(4)]
        s.sync()
        held = _used(client)
        assert held - before >= 4 * 256 * 1024 * 4 * s.num_devices
        ts = None  # noqa: F841 -- drops the tensors
        gc.collect()
        s.sync()  # sends the batched deletes
        assert _used(client) <= before
        # explicit delete
        t = s.upload(np.ones((256, 1024), np.float32), paradev.mirrored())
        s.sync()
        assert _used(client) > before
        t.delete()
        s.flush()
        s.sync()
        assert _used(client) <= before
        with pytest.raises(ValueError, match="deleted"):
            s.op("Neg", t)


def test_gc_flushes_by_itself(client):
    with client.session("gc-timer") as s:
        s.sync()
        before = _used(client)
        t = s.upload(np.ones((256, 1024), np.float32), paradev.mirrored())
        s.sync()
        assert _used(client) > before
        del t
        gc.collect()
        # no call on the session: the periodic flush sends the delete
        for _ in range(200):
            if _used(client) <= before:
                break
            time.sleep(0.05)
        assert _used(client) <= before


def test_gc_in_pipelined_mode(client):
    with client.session("gc-pipe", pipelined=True) as s:
        s.sync()
        before = _used(client)
        x = s.upload(np.ones((128, 128), np.float32), paradev.mirrored())
        for _ in range(100):
            x = x * 1.0  # each older x is collected and deleted in-stream
        s.sync()
        # x alone (and nothing of the 100 intermediates) is left
        assert _used(client) - before <= 2 * 128 * 128 * 4 * s.num_devices
        np.testing.assert_array_equal(np.asarray(x), np.ones((128, 128)))


def test_two_sessions_in_two_threads(client):
    errors = []

    def work(k):
        try:
            with client.session("thread-%d" % k) as s:
                x = s.upload(np.full((9, 8), float(k)), paradev.sharded(0))
                acc = x
                for i in range(50):
                    acc = acc + x
                got = acc.numpy(paradev.concat(0))
                np.testing.assert_array_equal(got, np.full((9, 8), 51.0 * k))
                r = s.ops.AllReduce(x, reduction="sum")
                assert r.is_mirrored
        except Exception as e:  # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


def test_one_session_shared_by_threads(sess):
    x = sess.upload(np.ones(16), paradev.mirrored())
    out = {}

    def work(k):
        y = x
        for _ in range(30):
            y = y + x
        out[k] = y.numpy(paradev.mirrored())

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for k in range(3):
        np.testing.assert_array_equal(out[k], np.full(16, 31.0))


def test_dropped_session_is_closed(client):
    import weakref
    s = client.session("dropped")
    t = s.upload(np.ones((256, 1024), np.float32), paradev.mirrored())
    s.sync()
    used = _used(client)
    ref = weakref.ref(s)
    del s, t
    gc.collect()
    assert ref() is None
    # collecting it closed it on the daemon: its tensor's memory is free
    assert _used(client) <= used - 256 * 1024 * 4 * client.info().num_devices


EXIT_SCRIPT = """
import sys, numpy as np, paradev
c = paradev.connect(sys.argv[1])
s = c.session("exit-test", pipelined=True)
x = s.upload(np.ones((256, 256)), paradev.mirrored())
for _ in range(50):
    x = x @ x * (1.0 / 256)
s2 = c.session("second")
t = s2.upload(np.ones((256, 1024)), paradev.sharded(0))
print("exiting")
"""


def test_exit_without_closing(daemon, client):
    # A program that ends with its client, sessions, a stream and pending
    # deletes all open exits cleanly, and the daemon frees what it held.
    import os
    import subprocess
    import sys
    before = _used(client)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, daemon.unix],
                           capture_output=True, text=True, env=env,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "exiting"
    # closed sessions free their memory once their queued ops are done
    for _ in range(400):
        if _used(client) <= before:
            break
        time.sleep(0.05)
    assert _used(client) <= before
