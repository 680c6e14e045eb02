/*
 * backend_cpu.c — the CPU backend, the reference every other backend is
 * compared with: the kernels of ops_matmul.c and attention.c split into
 * tasks over the persistent pool (backend_pool.c), and the per-row ops
 * (ops.c, rope.c, moe.c) run on the calling thread, in the order forward.c
 * ran them before the seam existed (the bits are pinned by the tests).
 * Memory is host memory (aligned_alloc); upload, download and copy are
 * memcpy; the stream is the calling thread, so sync has nothing to wait for.
 *
 * Tasks: NT matmul = (job, rows, 64 tokens) with 32 rows, or for jobs of at
 * most 16 tokens (decode) about 256 KiB of weights (the kernel's prefetch
 * stream stops at a task's last row, so a short task spends much of its time
 * ramping up); NN = (job, 64 columns, 64 tokens), for few tokens again
 * sized by bytes (columns in multiples of 64); attention = (token, 8
 * heads); the BLAS path = (job, 128 rows).
 * A task's outputs do not depend on which thread runs it, nor on the other
 * tasks. Per-thread scratch (widened weight tile, attention scores) is
 * allocated at creation.
 */
#include "backend.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "attention.h"
#include "attention_amx.h"
#include "backend_pool.h"
#include "cpu_tuning.h"
#include "logits_reduce.h"
#include "moe_route.h"
#include "ops.h"
#include "moeq/engine.h"
#include "ops_amx.h"
#include "ops_draft.h"
#include "ops_matmul.h"

#define NT_ROWS 32
#define NT_ROWS_AMX 128              /* AMX jobs on panels                      */
#define NT_SMALL_TOKS 16             /* jobs this small get tasks sized by bytes */
#define NT_TASK_BYTES (256 << 10)    /* weight bytes per task for those         */
#define NT_ROWS_MAX 1024
#define NT_TOKS 64
#define NN_COLS 64
#define BLAS_ROWS 128

typedef struct cpu_backend {
    moeq_backend base; /* first: the table */
    moeq_backend_config p;
    moeq_pool *pool;
    float **wbuf;      /* [n_threads] BLAS_ROWS * max_k   */
    void **ws;         /* [n_threads] the NT kernels' workspace (moeq_mm_nt_ws_bytes(max_k)) */
    void **dws;        /* [n_threads] the draft kernels' own (moeq_draft_ws_bytes(max_k)): codes kept across tasks */
    size_t dws_bytes;
    uint64_t call_seq; /* matmul calls so far: with a job's index, the draft kernels' key for its codes */
    size_t ws_bytes;
    char info[224];    /* describe(): the kernels, threads and mode */
    int64_t *attn_group;   /* [attn_group_max + 1] first token of each attention group, then n_tok */
    int64_t attn_group_max;
    int attn_grouped;      /* this call's tasks are groups (else one token each) */
    atomic_llong held_bytes;   /* what alloc() handed out and release() has not taken back */
    float **scores;    /* [n_threads] GROUP * head block * (max_ctx + 1) */
    void **attn_ws;    /* [n_threads] the AMX attention's workspace, grown by its own thread */
    int attn_hb;       /* the current attention call's heads per task */
    size_t *attn_ws_bytes;
    /* the AMX attention's rows split once per call for the sequences of several groups (attention_amx.h) */
    void *split_buf;
    size_t split_cap;
    moeq_mla_amx_split *splits; /* [attn_group_max + 1] */
    int64_t *split_end;         /* [attn_group_max + 1] prefix sums of their slabs */
    int *split_of;              /* [attn_group_max + 1] each group's split, or -1 */
    int n_splits;
    int64_t *task_end; /* [max_jobs] prefix sums of tasks per job */
    moeq_mm_job *moe_jobs; /* [max_jobs] moe_experts' GEMMs */
    /* the current dispatch */
    const moeq_mm_job *jobs;
    int n_jobs;
    int use_blas;
    const moeq_mla_params *attn;
    /* the AMX path (p.amx): this call's packed activations, one region per distinct x, and each job's view */
    uint32_t *pack;
    size_t pack_cap;
    moeq_amx_xview *views;  /* [max_jobs]; pack NULL: the job takes the float32-lane kernels */
    struct amx_region {
        const float *x;
        int64_t ldx, k, n;
        size_t off;         /* into pack, in dwords */
        int panels;         /* the panel layout (else rows) */
    } *regions;             /* [max_jobs] */
    int *region_of;         /* [max_jobs] each job's region while amx_plan lays out the pack */
    int n_regions;
} cpu_backend;

static int cpu_supports(const moeq_backend *b, moeq_backend_op op, moeq_dtype dtype) {
    (void)b;
    if (op < 0 || op >= MOEQ_BACKEND_OP_COUNT) return 0;
    return dtype == MOEQ_DTYPE_F32 || dtype == MOEQ_DTYPE_BF16 || dtype == MOEQ_DTYPE_F16 ||
           dtype == MOEQ_DTYPE_F8_E4M3;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Which job a task belongs to, and the task's index inside it. */
static int find_job(const cpu_backend *cb, int64_t task, int64_t *local) {
    int lo = 0, hi = cb->n_jobs - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (task < cb->task_end[mid]) hi = mid;
        else lo = mid + 1;
    }
    *local = task - (lo ? cb->task_end[lo - 1] : 0);
    return lo;
}

/* Columns per NN task: 64, or for jobs of few tokens about NT_TASK_BYTES of weights (the whole job when smaller). */
static int64_t nn_cols(const moeq_mm_job *job) {
    int64_t cols = moeq_tensor_cols(job->w);
    if (job->n_tok > NT_SMALL_TOKS) return NN_COLS;
    int64_t col_bytes = job->n_rows * (int64_t)moeq_dtype_size(job->w->dtype);
    int64_t n = NT_TASK_BYTES / (col_bytes > 0 ? col_bytes : 1) / NN_COLS * NN_COLS;
    return n < NN_COLS ? NN_COLS : n > cols ? cols : n;
}

