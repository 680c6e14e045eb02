/*
 * test_prefix_cache.c — the prefix cache across sequences (issue 15;
 * docs/PREFIX_CACHE.md): the bookkeeping alone (engine/kv_blocks.c: keys,
 * chains, LRU eviction, the token comparison) and through the engine on
 * checkpoints written by the built `moeq gen-model` (tiny, tiny-mtp): a hit
 * gives the bits of a full prefill, at block edges and inside blocks, plain
 * and MTP; a pool too small for every prefix keeps running; a forced hash
 * collision is caught by the comparison.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward.h"
#include "kv_blocks.h"
#include "kv_cache.h"
#include "moeq/engine.h"
#include "mtp.h"
#include "sampler.h"

/* ---- the bookkeeping alone ----------------------------------------------------- */

static moeq_kv_blocks *blocks_new(int n_blocks, int max_seqs) {
    moeq_kv_blocks_params p = {.block_tokens = 4, .capacity_tokens = 4 * n_blocks, .max_seqs = max_seqs,
                               .prefix_cache = 1, .salt = 7};
    moeq_kv_blocks *b = NULL;
    assert_int_equal(moeq_kv_blocks_new(&p, &b, NULL, 0), MOEQ_OK);
    return b;
}

/* A sequence holding tokens[0..n), recorded (as the engine does after each step), in steps of `chunk`. */
static int seq_with(moeq_kv_blocks *b, const int32_t *tokens, int n, int chunk) {
    int s;
    assert_int_equal(moeq_kv_blocks_seq_new(b, &s), MOEQ_OK);
    for (int done = 0; done < n; done += chunk) {
        int k = n - done < chunk ? n - done : chunk;
        assert_int_equal(moeq_kv_blocks_grow(b, s, done + k), MOEQ_OK);
        moeq_kv_blocks_set_tokens(b, s, done, tokens + done, k);
    }
    return s;
}

static int32_t block_of(const moeq_kv_blocks *b, int seq, int i) {
    return moeq_kv_blocks_tables(b)[seq * moeq_kv_blocks_table_stride(b) + i];
}

