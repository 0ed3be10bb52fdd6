"""The model's flat buffers (pytfm.nn.FlatDict): every parameter, gradient and AdamW moment is a
view into one buffer per kind; zeroing, clipping and the optimizer step are one call over it,
and give the trajectory the per-parameter code gives."""

import hashlib
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import assert_close, assert_same_bits_at_any_thread_count, seeds
from pytfm import checkpoint, data, ops
from pytfm.nn import ALIGN, GPT, FlatDict, GPTConfig, flat_layout, param_shapes
from pytfm.optim import AdamW, clip_grad_norm

CONFIGS = [GPTConfig(d_model=24, n_layer=2, n_head=2, max_seq=16, seed=1),
           GPTConfig(d_model=20, n_layer=1, n_head=4, max_seq=8, pos="sinusoidal",
                     tie_embeddings=False)]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_every_array_is_an_aligned_view_into_one_buffer(cfg):
    m = GPT(cfg)
    assert list(m.params) == [name for name, _ in param_shapes(cfg)]  # names and order as ever
    for flat in (m.params, m.grads):
        buf = flat.buffer
        assert buf.ndim == 1 and buf.flags.c_contiguous and buf.ctypes.data % 64 == 0
        for name, a in flat.items():
            assert np.shares_memory(a, buf) and a.ctypes.data % (4 * ALIGN) == 0, name
    views = sorted((a.ctypes.data, a.nbytes) for a in m.params.values())
    assert all(p + n <= q for (p, n), (q, _) in zip(views, views[1:]))  # no two overlap
    # the matrices (AdamW decays them) come first, the vectors after them
    last_matrix = max(a.ctypes.data for a in m.params.values() if a.ndim >= 2)
    assert all(a.ctypes.data > last_matrix for a in m.params.values() if a.ndim < 2)
    assert m.params.buffer.size - m.num_params() < ALIGN * len(m.params)  # padding only


def test_layout_of_awkward_shapes():
    layout, size = flat_layout([("v", (3,)), ("w", (5, 3)), ("s", (1,)), ("u", (2, 2, 2))])
    assert list(layout) == ["v", "w", "s", "u"]
    assert layout["w"] == (0, (5, 3)) and layout["u"] == (16, (2, 2, 2))
    assert layout["v"] == (32, (3,)) and layout["s"] == (48, (1,)) and size == 64


def test_flatdict_keeps_its_views():
    m = GPT(CONFIGS[0])
    name = "transformer.h.0.ln_1.bias"
    view = m.params[name]
    m.params[name] = np.full(view.shape, 3.0)  # copies into the view the layer holds
    assert m.params[name] is view and (m.blocks[0].ln_1.b == 3.0).all()
    with pytest.raises(ValueError, match="shape"):
        m.params[name] = np.zeros(7)
    with pytest.raises(KeyError, match="names are fixed"):
        m.params["new"] = np.zeros(3)
    with pytest.raises(TypeError, match="names are fixed"):
        del m.params[name]
    with pytest.raises(TypeError, match="names are fixed"):
        m.params.pop(name)


def _train(model, steps, flat, max_norm, seed=0):
    """Losses of `steps` AdamW steps; flat=False runs the per-parameter optimizer and clipping
    code (plain dicts of the same arrays) on the same model."""
    params, grads = (model.params, model.grads) if flat else (dict(model.params),
                                                               dict(model.grads))
    opt = AdamW(params, grads, lr=3e-3, weight_decay=0.1)
    assert (opt.spans is not None) == flat
    batches = data.Batches(data.stdlib_corpus(), model.cfg.max_seq, 4, seed=seed)
    losses = []
    for step in range(steps):
        x, y = batches.batch("train", step)
        model.zero_grad()
        losses.append(float(model.forward(x, y)[1]))
        model.backward()
        clip_grad_norm(grads, max_norm)
        opt.step()
    return losses, opt


def _digest(arrays):
    return hashlib.sha1(b"".join(a.tobytes() for a in arrays.values())).hexdigest()


@pytest.mark.parametrize("cfg", CONFIGS)
def test_flat_adamw_gives_the_per_parameter_trajectory_bit_for_bit(cfg):
    """Weight decay on matrices only, as the per-parameter loop does it: same losses, same
    parameters and moments, bit for bit (no clipping: see the next test for it)."""
    a, b = GPT(cfg), GPT(cfg)
    la, oa = _train(a, 6, flat=True, max_norm=math.inf)
    lb, ob = _train(b, 6, flat=False, max_norm=math.inf)
    assert la == lb
    assert _digest(a.params) == _digest(b.params)
    assert _digest(oa.m) == _digest(ob.m) and _digest(oa.v) == _digest(ob.v)
    # the padding between views never moves
    used = np.zeros(a.params.size, bool)
    for off, shape in a.params.layout.values():
        used[off:off + math.prod(shape)] = True
    for flat in (a.params, a.grads, oa.m, oa.v):
        assert not flat.buffer[~used].any()


