#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

// Plain C for any CPU, written so that compilers vectorize the inner loops: every dot product runs over an
// independent output element (no reassociated reduction), with fused multiply-adds in the same order as the AVX-512
// path and the GEMM kernels behind PyTorch. On x86-64 Linux the functions are also compiled for x86-64-v3 (AVX2,
// FMA) and the loader picks that copy where the CPU has it; elsewhere fmaf is a single instruction (arm64) or a
// library call (x86-64 before 2013).

/// Keys per row of the packed kᵀ; a multiple of the widest vector so rows stay aligned.
enum { PACK = 16 };

/// e^x for x ≤ 0 as avx512.c computes it (Cody–Waite reduction, Cephes' polynomial), branch-free so that loops
/// over it vectorize. Below -87.3 the result would be subnormal and is flushed to 0; NaN stays NaN.
static inline float exp_nonpositive(float x) {
    float clamped = x < -87.3f ? -87.3f : x;
    float n = rintf(clamped * 1.44269504088896341f);
    float r = fmaf(-n, 0.693359375f, clamped);
    r = fmaf(-n, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    float y = fmaf(p, r * r, r) + 1.0f;
    union { uint32_t bits; float value; } scale = {.bits = (uint32_t)((int32_t)n + 127) << 23};
    float result = y * scale.value;
    return x < -87.3f ? 0.0f : (x != x ? x : result);
}

/// Scale, mask (0 or -inf per key, or NULL), subtract the max, exponentiate and normalize row[0 ..< visible] in
/// place. A row with no visible key becomes uniform over all key_length keys. Returns how many leading
/// probabilities the value product must read.
PORTABLE_CLONES static ptrdiff_t softmax_row(float *restrict row, ptrdiff_t visible, ptrdiff_t key_length,
                                             float scale, const float *restrict mask_bias) {
    float max = -INFINITY;
    for (ptrdiff_t j = 0; j < visible; j++) {
        float s = row[j] * scale + (mask_bias ? mask_bias[j] : 0.0f);
        row[j] = s;
        max = s > max ? s : max;
    }
    if (max == -INFINITY) {
        for (ptrdiff_t j = 0; j < key_length; j++) row[j] = 1.0f / (float)key_length;
        return key_length;
    }
    for (ptrdiff_t j = 0; j < visible; j++) row[j] = exp_nonpositive(row[j] - max);
    double sum = 0;
    for (ptrdiff_t j = 0; j < visible; j++) sum += row[j];
    const float inverse = 1.0f / (float)sum;
    for (ptrdiff_t j = 0; j < visible; j++) row[j] *= inverse;
    return visible;
}

PORTABLE_CLONES static void attention_head(const vlm_attention_problem *p, ptrdiff_t head, float *restrict keys_transposed,
                                           ptrdiff_t packed_width, float *restrict scores, const float *mask_bias) {
    const ptrdiff_t d = p->head_dim, tk = p->key_length;
    const float *key = p->key + head * d, *value = p->value + head * d;
    for (ptrdiff_t j = 0; j < tk; j++)
        for (ptrdiff_t c = 0; c < d; c++) keys_transposed[c * packed_width + j] = key[j * p->key_stride + c];
    for (ptrdiff_t i = 0; i < p->query_length; i++) {
        const float *q = p->query + i * p->query_stride + head * d;
        float *restrict out = p->output + i * p->output_stride + head * d;
        const ptrdiff_t visible = vlm_visible_keys(p, i);
        memset(scores, 0, (size_t)visible * sizeof(float));
        for (ptrdiff_t c = 0; c < d; c++) {
            const float qc = q[c];
            const float *restrict kt = keys_transposed + c * packed_width;
            for (ptrdiff_t j = 0; j < visible; j++) scores[j] = fmaf(qc, kt[j], scores[j]);
        }
        const ptrdiff_t used = softmax_row(scores, visible, tk, p->scale, mask_bias);
        memset(out, 0, (size_t)d * sizeof(float));
        for (ptrdiff_t j = 0; j < used; j++) {
            const float probability = scores[j];
            const float *restrict v = value + j * p->value_stride;
            for (ptrdiff_t c = 0; c < d; c++) out[c] = fmaf(probability, v[c], out[c]);
        }
    }
}

int vlm_attention_scalar(const vlm_attention_problem *p) {
    const ptrdiff_t tk = p->key_length;
    const ptrdiff_t packed_width = (tk + PACK - 1) / PACK * PACK;
    const size_t packed = (size_t)(p->head_dim * packed_width), row = (size_t)(packed_width > 0 ? packed_width : PACK);
    float *scratch = malloc((packed + row + (p->key_mask ? row : 0)) * sizeof(float));
    if (!scratch) return -1;
    float *mask_bias = p->key_mask ? scratch + packed + row : NULL;
    for (ptrdiff_t j = 0; mask_bias && j < tk; j++) mask_bias[j] = p->key_mask[j] != 0 ? 0.0f : -INFINITY;
    for (ptrdiff_t h = 0; h < p->head_count; h++)
        attention_head(p, h, scratch, packed_width, scratch + packed, mask_bias);
    free(scratch);
    return 0;
}

int vlm_attention_partial_scalar(const vlm_attention_problem *p, ptrdiff_t first_key, ptrdiff_t key_count, float *maxima,
                                 float *sums, float *outputs) {
    float *scores = vlm_attention_partial_scratch((size_t)key_count * sizeof(float));
    if (!scores) return -1;
    const ptrdiff_t d = p->head_dim;
    const float *key = p->key + first_key * p->key_stride, *value = p->value + first_key * p->value_stride;
    for (ptrdiff_t i = 0; i < p->query_length; i++) {
        const float *q = p->query + i * p->query_stride;
        float max = -INFINITY;
        for (ptrdiff_t j = 0; j < key_count; j++) {
            float dot = 0;
            for (ptrdiff_t c = 0; c < d; c++) dot = fmaf(q[c], key[j * p->key_stride + c], dot);
            scores[j] = dot * p->scale;
            max = scores[j] > max ? scores[j] : max;
        }
        double sum = 0;
        float *restrict out = outputs + i * d;
        memset(out, 0, (size_t)d * sizeof(float));
        for (ptrdiff_t j = 0; j < key_count; j++) {
            const float e = exp_nonpositive(scores[j] - max);
            sum += e;
            for (ptrdiff_t c = 0; c < d; c++) out[c] = fmaf(e, value[j * p->value_stride + c], out[c]);
        }
        maxima[i] = max;
        sums[i] = (float)sum;
    }
    return 0;
}

/// Round to nearest, ties to even, as F16C's vcvtps2ph does it: a NaN becomes a quiet NaN keeping the top of its
/// payload, so that this and the AVX-512 path give the same bits for every float.
void vlm_floats_to_halves_scalar(const float *x, ptrdiff_t count, uint16_t *y) {
    for (ptrdiff_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, x + i, sizeof bits);
        const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
        const uint32_t magnitude = bits & 0x7FFFFFFFu;
        if (magnitude > 0x7F800000u) {
            y[i] = (uint16_t)(sign | 0x7E00 | ((magnitude >> 13) & 0x3FF));
        } else if (magnitude >= 0x47800000u) {
            // 2^16 and above (infinity included); values from 65520 up round to infinity in the normal case below.
            y[i] = (uint16_t)(sign | 0x7C00);
        } else if (magnitude < 0x38800000u) {
            // Below the smallest normal half (2^-14): a subnormal, counted in units of 2^-24.
            if (magnitude < 0x33000000u) {
                y[i] = sign;  // under 2^-25: rounds to zero (2^-25 itself is a tie, to the even zero)
                continue;
            }
            const uint32_t exponent = magnitude >> 23, significand = (magnitude & 0x7FFFFFu) | 0x800000u;
            const uint32_t shift = 126 - exponent;  // 14 to 24
            const uint32_t kept = significand >> shift, rest = significand & ((1u << shift) - 1), half = 1u << (shift - 1);
            y[i] = (uint16_t)(sign | (kept + (rest > half || (rest == half && (kept & 1)))));
        } else {
            // A carry out of the significand rounds into the exponent, up to infinity: still the right bits.
            const uint32_t rebased = magnitude - 0x38000000u, kept = rebased >> 13, rest = rebased & 0x1FFF;
            y[i] = (uint16_t)(sign | (kept + (rest > 0x1000 || (rest == 0x1000 && (kept & 1)))));
        }
    }
}

