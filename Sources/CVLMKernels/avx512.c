#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

// The package compiles for baseline x86-64, so every function here opts into AVX-512 itself; dispatch.c calls
// them only after checking the CPU.
#define AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512dq,avx512bw,avx512vl,fma")))

/// Query rows per block: 6 rows × 4 vectors of accumulators plus operands fit the 32 zmm registers.
enum { ROWS = 6, MAX_VECTORS = 4, LANES = 16 };

AVX512_INLINE __mmask16 tail_mask(ptrdiff_t remaining) {
    return remaining >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << remaining) - 1);
}

/// e^x for x ≤ 0 (after max subtraction) within 2 ulp: Cody–Waite reduction x = n·ln2 + r with |r| ≤ ln2/2, Cephes'
/// degree-6 polynomial for e^r, then scaling by 2^n. Arguments below -104 (e^x is not a float any more, and -inf for
/// masked keys) give exactly 0.
AVX512_INLINE __m512 exp_nonpositive(__m512 x) {
    const __m512 lowest = _mm512_set1_ps(-104.0f);
    // Written so that NaN propagates: "not less than" holds for NaN, and max returns its second operand for NaN.
    __mmask16 representable = _mm512_cmp_ps_mask(x, lowest, _CMP_NLT_UQ);
    __m512 clamped = _mm512_max_ps(lowest, x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), clamped);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(representable, _mm512_scalef_ps(y, n));
}

/// scores[r·score_stride + 16·n + lane] = q_r · kᵀ[:, 16·n + lane] for `rows_in_block` query rows and `vectors`
/// vectors of 16 keys, with kᵀ packed as `head_dim` rows of `packed_width` floats.
AVX512_INLINE void scores_tile(const int rows_in_block, const int vectors, const float *const *q, ptrdiff_t head_dim,
                               const float *keys_transposed, ptrdiff_t packed_width, float *scores,
                               ptrdiff_t score_stride) {
    __m512 acc[ROWS][MAX_VECTORS];
    for (int r = 0; r < rows_in_block; r++)
        for (int n = 0; n < vectors; n++) acc[r][n] = _mm512_setzero_ps();
    for (ptrdiff_t c = 0; c < head_dim; c++) {
        __m512 k[MAX_VECTORS];
        for (int n = 0; n < vectors; n++) k[n] = _mm512_load_ps(keys_transposed + c * packed_width + n * LANES);
        for (int r = 0; r < rows_in_block; r++) {
            __m512 a = _mm512_set1_ps(q[r][c]);
            for (int n = 0; n < vectors; n++) acc[r][n] = _mm512_fmadd_ps(a, k[n], acc[r][n]);
        }
    }
    for (int r = 0; r < rows_in_block; r++)
        for (int n = 0; n < vectors; n++) _mm512_store_ps(scores + r * score_stride + n * LANES, acc[r][n]);
}

/// Rows of keys or values ahead of the one being read that are prefetched; each row is a few cache lines far
/// from the next (the other heads lie between), which the hardware prefetchers follow poorly.
enum { PREFETCH_ROWS = 8 };

/// Rows ahead for prefetches into L2 where rows come from memory (see scores_unpacked).
enum { PREFETCH_FAR_ROWS = 32 };



/// 16 keys' or values' features from `row` (floats, or with `half` IEEE halves widened exactly), element `at` on,
/// under `mask`.
AVX512_INLINE __m512 load_elements(const void *row, ptrdiff_t at, __mmask16 mask, const int half) {
    return half ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + at))
                : _mm512_maskz_loadu_ps(mask, (const float *)row + at);
}

/// Row `index` of rows `stride` elements apart (floats, or with `half` halves).
AVX512_INLINE const void *element_row(const void *base, ptrdiff_t index, ptrdiff_t stride, const int half) {
    return (const char *)base + index * stride * (half ? 2 : 4);
}

/// Prefetches `count` elements from `row` into L1 (`hint` _MM_HINT_T0) or L2 (_MM_HINT_T1); a prefetch past the end
/// of an array is dropped, not a fault.
AVX512_INLINE void prefetch_elements(const void *row, ptrdiff_t count, const int half, const int hint) {
    for (ptrdiff_t offset = 0; offset < count * (half ? 2 : 4); offset += 64) {
        if (hint == _MM_HINT_T0) _mm_prefetch((const char *)row + offset, _MM_HINT_T0);
        else _mm_prefetch((const char *)row + offset, _MM_HINT_T1);
    }
}

/// A value tile's accumulators: zero, or with `rescale` each row's output so far times its factor.
AVX512_INLINE void begin_value_sums(const int rows_in_block, const int vectors, __mmask16 last, const float *rescale,
                                    float *const *out, __m512 acc[ROWS][MAX_VECTORS]) {
    for (int r = 0; r < rows_in_block; r++) {
        const __m512 factor = rescale ? _mm512_set1_ps(rescale[r]) : _mm512_setzero_ps();
        for (int n = 0; n < vectors - 1; n++)
            acc[r][n] = rescale ? _mm512_mul_ps(_mm512_loadu_ps(out[r] + n * LANES), factor) : _mm512_setzero_ps();
        acc[r][vectors - 1] = rescale ? _mm512_mul_ps(_mm512_maskz_loadu_ps(last, out[r] + (vectors - 1) * LANES), factor)
                                      : _mm512_setzero_ps();
    }
}

AVX512_INLINE void store_value_sums(const int rows_in_block, const int vectors, __mmask16 last,
                                    __m512 acc[ROWS][MAX_VECTORS], float *const *out) {
    for (int r = 0; r < rows_in_block; r++) {
        for (int n = 0; n < vectors - 1; n++) _mm512_storeu_ps(out[r] + n * LANES, acc[r][n]);
        _mm512_mask_storeu_ps(out[r] + (vectors - 1) * LANES, last, acc[r][vectors - 1]);
    }
}

/// out_r[c0 ..] = Σ_j p_r[j] · v_j[c0 ..] over `keys` keys, for `vectors` vectors of 16 features, the last one
/// masked by `last`; values are floats, or with `half` halves. With `rescale`, the sum adds to out_r[c0 ..]·rescale[r]
/// instead of replacing it.
AVX512_INLINE void values_tile(const int rows_in_block, const int vectors, const int half, const float *probabilities,
                               ptrdiff_t packed_width, ptrdiff_t keys, const void *v, ptrdiff_t value_stride,
                               __mmask16 last, const float *rescale, float *const *out) {
    __m512 acc[ROWS][MAX_VECTORS];
    begin_value_sums(rows_in_block, vectors, last, rescale, out, acc);
    for (ptrdiff_t j = 0; j < keys; j++) {
        const void *row = element_row(v, j, value_stride, half);
        prefetch_elements(element_row(v, j + PREFETCH_ROWS, value_stride, half), vectors * LANES, half, _MM_HINT_T0);
        __m512 value[MAX_VECTORS];
        for (int n = 0; n < vectors - 1; n++) value[n] = load_elements(row, n * LANES, (__mmask16)0xFFFF, half);
        value[vectors - 1] = load_elements(row, (vectors - 1) * LANES, last, half);
        for (int r = 0; r < rows_in_block; r++) {
            __m512 p = _mm512_set1_ps(probabilities[r * packed_width + j]);
            for (int n = 0; n < vectors; n++) acc[r][n] = _mm512_fmadd_ps(p, value[n], acc[r][n]);
        }
    }
    store_value_sums(rows_in_block, vectors, last, acc, out);
}

// Both tiles are specialized for every (rows, vectors) pair so that their accumulators live in registers.
#define TILE_CASES(CASE, R) CASE(R, 1) CASE(R, 2) CASE(R, 3) CASE(R, 4)
#define ALL_TILE_CASES(CASE) TILE_CASES(CASE, 1) TILE_CASES(CASE, 2) TILE_CASES(CASE, 3) \
    TILE_CASES(CASE, 4) TILE_CASES(CASE, 5) TILE_CASES(CASE, 6)

AVX512 static void scores_block(int rows_in_block, int vectors, const float *const *q, ptrdiff_t head_dim,
                                const float *keys_transposed, ptrdiff_t packed_width, float *scores,
                                ptrdiff_t score_stride) {
#define SCORES_CASE(R, N) \
    case R * 8 + N: scores_tile(R, N, q, head_dim, keys_transposed, packed_width, scores, score_stride); break;
    switch (rows_in_block * 8 + vectors) { ALL_TILE_CASES(SCORES_CASE) }
#undef SCORES_CASE
}

