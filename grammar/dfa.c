/*
 * dfa.c — the lazy DFA over an NFA, each state's distance to completion,
 * and token masks from a walk of the vocabulary's byte trie.
 *
 * A DFA state is the set of NFA states reached, reduced to those that
 * matter: states with a byte edge, plus the final state; states from which
 * the final state cannot be reached are dropped, so an empty set is "dead"
 * and every non-dead state can still be completed. Transitions are computed
 * on first use and kept in a [state][256] table.
 *
 * A state's mask is the set of tokens whose bytes all walk to a non-dead
 * state. Computing it walks the trie of token byte strings depth first and
 * skips a subtree as soon as the DFA dies, so a state that allows little
 * costs little; it is then cached (mask_words words) for the grammar's life.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

#define UNKNOWN (-1)
#define DEAD (-3)
#define INF INT32_MAX

struct dfa {
    nfa n;
    int32_t accept;
    int32_t *dist;        /* [NFA states] fewest bytes to the final state; INF   */
    int max_dist;         /* over NFA states that can finish                      */
    int n_ids, words, max_states;
    int n_states, cap;
    int32_t *set_off, *set_len, *pool;
    size_t pool_len, pool_cap;
    int32_t *trans;       /* [cap][256]                                            */
    int32_t *sdist;       /* [cap] min dist over the set                           */
    int8_t *done;         /* [cap] -1 unknown                                      */
    uint32_t **masks;     /* [cap] NULL until computed                             */
    int64_t *mask_count;  /* [cap]                                                 */
    struct dist_lists **lists; /* [cap] with the mask: tokens that change the distance (NULL: too many) */
    int32_t *mask_far;    /* [cap] the farthest end state (bytes to completion) of an
                             allowed token: budgets above it need no walk of their own */
    int n_masks;
    int32_t *ht;          /* open addressing over state ids, -1 empty              */
    size_t ht_mask;
    uint8_t *mask_shared; /* [cap] 1: masks/lists are another state's (alike positions) */
    int n_shared;
    struct alias_entry *akeys; /* open addressing: alias keys of states with a mask */
    size_t ak_cap, ak_n;
    int32_t *run_pos;     /* [n_runs] scratch: the position a set's members of the run are at, -1 none, -2 two */
    uint32_t *mark, gen;  /* [NFA states] closure scratch                          */
    int32_t *stack, *set; /* [NFA states]                                          */
    int start;
};

/* ---- distances: 0-1 BFS on the reversed NFA -------------------------------------------- */

static int distances(dfa *d) {
    nfa *n = &d->n;
    int N = n->n_states;
    int32_t *rhead = malloc((size_t)N * sizeof *rhead), *rnext = malloc((size_t)(n->n_edges + 1) * sizeof *rnext);
    int32_t *rfrom = malloc((size_t)(n->n_edges + 1) * sizeof *rfrom), *dq = malloc((size_t)(2 * N + 4) * sizeof *dq);
    d->dist = malloc((size_t)N * sizeof *d->dist);
    if (!rhead || !rnext || !rfrom || !dq || !d->dist) {
        free(rhead), free(rnext), free(rfrom), free(dq);
        return -1;
    }
    for (int i = 0; i < N; i++) rhead[i] = -1, d->dist[i] = INF;
    for (int s = 0; s < N; s++)
        for (int32_t e = n->head[s]; e >= 0; e = n->edges[e].next) {
            int32_t t = n->edges[e].to;
            rfrom[e] = s, rnext[e] = rhead[t], rhead[t] = e;
        }
    /* 0-1 BFS: a circular deque; a state is relaxed at most twice (to D + 1, then D), so 2N + 4 slots do */
    size_t Q = (size_t)(2 * N + 4), lo = 0, count = 0;
    d->dist[d->accept] = 0;
    dq[0] = d->accept, count = 1;
    while (count > 0) {
        int32_t v = dq[lo];
        lo = (lo + 1) % Q, count--;
        for (int32_t e = rhead[v]; e >= 0; e = rnext[e]) {
            int32_t u = rfrom[e], w = n->edges[e].is_eps ? 0 : 1;
            if (d->dist[v] + w >= d->dist[u] || count == Q) continue;
            d->dist[u] = d->dist[v] + w;
            if (w == 0) lo = (lo + Q - 1) % Q, dq[lo] = u;
            else dq[(lo + count) % Q] = u;
            count++;
        }
    }
    d->max_dist = 0;
    for (int i = 0; i < N; i++)
        if (d->dist[i] != INF && d->dist[i] > d->max_dist) d->max_dist = d->dist[i];
    free(rhead), free(rnext), free(rfrom), free(dq);
    return 0;
}