/* Output rows per NT task: the split decides only which thread computes an element, never its value. */
static int64_t nt_rows(const cpu_backend *cb, const moeq_mm_job *job) {
    if (job->n_tok > NT_SMALL_TOKS) {
        /* F8 tasks hold a whole 128-row scale block: the kernel scales the activations once per block */
        if (job->w->dtype == MOEQ_DTYPE_F8_E4M3) return MOEQ_F8_BLOCK;
        /* AMX tasks on panels hold four strips, each of whose first pass fetches the next one's weights (ops_amx.c):
         * with one strip a task the next strip was mostly another thread's. bench-engine BF16, 2 threads: prefill 512
         * 1.08-1.16x, batch 32 1.03-1.08x against 32 rows without the fetch */
        return cb->p.amx && cb->views[job - cb->jobs].panels ? NT_ROWS_AMX : NT_ROWS;
    }
    int64_t row_bytes = moeq_tensor_cols(job->w) * (int64_t)moeq_dtype_size(job->w->dtype);
    int64_t rows = NT_TASK_BYTES / (row_bytes > 0 ? row_bytes : 1) / 16 * 16;
    rows = rows < NT_ROWS ? NT_ROWS : rows > NT_ROWS_MAX ? NT_ROWS_MAX : rows;
    /* F8: whole 128-row scale blocks, each of whose activations the kernel scales once (ops_matmul.c) */
    if (job->w->dtype == MOEQ_DTYPE_F8_E4M3) rows = (rows + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK * MOEQ_F8_BLOCK;
    return rows;
}

/* A job on the AMX tiles in blocks of more than NT_SMALL_TOKS tokens (not for BLAS: cb->views is this call's). */
static int amx_many_tokens(const cpu_backend *cb, const moeq_mm_job *job) {
    return cb->p.amx && job->n_tok > NT_SMALL_TOKS && cb->views[job - cb->jobs].pack;
}

/* Tokens per NT task: the AMX kernel's choice for jobs on the tiles (moeq_amx_block_tokens), else NT_TOKS. */
static int64_t nt_toks(const cpu_backend *cb, const moeq_mm_job *job) {
    return amx_many_tokens(cb, job) ? moeq_amx_block_tokens(job->w) : NT_TOKS;
}

/* The block of an NT task (not for BLAS): its job, rows [n0, n1) and tokens [t0, t1). */
typedef struct nt_block {
    const moeq_mm_job *job;
    int64_t n0, n1, t0, t1;
} nt_block;

static nt_block nt_block_of(cpu_backend *cb, int64_t task) {
    int64_t local;
    const moeq_mm_job *job = &cb->jobs[find_job(cb, task, &local)];
    int64_t toks = nt_toks(cb, job), n_tb = ceil_div(job->n_tok, toks), rows = nt_rows(cb, job);
    int64_t n0 = (local / n_tb) * rows, t0 = (local % n_tb) * toks;
    const moeq_amx_xview *xv = cb->p.amx ? &cb->views[job - cb->jobs] : NULL;
    if ((xv && xv->pack) || moeq_draft_fits(job->w)) {
        /* token blocks outermost: a block's pack (a draft's int8 codes, kept per thread) stays while the weights
         * stream past */
        int64_t n_rb = ceil_div(job->n_rows, rows);
        n0 = (local % n_rb) * rows, t0 = (local / n_rb) * toks;
    }
    return (nt_block){job, n0, n0 + rows < job->n_rows ? n0 + rows : job->n_rows, t0,
                      t0 + toks < job->n_tok ? t0 + toks : job->n_tok};
}

/* The first weight rows of the worker's next task when that runs on the AMX tiles (a hint for the kernel). */
static int amx_then(cpu_backend *cb, int worker, moeq_amx_then *then) {
    int64_t next = moeq_pool_next_task(cb->pool, worker);
    if (next < 0) return 0;
    nt_block b = nt_block_of(cb, next);
    if (!cb->views[b.job - cb->jobs].pack || moeq_draft_fits(b.job->w)) return 0;
    int64_t row_bytes = moeq_tensor_cols(b.job->w) * (int64_t)moeq_dtype_size(b.job->w->dtype);
    *then = (moeq_amx_then){(const uint8_t *)b.job->w->data + (b.job->row0 + b.n0) * row_bytes, row_bytes, row_bytes};
    return 1;
}

static void nt_task(void *ctx, int64_t task, int worker) {
    cpu_backend *cb = ctx;
    if (cb->use_blas) {
        int64_t local;
        const moeq_mm_job *job = &cb->jobs[find_job(cb, task, &local)];
        int64_t n0 = local * BLAS_ROWS, n1 = n0 + BLAS_ROWS < job->n_rows ? n0 + BLAS_ROWS : job->n_rows;
        moeq_mm_nt_blas_block(job, n0, n1, cb->wbuf[worker]);
        return;
    }
    nt_block b = nt_block_of(cb, task);
    const moeq_mm_job *job = b.job;
    const moeq_amx_xview *xv = cb->p.amx ? &cb->views[job - cb->jobs] : NULL;
    if (moeq_draft_fits(job->w)) /* the key names this call's job: a worker quantises its tokens once */
        moeq_draft_nt_block(job, b.n0, b.n1, b.t0, b.t1, cb->dws[worker], cb->dws_bytes,
                            cb->call_seq << 20 | (uint64_t)(job - cb->jobs + 1));
    else if (xv && xv->pack) {
        moeq_amx_then then;
        moeq_amx_nt_block(job, xv, b.n0, b.n1, b.t0, b.t1, amx_then(cb, worker, &then) ? &then : NULL, cb->ws[worker],
                          cb->ws_bytes);
    } else moeq_mm_nt_block_ws(job, b.n0, b.n1, b.t0, b.t1, cb->ws[worker], cb->ws_bytes);
}

static void nn_task(void *ctx, int64_t task, int worker) {
    (void)worker;
    cpu_backend *cb = ctx;
    int64_t local;
    const moeq_mm_job *job = &cb->jobs[find_job(cb, task, &local)];
    int64_t cols = moeq_tensor_cols(job->w), n_tb = ceil_div(job->n_tok, NT_TOKS), per = nn_cols(job);
    int64_t c0 = (local / n_tb) * per, t0 = (local % n_tb) * NT_TOKS;
    int64_t c1 = c0 + per < cols ? c0 + per : cols;
    int64_t t1 = t0 + NT_TOKS < job->n_tok ? t0 + NT_TOKS : job->n_tok;
    moeq_mm_nn_block(job, c0, c1, t0, t1);
}

/* BLAS only when every job has enough tokens (a choice per call, not per element) and none is a draft's. */
static int blas_for(const cpu_backend *cb, const moeq_mm_job *jobs, int n_jobs) {
    if (cb->p.batch_invariant) return 0;
    for (int i = 0; i < n_jobs; i++)
        if (jobs[i].n_tok < cb->p.blas_min_tokens || moeq_draft_fits(jobs[i].w)) return 0;
    return 1;
}

/*
 * The AMX path's activations: jobs of 16 tokens or more (prefill, batched decode, the experts' slices of a
 * prefill) take panels, one region per distinct x (gate and up of one input share it); fewer-token jobs
 * whose x rows continue or repeat an earlier such job's (the experts' slices in decode) share one region
 * in the row layout, each reading its tokens at an offset into it. Each region is packed once for the
 * call. The pack is grown here when a call needs more than any before (pages are only touched as used);
 * a machine without that memory cannot run the step at all.
 */
static void amx_plan(cpu_backend *cb, const moeq_mm_job *jobs, int n_jobs) {
    cb->n_regions = 0;
    int *region_of = cb->region_of;
    for (int i = 0; i < n_jobs; i++) {
        const moeq_mm_job *j = &jobs[i];
        cb->views[i] = (moeq_amx_xview){0};
        region_of[i] = -1;
        if (j->n_tok <= 0 || !moeq_amx_fits(j->w) || moeq_draft_fits(j->w)) continue;
        int64_t k = moeq_tensor_cols(j->w), off = -1;
        const int panels = j->n_tok >= 16;
        int r = 0;
        for (; r < cb->n_regions; r++) {
            struct amx_region *g = &cb->regions[r];
            if (g->panels != panels || g->ldx != j->ldx || g->k != k || j->x < g->x || (j->x - g->x) % j->ldx)
                continue;
            off = (j->x - g->x) / j->ldx;
            if (panels ? off == 0 : off <= g->n) break;
        }
        if (r == cb->n_regions)
            cb->regions[cb->n_regions++] = (struct amx_region){j->x, j->ldx, k, 0, 0, panels}, off = 0;
        struct amx_region *g = &cb->regions[r];
        if (off + j->n_tok > g->n) g->n = off + j->n_tok;
        cb->views[i].tok0 = off;
        cb->views[i].panels = panels;
        region_of[i] = r;
    }
    size_t need = 0;
    for (int r = 0; r < cb->n_regions; r++) {
        const struct amx_region *g = &cb->regions[r];
        cb->regions[r].off = need;
        need += (g->panels ? moeq_amx_panel_bytes(g->n, g->k) : moeq_amx_pack_bytes(g->n, g->k)) / 4;
        need = (need + 15) / 16 * 16; /* panels start on a 64-byte line */
    }
    if (need * 4 > cb->pack_cap) {
        free(cb->pack);
        cb->pack_cap = (need * 4 + (1u << 20)) / 64 * 64;
        if (!(cb->pack = aligned_alloc(64, cb->pack_cap))) {
            fprintf(stderr, "moeq: cpu backend: cannot allocate %zu bytes for the AMX activation pack\n",
                    cb->pack_cap);
            abort();
        }
    }
    for (int i = 0; i < n_jobs; i++) {
        if (region_of[i] < 0) continue;
        const struct amx_region *g = &cb->regions[region_of[i]];
        cb->views[i].pack = cb->pack + g->off;
        cb->views[i].n_pad = moeq_amx_pack_cols(g->n);
    }
}

static void amx_pack_task(void *ctx, int64_t task, int worker) {
    (void)worker;
    cpu_backend *cb = ctx;
    int r = 0;
    while (task >= moeq_amx_pack_groups(cb->regions[r].n)) task -= moeq_amx_pack_groups(cb->regions[r].n), r++;
    const struct amx_region *g = &cb->regions[r];
    if (g->panels) moeq_amx_pack_panel(g->x, g->ldx, g->n, g->k, cb->pack + g->off, task);
    else moeq_amx_pack_group(g->x, g->ldx, g->n, g->k, cb->pack + g->off, task);
}

static void cpu_matmul(moeq_backend *b, const moeq_mm_job *jobs, int n_jobs) {
    cpu_backend *cb = (cpu_backend *)b;
    if (n_jobs <= 0) return;
    cb->jobs = jobs;
    cb->n_jobs = n_jobs;
    cb->call_seq++;
    cb->use_blas = blas_for(cb, jobs, n_jobs);
    if (cb->p.amx && !cb->use_blas) {
        amx_plan(cb, jobs, n_jobs);
        int64_t groups = 0;
        for (int r = 0; r < cb->n_regions; r++) groups += moeq_amx_pack_groups(cb->regions[r].n);
        if (groups) moeq_pool_run(cb->pool, amx_pack_task, cb, groups);
    }
    int64_t total = 0;
    int fetch_ahead = 0; /* a job on the tiles whose blocks fetch the next task's first strip (amx_then) */
    for (int i = 0; i < n_jobs; i++) {
        const moeq_mm_job *job = &jobs[i];
        int64_t n = cb->use_blas ? ceil_div(job->n_rows, BLAS_ROWS)
                                 : ceil_div(job->n_rows, nt_rows(cb, job)) * ceil_div(job->n_tok, nt_toks(cb, job));
        total += jobs[i].n_tok > 0 ? n : 0;
        cb->task_end[i] = total;
        fetch_ahead |= !cb->use_blas && amx_many_tokens(cb, job);
    }
    if (fetch_ahead) moeq_pool_run_ahead(cb->pool, nt_task, cb, total);
    else moeq_pool_run(cb->pool, nt_task, cb, total);
}

static void cpu_matmul_nn(moeq_backend *b, const moeq_mm_job *jobs, int n_jobs) {
    cpu_backend *cb = (cpu_backend *)b;
    if (n_jobs <= 0) return;
    cb->jobs = jobs;
    cb->n_jobs = n_jobs;
    int64_t total = 0;
    for (int i = 0; i < n_jobs; i++) {
        total += ceil_div(moeq_tensor_cols(jobs[i].w), nn_cols(&jobs[i])) * ceil_div(jobs[i].n_tok, NT_TOKS);
        cb->task_end[i] = total;
    }
    moeq_pool_run(cb->pool, nn_task, cb, total);
}

/* Task = (group of query tokens, head block): groups are runs of up to MOEQ_ATTN_GROUP (lanes) or
 * MOEQ_MLA_AMX_GROUP (AMX) prefill tokens. */
static int attn_head_block(const cpu_backend *cb) { return cb->p.amx ? MOEQ_MLA_AMX_HEAD_BLOCK : MOEQ_ATTN_HEAD_BLOCK; }
static int attn_group_tokens(const cpu_backend *cb) { return cb->p.amx ? MOEQ_MLA_AMX_GROUP : MOEQ_ATTN_GROUP; }

/* The AMX attention's workspace of this worker, grown for this layer's shape. */
static void *attn_ws(cpu_backend *cb, int worker, const moeq_mla_params *a, size_t *bytes) {
    size_t need = moeq_mla_amx_ws_bytes(a->kv_lora, a->rope);
    if (need > cb->attn_ws_bytes[worker]) {
        free(cb->attn_ws[worker]);
        cb->attn_ws_bytes[worker] = 0;
        if (!(cb->attn_ws[worker] = aligned_alloc(64, need))) {
            fprintf(stderr, "moeq: cpu backend: cannot allocate %zu bytes for the AMX attention workspace\n", need);
            abort(); /* the attention op has no error return; a few hundred KiB */
        }
        cb->attn_ws_bytes[worker] = need;
    }
    *bytes = cb->attn_ws_bytes[worker];
    return cb->attn_ws[worker];
}

static void attn_task(void *ctx, int64_t task, int worker) {
    cpu_backend *cb = ctx;
    const moeq_mla_params *a = cb->attn;
    const int hb = cb->attn_hb;
    int64_t n_hb = ceil_div(a->n_heads, hb), g = task / n_hb;
    int h0 = (int)(task % n_hb) * hb;
    int h1 = h0 + hb < a->n_heads ? h0 + hb : a->n_heads;
    if (cb->p.amx) { /* one path per process: prefill and decode take the same tiles */
        size_t bytes;
        void *ws = attn_ws(cb, worker, a, &bytes);
        int64_t t0 = cb->attn_grouped ? cb->attn_group[g] : g;
        int nt = cb->attn_grouped ? (int)(cb->attn_group[g + 1] - t0) : 1;
        const moeq_mla_amx_split *sp = cb->attn_grouped && cb->split_of[g] >= 0 ? &cb->splits[cb->split_of[g]] : NULL;
        moeq_mla_group_amx(a, t0, nt, h0, h1, sp, cb->scores[worker], ws, bytes);
        return;
    }
    if (!cb->attn_grouped) { /* a step longer than the group table: one token per task */
        moeq_mla_block(a, g, h0, h1, cb->scores[worker]);
        return;
    }
    int64_t t0 = cb->attn_group[g];
    moeq_mla_group(a, t0, (int)(cb->attn_group[g + 1] - t0), h0, h1, cb->scores[worker]);
}

static void split_task(void *ctx, int64_t task, int worker) {
    (void)worker;
    cpu_backend *cb = ctx;
    int e = 0;
    while (task >= cb->split_end[e]) e++;
    moeq_mla_amx_split_slab(cb->attn, &cb->splits[e], task - (e ? cb->split_end[e - 1] : 0));
}

/*
 * The AMX path: each run of two or more groups of one sequence (a prefill) gets its rows split once, before the
 * tasks, in parallel by slabs; the groups' tasks then only split their last slab. Splits are laid out in one
 * buffer, grown as a call needs (pages touched only as used), up to SPLIT_MAX_BYTES a call: sequences past it,
 * or all of them when the memory cannot be had, split their rows per task as before. Which way a task gets its
 * operands changes no value.
 */
#define SPLIT_MAX_BYTES ((size_t)1 << 30)

static void plan_splits(cpu_backend *cb, const moeq_mla_params *args, int64_t n_groups) {
    cb->n_splits = 0;
    size_t total = 0;
    for (int64_t g = 0; g < n_groups; g++) { /* split_end holds each split's offset in the buffer until it is had */
        int64_t g1 = g;
        while (g1 + 1 < n_groups && args->seq[cb->attn_group[g1 + 1]] == args->seq[cb->attn_group[g]]) g1++;
        int64_t n = 0; /* the longest context of the run's tokens */
        for (int64_t t = cb->attn_group[g]; t < cb->attn_group[g1 + 1]; t++)
            if (args->pos[t] + 1 > n) n = args->pos[t] + 1;
        const size_t bytes = (moeq_mla_amx_split_bytes(args->kv_lora, args->rope, n) + 63) / 64 * 64;
        int e = -1;
        if (g1 > g && total + bytes <= SPLIT_MAX_BYTES) {
            e = cb->n_splits++;
            cb->splits[e].n = n, cb->splits[e].seq = args->seq[cb->attn_group[g]], cb->split_end[e] = (int64_t)total;
            total += bytes;
        }
        for (int64_t i = g; i <= g1; i++) cb->split_of[i] = e;
        g = g1;
    }
    if (cb->n_splits && total > cb->split_cap) {
        free(cb->split_buf);
        cb->split_cap = 0;
        if ((cb->split_buf = aligned_alloc(64, total))) cb->split_cap = total;
    }
    if (cb->n_splits && !cb->split_buf) { /* no memory: every task splits its own rows */
        for (int64_t g = 0; g < n_groups; g++) cb->split_of[g] = -1;
        cb->n_splits = 0;
    }
    int64_t slabs = 0;
    for (int e = 0; e < cb->n_splits; e++) {
        moeq_mla_amx_split *sp = &cb->splits[e];
        *sp = moeq_mla_amx_split_at(args->kv_lora, args->rope, sp->seq, sp->n,
                                    (uint8_t *)cb->split_buf + (size_t)cb->split_end[e]);
        slabs += moeq_mla_amx_split_slabs(sp->n);
        cb->split_end[e] = slabs;
    }
    if (slabs) moeq_pool_run(cb->pool, split_task, cb, slabs);
}

static void cpu_attention(moeq_backend *b, const moeq_mla_params *args) {
    cpu_backend *cb = (cpu_backend *)b;
    cb->attn = args;
    int64_t n_groups = 0;
    cb->attn_grouped = args->n_tok <= cb->attn_group_max;
    if (!cb->attn_grouped) n_groups = args->n_tok;
    for (int64_t t = 0; cb->attn_grouped && t < args->n_tok; t++) { /* a new group unless t continues t-1's run */
        int64_t g0 = n_groups ? cb->attn_group[n_groups - 1] : -1;
        int joins = n_groups && t - g0 < attn_group_tokens(cb) && args->seq[t] == args->seq[t - 1] &&
                    args->pos[t] == args->pos[t - 1] + 1;
        if (!joins) cb->attn_group[n_groups++] = t;
    }
    if (cb->attn_grouped) cb->attn_group[n_groups] = args->n_tok;
    /* Fewer tasks than threads (a decode of one sequence, a verify step's group of tokens): AMX's head blocks
     * cut finer so every thread takes a share; each task splits the cached rows itself, but in parallel.
     * A (token, head) column's bits do not depend on which columns share its tiles (attention_amx.h). */
    cb->attn_hb = attn_head_block(cb);
    if (cb->p.amx && n_groups > 0 && n_groups * ceil_div(args->n_heads, cb->attn_hb) < cb->p.n_threads) {
        int64_t parts = ceil_div(cb->p.n_threads, n_groups);
        cb->attn_hb = (int)ceil_div(args->n_heads, parts);
    }
    if (cb->p.amx && cb->attn_grouped) plan_splits(cb, args, n_groups);
    moeq_pool_run(cb->pool, attn_task, cb, n_groups * ceil_div(args->n_heads, cb->attn_hb));
}


/* ---- memory and stream ------------------------------------------------------ */

/* Each buffer carries its size in a 64-byte header, so the backend can say what it holds (memory()). */
static void *cpu_alloc(moeq_backend *b, moeq_buffer_kind kind, size_t bytes) {
    (void)kind;
    size_t size = (bytes + 63) / 64 * 64 + (bytes == 0) * 64;
    char *p = aligned_alloc(64, size + 64);
    if (!p) return NULL;
    memcpy(p, &size, sizeof size);
    atomic_fetch_add(&((cpu_backend *)b)->held_bytes, (long long)size);
    return p + 64;
}

static void cpu_release(moeq_backend *b, void *buffer) {
    if (!buffer) return;
    char *p = (char *)buffer - 64;
    size_t size;
    memcpy(&size, p, sizeof size);
    atomic_fetch_sub(&((cpu_backend *)b)->held_bytes, (long long)size);
    free(p);
}

/* Used: the buffers this backend holds (the cache pool, the step arena; the weights are the mapped file, shared
 * with the page cache); total: the machine's memory. */
static void cpu_memory(const moeq_backend *b, size_t *used, size_t *total) {
    long long held = atomic_load(&((const cpu_backend *)b)->held_bytes);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    *used = held > 0 ? (size_t)held : 0;
    *total = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}

static void cpu_copy(moeq_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    if (bytes) memcpy(dst, src, bytes);
}

/* The mapped file is the weights: nothing to upload. */
static moeq_err cpu_map_weights(moeq_backend *b, const moeq_model *model, char *errstr, size_t errstr_size) {
    (void)b, (void)model, (void)errstr, (void)errstr_size;
    return MOEQ_OK;
}

/* Nothing to map either: the experts a rank does not hold give back whatever pages of them were read (a
 * worker's check_weights reads every tensor), and are never read again. */
static moeq_err cpu_map_experts(moeq_backend *b, const moeq_model *model, const uint8_t *resident, char *errstr,
                                size_t errstr_size) {
    (void)b, (void)errstr, (void)errstr_size;
    int E = model->config.n_routed_experts;
    for (int l = 0; resident && l < model->config.num_hidden_layers; l++) {
        const moeq_layer *L = &model->layers[l];
        for (int x = 0; L->experts && x < E; x++) {
            if (resident[(size_t)l * (size_t)E + (size_t)x]) continue;
            moeq_tensor_drop_pages(L->experts[x].gate_proj);
            moeq_tensor_drop_pages(L->experts[x].up_proj);
            moeq_tensor_drop_pages(L->experts[x].down_proj);
        }
    }
    return MOEQ_OK;
}

static void cpu_sync(moeq_backend *b) { (void)b; }

/* ---- per-row ops ------------------------------------------------------------- */

static void cpu_attention_naive(moeq_backend *b, const moeq_mla_naive_params *a) {
    (void)b;
    int64_t H = a->n_heads, nope = a->nope, R = a->rope, V = a->v_dim;
    float *qn = malloc((size_t)(H * nope) * sizeof(float)); /* tests only: allocates, slow */
    for (int64_t t = 0; t < a->n_tok && qn; t++) {
        float *scratch = malloc((size_t)((a->pos[t] + 1) * (H * (nope + V) + 1)) * sizeof(float));
        if (!scratch) break;
        for (int64_t h = 0; h < H; h++) memcpy(qn + h * nope, a->q + (t * H + h) * (nope + R), (size_t)nope * sizeof(float));
        moeq_attention_naive_token(&a->kv, a->seq[t], a->pos[t], a->kv_b, (int)H, (int)nope, (int)V, a->kv_lora, (int)R,
                                   a->scale, qn, a->q_pe + t * H * R, a->out_v + t * H * V, scratch);
        free(scratch);
    }
    free(qn);
}

static void cpu_embed(moeq_backend *b, const moeq_tensor *table, const int32_t *ids, int64_t n, float *out) {
    (void)b;
    int64_t D = moeq_tensor_cols(table);
    for (int64_t t = 0; t < n; t++) moeq_tensor_rows_to_f32(table, ids[t], 1, out + t * D);
}

/*
 * The per-row ops (RMSNorm, the MLA RoPE and cache write, SiLU, residual adds, gather, combine) over the
 * pool when a call holds enough work: each row is computed exactly as alone, so the split changes no bit.
 * Serial, they were a few percent of a prefill on 2 threads and would be most of it on 64 (Amdahl).
 */
#define ROWS_MIN_FLOATS 32768 /* less than this per call: inline (a dispatch costs a few microseconds) */

typedef void (*rows_fn)(const void *params, int64_t r0, int64_t r1);

typedef struct rows_call {
    rows_fn fn;
    const void *params;
    int64_t n_rows, per_task;
} rows_call;

static void rows_task(void *ctx, int64_t task, int worker) {
    (void)worker;
    const rows_call *c = ctx;
    int64_t r0 = task * c->per_task, r1 = r0 + c->per_task < c->n_rows ? r0 + c->per_task : c->n_rows;
    c->fn(c->params, r0, r1);
}

/* fn over rows [0, n_rows) of floats_per_row each: inline when small, else about 4 tasks per thread. */
static void run_rows(cpu_backend *cb, rows_fn fn, const void *params, int64_t n_rows, int64_t floats_per_row) {
    int T = cb->p.n_threads;
    if (T <= 1 || n_rows < 2 || n_rows * floats_per_row < ROWS_MIN_FLOATS) {
        fn(params, 0, n_rows);
        return;
    }
    rows_call c = {fn, params, n_rows, ceil_div(n_rows, 4 * (int64_t)T)};
    moeq_pool_run(cb->pool, rows_task, &c, ceil_div(n_rows, c.per_task));
}

static void rmsnorm_rows(const void *params, int64_t r0, int64_t r1) {
    const moeq_rmsnorm_params *p = params;
    for (int64_t r = r0; r < r1; r++)
        moeq_ops_rmsnorm(p->out + r * p->ld_out, p->x + (p->rows ? p->rows[r] : r) * p->ldx, p->w, p->n, p->eps);
}

static void cpu_rmsnorm(moeq_backend *b, const moeq_rmsnorm_params *p) {
    run_rows((cpu_backend *)b, rmsnorm_rows, p, p->n_rows, p->n);
}

static void cpu_rope_cos_sin(moeq_backend *b, const moeq_rope *rope, const int64_t *pos, int64_t n, float *cos_v,
                             float *sin_v) {
    (void)b;
    int64_t half = rope->dim / 2;
    for (int64_t t = 0; t < n; t++) moeq_rope_cos_sin(rope, pos[t], cos_v + t * half, sin_v + t * half);
}

static void mla_rope_rows(const void *params, int64_t t0, int64_t t1) {
    const moeq_mla_rope_params *p = params;
    int64_t Lr = p->kv_lora, R = p->rope->dim, H = p->n_heads, QH = p->nope + R;
    for (int64_t t = t0; t < t1; t++) {
        const float *cs = p->cos_v + t * R / 2, *sn = p->sin_v + t * R / 2;
        float *entry = moeq_kv_paged_entry(&p->kv, p->seq[t], p->pos[t]);
        const float *kva = p->kva + t * (Lr + R);
        moeq_ops_rmsnorm(entry, kva, p->kv_norm, Lr, p->eps);
        moeq_rope_apply(p->rope, kva + Lr, cs, sn, entry + Lr);
        for (int64_t h = 0; h < H; h++)
            moeq_rope_apply(p->rope, p->q + (t * H + h) * QH + p->nope, cs, sn, p->q_pe + (t * H + h) * R);
    }
}

static void cpu_mla_rope(moeq_backend *b, const moeq_mla_rope_params *p) {
    run_rows((cpu_backend *)b, mla_rope_rows, p, p->n_tok, p->kv_lora + (int64_t)p->n_heads * p->rope->dim);
}

/* Elementwise ops split in chunks of 4,096 floats (the "rows" of run_rows). */
#define ELEM_CHUNK 4096

typedef struct elem_params {
    float *out;
    const float *a, *b;
    int64_t n;
} elem_params;

static void silu_rows(const void *params, int64_t c0, int64_t c1) {
    const elem_params *p = params;
    int64_t i0 = c0 * ELEM_CHUNK, i1 = c1 * ELEM_CHUNK < p->n ? c1 * ELEM_CHUNK : p->n;
    moeq_ops_silu_mul(p->out + i0, p->a + i0, p->b + i0, i1 - i0);
}

static void add_rows(const void *params, int64_t c0, int64_t c1) {
    const elem_params *p = params;
    int64_t i0 = c0 * ELEM_CHUNK, i1 = c1 * ELEM_CHUNK < p->n ? c1 * ELEM_CHUNK : p->n;
    for (int64_t i = i0; i < i1; i++) p->out[i] += p->b[i];
}

static void cpu_silu_mul(moeq_backend *b, float *out, const float *gate, const float *up, int64_t n) {
    elem_params p = {out, gate, up, n};
    run_rows((cpu_backend *)b, silu_rows, &p, ceil_div(n, ELEM_CHUNK), ELEM_CHUNK);
}

static void cpu_add(moeq_backend *b, float *x, const float *y, int64_t n) {
    elem_params p = {x, NULL, y, n};
    run_rows((cpu_backend *)b, add_rows, &p, ceil_div(n, ELEM_CHUNK), ELEM_CHUNK);
}

static void cpu_route(moeq_backend *b, const moeq_route_params *p) {
    (void)b;
    const moeq_moe_router *r = p->router;
    int64_t E = r->n_experts, K = r->top_k;
    for (int64_t t = 0; t < p->n_tok; t++)
        p->finite[t] = (uint8_t)moeq_moe_route(r, p->logits + t * E, p->bias, p->ids + t * K, p->weights + t * K,
                                               p->scratch);
    if (p->offsets) moeq_moe_plan(p->ids, p->n_tok, (int)K, (int)E, p->offsets, p->order);
}

static void gather_rows(const void *params, int64_t i0, int64_t i1) {
    const moeq_gather_params *p = params;
    int64_t D = p->dim;
    for (int64_t i = i0; i < i1; i++) {
        int64_t slot = p->order[i];
        p->slot_row[slot] = i;
        memcpy(p->xg + i * D, p->x + (slot / p->top_k) * D, (size_t)D * sizeof(float));
    }
}

static void cpu_gather(moeq_backend *b, const moeq_gather_params *p) {
    run_rows((cpu_backend *)b, gather_rows, p, p->n_slots, p->dim);
}

/* Slots in routing order (best first), the shared expert last: the order the tests pin. */
static void combine_rows(const void *params, int64_t t0, int64_t t1) {
    const moeq_combine_params *p = params;
    int64_t K = p->top_k, D = p->dim;
    for (int64_t t = t0; t < t1; t++) {
        float *acc = p->out + t * D;
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            float w = p->weights[t * K + k];
            const float *y = p->slot_ptr ? p->slot_ptr[t * K + k]
                                         : p->rows + (p->slot_row ? p->slot_row[t * K + k] : t * K + k) * D;
            for (int64_t d = 0; d < D; d++) acc[d] += w * y[d];
        }
        if (p->shared) {
            const float *y = p->shared + t * D;
            for (int64_t d = 0; d < D; d++) acc[d] += y[d];
        }
    }
}

