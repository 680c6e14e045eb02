/*
 * coordinator.c — the loop: poll Kafka, decide (intake), bucket (batcher),
 * write batches (store), answer rejected/expired/cancelled jobs (producer),
 * commit each partition's low-water mark (offsets), apply back-pressure.
 *
 * Invariant: a job's offset is marked done only when the job is durable —
 * its batch acknowledged by Redis (or a record already existed: the dedupe
 * guard), or its error/expired/cancelled result (and dead letter) are
 * acknowledged by the broker. Only done offsets advance the committable
 * low-water mark, so a kill -9 at any instant loses nothing; what was not
 * committed is redelivered and the guard refuses what was already enqueued.
 *
 * Jobs live in `slots` (index + generation = the batcher handle) holding
 * the Kafka message itself until the job is durable: the batch entry and the
 * dead letter use its bytes without copying them.
 *
 * One id, one job: a job whose id is held by a job still in the batcher, or
 * already has a record in Redis (the store's guard, which also refuses a
 * second copy inside one batch write), is a duplicate. A redelivery of the
 * same message is settled silently; any other reuse of the id is answered
 * with a `duplicate` dead letter naming the earlier job — never with a
 * result, which would replace the real one on a compacted results topic.
 */
#include "coordinator.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batcher.h"
#include "intake.h"
#include "moeq/batch_entry.h"
#include "moeq/health.h"
#include "moeq/kafka.h"
#include "moeq/log.h"
#include "moeq/model_config.h"
#include "moeq/redis.h"
#include "moeq/tokenizer.h"
#include "moeq/util.h"
#include "offsets.h"
#include "instance.h"
#include "store.h"

#define COMP "coordinator"

enum { OUT_RESULT = 1, OUT_DLQ = 2 };

typedef struct slot {
    uint32_t gen;
    int used;
    moeq_kafka_msg *msg; /* owned until the job is durable or answered */
    char *id;            /* MOEQ_JOB_ID_HARD_MAX + 1 bytes, kept across reuse: the batcher borrows it,
                            so it must not move when the slot array grows */
    size_t id_len;
    char hash[MOEQ_JOB_HASH_SIZE]; /* content hash of the message value */
    moeq_tokens toks;    /* prompt ids (reused); has_tokens 0 = estimated length */
    int has_tokens;
    int64_t kafka_ts, arrival_ms;
    moeq_wire_format format;
    char result_topic[256];
    int outs;            /* OUT_* deliveries outstanding */
    int resend;          /* OUT_* to produce again (a failed delivery) */
    moeq_buf result;     /* encoded result, kept until delivered */
    char code[32], field[64], reason[512]; /* dead-letter headers */
    char dup_src[320], dup_ms[24], dup_same[8]; /* a `duplicate` dead letter's: dup_same "" = not one */
    uint32_t next_free;
} slot;

struct moeq_coordinator {
    moeq_coordinator_params p;
    moeq_intake_ctx ictx;
    moeq_tokenizer *tok;
    moeq_schema_check *schemas;   /* response_format checks at intake, by content */
    moeq_kafka_consumer *consumer;
    moeq_kafka_producer *producer;
    moeq_instance *instance;       /* the auto static member slot, held for the process life */
    moeq_store *store;
    moeq_batcher *batcher;
    moeq_offsets *offsets;
    moeq_intake in;
    slot *slots;
    uint32_t n_slots, cap_slots, free_head, used;
    const moeq_batch_plan **to_write; /* closed batches not yet written, oldest first */
    size_t n_to_write, cap_to_write;
    int64_t stuck_retry_ms;       /* after a Redis error, no write before this */
    moeq_batch_entry_job *ejobs;
    moeq_store_dup *dups;
    uint64_t *rem;
    char (*srcs)[320];    /* topic/partition/offset of each job of a write */
    const char **src_ptrs;
    int paused, reapply_pause, stored_since_commit;
    uint64_t commit_failures_seen; /* moeq_kafka_consumer_commit_failures at the last commit */
    size_t n_resend;      /* slots with a failed delivery to produce again */
    int redis_fail_streak; /* consecutive failed write rounds */
    moeq_err fatal;       /* set when the loop must stop (out of memory)   */
    char topics_buf[1024 + 256];
    int64_t next_commit_ms, next_pending_ms;
    moeq_coord_stats st;
    moeq_coord_stats snap;
    pthread_mutex_t snap_mu;
    struct MHD_Daemon *http;
    moeq_health *health;          /* /livez, /readyz: loop ticks, broker and Redis probes */
    moeq_redis_probe *redis_probe;
};

/* ---- slots ----------------------------------------------------------------- */

#define NO_SLOT UINT32_MAX

static uint64_t handle_of(const moeq_coordinator *c, uint32_t i) {
    return ((uint64_t)(c->slots[i].gen & 0x3fffffff) << 32) | i;
}

static slot *slot_of(moeq_coordinator *c, uint64_t h) {
    uint32_t i = (uint32_t)h;
    if (i >= c->n_slots) return NULL;
    slot *s = &c->slots[i];
    return s->used && (s->gen & 0x3fffffff) == (uint32_t)(h >> 32) ? s : NULL;
}

static uint32_t slot_get(moeq_coordinator *c) {
    uint32_t i = c->free_head;
    if (i != NO_SLOT) {
        c->free_head = c->slots[i].next_free;
    } else {
        if (c->n_slots == c->cap_slots) {
            uint32_t cap = c->cap_slots ? c->cap_slots * 2 : 1024;
            slot *v = realloc(c->slots, cap * sizeof(*v));
            if (!v) return NO_SLOT;
            memset(v + c->cap_slots, 0, (cap - c->cap_slots) * sizeof(*v));
            c->slots = v;
            c->cap_slots = cap;
        }
        i = c->n_slots++;
    }
    slot *s = &c->slots[i];
    if (!s->id && !(s->id = malloc(MOEQ_JOB_ID_HARD_MAX + 1))) {
        s->next_free = c->free_head;
        c->free_head = i;
        return NO_SLOT;
    }
    s->used = 1;
    s->msg = NULL;
    s->dup_same[0] = 0;
    s->outs = s->resend = 0;
    s->has_tokens = 0;
    s->toks.n = 0;
    c->used++;
    return i;
}

static void slot_free(moeq_coordinator *c, slot *s) {
    if (s->resend) c->n_resend--;
    s->resend = 0;
    moeq_kafka_msg_destroy(s->msg);
    s->msg = NULL;
    s->used = 0;
    s->gen++;
    s->next_free = c->free_head;
    c->free_head = (uint32_t)(s - c->slots);
    c->used--;
}

/* The job is durable or answered: its offset may be committed. */
static void job_done(moeq_coordinator *c, slot *s) {
    const moeq_kafka_msg *m = s->msg;
    moeq_offsets_done(c->offsets, moeq_kafka_msg_topic(m), moeq_kafka_msg_partition(m), moeq_kafka_msg_offset(m));
    slot_free(c, s);
}

/* ---- producing results and dead letters -------------------------------------- */

