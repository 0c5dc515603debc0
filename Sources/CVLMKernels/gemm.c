#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

#if defined(__APPLE__)
// The CBLAS header of macOS 13.3 and later; the older one is deprecated.
#define ACCELERATE_NEW_LAPACK
#include <Accelerate/Accelerate.h>

static int multiply(ptrdiff_t m, ptrdiff_t n, ptrdiff_t k, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t ldb,
                    int transpose_b, float *c, ptrdiff_t ldc) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, (__LAPACK_int)m, (__LAPACK_int)n,
                (__LAPACK_int)k, 1.0f, a, (__LAPACK_int)lda, b, (__LAPACK_int)ldb, 0.0f, c, (__LAPACK_int)ldc);
    return 0;
}

#else

// Tiles of b are copied into a contiguous k × n panel, so one inner loop serves both layouts of b: every row of c
// takes `c[i, j] += a[i, p] · panel[p, j]` over the panel, a loop over independent j that compilers vectorize.
// A panel of PANEL_K × PANEL_N floats (128 KiB) stays in L2 while every row of a passes over it.
enum { PANEL_K = 128, PANEL_N = 256 };

PORTABLE_CLONES static void multiply_panel(ptrdiff_t m, ptrdiff_t n, ptrdiff_t k, const float *a, ptrdiff_t lda,
                                           const float *restrict panel, float *c, ptrdiff_t ldc) {
    for (ptrdiff_t i = 0; i < m; i++) {
        float *restrict row = c + i * ldc;
        for (ptrdiff_t p = 0; p < k; p++) {
            float scale = a[i * lda + p];
            const float *restrict source = panel + p * n;
            for (ptrdiff_t j = 0; j < n; j++) row[j] += scale * source[j];
        }
    }
}

static int multiply(ptrdiff_t m, ptrdiff_t n, ptrdiff_t k, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t ldb,
                    int transpose_b, float *c, ptrdiff_t ldc) {
    float *panel = malloc(sizeof(float) * PANEL_K * PANEL_N);
    if (!panel) return -1;
    for (ptrdiff_t i = 0; i < m; i++) memset(c + i * ldc, 0, (size_t)n * sizeof(float));
    for (ptrdiff_t j0 = 0; j0 < n; j0 += PANEL_N) {
        ptrdiff_t columns = n - j0 < PANEL_N ? n - j0 : PANEL_N;
        for (ptrdiff_t p0 = 0; p0 < k; p0 += PANEL_K) {
            ptrdiff_t depth = k - p0 < PANEL_K ? k - p0 : PANEL_K;
            for (ptrdiff_t p = 0; p < depth; p++) {
                for (ptrdiff_t j = 0; j < columns; j++) {
                    panel[p * columns + j] = transpose_b ? b[(j0 + j) * ldb + p0 + p] : b[(p0 + p) * ldb + j0 + j];
                }
            }
            multiply_panel(m, columns, depth, a + p0, lda, panel, c + j0, ldc);
        }
    }
    free(panel);
    return 0;
}

#endif

int vlm_gemm(ptrdiff_t m, ptrdiff_t n, ptrdiff_t k, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t ldb,
             int transpose_b, float *c, ptrdiff_t ldc) {
    if (m <= 0 || n <= 0) return 0;
    if (k <= 0) {
        for (ptrdiff_t i = 0; i < m; i++) memset(c + i * ldc, 0, (size_t)n * sizeof(float));
        return 0;
    }
    return multiply(m, n, k, a, lda, b, ldb, transpose_b, c, ldc);
}
