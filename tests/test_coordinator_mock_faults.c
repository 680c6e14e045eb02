/*
 * test_coordinator_mock_faults.c — the coordinator keeps its promise through
 * Kafka request errors injected with librdkafka's mock cluster
 * (`test.mock.num.brokers`, through moeq/kafka.h's mock section): failed and
 * dropped Fetch requests, failed OffsetCommits at the group coordinator,
 * failed Produce requests of its error results and dead letters, and a
 * broker (partition leader and group coordinator) going down and up while
 * jobs flow. Every valid job ends up in exactly one batch, every invalid one
 * is dead-lettered, and — sampled all along from /metrics — the committed
 * offset of a partition never passes a job that is not in Redis. Finally the
 * consumer lag in /metrics drops to 0.
 *
 * This is in addition to test_coordinator_broker_restart (a real broker
 * killed and restarted); the mock brokers live in this process, the
 * coordinator runs as the `moeq` child process and reaches them over
 * loopback. Redis comes from the `services` fixture.
 *
 * A second test isolates the idle commit retry: after everything caught up,
 * the group coordinator refuses a few OffsetCommits of a handful of new jobs
 * and nothing more is produced; the committed offsets must still reach the
 * high watermarks (the coordinator commits again when the adapter's count of
 * refused commits grows, not only when it stored new offsets).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator_harness.h"
#include "moeq/kafka_mock.h"

#define N_PARTITIONS 4
#define N_CHUNKS 3
#define VALID_PER_CHUNK 500
#define BAD_PER_CHUNK 15
#define N_VALID (N_CHUNKS * VALID_PER_CHUNK)
#define N_BAD (N_CHUNKS * BAD_PER_CHUNK)
#define N_ALL (N_VALID + N_BAD)

/* Brokers: 1 leads job partitions 0 and 2 and coordinates the group; 2 leads
 * partitions 1 and 3 and the cancel topic; 3 leads results and dead letters,
 * so Produce faults pushed on broker 3 hit only the coordinator's producer. */
enum { B_JOBS_AND_GROUP = 1, B_JOBS = 2, B_OUTPUT = 3 };

typedef struct mock_run {
    harness h;
    moeq_kafka_mock *mock;
    int32_t partition[N_ALL]; /* where each job landed (delivery reports) */
    int64_t offset[N_ALL];
    int port;
    /* the committed-offset invariant, sampled while faults are injected */
    size_t samples, jobs_checked, violations;
    int64_t committed[N_PARTITIONS], high[N_PARTITIONS], lag_total;
} mock_run;

static void on_delivery(const moeq_kafka_delivery *d, void *opaque) {
    mock_run *r = opaque;
    int i = (int)(intptr_t)d->opaque - 1;
    if (d->err) {
        r->h.failed++;
        return;
    }
    r->h.delivered++;
    if (i >= 0 && i < N_ALL) {
        r->partition[i] = d->partition;
        r->offset[i] = d->offset;
    }
}

/* Job i: valid ones are "mf-<i>", invalid ones (temperature out of range) "bad-<i>". */
static void produce_job(mock_run *r, int i) {
    char buf[256], key[32], err[256];
    int n;
    if (i < N_VALID) {
        snprintf(key, sizeof key, "mf-%d", i);
        n = snprintf(buf, sizeof buf, "{\"v\":1,\"id\":\"%s\",\"priority\":%d,\"tokens\":[%d,%d,%d]}", key, i % 4, i,
                     i + 1, i + 2);
    } else {
        snprintf(key, sizeof key, "bad-%d", i);
        n = snprintf(buf, sizeof buf, "{\"v\":1,\"id\":\"%s\",\"prompt\":\"x\",\"temperature\":9}", key);
    }
    moeq_kafka_out m = {.topic = r->h.jobs_topic, .partition = i % N_PARTITIONS, .key = key, .key_len = strlen(key),
                        .value = buf, .value_len = (size_t)n, .opaque = (void *)(intptr_t)(i + 1)};
    moeq_err e;
    while ((e = moeq_kafka_produce(r->h.producer, &m, err, sizeof err)) == MOEQ_ERR_TRANSIENT)
        moeq_kafka_producer_poll(r->h.producer, 10);
    if (e) fail_msg("produce: %s", err);
}

