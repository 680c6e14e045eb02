// backend_cuda.cu — the CUDA backend: every op of backend.h on device memory, in call order on one stream.
//
// Memory: every tensor of the model is uploaded once in its stored dtype (F32, BF16, F16, F8 E4M3 with its float32
// 128x128 block scales): by map_weights, but the main layers' routed experts by map_experts into a slab of their own
// (all of them, or a group rank's own: engine key expert_weights, docs/EP.md); every buffer (weights vectors, the
// step arena, the cache pool, MTP state) is device memory. The host data an op reads (token ids, positions, rows,
// block tables, the gather order) goes through a pinned staging buffer with a device twin, bump-allocated and reset
// whenever the stream is drained (sync, download, route): a region is never rewritten while a copy from it
// may still be queued. route with host ids copies its ids and finite flags back and waits (the composed MoE
// path lays its dispatch out on the host from them); route on_backend leaves them on the device, where
// moe_experts plans, permutes, runs the experts (a grouped kernel over a work list the device computes) and
// combines, launched by capacities alone.
//
// Matmuls: batch_invariant = 1 (the default) runs own kernels with the CPU's 16-lane order per element
// (ops.cuh: bits equal to the CPU's for every dtype, F8 dequantised in the kernel with its block scale);
// batch_invariant = 0 runs cuBLAS SGEMM (FP32: the default math mode, no TF32) for calls whose every job has
// >= blas_min_tokens tokens, the weight widened to float32 a tile of rows at a time (F8 through the same dequantising
// widening: cuBLASLt's block-scaled FP8 would quantise the activations to FP8 as well, outside the CPU's
// tolerance), the own kernels otherwise. Attention: split-KV (backend_index.cuh) in two kernels, partial
// softmax per partition then the merge. Errors: every CUDA and cuBLAS return code is checked; the first
// failure is kept with the call's name (status) and turns every later op into a no-op.
//
// cuda_graphs (graph_index.cuh, docs/CUDA.md): calls of <= 256 tokens read block tables of fixed stride and plan
// split-KV on the device over a capacity grid; a decode step the engine pads to its bucket and brackets
// (graph_begin .. graph_end) is captured the first time and replayed after, its host data in the bucket's fixed
// staging region. Inside a bracket nothing may wait or allocate: such a call breaks it and the engine runs the
// step again, eagerly.
extern "C" {
#include "backend.h"
#include "model.h"
#include "moe.h"
#include "rope.h"
#include "tensor.h"
}
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.h"
#include "backend_index.cuh"
#include "graph_index.cuh"
#include "moe_index.cuh"
#include "logits_reduce.cuh"
#include "common.cuh"

#define STAGE_MIN_BYTES (64u << 20)     // pinned staging (and its device twin) at least ...
#define STAGE_MAX_BYTES (1u << 30)      // ... and at most (an op needing more fails with LIMIT, named)
#define WIDE_BYTES (256u << 20)         // cuBLAS path: float32 tile of widened weight rows at most
#define ATTN_WS_BYTES (256u << 20)      // split-KV partials of one chunk of query tokens at most
#define BLAS_WS_BYTES (32u << 20)       // cuBLAS's workspace under cuda_graphs (NVIDIA's figure for Hopper)
#define THREADS 128

// One decode bucket's graph: captured once, replayed with the step's host data written into a fixed region.
typedef struct graph_bucket {
    cudaGraphExec_t exec;        // NULL: not captured yet
    int failed;                  // a capture failed: the bucket's steps run eagerly, unpadded (graph_rows 0)
    char *stage_h, *stage_d;     // the fixed staging region (pinned, device twin), stage_cap bytes
    size_t stage_cap;
    size_t *regions;             // the STAGED sizes the capture took, in order: a replay must take the same
    int n_regions, max_regions;
} graph_bucket;

enum { BR_NONE = 0, BR_CAPTURE, BR_REPLAY }; // inside graph_begin .. graph_end: recording, or writing host data

typedef struct cuda_backend {
    moeq_backend base; // first: the table
    moeq_backend_config p;
    int mv; // the few-token kernels where they apply (cuda_matrix = auto), else the 16-lane ones only
    cudaStream_t stream;
    cublasHandle_t blas;
    moeq_err err;      // first failure, kept for status
    char why[320];
    char info[800];
    const moeq_model *model;
    void **wdev;       // [n_tensors] device copy of each tensor, in wslab, or in eslab for a routed expert's
    char *wslab;
    size_t weight_bytes;
    uint8_t *routed;   // [n_tensors] 1: a main layer's routed expert weight (or its scales): map_experts' to hold
    char *eslab;       // the routed experts held (map_experts), NULL: none
    size_t expert_bytes;
    int experts_held, experts_total; // (layer, expert) pairs
    char *stage_h, *stage_d; // pinned host, device twin
    size_t stage_cap, stage_off;
    float *wide;       // cuBLAS path: widened weight tile
    void *blas_ws;     // cuda_graphs: cuBLAS's workspace given up front (a captured GEMM cannot allocate one)
    size_t wide_floats;
    float *ws;         // split-KV partials (o, then m and l)
    size_t ws_bytes;
    void *lr_buf;      // logits_reduce's partitions: candidates, bests, sums, row counters (lr_scratch_reserve)
    size_t lr_bytes;
    const void **moe_tab;            // per MoE layer 6 E device pointers: gate, up, down, then their F8 scales
    const moeq_expert **moe_key;     // [n_moe] the layer's experts array (NULL: none, or built per call)
    int n_moe;
    // cuda_graphs (graph_index.cuh): calls of up to MOEQ_CU_GRAPH_LARGEST tokens read a block table of fixed
    // stride (one row per token), uploaded only when it differs from what the device holds (mla_rope and
    // attention of every layer of a step read the same one), and attention plans on the device
    int32_t *ftab_d, *frow_d, *fplan_d; // [LARGEST * fstride] table, [LARGEST] t * fstride, first|count|total
    int32_t *ftab_h, *fcand_h;          // host: the mirror of ftab_d, and the call's candidate
    int64_t *fnb_h;                     // host: the entries of each row where ftab_h mirrors ftab_d
    uint8_t *fdiff_h;                   // host: the rows a sync uploads
    int64_t fstride;                    // 0: not set up yet; -1: cannot be (offsets past int32)
    // CUDA graphs: the buckets, and the bracket a step is in (graph_begin .. graph_end)
    int64_t gsize[MOEQ_CU_GRAPH_MAX_BUCKETS];
    int n_gb;
    graph_bucket gb[MOEQ_CU_GRAPH_MAX_BUCKETS];
    struct {
        int mode, bucket, broken, region; // BR_*; the region index a replay compares
        int transient;                    // broken by this step's data (contexts), not by the bucket's ops
        int64_t n_rows, n_valid;
        int32_t scratch;                  // the cache block padding rows use
        size_t off;                       // bump offset in the bucket's region
        const int64_t *nvalid_d;          // device: n_valid (moe_experts' counts leave padding out)
        const int32_t *table, *seq;       // host: what graph_begin synced the fixed table from
        const int64_t *pos;
    } br;
    int n_captured, n_replays, n_fallbacks;
    char graph_why[200];                  // the first reason a capture or a replay fell back to eager
    char desc[1400];                      // describe(): info, the experts held and the graphs' counts
} cuda_backend;

// ---- errors -------------------------------------------------------------------------------------------------

static void broken(cuda_backend *cb, const char *why);

static void fail(cuda_backend *cb, moeq_err err, const char *fmt, const char *a, const char *b) {
    if (cb->err) return;
    if (cb->br.mode == BR_CAPTURE) {
        // Inside a capture nothing runs, and a call the capture does not allow (an allocation, a wait, cuBLAS that
        // cannot be recorded) invalidates it, so every later launch of the bracket fails too: kept as the backend's
        // error, that would fail this step and every later one. It breaks the bracket instead (graph_end ends the
        // capture, marks the bucket eager, says why in describe()), and the engine issues the step again eagerly,
        // where a failure that is not the capture's is met again and kept.
        char why[sizeof cb->graph_why];
        snprintf(why, sizeof why, fmt, a, b);
        broken(cb, why);
        return;
    }
    cb->err = err;
    snprintf(cb->why, sizeof cb->why, fmt, a, b);
}

static int cu_ok(cuda_backend *cb, cudaError_t e, const char *call) {
    if (e == cudaSuccess) return 1;
    fail(cb, e == cudaErrorMemoryAllocation ? MOEQ_ERR_NOMEM : MOEQ_ERR_INTERNAL, "%s failed: %s", call,
         cudaGetErrorString(e));
    return 0;
}

static int bl_ok(cuda_backend *cb, cublasStatus_t s, const char *call) {
    if (s == CUBLAS_STATUS_SUCCESS) return 1;
    fail(cb, s == CUBLAS_STATUS_ALLOC_FAILED ? MOEQ_ERR_NOMEM : MOEQ_ERR_INTERNAL, "%s failed: %s", call,
         cublasGetStatusString(s));
    return 0;
}

static int launched(cuda_backend *cb, const char *kernel) { return cu_ok(cb, cudaGetLastError(), kernel); }

static moeq_err cuda_status(const moeq_backend *b, char *errstr, size_t errstr_size) {
    const cuda_backend *cb = (const cuda_backend *)b;
    if (!cb->err) return MOEQ_OK;
    return moeq_errf(cb->err, errstr, errstr_size, "backend cuda (device %d): %s", cb->p.device, cb->why);
}

// ---- staging --------------------------------------------------------------------------------------------------

// Inside a capture or replay nothing may wait, allocate or take another path than the capture did: the step is
// marked broken (the engine issues it again, eagerly and unpadded) and the first reason kept for describe().
static void broken(cuda_backend *cb, const char *why) {
    if (!cb->br.broken && !cb->graph_why[0]) snprintf(cb->graph_why, sizeof cb->graph_why, "%s", why);
    cb->br.broken = 1;
}

// 1 (and the step broken) when inside a capture or replay: host work that cannot be recorded.
static int in_bracket(cuda_backend *cb, const char *what) {
    if (!cb->br.mode) return 0;
    broken(cb, what);
    return 1;
}

// A replay writes the step's host data into the bucket's region and launches nothing until graph_end.
static int replaying(const cuda_backend *cb) { return cb->br.mode == BR_REPLAY; }

// Host bytes already in a staged region to their device twin (or any device buffer), on the stream; a replay's
// graph holds the copy, so a replay only wrote the region.
static int h2d(cuda_backend *cb, void *dev, const void *host, size_t bytes, const char *what) {
    if (cb->err || replaying(cb) || !bytes) return !cb->err;
    return cu_ok(cb, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, cb->stream), what);
}

static void drain(cuda_backend *cb, const char *why) {
    if (cu_ok(cb, cudaStreamSynchronize(cb->stream), why)) cb->stage_off = 0;
}

#define STAGE_ALIGN 256
#define STAGED(bytes) (((bytes) + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN) // what a region takes

// Room for all of one op's regions at once (the sum of STAGED sizes): drains first when the rest is too small,
// so that no region an op still needs is reused by its own later regions. 0 once an error is kept.
static int stage_reserve(cuda_backend *cb, size_t bytes) {
    if (cb->err) return 0;
    if (cb->br.mode) return !cb->br.broken; // the bucket's region: stage() checks each region against it
    if (bytes > cb->stage_cap) {
        char n[32];
        snprintf(n, sizeof n, "%zu", bytes);
        fail(cb, MOEQ_ERR_LIMIT, "one op's host data (%s bytes) exceeds the pinned staging%s", n,
             " (max_step_tokens too large for it)");
        return 0;
    }
    if (cb->stage_off + bytes > cb->stage_cap) drain(cb, "cudaStreamSynchronize (staging full)");
    return !cb->err;
}

static void *stage_broken(cuda_backend *cb, const char *why) {
    broken(cb, why);
    return NULL;
}

// Inside a bracket: the next region of the bucket's fixed region, at the offset the capture gave it (a replay
// that would take another size breaks the step). NULL when broken.
static void *stage_fixed(cuda_backend *cb, size_t bytes, void **dev) {
    graph_bucket *g = &cb->gb[cb->br.bucket];
    if (cb->br.broken) return NULL;
    if (cb->br.off + bytes > g->stage_cap) return stage_broken(cb, "a step's host data past the bucket's region");
    if (cb->br.mode == BR_CAPTURE) {
        if (g->n_regions == g->max_regions) {
            int m = g->max_regions ? 2 * g->max_regions : 1024;
            size_t *r = (size_t *)realloc(g->regions, (size_t)m * sizeof(size_t));
            if (!r) return stage_broken(cb, "out of host memory recording a capture");
            g->regions = r, g->max_regions = m;
        }
        g->regions[g->n_regions++] = bytes;
    } else if (cb->br.region >= g->n_regions || g->regions[cb->br.region] != bytes)
        return stage_broken(cb, "a replay staged other host data than its capture");
    cb->br.region++;
    void *h = g->stage_h + cb->br.off;
    *dev = g->stage_d + cb->br.off;
    cb->br.off += bytes;
    return h;
}

// A region of the staging reserved before (host pointer, device twin); NULL once an error is kept.
static void *stage(cuda_backend *cb, size_t bytes, void **dev) {
    bytes = STAGED(bytes ? bytes : 1);
    if (cb->err) return NULL;
    if (cb->br.mode) return stage_fixed(cb, bytes, dev);
    if (cb->stage_off + bytes > cb->stage_cap) {
        fail(cb, MOEQ_ERR_INTERNAL, "staging region past the op's reservation%s%s", "", "");
        return NULL;
    }
    void *h = cb->stage_h + cb->stage_off;
    *dev = cb->stage_d + cb->stage_off;
    cb->stage_off += bytes;
    return h;
}

// Host bytes to the device through a reserved region; returns the device copy (ordered on the stream) or NULL.
static const void *stage_up(cuda_backend *cb, const void *host, size_t bytes, const char *what) {
    void *d = NULL, *h = stage(cb, bytes, &d);
    if (!h) return NULL;
    if (bytes) memcpy(h, host, bytes);
    return h2d(cb, d, h, bytes, what) ? d : NULL;
}

// One region of its own (an op with nothing else staged).
static const void *stage_up_alone(cuda_backend *cb, const void *host, size_t bytes, const char *what) {
    return stage_reserve(cb, STAGED(bytes ? bytes : 1)) ? stage_up(cb, host, bytes, what) : NULL;
}

// ---- weights ---------------------------------------------------------------------------------------------------

static int tensor_index(const cuda_backend *cb, const moeq_tensor *t) {
    if (!cb->model || !t) return -1;
    uintptr_t a = (uintptr_t)t, lo = (uintptr_t)cb->model->tensors;
    uintptr_t hi = (uintptr_t)(cb->model->tensors + cb->model->n_tensors);
    return a >= lo && a < hi ? (int)((a - lo) / sizeof(moeq_tensor)) : -1;
}

static const void *wdev(cuda_backend *cb, const moeq_tensor *t) {
    int i = tensor_index(cb, t);
    if (i < 0 || !cb->wdev[i]) {
        fail(cb, MOEQ_ERR_INTERNAL, "tensor %s has no device copy (%s)", t && t->name ? t->name : "(null)",
             i >= 0 && cb->routed && cb->routed[i] ? "a routed expert map_experts did not give this backend"
                                                   : "not a tensor of the model map_weights uploaded");
        return NULL;
    }
    return cb->wdev[i];
}

static const float *scale_dev(cuda_backend *cb, const moeq_tensor *t) {
    return t->dtype == MOEQ_DTYPE_F8_E4M3 && t->scale_inv ? (const float *)wdev(cb, t->scale_inv) : NULL;
}

static int ws_reserve(cuda_backend *cb, size_t bytes);

static void build_expert_tables(cuda_backend *cb, const moeq_model *model);

// The main layers' routed experts' tensors (weights and F8 scales): held by map_experts, apart from the rest.
static int mark_routed(cuda_backend *cb, const moeq_model *model) {
    free(cb->routed);
    if (!(cb->routed = (uint8_t *)calloc((size_t)(model->n_tensors > 0 ? model->n_tensors : 1), 1))) return 0;
    int E = model->config.n_routed_experts;
    cb->experts_total = 0;
    for (int l = 0; l < model->config.num_hidden_layers; l++) {
        const moeq_layer *L = &model->layers[l];
        for (int x = 0; L->experts && x < E; x++, cb->experts_total++) {
            const moeq_tensor *w[3] = {L->experts[x].gate_proj, L->experts[x].up_proj, L->experts[x].down_proj};
            for (int i = 0; i < 3; i++) {
                int a = tensor_index(cb, w[i]), sc = w[i] ? tensor_index(cb, w[i]->scale_inv) : -1;
                if (a >= 0) cb->routed[a] = 1;
                if (sc >= 0) cb->routed[sc] = 1;
            }
        }
    }
    return 1;
}

// Hold exactly the flagged experts: the old set is given back first (a step is never in flight here), so a rank of
// a group that mapped them all at a lone step before its join never needs room for both.
static moeq_err cuda_map_experts(moeq_backend *b, const moeq_model *model, const uint8_t *resident, char *errstr,
                                 size_t errstr_size) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->model != model || !cb->routed)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "backend cuda: map_experts before map_weights");
    if (cb->err) return moeq_errf(cb->err, errstr, errstr_size, "backend cuda: %s", cb->why);
    if (cb->br.mode != BR_NONE)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "backend cuda: map_experts inside a step");
    drain(cb, "cudaStreamSynchronize (map_experts)");
    // graphs captured on the old pointers would replay into freed memory: captured again at their next step
    for (int i = 0; i < cb->n_gb; i++)
        if (cb->gb[i].exec) cudaGraphExecDestroy(cb->gb[i].exec), cb->gb[i].exec = NULL, cb->gb[i].n_regions = 0;
    for (int i = 0; i < model->n_tensors; i++)
        if (cb->routed[i]) cb->wdev[i] = NULL;
    if (cb->eslab) cu_ok(cb, cudaFree(cb->eslab), "cudaFree (routed experts)");
    cb->eslab = NULL, cb->expert_bytes = 0, cb->experts_held = 0;
    int E = model->config.n_routed_experts, n_main = model->config.num_hidden_layers;
    size_t total = 0;
    for (int pass = 0; pass < 2 && !cb->err; pass++) { // 0: the bytes; 1: allocate once, then upload
        if (pass == 1 && total &&
            !cu_ok(cb, cudaMalloc((void **)&cb->eslab, total), "cudaMalloc (routed experts)"))
            break;
        for (int l = 0; l < n_main && !cb->err; l++) {
            const moeq_layer *L = &model->layers[l];
            for (int x = 0; L->experts && x < E && !cb->err; x++) {
                if (resident && !resident[(size_t)l * (size_t)E + (size_t)x]) continue;
                cb->experts_held += pass;
                const moeq_tensor *w[6] = {L->experts[x].gate_proj, L->experts[x].up_proj, L->experts[x].down_proj};
                for (int i = 0; i < 3; i++) w[3 + i] = w[i] ? w[i]->scale_inv : NULL;
                for (int i = 0; i < 6; i++) {
                    int a = tensor_index(cb, w[i]);
                    if (a < 0) continue;
                    size_t n = STAGED(w[i]->nbytes ? w[i]->nbytes : 1);
                    if (pass == 0) {
                        total += n;
                        continue;
                    }
                    cb->wdev[a] = cb->eslab + cb->expert_bytes;
                    if (w[i]->nbytes && !cu_ok(cb, cudaMemcpyAsync(cb->wdev[a], w[i]->data, w[i]->nbytes,
                                                                   cudaMemcpyHostToDevice, cb->stream),
                                               "cudaMemcpyAsync (routed experts)"))
                        break;
                    cb->expert_bytes += n;
                }
            }
        }
    }
    if (!cb->err) drain(cb, "cudaStreamSynchronize (routed experts)");
    if (!cb->err) build_expert_tables(cb, model);
    if (cb->err)
        return moeq_errf(cb->err, errstr, errstr_size, "backend cuda: %zu bytes of routed experts: %s", total,
                         cb->why);
    return MOEQ_OK;
}

