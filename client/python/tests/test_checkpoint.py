"""session.load / session.save against the real daemon (its storage root is
daemon.storage, conftest.py): files NumPy writes load bit-exactly in every
layout; files the daemon saves read back bit-exactly with NumPy (np.load,
and safetensors parsed here with json + np.frombuffer); metadata; progress;
refusals, each followed by a call that works."""
import json
import os
import pathlib
import re
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import paradev
from conftest import NDEV

HERE = os.path.dirname(os.path.abspath(__file__))

# safetensors' dtype names (huggingface/safetensors) and NumPy's
ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8",
             "I32": "<i4", "U8": "u1", "BOOL": "?"}


def values(dtype, shape, seed=0):
    """Values that make bit-exactness matter: NaN, infinities, -0.0 and
    subnormals for floats, the extremes for integers."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    dt = np.dtype(dtype)
    if dt.kind == "f":
        a = rng.standard_normal(n).astype(dt)
        special = np.array([np.nan, np.inf, -np.inf, -0.0,
                            np.finfo(dt).tiny / 2, np.finfo(dt).max], dt)
        a[:min(n, special.size)] = special[:min(n, special.size)]
    elif dt.kind == "b":
        a = rng.integers(0, 2, n).astype(dt)
    else:
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        a[:2] = [info.min, info.max]
    return a.reshape(shape)


def same_bits(got, want):
    """Bit-exact equality (NaN payloads and -0.0 included), dtype and shape
    too; `want` in any byte order."""
    want = np.asarray(want)
    want = want.astype(want.dtype.newbyteorder("<")) \
        if want.dtype.byteorder == ">" else want
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.ascontiguousarray(got).tobytes() == \
        np.ascontiguousarray(want).tobytes()


def check_layout(t, a, layout, ndev=NDEV):
    """The loaded tensor t holds host value `a` as `layout` says."""
    if layout.kind == paradev.layouts.MIRRORED:
        assert t.is_mirrored is True
        same_bits(t.numpy(paradev.mirrored()), a)
        for c in t.numpy(paradev.per_component()):
            same_bits(c, a)
    else:  # sharded(axis): the components are np.array_split's
        assert t.is_mirrored is False
        parts = np.array_split(np.asarray(a), ndev, axis=layout.axis)
        for c, p in zip(t.numpy(paradev.per_component()), parts):
            same_bits(c, p)
        same_bits(t.numpy(paradev.concat(layout.axis)), a)


def read_safetensors(path):
    """(dict name -> array, metadata) parsed by hand: 8-byte little-endian
    header length, JSON header, data section."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    body = data[8 + n:]
    out = {}
    end = 0
    for name, h in header.items():
        lo, hi = h["data_offsets"]
        end = max(end, hi)
        out[name] = np.frombuffer(body[lo:hi], ST_DTYPES[h["dtype"]]).reshape(
            h["shape"])
    assert end == len(body), "trailing bytes or holes in %s" % path
    return out, meta


@pytest.fixture
def root(daemon):
    return daemon.storage


def test_storage_roots_in_info(client, daemon):
    assert client.info().storage_roots == (daemon.storage,)


LAYOUTS = [paradev.mirrored(), paradev.sharded(0), paradev.sharded(1)]
DTYPES = ["<f4", "<f8", "<f2", "<i4", "<i8", "u1", "?"]