static void *opaque_of(moeq_coordinator *c, slot *s, int which) {
    uint64_t h = handle_of(c, (uint32_t)(s - c->slots));
    return (void *)(uintptr_t)((h << 1) | (which == OUT_DLQ));
}

static int produce_out(moeq_coordinator *c, slot *s, int which) {
    char err[256];
    moeq_kafka_out out = {.partition = MOEQ_KAFKA_PARTITION_ANY, .key = s->id, .key_len = s->id_len,
                          .opaque = opaque_of(c, s, which)};
    moeq_kafka_header h[12];
    char part[16], off[24];
    if (which == OUT_RESULT) {
        const char *ct = moeq_wire_content_type(s->format);
        h[0] = (moeq_kafka_header){"content-type", ct, strlen(ct)};
        out.topic = s->result_topic;
        out.value = s->result.data;
        out.value_len = s->result.len;
        out.headers = h;
        out.n_headers = 1;
    } else {
        const moeq_kafka_msg *m = s->msg;
        snprintf(part, sizeof(part), "%d", (int)moeq_kafka_msg_partition(m));
        snprintf(off, sizeof(off), "%lld", (long long)moeq_kafka_msg_offset(m));
        const char *topic = moeq_kafka_msg_topic(m);
        size_t n = 0;
        h[n++] = (moeq_kafka_header){"moeq-reason-code", s->code, strlen(s->code)};
        h[n++] = (moeq_kafka_header){"moeq-reason-field", s->field, strlen(s->field)};
        h[n++] = (moeq_kafka_header){"moeq-reason", s->reason, strlen(s->reason)};
        h[n++] = (moeq_kafka_header){"moeq-source-topic", topic, strlen(topic)};
        h[n++] = (moeq_kafka_header){"moeq-source-partition", part, strlen(part)};
        h[n++] = (moeq_kafka_header){"moeq-source-offset", off, strlen(off)};
        const void *ct;
        size_t ct_len;
        if (moeq_kafka_msg_header(m, "content-type", &ct, &ct_len) == MOEQ_OK)
            h[n++] = (moeq_kafka_header){"content-type", ct, ct_len};
        if (s->dup_same[0]) {
            h[n++] = (moeq_kafka_header){"moeq-job-hash", s->hash, strlen(s->hash)};
            h[n++] = (moeq_kafka_header){"moeq-duplicate-of-source", s->dup_src, strlen(s->dup_src)};
            h[n++] = (moeq_kafka_header){"moeq-duplicate-of-batched-ms", s->dup_ms, strlen(s->dup_ms)};
            h[n++] = (moeq_kafka_header){"moeq-duplicate-same-content", s->dup_same, strlen(s->dup_same)};
        }
        out.topic = c->p.dlq_topic;
        out.key = moeq_kafka_msg_key(m, &out.key_len);
        out.value = moeq_kafka_msg_value(m, &out.value_len);
        out.headers = h;
        out.n_headers = n;
    }
    moeq_err e = moeq_kafka_produce(c->producer, &out, err, sizeof(err));
    if (e == MOEQ_ERR_LIMIT && which == OUT_DLQ) { /* larger than message.max.bytes: dead-letter the reason alone */
        char size[24];
        snprintf(size, sizeof(size), "%zu", out.value_len);
        h[out.n_headers++] = (moeq_kafka_header){"moeq-original-bytes", size, strlen(size)};
        out.value = NULL;
        out.value_len = 0;
        e = moeq_kafka_produce(c->producer, &out, err, sizeof(err));
    }
    if (e) {
        c->st.kafka_errors++;
        if (!s->resend) c->n_resend++;
        s->resend |= which;
        if (e != MOEQ_ERR_TRANSIENT) moeq_log(MOEQ_LOG_WARN, COMP, "produce_failed", "topic=%s err=%s", out.topic, moeq_err_str(e));
        return 0;
    }
    if (s->resend && !(s->resend &= ~which)) c->n_resend--;
    return 1;
}

static void on_delivery(const moeq_kafka_delivery *d, void *opaque) {
    moeq_coordinator *c = opaque;
    uint64_t v = (uint64_t)(uintptr_t)d->opaque;
    int which = (v & 1) ? OUT_DLQ : OUT_RESULT;
    slot *s = slot_of(c, v >> 1);
    if (!s) return;
    if (d->err) {
        c->st.kafka_errors++;
        moeq_log(MOEQ_LOG_WARN, COMP, "delivery_failed", "topic=%s err=%s", d->topic, d->errstr ? d->errstr : "");
        if (!s->resend) c->n_resend++;
        s->resend |= which; /* produced again by the next tick */
        return;
    }
    s->outs &= ~which;
    if (!s->outs) job_done(c, s);
}

/* Answer s with a coordinator result (and dead letter when dlq). */
static void answer(moeq_coordinator *c, slot *s, const moeq_intake *in, moeq_result_status status, const char *msg,
                   int dlq) {
    char err[256];
    moeq_buf_reset(&s->result);
    s->outs = 0;
    if (moeq_intake_id(in)) {
        if (moeq_intake_result_encode(in, status, msg, moeq_now_ms() - s->arrival_ms, &s->result, err, sizeof(err)))
            moeq_log(MOEQ_LOG_WARN, COMP, "result_encode_failed", "err=\"%s\"", err);
        else
            s->outs |= OUT_RESULT;
    }
    if (dlq) s->outs |= OUT_DLQ;
    if (!s->outs) { /* no id and no dead letter: cannot happen (rejects always dead-letter) */
        job_done(c, s);
        return;
    }
    int outs = s->outs;
    if (outs & OUT_RESULT) produce_out(c, s, OUT_RESULT);
    if (outs & OUT_DLQ) produce_out(c, s, OUT_DLQ);
}

/* A cancelled/duplicate answer for a job whose decoded form is gone. */
static void answer_plain(moeq_coordinator *c, slot *s, moeq_result_status status, const char *msg) {
    moeq_intake in;
    memset(&in, 0, sizeof(in));
    in.reject.has_id = 1;
    snprintf(in.reject.id, sizeof(in.reject.id), "%s", s->id);
    in.reject.format = s->format;
    snprintf(in.job_hash, sizeof(in.job_hash), "%s", s->hash);
    answer(c, s, &in, status, msg, 0);
}

/* "topic/partition/offset" of m: where a job came from, kept in its record. */
static void source_of(const moeq_kafka_msg *m, char *out, size_t n) {
    snprintf(out, n, "%s/%d/%lld", moeq_kafka_msg_topic(m), (int)moeq_kafka_msg_partition(m),
             (long long)moeq_kafka_msg_offset(m));
}

static void utc_ms(int64_t ms, char *out, size_t n) {
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    size_t k = strftime(out, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + k, n - k, ".%03dZ", (int)(ms % 1000));
}

/*
 * Answer s, whose id an earlier job d already has, with a `duplicate` dead
 * letter (no result: on a compacted results topic it would replace the
 * earlier job's). `where` says where the earlier job is.
 */
