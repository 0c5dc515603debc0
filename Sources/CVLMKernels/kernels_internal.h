#ifndef VLM_KERNELS_INTERNAL_H
#define VLM_KERNELS_INTERNAL_H

#include "vlm_kernels.h"

// The implementations behind vlm_kernels.h's entry points; the entry points pick one.

/// Marks a portable function to be compiled twice on x86-64 Linux, also for x86-64-v3 (AVX2, FMA); the loader
/// picks that copy where the CPU has it.
#if defined(__x86_64__) && defined(__ELF__)
#define PORTABLE_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PORTABLE_CLONES
#endif

/// Whether the CPU (and OS) run AVX2 with FMA and F16C: the AVX2 kernels' target.
int vlm_has_avx2(void);

/// vlm_quant_packed_matmul and vlm_quant_int8_matmul with one row read as `streams` streams (1 or
/// VLM_QUANT_MAX_STREAMS) instead of vlm_quant_streams().
void vlm_quant_packed_matmul_streams(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                                     const void *activations, ptrdiff_t m, float *y, ptrdiff_t y_stride,
                                     ptrdiff_t first_group, ptrdiff_t groups, vlm_kernel_isa isa, int streams);
int vlm_quant_int8_matmul_streams(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                                  const void *activations, ptrdiff_t m, float *y, ptrdiff_t y_stride,
                                  ptrdiff_t first_group, ptrdiff_t groups, int streams);

int vlm_attention_scalar(const vlm_attention_problem *problem);
void vlm_gated_silu_scalar(const float *x, ptrdiff_t rows, ptrdiff_t width, float *y);
ptrdiff_t vlm_argmax_scalar(const float *x, ptrdiff_t count);
/// A 64-byte aligned buffer of at least `bytes` for one vlm_attention_partial call, kept by the calling thread
/// and grown as needed, or NULL when it cannot be: a decoding step runs a few hundred such calls, and each
/// allocating its own was a per-step allocation for every one.
void *vlm_attention_partial_scratch(size_t bytes);

int vlm_attention_partial_scalar(const vlm_attention_problem *p, ptrdiff_t first_key, ptrdiff_t key_count, float *maxima,
                                 float *sums, float *outputs);
void vlm_floats_to_halves_scalar(const float *x, ptrdiff_t count, uint16_t *y);
void vlm_floats_to_halves_avx512(const float *x, ptrdiff_t count, uint16_t *y);
void vlm_halves_to_floats_avx512(const uint16_t *x, ptrdiff_t count, float *y);
void vlm_floats_to_halves_avx2(const float *x, ptrdiff_t count, uint16_t *y);
void vlm_halves_to_floats_avx2(const uint16_t *x, ptrdiff_t count, float *y);
void vlm_layer_norm_scalar(const float *x, float *y, ptrdiff_t rows, ptrdiff_t features, const float *weight,
                           const float *bias, float eps);
void vlm_quantize_rows_int8_scalar(const float *x, ptrdiff_t rows, ptrdiff_t features, signed char *q, float *scales);
/// vlm_rms_norm in portable C; the AVX-512 version gives the same bits.
void vlm_rms_norm_scalar(const float *x, const float *weight, ptrdiff_t rows, ptrdiff_t features, float eps, float *y);

#if defined(__x86_64__)
int vlm_attention_avx512(const vlm_attention_problem *problem);
/// Flash attention's schedule: blocks of `query_block` query rows pass over tiles of `key_tile` keys with an online
/// softmax, so that a tile's keys and values are read from L2 by every register block of the query block.
int vlm_attention_tiled_avx512(const vlm_attention_problem *problem, ptrdiff_t query_block, ptrdiff_t key_tile);
/// The same schedule with the score and value products on bf16-rounded operands (AVX512-BF16); `head_dim` even.
int vlm_attention_tiled_bf16_avx512(const vlm_attention_problem *problem, ptrdiff_t query_block, ptrdiff_t key_tile);
void vlm_gated_silu_avx512(const float *x, ptrdiff_t rows, ptrdiff_t width, float *y);
ptrdiff_t vlm_argmax_avx512(const float *x, ptrdiff_t count);
ptrdiff_t vlm_argmax_avx2(const float *x, ptrdiff_t count);
int vlm_attention_partial_avx512(const vlm_attention_problem *p, ptrdiff_t first_key, ptrdiff_t key_count, float *maxima,
                                 float *sums, float *outputs);
void vlm_layer_norm_avx512(const float *x, float *y, ptrdiff_t rows, ptrdiff_t features, const float *weight,
                           const float *bias, float eps);
void vlm_rms_norm_avx512(const float *x, const float *weight, ptrdiff_t rows, ptrdiff_t features, float eps, float *y);
void vlm_quantize_rows_int8_avx512(const float *x, ptrdiff_t rows, ptrdiff_t features, signed char *q, float *scales);
void vlm_panel_matvec_avx512(const float *w, ptrdiff_t k, ptrdiff_t n, ptrdiff_t panel_stride, const float *x,
                             const float *bias, float *y, ptrdiff_t first_panel, ptrdiff_t panel_count);
void vlm_int8_matvec_avx512(const int8_t *w, ptrdiff_t k, ptrdiff_t n, const int8_t *x, const int32_t *column_sums,
                            const float *weight_scales, float row_scale, const float *bias, float *y,
                            ptrdiff_t first_panel, ptrdiff_t panel_count);
void vlm_panel_matvec_bf16_avx512(const uint16_t *w, ptrdiff_t k, ptrdiff_t n, ptrdiff_t panel_stride, const uint16_t *x,
                                  const float *bias, float *y, ptrdiff_t first_panel, ptrdiff_t panel_count);
void vlm_gated_silu_avx2(const float *x, ptrdiff_t rows, ptrdiff_t width, float *y);
int vlm_attention_partial_avx2(const vlm_attention_problem *p, ptrdiff_t first_key, ptrdiff_t key_count, float *maxima,
                               float *sums, float *outputs);
#endif

/// Keys `0 ..< result` are visible to query `row` (before the padding mask).
static inline ptrdiff_t vlm_visible_keys(const vlm_attention_problem *p, ptrdiff_t row) {
    if (!p->causal) return p->key_length;
    ptrdiff_t visible = row + 1 + p->key_length - p->query_length;
    return visible < 0 ? 0 : (visible > p->key_length ? p->key_length : visible);
}

#endif
