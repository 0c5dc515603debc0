#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quant_internal.h"

// AVX-512 dequantizers and matrix products for ggml's block formats; quant.c calls them only after checking the
// CPU. The dequantizers round after every multiply and add, as gguf-py does, so nothing may be contracted.
#pragma clang fp contract(off)

#define AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512dq,avx512bw,avx512vl,fma,f16c")))

/// Output rows computed together, so that each loaded activation vector serves several weight rows.
enum { ROWS = 4 };

AVX512_INLINE float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

AVX512_INLINE __m512i bytes_u32(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }

/// One 32-element block of the Q4/Q5/Q8 formats as two vectors (elements 0–15 and 16–31).
typedef struct { __m512 low, high; } block32;

AVX512_INLINE block32 q4_0_block(const uint8_t *b) {
    const __m512 d = _mm512_set1_ps(half_at(b));
    const __m512i q = bytes_u32(b + 2), eight = _mm512_set1_epi32(8), nibble = _mm512_set1_epi32(0xF);
    return (block32){_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(q, nibble), eight))),
                     _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight)))};
}

AVX512_INLINE block32 q4_1_block(const uint8_t *b) {
    const __m512 d = _mm512_set1_ps(half_at(b)), m = _mm512_set1_ps(half_at(b + 2));
    const __m512i q = bytes_u32(b + 4);
    return (block32){_mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(0xF)))), m),
                     _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4))), m)};
}

/// Q5_0 and Q5_1: the fifth bit of element i is bit i of a 32-bit word, which maps straight onto lane masks.
AVX512_INLINE block32 q5_block(const uint8_t *b, const int has_minimum) {
    const __m512 d = _mm512_set1_ps(half_at(b));
    const int high_offset = has_minimum ? 4 : 2;
    uint32_t high;
    memcpy(&high, b + high_offset, 4);
    const __m512i q = bytes_u32(b + high_offset + 4), sixteen = _mm512_set1_epi32(16);
    __m512i low = _mm512_and_si512(q, _mm512_set1_epi32(0xF)), upper = _mm512_srli_epi32(q, 4);
    low = _mm512_mask_or_epi32(low, (__mmask16)(high & 0xFFFF), low, sixteen);
    upper = _mm512_mask_or_epi32(upper, (__mmask16)(high >> 16), upper, sixteen);
    if (has_minimum) {
        const __m512 m = _mm512_set1_ps(half_at(b + 2));
        return (block32){_mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(low)), m),
                         _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(upper)), m)};
    }
    return (block32){_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(low, sixteen))),
                     _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(upper, sixteen)))};
}

AVX512_INLINE block32 q5_0_block(const uint8_t *b) { return q5_block(b, 0); }
AVX512_INLINE block32 q5_1_block(const uint8_t *b) { return q5_block(b, 1); }

AVX512_INLINE block32 q8_0_block(const uint8_t *b) {
    const __m512 d = _mm512_set1_ps(half_at(b));
    return (block32){_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2))))),
                     _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)))))};
}

AVX512_INLINE block32 f16_block(const uint8_t *b) {
    return (block32){_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b)),
                     _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 32)))};
}

AVX512_INLINE block32 bf16_block(const uint8_t *b) {
    return (block32){_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)b)), 16)),
                     _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + 32))), 16))};
}

#define BLOCK32_DEQUANTIZER(NAME, BYTES)                                                 \
    AVX512 static void NAME##_avx512(const uint8_t *block, ptrdiff_t count, float *out) { \
        for (ptrdiff_t b = 0; b < count; b++) {                                          \
            block32 v = NAME##_block(block + b * (BYTES));                               \
            _mm512_storeu_ps(out + 32 * b, v.low);                                       \
            _mm512_storeu_ps(out + 32 * b + 16, v.high);                                 \
        }                                                                                \
    }
BLOCK32_DEQUANTIZER(f16, 64)
BLOCK32_DEQUANTIZER(bf16, 64)
BLOCK32_DEQUANTIZER(q4_0, 18)
BLOCK32_DEQUANTIZER(q4_1, 20)
BLOCK32_DEQUANTIZER(q5_0, 22)
BLOCK32_DEQUANTIZER(q5_1, 24)
BLOCK32_DEQUANTIZER(q8_0, 34)

