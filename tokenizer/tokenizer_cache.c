/*
 * tokenizer_cache.c — the pre-token cache and the hash that the tokenizer's
 * tables share. Short pieces' BPE results are cached in a lock-striped table
 * (the tokenizer is shared by threads; a stripe's mutex is held only to copy
 * an entry). The lowest layer of the tokenizer: it calls nothing in the
 * other tokenizer files, so load (tokenizer.c) and encode
 * (tokenizer_encode.c) both build on it and never on each other.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

uint64_t moeq_tok_hash(const void *data, size_t len) {
    const uint8_t *p = data;
    uint64_t h = 0x243F6A8885A308D3ull ^ (len * 0x9E3779B97F4A7C15ull);
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        p += 8;
        len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, len);
    h = (h ^ w) * 0x94D049BB133111EBull;
    return h ^ (h >> 31);
}

/* ---- pre-token cache ----------------------------------------------------------- */

#define CACHE_STRIPES 128
#define CACHE_SLOTS 128  /* per stripe, direct-mapped                */

typedef struct cache_entry {
    uint64_t hash;
    uint8_t key_len; /* 0 = empty */
    uint8_t n_ids;
    char key[MOEQ_TOK_CACHE_KEY_MAX];
    int32_t ids[MOEQ_TOK_CACHE_IDS_MAX];
} cache_entry;

typedef struct cache_stripe {
    pthread_mutex_t mu;
    cache_entry slots[CACHE_SLOTS];
} __attribute__((aligned(64))) cache_stripe;

struct tok_cache {
    cache_stripe stripes[CACHE_STRIPES];
};

tok_cache *moeq_tok_cache_new(void) {
    tok_cache *cache = NULL;
    if (posix_memalign((void **)&cache, 64, sizeof *cache)) return NULL;
    memset(cache, 0, sizeof *cache);
    for (int i = 0; i < CACHE_STRIPES; i++) pthread_mutex_init(&cache->stripes[i].mu, NULL);
    return cache;
}

void moeq_tok_cache_destroy(tok_cache *cache) {
    if (!cache) return;
    for (int i = 0; i < CACHE_STRIPES; i++) pthread_mutex_destroy(&cache->stripes[i].mu);
    free(cache);
}

/* Copy the cached ids of key into ids; returns their count, or -1 on a miss. */
int moeq_tok_cache_get(tok_cache *cache, uint64_t hash, const char *key, size_t len, int32_t *ids) {
    cache_stripe *st = &cache->stripes[hash % CACHE_STRIPES];
    const cache_entry *e = &st->slots[(hash / CACHE_STRIPES) % CACHE_SLOTS];
    int n = -1;
    pthread_mutex_lock(&st->mu);
    if (e->hash == hash && e->key_len == len && !memcmp(e->key, key, len)) {
        n = e->n_ids;
        memcpy(ids, e->ids, (size_t)n * sizeof *ids);
    }
    pthread_mutex_unlock(&st->mu);
    return n;
}

void moeq_tok_cache_put(tok_cache *cache, uint64_t hash, const char *key, size_t len,
                      const int32_t *ids, size_t n) {
    cache_stripe *st = &cache->stripes[hash % CACHE_STRIPES];
    cache_entry *e = &st->slots[(hash / CACHE_STRIPES) % CACHE_SLOTS];
    pthread_mutex_lock(&st->mu);
    e->hash = hash;
    e->key_len = (uint8_t)len;
    e->n_ids = (uint8_t)n;
    memcpy(e->key, key, len);
    memcpy(e->ids, ids, n * sizeof *ids);
    pthread_mutex_unlock(&st->mu);
}
