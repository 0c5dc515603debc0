#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_internal.h"
#include "quant_packed.h"

// The packed layout (see vlm_kernels.h); the fixed-point activations and the products are in quant_packed_avx512.c
// (AVX-512 VNNI) and quant_packed_avx2.c (AVX2 and FMA, on CPUs without VNNI).

int vlm_quant_packed_layout(vlm_quant_format format, ptrdiff_t columns, vlm_quant_packed_layout_t *layout) {
    vlm_quant_packed_layout_t l = {0};
    switch (format) {
    case VLM_QUANT_Q4_0: l.nibbles = 1, l.offset = 8; break;
    case VLM_QUANT_Q4_1: l.nibbles = 1, l.has_minimum = 1; break;
    case VLM_QUANT_Q5_0: l.nibbles = 1, l.high_bits = 1, l.offset = 16; break;
    case VLM_QUANT_Q5_1: l.nibbles = 1, l.high_bits = 1, l.has_minimum = 1; break;
    case VLM_QUANT_Q8_0: l.offset = 128; break;
    case VLM_QUANT_Q4_K: l.nibbles = 1, l.has_minimum = 1, l.super_scales = 1; break;
    case VLM_QUANT_Q5_K: l.nibbles = 1, l.high_bits = 1, l.has_minimum = 1, l.super_scales = 1; break;
    case VLM_QUANT_Q6_K: l.nibbles = 1, l.high_bits = 2, l.offset = 32, l.super_scales = 1, l.half_scales = 1; break;
    default: return -1;
    }
    const ptrdiff_t block_elements = l.super_scales ? 256 : 32;
    if (columns <= 0 || columns % block_elements != 0) return -1;
    l.blocks = columns / 32;
    l.value_bytes = l.nibbles ? 256 + 64 * l.high_bits : 512;
    l.scale_bytes = l.half_scales ? 32 : l.super_scales ? 16 : 32;
    l.scales_offset = l.blocks * l.value_bytes;
    l.minimums_offset = l.scales_offset + l.blocks * l.scale_bytes;
    l.supers_offset = l.minimums_offset + (l.has_minimum ? l.blocks * l.scale_bytes : 0);
    l.super_bytes = l.super_scales ? (l.has_minimum ? 64 : 32) : 0;
    const ptrdiff_t bytes = l.supers_offset + l.blocks / 8 * l.super_bytes;
    l.group_bytes = (bytes + 63) / 64 * 64;
    *layout = l;
    return 0;
}

/// Which products run: 2 the AVX-512 VNNI ones, 1 the AVX2 ones, 0 none.
static int packed_kernels(void) {
#if defined(__x86_64__)
    if (vlm_best_isa() == VLM_ISA_AVX512 && __builtin_cpu_supports("avx512vnni")) return 2;
    if (vlm_has_avx2()) return 1;
#endif
    return 0;
}

int vlm_quant_packed_supported(void) { return packed_kernels() != 0; }

ptrdiff_t vlm_quant_packed_size(vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns) {
    vlm_quant_packed_layout_t layout;
    if (rows < 0 || vlm_quant_packed_layout(format, columns, &layout) != 0) return 0;
    return (rows + 15) / 16 * layout.group_bytes;
}

/// Stores `value` as row `lane`'s 8-bit entry of block `b`'s sub-block scales (`offset` = scales_offset or
/// minimums_offset), in the first or second half-block set where there is one per half.
static void store_byte(uint8_t *group, const vlm_quant_packed_layout_t *layout, ptrdiff_t offset, ptrdiff_t b,
                       int half, int lane, uint8_t value) {
    group[offset + layout->scale_bytes * b + 16 * half + lane] = value;
}

/// Stores row `lane`'s fp16 d (`which` 0) or dmin (1) of super-block `super` as the bytes the file holds.
static void store_super(uint8_t *group, const vlm_quant_packed_layout_t *layout, ptrdiff_t super, int which, int lane,
                        const uint8_t *half) {
    memcpy(group + layout->supers_offset + layout->super_bytes * super + 32 * which + 2 * lane, half, 2);
}