static void answer_duplicate(moeq_coordinator *c, slot *s, const moeq_store_dup *d, const char *where) {
    char when[64] = "", content[96], q[600];
    if (d->batched_ms >= 0) {
        char t[40];
        utc_ms(d->batched_ms, t, sizeof(t));
        snprintf(when, sizeof(when), "batched at %s", t);
    }
    snprintf(s->dup_same, sizeof(s->dup_same), "%s", !d->hash[0] ? "unknown" : strcmp(d->hash, s->hash) ? "false" : "true");
    if (!d->hash[0]) snprintf(content, sizeof(content), "content unknown");
    else if (!strcmp(d->hash, s->hash)) snprintf(content, sizeof(content), "with the same content (job_hash %s)", s->hash);
    else snprintf(content, sizeof(content), "with other content (its job_hash %s, this one %s)", d->hash, s->hash);
    snprintf(s->code, sizeof(s->code), "duplicate");
    snprintf(s->field, sizeof(s->field), "id");
    snprintf(s->reason, sizeof(s->reason),
             "job id '%.80s' was already accepted (%s%s%s, from %.160s), %s; use a new id, or reuse this one "
             "after dedupe_window_s", s->id, where, when[0] ? ", " : "", when, d->src[0] ? d->src : "unknown", content);
    snprintf(s->dup_src, sizeof(s->dup_src), "%s", d->src);
    s->dup_ms[0] = 0;
    if (d->batched_ms >= 0) snprintf(s->dup_ms, sizeof(s->dup_ms), "%lld", (long long)d->batched_ms);
    c->st.jobs_duplicate++;
    moeq_log(MOEQ_LOG_INFO, COMP, "job_duplicate", "id=%s answer=dead_letter same_content=%s earlier=%s reason=%s",
             s->id, s->dup_same, d->src[0] ? d->src : "-", moeq_log_quote(s->reason, q, sizeof(q)));
    s->outs = OUT_DLQ;
    produce_out(c, s, OUT_DLQ);
}

/* s's id is held by a job still in the batcher: settle s as a duplicate of it. Returns 0 when not held. */
static int settle_if_held(moeq_coordinator *c, slot *s) {
    uint64_t h;
    if (!s->id_len || moeq_batcher_holder(c->batcher, s->id, s->id_len, &h) != MOEQ_OK) return 0;
    const slot *first = slot_of(c, h);
    moeq_store_dup d = {.kind = MOEQ_STORE_DUP_ENQUEUED, .batched_ms = -1, .kafka_ts_ms = -1};
    char src[320];
    source_of(s->msg, src, sizeof(src));
    if (!first) { /* settled already, its batch not yet released: say so rather than guess */
        answer_duplicate(c, s, &d, "already settled");
        return 1;
    }
    snprintf(d.hash, sizeof(d.hash), "%s", first->hash);
    source_of(first->msg, d.src, sizeof(d.src));
    d.kafka_ts_ms = first->kafka_ts;
    if (!moeq_store_dup_is_redelivery(&d, src)) {
        answer_duplicate(c, s, &d, "still being batched");
        return 1;
    }
    /* a re-fetch of the same offset: not tracked twice, so the first copy's settling covers it */
    c->st.jobs_duplicate++;
    moeq_log(MOEQ_LOG_INFO, COMP, "job_duplicate", "id=%s answer=none why=redelivery source=%s", s->id, src);
    slot_free(c, s);
    return 1;
}

/* ---- consuming ------------------------------------------------------------------ */

static void track(moeq_coordinator *c, const moeq_kafka_msg *m) {
    const char *t = moeq_kafka_msg_topic(m);
    int32_t p = moeq_kafka_msg_partition(m);
    if (moeq_offsets_track(c->offsets, t, p, moeq_kafka_msg_offset(m)) == MOEQ_OK) return;
    /*
     * An offset at or below one already tracked: the client re-fetched without
     * a revoke (offset reset). The earlier copy's entry still gates the
     * low-water mark, and whichever copy becomes durable first makes the job
     * at that offset durable, so this copy is simply not tracked again.
     * (Dropping the partition here could let the mark pass an earlier job.)
     */
    moeq_log(MOEQ_LOG_INFO, COMP, "offset_refetch", "topic=%s partition=%d offset=%lld", t, (int)p,
             (long long)moeq_kafka_msg_offset(m));
}

static void accept_job(moeq_coordinator *c, slot *s) {
    moeq_intake *in = &c->in;
    char err[256];
    if (settle_if_held(c, s)) return;
    if (in->prompt && in->prompt == in->tokens.ids) { /* take the tokenizer's buffer, give ours back */
        moeq_tokens t = s->toks;
        s->toks = in->tokens;
        in->tokens = t;
        in->tokens.n = 0;
        s->has_tokens = 1;
    } else if (in->prompt) {
        s->toks.n = 0;
        if (s->toks.cap < (size_t)in->prompt_len) {
            int32_t *ids = realloc(s->toks.ids, (size_t)in->prompt_len * sizeof(int32_t));
            if (!ids) goto nomem;
            s->toks.ids = ids;
            s->toks.cap = (size_t)in->prompt_len;
        }
        memcpy(s->toks.ids, in->prompt, (size_t)in->prompt_len * sizeof(int32_t));
        s->toks.n = (size_t)in->prompt_len;
        s->has_tokens = 1;
    }
    moeq_batcher_job bj = {
        .handle = handle_of(c, (uint32_t)(s - c->slots)),
        .priority = in->job.priority,
        .prompt_len = in->prompt_len,
        .max_new_tokens = in->job.max_new_tokens,
        .tokens = s->has_tokens ? s->toks.ids : NULL,
        .created_ms = s->kafka_ts,
        .id = s->id_len ? s->id : NULL,
        .id_len = s->id_len,
    };
    moeq_err e = moeq_batcher_add(c->batcher, &bj, s->arrival_ms, err, sizeof(err));
    if (e == MOEQ_OK) {
        c->st.jobs_accepted++;
        return;
    }
    in->verdict = MOEQ_INTAKE_REJECT; /* the intake checks make this unreachable; never drop silently */
    in->reject.code = MOEQ_JOB_REJECT_TOO_LARGE;
    snprintf(in->reject.message, sizeof(in->reject.message), "%s", err);
    snprintf(s->code, sizeof(s->code), "%s", moeq_job_reject_code_name(in->reject.code));
    snprintf(s->field, sizeof(s->field), "prompt");
    snprintf(s->reason, sizeof(s->reason), "%s", err);
    c->st.jobs_rejected[in->reject.code]++;
    answer(c, s, in, MOEQ_RESULT_ERROR, NULL, 1);
    return;
nomem:
    moeq_log(MOEQ_LOG_ERROR, COMP, "out_of_memory", "where=tokens");
    c->fatal = MOEQ_ERR_NOMEM; /* the job stays uncommitted: redelivered after restart */
}

