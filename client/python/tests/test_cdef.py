"""The checked-in cffi declarations (paradev/_cdef.py) match what the
headers give now (tools/gen_cdef.py --check), and every name the package
calls is declared."""
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)


def test_cdef_is_current():
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C preprocessor (cc) to read the headers with")
    r = subprocess.run([sys.executable, os.path.join(PKG, "tools",
                                                     "gen_cdef.py"),
                        "--check", "--cc", cc], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_called_function_is_declared():
    from paradev._cdef import CDEF
    declared = set(re.findall(r"\b(pd_\w+)\s*\(", CDEF))
    used = set()
    for root, _, files in os.walk(os.path.join(PKG, "paradev")):
        for f in files:
            if f.endswith(".py") and f != "_cdef.py":
                text = open(os.path.join(root, f)).read()
                used |= set(re.findall(r"\blib\.(pd_\w+)\s*\(", text))
    # _lib._OPTIONAL: placement calls declared by the package where the
    # headers lack them, each used only behind _lib.has(name)
    from paradev._lib import _OPTIONAL
    missing = used - declared - {"pd_list_ops", "pd_ops_free"} - \
        set(_OPTIONAL)
    assert not missing, missing