/* ---- state sets -------------------------------------------------------------------------- */

static uint64_t hash_set(const int32_t *s, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 1099511628211ull;
    return h ^ (uint64_t)n;
}

static int same_set(const dfa *d, int32_t id, const int32_t *s, int n) {
    return d->set_len[id] == n && !memcmp(d->pool + d->set_off[id], s, (size_t)n * sizeof *s);
}

static int grow_states(dfa *d) {
    int cap = d->cap ? d->cap * 2 : 64;
    int32_t *off = realloc(d->set_off, (size_t)cap * sizeof *off);
    if (off) d->set_off = off;
    int32_t *len = realloc(d->set_len, (size_t)cap * sizeof *len);
    if (len) d->set_len = len;
    int32_t *tr = realloc(d->trans, (size_t)cap * 256 * sizeof *tr);
    if (tr) d->trans = tr;
    int32_t *sd = realloc(d->sdist, (size_t)cap * sizeof *sd);
    if (sd) d->sdist = sd;
    int8_t *dn = realloc(d->done, (size_t)cap);
    if (dn) d->done = dn;
    uint32_t **mk = realloc(d->masks, (size_t)cap * sizeof *mk);
    if (mk) d->masks = mk;
    int64_t *mc = realloc(d->mask_count, (size_t)cap * sizeof *mc);
    if (mc) d->mask_count = mc;
    int32_t *mf = realloc(d->mask_far, (size_t)cap * sizeof *mf);
    if (mf) d->mask_far = mf;
    struct dist_lists **ls = realloc(d->lists, (size_t)cap * sizeof *ls);
    if (ls) d->lists = ls;
    uint8_t *sh = realloc(d->mask_shared, (size_t)cap);
    if (sh) d->mask_shared = sh;
    if (!off || !len || !tr || !sd || !dn || !mk || !mc || !mf || !ls || !sh) return -1;
    d->cap = cap;
    /* the hash table keeps a load below one half */
    size_t hsize = 1;
    while (hsize < (size_t)cap * 2) hsize <<= 1;
    int32_t *ht = malloc(hsize * sizeof *ht);
    if (!ht) return -1;
    for (size_t i = 0; i < hsize; i++) ht[i] = -1;
    for (int id = 0; id < d->n_states; id++) {
        size_t h = hash_set(d->pool + d->set_off[id], d->set_len[id]) & (hsize - 1);
        while (ht[h] >= 0) h = (h + 1) & (hsize - 1);
        ht[h] = id;
    }
    free(d->ht);
    d->ht = ht, d->ht_mask = hsize - 1;
    return 0;
}