static void produce_chunk(mock_run *r, int chunk) {
    for (int k = 0; k < VALID_PER_CHUNK; k++) produce_job(r, chunk * VALID_PER_CHUNK + k);
    for (int k = 0; k < BAD_PER_CHUNK; k++) produce_job(r, N_VALID + chunk * BAD_PER_CHUNK + k);
    moeq_kafka_producer_poll(r->h.producer, 0);
}

static void push(mock_run *r, int32_t broker, moeq_kafka_api api, const moeq_kafka_fault *f, size_t n, int rtt_ms) {
    char err[256];
    moeq_err e = broker ? moeq_kafka_mock_broker_push_faults(r->mock, broker, api, f, n, rtt_ms, err, sizeof err)
                        : moeq_kafka_mock_push_faults(r->mock, api, f, n, err, sizeof err);
    if (e) fail_msg("push faults: %s", err);
}

/* Value of `name{topic="T",partition="p"} v` in page; -1 when absent. */
static int64_t metric(const char *page, const char *name, const char *topic, int p) {
    char key[400];
    snprintf(key, sizeof key, "%s{topic=\"%s\",partition=\"%d\"} ", name, topic, p);
    const char *at = strstr(page, key);
    return at ? atoll(at + strlen(key)) : -1;
}

/* Scrape /metrics into r (committed, high, lag total); 0 when the page came back. */
static int scrape(mock_run *r) {
    static char page[131072];
    if (h_http_get(r->port, "/metrics", page, sizeof page) <= 0 || !strstr(page, "200 OK")) return -1;
    for (int p = 0; p < N_PARTITIONS; p++) {
        r->committed[p] = metric(page, "moeq_coordinator_consumer_committed_offset", r->h.jobs_topic, p);
        r->high[p] = metric(page, "moeq_coordinator_consumer_high_watermark", r->h.jobs_topic, p);
    }
    const char *t = strstr(page, "\nmoeq_coordinator_consumer_lag_assigned ");
    r->lag_total = t ? atoll(t + strlen("\nmoeq_coordinator_consumer_lag_assigned ")) : -1;
    return 0;
}

/*
 * One sample of the invariant: read the committed offsets first, then the
 * batches. A job is durable before its offset is committed and nothing
 * removes a batch, so every valid job below a committed offset must be there.
 */
static void sample(mock_run *r) {
    if (scrape(r)) return;
    static h_walk w;
    if (h_read_batches(&r->h, &w)) fail_msg("unreadable batch entry");
    static unsigned char present[N_VALID];
    memset(present, 0, sizeof present);
    for (size_t k = 0; k < w.n_jobs; k++) {
        int i = atoi(w.jobs[k].id + 3);
        if (!strncmp(w.jobs[k].id, "mf-", 3) && i >= 0 && i < N_VALID) present[i] = 1;
    }
    int any = 0;
    for (int i = 0; i < N_VALID; i++) {
        int p = r->partition[i];
        if (r->offset[i] < 0 || p < 0 || p >= N_PARTITIONS || r->committed[p] < 0) continue;
        any = 1;
        if (r->offset[i] >= r->committed[p]) continue;
        r->jobs_checked++;
        if (!present[i]) {
            r->violations++;
            print_message("committed %lld on partition %d passes job mf-%d (offset %lld), not in Redis\n",
                          (long long)r->committed[p], p, i, (long long)r->offset[i]);
        }
    }
    r->samples += any;
}

/* Sample every ~150 ms for ms, serving the test producer's reports meanwhile. */
static void watch(mock_run *r, long ms) {
    int64_t end = moeq_now_ms() + ms;
    while (moeq_now_ms() < end) {
        moeq_kafka_producer_poll(r->h.producer, 0);
        sample(r);
        h_sleep_ms(150);
    }
}

