/*
 * scheduler.h — the worker's continuous-batching policy.
 *
 * The worker takes batches of jobs from Redis; the engine runs a rolling set
 * of sequences. This module decides, step after step, what the engine runs:
 *
 *  - a fixed number of sequence slots (max_seqs). Jobs of taken batches wait
 *    in a pending queue (higher priority first, then arrival order) and are
 *    admitted as slots free up and the KV cache reservation allows
 *    (prompt + max_new_tokens, rounded up to cache blocks), so the engine's
 *    batch stays full across batch boundaries;
 *  - each step is one decode token for every sequence that has finished its
 *    prompt, then prefill chunks of admitted prompts (oldest admission first)
 *    up to max_step_tokens in total;
 *  - a job with mtp_k > 0 decodes speculatively once its prompt is done: the
 *    plan lists it as a round (its last token plus up to mtp_k drafts,
 *    verified in the same engine step as the plan's items) and the
 *    round's accepted tokens come back together. They are taken one by one
 *    exactly as single decode tokens would be, so a stop id, a stop string or
 *    max_new_tokens reached inside a run ends the job at that token and the
 *    rest of the run is dropped; k never exceeds the tokens the job may still
 *    produce minus one; decode tokens, rounds and prefill chunks of a plan
 *    together fit max_step_tokens (every decoding sequence gets its token
 *    first, drafts come out of what is left — at most half of it while a
 *    prompt waits — and prefill chunks take the rest);
 *  - per job it tracks the generated tokens and the detokenized text and
 *    ends the job on a stop token id, a stop string (matched on the text,
 *    across token boundaries; the text is cut where the match begins),
 *    max_new_tokens, its deadline (`expired`, partial text kept) or a cancel
 *    (`cancelled`, partial text kept). Deadlines and cancels take effect at
 *    the next moeq_sched_plan, i.e. within one engine step;
 *  - a finished job's result is handed to the caller to publish; a batch is
 *    reported acknowledgeable only when every one of its jobs' results was
 *    confirmed delivered (moeq_sched_delivered), never earlier.
 *
 * What it deliberately does not do: no engine calls, no sampling, no I/O, no
 * clock (every call takes now_ms). The caller maps slots to engine sequences
 * and samplers, runs the step, samples, and feeds the sampled tokens back.
 * Detokenization is injected as a pure token -> bytes function.
 *
 * Memory: slot and plan arrays are sized at creation; a job's prompt, stop
 * strings and output buffers are allocated when its batch is added (output
 * buffers grow geometrically), never per step.
 *
 * Not thread-safe: one scheduler per worker loop.
 */
#ifndef MOEQ_WORKER_SCHEDULER_H
#define MOEQ_WORKER_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "moeq/result.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moeq_sched_params {
    int max_seqs;             /* sequence slots; [1, 4096]                                   */
    int max_step_tokens;      /* tokens per engine step, all items; >= max_seqs               */
    int64_t kv_cache_tokens;  /* cache capacity reserved against; 0 = unlimited               */
    int kv_block_tokens;      /* reservation granularity; >= 1                               */
    const int32_t *stop_ids;  /* model end-of-sequence ids (copied); may be NULL              */
    int n_stop_ids;
    int mtp_max_seqs;         /* speculative rounds only in plans where at most this many
                                 sequences decode (above it a step is compute bound and rounds
                                 cost more than they yield); 0 = no limit                     */
    int prefix_share_min;     /* a new job whose prompt starts with at least this many tokens
                                 of a running job's fed prompt forks that job's sequence instead
                                 of prefilling them (one token less when it decodes
                                 speculatively: the MTP entry there reads the next token);
                                 0 = never                                                    */
    double mtp_min_acceptance;/* a job whose last MOEQ_SCHED_MTP_WINDOW drafts were accepted
                                 less often than this pauses drafting (decodes plainly) for 32
                                 tokens, doubling while it stays low, up to 1024; 0 = never   */
    int max_model_len;        /* the model's context: a job whose prompt + max_new_tokens exceeds
                                 it finishes at once with error prompt_too_long; 0 = unchecked */
    int mtp_auto;             /* 1: each plan chooses every speculative job's drafts, 0 up to its
                                 mtp_k, from its measured acceptance by depth and the measured
                                 cost of steps (mtp_auto.h; feed moeq_sched_note_step_seconds);
                                 mtp_min_acceptance is then not used                          */
    double mtp_draft_share;   /* mtp_auto: what a pass of the MTP layer costs against a main step
                                 of as many tokens, [0, 1] (its share of the weights)         */
} moeq_sched_params;