/// Row `lane`'s 32 unsigned values `v` of block `b`, written at once into the group (zeroed before). In nibble
/// layouts chunk j = i % 16 / 4 holds elements 4j… in its low nibbles and 16 + 4j… in its high ones, which the kernel
/// unpacks into the vectors w[j] and w[4 + j]; bit 4 + p of a value is bit 4·lane + i % 4 of plane p's mask for
/// that vector.
static void store_block(uint8_t *group, const vlm_quant_packed_layout_t *layout, ptrdiff_t b, int lane,
                        const uint8_t *v) {
    uint8_t *values = group + b * layout->value_bytes;
    if (!layout->nibbles) {
        for (int i = 0; i < 32; i++) values[4 * lane + 64 * (i / 4) + i % 4] = v[i];
        return;
    }
    for (int i = 0; i < 16; i++) values[4 * lane + 64 * (i / 4) + i % 4] = (uint8_t)((v[i] & 0xF) | (v[16 + i] & 0xF) << 4);
    for (int plane = 0; plane < layout->high_bits; plane++) {
        for (int vector = 0; vector < 8; vector++) {
            const int first = vector < 4 ? 4 * vector : 16 + 4 * (vector - 4);
            uint64_t bits = 0;
            for (int k = 0; k < 4; k++) bits |= (uint64_t)(v[first + k] >> (4 + plane) & 1) << (4 * lane + k);
            uint64_t mask;
            memcpy(&mask, values + 256 + 64 * plane + 8 * vector, 8);
            mask |= bits;
            memcpy(values + 256 + 64 * plane + 8 * vector, &mask, 8);
        }
    }
}

/// One row of a K-quant matrix into lane `lane` of its group: per super-block its fp16 d (and dmin) as stored, per
/// 32-element block the 8-bit sub-block scales (Q6_K: signed, one per 16 elements) and minimums, and the unsigned
/// values. Six-bit scales take a byte each, so a packed super-block is at most 3% larger than the stored one.
static void pack_k_row(const vlm_quant_matrix *matrix, const vlm_quant_packed_layout_t *layout, const uint8_t *source,
                       uint8_t *group, int lane) {
    for (ptrdiff_t super = 0; super < matrix->columns / 256; super++) {
        const ptrdiff_t first = 8 * super;
        if (matrix->format == VLM_QUANT_Q6_K) {
            const uint8_t *block = source + 210 * super;
            store_super(group, layout, super, 0, lane, block + 208);
            for (int sub = 0; sub < 16; sub++)
                store_byte(group, layout, layout->scales_offset, first + sub / 2, sub % 2, lane, block[192 + sub]);
            for (int sub = 0; sub < 8; sub++) {
                uint8_t v[32];
                for (int i = 0; i < 32; i++) v[i] = (uint8_t)vlm_q6_k_value(block, 32 * sub + i);
                store_block(group, layout, first + sub, lane, v);
            }
            continue;
        }
        const int five_bits = matrix->format == VLM_QUANT_Q5_K;
        const uint8_t *block = source + (five_bits ? 176 : 144) * super;
        store_super(group, layout, super, 0, lane, block);
        store_super(group, layout, super, 1, lane, block + 2);
        const uint8_t *scales = block + 4, *high = block + 16, *q = block + (five_bits ? 48 : 16);
        for (int sub = 0; sub < 8; sub++) {
            uint8_t scale, minimum;
            vlm_k_scale_min(scales, sub, &scale, &minimum);
            store_byte(group, layout, layout->scales_offset, first + sub, 0, lane, scale);
            store_byte(group, layout, layout->minimums_offset, first + sub, 0, lane, minimum);
            uint8_t v[32];
            for (int l = 0; l < 32; l++) v[l] = (uint8_t)vlm_qk_value(q, five_bits ? high : NULL, sub, l);
            store_block(group, layout, first + sub, lane, v);
        }
    }
}

