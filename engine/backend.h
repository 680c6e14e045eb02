/*
 * backend.h — internal: the compute seam. The forward pass (forward.c) does
 * its heavy ops through this table of function pointers; a backend says what
 * it can do with `supports`. The CPU backend (backend_cpu.c) is complete and
 * is the reference; a CUDA backend (kernels/) plugs into the same table.
 *
 * Contract every backend keeps: results per output element do not depend on
 * how work is split (batch invariance) when the backend was created with
 * batch_invariant = 1.
 */
#ifndef MOEQ_ENGINE_BACKEND_H
#define MOEQ_ENGINE_BACKEND_H

#include <stdint.h>

#include "attention.h"
#include "model.h"
#include "ops_matmul.h"

typedef enum moeq_backend_op {
    MOEQ_BACKEND_OP_MATMUL = 0,  /* y = x W^T, W in its stored dtype          */
    MOEQ_BACKEND_OP_MATMUL_NN,   /* y = x W (MLA absorption through W_UK)     */
    MOEQ_BACKEND_OP_ATTENTION,   /* absorbed MLA attention over the paged cache */
} moeq_backend_op;

typedef struct moeq_backend moeq_backend;

struct moeq_backend {
    const char *name;
    /* 1 when op can run on weights of dtype (dtype ignored for ATTENTION). */
    int (*supports)(const moeq_backend *backend, moeq_backend_op op, moeq_dtype dtype);
    /* All jobs of one call run as one parallel dispatch (e.g. every expert's GEMM). */
    void (*matmul)(moeq_backend *backend, const moeq_mm_job *jobs, int n_jobs);
    void (*matmul_nn)(moeq_backend *backend, const moeq_mm_job *jobs, int n_jobs);
    void (*attention)(moeq_backend *backend, const moeq_attn_args *args);
    void (*destroy)(moeq_backend *backend);
};

typedef struct moeq_backend_cpu_params {
    int n_threads;          /* >= 1                                              */
    int batch_invariant;    /* 0: OpenBLAS sgemm on widened tiles for n_tok >= blas_min_tokens */
    int blas_min_tokens;    /* default 16                                        */
    int64_t max_k;          /* widest weight row (cols) any job will use         */
    int64_t max_ctx;        /* longest sequence attention will see               */
    int max_jobs;           /* most jobs in one call                             */
} moeq_backend_cpu_params;

/* NULL on allocation failure. */
moeq_backend *moeq_backend_cpu_new(const moeq_backend_cpu_params *params);

static inline void moeq_backend_destroy(moeq_backend *backend) {
    if (backend) backend->destroy(backend);
}

#endif
