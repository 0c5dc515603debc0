#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_packed.h"

// The packed products (see vlm_kernels.h and quant_packed.c): each 64-byte vector of weights is 16 rows × 4
// columns, every vpdpbusd multiplies them by one broadcast 4-byte digit group of the activations and sums each
// row's four products into its own 32-bit lane, so the lanes are output rows and no horizontal sums are needed.

#define VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma")))
#define VNNI_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma")))

/// A switch's cases for every packed format, `CASE(F)` each: each format's product is compiled with `F` a constant.
#define PACKED_FORMAT_CASES(CASE) \
    CASE(VLM_QUANT_Q4_0) CASE(VLM_QUANT_Q4_1) CASE(VLM_QUANT_Q5_0) CASE(VLM_QUANT_Q5_1) \
    CASE(VLM_QUANT_Q8_0) CASE(VLM_QUANT_Q4_K) CASE(VLM_QUANT_Q5_K) CASE(VLM_QUANT_Q6_K)

/// The largest |v| of the fixed point: three digits of at most 127, 64 and 64 in magnitude.
enum { FIXED_POINT_LIMIT = 127 << 14 };

VNNI void vlm_quant_activation_avx512(const float *x, ptrdiff_t columns, void *activation) {
    const ptrdiff_t blocks = columns / 32;
    int8_t *digits = activation;
    float *scales = (float *)(digits + 96 * blocks), *sums = scales + blocks, *half_sums = sums + blocks;
    const __m512i limit = _mm512_set1_epi32(FIXED_POINT_LIMIT), negative_limit = _mm512_set1_epi32(-FIXED_POINT_LIMIT);
    for (ptrdiff_t b = 0; b < blocks; b++, x += 32, digits += 96) {
        const __m512 low = _mm512_loadu_ps(x), high = _mm512_loadu_ps(x + 16);
        sums[b] = _mm512_reduce_add_ps(_mm512_add_ps(low, high));
        half_sums[2 * b] = _mm512_reduce_add_ps(low);
        half_sums[2 * b + 1] = _mm512_reduce_add_ps(high);
        // NaN and ±infinity (fpclass categories 0x01, 0x08, 0x10, 0x80).
        const int finite = !(_mm512_fpclass_ps_mask(low, 0x99) | _mm512_fpclass_ps_mask(high, 0x99));
        const float largest = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
        if (!finite || largest == 0) {
            scales[b] = finite ? 0 : __builtin_nanf("");
            memset(digits, 0, 96);
            continue;
        }
        scales[b] = largest / FIXED_POINT_LIMIT;
        const __m512 inverse = _mm512_set1_ps(FIXED_POINT_LIMIT / largest);
        for (int half = 0; half < 2; half++) {
            // Round to nearest (even on ties: the default rounding mode), then split into three rounded digits:
            // h·2¹⁴ leaves |r| ≤ 2¹³, then m·2⁷ leaves |l| ≤ 64.
            __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(half ? high : low, inverse));
            v = _mm512_max_epi32(_mm512_min_epi32(v, limit), negative_limit);
            const __m512i h = _mm512_srai_epi32(_mm512_add_epi32(v, _mm512_set1_epi32(1 << 13)), 14);
            const __m512i r = _mm512_sub_epi32(v, _mm512_slli_epi32(h, 14));
            const __m512i m = _mm512_srai_epi32(_mm512_add_epi32(r, _mm512_set1_epi32(1 << 6)), 7);
            const __m512i l = _mm512_sub_epi32(r, _mm512_slli_epi32(m, 7));
            _mm_storeu_si128((__m128i *)(digits + 16 * half), _mm512_cvtepi32_epi8(h));
            _mm_storeu_si128((__m128i *)(digits + 32 + 16 * half), _mm512_cvtepi32_epi8(m));
            _mm_storeu_si128((__m128i *)(digits + 64 + 16 * half), _mm512_cvtepi32_epi8(l));
        }
    }
}

/// A block's 16 fp16 scales (or minimums) as floats.
VNNI_INLINE __m512 halves(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p)); }

/// A K-quant block's 16 sub-block scales (signed for Q6_K) or minimums times their super-block's d or dmin: the fp32
/// product ggml's dequantization forms.
VNNI_INLINE __m512 sub_block_scales(const uint8_t *p, int is_signed, const uint8_t *super) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)p);
    const __m512i integers = is_signed ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(integers), halves(super));
}

VNNI_INLINE __m512i digit_group(const int8_t *p) {
    int32_t group;
    memcpy(&group, p, 4);
    return _mm512_set1_epi32(group);
}

