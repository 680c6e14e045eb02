/*
 * worker_io.c — the worker's Redis commands over moeq/redis.h (see
 * worker_io.h). Policy (what to take, when to ack) lives in worker.c and
 * scheduler.c; this file only speaks the protocol.
 */
#include "worker_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/batch_entry.h"
#include "moeq/log.h"
#include "moeq/util.h"

#define JOB_KEY_MAX (MOEQ_JOB_ID_HARD_MAX + 96)

void worker_entry_free(worker_entry *entry) {
    if (!entry) return;
    for (size_t i = 0; i < entry->n_jobs; i++) {
        moeq_job_free(&entry->jobs[i].job);
        free(entry->jobs[i].tokens);
        free(entry->jobs[i].raw);
        free(entry->jobs[i].bad);
    }
    free(entry->jobs);
    memset(entry, 0, sizeof *entry);
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static moeq_err decode_one(const moeq_batch_entry_job *bj, size_t i, const moeq_job_limits *limits,
                           worker_entry_job *wj) {
    snprintf(wj->id_fallback, sizeof wj->id_fallback, "%.*s", bj->id_len < 63 ? (int)bj->id_len : 63,
             bj->id ? bj->id : "");
    if (!wj->id_fallback[0]) snprintf(wj->id_fallback, sizeof wj->id_fallback, "?%zu", i);
    wj->raw = (uint8_t *)dup_n(bj->job, bj->job_len);
    if (!wj->raw) return MOEQ_ERR_NOMEM;
    wj->raw_len = bj->job_len;
    wj->created_ms = bj->kafka_ts_ms > 0 ? bj->kafka_ts_ms : bj->arrival_ms;
    char ct[128] = "";
    if (bj->content_type && bj->content_type_len)
        snprintf(ct, sizeof ct, "%.*s", bj->content_type_len < 127 ? (int)bj->content_type_len : 127, bj->content_type);
    moeq_job_reject rej;
    moeq_err err = moeq_job_decode(bj->job, bj->job_len, ct[0] ? ct : NULL, limits, &wj->job, &rej);
    if (err == MOEQ_ERR_NOMEM) return err;
    if (err) {
        char msg[320];
        snprintf(msg, sizeof msg, "%s: %s", moeq_job_reject_code_name(rej.code), rej.message);
        wj->bad = dup_n(msg, strlen(msg));
        wj->bad_code = moeq_job_reject_code_name(rej.code);
        return wj->bad ? MOEQ_OK : MOEQ_ERR_NOMEM;
    }
    if (bj->n_tokens > 0) {
        wj->tokens = malloc(sizeof *wj->tokens * bj->n_tokens);
        if (!wj->tokens) return MOEQ_ERR_NOMEM;
        memcpy(wj->tokens, bj->tokens, sizeof *wj->tokens * bj->n_tokens);
        wj->n_tokens = (int)bj->n_tokens;
    }
    return MOEQ_OK;
}

/* The entry's pkey; an entry of a coordinator from before it has none: computed alike from prefix and tokens. */
static uint64_t entry_prefix_key(const moeq_redis_entry *entry, const moeq_batch_entry_job *jobs, size_t n) {
    const char *pkey = moeq_redis_entry_get(entry, "pkey", NULL), *prefix = moeq_redis_entry_get(entry, "prefix", NULL);
    if (pkey) return strtoull(pkey, NULL, 16);
    long long shared = prefix ? strtoll(prefix, NULL, 10) : 0;
    return n && shared > 0 && jobs[0].n_tokens >= (size_t)shared ? moeq_batch_entry_prefix_key(jobs[0].tokens, (size_t)shared)
                                                                 : 0;
}

static int entry_prefix_tokens(const moeq_redis_entry *entry) {
    const char *prefix = moeq_redis_entry_get(entry, "prefix", NULL);
    long long n = prefix ? strtoll(prefix, NULL, 10) : 0;
    if (n > MOEQ_BATCH_PREFIX_KEY_TOKENS) n = MOEQ_BATCH_PREFIX_KEY_TOKENS;
    return n > 0 ? (int)(n - n % MOEQ_BATCH_PREFIX_KEY_ROUND) : 0;
}

moeq_err worker_entry_decode(const moeq_redis_entry *entry, const char *stream, const moeq_job_limits *limits,
                             worker_entry *out, char *errstr, size_t errstr_size) {
    memset(out, 0, sizeof *out);
    snprintf(out->stream, sizeof out->stream, "%s", stream ? stream : entry->stream ? entry->stream : "");
    snprintf(out->id, sizeof out->id, "%s", entry->id);
    out->batched_ms = strtoll(entry->id, NULL, 10);
    out->deliveries = 1;
    if (!entry->fields) return moeq_errf(MOEQ_ERR_NOT_FOUND, errstr, errstr_size, "entry %s was deleted", entry->id);
    const char *v = moeq_redis_entry_get(entry, "v", NULL);
    if (!v || strcmp(v, "1") != 0)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "entry %s: version '%s' is not 1", entry->id,
                         v ? v : "(none)");
    const char *closed = moeq_redis_entry_get(entry, "closed_ms", NULL);
    if (closed && strtoll(closed, NULL, 10) > 0) out->batched_ms = strtoll(closed, NULL, 10);
    size_t len = 0;
    const char *blob = moeq_redis_entry_get(entry, "jobs", &len);
    if (!blob) return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "entry %s: no 'jobs' field", entry->id);
    moeq_batch_entry_job *jobs = NULL;
    int32_t *tokens = NULL;
    size_t n = 0;
    moeq_err err = moeq_batch_entry_decode_jobs(blob, len, &jobs, &n, &tokens, errstr, errstr_size);
    if (err) return err;
    out->jobs = calloc(n ? n : 1, sizeof *out->jobs);
    if (!out->jobs) err = moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "entry %s", entry->id);
    out->n_jobs = out->jobs ? n : 0;
    for (size_t i = 0; !err && i < n; i++)
        if (decode_one(&jobs[i], i, limits, &out->jobs[i])) err = moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "entry %s", entry->id);
    if (!err) out->prefix_key = entry_prefix_key(entry, jobs, n);
    if (!err) out->prefix_tokens = entry_prefix_tokens(entry);
    free(jobs);
    free(tokens);
    if (err) worker_entry_free(out);
    return err;
}

