/*
 * tokenizer.c — loading a Hugging Face tokenizer.json (+ tokenizer_config.json)
 * into an immutable moeq_tokenizer, and its small accessors.
 *
 * Everything is validated here, once: unsupported configurations are
 * rejected with the key that names them, so encode and decode (tokenizer_
 * encode.c, tokenizer_decode.c) only assert. It does not encode, decode or
 * render chats, and does no I/O beyond reading the two files in
 * moeq_tokenizer_load.
 */
#include <assert.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/util.h"
#include "tokenizer_internal.h"

#define TOK_MAX_ID (1 << 24)             /* ids above are rejected as corrupt    */
#define TOK_MAX_JSON_BYTES (256u << 20)  /* tokenizer.json size limit            */
#define E(...) moeq_errf(__VA_ARGS__)

/* ---- ByteLevel alphabet (GPT-2 bytes_to_unicode) ----------------------------- */

static int byte_is_printable(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
}

uint32_t moeq_tok_byte_to_cp(uint8_t byte) {
    if (byte_is_printable(byte)) return byte;
    uint32_t n = 0; /* index among the non-printable bytes below this one */
    for (unsigned b = 0; b < byte; b++) n += !byte_is_printable(b);
    return 256 + n;
}

int moeq_tok_cp_to_byte(uint32_t cp) {
    static int16_t table[256 + 68];
    static int ready; /* benign: every thread computes the same table */
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        int16_t t[256 + 68];
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) t[i] = -1;
        for (unsigned b = 0; b < 256; b++) t[moeq_tok_byte_to_cp((uint8_t)b)] = (int16_t)b;
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
            __atomic_store_n(&table[i], t[i], __ATOMIC_RELAXED);
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    return cp < sizeof table / sizeof table[0] ? __atomic_load_n(&table[cp], __ATOMIC_RELAXED)
                                               : -1;
}

/* Decode one UTF-8 character of well-formed s[0..len); returns its length. */
static size_t utf8_next(const char *s, size_t len, uint32_t *cp) {
    const uint8_t *u = (const uint8_t *)s;
    if (u[0] < 0x80 || len < 2) return *cp = u[0], 1;
    if (u[0] < 0xE0) return *cp = ((u[0] & 0x1Fu) << 6) | (u[1] & 0x3Fu), 2;
    if (u[0] < 0xF0 || len < 4) {
        *cp = ((u[0] & 0x0Fu) << 12) | ((u[1] & 0x3Fu) << 6) | (u[2] & 0x3Fu);
        return 3;
    }
    *cp = ((u[0] & 0x07u) << 18) | ((u[1] & 0x3Fu) << 12) | ((u[2] & 0x3Fu) << 6) | (u[3] & 0x3Fu);
    return 4;
}

/*
 * The ByteLevel decoder's rule for one token: when every character is in the
 * byte alphabet, the bytes they stand for; otherwise the token's own UTF-8
 * (e.g. "<｜User｜>"). Writes at most len bytes to out.
 */
static size_t bytelevel_decode(const char *s, size_t len, char *out) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += utf8_next(s + i, len - i, &cp);
        int b = moeq_tok_cp_to_byte(cp);
        if (b < 0) {
            memcpy(out, s, len);
            return len;
        }
        out[n++] = (char)b;
    }
    return n;
}

/* ---- token string table ---------------------------------------------------- */

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

/* Insert (or, with replace, overwrite) s -> id. Strings live in tok->str_data
 * at off (the caller appended them). */
static void str_put(moeq_tokenizer *tok, uint32_t off, uint32_t len, int32_t id, int replace) {
    size_t i = (size_t)moeq_tok_hash(tok->str_data + off, len) & tok->str_mask;
    for (;; i = (i + 1) & tok->str_mask) {
        tok_str_slot *s = &tok->str_slots[i];
        if (s->len == TOK_NO_TOKEN) {
            *s = (tok_str_slot){off, len, id};
            return;
        }
        if (s->len == len && !memcmp(tok->str_data + s->off, tok->str_data + off, len)) {
            if (replace) s->id = id;
            return;
        }
    }
}

