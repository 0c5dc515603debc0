#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

// vlm_decoder_step (see vlm_kernels.h). A decoding step of a small model is a few hundred short stages; run as
// parallel regions of their own, with the norms, rotations and bookkeeping between them on one thread, an eighth of
// both cores' time went to waiting at the hand-overs (SmolLM2-135M Q8_0, perf). Here every thread runs every stage:
// the cheap work (a norm, the fixed-point activation row, the attention merge, the gated activation) each thread
// does itself on a private copy, each thread takes a fixed share of every product and a fixed run of attention
// parts, and a barrier ends each stage whose output the next one reads whole.
//
// The norms, rotations and attention merge below are the layer-by-layer path's too (DecoderOps.swift and
// GroupedQueryAttention.swift call them), and the products are the same kernels, so the two agree bit for bit;
// nothing here contracts multiplies and adds (Swift does not either).
#pragma STDC FP_CONTRACT OFF

typedef struct thread_scratch {
    float *normed, *query, *key, *attended, *gated;
    void *activation;
    size_t bytes;
} thread_scratch;

static _Thread_local thread_scratch scratch_of_thread;

typedef struct step_run {
    const vlm_decoder_step *step;
    vlm_kernel_isa isa;
    ptrdiff_t group;
    /// The streams each thread reads its share of a product as: the step's `streams`, else the CPU's choice.
    int streams;
    float *qkv, *gate_up, *product, *maxima, *sums, *partials;
    atomic_int failed;
} step_run;

static ptrdiff_t round_up(ptrdiff_t bytes) { return (bytes + 63) / 64 * 64; }

static ptrdiff_t widest_input(const vlm_decoder_step *s) {
    ptrdiff_t widest = s->hidden_size;
    if (s->heads * s->head_dim > widest) widest = s->heads * s->head_dim;
    if (s->intermediate_size > widest) widest = s->intermediate_size;
    return widest;
}

/// The positions a layer attends to, `first ..< first + length`, split into `parts` ranges.
typedef struct key_range {
    ptrdiff_t first, length, parts;
} key_range;

static key_range attended_keys(const vlm_decoder_step *s, const vlm_decoder_layer *layer) {
    const ptrdiff_t all = s->position + 1;
    if (!layer->windowed || s->window <= 0 || s->window_parts <= 0 || all <= s->window) return (key_range){0, all, s->parts};
    return (key_range){all - s->window, s->window, s->window_parts};
}

static ptrdiff_t most_parts(const vlm_decoder_step *s) {
    return s->window > 0 && s->window_parts > s->parts ? s->window_parts : s->parts;
}

ptrdiff_t vlm_decoder_step_scratch_floats(const vlm_decoder_step *s) {
    const ptrdiff_t group = s->heads / s->key_heads, slots = s->key_heads * most_parts(s) * group;
    return (s->heads + 2 * s->key_heads) * s->head_dim + 2 * s->intermediate_size + s->hidden_size + 2 * slots +
           slots * s->head_dim;
}

/// This thread's private buffers, grown to the step's sizes; 0, or -1 when they cannot be allocated.
static int prepare_thread_scratch(const vlm_decoder_step *s) {
    const ptrdiff_t width = s->heads * s->head_dim;
    const ptrdiff_t normed = round_up(s->hidden_size * 4), query = round_up(width * 4), key = round_up(s->head_dim * 4),
                    attended = query, gated = round_up(s->intermediate_size * 4),
                    activation = round_up(s->int8 ? vlm_quant_int8_activation_size(widest_input(s))
                                                  : vlm_quant_activation_size(widest_input(s)));
    const size_t bytes = (size_t)(normed + query + key + attended + gated + activation);
    thread_scratch *t = &scratch_of_thread;
    if (bytes > t->bytes) {
        char *grown = aligned_alloc(64, bytes);
        if (!grown) return -1;
        free(t->normed);
        t->bytes = bytes;
        t->normed = (float *)grown;
    }
    // Laid out for this step each time: another model's step (or the other activation format) may have left a
    // buffer large enough in all but different parts.
    char *base = (char *)t->normed;
    t->query = (float *)(base + normed);
    t->key = (float *)(base + normed + query);
    t->attended = (float *)(base + normed + query + key);
    t->gated = (float *)(base + normed + query + key + attended);
    t->activation = base + normed + query + key + attended + gated;
    return 0;
}

