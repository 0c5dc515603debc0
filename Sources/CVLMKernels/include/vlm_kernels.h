#ifndef VLM_KERNELS_H
#define VLM_KERNELS_H

// Hand-written fp32 kernels for multi-head attention (any strides, so fused query-key-value projections need no
// copies) and layer normalization, a parallel loop on oneDNN's OpenMP threads, and the matrix product that builds
// without oneDNN use. Each kernel has an AVX-512 path
// and a portable one; both match PyTorch's fp32 results within about 1e-6.

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Which implementation a kernel runs.
typedef enum vlm_kernel_isa {
    /// Portable C, for any CPU; compilers vectorize it, and on x86-64 Linux the loader picks a copy compiled for
    /// AVX2 and FMA where the CPU has them.
    VLM_ISA_SCALAR = 0,
    /// AVX-512 (F, DQ, BW, VL) with FMA; falls back to VLM_ISA_SCALAR where the CPU lacks it.
    VLM_ISA_AVX512 = 1,
    /// AVX2 with FMA and F16C, for CPUs without AVX-512; kernels without an AVX2 version run VLM_ISA_SCALAR, and
    /// the path falls back to it where the CPU lacks AVX2.
    VLM_ISA_AVX2 = 2,
} vlm_kernel_isa;

/// The fastest implementation this CPU supports: VLM_ISA_AVX512, else VLM_ISA_AVX2, else VLM_ISA_SCALAR.
vlm_kernel_isa vlm_best_isa(void);

/// Whether the CPU has AVX-512 with bf16 dot products (AVX512-BF16).
int vlm_has_avx512_bf16(void);

/// One unit of multi-head attention: `softmax(q·kᵀ·scale + mask)·v` for `head_count` consecutive heads of one
/// batch item. Head `h` of a token occupies floats `[h·head_dim, (h+1)·head_dim)` from that token's base pointer.
typedef struct vlm_attention_problem {
    /// Head 0 of query token 0; consecutive query tokens are `query_stride` floats apart.
    const float *query;
    /// Head 0 of key token 0.
    const float *key;
    /// Head 0 of value token 0.
    const float *value;
    /// Head 0 of output token 0; written, never read.
    float *output;
    ptrdiff_t query_stride, key_stride, value_stride, output_stride;
    ptrdiff_t query_length, key_length, head_dim, head_count;
    float scale;
    /// Nonzero: query `i` sees keys `0 ... i + key_length - query_length`.
    int causal;
    /// `key_length` floats, nonzero where the key may be attended to; NULL attends to every key.
    const float *key_mask;
    /// Nonzero: q·kᵀ and the probabilities' product with v take their operands rounded to bf16 (ties to even) and
    /// sum in fp32, on the AVX512-BF16 units, as a bf16 layer's matrix products do; the softmax stays fp32. Only
    /// where the CPU has them, the head size is even and there are more than 4 query rows (a decoding step's
    /// attention reads a KV cache, not products); elsewhere the fp32 kernels run.
    int bf16_products;
    /// Where non-NULL, the keys and values are IEEE half floats here, not floats at `key` and `value` (a KV cache
    /// kept at half an fp32 cache's size; `key_stride` and `value_stride` count halves). They are widened to fp32 as
    /// they are read, so the result is what the same problem gives over floats holding the same values.
    const uint16_t *half_key, *half_value;
    /// How many places of memory one core reads from at once where float keys and values are read in place (at most
    /// four query rows, as a decoding step's): 1 reads the values in a pass of their own after the keys', more asks
    /// for each key's value while the keys are read (as halves always do); 0 takes this CPU's vlm_quant_streams().
    /// Only where the bytes come from changes, never the result.
    int streams;
} vlm_attention_problem;

/// `count` floats rounded to IEEE half floats (to nearest, ties to even; overflow to infinity, NaN kept NaN), as
/// PyTorch's `.half()` rounds them; every `isa` gives the same bits.
void vlm_floats_to_halves(const float *x, ptrdiff_t count, uint16_t *y, vlm_kernel_isa isa);