# -- files NumPy writes --------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
@pytest.mark.parametrize("kind", ["c", "fortran", "big", "fortran-big"])
def test_load_npy(sess, root, layout, kind):
    for i, dt in enumerate(DTYPES):
        a = values(dt, (7, 5), seed=i)
        if "big" in kind and np.dtype(dt).itemsize > 1:
            a = a.astype(np.dtype(dt).newbyteorder(">"))
        if "fortran" in kind:
            a = np.asfortranarray(a)
        name = "np_%s_%d.npy" % (kind, i)
        np.save(os.path.join(root, name), a)
        if "fortran" in kind:  # the file really is in Fortran order
            with open(os.path.join(root, name), "rb") as f:
                assert b"'fortran_order': True" in f.read(128)
        got = sess.load(name, layout=layout)
        assert list(got) == [""]
        t = got[""]
        assert t.dtype == np.dtype(dt).newbyteorder("=")
        assert got.host_shapes[""] == (7, 5)
        if layout.kind == paradev.layouts.MIRRORED:
            assert t.shape == (7, 5)
        check_layout(t, a, layout)


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
@pytest.mark.parametrize("save", [np.savez, np.savez_compressed],
                         ids=["savez", "savez_compressed"])
def test_load_npz(sess, root, layout, save):
    arrs = {"w%d" % i: values(dt, (6, 4 + i), seed=10 + i)
            for i, dt in enumerate(DTYPES)}
    arrs["fw"] = np.asfortranarray(values("<f4", (9, 3), seed=3))
    arrs["bw"] = values("<i8", (3, 3), seed=4).astype(">i8")
    name = "np_%s.npz" % save.__name__
    save(os.path.join(root, name), **arrs)
    got = sess.load(name, layout=layout)
    assert list(got) == list(arrs)  # the file's order
    for k, a in arrs.items():
        check_layout(got[k], a, layout)
    sess.sync()


def test_load_names_order_and_layout_dict(sess, root):
    arrs = {"a": values("<f4", (6, 2), 1), "b": values("<i4", (5,), 2),
            "c": values("<f8", (3, 4), 3)}
    np.savez(os.path.join(root, "three.npz"), **arrs)
    got = sess.load("three.npz", ["c", "a"])
    assert list(got) == ["c", "a"]
    check_layout(got["c"], arrs["c"], paradev.mirrored())
    check_layout(got["a"], arrs["a"], paradev.mirrored())
    got = sess.load("three.npz", "b")
    assert list(got) == ["b"]
    # a dict of layouts: its keys are the names; names it lacks are mirrored
    got = sess.load("three.npz", layout={"b": paradev.sharded(0),
                                         "a": paradev.mirrored()})
    assert list(got) == ["b", "a"]
    check_layout(got["b"], arrs["b"], paradev.sharded(0))
    check_layout(got["a"], arrs["a"], paradev.mirrored())
    got = sess.load("three.npz", ["a", "c"], {"c": paradev.sharded(1)})
    check_layout(got["a"], arrs["a"], paradev.mirrored())
    check_layout(got["c"], arrs["c"], paradev.sharded(1))
    # an explicit format; an absolute os.PathLike path
    got = sess.load(pathlib.Path(root) / "three.npz", "a", format="npz")
    check_layout(got["a"], arrs["a"], paradev.mirrored())


def test_load_per_component_sources(sess, root):
    parts = [values("<f4", (3 + k, 2), seed=20 + k) for k in range(NDEV)]
    for k, p in enumerate(parts):
        np.save(os.path.join(root, "pc%d.npy" % k), p)
    got = sess.load("pc0.npy", [""], paradev.per_component(),
                    component_sources=["pc%d.npy" % k for k in range(NDEV)])
    t = got[""]
    assert t.is_mirrored is False
    assert got.host_shapes[""] is None
    for c, p in zip(t.numpy(paradev.per_component()), parts):
        same_bits(c, p)


