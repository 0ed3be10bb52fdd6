"""pytfm.train_step — the training step of a GPT on the GPU with nothing allocated in it.

TrainStep(model, opt, max_norm) runs pytfm.nn.GPT's loop (zero_grad, forward, backward, the
gradient clip, AdamW's step) with the loop's bits, on a stream of its own: the first call records
the arrays every op makes (a Plan, pytfm._arrays) and the scratch the kernels ask for, later
calls take them again from that plan and a workspace bound to the stream, and from the third on
the whole step replays as one CUDA graph. The step's stream is ordered with the caller's (the
stream current at the call) by two events: its work starts after what the caller queued before
the call, and the caller's later work after the step. docs/cuda.md tells the design and its
figures.
"""

import math

import numpy as np

from . import _arrays, _core, ops
from . import device as devices
from ._arrays import as_bool, as_float, check_index_arrays, is_cupy


class TrainStep:
    """The training step of a model on the GPU with no allocation and no host work inside it:
    zero_grad, forward, backward, the gradient clip and AdamW's step, on a stream of its own.

        step = TrainStep(model, opt, max_norm=1.0)  # model on "cuda", opt = AdamW(model.params,
        loss = step(x, y, lr)                       #   model.grads); x, y int64 (B, T), host or GPU

    Each call gives the bits of the loop it replaces, model.zero_grad(); _, loss =
    model.forward(x, y); model.backward(); clip_grad_norm(model.grads, max_norm) (None: no
    clip); opt.step(lr) (lr None: opt.lr): the same loss, parameters and moments.

    The first call runs the step as that loop does, recording what it allocates: the arrays of
    every op (activations, their gradients, outputs: a Plan, pytfm._arrays) and the most scratch
    one kernel asks for; then it allocates a workspace of that size and binds it to the stream
    (pytfm_cuda_workspace_set), so that later calls allocate nothing: each takes the same arrays
    again, in the same order, and the kernels' scratch comes from the workspace. The second call
    runs so, eagerly (every op from Python, but nothing allocated and neither the device nor the
    stream looked up per op). The third captures the whole step as a CUDA graph, when graph is
    True and CuPy can capture one (graph_error says why not otherwise), and every later call
    replays it: one launch, after copying the batch and this step's AdamW scalars (lr and t:
    pytfm_adamw_step_scalars_cuda reads them from device memory) to the device. A batch of
    another shape starts over with a new plan. .mode says how the last call ran: "record",
    "replay" or "graph".

    The step runs on a stream of its own (.stream, non-blocking: it does not synchronise with
    the legacy default stream by itself), in order with the caller's stream, the one current
    when the step is called: each call records an event on the caller's stream that the step's
    stream waits on before its first copy (so a batch, or parameters, the caller made on the
    GPU are complete), and at its end an event on the step's stream that the caller's stream
    waits on (so the loss, .norm, the parameters and the moments may be read there, or by the
    host through it, float(loss), with no synchronisation of the step's stream). Neither waits
    on the host. Every array of the step is made on its stream.

    The ids are checked on the host when they come from there (numpy arrays); ids on the GPU are
    checked with one read of the device unless check_ids=False. Nothing else is read back: the
    loss returned is a 0-d float32 device array, one of `keep` slots the calls fill in turn
    (read it, float(loss), before `keep` more calls); .norm is the last clip's norm (a 0-d
    float64 device array; None without max_norm). The plan keeps every array of a step alive at
    once, where the loop's temporaries come and go: about twice the loop's memory.
    """

    def __init__(self, model, opt, max_norm=None, *, graph=True, keep=1024, check_ids=True):
        from .optim import AdamW

        if getattr(model, "device", None) != "cuda":
            raise ValueError("model must be a GPT on the GPU (GPT(cfg, device='cuda')), got one "
                             f"on {getattr(model, 'device', type(model).__name__)!r}")
        if not isinstance(opt, AdamW) or opt.params is not model.params or opt.spans is None:
            raise ValueError("opt must be AdamW(model.params, model.grads), made after the model "
                             "moved to the GPU")
        if max_norm is not None and not as_float("max_norm", max_norm, "float64") >= 0:
            raise ValueError(f"max_norm must be >= 0 (inf: no clipping), got {max_norm}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        self.model, self.opt, self.keep = model, opt, keep
        self.max_norm = None if max_norm is None else float(max_norm)
        self.check_ids = as_bool("check_ids", check_ids)
        self.graph_error = None if as_bool("graph", graph) else "graph=False"
        xp = self.xp = devices.array_module("cuda")
        self.stream = xp.cuda.Stream(non_blocking=True)
        # the caller's work before a call (the step's stream waits on it), the step's after
        self._caller_done = xp.cuda.Event(disable_timing=True)
        self._step_done = xp.cuda.Event(disable_timing=True)
        self.calls, self.mode, self.norm = 0, None, None
        self._scalars_host = np.zeros(16, np.float32)
        self._shape = None
        with self.stream:  # made (zeroed) on the step's stream, which alone writes them
            self.losses = xp.zeros(keep, np.float32)  # the loss of each call, in turn
            # AdamW's eight scalars for the matrices (weight decay) and the vectors (none)
            self._scalars = xp.zeros(16, np.float32)
            # the clip's values: sqrt(Σ g²), max_norm / (norm + 1e-6), norm > max_norm, scale
            self._norm, self._quot = xp.zeros((), np.float64), xp.zeros((), np.float64)
            self._over, self._scale64 = xp.zeros((), np.bool_), xp.zeros((), np.float64)
            self._scale = xp.zeros((), np.float32)

    def __del__(self):
        try:
            self._release()
        except Exception:  # at interpreter exit the library may be gone already
            pass

    # -- a batch of a new shape: its inputs, its plan, a binding that measures its scratch --------

    def _start(self, shape):
        self._release()
        xp = self.xp
        with self.stream:
            self._x, self._y = xp.zeros(shape, np.int64), xp.zeros(shape, np.int64)
        self._plan, self._graph, self._workspace, self._runs = _arrays.Plan(), None, None, 0
        _core.check(_core.lib.pytfm_cuda_workspace_set(self._stream_ptr(), _core.ffi.NULL, 0))
        self._shape = shape

    def _release(self):
        if self._shape is not None:
            self._shape = self._graph = self._plan = None
            _core.check(_core.lib.pytfm_cuda_workspace_clear(self._stream_ptr()))

    def _stream_ptr(self):
        return _core.ffi.cast("void *", self.stream.ptr)

    def workspace(self):
        """(bytes bound, most scratch one call asked for, calls it could not hold) of the
        stream's workspace (pytfm_cuda_workspace_get)."""
        got = _core.ffi.new("int64_t[3]")
        _core.check(_core.lib.pytfm_cuda_workspace_get(self._stream_ptr(), got, got + 1,
                                                       got + 2))
        return got[0], got[1], got[2]

    def _bind_workspace(self):
        """A workspace of the most scratch the recorded run asked for, bound to the stream."""
        _, need, _ = self.workspace()
        with self.stream:
            self._workspace = self.xp.empty(max(need, 256), np.uint8)
        _core.check(_core.lib.pytfm_cuda_workspace_set(
            self._stream_ptr(), _core.ffi.cast("void *", self._workspace.data.ptr),
            self._workspace.size))

    # -- one call ------------------------------------------------------------------------------

    def __call__(self, x, y, lr=None):
        opt = self.opt
        lr = opt.lr if lr is None else as_float("lr", lr, "float64")
        if not 0 <= lr < math.inf:
            raise ValueError(f"lr must be finite and >= 0, got {lr}")
        if getattr(opt.params, "stale", False):
            raise RuntimeError("the model was moved (GPT.to) after this optimizer was made: make "
                               "the optimizer, and the TrainStep, after moving")
        shape = self._inputs(x, y)
        caller = self.xp.cuda.get_current_stream()
        self._caller_done.record(caller)
        self.stream.wait_event(self._caller_done)
        try:
            loss = self._step(shape, x, y, lr)
        finally:  # whatever the step queued, the caller's later work comes after it
            self._step_done.record(self.stream)
            caller.wait_event(self._step_done)
        return loss

    def _step(self, shape, x, y, lr):
        opt = self.opt
        if shape != self._shape:
            self._start(shape)
        self._copy_in(self._x, x)
        self._copy_in(self._y, y)
        opt.t += 1
        self._adamw_scalars(lr)
        if self._runs == 0:
            self.mode = "record"
            self._run()
            self._bind_workspace()
        elif self._runs == 1 or (self._graph is None and self.graph_error is not None):
            self.mode = "replay"
            self._run()
            if self._runs == 1:
                self._check_workspace()
        elif self._graph is None:
            self._capture()  # runs the step: captured and launched, or eagerly if it fails
        else:
            self.mode = "graph"
            self._graph.launch(stream=self.stream)
        self._runs += 1
        slot = self.calls % self.keep
        self.calls += 1
        with self.stream:
            self.xp.copyto(self.losses[slot:slot + 1], self._loss.reshape(1))
        return self.losses[slot]

    def _inputs(self, x, y):
        """The batch's shape, once x and y are int64 (B, T) of one shape, on the host or the
        GPU, and their ids in range (checked on the host; on the GPU unless check_ids=False)."""
        shape = None
        for name, a in (("x", x), ("y", y)):
            if not (is_cupy(a) or isinstance(a, np.ndarray)) or a.dtype != np.int64 or \
                    a.ndim != 2:
                raise TypeError(f"{name} must be an int64 array of shape (B, T) (numpy or cupy), "
                                f"got {type(a).__name__} {getattr(a, 'dtype', '')} of shape "
                                f"{getattr(a, 'shape', '?')}")
            if shape is not None and a.shape != shape:
                raise ValueError(f"y must have x's shape {shape}, got {a.shape}")
            shape = a.shape
        if shape[1] > self.model.cfg.max_seq:
            raise ValueError(f"sequence of {shape[1]} tokens is longer than max_seq = "
                             f"{self.model.cfg.max_seq}")
        if not (is_cupy(x) or is_cupy(y)) or self.check_ids:
            vocab = self.model.cfg.vocab
            check_index_arrays(("idx", x, vocab, None), ("targets", y, vocab, -1))
        return shape

    def _copy_in(self, dst, src):
        """src into the step's input dst, queued on its stream: from the host by an
        asynchronous copy (from pageable memory: staged before it returns), else on the GPU
        (after the caller's work: __call__ made the stream wait on it)."""
        if not is_cupy(src):
            dst.set(np.ascontiguousarray(src), stream=self.stream)
        else:
            with self.stream:
                self.xp.copyto(dst, src)

    def _adamw_scalars(self, lr):
        """This step's AdamW scalars, matrices (weight decay) then vectors, to the device."""
        opt, host = self.opt, self._scalars_host
        for i, wd in enumerate((opt.weight_decay, 0.0)):
            out = _core.ffi.cast("float *", host.ctypes.data + 32 * i)
            _core.check(_core.lib.pytfm_cuda_adamw_scalars(out, opt.t, lr, opt.betas[0],
                                                           opt.betas[1], opt.eps, wd))
        self._scalars.set(host, stream=self.stream)

    def _run(self):
        """The step, eagerly, from Python: recording the plan (first run), or taking its arrays."""
        with _arrays.on_stream(self.xp, self.stream, self._plan):
            self._plan.start()
            self._body()
            self._plan.finish()

    def _body(self):
        model, opt = self.model, self.opt
        model.zero_grad()
        _, self._loss = model.forward(self._x, self._y, check_ids=False)
        model.backward()
        if self.max_norm is not None:
            self.norm = self._clip(model.grads.buffer)
        flat = (opt.params.buffer, opt.grads.buffer, opt.m.buffer, opt.v.buffer)
        for k, (lo, hi) in enumerate(opt.spans):
            if hi > lo:
                _adamw_step_scalars(*(a[lo:hi] for a in flat), self._scalars[8 * k:8 * k + 8])

    def _clip(self, g):
        """clip_grad_norm on the flat buffer g, with its bits and without an allocation: norm =
        sqrt(Σ g²) in double; scale = max_norm / (norm + 1e-6) rounded to float32 when norm >
        max_norm, else 1 (for a NaN norm too); g *= scale. -> norm"""
        xp, norm = self.xp, self._norm
        xp.sqrt(ops.sum_squares(g), out=norm)
        if self.max_norm == math.inf:
            return norm
        xp.add(norm, 1e-6, out=self._quot)
        xp.divide(self.max_norm, self._quot, out=self._quot)
        xp.greater(norm, self.max_norm, out=self._over)
        self._scale64.fill(1.0)
        xp.copyto(self._scale64, self._quot, where=self._over)
        xp.copyto(self._scale, self._scale64, casting="same_kind")
        xp.multiply(g, self._scale, out=g)
        return norm

    def _check_workspace(self):
        bound, need, misses = self.workspace()
        if misses:
            raise RuntimeError(f"a kernel asked for more scratch ({need} bytes) than the step's "
                               f"first run ({bound}): the step is not the same on every run")

    def _capture(self):
        """Capture the step as a CUDA graph on the stream and launch it; where that fails, say
        why (graph_error) and run it eagerly."""
        if not hasattr(self.stream, "begin_capture"):
            self.graph_error = "this CuPy cannot capture a CUDA graph (no Stream.begin_capture)"
        else:
            try:
                with _arrays.on_stream(self.xp, self.stream, self._plan):
                    self.stream.begin_capture()
                    try:
                        self._plan.start()
                        self._body()
                        self._plan.finish()
                    finally:
                        graph = self.stream.end_capture()
                self._graph = graph
            except Exception as e:  # the capture failed: nothing of the step has run yet
                self.graph_error = f"{type(e).__name__}: {e}"
        if self._graph is None:
            self.mode = "replay"
            self._run()
            return
        self.mode = "graph"
        self._graph.launch(stream=self.stream)


def _adamw_step_scalars(param, grad, m, v, scalars):
    """One AdamW step on device arrays, its eight scalars read from scalars on the device."""
    a = _arrays.Args("pytfm_adamw_step_scalars", locals())
    a.call(param, m, v, grad, param.size, scalars)