/// `count` IEEE half floats widened to floats (exactly).
void vlm_halves_to_floats(const uint16_t *x, ptrdiff_t count, float *y, vlm_kernel_isa isa);

/// Runs one attention unit. A query that sees no key at all averages every value uniformly, as PyTorch does
/// when all its scores carry the same large negative mask. Returns 0, or -1 when scratch memory cannot be allocated.
int vlm_attention(const vlm_attention_problem *problem, vlm_kernel_isa isa);

/// How an AVX-512 attention unit walks its keys; the portable path has one way.
typedef enum vlm_attention_schedule {
    /// Whichever of the two is faster for the problem's lengths on this CPU's caches: what vlm_attention runs.
    VLM_ATTENTION_AUTOMATIC = 0,
    /// Each register block of query rows takes its softmax over every key at once, from a scratch row of all its
    /// scores. Every block reads a head's keys and values whole, from L3 once they outgrow L2.
    VLM_ATTENTION_WHOLE_ROWS = 1,
    /// Flash attention: blocks of query rows pass over tiles of keys small enough to stay in L2, keeping a running
    /// max and sum per row (online softmax) and writing each output once. Agrees with VLM_ATTENTION_WHOLE_ROWS to a
    /// few float roundings.
    VLM_ATTENTION_KEY_TILES = 2,
} vlm_attention_schedule;

/// vlm_attention with a chosen schedule. For VLM_ATTENTION_KEY_TILES, `query_block` query rows (rounded down to the
/// kernel's register block) pass over tiles of `key_tile` keys (rounded up to a multiple of 64); 0 picks either size
/// from this CPU's L2 size. A problem with `bf16_products` that the bf16 kernel takes runs on key tiles whatever
/// `schedule` says. Returns 0, or -1 when scratch memory cannot be allocated.
int vlm_attention_scheduled(const vlm_attention_problem *problem, vlm_attention_schedule schedule,
                            ptrdiff_t query_block, ptrdiff_t key_tile, vlm_kernel_isa isa);

/// One part of attention split along the keys, for a decoding step: the `query_length` rows of `problem` (rows of
/// one query position, e.g. the query heads that share a key/value head; `causal` and `key_mask` must be 0 and
/// NULL) over keys `first_key ..< first_key + key_count` (at least one). Per row `i` it writes the largest scaled
/// score `maxima[i]`, `sums[i] = Σ e^(score − maxima[i])` and `outputs[i·head_dim ...] = Σ e^(score − maxima[i])·v`;
/// the parts of all key ranges merge into the softmax-weighted sum. Returns 0, or -1 when scratch memory cannot be
/// allocated.
int vlm_attention_partial(const vlm_attention_problem *problem, ptrdiff_t first_key, ptrdiff_t key_count, float *maxima,
                          float *sums, float *outputs, vlm_kernel_isa isa);

/// The index of the first largest of `count` (≥ 1) floats, a NaN counting as larger than any number (torch's
/// `argmax`): the first NaN where there is one.
ptrdiff_t vlm_argmax(const float *x, ptrdiff_t count, vlm_kernel_isa isa);

/// `y[r][c] = silu(x[r][c]) · x[r][width + c]` for `rows` rows of `2 · width` floats (a gated MLP's stacked gate and
/// up projections), with silu(g) = g / (1 + e^-g) to a few ulp.
void vlm_gated_silu(const float *x, ptrdiff_t rows, ptrdiff_t width, float *y, vlm_kernel_isa isa);

/// One torch.optim.AdamW step over `n` elements in place: p ← p·decay, m ← m + (g − m)(1 − β₁), v ← β₂v + (1 − β₂)g²,
/// p ← p − step_size · m / (√v / correction2 + ε), rounded after every operation as torch's single-tensor update.
void vlm_adamw_update(float *p, const float *g, float *m, float *v, ptrdiff_t n, float decay, float beta1, float beta2,
                      float step_size, float correction2, float epsilon);

