/*
 * backend_cpu.c — the CPU backend: the kernels of ops_matmul.c and
 * attention.c split into tasks over the persistent pool (backend_pool.c).
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

#include <stdlib.h>

#include "backend_pool.h"

#define NT_ROWS 32
#define NT_SMALL_TOKS 16             /* jobs this small get tasks sized by bytes */
#define NT_TASK_BYTES (256 << 10)    /* weight bytes per task for those         */
#define NT_ROWS_MAX 1024
#define NT_TOKS 64
#define NN_COLS 64
#define BLAS_ROWS 128

typedef struct cpu_backend {
    moeq_backend base; /* first: the table */
    moeq_backend_cpu_params p;
    moeq_pool *pool;
    float **wbuf;      /* [n_threads] BLAS_ROWS * max_k   */
    float **scores;    /* [n_threads] HEAD_BLOCK * max_ctx */
    int64_t *task_end; /* [max_jobs] prefix sums of tasks per job */
    /* the current dispatch */
    const moeq_mm_job *jobs;
    int n_jobs;
    int use_blas;
    const moeq_attn_args *attn;
} cpu_backend;

static int cpu_supports(const moeq_backend *b, moeq_backend_op op, moeq_dtype dtype) {
    (void)b;
    (void)op;
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
static int64_t nt_rows(const moeq_mm_job *job) {
    if (job->n_tok > NT_SMALL_TOKS) return NT_ROWS;
    int64_t row_bytes = moeq_tensor_cols(job->w) * (int64_t)moeq_dtype_size(job->w->dtype);
    int64_t rows = NT_TASK_BYTES / (row_bytes > 0 ? row_bytes : 1) / 16 * 16;
    return rows < NT_ROWS ? NT_ROWS : rows > NT_ROWS_MAX ? NT_ROWS_MAX : rows;
}

static void nt_task(void *ctx, int64_t task, int worker) {
    cpu_backend *cb = ctx;
    int64_t local;
    const moeq_mm_job *job = &cb->jobs[find_job(cb, task, &local)];
    if (cb->use_blas) {
        int64_t n0 = local * BLAS_ROWS, n1 = n0 + BLAS_ROWS < job->n_rows ? n0 + BLAS_ROWS : job->n_rows;
        moeq_mm_nt_blas_block(job, n0, n1, cb->wbuf[worker]);
        return;
    }
    int64_t n_tb = ceil_div(job->n_tok, NT_TOKS), rows = nt_rows(job);
    int64_t n0 = (local / n_tb) * rows, t0 = (local % n_tb) * NT_TOKS;
    int64_t n1 = n0 + rows < job->n_rows ? n0 + rows : job->n_rows;
    int64_t t1 = t0 + NT_TOKS < job->n_tok ? t0 + NT_TOKS : job->n_tok;
    moeq_mm_nt_block(job, n0, n1, t0, t1);
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

/* BLAS only when every job has enough tokens (a choice per call, not per element). */
static int blas_for(const cpu_backend *cb, const moeq_mm_job *jobs, int n_jobs) {
    if (cb->p.batch_invariant) return 0;
    for (int i = 0; i < n_jobs; i++)
        if (jobs[i].n_tok < cb->p.blas_min_tokens) return 0;
    return 1;
}

static void cpu_matmul(moeq_backend *b, const moeq_mm_job *jobs, int n_jobs) {
    cpu_backend *cb = (cpu_backend *)b;
    if (n_jobs <= 0) return;
    cb->jobs = jobs;
    cb->n_jobs = n_jobs;
    cb->use_blas = blas_for(cb, jobs, n_jobs);
    int64_t total = 0;
    for (int i = 0; i < n_jobs; i++) {
        int64_t n = cb->use_blas ? ceil_div(jobs[i].n_rows, BLAS_ROWS)
                                 : ceil_div(jobs[i].n_rows, nt_rows(&jobs[i])) * ceil_div(jobs[i].n_tok, NT_TOKS);
        total += jobs[i].n_tok > 0 ? n : 0;
        cb->task_end[i] = total;
    }
    moeq_pool_run(cb->pool, nt_task, cb, total);
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

static void attn_task(void *ctx, int64_t task, int worker) {
    cpu_backend *cb = ctx;
    const moeq_attn_args *a = cb->attn;
    int64_t n_hb = ceil_div(a->n_heads, MOEQ_ATTN_HEAD_BLOCK);
    int64_t t = task / n_hb;
    int h0 = (int)(task % n_hb) * MOEQ_ATTN_HEAD_BLOCK;
    int h1 = h0 + MOEQ_ATTN_HEAD_BLOCK < a->n_heads ? h0 + MOEQ_ATTN_HEAD_BLOCK : a->n_heads;
    moeq_attention_absorbed_block(a, t, h0, h1, cb->scores[worker]);
}

static void cpu_attention(moeq_backend *b, const moeq_attn_args *args) {
    cpu_backend *cb = (cpu_backend *)b;
    cb->attn = args;
    moeq_pool_run(cb->pool, attn_task, cb, args->n_tok * ceil_div(args->n_heads, MOEQ_ATTN_HEAD_BLOCK));
}

static void cpu_destroy(moeq_backend *b) {
    cpu_backend *cb = (cpu_backend *)b;
    if (!cb) return;
    moeq_pool_destroy(cb->pool);
    for (int i = 0; i < cb->p.n_threads; i++) {
        if (cb->wbuf) free(cb->wbuf[i]);
        if (cb->scores) free(cb->scores[i]);
    }
    free(cb->wbuf);
    free(cb->scores);
    free(cb->task_end);
    free(cb);
}

moeq_backend *moeq_backend_cpu_new(const moeq_backend_cpu_params *params) {
    cpu_backend *cb = calloc(1, sizeof(*cb));
    if (!cb) return NULL;
    cb->base = (moeq_backend){"cpu", cpu_supports, cpu_matmul, cpu_matmul_nn, cpu_attention, cpu_destroy};
    cb->p = *params;
    if (cb->p.n_threads < 1) cb->p.n_threads = 1;
    if (cb->p.blas_min_tokens < 1) cb->p.blas_min_tokens = 16;
    int n = cb->p.n_threads;
    cb->wbuf = calloc((size_t)n, sizeof(float *));
    cb->scores = calloc((size_t)n, sizeof(float *));
    cb->task_end = calloc((size_t)(cb->p.max_jobs > 0 ? cb->p.max_jobs : 1), sizeof(int64_t));
    cb->pool = moeq_pool_new(n);
    if (!cb->wbuf || !cb->scores || !cb->task_end || !cb->pool) goto fail;
    for (int i = 0; i < n; i++) {
        if (!cb->p.batch_invariant && !(cb->wbuf[i] = malloc((size_t)BLAS_ROWS * cb->p.max_k * sizeof(float))))
            goto fail;
        if (!(cb->scores[i] = malloc((size_t)MOEQ_ATTN_HEAD_BLOCK * (cb->p.max_ctx + 1) * sizeof(float)))) goto fail;
    }
    moeq_mm_blas_init();
    return &cb->base;
fail:
    cpu_destroy(&cb->base);
    return NULL;
}
