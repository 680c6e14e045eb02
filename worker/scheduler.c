/*
 * scheduler.c — continuous batching policy (see scheduler.h).
 *
 * Jobs live in a pool of individually allocated records addressed by an int
 * handle (stable pointers, free list). Pending jobs, the finished queue and
 * the ackable-batch queue are intrusive FIFO lists through the records.
 * Nothing here touches the engine, the network or a clock.
 *
 * Speculative jobs (mtp_k > 0) go through the same job_take_token as plain
 * ones, one token at a time, so stop ids, stop strings and max_new_tokens cut
 * a multi-token round exactly where single-token decoding would stop.
 */
#include "scheduler.h"
#include "mtp_auto.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHED_PRIORITIES 4

typedef enum job_state {
    JOB_FREE = 0,
    JOB_PENDING,    /* waiting for a slot                          */
    JOB_RUNNING,    /* holds a slot                                */
    JOB_FINISHED,   /* result fixed, in the finished queue         */
    JOB_PUBLISHING, /* handed out, waiting for moeq_sched_delivered */
} job_state;

typedef struct sched_batch {
    void *user;
    size_t n_jobs, n_delivered;
    int next;       /* ackable queue / free list */
    int in_use;
} sched_batch;

typedef struct sched_job {
    job_state state;
    int next;                 /* pending / finished queue link, free list */
    int batch;
    uint64_t seq;             /* arrival order                            */
    uint64_t admit_seq;       /* admission order                          */
    char *key;
    void *user;
    int priority;
    int32_t *prompt;
    int n_prompt, n_fed;      /* prompt tokens fed to the engine so far   */
    int max_new_tokens;
    int nonfinite_layer;      /* where the engine first saw NaN/inf (the message), -1 unknown */
    int complete_at;          /* structured output complete after this many tokens; 0 = not yet */
    const char *fail_code;    /* noted before a commit: the job ends there with this error (static) */
    char fail_message[160];
    int32_t *stop_token_ids;  /* the job's own stop ids                    */
    size_t n_stop_token_ids;
    int64_t deadline_ms;
    char **stop;
    size_t n_stop, max_stop_len;
    int cancel;
    int slot;
    int64_t reserve;          /* KV tokens reserved while running          */
    int32_t *out;             /* generated ids, cap max_new_tokens          */
    int n_out;
    int32_t last;             /* the last sampled token, fed next step      */
    int mtp_k;                /* drafts per speculative round; 0 = plain    */
    int admitted;             /* held a slot at some point                  */
    int64_t mtp_drafted, mtp_accepted;
    int mtp_win_drafted, mtp_win_accepted; /* since the last acceptance verdict          */
    uint64_t first_plan;                   /* the plan that gave it a sequence          */
    int mtp_pause_until;                   /* no rounds while n_out is below this        */
    int mtp_backoff;                       /* the next pause's length, tokens            */
    moeq_mtp_depths depths;                /* mtp_auto: its acceptance by draft depth    */
    int auto_k;                            /* mtp_auto: drafts chosen for this plan      */
    char *text;
    size_t text_len, text_cap;
    moeq_result_status status;
    moeq_finish_reason reason;
    char *error_code, *error_message;
    int64_t added_ms, admitted_ms, first_token_ms, finished_ms;
} sched_job;

typedef struct job_queue {
    int head, tail;
} job_queue;

struct moeq_sched {
    moeq_sched_params params;
    int32_t *stop_ids;
    moeq_sched_detok_fn detok;
    void *ctx;

    sched_job **jobs;
    int n_jobs_cap, job_free;
    sched_batch *batches;
    int n_batches_cap, batch_free;
    uint64_t next_seq, next_admit_seq;

    job_queue pending, finished;
    int ackable_head, ackable_tail;

    int *slots;               /* job handle per slot, -1 free              */
    int *released;
    int n_released;
    int *order;               /* scratch for compose                        */
    moeq_sched_item *items;   /* 2 * max_seqs: decode + prefill items       */
    int n_items;
    moeq_sched_round *rounds; /* max_seqs: speculative rounds of the plan   */
    int n_rounds;
    int plan_open;

    int n_running, n_pending, n_unpublished, n_batches;
    int64_t kv_reserved;
    int64_t prefill_tokens, decode_tokens, jobs_finished, prefix_tokens_shared, prefix_tokens_cached;
    moeq_sched_prefix_fn prefix_fn;
    void *prefix_ctx;
    moeq_sched_kv kv;           /* the engine's blocks; kv.pool NULL: whole lengths reserved   */
    int64_t kv_held_promised;   /* with kv: tokens of blocks held or promised, at the last admit */
    int running_max;
    uint64_t plans;             /* compose calls                                          */
    int64_t mtp_rounds, mtp_drafted, mtp_accepted;
    moeq_mtp_auto *mtp_auto;    /* params.mtp_auto: drafts per round chosen each plan          */
    moeq_mtp_auto_job *auto_jobs; /* max_seqs: scratch for the choice                          */
    int plan_main_tokens;       /* the open plan's main step: tokens, and sequences drafting  */
    int plan_passes[MOEQ_MTP_AUTO_MAX_K]; /* at each depth (for the step's time)              */
};

moeq_sched_params moeq_sched_default_params(void) {
    moeq_sched_params p = {0};
    p.max_seqs = 64;
    p.max_step_tokens = 2048;
    p.kv_cache_tokens = 0;
    p.kv_block_tokens = 16;
    return p;
}

/* ---- queues -------------------------------------------------------------- */

static void queue_push(moeq_sched *sched, job_queue *q, int h) {
    sched->jobs[h]->next = -1;
    if (q->tail < 0) q->head = h;
    else sched->jobs[q->tail]->next = h;
    q->tail = h;
}

static int queue_pop(moeq_sched *sched, job_queue *q) {
    int h = q->head;
    if (h < 0) return -1;
    q->head = sched->jobs[h]->next;
    if (q->head < 0) q->tail = -1;
    return h;
}

/* Remove h from q given its predecessor (-1 = head). */
static void queue_unlink(moeq_sched *sched, job_queue *q, int prev, int h) {
    int next = sched->jobs[h]->next;
    if (prev < 0) q->head = next;
    else sched->jobs[prev]->next = next;
    if (q->tail == h) q->tail = prev;
}

/* ---- lifecycle ------------------------------------------------------------ */