/// Layer normalization of `rows` rows of `features` floats: `(x - mean) / sqrt(var + eps) * weight + bias` with the
/// biased variance, like `torch.nn.functional.layer_norm`. `x` and `y` are contiguous rows.
void vlm_layer_norm(const float *x, float *y, ptrdiff_t rows, ptrdiff_t features, const float *weight,
                    const float *bias, float eps, vlm_kernel_isa isa);

/// Symmetric int8 quantization of `rows` rows of `features` floats, each row on a scale of its own:
/// `q[c] = round(x[c] · 127 / max|x|)` (ties to even, saturated to ±127) and `scales[row] = max|x| / 127`, so that
/// `x ≈ q · scale`; a row of zeros gets scale 1, a row with NaN or ±infinity zeros and a NaN scale (so that what it
/// enters is NaN, as in fp32). Dynamic int8 matrix products quantize activations per token and weights per output
/// channel with it.
void vlm_quantize_rows_int8(const float *x, ptrdiff_t rows, ptrdiff_t features, signed char *q, float *scales,
                            vlm_kernel_isa isa);

/// `c = a·b`, or `a·bᵀ` when `transpose_b` is nonzero, in row-major fp32: `a` is `m × k`, `b` is `k × n` (`n × k`
/// when transposed), `c` is `m × n`, and each matrix's rows lie `ld*` floats apart. The matrix product of builds
/// without oneDNN: Accelerate's `cblas_sgemm` on Apple platforms, a cache-blocked C loop elsewhere. Returns 0, or
/// -1 when scratch memory cannot be allocated.
int vlm_gemm(ptrdiff_t m, ptrdiff_t n, ptrdiff_t k, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t ldb,
             int transpose_b, float *c, ptrdiff_t ldc);

/// One row `x` (`k` floats) times a `k × n` fp32 matrix `w` held in panels of 64 columns, for the panels
/// `first_panel ..< first_panel + panel_count`: `y[c] = Σ_r x[r]·w[r][c] (+ bias[c])` for their columns below `n`.
/// Panel p starts `p · panel_stride` floats after `w` and holds rows 0 ..< k of its 64 columns one after another
/// (columns past `n` zero): oneDNN's `BA16a64b` layout of a matmul's fp32 weights. A decoding step's product, which
/// reads every weight once: the panels are read two at a time, prefetched. Returns 0, or -1 without writing anything
/// where the CPU lacks AVX-512 (the caller multiplies another way).
int vlm_panel_matvec(const float *w, ptrdiff_t k, ptrdiff_t n, ptrdiff_t panel_stride, const float *x, const float *bias,
                     float *y, ptrdiff_t first_panel, ptrdiff_t panel_count);

/// vlm_panel_matvec for a bf16 matrix and a bf16 row (`uint16_t` bit patterns), the products summed in fp32: each
/// panel holds the rows in pairs, a pair's two values of each column side by side, `2 · 64` values a pair (oneDNN's
/// `BA16a64b2a`; rows past `k` zero). Returns 0, or -1 without writing anything where the CPU lacks AVX512-BF16.
int vlm_panel_matvec_bf16(const uint16_t *w, ptrdiff_t k, ptrdiff_t n, ptrdiff_t panel_stride, const uint16_t *x,
                          const float *bias, float *y, ptrdiff_t first_panel, ptrdiff_t panel_count);

/// The most rows `vlm_int8_matvec` sums: its int32 sums of unsigned-times-signed bytes stay exact up to there.
#define VLM_INT8_MATVEC_MAX_K 65536

