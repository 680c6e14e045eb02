/*
 * ep_rendezvous_redis.c — moeq_ep_rendezvous over one Redis hash per group,
 * with generations (see ep_rendezvous_redis.h). Polls: a group forms once per
 * start, so a few round trips every 10 ms cost nothing.
 */
#define _POSIX_C_SOURCE 200809L
#include "ep_rendezvous_redis.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moeq/util.h"

struct worker_ep_rv {
    moeq_redis *redis;
    char key[256];
    int rank, n_ranks, timeout_ms;
    int64_t gen;
};

/* Rank 0: a new generation, with no address of an older one left behind. */
static const char OPEN_LUA[] =
    "local g = redis.call('HINCRBY', KEYS[1], 'gen', 1) "
    "for i = 0, tonumber(ARGV[1]) - 1 do redis.call('HDEL', KEYS[1], 'addr:' .. i) end "
    "redis.call('PEXPIRE', KEYS[1], ARGV[2]) return g";

static const char FORMED_LUA[] =
    "local f = tonumber(redis.call('HGET', KEYS[1], 'formed') or '0') "
    "if f < tonumber(ARGV[1]) then redis.call('HSET', KEYS[1], 'formed', ARGV[1]) end "
    "redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1";

static void pause_ms(int ms) { nanosleep(&(struct timespec){0, (long)ms * 1000000L}, NULL); }

static int64_t reply_num(const moeq_redis_reply *r) {
    if (!r) return 0;
    if (moeq_redis_reply_type_of(r) == MOEQ_REDIS_INTEGER) return moeq_redis_reply_int(r);
    const char *s = moeq_redis_reply_str(r, NULL);
    return s ? strtoll(s, NULL, 10) : 0;
}

/* gen and formed, as they are now. */
static moeq_err read_gens(worker_ep_rv *rv, int64_t *gen, int64_t *formed, char *errstr, size_t n) {
    const char *argv[] = {"HMGET", rv->key, "gen", "formed"};
    moeq_redis_reply *r = NULL;
    moeq_err err = moeq_redis_command_argv(rv->redis, 4, argv, NULL, &r, errstr, n);
    if (!err) *gen = reply_num(moeq_redis_reply_at(r, 0)), *formed = reply_num(moeq_redis_reply_at(r, 1));
    moeq_redis_reply_free(r);
    return err;
}

static moeq_err open_gen(worker_ep_rv *rv, char *errstr, size_t n) {
    char ranks[16], ttl[32];
    snprintf(ranks, sizeof ranks, "%d", rv->n_ranks);
    snprintf(ttl, sizeof ttl, "%lld", WORKER_EP_RV_TTL_MS);
    const char *argv[] = {"EVAL", OPEN_LUA, "1", rv->key, ranks, ttl};
    moeq_redis_reply *r = NULL;
    moeq_err err = moeq_redis_command_argv(rv->redis, 6, argv, NULL, &r, errstr, n);
    if (!err) rv->gen = reply_num(r);
    moeq_redis_reply_free(r);
    return err;
}

/* Ranks > 0: the generation rank 0 opened and the group has not formed yet. */
static moeq_err wait_gen(worker_ep_rv *rv, char *errstr, size_t n) {
    int64_t deadline = moeq_now_ms() + rv->timeout_ms, gen = 0, formed = 0;
    for (;;) {
        moeq_err err = read_gens(rv, &gen, &formed, errstr, n);
        if (err) return err;
        if (gen > formed) {
            rv->gen = gen;
            return MOEQ_OK;
        }
        if (moeq_now_ms() >= deadline)
            return moeq_errf(MOEQ_ERR_TIMEOUT, errstr, n,
                             "ep rendezvous %s: rank 0 opened no new generation within %d ms (generation %lld "
                             "formed already)", rv->key, rv->timeout_ms, (long long)formed);
        pause_ms(10);
    }
}

moeq_err worker_ep_rv_new(moeq_redis *redis, const char *prefix, const char *group, int rank, int n_ranks,
                          int timeout_ms, worker_ep_rv **out, char *errstr, size_t errstr_size) {
    *out = NULL;
    if (!redis || !group || !*group || rank < 0 || rank >= n_ranks)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "ep rendezvous: group, rank < ranks required");
    worker_ep_rv *rv = calloc(1, sizeof *rv);
    if (!rv) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "ep rendezvous");
    rv->redis = redis, rv->rank = rank, rv->n_ranks = n_ranks, rv->timeout_ms = timeout_ms;
    snprintf(rv->key, sizeof rv->key, "%s:ep:%s", prefix && *prefix ? prefix : "moeq", group);
    moeq_err err = rank == 0 ? open_gen(rv, errstr, errstr_size) : wait_gen(rv, errstr, errstr_size);
    if (err) {
        free(rv);
        return err;
    }
    *out = rv;
    return MOEQ_OK;
}