/// Vector `j` of a block's nibble values as two vectors of digits, `low` = w[j] and `high` = w[4 + j] (each 16 rows ×
/// 4 columns), their fifth (and sixth) bits added from the high-bit planes.
VNNI_INLINE void nibble_pair(const uint8_t *values, const vlm_quant_format F, int j, __m512i *low, __m512i *high) {
    const int high_bits = F == VLM_QUANT_Q5_0 || F == VLM_QUANT_Q5_1 || F == VLM_QUANT_Q5_K ? 1 : F == VLM_QUANT_Q6_K ? 2 : 0;
    const __m512i nibble = _mm512_set1_epi8(0xF);
    const __m512i packed = _mm512_load_si512((const void *)(values + 64 * j));
    *low = _mm512_and_si512(packed, nibble);
    *high = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
    // Fifth (and sixth) bits: adding 16 (32) where a plane's mask bit is set.
    for (int plane = 0; plane < high_bits; plane++) {
        const __m512i bit = _mm512_set1_epi8((char)(16 << plane));
        const uint8_t *masks = values + 256 + 64 * plane;
        *low = _mm512_mask_add_epi8(*low, _load_mask64((__mmask64 *)(masks + 8 * j)), *low, bit);
        *high = _mm512_mask_add_epi8(*high, _load_mask64((__mmask64 *)(masks + 8 * (4 + j))), *high, bit);
    }
}

/// The block's per-row scales (the first half's for Q6_K), as ggml's dequantization forms them.
VNNI_INLINE __m512 block_scales(const uint8_t *group, const vlm_quant_packed_layout_t *layout, const vlm_quant_format F,
                                ptrdiff_t b) {
    const int super_scales = F == VLM_QUANT_Q4_K || F == VLM_QUANT_Q5_K || F == VLM_QUANT_Q6_K;
    const uint8_t *scales = group + layout->scales_offset + layout->scale_bytes * b;
    return super_scales ? sub_block_scales(scales, F == VLM_QUANT_Q6_K, group + layout->supers_offset + layout->super_bytes * (b / 8))
                        : halves(scales);
}

/// Adds block `b`'s contribution to one output vector from its integer sums h, m and l of the weights' digits times
/// the activation's three digits (scale, sum: the activation block's). Not for Q6_K, whose halves have their own scales.
VNNI_INLINE void finish_block(const uint8_t *group, const vlm_quant_packed_layout_t *layout, const vlm_quant_format F,
                              ptrdiff_t b, __m512 d, __m512i h, __m512i m, __m512i l, float scale, float sum,
                              __m512 *acc, __m512 *minimum_acc) {
    const int has_minimum = F == VLM_QUANT_Q4_1 || F == VLM_QUANT_Q5_1 || F == VLM_QUANT_Q4_K || F == VLM_QUANT_Q5_K;
    const int super_scales = F == VLM_QUANT_Q4_K || F == VLM_QUANT_Q5_K;
    // Σq·v = 2¹⁴·Σq·h + (2⁷·Σq·m + Σq·l); the second part fits 32 bits, the whole may not.
    const __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), _mm512_set1_ps(1 << 14),
                                       _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(m, 7), l)));
    if (has_minimum) {
        const uint8_t *minimums = group + layout->minimums_offset + layout->scale_bytes * b;
        const __m512 minimum = super_scales
            ? sub_block_scales(minimums, 0, group + layout->supers_offset + layout->super_bytes * (b / 8) + 32)
            : halves(minimums);
        *acc = _mm512_fmadd_ps(_mm512_mul_ps(dot, _mm512_set1_ps(scale)), d, *acc);
        // K-quants subtract dmin·min; the others add their minimums.
        *minimum_acc = super_scales ? _mm512_fnmadd_ps(minimum, _mm512_set1_ps(sum), *minimum_acc)
                                    : _mm512_fmadd_ps(minimum, _mm512_set1_ps(sum), *minimum_acc);
    } else {
        const __m512 centred = _mm512_fmsub_ps(dot, _mm512_set1_ps(scale), _mm512_set1_ps((float)layout->offset * sum));
        *acc = _mm512_fmadd_ps(centred, d, *acc);
    }
}