static void on_job(moeq_coordinator *c, moeq_kafka_msg *m) {
    c->st.jobs_consumed++;
    track(c, m);
    size_t len = 0;
    const void *value = moeq_kafka_msg_value(m, &len);
    const void *ctv = NULL;
    size_t ctl = 0;
    char ct[128] = "";
    if (moeq_kafka_msg_header(m, "content-type", &ctv, &ctl) == MOEQ_OK && ctv && ctl < sizeof(ct)) {
        memcpy(ct, ctv, ctl);
        ct[ctl] = 0;
    }
    int64_t now = moeq_now_ms();
    moeq_intake *in = &c->in;
    moeq_err e = moeq_intake_job(&c->ictx, value, len, ct[0] ? ct : NULL, now, in);
    uint32_t i = e ? NO_SLOT : slot_get(c);
    if (i == NO_SLOT) { /* uncommitted: redelivered after restart */
        moeq_log(MOEQ_LOG_ERROR, COMP, "out_of_memory", "where=intake err=%s", moeq_err_str(e));
        moeq_kafka_msg_destroy(m);
        c->fatal = MOEQ_ERR_NOMEM;
        return;
    }
    slot *s = &c->slots[i];
    s->msg = m;
    s->arrival_ms = now;
    s->kafka_ts = moeq_kafka_msg_timestamp_ms(m);
    s->format = moeq_intake_format(in);
    const char *id = moeq_intake_id(in);
    s->id_len = id ? strlen(id) : 0;
    memcpy(s->id, id ? id : "", s->id_len + 1);
    moeq_job_content_hash(value, len, s->hash);
    snprintf(s->result_topic, sizeof(s->result_topic), "%s", moeq_intake_result_topic(&c->ictx, in));
    switch (in->verdict) {
    case MOEQ_INTAKE_ACCEPT:
        accept_job(c, s);
        break;
    case MOEQ_INTAKE_EXPIRED:
        c->st.jobs_expired++;
        answer(c, s, in, MOEQ_RESULT_EXPIRED, NULL, 0);
        break;
    case MOEQ_INTAKE_REJECT: {
        char q[300];
        c->st.jobs_rejected[in->reject.code < MOEQ_JOB_REJECT__COUNT ? in->reject.code : 0]++;
        snprintf(s->code, sizeof(s->code), "%s", moeq_intake_code(in));
        snprintf(s->field, sizeof(s->field), "%s", in->reject.field);
        snprintf(s->reason, sizeof(s->reason), "%s", in->reject.message);
        moeq_log(MOEQ_LOG_INFO, COMP, "job_rejected", "topic=%s partition=%d offset=%lld code=%s reason=%s",
                 moeq_kafka_msg_topic(m), (int)moeq_kafka_msg_partition(m), (long long)moeq_kafka_msg_offset(m),
                 s->code, moeq_log_quote(s->reason, q, sizeof(q)));
        answer(c, s, in, MOEQ_RESULT_ERROR, NULL, 1);
        break;
    }
    }
}

