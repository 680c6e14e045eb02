/*
 * worker.c — the worker shell: one loop that takes batch entries from Redis
 * (worker_io.c), feeds their jobs to the continuous-batching scheduler
 * (scheduler.c), runs the engine steps it plans, publishes each finished
 * job's result to Kafka and acknowledges an entry once every result of it
 * was acknowledged by the broker.
 *
 * Policy lives in scheduler.c; protocol in worker_io.c / moeq_io. What stays
 * here is wiring: slots -> engine sequences and samplers, results -> bytes,
 * delivery reports -> acknowledgements, timers (reclaim, heartbeat, cancel
 * polling), and the drain on SIGTERM.
 */
#include "worker.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker_metrics.h"
#include "moeq/engine.h"
#include "moeq/ep_plan.h"
#include "moeq/kafka.h"
#include "moeq/log.h"
#include "moeq/redis.h"
#include "moeq/result.h"
#include "moeq/tokenizer.h"
#include "moeq/util.h"
#include "affinity.h"
#include "decode_proc.h"
#include "scheduler.h"
#include "worker_group.h"
#include "worker_io.h"

#define COMP "worker"
#define MAX_TAKE 4

typedef struct wbatch wbatch;

/* One job of a held batch: the scheduler's user pointer. */
typedef struct wjob {
    wbatch *batch;
    worker_entry_job *ej;          /* borrowed from batch->entry                 */
    moeq_tokenizer_stream *stream; /* created when the job gets a slot           */
    char state;                    /* the result state for the record: 'F' failed, else done */
    int got_first;                 /* first token sampled (for the ttft metric)  */
    /* Delivery (see on_delivery): the job's messages that the broker must acknowledge
     * before the scheduler hears "delivered" (MSG_* bits), and the ones it did. */
    int handle;                    /* scheduler handle of the published result, -1 before */
    unsigned char need, acked, inflight;
    unsigned char delivered;       /* every message it needed was acknowledged (job_settle) */
    unsigned char marked;          /* ... and its record says so (mark_delivered_jobs)  */
    unsigned char failures;        /* unclassified (IO) delivery failures of its messages */
    char *reason;                  /* owned: DLQ `moeq-reason` / undeliverable cause */
    moeq_grammar *grammar;         /* response_format's compiled grammar (a reference), NULL = none */
    moeq_decode_proc *proc;        /* masks, penalties, logprobs; created with its sampler */
} wjob;

/* The messages of one job, tagged into a delivery report's opaque (a wjob pointer's low bits). */
enum { MSG_RESULT = 1, MSG_DLQ = 2, MSG_ERROR = 4 };

struct wbatch {
    worker_entry entry;
    wjob *jobs;                    /* entry.n_jobs                               */
    char *states;                  /* per job, for worker_io_ack                 */
    int64_t taken_ms;
    /* Every result delivered: the batch waits for Redis to take its acknowledgement, still holding its place
     * in max_batches_held (a batch whose XACK was lost would be reclaimed and run again). */
    int ack_due;
    int ack_failures;              /* attempts Redis did not take, in a row      */
    int64_t ack_next_ms;           /* the next attempt, after a failure          */
    int lost;                      /* another worker reclaimed it while this one held it (logged once) */
    wbatch *next;
};

typedef struct slot_state {
    int seq;                       /* engine sequence, -1 none                   */
    moeq_sampler *sampler;
} slot_state;

struct moeq_worker {
    moeq_worker_params params;
    moeq_model *model;
    moeq_engine *engine;
    moeq_tokenizer *tok;
    moeq_redis *redis;
    moeq_kafka_producer *producer;
    moeq_sched *sched;
    moeq_worker_http *http;
    moeq_health *health;           /* /livez, /readyz: loop ticks, model, broker, Redis */
    moeq_redis_probe *redis_probe;
    atomic_int model_loaded, io_open; /* set once, read by the HTTP thread's probes */
    atomic_int group_formed;          /* an ep.group's ranks all joined (set once; the "group" probe) */
    moeq_worker_metrics metrics;
    char model_name[128];
    int vocab;

    slot_state *slots;
    moeq_step_item *items;
    float *logits;                 /* 2 max_seqs rows: whole rows (the CPU; on a device where a draw needs one) */
    moeq_logits_record *rec;       /* their records (a device backend: moeq_engine_step_out)                  */
    moeq_row_use *use;             /* who draws on each row                                                    */
    uint8_t *have;                 /* 1: the row came whole                                                    */
    int32_t *sampled;
    moeq_buf buf;
    moeq_mtp_decoder *mtp;         /* NULL: MTP off (mtp_k 0 or no MTP layer)  */
    moeq_spec_seq *spec;           /* max_seqs: one round's sequences          */
    moeq_sched_round_out *round_out; /* max_seqs                               */
    moeq_grammar_vocab *gvocab;    /* the tokenizer's tokens as bytes; NULL without a tokenizer */
    moeq_grammar_cache *grammars;  /* compiled response_formats by content hash */
    int32_t eos;                   /* the model's end-of-sequence id, -1 none  */

    wbatch *held;                  /* batches taken, not yet acknowledged      */
    int n_held;
    int n_ack_failing;             /* held batches whose last acknowledgement failed: take nothing new */
    char own_cursors[4][48];       /* reading back entries pending for our worker_id (worker_io_take_own) */
    int own_sweep;                 /* 1: the own-history read is a hand-off sweep, not the start-up one */
    moeq_affinity *affinity;       /* prefix-key hints (prefix_affinity); NULL: off */
    volatile sig_atomic_t stop;
    /* An expert-parallel group (docs/EP.md): one engine step and one agreement per tick, in lockstep. */
    worker_group *group;           /* NULL: no group                           */
    int group_idle;                /* no rank had work at the last agreement: a rank may block for batches */
    int handed_back;               /* drain timed out: batches handed back; only empty steps from now on */
    char screen_state[96];         /* the screened head's state last logged (screen_metrics) */
    int64_t main_steps0;           /* the engine's main passes before this tick's step (a group's lockstep
                                      needs exactly one per tick: moeq_engine_main_steps)               */
    moeq_err group_err;            /* the group failed (a rank died or went silent): end, leave batches pending */
    char group_why[512];
    int64_t next_reclaim_ms, next_heartbeat_ms, next_cancel_ms, next_sweep_ms, started_ms;
    int64_t next_expert_stats_ms;  /* expert_stats_path's next rewrite */
    char cancel_cursor[48];        /* last <prefix>:cancels entry read; "" = not yet initialised */
    int side_dirty;                /* a DLQ copy or replacement error result waits to be produced */
    int64_t last_hb_tokens, last_hb_ms;
    double tokens_per_s;
};

static moeq_worker *g_signal_worker;

/* ---- detokenization callback (scheduler -> tokenizer stream) ---------------- */

static size_t detok(void *ctx, void *user, int32_t token, const char **bytes) {
    moeq_worker *w = ctx;
    wjob *job = user;
    size_t len = 0;
    *bytes = NULL;
    if (!w->tok) return 0;
    if (!job->stream) {
        job->stream = moeq_tokenizer_stream_new(w->tok, MOEQ_DECODE_SKIP_SPECIAL);
        if (!job->stream) return 0;
    }
    if (token == MOEQ_SCHED_DETOK_FLUSH) {
        moeq_tokenizer_stream_flush(job->stream, bytes, &len);
        return len;
    }
    if (moeq_tokenizer_stream_push(job->stream, token, bytes, &len, NULL, 0) != MOEQ_OK) return 0;
    return len;
}

/* ---- delivery reports --------------------------------------------------------- */

static const char *job_id_of(const wjob *job) { return job->ej->job.id ? job->ej->job.id : job->ej->id_fallback; }

static void *msg_tag(wjob *job, int kind) { return (void *)((uintptr_t)job | (uintptr_t)(kind == MSG_RESULT ? 0 : kind == MSG_DLQ ? 1 : 2)); }

static wjob *msg_untag(void *opaque, int *kind) {
    uintptr_t v = (uintptr_t)opaque;
    *kind = (v & 3) == 0 ? MSG_RESULT : (v & 3) == 1 ? MSG_DLQ : MSG_ERROR;
    return (wjob *)(v & ~(uintptr_t)3);
}

/* Every message the job needs is acknowledged: the scheduler may count its result delivered. */
static void job_settle(moeq_worker *w, wjob *job) {
    if (job->handle < 0 || (job->need & ~job->acked)) return;
    moeq_sched_delivered(w->sched, job->handle, 1);
    job->handle = -1;
    job->need = job->acked = 0;
    job->delivered = 1;
}

/*
 * The broker refused the job's result for good: the job ends with an error
 * result (`result_undeliverable`) on results_topic and its original bytes on
 * the DLQ instead; the result itself is no longer needed.
 */
static void job_undeliverable(moeq_worker *w, wjob *job, const char *topic, moeq_err err, const char *why) {
    char cause[384];
    snprintf(cause, sizeof cause, "the result was refused by topic %s: %s (%s)", topic, why && *why ? why : "-",
             moeq_err_str(err));
    free(job->reason);
    job->reason = strdup(cause);
    job->need = (unsigned char)((job->need & ~MSG_RESULT) | MSG_ERROR | MSG_DLQ);
    job->state = 'F';
    w->side_dirty = 1;
    moeq_log(MOEQ_LOG_ERROR, COMP, "result_undeliverable", "job=%s topic=%s err=%s reason=\"%s\"", job_id_of(job), topic,
             moeq_err_str(err), why ? why : "");
}

static void on_delivery(const moeq_kafka_delivery *d, void *cb_opaque) {
    moeq_worker *w = cb_opaque;
    if (!d->opaque) return;
    int kind;
    wjob *job = msg_untag(d->opaque, &kind);
    job->inflight = (unsigned char)(job->inflight & ~kind);
    if (!d->err) {
        job->acked = (unsigned char)(job->acked | kind);
        job_settle(w, job);
        return;
    }
    atomic_fetch_add(&w->metrics.results_failed, 1);
    moeq_log(MOEQ_LOG_WARN, COMP, kind == MSG_DLQ ? "dlq_failed" : "result_failed", "job=%s topic=%s err=%s reason=\"%s\"",
             job_id_of(job), d->topic, moeq_err_str(d->err), d->errstr ? d->errstr : "");
    if (d->err == MOEQ_ERR_IO) job->failures++;
    int permanent = worker_delivery_is_permanent(d->err, job->failures);
    if (kind == MSG_RESULT) {
        if (permanent) {
            job_undeliverable(w, job, d->topic, d->err, d->errstr);
            job_settle(w, job);
        } else {
            moeq_sched_delivered(w->sched, job->handle, 0); /* produced again by publish_finished */
        }
        return;
    }
    if (permanent) {
        /* nothing left to fall back on: give this copy up rather than hold the batch forever */
        job->need = (unsigned char)(job->need & ~kind);
        moeq_log(MOEQ_LOG_ERROR, COMP, kind == MSG_DLQ ? "dlq_undeliverable" : "error_result_undeliverable",
                 "job=%s topic=%s err=%s", job_id_of(job), d->topic, moeq_err_str(d->err));
        job_settle(w, job);
    } else {
        w->side_dirty = 1; /* produced again by send_side */
    }
}

/* ---- construction ---------------------------------------------------------------- */

static void default_worker_id(moeq_worker_params *p) {
    if (p->worker_id[0]) return;
    char host[64] = "worker";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(p->worker_id, sizeof p->worker_id, "%s-%d", host, (int)getpid());
}

/*
 * The acceptance below which a job pauses drafting: the worker param, or (-1, auto) 1.5 x the share of a step's
 * weight bytes one draft reads. A round of k drafts costs about 1 + k x that share at small batch (the verify
 * step's extra tokens add a little, hence the margin) and yields 1 + k x acceptance tokens.
 */
static double mtp_draft_share(const moeq_worker *w) {
    double draft = (double)moeq_model_mtp_active_bytes_per_token(w->model);
    double step = (double)moeq_model_active_bytes_per_token(w->model);
    double t = step > 0 ? draft / step : 0;
    return t > 1 ? 1 : t;
}

static double mtp_min_acceptance(const moeq_worker *w) {
    if (w->params.mtp_k == MOEQ_PROP_AUTO) return 0; /* mtp_k = auto judges each depth itself */
    if (w->params.mtp_min_acceptance >= 0) return w->params.mtp_min_acceptance;
    double t = 1.5 * mtp_draft_share(w);
    return t > 0.9 ? 0.9 : t;
}

