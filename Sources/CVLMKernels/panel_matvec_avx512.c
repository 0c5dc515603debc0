#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>

#include "kernels_internal.h"

#define AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma")))

enum { PANEL = 64, LANES = 16 };

/// Panels read side by side: each is a stream of its own, and a core draws more from memory with two streams in flight
/// than with one (a C harness over an OPT-2.7B decoding step's matrices, packed as oneDNN packs them, on transparent
/// huge pages, Zen 4: one panel at a time 26 GB/s, two 28, four 21, oneDNN's own M=1 matmul 21–23, plain loads 27–29).
enum { STREAMS = 2 };

/// Bytes ahead of the row being read that each stream asks for into L2, as the packed int8 products do.
enum { PREFETCH_DISTANCE = 8192 };

/// Writes `count` panels' sums from `first` on, plus the bias, the last panel's only up to `last_columns`.
static inline __attribute__((always_inline, target("avx512f,avx512dq,avx512bw,avx512vl,fma"))) void
store_panels(__m512 acc[][PANEL / LANES], int count, const float *bias, float *y, ptrdiff_t first, ptrdiff_t last_columns) {
    for (int s = 0; s < count; s++) {
        const ptrdiff_t columns = s == count - 1 ? last_columns : PANEL;
        float *out = y + (first + s) * PANEL;
        for (int v = 0; v < PANEL / LANES; v++) {
            const ptrdiff_t left = columns - v * LANES;
            if (left <= 0) break;
            const __mmask16 m = left >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
            __m512 value = acc[s][v];
            if (bias) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(m, bias + (first + s) * PANEL + v * LANES));
            _mm512_mask_storeu_ps(out + v * LANES, m, value);
        }
    }
}

/// y[64p + c] for the panels p in `first ..< first + count` of at most STREAMS panels, all full or the last one holding
/// `last_columns`.
AVX512 static void panels_product(const float *w, ptrdiff_t k, ptrdiff_t panel_stride, const float *x, const float *bias,
                                  float *y, ptrdiff_t first, int count, ptrdiff_t last_columns) {
    __m512 acc[STREAMS][PANEL / LANES];
    const float *rows[STREAMS];
    for (int s = 0; s < count; s++) {
        rows[s] = w + (first + s) * panel_stride;
        for (int v = 0; v < PANEL / LANES; v++) acc[s][v] = _mm512_setzero_ps();
    }
    for (ptrdiff_t r = 0; r < k; r++) {
        const __m512 xr = _mm512_set1_ps(x[r]);
        for (int s = 0; s < count; s++) {
            const float *row = rows[s] + r * PANEL;
            const char *ahead = (const char *)row + PREFETCH_DISTANCE;
            for (int line = 0; line < PANEL * (int)sizeof(float); line += 64) _mm_prefetch(ahead + line, _MM_HINT_T1);
            for (int v = 0; v < PANEL / LANES; v++) acc[s][v] = _mm512_fmadd_ps(xr, _mm512_loadu_ps(row + v * LANES), acc[s][v]);
        }
    }
    store_panels(acc, count, bias, y, first, last_columns);
}

AVX512 void vlm_panel_matvec_avx512(const float *w, ptrdiff_t k, ptrdiff_t n, ptrdiff_t panel_stride, const float *x,
                                    const float *bias, float *y, ptrdiff_t first_panel, ptrdiff_t panel_count) {
    const ptrdiff_t panels = (n + PANEL - 1) / PANEL;
    for (ptrdiff_t p = first_panel; p < first_panel + panel_count; p += STREAMS) {
        const int count = (int)(first_panel + panel_count - p < STREAMS ? first_panel + panel_count - p : STREAMS);
        const ptrdiff_t last = p + count - 1;
        panels_product(w, k, panel_stride, x, bias, y, p, count, last == panels - 1 ? n - last * PANEL : PANEL);
    }
}

/// The bf16 form: panel p holds the matrix's rows in pairs, each pair its 64 columns' two values side by side
/// (oneDNN's `BA16a64b2a`), and `x` is bf16 too; each pair of rows is one AVX512-BF16 dot product per 16 columns, in
/// fp32 as oneDNN's bf16 matmul forms it.
#define AVX512_BF16 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,fma")))