/* Retry Redis until it answers or stop is set; returns 0 when stopped. */
static int cancel_in_store(moeq_coordinator *c, const char *id, char *state, size_t state_size,
                           volatile sig_atomic_t *stop) {
    for (int attempt = 0;; attempt++) {
        char err[256];
        moeq_err e = moeq_store_cancel(c->store, id, moeq_now_ms(), state, state_size, err, sizeof(err));
        if (!e) return 1;
        c->st.redis_errors++;
        if (attempt % 20 == 0) moeq_log(MOEQ_LOG_WARN, COMP, "redis_error", "op=cancel err=\"%s\"", err);
        if (stop && *stop) return 0;
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void on_cancel(moeq_coordinator *c, moeq_kafka_msg *m, volatile sig_atomic_t *stop) {
    track(c, m);
    size_t len = 0;
    const char *v = moeq_kafka_msg_value(m, &len);
    char id[MOEQ_JOB_ID_HARD_MAX + 1];
    while (len && (v[len - 1] == '\n' || v[len - 1] == ' ' || v[len - 1] == '\r')) len--;
    int ok = v && len > 0 && len <= MOEQ_JOB_ID_HARD_MAX;
    if (ok) {
        memcpy(id, v, len);
        id[len] = 0;
        ok = moeq_utf8_valid(id, len, NULL) && strlen(id) == len;
    }
    if (ok) {
        char state[32] = "";
        if (!cancel_in_store(c, id, state, sizeof(state), stop)) { /* stopping: redelivered later */
            moeq_kafka_msg_destroy(m);
            return;
        }
        /* still in an open bucket here: drop it and answer */
        for (uint32_t i = 0; i < c->n_slots; i++) {
            slot *s = &c->slots[i];
            if (!s->used || s->outs || strcmp(s->id, id)) continue;
            if (moeq_batcher_cancel(c->batcher, handle_of(c, i), NULL) == MOEQ_OK) {
                c->st.jobs_cancelled++;
                answer_plain(c, s, MOEQ_RESULT_CANCELLED, NULL);
            }
        }
        moeq_log(MOEQ_LOG_INFO, COMP, "job_cancel", "id=%s state=%s", id, state);
    } else {
        moeq_log(MOEQ_LOG_WARN, COMP, "cancel_ignored", "reason=\"not a job id\" bytes=%zu", len);
    }
    moeq_offsets_done(c->offsets, moeq_kafka_msg_topic(m), moeq_kafka_msg_partition(m), moeq_kafka_msg_offset(m));
    moeq_kafka_msg_destroy(m);
}

/* ---- writing batches --------------------------------------------------------------- */

static void batch_written(moeq_coordinator *c, const moeq_batch_plan *plan, size_t n, const char *entry_id) {
    int64_t now = moeq_now_ms();
    for (size_t k = 0; k < n; k++) {
        slot *s = slot_of(c, c->rem[k]);
        int64_t wait = now - s->arrival_ms;
        moeq_coord_stats_observe_wait(&c->st, wait);
        job_done(c, s);
    }
    c->st.batches_written[plan->priority]++;
    c->st.batches_closed[plan->reason]++;
    c->st.batch_jobs += (int64_t)n;
    c->st.batch_job_slots += c->p.max_batch_jobs;
    c->st.batch_prompt_tokens += plan->prompt_tokens;
    c->st.batch_pad_tokens += plan->pad_tokens;
    c->st.batch_padded_tokens += (int64_t)plan->max_prompt_len * (int64_t)plan->n_jobs;
    c->st.batch_shared_prefix_tokens += (int64_t)plan->shared_prefix_len * (int64_t)plan->n_jobs;
    moeq_log(MOEQ_LOG_DEBUG, COMP, "batch_written", "batch=%s priority=%d jobs=%zu prompt_tokens=%lld prefix=%d close=%s",
             entry_id, plan->priority, n, (long long)plan->prompt_tokens, (int)plan->shared_prefix_len,
             moeq_batch_close_str(plan->reason));
}

/* The jobs of plan still to write (not yet settled as duplicate/cancelled) into c->rem; returns the count. */
static size_t plan_remaining(moeq_coordinator *c, const moeq_batch_plan *plan) {
    size_t n = 0;
    for (size_t k = 0; k < plan->n_jobs; k++) {
        slot *s = slot_of(c, plan->jobs[k].handle);
        if (s && !s->outs) c->rem[n++] = plan->jobs[k].handle;
    }
    return n;
}

static void fill_entry_jobs(moeq_coordinator *c, size_t n) {
    for (size_t k = 0; k < n; k++) {
        slot *s = slot_of(c, c->rem[k]);
        moeq_batch_entry_job *e = &c->ejobs[k];
        e->id = s->id;
        e->id_len = s->id_len;
        const void *ct = NULL;
        size_t ctl = 0;
        moeq_kafka_msg_header(s->msg, "content-type", &ct, &ctl);
        e->content_type = ct;
        e->content_type_len = ct ? ctl : 0;
        e->job = moeq_kafka_msg_value(s->msg, &e->job_len);
        e->kafka_ts_ms = s->kafka_ts;
        e->arrival_ms = s->arrival_ms;
        e->tokens = s->has_tokens ? s->toks.ids : NULL;
        e->n_tokens = s->has_tokens ? s->toks.n : 0;
        source_of(s->msg, c->srcs[k], sizeof(c->srcs[k]));
        c->src_ptrs[k] = c->srcs[k];
    }
}

/* Settle the jobs the guard refused; the rest stay for the next write. */
static void settle_duplicates(moeq_coordinator *c, size_t n) {
    for (size_t k = 0; k < n; k++) {
        slot *s = slot_of(c, c->rem[k]);
        const moeq_store_dup *d = &c->dups[k];
        char src[320]; /* not c->srcs: those belong to the last batch appended to the pipeline */
        source_of(s->msg, src, sizeof(src));
        if (d->kind == MOEQ_STORE_DUP_CANCELLED) {
            c->st.jobs_cancelled++;
            answer_plain(c, s, MOEQ_RESULT_CANCELLED, NULL);
        } else if (d->kind == MOEQ_STORE_DUP_ENQUEUED && !moeq_store_dup_is_redelivery(d, src)) {
            answer_duplicate(c, s, d, d->in_batch ? "in the same batch" : "already in Redis");
        } else if (d->kind == MOEQ_STORE_DUP_ENQUEUED) { /* redelivered: the record makes it durable */
            c->st.jobs_duplicate++;
            moeq_log(MOEQ_LOG_INFO, COMP, "job_duplicate", "id=%s answer=none why=redelivery source=%s", s->id, src);
            job_done(c, s);
        }
    }
}

#define PIPELINE_MAX 64

/*
 * One pipelined round over the first plans of c->to_write: append every write,
 * then read every reply (one fsync for all with appendfsync always). Plans
 * written, or left with no job, leave to_write. Returns 0 on a Redis error.
 */
static int write_round(moeq_coordinator *c) {
    size_t m = c->n_to_write < PIPELINE_MAX ? c->n_to_write : PIPELINE_MAX, appended = 0;
    char err[256], entry_id[64];
    moeq_err e = MOEQ_OK;
    for (; appended < m && !e; appended++) {
        const moeq_batch_plan *plan = c->to_write[appended];
        size_t n = plan_remaining(c, plan);
        fill_entry_jobs(c, n);
        e = n ? moeq_store_append_batch(c->store, plan->priority, c->ejobs, c->src_ptrs, n, plan->shared_prefix_len,
                                        plan->closed_ms, moeq_now_ms(), err, sizeof(err))
              : MOEQ_OK;
        if (e) break;
    }
    int ok = e == MOEQ_OK, done[PIPELINE_MAX] = {0}, written_plans[PIPELINE_MAX] = {0};
    for (size_t i = 0; i < appended; i++) {
        const moeq_batch_plan *plan = c->to_write[i];
        size_t n = plan_remaining(c, plan);
        if (!n) { done[i] = 1; continue; }
        int written = 0;
        moeq_err re = moeq_store_read_batch(c->store, n, &written, entry_id, c->dups, err, sizeof(err));
        if (re) { ok = 0; e = re; continue; }
        if (written) {
            written_plans[i] = 1;
            continue;
        }
        settle_duplicates(c, n);
        done[i] = plan_remaining(c, plan) == 0;
    }
    if (ok && (e = moeq_store_sync(c->store, err, sizeof(err)))) ok = 0;
    /* only now (after WAITAOF when configured) are written batches durable */
    for (size_t i = 0; i < appended && ok; i++) {
        if (!written_plans[i]) continue;
        const moeq_batch_plan *plan = c->to_write[i];
        batch_written(c, plan, plan_remaining(c, plan), "-");
        done[i] = 1;
    }
    if (!ok) { /* logged on the first failure of a streak, then every 25th (one line per ~5 s) */
        c->st.redis_errors++;
        if (c->redis_fail_streak++ % 25 == 0)
            moeq_log(MOEQ_LOG_WARN, COMP, "redis_error", "op=write_batches batches=%zu failures=%d err=\"%s\"", m,
                     c->redis_fail_streak, err);
    } else if (c->redis_fail_streak) {
        moeq_log(MOEQ_LOG_INFO, COMP, "redis_recovered", "failures=%d", c->redis_fail_streak);
        c->redis_fail_streak = 0;
    }
    size_t keep = 0;
    for (size_t i = 0; i < c->n_to_write; i++) {
        if (i < appended && done[i]) moeq_batcher_release(c->batcher, c->to_write[i]);
        else c->to_write[keep++] = c->to_write[i];
    }
    c->n_to_write = keep;
    return ok;
}

/* Write every closed batch. Returns 0 while Redis fails (retried after a pause). */
static int write_ready(moeq_coordinator *c) {
    const moeq_batch_plan *plan;
    while ((plan = moeq_batcher_next(c->batcher))) {
        if (c->n_to_write == c->cap_to_write) {
            size_t cap = c->cap_to_write ? 2 * c->cap_to_write : 64;
            const moeq_batch_plan **v = realloc(c->to_write, cap * sizeof(*v));
            if (!v) { c->fatal = MOEQ_ERR_NOMEM; return 0; }
            c->to_write = v;
            c->cap_to_write = cap;
        }
        c->to_write[c->n_to_write++] = plan;
    }
    if (c->n_to_write && moeq_now_ms() < c->stuck_retry_ms) return 0;
    while (c->n_to_write) {
        if (!write_round(c)) {
            c->stuck_retry_ms = moeq_now_ms() + 200;
            return 0;
        }
    }
    return 1;
}

/* ---- offsets, back-pressure ---------------------------------------------------------- */

static void resend_failed(moeq_coordinator *c) {
    for (uint32_t i = 0; c->n_resend && i < c->n_slots; i++) {
        slot *s = &c->slots[i];
        if (!s->used || !s->resend) continue;
        if (s->resend & OUT_RESULT) produce_out(c, s, OUT_RESULT);
        if (s->resend & OUT_DLQ) produce_out(c, s, OUT_DLQ);
    }
}

static void commit(moeq_coordinator *c, int sync) {
    moeq_offset_commit v[64];
    size_t n;
    char err[256];
    while ((n = moeq_offsets_collect(c->offsets, v, 64)) > 0)
        for (size_t i = 0; i < n; i++) {
            moeq_err e = moeq_kafka_consumer_store(c->consumer, v[i].topic, v[i].partition, v[i].offset, err, sizeof(err));
            if (e == MOEQ_OK) c->stored_since_commit = 1;
            else if (e != MOEQ_ERR_NOT_FOUND) moeq_offsets_uncollect(c->offsets, v[i].topic, v[i].partition);
        }
    /* An async commit that failed after returning OK leaves its offsets uncommitted:
     * retry on the next tick even when idle, so lag and redelivery stay bounded. */
    uint64_t failures = moeq_kafka_consumer_commit_failures(c->consumer);
    if (failures != c->commit_failures_seen) {
        c->commit_failures_seen = failures;
        c->stored_since_commit = 1;
    }
    if (!c->stored_since_commit) return;
    moeq_err e = moeq_kafka_consumer_commit(c->consumer, !sync, err, sizeof(err));
    if (e) {
        c->st.kafka_errors++;
        moeq_log(MOEQ_LOG_WARN, COMP, "commit_failed", "err=\"%s\"", err);
        return;
    }
    c->st.commits++;
    c->stored_since_commit = 0;
}

static void set_paused(moeq_coordinator *c, int pause, const char *why) {
    char err[256];
    if (pause == c->paused && !(pause && c->reapply_pause)) return;
    moeq_err e = pause ? moeq_kafka_consumer_pause(c->consumer, NULL, 0, err, sizeof(err))
                       : moeq_kafka_consumer_resume(c->consumer, NULL, 0, err, sizeof(err));
    if (e) {
        moeq_log(MOEQ_LOG_WARN, COMP, pause ? "pause_failed" : "resume_failed", "err=\"%s\"", err);
        return;
    }
    if (pause != c->paused)
        moeq_log(MOEQ_LOG_INFO, COMP, pause ? "paused" : "resumed", "why=%s pending_batches=%lld open_jobs=%u", why,
                 (long long)c->st.pending_batches, c->used);
    c->paused = pause;
    c->reapply_pause = 0;
    c->st.paused = pause;
}

static void backpressure(moeq_coordinator *c, int64_t now) {
    if (now >= c->next_pending_ms) {
        char err[256];
        int64_t pending = 0;
        if (moeq_store_pending_batches(c->store, &pending, err, sizeof(err)) == MOEQ_OK) c->st.pending_batches = pending;
        else c->st.redis_errors++;
        c->next_pending_ms = now + c->p.pending_check_ms;
    }
    int over = c->st.pending_batches > c->p.max_pending_batches;
    int full = (int64_t)c->used >= c->p.max_open_jobs;
    int stuck = c->n_to_write > 0 && c->stuck_retry_ms > now;
    if (stuck || over || full) set_paused(c, 1, stuck ? "redis" : over ? "pending_batches" : "open_jobs");
    else if (c->st.pending_batches <= c->p.resume_pending_batches && (int64_t)c->used * 4 <= c->p.max_open_jobs * 3)
        set_paused(c, 0, "caught_up");
}

/* Close every bucket, write everything, wait for deliveries (bounded), commit synchronously. */
static void drain(moeq_coordinator *c, int64_t budget_ms) {
    int64_t end = moeq_now_ms() + budget_ms;
    moeq_batcher_flush(c->batcher, moeq_now_ms());
    while (!write_ready(c) && moeq_now_ms() < end) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        c->stuck_retry_ms = 0;
    }
    char err[256];
    int64_t left = end - moeq_now_ms();
    moeq_kafka_producer_flush(c->producer, (int)(left > 1000 ? left : 1000), err, sizeof(err));
    commit(c, 1);
}

static void on_rebalance(moeq_kafka_rebalance kind, const moeq_kafka_partition *parts, size_t n, void *opaque) {
    moeq_coordinator *c = opaque;
    if (kind == MOEQ_KAFKA_ASSIGNED) {
        c->reapply_pause = c->paused;
        moeq_log(MOEQ_LOG_INFO, COMP, "assigned", "partitions=%zu", n);
        return;
    }
    if (kind == MOEQ_KAFKA_REVOKED) drain(c, 10000);
    for (size_t i = 0; i < n; i++) moeq_offsets_drop(c->offsets, parts[i].topic, parts[i].partition);
    moeq_log(MOEQ_LOG_INFO, COMP, kind == MOEQ_KAFKA_REVOKED ? "revoked" : "lost", "partitions=%zu", n);
}

/* ---- HTTP ------------------------------------------------------------------------------ */

void moeq_coordinator_stats(moeq_coordinator *c, moeq_coord_stats *out) {
    pthread_mutex_lock(&c->snap_mu);
    *out = c->snap;
    pthread_mutex_unlock(&c->snap_mu);
}

/*
 * Consumer lag is measured here, on the connection's HTTP thread, when
 * scraped: it asks the broker (committed offsets, watermarks; typically
 * < fetch.wait.max.ms) and may block up to LAG_TIMEOUT_MS, which the loop
 * must never do. librdkafka's calls are thread-safe;
 * moeq_coordinator_destroy stops the HTTP threads before the consumer goes.
 */
#define LAG_TIMEOUT_MS 2000

static void render_lag(moeq_coordinator *c, moeq_buf *body) {
    moeq_kafka_lag *lags = NULL;
    size_t n = 0;
    char err[256];
    if (moeq_kafka_consumer_lag(c->consumer, LAG_TIMEOUT_MS, &lags, &n, err, sizeof(err)) == MOEQ_OK)
        moeq_coord_metrics_render_lag(lags, n, body);
    free(lags);
}

static enum MHD_Result http_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                    const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version, (void)upload, (void)upload_size, (void)state;
    moeq_coordinator *c = cls;
    if (strcmp(method, "GET")) return MHD_NO;
    moeq_coord_stats st;
    moeq_coordinator_stats(c, &st);
    moeq_buf body = {0};
    unsigned code = MHD_HTTP_OK;
    const char *type = "text/plain; version=0.0.4";
    char health[600];
    unsigned hcode = moeq_health_route(c->health, url, moeq_now_ms(), health, sizeof health);
    if (!strcmp(url, "/metrics")) {
        moeq_coord_metrics_render(&st, &body);
        render_lag(c, &body);
    } else if (hcode) {
        code = hcode;
        moeq_buf_append(&body, health, strlen(health));
        type = "text/plain";
    } else {
        code = MHD_HTTP_NOT_FOUND;
        moeq_buf_append(&body, "not found\n", 10);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(body.len, body.data, MHD_RESPMEM_MUST_COPY);
    moeq_buf_free(&body);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

void moeq_coordinator_destroy(moeq_coordinator *c) {
    if (!c) return;
    if (c->http) MHD_stop_daemon(c->http);
    moeq_health_destroy(c->health);
    moeq_redis_probe_destroy(c->redis_probe);
    moeq_kafka_producer_destroy(c->producer); /* first: its last reports look up slots and free messages */
    for (uint32_t i = 0; i < c->n_slots; i++) { /* every message before its consumer */
        moeq_kafka_msg_destroy(c->slots[i].msg);
        moeq_tokens_free(&c->slots[i].toks);
        moeq_buf_free(&c->slots[i].result);
        free(c->slots[i].id);
    }
    moeq_kafka_consumer_destroy(c->consumer);
    moeq_instance_destroy(c->instance); /* after the consumer: the slot outlives the member */
    free(c->slots);
    moeq_store_destroy(c->store);
    moeq_batcher_destroy(c->batcher);
    moeq_offsets_destroy(c->offsets);
    moeq_intake_free(&c->in);
    moeq_tokenizer_destroy(c->tok);
    moeq_schema_check_destroy(c->schemas);
    free(c->to_write);
    free(c->ejobs);
    free(c->dups);
    free(c->rem);
    free(c->srcs);
    free(c->src_ptrs);
    pthread_mutex_destroy(&c->snap_mu);
    free(c);
}

static moeq_err start_http(moeq_coordinator *c, char *errstr, size_t n) {
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)c->p.http_port);
    if (inet_pton(AF_INET, c->p.http_addr, &addr.sin_addr) != 1)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "http_addr: '%s' is not an IPv4 address", c->p.http_addr);
    /* a thread per connection: a /metrics scrape waits on the broker (render_lag), /healthz must not */
    c->http = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, (uint16_t)c->p.http_port,
                               NULL, NULL, http_handler, c, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                               MHD_OPTION_END);
    if (!c->http)
        return moeq_errf(MOEQ_ERR_IO, errstr, n, "http_port: cannot listen on %s:%lld (taken? set another port, 0 = "
                         "ephemeral, -1 = off)", c->p.http_addr, (long long)c->p.http_port);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(c->http, MHD_DAEMON_INFO_BIND_PORT);
    moeq_log(MOEQ_LOG_INFO, COMP, "http_listening", "addr=%s port=%u routes=/metrics,/livez,/readyz,/healthz",
             c->p.http_addr, info ? (unsigned)info->port : (unsigned)c->p.http_port);
    return MOEQ_OK;
}

