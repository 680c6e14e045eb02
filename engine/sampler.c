/*
 * sampler.c — next-token choice per sequence: greedy, temperature, top-k,
 * top-p, seeded.
 *
 * Randomness is counter based: draw n of a sampler is splitmix64(seed, n), so
 * a sequence's tokens depend only on its seed and how many tokens it has
 * drawn — never on other sequences or threads. Candidate order is total
 * (logit descending, then id ascending), so ties are deterministic too.
 * Every moeq_sampler_sample call is exactly one draw, greedy or not:
 * speculative decoding in exact mode (mtp_spec.c) relies on it to reproduce
 * this stream. The distribution itself is moeq_sampler_weights (sampler.h),
 * shared with mtp_spec.c's rejection sampler.
 * The candidate buffer is allocated in _new; sampling allocates nothing.
 * A draw can also be made from a logits record (a device's row reduced to
 * argmax, 64 candidates and sums; moeq_sampler_sample_record): the same
 * token whenever the record decides, else MOEQ_SAMPLE_INSUFFICIENT.
 */
#include <math.h>
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/ops_matmul.h"
#include "sampler.h"

struct moeq_sampler {
    moeq_sampling_params p;
    int vocab_size;
    uint64_t n_draws;
    int32_t *cand;  /* [vocab] candidate ids   */
    float *prob;    /* [vocab] their weights    */
    moeq_sampler_hook hook; /* process NULL: off   */
    float *work;    /* [vocab] the processed copy (hook only) */
};

moeq_sampling_params moeq_sampling_default_params(void) {
    return (moeq_sampling_params){.temperature = 0.0, .top_k = 0, .top_p = 1.0, .seed = 0};
}

moeq_err moeq_sampler_new(const moeq_sampling_params *params, int vocab_size, moeq_sampler **out) {
    if (!out || vocab_size < 1) return MOEQ_ERR_INVALID_ARG;
    *out = NULL;
    moeq_sampling_params p = params ? *params : moeq_sampling_default_params();
    if (p.temperature < 0 || p.top_k < 0 || !(p.top_p > 0 && p.top_p <= 1.0)) return MOEQ_ERR_INVALID_ARG;
    moeq_sampler *s = calloc(1, sizeof(*s));
    if (!s) return MOEQ_ERR_NOMEM;
    s->p = p;
    s->vocab_size = vocab_size;
    s->cand = malloc((size_t)vocab_size * sizeof(int32_t));
    s->prob = malloc((size_t)vocab_size * sizeof(float));
    if (!s->cand || !s->prob) {
        moeq_sampler_destroy(s);
        return MOEQ_ERR_NOMEM;
    }
    *out = s;
    return MOEQ_OK;
}

void moeq_sampler_destroy(moeq_sampler *sampler) {
    if (!sampler) return;
    free(sampler->cand);
    free(sampler->prob);
    free(sampler->work);
    free(sampler);
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Uniform in [0, 1) from (seed, draw index). */
double moeq_sampler_uniform(uint64_t seed, uint64_t n) {
    return (double)(splitmix64(splitmix64(seed) ^ n) >> 11) * 0x1p-53;
}

static int32_t argmax_scalar(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
/* The maximum, then its first index: the scalar loop's answer (a 3-cycle dependency per element, ~15 us over
 * DeepSeek's vocabulary, paid per verify row and draft). Rows holding a NaN take the scalar loop. */
static __attribute__((target("avx512f"))) int32_t argmax512(const float *logits, int n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(logits + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, v);
    }
    float m = _mm512_reduce_max_ps(mx);
    for (int j = i; j < n; j++) {
        if (logits[j] != logits[j]) nan = 1;
        m = logits[j] > m ? logits[j] : m;
    }
    if (nan) return argmax_scalar(logits, n);
    __m512 mv = _mm512_set1_ps(m);
    for (i = 0; i + 16 <= n; i += 16) {
        __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(logits + i), mv, _CMP_EQ_OQ);
        if (eq) return i + __builtin_ctz(eq);
    }
    for (; i < n; i++)
        if (logits[i] == m) return i;
    return argmax_scalar(logits, n);
}
#endif