/// Q4_K and Q5_K; see quant.c for the layout.
AVX512_INLINE void qk_avx512(const uint8_t *block, ptrdiff_t count, float *out, const int five_bits) {
    const ptrdiff_t size = five_bits ? 176 : 144;
    const __m512i nibble = _mm512_set1_epi32(0xF), one = _mm512_set1_epi32(1);
    for (ptrdiff_t b = 0; b < count; b++, block += size, out += 256) {
        const float d = half_at(block), dmin = half_at(block + 2);
        const uint8_t *scales = block + 4, *high = block + 16, *q = block + (five_bits ? 48 : 16);
        for (int sub = 0; sub < 8; sub++) {
            uint8_t scale, minimum;
            vlm_k_scale_min(scales, sub, &scale, &minimum);
            const __m512 factor = _mm512_set1_ps(d * (float)scale), offset = _mm512_set1_ps(dmin * (float)minimum);
            const __m128i shift = _mm_cvtsi32_si128(4 * (sub % 2)), high_shift = _mm_cvtsi32_si128(sub);
            for (int h = 0; h < 2; h++) {
                __m512i value = _mm512_and_si512(_mm512_srl_epi32(bytes_u32(q + 32 * (sub / 2) + 16 * h), shift), nibble);
                if (five_bits) {
                    __m512i bit = _mm512_and_si512(_mm512_srl_epi32(bytes_u32(high + 16 * h), high_shift), one);
                    value = _mm512_or_si512(value, _mm512_slli_epi32(bit, 4));
                }
                _mm512_storeu_ps(out + 32 * sub + 16 * h,
                                 _mm512_sub_ps(_mm512_mul_ps(factor, _mm512_cvtepi32_ps(value)), offset));
            }
        }
    }
}

AVX512 static void q4_k_avx512(const uint8_t *block, ptrdiff_t count, float *out) { qk_avx512(block, count, out, 0); }
AVX512 static void q5_k_avx512(const uint8_t *block, ptrdiff_t count, float *out) { qk_avx512(block, count, out, 1); }

AVX512 static void q6_k_avx512(const uint8_t *block, ptrdiff_t count, float *out) {
    const __m512i nibble = _mm512_set1_epi32(0xF), pair = _mm512_set1_epi32(3), bias = _mm512_set1_epi32(32);
    for (ptrdiff_t b = 0; b < count; b++, block += 210, out += 256) {
        const uint8_t *low = block, *high = block + 128;
        const int8_t *scales = (const int8_t *)(block + 192);
        const float d = half_at(block + 208);
        for (int h = 0; h < 2; h++) {
            for (int g = 0; g < 8; g++) {
                __m512i l = _mm512_and_si512(
                    _mm512_srl_epi32(bytes_u32(low + 64 * h + 16 * (g % 4)), _mm_cvtsi32_si128(4 * (g / 4))), nibble);
                __m512i u = _mm512_and_si512(
                    _mm512_srl_epi32(bytes_u32(high + 32 * h + 16 * (g % 2)), _mm_cvtsi32_si128(2 * (g / 2))), pair);
                __m512i q = _mm512_sub_epi32(_mm512_or_si512(l, _mm512_slli_epi32(u, 4)), bias);
                _mm512_storeu_ps(out + 128 * h + 16 * g,
                                 _mm512_mul_ps(_mm512_set1_ps(d * (float)scales[8 * h + g]), _mm512_cvtepi32_ps(q)));
            }
        }
    }
}

vlm_dequantize_blocks vlm_quant_dequantizer_avx512(vlm_quant_format format) {
    switch (format) {
    case VLM_QUANT_F16: return f16_avx512;
    case VLM_QUANT_BF16: return bf16_avx512;
    case VLM_QUANT_Q4_0: return q4_0_avx512;
    case VLM_QUANT_Q4_1: return q4_1_avx512;
    case VLM_QUANT_Q5_0: return q5_0_avx512;
    case VLM_QUANT_Q5_1: return q5_1_avx512;
    case VLM_QUANT_Q8_0: return q8_0_avx512;
    case VLM_QUANT_Q4_K: return q4_k_avx512;
    case VLM_QUANT_Q5_K: return q5_k_avx512;
    case VLM_QUANT_Q6_K: return q6_k_avx512;
    }
    return NULL;
}

AVX512_INLINE float sum_lanes(__m512 v) { return _mm512_reduce_add_ps(v); }

// The products may use fused multiply-adds: only dequantization has to match gguf-py bit for bit.
#pragma clang fp contract(fast)

