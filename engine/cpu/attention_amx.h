/*
 * attention_amx.h — internal: MLA attention (the absorbed form of
 * attention.h) on AMX BF16 tiles, the `cpu_matrix = amx` path's attention.
 *
 * Both operands are float32 (queries and cached latents), so each is split
 * into hi = bf16(x) and lo = bf16(x - hi) (ops_amx.h) and a product takes
 * three tile passes, hi*hi + hi*lo + lo*hi (lo*lo is below 2^-32 of it).
 * Per query column (token t, head h) the arithmetic is fixed:
 *
 *   scores   E = kv_lora + rope values per cached row (latent, then k_pe),
 *            zero padded to steps of 32; s_j = C * scale, where C starts at 0
 *            and for each step s ascending takes C = tdp(C, c_hi, q_hi);
 *            C = tdp(C, c_hi, q_lo); C = tdp(C, c_lo, q_hi) (c: row j's 32
 *            values of the step, q: the query's).
 *   softmax  moeq_mla_softmax (the lanes' softmax, same bits).
 *   output   o[d] = C from 0, over steps of 32 context rows u ascending:
 *            C = tdp(C, p_hi, c_hi); C = tdp(C, p_lo, c_hi);
 *            C = tdp(C, p_hi, c_lo) (p: the 32 probabilities of the step, 0
 *            past the context; c: column d of those rows).
 *
 * tdp is TDPBF16PS on one element (ops_amx.h: each element depends only on
 * its own A row, B column and C, wherever it sits in a tile), so which
 * columns share a tile, how the context is cut into slabs and how many
 * tokens are computed together never change a column's bits: a token in a
 * prefill group equals the token alone (decode). The only rows a column
 * reads that it would not read alone are rows past its context inside its
 * group's last step, with p = 0: their products add exact zeros, unless a
 * later token of the same sequence cached a NaN or an infinity (the
 * sequence's later logits are non-finite then in either case).
 */
#ifndef MOEQ_ENGINE_ATTENTION_AMX_H
#define MOEQ_ENGINE_ATTENTION_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* Query columns (tokens x heads) one call computes at most, and the task the backend gives it: a head block
 * of up to 16 heads of up to 8 consecutive prefill tokens (splitting the rows costs about as much as the
 * tiles' arithmetic on 32 columns: the more columns share a split, the less it weighs). */
#define MOEQ_MLA_AMX_COLS 128
#define MOEQ_MLA_AMX_HEAD_BLOCK 16
#define MOEQ_MLA_AMX_GROUP 8
/* bf16 parts each float32 operand is split into */
#ifndef MOEQ_MLA_AMX_PARTS
#define MOEQ_MLA_AMX_PARTS 3
#endif

/* Per-thread workspace of moeq_mla_group_amx for this kv_lora and rope (64-byte aligned). */
size_t moeq_mla_amx_ws_bytes(int kv_lora, int rope);

/*
 * A sequence's cached rows [0, n) split once for every task of a call that reads them. A task splits the rows
 * of its context itself, slab by slab; in a prefill every group of tokens (and every head block) reads the same
 * rows, and splitting them again per task took about a sixth of a 2,048-token prefill. The split is the one a
 * task makes (same values, same bits), laid out for all slabs at once in one buffer.
 */
typedef struct moeq_mla_amx_split {
    uint16_t *rows;   /* the scores' operand: part i of row j at rows + (i * n_pad + j) * ldr */
    uint32_t *pairs;  /* the output's: rows 32 u..32 u + 31, part i, pair row k2 at
                       * pairs + ((u * NP + i) * 16 + k2) * ldp */
    int64_t n, n_pad; /* rows split; rounded up to a slab (rows n..n_pad - 1 are zeros) */
    int32_t seq;
} moeq_mla_amx_split;

/* Bytes of a split of n rows; its layout in buf (64-byte aligned); the slabs to split, each a task. */
size_t moeq_mla_amx_split_bytes(int kv_lora, int rope, int64_t n);
moeq_mla_amx_split moeq_mla_amx_split_at(int kv_lora, int rope, int32_t seq, int64_t n, void *buf);
int64_t moeq_mla_amx_split_slabs(int64_t n);
void moeq_mla_amx_split_slab(const moeq_mla_params *params, const moeq_mla_amx_split *sp, int64_t k);

/*
 * nt consecutive query tokens t0.. of one sequence at consecutive positions, heads [h0, h1), with
 * nt * (h1 - h0) <= MOEQ_MLA_AMX_COLS: out_lat of those (token, head) pairs. sp: NULL, or that sequence's rows
 * split for at least this group's context (its last slab is split here all the same: rows past the context
 * are zeros there). scores: nt * (h1 - h0) * (pos[t0 + nt - 1] + 1) floats of scratch; ws:
 * moeq_mla_amx_ws_bytes(kv_lora, rope) bytes. Needs moeq_amx_supported().
 */
void moeq_mla_group_amx(const moeq_mla_params *params, int64_t t0, int nt, int h0, int h1, const moeq_mla_amx_split *sp,
                        float *scores, void *ws, size_t ws_bytes);

/* The emulation: token t, heads [h0, h1), each element's chain built with scalar code and run one element
 * per tile (slow; the tests' oracle). scores: (h1 - h0) * (pos[t] + 1) floats. */
void moeq_mla_block_amx_ref(const moeq_mla_params *params, int64_t t, int h0, int h1, float *scores);

#endif