static void setup_cluster(mock_run *r) {
    char err[256];
#define OK(call) do { if (call) fail_msg("%s: %s", #call, err); } while (0)
    OK(moeq_kafka_mock_topic_create(r->mock, r->h.jobs_topic, N_PARTITIONS, 1, err, sizeof err));
    for (int p = 0; p < N_PARTITIONS; p++)
        OK(moeq_kafka_mock_partition_set_leader(r->mock, r->h.jobs_topic, p, p % 2 ? B_JOBS : B_JOBS_AND_GROUP, err,
                                                sizeof err));
    OK(moeq_kafka_mock_topic_create(r->mock, r->h.results_topic, 1, 1, err, sizeof err));
    OK(moeq_kafka_mock_partition_set_leader(r->mock, r->h.results_topic, 0, B_OUTPUT, err, sizeof err));
    OK(moeq_kafka_mock_topic_create(r->mock, r->h.dlq_topic, 1, 1, err, sizeof err));
    OK(moeq_kafka_mock_partition_set_leader(r->mock, r->h.dlq_topic, 0, B_OUTPUT, err, sizeof err));
    OK(moeq_kafka_mock_topic_create(r->mock, r->h.cancel_topic, 1, 1, err, sizeof err));
    OK(moeq_kafka_mock_partition_set_leader(r->mock, r->h.cancel_topic, 0, B_JOBS, err, sizeof err));
    OK(moeq_kafka_mock_group_coordinator_set(r->mock, r->h.group, B_JOBS_AND_GROUP, err, sizeof err));
#undef OK
}

static void on_reader_rebalance(moeq_kafka_rebalance kind, const moeq_kafka_partition *parts, size_t n, void *opaque) {
    (void)parts, (void)n;
    if (kind == MOEQ_KAFKA_ASSIGNED) *(int *)opaque = 1;
}

/* What the reader saw of the invalid jobs: per job, its dead letters and error results. */
typedef struct outputs {
    int letters[N_BAD], results[N_BAD];
    int n_letters, n_results; /* copies read, duplicates included */
    int missing_letters, missing_results;
} outputs;

/* Which copy count of o a message from topic with key "bad-<i>" adds to; NULL for other messages. */
static int *output_slot(mock_run *r, outputs *o, const char *topic, const char *key) {
    int i = !strncmp(key, "bad-", 4) ? atoi(key + 4) - N_VALID : -1;
    if (i < 0 || i >= N_BAD) return NULL;
    if (!strcmp(topic, r->h.dlq_topic)) return &o->letters[i];
    if (!strcmp(topic, r->h.results_topic)) return &o->results[i];
    return NULL;
}

/* Name what is missing and where the reader stands against the topics' logs (is it the log or the reader?). */
static void print_missing(mock_run *r, const outputs *o, moeq_kafka_consumer *c) {
    for (int i = 0; i < N_BAD; i++)
        if (!o->letters[i] || !o->results[i])
            print_message("bad-%d (jobs partition %d offset %lld): %d dead letters, %d results\n", N_VALID + i,
                          (int)r->partition[N_VALID + i], (long long)r->offset[N_VALID + i], o->letters[i],
                          o->results[i]);
    moeq_kafka_lag *lags = NULL;
    size_t n = 0;
    char err[256];
    if (moeq_kafka_consumer_lag(c, 3000, &lags, &n, err, sizeof err) == MOEQ_OK)
        for (size_t k = 0; k < n; k++)
            print_message("%s [%d]: log %lld..%lld, reader at %lld\n", lags[k].topic, (int)lags[k].partition,
                          (long long)lags[k].low, (long long)lags[k].high, (long long)lags[k].position);
    free(lags);
}

/*
 * Read the dead-letter and results topics until every invalid job's dead
 * letter and error result were seen (or 20 s passed); fills *o. (Not
 * h_collect: it may destroy its consumer before the group assigned it
 * anything, which librdkafka 2.0.2's cooperative-sticky assignor answers with
 * an assertion failure — librdkafka issue #4312, fixed in 2.3.0.)
 */
