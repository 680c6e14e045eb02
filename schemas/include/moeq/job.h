/*
 * moeq/job.h — the job format (v 1): decode and validate the bytes a
 * producer put on Kafka into a plain-data moeq_job, or reject them with a
 * stable reason code and a message naming the field.
 *
 * The format itself is documented in schemas/job.md and
 * schemas/job.schema.json; golden vectors live in schemas/vectors/.
 *
 * What this does not do: no I/O, no clock (deadlines are checked by the
 * coordinator), no allow-list check of reply_to (configuration, not schema),
 * no tokenisation. Decoding is a pure function; it is thread-safe on distinct
 * arguments. Memory is bounded by the input: nothing is allocated from a
 * length or count an input declares before the bytes behind it were seen.
 */
#ifndef MOEQ_JOB_H
#define MOEQ_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/config.h"
#include "moeq/err.h"
#include "moeq/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOEQ_JOB_VERSION 1

/* Hard ceilings the configurable limits cannot exceed (they size fixed buffers and recursion). */
#define MOEQ_JOB_ID_HARD_MAX 512     /* bytes of an id                           */
#define MOEQ_JOB_DEPTH_HARD_MAX 128  /* nesting depth of a job document          */

/*
 * Bounds a decoded job must respect. Get the defaults from
 * moeq_job_default_limits(); every field can be set from configuration
 * through moeq_job_limits_props (keys are the field names). All are >= 1.
 */
typedef struct moeq_job_limits {
    int64_t max_job_bytes;      /* whole encoded job, bytes; default 1048576 (1 MiB)               */
    int64_t max_id_bytes;       /* id, bytes; default 256, at most MOEQ_JOB_ID_HARD_MAX             */
    int64_t max_prompt_bytes;   /* prompt, or the sum of messages' content, bytes; default 524288 */
    int64_t max_input_tokens;   /* entries of `tokens`; default 131072                             */
    int64_t max_new_tokens;     /* cap on the max_new_tokens field; default 8192                   */
    int64_t max_messages;       /* entries of `messages`; default 1024                             */
    int64_t max_stop;           /* entries of `stop`; default 16                                   */
    int64_t max_stop_bytes;     /* one stop string, bytes; default 256                             */
    int64_t max_string_bytes;   /* any other string we keep (role, reply_to), bytes; default 256   */
    int64_t max_metadata_bytes; /* encoded metadata value, bytes; default 16384                    */
    int64_t max_depth;          /* nesting depth, the job map = 1; default 32, at most 128         */
    int64_t max_schema_bytes;   /* response_format.json_schema.schema, encoded bytes; default 32768 */
    int64_t max_pattern_bytes;  /* response_format.pattern, bytes; default 1024                     */
    int64_t max_choices;        /* response_format.choices entries; default 256                     */
    int64_t max_choice_bytes;   /* one choice, bytes; default 1024                                  */
    int64_t max_stop_token_ids; /* stop_token_ids entries; default 64                               */
} moeq_job_limits;

/* The defaults above. */
moeq_job_limits moeq_job_default_limits(void);

/* Property table over moeq_job_limits (for moeq_props_set / config files / --help). */
extern const moeq_prop moeq_job_limits_props[];

/* Check limits are usable (each >= 1, hard ceilings respected); message names the field. */
moeq_err moeq_job_limits_check(const moeq_job_limits *limits, char *errstr, size_t errstr_size);

/* Default values of optional job fields (see schemas/job.md). */
#define MOEQ_JOB_DEFAULT_PRIORITY 2
#define MOEQ_JOB_DEFAULT_MAX_NEW_TOKENS 512 /* clamped to limits.max_new_tokens when that is lower */
#define MOEQ_JOB_DEFAULT_TEMPERATURE 1.0
#define MOEQ_JOB_DEFAULT_TOP_P 1.0
#define MOEQ_JOB_DEFAULT_TOP_K 0 /* 0 = no top-k filter */
#define MOEQ_JOB_MAX_TOP_LOGPROBS 20 /* top_logprobs 0..20 (OpenAI's bound) */

/* response_format.type (schemas/job.md, "Structured output"). */
typedef enum moeq_response_type {
    MOEQ_RESPONSE_TEXT = 0,    /* absent or {type: "text"}: unconstrained                     */
    MOEQ_RESPONSE_JSON_OBJECT, /* any JSON object                                             */
    MOEQ_RESPONSE_JSON_SCHEMA, /* JSON valid against json_schema.schema (a supported subset)  */
    MOEQ_RESPONSE_REGEX,       /* text matching pattern (whole text, anchored)                */
    MOEQ_RESPONSE_CHOICE,      /* exactly one of choices                                      */
} moeq_response_type;

