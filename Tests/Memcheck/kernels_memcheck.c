// Drives every CVLMKernels entry point on small, odd shapes and checks each implementation against a plain
// double-precision reference (or, for the quantized formats, against the portable path), so that running it
// under valgrind memcheck or the sanitizers exercises real work, not just calls. Built and run by scripts/memcheck.
// Under valgrind the CPU reports no AVX-512, so the AVX-512 requests fall back as on such CPUs; natively (and under
// the sanitizers) they run the AVX-512 code.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vlm_kernels.h"
#include "kernels_internal.h"

static uint64_t state = 0x5EED;
static int failures = 0;

static uint32_t next(void) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(state >> 33);
}

static float uniform(void) { return (float)next() / (float)(1u << 31) * 2.0f - 1.0f; }

static float *random_floats(ptrdiff_t count) {
    float *values = malloc((size_t)count * sizeof(float));
    for (ptrdiff_t i = 0; i < count; i++) values[i] = uniform();
    return values;
}

/// Sums against double references, each within `tolerance` of the sum of its terms' magnitudes.
static void expect_sum_close(const char *what, const float *actual, const double *expected, const double *magnitude,
                             ptrdiff_t count, double tolerance) {
    for (ptrdiff_t i = 0; i < count; i++) {
        if (!(fabs(actual[i] - expected[i]) <= tolerance * (1.0 + magnitude[i]))) {
            fprintf(stderr, "%s: element %td is %.9g, expected %.9g (terms' magnitudes %.6g)\n", what, i, actual[i],
                    expected[i], magnitude[i]);
            failures++;
            return;
        }
    }
}

static void expect_close(const char *what, const float *actual, const double *expected, ptrdiff_t count, double tolerance) {
    for (ptrdiff_t i = 0; i < count; i++) {
        if (!(fabs(actual[i] - expected[i]) <= tolerance * (1.0 + fabs(expected[i])))) {
            fprintf(stderr, "%s: element %td is %.9g, expected %.9g\n", what, i, actual[i], expected[i]);
            failures++;
            return;
        }
    }
}

static const vlm_kernel_isa isas[] = {VLM_ISA_SCALAR, VLM_ISA_AVX2, VLM_ISA_AVX512};
static const char *isa_names[] = {"scalar", "avx2", "avx512"};

static const char *isa_name(vlm_kernel_isa isa) { return isa == VLM_ISA_AVX512 ? "avx512" : isa == VLM_ISA_AVX2 ? "avx2" : "scalar"; }

/// The two calls of a panel product check (`first`, `second`: their results): where the CPU runs the kernel
/// (`supported`), sums against the double reference; elsewhere refusals that wrote nothing (y stays NaN).
static void expect_panel_results(const char *kernel, ptrdiff_t k, ptrdiff_t n, int first, int second, int supported,
                                 const float *y, const double *expected, const double *magnitude) {
    char what[64];
    snprintf(what, sizeof what, "%s %tdx%td", kernel, k, n);
    if (supported) {
        if (first != 0 || second != 0) failures++;
        expect_sum_close(what, y, expected, magnitude, n, 1e-6);
    } else {
        if (first != -1 || second != -1) failures++;
        for (ptrdiff_t c = 0; c < n; c++)
            if (!isnan(y[c])) failures++;
    }
}

/// One row times a k × n matrix packed in 64-column panels (oneDNN's BA16a64b, rows padded to whole 16-row blocks)
/// through vlm_panel_matvec, in two calls over the panels, with a bias; the panels' buffer holds exactly what the
/// layout needs, so a read past it shows. AVX-512 only: elsewhere the call must refuse and write nothing.
static void check_panel_matvec(ptrdiff_t k, ptrdiff_t n) {
    const ptrdiff_t padded = (k + 15) / 16 * 16, panels = (n + 63) / 64, stride = padded * 64;
    float *packed = calloc((size_t)(panels * stride), sizeof(float));
    float *x = random_floats(k), *bias = random_floats(n), *y = malloc((size_t)n * sizeof(float));
    double *expected = malloc((size_t)n * sizeof(double)), *magnitude = malloc((size_t)n * sizeof(double));
    for (ptrdiff_t c = 0; c < n; c++) {
        expected[c] = bias[c];
        magnitude[c] = fabs(bias[c]);
    }
    for (ptrdiff_t r = 0; r < k; r++)
        for (ptrdiff_t c = 0; c < n; c++) {
            const float w = uniform();
            packed[c / 64 * stride + r * 64 + c % 64] = w;
            expected[c] += (double)x[r] * w;
            magnitude[c] += fabs((double)x[r] * w);
        }
    for (ptrdiff_t c = 0; c < n; c++) y[c] = NAN;
    const ptrdiff_t half = panels / 2;
    const int first = vlm_panel_matvec(packed, k, n, stride, x, bias, y, 0, half);
    const int second = vlm_panel_matvec(packed, k, n, stride, x, bias, y, half, panels - half);
    expect_panel_results("panel_matvec", k, n, first, second, vlm_best_isa() == VLM_ISA_AVX512, y, expected, magnitude);
    free(packed);
    free(x);
    free(bias);
    free(y);
    free(expected);
    free(magnitude);
}

/// The bf16 form (oneDNN's BA16a64b2a: rows in pairs, padded to whole 32-row blocks), with values exact in bf16 and
/// the row `x` exactly `k` values long, so that an odd k's missing half pair would be read past its end.
static void check_panel_matvec_bf16(ptrdiff_t k, ptrdiff_t n) {
    const ptrdiff_t padded = (k + 31) / 32 * 32, panels = (n + 63) / 64, stride = padded * 64;
    uint16_t *packed = calloc((size_t)(panels * stride), sizeof(uint16_t)), *x = malloc((size_t)k * sizeof(uint16_t));
    float *bias = random_floats(n), *y = malloc((size_t)n * sizeof(float));
    double *expected = malloc((size_t)n * sizeof(double)), *magnitude = malloc((size_t)n * sizeof(double));
    #define BF16_OF(value, bits) do { float f_ = (value); uint32_t u_; memcpy(&u_, &f_, 4); bits = (uint16_t)(u_ >> 16); } while (0)
    #define FLOAT_OF(bits) ({ uint32_t u_ = (uint32_t)(bits) << 16; float f_; memcpy(&f_, &u_, 4); f_; })
    for (ptrdiff_t r = 0; r < k; r++) BF16_OF(uniform(), x[r]);
    for (ptrdiff_t c = 0; c < n; c++) {
        expected[c] = bias[c];
        magnitude[c] = fabs(bias[c]);
    }
    for (ptrdiff_t r = 0; r < k; r++)
        for (ptrdiff_t c = 0; c < n; c++) {
            uint16_t w;
            BF16_OF(uniform(), w);
            packed[c / 64 * stride + r / 2 * 128 + c % 64 * 2 + r % 2] = w;
            expected[c] += (double)FLOAT_OF(x[r]) * FLOAT_OF(w);
            magnitude[c] += fabs((double)FLOAT_OF(x[r]) * FLOAT_OF(w));
        }
    #undef BF16_OF
    #undef FLOAT_OF
    for (ptrdiff_t c = 0; c < n; c++) y[c] = NAN;
    const ptrdiff_t half = panels / 2;
    const int first = vlm_panel_matvec_bf16(packed, k, n, stride, x, bias, y, 0, half);
    const int second = vlm_panel_matvec_bf16(packed, k, n, stride, x, bias, y, half, panels - half);
    expect_panel_results("panel_matvec_bf16", k, n, first, second,
                         vlm_best_isa() == VLM_ISA_AVX512 && __builtin_cpu_supports("avx512bf16"), y, expected, magnitude);
    free(packed);
    free(x);
    free(bias);
    free(y);
    free(expected);
    free(magnitude);
}

