/*
 * backend.h — internal: the compute seam. A backend owns memory (the step
 * arena, per-sequence state, the cache's entry pool, widened weight vectors;
 * weights are mapped or uploaded once) and runs every op of a step; the
 * forward pass (forward.c) and MTP (mtp.c) compose these ops on backend
 * buffers and never touch activation memory themselves.
 *
 * Kernel parameters are plain data — pointers into backend buffers, strides,
 * block tables, block sizes, positions — never engine objects (FlashMLA's
 * params are the model). The only host data ops read are step metadata the
 * engine lays out on the host (token ids, sequences, positions, which rows
 * give logits, the per-expert offsets a MoE layer's GEMMs are sized by, the
 * router's finite flags and routed expert ids, the gather order); a device
 * backend copies what it needs through pinned memory. A backend whose
 * buffers are host memory (host_visible) gets the caller's logits buffer as
 * the lm_head's output; any other gets a buffer of its own and what comes
 * back is a small record per row (logits_reduce), the whole row through
 * download only where the caller needs it (forward.c). Ops return nothing: a backend that can
 * fail (a device) keeps its first error for status, checked after each sync.
 *
 * A backend is chosen by name (moeq_backend_new, backend_reg.c): a new one is
 * a folder (engine/<name>/) plus one line in the registry. The CPU backend
 * (engine/cpu/) implements every op and is the reference: the others are
 * compared with it op by op, exact where the op promises it.
 *
 * Contract every backend keeps: an output element's value does not depend on
 * how work is split (batch invariance) when created with batch_invariant = 1,
 * and ops on one backend run in call order (the stream); sync waits for them.
 *
 * Not here: which blocks a sequence holds (kv_cache.c, host bookkeeping).
 */
#ifndef MOEQ_ENGINE_BACKEND_H
#define MOEQ_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kv_paged.h"
#include "model.h"
#include "moe.h"
#include "rope.h"

typedef enum moeq_backend_op {
    MOEQ_BACKEND_OP_MATMUL = 0,    /* y = x W^T, W in its stored dtype (projections, experts, lm_head) */
    MOEQ_BACKEND_OP_MATMUL_NN,     /* y = x W (MLA absorption through W_UK)                           */
    MOEQ_BACKEND_OP_ATTENTION,     /* absorbed MLA attention over block tables                         */
    MOEQ_BACKEND_OP_EMBED,         /* rows of the embedding table, widened                             */
    MOEQ_BACKEND_OP_RMSNORM,       /* per row                                                          */
    MOEQ_BACKEND_OP_ROPE,          /* cos/sin per position; RoPE of q and k + the cache write          */
    MOEQ_BACKEND_OP_SILU_MUL,      /* silu(gate) * up                                                  */
    MOEQ_BACKEND_OP_ADD,           /* residual add                                                     */
    MOEQ_BACKEND_OP_ROUTE,         /* router (V3 noaux_tc, V2 greedy / grouped) and the gather plan    */
    MOEQ_BACKEND_OP_GATHER,        /* token permutation: each expert's slots into contiguous rows      */
    MOEQ_BACKEND_OP_COMBINE,       /* per token: weighted sum over its slots in slot order, + shared   */
    MOEQ_BACKEND_OP_ATTENTION_NAIVE, /* expanded K/V (tests)                                           */
    MOEQ_BACKEND_OP_LOGITS_REDUCE, /* per logits row: argmax, max, top candidates, sums (records, to the host) */
    MOEQ_BACKEND_OP_MOE_EXPERTS,   /* a one-rank MoE layer's routed experts from backend ids: plan, GEMMs, combine */
    MOEQ_BACKEND_OP_COUNT
} moeq_backend_op;

/* What a buffer holds: a backend may place them differently (device memory, pinned host memory). */
typedef enum moeq_buffer_kind {
    MOEQ_BUFFER_WEIGHTS = 0, /* widened weight vectors, uploaded once at creation    */
    MOEQ_BUFFER_ARENA,       /* the per-step scratch, sized for max_step_tokens        */
    MOEQ_BUFFER_CACHE,       /* the KV cache's entry pool                              */
    MOEQ_BUFFER_STATE,       /* per-sequence rows that outlive a step (MTP)            */
} moeq_buffer_kind;

