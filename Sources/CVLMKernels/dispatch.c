#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels_internal.h"
#include "quant_internal.h"

int vlm_has_avx2(void) {
#if defined(__x86_64__)
    // Like avx512f, avx2 is reported only where the OS saves the ymm registers.
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

int vlm_has_avx512_bf16(void) {
#if defined(__x86_64__)
    return vlm_best_isa() == VLM_ISA_AVX512 && __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

vlm_kernel_isa vlm_best_isa(void) {
#if defined(__x86_64__)
    // __builtin_cpu_supports("avx512f") also checks that the OS saves the zmm registers (XCR0).
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma")) {
        return VLM_ISA_AVX512;
    }
    if (vlm_has_avx2()) return VLM_ISA_AVX2;
#endif
    return VLM_ISA_SCALAR;
}

#if defined(__x86_64__)
/// Bytes of the level-`level` data (or unified) cache from cpuid's deterministic cache parameters: leaf 4 on Intel,
/// 0x8000001D on AMD (same layout); 0 where `leaf` does not describe one.
static ptrdiff_t cache_bytes_from_leaf(unsigned leaf, unsigned level) {
    unsigned eax, ebx, ecx, edx;
    if (__get_cpuid_max(leaf & 0x80000000u, NULL) < leaf) return 0;
    for (unsigned subleaf = 0; subleaf < 16; subleaf++) {
        if (!__get_cpuid_count(leaf, subleaf, &eax, &ebx, &ecx, &edx)) return 0;
        const unsigned type = eax & 31;
        if (type == 0) return 0;
        if ((type == 1 || type == 3) && ((eax >> 5) & 7) == level) {
            return (ptrdiff_t)((ebx >> 22) + 1) * (((ebx >> 12) & 1023) + 1) * ((ebx & 4095) + 1) * ((ptrdiff_t)ecx + 1);
        }
    }
    return 0;
}
#endif

int vlm_quant_streams(void) {
    static _Atomic int cached = 0;
    int streams = atomic_load_explicit(&cached, memory_order_relaxed);
    if (streams > 0) return streams;
    streams = VLM_QUANT_MAX_STREAMS;
#if defined(__x86_64__)
    // One stream per core on AMD's Zen 5 (family 1Ah) and later, four elsewhere: measured, not derived. On a Zen 4
    // VM a Q8_0 152,000×896 matrix streamed at 18 GB/s with one stream a core and 23 with four (six or eight slower
    // again), and the Emerald Rapids guest ran the whole step with four at 87–98% of the read probe. On a Zen 5 VM a
    // decoding step of SmolLM2-135M's shapes (scripts/bench_decoder_step.py: 320 cached positions, two threads, the
    // builds alternating step by step) ran 1.19–1.23× faster with one stream than with four for Q4_1, 1.26–1.34× for
    // Q8_0 and 1.10× for Q5_0 (Q4_1 with two: 1.16×, three: 1.04×, six: 0.96×), its prefetch distance still best at
    // 8 KiB. Why Zen 5 wants the fewest was not found; Zen 4's count was chosen the same way.
    unsigned eax, ebx, ecx, edx;
    if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) && ebx == 0x68747541u && __get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
        const unsigned family = ((eax >> 8) & 15) + (((eax >> 8) & 15) == 15 ? (eax >> 20) & 255 : 0);
        if (family >= 0x1A) streams = 1;
    }
#endif
    atomic_store_explicit(&cached, streams, memory_order_relaxed);
    return streams;
}

/// One core's L2 as the CPU reports it, read once; 1 MiB where it does not say.
static ptrdiff_t l2_cache_bytes(void) {
    static _Atomic ptrdiff_t cached = 0;
    ptrdiff_t bytes = atomic_load_explicit(&cached, memory_order_relaxed);
    if (bytes > 0) return bytes;
#if defined(__x86_64__)
    bytes = cache_bytes_from_leaf(4, 2);
    if (bytes <= 0) bytes = cache_bytes_from_leaf(0x8000001Du, 2);
#endif
    // Fewer than 64 KiB would be a misreport (a hypervisor's zeros, say): no CPU with AVX-512 has that little.
    if (bytes < 64 * 1024) bytes = 1024 * 1024;
    atomic_store_explicit(&cached, bytes, memory_order_relaxed);
    return bytes;
}