/* ---- streams -------------------------------------------------------------- */

moeq_err worker_io_ensure_groups(moeq_redis *redis, const moeq_worker_params *params, char *errstr,
                                 size_t errstr_size) {
    for (int p = 0; p < 4; p++) {
        char stream[96];
        moeq_worker_stream_name(params, p, stream, sizeof stream);
        const char *argv[] = {"XGROUP", "CREATE", stream, params->group, "0", "MKSTREAM"};
        moeq_redis_reply *reply = NULL;
        moeq_err err = moeq_redis_command_argv(redis, 6, argv, NULL, &reply, errstr, errstr_size);
        int busy = moeq_redis_reply_is_error(reply, "BUSYGROUP");
        moeq_redis_reply_free(reply);
        if (err && !busy) return err;
    }
    return MOEQ_OK;
}

typedef struct take_ctx {
    worker_entry *out;
    size_t cap, *n;
    moeq_err err;
    const moeq_job_limits *limits;
} take_ctx;

static int take_one(const moeq_redis_entry *entry, void *opaque) {
    take_ctx *c = opaque;
    if (*c->n >= c->cap) return 1;
    char e[256];
    moeq_err err = worker_entry_decode(entry, NULL, c->limits, &c->out[*c->n], e, sizeof e);
    if (err == MOEQ_ERR_NOMEM) {
        c->err = err;
        return 1;
    }
    if (err) {
        /* undecodable entry: keep it with zero jobs so it is acknowledged (and logged) */
        moeq_log(MOEQ_LOG_ERROR, "worker", "bad_entry", "id=%s reason=\"%s\"", entry->id, e);
    }
    (*c->n)++;
    return 0;
}

static moeq_err read_group(moeq_redis *redis, const moeq_worker_params *params, const char *consumer, int first,
                           int n_streams, int block_ms, size_t want, take_ctx *c, char *errstr, size_t errstr_size) {
    const char *argv[20];
    char streams[4][96], block[24], count[24];
    int argc = 0;
    argv[argc++] = "XREADGROUP";
    argv[argc++] = "GROUP";
    argv[argc++] = params->group;
    argv[argc++] = consumer;
    snprintf(count, sizeof count, "%zu", want);
    argv[argc++] = "COUNT";
    argv[argc++] = count;
    if (block_ms > 0) {
        snprintf(block, sizeof block, "%d", block_ms);
        argv[argc++] = "BLOCK";
        argv[argc++] = block;
    }
    argv[argc++] = "STREAMS";
    for (int k = 0; k < n_streams; k++) {
        moeq_worker_stream_name(params, first + k, streams[k], sizeof streams[k]);
        argv[argc++] = streams[k];
    }
    for (int k = 0; k < n_streams; k++) argv[argc++] = ">";
    moeq_redis_reply *reply = NULL;
    moeq_err err = moeq_redis_command_argv(redis, argc, argv, NULL, &reply, errstr, errstr_size);
    if (!err && moeq_redis_reply_type_of(reply) != MOEQ_REDIS_NIL)
        err = moeq_redis_entries_foreach(reply, MOEQ_REDIS_XREAD, take_one, c, errstr, errstr_size);
    moeq_redis_reply_free(reply);
    if (!err && c->err) err = moeq_errf(c->err, errstr, errstr_size, "decoding a batch entry");
    return err;
}

