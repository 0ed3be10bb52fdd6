"""A BF16 KV cache (pytfm_attention_cache_append_bf16, pytfm_attention_gqa_decode_bf16kv,
KVCache(precision="bf16"), pytfm_session_open_ex with PYTFM_PRECISION_BF16).

The contract is bits: decoding on a BF16 cache is the float32 decode on a cache to which k and
v were appended rounded to BF16 (ops.round_bf16), on every ISA path, at one and two threads,
with grouped-query heads and windows, for a token (the row path of its own) and a prompt (the
float32 function on a widened batch row). The C session on a BF16 cache is Python's decode on
one, bit for bit; its caches take half the bytes; bad arguments are refused by name.
"""

import contextlib
import ctypes
import os
import sys

import numpy as np
import pytest

import pytfm
from helpers import TESTS, f32
from pytfm import ops
from pytfm import reference as ref
from pytfm._core import ffi, lib
from pytfm.kvcache import KVCache

sys.path.insert(0, os.path.join(TESTS, "c_api"))
from test_c_model import CModel, last_error, saved, small  # noqa: E402

OK = lib.PYTFM_STATUS_OK
PATHS = ("avx512", "avx2", "portable", "plain")


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@contextlib.contextmanager
def setting(isa, threads):
    before = pytfm.get_num_threads()
    pytfm.set_max_isa(isa)
    pytfm.set_num_threads(threads)
    try:
        if pytfm.get_isa() != isa:
            pytest.skip(f"this CPU cannot run the {isa} kernels (best: {pytfm.get_isa()})")
        yield
    finally:
        pytfm.set_max_isa("auto")
        pytfm.set_num_threads(before)


def both_caches(rng, B, Tmax, Hkv, D, start, n_new):
    """a BF16 cache and a float32 one holding the same rounded keys and values [0, start +
    n_new), appended in two pieces through each cache's own append"""
    shape = (B, Tmax, Hkv, D)
    c16 = np.zeros(shape, np.uint16), np.zeros(shape, np.uint16)
    c32 = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    for at, n in ((0, start), (start, n_new)):
        if n == 0:
            continue
        k, v = f32(rng, (B, n, Hkv, D)), f32(rng, (B, n, Hkv, D))
        ops.attention_cache_append_bf16(*c16, k, v, at)
        ops.attention_cache_append(*c32, ops.round_bf16(k), ops.round_bf16(v), at)
    return c16, c32


