/*
 * adamw.cu — one fused in-place AdamW step on the GPU; the twin of csrc/adamw.c.
 *
 *   param ← param · (1 − lr·wd);  m ← β1 m + (1 − β1) g;  v ← β2 v + (1 − β2) g²
 *   param ← param − (lr / (1 − β1ᵗ)) · m / (sqrt(v) / sqrt(1 − β2ᵗ) + eps)
 * The scalars are computed once on the host in double, exactly as the CPU twin does; each
 * thread then does the float32 work of one element (grid-stride loop).
 */
#include "pytfm_cuda.cuh"

struct adamw_scalars {
    float decay, step_size, bc2_sqrt, b1, c1, b2, c2, eps;
};

static __global__ void adamw_kernel(float *param, float *m, float *v, const float *grad,
                                    int64_t count, adamw_scalars s) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = grad[i];
        const float mi = s.b1 * m[i] + s.c1 * g;
        const float vi = s.b2 * v[i] + s.c2 * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = param[i] * s.decay - s.step_size * mi / (sqrtf(vi) / s.bc2_sqrt + s.eps);
    }
}

extern "C" pytfm_status pytfm_adamw_step_cuda(float *param, float *m, float *v, const float *grad,
                                              int64_t count, int64_t step, double lr,
                                              double beta1, double beta2, double eps,
                                              double weight_decay, void *stream) {
    PYTFM_TRY(pytfm__check_adamw(__func__, param, m, v, grad, count, step, lr, beta1, beta2,
                                 eps, weight_decay));
    if (count == 0) return PYTFM_STATUS_OK;
    adamw_scalars s;
    s.decay = (float)(1.0 - lr * weight_decay);
    s.step_size = (float)(lr / (1.0 - pow(beta1, (double)step)));
    s.bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
    s.b1 = (float)beta1, s.c1 = (float)(1.0 - beta1); // 1 − β in double, then rounded
    s.b2 = (float)beta2, s.c2 = (float)(1.0 - beta2);
    s.eps = (float)eps;
    return PYTFM_LAUNCH(adamw_kernel, dim3(pytfm__blocks(count, 256, PYTFM_MAX_BLOCKS)),
                        dim3(256), 0, stream, param, m, v, grad, count, s);
}
