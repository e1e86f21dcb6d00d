"""The root README's Python example runs unchanged against a daemon; and
`pip install ./client/python` works against a libparadev installed into a
prefix (cmake --install), in a virtual environment, offline."""
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(PKG))


def readme_example():
    text = open(os.path.join(ROOT, "README.md")).read()
    sec = text[text.index("### Python client"):]
    return re.search(r"```python\n(.*?)```", sec, re.S).group(1)


def run_example(env, python=sys.executable, cwd=None):
    r = subprocess.run([python, "-c", readme_example()], capture_output=True,
                       text=True, env=env, timeout=120, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "loss -6.0" in r.stdout, r.stdout
    assert "as expected: np.asarray(tensor) needs a mirrored tensor" in \
        r.stdout, r.stdout
    return r.stdout


def test_readme_example_runs(daemon):
    env = dict(os.environ, PARADEV_TARGET=daemon.unix, PYTHONPATH=PKG)
    out = run_example(env)
    assert "x back [ 0.  1.  2.  3.  4.  5.  6.  7.  8.  9. 10. 11.]" in out
    # 3 devices, shards of 2 rows: d/dw sum(x w) through AllReduce(sum) on
    # device 0 is 3 * its shard's column sums, (0 + 2, 1 + 3) * 3
    assert "gradient on device 0 [ 6. 12.]" in out


def test_pip_install_against_installed_libparadev(daemon, tmp_path):
    build = os.environ.get("PARADEV_BUILD_DIR")
    if not build:
        pytest.skip("PARADEV_BUILD_DIR not set (ctest sets it)")
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("the sanitizer build: cmake, pip and a venv under a "
                    "preloaded ASan runtime prove nothing (the normal build "
                    "runs this test)")
    prefix = tmp_path / "prefix"
    r = subprocess.run(["cmake", "--install", build, "--prefix", str(prefix),
                        "--component", "client"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    venv = tmp_path / "venv"
    r = subprocess.run([sys.executable, "-m", "venv",
                        "--system-site-packages", str(venv)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip("no venv here (python3-venv): " + r.stderr)
    py = str(venv / "bin" / "python")
    if subprocess.run([py, "-c", "import setuptools, pip"],
                      capture_output=True).returncode != 0:
        pytest.skip("the venv has no setuptools or pip to build the package "
                    "offline (apt-get install python3-setuptools python3-pip)")
    # a copy, so that the install builds nothing in the source tree
    src = tmp_path / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns(
        "__pycache__", "*.egg-info", "build"))
    r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation",
                        "--no-deps", "--no-index", str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    libdir = [str(p.parent) for p in prefix.rglob("libparadev.so.0")][0]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PARADEV_LIBRARY", "PYTHONPATH", "LD_LIBRARY_PATH")}
    # Without the prefix on the loader's path: a clear error naming what it
    # tried (unless this machine has a libparadev of its own).
    if not os.path.exists("/usr/local/lib/libparadev.so.0") and \
            not os.path.exists("/usr/lib/libparadev.so.0"):
        r = subprocess.run([py, "-c", "import paradev"], capture_output=True,
                           text=True, env=env, cwd=str(tmp_path))
        assert r.returncode != 0
        assert "libparadev not found. Tried:" in r.stderr
        assert "the dynamic loader's search" in r.stderr
        assert "/usr/local/lib/libparadev.so.0 (no such file)" in r.stderr
    env["LD_LIBRARY_PATH"] = libdir
    env["PARADEV_TARGET"] = daemon.unix
    r = subprocess.run([py, "-c", "import paradev; print(paradev.__file__, "
                        "paradev.LIBRARY_PATH)"], capture_output=True,
                       text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert str(venv) in r.stdout and "libparadev.so.0" in r.stdout
    run_example(env, python=py, cwd=str(tmp_path))
    # $PARADEV_LIBRARY alone is enough too
    env.pop("LD_LIBRARY_PATH")
    env["PARADEV_LIBRARY"] = os.path.join(libdir, "libparadev.so.0")
    run_example(env, python=py, cwd=str(tmp_path))


def test_package_readme_example_runs(daemon):
    text = open(os.path.join(PKG, "README.md")).read()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    env = dict(os.environ, PARADEV_TARGET=daemon.unix, PYTHONPATH=PKG)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    # sum(x @ ones(2, 3)) = 3 * sum(0..7), mirrored after the AllReduce
    assert r.stdout.splitlines()[1].startswith("84.0 ")
