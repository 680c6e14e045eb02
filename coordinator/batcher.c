/*
 * batcher.c — bucketing by (priority class, prompt length), closing rules,
 * aging and shared-prefix grouping. See batcher.h for the policy; this file
 * deliberately knows nothing about Kafka, Redis or the job wire format.
 *
 * Buckets are pooled: a closed bucket becomes the moeq_batch_plan handed to
 * the caller and returns to the pool on release, so the steady state
 * allocates nothing. Open buckets per class are kept in opening order (the
 * oldest first), which is also the tie-break when two buckets fit equally.
 *
 * Held ids live in an open-addressing table (linear probing, backward-shift
 * deletion, at most half full), grown only past the most jobs ever held.
 * An entry leaves by handle, not by id text: once a job is settled the
 * caller may reuse the id's storage before the batch is released.
 */
#include "batcher.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct bucket {
    moeq_batch_plan plan;   /* first member: a plan pointer is a bucket pointer */
    moeq_batcher_job *jobs; /* max_batch_jobs slots                              */
    size_t n;
    int64_t sum_prompt, sum_budget;
    int32_t min_len, max_len;
    int32_t prefix_len;     /* LCP of all prompts' tokens; -1 when a job has none */
    int64_t oldest_ms;
    int cls;
    struct bucket *next;    /* ready queue or free list */
} bucket;

typedef struct bucket_list {
    bucket **v;
    size_t n, cap;
} bucket_list;

struct moeq_batcher {
    moeq_batcher_params p;
    bucket_list open[MOEQ_BATCHER_CLASSES];
    bucket *ready_head, *ready_tail;
    size_t n_ready;
    bucket *free_list;
    bucket_list all; /* every bucket ever made, for destroy */
    size_t open_jobs;
    struct held {    /* held ids; handle 0 with id NULL = empty */
        uint64_t hash, handle;
        const char *id;
        size_t id_len;
    } *held;
    size_t n_held, cap_held; /* cap_held: 0 or a power of two */
};

moeq_batcher_params moeq_batcher_default_params(void) {
    moeq_batcher_params p = {
        .max_batch_jobs = 64,
        .max_batch_tokens = 65536,
        .max_wait_ms = 50,
        .length_tolerance = 0.10,
        .length_slack_tokens = 8,
        .min_shared_prefix = 64,
        .aging_ms = 30000,
    };
    return p;
}

const char *moeq_batch_close_str(moeq_batch_close reason) {
    static const char *const names[] = {"full_jobs", "full_tokens", "max_wait", "flush"};
    return (unsigned)reason < MOEQ_BATCH_CLOSE__COUNT ? names[reason] : "unknown";
}

static moeq_err check_params(const moeq_batcher_params *p, char *errstr, size_t n) {
    if (p->max_batch_jobs < 1 || p->max_batch_jobs > 4096)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "max_batch_jobs: %lld is outside [1, 4096]",
                         (long long)p->max_batch_jobs);
    if (p->max_batch_tokens < 1 || p->max_batch_tokens > (1 << 24))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "max_batch_tokens: %lld is outside [1, 16777216]",
                         (long long)p->max_batch_tokens);
    if (p->max_wait_ms < 0 || p->max_wait_ms > 600000)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "max_wait_ms: %lld is outside [0, 600000]",
                         (long long)p->max_wait_ms);
    if (!(p->length_tolerance >= 0 && p->length_tolerance <= 1))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "length_tolerance: %g is outside [0, 1]",
                         p->length_tolerance);
    if (p->length_slack_tokens < 0 || p->length_slack_tokens > 65536)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "length_slack_tokens: %lld is outside [0, 65536]",
                         (long long)p->length_slack_tokens);
    if (p->min_shared_prefix < 1)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "min_shared_prefix: %lld is below 1",
                         (long long)p->min_shared_prefix);
    if (p->aging_ms < 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "aging_ms: %lld is negative", (long long)p->aging_ms);
    return MOEQ_OK;
}