/*
 * One matrix product against rows [row0, row0+n_rows) of a 2-D weight W of
 * shape [rows, cols] (HF layout [out, in]).
 *   NT ("linear"):  y[t, n] = sum_k x[t, k] * W[row0+n, k]     K = cols, N = n_rows
 *   NN ("through"): y[t, c] = sum_r x[t, r] * W[row0+r, c]     K = n_rows, N = cols
 * x is [n_tok, K] with row stride ldx, y is [n_tok, N] with row stride ldy.
 * W is the model's tensor; a device backend finds its uploaded copy by it.
 */
typedef struct moeq_mm_job {
    const moeq_tensor *w;
    int64_t row0, n_rows;
    const float *x;
    int64_t ldx;
    float *y;
    int64_t ldy;
    int64_t n_tok;
} moeq_mm_job;

/* Absorbed MLA attention (see cpu/attention.h for the formula). */
typedef struct moeq_mla_params {
    moeq_kv_paged kv;        /* the layer's cache                                        */
    int64_t n_tok;
    const int32_t *seq;      /* (T) sequence of each query token (row of the block table) */
    const int64_t *pos;      /* (T) its position; attends to 0..pos (length pos + 1)      */
    int n_heads, kv_lora, rope;
    const float *q_lat;      /* (T, H, kv_lora)                                           */
    const float *q_pe;       /* (T, H, rope), roped                                       */
    float *out_lat;          /* (T, H, kv_lora)                                           */
    float scale;
} moeq_mla_params;

/* Naive MLA (tests): K/V expanded through kv_b; q_nope read from q (T, H, nope+rope). */
typedef struct moeq_mla_naive_params {
    moeq_kv_paged kv;
    int64_t n_tok;
    const int32_t *seq;
    const int64_t *pos;
    const moeq_tensor *kv_b;
    int n_heads, nope, v_dim, kv_lora, rope;
    float scale;
    const float *q;          /* (T, H, nope+rope)                                         */
    const float *q_pe;       /* (T, H, rope), roped                                       */
    float *out_v;            /* (T, H, v)                                                 */
} moeq_mla_naive_params;

/* out[r] (row stride ld_out) = rmsnorm(x[rows ? rows[r] : r] (row stride ldx)) * w, for r < n_rows. */
typedef struct moeq_rmsnorm_params {
    float *out;
    int64_t ld_out;
    const float *x;
    int64_t ldx;
    const int64_t *rows;     /* host: source row of each output row, or NULL (identity)  */
    int64_t n_rows, n;
    const float *w;          /* (n)                                                       */
    float eps;
} moeq_rmsnorm_params;

/*
 * MLA's RoPE and cache write, per token t: entry(seq[t], pos[t]) =
 * [rmsnorm(kva[t, :kv_lora]) * kv_norm ; rope(kva[t, kv_lora:])], and
 * q_pe[t, h] = rope(q[t, h, nope:]) — the engine's halves layout, out of place.
 */
typedef struct moeq_mla_rope_params {
    moeq_kv_paged kv;
    int64_t n_tok;
    const int32_t *seq;      /* host (T)                                                  */
    const int64_t *pos;      /* host (T)                                                  */
    const float *kva;        /* (T, kv_lora + rope) kv_a_proj_with_mqa output             */
    const float *kv_norm;    /* (kv_lora) kv_a_layernorm                                  */
    float eps;
    const float *q;          /* (T, H, nope + rope)                                       */
    float *q_pe;             /* (T, H, rope)                                              */
    int n_heads, nope, kv_lora;
    const float *cos_v, *sin_v; /* (T, rope/2) from rope_cos_sin                          */
    const moeq_rope *rope;
} moeq_mla_rope_params;

