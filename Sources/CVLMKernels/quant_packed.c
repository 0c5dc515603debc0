#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant_packed.h"

// Rounding by adding and subtracting a constant must not be contracted or reassociated.
#pragma clang fp contract(off)

// The packed layout and the fixed-point activations (see vlm_kernels.h); the products are in quant_packed_avx512.c.

int vlm_quant_packed_layout(vlm_quant_format format, ptrdiff_t columns, vlm_quant_packed_layout_t *layout) {
    vlm_quant_packed_layout_t l = {0};
    switch (format) {
    case VLM_QUANT_Q4_0: l.nibbles = 1, l.offset = 8; break;
    case VLM_QUANT_Q4_1: l.nibbles = 1, l.has_minimum = 1; break;
    case VLM_QUANT_Q5_0: l.offset = 16; break;
    case VLM_QUANT_Q5_1: l.has_minimum = 1; break;
    case VLM_QUANT_Q8_0: l.offset = 128; break;
    default: return -1;
    }
    if (columns <= 0 || columns % 32 != 0) return -1;
    l.blocks = columns / 32;
    l.value_bytes = l.nibbles ? 256 : 512;
    l.scales_offset = l.blocks * l.value_bytes;
    l.minimums_offset = l.scales_offset + l.blocks * 32;
    ptrdiff_t bytes = l.minimums_offset + (l.has_minimum ? l.blocks * 32 : 0);
    l.group_bytes = (bytes + 63) / 64 * 64;
    *layout = l;
    return 0;
}

