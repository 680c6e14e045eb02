/*
 * test_coordinator_backlog.c — the coordinator's backlog (the sum behind
 * max_pending_batches) stays right when workers delete the entries they
 * acknowledge: Redis then may report the group's lag as nil (a tombstone at
 * the group's last delivered id with older entries still in the stream),
 * and the backlog falls back to the stream's length. Raw commands play the
 * worker; the coordinator's store measures. Needs the `services` fixture
 * (skips with 77 without it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "moeq/redis.h"
#include "services_env.h"
#include "store.h"

static moeq_redis_reply *redis_do(moeq_redis *r, int argc, const char **argv) {
    moeq_redis_reply *rep = NULL;
    char err[512];
    moeq_err e = moeq_redis_command_argv(r, argc, argv, NULL, &rep, err, sizeof err);
    if (e) fprintf(stderr, "redis %s: %s\n", argv[0], err);
    assert_int_equal(e, MOEQ_OK);
    return rep;
}

/* The group's lag field on stream key: 1 when nil, 0 when a number. */
static int lag_is_nil(moeq_redis *r, const char *key) {
    const char *argv[] = {"XINFO", "GROUPS", key};
    moeq_redis_reply *rep = redis_do(r, 3, argv);
    const moeq_redis_reply *g = moeq_redis_reply_at(rep, 0);
    int nil = 0;
    for (size_t i = 0; i + 1 < moeq_redis_reply_len(g); i += 2) {
        const char *k = moeq_redis_reply_str(moeq_redis_reply_at(g, i), NULL);
        if (k && !strcmp(k, "lag")) nil = moeq_redis_reply_type_of(moeq_redis_reply_at(g, i + 1)) == MOEQ_REDIS_NIL;
    }
    moeq_redis_reply_free(rep);
    return nil;
}

static void the_backlog_counts_undelivered_batches_when_deletions_hide_the_lag(void **state) {
    (void)state;
    char addr[128], err[512], prefix[48];
    if (moeq_test_service("MOEQ_TEST_REDIS", addr, sizeof addr)) exit(MOEQ_TEST_SKIP);
    moeq_test_unique_name(prefix, sizeof prefix, "backlog");
    moeq_coordinator_params p = moeq_coordinator_default_params();
    snprintf(p.redis_url, sizeof p.redis_url, "%s", addr);
    snprintf(p.redis_prefix, sizeof p.redis_prefix, "%s", prefix);
    moeq_store *store = NULL;
    assert_int_equal(moeq_store_new(&p, NULL, &store, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_store_prepare(store, NULL, 0, err, sizeof err), MOEQ_OK);
    moeq_redis_params rp;
    moeq_redis *r = NULL;
    assert_int_equal(moeq_redis_params_parse(addr, NULL, &rp, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_redis_new(&rp, &r, err, sizeof err), MOEQ_OK);
    char key[160];
    snprintf(key, sizeof key, "%s:batches:p1", prefix);
    /* four batches; a worker takes two, finishes the second first: acknowledged and deleted */
    for (int i = 0; i < 4; i++) {
        const char *xadd[] = {"XADD", key, "*", "v", "1"};
        moeq_redis_reply_free(redis_do(r, 5, xadd));
    }
    const char *read[] = {"XREADGROUP", "GROUP", MOEQ_STORE_GROUP, "w1", "COUNT", "2", "STREAMS", key, ">"};
    moeq_redis_reply *rep = redis_do(r, 9, read);
    const moeq_redis_reply *entries = moeq_redis_reply_at(moeq_redis_reply_at(rep, 0), 1);
    assert_int_equal(moeq_redis_reply_len(entries), 2);
    const char *second = moeq_redis_reply_str(moeq_redis_reply_at(moeq_redis_reply_at(entries, 1), 0), NULL);
    const char *ack[] = {"XACK", key, MOEQ_STORE_GROUP, second}, *del[] = {"XDEL", key, second};
    moeq_redis_reply_free(redis_do(r, 4, ack));
    moeq_redis_reply_free(redis_do(r, 3, del));
    moeq_redis_reply_free(rep);
    int nil = lag_is_nil(r, key);
    int64_t backlog = -1;
    assert_int_equal(moeq_store_pending_batches(store, &backlog, err, sizeof err), MOEQ_OK);
    print_message("backlog: %lld (1 pending + 2 not yet delivered), lag reported %s\n", (long long)backlog,
                  nil ? "nil" : "as a number");
    assert_int_equal(backlog, 3);
    for (int k = 0; k < 4; k++) {
        char s[160];
        snprintf(s, sizeof s, "%s:batches:p%d", prefix, k);
        const char *d[] = {"DEL", s};
        moeq_redis_reply_free(redis_do(r, 2, d));
    }
    moeq_redis_destroy(r);
    moeq_store_destroy(store);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_backlog_counts_undelivered_batches_when_deletions_hide_the_lag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