/// One int8 row times a plain k × n int8 matrix through vlm_int8_matvec, in two calls over the panels, with and
/// without a bias: the int32 sums exactly, then scaled in float as the kernel's contract says (the weights' extremes
/// ±127 and ±128 are in). The matrix is exactly k·n bytes and the row k bytes, so a read past either shows; a k
/// that is not a multiple of 4 leaves the last group of rows short.
static void check_int8_matvec(ptrdiff_t k, ptrdiff_t n) {
    int8_t *w = malloc((size_t)(k * n)), *x = malloc((size_t)k);
    int32_t *sums = malloc((size_t)n * sizeof(int32_t));
    float *scales = random_floats(n), *bias = random_floats(n), *y = malloc((size_t)n * sizeof(float));
    for (ptrdiff_t i = 0; i < k * n; i++) w[i] = (int8_t)(i % 97 == 0 ? -128 : (int)(next() % 255) - 127);
    for (ptrdiff_t r = 0; r < k; r++) x[r] = (int8_t)((int)(next() % 255) - 127);
    vlm_int8_column_sums(w, k, n, sums);
    const float row_scale = 0.0123f;
    const int supported = vlm_best_isa() == VLM_ISA_AVX512 && __builtin_cpu_supports("avx512vnni");
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        for (ptrdiff_t c = 0; c < n; c++) y[c] = NAN;
        const ptrdiff_t panels = (n + 63) / 64, half = panels / 2;
        const float *b = with_bias ? bias : NULL;
        const int first = vlm_int8_matvec(w, k, n, x, sums, scales, row_scale, b, y, 0, half);
        const int second = vlm_int8_matvec(w, k, n, x, sums, scales, row_scale, b, y, half, panels - half);
        if (!supported) {
            if (first != -1 || second != -1) failures++;
            for (ptrdiff_t c = 0; c < n; c++)
                if (!isnan(y[c])) failures++;
            continue;
        }
        if (first != 0 || second != 0) failures++;
        for (ptrdiff_t c = 0; c < n; c++) {
            int64_t sum = 0, column = 0;
            for (ptrdiff_t r = 0; r < k; r++) {
                sum += (int64_t)x[r] * w[r * n + c];
                column += w[r * n + c];
            }
            float expected = (float)(int32_t)sum * scales[c];
            expected = expected * row_scale;
            if (b) expected = expected + b[c];
            if (y[c] != expected || column != sums[c]) {
                fprintf(stderr, "int8_matvec %tdx%td column %td: %.9g, expected %.9g\n", k, n, c, y[c], expected);
                failures++;
                break;
            }
        }
    }
    free(w);
    free(x);
    free(sums);
    free(scales);
    free(bias);
    free(y);
}

/// Attention with strided heads, a causal mask or a key mask, against a double reference; then the same rows split
/// along the keys through vlm_attention_partial and merged.
static void check_attention(ptrdiff_t queries, ptrdiff_t keys, ptrdiff_t head_dim, ptrdiff_t heads, int causal, int masked) {
    const ptrdiff_t width = head_dim * heads, stride = 3 * width + 5;
    float *qkv = random_floats(stride * (queries > keys ? queries : keys));
    float *kv = random_floats(stride * keys);
    float *mask = NULL;
    if (masked) {
        mask = malloc((size_t)keys * sizeof(float));
        for (ptrdiff_t k = 0; k < keys; k++) mask[k] = (k % 3 == 1) ? 0.0f : 1.0f;
    }
    const float scale = 1.0f / sqrtf((float)head_dim);
    double *expected = calloc((size_t)(queries * width), sizeof(double));
    double *scores = malloc((size_t)keys * sizeof(double));
    for (ptrdiff_t h = 0; h < heads; h++) {
        for (ptrdiff_t i = 0; i < queries; i++) {
            double maximum = -INFINITY;
            int seen = 0;
            for (ptrdiff_t k = 0; k < keys; k++) {
                const int visible = (!causal || k <= i + keys - queries) && (!mask || mask[k] != 0);
                double s = 0;
                for (ptrdiff_t d = 0; d < head_dim; d++)
                    s += (double)qkv[i * stride + h * head_dim + d] * kv[k * stride + width + h * head_dim + d];
                scores[k] = visible ? s * scale : -INFINITY;
                if (visible) seen = 1;
                if (scores[k] > maximum) maximum = scores[k];
            }
            double sum = 0;
            for (ptrdiff_t k = 0; k < keys; k++) {
                scores[k] = seen ? exp(scores[k] - maximum) : 1.0;
                sum += scores[k];
            }
            for (ptrdiff_t k = 0; k < keys; k++)
                for (ptrdiff_t d = 0; d < head_dim; d++)
                    expected[i * width + h * head_dim + d] += scores[k] / sum * kv[k * stride + 2 * width + h * head_dim + d];
        }
    }
    float *output = malloc((size_t)(queries * width) * sizeof(float));
    // Keys and values read as one stream a core and as several (vlm_attention_problem's `streams`).
    for (int isa = 0; isa < 3; isa++) {
        for (int streams = 1; streams <= VLM_QUANT_MAX_STREAMS; streams += VLM_QUANT_MAX_STREAMS - 1) {
            vlm_attention_problem problem = {
                .query = qkv, .key = kv + width, .value = kv + 2 * width, .output = output,
                .query_stride = stride, .key_stride = stride, .value_stride = stride, .output_stride = width,
                .query_length = queries, .key_length = keys, .head_dim = head_dim, .head_count = heads,
                .scale = scale, .causal = causal, .key_mask = mask, .streams = streams};
            memset(output, 0xFF, (size_t)(queries * width) * sizeof(float));
            if (vlm_attention(&problem, isas[isa]) != 0) failures++;
            char what[112];
            snprintf(what, sizeof what, "attention %s q%td k%td d%td h%td c%d m%d s%d", isa_names[isa], queries, keys,
                     head_dim, heads, causal, masked, streams);
            expect_close(what, output, expected, queries * width, 2e-5);
        }
    }
    if (vlm_has_avx512_bf16()) {
        // bf16 products (taken where there are more than 4 queries and the head size is even): bf16-rounded q and k
        // move the scores by about a hundredth here.
        vlm_attention_problem problem = {
            .query = qkv, .key = kv + width, .value = kv + 2 * width, .output = output,
            .query_stride = stride, .key_stride = stride, .value_stride = stride, .output_stride = width,
            .query_length = queries, .key_length = keys, .head_dim = head_dim, .head_count = heads,
            .scale = scale, .causal = causal, .key_mask = mask, .bf16_products = 1};
        memset(output, 0xFF, (size_t)(queries * width) * sizeof(float));
        if (vlm_attention(&problem, VLM_ISA_AVX512) != 0) failures++;
        char what[96];
        snprintf(what, sizeof what, "attention bf16 q%td k%td d%td h%td c%d m%d", queries, keys, head_dim, heads, causal, masked);
        expect_close(what, output, expected, queries * width, 3e-2);
    }
    {
        // Keys and values as halves (strided as the floats are) give exactly what floats of the same values give:
        // whole, and one head's decoding part from a third of the keys on.
        uint16_t *halves = malloc((size_t)(stride * keys) * sizeof(uint16_t));
        float *widened = malloc((size_t)(stride * keys) * sizeof(float));
        float *from_halves = malloc((size_t)(queries * width) * sizeof(float));
        vlm_floats_to_halves(kv, stride * keys, halves, VLM_ISA_SCALAR);
        vlm_halves_to_floats(halves, stride * keys, widened, VLM_ISA_SCALAR);
        for (int isa = 0; isa < 3; isa++) {
            vlm_attention_problem floats = {
                .query = qkv, .key = widened + width, .value = widened + 2 * width, .output = output,
                .query_stride = stride, .key_stride = stride, .value_stride = stride, .output_stride = width,
                .query_length = queries, .key_length = keys, .head_dim = head_dim, .head_count = heads,
                .scale = scale, .causal = causal, .key_mask = mask};
            vlm_attention_problem half = floats;
            half.key = half.value = NULL;
            half.half_key = halves + width, half.half_value = halves + 2 * width, half.output = from_halves;
            if (vlm_attention(&floats, isas[isa]) != 0 || vlm_attention(&half, isas[isa]) != 0) failures++;
            int same = memcmp(output, from_halves, (size_t)(queries * width) * sizeof(float)) == 0;
            float maxima[2][64], sums[2][64];
            floats.head_count = half.head_count = 1;
            floats.causal = half.causal = 0;
            floats.key_mask = half.key_mask = NULL;
            floats.output_stride = half.output_stride = head_dim;
            const ptrdiff_t first = keys / 3;
            if (vlm_attention_partial(&floats, first, keys - first, maxima[0], sums[0], output, isas[isa]) != 0 ||
                vlm_attention_partial(&half, first, keys - first, maxima[1], sums[1], from_halves, isas[isa]) != 0)
                failures++;
            same = same && memcmp(output, from_halves, (size_t)(queries * head_dim) * sizeof(float)) == 0 &&
                   memcmp(maxima[0], maxima[1], (size_t)queries * sizeof(float)) == 0 &&
                   memcmp(sums[0], sums[1], (size_t)queries * sizeof(float)) == 0;
            if (!same) {
                fprintf(stderr, "attention %s q%td k%td d%td h%td c%d m%d: halves differ from their floats\n", isa_names[isa],
                        queries, keys, head_dim, heads, causal, masked);
                failures++;
            }
        }
        free(halves);
        free(widened);
        free(from_halves);
    }
    if (!causal && !masked) {
        // One head's query rows over two key ranges, merged: the decoding split, its keys and values read as one
        // stream a core and as several.
        for (int run = 0; run < 6; run++) {
            const int isa = run / 2, streams = run % 2 ? VLM_QUANT_MAX_STREAMS : 1;
            const ptrdiff_t split = keys / 2 > 0 ? keys / 2 : 1;
            float maxima[2][64], sums[2][64];
            float *parts = malloc((size_t)(2 * queries * head_dim) * sizeof(float));
            vlm_attention_problem problem = {
                .query = qkv, .key = kv + width, .value = kv + 2 * width, .output = output,
                .query_stride = stride, .key_stride = stride, .value_stride = stride, .output_stride = head_dim,
                .query_length = queries, .key_length = keys, .head_dim = head_dim, .head_count = 1, .scale = scale,
                .streams = streams};
            int status = vlm_attention_partial(&problem, 0, split, maxima[0], sums[0], parts, isas[isa]);
            if (keys > split)
                status |= vlm_attention_partial(&problem, split, keys - split, maxima[1], sums[1], parts + queries * head_dim, isas[isa]);
            if (status != 0) failures++;
            float *merged = malloc((size_t)(queries * head_dim) * sizeof(float));
            double *reference = malloc((size_t)(queries * head_dim) * sizeof(double));
            for (ptrdiff_t i = 0; i < queries; i++) {
                const int two = keys > split;
                const double m = two && maxima[1][i] > maxima[0][i] ? maxima[1][i] : maxima[0][i];
                const double w0 = exp(maxima[0][i] - m), w1 = two ? exp(maxima[1][i] - m) : 0;
                const double total = w0 * sums[0][i] + w1 * (two ? sums[1][i] : 0);
                for (ptrdiff_t d = 0; d < head_dim; d++) {
                    merged[i * head_dim + d] = (float)((w0 * parts[i * head_dim + d]
                        + (two ? w1 * parts[(queries + i) * head_dim + d] : 0)) / total);
                    reference[i * head_dim + d] = expected[i * width + d];
                }
            }
            char what[96];
            snprintf(what, sizeof what, "attention_partial %s q%td k%td d%td s%d", isa_names[isa], queries, keys, head_dim,
                     streams);
            expect_close(what, merged, reference, queries * head_dim, 2e-5);
            free(parts);
            free(merged);
            free(reference);
        }
    }
    free(qkv);
    free(kv);
    free(mask);
    free(expected);
    free(scores);
    free(output);
}