void vlm_quant_pack(const vlm_quant_matrix *matrix, void *packed) {
    vlm_quant_packed_layout_t layout;
    if (vlm_quant_packed_layout(matrix->format, matrix->columns, &layout) != 0) return;
    const ptrdiff_t groups = (matrix->rows + 15) / 16;
    memset(packed, 0, (size_t)(groups * layout.group_bytes));
    for (ptrdiff_t row = 0; row < matrix->rows && layout.super_scales; row++) {
        pack_k_row(matrix, &layout, (const uint8_t *)matrix->data + row * matrix->row_bytes,
                   (uint8_t *)packed + row / 16 * layout.group_bytes, (int)(row % 16));
    }
    for (ptrdiff_t row = 0; row < matrix->rows && !layout.super_scales; row++) {
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
                uint8_t v[32];
                for (int i = 0; i < 32; i++) v[i] = (uint8_t)vlm_q5_value(block + (has_minimum ? 8 : 6), high, i);
                store_block(group, &layout, b, lane, v);
                break;
            }
            case VLM_QUANT_Q8_0: {
                block = source + b * 34;
                memcpy(scale, block, 2);
                uint8_t v[32];
                for (int i = 0; i < 32; i++) v[i] = (uint8_t)((int8_t)block[2 + i] + 128);
                store_block(group, &layout, b, lane, v);
                break;
            }
            default: return;
            }
        }
    }
}

ptrdiff_t vlm_quant_activation_size(ptrdiff_t columns) { return columns / 32 * (96 + 4 * (ptrdiff_t)sizeof(float)); }

void vlm_quant_activation(const float *x, ptrdiff_t columns, void *activation) {
#if defined(__x86_64__)
    if (columns <= 0 || columns % 32 != 0) return;
    switch (packed_kernels()) {
    case 2: vlm_quant_activation_avx512(x, columns, activation); break;
    case 1: vlm_quant_activation_avx2(x, columns, activation); break;
    default: break;
    }
#else
    (void)x, (void)columns, (void)activation;
#endif
}

void vlm_quant_packed_matmul(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                             const void *activations, ptrdiff_t m, float *y, ptrdiff_t y_stride,
                             ptrdiff_t first_group, ptrdiff_t groups, vlm_kernel_isa isa) {
    vlm_quant_packed_matmul_streams(packed, format, rows, columns, activations, m, y, y_stride, first_group, groups, isa,
                                    vlm_quant_streams());
}

void vlm_quant_packed_matmul_streams(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                                     const void *activations, ptrdiff_t m, float *y, ptrdiff_t y_stride,
                                     ptrdiff_t first_group, ptrdiff_t groups, vlm_kernel_isa isa, int streams) {
    vlm_quant_packed_layout_t layout;
    if (m <= 0 || m > VLM_QUANT_MAX_ROWS || groups <= 0 || vlm_quant_packed_layout(format, columns, &layout) != 0) return;
#if defined(__x86_64__)
    const int kernels = packed_kernels();
    switch (isa == VLM_ISA_AVX2 && kernels > 1 ? 1 : kernels) {
    case 2:
        vlm_quant_packed_matmul_avx512(packed, format, &layout, rows, activations, vlm_quant_activation_size(columns), m, y,
                                       y_stride, first_group, groups, streams);
        break;
    case 1:
        vlm_quant_packed_matmul_avx2(packed, &layout, rows, activations, vlm_quant_activation_size(columns), m, y,
                                     y_stride, first_group, groups);
        break;
    default: break;
    }
#else
    (void)packed, (void)rows, (void)activations, (void)y, (void)y_stride, (void)first_group, (void)isa, (void)streams;
#endif
}

int vlm_quant_int8_supported(void) { return packed_kernels() == 2; }

