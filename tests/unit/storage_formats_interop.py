#!/usr/bin/env python3
"""unit.storage_formats_interop: storage/'s formats against the reference tools.

1. NumPy (Debian's) and the safetensors package (the venv scripts/venv.sh
   makes) write reference files into a temporary directory: .npy of every
   dtype NumPy and paradev share, C and Fortran order, little- and
   big-endian, versions 1.0, 2.0 and 3.0; np.savez and np.savez_compressed;
   safetensors of all eight paradev dtypes (bfloat16 as raw bytes), one
   written by safetensors.numpy.save_file and one hand-made with unaligned
   data that the reference reader accepts. Each value's C-order
   little-endian bytes, as NumPy reports them, go to <n>.bin.
2. The C program (storage_formats_interop.c) reads every value through
   stg_index_read / stg_entry_read and compares it with the .bin, then
   writes them all back with stg_write_safetensors and stg_write_npy.
3. This script reads those back with safetensors and NumPy and asserts the
   values bit-exactly, and that the files are byte-identical to what
   safetensors.serialize and np.save write for the same values.

Run by ctest with the venv's python3: storage_formats_interop.py PROGRAM
"""
import io
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError as e:
    sys.exit(f"storage_formats_interop: numpy is missing ({e}); install python3-numpy")
try:
    import safetensors
    from safetensors import deserialize, serialize, safe_open
    from safetensors.numpy import save_file
except ImportError as e:
    sys.exit(f"storage_formats_interop: the safetensors package is missing ({e}); "
             f"this must run under the venv that scripts/venv.sh makes "
             f"(python here: {sys.executable})")

NP_DTYPES = {  # paradev name -> NumPy dtype (bfloat16 has none)
    "float32": np.float32, "float64": np.float64, "float16": np.float16,
    "int32": np.int32, "int64": np.int64, "uint8": np.uint8, "bool": np.bool_,
}
ST_NAMES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
            "int32": "I32", "int64": "I64", "uint8": "U8", "bool": "BOOL"}
PD_OF_NP = {np.dtype(v).newbyteorder("<").str: k for k, v in NP_DTYPES.items()}

rng = np.random.default_rng(13)


def sample(name, shape):
    dt = NP_DTYPES[name]
    if name == "bool":
        return rng.integers(0, 2, size=shape).astype(dt)
    if name == "uint8":
        return rng.integers(0, 256, size=shape).astype(dt)
    if name.startswith("int"):
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    a = rng.standard_normal(size=shape).astype(dt)
    if a.size >= 4:  # bit patterns worth keeping exact
        a.flat[0], a.flat[1], a.flat[2] = np.nan, -np.inf, -0.0
    return a


def le_bytes(a):
    """The C-order little-endian bytes of a NumPy array."""
    return np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()


class Manifest:
    def __init__(self, d):
        self.d, self.lines, self.items = d, [], []

    def add(self, file, entry, pd_dtype, shape, data):
        n = len(self.items)
        with open(os.path.join(self.d, f"{n}.bin"), "wb") as f:
            f.write(data)
        self.lines.append("\t".join([file, entry, pd_dtype, ",".join(map(str, shape)), f"{n}.bin"]))
        self.items.append((pd_dtype, tuple(shape), data))

    def count(self, file, n):
        self.lines.append(f"#count\t{file}\t{n}")

    def write(self):
        with open(os.path.join(self.d, "manifest.tsv"), "w") as f:
            f.write("\n".join(self.lines) + "\n")


def npy_variants(name):
    """(tag, array) pairs: C order, big-endian, Fortran, both, odd shapes."""
    base = sample(name, (3, 4, 5))
    be = base.dtype.newbyteorder(">")
    out = [("c", base), ("be", sample(name, (4, 6)).astype(be)),
           ("f", np.asfortranarray(sample(name, (2, 3, 4)))),
           ("fbe", np.asfortranarray(sample(name, (5, 2, 3)).astype(be))),
           ("scalar", sample(name, ())), ("empty", sample(name, (0, 5))),
           ("vec", sample(name, (7,)))]
    return out