// Device copy of tensor t (NULL: none) without failing the backend: map_weights' tables are built from it.
static const void *wdev_or_null(const cuda_backend *cb, const moeq_tensor *t) {
    int i = tensor_index(cb, t);
    return i < 0 ? NULL : cb->wdev[i];
}

// Every MoE layer's expert tables (gate, up, down pointers, then their F8 scales), built once: moe_experts finds
// its layer's by the experts array, so a step stages none and its pointers stay fixed (a graph could replay it).
// A layer whose experts mix dtypes gets none: moe_experts stages its tables and refuses it, named.
static void build_expert_tables(cuda_backend *cb, const moeq_model *model) {
    int E = model->config.n_routed_experts, n_main = model->config.num_hidden_layers;
    int n = n_main + model->n_mtp_layers;
    free(cb->moe_key);
    cudaFree(cb->moe_tab);
    cb->moe_key = NULL, cb->moe_tab = NULL, cb->n_moe = 0;
    if (E <= 0 || n <= 0) return;
    size_t per = (size_t)6 * (size_t)E;
    const void **h = (const void **)calloc((size_t)n * per, sizeof(void *));
    cb->moe_key = (const moeq_expert **)calloc((size_t)n, sizeof(*cb->moe_key));
    if (!h || !cb->moe_key) {
        free(h);
        fail(cb, MOEQ_ERR_NOMEM, "expert tables of %s MoE layers%s", "all", "");
        return;
    }
    for (int l = 0; l < n; l++) {
        const moeq_layer *L = l < n_main ? &model->layers[l] : &model->mtp_layers[l - n_main];
        if (!L->experts) continue;
        const void **row = h + (size_t)l * per;
        int ok = 1;
        for (int e = 0; e < E && ok; e++) {
            const moeq_tensor *w[3] = {L->experts[e].gate_proj, L->experts[e].up_proj, L->experts[e].down_proj};
            for (int i = 0; i < 3 && ok; i++) {
                ok = w[i] && w[i]->dtype == L->experts[0].gate_proj->dtype && (row[i * E + e] = wdev_or_null(cb, w[i]));
                int scaled = ok && w[i]->dtype == MOEQ_DTYPE_F8_E4M3 && w[i]->scale_inv;
                if (scaled) ok = (row[(3 + i) * E + e] = wdev_or_null(cb, w[i]->scale_inv)) != NULL;
            }
        }
        if (ok) cb->moe_key[l] = L->experts;
    }
    if (cu_ok(cb, cudaMalloc((void **)&cb->moe_tab, (size_t)n * per * sizeof(void *)), "cudaMalloc (expert tables)") &&
        cu_ok(cb, cudaMemcpyAsync(cb->moe_tab, h, (size_t)n * per * sizeof(void *), cudaMemcpyHostToDevice,
                                  cb->stream), "cudaMemcpyAsync (expert tables)"))
        drain(cb, "cudaStreamSynchronize (expert tables)");
    free(h);
    cb->n_moe = cb->err ? 0 : n;
}

static moeq_err cuda_map_weights(moeq_backend *b, const moeq_model *model, char *errstr, size_t errstr_size) {
    cuda_backend *cb = (cuda_backend *)b;
    if (model->config.n_routed_experts > MOEQ_CU_ROUTE_MAX_EXPERTS) // refused here, not at the first step
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "backend cuda: the router kernel takes at most %d routed experts, the model has %d",
                         MOEQ_CU_ROUTE_MAX_EXPERTS, model->config.n_routed_experts);
    cb->model = model;
    free(cb->wdev);
    if (!(cb->wdev = (void **)calloc((size_t)(model->n_tensors > 0 ? model->n_tensors : 1), sizeof(void *))))
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "backend cuda: tensor table");
    if (!mark_routed(cb, model)) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "backend cuda: tensor table");
    // one allocation for every tensor (a checkpoint has up to ~10^5 of them), each at a 256-byte offset; the main
    // layers' routed experts apart (map_experts: a rank of a group holds its own only)
    int f8 = 0;
    size_t total = 0;
    for (int i = 0; i < model->n_tensors; i++)
        if (!cb->routed[i]) total += STAGED(model->tensors[i].nbytes ? model->tensors[i].nbytes : 1);
    cudaFree(cb->wslab);
    cb->wslab = NULL;
    if (!cu_ok(cb, cudaMalloc((void **)&cb->wslab, total ? total : 1), "cudaMalloc (weights)"))
        return moeq_errf(cb->err, errstr, errstr_size, "backend cuda: %zu bytes of weights: %s", total, cb->why);
    cb->weight_bytes = 0;
    for (int i = 0; i < model->n_tensors && !cb->err; i++) {
        const moeq_tensor *t = &model->tensors[i];
        f8 |= t->dtype == MOEQ_DTYPE_F8_E4M3;
        if (cb->routed[i]) continue;
        cb->wdev[i] = cb->wslab + cb->weight_bytes;
        // on the backend's stream: a cudaMemcpy (legacy stream) from pageable memory returns before its last DMA
        // lands, and the non-blocking stream does not wait for the legacy one, so a first kernel could read it
        if (t->nbytes && !cu_ok(cb, cudaMemcpyAsync(cb->wdev[i], t->data, t->nbytes, cudaMemcpyHostToDevice,
                                                    cb->stream),
                                "cudaMemcpyAsync (weights)"))
            break;
        cb->weight_bytes += STAGED(t->nbytes ? t->nbytes : 1);
    }
    if (!cb->err) drain(cb, "cudaStreamSynchronize (weights)");
    char why[400] = "";
    if (!cb->err && !cb->p.experts_deferred && cuda_map_experts(b, model, NULL, why, sizeof why))
        return moeq_errf(cb->err ? cb->err : MOEQ_ERR_INTERNAL, errstr, errstr_size, "%s", why);
    if (!cb->err && cb->p.experts_deferred) build_expert_tables(cb, model); // the MTP layers' (map_experts': all)
    // the attention workspace for the model's shape, so that a step allocates nothing (it only grows past this)
    const moeq_model_config *c = &model->config;
    if (!cb->err && c->num_attention_heads > 0 && c->kv_lora_rank > 0) {
        size_t per_item = (size_t)c->num_attention_heads * (size_t)(c->kv_lora_rank + 2) * sizeof(float);
        size_t parts = (size_t)moeq_cu_split_max_parts(cb->p.max_ctx);
        size_t T = (size_t)(cb->p.max_tokens > 0 ? cb->p.max_tokens : 2048);
        size_t want = per_item * parts * T, floor = per_item * parts;
        ws_reserve(cb, want < ATTN_WS_BYTES ? want : floor > ATTN_WS_BYTES ? floor : ATTN_WS_BYTES);
    }
    if (cb->err)
        return moeq_errf(cb->err, errstr, errstr_size, "backend cuda: uploading %zu bytes of weights: %s",
                         cb->weight_bytes, cb->why);
    snprintf(cb->info + strlen(cb->info), sizeof cb->info - strlen(cb->info),
             "; weights %.1f MiB in their stored dtypes besides the main layers' routed experts (held %s)%s",
             (double)cb->weight_bytes / (1 << 20),
             cb->p.experts_deferred ? "from a group's join, only the rank's own" : "all, from creation",
             f8 ? " (F8 E4M3: dequantised with its 128x128 block scales, in the kernel or widened for cuBLAS)" : "");
    return MOEQ_OK;
}

// ---- memory and stream ---------------------------------------------------------------------------------------

static void *cuda_alloc(moeq_backend *b, moeq_buffer_kind kind, size_t bytes) {
    (void)kind;
    cuda_backend *cb = (cuda_backend *)b;
    void *p = NULL;
    if (!cu_ok(cb, cudaMalloc(&p, (bytes + 63) / 64 * 64 + (bytes == 0) * 64), "cudaMalloc (backend buffer)"))
        return NULL;
    return p;
}

static void cuda_release(moeq_backend *b, void *buffer) {
    if (buffer) cu_ok((cuda_backend *)b, cudaFree(buffer), "cudaFree");
}

static void cuda_upload(moeq_backend *b, void *dst, const void *host, size_t bytes) {
    cuda_backend *cb = (cuda_backend *)b;
    // pageable source: the call returns once the bytes are staged, so the caller may reuse its buffer
    if (!cb->err && bytes && !in_bracket(cb, "upload inside a captured step"))
        cu_ok(cb, cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, cb->stream), "cudaMemcpyAsync (upload)");
}

static void cuda_download(moeq_backend *b, void *host, const void *src, size_t bytes) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->err || !bytes || in_bracket(cb, "download inside a captured step")) return;
    if (cu_ok(cb, cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, cb->stream), "cudaMemcpyAsync (download)"))
        drain(cb, "cudaStreamSynchronize (download)");
}

static void cuda_copy(moeq_backend *b, void *dst, const void *src, size_t bytes) {
    cuda_backend *cb = (cuda_backend *)b;
    if (!cb->err && bytes && !replaying(cb))
        cu_ok(cb, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cb->stream), "cudaMemcpyAsync (copy)");
}

static void cuda_sync(moeq_backend *b) {
    cuda_backend *cb = (cuda_backend *)b;
    if (!cb->err && !in_bracket(cb, "sync inside a captured step")) drain(cb, "cudaStreamSynchronize (sync)");
}

// ---- matmul kernels --------------------------------------------------------------------------------------------

// Jobs of one weight, sizes and strides launched as one grid: job z of the run has y + z dy, x + z dx and weight
// rows from row0 + z drow (MLA's per-head products: one launch for the H heads, not H launches of a few us each).
typedef struct mm_z {
    int64_t dy, dx, drow;
} mm_z;

// NT, own order (ops.cuh's tiling) for weight rows [row0, row0 + O): y[t, o] = sum_k x[t, k] W[row0 + o, k].
template <int DT>
__global__ void mm_nt_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, const void *W, const float *scale,
                             int64_t K, int64_t row0, int64_t O, int64_t T, mm_z z) {
    y += blockIdx.z * z.dy, x += blockIdx.z * z.dx, row0 += blockIdx.z * z.drow;
    int64_t gy = moeq_cu_mm_grid_y(T);
    for (int64_t by = blockIdx.y; by < gy; by += gridDim.y) { // uniform per block: the shuffles stay whole
        moeq_cu_mm_at a = moeq_cu_mm_index(blockIdx.x, by, (int)threadIdx.x, T, O);
        float acc[MOEQ_CU_MM_TILE_T];
        if (a.nt > 0) {
            moeq_cu_mm_at aw = a;
            aw.o += row0; // the weight's row; the output column stays a.o
            moeq_cu_mm_lanes(acc, aw, x, ldx, DT, W, scale, K);
        } else
            for (int j = 0; j < MOEQ_CU_MM_TILE_T; j++) acc[j] = 0.0f;
#pragma unroll
        for (int j = 0; j < MOEQ_CU_MM_TILE_T; j++) {
            float v = moeq_cu_tree16_shfl(acc[j], 0xffffffffu);
            if (a.lane == 0 && j < a.nt) y[(a.t0 + j) * ldy + a.o] = v;
        }
    }
}

// One tile of the few-token NT for thread h of output column o (weight row wrow, valid while o < O): tokens
// t0 .. t0 + nt of x (row stride ldx) into y[(t0 + j) * ldy + o]. Every thread of the warp calls it: the shuffles.
template <int DT, int NT>
__device__ void mv_tile(float *y, int64_t ldy, const float *x, int64_t ldx, const void *W, const float *scale,
                        int64_t K, int64_t o, int64_t wrow, int64_t O, int64_t t0, int nt, int h) {
    float acc[NT * 8];
    if (o < O) moeq_cu_mv_lanes(acc, NT, nt, h, wrow, t0, x, ldx, DT, W, scale, K);
    else
#pragma unroll
        for (int i = 0; i < NT * 8; i++) acc[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float mine[8], other[8];
#pragma unroll
        for (int i = 0; i < 8; i++) mine[i] = acc[j * 8 + i], other[i] = __shfl_xor_sync(0xffffffffu, mine[i], 1);
        float v = h ? moeq_cu_mv_reduce(other, mine) : moeq_cu_mv_reduce(mine, other);
        if (o < O && j < nt && (j & 1) == h) y[(t0 + j) * ldy + o] = v; // the pair shares the stores
    }
}

// Few-token NT (ops.cuh's moeq_cu_mv_lanes): two threads a weight row, tiles of NT <= 8 tokens; the same bits as
// mm_nt_kernel. Thread pairs are adjacent lanes, so the butterfly's first level is one shuffle per lane.
template <int DT, int NT>
__global__ void mv_nt_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, const void *W, const float *scale,
                             int64_t K, int64_t row0, int64_t O, int64_t T, mm_z z) {
    y += blockIdx.z * z.dy, x += blockIdx.z * z.dx, row0 += blockIdx.z * z.drow;
    int64_t o = (int64_t)blockIdx.x * MOEQ_CU_MV_ROWS + threadIdx.x / 2;
    int h = (int)(threadIdx.x & 1);
    for (int64_t t0 = (int64_t)blockIdx.y * NT; t0 < T; t0 += (int64_t)gridDim.y * NT) // uniform per block
        mv_tile<DT, NT>(y, ldy, x, ldx, W, scale, K, o, row0 + o, O, t0, T - t0 < NT ? (int)(T - t0) : NT, h);
}

// A 32 x 32 tile of y (ops.cuh's many-token NT): weight rows o0 .. (valid below o_end, absolute), tokens t0 ..
// (below t_end) of x; y[(t) * ldy + (o - ycol0)]. The stages run in chunk order, so each lane's chain is in order.
template <int DT>
__device__ void mt_tile(float *y, int64_t ldy, int64_t ycol0, const float *x, int64_t ldx, const void *W,
                        const float *scale, int64_t K, int64_t o0, int64_t o_end, int64_t t0, int64_t t_end) {
    __shared__ float ws[MOEQ_CU_MT_ROWS * MOEQ_CU_MT_LD], xs[MOEQ_CU_MT_TOK * MOEQ_CU_MT_LD];
    int tid = (int)threadIdx.x, lane = tid % MOEQ_CU_LANES, g = tid / MOEQ_CU_LANES, gr = g % 4, gt = g / 4;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    for (int64_t c0 = 0, nc = moeq_cu_chunks(K); c0 < nc; c0 += MOEQ_CU_MT_CH) {
        __syncthreads(); // the last stage's reads are done
        moeq_cu_mt_stage(ws, xs, tid, MOEQ_CU_MT_THREADS, DT, W, scale, K, o0, o_end, x, ldx, t0, t_end, c0);
        __syncthreads();
        moeq_cu_mt_compute(acc, ws, xs, lane, gr, gt, moeq_cu_mt_stage_chunks(K, c0));
    }
#pragma unroll
    for (int q = 0; q < 64; q++) { // the butterfly over the half-warp's 16 lanes; lane q % 16 writes output q
        float v = moeq_cu_tree16_shfl(acc[q], 0xffffffffu);
        int64_t o = o0 + gr * 8 + q / 8, t = t0 + gt * 8 + q % 8;
        if (q % MOEQ_CU_LANES == lane && o < o_end && t < t_end) y[t * ldy + (o - ycol0)] = v;
    }
}

// Many-token NT over rows [row0, row0 + O) of W: block (bx, by) the tile of rows row0 + 32 bx .., tokens 32 by ...
template <int DT>
__global__ void __launch_bounds__(MOEQ_CU_MT_THREADS) mt_nt_kernel(float *y, int64_t ldy, const float *x,
                                                                   int64_t ldx, const void *W, const float *scale,
                                                                   int64_t K, int64_t row0, int64_t O, int64_t T,
                                                                   mm_z z) {
    y += blockIdx.z * z.dy, x += blockIdx.z * z.dx, row0 += blockIdx.z * z.drow;
    for (int64_t by = blockIdx.y; by * MOEQ_CU_MT_TOK < T; by += gridDim.y) // uniform per block
        mt_tile<DT>(y, ldy, row0, x, ldx, W, scale, K, row0 + (int64_t)blockIdx.x * MOEQ_CU_MT_ROWS, row0 + O,
                    by * MOEQ_CU_MT_TOK, T);
}

// NN, the CPU's order (one fma chain over the rows from 0): y[t, c] = sum_r x[t, r] W[row0 + r, c].
template <int DT>
__global__ void mm_nn_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, const void *W, const float *scale,
                             int64_t cols, int64_t row0, int64_t n_rows, int64_t T, mm_z z) {
    y += blockIdx.z * z.dy, x += blockIdx.z * z.dx, row0 += blockIdx.z * z.drow;
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        float acc = 0.0f;
        int64_t r = 0;
        // rows MOEQ_CU_MM_UNROLL at a time, their weights loaded before the chain uses them (the chain itself, one
        // fmaf per row in row order, is unchanged): a load in flight per row instead of one per thread
        for (; r + MOEQ_CU_MM_UNROLL <= n_rows; r += MOEQ_CU_MM_UNROLL) {
            float wv[MOEQ_CU_MM_UNROLL];
#pragma unroll
            for (int u = 0; u < MOEQ_CU_MM_UNROLL; u++) wv[u] = moeq_cu_widen(DT, W, scale, cols, row0 + r + u, c);
#pragma unroll
            for (int u = 0; u < MOEQ_CU_MM_UNROLL; u++) acc = fmaf(x[t * ldx + r + u], wv[u], acc);
        }
        for (; r < n_rows; r++) acc = fmaf(x[t * ldx + r], moeq_cu_widen(DT, W, scale, cols, row0 + r, c), acc);
        y[t * ldy + c] = acc;
    }
}