# -- files the daemon saves -----------------------------------------------------
def test_save_safetensors_read_by_numpy(sess, root):
    arrs = {"f32": values("<f4", (4, 6), 30), "f64": values("<f8", (5,), 31),
            "f16": values("<f2", (2, 3, 2), 32), "i32": values("<i4", (7,), 33),
            "i64": values("<i8", (3, 2), 34), "u8": values("u1", (9,), 35),
            "b": values("?", (4,), 36), "scalar": np.float32(2.5)}
    ts = {k: sess.upload(a, paradev.mirrored()) for k, a in arrs.items()}
    sh = values("<f4", (7, 3), 37)
    ts_sharded = sess.upload(sh, paradev.sharded(0))
    pc = [values("<i4", (2 + k,), 38 + k) for k in range(NDEV)]
    ts_pc = sess.upload(pc, paradev.per_component())
    items = list(ts.items()) + [("sh", ts_sharded, paradev.sharded(0)),
                                ("pc", ts_pc, paradev.per_component())]
    os.makedirs(os.path.join(root, "out"), exist_ok=True)
    n = sess.save("out/all.safetensors", items)
    want = sum(a.nbytes for a in arrs.values()) + sh.nbytes + \
        sum(p.nbytes for p in pc)
    assert n == want
    got, meta = read_safetensors(os.path.join(root, "out", "all.safetensors"))
    for k, a in arrs.items():
        same_bits(got[k], np.asarray(a))
    same_bits(got["sh"], sh)  # gathered along axis 0
    for k in range(NDEV):
        same_bits(got["pc:%d" % k], pc[k])
    assert "paradev.components.pc" in meta
    # and back through the daemon: the saved file loads bit-exactly
    back = sess.load("out/all.safetensors", ["f32", "sh", "pc"],
                     {"sh": paradev.sharded(1), "pc": paradev.per_component()})
    check_layout(back["f32"], arrs["f32"], paradev.mirrored())
    check_layout(back["sh"], sh, paradev.sharded(1))
    for c, p in zip(back["pc"].numpy(paradev.per_component()), pc):
        same_bits(c, p)


def test_save_npy_read_by_np_load(sess, root):
    for i, dt in enumerate(DTYPES):
        a = values(dt, (5, 4), 40 + i)
        t = sess.upload(a, paradev.mirrored())
        name = "saved_%d.npy" % i
        assert sess.save(name, {"x": t}) == a.nbytes
        same_bits(np.load(os.path.join(root, name)), a)
    # a sharded tensor, gathered; format= for a name without .npy
    a = values("<f8", (8, 3), 50)
    t = sess.upload(a, paradev.sharded(0))
    sess.save("gathered.bin", [("x", t, paradev.concat(0))], format="npy")
    same_bits(np.load(os.path.join(root, "gathered.bin")), a)


def test_metadata_round_trip(sess, root):
    t = sess.upload(values("<f4", (3,), 60), paradev.mirrored())
    meta = {"step": "1200", "model": "digits", "note": "ünïcode, \"quoted\""}
    sess.save("meta.safetensors", {"w": t}, meta)
    got, m = read_safetensors(os.path.join(root, "meta.safetensors"))
    assert m == meta
    same_bits(got["w"], values("<f4", (3,), 60))
    with pytest.raises(TypeError, match="metadata"):
        sess.save("meta2.safetensors", {"w": t}, {"step": 1200})
    sess.save("meta2.safetensors", {"w": t}, {"step": "1200"})
    assert read_safetensors(os.path.join(root, "meta2.safetensors"))[1] == \
        {"step": "1200"}


def test_pipelined_save_and_load(client, root):
    a = np.random.default_rng(70).standard_normal((6, 4)).astype(np.float32)
    with client.session("ckpt-pipe", pipelined=True) as s:
        x = s.upload(a, paradev.mirrored())
        y = x * 2.0 + 1.0  # queued on the stream
        s.save("pipe.safetensors", {"y": y})
        got, _ = read_safetensors(os.path.join(root, "pipe.safetensors"))
        same_bits(got["y"], a * np.float32(2) + np.float32(1))
        back = s.load("pipe.safetensors")
        z = back["y"] - 1.0
        same_bits(z.numpy(paradev.mirrored()),
                  (a * np.float32(2) + np.float32(1)) - np.float32(1))