def write_references(d, m):
    # .npy: every shared dtype and variant, with np.save (version 1.0).
    for name in NP_DTYPES:
        for tag, a in npy_variants(name):
            fn = f"{name}_{tag}.npy"
            np.save(os.path.join(d, fn), a)
            assert np.load(os.path.join(d, fn)).dtype == a.dtype
            m.add(fn, "", name, a.shape, le_bytes(a))
    # Versions 2.0 and 3.0, as NumPy writes them when asked.
    for ver in ((2, 0), (3, 0)):
        a = np.asfortranarray(sample("float64", (3, 5)).astype(">f8"))
        fn = f"v{ver[0]}.npy"
        with open(os.path.join(d, fn), "wb") as f:
            np.lib.format.write_array(f, a, version=ver)
        m.add(fn, "", "float64", a.shape, le_bytes(a))
    # .npz, stored and deflated; a big member spans several inflate chunks.
    arrays = {"w": sample("float32", (16, 8)), "b": sample("int64", (8,)),
              "layer/k": np.asfortranarray(sample("float16", (4, 3, 2))),
              "be": sample("int32", (5, 3)).astype(">i4"),
              "s": sample("uint8", ()), "mask": sample("bool", (9, 2)),
              "big": sample("float64", (600, 700))}
    for fn, save in (("plain.npz", np.savez), ("compressed.npz", np.savez_compressed)):
        save(os.path.join(d, fn), **arrays)
        with np.load(os.path.join(d, fn)) as z:
            assert sorted(z.files) == sorted(arrays)
        for k, a in arrays.items():
            m.add(fn, k, PD_OF_NP[a.dtype.newbyteorder("<").str], a.shape, le_bytes(a))
        m.count(fn, len(arrays))
    # safetensors: all eight dtypes through the reference serializer (which
    # takes NumPy's names, paradev's too, and writes "F32" and so on).
    tensors, meta = {}, {"format": "np", "note": "reference"}
    shapes = {"float32": (3, 4), "float64": (2, 2, 2), "float16": (5,), "bfloat16": (2, 3),
              "int32": (), "int64": (0, 4), "uint8": (7, 1), "bool": (3, 3)}
    for name, shape in shapes.items():
        if name == "bfloat16":
            raw = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16).astype("<u2").tobytes()
        else:
            raw = le_bytes(sample(name, shape))
        key = f"{name}.weight"
        tensors[key] = {"dtype": name, "shape": list(shape), "data": raw}
        m.add("all.safetensors", key, name, shape, raw)
    with open(os.path.join(d, "all.safetensors"), "wb") as f:
        f.write(serialize(tensors, metadata=meta))
    m.count("all.safetensors", len(tensors))
    # safetensors.numpy.save_file
    np_tensors = {f"n_{k}": sample(k, (4, 3)) for k in NP_DTYPES}
    save_file(np_tensors, os.path.join(d, "numpy.safetensors"))
    for k, a in np_tensors.items():
        m.add("numpy.safetensors", k, k[2:], a.shape, le_bytes(a))
    # Hand-made, data unaligned (BOOL first, then F64 at offset 1), which
    # the reference reader accepts.
    f64 = sample("float64", (3,))
    header = (b'{"flag":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]},'
              b'"x":{"dtype":"F64","shape":[3],"data_offsets":[1,25]}}')
    blob = struct.pack("<Q", len(header)) + header + b"\x01" + le_bytes(f64)
    dict(deserialize(blob))  # the reference must accept it
    with open(os.path.join(d, "unaligned.safetensors"), "wb") as f:
        f.write(blob)
    m.add("unaligned.safetensors", "x", "float64", (3,), le_bytes(f64))
    m.add("unaligned.safetensors", "flag", "bool", (1,), b"\x01")
    m.count("unaligned.safetensors", 2)


def check_written(d, m):
    checks = 0
    path = os.path.join(d, "out", "all.safetensors")
    with open(path, "rb") as f:
        blob = f.read()
    got = dict(deserialize(blob))
    assert len(got) == len(m.items), (len(got), len(m.items))
    want_tensors = {}
    for i, (pd_dtype, shape, data) in enumerate(m.items):
        t = got[f"t{i}"]
        assert t["dtype"] == ST_NAMES[pd_dtype], (i, t["dtype"], pd_dtype)
        assert tuple(t["shape"]) == shape, (i, t["shape"], shape)
        assert bytes(t["data"]) == data, f"t{i}: bytes differ"
        want_tensors[f"t{i}"] = {"dtype": pd_dtype, "shape": list(shape), "data": data}
        checks += 1
    n = struct.unpack("<Q", blob[:8])[0]
    assert n % 8 == 0, f"header length {n} is not a multiple of 8"
    assert blob == serialize(want_tensors, metadata={"writer": "paradev"}), \
        "out/all.safetensors is not byte-identical to safetensors.serialize's"
    with safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"writer": "paradev"}, f.metadata()
        for i, (pd_dtype, shape, data) in enumerate(m.items):
            if pd_dtype != "bfloat16":
                a = f.get_tensor(f"t{i}")
                assert a.dtype == NP_DTYPES[pd_dtype] and le_bytes(a) == data, i
    checks += 1
    for i, (pd_dtype, shape, data) in enumerate(m.items):
        p = os.path.join(d, "out", f"t{i}.npy")
        if pd_dtype == "bfloat16":
            assert not os.path.exists(p)
            continue
        a = np.load(p)
        assert a.dtype == np.dtype(NP_DTYPES[pd_dtype]).newbyteorder("<"), (i, a.dtype)
        assert a.shape == shape, (i, a.shape, shape)
        assert a.tobytes() == data, f"t{i}.npy: bytes differ"
        ref = io.BytesIO()
        np.save(ref, a)
        with open(p, "rb") as f:
            assert f.read() == ref.getvalue(), f"t{i}.npy is not byte-identical to np.save's"
        checks += 1
    return checks


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: storage_formats_interop.py PROGRAM")
    print(f"storage_formats_interop: numpy {np.__version__}, safetensors {safetensors.__version__}")
    with tempfile.TemporaryDirectory(prefix="paradev-interop-") as d:
        m = Manifest(d)
        write_references(d, m)
        m.write()
        print(f"wrote {len(m.items)} reference values into {d}")
        r = subprocess.run([sys.argv[1], d])
        if r.returncode != 0:
            print(f"FAILED: {sys.argv[1]} exited {r.returncode}")
            print("0 passed, 1 failed")
            return 1
        checks = check_written(d, m)
        print(f"read back {checks} files/values bit-exactly with safetensors and NumPy")
        print(f"{len(m.items) + checks} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
