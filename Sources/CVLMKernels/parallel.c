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

static gomp_parallel_function gomp_parallel;
static pthread_once_t lookup_once = PTHREAD_ONCE_INIT;

static void look_up_runtime(void) {
    gomp_parallel = (gomp_parallel_function)dlsym(RTLD_DEFAULT, "GOMP_parallel");
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
