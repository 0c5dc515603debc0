#ifndef VLM_QUANT_INTERNAL_H
#define VLM_QUANT_INTERNAL_H

#include <stdint.h>

#include "kernels_internal.h"

// Shared by quant.c (portable code, entry points) and quant_avx512.c.

/// Elements of a weight row dequantized at a time by the matrix products: a multiple of every block size, and
/// small enough that a few rows of it stay in L1.
enum { VLM_QUANT_CHUNK = 256 };

/// Turns `count` consecutive blocks into `count · block elements` floats.
typedef void (*vlm_dequantize_blocks)(const uint8_t *blocks, ptrdiff_t count, float *out);

float vlm_half_to_float(uint16_t h);
/// The 6-bit scale and minimum of sub-block `index` (0–7) from Q4_K's and Q5_K's 12 packed bytes.
void vlm_k_scale_min(const uint8_t *scales, int index, uint8_t *scale, uint8_t *minimum);

/// NULL for a format the kernels do not read.
vlm_dequantize_blocks vlm_quant_dequantizer_scalar(vlm_quant_format format);

#if defined(__x86_64__)
vlm_dequantize_blocks vlm_quant_dequantizer_avx512(vlm_quant_format format);
void vlm_quant_matmul_rows_avx512(const vlm_quant_matrix *matrix, const float *x, ptrdiff_t m, ptrdiff_t x_stride,
                                  float *y, ptrdiff_t y_stride, ptrdiff_t first, ptrdiff_t count);
#endif

#endif
