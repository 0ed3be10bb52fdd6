"""pytfm_sample's temperature is a double, as Python's float: a temperature that float32 cannot
hold exactly (0.1) picks the token Python's formula (pytfm.generate.sample_next's, in float64)
picks for the same random number, where the float32 nearest it would pick the other one."""

import numpy as np

from pytfm._core import ffi, lib


def python_token(logits, temperature, u):
    """sample_next's arithmetic for one row, given its uniform number u."""
    z = logits.astype(np.float64)
    z = (z - z.max()) / temperature
    p = np.exp(z)
    p /= p.sum()
    return int(min((p.cumsum() < u).sum(), z.size - 1))


def test_the_temperature_is_not_rounded_to_float32():
    rng = ffi.new("pytfm_rng *")
    value = ffi.new("uint64_t *")
    seed = next(s for s in range(100) if lib.pytfm_rng_seed(rng, s) == 0
                and lib.pytfm_rng_next(rng, value) == 0 and (value[0] >> 11) * 2.0**-53 > 0.6)
    u = (value[0] >> 11) * 2.0**-53
    T, T32 = 0.1, float(np.float32(0.1))
    assert T != T32
    # logits [0, -d]: p0 = 1 / (1 + exp(-d / T)) = u at d = T·ln(u / (1 − u)); among the float32
    # d near it, one on which T and its float32 rounding disagree
    d0 = np.float32(T * np.log(u / (1 - u)))
    found = None
    for k in range(-200, 201):
        d = np.float32(d0 + np.float32(k) * np.spacing(d0))
        logits = np.array([0.0, -d], np.float32)
        if python_token(logits, T, u) != python_token(logits, T32, u):
            found = logits
            break
    assert found is not None, "no float32 logit separates 0.1 from float32(0.1) here"
    token = ffi.new("int64_t *")
    lib.pytfm_rng_seed(rng, seed)
    assert lib.pytfm_sample(token, ffi.from_buffer("float[]", found), 2, T, 0, rng) == 0
    assert token[0] == python_token(found, T, u) != python_token(found, T32, u)