static void read_outputs(mock_run *r, outputs *o) {
    memset(o, 0, sizeof(*o));
    o->missing_letters = o->missing_results = N_BAD;
    char group[200], err[256];
    snprintf(group, sizeof group, "%s.outputs-reader", r->h.group);
    const char *topics[] = {r->h.dlq_topic, r->h.results_topic};
    int assigned = 0;
    moeq_kafka_consumer_params cp = {.brokers = r->h.kafka, .group_id = group, .topics = topics, .n_topics = 2,
                                     .on_rebalance = on_reader_rebalance, .cb_opaque = &assigned};
    moeq_kafka_consumer *c = NULL;
    if (moeq_kafka_consumer_new(&cp, NULL, &c, err, sizeof err)) fail_msg("reader: %s", err);
    int64_t end = moeq_now_ms() + 20000;
    while ((o->missing_letters || o->missing_results || !assigned) && moeq_now_ms() < end) {
        moeq_kafka_msg *m = NULL;
        if (moeq_kafka_consumer_poll(c, 200, &m, err, sizeof err) || !m) continue;
        size_t kl = 0;
        const char *k = moeq_kafka_msg_key(m, &kl);
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)kl, k ? k : "");
        const char *topic = moeq_kafka_msg_topic(m);
        int *copies = output_slot(r, o, topic, key);
        int letter = !strcmp(topic, r->h.dlq_topic);
        if (copies && (*copies)++ == 0) {
            if (letter) o->missing_letters--;
            else o->missing_results--;
        }
        if (letter) o->n_letters++;
        else o->n_results++;
        moeq_kafka_msg_destroy(m);
    }
    if (o->missing_letters || o->missing_results) print_missing(r, o, c);
    for (end += 10000; !assigned && moeq_now_ms() < end;) { /* see above */
        moeq_kafka_msg *m = NULL;
        moeq_kafka_consumer_poll(c, 200, &m, err, sizeof err);
        moeq_kafka_msg_destroy(m);
    }
    moeq_kafka_consumer_destroy(c);
}

static size_t faults_left(mock_run *r, int32_t broker, moeq_kafka_api api) {
    size_t left = 0;
    char err[256];
    if (moeq_kafka_mock_broker_faults_left(r->mock, broker, api, &left, err, sizeof err)) fail_msg("%s", err);
    return left;
}

/* The harness, a 3-broker mock cluster with the topics, and a test producer talking to it; 0, or skip. */
static int run_init(mock_run *r, const char *name) {
    memset(r, 0, sizeof(*r));
    for (int i = 0; i < N_ALL; i++) r->partition[i] = -1, r->offset[i] = -1;
    int rc = h_init(&r->h, name);
    if (rc) return rc;
    char err[256];
    if (moeq_kafka_mock_new(3, &r->mock, err, sizeof err)) fail_msg("mock: %s", err);
    snprintf(r->h.kafka, sizeof r->h.kafka, "%s", moeq_kafka_mock_bootstraps(r->mock));
    setup_cluster(r);
    /* the harness's producer talked to the real broker: one for the mock cluster instead */
    moeq_kafka_producer_destroy(r->h.producer);
    moeq_kafka_producer_params pp = {.brokers = r->h.kafka, .client_id = "moeq-test", .on_delivery = on_delivery,
                                     .cb_opaque = r};
    /* A down mock broker may leave a request unanswered on an open connection, as
     * a network partition does: the socket timeout notices, kept short here. */
    moeq_kvlist *kv = moeq_kvlist_new();
    moeq_kvlist_set(kv, "socket.timeout.ms", "3000");
    moeq_kvlist_set(kv, "reconnect.backoff.max.ms", "500");
    if (moeq_kafka_producer_new(&pp, kv, &r->h.producer, err, sizeof err)) fail_msg("producer: %s", err);
    moeq_kvlist_destroy(kv);
    return 0;
}

static void run_destroy(mock_run *r) {
    h_destroy(&r->h);
    moeq_kafka_mock_destroy(r->mock);
}

/*
 * Start `moeq coordinator` against the mock cluster, /metrics on r->port.
 *
 * max.in.flight.requests.per.connection=1: librdkafka's idempotent producer
 * takes a later batch's success as proof that the earlier batches of the
 * partition were written ("implicitly acked by subsequent batch success"),
 * which a real broker guarantees by refusing an out-of-order sequence number.
 * The 2.0.2 mock checks sequence numbers only for transactional producers,
 * and answers an injected Produce error without appending, even the
 * possibly-persisted ones that a real broker only sends after appending
 * (REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND). With two requests of
 * a partition in flight, an injected error on the first and the mock's
 * acceptance of the second left a gap in the dead-letter log that librdkafka
 * then reported as delivered — a loss no real broker produces (seen as 3 or 4
 * missing dead letters in about one run of ten). One request in flight keeps
 * the mock's answers to the injected errors faithful.
 */
