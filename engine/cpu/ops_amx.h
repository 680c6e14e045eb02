/*
 * ops_amx.h — internal: the NT matrix products on Intel AMX BF16 tiles, for
 * BF16 and F8 E4M3 weights whose rows are a multiple of 32 long.
 *
 * The weight is the tiles' A operand as stored (16 rows x 32 values a tile,
 * no repacking; F8 rows are widened to BF16 once per task, exactly), the
 * activations the B operand: each float32 activation is split into
 * hi = bf16(x) and lo = bf16(x - hi) (16 of float32's 24 bits) and packed once
 * per call into the tiles' pair layout (moeq_amx_pack_group). Products are
 * exact in the tiles (8-bit x 8-bit mantissas), so the path's error is the
 * split's 2^-17 and the tiles' float32 sums, within the float64 reference's
 * tolerance on every preset (tests/test_engine_reference.c).
 *
 * Order, the batch-invariance contract: an output element is one chain
 * C = tdp(C, W_s, hi_s); C = tdp(C, W_s, lo_s) over the 32-wide steps s of K,
 * ascending, from C = 0 (BF16); F8 runs that chain over each 128-column scale
 * block from 0 and folds y = fma(scale_b, P_b, y) over the blocks, ascending.
 * TDPBF16PS computes each element from its own A row, B column and C value
 * alone, whatever the tile position (measured on the hardware: no simple
 * order of the 32 products' roundings reproduces it, so the emulation runs
 * the instruction itself on one element at a time: moeq_amx_nt_block_ref).
 * Which tokens share a tile therefore never changes a token's bits. The bits
 * differ from the float32-lane kernels of ops_matmul.c; the engine picks one
 * path per process (the `cpu_matrix` setting) and keeps it for every shape.
 */
#ifndef MOEQ_ENGINE_OPS_AMX_H
#define MOEQ_ENGINE_OPS_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#define MOEQ_AMX_STEP 32 /* K per tile step */

/* 1 when this CPU has AMX-BF16 and AVX512-BF16 and Linux granted this process the tile state (asked once,
 * thread-safe). moeq_amx_describe() says which, e.g. "amx_bf16 tiles" or why not. */
int moeq_amx_supported(void);
const char *moeq_amx_describe(void);

/* 1 when w can take this path: BF16 or F8 E4M3, cols a multiple of MOEQ_AMX_STEP. A function of the
 * weight alone, never of the tokens. */
int moeq_amx_fits(const moeq_tensor *w);

/*
 * Activations packed for the tiles: n rows of K floats become, for each step s and part p (0 hi, 1 lo),
 * 16 rows (pairs of k) of n_pad dwords (one bf16 pair per row of x). From 16 rows on, n_pad leaves 15
 * columns past any row and is an odd multiple of 16 (a tile's 16 rows then fall in different cache
 * sets); below, n_pad = n, so a decode step's pack stays in L1 (tile loads from L2 ran at half the
 * rate): a tile's 16 columns then run into the next rows or the 64 bytes past the end, and those
 * columns' results are never stored.
 */
int64_t moeq_amx_pack_cols(int64_t n);
int64_t moeq_amx_pack_groups(int64_t n); /* groups of 16 rows to pack */
size_t moeq_amx_pack_bytes(int64_t n, int64_t K);
/* Packs rows [16 g, 16 g + 16) of x (rows >= n as zeros where the pack has their columns);
 * g < moeq_amx_pack_groups(n). */
void moeq_amx_pack_group(const float *x, int64_t ldx, int64_t n, int64_t K, uint32_t *pack, int64_t g);

/*
 * The panel layout (from 16 rows on: prefill, batched decode, the experts' slices): rows [16 g, 16 g + 16)
 * of x are panel g, for each step and part 16 pair rows of 16 dwords, so every B tile is 1 KiB of
 * contiguous memory. The row layout's tiles for a slice of a wide pack read 16 rows n_pad dwords apart,
 * a page or more each: in a prefill's experts the TLB walks took most of the tile loads' time.
 */
size_t moeq_amx_panel_bytes(int64_t n, int64_t K);
void moeq_amx_pack_panel(const float *x, int64_t ldx, int64_t n, int64_t K, uint32_t *pack, int64_t g);

/* A job's view of a pack: its token t is pack row tok0 + t; with panels, tok0 and every token block's first
 * token (the backend's blocks start at multiples of 32) are multiples of 16, and n_pad is unused. */
typedef struct moeq_amx_xview {
    const uint32_t *pack;
    int64_t n_pad, tok0;
    int panels;
} moeq_amx_xview;

/* Per-thread workspace for moeq_amx_nt_block (64-byte aligned). */
size_t moeq_amx_ws_bytes(int64_t K);

/* Tokens per block that suit w: 64 (a block's slice of the pack stays in L2), or 256 for F8 weights whose widened
 * strips a block of 128 rows keeps (it widens each strip once and walks the tokens 64 at a time). */
int64_t moeq_amx_block_tokens(const moeq_tensor *w);

/* The first 32 weight rows of the block the thread runs next (`bytes` each, ld apart from rows): the last strip's
 * first pass fetches them into L2 beside its products, as every strip does for the one after it, so the next block
 * does not start with its weights in memory. A hint only (rows past a tensor's end are never loaded). */
typedef struct moeq_amx_then {
    const void *rows;
    int64_t ld, bytes;
} moeq_amx_then;

/* y[t][n] for rows [n0, n1) and tokens [t0, t1) of job (moeq_amx_fits(job->w)), from the packed x; then: the thread's
 * next block (NULL: none or unknown). */
void moeq_amx_nt_block(const moeq_mm_job *job, const moeq_amx_xview *xv, int64_t n0, int64_t n1, int64_t t0,
                       int64_t t1, const moeq_amx_then *then, void *ws, size_t ws_bytes);

/* The emulation: the same chain per element, built from job->x and the weight with scalar code, one
 * element per tile (slow; the tests' oracle). */
void moeq_amx_nt_block_ref(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1);

/* n E4M3 bytes as the BF16 the tiles multiply (exact; 0x7f and 0xff as NaN 0x7fc0 with their sign): the
 * tables' test. Needs moeq_amx_supported(). */
void moeq_amx_widen_f8(const uint8_t *in, uint16_t *out, size_t n);

/* The whole job on the calling thread (pack, workspace and product): tests and benchmarks.
 * -1 when memory for the pack cannot be had, else 0. */
int moeq_amx_nt_job(const moeq_mm_job *job);

#endif