/* Drafts over which a job's acceptance is judged (mtp_min_acceptance). */
#define MOEQ_SCHED_MTP_WINDOW 16

/* max_seqs 64, max_step_tokens 2048, kv_cache_tokens 0, kv_block_tokens 16, no stop ids, mtp_max_seqs 0,
 * prefix_share_min 0, mtp_min_acceptance 0, mtp_auto 0. */
moeq_sched_params moeq_sched_default_params(void);

/*
 * Detokenization, per job (the caller usually keeps a streaming decoder in
 * its job, reached through job_user). token >= 0: the text this token
 * completes (held back while a UTF-8 character is incomplete; may be 0
 * bytes). token == MOEQ_SCHED_DETOK_FLUSH: the job ends, give out any held
 * tail. *bytes is borrowed until the next call. Stop ids are never pushed;
 * flush is called once when a job that held a slot finishes other than by a
 * stop string (whose match already fixed the text).
 */
#define MOEQ_SCHED_DETOK_FLUSH (-1)
typedef size_t (*moeq_sched_detok_fn)(void *ctx, void *job_user, int32_t token, const char **bytes);

typedef struct moeq_sched moeq_sched;

/*
 * The prefix cache, injected like detokenization: prompt tokens (whole
 * cache blocks, at most n_prompt - 1) the engine already holds computed for
 * a new job with this prompt (moeq_engine_prefix_lookup). Asked once per
 * job, when it gets its first item; the job's prefill then starts after
 * them (moeq_sched_item.cached_tokens). NULL = no cache.
 */
typedef int (*moeq_sched_prefix_fn)(void *ctx, const int32_t *prompt, int n_prompt, int mtp);

/*
 * The engine's KV blocks, injected like the prefix cache (moeq_engine_kv_blocks,
 * moeq_engine_seq_blocks_to_grow). Without it a job is admitted only when its
 * whole length (prompt + max_new_tokens) fits beside every running job's whole
 * length, so jobs that share an instruction reserve it once each. With it a
 * job is admitted when the blocks every running job may still take, plus its
 * own, fit in what the pool can give now (free and cached blocks), and blocks
 * that jobs share (a fork of a running job's prompt, a prefix-cache hit on a
 * running job's blocks) count once: an open sequence's count comes from the
 * engine, and a job not yet fed counts its whole length less the leading
 * prompt blocks live sequences hold now (it takes those at its first chunk).
 * The counts are made again at every admission: a held block released before
 * its sharer opened counts again, and its release to the pool pays for it. A
 * speculative job counts one block more in each pool (a rollback into a block
 * another sequence holds copies it first) and its MTP entries in the MTP
 * pool. A job admitted while nothing runs takes the pool alone.
 *
 * pool: mtp = 0 the main cache, 1 the MTP layer's; takeable and total blocks.
 * to_grow: blocks slot's open sequence takes growing to n_tokens (its MTP
 * entries when mtp = 1); < 0 when the slot has no open sequence.
 * held: leading blocks of prompt a new sequence would take in both pools it
 * uses (mtp: the main and MTP caches) without allocating; NULL = none.
 */
typedef struct moeq_sched_kv {
    void (*pool)(void *ctx, int mtp, int64_t *takeable, int64_t *total);
    int64_t (*to_grow)(void *ctx, int slot, int mtp, int64_t n_tokens);
    int64_t (*held)(void *ctx, const int32_t *prompt, int n_prompt, int mtp);
    void *ctx;
} moeq_sched_kv;

/* Validates params (message names the field). detok may be NULL: no text, stop strings never match. */
moeq_err moeq_sched_new(const moeq_sched_params *params, moeq_sched_detok_fn detok, void *ctx,
                        moeq_sched **out, char *errstr, size_t errstr_size);
