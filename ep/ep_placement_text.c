/*
 * ep_placement_text.c — the placement file: a header line
 * `moeq-ep-placement 1 experts=E ranks=R`, then one line per expert
 * `E R [R ...]` (home first, then replicas), '#' comments. Every expert must
 * appear exactly once; errors name the line.
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/ep_placement.h"
#include "moeq/util.h"

typedef struct parse_state {
    int E, R, have_header, line;
    int *n_rep;   /* (E), 0 = not seen yet */
    int *ranks;   /* (E * R)               */
} parse_state;

/* Next integer in [*p, end) on this line, skipping blanks; 0 when none. */
static int next_int(const char **p, const char *end, long *v) {
    while (*p < end && (**p == ' ' || **p == '\t' || **p == '\r')) (*p)++;
    if (*p >= end || !(isdigit((unsigned char)**p) || **p == '-')) return 0;
    char buf[32];
    size_t k = 0;
    while (*p < end && k + 1 < sizeof buf && (isdigit((unsigned char)**p) || **p == '-')) buf[k++] = *(*p)++;
    buf[k] = 0;
    char *stop;
    errno = 0;
    *v = strtol(buf, &stop, 10);
    return !errno && *stop == 0;
}

static moeq_err parse_header(parse_state *st, const char *s, const char *end, char *errstr, size_t n) {
    int E = 0, R = 0, ver = 0;
    char tmp[256];
    size_t len = (size_t)(end - s) < sizeof tmp - 1 ? (size_t)(end - s) : sizeof tmp - 1;
    memcpy(tmp, s, len), tmp[len] = 0;
    if (sscanf(tmp, "moeq-ep-placement %d experts=%d ranks=%d", &ver, &E, &R) != 3 || ver != 1)
        return moeq_errf(MOEQ_ERR_PARSE, errstr, n,
                         "placement line %d: expected 'moeq-ep-placement 1 experts=E ranks=R'", st->line);
    if (E < 1 || E > MOEQ_EP_MAX_EXPERTS || R < 1 || R > MOEQ_EP_MAX_RANKS)
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "placement line %d: %d experts on %d ranks", st->line, E, R);
    st->E = E, st->R = R, st->have_header = 1;
    st->n_rep = calloc((size_t)E, sizeof(int)), st->ranks = malloc((size_t)E * (size_t)R * sizeof(int));
    return st->n_rep && st->ranks ? MOEQ_OK : MOEQ_ERR_NOMEM;
}

static moeq_err parse_expert(parse_state *st, const char *s, const char *end, char *errstr, size_t n) {
    long e, r;
    if (!next_int(&s, end, &e) || e < 0 || e >= st->E)
        return moeq_errf(MOEQ_ERR_PARSE, errstr, n, "placement line %d: expected an expert id in [0, %d)", st->line,
                         st->E);
    if (st->n_rep[e]) return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "placement line %d: expert %ld again", st->line, e);
    while (next_int(&s, end, &r)) {
        if (r < 0 || r >= st->R || st->n_rep[e] >= st->R)
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "placement line %d: expert %ld on rank %ld (of %d)", st->line,
                             e, r, st->R);
        st->ranks[e * st->R + st->n_rep[e]++] = (int)r;
    }
    while (s < end && isspace((unsigned char)*s)) s++;
    if (s < end) return moeq_errf(MOEQ_ERR_PARSE, errstr, n, "placement line %d: unexpected '%c'", st->line, *s);
    if (!st->n_rep[e]) return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "placement line %d: expert %ld has no rank", st->line, e);
    return MOEQ_OK;
}

static moeq_err parse_lines(parse_state *st, const char *text, size_t len, char *errstr, size_t n) {
    const char *p = text, *stop = text + len;
    while (p < stop) {
        const char *eol = memchr(p, '\n', (size_t)(stop - p)), *end = eol ? eol : stop, *hash = memchr(p, '#', (size_t)(end - p));
        const char *content = hash ? hash : end, *q = p;
        st->line++;
        while (q < content && isspace((unsigned char)*q)) q++;
        moeq_err err = MOEQ_OK;
        if (q < content) err = st->have_header ? parse_expert(st, q, content, errstr, n) : parse_header(st, q, content, errstr, n);
        if (err) return err;
        p = eol ? eol + 1 : stop;
    }
    if (!st->have_header) return moeq_errf(MOEQ_ERR_PARSE, errstr, n, "placement: no 'moeq-ep-placement' header");
    for (int e = 0; e < st->E; e++)
        if (!st->n_rep[e]) return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "placement: expert %d is not placed", e);
    return MOEQ_OK;
}

moeq_err moeq_ep_placement_parse(const char *text, size_t len, moeq_ep_placement **out, char *errstr, size_t n) {
    *out = NULL;
    parse_state st = {0};
    moeq_err err = parse_lines(&st, text, len, errstr, n);
    const int **ranks_of = NULL;
    if (!err && !(ranks_of = malloc((size_t)st.E * sizeof(int *)))) err = MOEQ_ERR_NOMEM;
    if (!err) {
        for (int e = 0; e < st.E; e++) ranks_of[e] = st.ranks + (size_t)e * st.R;
        err = moeq_ep_placement_new_table(st.E, st.R, st.n_rep, ranks_of, out, errstr, n);
    }
    free((void *)ranks_of), free(st.n_rep), free(st.ranks);
    return err;
}

moeq_err moeq_ep_placement_print(const moeq_ep_placement *pl, FILE *out) {
    int E = moeq_ep_placement_n_experts(pl);
    fprintf(out, "moeq-ep-placement 1 experts=%d ranks=%d\n", E, moeq_ep_placement_n_ranks(pl));
    for (int e = 0; e < E; e++) {
        fprintf(out, "%d", e);
        for (int i = 0; i < moeq_ep_placement_n_replicas(pl, e); i++) fprintf(out, " %d", moeq_ep_placement_replica(pl, e, i));
        fputc('\n', out);
    }
    return ferror(out) ? MOEQ_ERR_IO : MOEQ_OK;
}

moeq_err moeq_ep_placement_load(const char *path, moeq_ep_placement **out, char *errstr, size_t n) {
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    moeq_err err = moeq_read_file(path, 64u << 20, &text, &len, errstr, n);
    if (err) return err;
    err = moeq_ep_placement_parse(text, len, out, errstr, n);
    if (err) {
        char why[384];
        snprintf(why, sizeof why, "%s", errstr ? errstr : "");
        moeq_errf(err, errstr, n, "%s: %s", path, why);
    }
    free(text);
    return err;
}