static moeq_err kafka_probe(void *opaque, char *errstr, size_t n) {
    moeq_coordinator *c = opaque;
    return moeq_kafka_consumer_ping(c->consumer, 1000, errstr, n);
}

/* The producer has its own connections (dead letters, error results): a broker the consumer reaches may still
 * refuse it (its own credentials, a listener it cannot reach). */
static moeq_err kafka_producer_probe(void *opaque, char *errstr, size_t n) {
    moeq_coordinator *c = opaque;
    return moeq_kafka_producer_ping(c->producer, 1000, errstr, n);
}

/* Readiness: the broker answers the consumer's and the producer's metadata requests, and Redis answers PING
 * (its own connection). */
static moeq_err start_health(moeq_coordinator *c, const moeq_kvlist *redis, char *errstr, size_t n) {
    moeq_redis_params rp;
    moeq_err e = moeq_redis_params_parse(c->p.redis_url, redis, &rp, errstr, n);
    if (!e && (moeq_health_new(2000, c->p.livez_stall_ms, &c->health) || moeq_redis_probe_new(&rp, &c->redis_probe)))
        e = moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "out of memory");
    if (!e) moeq_health_add_probe(c->health, "kafka", kafka_probe, c);
    if (!e) moeq_health_add_probe(c->health, "kafka_producer", kafka_producer_probe, c);
    if (!e) moeq_health_add_probe(c->health, "redis", moeq_redis_probe_check, c->redis_probe);
    if (!e && c->p.http_port >= 0) e = start_http(c, errstr, n);
    return e;
}

