#include <stdint.h>
#include <string.h>

#include "quant_internal.h"

// ggml's quantized block formats (ggml-common.h): the portable dequantizers, the portable matrix product, and the
// entry points that pick an implementation. Dequantization must agree bit for bit with gguf-py, whose numpy code
// rounds after every multiply and add, so nothing here may be contracted into a fused multiply-add.
#pragma clang fp contract(off)

int vlm_quant_block_layout(int format, ptrdiff_t *block_elements, ptrdiff_t *block_bytes) {
    ptrdiff_t elements, bytes;
    switch (format) {
    case VLM_QUANT_F16:
    case VLM_QUANT_BF16: elements = 32, bytes = 64; break;
    case VLM_QUANT_Q4_0: elements = 32, bytes = 18; break;
    case VLM_QUANT_Q4_1: elements = 32, bytes = 20; break;
    case VLM_QUANT_Q5_0: elements = 32, bytes = 22; break;
    case VLM_QUANT_Q5_1: elements = 32, bytes = 24; break;
    case VLM_QUANT_Q8_0: elements = 32, bytes = 34; break;
    case VLM_QUANT_Q4_K: elements = 256, bytes = 144; break;
    case VLM_QUANT_Q5_K: elements = 256, bytes = 176; break;
    case VLM_QUANT_Q6_K: elements = 256, bytes = 210; break;
    default: return -1;
    }
    *block_elements = elements;
    *block_bytes = bytes;
    return 0;
}

