/*
 * store.c — Redis calls of the coordinator, through moeq/redis.h only.
 * The Lua scripts are here as text; they are loaded once (SCRIPT LOAD) and
 * run with EVALSHA, reloaded when the server forgot them (NOSCRIPT after a
 * restart).
 */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/job.h"
#include "moeq/redis.h"

/*
 * KEYS[1] stream, KEYS[1+i] record of job i. ARGV: now_ms, ttl_s, priority,
 * n, prefix, closed_ms, jobs blob, then n job ids, n content hashes, n
 * sources (topic/partition/offset), n Kafka timestamps, then the prefix key
 * (pkey, last so the others keep their places). A job is a duplicate
 * when its record exists, or when an earlier job of this same write has its
 * id (two copies in one batch must not both be written); each duplicate is
 * reported as index, state, and the earlier job's batched_ms, hash, source,
 * Kafka timestamp ('' when unknown) so the caller can tell a redelivery from
 * a reused id.
 */
static const char ENQUEUE_LUA[] =
    "local n = tonumber(ARGV[4])\n"
    "local dups, seen = {}, {}\n"
    "for i = 1, n do\n"
    "  local r = redis.call('HMGET', KEYS[1 + i], 'state', 'batch', 'batched_ms', 'hash', 'src', 'kafka_ts')\n"
    "  local st = r[1]\n"
    "  local first = seen[KEYS[1 + i]]\n"
    "  if st then\n"
    "    if st == 'cancelled' and not r[2] then st = 'cancelled' else st = 'enqueued' end\n"
    "    for _, v in ipairs({i - 1, st, r[3] or '', r[4] or '', r[5] or '', r[6] or ''}) do dups[#dups + 1] = v end\n"
    "  elseif first then\n"
    "    for _, v in ipairs({i - 1, 'in_batch', ARGV[1], ARGV[7 + n + first], ARGV[7 + 2 * n + first],\n"
    "                        ARGV[7 + 3 * n + first]}) do dups[#dups + 1] = v end\n"
    "  else\n"
    "    seen[KEYS[1 + i]] = i\n"
    "  end\n"
    "end\n"
    "if #dups > 0 then return {'dup', dups} end\n"
    "local id = redis.call('XADD', KEYS[1], '*', 'v', '1', 'priority', ARGV[3], 'n', ARGV[4],\n"
    "  'prefix', ARGV[5], 'closed_ms', ARGV[6], 'jobs', ARGV[7], 'pkey', ARGV[8 + 4 * n])\n"
    "local ttl = tonumber(ARGV[2])\n"
    "for i = 1, n do\n"
    "  redis.call('HSET', KEYS[1 + i], 'id', ARGV[7 + i], 'state', 'batched', 'batch', id, 'stream', KEYS[1],\n"
    "    'priority', ARGV[3], 'batched_ms', ARGV[1], 'attempts', '0', 'hash', ARGV[7 + n + i],\n"
    "    'src', ARGV[7 + 2 * n + i], 'kafka_ts', ARGV[7 + 3 * n + i])\n"
    "  if ttl > 0 then redis.call('EXPIRE', KEYS[1 + i], ttl) end\n"
    "end\n"
    "return {'ok', id}\n";

/* KEYS[1] record. ARGV: now_ms, ttl_s, id. */
static const char CANCEL_LUA[] =
    "local st = redis.call('HGET', KEYS[1], 'state')\n"
    "if not st then\n"
    "  redis.call('HSET', KEYS[1], 'id', ARGV[3], 'state', 'cancelled', 'cancelled_ms', ARGV[1])\n"
    "  if tonumber(ARGV[2]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end\n"
    "  return 'absent'\n"
    "end\n"
    "if st == 'batched' or st == 'running' then\n"
    "  redis.call('HSET', KEYS[1], 'cancel', '1', 'cancel_ms', ARGV[1])\n"
    /* workers read this stream between engine steps: a running job stops within one step */
    "  redis.call('XADD', KEYS[2], 'MAXLEN', '~', '10000', '*', 'id', ARGV[3])\n"
    "end\n"
    "return st\n";