void vlm_rms_norm(const float *x, const float *weight, ptrdiff_t rows, ptrdiff_t features, float eps, float *y) {
#if defined(__x86_64__)
    if (vlm_best_isa() == VLM_ISA_AVX512) {
        vlm_rms_norm_avx512(x, weight, rows, features, eps, y);
        return;
    }
#endif
    vlm_rms_norm_scalar(x, weight, rows, features, eps, y);
}

void vlm_rms_norm_scalar(const float *x, const float *weight, ptrdiff_t rows, ptrdiff_t features, float eps, float *y) {
    for (ptrdiff_t row = 0; row < rows; row++, x += features, y += features) {
        // Eight running sums (vector lanes): one chain of dependent double additions made the two norms of each
        // layer 4% of a SmolLM2-135M decoding step (perf, a C harness of its steps on a Zen 4 VM).
        double partial[8] = {0};
        ptrdiff_t i = 0;
        for (; i + 8 <= features; i += 8)
            for (int k = 0; k < 8; k++) partial[k] += (double)x[i + k] * (double)x[i + k];
        double sum_of_squares = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                                ((partial[4] + partial[5]) + (partial[6] + partial[7]));
        for (; i < features; i++) sum_of_squares += (double)x[i] * (double)x[i];
        const float inverse = 1 / sqrtf((float)(sum_of_squares / (double)features) + eps);
        for (ptrdiff_t i = 0; i < features; i++) y[i] = weight[i] * (x[i] * inverse);
    }
}

void vlm_rotate_half(const float *x, ptrdiff_t tokens, ptrdiff_t heads, ptrdiff_t head_dim, const float *cos,
                     const float *sin, float *y) {
    const ptrdiff_t half = head_dim / 2;
    for (ptrdiff_t token = 0; token < tokens; token++, cos += half, sin += half) {
        for (ptrdiff_t head = 0; head < heads; head++, x += head_dim, y += head_dim) {
            for (ptrdiff_t i = 0; i < half; i++) {
                const float first = x[i], second = x[i + half];
                y[i] = first * cos[i] + -second * sin[i];
                y[i + half] = second * cos[i] + first * sin[i];
            }
        }
    }
}

void vlm_attention_merge(const float *maxima, const float *sums, const float *partials, ptrdiff_t units, ptrdiff_t parts,
                         ptrdiff_t rows, ptrdiff_t head_dim, float *y) {
    for (ptrdiff_t unit = 0; unit < units; unit++) {
        for (ptrdiff_t r = 0; r < rows; r++) {
            const ptrdiff_t first = unit * parts * rows + r;
            float largest = -INFINITY;
            for (ptrdiff_t part = 0; part < parts; part++) {
                const float m = maxima[first + part * rows];
                largest = m >= largest ? m : largest;
            }
            float total = 0;
            float *out = y + (unit * rows + r) * head_dim;
            memset(out, 0, (size_t)head_dim * sizeof(float));
            for (ptrdiff_t part = 0; part < parts; part++) {
                const ptrdiff_t slot = first + part * rows;
                const float weight = expf(maxima[slot] - largest);
                total += sums[slot] * weight;
                const float *partial = partials + slot * head_dim;
                for (ptrdiff_t f = 0; f < head_dim; f++) out[f] += partial[f] * weight;
            }
            for (ptrdiff_t f = 0; f < head_dim; f++) out[f] /= total;
        }
    }
}

/// `x` as the step's products read it: int8 or the fixed point.
static void quantize_row(const vlm_decoder_step *s, const float *x, ptrdiff_t columns, void *activation) {
    if (s->int8) vlm_quant_int8_activation(x, columns, activation);
    else vlm_quant_activation(x, columns, activation);
}

enum epilogue { WRITE, ADD_TO_HIDDEN };

