/*
 * offsets.c — per-partition in-flight offsets as a sorted ring buffer.
 *
 * Offsets of one partition are tracked in increasing order, so the ring is
 * sorted: done() finds its entry by binary search and marks it, then the
 * done entries at the front are popped, advancing the low-water mark. The
 * ring grows by doubling (bounded in practice by the coordinator's
 * back-pressure on in-flight jobs). Partitions are few (those assigned to
 * this member), so they live in a small array with a one-entry lookup cache.
 */
#include "offsets.h"

#include <stdlib.h>
#include <string.h>

typedef struct inflight {
    int64_t offset;
    int done;
} inflight;

typedef struct partition {
    char topic[MOEQ_OFFSETS_TOPIC_MAX];
    int32_t partition;
    inflight *ring;
    size_t cap, head, count; /* cap is a power of two */
    int64_t last_tracked;    /* -1 before the first track */
    int64_t reported;        /* last committable returned by collect; -1 none */
} partition;

struct moeq_offsets {
    partition **v;
    size_t n, cap;
    size_t in_flight;
    size_t cache; /* index of the last partition looked up */
};

moeq_offsets *moeq_offsets_new(void) { return calloc(1, sizeof(moeq_offsets)); }

void moeq_offsets_destroy(moeq_offsets *o) {
    if (!o) return;
    for (size_t i = 0; i < o->n; i++) {
        free(o->v[i]->ring);
        free(o->v[i]);
    }
    free(o->v);
    free(o);
}

static long find(const moeq_offsets *o, const char *topic, int32_t part) {
    if (o->cache < o->n && o->v[o->cache]->partition == part && !strcmp(o->v[o->cache]->topic, topic))
        return (long)o->cache;
    for (size_t i = 0; i < o->n; i++)
        if (o->v[i]->partition == part && !strcmp(o->v[i]->topic, topic)) return (long)i;
    return -1;
}

static partition *lookup(moeq_offsets *o, const char *topic, int32_t part) {
    long i = find(o, topic, part);
    if (i < 0) return NULL;
    o->cache = (size_t)i;
    return o->v[i];
}

static partition *get_or_add(moeq_offsets *o, const char *topic, int32_t part) {
    partition *p = lookup(o, topic, part);
    if (p) return p;
    if (strlen(topic) >= MOEQ_OFFSETS_TOPIC_MAX) return NULL;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 8;
        partition **v = realloc(o->v, cap * sizeof(*v));
        if (!v) return NULL;
        o->v = v;
        o->cap = cap;
    }
    p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    strcpy(p->topic, topic);
    p->partition = part;
    p->last_tracked = -1;
    p->reported = -1;
    o->v[o->n] = p;
    o->cache = o->n++;
    return p;
}

static inflight *at(const partition *p, size_t k) { return &p->ring[(p->head + k) & (p->cap - 1)]; }

static int grow(partition *p) {
    size_t cap = p->cap ? p->cap * 2 : 64;
    inflight *ring = malloc(cap * sizeof(*ring));
    if (!ring) return 0;
    for (size_t k = 0; k < p->count; k++) ring[k] = *at(p, k);
    free(p->ring);
    p->ring = ring;
    p->cap = cap;
    p->head = 0;
    return 1;
}

moeq_err moeq_offsets_track(moeq_offsets *o, const char *topic, int32_t part, int64_t offset) {
    if (!o || !topic || offset < 0 || strlen(topic) >= MOEQ_OFFSETS_TOPIC_MAX) return MOEQ_ERR_INVALID_ARG;
    partition *p = get_or_add(o, topic, part);
    if (!p) return MOEQ_ERR_NOMEM;
    if (offset <= p->last_tracked) return MOEQ_ERR_INVALID_ARG;
    if (p->count == p->cap && !grow(p)) return MOEQ_ERR_NOMEM;
    inflight *e = at(p, p->count++);
    e->offset = offset;
    e->done = 0;
    p->last_tracked = offset;
    o->in_flight++;
    return MOEQ_OK;
}

moeq_err moeq_offsets_done(moeq_offsets *o, const char *topic, int32_t part, int64_t offset) {
    if (!o || !topic) return MOEQ_ERR_INVALID_ARG;
    partition *p = lookup(o, topic, part);
    if (!p) return MOEQ_ERR_NOT_FOUND;
    size_t lo = 0, hi = p->count; /* first entry with offset >= target */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (at(p, mid)->offset < offset) lo = mid + 1;
        else hi = mid;
    }
    if (lo == p->count || at(p, lo)->offset != offset || at(p, lo)->done) return MOEQ_ERR_NOT_FOUND;
    at(p, lo)->done = 1;
    o->in_flight--;
    while (p->count && at(p, 0)->done) {
        p->head = (p->head + 1) & (p->cap - 1);
        p->count--;
    }
    return MOEQ_OK;
}

static int64_t committable(const partition *p) {
    if (p->last_tracked < 0) return -1;
    return p->count ? at(p, 0)->offset : p->last_tracked + 1;
}

int64_t moeq_offsets_committable(const moeq_offsets *o, const char *topic, int32_t part) {
    long i = o && topic ? find(o, topic, part) : -1;
    return i < 0 ? -1 : committable(o->v[i]);
}

size_t moeq_offsets_in_flight(const moeq_offsets *o) { return o ? o->in_flight : 0; }

size_t moeq_offsets_partition_in_flight(const moeq_offsets *o, const char *topic, int32_t part) {
    if (!o || !topic) return 0;
    long i = find(o, topic, part);
    if (i < 0) return 0;
    size_t pending = 0;
    for (size_t k = 0; k < o->v[i]->count; k++) pending += !at(o->v[i], k)->done;
    return pending;
}

size_t moeq_offsets_collect(moeq_offsets *o, moeq_offset_commit *out, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; o && i < o->n && n < cap; i++) {
        partition *p = o->v[i];
        int64_t c = committable(p);
        if (c < 0 || c == p->reported) continue;
        out[n].topic = p->topic;
        out[n].partition = p->partition;
        out[n].offset = c;
        p->reported = c;
        n++;
    }
    return n;
}

void moeq_offsets_uncollect(moeq_offsets *o, const char *topic, int32_t part) {
    partition *p = o && topic ? lookup(o, topic, part) : NULL;
    if (p) p->reported = -1;
}

void moeq_offsets_drop(moeq_offsets *o, const char *topic, int32_t part) {
    long i = o && topic ? find(o, topic, part) : -1;
    if (i < 0) return;
    partition *p = o->v[i];
    for (size_t k = 0; k < p->count; k++) o->in_flight -= !at(p, k)->done;
    free(p->ring);
    free(p);
    o->v[i] = o->v[--o->n];
    o->cache = 0;
}
