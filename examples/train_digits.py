#!/usr/bin/python3
"""train_digits.py: data-parallel training of a digits classifier through
paradevd, with the paradev Python package alone -- the Python twin of
examples/train_digits.c (and its model, dp_mlp.c).

The optical-digits set (1,797 images of 8x8 pixels, examples/data/) is split
80/20 with a fixed seed and scaled to [0, 1]. A multilayer perceptron
64 -> 128 (ReLU) -> 10 with softmax cross-entropy lives on the daemon, its
weights mirrored on every device of the mesh; every step uploads a batch
sharded across the mesh, runs forward and loss under a gradient tape,
averages the gradients with AllReduce(mean) and applies the same Adam (or
SGD with momentum) update on every device -- all as daemon ops, pipelined
through one Enqueue stream (the session's pipelined mode). Temporaries are
freed as Python drops them (batched deletes in the same stream). The client
waits for the devices every 16 steps (to bound how far it runs ahead) and
once per epoch, for the epoch's numbers.

The split, the shuffles, the initial weights (the daemon's RandomNormal with
the same seeds) and the op sequence are the C trainer's, so both print the
same numbers up to the last digits.

Prints one line per epoch (loss, train accuracy, steps per second), then the
test accuracy, whether the weights are bitwise identical on every device,
and how busy the devices were. --plot FILE.png draws the curves with
matplotlib when it is installed, else with gnuplot. --save PATH has the
daemon write the weights (hidden.kernel, hidden.bias, output.kernel,
output.bias, mirrored, as safetensors with the model in its metadata, the C
trainer's names); --evaluate PATH loads such a file, from either trainer,
in a fresh session and reports its test accuracy (give the same --seed).

Exit status: 0 done (1 when --min-accuracy is given and not reached, or the
replicas differ), 1 a failed call, 2 a bad command line.
"""
import argparse
import gzip
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import paradev
except ImportError:  # run from a source tree without installing
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "client", "python"))
    import paradev

FEATURES, CLASSES, HIDDEN = 64, 10, 128
# the C trainer's names (dp_mlp.c: dp_mlp_weight_names), so that either
# trainer evaluates what the other saved
WEIGHT_NAMES = ("hidden.kernel", "hidden.bias", "output.kernel",
                "output.bias")
WEIGHT_SHAPES = ((FEATURES, HIDDEN), (HIDDEN,), (HIDDEN, CLASSES), (CLASSES,))
LONG_CALL_S = 600  # a save or load may take as long as the file does
SYNC_EVERY = 16
BETA1, BETA2, EPS, MOMENTUM = 0.9, 0.999, 1e-7, 0.9
M64 = (1 << 64) - 1


def xorshift(s):
    s ^= (s << 13) & M64
    s ^= s >> 7
    s ^= (s << 17) & M64
    return s


def load_digits(path):
    """(x float32 [n, 64] scaled to [0, 1], y int32 [n]), as digits_load."""
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
    if rows.shape[1] != FEATURES + 1:
        raise ValueError("%s: expected %d comma-separated fields (64 pixels "
                         "and a label)" % (path, FEATURES + 1))
    return (rows[:, :FEATURES].astype(np.float32) / np.float32(16.0),
            rows[:, FEATURES].astype(np.int32))


def split(x, y, test_fraction, seed):
    """digits_split: a Fisher-Yates permutation with xorshift64, the first
    test_fraction of it for testing."""
    n = len(y)
    perm = list(range(n))
    s = seed if seed else 0x9E3779B97F4A7C15
    for i in range(n - 1, 0, -1):
        s = xorshift(s)
        j = s % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    n_test = int(test_fraction * n + 0.5)
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def shuffle(order, state):
    """One epoch's order of the training rows (train_digits.c: shuffle)."""
    for i in range(len(order) - 1, 0, -1):
        state = xorshift(state)
        j = state % (i + 1)
        order[i], order[j] = order[j], order[i]
    return state