moeq_err worker_io_take(moeq_redis *redis, const moeq_worker_params *params, int block_ms, worker_entry *out,
                        size_t cap, size_t *n, char *errstr, size_t errstr_size) {
    *n = 0;
    take_ctx c = {out, cap, n, MOEQ_OK, &params->limits};
    for (int p = 0; p < 4 && *n == 0; p++) {
        moeq_err err = read_group(redis, params, params->worker_id, p, 1, 0, cap, &c, errstr, errstr_size);
        if (err) return err;
    }
    if (*n == 0 && block_ms > 0) return read_group(redis, params, params->worker_id, 0, 4, block_ms, 1, &c, errstr, errstr_size);
    return MOEQ_OK;
}

typedef struct claim_ctx {
    worker_entry *out;
    const char *stream;
    size_t n;
    char deleted[8][48];
    size_t n_deleted;
    moeq_err err;
    const moeq_job_limits *limits;
} claim_ctx;

static int claim_one(const moeq_redis_entry *entry, void *opaque) {
    claim_ctx *c = opaque;
    if (!entry->fields) {
        if (c->n_deleted < 8) snprintf(c->deleted[c->n_deleted++], 48, "%s", entry->id);
        return 0;
    }
    if (c->n >= 1) return 1;
    char e[256];
    moeq_err err = worker_entry_decode(entry, c->stream, c->limits, c->out, e, sizeof e);
    if (err == MOEQ_ERR_NOMEM) {
        c->err = err;
        return 1;
    }
    if (err) moeq_log(MOEQ_LOG_ERROR, "worker", "bad_entry", "id=%s reason=\"%s\"", entry->id, e);
    c->n = 1;
    return 0;
}

static moeq_err delivery_count(moeq_redis *redis, const moeq_worker_params *params, worker_entry *entry,
                               char *errstr, size_t errstr_size) {
    const char *argv[] = {"XPENDING", entry->stream, params->group, entry->id, entry->id, "1"};
    moeq_redis_reply *reply = NULL;
    moeq_err err = moeq_redis_command_argv(redis, 6, argv, NULL, &reply, errstr, errstr_size);
    if (!err) {
        const moeq_redis_reply *row = moeq_redis_reply_at(reply, 0);
        if (row && moeq_redis_reply_len(row) >= 4) entry->deliveries = (int)moeq_redis_reply_int(moeq_redis_reply_at(row, 3));
    }
    moeq_redis_reply_free(reply);
    return err;
}

static moeq_err ack_ids(moeq_redis *redis, const moeq_worker_params *params, const char *stream, char ids[][48],
                        size_t n, char *errstr, size_t errstr_size) {
    for (size_t i = 0; i < n; i++) {
        const char *argv[] = {"XACK", stream, params->group, ids[i]};
        moeq_err err = moeq_redis_command_argv(redis, 4, argv, NULL, NULL, errstr, errstr_size);
        if (err) return err;
    }
    return MOEQ_OK;
}

moeq_err worker_io_reclaim(moeq_redis *redis, const moeq_worker_params *params, worker_entry *out, size_t *n,
                           char *errstr, size_t errstr_size) {
    *n = 0;
    char idle[24];
    snprintf(idle, sizeof idle, "%lld", (long long)params->visibility_timeout_ms);
    for (int p = 0; p < 4; p++) {
        char stream[96];
        moeq_worker_stream_name(params, p, stream, sizeof stream);
        const char *argv[] = {"XAUTOCLAIM", stream, params->group, params->worker_id, idle, "0-0", "COUNT", "1"};
        moeq_redis_reply *reply = NULL;
        moeq_err err = moeq_redis_command_argv(redis, 8, argv, NULL, &reply, errstr, errstr_size);
        claim_ctx c = {.out = out, .stream = stream, .limits = &params->limits};
        if (!err) err = moeq_redis_entries_foreach(reply, MOEQ_REDIS_XAUTOCLAIM, claim_one, &c, errstr, errstr_size);
        moeq_redis_reply_free(reply);
        if (!err && c.err) err = moeq_errf(c.err, errstr, errstr_size, "decoding a reclaimed entry");
        if (!err && c.n_deleted) err = ack_ids(redis, params, stream, c.deleted, c.n_deleted, errstr, errstr_size);
        if (err) {
            if (c.n) worker_entry_free(out);
            return err;
        }
        if (c.n) {
            *n = 1;
            return delivery_count(redis, params, out, errstr, errstr_size);
        }
    }
    return MOEQ_OK;
}

typedef struct own_ctx {
    take_ctx take;
    char *cursor;
    size_t n_seen;
    char deleted[8][48];
    size_t n_deleted;
} own_ctx;