/*
 * Route every token (logits (T, E) from the router matmul; bias or NULL) to
 * ids/weights (T, K) best first; finite[t] = 0 when token t's logits held a
 * NaN/inf; then, when offsets is not NULL, the gather plan: experts'
 * slots in order[offsets[e] .. offsets[e+1]). With on_backend = 0, ids,
 * finite, offsets and order are host memory: the MoE layer lays its dispatch
 * out from the ids and the expert GEMMs are sized by the groups (a device
 * backend copies them back, so route ends in a wait on the device). With
 * on_backend = 1, ids and finite are backend memory and nothing comes back
 * (no wait): moe_experts reads the ids there; offsets must be NULL. The MoE
 * layer passes offsets NULL: its dispatch groups the rows. weights stay in
 * backend memory (combine reads them).
 */
typedef struct moeq_route_params {
    const moeq_moe_router *router;
    int64_t n_tok;
    const float *logits;
    const float *bias;
    int32_t *ids;            /* host (T, K)                                               */
    float *weights;
    uint8_t *finite;         /* host (T)                                                  */
    float *scratch;          /* moeq_moe_route_scratch floats                             */
    int64_t *offsets;        /* host (E + 1)                                              */
    int64_t *order;          /* host (T * K)                                              */
    int on_backend;          /* 1: ids and finite are backend memory, nothing comes back  */
} moeq_route_params;

/* xg[i] = x[order[i] / K] for i < n_slots; slot_row[order[i]] = i. Rows of D floats; order on the host. */
typedef struct moeq_gather_params {
    float *xg;
    int64_t *slot_row;
    const float *x;
    const int64_t *order;
    int64_t n_slots, top_k, dim;
} moeq_gather_params;

/*
 * out[t] = (sum over k = 0..K-1, in slot order, of weights[t, k] * rows[slot_row[t*K + k]]) + shared[t]
 * (shared may be NULL; slot_row NULL: slot s is row s, the per-slot rows an ep combine returns). Rows of dim floats. The whole sum for a token is formed here, on the token's
 * own rank: an expert-parallel transport returns rows, never partial sums.
 */
typedef struct moeq_combine_params {
    float *out;
    const float *rows;
    const int64_t *slot_row;
    const float *weights;
    const float *shared;
    int64_t n_tok, top_k, dim;
    /* host backends (host_visible) only, NULL otherwise: slot s's row is slot_ptr[s] (rows, slot_row unused) —
     * an expert-parallel group's combine rows where the transport left them */
    const float *const *slot_ptr;
} moeq_combine_params;

/*
 * A one-rank MoE layer's routed experts (and the shared expert) from the router's output in backend memory,
 * nothing about the call depending on host-side counts (only on n_tok and the capacities):
 *   plan      counts[e] = slots routed to expert e; offsets = their exclusive prefix sum (integers: any order
 *             gives the same); order[offsets[e] ..] = e's slots (slot = t*K + k) ascending, slot_row its inverse
 *             — moeq_moe_plan's plan, the one the host layout of moe_layer.c makes
 *   gather    xg[i] = x[order[i] / K]
 *   experts   per expert e with rows: g = xg W_gate^T, u = xg W_up^T over its rows; the shared expert over all
 *             T tokens into the rows after the routed ones; g = silu(g) * u; down = g W_down^T
 *   combine   out[t] = sum over k in slot order of weights[t, k] * down[slot_row[t*K + k]], + the shared row
 * Every element is the value the composed ops (matmul jobs per expert, silu_mul, combine) give: the CPU
 * backend's op is that composition, a device's follows the same per-element order (batch_invariant = 1).
 * stats (or NULL) is backend memory: stats[e] += counts[e] (the engine's expert-count statistics, downloaded
 * only when asked). ids must be the router's (each in [0, n_experts), distinct per token). The CPU backend
 * runs it as one dispatch of up to 2 E + 2 jobs: created with max_jobs >= 2 E + 3 (the engine's is), else
 * the op does nothing.
 */