struct moeq_store {
    moeq_redis *redis;
    moeq_coordinator_params params;
    char enqueue_sha[48], cancel_sha[48];
    /* argv scratch for EVALSHA, grown to the largest batch seen */
    const char **argv;
    size_t *argv_len;
    char (*keys)[640];
    struct job_nums { char hash[MOEQ_JOB_HASH_SIZE], ts[24]; } *jn;
    size_t cap;
    char nums[8][32];
    moeq_buf blob;
};

void moeq_store_stream_key(const moeq_store *s, int priority, char *out, size_t n) {
    snprintf(out, n, "%s:batches:p%d", s->params.redis_prefix, priority);
}

static void record_key(const moeq_store *s, const char *id, char *out, size_t n) {
    snprintf(out, n, "%s:job:%s", s->params.redis_prefix, id);
}

moeq_err moeq_store_new(const moeq_coordinator_params *params, const moeq_kvlist *redis, moeq_store **out,
                        char *errstr, size_t n) {
    *out = NULL;
    moeq_redis_params rp;
    moeq_err err = moeq_redis_params_parse(params->redis_url, redis, &rp, errstr, n);
    if (err) return err;
    moeq_store *s = calloc(1, sizeof(*s));
    if (!s) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "store: out of memory");
    s->params = *params;
    err = moeq_redis_new(&rp, &s->redis, errstr, n);
    if (err) {
        free(s);
        return err;
    }
    *out = s;
    return MOEQ_OK;
}

void moeq_store_destroy(moeq_store *s) {
    if (!s) return;
    moeq_redis_destroy(s->redis);
    free(s->argv);
    free(s->argv_len);
    free(s->keys);
    free(s->jn);
    moeq_buf_free(&s->blob);
    free(s);
}

static moeq_err load_script(moeq_store *s, const char *src, char sha[48], char *errstr, size_t n) {
    moeq_redis_reply *r = NULL;
    const char *argv[] = {"SCRIPT", "LOAD", src};
    moeq_err err = moeq_redis_command_argv(s->redis, 3, argv, NULL, &r, errstr, n);
    const char *v = r ? moeq_redis_reply_str(r, NULL) : NULL;
    if (!err && (!v || strlen(v) >= 48)) err = moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "SCRIPT LOAD: no sha");
    if (!err) snprintf(sha, 48, "%s", v);
    moeq_redis_reply_free(r);
    return err;
}

static moeq_err load_scripts(moeq_store *s, char *errstr, size_t n) {
    moeq_err err = load_script(s, ENQUEUE_LUA, s->enqueue_sha, errstr, n);
    return err ? err : load_script(s, CANCEL_LUA, s->cancel_sha, errstr, n);
}

static void check_fsync(moeq_store *s, char *warning, size_t wn) {
    const char *names[] = {"appendonly", "appendfsync"};
    const char *want[] = {"yes", "always"};
    for (int i = 0; i < 2; i++) {
        moeq_redis_reply *r = NULL;
        const char *argv[] = {"CONFIG", "GET", names[i]};
        char why[256] = "";
        moeq_err err = moeq_redis_command_argv(s->redis, 3, argv, NULL, &r, why, sizeof why);
        if (err && warning && !warning[0]) {
            /* A least-privilege ACL user (docs/SECURITY.md) may not run CONFIG GET: say what is unchecked. */
            snprintf(warning, wn, "cannot read redis %s (%s): make sure the server runs appendonly yes and "
                     "appendfsync always, or set durability = waitaof", names[i], why);
        }
        if (err == MOEQ_OK && moeq_redis_reply_len(r) == 2) {
            const char *v = moeq_redis_reply_str(moeq_redis_reply_at(r, 1), NULL);
            if (v && strcmp(v, want[i]) && warning && !warning[0])
                snprintf(warning, wn, "redis %s is '%s', not '%s': an acknowledged batch can be lost if the "
                         "server crashes (set durability = waitaof, or fix the server)", names[i], v, want[i]);
        }
        moeq_redis_reply_free(r);
    }
}

