/*
 * metrics_lint.h — the Prometheus conventions docs/METRICS.md promises,
 * checked over a rendered /metrics page: `_total` only on counters and on
 * every counter; no `_ms` (times are `_seconds`); a histogram has its
 * `_bucket{le="+Inf"}`, `_sum` and `_count`; every sample belongs to a
 * family declared by `# TYPE`. Header-only, tests only.
 */
#ifndef MOEQ_TESTS_METRICS_LINT_H
#define MOEQ_TESTS_METRICS_LINT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int moeq_test_ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

/* 1 when page has a line starting with prefix. */
static inline int moeq_test_has_line(const char *page, const char *prefix) {
    size_t k = strlen(prefix);
    for (const char *p = page; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
        if (!strncmp(p, prefix, k)) return 1;
    return 0;
}

static inline int moeq_test_lint_family(const char *page, const char *name, const char *kind, char *why, size_t n) {
    size_t len = strlen(name);
    int counter = !strcmp(kind, "counter");
    if (moeq_test_ends_with(name, len, "_total") != counter)
        return snprintf(why, n, "%s: %s", name, counter ? "a counter must end in _total" : "only counters end in _total"), 1;
    if (strstr(name, "_ms_") || moeq_test_ends_with(name, len, "_ms"))
        return snprintf(why, n, "%s: times are in seconds (_seconds), not ms", name), 1;
    if (!strcmp(kind, "histogram")) {
        char want[256];
        const char *parts[] = {"_bucket{", "_sum", "_count"};
        for (int i = 0; i < 3; i++) {
            snprintf(want, sizeof want, "%s%s", name, parts[i]);
            if (!moeq_test_has_line(page, want)) return snprintf(why, n, "histogram %s: no %s line", name, want), 1;
        }
        snprintf(want, sizeof want, "le=\"+Inf\"");
        if (!strstr(page, want)) return snprintf(why, n, "histogram %s: no +Inf bucket", name), 1;
    }
    return 0;
}

/* 0 when page follows the conventions; else 1 with why naming the metric. */
static inline int moeq_test_metrics_lint(const char *page, char *why, size_t n) {
    char families[256][128];
    int n_fam = 0;
    for (const char *p = page; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p) {
        char name[128], kind[32];
        if (sscanf(p, "# TYPE %127s %31s", name, kind) != 2) continue;
        if (moeq_test_lint_family(page, name, kind, why, n)) return 1;
        if (n_fam < 256) snprintf(families[n_fam++], sizeof families[0], "%s", name);
    }
    for (const char *p = page; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p) {
        if (*p == '#' || *p == '\n') continue;
        size_t k = strcspn(p, "{ \n");
        int known = 0;
        for (int i = 0; i < n_fam && !known; i++) {
            size_t f = strlen(families[i]);
            const char *rest = p + f;
            size_t r = k > f ? k - f : 0;
            known = k >= f && !strncmp(p, families[i], f) &&
                    (r == 0 || (r == 7 && !strncmp(rest, "_bucket", 7)) || (r == 4 && !strncmp(rest, "_sum", 4)) ||
                     (r == 6 && !strncmp(rest, "_count", 6)));
        }
        if (!known) return snprintf(why, n, "sample %.*s has no # TYPE line", (int)k, p), 1;
    }
    return 0;
}

/*
 * 0 when every family of page is named in docs/METRICS.md (as `name` or
 * `name{labels}`), read from $MOEQ_SOURCE_DIR; else 1 with why naming it.
 */
static inline int moeq_test_metrics_documented(const char *page, char *why, size_t n) {
    const char *src = getenv("MOEQ_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/METRICS.md", src ? src : ".");
    FILE *f = fopen(path, "r");
    if (!f) return snprintf(why, n, "cannot read docs/METRICS.md under %.200s", src ? src : "."), 1;
    static char doc[65536];
    size_t len = fread(doc, 1, sizeof doc - 1, f);
    doc[len] = 0;
    fclose(f);
    for (const char *p = page; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p) {
        char name[128], kind[32], a[140], b[140];
        if (sscanf(p, "# TYPE %127s %31s", name, kind) != 2) continue;
        snprintf(a, sizeof a, "`%s`", name);
        snprintf(b, sizeof b, "`%s{", name);
        if (!strstr(doc, a) && !strstr(doc, b)) return snprintf(why, n, "%s is not listed in docs/METRICS.md", name), 1;
    }
    return 0;
}

#endif