/* Frees every job and batch still held. NULL is safe. */
void moeq_sched_destroy(moeq_sched *sched);
/* Install the prefix-cache lookup (NULL: none). A hit at least as long as a running job's fork wins. */
void moeq_sched_set_prefix_lookup(moeq_sched *sched, moeq_sched_prefix_fn fn, void *ctx);
/* Install the KV block view (NULL or no pool function: reserve whole lengths). */
void moeq_sched_set_kv(moeq_sched *sched, const moeq_sched_kv *kv);

/* One job of a batch, as the caller hands it in. Everything is copied except user. */
typedef struct moeq_sched_job_spec {
    const char *key;            /* the job id (cancel looks jobs up by it); required          */
    void *user;                 /* the caller's job; returned with the result, never touched  */
    int priority;               /* 0 (first) .. 3                                             */
    const int32_t *prompt;      /* prompt token ids                                           */
    int n_prompt;               /* >= 1, else the job finishes at once with an error result   */
    int max_new_tokens;         /* >= 0; 0 finishes at once with finish_reason length         */
    int64_t deadline_ms;        /* absolute, ms since the epoch; 0 = none                     */
    const char *const *stop;    /* stop strings; NULL/empty entries ignored                   */
    size_t n_stop;
    int cancelled;              /* 1: already cancelled: finishes at once, status cancelled   */
    const char *error_code;     /* non-NULL: cannot run (dead-lettered, bad entry): finishes at
                                   once with status error and this code / error_message      */
    const char *error_message;
    int mtp_k;                  /* drafts per speculative round, 0..MOEQ_SCHED_MAX_MTP_K;
                                   0 = plain decoding (one token per step)                    */
    const int32_t *stop_token_ids; /* the job's own stop ids (besides the model's), copied;
                                      one ends the job with finish_reason stop_token          */
    size_t n_stop_token_ids;
} moeq_sched_job_spec;

/* Most drafts per round a job may ask for (the engine's MOEQ_MTP_MAX_K). */
#define MOEQ_SCHED_MAX_MTP_K 8

/*
 * Add a taken batch of n_jobs jobs (n_jobs may be 0: the batch is
 * acknowledgeable at once, e.g. every job was already done). batch_user is
 * returned by moeq_sched_next_ackable. Job handles (for moeq_sched_delivered)
 * are reported with each finished job.
 * Errors: MOEQ_ERR_INVALID_ARG (NULL spec, missing key), MOEQ_ERR_NOMEM;
 * on error nothing was added.
 */
moeq_err moeq_sched_add_batch(moeq_sched *sched, void *batch_user, const moeq_sched_job_spec *jobs,
                              size_t n_jobs, int64_t now_ms, char *errstr, size_t errstr_size);

/* Slots not taken by running or pending jobs (may be negative when more jobs wait than slots are free). */
int moeq_sched_free_capacity(const moeq_sched *sched);

/*
 * Mark the job with this key cancelled; it finishes at the next plan with
 * status cancelled and the text generated so far. MOEQ_ERR_NOT_FOUND when no
 * pending or running job has the key (unknown, or its result is already fixed).
 */
moeq_err moeq_sched_cancel(moeq_sched *sched, const char *key);

/* One item of an engine step. */
typedef struct moeq_sched_item {
    int slot;               /* 0 .. max_seqs-1                                              */
    int new_seq;            /* 1: the job's first item: give the slot a fresh engine sequence
                               and sampler (seeded for this job)                             */
    const int32_t *tokens;  /* borrowed until the next plan/commit/abort                      */
    int n_tokens;
    int sample;             /* 1: sample one token from this item's last logits for commit   */
    int job;                /* job handle                                                    */
    void *user;             /* the job's spec.user                                           */
    int mtp;                /* 1: the job decodes speculatively (new_seq: mark the sequence)  */
    int fork_tokens;        /* new_seq and > 0: the running slot fork_slot's sequence holds this
                               job's first fork_tokens prompt tokens: start the job's sequence as
                               a fork of it (moeq_engine_seq_fork); tokens start after them      */
    int fork_slot;
    int cached_tokens;      /* new_seq and > 0: the prefix cache holds the job's first cached_tokens
                               prompt tokens: start the sequence with them (moeq_engine_seq_new_prefix,
                               max_cached = this); tokens start after them                       */
} moeq_sched_item;