/// Key-tile sizes from the L2 size: a quarter of it for one key tile's kᵀ and v (`key_bytes` each per feature), an
/// eighth for the query block's fp32 output sums, the rest for the queries, the scores and whatever else the core
/// touches.
static void attention_tiles(ptrdiff_t head_dim, ptrdiff_t key_bytes, ptrdiff_t *query_block, ptrdiff_t *key_tile) {
    const ptrdiff_t l2 = l2_cache_bytes(), row_bytes = head_dim * (ptrdiff_t)sizeof(float);
    if (*key_tile <= 0) *key_tile = l2 / 4 / (2 * head_dim * key_bytes);
    if (*query_block <= 0) *query_block = l2 / 8 / row_bytes;
}

/// `*buffer` grown to at least `bytes` (64-byte aligned), or NULL when it cannot be.
static void *grown_scratch(void **buffer, size_t *capacity, size_t bytes) {
    if (bytes > *capacity) {
        const size_t rounded = (bytes + 63) / 64 * 64;
        void *grown = aligned_alloc(64, rounded);
        if (!grown) return NULL;
        free(*buffer);
        *buffer = grown;
        *capacity = rounded;
    }
    return *buffer;
}

void vlm_floats_to_halves(const float *x, ptrdiff_t count, uint16_t *y, vlm_kernel_isa isa) {
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) {
        vlm_floats_to_halves_avx512(x, count, y);
        return;
    }
    if (isa == VLM_ISA_AVX2 && vlm_has_avx2()) {
        vlm_floats_to_halves_avx2(x, count, y);
        return;
    }
#endif
    (void)isa;
    vlm_floats_to_halves_scalar(x, count, y);
}

void vlm_halves_to_floats(const uint16_t *x, ptrdiff_t count, float *y, vlm_kernel_isa isa) {
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) {
        vlm_halves_to_floats_avx512(x, count, y);
        return;
    }
    if (isa == VLM_ISA_AVX2 && vlm_has_avx2()) {
        vlm_halves_to_floats_avx2(x, count, y);
        return;
    }
#endif
    (void)isa;
    for (ptrdiff_t i = 0; i < count; i++) y[i] = vlm_half_to_float(x[i]);
}

/// `problem` with its half keys and values (positions `first ..< first + count` of every head) widened into floats
/// of a buffer of the calling thread, head by head side by side in each position, for the kernels that read floats
/// only; the widened problem's keys start at position `first`. NULL when the buffer cannot be allocated.
static const vlm_attention_problem *widened_problem(const vlm_attention_problem *p, ptrdiff_t first, ptrdiff_t count,
                                                    vlm_attention_problem *widened, vlm_kernel_isa isa) {
    static _Thread_local void *buffer;
    static _Thread_local size_t capacity;
    const ptrdiff_t row = p->head_count * p->head_dim;
    float *floats = grown_scratch(&buffer, &capacity, 2 * (size_t)(count * row) * sizeof(float));
    if (!floats) return NULL;
    for (ptrdiff_t t = 0; t < count; t++)
        for (ptrdiff_t h = 0; h < p->head_count; h++) {
            vlm_halves_to_floats(p->half_key + (first + t) * p->key_stride + h * p->head_dim, p->head_dim,
                                 floats + t * row + h * p->head_dim, isa);
            vlm_halves_to_floats(p->half_value + (first + t) * p->value_stride + h * p->head_dim, p->head_dim,
                                 floats + (count + t) * row + h * p->head_dim, isa);
        }
    *widened = *p;
    widened->key = floats;
    widened->value = floats + count * row;
    widened->key_stride = widened->value_stride = row;
    widened->half_key = widened->half_value = NULL;
    return widened;
}

