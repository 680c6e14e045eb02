/*
 * ep_placement.c — the expert → rank(s) table, its text form and the three
 * stock layouts (identity, permuted, replicated). Pure data; only _load reads
 * a file.
 */
#include "moeq/ep_placement.h"

#include <stdlib.h>
#include <string.h>

#include "moeq/util.h"

struct moeq_ep_placement {
    int n_experts, n_ranks, n_entries;
    int *rep_off;    /* (E + 1) replicas of expert e: [rep_off[e], rep_off[e+1]) */
    int *rep_rank;   /* (n_entries) rank of each replica                         */
    int *rep_local;  /* (n_entries) its local index on that rank                 */
    int *local_off;  /* (R + 1)                                                  */
    int *local_exp;  /* (n_entries) experts of each rank, ascending              */
};

void moeq_ep_placement_destroy(moeq_ep_placement *pl) {
    if (!pl) return;
    free(pl->rep_off), free(pl->rep_rank), free(pl->rep_local), free(pl->local_off), free(pl->local_exp);
    free(pl);
}

static moeq_ep_placement *alloc_pl(int E, int R, int entries) {
    moeq_ep_placement *pl = calloc(1, sizeof *pl);
    if (!pl) return NULL;
    pl->n_experts = E, pl->n_ranks = R, pl->n_entries = entries;
    pl->rep_off = calloc((size_t)E + 1, sizeof(int)), pl->local_off = calloc((size_t)R + 1, sizeof(int));
    pl->rep_rank = calloc((size_t)entries + 1, sizeof(int)), pl->rep_local = calloc((size_t)entries + 1, sizeof(int));
    pl->local_exp = calloc((size_t)entries + 1, sizeof(int));
    if (!pl->rep_off || !pl->local_off || !pl->rep_rank || !pl->rep_local || !pl->local_exp) {
        moeq_ep_placement_destroy(pl);
        return NULL;
    }
    return pl;
}

static moeq_err check_dims(int E, int R, char *errstr, size_t n) {
    if (E < 1 || E > MOEQ_EP_MAX_EXPERTS || R < 1 || R > MOEQ_EP_MAX_RANKS)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep placement: %d experts on %d ranks (bounds %d, %d)", E,
                         R, MOEQ_EP_MAX_EXPERTS, MOEQ_EP_MAX_RANKS);
    return MOEQ_OK;
}

/* Fill the per-rank lists; scanning experts in ascending order keeps each list sorted. count: (R) zeros. */
static void index_ranks(moeq_ep_placement *pl, int *count) {
    for (int i = 0; i < pl->n_entries; i++) pl->local_off[pl->rep_rank[i] + 1]++;
    for (int r = 0; r < pl->n_ranks; r++) pl->local_off[r + 1] += pl->local_off[r];
    for (int e = 0; e < pl->n_experts; e++)
        for (int i = pl->rep_off[e]; i < pl->rep_off[e + 1]; i++) {
            int r = pl->rep_rank[i], l = count[r]++;
            pl->rep_local[i] = l;
            pl->local_exp[pl->local_off[r] + l] = e;
        }
}

moeq_err moeq_ep_placement_new_table(int E, int R, const int *n_rep, const int *const *ranks_of,
                                     moeq_ep_placement **out, char *errstr, size_t n) {
    *out = NULL;
    moeq_err err = check_dims(E, R, errstr, n);
    if (err) return err;
    int64_t entries = 0;
    for (int e = 0; e < E; e++) {
        if (n_rep[e] < 1 || n_rep[e] > R)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep placement: expert %d has %d replicas (1..%d)", e,
                             n_rep[e], R);
        for (int i = 0; i < n_rep[e]; i++) {
            int r = ranks_of[e][i];
            if (r < 0 || r >= R)
                return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep placement: expert %d on rank %d (of %d)", e, r, R);
            for (int j = 0; j < i; j++)
                if (ranks_of[e][j] == r)
                    return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep placement: expert %d twice on rank %d", e, r);
        }
        entries += n_rep[e];
    }
    moeq_ep_placement *pl = alloc_pl(E, R, (int)entries);
    int *count = calloc((size_t)R, sizeof(int));
    if (!pl || !count) return moeq_ep_placement_destroy(pl), free(count), MOEQ_ERR_NOMEM;
    for (int e = 0, k = 0; e < E; e++) {
        pl->rep_off[e] = k;
        for (int i = 0; i < n_rep[e]; i++) pl->rep_rank[k++] = ranks_of[e][i];
        pl->rep_off[e + 1] = k;
    }
    index_ranks(pl, count);
    free(count);
    *out = pl;
    return MOEQ_OK;
}

moeq_err moeq_ep_placement_clone(const moeq_ep_placement *src, moeq_ep_placement **out) {
    moeq_ep_placement *pl = alloc_pl(src->n_experts, src->n_ranks, src->n_entries);
    if (!pl) return MOEQ_ERR_NOMEM;
    size_t E = (size_t)src->n_experts + 1, R = (size_t)src->n_ranks + 1, N = (size_t)src->n_entries;
    memcpy(pl->rep_off, src->rep_off, E * sizeof(int)), memcpy(pl->local_off, src->local_off, R * sizeof(int));
    memcpy(pl->rep_rank, src->rep_rank, N * sizeof(int)), memcpy(pl->rep_local, src->rep_local, N * sizeof(int));
    memcpy(pl->local_exp, src->local_exp, N * sizeof(int));
    *out = pl;
    return MOEQ_OK;
}