/*
 * One speculative round: the engine appends next_token and up to k drafts,
 * verifies them and returns 1..k+1 new tokens (moeq_mtp_decode_step).
 */
typedef struct moeq_sched_round {
    int slot;
    int job;                /* job handle                                                    */
    void *user;             /* the job's spec.user                                           */
    int32_t next_token;     /* the last sampled token, not yet in the engine's cache         */
    int k;                  /* drafts, 1..the job's mtp_k (mtp_auto: as chosen for the plan)  */
} moeq_sched_round;

/* What the engine made of round i. */
typedef struct moeq_sched_round_out {
    const int32_t *tokens;  /* the new tokens in order (accepted drafts, then the model's)    */
    int n_tokens;           /* 1..k+1; 0: the round's logits held NaN/inf (moeq_spec_seq's
                               numerical_error): the job ends with error numerical_error      */
    int drafted, accepted;  /* this round's drafts and accepted drafts                       */
} moeq_sched_round_out;

typedef struct moeq_sched_step {
    const moeq_sched_item *items; /* borrowed until the next plan/commit/abort          */
    int n_items;                  /* 0: nothing to run                                  */
    int n_tokens;                 /* Σ n_tokens                                         */
    int n_prefill_tokens, n_decode_tokens;
    const int *released;          /* slots freed since the last plan: free their engine
                                     sequences and samplers before running this plan    */
    int n_released;
    const moeq_sched_round *rounds; /* speculative rounds, run after (or besides) the step;
                                       borrowed like items                               */
    int n_rounds;                 /* 0: none                                            */
    int n_round_tokens;           /* Σ (k + 1): tokens the rounds verify                */
} moeq_sched_step;

/*
 * Compose the next step at now_ms: first retire cancelled and expired jobs
 * (their results become available from moeq_sched_next_finished), then admit
 * pending jobs into free slots, then compose the step and the speculative
 * rounds. A plan with items or rounds must be followed by exactly one
 * moeq_sched_commit (moeq_sched_commit_mtp when it has rounds) or
 * moeq_sched_abort before the next plan (MOEQ_ERR_INVALID_ARG otherwise).
 */
moeq_err moeq_sched_plan(moeq_sched *sched, int64_t now_ms, moeq_sched_step *plan);

/*
 * mtp_auto: the last plan (its step and rounds) took `seconds`, start to end, of which its rounds' draft
 * passes took draft_seconds (moeq_mtp_decoder_last_draft_ns; 0 without rounds; < 0: not timed apart). Call
 * it after running the plan, before the next: the choice of drafts learns the cost of steps and drafts from
 * it. No effect otherwise.
 */
void moeq_sched_note_step_seconds(moeq_sched *sched, double seconds, double draft_seconds);

/*
 * The engine ran the plan: sampled[i] is the token sampled for item i (read
 * only where items[i].sample is 1). Appends tokens, advances prefills, ends
 * jobs on stop ids, stop strings and max_new_tokens. sampled[i] < 0 means
 * the item's logits held NaN/inf (moeq_sampler_sample gave -1): that job
 * alone ends with error numerical_error, the others go on.
 */
moeq_err moeq_sched_commit(moeq_sched *sched, const int32_t *sampled, int64_t now_ms);

/*
 * Optional, before the commit that fails it with numerical_error: the layer
 * where the engine first saw the job's NaN/inf (moeq_engine_seq_nonfinite_
 * layer), named in the result's message. -1 = unknown.
 */
void moeq_sched_note_nonfinite_layer(moeq_sched *sched, int job, int layer);

/*
 * Optional, before the commit that takes the token: the job's output is
 * complete after its n_tokens-th generated token (structured output: the
 * grammar cannot go on). The job then finishes there with finish_reason
 * stop (also when that token is a stop id), and any later token of a round
 * is dropped as after any stop. n_tokens <= 0: no effect.
 */
void moeq_sched_note_complete(moeq_sched *sched, int job, int n_tokens);

/*
 * Optional, before a commit: the job's next token must not be taken (its logits processing failed, e.g.
 * a grammar outgrew its limits mid-output). At that token the job finishes with status error, this code
 * (a MOEQ_CODE_* name, kept by pointer) and message, the tokens before it kept. The first note counts.
 */