static void a_released_full_block_stays_cached_and_a_matching_prompt_takes_its_chain(void **state) {
    (void)state;
    moeq_kv_blocks *b = blocks_new(8, 3);
    int32_t t[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int a = seq_with(b, t, 10, 3); /* steps of 3: blocks fill across steps */
    int32_t b0 = block_of(b, a, 0), b1 = block_of(b, a, 1);
    assert_true(moeq_kv_blocks_registered(b, b0) && moeq_kv_blocks_registered(b, b1));
    assert_false(moeq_kv_blocks_registered(b, block_of(b, a, 2))); /* partial: no key */
    moeq_kv_blocks_seq_free(b, a);
    assert_int_equal(moeq_kv_blocks_free(b), 8); /* cached blocks count as free */
    moeq_kv_blocks_stats st;
    moeq_kv_blocks_get_stats(b, &st);
    assert_int_equal(st.cached, 2);
    int c;
    assert_int_equal(moeq_kv_blocks_seq_new(b, &c), MOEQ_OK);
    assert_int_equal(moeq_kv_blocks_seq_take_prefix(b, c, t, 12, 8), 2);
    assert_int_equal(moeq_kv_blocks_seq_len(b, c), 8);
    assert_int_equal(block_of(b, c, 0), b0);
    assert_int_equal(block_of(b, c, 1), b1);
    assert_int_equal(moeq_kv_blocks_refs(b, b0), 1);
    moeq_kv_blocks_seq_free(b, c);
    int32_t u[12];
    memcpy(u, t, sizeof u);
    u[5] = 99; /* differs inside block 1: only block 0 matches */
    assert_int_equal(moeq_kv_blocks_lookup(b, u, 12, 8), 1);
    u[0] = 99; /* differs at the first token: nothing */
    assert_int_equal(moeq_kv_blocks_lookup(b, u, 12, 8), 0);
    assert_int_equal(moeq_kv_blocks_lookup(b, t, 7, 8), 1); /* only whole blocks of what is asked */
    moeq_kv_blocks_destroy(b);
}

/*
 * 8 blocks. Prefix P (2 blocks) + A's own block, released: cached, leaves first in the LRU. B takes P and
 * keeps running with a block of its own; C then needs every block: the one cached leaf (A's own) is evicted,
 * P's blocks (in use by B) never are, and the next block C asks for is refused (LIMIT), nothing evicted.
 */
static void eviction_under_pressure_takes_lru_leaves_first_and_never_a_block_in_use(void **state) {
    (void)state;
    moeq_kv_blocks *b = blocks_new(8, 4);
    int32_t pa[12] = {1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23}, pb[12] = {1, 2, 3, 4, 5, 6, 7, 8, 30, 31, 32, 33};
    int a = seq_with(b, pa, 12, 12);
    int32_t p0 = block_of(b, a, 0), p1 = block_of(b, a, 1), own = block_of(b, a, 2);
    moeq_kv_blocks_seq_free(b, a);
    assert_int_equal(moeq_kv_blocks_lru_rank(b, own), 0); /* the leaf is evicted first, its parents later */
    assert_int_equal(moeq_kv_blocks_lru_rank(b, p1), 1);
    assert_int_equal(moeq_kv_blocks_lru_rank(b, p0), 2);
    int s;
    assert_int_equal(moeq_kv_blocks_seq_new(b, &s), MOEQ_OK);
    assert_int_equal(moeq_kv_blocks_seq_take_prefix(b, s, pb, 12, 8), 2);
    assert_int_equal(moeq_kv_blocks_grow(b, s, 12), MOEQ_OK);
    moeq_kv_blocks_set_tokens(b, s, 8, pb + 8, 4);
    assert_int_equal(moeq_kv_blocks_free(b), 5); /* 4 on the stack + A's cached leaf */
    int c;
    assert_int_equal(moeq_kv_blocks_seq_new(b, &c), MOEQ_OK);
    assert_int_equal(moeq_kv_blocks_grow(b, c, 16), MOEQ_OK); /* the free stack */
    moeq_kv_blocks_stats st;
    moeq_kv_blocks_get_stats(b, &st);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(moeq_kv_blocks_grow(b, c, 20), MOEQ_OK); /* only by evicting A's own block */
    moeq_kv_blocks_get_stats(b, &st);
    assert_int_equal(st.evictions, 1);
    assert_false(moeq_kv_blocks_registered(b, own));
    assert_int_equal(block_of(b, c, 4), own);
    assert_true(moeq_kv_blocks_registered(b, p0) && moeq_kv_blocks_registered(b, p1));
    assert_int_equal(moeq_kv_blocks_refs(b, p0), 1);
    assert_int_equal(moeq_kv_blocks_grow(b, c, 24), MOEQ_ERR_LIMIT); /* the rest is in use */
    moeq_kv_blocks_get_stats(b, &st);
    assert_int_equal(st.evictions, 1);
    moeq_kv_blocks_seq_free(b, s);
    moeq_kv_blocks_seq_free(b, c);
    assert_int_equal(moeq_kv_blocks_free(b), 8);
    moeq_kv_blocks_destroy(b);
}

static void a_share_of_zero_keeps_nothing_cached_once_released(void **state) {
    (void)state;
    moeq_kv_blocks_params p = {.block_tokens = 4, .capacity_tokens = 32, .max_seqs = 2, .prefix_cache = 1,
                               .max_cached = -1};
    moeq_kv_blocks *b = NULL;
    assert_int_equal(moeq_kv_blocks_new(&p, &b, NULL, 0), MOEQ_OK);
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int a = seq_with(b, t, 8, 8), c;
    assert_int_equal(moeq_kv_blocks_seq_new(b, &c), MOEQ_OK);
    assert_int_equal(moeq_kv_blocks_seq_take_prefix(b, c, t, 8, 8), 2); /* while a runs: shared */
    moeq_kv_blocks_seq_free(b, a);
    moeq_kv_blocks_seq_free(b, c);
    moeq_kv_blocks_stats st;
    moeq_kv_blocks_get_stats(b, &st);
    assert_int_equal(st.cached, 0);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(moeq_kv_blocks_lookup(b, t, 8, 8), 0);
    moeq_kv_blocks_destroy(b);
}

static uint64_t constant_hash(uint64_t parent, const int32_t *row, int n) {
    (void)parent, (void)row, (void)n;
    return 42; /* every block collides with every other */
}

static void a_forced_hash_collision_is_caught_by_the_token_comparison(void **state) {
    (void)state;
    moeq_kv_blocks *b = blocks_new(8, 3);
    moeq_kv_blocks_set_hash(b, constant_hash);
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8}, u[8] = {1, 2, 3, 9, 5, 6, 7, 8};
    moeq_kv_blocks_seq_free(b, seq_with(b, t, 8, 8));
    int c;
    assert_int_equal(moeq_kv_blocks_seq_new(b, &c), MOEQ_OK);
    assert_int_equal(moeq_kv_blocks_seq_take_prefix(b, c, u, 8, 8), 0); /* same key, other tokens */
    moeq_kv_blocks_stats st;
    moeq_kv_blocks_get_stats(b, &st);
    assert_true(st.collisions >= 1);
    assert_int_equal(moeq_kv_blocks_seq_take_prefix(b, c, t, 8, 8), 2); /* equal tokens still hit */
    /* block 1's row again under another parent: the parent is compared too */
    int32_t w[8] = {9, 9, 9, 9, 5, 6, 7, 8};
    assert_int_equal(moeq_kv_blocks_lookup(b, w, 8, 8), 0);
    moeq_kv_blocks_destroy(b);
}