static void check_elementwise(ptrdiff_t rows, ptrdiff_t width) {
    float *x = random_floats(rows * 2 * width), *y = malloc((size_t)(rows * 2 * width) * sizeof(float));
    float *weight = random_floats(width), *bias = random_floats(width);
    double *expected = malloc((size_t)(rows * width) * sizeof(double));
    for (ptrdiff_t r = 0; r < rows; r++)
        for (ptrdiff_t c = 0; c < width; c++) {
            const double g = x[r * 2 * width + c];
            expected[r * width + c] = g / (1 + exp(-g)) * x[r * 2 * width + width + c];
        }
    for (int isa = 0; isa < 3; isa++) {
        vlm_gated_silu(x, rows, width, y, isas[isa]);
        char what[64];
        snprintf(what, sizeof what, "gated_silu %s %tdx%td", isa_names[isa], rows, width);
        expect_close(what, y, expected, rows * width, 1e-5);
    }
    // Layer norm over rows of 2·width.
    const ptrdiff_t features = 2 * width;
    float *norm_weight = random_floats(features), *norm_bias = random_floats(features);
    double *normed = malloc((size_t)(rows * features) * sizeof(double));
    for (ptrdiff_t r = 0; r < rows; r++) {
        double mean = 0, variance = 0;
        for (ptrdiff_t c = 0; c < features; c++) mean += x[r * features + c];
        mean /= (double)features;
        for (ptrdiff_t c = 0; c < features; c++) variance += (x[r * features + c] - mean) * (x[r * features + c] - mean);
        variance /= (double)features;
        for (ptrdiff_t c = 0; c < features; c++)
            normed[r * features + c] = (x[r * features + c] - mean) / sqrt(variance + 1e-5) * norm_weight[c] + norm_bias[c];
    }
    for (int isa = 0; isa < 3; isa++) {
        vlm_layer_norm(x, y, rows, features, norm_weight, norm_bias, 1e-5f, isas[isa]);
        char what[64];
        snprintf(what, sizeof what, "layer_norm %s %tdx%td", isa_names[isa], rows, features);
        expect_close(what, y, normed, rows * features, 1e-5);
    }
    free(x);
    free(y);
    free(weight);
    free(bias);
    free(expected);
    free(norm_weight);
    free(norm_bias);
    free(normed);
}

/// Every ISA's argmax of `count` floats allocated to the byte (its tails read only what is there) is the first
/// largest, or the first NaN: for few distinct values (ties), all negative, all -inf, and one or two NaNs placed
/// anywhere.
static void check_argmax(ptrdiff_t count) {
    float *x = malloc((size_t)count * sizeof(float));
    for (int variant = 0; variant < 5; variant++) {
        for (ptrdiff_t i = 0; i < count; i++)
            x[i] = variant == 1 ? -INFINITY : variant == 2 ? -1.0f - (float)(next() % 5) : (float)(next() % 5) - 2.0f;
        if (variant >= 3) x[next() % count] = NAN;
        if (variant == 4) x[next() % count] = NAN;
        ptrdiff_t expected = 0;
        for (ptrdiff_t i = 1; i < count; i++)
            if (x[i] > x[expected] || (isnan(x[i]) && !isnan(x[expected]))) expected = i;
        for (int isa = 0; isa < 3; isa++) {
            const ptrdiff_t found = vlm_argmax(x, count, isas[isa]);
            if (found != expected) {
                fprintf(stderr, "argmax %s of %td (variant %d): %td, not %td\n", isa_names[isa], count, variant, found,
                        expected);
                failures++;
            }
        }
    }
    free(x);
}