class DataParallelMLP:
    """dp_mlp.c in Python: weights mirrored on the daemon, one step a batch
    sharded over the mesh, gradients all-reduced, the same update on every
    device."""

    def __init__(self, s, lr, optimizer, seed, mode="eager", fallback=False):
        self.s, self.lr, self.optimizer = s, lr, optimizer
        self.mode, self._fallback = mode, fallback
        self._step_fn = None
        self._scale = None
        self.n = s.num_devices
        self.steps = 0
        self.mark = None
        shapes = WEIGHT_SHAPES
        self.w, self.m1, self.m2 = [], [], []
        for i, shape in enumerate(shapes):
            if len(shape) == 2:
                # He-normal; per_device false: the same stream everywhere,
                # so the weights start mirrored.
                w = s.op("RandomNormal", shape=shape, dtype="float32",
                         seed=seed & (2 ** 63 - 1), seed2=i + 1,
                         stddev=math.sqrt(2.0 / shape[0]), per_device=False)
            else:
                w = self.fill(shape, 0.0)
            self.w.append(w)
            self.m1.append(self.fill(shape, 0.0))
            if optimizer == "adam":
                self.m2.append(self.fill(shape, 0.0))
        self.c_b1, self.c_1mb1 = self.scalar(BETA1), self.scalar(1 - BETA1)
        self.c_b2, self.c_1mb2 = self.scalar(BETA2), self.scalar(1 - BETA2)
        self.c_eps, self.c_mu = self.scalar(EPS), self.scalar(MOMENTUM)
        self.c_lr = self.scalar(lr)
        self.acc_loss, self.acc_correct = self.scalar(0), self.scalar(0)

    def fill(self, shape, v):
        return self.s.op("Fill", shape=shape, value=float(v), dtype="float32")

    def scalar(self, v):
        return self.fill((), v)

    def forward(self, x, w=None):
        op, w = self.s.op, w or self.w
        h = op("Relu", op("BiasAdd", op("MatMul", x, w[0]), w[1]))
        return op("BiasAdd", op("MatMul", h, w[2]), w[3])

    def count_correct(self, logits, y):
        op = self.s.op
        pred = op("ArgMax", logits, axis=1, output_type="int32")
        return op("Sum", op("Cast", op("Equal", pred, y), DstT="float32"))

    def step(self, bx, by):
        s, op = self.s, self.s.op
        rows = len(by)
        # Each device sums its rows' losses scaled by n / B, so that the
        # AllReduce(mean) of the gradients is the gradient of the batch's
        # mean loss whatever the split (dp_mlp.c explains).
        if self.mode == "function":
            # one upload: the rows, then each label as a float column
            xy = np.concatenate([bx, by[:, None].astype(np.float32)], 1)
            self.steps += 1
            return self._function_step(s.upload(xy, paradev.sharded(0)),
                                       self.loss_scale(rows))
        x = s.upload(bx, paradev.sharded(0))
        y = s.upload(by, paradev.sharded(0))
        self.steps += 1
        scale = self.loss_scale(rows)
        with s.tape(watch=self.w, watch_accessed=False) as tape:
            logits = self.forward(x)
            xent, _ = op("SparseSoftmaxCrossEntropyWithLogits", logits, y)
            loss_sum = op("Sum", xent)
            loss = op("Mul", loss_sum, scale)
        if self.steps % SYNC_EVERY == 0:
            if self.mark is not None:
                s.sync([self.mark])
            self.mark = loss
        g = tape.gradient(loss, self.w)
        gm = [op("AllReduce", gi, reduction="mean") for gi in g]
        self.acc_loss = op("Add", self.acc_loss, loss_sum)
        self.acc_correct = op("Add", self.acc_correct,
                              self.count_correct(logits, y))
        self.update(self.w, self.m1, self.m2, gm, self.lr_t())

    def loss_scale(self, rows):
        """n / B for a batch of `rows` rows, kept while the size is."""
        if self._scale is None or self._scale[0] != rows:
            self._scale = (rows, self.scalar(self.n / rows))
        return self._scale[1]

    def lr_t(self):
        """The step's learning rate: Adam's bias-corrected one."""
        if self.optimizer != "adam":
            return self.c_lr
        t = float(self.steps)
        return self.scalar(self.lr * math.sqrt(1 - BETA2 ** t) /
                           (1 - BETA1 ** t))

    def update(self, w, m1, m2, gm, lr):
        """The same update on every device, in place of the lists' items."""
        op = self.s.op
        for i in range(len(w)):
            if self.optimizer == "adam":
                m1[i] = op("Add", op("Mul", m1[i], self.c_b1),
                           op("Mul", gm[i], self.c_1mb1))
                m2[i] = op("Add", op("Mul", m2[i], self.c_b2),
                           op("Mul", op("Square", gm[i]), self.c_1mb2))
                den = op("Add", op("Sqrt", m2[i]), self.c_eps)
                w[i] = op("Sub", w[i], op("Mul", op("Div", m1[i], den), lr))
            else:
                m1[i] = op("Add", op("Mul", m1[i], self.c_mu), gm[i])
                w[i] = op("Sub", w[i], op("Mul", m1[i], lr))

    def check_mode(self):
        """In function mode, traces and registers the step now (with
        argument types alone); with fallback, a daemon without graph
        functions (Unimplemented) gets eager mode."""
        if self.mode != "function":
            return
        f32 = paradev.Spec("float32")
        specs = [f32, f32, f32] + [f32] * (
            len(self.w) + len(self.m1) + len(self.m2) + 2)
        self._step_fn = self.s.function(
            self._traced_step, input_signature=specs,
            name="train_digits_py_" + self.optimizer)
        try:
            self._step_fn.get_concrete()
        except paradev.Unimplemented as e:
            if not self._fallback:
                raise
            print("the daemon has no graph functions (%s): eager mode"
                  % e.message, flush=True)
            self.mode, self._step_fn = "eager", None

    def _function_step(self, xy, scale):
        """--mode function: the whole step -- forward, loss, gradients,
        AllReduce(mean), update -- is one graph function, traced on the
        first call (self.c_* are captured) and called once per step; its
        outputs replace the weights, the optimizer's state and the sums."""
        if self._step_fn is None:
            self._step_fn = self.s.function(
                self._traced_step, name="train_digits_py_" + self.optimizer)
        nw = len(self.w)
        out = self._step_fn(xy, scale, self.lr_t(), *self.w, *self.m1,
                            *self.m2, self.acc_loss, self.acc_correct)
        self.w, self.m1 = list(out[:nw]), list(out[nw:2 * nw])
        if self.optimizer == "adam":
            self.m2 = list(out[2 * nw:3 * nw])
        self.acc_loss, self.acc_correct, loss = out[-3:]
        if self.steps % SYNC_EVERY == 0:
            if self.mark is not None:
                self.s.sync([self.mark])
            self.mark = loss

    def _traced_step(self, xy, scale, lr, *state):
        """dp_mlp.c's step_function: x and y split off the packed batch,
        the gradients all-reduced as one joined vector."""
        op, nw = self.s.op, len(self.w)
        x = op("Slice", xy, begin=[0, 0], size=[-1, FEATURES])
        y = op("Cast", op("Reshape", op("Slice", xy, begin=[0, FEATURES],
                                        size=[-1, 1]), shape=[-1]),
               DstT="int32")
        w, m1 = list(state[:nw]), list(state[nw:2 * nw])
        m2 = list(state[2 * nw:3 * nw]) if self.optimizer == "adam" else []
        acc_loss, acc_correct = state[-2:]
        logits = self.forward(x, w)
        xent, _ = op("SparseSoftmaxCrossEntropyWithLogits", logits, y)
        loss_sum = op("Sum", xent)
        loss = op("Mul", loss_sum, scale)
        g = paradev.gradients(loss, w)
        sizes = [int(np.prod(sh)) for sh in WEIGHT_SHAPES]
        flat = op("Concat", [op("Reshape", gi, shape=[n])
                             for gi, n in zip(g, sizes)], axis=0)
        gall = op("AllReduce", flat, reduction="mean")
        offs = np.cumsum([0] + sizes)
        gm = [op("Reshape", op("Slice", gall, begin=[int(o)], size=[n]),
                 shape=list(sh))
              for o, n, sh in zip(offs, sizes, WEIGHT_SHAPES)]
        acc_loss = op("Add", acc_loss, loss_sum)
        acc_correct = op("Add", acc_correct, self.count_correct(logits, y))
        self.update(w, m1, m2, gm, lr)
        return (*w, *m1, *m2, acc_loss, acc_correct, loss)

    def epoch_end(self):
        op = self.s.op
        tl = op("AllReduce", self.acc_loss, reduction="sum")
        tc = op("AllReduce", self.acc_correct, reduction="sum")
        self.acc_loss, self.acc_correct = self.scalar(0), self.scalar(0)
        self.mark = None
        return (float(tl.numpy(paradev.mirrored())),
                float(tc.numpy(paradev.mirrored())))

    def evaluate(self, x, y):
        s = self.s
        correct = self.count_correct(
            self.forward(s.upload(x, paradev.sharded(0))),
            s.upload(y, paradev.sharded(0)))
        total = s.op("AllReduce", correct, reduction="sum")
        return float(total.numpy(paradev.mirrored()))

    def save(self, path):
        """dp_mlp_save: the weights mirrored, as safetensors beneath one of
        the daemon's storage roots (replacing an older file), with the
        model in the metadata; returns the tensor bytes written."""
        return self.s.save(
            path, [(n, w, paradev.mirrored())
                   for n, w in zip(WEIGHT_NAMES, self.w)],
            {"model": "paradev dp_mlp",
             "layers": "%d-%d-%d" % (FEATURES, HIDDEN, CLASSES)},
            overwrite=True, format="safetensors", timeout=LONG_CALL_S)

    def load(self, path):
        """dp_mlp_load: the weights of `path` (as save writes them), loaded
        mirrored by the daemon, become the model's; InvalidArgument when
        one is not float32 of the model's shape."""
        t = self.s.load(path, list(WEIGHT_NAMES), timeout=LONG_CALL_S)
        for name, shape in zip(WEIGHT_NAMES, WEIGHT_SHAPES):
            if t[name].dtype != np.float32 or t[name].shape != shape:
                raise paradev.InvalidArgument(
                    "%s: weight '%s' is not float32 [%s] as the model's"
                    % (path, name, ",".join(map(str, shape))))
        self.w = [t[name] for name in WEIGHT_NAMES]
        t.wait(timeout=LONG_CALL_S)

    def check_replicas(self):
        same, total = True, 0
        for w in self.w:
            comps = w.numpy(paradev.per_component())
            same &= all(c.tobytes() == comps[0].tobytes() for c in comps[1:])
            total += comps[0].nbytes
        return same, total


