// Decoding steps of a SmolLM2-135M-shaped model (random weights of one GGUF block format) through the fused step of
// one or two builds of Sources/CVLMKernels, loaded side by side as shared libraries. With two, the steps alternate
// between the builds (A, B, A, B, ...): a shared machine's memory speed drifts by tens of percent within minutes,
// and steps interleaved a few milliseconds apart see the same machine, where separate runs do not. Each build packs
// its own copy of the same weights (its own layout), the KV cache is shared, and every step attends to the same
// `position + 1` cached positions and writes the same new one, so both builds compute the same logits unless their
// arithmetic differs (reported). Built and run by scripts/bench_decoder_step.py.
//
// Usage: decoder_step_bench [--int8] [--capacity N] FORMAT POSITION STEPS LIBRARY[@STREAMS][+f16]
//        [LIBRARY[@STREAMS][+f16]]
// (--int8: the step's int8 products; --capacity: the cache's room, each key head's positions that many rows apart as
// in a `vlm` cache made for a prompt and its new tokens, POSITION + 1 by default; @STREAMS: the step's `streams`, 1 or 4, where the CPU's choice is not wanted;
// +f16: the build reads a copy of the cache rounded to halves (its `half_keys`); one library may be named twice,
// with two counts or with and without +f16.)
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "vlm_kernels.h"

enum { HIDDEN = 576, INTERMEDIATE = 1536, LAYERS = 30, HEADS = 9, KEY_HEADS = 3, HEAD_DIM = 64, VOCABULARY = 49152 };

typedef struct kernels {
    const char *path;
    int (*block_layout)(int, ptrdiff_t *, ptrdiff_t *);
    ptrdiff_t (*packed_size)(vlm_quant_format, ptrdiff_t, ptrdiff_t);
    void (*pack)(const vlm_quant_matrix *, void *);
    ptrdiff_t (*scratch_floats)(const vlm_decoder_step *);
    int (*run)(const vlm_decoder_step *, vlm_kernel_isa);
    vlm_decoder_layer layers[LAYERS];
    vlm_decoder_step step;
    double seconds;
    int streams;
    int half_cache;
} kernels;

static void *symbol(void *library, const char *path, const char *name) {
    void *found = dlsym(library, name);
    if (!found) {
        fprintf(stderr, "%s: no symbol %s\n", path, name);
        exit(1);
    }
    return found;
}

static uint64_t random_state = 0x5eed;
static uint32_t random_bits(void) {
    random_state = random_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(random_state >> 33);
}

/// One matrix's GGUF blocks: random values, and every block's fp16 scale (and minimum) small, so that the hidden
/// state stays finite through the layers.
static uint8_t *random_blocks(vlm_quant_format format, ptrdiff_t block_bytes, ptrdiff_t blocks) {
    uint8_t *data = malloc((size_t)(block_bytes * blocks));
    if (!data) exit(1);
    for (ptrdiff_t i = 0; i < block_bytes * blocks; i++) data[i] = (uint8_t)random_bits();
    for (ptrdiff_t b = 0; b < blocks; b++) {
        const uint16_t scale = (uint16_t)(0x1c00 + random_bits() % 0x400), minimum = (uint16_t)(0x9c00 + random_bits() % 0x400);
        memcpy(data + b * block_bytes, &scale, 2);
        if (format == VLM_QUANT_Q4_1 || format == VLM_QUANT_Q5_1) memcpy(data + b * block_bytes + 2, &minimum, 2);
    }
    return data;
}

/// Memory for the packed weights, laid out as SwiftVLM's WeightMemory.swift lays a small model's: one after another
/// on transparent huge pages.
static char *arena_take(char **arena, size_t *left, size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    if (bytes > *left) {
        fprintf(stderr, "weight arena exhausted\n");
        exit(1);
    }
    char *taken = *arena;
    *arena += bytes;
    *left -= bytes;
    return taken;
}