PORTABLE_CLONES void vlm_gated_silu_scalar(const float *x, ptrdiff_t rows, ptrdiff_t width, float *y) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const float *gate = x + 2 * r * width, *up = gate + width;
        for (ptrdiff_t c = 0; c < width; c++) {
            const float g = gate[c], t = exp_nonpositive(-fabsf(g));
            y[r * width + c] = (g < 0 ? g * t : g) / (1.0f + t) * up[c];
        }
    }
}

ptrdiff_t vlm_argmax_scalar(const float *x, ptrdiff_t count) {
    ptrdiff_t best = 0;
    for (ptrdiff_t i = 0; i < count; i++) {
        if (x[i] != x[i]) return i;
        if (x[i] > x[best]) best = i;
    }
    return best;
}

/// Σ (x[c] - center)² over `count` floats (Σ x[c] with `square` false), in double. Eight independent partial sums
/// let the loop vectorize without reassociating a single sum.
static inline double sum_in_double(const float *x, ptrdiff_t count, double center, int square) {
    double partial[8] = {0};
    ptrdiff_t c = 0;
    for (; c + 8 <= count; c += 8) {
        for (int lane = 0; lane < 8; lane++) {
            double value = (double)x[c + lane] - center;
            partial[lane] += square ? value * value : value;
        }
    }
    for (; c < count; c++) {
        double value = (double)x[c] - center;
        partial[0] += square ? value * value : value;
    }
    return ((partial[0] + partial[4]) + (partial[1] + partial[5])) + ((partial[2] + partial[6]) + (partial[3] + partial[7]));
}