def test_clipping_on_the_flat_buffer_matches_array_by_array():
    """One sum over the buffer and a sum of per-array sums differ only in the order doubles
    are added: the norms agree to 1e-12, and the runs' losses to float rounding."""
    a, b = GPT(CONFIGS[0]), GPT(CONFIGS[0])
    la, _ = _train(a, 5, flat=True, max_norm=0.5)
    lb, _ = _train(b, 5, flat=False, max_norm=0.5)
    assert_close("flat.clip.losses", np.array(la), np.array(lb), rtol=1e-5)
    g = {k: np.random.default_rng(i).standard_normal(v.shape).astype(np.float32)
         for i, (k, v) in enumerate(a.grads.items())}
    for k in g:
        a.grads[k] = g[k]
    ref = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in g.values()))
    assert clip_grad_norm(a.grads, math.inf) == pytest.approx(ref, rel=1e-12)
    assert clip_grad_norm(g, math.inf) == pytest.approx(ref, rel=1e-12)
    clip_grad_norm(a.grads, 1.0)
    assert math.sqrt(ops.sum_squares(a.grads.buffer)) == pytest.approx(1.0, rel=1e-5)


def test_zero_grad_is_one_fill():
    m = GPT(CONFIGS[0])
    m.grads.buffer[:] = 1.0
    m.zero_grad()
    assert not m.grads.buffer.any() and not any(g.any() for g in m.grads.values())


def test_checkpoint_round_trip_lands_in_the_views(tmp_path):
    m = GPT(CONFIGS[0])
    _, opt = _train(m, 2, flat=True, max_norm=1.0)
    path = tmp_path / "m.safetensors"
    checkpoint.save(path, m, step=2, optimizer=opt)
    m2 = GPT(CONFIGS[0])
    opt2 = AdamW(m2.params, m2.grads, lr=3e-3)
    checkpoint.load(path, m2, opt2)
    assert _digest(m2.params) == _digest(m.params)
    assert np.array_equal(m2.params.buffer, m.params.buffer)
    assert np.array_equal(opt2.m.buffer, opt.m.buffer) and opt2.t == opt.t
    assert m2.blocks[0].attn.c_attn.w is m2.params["transformer.h.0.attn.c_attn.weight"]


@given(n=st.one_of(st.integers(0, 40), st.sampled_from([16383, 16384, 16385, 2**20 + 3])),
       seed=seeds)
def test_sum_squares_is_the_float64_sum(n, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    ref = float(np.sum(x.astype(np.float64) ** 2))
    assert ops.sum_squares(x) == pytest.approx(ref, rel=1e-13, abs=0.0)


def test_reductions_are_0d_arrays_on_the_cpu_as_on_the_gpu():
    """The loss, a sum of squares and the clipped norm are 0-d arrays of the CPU's array module,
    as they are CuPy's on the GPU (tests/cuda/test_cuda_dispatch.py), of the GPU's dtypes: a
    caller reads them the same way on both devices (float())."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 5)).astype(np.float32)
    loss, _ = ops.cross_entropy_forward(logits, np.array([0, 4, -1]))
    total = ops.sum_squares(logits)
    model = GPT(CONFIGS[0])
    x, y = data.Batches(data.stdlib_corpus(), model.cfg.max_seq, 2).batch("train", 0)
    _, model_loss = model.forward(x, y)
    model.backward()
    norm = clip_grad_norm(model.grads, 1.0)
    for value, dtype in ((loss, np.float32), (model_loss, np.float32), (total, np.float64),
                         (norm, np.float64)):
        assert type(value) is np.ndarray and value.shape == () and value.dtype == dtype
    assert float(total) == pytest.approx(float(np.sum(logits.astype(np.float64) ** 2)), rel=1e-13)
    assert float(clip_grad_norm({}, 1.0)) == 0.0


def test_sum_squares_arguments_and_threads():
    with pytest.raises(TypeError, match="x must have dtype float32"):
        ops.sum_squares(np.zeros(3))
    assert ops.sum_squares(np.array(3.0, np.float32)) == 9.0
    assert ops.sum_squares(np.array([np.inf], np.float32)) == math.inf
    assert_same_bits_at_any_thread_count("""
        import numpy as np
        from pytfm import ops
        x = np.random.default_rng(1).standard_normal(3 * 2**20 + 5).astype(np.float32)
        out = [np.array([ops.sum_squares(x)])]
    """)


def test_a_user_dict_still_works_with_the_optimizer():
    """AdamW and clip_grad_norm on plain dicts of the user's own arrays: one call per array."""
    p = {"w": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)}
    g = {k: np.full_like(v, 0.5) for k, v in p.items()}
    opt = AdamW(p, g, lr=0.1, weight_decay=0.5)
    assert opt.spans is None and not isinstance(opt.m, FlatDict)
    opt.step()
    assert p["w"][0, 0] < p["b"][0]  # the matrix is decayed, the vector is not