float vlm_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exponent = (h >> 10) & 0x1F;
    uint32_t mantissa = h & 0x3FF;
    uint32_t bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {
        // Subnormal half: normalize the mantissa into a float's implicit bit.
        exponent = 113;
        while (!(mantissa & 0x400)) {
            mantissa <<= 1;
            exponent--;
        }
        bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static inline float half_at(const uint8_t *p) { return vlm_half_to_float((uint16_t)(p[0] | p[1] << 8)); }

void vlm_k_scale_min(const uint8_t *scales, int index, uint8_t *scale, uint8_t *minimum) {
    if (index < 4) {
        *scale = scales[index] & 63;
        *minimum = scales[index + 4] & 63;
    } else {
        *scale = (scales[index + 4] & 0xF) | ((scales[index - 4] >> 6) << 4);
        *minimum = (scales[index + 4] >> 4) | ((scales[index] >> 6) << 4);
    }
}

// Each dequantizer turns `count` consecutive blocks into `count · block elements` floats.

static void f16_scalar(const uint8_t *block, ptrdiff_t count, float *out) {
    for (ptrdiff_t i = 0; i < 32 * count; i++) out[i] = half_at(block + 2 * i);
}

/// bfloat16 is the top half of a float.
static void bf16_scalar(const uint8_t *block, ptrdiff_t count, float *out) {
    for (ptrdiff_t i = 0; i < 32 * count; i++) {
        const uint32_t bits = (uint32_t)(block[2 * i] | block[2 * i + 1] << 8) << 16;
        memcpy(out + i, &bits, 4);
    }
}

static void q4_0_scalar(const uint8_t *block, ptrdiff_t count, float *out) {
    for (ptrdiff_t b = 0; b < count; b++, block += 18, out += 32) {
        float d = half_at(block);
        for (int i = 0; i < 16; i++) {
            out[i] = d * (float)((block[2 + i] & 0xF) - 8);
            out[i + 16] = d * (float)((block[2 + i] >> 4) - 8);
        }
    }
}

static void q4_1_scalar(const uint8_t *block, ptrdiff_t count, float *out) {
    for (ptrdiff_t b = 0; b < count; b++, block += 20, out += 32) {
        float d = half_at(block), m = half_at(block + 2);
        for (int i = 0; i < 16; i++) {
            out[i] = d * (float)(block[4 + i] & 0xF) + m;
            out[i + 16] = d * (float)(block[4 + i] >> 4) + m;
        }
    }
}

static void q5_scalar(const uint8_t *block, ptrdiff_t count, float *out, int has_minimum) {
    const ptrdiff_t size = has_minimum ? 24 : 22, high_offset = has_minimum ? 4 : 2;
    for (ptrdiff_t b = 0; b < count; b++, block += size, out += 32) {
        float d = half_at(block), m = has_minimum ? half_at(block + 2) : 0;
        uint32_t high;
        memcpy(&high, block + high_offset, 4);
        const uint8_t *q = block + high_offset + 4;
        for (int i = 0; i < 16; i++) {
            int low = vlm_q5_value(q, high, i), upper = vlm_q5_value(q, high, i + 16);
            if (has_minimum) {
                out[i] = d * (float)low + m;
                out[i + 16] = d * (float)upper + m;
            } else {
                out[i] = d * (float)(low - 16);
                out[i + 16] = d * (float)(upper - 16);
            }
        }
    }
}

static void q5_0_scalar(const uint8_t *block, ptrdiff_t count, float *out) { q5_scalar(block, count, out, 0); }
static void q5_1_scalar(const uint8_t *block, ptrdiff_t count, float *out) { q5_scalar(block, count, out, 1); }

static void q8_0_scalar(const uint8_t *block, ptrdiff_t count, float *out) {
    for (ptrdiff_t b = 0; b < count; b++, block += 34, out += 32) {
        float d = half_at(block);
        for (int i = 0; i < 32; i++) out[i] = d * (float)(int8_t)block[2 + i];
    }
}

/// Q4_K and Q5_K: `d`, `dmin`, 12 bytes of 6-bit scales and minimums for 8 sub-blocks of 32, (Q5_K: 32 bytes of
/// fifth bits,) 128 bytes of nibbles; x = (d·scale)·q − (dmin·min).
static void qk_scalar(const uint8_t *block, ptrdiff_t count, float *out, int five_bits) {
    const ptrdiff_t size = five_bits ? 176 : 144;
    for (ptrdiff_t b = 0; b < count; b++, block += size, out += 256) {
        float d = half_at(block), dmin = half_at(block + 2);
        const uint8_t *scales = block + 4, *high = block + 16, *q = block + (five_bits ? 48 : 16);
        for (int sub = 0; sub < 8; sub++) {
            uint8_t scale, minimum;
            vlm_k_scale_min(scales, sub, &scale, &minimum);
            float factor = d * (float)scale, offset = dmin * (float)minimum;
            for (int l = 0; l < 32; l++)
                out[32 * sub + l] = factor * (float)vlm_qk_value(q, five_bits ? high : NULL, sub, l) - offset;
        }
    }
}

static void q4_k_scalar(const uint8_t *block, ptrdiff_t count, float *out) { qk_scalar(block, count, out, 0); }
static void q5_k_scalar(const uint8_t *block, ptrdiff_t count, float *out) { qk_scalar(block, count, out, 1); }

/// Q6_K: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 signed 8-bit scales, `d`; x = (d·scale)·(q − 32)
/// with one scale per 16 elements.
static void q6_k_scalar(const uint8_t *block, ptrdiff_t count, float *out) {
    for (ptrdiff_t b = 0; b < count; b++, block += 210, out += 256) {
        const int8_t *scales = (const int8_t *)(block + 192);
        float d = half_at(block + 208);
        for (int e = 0; e < 256; e++) out[e] = (d * (float)scales[e / 16]) * (float)(vlm_q6_k_value(block, e) - 32);
    }
}

vlm_dequantize_blocks vlm_quant_dequantizer_scalar(vlm_quant_format format) {
    switch (format) {
    case VLM_QUANT_F16: return f16_scalar;
    case VLM_QUANT_BF16: return bf16_scalar;
    case VLM_QUANT_Q4_0: return q4_0_scalar;
    case VLM_QUANT_Q4_1: return q4_1_scalar;
    case VLM_QUANT_Q5_0: return q5_0_scalar;
    case VLM_QUANT_Q5_1: return q5_1_scalar;
    case VLM_QUANT_Q8_0: return q8_0_scalar;
    case VLM_QUANT_Q4_K: return q4_k_scalar;
    case VLM_QUANT_Q5_K: return q5_k_scalar;
    case VLM_QUANT_Q6_K: return q6_k_scalar;
    }
    return NULL;
}

static void dequantize_rows(vlm_dequantize_blocks dequantize, const vlm_quant_matrix *matrix, ptrdiff_t first,
                            ptrdiff_t count, float *output, ptrdiff_t output_stride) {
    ptrdiff_t elements = 0, bytes = 0;
    vlm_quant_block_layout(matrix->format, &elements, &bytes);
    const uint8_t *data = matrix->data;
    for (ptrdiff_t r = 0; r < count; r++) {
        dequantize(data + (first + r) * matrix->row_bytes, matrix->columns / elements, output + r * output_stride);
    }
}

void vlm_quant_dequantize_rows(const vlm_quant_matrix *matrix, ptrdiff_t first, ptrdiff_t count, float *output,
                               ptrdiff_t output_stride, vlm_kernel_isa isa) {
    vlm_dequantize_blocks dequantize = vlm_quant_dequantizer_scalar(matrix->format);
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) dequantize = vlm_quant_dequantizer_avx512(matrix->format);
#endif
    (void)isa;
    if (dequantize && count > 0) dequantize_rows(dequantize, matrix, first, count, output, output_stride);
}