moeq_err moeq_store_prepare(moeq_store *s, char *warning, size_t wn, char *errstr, size_t n) {
    if (warning && wn) warning[0] = 0;
    moeq_err err = load_scripts(s, errstr, n);
    for (int p = 0; !err && p < MOEQ_BATCHER_CLASSES; p++) {
        char key[128];
        moeq_store_stream_key(s, p, key, sizeof(key));
        moeq_redis_reply *r = NULL;
        const char *argv[] = {"XGROUP", "CREATE", key, MOEQ_STORE_GROUP, "0", "MKSTREAM"};
        err = moeq_redis_command_argv(s->redis, 6, argv, NULL, &r, errstr, n);
        if (err && moeq_redis_reply_is_error(r, "BUSYGROUP")) err = MOEQ_OK;
        moeq_redis_reply_free(r);
    }
    if (!err && moeq_coordinator_durability(&s->params) == MOEQ_DURABILITY_FSYNC_ALWAYS) check_fsync(s, warning, wn);
    return err;
}

static moeq_err grow(moeq_store *s, size_t need) {
    if (need <= s->cap) return MOEQ_OK;
    size_t cap = need * 2;
    const char **argv = realloc(s->argv, cap * sizeof(*argv));
    if (argv) s->argv = argv;
    size_t *lens = realloc(s->argv_len, cap * sizeof(*lens));
    if (lens) s->argv_len = lens;
    char(*keys)[640] = realloc(s->keys, cap * sizeof(*keys));
    if (keys) s->keys = keys;
    struct job_nums *jn = realloc(s->jn, cap * sizeof(*jn));
    if (jn) s->jn = jn;
    if (!argv || !lens || !keys || !jn) return MOEQ_ERR_NOMEM;
    s->cap = cap;
    return MOEQ_OK;
}

/* EVALSHA, reloading the scripts once when the server answers NOSCRIPT. */
static moeq_err evalsha(moeq_store *s, const char *sha, int argc, moeq_redis_reply **r, char *errstr, size_t n) {
    for (int attempt = 0;; attempt++) {
        s->argv[0] = "EVALSHA";
        s->argv_len[0] = 7;
        s->argv[1] = sha;
        s->argv_len[1] = strlen(sha);
        *r = NULL;
        moeq_err err = moeq_redis_command_argv(s->redis, argc, s->argv, s->argv_len, r, errstr, n);
        if (err == MOEQ_OK || attempt > 0 || !moeq_redis_reply_is_error(*r, "NOSCRIPT")) return err;
        moeq_redis_reply_free(*r);
        *r = NULL;
        if ((err = load_scripts(s, errstr, n))) return err;
    }
}

static moeq_err waitaof(moeq_store *s, char *errstr, size_t n) {
    char timeout[32];
    snprintf(timeout, sizeof(timeout), "%lld", (long long)s->params.waitaof_timeout_ms);
    const char *argv[] = {"WAITAOF", "1", "0", timeout};
    moeq_redis_reply *r = NULL;
    moeq_err err = moeq_redis_command_argv(s->redis, 4, argv, NULL, &r, errstr, n);
    if (!err && (moeq_redis_reply_len(r) < 1 || moeq_redis_reply_int(moeq_redis_reply_at(r, 0)) < 1))
        err = moeq_errf(MOEQ_ERR_TIMEOUT, errstr, n, "WAITAOF: the local AOF was not fsynced in %s ms", timeout);
    moeq_redis_reply_free(r);
    return err;
}

static int64_t ms_or_unknown(const char *v) { return v && *v ? strtoll(v, NULL, 10) : -1; }

/* One six-tuple of the script's dup list into dup[k]. */
static int parse_dup(const moeq_redis_reply *v, size_t i, size_t n_jobs, moeq_store_dup *dup) {
    long long k = moeq_redis_reply_int(moeq_redis_reply_at(v, i));
    const char *f[5];
    for (int j = 0; j < 5; j++) f[j] = moeq_redis_reply_str(moeq_redis_reply_at(v, i + 1 + (size_t)j), NULL);
    if (k < 0 || (size_t)k >= n_jobs || !f[0] || !f[1] || !f[2] || !f[3] || !f[4]) return 0;
    moeq_store_dup *d = &dup[k];
    d->kind = !strcmp(f[0], "cancelled") ? MOEQ_STORE_DUP_CANCELLED : MOEQ_STORE_DUP_ENQUEUED;
    d->in_batch = !strcmp(f[0], "in_batch");
    d->batched_ms = ms_or_unknown(f[1]);
    snprintf(d->hash, sizeof(d->hash), "%s", f[2]);
    snprintf(d->src, sizeof(d->src), "%s", f[3]);
    d->kafka_ts_ms = ms_or_unknown(f[4]);
    return 1;
}