moeq_err moeq_batcher_new(const moeq_batcher_params *params, moeq_batcher **out, char *errstr, size_t n) {
    if (!params || !out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "batcher: NULL argument");
    *out = NULL;
    moeq_err err = check_params(params, errstr, n);
    if (err) return err;
    moeq_batcher *b = calloc(1, sizeof(*b));
    if (!b) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "batcher: out of memory");
    b->p = *params;
    *out = b;
    return MOEQ_OK;
}

void moeq_batcher_destroy(moeq_batcher *b) {
    if (!b) return;
    for (size_t i = 0; i < b->all.n; i++) {
        free(b->all.v[i]->jobs);
        free(b->all.v[i]);
    }
    free(b->all.v);
    for (int c = 0; c < MOEQ_BATCHER_CLASSES; c++) free(b->open[c].v);
    free(b->held);
    free(b);
}

/* ---- held ids ----------------------------------------------------------- */

static uint64_t id_hash(const char *id, size_t n) {
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)id[i]) * 1099511628211ULL;
    return h;
}

static int held_grow(moeq_batcher *b) {
    size_t cap = b->cap_held ? b->cap_held * 2 : 1024;
    struct held *v = calloc(cap, sizeof(*v)), *old = b->held;
    if (!v) return 0;
    for (size_t i = 0; i < b->cap_held; i++) {
        if (!old[i].id) continue;
        size_t k = old[i].hash & (cap - 1);
        while (v[k].id) k = (k + 1) & (cap - 1);
        v[k] = old[i];
    }
    free(old);
    b->held = v;
    b->cap_held = cap;
    return 1;
}

static long held_find(const moeq_batcher *b, const char *id, size_t n, uint64_t hash) {
    if (!b->cap_held) return -1;
    for (size_t k = hash & (b->cap_held - 1);; k = (k + 1) & (b->cap_held - 1)) {
        const struct held *e = &b->held[k];
        if (!e->id) return -1;
        if (e->hash == hash && e->id_len == n && !memcmp(e->id, id, n)) return (long)k;
    }
}

static int held_add(moeq_batcher *b, const moeq_batcher_job *j) {
    if ((b->n_held + 1) * 2 > b->cap_held && !held_grow(b)) return 0;
    size_t k = j->id_hash & (b->cap_held - 1);
    while (b->held[k].id) k = (k + 1) & (b->cap_held - 1);
    b->held[k] = (struct held){j->id_hash, j->handle, j->id, j->id_len};
    b->n_held++;
    return 1;
}

/* Remove the entry of job j (found by its hash and handle), closing the gap it leaves. */
static void held_remove(moeq_batcher *b, const moeq_batcher_job *j) {
    if (!j->id || !b->cap_held) return;
    size_t mask = b->cap_held - 1, k = j->id_hash & mask;
    while (b->held[k].id && !(b->held[k].hash == j->id_hash && b->held[k].handle == j->handle)) k = (k + 1) & mask;
    if (!b->held[k].id) return;
    for (size_t next = (k + 1) & mask; b->held[next].id; next = (next + 1) & mask) {
        size_t home = b->held[next].hash & mask;
        /* move next into the gap unless its home lies cyclically in (k, next] */
        int stays = k <= next ? (home > k && home <= next) : (home > k || home <= next);
        if (stays) continue;
        b->held[k] = b->held[next];
        k = next;
    }
    memset(&b->held[k], 0, sizeof(b->held[k]));
    b->n_held--;
}

moeq_err moeq_batcher_holder(const moeq_batcher *b, const char *id, size_t id_len, uint64_t *handle) {
    long k = b && id ? held_find(b, id, id_len, id_hash(id, id_len)) : -1;
    if (k < 0) return MOEQ_ERR_NOT_FOUND;
    if (handle) *handle = b->held[k].handle;
    return MOEQ_OK;
}

/* ---- small containers --------------------------------------------------- */

static int list_push(bucket_list *l, bucket *bk) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        bucket **v = realloc(l->v, cap * sizeof(*v));
        if (!v) return 0;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = bk;
    return 1;
}

static void list_remove_at(bucket_list *l, size_t i) {
    assert(i < l->n);
    memmove(&l->v[i], &l->v[i + 1], (l->n - i - 1) * sizeof(l->v[0]));
    l->n--;
}