static int own_one(const moeq_redis_entry *entry, void *opaque) {
    own_ctx *c = opaque;
    if (*c->take.n >= c->take.cap) return 1;
    c->n_seen++;
    snprintf(c->cursor, 48, "%s", entry->id);
    if (!entry->fields) {
        if (c->n_deleted < 8) snprintf(c->deleted[c->n_deleted++], 48, "%s", entry->id);
        return 0;
    }
    return take_one(entry, &c->take);
}

/* One history read of stream p after cursor; "" once it returned nothing. */
static moeq_err take_own_stream(moeq_redis *redis, const moeq_worker_params *params, int p, char *cursor,
                                take_ctx *take, char *errstr, size_t errstr_size) {
    char stream[96], count[24];
    moeq_worker_stream_name(params, p, stream, sizeof stream);
    snprintf(count, sizeof count, "%zu", take->cap - *take->n);
    const char *argv[] = {"XREADGROUP", "GROUP", params->group, params->worker_id, "COUNT", count, "STREAMS", stream, cursor};
    moeq_redis_reply *reply = NULL;
    size_t first = *take->n;
    own_ctx c = {.take = *take, .cursor = cursor};
    moeq_err err = moeq_redis_command_argv(redis, 9, argv, NULL, &reply, errstr, errstr_size);
    if (!err && moeq_redis_reply_type_of(reply) != MOEQ_REDIS_NIL)
        err = moeq_redis_entries_foreach(reply, MOEQ_REDIS_XREAD, own_one, &c, errstr, errstr_size);
    moeq_redis_reply_free(reply);
    if (!err && c.take.err) err = moeq_errf(c.take.err, errstr, errstr_size, "decoding a pending entry");
    if (!err && c.n_deleted) err = ack_ids(redis, params, stream, c.deleted, c.n_deleted, errstr, errstr_size);
    for (size_t i = first; !err && i < *take->n; i++) err = delivery_count(redis, params, &take->out[i], errstr, errstr_size);
    if (!err && c.n_seen == 0) cursor[0] = 0;
    return err;
}

/* XRANGE stream id id's entry into take (XRANGE is a read, not a delivery); a deleted entry is acknowledged. */
static moeq_err take_by_id(moeq_redis *redis, const moeq_worker_params *params, const char *stream, const char *id,
                           take_ctx *take, char *errstr, size_t errstr_size) {
    const char *argv[] = {"XRANGE", stream, id, id};
    moeq_redis_reply *reply = NULL;
    moeq_err err = moeq_redis_command_argv(redis, 4, argv, NULL, &reply, errstr, errstr_size);
    size_t before = *take->n;
    if (!err) err = moeq_redis_entries_foreach(reply, MOEQ_REDIS_XRANGE, take_one, take, errstr, errstr_size);
    moeq_redis_reply_free(reply);
    if (!err && take->err) err = moeq_errf(take->err, errstr, errstr_size, "decoding a pending entry");
    if (err) return err;
    if (*take->n == before) { /* trimmed away while pending: nothing to run */
        char ids[1][48];
        snprintf(ids[0], sizeof ids[0], "%s", id);
        return ack_ids(redis, params, stream, ids, 1, errstr, errstr_size);
    }
    snprintf(take->out[before].stream, sizeof take->out[before].stream, "%s", stream);
    return delivery_count(redis, params, &take->out[before], errstr, errstr_size);
}

/*
 * A hand-off sweep of stream p: the entries pending for this worker after cursor, listed with XPENDING and
 * read with XRANGE. Unlike a history XREADGROUP neither counts as a delivery: a sweep every heartbeat
 * would otherwise push every batch this worker runs past max_deliveries, and a restart would dead-letter
 * them. Entries held() knows (running here) are skipped without being read.
 */
static moeq_err sweep_own_stream(moeq_redis *redis, const moeq_worker_params *params, int p, char *cursor,
                                 take_ctx *take, int (*held)(void *, const char *, const char *), void *held_ctx,
                                 char *errstr, size_t errstr_size) {
    char stream[96], start[56], count[24];
    moeq_worker_stream_name(params, p, stream, sizeof stream);
    snprintf(start, sizeof start, "%s%s", strcmp(cursor, "0") ? "(" : "", strcmp(cursor, "0") ? cursor : "-");
    snprintf(count, sizeof count, "%d", 64);
    const char *argv[] = {"XPENDING", stream, params->group, start, "+", count, params->worker_id};
    moeq_redis_reply *reply = NULL;
    moeq_err err = moeq_redis_command_argv(redis, 7, argv, NULL, &reply, errstr, errstr_size);
    size_t n_seen = err ? 0 : moeq_redis_reply_len(reply);
    for (size_t i = 0; !err && i < n_seen && *take->n < take->cap; i++) {
        const char *id = moeq_redis_reply_str(moeq_redis_reply_at(moeq_redis_reply_at(reply, i), 0), NULL);
        if (!id) continue;
        snprintf(cursor, 48, "%s", id);
        if (!held || !held(held_ctx, stream, id)) err = take_by_id(redis, params, stream, id, take, errstr, errstr_size);
    }
    moeq_redis_reply_free(reply);
    if (!err && n_seen == 0) cursor[0] = 0;
    return err;
}