typedef struct moeq_moe_experts_params {
    const moeq_expert *experts; /* host (n_experts): the layer's routed experts (model tensors)                 */
    const moeq_expert *shared;  /* the fused shared expert, or NULL (or gate_proj NULL): none                  */
    int n_experts;
    int64_t n_tok, top_k, dim, inter; /* T, K, D (hidden), MI (moe_intermediate_size)                          */
    const float *x;             /* (T, D) the layer's normed rows                                             */
    const int32_t *ids;         /* (T, K) route's ids, backend memory (route with on_backend = 1)             */
    const float *weights;       /* (T, K) route's weights                                                     */
    float *out;                 /* (T, D)                                                                     */
    /* workspace, backend memory, sized for max_tok tokens (MOEQ_MOE_PLAN_LEN int64 for plan) */
    float *xg;                  /* (T*K, D)                                                                   */
    float *g, *u;               /* (T*K*MI + T*SI)                                                            */
    float *down;                /* ((T*K + T), D)                                                              */
    int64_t *slot_row;          /* (T*K)                                                                      */
    int64_t *plan;              /* offsets (E+1), order (max_tok*K), tile starts (E+1)                         */
    uint64_t *stats;            /* (E) += counts, or NULL                                                      */
    int64_t max_tok;            /* capacity: n_tok <= max_tok                                                  */
} moeq_moe_experts_params;

/* int64 entries of moe_experts' plan workspace for E experts and up to max_slots slots. */
#define MOEQ_MOE_PLAN_LEN(E, max_slots) (2 * ((int64_t)(E) + 1) + (int64_t)(max_slots))

/* A step's layers bracketed for a CUDA graph (moeq_backend.graph_begin). */
typedef struct moeq_graph_step {
    int64_t n_rows;        /* the bucket's rows (graph_rows' answer): the engine padded the step to them        */
    int64_t n_valid;       /* the step's own tokens, rows [0, n_valid); the rest: token 0 at position 0         */
    int block_tokens;      /* the main cache's block size                                                       */
    int32_t scratch_block; /* a block of the main cache's pool no sequence holds: padding rows use only it      */
    const int32_t *block_table; /* host: the main cache's block table (moeq_kv_paged's), table_stride a row     */
    int64_t table_stride;
    const int32_t *seq;    /* host (n_rows): the padded step's sequences and positions (padding: position 0)    */
    const int64_t *pos;
} moeq_graph_step;

typedef struct moeq_backend moeq_backend;

struct moeq_backend {
    const char *name;
    /* 1: buffers are host memory, so an op may write a host pointer (the caller's logits buffer). */
    int host_visible;
    /* 1 when op can run on weights of dtype (dtype ignored by ops without weights). */
    int (*supports)(const moeq_backend *backend, moeq_backend_op op, moeq_dtype dtype);

    /* ---- memory and stream ---- */
    /* 64-byte aligned backend memory of kind; NULL on failure. */
    void *(*alloc)(moeq_backend *backend, moeq_buffer_kind kind, size_t bytes);
    void (*release)(moeq_backend *backend, void *buffer); /* NULL is safe */
    void (*upload)(moeq_backend *backend, void *dst, const void *host, size_t bytes);
    void (*download)(moeq_backend *backend, void *host, const void *src, size_t bytes);
    void (*copy)(moeq_backend *backend, void *dst, const void *src, size_t bytes); /* within backend memory */
    /* Make the model's weights usable (the CPU reads the mapped file; a device uploads once). */
    moeq_err (*map_weights)(moeq_backend *backend, const moeq_model *model, char *errstr, size_t errstr_size);
    /* Make exactly the main layers' routed experts flagged in resident usable (num_hidden_layers x
     * n_routed_experts flags, row-major; NULL: all of them) and give back what the others held; the MTP layers'
     * experts are map_weights'. A rank of an expert-parallel group holds its own experts only (on a GPU:
     * device memory for 1/n_ranks of them). map_weights leaves the main layers' routed experts to this call when
     * the config's experts_deferred is set, else maps them all. May be called again (the set changes); not
     * inside a step. NULL: every expert is usable from map_weights on. */
    moeq_err (*map_experts)(moeq_backend *backend, const moeq_model *model, const uint8_t *resident, char *errstr,
                            size_t errstr_size);
    void (*sync)(moeq_backend *backend);  /* wait for every op issued so far */
    /* The first error any call met since creation (names the call), or MOEQ_OK; NULL: never fails. */
    moeq_err (*status)(const moeq_backend *backend, char *errstr, size_t errstr_size);
    /* One line on how it runs (device, kernels vs libraries, weight paths); NULL: the name says it all. */
    const char *(*describe)(const moeq_backend *backend);
    /* Memory of the device it runs on: *used bytes in use (by anyone: cudaMemGetInfo's total - free; the CPU
     * counts what this backend allocated), *total its size. NULL: not known. */
    void (*memory)(const moeq_backend *backend, size_t *used, size_t *total);