// Rows [row0, row0 + n) of a weight widened to float32 (the cuBLAS path).
__global__ void widen_kernel(float *out, int dtype, const void *W, const float *scale, int64_t cols, int64_t row0,
                             int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * cols) out[i] = moeq_cu_widen(dtype, W, scale, cols, row0 + i / cols, i % cols);
}

static unsigned blocks_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }
static unsigned grid_y_for(int64_t n) { return (unsigned)(n < 65535 ? (n > 0 ? n : 1) : 65535); }

// Whether the few-token kernels take a product: BF16/F8 weights, K a multiple of 16 (whole chunks), activations in
// 16-byte aligned rows (x, its row stride, and a run's step between jobs), and not switched off (cuda_matrix).
static int mv_takes(const cuda_backend *cb, int dtype, int64_t K, const float *x, int64_t ldx, int64_t dx) {
    return cb->mv && (dtype == MOEQ_DTYPE_BF16 || dtype == MOEQ_DTYPE_F8_E4M3) && K % MOEQ_CU_LANES == 0 &&
           (uintptr_t)x % 16 == 0 && ldx % 4 == 0 && dx % 4 == 0;
}

#define MV_THREADS (2 * MOEQ_CU_MV_ROWS)

template <int DT>
static void mv_nt(cuda_backend *cb, const moeq_mm_job *j, const void *W, const float *scale, int nz, mm_z z) {
    int64_t K = moeq_tensor_cols(j->w);
    dim3 grid((unsigned)((j->n_rows + MOEQ_CU_MV_ROWS - 1) / MOEQ_CU_MV_ROWS), 1, (unsigned)nz);
    cudaStream_t s = cb->stream;
#define MV_NT(NT)                                                                                                   \
    mv_nt_kernel<DT, NT><<<grid, MV_THREADS, 0, s>>>(j->y, j->ldy, j->x, j->ldx, W, scale, K, j->row0, j->n_rows,      \
                                                     j->n_tok, z)
    switch (moeq_cu_mv_tile(j->n_tok)) {
    case 1: MV_NT(1); break;
    case 2: MV_NT(2); break;
    case 4: MV_NT(4); break;
    default: MV_NT(8); break;
    }
#undef MV_NT
    launched(cb, "mv_nt_kernel launch");
}

// Whether the many-token kernels take a product of more than 8 tokens: not switched off (cuda_matrix), and F8
// tiles within one 128-row scale block (row0 a multiple of 32: every tile's 32 rows then are, as its rows'
// activations are scaled once a stage).
static int mt_takes(const cuda_backend *cb, int dtype, int64_t row0, int nz, int64_t drow) {
    return cb->mv && dtype != MOEQ_DTYPE_Q8R &&
           (dtype != MOEQ_DTYPE_F8_E4M3 || (row0 % MOEQ_CU_MT_ROWS == 0 && (nz < 2 || drow % MOEQ_CU_MT_ROWS == 0)));
}

static void mt_nt(cuda_backend *cb, const moeq_mm_job *j, const void *W, const float *scale, int nz, mm_z z) {
    int64_t K = moeq_tensor_cols(j->w);
    dim3 grid((unsigned)((j->n_rows + MOEQ_CU_MT_ROWS - 1) / MOEQ_CU_MT_ROWS),
              grid_y_for((j->n_tok + MOEQ_CU_MT_TOK - 1) / MOEQ_CU_MT_TOK), (unsigned)nz);
    cudaStream_t s = cb->stream;
#define MT_NT(DT)                                                                                                   \
    mt_nt_kernel<DT><<<grid, MOEQ_CU_MT_THREADS, 0, s>>>(j->y, j->ldy, j->x, j->ldx, W, scale, K, j->row0,           \
                                                         j->n_rows, j->n_tok, z)
    switch (j->w->dtype) {
    case MOEQ_DTYPE_F32: MT_NT(MOEQ_CU_DTYPE_F32); break;
    case MOEQ_DTYPE_BF16: MT_NT(MOEQ_CU_DTYPE_BF16); break;
    case MOEQ_DTYPE_F16: MT_NT(MOEQ_CU_DTYPE_F16); break;
    default: MT_NT(MOEQ_CU_DTYPE_F8_E4M3); break;
    }
#undef MT_NT
    launched(cb, "mt_nt_kernel launch");
}

static void own_nt(cuda_backend *cb, const moeq_mm_job *j, const void *W, const float *scale, int nz, mm_z z) {
    int64_t K = moeq_tensor_cols(j->w);
    if (j->n_tok <= MOEQ_CU_MV_MAX_TOK && mv_takes(cb, (int)j->w->dtype, K, j->x, j->ldx, nz > 1 ? z.dx : 0)) {
        if (j->w->dtype == MOEQ_DTYPE_BF16) mv_nt<MOEQ_CU_DTYPE_BF16>(cb, j, W, scale, nz, z);
        else mv_nt<MOEQ_CU_DTYPE_F8_E4M3>(cb, j, W, scale, nz, z);
        return;
    }
    if (j->n_tok > MOEQ_CU_MV_MAX_TOK && mt_takes(cb, (int)j->w->dtype, j->row0, nz, z.drow)) {
        mt_nt(cb, j, W, scale, nz, z);
        return;
    }
    dim3 grid((unsigned)moeq_cu_mm_grid_x(j->n_rows), grid_y_for(moeq_cu_mm_grid_y(j->n_tok)), (unsigned)nz);
    cudaStream_t s = cb->stream;
    switch (j->w->dtype) {
    case MOEQ_DTYPE_F32:
        mm_nt_kernel<MOEQ_CU_DTYPE_F32><<<grid, MOEQ_CU_MM_THREADS, 0, s>>>(j->y, j->ldy, j->x, j->ldx, W, scale, K,
                                                                           j->row0, j->n_rows, j->n_tok, z);
        break;
    case MOEQ_DTYPE_BF16:
        mm_nt_kernel<MOEQ_CU_DTYPE_BF16><<<grid, MOEQ_CU_MM_THREADS, 0, s>>>(j->y, j->ldy, j->x, j->ldx, W, scale, K,
                                                                            j->row0, j->n_rows, j->n_tok, z);
        break;
    case MOEQ_DTYPE_F16:
        mm_nt_kernel<MOEQ_CU_DTYPE_F16><<<grid, MOEQ_CU_MM_THREADS, 0, s>>>(j->y, j->ldy, j->x, j->ldx, W, scale, K,
                                                                           j->row0, j->n_rows, j->n_tok, z);
        break;
    case MOEQ_DTYPE_F8_E4M3:
        mm_nt_kernel<MOEQ_CU_DTYPE_F8_E4M3><<<grid, MOEQ_CU_MM_THREADS, 0, s>>>(j->y, j->ldy, j->x, j->ldx, W, scale,
                                                                               K, j->row0, j->n_rows, j->n_tok, z);
        break;    case MOEQ_DTYPE_Q8R: /* draft copies are made for host-visible backends only (engine/mtp.c) */
        fail(cb, MOEQ_ERR_INVALID_ARG, "%s: %s weights are CPU draft copies", "mm_nt", moeq_dtype_name(j->w->dtype));
        return;
    }
    launched(cb, "mm_nt_kernel launch");
}

static void own_nn(cuda_backend *cb, const moeq_mm_job *j, const void *W, const float *scale, int nz, mm_z z) {
    int64_t C = moeq_tensor_cols(j->w);
    dim3 grid(blocks_for(C, THREADS), grid_y_for(j->n_tok), (unsigned)nz);
    cudaStream_t s = cb->stream;
    switch (j->w->dtype) {
    case MOEQ_DTYPE_F32:
        mm_nn_kernel<MOEQ_CU_DTYPE_F32><<<grid, THREADS, 0, s>>>(j->y, j->ldy, j->x, j->ldx, W, scale, C, j->row0,
                                                                 j->n_rows, j->n_tok, z);
        break;
    case MOEQ_DTYPE_BF16:
        mm_nn_kernel<MOEQ_CU_DTYPE_BF16><<<grid, THREADS, 0, s>>>(j->y, j->ldy, j->x, j->ldx, W, scale, C, j->row0,
                                                                  j->n_rows, j->n_tok, z);
        break;
    case MOEQ_DTYPE_F16:
        mm_nn_kernel<MOEQ_CU_DTYPE_F16><<<grid, THREADS, 0, s>>>(j->y, j->ldy, j->x, j->ldx, W, scale, C, j->row0,
                                                                 j->n_rows, j->n_tok, z);
        break;
    case MOEQ_DTYPE_F8_E4M3:
        mm_nn_kernel<MOEQ_CU_DTYPE_F8_E4M3><<<grid, THREADS, 0, s>>>(j->y, j->ldy, j->x, j->ldx, W, scale, C, j->row0,
                                                                     j->n_rows, j->n_tok, z);
        break;    case MOEQ_DTYPE_Q8R: /* draft copies are made for host-visible backends only (engine/mtp.c) */
        fail(cb, MOEQ_ERR_INVALID_ARG, "%s: %s weights are CPU draft copies", "mm_nn", moeq_dtype_name(j->w->dtype));
        return;
    }
    launched(cb, "mm_nn_kernel launch");
}

// Rows [row0, row0 + n) of W as float32 on the device: the stored weight itself for F32, else widened into
// cb->wide (n * cols must fit).
static const float *wide_rows(cuda_backend *cb, const moeq_tensor *w, const void *W, const float *scale, int64_t row0,
                              int64_t n) {
    int64_t cols = moeq_tensor_cols(w);
    if (w->dtype == MOEQ_DTYPE_F32) return (const float *)W + row0 * cols;
    widen_kernel<<<blocks_for(n * cols, 256), 256, 0, cb->stream>>>(cb->wide, (int)w->dtype, W, scale, cols, row0, n);
    return launched(cb, "widen_kernel launch") ? cb->wide : NULL;
}

// Column-major view: y^T (N x T, ld ldy) = op(W rows) (N x K) * x^T (K x T, ld ldx).
static void blas_nt(cuda_backend *cb, const moeq_mm_job *j, const void *W, const float *scale) {
    int64_t K = moeq_tensor_cols(j->w), tile = (int64_t)(cb->wide_floats / (size_t)K);
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < j->n_rows && !cb->err; r0 += tile) {
        int64_t n = j->n_rows - r0 < tile ? j->n_rows - r0 : tile;
        const float *A = wide_rows(cb, j->w, W, scale, j->row0 + r0, n);
        if (!A) return;
        bl_ok(cb,
              cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)j->n_tok, (int)K, &one, A, (int)K, j->x,
                          (int)j->ldx, &zero, j->y + r0, (int)j->ldy),
              "cublasSgemm (NT)");
    }
}

// y^T (C x T) = W rows^T (C x R, col-major ld cols) * x^T (R x T); R split in tiles accumulated with beta 1.
static void blas_nn(cuda_backend *cb, const moeq_mm_job *j, const void *W, const float *scale) {
    int64_t C = moeq_tensor_cols(j->w), tile = (int64_t)(cb->wide_floats / (size_t)C);
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < j->n_rows && !cb->err; r0 += tile) {
        int64_t n = j->n_rows - r0 < tile ? j->n_rows - r0 : tile;
        const float *A = wide_rows(cb, j->w, W, scale, j->row0 + r0, n);
        if (!A) return;
        bl_ok(cb,
              cublasSgemm(cb->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)C, (int)j->n_tok, (int)n, &one, A, (int)C,
                          j->x + r0, (int)j->ldx, r0 ? &one : &zero, j->y, (int)j->ldy),
              "cublasSgemm (NN)");
    }
}

// cuBLAS only when every job has enough tokens and fits its int arguments (a choice per call, as the CPU's).
static int blas_for(const cuda_backend *cb, const moeq_mm_job *jobs, int n_jobs) {
    if (cb->p.batch_invariant || !cb->wide) return 0;
    for (int i = 0; i < n_jobs; i++) {
        int64_t cols = moeq_tensor_cols(jobs[i].w);
        if (jobs[i].n_tok < cb->p.blas_min_tokens || cols > (int64_t)cb->wide_floats || jobs[i].n_rows > INT32_MAX ||
            jobs[i].n_tok > INT32_MAX || jobs[i].ldx > INT32_MAX || jobs[i].ldy > INT32_MAX)
            return 0;
    }
    return 1;
}

// How many jobs from jobs[0] one grid takes (*z: their strides): those of the same weight and sizes whose y, x
// and row0 step by the same amounts. Each element is then computed exactly as by a launch of its own.
static int same_grid(const moeq_mm_job *jobs, int n, mm_z *z) {
    *z = (mm_z){0, 0, 0};
    if (n < 2) return 1;
    const moeq_mm_job *a = &jobs[0], *b = &jobs[1];
    mm_z d = {b->y - a->y, b->x - a->x, b->row0 - a->row0};
    int k = 1;
    while (k < n && k < 65535) {
        const moeq_mm_job *p = &jobs[k - 1], *q = &jobs[k];
        if (q->w != a->w || q->n_rows != a->n_rows || q->n_tok != a->n_tok || q->ldx != a->ldx || q->ldy != a->ldy ||
            q->y - p->y != d.dy || q->x - p->x != d.dx || q->row0 - p->row0 != d.drow)
            break;
        k++;
    }
    if (k > 1) *z = d;
    return k;
}

static void run_jobs(cuda_backend *cb, const moeq_mm_job *jobs, int n_jobs, int nn) {
    if (cb->err || n_jobs <= 0 || replaying(cb)) return;
    int blas = blas_for(cb, jobs, n_jobs);
    for (int i = 0, nz; i < n_jobs && !cb->err; i += nz) {
        const moeq_mm_job *j = &jobs[i];
        nz = 1;
        if (j->n_tok <= 0 || j->n_rows <= 0) continue;
        const void *W = wdev(cb, j->w);
        const float *scale = W ? scale_dev(cb, j->w) : NULL;
        if (!W || (j->w->dtype == MOEQ_DTYPE_F8_E4M3 && j->w->scale_inv && !scale)) return;
        if (blas) {
            nn ? blas_nn(cb, j, W, scale) : blas_nt(cb, j, W, scale);
            continue;
        }
        mm_z z;
        nz = same_grid(j, n_jobs - i, &z);
        nn ? own_nn(cb, j, W, scale, nz, z) : own_nt(cb, j, W, scale, nz, z);
    }
}

static void cuda_matmul(moeq_backend *b, const moeq_mm_job *jobs, int n_jobs) {
    run_jobs((cuda_backend *)b, jobs, n_jobs, 0);
}

static void cuda_matmul_nn(moeq_backend *b, const moeq_mm_job *jobs, int n_jobs) {
    run_jobs((cuda_backend *)b, jobs, n_jobs, 1);
}

// ---- the paged cache on the device -----------------------------------------------------------------------------

typedef struct kv_dev {
    float *pool;
    size_t block_floats, layer_offset;
    int block_tokens, entry_floats;
    const int32_t *row_off, *ctab; // device: each token's compact block-table row
} kv_dev;

// Entries of the compact table of a call, exactly (a per-token sum would be quadratic in a prefill chunk: at
// long contexts it filled the staging every layer or two, each time a drain of the stream).
static int64_t kv_bound(const moeq_kv_paged *kv, const int32_t *seq, const int64_t *pos, int64_t T) {
    int64_t cap = moeq_cu_kv_compact_entries(seq, pos, T, kv->block_tokens);
    return cap > 0 ? cap : 1;
}

// Staging kv_upload takes.
static size_t kv_staged(const moeq_kv_paged *kv, const int32_t *seq, const int64_t *pos, int64_t T) {
    return STAGED((size_t)T * sizeof(int32_t)) + STAGED((size_t)kv_bound(kv, seq, pos, T) * sizeof(int32_t));
}

// The call's compact block table (backend_index.cuh) on the device, in regions reserved by the caller.
static int kv_upload(cuda_backend *cb, const moeq_kv_paged *kv, const int32_t *seq, const int64_t *pos, int64_t T,
                     kv_dev *out) {
    int64_t cap = kv_bound(kv, seq, pos, T);
    void *d_off = NULL, *d_tab = NULL;
    int32_t *h_off = (int32_t *)stage(cb, (size_t)T * sizeof(int32_t), &d_off);
    int32_t *h_tab = h_off ? (int32_t *)stage(cb, (size_t)cap * sizeof(int32_t), &d_tab) : NULL;
    if (!h_tab) return 0;
    int64_t used = moeq_cu_kv_compact(kv->block_table, kv->table_stride, seq, pos, T, kv->block_tokens, h_off, h_tab,
                                      cap);
    if (used < 0) {
        fail(cb, MOEQ_ERR_INTERNAL, "compact block table larger than its bound%s%s", "", "");
        return 0;
    }
    if (!h2d(cb, d_off, h_off, (size_t)T * sizeof(int32_t), "cudaMemcpyAsync (block table rows)") ||
        !h2d(cb, d_tab, h_tab, (size_t)used * sizeof(int32_t), "cudaMemcpyAsync (block table)"))
        return 0;
    kv_dev k = {kv->pool, kv->block_floats, kv->layer_offset, kv->block_tokens, kv->entry_floats,
                (const int32_t *)d_off, (const int32_t *)d_tab};
    *out = k;
    return 1;
}

// An allocation for CUDA graphs alone (fixed tables, a bucket's staging): they come at a step's first use, after
// the latent cache took its share of the device, so running out is a reason to run that step eagerly, kept for
// describe(), not a failure of the backend. The allocation error is not sticky; it is cleared here.
static int graph_alloc(cuda_backend *cb, void **p, size_t bytes, int pinned, const char *what) {
    cudaError_t e = pinned ? cudaHostAlloc(p, bytes, cudaHostAllocDefault) : cudaMalloc(p, bytes);
    if (e == cudaSuccess) return 1;
    *p = NULL;
    (void)cudaGetLastError();
    if (!cb->graph_why[0])
        snprintf(cb->graph_why, sizeof cb->graph_why, "%s (%zu bytes): %s; those steps run eagerly", what, bytes,
                 cudaGetErrorString(e));
    return 0;
}

