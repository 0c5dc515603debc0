#include <math.h>
#include <stdlib.h>

#include "kernels_internal.h"

// Softmax of scores[0 ..< visible] in place, with the mask already applied (-inf for masked keys). A row with no
// visible key becomes uniform over all key_length keys. Returns how many leading probabilities are meaningful.
static ptrdiff_t softmax_row(float *scores, ptrdiff_t visible, ptrdiff_t key_length) {
    float max = -INFINITY;
    for (ptrdiff_t j = 0; j < visible; j++) max = scores[j] > max ? scores[j] : max;
    if (max == -INFINITY) {
        for (ptrdiff_t j = 0; j < key_length; j++) scores[j] = 1.0f / (float)key_length;
        return key_length;
    }
    double sum = 0;
    for (ptrdiff_t j = 0; j < visible; j++) {
        scores[j] = scores[j] == -INFINITY ? 0.0f : expf(scores[j] - max);
        sum += scores[j];
    }
    float inverse = 1.0f / (float)sum;
    for (ptrdiff_t j = 0; j < visible; j++) scores[j] *= inverse;
    return visible;
}

int vlm_attention_scalar(const vlm_attention_problem *p) {
    const ptrdiff_t d = p->head_dim;
    float *scores = malloc((size_t)(p->key_length > 0 ? p->key_length : 1) * sizeof(float));
    float *sums = malloc((size_t)d * sizeof(float));
    if (!scores || !sums) {
        free(scores);
        free(sums);
        return -1;
    }
    for (ptrdiff_t h = 0; h < p->head_count; h++) {
        for (ptrdiff_t i = 0; i < p->query_length; i++) {
            const float *q = p->query + i * p->query_stride + h * d;
            ptrdiff_t visible = vlm_visible_keys(p, i);
            for (ptrdiff_t j = 0; j < visible; j++) {
                if (p->key_mask && p->key_mask[j] == 0) {
                    scores[j] = -INFINITY;
                    continue;
                }
                const float *k = p->key + j * p->key_stride + h * d;
                // Fused multiply-adds in order, as the GEMM kernels behind PyTorch accumulate each output element.
                float dot = 0;
                for (ptrdiff_t c = 0; c < d; c++) dot = fmaf(q[c], k[c], dot);
                scores[j] = dot * p->scale;
            }
            ptrdiff_t used = softmax_row(scores, visible, p->key_length);
            for (ptrdiff_t c = 0; c < d; c++) sums[c] = 0;
            for (ptrdiff_t j = 0; j < used; j++) {
                const float *v = p->value + j * p->value_stride + h * d;
                for (ptrdiff_t c = 0; c < d; c++) sums[c] = fmaf(scores[j], v[c], sums[c]);
            }
            float *o = p->output + i * p->output_stride + h * d;
            for (ptrdiff_t c = 0; c < d; c++) o[c] = sums[c];
        }
    }
    free(scores);
    free(sums);
    return 0;
}

void vlm_layer_norm_scalar(const float *x, float *y, ptrdiff_t rows, ptrdiff_t features, const float *weight,
                           const float *bias, float eps) {
    for (ptrdiff_t row = 0; row < rows; row++) {
        const float *in = x + row * features;
        float *out = y + row * features;
        // Double sums make mean and variance correctly rounded; PyTorch's float reductions come within an ulp.
        double sum = 0;
        for (ptrdiff_t c = 0; c < features; c++) sum += in[c];
        double mean = sum / (double)features;
        double squares = 0;
        for (ptrdiff_t c = 0; c < features; c++) squares += (in[c] - mean) * (in[c] - mean);
        // The same float steps as PyTorch's kernel: rstd from the float variance, then (x·rstd - mean·rstd)·w + b.
        float rstd = 1.0f / sqrtf((float)(squares / (double)features) + eps);
        float shift = -rstd * (float)mean;
        for (ptrdiff_t c = 0; c < features; c++) out[c] = (in[c] * rstd + shift) * weight[c] + bias[c];
    }
}
