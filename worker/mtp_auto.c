/*
 * mtp_auto.c — drafts per round from measured acceptance and measured step times (see mtp_auto.h).
 *
 * The cost side is two tables: for each main-step size T (tokens), a running mean of what plans of that
 * size took, less their draft passes; and for each draft-pass size m (sequences drafting at one depth), what
 * such a pass took (the engine times a round's drafts apart: moeq_mtp_decoder_last_draft_ns). Sizes never
 * seen are read off their seen neighbours (a straight line between two; beyond the last one, its cost grown
 * at least at the prior slope), so no shape is assumed, and a step that turns compute bound past some batch
 * size shows up as a steeper line there. Before any draft was timed, a pass over m sequences is taken to
 * cost the MTP layer's share of the weights times a main step of m tokens.
 */
#include "mtp_auto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PRIOR_ACCEPT 0.7    /* before any round: optimistic, so that every depth is tried              */
#define PRIOR_WEIGHT 2.0    /* rounds' worth of evidence the worker's prior counts as                   */
#define JOB_PRIOR_WEIGHT 1.0 /* ... and the worker's figures in a job's: its own rounds soon decide     */
#define JOB_DECAY 0.97f     /* per round: a job's figures weigh its last ~30 rounds                      */
#define GLOBAL_DECAY 0.995f /* per round: the worker's weigh its last ~200 rounds, any job's            */
#define GLOBAL_DRIFT 0.998f /* per plan: and drift back to the prior over ~500 plans without rounds, so a
                               worker whose jobs all stopped drafting still tries new ones              */
#define PROBE_FIRST 32      /* plans a job goes without drafting before it tries again ...             */
#define PROBE_MAX 1024      /* ... doubling after each try, up to this                                 */
#define PROBE_KEEP 0.5f     /* a try keeps half the job's old figures, so its outcome counts          */
#define SLOPE_PRIOR 0.03    /* an unseen larger step costs at least this much more per token, relative
                               to a one-token step (a memory-bound CPU step is 0.01-0.08)               */
#define COST_WEIGHT_MAX 8.0f /* a table entry is a running mean of its last ~8 plans                  */
#define LOOK_EVERY 64       /* plans: a plan without drafts whenever no step near its size (within an
                               eighth) was timed for this long, so the table knows what drafts add to
                               the plain step, not only the steps it chose                             */
#define LOOK_SHALLOWER 16   /* every this many plans, drafts one depth less deep than the last choice:
                               between two timed sizes the table reads a straight line, which is above
                               a step time that bends upward (memory bound, then compute bound), so the
                               sizes in between must be timed too                                      */

typedef struct candidate {
    double chance;
    int job;
} candidate;

typedef struct cost_table {
    int max;           /* sizes 1..max                                              */
    double *cost;      /* [max + 1] seconds at each size                            */
    float *seen;       /* [max + 1] plans behind cost[t], capped; 0 = never seen    */
    uint64_t *seen_at; /* [max + 1] the plan count when cost[t] was last noted      */
    int n_seen;        /* sizes seen at all                                         */
} cost_table;

struct moeq_mtp_auto {
    int max_tokens;
    double draft_share;
    cost_table main, draft; /* a main step by its tokens; a draft pass by its sequences */
    uint64_t plans;    /* moeq_mtp_auto_choose calls                               */
    int last_depth;    /* the deepest draft the last ordinary choice gave          */
    float g_reached[MOEQ_MTP_AUTO_MAX_K], g_accepted[MOEQ_MTP_AUTO_MAX_K];
    double *main_cost; /* scratch: [max_tokens + 1]                                  */
    double *draft_cost, *chance;
    candidate *order;
    int cap; /* jobs the scratch holds                                                */
};

moeq_err moeq_mtp_auto_new(int max_step_tokens, double draft_share, moeq_mtp_auto **out, char *errstr,
                           size_t errstr_size) {
    *out = NULL;
    if (max_step_tokens < 1 || max_step_tokens > (1 << 24))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "mtp auto: max_step_tokens %d is outside [1, %d]",
                         max_step_tokens, 1 << 24);
    if (!(draft_share >= 0 && draft_share <= 1))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "mtp auto: draft share %g is outside [0, 1]",
                         draft_share);
    moeq_mtp_auto *a = calloc(1, sizeof *a);
    if (!a) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "mtp auto: out of memory");
    size_t n = (size_t)max_step_tokens + 1;
    a->main_cost = calloc(n, sizeof *a->main_cost);
    int ok = a->main_cost != NULL;
    for (cost_table *t = &a->main; t <= &a->draft; t++) {
        t->max = max_step_tokens;
        t->cost = calloc(n, sizeof *t->cost);
        t->seen = calloc(n, sizeof *t->seen);
        t->seen_at = calloc(n, sizeof *t->seen_at);
        ok &= t->cost && t->seen && t->seen_at;
    }
    if (!ok) {
        moeq_mtp_auto_destroy(a);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "mtp auto: out of memory for %d tokens",
                         max_step_tokens);
    }
    a->max_tokens = max_step_tokens;
    a->draft_share = draft_share;
    *out = a;
    return MOEQ_OK;
}

