/*
 * decode_proc.h — one job's logits processing between the engine's logits
 * and its sampler (a moeq_sampler_hook): structured output (a grammar's
 * token mask, with the job's remaining budget), min_tokens, repetition /
 * presence / frequency penalties, and the log-probabilities a result
 * carries.
 *
 * Order, per draw, on the sampler's copy of the row: repetition penalty
 * (vLLM: over prompt and output tokens), presence and frequency penalties
 * (OpenAI: over output tokens), then the masks (grammar; end-of-sequence
 * and stop ids allowed only where the grammar is complete and the job has
 * min_tokens behind it). Log-probabilities are the model's own
 * (log-softmax of the unprocessed row at temperature 1), as vLLM and
 * OpenAI report them.
 *
 * The state advances with every draw the sampler reports, so it follows
 * the emitted tokens exactly, in plain and in speculative (exact mode)
 * decoding alike; a job's output depends on nothing but its own logits.
 *
 * Memory is sized at creation (max_new_tokens entries); a draw allocates
 * nothing. Not thread-safe; one per job.
 */
#ifndef MOEQ_WORKER_DECODE_PROC_H
#define MOEQ_WORKER_DECODE_PROC_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/engine.h"
#include "moeq/err.h"
#include "moeq/grammar.h"
#include "moeq/grammar_job.h" /* moeq_response_format_spec */
#include "moeq/job.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moeq_decode_proc_params {
    moeq_grammar *grammar;          /* NULL: unconstrained; a reference is taken           */
    const int32_t *eos_ids;         /* the model's end-of-sequence ids (copied)             */
    int n_eos;
    const int32_t *stop_token_ids;  /* the job's stop ids (copied)                          */
    int n_stop_token_ids;
    int max_new_tokens;             /* the grammar's budget; >= 1                           */
    int min_tokens;                 /* eos/stop ids masked before this many tokens          */
    double repetition_penalty;      /* (0, 2]; 1 (or 0) = off                               */
    double presence_penalty;        /* [-2, 2]                                              */
    double frequency_penalty;       /* [-2, 2]                                              */
    const int32_t *prompt;          /* for the repetition penalty (copied into a set)       */
    int n_prompt;
    int logprobs;                   /* 1: record each draw's log-probability                */
    int top_logprobs;               /* 0..20 alternatives per draw                          */
} moeq_decode_proc_params;

typedef struct moeq_decode_proc moeq_decode_proc;


/* 1 when a job with these settings needs a processor at all. */
int moeq_decode_proc_needed(const moeq_decode_proc_params *params);

moeq_err moeq_decode_proc_new(const moeq_decode_proc_params *params, int vocab, moeq_decode_proc **out,
                              char *errstr, size_t errstr_size);
void moeq_decode_proc_destroy(moeq_decode_proc *proc);

/* The hook to give the job's sampler (moeq_sampler_set_hook); proc must outlive the sampler's use. */
moeq_sampler_hook moeq_decode_proc_hook(moeq_decode_proc *proc);

/* Tokens drawn so far. */
int moeq_decode_proc_n_drawn(const moeq_decode_proc *proc);
/* The draw count after which the grammar was complete with nothing allowed to follow (or ended by an
 * end-of-sequence/stop id where it was complete); 0 = not yet. For moeq_sched_note_complete. */
int moeq_decode_proc_complete_at(const moeq_decode_proc *proc);
/* A grammar failure while masking (MOEQ_ERR_LIMIT: the DFA outgrew max_dfa_states); MOEQ_OK otherwise. From
 * the failing draw on, draws are not constrained to anything meaningful: end the job
 * (moeq_sched_note_error) — the worker does, at the first draw after the failure. */
moeq_err moeq_decode_proc_error(const moeq_decode_proc *proc);

/* Draw i's log-probability record (i < n_drawn and logprobs on): the token, its logprob, and n_top
 * alternatives (most likely first). Borrowed until the next draw or destroy. */
typedef struct moeq_logprob {
    int32_t token;
    float logprob;
    int n_top;
    const int32_t *top_tokens;
    const float *top_logprobs;
} moeq_logprob;
int moeq_decode_proc_logprob(const moeq_decode_proc *proc, int i, moeq_logprob *out);

#ifdef __cplusplus
}
#endif
#endif