/// vlm_rms_norm (AVX-512 where the CPU has it) gives the portable version's bits, into a buffer and in place, every
/// row normalized on its own.
static void check_rms_norm(ptrdiff_t rows, ptrdiff_t features) {
    float *x = random_floats(rows * features), *weight = random_floats(features);
    for (ptrdiff_t i = 0; i < rows * features; i += 7) x[i] *= 1e3f;
    float *expected = malloc((size_t)(rows * features) * sizeof(float));
    float *y = malloc((size_t)(rows * features) * sizeof(float));
    vlm_rms_norm_scalar(x, weight, rows, features, 1e-6f, expected);
    vlm_rms_norm(x, weight, rows, features, 1e-6f, y);
    int same = memcmp(y, expected, (size_t)(rows * features) * sizeof(float)) == 0;
    vlm_rms_norm(x, weight, rows, features, 1e-6f, x);
    same = same && memcmp(x, expected, (size_t)(rows * features) * sizeof(float)) == 0;
    if (!same) {
        fprintf(stderr, "rms_norm %s of %td rows of %td: not the portable version's bits\n", isa_name(vlm_best_isa()),
                rows, features);
        failures++;
    }
    free(x);
    free(weight);
    free(expected);
    free(y);
}

static void check_gemm(ptrdiff_t m, ptrdiff_t n, ptrdiff_t k, int transpose) {
    float *a = random_floats(m * k), *b = random_floats(k * n), *c = malloc((size_t)(m * n) * sizeof(float));
    double *expected = calloc((size_t)(m * n), sizeof(double));
    for (ptrdiff_t i = 0; i < m; i++)
        for (ptrdiff_t j = 0; j < n; j++)
            for (ptrdiff_t p = 0; p < k; p++)
                expected[i * n + j] += (double)a[i * k + p] * (transpose ? b[j * k + p] : b[p * n + j]);
    if (vlm_gemm(m, n, k, a, k, b, transpose ? k : n, transpose, c, n) != 0) failures++;
    char what[64];
    snprintf(what, sizeof what, "gemm %tdx%tdx%td t%d", m, n, k, transpose);
    expect_close(what, c, expected, m * n, 1e-4);
    free(a);
    free(b);
    free(c);
    free(expected);
}

/// A half-precision value of magnitude 2^-5 to 2^-1, as a block scale.
static uint16_t small_half(void) { return (uint16_t)((next() & 1) << 15 | (10 + next() % 4) << 10 | (next() & 0x3FF)); }

/// Random blocks of `format` whose scale fields are small finite halves (bf16/f16 elements likewise).
static uint8_t *random_blocks(vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns, ptrdiff_t *row_bytes) {
    ptrdiff_t elements, bytes;
    vlm_quant_block_layout(format, &elements, &bytes);
    *row_bytes = columns / elements * bytes;
    uint8_t *data = malloc((size_t)(rows * *row_bytes));
    for (ptrdiff_t i = 0; i < rows * *row_bytes; i++) data[i] = (uint8_t)next();
    for (ptrdiff_t block = 0; block < rows * columns / elements; block++) {
        uint8_t *b = data + block * bytes;
        uint16_t fields[32];
        int count = 0, at[32];
        switch (format) {
        case VLM_QUANT_F16:
            for (int i = 0; i < 32; i++) at[count++] = 2 * i;
            break;
        case VLM_QUANT_BF16:
            for (int i = 0; i < 32; i++) {
                const uint16_t v = (uint16_t)((next() & 1) << 15 | (120 + next() % 6) << 7 | (next() & 0x7F));
                memcpy(b + 2 * i, &v, 2);
            }
            break;
        case VLM_QUANT_Q4_1: case VLM_QUANT_Q5_1: case VLM_QUANT_Q4_K: case VLM_QUANT_Q5_K:
            at[count++] = 0;
            at[count++] = 2;
            break;
        case VLM_QUANT_Q6_K: at[count++] = 208; break;
        default: at[count++] = 0; break;
        }
        for (int i = 0; i < count; i++) {
            fields[i] = small_half();
            memcpy(b + at[i], &fields[i], 2);
        }
    }
    return data;
}

