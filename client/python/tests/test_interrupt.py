"""Ctrl-C during a blocking call: session.sync(), tensor.numpy() and a
pipelined session's drain wait in slices, so SIGINT raises
KeyboardInterrupt while the devices are still busy, and the session stays
usable afterwards. The child process below queues far more work than the
time it is given (100 MatMuls of 2048x2048 on one CPU device, twice), is
interrupted a second after each call began, and reports whether the work was
still running when KeyboardInterrupt came: it must have been (else the
call waited for the work instead of being interrupted)."""
import os
import signal
import subprocess
import sys
import time

from conftest import Daemon

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import sys
import numpy as np
import paradev

c = paradev.connect(sys.argv[1], timeout=600)
s = c.session("interrupt")
x = s.upload(np.full((2048, 2048), 1.0 / 2048, np.float32), paradev.mirrored())


def queue(y, n):
    with s.pipeline():
        for _ in range(n):
            y = y @ x
    return y


def interrupted(call, y):
    print("queued", flush=True)
    try:
        call()
    except KeyboardInterrupt:
        print("interrupted ready=%s" % s.describe([y])[0]["ready"],
              flush=True)
        return
    print("not interrupted", flush=True)


y = queue(x, 100)
interrupted(lambda: s.sync(), y)
y = queue(y, 100)
interrupted(lambda: y.numpy(paradev.mirrored()), y)
# usable afterwards: an upload, a wait for it and its download (an op would
# queue behind the MatMuls on the device)
a = np.arange(6.0).reshape(2, 3)
w = s.upload(a, paradev.mirrored())
s.sync([w])
print("usable", w.numpy(paradev.mirrored()).tolist() == a.tolist(),
      s.describe([y])[0]["ready"], flush=True)
s.close()
print("closed", flush=True)
"""


def test_sigint_interrupts_sync_and_numpy():
    d = Daemon(1)
    try:
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
        p = subprocess.Popen([sys.executable, "-c", CHILD, d.unix],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
        lines = []
        try:
            for _ in range(2):
                line = p.stdout.readline()
                lines.append(line)
                assert line == "queued\n", lines
                # let the child enter the call (a SIGINT before it enters
                # would pass without the slices); not a bound on anything
                time.sleep(1.0)
                p.send_signal(signal.SIGINT)
                lines.append(p.stdout.readline())
            out, err = p.communicate(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        lines += out.splitlines(True)
        assert p.returncode == 0, "".join(lines) + err
        want = ["queued\n", "interrupted ready=False\n",
                "queued\n", "interrupted ready=False\n",
                "usable True False\n", "closed\n"]
        assert lines == want, "".join(lines) + err
    finally:
        d.stop(signal.SIGKILL)  # the queued work is of no use: drop it
