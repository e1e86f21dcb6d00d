#!/usr/bin/python3
"""python_bench: what the Python package adds to libparadev's own cost,
measured in one run against one daemon (started here on a Unix socket, CPU
backend, 4 devices), each figure beside the C client's measured the same way
in the same run (pyclient_baseline, bench/pyclient_baseline.c):

  execute     a tiny op's round trip (Add of two float32 [1], session.op in
              eager mode) p50, beside C's pd_execute p50 (ratio; 1 = free)
  pipelined   the same op through the session's pipelined mode (one Enqueue
              stream; outputs collected and deleted in the stream), wall
              time per op, beside C's pd_stream_execute (aim: ratio <= 2);
              and the client process's CPU time per op (its stream thread
              included), the client's own cost whatever the daemon's speed
  upload      session.upload / tensor.numpy of 16 MiB of float32 sharded
  download    over the mesh, through gRPC (prefer_shared_memory=False) and
              through shared memory, in bytes per second, beside
              pd_upload / pd_download and the shared memory calls
  train       examples/train_digits.py's steps per second beside
              examples/train_digits.c's (both --quiet, same daemon)

Prints a table and appends JSON lines to bench-results.jsonl (the format of
bench/benchutil.h): $PARADEV_BENCH_RESULTS, else BUILD/bench-results.jsonl.

Usage: python_bench.py [--build BUILD] [--quick] [--target ADDR]
Exit status 1 on a failed call.
"""
import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import numpy as np  # noqa: E402

DEVICES = 4
RECORDS = []


def record(bench, params, metric, value, baseline=None, baseline_value=None):
    ratio = value / baseline_value if baseline and baseline_value else None
    RECORDS.append({"bench": bench, "params": params, "metric": metric,
                    "value": value, "baseline": baseline,
                    "baseline_value": baseline_value, "ratio": ratio})


def start_daemon(build):
    d = tempfile.mkdtemp(prefix="bench-py-")
    target = "unix:%s/pd.sock" % d
    p = subprocess.Popen([os.path.join(build, "server", "paradevd"),
                          "--listen", target, "--devices", str(DEVICES),
                          "--admin-socket", "", "--log", "warn",
                          "--max-message-bytes", "67108864"])
    return p, target, d


def wait_ready(paradev, target):
    for _ in range(200):
        try:
            with paradev.connect(target, timeout=1) as c:
                if c.health() == "SERVING":
                    return
        except paradev.Error:
            pass
        time.sleep(0.1)
    raise RuntimeError("paradevd at %s not SERVING in 20 s" % target)


