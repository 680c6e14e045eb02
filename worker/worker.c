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

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics.h"
#include "moeq/engine.h"
#include "moeq/kafka.h"
#include "moeq/log.h"
#include "moeq/redis.h"
#include "moeq/result.h"
#include "moeq/tokenizer.h"
#include "moeq/util.h"
#include "scheduler.h"
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
} wjob;

struct wbatch {
    worker_entry entry;
    wjob *jobs;                    /* entry.n_jobs                               */
    char *states;                  /* per job, for worker_io_ack                 */
    int64_t taken_ms;
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
    moeq_worker_metrics metrics;
    char model_name[128];
    int vocab;

    slot_state *slots;
    moeq_step_item *items;
    float *logits;
    int32_t *sampled;
    moeq_buf buf;

    wbatch *held;                  /* batches taken, not yet acknowledged      */
    int n_held;
    volatile sig_atomic_t stop;
    int64_t next_reclaim_ms, next_heartbeat_ms, next_cancel_ms, started_ms;
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

static void on_delivery(const moeq_kafka_delivery *d, void *cb_opaque) {
    moeq_worker *w = cb_opaque;
    if (!d->opaque) return; /* dead-letter copies are not tracked */
    int handle = (int)((intptr_t)d->opaque - 1);
    if (d->err) {
        atomic_fetch_add(&w->metrics.results_failed, 1);
        moeq_log(MOEQ_LOG_WARN, COMP, "result_failed", "topic=%s err=%s reason=\"%s\"", d->topic,
                 moeq_err_str(d->err), d->errstr ? d->errstr : "");
    }
    moeq_sched_delivered(w->sched, handle, d->err == MOEQ_OK);
}

/* ---- construction ---------------------------------------------------------------- */

static void default_worker_id(moeq_worker_params *p) {
    if (p->worker_id[0]) return;
    char host[64] = "worker";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(p->worker_id, sizeof p->worker_id, "%s-%d", host, (int)getpid());
}

static moeq_err open_engine(moeq_worker *w, char *errstr, size_t errstr_size) {
    const moeq_worker_params *p = &w->params;
    moeq_err err = moeq_model_load(p->model, NULL, &w->model, errstr, errstr_size);
    if (err) return err;
    char e2[256];
    if (moeq_tokenizer_load(p->model, &w->tok, e2, sizeof e2) != MOEQ_OK) {
        w->tok = NULL;
        moeq_log(MOEQ_LOG_WARN, COMP, "no_tokenizer", "model=%s reason=\"%s\"", p->model, e2);
    }
    moeq_engine_params ep = moeq_engine_default_params();
    ep.max_seqs = (int)p->max_seqs;
    ep.max_step_tokens = (int)p->max_step_tokens;
    ep.kv_cache_tokens = p->kv_cache_tokens;
    ep.n_threads = (int)p->n_threads;
    if ((err = moeq_engine_new(w->model, &ep, &w->engine, errstr, errstr_size))) return err;
    w->vocab = moeq_model_get_config(w->model)->vocab_size;
    const char *base = strrchr(p->model, '/');
    snprintf(w->model_name, sizeof w->model_name, "%.127s", base && base[1] ? base + 1 : p->model);

    int32_t eos = w->tok && moeq_tokenizer_eos_id(w->tok) >= 0 ? moeq_tokenizer_eos_id(w->tok)
                                                               : moeq_model_get_config(w->model)->eos_token_id;
    moeq_sched_params sp = moeq_sched_default_params();
    sp.max_seqs = (int)p->max_seqs;
    sp.max_step_tokens = (int)p->max_step_tokens;
    sp.kv_cache_tokens = p->kv_cache_tokens;
    sp.kv_block_tokens = ep.kv_block_tokens;
    sp.stop_ids = &eos;
    sp.n_stop_ids = eos >= 0 ? 1 : 0;
    if ((err = moeq_sched_new(&sp, detok, w, &w->sched, errstr, errstr_size))) return err;

    size_t n = (size_t)p->max_seqs;
    w->slots = calloc(n, sizeof *w->slots);
    w->items = calloc(2 * n, sizeof *w->items);
    w->sampled = calloc(2 * n, sizeof *w->sampled);
    w->logits = malloc(2 * n * (size_t)w->vocab * sizeof *w->logits);
    if (!w->slots || !w->items || !w->sampled || !w->logits)
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
    if ((err = open_engine(w, errstr, errstr_size)) || (err = open_io(w, kafka, redis, errstr, errstr_size))) {
        moeq_worker_destroy(w);
        return err;
    }
    if (w->params.metrics_port > 0 &&
        (err = moeq_worker_http_start(&w->metrics, w->params.worker_id, (int)w->params.metrics_port, &w->http, errstr,
                                      errstr_size))) {
        moeq_worker_destroy(w);
        return err;
    }
    w->started_ms = moeq_now_ms();
    *out = w;
    return MOEQ_OK;
}

static void batch_free(wbatch *b) {
    if (!b) return;
    for (size_t i = 0; i < b->entry.n_jobs; i++) moeq_tokenizer_stream_destroy(b->jobs[i].stream);
    free(b->jobs);
    free(b->states);
    worker_entry_free(&b->entry);
    free(b);
}

void moeq_worker_destroy(moeq_worker *w) {
    if (!w) return;
    if (g_signal_worker == w) g_signal_worker = NULL;
    moeq_worker_http_stop(w->http);
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
    moeq_engine_destroy(w->engine);
    moeq_tokenizer_destroy(w->tok);
    moeq_model_destroy(w->model);
    free(w->slots);
    free(w->items);
    free(w->sampled);
    free(w->logits);
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
            s->error_code = "dead_letter";
            s->error_message = why[i];
        } else if (ej->bad) {
            s->error_code = "invalid_job";
            s->error_message = ej->bad;
        } else if (!ej->tokens && tokenize_job(w, ej, why[i], sizeof why[i]) != MOEQ_OK) {
            s->error_code = "tokenize";
            s->error_message = why[i];
        }
        if (s->error_code) job->state = 'F';
        s->prompt = ej->tokens;
        s->n_prompt = ej->n_tokens;
    }
    if (dead) {
        atomic_fetch_add(&w->metrics.batches_dead_lettered, 1);
        for (size_t i = 0; i < n; i++) {
            worker_entry_job *ej = &b->entry.jobs[i];
            if (b->states[i] == 'D' || !ej->raw) continue;
            moeq_kafka_header h = {"moeq-reason", why[i], strlen(why[i])};
            moeq_kafka_out msg = {.topic = w->params.dlq_topic, .partition = MOEQ_KAFKA_PARTITION_ANY,
                                  .key = job_id(ej), .key_len = strlen(job_id(ej)), .value = ej->raw,
                                  .value_len = ej->raw_len, .headers = &h, .n_headers = 1};
            moeq_kafka_produce(w->producer, &msg, NULL, 0);
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
    if (reclaimed) atomic_fetch_add(&w->metrics.batches_reclaimed, 1);
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
    return !w->stop && w->n_held < w->params.max_batches_held && moeq_sched_free_capacity(w->sched) > 0;
}

static moeq_err take_batches(moeq_worker *w, char *errstr, size_t errstr_size) {
    worker_entry entries[MAX_TAKE];
    size_t n = 0;
    moeq_err err = MOEQ_OK;
    int64_t now = moeq_now_ms();
    if (now >= w->next_reclaim_ms) {
        w->next_reclaim_ms = now + (w->params.visibility_timeout_ms / 4 > 500 ? w->params.visibility_timeout_ms / 4 : 500);
        if ((err = worker_io_reclaim(w->redis, &w->params, &entries[0], &n, errstr, errstr_size))) return err;
        if (n) {
            err = admit_entry(w, &entries[0], 1, errstr, errstr_size);
            worker_entry_free(&entries[0]);
            return err;
        }
    }
    int idle = moeq_sched_idle(w->sched) && w->n_held == 0;
    int block = idle ? (int)w->params.block_ms : 0;
    int64_t until_reclaim = w->next_reclaim_ms - now;
    if (block > until_reclaim) block = until_reclaim > 1 ? (int)until_reclaim : 1;
    size_t room = (size_t)(w->params.max_batches_held - w->n_held);
    if (room > MAX_TAKE) room = MAX_TAKE;
    if ((err = worker_io_take(w->redis, &w->params, block, entries, room, &n, errstr, errstr_size))) return err;
    for (size_t i = 0; i < n; i++) {
        if (!err) err = admit_entry(w, &entries[i], 0, errstr, errstr_size);
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

static void slot_clear(moeq_worker *w, int slot) {
    slot_state *s = &w->slots[slot];
    if (s->seq >= 0) moeq_engine_seq_free(w->engine, s->seq);
    moeq_sampler_destroy(s->sampler);
    s->seq = -1;
    s->sampler = NULL;
}

static moeq_err slot_open(moeq_worker *w, const moeq_sched_item *it, char *errstr, size_t errstr_size) {
    slot_state *s = &w->slots[it->slot];
    slot_clear(w, it->slot);
    const wjob *job = it->user;
    moeq_sampling_params sp = sampling_for(&job->ej->job);
    moeq_err err = moeq_sampler_new(&sp, w->vocab, &s->sampler);
    if (err) return moeq_errf(err, errstr, errstr_size, "sampler for job %s", job->ej->job.id);
    if ((err = moeq_engine_seq_new(w->engine, &s->seq)))
        return moeq_errf(err, errstr, errstr_size, "no engine sequence for job %s", job->ej->job.id);
    return MOEQ_OK;
}

/* Plan one step, run it, sample, commit. Returns 1 when a step ran. */
static int run_step(moeq_worker *w) {
    char err[512] = "";
    moeq_sched_step plan;
    int64_t now = moeq_now_ms();
    if (moeq_sched_plan(w->sched, now, &plan)) return 0;
    for (int i = 0; i < plan.n_released; i++) slot_clear(w, plan.released[i]);
    if (plan.n_items == 0) return 0;
    moeq_err e = MOEQ_OK;
    for (int i = 0; i < plan.n_items && !e; i++) {
        const moeq_sched_item *it = &plan.items[i];
        if (it->new_seq) e = slot_open(w, it, err, sizeof err);
        w->items[i] = (moeq_step_item){w->slots[it->slot].seq, it->tokens, it->n_tokens, 0};
    }
    int64_t t0 = moeq_mono_ns();
    if (!e) e = moeq_engine_step(w->engine, w->items, plan.n_items, w->logits, (size_t)plan.n_items, err, sizeof err);
    atomic_fetch_add(&w->metrics.engine_ns, moeq_mono_ns() - t0);
    if (e) {
        moeq_log(MOEQ_LOG_ERROR, COMP, "step_failed", "err=%s items=%d reason=\"%s\"", moeq_err_str(e), plan.n_items, err);
        moeq_sched_abort(w->sched, "engine", err, moeq_now_ms());
        return 1;
    }
    for (int i = 0; i < plan.n_items; i++) {
        const moeq_sched_item *it = &plan.items[i];
        if (!it->sample) continue;
        w->sampled[i] = moeq_sampler_sample(w->slots[it->slot].sampler, w->logits + (size_t)i * w->vocab);
        wjob *job = it->user;
        if (!job->got_first) {
            job->got_first = 1;
            int64_t ttft = moeq_now_ms() - job->batch->taken_ms;
            atomic_fetch_add(&w->metrics.ttft_ms_sum, ttft);
            atomic_fetch_add(&w->metrics.ttft_count, 1);
        }
    }
    moeq_sched_commit(w->sched, w->sampled, moeq_now_ms());
    atomic_fetch_add(&w->metrics.steps, 1);
    atomic_fetch_add(&w->metrics.prefill_tokens, plan.n_prefill_tokens);
    atomic_fetch_add(&w->metrics.decode_tokens, plan.n_decode_tokens);
    return 1;
}

/* ---- results ------------------------------------------------------------------- */

static const char *result_topic(const moeq_worker *w, const moeq_job *job) {
    if (job->reply_to && moeq_worker_topic_allowed(&w->params, job->reply_to)) return job->reply_to;
    return w->params.results_topic;
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
        r.tokens = fin.n_tokens ? (int32_t *)fin.tokens : NULL;
        r.n_tokens = (size_t)fin.n_tokens;
        r.finish_reason = fin.finish_reason;
        r.usage.prompt_tokens = fin.n_prompt;
        r.usage.completion_tokens = fin.n_tokens;
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
        const char *ct = moeq_wire_content_type(fmt);
        moeq_kafka_header h = {"content-type", ct, strlen(ct)};
        moeq_kafka_out msg = {.topic = result_topic(w, &ej->job), .partition = MOEQ_KAFKA_PARTITION_ANY,
                              .key = fin.key, .key_len = strlen(fin.key), .value = w->buf.data,
                              .value_len = w->buf.len, .headers = &h, .n_headers = 1,
                              .opaque = (void *)(intptr_t)(fin.job + 1)};
        if (!e) e = moeq_kafka_produce(w->producer, &msg, err, sizeof err);
        if (e) {
            moeq_log(MOEQ_LOG_WARN, COMP, "produce_failed", "job=%s err=%s reason=\"%s\"", fin.key, moeq_err_str(e), err);
            moeq_sched_delivered(w->sched, fin.job, 0); /* back in the queue; retried after the next poll */
            break;
        }
        if (fin.status != MOEQ_RESULT_OK && fin.status != MOEQ_RESULT_CANCELLED && fin.status != MOEQ_RESULT_EXPIRED)
            job->state = 'F';
        atomic_fetch_add(&w->metrics.jobs_finished, 1);
        moeq_worker_metrics_observe_latency(&w->metrics, r.timings.total_ms);
    }
}

/* Acknowledge every batch whose results were all delivered. */
static void ack_batches(moeq_worker *w) {
    void *user;
    while (moeq_sched_next_ackable(w->sched, &user)) {
        wbatch *b = user;
        for (size_t i = 0; i < b->entry.n_jobs; i++)
            if (b->states[i] != 'D') b->states[i] = b->jobs[i].state == 'F' ? 'F' : '-';
        char err[256] = "";
        moeq_err e = worker_io_ack(w->redis, &w->params, w->params.worker_id, &b->entry, b->states, err, sizeof err);
        if (e) /* the entry stays pending; after the visibility timeout a worker reclaims it and skips done jobs */
            moeq_log(MOEQ_LOG_WARN, COMP, "ack_failed", "entry=%s err=%s reason=\"%s\"", b->entry.id, moeq_err_str(e), err);
        else
            atomic_fetch_add(&w->metrics.batches_acked, 1);
        moeq_log(MOEQ_LOG_INFO, COMP, "batch_acked", "stream=%s entry=%s jobs=%zu ms=%lld", b->entry.stream, b->entry.id,
                 b->entry.n_jobs, (long long)(moeq_now_ms() - b->taken_ms));
        for (wbatch **pp = &w->held; *pp; pp = &(*pp)->next)
            if (*pp == b) {
                *pp = b->next;
                break;
            }
        w->n_held--;
        batch_free(b);
    }
}

/* ---- timers ---------------------------------------------------------------------- */

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
    char json[768];
    snprintf(json, sizeof json,
             "{\"id\":\"%s\",\"model\":\"%s\",\"version\":\"%s\",\"max_seqs\":%lld,\"free_slots\":%d,\"running\":%d,"
             "\"pending\":%d,\"batches\":%d,\"tokens_per_s\":%.1f,\"jobs_finished\":%lld,\"draining\":%d,"
             "\"started_ms\":%lld,\"ts\":%lld}",
             w->params.worker_id, w->model_name, "0.1.0", (long long)w->params.max_seqs, st.free_slots, st.running,
             st.pending, w->n_held, w->tokens_per_s, (long long)st.jobs_finished, (int)w->stop,
             (long long)w->started_ms, (long long)now);
    char err[256];
    moeq_err e = worker_io_heartbeat(w->redis, w->params.redis_prefix, w->params.worker_id, json, 3 * w->params.heartbeat_interval_ms, err,
                                     sizeof err);
    atomic_store(&w->metrics.healthy, e == MOEQ_OK);
    atomic_store(&w->metrics.sequences_active, st.running);
    atomic_store(&w->metrics.slots_free, st.free_slots);
}

/* Check held, unfinished jobs' records for a cancel; the scheduler stops them at its next plan. */
static void poll_cancels(moeq_worker *w, int64_t now) {
    if (now < w->next_cancel_ms) return;
    w->next_cancel_ms = now + w->params.cancel_poll_ms;
    for (wbatch *b = w->held; b; b = b->next) {
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
    for (wbatch *b = w->held; b; b = b->next) {
        char err[256];
        if (worker_io_hand_back(w->redis, &w->params, w->params.worker_id, &b->entry, err, sizeof err) == MOEQ_OK)
            atomic_fetch_add(&w->metrics.batches_handed_back, 1);
        moeq_log(MOEQ_LOG_WARN, COMP, "handed_back", "stream=%s entry=%s", b->entry.stream, b->entry.id);
    }
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
        if (w->stop && w->n_held == 0 && moeq_sched_idle(w->sched)) break;
        if (drain_deadline && now >= drain_deadline) {
            hand_back_all(w);
            break;
        }
        heartbeat(w, now);
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
        publish_finished(w);
        moeq_kafka_producer_poll(w->producer, ran ? 0 : (moeq_sched_idle(w->sched) ? 0 : 5));
        ack_batches(w);
    }
    moeq_kafka_producer_flush(w->producer, 5000, NULL, 0);
    ack_batches(w);
    char err[256];
    worker_io_heartbeat(w->redis, w->params.redis_prefix, w->params.worker_id, NULL, 0, err, sizeof err);
    moeq_log(MOEQ_LOG_INFO, COMP, "stopped", "id=%s", w->params.worker_id);
    return MOEQ_OK;
}