/* ---- through the engine ----------------------------------------------------------- */

static char g_dir[256];
static moeq_model *g_tiny, *g_agree;

static moeq_model *gen_and_load(const char *preset) {
    const char *build = getenv("MOEQ_BUILD_DIR");
    char cmd[1024], path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/%s", g_dir, preset);
    snprintf(cmd, sizeof(cmd), "'%s/cli/moeq' gen-model --preset %s --out '%s' >/dev/null 2>&1", build ? build : ".",
             preset, path);
    if (system(cmd) != 0) return NULL;
    moeq_model *m = NULL;
    if (moeq_model_load(path, NULL, &m, err, sizeof(err)) != MOEQ_OK) fprintf(stderr, "load %s: %s\n", path, err);
    return m;
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/moeq-test-prefix-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    g_tiny = gen_and_load("tiny");
    g_agree = gen_and_load("tiny-mtp");
    return g_tiny && g_agree ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    moeq_model_destroy(g_tiny);
    moeq_model_destroy(g_agree);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static moeq_engine *engine_for(const moeq_model *m, int cache_on, int64_t kv_tokens) {
    moeq_engine_params p = moeq_engine_default_params();
    p.n_threads = 2;
    p.max_seqs = 8;
    p.max_step_tokens = 64;
    p.kv_cache_tokens = kv_tokens;
    p.kv_block_tokens = 4;
    p.prefix_cache = cache_on;
    moeq_engine *e = NULL;
    char err[256] = "";
    moeq_err rc = moeq_engine_new(m, &p, &e, err, sizeof(err));
    if (rc) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(rc, MOEQ_OK);
    return e;
}

static int V(const moeq_model *m) { return moeq_model_get_config(m)->vocab_size; }

static void step_ok(moeq_engine *e, int seq, const int32_t *toks, int n, float *logits) {
    char err[256] = "";
    for (int done = 0; done < n; done += 64) {
        moeq_step_item it = {seq, toks + done, n - done < 64 ? n - done : 64, 0};
        moeq_err rc = moeq_engine_step(e, &it, 1, logits, 1, err, sizeof err);
        if (rc) fprintf(stderr, "step of seq %d: %s\n", seq, err);
        assert_int_equal(rc, MOEQ_OK);
    }
}

enum { P = 30, DECODE = 3 };

/* The prompt of job j: the first `shared` tokens common to all jobs, then its own. */
static void job_prompt(int32_t *ids, int shared, int j, int vocab) {
    for (int i = 0; i < P; i++) ids[i] = (int32_t)((i < shared ? i * 37 + 5 : i * 53 + j * 101 + 11) % vocab);
}

/* Prefill prompt (after *n_cached taken from the cache) and decode DECODE greedy tokens; logits of each. */
static void run_job(moeq_engine *e, const int32_t *ids, int mtp, float *out, int vocab, int *n_cached) {
    int seq, got = 0;
    char err[256] = "";
    assert_int_equal(moeq_engine_seq_new_prefix(e, ids, P, -1, mtp, &seq, &got, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_len(e, seq), got);
    if (n_cached) *n_cached = got;
    step_ok(e, seq, ids + got, P - got, out);
    for (int i = 1; i <= DECODE; i++) {
        int32_t next = moeq_sampler_argmax(out + (size_t)(i - 1) * vocab, vocab);
        step_ok(e, seq, &next, 1, out + (size_t)i * vocab);
    }
    moeq_engine_seq_free(e, seq);
}

/*
 * Job 0 fills the cache; job 1 shares s leading tokens with it, for s at and around block edges (blocks of
 * 4): it takes whole blocks below s (never the last prompt token) and its logits, prompt and decode, equal
 * those of an engine without the cache bit for bit. The same prompt again takes all but its last block.
 */
static void a_cache_hit_gives_the_bits_of_a_full_prefill_at_block_edges_and_inside_blocks(void **state) {
    (void)state;
    int vocab = V(g_tiny);
    moeq_engine *ref = engine_for(g_tiny, 0, 1024), *e = engine_for(g_tiny, 1, 1024);
    size_t rows = (size_t)(DECODE + 1) * vocab;
    float *want = malloc(rows * 4), *got = malloc(rows * 4);
    int32_t ids[P];
    const int shared[] = {0, 1, 3, 4, 5, 8, 9, 15, 16, 17, 29, 30};
    for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++) {
        int s = shared[i], n = -1;
        job_prompt(ids, s, 0, vocab);
        run_job(e, ids, 0, got, vocab, NULL);
        job_prompt(ids, s, 1 + (int)i, vocab);
        run_job(ref, ids, 0, want, vocab, NULL);
        run_job(e, ids, 0, got, vocab, &n);
        int lim = s < P - 1 ? s : P - 1;
        assert_int_equal(n, lim / 4 * 4);
        assert_memory_equal(got, want, rows * 4);
        run_job(e, ids, 0, got, vocab, &n); /* itself again */
        assert_int_equal(n, (P - 1) / 4 * 4);
        assert_memory_equal(got, want, rows * 4);
    }
    moeq_engine_prefix_stats st;
    moeq_engine_get_prefix_stats(e, &st);
    assert_true(st.hits > 0 && st.hit_tokens > 0 && st.cached_blocks > 0);
    assert_int_equal(st.collisions, 0);
    free(want), free(got);
    moeq_engine_destroy(ref);
    moeq_engine_destroy(e);
}

/*
 * A running sequence's full blocks are found too (what forking a running job gave): a second sequence with
 * the same prompt, started while the first still runs, takes them, and both decode the reference's bits.
 */
static void a_running_sequences_blocks_are_shared_by_a_new_sequence_with_its_prompt(void **state) {
    (void)state;
    int vocab = V(g_tiny);
    moeq_engine *ref = engine_for(g_tiny, 0, 1024), *e = engine_for(g_tiny, 1, 1024);
    size_t rows = (size_t)(DECODE + 1) * vocab;
    float *want = malloc(rows * 4), *la = malloc((size_t)vocab * 4);
    int32_t ids[P];
    job_prompt(ids, P, 0, vocab);
    run_job(ref, ids, 0, want, vocab, NULL);
    int a, n;
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    step_ok(e, a, ids, P, la);
    assert_int_equal(moeq_engine_prefix_lookup(e, ids, P, 0), 28);
    float *got = malloc(rows * 4);
    run_job(e, ids, 0, got, vocab, &n);
    assert_int_equal(n, 28);
    assert_memory_equal(got, want, rows * 4);
    assert_memory_equal(la, want, (size_t)vocab * 4);
    moeq_engine_seq_free(e, a);
    free(want), free(la), free(got);
    moeq_engine_destroy(ref);
    moeq_engine_destroy(e);
}

/*
 * What the worker's admission reads (moeq_engine_kv_blocks, _seq_blocks_to_grow, _prefix_held_blocks): blocks a
 * sequence can take (free and cached), what growing a sequence takes, and the prompt blocks a live sequence
 * holds, which a second sequence with that prompt takes without allocating; once nobody holds them they are
 * cached: found, takeable, but no longer held.
 */
static void the_pools_blocks_as_admission_counts_them(void **state) {
    (void)state;
    int vocab = V(g_tiny);
    moeq_engine *e = engine_for(g_tiny, 1, 1024);
    float *la = malloc((size_t)vocab * 4);
    int32_t ids[P];
    job_prompt(ids, P, 0, vocab);
    int64_t takeable, total;
    moeq_engine_kv_blocks(e, 0, &takeable, &total);
    assert_int_equal(total, 256);
    assert_int_equal(takeable, 256);
    int a, b, n;
    char err[256];
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_blocks_to_grow(e, a, 0, P), 8);
    step_ok(e, a, ids, P, la);
    moeq_engine_kv_blocks(e, 0, &takeable, &total);
    assert_int_equal(takeable, 248);
    assert_int_equal(moeq_engine_seq_blocks_to_grow(e, a, 0, P), 0);
    assert_int_equal(moeq_engine_seq_blocks_to_grow(e, a, 0, P + 10), 2); /* 40 tokens: 10 blocks */
    assert_int_equal(moeq_engine_seq_blocks_to_grow(e, a, 1, P + 10), -1); /* not marked for MTP */
    assert_int_equal(moeq_engine_seq_blocks_to_grow(e, 7, 0, P), -1);     /* not alive */
    assert_int_equal(moeq_engine_prefix_held_blocks(e, ids, P, 0), 7);    /* (P - 1) / 4 whole blocks */
    assert_int_equal(moeq_engine_seq_new_prefix(e, ids, P, -1, 0, &b, &n, err, sizeof err), MOEQ_OK);
    assert_int_equal(n, 28);
    moeq_engine_kv_blocks(e, 0, &takeable, &total);
    assert_int_equal(takeable, 248); /* shared: nothing allocated */
    assert_int_equal(moeq_engine_seq_blocks_to_grow(e, b, 0, P), 1); /* its own last block */
    moeq_engine_seq_free(e, a);
    assert_int_equal(moeq_engine_prefix_held_blocks(e, ids, P, 0), 7); /* b holds them */
    moeq_engine_seq_free(e, b);
    assert_int_equal(moeq_engine_prefix_held_blocks(e, ids, P, 0), 0);
    assert_int_equal(moeq_engine_prefix_lookup(e, ids, P, 0), 28);     /* cached, no longer held */
    moeq_engine_kv_blocks(e, 0, &takeable, &total);
    assert_int_equal(takeable, 256);
    free(la);
    moeq_engine_destroy(e);
}

