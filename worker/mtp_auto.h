/*
 * mtp_auto.h — `mtp_k = auto`: how many drafts each speculative job's next round gets.
 *
 * A round of k drafts yields 1 + P1 + ... + Pk tokens in expectation, where Pj is the chance that the
 * job's first j drafts are all accepted, and costs k more tokens in the main (verify) step plus a pass of
 * the MTP layer per depth. Whether a draft pays depends on the job (a structured answer's drafts are
 * accepted far more often than free prose's, a high temperature's far less), on the batch (a memory-bound
 * step carries extra tokens almost free, a compute-bound one pays for each in full; a draft that would push
 * a waiting prompt's tokens out of the step costs a whole token) and on the machine. So both sides are
 * measured rather than configured:
 *  - per job, acceptance by draft depth over its recent rounds (moeq_mtp_depths), a new job starting from
 *    the worker-wide figures;
 *  - per worker, a step's time as a function of its tokens and a draft pass's as a function of its
 *    sequences (moeq_mtp_auto_note_step: each plan's time, its drafts' apart).
 * Each plan then gets the drafts that maximise its expected tokens (prompt tokens fed plus tokens
 * generated) per second: moeq_mtp_auto_choose. The output never depends on these choices (rounds give plain
 * decoding's tokens whatever k: exact mode, docs/MTP.md); only the speed does.
 *
 * A job weighs its last ~30 rounds, the worker its last ~200 (any job's); a new job starts from the
 * worker's figures, the worker from an optimistic 0.7 a depth, so every depth gets tried. A job that
 * stopped drafting tries again after 32 plans without, then 64, ... up to 1024 (its old figures then count
 * half; a round with an accepted draft resets the interval), so a change in its text is noticed
 * without paying for a rejected draft every few plans.
 *
 * Pure: no clock, no engine; the caller times its plans. Not thread-safe: one per scheduler.
 */
#ifndef MOEQ_WORKER_MTP_AUTO_H
#define MOEQ_WORKER_MTP_AUTO_H

#include <stddef.h>

#include "moeq/err.h"

/* Deepest draft judged (the scheduler's MOEQ_SCHED_MAX_MTP_K). */
#define MOEQ_MTP_AUTO_MAX_K 8

/* One job's acceptance by draft depth, recent rounds weighted most. All zero: a new job. */
typedef struct moeq_mtp_depths {
    float reached[MOEQ_MTP_AUTO_MAX_K];  /* [j]: rounds that drafted depth j + 1 with depths 1..j accepted */
    float accepted[MOEQ_MTP_AUTO_MAX_K]; /* [j]: of those, the rounds whose depth j + 1 was accepted too */
    float prior[MOEQ_MTP_AUTO_MAX_K];    /* the worker's figures when it started or last tried again     */
    int has_prior;
    int idle;                            /* plans since it last drafted (with room to)                  */
    int probe_after;                     /* idle plans before it tries again; 0 = the first interval    */
} moeq_mtp_depths;

typedef struct moeq_mtp_auto moeq_mtp_auto;

/*
 * max_step_tokens: the most tokens a plan's main step holds (the cost table's size). draft_share: what a
 * pass of the MTP layer over n tokens costs against a main step of n tokens (its share of the weights a
 * token reads, in [0, 1]).
 */
moeq_err moeq_mtp_auto_new(int max_step_tokens, double draft_share, moeq_mtp_auto **out, char *errstr,
                           size_t errstr_size);
void moeq_mtp_auto_destroy(moeq_mtp_auto *a); /* NULL is safe */

/* A speculative job of the plan being composed. */
typedef struct moeq_mtp_auto_job {
    moeq_mtp_depths *depths; /* in: the job's own; aged by one plan in the call                      */
    int k_max;               /* in: the most drafts its round may have (0: none this plan)           */
    int k;                   /* out: drafts for its round this plan; 0 = decode one token plainly    */
} moeq_mtp_auto_job;

/*
 * Choose k for each job of the plan. base_tokens: the main step's tokens before any draft (one for every
 * decoding sequence, plus the prefill tokens it will carry); free_tokens: how many drafts fit in the step
 * without taking a prefill token's place (a draft that would is never worth it: it yields less than the
 * whole token it displaces). Drafts are given depth by depth, at each depth to the jobs most likely to
 * have them accepted, as long as the plan's expected tokens per second grow.
 */
void moeq_mtp_auto_choose(moeq_mtp_auto *a, moeq_mtp_auto_job *jobs, int n_jobs, int base_tokens,
                          int free_tokens);

/* The job's round drafted k tokens and its first `accepted` were accepted (the worker-wide figures too). */
void moeq_mtp_auto_note_round(moeq_mtp_auto *a, moeq_mtp_depths *depths, int k, int accepted);

/*
 * A plan ran in `seconds`: its main step held `tokens` tokens and passes[j] (j < n_passes) sequences drafted
 * at depth j + 1, which took draft_seconds of it (moeq_mtp_decoder_last_draft_ns; < 0: not timed apart, the
 * passes' share is estimated). Plans with more tokens than max_step_tokens, or no time, are ignored.
 */
void moeq_mtp_auto_note_step(moeq_mtp_auto *a, int tokens, const int *passes, int n_passes, double seconds,
                             double draft_seconds);

/* The current estimates: a main step of `tokens` tokens (seconds once a plan was noted, else relative to
 * a one-token step), and the chance a job accepts its draft at depth (1-based) after the ones before. */
double moeq_mtp_auto_step_cost(const moeq_mtp_auto *a, int tokens);
/* ... and a draft pass over `seqs` sequences (the draft table once a draft was timed apart). */
double moeq_mtp_auto_draft_cost(const moeq_mtp_auto *a, int seqs);
double moeq_mtp_auto_acceptance(const moeq_mtp_auto *a, const moeq_mtp_depths *depths, int depth);

#endif
