/*
 * test_redis_streams.c — Redis Streams through the adapter against the real
 * redis-server of the `services` fixture: the moves a worker fleet makes
 * (XGROUP CREATE, XADD, XREADGROUP, XACK, XPENDING, XAUTOCLAIM of a batch a
 * dead worker left pending) and the error contract (NOGROUP, BUSYGROUP,
 * connection loss, timeouts, bad credentials).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "moeq/redis.h"
#include "services_env.h"

static char redis_addr[128];

static moeq_redis *connect_with(const moeq_kvlist *options) {
    moeq_redis_params params;
    moeq_redis *redis = NULL;
    char url[160], errstr[256] = "";
    snprintf(url, sizeof url, "redis://%s", redis_addr);
    assert_int_equal(moeq_redis_params_parse(url, options, &params, errstr, sizeof errstr), MOEQ_OK);
    moeq_err err = moeq_redis_new(&params, &redis, errstr, sizeof errstr);
    if (err) fail_msg("connect %s: %s", url, errstr);
    return redis;
}

static int setup(void **state) {
    *state = connect_with(NULL);
    return 0;
}

static int teardown(void **state) {
    moeq_redis_destroy(*state);
    return 0;
}

/* Run a command that must succeed; returns its reply (caller frees). */
static moeq_redis_reply *ok(moeq_redis *redis, int argc, const char *const *argv) {
    moeq_redis_reply *reply = NULL;
    char errstr[256] = "";
    moeq_err err = moeq_redis_command_argv(redis, argc, argv, NULL, &reply, errstr, sizeof errstr);
    if (err) fail_msg("%s: %s (%s)", argv[0], errstr, moeq_err_str(err));
    return reply;
}
#define OK(redis, ...) ok(redis, (int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)), \
                          (const char *[]){__VA_ARGS__})

static void xadd(moeq_redis *redis, const char *stream, const char *job, char *id, size_t id_size) {
    moeq_redis_reply *r = OK(redis, "XADD", stream, "*", "job", job, "attempts", "0");
    snprintf(id, id_size, "%s", moeq_redis_reply_str(r, NULL));
    moeq_redis_reply_free(r);
}

static void create_group(moeq_redis *redis, const char *stream) {
    moeq_redis_reply_free(OK(redis, "XGROUP", "CREATE", stream, "workers", "$", "MKSTREAM"));
}

typedef struct entries {
    char ids[16][48], jobs[16][32];
    int count;
} entries;

static int collect(const moeq_redis_entry *entry, void *opaque) {
    entries *e = opaque;
    size_t len = 0;
    const char *job = moeq_redis_entry_get(entry, "job", &len);
    snprintf(e->ids[e->count], sizeof e->ids[0], "%s", entry->id);
    snprintf(e->jobs[e->count], sizeof e->jobs[0], "%.*s", (int)len, job ? job : "");
    e->count++;
    return e->count == 16;
}

static void read_group(moeq_redis *redis, const char *stream, const char *consumer, entries *out) {
    memset(out, 0, sizeof *out);
    moeq_redis_reply *r = OK(redis, "XREADGROUP", "GROUP", "workers", consumer, "COUNT", "16", "STREAMS", stream, ">");
    char errstr[256];
    assert_int_equal(moeq_redis_entries_foreach(r, MOEQ_REDIS_XREAD, collect, out, errstr, sizeof errstr), MOEQ_OK);
    moeq_redis_reply_free(r);
}