moeq_err worker_io_take_own(moeq_redis *redis, const moeq_worker_params *params, char cursors[4][48], int sweep,
                            int (*held)(void *ctx, const char *stream, const char *id), void *held_ctx,
                            worker_entry *out, size_t cap, size_t *n, char *errstr, size_t errstr_size) {
    *n = 0;
    take_ctx take = {out, cap, n, MOEQ_OK, &params->limits};
    for (int p = 0; p < 4 && *n < cap; p++) {
        if (!cursors[p][0]) continue;
        moeq_err err = sweep ? sweep_own_stream(redis, params, p, cursors[p], &take, held, held_ctx, errstr, errstr_size)
                             : take_own_stream(redis, params, p, cursors[p], &take, errstr, errstr_size);
        if (err) {
            for (size_t i = 0; i < *n; i++) worker_entry_free(&out[i]);
            *n = 0;
            return err;
        }
    }
    return MOEQ_OK;
}

/* ---- job records ------------------------------------------------------------ */

static void job_key(const char *prefix, const char *id, char *out, size_t out_size) {
    snprintf(out, out_size, "%s:job:%s", prefix, id);
}

/*
 * Read the replies of n queued commands, all of them even after the
 * connection was lost (the adapter then answers each at once): a reply left
 * unread would refuse every later command on the handle. The first error
 * wins, with its message.
 */
static moeq_err drain_replies(moeq_redis *redis, size_t n, char *errstr, size_t errstr_size) {
    moeq_err first = MOEQ_OK;
    for (size_t i = 0; i < n; i++) {
        moeq_redis_reply *reply = NULL;
        moeq_err err = first ? moeq_redis_get_reply(redis, &reply, NULL, 0)
                             : moeq_redis_get_reply(redis, &reply, errstr, errstr_size);
        moeq_redis_reply_free(reply);
        if (err && !first) first = err;
    }
    return first;
}

/* A command could not be queued after `queued` others: read theirs, return its error. */
static moeq_err append_failed(moeq_redis *redis, moeq_err err, size_t queued) {
    drain_replies(redis, queued, NULL, 0);
    return err;
}

moeq_err worker_io_job_states(moeq_redis *redis, const char *prefix, const char *const *ids, size_t n, char *states, char *errstr,
                              size_t errstr_size) {
    char key[JOB_KEY_MAX];
    for (size_t i = 0; i < n; i++) {
        job_key(prefix, ids[i], key, sizeof key);
        const char *argv[] = {"HMGET", key, "state", "cancel"};
        moeq_err err = moeq_redis_append_argv(redis, 4, argv, NULL, errstr, errstr_size);
        if (err) return append_failed(redis, err, i);
    }
    moeq_err first = MOEQ_OK;
    for (size_t i = 0; i < n; i++) {
        moeq_redis_reply *reply = NULL;
        moeq_err err = moeq_redis_get_reply(redis, &reply, errstr, errstr_size);
        states[i] = '-';
        if (!err) {
            const char *st = moeq_redis_reply_str(moeq_redis_reply_at(reply, 0), NULL);
            const char *cancel = moeq_redis_reply_str(moeq_redis_reply_at(reply, 1), NULL);
            if (st && (!strcmp(st, "done") || !strcmp(st, "failed"))) states[i] = 'D';
            else if ((st && !strcmp(st, "cancelled")) || (cancel && strcmp(cancel, "0") && *cancel)) states[i] = 'C';
        } else if (!first) {
            first = err;
        }
        moeq_redis_reply_free(reply);
    }
    return first;
}

moeq_err worker_io_mark_running(moeq_redis *redis, const moeq_worker_params *params, const char *worker_id,
                                const char *const *ids, size_t n, char *errstr, size_t errstr_size) {
    char key[JOB_KEY_MAX];
    for (size_t i = 0; i < n; i++) {
        job_key(params->redis_prefix, ids[i], key, sizeof key);
        const char *argv[] = {"HSET", key, "state", "running", "worker", worker_id};
        moeq_err err = moeq_redis_append_argv(redis, 6, argv, NULL, errstr, errstr_size);
        if (err) return append_failed(redis, err, i);
    }
    return drain_replies(redis, n, errstr, errstr_size);
}