/// One row of a dynamic int8 product: `y[c] = (Σ_r x[r]·w[r][c]) · weight_scales[c] · row_scale (+ bias[c])` for the
/// columns of the 64-column panels `first_panel ..< first_panel + panel_count` below `n`, the sum exact in int32,
/// then the scales and the bias in that order, as oneDNN's int8 matmul applies its output scales and post-ops. `w` is
/// the plain `k × n` int8 matrix (oneDNN's `abc` layout of the `[1, k, n]` weights), `x` the row quantized by
/// vlm_quantize_rows_int8, `column_sums` each column's sum (vlm_int8_column_sums). Returns 0, or -1 without writing
/// anything where the CPU lacks AVX-512 VNNI or `k` passes VLM_INT8_MATVEC_MAX_K.
int vlm_int8_matvec(const int8_t *w, ptrdiff_t k, ptrdiff_t n, const int8_t *x, const int32_t *column_sums,
                    const float *weight_scales, float row_scale, const float *bias, float *y, ptrdiff_t first_panel,
                    ptrdiff_t panel_count);

/// Each column's sum of the plain `k × n` int8 matrix `w`, for vlm_int8_matvec.
void vlm_int8_column_sums(const int8_t *w, ptrdiff_t k, ptrdiff_t n, int32_t *sums);

/// A ggml block format the quantized-matrix kernels read; the values are ggml's type numbers. Blocks run along a
/// matrix row: a row of `columns` elements is `columns / block elements` blocks, stored one after another. F16 and
/// BF16 (one element per ggml block) are read in blocks of 32, so their rows must be a multiple of 32 long.
typedef enum vlm_quant_format {
    VLM_QUANT_F16 = 1,
    VLM_QUANT_Q4_0 = 2,
    VLM_QUANT_Q4_1 = 3,
    VLM_QUANT_Q5_0 = 6,
    VLM_QUANT_Q5_1 = 7,
    VLM_QUANT_Q8_0 = 8,
    VLM_QUANT_Q4_K = 12,
    VLM_QUANT_Q5_K = 13,
    VLM_QUANT_Q6_K = 14,
    VLM_QUANT_BF16 = 30,
} vlm_quant_format;

/// Elements and bytes per block of `format`; returns 0, or -1 (leaving the outputs alone) for a format the kernels
/// do not read.
int vlm_quant_block_layout(int format, ptrdiff_t *block_elements, ptrdiff_t *block_bytes);

/// A matrix of `rows × columns` quantized elements: row `r` starts `r · row_bytes` bytes after `data`, and
/// `columns` is a multiple of the format's block.
typedef struct vlm_quant_matrix {
    const void *data;
    vlm_quant_format format;
    ptrdiff_t rows, columns, row_bytes;
} vlm_quant_matrix;

/// Writes rows `first ..< first + count` of `matrix` as fp32 to `output` (consecutive rows `output_stride` floats
/// apart), with ggml's (and gguf-py's) arithmetic, so the values agree bit for bit.
void vlm_quant_dequantize_rows(const vlm_quant_matrix *matrix, ptrdiff_t first, ptrdiff_t count, float *output,
                               ptrdiff_t output_stride, vlm_kernel_isa isa);

/// `y[i][j] = Σ_c x[i][c] · W[j][c]` for the `m` rows of `x` (rows `x_stride` floats apart, `columns` long) and the
/// output columns `j` in `first ..< first + count` (rows of `y` `y_stride` floats apart): the matrix product with
/// `Wᵀ` for few rows of `x`, dequantizing each weight block once into cache and accumulating in fp32. `m` is at
/// most VLM_QUANT_MAX_ROWS.
void vlm_quant_matmul_rows(const vlm_quant_matrix *matrix, const float *x, ptrdiff_t m, ptrdiff_t x_stride, float *y,
                           ptrdiff_t y_stride, ptrdiff_t first, ptrdiff_t count, vlm_kernel_isa isa);

/// The most rows of `x` one vlm_quant_matmul_rows call takes.
enum { VLM_QUANT_MAX_ROWS = 8 };