static bucket *bucket_get(moeq_batcher *b) {
    bucket *bk = b->free_list;
    if (bk) {
        b->free_list = bk->next;
        return bk;
    }
    bk = calloc(1, sizeof(*bk));
    if (!bk) return NULL;
    bk->jobs = malloc((size_t)b->p.max_batch_jobs * sizeof(*bk->jobs));
    if (!bk->jobs || !list_push(&b->all, bk)) {
        free(bk->jobs);
        free(bk);
        return NULL;
    }
    return bk;
}

static void bucket_put(moeq_batcher *b, bucket *bk) {
    bk->n = 0;
    bk->next = b->free_list;
    b->free_list = bk;
}

/* ---- bucket arithmetic -------------------------------------------------- */

static int64_t job_budget(const moeq_batcher_job *j) { return (int64_t)j->prompt_len + j->max_new_tokens; }

/* How far (in tokens) a prompt of length x may sit from a bucket's mean. */
static double allowance(const moeq_batcher *b, double x) {
    double rel = b->p.length_tolerance * x;
    return rel > (double)b->p.length_slack_tokens ? rel : (double)b->p.length_slack_tokens;
}

static int length_admits(const moeq_batcher *b, const bucket *bk, int32_t len, double *dist) {
    double mean = (double)bk->sum_prompt / (double)bk->n;
    *dist = fabs((double)len - mean);
    if (*dist > allowance(b, len)) return 0;
    int32_t lo = len < bk->min_len ? len : bk->min_len;
    int32_t hi = len > bk->max_len ? len : bk->max_len;
    return (double)(hi - lo) <= 2.0 * allowance(b, lo);
}

/* Prefix the bucket would share with job added; -1 when unknown (no tokens). */
static int32_t joint_prefix(const bucket *bk, const moeq_batcher_job *j) {
    if (bk->prefix_len < 0 || !j->tokens) return -1;
    const int32_t *t0 = bk->jobs[0].tokens;
    int32_t lim = bk->prefix_len < j->prompt_len ? bk->prefix_len : j->prompt_len, i = 0;
    while (i < lim && t0[i] == j->tokens[i]) i++;
    return i;
}

static void bucket_recompute(bucket *bk) {
    bk->sum_prompt = bk->sum_budget = 0;
    bk->min_len = INT32_MAX;
    bk->max_len = 0;
    bk->oldest_ms = INT64_MAX;
    bk->prefix_len = bk->n && bk->jobs[0].tokens ? bk->jobs[0].prompt_len : -1;
    for (size_t i = 0; i < bk->n; i++) {
        const moeq_batcher_job *j = &bk->jobs[i];
        bk->sum_prompt += j->prompt_len;
        bk->sum_budget += job_budget(j);
        if (j->prompt_len < bk->min_len) bk->min_len = j->prompt_len;
        if (j->prompt_len > bk->max_len) bk->max_len = j->prompt_len;
        if (j->arrival_ms < bk->oldest_ms) bk->oldest_ms = j->arrival_ms;
        if (i > 0) bk->prefix_len = joint_prefix(bk, j);
    }
}

static void bucket_append(bucket *bk, const moeq_batcher_job *j) {
    int32_t prefix = bk->n ? joint_prefix(bk, j) : (j->tokens ? j->prompt_len : -1);
    bk->jobs[bk->n++] = *j;
    bk->prefix_len = prefix;
    bk->sum_prompt += j->prompt_len;
    bk->sum_budget += job_budget(j);
    if (bk->n == 1 || j->prompt_len < bk->min_len) bk->min_len = j->prompt_len;
    if (bk->n == 1 || j->prompt_len > bk->max_len) bk->max_len = j->prompt_len;
    if (bk->n == 1 || j->arrival_ms < bk->oldest_ms) bk->oldest_ms = j->arrival_ms;
}

/* ---- closing ------------------------------------------------------------ */