/// Block `b` of one group of format `F` for `M` activation rows, added to the group's `acc` and `minimum_acc`. `F`
/// is a constant in every caller, so each format's product is compiled with its own layout's branches taken.
VNNI_INLINE void block_product(const uint8_t *group, const vlm_quant_packed_layout_t *layout, const vlm_quant_format F,
                               ptrdiff_t b, const int8_t *activations, ptrdiff_t activation_bytes, const int M,
                               __m512 *acc, __m512 *minimum_acc) {
    const int half_scales = F == VLM_QUANT_Q6_K;
    const ptrdiff_t blocks = layout->blocks;
    const __m512 digit_h = _mm512_set1_ps(1 << 14);
    __m512i w[8];
    const uint8_t *values = group + b * layout->value_bytes;
    vlm_quant_prefetch_block_share(group, layout, b);
    if (F != VLM_QUANT_Q8_0) {
        for (int j = 0; j < 4; j++) nibble_pair(values, F, j, &w[j], &w[4 + j]);
    } else {
        for (int j = 0; j < 8; j++) w[j] = _mm512_load_si512((const void *)(values + 64 * j));
    }
    const __m512 d = block_scales(group, layout, F, b);
    // Q6_K: the second half's scales.
    const __m512 second_d = half_scales
        ? sub_block_scales(group + layout->scales_offset + layout->scale_bytes * b + 16, 1,
                           group + layout->supers_offset + layout->super_bytes * (b / 8))
        : d;
    for (int i = 0; i < M; i++) {
        const int8_t *digits = activations + i * activation_bytes + 96 * b;
        const float *scales = (const float *)(activations + i * activation_bytes + 96 * blocks);
        const float scale = scales[b], sum = scales[blocks + b];
        if (half_scales) {
            // One weight scale per 16 elements: the two halves' sums stay apart.
            const float *half_sums = scales + 2 * blocks + 2 * b;
            for (int half = 0; half < 2; half++) {
                __m512i h = _mm512_setzero_si512(), m = _mm512_setzero_si512(), l = _mm512_setzero_si512();
                for (int q = 4 * half; q < 4 * half + 4; q++) {
                    h = _mm512_dpbusd_epi32(h, w[q], digit_group(digits + 4 * q));
                    m = _mm512_dpbusd_epi32(m, w[q], digit_group(digits + 32 + 4 * q));
                    l = _mm512_dpbusd_epi32(l, w[q], digit_group(digits + 64 + 4 * q));
                }
                const __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), digit_h,
                                                   _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(m, 7), l)));
                const __m512 centred = _mm512_fmsub_ps(dot, _mm512_set1_ps(scale),
                                                       _mm512_set1_ps((float)layout->offset * half_sums[half]));
                acc[i] = _mm512_fmadd_ps(centred, half ? second_d : d, acc[i]);
            }
            continue;
        }
        __m512i h = _mm512_setzero_si512(), m = _mm512_setzero_si512(), l = _mm512_setzero_si512();
        for (int q = 0; q < 8; q++) {
            h = _mm512_dpbusd_epi32(h, w[q], digit_group(digits + 4 * q));
            m = _mm512_dpbusd_epi32(m, w[q], digit_group(digits + 32 + 4 * q));
            l = _mm512_dpbusd_epi32(l, w[q], digit_group(digits + 64 + 4 * q));
        }
        finish_block(group, layout, F, b, d, h, m, l, scale, sum, &acc[i], &minimum_acc[i]);
    }
}

/// One activation row (decoding) through `P` groups of nibble values read side by side, block by
/// block: each digit group of the row is broadcast once for all the streams and every stream's sums stay in
/// registers, where through block_product (a block's eight unpacked weight vectors and the row's 24 digit groups in
/// registers) the compiler kept each stream's sums in memory between blocks. The integer sums are exact in any order,
/// so the outputs equal block_product's. Not for Q6_K, whose two half-blocks would need twice the sums, nor Q8_0,
/// whose loads need no unpacking and which ran slower this way.
VNNI_INLINE void streams_product(const uint8_t *const *groups, const int P, const vlm_quant_packed_layout_t *layout,
                                 const vlm_quant_format F, const int8_t *activation, __m512 *out) {
    const ptrdiff_t blocks = layout->blocks;
    const float *scales = (const float *)(activation + 96 * blocks);
    __m512 acc[VLM_QUANT_MAX_STREAMS], minimum_acc[VLM_QUANT_MAX_STREAMS];
    for (int p = 0; p < P; p++) acc[p] = minimum_acc[p] = _mm512_setzero_ps();
    for (ptrdiff_t b = 0; b < blocks; b++) {
        const int8_t *digits = activation + 96 * b;
        __m512i h[VLM_QUANT_MAX_STREAMS], m[VLM_QUANT_MAX_STREAMS], l[VLM_QUANT_MAX_STREAMS];
        for (int p = 0; p < P; p++) {
            vlm_quant_prefetch_block_share(groups[p], layout, b);
            h[p] = m[p] = l[p] = _mm512_setzero_si512();
        }
        for (int j = 0; j < 4; j++) {
            const __m512i dh = digit_group(digits + 4 * j), dm = digit_group(digits + 32 + 4 * j),
                          dl = digit_group(digits + 64 + 4 * j);
            const __m512i eh = digit_group(digits + 4 * (4 + j)), em = digit_group(digits + 32 + 4 * (4 + j)),
                          el = digit_group(digits + 64 + 4 * (4 + j));
            for (int p = 0; p < P; p++) {
                __m512i low, high;
                nibble_pair(groups[p] + b * layout->value_bytes, F, j, &low, &high);
                h[p] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(h[p], low, dh), high, eh);
                m[p] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(m[p], low, dm), high, em);
                l[p] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(l[p], low, dl), high, el);
            }
        }
        for (int p = 0; p < P; p++)
            finish_block(groups[p], layout, F, b, block_scales(groups[p], layout, F, b), h[p], m[p], l[p], scales[b],
                         scales[blocks + b], &acc[p], &minimum_acc[p]);
    }
    for (int p = 0; p < P; p++) out[p] = _mm512_add_ps(acc[p], minimum_acc[p]);
}