/* Main and MTP entries of a (engine ea) and b (engine eb), bit for bit. */
static void assert_caches_equal(moeq_engine *ea, int a, moeq_engine *eb, int b) {
    const moeq_model_config *c = ea->cfg;
    size_t ef = (size_t)(c->kv_lora_rank + c->qk_rope_head_dim) * sizeof(float);
    int len = moeq_engine_seq_len(ea, a), mlen = moeq_engine_mtp_seq_len(ea, a);
    assert_int_equal(len, moeq_engine_seq_len(eb, b));
    assert_int_equal(mlen, moeq_engine_mtp_seq_len(eb, b));
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int p = 0; p < len; p++)
            assert_memory_equal(moeq_kv_cache_entry(ea->cache, a, l, p), moeq_kv_cache_entry(eb->cache, b, l, p), ef);
    for (int p = 0; p < mlen; p++)
        assert_memory_equal(moeq_mtp_cache_entry(ea, a, p), moeq_mtp_cache_entry(eb, b, p), ef);
}

/* Greedy MTP rounds (k = 2) of one marked sequence that has stepped its prompt: 8 tokens out. */
static void spec_rounds(moeq_engine *e, int seq, int32_t first, int32_t *out) {
    moeq_mtp_decoder *dec = NULL;
    assert_int_equal(moeq_mtp_decoder_new(e, 1, 2, &dec, NULL, 0), MOEQ_OK);
    moeq_spec_seq sq = {.seq_id = seq, .next_token = first, .sampling = moeq_sampling_default_params()};
    for (int got = 0; got < 8;) {
        sq.k = 2;
        assert_int_equal(moeq_mtp_decode_step(dec, &sq, 1, NULL, 0), MOEQ_OK);
        for (int j = 0; j < sq.n_out && got < 8; j++) out[got++] = sq.out[j];
    }
    moeq_mtp_decoder_destroy(dec);
}