/// This thread's share of the 16-row groups of `products` (whole sets of the step's streams, as the layer-by-layer
/// path claims them), multiplied by the activation row, its outputs finished. The shares are fixed, an equal run of
/// sets each, where the layer-by-layer path claims shares as the work runs: a claim starts its streams cold (the
/// first lines of each asked for at once, the prefetches past its end wasted), and a step's products are small
/// (SmolLM2-135M's a quarter to 1.3 MB, ten claims each). `vlm bench` of SmolLM2-135M Q4_1 on a Zen 4 VM alternated
/// with claimed shares: 1.10× and 1.11× (medians of six pairs, twice), Q8_0 1.04×.
static void run_products(step_run *run, const vlm_decoder_product *products, ptrdiff_t count, const void *activation,
                         float *output, enum epilogue epilogue, int thread, int threads) {
    const vlm_decoder_step *s = run->step;
    const int streams = run->streams;
    ptrdiff_t first_sets[4] = {0};
    for (ptrdiff_t i = 0; i < count; i++)
        first_sets[i + 1] = first_sets[i] + ((products[i].rows + 15) / 16 + streams - 1) / streams;
    const ptrdiff_t total = first_sets[count];
    const ptrdiff_t start = total * thread / threads, end = total * (thread + 1) / threads;
    float *hidden = s->hidden;
    for (ptrdiff_t i = 0; i < count; i++) {
        const vlm_decoder_product *p = &products[i];
        const ptrdiff_t from = start > first_sets[i] ? start : first_sets[i];
        const ptrdiff_t to = end < first_sets[i + 1] ? end : first_sets[i + 1];
        if (from >= to) continue;
        const ptrdiff_t groups = (p->rows + 15) / 16, first_group = (from - first_sets[i]) * streams;
        const ptrdiff_t end_group = (to - first_sets[i]) * streams < groups ? (to - first_sets[i]) * streams : groups;
        float *y = output + p->offset;
        if (s->int8)
            vlm_quant_int8_matmul_streams(p->packed, p->format, p->rows, p->columns, activation, 1, y, p->rows,
                                          first_group, end_group - first_group, streams);
        else
            vlm_quant_packed_matmul_streams(p->packed, p->format, p->rows, p->columns, activation, 1, y, p->rows,
                                            first_group, end_group - first_group, VLM_ISA_AVX512, streams);
        const ptrdiff_t end_row = 16 * end_group < p->rows ? 16 * end_group : p->rows;
        if (epilogue == WRITE && !p->bias) continue;
        for (ptrdiff_t j = 16 * first_group; j < end_row; j++) {
            const float value = y[j] + (p->bias ? p->bias[j] : 0);
            if (epilogue == ADD_TO_HIDDEN) hidden[p->offset + j] = value + hidden[p->offset + j];
            else y[j] = value;
        }
    }
}

