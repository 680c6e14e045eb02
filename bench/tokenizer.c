/*
 * bench-tokenizer — encoding throughput of moeq's tokenizer against the HF
 * `tokenizers` reference, on the same documents, in the same run.
 *
 * Documents (~4 KB each, at least --mb MB in all, default 10) are assembled
 * deterministically (seeded PRNG) from the committed corpus snippets in
 * tests/tokenizer/vectors/deepseek_v3.jsonl (prose, CJK, code, numbers,
 * emoji, scripts, special tokens...; the pathological long_/fuzz_/sweep_
 * cases are left out). moeq encodes them on one thread; then
 * tests/tokenizer/bench_ref.js encodes them with the reference (one thread)
 * and reports its time and a hash of its ids. Prints one JSON object.
 *
 * usage: bench-tokenizer [--mb N] [--model DIR] [--no-reference]
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moeq/tokenizer.h"
#include "moeq/util.h"

#ifndef MOEQ_SOURCE_DIR
#define MOEQ_SOURCE_DIR "."
#endif

#define DOC_BYTES 4096

typedef struct docs {
    char **text;
    size_t *len, n, bytes;
} docs;

static uint32_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* The corpus snippets: every vector's text but the pathological ones. */
static char **load_snippets(const char *path, size_t *n) {
    char *data = NULL, errstr[256];
    size_t len = 0, cap = 0;
    char **out = NULL;
    *n = 0;
    if (moeq_read_file(path, 64u << 20, &data, &len, errstr, sizeof errstr)) {
        fprintf(stderr, "bench-tokenizer: %s\n", errstr);
        return NULL;
    }
    for (char *line = data, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        cJSON *j = cJSON_Parse(line);
        const cJSON *name = cJSON_GetObjectItem(j, "name"), *text = cJSON_GetObjectItem(j, "text");
        if (cJSON_IsString(name) && cJSON_IsString(text) && strncmp(name->valuestring, "long_", 5) &&
            strncmp(name->valuestring, "fuzz_", 5) && strlen(text->valuestring) > 0 &&
            !cJSON_GetObjectItem(j, "hex")) {
            if (*n == cap) out = realloc(out, (cap = cap ? 2 * cap : 256) * sizeof *out);
            out[(*n)++] = strdup(text->valuestring);
        }
        cJSON_Delete(j);
    }
    free(data);
    return out;
}

static int make_docs(docs *d, double mb) {
    size_t n_snip = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/tokenizer/vectors/deepseek_v3.jsonl", MOEQ_SOURCE_DIR);
    char **snip = load_snippets(path, &n_snip);
    if (!snip || !n_snip) return -1;
    uint64_t seed = 20240601;
    size_t want = (size_t)(mb * 1e6), cap = 0;
    memset(d, 0, sizeof *d);
    while (d->bytes < want) {
        char *doc = malloc(2 * DOC_BYTES + 8192);
        size_t len = 0;
        while (len < DOC_BYTES) {
            const char *s = snip[rng_next(&seed) % n_snip];
            size_t sl = strlen(s);
            if (len + sl > 2 * DOC_BYTES) continue;
            memcpy(doc + len, s, sl);
            len += sl;
            const char *sep = (rng_next(&seed) % 3) ? "\n\n" : " ";
            memcpy(doc + len, sep, strlen(sep));
            len += strlen(sep);
        }
        doc[len] = 0;
        if (d->n == cap) {
            cap = cap ? 2 * cap : 1024;
            d->text = realloc(d->text, cap * sizeof *d->text);
            d->len = realloc(d->len, cap * sizeof *d->len);
        }
        d->text[d->n] = doc;
        d->len[d->n++] = len;
        d->bytes += len;
    }
    for (size_t i = 0; i < n_snip; i++) free(snip[i]);
    free(snip);
    return 0;
}

static uint64_t fnv_ids(uint64_t h, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) h = (h ^ (((uint32_t)ids[i] >> (8 * k)) & 0xFF)) * 0x100000001b3ull;
    return h;
}

/* Write the documents as JSON strings, one per line, for bench_ref.js. */
static int write_docs(const docs *d, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    for (size_t i = 0; i < d->n; i++) {
        cJSON *s = cJSON_CreateString(d->text[i]);
        char *js = cJSON_PrintUnformatted(s);
        fprintf(f, "%s\n", js);
        free(js);
        cJSON_Delete(s);
    }
    return fclose(f);
}