static void cpu_combine(moeq_backend *b, const moeq_combine_params *p) {
    run_rows((cpu_backend *)b, combine_rows, p, p->n_tok, p->dim * (p->top_k + 1));
}

/*
 * The reference of moe_experts: the composition the MoE layer ran before the op (moeq_moe_plan's plan,
 * gather, one dispatch of every expert's gate and up with the shared expert's, silu_mul, one dispatch of the
 * downs, combine), the same calls in the same grouping, so the same bits (and the same BLAS choice when
 * batch_invariant = 0).
 */
static void cpu_moe_experts(moeq_backend *b, const moeq_moe_experts_params *p) {
    cpu_backend *cb = (cpu_backend *)b;
    int E = p->n_experts;
    int64_t T = p->n_tok, K = p->top_k, D = p->dim, MI = p->inter, S = T * K;
    if (T <= 0) return;
    if (T > p->max_tok || 2 * E + 3 > cb->p.max_jobs) { /* the engine sizes both at creation: a caller's bug */
        fprintf(stderr, "moeq: cpu moe_experts: %lld tokens for a capacity of %lld, %d experts for %d jobs (needs "
                        "2 x experts + 3)\n", (long long)T, (long long)p->max_tok, E, cb->p.max_jobs);
        abort();
    }
    int64_t *offsets = p->plan, *order = p->plan + E + 1;
    moeq_moe_plan(p->ids, T, (int)K, E, offsets, order);
    for (int e = 0; p->stats && e < E; e++) p->stats[e] += (uint64_t)(offsets[e + 1] - offsets[e]);
    moeq_gather_params gp = {p->xg, p->slot_row, p->x, order, S, K, D};
    cpu_gather(b, &gp);
    const moeq_expert *sh = p->shared && p->shared->gate_proj ? p->shared : NULL;
    int64_t SI = sh ? moeq_tensor_rows(sh->gate_proj) : 0;
    float *sg = p->g + S * MI, *su = p->u + S * MI;
    moeq_mm_job *jobs = cb->moe_jobs;
    int n = 0;
    for (int e = 0; e < E; e++) {
        int64_t o = offsets[e], cnt = offsets[e + 1] - o;
        if (!cnt) continue;
        jobs[n++] = (moeq_mm_job){p->experts[e].gate_proj, 0, MI, p->xg + o * D, D, p->g + o * MI, MI, cnt};
        jobs[n++] = (moeq_mm_job){p->experts[e].up_proj, 0, MI, p->xg + o * D, D, p->u + o * MI, MI, cnt};
    }
    if (sh) {
        jobs[n++] = (moeq_mm_job){sh->gate_proj, 0, SI, p->x, D, sg, SI, T};
        jobs[n++] = (moeq_mm_job){sh->up_proj, 0, SI, p->x, D, su, SI, T};
    }
    if (n) cpu_matmul(b, jobs, n);
    cpu_silu_mul(b, p->g, p->g, p->u, S * MI + T * SI);
    n = 0;
    for (int e = 0; e < E; e++) {
        int64_t o = offsets[e], cnt = offsets[e + 1] - o;
        if (cnt) jobs[n++] = (moeq_mm_job){p->experts[e].down_proj, 0, D, p->g + o * MI, MI, p->down + o * D, D, cnt};
    }
    if (sh) jobs[n++] = (moeq_mm_job){sh->down_proj, 0, D, sg, SI, p->down + S * D, D, T};
    if (n) cpu_matmul(b, jobs, n);
    moeq_combine_params cp = {p->out, p->down, p->slot_row, p->weights, sh ? p->down + S * D : NULL, T, K, D, NULL};
    cpu_combine(b, &cp);
}