static void check_quantized(vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns, ptrdiff_t m) {
    ptrdiff_t row_bytes;
    uint8_t *data = random_blocks(format, rows, columns, &row_bytes);
    const vlm_quant_matrix matrix = {.data = data, .format = format, .rows = rows, .columns = columns, .row_bytes = row_bytes};
    float *dequantized = malloc((size_t)(rows * columns) * sizeof(float)), *other = malloc((size_t)(rows * columns) * sizeof(float));
    vlm_quant_dequantize_rows(&matrix, 0, rows, dequantized, columns, VLM_ISA_SCALAR);
    for (int isa = 1; isa < 3; isa++) {
        vlm_quant_dequantize_rows(&matrix, 0, rows, other, columns, isas[isa]);
        if (memcmp(dequantized, other, (size_t)(rows * columns) * sizeof(float)) != 0) {
            fprintf(stderr, "dequantize format %d %s differs from scalar\n", format, isa_names[isa]);
            failures++;
        }
    }
    float *x = random_floats(m * columns), *y = malloc((size_t)(m * rows) * sizeof(float));
    // The products are fp32 sums, so their error scales with the sum of the terms' magnitudes, not with the result:
    // random K-quant blocks give terms far larger than a sum that cancels them.
    double *expected = calloc((size_t)(m * rows), sizeof(double)), *magnitude = calloc((size_t)(m * rows), sizeof(double));
    for (ptrdiff_t i = 0; i < m; i++)
        for (ptrdiff_t j = 0; j < rows; j++)
            for (ptrdiff_t c = 0; c < columns; c++) {
                const double term = (double)x[i * columns + c] * dequantized[j * columns + c];
                expected[i * rows + j] += term;
                magnitude[i * rows + j] += fabs(term);
            }
    for (int isa = 0; isa < 3; isa++) {
        memset(y, 0xFF, (size_t)(m * rows) * sizeof(float));
        vlm_quant_matmul_rows(&matrix, x, m, columns, y, rows, 0, rows, isas[isa]);
        char what[64];
        snprintf(what, sizeof what, "quant_matmul format %d %s", format, isa_names[isa]);
        expect_sum_close(what, y, expected, magnitude, m * rows, 3e-5);
    }
    const ptrdiff_t packed_size = vlm_quant_packed_size(format, rows, columns);
    if (packed_size > 0 && vlm_quant_packed_supported()) {
        void *packed = aligned_alloc(64, (size_t)((packed_size + 63) / 64 * 64));
        vlm_quant_pack(&matrix, packed);
        const ptrdiff_t activation_bytes = vlm_quant_activation_size(columns);
        uint8_t *activations = malloc((size_t)(m * activation_bytes));
        for (ptrdiff_t i = 0; i < m; i++) vlm_quant_activation(x + i * columns, columns, activations + i * activation_bytes);
        for (int isa = 1; isa < 3; isa++) {
            memset(y, 0xFF, (size_t)(m * rows) * sizeof(float));
            vlm_quant_packed_matmul(packed, format, rows, columns, activations, m, y, rows, 0, (rows + 15) / 16, isas[isa]);
            char what[64];
            snprintf(what, sizeof what, "quant_packed_matmul format %d %s", format, isa_names[isa]);
            expect_sum_close(what, y, expected, magnitude, m * rows, 3e-5);
        }
        // One row read as one stream a thread and as several (vlm_quant_streams picks by CPU): the same floats as
        // the AVX-512 product above, in fixed point and in int8.
        if (m == 1 && vlm_quant_int8_supported()) {
            const ptrdiff_t int8_bytes = vlm_quant_int8_activation_size(columns);
            uint8_t *int8_row = malloc((size_t)int8_bytes);
            vlm_quant_int8_activation(x, columns, int8_row);
            float *int8_y = malloc((size_t)rows * sizeof(float)), *streamed = malloc((size_t)rows * sizeof(float));
            vlm_quant_int8_matmul(packed, format, rows, columns, int8_row, 1, int8_y, rows, 0, (rows + 15) / 16);
            const int counts[] = {1, VLM_QUANT_MAX_STREAMS};
            for (int c = 0; c < 2; c++) {
                memset(streamed, 0xFF, (size_t)rows * sizeof(float));
                vlm_quant_packed_matmul_streams(packed, format, rows, columns, activations, 1, streamed, rows, 0,
                                                (rows + 15) / 16, VLM_ISA_AVX512, counts[c]);
                if (memcmp(streamed, y, (size_t)rows * sizeof(float)) != 0) {
                    fprintf(stderr, "quant_packed_matmul format %d: %d streams differ\n", format, counts[c]);
                    failures++;
                }
                memset(streamed, 0xFF, (size_t)rows * sizeof(float));
                vlm_quant_int8_matmul_streams(packed, format, rows, columns, int8_row, 1, streamed, rows, 0,
                                              (rows + 15) / 16, counts[c]);
                if (memcmp(streamed, int8_y, (size_t)rows * sizeof(float)) != 0) {
                    fprintf(stderr, "quant_int8_matmul format %d: %d streams differ\n", format, counts[c]);
                    failures++;
                }
            }
            free(int8_row);
            free(int8_y);
            free(streamed);
        }
        if (vlm_quant_int8_supported()) {
            // The int8 products, against the double sum of the rows as they quantized them; each row alone (the
            // streamed decoding product, directly and through the per-thread row) the same floats as beside the others.
            const ptrdiff_t prompt_bytes = vlm_quant_int8_activation_size(columns);
            uint8_t *prompt = malloc((size_t)(m * prompt_bytes));
            double *quantized = calloc((size_t)(m * rows), sizeof(double)), *quantized_magnitude = calloc((size_t)(m * rows), sizeof(double));
            for (ptrdiff_t i = 0; i < m; i++) {
                vlm_quant_int8_activation(x + i * columns, columns, prompt + i * prompt_bytes);
                const int8_t *digits = (const int8_t *)(prompt + i * prompt_bytes);
                const float *scales = (const float *)(digits + columns);
                for (ptrdiff_t j = 0; j < rows; j++)
                    for (ptrdiff_t c = 0; c < columns; c++) {
                        const double term = (double)digits[c] * scales[c / 32] * dequantized[j * columns + c];
                        quantized[i * rows + j] += term;
                        quantized_magnitude[i * rows + j] += fabs(term);
                    }
            }
            memset(y, 0xFF, (size_t)(m * rows) * sizeof(float));
            vlm_quant_int8_matmul(packed, format, rows, columns, prompt, m, y, rows, 0, (rows + 15) / 16);
            char what[64];
            snprintf(what, sizeof what, "quant_int8_matmul format %d", format);
            expect_sum_close(what, y, quantized, quantized_magnitude, m * rows, 3e-5);
            float *alone = malloc((size_t)rows * sizeof(float));
            for (ptrdiff_t i = 0; i < m; i++) {
                for (int through_matvec = 0; through_matvec < 2; through_matvec++) {
                    memset(alone, 0xFF, (size_t)rows * sizeof(float));
                    if (through_matvec)
                        vlm_quant_int8_matvec(packed, format, rows, columns, x + i * columns, vlm_quant_call_token(), alone,
                                              0, (rows + 15) / 16);
                    else
                        vlm_quant_int8_matmul(packed, format, rows, columns, prompt + i * prompt_bytes, 1, alone, rows, 0,
                                              (rows + 15) / 16);
                    if (memcmp(alone, y + i * rows, (size_t)rows * sizeof(float)) != 0) {
                        fprintf(stderr, "%s: row %td alone%s differs\n", what, i, through_matvec ? " (matvec)" : "");
                        failures++;
                    }
                }
            }
            free(alone);
            free(prompt);
            free(quantized);
            free(quantized_magnitude);
        }
        free(packed);
        free(activations);
    }
    free(data);
    free(dequantized);
    free(other);
    free(x);
    free(y);
    free(expected);
    free(magnitude);
}

/// A random matrix of `format` packed for the decoding products, with its dequantized values for the reference.
typedef struct packed_matrix {
    void *packed;
    float *values;
    vlm_decoder_product product;
} packed_matrix;

static packed_matrix random_packed(vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns, const float *bias,
                                   ptrdiff_t offset) {
    ptrdiff_t row_bytes;
    uint8_t *data = random_blocks(format, rows, columns, &row_bytes);
    const vlm_quant_matrix matrix = {.data = data, .format = format, .rows = rows, .columns = columns, .row_bytes = row_bytes};
    packed_matrix m = {.packed = aligned_alloc(64, (size_t)((vlm_quant_packed_size(format, rows, columns) + 63) / 64 * 64)),
                       .values = malloc((size_t)(rows * columns) * sizeof(float))};
    vlm_quant_pack(&matrix, m.packed);
    vlm_quant_dequantize_rows(&matrix, 0, rows, m.values, columns, VLM_ISA_SCALAR);
    free(data);
    m.product = (vlm_decoder_product){.packed = m.packed, .format = format, .rows = rows, .columns = columns,
                                      .bias = bias, .offset = offset};
    return m;
}

/// `y[offset + j] (+)= W·x + bias` in double, for the decoder step's reference.
/// `W·x + bias` in fp64; with `int8`, of `x` as the int8 products round it (per 32 values, to 1/127 of the largest).
static void reference_product(const packed_matrix *m, const double *x, double *y, int add, int int8) {
    const vlm_decoder_product *p = &m->product;
    double *rounded = malloc((size_t)p->columns * sizeof(double));
    for (ptrdiff_t b = 0; b < p->columns; b += 32) {
        double largest = 0;
        for (int i = 0; i < 32; i++) largest = fmax(largest, fabs(x[b + i]));
        for (int i = 0; i < 32; i++)
            rounded[b + i] = int8 && largest > 0 ? nearbyint(x[b + i] * 127 / largest) * (largest / 127) : x[b + i];
    }
    for (ptrdiff_t j = 0; j < p->rows; j++) {
        double sum = p->bias ? p->bias[j] : 0;
        for (ptrdiff_t c = 0; c < p->columns; c++) sum += (double)m->values[j * p->columns + c] * rounded[c];
        y[p->offset + j] = add ? y[p->offset + j] + sum : sum;
    }
    free(rounded);
}

static void reference_norm(const double *x, const float *weight, ptrdiff_t n, float eps, double *y) {
    double squares = 0;
    for (ptrdiff_t i = 0; i < n; i++) squares += x[i] * x[i];
    const double inverse = 1 / sqrt(squares / n + eps);
    for (ptrdiff_t i = 0; i < n; i++) y[i] = weight[i] * x[i] * inverse;
}

static void reference_rotate(double *x, const float *cos, const float *sin, ptrdiff_t head_dim) {
    const ptrdiff_t half = head_dim / 2;
    for (ptrdiff_t i = 0; i < half; i++) {
        const double first = x[i], second = x[i + half];
        x[i] = first * cos[i] - second * sin[i];
        x[i + half] = second * cos[i] + first * sin[i];
    }
}