static moeq_err parse_enqueue_reply(const moeq_redis_reply *r, size_t n_jobs, int *written, char entry_id[64],
                                    moeq_store_dup *dup, char *errstr, size_t n) {
    const char *tag = moeq_redis_reply_len(r) == 2 ? moeq_redis_reply_str(moeq_redis_reply_at(r, 0), NULL) : NULL;
    const moeq_redis_reply *v = tag ? moeq_redis_reply_at(r, 1) : NULL;
    if (tag && !strcmp(tag, "ok") && moeq_redis_reply_str(v, NULL)) {
        *written = 1;
        snprintf(entry_id, 64, "%s", moeq_redis_reply_str(v, NULL));
        return MOEQ_OK;
    }
    if (!tag || strcmp(tag, "dup") || moeq_redis_reply_len(v) % 6)
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "enqueue script: unexpected reply");
    *written = 0;
    for (size_t i = 0; i + 5 < moeq_redis_reply_len(v); i += 6)
        if (!parse_dup(v, i, n_jobs, dup)) return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "enqueue script: bad dup");
    return MOEQ_OK;
}

int moeq_store_dup_is_redelivery(const moeq_store_dup *d, const char *src) {
    if (!d->src[0] && !d->hash[0]) return 1; /* a record from before hashes: cannot tell, stay silent as then */
    return d->src[0] && src && !strcmp(d->src, src); /* the same message, consumed again */
}

/* Fill argv/argv_len for one enqueue EVALSHA; returns argc (0 on error). */
static int enqueue_args(moeq_store *s, int priority, const moeq_batch_entry_job *jobs, const char *const *sources,
                        size_t n_jobs, int32_t shared_prefix, int64_t closed_ms, int64_t now_ms, char *errstr,
                        size_t n) {
    size_t argc = 3 + (1 + n_jobs) + 7 + 4 * n_jobs + 1;
    if (grow(s, argc)) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "store: out of memory"), 0;
    moeq_buf_reset(&s->blob);
    if (moeq_batch_entry_encode_jobs(jobs, n_jobs, &s->blob))
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, n, "store: cannot encode the batch entry"), 0;
    snprintf(s->nums[0], 32, "%zu", 1 + n_jobs);
    snprintf(s->nums[1], 32, "%lld", (long long)now_ms);
    snprintf(s->nums[2], 32, "%lld", (long long)s->params.dedupe_window_s);
    snprintf(s->nums[3], 32, "%d", priority);
    snprintf(s->nums[4], 32, "%zu", n_jobs);
    snprintf(s->nums[5], 32, "%d", (int)shared_prefix);
    snprintf(s->nums[6], 32, "%lld", (long long)closed_ms);
    /* the key of the shared prefix (any job's tokens: they share it); workers prefer batches they hold */
    uint64_t pkey = n_jobs && shared_prefix > 0 ? moeq_batch_entry_prefix_key(jobs[0].tokens, (size_t)shared_prefix) : 0;
    snprintf(s->nums[7], 32, "%016llx", (unsigned long long)pkey);
    size_t a = 0;
#define ARG(p, len) (s->argv[a] = (p), s->argv_len[a] = (len), a++)
    ARG("EVALSHA", 7);
    ARG(s->enqueue_sha, strlen(s->enqueue_sha));
    ARG(s->nums[0], strlen(s->nums[0]));
    moeq_store_stream_key(s, priority, s->keys[0], sizeof(s->keys[0]));
    ARG(s->keys[0], strlen(s->keys[0]));
    for (size_t i = 0; i < n_jobs; i++) {
        snprintf(s->keys[1 + i], sizeof(s->keys[0]), "%s:job:%.*s", s->params.redis_prefix, (int)jobs[i].id_len, jobs[i].id);
        ARG(s->keys[1 + i], strlen(s->keys[1 + i]));
    }
    for (int k = 1; k <= 6; k++) ARG(s->nums[k], strlen(s->nums[k]));
    ARG((const char *)s->blob.data, s->blob.len);
    for (size_t i = 0; i < n_jobs; i++) ARG(jobs[i].id, jobs[i].id_len);
    for (size_t i = 0; i < n_jobs; i++) {
        moeq_job_content_hash(jobs[i].job, jobs[i].job_len, s->jn[i].hash);
        ARG(s->jn[i].hash, strlen(s->jn[i].hash));
    }
    for (size_t i = 0; i < n_jobs; i++) {
        const char *src = sources && sources[i] ? sources[i] : "";
        ARG(src, strlen(src));
    }
    for (size_t i = 0; i < n_jobs; i++) {
        snprintf(s->jn[i].ts, sizeof(s->jn[i].ts), "%lld", (long long)jobs[i].kafka_ts_ms);
        ARG(s->jn[i].ts, strlen(s->jn[i].ts));
    }
    ARG(s->nums[7], strlen(s->nums[7]));
