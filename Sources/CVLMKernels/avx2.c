#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

// AVX2 and FMA versions of the kernels a decoding step spends its time in, for CPUs without AVX-512; dispatch.c
// calls them only after checking the CPU. Like avx512.c, each function opts into the instruction set itself.
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

enum { LANES = 8 };

AVX2_INLINE float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/// Lanes below `remaining` all ones (for maskload and maskstore).
AVX2_INLINE __m256i tail_mask(ptrdiff_t remaining) {
    const int n = remaining >= LANES ? LANES : (int)remaining;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// e^x for x ≤ 0 as scalar.c's exp_nonpositive computes it (Cody–Waite reduction, Cephes' polynomial): below -87.3
/// the result would be subnormal and is 0; NaN stays NaN.
AVX2_INLINE __m256 exp_nonpositive(__m256 x) {
    const __m256 lowest = _mm256_set1_ps(-87.3f);
    // "Not less than" holds for NaN, and max returns its second operand for NaN.
    const __m256 representable = _mm256_cmp_ps(x, lowest, _CMP_NLT_UQ);
    const __m256 clamped = _mm256_max_ps(lowest, x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(clamped, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), clamped);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    // 2ⁿ for -126 ≤ n ≤ 0 (n is NaN only where y is, which the product keeps).
    const __m256 power = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    return _mm256_and_ps(representable, _mm256_mul_ps(y, power));
}

/// Rows of keys or values ahead of the one being read that are prefetched (see avx512.c).
enum { PREFETCH_ROWS = 8 };

/// Feature vectors of the value product kept in registers at a time.
enum { VALUE_VECTORS = 8 };

/// Eight keys' or values' features from `row` (floats, or with `half` IEEE halves widened exactly, F16C), element
/// `at` on, the lanes from `count` on zero.
AVX2_INLINE __m256 load_elements(const void *row, ptrdiff_t at, ptrdiff_t count, const int half) {
    if (!half) {
        const float *floats = (const float *)row + at;
        return count >= LANES ? _mm256_loadu_ps(floats) : _mm256_maskload_ps(floats, tail_mask(count));
    }
    const uint16_t *halves = (const uint16_t *)row + at;
    if (count >= LANES) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)halves));
    uint16_t part[LANES] = {0};
    memcpy(part, halves, (size_t)count * sizeof(uint16_t));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)part));
}

/// Row `index` of rows `stride` elements apart (floats, or with `half` halves).
AVX2_INLINE const void *element_row(const void *base, ptrdiff_t index, ptrdiff_t stride, const int half) {
    return (const char *)base + index * stride * (half ? 2 : 4);
}

/// Prefetches `count` elements from `row`.
AVX2_INLINE void prefetch_elements(const void *row, ptrdiff_t count, const int half) {
    for (ptrdiff_t offset = 0; offset < count * (half ? 2 : 4); offset += 64)
        _mm_prefetch((const char *)row + offset, _MM_HINT_T0);
}