    /* ---- ops ---- */
    /* All jobs of one call run as one parallel dispatch (e.g. every expert's GEMM). */
    void (*matmul)(moeq_backend *backend, const moeq_mm_job *jobs, int n_jobs);
    void (*matmul_nn)(moeq_backend *backend, const moeq_mm_job *jobs, int n_jobs);
    void (*attention)(moeq_backend *backend, const moeq_mla_params *params);
    void (*attention_naive)(moeq_backend *backend, const moeq_mla_naive_params *params);
    /* out (n, cols) = rows ids[0..n) of table, widened to float32; ids on the host. */
    void (*embed)(moeq_backend *backend, const moeq_tensor *table, const int32_t *ids, int64_t n, float *out);
    void (*rmsnorm)(moeq_backend *backend, const moeq_rmsnorm_params *params);
    /* cos/sin (n, dim/2) of positions pos[0..n) (host). */
    void (*rope_cos_sin)(moeq_backend *backend, const moeq_rope *rope, const int64_t *pos, int64_t n, float *cos_v,
                         float *sin_v);
    void (*mla_rope)(moeq_backend *backend, const moeq_mla_rope_params *params);
    /* out[i] = silu(gate[i]) * up[i]; out may alias gate. */
    void (*silu_mul)(moeq_backend *backend, float *out, const float *gate, const float *up, int64_t n);
    /* x[i] += y[i]. */
    void (*add)(moeq_backend *backend, float *x, const float *y, int64_t n);
    void (*route)(moeq_backend *backend, const moeq_route_params *params);
    void (*gather)(moeq_backend *backend, const moeq_gather_params *params);
    void (*combine)(moeq_backend *backend, const moeq_combine_params *params);
    /* NULL or supports() 0: the MoE layer composes route (host ids), gather, matmul, silu_mul, combine. */
    void (*moe_experts)(moeq_backend *backend, const moeq_moe_experts_params *params);
    /*
     * Per row r < n_rows of logits (backend memory, row stride ld floats, vocab values): out[r] (host) = its
     * record (moeq_logits_record, moeq/engine.h), sum_t taken at temperature[r] (host; <= 0: none). Everything
     * but the sums is exact (the CPU backend's op is the reference); the sums are within
     * moeq_logits_sum_bound of the CPU's. A device backend copies the records back: the op ends in a wait.
     */
    void (*logits_reduce)(moeq_backend *backend, const float *logits, int64_t ld, int64_t n_rows, int64_t vocab,
                          const double *temperature, moeq_logits_record *out);

    /* ---- CUDA graphs (all NULL: none; the engine then never pads a step) ---- */
    /* Rows a step of n_tok tokens runs as when it can be a graph (its bucket, >= n_tok), else 0: eager, unpadded. */
    int64_t (*graph_rows)(const moeq_backend *backend, int64_t n_tok);
    /* The ops from here to graph_end are a step's layers over step->n_rows rows, with no download, sync or wait
     * among them: recorded as the bucket's graph the first time, replayed after (the ops then only write their
     * host data into the bucket's fixed staging). Rows past n_valid stay out of moe_experts' stats. */
    void (*graph_begin)(moeq_backend *backend, const moeq_graph_step *step);
    /* 0: the bracket's ops ran (its graph launched); 1: they did not (a capture failed, or a replay's ops were not
     * the capture's): the caller issues them again, unpadded and outside any bracket. */
    int (*graph_end)(moeq_backend *backend);

    void (*destroy)(moeq_backend *backend);
};