#undef ARG
    return (int)a;
}

moeq_err moeq_store_append_batch(moeq_store *s, int priority, const moeq_batch_entry_job *jobs,
                                 const char *const *sources, size_t n_jobs, int32_t shared_prefix, int64_t closed_ms,
                                 int64_t now_ms, char *errstr, size_t n) {
    int argc = enqueue_args(s, priority, jobs, sources, n_jobs, shared_prefix, closed_ms, now_ms, errstr, n);
    if (!argc) return MOEQ_ERR_LIMIT;
    return moeq_redis_append_argv(s->redis, argc, s->argv, s->argv_len, errstr, n);
}

moeq_err moeq_store_read_batch(moeq_store *s, size_t n_jobs, int *written, char entry_id[64], moeq_store_dup *dup,
                               char *errstr, size_t n) {
    *written = 0;
    entry_id[0] = 0;
    memset(dup, 0, n_jobs * sizeof(*dup));
    moeq_redis_reply *r = NULL;
    moeq_err err = moeq_redis_get_reply(s->redis, &r, errstr, n);
    if (err == MOEQ_ERR_NOT_FOUND && moeq_redis_reply_is_error(r, "NOSCRIPT")) { /* server restarted: reload, retry */
        moeq_err e2 = load_scripts(s, errstr, n);
        err = e2 ? e2 : moeq_errf(MOEQ_ERR_TRANSIENT, errstr, n, "enqueue script was not loaded; reloaded");
    }
    if (!err) err = parse_enqueue_reply(r, n_jobs, written, entry_id, dup, errstr, n);
    moeq_redis_reply_free(r);
    return err;
}

moeq_err moeq_store_sync(moeq_store *s, char *errstr, size_t n) {
    return moeq_coordinator_durability(&s->params) == MOEQ_DURABILITY_WAITAOF ? waitaof(s, errstr, n) : MOEQ_OK;
}

moeq_err moeq_store_write_batch(moeq_store *s, int priority, const moeq_batch_entry_job *jobs,
                                const char *const *sources, size_t n_jobs, int32_t shared_prefix, int64_t closed_ms,
                                int64_t now_ms, int *written, char entry_id[64], moeq_store_dup *dup, char *errstr,
                                size_t n) {
    *written = 0;
    entry_id[0] = 0;
    memset(dup, 0, n_jobs * sizeof(*dup));
    int argc = enqueue_args(s, priority, jobs, sources, n_jobs, shared_prefix, closed_ms, now_ms, errstr, n);
    if (!argc) return MOEQ_ERR_LIMIT;
    moeq_redis_reply *r = NULL;
    moeq_err err = evalsha(s, s->enqueue_sha, argc, &r, errstr, n);
    if (!err) err = parse_enqueue_reply(r, n_jobs, written, entry_id, dup, errstr, n);
    moeq_redis_reply_free(r);
    if (!err && *written) err = moeq_store_sync(s, errstr, n);
    return err;
}

moeq_err moeq_store_cancel(moeq_store *s, const char *id, int64_t now_ms, char *state_out, size_t state_size,
                           char *errstr, size_t n) {
    if (grow(s, 8)) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "store: out of memory");
    char now[32], ttl[32];
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)s->params.dedupe_window_s);
    record_key(s, id, s->keys[0], sizeof(s->keys[0]));
    snprintf(s->keys[1], sizeof(s->keys[1]), "%s:cancels", s->params.redis_prefix);
    const char *args[] = {"2", s->keys[0], s->keys[1], now, ttl, id};
    for (int i = 0; i < 6; i++) {
        s->argv[2 + i] = args[i];
        s->argv_len[2 + i] = strlen(args[i]);
    }
    moeq_redis_reply *r = NULL;
    moeq_err err = evalsha(s, s->cancel_sha, 8, &r, errstr, n);
    const char *st = r ? moeq_redis_reply_str(r, NULL) : NULL;
    if (!err && state_out && state_size) snprintf(state_out, state_size, "%s", st ? st : "?");
    moeq_redis_reply_free(r);
    return err;
}