// Decoding products on int8 dot products (AVX-512 VNNI, or AVX2's vpmaddubsw and vpmaddwd). A matrix of a 32-element block format (Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0) or a K-quant (Q4_K, Q5_K, Q6_K: super-blocks of 256 whose 32- or 16-element sub-blocks have their own
// scales) is repacked once so that 16 weight rows share each vector: for every group of 16 rows and every 32-element
// block, the rows' quantized values as unsigned numbers (Q8_0 a byte each; the others' low four bits two per byte
// and their fifth and sixth bits as bit planes), then their scales and minimums: fp16 as stored, or for K-quants
// the sub-block scales and minimums a byte each and each super-block's fp16 d and dmin, which the kernels multiply
// into the fp32 products d·scale and dmin·min that ggml dequantizes with. A packed matrix is as large as the stored
// one (K-quants: up to 3% larger).
// Activations are written as fixed point per 32-element block: a scale and three signed 8-bit digits of
// v = x / scale (v = 2¹⁴·h + 2⁷·m + l, |v| ≤ 127·2¹⁴), 22 bits where fp32 has 24, so the products agree with the
// fp32 ones to about 3e-7 of each block's largest activation, while one instruction does 64 multiply-adds.

/// Whether this CPU runs the packed products.
int vlm_quant_packed_supported(void);

/// Bytes of the packed form of a `rows × columns` matrix of `format`, or 0 for a format without one.
ptrdiff_t vlm_quant_packed_size(vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns);

/// Writes the packed form of `matrix` to `packed` (vlm_quant_packed_size bytes, 64-byte aligned). Rows past the
/// last of the final group of 16 are zero.
void vlm_quant_pack(const vlm_quant_matrix *matrix, void *packed);

/// Bytes of one activation row of `columns` (a multiple of 32) in fixed point.
ptrdiff_t vlm_quant_activation_size(ptrdiff_t columns);

/// Writes `x[0 ..< columns]` in fixed point to `activation` (vlm_quant_activation_size bytes). A block with a
/// non-finite value gets a NaN scale, so the products it enters are NaN as in fp32.
void vlm_quant_activation(const float *x, ptrdiff_t columns, void *activation);

/// `y[i][j] = Σ_c x[i][c] · W[j][c]` for the `m` (at most VLM_QUANT_MAX_ROWS) activation rows (each
/// vlm_quant_activation_size(columns) bytes after the previous) and the rows `j` of the 16-row groups
/// `first_group ..< first_group + groups` that are below `rows`; rows of `y` lie `y_stride` floats apart. `isa`
/// VLM_ISA_AVX512 runs the AVX-512 VNNI kernels where the CPU has them and the AVX2 ones otherwise; VLM_ISA_AVX2
/// the AVX2 ones. Only where vlm_quant_packed_supported().
void vlm_quant_packed_matmul(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                             const void *activations, ptrdiff_t m, float *y, ptrdiff_t y_stride,
                             ptrdiff_t first_group, ptrdiff_t groups, vlm_kernel_isa isa);

/// A token for vlm_quant_packed_matvec, different on every call in the process.
uint64_t vlm_quant_call_token(void);

/// vlm_quant_packed_matmul for one fp32 row `x` (decoding): each thread that takes part in the product writes `x` in
/// fixed point itself, once per `call` (a vlm_quant_call_token; the same for every part of one product), into a
/// buffer of its own, so no thread waits for another to have done it. Returns 0, or -1 when that buffer cannot be
/// allocated. Only where vlm_quant_packed_supported().
int vlm_quant_packed_matvec(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                            const float *x, uint64_t call, float *y, ptrdiff_t first_group, ptrdiff_t groups);

// int8 products on the same packed matrices (MatrixPrecision.int8), for prompts and decoding alike: each activation
// row as one signed 8-bit digit per element, `round(x·127/max|x|)` (ties to even) on a scale per 32-element block as
// llama.cpp quantizes activations to q8_0, and each block's integer sum of weights times digits exact in 32 bits,
// then scaled into fp32 by the same operations in the same order whatever the number of rows, so a row's outputs
// do not depend on the rows beside it.

