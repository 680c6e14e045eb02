/*
 * grammar_job.h — the grammar a job's response_format asks for: the one reading of the field (schemas' job.h)
 * as a grammar spec (grammar.h), for the worker, the coordinator's intake check and `moeq generate
 * --response-format`. Header only: the grammar library does not depend on the job schema; its users have both.
 */
#ifndef MOEQ_GRAMMAR_JOB_H
#define MOEQ_GRAMMAR_JOB_H

#include <string.h>

#include "moeq/grammar.h"
#include "moeq/job.h"

/* rf's spec (not MOEQ_RESPONSE_TEXT: that is none), borrowing rf's text. */
static inline moeq_grammar_spec moeq_response_format_spec(const moeq_response_format *rf) {
    static const moeq_grammar_kind kinds[] = {(moeq_grammar_kind)0, MOEQ_GRAMMAR_JSON_OBJECT,
                                              MOEQ_GRAMMAR_JSON_SCHEMA, MOEQ_GRAMMAR_REGEX, MOEQ_GRAMMAR_CHOICE};
    const char *text = rf->type == MOEQ_RESPONSE_REGEX ? rf->pattern : rf->schema;
    moeq_grammar_spec spec = {kinds[rf->type], text, text ? strlen(text) : 0, (const char *const *)rf->choices,
                              rf->n_choices};
    return spec;
}

#endif