/// A whole decoding step of a two-layer grouped-query decoder (separate q/k/v and gate/up products in four formats
/// in one layer, stacked ones in the other; q/k/v biases; the first layer's queries and keys unrotated, as in
/// SmolLM3's NoPE layers, the second layer Gemma 3's: heads normalized, its own rotary table, the attention's and
/// the MLP's outputs normed before they are added, GELU gating, a sliding window of WINDOW positions split into two
/// ranges) at cache position `position`, split into `parts` key ranges, with and without its head, against the same network in double precision: the logits (or the final
/// norm's output) and the key and value it stores. Only with an OpenMP runtime in the process.
/// With `int8`, the step's products take int8 activations, and so does the reference.
/// `x` as a half cache holds it.
static double rounded_to_half(double x) {
    float value = (float)x;
    uint16_t half;
    vlm_floats_to_halves(&value, 1, &half, VLM_ISA_SCALAR);
    vlm_halves_to_floats(&half, 1, &value, VLM_ISA_SCALAR);
    return value;
}

static void check_decoder_step(ptrdiff_t position, ptrdiff_t parts, vlm_kernel_isa isa, int int8) {
    enum { H = 64, HEADS = 4, KEY_HEADS = 2, HD = 16, I = 96, L = 2, CAPACITY = 160, VOCAB = 40, WINDOW = 24 };
    const ptrdiff_t group = HEADS / KEY_HEADS, width = HEADS * HD, key_width = KEY_HEADS * HD;
    const float eps = 1e-5f, scale = 0.25f;
    float *norms = random_floats(2 * L * H + H), *bias = random_floats(width + 2 * key_width);
    float *head_norms = random_floats(2 * HD), *output_norms = random_floats(2 * H);
    // The first layer's MLP leaves the hidden state at about 3·10⁴; outputs normed to about 1 would vanish in it
    // (a wrong attention window in the second layer went unseen), so its norms scale them to that size.
    for (int i = 0; i < 2 * H; i++) output_norms[i] *= 3e4f;
    packed_matrix matrices[L][7], head = random_packed(VLM_QUANT_Q8_0, VOCAB, H, NULL, 0);
    vlm_decoder_layer layers[L];
    memset(layers, 0, sizeof layers);
    const vlm_quant_format separate[] = {VLM_QUANT_Q8_0, VLM_QUANT_Q4_1, VLM_QUANT_Q5_0};
    for (int l = 0; l < L; l++) {
        vlm_decoder_layer *d = &layers[l];
        d->input_norm = norms + 2 * l * H;
        d->post_attention_norm = norms + (2 * l + 1) * H;
        if (l == 0) {
            d->unrotated = 1;
            const ptrdiff_t rows[] = {width, key_width, key_width}, offsets[] = {0, width, width + key_width};
            for (int i = 0; i < 3; i++) {
                matrices[l][i] = random_packed(separate[i], rows[i], H, bias + offsets[i], offsets[i]);
                d->attention[i] = matrices[l][i].product;
            }
            d->attention_products = 3;
            matrices[l][3] = random_packed(VLM_QUANT_Q8_0, I, H, NULL, 0);
            matrices[l][4] = random_packed(VLM_QUANT_Q4_0, I, H, NULL, I);
            d->gate_up[0] = matrices[l][3].product;
            d->gate_up[1] = matrices[l][4].product;
            d->gate_up_products = 2;
        } else {
            d->query_norm = head_norms;
            d->key_norm = head_norms + HD;
            d->local_rotary = 1;
            d->attention_output_norm = output_norms;
            d->mlp_output_norm = output_norms + H;
            d->gelu_gate = 1;
            d->windowed = 1;
            matrices[l][0] = random_packed(VLM_QUANT_Q8_0, width + 2 * key_width, H, bias, 0);
            d->attention[0] = matrices[l][0].product;
            d->attention_products = 1;
            matrices[l][3] = random_packed(VLM_QUANT_Q8_0, 2 * I, H, NULL, 0);
            d->gate_up[0] = matrices[l][3].product;
            d->gate_up_products = 1;
        }
        matrices[l][5] = random_packed(VLM_QUANT_Q5_1, H, width, NULL, 0);
        matrices[l][6] = random_packed(VLM_QUANT_Q8_0, H, I, NULL, 0);
        d->output = matrices[l][5].product;
        d->down = matrices[l][6].product;
    }
    float *cos = malloc(HD / 2 * sizeof(float)), *sin = malloc(HD / 2 * sizeof(float));
    float *local_cos = malloc(HD / 2 * sizeof(float)), *local_sin = malloc(HD / 2 * sizeof(float));
    for (int i = 0; i < HD / 2; i++) {
        cos[i] = cosf(0.37f * (float)(i + 1));
        sin[i] = sinf(0.37f * (float)(i + 1));
        local_cos[i] = cosf(0.21f * (float)(i + 1));
        local_sin[i] = sinf(0.21f * (float)(i + 1));
    }
    float *embedding = random_floats(H);
    float *keys[L], *values[L];
    // The references' caches, [0] as given and [1] rounded to halves, as a half cache holds them.
    double *reference_keys_of[2][L], *reference_values_of[2][L];
    for (int l = 0; l < L; l++) {
        keys[l] = random_floats(KEY_HEADS * CAPACITY * HD);
        values[l] = random_floats(KEY_HEADS * CAPACITY * HD);
        for (int r = 0; r < 2; r++) {
            reference_keys_of[r][l] = malloc(KEY_HEADS * CAPACITY * HD * sizeof(double));
            reference_values_of[r][l] = malloc(KEY_HEADS * CAPACITY * HD * sizeof(double));
            for (ptrdiff_t i = 0; i < KEY_HEADS * CAPACITY * HD; i++) {
                reference_keys_of[r][l][i] = r ? rounded_to_half(keys[l][i]) : keys[l][i];
                reference_values_of[r][l][i] = r ? rounded_to_half(values[l][i]) : values[l][i];
            }
        }
    }
    // The references: with the cache as given, and with a half cache.
    double logits_of[2][VOCAB], final_of[2][H];
    for (int r = 0; r < 2; r++) {
        double hidden[H], normed[H], qkv[HEADS * HD + 2 * KEY_HEADS * HD], attended[HEADS * HD], gate_up[2 * I], gated[I];
        double *logits = logits_of[r], *final = final_of[r];
        double **reference_keys = reference_keys_of[r], **reference_values = reference_values_of[r];
        for (int i = 0; i < H; i++) hidden[i] = embedding[i];
        for (int l = 0; l < L; l++) {
            const float *layer_cos = layers[l].local_rotary ? local_cos : cos, *layer_sin = layers[l].local_rotary ? local_sin : sin;
            reference_norm(hidden, layers[l].input_norm, H, eps, normed);
            for (int i = 0; i < (l == 0 ? 3 : 1); i++) reference_product(&matrices[l][i], normed, qkv, 0, int8);
            for (int h = 0; h < KEY_HEADS; h++) {
                if (layers[l].key_norm) reference_norm(qkv + width + h * HD, layers[l].key_norm, HD, eps, qkv + width + h * HD);
                if (!layers[l].unrotated) reference_rotate(qkv + width + h * HD, layer_cos, layer_sin, HD);
                for (int f = 0; f < HD; f++) {
                    const double key = qkv[width + h * HD + f], value = qkv[width + key_width + h * HD + f];
                    reference_keys[l][(h * CAPACITY + position) * HD + f] = r ? rounded_to_half(key) : key;
                    reference_values[l][(h * CAPACITY + position) * HD + f] = r ? rounded_to_half(value) : value;
                }
            }
            for (int q = 0; q < HEADS; q++) {
                double *query = qkv + q * HD, *out = attended + q * HD;
                const double *k = reference_keys[l] + (q / group) * CAPACITY * HD, *v = reference_values[l] + (q / group) * CAPACITY * HD;
                if (layers[l].query_norm) reference_norm(query, layers[l].query_norm, HD, eps, query);
                if (!layers[l].unrotated) reference_rotate(query, layer_cos, layer_sin, HD);
                const ptrdiff_t first = layers[l].windowed && position >= WINDOW ? position - WINDOW + 1 : 0;
                double largest = -INFINITY, total = 0, *scores = malloc((size_t)(position + 1) * sizeof(double));
                for (ptrdiff_t p = first; p <= position; p++) {
                    scores[p] = 0;
                    for (int f = 0; f < HD; f++) scores[p] += query[f] * k[p * HD + f];
                    scores[p] *= scale;
                    largest = fmax(largest, scores[p]);
                }
                for (int f = 0; f < HD; f++) out[f] = 0;
                for (ptrdiff_t p = first; p <= position; p++) {
                    const double weight = exp(scores[p] - largest);
                    total += weight;
                    for (int f = 0; f < HD; f++) out[f] += weight * v[p * HD + f];
                }
                for (int f = 0; f < HD; f++) out[f] /= total;
                free(scores);
            }
            double output[H];
            reference_product(&matrices[l][5], attended, output, 0, int8);
            if (layers[l].attention_output_norm) reference_norm(output, layers[l].attention_output_norm, H, eps, output);
            for (int i = 0; i < H; i++) hidden[i] += output[i];
            reference_norm(hidden, layers[l].post_attention_norm, H, eps, normed);
            for (int i = 3; i < (l == 0 ? 5 : 4); i++) reference_product(&matrices[l][i], normed, gate_up, 0, int8);
            for (int i = 0; i < I; i++) {
                const double x = gate_up[i];
                const double activated = layers[l].gelu_gate ? 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
                                                             : x / (1 + exp(-x));
                gated[i] = activated * gate_up[I + i];
            }
            reference_product(&matrices[l][6], gated, output, 0, int8);
            if (layers[l].mlp_output_norm) reference_norm(output, layers[l].mlp_output_norm, H, eps, output);
            for (int i = 0; i < H; i++) hidden[i] += output[i];
        }
        reference_norm(hidden, norms + 2 * L * H, H, eps, final);
        reference_product(&head, final, logits, 0, int8);
    }

    // With and without the head; then the same reading each product as the streams this CPU does not choose; then
    // with the cache in halves.
    for (int run = 0; run < 5; run++) {
        const int half = run == 4, with_head = run % 2 || half;
        const int streams = run == 2 || run == 3 ? (vlm_quant_streams() == 1 ? VLM_QUANT_MAX_STREAMS : 1) : 0;
        float *cache_keys[L], *cache_values[L];
        uint16_t *half_keys[L], *half_values[L];
        for (int l = 0; l < L; l++) {
            cache_keys[l] = malloc(KEY_HEADS * CAPACITY * HD * sizeof(float));
            cache_values[l] = malloc(KEY_HEADS * CAPACITY * HD * sizeof(float));
            memcpy(cache_keys[l], keys[l], KEY_HEADS * CAPACITY * HD * sizeof(float));
            memcpy(cache_values[l], values[l], KEY_HEADS * CAPACITY * HD * sizeof(float));
            half_keys[l] = malloc(KEY_HEADS * CAPACITY * HD * sizeof(uint16_t));
            half_values[l] = malloc(KEY_HEADS * CAPACITY * HD * sizeof(uint16_t));
            vlm_floats_to_halves(keys[l], KEY_HEADS * CAPACITY * HD, half_keys[l], isa);
            vlm_floats_to_halves(values[l], KEY_HEADS * CAPACITY * HD, half_values[l], isa);
        }
        float *step_hidden = malloc(H * sizeof(float)), *step_logits = malloc(VOCAB * sizeof(float));
        memcpy(step_hidden, embedding, H * sizeof(float));
        vlm_decoder_step step = {
            .layers = layers, .layer_count = L, .hidden_size = H, .heads = HEADS, .key_heads = KEY_HEADS, .head_dim = HD,
            .intermediate_size = I, .eps = eps, .scale = scale, .final_norm = norms + 2 * L * H,
            .head = with_head ? head.product : (vlm_decoder_product){0}, .keys = cache_keys, .values = cache_values,
            .capacity = CAPACITY, .position = position, .parts = parts, .window = WINDOW, .window_parts = 2, .int8 = int8,
            .cos = cos, .sin = sin, .local_cos = local_cos,
            .local_sin = local_sin, .hidden = step_hidden,
            .logits = with_head ? step_logits : NULL, .streams = streams,
            .half_keys = half ? half_keys : NULL, .half_values = half ? half_values : NULL};
        float *scratch = malloc((size_t)vlm_decoder_step_scratch_floats(&step) * sizeof(float));
        step.scratch = scratch;
        char what[96];
        snprintf(what, sizeof what, "decoder_step position %td parts %td %s%s%s%s streams %d", position, parts,
                 isa_name(isa), int8 ? " int8" : "", with_head ? " head" : "", half ? " f16 cache" : "", streams);
        if (vlm_decoder_step_run(&step, isa) != 0) {
            fprintf(stderr, "%s: refused\n", what);
            failures++;
        } else if (with_head) {
            expect_close(what, step_logits, logits_of[half], VOCAB, 1e-3);
        } else {
            expect_close(what, step_hidden, final_of[half], H, 1e-3);
        }
        for (int l = 0; l < L; l++) {
            if (half) {
                vlm_halves_to_floats(half_keys[l], KEY_HEADS * CAPACITY * HD, cache_keys[l], isa);
                vlm_halves_to_floats(half_values[l], KEY_HEADS * CAPACITY * HD, cache_values[l], isa);
            }
            expect_close(what, cache_keys[l], reference_keys_of[half][l], KEY_HEADS * CAPACITY * HD, 1e-3);
            expect_close(what, cache_values[l], reference_values_of[half][l], KEY_HEADS * CAPACITY * HD, 1e-3);
            free(cache_keys[l]);
            free(cache_values[l]);
            free(half_keys[l]);
            free(half_values[l]);
        }
        free(step_hidden);
        free(step_logits);
        free(scratch);
    }
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < 7; i++) {
            if ((l == 1 && (i == 1 || i == 2 || i == 4))) continue;
            free(matrices[l][i].packed);
            free(matrices[l][i].values);
        }
        free(keys[l]);
        free(values[l]);
        for (int r = 0; r < 2; r++) {
            free(reference_keys_of[r][l]);
            free(reference_values_of[r][l]);
        }
    }
    free(head.packed);
    free(head.values);
    free(norms);
    free(head_norms);
    free(output_norms);
    free(local_cos);
    free(local_sin);
    free(bias);
    free(cos);
    free(sin);
    free(embedding);
}