moeq_err moeq_sched_new(const moeq_sched_params *params, moeq_sched_detok_fn detok, void *ctx,
                        moeq_sched **out, char *errstr, size_t errstr_size) {
    if (!params || !out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "NULL argument");
    *out = NULL;
    if (params->max_seqs < 1 || params->max_seqs > 4096)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "max_seqs: %d is outside [1, 4096]",
                         params->max_seqs);
    if (params->max_step_tokens < params->max_seqs)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "max_step_tokens: %d is below max_seqs %d (every running sequence decodes each step)",
                         params->max_step_tokens, params->max_seqs);
    if (params->kv_block_tokens < 1 || params->kv_cache_tokens < 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "kv_block_tokens/kv_cache_tokens out of range");
    if (!(params->mtp_min_acceptance >= 0 && params->mtp_min_acceptance <= 1))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "mtp_min_acceptance: %g is outside [0, 1]",
                         params->mtp_min_acceptance);
    if (params->prefix_share_min < 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "prefix_share_min: %d is negative (0 = off)",
                         params->prefix_share_min);
    if (params->mtp_max_seqs < 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "mtp_max_seqs: %d is negative (0 = no limit)",
                         params->mtp_max_seqs);
    if (params->mtp_auto && !(params->mtp_draft_share >= 0 && params->mtp_draft_share <= 1))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "mtp_draft_share: %g is outside [0, 1]",
                         params->mtp_draft_share);
    if (params->n_stop_ids < 0 || (params->n_stop_ids > 0 && !params->stop_ids))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "stop_ids: %d ids but no array",
                         params->n_stop_ids);
    moeq_sched *s = calloc(1, sizeof *s);
    if (!s) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "scheduler");
    s->params = *params;
    s->detok = detok;
    s->ctx = ctx;
    s->job_free = s->batch_free = -1;
    s->pending.head = s->pending.tail = s->finished.head = s->finished.tail = -1;
    s->ackable_head = s->ackable_tail = -1;
    int n = params->max_seqs;
    s->slots = malloc(sizeof *s->slots * n);
    s->released = malloc(sizeof *s->released * n);
    s->order = malloc(sizeof *s->order * n);
    s->items = calloc(2 * (size_t)n, sizeof *s->items);
    s->rounds = calloc((size_t)n, sizeof *s->rounds);
    s->stop_ids = malloc(sizeof *s->stop_ids * (params->n_stop_ids + 1));
    if (!s->slots || !s->released || !s->order || !s->items || !s->rounds || !s->stop_ids) {
        moeq_sched_destroy(s);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "scheduler slots");
    }
    for (int i = 0; i < n; i++) s->slots[i] = -1;
    if (params->mtp_auto) {
        moeq_err e = moeq_mtp_auto_new(params->max_step_tokens, params->mtp_draft_share, &s->mtp_auto, errstr,
                                       errstr_size);
        s->auto_jobs = calloc((size_t)n, sizeof *s->auto_jobs);
        if (e || !s->auto_jobs) {
            moeq_sched_destroy(s);
            return e ? e : moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "scheduler: mtp auto");
        }
    }
    if (params->n_stop_ids) memcpy(s->stop_ids, params->stop_ids, sizeof *s->stop_ids * params->n_stop_ids);
    s->params.stop_ids = s->stop_ids;
    *out = s;
    return MOEQ_OK;
}

static void job_release(sched_job *job) {
    free(job->key);
    free(job->prompt);
    for (size_t i = 0; i < job->n_stop; i++) free(job->stop[i]);
    free(job->stop);
    free(job->out);
    free(job->stop_token_ids);
    free(job->text);
    free(job->error_code);
    free(job->error_message);
    memset(job, 0, sizeof *job);
}

void moeq_sched_destroy(moeq_sched *sched) {
    if (!sched) return;
    for (int i = 0; i < sched->n_jobs_cap; i++) {
        if (!sched->jobs[i]) continue;
        job_release(sched->jobs[i]);
        free(sched->jobs[i]);
    }
    free(sched->jobs);
    free(sched->batches);
    free(sched->slots);
    free(sched->released);
    free(sched->order);
    free(sched->items);
    free(sched->rounds);
    free(sched->stop_ids);
    moeq_mtp_auto_destroy(sched->mtp_auto);
    free(sched->auto_jobs);
    free(sched);
}

/* ---- pools ---------------------------------------------------------------- */

static int job_alloc(moeq_sched *sched) {
    if (sched->job_free < 0) {
        int cap = sched->n_jobs_cap ? sched->n_jobs_cap * 2 : 64;
        sched_job **jobs = realloc(sched->jobs, sizeof *jobs * cap);
        if (!jobs) return -1;
        sched->jobs = jobs;
        for (int i = sched->n_jobs_cap; i < cap; i++) jobs[i] = NULL;
        for (int i = cap - 1; i >= sched->n_jobs_cap; i--) {
            jobs[i] = calloc(1, sizeof **jobs);
            if (!jobs[i]) { /* keep what we got; they join the free list below */
                sched->n_jobs_cap = i;
                return -1;
            }
        }
        for (int i = cap - 1; i >= sched->n_jobs_cap; i--) {
            jobs[i]->next = sched->job_free;
            sched->job_free = i;
        }
        sched->n_jobs_cap = cap;
    }
    int h = sched->job_free;
    sched->job_free = sched->jobs[h]->next;
    return h;
}

static void job_free_handle(moeq_sched *sched, int h) {
    job_release(sched->jobs[h]);
    sched->jobs[h]->next = sched->job_free;
    sched->job_free = h;
}

static int batch_alloc(moeq_sched *sched) {
    if (sched->batch_free < 0) {
        int cap = sched->n_batches_cap ? sched->n_batches_cap * 2 : 16;
        sched_batch *b = realloc(sched->batches, sizeof *b * cap);
        if (!b) return -1;
        sched->batches = b;
        for (int i = cap - 1; i >= sched->n_batches_cap; i--) {
            memset(&b[i], 0, sizeof b[i]);
            b[i].next = sched->batch_free;
            sched->batch_free = i;
        }
        sched->n_batches_cap = cap;
    }
    int h = sched->batch_free;
    sched->batch_free = sched->batches[h].next;
    sched->batches[h].in_use = 1;
    sched->batches[h].next = -1;
    return h;
}

static void batch_push_ackable(moeq_sched *sched, int b) {
    sched->batches[b].next = -1;
    if (sched->ackable_tail < 0) sched->ackable_head = b;
    else sched->batches[sched->ackable_tail].next = b;
    sched->ackable_tail = b;
}