/* Queue HSET state done|failed (+ EXPIRE) of job i for every i with pick[i] (NULL: every job); *queued counts replies. */
static moeq_err append_finished(moeq_redis *redis, const moeq_worker_params *params, const char *worker_id,
                                const worker_entry *entry, const char *states, const char *pick, size_t *queued,
                                char *errstr, size_t errstr_size) {
    char key[JOB_KEY_MAX], now[24], ttl[24];
    snprintf(now, sizeof now, "%lld", (long long)moeq_now_ms());
    snprintf(ttl, sizeof ttl, "%lld", (long long)params->dedupe_window_s);
    for (size_t i = 0; i < entry->n_jobs; i++) {
        const worker_entry_job *wj = &entry->jobs[i];
        const char *id = wj->job.id ? wj->job.id : NULL;
        if (!id || (pick && !pick[i])) continue;
        job_key(params->redis_prefix, id, key, sizeof key);
        const char *st = states && states[i] == 'F' ? "failed" : "done";
        const char *argv[] = {"HSET", key, "state", st, "worker", worker_id, "finished_ms", now};
        moeq_err err = moeq_redis_append_argv(redis, 8, argv, NULL, errstr, errstr_size);
        if (err) return append_failed(redis, err, *queued);
        (*queued)++;
        if (params->dedupe_window_s > 0) {
            const char *ex[] = {"EXPIRE", key, ttl};
            if ((err = moeq_redis_append_argv(redis, 3, ex, NULL, errstr, errstr_size)))
                return append_failed(redis, err, *queued);
            (*queued)++;
        }
    }
    return MOEQ_OK;
}

moeq_err worker_io_mark_finished(moeq_redis *redis, const moeq_worker_params *params, const char *worker_id,
                                 const worker_entry *entry, const char *states, const char *pick, char *errstr,
                                 size_t errstr_size) {
    size_t queued = 0;
    moeq_err err = append_finished(redis, params, worker_id, entry, states, pick, &queued, errstr, errstr_size);
    return err ? err : drain_replies(redis, queued, errstr, errstr_size);
}

moeq_err worker_io_ack(moeq_redis *redis, const moeq_worker_params *params, const char *worker_id,
                       const worker_entry *entry, const char *states, char *errstr, size_t errstr_size) {
    size_t queued = 0;
    moeq_err err = append_finished(redis, params, worker_id, entry, states, NULL, &queued, errstr, errstr_size);
    if (err) return err;
    /* XACK and XDEL together or not at all: an entry acknowledged but left in the stream would stay forever */
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
    const char *xack[] = {"XACK", entry->stream, params->group, entry->id};
    const char *xdel[] = {"XDEL", entry->stream, entry->id};
    const char *const *tx[] = {multi, xack, xdel, exec};
    const int tx_argc[] = {1, 4, 3, 1};
    for (int k = 0; k < 4; k++) {
        if ((err = moeq_redis_append_argv(redis, tx_argc[k], tx[k], NULL, errstr, errstr_size)))
            return append_failed(redis, err, queued);
        queued++;
    }
    return drain_replies(redis, queued, errstr, errstr_size);
}

/*
 * KEYS[1] stream; ARGV: group, forget_idle_ms, the consumer to keep. Returns {trimmed, forgotten}. With
 * nothing pending every entry up to the last delivered one was acknowledged: MINID is the id just after it.
 */
static const char SWEEP_LUA[] =
    "local function field(t, name)\n"
    "  for i = 1, #t, 2 do if t[i] == name then return t[i + 1] end end\n"
    "end\n"
    "local min = redis.call('XPENDING', KEYS[1], ARGV[1])[2]\n"
    "if not min then\n"
    "  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do\n"
    "    if field(g, 'name') == ARGV[1] then\n"
    "      local ms, seq = string.match(field(g, 'last-delivered-id'), '^(%d+)-(%d+)$')\n"
    "      if ms and ms ~= '0' then min = ms .. '-' .. string.format('%d', tonumber(seq) + 1) end\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local trimmed, forgotten = 0, 0\n"
    "if min then trimmed = redis.call('XTRIM', KEYS[1], 'MINID', min) end\n"
    "for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do\n"
    "  local name = field(c, 'name')\n"
    "  if field(c, 'pending') == 0 and field(c, 'idle') > tonumber(ARGV[2]) and name ~= ARGV[3] then\n"
    "    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)\n"
    "    forgotten = forgotten + 1\n"
    "  end\n"
    "end\n"
    "return {trimmed, forgotten}\n";