/// Output rows of `P` groups for `M` activation rows (`out[p·M + i]`), their blocks read in turn: each group is a
/// stream of its own through memory. On Zen 4 one stream per core leaves too few lines in flight (hardware prefetchers
/// track a stream within a 4 KiB page, ours run a fixed distance ahead; Zen 5 the other way, see vlm_quant_streams):
/// measured on a 2-core Zen 4 VM whose two threads read 33 GB/s, a Q8_0 152,000×896 matrix streamed at 18 GB/s with
/// one stream per core, 20 with two, 23 with four and less again with six or eight; Q5_0 4864×896 at 14, 20 with four.
VNNI_INLINE void group_product(const uint8_t *const *groups, const int P, const vlm_quant_packed_layout_t *layout,
                               const vlm_quant_format F, const int8_t *activations, ptrdiff_t activation_bytes,
                               const int M, __m512 *out) {
    __m512 acc[VLM_QUANT_MAX_STREAMS * VLM_QUANT_MAX_ROWS], minimum_acc[VLM_QUANT_MAX_STREAMS * VLM_QUANT_MAX_ROWS];
    for (int i = 0; i < P * M; i++) acc[i] = minimum_acc[i] = _mm512_setzero_ps();
    for (ptrdiff_t b = 0; b < layout->blocks; b++) {
        for (int p = 0; p < P; p++) {
            block_product(groups[p], layout, F, b, activations, activation_bytes, M, acc + p * M, minimum_acc + p * M);
        }
    }
    for (int i = 0; i < P * M; i++) out[i] = _mm512_add_ps(acc[i], minimum_acc[i]);
}

VNNI_INLINE void group_rows(const uint8_t *group, const vlm_quant_packed_layout_t *layout, const vlm_quant_format F,
                            const int8_t *activations, ptrdiff_t activation_bytes, int M, __m512 *out) {
    switch (M) {
    case 1: group_product(&group, 1, layout, F, activations, activation_bytes, 1, out); break;
    case 2: group_product(&group, 1, layout, F, activations, activation_bytes, 2, out); break;
    case 3: group_product(&group, 1, layout, F, activations, activation_bytes, 3, out); break;
    default: group_product(&group, 1, layout, F, activations, activation_bytes, 4, out); break;
    }
}

/// Stores group `g`'s 16 outputs (fewer in a last, partial group).
VNNI_INLINE void store_group(float *y, ptrdiff_t rows, ptrdiff_t g, __m512 out) {
    const ptrdiff_t left = rows - 16 * g;
    _mm512_mask_storeu_ps(y + 16 * g, left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1), out);
}

VNNI_INLINE void int8_streams_product(const uint8_t *const *groups, const int P, const vlm_quant_packed_layout_t *layout,
                                      const vlm_quant_format F, const int8_t *activation, __m512 *out);

/// One activation row (decoding), fixed point or `int8`, through groups `first_group ..< first_group + groups`: the
/// range as `P` streams, a part of it each, then what does not divide among them one group at a time.
VNNI_INLINE void stream_row_as(const vlm_quant_format F, const int int8, const int P, const void *packed,
                               const vlm_quant_packed_layout_t *layout, ptrdiff_t rows, const void *activation,
                               float *y, ptrdiff_t first_group, ptrdiff_t groups) {
    const uint8_t *start = (const uint8_t *)packed + first_group * layout->group_bytes;
    const ptrdiff_t part = groups / P;
    for (int p = 0; p < P; p++)
        vlm_quant_prefetch_range_start(start + p * part * layout->group_bytes, part * layout->group_bytes);
    for (ptrdiff_t k = 0; k < part; k++) {
        const uint8_t *streams[VLM_QUANT_MAX_STREAMS];
        for (int p = 0; p < P; p++) streams[p] = start + (p * part + k) * layout->group_bytes;
        __m512 out[VLM_QUANT_MAX_STREAMS];
        if (int8) int8_streams_product(streams, P, layout, F, activation, out);
        else if (F == VLM_QUANT_Q6_K || F == VLM_QUANT_Q8_0) group_product(streams, P, layout, F, activation, 0, 1, out);
        else streams_product(streams, P, layout, F, activation, out);
        for (int p = 0; p < P; p++) store_group(y, rows, first_group + p * part + k, out[p]);
    }
    for (ptrdiff_t g = first_group + P * part; g < first_group + groups; g++) {
        const uint8_t *group = (const uint8_t *)packed + g * layout->group_bytes;
        __m512 out;
        if (int8) int8_streams_product(&group, 1, layout, F, activation, &out);
        else group_rows(group, layout, F, activation, 0, 1, &out);
        store_group(y, rows, g, out);
    }
}