/* Move open[cls][i] to the ready queue as a finished plan. */
static void bucket_close(moeq_batcher *b, int cls, size_t i, moeq_batch_close reason, int64_t now_ms) {
    bucket *bk = b->open[cls].v[i];
    list_remove_at(&b->open[cls], i);
    moeq_batch_plan *p = &bk->plan;
    p->priority = cls;
    p->n_jobs = bk->n;
    p->jobs = bk->jobs;
    p->prompt_tokens = bk->sum_prompt;
    p->budget_tokens = bk->sum_budget;
    p->pad_tokens = (int64_t)bk->max_len * (int64_t)bk->n - bk->sum_prompt;
    p->min_prompt_len = bk->min_len;
    p->max_prompt_len = bk->max_len;
    p->shared_prefix_len = bk->n >= 2 && bk->prefix_len > 0 ? bk->prefix_len : 0;
    p->oldest_ms = bk->oldest_ms;
    p->closed_ms = now_ms;
    p->reason = reason;
    b->open_jobs -= bk->n;
    bk->next = NULL;
    if (b->ready_tail) b->ready_tail->next = bk;
    else b->ready_head = bk;
    b->ready_tail = bk;
    b->n_ready++;
}

/* Full when no job of the bucket's average budget would still fit. */
static int bucket_full(const moeq_batcher *b, const bucket *bk, moeq_batch_close *reason) {
    if ((int64_t)bk->n >= b->p.max_batch_jobs) {
        *reason = MOEQ_BATCH_CLOSE_FULL_JOBS;
        return 1;
    }
    int64_t room = b->p.max_batch_tokens - bk->sum_budget;
    if (room * (int64_t)bk->n < bk->sum_budget) {
        *reason = MOEQ_BATCH_CLOSE_FULL_TOKENS;
        return 1;
    }
    return 0;
}

/* ---- adding ------------------------------------------------------------- */

int moeq_batcher_effective_priority(const moeq_batcher *b, const moeq_batcher_job *j, int64_t now_ms) {
    int cls = j->priority;
    if (b->p.aging_ms > 0 && j->created_ms > 0 && now_ms > j->created_ms) {
        int64_t steps = (now_ms - j->created_ms) / b->p.aging_ms;
        cls = steps >= cls ? 0 : cls - (int)steps;
    }
    return cls;
}

/* Index of the best open bucket of cls for j, or -1 (open a new one). */
static long best_bucket(const moeq_batcher *b, int cls, const moeq_batcher_job *j, int *grouped_out) {
    const bucket_list *l = &b->open[cls];
    const int64_t min_prefix = b->p.min_shared_prefix;
    long best = -1;
    int best_grouped = 0;
    int32_t best_prefix = 0;
    double best_dist = 0;
    for (size_t i = 0; i < l->n; i++) {
        const bucket *bk = l->v[i];
        double dist;
        if (!length_admits(b, bk, j->prompt_len, &dist)) continue;
        if (bk->sum_budget + job_budget(j) > b->p.max_batch_tokens) continue;
        int32_t prefix = joint_prefix(bk, j);
        int grouped = prefix >= min_prefix;
        if (bk->n >= 2 && bk->prefix_len >= min_prefix && !grouped) continue; /* keep prefix groups whole */
        int better = best < 0 || grouped > best_grouped ||
                     (grouped == best_grouped && grouped && prefix > best_prefix) ||
                     (grouped == best_grouped && (!grouped || prefix == best_prefix) && dist < best_dist);
        if (better) {
            best = (long)i;
            best_grouped = grouped;
            best_prefix = prefix;
            best_dist = dist;
        }
    }
    *grouped_out = best_grouped;
    return best;
}

/* 1 when a and c share at least min_shared_prefix leading tokens. */
static int share_prefix(const moeq_batcher *b, const moeq_batcher_job *a, const moeq_batcher_job *c) {
    int64_t m = b->p.min_shared_prefix;
    if (!a->tokens || !c->tokens || a->prompt_len < m || c->prompt_len < m) return 0;
    return memcmp(a->tokens, c->tokens, (size_t)m * sizeof(int32_t)) == 0;
}