static moeq_err connect_store(moeq_coordinator *c, const moeq_kvlist *redis, char *errstr, size_t n) {
    char warning[512];
    moeq_err e = moeq_store_new(&c->p, redis, &c->store, errstr, n);
    if (!e) e = moeq_store_prepare(c->store, warning, sizeof(warning), errstr, n);
    if (!e && warning[0]) moeq_log(MOEQ_LOG_WARN, COMP, "durability", "msg=\"%s\"", warning);
    return e;
}

/*
 * Static membership (instance.h): a restarted coordinator rejoins under its
 * old id and gets its partitions back without waiting for the session
 * timeout. The session timeout itself is 10 s unless kafka.session.timeout.ms
 * says otherwise, not librdkafka's 45 s: it is how long a coordinator that
 * died and stays dead (or a static member stopped on purpose, which does not
 * leave the group) holds partitions nobody reads.
 */
static moeq_err set_membership(moeq_coordinator *c, moeq_kvlist *kv, char *errstr, size_t n) {
    if (!moeq_kvlist_get(kv, "session.timeout.ms")) moeq_kvlist_set(kv, "session.timeout.ms", "10000");
    const char *id = moeq_kvlist_get(kv, "group.instance.id");
    if (!id && !strcmp(c->p.group_instance_id, "auto")) {
        moeq_err e = moeq_instance_claim(c->p.run_dir, "coordinator", c->p.group_id, NULL, &c->instance, errstr, n);
        if (e) return e;
        id = moeq_instance_id(c->instance);
    } else if (!id && c->p.group_instance_id[0]) {
        id = c->p.group_instance_id;
    }
    if (id && !moeq_kvlist_get(kv, "group.instance.id")) moeq_kvlist_set(kv, "group.instance.id", id);
    moeq_log(MOEQ_LOG_INFO, COMP, "membership", "group=%s instance=%s", c->p.group_id, id ? id : "(dynamic)");
    return MOEQ_OK;
}

static moeq_err connect_kafka(moeq_coordinator *c, const moeq_kvlist *kafka, char *errstr, size_t n) {
    moeq_kafka_producer_params pp = {.brokers = c->p.kafka_brokers, .client_id = "moeq-coordinator",
                                     .on_delivery = on_delivery, .cb_opaque = c};
    moeq_err e = moeq_kafka_producer_new(&pp, kafka, &c->producer, errstr, n);
    if (e) return e;
    char *topics[66];
    snprintf(c->topics_buf, sizeof(c->topics_buf), "%s", c->p.job_topics);
    size_t nt = moeq_coordinator_split_list(c->topics_buf, topics, 64);
    if (nt > 64) nt = 64;
    if (c->p.cancel_topic[0]) topics[nt++] = c->p.cancel_topic;
    moeq_kvlist *kv = moeq_kvlist_new();
    if (!kv) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "out of memory");
    for (size_t i = 0; kafka && i < moeq_kvlist_count(kafka); i++) {
        const char *k, *v;
        moeq_kvlist_at(kafka, i, &k, &v);
        moeq_kvlist_set(kv, k, v);
    }
    e = set_membership(c, kv, errstr, n);
    if (e) {
        moeq_kvlist_destroy(kv);
        return e;
    }
    moeq_kafka_consumer_params cp = {.brokers = c->p.kafka_brokers, .group_id = c->p.group_id,
                                     .client_id = "moeq-coordinator", .topics = (const char *const *)topics,
                                     .n_topics = nt, .on_rebalance = on_rebalance, .cb_opaque = c};
    e = moeq_kafka_consumer_new(&cp, kv, &c->consumer, errstr, n);
    moeq_kvlist_destroy(kv);
    return e;
}