# -- progress ----------------------------------------------------------------
def test_progress_callback(sess, root):
    big = values("<f4", (1 << 22,), 80)  # 16 MiB
    np.save(os.path.join(root, "big.npy"), big)
    calls = []
    got = sess.load("big.npy", layout=paradev.sharded(0),
                    progress=lambda done, total: calls.append((done, total)))
    assert calls, "the callback was never called"
    dones = [d for d, _ in calls]
    assert dones == sorted(dones)
    assert {t for _, t in calls} == {big.nbytes}
    assert calls[-1] == (big.nbytes, big.nbytes)
    p = got.progress()
    assert p.done and p.error is None and p.bytes_done == big.nbytes
    assert (p.tensors_done, p.tensors_total, p.tensors_failed) == (1, 1, 0)
    assert got.total_bytes == big.nbytes
    check_layout(got[""], big, paradev.sharded(0))
    # Load.wait: the same without a callback, and with one
    got = sess.load("big.npy")
    assert got.wait().bytes_done == big.nbytes
    seen = []
    got.wait(lambda d, t: seen.append((d, t)))
    assert seen[-1] == (big.nbytes, big.nbytes)
    same_bits(got[""].numpy(paradev.mirrored()), big)


def test_failed_read_is_stored_on_its_tensor(sess, root):
    """A member whose deflated bytes are damaged past its header: the load
    returns, the read fails later, and only that tensor carries the error."""
    a = np.random.default_rng(85).standard_normal(1 << 18).astype(np.float32)
    b = np.arange(10, dtype=np.int32)
    p = os.path.join(root, "damaged.npz")
    np.savez_compressed(p, a=a, b=b)
    with zipfile.ZipFile(p) as zf:
        m = zf.getinfo("a.npy")
    data = bytearray(open(p, "rb").read())
    mid = m.header_offset + 30 + len(m.filename) + len(m.extra) + \
        m.compress_size // 2
    for i in range(mid, mid + 64):
        data[i] ^= 0xFF
    open(p, "wb").write(bytes(data))
    calls = []
    got = sess.load(p, progress=lambda d, t: calls.append((d, t)))  # absolute
    assert list(got) == ["a", "b"] and got["a"].shape == a.shape
    assert calls and calls[-1][1] == got.total_bytes
    pr = got.progress()
    assert pr.done and pr.tensors_failed == 1
    assert isinstance(pr.error, paradev.Error) and "'a'" in pr.error.message
    with pytest.raises(paradev.Error, match="damaged.npz"):
        got["a"].numpy(paradev.mirrored())
    with pytest.raises(paradev.Error, match="damaged.npz"):
        got["a"].wait()
    with pytest.raises(paradev.Error, match="damaged.npz"):
        got.wait()
    same_bits(got["b"].numpy(paradev.mirrored()), b)
    with pytest.raises(paradev.Error, match="damaged.npz"):
        sess.sync()
    same_bits(sess.load("damaged.npz", "b")["b"].numpy(paradev.mirrored()), b)