/* The state for set s (sorted), added when new. -2 over the limit or NOMEM. */
static int32_t intern(dfa *d, const int32_t *s, int n) {
    if (n == 0) return DEAD;
    uint64_t hv = hash_set(s, n);
    if (d->ht) {
        for (size_t h = hv & d->ht_mask; d->ht[h] >= 0; h = (h + 1) & d->ht_mask)
            if (same_set(d, d->ht[h], s, n)) return d->ht[h];
    }
    if (d->n_states >= d->max_states) return -2;
    if (d->n_states == d->cap && grow_states(d)) return -2;
    if (d->pool_len + (size_t)n > d->pool_cap) {
        size_t cap = d->pool_cap ? d->pool_cap * 2 : 4096;
        while (cap < d->pool_len + (size_t)n) cap *= 2;
        int32_t *p = realloc(d->pool, cap * sizeof *p);
        if (!p) return -2;
        d->pool = p, d->pool_cap = cap;
    }
    int32_t id = d->n_states++;
    memcpy(d->pool + d->pool_len, s, (size_t)n * sizeof *s);
    d->set_off[id] = (int32_t)d->pool_len, d->set_len[id] = n;
    d->pool_len += (size_t)n;
    for (int b = 0; b < 256; b++) d->trans[(size_t)id * 256 + b] = UNKNOWN;
    int32_t best = INF;
    for (int i = 0; i < n; i++)
        if (d->dist[s[i]] < best) best = d->dist[s[i]];
    d->sdist[id] = best, d->done[id] = -1, d->masks[id] = NULL, d->mask_count[id] = 0, d->mask_far[id] = 0;
    d->lists[id] = NULL, d->mask_shared[id] = 0;
    size_t h = hv & d->ht_mask;
    while (d->ht[h] >= 0) h = (h + 1) & d->ht_mask;
    d->ht[h] = id;
    return id;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Epsilon closure of the m states on the stack (already marked) into d->set; returns its size. */
static int closure(dfa *d, int m) {
    int k = 0;
    nfa *n = &d->n;
    while (m > 0) {
        int32_t q = d->stack[--m];
        int keep = q == d->accept;
        for (int32_t e = n->head[q]; e >= 0; e = n->edges[e].next) {
            const nfa_edge *ed = &n->edges[e];
            if (!ed->is_eps) {
                keep = 1;
                continue;
            }
            if (d->mark[ed->to] == d->gen || d->dist[ed->to] == INF) continue;
            d->mark[ed->to] = d->gen;
            d->stack[m++] = ed->to;
        }
        if (keep) d->set[k++] = q;
    }
    qsort(d->set, (size_t)k, sizeof *d->set, cmp_i32);
    return k;
}

static void next_gen(dfa *d) {
    if (++d->gen == 0) {
        memset(d->mark, 0, (size_t)d->n.n_states * sizeof *d->mark);
        d->gen = 1;
    }
}

int32_t dfa_next(dfa *d, int32_t state, uint8_t byte) {
    int32_t *slot = &d->trans[(size_t)state * 256 + byte];
    if (*slot != UNKNOWN) return *slot == DEAD ? -1 : *slot;
    next_gen(d);
    int m = 0;
    const int32_t *s = d->pool + d->set_off[state];
    for (int i = 0; i < d->set_len[state]; i++)
        for (int32_t e = d->n.head[s[i]]; e >= 0; e = d->n.edges[e].next) {
            const nfa_edge *ed = &d->n.edges[e];
            if (ed->is_eps || byte < ed->lo || byte > ed->hi) continue;
            if (d->mark[ed->to] == d->gen || d->dist[ed->to] == INF) continue;
            d->mark[ed->to] = d->gen;
            d->stack[m++] = ed->to;
        }
    int k = closure(d, m);
    int32_t t = intern(d, d->set, k);
    if (t == -2) return -2;
    d->trans[(size_t)state * 256 + byte] = t; /* the table may have moved in intern */
    return t == DEAD ? -1 : t;
}

dfa *dfa_new(nfa *n, int32_t start, int32_t accept, int n_ids, int max_states) {
    dfa *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->n = *n;
    memset(n, 0, sizeof *n);
    d->accept = accept, d->n_ids = n_ids, d->words = (n_ids + 31) / 32, d->max_states = max_states;
    int N = d->n.n_states;
    d->mark = calloc((size_t)N, sizeof *d->mark);
    d->stack = malloc((size_t)N * sizeof *d->stack);
    d->set = malloc((size_t)N * sizeof *d->set);
    if (!d->mark || !d->stack || !d->set || distances(d) || grow_states(d)) return dfa_free(d), NULL;
    next_gen(d);
    d->stack[0] = start;
    d->mark[start] = d->gen;
    int k = d->dist[start] == INF ? 0 : closure(d, 1);
    d->start = intern(d, d->set, k);
    if (d->start == -2) return dfa_free(d), NULL;
    return d;
}

struct alias_entry {
    uint64_t h;
    int32_t state, len; /* state -1: empty */
    int32_t *key;
};

void dfa_free(dfa *d) {
    if (!d) return;
    for (int i = 0; i < d->n_states; i++)
        if (!d->mask_shared[i]) free(d->masks[i]), free(d->lists[i]);
    for (size_t i = 0; i < d->ak_cap; i++) free(d->akeys[i].key);
    free(d->akeys), free(d->run_pos), free(d->mask_shared);
    nfa_free(&d->n);
    free(d->dist), free(d->set_off), free(d->set_len), free(d->pool), free(d->trans), free(d->sdist);
    free(d->done), free(d->masks), free(d->mask_count), free(d->mask_far), free(d->lists), free(d->ht), free(d->mark), free(d->stack), free(d->set);
    free(d);
}

int dfa_start(dfa *d) { return d->start; }
int dfa_distance(dfa *d, int32_t state) { return state < 0 ? INF : d->sdist[state]; }
/* What the DFA holds, about: its NFA (states, edges, distances, scratch), the reached states' rows, sets and
 * per-state arrays, the cached masks; the dist lists beside masks are small and left out. */
size_t dfa_bytes(const dfa *d) {
    size_t nfa_bytes = (size_t)d->n.cap_states * (sizeof(int32_t) * 5) + (size_t)d->n.cap_edges * sizeof(nfa_edge);
    size_t per_state = 256 * sizeof(int32_t) + 2 * sizeof(int32_t) + sizeof(int32_t) + 1 + sizeof(uint32_t *) +
                       sizeof(int64_t) + sizeof(int32_t) + sizeof(void *);
    return nfa_bytes + (size_t)d->cap * per_state + d->pool_cap * sizeof(int32_t) +
           (size_t)d->n_masks * (size_t)d->words * sizeof(uint32_t) + (d->ht_mask + 1) * sizeof(int32_t);
}

int dfa_n_states(const dfa *d) { return d->n_states; }
int dfa_n_shared_masks(const dfa *d) { return d->n_shared; }
int dfa_n_masks(const dfa *d) { return d->n_masks; }
int dfa_nfa_states(const dfa *d) { return d->n.n_states; }
int dfa_max_distance(const dfa *d) { return d->max_dist; }

int dfa_done(dfa *d, int32_t state) {
    if (state < 0) return 0;
    if (d->done[state] >= 0) return d->done[state];
    int done = d->sdist[state] == 0;
    for (int b = 0; done && b < 256; b++) {
        int32_t t = dfa_next(d, state, (uint8_t)b);
        if (t == -2) return 0; /* unknown: not done; the next mask reports the limit */
        if (t >= 0) done = 0;
    }
    return d->done[state] = (int8_t)done;
}

/* ---- masks: a walk of the vocabulary trie ------------------------------------------------- */

typedef struct walk_item {
    int32_t node, state;
} walk_item;

/* Tokens whose end state is nearer to or farther from completion than the state itself, by that distance. */
typedef struct dist_tok {
    int32_t dist, token;
} dist_tok;

struct dist_lists {
    int n_near, n_far; /* items[0..n_near): dist < the state's, ascending; then n_far with dist > it, descending */
    dist_tok items[];
};

#define MAX_LISTED 16384 /* a state with more goes back to walking for tight budgets */

typedef struct collector {
    dist_tok *items;
    int n, cap, overflow;
    int32_t level; /* the state's own distance */
} collector;

static void collect(collector *c, int32_t dist, int32_t token) {
    if (!c || c->overflow || dist == c->level) return;
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 256;
        dist_tok *g = cap <= MAX_LISTED ? realloc(c->items, (size_t)cap * sizeof *g) : NULL;
        if (!g) {
            c->overflow = 1;
            return;
        }
        c->items = g, c->cap = cap;
    }
    c->items[c->n++] = (dist_tok){dist, token};
}

