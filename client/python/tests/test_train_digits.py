"""examples/train_digits.py, briefly, against a real daemon: the loss falls,
the test accuracy passes a lower bar, the replicas agree. 3 devices and a
batch of 24, so the last batch (1438 = 59 * 24 + 22 rows) splits unevenly.
No timing thresholds."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def test_train_digits_learns(daemon, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(HERE)
    png = tmp_path / "curves.png"
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "train_digits.py"),
         "--target", daemon.unix, "--epochs", "3", "--batch", "24",
         "--seed", "7", "--min-accuracy", "85", "--plot", str(png)],
        capture_output=True, text=True, env=env, timeout=240)
    print(r.stdout, r.stderr)
    assert r.returncode == 0
    losses = [float(m.group(1)) for m in
              re.finditer(r"^epoch +\d+/3  loss (\S+)", r.stdout, re.M)]
    assert len(losses) == 3
    assert losses[2] < losses[0]
    acc = float(re.search(r"^test accuracy (\S+)%", r.stdout, re.M).group(1))
    assert acc >= 85
    assert "weights bitwise identical on all 3 devices" in r.stdout
    assert png.exists() and png.stat().st_size > 0
