#ifndef VLM_QUANT_INTERNAL_H
#define VLM_QUANT_INTERNAL_H

#include <stdint.h>

#include "kernels_internal.h"

// Shared by quant.c (portable code, entry points), quant_avx512.c and quant_packed.c.

/// Elements of a weight row dequantized at a time by the matrix products: a multiple of every block size, and
/// small enough that a few rows of it stay in L1.
enum { VLM_QUANT_CHUNK = 256 };

/// Turns `count` consecutive blocks into `count · block elements` floats.
typedef void (*vlm_dequantize_blocks)(const uint8_t *blocks, ptrdiff_t count, float *out);

float vlm_half_to_float(uint16_t h);
/// The 6-bit scale and minimum of sub-block `index` (0–7) from Q4_K's and Q5_K's 12 packed bytes.
void vlm_k_scale_min(const uint8_t *scales, int index, uint8_t *scale, uint8_t *minimum);

/// Element `i` (0–31) of a Q5_0/Q5_1 block as 0–31: its nibble (elements 16–31 in the high ones) and, from the
/// 32-bit word `high`, its fifth bit.
static inline int vlm_q5_value(const uint8_t *nibbles, uint32_t high, int i) {
    const int low = i < 16 ? nibbles[i] & 0xF : nibbles[i - 16] >> 4;
    return low | (int)((high >> i) & 1) << 4;
}

/// Element `l` (0–31) of sub-block `sub` (0–7) of a Q4_K/Q5_K super-block: its nibble from the 128 bytes `q` and,
/// for Q5_K (`high` the 32 bytes of fifth bits, NULL for Q4_K), its fifth bit.
static inline int vlm_qk_value(const uint8_t *q, const uint8_t *high, int sub, int l) {
    const int value = (q[32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0xF;
    return high ? value | ((high[l] >> sub) & 1) << 4 : value;
}

/// Element `e` (0–255) of a Q6_K super-block as 0–63: its nibble from the first 128 bytes, its high bit pair from
/// the next 64.
static inline int vlm_q6_k_value(const uint8_t *block, int e) {
    const int half = e / 128, within = e % 128;
    const int nibble = (block[64 * half + within % 64] >> (4 * (within / 64))) & 0xF;
    const int pair = (block[128 + 32 * half + within % 32] >> (2 * (within / 32))) & 3;
    return nibble | pair << 4;
}

/// NULL for a format the kernels do not read.
vlm_dequantize_blocks vlm_quant_dequantizer_scalar(vlm_quant_format format);

#if defined(__x86_64__)
vlm_dequantize_blocks vlm_quant_dequantizer_avx512(vlm_quant_format format);
void vlm_quant_matmul_rows_avx512(const vlm_quant_matrix *matrix, const float *x, ptrdiff_t m, ptrdiff_t x_stride,
                                  float *y, ptrdiff_t y_stride, ptrdiff_t first, ptrdiff_t count);
#endif

#endif