/* A marked sequence for ids (taking what e's cache holds), prompt stepped; its last logits in la. */
static int marked_seq(moeq_engine *e, const int32_t *ids, float *la, int *n) {
    int seq;
    assert_int_equal(moeq_engine_seq_new_prefix(e, ids, P, -1, 1, &seq, n, NULL, 0), MOEQ_OK);
    step_ok(e, seq, ids + *n, P - *n, la);
    return seq;
}

/*
 * MTP: job 0 (marked) steps its prompt and drafts, so its MTP entries are computed and their blocks keyed;
 * job 1 shares s leading tokens. Its hit stops a block earlier than a plain one can when the MTP entries
 * at the block's end read a token past the shared part; its main and MTP caches, prompt logits and draft
 * rounds equal a marked sequence on an engine without the cache, bit for bit.
 */
static void an_mtp_cache_hit_drafts_like_a_sequence_prefilled_itself(void **state) {
    (void)state;
    int vocab = V(g_agree);
    moeq_engine *ref = engine_for(g_agree, 0, 1024), *e = engine_for(g_agree, 1, 1024);
    float *la = malloc((size_t)vocab * 4), *lb = malloc((size_t)vocab * 4);
    int32_t ids[P], out_a[8], out_b[8];
    const int shared[] = {4, 5, 8, 9, 13, 16, 17, 30};
    int hits = 0;
    for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++) {
        int s = shared[i], n, n_ref;
        job_prompt(ids, s, 0, vocab);
        int j0 = marked_seq(e, ids, la, &n);
        spec_rounds(e, j0, (int32_t)moeq_sampler_argmax(la, vocab), out_a);
        moeq_engine_seq_free(e, j0);
        job_prompt(ids, s, 1 + (int)i, vocab);
        int a = marked_seq(e, ids, la, &n), b = marked_seq(ref, ids, lb, &n_ref);
        assert_int_equal(n_ref, 0);
        int lim = s < P - 1 ? s : P - 1; /* the MTP row of block k reads token 4k + 4: shared when < s */
        assert_true(n <= lim / 4 * 4 && n >= (lim - 1) / 4 * 4);
        hits += n > 0;
        assert_memory_equal(la, lb, (size_t)vocab * 4);
        assert_caches_equal(e, a, ref, b);
        spec_rounds(e, a, (int32_t)moeq_sampler_argmax(la, vocab), out_a);
        spec_rounds(ref, b, (int32_t)moeq_sampler_argmax(lb, vocab), out_b);
        assert_memory_equal(out_a, out_b, sizeof out_a);
        assert_caches_equal(e, a, ref, b);
        moeq_engine_seq_free(e, a);
        moeq_engine_seq_free(ref, b);
    }
    assert_true(hits >= 6);
    free(la), free(lb);
    moeq_engine_destroy(ref);
    moeq_engine_destroy(e);
}