static int32_t str_find(const moeq_tokenizer *tok, const char *s, size_t len) {
    size_t i = (size_t)moeq_tok_hash(s, len) & tok->str_mask;
    for (;; i = (i + 1) & tok->str_mask) {
        const tok_str_slot *slot = &tok->str_slots[i];
        if (slot->len == TOK_NO_TOKEN) return -1;
        if (slot->len == len && !memcmp(tok->str_data + slot->off, s, len)) return slot->id;
    }
}

/* ---- trie of added tokens ---------------------------------------------------- */

static int trie_add(tok_trie *trie, const char *s, size_t len, int32_t id) {
    if (!trie->nodes) {
        trie->cap = 256;
        trie->nodes = malloc((size_t)trie->cap * sizeof *trie->nodes);
        if (!trie->nodes) return -1;
        trie->nodes[0] = (tok_trie_node){-1, -1, -1, 0};
        trie->n = 1;
    }
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        int32_t child = trie->nodes[node].child;
        while (child >= 0 && trie->nodes[child].byte != c) child = trie->nodes[child].sibling;
        if (child < 0) {
            if (trie->n == trie->cap) {
                tok_trie_node *grown = realloc(trie->nodes, 2 * (size_t)trie->cap * sizeof *grown);
                if (!grown) return -1;
                trie->nodes = grown;
                trie->cap *= 2;
            }
            child = trie->n++;
            trie->nodes[child] = (tok_trie_node){-1, trie->nodes[node].child, -1, c};
            trie->nodes[node].child = child;
        }
        node = child;
    }
    trie->nodes[node].id = id;
    trie->first[(uint8_t)s[0]] = 1;
    trie->n_tokens++;
    return 0;
}

/* ---- JSON helpers -------------------------------------------------------------- */

static const cJSON *obj_get(const cJSON *obj, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* 1 when key is absent, null, false, "" or an empty array/object. */
static int is_unset(const cJSON *obj, const char *key) {
    const cJSON *v = obj_get(obj, key);
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) ||
           (cJSON_IsString(v) && !v->valuestring[0]) ||
           ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child);
}

static int is_type(const cJSON *obj, const char *type) {
    const cJSON *t = obj_get(obj, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, type);
}

static const char *type_of(const cJSON *obj) {
    const cJSON *t = obj_get(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : "(none)";
}

/* ---- model.vocab + added_tokens -> id tables ---------------------------------- */

static moeq_err load_ids(moeq_tokenizer *tok, const cJSON *vocab, const cJSON *added,
                         char *errstr, size_t errstr_size) {
    int32_t max_id = -1;
    size_t n_strings = 0, str_bytes = 0;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= TOK_MAX_ID)
            return E(MOEQ_ERR_FORMAT, errstr, errstr_size,
                     "tokenizer.json: model.vocab[\"%s\"] is not an id in [0, %d)", v->string,
                     TOK_MAX_ID);
        if (v->valueint > max_id) max_id = v->valueint;
        n_strings++;
        str_bytes += strlen(v->string);
    }
    int i = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, i++) {
        const cJSON *id = obj_get(a, "id"), *content = obj_get(a, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= TOK_MAX_ID ||
            !cJSON_IsString(content) || !content->valuestring[0])
            return E(MOEQ_ERR_FORMAT, errstr, errstr_size,
                     "tokenizer.json: added_tokens[%d] needs an id in [0, %d) and a non-empty content",
                     i, TOK_MAX_ID);
        if (id->valueint > max_id) max_id = id->valueint;
        n_strings++;
        str_bytes += strlen(content->valuestring);
    }
    if (max_id < 0) return E(MOEQ_ERR_FORMAT, errstr, errstr_size, "tokenizer.json: model.vocab is empty");
    tok->n_ids = max_id + 1;
    tok->tok_off = malloc((size_t)tok->n_ids * sizeof *tok->tok_off);
    tok->tok_len = malloc((size_t)tok->n_ids * sizeof *tok->tok_len);
    tok->tok_flags = calloc((size_t)tok->n_ids, 1);
    tok->tok_data = malloc(str_bytes + 1);
    tok->str_data = malloc(str_bytes + 1);
    tok->str_mask = pow2_at_least(2 * n_strings) - 1;
    tok->str_slots = malloc((tok->str_mask + 1) * sizeof *tok->str_slots);
    if (!tok->tok_off || !tok->tok_len || !tok->tok_flags || !tok->tok_data || !tok->str_data ||
        !tok->str_slots)
        return E(MOEQ_ERR_NOMEM, errstr, errstr_size, "tokenizer: out of memory for %d ids", tok->n_ids);
    for (int32_t id = 0; id < tok->n_ids; id++) tok->tok_len[id] = TOK_NO_TOKEN;
    for (size_t s = 0; s <= tok->str_mask; s++) tok->str_slots[s].len = TOK_NO_TOKEN;
    /* Vocabulary first, then added tokens (which win, as in HF's id_to_token).
     * Only the vocabulary enters the string table here: merges and byte
     * symbols name model tokens; load_added adds the added tokens after. */
    size_t data_len = 0;
    for (int pass = 0; pass < 2; pass++) {
        const cJSON *list = pass == 0 ? vocab : added;
        for (const cJSON *v = list ? list->child : NULL; v; v = v->next) {
            const char *s = pass == 0 ? v->string : obj_get(v, "content")->valuestring;
            int32_t id = pass == 0 ? v->valueint : obj_get(v, "id")->valueint;
            size_t len = strlen(s);
            if (pass == 0) {
                memcpy(tok->str_data + tok->str_data_len, s, len);
                str_put(tok, (uint32_t)tok->str_data_len, (uint32_t)len, id, 0);
                tok->str_data_len += len;
            }
            if (tok->tok_len[id] != TOK_NO_TOKEN && pass == 0)
                return E(MOEQ_ERR_FORMAT, errstr, errstr_size,
                         "tokenizer.json: model.vocab has id %d twice", id);
            tok->tok_off[id] = (uint32_t)data_len;
            tok->tok_len[id] = (uint32_t)bytelevel_decode(s, len, tok->tok_data + data_len);
            data_len += tok->tok_len[id];
        }
    }
    return MOEQ_OK;
}