// The fixed-stride tables' buffers, set up by the first call that takes them (the block size is the cache's,
// known only then; outside any step's timing that matters: one cudaMalloc per buffer, once). 0: not usable for
// block_tokens (its stride is past the buffers', or they could not be made).
static int fixed_ready(cuda_backend *cb, int block_tokens) {
    int64_t S = moeq_cu_kv_fixed_stride(cb->p.max_ctx, block_tokens), R = MOEQ_CU_GRAPH_LARGEST;
    if (cb->fstride) return cb->fstride > 0 && S <= cb->fstride;
    int32_t *off = (int32_t *)malloc((size_t)R * sizeof(int32_t));
    cb->ftab_h = (int32_t *)calloc((size_t)(R * S), sizeof(int32_t));
    cb->fcand_h = (int32_t *)calloc((size_t)(R * S), sizeof(int32_t));
    cb->fnb_h = (int64_t *)calloc((size_t)R, sizeof(int64_t));
    cb->fdiff_h = (uint8_t *)calloc((size_t)R, 1);
    if (!off || !cb->ftab_h || !cb->fcand_h || !cb->fnb_h || !cb->fdiff_h ||
        moeq_cu_kv_fixed_offsets(R, S, off) < 0) {
        free(off);
        cb->fstride = -1; // the compact tables serve every call
        return 0;
    }
    int ok = graph_alloc(cb, (void **)&cb->ftab_d, (size_t)(R * S) * sizeof(int32_t), 0, "cudaMalloc (fixed tables)") &&
             graph_alloc(cb, (void **)&cb->frow_d, (size_t)R * sizeof(int32_t), 0, "cudaMalloc (fixed rows)") &&
             graph_alloc(cb, (void **)&cb->fplan_d, (size_t)(2 * R + 1) * sizeof(int32_t), 0,
                         "cudaMalloc (device split plan)") &&
             cu_ok(cb, cudaMemcpyAsync(cb->frow_d, off, (size_t)R * sizeof(int32_t), cudaMemcpyHostToDevice,
                                       cb->stream), "cudaMemcpyAsync (fixed rows)");
    free(off); // a pageable source is staged before cudaMemcpyAsync returns
    cb->fstride = ok ? S : -1;
    return ok;
}

// Rows [0, T) of the fixed table for these tokens (rows past n_valid: padding, the scratch block at position 0),
// filled on the host and compared with what the device holds (ftab_h mirrors ftab_d on each row's first fnb_h
// entries): each run of rows that differ goes up whole in one copy, or in pieces past the staging (ordered on the
// stream after the kernels still reading them). Never inside a bracket (graph_begin syncs before it). 0: not usable
// (a position past the stride, staging failed).
static int fixed_sync(cuda_backend *cb, const int32_t *block_table, int64_t table_stride, int block_tokens,
                      const int32_t *seq, const int64_t *pos, int64_t n_valid, int64_t T, int32_t scratch) {
    int64_t S = cb->fstride, t = 0, t0, t1;
    size_t row = (size_t)S * sizeof(int32_t), bytes = 0;
    int64_t per = (int64_t)(cb->stage_cap / STAGED(row)); // rows one piece may take when the runs pass the staging
    if (moeq_cu_kv_fixed_fill(block_table, table_stride, seq, pos, n_valid, T, block_tokens, S, scratch,
                              cb->fcand_h) < 0)
        return 0;
    if (!moeq_cu_kv_fixed_diff(cb->fcand_h, cb->ftab_h, cb->fnb_h, pos, T, block_tokens, S, cb->fdiff_h)) return 1;
    while (moeq_cu_kv_fixed_run(cb->fdiff_h, T, &t, &t0, &t1)) bytes += STAGED((size_t)(t1 - t0) * row);
    // every run's region at once; past the whole staging (a large batch's first step on a large cache: 256 rows of
    // 1 MiB at 4M cache tokens in 16-token blocks, against 128 MiB of staging; one reservation of it failed the
    // backend with LIMIT), pieces of `per` rows, each reserved alone: the copies go straight to ftab_d and no kernel
    // reads the staging's twin, so a drain between pieces rewrites nothing still read
    int whole = bytes <= cb->stage_cap;
    if (whole && !stage_reserve(cb, bytes)) return 0;
    for (t = 0; moeq_cu_kv_fixed_run(cb->fdiff_h, T, &t, &t0, &t1);)
        for (int64_t r0 = t0, r1; r0 < t1; r0 = r1) {
            r1 = whole ? t1 : moeq_cu_kv_fixed_piece(r0, t1, per);
            size_t n = (size_t)(r1 - r0) * row;
            if (!whole && !stage_reserve(cb, STAGED(n))) return 0;
            void *d = NULL, *h = stage(cb, n, &d);
            if (!h) return 0;
            memcpy(h, cb->fcand_h + r0 * S, n);
            if (!h2d(cb, cb->ftab_d + r0 * S, h, n, "cudaMemcpyAsync (fixed block table rows)")) return 0;
            memcpy(cb->ftab_h + r0 * S, cb->fcand_h + r0 * S, n);
            for (int64_t r = r0; r < r1; r++) cb->fnb_h[r] = S; // the whole row is now the mirror's
        }
    return 1;
}

// The call's fixed-stride table (graph_index.cuh) when cuda_graphs is on and T <= MOEQ_CU_GRAPH_LARGEST, synced
// before the caller stages anything of its own. 0: not this path (the caller takes the compact table).
static int kv_fixed(cuda_backend *cb, const moeq_kv_paged *kv, const int32_t *seq, const int64_t *pos, int64_t T,
                    kv_dev *out) {
    if (!cb->p.graphs || cb->err || T < 1 || T > MOEQ_CU_GRAPH_LARGEST || !fixed_ready(cb, kv->block_tokens))
        return 0;
    if (cb->br.mode) { // graph_begin synced the step's table: the same arrays find it, without a host pass
        if (cb->br.n_rows != T || kv->block_table != cb->br.table || seq != cb->br.seq || pos != cb->br.pos)
            return in_bracket(cb, "a call on another block table or tokens than its bracket's"), 0;
    } else if (!fixed_sync(cb, kv->block_table, kv->table_stride, kv->block_tokens, seq, pos, T, T, 0))
        return 0;
    kv_dev k = {kv->pool, kv->block_floats, kv->layer_offset, kv->block_tokens, kv->entry_floats, cb->frow_d,
                cb->ftab_d};
    *out = k;
    return 1;
}

__device__ __forceinline__ const float *kv_entry(const kv_dev &kv, int64_t t, int64_t pos) {
    return kv.pool + moeq_cu_kv_entry_offset(kv.ctab + kv.row_off[t], pos, kv.block_tokens, kv.block_floats,
                                             kv.layer_offset, kv.entry_floats);
}

// ---- attention: split-KV partials, then the merge ---------------------------------------------------------------

// One partition of one token for head blockIdx.y: its partial (m, l, unnormalised o) into slot it.slot.
__device__ __forceinline__ void attn_partial_item(const moeq_cu_split_item it, const kv_dev &kv, const float *q_lat,
                                                  const float *q_pe, int H, int L, int R, float scale, float *ws_o,
                                                  float *ws_ml) {
    __shared__ float sc[MOEQ_CU_SPLIT_MAX_ROWS];
    __shared__ size_t off[MOEQ_CU_SPLIT_MAX_ROWS]; // each row's entry in the pool, found once (24 KiB in all)
    __shared__ float sh_m, sh_l;
    int h = blockIdx.y, tid = threadIdx.x, lane = tid % MOEQ_CU_LANES, hw = tid / MOEQ_CU_LANES;
    int n_hw = blockDim.x / MOEQ_CU_LANES, n = it.j1 - it.j0;
    const float *ql = q_lat + ((int64_t)it.t * H + h) * L, *qp = q_pe + ((int64_t)it.t * H + h) * R;
    const int32_t *row = kv.ctab + kv.row_off[it.t];
    for (int j = tid; j < n; j += blockDim.x)
        off[j] = moeq_cu_kv_entry_offset(row, it.j0 + j, kv.block_tokens, kv.block_floats, kv.layer_offset,
                                         kv.entry_floats);
    __syncthreads();
    for (int jj = 0; jj < n; jj += n_hw) { // every thread takes each step: the half-warps' shuffles stay whole
        int j = jj + hw, active = j < n;
        float v = active ? moeq_cu_score_lane(ql, qp, kv.pool + off[j], L, R, lane) : 0.0f;
        v = moeq_cu_tree16_shfl(v, 0xffffffffu);
        if (active && lane == 0) sc[j] = v * scale;
    }
    __syncthreads();
    if (tid == 0) sh_m = moeq_cu_split_max(sc, n);
    __syncthreads();
    float m = sh_m;
    for (int j = tid; j < n; j += blockDim.x) sc[j] = moeq_cu_exp_nonpos(sc[j] - m);
    __syncthreads();
    if (tid < MOEQ_CU_LANES) {
        float v = moeq_cu_tree16_shfl(moeq_cu_split_sum_lane(sc, n, tid), 0xffffu);
        if (tid == 0) sh_l = v;
    }
    float *o = ws_o + ((int64_t)it.slot * H + h) * L;
    for (int d = tid; d < L; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc = fmaf(sc[j], kv.pool[off[j] + d], acc);
        o[d] = acc;
    }
    __syncthreads();
    if (tid == 0) {
        ws_ml[((int64_t)it.slot * H + h) * 2] = m;
        ws_ml[((int64_t)it.slot * H + h) * 2 + 1] = sh_l;
    }
}

// The host's plan: block x takes items[x].
__global__ void attn_partial_kernel(const moeq_cu_split_item *items, kv_dev kv, const float *q_lat, const float *q_pe,
                                    int H, int L, int R, float scale, float *ws_o, float *ws_ml) {
    attn_partial_item(items[blockIdx.x], kv, q_lat, q_pe, H, L, R, scale, ws_o, ws_ml);
}

// The plan on the device (graph_index.cuh), one thread: each token's first slot and partitions, and the total.
__global__ void split_plan_kernel(const int64_t *pos, int64_t T, int32_t *first, int32_t *count, int32_t *total) {
    if (threadIdx.x == 0 && blockIdx.x == 0) moeq_cu_split_scan(pos, T, first, count, total);
}

// The capacity grid: block x finds item x of the device's plan (the host plan's items[x]) or, past the last
// item, idles (the whole block, before any barrier). The launch depends on T and the capacity alone.
__global__ void attn_partial_cap_kernel(const int64_t *pos, const int32_t *first, const int32_t *count,
                                        const int32_t *total, int64_t T, kv_dev kv, const float *q_lat,
                                        const float *q_pe, int H, int L, int R, float scale, float *ws_o,
                                        float *ws_ml) {
    moeq_cu_split_item it;
    if (!moeq_cu_split_find(pos, first, count, T, *total, blockIdx.x, &it)) return;
    attn_partial_item(it, kv, q_lat, q_pe, H, L, R, scale, ws_o, ws_ml);
}

// One (token, head): its partitions' partials merged into out_lat. Dynamic shared: 3 * max parts floats.
__global__ void attn_merge_kernel(const int32_t *first, const int32_t *count, int64_t t0, int H, int L,
                                  const float *ws_o, const float *ws_ml, float *out_lat) {
    extern __shared__ float sh[];
    __shared__ float sh_L;
    int64_t tl = blockIdx.x;
    int h = blockIdx.y, f = first[tl], P = count[tl];
    float *m = sh, *l = sh + P, *a = sh + 2 * P;
    if (threadIdx.x == 0) {
        for (int p = 0; p < P; p++) {
            m[p] = ws_ml[((int64_t)(f + p) * H + h) * 2];
            l[p] = ws_ml[((int64_t)(f + p) * H + h) * 2 + 1];
        }
        sh_L = moeq_cu_split_merge_scales(m, l, P, a);
    }
    __syncthreads();
    const float *o = ws_o + ((int64_t)f * H + h) * L;
    float *out = out_lat + ((t0 + tl) * H + h) * L;
    for (int d = threadIdx.x; d < L; d += blockDim.x)
        out[d] = moeq_cu_split_merge_elem(o, (int64_t)H * L, a, P, sh_L, d);
}

static int ws_reserve(cuda_backend *cb, size_t bytes) {
    if (bytes <= cb->ws_bytes) return 1;
    if (in_bracket(cb, "the attention workspace grew inside a captured step")) return 0;
    if (cb->ws) {
        drain(cb, "cudaStreamSynchronize (attention workspace)");
        // graphs captured on the old workspace would replay into freed memory: captured again at their next step
        // (map_weights reserves the most max_tokens and max_ctx need, so this is not expected to happen)
        for (int i = 0; i < cb->n_gb; i++)
            if (cb->gb[i].exec) cudaGraphExecDestroy(cb->gb[i].exec), cb->gb[i].exec = NULL, cb->gb[i].n_regions = 0;
        cu_ok(cb, cudaFree(cb->ws), "cudaFree (attention workspace)");
        cb->ws = NULL, cb->ws_bytes = 0;
    }
    if (cb->err || !cu_ok(cb, cudaMalloc((void **)&cb->ws, bytes), "cudaMalloc (attention workspace)")) return 0;
    cb->ws_bytes = bytes;
    return 1;
}

// Attention on the capacity grid (cuda_graphs): the positions staged, the plan computed on the device
// (split_plan_kernel), the partials over min(T x the most partitions of max_ctx, what the workspace holds) blocks,
// idle past the plan's items, the merge per (token, head): every launch shaped by T and capacities alone, and the
// host plan's items, slots and merge order, so the eager path's bits. 0 (nothing staged): a step whose partitions
// pass the capacity, or a merge past its shared memory; the caller runs the host plan.
static int attention_cap(cuda_backend *cb, const moeq_mla_params *a, const kv_dev *kv, size_t per_item) {
    int64_t T = a->n_tok, ws_items = (int64_t)(cb->ws_bytes / per_item);
    int H = a->n_heads, L = a->kv_lora, R = a->rope, max_parts = moeq_cu_split_max_parts(cb->p.max_ctx);
    int64_t cap = moeq_cu_split_item_cap(T, cb->p.max_ctx, ws_items);
    if (max_parts * 3 * sizeof(float) > 48 * 1024 || moeq_cu_split_items(a->pos, T) > cap || cap > INT32_MAX)
        return 0;
    size_t pos_bytes = (size_t)T * sizeof(int64_t);
    if (!stage_reserve(cb, STAGED(pos_bytes))) return 1;
    const int64_t *pos = (const int64_t *)stage_up(cb, a->pos, pos_bytes, "cudaMemcpyAsync (positions)");
    if (!pos || replaying(cb)) return 1;
    int32_t *first = cb->fplan_d, *count = first + MOEQ_CU_GRAPH_LARGEST, *total = count + MOEQ_CU_GRAPH_LARGEST;
    float *ws_o = cb->ws, *ws_ml = cb->ws + (size_t)ws_items * H * L;
    split_plan_kernel<<<1, 32, 0, cb->stream>>>(pos, T, first, count, total);
    if (!launched(cb, "split_plan_kernel launch")) return 1;
    attn_partial_cap_kernel<<<dim3((unsigned)cap, (unsigned)H), THREADS, 0, cb->stream>>>(
        pos, first, count, total, T, *kv, a->q_lat, a->q_pe, H, L, R, a->scale, ws_o, ws_ml);
    if (!launched(cb, "attn_partial_cap_kernel launch")) return 1;
    attn_merge_kernel<<<dim3((unsigned)T, (unsigned)H), THREADS, 3 * max_parts * sizeof(float), cb->stream>>>(
        first, count, 0, H, L, ws_o, ws_ml, a->out_lat);
    launched(cb, "attn_merge_kernel launch (capacity grid)");
    return 1;
}

static void cuda_attention(moeq_backend *b, const moeq_mla_params *a) {
    cuda_backend *cb = (cuda_backend *)b;
    int64_t T = a->n_tok;
    int H = a->n_heads, L = a->kv_lora, R = a->rope;
    if (cb->err || T <= 0) return;
    int max_parts = 1;
    int64_t all_items = 0;
    for (int64_t t = 0; t < T; t++) {
        int p = moeq_cu_split_parts(a->pos[t] + 1);
        max_parts = p > max_parts ? p : max_parts;
        all_items += p;
    }
    if (max_parts * 3 * sizeof(float) > 48 * 1024) {
        fail(cb, MOEQ_ERR_LIMIT, "attention: a context of %s partitions exceeds the merge kernel's %s", "many",
             "4096");
        return;
    }
    // the workspace first: growing it drains the stream, which frees the staging for reuse
    size_t per_item = (size_t)H * (size_t)(L + 2) * sizeof(float);
    size_t want = per_item * (size_t)max_parts * (size_t)T;
    if (!ws_reserve(cb, want < ATTN_WS_BYTES ? want : (per_item * max_parts > ATTN_WS_BYTES ? per_item * max_parts
                                                                                           : ATTN_WS_BYTES)))
        return;
    kv_dev kv;
    int fixed = kv_fixed(cb, &a->kv, a->seq, a->pos, T, &kv); // its table is in device memory of its own
    if (fixed && attention_cap(cb, a, &kv, per_item)) return;
    if (fixed && cb->br.mode && !cb->br.broken) cb->br.transient = 1; // a later step may fit: capture it then
    if (in_bracket(cb, "attention past the capacity grid (contexts past the workspace) in a captured step")) return;
    // the block table and every chunk's plan in one reservation: a drain between them would let a later
    // region overwrite the table while the chunks' kernels still read it
    // (each chunk's three regions round up: at most one chunk per token)
    size_t plan = STAGED((size_t)all_items * sizeof(moeq_cu_split_item)) + 2 * STAGED((size_t)T * sizeof(int32_t));
    if (!stage_reserve(cb, (fixed ? 0 : kv_staged(&a->kv, a->seq, a->pos, T)) + plan + (size_t)T * 3 * STAGE_ALIGN))
        return;
    if (!fixed && !kv_upload(cb, &a->kv, a->seq, a->pos, T, &kv)) return;
    int64_t cap = (int64_t)(cb->ws_bytes / per_item);
    float *ws_o = cb->ws, *ws_ml = cb->ws + (size_t)cap * H * L;
    for (int64_t t0 = 0; t0 < T && !cb->err;) {
        int64_t t1 = t0, n_items = 0;
        while (t1 < T && n_items + moeq_cu_split_parts(a->pos[t1] + 1) <= cap)
            n_items += moeq_cu_split_parts(a->pos[t1++] + 1);
        void *d_items = NULL, *d_first = NULL, *d_count = NULL;
        moeq_cu_split_item *items =
            (moeq_cu_split_item *)stage(cb, (size_t)n_items * sizeof(moeq_cu_split_item), &d_items);
        int32_t *first = items ? (int32_t *)stage(cb, (size_t)(t1 - t0) * sizeof(int32_t), &d_first) : NULL;
        int32_t *count = first ? (int32_t *)stage(cb, (size_t)(t1 - t0) * sizeof(int32_t), &d_count) : NULL;
        if (!count) return;
        moeq_cu_split_plan(a->pos, t0, t1, items, first, count, n_items);
        if (!h2d(cb, d_items, items, (size_t)n_items * sizeof(moeq_cu_split_item), "cudaMemcpyAsync (split plan)") ||
            !h2d(cb, d_first, first, (size_t)(t1 - t0) * sizeof(int32_t), "cudaMemcpyAsync (split firsts)") ||
            !h2d(cb, d_count, count, (size_t)(t1 - t0) * sizeof(int32_t), "cudaMemcpyAsync (split counts)"))
            return;
        attn_partial_kernel<<<dim3((unsigned)n_items, (unsigned)H), THREADS, 0, cb->stream>>>(
            (const moeq_cu_split_item *)d_items, kv, a->q_lat, a->q_pe, H, L, R, a->scale, ws_o, ws_ml);
        if (!launched(cb, "attn_partial_kernel launch")) return;
        attn_merge_kernel<<<dim3((unsigned)(t1 - t0), (unsigned)H), THREADS, 3 * max_parts * sizeof(float),
                            cb->stream>>>((const int32_t *)d_first, (const int32_t *)d_count, t0, H, L, ws_o, ws_ml,
                                          a->out_lat);
        if (!launched(cb, "attn_merge_kernel launch")) return;
        t0 = t1;
    }
}

