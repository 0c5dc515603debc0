#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quant_packed.h"

// The packed products (see vlm_kernels.h and quant_packed.c) on AVX2 without VNNI, on the same packed layout as
// quant_packed_avx512.c: each 64-byte vector of weights is 16 rows × 4 columns, read here as two 32-byte halves of
// 8 rows each. vpmaddubsw multiplies the unsigned weights by one broadcast 4-byte digit group of the activations
// and adds adjacent pairs into 16 bits; vpmaddwd by ones then sums each row's four products into its own 32-bit
// lane, so the lanes are output rows as on AVX-512. The 16-bit sums cannot saturate: nibble formats' values are at
// most 63 and the digits at most 127 in magnitude (2·63·127 < 2¹⁵, and two such pairs still fit); Q8_0's bytes are
// taken as signed values, their magnitudes times the digits with the weights' signs (2·128·127 < 2¹⁵).

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/// The largest |v| of the fixed point: three digits of at most 127, 64 and 64 in magnitude.
enum { FIXED_POINT_LIMIT = 127 << 14 };

AVX2_INLINE float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_INLINE float max8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/// 32 int32 values (each within int8) as 32 bytes in order.
AVX2_INLINE __m256i narrow(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2 void vlm_quant_activation_avx2(const float *x, ptrdiff_t columns, void *activation) {
    const ptrdiff_t blocks = columns / 32;
    int8_t *digits = activation;
    float *scales = (float *)(digits + 96 * blocks), *sums = scales + blocks, *half_sums = sums + blocks;
    const __m256i limit = _mm256_set1_epi32(FIXED_POINT_LIMIT), negative_limit = _mm256_set1_epi32(-FIXED_POINT_LIMIT);
    const __m256 sign = _mm256_set1_ps(-0.0f), infinity = _mm256_set1_ps(__builtin_inff());
    for (ptrdiff_t b = 0; b < blocks; b++, x += 32, digits += 96) {
        __m256 v[4], magnitude = _mm256_setzero_ps(), special = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            const __m256 a = _mm256_andnot_ps(sign, v[j]);
            magnitude = _mm256_max_ps(magnitude, a);
            // NaN and ±infinity: not less than infinity, or unordered.
            special = _mm256_or_ps(special, _mm256_cmp_ps(a, infinity, _CMP_NLT_UQ));
        }
        const __m256 low = _mm256_add_ps(v[0], v[1]), high = _mm256_add_ps(v[2], v[3]);
        sums[b] = sum8(_mm256_add_ps(low, high));
        half_sums[2 * b] = sum8(low);
        half_sums[2 * b + 1] = sum8(high);
        const int finite = !_mm256_movemask_ps(special);
        const float largest = max8(magnitude);
        if (!finite || largest == 0) {
            scales[b] = finite ? 0 : __builtin_nanf("");
            memset(digits, 0, 96);
            continue;
        }
        scales[b] = largest / FIXED_POINT_LIMIT;
        const __m256 inverse = _mm256_set1_ps(FIXED_POINT_LIMIT / largest);
        __m256i h[4], m[4], l[4];
        for (int j = 0; j < 4; j++) {
            // Round to nearest (even on ties: the default rounding mode), then split into three rounded digits:
            // h·2¹⁴ leaves |r| ≤ 2¹³, then m·2⁷ leaves |l| ≤ 64.
            __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inverse));
            q = _mm256_max_epi32(_mm256_min_epi32(q, limit), negative_limit);
            h[j] = _mm256_srai_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(1 << 13)), 14);
            const __m256i r = _mm256_sub_epi32(q, _mm256_slli_epi32(h[j], 14));
            m[j] = _mm256_srai_epi32(_mm256_add_epi32(r, _mm256_set1_epi32(1 << 6)), 7);
            l[j] = _mm256_sub_epi32(r, _mm256_slli_epi32(m[j], 7));
        }
        _mm256_storeu_si256((__m256i *)digits, narrow(h[0], h[1], h[2], h[3]));
        _mm256_storeu_si256((__m256i *)(digits + 32), narrow(m[0], m[1], m[2], m[3]));
        _mm256_storeu_si256((__m256i *)(digits + 64), narrow(l[0], l[1], l[2], l[3]));
    }
}

/// Eight fp16 scales (or minimums) as floats.
AVX2_INLINE __m256 halves(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/// Eight rows' K-quant sub-block scales (signed for Q6_K) or minimums times their super-block's d or dmin: the fp32
/// product ggml's dequantization forms.
AVX2_INLINE __m256 sub_block_scales(const uint8_t *p, int is_signed, const uint8_t *super) {
    const __m128i bytes = _mm_loadl_epi64((const __m128i *)p);
    const __m256i integers = is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(integers), halves(super));
}