/// Whether this CPU runs the int8 products (AVX-512 VNNI).
int vlm_quant_int8_supported(void);

/// Bytes of one activation row of `columns` (a multiple of 32) in int8.
ptrdiff_t vlm_quant_int8_activation_size(ptrdiff_t columns);

/// Writes `x[0 ..< columns]` in int8 to `activation` (vlm_quant_int8_activation_size bytes). A block with a
/// non-finite value gets a NaN scale, so the products it enters are NaN as in fp32.
void vlm_quant_int8_activation(const float *x, ptrdiff_t columns, void *activation);

/// `y[i][j] = Σ_c x̂[i][c] · W[j][c]` for the `m` int8 activation rows `x̂` (each
/// vlm_quant_int8_activation_size(columns) bytes after the previous) and the rows `j` of the 16-row groups
/// `first_group ..< first_group + groups` that are below `rows`; rows of `y` lie `y_stride` floats apart. One row
/// (decoding) streams the groups as vlm_quant_packed_matmul does; more are multiplied in tiles, each pair of groups
/// unpacked once (bytes, fp32 scales) into a buffer the calling thread keeps. Returns 0, or -1 when that buffer
/// cannot be allocated. Only where vlm_quant_int8_supported().
int vlm_quant_int8_matmul(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                          const void *activations, ptrdiff_t m, float *y, ptrdiff_t y_stride,
                          ptrdiff_t first_group, ptrdiff_t groups);

/// vlm_quant_packed_matvec in int8: each thread that takes part writes `x` in int8 into a buffer of its own once per
/// `call`. Returns 0, or -1 when that buffer cannot be allocated. Only where vlm_quant_int8_supported().
int vlm_quant_int8_matvec(const void *packed, vlm_quant_format format, ptrdiff_t rows, ptrdiff_t columns,
                          const float *x, uint64_t call, float *y, ptrdiff_t first_group, ptrdiff_t groups);

/// The most places of a matrix one core streams from at once in a decoding product (m = 1).
enum { VLM_QUANT_MAX_STREAMS = 4 };

/// How many places of a matrix one core streams from at once in a decoding product (m = 1) on this CPU, 1 or
/// VLM_QUANT_MAX_STREAMS: a thread's groups split into that many parts read side by side, the groups that do not
/// divide among them one at a time after. Ranges of groups given to the decoding products should be whole sets of it.
int vlm_quant_streams(void);

/// transformers' LlamaRMSNorm of `rows` rows of `features` floats, `y = weight · x / √(mean(x²) + eps)`, the mean of
/// squares summed in double (which rounds it correctly, as PyTorch's pairwise float sum approximates). `y` may be `x`.
void vlm_rms_norm(const float *x, const float *weight, ptrdiff_t rows, ptrdiff_t features, float eps, float *y);

/// Rotary position embedding in transformers' rotate-half form (`x·cos + rotate_half(x)·sin`) of `heads` heads of
/// `head_dim` floats for each of `tokens` tokens (the heads of a token consecutive, the tokens too), token `t`'s
/// `cos` and `sin` at `t · head_dim / 2`.
void vlm_rotate_half(const float *x, ptrdiff_t tokens, ptrdiff_t heads, ptrdiff_t head_dim, const float *cos,
                     const float *sin, float *y);

/// Merges vlm_attention_partial's parts as flash-decoding does: for each of `units` (a key head's rows) and each of
/// its `rows`, the parts' sums and outputs (`[units, parts, rows]` and `[units, parts, rows, head_dim]`) rescaled to
/// the largest maximum, added and divided by the total weight, into `y [units, rows, head_dim]`.
void vlm_attention_merge(const float *maxima, const float *sums, const float *partials, ptrdiff_t units, ptrdiff_t parts,
                         ptrdiff_t rows, ptrdiff_t head_dim, float *y);

