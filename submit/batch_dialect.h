/*
 * batch_dialect.h — the two input/output dialects of `moeq submit`, as pure
 * functions over bytes: moeq JSONL (schemas/job.md in, schemas/result.md out)
 * and OpenAI Batch JSONL (`{custom_id, method, url, body}` in; `{id,
 * custom_id, response: {status_code, request_id, body}, error}` out, with the
 * failed requests in a separate errors file as OpenAI's Batch API writes them).
 *
 * What is here: detecting a file's dialect from its first line, turning one
 * input line into the moeq job to produce (an unsupported field, url or value
 * is an error naming it), turning a result into the line to write and which
 * file it goes to, the errors-file line of an input line that was skipped,
 * and reading back a line written earlier (for --resume).
 *
 * What is not: files, Kafka, clocks (the caller passes `created_s`). No I/O;
 * thread-safe on distinct arguments.
 */
#ifndef MOEQ_BATCH_DIALECT_H
#define MOEQ_BATCH_DIALECT_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "moeq/job.h"
#include "moeq/result.h"
#include "moeq/wire.h"

typedef enum moeq_dialect {
    MOEQ_DIALECT_MOEQ = 0, /* schemas/job.md lines; results as schemas/result.md JSON lines */
    MOEQ_DIALECT_OPENAI,   /* OpenAI Batch input lines; OpenAI Batch output / error lines  */
} moeq_dialect;

/* What an OpenAI line asks for (its url). */
typedef enum moeq_openai_endpoint {
    MOEQ_OPENAI_NONE = 0,        /* a moeq line                       */
    MOEQ_OPENAI_CHAT,            /* /v1/chat/completions: messages    */
    MOEQ_OPENAI_COMPLETIONS,     /* /v1/completions: prompt           */
} moeq_openai_endpoint;

/* "moeq", "openai". */
const char *moeq_dialect_name(moeq_dialect dialect);

/*
 * The dialect of a file, from its first non-blank line: a JSON object with a
 * top-level `custom_id`, `url` or `body` key is OpenAI Batch, anything else
 * (including a line that does not parse) is moeq, whose decoder then says
 * what is wrong with it.
 */
moeq_dialect moeq_dialect_detect(const char *line, size_t len);

/* One input line, judged in its file's dialect. Release with moeq_submit_line_free. */
typedef struct moeq_submit_line {
    char *id;                 /* the job id (moeq `id`, OpenAI `custom_id`); NULL when unreadable */
    char *job;                /* the moeq job JSON to produce (moeq: the line itself); NULL on error */
    size_t job_len;
    moeq_openai_endpoint endpoint;
    char *model;              /* OpenAI body.model, echoed when the result names none; may be NULL */
    int logprobs;             /* OpenAI: the request asked for logprobs (the output carries them)  */
    /* on error: why, naming the field (OpenAI: `body.temperature`, `url`; moeq: the job field) */
    char code[32];            /* a job reject code name (moeq), or "invalid_request" (OpenAI) */
    char param[96];
    char message[512];
} moeq_submit_line;

/*
 * Parse one line (no trailing newline) of a file in dialect. limits bound the
 * moeq job built (NULL: the defaults). Returns MOEQ_OK with id and job set;
 * MOEQ_ERR_PARSE / MOEQ_ERR_UNSUPPORTED / MOEQ_ERR_INVALID_ARG with code,
 * param and message set (id too when it could be read); MOEQ_ERR_NOMEM.
 * An OpenAI line must be `{custom_id, method: POST, url, body}`; body keys
 * other than those schemas/openai_batch.md maps are errors naming the key.
 */
moeq_err moeq_submit_line_parse(moeq_dialect dialect, const char *line, size_t len, const moeq_job_limits *limits,
                                moeq_submit_line *out);

/* Free every member and zero it. NULL is safe. */
void moeq_submit_line_free(moeq_submit_line *line);

/*
 * The line to write (appended to out, no newline) for result r of the job
 * parsed as req, and *to_errors: 1 when it belongs in the errors file
 * (OpenAI: every result that is not `ok`; moeq: never, every result goes to
 * --out as before). created_s is the OpenAI `created` (Unix seconds).
 * job_hash names the request in OpenAI ids (`batch_req_<hash>`). Returns
 * MOEQ_OK, MOEQ_ERR_NOMEM, or the encoder's error for a moeq result.
 */
moeq_err moeq_submit_result_line(moeq_dialect dialect, const moeq_submit_line *req, const moeq_result *r,
                                 const char *job_hash, int64_t created_s, moeq_buf *out, int *to_errors,
                                 char *errstr, size_t errstr_size);

/*
 * The errors-file line of input line lineno (1-based) that was not sent:
 * moeq `{"line", "id", "error": {code, field, message}}`; OpenAI `{"id",
 * "custom_id", "response": null, "error": {code, message, param, line}}`.
 */
moeq_err moeq_submit_invalid_line(moeq_dialect dialect, size_t lineno, const moeq_submit_line *line,
                                  moeq_buf *out);

/*
 * A line of an earlier run's --out or errors file: the id it answers and its
 * status. Returns 1 for an answer, 0 for anything else (a skipped-line
 * record, a blank or foreign line). id_size must be > MOEQ_JOB_ID_HARD_MAX.
 */
int moeq_submit_answer_parse(moeq_dialect dialect, const char *line, size_t len, char *id, size_t id_size,
                             moeq_result_status *status);

#endif
