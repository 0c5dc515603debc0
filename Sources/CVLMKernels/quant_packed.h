#ifndef VLM_QUANT_PACKED_H
#define VLM_QUANT_PACKED_H

#include "kernels_internal.h"

/// Where things lie in one 16-row group of a packed matrix (see vlm_quant_pack).
typedef struct vlm_quant_packed_layout_t {
    ptrdiff_t blocks;          // 32-element blocks per row
    ptrdiff_t value_bytes;     // bytes of values per block: 256 + 64·high_bits (nibbles), or 512 (bytes)
    ptrdiff_t scales_offset;   // the 16 scales of block b at scales_offset + scale_bytes·b
    ptrdiff_t minimums_offset; // likewise the 16 minimums, for formats that have them
    ptrdiff_t scale_bytes;     // per block: 32 (fp16), 16 (K-quants' 8-bit sub-block scales) or 32 (Q6_K: two halves)
    ptrdiff_t supers_offset;   // K-quants: the 16 rows' fp16 d of super-block s at supers_offset + super_bytes·s,
    ptrdiff_t super_bytes;     // then their fp16 dmin (32 bytes on) where there are minimums
    ptrdiff_t group_bytes;     // from one group to the next (a multiple of 64)
    int nibbles;               // values' low four bits two a byte, then high_bits planes of their higher bits
    int high_bits;             // 0 (Q4), 1 (Q5) or 2 (Q6_K): 8 64-bit masks each, one bit per byte of w[q]
    int has_minimum;           // w = d·q + m (Q4_1, Q5_1, Q4_K, Q5_K); otherwise w = d·(q − offset)
    int offset;
    int super_scales;          // K-quants: a sub-block's scale is d·scale, formed in fp32 as ggml forms it
    int half_scales;           // Q6_K: one scale per 16 elements, the block's first half's 16 before the second's
} vlm_quant_packed_layout_t;

/// 0 and the layout for a format that packs and a valid row length, -1 otherwise.
int vlm_quant_packed_layout(vlm_quant_format format, ptrdiff_t columns, vlm_quant_packed_layout_t *layout);

#if defined(__x86_64__)
#include <stdint.h>
#include <xmmintrin.h>

// Software prefetching for the packed products, which stream every byte of a matrix once per decoding step. The
// hardware prefetchers alone leave a thread at about 2/3 of the bandwidth it can draw (measured on Intel and AMD).

/// Bytes ahead of the block being read. Past the matrix's end prefetches are dropped harmlessly.
enum { VLM_QUANT_PREFETCH_DISTANCE = 8192 };

/// Prefetches block `b`'s share of the group's bytes, PREFETCH_DISTANCE ahead: the shares tile the whole stream,
/// scales and minimums included (prefetching only the values ahead of each block left every group's scales to
/// arrive as cache misses, 12% of a Zen 4's decoding cycles). The lines go to L2 (T1), not L1: a core has several
/// times more outstanding L2 misses than L1 fill buffers (Zen 4: 64 against 24; Golden Cove: 48 against 16), and
/// prefetches into L1 stalled on full buffers.
static inline void vlm_quant_prefetch_block_share(const uint8_t *group, const vlm_quant_packed_layout_t *layout,
                                                  ptrdiff_t b) {
    const ptrdiff_t ahead = VLM_QUANT_PREFETCH_DISTANCE + (b * layout->group_bytes) / layout->blocks;
    const ptrdiff_t until = VLM_QUANT_PREFETCH_DISTANCE + ((b + 1) * layout->group_bytes) / layout->blocks;
    for (ptrdiff_t line = ahead & ~(ptrdiff_t)63; line < until; line += 64)
        _mm_prefetch((const char *)group + line, _MM_HINT_T1);
}

/// Prefetches the first PREFETCH_DISTANCE bytes of a range of groups, which the blocks' own prefetches do not
/// cover: a thread claims its ranges as the work runs (vlm_parallel_ranges), and what the other core prefetched
/// before sits in that core's caches.
static inline void vlm_quant_prefetch_range_start(const uint8_t *start, ptrdiff_t bytes) {
    const ptrdiff_t warm = bytes < VLM_QUANT_PREFETCH_DISTANCE ? bytes : VLM_QUANT_PREFETCH_DISTANCE;
    for (ptrdiff_t line = 0; line < warm; line += 64) _mm_prefetch((const char *)start + line, _MM_HINT_T1);
}
#endif

#if defined(__x86_64__)
// The AVX-512 products read one activation row (m = 1) as `streams` streams a thread (1 or VLM_QUANT_MAX_STREAMS;
// the public entry points pass vlm_quant_streams()).
void vlm_quant_activation_avx512(const float *x, ptrdiff_t columns, void *activation);
void vlm_quant_packed_matmul_avx512(const void *packed, vlm_quant_format format,
                                    const vlm_quant_packed_layout_t *layout, ptrdiff_t rows, const void *activations,
                                    ptrdiff_t activation_bytes, ptrdiff_t m, float *y, ptrdiff_t y_stride,
                                    ptrdiff_t first_group, ptrdiff_t groups, int streams);
void vlm_quant_int8_activation_avx512(const float *x, ptrdiff_t columns, void *activation);
int vlm_quant_int8_matmul_avx512(const void *packed, vlm_quant_format format,
                                 const vlm_quant_packed_layout_t *layout, ptrdiff_t rows, const void *activations,
                                 ptrdiff_t activation_bytes, ptrdiff_t m, float *y, ptrdiff_t y_stride,
                                 ptrdiff_t first_group, ptrdiff_t groups, int streams);
void vlm_quant_activation_avx2(const float *x, ptrdiff_t columns, void *activation);
void vlm_quant_packed_matmul_avx2(const void *packed, const vlm_quant_packed_layout_t *layout, ptrdiff_t rows,
                                  const void *activations, ptrdiff_t activation_bytes, ptrdiff_t m, float *y,
                                  ptrdiff_t y_stride, ptrdiff_t first_group, ptrdiff_t groups);
#endif

#endif
