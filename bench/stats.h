/*
 * bench/stats.h — the benches' medians (header-only, like peak.h: each bench is one program). Every figure a
 * bench prints over rounds is a median, the mean of the middle two for an even count.
 */
#ifndef MOEQ_BENCH_STATS_H
#define MOEQ_BENCH_STATS_H

#include <stdlib.h>
#include <string.h>

static inline int bench_cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The median of v[0, n), sorting v in place (callers that want the extremes read v[0] and v[n - 1] after). */
static inline double bench_median_sort(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The median of v[0, n), v untouched (n <= 64, else 0). */
static inline double bench_median(const double *v, int n) {
    double s[64];
    if (n <= 0 || n > 64) return 0;
    memcpy(s, v, (size_t)n * sizeof *s);
    return bench_median_sort(s, n);
}

#endif
