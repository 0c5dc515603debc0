#include "kernels_internal.h"

int vlm_has_avx2(void) {
#if defined(__x86_64__)
    // Like avx512f, avx2 is reported only where the OS saves the ymm registers.
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

vlm_kernel_isa vlm_best_isa(void) {
#if defined(__x86_64__)
    // __builtin_cpu_supports("avx512f") also checks that the OS saves the zmm registers (XCR0).
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma")) {
        return VLM_ISA_AVX512;
    }
    if (vlm_has_avx2()) return VLM_ISA_AVX2;
#endif
    return VLM_ISA_SCALAR;
}

int vlm_attention(const vlm_attention_problem *problem, vlm_kernel_isa isa) {
    if (problem->query_length <= 0 || problem->head_dim <= 0 || problem->head_count <= 0) return 0;
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) return vlm_attention_avx512(problem);
#endif
    (void)isa;
    return vlm_attention_scalar(problem);
}

int vlm_attention_partial(const vlm_attention_problem *problem, ptrdiff_t first_key, ptrdiff_t key_count, float *maxima,
                          float *sums, float *outputs, vlm_kernel_isa isa) {
    if (problem->query_length <= 0 || problem->head_dim <= 0 || key_count <= 0) return 0;
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512)
        return vlm_attention_partial_avx512(problem, first_key, key_count, maxima, sums, outputs);
    if (isa == VLM_ISA_AVX2 && vlm_has_avx2())
        return vlm_attention_partial_avx2(problem, first_key, key_count, maxima, sums, outputs);
#endif
    (void)isa;
    return vlm_attention_partial_scalar(problem, first_key, key_count, maxima, sums, outputs);
}

void vlm_gated_silu(const float *x, ptrdiff_t rows, ptrdiff_t width, float *y, vlm_kernel_isa isa) {
    if (rows <= 0 || width <= 0) return;
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) {
        vlm_gated_silu_avx512(x, rows, width, y);
        return;
    }
    if (isa == VLM_ISA_AVX2 && vlm_has_avx2()) {
        vlm_gated_silu_avx2(x, rows, width, y);
        return;
    }
#endif
    (void)isa;
    vlm_gated_silu_scalar(x, rows, width, y);
}

void vlm_layer_norm(const float *x, float *y, ptrdiff_t rows, ptrdiff_t features, const float *weight,
                    const float *bias, float eps, vlm_kernel_isa isa) {
    if (rows <= 0 || features <= 0) return;
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) {
        vlm_layer_norm_avx512(x, y, rows, features, weight, bias, eps);
        return;
    }
#endif
    (void)isa;
    vlm_layer_norm_scalar(x, y, rows, features, weight, bias, eps);
}
