#include <stdint.h>
#include <string.h>

#include "quant_packed.h"

// The packed layout (see vlm_kernels.h); the fixed-point activations and the products are in quant_packed_avx512.c.

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

void vlm_quant_activation(const float *x, ptrdiff_t columns, void *activation) {
#if defined(__x86_64__)
    if (vlm_quant_packed_supported() && columns > 0 && columns % 32 == 0) vlm_quant_activation_avx512(x, columns, activation);
#else
    (void)x, (void)columns, (void)activation;
#endif
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