static moeq_err load_added(moeq_tokenizer *tok, const cJSON *added, char *errstr,
                           size_t errstr_size) {
    int i = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, i++) {
        static const char *const unsupported[] = {"single_word", "lstrip", "rstrip"};
        for (size_t k = 0; k < sizeof unsupported / sizeof unsupported[0]; k++)
            if (!is_unset(a, unsupported[k]))
                return E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "tokenizer.json: added_tokens[%d].%s = true is not supported", i,
                         unsupported[k]);
        const char *content = obj_get(a, "content")->valuestring;
        int32_t id = obj_get(a, "id")->valueint;
        size_t len = strlen(content);
        memcpy(tok->str_data + tok->str_data_len, content, len);
        str_put(tok, (uint32_t)tok->str_data_len, (uint32_t)len, id, 1);
        tok->str_data_len += len;
        tok->tok_flags[id] |= TOK_FLAG_ADDED;
        if (cJSON_IsTrue(obj_get(a, "special"))) tok->tok_flags[id] |= TOK_FLAG_SPECIAL;
        tok_trie *trie = cJSON_IsTrue(obj_get(a, "normalized")) ? &tok->added_norm : &tok->added_raw;
        if (trie_add(trie, content, len, id) < 0)
            return E(MOEQ_ERR_NOMEM, errstr, errstr_size, "tokenizer: out of memory");
    }
    return MOEQ_OK;
}

/* ---- model: BPE ------------------------------------------------------------------ */

static moeq_err merge_put(moeq_tokenizer *tok, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & tok->merges_mask;
    while (tok->merges[i].key != UINT64_MAX && tok->merges[i].key != key)
        i = (i + 1) & tok->merges_mask;
    /* A repeated pair keeps its last rank, as HF's HashMap collect does. */
    tok->merges[i] = (tok_merge_slot){key, rank, id};
    return MOEQ_OK;
}

/* Split merge i ("a b" or ["a", "b"]) into its two halves. */
static int merge_halves(const cJSON *m, const char **a, size_t *a_len, const char **b,
                        size_t *b_len) {
    if (cJSON_IsString(m)) {
        const char *sp = strchr(m->valuestring, ' ');
        if (!sp) return -1;
        *a = m->valuestring, *a_len = (size_t)(sp - m->valuestring);
        *b = sp + 1, *b_len = strlen(sp + 1);
        return 0;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
        cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring, *a_len = strlen(*a);
        *b = m->child->next->valuestring, *b_len = strlen(*b);
        return 0;
    }
    return -1;
}