/* 1 when a bucket of just jobs a and c would satisfy the length rule and the token bound. */
static int pair_admits(const moeq_batcher *b, const moeq_batcher_job *a, const moeq_batcher_job *c) {
    double dist = fabs((double)a->prompt_len - (double)c->prompt_len);
    int32_t lo = a->prompt_len < c->prompt_len ? a->prompt_len : c->prompt_len;
    if (dist > allowance(b, c->prompt_len) || dist > 2.0 * allowance(b, lo)) return 0;
    return job_budget(a) + job_budget(c) <= b->p.max_batch_tokens;
}

/*
 * Streaming greedily, a prefix group's first job often lands in a bucket of
 * unrelated prompts before its partners arrive. When j finds no prefix group,
 * look for such a partner in a mixed bucket (one whose jobs share no long
 * prefix) and take it out, so the two start a group. The partner keeps its
 * arrival time, so no wait bound moves. Returns 1 when it formed a group
 * (bucket index in *out_i).
 */
static int regroup_partner(moeq_batcher *b, int cls, const moeq_batcher_job *j, size_t *out_i) {
    bucket_list *l = &b->open[cls];
    if (!j->tokens || j->prompt_len < b->p.min_shared_prefix) return 0;
    for (size_t i = 0; i < l->n; i++) {
        bucket *bk = l->v[i];
        if (bk->n < 2 || bk->prefix_len >= b->p.min_shared_prefix) continue;
        for (size_t k = 0; k < bk->n; k++) {
            if (!share_prefix(b, &bk->jobs[k], j) || !pair_admits(b, &bk->jobs[k], j)) continue;
            bucket *g = bucket_get(b);
            if (!g || !list_push(l, g)) {
                if (g) bucket_put(b, g);
                return 0; /* out of memory: fall back to plain bucketing */
            }
            g->n = 0;
            g->sum_prompt = g->sum_budget = 0;
            g->cls = cls;
            bucket_append(g, &bk->jobs[k]);
            memmove(&bk->jobs[k], &bk->jobs[k + 1], (bk->n - k - 1) * sizeof(bk->jobs[0]));
            bk->n--;
            bucket_recompute(bk);
            *out_i = l->n - 1;
            return 1;
        }
    }
    return 0;
}

static bucket *bucket_open(moeq_batcher *b, int cls, size_t *out_i) {
    bucket *bk = bucket_get(b);
    if (!bk || !list_push(&b->open[cls], bk)) {
        if (bk) bucket_put(b, bk);
        return NULL;
    }
    bk->n = 0;
    bk->sum_prompt = bk->sum_budget = 0;
    bk->cls = cls;
    *out_i = b->open[cls].n - 1;
    return bk;
}

moeq_err moeq_batcher_add(moeq_batcher *b, const moeq_batcher_job *job, int64_t now_ms, char *errstr, size_t n) {
    if (!b || !job) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "batcher_add: NULL argument");
    if (job->priority < 0 || job->priority >= MOEQ_BATCHER_CLASSES)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "priority: %d is outside [0, %d]", job->priority,
                         MOEQ_BATCHER_CLASSES - 1);
    if (job->prompt_len < 1 || job->max_new_tokens < 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "prompt_len %d / max_new_tokens %d out of range",
                         (int)job->prompt_len, (int)job->max_new_tokens);
    if (job_budget(job) > b->p.max_batch_tokens)
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, n,
                         "prompt_len + max_new_tokens = %lld exceeds max_batch_tokens %lld",
                         (long long)job_budget(job), (long long)b->p.max_batch_tokens);
    moeq_batcher_job j = *job;
    j.arrival_ms = now_ms;
    j.id_hash = j.id ? id_hash(j.id, j.id_len) : 0;
    if (j.id && held_find(b, j.id, j.id_len, j.id_hash) >= 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "id '%.*s' is already held by another job",
                         (int)(j.id_len < 200 ? j.id_len : 200), j.id);
    int cls = moeq_batcher_effective_priority(b, &j, now_ms), grouped = 0;
    long best = best_bucket(b, cls, &j, &grouped);
    size_t i;
    bucket *bk;
    if (!grouped && regroup_partner(b, cls, &j, &i)) {
        bk = b->open[cls].v[i];
    } else if (best >= 0) {
        i = (size_t)best;
        bk = b->open[cls].v[i];
    } else if (!(bk = bucket_open(b, cls, &i))) {
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "batcher: out of memory for a bucket");
    }
    if (j.id && !held_add(b, &j)) {
        if (bk->n == 0) { /* just opened for j: give it back */
            list_remove_at(&b->open[cls], i);
            bucket_put(b, bk);
        }
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "batcher: out of memory for the id index");
    }
    bucket_append(bk, &j);
    b->open_jobs++;
    moeq_batch_close reason;
    if (bucket_full(b, bk, &reason)) bucket_close(b, cls, i, reason, now_ms);
    return MOEQ_OK;
}