PORTABLE_CLONES void vlm_layer_norm_scalar(const float *x, float *y, ptrdiff_t rows, ptrdiff_t features,
                                           const float *weight, const float *bias, float eps) {
    for (ptrdiff_t row = 0; row < rows; row++) {
        const float *in = x + row * features;
        float *restrict out = y + row * features;
        // Double sums make mean and variance correctly rounded; PyTorch's float reductions come within an ulp.
        const double mean = sum_in_double(in, features, 0, 0) / (double)features;
        const double variance = sum_in_double(in, features, mean, 1) / (double)features;
        // The same float steps as PyTorch's kernel: rstd from the float variance, then (x·rstd - mean·rstd)·w + b.
        const float rstd = 1.0f / sqrtf((float)variance + eps);
        const float shift = -rstd * (float)mean;
        for (ptrdiff_t c = 0; c < features; c++) out[c] = fmaf(fmaf(in[c], rstd, shift), weight[c], bias[c]);
    }
}

PORTABLE_CLONES void vlm_quantize_rows_int8_scalar(const float *x, ptrdiff_t rows, ptrdiff_t features, signed char *q,
                                                   float *scales) {
    for (ptrdiff_t row = 0; row < rows; row++) {
        const float *in = x + row * features;
        signed char *out = q + row * features;
        float largest = 0;
        int finite = 1;
        for (ptrdiff_t c = 0; c < features; c++) {
            largest = fmaxf(largest, fabsf(in[c]));
            finite &= isfinite(in[c]) != 0;
        }
        if (!finite) {
            // NaN scale, zero values: the products this row enters are NaN, as they would be in fp32.
            scales[row] = __builtin_nanf("");
            memset(out, 0, (size_t)features);
            continue;
        }
        const float inverse = largest > 0 ? 127.0f / largest : 1.0f;
        scales[row] = largest > 0 ? largest / 127.0f : 1.0f;
        for (ptrdiff_t c = 0; c < features; c++) {
            const float value = nearbyintf(in[c] * inverse);
            out[c] = (signed char)(value > 127 ? 127 : (value < -127 ? -127 : value));
        }
    }
}