void moeq_sched_note_error(moeq_sched *sched, int job, const char *code, const char *message);

/*
 * moeq_sched_commit for a plan with rounds: rounds[i] is what the engine made
 * of plan.rounds[i]. Each round's tokens are taken one at a time as decode
 * tokens; a job that ends inside its run (stop id, stop string,
 * max_new_tokens) ends at that token and the rest is dropped (its slot is
 * released: the engine sequence, which holds the whole run, must be freed,
 * never reused). Drafted/accepted counts add up per job and in the stats.
 * MOEQ_ERR_INVALID_ARG (nothing committed, the plan stays open) when rounds
 * is NULL for a plan with rounds or a count is out of range.
 */
moeq_err moeq_sched_commit_mtp(moeq_sched *sched, const int32_t *sampled, const moeq_sched_round_out *rounds,
                               int64_t now_ms);

/*
 * The engine failed the step or a round: every job in the plan (items and
 * rounds) finishes with status error (error code `code`, message `message`,
 * partial text kept).
 */
void moeq_sched_abort(moeq_sched *sched, const char *code, const char *message, int64_t now_ms);

/* A finished job's outcome. Every pointer is borrowed until moeq_sched_delivered(job, 1). */
typedef struct moeq_sched_finished {
    int job;                       /* handle for moeq_sched_delivered                     */
    void *user, *batch_user;
    const char *key;
    moeq_result_status status;
    moeq_finish_reason finish_reason;
    const char *text;              /* NUL-terminated; stop string removed                 */
    size_t text_len;
    const int32_t *tokens;         /* generated ids (a final stop id included)            */
    int n_tokens;
    int n_prompt;
    const char *error_code;        /* NULL when status is ok (result.h: MOEQ_CODE_*)      */
    const char *error_message;
    int64_t added_ms;              /* batch added                                         */
    int64_t admitted_ms;           /* got a slot; 0 = never                               */
    int64_t first_token_ms;        /* prompt done, first token sampled; 0 = never         */
    int64_t finished_ms;
    int mtp;                       /* 1: it held a slot with mtp_k > 0 (decoded speculatively) */
    int64_t mtp_drafted, mtp_accepted; /* over its rounds                               */
} moeq_sched_finished;

/*
 * Next finished job whose result was not handed out yet (FIFO). Returns 1 and
 * fills *out, or 0 when none. Publish it, then report the broker's verdict.
 */
int moeq_sched_next_finished(moeq_sched *sched, moeq_sched_finished *out);

/*
 * The broker acknowledged (ok=1) or definitively failed (ok=0) the result of
 * job. ok=0 puts the result back at the end of the finished queue for another
 * attempt. MOEQ_ERR_INVALID_ARG for a handle not handed out.
 */
moeq_err moeq_sched_delivered(moeq_sched *sched, int job, int ok);

/* Next batch all of whose results were delivered: returns 1 and its batch_user, or 0. */
int moeq_sched_next_ackable(moeq_sched *sched, void **batch_user);

typedef struct moeq_sched_stats {
    int running;                 /* jobs holding a slot                                 */
    int pending;                 /* jobs waiting for a slot                             */
    int free_slots;
    int unpublished;             /* finished, result not yet delivered                  */
    int batches;                 /* batches held (not yet reported ackable)             */
    int running_max;             /* the most jobs that held slots at once               */
    int64_t kv_reserved_tokens;  /* KV tokens running jobs hold or may still take (with moeq_sched_kv: blocks
                                    held by sequences and promised to running jobs, at the last admission) */
    int64_t prefill_tokens, decode_tokens; /* totals committed                          */
    int64_t prefix_tokens_shared;          /* prompt tokens taken from a running job's cache */
    int64_t prefix_tokens_cached;          /* prompt tokens taken from the prefix cache       */
    int64_t jobs_finished;
    int64_t mtp_rounds, mtp_drafted, mtp_accepted; /* speculative rounds committed      */
} moeq_sched_stats;

void moeq_sched_get_stats(const moeq_sched *sched, moeq_sched_stats *stats);

/* 1 when no job or batch is held at all (drained). */
int moeq_sched_idle(const moeq_sched *sched);

#ifdef __cplusplus
}
#endif
#endif