// Naive MLA (tests): per (token, head) an online softmax over the context with K and V expanded through kv_b
// on the fly. Dynamic shared: nope + v + THREADS floats.
__global__ void attn_naive_kernel(kv_dev kv, const int64_t *pos, int dtype, const void *W, const float *scale_inv,
                                  int H, int nope, int V, int L, int R, float scale, const float *q, const float *q_pe,
                                  float *out_v) {
    extern __shared__ float sh[];
    float *acc = sh, *red = sh + V;
    __shared__ float sh_m, sh_l, sh_s;
    int64_t t = blockIdx.x;
    int h = blockIdx.y, tid = threadIdx.x;
    const float *qn = q + (t * H + h) * (nope + R), *qp = q_pe + (t * H + h) * R;
    for (int d = tid; d < V; d += blockDim.x) acc[d] = 0.0f;
    if (tid == 0) sh_m = -INFINITY, sh_l = 0.0f;
    __syncthreads();
    for (int64_t j = 0; j <= pos[t]; j++) {
        const float *c = kv_entry(kv, t, j);
        float part = 0.0f;
        for (int i = tid; i < nope; i += blockDim.x) {
            float k = 0.0f;
            for (int r = 0; r < L; r++)
                k = fmaf(moeq_cu_widen(dtype, W, scale_inv, L, (int64_t)h * (nope + V) + i, r), c[r], k);
            part = fmaf(qn[i], k, part);
        }
        for (int i = tid; i < R; i += blockDim.x) part = fmaf(qp[i], c[L + i], part);
        red[tid] = part;
        __syncthreads();
        if (tid == 0) {
            float s = 0.0f;
            for (int i = 0; i < (int)blockDim.x; i++) s += red[i];
            sh_s = s * scale;
        }
        __syncthreads();
        float s = sh_s, m_new = fmaxf(sh_m, s), alpha = expf(sh_m - m_new), p = expf(s - m_new);
        for (int d = tid; d < V; d += blockDim.x) {
            float v = 0.0f;
            for (int r = 0; r < L; r++)
                v = fmaf(moeq_cu_widen(dtype, W, scale_inv, L, (int64_t)h * (nope + V) + nope + d, r), c[r], v);
            acc[d] = acc[d] * alpha + p * v;
        }
        __syncthreads();
        if (tid == 0) sh_l = sh_l * alpha + p, sh_m = m_new;
        __syncthreads();
    }
    for (int d = tid; d < V; d += blockDim.x) out_v[(t * H + h) * V + d] = acc[d] / sh_l;
}

static void cuda_attention_naive(moeq_backend *b, const moeq_mla_naive_params *a) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->err || a->n_tok <= 0 || in_bracket(cb, "naive attention in a captured step")) return;
    kv_dev kv;
    size_t pos_bytes = (size_t)a->n_tok * sizeof(int64_t);
    if (!stage_reserve(cb, STAGED(pos_bytes) + kv_staged(&a->kv, a->seq, a->pos, a->n_tok))) return;
    const int64_t *pos = (const int64_t *)stage_up(cb, a->pos, pos_bytes, "cudaMemcpyAsync (positions)");
    if (!pos || !kv_upload(cb, &a->kv, a->seq, a->pos, a->n_tok, &kv)) return;
    const void *W = wdev(cb, a->kv_b);
    if (!W) return;
    attn_naive_kernel<<<dim3((unsigned)a->n_tok, (unsigned)a->n_heads), THREADS,
                        (size_t)(a->v_dim + THREADS) * sizeof(float), cb->stream>>>(
        kv, pos, (int)a->kv_b->dtype, W, scale_dev(cb, a->kv_b), a->n_heads, a->nope, a->v_dim, a->kv_lora, a->rope,
        a->scale, a->q, a->q_pe, a->out_v);
    launched(cb, "attn_naive_kernel launch");
}

// ---- per-row ops --------------------------------------------------------------------------------------------------

__global__ void embed_kernel(float *out, const int32_t *ids, int dtype, const void *W, const float *scale, int64_t D) {
    int64_t t = blockIdx.y, d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (d < D) out[t * D + d] = moeq_cu_widen(dtype, W, scale, D, ids[t], d);
}

static void cuda_embed(moeq_backend *b, const moeq_tensor *table, const int32_t *ids, int64_t n, float *out) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->err || n <= 0) return;
    int64_t D = moeq_tensor_cols(table);
    const int32_t *d_ids =
        (const int32_t *)stage_up_alone(cb, ids, (size_t)n * sizeof(int32_t), "cudaMemcpyAsync (token ids)");
    const void *W = d_ids ? wdev(cb, table) : NULL;
    if (!W || replaying(cb)) return;
    for (int64_t t0 = 0; t0 < n && !cb->err; t0 += 65535) {
        int64_t nt = n - t0 < 65535 ? n - t0 : 65535;
        embed_kernel<<<dim3(blocks_for(D, 256), (unsigned)nt), 256, 0, cb->stream>>>(out + t0 * D, d_ids + t0,
                                                                                     (int)table->dtype, W,
                                                                                     scale_dev(cb, table), D);
        launched(cb, "embed_kernel launch");
    }
}

// moeq_ops_rmsnorm per row: 16 threads hold the lanes of the sum of squares, the tree as a butterfly.
__global__ void rmsnorm_rows_kernel(float *out, int64_t ld_out, const float *x, int64_t ldx, const int64_t *rows,
                                    int64_t n, const float *w, float eps) {
    int64_t r = blockIdx.x;
    const float *xr = x + (rows ? rows[r] : r) * ldx;
    float *yr = out + r * ld_out;
    __shared__ float f;
    if (threadIdx.x < MOEQ_CU_LANES) {
        float v = moeq_cu_tree16_shfl(moeq_cu_dot_lane(xr, xr, n, (int)threadIdx.x), 0xffffu);
        if (threadIdx.x == 0) f = moeq_cu_rmsnorm_factor(v, n, eps);
    }
    __syncthreads(); // out may be x: every element is read before it is written, by the same thread
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = moeq_cu_rmsnorm_elem(xr[i], w[i], f);
}

static void cuda_rmsnorm(moeq_backend *b, const moeq_rmsnorm_params *p) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->err || p->n_rows <= 0) return;
    const int64_t *rows = NULL;
    if (p->rows && !(rows = (const int64_t *)stage_up_alone(cb, p->rows, (size_t)p->n_rows * sizeof(int64_t),
                                                      "cudaMemcpyAsync (rmsnorm rows)")))
        return;
    if (replaying(cb)) return;
    for (int64_t r0 = 0; r0 < p->n_rows && !cb->err; r0 += INT32_MAX) {
        int64_t nr = p->n_rows - r0 < INT32_MAX ? p->n_rows - r0 : INT32_MAX;
        rmsnorm_rows_kernel<<<(unsigned)nr, THREADS, 0, cb->stream>>>(p->out + r0 * p->ld_out, p->ld_out,
                                                                       rows ? p->x : p->x + r0 * p->ldx, p->ldx,
                                                                       rows ? rows + r0 : NULL, p->n, p->w, p->eps);
        launched(cb, "rmsnorm_rows_kernel launch");
    }
}

// cos/sin per position in double on the host (rope.c, the CPU's bits), then to the device.
static void cuda_rope_cos_sin(moeq_backend *b, const moeq_rope *rope, const int64_t *pos, int64_t n, float *cos_v,
                              float *sin_v) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->err || n <= 0) return;
    size_t half = (size_t)rope->dim / 2, bytes = (size_t)n * half * sizeof(float);
    void *d_cos = NULL, *d_sin = NULL; // the twins go unused: the pinned rows are copied straight into cos_v/sin_v
    if (!stage_reserve(cb, 2 * STAGED(bytes))) return;
    float *h_cos = (float *)stage(cb, bytes, &d_cos);
    float *h_sin = h_cos ? (float *)stage(cb, bytes, &d_sin) : NULL;
    if (!h_sin) return;
    for (int64_t t = 0; t < n; t++) moeq_rope_cos_sin(rope, pos[t], h_cos + t * half, h_sin + t * half);
    if (h2d(cb, cos_v, h_cos, bytes, "cudaMemcpyAsync (cos)")) h2d(cb, sin_v, h_sin, bytes, "cudaMemcpyAsync (sin)");
}

// One token: cache entry = [rmsnorm(kva[:L]) * kv_norm ; rope(kva[L:])], q_pe[h] = rope(q[h, nope:]).
__global__ void mla_rope_kernel(kv_dev kv, const int64_t *pos, const float *kva, const float *kv_norm, float eps,
                                const float *q, float *q_pe, const float *cos_v, const float *sin_v, int H, int nope,
                                int L, int R) {
    int64_t t = blockIdx.x;
    int half = R / 2, QH = nope + R;
    float *entry = (float *)kv_entry(kv, t, pos[t]);
    const float *x = kva + t * (L + R), *cs = cos_v + t * half, *sn = sin_v + t * half;
    __shared__ float f;
    if (threadIdx.x < MOEQ_CU_LANES) {
        float v = moeq_cu_tree16_shfl(moeq_cu_dot_lane(x, x, L, (int)threadIdx.x), 0xffffu);
        if (threadIdx.x == 0) f = moeq_cu_rmsnorm_factor(v, L, eps);
    }
    __syncthreads();
    for (int d = threadIdx.x; d < L; d += blockDim.x) entry[d] = moeq_cu_rmsnorm_elem(x[d], kv_norm[d], f);
    for (int i = threadIdx.x; i < half; i += blockDim.x) moeq_cu_rope_pair(x + L, cs[i], sn[i], i, half, entry + L);
    for (int k = threadIdx.x; k < H * half; k += blockDim.x) {
        int h = k / half, i = k % half;
        moeq_cu_rope_pair(q + (t * H + h) * QH + nope, cs[i], sn[i], i, half, q_pe + (t * H + h) * R);
    }
}

static void cuda_mla_rope(moeq_backend *b, const moeq_mla_rope_params *p) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->err || p->n_tok <= 0) return;
    kv_dev kv;
    size_t pos_bytes = (size_t)p->n_tok * sizeof(int64_t);
    int fixed = kv_fixed(cb, &p->kv, p->seq, p->pos, p->n_tok, &kv);
    if (!stage_reserve(cb, STAGED(pos_bytes) + (fixed ? 0 : kv_staged(&p->kv, p->seq, p->pos, p->n_tok)))) return;
    const int64_t *pos = (const int64_t *)stage_up(cb, p->pos, pos_bytes, "cudaMemcpyAsync (positions)");
    if (!fixed && in_bracket(cb, "no fixed block table for a captured step")) return;
    if (!pos || (!fixed && !kv_upload(cb, &p->kv, p->seq, p->pos, p->n_tok, &kv)) || replaying(cb)) return;
    for (int64_t t0 = 0; t0 < p->n_tok && !cb->err; t0 += INT32_MAX) {
        int64_t nt = p->n_tok - t0 < INT32_MAX ? p->n_tok - t0 : INT32_MAX;
        kv_dev k0 = kv;
        k0.row_off += t0;
        int R = p->rope->dim, QH = p->nope + R;
        mla_rope_kernel<<<(unsigned)nt, THREADS, 0, cb->stream>>>(
            k0, pos + t0, p->kva + t0 * (p->kv_lora + R), p->kv_norm, p->eps, p->q + t0 * p->n_heads * QH,
            p->q_pe + t0 * p->n_heads * R, p->cos_v + t0 * (R / 2), p->sin_v + t0 * (R / 2), p->n_heads, p->nope,
            p->kv_lora, R);
        launched(cb, "mla_rope_kernel launch");
    }
}

__global__ void add_kernel(float *x, const float *y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + y[i];
}

static void cuda_add(moeq_backend *b, float *x, const float *y, int64_t n) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->err || n <= 0 || replaying(cb)) return;
    add_kernel<<<blocks_for(n, 256), 256, 0, cb->stream>>>(x, y, n);
    launched(cb, "add_kernel launch");
}

static void cuda_silu_mul(moeq_backend *b, float *out, const float *gate, const float *up, int64_t n) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->err || n <= 0 || replaying(cb)) return;
    if (moeq_cuda_silu_mul(out, gate, up, n, cb->stream)) // the launcher read cudaGetLastError itself
        fail(cb, MOEQ_ERR_INTERNAL, "silu_mul kernel launch failed%s%s", "", "");
}

// ---- MoE: route (back to the host), gather, combine ----------------------------------------------------------------

static moeq_cu_router cu_router(const moeq_moe_router *r) {
    moeq_cu_router c;
    c.n_experts = r->n_experts, c.top_k = r->top_k, c.n_group = r->n_group, c.topk_group = r->topk_group;
    c.sigmoid = r->sigmoid, c.method = (int)r->method, c.norm_topk_prob = r->norm_topk_prob;
    c.scale_always = r->scale_always, c.scaling = r->scaling;
    return c;
}

// The host outputs of a route that could not run (an error is kept): valid, distinct experts 0..K-1 and finite
// flags, so the MoE layer's host layout, which indexes its tables by these ids, stays in bounds until the
// step's status check fails the step (stale or uninitialised ids there were wild writes on the host).
static void route_valid_ids_after_error(const moeq_route_params *p) {
    int64_t T = p->n_tok, K = p->router->top_k;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t k = 0; k < K; k++) p->ids[t * K + k] = (int32_t)k;
        p->finite[t] = 1;
    }
    if (p->offsets) moeq_moe_plan(p->ids, T, (int)K, p->router->n_experts, p->offsets, p->order);
}

static void route_on_device(cuda_backend *cb, const moeq_route_params *p);

static void route_on_backend(cuda_backend *cb, const moeq_route_params *p);

static void cuda_route(moeq_backend *b, const moeq_route_params *p) {
    cuda_backend *cb = (cuda_backend *)b;
    if (p->n_tok <= 0) return;
    if (p->on_backend) { // nothing comes back; after an error nothing reads the ids on the host either
        if (!cb->err && !replaying(cb)) route_on_backend(cb, p);
        return;
    }
    if (!cb->err && !in_bracket(cb, "a route with host ids (a wait) in a captured step")) route_on_device(cb, p);
    if (cb->err || cb->br.mode) route_valid_ids_after_error(p);
}

// The router a warp a token (ops.cuh, "the router as a warp a token"; tests/test_cuda_ops_host.c plays its lanes):
// moeq_cu_route's ids and weights, the scratch in shared memory (the one-thread kernel's 3 KiB of local memory a
// thread made the driver reserve ~0.8 GB at its first launch).
#define ROUTE_WARPS 4
__global__ void route_warp_kernel(int32_t *ids, float *weights, uint8_t *finite, const float *logits,
                                  const float *bias, int64_t T, moeq_cu_router r) {
    extern __shared__ float route_smem[];
    const unsigned all = 0xffffffffu;
    int lane = (int)(threadIdx.x % MOEQ_CU_WARP), n = r.n_experts;
    int64_t t = (int64_t)blockIdx.x * ROUTE_WARPS + threadIdx.x / MOEQ_CU_WARP;
    if (t >= T) return; // the whole warp: t is the warp's
    float *scores = route_smem + (threadIdx.x / MOEQ_CU_WARP) * (size_t)(2 * n + r.n_group);
    float *choice = scores + n, *gscore = choice + n;
    const float *lg = logits + t * n;
    int fin = 1;
    for (int i = lane; i < n; i += MOEQ_CU_WARP) {
        float v = lg[i];
        fin &= isfinite(v) != 0;
        scores[i] = moeq_cu_route_score(&r, v);
    }
    fin = __all_sync(all, fin);
    __syncwarp();
    if (!r.sigmoid) { // the ascending sum: one lane
        if (lane == 0) moeq_cu_softmax(scores, n);
        __syncwarp();
    }
    for (int i = lane; i < n; i += MOEQ_CU_WARP) choice[i] = scores[i] + (bias && r.method == 2 ? bias[i] : 0.0f);
    __syncwarp();
    if (r.method != 0 && r.n_group > 1) {
        int size = n / r.n_group;
        for (int g = lane; g < r.n_group; g += MOEQ_CU_WARP)
            gscore[g] = moeq_cu_group_score(&r, choice + g * size, size);
        __syncwarp();
        if (lane == 0)
            for (int kept = 0; kept < r.topk_group; kept++) {
                int g = moeq_cu_argmax_first(gscore, r.n_group);
                if (g < 0) break;
                gscore[g] = NAN;
            }
        __syncwarp();
        for (int i = lane; i < n; i += MOEQ_CU_WARP)
            if (!isnan(gscore[i / size])) choice[i] = -INFINITY;
        __syncwarp();
    }
    int32_t *id = ids + t * r.top_k;
    float *wt = weights + t * r.top_k, sum = 0.0f;
    for (int s = 0; s < r.top_k; s++) {
        moeq_cu_pick p = moeq_cu_pick_lane(choice, n, lane);
        for (int m = MOEQ_CU_WARP / 2; m > 0; m >>= 1) { // every lane ends with the best: a total order's max
            moeq_cu_pick o;
            o.v = __shfl_xor_sync(all, p.v, m);
            o.i = __shfl_xor_sync(all, p.i, m);
            p = moeq_cu_pick_better(p, o);
        }
        if (lane == 0) {
            int e = p.i >= 0 ? p.i : moeq_cu_first_unpicked(id, s);
            choice[e] = -INFINITY;
            id[s] = e, wt[s] = scores[e], sum += scores[e];
        }
        __syncwarp();
    }
    if (lane == 0) {
        moeq_cu_route_weights(&r, wt, sum);
        finite[t] = (uint8_t)fin;
    }
}

