"""The step breakdown (bench/run.py's group "breakdown"): where a pytfm training step's time goes.

Whole steps are timed as the train group times them (common.pytfm_step), and each is paired
with an instrumented step (which one runs first alternates). While an instrumented step runs,
every reference a pytfm module holds to the cffi library object is swapped for a proxy whose
functions add each call's wall time (the C function and cffi's call into it) to a total per C
function name: pytfm_linear_forward, pytfm_adamw_step, ... Nothing here names a kernel: one
that pytfm calls tomorrow is counted tomorrow. The public functions of pytfm.ops are wrapped
the same way, to tell the time they spend around their kernel (argument checks, allocating
outputs, cffi pointers) from the rest; and the other pytfm modules' (nn.py's, optim.py's) name
for NumPy is swapped for a proxy that times their np.* calls (np.stack, np.vdot, ...). NumPy
itself is left alone: array operators and methods (x + y, g *= s, g.fill) stay in "the rest",
with the Python around them.

"Outside the kernels" is taken within each instrumented step: its time less its kernels' and
less the wrappers' own cost (their calls times a cost per call calibrated in the same process,
about 1 us). Taking it within one step keeps the machine's noise out of it: the plain step less
the kernels of another step differs by a few percent from pair to pair on a busy machine, which
is as much as the whole of the tiny step's outside time. The plain steps give the step time
printed; the instrumented steps' excess over their pairs is printed as the overhead measured,
beside the calibrated one.

The worker prints these figures per config, each a median over pairs, per step (bench/run.py
takes the median over rounds of each and makes the tables with tables(), show() prints them):
    breakdown/CONFIG/step               seconds, plain step
    breakdown/CONFIG/instrumented       seconds, instrumented step
    breakdown/CONFIG/overhead           seconds the instrumented step took more than its pair
    breakdown/CONFIG/wrappers           seconds of the wrappers' own calibrated cost
    breakdown/CONFIG/net                seconds, instrumented step less the wrappers' cost
    breakdown/CONFIG/outside            seconds of that outside the kernels
    breakdown/CONFIG/ops                seconds in pytfm.ops functions outside their kernels
                                        (less the kernel wrappers' cost)
    breakdown/CONFIG/kernel/NAME        seconds in the C function NAME
    breakdown/CONFIG/calls/NAME         calls of NAME (a count, not seconds)
    breakdown/CONFIG/numpy/NAME         seconds in np.NAME called by pytfm modules but ops
    breakdown/CONFIG/share/FIGURE       FIGURE (outside, ops, kernel/NAME, numpy/NAME) over net,
                                        in each pair (a median of shares is steadier than a
                                        share of medians when the machine's load comes and goes)
"""

import contextlib
import functools
import inspect
import math
import statistics
import sys
import time
import types

import numpy as np
from common import pytfm_step, train_model

OUTSIDE_TARGET = 0.10  # the target: time outside the kernels <= 10 % of the tiny step


