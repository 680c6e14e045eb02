/*
 * forward.h — internal: the batched forward step over the engine object of
 * engine_state.h (engine.c creates it, forward.c runs it). Not installed.
 *
 * Memory by lifetime: the model's weights are borrowed (mmapped, stored
 * width) and mapped into the backend once; small vectors (norm weights,
 * router biases) are widened once at creation into backend buffers; the KV
 * cache's entry pool is a backend buffer, its block tables host bookkeeping;
 * per-step scratch is one backend arena sized for max_step_tokens, beside a
 * small host arena for the step's metadata (token ids, positions, the
 * router's finite flags). A step allocates nothing.
 */
#ifndef MOEQ_ENGINE_FORWARD_H
#define MOEQ_ENGINE_FORWARD_H

#include <stdint.h>

#include "engine_state.h"

/* What decides a cache block's contents besides its tokens (model shape, weights, the reduction mode) and
 * which cache it is (kind 0 main, 1 MTP): the prefix cache's key salt. */
uint64_t moeq_forward_cache_salt(const moeq_engine *engine, int kind);
/* Most cached blocks for a pool of capacity_tokens under params.prefix_cache_share (kv_cache max_cached_blocks). */
int64_t moeq_forward_max_cached(const moeq_engine *engine, int64_t capacity_tokens);

/* A paged cache whose entry pool is a backend buffer (*pool, the caller releases it after the cache). scratch not
 * NULL: the pool holds one block more than the cache's, no sequence's, and *scratch is its index (a padded step's
 * rows write and read only it: cuda_graphs). */
moeq_err moeq_forward_cache_new(moeq_engine *engine, const moeq_kv_cache_params *params, int32_t *scratch,
                                float **pool, moeq_kv_cache **out, char *errstr, size_t errstr_size);

/* Main-model layer l as a block (cache = engine->cache, cache layer l). */
moeq_block moeq_forward_main_block(moeq_engine *engine, int layer);

/* cos/sin of s.tok_pos[0..n_tok) into s.cos_v/s.sin_v. */
void moeq_forward_rope(moeq_engine *engine, int64_t n_tok);

/* One block over the residual stream s.x (T, D): x += MLA(norm x); x += MLP/MoE(norm x). Needs rope set. */
void moeq_forward_block(moeq_engine *engine, const moeq_block *block, int64_t n_tok);

/* Frees the screened head's state (head_screen = auto), if one was made. */
void moeq_forward_screen_destroy(moeq_engine *engine);
/* The screened head's int8 copy of lm_head (Q8R, split codes: moeq_tensor_q8r_copy's bytes), the screen made now if
 * it applies and was not yet; NULL where it does not apply or could not be made. Lives as long as the engine. */
const moeq_tensor *moeq_forward_head_codes(moeq_engine *engine);

/* rmsnorm(s.x row s.logit_tok[r], norm) -> head, for r < n_rows, into out's rows row0 + r (moeq_step_out: whole
 * rows, or records and the rows needed whole: on a device, and on the CPU for the main head's rows read only for
 * their argmax when head_screen = auto). Uses s.h. */
void moeq_forward_head(moeq_engine *engine, const float *norm, const moeq_tensor *head, int64_t n_rows,
                       const moeq_step_out *out, int64_t row0);

/* Widen a small tensor (norm weight, bias) into a backend weights buffer; NULL for NULL or on failure. */
float *moeq_forward_widen(moeq_engine *engine, const moeq_tensor *t);

/* rmsnorm of n_rows rows of x (stride ldx; rows[r] or r) into out (stride ld_out), n values each. */
void moeq_forward_rmsnorm(moeq_engine *engine, float *out, int64_t ld_out, const float *x, int64_t ldx,
                          const int64_t *rows, int64_t n_rows, int64_t n, const float *w);

/* y (T, rows) = x (T, cols) W^T through the backend. */
void moeq_forward_linear(moeq_engine *engine, const moeq_tensor *w, const float *x, float *y, int64_t n_tok);

/* Run the layers over the step's tokens already placed in s.tok_* (forward.c). decode: every item of the step
 * has one token (a decode step: the one kind cuda_graphs pads to a bucket and captures). */
void moeq_forward_tokens(moeq_engine *engine, int64_t n_tok, int decode);

/* MoE block of layer over s.h (T, D) into s.tmp (T, D) through the MoE layer (moe_layer.h). */
void moeq_forward_moe(moeq_engine *engine, int layer, int64_t n_tok);

/* Tokens [0, n_tok) whose router saw a non-finite logit (s.finite) flag their sequence at layer L. */

/* Final norm + lm_head for s.logit_tok[0..n_rows) into out (moeq_forward_head). */
void moeq_forward_logits(moeq_engine *engine, int64_t n_rows, const moeq_step_out *out);

/* Tests: 1 = run the naive (expanded K/V) attention instead of the absorbed one. */
void moeq_engine_set_naive_attention(moeq_engine *engine, int on);

#endif