moeq_err worker_io_sweep(moeq_redis *redis, const moeq_worker_params *params, int priority, int64_t forget_idle_ms,
                         const char *keep, long long *trimmed, long long *forgotten, char *errstr, size_t errstr_size) {
    char stream[96], idle[24];
    moeq_worker_stream_name(params, priority, stream, sizeof stream);
    snprintf(idle, sizeof idle, "%lld", (long long)forget_idle_ms);
    const char *argv[] = {"EVAL", SWEEP_LUA, "1", stream, params->group, idle, keep};
    moeq_redis_reply *reply = NULL;
    moeq_err err = moeq_redis_command_argv(redis, 7, argv, NULL, &reply, errstr, errstr_size);
    *trimmed = err ? 0 : moeq_redis_reply_int(moeq_redis_reply_at(reply, 0));
    *forgotten = err ? 0 : moeq_redis_reply_int(moeq_redis_reply_at(reply, 1));
    moeq_redis_reply_free(reply);
    return err;
}

/*
 * A held entry's idle time back to 0 while this consumer still owns it (XPENDING names it): a batch that runs
 * longer than visibility_timeout_ms is not reclaimed from a live worker. Owned by another (it was reclaimed while
 * this one stalled): left alone, never claimed back. KEYS[1] stream; ARGV group, consumer, id. 1 = refreshed.
 */
static const char REFRESH_LUA[] =
    "local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)\n"
    "if p[1] == nil or p[1][2] ~= ARGV[2] then return 0 end\n"
    "redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')\n"
    "return 1\n";

moeq_err worker_io_refresh_claim(moeq_redis *redis, const moeq_worker_params *params, const char *worker_id,
                                 const worker_entry *entry, int *still_ours, char *errstr, size_t errstr_size) {
    const char *argv[] = {"EVAL", REFRESH_LUA, "1", entry->stream, params->group, worker_id, entry->id};
    moeq_redis_reply *reply = NULL;
    moeq_err err = moeq_redis_command_argv(redis, 7, argv, NULL, &reply, errstr, errstr_size);
    *still_ours = err ? 1 : moeq_redis_reply_int(reply) == 1;
    moeq_redis_reply_free(reply);
    return err;
}

moeq_err worker_io_hand_back(moeq_redis *redis, const moeq_worker_params *params, const char *worker_id,
                             const worker_entry *entry, char *errstr, size_t errstr_size) {
    char idle[24];
    snprintf(idle, sizeof idle, "%lld", (long long)params->visibility_timeout_ms);
    const char *argv[] = {"XCLAIM", entry->stream, params->group, worker_id, "0", entry->id, "IDLE", idle, "JUSTID"};
    return moeq_redis_command_argv(redis, 9, argv, NULL, NULL, errstr, errstr_size);
}

/* ---- cancel notices -------------------------------------------------------- */

typedef struct cancel_ctx {
    worker_io_cancel_fn fn;
    void *opaque;
    char *cursor;
    size_t cursor_size;
} cancel_ctx;

static int cancel_one(const moeq_redis_entry *entry, void *opaque) {
    cancel_ctx *c = opaque;
    const char *id = entry->fields ? moeq_redis_entry_get(entry, "id", NULL) : NULL;
    if (id && *id && c->fn) c->fn(id, c->opaque);
    snprintf(c->cursor, c->cursor_size, "%s", entry->id);
    return 0;
}

static moeq_err cancels_init(moeq_redis *redis, const char *key, char *cursor, size_t cursor_size, char *errstr,
                             size_t errstr_size) {
    const char *argv[] = {"XREVRANGE", key, "+", "-", "COUNT", "1"};
    moeq_redis_reply *reply = NULL;
    moeq_err err = moeq_redis_command_argv(redis, 6, argv, NULL, &reply, errstr, errstr_size);
    char last[48] = "0-0";
    cancel_ctx c = {NULL, NULL, last, sizeof last};
    if (!err) err = moeq_redis_entries_foreach(reply, MOEQ_REDIS_XRANGE, cancel_one, &c, errstr, errstr_size);
    moeq_redis_reply_free(reply);
    if (!err) snprintf(cursor, cursor_size, "%s", last);
    return err;
}

moeq_err worker_io_cancels(moeq_redis *redis, const char *prefix, char *cursor, size_t cursor_size,
                           worker_io_cancel_fn fn, void *opaque, char *errstr, size_t errstr_size) {
    char key[256];
    snprintf(key, sizeof key, "%s:%s", prefix, WORKER_IO_CANCELS_KEY);
    if (!cursor[0]) return cancels_init(redis, key, cursor, cursor_size, errstr, errstr_size);
    const char *argv[] = {"XREAD", "COUNT", "256", "STREAMS", key, cursor};
    moeq_redis_reply *reply = NULL;
    moeq_err err = moeq_redis_command_argv(redis, 6, argv, NULL, &reply, errstr, errstr_size);
    cancel_ctx c = {fn, opaque, cursor, cursor_size};
    if (!err && moeq_redis_reply_type_of(reply) != MOEQ_REDIS_NIL)
        err = moeq_redis_entries_foreach(reply, MOEQ_REDIS_XREAD, cancel_one, &c, errstr, errstr_size);
    moeq_redis_reply_free(reply);
    return err;
}