AVX512_BF16 static void bf16_panels_product(const uint16_t *w, ptrdiff_t k, ptrdiff_t panel_stride, const uint16_t *x,
                                            const float *bias, float *y, ptrdiff_t first, int count,
                                            ptrdiff_t last_columns) {
    __m512 acc[STREAMS][PANEL / LANES];
    const uint16_t *rows[STREAMS];
    for (int s = 0; s < count; s++) {
        rows[s] = w + (first + s) * panel_stride;
        for (int v = 0; v < PANEL / LANES; v++) acc[s][v] = _mm512_setzero_ps();
    }
    for (ptrdiff_t pair = 0; pair < (k + 1) / 2; pair++) {
        // Both rows' inputs in each 32-bit lane; past an odd k the second is zero (its weights are padding).
        const uint32_t second = 2 * pair + 1 < k ? x[2 * pair + 1] : 0;
        const __m512bh xr = (__m512bh)_mm512_set1_epi32((int)((uint32_t)x[2 * pair] | second << 16));
        for (int s = 0; s < count; s++) {
            const uint16_t *row = rows[s] + pair * 2 * PANEL;
            const char *ahead = (const char *)row + PREFETCH_DISTANCE;
            for (int line = 0; line < 2 * PANEL * (int)sizeof(uint16_t); line += 64) _mm_prefetch(ahead + line, _MM_HINT_T1);
            for (int v = 0; v < PANEL / LANES; v++)
                acc[s][v] = _mm512_dpbf16_ps(acc[s][v], xr, (__m512bh)_mm512_loadu_si512(row + 2 * LANES * v));
        }
    }
    store_panels(acc, count, bias, y, first, last_columns);
}

AVX512_BF16 void vlm_panel_matvec_bf16_avx512(const uint16_t *w, ptrdiff_t k, ptrdiff_t n, ptrdiff_t panel_stride,
                                              const uint16_t *x, const float *bias, float *y, ptrdiff_t first_panel,
                                              ptrdiff_t panel_count) {
    const ptrdiff_t panels = (n + PANEL - 1) / PANEL;
    for (ptrdiff_t p = first_panel; p < first_panel + panel_count; p += STREAMS) {
        const int count = (int)(first_panel + panel_count - p < STREAMS ? first_panel + panel_count - p : STREAMS);
        const ptrdiff_t last = p + count - 1;
        bf16_panels_product(w, k, panel_stride, x, bias, y, p, count, last == panels - 1 ? n - last * PANEL : PANEL);
    }
}

/// The int8 form, over the plain `[k][n]` matrix oneDNN keeps dynamic int8 weights in: four rows at a time across a
/// band of panels, their bytes interleaved into the dwords `vpdpbusd` multiplies (column c of a 128-bit lane L lands in
/// dword `4L + c % 4` of accumulator `c / 4`), the row's bytes made unsigned by adding 128, which the columns' sums
/// take out again. Sums are exact in int32; the scales, the row's scale and the bias follow in oneDNN's order.
#define VNNI __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni")))

/// Panels a band reads row after row, each row's slice of it contiguous: the band's sums (256 bytes a panel, 16 KB)
/// stay in L1. Reading the matrix in row slices instead of four panels down all its rows took a C harness over Gemma 3
/// 4B's decoder matrices (377 MB, 2 threads, Zen 4) from 17–21 GB/s to 27–28, the same bits.
enum { INT8_BAND = 64 };

/// Rows ahead of the four being read whose slices are asked for into L2 (8 and 16 measured alike in that harness,
/// 32 and 64 slower).
enum { INT8_PREFETCH_ROWS = 16 };