/// This thread's run of the (key head, part) items, an equal share of them in order: each writes its head's new
/// key and value to the cache when its range holds them (no other part reads that position), then runs its part for
/// the head's group of query heads. Heads are normalized (Qwen3) before they are rotated (unless the layer keeps no
/// positions, as SmolLM3's NoPE layers), as the layer-by-layer path does it. A run of items in order reads a thread's
/// keys as one stream from one part into the next (a head's positions lie side by side), where items claimed as
/// they run (the two threads taking turns) start each part cold: on a Zen 5 VM the step (scripts/bench_decoder_step.py,
/// SmolLM2-135M's shapes, Q4_1, the builds alternating step by step) ran 1.02–1.06× as fast at 320 cached positions,
/// 1.04× at 1,000, 1.02× at 2,000, 1.06× over an fp16 cache at 1,000.
static void run_attention(step_run *run, const vlm_decoder_layer *layer, ptrdiff_t l, int thread, int threads) {
    const vlm_decoder_step *s = run->step;
    const ptrdiff_t hd = s->head_dim, group = run->group;
    const key_range range = attended_keys(s, layer);
    const ptrdiff_t key_length = range.length, part_length = (key_length + range.parts - 1) / range.parts;
    const float *q = run->qkv, *k = q + s->heads * hd, *v = k + s->key_heads * hd;
    thread_scratch *t = &scratch_of_thread;
    const ptrdiff_t items = s->key_heads * range.parts;
    for (ptrdiff_t item = items * thread / threads; item < items * (thread + 1) / threads; item++) {
        const ptrdiff_t head = item / range.parts, part = item % range.parts;
        const ptrdiff_t head_start = head * s->capacity * hd;
        const ptrdiff_t first = part * part_length;
        const ptrdiff_t count = part_length < key_length - first ? part_length : key_length - first;
        const float *cos = layer->local_rotary ? s->local_cos : s->cos, *sin = layer->local_rotary ? s->local_sin : s->sin;
        if (first + count == key_length) {
            const float *key = k + head * hd;
            if (layer->key_norm) {
                vlm_rms_norm(key, layer->key_norm, 1, hd, s->eps, t->key);
                key = t->key;
            }
            const ptrdiff_t stored = head_start + s->position * hd;
            if (s->half_keys) {
                // Rotated into the thread's key row (in place after a key norm: each pair is read before it is
                // written), then rounded into the cache.
                if (!layer->unrotated) {
                    vlm_rotate_half(key, 1, 1, hd, cos, sin, t->key);
                    key = t->key;
                }
                vlm_floats_to_halves(key, hd, s->half_keys[l] + stored, run->isa);
                vlm_floats_to_halves(v + head * hd, hd, s->half_values[l] + stored, run->isa);
            } else {
                if (layer->unrotated) memcpy(s->keys[l] + stored, key, (size_t)hd * sizeof(float));
                else vlm_rotate_half(key, 1, 1, hd, cos, sin, s->keys[l] + stored);
                memcpy(s->values[l] + stored, v + head * hd, (size_t)hd * sizeof(float));
            }
        }
        const float *query = q + head * group * hd;
        if (layer->query_norm) {
            // Rotated in place below: each pair is read before it is written.
            vlm_rms_norm(query, layer->query_norm, group, hd, s->eps, t->query);
            query = t->query;
        }
        if (layer->unrotated) {
            if (query != t->query) memcpy(t->query, query, (size_t)(group * hd) * sizeof(float));
        } else {
            vlm_rotate_half(query, 1, group, hd, cos, sin, t->query);
        }
        const ptrdiff_t start = head_start + range.first * hd;
        const vlm_attention_problem problem = {
            .query = t->query, .key = s->half_keys ? NULL : s->keys[l] + start,
            .value = s->half_keys ? NULL : s->values[l] + start,
            .half_key = s->half_keys ? s->half_keys[l] + start : NULL,
            .half_value = s->half_keys ? s->half_values[l] + start : NULL, .query_stride = hd, .key_stride = hd,
            .value_stride = hd, .output_stride = hd, .query_length = group, .key_length = key_length, .head_dim = hd,
            .head_count = 1, .scale = s->scale, .streams = run->streams};
        const ptrdiff_t slot = item * group;
        if (vlm_attention_partial(&problem, first, count, run->maxima + slot, run->sums + slot,
                                  run->partials + slot * hd, run->isa) != 0)
            atomic_store_explicit(&run->failed, 1, memory_order_relaxed);
    }
}

/// GELU's tanh approximation as the layer-by-layer path computes it (Activation.geluTanh), operation for operation.
static float gelu_tanh(float x) { return 0.5f * x * (1 + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))); }

/// silu(gate) · up (or gelu(gate) · up) as the layer-by-layer path forms it: the gated-activation kernel on a stacked
/// SiLU product, the scalar activation of the gate's epilogue times up otherwise.
static void gated_activation(const step_run *run, const vlm_decoder_layer *layer, float *gated) {
    const ptrdiff_t width = run->step->intermediate_size;
    if (layer->gelu_gate) {
        for (ptrdiff_t i = 0; i < width; i++) gated[i] = gelu_tanh(run->gate_up[i]) * run->gate_up[width + i];
        return;
    }
    if (layer->gate_up_products == 1) {
        vlm_gated_silu(run->gate_up, 1, width, gated, run->isa);
        return;
    }
    for (ptrdiff_t i = 0; i < width; i++) {
        const float gate = run->gate_up[i];
        gated[i] = gate / (1 + expf(-gate)) * run->gate_up[width + i];
    }
}

/// A product's output (`run->product`) through a norm of its own, added to this thread's share of the hidden state,
/// as Gemma adds its attention's and MLP's outputs; each thread norms the whole row itself.
static void add_normed_product(step_run *run, const float *norm, float *normed, int thread, int threads) {
    const vlm_decoder_step *s = run->step;
    vlm_rms_norm(run->product, norm, 1, s->hidden_size, s->eps, normed);
    const ptrdiff_t start = s->hidden_size * thread / threads, end = s->hidden_size * (thread + 1) / threads;
    for (ptrdiff_t i = start; i < end; i++) s->hidden[i] = s->hidden[i] + normed[i];
}