/// stream_row_as with 1 or VLM_QUANT_MAX_STREAMS streams, each compiled with its count a constant.
VNNI_INLINE void stream_row(const vlm_quant_format F, const int int8, const int streams, const void *packed,
                            const vlm_quant_packed_layout_t *layout, ptrdiff_t rows, const void *activation, float *y,
                            ptrdiff_t first_group, ptrdiff_t groups) {
    if (streams == 1) stream_row_as(F, int8, 1, packed, layout, rows, activation, y, first_group, groups);
    else stream_row_as(F, int8, VLM_QUANT_MAX_STREAMS, packed, layout, rows, activation, y, first_group, groups);
}

VNNI_INLINE void packed_matmul(const vlm_quant_format F, const void *packed, const vlm_quant_packed_layout_t *layout,
                               ptrdiff_t rows, const void *activations, ptrdiff_t activation_bytes, ptrdiff_t m,
                               float *y, ptrdiff_t y_stride, ptrdiff_t first_group, ptrdiff_t groups, int streams) {
    const uint8_t *start = (const uint8_t *)packed + first_group * layout->group_bytes;
    if (m == 1) {
        stream_row(F, 0, streams, packed, layout, rows, activations, y, first_group, groups);
        return;
    }
    vlm_quant_prefetch_range_start(start, groups * layout->group_bytes);
    for (ptrdiff_t g = first_group; g < first_group + groups; g++) {
        const uint8_t *group = (const uint8_t *)packed + g * layout->group_bytes;
        for (ptrdiff_t i = 0; i < m; i += 4) {
            const int M = m - i < 4 ? (int)(m - i) : 4;
            __m512 out[4];
            group_rows(group, layout, F, (const int8_t *)activations + i * activation_bytes, activation_bytes, M, out);
            for (int r = 0; r < M; r++) store_group(y + (i + r) * y_stride, rows, g, out[r]);
        }
    }
}

VNNI void vlm_quant_packed_matmul_avx512(const void *packed, vlm_quant_format format,
                                         const vlm_quant_packed_layout_t *layout, ptrdiff_t rows,
                                         const void *activations, ptrdiff_t activation_bytes, ptrdiff_t m, float *y,
                                         ptrdiff_t y_stride, ptrdiff_t first_group, ptrdiff_t groups, int streams) {
#define FORMAT_CASE(F) \
    case F: packed_matmul(F, packed, layout, rows, activations, activation_bytes, m, y, y_stride, first_group, groups, streams); break;
    switch (format) {
    PACKED_FORMAT_CASES(FORMAT_CASE)
    default: break;
    }
#undef FORMAT_CASE
}


// The int8 products (MatrixPrecision.int8 on quantized layers): activations as one signed 8-bit digit per element on
// a scale per 32-element block, as llama.cpp's q8_0 activations, so each block of a weight row costs a third of the
// fixed point's instructions. One row streams the groups (stream_row); several rows (a prompt, or decoding sequences
// batched) are compute-bound, so tiles of TILE_ROWS rows of activations by two weight groups share each loaded
// weight vector and each broadcast digit group.

enum { TILE_ROWS = 4 };

VNNI void vlm_quant_int8_activation_avx512(const float *x, ptrdiff_t columns, void *activation) {
    const ptrdiff_t blocks = columns / 32;
    int8_t *digits = activation;
    float *scales = (float *)(digits + 32 * blocks);
    int32_t *sums = (int32_t *)(scales + blocks), *half_sums = sums + blocks;
    for (ptrdiff_t b = 0; b < blocks; b++, x += 32, digits += 32) {
        const __m512 low = _mm512_loadu_ps(x), high = _mm512_loadu_ps(x + 16);
        const int finite = !(_mm512_fpclass_ps_mask(low, 0x99) | _mm512_fpclass_ps_mask(high, 0x99));
        const float largest = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
        if (!finite || largest == 0) {
            scales[b] = finite ? 0 : __builtin_nanf("");
            sums[b] = half_sums[2 * b] = half_sums[2 * b + 1] = 0;
            memset(digits, 0, 32);
            continue;
        }
        scales[b] = largest / 127;
        // round(x·127/max|x|), ties to even (the default rounding mode), as vlm_quantize_rows_int8 rounds.
        const __m512 inverse = _mm512_set1_ps(127 / largest);
        const __m512i l = _mm512_cvtps_epi32(_mm512_mul_ps(low, inverse));
        const __m512i h = _mm512_cvtps_epi32(_mm512_mul_ps(high, inverse));
        _mm_storeu_si128((__m128i *)digits, _mm512_cvtepi32_epi8(l));
        _mm_storeu_si128((__m128i *)(digits + 16), _mm512_cvtepi32_epi8(h));
        half_sums[2 * b] = _mm512_reduce_add_epi32(l);
        half_sums[2 * b + 1] = _mm512_reduce_add_epi32(h);
        sums[b] = half_sums[2 * b] + half_sums[2 * b + 1];
    }
}