AVX2_INLINE __m256i digit_group(const int8_t *p) {
    int32_t group;
    memcpy(&group, p, 4);
    return _mm256_set1_epi32(group);
}

/// Bytes of `base` where bit j of the 32-bit `mask` is set, as 0xFF; the others 0.
AVX2_INLINE __m256i expand_mask(uint32_t mask) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)mask),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
}

/// Σ over the vectors q in [first, first + count) (count even) of each row's four products w[q]·digits[4q…]: the
/// 16-bit pair sums of two vectors are added before widening.
AVX2_INLINE __m256i dot_unsigned(const __m256i *w, const int8_t *digits, int first, int count) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    for (int q = first; q < first + count; q += 2) {
        const __m256i pair = _mm256_add_epi16(_mm256_maddubs_epi16(w[q], digit_group(digits + 4 * q)),
                                              _mm256_maddubs_epi16(w[q + 1], digit_group(digits + 4 * q + 4)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pair, ones));
    }
    return acc;
}

/// The same for signed weights given as magnitudes `w` and signs `s`.
AVX2_INLINE __m256i dot_signed(const __m256i *w, const __m256i *s, const int8_t *digits) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    for (int q = 0; q < 8; q++) {
        const __m256i pair = _mm256_maddubs_epi16(w[q], _mm256_sign_epi8(digit_group(digits + 4 * q), s[q]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pair, ones));
    }
    return acc;
}

/// Output rows of one half (8 rows) of a group for `M` activation rows.
AVX2_INLINE void half_product(const uint8_t *group, const vlm_quant_packed_layout_t *layout, int half8,
                              const int8_t *activations, ptrdiff_t activation_bytes, const int M, __m256 *out) {
    __m256 acc[4], minimum_acc[4];
    for (int i = 0; i < M; i++) acc[i] = minimum_acc[i] = _mm256_setzero_ps();
    const ptrdiff_t blocks = layout->blocks;
    const __m256i nibble = _mm256_set1_epi8(0xF);
    const __m256 digit_h = _mm256_set1_ps(1 << 14);
    // Q8_0's values are stored plus 128: as signed bytes they are the values themselves, so no offset is subtracted.
    const int signed_values = !layout->nibbles;
    const float offset = signed_values ? 0.0f : (float)layout->offset;
    for (ptrdiff_t b = 0; b < blocks; b++) {
        __m256i w[8], s[8];
        const uint8_t *values = group + b * layout->value_bytes;
        if (!half8) vlm_quant_prefetch_block_share(group, layout, b);
        if (layout->nibbles) {
            for (int j = 0; j < 4; j++) {
                const __m256i packed = _mm256_load_si256((const __m256i *)(values + 64 * j + 32 * half8));
                w[j] = _mm256_and_si256(packed, nibble);
                w[4 + j] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
            }
            // Fifth (and sixth) bits: adding 16 (32) where a plane's mask bit is set.
            for (int plane = 0; plane < layout->high_bits; plane++) {
                const __m256i bit = _mm256_set1_epi8((char)(16 << plane));
                for (int q = 0; q < 8; q++) {
                    uint32_t mask;
                    memcpy(&mask, values + 256 + 64 * plane + 8 * q + 4 * half8, 4);
                    w[q] = _mm256_add_epi8(w[q], _mm256_and_si256(expand_mask(mask), bit));
                }
            }
        } else {
            const __m256i flip = _mm256_set1_epi8((char)0x80);
            for (int j = 0; j < 8; j++) {
                s[j] = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(values + 64 * j + 32 * half8)), flip);
                w[j] = _mm256_abs_epi8(s[j]);
            }
        }
        const uint8_t *block_scales = group + layout->scales_offset + layout->scale_bytes * b;
        const uint8_t *supers = group + layout->supers_offset + layout->super_bytes * (b / 8) + 16 * half8;
        // Q6_K: the two halves' scales.
        const __m256 d = layout->super_scales ? sub_block_scales(block_scales + 8 * half8, layout->half_scales, supers)
                                              : halves(block_scales + 16 * half8);
        const __m256 second_d = layout->half_scales ? sub_block_scales(block_scales + 16 + 8 * half8, 1, supers) : d;
        for (int i = 0; i < M; i++) {
            const int8_t *digits = activations + i * activation_bytes + 96 * b;
            const float *scales = (const float *)(activations + i * activation_bytes + 96 * blocks);
            const float scale = scales[b], sum = scales[blocks + b];
            if (layout->half_scales) {
                // One weight scale per 16 elements: the two halves' sums stay apart.
                const float *half_sums = scales + 2 * blocks + 2 * b;
                for (int half = 0; half < 2; half++) {
                    const __m256i h = dot_unsigned(w, digits, 4 * half, 4);
                    const __m256i m = dot_unsigned(w, digits + 32, 4 * half, 4);
                    const __m256i l = dot_unsigned(w, digits + 64, 4 * half, 4);
                    const __m256 dot = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), digit_h,
                                                       _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_slli_epi32(m, 7), l)));
                    const __m256 centred = _mm256_fmsub_ps(dot, _mm256_set1_ps(scale),
                                                           _mm256_set1_ps(offset * half_sums[half]));
                    acc[i] = _mm256_fmadd_ps(centred, half ? second_d : d, acc[i]);
                }
                continue;
            }
            __m256i h, m, l;
            if (signed_values) {
                h = dot_signed(w, s, digits);
                m = dot_signed(w, s, digits + 32);
                l = dot_signed(w, s, digits + 64);
            } else {
                h = dot_unsigned(w, digits, 0, 8);
                m = dot_unsigned(w, digits + 32, 0, 8);
                l = dot_unsigned(w, digits + 64, 0, 8);
            }
            // Σq·v = 2¹⁴·Σq·h + (2⁷·Σq·m + Σq·l); the second part fits 32 bits, the whole may not.
            const __m256 dot = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), digit_h,
                                               _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_slli_epi32(m, 7), l)));
            if (layout->has_minimum) {
                const uint8_t *block_minimums = group + layout->minimums_offset + layout->scale_bytes * b;
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dot, _mm256_set1_ps(scale)), d, acc[i]);
                // K-quants subtract dmin·min; the others add their minimums.
                minimum_acc[i] = layout->super_scales
                    ? _mm256_fnmadd_ps(sub_block_scales(block_minimums + 8 * half8, 0, supers + 32), _mm256_set1_ps(sum),
                                       minimum_acc[i])
                    : _mm256_fmadd_ps(halves(block_minimums + 16 * half8), _mm256_set1_ps(sum), minimum_acc[i]);
            } else {
                const __m256 centred = _mm256_fmsub_ps(dot, _mm256_set1_ps(scale), _mm256_set1_ps(offset * sum));
                acc[i] = _mm256_fmadd_ps(centred, d, acc[i]);
            }
        }
    }
    for (int i = 0; i < M; i++) out[i] = _mm256_add_ps(acc[i], minimum_acc[i]);
}

