"""The encoder–decoder on the GPU path without a GPU: Transformer(cfg, device="cuda") on the
stand-in cupy (tests/fake_cupy.py, strict: a NumPy array mixed into device code is a
TypeError, as with CuPy), every op answered by the CUDA kernels of cuda/ under the emulator.
The loss, every gradient and the decoded logits agree with the CPU model's to float32
rounding (the kernels sum in other orders)."""

import numpy as np
import pytest

from pytfm.seq2seq import Seq2SeqConfig, Transformer


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)


@pytest.mark.parametrize("norm, activation", [("post", "relu"), ("pre", "gelu")])
def test_on_the_gpu_path_training_and_decoding_are_the_cpus(norm, activation, emu,
                                                              monkeypatch):
    import fake_cupy

    cp = fake_cupy.install(monkeypatch, emu, strict=True)
    cfg = Seq2SeqConfig(src_vocab=17, tgt_vocab=19, d_model=16, n_head=2, n_enc_layers=1,
                        n_dec_layers=2, d_ff=24, max_len=8, norm=norm, activation=activation)
    cpu, gpu = Transformer(cfg, seed=3), Transformer(cfg, seed=3, device="cuda")
    assert type(gpu.params.buffer) is cp.ndarray and gpu.device == "cuda"
    assert np.array_equal(fake_cupy._asnumpy(gpu.params.buffer), cpu.params.buffer)
    rng = np.random.default_rng(1)
    src, tgt, y = (rng.integers(0, v, (3, t)) for v, t in ((17, 6), (19, 5), (19, 5)))
    sl, tl = [6, 2, 4], [5, 3, 1]
    losses = []
    for model, arrays in ((cpu, (src, tgt, y)), (gpu, tuple(map(cp.asarray, (src, tgt, y))))):
        model.zero_grad()
        _, loss = model.forward(arrays[0], arrays[1], sl, tl, targets=arrays[2])
        model.backward()
        losses.append(float(loss))
    assert abs(losses[0] - losses[1]) <= 1e-5 * losses[0]
    for name, g in cpu.grads.items():
        if name.endswith("multihead_attn.k_proj.bias"):  # 0 but for rounding (the softmax
            assert np.abs(fake_cupy._asnumpy(gpu.grads[name])).max() <= 1e-6  # cancels it)
            continue
        err = rel_err(fake_cupy._asnumpy(gpu.grads[name]), g)
        assert err <= 1e-4, (name, err)
    want = cpu.forward(src, tgt, sl, [5, 5, 5])
    state = gpu.start_decode(cp.asarray(src), sl)
    for t in range(2):
        got = fake_cupy._asnumpy(gpu.decode_step(state, cp.asarray(tgt[:, t])))
        assert rel_err(got, want[:, t]) <= 1e-5
    state.reorder(np.array([2, 2, 1]))
    got = fake_cupy._asnumpy(gpu.decode_step(state, cp.asarray(tgt[[2, 2, 1], 2])))
    assert rel_err(got, want[[2, 2, 1], 2]) <= 1e-5