static moeq_err load_merges(moeq_tokenizer *tok, const cJSON *merges, char *errstr,
                            size_t errstr_size) {
    int n = cJSON_GetArraySize(merges);
    tok->merges_mask = pow2_at_least(2 * (size_t)n + 1) - 1;
    tok->merges = malloc((tok->merges_mask + 1) * sizeof *tok->merges);
    if (!tok->merges) return E(MOEQ_ERR_NOMEM, errstr, errstr_size, "tokenizer: out of memory");
    for (size_t i = 0; i <= tok->merges_mask; i++) tok->merges[i].key = UINT64_MAX;
    char *buf = NULL;
    size_t buf_cap = 0;
    moeq_err err = MOEQ_OK;
    int rank = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *a, *b;
        size_t a_len, b_len;
        if (merge_halves(m, &a, &a_len, &b, &b_len) < 0) {
            err = E(MOEQ_ERR_FORMAT, errstr, errstr_size,
                    "tokenizer.json: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", rank);
            goto free_buf;
        }
        if (a_len + b_len > buf_cap) {
            buf_cap = 2 * (a_len + b_len);
            free(buf);
            if (!(buf = malloc(buf_cap))) {
                err = E(MOEQ_ERR_NOMEM, errstr, errstr_size, "tokenizer: out of memory");
                goto free_buf;
            }
        }
        memcpy(buf, a, a_len);
        memcpy(buf + a_len, b, b_len);
        int32_t ia = str_find(tok, a, a_len), ib = str_find(tok, b, b_len);
        int32_t im = str_find(tok, buf, a_len + b_len);
        if (ia < 0 || ib < 0 || im < 0) {
            err = E(MOEQ_ERR_FORMAT, errstr, errstr_size,
                    "tokenizer.json: model.merges[%d] (\"%.*s\" + \"%.*s\") names a token not in model.vocab",
                    rank, (int)a_len, a, (int)b_len, b);
            goto free_buf;
        }
        merge_put(tok, ia, ib, rank, im);
    }
free_buf:
    free(buf);
    return err;
}

static moeq_err load_model(moeq_tokenizer *tok, const cJSON *model, const cJSON *added,
                           char *errstr, size_t errstr_size) {
    if (!cJSON_IsObject(model))
        return E(MOEQ_ERR_FORMAT, errstr, errstr_size, "tokenizer.json: no \"model\" object");
    if (!is_type(model, "BPE"))
        return E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                 "tokenizer.json: model.type \"%s\" is not supported (only BPE)", type_of(model));
    static const char *const unsupported[] = {"dropout", "byte_fallback", "ignore_merges",
                                              "continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t k = 0; k < sizeof unsupported / sizeof unsupported[0]; k++)
        if (!is_unset(model, unsupported[k]))
            return E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                     "tokenizer.json: model.%s is set; only byte-level BPE without it is supported",
                     unsupported[k]);
    const cJSON *vocab = obj_get(model, "vocab"), *merges = obj_get(model, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return E(MOEQ_ERR_FORMAT, errstr, errstr_size,
                 "tokenizer.json: model.vocab must be an object and model.merges an array");
    moeq_err err = load_ids(tok, vocab, added, errstr, errstr_size);
    if (err) return err;
    /* Byte symbols and merges name model tokens (added tokens join later). */
    for (unsigned b = 0; b < 256; b++) {
        char s[4];
        uint32_t cp = moeq_tok_byte_to_cp((uint8_t)b);
        size_t len = cp < 0x80 ? (s[0] = (char)cp, 1)
                               : (s[0] = (char)(0xC0 | (cp >> 6)), s[1] = (char)(0x80 | (cp & 0x3F)), 2);
        s[len] = 0;
        if ((tok->byte_id[b] = str_find(tok, s, len)) < 0)
            return E(MOEQ_ERR_FORMAT, errstr, errstr_size,
                     "tokenizer.json: model.vocab lacks the byte-level symbol \"%s\" (byte 0x%02x)", s, b);
    }
    return load_merges(tok, merges, errstr, errstr_size);
}

/* ---- normalizer, pre_tokenizer, decoder --------------------------------------------- */

static moeq_err check_normalizer(const cJSON *norm, char *errstr, size_t errstr_size) {
    if (!norm || cJSON_IsNull(norm)) return MOEQ_OK;
    if (is_type(norm, "Sequence") && is_unset(norm, "normalizers")) return MOEQ_OK;
    return E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
             "tokenizer.json: normalizer \"%s\" is not supported (only null or an empty Sequence)",
             type_of(norm));
}