/*
 * pending + lag of group `workers` in one XINFO GROUPS reply; -1 when absent;
 * -2 when Redis cannot tell the lag (nil: entries deleted after acknowledgement
 * leave tombstones around the group's last delivered id). Workers delete
 * every entry they acknowledge, so the stream's length is then the backlog.
 */
static long long group_backlog(const moeq_redis_reply *r) {
    for (size_t g = 0; g < moeq_redis_reply_len(r); g++) {
        const moeq_redis_reply *m = moeq_redis_reply_at(r, g);
        long long pending = 0, lag = -1;
        int mine = 0, lag_unknown = 0;
        for (size_t i = 0; i + 1 < moeq_redis_reply_len(m); i += 2) {
            const char *k = moeq_redis_reply_str(moeq_redis_reply_at(m, i), NULL);
            const moeq_redis_reply *v = moeq_redis_reply_at(m, i + 1);
            if (!k) continue;
            if (!strcmp(k, "name")) mine = moeq_redis_reply_str(v, NULL) && !strcmp(moeq_redis_reply_str(v, NULL), MOEQ_STORE_GROUP);
            else if (!strcmp(k, "pending")) pending = moeq_redis_reply_int(v);
            else if (!strcmp(k, "lag") && moeq_redis_reply_type_of(v) == MOEQ_REDIS_INTEGER) lag = moeq_redis_reply_int(v);
            else if (!strcmp(k, "lag")) lag_unknown = moeq_redis_reply_type_of(v) == MOEQ_REDIS_NIL;
        }
        if (mine) return lag_unknown ? -2 : pending + (lag >= 0 ? lag : 0);
    }
    return -1;
}

moeq_err moeq_store_pending_batches(moeq_store *s, int64_t *pending, char *errstr, size_t n) {
    *pending = 0;
    for (int p = 0; p < MOEQ_BATCHER_CLASSES; p++) {
        char key[128];
        moeq_store_stream_key(s, p, key, sizeof(key));
        const char *argv[] = {"XINFO", "GROUPS", key};
        moeq_redis_reply *r = NULL;
        moeq_err err = moeq_redis_command_argv(s->redis, 3, argv, NULL, &r, errstr, n);
        long long b = err ? -1 : group_backlog(r);
        moeq_redis_reply_free(r);
        if (err && err != MOEQ_ERR_INVALID_ARG) return err; /* a missing stream is not an error */
        if (b < 0) { /* no group (yet), or a lag Redis cannot tell: everything in the stream is pending */
            const char *xlen[] = {"XLEN", key};
            r = NULL;
            err = moeq_redis_command_argv(s->redis, 2, xlen, NULL, &r, errstr, n);
            if (err) { moeq_redis_reply_free(r); return err; }
            b = moeq_redis_reply_int(r);
            moeq_redis_reply_free(r);
        }
        *pending += b;
    }
    return MOEQ_OK;
}

moeq_err moeq_store_print_job(moeq_store *s, const char *id, void *file, char *errstr, size_t n) {
    char key[640];
    record_key(s, id, key, sizeof(key));
    const char *argv[] = {"HGETALL", key};
    moeq_redis_reply *r = NULL;
    moeq_err err = moeq_redis_command_argv(s->redis, 2, argv, NULL, &r, errstr, n);
    if (!err && moeq_redis_reply_len(r) == 0) err = moeq_errf(MOEQ_ERR_NOT_FOUND, errstr, n, "no record for job '%s'", id);
    for (size_t i = 0; !err && i + 1 < moeq_redis_reply_len(r); i += 2)
        fprintf((FILE *)file, "%s=%s\n", moeq_redis_reply_str(moeq_redis_reply_at(r, i), NULL),
                moeq_redis_reply_str(moeq_redis_reply_at(r, i + 1), NULL));
    moeq_redis_reply_free(r);
    return err;
}