/* Runs the reference; fills seconds/tokens/hash. Returns 0 on success. */
static int run_reference(const docs *d, const char *tok_dir, double *seconds, size_t *tokens,
                         uint64_t *hash) {
    char docs_path[] = "/tmp/moeq-bench-tok-XXXXXX";
    int fd = mkstemp(docs_path);
    if (fd < 0) return -1;
    close(fd);
    int rc = -1;
    char cmd[16384], line[4096];
    if (write_docs(d, docs_path)) goto remove_docs;
    snprintf(cmd, sizeof cmd, "node '%s/tests/tokenizer/bench_ref.js' '%s/.deps/tokenizer-ref' '%s/tokenizer.json' '%s'",
             MOEQ_SOURCE_DIR, MOEQ_SOURCE_DIR, tok_dir, docs_path);
    FILE *p = popen(cmd, "r");
    if (!p) goto remove_docs;
    cJSON *j = fgets(line, sizeof line, p) ? cJSON_Parse(line) : NULL;
    int status = pclose(p);
    const cJSON *s = cJSON_GetObjectItem(j, "seconds"), *t = cJSON_GetObjectItem(j, "tokens");
    const cJSON *h = cJSON_GetObjectItem(j, "ids_fnv1a64");
    if (status == 0 && cJSON_IsNumber(s) && cJSON_IsNumber(t) && cJSON_IsString(h)) {
        *seconds = s->valuedouble;
        *tokens = (size_t)t->valuedouble;
        *hash = strtoull(h->valuestring, NULL, 16);
        rc = 0;
    }
    cJSON_Delete(j);
remove_docs:
    if (!getenv("MOEQ_BENCH_KEEP_DOCS")) remove(docs_path);
    else fprintf(stderr, "bench-tokenizer: documents kept in %s\n", docs_path);
    return rc;
}

int main(int argc, char **argv) {
    double mb = 10;
    int reference = 1;
    char tok_dir[4096];
    snprintf(tok_dir, sizeof tok_dir, "%s/.deps/tokenizers/deepseek_v3", MOEQ_SOURCE_DIR);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) snprintf(tok_dir, sizeof tok_dir, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--no-reference")) reference = 0;
        else {
            fprintf(stderr, "usage: bench-tokenizer [--mb N] [--model DIR] [--no-reference]\n");
            return 2;
        }
    }
    char errstr[512];
    moeq_tokenizer *tok = NULL;
    if (moeq_tokenizer_load(tok_dir, &tok, errstr, sizeof errstr)) {
        fprintf(stderr, "bench-tokenizer: %s (run scripts/setup.sh)\n", errstr);
        return 1;
    }
    docs d;
    if (make_docs(&d, mb)) return 1;

    moeq_tokens out = {0};
    uint64_t hash = 0xcbf29ce484222325ull;
    size_t tokens = 0;
    double seconds = 0;
    for (size_t i = 0; i < d.n; i++) {
        out.n = 0;
        int64_t t0 = moeq_mono_ns();
        if (moeq_tokenizer_encode(tok, d.text[i], d.len[i], 0, &out, errstr, sizeof errstr)) {
            fprintf(stderr, "bench-tokenizer: %s\n", errstr);
            return 1;
        }
        seconds += (double)(moeq_mono_ns() - t0) / 1e9;
        tokens += out.n;
        hash = fnv_ids(hash, out.ids, out.n);
    }
    double ref_s = 0;
    size_t ref_tokens = 0;
    uint64_t ref_hash = 0;
    int have_ref = reference && run_reference(&d, tok_dir, &ref_s, &ref_tokens, &ref_hash) == 0;

    double mbs = (double)d.bytes / 1e6 / seconds;
    printf("{\"bench\": \"tokenizer\", \"docs\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"threads\": 1,\n"
           " \"moeq\": {\"seconds\": %.4f, \"mb_per_s\": %.2f, \"tokens_per_s\": %.0f},\n",
           d.n, d.bytes, tokens, seconds, mbs, (double)tokens / seconds);
    if (have_ref)
        printf(" \"reference\": {\"impl\": \"HF tokenizers (Node binding)\", \"seconds\": %.4f, \"mb_per_s\": %.2f, "
               "\"tokens\": %zu, \"tokens_per_s\": %.0f},\n \"speedup\": %.2f, \"ids_agree\": %s}\n",
               ref_s, (double)d.bytes / 1e6 / ref_s, ref_tokens, (double)ref_tokens / ref_s, ref_s / seconds,
               ref_tokens == tokens && ref_hash == hash ? "true" : "false");
    else
        printf(" \"reference\": null, \"speedup\": null, \"ids_agree\": null}\n");
    moeq_tokens_free(&out);
    for (size_t i = 0; i < d.n; i++) free(d.text[i]);
    free(d.text);
    free(d.len);
    moeq_tokenizer_destroy(tok);
    return have_ref && (ref_tokens != tokens || ref_hash != hash) ? 1 : 0;
}