/* mtp_k = auto chooses 0..3 drafts per job and step (the param's own range). */
#define MTP_AUTO_MAX_K 3

/* The most drafts a round may have: mtp_k, or MTP_AUTO_MAX_K for auto. */
static int mtp_k_max(const moeq_worker *w) {
    return w->params.mtp_k == MOEQ_PROP_AUTO ? MTP_AUTO_MAX_K : (int)w->params.mtp_k;
}

/* mtp_max_batch: the param, or (auto) 16 with a fixed mtp_k and no limit with mtp_k = auto. */
static int mtp_max_batch(const moeq_worker *w) {
    if (w->params.mtp_max_batch != MOEQ_PROP_AUTO) return (int)w->params.mtp_max_batch;
    return w->params.mtp_k == MOEQ_PROP_AUTO ? 0 : 16;
}

/* The speculative decoder, when mtp_k > 0 and the model has an MTP layer (else MTP stays off, logged). */
static moeq_err open_mtp(moeq_worker *w, char *errstr, size_t errstr_size) {
    if (mtp_k_max(w) <= 0) return MOEQ_OK; /* a group's ranks draft too: the MTP layers run on each rank */
    if (!moeq_engine_mtp_available(w->engine)) {
        moeq_log(MOEQ_LOG_INFO, COMP, "mtp_off", "model=%s reason=\"the model has no MTP layer\"", w->model_name);
        return MOEQ_OK;
    }
    size_t n = (size_t)w->params.max_seqs;
    w->spec = calloc(n, sizeof *w->spec);
    w->round_out = calloc(n, sizeof *w->round_out);
    if (!w->spec || !w->round_out) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "mtp round buffers");
    char k[16] = "?";
    moeq_props_get(moeq_worker_props, &w->params, "mtp_k", k, sizeof k); /* a number, or auto */
    moeq_log(MOEQ_LOG_INFO, COMP, "mtp_on", "model=%s k=%s max_batch=%d min_acceptance=%.3f draft_share=%.4f",
             w->model_name, k, mtp_max_batch(w), mtp_min_acceptance(w), mtp_draft_share(w));
    return moeq_mtp_decoder_new(w->engine, (int)w->params.max_seqs, mtp_k_max(w), &w->mtp, errstr, errstr_size);
}

/* check_weights: one log line per bad tensor, the names gathered for the error that refuses to start. */
typedef struct weight_report {
    char names[256];
} weight_report;

static void log_weight_issue(void *ctx, const moeq_weight_issue *issue) {
    weight_report *r = ctx;
    moeq_log(MOEQ_LOG_ERROR, COMP, "bad_weights", "tensor=%s nonfinite=%lld huge=%lld first=%lld", issue->tensor,
             (long long)issue->nonfinite, (long long)issue->huge, (long long)issue->first);
    size_t n = strlen(r->names);
    if (n + 2 < sizeof r->names) snprintf(r->names + n, sizeof r->names - n, "%s%s", n ? ", " : "", issue->tensor);
}

/* A model whose weights hold NaN/inf would answer every job numerical_error (or garbage): refuse to serve it. */
static moeq_err check_weights(moeq_worker *w, char *errstr, size_t errstr_size) {
    weight_report r = {""};
    int n_bad = 0;
    int64_t t0 = moeq_now_ms();
    moeq_err err = moeq_model_check_weights(w->model, log_weight_issue, &r, &n_bad, errstr, errstr_size);
    if (err) return err;
    moeq_log(MOEQ_LOG_INFO, COMP, "weights_checked", "model=%s bad_tensors=%d ms=%lld", w->params.model, n_bad,
             (long long)(moeq_now_ms() - t0));
    if (n_bad)
        return moeq_errf(MOEQ_ERR_NUMERIC, errstr, errstr_size,
                         "check_weights: %d tensor(s) hold NaN, inf or huge values: %s", n_bad, r.names);
    return MOEQ_OK;
}

/* The scheduler's view of the prefix cache (moeq_sched_prefix_fn). */
static int prefix_lookup(void *ctx, const int32_t *prompt, int n_prompt, int mtp) {
    const moeq_worker *w = ctx;
    return moeq_engine_prefix_lookup(w->engine, prompt, n_prompt, mtp);
}

/* The scheduler's view of the engine's KV blocks (moeq_sched_kv): shared blocks are admitted once. */
static void kv_pool(void *ctx, int mtp, int64_t *takeable, int64_t *total) {
    const moeq_worker *w = ctx;
    moeq_engine_kv_blocks(w->engine, mtp, takeable, total);
}

/* A speculative job takes as many blocks of both caches as the shorter chain gives (moeq_engine_seq_new_prefix). */
static int64_t kv_held(void *ctx, const int32_t *prompt, int n_prompt, int mtp) {
    const moeq_worker *w = ctx;
    int64_t main = moeq_engine_prefix_held_blocks(w->engine, prompt, n_prompt, 0);
    if (!mtp || main == 0) return main;
    int64_t m = moeq_engine_prefix_held_blocks(w->engine, prompt, n_prompt, 1);
    return m < main ? m : main;
}

static int64_t kv_to_grow(void *ctx, int slot, int mtp, int64_t n_tokens) {
    const moeq_worker *w = ctx;
    int seq = w->slots[slot].seq;
    return seq < 0 ? -1 : moeq_engine_seq_blocks_to_grow(w->engine, seq, mtp, n_tokens);
}

/* What a grammar may emit: vocabulary tokens, never added/special ones or the end of sequence. */
static int grammar_token(void *ctx, int32_t id, const char **bytes, size_t *len) {
    const moeq_worker *w = ctx;
    if (id == w->eos) return -1;
    return moeq_tokenizer_token_bytes(w->tok, id, bytes, len) == 0 ? 0 : -1;
}

/* Structured output needs the tokens' bytes: without a tokenizer such jobs are refused (unsupported_schema). */
static moeq_err open_grammars(moeq_worker *w, char *errstr, size_t errstr_size) {
    if (!w->tok) return MOEQ_OK;
    moeq_err err = moeq_grammar_vocab_new(w->vocab, grammar_token, w, &w->gvocab, errstr, errstr_size);
    if (err) return err;
    moeq_grammar_limits lim = moeq_grammar_default_limits();
    lim.max_nfa_states = (int)w->params.grammar_max_nfa_states;
    lim.max_dfa_states = (int)w->params.grammar_max_dfa_states;
    lim.max_recursion = (int)w->params.grammar_max_recursion;
    lim.max_string_chars = (int)w->params.grammar_max_string_chars;
    err = moeq_grammar_cache_new(w->gvocab, &lim, (int)w->params.grammar_cache_entries, &w->grammars, errstr,
                                  errstr_size);
    if (!err) moeq_grammar_cache_set_max_bytes(w->grammars, (size_t)w->params.grammar_cache_bytes);
    return err;
}

/* The device's memory into the metrics (cudaMemGetInfo on a GPU: cheap, no sync). */
static void worker_device_metrics(moeq_worker *w) {
    size_t used = 0, total = 0;
    if (w->engine) moeq_engine_device_memory(w->engine, &used, &total);
    atomic_store(&w->metrics.device_used_bytes, (long long)used);
    atomic_store(&w->metrics.device_total_bytes, (long long)total);
}

/* The metrics' copy of the engine's expert load table (published once: the HTTP thread reads it). */
static moeq_err open_expert_metrics(moeq_worker *w, char *errstr, size_t errstr_size) {
    int L = 0, E = 0;
    if (!moeq_engine_expert_counts(w->engine, &L, &E)) return MOEQ_OK;
    w->metrics.expert_slots = calloc((size_t)L * (size_t)E, sizeof(atomic_llong));
    if (!w->metrics.expert_slots)
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "expert load metrics: %d layers x %d experts", L, E);
    w->metrics.expert_layers = L, w->metrics.expert_n = E;
    atomic_store(&w->metrics.expert_known, 1);
    return MOEQ_OK;
}

/* expert_stats_path, rewritten whole: a temporary file beside it, renamed over it (a reader never sees half). */
static void write_expert_stats(moeq_worker *w, const uint64_t *counts, int L, int E) {
    char note[512], tmp[600], err[1200] = "";
    snprintf(note, sizeof note, "worker %s, model %s, %d layers x %d experts, counted since %lld ms (unix), written "
             "at %lld", w->params.worker_id, w->model_name, L, E, (long long)w->started_ms, (long long)moeq_now_ms());
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", w->params.expert_stats_path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    moeq_err e = f ? moeq_ep_stats_print(counts, L, E, note, f, err, sizeof err) : MOEQ_ERR_IO;
    if (!f) snprintf(err, sizeof err, "%s: %s", tmp, strerror(errno));
    if (f && fclose(f) != 0 && !e) e = MOEQ_ERR_IO, snprintf(err, sizeof err, "%s: %s", tmp, strerror(errno));
    if (!e && rename(tmp, w->params.expert_stats_path) != 0)
        e = MOEQ_ERR_IO, snprintf(err, sizeof err, "rename to %s: %s", w->params.expert_stats_path, strerror(errno));
    if (e) {
        moeq_log(MOEQ_LOG_WARN, COMP, "expert_stats_failed", "path=%s reason=\"%s\"", w->params.expert_stats_path, err);
        unlink(tmp);
    }
}

/* The engine's expert load into the metrics (each heartbeat) and, when due or forced (exit), into its file. */
static void expert_stats(moeq_worker *w, int64_t now, int force) {
    int L = 0, E = 0;
    const uint64_t *c = w->engine ? moeq_engine_expert_counts(w->engine, &L, &E) : NULL;
    if (!c || !w->metrics.expert_slots) return;
    for (size_t i = 0; i < (size_t)L * (size_t)E; i++)
        atomic_store_explicit(&w->metrics.expert_slots[i], (long long)c[i], memory_order_relaxed);
    if (!w->params.expert_stats_path[0] || (!force && now < w->next_expert_stats_ms)) return;
    w->next_expert_stats_ms = now + w->params.expert_stats_interval_ms;
    write_expert_stats(w, c, L, E);
}

