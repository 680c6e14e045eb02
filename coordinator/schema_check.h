/*
 * schema_check.h — the coordinator's check of a job's response_format: the schema or pattern compiled without a
 * vocabulary (moeq_grammar_check), so a feature outside the supported subset is answered at intake with
 * unsupported_schema, as the worker would, before the job is batched. The verdicts of the last `entries`
 * distinct response_formats are kept (a pipeline's jobs share a few schemas), by their exact text.
 *
 * The limits are the grammar's defaults with recursion and string lengths at the largest a worker may be set to
 * (grammar_max_recursion 16, grammar_max_string_chars 65536): the check refuses only what every worker would, and
 * a schema over a limit (LIMIT) is left to the worker, whose limits are its own keys.
 *
 * Not thread-safe: the coordinator's loop owns it.
 */
#ifndef MOEQ_SCHEMA_CHECK_H
#define MOEQ_SCHEMA_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "moeq/job.h"

typedef struct moeq_schema_check moeq_schema_check;

moeq_err moeq_schema_check_new(int entries, moeq_schema_check **out);
void moeq_schema_check_destroy(moeq_schema_check *sc);

/*
 * rf's verdict: MOEQ_OK when it compiles, is text, json_object or choice (the job decoder checked those) or is
 * over a limit; MOEQ_ERR_UNSUPPORTED, _PARSE or _FORMAT with the grammar's message in why (the job is refused);
 * MOEQ_ERR_NOMEM.
 */
moeq_err moeq_schema_check_job(moeq_schema_check *sc, const moeq_response_format *rf, char *why, size_t why_size);

/* Verdicts served from the kept ones / compiled. */
void moeq_schema_check_counts(const moeq_schema_check *sc, int64_t *hits, int64_t *misses);

#endif