/* The model's context from its config.json (0 when it has none next to the tokenizer), resolved with max_model_len. */
static moeq_err context_len(const moeq_coordinator_params *p, int64_t *out, char *errstr, size_t n) {
    moeq_model_config config = {.max_position_embeddings = 0};
    char why[512] = "";
    moeq_err e = p->model[0] ? moeq_model_config_load(p->model, &config, why, sizeof why) : MOEQ_OK;
    if (e == MOEQ_ERR_NOT_FOUND) {
        moeq_log(MOEQ_LOG_WARN, COMP, "no_model_config", "model=%s max_model_len=%lld reason=\"%s\"", p->model,
                 (long long)p->max_model_len, why);
        config.max_position_embeddings = 0;
    } else if (e) {
        return moeq_errf(e, errstr, n, "model: %s", why);
    }
    return moeq_coordinator_context(p, config.max_position_embeddings, out, errstr, n);
}

moeq_err moeq_coordinator_new(const moeq_coordinator_params *params, const moeq_kvlist *kafka,
                              const moeq_kvlist *redis, moeq_coordinator **out, char *errstr, size_t n) {
    *out = NULL;
    moeq_err e = moeq_coordinator_params_check(params, errstr, n);
    if (e) return e;
    moeq_coordinator *c = calloc(1, sizeof(*c));
    if (!c) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "out of memory");
    c->p = *params;
    c->free_head = NO_SLOT;
    pthread_mutex_init(&c->snap_mu, NULL);
    moeq_batcher_params bp = moeq_coordinator_batcher_params(params);
    size_t cap = (size_t)params->max_batch_jobs;
    c->ejobs = calloc(cap, sizeof(*c->ejobs));
    c->dups = calloc(cap, sizeof(*c->dups));
    c->rem = calloc(cap, sizeof(*c->rem));
    c->srcs = calloc(cap, sizeof(*c->srcs));
    c->src_ptrs = calloc(cap, sizeof(*c->src_ptrs));
    c->offsets = moeq_offsets_new();
    if (!c->ejobs || !c->dups || !c->rem || !c->srcs || !c->src_ptrs || !c->offsets)
        e = moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "out of memory");
    if (!e) e = moeq_batcher_new(&bp, &c->batcher, errstr, n);
    if (!e && params->model[0]) e = moeq_tokenizer_load(params->model, &c->tok, errstr, n);
    if (!e && moeq_schema_check_new(64, &c->schemas)) e = moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "out of memory");
    c->ictx.params = &c->p;
    c->ictx.tokenizer = c->tok;
    c->ictx.schemas = c->schemas;
    if (!e) e = context_len(params, &c->p.max_model_len, errstr, n); /* intake reads it from c->p */
    if (!e) e = connect_store(c, redis, errstr, n);
    if (!e) e = connect_kafka(c, kafka, errstr, n);
    if (!e) e = start_health(c, redis, errstr, n);
    if (e) {
        moeq_coordinator_destroy(c);
        return e;
    }
    *out = c;
    return MOEQ_OK;
}

static void publish_stats(moeq_coordinator *c, int64_t now) {
    c->st.open_jobs = c->used;
    c->st.last_tick_ms = now;
    moeq_health_tick(c->health, now);
    pthread_mutex_lock(&c->snap_mu);
    c->snap = c->st;
    pthread_mutex_unlock(&c->snap_mu);
}

/*
 * Poll up to a burst of messages; the first wait is bounded by the next
 * bucket deadline. Bucket deadlines are checked after every message (cheap:
 * O(open buckets)), so a burst never delays a close; closed batches are
 * written when enough are ready or poll_interval/2 has passed, so one Redis
 * round trip (one fsync) carries many batches.
 */
static moeq_err consume_burst(moeq_coordinator *c, volatile sig_atomic_t *stop, char *errstr, size_t n) {
    int64_t now = moeq_now_ms(), deadline = moeq_batcher_next_deadline(c->batcher);
    int64_t wait = c->p.poll_interval_ms, last_write = now;
    if (deadline != INT64_MAX && deadline - now < wait) wait = deadline - now > 0 ? deadline - now : 0;
    for (int k = 0; k < 5000 && !*stop && !c->fatal; k++) {
        moeq_kafka_msg *m = NULL;
        moeq_err e = moeq_kafka_consumer_poll(c->consumer, k == 0 ? (int)wait : 0, &m, errstr, n);
        if (e) return e;
        if (!m) break;
        if (c->p.cancel_topic[0] && !strcmp(moeq_kafka_msg_topic(m), c->p.cancel_topic)) on_cancel(c, m, stop);
        else on_job(c, m);
        now = moeq_now_ms();
        moeq_batcher_poll(c->batcher, now);
        if (moeq_batcher_ready_batches(c->batcher) >= PIPELINE_MAX / 2 ||
            (moeq_batcher_ready_batches(c->batcher) && now - last_write >= c->p.poll_interval_ms / 2)) {
            write_ready(c);
            last_write = now;
        }
        if ((int64_t)c->used >= c->p.max_open_jobs) break;
    }
    return MOEQ_OK;
}

moeq_err moeq_coordinator_run(moeq_coordinator *c, volatile sig_atomic_t *stop, char *errstr, size_t n) {
    moeq_log(MOEQ_LOG_INFO, COMP, "started", "group=%s topics=%s tokenizer=%s", c->p.group_id, c->p.job_topics,
             c->tok ? "yes" : "estimate");
    moeq_err e = MOEQ_OK;
    while (!*stop) {
        int64_t t0 = moeq_now_ms();
        e = consume_burst(c, stop, errstr, n);
        if (!e && c->fatal) e = moeq_errf(c->fatal, errstr, n, "coordinator: out of memory");
        if (e) break;
        int64_t now = moeq_now_ms(), t1 = now;
        moeq_batcher_poll(c->batcher, now);
        write_ready(c);
        int64_t t2 = moeq_now_ms();
        moeq_kafka_producer_poll(c->producer, 0);
        resend_failed(c);
        backpressure(c, now);
        int64_t t3 = moeq_now_ms();
        if (now >= c->next_commit_ms) {
            commit(c, 0);
            c->next_commit_ms = now + c->p.commit_interval_ms;
        }
        int64_t t4 = moeq_now_ms();
        if (t4 - t0 > c->p.poll_interval_ms + 100)
            moeq_log(MOEQ_LOG_DEBUG, COMP, "slow_tick", "consume_ms=%lld write_ms=%lld backpressure_ms=%lld commit_ms=%lld",
                     (long long)(t1 - t0), (long long)(t2 - t1), (long long)(t3 - t2), (long long)(t4 - t3));
        publish_stats(c, now);
    }
    moeq_log(MOEQ_LOG_INFO, COMP, "stopping", "open_jobs=%u", c->used);
    drain(c, 15000);
    char err[256];
    moeq_kafka_consumer_close(c->consumer, err, sizeof(err));
    publish_stats(c, moeq_now_ms());
    return e;
}
