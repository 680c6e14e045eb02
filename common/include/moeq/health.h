/*
 * moeq/health.h — what /livez and /readyz answer, for every process.
 *
 * Live: the process loop ticks (moeq_health_tick) at least every stall_ms.
 * Ready: every probe (the broker answers a metadata request, Redis answers
 * PING, the model is loaded, ...) passed. Probes run on the HTTP thread
 * when asked, at most once per cache_ms (a scrape storm must not become a
 * broker storm); each probe must bound its own time (about a second).
 * /healthz is ready. The HTTP servers (coordinator.c, worker/worker_metrics.c) only
 * call these.
 *
 * Thread-safe: tick from the loop, live/ready from any thread.
 */
#ifndef MOEQ_HEALTH_H
#define MOEQ_HEALTH_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MOEQ_OK when the dependency answers; otherwise errstr says why. */
typedef moeq_err (*moeq_health_probe_fn)(void *opaque, char *errstr, size_t errstr_size);

typedef struct moeq_health moeq_health;

/* cache_ms: how long a probe round is reused; stall_ms: /livez limit. */
moeq_err moeq_health_new(int64_t cache_ms, int64_t stall_ms, moeq_health **out);
void moeq_health_destroy(moeq_health *health); /* NULL is safe */

/* Add a named probe (at most 8; opaque borrowed). Call before serving. */
moeq_err moeq_health_add_probe(moeq_health *health, const char *name, moeq_health_probe_fn fn, void *opaque);

/* The loop ran at now_ms. Before the first tick the process counts as live (starting). */
void moeq_health_tick(moeq_health *health, int64_t now_ms);

/* 1 when live; else 0 and why (the stall) in why. */
int moeq_health_live(moeq_health *health, int64_t now_ms, char *why, size_t why_size);

/* 1 when live and every probe passed (cached cache_ms); else 0 and why names the probe and its error. */
int moeq_health_ready(moeq_health *health, int64_t now_ms, char *why, size_t why_size);

/*
 * Answer a health route: url /livez, /readyz or /healthz (= ready). Returns
 * the HTTP status (200, 503) with "ok\n" or the reason in body, or 0 when
 * url is not a health route.
 */
unsigned moeq_health_route(moeq_health *health, const char *url, int64_t now_ms, char *body, size_t body_size);

#ifdef __cplusplus
}
#endif
#endif
