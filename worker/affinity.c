/*
 * affinity.c — prefix-key affinity between workers (see affinity.h): the
 * own recent keys (a small most-recent-first list) and the peers' advertised
 * keys, parsed from their heartbeat JSON by a scan for two known fields (the
 * heartbeat is ours: flat, no escapes in ids or keys).
 */
#include "affinity.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEER_ID 128
#define PEER_KEYS 32

typedef struct peer {
    char id[PEER_ID];
    uint64_t keys[PEER_KEYS];
    int n_keys;
    long long room;   /* free_slots - pending at its heartbeat, less what we handed it since */
} peer;

struct moeq_affinity {
    uint64_t *own;    /* [max_keys] most recent first */
    int64_t *own_ms;
    int32_t *own_tok; /* [max_keys][MOEQ_AFFINITY_PREFIX_TOKENS] the prefix each key covers */
    int *own_n;
    int n_own, max_keys;
    peer *peers;      /* [max_peers] */
    int n_peers, max_peers;
};

moeq_err moeq_affinity_new(int max_keys, int max_peers, moeq_affinity **out) {
    *out = NULL;
    if (max_keys < 1 || max_peers < 1) return MOEQ_ERR_INVALID_ARG;
    moeq_affinity *a = calloc(1, sizeof *a);
    if (!a) return MOEQ_ERR_NOMEM;
    a->own = calloc((size_t)max_keys, sizeof *a->own);
    a->own_ms = calloc((size_t)max_keys, sizeof *a->own_ms);
    a->own_tok = calloc((size_t)max_keys * MOEQ_AFFINITY_PREFIX_TOKENS, sizeof *a->own_tok);
    a->own_n = calloc((size_t)max_keys, sizeof *a->own_n);
    a->peers = calloc((size_t)max_peers, sizeof *a->peers);
    if (!a->own || !a->own_ms || !a->own_tok || !a->own_n || !a->peers) {
        moeq_affinity_destroy(a);
        return MOEQ_ERR_NOMEM;
    }
    a->max_keys = max_keys;
    a->max_peers = max_peers;
    *out = a;
    return MOEQ_OK;
}

void moeq_affinity_destroy(moeq_affinity *a) {
    if (!a) return;
    free(a->own);
    free(a->own_ms);
    free(a->own_tok);
    free(a->own_n);
    free(a->peers);
    free(a);
}

static int32_t *tok_of(const moeq_affinity *a, int i) { return a->own_tok + (size_t)i * MOEQ_AFFINITY_PREFIX_TOKENS; }

/* Move own entry i to the front (entries 0 .. i - 1 one place back). */
static void to_front(moeq_affinity *a, int i) {
    uint64_t key = a->own[i];
    int64_t ms = a->own_ms[i];
    int n = a->own_n[i];
    int32_t tok[MOEQ_AFFINITY_PREFIX_TOKENS];
    memcpy(tok, tok_of(a, i), sizeof tok);
    memmove(a->own + 1, a->own, (size_t)i * sizeof *a->own);
    memmove(a->own_ms + 1, a->own_ms, (size_t)i * sizeof *a->own_ms);
    memmove(a->own_n + 1, a->own_n, (size_t)i * sizeof *a->own_n);
    memmove(tok_of(a, 1), tok_of(a, 0), (size_t)i * MOEQ_AFFINITY_PREFIX_TOKENS * sizeof *a->own_tok);
    a->own[0] = key, a->own_ms[0] = ms, a->own_n[0] = n;
    memcpy(tok_of(a, 0), tok, sizeof tok);
}

void moeq_affinity_note(moeq_affinity *a, uint64_t key, const int32_t *prefix, int n_prefix, int64_t now_ms) {
    if (!key) return;
    int i = 0;
    while (i < a->n_own && a->own[i] != key) i++;
    if (i == a->n_own && a->n_own < a->max_keys) a->n_own++;
    if (i == a->max_keys) i = a->max_keys - 1; /* full: the oldest goes */
    a->own[i] = key;
    a->own_ms[i] = now_ms;
    a->own_n[i] = prefix ? (n_prefix < MOEQ_AFFINITY_PREFIX_TOKENS ? n_prefix : MOEQ_AFFINITY_PREFIX_TOKENS) : 0;
    if (a->own_n[i] > 0) memcpy(tok_of(a, i), prefix, (size_t)a->own_n[i] * sizeof *prefix);
    to_front(a, i);
}