AVX512 static void values_block(int rows_in_block, int vectors, int half, const float *probabilities,
                                ptrdiff_t packed_width, ptrdiff_t keys, const void *v, ptrdiff_t value_stride,
                                __mmask16 last, const float *rescale, float *const *out) {
#define VALUES_CASE(R, N) \
    case R * 8 + N: values_tile(R, N, 0, probabilities, packed_width, keys, v, value_stride, last, rescale, out); break;
#define HALF_VALUES_CASE(R, N) \
    case R * 8 + N: values_tile(R, N, 1, probabilities, packed_width, keys, v, value_stride, last, rescale, out); break;
    if (half) {
        switch (rows_in_block * 8 + vectors) { ALL_TILE_CASES(HALF_VALUES_CASE) }
    } else {
        switch (rows_in_block * 8 + vectors) { ALL_TILE_CASES(VALUES_CASE) }
    }
#undef VALUES_CASE
#undef HALF_VALUES_CASE
}

/// out[r][0 ..< d] = Σ_j probabilities[r][j] · v[j] over `keys` value rows (`value_stride` floats apart) for the
/// `rows` probability rows (`packed_width` floats apart), a tile of feature vectors at a time. With `rescale`, the
/// sums add to out[r]·rescale[r].
AVX512 static void values_rows(int rows, const float *probabilities, ptrdiff_t packed_width, ptrdiff_t keys,
                               const void *v, int half, ptrdiff_t value_stride, ptrdiff_t d, const float *rescale,
                               float *const *out) {
    const ptrdiff_t feature_vectors = (d + LANES - 1) / LANES;
    for (ptrdiff_t c0 = 0; c0 < feature_vectors; c0 += MAX_VECTORS) {
        ptrdiff_t remaining = feature_vectors - c0;
        int vectors = (int)(remaining < MAX_VECTORS ? remaining : MAX_VECTORS);
        __mmask16 last = tail_mask(d - (c0 + vectors - 1) * LANES);
        float *out_chunk[ROWS];
        for (int r = 0; r < rows; r++) out_chunk[r] = out[r] + c0 * LANES;
        values_block(rows, vectors, half, probabilities, packed_width, keys, element_row(v, c0 * LANES, 1, half),
                     value_stride, last, rescale, out_chunk);
    }
}

/// The largest of the raw dot products row[0 ..< visible] times `scale`, plus the key mask (0 or -inf per key, or
/// NULL). With a mask, or a scale that is not positive, the scaled and masked scores are written back and `*pending`
/// is 1. Otherwise the row stays raw and `*pending` is `scale`, which exponentiate_scores multiplies as it reads:
/// rounding is monotonic, so the rounded product of the largest score is the largest rounded product, and the row
/// is written once instead of twice (the key-tiled kernel's softmax passes were 7% of OWLv2's samples).
AVX512 static float scale_scores(float *row, ptrdiff_t visible, float scale, const float *mask_bias, float *pending) {
    const __m512 scale_vector = _mm512_set1_ps(scale);
    __m512 max_vector = _mm512_set1_ps(-INFINITY);
    if (!mask_bias && scale > 0) {
        *pending = scale;
        ptrdiff_t j = 0;
        for (; j + LANES <= visible; j += LANES) max_vector = _mm512_max_ps(max_vector, _mm512_loadu_ps(row + j));
        if (j < visible) {
            const __mmask16 m = tail_mask(visible - j);
            max_vector = _mm512_mask_max_ps(max_vector, m, max_vector, _mm512_maskz_loadu_ps(m, row + j));
        }
        return _mm512_reduce_max_ps(max_vector) * scale;
    }
    *pending = 1;
    for (ptrdiff_t j = 0; j < visible; j += LANES) {
        __mmask16 m = tail_mask(visible - j);
        __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), scale_vector);
        if (mask_bias) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, mask_bias + j));
        _mm512_mask_storeu_ps(row + j, m, s);
        max_vector = _mm512_mask_max_ps(max_vector, m, max_vector, s);
    }
    return _mm512_reduce_max_ps(max_vector);
}

/// row[j] = e^(row[j]·pending − max) for j < visible, in place (the product rounded before the difference, as
/// scale_scores' stored scores are); returns their sum.
AVX512 static float exponentiate_scores(float *row, ptrdiff_t visible, float max, float pending) {
    const __m512 max_broadcast = _mm512_set1_ps(max), scale = _mm512_set1_ps(pending);
    __m512 sum_vector = _mm512_setzero_ps();
    ptrdiff_t j = 0;
    for (; j + LANES <= visible; j += LANES) {
        const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(row + j), scale), max_broadcast));
        _mm512_storeu_ps(row + j, e);
        sum_vector = _mm512_add_ps(sum_vector, e);
    }
    if (j < visible) {
        const __mmask16 m = tail_mask(visible - j);
        __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), scale), max_broadcast));
        e = _mm512_maskz_mov_ps(m, e);
        _mm512_mask_storeu_ps(row + j, m, e);
        sum_vector = _mm512_add_ps(sum_vector, e);
    }
    return _mm512_reduce_add_ps(sum_vector);
}

/// Turns raw dot products row[0 ..< visible] into probabilities in place: scale, add the key mask (0 or -inf per key,
/// or NULL), subtract the max, exponentiate, normalize. A row with no visible key becomes uniform over all
/// `key_length` keys. Returns how many leading entries the value product must read.
AVX512 static ptrdiff_t softmax_row(float *row, ptrdiff_t visible, ptrdiff_t key_length, float scale,
                                    const float *mask_bias) {
    float pending;
    const float max = scale_scores(row, visible, scale, mask_bias, &pending);
    if (max == -INFINITY) {
        const __m512 uniform = _mm512_set1_ps(1.0f / (float)key_length);
        for (ptrdiff_t j = 0; j < key_length; j += LANES) _mm512_mask_storeu_ps(row + j, tail_mask(key_length - j), uniform);
        return key_length;
    }
    const __m512 inverse = _mm512_set1_ps(1.0f / exponentiate_scores(row, visible, max, pending));
    for (ptrdiff_t j = 0; j < visible; j += LANES) {
        __mmask16 m = tail_mask(visible - j);
        _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), inverse));
    }
    return visible;
}

/// The sums of a0, a1, a2 and a3's lanes, in that order: one transposing reduction for four dot products instead of
/// four reductions of eight operations each.
AVX512_INLINE __m128 sum_lanes4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    // Each 128-bit lane: its four floats of a0, of a1, of a2 and of a3 summed.
    const __m512 lanes = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 halves = _mm512_add_ps(lanes, _mm512_shuffle_f32x4(lanes, lanes, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_castps512_ps128(_mm512_add_ps(halves, _mm512_shuffle_f32x4(halves, halves, _MM_SHUFFLE(2, 3, 0, 1))));
}

/// q·k over head_dim features (`full` of them in whole vectors, the rest under `tail`).
AVX512_INLINE __m512 dot_lanes(const float *q, const float *k, ptrdiff_t full, ptrdiff_t head_dim, __mmask16 tail) {
    __m512 acc = _mm512_setzero_ps();
    for (ptrdiff_t c = 0; c < full; c += LANES) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), _mm512_loadu_ps(k + c), acc);
    if (full < head_dim)
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q + full), _mm512_maskz_loadu_ps(tail, k + full), acc);
    return acc;
}

/// The same with k in halves.
AVX512_INLINE __m512 dot_lanes_half(const float *q, const uint16_t *k, ptrdiff_t full, ptrdiff_t head_dim,
                                    __mmask16 tail) {
    __m512 acc = _mm512_setzero_ps();
    for (ptrdiff_t c = 0; c < full; c += LANES)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), load_elements(k, c, (__mmask16)0xFFFF, 1), acc);
    if (full < head_dim)
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q + full), load_elements(k, full, tail, 1), acc);
    return acc;
}

