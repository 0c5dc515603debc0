// RTLD_DEFAULT is a GNU extension in older glibc headers.
#define _GNU_SOURCE

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>

#include "vlm_kernels.h"

// oneDNN runs its primitives on GNU OpenMP, whose idle workers spin for a while after each primitive waiting for
// the next one. Threads of any other pool then fight them for the cores (on two cores, attention on Dispatch
// threads ran ten times slower). Handing our work to the same OpenMP workers avoids that, and their spinning
// makes the hand-over nearly free. The runtime is looked up rather than linked so that builds whose oneDNN uses
// another threading runtime still link.

typedef void (*gomp_parallel_function)(void (*function)(void *), void *data, unsigned threads, unsigned flags);
typedef int (*omp_count_function)(void);
typedef void (*gomp_barrier_function)(void);
typedef int (*omp_pause_function)(int kind);

static gomp_parallel_function gomp_parallel;
static omp_count_function omp_max_threads, omp_thread_number, omp_team_size;
static gomp_barrier_function gomp_barrier;
static omp_pause_function omp_pause_all;
static pthread_once_t lookup_once = PTHREAD_ONCE_INIT;

static void look_up_runtime(void) {
    gomp_parallel = (gomp_parallel_function)dlsym(RTLD_DEFAULT, "GOMP_parallel");
    omp_max_threads = (omp_count_function)dlsym(RTLD_DEFAULT, "omp_get_max_threads");
    omp_thread_number = (omp_count_function)dlsym(RTLD_DEFAULT, "omp_get_thread_num");
    omp_team_size = (omp_count_function)dlsym(RTLD_DEFAULT, "omp_get_num_threads");
    gomp_barrier = (gomp_barrier_function)dlsym(RTLD_DEFAULT, "GOMP_barrier");
    omp_pause_all = (omp_pause_function)dlsym(RTLD_DEFAULT, "omp_pause_resource_all");
    if (!omp_max_threads || !omp_thread_number || !omp_team_size || !gomp_barrier) gomp_parallel = NULL;
}

typedef struct job {
    atomic_ptrdiff_t next;
    ptrdiff_t count;
    vlm_parallel_body body;
    void *context;
} job;

static void run_job(void *data) {
    job *work = data;
    for (;;) {
        ptrdiff_t index = atomic_fetch_add_explicit(&work->next, 1, memory_order_relaxed);
        if (index >= work->count) return;
        work->body(work->context, index);
    }
}

int vlm_parallel_for(ptrdiff_t count, vlm_parallel_body body, void *context) {
    pthread_once(&lookup_once, look_up_runtime);
    if (!gomp_parallel) return -1;
    job work = {.count = count, .body = body, .context = context};
    atomic_init(&work.next, 0);
    // 0 threads: the runtime's default team, the one oneDNN's primitives use.
    gomp_parallel(run_job, &work, 0, 0);
    return 0;
}

typedef struct range_job {
    atomic_ptrdiff_t next;
    ptrdiff_t count, grain, divisor;
    vlm_parallel_range_body body;
    void *context;
} range_job;

// Guided self-scheduling: each claim takes a share of what is left, so the first ranges are long (a kernel that
// streams its operands keeps its prefetching going) and the last are short (no thread waits long for another
// that drew the last big piece, or that the machine slowed down).
static void run_range_job(void *data) {
    range_job *work = data;
    ptrdiff_t start = atomic_load_explicit(&work->next, memory_order_relaxed);
    for (;;) {
        const ptrdiff_t left = work->count - start;
        if (left <= 0) return;
        ptrdiff_t size = (left + work->divisor - 1) / work->divisor;
        if (size < work->grain) size = work->grain;
        if (size > left) size = left;
        if (atomic_compare_exchange_weak_explicit(&work->next, &start, start + size, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            work->body(work->context, start, start + size);
            start = atomic_load_explicit(&work->next, memory_order_relaxed);
        }
    }
}

int vlm_parallel_ranges(ptrdiff_t count, ptrdiff_t grain, vlm_parallel_range_body body, void *context) {
    pthread_once(&lookup_once, look_up_runtime);
    if (!gomp_parallel) return -1;
    const int threads = omp_max_threads();
    range_job work = {.count = count, .grain = grain > 0 ? grain : 1, .divisor = 2 * (threads > 0 ? threads : 1),
                      .body = body, .context = context};
    atomic_init(&work.next, 0);
    gomp_parallel(run_range_job, &work, 0, 0);
    return 0;
}

typedef struct team_job {
    vlm_parallel_team_body body;
    void *context;
} team_job;

static void run_team_job(void *data) {
    team_job *work = data;
    work->body(work->context, omp_thread_number(), omp_team_size());
}

int vlm_parallel_team_available(void) {
    pthread_once(&lookup_once, look_up_runtime);
    return gomp_parallel != NULL;
}

int vlm_parallel_team(vlm_parallel_team_body body, void *context) {
    pthread_once(&lookup_once, look_up_runtime);
    if (!gomp_parallel) return -1;
    team_job work = {.body = body, .context = context};
    gomp_parallel(run_team_job, &work, 0, 0);
    return 0;
}

void vlm_parallel_barrier(void) { gomp_barrier(); }

int vlm_parallel_release_workers(void) {
    pthread_once(&lookup_once, look_up_runtime);
    // omp_pause_soft (OpenMP 5.0's omp.h: 1): libgomp ends the calling thread's pool and joins its workers.
    if (!gomp_parallel || !omp_pause_all) return -1;
    return omp_pause_all(1) == 0 ? 0 : -1;
}