AVX2 static void half_rows(const uint8_t *group, const vlm_quant_packed_layout_t *layout, int half8,
                           const int8_t *activations, ptrdiff_t activation_bytes, int M, __m256 *out) {
    switch (M) {
    case 1: half_product(group, layout, half8, activations, activation_bytes, 1, out); break;
    case 2: half_product(group, layout, half8, activations, activation_bytes, 2, out); break;
    case 3: half_product(group, layout, half8, activations, activation_bytes, 3, out); break;
    default: half_product(group, layout, half8, activations, activation_bytes, 4, out); break;
    }
}

AVX2 void vlm_quant_packed_matmul_avx2(const void *packed, const vlm_quant_packed_layout_t *layout, ptrdiff_t rows,
                                       const void *activations, ptrdiff_t activation_bytes, ptrdiff_t m, float *y,
                                       ptrdiff_t y_stride, ptrdiff_t first_group, ptrdiff_t groups) {
    vlm_quant_prefetch_range_start((const uint8_t *)packed + first_group * layout->group_bytes, groups * layout->group_bytes);
    for (ptrdiff_t g = first_group; g < first_group + groups; g++) {
        const uint8_t *group = (const uint8_t *)packed + g * layout->group_bytes;
        for (int half8 = 0; half8 < 2; half8++) {
            const ptrdiff_t first_row = 16 * g + 8 * half8, left = rows - first_row;
            if (left <= 0) break;
            for (ptrdiff_t i = 0; i < m; i += 4) {
                const int M = m - i < 4 ? (int)(m - i) : 4;
                __m256 out[4];
                half_rows(group, layout, half8, (const int8_t *)activations + i * activation_bytes, activation_bytes, M,
                          out);
                for (int r = 0; r < M; r++) {
                    float *destination = y + (i + r) * y_stride + first_row;
                    if (left >= 8) {
                        _mm256_storeu_ps(destination, out[r]);
                    } else {
                        float lanes[8];
                        _mm256_storeu_ps(lanes, out[r]);
                        memcpy(destination, lanes, (size_t)left * sizeof(float));
                    }
                }
            }
        }
    }
}

#endif
