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
 * The order is a function of K alone, the same on every instruction set:
 * AVX-512 holds the 16 lanes in one register, AVX2 in two halves of 8 whose
 * sum is the tree's first level, the emulation in an array; all three are
 * bit-identical (the tests check each one the CPU runs against the emulation).
 *
 * F8 E4M3 in the NT kernels: each product is (x * (256 * scale)) * (q / 256),
 * the weight widened exactly (q / 256 is an f16 by bit placement) and the
 * 128x128 block scale moved onto the activation (one rounding, as the weight's
 * q * scale was): the scale is shared by a block's 128 rows, so the activation
 * is scaled once for all of them and the weight needs no multiply. The NN
 * kernels (MLA absorption) keep q * scale on the weight.
 *
 * Many tokens (moeq_mm_nt_block_ws with a workspace): K is walked in steps of
 * 1024 with the 16-lane accumulators parked in the workspace between steps, so
 * a step's weights and activations stay in L2 for any K; F8 rows are widened
 * to f16 once per step and 64 tokens rather than once per 4-token tile. The
 * lanes resume where they stopped: the same bits as the direct tiles.
 *
 * They do not thread (backend_cpu.c splits work over its pool) and do not
 * allocate. On a CPU with AMX the backend takes ops_amx.h's tiles for BF16
 * and F8 products instead (cpu_matrix): another order, other bits.
 */
#ifndef MOEQ_ENGINE_OPS_MATMUL_H
#define MOEQ_ENGINE_OPS_MATMUL_H

#include <stdint.h>

#include "backend.h"
#include "model.h"

/* moeq_mm_job (one matrix product against a row range of a weight) is defined in backend.h. */

/* The fixed-order kernels over a sub-block: output columns [n0, n1), tokens [t0, t1),
 * on the best instruction set this CPU has (moeq_mm_isa_best()). NN: c0 a multiple of 16. */
void moeq_mm_nt_block(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1);
void moeq_mm_nn_block(const moeq_mm_job *job, int64_t c0, int64_t c1, int64_t t0, int64_t t1);

/*
 * The same products with a workspace (ws_bytes >= moeq_mm_nt_ws_bytes(cols), 64-byte aligned, the caller's
 * per thread): F8 blocks of at least 8 tokens then widen each weight once per block instead of once per 4
 * tokens, and smaller F8 blocks scale their activations there once per 128-row scale block (AVX-512; without
 * the workspace moeq_mm_nt_block allocates that scratch per call). Many-token blocks of other dtypes walk K in
 * steps. Identical bits to moeq_mm_nt_block(), which it falls back to without a big enough ws.
 */
void moeq_mm_nt_block_ws(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1, void *ws,
                         size_t ws_bytes);
size_t moeq_mm_nt_ws_bytes(int64_t cols);

/* The scalar emulation of the same lanes and tree: the fallback without AVX2, and the tests' oracle. */
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

/* The kernels' implementations; every one gives the same bits. */
typedef enum moeq_mm_isa {
    MOEQ_MM_ISA_SCALAR = 0, /* the emulation, any CPU                        */
    MOEQ_MM_ISA_AVX2,       /* AVX2 + FMA + F16C (x86-64 without AVX-512)    */
    MOEQ_MM_ISA_AVX512,     /* AVX-512 F/BW/VL/DQ                            */
} moeq_mm_isa;

/* 1 when this CPU (and this build) can run isa. Thread-safe. */
int moeq_mm_isa_supported(moeq_mm_isa isa);
/* The fastest supported isa: what moeq_mm_nt_block() and friends run. Thread-safe. */
moeq_mm_isa moeq_mm_isa_best(void);
const char *moeq_mm_isa_name(moeq_mm_isa isa); /* "scalar", "avx2", "avx512" */
/* The kernels this CPU runs and the matrix features it has, e.g. "avx512 (float32 lanes; the CPU has
 * avx512_bf16, no amx_bf16)", for bench-engine and model-info. Thread-safe after the first call. */
const char *moeq_mm_cpu_describe(void);

/* The same kernels on a given isa (which must be supported): for the tests and benchmarks. */
void moeq_mm_nt_block_isa(moeq_mm_isa isa, const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1);
void moeq_mm_nn_block_isa(moeq_mm_isa isa, const moeq_mm_job *job, int64_t c0, int64_t c1, int64_t t0, int64_t t1);
void moeq_mm_nt_block_ws_isa(moeq_mm_isa isa, const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0,
                             int64_t t1, void *ws, size_t ws_bytes);
float moeq_dot_f32_isa(moeq_mm_isa isa, const float *a, const float *b, int64_t n);

/* Set OpenBLAS to one thread (the pool threads); idempotent. */
void moeq_mm_blas_init(void);

#endif