const char *moeq_engine_cpu_kernels(void) {
    /* one text per combination of the kernel choices, as moeq_mm_cpu_describe keeps */
    static char texts[8][640];
    static _Atomic int done[8];
    int key = moeq_cpu_tuning_key();
    char *text = texts[key];
    if (atomic_load(&done[key])) return text;
    const char *lanes = moeq_mm_cpu_describe();
    /* the screened head (engine/head_screen.h) runs the head's int8 copy on the draft kernels */
    const char *screen = moeq_draft_supported() ? "greedy rows: the screened head (an int8 copy, head_screen = auto)"
                                                : "greedy rows: whole (no int8 kernels for the screened head)";
    if (moeq_amx_supported())
        snprintf(text, sizeof texts[0], "%s; NT products of BF16/F8 weights on amx_bf16 tiles with split float32 "
                 "activations (cpu_matrix = auto or amx; lanes keeps the float32 lanes); MTP drafts: %s; %s",
                 lanes, moeq_draft_describe(), screen);
    else snprintf(text, sizeof texts[0], "%s; AMX path: %s; MTP drafts: %s; %s", lanes,
                  moeq_amx_describe(), moeq_draft_describe(), screen);
    atomic_store(&done[key], 1);
    return text;
}

int moeq_engine_cpu_amx(void) { return moeq_amx_supported(); }
const char *moeq_engine_cpu_amx_describe(void) { return moeq_amx_describe(); }
int moeq_engine_cpu_draft(void) { return moeq_draft_supported(); }
const char *moeq_engine_cpu_draft_describe(void) { return moeq_draft_describe(); }