static moeq_err open_engine(moeq_worker *w, char *errstr, size_t errstr_size) {
    const moeq_worker_params *p = &w->params;
    moeq_err err = moeq_model_load(p->model, NULL, &w->model, errstr, errstr_size);
    if (err) return err;
    if (p->check_weights && (err = check_weights(w, errstr, errstr_size))) return err;
    char e2[256];
    if (moeq_tokenizer_load(p->model, &w->tok, e2, sizeof e2) != MOEQ_OK) {
        w->tok = NULL;
        moeq_log(MOEQ_LOG_WARN, COMP, "no_tokenizer", "model=%s reason=\"%s\"", p->model, e2);
    }
    moeq_engine_params ep = moeq_engine_default_params();
    ep.max_seqs = (int)p->max_seqs;
    ep.max_step_tokens = (int)p->max_step_tokens;
    ep.kv_cache_tokens = p->kv_cache_tokens;
    ep.kv_block_tokens = (int)p->kv_block_tokens;
    ep.n_threads = (int)p->n_threads;
    snprintf(ep.backend, sizeof ep.backend, "%s", p->backend);
    ep.device = (int)p->device;
    snprintf(ep.cuda_graphs, sizeof ep.cuda_graphs, "%s", p->cuda_graphs);
    snprintf(ep.cuda_matrix, sizeof ep.cuda_matrix, "%s", p->cuda_matrix);
    snprintf(ep.mtp_draft, sizeof ep.mtp_draft, "%s", p->mtp_draft);
    snprintf(ep.cpu_matrix, sizeof ep.cpu_matrix, "%s", p->cpu_matrix);
    snprintf(ep.head_screen, sizeof ep.head_screen, "%s", p->head_screen);
    snprintf(ep.cpu_prefetch, sizeof ep.cpu_prefetch, "%s", p->cpu_prefetch);
    snprintf(ep.cpu_f8_widen, sizeof ep.cpu_f8_widen, "%s", p->cpu_f8_widen);
    snprintf(ep.cpu_k_blocked, sizeof ep.cpu_k_blocked, "%s", p->cpu_k_blocked);
    /* a rank of a group maps only its own experts, at the join: a GPU never holds the others' */
    snprintf(ep.expert_weights, sizeof ep.expert_weights, "%s", p->ep_group[0] ? "group" : "all");
    ep.max_model_len = (int)p->max_model_len;
    ep.prefix_cache = p->prefix_cache;
    ep.prefix_cache_share = p->prefix_cache_share;
    if ((err = moeq_engine_new(w->model, &ep, &w->engine, errstr, errstr_size))) return err;
    w->vocab = moeq_model_get_config(w->model)->vocab_size;
    const char *base = strrchr(p->model, '/');
    snprintf(w->model_name, sizeof w->model_name, "%.127s", base && base[1] ? base + 1 : p->model);
    moeq_log(MOEQ_LOG_INFO, COMP, "engine_backend", "model=%s backend=%s device=%d info=\"%s\"", w->model_name,
             ep.backend, ep.device, moeq_engine_backend_info(w->engine));
    worker_device_metrics(w);
    snprintf(w->metrics.device_backend, sizeof w->metrics.device_backend, "%s", ep.backend);
    w->metrics.device_ordinal = ep.device;
    atomic_store(&w->metrics.kv_pool_bytes,
                 (long long)(p->kv_cache_tokens * (int64_t)moeq_engine_kv_bytes_per_token(w->engine)));
    atomic_store(&w->metrics.device_known, 1);
    if ((err = open_expert_metrics(w, errstr, errstr_size))) return err;

    int32_t eos = w->tok && moeq_tokenizer_eos_id(w->tok) >= 0 ? moeq_tokenizer_eos_id(w->tok)
                                                               : moeq_model_get_config(w->model)->eos_token_id;
    moeq_sched_params sp = moeq_sched_default_params();
    sp.max_seqs = (int)p->max_seqs;
    sp.max_step_tokens = (int)p->max_step_tokens;
    sp.mtp_max_seqs = mtp_max_batch(w);
    sp.mtp_min_acceptance = mtp_min_acceptance(w);
    sp.mtp_auto = p->mtp_k == MOEQ_PROP_AUTO;
    sp.mtp_draft_share = mtp_draft_share(w);
    sp.prefix_share_min = (int)p->prefix_share_min;
    sp.kv_cache_tokens = p->kv_cache_tokens;
    sp.kv_block_tokens = ep.kv_block_tokens;
    sp.max_model_len = moeq_engine_max_model_len(w->engine);
    sp.stop_ids = &eos;
    sp.n_stop_ids = eos >= 0 ? 1 : 0;
    if ((err = moeq_sched_new(&sp, detok, w, &w->sched, errstr, errstr_size))) return err;
    if (p->prefix_cache) moeq_sched_set_prefix_lookup(w->sched, prefix_lookup, w);
    if (!strcmp(p->kv_admission, "shared")) /* (whole: the scheduler reserves every job's length itself) */
        moeq_sched_set_kv(w->sched, &(moeq_sched_kv){kv_pool, kv_to_grow, kv_held, w});
    w->eos = eos;
    if ((err = open_grammars(w, errstr, errstr_size))) return err;

    size_t n = (size_t)p->max_seqs;
    w->slots = calloc(n, sizeof *w->slots);
    w->items = calloc(2 * n, sizeof *w->items);
    w->sampled = calloc(2 * n, sizeof *w->sampled);
    w->logits = malloc(2 * n * (size_t)w->vocab * sizeof *w->logits);
    w->rec = malloc(2 * n * sizeof *w->rec);
    w->use = calloc(2 * n, sizeof *w->use);
    w->have = calloc(2 * n, 1);
    if (!w->slots || !w->items || !w->sampled || !w->logits || !w->rec || !w->use || !w->have)
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "step buffers");
    for (size_t i = 0; i < n; i++) w->slots[i].seq = -1;
    return MOEQ_OK;
}

static moeq_err open_io(moeq_worker *w, const moeq_kvlist *kafka, const moeq_kvlist *redis, char *errstr,
                        size_t errstr_size) {
    moeq_redis_params rp;
    moeq_err err = moeq_redis_params_parse(w->params.redis_url, redis, &rp, errstr, errstr_size);
    if (err) return err;
    if ((err = moeq_redis_new(&rp, &w->redis, errstr, errstr_size))) return err;
    if ((err = worker_io_ensure_groups(w->redis, &w->params, errstr, errstr_size))) return err;
    moeq_kafka_producer_params kp = {.brokers = w->params.kafka_brokers, .client_id = w->params.worker_id,
                                     .on_delivery = on_delivery, .cb_opaque = w};
    return moeq_kafka_producer_new(&kp, kafka, &w->producer, errstr, errstr_size);
}

static moeq_err model_probe(void *opaque, char *errstr, size_t errstr_size) {
    moeq_worker *w = opaque;
    if (atomic_load(&w->model_loaded)) return MOEQ_OK;
    return moeq_errf(MOEQ_ERR_TRANSIENT, errstr, errstr_size, "the model is still loading");
}

static moeq_err kafka_probe(void *opaque, char *errstr, size_t errstr_size) {
    moeq_worker *w = opaque;
    if (!atomic_load(&w->io_open)) return moeq_errf(MOEQ_ERR_TRANSIENT, errstr, errstr_size, "not connected yet");
    return moeq_kafka_producer_ping(w->producer, 1000, errstr, errstr_size);
}

/* A rank of a group serves nothing until every rank joined: not ready meanwhile (a supervisor sees why). */
static moeq_err group_probe(void *opaque, char *errstr, size_t errstr_size) {
    moeq_worker *w = opaque;
    if (!w->params.ep_group[0] || atomic_load(&w->group_formed)) return MOEQ_OK;
    return moeq_errf(MOEQ_ERR_TRANSIENT, errstr, errstr_size,
                     "expert-parallel group %s: rank %d of %d is waiting for the other ranks (up to "
                     "ep.join_timeout_ms = %lld ms)", w->params.ep_group, w->params.ep.rank, w->params.ep.n_ranks,
                     (long long)w->params.ep_join_timeout_ms);
}

/* Health first: a taken http_port fails before a long model load; /readyz says "loading" meanwhile. */
static moeq_err open_health(moeq_worker *w, const moeq_kvlist *redis, char *errstr, size_t errstr_size) {
    moeq_redis_params rp;
    moeq_err err = moeq_redis_params_parse(w->params.redis_url, redis, &rp, errstr, errstr_size);
    if (err) return err;
    if (moeq_health_new(2000, w->params.livez_stall_ms, &w->health) || moeq_redis_probe_new(&rp, &w->redis_probe))
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
    moeq_health_add_probe(w->health, "model", model_probe, w);
    moeq_health_add_probe(w->health, "kafka", kafka_probe, w);
    moeq_health_add_probe(w->health, "redis", moeq_redis_probe_check, w->redis_probe);
    if (w->params.ep_group[0]) moeq_health_add_probe(w->health, "group", group_probe, w);
    if (w->params.http_port < 0) return MOEQ_OK;
    return moeq_worker_http_start(&w->metrics, w->params.worker_id, w->health, w->params.http_addr,
                                  (int)w->params.http_port, &w->http, errstr, errstr_size);
}

moeq_err moeq_worker_new(const moeq_worker_params *params, const moeq_kvlist *kafka, const moeq_kvlist *redis,
                         moeq_worker **out, char *errstr, size_t errstr_size) {
    if (!params || !out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "NULL argument");
    *out = NULL;
    moeq_err err = moeq_worker_params_check(params, errstr, errstr_size);
    if (err) return err;
    moeq_worker *w = calloc(1, sizeof *w);
    if (!w) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "worker");
    w->params = *params;
    default_worker_id(&w->params);
    atomic_store(&w->metrics.healthy, 1);
    if (!(err = open_health(w, redis, errstr, errstr_size)) && !(err = open_engine(w, errstr, errstr_size)))
        atomic_store(&w->model_loaded, 1);
    if (!err && !(err = open_io(w, kafka, redis, errstr, errstr_size))) atomic_store(&w->io_open, 1);
    if (!err && w->params.ep_group[0] &&
        !(err = worker_group_new(&w->params, w->redis, w->engine, &w->group, errstr, errstr_size)))
        atomic_store(&w->group_formed, 1);
    if (!err) err = open_mtp(w, errstr, errstr_size);
    if (err) {
        moeq_worker_destroy(w);
        return err;
    }
    for (int p = 0; p < 4; p++) snprintf(w->own_cursors[p], sizeof w->own_cursors[p], "0");
    /* affinity pays only where a held prefix saves prefill: not without the cache */
    if (w->params.prefix_affinity && w->params.prefix_cache && moeq_affinity_new(16, 64, &w->affinity)) {
        moeq_worker_destroy(w);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "affinity hints");
    }
    w->started_ms = moeq_now_ms();
    *out = w;
    return MOEQ_OK;
}

static void batch_free(wbatch *b) {
    if (!b) return;
    for (size_t i = 0; i < b->entry.n_jobs; i++) {
        moeq_tokenizer_stream_destroy(b->jobs[i].stream);
        free(b->jobs[i].reason);
        moeq_decode_proc_destroy(b->jobs[i].proc);
        moeq_grammar_release(b->jobs[i].grammar);
    }
    free(b->jobs);
    free(b->states);
    worker_entry_free(&b->entry);
    free(b);
}

void moeq_worker_destroy(moeq_worker *w) {
    if (!w) return;
    if (g_signal_worker == w) g_signal_worker = NULL;
    moeq_worker_http_stop(w->http); /* first: its probes read the producer (and the metrics' expert table) */
    moeq_affinity_destroy(w->affinity);
    moeq_health_destroy(w->health);
    moeq_redis_probe_destroy(w->redis_probe);
    moeq_kafka_producer_destroy(w->producer); /* flushes; late reports reach the scheduler */
    while (w->held) {
        wbatch *b = w->held;
        w->held = b->next;
        batch_free(b);
    }
    if (w->slots)
        for (int i = 0; i < w->params.max_seqs; i++) {
            if (w->slots[i].seq >= 0) moeq_engine_seq_free(w->engine, w->slots[i].seq);
            moeq_sampler_destroy(w->slots[i].sampler);
        }
    moeq_sched_destroy(w->sched);
    moeq_redis_destroy(w->redis);
    moeq_mtp_decoder_destroy(w->mtp);
    moeq_engine_destroy(w->engine);
    worker_group_destroy(w->group); /* after the engine, which borrowed its handle */
    moeq_grammar_cache_destroy(w->grammars); /* after the batches: their processors hold grammar references */
    moeq_grammar_vocab_destroy(w->gvocab);
    moeq_tokenizer_destroy(w->tok);
    moeq_model_destroy(w->model);
    free(w->metrics.expert_slots);
    free(w->slots);
    free(w->items);
    free(w->sampled);
    free(w->logits);
    free(w->rec);
    free(w->use);
    free(w->have);
    free(w->spec);
    free(w->round_out);
    moeq_buf_free(&w->buf);
    free(w);
}

void moeq_worker_stop(moeq_worker *w) {
    if (w) w->stop = 1;
}

static void on_signal(int sig) {
    (void)sig;
    if (g_signal_worker) g_signal_worker->stop = 1;
}

void moeq_worker_install_signals(moeq_worker *w) {
    g_signal_worker = w;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

/* ---- taking batches ------------------------------------------------------------- */

/* Tokenize a job that came without prompt ids (as `moeq generate` would). */
static moeq_err tokenize_job(moeq_worker *w, worker_entry_job *ej, char *errstr, size_t errstr_size) {
    const moeq_job *job = &ej->job;
    if (job->input == MOEQ_JOB_INPUT_TOKENS) {
        ej->tokens = malloc(sizeof *ej->tokens * (job->n_tokens ? job->n_tokens : 1));
        if (!ej->tokens) return MOEQ_ERR_NOMEM;
        memcpy(ej->tokens, job->tokens, sizeof *ej->tokens * job->n_tokens);
        ej->n_tokens = (int)job->n_tokens;
        return MOEQ_OK;
    }
    if (!w->tok) return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "the model has no tokenizer");
    moeq_tokens t = {0};
    moeq_err err;
    if (job->input == MOEQ_JOB_INPUT_PROMPT) {
        unsigned flags = moeq_tokenizer_add_bos(w->tok) ? MOEQ_TOKENIZE_ADD_BOS : 0;
        err = moeq_tokenizer_encode(w->tok, job->prompt, job->prompt_len, flags, &t, errstr, errstr_size);
    } else {
        moeq_chat_message *m = calloc(job->n_messages ? job->n_messages : 1, sizeof *m);
        if (!m) return MOEQ_ERR_NOMEM;
        for (size_t i = 0; i < job->n_messages; i++) m[i] = (moeq_chat_message){job->messages[i].role, job->messages[i].content};
        err = moeq_tokenizer_apply_chat(w->tok, m, job->n_messages, 1, &t, errstr, errstr_size);
        free(m);
    }
    if (err) {
        moeq_tokens_free(&t);
        return err;
    }
    ej->tokens = t.ids;
    ej->n_tokens = (int)t.n;
    return MOEQ_OK;
}