/* ---- adding jobs ----------------------------------------------------------- */

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static moeq_err job_fill(sched_job *job, const moeq_sched_job_spec *spec) {
    job->key = dup_str(spec->key);
    if (!job->key) return MOEQ_ERR_NOMEM;
    if (spec->n_prompt > 0) {
        job->prompt = malloc(sizeof *job->prompt * spec->n_prompt);
        if (!job->prompt) return MOEQ_ERR_NOMEM;
        memcpy(job->prompt, spec->prompt, sizeof *job->prompt * spec->n_prompt);
        job->n_prompt = spec->n_prompt;
    }
    if (spec->n_stop) {
        job->stop = calloc(spec->n_stop, sizeof *job->stop);
        if (!job->stop) return MOEQ_ERR_NOMEM;
        for (size_t i = 0; i < spec->n_stop; i++) {
            const char *st = spec->stop ? spec->stop[i] : NULL;
            if (!st || !*st) continue;
            job->stop[job->n_stop] = dup_str(st);
            if (!job->stop[job->n_stop]) return MOEQ_ERR_NOMEM;
            size_t len = strlen(st);
            if (len > job->max_stop_len) job->max_stop_len = len;
            job->n_stop++;
        }
    }
    if (spec->n_stop_token_ids) {
        job->stop_token_ids = malloc(sizeof *job->stop_token_ids * spec->n_stop_token_ids);
        if (!job->stop_token_ids) return MOEQ_ERR_NOMEM;
        memcpy(job->stop_token_ids, spec->stop_token_ids, sizeof *job->stop_token_ids * spec->n_stop_token_ids);
        job->n_stop_token_ids = spec->n_stop_token_ids;
    }
    int cap = spec->max_new_tokens > 0 ? spec->max_new_tokens : 1;
    job->out = malloc(sizeof *job->out * cap);
    job->text_cap = 256;
    job->text = malloc(job->text_cap);
    if (!job->out || !job->text) return MOEQ_ERR_NOMEM;
    job->text[0] = 0;
    job->user = spec->user;
    job->priority = spec->priority < 0 ? 0 : spec->priority >= SCHED_PRIORITIES ? SCHED_PRIORITIES - 1 : spec->priority;
    job->max_new_tokens = spec->max_new_tokens < 0 ? 0 : spec->max_new_tokens;
    job->deadline_ms = spec->deadline_ms;
    job->mtp_k = spec->mtp_k;
    job->slot = -1;
    job->nonfinite_layer = -1;
    return MOEQ_OK;
}

static void job_finish(moeq_sched *sched, int h, moeq_result_status status, moeq_finish_reason reason,
                       const char *code, const char *message, int64_t now_ms);
static int text_append(sched_job *job, const char *bytes, size_t n);

/* Prompt + max_new_tokens past the context: rejected as OpenAI and vLLM do, never silently clamped. */
static int too_long(const moeq_sched *sched, const sched_job *job) {
    return sched->params.max_model_len > 0 &&
           (int64_t)job->n_prompt + job->max_new_tokens > sched->params.max_model_len;
}

moeq_err moeq_sched_add_batch(moeq_sched *sched, void *batch_user, const moeq_sched_job_spec *jobs, size_t n_jobs,
                              int64_t now_ms, char *errstr, size_t errstr_size) {
    if (!sched || (n_jobs && !jobs)) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "NULL argument");
    for (size_t i = 0; i < n_jobs; i++) {
        if (!jobs[i].key || !*jobs[i].key || (jobs[i].n_prompt > 0 && !jobs[i].prompt))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "jobs[%zu]: missing key or prompt", i);
        if (jobs[i].mtp_k < 0 || jobs[i].mtp_k > MOEQ_SCHED_MAX_MTP_K)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "jobs[%zu]: mtp_k %d is outside [0, %d]", i,
                             jobs[i].mtp_k, MOEQ_SCHED_MAX_MTP_K);
    }
    int b = batch_alloc(sched);
    if (b < 0) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "batch");
    int *handles = malloc(sizeof *handles * (n_jobs + 1));
    if (!handles) goto nomem_batch;
    size_t got = 0;
    for (; got < n_jobs; got++) {
        int h = job_alloc(sched);
        if (h < 0) goto nomem_jobs;
        handles[got] = h;
        sched_job *job = sched->jobs[h];
        job->state = JOB_PENDING; /* so a failed fill is released below */
        if (job_fill(job, &jobs[got])) {
            got++;
            goto nomem_jobs;
        }
    }
    sched_batch *batch = &sched->batches[b];
    batch->user = batch_user;
    batch->n_jobs = n_jobs;
    batch->n_delivered = 0;
    sched->n_batches++;
    for (size_t i = 0; i < n_jobs; i++) {
        int h = handles[i];
        sched_job *job = sched->jobs[h];
        job->batch = b;
        job->seq = sched->next_seq++;
        job->added_ms = now_ms;
        job->state = JOB_PENDING;
        sched->n_pending++;
        queue_push(sched, &sched->pending, h);
        if (jobs[i].error_code) {
            job_finish(sched, h, MOEQ_RESULT_ERROR, MOEQ_FINISH_NONE, jobs[i].error_code, jobs[i].error_message,
                       now_ms);
        } else if (jobs[i].cancelled) {
            job_finish(sched, h, MOEQ_RESULT_CANCELLED, MOEQ_FINISH_CANCELLED, MOEQ_CODE_CANCELLED,
                       "cancelled before it ran", now_ms);
        } else if (job->n_prompt < 1) {
            job_finish(sched, h, MOEQ_RESULT_ERROR, MOEQ_FINISH_NONE, MOEQ_CODE_INVALID_VALUE, "job has an empty prompt",
                       now_ms);
        } else if (too_long(sched, job)) {
            char why[160];
            snprintf(why, sizeof why, "prompt of %d tokens + max_new_tokens %d exceeds the model's context of %d tokens",
                     job->n_prompt, job->max_new_tokens, sched->params.max_model_len);
            job_finish(sched, h, MOEQ_RESULT_ERROR, MOEQ_FINISH_NONE, MOEQ_CODE_PROMPT_TOO_LONG, why, now_ms);
        } else if (job->max_new_tokens == 0) {
            job_finish(sched, h, MOEQ_RESULT_OK, MOEQ_FINISH_LENGTH, NULL, NULL, now_ms);
        }
    }
    if (n_jobs == 0) batch_push_ackable(sched, b);
    free(handles);
    return MOEQ_OK;

nomem_jobs:
    for (size_t i = 0; i < got; i++) job_free_handle(sched, handles[i]);
    free(handles);
nomem_batch:
    sched->batches[b].in_use = 0;
    sched->batches[b].next = sched->batch_free;
    sched->batch_free = b;
    return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "batch of %zu jobs", n_jobs);
}

int moeq_sched_free_capacity(const moeq_sched *sched) {
    return sched->params.max_seqs - sched->n_running - sched->n_pending;
}

moeq_err moeq_sched_cancel(moeq_sched *sched, const char *key) {
    if (!sched || !key) return MOEQ_ERR_INVALID_ARG;
    for (int i = 0; i < sched->n_jobs_cap; i++) {
        sched_job *job = sched->jobs[i];
        if ((job->state == JOB_PENDING || job->state == JOB_RUNNING) && strcmp(job->key, key) == 0) {
            job->cancel = 1;
            return MOEQ_OK;
        }
    }
    return MOEQ_ERR_NOT_FOUND;
}

/* ---- finishing -------------------------------------------------------------- */

static void slot_release(moeq_sched *sched, sched_job *job) {
    if (job->slot < 0) return;
    sched->slots[job->slot] = -1;
    sched->released[sched->n_released++] = job->slot;
    sched->kv_reserved -= job->reserve;
    job->reserve = 0;
    job->slot = -1;
    sched->n_running--;
}