VNNI static void int8_band_product(const int8_t *w, ptrdiff_t k, ptrdiff_t n, const int8_t *x, const int32_t *column_sums,
                                   const float *weight_scales, float row_scale, const float *bias, float *y,
                                   ptrdiff_t first, ptrdiff_t count) {
    __m512i acc[INT8_BAND * 4];
    for (ptrdiff_t i = 0; i < count * 4; i++) acc[i] = _mm512_setzero_si512();
    const ptrdiff_t panels = (n + PANEL - 1) / PANEL;
    const __mmask64 last_mask = n % PANEL && first + count == panels ? ((__mmask64)1 << (n % PANEL)) - 1 : ~(__mmask64)0;
    const int8_t *base = w + first * PANEL;
    for (ptrdiff_t r = 0; r < k; r += 4) {
        uint32_t bytes = 0;
        for (int j = 0; j < 4 && r + j < k; j++) bytes |= (uint32_t)(uint8_t)(x[r + j] + 128) << (8 * j);
        const __m512i xr = _mm512_set1_epi32((int)bytes);
        const int8_t *rows[4];
        for (int j = 0; j < 4; j++) rows[j] = r + j < k ? base + (r + j) * n : NULL;
        const int ahead = r + INT8_PREFETCH_ROWS + 4 <= k;
        for (ptrdiff_t s = 0; s < count; s++) {
            const __mmask64 mask = s == count - 1 ? last_mask : ~(__mmask64)0;
            if (ahead) {
                for (int j = 0; j < 4; j++) _mm_prefetch((const char *)(rows[j] + INT8_PREFETCH_ROWS * n + s * PANEL), _MM_HINT_T1);
            }
            __m512i v[4];
            for (int j = 0; j < 4; j++) v[j] = rows[j] ? _mm512_maskz_loadu_epi8(mask, rows[j] + s * PANEL) : _mm512_setzero_si512();
            const __m512i low01 = _mm512_unpacklo_epi8(v[0], v[1]), high01 = _mm512_unpackhi_epi8(v[0], v[1]);
            const __m512i low23 = _mm512_unpacklo_epi8(v[2], v[3]), high23 = _mm512_unpackhi_epi8(v[2], v[3]);
            __m512i *a = acc + 4 * s;
            a[0] = _mm512_dpbusd_epi32(a[0], xr, _mm512_unpacklo_epi16(low01, low23));
            a[1] = _mm512_dpbusd_epi32(a[1], xr, _mm512_unpackhi_epi16(low01, low23));
            a[2] = _mm512_dpbusd_epi32(a[2], xr, _mm512_unpacklo_epi16(high01, high23));
            a[3] = _mm512_dpbusd_epi32(a[3], xr, _mm512_unpackhi_epi16(high01, high23));
        }
    }
    for (ptrdiff_t s = 0; s < count; s++) {
        int32_t lanes[4][LANES], sums[PANEL];
        for (int q = 0; q < 4; q++) _mm512_storeu_si512(lanes[q], acc[4 * s + q]);
        for (int c = 0; c < PANEL; c++) sums[c] = lanes[(c % 16) / 4][4 * (c / 16) + c % 4];
        const ptrdiff_t column = (first + s) * PANEL, columns = n - column < PANEL ? n - column : PANEL;
        for (int v = 0; v < PANEL / LANES && v * LANES < columns; v++) {
            const ptrdiff_t left = columns - v * LANES;
            const __mmask16 m = left >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
            const ptrdiff_t at = column + v * LANES;
            // 128 times each column's sum: what the unsigned row added.
            const __m512i exact = _mm512_sub_epi32(_mm512_loadu_si512(sums + v * LANES),
                                                   _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, column_sums + at), 7));
            __m512 value = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), _mm512_maskz_loadu_ps(m, weight_scales + at));
            value = _mm512_mul_ps(value, _mm512_set1_ps(row_scale));
            if (bias) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(m, bias + at));
            _mm512_mask_storeu_ps(y + at, m, value);
        }
    }
}

VNNI void vlm_int8_matvec_avx512(const int8_t *w, ptrdiff_t k, ptrdiff_t n, const int8_t *x, const int32_t *column_sums,
                                 const float *weight_scales, float row_scale, const float *bias, float *y,
                                 ptrdiff_t first_panel, ptrdiff_t panel_count) {
    for (ptrdiff_t p = first_panel; p < first_panel + panel_count; p += INT8_BAND) {
        const ptrdiff_t count = first_panel + panel_count - p < INT8_BAND ? first_panel + panel_count - p : INT8_BAND;
        int8_band_product(w, k, n, x, column_sums, weight_scales, row_scale, bias, y, p, count);
    }
}

#endif