int32_t moeq_sampler_argmax(const float *logits, int n) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    if (n >= 16 && moeq_mm_isa_best() == MOEQ_MM_ISA_AVX512) return argmax512(logits, n);
#endif
    return argmax_scalar(logits, n);
}

/* "a before b": higher logit first, then lower id. Heap and sort use it. */
static int before(const float *logits, int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

static _Thread_local const float *g_sort_logits; /* qsort has no context argument */

static int cmp_cand(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return before(g_sort_logits, a, b) ? -1 : (before(g_sort_logits, b, a) ? 1 : 0);
}

/* cand[0..k) = the k best ids in order (selection by a bounded insertion for small k, else full sort). */
static int select_top(const float *logits, int n, int k, int32_t *cand) {
    if (k <= 0 || k > n) k = n;
    if (k <= 64) {
        int m = 0;
        for (int32_t i = 0; i < n; i++) {
            if (m == k && !before(logits, i, cand[m - 1])) continue;
            int j = m < k ? m++ : k - 1;
            while (j > 0 && before(logits, i, cand[j - 1])) {
                cand[j] = cand[j - 1];
                j--;
            }
            cand[j] = i;
        }
        return m;
    }
    for (int32_t i = 0; i < n; i++) cand[i] = i;
    g_sort_logits = logits;
    qsort(cand, (size_t)n, sizeof(int32_t), cmp_cand);
    return k;
}

/* The smallest prefix of weights w[0..m) whose running sum reaches top_p * *s (the nucleus); *s becomes that
 * prefix's sum. Shared by draws from a row and from a record, so both keep the same candidates. */
static int nucleus(const float *w, int m, double top_p, double *s) {
    double acc = 0.0;
    for (int i = 0; i < m; i++) {
        acc += w[i];
        if (acc >= top_p * *s) {
            *s = acc;
            return i + 1;
        }
    }
    *s = acc;
    return m;
}

int moeq_sampler_weights(const moeq_sampling_params *p, const float *logits, int vocab, int ordered,
                         int32_t *cand, float *weight, double *sum) {
    int m = vocab;
    if (ordered || p->top_k > 0 || p->top_p < 1.0) {
        m = select_top(logits, vocab, p->top_k, cand);
    } else {
        for (int32_t i = 0; i < vocab; i++) cand[i] = i;
    }
    double inv_t = 1.0 / p->temperature, top = logits[moeq_sampler_argmax(logits, vocab)], s = 0.0;
    for (int i = 0; i < m; i++) s += weight[i] = (float)exp(((double)logits[cand[i]] - top) * inv_t);
    if (p->top_p < 1.0) m = nucleus(weight, m, p->top_p, &s);
    *sum = s;
    return m;
}

void moeq_sampler_set_hook(moeq_sampler *s, const moeq_sampler_hook *hook) {
    if (!s) return;
    s->hook = hook ? *hook : (moeq_sampler_hook){0};
    if (s->hook.process && !s->work) s->work = malloc((size_t)s->vocab_size * sizeof(float));
    if (!s->work) s->hook = (moeq_sampler_hook){0}; /* no memory: the caller sees no processing happen */
}

static int32_t draw_from(moeq_sampler *s, const float *logits, uint64_t draw);

/* The hook's path: process a copy, draw from it, report the draw with the model's own row. */
static int32_t sample_hooked(moeq_sampler *s, const float *raw, uint64_t draw) {
    memcpy(s->work, raw, (size_t)s->vocab_size * sizeof(float));
    s->hook.process(s->hook.ctx, raw, s->work, s->vocab_size);
    int32_t t = draw_from(s, s->work, draw);
    if (s->hook.accept) s->hook.accept(s->hook.ctx, raw, t);
    return t;
}

int32_t moeq_sampler_sample(moeq_sampler *s, const float *logits) {
    uint64_t draw = s->n_draws++;
    if (!moeq_ops_finite(logits, s->vocab_size)) return -1; /* broken weights or an overflow: no token to give */
    if (s->hook.process) return sample_hooked(s, logits, draw);
    return draw_from(s, logits, draw);
}

/* One draw from logits (masked entries are -inf: weight 0, never the argmax while one is finite). */
static int32_t draw_from(moeq_sampler *s, const float *logits, uint64_t draw) {
    if (s->p.temperature <= 0.0) return moeq_sampler_argmax(logits, s->vocab_size);
    double sum;
    int m = moeq_sampler_weights(&s->p, logits, s->vocab_size, 1, s->cand, s->prob, &sum);
    double u = moeq_sampler_uniform(s->p.seed, draw) * sum, acc = 0.0;
    for (int i = 0; i < m; i++) {
        acc += s->prob[i];
        if (u < acc) return s->cand[i];
    }
    while (m > 1 && s->prob[m - 1] == 0.0f) m--; /* rounding ran past the end: the last candidate with weight */
    return s->cand[m - 1];
}

int moeq_sampler_finite(const float *logits, int64_t n) { return moeq_ops_finite(logits, n); }

int moeq_sampler_has_draft_hook(const moeq_sampler *s) { return s && s->hook.draft != NULL; }

int moeq_sampler_argmax_only(const moeq_sampler *s) { return s && !s->hook.process && s->p.temperature <= 0.0; }

int32_t moeq_sampler_draft(moeq_sampler *s, const float *row, const int32_t *prefix, int n_prefix) {
    if (s->hook.draft) return s->hook.draft(s->hook.ctx, row, s->vocab_size, prefix, n_prefix);
    return moeq_sampler_argmax(row, s->vocab_size);
}

/* ---- draws from a logits record (a device's rows; moeq/engine.h) ---------------------------------------- */

double moeq_logits_sum_bound(double sum, int64_t vocab) {
    /* per term one float ulp (2^-23 relative; 2^-149 absolute below the normal range) between two exps, and
     * each order's double rounding (n 2^-53 relative): doubled for slack */
    return sum * (0x1p-22 + (double)vocab * 0x1p-51) + (double)vocab * 0x1p-148;
}

double moeq_logits_sum1_bound(double sum_1, int64_t vocab) {
    /* per term two exps within 2 ulps each (2^-51 relative), and each order's double rounding, doubled */
    return sum_1 * (0x1p-49 + (double)vocab * 0x1p-51) + (double)vocab * 0x1p-1070;
}

/* (float)((double)x - lse) for every lse in [lo, hi], or NAN when the rounding differs across it. */
static float logprob_at(float x, double lo, double hi) {
    float a = (float)((double)x - hi), b = (float)((double)x - lo);
    return a == b ? a : NAN;
}

int moeq_logits_record_logprobs(const moeq_logits_record *r, int64_t vocab, int32_t token, int k,
                                float *token_logprob, int32_t *top_ids, float *top_logprobs) {
    if (!r || !r->finite || k < 0 || k > r->n_top || !(r->sum_1 > 0)) return MOEQ_SAMPLE_INSUFFICIENT;
    double e = moeq_logits_sum1_bound(r->sum_1, vocab), top = (double)r->max;
    double lo = top + log(r->sum_1 - e), hi = top + log(r->sum_1 + e);
    lo -= fabs(lo) * 0x1p-50 + 0x1p-1070, hi += fabs(hi) * 0x1p-50 + 0x1p-1070; /* log's and the sum's rounding */
    int at = -1;
    for (int i = 0; i < r->n_top && at < 0; i++)
        if (r->top_id[i] == token) at = i;
    if (at < 0) return MOEQ_SAMPLE_INSUFFICIENT;
    float v = logprob_at(r->top_logit[at], lo, hi);
    if (v != v) return MOEQ_SAMPLE_INSUFFICIENT;
    for (int i = 0; i < k; i++) {
        float w = logprob_at(r->top_logit[i], lo, hi);
        if (w != w) return MOEQ_SAMPLE_INSUFFICIENT;
        top_ids[i] = r->top_id[i], top_logprobs[i] = w;
    }
    *token_logprob = v;
    return 0;
}

double moeq_sampler_temperature(const moeq_sampler *s) { return s ? s->p.temperature : 0.0; }

/* Candidate i's weight exactly as moeq_sampler_weights computes it for the row. */
static float record_weight(const moeq_logits_record *r, int i, double inv_t) {
    return (float)exp(((double)r->top_logit[i] - (double)r->max) * inv_t);
}

/* [lo, hi] holding x * s for every s in [s_lo, s_hi] after the product's rounding. */
static void product_range(double x, double s_lo, double s_hi, double *lo, double *hi) {
    *lo = x * s_lo * (1.0 - 0x1p-50);
    *hi = x * s_hi * (1.0 + 0x1p-50);
}

/* The walk of draw_from over candidates 0..m) with weights w (sums acc in draw order) for the target
 * u * sum with sum exact: sampler.c's loop, rounding fallback included. */
static int32_t walk_exact(const moeq_logits_record *r, const float *w, int m, double target) {
    double acc = 0.0;
    for (int i = 0; i < m; i++) {
        acc += w[i];
        if (target < acc) return r->top_id[i];
    }
    while (m > 1 && w[m - 1] == 0.0f) m--;
    return r->top_id[m - 1];
}

/*
 * The draw for uniform u, or MOEQ_SAMPLE_INSUFFICIENT. Candidates: the top_k first when top_k <= n_top
 * (every weight and sum then exact: the sampler's own arithmetic on the same values in the same order);
 * the whole vocabulary when top_k is off (or >= vocab): the record's n_top first, and the total sum_t is
 * known only within its bound, so each comparison against it must come out the same at both ends.
 */
static int32_t record_draw(const moeq_sampling_params *p, const moeq_logits_record *r, int vocab, double u) {
    if (p->temperature <= 0.0) return r->argmax;
    int k = p->top_k <= 0 || p->top_k > vocab ? vocab : p->top_k, n = r->n_top;
    double inv_t = 1.0 / p->temperature;
    float w[MOEQ_LOGITS_TOP];
    int m = k < n ? k : n;
    for (int i = 0; i < m; i++) w[i] = record_weight(r, i, inv_t);
    if (k <= n) { /* every candidate is in the record: exact */
        double s = 0.0;
        for (int i = 0; i < m; i++) s += w[i];
        if (p->top_p < 1.0) m = nucleus(w, m, p->top_p, &s); /* the row's own arithmetic: the same prefix */
        return walk_exact(r, w, m, u * s);
    }
    if (k < vocab || r->temperature != p->temperature || !(r->sum_t > 0)) return MOEQ_SAMPLE_INSUFFICIENT;
    double e = moeq_logits_sum_bound(r->sum_t, vocab), lo, hi, acc = 0.0;
    if (p->top_p < 1.0) { /* the prefix whose mass reaches top_p * total, decided at both ends of the total */
        product_range(p->top_p, r->sum_t - e, r->sum_t + e, &lo, &hi);
        for (int i = 0; i < m; i++) {
            acc += w[i];
            if (acc >= hi) return walk_exact(r, w, i + 1, u * acc);
            if (acc >= lo) return MOEQ_SAMPLE_INSUFFICIENT;
        }
        return MOEQ_SAMPLE_INSUFFICIENT; /* the nucleus runs past the record */
    }
    product_range(u, r->sum_t - e, r->sum_t + e, &lo, &hi);
    for (int i = 0; i < m; i++) {
        acc += w[i];
        if (hi < acc) return r->top_id[i];
        if (lo < acc) return MOEQ_SAMPLE_INSUFFICIENT;
    }
    return MOEQ_SAMPLE_INSUFFICIENT; /* the draw lands past the record */
}

int moeq_sampler_record_decides(const moeq_sampler *s, const moeq_logits_record *rec, int ahead) {
    if (!s || !rec || s->hook.process) return 0;
    if (!rec->finite) return 1;
    double u = moeq_sampler_uniform(s->p.seed, s->n_draws + (uint64_t)ahead);
    return record_draw(&s->p, rec, s->vocab_size, u) != MOEQ_SAMPLE_INSUFFICIENT;
}

int32_t moeq_sampler_sample_record(moeq_sampler *s, const moeq_logits_record *rec) {
    if (s->hook.process) return MOEQ_SAMPLE_INSUFFICIENT;
    if (!rec->finite) {
        s->n_draws++;
        return -1;
    }
    int32_t t = record_draw(&s->p, rec, s->vocab_size, moeq_sampler_uniform(s->p.seed, s->n_draws));
    if (t != MOEQ_SAMPLE_INSUFFICIENT) s->n_draws++;
    return t;
}

int32_t moeq_sampler_sample_out(moeq_sampler *s, const moeq_logits_record *rec, const float *row) {
    return row ? moeq_sampler_sample(s, row) : moeq_sampler_sample_record(s, rec);
}