/*
 * A pool of 32 blocks (128 tokens) and 12 jobs of 30-token prompts with 2 different 16-token prefixes: far
 * more cached blocks than fit (4 per prefix + 5 per job). A long-running sequence holds 8 blocks throughout. Every job runs (no LIMIT),
 * evictions happen, every result and the long runner's decode equal the cache-less engine's bits.
 */
static void a_pool_too_small_for_every_prefix_keeps_running_and_never_evicts_a_block_in_use(void **state) {
    (void)state;
    int vocab = V(g_tiny);
    moeq_engine *ref = engine_for(g_tiny, 0, 128), *e = engine_for(g_tiny, 1, 128);
    size_t rows = (size_t)(DECODE + 1) * vocab;
    float *want = malloc(rows * 4), *got = malloc(rows * 4), *la = malloc((size_t)vocab * 4),
          *lb = malloc((size_t)vocab * 4);
    int32_t ids[P], longp[P];
    job_prompt(longp, 0, 77, vocab);
    int la_seq, lb_seq;
    assert_int_equal(moeq_engine_seq_new(e, &la_seq), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_new(ref, &lb_seq), MOEQ_OK);
    step_ok(e, la_seq, longp, P, la);
    step_ok(ref, lb_seq, longp, P, lb);
    for (int j = 0; j < 12; j++) {
        job_prompt(ids, 16, j, vocab);
        ids[0] = (int32_t)(j % 2); /* two prefixes */
        run_job(ref, ids, 0, want, vocab, NULL);
        run_job(e, ids, 0, got, vocab, NULL);
        assert_memory_equal(got, want, rows * 4);
    }
    moeq_engine_prefix_stats st;
    moeq_engine_get_prefix_stats(e, &st);
    assert_true(st.evictions > 0);
    assert_true(st.hits > 0);
    int32_t next = moeq_sampler_argmax(lb, vocab);
    step_ok(e, la_seq, &next, 1, la);
    step_ok(ref, lb_seq, &next, 1, lb);
    assert_memory_equal(la, lb, (size_t)vocab * 4); /* its blocks were never taken */
    free(want), free(got), free(la), free(lb);
    moeq_engine_destroy(ref);
    moeq_engine_destroy(e);
}