static void run_step(void *context, int thread, int threads) {
    step_run *run = context;
    const vlm_decoder_step *s = run->step;
    if (prepare_thread_scratch(s) != 0) atomic_store_explicit(&run->failed, 1, memory_order_relaxed);
    vlm_parallel_barrier();
    if (atomic_load_explicit(&run->failed, memory_order_relaxed)) return;
    thread_scratch *t = &scratch_of_thread;
    const ptrdiff_t width = s->heads * s->head_dim;
    for (ptrdiff_t l = 0; l < s->layer_count; l++) {
        const vlm_decoder_layer *layer = &s->layers[l];
        vlm_rms_norm(s->hidden, layer->input_norm, 1, s->hidden_size, s->eps, t->normed);
        quantize_row(s, t->normed, s->hidden_size, t->activation);
        run_products(run, layer->attention, layer->attention_products, t->activation, run->qkv, WRITE,
                     thread, threads);
        vlm_parallel_barrier();
        run_attention(run, layer, l, thread, threads);
        vlm_parallel_barrier();
        vlm_attention_merge(run->maxima, run->sums, run->partials, s->key_heads, attended_keys(s, layer).parts,
                            run->group, s->head_dim, t->attended);
        quantize_row(s, t->attended, width, t->activation);
        run_products(run, &layer->output, 1, t->activation, run->product,
                     layer->attention_output_norm ? WRITE : ADD_TO_HIDDEN, thread, threads);
        vlm_parallel_barrier();
        if (layer->attention_output_norm) {
            add_normed_product(run, layer->attention_output_norm, t->normed, thread, threads);
            vlm_parallel_barrier();
        }
        vlm_rms_norm(s->hidden, layer->post_attention_norm, 1, s->hidden_size, s->eps, t->normed);
        quantize_row(s, t->normed, s->hidden_size, t->activation);
        run_products(run, layer->gate_up, layer->gate_up_products, t->activation, run->gate_up, WRITE,
                     thread, threads);
        vlm_parallel_barrier();
        gated_activation(run, layer, t->gated);
        quantize_row(s, t->gated, s->intermediate_size, t->activation);
        run_products(run, &layer->down, 1, t->activation, run->product, layer->mlp_output_norm ? WRITE : ADD_TO_HIDDEN,
                     thread, threads);
        vlm_parallel_barrier();
        if (layer->mlp_output_norm) {
            add_normed_product(run, layer->mlp_output_norm, t->normed, thread, threads);
            vlm_parallel_barrier();
        }
    }
    if (!s->head.packed) {
        if (thread == 0) vlm_rms_norm(s->hidden, s->final_norm, 1, s->hidden_size, s->eps, s->hidden);
        return;
    }
    vlm_rms_norm(s->hidden, s->final_norm, 1, s->hidden_size, s->eps, t->normed);
    quantize_row(s, t->normed, s->hidden_size, t->activation);
    run_products(run, &s->head, 1, t->activation, s->logits, WRITE, thread, threads);
}

int vlm_decoder_step_run(const vlm_decoder_step *s, vlm_kernel_isa isa) {
    step_run run = {.step = s, .isa = isa, .group = s->heads / s->key_heads,
                    .streams = s->streams == 1 || s->streams == VLM_QUANT_MAX_STREAMS ? s->streams : vlm_quant_streams()};
    const ptrdiff_t slots = s->key_heads * most_parts(s) * run.group;
    run.qkv = s->scratch;
    run.gate_up = run.qkv + (s->heads + 2 * s->key_heads) * s->head_dim;
    run.product = run.gate_up + 2 * s->intermediate_size;
    run.maxima = run.product + s->hidden_size;
    run.sums = run.maxima + slots;
    run.partials = run.sums + slots;
    atomic_init(&run.failed, 0);
    if (vlm_parallel_team(run_step, &run) != 0) return -1;
    return atomic_load_explicit(&run.failed, memory_order_relaxed) ? -1 : 0;
}