/* What every backend is created with: sizes known at engine creation, so nothing is allocated in a step. */
typedef struct moeq_backend_config {
    int n_threads;          /* >= 1 (host threads; a device backend may ignore it)      */
    int batch_invariant;    /* 1: fixed order per element; 0: the CPU uses OpenBLAS sgemm for n_tok >= blas_min_tokens */
    int blas_min_tokens;    /* default 16                                                */
    int64_t max_k;          /* widest weight row (cols) any job will use                 */
    int64_t max_ctx;        /* longest sequence attention will see                       */
    int max_jobs;           /* most jobs in one call                                     */
    int64_t max_tokens;     /* most tokens (rows) one op sees: sizes a device backend's staging; 0 = 2048 */
    int device;             /* device ordinal (a device backend; the CPU ignores it)     */
    int amx;                /* CPU: NT products of BF16/F8 weights on AMX BF16 tiles (cpu/ops_amx.h);
                               other bits than the float32 lanes, the same for every shape */
    int graphs;             /* cuda_graphs on/auto: a device backend offers graph_rows/begin/end (decode steps
                               captured per bucket) and launches calls of up to 256 tokens in capture-ready
                               shapes (docs/CUDA.md); the same bits; the CPU ignores it */
    int cuda_few_token;     /* cuda_matrix = auto: the CUDA backend's two-threads-a-row kernels for products of <= 8
                               tokens and 32 x 32 shared-memory tiles for more (0: its 16-lane kernels at every
                               size); the same bits; the CPU ignores it */
    /* CPU: the kernels' per-CPU choices (cpu/cpu_tuning.h), each 0 = this CPU's rule, 1 = the first value, 2 = the
       second: prefetch into L1 / L2, F8 widened through float16 / into float32, 5-32-token blocks direct / walked
       in K. Process-wide (the kernels read them, not the backend): a backend created with a value sets it for
       every engine in the process; 0 leaves the process's choice as it is. The same bits every way. */
    int cpu_prefetch, cpu_f8_widen, cpu_k_blocked;
    int experts_deferred;   /* 1: map_weights leaves the main layers' routed experts to map_experts (engine key
                               expert_weights = group: a rank of a group maps only its own) */
} moeq_backend_config;

/*
 * The backend registered under name ("cpu", and "cuda" in a build with CUDA;
 * backend_reg.c). INVALID_ARG naming the known backends when there is none
 * of that name; UNSUPPORTED for "cuda" in a build without CUDA, or where
 * the device cannot be used (none, another ordinal; the reason named);
 * NOMEM (host or device memory at creation).
 */
moeq_err moeq_backend_new(const char *name, const moeq_backend_config *config, moeq_backend **out, char *errstr,
                          size_t errstr_size);

/*
 * Tests: add a backend under name (at most 4; a name taken, or "cuda", is INVALID_ARG, more is LIMIT), so
 * an engine can be run on a wrapper of another backend (test_backend_cuda_host runs one whose buffers the
 * host cannot touch between ops). Not thread-safe: register before creating engines.
 */
typedef moeq_err (*moeq_backend_create_fn)(const moeq_backend_config *config, moeq_backend **out, char *errstr,
                                           size_t errstr_size);
moeq_err moeq_backend_register(const char *name, moeq_backend_create_fn create);

/* Comma-separated names of the built-in backends ("cpu,cpu-device" or "cpu,cuda,cpu-device"), for messages and
 * --help. */
const char *moeq_backend_names(void);

/* The reference backend directly (tests, benchmarks); NULL on allocation failure. */
typedef moeq_backend_config moeq_backend_cpu_params;
moeq_backend *moeq_backend_cpu_new(const moeq_backend_config *config);

static inline void moeq_backend_destroy(moeq_backend *backend) {
    if (backend) backend->destroy(backend);
}

/* backend->status, or MOEQ_OK for a backend that cannot fail. */
static inline moeq_err moeq_backend_status(const moeq_backend *backend, char *errstr, size_t errstr_size) {
    return backend && backend->status ? backend->status(backend, errstr, errstr_size) : MOEQ_OK;
}

#endif