/* Fix the job's result: leave pending/running, free its slot, queue it for publishing. */
static void job_finish(moeq_sched *sched, int h, moeq_result_status status, moeq_finish_reason reason,
                       const char *code, const char *message, int64_t now_ms) {
    sched_job *job = sched->jobs[h];
    if (job->state == JOB_PENDING) {
        int prev = -1;
        for (int cur = sched->pending.head; cur >= 0 && cur != h; cur = sched->jobs[cur]->next) prev = cur;
        queue_unlink(sched, &sched->pending, prev, h);
        sched->n_pending--;
    } else {
        assert(job->state == JOB_RUNNING);
        slot_release(sched, job);
        if (sched->detok && (reason != MOEQ_FINISH_STOP || (job->complete_at > 0 && job->n_out >= job->complete_at))) {
            /* a stop string fixed the text; a completed grammar did not */
            const char *bytes = NULL;
            size_t n = sched->detok(sched->ctx, job->user, MOEQ_SCHED_DETOK_FLUSH, &bytes);
            if (n && bytes) text_append(job, bytes, n);
        }
    }
    job->state = JOB_FINISHED;
    job->status = status;
    job->reason = reason;
    job->finished_ms = now_ms;
    if (code) job->error_code = dup_str(code);
    if (message) job->error_message = dup_str(message);
    sched->n_unpublished++;
    sched->jobs_finished++;
    queue_push(sched, &sched->finished, h);
}

/* Cancelled and expired jobs, pending or running, finish now. */
static void retire(moeq_sched *sched, int64_t now_ms) {
    for (int i = 0; i < sched->n_jobs_cap; i++) {
        sched_job *job = sched->jobs[i];
        if (job->state != JOB_PENDING && job->state != JOB_RUNNING) continue;
        if (job->cancel)
            job_finish(sched, i, MOEQ_RESULT_CANCELLED, MOEQ_FINISH_CANCELLED, MOEQ_CODE_CANCELLED, "cancelled",
                       now_ms);
        else if (job->deadline_ms > 0 && now_ms >= job->deadline_ms)
            job_finish(sched, i, MOEQ_RESULT_EXPIRED, MOEQ_FINISH_DEADLINE, MOEQ_CODE_DEADLINE, "deadline_ms passed",
                       now_ms);
    }
}

/* ---- admission and planning -------------------------------------------------- */

static int64_t job_reserve(const moeq_sched *sched, const sched_job *job) {
    int64_t need = (int64_t)job->n_prompt + job->max_new_tokens;
    int64_t blk = sched->params.kv_block_tokens;
    return (need + blk - 1) / blk * blk;
}

/* The pending job to admit next: lowest priority number, then earliest arrival. */
static int pending_best(const moeq_sched *sched, int *prev_out) {
    int best = -1, best_prev = -1, prev = -1;
    for (int cur = sched->pending.head; cur >= 0; prev = cur, cur = sched->jobs[cur]->next) {
        const sched_job *j = sched->jobs[cur];
        if (best < 0 || j->priority < sched->jobs[best]->priority ||
            (j->priority == sched->jobs[best]->priority && j->seq < sched->jobs[best]->seq)) {
            best = cur;
            best_prev = prev;
        }
    }
    *prev_out = best_prev;
    return best;
}

/*
 * With the engine's blocks (moeq_sched_kv): the blocks job may still take from a pool (mtp = 1: its MTP entries,
 * which run up to mtp_k + 1 past the main ones), one more for a speculative job (a rollback into a block another
 * sequence holds copies it). An open sequence asks the engine, so blocks it shares count nothing; a job not yet
 * fed (or whose sequence the engine does not know) counts its whole length less the prompt blocks live sequences
 * hold now: its first chunk takes at least those (a prefix-cache hit takes every block found, a fork more).
 */
static int64_t kv_blocks_promised(const moeq_sched *sched, const sched_job *job, int mtp) {
    int64_t blk = sched->params.kv_block_tokens;
    int64_t final = (int64_t)job->n_prompt + job->max_new_tokens + (mtp ? job->mtp_k + 1 : 0);
    int64_t grow = -1;
    if (job->state == JOB_RUNNING && job->n_fed > 0 && job->first_plan < sched->plans)
        grow = sched->kv.to_grow(sched->kv.ctx, job->slot, mtp, final);
    if (grow < 0) {
        grow = (final + blk - 1) / blk;
        if (sched->kv.held && sched->prefix_fn)
            grow -= sched->kv.held(sched->kv.ctx, job->prompt, job->n_prompt, job->mtp_k > 0);
        if (grow < 0) grow = 0;
    }
    return grow + (job->mtp_k > 0);
}

typedef struct kv_room {
    int64_t takeable[2], total[2], promised[2];
} kv_room;

/* What the pools can give now and what running jobs may still take from them. */
static void kv_room_measure(moeq_sched *sched, kv_room *r) {
    for (int mtp = 0; mtp < 2; mtp++) {
        sched->kv.pool(sched->kv.ctx, mtp, &r->takeable[mtp], &r->total[mtp]);
        r->promised[mtp] = 0;
    }
    for (int s = 0; s < sched->params.max_seqs; s++) {
        if (sched->slots[s] < 0) continue;
        const sched_job *job = sched->jobs[sched->slots[s]];
        r->promised[0] += kv_blocks_promised(sched, job, 0);
        if (job->mtp_k > 0) r->promised[1] += kv_blocks_promised(sched, job, 1);
    }
}

/* Does job fit beside the running ones (then its blocks are promised)? */
static int kv_room_take(moeq_sched *sched, kv_room *r, const sched_job *job) {
    int64_t need[2] = {kv_blocks_promised(sched, job, 0), job->mtp_k > 0 ? kv_blocks_promised(sched, job, 1) : 0};
    int alone = sched->n_running == 0; /* the pool is its own: never wait on a block of slack */
    for (int mtp = 0; mtp < 2; mtp++) /* (no MTP pool: the engine decodes such a job plainly) */
        if (need[mtp] > 0 && r->total[mtp] > 0 && !alone && r->promised[mtp] + need[mtp] > r->takeable[mtp]) return 0;
    for (int mtp = 0; mtp < 2; mtp++) r->promised[mtp] += need[mtp];
    return 1;
}