/// Scores of `rows_in_block` query rows against four keys `key_stride` floats apart, stored at `scores[r·packed_width
/// ...]`: a register tile of rows × keys, each feature vector of a key loaded once for all rows, and each row's four
/// sums reduced together.
AVX512_INLINE void scores_keys4(const int rows_in_block, const int half, const float *const *q, ptrdiff_t head_dim,
                                const void *k, ptrdiff_t key_stride, float *scores, ptrdiff_t packed_width) {
    __m512 acc[4][4];
    for (int r = 0; r < rows_in_block; r++)
        for (int t = 0; t < 4; t++) acc[r][t] = _mm512_setzero_ps();
    for (ptrdiff_t c = 0; c < head_dim; c += LANES) {
        const __mmask16 m = tail_mask(head_dim - c);
        __m512 keys[4];
        for (int t = 0; t < 4; t++) keys[t] = load_elements(element_row(k, t, key_stride, half), c, m, half);
        for (int r = 0; r < rows_in_block; r++) {
            const __m512 query = _mm512_maskz_loadu_ps(m, q[r] + c);
            for (int t = 0; t < 4; t++) acc[r][t] = _mm512_fmadd_ps(query, keys[t], acc[r][t]);
        }
    }
    for (int r = 0; r < rows_in_block; r++)
        _mm_storeu_ps(scores + r * packed_width, sum_lanes4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
}

AVX512 static void scores_keys4_block(int rows_in_block, int half, const float *const *q, ptrdiff_t head_dim,
                                      const void *k, ptrdiff_t key_stride, float *scores, ptrdiff_t packed_width) {
    switch (rows_in_block * 2 + half) {
    case 2: scores_keys4(1, 0, q, head_dim, k, key_stride, scores, packed_width); break;
    case 3: scores_keys4(1, 1, q, head_dim, k, key_stride, scores, packed_width); break;
    case 4: scores_keys4(2, 0, q, head_dim, k, key_stride, scores, packed_width); break;
    case 5: scores_keys4(2, 1, q, head_dim, k, key_stride, scores, packed_width); break;
    case 6: scores_keys4(3, 0, q, head_dim, k, key_stride, scores, packed_width); break;
    case 7: scores_keys4(3, 1, q, head_dim, k, key_stride, scores, packed_width); break;
    case 8: scores_keys4(4, 0, q, head_dim, k, key_stride, scores, packed_width); break;
    default: scores_keys4(4, 1, q, head_dim, k, key_stride, scores, packed_width); break;
    }
}

/// Scores of `rows` query rows (any number) against keys read where they lie, into rows of `scores` `packed_width`
/// floats apart. Packing kᵀ costs a gather per key feature, which only many query rows repay; a decoding step has
/// one. Every query row meets four keys while they are in L1, in tiles of four rows by four keys (a C harness of a
/// decoding step's attention with Qwen2-0.5B's shapes, seven query heads per key head, 620 cached positions in L3 on
/// a Zen 4 VM: 1.5× faster than one key and one reduction at a time).
AVX512_INLINE void scores_unpacked_of(int rows, const float *const *q, ptrdiff_t head_dim, const void *key,
                                      const int half, ptrdiff_t key_stride, ptrdiff_t keys, float *scores,
                                      ptrdiff_t packed_width, const void *value, ptrdiff_t value_stride, int first_pass) {
    const ptrdiff_t full = head_dim / LANES * LANES;
    const __mmask16 tail = tail_mask(head_dim - full);
    // A decoding step's keys come from memory (the weights streamed through the caches since this layer's last
    // step), a few lines of each row, and the pass over them is short: rows are asked for into L2 well ahead, the
    // first ones before the first pass (later passes continue where the one before asked), and into L1 a few rows
    // ahead. Measured on a Zen 4 VM with a cache of 300 positions (SmolLM2-135M's shapes): 17 GB/s with the near
    // prefetches only, 24 with these. With `value` the values are asked for too, keeping pace with the keys, so the
    // value pass reads L2; without it (values_with_keys) the value pass streams them itself.
    for (ptrdiff_t j = 0; first_pass && j < PREFETCH_FAR_ROWS && j < keys; j++) {
        prefetch_elements(element_row(key, j, key_stride, half), head_dim, half, _MM_HINT_T1);
        if (value) prefetch_elements(element_row(value, j, value_stride, half), head_dim, half, _MM_HINT_T1);
    }
    ptrdiff_t j = 0;
    for (; j + 4 <= keys; j += 4) {
        const void *k = element_row(key, j, key_stride, half);
        for (int t = 0; t < 4; t++) {
            prefetch_elements(element_row(k, PREFETCH_ROWS + t, key_stride, half), head_dim, half, _MM_HINT_T0);
            prefetch_elements(element_row(k, PREFETCH_FAR_ROWS + t, key_stride, half), head_dim, half, _MM_HINT_T1);
            if (value)
                prefetch_elements(element_row(value, j + PREFETCH_FAR_ROWS + t, value_stride, half), head_dim, half,
                                  _MM_HINT_T1);
        }
        for (int r0 = 0; r0 < rows; r0 += 4)
            scores_keys4_block(rows - r0 < 4 ? rows - r0 : 4, half, q + r0, head_dim, k, key_stride,
                               scores + r0 * packed_width + j, packed_width);
    }
    for (; j < keys; j++) {
        const void *k = element_row(key, j, key_stride, half);
        for (int r = 0; r < rows; r++)
            scores[r * packed_width + j] = _mm512_reduce_add_ps(
                half ? dot_lanes_half(q[r], k, full, head_dim, tail) : dot_lanes(q[r], k, full, head_dim, tail));
    }
}

/// Whether a core reading keys in place should bring their values along (vlm_attention_problem's `streams`). Two
/// streams a core were the Zen 4 VM's best. On a Zen 5 VM, where the decoding products read best as one stream a
/// core (vlm_quant_streams), SmolLM2-135M's decoding step over an fp32 cache (scripts/bench_decoder_step.py, Q4_1,
/// the builds alternating step by step) ran 1.00–1.01× as fast with the values in a pass of their own at 320 cached
/// positions, 1.01–1.03× at 1,000 and 1.03–1.05× at 2,000; over an fp16 cache, whose rows are half as long,
/// 0.95–0.97× at 1,000 (once 1.01×), so halves keep their values coming with the keys.
static int values_with_keys(const vlm_attention_problem *p) {
    return p->half_key || (p->streams > 0 ? p->streams : vlm_quant_streams()) > 1;
}

/// scores_unpacked_of with its keys' element type fixed, each compiled on its own.
AVX512 static void scores_unpacked(int rows, const float *const *q, ptrdiff_t head_dim, const void *key, int half,
                                   ptrdiff_t key_stride, ptrdiff_t keys, float *scores, ptrdiff_t packed_width,
                                   const void *value, ptrdiff_t value_stride, int first_pass) {
    if (half)
        scores_unpacked_of(rows, q, head_dim, key, 1, key_stride, keys, scores, packed_width, value, value_stride, first_pass);
    else
        scores_unpacked_of(rows, q, head_dim, key, 0, key_stride, keys, scores, packed_width, value, value_stride, first_pass);
}

/// kᵀ of one head in panels of `panel_width` keys (a multiple of 16): panel after panel, each `head_dim` rows of
/// `panel_width` floats, key j in column j mod panel_width of panel j / panel_width. One panel as wide as all keys is
/// the plain kᵀ. Columns past key_length in the last 16 stay zero.
AVX512 static void pack_keys_transposed(const float *key, ptrdiff_t key_stride, ptrdiff_t key_length,
                                        ptrdiff_t head_dim, float *packed, ptrdiff_t panel_width) {
    // 16 keys at a time: gather one feature of 16 keys into a vector with a single strided gather.
    const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)key_stride));
    for (ptrdiff_t j = 0; j < key_length; j += LANES) {
        __mmask16 m = tail_mask(key_length - j);
        const float *base = key + j * key_stride;
        for (ptrdiff_t c = 0; c < head_dim; c++) {
            __m512 column = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, offsets, base + c, 4);
            _mm512_store_ps(packed + j / panel_width * panel_width * head_dim + c * panel_width + j % panel_width, column);
        }
    }
}

/// Asks for one head's queries, keys and values ahead of use. Each token's slice of a head is a few cache lines
/// thousands of bytes away from the next token's, a pattern the hardware prefetchers do not follow, so without this
/// most of the time goes into waiting for memory.
AVX512 static void prefetch_head(const vlm_attention_problem *p, ptrdiff_t head, int hint) {
    const ptrdiff_t bytes = p->head_dim * (ptrdiff_t)sizeof(float);
    for (int operand = 0; operand < 3; operand++) {
        const float *base = operand == 0 ? p->query : (operand == 1 ? p->key : p->value);
        const ptrdiff_t stride = operand == 0 ? p->query_stride : (operand == 1 ? p->key_stride : p->value_stride);
        const ptrdiff_t tokens = operand == 0 ? p->query_length : p->key_length;
        for (ptrdiff_t t = 0; t < tokens; t++) {
            const char *row = (const char *)(base + t * stride + head * p->head_dim);
            for (ptrdiff_t offset = 0; offset < bytes; offset += 64) {
                if (hint == _MM_HINT_T0) _mm_prefetch(row + offset, _MM_HINT_T0);
                else _mm_prefetch(row + offset, _MM_HINT_T1);
            }
        }
    }
}