/* ---- polling, flushing, taking ------------------------------------------ */

size_t moeq_batcher_poll(moeq_batcher *b, int64_t now_ms) {
    size_t closed = 0;
    for (int c = 0; c < MOEQ_BATCHER_CLASSES; c++) {
        for (size_t i = 0; i < b->open[c].n;) {
            if (now_ms - b->open[c].v[i]->oldest_ms >= b->p.max_wait_ms) {
                bucket_close(b, c, i, MOEQ_BATCH_CLOSE_MAX_WAIT, now_ms);
                closed++;
            } else {
                i++;
            }
        }
    }
    return closed;
}

size_t moeq_batcher_flush(moeq_batcher *b, int64_t now_ms) {
    size_t closed = 0;
    for (int c = 0; c < MOEQ_BATCHER_CLASSES; c++)
        while (b->open[c].n) {
            bucket_close(b, c, 0, MOEQ_BATCH_CLOSE_FLUSH, now_ms);
            closed++;
        }
    return closed;
}

const moeq_batch_plan *moeq_batcher_next(moeq_batcher *b) {
    bucket *bk = b->ready_head;
    if (!bk) return NULL;
    b->ready_head = bk->next;
    if (!b->ready_head) b->ready_tail = NULL;
    b->n_ready--;
    bk->next = NULL;
    return &bk->plan;
}

void moeq_batcher_release(moeq_batcher *b, const moeq_batch_plan *plan) {
    if (!b || !plan) return;
    for (size_t k = 0; k < plan->n_jobs; k++) held_remove(b, &plan->jobs[k]);
    bucket_put(b, (bucket *)(void *)plan); /* plan is the first member of its bucket */
}

moeq_err moeq_batcher_cancel(moeq_batcher *b, uint64_t handle, moeq_batcher_job *out) {
    for (int c = 0; c < MOEQ_BATCHER_CLASSES; c++) {
        for (size_t i = 0; i < b->open[c].n; i++) {
            bucket *bk = b->open[c].v[i];
            for (size_t k = 0; k < bk->n; k++) {
                if (bk->jobs[k].handle != handle) continue;
                if (out) *out = bk->jobs[k];
                held_remove(b, &bk->jobs[k]);
                memmove(&bk->jobs[k], &bk->jobs[k + 1], (bk->n - k - 1) * sizeof(bk->jobs[0]));
                bk->n--;
                b->open_jobs--;
                if (bk->n == 0) {
                    list_remove_at(&b->open[c], i);
                    bucket_put(b, bk);
                } else {
                    bucket_recompute(bk);
                }
                return MOEQ_OK;
            }
        }
    }
    return MOEQ_ERR_NOT_FOUND;
}

int64_t moeq_batcher_next_deadline(const moeq_batcher *b) {
    int64_t t = INT64_MAX;
    for (int c = 0; c < MOEQ_BATCHER_CLASSES; c++)
        for (size_t i = 0; i < b->open[c].n; i++) {
            int64_t d = b->open[c].v[i]->oldest_ms + b->p.max_wait_ms;
            if (d < t) t = d;
        }
    return t;
}

size_t moeq_batcher_open_jobs(const moeq_batcher *b) { return b->open_jobs; }

size_t moeq_batcher_open_buckets(const moeq_batcher *b) {
    size_t n = 0;
    for (int c = 0; c < MOEQ_BATCHER_CLASSES; c++) n += b->open[c].n;
    return n;
}

size_t moeq_batcher_ready_batches(const moeq_batcher *b) { return b->n_ready; }
