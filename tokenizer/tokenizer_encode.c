/*
 * tokenizer_encode.c — text to ids, as HF `tokenizers` does it:
 *
 *   1. added tokens: leftmost-longest matches of the non-normalized added
 *      tokens on the raw text, then of the normalized ones in the gaps (the
 *      normalizer is the identity, checked at load);
 *   2. pre-tokenizer: each gap goes through the Split steps in order, every
 *      piece (match or gap) of one step being split again by the next, each
 *      piece a separate regex subject (so `(?!\S)` stops at its end);
 *   3. ByteLevel + BPE: a piece's bytes start as byte symbols and are merged
 *      lowest rank first (leftmost among equals) with a binary heap and a
 *      linked list, O(n log n) — never by rescanning.
 *
 * Short pieces' results are cached (tokenizer_cache.c).
 * Nothing here allocates per token: scratch grows with the longest piece and
 * lives for one call. It does not validate configuration (tokenizer.c did).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/util.h"
#include "tokenizer_internal.h"

/* ---- one encode call's state ----------------------------------------------------- */

typedef struct bpe_sym {
    int32_t id; /* -1 once merged into its left neighbour */
    int32_t prev, next;
} bpe_sym;

typedef struct enc_ctx {
    const moeq_tokenizer *tok;
    moeq_tokens *out;
    pcre2_match_data *md;
    bpe_sym *sym;   /* scratch for the current piece */
    uint64_t *heap; /* (rank << 32 | position), min-heap */
    size_t cap;     /* symbols the scratch holds */
    int no_added;
    int regex_rc;   /* a PCRE2 error code (match or JIT stack limit), 0 if none */
} enc_ctx;

static int push_id(enc_ctx *ctx, int32_t id) {
    moeq_tokens *out = ctx->out;
    if (out->n == out->cap) {
        size_t cap = out->cap ? 2 * out->cap : 256;
        int32_t *ids = realloc(out->ids, cap * sizeof *ids);
        if (!ids) return -1;
        out->ids = ids;
        out->cap = cap;
    }
    out->ids[out->n++] = id;
    return 0;
}

static int scratch_reserve(enc_ctx *ctx, size_t n) {
    if (n <= ctx->cap) return 0;
    size_t cap = n < 256 ? 256 : 2 * n;
    bpe_sym *sym = realloc(ctx->sym, cap * sizeof *sym);
    if (!sym) return -1;
    ctx->sym = sym;
    uint64_t *heap = realloc(ctx->heap, 3 * cap * sizeof *heap);
    if (!heap) return -1;
    ctx->heap = heap;
    ctx->cap = cap;
    return 0;
}

/* ---- BPE ----------------------------------------------------------------------------- */

static void heap_push(uint64_t *heap, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && heap[(i - 1) / 2] > v) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = v;
}

static uint64_t heap_pop(uint64_t *heap, size_t *n) {
    uint64_t top = heap[0], v = heap[--*n];
    size_t i = 0, len = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= len) break;
        if (c + 1 < len && heap[c + 1] < heap[c]) c++;
        if (heap[c] >= v) break;
        heap[i] = heap[c];
        i = c;
    }
    if (len) heap[i] = v;
    return top;
}

/* Queue the pair starting at symbol pos when it has a merge. */
static void queue_pair(enc_ctx *ctx, size_t *n_heap, int32_t pos) {
    if (pos < 0) return;
    int32_t next = ctx->sym[pos].next, merged;
    if (next < 0) return;
    int32_t rank = moeq_tok_merge_find(ctx->tok, ctx->sym[pos].id, ctx->sym[next].id, &merged);
    if (rank >= 0) heap_push(ctx->heap, n_heap, ((uint64_t)rank << 32) | (uint32_t)pos);
}