class Clock:
    """Counts, while installed (`with clock:`), the time of every C call pytfm makes, the time
    pytfm.ops functions spend around them, and the np.* calls of the other pytfm modules."""

    def __init__(self):
        self.seconds, self.calls = {}, {}  # C function name -> total seconds, calls
        self.in_kernels = 0.0  # the sum of self.seconds, kept running for the ops wrappers
        self.in_ops = 0.0  # seconds inside pytfm.ops functions, less their kernels
        self.numpy = {}  # np.NAME -> seconds, called outside pytfm.ops
        self.wrapped_calls = 0  # calls of the ops and NumPy wrappers, whose cost is calibrated
        self.calls_in_ops = 0  # kernel calls inside ops functions: their wrappers' cost is there
        self._depth = 0  # an ops function called by another is the caller's time
        self._proxy = self._np = None
        self._ops = {}  # original ops function -> its timed wrapper, made once
        self._swapped = []  # (module, attribute, original value) to put back

    def reset(self):
        self.seconds.clear()
        self.calls.clear()
        self.numpy.clear()
        self.in_kernels = self.in_ops = 0.0
        self.wrapped_calls = self.calls_in_ops = 0

    def kernel(self, name, f):
        """f, a cffi function, timed into self.seconds[name]."""
        seconds, calls, clock = self.seconds, self.calls, time.perf_counter

        def timed(*args):
            t0 = clock()
            status = f(*args)
            t = clock() - t0
            seconds[name] = seconds.get(name, 0.0) + t
            calls[name] = calls.get(name, 0) + 1
            self.in_kernels += t
            self.calls_in_ops += self._depth
            return status

        return timed

    def op(self, f):
        """f, a pytfm.ops function, whose time less its kernels' goes to self.in_ops."""
        clock = time.perf_counter

        @functools.wraps(f)
        def timed(*args, **kwargs):
            self.wrapped_calls += 1
            if self._depth:
                return f(*args, **kwargs)
            self._depth = 1
            k0, t0 = self.in_kernels, clock()
            try:
                return f(*args, **kwargs)
            finally:
                self.in_ops += clock() - t0 - (self.in_kernels - k0)
                self._depth = 0

        return timed

    def numpy_call(self, name, f):
        """f, a NumPy function, timed into self.numpy[name] unless an ops function calls it
        (that time is the op's own)."""
        numpy, clock = self.numpy, time.perf_counter

        def timed(*args, **kwargs):
            self.wrapped_calls += 1
            if self._depth:
                return f(*args, **kwargs)
            t0 = clock()
            try:
                return f(*args, **kwargs)
            finally:
                numpy[name] = numpy.get(name, 0.0) + clock() - t0

        return timed

    def __enter__(self):
        from pytfm import _arrays, _core, ops

        if self._proxy is None:
            self._proxy = _TimedLib(_core.lib, self)
            self._np = _TimedNumPy(self)
            for name, f in vars(ops).items():
                if inspect.isfunction(f) and f.__module__ == ops.__name__ and name[0] != "_":
                    self._ops[f] = self.op(f)
        swaps = {id(_core.lib): self._proxy} | {id(f): w for f, w in self._ops.items()}
        # every pytfm module's name for the library or an op, whatever it calls it
        for mod_name, mod in list(sys.modules.items()):
            if mod is None or mod_name.split(".")[0] != "pytfm":
                continue
            for attr, value in list(vars(mod).items()):
                if id(value) in swaps:  # the originals live on: an equal id is the object
                    self._swapped.append((mod, attr, value))
                    setattr(mod, attr, swaps[id(value)])
                elif value is np and mod not in (ops, _arrays):  # ops' time is its own
                    self._swapped.append((mod, attr, value))
                    setattr(mod, attr, self._np)
        return self

    def __exit__(self, *exc):
        while self._swapped:
            mod, attr, value = self._swapped.pop()
            setattr(mod, attr, value)


class _TimedLib:
    """The cffi library object, with each of its functions timed by a Clock. What it hands out
    is kept as an attribute, so that each name costs __getattr__ once."""

    def __init__(self, lib, clock):
        self._lib, self._clock = lib, clock

    def __getattr__(self, name):
        value = getattr(self._lib, name)
        if callable(value):
            value = self._clock.kernel(name, value)
        setattr(self, name, value)
        return value


class _TimedNumPy:
    """The numpy module, its functions timed by a Clock; types and modules (np.float32,
    np.random) as they are, a ufunc's methods (np.add.reduce) untimed."""

    def __init__(self, clock):
        self._clock = clock

    def __getattr__(self, name):
        value = getattr(np, name)
        if isinstance(value, np.ufunc):
            value = _TimedUfunc(value, self._clock.numpy_call(name, value))
        elif callable(value) and not isinstance(value, (type, types.ModuleType)):
            value = self._clock.numpy_call(name, value)
        setattr(self, name, value)
        return value