void moeq_mtp_auto_destroy(moeq_mtp_auto *a) {
    if (!a) return;
    for (cost_table *t = &a->main; t <= &a->draft; t++) free(t->cost), free(t->seen), free(t->seen_at);
    free(a->main_cost);
    free(a->draft_cost);
    free(a->chance);
    free(a->order);
    free(a);
}

/* ---- the cost table ------------------------------------------------------------------ */

static double prior_shape(int t) { return t <= 0 ? 0 : 1 + SLOPE_PRIOR * (t - 1); }

static int seen(const cost_table *a, int t) { return t >= 1 && t <= a->max && a->seen[t] > 0; }

/* Per token above the last seen size L: the line through L and the seen size below it, if steeper than
 * the prior's (a step past the batch where it turns compute bound costs more per token, never less). */
static double slope_above(const cost_table *a, int L) {
    double s = a->cost[L] * SLOPE_PRIOR / prior_shape(L);
    int L2 = L - 1;
    while (L2 >= 1 && !seen(a, L2)) L2--;
    if (L2 >= 1) {
        double o = (a->cost[L] - a->cost[L2]) / (L - L2);
        if (o > s) s = o;
    }
    return s;
}

/* out[i] = the estimated cost at size lo + i, i < n (lo >= 0), never falling with i. */
static void fill_costs(const cost_table *a, int lo, int n, double *out) {
    int L = lo < a->max ? lo : a->max; /* last seen size at or below the current one */
    while (L >= 1 && !seen(a, L)) L--;
    int U = 0; /* first seen size above the current one; > max_tokens: none */
    double slope = -1;
    for (int i = 0; i < n; i++) {
        int t = lo + i;
        double c;
        if (t <= 0) {
            c = 0;
        } else if (seen(a, t)) {
            c = a->cost[t];
            L = t, slope = -1;
        } else {
            if (U <= t) {
                U = t + 1;
                while (U <= a->max && !seen(a, U)) U++;
            }
            int above = U <= a->max;
            if (L >= 1 && above) {
                c = a->cost[L] + (a->cost[U] - a->cost[L]) * (double)(t - L) / (double)(U - L);
            } else if (L >= 1) {
                if (slope < 0) slope = slope_above(a, L);
                c = a->cost[L] + slope * (t - L);
            } else if (above) {
                c = a->cost[U] * prior_shape(t) / prior_shape(U);
            } else {
                c = prior_shape(t); /* nothing seen yet: relative to a one-token step */
            }
        }
        out[i] = i > 0 && c < out[i - 1] ? out[i - 1] : c;
    }
}

double moeq_mtp_auto_step_cost(const moeq_mtp_auto *a, int tokens) {
    double c = 0;
    if (a) fill_costs(&a->main, tokens, 1, &c);
    return c;
}

/* out[m] = a draft pass over m sequences, m = lo .. lo + n - 1: the draft table once a draft was timed, else
 * the MTP layer's share of a main step of m tokens. */
static void fill_draft_costs(const moeq_mtp_auto *a, int lo, int n, double *out) {
    if (a->draft.n_seen > 0) {
        fill_costs(&a->draft, lo, n, out);
        return;
    }
    fill_costs(&a->main, lo, n, out);
    for (int i = 0; i < n; i++) out[i] *= a->draft_share;
}

double moeq_mtp_auto_draft_cost(const moeq_mtp_auto *a, int seqs) {
    double c = 0;
    if (a) fill_draft_costs(a, seqs, 1, &c);
    return c;
}

/* A running mean of the table's last ~8 samples at size t. One stall (page faults on experts first touched,
 * another tenant's burst) moves an established entry at most to twice or half its value. */
static void table_note(cost_table *tb, int t, double sample, uint64_t plan) {
    if (tb->seen[t] >= 4) {
        double c = tb->cost[t];
        sample = sample > 2 * c ? 2 * c : sample < 0.5 * c ? 0.5 * c : sample;
    }
    float w = tb->seen[t] + 1 > COST_WEIGHT_MAX ? COST_WEIGHT_MAX : tb->seen[t] + 1;
    tb->n_seen += tb->seen[t] == 0;
    tb->cost[t] = tb->seen[t] > 0 ? tb->cost[t] + (sample - tb->cost[t]) / w : sample;
    tb->seen[t] = w;
    tb->seen_at[t] = plan;
}