/* GPT-2's pattern, used by ByteLevel when use_regex is true. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- regex rewriting: the reference's Unicode classes ------------------------------ */

typedef struct patbuf {
    char *s;
    size_t len, cap;
} patbuf;

static int pat_add(patbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = 2 * (b->len + n + 1) + 256;
        char *p = realloc(b->s, cap);
        if (!p) return -1;
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
    return 0;
}

static int pat_ranges(patbuf *b, const moeq_tok_range *r) {
    for (; r->lo || r->hi; r++) {
        char tmp[40];
        int n = snprintf(tmp, sizeof tmp, "\\x{%X}-\\x{%X}", (unsigned)r->lo, (unsigned)r->hi);
        if (pat_add(b, tmp, (size_t)n) < 0) return -1;
    }
    return 0;
}

/* One escape at p[0] == '\\' of a pattern; returns the pattern bytes consumed,
 * 0 to copy the escape as it is, -1 when it cannot be expressed. */
static int rewrite_escape(patbuf *b, const char *p, int in_class, int *oom) {
    int rc = 0;
    if ((p[1] == 'p' || p[1] == 'P') && p[2] == '{' && p[3] && strchr("LMNPS", p[3]) && p[4] == '}') {
        if (p[1] == 'P' && in_class) return -1;
        char prop[8] = "\\p{X}";
        prop[3] = p[3];
        const char *open = in_class ? "" : p[1] == 'P' ? "[^" : "[";
        rc = pat_add(b, open, strlen(open)) | pat_add(b, prop, 5) |
             pat_ranges(b, moeq_tok_unicode_extra(p[3])) | pat_add(b, in_class ? "" : "]", !in_class);
        *oom = rc < 0;
        return 5;
    }
    if (p[1] == 's' || p[1] == 'S') {
        if (p[1] == 'S' && in_class) return -1;
        const char *open = in_class ? "" : p[1] == 'S' ? "[^" : "[";
        rc = pat_add(b, open, strlen(open)) | pat_ranges(b, moeq_tok_unicode_space()) |
             pat_add(b, in_class ? "" : "]", !in_class);
        *oom = rc < 0;
        return 2;
    }
    if (p[1] == 'Q') return -1; /* \Q..\E quoting: not scanned */
    return 0;
}

/*
 * Rewrite a pre_tokenizer regex so that PCRE2 classifies code points as the
 * reference (Oniguruma, newer Unicode tables) does: \p{L|M|N|P|S} gain the
 * code points PCRE2's tables lack, \s and \S become the reference's
 * whitespace set (PCRE2's \s also has U+180E). Other syntax is copied.
 */
static moeq_err rewrite_pattern(const char *in, char **out, const char *where, char *errstr,
                                size_t errstr_size) {
    patbuf b = {0};
    int in_class = 0, oom = pat_add(&b, "", 0) < 0;
    for (size_t i = 0; in[i] && !oom;) {
        if (in[i] == '\\' && in[i + 1]) {
            int n = rewrite_escape(&b, in + i, in_class, &oom);
            if (n < 0) {
                free(b.s);
                return E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "tokenizer.json: %s: regex escape \\%c %s is not supported", where, in[i + 1],
                         in_class ? "inside a class" : "");
            }
            if (n == 0) oom = pat_add(&b, in + i, 2) < 0, n = 2;
            i += (size_t)n;
            continue;
        }
        size_t n = 1;
        if (in[i] == '[' && !in_class) {
            in_class = 1;
            if (in[i + 1] == '^') n++;
            if (in[i + n] == ']') n++; /* a leading ] is literal */
        } else if (in[i] == '[' && in_class && in[i + 1] == ':') {
            const char *end = strstr(in + i, ":]"); /* POSIX [:name:] */
            n = end ? (size_t)(end - (in + i)) + 2 : 1;
        } else if (in[i] == ']' && in_class) {
            in_class = 0;
        }
        oom = pat_add(&b, in + i, n) < 0;
        i += n;
    }
    if (oom) {
        free(b.s);
        return E(MOEQ_ERR_NOMEM, errstr, errstr_size, "tokenizer: out of memory");
    }
    *out = b.s;
    return MOEQ_OK;
}