class _TimedUfunc:
    def __init__(self, ufunc, timed):
        self._ufunc, self._timed = ufunc, timed

    def __call__(self, *args, **kwargs):
        return self._timed(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._ufunc, name)


def calibrate(clock, n=20000):
    """(seconds a kernel wrapper adds to a call, seconds an ops or NumPy wrapper adds): the
    best of 3 timings of n calls of a C function that returns at once (and of a Python one),
    wrapped against bare."""
    from pytfm._core import lib

    def per_call(f):
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            best = min(best, (time.perf_counter() - t0) / n)
        return best

    def nothing():
        return None

    c = lib.pytfm_get_num_threads
    kernel = per_call(clock.kernel("calibration", c)) - per_call(c)
    python = per_call(clock.op(nothing)) - per_call(nothing)
    clock.reset()
    return max(kernel, 0.0), max(python, 0.0)


def measure(step, budget=3.0, min_pairs=3):
    """{figure: value per step} of step() (see the module's docstring), each the median over
    pairs of steps, one plain and one instrumented (which one first alternates), after one
    warm-up step of each kind, until there are min_pairs pairs and they took `budget` s."""
    clock = Clock()
    cost_kernel, cost_python = calibrate(clock)
    step()
    with clock:
        step()
    pairs, t_start = [], time.perf_counter()
    while len(pairs) < min_pairs or time.perf_counter() - t_start < budget:
        clock.reset()
        took = {}
        for instrumented in (False, True) if len(pairs) % 2 == 0 else (True, False):
            with clock if instrumented else contextlib.nullcontext():
                t0 = time.perf_counter()
                step()
                took[instrumented] = time.perf_counter() - t0
        p, q = took[False], took[True]
        wrappers = sum(clock.calls.values()) * cost_kernel + clock.wrapped_calls * cost_python
        net = q - wrappers
        spent = {
            "outside": net - clock.in_kernels,
            "ops": clock.in_ops - clock.calls_in_ops * cost_kernel,
            **{f"kernel/{k}": v for k, v in clock.seconds.items()},
            **{f"numpy/{k}": v for k, v in clock.numpy.items()},
        }
        pairs.append({
            "step": p,
            "instrumented": q,
            "overhead": q - p,
            "wrappers": wrappers,
            "net": net,
            **spent,
            **{f"share/{k}": v / net for k, v in spent.items()},
            **{f"calls/{k}": v for k, v in clock.calls.items()},
        })
    names = {name for pair in pairs for name in pair}
    return {name: statistics.median(pair.get(name, 0) for pair in pairs) for name in names}


def label(config):
    name, _, _, _, T, B = config
    return f"{name} ({B}x{T} tokens)"


def figures(configs):
    """The worker's figures, {"breakdown/CONFIG/FIGURE": value}, for each of configs (rows of
    worker.TRAIN: name, d_model, n_layer, n_head, context, batch)."""
    out = {}
    for config in configs:
        step = pytfm_step(*train_model(*config[1:]))
        for figure, value in measure(step).items():
            out[f"breakdown/{label(config)}/{figure}"] = value
    return out