/* Every key the same (a test hash): prompts that differ still get their own results, and equal ones still hit. */
static void a_forced_collision_in_the_engine_is_recomputed_not_reused(void **state) {
    (void)state;
    int vocab = V(g_agree);
    moeq_engine *ref = engine_for(g_agree, 0, 1024), *e = engine_for(g_agree, 1, 1024);
    moeq_kv_cache_set_hash(e->cache, constant_hash);
    moeq_kv_cache_set_hash(moeq_mtp_cache(e), constant_hash);
    size_t rows = (size_t)(DECODE + 1) * vocab;
    float *want = malloc(rows * 4), *got = malloc(rows * 4);
    int32_t ids[P];
    int n;
    job_prompt(ids, 0, 0, vocab);
    run_job(e, ids, 0, got, vocab, NULL);
    job_prompt(ids, 0, 1, vocab); /* no token in common at the same place */
    run_job(ref, ids, 0, want, vocab, NULL);
    run_job(e, ids, 0, got, vocab, &n);
    assert_int_equal(n, 0);
    assert_memory_equal(got, want, rows * 4);
    moeq_engine_prefix_stats st;
    moeq_engine_get_prefix_stats(e, &st);
    assert_true(st.collisions > 0);
    run_job(e, ids, 0, got, vocab, &n);
    assert_int_equal(n, 28);
    assert_memory_equal(got, want, rows * 4);
    free(want), free(got);
    moeq_engine_destroy(ref);
    moeq_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_released_full_block_stays_cached_and_a_matching_prompt_takes_its_chain),
        cmocka_unit_test(eviction_under_pressure_takes_lru_leaves_first_and_never_a_block_in_use),
        cmocka_unit_test(a_share_of_zero_keeps_nothing_cached_once_released),
        cmocka_unit_test(a_forced_hash_collision_is_caught_by_the_token_comparison),
        cmocka_unit_test(a_cache_hit_gives_the_bits_of_a_full_prefill_at_block_edges_and_inside_blocks),
        cmocka_unit_test(a_running_sequences_blocks_are_shared_by_a_new_sequence_with_its_prompt),
        cmocka_unit_test(the_pools_blocks_as_admission_counts_them),
        cmocka_unit_test(an_mtp_cache_hit_drafts_like_a_sequence_prefilled_itself),
        cmocka_unit_test(a_pool_too_small_for_every_prefix_keeps_running_and_never_evicts_a_block_in_use),
        cmocka_unit_test(a_forced_collision_in_the_engine_is_recomputed_not_reused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