AVX512 int vlm_attention_avx512(const vlm_attention_problem *p) {
    // The gather offsets are 32-bit; strides that do not fit take the portable path (no real model has them).
    if (p->key_stride > INT32_MAX / LANES) return vlm_attention_scalar(p);
    const ptrdiff_t d = p->head_dim, tq = p->query_length, tk = p->key_length;
    const ptrdiff_t packed_width = (tk + LANES - 1) / LANES * LANES;
    // Below this many query rows, reading keys in place beats packing them (see scores_unpacked).
    const int packed = tq > 4;
    const size_t packed_bytes = packed ? (size_t)(d * packed_width) * sizeof(float) : 0;
    const size_t score_bytes = (size_t)(ROWS * (packed_width > 0 ? packed_width : LANES)) * sizeof(float);
    const size_t mask_bytes = p->key_mask ? (size_t)packed_width * sizeof(float) : 0;
    char *scratch = aligned_alloc(64, packed_bytes + score_bytes + mask_bytes);
    if (!scratch) return -1;
    float *keys_transposed = (float *)scratch;
    float *scores = (float *)(scratch + packed_bytes);
    float *mask_bias = p->key_mask ? (float *)(scratch + packed_bytes + score_bytes) : NULL;
    for (ptrdiff_t j = 0; mask_bias && j < tk; j++) mask_bias[j] = p->key_mask[j] != 0 ? 0.0f : -INFINITY;
    // A head read in place (decoding) can be far larger than L1 (a long KV cache); its keys and values are
    // prefetched a few at a time as they are read instead.
    if (packed) prefetch_head(p, 0, _MM_HINT_T0);
    for (ptrdiff_t h = 0; h < p->head_count; h++) {
        if (packed && h + 1 < p->head_count) prefetch_head(p, h + 1, _MM_HINT_T1);
        if (packed) pack_keys_transposed(p->key + h * d, p->key_stride, tk, d, keys_transposed, packed_width);
        const float *v = p->value + h * d;
        // Blocks as even as possible (50 queries: 5 of 6 and 4 of 5 rather than 8 of 6 and 1 of 2): a block's
        // loads cost the same for any row count.
        const ptrdiff_t blocks = (tq + ROWS - 1) / ROWS;
        for (ptrdiff_t block = 0, i0 = 0; block < blocks; block++) {
            const int rows_in_block = (int)(tq / blocks + (block < tq % blocks ? 1 : 0));
            const float *q[ROWS];
            float *out[ROWS];
            ptrdiff_t visible[ROWS];
            for (int r = 0; r < rows_in_block; r++) {
                q[r] = p->query + (i0 + r) * p->query_stride + h * d;
                out[r] = p->output + (i0 + r) * p->output_stride + h * d;
                visible[r] = vlm_visible_keys(p, i0 + r);
            }
            // Causal visibility grows with the row, so the block's last row sees the most keys.
            const ptrdiff_t block_keys = visible[rows_in_block - 1];
            if (!packed)
                scores_unpacked(rows_in_block, q, d, p->key + h * d, 0, p->key_stride, block_keys, scores, packed_width,
                                values_with_keys(p) ? v : NULL, p->value_stride, 1);
            for (ptrdiff_t j0 = 0; packed && j0 < block_keys; j0 += MAX_VECTORS * LANES) {
                ptrdiff_t remaining = (block_keys - j0 + LANES - 1) / LANES;
                int vectors = (int)(remaining < MAX_VECTORS ? remaining : MAX_VECTORS);
                scores_block(rows_in_block, vectors, q, d, keys_transposed + j0, packed_width, scores + j0, packed_width);
            }
            ptrdiff_t used[ROWS], block_used = 0;
            for (int r = 0; r < rows_in_block; r++) {
                used[r] = softmax_row(scores + r * packed_width, visible[r], tk, p->scale, mask_bias);
                block_used = used[r] > block_used ? used[r] : block_used;
            }
            // Rows that see fewer keys than the block reads contribute nothing for the rest.
            for (int r = 0; r < rows_in_block; r++)
                memset(scores + r * packed_width + used[r], 0, (size_t)(block_used - used[r]) * sizeof(float));
            values_rows(rows_in_block, scores, packed_width, block_used, v, 0, p->value_stride, d, NULL, out);
            i0 += rows_in_block;
        }
    }
    free(scratch);
    return 0;
}

/// Folds one key tile's scores of one query row into that row's running softmax (flash attention's online softmax):
/// scales row[0 ..< valid] and adds the tile's key mask, raises the running `max` to the tile's, turns the scores into
/// e^(score − max) in place (zeros up to `width`, the keys the value product reads) and adds them to `sum` after
/// rescaling it to the new max. Returns the factor that rescales the row's output sums to the new max.
AVX512 static float online_softmax_row(float *row, ptrdiff_t valid, ptrdiff_t width, float scale,
                                       const float *mask_bias, float *max, float *sum) {
    float pending;
    const float tile_max = scale_scores(row, valid, scale, mask_bias, &pending);
    // NaN scores make the row NaN, as in the whole-row kernel.
    const float new_max = tile_max > *max || tile_max != tile_max ? tile_max : *max;
    if (new_max == -INFINITY) {
        // No key visible so far: nothing to add, and e^(−inf − (−inf)) would be NaN.
        memset(row, 0, (size_t)width * sizeof(float));
        return 1.0f;
    }
    const float rescale = _mm512_cvtss_f32(exp_nonpositive(_mm512_set1_ps(*max - new_max)));
    const float tile_sum = exponentiate_scores(row, valid, new_max, pending);
    memset(row + valid, 0, (size_t)(width - valid) * sizeof(float));
    *sum = *sum * rescale + tile_sum;
    *max = new_max;
    return rescale;
}

/// v of one head as `key_length` contiguous rows of `head_dim` floats, so that a key tile's values share few pages
/// and the prefetchers see one stream.
AVX512 static void pack_values(const float *value, ptrdiff_t value_stride, ptrdiff_t key_length, ptrdiff_t head_dim,
                               float *packed) {
    for (ptrdiff_t j = 0; j < key_length; j++) {
        const float *row = value + j * value_stride;
        prefetch_elements(row + PREFETCH_ROWS * value_stride, head_dim, 0, _MM_HINT_T0);
        for (ptrdiff_t c = 0; c < head_dim; c += LANES) {
            __mmask16 m = tail_mask(head_dim - c);
            _mm512_mask_storeu_ps(packed + j * head_dim + c, m, _mm512_maskz_loadu_ps(m, row + c));
        }
    }
}

/// Starts a query block of the key-tiled schedule: no output sums yet, running maxima at −∞.
AVX512_INLINE void begin_query_block(float *sums_out, float *maxima, float *sums, ptrdiff_t rows, ptrdiff_t d) {
    memset(sums_out, 0, (size_t)(rows * d) * sizeof(float));
    memset(sums, 0, (size_t)rows * sizeof(float));
    for (ptrdiff_t i = 0; i < rows; i++) maxima[i] = -INFINITY;
}

/// The rows of register group `group` of a query block whose first row is query `first_row` (groups as even as
/// possible), and how many of the tile's `tile_keys` keys from `first_key` on each row sees (`valid`).
AVX512_INLINE int query_group(const vlm_attention_problem *p, ptrdiff_t block_rows, ptrdiff_t groups, ptrdiff_t group,
                              ptrdiff_t first_row, ptrdiff_t first_key, ptrdiff_t tile_keys, ptrdiff_t *valid) {
    const int rows = (int)(block_rows / groups + (group < block_rows % groups ? 1 : 0));
    for (int r = 0; r < rows; r++) {
        const ptrdiff_t visible = vlm_visible_keys(p, first_row + r) - first_key;
        valid[r] = visible < 0 ? 0 : (visible > tile_keys ? tile_keys : visible);
    }
    return rows;
}

/// Writes head `h`'s outputs of a query block from its output sums: each divided by its row's softmax sum. A row
/// that saw no key averages every value (the fp32 values as they lie), as the whole-row kernel does.
AVX512 static void end_query_block(const vlm_attention_problem *p, ptrdiff_t h, ptrdiff_t first_row, ptrdiff_t rows,
                                   float *sums_out, const float *maxima, float *sums) {
    const ptrdiff_t d = p->head_dim;
    const __m512 uniform = _mm512_set1_ps(1.0f / (float)p->key_length);
    for (ptrdiff_t i = 0; i < rows; i++) {
        float *row = sums_out + i * d;
        if (maxima[i] == -INFINITY) {
            for (ptrdiff_t c = 0; c < d; c += LANES) {
                const __mmask16 m = tail_mask(d - c);
                __m512 sum = _mm512_setzero_ps();
                for (ptrdiff_t j = 0; j < p->key_length; j++)
                    sum = _mm512_fmadd_ps(uniform, _mm512_maskz_loadu_ps(m, p->value + j * p->value_stride + h * d + c), sum);
                _mm512_mask_storeu_ps(row + c, m, sum);
            }
            sums[i] = 1.0f;
        }
        const __m512 inverse = _mm512_set1_ps(1.0f / sums[i]);
        float *destination = p->output + (first_row + i) * p->output_stride + h * d;
        for (ptrdiff_t c = 0; c < d; c += LANES) {
            const __mmask16 m = tail_mask(d - c);
            _mm512_mask_storeu_ps(destination + c, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + c), inverse));
        }
    }
}

/// One kernel's side of the key-tiled schedule: how it lays out a head's keys and values, readies a block of query
/// rows, and passes one register group of rows over one tile of keys (scores, online softmax, value sums).
typedef struct key_tile_kernel {
    void *state;
    void (*pack_head)(void *state, const vlm_attention_problem *p, ptrdiff_t h);
    void (*prepare_block)(void *state, const vlm_attention_problem *p, ptrdiff_t h, ptrdiff_t first_row,
                          ptrdiff_t rows);
    /// Rows `first_row ...` of the query block (`block_row ...` within it) over the keys from `first_key`: `valid[r]`
    /// of them visible to row r, the last row seeing the most; running `maxima`/`sums` and output sums `out` per row.
    void (*group_tile)(void *state, const vlm_attention_problem *p, ptrdiff_t h, ptrdiff_t first_row,
                       ptrdiff_t block_row, int rows, const ptrdiff_t *valid, ptrdiff_t first_key, float *const *out,
                       float *maxima, float *sums);
} key_tile_kernel;