/// The portable product: weight rows are dequantized a chunk at a time into `w`, then dotted with every row of x.
PORTABLE_CLONES
static void matmul_rows_scalar(const vlm_quant_matrix *matrix, const float *x, ptrdiff_t m, ptrdiff_t x_stride,
                               float *y, ptrdiff_t y_stride, ptrdiff_t first, ptrdiff_t count) {
    ptrdiff_t elements = 0, bytes = 0;
    vlm_quant_block_layout(matrix->format, &elements, &bytes);
    vlm_dequantize_blocks dequantize = vlm_quant_dequantizer_scalar(matrix->format);
    const uint8_t *data = matrix->data;
    float w[VLM_QUANT_CHUNK];
    for (ptrdiff_t j = first; j < first + count; j++) {
        float sums[VLM_QUANT_MAX_ROWS] = {0};
        for (ptrdiff_t c = 0; c < matrix->columns; c += VLM_QUANT_CHUNK) {
            ptrdiff_t length = matrix->columns - c < VLM_QUANT_CHUNK ? matrix->columns - c : VLM_QUANT_CHUNK;
            dequantize(data + j * matrix->row_bytes + c / elements * bytes, length / elements, w);
            for (ptrdiff_t i = 0; i < m; i++) {
                const float *row = x + i * x_stride + c;
                float sum = 0;
                for (ptrdiff_t k = 0; k < length; k++) sum += w[k] * row[k];
                sums[i] += sum;
            }
        }
        for (ptrdiff_t i = 0; i < m; i++) y[i * y_stride + j] = sums[i];
    }
}

void vlm_quant_matmul_rows(const vlm_quant_matrix *matrix, const float *x, ptrdiff_t m, ptrdiff_t x_stride, float *y,
                           ptrdiff_t y_stride, ptrdiff_t first, ptrdiff_t count, vlm_kernel_isa isa) {
    ptrdiff_t elements, bytes;
    if (m <= 0 || m > VLM_QUANT_MAX_ROWS || count <= 0 || vlm_quant_block_layout(matrix->format, &elements, &bytes) != 0)
        return;
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) {
        vlm_quant_matmul_rows_avx512(matrix, x, m, x_stride, y, y_stride, first, count);
        return;
    }
#endif
    (void)isa;
    matmul_rows_scalar(matrix, x, m, x_stride, y, y_stride, first, count);
}