static const char *job_id(const worker_entry_job *ej) { return ej->job.id ? ej->job.id : ej->id_fallback; }

/*
 * Drafts per round for a job: the worker's mtp_k when MTP is on and the job
 * asks for it (`mtp`, default on), greedy or sampled (auto: up to 3, the
 * scheduler choosing each plan's). Rounds run in the
 * engine's exact mode (run_plan passes the slot's sampler), so a sampled
 * job's tokens are its plain sampler's, token for token: a job's result does
 * not depend on how it was decoded (duplicates after a crash, `moeq generate`).
 */
static int job_mtp_k(const moeq_worker *w, const moeq_job *job) {
    return w->mtp && job->mtp ? mtp_k_max(w) : 0;
}

/* The job's response_format compiled (through the cache); NULL, or the error code with the reason in why. */
static const char *job_grammar(moeq_worker *w, const moeq_job *job, wjob *wj, char *why, size_t why_size) {
    const moeq_response_format *rf = &job->response_format;
    if (rf->type == MOEQ_RESPONSE_TEXT) return NULL;
    if (!w->grammars) {
        snprintf(why, why_size, "response_format needs the model's tokenizer, and this worker has none");
        return MOEQ_CODE_UNSUPPORTED_SCHEMA;
    }
    moeq_grammar_spec spec = moeq_response_format_spec(rf);
    char err[200] = "";
    moeq_err e = moeq_grammar_cache_get(w->grammars, &spec, &wj->grammar, err, sizeof err);
    if (!e) return NULL;
    snprintf(why, why_size, "response_format: %s", err);
    return e == MOEQ_ERR_LIMIT ? MOEQ_CODE_GRAMMAR_TOO_LARGE
           : e == MOEQ_ERR_NOMEM ? MOEQ_CODE_INTERNAL : MOEQ_CODE_UNSUPPORTED_SCHEMA;
}

/* Read job records, then hand the batch's runnable jobs to the scheduler. */
static moeq_err admit_entry(moeq_worker *w, worker_entry *entry, int reclaimed, char *errstr, size_t errstr_size) {
    int64_t now = moeq_now_ms();
    wbatch *b = calloc(1, sizeof *b);
    size_t n = entry->n_jobs;
    if (!b) return MOEQ_ERR_NOMEM;
    b->entry = *entry;
    memset(entry, 0, sizeof *entry);
    b->jobs = calloc(n ? n : 1, sizeof *b->jobs);
    b->states = calloc(n + 1, 1);
    const char **ids = calloc(n ? n : 1, sizeof *ids);
    moeq_sched_job_spec *specs = calloc(n ? n : 1, sizeof *specs);
    char (*why)[256] = calloc(n ? n : 1, sizeof *why);
    if (!b->jobs || !b->states || !ids || !specs || !why) {
        free(ids), free(specs), free(why), batch_free(b);
        return MOEQ_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) ids[i] = job_id(&b->entry.jobs[i]);
    moeq_err err = worker_io_job_states(w->redis, w->params.redis_prefix, ids, n, b->states, errstr, errstr_size);
    if (err) goto out;
    int dead = b->entry.deliveries > w->params.max_deliveries;
    size_t n_specs = 0;
    for (size_t i = 0; i < n; i++) {
        worker_entry_job *ej = &b->entry.jobs[i];
        wjob *job = &b->jobs[i];
        job->batch = b;
        job->ej = ej;
        job->handle = -1;
        if (b->states[i] == 'D') { /* done before a crash: its result is out; do not run it again */
            atomic_fetch_add(&w->metrics.jobs_skipped_done, 1);
            continue;
        }
        moeq_sched_job_spec *s = &specs[n_specs++];
        s->key = ids[i];
        s->user = job;
        s->priority = ej->job.priority;
        s->max_new_tokens = ej->job.max_new_tokens;
        s->deadline_ms = ej->job.deadline_ms;
        s->stop = (const char *const *)ej->job.stop;
        s->n_stop = ej->job.n_stop;
        s->cancelled = b->states[i] == 'C';
        if (dead) {
            snprintf(why[i], sizeof why[i], "batch delivered %d times (max_deliveries %lld)", b->entry.deliveries,
                     (long long)w->params.max_deliveries);
            s->error_code = MOEQ_CODE_DEAD_LETTER;
            s->error_message = why[i];
        } else if (ej->bad) {
            s->error_code = ej->bad_code ? ej->bad_code : "malformed"; /* a documented job reject code */
            s->error_message = ej->bad;
        } else if (!ej->tokens && tokenize_job(w, ej, why[i], sizeof why[i]) != MOEQ_OK) {
            s->error_code = MOEQ_CODE_TOKENIZE;
            s->error_message = why[i];
        } else if ((s->error_code = job_grammar(w, &ej->job, job, why[i], sizeof why[i]))) {
            s->error_message = why[i];
        }
        s->stop_token_ids = ej->job.stop_token_ids;
        s->n_stop_token_ids = ej->job.n_stop_token_ids;
        if (s->error_code) job->state = 'F';
        s->prompt = ej->tokens;
        s->n_prompt = ej->n_tokens;
        s->mtp_k = job_mtp_k(w, &ej->job);
    }
    if (dead) {
        /* each job's original bytes go to the DLQ; its error result counts as delivered only once
         * the broker acknowledged that copy too (send_side, on_delivery) */
        atomic_fetch_add(&w->metrics.batches_dead_lettered, 1);
        for (size_t i = 0; i < n; i++) {
            if (b->states[i] == 'D' || !b->entry.jobs[i].raw) continue;
            b->jobs[i].need |= MSG_DLQ;
            b->jobs[i].reason = strdup(why[i]);
            w->side_dirty = 1;
        }
        moeq_log(MOEQ_LOG_WARN, COMP, "dead_letter", "stream=%s entry=%s deliveries=%d jobs=%zu", b->entry.stream,
                 b->entry.id, b->entry.deliveries, n);
    } else if (n_specs) {
        worker_io_mark_running(w->redis, &w->params, w->params.worker_id, ids, n, NULL, 0);
    }
    if ((err = moeq_sched_add_batch(w->sched, b, specs, n_specs, now, errstr, errstr_size))) goto out;
    b->taken_ms = now;
    b->next = w->held;
    w->held = b;
    w->n_held++;
    b = NULL;
    atomic_fetch_add(&w->metrics.batches_taken, 1);
    if (reclaimed == 1) atomic_fetch_add(&w->metrics.batches_reclaimed, 1);
    if (reclaimed == 2) atomic_fetch_add(&w->metrics.affinity_received, 1);
    if (w->affinity && n) {
        const worker_entry_job *first = &w->held->entry.jobs[0];
        int covered = first->n_tokens < w->held->entry.prefix_tokens ? first->n_tokens : w->held->entry.prefix_tokens;
        moeq_affinity_note(w->affinity, w->held->entry.prefix_key, first->tokens, first->tokens ? covered : 0, now);
    }
    moeq_log(MOEQ_LOG_INFO, COMP, "batch_taken", "stream=%s entry=%s jobs=%zu runnable=%zu reclaimed=%d deliveries=%d",
             w->held->entry.stream, w->held->entry.id, n, n_specs, reclaimed, w->held->entry.deliveries);
out:
    free(ids);
    free(specs);
    free(why);
    batch_free(b);
    return err;
}

static int want_batch(const moeq_worker *w) {
    return !w->stop && w->n_ack_failing == 0 && w->n_held < w->params.max_batches_held &&
           moeq_sched_free_capacity(w->sched) > 0;
}

static int own_history_left(const moeq_worker *w) {
    for (int p = 0; p < 4; p++)
        if (w->own_cursors[p][0]) return 1;
    return 0;
}

/*
 * First, once: what a previous process with our worker_id left pending (it died), at once rather than after
 * the visibility timeout. Nothing new or reclaimed is read before that history is through, so no entry of it
 * can come back twice.
 */
/* The batch stream/id is held (running) here. */
static int held_here(void *ctx, const char *stream, const char *id) {
    for (const wbatch *b = ((const moeq_worker *)ctx)->held; b; b = b->next)
        if (!strcmp(b->entry.id, id) && !strcmp(b->entry.stream, stream)) return 1;
    return 0;
}

static int is_held(const moeq_worker *w, const worker_entry *e) { return held_here((void *)w, e->stream, e->id); }

static moeq_err take_own(moeq_worker *w, size_t room, char *errstr, size_t errstr_size) {
    worker_entry entries[MAX_TAKE];
    size_t n = 0;
    moeq_err err = worker_io_take_own(w->redis, &w->params, w->own_cursors, w->own_sweep, held_here, w, entries, room,
                                      &n, errstr, errstr_size);
    for (size_t i = 0; i < n; i++) { /* a hand-off sweep also reads what this worker holds already */
        if (!err && !is_held(w, &entries[i])) err = admit_entry(w, &entries[i], w->own_sweep ? 2 : 1, errstr, errstr_size);
        worker_entry_free(&entries[i]);
    }
    return err;
}

/* The affinity's view of the cache: most of these leading tokens are cached here (moeq_affinity_cached_fn). */
static int prefix_cached(void *ctx, const int32_t *prefix, int n) {
    const moeq_worker *w = ctx;
    return n > 0 && moeq_engine_prefix_lookup(w->engine, prefix, n + 1, 0) * 2 >= n;
}

/* A fresh entry another live worker advertised the prefix key of: hand it over (1), or run it here (0). */
static int hand_off(moeq_worker *w, const worker_entry *e) {
    if (!w->affinity || !e->prefix_key || e->n_jobs == 0) return 0;
    int n = (int)e->n_jobs, covered = e->jobs[0].n_tokens < e->prefix_tokens ? e->jobs[0].n_tokens : e->prefix_tokens;
    /* held here: the cache has it (a job without token ids cannot be looked up: keep it, never guess) */
    int held = !e->jobs[0].tokens || covered < 1 || prefix_cached(w, e->jobs[0].tokens, covered);
    const char *to = moeq_affinity_route(w->affinity, e->prefix_key, n, 0, held);
    char err[256];
    if (!to || worker_io_hand_to(w->redis, &w->params, e, to, err, sizeof err) != MOEQ_OK) return 0;
    moeq_affinity_handed(w->affinity, to, n);
    atomic_fetch_add(&w->metrics.affinity_handed, 1);
    moeq_log(MOEQ_LOG_INFO, COMP, "batch_handed", "stream=%s entry=%s to=%s key=%016llx", e->stream, e->id, to,
             (unsigned long long)e->prefix_key);
    return 1;
}

static moeq_err take_batches(moeq_worker *w, char *errstr, size_t errstr_size) {
    worker_entry entries[MAX_TAKE];
    size_t n = 0;
    moeq_err err = MOEQ_OK;
    int64_t now = moeq_now_ms();
    size_t room = (size_t)(w->params.max_batches_held - w->n_held);
    if (room > MAX_TAKE) room = MAX_TAKE;
    if (own_history_left(w)) return take_own(w, room, errstr, errstr_size);
    if (now >= w->next_reclaim_ms) {
        w->next_reclaim_ms = now + (w->params.visibility_timeout_ms / 4 > 500 ? w->params.visibility_timeout_ms / 4 : 500);
        if ((err = worker_io_reclaim(w->redis, &w->params, &entries[0], &n, errstr, errstr_size))) return err;
        if (n) {
            err = admit_entry(w, &entries[0], 1, errstr, errstr_size);
            worker_entry_free(&entries[0]);
            return err;
        }
    }
    int idle = moeq_sched_idle(w->sched) && w->n_held == 0 && (!w->group || w->group_idle);
    int block = idle ? (int)w->params.block_ms : 0;
    if (w->group && block > w->params.ep.timeout_ms / 4) block = w->params.ep.timeout_ms / 4; /* the others wait */
    int64_t until_reclaim = w->next_reclaim_ms - now;
    if (block > until_reclaim) block = until_reclaim > 1 ? (int)until_reclaim : 1;
    if ((err = worker_io_take(w->redis, &w->params, block, entries, room, &n, errstr, errstr_size))) return err;
    for (size_t i = 0; i < n; i++) {
        if (!err && !hand_off(w, &entries[i])) err = admit_entry(w, &entries[i], 0, errstr, errstr_size);
        worker_entry_free(&entries[i]);
    }
    return err;
}