/// decodingAttentionParts (GroupedQueryAttention.swift): parts of at least 64 keys, about two per thread, the threads
/// OpenMP's team has (OMP_NUM_THREADS, else one per online CPU as its default).
static ptrdiff_t attention_parts(ptrdiff_t key_length) {
    const char *threads_text = getenv("OMP_NUM_THREADS");
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    const ptrdiff_t threads = threads_text && atoi(threads_text) > 0 ? atoi(threads_text) : online > 0 ? online : 1;
    const ptrdiff_t by_length = key_length / 64, by_threads = (2 * threads + KEY_HEADS - 1) / KEY_HEADS;
    const ptrdiff_t parts = by_length < by_threads ? by_length : by_threads;
    return parts > 1 ? parts : 1;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int int8 = argc > 1 && strcmp(argv[1], "--int8") == 0;
    if (int8) argv++, argc--;
    ptrdiff_t room = 0;
    if (argc > 2 && strcmp(argv[1], "--capacity") == 0) {
        room = atol(argv[2]);
        argv += 2, argc -= 2;
    }
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: %s [--int8] [--capacity N] FORMAT POSITION STEPS LIBRARY[@STREAMS] [LIBRARY[@STREAMS]]\n",
                argv[0]);
        return 2;
    }
    const vlm_quant_format format = (vlm_quant_format)atoi(argv[1]);
    const ptrdiff_t position = atol(argv[2]), capacity = room > 0 ? room : position + 1;
    const int steps = atoi(argv[3]), count = argc - 4;
    if (position < 0 || steps < 2 || capacity <= position) {
        fprintf(stderr, "POSITION must be at least 0 and below the capacity, and STEPS at least 2\n");
        return 2;
    }
    kernels builds[2] = {{0}};
    void (*floats_to_halves)(const float *, ptrdiff_t, uint16_t *, vlm_kernel_isa) = NULL;
    for (int i = 0; i < count; i++) {
        kernels *k = &builds[i];
        k->path = argv[4 + i];
        char file[4096];
        snprintf(file, sizeof file, "%s", k->path);
        const size_t length = strlen(file);
        if (length > 4 && strcmp(file + length - 4, "+f16") == 0) {
            k->half_cache = 1;
            file[length - 4] = 0;
        }
        char *at = strrchr(file, '@');
        if (at && at[1] && strspn(at + 1, "0123456789") == strlen(at + 1)) {
            k->streams = atoi(at + 1);
            *at = 0;
        }
        void *library = dlopen(file, RTLD_NOW | RTLD_LOCAL);
        if (!library) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        k->block_layout = symbol(library, k->path, "vlm_quant_block_layout");
        k->packed_size = symbol(library, k->path, "vlm_quant_packed_size");
        k->pack = symbol(library, k->path, "vlm_quant_pack");
        k->scratch_floats = symbol(library, k->path, "vlm_decoder_step_scratch_floats");
        k->run = symbol(library, k->path, "vlm_decoder_step_run");
        // The half cache is rounded by the first build that reads one (only those builds have the rounding).
        if (k->half_cache && !floats_to_halves)
            floats_to_halves = symbol(library, k->path, "vlm_floats_to_halves");
    }
    ptrdiff_t block_elements, block_bytes;
    if (builds[0].block_layout(format, &block_elements, &block_bytes) != 0 || block_elements != 32) {
        fprintf(stderr, "format %d: not a 32-element block format (SmolLM2's 576 columns take no K-quant blocks)\n",
                format);
        return 2;
    }

    // Each matrix's rows and columns, in the order a step reads them: per layer q|k|v, o, gate|up, down; the head.
    const ptrdiff_t shapes[5][2] = {{(HEADS + 2 * KEY_HEADS) * HEAD_DIM, HIDDEN}, {HIDDEN, HEADS * HEAD_DIM},
                                    {2 * INTERMEDIATE, HIDDEN}, {HIDDEN, INTERMEDIATE}, {VOCABULARY, HIDDEN}};
    size_t weight_bytes = 0, packed_bytes = 0;
    for (int m = 0; m < 5; m++) {
        const ptrdiff_t rows = shapes[m][0], columns = shapes[m][1], times = m == 4 ? 1 : LAYERS;
        weight_bytes += (size_t)(times * rows * columns / 32 * block_bytes);
        for (int i = 0; i < count; i++)
            packed_bytes += (size_t)times * ((size_t)builds[i].packed_size(format, rows, columns) + 63) / 64 * 64;
    }
    const size_t huge_page = 2u << 20, arena_bytes = (packed_bytes + huge_page - 1) / huge_page * huge_page;
    char *arena = aligned_alloc(huge_page, arena_bytes);
    if (!arena) return 1;
    madvise(arena, arena_bytes, MADV_HUGEPAGE);
    size_t left = arena_bytes;

    float *norm = malloc(INTERMEDIATE * sizeof(float));
    for (int i = 0; i < INTERMEDIATE; i++) norm[i] = 1;
    float *keys[LAYERS], *values[LAYERS];
    const size_t cache_floats = (size_t)KEY_HEADS * (size_t)capacity * HEAD_DIM;
    for (int l = 0; l < LAYERS; l++) {
        keys[l] = malloc(cache_floats * sizeof(float));
        values[l] = malloc(cache_floats * sizeof(float));
        if (!keys[l] || !values[l]) return 1;
        for (size_t i = 0; i < cache_floats; i++) {
            keys[l][i] = (float)(random_bits() % 1000) * 1e-3f - 0.5f;
            values[l][i] = (float)(random_bits() % 1000) * 1e-3f - 0.5f;
        }
    }
    uint16_t *half_keys[LAYERS], *half_values[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        half_keys[l] = malloc(cache_floats * sizeof(uint16_t));
        half_values[l] = malloc(cache_floats * sizeof(uint16_t));
        if (!half_keys[l] || !half_values[l]) return 1;
        if (floats_to_halves) {
            floats_to_halves(keys[l], (ptrdiff_t)cache_floats, half_keys[l], VLM_ISA_SCALAR);
            floats_to_halves(values[l], (ptrdiff_t)cache_floats, half_values[l], VLM_ISA_SCALAR);
        }
    }
    // Each build's weights one after another, as one model's lie, from the same random blocks.
    const uint64_t weights_seed = random_state;
    for (int i = 0; i < count; i++) {
        random_state = weights_seed;
        for (int l = 0; l <= LAYERS; l++) {
            for (int m = l == LAYERS ? 4 : 0; m < (l == LAYERS ? 5 : 4); m++) {
                const ptrdiff_t rows = shapes[m][0], columns = shapes[m][1];
                uint8_t *raw = random_blocks(format, block_bytes, rows * columns / 32);
                const vlm_quant_matrix matrix = {.data = raw, .format = format, .rows = rows, .columns = columns,
                                                 .row_bytes = columns / 32 * block_bytes};
                void *packed = arena_take(&arena, &left, (size_t)builds[i].packed_size(format, rows, columns));
                builds[i].pack(&matrix, packed);
                free(raw);
                const vlm_decoder_product product = {packed, format, rows, columns, NULL, 0};
                vlm_decoder_layer *layer = &builds[i].layers[l < LAYERS ? l : 0];
                switch (m) {
                case 0: layer->attention[0] = product, layer->attention_products = 1; break;
                case 1: layer->output = product; break;
                case 2: layer->gate_up[0] = product, layer->gate_up_products = 1; break;
                case 3: layer->down = product; break;
                default: builds[i].step.head = product; break;
                }
            }
        }
    }

    float cos_values[HEAD_DIM / 2], sin_values[HEAD_DIM / 2], embedding[HIDDEN];
    for (int i = 0; i < HEAD_DIM / 2; i++) {
        const double angle = (double)position * pow(10000.0, -2.0 * i / HEAD_DIM);
        cos_values[i] = (float)cos(angle);
        sin_values[i] = (float)sin(angle);
    }
    for (int i = 0; i < HIDDEN; i++) embedding[i] = (float)(random_bits() % 1000) * 1e-3f - 0.5f;
    for (int i = 0; i < count; i++) {
        vlm_decoder_step *s = &builds[i].step;
        for (int l = 0; l < LAYERS; l++) builds[i].layers[l].input_norm = builds[i].layers[l].post_attention_norm = norm;
        s->layers = builds[i].layers;
        s->layer_count = LAYERS;
        s->hidden_size = HIDDEN, s->heads = HEADS, s->key_heads = KEY_HEADS, s->head_dim = HEAD_DIM;
        s->intermediate_size = INTERMEDIATE;
        s->eps = 1e-5f, s->scale = 1 / sqrtf(HEAD_DIM);
        s->final_norm = norm;
        s->keys = keys, s->values = values, s->capacity = capacity, s->position = position;
        s->parts = attention_parts(position + 1);
        s->int8 = int8;
        s->streams = builds[i].streams;
        if (builds[i].half_cache) s->half_keys = half_keys, s->half_values = half_values;
        s->cos = cos_values, s->sin = sin_values;
        s->hidden = malloc(HIDDEN * sizeof(float));
        s->scratch = malloc((size_t)builds[i].scratch_floats(s) * sizeof(float));
        s->logits = malloc(VOCABULARY * sizeof(float));
    }

    // Ten warm-up steps each, then the builds in turn.
    for (int t = 0; t < 10 * count + steps * count; t++) {
        kernels *k = &builds[t % count];
        memcpy(k->step.hidden, embedding, sizeof embedding);
        const double start = now();
        if (k->run(&k->step, VLM_ISA_AVX512) != 0) {
            fprintf(stderr, "%s: the step failed\n", k->path);
            return 1;
        }
        if (t >= 10 * count) k->seconds += now() - start;
    }
    float largest_difference = 0;
    for (int v = 0; count == 2 && v < VOCABULARY; v++) {
        const float difference = fabsf(builds[0].step.logits[v] - builds[1].step.logits[v]);
        largest_difference = difference > largest_difference || isnan(difference) ? difference : largest_difference;
    }
    printf("{\"weight_bytes\": %zu, \"position\": %td, \"steps\": %d, \"builds\": [", weight_bytes, position, steps);
    for (int i = 0; i < count; i++) {
        const double seconds = builds[i].seconds / steps;
        printf("%s{\"library\": \"%s\", \"ms_per_step\": %.4f, \"weights_gb_per_s\": %.2f, \"first_logit\": %.6g}",
               i ? ", " : "", builds[i].path, seconds * 1e3, (double)weight_bytes / seconds / 1e9,
               builds[i].step.logits[0]);
    }
    printf("], \"largest_logit_difference\": %.6g}\n", largest_difference);
    return 0;
}