static moeq_err add_split(moeq_tokenizer *tok, const char *pattern, int literal, int behavior,
                          const char *where, char *errstr, size_t errstr_size) {
    if (tok->n_splits == TOK_MAX_SPLITS)
        return E(MOEQ_ERR_LIMIT, errstr, errstr_size, "tokenizer.json: %s: more than %d Split steps",
                 where, TOK_MAX_SPLITS);
    char *rewritten = NULL;
    if (!literal) {
        moeq_err err = rewrite_pattern(pattern, &rewritten, where, errstr, errstr_size);
        if (err) return err;
        pattern = rewritten;
    }
    int rc;
    PCRE2_SIZE at;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &rc, &at, NULL);
    free(rewritten);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return E(MOEQ_ERR_FORMAT, errstr, errstr_size, "tokenizer.json: %s: regex error at %zu: %s",
                 where, (size_t)at, (const char *)msg);
    }
    tok_split *sp = &tok->splits[tok->n_splits++];
    sp->re = re;
    sp->behavior = behavior;
    sp->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    return MOEQ_OK;
}

static moeq_err load_split(moeq_tokenizer *tok, const cJSON *sp, const char *where, char *errstr,
                           size_t errstr_size) {
    const cJSON *pattern = obj_get(sp, "pattern"), *behavior = obj_get(sp, "behavior");
    const cJSON *regex = obj_get(pattern, "Regex"), *literal = obj_get(pattern, "String");
    if (!cJSON_IsString(regex) && !cJSON_IsString(literal))
        return E(MOEQ_ERR_FORMAT, errstr, errstr_size,
                 "tokenizer.json: %s.pattern needs a \"Regex\" or \"String\"", where);
    if (!is_unset(sp, "invert"))
        return E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                 "tokenizer.json: %s.invert = true is not supported", where);
    int b;
    if (cJSON_IsString(behavior) && !strcmp(behavior->valuestring, "Isolated")) b = TOK_SPLIT_ISOLATED;
    else if (cJSON_IsString(behavior) && !strcmp(behavior->valuestring, "Removed")) b = TOK_SPLIT_REMOVED;
    else
        return E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                 "tokenizer.json: %s.behavior \"%s\" is not supported (Isolated, Removed)", where,
                 cJSON_IsString(behavior) ? behavior->valuestring : "(none)");
    return cJSON_IsString(regex) ? add_split(tok, regex->valuestring, 0, b, where, errstr, errstr_size)
                                 : add_split(tok, literal->valuestring, 1, b, where, errstr, errstr_size);
}

static moeq_err load_bytelevel(moeq_tokenizer *tok, const cJSON *bl, const char *where,
                               char *errstr, size_t errstr_size) {
    if (!is_unset(bl, "add_prefix_space"))
        return E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                 "tokenizer.json: %s.add_prefix_space = true is not supported", where);
    const cJSON *use_regex = obj_get(bl, "use_regex");
    if (!use_regex || cJSON_IsTrue(use_regex)) /* HF's default is true */
        return add_split(tok, GPT2_PATTERN, 0, TOK_SPLIT_ISOLATED, where, errstr, errstr_size);
    return MOEQ_OK;
}

static moeq_err load_pre_tokenizer(moeq_tokenizer *tok, const cJSON *pre, char *errstr,
                                   size_t errstr_size) {
    if (is_type(pre, "ByteLevel")) return load_bytelevel(tok, pre, "pre_tokenizer", errstr, errstr_size);
    if (!is_type(pre, "Sequence"))
        return E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                 "tokenizer.json: pre_tokenizer \"%s\" is not supported (ByteLevel or a Sequence ending in ByteLevel)",
                 pre ? type_of(pre) : "null");
    const cJSON *list = obj_get(pre, "pretokenizers");
    int i = 0, n = cJSON_GetArraySize(list);
    for (const cJSON *p = cJSON_IsArray(list) ? list->child : NULL; p; p = p->next, i++) {
        char where[64];
        snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%d]", i);
        moeq_err err;
        if (is_type(p, "Split")) err = load_split(tok, p, where, errstr, errstr_size);
        else if (is_type(p, "ByteLevel") && i == n - 1) err = load_bytelevel(tok, p, where, errstr, errstr_size);
        else
            err = E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                    "tokenizer.json: %s \"%s\" is not supported (Split steps, then ByteLevel last)",
                    where, type_of(p));
        if (err) return err;
    }
    if (n == 0 || !is_type(cJSON_GetArrayItem(list, n - 1), "ByteLevel"))
        return E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                 "tokenizer.json: pre_tokenizer.pretokenizers must end in ByteLevel");
    return MOEQ_OK;
}