int vlm_quant_packed_supported(void) {
#if defined(__x86_64__)
    return vlm_best_isa() == VLM_ISA_AVX512 && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

ptrdiff_t vlm_quant_packed_size(vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns) {
    vlm_quant_packed_layout_t layout;
    if (rows < 0 || vlm_quant_packed_layout(format, columns, &layout) != 0) return 0;
    return (rows + 15) / 16 * layout.group_bytes;
}

/// Element `i` of a Q5 block as an unsigned value 0–31: its nibble and, from the 32-bit word `high`, its fifth bit.
static uint8_t q5_value(const uint8_t *nibbles, uint32_t high, int i) {
    uint8_t low = i < 16 ? nibbles[i] & 0xF : nibbles[i - 16] >> 4;
    return (uint8_t)(low | ((high >> i) & 1) << 4);
}

void vlm_quant_pack(const vlm_quant_matrix *matrix, void *packed) {
    vlm_quant_packed_layout_t layout;
    if (vlm_quant_packed_layout(matrix->format, matrix->columns, &layout) != 0) return;
    const ptrdiff_t groups = (matrix->rows + 15) / 16;
    memset(packed, 0, (size_t)(groups * layout.group_bytes));
    for (ptrdiff_t row = 0; row < matrix->rows; row++) {
        uint8_t *group = (uint8_t *)packed + row / 16 * layout.group_bytes;
        const int lane = (int)(row % 16);
        const uint8_t *source = (const uint8_t *)matrix->data + row * matrix->row_bytes;
        for (ptrdiff_t b = 0; b < layout.blocks; b++) {
            const uint8_t *block;
            uint8_t *values = group + b * layout.value_bytes + 4 * lane;
            uint8_t *scale = group + layout.scales_offset + 32 * b + 2 * lane;
            uint8_t *minimum = group + layout.minimums_offset + 32 * b + 2 * lane;
            uint32_t high;
            switch (matrix->format) {
            case VLM_QUANT_Q4_0:
            case VLM_QUANT_Q4_1:
                // Chunk j holds source bytes 4j–4j+3: elements 4j… in the low nibbles, 16+4j… in the high ones.
                block = source + b * (matrix->format == VLM_QUANT_Q4_0 ? 18 : 20);
                memcpy(scale, block, 2);
                if (matrix->format == VLM_QUANT_Q4_1) memcpy(minimum, block + 2, 2);
                for (int j = 0; j < 4; j++) memcpy(values + 64 * j, block + (matrix->format == VLM_QUANT_Q4_0 ? 2 : 4) + 4 * j, 4);
                break;
            case VLM_QUANT_Q5_0:
            case VLM_QUANT_Q5_1: {
                const int has_minimum = matrix->format == VLM_QUANT_Q5_1;
                block = source + b * (has_minimum ? 24 : 22);
                memcpy(scale, block, 2);
                if (has_minimum) memcpy(minimum, block + 2, 2);
                memcpy(&high, block + (has_minimum ? 4 : 2), 4);
                for (int i = 0; i < 32; i++) values[64 * (i / 4) + i % 4] = q5_value(block + (has_minimum ? 8 : 6), high, i);
                break;
            }
            case VLM_QUANT_Q8_0:
                block = source + b * 34;
                memcpy(scale, block, 2);
                for (int i = 0; i < 32; i++) values[64 * (i / 4) + i % 4] = (uint8_t)((int8_t)block[2 + i] + 128);
                break;
            default: return;
            }
        }
    }
}

ptrdiff_t vlm_quant_activation_size(ptrdiff_t columns) { return columns / 32 * (96 + 2 * (ptrdiff_t)sizeof(float)); }

/// The largest |v| of the fixed point: three digits of at most 127, 64 and 64 in magnitude.
#define FIXED_POINT_LIMIT (127 << 14)
#define ROUNDING_MAGIC 12582912.0f

void vlm_quant_activation(const float *x, ptrdiff_t columns, void *activation) {
    const ptrdiff_t blocks = columns / 32;
    int8_t *digits = activation;
    float *scales = (float *)(digits + 96 * blocks), *sums = scales + blocks;
    for (ptrdiff_t b = 0; b < blocks; b++, x += 32, digits += 96) {
        float largest = 0, sum = 0;
        for (int i = 0; i < 32; i++) {
            largest = fmaxf(largest, fabsf(x[i]));
            sum += x[i];
        }
        sums[b] = sum;
        int finite = 1;
        for (int i = 0; i < 32; i++) finite &= isfinite(x[i]) != 0;
        if (!finite || largest == 0) {
            scales[b] = finite ? 0 : NAN;
            memset(digits, 0, 96);
            continue;
        }
        scales[b] = largest / FIXED_POINT_LIMIT;
        const float inverse = FIXED_POINT_LIMIT / largest;
        for (int i = 0; i < 32; i++) {
            // Adding and taking away 1.5·2²³ rounds to the nearest integer (|x·inverse| ≤ 2²¹ here) and, unlike
            // nearbyintf, vectorizes.
            const float rounded = (x[i] * inverse + ROUNDING_MAGIC) - ROUNDING_MAGIC;
            int32_t v = (int32_t)rounded;
            v = v > FIXED_POINT_LIMIT ? FIXED_POINT_LIMIT : (v < -FIXED_POINT_LIMIT ? -FIXED_POINT_LIMIT : v);
            // Round-to-nearest digit splits: h·2¹⁴ leaves |r| ≤ 2¹³, then m·2⁷ leaves |l| ≤ 64.
            const int32_t h = (v + (1 << 13)) >> 14, r = v - h * (1 << 14);
            const int32_t m = (r + (1 << 6)) >> 7, l = r - m * (1 << 7);
            digits[i] = (int8_t)h;
            digits[32 + i] = (int8_t)m;
            digits[64 + i] = (int8_t)l;
        }
    }
}

void vlm_quant_packed_matmul(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                             const void *activations, ptrdiff_t m, float *y, ptrdiff_t y_stride,
                             ptrdiff_t first_group, ptrdiff_t groups) {
    vlm_quant_packed_layout_t layout;
    if (m <= 0 || m > VLM_QUANT_MAX_ROWS || groups <= 0 || vlm_quant_packed_layout(format, columns, &layout) != 0) return;
#if defined(__x86_64__)
    if (vlm_quant_packed_supported())
        vlm_quant_packed_matmul_avx512(packed, &layout, rows, activations, vlm_quant_activation_size(columns), m, y,
                                       y_stride, first_group, groups);
#else
    (void)packed, (void)rows, (void)activations, (void)y, (void)y_stride, (void)first_group;
#endif
}