static void streams_deliver_to_a_group_and_track_what_is_unacknowledged(void **state) {
    moeq_redis *redis = *state;
    char stream[128], ids[3][48], errstr[256];
    moeq_test_unique_name(stream, sizeof stream, "moeq:test:batches");
    create_group(redis, stream);

    /* Creating the group again is the BUSYGROUP error reply, readable by prefix. */
    moeq_redis_reply *r = NULL;
    const char *again[] = {"XGROUP", "CREATE", stream, "workers", "$"};
    assert_int_equal(moeq_redis_command_argv(redis, 5, again, NULL, &r, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    assert_true(moeq_redis_reply_is_error(r, "BUSYGROUP"));
    assert_non_null(strstr(errstr, "XGROUP"));
    moeq_redis_reply_free(r);

    for (int i = 0; i < 3; i++) {
        char job[16];
        snprintf(job, sizeof job, "job-%d", i);
        xadd(redis, stream, job, ids[i], sizeof ids[i]);
    }
    entries got;
    read_group(redis, stream, "w1", &got);
    assert_int_equal(got.count, 3);
    for (int i = 0; i < 3; i++) {
        char job[16];
        snprintf(job, sizeof job, "job-%d", i);
        assert_string_equal(got.ids[i], ids[i]);
        assert_string_equal(got.jobs[i], job);
    }
    read_group(redis, stream, "w2", &got); /* nothing new for another worker */
    assert_int_equal(got.count, 0);

    r = OK(redis, "XACK", stream, "workers", ids[0]);
    assert_int_equal(moeq_redis_reply_int(r), 1);
    moeq_redis_reply_free(r);

    /* XPENDING summary: [count, first id, last id, [[consumer, count]]] */
    r = OK(redis, "XPENDING", stream, "workers");
    assert_int_equal(moeq_redis_reply_int(moeq_redis_reply_at(r, 0)), 2);
    assert_string_equal(moeq_redis_reply_str(moeq_redis_reply_at(r, 1), NULL), ids[1]);
    assert_string_equal(moeq_redis_reply_str(moeq_redis_reply_at(r, 2), NULL), ids[2]);
    const moeq_redis_reply *owner = moeq_redis_reply_at(moeq_redis_reply_at(r, 3), 0);
    assert_string_equal(moeq_redis_reply_str(moeq_redis_reply_at(owner, 0), NULL), "w1");
    assert_int_equal(moeq_redis_reply_int(moeq_redis_reply_at(owner, 1)), 2);
    moeq_redis_reply_free(r);
    moeq_redis_reply_free(OK(redis, "DEL", stream));
}

static void a_live_worker_autoclaims_the_batch_a_dead_worker_left_pending(void **state) {
    moeq_redis *redis = *state;
    char stream[128], id[48], errstr[256];
    moeq_test_unique_name(stream, sizeof stream, "moeq:test:batches");
    create_group(redis, stream);
    xadd(redis, stream, "batch-1", id, sizeof id);

    entries got;
    read_group(redis, stream, "dead-worker", &got); /* ...and it never acknowledges */
    assert_int_equal(got.count, 1);

    /* Not idle long enough yet: nothing to claim. */
    moeq_redis_reply *r = OK(redis, "XAUTOCLAIM", stream, "workers", "live-worker", "60000", "0-0", "COUNT", "10");
    entries claimed = {0};
    assert_int_equal(moeq_redis_entries_foreach(r, MOEQ_REDIS_XAUTOCLAIM, collect, &claimed, errstr, sizeof errstr),
                     MOEQ_OK);
    assert_int_equal(claimed.count, 0);
    moeq_redis_reply_free(r);

    nanosleep(&(struct timespec){.tv_nsec = 60 * 1000 * 1000}, NULL);
    r = OK(redis, "XAUTOCLAIM", stream, "workers", "live-worker", "50", "0-0", "COUNT", "10");
    assert_string_equal(moeq_redis_autoclaim_cursor(r), "0-0"); /* scan complete */
    assert_int_equal(moeq_redis_entries_foreach(r, MOEQ_REDIS_XAUTOCLAIM, collect, &claimed, errstr, sizeof errstr),
                     MOEQ_OK);
    assert_int_equal(claimed.count, 1);
    assert_string_equal(claimed.ids[0], id);
    assert_string_equal(claimed.jobs[0], "batch-1");
    moeq_redis_reply_free(r);

    /* XPENDING extended: [[id, owner, idle ms, deliveries]] — now the live worker's, delivered twice. */
    r = OK(redis, "XPENDING", stream, "workers", "-", "+", "10");
    assert_int_equal(moeq_redis_reply_len(r), 1);
    const moeq_redis_reply *p = moeq_redis_reply_at(r, 0);
    assert_string_equal(moeq_redis_reply_str(moeq_redis_reply_at(p, 1), NULL), "live-worker");
    assert_int_equal(moeq_redis_reply_int(moeq_redis_reply_at(p, 3)), 2);
    moeq_redis_reply_free(r);

    moeq_redis_reply_free(OK(redis, "XACK", stream, "workers", id));
    r = OK(redis, "XPENDING", stream, "workers");
    assert_int_equal(moeq_redis_reply_int(moeq_redis_reply_at(r, 0)), 0);
    moeq_redis_reply_free(r);
    moeq_redis_reply_free(OK(redis, "DEL", stream));
}

static void a_blocking_read_that_times_out_yields_no_entries(void **state) {
    moeq_redis *redis = *state;
    char stream[128], errstr[256];
    moeq_test_unique_name(stream, sizeof stream, "moeq:test:batches");
    create_group(redis, stream);
    moeq_redis_reply *r = OK(redis, "XREADGROUP", "GROUP", "workers", "w", "BLOCK", "50", "STREAMS", stream, ">");
    assert_int_equal(moeq_redis_reply_type_of(r), MOEQ_REDIS_NIL);
    entries got = {0};
    assert_int_equal(moeq_redis_entries_foreach(r, MOEQ_REDIS_XREAD, collect, &got, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(got.count, 0);
    moeq_redis_reply_free(r);
    moeq_redis_reply_free(OK(redis, "DEL", stream));
}

static void reading_a_missing_group_is_not_found(void **state) {
    moeq_redis *redis = *state;
    char stream[128], errstr[256];
    moeq_test_unique_name(stream, sizeof stream, "moeq:test:nogroup");
    moeq_redis_reply *r = NULL;
    moeq_err err = moeq_redis_command(redis, &r, errstr, sizeof errstr, "XREADGROUP GROUP nobody w STREAMS %s >",
                                      stream);
    assert_int_equal(err, MOEQ_ERR_NOT_FOUND);
    assert_true(moeq_redis_reply_is_error(r, "NOGROUP"));
    assert_non_null(strstr(errstr, "XREADGROUP"));
    moeq_redis_reply_free(r);
}

static void pipelined_acks_come_back_in_order(void **state) {
    moeq_redis *redis = *state;
    char stream[128], ids[3][48], errstr[256];
    moeq_test_unique_name(stream, sizeof stream, "moeq:test:pipe");
    create_group(redis, stream);
    for (int i = 0; i < 3; i++) xadd(redis, stream, "j", ids[i], sizeof ids[i]);
    entries got;
    read_group(redis, stream, "w", &got);
    for (int i = 0; i < 3; i++) {
        const char *argv[] = {"XACK", stream, "workers", ids[i]};
        assert_int_equal(moeq_redis_append_argv(redis, 4, argv, NULL, errstr, sizeof errstr), MOEQ_OK);
    }
    const char *argv[] = {"XACK", stream, "workers", ids[0]}; /* already acknowledged: 0 */
    assert_int_equal(moeq_redis_append_argv(redis, 4, argv, NULL, errstr, sizeof errstr), MOEQ_OK);
    for (int i = 0; i < 4; i++) {
        moeq_redis_reply *r = NULL;
        assert_int_equal(moeq_redis_get_reply(redis, &r, errstr, sizeof errstr), MOEQ_OK);
        assert_int_equal(moeq_redis_reply_int(r), i < 3 ? 1 : 0);
        moeq_redis_reply_free(r);
    }
    assert_int_equal(moeq_redis_get_reply(redis, NULL, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    moeq_redis_reply_free(OK(redis, "DEL", stream));
}

static void a_lost_connection_is_transient_and_the_next_command_reconnects(void **state) {
    moeq_redis *redis = *state;
    char errstr[256];
    moeq_redis_reply *r = OK(redis, "CLIENT", "ID");
    char id[32];
    snprintf(id, sizeof id, "%lld", moeq_redis_reply_int(r));
    moeq_redis_reply_free(r);
    /* Another connection kills this one, as a server restart or a network cut would. */
    moeq_redis *killer = connect_with(NULL);
    moeq_redis_reply_free(OK(killer, "CLIENT", "KILL", "ID", id));
    moeq_redis_destroy(killer);

    moeq_err err = moeq_redis_command(redis, &r, errstr, sizeof errstr, "PING");
    assert_int_equal(err, MOEQ_ERR_TRANSIENT);
    assert_true(moeq_err_is_retriable(err));
    assert_null(r);
    r = OK(redis, "PING");
    assert_string_equal(moeq_redis_reply_str(r, NULL), "PONG");
    moeq_redis_reply_free(r);
}

static void a_command_past_its_timeout_is_a_timeout(void **state) {
    (void)state;
    char errstr[256], key[128];
    moeq_kvlist *options = moeq_kvlist_new();
    moeq_kvlist_set(options, "command_timeout_ms", "100");
    moeq_redis *redis = connect_with(options);
    moeq_kvlist_destroy(options);
    moeq_test_unique_name(key, sizeof key, "moeq:test:empty");
    moeq_redis_reply *r = NULL;
    moeq_err err = moeq_redis_command(redis, &r, errstr, sizeof errstr, "BLPOP %s 2", key);
    assert_int_equal(err, MOEQ_ERR_TIMEOUT);
    assert_true(moeq_err_is_retriable(err));
    r = OK(redis, "PING");
    moeq_redis_reply_free(r);
    moeq_redis_destroy(redis);
}

static void bad_credentials_and_unreachable_servers_fail_distinctly(void **state) {
    (void)state;
    moeq_redis_params params;
    moeq_redis *redis = (moeq_redis *)&params;
    char url[160], errstr[256];
    snprintf(url, sizeof url, "redis://moeq:not-the-password@%s", redis_addr);
    assert_int_equal(moeq_redis_params_parse(url, NULL, &params, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(moeq_redis_new(&params, &redis, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    assert_null(redis);
    assert_null(strstr(errstr, "not-the-password"));
    assert_int_equal(moeq_redis_params_parse("127.0.0.1:1", NULL, &params, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(moeq_redis_new(&params, &redis, errstr, sizeof errstr), MOEQ_ERR_TRANSIENT);
    assert_null(redis);
}

int main(void) {
    if (moeq_test_service("MOEQ_TEST_REDIS", redis_addr, sizeof redis_addr)) return MOEQ_TEST_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(streams_deliver_to_a_group_and_track_what_is_unacknowledged, setup, teardown),
        cmocka_unit_test_setup_teardown(a_live_worker_autoclaims_the_batch_a_dead_worker_left_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(a_blocking_read_that_times_out_yields_no_entries, setup, teardown),
        cmocka_unit_test_setup_teardown(reading_a_missing_group_is_not_found, setup, teardown),
        cmocka_unit_test_setup_teardown(pipelined_acks_come_back_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(a_lost_connection_is_transient_and_the_next_command_reconnects, setup, teardown),
        cmocka_unit_test(a_command_past_its_timeout_is_a_timeout),
        cmocka_unit_test(bad_credentials_and_unreachable_servers_fail_distinctly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
