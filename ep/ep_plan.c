/*
 * ep_plan.c — EPLB's greedy planner: replicas first (each extra replica goes to
 * the expert with the largest load per replica), then balanced packing (the
 * heaviest replica first, onto the least-loaded rank that still has room and
 * does not hold that expert yet).
 */
#include "moeq/ep_plan.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/util.h"

typedef struct item {
    double load;
    int expert;
} item;

static int heavier_first(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->load != y->load) return x->load > y->load ? -1 : 1;
    return (x->expert > y->expert) - (x->expert < y->expert);
}

static void replicate(const int64_t *counts, int E, int R, int extra, int *n_rep) {
    for (int e = 0; e < E; e++) n_rep[e] = 1;
    for (int i = 0; i < extra; i++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (n_rep[e] < R && (best < 0 || (double)counts[e] / n_rep[e] > (double)counts[best] / n_rep[best]))
                best = e;
        if (best < 0) return; /* every expert already on every rank */
        n_rep[best]++;
    }
}

/* The least-loaded rank with room that lacks expert e (room ignored when none has it). */
static int pick_rank(const double *load, const int *held, int R, int cap, const unsigned char *has, int e) {
    for (int pass = 0; pass < 2; pass++) {
        int best = -1;
        for (int r = 0; r < R; r++)
            if (!has[(size_t)e * R + r] && (pass || held[r] < cap) && (best < 0 || load[r] < load[best])) best = r;
        if (best >= 0) return best;
    }
    return -1;
}

static moeq_err pack(const int64_t *counts, int E, int R, const int *n_rep, moeq_ep_placement **out, char *errstr,
                     size_t n) {
    int P = 0;
    for (int e = 0; e < E; e++) P += n_rep[e];
    item *items = malloc((size_t)P * sizeof *items);
    double *load = calloc((size_t)R, sizeof(double));
    int *held = calloc((size_t)R, sizeof(int)), *ranks = malloc((size_t)P * sizeof(int)), *fill = calloc((size_t)E, sizeof(int));
    unsigned char *has = calloc((size_t)E * R, 1);
    const int **ranks_of = malloc((size_t)E * sizeof(int *));
    moeq_err err = MOEQ_ERR_NOMEM;
    if (!items || !load || !held || !ranks || !fill || !has || !ranks_of) goto done;
    for (int e = 0, k = 0, base = 0; e < E; base += n_rep[e], e++) {
        ranks_of[e] = ranks + base;
        for (int i = 0; i < n_rep[e]; i++) items[k++] = (item){(double)counts[e] / n_rep[e], e};
    }
    qsort(items, (size_t)P, sizeof *items, heavier_first);
    int cap = (P + R - 1) / R;
    for (int i = 0; i < P; i++) {
        int e = items[i].expert, r = pick_rank(load, held, R, cap, has, e);
        load[r] += items[i].load, held[r]++, has[(size_t)e * R + r] = 1;
        ((int *)ranks_of[e])[fill[e]++] = r;
    }
    err = moeq_ep_placement_new_table(E, R, n_rep, ranks_of, out, errstr, n);
done:
    free(items), free(load), free(held), free(ranks), free(fill), free(has), free((void *)ranks_of);
    return err;
}

moeq_err moeq_ep_plan(const int64_t *counts, int E, int R, int extra, moeq_ep_placement **out, char *errstr,
                      size_t n) {
    *out = NULL;
    if (E < 1 || E > MOEQ_EP_MAX_EXPERTS || R < 1 || R > MOEQ_EP_MAX_RANKS || extra < 0 || extra > 4096)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep plan: %d experts, %d ranks, %d replicas (at most 4096)", E, R, extra);
    for (int e = 0; e < E; e++)
        if (counts[e] < 0) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep plan: expert %d count %lld < 0", e,
                                            (long long)counts[e]);
    int *n_rep = malloc((size_t)E * sizeof(int));
    if (!n_rep) return MOEQ_ERR_NOMEM;
    /*
     * Greedy packing is a heuristic: one more replica can pack slightly worse. Every count of extra
     * replicas up to the budget is planned and the lowest predicted max load kept (fewer on a tie),
     * so a larger budget never predicts worse.
     */
    moeq_err err = MOEQ_OK;
    double best_max = 0;
    for (int r = 0; r <= extra && !err; r++) {
        moeq_ep_placement *pl = NULL;
        replicate(counts, E, R, r, n_rep);
        if ((err = pack(counts, E, R, n_rep, &pl, errstr, n))) break;
        double max;
        moeq_ep_plan_predict(pl, counts, NULL, &max, NULL);
        if (!*out || max < best_max) moeq_ep_placement_destroy(*out), *out = pl, best_max = max;
        else moeq_ep_placement_destroy(pl);
    }
    free(n_rep);
    if (err) moeq_ep_placement_destroy(*out), *out = NULL;
    return err;
}