static pid_t run_coordinator(mock_run *r) {
    static char hp[32];
    r->port = h_free_port();
    snprintf(hp, sizeof hp, "--http_port=%d", r->port);
    const char *extra[] = {"--max_wait_ms=20", "--commit_interval_ms=200", "--kafka.topic.metadata.refresh.interval.ms=500",
                           "--kafka.reconnect.backoff.max.ms=500", "--kafka.socket.timeout.ms=3000",
                           "--kafka.session.timeout.ms=4000", "--kafka.heartbeat.interval.ms=500",
                           "--kafka.max.in.flight.requests.per.connection=1", hp, NULL};
    return h_start(&r->h, extra);
}

/* Wait up to ms until every valid job in [first, last) is in a batch; 1 when they all are. */
static int wait_in_redis(mock_run *r, h_walk *w, int first, int last, long ms) {
    int64_t end = moeq_now_ms() + ms;
    for (;;) {
        sample(r);
        if (h_read_batches(&r->h, w)) fail_msg("unreadable batch entry");
        int found = 0;
        for (size_t k = 0; k < w->n_jobs; k++) {
            int i = atoi(w->jobs[k].id + 3);
            found += !strncmp(w->jobs[k].id, "mf-", 3) && i >= first && i < last;
        }
        if (found >= last - first) return 1;
        if (moeq_now_ms() >= end) return 0;
        h_sleep_ms(200);
    }
}

/* Wait up to ms until /metrics shows every partition committed at its high watermark, lag 0; 1 when it does. */
static int wait_caught_up(mock_run *r, long ms) {
    int64_t end = moeq_now_ms() + ms;
    for (;;) {
        sample(r);
        int caught_up = r->lag_total == 0;
        for (int p = 0; p < N_PARTITIONS; p++)
            caught_up = caught_up && r->committed[p] >= 0 && r->committed[p] == r->high[p];
        if (caught_up) return 1;
        if (moeq_now_ms() >= end) return 0;
        h_sleep_ms(200);
    }
}

/* One past the offset of the last job produced to each partition (from the delivery reports). */
static void produced_high(const mock_run *r, int64_t *high) {
    for (int p = 0; p < N_PARTITIONS; p++) high[p] = 0;
    for (int i = 0; i < N_ALL; i++)
        if (r->partition[i] >= 0 && r->offset[i] + 1 > high[r->partition[i]]) high[r->partition[i]] = r->offset[i] + 1;
}