/* Merge the symbols of s[0..n) in place; the survivors are linked from 0. */
static void bpe_merge(enc_ctx *ctx, const uint8_t *s, size_t n) {
    bpe_sym *sym = ctx->sym;
    size_t n_heap = 0;
    for (size_t i = 0; i < n; i++)
        sym[i] = (bpe_sym){ctx->tok->byte_id[s[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    for (size_t i = 0; i + 1 < n; i++) queue_pair(ctx, &n_heap, (int32_t)i);
    while (n_heap) {
        uint64_t top = heap_pop(ctx->heap, &n_heap);
        int32_t pos = (int32_t)(uint32_t)top, rank = (int32_t)(top >> 32), merged = -1;
        int32_t next = sym[pos].next;
        /* Stale entry: pos was merged away or its right neighbour changed. */
        if (sym[pos].id < 0 || next < 0 ||
            moeq_tok_merge_find(ctx->tok, sym[pos].id, sym[next].id, &merged) != rank)
            continue;
        sym[pos].id = merged;
        sym[next].id = -1;
        sym[pos].next = sym[next].next;
        if (sym[pos].next >= 0) sym[sym[pos].next].prev = pos;
        queue_pair(ctx, &n_heap, sym[pos].prev);
        queue_pair(ctx, &n_heap, pos);
    }
}

/* BPE-encode one pre-token piece and append its ids. */
static int encode_piece(enc_ctx *ctx, const char *s, size_t n) {
    const moeq_tokenizer *tok = ctx->tok;
    if (n == 1) return push_id(ctx, tok->byte_id[(uint8_t)s[0]]);
    uint64_t hash = 0;
    if (n <= MOEQ_TOK_CACHE_KEY_MAX) {
        int32_t ids[MOEQ_TOK_CACHE_IDS_MAX];
        hash = moeq_tok_hash(s, n);
        int k = moeq_tok_cache_get(tok->cache, hash, s, n, ids);
        for (int i = 0; i < k; i++)
            if (push_id(ctx, ids[i]) < 0) return -1;
        if (k >= 0) return 0;
    }
    if (scratch_reserve(ctx, n) < 0) return -1;
    bpe_merge(ctx, (const uint8_t *)s, n);
    size_t first = ctx->out->n;
    for (int32_t i = 0; i >= 0; i = ctx->sym[i].next)
        if (push_id(ctx, ctx->sym[i].id) < 0) return -1;
    size_t k = ctx->out->n - first;
    if (n <= MOEQ_TOK_CACHE_KEY_MAX && k <= MOEQ_TOK_CACHE_IDS_MAX)
        moeq_tok_cache_put(tok->cache, hash, s, n, ctx->out->ids + first, k);
    return 0;
}

/* ---- pre-tokenizer --------------------------------------------------------------------- */

static int split_piece(enc_ctx *ctx, int level, const char *s, size_t len);

static int find_match(enc_ctx *ctx, const tok_split *sp, const char *s, size_t len, size_t from,
                      size_t *ms, size_t *me) {
    int rc = sp->jit ? pcre2_jit_match(sp->re, (PCRE2_SPTR)s, len, from, 0, ctx->md, NULL)
                     : pcre2_match(sp->re, (PCRE2_SPTR)s, len, from, PCRE2_NO_UTF_CHECK, ctx->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return ctx->regex_rc = rc, -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ctx->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* Split s[0..len) by Split step `level`; each piece goes on to level + 1. */
static int split_piece(enc_ctx *ctx, int level, const char *s, size_t len) {
    if (len == 0) return 0;
    if (level == ctx->tok->n_splits) return encode_piece(ctx, s, len);
    const tok_split *sp = &ctx->tok->splits[level];
    size_t from = 0, last = 0, ms, me;
    int found;
    while (from <= len && (found = find_match(ctx, sp, s, len, from, &ms, &me)) > 0) {
        if (me == ms) { /* empty match: no piece; step over one character */
            from = me + 1;
            while (from < len && ((uint8_t)s[from] & 0xC0) == 0x80) from++;
            continue;
        }
        if (split_piece(ctx, level + 1, s + last, ms - last) < 0) return -1;
        if (sp->behavior == TOK_SPLIT_ISOLATED && split_piece(ctx, level + 1, s + ms, me - ms) < 0)
            return -1;
        last = from = me;
    }
    if (found < 0) return -1;
    return split_piece(ctx, level + 1, s + last, len - last);
}

/* ---- added tokens ------------------------------------------------------------------------- */

/* Longest added token at the start of s[0..len): its id and length, or -1. */
static int32_t trie_longest(const tok_trie *trie, const char *s, size_t len, size_t *match_len) {
    int32_t node = 0, best = -1;
    for (size_t i = 0; i < len; i++) {
        int32_t child = trie->nodes[node].child;
        while (child >= 0 && trie->nodes[child].byte != (uint8_t)s[i])
            child = trie->nodes[child].sibling;
        if (child < 0) break;
        node = child;
        if (trie->nodes[node].id >= 0) best = trie->nodes[node].id, *match_len = i + 1;
    }
    return best;
}

/* level 0: non-normalized added tokens, 1: normalized ones, 2: pre-tokenize. */
static int split_added(enc_ctx *ctx, int level, const char *s, size_t len) {
    if (len == 0) return 0;
    if (level == 2) return split_piece(ctx, 0, s, len);
    const tok_trie *trie = level == 0 ? &ctx->tok->added_raw : &ctx->tok->added_norm;
    if (ctx->no_added || trie->n_tokens == 0) return split_added(ctx, level + 1, s, len);
    size_t last = 0, match_len = 0;
    for (size_t i = 0; i < len; i++) {
        if (!trie->first[(uint8_t)s[i]]) continue;
        int32_t id = trie_longest(trie, s + i, len - i, &match_len);
        if (id < 0) continue;
        if (split_added(ctx, level + 1, s + last, i - last) < 0 || push_id(ctx, id) < 0) return -1;
        i += match_len - 1;
        last = i + 1;
    }
    return split_added(ctx, level + 1, s + last, len - last);
}

/* ---- public ---------------------------------------------------------------------------------- */

moeq_err moeq_tokenizer_encode(const moeq_tokenizer *tok, const char *text, size_t len,
                               unsigned flags, moeq_tokens *out, char *errstr,
                               size_t errstr_size) {
    if (!tok || !out || (!text && len))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "tokenizer_encode: NULL argument");
    size_t bad;
    if (!moeq_utf8_valid(text, len, &bad))
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size,
                         "tokenizer_encode: input is not valid UTF-8 at byte offset %zu", bad);
    enc_ctx ctx = {.tok = tok, .out = out, .no_added = !!(flags & MOEQ_TOKENIZE_NO_ADDED)};
    size_t saved = out->n;
    int rc = -1;
    if (!(ctx.md = pcre2_match_data_create(1, NULL))) goto fail;
    if ((flags & MOEQ_TOKENIZE_ADD_BOS) && tok->bos_id >= 0 && push_id(&ctx, tok->bos_id) < 0) goto fail;
    rc = split_added(&ctx, 0, text ? text : "", len);
fail:
    pcre2_match_data_free(ctx.md);
    free(ctx.sym);
    free(ctx.heap);
    if (rc == 0) return MOEQ_OK;
    out->n = saved;
    if (ctx.regex_rc) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ctx.regex_rc, msg, sizeof msg);
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size,
                         "tokenizer_encode: pre_tokenizer regex failed on %zu bytes: %s", len,
                         (const char *)msg);
    }
    return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "tokenizer_encode: out of memory");
}
