/*
 * mtp.h — internal: the MTP (multi-token prediction) module inside the
 * engine: its own paged cache (same sequence ids as the main cache), the
 * main model's last hidden rows retained per sequence, and the module's
 * forward (enorm/hnorm/eh_proj, one decoder block run by forward.c's block
 * code, shared_head norm + head). engine.c calls these hooks; the public
 * entry points (moeq_engine_mtp_*) are in mtp.c, speculative decoding is in
 * mtp_spec.c.
 *
 * MTP cache entry i is the block's latent for input (h_i, t_{i+1}): h_i the
 * main model's hidden at position i after its final norm, t_{i+1} the next
 * token. After a main step a marked sequence has entries 0 .. seq_len - 2:
 * computed ones 0 .. done - 1 and pending ones, whose inputs (hidden rows,
 * tokens) are kept until the next draft computes them together with the
 * draft entry seq_len - 1; further drafts append seq_len, seq_len + 1, ...
 *
 * Only MTP layer 0 is used (DeepSeek-V3 ships one); chaining reuses it.
 */
#ifndef MOEQ_ENGINE_MTP_H
#define MOEQ_ENGINE_MTP_H

#include "forward.h"

typedef struct moeq_mtp_state moeq_mtp_state;

/* NULL state (no error) when the model has no MTP layer. */
moeq_err moeq_mtp_state_new(moeq_engine *engine, moeq_mtp_state **out, char *errstr, size_t errstr_size);
void moeq_mtp_state_destroy(moeq_engine *engine, moeq_mtp_state *state); /* NULL state is safe */

/* 1 when MTP drafts use F8 copies (mtp_draft = f8 on a host backend, the model has an MTP layer). */
int moeq_mtp_draft_f8(const moeq_engine *engine);
/* Bytes the F8 copies hold (0 when there are none). */
size_t moeq_mtp_draft_f8_bytes(const moeq_engine *engine);

void moeq_mtp_seq_opened(moeq_engine *engine, int seq_id);
void moeq_mtp_seq_freed(moeq_engine *engine, int seq_id);
/* 1 when the sequence was marked speculative (its steps advance the MTP cache). */
int moeq_mtp_seq_on(const moeq_engine *engine, int seq_id);
/* The main cache was truncated to n_tokens: drop MTP entries >= n_tokens - 1 and hidden rows past it. */
void moeq_mtp_seq_truncated(moeq_engine *engine, int seq_id, int64_t n_tokens);

/*
 * dst was forked from the marked src at n tokens (its main cache already
 * shares src's first n; 1 <= n <= src's length - 1): compute src's pending
 * entries below n, fork the MTP cache (entries 0 .. n - 1) and mark dst.
 * Entry n - 1 was built from src's token at n, so dst holds it as its first
 * draft entry drafted with next_token (confirmed by a first step that
 * appends next_token) and keeps no ring rows: a first step appending another
 * token is refused by moeq_mtp_check_item. LIMIT when the MTP cache is full,
 * INVALID_ARG when src's pending entries cannot be computed; dst unchanged
 * then (src's pending entries may have been computed).
 */
moeq_err moeq_mtp_seq_forked(moeq_engine *engine, int src, int64_t n, int32_t next_token, int dst, char *errstr,
                             size_t errstr_size);

/*
 * Prefix cache: MTP block b (entries b*bt .. b*bt + bt - 1, entry i from h_i
 * and token i + 1) is keyed by main tokens b*bt .. (b + 1)*bt (one past the
 * block) once its entries are true (computed from true hidden rows and
 * tokens), chained like the main cache's blocks.
 * moeq_mtp_prefix_blocks: of the first max_blocks main blocks of prompt,
 * how many lead an MTP chain the cache holds too. moeq_mtp_seq_take_prefix:
 * the marked, empty seq (its main cache just took n_blocks) takes them and is
 * set up as a fork at n = blocks x bt would be (entry n - 1 is kept as the
 * first draft entry, drafted with prompt[n], confirmed by its first step);
 * returns the blocks taken.
 */
int64_t moeq_mtp_prefix_blocks(const moeq_engine *engine, const int32_t *prompt, int n_prompt, int64_t max_blocks);
int64_t moeq_mtp_seq_take_prefix(moeq_engine *engine, int seq_id, const int32_t *prompt, int n_prompt,
                                 int64_t n_blocks);
struct moeq_kv_blocks_stats;
void moeq_mtp_prefix_stats(const moeq_engine *engine, struct moeq_kv_blocks_stats *stats);
/* Tests: the MTP cache (its prefix-cache hash hook). */
moeq_kv_cache *moeq_mtp_cache(const moeq_engine *engine);

/* Validation of a step's items of marked sequences before anything changes; adds the MTP cache blocks they need. */
moeq_err moeq_mtp_check_item(moeq_engine *engine, const moeq_step_item *item, int index, int64_t *mtp_blocks,
                             char *errstr, size_t errstr_size);
moeq_err moeq_mtp_check_blocks(moeq_engine *engine, int64_t mtp_blocks, char *errstr, size_t errstr_size);

/*
 * After the main forward of a step (s.x holds the residuals of its n_tok
 * tokens): keep the hidden rows and tokens of the marked sequences' items,
 * confirm a first draft entry whose token the step appended, and run the MTP
 * block only over entries that would otherwise leave the ring of kept rows
 * (none in a speculative round). Overwrites the step scratch.
 */
void moeq_mtp_after_step(moeq_engine *engine, const moeq_step_item *items, int n_items, int64_t n_tok);

/*
 * Tests: the MTP cache entry of (seq, pos) (kv_lora + rope floats), pos <
 * moeq_engine_mtp_seq_len. Computes the sequence's pending entries first
 * (what its next draft would do), so it overwrites the step scratch.
 */
const float *moeq_mtp_cache_entry(moeq_engine *engine, int seq_id, int64_t pos);

/* Tests: MTP block rows computed since the engine was created (drafts, pending entries, catch-up). */
int64_t moeq_mtp_rows_run(const moeq_engine *engine);

/* 1 when drafts go through lm_head: the MTP layer has no head of its own, or its head holds lm_head's bytes. */
int moeq_mtp_head_is_lm_head(const moeq_engine *e);
/* The head drafts are made with: lm_head, the MTP layer's own, a draft copy, or the screened head's int8 copy of
 * lm_head (moeq_forward_head_codes) once drafts are int8 and the screen applies. NULL without an MTP layer. */
const moeq_tensor *moeq_mtp_draft_head(const moeq_engine *e);

#endif
