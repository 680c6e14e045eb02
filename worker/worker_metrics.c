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

/* Bucket upper bounds, microseconds; each family's list ends at 0 (then +Inf). */
static const int64_t ttft_bounds[] = {10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 5000000,
                                      10000000, 30000000, 60000000, 0};
static const int64_t tpot_bounds[] = {5000, 10000, 25000, 50000, 75000, 100000, 250000, 500000, 1000000, 2500000,
                                      5000000, 0};
static const int64_t long_bounds[] = {50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000,
                                      30000000, 60000000, 300000000, 900000000, 0}; /* queue time, end to end */

static void hist_observe(moeq_worker_hist *h, const int64_t *bounds, int64_t us) {
    int b = 0;
    if (us < 0) us = 0;
    while (bounds[b] && us > bounds[b]) b++;
    atomic_fetch_add_explicit(&h->bucket[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, us, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

void moeq_worker_metrics_observe_ttft(moeq_worker_metrics *m, int64_t ms) { hist_observe(&m->ttft, ttft_bounds, ms * 1000); }

void moeq_worker_metrics_observe_result(moeq_worker_metrics *m, const moeq_result *r) {
    int s = r->status < MOEQ_RESULT_STATUS__COUNT ? (int)r->status : (int)MOEQ_RESULT_ERROR;
    int f = r->finish_reason < MOEQ_FINISH__COUNT ? (int)r->finish_reason : (int)MOEQ_FINISH_NONE;
    atomic_fetch_add_explicit(&m->results[s][f], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->prompt_tokens, r->usage.prompt_tokens, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->generation_tokens, r->usage.completion_tokens, memory_order_relaxed);
    hist_observe(&m->queue_time, long_bounds, (r->timings.queued_ms + r->timings.batched_ms) * 1000);
    hist_observe(&m->e2e_latency, long_bounds, r->timings.total_ms * 1000);
    if (r->usage.completion_tokens > 1) /* the first token comes from prefill: TTFT's share */
        hist_observe(&m->tpot, tpot_bounds, r->timings.decode_ms * 1000 / (r->usage.completion_tokens - 1));
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

static void histogram(out_buf *o, const char *name, const char *help, const char *wid, const moeq_worker_hist *h,
                      const int64_t *bounds) {
    emit(o, "# HELP moeq_worker_%s %s\n# TYPE moeq_worker_%s histogram\n", name, help, name);
    long long cum = 0;
    int b = 0;
    for (; bounds[b]; b++) {
        cum += LOAD(h->bucket[b]);
        emit(o, "moeq_worker_%s_bucket{worker=\"%s\",le=\"%g\"} %lld\n", name, wid, (double)bounds[b] / 1e6, cum);
    }
    cum += LOAD(h->bucket[b]);
    emit(o, "moeq_worker_%s_bucket{worker=\"%s\",le=\"+Inf\"} %lld\n", name, wid, cum);
    emit(o, "moeq_worker_%s_sum{worker=\"%s\"} %.6f\n", name, wid, (double)LOAD(h->sum_us) / 1e6);
    emit(o, "moeq_worker_%s_count{worker=\"%s\"} %lld\n", name, wid, LOAD(h->count));
}

/* results_total{status, finish_reason}: every status x reason pair seen, and each status's first pair always. */
static void results_by_status(out_buf *o, const moeq_worker_metrics *m, const char *wid) {
    emit(o, "# HELP moeq_worker_results_total results produced, by status and finish reason (none: nothing ran)\n"
            "# TYPE moeq_worker_results_total counter\n");
    for (int s = 0; s < MOEQ_RESULT_STATUS__COUNT; s++)
        for (int f = 0; f < MOEQ_FINISH__COUNT; f++) {
            long long v = LOAD(m->results[s][f]);
            if (!v && f) continue; /* absent pairs stay absent; finish_reason none keeps each status visible */
            emit(o, "moeq_worker_results_total{worker=\"%s\",status=\"%s\",finish_reason=\"%s\"} %lld\n", wid,
                 moeq_result_status_name((moeq_result_status)s),
                 f ? moeq_finish_reason_name((moeq_finish_reason)f) : "none", v);
        }
}

static void vllm_set(out_buf *o, const moeq_worker_metrics *m, const char *wid) {
    counter(o, "requests_running", "jobs holding a sequence slot", "gauge", wid, LOAD(m->sequences_active));
    counter(o, "requests_waiting", "jobs taken from the streams, waiting for a slot", "gauge", wid,
            LOAD(m->requests_waiting));
    counter(o, "requests_running_max", "the most jobs that held sequence slots at once (how many the KV cache "
            "admitted together; blocks that jobs share count once)", "gauge", wid, LOAD(m->sequences_active_max));
    long long cap = LOAD(m->kv_capacity_tokens);
    emit(o, "# HELP moeq_worker_kv_cache_usage_ratio KV cache tokens that running jobs hold or may still take "
            "(shared blocks once) / kv_cache_tokens (0..1)\n"
            "# TYPE moeq_worker_kv_cache_usage_ratio gauge\nmoeq_worker_kv_cache_usage_ratio{worker=\"%s\"} %.4f\n",
         wid, cap > 0 ? (double)LOAD(m->kv_reserved_tokens) / (double)cap : 0.0);
    if (atomic_load(&m->device_known)) {
        emit(o, "# HELP moeq_worker_device_info the compute backend and device this worker runs on (always 1)\n"
                "# TYPE moeq_worker_device_info gauge\nmoeq_worker_device_info{worker=\"%s\",backend=\"%s\",device=\"%d\"} 1\n",
             wid, m->device_backend, m->device_ordinal);
        counter(o, "device_memory_used_bytes", "memory in use on the device (cuda: the driver's total - free; cpu: "
                "this engine's buffers)", "gauge", wid, LOAD(m->device_used_bytes));
        counter(o, "device_memory_total_bytes", "memory of the device (cpu: the machine's)", "gauge", wid,
                LOAD(m->device_total_bytes));
        counter(o, "kv_pool_bytes", "bytes of the latent cache pool (kv_cache_tokens x bytes per token)", "gauge", wid,
                LOAD(m->kv_pool_bytes));
    }
    counter(o, "prompt_tokens_total", "prompt tokens of the jobs answered (results' usage)", "counter", wid,
            LOAD(m->prompt_tokens));
    counter(o, "generation_tokens_total", "tokens generated for the jobs answered (results' usage)", "counter", wid,
            LOAD(m->generation_tokens));
    results_by_status(o, m, wid);
    histogram(o, "time_to_first_token_seconds", "batch taken from Redis to the job's first token, s", wid, &m->ttft,
              ttft_bounds);
    histogram(o, "time_per_output_token_seconds", "decode time / (completion tokens - 1), per job, s", wid, &m->tpot,
              tpot_bounds);
    histogram(o, "request_queue_time_seconds", "Kafka append to taken by a worker (coordinator + Redis), s", wid,
              &m->queue_time, long_bounds);
    histogram(o, "e2e_request_latency_seconds", "Kafka append to result produced, s", wid, &m->e2e_latency,
              long_bounds);
}

/*
 * The load each routed expert saw from this worker's tokens, summed over layers (what `moeq ep-plan` packs),
 * and each MoE layer's max / mean over its experts (1 = even; in a group the rank with the hottest experts
 * sets the pace). Per layer and expert: expert_stats_path.
 */
static void expert_load(out_buf *o, const moeq_worker_metrics *m, const char *wid) {
    if (!atomic_load(&m->expert_known)) return;
    int L = m->expert_layers, E = m->expert_n;
    emit(o, "# HELP moeq_worker_expert_slots_total routed slots of this worker's tokens each expert received, "
            "summed over MoE layers\n# TYPE moeq_worker_expert_slots_total counter\n");
    for (int x = 0; x < E; x++) {
        long long sum = 0;
        for (int l = 0; l < L; l++) sum += LOAD(m->expert_slots[(size_t)l * (size_t)E + (size_t)x]);
        emit(o, "moeq_worker_expert_slots_total{worker=\"%s\",expert=\"%d\"} %lld\n", wid, x, sum);
    }
    emit(o, "# HELP moeq_worker_expert_load_imbalance max / mean of a MoE layer's slots per expert (1 = even)\n"
            "# TYPE moeq_worker_expert_load_imbalance gauge\n");
    for (int l = 0; l < L; l++) {
        long long max = 0, sum = 0;
        for (int x = 0; x < E; x++) {
            long long v = LOAD(m->expert_slots[(size_t)l * (size_t)E + (size_t)x]);
            max = v > max ? v : max, sum += v;
        }
        if (sum > 0)
            emit(o, "moeq_worker_expert_load_imbalance{worker=\"%s\",layer=\"%d\"} %.4f\n", wid, l,
                 (double)max * E / (double)sum);
    }
}

size_t moeq_worker_metrics_render_size(const moeq_worker_metrics *m) {
    size_t lines = atomic_load(&m->expert_known) ? (size_t)m->expert_n + (size_t)m->expert_layers : 0;
    return 65536 + 160 * lines; /* the fixed families: ~12 KB; an expert line ~80 bytes with a long worker id */
}

size_t moeq_worker_metrics_render(const moeq_worker_metrics *m, const char *wid, char *buf, size_t size) {
    out_buf o = {buf, size, 0};
    if (size) buf[0] = 0;
    emit(&o, "# HELP moeq_worker_build_info the build this worker runs (always 1)\n# TYPE moeq_worker_build_info gauge\n"
             "moeq_worker_build_info{worker=\"%s\",version=\"%s\"} 1\n", wid, moeq_version());
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
    emit(&o, "# HELP moeq_worker_engine_seconds_total time inside engine steps, s\n"
             "# TYPE moeq_worker_engine_seconds_total counter\nmoeq_worker_engine_seconds_total{worker=\"%s\"} %.6f\n",
         wid, (double)LOAD(m->engine_ns) / 1e9);
    counter(&o, "slots_free", "free sequence slots", "gauge", wid, LOAD(m->slots_free));
    counter(&o, "mtp_rounds_total", "speculative (MTP) rounds run", "counter", wid, LOAD(m->mtp_rounds));
    counter(&o, "mtp_drafted_total", "tokens drafted by the MTP layer", "counter", wid, LOAD(m->mtp_drafted));
    counter(&o, "mtp_accepted_total", "drafted tokens the main model accepted", "counter", wid, LOAD(m->mtp_accepted));
    long long drafted = LOAD(m->mtp_drafted);
    emit(&o, "# HELP moeq_worker_mtp_acceptance_rate accepted / drafted since start (0 before any draft)\n"
             "# TYPE moeq_worker_mtp_acceptance_rate gauge\nmoeq_worker_mtp_acceptance_rate{worker=\"%s\"} %.4f\n",
         wid, drafted > 0 ? (double)LOAD(m->mtp_accepted) / (double)drafted : 0.0);
    counter(&o, "head_screen_on", "1 while greedy rows are decided by the screened head (an int8 copy of lm_head)",
            "gauge", wid, LOAD(m->screen_on));
    counter(&o, "head_screen_rows_total", "greedy logits rows the screened head decided", "counter", wid,
            LOAD(m->screen_rows));
    counter(&o, "head_screen_candidates_total", "vocabulary rows those rows computed exactly (candidates)", "counter",
            wid, LOAD(m->screen_candidates));
    counter(&o, "head_screen_fallbacks_total", "greedy rows the screen could not decide (computed whole)", "counter",
            wid, LOAD(m->screen_fallbacks));
    counter(&o, "head_screen_refined_total", "screened rows that took the second pass (split int8 codes)", "counter",
            wid, LOAD(m->screen_refined));
    counter(&o, "head_screen_bytes", "bytes of the screened head's int8 copy (0: none made)", "gauge", wid,
            LOAD(m->screen_bytes));
    vllm_set(&o, m, wid);
    expert_load(&o, m, wid);
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
        size_t cap = moeq_worker_metrics_render_size(h->m);
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