/* The decoded response_format. Plain data, owned by the job. */
typedef struct moeq_response_format {
    moeq_response_type type;
    char *name;              /* json_schema.name; NULL = absent                              */
    int strict;              /* json_schema.strict (accepted; output is always constrained)   */
    char *schema;            /* json_schema.schema as JSON text (transcoded from msgpack),
                                NUL-terminated; its grammar is compiled by the worker         */
    size_t schema_len;
    char *pattern;           /* REGEX: the pattern                                           */
    char **choices;          /* CHOICE: n_choices strings, each 1..max_choice_bytes           */
    size_t n_choices;
} moeq_response_format;

typedef enum moeq_job_input {
    MOEQ_JOB_INPUT_NONE = 0,
    MOEQ_JOB_INPUT_PROMPT,   /* job->prompt: raw text, tokenised as is            */
    MOEQ_JOB_INPUT_MESSAGES, /* job->messages: chat, rendered by the chat template */
    MOEQ_JOB_INPUT_TOKENS,   /* job->tokens: token ids, used as is                */
} moeq_job_input;

typedef struct moeq_job_message {
    char *role;         /* "system", "user", "assistant" or "tool"; NUL-terminated */
    char *content;      /* UTF-8 text without NUL; NUL-terminated                  */
    size_t content_len; /* bytes, excluding the terminator                         */
} moeq_job_message;

/*
 * A decoded, validated job. Plain data, owned by whoever decoded it: every
 * pointer is its own allocation (or NULL when absent); release with
 * moeq_job_free. Every string is valid UTF-8 without U+0000 and
 * NUL-terminated.
 */
typedef struct moeq_job {
    int version;             /* always MOEQ_JOB_VERSION                                   */
    moeq_wire_format format; /* the encoding it arrived in; results are sent back in it   */
    char *id;                /* producer-chosen idempotency key, 1..max_id_bytes          */
    size_t id_len;
    int priority;            /* 0 (highest) .. 3; default 2                               */

    moeq_job_input input;    /* which one of the three below is set                        */
    char *prompt;            /* MOEQ_JOB_INPUT_PROMPT                                     */
    size_t prompt_len;
    moeq_job_message *messages; /* MOEQ_JOB_INPUT_MESSAGES                                */
    size_t n_messages;
    int32_t *tokens;         /* MOEQ_JOB_INPUT_TOKENS: ids in [0, INT32_MAX]             */
    size_t n_tokens;

    int32_t max_new_tokens;  /* 1..limits.max_new_tokens                                  */
    double temperature;      /* [0, 2]; 0 = greedy                                        */
    double top_p;            /* (0, 1]                                                    */
    int32_t top_k;           /* >= 0; 0 = off                                             */
    int has_seed;            /* 0: the worker derives a seed from the id                  */
    uint64_t seed;
    char **stop;             /* n_stop strings, each 1..max_stop_bytes                     */
    size_t n_stop;
    int64_t deadline_ms;     /* absolute, ms since the Unix epoch; 0 = none               */
    char *reply_to;          /* result topic; NULL = the configured default topic         */
    int mtp;                 /* 1 = use multi-token prediction (default), 0 = off         */

    moeq_response_format response_format; /* TEXT (zeroed) when absent                  */
    int logprobs;            /* 1: the result carries each token's log-probability         */
    int top_logprobs;        /* 0..MOEQ_JOB_MAX_TOP_LOGPROBS alternatives per token          */
    int32_t *stop_token_ids; /* extra ids that end the job (finish_reason stop_token)       */
    size_t n_stop_token_ids;
    int32_t min_tokens;      /* end-of-sequence and stop_token_ids are masked before this    */
    double repetition_penalty; /* (0, 2]; 1 = off (0 in a job built in C: off too); over prompt
                                and output tokens (vLLM)                                  */
    double presence_penalty;   /* [-2, 2]; 0 = off; over output tokens (OpenAI)               */
    double frequency_penalty;  /* [-2, 2]; 0 = off; over output tokens (OpenAI)               */

    uint8_t *metadata;       /* the encoded bytes of the metadata map, verbatim, in       */
    size_t metadata_len;     /* `format`; NULL = absent. Echoed back in the result.        */
} moeq_job;

/* Free every member and zero the struct. NULL and a zeroed job are safe. */
void moeq_job_free(moeq_job *job);

/*
 * Why a job was rejected. Codes and their names are stable: they appear in
 * error results (`error.code`), dead-letter headers and metrics. Append new
 * codes at the end; never renumber or rename.
 */
