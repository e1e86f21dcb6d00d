"""Strings handed to C: a NUL byte would end the C string early and name
something else ("n\\0x.safetensors" -> "n"), so every str and bytes with one
is refused with ValueError naming the argument, before any call. Bytes
paths stay bytes (os.fsencode), so a name that is not UTF-8 works. The
daemon refuses safetensors header names json-c would change (a \\u0000
escape, a lone surrogate)."""
import io
import json
import os
import struct
import zipfile

import numpy as np
import pytest

import paradev
from conftest import NDEV


@pytest.fixture
def root(daemon):
    return daemon.storage


def st_bytes(header, data):
    h = json.dumps(header, ensure_ascii=True).encode()
    return struct.pack("<Q", len(h)) + h + data


def test_nul_in_paths_and_names(sess, root):
    a = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    np.save(os.path.join(root, "ok.npy"), a)
    t = sess.upload(a, paradev.mirrored())
    before = set(os.listdir(root))
    with pytest.raises(ValueError, match=r"save: path: .* NUL byte"):
        sess.save("n\0x.safetensors", {"t": t})
    with pytest.raises(ValueError, match=r"save: path: .* NUL byte"):
        sess.save(b"n\0x.safetensors", {"t": t})
    with pytest.raises(ValueError, match=r"save: name: 'a\\x00b' .* NUL"):
        sess.save("s.safetensors", {"a\0b": t})
    with pytest.raises(ValueError, match=r"save: metadata key: .* NUL"):
        sess.save("s.safetensors", {"t": t}, {"k\0": "v"})
    with pytest.raises(ValueError, match=r"save: metadata\['k'\]: .* NUL"):
        sess.save("s.safetensors", {"t": t}, {"k": "v\0w"})
    assert set(os.listdir(root)) == before  # nothing written, not even "n"
    with pytest.raises(ValueError, match=r"load: path: .* NUL byte"):
        sess.load("ok.npy\0/etc/shadow")
    np.savez(os.path.join(root, "nul.npz"), w=a)
    with pytest.raises(ValueError, match=r"load: name: 'w\\x00x' .* NUL"):
        sess.load("nul.npz", ["w\0x"])
    with pytest.raises(ValueError, match=r"load: component source of 'w'"):
        sess.load("nul.npz", ["w"], paradev.per_component(),
                  component_sources=["ok.npy\0"] * NDEV)
    # each refusal left the session as it was
    got = sess.load("ok.npy")[""].numpy(paradev.mirrored())
    np.testing.assert_array_equal(got, a)


def test_nul_in_ops_sessions_and_targets(client, sess):
    x = sess.upload(np.ones(3, np.float32), paradev.mirrored())
    with pytest.raises(ValueError, match=r"op name: 'Neg\\x00Abs' .* NUL"):
        sess.op("Neg\0Abs", x)
    with pytest.raises(ValueError, match=r"AllReduce: attribute reduction: "
                       r"'sum\\x00max' .* NUL"):
        sess.ops.AllReduce(x, reduction="sum\0max")
    with pytest.raises(ValueError, match=r"Neg: attribute name: .* NUL"):
        sess.op("Neg", x, **{"T\0": 1})
    with pytest.raises(ValueError, match=r"session: name: .* NUL"):
        client.session("a\0b")
    with pytest.raises(ValueError, match=r"session: job_id: .* NUL"):
        client.session("ok", job_id="j\0k")
    with pytest.raises(ValueError, match=r"connect: target: .* NUL"):
        paradev.connect("unix:/tmp/a\0b")
    with pytest.raises(ValueError, match=r"health: service: .* NUL"):
        client.health("x\0")
    with pytest.raises(ValueError, match=r"save: name: .* not valid Unicode"):
        sess.save("s.safetensors", {"a\udc80": x})
    np.testing.assert_array_equal(
        sess.ops.AllReduce(x, reduction="sum").numpy(paradev.mirrored()),
        np.full(3, NDEV, np.float32))


def test_bytes_paths_stay_bytes(sess, root):
    a = np.arange(4, dtype=np.int32)
    t = sess.upload(a, paradev.mirrored())
    raw = b"\xff\xfe-w.safetensors"  # not UTF-8
    assert sess.save(raw, {"t": t}) == a.nbytes
    assert os.path.exists(os.path.join(os.fsencode(root), raw))
    got = sess.load(raw)["t"].numpy(paradev.mirrored())
    np.testing.assert_array_equal(got, a)
    # the str spelling os.fsdecode gives names the same file
    got = sess.load(os.fsdecode(raw))["t"].numpy(paradev.mirrored())
    np.testing.assert_array_equal(got, a)


def test_safetensors_names_json_c_would_change(sess, root):
    one = {"dtype": "U8", "shape": [1]}
    with open(os.path.join(root, "nul.safetensors"), "wb") as f:
        f.write(st_bytes({"a\0x": dict(one, data_offsets=[0, 1]),
                          "a\0y": dict(one, data_offsets=[1, 2])}, b"\1\2"))
    with pytest.raises(paradev.InvalidArgument,
                       match=r'nul\.safetensors: .*the name "a\\u0000x" '
                       r"holds a NUL byte"):
        sess.load("nul.safetensors")
    with open(os.path.join(root, "lone.safetensors"), "wb") as f:
        f.write(st_bytes({"a\udc80": dict(one, data_offsets=[0, 1])}, b"\1"))
    with pytest.raises(paradev.InvalidArgument,
                       match=r"lone\.safetensors: .*unpaired UTF-16 "
                       r"surrogate \(\\udc80\)"):
        sess.load("lone.safetensors")
    # a pair is a character: it loads under its name
    with open(os.path.join(root, "pair.safetensors"), "wb") as f:
        f.write(st_bytes({"\U0001f600": dict(one, data_offsets=[0, 1])},
                         b"\7"))
    t = sess.load("pair.safetensors")
    assert list(t) == ["\U0001f600"]
    assert t["\U0001f600"].numpy(paradev.mirrored()).tolist() == [7]


def test_npz_member_names_that_are_not_utf8(sess, root):
    """A member name that is not UTF-8 (zipfile writes UTF-8 or ASCII; this
    one is patched in) is refused by the daemon, as safetensors and .npy
    headers that are not UTF-8 are: no tensor comes back under a name the
    client cannot spell."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        one = io.BytesIO()
        np.save(one, np.arange(3))
        z.writestr("QQ.npy", one.getvalue())
        z.writestr("ok.npy", one.getvalue())
    with open(os.path.join(root, "latin.npz"), "wb") as f:
        f.write(buf.getvalue().replace(b"QQ.npy", b"\xff\xfe.npy"))
    with pytest.raises(paradev.InvalidArgument,
                       match=r"latin\.npz: zip: a member name \(6 bytes\) is "
                       "not valid UTF-8"):
        sess.load("latin.npz")
    with open(os.path.join(root, "fine.npz"), "wb") as f:
        f.write(buf.getvalue())
    assert list(sess.load("fine.npz")) == ["QQ", "ok"]
