/*
 * ops_matmul.h — internal: the CPU matrix kernels, weights read in their
 * stored dtype (F32, BF16, F16, F8_E4M3 with 128x128 block scales) and
 * widened to float32 in registers; float32 accumulation.
 *
 * Batch invariance is a property of these kernels: every output element is
 * one dot product computed the same way whatever the tile, the thread or the
 * number of tokens — 16 float32 lanes, k ascending in steps of 16 with one
 * fused multiply-add per lane, the tail masked with zeros, then one fixed
 * reduction tree. Tiling only decides which elements are computed together.
 *
 * They do not thread (backend_cpu.c splits work over its pool) and do not
 * allocate.
 */
#ifndef MOEQ_ENGINE_OPS_MATMUL_H
#define MOEQ_ENGINE_OPS_MATMUL_H

#include <stdint.h>

#include "model.h"

/*
 * One matrix product against rows [row0, row0+n_rows) of a 2-D weight W of
 * shape [rows, cols] (HF layout [out, in]).
 *   NT ("linear"):  y[t, n] = sum_k x[t, k] * W[row0+n, k]     K = cols, N = n_rows
 *   NN ("through"): y[t, c] = sum_r x[t, r] * W[row0+r, c]     K = n_rows, N = cols
 * x is [n_tok, K] with row stride ldx, y is [n_tok, N] with row stride ldy.
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

/* The fixed-order kernels over a sub-block: output columns [n0, n1), tokens [t0, t1). */
void moeq_mm_nt_block(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1);
void moeq_mm_nn_block(const moeq_mm_job *job, int64_t c0, int64_t c1, int64_t t0, int64_t t1);

/* The scalar emulation of the same lanes and tree: the fallback without AVX-512, and the tests' oracle. */
void moeq_mm_nt_block_scalar(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1);
void moeq_mm_nn_block_scalar(const moeq_mm_job *job, int64_t c0, int64_t c1, int64_t t0, int64_t t1);

/*
 * The non-invariant path (batch_invariant = 0): rows [n0, n1) widened into
 * wbuf ((n1-n0) * cols floats) and multiplied with OpenBLAS sgemm (single
 * threaded; the pool threads over row blocks).
 */
void moeq_mm_nt_blas_block(const moeq_mm_job *job, int64_t n0, int64_t n1, float *wbuf);

/* The fixed-order dot product of two float vectors (the same lanes and tree as the kernels). */
float moeq_dot_f32(const float *a, const float *b, int64_t n);

/* Set OpenBLAS to one thread (the pool threads); idempotent. */
void moeq_mm_blas_init(void);

#endif
