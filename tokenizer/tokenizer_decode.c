/*
 * tokenizer_decode.c — ids to text, whole or streaming.
 *
 * Each id stands for bytes (the ByteLevel decoder's rule, applied once at
 * load); the concatenation is turned into UTF-8 the way Rust's
 * String::from_utf8_lossy does (what the reference returns): one U+FFFD per
 * maximal subpart of an ill-formed sequence. The streaming decoder holds back
 * only an incomplete trailing character, so its output concatenates to the
 * whole decode. It does not strip spaces or clean up tokenization.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

/* Length of the well-formed prefix of the sequence at in[0..n) (stops at the
 * first byte that cannot continue it), and the length it needs in *need. */
static size_t utf8_prefix(const uint8_t *in, size_t n, size_t *need) {
    uint8_t b = in[0], lo = 0x80, hi = 0xBF;
    if (b < 0x80) return *need = 1, 1;
    if (b >= 0xC2 && b <= 0xDF) *need = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        *need = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        *need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else
        return *need = 1, 0; /* never a lead byte */
    size_t k = 1;
    for (; k < *need && k < n; k++) {
        uint8_t lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
        if (in[k] < lo_k || in[k] > hi_k) break;
    }
    return k;
}

size_t moeq_tok_utf8_lossy(const uint8_t *in, size_t n, int final, char *out, size_t *out_len) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, o = *out_len;
    while (i < n) {
        if (in[i] < 0x80) { /* ASCII fast path */
            out[o++] = (char)in[i++];
            continue;
        }
        size_t need, k = utf8_prefix(in + i, n - i, &need);
        if (k == need) {
            memcpy(out + o, in + i, k);
            o += k, i += k;
        } else if (i + k == n && !final && k > 0) {
            break; /* incomplete at the end: wait for more bytes */
        } else {
            memcpy(out + o, fffd, 3);
            o += 3;
            i += k ? k : 1;
        }
    }
    *out_len = o;
    return i;
}

static int id_ok(const moeq_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && tok->tok_len[id] != TOK_NO_TOKEN;
}

static int id_skipped(const moeq_tokenizer *tok, int32_t id, unsigned flags) {
    return (flags & MOEQ_DECODE_SKIP_SPECIAL) && (tok->tok_flags[id] & TOK_FLAG_SPECIAL);
}

moeq_err moeq_tokenizer_decode(const moeq_tokenizer *tok, const int32_t *ids, size_t n,
                               unsigned flags, char **out, size_t *out_len, char *errstr,
                               size_t errstr_size) {
    if (!tok || !out || (!ids && n))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "tokenizer_decode: NULL argument");
    *out = NULL;
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (!id_ok(tok, ids[i]))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                             "tokenizer_decode: ids[%zu] = %d names no token (n_ids %d)", i,
                             (int)ids[i], tok->n_ids);
        if (!id_skipped(tok, ids[i], flags)) bytes += tok->tok_len[ids[i]];
    }
    uint8_t *raw = malloc(bytes + 1);
    char *text = malloc(3 * bytes + 1);
    if (!raw || !text) {
        free(raw);
        free(text);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "tokenizer_decode: out of memory");
    }
    size_t r = 0, len = 0;
    for (size_t i = 0; i < n; i++) {
        if (id_skipped(tok, ids[i], flags)) continue;
        memcpy(raw + r, tok->tok_data + tok->tok_off[ids[i]], tok->tok_len[ids[i]]);
        r += tok->tok_len[ids[i]];
    }
    moeq_tok_utf8_lossy(raw, r, 1, text, &len);
    free(raw);
    text[len] = 0;
    *out = text;
    if (out_len) *out_len = len;
    return MOEQ_OK;
}

/* ---- streaming ------------------------------------------------------------------- */

struct moeq_tokenizer_stream {
    const moeq_tokenizer *tok;
    unsigned flags;
    uint8_t *pending; /* held incomplete tail (< 4 bytes) + the new token's bytes */
    size_t n_pending, pending_cap;
    char *text; /* last output */
    size_t text_cap;
};

moeq_tokenizer_stream *moeq_tokenizer_stream_new(const moeq_tokenizer *tok, unsigned flags) {
    if (!tok) return NULL;
    moeq_tokenizer_stream *stream = calloc(1, sizeof *stream);
    if (!stream) return NULL;
    stream->tok = tok;
    stream->flags = flags;
    return stream;
}

void moeq_tokenizer_stream_destroy(moeq_tokenizer_stream *stream) {
    if (!stream) return;
    free(stream->pending);
    free(stream->text);
    free(stream);
}

static int grow(void **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = need < 64 ? 64 : 2 * need;
    void *p = realloc(*buf, c);
    if (!p) return -1;
    *buf = p;
    *cap = c;
    return 0;
}

moeq_err moeq_tokenizer_stream_push(moeq_tokenizer_stream *stream, int32_t id,
                                    const char **text, size_t *text_len, char *errstr,
                                    size_t errstr_size) {
    if (!stream || !text || !text_len)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "tokenizer_stream: NULL argument");
    const moeq_tokenizer *tok = stream->tok;
    *text = "";
    *text_len = 0;
    if (!id_ok(tok, id))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "tokenizer_stream: id %d names no token (n_ids %d)", (int)id, tok->n_ids);
    if (id_skipped(tok, id, stream->flags)) return MOEQ_OK;
    size_t len = tok->tok_len[id], total = stream->n_pending + len;
    if (grow((void **)&stream->pending, &stream->pending_cap, total) < 0 ||
        grow((void **)&stream->text, &stream->text_cap, 3 * total + 1) < 0)
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "tokenizer_stream: out of memory");
    memcpy(stream->pending + stream->n_pending, tok->tok_data + tok->tok_off[id], len);
    size_t out = 0, used = moeq_tok_utf8_lossy(stream->pending, total, 0, stream->text, &out);
    memmove(stream->pending, stream->pending + used, total - used);
    stream->n_pending = total - used;
    stream->text[out] = 0;
    *text = stream->text;
    *text_len = out;
    return MOEQ_OK;
}

void moeq_tokenizer_stream_flush(moeq_tokenizer_stream *stream, const char **text,
                                 size_t *text_len) {
    *text = "";
    *text_len = 0;
    if (!stream || !stream->n_pending) return;
    size_t out = 0;
    /* n_pending < 4, so 3 * n_pending + 1 bytes fit in the buffer push grew. */
    moeq_tok_utf8_lossy(stream->pending, stream->n_pending, 1, stream->text, &out);
    stream->n_pending = 0;
    stream->text[out] = 0;
    *text = stream->text;
    *text_len = out;
}
