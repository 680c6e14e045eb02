/*
 * ops_draft.h — internal: the draft products. The weights only a draft reads
 * (mtp_draft = f8: the MTP layer's projections and its head) are held as Q8R
 * copies (tensor.h: int8 codes, one scale per row) and multiplied in int8
 * with exact int32 sums: AVX512-VNNI's VPDPBUSD (64 products per instruction)
 * where the CPU has it, the scalar emulation elsewhere.
 *
 * Why a path of its own: a k = 1 round costs the verify step plus the draft,
 * and the draft is products of 1-2 rows at batch 1, up to mtp_max_batch rows
 * (16) at most. On the exact path's kernels an 8-bit draft either widens
 * every weight before its tiles load it (AMX F8: ~8 GB/s at 1-2 rows, where a
 * BF16 step streams ~12.7) or pays one FMA per weight and row (the float32
 * lanes: bandwidth at 1-2 rows, 2.6x slower than the tiles at 16). Int8 codes
 * feed VPDPBUSD as stored: it streams at 1-2 rows and at 16 rows does 4x the
 * multiply-adds of an FMA. Every emitted token is still decided by the exact
 * path in the verify step: these bits only move drafts (the draft
 * distribution q under rejection sampling, the greedy draft), never the value
 * of an emitted token.
 *
 * The element, for weight row n (codes q_k, scale s_w) and token t:
 *   a = max_k |x_k|, s_x = a / 127, u_k = x_k * (127 / a),
 *   hi_k = rint(u_k), lo_k = rint((u_k - hi_k) * 254)      (both in [-127, 127])
 *   A = sum_k q_k hi_k, B = sum_k q_k lo_k                   (int32, exact)
 *   y = (s_w * s_x) * fma((float)B, 1 / 254, (float)A)
 * The split keeps the activation to ~2^-15 of its largest value, beside the
 * int8 weight's own rounding. a = 0 gives y = 0; a non-finite activation or
 * weight row gives NaN. A weight with q8r_hi_only set (a view the screened
 * head's first pass reads) takes the hi codes alone, y = (s_w * s_x) * (float)A:
 * half the products, the activation to s_x / 2 (the kernel's register blocks
 * then hold twice the rows).
 *
 * Order, the batch-invariance contract: A and B are exact integer sums, so no
 * tiling, thread split, instruction set or number of tokens can change them,
 * and the float steps after them are fixed: every kernel gives the
 * emulation's bits (the tests compare each shape with it and with one token
 * at a time). VPDPBUSD multiplies unsigned by signed bytes: the codes are
 * stored as q + 128 and the kernel subtracts 128 * sum_k hi_k (and lo_k).
 */
#ifndef MOEQ_ENGINE_OPS_DRAFT_H
#define MOEQ_ENGINE_OPS_DRAFT_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* 1 when this CPU has AVX512-VNNI (with AVX512-BW); thread-safe. moeq_draft_describe() says which, e.g.
 * "avx512_vnni int8 dot products" or why not. Where it is 0 the engine keeps F8 draft copies on the exact
 * path's kernels (engine/mtp.c). */
int moeq_draft_supported(void);
const char *moeq_draft_describe(void);

/* 1 when w takes this path: a Q8R weight (any CPU: the emulation runs where VNNI is missing). */
int moeq_draft_fits(const moeq_tensor *w);

/* The workspace moeq_draft_nt_block wants for weights of cols columns: 64 tokens' codes and scales. */
size_t moeq_draft_ws_bytes(int64_t cols);

/*
 * y[t][n] for rows [n0, n1) and tokens [t0, t1) of job (a Q8R weight). ws: 64-byte aligned, the caller's per
 * thread and this path's alone; a smaller one takes fewer tokens at a time, none at all the emulation (the
 * same bits). key: nonzero names the job's activations for the caller (one call's job), so a later block with
 * the same key and tokens reuses the codes ws holds instead of quantising again; 0 never reuses.
 */
void moeq_draft_nt_block(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1, void *ws,
                         size_t ws_bytes, uint64_t key);

/* The emulation: scalar code, the formula above element by element. The tests' oracle. */
void moeq_draft_nt_block_ref(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1);

#endif
