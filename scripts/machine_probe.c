// The limits of the machine a benchmark runs on: the fp32 FMA peak and the read bandwidth of `threads` threads.
// Built and run by scripts/machine.py (cc -O3 -march=native -fopenmp), which adds what the OS reports (CPU model,
// ISA, caches). Prints one JSON object.
//
//   machine_probe THREADS MB [MB ...]    FMA peak on THREADS threads, then the read bandwidth of each buffer size

#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// 20 independent multiply-add chains per thread: enough to cover the FMA latency on every x86 core of today
// (4 cycles × 2 units, or 4 × 4 on 256-bit units running 512-bit instructions in halves).
#define CHAINS 20

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define VSET1 _mm512_set1_ps
#define VFMA _mm512_fmadd_ps
#define VADD _mm512_add_ps
#define VSUM _mm512_reduce_add_ps
#define VLOAD _mm512_load_ps
#elif defined(__FMA__)
typedef __m256 vec;
#define LANES 8
#define VSET1 _mm256_set1_ps
#define VFMA _mm256_fmadd_ps
#define VADD _mm256_add_ps
#define VLOAD _mm256_load_ps
static float VSUM(__m256 v) {
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    float sum = 0;
    for (int i = 0; i < 8; i++) sum += lanes[i];
    return sum;
}
#endif

#ifdef LANES
// Twenty named accumulators rather than an array: compilers keep these in registers.
#define CHAIN_LIST(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) \
                      X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19)
static float fma_chains(long iterations, float seed) {
#define DECLARE(c) vec acc##c = VSET1(seed + c);
    CHAIN_LIST(DECLARE)
    const vec a = VSET1(0.999999f), b = VSET1(1e-7f);
    for (long i = 0; i < iterations; i++) {
#define STEP(c) acc##c = VFMA(acc##c, a, b);
        CHAIN_LIST(STEP)
        __asm__ volatile("" ::: "memory");
    }
    vec total = VSET1(0);
#define GATHER(c) total = VADD(total, acc##c);
    CHAIN_LIST(GATHER)
    return VSUM(total);
}
#endif

// GFLOP/s of all threads multiplying and adding at once; best of 5 timings.
static double fma_peak(int threads) {
#ifdef LANES
    const long iterations = 20000000;
    double best = 0;
    volatile float sink = 0;
    for (int attempt = 0; attempt < 5; attempt++) {
        double start = now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        sink += fma_chains(iterations, (float)omp_get_thread_num());
        double seconds = now() - start;
        double flops = 2.0 * LANES * CHAINS * (double)iterations * threads;
        if (flops / seconds > best) best = flops / seconds;
    }
    return best / 1e9;
#else
    (void)threads;
    return 0;
#endif
}

// The sum of `count` floats, with 8 vectors in flight so that the loads, not the additions, set the pace.
static float sum(const float *values, size_t count) {
#ifdef LANES
    vec acc[8];
    for (int a = 0; a < 8; a++) acc[a] = VSET1(0);
    size_t i = 0;
    for (; i + 8 * LANES <= count; i += 8 * LANES) {
        for (int a = 0; a < 8; a++) acc[a] = VADD(acc[a], VLOAD(values + i + a * LANES));
    }
    for (int a = 1; a < 8; a++) acc[0] = VADD(acc[0], acc[a]);
    float total = VSUM(acc[0]);
#else
    float total = 0;
    size_t i = 0;
#endif
    for (; i < count; i++) total += values[i];
    return total;
}

// GB/s of `threads` threads summing disjoint parts of one buffer of `bytes`; best of 7 passes after a first one
// that faults the pages in. The buffer lies as SwiftVLM's weights do (WeightMemory.swift): on a huge-page boundary,
// offered to transparent huge pages. With 4 KiB pages a Zen 4 VM read 1 GB at 19–22 GB/s where huge pages gave 25–30.
static double read_bandwidth(int threads, size_t bytes) {
    size_t count = bytes / sizeof(float);
    const size_t huge_page = 2u << 20;
    float *buffer = aligned_alloc(huge_page, (count * sizeof(float) + huge_page - 1) / huge_page * huge_page);
    if (!buffer) return 0;
#ifdef MADV_HUGEPAGE
    madvise(buffer, count * sizeof(float) / huge_page * huge_page, MADV_HUGEPAGE);
#endif
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < count; i++) buffer[i] = (float)(i & 7);
    double best = 0;
    volatile float sink = 0;
    for (int pass = 0; pass < 8; pass++) {
        double start = now();
        float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            size_t share = count / omp_get_num_threads();
            total += sum(buffer + share * omp_get_thread_num(), share);
        }
        double seconds = now() - start;
        sink += total;
        if (pass > 0 && bytes / seconds > best) best = bytes / seconds;
    }
    free(buffer);
    return best / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s THREADS MB [MB ...]\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    printf("{\"threads\": %d, \"fma_peak_gflops\": %.1f, \"read_gb_per_s\": {", threads, fma_peak(threads));
    for (int i = 2; i < argc; i++) {
        long megabytes = atol(argv[i]);
        printf("%s\"%ld\": %.1f", i > 2 ? ", " : "", megabytes, read_bandwidth(threads, (size_t)megabytes << 20));
    }
    printf("}}\n");
    return 0;
}