/// Whether the key tiles beat whole rows: once one head's keys and values outgrow L2, every register block of whole
/// rows streams them from L3. Below that the online softmax's extra work costs more than it saves (one thread on a
/// Zen 4 with 1 MiB of L2, head_dim 64: key tiles 3-10% slower at 800-1500 tokens, even at 2048, 17% faster at
/// 2400, 20-25% at 3601).
static int prefers_key_tiles(const vlm_attention_problem *p) {
    return p->query_length > 4 && 2 * p->key_length * p->head_dim * (ptrdiff_t)sizeof(float) > l2_cache_bytes();
}

int vlm_attention_scheduled(const vlm_attention_problem *problem, vlm_attention_schedule schedule,
                            ptrdiff_t query_block, ptrdiff_t key_tile, vlm_kernel_isa isa) {
    if (problem->query_length <= 0 || problem->head_dim <= 0 || problem->head_count <= 0) return 0;
    vlm_attention_problem widened;
    if (problem->half_key) {
        // A prompt's attention does head_dim multiply-adds per key and query row; widening first costs one pass.
        if (!widened_problem(problem, 0, problem->key_length, &widened, isa)) return -1;
        problem = &widened;
    }
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) {
        // In bf16 a head's keys and values take half the bytes, and every length runs on key tiles: a short
        // sequence is one tile, whose online softmax then costs what the whole-row one does.
        if (problem->bf16_products && problem->query_length > 4 && problem->head_dim % 2 == 0 &&
            vlm_has_avx512_bf16()) {
            attention_tiles(problem->head_dim, 2, &query_block, &key_tile);
            return vlm_attention_tiled_bf16_avx512(problem, query_block, key_tile);
        }
        if (schedule == VLM_ATTENTION_AUTOMATIC)
            schedule = prefers_key_tiles(problem) ? VLM_ATTENTION_KEY_TILES : VLM_ATTENTION_WHOLE_ROWS;
        if (schedule == VLM_ATTENTION_WHOLE_ROWS) return vlm_attention_avx512(problem);
        attention_tiles(problem->head_dim, sizeof(float), &query_block, &key_tile);
        return vlm_attention_tiled_avx512(problem, query_block, key_tile);
    }
#endif
    (void)schedule, (void)query_block, (void)key_tile, (void)isa;
    return vlm_attention_scalar(problem);
}

int vlm_attention(const vlm_attention_problem *problem, vlm_kernel_isa isa) {
    return vlm_attention_scheduled(problem, VLM_ATTENTION_AUTOMATIC, 0, 0, isa);
}

void *vlm_attention_partial_scratch(size_t bytes) {
    static _Thread_local void *buffer;
    static _Thread_local size_t capacity;
    return grown_scratch(&buffer, &capacity, bytes);
}

int vlm_attention_partial(const vlm_attention_problem *problem, ptrdiff_t first_key, ptrdiff_t key_count, float *maxima,
                          float *sums, float *outputs, vlm_kernel_isa isa) {
    if (problem->query_length <= 0 || problem->head_dim <= 0 || key_count <= 0) return 0;
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512)
        return vlm_attention_partial_avx512(problem, first_key, key_count, maxima, sums, outputs);
    if (isa == VLM_ISA_AVX2 && vlm_has_avx2())
        return vlm_attention_partial_avx2(problem, first_key, key_count, maxima, sums, outputs);
#endif
    vlm_attention_problem widened;
    if (problem->half_key) {
        if (!widened_problem(problem, first_key, key_count, &widened, isa)) return -1;
        problem = &widened;
        first_key = 0;
    }
    (void)isa;
    return vlm_attention_partial_scalar(problem, first_key, key_count, maxima, sums, outputs);
}

ptrdiff_t vlm_argmax(const float *x, ptrdiff_t count, vlm_kernel_isa isa) {
    if (count <= 1) return 0;
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) return vlm_argmax_avx512(x, count);
    if (isa == VLM_ISA_AVX2 && vlm_has_avx2()) return vlm_argmax_avx2(x, count);
#endif
    (void)isa;
    return vlm_argmax_scalar(x, count);
}