/// One activation row times `R` weight rows of a 32-element block format, dequantizing each block in registers.
#define FUSED_ROW_KERNEL(NAME, BYTES)                                                                              \
    AVX512_INLINE void NAME##_fused(const uint8_t *const *rows, const int R, ptrdiff_t blocks, const float *x,      \
                                    float *sums) {                                                                 \
        __m512 acc[ROWS];                                                                                          \
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();                                                  \
        for (ptrdiff_t b = 0; b < blocks; b++) {                                                                   \
            const __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);                  \
            for (int r = 0; r < R; r++) {                                                                          \
                block32 w = NAME##_block(rows[r] + b * (BYTES));                                                   \
                acc[r] = _mm512_fmadd_ps(w.low, x0, acc[r]);                                                       \
                acc[r] = _mm512_fmadd_ps(w.high, x1, acc[r]);                                                      \
            }                                                                                                      \
        }                                                                                                          \
        for (int r = 0; r < R; r++) sums[r] = sum_lanes(acc[r]);                                                   \
    }                                                                                                              \
    AVX512 static void NAME##_fused_rows(const uint8_t *const *rows, int R, ptrdiff_t blocks, const float *x,      \
                                         float *sums) {                                                            \
        switch (R) {                                                                                               \
        case 1: NAME##_fused(rows, 1, blocks, x, sums); break;                                                     \
        case 2: NAME##_fused(rows, 2, blocks, x, sums); break;                                                     \
        case 3: NAME##_fused(rows, 3, blocks, x, sums); break;                                                     \
        default: NAME##_fused(rows, ROWS, blocks, x, sums); break;                                                 \
        }                                                                                                          \
    }
FUSED_ROW_KERNEL(f16, 64)
FUSED_ROW_KERNEL(bf16, 64)
FUSED_ROW_KERNEL(q4_0, 18)

/// Q4_1 factored as d·Σq·x + m·Σx, so a block costs one multiply, two fused multiply-adds and one scale
/// conversion per row instead of dequantizing every element; Σx over a block is shared by all rows. Nibbles become
/// floats by a 16-entry table lookup (vpermps reads only an index's low four bits), which runs on the shuffle port
/// and leaves the multiply port to the arithmetic: the loop is bound by that port.
AVX512_INLINE void q4_1_fused(const uint8_t *const *rows, const int R, ptrdiff_t blocks, const float *x, float *sums) {
    __m512 acc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const __m512 nibble_values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (ptrdiff_t b = 0; b < blocks; b++) {
        const __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
        const __m512 block_sum = _mm512_add_ps(x0, x1);
        for (int r = 0; r < R; r++) {
            const uint8_t *block = rows[r] + b * 20;
            uint32_t scales;
            memcpy(&scales, block, 4);
            // Lanes 0 and 1: d and m.
            const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)scales));
            const __m512i q = bytes_u32(block + 4);
            __m512 dot = _mm512_mul_ps(_mm512_permutexvar_ps(q, nibble_values), x0);
            dot = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), nibble_values), x1, dot);
            acc[r] = _mm512_fmadd_ps(dot, _mm512_broadcastss_ps(dm), acc[r]);
            acc[r] = _mm512_fmadd_ps(block_sum, _mm512_broadcastss_ps(_mm_movehdup_ps(dm)), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) sums[r] = sum_lanes(acc[r]);
}

AVX512 static void q4_1_fused_rows(const uint8_t *const *rows, int R, ptrdiff_t blocks, const float *x, float *sums) {
    switch (R) {
    case 1: q4_1_fused(rows, 1, blocks, x, sums); break;
    case 2: q4_1_fused(rows, 2, blocks, x, sums); break;
    case 3: q4_1_fused(rows, 3, blocks, x, sums); break;
    default: q4_1_fused(rows, ROWS, blocks, x, sums); break;
    }
}
FUSED_ROW_KERNEL(q5_0, 22)
FUSED_ROW_KERNEL(q5_1, 24)

/// Q8_0 factored as d·Σq·x: one scale multiply per block and row instead of one per element.
AVX512_INLINE void q8_0_fused(const uint8_t *const *rows, const int R, ptrdiff_t blocks, const float *x, float *sums) {
    __m512 acc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (ptrdiff_t b = 0; b < blocks; b++) {
        const __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
        for (int r = 0; r < R; r++) {
            const uint8_t *block = rows[r] + b * 34;
            const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 2))));
            const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 18))));
            const __m512 dot = _mm512_fmadd_ps(q1, x1, _mm512_mul_ps(q0, x0));
            acc[r] = _mm512_fmadd_ps(dot, _mm512_set1_ps(half_at(block)), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) sums[r] = sum_lanes(acc[r]);
}