ptrdiff_t vlm_quant_int8_activation_size(ptrdiff_t columns) { return columns / 32 * (32 + 4 * (ptrdiff_t)sizeof(float)); }

void vlm_quant_int8_activation(const float *x, ptrdiff_t columns, void *activation) {
#if defined(__x86_64__)
    if (columns > 0 && columns % 32 == 0 && packed_kernels() == 2) vlm_quant_int8_activation_avx512(x, columns, activation);
#else
    (void)x, (void)columns, (void)activation;
#endif
}

int vlm_quant_int8_matmul(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                          const void *activations, ptrdiff_t m, float *y, ptrdiff_t y_stride,
                          ptrdiff_t first_group, ptrdiff_t groups) {
    return vlm_quant_int8_matmul_streams(packed, format, rows, columns, activations, m, y, y_stride, first_group, groups,
                                         vlm_quant_streams());
}

int vlm_quant_int8_matmul_streams(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                                  const void *activations, ptrdiff_t m, float *y, ptrdiff_t y_stride,
                                  ptrdiff_t first_group, ptrdiff_t groups, int streams) {
    vlm_quant_packed_layout_t layout;
    if (m <= 0 || groups <= 0 || vlm_quant_packed_layout(format, columns, &layout) != 0) return 0;
#if defined(__x86_64__)
    if (packed_kernels() == 2)
        return vlm_quant_int8_matmul_avx512(packed, format, &layout, rows, activations,
                                            vlm_quant_int8_activation_size(columns), m, y, y_stride, first_group,
                                            groups, streams);
#else
    (void)packed, (void)rows, (void)activations, (void)y, (void)y_stride, (void)first_group, (void)streams;
#endif
    return 0;
}

static atomic_uint_fast64_t call_tokens = 1;

uint64_t vlm_quant_call_token(void) { return atomic_fetch_add_explicit(&call_tokens, 1, memory_order_relaxed); }

/// A thread's copy of the row of the product with token `call` in one activation format, kept for the thread's life.
typedef struct thread_row {
    uint64_t call;
    void *activation;
    ptrdiff_t capacity;
} thread_row;

static _Thread_local thread_row fixed_point_row, int8_row;

/// `row` holding `x` as `quantize` writes it (`bytes`), written once per `call`; NULL when it cannot be allocated.
static const void *row_for_call(thread_row *row, uint64_t call, const float *x, ptrdiff_t columns, ptrdiff_t bytes,
                                void (*quantize)(const float *, ptrdiff_t, void *)) {
    if (row->call == call && row->activation != NULL) return row->activation;
    if (bytes > row->capacity) {
        void *grown = aligned_alloc(64, (size_t)(bytes + 63) / 64 * 64);
        if (!grown) return NULL;
        free(row->activation);
        row->activation = grown;
        row->capacity = bytes;
    }
    quantize(x, columns, row->activation);
    row->call = call;
    return row->activation;
}

int vlm_quant_packed_matvec(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                            const float *x, uint64_t call, float *y, ptrdiff_t first_group, ptrdiff_t groups) {
    const void *activation = row_for_call(&fixed_point_row, call, x, columns, vlm_quant_activation_size(columns),
                                          vlm_quant_activation);
    if (!activation) return -1;
    vlm_quant_packed_matmul(packed, format, rows, columns, activation, 1, y, rows, first_group, groups, VLM_ISA_AVX512);
    return 0;
}

int vlm_quant_int8_matvec(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                          const float *x, uint64_t call, float *y, ptrdiff_t first_group, ptrdiff_t groups) {
    const void *activation = row_for_call(&int8_row, call, x, columns, vlm_quant_int8_activation_size(columns),
                                          vlm_quant_int8_activation);
    if (!activation) return -1;
    return vlm_quant_int8_matmul(packed, format, rows, columns, activation, 1, y, rows, first_group, groups);
}