static void route_on_backend(cuda_backend *cb, const moeq_route_params *p) {
    moeq_cu_router r = cu_router(p->router);
    if (r.n_experts <= 0 || r.n_experts > MOEQ_CU_ROUTE_MAX_EXPERTS || r.n_group <= 0 || r.n_experts % r.n_group ||
        r.topk_group > r.n_group || r.top_k <= 0 || r.top_k > r.n_experts || p->offsets) {
        fail(cb, MOEQ_ERR_UNSUPPORTED, "route: the router kernel takes at most %s experts%s", "256",
             " in groups that divide them (and no host plan with on_backend)");
        return;
    }
    size_t smem = (size_t)ROUTE_WARPS * (size_t)(2 * r.n_experts + r.n_group) * sizeof(float); // <= 12 KB
    route_warp_kernel<<<blocks_for(p->n_tok, ROUTE_WARPS), ROUTE_WARPS * MOEQ_CU_WARP, smem, cb->stream>>>(
        p->ids, p->weights, p->finite, p->logits, p->bias, p->n_tok, r);
    launched(cb, "route_warp_kernel launch");
}

static void route_on_device(cuda_backend *cb, const moeq_route_params *p) {
    moeq_cu_router r = cu_router(p->router);
    int64_t T = p->n_tok, K = r.top_k;
    void *d_ids = NULL, *d_fin = NULL;
    if (!stage_reserve(cb, STAGED((size_t)(T * K) * sizeof(int32_t)) + STAGED((size_t)T * sizeof(int32_t)))) return;
    int32_t *h_ids = (int32_t *)stage(cb, (size_t)(T * K) * sizeof(int32_t), &d_ids);
    int32_t *h_fin = h_ids ? (int32_t *)stage(cb, (size_t)T * sizeof(int32_t), &d_fin) : NULL;
    if (!h_fin) return;
    moeq_err err = moeq_cuda_moe_route((int32_t *)d_ids, p->weights, (int32_t *)d_fin, p->logits, p->bias, T, r,
                                       cb->stream);
    if (err == MOEQ_ERR_INVALID_ARG) {
        fail(cb, MOEQ_ERR_UNSUPPORTED, "route: the router kernel takes at most %s experts%s", "256",
             " in groups that divide them");
        return;
    }
    if (err) { // the launcher read cudaGetLastError itself
        fail(cb, MOEQ_ERR_INTERNAL, "moe_route kernel launch failed%s%s", "", "");
        return;
    }
    if (!cu_ok(cb, cudaMemcpyAsync(h_ids, d_ids, (size_t)(T * K) * sizeof(int32_t), cudaMemcpyDeviceToHost, cb->stream),
               "cudaMemcpyAsync (routed ids)") ||
        !cu_ok(cb, cudaMemcpyAsync(h_fin, d_fin, (size_t)T * sizeof(int32_t), cudaMemcpyDeviceToHost, cb->stream),
               "cudaMemcpyAsync (finite flags)"))
        return;
    if (!cu_ok(cb, cudaStreamSynchronize(cb->stream), "cudaStreamSynchronize (route)")) return;
    memcpy(p->ids, h_ids, (size_t)(T * K) * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++) p->finite[t] = (uint8_t)(h_fin[t] != 0);
    cb->stage_off = 0; // drained: the staging is free again (h_ids was read above)
    if (p->offsets) moeq_moe_plan(p->ids, T, (int)K, r.n_experts, p->offsets, p->order);
}

__global__ void gather_kernel(float *xg, int64_t *slot_row, const float *x, const int64_t *order, int64_t n_slots,
                              int64_t top_k, int64_t dim) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_slots * dim) return;
    moeq_cu_gather_at a = moeq_cu_gather_index(idx, dim);
    xg[a.i * dim + a.d] = x[moeq_cu_gather_src(order, a.i, top_k) * dim + a.d];
    if (a.d == 0) slot_row[order[a.i]] = a.i;
}

static void cuda_gather(moeq_backend *b, const moeq_gather_params *p) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->err || p->n_slots <= 0) return;
    const int64_t *order = (const int64_t *)stage_up_alone(cb, p->order, (size_t)p->n_slots * sizeof(int64_t),
                                                     "cudaMemcpyAsync (gather order)");
    if (!order || replaying(cb)) return;
    gather_kernel<<<blocks_for(p->n_slots * p->dim, 256), 256, 0, cb->stream>>>(p->xg, p->slot_row, p->x, order,
                                                                                p->n_slots, p->top_k, p->dim);
    launched(cb, "gather_kernel launch");
}

// Per (token, column): slots in routing order, products then sums as the CPU's (no fma), the shared row last.
__global__ void combine_kernel(float *out, const float *rows, const int64_t *slot_row, const float *weights,
                               const float *shared, int64_t n_tok, int64_t K, int64_t D) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_tok * D) return;
    out[idx] = moeq_cu_combine_elem(rows, slot_row, weights, shared, idx / D, K, D, idx % D);
}

static void cuda_combine(moeq_backend *b, const moeq_combine_params *p) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->err || p->n_tok <= 0 || replaying(cb)) return;
    combine_kernel<<<blocks_for(p->n_tok * p->dim, 256), 256, 0, cb->stream>>>(p->out, p->rows, p->slot_row,
                                                                               p->weights, p->shared, p->n_tok,
                                                                               p->top_k, p->dim);
    launched(cb, "combine_kernel launch");
}

// ---- MoE: moe_experts, a one-rank layer's experts on the device (moe_index.cuh) ------------------------------------

// The plan, one block of one thread per expert: counts, the scan by thread 0, each expert's slots placed;
// stats[e] += counts[e]. Integer work with no atomics: the same plan whatever the timing.
__global__ void moe_plan_kernel(const int32_t *ids, int64_t S, int E, int64_t *offsets, int64_t *order,
                                int64_t *tile_first, int64_t *slot_row, uint64_t *stats, const int64_t *n_valid,
                                int64_t K) {
    __shared__ int64_t counts[MOEQ_CU_MOE_MAX_EXPERTS];
    int e = (int)threadIdx.x;
    if (e < E) counts[e] = moeq_cu_moe_count(ids, S, e);
    __syncthreads();
    if (e == 0) moeq_cu_moe_scan(counts, E, MOEQ_CU_MM_TILE_T, offsets, tile_first);
    __syncthreads(); // thread 0's global writes are visible to the block from here
    if (e < E) {
        moeq_cu_moe_place(ids, S, e, offsets[e], order, slot_row);
        // a padded step (n_valid: device memory, NULL when none) counts its real tokens' slots only
        if (stats) stats[e] += (uint64_t)(n_valid ? moeq_cu_moe_count(ids, *n_valid * K, e) : counts[e]);
    }
}

// The grouped NT product over every expert's rows: block (bx, y) takes item y of the work list (an expert and
// one of its token tiles; past the last item the block idles) and ops.cuh's tile bx of that expert's matmul
// over its rows, so each element has mm_nt_kernel's order. y[(row) * O + o] for rows of the permuted matrix.
template <int DT>
__global__ void mm_grouped_kernel(float *y, const float *x, int64_t K, int64_t O, const void *const *W,
                                  const float *const *scale, const int64_t *offsets, const int64_t *tile_first,
                                  int E, int64_t cap) {
    for (int64_t by = blockIdx.y; by < cap; by += gridDim.y) { // uniform per block: the shuffles stay whole
        int64_t j = 0;
        int e = moeq_cu_moe_item(tile_first, E, by, &j);
        if (e < 0) break; // past the last item: so is every later one
        int64_t o0 = offsets[e], cnt = offsets[e + 1] - o0;
        moeq_cu_mm_at a = moeq_cu_mm_index(blockIdx.x, j, (int)threadIdx.x, cnt, O);
        float acc[MOEQ_CU_MM_TILE_T];
        if (a.nt > 0) moeq_cu_mm_lanes(acc, a, x + o0 * K, K, DT, W[e], scale[e], K);
        else
            for (int i = 0; i < MOEQ_CU_MM_TILE_T; i++) acc[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < MOEQ_CU_MM_TILE_T; i++) {
            float v = moeq_cu_tree16_shfl(acc[i], 0xffffffffu);
            if (a.lane == 0 && i < a.nt) y[(o0 + a.t0 + i) * O + a.o] = v;
        }
    }
}

// mm_grouped_kernel's work list with mv_nt_kernel's threads: for calls of at most 8 tokens (an expert then has at
// most 8 rows, one tile of the plan), BF16/F8 experts, K a multiple of 16. The same bits.
template <int DT, int NT>
__global__ void mv_grouped_kernel(float *y, const float *x, int64_t K, int64_t O, const void *const *W,
                                  const float *const *scale, const int64_t *offsets, const int64_t *tile_first,
                                  int E, int64_t cap) {
    int64_t o = (int64_t)blockIdx.x * MOEQ_CU_MV_ROWS + threadIdx.x / 2;
    int h = (int)(threadIdx.x & 1);
    for (int64_t by = blockIdx.y; by < cap; by += gridDim.y) { // uniform per block: the shuffles stay whole
        int64_t jt = 0;
        int e = moeq_cu_moe_item(tile_first, E, by, &jt);
        if (e < 0) break; // past the last item: so is every later one
        int64_t o0 = offsets[e], cnt = offsets[e + 1] - o0, first = jt * MOEQ_CU_MM_TILE_T;
        int64_t last = cnt - first < MOEQ_CU_MM_TILE_T ? cnt : first + MOEQ_CU_MM_TILE_T;
        for (int64_t t0 = first; t0 < last; t0 += NT) // once, where NT holds the plan's tile
            mv_tile<DT, NT>(y + o0 * O, O, x + o0 * K, K, W[e], scale[e], K, o, o, O, t0,
                            last - t0 < NT ? (int)(last - t0) : NT, h);
    }
}

// The grouped experts' many-token tiles: block (bx, y) takes item y (an expert and one of its 32-token tiles,
// ops.cuh's moeq_cu_mt_item; past the last the block idles) and rows 32 bx .. of that expert's weight.
template <int DT>
__global__ void __launch_bounds__(MOEQ_CU_MT_THREADS) mt_grouped_kernel(float *y, const float *x, int64_t K,
                                                                        int64_t O, const void *const *W,
                                                                        const float *const *scale,
                                                                        const int64_t *offsets, int E, int64_t cap) {
    for (int64_t by = blockIdx.y; by < cap; by += gridDim.y) { // uniform per block
        int64_t jt = 0;
        int e = moeq_cu_mt_item(offsets, E, by, &jt);
        if (e < 0) break; // past the last item: so is every later one
        int64_t o0 = offsets[e];
        mt_tile<DT>(y + o0 * O, O, 0, x + o0 * K, K, W[e], scale[e], K, (int64_t)blockIdx.x * MOEQ_CU_MT_ROWS, O,
                    jt * MOEQ_CU_MT_TOK, offsets[e + 1] - o0);
    }
}

template <int DT>
static void mv_grouped(cuda_backend *cb, float *y, const float *x, int64_t K, int64_t O, const void *const *W,
                       const float *const *scale, const int64_t *offsets, const int64_t *tile_first, int E,
                       int64_t cap, int64_t T) {
    dim3 grid((unsigned)((O + MOEQ_CU_MV_ROWS - 1) / MOEQ_CU_MV_ROWS), grid_y_for(cap));
    cudaStream_t s = cb->stream;
#define MV_GROUPED(NT)                                                                                              \
    mv_grouped_kernel<DT, NT><<<grid, MV_THREADS, 0, s>>>(y, x, K, O, W, scale, offsets, tile_first, E, cap)
    switch (moeq_cu_mv_tile(T)) { // an expert has at most T rows: a token picks each expert once
    case 1: MV_GROUPED(1); break;
    case 2: MV_GROUPED(2); break;
    case 4: MV_GROUPED(4); break;
    default: MV_GROUPED(8); break;
    }
#undef MV_GROUPED
    launched(cb, "mv_grouped_kernel launch");
}

template <int DT>
static void mt_grouped(cuda_backend *cb, float *y, const float *x, int64_t K, int64_t O, const void *const *W,
                       const float *const *scale, const int64_t *offsets, int E, int64_t S) {
    int64_t cap = moeq_cu_moe_tile_cap(S, E, MOEQ_CU_MT_TOK);
    dim3 grid((unsigned)((O + MOEQ_CU_MT_ROWS - 1) / MOEQ_CU_MT_ROWS), grid_y_for(cap));
    mt_grouped_kernel<DT><<<grid, MOEQ_CU_MT_THREADS, 0, cb->stream>>>(y, x, K, O, W, scale, offsets, E, cap);
    launched(cb, "mt_grouped_kernel launch");
}

// T: the call's tokens (an expert's rows are at most that many); S: its slots (T * top_k).
static void grouped_nt(cuda_backend *cb, int dtype, float *y, const float *x, int64_t K, int64_t O,
                       const void *const *W, const float *const *scale, const int64_t *offsets,
                       const int64_t *tile_first, int E, int64_t cap, int64_t T, int64_t S) {
    // experts of 16 tokens or more on average: the 32-token tiles (with fewer, most of each tile would idle)
    if (T > MOEQ_CU_MV_MAX_TOK && S >= 16 * (int64_t)E && mt_takes(cb, dtype, 0, 1, 0)) {
        switch (dtype) {
        case MOEQ_DTYPE_F32: mt_grouped<MOEQ_CU_DTYPE_F32>(cb, y, x, K, O, W, scale, offsets, E, S); break;
        case MOEQ_DTYPE_BF16: mt_grouped<MOEQ_CU_DTYPE_BF16>(cb, y, x, K, O, W, scale, offsets, E, S); break;
        case MOEQ_DTYPE_F16: mt_grouped<MOEQ_CU_DTYPE_F16>(cb, y, x, K, O, W, scale, offsets, E, S); break;
        default: mt_grouped<MOEQ_CU_DTYPE_F8_E4M3>(cb, y, x, K, O, W, scale, offsets, E, S); break;
        }
        return;
    }
    if (T <= MOEQ_CU_MV_MAX_TOK && mv_takes(cb, dtype, K, x, K, 0)) {
        if (dtype == MOEQ_DTYPE_BF16)
            mv_grouped<MOEQ_CU_DTYPE_BF16>(cb, y, x, K, O, W, scale, offsets, tile_first, E, cap, T);
        else
            mv_grouped<MOEQ_CU_DTYPE_F8_E4M3>(cb, y, x, K, O, W, scale, offsets, tile_first, E, cap, T);
        return;
    }
    dim3 grid((unsigned)moeq_cu_mm_grid_x(O), grid_y_for(cap));
    cudaStream_t s = cb->stream;
    switch (dtype) {
    case MOEQ_DTYPE_F32:
        mm_grouped_kernel<MOEQ_CU_DTYPE_F32><<<grid, MOEQ_CU_MM_THREADS, 0, s>>>(y, x, K, O, W, scale, offsets,
                                                                                tile_first, E, cap);
        break;
    case MOEQ_DTYPE_BF16:
        mm_grouped_kernel<MOEQ_CU_DTYPE_BF16><<<grid, MOEQ_CU_MM_THREADS, 0, s>>>(y, x, K, O, W, scale, offsets,
                                                                                 tile_first, E, cap);
        break;
    case MOEQ_DTYPE_F16:
        mm_grouped_kernel<MOEQ_CU_DTYPE_F16><<<grid, MOEQ_CU_MM_THREADS, 0, s>>>(y, x, K, O, W, scale, offsets,
                                                                                tile_first, E, cap);
        break;
    case MOEQ_DTYPE_F8_E4M3:
        mm_grouped_kernel<MOEQ_CU_DTYPE_F8_E4M3><<<grid, MOEQ_CU_MM_THREADS, 0, s>>>(y, x, K, O, W, scale, offsets,
                                                                                    tile_first, E, cap);
        break;
    }
    launched(cb, "mm_grouped_kernel launch");
}

// The experts' weight tables (gate, up, down pointers, then their F8 scales) staged up; NULL on an error.
static const void *const *expert_tables(cuda_backend *cb, const moeq_moe_experts_params *p, int *dtype) {
    int E = p->n_experts;
    size_t bytes = (size_t)6 * (size_t)E * sizeof(void *);
    if (!stage_reserve(cb, STAGED(bytes))) return NULL;
    void *d = NULL;
    const void **h = (const void **)stage(cb, bytes, &d);
    if (!h) return NULL;
    *dtype = (int)p->experts[0].gate_proj->dtype;
    for (int e = 0; e < E; e++) {
        const moeq_tensor *w[3] = {p->experts[e].gate_proj, p->experts[e].up_proj, p->experts[e].down_proj};
        for (int i = 0; i < 3; i++) {
            if ((int)w[i]->dtype != *dtype) {
                fail(cb, MOEQ_ERR_UNSUPPORTED, "moe_experts: experts of one layer in more than one dtype (%s)%s",
                     w[i]->name ? w[i]->name : "?", "");
                return NULL;
            }
            h[i * E + e] = wdev(cb, w[i]);
            h[(3 + i) * E + e] = h[i * E + e] ? scale_dev(cb, w[i]) : NULL;
            if (!h[i * E + e] || (w[i]->dtype == MOEQ_DTYPE_F8_E4M3 && w[i]->scale_inv && !h[(3 + i) * E + e]))
                return NULL;
        }
    }
    if (!h2d(cb, d, h, bytes, "cudaMemcpyAsync (expert tables)")) return NULL;
    return (const void *const *)d;
}

// One shared-expert product over all T tokens with the own NT kernel (never cuBLAS: the op's bits are the
// batch-invariant ones whatever the backend's mode).
static void shared_nt(cuda_backend *cb, const moeq_tensor *w, const float *x, int64_t ldx, float *y, int64_t ldy,
                      int64_t T) {
    const void *W = wdev(cb, w);
    const float *scale = W ? scale_dev(cb, w) : NULL;
    if (!W || (w->dtype == MOEQ_DTYPE_F8_E4M3 && w->scale_inv && !scale)) return;
    moeq_mm_job j = {w, 0, moeq_tensor_rows(w), x, ldx, y, ldy, T};
    own_nt(cb, &j, W, scale, 1, (mm_z){0, 0, 0});
}