void moeq_mtp_auto_note_step(moeq_mtp_auto *a, int tokens, const int *passes, int n_passes, double seconds,
                             double draft_seconds) {
    if (!a || tokens < 1 || tokens > a->max_tokens || !(seconds > 0) || seconds > 1e6) return;
    int n = 0;
    double est[MOEQ_MTP_AUTO_MAX_K], draft_est = 0;
    for (int j = 0; passes && j < n_passes && j < MOEQ_MTP_AUTO_MAX_K; j++, n++) {
        est[j] = passes[j] > 0 && passes[j] <= a->max_tokens ? moeq_mtp_auto_draft_cost(a, passes[j]) : 0;
        draft_est += est[j];
    }
    double main_sample;
    if (draft_seconds >= 0 && draft_seconds < seconds) { /* timed apart: each pass gets its estimate's share */
        main_sample = seconds - draft_seconds;
        for (int j = 0; j < n && draft_est > 0; j++)
            if (est[j] > 0) table_note(&a->draft, passes[j], draft_seconds * est[j] / draft_est, a->plans);
    } else { /* one time for both: take off the passes' estimated share, in whatever unit the tables are in */
        double main_est = moeq_mtp_auto_step_cost(a, tokens);
        main_sample = main_est + draft_est > 0 ? seconds * main_est / (main_est + draft_est) : seconds;
    }
    table_note(&a->main, tokens, main_sample, a->plans);
}

/* Whether a step of about t tokens (within an eighth) was timed in the last LOOK_EVERY plans. */
static int timed_lately(const moeq_mtp_auto *a, int t) {
    int lo = t - t / 8, hi = t + t / 8;
    if (hi > a->max_tokens) hi = a->max_tokens;
    for (int u = lo < 1 ? 1 : lo; u <= hi; u++)
        if (seen(&a->main, u) && a->plans - a->main.seen_at[u] < LOOK_EVERY) return 1;
    return 0;
}

/* ---- acceptance ---------------------------------------------------------------------- */

static double worker_acceptance(const moeq_mtp_auto *a, int j) {
    return a ? (a->g_accepted[j] + PRIOR_WEIGHT * PRIOR_ACCEPT) / (a->g_reached[j] + PRIOR_WEIGHT) : PRIOR_ACCEPT;
}

/* A job's prior is the worker's figures when it starts (and at each try): fixed in between, so that other
 * jobs' rounds never talk a job whose own drafts fail into drafting again. */
static void take_prior(const moeq_mtp_auto *a, moeq_mtp_depths *d) {
    for (int j = 0; j < MOEQ_MTP_AUTO_MAX_K; j++) d->prior[j] = (float)worker_acceptance(a, j);
    d->has_prior = 1;
}

double moeq_mtp_auto_acceptance(const moeq_mtp_auto *a, const moeq_mtp_depths *d, int depth) {
    if (depth < 1 || depth > MOEQ_MTP_AUTO_MAX_K) return 0;
    int j = depth - 1;
    double g = d && d->has_prior ? d->prior[j] : worker_acceptance(a, j);
    if (!d) return g;
    return (d->accepted[j] + JOB_PRIOR_WEIGHT * g) / (d->reached[j] + JOB_PRIOR_WEIGHT);
}

void moeq_mtp_auto_note_round(moeq_mtp_auto *a, moeq_mtp_depths *d, int k, int accepted) {
    if (k > MOEQ_MTP_AUTO_MAX_K) k = MOEQ_MTP_AUTO_MAX_K;
    /* depth j + 1 was judged when the j drafts before it were all accepted */
    if (d && accepted > 0) d->probe_after = 0; /* it pays again: a later stop waits the first interval */
    for (int j = 0; j < k && j <= accepted; j++) {
        float ok = j < accepted;
        if (d) d->reached[j] = d->reached[j] * JOB_DECAY + 1, d->accepted[j] = d->accepted[j] * JOB_DECAY + ok;
        if (a)
            a->g_reached[j] = a->g_reached[j] * GLOBAL_DECAY + 1,
            a->g_accepted[j] = a->g_accepted[j] * GLOBAL_DECAY + ok;
    }
}

/* ---- the choice ---------------------------------------------------------------------- */

static int grow_scratch(moeq_mtp_auto *a, int n) {
    if (n <= a->cap) return 1;
    double *dc = realloc(a->draft_cost, ((size_t)n + 1) * sizeof *dc);
    if (dc) a->draft_cost = dc;
    double *ch = realloc(a->chance, (size_t)n * sizeof *ch);
    if (ch) a->chance = ch;
    candidate *o = realloc(a->order, (size_t)n * sizeof *o);
    if (o) a->order = o;
    if (!dc || !ch || !o) return 0;
    a->cap = n;
    return 1;
}