void worker_ep_rv_destroy(worker_ep_rv *rv) { free(rv); }

int64_t worker_ep_rv_generation(const worker_ep_rv *rv) { return rv->gen; }

static moeq_err rv_publish(void *ctx, int rank, const void *addr, size_t len, char *errstr, size_t n) {
    worker_ep_rv *rv = ctx;
    char field[32], prefix[32], ttl[32];
    snprintf(field, sizeof field, "addr:%d", rank);
    int pl = snprintf(prefix, sizeof prefix, "%lld:", (long long)rv->gen);
    char *value = malloc((size_t)pl + len + 1);
    if (!value) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "ep rendezvous: address of %zu bytes", len);
    memcpy(value, prefix, (size_t)pl);
    memcpy(value + pl, addr, len);
    const char *argv[] = {"HSET", rv->key, field, value};
    size_t lens[] = {4, strlen(rv->key), strlen(field), (size_t)pl + len};
    moeq_err err = moeq_redis_command_argv(rv->redis, 4, argv, lens, NULL, errstr, n);
    free(value);
    snprintf(ttl, sizeof ttl, "%lld", WORKER_EP_RV_TTL_MS);
    const char *exp[] = {"PEXPIRE", rv->key, ttl};
    if (!err) err = moeq_redis_command_argv(rv->redis, 3, exp, NULL, NULL, errstr, n);
    return err;
}

/* One look: 1 with *addr when rank published in this generation, 0 not yet; IO when the group moved on. */
static moeq_err look_once(worker_ep_rv *rv, int rank, void **addr, size_t *len, int *found, char *errstr, size_t n) {
    char field[32], prefix[32];
    snprintf(field, sizeof field, "addr:%d", rank);
    int pl = snprintf(prefix, sizeof prefix, "%lld:", (long long)rv->gen);
    const char *argv[] = {"HMGET", rv->key, "gen", field};
    moeq_redis_reply *r = NULL;
    moeq_err err = moeq_redis_command_argv(rv->redis, 4, argv, NULL, &r, errstr, n);
    *found = 0;
    if (!err) {
        int64_t gen = reply_num(moeq_redis_reply_at(r, 0));
        size_t vl = 0;
        const char *v = moeq_redis_reply_str(moeq_redis_reply_at(r, 1), &vl);
        if (gen != rv->gen) {
            err = moeq_errf(MOEQ_ERR_IO, errstr, n,
                            "ep rendezvous %s: the group re-formed under generation %lld (this rank joined %lld)",
                            rv->key, (long long)gen, (long long)rv->gen);
        } else if (v && vl >= (size_t)pl && memcmp(v, prefix, (size_t)pl) == 0) {
            *addr = malloc(vl - (size_t)pl + 1);
            if (!*addr) err = moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "ep rendezvous: address");
            else memcpy(*addr, v + pl, vl - (size_t)pl), *len = vl - (size_t)pl, *found = 1;
        }
    }
    moeq_redis_reply_free(r);
    return err;
}

static moeq_err rv_lookup(void *ctx, int rank, int timeout_ms, void **addr, size_t *len, char *errstr, size_t n) {
    worker_ep_rv *rv = ctx;
    if (timeout_ms < rv->timeout_ms) timeout_ms = rv->timeout_ms; /* the join window: peers may still be loading */
    int64_t deadline = moeq_now_ms() + timeout_ms;
    for (;;) {
        int found = 0;
        moeq_err err = look_once(rv, rank, addr, len, &found, errstr, n);
        if (err || found) return err;
        if (moeq_now_ms() >= deadline)
            return moeq_errf(MOEQ_ERR_TIMEOUT, errstr, n,
                             "ep rendezvous %s: rank %d did not publish in generation %lld within %d ms", rv->key, rank,
                             (long long)rv->gen, timeout_ms);
        pause_ms(10);
    }
}

moeq_ep_rendezvous worker_ep_rv_hook(worker_ep_rv *rv) { return (moeq_ep_rendezvous){rv, rv_publish, rv_lookup}; }

moeq_err worker_ep_rv_formed(worker_ep_rv *rv, char *errstr, size_t errstr_size) {
    char gen[32], ttl[32];
    snprintf(gen, sizeof gen, "%lld", (long long)rv->gen);
    snprintf(ttl, sizeof ttl, "%lld", WORKER_EP_RV_TTL_MS);
    const char *argv[] = {"EVAL", FORMED_LUA, "1", rv->key, gen, ttl};
    return moeq_redis_command_argv(rv->redis, 6, argv, NULL, NULL, errstr, errstr_size);
}