/* The stock layouts: `home[e]` plus an optional second replica per expert. */
static moeq_err from_homes(int E, int R, const int *home, const int *extra, moeq_ep_placement **out, char *errstr,
                           size_t n) {
    int *n_rep = malloc((size_t)E * sizeof(int)), *pairs = malloc((size_t)E * 2 * sizeof(int));
    const int **ranks_of = malloc((size_t)E * sizeof(int *));
    moeq_err err = MOEQ_ERR_NOMEM;
    if (n_rep && pairs && ranks_of) {
        for (int e = 0; e < E; e++) {
            pairs[2 * e] = home[e], pairs[2 * e + 1] = extra ? extra[e] : -1;
            n_rep[e] = pairs[2 * e + 1] >= 0 ? 2 : 1;
            ranks_of[e] = pairs + 2 * e;
        }
        err = moeq_ep_placement_new_table(E, R, n_rep, ranks_of, out, errstr, n);
    }
    free(n_rep), free(pairs), free((void *)ranks_of);
    return err;
}

static int block_of(int e, int E, int R) { return (int)((int64_t)e * R / E); }

moeq_err moeq_ep_placement_new_identity(int E, int R, moeq_ep_placement **out, char *errstr, size_t n) {
    return moeq_ep_placement_new_permuted(E, R, 0, out, errstr, n);
}

/* seed 0 is the identity; otherwise a Fisher-Yates shuffle with splitmix64. */
moeq_err moeq_ep_placement_new_permuted(int E, int R, uint64_t seed, moeq_ep_placement **out, char *errstr,
                                        size_t n) {
    *out = NULL;
    moeq_err err = check_dims(E, R, errstr, n);
    if (err) return err;
    int *perm = malloc((size_t)E * sizeof(int)), *home = malloc((size_t)E * sizeof(int));
    if (!perm || !home) return free(perm), free(home), MOEQ_ERR_NOMEM;
    for (int e = 0; e < E; e++) perm[e] = e;
    uint64_t x = seed;
    for (int i = E - 1; seed && i > 0; i--) {
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull, z = (z ^ (z >> 27)) * 0x94d049bb133111ebull, z ^= z >> 31;
        int j = (int)(z % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < E; i++) home[perm[i]] = block_of(i, E, R);
    err = from_homes(E, R, home, NULL, out, errstr, n);
    free(perm), free(home);
    return err;
}

moeq_err moeq_ep_placement_new_replicated(int E, int R, int n_replicated, moeq_ep_placement **out, char *errstr,
                                          size_t n) {
    *out = NULL;
    moeq_err err = check_dims(E, R, errstr, n);
    if (err) return err;
    if (R < 2 || n_replicated < 0 || n_replicated > E)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep placement: %d replicated experts of %d on %d ranks",
                         n_replicated, E, R);
    int *home = malloc((size_t)E * sizeof(int)), *extra = malloc((size_t)E * sizeof(int));
    if (!home || !extra) return free(home), free(extra), MOEQ_ERR_NOMEM;
    for (int e = 0; e < E; e++) {
        home[e] = block_of(e, E, R);
        extra[e] = e < n_replicated ? (home[e] + 1) % R : -1;
    }
    err = from_homes(E, R, home, extra, out, errstr, n);
    free(home), free(extra);
    return err;
}

int moeq_ep_placement_n_experts(const moeq_ep_placement *pl) { return pl->n_experts; }
int moeq_ep_placement_n_ranks(const moeq_ep_placement *pl) { return pl->n_ranks; }
int moeq_ep_placement_n_replicas(const moeq_ep_placement *pl, int e) { return pl->rep_off[e + 1] - pl->rep_off[e]; }
int moeq_ep_placement_replica(const moeq_ep_placement *pl, int e, int i) { return pl->rep_rank[pl->rep_off[e] + i]; }
int moeq_ep_placement_n_local(const moeq_ep_placement *pl, int r) { return pl->local_off[r + 1] - pl->local_off[r]; }
int moeq_ep_placement_local_expert(const moeq_ep_placement *pl, int r, int l) { return pl->local_exp[pl->local_off[r] + l]; }

int moeq_ep_placement_local_index(const moeq_ep_placement *pl, int rank, int e) {
    for (int i = pl->rep_off[e]; i < pl->rep_off[e + 1]; i++)
        if (pl->rep_rank[i] == rank) return pl->rep_local[i];
    return -1;
}

int moeq_ep_placement_pick(const moeq_ep_placement *pl, int e, int src_rank, int64_t t, int k) {
    int nrep = moeq_ep_placement_n_replicas(pl, e);
    return moeq_ep_placement_replica(pl, e, (int)(((uint64_t)t + (uint64_t)k + (uint64_t)src_rank) % (uint64_t)nrep));
}