static void admit(moeq_sched *sched, int64_t now_ms) {
    int64_t cap = sched->params.kv_cache_tokens;
    kv_room room;
    int by_blocks = sched->kv.pool != NULL;
    if (by_blocks) kv_room_measure(sched, &room);
    while (sched->n_running < sched->params.max_seqs && sched->n_pending > 0) {
        int prev, h = pending_best(sched, &prev);
        sched_job *job = sched->jobs[h];
        int64_t reserve = job_reserve(sched, job);
        if (cap > 0 && reserve > cap) {
            job_finish(sched, h, MOEQ_RESULT_ERROR, MOEQ_FINISH_NONE, MOEQ_CODE_PROMPT_TOO_LONG,
                       "prompt + max_new_tokens exceeds this worker's KV cache capacity (kv_cache_tokens)", now_ms);
            continue;
        }
        if (by_blocks ? !kv_room_take(sched, &room, job) : cap > 0 && sched->kv_reserved + reserve > cap)
            break; /* wait: head of line keeps its turn */
        queue_unlink(sched, &sched->pending, prev, h);
        sched->n_pending--;
        int slot = 0;
        while (sched->slots[slot] >= 0) slot++;
        sched->slots[slot] = h;
        job->slot = slot;
        job->state = JOB_RUNNING;
        job->reserve = reserve;
        job->admitted_ms = now_ms;
        job->admitted = 1;
        job->admit_seq = sched->next_admit_seq++;
        job->n_fed = 0;
        sched->kv_reserved += reserve;
        sched->n_running++;
        if (sched->n_running > sched->running_max) sched->running_max = sched->n_running;
    }
    if (by_blocks) /* held by sequences (cached blocks aside) plus promised, in tokens */
        sched->kv_held_promised =
            (room.total[0] - room.takeable[0] + room.promised[0]) * sched->params.kv_block_tokens;
}

/* Running slots ordered by admission (oldest first), into order[]; returns the count. */
static int slots_by_age(const moeq_sched *sched, int *order) {
    int n = 0;
    for (int s = 0; s < sched->params.max_seqs; s++) {
        if (sched->slots[s] < 0) continue;
        int i = n++;
        uint64_t seq = sched->jobs[sched->slots[s]]->admit_seq;
        while (i > 0 && sched->jobs[sched->slots[order[i - 1]]]->admit_seq > seq) {
            order[i] = order[i - 1];
            i--;
        }
        order[i] = s;
    }
    return n;
}

/*
 * Drafts for a speculative job's next round: its mtp_k, at most one less than
 * the tokens it may still produce (a round yields up to k + 1), and no more
 * than the step's draft budget. 0: decode it plainly.
 */
static int round_k(const moeq_sched *sched, const sched_job *job, int draft_budget) {
    if (job->n_out < job->mtp_pause_until) return 0;
    int k = sched->mtp_auto ? job->auto_k : job->mtp_k, left = job->max_new_tokens - job->n_out;
    if (k > left - 1) k = left - 1;
    if (k > draft_budget) k = draft_budget;
    return k > 0 ? k : 0;
}

/* A decode of a job past its prompt: a round when it drafts, else one token in the step. Returns 1 for a round. */
static int compose_round(moeq_sched *sched, int h, int *draft_budget, moeq_sched_step *plan) {
    sched_job *job = sched->jobs[h];
    int k = round_k(sched, job, *draft_budget);
    if (k == 0) return 0;
    sched->rounds[sched->n_rounds++] =
        (moeq_sched_round){.slot = job->slot, .job = h, .user = job->user, .next_token = job->last, .k = k};
    *draft_budget -= k;
    plan->n_round_tokens += k + 1;
    return 1;
}

/*
 * The running job whose sequence holds the longest start of job's prompt: its slot, and in *n how many of
 * those tokens job can take by forking it; -1 when none reaches prefix_share_min. Only prompt tokens already
 * fed count (that is what the source's cache holds), never the job's last prompt token (its logits give the
 * first output), and for a speculative job one fewer: its MTP entry at the fork point reads the token after
 * it, so that token must be shared too (and the source must decode speculatively as well).
 */
static int shared_prefix(const moeq_sched *sched, const sched_job *job, const int *order, int n_order, int *n) {
    int best = -1;
    *n = 0;
    if (sched->params.prefix_share_min <= 0) return -1;
    for (int k = 0; k < n_order; k++) {
        const sched_job *src = sched->jobs[sched->slots[order[k]]];
        if (src == job || src->n_fed == 0 || src->first_plan == sched->plans) continue; /* no sequence yet */
        if (job->mtp_k > 0 && src->mtp_k <= 0) continue;
        int lim = src->n_fed < job->n_prompt - 1 ? src->n_fed : job->n_prompt - 1, l = 0;
        while (l < lim && src->prompt[l] == job->prompt[l]) l++;
        if (job->mtp_k > 0 && l > 0) l--; /* tokens 0..l-1 equal: fork at l-1, whose next token is shared */
        if (l > *n) *n = l, best = src->slot;
    }
    if (*n < sched->params.prefix_share_min) *n = 0, best = -1;
    return best;
}

/* Prompt tokens the prefix cache holds for job (never its last one: its logits give the first output). */
static int cached_prefix(const moeq_sched *sched, const sched_job *job) {
    if (!sched->prefix_fn || job->n_prompt < 2) return 0;
    int n = sched->prefix_fn(sched->prefix_ctx, job->prompt, job->n_prompt, job->mtp_k > 0);
    return n > 0 && n < job->n_prompt ? n : 0;
}

void moeq_sched_set_kv(moeq_sched *sched, const moeq_sched_kv *kv) {
    if (!sched) return;
    sched->kv = kv && kv->pool && kv->to_grow ? *kv : (moeq_sched_kv){0};
}

void moeq_sched_set_prefix_lookup(moeq_sched *sched, moeq_sched_prefix_fn fn, void *ctx) {
    sched->prefix_fn = fn;
    sched->prefix_ctx = ctx;
}

/*
 * mtp_auto: each speculative job's drafts for this plan (job->auto_k), from its acceptance by depth and the
 * measured cost of steps (mtp_auto.h). The step's tokens without drafts are every decoding sequence's plus
 * the prompts' waiting tokens that fit; drafts only take room those leave (a draft in a prompt token's place
 * yields less than the token it displaces). Returns the drafts' budget.
 */
static int choose_drafts(moeq_sched *sched, const int *order_buf, int n_order, int n_decoding, int room) {
    int64_t waiting = 0;
    int n = 0;
    for (int k = 0; k < n_order; k++) {
        sched_job *job = sched->jobs[sched->slots[order_buf[k]]];
        job->auto_k = 0;
        if (job->n_fed < job->n_prompt) {
            waiting += job->n_prompt - job->n_fed;
            continue;
        }
        if (job->mtp_k <= 0) continue;
        int k_max = job->mtp_k, left = job->max_new_tokens - job->n_out;
        if (k_max > left - 1) k_max = left - 1;
        sched->auto_jobs[n++] = (moeq_mtp_auto_job){.depths = &job->depths, .k_max = k_max};
    }
    int fed = waiting < room ? (int)waiting : room;
    int free_tokens = room - fed;
    moeq_mtp_auto_choose(sched->mtp_auto, sched->auto_jobs, n, n_decoding + fed, free_tokens);
    n = 0;
    for (int k = 0; k < n_order; k++) {
        sched_job *job = sched->jobs[sched->slots[order_buf[k]]];
        if (job->n_fed >= job->n_prompt && job->mtp_k > 0) job->auto_k = sched->auto_jobs[n++].k;
    }
    return free_tokens;
}

