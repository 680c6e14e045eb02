/*
 * schema_check.c — see schema_check.h.
 */
#include "schema_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/grammar.h"
#include "moeq/grammar_job.h"

typedef struct verdict {
    int kind;       /* moeq_grammar_kind; 0: an empty slot */
    char *text;     /* the schema or pattern                */
    size_t len;
    moeq_err err;
    char why[256];
    uint64_t used;  /* the tick it was last asked for       */
} verdict;

struct moeq_schema_check {
    verdict *v;
    int n;
    uint64_t tick;
    int64_t hits, misses;
};

moeq_err moeq_schema_check_new(int entries, moeq_schema_check **out) {
    *out = NULL;
    moeq_schema_check *sc = calloc(1, sizeof *sc);
    if (!sc || !(sc->v = calloc((size_t)(entries > 0 ? entries : 1), sizeof *sc->v))) return free(sc), MOEQ_ERR_NOMEM;
    sc->n = entries > 0 ? entries : 1;
    *out = sc;
    return MOEQ_OK;
}

void moeq_schema_check_destroy(moeq_schema_check *sc) {
    if (!sc) return;
    for (int i = 0; i < sc->n; i++) free(sc->v[i].text);
    free(sc->v);
    free(sc);
}

moeq_err moeq_schema_check_job(moeq_schema_check *sc, const moeq_response_format *rf, char *why, size_t why_size) {
    if (why_size) why[0] = 0;
    if (rf->type != MOEQ_RESPONSE_JSON_SCHEMA && rf->type != MOEQ_RESPONSE_REGEX) return MOEQ_OK;
    moeq_grammar_spec spec = moeq_response_format_spec(rf);
    if (!spec.text) return MOEQ_OK; /* the decoder refuses it first */
    sc->tick++;
    verdict *slot = &sc->v[0];
    for (int i = 0; i < sc->n; i++) {
        verdict *v = &sc->v[i];
        if (v->kind == (int)spec.kind && v->len == spec.text_len && !memcmp(v->text, spec.text, spec.text_len)) {
            v->used = sc->tick;
            sc->hits++;
            if (why_size) snprintf(why, why_size, "%s", v->why);
            return v->err;
        }
        if (v->used < slot->used) slot = v; /* the least recently asked, or an empty one */
    }
    sc->misses++;
    moeq_grammar_limits lim = moeq_grammar_default_limits();
    lim.max_recursion = 16;
    lim.max_string_chars = 65536;
    char msg[256] = "";
    moeq_err e = moeq_grammar_check(&spec, &lim, msg, sizeof msg);
    if (e == MOEQ_ERR_LIMIT) e = MOEQ_OK; /* the worker's limits decide */
    if (e == MOEQ_ERR_NOMEM) return e;
    char *copy = malloc(spec.text_len + 1);
    if (copy) { /* without memory to keep it, the verdict is still this one */
        memcpy(copy, spec.text, spec.text_len);
        copy[spec.text_len] = 0;
        free(slot->text);
        *slot = (verdict){(int)spec.kind, copy, spec.text_len, e, "", sc->tick};
        snprintf(slot->why, sizeof slot->why, "%s", e ? msg : "");
    }
    if (why_size) snprintf(why, why_size, "%s", e ? msg : "");
    return e;
}

void moeq_schema_check_counts(const moeq_schema_check *sc, int64_t *hits, int64_t *misses) {
    *hits = sc->hits, *misses = sc->misses;
}