/// vlm_attention_partial_avx2 with its keys' and values' element type a constant (floats, or `half` halves read
/// where they lie), each compiled on its own.
AVX2_INLINE int attention_partial(const vlm_attention_problem *p, ptrdiff_t first_key, ptrdiff_t key_count,
                                  float *maxima, float *sums, float *outputs, const int half) {
    const ptrdiff_t d = p->head_dim, width = (key_count + LANES - 1) / LANES * LANES;
    float *scores = vlm_attention_partial_scratch((size_t)width * sizeof(float));
    if (!scores) return -1;
    const void *key = element_row(half ? (const void *)p->half_key : (const void *)p->key, first_key, p->key_stride, half);
    const void *value = element_row(half ? (const void *)p->half_value : (const void *)p->value, first_key,
                                    p->value_stride, half);
    const ptrdiff_t full = d / LANES * LANES;
    const __m256i tail = tail_mask(d - full);
    for (ptrdiff_t i = 0; i < p->query_length; i++) {
        const float *q = p->query + i * p->query_stride;
        // Scores: one dot product per key, eight features at a time.
        __m256 max_vector = _mm256_set1_ps(-INFINITY);
        for (ptrdiff_t j = 0; j < key_count; j++) {
            const void *k = element_row(key, j, p->key_stride, half);
            if (i == 0) prefetch_elements(element_row(k, PREFETCH_ROWS, p->key_stride, half), d, half);
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            ptrdiff_t c = 0;
            for (; c + 2 * LANES <= full; c += 2 * LANES) {
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), load_elements(k, c, LANES, half), acc0);
                acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c + LANES), load_elements(k, c + LANES, LANES, half), acc1);
            }
            if (c < full) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), load_elements(k, c, LANES, half), acc0);
            if (full < d)
                acc1 = _mm256_fmadd_ps(_mm256_maskload_ps(q + full, tail), load_elements(k, full, d - full, half), acc1);
            scores[j] = sum8(_mm256_add_ps(acc0, acc1)) * p->scale;
        }
        for (ptrdiff_t j = 0; j < key_count; j += LANES) {
            const __m256i m = tail_mask(key_count - j);
            const __m256 s = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(scores + j, m),
                                              _mm256_castsi256_ps(m));
            max_vector = _mm256_max_ps(max_vector, s);
        }
        __m128 mx = _mm_max_ps(_mm256_castps256_ps128(max_vector), _mm256_extractf128_ps(max_vector, 1));
        mx = _mm_max_ps(mx, _mm_movehl_ps(mx, mx));
        mx = _mm_max_ss(mx, _mm_movehdup_ps(mx));
        const float max = _mm_cvtss_f32(mx);
        // Exponentials in place, summed in double as scalar.c does.
        const __m256 max_broadcast = _mm256_set1_ps(max);
        double sum = 0;
        for (ptrdiff_t j = 0; j < key_count; j += LANES) {
            const __m256i m = tail_mask(key_count - j);
            const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(scores + j, m), max_broadcast));
            _mm256_maskstore_ps(scores + j, m, e);
        }
        for (ptrdiff_t j = 0; j < key_count; j++) sum += scores[j];
        // out = Σ_j e_j · v_j, up to VALUE_VECTORS feature vectors in registers.
        float *out = outputs + i * d;
        for (ptrdiff_t c0 = 0; c0 < d; c0 += VALUE_VECTORS * LANES) {
            const ptrdiff_t span = d - c0 < VALUE_VECTORS * LANES ? d - c0 : VALUE_VECTORS * LANES;
            const int vectors = (int)((span + LANES - 1) / LANES);
            const __m256i last = tail_mask(span - (vectors - 1) * LANES);
            __m256 acc[VALUE_VECTORS];
            for (int n = 0; n < vectors; n++) acc[n] = _mm256_setzero_ps();
            for (ptrdiff_t j = 0; j < key_count; j++) {
                const void *v = element_row(value, j, p->value_stride, half);
                if (i == 0 && c0 == 0) prefetch_elements(element_row(v, PREFETCH_ROWS, p->value_stride, half), d, half);
                const __m256 e = _mm256_set1_ps(scores[j]);
                for (int n = 0; n < vectors - 1; n++)
                    acc[n] = _mm256_fmadd_ps(e, load_elements(v, c0 + n * LANES, LANES, half), acc[n]);
                acc[vectors - 1] = _mm256_fmadd_ps(
                    e, load_elements(v, c0 + (vectors - 1) * LANES, span - (vectors - 1) * LANES, half), acc[vectors - 1]);
            }
            for (int n = 0; n < vectors - 1; n++) _mm256_storeu_ps(out + c0 + n * LANES, acc[n]);
            _mm256_maskstore_ps(out + c0 + (vectors - 1) * LANES, last, acc[vectors - 1]);
        }
        maxima[i] = max;
        sums[i] = (float)sum;
    }
    return 0;
}

AVX2 int vlm_attention_partial_avx2(const vlm_attention_problem *p, ptrdiff_t first_key, ptrdiff_t key_count,
                                    float *maxima, float *sums, float *outputs) {
    return p->half_key ? attention_partial(p, first_key, key_count, maxima, sums, outputs, 1)
                       : attention_partial(p, first_key, key_count, maxima, sums, outputs, 0);
}