/// Every ISA's half conversions give the portable ones' bits: all 65,536 halves widened (NaNs to NaNs), and floats
/// of every kind (random bit patterns, halfway cases, subnormal and overflowing ones) rounded, at lengths that leave
/// tails.
static void check_half_conversion(void) {
    enum { HALVES = 1 << 16, FLOATS = 1 << 18 };
    uint16_t *halves = malloc(HALVES * sizeof(uint16_t)), *rounded[2];
    float *widened[2], *floats = malloc(FLOATS * sizeof(float));
    for (int i = 0; i < HALVES; i++) halves[i] = (uint16_t)i;
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < FLOATS; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t bits = (uint32_t)(state >> 32);
        // Every fourth a float near a half's rounding boundary: a half's bits widened, plus or minus a few units.
        if (i % 4 == 1) bits = ((uint32_t)(bits & 0x8000) << 16 | (uint32_t)((bits >> 16) & 0x7FFF) << 13) + 0x38000000u
                               + (bits & 0x1FFF) - 0x1000;
        memcpy(floats + i, &bits, sizeof bits);
    }
    for (int r = 0; r < 2; r++) {
        widened[r] = malloc(HALVES * sizeof(float));
        rounded[r] = malloc(FLOATS * sizeof(uint16_t));
    }
    vlm_halves_to_floats(halves, HALVES, widened[0], VLM_ISA_SCALAR);
    vlm_floats_to_halves(floats, FLOATS, rounded[0], VLM_ISA_SCALAR);
    for (int isa = 1; isa < 3; isa++) {
        for (ptrdiff_t length = HALVES - 3; length <= HALVES; length += 3) {
            memset(widened[1], 0xFF, HALVES * sizeof(float));
            vlm_halves_to_floats(halves, length, widened[1], isas[isa]);
            // NaNs as NaNs: F16C quiets a signalling NaN, the portable widening keeps its payload as it is.
            for (ptrdiff_t i = 0; i < length; i++) {
                if (isnan(widened[0][i]) ? !isnan(widened[1][i]) : memcmp(widened[0] + i, widened[1] + i, sizeof(float)) != 0) {
                    fprintf(stderr, "halves_to_floats %s: %04x widens to %.9g, the portable widening %.9g\n", isa_names[isa],
                            (unsigned)i, widened[1][i], widened[0][i]);
                    failures++;
                    break;
                }
            }
        }
        for (ptrdiff_t length = FLOATS - 5; length <= FLOATS; length += 5) {
            vlm_floats_to_halves(floats, length, rounded[1], isas[isa]);
            if (memcmp(rounded[0], rounded[1], (size_t)length * sizeof(uint16_t)) != 0) {
                fprintf(stderr, "floats_to_halves %s: differs from the portable rounding\n", isa_names[isa]);
                failures++;
            }
        }
    }
    for (int r = 0; r < 2; r++) {
        free(widened[r]);
        free(rounded[r]);
    }
    free(halves);
    free(floats);
}