/// Block `b`'s integer sums of one weight group times one int8 activation row (`first`; Q6_K's second half in
/// `second`) scaled and added to `acc`, with the group's block scales `d` (`second_d`: Q6_K's second half's) and
/// minimums. The only place the int8 products leave the integers, so one row alone and rows in a tile get the same
/// floats.
VNNI_INLINE __m512 int8_finish_block(const vlm_quant_format F, const vlm_quant_packed_layout_t *layout, ptrdiff_t b,
                                     __m512i first, __m512i second, __m512 d, __m512 second_d, __m512 minimum,
                                     const int8_t *activation, __m512 acc) {
    const int has_minimum = F == VLM_QUANT_Q4_1 || F == VLM_QUANT_Q5_1 || F == VLM_QUANT_Q4_K || F == VLM_QUANT_Q5_K;
    const int super_scales = F == VLM_QUANT_Q4_K || F == VLM_QUANT_Q5_K || F == VLM_QUANT_Q6_K;
    const ptrdiff_t blocks = layout->blocks;
    const float *scales = (const float *)(activation + 32 * blocks);
    const int32_t *sums = (const int32_t *)(scales + blocks), *half_sums = sums + blocks;
    const __m512 scale = _mm512_set1_ps(scales[b]);
    if (F == VLM_QUANT_Q6_K) {
        // Σ(q − 32)·a per half, exact in 32 bits.
        const __m512i low = _mm512_sub_epi32(first, _mm512_set1_epi32(layout->offset * half_sums[2 * b]));
        const __m512i high = _mm512_sub_epi32(second, _mm512_set1_epi32(layout->offset * half_sums[2 * b + 1]));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(low), _mm512_mul_ps(d, scale), acc);
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(high), _mm512_mul_ps(second_d, scale), acc);
    }
    if (has_minimum) {
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(first), _mm512_mul_ps(d, scale), acc);
        // K-quants subtract dmin·min; the others add their minimums.
        const __m512 weighted_sum = _mm512_set1_ps(scales[b] * (float)sums[b]);
        return super_scales ? _mm512_fnmadd_ps(minimum, weighted_sum, acc) : _mm512_fmadd_ps(minimum, weighted_sum, acc);
    }
    const __m512i centred = _mm512_sub_epi32(first, _mm512_set1_epi32(layout->offset * sums[b]));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(centred), _mm512_mul_ps(d, scale), acc);
}

/// One int8 activation row (decoding) through `P` groups read side by side as streams, block by block, unpacking
/// each block's weights in registers (as streams_product does for the fixed point): a row meets each weight once,
/// so unpacking into a buffer first, as the tiles do, would only add traffic.
VNNI_INLINE void int8_streams_product(const uint8_t *const *groups, const int P, const vlm_quant_packed_layout_t *layout,
                                      const vlm_quant_format F, const int8_t *activation, __m512 *out) {
    const int has_minimum = F == VLM_QUANT_Q4_1 || F == VLM_QUANT_Q5_1 || F == VLM_QUANT_Q4_K || F == VLM_QUANT_Q5_K;
    const int super_scales = F == VLM_QUANT_Q4_K || F == VLM_QUANT_Q5_K || F == VLM_QUANT_Q6_K;
    const int half_scales = F == VLM_QUANT_Q6_K;
    __m512 acc[VLM_QUANT_MAX_STREAMS];
    for (int p = 0; p < P; p++) acc[p] = _mm512_setzero_ps();
    for (ptrdiff_t b = 0; b < layout->blocks; b++) {
        __m512i first[VLM_QUANT_MAX_STREAMS], second[VLM_QUANT_MAX_STREAMS];
        for (int p = 0; p < P; p++) {
            vlm_quant_prefetch_block_share(groups[p], layout, b);
            first[p] = second[p] = _mm512_setzero_si512();
        }
        for (int j = 0; j < 4; j++) {
            const __m512i a = digit_group(activation + 32 * b + 4 * j), e = digit_group(activation + 32 * b + 4 * (4 + j));
            for (int p = 0; p < P; p++) {
                const uint8_t *values = groups[p] + b * layout->value_bytes;
                __m512i low, high;
                if (F == VLM_QUANT_Q8_0) {
                    low = _mm512_load_si512((const void *)(values + 64 * j));
                    high = _mm512_load_si512((const void *)(values + 64 * (4 + j)));
                } else {
                    nibble_pair(values, F, j, &low, &high);
                }
                first[p] = _mm512_dpbusd_epi32(first[p], low, a);
                if (half_scales) second[p] = _mm512_dpbusd_epi32(second[p], high, e);
                else first[p] = _mm512_dpbusd_epi32(first[p], high, e);
            }
        }
        for (int p = 0; p < P; p++) {
            const uint8_t *supers = groups[p] + layout->supers_offset + layout->super_bytes * (b / 8);
            const __m512 second_d = half_scales
                ? sub_block_scales(groups[p] + layout->scales_offset + layout->scale_bytes * b + 16, 1, supers)
                : _mm512_setzero_ps();
            const uint8_t *minimums = groups[p] + layout->minimums_offset + layout->scale_bytes * b;
            const __m512 minimum = !has_minimum ? _mm512_setzero_ps()
                                   : super_scales ? sub_block_scales(minimums, 0, supers + 32) : halves(minimums);
            acc[p] = int8_finish_block(F, layout, b, first[p], second[p], block_scales(groups[p], layout, F, b),
                                       second_d, minimum, activation, acc[p]);
        }
    }
    for (int p = 0; p < P; p++) out[p] = acc[p];
}