/* ---- engine steps -------------------------------------------------------------- */

static moeq_sampling_params sampling_for(const moeq_job *job) {
    moeq_sampling_params sp = moeq_sampling_default_params();
    sp.temperature = job->temperature;
    sp.top_k = job->top_k;
    sp.top_p = job->top_p;
    sp.seed = job->has_seed ? job->seed : moeq_worker_seed_for_id(job->id, job->id_len);
    return sp;
}

/* The job's decode processor (structured output, min_tokens, penalties, logprobs) on its fresh sampler. */
static moeq_err attach_proc(moeq_worker *w, wjob *job, moeq_sampler *sampler, char *errstr, size_t errstr_size) {
    const moeq_job *j = &job->ej->job;
    moeq_decode_proc_params pp = {
        .grammar = job->grammar, .eos_ids = &w->eos, .n_eos = w->eos >= 0, .stop_token_ids = j->stop_token_ids,
        .n_stop_token_ids = (int)j->n_stop_token_ids, .max_new_tokens = j->max_new_tokens,
        .min_tokens = j->min_tokens, .repetition_penalty = j->repetition_penalty,
        .presence_penalty = j->presence_penalty, .frequency_penalty = j->frequency_penalty,
        .prompt = job->ej->tokens, .n_prompt = job->ej->n_tokens, .logprobs = j->logprobs,
        .top_logprobs = j->top_logprobs};
    moeq_decode_proc_destroy(job->proc); /* a job opened again starts over */
    job->proc = NULL;
    if (!moeq_decode_proc_needed(&pp)) return MOEQ_OK;
    moeq_err err = moeq_decode_proc_new(&pp, w->vocab, &job->proc, errstr, errstr_size);
    if (err) return err;
    moeq_sampler_hook hook = moeq_decode_proc_hook(job->proc);
    moeq_sampler_set_hook(sampler, &hook);
    return MOEQ_OK;
}

/* What a job's processor made of this plan's draws: complete (finish_reason stop), or failed (an error). */
static void note_proc(moeq_worker *w, int job_handle, const wjob *job) {
    if (!job->proc) return;
    moeq_err e = moeq_decode_proc_error(job->proc);
    if (e)
        moeq_sched_note_error(w->sched, job_handle, e == MOEQ_ERR_LIMIT ? MOEQ_CODE_GRAMMAR_TOO_LARGE : MOEQ_CODE_INTERNAL,
                              e == MOEQ_ERR_LIMIT ? "response_format: the grammar outgrew max_dfa_states while generating"
                                                  : "response_format: the grammar failed while generating");
    else if (moeq_decode_proc_complete_at(job->proc))
        moeq_sched_note_complete(w->sched, job_handle, moeq_decode_proc_complete_at(job->proc));
}

static void note_complete(moeq_worker *w, const moeq_sched_step *plan) {
    for (int i = 0; i < plan->n_items; i++)
        if (plan->items[i].sample) note_proc(w, plan->items[i].job, plan->items[i].user);
    for (int i = 0; i < plan->n_rounds; i++) note_proc(w, plan->rounds[i].job, plan->rounds[i].user);
}

static void slot_clear(moeq_worker *w, int slot) {
    slot_state *s = &w->slots[slot];
    if (s->seq >= 0) moeq_engine_seq_free(w->engine, s->seq);
    moeq_sampler_destroy(s->sampler);
    s->seq = -1;
    s->sampler = NULL;
}

/*
 * A new job's sequence: a fork of the running sequence that holds its prompt's first fork_tokens tokens (the
 * scheduler compared the prompts), or one that takes its first cached_tokens from the prefix cache
 * (moeq_engine_seq_new_prefix; with the cache on every job looks, so the metrics count every lookup), or a
 * fresh one. When the fork cannot be made (no free cache block for the copied partial block) the new
 * sequence takes what the cache holds of those tokens and prefills the rest itself, in steps of its own
 * (in a group: *lead of them, in front of its item in this tick's step): the same cache either way.
 */
static moeq_err slot_open(moeq_worker *w, const moeq_sched_item *it, int *lead, char *errstr, size_t errstr_size) {
    slot_state *s = &w->slots[it->slot];
    *lead = 0;
    slot_clear(w, it->slot);
    const wjob *job = it->user;
    moeq_sampling_params sp = sampling_for(&job->ej->job);
    moeq_err err = moeq_sampler_new(&sp, w->vocab, &s->sampler);
    if (err) return moeq_errf(err, errstr, errstr_size, "sampler for job %s", job->ej->job.id);
    if ((err = attach_proc(w, (wjob *)job, s->sampler, errstr, errstr_size))) return err;
    if (it->fork_tokens > 0) {
        err = moeq_engine_seq_fork(w->engine, w->slots[it->fork_slot].seq, it->fork_tokens, it->mtp, it->tokens[0],
                                   &s->seq, errstr, errstr_size);
        if (err == MOEQ_OK) {
            atomic_fetch_add(&w->metrics.prefix_tokens_shared, it->fork_tokens);
            return MOEQ_OK;
        }
        moeq_log(MOEQ_LOG_WARN, COMP, "fork_failed", "job=%s tokens=%d reason=\"%s\"", job->ej->job.id,
                 it->fork_tokens, errstr);
    }
    /* the prompt from its start: the item's tokens follow the forked or cached ones */
    int skipped = it->fork_tokens + it->cached_tokens, got = 0;
    const int32_t *prompt = it->tokens - skipped;
    if (w->params.prefix_cache)
        err = moeq_engine_seq_new_prefix(w->engine, prompt, skipped + it->n_tokens, skipped, it->mtp, &s->seq, &got,
                                         errstr, errstr_size);
    else if (!(err = moeq_engine_seq_new(w->engine, &s->seq)) && it->mtp)
        err = moeq_engine_seq_set_mtp(w->engine, s->seq, 1); /* before its first token */
    if (err) return moeq_errf(err, errstr, errstr_size, "no engine sequence for job %s", job->ej->job.id);
    /* what neither a fork nor the cache gave (a failed fork; the cache cannot give less than it said). In an
     * expert-parallel group every rank runs exactly one engine step per tick, so an extra step would break the
     * lockstep: there those tokens lead the job's item in this tick's step instead (prepare_items). */
    if (w->group) {
        *lead = skipped - got;
        return MOEQ_OK;
    }
    for (int done = got, chunk = (int)w->params.max_step_tokens; done < skipped; done += chunk) {
        moeq_step_item one = {s->seq, prompt + done, skipped - done < chunk ? skipped - done : chunk, 0};
        moeq_step_out out = {w->logits, 1, w->rec, NULL, w->have}; /* nothing reads the row: records only */
        if ((err = moeq_engine_step_out(w->engine, &one, 1, &out, errstr, errstr_size))) return err;
    }
    return MOEQ_OK;
}

/* The engine's prefix-cache counters into the metrics (the HTTP thread must not read the engine). */
static void prefix_metrics(moeq_worker *w) {
    moeq_engine_prefix_stats ps;
    moeq_engine_get_prefix_stats(w->engine, &ps);
    atomic_store(&w->metrics.prefix_lookups, ps.lookups);
    atomic_store(&w->metrics.prefix_hits, ps.hits);
    atomic_store(&w->metrics.prefix_lookup_tokens, ps.lookup_tokens);
    atomic_store(&w->metrics.prefix_hit_tokens, ps.hit_tokens);
    atomic_store(&w->metrics.prefix_cached_blocks, ps.cached_blocks);
    atomic_store(&w->metrics.prefix_evictions, ps.evictions);
    atomic_store(&w->metrics.prefix_collisions, ps.collisions);
}

/* The screened head's counters into the metrics, and its state into the log when it changes (the first greedy
 * row makes the int8 copy, or says why there is none: head_screen = off, a device, no VNNI, out of memory). */
static void screen_metrics(moeq_worker *w) {
    moeq_head_screen_stats st = moeq_engine_head_screen_stats(w->engine);
    atomic_store(&w->metrics.screen_rows, st.rows);
    atomic_store(&w->metrics.screen_candidates, st.candidates);
    atomic_store(&w->metrics.screen_fallbacks, st.fallbacks);
    atomic_store(&w->metrics.screen_refined, st.refined);
    atomic_store(&w->metrics.screen_bytes, (long long)st.bytes);
    int on = st.state && !strcmp(st.state, "on");
    atomic_store(&w->metrics.screen_on, on);
    if (!st.state || !strcmp(st.state, "not yet used") ||
        !strncmp(w->screen_state, st.state, sizeof w->screen_state - 1))
        return; /* nothing to say yet, or said already */
    snprintf(w->screen_state, sizeof w->screen_state, "%s", st.state);
    if (on)
        moeq_log(MOEQ_LOG_INFO, COMP, "head_screen_on", "model=%s copy_bytes=%zu head_bytes=%zu", w->model_name,
                 st.bytes, st.head_bytes);
    else
        moeq_log(MOEQ_LOG_INFO, COMP, "head_screen_off", "model=%s reason=\"%s; greedy rows are computed whole\"",
                 w->model_name, st.state);
}

/* The plan's ordinary items: open (or fork) new sequences, fill w->items. */
static moeq_err prepare_items(moeq_worker *w, const moeq_sched_step *plan, char *err, size_t err_size) {
    int64_t total = 0;
    for (int i = 0; i < plan->n_items; i++) total += plan->items[i].n_tokens;
    for (int i = 0; i < plan->n_items; i++) {
        const moeq_sched_item *it = &plan->items[i];
        int lead = 0;
        if (it->new_seq) {
            moeq_err e = slot_open(w, it, &lead, err, err_size);
            if (e) return e;
        }
        /* a group's failed fork: the prompt tokens it should have shared ride in this step, when they fit */
        if (lead > 0 && total + lead > w->params.max_step_tokens)
            return moeq_errf(MOEQ_ERR_LIMIT, err, err_size,
                             "job %s: its fork failed and the %d prompt tokens it was to share do not fit this "
                             "step (%lld of max_step_tokens %lld taken)", ((const wjob *)it->user)->ej->job.id, lead,
                             (long long)total, (long long)w->params.max_step_tokens);
        total += lead;
        w->items[i] = (moeq_step_item){w->slots[it->slot].seq, it->tokens - lead, it->n_tokens + lead, 0};
        w->use[i] = (moeq_row_use){it->sample ? w->slots[it->slot].sampler : NULL, 0, 0};
    }
    return MOEQ_OK;
}

/* Sample the items that end in a token (one row per item: whole, or on a device its record where that decides
 * the draw exactly). */
static void sample_items(moeq_worker *w, const moeq_sched_step *plan) {
    for (int i = 0; i < plan->n_items; i++) {
        const moeq_sched_item *it = &plan->items[i];
        if (!it->sample) continue;
        w->sampled[i] = moeq_sampler_sample_out(w->slots[it->slot].sampler, &w->rec[i],
                                                w->have[i] ? w->logits + (size_t)i * w->vocab : NULL);
        wjob *job = it->user;
        if (!job->got_first) {
            job->got_first = 1;
            moeq_worker_metrics_observe_ttft(&w->metrics, moeq_now_ms() - job->batch->taken_ms);
        }
    }
}