def py_execute_p50(s, one, n):
    times = []
    for i in range(-(n // 10), n):
        t0 = time.perf_counter()
        out = s.op("Add", one, one)
        dt = time.perf_counter() - t0
        out.delete()
        s.flush()  # the same Delete per op as the C loop
        if i >= 0:
            times.append(dt)
    return statistics.median(times)


def py_pipelined(s, one, n):
    with s.pipeline():
        for _ in range(n // 10):
            s.op("Add", one, one)
    t0, c0 = time.perf_counter(), time.process_time()
    with s.pipeline():
        op = s.op
        for _ in range(n):
            op("Add", one, one)
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def py_transfer(paradev, s, nbytes):
    x = (np.arange(nbytes // 4) % 1000).astype(np.float32)
    up = down = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        t = s.upload(x, paradev.sharded(0))
        t1 = time.perf_counter()
        t.wait()
        t2 = time.perf_counter()
        y = t.numpy(paradev.concat(0))
        t3 = time.perf_counter()
        t.delete()
        s.flush()
        up, down = min(up, t1 - t0), min(down, t3 - t2)
    assert y.tobytes() == x.tobytes()
    return nbytes / up / 1e9, nbytes / down / 1e9


def steps_per_s(out):
    m = re.search(r"^(\d+) steps in ([0-9.]+) s", out, re.M)
    if not m:
        raise RuntimeError("no 'N steps in S s' line in:\n" + out)
    return int(m.group(1)) / float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--target", default=None)
    a = ap.parse_args()
    quick = a.quick or os.environ.get("PARADEV_BENCH_QUICK", "0") not in \
        ("", "0")
    build = os.path.abspath(a.build)
    os.environ.setdefault("PARADEV_LIBRARY",
                          os.path.join(build, "client", "libparadev.so"))
    import paradev
    n_rt, n_pipe = (200, 2000) if quick else (1000, 20000)
    nbytes = 16 << 20
    epochs = 2 if quick else 5
    proc = None
    tmp = None
    if a.target:
        target = a.target
    else:
        proc, target, tmp = start_daemon(build)
    try:
        wait_ready(paradev, target)
        r = subprocess.run([os.path.join(build, "pyclient_baseline"), target,
                            str(n_rt), str(n_pipe), str(nbytes)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print("python_bench: pyclient_baseline failed:\n" + r.stderr,
                  file=sys.stderr)
            return 1
        cb = json.loads(r.stdout)
        with paradev.connect(target) as c:
            with c.session("python_bench", prefer_shared_memory=False) as s:
                one = s.upload(np.ones(1, np.float32), paradev.mirrored())
                gc.disable()
                rt = py_execute_p50(s, one, n_rt)
                gc.enable()
                pipe, pipe_cpu = py_pipelined(s, one, n_pipe)
                up, down = py_transfer(paradev, s, nbytes)
            with c.session("python_bench_shm", shm_threshold=0) as s:
                sup, sdown = py_transfer(paradev, s, nbytes)
                shm_reason = s.shm_disabled_reason
        p = {"devices": DEVICES, "op": "Add", "shape": [1]}
        record("python", p, "execute_p50_us", rt * 1e6, "c_execute_p50_us",
               cb["execute_p50_us"])
        record("python", p, "pipelined_us_per_op", pipe * 1e6,
               "c_pipelined_us_per_op", cb["pipelined_us_per_op"])
        record("python", p, "pipelined_cpu_us_per_op", pipe_cpu * 1e6,
               "c_pipelined_cpu_us_per_op", cb["pipelined_cpu_us_per_op"])
        p = {"devices": DEVICES, "bytes": nbytes, "layout": "sharded",
             "path": "grpc"}
        record("python", p, "upload_GBps", up, "c_upload_GBps",
               cb["upload_GBps"])
        record("python", p, "download_GBps", down, "c_download_GBps",
               cb["download_GBps"])
        if "shm_upload_GBps" in cb and shm_reason is None:
            p = dict(p, path="shm")
            record("python", p, "shm_upload_GBps", sup, "c_shm_upload_GBps",
                   cb["shm_upload_GBps"])
            record("python", p, "shm_download_GBps", sdown,
                   "c_shm_download_GBps", cb["shm_download_GBps"])
        args = ["--target", target, "--epochs", str(epochs), "--quiet"]
        rc_ = subprocess.run([os.path.join(build, "train_digits")] + args,
                             capture_output=True, text=True)
        rp = subprocess.run([sys.executable,
                             os.path.join(ROOT, "examples", "train_digits.py")]
                            + args, capture_output=True, text=True)
        if rc_.returncode or rp.returncode:
            print("python_bench: a trainer failed:\n%s%s" %
                  (rc_.stderr, rp.stderr), file=sys.stderr)
            return 1
        record("python", {"devices": DEVICES, "epochs": epochs, "batch": 32},
               "train_steps_per_s", steps_per_s(rp.stdout),
               "c_train_steps_per_s", steps_per_s(rc_.stdout))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
            for f in os.listdir(tmp):
                os.unlink(os.path.join(tmp, f))
            os.rmdir(tmp)
    path = os.environ.get("PARADEV_BENCH_RESULTS") or \
        os.path.join(build, "bench-results.jsonl")
    with open(path, "a") as f:
        for rec in RECORDS:
            f.write(json.dumps(rec) + "\n")
    print("%-8s %-22s %12s  %-24s %12s %7s" % ("bench", "metric", "value",
                                                 "baseline", "value", "ratio"))
    for rec in RECORDS:
        print("%-8s %-22s %12.3f  %-24s %12.3f %7.2f" % (
            rec["bench"], rec["metric"], rec["value"], rec["baseline"],
            rec["baseline_value"], rec["ratio"]))
    print("results appended to %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
