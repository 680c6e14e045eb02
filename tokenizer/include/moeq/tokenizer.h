/*
 * moeq/tokenizer.h — Hugging Face `tokenizer.json` byte-level BPE (the
 * DeepSeek-V3 family), exact against the Rust `tokenizers` reference.
 *
 * Load a model directory's tokenizer.json (+ tokenizer_config.json for bos/eos
 * and the chat template), then encode text to ids, decode ids to text (whole,
 * or streaming for partial outputs) and render chat messages in the model's
 * built-in chat format.
 *
 * Supported tokenizer.json subset (anything else is rejected at load with
 * MOEQ_ERR_UNSUPPORTED naming the key): model BPE (merges as "a b" strings or
 * [a, b] pairs; byte_fallback false; dropout null; no continuing-subword or
 * end-of-word affixes), added_tokens (lstrip/rstrip/single_word false),
 * normalizer null or an empty Sequence, pre_tokenizer ByteLevel or a Sequence
 * of Split (Regex or String pattern, behavior Isolated or Removed, invert
 * false) ending in ByteLevel (add_prefix_space false), decoder ByteLevel.
 * Regexes run on PCRE2 (UTF + UCP, JIT).
 *
 * Input text must be well-formed UTF-8: encode rejects anything else with
 * MOEQ_ERR_FORMAT and the byte offset of the first bad sequence (never
 * replaces, never crashes). Decoding ids that form invalid UTF-8 (a byte token
 * cut mid-character) yields U+FFFD per maximal bad subsequence, as the
 * reference does.
 *
 * Threading: a tokenizer is immutable after load; every function taking a
 * `const moeq_tokenizer *` is safe from many threads at once (the pre-token
 * cache inside is lock-striped). A moeq_tokenizer_stream belongs to one
 * thread at a time.
 *
 * What it does not do: normalizers other than identity, Unigram/WordPiece
 * models, truncation/padding, offsets, general Jinja (chat formats are
 * built in and chosen from tokenizer_config.json).
 */
#ifndef MOEQ_TOKENIZER_H
#define MOEQ_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moeq_tokenizer moeq_tokenizer;

/* A growable id vector the caller owns and reuses across calls (no per-call
 * allocation once it is large enough). Zero-initialise; free with
 * moeq_tokens_free. Functions that fill it append at ids[n]. */
typedef struct moeq_tokens {
    int32_t *ids;
    size_t n, cap;
} moeq_tokens;

void moeq_tokens_free(moeq_tokens *tokens);

/* Chat formats built into the library (chosen from tokenizer_config.json). */
typedef enum moeq_chat_format {
    MOEQ_CHAT_FORMAT_NONE = 0,    /* no chat_template, or one we do not know  */
    MOEQ_CHAT_FORMAT_DEEPSEEK_V3, /* <｜User｜> / <｜Assistant｜> turns, bos first */
} moeq_chat_format;

/* ---- loading ---------------------------------------------------------------- */

/*
 * Load dir/tokenizer.json and, when present, dir/tokenizer_config.json (bos,
 * eos, add_bos_token, chat_template). Returns MOEQ_ERR_NOT_FOUND / IO when
 * tokenizer.json cannot be read, PARSE for bad JSON, FORMAT / UNSUPPORTED
 * naming the key at fault. On success *out owns everything (destroy it).
 */
moeq_err moeq_tokenizer_load(const char *dir, moeq_tokenizer **out, char *errstr,
                             size_t errstr_size);

/* Same from memory: tokenizer_json[0..json_len), config_json may be NULL. The
 * buffers are borrowed for the call only. */
moeq_err moeq_tokenizer_load_json(const char *tokenizer_json, size_t json_len,
                                  const char *config_json, size_t config_len,
                                  moeq_tokenizer **out, char *errstr, size_t errstr_size);

/* The built-in 1024-id tokenizer of the `tiny` test model (embedded in the
 * library; the same files moeq_tokenizer_export writes for vocab 1024). */
moeq_err moeq_tokenizer_load_tiny(moeq_tokenizer **out, char *errstr, size_t errstr_size);

/* Free everything. NULL is a no-op. */
void moeq_tokenizer_destroy(moeq_tokenizer *tok);

/* ---- properties -------------------------------------------------------------- */

/* 1 + the largest id of the vocabulary and added tokens (ids in between that
 * name no token are rejected by decode). DeepSeek-V3: 128815. */
int moeq_tokenizer_n_ids(const moeq_tokenizer *tok);
/* bos / eos ids from tokenizer_config.json (-1 when absent or unknown). */
int moeq_tokenizer_bos_id(const moeq_tokenizer *tok);
int moeq_tokenizer_eos_id(const moeq_tokenizer *tok);
/* tokenizer_config.json add_bos_token (DeepSeek-V3: 1); 0 when absent. */
int moeq_tokenizer_add_bos(const moeq_tokenizer *tok);
moeq_chat_format moeq_tokenizer_chat_format(const moeq_tokenizer *tok);
/* Id of a token given by its text (vocabulary or added token), or -1. */
int moeq_tokenizer_token_id(const moeq_tokenizer *tok, const char *token);
/* 1 when id is an added token marked special (bos, eos, <｜User｜> is not). */
int moeq_tokenizer_is_special(const moeq_tokenizer *tok, int id);
/* The bytes id decodes to (the ByteLevel rule applied; borrowed, valid while tok lives): returns 0 for a
 * vocabulary token, 1 for an added token, -1 for an id that names no token. Structured output walks these. */