/* Forget own keys whose prefix the cache no longer holds (order kept). */
static void forget_evicted(moeq_affinity *a, moeq_affinity_cached_fn cached, void *ctx) {
    int kept = 0;
    for (int i = 0; i < a->n_own; i++) {
        if (a->own_n[i] > 0 && !cached(ctx, tok_of(a, i), a->own_n[i])) continue;
        if (kept != i) {
            a->own[kept] = a->own[i], a->own_ms[kept] = a->own_ms[i], a->own_n[kept] = a->own_n[i];
            memcpy(tok_of(a, kept), tok_of(a, i), MOEQ_AFFINITY_PREFIX_TOKENS * sizeof *a->own_tok);
        }
        kept++;
    }
    a->n_own = kept;
}

int moeq_affinity_holds(const moeq_affinity *a, uint64_t key) {
    for (int i = 0; key && i < a->n_own; i++)
        if (a->own[i] == key) return 1;
    return 0;
}

size_t moeq_affinity_hint_json(moeq_affinity *a, moeq_affinity_cached_fn cached, void *ctx, char *buf, size_t size) {
    if (cached) forget_evicted(a, cached, ctx);
    size_t n = 0;
    if (size < 3) return 0;
    buf[n++] = '[';
    for (int i = 0; i < a->n_own && n + 22 < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s\"%016" PRIx64 "\"", i ? "," : "", a->own[i]);
    buf[n++] = ']';
    buf[n] = 0;
    return n;
}

void moeq_affinity_peers_clear(moeq_affinity *a) { a->n_peers = 0; }

/* The string value of "field" in json (flat, unescaped), copied into out; 0 when absent. */
static int json_str(const char *json, const char *field, char *out, size_t size) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", field);
    const char *p = strstr(json, pat), *e;
    if (!p || !(e = strchr(p += strlen(pat), '"')) || (size_t)(e - p) >= size) return 0;
    memcpy(out, p, (size_t)(e - p));
    out[e - p] = 0;
    return 1;
}

/* The integer value of "field" in json, 0 when absent. */
static long long json_int(const char *json, const char *field) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", field);
    const char *p = strstr(json, pat);
    return p ? strtoll(p + strlen(pat), NULL, 10) : 0;
}

int moeq_affinity_peer_json(moeq_affinity *a, const char *own_id, const char *json, size_t len) {
    if (a->n_peers >= a->max_peers || !json || len == 0 || json[len] != 0) return 0;
    peer *p = &a->peers[a->n_peers];
    if (!json_str(json, "id", p->id, sizeof p->id) || (own_id && !strcmp(p->id, own_id))) return 0;
    p->n_keys = 0;
    /* "room": jobs it would take now (slots free less jobs waiting, 0 at max_batches_held); older workers
     * sent only free_slots and pending */
    p->room = strstr(json, "\"room\":") ? json_int(json, "room") : json_int(json, "free_slots") - json_int(json, "pending");
    const char *k = strstr(json, "\"prefix_keys\":[");
    for (k = k ? k + 15 : NULL; k && *k == '"' && p->n_keys < PEER_KEYS;) {
        char *end;
        uint64_t key = strtoull(k + 1, &end, 16);
        if (*end != '"') break;
        if (key) p->keys[p->n_keys++] = key;
        k = end + 1;
        if (*k == ',') k++;
    }
    a->n_peers++;
    return 1;
}

const char *moeq_affinity_route(const moeq_affinity *a, uint64_t key, int n_jobs, int handed_or_reclaimed,
                                int held_here) {
    if (!key || handed_or_reclaimed || held_here) return NULL;
    for (int i = 0; i < a->n_peers; i++)
        for (int j = 0; j < a->peers[i].n_keys; j++)
            if (a->peers[i].keys[j] == key && a->peers[i].room >= n_jobs) return a->peers[i].id;
    return NULL;
}

void moeq_affinity_handed(moeq_affinity *a, const char *id, int n_jobs) {
    for (int i = 0; i < a->n_peers; i++)
        if (!strcmp(a->peers[i].id, id)) a->peers[i].room -= n_jobs;
}