static void cuda_moe_experts(moeq_backend *b, const moeq_moe_experts_params *p) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->err || p->n_tok <= 0) return;
    int E = p->n_experts;
    int64_t T = p->n_tok, K = p->top_k, D = p->dim, MI = p->inter, S = T * K;
    if (E <= 0 || E > MOEQ_CU_MOE_MAX_EXPERTS || T > p->max_tok) {
        fail(cb, MOEQ_ERR_UNSUPPORTED, "moe_experts: at most %s experts and max_tok tokens%s", "256", "");
        return;
    }
    int dtype = (int)p->experts[0].gate_proj->dtype;
    const void *const *tab = NULL; // the layer's tables from map_weights, else staged for this call
    for (int l = 0; l < cb->n_moe && !tab; l++)
        if (cb->moe_key[l] == p->experts) tab = cb->moe_tab + (size_t)l * 6 * (size_t)E;
    if ((!tab && !(tab = expert_tables(cb, p, &dtype))) || replaying(cb)) return;
    const void *const *wg = tab, *const *wu = tab + E, *const *wd = tab + 2 * E;
    const float *const *sg = (const float *const *)(tab + 3 * E), *const *su = (const float *const *)(tab + 4 * E);
    const float *const *sd = (const float *const *)(tab + 5 * E);
    int64_t *offsets = p->plan, *order = p->plan + E + 1, *tile_first = p->plan + E + 1 + p->max_tok * K;
    // the capacity of this call's slots (a captured step's T is its bucket, so a replay has the same grid): no host
    // count. That of max_tok's slots launched ~2,000 idle rows of blocks per product at batch 1, 80-180 us each.
    int64_t cap = moeq_cu_moe_tile_cap(S, E, MOEQ_CU_MM_TILE_T);
    moe_plan_kernel<<<1, (unsigned)((E + 31) / 32 * 32), 0, cb->stream>>>(
        p->ids, S, E, offsets, order, tile_first, p->slot_row, p->stats,
        cb->br.mode && cb->br.n_rows == T ? cb->br.nvalid_d : NULL, K);
    if (!launched(cb, "moe_plan_kernel launch")) return;
    gather_kernel<<<blocks_for(S * D, 256), 256, 0, cb->stream>>>(p->xg, p->slot_row, p->x, order, S, K, D);
    if (!launched(cb, "gather_kernel launch (moe_experts)")) return;
    const moeq_expert *sh = p->shared && p->shared->gate_proj ? p->shared : NULL;
    int64_t SI = sh ? moeq_tensor_rows(sh->gate_proj) : 0;
    grouped_nt(cb, dtype, p->g, p->xg, D, MI, wg, sg, offsets, tile_first, E, cap, T, S);
    grouped_nt(cb, dtype, p->u, p->xg, D, MI, wu, su, offsets, tile_first, E, cap, T, S);
    if (sh) {
        shared_nt(cb, sh->gate_proj, p->x, D, p->g + S * MI, SI, T);
        shared_nt(cb, sh->up_proj, p->x, D, p->u + S * MI, SI, T);
    }
    if (cb->err) return;
    if (moeq_cuda_silu_mul(p->g, p->g, p->u, S * MI + T * SI, cb->stream)) {
        fail(cb, MOEQ_ERR_INTERNAL, "silu_mul kernel launch failed%s%s", " (moe_experts)", "");
        return;
    }
    grouped_nt(cb, dtype, p->down, p->g, MI, D, wd, sd, offsets, tile_first, E, cap, T, S);
    if (sh) shared_nt(cb, sh->down_proj, p->g + S * MI, SI, p->down + S * D, D, T);
    if (cb->err) return;
    combine_kernel<<<blocks_for(T * D, 256), 256, 0, cb->stream>>>(p->out, p->down, p->slot_row, p->weights,
                                                                   sh ? p->down + S * D : NULL, T, K, D);
    launched(cb, "combine_kernel launch (moe_experts)");
}

// ---- logits: per-row records (argmax, candidates, sums) back to the host -----------------------------------------

// Block-wide exclusive scan of v over the block's NT threads; *total: the sum. Integers, so any order gives the
// same result: each warp scans with shuffles, warp 0 scans the warps' totals. Three barriers a call (the
// Hillis-Steele scan over shared memory this replaces took 2 log2(NT): with one call per tile of the candidates'
// walk, most of a 129,280-logit row's 650 us).
template <int NT>
__device__ uint32_t block_scan_excl(uint32_t v, uint32_t *buf, uint32_t *total) {
    static_assert(NT % 32 == 0 && NT >= 64 && NT <= 1024, "buf holds 32 + NT / 32 words");
    int t = threadIdx.x, lane = t & 31, w = t >> 5;
    uint32_t incl = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        uint32_t up = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += up;
    }
    if (lane == 31) buf[w] = incl;
    __syncthreads();
    if (w == 0) {
        uint32_t s = lane < NT / 32 ? buf[lane] : 0u;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            uint32_t up = __shfl_up_sync(0xffffffffu, s, off);
            if (lane >= off) s += up;
        }
        if (lane < NT / 32) buf[32 + lane] = s; // the warps' inclusive prefix
    }
    __syncthreads();
    uint32_t before = (w ? buf[32 + w - 1] : 0u) + incl - v;
    *total = buf[32 + NT / 32 - 1];
    __syncthreads(); // the next call writes buf again
    return before;
}

// Thread 0 picks pass p's bucket from hist: the prefix and the rank left (logits_reduce.cuh).
__device__ void lr_pick(const uint32_t *hist, int pass, uint32_t *prefix, uint32_t *k_left) {
    if (threadIdx.x == 0) {
        uint32_t b = moeq_cu_lr_pick(hist, *k_left, k_left);
        *prefix |= b << (24 - 8 * pass);
    }
    __syncthreads();
}

// The c best (key, index) of x[0, n) in rank order into key_out / id_out (ids offset by id0), and the segment's
// best and non-finite flag into *best_out (thread 0): logits_reduce.cuh's steps in its order, one block.
// tests/test_logits_reduce.c emulates it.
template <int NT>
__device__ void lr_segment(const float *x, int64_t n, int64_t id0, int c, uint32_t *key_out, int32_t *id_out,
                           moeq_cu_lr_best *best_out) {
    __shared__ uint32_t hist[MOEQ_CU_LR_BUCKETS];
    __shared__ uint32_t scan[32 + NT / 32];
    __shared__ uint32_t b_key[NT];
    __shared__ int32_t b_id[NT];
    __shared__ int b_nf[NT];
    __shared__ uint32_t c_key[MOEQ_LOGITS_TOP];
    __shared__ int32_t c_id[MOEQ_LOGITS_TOP];
    __shared__ uint32_t prefix, k_left;
    int t = threadIdx.x;
    if (t == 0) prefix = 0, k_left = (uint32_t)c;
    moeq_cu_lr_best best = {0u, (int32_t)n, 0};
    for (int pass = 0; pass < MOEQ_CU_LR_PASSES; pass++) {
        for (int b = t; b < MOEQ_CU_LR_BUCKETS; b += NT) hist[b] = 0;
        __syncthreads();
        moeq_cu_lr_pass_thread(x, n, NT, t, pass, prefix, hist, &best);
        if (pass == 0) { // the segment's best (a total order: the tree's shape does not matter) and finite flag
            b_key[t] = best.key, b_id[t] = best.id, b_nf[t] = best.nonfinite;
            __syncthreads();
            for (int s = NT / 2; s > 0; s >>= 1) {
                if (t < s) {
                    moeq_cu_lr_best u = {b_key[t], b_id[t], b_nf[t]}, o = {b_key[t + s], b_id[t + s], b_nf[t + s]};
                    u = moeq_cu_lr_best_merge(u, o);
                    b_key[t] = u.key, b_id[t] = u.id, b_nf[t] = u.nonfinite;
                }
                __syncthreads();
            }
        }
        __syncthreads();
        lr_pick(hist, pass, &prefix, &k_left);
    }
    // the candidates: above the threshold key, then the lowest ids equal to it, in index order
    uint32_t thr = prefix, n_eq = k_left, n_gt = (uint32_t)c - n_eq, gt_base = 0, eq_base = 0;
    for (int64_t j = 0; j < moeq_cu_lr_tiles(n, NT); j++) {
        int64_t i = j * NT + t;
        uint32_t key = i < n ? moeq_cu_lr_key(x[i]) : 0u;
        int gt = i < n && key > thr, eq = i < n && key == thr;
        uint32_t total, before = block_scan_excl<NT>((uint32_t)gt | ((uint32_t)eq << 16), scan, &total);
        int slot = i < n ? moeq_cu_lr_slot(key, thr, gt_base + (before & 0xffffu), eq_base + (before >> 16), n_gt, n_eq)
                         : -1;
        if (slot >= 0) c_key[slot] = key, c_id[slot] = (int32_t)i;
        gt_base += total & 0xffffu, eq_base += total >> 16;
        if (gt_base >= n_gt && eq_base >= n_eq) break; // every thread sees the same totals: the same exit
    }
    __syncthreads();
    if (t < c) {
        int rank = moeq_cu_lr_rank(c_key, c_id, c, t);
        key_out[rank] = c_key[t], id_out[rank] = (int32_t)(c_id[t] + id0);
    }
    if (t == 0) *best_out = (moeq_cu_lr_best){b_key[0], (int32_t)(b_id[0] + id0), b_nf[0]};
    __syncthreads();
}

// Whether this block is the last of the row's gridDim.x to get here (each block's results written and fenced
// before it counts); the last one resets the counter for the next launch.
__device__ int lr_last_block(unsigned *done) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(done, 1u) == gridDim.x - 1;
        if (last) *done = 0;
    }
    __syncthreads();
    if (last) __threadfence(); // the others' writes, seen before they are read (they are read with __ldcg)
    return last;
}

// Scratch of the partitioned kernels, per row: the partitions' candidates (keys, ids), bests (key, id, flag) and
// sums (sum_t, sum_1), and the row's counter.
typedef struct lr_scratch {
    uint32_t *cand_key;
    int32_t *cand_id;
    uint32_t *best; // 3 per partition
    double *sums;   // 2 per partition
    unsigned *done;
} lr_scratch;

// Grid (partitions, rows), NT threads: partition blockIdx.x of row blockIdx.y writes its candidates and best; the
// row's last block selects the row's c best from their union and writes the record (sums: logits_sum_kernel).
template <int NT>
__global__ void logits_select_kernel(const float *logits, int64_t ld, int64_t V, int64_t S, lr_scratch sc,
                                     moeq_logits_record *out) {
    __shared__ uint32_t u_key[MOEQ_CU_LR_MAX_PARTS * MOEQ_LOGITS_TOP];
    __shared__ int32_t u_id[MOEQ_CU_LR_MAX_PARTS * MOEQ_LOGITS_TOP];
    __shared__ uint32_t hist[MOEQ_CU_LR_BUCKETS];
    __shared__ uint32_t scan[32 + NT / 32];
    __shared__ uint32_t c_key[MOEQ_LOGITS_TOP];
    __shared__ int32_t c_id[MOEQ_LOGITS_TOP];
    __shared__ uint32_t prefix, k_left;
    __shared__ moeq_cu_lr_best seg_best, row_best;
    const int P = (int)gridDim.x, p = (int)blockIdx.x, row = (int)blockIdx.y, t = threadIdx.x;
    const float *x = logits + (int64_t)row * ld;
    const int64_t lo = (int64_t)p * S, L = V - lo < S ? V - lo : S;
    const int c = V < MOEQ_LOGITS_TOP ? (int)V : MOEQ_LOGITS_TOP;
    const size_t at = ((size_t)row * P + p) * MOEQ_LOGITS_TOP;
    lr_segment<NT>(x + lo, L, lo, L < c ? (int)L : c, sc.cand_key + at, sc.cand_id + at, &seg_best);
    if (t == 0) {
        uint32_t *b = sc.best + ((size_t)row * P + p) * 3;
        b[0] = seg_best.key, b[1] = (uint32_t)seg_best.id, b[2] = (uint32_t)seg_best.nonfinite;
    }
    if (!lr_last_block(sc.done + row)) return;
    // the union, in (partition, rank) order
    int n = 0;
    for (int q = 0; q < P; q++) {
        int64_t lq = V - (int64_t)q * S < S ? V - (int64_t)q * S : S;
        int cq = lq < c ? (int)lq : c;
        const size_t aq = ((size_t)row * P + q) * MOEQ_LOGITS_TOP;
        for (int k = t; k < cq; k += NT) u_key[n + k] = __ldcg(sc.cand_key + aq + k), u_id[n + k] = __ldcg(sc.cand_id + aq + k);
        n += cq;
    }
    if (t == 0) {
        moeq_cu_lr_best best = {0u, (int32_t)V, 0};
        for (int q = 0; q < P; q++) {
            const uint32_t *b = sc.best + ((size_t)row * P + q) * 3;
            moeq_cu_lr_best o = {__ldcg(b), (int32_t)__ldcg(b + 1), (int)__ldcg(b + 2)};
            best = moeq_cu_lr_best_merge(best, o);
        }
        row_best = best;
        prefix = 0, k_left = (uint32_t)c;
    }
    __syncthreads();
    for (int pass = 0; pass < MOEQ_CU_LR_PASSES; pass++) {
        for (int b = t; b < MOEQ_CU_LR_BUCKETS; b += NT) hist[b] = 0;
        __syncthreads();
        moeq_cu_lr_key_pass_thread(u_key, n, NT, t, pass, prefix, hist);
        __syncthreads();
        lr_pick(hist, pass, &prefix, &k_left);
    }
    uint32_t thr = prefix, n_eq = k_left, n_gt = (uint32_t)c - n_eq, gt_base = 0, eq_base = 0;
    for (int j = 0; j < (n + NT - 1) / NT; j++) {
        int i = j * NT + t;
        uint32_t key = i < n ? u_key[i] : 0u;
        int gt = i < n && key > thr, eq = i < n && key == thr;
        uint32_t total, before = block_scan_excl<NT>((uint32_t)gt | ((uint32_t)eq << 16), scan, &total);
        int slot = i < n ? moeq_cu_lr_slot(key, thr, gt_base + (before & 0xffffu), eq_base + (before >> 16), n_gt, n_eq)
                         : -1;
        if (slot >= 0) c_key[slot] = key, c_id[slot] = u_id[i];
        gt_base += total & 0xffffu, eq_base += total >> 16;
        if (gt_base >= n_gt && eq_base >= n_eq) break;
    }
    __syncthreads();
    moeq_logits_record *r = out + row;
    if (t < c) {
        int rank = moeq_cu_lr_rank(c_key, c_id, c, t);
        r->top_id[rank] = c_id[t], r->top_logit[rank] = x[c_id[t]];
    }
    for (int i = c + t; i < MOEQ_LOGITS_TOP; i += NT) r->top_id[i] = 0, r->top_logit[i] = 0.0f; // the CPU's zeros
    if (t == 0) {
        int32_t argmax = moeq_cu_lr_argmax(x, row_best.id);
        r->argmax = argmax;
        r->finite = !row_best.nonfinite;
        r->max = x[argmax];
        r->n_top = c;
        r->temperature = 0.0, r->sum_t = 0.0, r->sum_1 = 0.0; // logits_sum_kernel's, for finite rows
    }
}

// Grid (partitions, rows), NT threads: the sums of a finite row's partition blockIdx.x (per thread in tile order,
// then the fixed tree); the row's last block adds the partitions' in partition order into the record.
template <int NT>
__global__ void logits_sum_kernel(const float *logits, int64_t ld, int64_t V, int64_t S, const double *temp,
                                  lr_scratch sc, moeq_logits_record *out) {
    __shared__ double s_t[NT], s_1[NT];
    const int P = (int)gridDim.x, p = (int)blockIdx.x, row = (int)blockIdx.y, t = threadIdx.x;
    moeq_logits_record *r = out + row;
    if (!r->finite) return; // the same for every block of the row: none counts
    const float *x = logits + (int64_t)row * ld;
    const int64_t lo = (int64_t)p * S, L = V - lo < S ? V - lo : S;
    double temperature = temp[row], top = (double)r->max, inv_t = temperature > 0 ? 1.0 / temperature : 0.0;
    moeq_cu_lr_sum_thread(x + lo, L, NT, t, top, inv_t, &s_t[t], &s_1[t]);
    __syncthreads();
    for (int s = NT / 2; s > 0; s >>= 1) {
        if (t < s) s_t[t] += s_t[t + s], s_1[t] += s_1[t + s];
        __syncthreads();
    }
    if (t == 0) sc.sums[((size_t)row * P + p) * 2] = s_t[0], sc.sums[((size_t)row * P + p) * 2 + 1] = s_1[0];
    if (!lr_last_block(sc.done + row) || t != 0) return;
    double st = 0.0, s1 = 0.0;
    for (int q = 0; q < P; q++)
        st += __ldcg(sc.sums + ((size_t)row * P + q) * 2), s1 += __ldcg(sc.sums + ((size_t)row * P + q) * 2 + 1);
    r->temperature = temperature > 0 ? temperature : 0.0;
    r->sum_t = temperature > 0 ? st : 0.0;
    r->sum_1 = s1;
}

// The partitioned kernels' scratch for n_rows rows of V values (grown, never shrunk; the counters start at 0).
static int lr_scratch_reserve(cuda_backend *cb, int64_t n_rows, int P, lr_scratch *sc) {
    size_t per_row = (size_t)P * (MOEQ_LOGITS_TOP * 8 + 3 * 4 + 2 * 8) + 4, need = per_row * (size_t)n_rows;
    if (need > cb->lr_bytes) {
        cu_ok(cb, cudaFree(cb->lr_buf), "cudaFree (logits scratch)");
        cb->lr_buf = NULL, cb->lr_bytes = 0;
        if (!cu_ok(cb, cudaMalloc(&cb->lr_buf, need), "cudaMalloc (logits scratch)")) return 0;
        cb->lr_bytes = need;
    }
    // doubles first (alignment), then the 4-byte arrays, the counters last
    char *base = (char *)cb->lr_buf;
    size_t rows = (size_t)n_rows, parts = rows * (size_t)P;
    sc->sums = (double *)base;
    sc->cand_key = (uint32_t *)(base + parts * 16);
    sc->cand_id = (int32_t *)(base + parts * (16 + MOEQ_LOGITS_TOP * 4));
    sc->best = (uint32_t *)(base + parts * (16 + MOEQ_LOGITS_TOP * 8));
    sc->done = (unsigned *)(base + cb->lr_bytes - rows * 4);
    return 1;
}