/*
 * One plan = one engine step: decode tokens, round tokens and prefill chunks together fit max_step_tokens
 * (the worker runs rounds and ordinary items in one verify step). Every decoding sequence gets its token
 * first; drafts take from what is left, oldest sequence first (at most half of it while a prompt waits);
 * prefill chunks take the rest.
 */
static void compose(moeq_sched *sched, moeq_sched_step *plan) {
    int n = 0, n_decoding = 0;
    int *order_buf = sched->order;
    int n_order = slots_by_age(sched, order_buf);
    sched->n_rounds = 0;
    int prefill_pending = 0;
    for (int k = 0; k < n_order; k++) {
        const sched_job *job = sched->jobs[sched->slots[order_buf[k]]];
        n_decoding += job->n_fed >= job->n_prompt;
        prefill_pending |= job->n_fed < job->n_prompt;
    }
    /* Too many decoding for rounds to pay: every sequence decodes one token (marked sequences stay marked and
     * resume rounds when the batch shrinks; the output is the same either way). */
    int rounds_on = sched->params.mtp_max_seqs <= 0 || n_decoding <= sched->params.mtp_max_seqs;
    int room = sched->params.max_step_tokens - n_decoding; /* >= 0: n_decoding <= max_seqs <= max_step_tokens */
    int draft_budget = prefill_pending ? room / 2 : room; /* drafts never starve a waiting prompt */
    if (sched->mtp_auto && rounds_on) draft_budget = choose_drafts(sched, order_buf, n_order, n_decoding, room);
    for (int k = 0; k < n_order; k++) { /* decode: one token per sequence past its prompt */
        int h = sched->slots[order_buf[k]];
        sched_job *job = sched->jobs[h];
        if (job->n_fed < job->n_prompt) continue;
        if (rounds_on && compose_round(sched, h, &draft_budget, plan)) continue;
        moeq_sched_item *it = &sched->items[n++];
        *it = (moeq_sched_item){.slot = job->slot, .new_seq = 0, .tokens = &job->last, .n_tokens = 1,
                                .sample = 1, .job = h, .user = job->user, .mtp = job->mtp_k > 0};
        plan->n_decode_tokens++;
    }
    int budget = room - (plan->n_round_tokens - sched->n_rounds); /* what decode tokens and drafts left */
    for (int k = 0; k < n_order && budget > 0; k++) { /* prefill chunks, oldest admission first */
        int h = sched->slots[order_buf[k]];
        sched_job *job = sched->jobs[h];
        if (job->n_fed >= job->n_prompt) continue;
        int new_seq = job->n_fed == 0, fork_slot = -1, fork_tokens = 0, cached = 0;
        if (new_seq) {
            job->first_plan = sched->plans;
            fork_slot = shared_prefix(sched, job, order_buf, n_order, &fork_tokens);
            cached = cached_prefix(sched, job);
            if (cached > 0 && cached >= fork_tokens) fork_slot = -1, fork_tokens = 0;
            else cached = 0;
            job->n_fed = fork_tokens + cached; /* the fork or the cache holds them */
            sched->prefix_tokens_shared += fork_tokens;
            sched->prefix_tokens_cached += cached;
        }
        int chunk = job->n_prompt - job->n_fed;
        if (chunk > budget) chunk = budget;
        moeq_sched_item *it = &sched->items[n++];
        *it = (moeq_sched_item){.slot = job->slot, .new_seq = new_seq, .tokens = job->prompt + job->n_fed,
                                .n_tokens = chunk, .sample = job->n_fed + chunk == job->n_prompt, .job = h,
                                .user = job->user, .mtp = job->mtp_k > 0, .fork_slot = fork_slot,
                                .fork_tokens = fork_tokens, .cached_tokens = cached};
        plan->n_prefill_tokens += chunk;
        budget -= chunk;
    }
    sched->plans++;
    sched->n_items = n;
    plan->items = sched->items;
    plan->n_items = n;
    plan->n_tokens = plan->n_prefill_tokens + plan->n_decode_tokens;
    plan->rounds = sched->rounds;
    plan->n_rounds = sched->n_rounds;
    sched->plan_main_tokens = plan->n_tokens + plan->n_round_tokens;
    for (int j = 0; j < MOEQ_MTP_AUTO_MAX_K; j++) {
        sched->plan_passes[j] = 0;
        for (int r = 0; r < sched->n_rounds; r++) sched->plan_passes[j] += sched->rounds[r].k > j;
    }
}

void moeq_sched_note_step_seconds(moeq_sched *sched, double seconds, double draft_seconds) {
    if (sched && sched->mtp_auto)
        moeq_mtp_auto_note_step(sched->mtp_auto, sched->plan_main_tokens, sched->plan_passes, MOEQ_MTP_AUTO_MAX_K,
                                seconds, draft_seconds);
}

moeq_err moeq_sched_plan(moeq_sched *sched, int64_t now_ms, moeq_sched_step *plan) {
    if (!sched || !plan) return MOEQ_ERR_INVALID_ARG;
    if (sched->plan_open) return MOEQ_ERR_INVALID_ARG;
    memset(plan, 0, sizeof *plan);
    retire(sched, now_ms);
    admit(sched, now_ms);
    compose(sched, plan);
    plan->released = sched->released;
    plan->n_released = sched->n_released;
    sched->n_released = 0; /* handed out; the array stays valid until the next plan (slots only refill in admit) */
    sched->plan_open = plan->n_items > 0 || plan->n_rounds > 0;
    return MOEQ_OK;
}

/* ---- committing ---------------------------------------------------------------- */

static int is_stop_id(const moeq_sched *sched, const sched_job *job, int32_t token) {
    for (int i = 0; i < sched->params.n_stop_ids; i++)
        if (sched->stop_ids[i] == token) return 1;
    for (size_t i = 0; i < job->n_stop_token_ids; i++)
        if (job->stop_token_ids[i] == token) return 1;
    return 0;
}

static int is_complete(const sched_job *job) { return job->complete_at > 0 && job->n_out >= job->complete_at; }

static int text_append(sched_job *job, const char *bytes, size_t n) {
    if (job->text_len + n + 1 > job->text_cap) {
        size_t cap = job->text_cap * 2;
        while (cap < job->text_len + n + 1) cap *= 2;
        char *t = realloc(job->text, cap);
        if (!t) return 0;
        job->text = t;
        job->text_cap = cap;
    }
    memcpy(job->text + job->text_len, bytes, n);
    job->text_len += n;
    job->text[job->text_len] = 0;
    return 1;
}

/*
 * Earliest stop-string match that ends in the bytes just appended (from
 * offset old_len). Returns the match start, or -1.
 */