/// One weight group as the tiles read it: block `b`'s eight vectors of byte values (16 rows × 4 columns each)
/// at `values + 512·b`, and its 16 rows' scales (Q6_K: the first half's, then the second's in `second_scales`) and
/// minimums as fp32 at `+ 16·b`.
typedef struct tile_group {
    const uint8_t *values;
    const float *scales, *second_scales, *minimums;
} tile_group;

/// Bytes of one group's unpacked form (prepare_group).
static ptrdiff_t tile_group_bytes(ptrdiff_t blocks) { return blocks * (512 + 3 * 64); }

/// `group`'s values and scales unpacked once into `scratch` (tile_group_bytes, 64-byte aligned) for every tile of
/// rows that reads it: nibbles into bytes with their high bits added, K-quants' sub-block scales multiplied into
/// fp32 (ggml's d·scale). Q8_0's bytes are read where they are.
VNNI_INLINE tile_group prepare_group(const vlm_quant_format F, const uint8_t *group,
                                       const vlm_quant_packed_layout_t *layout, uint8_t *scratch) {
    const int has_minimum = F == VLM_QUANT_Q4_1 || F == VLM_QUANT_Q5_1 || F == VLM_QUANT_Q4_K || F == VLM_QUANT_Q5_K;
    const int super_scales = F == VLM_QUANT_Q4_K || F == VLM_QUANT_Q5_K || F == VLM_QUANT_Q6_K;
    const ptrdiff_t blocks = layout->blocks;
    float *scales = (float *)(scratch + 512 * blocks), *second = scales + 16 * blocks, *minimums = second + 16 * blocks;
    for (ptrdiff_t b = 0; b < blocks; b++) {
        vlm_quant_prefetch_block_share(group, layout, b);
        const uint8_t *supers = group + layout->supers_offset + layout->super_bytes * (b / 8);
        _mm512_store_ps(scales + 16 * b, block_scales(group, layout, F, b));
        if (F == VLM_QUANT_Q6_K)
            _mm512_store_ps(second + 16 * b,
                            sub_block_scales(group + layout->scales_offset + layout->scale_bytes * b + 16, 1, supers));
        if (has_minimum)
            _mm512_store_ps(minimums + 16 * b,
                            super_scales ? sub_block_scales(group + layout->minimums_offset + layout->scale_bytes * b, 0, supers + 32)
                                         : halves(group + layout->minimums_offset + layout->scale_bytes * b));
        if (F == VLM_QUANT_Q8_0) continue;
        for (int j = 0; j < 4; j++) {
            __m512i low, high;
            nibble_pair(group + b * layout->value_bytes, F, j, &low, &high);
            _mm512_store_si512((void *)(scratch + 512 * b + 64 * j), low);
            _mm512_store_si512((void *)(scratch + 512 * b + 64 * (4 + j)), high);
        }
    }
    return (tile_group){.values = F == VLM_QUANT_Q8_0 ? group : scratch, .scales = scales, .second_scales = second,
                          .minimums = minimums};
}

/// `NR` (1 or 2) groups times `MR` activation rows (`out[i·NR + g]`), block by block: each block's integer sums of
/// weights times digits, exact, then scaled into fp32 accumulators. Q6_K's halves keep their sums apart.
VNNI_INLINE void int8_tile(const vlm_quant_format F, const tile_group *groups, const int NR,
                             const vlm_quant_packed_layout_t *layout, const int8_t *activations,
                             ptrdiff_t activation_bytes, const int MR, __m512 *out) {
    const int has_minimum = F == VLM_QUANT_Q4_1 || F == VLM_QUANT_Q5_1 || F == VLM_QUANT_Q4_K || F == VLM_QUANT_Q5_K;
    const int half_scales = F == VLM_QUANT_Q6_K;
    const ptrdiff_t blocks = layout->blocks;
    __m512 acc[2 * TILE_ROWS];
    for (int t = 0; t < MR * NR; t++) acc[t] = _mm512_setzero_ps();
    for (ptrdiff_t b = 0; b < blocks; b++) {
        __m512i first[2 * TILE_ROWS], second[2 * TILE_ROWS];
        for (int t = 0; t < MR * NR; t++) first[t] = second[t] = _mm512_setzero_si512();
        for (int q = 0; q < 8; q++) {
            __m512i w[2];
            for (int g = 0; g < NR; g++) w[g] = _mm512_load_si512((const void *)(groups[g].values + 512 * b + 64 * q));
            for (int i = 0; i < MR; i++) {
                const __m512i a = digit_group(activations + i * activation_bytes + 32 * b + 4 * q);
                for (int g = 0; g < NR; g++) {
                    const int t = i * NR + g;
                    if (half_scales && q >= 4) second[t] = _mm512_dpbusd_epi32(second[t], w[g], a);
                    else first[t] = _mm512_dpbusd_epi32(first[t], w[g], a);
                }
            }
        }
        for (int g = 0; g < NR; g++) {
            const __m512 d = _mm512_load_ps(groups[g].scales + 16 * b);
            const __m512 second_d = half_scales ? _mm512_load_ps(groups[g].second_scales + 16 * b) : _mm512_setzero_ps();
            const __m512 minimum = has_minimum ? _mm512_load_ps(groups[g].minimums + 16 * b) : _mm512_setzero_ps();
            for (int i = 0; i < MR; i++) {
                const int t = i * NR + g;
                acc[t] = int8_finish_block(F, layout, b, first[t], second[t], d, second_d, minimum,
                                           activations + i * activation_bytes, acc[t]);
            }
        }
    }
    for (int t = 0; t < MR * NR; t++) out[t] = acc[t];
}