static void no_job_is_lost_or_doubled_through_injected_kafka_request_errors(void **state) {
    (void)state;
    static mock_run r;
    int64_t t_start = moeq_now_ms();
    int rc = run_init(&r, "coord_mock_faults");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    char err[256];

    produce_chunk(&r, 0);
    assert_int_equal(h_flush(&r.h), 0);
    /* Fetch: errors that send the consumer back to metadata, a timeout, dropped connections */
    const moeq_kafka_fault fetch[] = {
        MOEQ_KAFKA_FAULT_NOT_LEADER,   MOEQ_KAFKA_FAULT_REQUEST_TIMED_OUT, MOEQ_KAFKA_FAULT_DISCONNECT,
        MOEQ_KAFKA_FAULT_LEADER_NOT_AVAILABLE, MOEQ_KAFKA_FAULT_DISCONNECT, MOEQ_KAFKA_FAULT_UNKNOWN_TOPIC_OR_PART,
    };
    push(&r, 0, MOEQ_KAFKA_API_FETCH, fetch, 6, 0);
    push(&r, B_JOBS, MOEQ_KAFKA_API_FETCH, fetch, 6, 50);
    pid_t pid = run_coordinator(&r);
    /* the faults below must meet a running consumer: wait until batches appear (the group has formed) */
    h_walk w = {0};
    int64_t end = moeq_now_ms() + 20000;
    while (moeq_now_ms() < end && w.n_jobs == 0) {
        watch(&r, 150);
        assert_int_equal(h_read_batches(&r.h, &w), 0);
    }
    assert_true(w.n_jobs > 0);
    print_message("consuming after %.1f s\n", (moeq_now_ms() - t_start) / 1000.0);

    /* OffsetCommit at the group coordinator, Produce of results and dead letters */
    const moeq_kafka_fault commit[] = {
        MOEQ_KAFKA_FAULT_REQUEST_TIMED_OUT, MOEQ_KAFKA_FAULT_COORDINATOR_LOADING, MOEQ_KAFKA_FAULT_DISCONNECT,
        MOEQ_KAFKA_FAULT_REBALANCE_IN_PROGRESS, MOEQ_KAFKA_FAULT_COORDINATOR_NOT_AVAILABLE,
    };
    push(&r, B_JOBS_AND_GROUP, MOEQ_KAFKA_API_OFFSET_COMMIT, commit, 5, 0);
    const moeq_kafka_fault produce[] = {
        MOEQ_KAFKA_FAULT_NOT_ENOUGH_REPLICAS, MOEQ_KAFKA_FAULT_REQUEST_TIMED_OUT, MOEQ_KAFKA_FAULT_NOT_LEADER,
        MOEQ_KAFKA_FAULT_DISCONNECT, MOEQ_KAFKA_FAULT_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    };
    push(&r, B_OUTPUT, MOEQ_KAFKA_API_PRODUCE, produce, 5, 20);
    produce_chunk(&r, 1);
    assert_int_equal(h_flush(&r.h), 0);
    watch(&r, 1500);

    /* broker 1 (two job partitions' leader, group coordinator) down while chunk 2 is produced */
    assert_int_equal(moeq_kafka_mock_broker_down(r.mock, B_JOBS_AND_GROUP, err, sizeof err), MOEQ_OK);
    produce_chunk(&r, 2);
    watch(&r, 2000);
    assert_int_equal(moeq_kafka_mock_broker_up(r.mock, B_JOBS_AND_GROUP, err, sizeof err), MOEQ_OK);
    push(&r, 0, MOEQ_KAFKA_API_FETCH, fetch, 6, 0);
    assert_int_equal(h_flush(&r.h), 0);
    assert_int_equal(r.h.delivered, N_ALL);

    /* every valid job reaches Redis ... */
    wait_in_redis(&r, &w, 0, N_VALID, 30000);
    /* ... and the commits catch up: committed = high watermark, lag 0 */
    int caught_up = wait_caught_up(&r, 15000);
    int64_t want_high[N_PARTITIONS];
    produced_high(&r, want_high);
    print_message("lag %lld; committed %lld %lld %lld %lld of %lld %lld %lld %lld\n", (long long)r.lag_total,
                  (long long)r.committed[0], (long long)r.committed[1], (long long)r.committed[2],
                  (long long)r.committed[3], (long long)want_high[0], (long long)want_high[1], (long long)want_high[2],
                  (long long)want_high[3]);
    assert_true(caught_up);
    for (int p = 0; p < N_PARTITIONS; p++) assert_int_equal(r.high[p], want_high[p]);

    /* the injected answers were all given */
    assert_int_equal(faults_left(&r, B_JOBS, MOEQ_KAFKA_API_FETCH), 0);
    assert_int_equal(faults_left(&r, B_JOBS_AND_GROUP, MOEQ_KAFKA_API_OFFSET_COMMIT), 0);
    assert_int_equal(faults_left(&r, B_OUTPUT, MOEQ_KAFKA_API_PRODUCE), 0);

    assert_int_equal(h_stop(pid), 0);
    assert_int_equal(h_read_batches(&r.h, &w), 0);
    qsort(w.jobs, w.n_jobs, sizeof(*w.jobs), h_cmp_id);
    size_t doubled = 0, bad_batched = 0;
    for (size_t i = 0; i < w.n_jobs; i++) {
        doubled += i > 0 && !strcmp(w.jobs[i].id, w.jobs[i - 1].id);
        bad_batched += !strncmp(w.jobs[i].id, "bad-", 4);
    }
    print_message("%zu jobs in %zu batches, %zu doubled; %zu samples checked %zu jobs below a committed offset, "
                  "%zu not in Redis\n", w.n_jobs, w.n_batches, doubled, r.samples, r.jobs_checked, r.violations);
    assert_int_equal(doubled, 0);
    assert_int_equal(bad_batched, 0);
    assert_int_equal(w.n_jobs, N_VALID);
    assert_int_equal(r.violations, 0);
    assert_true(r.samples > 0 && r.jobs_checked > 0);

    /* every invalid job was dead-lettered and answered with an error result (at least once: a redelivered
     * one is answered again) */
    static outputs o;
    read_outputs(&r, &o);
    print_message("%d dead letters and %d results for %d invalid jobs; %.1f s\n", o.n_letters, o.n_results, N_BAD,
                  (moeq_now_ms() - t_start) / 1000.0);
    assert_int_equal(o.missing_letters, 0);
    assert_int_equal(o.missing_results, 0);
    free(w.jobs);
    free(w.batches);
    run_destroy(&r);
}

