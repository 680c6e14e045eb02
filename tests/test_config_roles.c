/*
 * test_config_roles.c — the coordinator and the worker judge a job by the
 * same limits, read from the same keys of one file: a batch entry written as
 * the coordinator writes it (through the `services` fixture's Redis) is
 * decoded by the worker's own code (worker_entry_decode) with the limits the
 * worker loaded.
 *
 * Why: job limits existed only on the coordinator: a job allowed there was
 * refused by the worker with an undocumented `invalid_job`.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moeq/config.h"
#include "moeq/job.h"
#include "params.h"
#include "services_env.h"
#include "worker.h"
#include "worker_io.h"
#include "worker_test_util.h"

typedef struct decoded {
    const moeq_job_limits *limits;
    worker_entry entry;
    int n;
} decoded;

static int decode_cb(const moeq_redis_entry *e, void *opaque) {
    decoded *d = opaque;
    char err[256];
    assert_int_equal(worker_entry_decode(e, "s", d->limits, &d->entry, err, sizeof err), MOEQ_OK);
    d->n++;
    return 1;
}

/* The worker's view of one job written as the coordinator writes it. */
static void worker_decodes(moeq_redis *redis, const char *prefix, const char *json, const moeq_job_limits *limits,
                           decoded *d) {
    moeq_batch_entry_job bj = {.id = "j", .id_len = 1, .content_type = "application/json", .content_type_len = 16,
                               .job = json, .job_len = strlen(json)};
    char id[64], stream[128], err[256];
    wt_add_batch(redis, prefix, 0, &bj, 1, id, sizeof id);
    snprintf(stream, sizeof stream, "%s0", prefix);
    const char *argv[] = {"XRANGE", stream, id, id};
    moeq_redis_reply *r = NULL;
    assert_int_equal(moeq_redis_command_argv(redis, 4, argv, NULL, &r, err, sizeof err), MOEQ_OK);
    memset(d, 0, sizeof *d);
    d->limits = limits;
    assert_int_equal(moeq_redis_entries_foreach(r, MOEQ_REDIS_XRANGE, decode_cb, d, err, sizeof err), MOEQ_OK);
    moeq_redis_reply_free(r);
    assert_int_equal(d->n, 1);
    assert_int_equal(d->entry.n_jobs, 1);
}

static void a_job_the_coordinator_accepts_is_accepted_by_the_worker(void **state) {
    (void)state;
    char redis_url[128];
    if (moeq_test_service("MOEQ_TEST_REDIS", redis_url, sizeof redis_url)) skip();
    char path[] = "/tmp/moeq-test-roles-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "max_stop = 24\nmax_job_bytes = 4096\n"; /* both above / below the defaults */
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char err[512] = "";
    moeq_coordinator_params cp = moeq_coordinator_default_params();
    moeq_worker_params wp;
    assert_int_equal(moeq_worker_default_params(&wp, err, sizeof err), MOEQ_OK);
    const moeq_prop *co[] = {moeq_worker_config_props(), NULL}, *wo[] = {moeq_coordinator_props(), NULL};
    moeq_config_src cs = {moeq_coordinator_props(), &cp, NULL, NULL, co};
    moeq_config_src ws = {moeq_worker_config_props(), &wp, NULL, NULL, wo};
    assert_int_equal(moeq_config_load_file(&cs, path, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_config_load_file(&ws, path, err, sizeof err), MOEQ_OK);
    unlink(path);

    /* 20 stop strings: more than the default 16, allowed by the shared max_stop */
    char json[2048];
    int n = snprintf(json, sizeof json, "{\"v\":1,\"id\":\"j\",\"tokens\":[1,2,3],\"stop\":[");
    for (int i = 0; i < 20; i++) n += snprintf(json + n, sizeof json - (size_t)n, "%s\"s%d\"", i ? "," : "", i);
    snprintf(json + n, sizeof json - (size_t)n, "]}");
    moeq_job job;
    moeq_job_reject rej;
    assert_int_equal(moeq_job_decode(json, strlen(json), "application/json", &cp.limits, &job, &rej), MOEQ_OK);
    moeq_job_free(&job);

    char prefix[96];
    moeq_test_unique_name(prefix, sizeof prefix, "roles");
    strcat(prefix, ":batches:p");
    moeq_redis *redis = wt_open_streams(redis_url, prefix);
    decoded d;
    worker_decodes(redis, prefix, json, &wp.limits, &d);
    assert_null(d.entry.jobs[0].bad); /* accepted by the worker too */
    worker_entry_free(&d.entry);

    /* a job both refuse gets a documented reject code from the worker, not `invalid_job` */
    char big[8192];
    n = snprintf(big, sizeof big, "{\"v\":1,\"id\":\"j\",\"prompt\":\"");
    memset(big + n, 'a', 5000);
    snprintf(big + n + 5000, 16, "\"}");
    assert_int_not_equal(moeq_job_decode(big, strlen(big), "application/json", &cp.limits, &job, &rej), MOEQ_OK);
    const char *coordinator_code = moeq_job_reject_code_name(rej.code);
    worker_decodes(redis, prefix, big, &wp.limits, &d);
    assert_non_null(d.entry.jobs[0].bad);
    assert_non_null(d.entry.jobs[0].bad_code);
    assert_string_equal(d.entry.jobs[0].bad_code, coordinator_code);
    worker_entry_free(&d.entry);
    moeq_redis_destroy(redis);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_job_the_coordinator_accepts_is_accepted_by_the_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
