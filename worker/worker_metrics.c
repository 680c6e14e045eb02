/*
 * worker_metrics.c — Prometheus text rendering of the worker's counters and a
 * two-route libmicrohttpd server. No policy here.
 */
#include "worker_metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/log.h"
#include "moeq/util.h"

const int64_t moeq_worker_latency_bounds[WORKER_LAT_BUCKETS] = {50,   100,   250,   500,   1000,  2500,
                                                                 5000, 10000, 30000, 60000, 300000, 900000};

void moeq_worker_metrics_observe_latency(moeq_worker_metrics *m, int64_t ms) {
    int b = 0;
    while (b < WORKER_LAT_BUCKETS && ms > moeq_worker_latency_bounds[b]) b++;
    atomic_fetch_add_explicit(&m->latency_bucket[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->latency_ms_sum, ms, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->latency_count, 1, memory_order_relaxed);
}

typedef struct out_buf {
    char *buf;
    size_t size, len;
} out_buf;

static void emit(out_buf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(out_buf *o, const char *fmt, ...) {
    if (o->len + 1 >= o->size) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->size - o->len, fmt, ap);
    va_end(ap);
    if (n > 0) o->len = o->len + (size_t)n < o->size ? o->len + (size_t)n : o->size - 1;
}

#define LOAD(x) ((long long)atomic_load_explicit(&(x), memory_order_relaxed))

static void counter(out_buf *o, const char *name, const char *help, const char *type, const char *wid, long long v) {
    emit(o, "# HELP moeq_worker_%s %s\n# TYPE moeq_worker_%s %s\nmoeq_worker_%s{worker=\"%s\"} %lld\n", name, help,
         name, type, name, wid, v);
}

size_t moeq_worker_metrics_render(const moeq_worker_metrics *m, const char *wid, char *buf, size_t size) {
    out_buf o = {buf, size, 0};
    if (size) buf[0] = 0;
    counter(&o, "batches_taken_total", "batches taken from the streams", "counter", wid, LOAD(m->batches_taken));
    counter(&o, "batches_acked_total", "batches acknowledged after all results were delivered", "counter", wid,
            LOAD(m->batches_acked));
    counter(&o, "ack_failures_total", "acknowledgements Redis did not take (retried until taken)", "counter", wid,
            LOAD(m->ack_failures));
    counter(&o, "reclaims_total", "batches reclaimed from silent workers", "counter", wid, LOAD(m->batches_reclaimed));
    counter(&o, "dead_lettered_total", "batches dead-lettered after max_deliveries", "counter", wid,
            LOAD(m->batches_dead_lettered));
    counter(&o, "handed_back_total", "batches handed back on shutdown", "counter", wid, LOAD(m->batches_handed_back));
    counter(&o, "jobs_finished_total", "jobs whose result was produced", "counter", wid, LOAD(m->jobs_finished));
    counter(&o, "jobs_skipped_done_total", "jobs of reclaimed batches already done", "counter", wid,
            LOAD(m->jobs_skipped_done));
    counter(&o, "results_failed_total", "result deliveries the broker failed (retried)", "counter", wid,
            LOAD(m->results_failed));
    counter(&o, "prefill_tokens_total", "prompt tokens run", "counter", wid, LOAD(m->prefill_tokens));
    counter(&o, "decode_tokens_total", "generated tokens run", "counter", wid, LOAD(m->decode_tokens));
    counter(&o, "prefix_tokens_shared_total", "prompt tokens taken from a running job's cache (not prefilled)",
            "counter", wid, LOAD(m->prefix_tokens_shared));
    counter(&o, "prefix_cache_lookups_total", "jobs that looked their prompt up in the prefix cache", "counter",
            wid, LOAD(m->prefix_lookups));
    counter(&o, "prefix_cache_hits_total", "of them, jobs that took at least one cached block", "counter", wid,
            LOAD(m->prefix_hits));
    counter(&o, "prefix_cache_lookup_tokens_total", "prompt tokens those jobs could have taken (all but the last)",
            "counter", wid, LOAD(m->prefix_lookup_tokens));
    counter(&o, "prefix_cache_hit_tokens_total", "prompt tokens taken from the prefix cache (not prefilled)",
            "counter", wid, LOAD(m->prefix_hit_tokens));
    counter(&o, "prefix_cache_cached_blocks", "cache blocks kept for later jobs that no running job uses", "gauge",
            wid, LOAD(m->prefix_cached_blocks));
    counter(&o, "prefix_cache_evictions_total", "cached blocks reused for other entries", "counter", wid,
            LOAD(m->prefix_evictions));
    counter(&o, "prefix_cache_collisions_total", "key matches the token comparison rejected", "counter", wid,
            LOAD(m->prefix_collisions));
    counter(&o, "affinity_handed_total", "fresh batches handed to the worker that advertised their prefix key",
            "counter", wid, LOAD(m->affinity_handed));
    counter(&o, "affinity_received_total", "batches taken from this worker's pending list after a peer's hand-off",
            "counter", wid, LOAD(m->affinity_received));
    long long lookup_tokens = LOAD(m->prefix_lookup_tokens);
    emit(&o, "# HELP moeq_worker_prefix_cache_hit_rate hit tokens / lookup tokens since start (0 before any)\n"
             "# TYPE moeq_worker_prefix_cache_hit_rate gauge\nmoeq_worker_prefix_cache_hit_rate{worker=\"%s\"} %.4f\n",
         wid, lookup_tokens > 0 ? (double)LOAD(m->prefix_hit_tokens) / (double)lookup_tokens : 0.0);
    counter(&o, "steps_total", "engine steps", "counter", wid, LOAD(m->steps));
    counter(&o, "engine_seconds_total", "seconds inside engine steps (x1e-9: ns)", "counter", wid, LOAD(m->engine_ns));
    counter(&o, "sequences_active", "sequences in the engine", "gauge", wid, LOAD(m->sequences_active));
    counter(&o, "slots_free", "free sequence slots", "gauge", wid, LOAD(m->slots_free));
    counter(&o, "ttft_ms_sum", "batch taken to first token, ms, summed", "counter", wid, LOAD(m->ttft_ms_sum));
    counter(&o, "ttft_count", "first tokens observed", "counter", wid, LOAD(m->ttft_count));
    counter(&o, "mtp_rounds_total", "speculative (MTP) rounds run", "counter", wid, LOAD(m->mtp_rounds));
    counter(&o, "mtp_drafted_total", "tokens drafted by the MTP layer", "counter", wid, LOAD(m->mtp_drafted));
    counter(&o, "mtp_accepted_total", "drafted tokens the main model accepted", "counter", wid, LOAD(m->mtp_accepted));
    long long drafted = LOAD(m->mtp_drafted);
    emit(&o, "# HELP moeq_worker_mtp_acceptance_rate accepted / drafted since start (0 before any draft)\n"
             "# TYPE moeq_worker_mtp_acceptance_rate gauge\nmoeq_worker_mtp_acceptance_rate{worker=\"%s\"} %.4f\n",
         wid, drafted > 0 ? (double)LOAD(m->mtp_accepted) / (double)drafted : 0.0);
    emit(&o, "# HELP moeq_worker_job_latency_ms job latency (Kafka append to result), ms\n"
             "# TYPE moeq_worker_job_latency_ms histogram\n");
    long long cum = 0;
    for (int b = 0; b <= WORKER_LAT_BUCKETS; b++) {
        cum += LOAD(m->latency_bucket[b]);
        if (b < WORKER_LAT_BUCKETS)
            emit(&o, "moeq_worker_job_latency_ms_bucket{worker=\"%s\",le=\"%lld\"} %lld\n", wid,
                 (long long)moeq_worker_latency_bounds[b], cum);
        else
            emit(&o, "moeq_worker_job_latency_ms_bucket{worker=\"%s\",le=\"+Inf\"} %lld\n", wid, cum);
    }
    emit(&o, "moeq_worker_job_latency_ms_sum{worker=\"%s\"} %lld\n", wid, LOAD(m->latency_ms_sum));
    emit(&o, "moeq_worker_job_latency_ms_count{worker=\"%s\"} %lld\n", wid, LOAD(m->latency_count));
    return o.len;
}

struct moeq_worker_http {
    struct MHD_Daemon *daemon;
    moeq_worker_metrics *m;
    const char *worker_id;
    moeq_health *health;
};

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    (void)version, (void)upload_data, (void)upload_data_size, (void)con_cls;
    moeq_worker_http *h = cls;
    if (strcmp(method, "GET") != 0) return MHD_NO;
    char *body = NULL, text[600];
    size_t len = 0;
    unsigned status = MHD_HTTP_OK;
    if (strcmp(url, "/metrics") == 0) {
        size_t cap = 16384;
        body = malloc(cap);
        if (!body) return MHD_NO;
        len = moeq_worker_metrics_render(h->m, h->worker_id, body, cap);
    } else if ((status = moeq_health_route(h->health, url, moeq_now_ms(), text, sizeof text))) {
        if (status == MHD_HTTP_OK && strcmp(url, "/livez") && atomic_load(&h->m->draining))
            snprintf(text, sizeof text, "draining\n");
        body = strdup(text);
        if (!body) return MHD_NO;
        len = strlen(body);
    } else {
        body = strdup("not found\n");
        if (!body) return MHD_NO;
        len = strlen(body);
        status = MHD_HTTP_NOT_FOUND;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
    enum MHD_Result r = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return r;
}

moeq_err moeq_worker_http_start(moeq_worker_metrics *m, const char *worker_id, moeq_health *health, const char *addr,
                                int port, moeq_worker_http **out, char *errstr, size_t errstr_size) {
    *out = NULL;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "http_addr: '%s' is not an IPv4 address", addr);
    moeq_worker_http *h = calloc(1, sizeof *h);
    if (!h) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "http");
    h->m = m;
    h->worker_id = worker_id;
    h->health = health;
    /* a thread per connection: /readyz may wait on the broker (about a second), /livez must not */
    h->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, (uint16_t)port, NULL,
                                 NULL, on_request, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_END);
    if (!h->daemon) {
        free(h);
        return moeq_errf(MOEQ_ERR_IO, errstr, errstr_size,
                         "http_port: cannot listen on %s:%d (taken? set another port, 0 = ephemeral, -1 = off)", addr,
                         port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    moeq_log(MOEQ_LOG_INFO, "worker", "http_listening", "addr=%s port=%u routes=/metrics,/livez,/readyz,/healthz", addr,
             info ? (unsigned)info->port : (unsigned)port);
    *out = h;
    return MOEQ_OK;
}

void moeq_worker_http_stop(moeq_worker_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->daemon);
    free(h);
}