AVX2 void vlm_floats_to_halves_avx2(const float *x, ptrdiff_t count, uint16_t *y) {
    ptrdiff_t i = 0;
    for (; i + LANES <= count; i += LANES)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < count) {
        uint16_t part[LANES];
        _mm_storeu_si128((__m128i *)part, _mm256_cvtps_ph(_mm256_maskload_ps(x + i, tail_mask(count - i)),
                                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        memcpy(y + i, part, (size_t)(count - i) * sizeof(uint16_t));
    }
}

AVX2 void vlm_halves_to_floats_avx2(const uint16_t *x, ptrdiff_t count, float *y) {
    for (ptrdiff_t i = 0; i < count; i += LANES) {
        const ptrdiff_t n = count - i < LANES ? count - i : LANES;
        const __m256 floats = load_elements(x, i, n, 1);
        if (n == LANES) _mm256_storeu_ps(y + i, floats);
        else _mm256_maskstore_ps(y + i, tail_mask(n), floats);
    }
}

/// vlm_argmax_avx512's two passes, eight lanes at a time.
AVX2 ptrdiff_t vlm_argmax_avx2(const float *x, ptrdiff_t count) {
    const __m256 lowest = _mm256_set1_ps(-INFINITY);
    __m256 largest[4] = {lowest, lowest, lowest, lowest};
    int unordered = 0;
    ptrdiff_t i = 0;
    for (; i + 4 * LANES <= count; i += 4 * LANES) {
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + i + k * LANES);
        unordered |= _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(v[0], v[1], _CMP_UNORD_Q),
                                                     _mm256_cmp_ps(v[2], v[3], _CMP_UNORD_Q)));
        for (int k = 0; k < 4; k++) largest[k] = _mm256_max_ps(largest[k], v[k]);
    }
    for (; i < count; i += LANES) {
        const __m256i m = tail_mask(count - i);
        const __m256 v = _mm256_blendv_ps(lowest, _mm256_maskload_ps(x + i, m), _mm256_castsi256_ps(m));
        unordered |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        largest[0] = _mm256_max_ps(largest[0], v);
    }
    __m256 all = _mm256_max_ps(_mm256_max_ps(largest[0], largest[1]), _mm256_max_ps(largest[2], largest[3]));
    __m128 half = _mm_max_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
    half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    half = _mm_max_ss(half, _mm_movehdup_ps(half));
    const __m256 target = _mm256_set1_ps(_mm_cvtss_f32(half));
    for (i = 0; i < count; i += LANES) {
        const __m256i m = tail_mask(count - i);
        const __m256 v = _mm256_maskload_ps(x + i, m);
        const __m256 found = unordered ? _mm256_cmp_ps(v, v, _CMP_UNORD_Q) : _mm256_cmp_ps(v, target, _CMP_EQ_OQ);
        const int hit = _mm256_movemask_ps(found) & _mm256_movemask_ps(_mm256_castsi256_ps(m));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    return 0;
}

AVX2 void vlm_gated_silu_avx2(const float *x, ptrdiff_t rows, ptrdiff_t width, float *y) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (ptrdiff_t r = 0; r < rows; r++) {
        const float *gate = x + 2 * r * width, *up = gate + width;
        float *out = y + r * width;
        for (ptrdiff_t c = 0; c < width; c += LANES) {
            const __m256i m = tail_mask(width - c);
            const __m256 g = _mm256_maskload_ps(gate + c, m);
            // silu(g) = g / (1 + e^-g), from t = e^-|g| ≤ 1 so that the exponential never overflows:
            // g / (1 + t) for g ≥ 0, g·t / (1 + t) below.
            const __m256 t = exp_nonpositive(_mm256_or_ps(g, sign));
            const __m256 negative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
            const __m256 numerator = _mm256_blendv_ps(g, _mm256_mul_ps(g, t), negative);
            const __m256 silu = _mm256_div_ps(numerator, _mm256_add_ps(one, t));
            _mm256_maskstore_ps(out + c, m, _mm256_mul_ps(silu, _mm256_maskload_ps(up + c, m)));
        }
    }
}

#endif
