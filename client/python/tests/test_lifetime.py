"""A client and its sessions dropped together, in a reference cycle, are
finalized by the garbage collector in any order; libparadev needs every
pd_session deleted before its pd_client. Before the fix the client's
finalizer could delete the channel first and the session's close then used
freed memory (a segfault seen about once in ten runs of the suite). The
child process makes many such cycles, so a crash fails the test instead of
the whole pytest run."""
import os
import subprocess
import sys

from conftest import Daemon

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import gc
import sys
import numpy as np
import paradev

gc.disable()  # collect only where we say, with everything in cycles
for i in range(60):
    c = paradev.connect(sys.argv[1], timeout=30)
    s = c.session("cycle-%d" % i)
    t = s.upload(np.arange(8, dtype=np.float32), paradev.mirrored())
    u = t + t
    # A cycle holding the client, the session and its tensors.
    box = {"client": c, "session": s, "tensors": [t, u]}
    box["self"] = box
    s._cycle = box
    del c, s, t, u, box
    if i % 3 == 0:
        gc.collect()
gc.collect()
# The daemon freed the sessions: a new session sees none of their handles.
c = paradev.connect(sys.argv[1], timeout=30)
info = c.info()
print("ok sessions=%d" % info.sessions if hasattr(info, "sessions") else "ok")
c.close()
"""


def test_client_and_sessions_collected_in_a_cycle():
    d = Daemon(2)
    try:
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
        p = subprocess.run([sys.executable, "-c", CHILD, d.unix],
                           capture_output=True, text=True, env=env,
                           timeout=120)
        assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
        assert p.stdout.startswith("ok"), p.stdout
    finally:
        d.stop()