VNNI_INLINE void int8_tiles(const vlm_quant_format F, const void *packed, const vlm_quant_packed_layout_t *layout,
                               ptrdiff_t rows, const void *activations, ptrdiff_t activation_bytes, ptrdiff_t m,
                               float *y, ptrdiff_t y_stride, ptrdiff_t first_group, ptrdiff_t groups, uint8_t *scratch) {
    vlm_quant_prefetch_range_start((const uint8_t *)packed + first_group * layout->group_bytes, groups * layout->group_bytes);
    for (ptrdiff_t g = first_group; g < first_group + groups; g += 2) {
        const int NR = g + 1 < first_group + groups ? 2 : 1;
        tile_group pair[2];
        for (int p = 0; p < NR; p++)
            pair[p] = prepare_group(F, (const uint8_t *)packed + (g + p) * layout->group_bytes, layout,
                                    scratch + p * tile_group_bytes(layout->blocks));
        for (ptrdiff_t i = 0; i < m; i += TILE_ROWS) {
            const int MR = m - i < TILE_ROWS ? (int)(m - i) : TILE_ROWS;
            const int8_t *tile = (const int8_t *)activations + i * activation_bytes;
            __m512 out[2 * TILE_ROWS];
#define TILE(R, N) int8_tile(F, pair, N, layout, tile, activation_bytes, R, out)
            if (NR == 2) {
                switch (MR) { case 1: TILE(1, 2); break; case 2: TILE(2, 2); break; case 3: TILE(3, 2); break; default: TILE(4, 2); }
            } else {
                switch (MR) { case 1: TILE(1, 1); break; case 2: TILE(2, 1); break; case 3: TILE(3, 1); break; default: TILE(4, 1); }
            }
#undef TILE
            for (int r = 0; r < MR; r++)
                for (int p = 0; p < NR; p++) store_group(y + (i + r) * y_stride, rows, g + p, out[r * NR + p]);
        }
    }
}

/// This thread's unpacked pair of groups, kept for the thread's life.
static _Thread_local struct {
    uint8_t *bytes;
    ptrdiff_t capacity;
} tile_scratch;

VNNI int vlm_quant_int8_matmul_avx512(const void *packed, vlm_quant_format format,
                                      const vlm_quant_packed_layout_t *layout, ptrdiff_t rows,
                                      const void *activations, ptrdiff_t activation_bytes, ptrdiff_t m, float *y,
                                      ptrdiff_t y_stride, ptrdiff_t first_group, ptrdiff_t groups, int streams) {
    if (m == 1) {
#define FORMAT_CASE(F) case F: stream_row(F, 1, streams, packed, layout, rows, activations, y, first_group, groups); break;
        switch (format) {
        PACKED_FORMAT_CASES(FORMAT_CASE)
        default: break;
        }
#undef FORMAT_CASE
        return 0;
    }
    const ptrdiff_t bytes = 2 * tile_group_bytes(layout->blocks);
    if (bytes > tile_scratch.capacity) {
        uint8_t *grown = aligned_alloc(64, (size_t)bytes);
        if (!grown) return -1;
        free(tile_scratch.bytes);
        tile_scratch.bytes = grown;
        tile_scratch.capacity = bytes;
    }
    uint8_t *scratch = tile_scratch.bytes;
#define FORMAT_CASE(F) \
    case F: int8_tiles(F, packed, layout, rows, activations, activation_bytes, m, y, y_stride, first_group, groups, scratch); break;
    switch (format) {
    PACKED_FORMAT_CASES(FORMAT_CASE)
    default: break;
    }
#undef FORMAT_CASE
    return 0;
}

#endif