static int cmp_near_far(const void *a, const void *b) { /* near ascending first, then far descending */
    const dist_tok *x = a, *y = b;
    return x->dist < y->dist ? -1 : x->dist > y->dist;
}

static struct dist_lists *make_lists(collector *c) {
    if (c->overflow) return NULL;
    struct dist_lists *l = malloc(sizeof *l + (size_t)c->n * sizeof(dist_tok));
    if (!l) return NULL;
    if (c->n > 1) qsort(c->items, (size_t)c->n, sizeof *c->items, cmp_near_far); /* items is NULL when empty */
    int near = 0;
    while (near < c->n && c->items[near].dist < c->level) near++;
    l->n_near = near, l->n_far = c->n - near;
    if (near) memcpy(l->items, c->items, (size_t)near * sizeof(dist_tok));
    for (int i = 0; i < l->n_far; i++) l->items[near + i] = c->items[c->n - 1 - i];
    return l;
}

/* Walk from state; set a token's bit when its end state is live (and within budget - 1 bytes of completion). */
static int64_t walk(dfa *d, const moeq_grammar_vocab *v, int32_t state, int32_t budget, uint32_t *bits,
                    int32_t *far, collector *col, moeq_err *err) {
    size_t cap = 1024, top = 0;
    walk_item *st = malloc(cap * sizeof *st);
    if (!st) return *err = MOEQ_ERR_NOMEM, -1;
    int64_t count = 0;
    memset(bits, 0, (size_t)d->words * sizeof *bits);
    st[top++] = (walk_item){0, state};
    while (top > 0) {
        walk_item w = st[--top];
        for (int32_t c = v->nodes[w.node].first_child; c >= 0; c = v->nodes[c].next_sibling) {
            int32_t t = dfa_next(d, w.state, v->nodes[c].byte);
            if (t == -2) return free(st), *err = MOEQ_ERR_LIMIT, -1;
            if (t < 0) continue;
            /* a byte lowers the distance by one at most: no token below can end within the budget */
            if (budget != INT32_MAX && d->sdist[t] > (int64_t)budget - 1 + v->nodes[c].height) continue;
            if (v->nodes[c].token >= 0 && (budget == INT32_MAX || d->sdist[t] <= budget - 1)) {
                if (d->sdist[t] > *far) *far = d->sdist[t];
                for (int32_t id = v->nodes[c].token; id >= 0; id = v->same_next[id]) {
                    bits[id >> 5] |= 1u << (id & 31);
                    count++;
                    collect(col, d->sdist[t], id);
                }
            }
            if (v->nodes[c].first_child < 0) continue;
            if (top == cap) {
                walk_item *g = realloc(st, cap * 2 * sizeof *st);
                if (!g) return free(st), *err = MOEQ_ERR_NOMEM, -1;
                st = g, cap *= 2;
            }
            st[top++] = (walk_item){c, t};
        }
    }
    free(st);
    return count;
}