/* By falling chance; equal chances keep the caller's order (oldest job first). */
static int by_chance(const void *x, const void *y) {
    const candidate *a = x, *b = y;
    if (a->chance != b->chance) return a->chance < b->chance ? 1 : -1;
    return (a->job > b->job) - (a->job < b->job);
}

void moeq_mtp_auto_choose(moeq_mtp_auto *a, moeq_mtp_auto_job *jobs, int n_jobs, int base_tokens,
                          int free_tokens) {
    if (!a) return;
    a->plans++;
    for (int j = 0; j < MOEQ_MTP_AUTO_MAX_K; j++) a->g_reached[j] *= GLOBAL_DRIFT, a->g_accepted[j] *= GLOBAL_DRIFT;
    int room = 0;
    for (int i = 0; i < n_jobs; i++) {
        jobs[i].k = 0;
        int k = jobs[i].k_max < MOEQ_MTP_AUTO_MAX_K ? jobs[i].k_max : MOEQ_MTP_AUTO_MAX_K;
        room += k > 0 ? k : 0;
        moeq_mtp_depths *d = jobs[i].depths;
        if (d && !d->has_prior) take_prior(a, d);
        if (!d || k <= 0 || d->idle < (d->probe_after ? d->probe_after : PROBE_FIRST)) continue;
        /* a try: the old figures count for less, so this plan's choice (and the round's outcome) can turn */
        for (int j = 0; j < MOEQ_MTP_AUTO_MAX_K; j++) d->reached[j] *= PROBE_KEEP, d->accepted[j] *= PROBE_KEEP;
        take_prior(a, d);
        d->idle = 0;
        d->probe_after = (d->probe_after ? d->probe_after : PROBE_FIRST) * 2;
        if (d->probe_after > PROBE_MAX) d->probe_after = PROBE_MAX;
    }
    if (base_tokens < 1) base_tokens = 1;
    if (room > free_tokens) room = free_tokens;
    if (room <= 0 || !grow_scratch(a, n_jobs)) return; /* no room is no verdict on a job: no idle plan */
    if (!timed_lately(a, base_tokens)) return; /* a look at the plain step (nor a verdict) */
    if (room > a->max_tokens) room = a->max_tokens;
    fill_costs(&a->main, base_tokens, room + 1, a->main_cost);
    fill_draft_costs(a, 0, n_jobs + 1, a->draft_cost);
    for (int i = 0; i < n_jobs; i++) a->chance[i] = 1;

    double tokens = base_tokens, drafts_cost = 0; /* the plan so far: expected tokens, draft passes' cost */
    int added = 0, shallower = a->plans % LOOK_SHALLOWER == 0 && a->last_depth > 0, deepest = 0;
    int max_depth = shallower ? a->last_depth - 1 : MOEQ_MTP_AUTO_MAX_K;
    for (int depth = 1; depth <= max_depth; depth++) {
        int nc = 0;
        for (int i = 0; i < n_jobs; i++) {
            if (jobs[i].k != depth - 1 || jobs[i].k_max < depth) continue;
            a->chance[i] *= moeq_mtp_auto_acceptance(a, jobs[i].depths, depth);
            a->order[nc++] = (candidate){a->chance[i], i};
        }
        if (nc == 0) break;
        qsort(a->order, (size_t)nc, sizeof *a->order, by_chance);
        /* the best prefix of the candidates: each adds a verify token and its expected tokens, the depth's
         * MTP pass costs draft_cost[m] for m of them */
        double best = tokens / (a->main_cost[added] + drafts_cost), sum = 0, best_sum = 0;
        int best_m = 0;
        for (int m = 1; m <= nc && added + m <= room; m++) {
            sum += a->order[m - 1].chance;
            double r = (tokens + sum) / (a->main_cost[added + m] + drafts_cost + a->draft_cost[m]);
            if (r > best) best = r, best_m = m, best_sum = sum;
        }
        if (best_m == 0) break;
        deepest = depth;
        for (int m = 0; m < best_m; m++) jobs[a->order[m].job].k = depth;
        tokens += best_sum;
        added += best_m;
        drafts_cost += a->draft_cost[best_m];
    }
    if (shallower) return; /* a look, no verdict on a job */
    a->last_depth = deepest;
    for (int i = 0; i < n_jobs; i++) {
        moeq_mtp_depths *d = jobs[i].depths;
        if (d && jobs[i].k_max > 0) d->idle = jobs[i].k > 0 ? 0 : d->idle + 1;
    }
}