void vlm_gated_silu(const float *x, ptrdiff_t rows, ptrdiff_t width, float *y, vlm_kernel_isa isa) {
    if (rows <= 0 || width <= 0) return;
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) {
        vlm_gated_silu_avx512(x, rows, width, y);
        return;
    }
    if (isa == VLM_ISA_AVX2 && vlm_has_avx2()) {
        vlm_gated_silu_avx2(x, rows, width, y);
        return;
    }
#endif
    (void)isa;
    vlm_gated_silu_scalar(x, rows, width, y);
}

void vlm_quantize_rows_int8(const float *x, ptrdiff_t rows, ptrdiff_t features, signed char *q, float *scales,
                            vlm_kernel_isa isa) {
    if (rows <= 0 || features <= 0) return;
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) {
        vlm_quantize_rows_int8_avx512(x, rows, features, q, scales);
        return;
    }
#endif
    (void)isa;
    vlm_quantize_rows_int8_scalar(x, rows, features, q, scales);
}

void vlm_layer_norm(const float *x, float *y, ptrdiff_t rows, ptrdiff_t features, const float *weight,
                    const float *bias, float eps, vlm_kernel_isa isa) {
    if (rows <= 0 || features <= 0) return;
#if defined(__x86_64__)
    if (isa == VLM_ISA_AVX512 && vlm_best_isa() == VLM_ISA_AVX512) {
        vlm_layer_norm_avx512(x, y, rows, features, weight, bias, eps);
        return;
    }
#endif
    (void)isa;
    vlm_layer_norm_scalar(x, y, rows, features, weight, bias, eps);
}

int vlm_panel_matvec(const float *w, ptrdiff_t k, ptrdiff_t n, ptrdiff_t panel_stride, const float *x, const float *bias,
                     float *y, ptrdiff_t first_panel, ptrdiff_t panel_count) {
#if defined(__x86_64__)
    if (vlm_best_isa() == VLM_ISA_AVX512) {
        vlm_panel_matvec_avx512(w, k, n, panel_stride, x, bias, y, first_panel, panel_count);
        return 0;
    }
#endif
    (void)w, (void)k, (void)n, (void)panel_stride, (void)x, (void)bias, (void)y, (void)first_panel, (void)panel_count;
    return -1;
}

int vlm_int8_matvec(const int8_t *w, ptrdiff_t k, ptrdiff_t n, const int8_t *x, const int32_t *column_sums,
                    const float *weight_scales, float row_scale, const float *bias, float *y, ptrdiff_t first_panel,
                    ptrdiff_t panel_count) {
#if defined(__x86_64__)
    if (vlm_best_isa() == VLM_ISA_AVX512 && __builtin_cpu_supports("avx512vnni") && k <= VLM_INT8_MATVEC_MAX_K) {
        vlm_int8_matvec_avx512(w, k, n, x, column_sums, weight_scales, row_scale, bias, y, first_panel, panel_count);
        return 0;
    }
#endif
    (void)w, (void)k, (void)n, (void)x, (void)column_sums, (void)weight_scales, (void)row_scale, (void)bias, (void)y;
    (void)first_panel, (void)panel_count;
    return -1;
}

void vlm_int8_column_sums(const int8_t *w, ptrdiff_t k, ptrdiff_t n, int32_t *sums) {
    for (ptrdiff_t c = 0; c < n; c++) sums[c] = 0;
    for (ptrdiff_t r = 0; r < k; r++) {
        for (ptrdiff_t c = 0; c < n; c++) sums[c] += w[r * n + c];
    }
}

int vlm_panel_matvec_bf16(const uint16_t *w, ptrdiff_t k, ptrdiff_t n, ptrdiff_t panel_stride, const uint16_t *x,
                          const float *bias, float *y, ptrdiff_t first_panel, ptrdiff_t panel_count) {
#if defined(__x86_64__)
    if (vlm_has_avx512_bf16()) {
        vlm_panel_matvec_bf16_avx512(w, k, n, panel_stride, x, bias, y, first_panel, panel_count);
        return 0;
    }
#endif
    (void)w, (void)k, (void)n, (void)panel_stride, (void)x, (void)bias, (void)y, (void)first_panel, (void)panel_count;
    return -1;
}