/* Jobs whose logits held NaN/inf this step: tell the scheduler where the engine first saw it, for the message. */
static void note_nonfinite(moeq_worker *w, const moeq_sched_step *plan) {
    for (int i = 0; i < plan->n_items; i++)
        if (plan->items[i].sample && w->sampled[i] < 0)
            moeq_sched_note_nonfinite_layer(w->sched, plan->items[i].job,
                                            moeq_engine_seq_nonfinite_layer(w->engine, w->slots[plan->items[i].slot].seq));
    for (int i = 0; i < plan->n_rounds; i++)
        if (w->spec[i].numerical_error)
            moeq_sched_note_nonfinite_layer(w->sched, plan->rounds[i].job,
                                            moeq_engine_seq_nonfinite_layer(w->engine, w->spec[i].seq_id));
}

/*
 * The plan in one engine step: its ordinary items alone, or — when it has speculative rounds — the rounds'
 * drafts and then one verify step that also carries the items (moeq_mtp_decode_step_out: one pass over the
 * weights, the same bits as separate steps). Round outcomes go to round_out.
 */
static moeq_err run_plan(moeq_worker *w, const moeq_sched_step *plan, char *err, size_t err_size) {
    moeq_err e = prepare_items(w, plan, err, err_size);
    if (e) return e;
    if (plan->n_rounds > 0 && !w->mtp)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, err, err_size, "rounds planned without an MTP decoder");
    for (int i = 0; i < plan->n_rounds; i++) {
        const moeq_sched_round *r = &plan->rounds[i];
        const wjob *job = r->user;
        w->spec[i] = (moeq_spec_seq){.seq_id = w->slots[r->slot].seq, .next_token = r->next_token, .k = r->k,
                                     .sampling = sampling_for(&job->ej->job),
                                     .sampler = w->slots[r->slot].sampler}; /* exact mode: plain's tokens */
    }
    int64_t t0 = moeq_mono_ns();
    moeq_step_out out = {w->logits, (size_t)plan->n_items, w->rec, w->use, w->have};
    if (plan->n_rounds > 0)
        e = moeq_mtp_decode_step_out(w->mtp, w->spec, plan->n_rounds, w->items, plan->n_items, &out, err, err_size);
    else
        e = moeq_engine_step_out(w->engine, w->items, plan->n_items, &out, err, err_size);
    atomic_fetch_add(&w->metrics.engine_ns, moeq_mono_ns() - t0);
    if (e) return e;
    sample_items(w, plan);
    note_nonfinite(w, plan);
    note_complete(w, plan);
    int64_t drafted = 0, accepted = 0, emitted = 0;
    for (int i = 0; i < plan->n_rounds; i++) {
        const moeq_spec_seq *sq = &w->spec[i];
        w->round_out[i] = (moeq_sched_round_out){sq->out, sq->numerical_error ? 0 : sq->n_out, (int)sq->drafted,
                                                 (int)sq->accepted}; /* 0 tokens: numerical_error */
        drafted += sq->drafted, accepted += sq->accepted, emitted += sq->n_out;
    }
    if (plan->n_rounds > 0) {
        atomic_fetch_add(&w->metrics.mtp_rounds, plan->n_rounds);
        atomic_fetch_add(&w->metrics.mtp_drafted, drafted);
        atomic_fetch_add(&w->metrics.mtp_accepted, accepted);
        atomic_fetch_add(&w->metrics.decode_tokens, emitted);
    }
    return MOEQ_OK;
}

/* A group's exchange failed (a rank died or went silent): remember why; the loop ends without an abort. */
static int group_failed(moeq_worker *w) {
    moeq_err e = w->group ? moeq_engine_group_status(w->engine, w->group_why, sizeof w->group_why) : MOEQ_OK;
    if (e && !w->group_err) w->group_err = e;
    return e != MOEQ_OK;
}

/* A group rank with nothing to run still takes part in every layer's exchange (moeq_engine_step of no items). */
static int group_empty_step(moeq_worker *w) {
    char err[512] = "";
    if (moeq_engine_step(w->engine, NULL, 0, NULL, 0, err, sizeof err)) group_failed(w);
    return 0;
}

/* Plan one step, run it with its speculative rounds, sample, commit. Returns 1 when anything ran. */
static int run_step(moeq_worker *w) {
    char err[512] = "";
    moeq_sched_step plan;
    w->main_steps0 = moeq_engine_main_steps(w->engine);
    if (w->handed_back) return group_empty_step(w); /* a group's rank past its drain: serve the others only */
    if (moeq_sched_plan(w->sched, moeq_now_ms(), &plan)) return w->group ? group_empty_step(w) : 0;
    for (int i = 0; i < plan.n_released; i++) slot_clear(w, plan.released[i]);
    if (plan.n_items == 0 && plan.n_rounds == 0) return w->group ? group_empty_step(w) : 0;
    int64_t t0 = moeq_mono_ns();
    moeq_err e = run_plan(w, &plan, err, sizeof err);
    if (!e)
        moeq_sched_note_step_seconds(w->sched, (double)(moeq_mono_ns() - t0) * 1e-9,
                                     plan.n_rounds > 0 ? (double)moeq_mtp_decoder_last_draft_ns(w->mtp) * 1e-9 : 0);
    if (e && group_failed(w)) return 1; /* no abort: the step's jobs are unfinished, their batches stay pending */
    if (w->group && moeq_engine_main_steps(w->engine) == w->main_steps0)
        group_empty_step(w); /* no main pass ran (a round refused while drafting): keep the lockstep */
    if (w->group_err) return 1;
    if (e) { /* the caches of sequences of a failed step are as before it; all of them are freed anyway */
        moeq_log(MOEQ_LOG_ERROR, COMP, "step_failed", "err=%s items=%d rounds=%d reason=\"%s\"", moeq_err_str(e),
                 plan.n_items, plan.n_rounds, err);
        moeq_sched_abort(w->sched, MOEQ_CODE_ENGINE, err, moeq_now_ms());
        return 1;
    }
    moeq_sched_commit_mtp(w->sched, w->sampled, w->round_out, moeq_now_ms());
    atomic_fetch_add(&w->metrics.steps, 1);
    prefix_metrics(w);
    screen_metrics(w);
    atomic_fetch_add(&w->metrics.prefill_tokens, plan.n_prefill_tokens);
    atomic_fetch_add(&w->metrics.decode_tokens, plan.n_decode_tokens);
    return 1;
}

/* ---- results ------------------------------------------------------------------- */

static const char *result_topic(const moeq_worker *w, const moeq_job *job) {
    if (job->reply_to && moeq_worker_topic_allowed(&w->params, job->reply_to)) return job->reply_to;
    return w->params.results_topic;
}

/* The result's logprobs from the job's processor: one per kept token (a round may have drawn more). */
static moeq_result_logprob *result_logprobs(const wjob *job, int n_tokens, size_t *n) {
    *n = 0;
    if (!job->proc || !job->ej->job.logprobs) return NULL;
    int m = moeq_decode_proc_n_drawn(job->proc) < n_tokens ? moeq_decode_proc_n_drawn(job->proc) : n_tokens;
    moeq_result_logprob *lps = calloc((size_t)m + 1, sizeof *lps);
    if (!lps) return NULL; /* out of memory: the result goes without them rather than not at all */
    for (int i = 0; i < m; i++) {
        moeq_logprob lp;
        if (moeq_decode_proc_logprob(job->proc, i, &lp)) break;
        lps[i] = (moeq_result_logprob){lp.token, lp.logprob, 0, NULL, NULL};
        if (lp.n_top && (lps[i].top_tokens = malloc((size_t)lp.n_top * sizeof(int32_t))) &&
            (lps[i].top_logprobs = malloc((size_t)lp.n_top * sizeof(double)))) {
            lps[i].n_top = lp.n_top;
            memcpy(lps[i].top_tokens, lp.top_tokens, (size_t)lp.n_top * sizeof(int32_t));
            for (int k = 0; k < lp.n_top; k++) lps[i].top_logprobs[k] = lp.top_logprobs[k];
        }
        *n = (size_t)i + 1;
    }
    return lps;
}

static void free_logprobs(moeq_result_logprob *lps, size_t n) {
    for (size_t i = 0; lps && i < n; i++) free(lps[i].top_tokens), free(lps[i].top_logprobs);
    free(lps);
}

static void publish_finished(moeq_worker *w) {
    moeq_sched_finished fin;
    while (moeq_sched_next_finished(w->sched, &fin)) {
        wjob *job = fin.user;
        const worker_entry_job *ej = job->ej;
        int64_t now = moeq_now_ms();
        moeq_result r;
        memset(&r, 0, sizeof r);
        r.id = (char *)fin.key;
        r.status = fin.status;
        r.text = fin.admitted_ms ? (char *)fin.text : NULL;
        r.text_len = r.text ? fin.text_len : 0; /* bytes-exact: a token may decode to byte 0 */
        r.tokens = fin.n_tokens ? (int32_t *)fin.tokens : NULL;
        r.n_tokens = (size_t)fin.n_tokens;
        r.finish_reason = fin.finish_reason;
        r.usage.prompt_tokens = fin.n_prompt;
        r.usage.completion_tokens = fin.n_tokens;
        r.has_mtp = fin.mtp;
        r.mtp.drafted = fin.mtp_drafted;
        r.mtp.accepted = fin.mtp_accepted;
        int64_t created = ej->created_ms > 0 ? ej->created_ms : job->batch->entry.batched_ms;
        r.timings.queued_ms = job->batch->entry.batched_ms > created ? job->batch->entry.batched_ms - created : 0;
        r.timings.batched_ms = job->batch->taken_ms > job->batch->entry.batched_ms
                                   ? job->batch->taken_ms - job->batch->entry.batched_ms : 0;
        r.timings.prefill_ms = fin.first_token_ms ? fin.first_token_ms - fin.admitted_ms : 0;
        r.timings.decode_ms = fin.first_token_ms ? fin.finished_ms - fin.first_token_ms : 0;
        r.timings.total_ms = now > created ? now - created : 0;
        r.model = w->model_name;
        r.worker = w->params.worker_id;
        r.error.code = (char *)fin.error_code;
        r.error.message = (char *)fin.error_message;
        r.metadata = ej->job.metadata;
        r.metadata_len = ej->job.metadata_len;
        r.metadata_format = ej->job.format;
        char job_hash[MOEQ_JOB_HASH_SIZE]; /* from the job bytes the entry carries: no second copy of the rule */
        moeq_job_content_hash(ej->raw, ej->raw_len, job_hash);
        r.job_hash = job_hash;
        moeq_result_logprob *lps = result_logprobs(job, fin.n_tokens, &r.n_logprobs);
        r.logprobs = lps;
        moeq_wire_format fmt = ej->job.format ? ej->job.format : MOEQ_WIRE_JSON;
        char err[256] = "";
        moeq_buf_reset(&w->buf);
        moeq_err e = moeq_result_encode(&r, fmt, &w->buf, err, sizeof err);
        if (e && r.metadata) { /* metadata that cannot be transcoded: send without it rather than never */
            r.metadata = NULL;
            r.metadata_len = 0;
            moeq_buf_reset(&w->buf);
            e = moeq_result_encode(&r, fmt, &w->buf, err, sizeof err);
        }
        free_logprobs(lps, r.n_logprobs);
        const char *ct = moeq_wire_content_type(fmt);
        moeq_kafka_header h = {"content-type", ct, strlen(ct)};
        moeq_kafka_out msg = {.topic = result_topic(w, &ej->job), .partition = MOEQ_KAFKA_PARTITION_ANY,
                              .key = fin.key, .key_len = strlen(fin.key), .value = w->buf.data,
                              .value_len = w->buf.len, .headers = &h, .n_headers = 1,
                              .opaque = msg_tag(job, MSG_RESULT)};
        job->handle = fin.job;
        job->need |= MSG_RESULT;
        if (!e) e = moeq_kafka_produce(w->producer, &msg, err, sizeof err);
        if (e && worker_delivery_is_permanent(e, WORKER_DELIVERY_MAX_UNCLASSIFIED)) {
            job_undeliverable(w, job, msg.topic, e, err); /* too large, unknown topic, cannot encode */
        } else if (e) {
            moeq_log(MOEQ_LOG_WARN, COMP, "produce_failed", "job=%s err=%s reason=\"%s\"", fin.key, moeq_err_str(e), err);
            moeq_sched_delivered(w->sched, fin.job, 0); /* back in the queue; retried after the next poll */
            break;
        } else {
            job->inflight |= MSG_RESULT;
        }
        if (fin.status != MOEQ_RESULT_OK && fin.status != MOEQ_RESULT_CANCELLED && fin.status != MOEQ_RESULT_EXPIRED)
            job->state = 'F';
        atomic_fetch_add(&w->metrics.jobs_finished, 1);
        moeq_worker_metrics_observe_result(&w->metrics, &r);
    }
}