static moeq_err load_tokenizer_json(moeq_tokenizer *tok, const cJSON *root, char *errstr,
                                    size_t errstr_size) {
    const cJSON *added = obj_get(root, "added_tokens");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        return E(MOEQ_ERR_FORMAT, errstr, errstr_size, "tokenizer.json: added_tokens is not an array");
    if (cJSON_IsNull(added)) added = NULL;
    moeq_err err = load_model(tok, obj_get(root, "model"), added, errstr, errstr_size);
    if (!err) err = load_added(tok, added, errstr, errstr_size);
    if (!err) err = check_normalizer(obj_get(root, "normalizer"), errstr, errstr_size);
    if (!err) err = load_pre_tokenizer(tok, obj_get(root, "pre_tokenizer"), errstr, errstr_size);
    if (err) return err;
    const cJSON *dec = obj_get(root, "decoder");
    if (!is_type(dec, "ByteLevel"))
        return E(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                 "tokenizer.json: decoder \"%s\" is not supported (only ByteLevel)",
                 dec ? type_of(dec) : "null");
    /* post_processor (ByteLevel: offsets only) and truncation/padding don't
     * change ids; bos comes from tokenizer_config.json. */
    return MOEQ_OK;
}

/* ---- tokenizer_config.json -------------------------------------------------------- */

/* A special token entry: "text" or {"content": "text", ...}. */
static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = obj_get(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static moeq_chat_format detect_chat_format(const cJSON *tmpl) {
    if (cJSON_IsArray(tmpl)) /* [{"name": "default", "template": "..."}, ...] */
        for (const cJSON *t = tmpl->child; t; t = t->next) {
            const cJSON *name = obj_get(t, "name");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default"))
                return detect_chat_format(obj_get(t, "template"));
        }
    if (!cJSON_IsString(tmpl)) return MOEQ_CHAT_FORMAT_NONE;
    const char *s = tmpl->valuestring;
    if (strstr(s, "<｜User｜>") && strstr(s, "<｜Assistant｜>") && strstr(s, "ns.system_prompt") &&
        strstr(s, "bos_token") && !strstr(s, "<think>"))
        return MOEQ_CHAT_FORMAT_DEEPSEEK_V3;
    return MOEQ_CHAT_FORMAT_NONE;
}

static moeq_err load_config(moeq_tokenizer *tok, const cJSON *cfg, char *errstr, size_t errstr_size) {
    tok->bos_id = tok->eos_id = -1;
    if (!cfg) return MOEQ_OK;
    if (!cJSON_IsObject(cfg))
        return E(MOEQ_ERR_FORMAT, errstr, errstr_size, "tokenizer_config.json: not a JSON object");
    const char *bos = token_text(obj_get(cfg, "bos_token"));
    const char *eos = token_text(obj_get(cfg, "eos_token"));
    if (bos) {
        tok->bos_id = moeq_tokenizer_token_id(tok, bos);
        if (tok->bos_id < 0)
            return E(MOEQ_ERR_FORMAT, errstr, errstr_size,
                     "tokenizer_config.json: bos_token \"%s\" is not a token", bos);
        if (!(tok->bos_text = strdup(bos))) return E(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
    }
    if (eos && (tok->eos_id = moeq_tokenizer_token_id(tok, eos)) < 0)
        return E(MOEQ_ERR_FORMAT, errstr, errstr_size,
                 "tokenizer_config.json: eos_token \"%s\" is not a token", eos);
    tok->add_bos = cJSON_IsTrue(obj_get(cfg, "add_bos_token")) && tok->bos_id >= 0;
    tok->chat = detect_chat_format(obj_get(cfg, "chat_template"));
    return MOEQ_OK;
}

/* ---- public ----------------------------------------------------------------------- */

static moeq_err parse_json(const char *text, size_t len, const char *name, cJSON **out,
                           char *errstr, size_t errstr_size) {
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (*out) return MOEQ_OK;
    return E(MOEQ_ERR_PARSE, errstr, errstr_size, "%s: invalid JSON near byte %zu", name,
             end ? (size_t)(end - text) : (size_t)0);
}

moeq_err moeq_tokenizer_load_json(const char *tokenizer_json, size_t json_len,
                                  const char *config_json, size_t config_len,
                                  moeq_tokenizer **out, char *errstr, size_t errstr_size) {
    if (!tokenizer_json || !out)
        return E(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "tokenizer: NULL argument");
    *out = NULL;
    cJSON *root = NULL, *cfg = NULL;
    moeq_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) return E(MOEQ_ERR_NOMEM, errstr, errstr_size, "tokenizer: out of memory");
    moeq_err err = parse_json(tokenizer_json, json_len, "tokenizer.json", &root, errstr, errstr_size);
    if (!err && config_json)
        err = parse_json(config_json, config_len, "tokenizer_config.json", &cfg, errstr, errstr_size);
    if (!err) err = load_tokenizer_json(tok, root, errstr, errstr_size);
    if (!err) err = load_config(tok, cfg, errstr, errstr_size);
    if (!err && !(tok->cache = moeq_tok_cache_new()))
        err = E(MOEQ_ERR_NOMEM, errstr, errstr_size, "tokenizer: out of memory for the cache");
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (err) {
        moeq_tokenizer_destroy(tok);
        return err;
    }
    *out = tok;
    return MOEQ_OK;
}

moeq_err moeq_tokenizer_load(const char *dir, moeq_tokenizer **out, char *errstr, size_t errstr_size) {
    if (!dir || !out) return E(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "tokenizer: NULL argument");
    char path[4096];
    char *json = NULL, *cfg = NULL;
    size_t json_len = 0, cfg_len = 0;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    moeq_err err = moeq_read_file(path, TOK_MAX_JSON_BYTES, &json, &json_len, errstr, errstr_size);
    if (err) return err;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "rb"); /* optional: absent means no bos/eos/chat format */
    if (f) {
        fclose(f);
        err = moeq_read_file(path, TOK_MAX_JSON_BYTES, &cfg, &cfg_len, errstr, errstr_size);
    }
    if (!err) err = moeq_tokenizer_load_json(json, json_len, cfg, cfg_len, out, errstr, errstr_size);
    free(json);
    free(cfg);
    return err;
}