typedef enum moeq_job_reject_code {
    MOEQ_JOB_REJECT_NONE = 0,              /* "none": not rejected                                 */
    MOEQ_JOB_REJECT_MALFORMED,             /* "malformed": not well-formed msgpack/JSON, truncated,
                                              trailing bytes, or neither format                     */
    MOEQ_JOB_REJECT_NOT_A_MAP,             /* "not_a_map": the document is not a map/object        */
    MOEQ_JOB_REJECT_UNSUPPORTED_VERSION,   /* "unsupported_version": `v` is an integer other than 1 */
    MOEQ_JOB_REJECT_MISSING_FIELD,         /* "missing_field": v, id, an input, a message's role/content */
    MOEQ_JOB_REJECT_WRONG_TYPE,            /* "wrong_type": e.g. a string where an integer belongs  */
    MOEQ_JOB_REJECT_OUT_OF_RANGE,          /* "out_of_range": a number outside its bounds, NaN, inf */
    MOEQ_JOB_REJECT_TOO_LARGE,             /* "too_large": bytes, a string, an array or metadata over its limit */
    MOEQ_JOB_REJECT_INVALID_UTF8,          /* "invalid_utf8": bad UTF-8, a surrogate, or U+0000 in text */
    MOEQ_JOB_REJECT_TOO_DEEP,              /* "too_deep": nesting deeper than limits.max_depth      */
    MOEQ_JOB_REJECT_CONFLICTING_INPUT,     /* "conflicting_input": more than one of prompt/messages/tokens */
    MOEQ_JOB_REJECT_DUPLICATE_KEY,         /* "duplicate_key": a known field given twice in one map */
    MOEQ_JOB_REJECT_INVALID_VALUE,         /* "invalid_value": right type, not allowed (empty id,
                                              unknown role, bad topic name, empty input)          */
    MOEQ_JOB_REJECT__COUNT
} moeq_job_reject_code;

/* Stable snake_case name ("malformed", ...); "unknown" outside the enum. */
const char *moeq_job_reject_code_name(moeq_job_reject_code code);
/* Inverse of moeq_job_reject_code_name; MOEQ_JOB_REJECT_NONE for unknown names. */
moeq_job_reject_code moeq_job_reject_code_from_name(const char *name);

/* Plain data, no allocation: safe to keep on the stack. */
typedef struct moeq_job_reject {
    moeq_job_reject_code code;
    char field[64];          /* "max_new_tokens", "messages[3].content"; "" = the whole job */
    char message[256];       /* "field 'max_new_tokens': 100000 exceeds the cap 8192"      */
    moeq_wire_format format; /* as far as it was determined                                 */
    int has_id;              /* 1 when the id could be read: publish an error result for it */
    char id[MOEQ_JOB_ID_HARD_MAX + 1];
} moeq_job_reject;

/*
 * Decode and validate one job.
 *
 * bytes, len     the Kafka message value (borrowed; need not be NUL-terminated)
 * content_type   the `content-type` header or NULL (see moeq_wire_detect)
 * limits         bounds to enforce; NULL = moeq_job_default_limits()
 * job            out: on MOEQ_OK a job the caller owns (moeq_job_free); on any
 *                error it is left zeroed
 * reject         out, may be NULL: on a rejection, the reason; zeroed otherwise
 *
 * Returns MOEQ_OK; or, when the job is rejected (reject->code says why; the
 * job will never become valid, so dead-letter it, do not retry):
 * MOEQ_ERR_PARSE (malformed, not_a_map), MOEQ_ERR_UNSUPPORTED
 * (unsupported_version), MOEQ_ERR_LIMIT (too_large, too_deep) or
 * MOEQ_ERR_FORMAT (every other code); or, without a reject code:
 * MOEQ_ERR_INVALID_ARG (NULL bytes/job, unusable limits), MOEQ_ERR_NOMEM.
 *
 * When several things are wrong the first in document order is reported,
 * except that well-formedness, depth, UTF-8 and duplicate keys are checked
 * over the whole document first, then `v`, then the fields.
 */
moeq_err moeq_job_decode(const void *bytes, size_t len, const char *content_type,
                         const moeq_job_limits *limits, moeq_job *job, moeq_job_reject *reject);

/*
 * Encode a job (for `moeq submit`, tests and C producers) as a map with
 * `v: 1`, every set field, and optional fields only where they differ from
 * their defaults. The job is borrowed and not validated beyond what encoding
 * needs; metadata must be encoded in `format` (it is copied verbatim).
 * Appends to out. Returns MOEQ_OK, MOEQ_ERR_INVALID_ARG (NULL, no id, metadata
 * in the other format), MOEQ_ERR_NOMEM.
 */
moeq_err moeq_job_encode(const moeq_job *job, moeq_wire_format format, moeq_buf *out);

/*
 * The job's content hash: FNV-1a 64 of the bytes exactly as produced (the
 * Kafka message value), as 16 lowercase hex digits. The coordinator keeps it
 * in the job record (to tell a reused id with other content from the same
 * job again) and results carry it as `job_hash`, so a reader can tell which
 * submission a result answers. Not a cryptographic hash: it guards against
 * mistakes (an edited file re-sent with the same ids), not an adversary.
 */
#define MOEQ_JOB_HASH_SIZE 17 /* 16 hex digits + NUL */
void moeq_job_content_hash(const void *bytes, size_t len, char out[MOEQ_JOB_HASH_SIZE]);

/* The moeq_err a reject code is returned as (MOEQ_OK for NONE). */
moeq_err moeq_job_reject_err(moeq_job_reject_code code);

#ifdef __cplusplus
}
#endif
#endif