static long stop_match(const sched_job *job, size_t old_len) {
    long best = -1;
    for (size_t i = 0; i < job->n_stop; i++) {
        size_t len = strlen(job->stop[i]);
        if (len > job->text_len) continue;
        size_t from = old_len + 1 > len ? old_len + 1 - len : 0;
        for (size_t p = from; p + len <= job->text_len; p++) {
            if (memcmp(job->text + p, job->stop[i], len) == 0) {
                if (best < 0 || (long)p < best) best = (long)p;
                break;
            }
        }
    }
    return best;
}

/* Account one sampled token; may finish the job. */
static void job_take_token(moeq_sched *sched, int h, int32_t token, int64_t now_ms) {
    sched_job *job = sched->jobs[h];
    if (job->fail_code) { /* the token was drawn after the failure: not part of the output */
        job_finish(sched, h, MOEQ_RESULT_ERROR, MOEQ_FINISH_ERROR, job->fail_code, job->fail_message, now_ms);
        return;
    }
    if (job->n_out == 0) job->first_token_ms = now_ms;
    job->out[job->n_out++] = token;
    job->last = token;
    if (is_stop_id(sched, job, token)) {
        job_finish(sched, h, MOEQ_RESULT_OK, is_complete(job) ? MOEQ_FINISH_STOP : MOEQ_FINISH_STOP_TOKEN, NULL, NULL,
                   now_ms);
        return;
    }
    if (sched->detok) {
        const char *bytes = NULL;
        size_t n = sched->detok(sched->ctx, job->user, token, &bytes);
        size_t old_len = job->text_len;
        if (n && bytes && !text_append(job, bytes, n)) {
            job_finish(sched, h, MOEQ_RESULT_ERROR, MOEQ_FINISH_ERROR, MOEQ_CODE_INTERNAL, "out of memory for the text",
                       now_ms);
            return;
        }
        if (job->n_stop) {
            long at = stop_match(job, old_len);
            if (at >= 0) {
                job->text_len = (size_t)at;
                job->text[at] = 0;
                job_finish(sched, h, MOEQ_RESULT_OK, MOEQ_FINISH_STOP, NULL, NULL, now_ms);
                return;
            }
        }
    }
    if (is_complete(job)) job_finish(sched, h, MOEQ_RESULT_OK, MOEQ_FINISH_STOP, NULL, NULL, now_ms);
    else if (job->n_out >= job->max_new_tokens)
        job_finish(sched, h, MOEQ_RESULT_OK, MOEQ_FINISH_LENGTH, NULL, NULL, now_ms);
}

/* Round i's outcome is usable: 1..k+1 tokens, counts within the round. */
static int round_out_ok(const moeq_sched_round *r, const moeq_sched_round_out *o) {
    if (o->n_tokens == 0) return 1; /* numerical error */
    return o->tokens && o->n_tokens >= 1 && o->n_tokens <= r->k + 1 && o->drafted >= 0 && o->accepted >= 0 &&
           o->accepted <= o->drafted;
}

/* The job's logits held NaN/inf: it cannot go on; its batch-mates are not affected (batch invariance). */
static void job_numerical_error(moeq_sched *sched, int h, int64_t now_ms) {
    sched_job *job = sched->jobs[h];
    char why[256], where[64] = "";
    if (job->nonfinite_layer >= 0)
        snprintf(where, sizeof where, "; first seen by the router of layer %d", job->nonfinite_layer);
    snprintf(why, sizeof why,
             "non-finite logits (NaN or inf) after %d generated tokens%s: the model's weights hold non-finite or "
             "overflowing values (moeq model-info --check-weights)",
             job->n_out, where);
    job_finish(sched, h, MOEQ_RESULT_ERROR, MOEQ_FINISH_ERROR, MOEQ_CODE_NUMERICAL_ERROR, why, now_ms);
}

#define MTP_PAUSE_MIN 32   /* tokens decoded plainly after a window of poor acceptance */
#define MTP_PAUSE_MAX 1024 /* ... doubling while acceptance stays poor                  */

/*
 * Drafting pays only when enough drafts are accepted: a draft costs the MTP layer's share of a step (its block
 * and head), so an MTP layer that was not trained for this model, or a job sampled at a high temperature
 * (exact mode keeps a draft only when the sample equals it), would make every round a loss. After each
 * MOEQ_SCHED_MTP_WINDOW drafts of a job: below mtp_min_acceptance it decodes plainly for a while (the output
 * is the same), then drafts again to look; each poor window doubles the pause, a good one resets it.
 */
static void judge_acceptance(const moeq_sched *sched, sched_job *job, const moeq_sched_round_out *o) {
    if (sched->params.mtp_min_acceptance <= 0) return;
    job->mtp_win_drafted += o->drafted;
    job->mtp_win_accepted += o->accepted;
    if (job->mtp_win_drafted < MOEQ_SCHED_MTP_WINDOW) return;
    if (job->mtp_backoff < MTP_PAUSE_MIN) job->mtp_backoff = MTP_PAUSE_MIN;
    if (job->mtp_win_accepted < sched->params.mtp_min_acceptance * job->mtp_win_drafted) {
        job->mtp_pause_until = job->n_out + job->mtp_backoff;
        job->mtp_backoff = job->mtp_backoff * 2 > MTP_PAUSE_MAX ? MTP_PAUSE_MAX : job->mtp_backoff * 2;
    } else {
        job->mtp_backoff = MTP_PAUSE_MIN;
    }
    job->mtp_win_drafted = job->mtp_win_accepted = 0;
}

/* Take a round's tokens one by one until the job ends; the rest of the run is dropped. */
static void commit_round(moeq_sched *sched, const moeq_sched_round *r, const moeq_sched_round_out *o,
                         int64_t now_ms) {
    sched_job *job = sched->jobs[r->job];
    if (job->state != JOB_RUNNING) return; /* cannot happen within one plan; defensive */
    if (o->n_tokens == 0) {
        job_numerical_error(sched, r->job, now_ms);
        return;
    }
    job->mtp_drafted += o->drafted;
    job->mtp_accepted += o->accepted;
    if (sched->mtp_auto) moeq_mtp_auto_note_round(sched->mtp_auto, &job->depths, r->k, o->accepted);
    sched->mtp_rounds++;
    sched->mtp_drafted += o->drafted;
    sched->mtp_accepted += o->accepted;
    for (int t = 0; t < o->n_tokens && job->state == JOB_RUNNING; t++) {
        sched->decode_tokens++;
        job_take_token(sched, r->job, o->tokens[t], now_ms);
    }
    if (!sched->mtp_auto) judge_acceptance(sched, job, o);
}

void moeq_sched_note_error(moeq_sched *sched, int job, const char *code, const char *message) {
    if (!sched || job < 0 || job >= sched->n_jobs_cap || !code || sched->jobs[job]->fail_code) return;
    sched->jobs[job]->fail_code = code;
    snprintf(sched->jobs[job]->fail_message, sizeof sched->jobs[job]->fail_message, "%s", message ? message : "");
}