static void count_index(void *context, ptrdiff_t index) { ((int *)context)[index] += 1; }

/// Per-row int8 quantization against the formula in float arithmetic, exactly: every ISA multiplies by the same
/// float reciprocal and rounds to nearest even. The last row is zeros (scale 1); with three rows or more, the second
/// holds a NaN.
static void check_row_quantization(ptrdiff_t rows, ptrdiff_t features) {
    float *x = random_floats(rows * features);
    for (ptrdiff_t c = 0; c < features; c++) x[(rows - 1) * features + c] = 0;
    if (rows > 2) x[features] = NAN;  // row 1: zeros and a NaN scale
    signed char *q = malloc((size_t)(rows * features));
    float *scales = malloc((size_t)rows * sizeof(float));
    for (int isa = 0; isa < 3; isa++) {
        vlm_quantize_rows_int8(x, rows, features, q, scales, isas[isa]);
        for (ptrdiff_t r = 0; r < rows; r++) {
            float largest = 0;
            int finite = 1;
            for (ptrdiff_t c = 0; c < features; c++) {
                largest = fmaxf(largest, fabsf(x[r * features + c]));
                finite &= isfinite(x[r * features + c]) != 0;
            }
            const float inverse = largest > 0 ? 127.0f / largest : 1.0f;
            int wrong = finite ? scales[r] != (largest > 0 ? largest / 127.0f : 1.0f) : !isnan(scales[r]);
            for (ptrdiff_t c = 0; c < features; c++)
                wrong |= q[r * features + c] != (finite ? (signed char)nearbyintf(x[r * features + c] * inverse) : 0);
            if (wrong) {
                printf("FAIL quantize_rows_int8 %s %tdx%td row %td\n", isa_names[isa], rows, features, r);
                failures++;
            }
        }
    }
    free(x);
    free(q);
    free(scales);
}

int main(void) {
    const ptrdiff_t shapes[][4] = {{1, 1, 8, 1}, {3, 7, 16, 2}, {5, 5, 64, 3}, {1, 33, 32, 4}, {17, 40, 80, 2}, {2, 300, 64, 2},
                                   {9, 130, 72, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int causal = 0; causal < 2; causal++)
            for (int masked = 0; masked < 2; masked++)
                check_attention(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], causal, masked);
    check_half_conversion();
    check_elementwise(1, 1);
    check_elementwise(3, 17);
    check_elementwise(2, 64);
    check_elementwise(4, 100);
    for (ptrdiff_t count = 1; count <= 70; count++) check_argmax(count);
    check_argmax(49152 + 3);
    for (ptrdiff_t features = 1; features <= 70; features++) check_rms_norm(3, features);
    check_rms_norm(5, 576);
    check_row_quantization(1, 1);
    check_row_quantization(3, 17);
    check_row_quantization(2, 64);
    check_row_quantization(4, 100);
    check_gemm(1, 1, 1, 0);
    check_gemm(7, 13, 29, 0);
    check_gemm(33, 17, 70, 1);
    check_panel_matvec(1, 1);
    check_panel_matvec(70, 200);
    check_panel_matvec(64, 384);
    check_panel_matvec_bf16(1, 1);
    check_panel_matvec_bf16(71, 200);
    check_panel_matvec_bf16(64, 384);
    check_int8_matvec(1, 1);
    check_int8_matvec(70, 200);
    check_int8_matvec(64, 384);
    check_int8_matvec(1027, 520);
    check_int8_matvec(37, 9021);  // halves of 71 and 70 panels: bands of 64 and the rest
    const vlm_quant_format formats[] = {VLM_QUANT_F16, VLM_QUANT_BF16, VLM_QUANT_Q4_0, VLM_QUANT_Q4_1, VLM_QUANT_Q5_0,
                                        VLM_QUANT_Q5_1, VLM_QUANT_Q8_0, VLM_QUANT_Q4_K, VLM_QUANT_Q5_K, VLM_QUANT_Q6_K};
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        const int k = formats[f] == VLM_QUANT_Q4_K || formats[f] == VLM_QUANT_Q5_K || formats[f] == VLM_QUANT_Q6_K;
        check_quantized(formats[f], 19, k ? 512 : 96, 1);
        check_quantized(formats[f], 33, k ? 256 : 64, 5);
        check_quantized(formats[f], 16, k ? 256 : 32, 8);
        check_quantized(formats[f], 70, k ? 256 : 64, 2);
        check_quantized(formats[f], 150, k ? 256 : 64, 1);  // 10 groups: 4 streams of 2, 2 alone
    }
    // Without an OpenMP runtime in the process the parallel loops refuse; with one they cover every index once.
    int counts[37] = {0};
    if (vlm_parallel_for(37, count_index, counts) == 0)
        for (int i = 0; i < 37; i++)
            if (counts[i] != 1) failures++;
    if (vlm_parallel_team_available() && vlm_quant_packed_supported()) {
        const ptrdiff_t steps[][2] = {{0, 1}, {5, 1}, {130, 2}, {159, 3}};
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
            for (int isa = 1; isa < 3; isa++) check_decoder_step(steps[i][0], steps[i][1], isas[isa], 0);
            if (vlm_quant_int8_supported()) check_decoder_step(steps[i][0], steps[i][1], VLM_ISA_AVX512, 1);
        }
    }
    printf("kernels: %s (best ISA here: %s, packed products %s)\n", failures ? "FAILED" : "all checks passed",
           isa_name(vlm_best_isa()), vlm_quant_packed_supported() ? "on" : "off");
    return failures ? 1 : 0;
}