static const char *cpu_describe(const moeq_backend *b) {
    const cpu_backend *cb = (const cpu_backend *)b;
    return cb->info;
}

static void cpu_destroy(moeq_backend *b) {
    cpu_backend *cb = (cpu_backend *)b;
    if (!cb) return;
    moeq_pool_destroy(cb->pool);
    for (int i = 0; i < cb->p.n_threads; i++) {
        if (cb->wbuf) free(cb->wbuf[i]);
        if (cb->scores) free(cb->scores[i]);
        if (cb->ws) free(cb->ws[i]);
        if (cb->dws) free(cb->dws[i]);
        if (cb->attn_ws) free(cb->attn_ws[i]);
    }
    free(cb->ws);
    free(cb->dws);
    free(cb->attn_ws);
    free(cb->attn_ws_bytes);
    free(cb->attn_group);
    free(cb->split_buf);
    free(cb->splits);
    free(cb->split_end);
    free(cb->split_of);
    free(cb->wbuf);
    free(cb->scores);
    free(cb->task_end);
    free(cb->moe_jobs);
    free(cb->pack);
    free(cb->views);
    free(cb->regions);
    free(cb->region_of);
    free(cb);
}

static void cpu_logits_reduce(moeq_backend *b, const float *logits, int64_t ld, int64_t n_rows, int64_t vocab,
                              const double *temperature, moeq_logits_record *out) {
    (void)b;
    moeq_cpu_logits_reduce(logits, ld, n_rows, vocab, temperature, out);
}