/// Flash attention's schedule: per head, blocks of `query_block` query rows pass over tiles of `key_tile` keys, so
/// that a tile's keys and values stay in L2 while every register group of the block reads them; each row keeps a
/// running max and sum (online softmax) and its output is written once. `sums_out` holds a block's output sums,
/// `maxima` and `sums` its rows' softmax state.
AVX512 static void run_key_tiles(const vlm_attention_problem *p, ptrdiff_t query_block, ptrdiff_t key_tile,
                                 const key_tile_kernel *kernel, float *sums_out, float *maxima, float *sums) {
    const ptrdiff_t d = p->head_dim, tq = p->query_length, tk = p->key_length;
    for (ptrdiff_t h = 0; h < p->head_count; h++) {
        kernel->pack_head(kernel->state, p, h);
        for (ptrdiff_t b0 = 0; b0 < tq; b0 += query_block) {
            const ptrdiff_t block_rows = tq - b0 < query_block ? tq - b0 : query_block;
            if (kernel->prepare_block) kernel->prepare_block(kernel->state, p, h, b0, block_rows);
            begin_query_block(sums_out, maxima, sums, block_rows, d);
            const ptrdiff_t groups = (block_rows + ROWS - 1) / ROWS;
            for (ptrdiff_t j0 = 0; j0 < tk; j0 += key_tile) {
                const ptrdiff_t tile_keys = tk - j0 < key_tile ? tk - j0 : key_tile;
                for (ptrdiff_t group = 0, i0 = 0; group < groups; group++) {
                    ptrdiff_t valid[ROWS];
                    const int rows = query_group(p, block_rows, groups, group, b0 + i0, j0, tile_keys, valid);
                    float *out[ROWS];
                    for (int r = 0; r < rows; r++) out[r] = sums_out + (i0 + r) * d;
                    // Causal visibility grows with the row, so the group's last row sees the most keys.
                    if (valid[rows - 1] > 0)
                        kernel->group_tile(kernel->state, p, h, b0 + i0, i0, rows, valid, j0, out, maxima + i0,
                                           sums + i0);
                    i0 += rows;
                }
            }
            end_query_block(p, h, b0, block_rows, sums_out, maxima, sums);
        }
    }
}

/// The fp32 kernel's state: kᵀ in panels, v packed, one register group's scores, the key mask as 0/−∞.
typedef struct fp32_tiles {
    float *keys_transposed, *values, *scores, *mask_bias;
    ptrdiff_t key_tile;
} fp32_tiles;

// kᵀ in panels of the 64 keys one score tile reads, so that the tile streams through 16 KiB of consecutive memory
// (head_dim = 64) rather than 64 rows a whole head's keys apart.
enum { PANEL = MAX_VECTORS * LANES };

AVX512 static void fp32_pack_head(void *state, const vlm_attention_problem *p, ptrdiff_t h) {
    fp32_tiles *t = state;
    const ptrdiff_t d = p->head_dim;
    pack_keys_transposed(p->key + h * d, p->key_stride, p->key_length, d, t->keys_transposed, PANEL);
    pack_values(p->value + h * d, p->value_stride, p->key_length, d, t->values);
}

AVX512 static void fp32_group_tile(void *state, const vlm_attention_problem *p, ptrdiff_t h, ptrdiff_t first_row,
                                   ptrdiff_t block_row, int rows, const ptrdiff_t *valid, ptrdiff_t first_key,
                                   float *const *out, float *maxima, float *sums) {
    (void)block_row;
    const fp32_tiles *t = state;
    const ptrdiff_t d = p->head_dim, group_keys = valid[rows - 1], key_tile = t->key_tile;
    const float *q[ROWS];
    for (int r = 0; r < rows; r++) q[r] = p->query + (first_row + r) * p->query_stride + h * d;
    for (ptrdiff_t j = 0; j < group_keys; j += PANEL) {
        const ptrdiff_t remaining = (group_keys - j + LANES - 1) / LANES;
        const int vectors = (int)(remaining < MAX_VECTORS ? remaining : MAX_VECTORS);
        scores_block(rows, vectors, q, d, t->keys_transposed + (first_key + j) * d, PANEL, t->scores + j, key_tile);
    }
    float rescale[ROWS];
    for (int r = 0; r < rows; r++)
        rescale[r] = online_softmax_row(t->scores + r * key_tile, valid[r], group_keys, p->scale,
                                        t->mask_bias ? t->mask_bias + first_key : NULL, maxima + r, sums + r);
    values_rows(rows, t->scores, key_tile, group_keys, t->values + first_key * d, 0, d, d, rescale, out);
}

AVX512 int vlm_attention_tiled_avx512(const vlm_attention_problem *p, ptrdiff_t query_block, ptrdiff_t key_tile) {
    if (p->key_stride > INT32_MAX / LANES) return vlm_attention_scalar(p);
    const ptrdiff_t d = p->head_dim, tq = p->query_length, tk = p->key_length;
    const ptrdiff_t packed_width = (tk + LANES - 1) / LANES * LANES;
    // Whole score vectors of 64 keys, and whole register blocks of query rows.
    key_tile = (key_tile + PANEL - 1) / PANEL * PANEL;
    if (key_tile > packed_width) key_tile = packed_width;
    query_block = query_block < ROWS ? ROWS : query_block / ROWS * ROWS;
    if (query_block > tq) query_block = tq;
    const ptrdiff_t panels = (tk + PANEL - 1) / PANEL;
    // Every part starts on a cache line: kᵀ and the scores are read and written with aligned loads and stores.
#define LINES(floats) (((size_t)(floats) * sizeof(float) + 63) / 64 * 64)
    const size_t keys_bytes = LINES(d * panels * PANEL), values_bytes = LINES(tk * d);
    const size_t output_bytes = LINES(query_block * d), row_state_bytes = LINES(2 * query_block);
    const size_t score_bytes = LINES(ROWS * key_tile), mask_bytes = p->key_mask ? LINES(packed_width) : 0;
#undef LINES
    char *scratch = aligned_alloc(64, keys_bytes + values_bytes + output_bytes + row_state_bytes + score_bytes + mask_bytes);
    if (!scratch) return -1;
    fp32_tiles tiles = {.keys_transposed = (float *)scratch, .values = (float *)(scratch + keys_bytes),
                        .scores = (float *)(scratch + keys_bytes + values_bytes + output_bytes + row_state_bytes),
                        .key_tile = key_tile};
    float *sums_out = (float *)(scratch + keys_bytes + values_bytes);
    float *maxima = (float *)(scratch + keys_bytes + values_bytes + output_bytes);
    tiles.mask_bias = p->key_mask ? tiles.scores + ROWS * key_tile : NULL;
    for (ptrdiff_t j = 0; tiles.mask_bias && j < tk; j++) tiles.mask_bias[j] = p->key_mask[j] != 0 ? 0.0f : -INFINITY;
    const key_tile_kernel kernel = {.state = &tiles, .pack_head = fp32_pack_head, .group_tile = fp32_group_tile};
    run_key_tiles(p, query_block, key_tile, &kernel, sums_out, maxima, maxima + query_block);
    free(scratch);
    return 0;
}

// bf16 products for the key-tiled schedule. vdpbf16ps multiplies pairs of bf16 values and adds both products to an
// fp32 lane: sixteen lanes of 32 multiply-adds per instruction where an fp32 FMA does 16. Every operand of a product
// is laid out as pairs along the dimension the product sums over: q·kᵀ sums over features, so a key tile holds each
// feature pair of its keys side by side; p·v sums over keys, so the values hold each feature of a key pair side by
// side, and so do the probabilities.
#define AVX512_BF16 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma,avx512bf16")))
#define AVX512_BF16_INLINE static inline __attribute__((always_inline, \
    target("avx512f,avx512dq,avx512bw,avx512vl,fma,avx512bf16")))

/// `count` floats (at most 16) rounded to bf16, ties to even, as 16-bit patterns in the low halves of 32-bit lanes
/// (zero past `count`).
AVX512_BF16_INLINE __m512i bf16_lanes(const float *x, ptrdiff_t count) {
    const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tail_mask(count), x));
    return _mm512_cvtepu16_epi32((__m256i)rounded);
}