/* ---- delivery errors ---------------------------------------------------------- */

int worker_delivery_is_permanent(moeq_err err, int failures) {
    switch (err) {
    case MOEQ_ERR_LIMIT:
    case MOEQ_ERR_NOT_FOUND:
    case MOEQ_ERR_INVALID_ARG:
    case MOEQ_ERR_FORMAT:
    case MOEQ_ERR_PARSE:
    case MOEQ_ERR_UNSUPPORTED: return 1;
    case MOEQ_ERR_IO: return failures >= WORKER_DELIVERY_MAX_UNCLASSIFIED;
    default: return 0;
    }
}

moeq_err worker_io_heartbeat(moeq_redis *redis, const char *prefix, const char *worker_id, const char *json, int64_t ttl_ms,
                             char *errstr, size_t errstr_size) {
    char key[256], px[24];
    snprintf(key, sizeof key, "%s:worker:%s", prefix, worker_id);
    if (!json) {
        const char *argv[] = {"DEL", key};
        return moeq_redis_command_argv(redis, 2, argv, NULL, NULL, errstr, errstr_size);
    }
    snprintf(px, sizeof px, "%lld", (long long)ttl_ms);
    const char *argv[] = {"SET", key, json, "PX", px};
    return moeq_redis_command_argv(redis, 5, argv, NULL, NULL, errstr, errstr_size);
}

/* ---- affinity ------------------------------------------------------------------ */

moeq_err worker_io_hand_to(moeq_redis *redis, const moeq_worker_params *params, const worker_entry *entry,
                           const char *to, char *errstr, size_t errstr_size) {
    const char *argv[] = {"XCLAIM", entry->stream, params->group, to, "0", entry->id, "JUSTID"};
    moeq_redis_reply *reply = NULL;
    moeq_err err = moeq_redis_command_argv(redis, 7, argv, NULL, &reply, errstr, errstr_size);
    if (!err && moeq_redis_reply_len(reply) != 1) /* no longer pending (acknowledged, trimmed): nothing moved */
        err = moeq_errf(MOEQ_ERR_NOT_FOUND, errstr, errstr_size, "entry %s is not pending", entry->id);
    moeq_redis_reply_free(reply);
    return err;
}

static moeq_err heartbeat_get(moeq_redis *redis, const char *key, size_t key_len, worker_io_heartbeat_fn fn, void *ctx,
                              char *errstr, size_t errstr_size) {
    char k[256];
    snprintf(k, sizeof k, "%.*s", (int)key_len, key);
    const char *argv[] = {"GET", k};
    moeq_redis_reply *reply = NULL;
    moeq_err err = moeq_redis_command_argv(redis, 2, argv, NULL, &reply, errstr, errstr_size);
    size_t len = 0;
    const char *json = err ? NULL : moeq_redis_reply_str(reply, &len);
    if (json && len < 4096) {
        char buf[4096];
        memcpy(buf, json, len);
        buf[len] = 0;
        fn(ctx, buf, len);
    }
    moeq_redis_reply_free(reply);
    return err;
}

moeq_err worker_io_heartbeats(moeq_redis *redis, const char *prefix, worker_io_heartbeat_fn fn, void *ctx,
                              char *errstr, size_t errstr_size) {
    char match[160], cursor[32] = "0";
    snprintf(match, sizeof match, "%s:worker:*", prefix);
    moeq_err err = MOEQ_OK;
    do {
        const char *argv[] = {"SCAN", cursor, "MATCH", match, "COUNT", "100"};
        moeq_redis_reply *reply = NULL;
        if ((err = moeq_redis_command_argv(redis, 6, argv, NULL, &reply, errstr, errstr_size))) break;
        size_t n = 0;
        const char *next = moeq_redis_reply_str(moeq_redis_reply_at(reply, 0), &n);
        snprintf(cursor, sizeof cursor, "%.*s", next && n < sizeof cursor ? (int)n : 1, next ? next : "0");
        const moeq_redis_reply *keys = moeq_redis_reply_at(reply, 1);
        for (size_t i = 0; !err && i < moeq_redis_reply_len(keys); i++) {
            size_t kl = 0;
            const char *k = moeq_redis_reply_str(moeq_redis_reply_at(keys, i), &kl);
            if (k) err = heartbeat_get(redis, k, kl, fn, ctx, errstr, errstr_size);
        }
        moeq_redis_reply_free(reply);
    } while (!err && strcmp(cursor, "0") != 0);
    return err;
}