/* The replacement error result of a job whose result the broker refused for good. */
static moeq_err encode_undeliverable(moeq_worker *w, const wjob *job, char *err, size_t err_size) {
    const worker_entry_job *ej = job->ej;
    moeq_result r;
    memset(&r, 0, sizeof r);
    r.id = (char *)job_id_of(job);
    r.status = MOEQ_RESULT_ERROR;
    r.error.code = MOEQ_CODE_RESULT_UNDELIVERABLE;
    r.error.message = job->reason ? job->reason : "the result was refused by the broker";
    r.model = w->model_name;
    r.worker = w->params.worker_id;
    int64_t created = ej->created_ms > 0 ? ej->created_ms : job->batch->entry.batched_ms, now = moeq_now_ms();
    r.timings.total_ms = now > created ? now - created : 0;
    r.metadata = ej->job.metadata;
    r.metadata_len = ej->job.metadata_len;
    r.metadata_format = ej->job.format;
    char job_hash[MOEQ_JOB_HASH_SIZE];
    moeq_job_content_hash(ej->raw, ej->raw_len, job_hash);
    r.job_hash = job_hash;
    moeq_wire_format fmt = ej->job.format ? ej->job.format : MOEQ_WIRE_JSON;
    moeq_buf_reset(&w->buf);
    moeq_err e = moeq_result_encode(&r, fmt, &w->buf, err, err_size);
    if (e && r.metadata) {
        r.metadata = NULL;
        r.metadata_len = 0;
        moeq_buf_reset(&w->buf);
        e = moeq_result_encode(&r, fmt, &w->buf, err, err_size);
    }
    return e;
}

/* Produce one DLQ copy (MSG_DLQ) or replacement error result (MSG_ERROR) of a job. */
static moeq_err send_one_side(moeq_worker *w, wjob *job, int kind, const char **topic, char *err, size_t err_size) {
    const worker_entry_job *ej = job->ej;
    const char *id = job_id_of(job);
    const char *reason = job->reason ? job->reason : "dead_letter";
    moeq_kafka_header h = {"moeq-reason", reason, strlen(reason)};
    moeq_kafka_out msg = {.partition = MOEQ_KAFKA_PARTITION_ANY, .key = id, .key_len = strlen(id),
                          .headers = &h, .n_headers = 1, .opaque = msg_tag(job, kind)};
    if (kind == MSG_DLQ) {
        msg.topic = w->params.dlq_topic;
        msg.value = ej->raw;
        msg.value_len = ej->raw_len;
    } else {
        moeq_err e = encode_undeliverable(w, job, err, err_size);
        if (e) return e;
        const char *ct = moeq_wire_content_type(ej->job.format ? ej->job.format : MOEQ_WIRE_JSON);
        h = (moeq_kafka_header){"content-type", ct, strlen(ct)};
        msg.topic = w->params.results_topic;
        msg.value = w->buf.data;
        msg.value_len = w->buf.len;
    }
    *topic = msg.topic;
    return moeq_kafka_produce(w->producer, &msg, err, err_size);
}

/* Produce every DLQ copy and replacement error result that is needed and not in flight or acknowledged. */
static void send_side(moeq_worker *w) {
    if (!w->side_dirty) return;
    w->side_dirty = 0;
    for (wbatch *b = w->held; b; b = b->next)
        for (size_t i = 0; i < b->entry.n_jobs; i++) {
            wjob *job = &b->jobs[i];
            for (int kind = MSG_DLQ; kind <= MSG_ERROR; kind <<= 1) {
                if (!(job->need & kind) || ((job->acked | job->inflight) & kind)) continue;
                char err[256] = "";
                const char *topic = kind == MSG_DLQ ? w->params.dlq_topic : w->params.results_topic;
                moeq_err e = send_one_side(w, job, kind, &topic, err, sizeof err);
                if (!e) {
                    job->inflight |= (unsigned char)kind;
                } else if (worker_delivery_is_permanent(e, WORKER_DELIVERY_MAX_UNCLASSIFIED)) {
                    job->need = (unsigned char)(job->need & ~kind);
                    moeq_log(MOEQ_LOG_ERROR, COMP, kind == MSG_DLQ ? "dlq_undeliverable" : "error_result_undeliverable",
                             "job=%s topic=%s err=%s reason=\"%s\"", job_id_of(job), topic, moeq_err_str(e), err);
                    job_settle(w, job);
                } else {
                    w->side_dirty = 1; /* queue full or the like: next turn */
                    return;
                }
            }
        }
}

/* Acknowledgements Redis did not take are tried again after 50 ms, doubling to 2 s, while the process lives. */
#define ACK_RETRY_MIN_MS 50
#define ACK_RETRY_MAX_MS 2000

static int64_t ack_backoff_ms(int failures) {
    int64_t ms = ACK_RETRY_MIN_MS;
    for (int i = 1; i < failures && ms < ACK_RETRY_MAX_MS; i++) ms *= 2;
    return ms < ACK_RETRY_MAX_MS ? ms : ACK_RETRY_MAX_MS;
}

static void batch_release(moeq_worker *w, wbatch *b) {
    for (wbatch **pp = &w->held; *pp; pp = &(*pp)->next)
        if (*pp == b) {
            *pp = b->next;
            break;
        }
    w->n_held--;
    batch_free(b);
}

/*
 * One acknowledgement attempt (records, XACK, XDEL). Until Redis took it the batch stays held: its place in
 * max_batches_held is not reused and, while it fails, nothing new is taken. Returns 1 when it was taken.
 */
static int ack_one(moeq_worker *w, wbatch *b, int64_t now) {
    char err[256] = "";
    moeq_err e = worker_io_ack(w->redis, &w->params, w->params.worker_id, &b->entry, b->states, err, sizeof err);
    if (e) {
        if (b->ack_failures++ == 0) w->n_ack_failing++;
        atomic_fetch_add(&w->metrics.ack_failures, 1);
        b->ack_next_ms = now + ack_backoff_ms(b->ack_failures);
        atomic_store(&w->metrics.healthy, 0);
        moeq_log(MOEQ_LOG_WARN, COMP, "ack_failed", "entry=%s err=%s failures=%d retry_in_ms=%lld reason=\"%s\"",
                 b->entry.id, moeq_err_str(e), b->ack_failures, (long long)(b->ack_next_ms - now), err);
        return 0;
    }
    if (b->ack_failures) w->n_ack_failing--;
    atomic_fetch_add(&w->metrics.batches_acked, 1);
    moeq_log(MOEQ_LOG_INFO, COMP, "batch_acked", "stream=%s entry=%s jobs=%zu ms=%lld retries=%d", b->entry.stream,
             b->entry.id, b->entry.n_jobs, (long long)(moeq_now_ms() - b->taken_ms), b->ack_failures);
    batch_release(w, b);
    return 1;
}

/* Acknowledge every batch whose results were all delivered; after a failure, the rest wait for the next turn. */
static void ack_batches(moeq_worker *w) {
    void *user;
    while (moeq_sched_next_ackable(w->sched, &user)) {
        wbatch *b = user;
        for (size_t i = 0; i < b->entry.n_jobs; i++)
            if (b->states[i] != 'D') b->states[i] = b->jobs[i].state == 'F' ? 'F' : '-';
        b->ack_due = 1;
    }
    int64_t now = moeq_now_ms();
    for (wbatch *b = w->held, *next; b; b = next) {
        next = b->next;
        if (b->ack_due && now >= b->ack_next_ms && !ack_one(w, b, now)) break;
    }
}

/* How long the loop may wait in the producer's poll: until the next acknowledgement attempt, when one waits. */
static int poll_wait_ms(const moeq_worker *w, int ran) {
    if (ran) return 0;
    if (w->n_ack_failing) {
        int64_t next = INT64_MAX, now = moeq_now_ms();
        for (const wbatch *b = w->held; b; b = b->next)
            if (b->ack_due && b->ack_next_ms < next) next = b->ack_next_ms;
        return next <= now ? 0 : next - now > 50 ? 50 : (int)(next - now);
    }
    return moeq_sched_idle(w->sched) ? 0 : 5;
}

/* ---- timers ---------------------------------------------------------------------- */

static void read_peer(void *ctx, const char *json, size_t len) {
    moeq_worker *w = ctx;
    moeq_affinity_peer_json(w->affinity, w->params.worker_id, json, len);
}

/* Each heartbeat: the peers' advertised keys again, and a sweep of our pending list for batches handed to us. */
static void affinity_refresh(moeq_worker *w) {
    if (!w->affinity) return;
    char err[256];
    moeq_affinity_peers_clear(w->affinity);
    if (worker_io_heartbeats(w->redis, w->params.redis_prefix, read_peer, w, err, sizeof err))
        moeq_affinity_peers_clear(w->affinity); /* half a list would route by chance; none routes nothing */
    if (own_history_left(w)) return; /* the start-up history is not through yet */
    for (int p = 0; p < 4; p++) snprintf(w->own_cursors[p], sizeof w->own_cursors[p], "0");
    w->own_sweep = 1;
}

/*
 * Each heartbeat, the held batches' idle time back to 0 while this worker still owns them: a batch that runs
 * longer than visibility_timeout_ms (long documents, a slow CPU) is not reclaimed from a live worker and run
 * twice; only a worker that stops heartbeating loses its batches. One that was reclaimed meanwhile (this worker
 * stalled past the timeout) is not claimed back: it runs on here too (its results are identical) and is said.
 */
static void refresh_claims(moeq_worker *w) {
    if (w->handed_back) return; /* handed back at the drain deadline: idle already set for the next reclaim */
    for (wbatch *b = w->held; b; b = b->next) {
        if (b->ack_due || b->lost) continue;
        int ours = 1;
        char err[256] = "";
        if (worker_io_refresh_claim(w->redis, &w->params, w->params.worker_id, &b->entry, &ours, err, sizeof err))
            continue; /* Redis unreachable: the next heartbeat tries again */
        if (!ours) {
            b->lost = 1;
            moeq_log(MOEQ_LOG_WARN, COMP, "batch_reclaimed_by_another", "stream=%s entry=%s held_ms=%lld",
                     b->entry.stream, b->entry.id, (long long)(moeq_now_ms() - b->taken_ms));
        }
    }
}

static void heartbeat(moeq_worker *w, int64_t now) {
    if (now < w->next_heartbeat_ms) return;
    w->next_heartbeat_ms = now + w->params.heartbeat_interval_ms;
    moeq_sched_stats st;
    moeq_sched_get_stats(w->sched, &st);
    int64_t tokens = st.prefill_tokens + st.decode_tokens;
    if (w->last_hb_ms && now > w->last_hb_ms)
        w->tokens_per_s = (double)(tokens - w->last_hb_tokens) * 1000.0 / (double)(now - w->last_hb_ms);
    w->last_hb_tokens = tokens;
    w->last_hb_ms = now;
    char json[1792], keys[640] = "[]", group[200] = "";
    if (w->group) /* which group, generation and rank this worker is (docs/EP.md) */
        snprintf(group, sizeof group, ",\"ep_group\":\"%s\",\"ep_generation\":%lld,\"ep_rank\":%d,\"ep_ranks\":%d",
                 w->params.ep_group, (long long)worker_group_generation(w->group), worker_group_rank(w->group),
                 worker_group_ranks(w->group));
    if (w->affinity) moeq_affinity_hint_json(w->affinity, prefix_cached, w, keys, sizeof keys);
    snprintf(json, sizeof json,
             "{\"id\":\"%s\",\"model\":\"%s\",\"version\":\"%s\",\"max_seqs\":%lld,\"free_slots\":%d,\"running\":%d,"
             "\"pending\":%d,\"batches\":%d,\"tokens_per_s\":%.1f,\"jobs_finished\":%lld,\"draining\":%d,"
             "\"started_ms\":%lld,\"ts\":%lld,\"room\":%d,\"prefix_keys\":%s%s}",
             w->params.worker_id, w->model_name, "0.1.0", (long long)w->params.max_seqs, st.free_slots, st.running,
             st.pending, w->n_held, w->tokens_per_s, (long long)st.jobs_finished, (int)w->stop,
             (long long)w->started_ms, (long long)now, want_batch(w) ? moeq_sched_free_capacity(w->sched) : 0, keys,
             group);
    affinity_refresh(w);
    char err[256];
    refresh_claims(w);
    moeq_err e = worker_io_heartbeat(w->redis, w->params.redis_prefix, w->params.worker_id, json, 3 * w->params.heartbeat_interval_ms, err,
                                     sizeof err);
    atomic_store(&w->metrics.healthy, e == MOEQ_OK);
    atomic_store(&w->metrics.sequences_active, st.running);
    atomic_store(&w->metrics.sequences_active_max, st.running_max);
    atomic_store(&w->metrics.slots_free, st.free_slots);
    atomic_store(&w->metrics.requests_waiting, st.pending);
    atomic_store(&w->metrics.kv_reserved_tokens, st.kv_reserved_tokens);
    atomic_store(&w->metrics.kv_capacity_tokens, w->params.kv_cache_tokens);
    worker_device_metrics(w);
    expert_stats(w, now, 0);
}