/// A row of `count` floats as ⌈count/2⌉ bf16 pairs, element 2c in the low half of pair c (an odd count's last
/// partner zero).
AVX512_BF16_INLINE void bf16_pairs(const float *x, ptrdiff_t count, uint32_t *pairs) {
    for (ptrdiff_t c = 0; c < count; c += 2 * LANES) {
        const ptrdiff_t left = count - c;
        const __mmask16 low = tail_mask(left), high = tail_mask(left - LANES > 0 ? left - LANES : 0);
        const __m512bh rounded = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(high, x + c + LANES),
                                                     _mm512_maskz_loadu_ps(low, x + c));
        _mm512_mask_storeu_epi32(pairs + c / 2, tail_mask((left + 1) / 2), (__m512i)rounded);
    }
}

/// One head's keys as panels of PANEL keys, each `d/2` rows of PANEL pairs: key j's feature pair c at column
/// j mod PANEL of row c of panel j / PANEL. Keys past key_length in the last panel are zero.
AVX512_BF16 static void pack_keys_bf16(const float *key, ptrdiff_t key_stride, ptrdiff_t key_length, ptrdiff_t d,
                                       uint32_t *packed, uint32_t *row) {
    const ptrdiff_t pairs = d / 2, panels = (key_length + PANEL - 1) / PANEL;
    memset(packed + (panels - 1) * pairs * PANEL, 0, (size_t)(pairs * PANEL) * sizeof(uint32_t));
    for (ptrdiff_t j = 0; j < key_length; j++) {
        const float *source = key + j * key_stride;
        prefetch_elements(source + PREFETCH_ROWS * key_stride, d, 0, _MM_HINT_T0);
        bf16_pairs(source, d, row);
        uint32_t *column = packed + j / PANEL * pairs * PANEL + j % PANEL;
        for (ptrdiff_t c = 0; c < pairs; c++) column[c * PANEL] = row[c];
    }
}

/// One head's values as ⌈key_length/2⌉ rows of `d` pairs: feature c of keys 2i and 2i+1 at column c of row i, the
/// even key in the low half; the odd partner past key_length is zero.
AVX512_BF16 static void pack_values_bf16(const float *value, ptrdiff_t value_stride, ptrdiff_t key_length, ptrdiff_t d,
                                         uint32_t *packed) {
    for (ptrdiff_t i = 0; 2 * i < key_length; i++) {
        const float *even = value + 2 * i * value_stride, *odd = even + value_stride;
        const int has_odd = 2 * i + 1 < key_length;
        prefetch_elements(even + PREFETCH_ROWS * value_stride, d, 0, _MM_HINT_T0);
        prefetch_elements(odd + PREFETCH_ROWS * value_stride, d, 0, _MM_HINT_T0);
        for (ptrdiff_t c = 0; c < d; c += LANES) {
            const ptrdiff_t left = d - c;
            const __m512i low = bf16_lanes(even + c, left);
            const __m512i high = has_odd ? _mm512_slli_epi32(bf16_lanes(odd + c, left), 16) : _mm512_setzero_si512();
            _mm512_mask_storeu_epi32(packed + i * d + c, tail_mask(left), _mm512_or_si512(low, high));
        }
    }
}

/// scores[r·score_stride + 16·n + lane] = q_r · k[16·n + lane] for `rows_in_block` query rows (as bf16 pairs) and
/// `vectors` vectors of 16 keys of one panel.
AVX512_BF16_INLINE void scores_tile_bf16(const int rows_in_block, const int vectors, const uint32_t *const *q,
                                         ptrdiff_t pairs, const uint32_t *panel, float *scores, ptrdiff_t score_stride) {
    __m512 acc[ROWS][MAX_VECTORS];
    for (int r = 0; r < rows_in_block; r++)
        for (int n = 0; n < vectors; n++) acc[r][n] = _mm512_setzero_ps();
    for (ptrdiff_t c = 0; c < pairs; c++) {
        __m512bh k[MAX_VECTORS];
        for (int n = 0; n < vectors; n++) k[n] = (__m512bh)_mm512_load_si512(panel + c * PANEL + n * LANES);
        for (int r = 0; r < rows_in_block; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)q[r][c]);
            for (int n = 0; n < vectors; n++) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], a, k[n]);
        }
    }
    for (int r = 0; r < rows_in_block; r++)
        for (int n = 0; n < vectors; n++) _mm512_store_ps(scores + r * score_stride + n * LANES, acc[r][n]);
}

/// out_r[c0 ..] (+)= Σ_i p_r[i] · v_i[c0 ..] over `key_pairs` pairs of keys (p and v as bf16 pairs), for `vectors`
/// vectors of 16 features, the last one masked by `last`; with `rescale`, added to out_r·rescale[r].
AVX512_BF16_INLINE void values_tile_bf16(const int rows_in_block, const int vectors, const uint32_t *probabilities,
                                         ptrdiff_t probability_stride, ptrdiff_t key_pairs, const uint32_t *v,
                                         ptrdiff_t d, __mmask16 last, const float *rescale, float *const *out) {
    __m512 acc[ROWS][MAX_VECTORS];
    begin_value_sums(rows_in_block, vectors, last, rescale, out, acc);
    for (ptrdiff_t i = 0; i < key_pairs; i++) {
        const uint32_t *row = v + i * d;
        __m512bh value[MAX_VECTORS];
        for (int n = 0; n < vectors - 1; n++) value[n] = (__m512bh)_mm512_loadu_si512(row + n * LANES);
        value[vectors - 1] = (__m512bh)_mm512_maskz_loadu_epi32(last, row + (vectors - 1) * LANES);
        for (int r = 0; r < rows_in_block; r++) {
            const __m512bh p = (__m512bh)_mm512_set1_epi32((int)probabilities[r * probability_stride + i]);
            for (int n = 0; n < vectors; n++) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], p, value[n]);
        }
    }
    store_value_sums(rows_in_block, vectors, last, acc, out);
}

AVX512_BF16 static void scores_block_bf16(int rows_in_block, int vectors, const uint32_t *const *q, ptrdiff_t pairs,
                                          const uint32_t *panel, float *scores, ptrdiff_t score_stride) {
#define SCORES_CASE(R, N) case R * 8 + N: scores_tile_bf16(R, N, q, pairs, panel, scores, score_stride); break;
    switch (rows_in_block * 8 + vectors) { ALL_TILE_CASES(SCORES_CASE) }
#undef SCORES_CASE
}

AVX512_BF16 static void values_rows_bf16(int rows, const uint32_t *probabilities, ptrdiff_t probability_stride,
                                         ptrdiff_t key_pairs, const uint32_t *v, ptrdiff_t d, const float *rescale,
                                         float *const *out) {
    const ptrdiff_t feature_vectors = (d + LANES - 1) / LANES;
    for (ptrdiff_t c0 = 0; c0 < feature_vectors; c0 += MAX_VECTORS) {
        const ptrdiff_t remaining = feature_vectors - c0;
        const int vectors = (int)(remaining < MAX_VECTORS ? remaining : MAX_VECTORS);
        const __mmask16 last = tail_mask(d - (c0 + vectors - 1) * LANES);
        float *out_chunk[ROWS];
        for (int r = 0; r < rows; r++) out_chunk[r] = out[r] + c0 * LANES;
#define VALUES_CASE(R, N) \
    case R * 8 + N: \
        values_tile_bf16(R, N, probabilities, probability_stride, key_pairs, v + c0 * LANES, d, last, rescale, out_chunk); \
        break;
        switch (rows * 8 + vectors) { ALL_TILE_CASES(VALUES_CASE) }
#undef VALUES_CASE
    }
}

/// The bf16 kernel's state: the head's keys and values as pairs, the query block's rows as pairs, a register group's
/// scores and their probabilities as pairs, the key mask as 0/−∞.
typedef struct bf16_tiles {
    uint32_t *keys, *values, *queries, *key_row, *probabilities;
    float *scores, *mask_bias;
    ptrdiff_t key_tile;
} bf16_tiles;

AVX512_BF16 static void bf16_pack_head(void *state, const vlm_attention_problem *p, ptrdiff_t h) {
    bf16_tiles *t = state;
    const ptrdiff_t d = p->head_dim;
    pack_keys_bf16(p->key + h * d, p->key_stride, p->key_length, d, t->keys, t->key_row);
    pack_values_bf16(p->value + h * d, p->value_stride, p->key_length, d, t->values);
}

AVX512_BF16 static void bf16_prepare_block(void *state, const vlm_attention_problem *p, ptrdiff_t h,
                                           ptrdiff_t first_row, ptrdiff_t rows) {
    bf16_tiles *t = state;
    const ptrdiff_t d = p->head_dim;
    for (ptrdiff_t i = 0; i < rows; i++)
        bf16_pairs(p->query + (first_row + i) * p->query_stride + h * d, d, t->queries + i * (d / 2));
}

