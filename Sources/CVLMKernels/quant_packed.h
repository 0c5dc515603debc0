#ifndef VLM_QUANT_PACKED_H
#define VLM_QUANT_PACKED_H

#include "kernels_internal.h"

/// Where things lie in one 16-row group of a packed matrix (see vlm_quant_pack).
typedef struct vlm_quant_packed_layout_t {
    ptrdiff_t blocks;          // 32-element blocks per row
    ptrdiff_t value_bytes;     // bytes of values per block: 256 + 64·high_bits (nibbles), or 512 (bytes)
    ptrdiff_t scales_offset;   // the 16 scales of block b at scales_offset + scale_bytes·b
    ptrdiff_t minimums_offset; // likewise the 16 minimums, for formats that have them
    ptrdiff_t scale_bytes;     // per block: 32 (fp16), 64 (fp32) or 128 (fp32, one per half block)
    ptrdiff_t group_bytes;     // from one group to the next (a multiple of 64)
    int nibbles;               // values' low four bits two a byte, then high_bits planes of their higher bits
    int high_bits;             // 0 (Q4), 1 (Q5) or 2 (Q6_K): 8 64-bit masks each, one bit per byte of w[q]
    int has_minimum;           // w = d·q + m (Q4_1, Q5_1, Q4_K, Q5_K); otherwise w = d·(q − offset)
    int offset;
    int float_scales;          // K-quants: a sub-block's scale d·scale is exact in fp32, not in fp16
    int half_scales;           // Q6_K: one scale per 16 elements, the block's first half's 16 before the second's
} vlm_quant_packed_layout_t;

/// 0 and the layout for a format that packs and a valid row length, -1 otherwise.
int vlm_quant_packed_layout(vlm_quant_format format, ptrdiff_t columns, vlm_quant_packed_layout_t *layout);

#if defined(__x86_64__)
void vlm_quant_activation_avx512(const float *x, ptrdiff_t columns, void *activation);
void vlm_quant_packed_matmul_avx512(const void *packed, const vlm_quant_packed_layout_t *layout, ptrdiff_t rows,
                                    const void *activations, ptrdiff_t activation_bytes, ptrdiff_t m, float *y,
                                    ptrdiff_t y_stride, ptrdiff_t first_group, ptrdiff_t groups);
void vlm_quant_activation_avx2(const float *x, ptrdiff_t columns, void *activation);
void vlm_quant_packed_matmul_avx2(const void *packed, const vlm_quant_packed_layout_t *layout, ptrdiff_t rows,
                                  const void *activations, ptrdiff_t activation_bytes, ptrdiff_t m, float *y,
                                  ptrdiff_t y_stride, ptrdiff_t first_group, ptrdiff_t groups);
#endif

#endif
