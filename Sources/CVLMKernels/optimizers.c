#include "kernels_internal.h"

// torch.optim.AdamW's single-tensor update rounds after every operation, so nothing here is contracted into fused
// multiply-adds; the loop vectorizes as it is (the x86-64-v3 copy eight lanes at a time, square roots and divisions
// included).
#pragma clang fp contract(off)

PORTABLE_CLONES
void vlm_adamw_update(float *restrict p, const float *restrict g, float *restrict m, float *restrict v, ptrdiff_t n,
                      float decay, float beta1, float beta2, float step_size, float correction2, float epsilon) {
    const float keep1 = 1.0f - beta1, keep2 = 1.0f - beta2;
    for (ptrdiff_t i = 0; i < n; i++) {
        float value = p[i] * decay;
        float first = m[i] + (g[i] - m[i]) * keep1;
        float second = v[i] * beta2 + keep2 * g[i] * g[i];
        m[i] = first;
        v[i] = second;
        p[i] = value - step_size * (first / (__builtin_sqrtf(second) / correction2 + epsilon));
    }
}
