"""examples/train_digits.py, briefly, against a real daemon: the loss falls,
the test accuracy passes a lower bar, the replicas agree. 3 devices and a
batch of 24, so the last batch (1438 = 59 * 24 + 22 rows) splits unevenly.
No timing thresholds. Then --save and --evaluate, also across the C
trainer."""
import json
import os
import re
import struct
import subprocess
import sys

import pytest

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


def run(args, env, timeout=240):
    r = subprocess.run(args, capture_output=True, text=True, env=env,
                       timeout=timeout)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def accuracy_line(out):
    return re.search(r"^test accuracy .*$", out, re.M).group(0)


def test_save_and_evaluate(daemon):
    """--save writes the C trainer's four weights (mirrored, metadata
    model/layers); --evaluate loads them in a fresh session and reports the
    same test accuracy line. With the C trainer built, each evaluates what
    the other saved, with the same line."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    py = [sys.executable, os.path.join(ROOT, "examples", "train_digits.py"),
          "--target", daemon.unix, "--seed", "5"]
    out = run(py + ["--epochs", "2", "--save", "py-digits.safetensors",
                    "--quiet"], env)
    assert "weights saved by the daemon to py-digits.safetensors" in out
    trained = accuracy_line(out)
    with open(os.path.join(daemon.storage, "py-digits.safetensors"),
              "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    assert header.pop("__metadata__") == {"model": "paradev dp_mlp",
                                          "layers": "64-128-10"}
    assert {k: (v["dtype"], v["shape"]) for k, v in header.items()} == {
        "hidden.kernel": ("F32", [64, 128]), "hidden.bias": ("F32", [128]),
        "output.kernel": ("F32", [128, 10]), "output.bias": ("F32", [10])}
    out = run(py + ["--evaluate", "py-digits.safetensors"], env)
    assert "weights loaded by the daemon from py-digits.safetensors" in out
    assert "epoch " not in out
    assert accuracy_line(out) == trained
    c = os.path.join(os.environ.get("PARADEV_BUILD_DIR",
                                    os.path.join(ROOT, "build")),
                     "train_digits")
    if not os.path.exists(c):
        return
    cargs = [c, "--target", daemon.unix, "--seed", "5"]
    out = run(cargs + ["--evaluate", "py-digits.safetensors"], env)
    assert accuracy_line(out) == trained
    out = run(cargs + ["--epochs", "1", "--save", "c-digits.safetensors",
                       "--quiet"], env)
    c_trained = accuracy_line(out)
    out = run(py + ["--evaluate", "c-digits.safetensors"], env)
    assert accuracy_line(out) == c_trained


@pytest.mark.parametrize("mode", ["function", "eager"])
def test_both_modes_learn(daemon, mode):
    """--mode function: the whole step one traced graph function (its
    Gradients node, the AllReduce of the gradients and the Adam update
    inside), called once per step; --mode eager: one stream item per op.
    Each learns and the replicas agree."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    out = run([sys.executable, os.path.join(ROOT, "examples",
                                            "train_digits.py"),
               "--target", daemon.unix, "--epochs", "3", "--batch", "24",
               "--seed", "7", "--mode", mode], env)
    assert ("mode: function (one call per step)" if mode == "function"
            else "mode: eager (one stream item per op)") in out
    losses = [float(m.group(1)) for m in
              re.finditer(r"^epoch +\d+/3  loss (\S+)", out, re.M)]
    assert len(losses) == 3 and losses[2] < losses[0]
    acc = float(re.search(r"^test accuracy (\S+)%", out, re.M).group(1))
    assert acc >= 85
    assert "weights bitwise identical on all 3 devices" in out
