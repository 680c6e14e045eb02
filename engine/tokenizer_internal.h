/*
 * tokenizer_internal.h — the moeq_tokenizer struct and the helpers shared by
 * the tokenizer's files (tokenizer.c: load; tokenizer_encode.c: added tokens,
 * pre-tokenizer, BPE, cache; tokenizer_decode.c; tokenizer_chat.c;
 * tokenizer_export.c). Not installed; nothing outside engine/tokenizer*.c
 * includes it.
 */
#ifndef MOEQ_TOKENIZER_INTERNAL_H
#define MOEQ_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>

#include "moeq/tokenizer.h"

#define TOK_MAX_SPLITS 8
#define TOK_NO_TOKEN UINT32_MAX /* tok_len[id] of an id that names no token */

enum { TOK_FLAG_ADDED = 1, TOK_FLAG_SPECIAL = 2 };
enum { TOK_SPLIT_ISOLATED = 0, TOK_SPLIT_REMOVED = 1 };

/* One pre-tokenizer Split step. */
typedef struct tok_split {
    pcre2_code *re;
    int behavior; /* TOK_SPLIT_* */
    int jit;      /* 1 when JIT-compiled (then pcre2_jit_match is used) */
} tok_split;

/* Byte trie of added-token contents for leftmost-longest matching. */
typedef struct tok_trie_node {
    int32_t child;   /* first child, -1 = none */
    int32_t sibling; /* next sibling, -1 = none */
    int32_t id;      /* token id ending here, -1 = none */
    uint8_t byte;
} tok_trie_node;

typedef struct tok_trie {
    tok_trie_node *nodes; /* nodes[0] is the root */
    int32_t n, cap;
    uint8_t first[256]; /* 1 when some token starts with this byte */
    int n_tokens;
} tok_trie;

/* (left id, right id) -> (rank, merged id); open addressing, key ~0 = empty. */
typedef struct tok_merge_slot {
    uint64_t key;
    int32_t rank;
    int32_t id;
} tok_merge_slot;

/* Token string -> id (vocabulary and added tokens, original spelling). */
typedef struct tok_str_slot {
    uint32_t off, len; /* into str_data; len == TOK_NO_TOKEN: empty slot */
    int32_t id;
} tok_str_slot;

typedef struct tok_cache tok_cache;

struct moeq_tokenizer {
    int32_t n_ids;
    /* Decoded bytes per id (the ByteLevel decoder's rule applied). */
    uint32_t *tok_off, *tok_len; /* tok_len[id] == TOK_NO_TOKEN: no token */
    char *tok_data;
    uint8_t *tok_flags; /* TOK_FLAG_* */
    /* Original token strings for moeq_tokenizer_token_id. */
    char *str_data;
    size_t str_data_len;
    tok_str_slot *str_slots;
    size_t str_mask;
    /* BPE */
    int32_t byte_id[256]; /* id of the single-byte symbol */
    tok_merge_slot *merges;
    size_t merges_mask;
    /* Added tokens: matched on the raw text first, then the normalized ones. */
    tok_trie added_raw, added_norm;
    /* Pre-tokenizer */
    int n_splits;
    tok_split splits[TOK_MAX_SPLITS];
    /* tokenizer_config.json */
    int bos_id, eos_id, add_bos;
    char *bos_text; /* bos token content for chat templates (may be NULL) */
    moeq_chat_format chat;
    tok_cache *cache;
};

/* GPT-2 ByteLevel alphabet: byte -> code point, and code point -> byte (-1). */
uint32_t moeq_tok_byte_to_cp(uint8_t byte);
int moeq_tok_cp_to_byte(uint32_t cp);

uint64_t moeq_tok_hash(const void *data, size_t len);

/* Merge table lookup: rank (and *merged) of the pair, -1 when none. */
static inline int32_t moeq_tok_merge_find(const moeq_tokenizer *tok, int32_t a, int32_t b,
                                          int32_t *merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & tok->merges_mask;
    for (;;) {
        const tok_merge_slot *s = &tok->merges[i];
        if (s->key == key) {
            *merged = s->id;
            return s->rank;
        }
        if (s->key == UINT64_MAX) return -1;
        i = (i + 1) & tok->merges_mask;
    }
}

/* Cache (tokenizer_encode.c) */
tok_cache *moeq_tok_cache_new(void);
void moeq_tok_cache_destroy(tok_cache *cache);

/* Lossy UTF-8: append the text of in[0..n) to out (U+FFFD per maximal bad
 * subsequence). When final is 0 an incomplete character at the end is not
 * consumed; returns the number of bytes consumed. out must have room for
 * 3 * n bytes. */
size_t moeq_tok_utf8_lossy(const uint8_t *in, size_t n, int final, char *out, size_t *out_len);

#endif