void moeq_tokenizer_destroy(moeq_tokenizer *tok) {
    if (!tok) return;
    for (int i = 0; i < tok->n_splits; i++) pcre2_code_free(tok->splits[i].re);
    moeq_tok_cache_destroy(tok->cache);
    free(tok->tok_off);
    free(tok->tok_len);
    free(tok->tok_data);
    free(tok->tok_flags);
    free(tok->str_data);
    free(tok->str_slots);
    free(tok->merges);
    free(tok->added_raw.nodes);
    free(tok->added_norm.nodes);
    free(tok->bos_text);
    free(tok);
}

int moeq_tokenizer_n_ids(const moeq_tokenizer *tok) { return tok->n_ids; }
int moeq_tokenizer_bos_id(const moeq_tokenizer *tok) { return tok->bos_id; }
int moeq_tokenizer_eos_id(const moeq_tokenizer *tok) { return tok->eos_id; }
int moeq_tokenizer_add_bos(const moeq_tokenizer *tok) { return tok->add_bos; }
moeq_chat_format moeq_tokenizer_chat_format(const moeq_tokenizer *tok) { return tok->chat; }

int moeq_tokenizer_token_id(const moeq_tokenizer *tok, const char *token) {
    if (!tok || !token) return -1;
    return str_find(tok, token, strlen(token));
}

int moeq_tokenizer_is_special(const moeq_tokenizer *tok, int id) {
    return id >= 0 && id < tok->n_ids && (tok->tok_flags[id] & TOK_FLAG_SPECIAL);
}

int moeq_tokenizer_token_bytes(const moeq_tokenizer *tok, int id, const char **bytes, size_t *len) {
    if (!tok || id < 0 || id >= tok->n_ids || tok->tok_len[id] == TOK_NO_TOKEN) return -1;
    *bytes = tok->tok_data + tok->tok_off[id];
    *len = tok->tok_len[id];
    return (tok->tok_flags[id] & TOK_FLAG_ADDED) ? 1 : 0;
}

void moeq_tokens_free(moeq_tokens *tokens) {
    if (!tokens) return;
    free(tokens->ids);
    *tokens = (moeq_tokens){0};
}