static const moeq_backend cpu_table = {
    .name = "cpu",
    .host_visible = 1,
    .supports = cpu_supports,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .map_weights = cpu_map_weights,
    .map_experts = cpu_map_experts,
    .sync = cpu_sync,
    .matmul = cpu_matmul,
    .matmul_nn = cpu_matmul_nn,
    .attention = cpu_attention,
    .attention_naive = cpu_attention_naive,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope_cos_sin = cpu_rope_cos_sin,
    .mla_rope = cpu_mla_rope,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .route = cpu_route,
    .gather = cpu_gather,
    .combine = cpu_combine,
    .moe_experts = cpu_moe_experts,
    .logits_reduce = cpu_logits_reduce,
    .describe = cpu_describe,
    .memory = cpu_memory,
    .destroy = cpu_destroy,
};

moeq_backend *moeq_backend_cpu_new(const moeq_backend_config *params) {
    cpu_backend *cb = calloc(1, sizeof(*cb));
    if (!cb) return NULL;
    cb->base = cpu_table;
    cb->p = *params;
    if (cb->p.n_threads < 1) cb->p.n_threads = 1;
    if (cb->p.blas_min_tokens < 1) cb->p.blas_min_tokens = 16;
    int n = cb->p.n_threads;
    cb->wbuf = calloc((size_t)n, sizeof(float *));
    cb->scores = calloc((size_t)n, sizeof(float *));
    cb->ws = calloc((size_t)n, sizeof(void *));
    cb->dws = calloc((size_t)n, sizeof(void *));
    cb->attn_ws = calloc((size_t)n, sizeof(void *));
    cb->attn_ws_bytes = calloc((size_t)n, sizeof(size_t));
    /* groups need one entry per token: steps of more tokens than this run one token per task */
    cb->attn_group_max = cb->p.max_tokens > 0 ? cb->p.max_tokens : 2048;
    cb->attn_group = calloc((size_t)cb->attn_group_max + 2, sizeof(int64_t));
    cb->splits = calloc((size_t)cb->attn_group_max + 1, sizeof(moeq_mla_amx_split));
    cb->split_end = calloc((size_t)cb->attn_group_max + 1, sizeof(int64_t));
    cb->split_of = calloc((size_t)cb->attn_group_max + 1, sizeof(int));
    if (cb->p.amx && !moeq_amx_supported()) cb->p.amx = 0; /* the engine refuses "amx" where it cannot run */
    size_t ws = moeq_mm_nt_ws_bytes(cb->p.max_k > 0 ? cb->p.max_k : 1);
    if (cb->p.amx && moeq_amx_ws_bytes(cb->p.max_k > 0 ? cb->p.max_k : 1) > ws)
        ws = moeq_amx_ws_bytes(cb->p.max_k > 0 ? cb->p.max_k : 1);
    cb->dws_bytes =
        moeq_draft_supported() ? (moeq_draft_ws_bytes(cb->p.max_k > 0 ? cb->p.max_k : 1) + 63) / 64 * 64 : 0;
    cb->ws_bytes = (ws + 63) / 64 * 64;
    cb->task_end = calloc((size_t)(cb->p.max_jobs > 0 ? cb->p.max_jobs : 1), sizeof(int64_t));
    cb->moe_jobs = calloc((size_t)(cb->p.max_jobs > 0 ? cb->p.max_jobs : 1), sizeof(moeq_mm_job));
    cb->views = calloc((size_t)(cb->p.max_jobs > 0 ? cb->p.max_jobs : 1), sizeof(moeq_amx_xview));
    cb->regions = calloc((size_t)(cb->p.max_jobs > 0 ? cb->p.max_jobs : 1), sizeof(*cb->regions));
    cb->region_of = calloc((size_t)(cb->p.max_jobs > 0 ? cb->p.max_jobs : 1), sizeof(int));
    cb->pool = moeq_pool_new(n);
    if (!cb->wbuf || !cb->scores || !cb->ws || !cb->dws ||
        !cb->attn_ws || !cb->attn_ws_bytes || !cb->attn_group || !cb->splits || !cb->split_end || !cb->split_of ||
        !cb->task_end || !cb->moe_jobs || !cb->pool ||
        !cb->views || !cb->regions || !cb->region_of)
        goto fail;
    for (int i = 0; i < n; i++) {
        if (!cb->p.batch_invariant && !(cb->wbuf[i] = malloc((size_t)BLAS_ROWS * cb->p.max_k * sizeof(float))))
            goto fail;
        if (!(cb->ws[i] = aligned_alloc(64, cb->ws_bytes))) goto fail;
        if (cb->dws_bytes && !(cb->dws[i] = aligned_alloc(64, cb->dws_bytes))) goto fail;
        if (cb->dws_bytes) memset(cb->dws[i], 0, 64); /* no key held yet */
        if (!(cb->scores[i] = malloc((size_t)attn_group_tokens(cb) * (size_t)attn_head_block(cb) * (cb->p.max_ctx + 1) *
                                     sizeof(float))))
            goto fail;
    }
    moeq_mm_blas_init();
    if (cb->p.cpu_prefetch) moeq_cpu_set_stream_l2(cb->p.cpu_prefetch == 2);
    if (cb->p.cpu_f8_widen) moeq_cpu_set_f8_widen32(cb->p.cpu_f8_widen == 2);
    if (cb->p.cpu_k_blocked) moeq_cpu_set_k_blocked(cb->p.cpu_k_blocked == 2);
    snprintf(cb->info, sizeof cb->info, "cpu: %s kernels, %d thread%s, %s",
             cb->p.amx ? "amx_bf16 tiles (split float32 activations)" : moeq_mm_cpu_describe(), n, n == 1 ? "" : "s",
             cb->p.batch_invariant ? "batch-invariant" : "OpenBLAS sgemm from 16 tokens");
    return &cb->base;
fail:
    cpu_destroy(&cb->base);
    return NULL;
}
