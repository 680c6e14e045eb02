/*
 * test_redis_parse.c — the Redis adapter's pure parts, without a server:
 * URLs and redis.* options, RESP replies, and the three stream reply shapes
 * workers and the coordinator walk (XREADGROUP, XRANGE, XAUTOCLAIM).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "moeq/redis.h"

static moeq_err parse(const char *url, moeq_redis_params *p, char *errstr, size_t n) {
    return moeq_redis_params_parse(url, NULL, p, errstr, n);
}

static void redis_url_host_port_and_defaults(void **state) {
    (void)state;
    moeq_redis_params p;
    char errstr[256];
    assert_int_equal(parse("127.0.0.1:6380", &p, errstr, sizeof errstr), MOEQ_OK);
    assert_string_equal(p.host, "127.0.0.1");
    assert_int_equal(p.port, 6380);
    assert_int_equal(p.db, 0);
    assert_int_equal(p.tls, 0);
    assert_int_equal(p.connect_timeout_ms, 5000);
    assert_int_equal(p.command_timeout_ms, 0);
    assert_int_equal(parse("cache.internal", &p, errstr, sizeof errstr), MOEQ_OK);
    assert_string_equal(p.host, "cache.internal");
    assert_int_equal(p.port, 6379);
    assert_int_equal(parse("[::1]:7000", &p, errstr, sizeof errstr), MOEQ_OK);
    assert_string_equal(p.host, "::1");
    assert_int_equal(p.port, 7000);
    assert_int_equal(parse("", &p, errstr, sizeof errstr), MOEQ_OK);
    assert_string_equal(p.host, "127.0.0.1");
    assert_int_equal(p.port, 6379);
}

static void redis_url_with_credentials_db_and_tls(void **state) {
    (void)state;
    moeq_redis_params p;
    char errstr[256];
    assert_int_equal(parse("redis://worker:p%40ss:w@r@redis.example:6390/3", &p, errstr, sizeof errstr), MOEQ_OK);
    assert_string_equal(p.user, "worker");
    assert_string_equal(p.password, "p@ss:w@r");
    assert_string_equal(p.host, "redis.example");
    assert_int_equal(p.port, 6390);
    assert_int_equal(p.db, 3);
    assert_int_equal(parse("redis://:secret@h", &p, errstr, sizeof errstr), MOEQ_OK);
    assert_string_equal(p.user, "");
    assert_string_equal(p.password, "secret");
    assert_int_equal(parse("rediss://h:6443/", &p, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(p.tls, 1);
    assert_int_equal(p.port, 6443);
    assert_int_equal(parse("unix:///run/redis/redis.sock", &p, errstr, sizeof errstr), MOEQ_OK);
    assert_string_equal(p.unix_path, "/run/redis/redis.sock");
}

static void redis_url_rejects_what_it_cannot_honour(void **state) {
    (void)state;
    static const char *const bad[] = {
        "redis://h:0", "redis://h:70000", "h:port", "http://h:1", "redis://h/db1", "redis://h?db=1",
        "redis://:@", "[::1", "redis://u:%zz@h", "redis://u:%00@h", "unix://",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        moeq_redis_params p;
        char errstr[256] = "";
        assert_int_equal(parse(bad[i], &p, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
        assert_true(strlen(errstr) > 0);
    }
}

static void redis_options_override_the_url_and_name_bad_keys(void **state) {
    (void)state;
    moeq_redis_params p;
    char errstr[256] = "";
    moeq_kvlist *kv = moeq_kvlist_new();
    moeq_kvlist_set(kv, "password", "from-config");
    moeq_kvlist_set(kv, "db", "5");
    moeq_kvlist_set(kv, "command_timeout_ms", "250");
    moeq_kvlist_set(kv, "tls", "on");
    moeq_kvlist_set(kv, "tls_ca_file", "/etc/ssl/ca.pem");
    assert_int_equal(moeq_redis_params_parse("redis://:from-url@h/1", kv, &p, errstr, sizeof errstr), MOEQ_OK);
    assert_string_equal(p.password, "from-config");
    assert_int_equal(p.db, 5);
    assert_int_equal(p.command_timeout_ms, 250);
    assert_int_equal(p.tls, 1);
    assert_string_equal(p.tls_ca_file, "/etc/ssl/ca.pem");
    moeq_kvlist_set(kv, "db", "-1");
    assert_int_equal(moeq_redis_params_parse("h", kv, &p, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(errstr, "redis.db"));
    moeq_kvlist_set(kv, "db", "0");
    moeq_kvlist_set(kv, "passwd", "typo");
    assert_int_equal(moeq_redis_params_parse("h", kv, &p, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(errstr, "redis.passwd"));
    moeq_kvlist_destroy(kv);
    assert_non_null(moeq_redis_option_table());
}

static moeq_redis_reply *resp(const char *bytes) {
    moeq_redis_reply *reply = NULL;
    char errstr[256];
    assert_int_equal(moeq_redis_reply_parse(bytes, strlen(bytes), &reply, errstr, sizeof errstr), MOEQ_OK);
    return reply;
}

static void redis_replies_read_through_accessors(void **state) {
    (void)state;
    moeq_redis_reply *r = resp("+OK\r\n");
    assert_int_equal(moeq_redis_reply_type_of(r), MOEQ_REDIS_STATUS);
    assert_string_equal(moeq_redis_reply_str(r, NULL), "OK");
    moeq_redis_reply_free(r);
    r = resp(":42\r\n");
    assert_int_equal(moeq_redis_reply_int(r), 42);
    moeq_redis_reply_free(r);
    r = resp("*3\r\n$2\r\n17\r\n$-1\r\n$2\r\nab\r\n");
    assert_int_equal(moeq_redis_reply_len(r), 3);
    assert_int_equal(moeq_redis_reply_int(moeq_redis_reply_at(r, 0)), 17);
    assert_int_equal(moeq_redis_reply_type_of(moeq_redis_reply_at(r, 1)), MOEQ_REDIS_NIL);
    assert_null(moeq_redis_reply_at(r, 3));
    moeq_redis_reply_free(r);
    r = resp("-BUSYGROUP Consumer Group name already exists\r\n");
    assert_true(moeq_redis_reply_is_error(r, "BUSYGROUP"));
    assert_false(moeq_redis_reply_is_error(r, "BUSY"));
    moeq_redis_reply_free(r);
}

static void redis_reply_parse_rejects_partial_and_trailing_bytes(void **state) {
    (void)state;
    moeq_redis_reply *r = NULL;
    char errstr[256];
    assert_int_equal(moeq_redis_reply_parse("*2\r\n:1\r\n", 8, &r, errstr, sizeof errstr), MOEQ_ERR_PARSE);
    assert_null(r);
    assert_int_equal(moeq_redis_reply_parse(":1\r\n:2\r\n", 8, &r, errstr, sizeof errstr), MOEQ_ERR_PARSE);
    assert_int_equal(moeq_redis_reply_parse("?x\r\n", 4, &r, errstr, sizeof errstr), MOEQ_ERR_PARSE);
    assert_null(r);
}

typedef struct seen {
    char streams[8][32], ids[8][32], jobs[8][32];
    int deleted[8];
    int count, stop_after;
} seen;

static int collect(const moeq_redis_entry *entry, void *opaque) {
    seen *s = opaque;
    size_t len = 0;
    const char *job = moeq_redis_entry_get(entry, "job", &len);
    snprintf(s->streams[s->count], 32, "%s", entry->stream ? entry->stream : "-");
    snprintf(s->ids[s->count], 32, "%s", entry->id);
    snprintf(s->jobs[s->count], 32, "%.*s", (int)len, job ? job : "");
    s->deleted[s->count] = entry->fields == NULL;
    s->count++;
    return s->stop_after && s->count >= s->stop_after;
}

/* XREADGROUP ... STREAMS moeq:batches:p0 moeq:batches:p1 > : two streams, one entry deleted meanwhile. */
static const char xreadgroup_reply[] =
    "*2\r\n"
    "*2\r\n$15\r\nmoeq:batches:p0\r\n*2\r\n"
    "*2\r\n$3\r\n1-0\r\n*4\r\n$3\r\njob\r\n$2\r\nj1\r\n$5\r\ntries\r\n$1\r\n1\r\n"
    "*2\r\n$3\r\n2-0\r\n$-1\r\n"
    "*2\r\n$15\r\nmoeq:batches:p1\r\n*1\r\n"
    "*2\r\n$3\r\n3-0\r\n*2\r\n$3\r\njob\r\n$2\r\nj3\r\n";