CASES = [  # B, H, Hkv, D, start, n_new, window
    (1, 4, 4, 16, 0, 1, 0), (2, 4, 2, 16, 150, 1, 0), (1, 6, 3, 33, 200, 1, 50),
    (2, 8, 1, 5, 63, 1, 0), (1, 4, 2, 16, 130, 20, 0), (2, 6, 2, 32, 90, 20, 40),
    (1, 2, 2, 8, 0, 20, 0), (1, 4, 4, 16, 64, 5, 7), (1, 16, 8, 128, 300, 1, 0),
    # a feed's blocks of key/value heads (two at two threads when G = 1): a short last block
    (2, 3, 3, 16, 40, 20, 0), (1, 5, 5, 8, 10, 3, 4), (1, 16, 8, 128, 300, 20, 0),
]


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("threads", (1, 2))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}H{}kv{}D{}s{}n{}w{}".format(*c))
def test_decode_on_a_bf16_cache_is_the_float32_decode_on_rounded_keys(isa, threads, case):
    B, H, Hkv, D, start, n_new, window = case
    rng = np.random.default_rng(start + n_new)
    c16, c32 = both_caches(rng, B, start + n_new + 3, Hkv, D, start, n_new)
    np.testing.assert_array_equal(ops.from_bf16_bits(c16[0]), c32[0])
    q = f32(rng, (B, n_new, H, D))
    with setting(isa, threads):
        o, lse = ops.attention_gqa_decode_bf16kv(q, *c16, start, window=window)
        o32, lse32 = ops.attention_decode(q, *c32, start, window=window)
    np.testing.assert_array_equal(bits(o), bits(o32))
    np.testing.assert_array_equal(bits(lse), bits(lse32))
    want_o, want_lse = ref.attention_gqa_decode_bf16kv(q, *c16, start, window=window)
    np.testing.assert_allclose(o, want_o, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(lse, want_lse, atol=1e-5, rtol=1e-5)


def test_append_rounds_to_nearest_even_as_the_reference():
    rng = np.random.default_rng(0)
    k = f32(rng, (2, 5, 3, 7))
    k[0, 0, 0, :3] = [np.inf, -0.0, 1e-40]  # inf, a signed zero, a subnormal
    v = f32(rng, (2, 5, 3, 7))
    c16 = np.full((2, 9, 3, 7), 7, np.uint16), np.full((2, 9, 3, 7), 7, np.uint16)
    want = ref.attention_cache_append_bf16(*c16, k, v, 2)
    ops.attention_cache_append_bf16(*c16, k, v, 2)
    np.testing.assert_array_equal(c16[0], want[0])
    np.testing.assert_array_equal(c16[1], want[1])
    np.testing.assert_array_equal(c16[0][:, 2:7], ops.to_bf16_bits(k))
    assert (c16[0][:, :2] == 7).all() and (c16[0][:, 7:] == 7).all()  # nothing else written


def test_bad_arguments_are_refused_by_name():
    z16 = np.zeros((1, 8, 2, 4), np.uint16)
    q = np.zeros((1, 1, 2, 4), np.float32)
    with pytest.raises(TypeError, match=r"k_cache must be a uint16 array of BF16 bits"):
        ops.attention_gqa_decode_bf16kv(q, np.zeros((1, 8, 2, 4), np.float32), z16, 0)
    with pytest.raises(ValueError, match=r"v_cache must have shape \(1, 8, 2, 4\)"):
        ops.attention_gqa_decode_bf16kv(q, z16, np.zeros((1, 9, 2, 4), np.uint16), 0)
    with pytest.raises(ValueError, match=r"cache overflow"):
        ops.attention_cache_append_bf16(z16, z16.copy(), q, q, 8)
    with pytest.raises(ValueError, match=r"window must be >= 0"):
        ops.attention_gqa_decode_bf16kv(q, z16, z16.copy(), 0, window=-1)
    with pytest.raises(ValueError, match=r"precision must be one of \('fp32', 'bf16'\)"):
        KVCache(1, 8, 2, 4, precision="fp16")
    with pytest.raises(ValueError, match=r"precision='bf16' .* CPU only"):
        KVCache(1, 8, 2, 4, device="cuda", precision="bf16")
    o, lse = ffi.new("float[8]"), ffi.new("float[2]")
    k16 = ffi.new("uint16_t[64]")
    st = lib.pytfm_attention_gqa_decode_bf16kv(o, lse, o, k16, k16 + 32, 1, 1, 2, 3, 4, 8, 0,
                                               0.5, 0)
    assert st == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert "pytfm_attention_gqa_decode_bf16kv" in last_error()


def test_a_kvcache_in_bf16_is_an_fp32_one_fed_rounded_keys_at_half_the_bytes():
    rng = np.random.default_rng(3)
    a = KVCache(2, 30, 4, 8, n_kv_head=2, window=9, precision="bf16")
    b = KVCache(2, 30, 4, 8, n_kv_head=2, window=9)
    assert a.k.nbytes * 2 == b.k.nbytes and a.k.dtype == np.uint16
    for n in (12, 1, 1, 3, 1):
        q, k, v = f32(rng, (2, n, 4, 8)), f32(rng, (2, n, 2, 8)), f32(rng, (2, n, 2, 8))
        got = a.attend(q, k, v)
        want = b.attend(q, ops.round_bf16(k), ops.round_bf16(v))
        np.testing.assert_array_equal(bits(got), bits(want))


# ---- the model: Python's decode, and the C session ----------------------------------------

def llama_small():
    from pytfm.nn import GPT, GPTConfig
    return GPT(GPTConfig(arch="llama", vocab=60, d_model=32, n_layer=2, n_head=4, n_kv_head=2,
                         head_dim=8, d_ff=48, max_seq=40, qkv_bias=True, tie_embeddings=False,
                         sliding_window=6, seed=2))


def open_session(c, max_len, kv_precision):
    handle = ffi.new("pytfm_session **")
    st = lib.pytfm_session_open_ex(handle, c.h, max_len, kv_precision)
    return st, handle[0]


def feed(h, tokens, vocab):
    tokens = np.ascontiguousarray(tokens, np.int64)
    logits = np.empty(vocab, np.float32)
    st = lib.pytfm_session_feed(h, ffi.from_buffer("float[]", logits),
                                ffi.from_buffer("int64_t[]", tokens), tokens.size)
    assert st == OK, last_error()
    return logits


@pytest.mark.parametrize("kind", ("gpt2", "llama"))
def test_the_c_session_on_a_bf16_cache_is_pythons_decode_on_one(kind, tmp_path):
    model = small("learned", False, d_model=32, max_seq=40, vocab=60) if kind == "gpt2" \
        else llama_small()
    file = saved(model, tmp_path / "m.safetensors")
    tokens = np.random.default_rng(0).integers(0, 60, 24)
    caches = model.new_caches(1, precision="bf16")
    fp32 = model.new_caches(1)
    with CModel(file) as c:
        st, h = open_session(c, 0, lib.PYTFM_PRECISION_BF16)
        assert st == OK, last_error()
        try:
            got = feed(h, tokens[:20], 60)
            np.testing.assert_array_equal(got, model.decode(tokens[None, :20], caches)[0, -1])
            want32 = model.decode(tokens[None, :20], fp32)[0, -1]
            assert np.abs(got - want32).max() <= 0.05 * np.abs(want32).max()
            for t in range(20, 24):
                got = feed(h, tokens[t:t + 1], 60)
                want = model.decode(tokens[None, t:t + 1], caches)[0, -1]
                np.testing.assert_array_equal(got, want)
        finally:
            lib.pytfm_session_close(h)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def allocated_kb():
    """The bytes malloc has handed out and not had back (glibc's mallinfo2: the heap's in use,
    uordblks, and the blocks it mapped, hblkhd), in KiB: what an allocation adds whether malloc
    maps it or carves it from memory freed earlier (the address space would not show the
    latter, and glibc's mmap threshold grows as large blocks are freed)."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) // 1024


def test_a_bf16_session_takes_half_the_cache_bytes(tmp_path):
    # the caches, 2·n_layer·max_len·d_model values = 2·2·4096·256: 16 MiB of floats, one
    # allocation at open: the bytes a session's opening takes from malloc
    model = small("none", True, d_model=256, n_head=4, max_seq=4096, vocab=40)
    with CModel(saved(model, tmp_path / "m.safetensors")) as c:
        grown, sessions = {}, []
        for name, p in (("fp32", lib.PYTFM_PRECISION_FP32), ("bf16", lib.PYTFM_PRECISION_BF16)):
            before = allocated_kb()  # both open together: nothing freed in between
            st, h = open_session(c, 0, p)
            assert st == OK, last_error()
            grown[name] = allocated_kb() - before
            sessions.append(h)
        for h in sessions:
            feed(h, np.arange(8) % 40, 40)
            lib.pytfm_session_close(h)
    kib = 2 * 2 * 4096 * 256 * 4 // 1024
    assert abs(grown["fp32"] - kib) <= 256, grown
    assert abs(grown["bf16"] - kib // 2) <= 256, grown


def test_session_open_ex_refuses_other_precisions_by_name(tmp_path):
    with CModel(saved(small(), tmp_path / "m.safetensors")) as c:
        for bad in (lib.PYTFM_PRECISION_INT8, 7, -1):
            st, h = open_session(c, 0, bad)
            assert st == lib.PYTFM_STATUS_INVALID_ARGUMENT and h == ffi.NULL
            assert last_error() == ("pytfm_session_open_ex: kv_precision must be "
                                    "PYTFM_PRECISION_FP32 or PYTFM_PRECISION_BF16, got "
                                    f"{bad}")
