/*
 * logits_reduce.c — see logits_reduce.h.
 */
#include "logits_reduce.h"

#include <math.h>
#include <string.h>

#include "ops.h"

/* "a ranks before b": higher value first, lower id on ties; a NaN ranks below every number (-inf too). */
static int ranks_before(const float *x, int32_t a, int32_t b) {
    if (isnan(x[a])) return isnan(x[b]) && a < b;
    if (isnan(x[b])) return 1;
    return x[a] > x[b] || (x[a] == x[b] && a < b);
}

void moeq_cpu_logits_reduce_row(const float *x, int64_t vocab, double temperature, int c, moeq_logits_record *r) {
    memset(r, 0, sizeof *r);
    r->finite = moeq_ops_finite(x, vocab);
    int32_t best = 0; /* moeq_sampler_argmax's scalar loop: a leading NaN stays, later NaNs never compare greater */
    for (int32_t i = 1; i < vocab; i++)
        if (x[i] > x[best]) best = i;
    r->argmax = best;
    r->max = x[best];
    int n = (int64_t)c < vocab ? c : (int)vocab, m = 0;
    r->n_top = n;
    for (int32_t i = 0; i < vocab; i++) {
        if (m == n && !ranks_before(x, i, r->top_id[m - 1])) continue;
        int j = m < n ? m++ : n - 1;
        while (j > 0 && ranks_before(x, i, r->top_id[j - 1])) r->top_id[j] = r->top_id[j - 1], j--;
        r->top_id[j] = i;
    }
    for (int i = 0; i < n; i++) r->top_logit[i] = x[r->top_id[i]];
    if (!r->finite) return;
    double top = (double)r->max, s1 = 0.0, st = 0.0, inv_t = temperature > 0 ? 1.0 / temperature : 0.0;
    for (int64_t i = 0; i < vocab; i++) s1 += exp((double)x[i] - top);
    if (temperature > 0)
        for (int64_t i = 0; i < vocab; i++) st += (float)exp(((double)x[i] - top) * inv_t);
    r->sum_1 = s1;
    r->sum_t = st;
    r->temperature = temperature > 0 ? temperature : 0.0;
}

void moeq_cpu_logits_reduce(const float *logits, int64_t ld, int64_t n_rows, int64_t vocab,
                            const double *temperature, moeq_logits_record *out) {
    for (int64_t r = 0; r < n_rows; r++)
        moeq_cpu_logits_reduce_row(logits + r * ld, vocab, temperature ? temperature[r] : 0.0, MOEQ_LOGITS_TOP,
                                   &out[r]);
}