static void redis_xreadgroup_reply_yields_entries_per_stream(void **state) {
    (void)state;
    moeq_redis_reply *r = resp(xreadgroup_reply);
    seen s = {0};
    char errstr[256];
    assert_int_equal(moeq_redis_entries_foreach(r, MOEQ_REDIS_XREAD, collect, &s, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(s.count, 3);
    assert_string_equal(s.streams[0], "moeq:batches:p0");
    assert_string_equal(s.ids[0], "1-0");
    assert_string_equal(s.jobs[0], "j1");
    assert_int_equal(s.deleted[1], 1);
    assert_string_equal(s.streams[2], "moeq:batches:p1");
    assert_string_equal(s.jobs[2], "j3");
    seen first = {.stop_after = 1};
    assert_int_equal(moeq_redis_entries_foreach(r, MOEQ_REDIS_XREAD, collect, &first, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(first.count, 1);
    /* The same bytes are not an XRANGE or XAUTOCLAIM reply. */
    assert_int_equal(moeq_redis_entries_foreach(r, MOEQ_REDIS_XRANGE, collect, &s, errstr, sizeof errstr),
                     MOEQ_ERR_FORMAT);
    moeq_redis_reply_free(r);
    r = resp("*-1\r\n"); /* a blocking read that timed out */
    seen none = {0};
    assert_int_equal(moeq_redis_entries_foreach(r, MOEQ_REDIS_XREAD, collect, &none, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(none.count, 0);
    moeq_redis_reply_free(r);
}

static void redis_xautoclaim_reply_yields_cursor_and_claimed_entries(void **state) {
    (void)state;
    moeq_redis_reply *r = resp("*3\r\n$3\r\n0-0\r\n*1\r\n*2\r\n$3\r\n7-1\r\n*2\r\n$3\r\njob\r\n$2\r\nj7\r\n"
                               "*1\r\n$3\r\n6-0\r\n");
    assert_string_equal(moeq_redis_autoclaim_cursor(r), "0-0");
    seen s = {0};
    char errstr[256];
    assert_int_equal(moeq_redis_entries_foreach(r, MOEQ_REDIS_XAUTOCLAIM, collect, &s, errstr, sizeof errstr),
                     MOEQ_OK);
    assert_int_equal(s.count, 1);
    assert_string_equal(s.ids[0], "7-1");
    assert_string_equal(s.jobs[0], "j7");
    assert_string_equal(s.streams[0], "-");
    moeq_redis_reply_free(r);
    r = resp("*1\r\n*2\r\n$3\r\n9-0\r\n*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"); /* odd field count */
    assert_int_equal(moeq_redis_entries_foreach(r, MOEQ_REDIS_XRANGE, collect, &s, errstr, sizeof errstr),
                     MOEQ_ERR_FORMAT);
    assert_null(moeq_redis_autoclaim_cursor(r));
    moeq_redis_reply_free(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(redis_url_host_port_and_defaults),
        cmocka_unit_test(redis_url_with_credentials_db_and_tls),
        cmocka_unit_test(redis_url_rejects_what_it_cannot_honour),
        cmocka_unit_test(redis_options_override_the_url_and_name_bad_keys),
        cmocka_unit_test(redis_replies_read_through_accessors),
        cmocka_unit_test(redis_reply_parse_rejects_partial_and_trailing_bytes),
        cmocka_unit_test(redis_xreadgroup_reply_yields_entries_per_stream),
        cmocka_unit_test(redis_xautoclaim_reply_yields_cursor_and_claimed_entries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