def busy_total(client):
    try:
        return sum(d.busy_seconds for d in client.info().devices)
    except paradev.Error:
        return -1.0


def plot(png, loss, acc, test_acc):
    """matplotlib when installed, else gnuplot; returns True when written."""
    epochs = list(range(1, len(loss) + 1))
    title = ("train_digits.py: 64-128-10 MLP, data-parallel on paradevd "
             "(test accuracy %.2f%%)" % (100 * test_acc))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt is not None:
        fig, ax = plt.subplots(figsize=(9, 5))
        ax.plot(epochs, loss, "o-", label="loss")
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss (mean cross-entropy)")
        ax2 = ax.twinx()
        ax2.plot(epochs, [100 * a for a in acc], "s-", color="tab:orange",
                 label="train accuracy")
        ax2.set_ylabel("train accuracy (%)")
        ax.set_title(title)
        ax.grid(True)
        fig.legend(loc="center right")
        fig.savefig(png)
        return True
    if shutil.which("gnuplot") is None:
        print("train_digits: neither matplotlib nor gnuplot found, no plot "
              "written (pip install matplotlib, or apt-get install "
              "gnuplot-nox)", file=sys.stderr)
        return False
    with tempfile.TemporaryDirectory(prefix="train-digits-") as d:
        dat = os.path.join(d, "epochs.dat")
        with open(dat, "w") as f:
            for e, (l, a) in enumerate(zip(loss, acc)):
                f.write("%d %.6f %.4f\n" % (e + 1, l, 100 * a))
        script = (
            "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
            "  set terminal pngcairo size 900,500 noenhanced\n"
            "} else {\n  set terminal png size 900,500 noenhanced\n}\n"
            "set output '%s'\nset title '%s'\nset xlabel 'epoch'\n"
            "set ylabel 'loss (mean cross-entropy)'\n"
            "set y2label 'train accuracy (%%)'\n"
            "set ytics nomirror\nset y2tics\nset grid\nset key center right\n"
            "set xrange [0.5:%d.5]\nset yrange [0:*]\nset y2range [*:100]\n"
            "plot '%s' using 1:2 axes x1y1 with linespoints title 'loss', "
            "'%s' using 1:3 axes x1y2 with linespoints title 'train "
            "accuracy'\n" % (png.replace("'", "''"), title, len(loss), dat,
                             dat))
        r = subprocess.run(["gnuplot"], input=script, text=True)
        if r.returncode != 0:
            print("train_digits: gnuplot failed; no plot written",
                  file=sys.stderr)
            return False
    return True


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="train_digits.py",
        description="Train a 64-128-10 perceptron on the digits set, "
        "data-parallel on the devices of a paradevd daemon.")
    ap.add_argument("--target", default=None,
                    help="the daemon: unix:/path or host:port (default: "
                    "$PARADEV_TARGET, else as the paradev command finds it)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0)
    ap.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    ap.add_argument("--mode", choices=["eager", "function"], default=None,
                    help="eager: every op of a step is its own stream item; "
                    "function: the whole step is one traced graph function "
                    "called once per step (the default; eager on a daemon "
                    "without graph functions unless --mode says function)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--plot", metavar="FILE.png")
    ap.add_argument("--data", default=os.path.join(HERE, "data",
                                                   "digits.csv.gz"))
    ap.add_argument("--min-accuracy", type=float, default=None)
    ap.add_argument("--save", metavar="PATH",
                    help="at the end, have the daemon save the weights as a "
                    "safetensors file at PATH beneath one of its storage "
                    "roots (replacing an older one)")
    ap.add_argument("--evaluate", metavar="PATH",
                    help="train nothing: load the weights of PATH (as --save "
                    "writes them, or the C trainer's) on the daemon and "
                    "report their test accuracy in a fresh session (give the "
                    "same --seed: it chooses the test images; --epochs, "
                    "--batch and --plot are then ignored)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if not 1 <= a.epochs <= 100000:
        ap.error("--epochs %d: expected 1 to 100000" % a.epochs)
    if not 1 <= a.batch <= 1000000:
        ap.error("--batch %d: expected 1 to 1000000" % a.batch)
    if a.lr < 0 or not math.isfinite(a.lr):
        ap.error("--lr: expected a positive number")
    if a.seed < 0:
        ap.error("--seed: expected a non-negative integer")
    if a.save and a.evaluate:
        ap.error("--save and --evaluate: one or the other")
    if a.lr == 0:
        a.lr = 0.003 if a.optimizer == "adam" else 0.05
    return a


def main(argv=None):
    o = parse_args(argv)
    try:
        x, y = load_digits(o.data)
    except (OSError, ValueError) as e:
        print("train_digits: %s" % e, file=sys.stderr)
        return 1
    trx, try_, tex, tey = split(x, y, 0.2, o.seed)
    try:
        return train(o, trx, try_, tex, tey)
    except paradev.Error as e:
        print("train_digits: %s: %s" % (e.code_name, e.message),
              file=sys.stderr)
        if isinstance(e, paradev.Unavailable) and e.hint:
            print("train_digits: %s" % e.hint, file=sys.stderr)
        return 1


def train(o, trx, try_, tex, tey):
    target = o.target or paradev.default_target()
    with paradev.connect(target, user_agent="train_digits.py") as client, \
            client.session("train_digits.py", pipelined=True) as s:
        n = s.num_devices
        if o.evaluate:
            print("train_digits: %d test images, MLP 64-128-10 with the "
                  "weights of %s, over %d device%s of %s" %
                  (len(tey), o.evaluate, n, "" if n == 1 else "s", target),
                  flush=True)
        else:
            print("train_digits: %d train / %d test images, MLP 64-128-10, "
                  "batch %d sharded over %d device%s of %s, %s lr %g, %d "
                  "epochs" % (len(try_), len(tey), o.batch, n,
                              "" if n == 1 else "s", target, o.optimizer,
                              o.lr, o.epochs), flush=True)
        m = DataParallelMLP(s, o.lr, o.optimizer, o.seed,
                            "eager" if o.evaluate else o.mode or "function",
                            fallback=o.mode is None)
        if not o.evaluate:
            m.check_mode()
            print("mode: %s" % ("function (one call per step)"
                                if m.mode == "function" else
                                "eager (one stream item per op)"), flush=True)
        if o.evaluate:
            t0 = time.monotonic()
            m.load(o.evaluate)
            print("weights loaded by the daemon from %s in %.3f s"
                  % (o.evaluate, time.monotonic() - t0), flush=True)
            o.epochs = 0
        order = list(range(len(try_)))
        rng = (o.seed * 0x9E3779B97F4A7C15 + 1) & M64
        losses, accs = [], []
        busy0, t_train, steps0 = busy_total(client), 0.0, 0
        for e in range(o.epochs):
            t0 = time.monotonic()
            rng = shuffle(order, rng)
            idx = np.array(order)
            for b in range(0, len(order), o.batch):
                rows = idx[b:b + o.batch]
                m.step(trx[rows], try_[rows])
            loss_sum, correct = m.epoch_end()
            dt = time.monotonic() - t0
            t_train += dt
            steps, steps0 = m.steps - steps0, m.steps
            losses.append(loss_sum / len(try_))
            accs.append(correct / len(try_))
            if not o.quiet:
                print("epoch %2d/%d  loss %.4f  train accuracy %6.2f%%  "
                      "%7.1f steps/s" % (e + 1, o.epochs, losses[-1],
                                         100 * accs[-1], steps / dt),
                      flush=True)
        busy1 = busy_total(client)
        if o.save:
            saved = m.save(o.save)
            print("weights saved by the daemon to %s (%d bytes of tensors)"
                  % (o.save, saved), flush=True)
        test_correct = m.evaluate(tex, tey)
        test_acc = test_correct / len(tey)
        print("test accuracy %.2f%% (%d of %d images)" %
              (100 * test_acc, int(test_correct), len(tey)))
        same, wbytes = m.check_replicas()
        if same:
            print("weights bitwise identical on all %d device%s (%d bytes "
                  "per replica)" % (n, "" if n == 1 else "s", wbytes))
        else:
            print("weights DIFFER between devices")
        if not o.evaluate and busy0 >= 0 and busy1 >= 0 and t_train > 0:
            share = (busy1 - busy0) / n / t_train
            print("%d steps in %.2f s: the devices were busy %.0f%% of the "
                  "time (the daemon's timers), the rest went to RPC, "
                  "queueing and Python" % (m.steps, t_train, 100 * share))
        if o.plot and not o.evaluate and plot(o.plot, losses, accs, test_acc):
            print("plot written to %s" % o.plot)
    rc = 0 if same else 1
    if o.min_accuracy is not None and 100 * test_acc < o.min_accuracy:
        print("train_digits: test accuracy %.2f%% is below %.2f%%" %
              (100 * test_acc, o.min_accuracy), file=sys.stderr)
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