/*
 * Every visibility_timeout_ms: trim what is acknowledged but still in the streams and forget consumers idle
 * for 10 visibility timeouts with nothing pending (worker_io_sweep). Acknowledged entries are deleted as they
 * are acknowledged; this catches what an older worker or an operator left.
 */
static void sweep(moeq_worker *w, int64_t now) {
    if (now < w->next_sweep_ms) return;
    w->next_sweep_ms = now + w->params.visibility_timeout_ms;
    for (int p = 0; p < 4; p++) {
        char err[256] = "";
        long long trimmed = 0, forgotten = 0;
        moeq_err e = worker_io_sweep(w->redis, &w->params, p, 10 * w->params.visibility_timeout_ms, w->params.worker_id,
                                     &trimmed, &forgotten, err, sizeof err);
        if (e) {
            moeq_log(MOEQ_LOG_DEBUG, COMP, "sweep_failed", "err=%s reason=\"%s\"", moeq_err_str(e), err);
            return;
        }
        if (trimmed || forgotten)
            moeq_log(MOEQ_LOG_INFO, COMP, "swept", "priority=%d trimmed=%lld consumers_forgotten=%lld", p, trimmed,
                     forgotten);
    }
}

static void on_cancel_notice(const char *id, void *opaque) {
    moeq_worker *w = opaque;
    if (moeq_sched_cancel(w->sched, id) == MOEQ_OK) moeq_log(MOEQ_LOG_INFO, COMP, "job_cancelled", "job=%s via=stream", id);
}

/*
 * Cancels. Every turn while jobs are pending or running: the cancel stream
 * (<prefix>:cancels, one non-blocking XREAD after a cursor), so a cancel
 * written before this turn's engine step stops its job at that step's plan —
 * the job takes part in at most the one step that was running when the
 * cancel was written. Every cancel_poll_ms, as a fallback (a coordinator
 * that does not write the stream, entries trimmed away): the held jobs'
 * records.
 */
static void poll_cancels(moeq_worker *w, int64_t now) {
    moeq_sched_stats st;
    moeq_sched_get_stats(w->sched, &st);
    if (st.running + st.pending > 0 || !w->cancel_cursor[0]) {
        char err[256];
        moeq_err e = worker_io_cancels(w->redis, w->params.redis_prefix, w->cancel_cursor, sizeof w->cancel_cursor,
                                       on_cancel_notice, w, err, sizeof err);
        if (e) moeq_log(MOEQ_LOG_DEBUG, COMP, "cancel_read_failed", "err=%s reason=\"%s\"", moeq_err_str(e), err);
    }
    if (now < w->next_cancel_ms) return;
    w->next_cancel_ms = now + w->params.cancel_poll_ms;
    for (wbatch *b = w->held; b; b = b->next) {
        if (b->ack_due) continue; /* every job of it is finished */
        size_t n = b->entry.n_jobs;
        const char *ids[256];
        char states[256];
        if (n > 256) n = 256;
        for (size_t i = 0; i < n; i++) ids[i] = job_id(&b->entry.jobs[i]);
        if (n == 0 || worker_io_job_states(w->redis, w->params.redis_prefix, ids, n, states, NULL, 0) != MOEQ_OK) continue;
        for (size_t i = 0; i < n; i++)
            if (states[i] == 'C' && moeq_sched_cancel(w->sched, ids[i]) == MOEQ_OK)
                moeq_log(MOEQ_LOG_INFO, COMP, "job_cancelled", "job=%s", ids[i]);
    }
}

/* ---- the loop --------------------------------------------------------------------- */

static void hand_back_all(moeq_worker *w) {
    int64_t now = moeq_now_ms();
    for (wbatch *b = w->held, *next; b; b = next) {
        next = b->next;
        if (b->ack_due) ack_one(w, b, now); /* finished: one last try rather than having it run again */
    }
    for (wbatch *b = w->held; b; b = b->next) {
        char err[256];
        if (worker_io_hand_back(w->redis, &w->params, w->params.worker_id, &b->entry, err, sizeof err) == MOEQ_OK)
            atomic_fetch_add(&w->metrics.batches_handed_back, 1);
        moeq_log(MOEQ_LOG_WARN, COMP, "handed_back", "stream=%s entry=%s", b->entry.stream, b->entry.id);
    }
}

/*
 * The end of a group's tick: every rank says whether it drains, is done, has work. One rank draining makes
 * every rank drain (the group is one model); the group ends when every rank is done. Returns 1 to end.
 */
static int group_tick(moeq_worker *w) {
    int idle = moeq_sched_idle(w->sched);
    int done = w->handed_back || (w->stop && w->n_held == 0 && idle);
    unsigned mine = (w->stop ? WORKER_GROUP_STOPPING : 0) | (done ? WORKER_GROUP_DONE : 0) |
                    (!idle && !done ? WORKER_GROUP_BUSY : 0);
    unsigned any = 0, all = 0;
    int from = -1;
    moeq_err e = worker_group_agree(w->group, mine, &any, &all, &from, w->group_why, sizeof w->group_why);
    if (e) {
        w->group_err = e;
        return 1;
    }
    if ((any & WORKER_GROUP_STOPPING) && !w->stop) {
        moeq_log(MOEQ_LOG_INFO, COMP, "group_draining", "group=%s from_rank=%d", w->params.ep_group, from);
        w->stop = 1;
    }
    w->group_idle = !(any & WORKER_GROUP_BUSY);
    return (all & WORKER_GROUP_DONE) ? 1 : 0;
}

/*
 * The group failed mid-run: results of jobs that finished before go out and their batches are acknowledged;
 * the failed step's jobs are not finished, so their batches stay pending for this worker id (taken back at
 * once by its next start) or for anyone after visibility_timeout_ms. A supervisor restarts every rank and the
 * group forms again under a new generation.
 */
/*
 * Jobs whose results went out, in batches not yet acknowledged (a rolling
 * batch finishes its jobs one by one): their records are marked done at once
 * (the entry stays pending until every job is out), so a worker that takes
 * the batch over after this one dies (kill -9, a failed group) skips them
 * (admit_entry) instead of answering them again. One pipeline per batch with
 * news, after the loop's acknowledgements. Returns how many were marked.
 */
static int mark_delivered_jobs(moeq_worker *w) {
    int marked = 0;
    for (wbatch *b = w->held; b; b = b->next) {
        if (b->ack_due) continue; /* the acknowledgement writes every record */
        size_t n_new = 0;
        for (size_t i = 0; i < b->entry.n_jobs; i++) n_new += b->jobs[i].delivered && !b->jobs[i].marked;
        if (!n_new) continue;
        char *pick = calloc(b->entry.n_jobs, 1), *st = calloc(b->entry.n_jobs, 1);
        for (size_t i = 0; pick && st && i < b->entry.n_jobs; i++)
            pick[i] = b->jobs[i].delivered && !b->jobs[i].marked && b->states[i] != 'D', st[i] = b->jobs[i].state;
        char err[256] = "";
        if (pick && st && worker_io_mark_finished(w->redis, &w->params, w->params.worker_id, &b->entry, st, pick, err,
                                                  sizeof err) == MOEQ_OK) {
            for (size_t i = 0; i < b->entry.n_jobs; i++) b->jobs[i].marked |= b->jobs[i].delivered;
            marked += (int)n_new;
        } else {
            moeq_log(MOEQ_LOG_WARN, COMP, "mark_done_failed", "entry=%s jobs=%zu reason=\"%s\"", b->entry.id, n_new,
                     err);
        }
        free(pick), free(st);
    }
    return marked;
}

static moeq_err group_abort(moeq_worker *w, char *errstr, size_t errstr_size) {
    moeq_kafka_producer_flush(w->producer, 2000, NULL, 0);
    ack_batches(w);
    int marked = mark_delivered_jobs(w);
    char err[256];
    worker_io_heartbeat(w->redis, w->params.redis_prefix, w->params.worker_id, NULL, 0, err, sizeof err);
    moeq_log(MOEQ_LOG_ERROR, COMP, "ep_group_failed", "group=%s generation=%lld rank=%d ranks=%d batches_pending=%d "
             "jobs_marked_done=%d err=%s reason=\"%s\"", w->params.ep_group, (long long)worker_group_generation(w->group),
             worker_group_rank(w->group), worker_group_ranks(w->group), w->n_held, marked, moeq_err_str(w->group_err),
             w->group_why);
    return moeq_errf(w->group_err, errstr, errstr_size,
                     "expert-parallel group %s (generation %lld, rank %d of %d) failed: %s; %d batch(es) left pending",
                     w->params.ep_group, (long long)worker_group_generation(w->group), worker_group_rank(w->group),
                     worker_group_ranks(w->group), w->group_why, w->n_held);
}

moeq_err moeq_worker_run(moeq_worker *w, char *errstr, size_t errstr_size) {
    if (!w) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "NULL worker");
    moeq_log(MOEQ_LOG_INFO, COMP, "started", "id=%s model=%s max_seqs=%lld", w->params.worker_id, w->model_name,
             (long long)w->params.max_seqs);
    int64_t drain_deadline = 0;
    for (;;) {
        int64_t now = moeq_now_ms();
        if (w->stop && !drain_deadline) {
            drain_deadline = now + w->params.drain_timeout_ms;
            atomic_store(&w->metrics.draining, 1);
            moeq_log(MOEQ_LOG_INFO, COMP, "draining", "batches=%d timeout_ms=%lld", w->n_held,
                     (long long)w->params.drain_timeout_ms);
        }
        if (!w->group && w->stop && w->n_held == 0 && moeq_sched_idle(w->sched)) break;
        if (drain_deadline && now >= drain_deadline && !w->handed_back) {
            hand_back_all(w);
            if (!w->group) break;
            w->handed_back = 1; /* a group's rank goes on with empty steps until every rank is done */
        }
        moeq_health_tick(w->health, now);
        heartbeat(w, now);
        sweep(w, now);
        poll_cancels(w, now);
        if (want_batch(w)) {
            char err[512] = "";
            moeq_err e = take_batches(w, err, sizeof err);
            if (e) {
                atomic_store(&w->metrics.healthy, 0);
                moeq_log(MOEQ_LOG_WARN, COMP, "redis_error", "err=%s reason=\"%s\"", moeq_err_str(e), err);
                if (!moeq_err_is_retriable(e) && e != MOEQ_ERR_INVALID_ARG && e != MOEQ_ERR_NOT_FOUND) usleep(100000);
                else usleep(200000);
            }
        }
        int ran = run_step(w);
        if (w->group_err) break;
        publish_finished(w);
        send_side(w);
        moeq_kafka_producer_poll(w->producer, poll_wait_ms(w, ran));
        ack_batches(w);
        mark_delivered_jobs(w);
        if (w->group && group_tick(w)) break;
    }
    expert_stats(w, moeq_now_ms(), 1);
    if (w->group_err) return group_abort(w, errstr, errstr_size);
    moeq_kafka_producer_flush(w->producer, 5000, NULL, 0);
    ack_batches(w);
    char err[256];
    worker_io_heartbeat(w->redis, w->params.redis_prefix, w->params.worker_id, NULL, 0, err, sizeof err);
    moeq_log(MOEQ_LOG_INFO, COMP, "stopped", "id=%s", w->params.worker_id);
    return MOEQ_OK;
}