/* ---- alike positions share a mask ------------------------------------------------------------ */

/*
 * A state's alias key: its NFA set with every member of a run (nfa_run) moved to the run's representative
 * position, when all its members of that run stand at one position inside the alike range — past the minimum
 * and more than a token's bytes (span, the vocabulary's longest) before the bound. From such a position every
 * token walks the same bytes into states that are again alike (or past the run, where they are the same
 * states), with the same distances to completion: two states with one key have one mask, one far list, one set
 * of distance lists. A set with members of a run at two positions keeps them (no sharing for it).
 */
static const nfa_run *run_of(const nfa *n, int32_t s) {
    int lo = 0, hi = n->n_runs - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const nfa_run *r = &n->runs[mid];
        if (s < r->first) hi = mid - 1;
        else if (s >= r->first + r->stride * r->copies) lo = mid + 1;
        else return r;
    }
    return NULL;
}

static int32_t run_position(const nfa_run *r, int32_t s) {
    int32_t off = s - r->first, copy = off / r->stride;
    return r->pos_shift && off % r->stride == 0 ? copy + 1 : copy;
}

static int cmp_key(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The key of state into key (its set's size), or 0 when no member moved (nothing to share by position). */
static int alias_key(dfa *d, int32_t state, int32_t span, int32_t *key) {
    const nfa *n = &d->n;
    const int32_t *set = d->pool + d->set_off[state];
    int len = d->set_len[state], moved = 0;
    for (int i = 0; i < n->n_runs; i++) d->run_pos[i] = -1;
    for (int i = 0; i < len; i++) {
        const nfa_run *r = run_of(n, set[i]);
        if (!r) continue;
        int32_t p = run_position(r, set[i]), *seen = &d->run_pos[r - n->runs];
        *seen = *seen == -1 || *seen == p ? p : -2;
    }
    for (int i = 0; i < len; i++) {
        int32_t s = set[i];
        const nfa_run *r = run_of(n, s);
        key[i] = s;
        if (!r || d->run_pos[r - n->runs] < 0) continue;
        int32_t p = run_position(r, s), lo = r->min_pos > 1 ? r->min_pos : 1, rep = r->max_pos - span - 1;
        if (p < lo || p > rep) continue;
        key[i] = s + (rep - p) * r->stride;
        moved = 1;
    }
    if (moved) qsort(key, (size_t)len, sizeof *key, cmp_key);
    return moved ? len : 0;
}

static uint64_t hash_key(const int32_t *k, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)k[i]) * 1099511628211ull;
    return h ^ (uint64_t)n;
}