/// One packed matrix of a decoding step (vlm_decoder_step): `y = W·x + bias` written to floats `offset ..< offset +
/// rows` of its stage's output.
typedef struct vlm_decoder_product {
    /// vlm_quant_pack's output.
    const void *packed;
    vlm_quant_format format;
    ptrdiff_t rows, columns;
    /// `rows` floats, or NULL.
    const float *bias;
    ptrdiff_t offset;
} vlm_decoder_product;

/// A pre-norm decoder layer as Llama, Mistral and Qwen2 have it: `h += o(attention(rope(q), rope(k), v))` with q, k
/// and v from `rms_norm(h)`, then `h += down(silu(gate) · up)` with gate and up from `rms_norm(h)`.
typedef struct vlm_decoder_layer {
    const float *input_norm, *post_attention_norm;
    /// q, k and v (or fewer matrices stacking them) writing `q | k | v`.
    vlm_decoder_product attention[3];
    ptrdiff_t attention_products;
    /// Qwen3's RMS norms of each query and key head (`head_dim` weights each) before the rotation; NULL without.
    const float *query_norm, *key_norm;
    /// Nonzero where queries and keys keep no position (SmolLM3's NoPE layers): copied, not rotated.
    int unrotated;
    /// Nonzero where they rotate by the step's `local_cos`/`local_sin` (Gemma 3's sliding layers, their own base).
    int local_rotary;
    /// Gemma's norms of the attention's and the MLP's outputs, applied before each is added to the hidden state;
    /// NULL without.
    const float *attention_output_norm, *mlp_output_norm;
    /// Nonzero: the MLP's gate goes through GELU (tanh approximation) instead of SiLU.
    int gelu_gate;
    /// Nonzero where the layer attends to the step's `window` latest positions only (Gemma 3's sliding layers,
    /// Mistral's window).
    int windowed;
    vlm_decoder_product output;
    /// gate and up (or one matrix stacking them) writing `gate | up`.
    vlm_decoder_product gate_up[2];
    ptrdiff_t gate_up_products;
    vlm_decoder_product down;
} vlm_decoder_layer;

/// One decoding step (one new token of one sequence) through every layer of a decoder and its final norm and head,
/// all of it in one parallel region whose threads meet at a barrier after each stage, instead of a region per
/// product with the serial work between them on one thread. Computes exactly what the layer-by-layer path computes:
/// the same kernels on the same numbers (vlm_rms_norm, vlm_rotate_half, the decoding attention's parts merged by
/// vlm_attention_merge), with no floating-point contraction.
typedef struct vlm_decoder_step {
    const vlm_decoder_layer *layers;
    ptrdiff_t layer_count;
    ptrdiff_t hidden_size, heads, key_heads, head_dim, intermediate_size;
    float eps, scale;
    const float *final_norm;
    /// The language-model head writing `logits`; with `packed` NULL the step ends with the final norm, written to
    /// `hidden`.
    vlm_decoder_product head;
    /// Each layer's key and value cache, head-major: key head `h`'s position `p` at floats `(h·capacity + p)·head_dim`.
    float *const *keys;
    float *const *values;
    ptrdiff_t capacity;
    /// The cache position this token's key and value go to; it attends to positions `0 ... position`.
    ptrdiff_t position;
    /// Ranges of keys each key head's attention is split into, merged after.
    ptrdiff_t parts;
    /// The `windowed` layers' window (`position − window + 1 ... position`) and the ranges their attention is split
    /// into, as the layer-by-layer path splits that many keys.
    ptrdiff_t window, window_parts;
    /// Nonzero: every product multiplies the int8 activation row (vlm_quant_int8_matmul) instead of the fixed point.
    int int8;
    /// `cos` and `sin` of this token's rotary angles, `head_dim / 2` each, and those of the layers with
    /// `local_rotary` (NULL where none has it).
    const float *cos, *sin, *local_cos, *local_sin;
    /// In: the token's embedding. Out: untouched where there is a head, else the final norm's output.
    float *hidden;
    /// vlm_decoder_step_scratch_floats floats.
    float *scratch;
    float *logits;
    /// The streams each thread reads its share of a product as, and its attention parts' keys and values (the
    /// attention problems' `streams`): 1 or VLM_QUANT_MAX_STREAMS; anything else (0) takes this CPU's
    /// vlm_quant_streams(). The same results either way; the choice is there to be measured. (Last, so
    /// that scripts/bench_decoder_step.py can drive builds from before it.)
    int streams;
    /// Where non-NULL, each layer's cache holds IEEE half floats here (the same layout, counted in halves) and `keys`
    /// and `values` are unused: the new key and value are rounded to halves as they are stored
    /// (vlm_floats_to_halves) and attention widens them as it reads them.
    uint16_t *const *half_keys;
    uint16_t *const *half_values;
} vlm_decoder_step;

