"""A BF16 KV cache is the CPU's: a session of a model on PYTFM_DEVICE_CUDA (the CUDA build on
the emulator, as tests/cuda/test_cuda_c_model.py opens it) refuses PYTFM_PRECISION_BF16 with
PYTFM_STATUS_NOT_SUPPORTED and says why, and still opens FP32 caches through
pytfm_session_open_ex."""

from test_cuda_c_model import CONFIGS, Lib, full, saved

__all__ = ["full"]  # a fixture of test_cuda_c_model.py, used here (emu: tests/conftest.py)


def test_a_session_on_the_gpu_refuses_a_bf16_cache(full, tmp_path):
    _, path = saved(CONFIGS["rope-tied"], tmp_path)
    lib = Lib(full)
    m = lib.open(path, lib.lib.PYTFM_DEVICE_CUDA)
    try:
        s = lib.ffi.new("pytfm_session **")
        st = lib.lib.pytfm_session_open_ex(s, m, 0, lib.lib.PYTFM_PRECISION_BF16)
        assert st == lib.lib.PYTFM_STATUS_NOT_SUPPORTED
        assert s[0] == lib.ffi.NULL
        assert lib.error().startswith("pytfm_session_open_ex: kv_precision PYTFM_PRECISION_BF16 "
                                      "(a BF16 KV cache) runs on the CPU only")
        lib.ok(lib.lib.pytfm_session_open_ex(s, m, 0, lib.lib.PYTFM_PRECISION_FP32))
        lib.ok(lib.lib.pytfm_session_close(s[0]))
    finally:
        lib.ok(lib.lib.pytfm_model_close(m))