static void cuda_logits_reduce(moeq_backend *b, const float *logits, int64_t ld, int64_t n_rows, int64_t vocab,
                               const double *temperature, moeq_logits_record *out) {
    cuda_backend *cb = (cuda_backend *)b;
    if (n_rows <= 0) return;
    size_t rec_bytes = (size_t)n_rows * sizeof(moeq_logits_record), t_bytes = (size_t)n_rows * sizeof(double);
    void *d_rec = NULL;
    const int NT = MOEQ_CU_LR_THREADS, P = moeq_cu_lr_parts(vocab, NT);
    const int64_t S = moeq_cu_lr_part_len(vocab, NT);
    lr_scratch sc;
    if (in_bracket(cb, "logits records (a wait) in a captured step") || n_rows > 65535 ||
        !lr_scratch_reserve(cb, n_rows, P, &sc) || !stage_reserve(cb, STAGED(rec_bytes) + STAGED(t_bytes)) ||
        !cu_ok(cb, cudaMemsetAsync(sc.done, 0, (size_t)n_rows * sizeof(unsigned), cb->stream),
               "cudaMemsetAsync (logits counters)")) // the last blocks reset them too: this guards a failed launch
        goto failed;
    {
        const double *d_t = (const double *)stage_up(cb, temperature, t_bytes, "cudaMemcpyAsync (temperatures)");
        moeq_logits_record *h_rec = d_t ? (moeq_logits_record *)stage(cb, rec_bytes, &d_rec) : NULL;
        if (!h_rec) goto failed;
        dim3 grid((unsigned)P, (unsigned)n_rows);
        logits_select_kernel<MOEQ_CU_LR_THREADS><<<grid, NT, 0, cb->stream>>>(logits, ld, vocab, S, sc,
                                                                             (moeq_logits_record *)d_rec);
        if (!launched(cb, "logits_select_kernel launch")) goto failed;
        logits_sum_kernel<MOEQ_CU_LR_THREADS><<<grid, NT, 0, cb->stream>>>(logits, ld, vocab, S, d_t, sc,
                                                                          (moeq_logits_record *)d_rec);
        if (!launched(cb, "logits_sum_kernel launch") ||
            !cu_ok(cb, cudaMemcpyAsync(h_rec, d_rec, rec_bytes, cudaMemcpyDeviceToHost, cb->stream),
                   "cudaMemcpyAsync (logits records)") ||
            !cu_ok(cb, cudaStreamSynchronize(cb->stream), "cudaStreamSynchronize (logits records)"))
            goto failed;
        memcpy(out, h_rec, rec_bytes);
        cb->stage_off = 0; // drained: the staging is free again
        return;
    }
failed: // an error is kept (the step fails at its status check): records that decide nothing wrong meanwhile
    for (int64_t i = 0; i < n_rows; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].finite = 0; // "non-finite": a sampler returns -1 and reads nothing of it
    }
}

// ---- CUDA graphs: a step's layers captured per bucket, replayed with the host data in fixed regions ----------------

// Rows of a step's bucket, or 0: graphs off, past the largest bucket, a bucket whose capture failed, an error kept.
static int64_t cuda_graph_rows(const moeq_backend *b, int64_t n_tok) {
    const cuda_backend *cb = (const cuda_backend *)b;
    int i = cb->p.graphs && !cb->err ? moeq_cu_graph_bucket(cb->gsize, cb->n_gb, n_tok) : -1;
    return i < 0 || cb->gb[i].failed ? 0 : cb->gsize[i];
}

// A bucket's fixed staging, generously: the step's ids, cos/sin and n_valid, and two position regions per layer
// (the fixed table is synced outside the bracket); a capture that needs more breaks and the bucket runs eagerly.
static size_t bucket_stage_bytes(const cuda_backend *cb, int64_t rows) {
    int layers = cb->model ? cb->model->config.num_hidden_layers : 1;
    return (size_t)rows * 4096 + (size_t)(4 * layers + 64) * STAGED((size_t)rows * 64) + ((size_t)1 << 20);
}

static int bucket_ready(cuda_backend *cb, graph_bucket *g, int64_t rows) {
    if (g->stage_h) return 1;
    size_t bytes = bucket_stage_bytes(cb, rows);
    if (!graph_alloc(cb, (void **)&g->stage_h, bytes, 1, "cudaHostAlloc (graph staging)")) {
        g->failed = 1; // the bucket's steps run eagerly, unpadded, from now on
        return 0;
    }
    if (!graph_alloc(cb, (void **)&g->stage_d, bytes, 0, "cudaMalloc (graph staging)")) {
        cudaFreeHost(g->stage_h);
        g->stage_h = NULL, g->failed = 1;
        return 0;
    }
    g->stage_cap = bytes;
    return 1;
}

// A capture that did not give a graph: the bucket runs eagerly from now on; the reason kept for describe().
static void capture_failed(cuda_backend *cb, graph_bucket *g, const char *call, cudaError_t e) {
    char why[160];
    snprintf(why, sizeof why, "%s: %s", call, cudaGetErrorString(e));
    if (e != cudaSuccess) broken(cb, why);
    (void)cudaGetLastError(); // a failed capture's error is answered here, not by the next launch
    g->failed = 1;
}

// graph_begin did not open the bracket: its ops are no-ops and graph_end answers "issue them again". The reason is
// kept for describe() (an error kept names itself in status): without it a step refused for good (no fixed table
// for the cache) fell back every time while describe() gave no cause.
static void refused(cuda_backend *cb, const char *why) {
    if (!cb->err && !cb->graph_why[0]) snprintf(cb->graph_why, sizeof cb->graph_why, "%s", why);
    cb->br.mode = BR_REPLAY, cb->br.broken = 1;
}

static void cuda_graph_begin(moeq_backend *b, const moeq_graph_step *st) {
    cuda_backend *cb = (cuda_backend *)b;
    memset(&cb->br, 0, sizeof cb->br);
    cb->br.mode = BR_REPLAY; // until accepted: every op a no-op, and graph_end answers "issue them again"
    cb->br.broken = 1;
    int i = moeq_cu_graph_bucket(cb->gsize, cb->n_gb, st->n_rows);
    if (cb->err || !cb->p.graphs || i < 0 || cb->gsize[i] != st->n_rows || cb->gb[i].failed || st->n_valid < 1 ||
        st->n_valid > st->n_rows || st->scratch_block < 0) {
        refused(cb, "graph_begin: a step not padded to a bucket that captures (or no scratch block)");
        return;
    }
    graph_bucket *g = &cb->gb[i];
    cb->br.mode = BR_NONE; // allocations and the drain are not in any bracket
    if (!fixed_ready(cb, st->block_tokens) || !bucket_ready(cb, g, st->n_rows)) {
        refused(cb, "graph_begin: no fixed-stride block table for the cache (its block count, or host memory)");
        return;
    }
    drain(cb, "cudaStreamSynchronize (before a captured step)"); // the region's last readers are done
    if (cb->err) {
        refused(cb, "");
        return;
    }
    // the step's fixed table, eagerly before the bracket (only its changed rows): the bracket's calls find it
    if (!fixed_sync(cb, st->block_table, st->table_stride, st->block_tokens, st->seq, st->pos, st->n_valid,
                    st->n_rows, st->scratch_block) || cb->err) {
        refused(cb, "graph_begin: a position past the fixed block table's stride (max_ctx)");
        return;
    }
    cb->br.broken = 0, cb->br.bucket = i, cb->br.n_rows = st->n_rows, cb->br.n_valid = st->n_valid;
    cb->br.scratch = st->scratch_block;
    cb->br.table = st->block_table, cb->br.seq = st->seq, cb->br.pos = st->pos;
    if (!g->exec) {
        g->n_regions = 0;
        cudaError_t e = cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal);
        if (e != cudaSuccess) {
            capture_failed(cb, g, "cudaStreamBeginCapture", e);
            cb->br.mode = BR_REPLAY;
            return;
        }
        cb->br.mode = BR_CAPTURE;
    } else
        cb->br.mode = BR_REPLAY;
    int64_t nv = st->n_valid; // first: moe_experts' counts read it
    cb->br.nvalid_d = (const int64_t *)stage_up(cb, &nv, sizeof nv, "cudaMemcpyAsync (n_valid)");
}

static int cuda_graph_end(moeq_backend *b) {
    cuda_backend *cb = (cuda_backend *)b;
    int mode = cb->br.mode, bad = cb->br.broken || cb->err != MOEQ_OK;
    graph_bucket *g = &cb->gb[cb->br.bucket];
    if (mode == BR_NONE) return 0;
    if (mode == BR_CAPTURE) {
        cudaGraph_t graph = NULL;
        cudaError_t e = cudaStreamEndCapture(cb->stream, &graph); // always: the stream leaves capture mode
        if (e == cudaSuccess && !bad) e = cudaGraphInstantiate(&g->exec, graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (e != cudaSuccess || bad) {
            int transient = e == cudaSuccess && cb->br.transient && !cb->err;
            capture_failed(cb, g, e != cudaSuccess ? "capture" : "capture (a step op could not be recorded)", e);
            g->failed = !transient; // a step past the workspace: the bucket's next step captures
            g->exec = NULL;
            goto again;
        }
        cb->n_captured++;
    } else if (bad || cb->br.region != g->n_regions) {
        broken(cb, "a replay staged less host data than its capture");
        goto again;
    } else
        cb->n_replays++;
    memset(&cb->br, 0, sizeof cb->br);
    cu_ok(cb, cudaGraphLaunch(g->exec, cb->stream), "cudaGraphLaunch"); // a launch error fails the step
    return 0;
again: // nothing of the bracket ran (the fixed table was synced before it, eagerly)
    cb->n_fallbacks += !cb->err;
    memset(&cb->br, 0, sizeof cb->br);
    return 1;
}

// ---- lifetime -------------------------------------------------------------------------------------------------------

extern "C" int moeq_backend_cuda_supports(moeq_backend_op op, moeq_dtype dtype) {
    if ((int)op < 0 || op >= MOEQ_BACKEND_OP_COUNT) return 0;
    return dtype == MOEQ_DTYPE_F32 || dtype == MOEQ_DTYPE_BF16 || dtype == MOEQ_DTYPE_F16 ||
           dtype == MOEQ_DTYPE_F8_E4M3;
}

static int cuda_supports(const moeq_backend *b, moeq_backend_op op, moeq_dtype dtype) {
    (void)b;
    return moeq_backend_cuda_supports(op, dtype);
}

static const char *cuda_describe(const moeq_backend *b) {
    cuda_backend *cb = (cuda_backend *)b; // the counts change: the line is written when asked
    char held[120];
    snprintf(held, sizeof held, "%d of %d routed experts held, %.1f MiB", cb->experts_held, cb->experts_total,
             (double)cb->expert_bytes / (1 << 20));
    if (!cb->p.graphs) {
        snprintf(cb->desc, sizeof cb->desc, "%s; %s; CUDA graphs: off", cb->info, held);
        return cb->desc;
    }
    snprintf(cb->desc, sizeof cb->desc,
             "%s; %s; CUDA graphs: on (steps of <= %lld tokens padded to buckets 1..%lld: %d captured, %d replays, "
             "%d steps issued again eagerly%s%s)",
             cb->info, held, (long long)cb->gsize[cb->n_gb - 1], (long long)cb->gsize[cb->n_gb - 1], cb->n_captured,
             cb->n_replays, cb->n_fallbacks, cb->graph_why[0] ? ": " : "", cb->graph_why);
    return cb->desc;
}

// The device's memory as the driver counts it (every process on it): used = total - free. 0/0 when it cannot say.
static void cuda_memory(const moeq_backend *b, size_t *used, size_t *total) {
    const cuda_backend *cb = (const cuda_backend *)b;
    size_t free_b = 0, total_b = 0;
    // the current device is the calling thread's: another thread than the creator's would ask device 0 (and make
    // a context there, in every worker process of a multi-GPU machine)
    if (cudaSetDevice(cb->p.device) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        free_b = total_b = 0;
        (void)cudaGetLastError(); // a metric that cannot be read is 0/0, not the next launch's error
    }
    *used = total_b - free_b;
    *total = total_b;
}

static void cuda_destroy(moeq_backend *b) {
    cuda_backend *cb = (cuda_backend *)b;
    if (!cb) return;
    if (cb->stream) cudaStreamSynchronize(cb->stream); // errors here have nowhere to go: the backend is ending
    cudaFree(cb->wslab);
    cudaFree(cb->eslab);
    free(cb->routed);
    free(cb->wdev);
    cudaFree(cb->moe_tab);
    free(cb->moe_key);
    cudaFree(cb->ws);
    cudaFree(cb->lr_buf);
    for (int i = 0; i < MOEQ_CU_GRAPH_MAX_BUCKETS; i++) {
        if (cb->gb[i].exec) cudaGraphExecDestroy(cb->gb[i].exec);
        cudaFree(cb->gb[i].stage_d);
        if (cb->gb[i].stage_h) cudaFreeHost(cb->gb[i].stage_h);
        free(cb->gb[i].regions);
    }
    cudaFree(cb->ftab_d);
    cudaFree(cb->frow_d);
    cudaFree(cb->fplan_d);
    free(cb->ftab_h);
    free(cb->fcand_h);
    free(cb->fnb_h);
    free(cb->fdiff_h);
    cudaFree(cb->wide);
    cudaFree(cb->stage_d);
    if (cb->stage_h) cudaFreeHost(cb->stage_h);
    if (cb->blas) cublasDestroy(cb->blas);
    cudaFree(cb->blas_ws); // after the handle that used it
    if (cb->stream) cudaStreamDestroy(cb->stream);
    free(cb);
}

static const moeq_backend cuda_table = {
    .name = "cuda",
    .host_visible = 0,
    .supports = cuda_supports,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .map_weights = cuda_map_weights,
    .map_experts = cuda_map_experts,
    .sync = cuda_sync,
    .status = cuda_status,
    .describe = cuda_describe,
    .memory = cuda_memory,
    .matmul = cuda_matmul,
    .matmul_nn = cuda_matmul_nn,
    .attention = cuda_attention,
    .attention_naive = cuda_attention_naive,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .rope_cos_sin = cuda_rope_cos_sin,
    .mla_rope = cuda_mla_rope,
    .silu_mul = cuda_silu_mul,
    .add = cuda_add,
    .route = cuda_route,
    .gather = cuda_gather,
    .combine = cuda_combine,
    .moe_experts = cuda_moe_experts,
    .logits_reduce = cuda_logits_reduce,
    .graph_rows = cuda_graph_rows,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .destroy = cuda_destroy,
};

// The creation's steps; the first failure is kept in cb (err, why).
static void create_on_device(cuda_backend *cb) {
    cudaDeviceProp prop;
    if (!cu_ok(cb, cudaSetDevice(cb->p.device), "cudaSetDevice") ||
        !cu_ok(cb, cudaGetDeviceProperties(&prop, cb->p.device), "cudaGetDeviceProperties") ||
        !cu_ok(cb, cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") ||
        !bl_ok(cb, cublasCreate(&cb->blas), "cublasCreate") ||
        !bl_ok(cb, cublasSetStream(cb->blas, cb->stream), "cublasSetStream") ||
        !bl_ok(cb, cublasSetMathMode(cb->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode (FP32, no TF32)"))
        return;
    int64_t T = cb->p.max_tokens > 0 ? cb->p.max_tokens : 2048;
    size_t want = (size_t)T * 64 * 1024; // ids, positions, rows, block tables, the split plan of one step
    cb->stage_cap = want > STAGE_MAX_BYTES ? STAGE_MAX_BYTES : want > STAGE_MIN_BYTES ? want : STAGE_MIN_BYTES;
    if (!cu_ok(cb, cudaHostAlloc((void **)&cb->stage_h, cb->stage_cap, cudaHostAllocDefault),
               "cudaHostAlloc (pinned staging)") ||
        !cu_ok(cb, cudaMalloc((void **)&cb->stage_d, cb->stage_cap), "cudaMalloc (staging)"))
        return;
    if (!cb->p.batch_invariant && cb->p.graphs &&
        (!cu_ok(cb, cudaMalloc(&cb->blas_ws, BLAS_WS_BYTES), "cudaMalloc (cuBLAS workspace)") ||
         !bl_ok(cb, cublasSetWorkspace(cb->blas, cb->blas_ws, BLAS_WS_BYTES), "cublasSetWorkspace")))
        return;
    if (!cb->p.batch_invariant) {
        size_t k = (size_t)(cb->p.max_k > 0 ? cb->p.max_k : 1);
        cb->wide_floats = (size_t)WIDE_BYTES / sizeof(float) / k * k;
        if (cb->wide_floats < k) cb->wide_floats = k;
        if (!cu_ok(cb, cudaMalloc((void **)&cb->wide, cb->wide_floats * sizeof(float)),
                   "cudaMalloc (cuBLAS weight tile)"))
            return;
    }
    snprintf(cb->info, sizeof cb->info, "cuda device %d (%.80s, sm_%d%d, %.0f GiB); %s", cb->p.device, prop.name,
             prop.major, prop.minor, (double)prop.totalGlobalMem / (1 << 30),
             cb->p.batch_invariant ? "batch invariant: own kernels (the CPU's 16-lane order), split-KV attention"
                                   : "cuBLAS SGEMM (FP32, no TF32) for >= blas_min_tokens, own kernels below, "
                                     "split-KV attention");
    // cublasGemmGroupedBatchedEx takes each group's m/n/k from host arrays: the counts would have to come back
    snprintf(cb->info + strlen(cb->info), sizeof cb->info - strlen(cb->info),
             "; products of <= 8 tokens: %s; MoE layers: moe_experts on the device (own grouped kernel, no host "
             "round trip)",
             cb->mv ? "two threads a row, 16-byte loads, BF16/F8 rows of 16k; more: 32 x 32 shared-memory tiles "
                      "(cuda_matrix = auto)"
                    : "16-lane kernels, as more (cuda_matrix = lanes)");
    cb->n_gb = moeq_cu_graph_buckets(T, cb->gsize);
}

extern "C" moeq_err moeq_backend_cuda_new(const moeq_backend_config *config, moeq_backend **out, char *errstr,
                                          size_t errstr_size) {
    *out = NULL;
    char why[200] = "";
    int n = moeq_cuda_device_count(why, sizeof why);
    if (n <= 0)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "backend cuda: %s",
                         why[0] ? why : "no CUDA device");
    if (config->device < 0 || config->device >= n)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "backend cuda: device %d does not exist (%d device%s: 0..%d)", config->device, n,
                         n == 1 ? "" : "s", n - 1);
    cuda_backend *cb = (cuda_backend *)calloc(1, sizeof(*cb));
    if (!cb) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "backend cuda: out of memory creating it");
    cb->base = cuda_table;
    cb->p = *config;
    cb->mv = config->cuda_few_token;
    if (cb->p.blas_min_tokens < 1) cb->p.blas_min_tokens = 16;
    create_on_device(cb);
    if (cb->err) {
        moeq_err err = moeq_errf(cb->err, errstr, errstr_size, "backend cuda (device %d): %s", cb->p.device, cb->why);
        cuda_destroy(&cb->base);
        return err;
    }
    *out = &cb->base;
    return MOEQ_OK;
}