int moeq_tokenizer_token_bytes(const moeq_tokenizer *tok, int id, const char **bytes, size_t *len);

/* ---- encode ------------------------------------------------------------------ */

enum {
    /* Prepend bos (what transformers does for add_bos_token models). The HF
     * `tokenizers` reference alone never adds it for DeepSeek-V3. */
    MOEQ_TOKENIZE_ADD_BOS = 1u << 0,
    /* Treat added-token text (e.g. "<｜User｜>") as plain text: it is
     * BPE-encoded instead of becoming the added token's id. */
    MOEQ_TOKENIZE_NO_ADDED = 1u << 1,
};

/*
 * Encode text[0..len) and append the ids to *out. flags: MOEQ_TOKENIZE_*.
 * Errors: MOEQ_ERR_FORMAT for invalid UTF-8 ("at byte offset N"); NOMEM.
 * On error *out keeps its earlier contents (out->n is restored).
 * Thread-safe (see the file comment).
 */
moeq_err moeq_tokenizer_encode(const moeq_tokenizer *tok, const char *text, size_t len,
                               unsigned flags, moeq_tokens *out, char *errstr,
                               size_t errstr_size);

/* ---- decode ------------------------------------------------------------------ */

enum {
    MOEQ_DECODE_SKIP_SPECIAL = 1u << 0, /* drop added tokens marked special */
};

/*
 * Decode ids[0..n) to UTF-8 (malloc'd, NUL-terminated, caller frees; its
 * length in *out_len when not NULL). Bytes that do not form UTF-8 become
 * U+FFFD as in the reference. MOEQ_ERR_INVALID_ARG names an id that is out of
 * range or names no token.
 */
moeq_err moeq_tokenizer_decode(const moeq_tokenizer *tok, const int32_t *ids, size_t n,
                               unsigned flags, char **out, size_t *out_len, char *errstr,
                               size_t errstr_size);

/*
 * Streaming decode: feed ids one at a time and get back only text that ends
 * on a complete UTF-8 character; an incomplete tail is held until the next
 * id completes it. The concatenation of every push and the final flush
 * equals moeq_tokenizer_decode of all the ids.
 */
typedef struct moeq_tokenizer_stream moeq_tokenizer_stream;

/* tok is borrowed and must outlive the stream. NULL on allocation failure. */
moeq_tokenizer_stream *moeq_tokenizer_stream_new(const moeq_tokenizer *tok, unsigned flags);
void moeq_tokenizer_stream_destroy(moeq_tokenizer_stream *stream);

/*
 * Push one id. *text / *text_len receive the newly completed text (possibly
 * empty), borrowed from the stream and valid until its next call.
 * MOEQ_ERR_INVALID_ARG for an unknown id (the stream is unchanged).
 */
moeq_err moeq_tokenizer_stream_push(moeq_tokenizer_stream *stream, int32_t id,
                                    const char **text, size_t *text_len, char *errstr,
                                    size_t errstr_size);

/* End of stream: a held incomplete tail comes out as U+FFFD. Resets the
 * stream for reuse. Same borrowing as push. */
void moeq_tokenizer_stream_flush(moeq_tokenizer_stream *stream, const char **text,
                                 size_t *text_len);

/* ---- chat -------------------------------------------------------------------- */

/* One turn. role: "system", "user", "assistant" or "tool"; content:
 * NUL-terminated UTF-8. Both borrowed for the call. */
typedef struct moeq_chat_message {
    const char *role;
    const char *content;
} moeq_chat_message;

/*
 * Render messages[0..n) in the tokenizer's chat format (as its Jinja
 * chat_template would, without tool calls) into a malloc'd NUL-terminated
 * string (caller frees). add_generation_prompt: end with the assistant
 * header so the model answers. MOEQ_ERR_UNSUPPORTED when the tokenizer has no
 * known chat format; INVALID_ARG naming a message with an unknown role.
 */
moeq_err moeq_tokenizer_render_chat(const moeq_tokenizer *tok, const moeq_chat_message *messages,
                                    size_t n, int add_generation_prompt, char **out,
                                    char *errstr, size_t errstr_size);

/*
 * Render as above and encode (added tokens recognised, no extra bos: the
 * template writes it), appending to *out. Errors as render and encode.
 */
moeq_err moeq_tokenizer_apply_chat(const moeq_tokenizer *tok, const moeq_chat_message *messages,
                                   size_t n, int add_generation_prompt, moeq_tokens *out,
                                   char *errstr, size_t errstr_size);

/* ---- checkpoints ------------------------------------------------------------- */

/*
 * Write tokenizer.json + tokenizer_config.json into out_dir (which must
 * exist) for a generated checkpoint with this vocabulary size: 1024 → the
 * built-in tiny tokenizer; 129280 → DeepSeek-V3's files, copied from
 * $MOEQ_TOKENIZER_DIR or else <source dir>/.deps/tokenizers/deepseek_v3/
 * (put there by scripts/setup.sh; MOEQ_ERR_NOT_FOUND when absent). Any other
 * size: MOEQ_ERR_UNSUPPORTED.
 */
moeq_err moeq_tokenizer_export(const char *out_dir, int vocab_size, char *errstr,
                               size_t errstr_size);

#ifdef __cplusplus
}
#endif
#endif