void moeq_ep_plan_predict(const moeq_ep_placement *pl, const int64_t *counts, double *rank_load, double *max_load,
                          double *mean_load) {
    int R = moeq_ep_placement_n_ranks(pl);
    double max = 0, sum = 0;
    for (int r = 0; r < R; r++) {
        double l = 0;
        for (int i = 0; i < moeq_ep_placement_n_local(pl, r); i++) {
            int e = moeq_ep_placement_local_expert(pl, r, i);
            l += (double)counts[e] / moeq_ep_placement_n_replicas(pl, e);
        }
        if (rank_load) rank_load[r] = l;
        max = l > max ? l : max, sum += l;
    }
    if (max_load) *max_load = max;
    if (mean_load) *mean_load = sum / R;
}

moeq_err moeq_ep_stats_parse(const char *text, size_t len, int64_t **counts, int *n_experts, char *errstr, size_t n) {
    size_t cap = 64, E = 0;
    int64_t *c = malloc(cap * sizeof *c);
    const char *p = text, *end = text + len;
    int line = 1;
    while (c && p < end) {
        if (*p == '#') { while (p < end && *p != '\n') p++; continue; }
        if (*p == '\n') line++;
        if (isspace((unsigned char)*p) || *p == ',') { p++; continue; }
        char *stop;
        errno = 0;
        long long v = strtoll(p, &stop, 10);
        if (stop == p || errno || v < 0 || (stop < end && !isspace((unsigned char)*stop) && *stop != ',' && *stop != '#')) {
            free(c);
            return moeq_errf(MOEQ_ERR_PARSE, errstr, n, "ep stats line %d: expected a count >= 0", line);
        }
        if (E == cap) {
            int64_t *bigger = realloc(c, (cap *= 2) * sizeof *c);
            if (!bigger) free(c);
            c = bigger;
            if (!c) break;
        }
        c[E++] = v, p = stop;
    }
    if (!c) return MOEQ_ERR_NOMEM;
    if (E < 1 || E > MOEQ_EP_MAX_EXPERTS) {
        free(c);
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "ep stats: %zu counts (1..%d experts)", E, MOEQ_EP_MAX_EXPERTS);
    }
    *counts = c, *n_experts = (int)E;
    return MOEQ_OK;
}

moeq_err moeq_ep_stats_load(const char *path, int64_t **counts, int *n_experts, char *errstr, size_t n) {
    char *text = NULL;
    size_t len = 0;
    moeq_err err = moeq_read_file(path, 64u << 20, &text, &len, errstr, n);
    if (err) return err;
    err = moeq_ep_stats_parse(text, len, counts, n_experts, errstr, n);
    free(text);
    return err;
}

moeq_err moeq_ep_stats_print(const uint64_t *counts, int n_layers, int n_experts, const char *note, FILE *out,
                             char *errstr, size_t n) {
    if (!counts || !out || n_layers < 1 || n_experts < 1 || n_experts > MOEQ_EP_MAX_EXPERTS)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep stats: %d layers of %d experts", n_layers, n_experts);
    fprintf(out, "# moeq expert stats: routed slots per expert; the last line sums the layers (what moeq ep-plan reads)\n");
    if (note && *note) fprintf(out, "# %s\n", note);
    for (int l = 0; l < n_layers; l++) {
        const uint64_t *row = counts + (size_t)l * (size_t)n_experts;
        uint64_t any = 0;
        for (int x = 0; x < n_experts; x++) any |= row[x];
        if (!any) continue;
        fprintf(out, "# layer %d:", l);
        for (int x = 0; x < n_experts; x++) fprintf(out, " %llu", (unsigned long long)row[x]);
        fprintf(out, "\n");
    }
    for (int x = 0; x < n_experts; x++) {
        uint64_t sum = 0;
        for (int l = 0; l < n_layers; l++) sum += counts[(size_t)l * (size_t)n_experts + (size_t)x];
        fprintf(out, "%s%llu", x ? " " : "", (unsigned long long)(sum > (uint64_t)INT64_MAX ? (uint64_t)INT64_MAX : sum));
    }
    fprintf(out, "\n");
    return ferror(out) ? moeq_errf(MOEQ_ERR_IO, errstr, n, "ep stats: write failed") : MOEQ_OK;
}

moeq_err moeq_ep_stats_load_sum(const char *const *paths, int n_paths, int64_t **counts, int *n_experts, char *errstr,
                                size_t n) {
    int64_t *sum = NULL;
    int E = 0;
    for (int i = 0; i < n_paths; i++) {
        int64_t *c = NULL;
        int e = 0;
        moeq_err err = moeq_ep_stats_load(paths[i], &c, &e, errstr, n);
        if (!err && sum && e != E)
            err = moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "ep stats: %s has %d experts, %s has %d", paths[i], e,
                            paths[0], E);
        if (err) {
            free(c), free(sum);
            return err;
        }
        if (!sum) sum = c, E = e;
        else {
            for (int x = 0; x < E; x++) sum[x] = sum[x] > INT64_MAX - c[x] ? INT64_MAX : sum[x] + c[x];
            free(c);
        }
    }
    if (!sum) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep stats: no file");
    *counts = sum, *n_experts = E;
    return MOEQ_OK;
}