AVX512 static void q8_0_fused_rows(const uint8_t *const *rows, int R, ptrdiff_t blocks, const float *x, float *sums) {
    switch (R) {
    case 1: q8_0_fused(rows, 1, blocks, x, sums); break;
    case 2: q8_0_fused(rows, 2, blocks, x, sums); break;
    case 3: q8_0_fused(rows, 3, blocks, x, sums); break;
    default: q8_0_fused(rows, ROWS, blocks, x, sums); break;
    }
}

typedef void (*fused_rows_kernel)(const uint8_t *const *rows, int R, ptrdiff_t blocks, const float *x, float *sums);

static fused_rows_kernel fused_kernel(vlm_quant_format format) {
    switch (format) {
    case VLM_QUANT_F16: return f16_fused_rows;
    case VLM_QUANT_BF16: return bf16_fused_rows;
    case VLM_QUANT_Q4_0: return q4_0_fused_rows;
    case VLM_QUANT_Q4_1: return q4_1_fused_rows;
    case VLM_QUANT_Q5_0: return q5_0_fused_rows;
    case VLM_QUANT_Q5_1: return q5_1_fused_rows;
    case VLM_QUANT_Q8_0: return q8_0_fused_rows;
    default: return NULL;
    }
}

/// `sums[i·ROWS + r] += w_r · x_i` over one chunk of `length` (a multiple of 16) dequantized weights per row.
AVX512_INLINE void chunk_dot(const float (*w)[VLM_QUANT_CHUNK], const int R, ptrdiff_t length, const float *x,
                             ptrdiff_t m, ptrdiff_t x_stride, float *sums) {
    for (ptrdiff_t i = 0; i < m; i++) {
        __m512 acc[ROWS];
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
        for (ptrdiff_t k = 0; k < length; k += 16) {
            const __m512 xv = _mm512_loadu_ps(x + i * x_stride + k);
            for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(_mm512_load_ps(w[r] + k), xv, acc[r]);
        }
        for (int r = 0; r < R; r++) sums[i * ROWS + r] += sum_lanes(acc[r]);
    }
}

AVX512 static void chunk_dot_rows(const float (*w)[VLM_QUANT_CHUNK], int R, ptrdiff_t length, const float *x,
                                  ptrdiff_t m, ptrdiff_t x_stride, float *sums) {
    switch (R) {
    case 1: chunk_dot(w, 1, length, x, m, x_stride, sums); break;
    case 2: chunk_dot(w, 2, length, x, m, x_stride, sums); break;
    case 3: chunk_dot(w, 3, length, x, m, x_stride, sums); break;
    default: chunk_dot(w, ROWS, length, x, m, x_stride, sums); break;
    }
}

AVX512 void vlm_quant_matmul_rows_avx512(const vlm_quant_matrix *matrix, const float *x, ptrdiff_t m,
                                         ptrdiff_t x_stride, float *y, ptrdiff_t y_stride, ptrdiff_t first,
                                         ptrdiff_t count) {
    ptrdiff_t elements = 0, bytes = 0;
    vlm_quant_block_layout(matrix->format, &elements, &bytes);
    const uint8_t *data = matrix->data;
    const ptrdiff_t end = first + count;
    fused_rows_kernel fused = m == 1 ? fused_kernel(matrix->format) : NULL;
    vlm_dequantize_blocks dequantize = vlm_quant_dequantizer_avx512(matrix->format);
    _Alignas(64) float w[ROWS][VLM_QUANT_CHUNK];
    for (ptrdiff_t j = first; j < end; j += ROWS) {
        const int R = end - j < ROWS ? (int)(end - j) : ROWS;
        const uint8_t *rows[ROWS];
        for (int r = 0; r < R; r++) rows[r] = data + (j + r) * matrix->row_bytes;
        float sums[VLM_QUANT_MAX_ROWS * ROWS] = {0};
        if (fused) {
            fused(rows, R, matrix->columns / elements, x, sums);
        } else {
            for (ptrdiff_t c = 0; c < matrix->columns; c += VLM_QUANT_CHUNK) {
                const ptrdiff_t length = matrix->columns - c < VLM_QUANT_CHUNK ? matrix->columns - c : VLM_QUANT_CHUNK;
                for (int r = 0; r < R; r++) dequantize(rows[r] + c / elements * bytes, length / elements, w[r]);
                chunk_dot_rows((const float (*)[VLM_QUANT_CHUNK])w, R, length, x + c, m, x_stride, sums);
            }
        }
        for (ptrdiff_t i = 0; i < m; i++)
            for (int r = 0; r < R; r++) y[i * y_stride + j + r] = sums[i * ROWS + r];
    }
}

#endif
