/* health.c — liveness from the loop's ticks, readiness from cached probes. No I/O of its own. */
#include "moeq/health.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PROBES 8

typedef struct probe {
    char name[32];
    moeq_health_probe_fn fn;
    void *opaque;
} probe;

struct moeq_health {
    int64_t cache_ms, stall_ms;
    atomic_llong last_tick_ms; /* 0 = not yet ticked (starting) */
    pthread_mutex_t lock;      /* probes run one round at a time; guards the cache */
    probe probes[MAX_PROBES];
    int n_probes;
    int64_t checked_ms;        /* when the cached round ran; 0 = never */
    int ready;
    char why[512];
};

moeq_err moeq_health_new(int64_t cache_ms, int64_t stall_ms, moeq_health **out) {
    moeq_health *h = calloc(1, sizeof *h);
    if (!h) return MOEQ_ERR_NOMEM;
    h->cache_ms = cache_ms;
    h->stall_ms = stall_ms;
    pthread_mutex_init(&h->lock, NULL);
    *out = h;
    return MOEQ_OK;
}

void moeq_health_destroy(moeq_health *h) {
    if (!h) return;
    pthread_mutex_destroy(&h->lock);
    free(h);
}

moeq_err moeq_health_add_probe(moeq_health *h, const char *name, moeq_health_probe_fn fn, void *opaque) {
    if (h->n_probes == MAX_PROBES) return MOEQ_ERR_LIMIT;
    probe *p = &h->probes[h->n_probes++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->fn = fn;
    p->opaque = opaque;
    return MOEQ_OK;
}

void moeq_health_tick(moeq_health *h, int64_t now_ms) { atomic_store(&h->last_tick_ms, (long long)now_ms); }

int moeq_health_live(moeq_health *h, int64_t now_ms, char *why, size_t n) {
    int64_t last = atomic_load(&h->last_tick_ms);
    if (last == 0 || now_ms - last < h->stall_ms) return 1;
    snprintf(why, n, "loop stalled: no tick for %lld ms (livez_stall_ms %lld)", (long long)(now_ms - last),
             (long long)h->stall_ms);
    return 0;
}

static void run_probes(moeq_health *h, int64_t now_ms) {
    h->ready = 1;
    h->why[0] = 0;
    for (int i = 0; i < h->n_probes && h->ready; i++) {
        char err[400] = "";
        if (h->probes[i].fn(h->probes[i].opaque, err, sizeof err) != MOEQ_OK) {
            h->ready = 0;
            snprintf(h->why, sizeof h->why, "%s: %s", h->probes[i].name, err[0] ? err : "not ready");
        }
    }
    h->checked_ms = now_ms;
}

int moeq_health_ready(moeq_health *h, int64_t now_ms, char *why, size_t n) {
    if (!moeq_health_live(h, now_ms, why, n)) return 0;
    pthread_mutex_lock(&h->lock);
    if (!h->checked_ms || now_ms - h->checked_ms >= h->cache_ms) run_probes(h, now_ms);
    int ready = h->ready;
    if (!ready) snprintf(why, n, "%s", h->why);
    pthread_mutex_unlock(&h->lock);
    return ready;
}

unsigned moeq_health_route(moeq_health *h, const char *url, int64_t now_ms, char *body, size_t n) {
    char why[512] = "";
    int ok;
    if (!strcmp(url, "/livez")) ok = moeq_health_live(h, now_ms, why, sizeof why);
    else if (!strcmp(url, "/readyz") || !strcmp(url, "/healthz")) ok = moeq_health_ready(h, now_ms, why, sizeof why);
    else return 0;
    if (ok) snprintf(body, n, "ok\n");
    else snprintf(body, n, "not ok: %s\n", why);
    return ok ? 200 : 503;
}