# -- refusals, each followed by a working call ----------------------------------
def test_refusals(sess, root):
    a = np.random.default_rng(90).standard_normal((4, 2)).astype(np.float32)
    np.save(os.path.join(root, "ok.npy"), a)

    def works():
        check_layout(sess.load("ok.npy")[""], a, paradev.mirrored())

    with pytest.raises(paradev.PermissionDenied, match="storage root"):
        sess.load("/etc/passwd")
    works()
    with pytest.raises(paradev.PermissionDenied):
        sess.load("../../../etc/passwd")
    works()
    with pytest.raises(paradev.NotFound):
        sess.load("no-such-file.npy")
    works()
    np.savez(os.path.join(root, "nz.npz"), w=a)
    with pytest.raises(paradev.NotFound, match="nope"):
        sess.load("nz.npz", ["w", "nope"])
    check_layout(sess.load("nz.npz", ["w"])["w"], a, paradev.mirrored())
    with open(os.path.join(root, "junk.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", 10) + b"{not json}")
    with pytest.raises(paradev.InvalidArgument):
        sess.load("junk.safetensors")
    works()

    t = sess.upload(a, paradev.mirrored())
    sess.save("exists.safetensors", {"t": t})
    with pytest.raises(paradev.AlreadyExists):
        sess.save("exists.safetensors", {"t": t})
    sess.save("exists.safetensors", {"t": t * 3.0}, overwrite=True)
    got, _ = read_safetensors(os.path.join(root, "exists.safetensors"))
    same_bits(got["t"], a * np.float32(3))
    with pytest.raises(paradev.PermissionDenied):
        sess.save("/tmp/outside.safetensors", {"t": t})
    assert not os.path.exists("/tmp/outside.safetensors")
    with pytest.raises(paradev.NotFound):
        sess.save("no/such/dir/x.safetensors", {"t": t})
    sess.save("after.safetensors", {"t": t})

    s = sess.upload(a, paradev.sharded(0))
    with pytest.raises(ValueError, match=r"'s'.*paradev\.sharded\(axis\)"):
        sess.save("sharded.safetensors", {"t": t, "s": s})
    assert not os.path.exists(os.path.join(root, "sharded.safetensors"))
    sess.save("sharded.safetensors", {"t": t, "s": s},
              layout={"s": paradev.sharded(0)})
    got, _ = read_safetensors(os.path.join(root, "sharded.safetensors"))
    same_bits(got["s"], a)
    with sess.tape(watch=[t]) as tape:
        y = (t * t).sum()
    (g,) = tape.gradient(y, [t])
    assert g.is_mirrored is None  # the client cannot tell
    with pytest.raises(ValueError, match="'g'.*not known to be mirrored"):
        sess.save("grad.safetensors", {"g": g})
    sess.save("grad.safetensors", {"g": g}, layout=paradev.mirrored())
    got, _ = read_safetensors(os.path.join(root, "grad.safetensors"))
    same_bits(got["g"], a * np.float32(2))
    with pytest.raises(ValueError, match="component"):
        sess.save("c.safetensors", {"t": t}, layout=paradev.component(1))
    with pytest.raises(ValueError, match="component"):
        sess.load("ok.npy", layout=paradev.component(0))
    with pytest.raises(ValueError, match="twice"):
        sess.load("nz.npz", ["w", "w"])
    with pytest.raises(ValueError, match="'v', which names= lacks"):
        sess.load("nz.npz", ["w"], {"v": paradev.sharded(0)})
    with pytest.raises(ValueError, match="component_sources"):
        sess.load("nz.npz", ["w"], component_sources=["ok.npy"] * NDEV)
    with pytest.raises(ValueError, match="one per device"):
        sess.load("nz.npz", ["w"], paradev.per_component(),
                  component_sources=["ok.npy"])
    with pytest.raises(TypeError, match="Tensors"):
        sess.save("c.safetensors", {"t": a})
    with pytest.raises(ValueError, match="format"):
        sess.save("c.npz", {"t": t}, format="npz")
    works()


# -- the READMEs' checkpoint examples run as they are ---------------------------
def python_blocks(path, start=""):
    text = open(path).read()
    return re.findall(r"```python\n(.*?)```", text[text.index(start):], re.S)


def run_block(code, daemon):
    env = dict(os.environ, PARADEV_TARGET=daemon.unix,
               PYTHONPATH=os.path.dirname(HERE))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


def test_readme_examples(daemon):
    root_readme = os.path.join(HERE, "..", "..", "..", "README.md")
    out = run_block(python_blocks(root_readme, "### Python client")[1], daemon)
    assert out[0] == "roots ('%s',)" % daemon.storage
    assert out[1] == "72 bytes written"  # w 3x2, x 6x2 float32
    assert out[-2] == "loaded 72 of 72 bytes"
    assert out[-1] == "['w', 'x'] 15.0 12.0"
    pkg_readme = os.path.join(HERE, "..", "README.md")
    out = run_block(python_blocks(pkg_readme)[1], daemon)
    assert out == ["['x', 'w'] 144 12.0"]  # 6 + 12 float64