/*
 * An async commit the group coordinator refuses is retried on a later tick
 * even when nothing new was stored. Everything is caught up first; then the
 * next OffsetCommits are refused (REBALANCE_IN_PROGRESS: librdkafka hands it
 * to the offset-commit callback instead of retrying it itself), a handful of
 * valid jobs is produced and written to Redis, and nothing more is produced.
 * Without the retry the first refused commit would be the last one and the
 * committed offsets would stay behind the high watermarks for good.
 */
static void an_idle_coordinator_commits_again_after_a_refused_commit(void **state) {
    (void)state;
    static mock_run r;
    enum { N_FIRST = 40, N_LATER = 8, N_REFUSED = 3 };
    int rc = run_init(&r, "coord_idle_commit");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);

    for (int i = 0; i < N_FIRST; i++) produce_job(&r, i);
    assert_int_equal(h_flush(&r.h), 0);
    pid_t pid = run_coordinator(&r);
    h_walk w = {0};
    assert_true(wait_in_redis(&r, &w, 0, N_FIRST, 30000));
    assert_true(wait_caught_up(&r, 15000));

    /* idle and caught up: no commit is sent until something new is stored, so these meet the next ones */
    const moeq_kafka_fault refuse[N_REFUSED] = {
        MOEQ_KAFKA_FAULT_REBALANCE_IN_PROGRESS, MOEQ_KAFKA_FAULT_REBALANCE_IN_PROGRESS,
        MOEQ_KAFKA_FAULT_REBALANCE_IN_PROGRESS,
    };
    push(&r, B_JOBS_AND_GROUP, MOEQ_KAFKA_API_OFFSET_COMMIT, refuse, N_REFUSED, 0);
    for (int i = N_FIRST; i < N_FIRST + N_LATER; i++) produce_job(&r, i);
    assert_int_equal(h_flush(&r.h), 0);
    assert_true(wait_in_redis(&r, &w, N_FIRST, N_FIRST + N_LATER, 15000));

    /* nothing more is produced: only a retried commit can move the committed offsets now */
    int caught_up = wait_caught_up(&r, 10000);
    int64_t want_high[N_PARTITIONS];
    produced_high(&r, want_high);
    size_t left = faults_left(&r, B_JOBS_AND_GROUP, MOEQ_KAFKA_API_OFFSET_COMMIT);
    print_message("refused commits left %zu; lag %lld; committed %lld %lld %lld %lld of %lld %lld %lld %lld\n", left,
                  (long long)r.lag_total, (long long)r.committed[0], (long long)r.committed[1],
                  (long long)r.committed[2], (long long)r.committed[3], (long long)want_high[0],
                  (long long)want_high[1], (long long)want_high[2], (long long)want_high[3]);
    int stopped = h_stop(pid); /* before asserting: a failed assertion must not leave the child running */
    assert_int_equal(left, 0); /* every refusal met a commit of the new offsets */
    assert_true(caught_up);
    for (int p = 0; p < N_PARTITIONS; p++) assert_int_equal(r.committed[p], want_high[p]);
    assert_int_equal(r.violations, 0);
    assert_int_equal(stopped, 0);
    free(w.jobs);
    free(w.batches);
    run_destroy(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_job_is_lost_or_doubled_through_injected_kafka_request_errors),
        cmocka_unit_test(an_idle_coordinator_commits_again_after_a_refused_commit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