void moeq_sched_note_complete(moeq_sched *sched, int job, int n_tokens) {
    if (sched && job >= 0 && job < sched->n_jobs_cap && n_tokens > 0 && sched->jobs[job]->complete_at == 0)
        sched->jobs[job]->complete_at = n_tokens;
}

void moeq_sched_note_nonfinite_layer(moeq_sched *sched, int job, int layer) {
    if (sched && job >= 0 && job < sched->n_jobs_cap) sched->jobs[job]->nonfinite_layer = layer;
}

moeq_err moeq_sched_commit(moeq_sched *sched, const int32_t *sampled, int64_t now_ms) {
    return moeq_sched_commit_mtp(sched, sampled, NULL, now_ms);
}

moeq_err moeq_sched_commit_mtp(moeq_sched *sched, const int32_t *sampled, const moeq_sched_round_out *rounds,
                               int64_t now_ms) {
    if (!sched || !sched->plan_open) return MOEQ_ERR_INVALID_ARG;
    if (sched->n_rounds > 0 && !rounds) return MOEQ_ERR_INVALID_ARG;
    for (int i = 0; i < sched->n_rounds; i++)
        if (!round_out_ok(&sched->rounds[i], &rounds[i])) return MOEQ_ERR_INVALID_ARG;
    for (int i = 0; i < sched->n_items; i++)
        if (sched->items[i].sample && !sampled) return MOEQ_ERR_INVALID_ARG;
    sched->plan_open = 0;
    for (int i = 0; i < sched->n_rounds; i++) commit_round(sched, &sched->rounds[i], &rounds[i], now_ms);
    sched->n_rounds = 0;
    for (int i = 0; i < sched->n_items; i++) {
        const moeq_sched_item *it = &sched->items[i];
        sched_job *job = sched->jobs[it->job];
        if (job->state != JOB_RUNNING) continue; /* cannot happen within one plan; defensive */
        if (job->n_fed < job->n_prompt) {
            job->n_fed += it->n_tokens;
            sched->prefill_tokens += it->n_tokens;
        } else {
            sched->decode_tokens += it->n_tokens;
        }
        if (it->sample && sampled[i] < 0) job_numerical_error(sched, it->job, now_ms);
        else if (it->sample) job_take_token(sched, it->job, sampled[i], now_ms);
    }
    sched->n_items = 0;
    return MOEQ_OK;
}

void moeq_sched_abort(moeq_sched *sched, const char *code, const char *message, int64_t now_ms) {
    if (!sched || !sched->plan_open) return;
    sched->plan_open = 0;
    for (int i = 0; i < sched->n_items; i++) {
        int h = sched->items[i].job;
        if (sched->jobs[h]->state == JOB_RUNNING)
            job_finish(sched, h, MOEQ_RESULT_ERROR, MOEQ_FINISH_ERROR, code ? code : MOEQ_CODE_ENGINE, message, now_ms);
    }
    for (int i = 0; i < sched->n_rounds; i++) {
        int h = sched->rounds[i].job;
        if (sched->jobs[h]->state == JOB_RUNNING)
            job_finish(sched, h, MOEQ_RESULT_ERROR, MOEQ_FINISH_ERROR, code ? code : MOEQ_CODE_ENGINE, message, now_ms);
    }
    sched->n_items = 0;
    sched->n_rounds = 0;
}

/* ---- results and batches --------------------------------------------------------- */

int moeq_sched_next_finished(moeq_sched *sched, moeq_sched_finished *out) {
    int h = queue_pop(sched, &sched->finished);
    if (h < 0) return 0;
    sched_job *job = sched->jobs[h];
    job->state = JOB_PUBLISHING;
    *out = (moeq_sched_finished){
        .job = h,
        .user = job->user,
        .batch_user = sched->batches[job->batch].user,
        .key = job->key,
        .status = job->status,
        .finish_reason = job->reason,
        .text = job->text,
        .text_len = job->text_len,
        .tokens = job->out,
        .n_tokens = job->n_out,
        .n_prompt = job->n_prompt,
        .error_code = job->error_code,
        .error_message = job->error_message,
        .added_ms = job->added_ms,
        .admitted_ms = job->admitted_ms,
        .first_token_ms = job->first_token_ms,
        .finished_ms = job->finished_ms,
        .mtp = job->mtp_k > 0 && job->admitted,
        .mtp_drafted = job->mtp_drafted,
        .mtp_accepted = job->mtp_accepted,
    };
    return 1;
}

moeq_err moeq_sched_delivered(moeq_sched *sched, int job, int ok) {
    if (!sched || job < 0 || job >= sched->n_jobs_cap || sched->jobs[job]->state != JOB_PUBLISHING)
        return MOEQ_ERR_INVALID_ARG;
    sched_job *j = sched->jobs[job];
    if (!ok) {
        j->state = JOB_FINISHED;
        queue_push(sched, &sched->finished, job);
        return MOEQ_OK;
    }
    int b = j->batch;
    sched->n_unpublished--;
    job_free_handle(sched, job);
    sched_batch *batch = &sched->batches[b];
    if (++batch->n_delivered == batch->n_jobs) batch_push_ackable(sched, b);
    return MOEQ_OK;
}

int moeq_sched_next_ackable(moeq_sched *sched, void **batch_user) {
    int b = sched->ackable_head;
    if (b < 0) return 0;
    sched->ackable_head = sched->batches[b].next;
    if (sched->ackable_head < 0) sched->ackable_tail = -1;
    if (batch_user) *batch_user = sched->batches[b].user;
    sched->batches[b].in_use = 0;
    sched->batches[b].next = sched->batch_free;
    sched->batch_free = b;
    sched->n_batches--;
    return 1;
}

void moeq_sched_get_stats(const moeq_sched *sched, moeq_sched_stats *stats) {
    memset(stats, 0, sizeof *stats);
    stats->running = sched->n_running;
    stats->pending = sched->n_pending;
    stats->free_slots = sched->params.max_seqs - sched->n_running;
    stats->unpublished = sched->n_unpublished;
    stats->batches = sched->n_batches;
    stats->kv_reserved_tokens = sched->kv.pool ? sched->kv_held_promised : sched->kv_reserved;
    stats->running_max = sched->running_max;
    stats->prefill_tokens = sched->prefill_tokens;
    stats->prefix_tokens_shared = sched->prefix_tokens_shared;
    stats->prefix_tokens_cached = sched->prefix_tokens_cached;
    stats->decode_tokens = sched->decode_tokens;
    stats->jobs_finished = sched->jobs_finished;
    stats->mtp_rounds = sched->mtp_rounds;
    stats->mtp_drafted = sched->mtp_drafted;
    stats->mtp_accepted = sched->mtp_accepted;
}

int moeq_sched_idle(const moeq_sched *sched) {
    return sched->n_batches == 0 && sched->n_running == 0 && sched->n_pending == 0 && sched->n_unpublished == 0;
}