/* The state whose mask key is key, or -1; with insert_state >= 0 and none found, records it (owning key). */
static int32_t alias_find(dfa *d, int32_t *key, int len, int32_t insert_state, int *owned) {
    uint64_t h = hash_key(key, len);
    *owned = 0;
    if (d->ak_cap) {
        for (size_t i = h & (d->ak_cap - 1); d->akeys[i].state >= 0; i = (i + 1) & (d->ak_cap - 1))
            if (d->akeys[i].h == h && d->akeys[i].len == len && !memcmp(d->akeys[i].key, key, (size_t)len * 4))
                return d->akeys[i].state;
    }
    if (insert_state < 0) return -1;
    if ((d->ak_n + 1) * 2 > d->ak_cap) { /* grow: load below one half */
        size_t cap = d->ak_cap ? d->ak_cap * 2 : 64;
        struct alias_entry *t = malloc(cap * sizeof *t);
        if (!t) return -1;
        for (size_t i = 0; i < cap; i++) t[i].state = -1, t[i].key = NULL;
        for (size_t i = 0; i < d->ak_cap; i++) {
            if (d->akeys[i].state < 0) continue;
            size_t j = d->akeys[i].h & (cap - 1);
            while (t[j].state >= 0) j = (j + 1) & (cap - 1);
            t[j] = d->akeys[i];
        }
        free(d->akeys);
        d->akeys = t, d->ak_cap = cap;
    }
    size_t j = h & (d->ak_cap - 1);
    while (d->akeys[j].state >= 0) j = (j + 1) & (d->ak_cap - 1);
    d->akeys[j] = (struct alias_entry){h, insert_state, len, key};
    d->ak_n++;
    *owned = 1;
    return -1;
}

const uint32_t *dfa_mask(dfa *d, const moeq_grammar_vocab *vocab, int32_t state, moeq_err *err) {
    if (d->masks[state]) return d->masks[state];
    int32_t *key = NULL;
    int klen = 0;
    if (d->n.n_runs && (d->run_pos || (d->run_pos = malloc((size_t)d->n.n_runs * sizeof *d->run_pos)))) {
        key = malloc((size_t)(d->set_len[state] ? d->set_len[state] : 1) * sizeof *key);
        klen = key ? alias_key(d, state, vocab->nodes[0].height, key) : 0;
        int owned;
        int32_t o = klen ? alias_find(d, key, klen, -1, &owned) : -1;
        if (o >= 0 && d->masks[o]) { /* an alike position's: the same tokens, distances and lists */
            free(key);
            d->masks[state] = d->masks[o], d->lists[state] = d->lists[o];
            d->mask_count[state] = d->mask_count[o], d->mask_far[state] = d->mask_far[o];
            d->mask_shared[state] = 1;
            d->n_shared++;
            return d->masks[state];
        }
        if (!klen) free(key), key = NULL;
    }
    uint32_t *bits = malloc((size_t)d->words * sizeof *bits);
    if (!bits) return free(key), *err = MOEQ_ERR_NOMEM, NULL;
    int32_t far = 0;
    collector col = {NULL, 0, 0, 0, d->sdist[state]};
    int64_t count = walk(d, vocab, state, INT32_MAX, bits, &far, &col, err);
    if (count < 0) return free(key), free(col.items), free(bits), NULL;
    d->masks[state] = bits; /* walk may have grown the arrays: index again */
    d->mask_count[state] = count;
    d->mask_far[state] = far;
    d->lists[state] = make_lists(&col);
    free(col.items);
    d->n_masks++;
    if (key) { /* the first of its alike positions: the others will share it */
        int owned;
        alias_find(d, key, klen, state, &owned);
        if (!owned) free(key);
    }
    return bits;
}

int64_t dfa_mask_budget(dfa *d, const moeq_grammar_vocab *vocab, int32_t state, int32_t budget, uint32_t *bits,
                        moeq_err *err) {
    const uint32_t *m = dfa_mask(d, vocab, state, err);
    if (!m) return -1;
    if (budget == INT32_MAX || budget - 1 >= d->mask_far[state]) { /* every allowed token fits the budget */
        memcpy(bits, m, (size_t)d->words * sizeof *bits);
        return d->mask_count[state];
    }
    const struct dist_lists *l = d->lists[state];
    int32_t room = budget - 1;
    if (!l) { /* too many tokens change the distance: walk for this budget */
        int32_t far = 0;
        return walk(d, vocab, state, budget, bits, &far, NULL, err);
    }
    int64_t count = 0;
    if (room >= d->sdist[state]) { /* the full mask less the tokens that end too far */
        memcpy(bits, m, (size_t)d->words * sizeof *bits);
        count = d->mask_count[state];
        for (int i = 0; i < l->n_far && l->items[l->n_near + i].dist > room; i++) {
            int32_t id = l->items[l->n_near + i].token;
            bits[id >> 5] &= ~(1u << (id & 31));
            count--;
        }
        return count;
    }
    memset(bits, 0, (size_t)d->words * sizeof *bits); /* only tokens that get near enough */
    for (int i = 0; i < l->n_near && l->items[i].dist <= room; i++) {
        int32_t id = l->items[i].token;
        bits[id >> 5] |= 1u << (id & 31);
        count++;
    }
    return count;
}