/// Floats of shared scratch a step needs.
ptrdiff_t vlm_decoder_step_scratch_floats(const vlm_decoder_step *step);

/// Runs the step on the threads of vlm_parallel_team, the attention and the gated activation on `isa`'s kernels.
/// Returns 0; -1, having computed nothing, when no OpenMP runtime is loaded or per-thread scratch cannot be allocated,
/// and -1 with the results undefined when the attention's scratch cannot be.
/// Only where vlm_quant_packed_supported(), with the SiLU activation, every product's columns a multiple of 32.
int vlm_decoder_step_run(const vlm_decoder_step *step, vlm_kernel_isa isa);

/// The work of one index of vlm_parallel_for.
typedef void (*vlm_parallel_body)(void *context, ptrdiff_t index);

/// Calls `body(context, i)` for every `i` in `0 ..< count`, spread over the worker threads of the GNU OpenMP
/// runtime that oneDNN uses, and returns 0 once all calls have returned. Returns -1 without calling anything when
/// no such runtime is loaded in the process; the caller then uses threads of its own.
int vlm_parallel_for(ptrdiff_t count, vlm_parallel_body body, void *context);

/// The work of one range `start ..< end` of vlm_parallel_ranges.
typedef void (*vlm_parallel_range_body)(void *context, ptrdiff_t start, ptrdiff_t end);

/// Calls `body(context, start, end)` on disjoint ranges that together cover `0 ..< count`, on the same threads
/// as vlm_parallel_for: each thread repeatedly claims a share of what is left (never fewer than `grain` indices
/// unless fewer are left), so ranges shrink as the work runs out. Returns 0 once all calls have returned, -1
/// without calling anything when no such runtime is loaded.
int vlm_parallel_ranges(ptrdiff_t count, ptrdiff_t grain, vlm_parallel_range_body body, void *context);

/// The work of one thread `thread` of a team of `threads` in vlm_parallel_team.
typedef void (*vlm_parallel_team_body)(void *context, int thread, int threads);

/// Whether vlm_parallel_team runs (the OpenMP runtime is loaded).
int vlm_parallel_team_available(void);

/// Calls `body` once on every thread of the same team as vlm_parallel_for, which may synchronize with
/// vlm_parallel_barrier, and returns 0 once all calls have returned; -1 without calling anything when no such
/// runtime is loaded.
int vlm_parallel_team(vlm_parallel_team_body body, void *context);

/// Waits until every thread of the running vlm_parallel_team has reached it. Only inside its body.
void vlm_parallel_barrier(void);

/// Ends the worker threads that the calling thread's parallel work started (OpenMP keeps a pool of them for every
/// thread that starts parallel work; the next call from this thread starts new ones). Returns 0; -1 when no such
/// runtime is loaded, or inside parallel work.
int vlm_parallel_release_workers(void);

#ifdef __cplusplus
}
#endif

#endif