def tables(times, configs):
    """One table per config and thread count, from bench/run.py's {(threads, lib, case):
    [value per round]}. Each share is the median over rounds of the worker's median over pairs
    of steps of a figure's share of the instrumented step less the wrappers' cost ("net", the
    step in which the kernels and what lies outside them were measured); "ms" is that share of
    the median net step, so that the two columns agree, and "measured_ms" the median of the
    figure's own time. Being medians, the shares add up to 100 % only nearly."""
    med = {}
    for (threads, lib, case), values in times.items():
        if lib == "pytfm" and case.startswith("breakdown/"):
            med[threads, case[len("breakdown/"):]] = statistics.median(values)
    out = []
    for threads in sorted({t for t, _ in med}):
        for config in configs:
            c = label(config)
            if (threads, f"{c}/step") not in med:
                continue

            net = med[threads, f"{c}/net"]

            def row(figure, c=c, threads=threads, net=net):
                share = med[threads, f"{c}/share/{figure}"]
                return {"ms": share * net * 1e3, "share": share,
                        "measured_ms": med[threads, f"{c}/{figure}"] * 1e3}

            def named(kind, c=c, threads=threads):
                prefix = f"{c}/{kind}/"
                names = [case[len(prefix):] for t, case in med if t == threads and
                         case.startswith(prefix)]
                rows = [{"name": name, **row(f"{kind}/{name}")} for name in names]
                return sorted(rows, key=lambda r: -r["share"])

            kernels = named("kernel")
            for k in kernels:
                k["calls"] = med[threads, f"{c}/calls/{k['name']}"]
            numpy = named("numpy")
            outside, ops = row("outside"), row("ops")
            table = {
                "config": c,
                "threads": threads,
                "step_ms": med[threads, f"{c}/step"] * 1e3,
                "instrumented_ms": med[threads, f"{c}/instrumented"] * 1e3,
                "overhead_ms": med[threads, f"{c}/overhead"] * 1e3,
                "wrappers_ms": med[threads, f"{c}/wrappers"] * 1e3,
                "net_ms": net * 1e3,
                "kernels": kernels,
                "kernels_sum": {key: sum(k[key] for k in kernels)
                                for key in ("ms", "share", "measured_ms")},
                "outside": outside,
                "ops": ops,
                "numpy": numpy,
                "rest": {key: outside[key] - ops[key] - sum(n[key] for n in numpy)
                         for key in ("ms", "share", "measured_ms")},
            }
            if config[0] == "tiny":
                table["target"] = OUTSIDE_TARGET
                table["ok"] = outside["share"] <= OUTSIDE_TARGET
            out.append(table)
    return out


def show(tables, file=sys.stdout):
    """Print tables() as text: the kernels by share, then what lies outside them."""
    for t in tables:
        threads = f"{t['threads']} thread{'s' if t['threads'] > 1 else ''}"
        print(f"\nstep breakdown: {t['config']}, {threads}: step {t['step_ms']:.2f} ms "
              "(plain steps)", file=file)
        print(f"  instrumented steps: {t['instrumented_ms']:.2f} ms, {t['overhead_ms']:+.2f} ms "
              f"against their plain pairs; the wrappers' calibrated cost {t['wrappers_ms']:.2f} "
              "ms", file=file)
        head = f"  {'kernel (op direction)':48s} {'calls':>6s} {'ms/step':>9s} {'%':>6s}"
        print(head, file=file)
        print("  " + "-" * (len(head) - 2), file=file)
        for k in t["kernels"]:
            print(f"  {k['name']:48s} {k['calls']:6.0f} {k['ms']:9.3f} {k['share']:6.1%}",
                  file=file)
        rows = [
            ("the kernels (sum)", t["kernels_sum"]),
            ("outside the kernels", t["outside"]),
            ("  in pytfm.ops around the kernels (checks, outputs)", t["ops"]),
        ]
        rows += [(f"  np.{n['name']} called by nn.py, optim.py, ...", n) for n in t["numpy"]]
        rows += [
            ("  the rest (Python; NumPy operators, methods)", t["rest"]),
            ("total (instrumented step less the wrappers' cost)",
             {"ms": t["net_ms"], "share": 1.0}),
        ]
        for name, r in rows:
            print(f"  {name:55s} {r['ms']:9.3f} {r['share']:6.1%}", file=file)
        if "target" in t:
            print(
                f"  target: outside the kernels <= {t['target']:.0%} of the tiny step: "
                f"{t['outside']['share']:.1%} {'ok' if t['ok'] else 'MISS'}",
                file=file,
            )