AVX512_BF16 static void bf16_group_tile(void *state, const vlm_attention_problem *p, ptrdiff_t h,
                                        ptrdiff_t first_row, ptrdiff_t block_row, int rows, const ptrdiff_t *valid,
                                        ptrdiff_t first_key, float *const *out, float *maxima, float *sums) {
    (void)h, (void)first_row;
    const bf16_tiles *t = state;
    const ptrdiff_t d = p->head_dim, pairs = d / 2, group_keys = valid[rows - 1], key_tile = t->key_tile;
    const ptrdiff_t probability_stride = key_tile / 2;
    const uint32_t *q[ROWS];
    for (int r = 0; r < rows; r++) q[r] = t->queries + (block_row + r) * pairs;
    for (ptrdiff_t j = 0; j < group_keys; j += PANEL) {
        const ptrdiff_t remaining = (group_keys - j + LANES - 1) / LANES;
        const int vectors = (int)(remaining < MAX_VECTORS ? remaining : MAX_VECTORS);
        scores_block_bf16(rows, vectors, q, pairs, t->keys + (first_key + j) * pairs, t->scores + j, key_tile);
    }
    float rescale[ROWS];
    for (int r = 0; r < rows; r++) {
        float *row = t->scores + r * key_tile;
        rescale[r] = online_softmax_row(row, valid[r], group_keys, p->scale,
                                        t->mask_bias ? t->mask_bias + first_key : NULL, maxima + r, sums + r);
        bf16_pairs(row, group_keys, t->probabilities + r * probability_stride);
    }
    values_rows_bf16(rows, t->probabilities, probability_stride, (group_keys + 1) / 2, t->values + first_key / 2 * d,
                     d, rescale, out);
}

AVX512_BF16 int vlm_attention_tiled_bf16_avx512(const vlm_attention_problem *p, ptrdiff_t query_block,
                                                ptrdiff_t key_tile) {
    const ptrdiff_t d = p->head_dim, pairs = d / 2, tq = p->query_length, tk = p->key_length;
    const ptrdiff_t packed_width = (tk + LANES - 1) / LANES * LANES;
    // Tiles of whole panels, so that every tile starts on a key pair and a panel.
    const ptrdiff_t panels = (tk + PANEL - 1) / PANEL;
    key_tile = (key_tile + PANEL - 1) / PANEL * PANEL;
    if (key_tile > panels * PANEL) key_tile = panels * PANEL;
    query_block = query_block < ROWS ? ROWS : query_block / ROWS * ROWS;
    if (query_block > tq) query_block = tq;
#define LINES(items) (((size_t)(items) * 4 + 63) / 64 * 64)
    const size_t keys_bytes = LINES(panels * PANEL * pairs), values_bytes = LINES((tk + 1) / 2 * d);
    const size_t query_bytes = LINES(query_block * pairs), row_bytes = LINES(pairs);
    const size_t output_bytes = LINES(query_block * d), row_state_bytes = LINES(2 * query_block);
    const size_t score_bytes = LINES(ROWS * key_tile), probability_bytes = LINES(ROWS * key_tile / 2);
    const size_t mask_bytes = p->key_mask ? LINES(packed_width) : 0;
#undef LINES
    char *scratch = aligned_alloc(64, keys_bytes + values_bytes + query_bytes + row_bytes + output_bytes +
                                          row_state_bytes + score_bytes + probability_bytes + mask_bytes);
    if (!scratch) return -1;
    // The parts one after another, each on a cache line.
    char *next = scratch;
#define TAKE(bytes) ((void *)((next += (bytes)) - (bytes)))
    bf16_tiles tiles = {.key_tile = key_tile};
    tiles.keys = TAKE(keys_bytes);
    tiles.values = TAKE(values_bytes);
    tiles.queries = TAKE(query_bytes);
    tiles.key_row = TAKE(row_bytes);
    float *sums_out = TAKE(output_bytes);
    float *maxima = TAKE(row_state_bytes);
    tiles.scores = TAKE(score_bytes);
    tiles.probabilities = TAKE(probability_bytes);
    tiles.mask_bias = p->key_mask ? TAKE(mask_bytes) : NULL;
#undef TAKE
    for (ptrdiff_t j = 0; tiles.mask_bias && j < tk; j++) tiles.mask_bias[j] = p->key_mask[j] != 0 ? 0.0f : -INFINITY;
    const key_tile_kernel kernel = {.state = &tiles, .pack_head = bf16_pack_head, .prepare_block = bf16_prepare_block,
                                    .group_tile = bf16_group_tile};
    run_key_tiles(p, query_block, key_tile, &kernel, sums_out, maxima, maxima + query_block);
    free(scratch);
    return 0;
}

/// Keys a decoding step's partial attention takes at a time (online softmax), so that its scores stay in L1 however
/// many keys the part has.
enum { PARTIAL_KEY_TILE = 128 };

AVX512 int vlm_attention_partial_avx512(const vlm_attention_problem *p, ptrdiff_t first_key, ptrdiff_t key_count,
                                        float *maxima, float *sums, float *outputs) {
    if (!p->half_key && p->key_stride > INT32_MAX / LANES)
        return vlm_attention_partial_scalar(p, first_key, key_count, maxima, sums, outputs);
    const ptrdiff_t d = p->head_dim, rows = p->query_length;
    // One block: a row of scores per query row, the rows' rescale factors, then pointers to the query rows
    // (aligned_alloc takes whole 64-byte units).
    const ptrdiff_t floats = rows * PARTIAL_KEY_TILE + (rows + LANES - 1) / LANES * LANES;
    const size_t bytes = (size_t)floats * sizeof(float) + (size_t)rows * sizeof(float *);
    float *scores = vlm_attention_partial_scratch(bytes);
    if (!scores) return -1;
    float *rescale = scores + rows * PARTIAL_KEY_TILE;
    const float **q = (const float **)(scores + floats);
    for (ptrdiff_t r = 0; r < rows; r++) q[r] = p->query + r * p->query_stride;
    // Half keys and values (a KV cache kept in fp16) are widened as they are loaded, into the same arithmetic.
    const int half = p->half_key != NULL;
    const void *key = half ? (const void *)p->half_key : (const void *)p->key;
    const void *value = half ? (const void *)p->half_value : (const void *)p->value;
    const int bring_values = values_with_keys(p);
    // Online softmax over tiles of keys: each row keeps its largest score and its sum, and the outputs are rescaled
    // when a tile raises the largest.
    for (ptrdiff_t j0 = 0; j0 < key_count; j0 += PARTIAL_KEY_TILE) {
        const ptrdiff_t tile = key_count - j0 < PARTIAL_KEY_TILE ? key_count - j0 : PARTIAL_KEY_TILE;
        const void *keys = element_row(key, first_key + j0, p->key_stride, half);
        const void *values = element_row(value, first_key + j0, p->value_stride, half);
        scores_unpacked((int)rows, q, d, keys, half, p->key_stride, tile, scores, PARTIAL_KEY_TILE,
                        bring_values ? values : NULL, p->value_stride, j0 == 0);
        for (ptrdiff_t r = 0; r < rows; r++) {
            float pending;
            const float tile_max = scale_scores(scores + r * PARTIAL_KEY_TILE, tile, p->scale, NULL, &pending);
            const float max = j0 == 0 || tile_max > maxima[r] ? tile_max : maxima[r];
            const float tile_sum = exponentiate_scores(scores + r * PARTIAL_KEY_TILE, tile, max, pending);
            rescale[r] = j0 == 0 ? 0.0f : expf(maxima[r] - max);
            sums[r] = j0 == 0 ? tile_sum : sums[r] * rescale[r] + tile_sum;
            maxima[r] = max;
        }
        // The value tiles take up to four rows.
        for (ptrdiff_t r0 = 0; r0 < rows; r0 += 4) {
            const int block = rows - r0 < 4 ? (int)(rows - r0) : 4;
            float *out[ROWS];
            for (int r = 0; r < block; r++) out[r] = outputs + (r0 + r) * d;
            values_rows(block, scores + r0 * PARTIAL_KEY_TILE, PARTIAL_KEY_TILE, tile, values, half, p->value_stride, d,
                        j0 == 0 ? NULL : rescale + r0, out);
        }
    }
    return 0;
}

/// Two passes: the largest value (and whether there is a NaN), then the first element equal to it (or the first NaN).
/// A sequence's scores (SmolLM2's 49,152 are 192 KiB) stay in L2 between them.
AVX512 ptrdiff_t vlm_argmax_avx512(const float *x, ptrdiff_t count) {
    const __m512 lowest = _mm512_set1_ps(-INFINITY);
    __m512 largest[4] = {lowest, lowest, lowest, lowest};
    __mmask16 unordered = 0;
    ptrdiff_t i = 0;
    for (; i + 4 * LANES <= count; i += 4 * LANES) {
        __m512 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm512_loadu_ps(x + i + k * LANES);
        unordered |= _mm512_cmp_ps_mask(v[0], v[1], _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v[2], v[3], _CMP_UNORD_Q);
        for (int k = 0; k < 4; k++) largest[k] = _mm512_max_ps(largest[k], v[k]);
    }
    for (; i < count; i += LANES) {
        const __m512 v = _mm512_mask_loadu_ps(lowest, tail_mask(count - i), x + i);
        unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        largest[0] = _mm512_max_ps(largest[0], v);
    }
    const __m512 target = _mm512_set1_ps(_mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_max_ps(largest[0], largest[1]), _mm512_max_ps(largest[2], largest[3]))));
    for (i = 0; i < count; i += LANES) {
        const __mmask16 m = tail_mask(count - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        const __mmask16 hit = unordered ? _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q)
                                        : _mm512_mask_cmp_ps_mask(m, v, target, _CMP_EQ_OQ);
        if (hit) return i + __builtin_ctz(hit);
    }
    return 0;
}

AVX512 void vlm_gated_silu_avx512(const float *x, ptrdiff_t rows, ptrdiff_t width, float *y) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (ptrdiff_t r = 0; r < rows; r++) {
        const float *gate = x + 2 * r * width, *up = gate + width;
        float *out = y + r * width;
        for (ptrdiff_t c = 0; c < width; c += LANES) {
            const __mmask16 m = tail_mask(width - c);
            const __m512 g = _mm512_maskz_loadu_ps(m, gate + c);
            // silu(g) = g / (1 + e^-g), from t = e^-|g| ≤ 1 so that the exponential never overflows:
            // g / (1 + t) for g ≥ 0, g·t / (1 + t) below.
            const __m512 t = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
            const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
            const __m512 numerator = _mm512_mask_mul_ps(g, negative, g, t);
            const __m512 silu = _mm512_div_ps(numerator, _mm512_add_ps(one, t));
            _mm512_mask_storeu_ps(out + c, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + c)));
        }
    }
}

/// vlm_rms_norm_scalar's arithmetic, operation for operation: lane k of one accumulator sums the squares of elements
/// k, k + 8, … in double (exact products, so fused or not the same), the lanes meet in the same order, and each
/// output is weight · (x · inverse) in floats: the same bits. SmolLM2-135M's 576 features on a Zen 5 VM: 0.089 µs a
/// row against the portable version's 0.140 (the lanes' chains of dependent additions, which the bits fix, bound
/// both).
AVX512 void vlm_rms_norm_avx512(const float *x, const float *weight, ptrdiff_t rows, ptrdiff_t features, float eps,
                                float *y) {
    for (ptrdiff_t row = 0; row < rows; row++, x += features, y += features) {
        __m512d partial = _mm512_setzero_pd();
        ptrdiff_t i = 0;
        for (; i + 8 <= features; i += 8) {
            const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
            partial = _mm512_add_pd(partial, _mm512_mul_pd(v, v));
        }
        double p[8];
        _mm512_storeu_pd(p, partial);
        double sum_of_squares = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
        for (; i < features; i++) sum_of_squares += (double)x[i] * (double)x[i];
        const __m512 inverse = _mm512_set1_ps(1 / sqrtf((float)(sum_of_squares / (double)features) + eps));
        // In place too: each vector is read before it is written.
        for (i = 0; i < features; i += LANES) {
            const __mmask16 m = tail_mask(features - i);
            const __m512 scaled = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inverse);
            _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, weight + i), scaled));
        }
    }
}

AVX512 void vlm_layer_norm_avx512(const float *x, float *y, ptrdiff_t rows, ptrdiff_t features, const float *weight,
                                  const float *bias, float eps) {
    for (ptrdiff_t row = 0; row < rows; row++) {
        const float *in = x + row * features;
        float *out = y + row * features;
        // Double sums make mean and variance correctly rounded; PyTorch's float reductions come within an ulp.
        __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
        for (ptrdiff_t c = 0; c < features; c += LANES) {
            __m512 v = _mm512_maskz_loadu_ps(tail_mask(features - c), in + c);
            low = _mm512_add_pd(low, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
            high = _mm512_add_pd(high, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
        }
        const double mean = _mm512_reduce_add_pd(_mm512_add_pd(low, high)) / (double)features;
        const __m512d mean_vector = _mm512_set1_pd(mean);
        low = _mm512_setzero_pd();
        high = _mm512_setzero_pd();
        for (ptrdiff_t c = 0; c < features; c += LANES) {
            __mmask16 m = tail_mask(features - c);
            __m512 v = _mm512_maskz_loadu_ps(m, in + c);
            __m512d dl = _mm512_maskz_sub_pd((__mmask8)m, _mm512_cvtps_pd(_mm512_castps512_ps256(v)), mean_vector);
            __m512d dh = _mm512_maskz_sub_pd((__mmask8)(m >> 8),
                                             _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)),
                                             mean_vector);
            low = _mm512_fmadd_pd(dl, dl, low);
            high = _mm512_fmadd_pd(dh, dh, high);
        }
        const double variance = _mm512_reduce_add_pd(_mm512_add_pd(low, high)) / (double)features;
        // The same float steps as PyTorch's kernel: rstd from the float variance, then (x·rstd - mean·rstd)·w + b.
        const float rstd = 1.0f / sqrtf((float)variance + eps);
        const __m512 scale = _mm512_set1_ps(rstd), shift = _mm512_set1_ps(-rstd * (float)mean);
        for (ptrdiff_t c = 0; c < features; c += LANES) {
            __mmask16 m = tail_mask(features - c);
            __m512 normalized = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, in + c), scale, shift);
            __m512 result = _mm512_fmadd_ps(normalized, _mm512_maskz_loadu_ps(m, weight + c), _mm512_maskz_loadu_ps(m, bias + c));
            _mm512_mask_storeu_ps(out + c, m, result);
        }
    }
}

AVX512 void vlm_quantize_rows_int8_avx512(const float *x, ptrdiff_t rows, ptrdiff_t features, signed char *q,
                                          float *scales) {
    const __m512 limit = _mm512_set1_ps(127.0f);
    for (ptrdiff_t row = 0; row < rows; row++) {
        const float *in = x + row * features;
        signed char *out = q + row * features;
        // Four running maxima: one chain of dependent maxima held the pass to its latency (CLIP ViT-B/32 int8 batch
        // 32 on a Zen 5 VM: the quantization 7.75% of samples; the kernel 1.3-1.4x faster alone and the model's
        // images 4-5% faster with four). The maximum is exact in any order, so the scales are the same.
        __m512 largest[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        __mmask16 nonfinite[4] = {0, 0, 0, 0};
        ptrdiff_t c = 0;
        for (; c + 4 * LANES <= features; c += 4 * LANES) {
            for (int u = 0; u < 4; u++) {
                const __m512 v = _mm512_loadu_ps(in + c + u * LANES);
                largest[u] = _mm512_max_ps(largest[u], _mm512_abs_ps(v));
                nonfinite[u] |= _mm512_fpclass_ps_mask(v, 0x99);  // NaN and ±infinity
            }
        }
        for (; c < features; c += LANES) {
            const __m512 v = _mm512_maskz_loadu_ps(tail_mask(features - c), in + c);
            largest[0] = _mm512_max_ps(largest[0], _mm512_abs_ps(v));
            nonfinite[0] |= _mm512_fpclass_ps_mask(v, 0x99);
        }
        largest[0] = _mm512_max_ps(_mm512_max_ps(largest[0], largest[1]), _mm512_max_ps(largest[2], largest[3]));
        const __mmask16 nonfinite_any = nonfinite[0] | nonfinite[1] | nonfinite[2] | nonfinite[3];
        if (nonfinite_any) {
            // NaN scale, zero values: the products this row enters are NaN, as they would be in fp32.
            scales[row] = __builtin_nanf("");
            memset(out, 0, (size_t)features);
            continue;
        }
        const float top = _mm512_reduce_max_ps(largest[0]);
        const __m512 inverse = _mm512_set1_ps(top > 0 ? 127.0f / top : 1.0f);
        scales[row] = top > 0 ? top / 127.0f : 1.0f;
        for (ptrdiff_t c = 0; c < features; c += LANES) {
            const __mmask16 m = tail_mask(features - c);
            // Clamped to ±127 before the conversion, which rounds to nearest even as the scalar nearbyintf does.
            __m512 scaled = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, in + c), inverse);
            scaled = _mm512_max_ps(_mm512_min_ps(scaled, limit), _mm512_sub_ps(_mm512_setzero_ps(), limit));
            _mm_mask_storeu_epi8(out + c, m, _mm512_cvtepi32_epi8(_mm512_cvt_roundps_epi32(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
        }
    }
}

#endif

AVX512 void vlm_floats_to_halves_avx512(const float *x, ptrdiff_t count, uint16_t *y) {
    for (ptrdiff_t i = 0; i < count; i += LANES) {
        const __mmask16 m = tail_mask(count - i);
        const __m256i halves = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(y + i, m, halves);
    }
}

AVX512 void vlm_halves_to_floats_avx512(const uint16_t *x, ptrdiff_t count, float *y) {
    for (ptrdiff_t i = 0; i < count; i += LANES) {
        const __mmask16 m = tail_mask(count - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)));
    }
}
