/*
 * cmd_engine.c — `moeq generate` and `moeq logits`: thin shells over the
 * engine (moeq/engine.h) and, when the model directory has one, the
 * tokenizer. Output is one JSON document on stdout; errors go to stderr with
 * exit status 1 (2 for usage).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "moeq/config.h"
#include "moeq/engine.h"
#include "moeq/tokenizer.h"
#ifdef MOEQ_WORKER_SHELL /* --response-format: the worker's processor (a build with the worker) */
#include "decode_proc.h"
#include "moeq/grammar.h"
#include "moeq/job.h"
#endif

typedef struct engine_args {
    const char *model_dir, *prompt, *tokens;
    int max_new_tokens, top, n_threads, batch_invariant, mtp_k, mtp_rejection, max_model_len, device;
    const char *backend, *mtp_draft, *response_format;
    const char *sets[16]; /* --set KEY=VALUE: any engine key (docs/CONFIGURATION.md), applied last, in order */
    int n_sets;
    moeq_sampling_params sampling;
} engine_args;

static void generate_usage(FILE *out) {
    fprintf(out, "usage: moeq generate --model DIR (--prompt TEXT | --tokens 1,2,3) [options]\n"
                 "\n"
                 "  --max-new-tokens N  (default 32)\n"
                 "  --temperature T     0 = greedy (default 0)\n"
                 "  --top-k K           0 = off (default 0)\n"
                 "  --top-p P           1 = off (default 1)\n"
                 "  --seed S            (default 0)\n"
                 "  --threads N         0 = all cores (default 0)\n"
                 "  --backend NAME      cpu (default), cuda (a build with CUDA; docs/CUDA.md) or cpu-device\n"
                 "                      (the CPU behind a GPU's contract: the device paths, for tests)\n"
                 "  --device N          GPU ordinal for --backend cuda (default 0)\n"
                 "  --mtp K             speculative decoding with the model's MTP layer, K drafts per\n"
                 "                      step (1..8; default 0 = off); the same tokens, adds \"mtp\":\n"
                 "                      {\"k\",\"drafted\",\"accepted\",\"acceptance\",\"steps\"}\n"
                 "  --mtp-rejection     with --mtp and sampling: speculative rejection sampling (the\n"
                 "                      same distribution, other tokens) instead of the exact mode\n"
                 "  --mtp-draft W       the weights drafts are made with: f8 (default: 8-bit copies of\n"
                 "                      the MTP layer's projections and head, int8 rows where the CPU\n"
                 "                      has AVX512-VNNI, else F8 E4M3), e4m3 (F8 E4M3 copies) or\n"
                 "                      exact; the same tokens\n"
                 "  --response-format J structured output as a job's response_format, J its JSON or\n"
                 "                      @FILE: {\"type\":\"json_object\"}, {\"type\":\"json_schema\",\n"
                 "                      \"json_schema\":{\"schema\":{...}}}, {\"type\":\"regex\",\"pattern\":P}\n"
                 "                      or {\"type\":\"choice\",\"choices\":[...]} (schemas/job.md); the text\n"
                 "                      is complete within --max-new-tokens; needs the model's tokenizer\n"
                 "  --max-model-len N   context: prompt + max-new-tokens at most N (default 0 = the\n"
                 "                      model's max_position_embeddings, never more); refused, not cut\n"
                 "  --set KEY=VALUE     any engine key (docs/CONFIGURATION.md: cpu_matrix, head_screen,\n"
                 "                      cpu_prefetch, ...), after the flags above; repeatable (16 at most)\n"
                 "Stops at the model's eos id. Prints {\"prompt_tokens\",\"tokens\"[,\"text\"]}; text is\n"
                 "every decoded byte (a 0x00 byte as \\u0000). NaN/inf in the logits (broken weights):\n"
                 "exit 1 with numerical: ..., nothing printed on stdout.\n");
}

static void logits_usage(FILE *out) {
    fprintf(out, "usage: moeq logits --model DIR --tokens 1,2,3 [--top K] [--threads N] [--mtp 1]\n"
                 "                   [--mtp-draft exact|f8|e4m3] [--backend cpu|cuda] [--device N]\n"
                 "                   [--set KEY=VALUE ...]\n"
                 "\n"
                 "--set: any engine key (docs/CONFIGURATION.md), after the other flags; repeatable.\n"
                 "--mtp 1 adds \"mtp_positions\": the MTP layer's logits at every position but the last\n"
                 "(with its own weights; --mtp-draft f8 or e4m3: with the 8-bit copies drafts use).\n"
                 "Prints every position's K best ids and logits (default 5), best first;\n"
                 "--top 0 prints all vocab_size logits of every position in id order (%%.9g).\n");
}

/* Numbers whole (args.h); --mtp auto also says where auto lives. */
static int int_arg(const char *flag, const char *v, int *out) {
    if (!strcmp(flag, "--mtp") && !strcmp(v, "auto")) {
        fprintf(stderr, "moeq: --mtp: 'auto' is not an integer (auto is the worker's mtp_k = auto, which learns "
                        "from a batch's steps; give 0..8 here)\n");
        return -1;
    }
    return moeq_cli_int_arg(flag, v, out);
}

static int parse_args(int argc, char **argv, engine_args *a) {
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--no-batch-invariant")) {
            a->batch_invariant = 0;
            continue;
        }
        if (!strcmp(k, "--mtp-rejection")) {
            a->mtp_rejection = 1;
            continue;
        }
        if (!v) return -1;
        i++;
        if (!strcmp(k, "--model")) a->model_dir = v;
        else if (!strcmp(k, "--prompt")) a->prompt = v;
        else if (!strcmp(k, "--tokens")) a->tokens = v;
        else if (!strcmp(k, "--max-new-tokens")) {
            if (int_arg(k, v, &a->max_new_tokens)) return -1;
        }
        else if (!strcmp(k, "--temperature")) {
            if (moeq_cli_double_arg(k, v, &a->sampling.temperature)) return -1;
        }
        else if (!strcmp(k, "--top-k")) {
            if (int_arg(k, v, &a->sampling.top_k)) return -1;
        }
        else if (!strcmp(k, "--top-p")) {
            if (moeq_cli_double_arg(k, v, &a->sampling.top_p)) return -1;
        } else if (!strcmp(k, "--seed")) {
            if (moeq_cli_u64_arg(k, v, &a->sampling.seed)) return -1;
        }
        else if (!strcmp(k, "--top")) {
            if (int_arg(k, v, &a->top)) return -1;
        }
        else if (!strcmp(k, "--threads")) {
            if (int_arg(k, v, &a->n_threads)) return -1;
        }
        else if (!strcmp(k, "--backend")) a->backend = v;
        else if (!strcmp(k, "--device")) {
            if (int_arg(k, v, &a->device)) return -1;
        }
        else if (!strcmp(k, "--mtp")) {
            if (int_arg(k, v, &a->mtp_k)) return -1;
        }
        else if (!strcmp(k, "--mtp-draft")) a->mtp_draft = v;
        else if (!strcmp(k, "--max-model-len")) {
            if (int_arg(k, v, &a->max_model_len)) return -1;
        }
        else if (!strcmp(k, "--response-format")) a->response_format = v;
        else if (!strcmp(k, "--set")) {
            if (a->n_sets == (int)(sizeof a->sets / sizeof a->sets[0]) || !strchr(v, '=')) return -1;
            a->sets[a->n_sets++] = v;
        }
        else return -1;
    }
    return a->model_dir ? 0 : -1;
}

/* "1,2,3" → ids (malloc'd). */
static int parse_ids(const char *s, int32_t **out, int *n) {
    int cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    if (!ids) return -1;
    int m = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) break;
        ids[m++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') break;
    }
    if (*s || m == 0) {
        free(ids);
        return -1;
    }
    *out = ids;
    *n = m;
    return 0;
}

/* n bytes, 0x00 included (as \u0000): what the tokens decode to, not what strlen sees. */
static void print_json_string(const char *s, size_t n) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s, *end = p + n; p < end; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p == '\n') fputs("\\n", stdout);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

static void print_ids(const char *key, const int32_t *ids, int n) {
    printf("\"%s\":[", key);
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    putchar(']');
}

typedef struct session {
    moeq_model *model;
    moeq_engine *engine;
    moeq_tokenizer *tok;
    int32_t *ids;
    int n_ids;
} session;

static void session_close(session *s) {
    moeq_engine_destroy(s->engine);
    moeq_model_destroy(s->model);
    moeq_tokenizer_destroy(s->tok);
    free(s->ids);
}

/* Load model (+ tokenizer when present), read the input ids, create an engine sized for them. */
static int session_open(session *s, const engine_args *a, int extra_tokens, const char *cmd) {
    char err[512] = "";
    moeq_err rc = moeq_model_load(a->model_dir, NULL, &s->model, err, sizeof(err));
    if (rc) return fprintf(stderr, "moeq %s: %s: %s\n", cmd, moeq_err_str(rc), err), 1;
    if (moeq_tokenizer_load(a->model_dir, &s->tok, err, sizeof(err)) != MOEQ_OK) s->tok = NULL;
    if (a->tokens) {
        if (parse_ids(a->tokens, &s->ids, &s->n_ids)) return fprintf(stderr, "moeq %s: bad --tokens\n", cmd), 2;
    } else if (a->prompt && s->tok) {
        moeq_tokens t = {0};
        unsigned flags = moeq_tokenizer_add_bos(s->tok) ? MOEQ_TOKENIZE_ADD_BOS : 0;
        if ((rc = moeq_tokenizer_encode(s->tok, a->prompt, strlen(a->prompt), flags, &t, err, sizeof(err))))
            return fprintf(stderr, "moeq %s: encode: %s\n", cmd, err), 1;
        s->ids = t.ids;
        s->n_ids = (int)t.n;
    } else {
        return fprintf(stderr, "moeq %s: %s\n", cmd, a->prompt ? "the model has no tokenizer; use --tokens" : "--prompt or --tokens is required"), 2;
    }
    if (s->n_ids < 1) return fprintf(stderr, "moeq %s: empty prompt\n", cmd), 2;
    moeq_engine_params p = moeq_engine_default_params();
    p.max_seqs = a->mtp_k > 0 ? 2 : 1; /* logits --mtp: a second, speculative sequence */
    p.kv_cache_tokens = (int64_t)p.max_seqs * (s->n_ids + extra_tokens + 1 + MOEQ_MTP_MAX_K + 16); /* + drafts */
    p.n_threads = a->n_threads;
    p.batch_invariant = a->batch_invariant;
    if (a->backend) snprintf(p.backend, sizeof p.backend, "%s", a->backend);
    p.device = a->device;
    /* logits --mtp prints the MTP layer's own logits (what the float64 reference checks): exact weights unless
     * asked otherwise; generate drafts with the engine's default */
    const char *draft = a->mtp_draft ? a->mtp_draft : !strcmp(cmd, "logits") ? "exact" : NULL;
    if (draft) snprintf(p.mtp_draft, sizeof p.mtp_draft, "%s", draft);
    p.max_model_len = a->max_model_len;
    p.max_step_tokens = s->n_ids < 512 ? s->n_ids : 512;
    /* an MTP verify step is the token and its k drafts: a shorter prompt left the engine too narrow for it (a
     * one-token prompt with --mtp 1 failed with "step of 2 tokens exceeds max_step_tokens 1") */
    if (p.max_step_tokens < 1 + a->mtp_k) p.max_step_tokens = 1 + a->mtp_k;
    for (int i = 0; i < a->n_sets; i++) {
        char key[64];
        size_t n = (size_t)(strchr(a->sets[i], '=') - a->sets[i]);
        snprintf(key, sizeof key, "%.*s", (int)(n < sizeof key ? n : sizeof key - 1), a->sets[i]);
        rc = moeq_props_set(moeq_engine_params_props, &p, key, a->sets[i] + n + 1, err, sizeof err);
        if (rc == MOEQ_ERR_NOT_FOUND)
            return fprintf(stderr, "moeq %s: --set %s: no engine key %s (docs/CONFIGURATION.md)\n", cmd, a->sets[i],
                           key),
                   2;
        if (rc) return fprintf(stderr, "moeq %s: --set %s: %s\n", cmd, a->sets[i], err), 2;
    }
    if ((rc = moeq_engine_new(s->model, &p, &s->engine, err, sizeof(err))))
        return fprintf(stderr, "moeq %s: engine: %s: %s\n", cmd, moeq_err_str(rc), err), 1;
    int ctx = moeq_engine_max_model_len(s->engine);
    if ((int64_t)s->n_ids + extra_tokens > ctx) /* refused as the coordinator and the worker refuse it */
        return fprintf(stderr,
                       "moeq %s: prompt_too_long: prompt of %d tokens + %d new tokens exceeds the model's context of "
                       "%d tokens (max_position_embeddings%s)\n",
                       cmd, s->n_ids, extra_tokens, ctx, a->max_model_len ? " / --max-model-len" : ""),
               1;
    return 0;
}

/* --response-format: the text, decoded and validated as the worker decodes a job's field, compiled against the
 * tokenizer's vocabulary, and the worker's logits processor (worker/decode_proc.h) as the sampler's hook. */
typedef struct constraint {
    const moeq_tokenizer *tok;
    int32_t eos;
#ifdef MOEQ_WORKER_SHELL
    moeq_grammar_vocab *vocab;
    moeq_grammar *grammar;
    moeq_decode_proc *proc;
#endif
    moeq_sampler_hook hook;
} constraint;

#ifdef MOEQ_WORKER_SHELL
static int constraint_token(void *ctx, int32_t id, const char **bytes, size_t *len) {
    const constraint *c = ctx;
    if (id == c->eos) return -1; /* the end is the processor's to allow, as in the worker */
    return moeq_tokenizer_token_bytes(c->tok, id, bytes, len) == 0 ? 0 : -1;
}

/* J or the contents of @FILE (malloc'd), or NULL with the reason. */
static char *read_arg(const char *arg, char *err, size_t err_size) {
    if (arg[0] != '@') return strdup(arg);
    FILE *f = fopen(arg + 1, "rb");
    if (!f) return snprintf(err, err_size, "cannot open %s", arg + 1), NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n + 4096 + 1 > cap && !(buf = realloc(buf, cap = 2 * cap + 4096 + 1))) break;
        got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
    } while (got > 0);
    fclose(f);
    if (buf) buf[n] = 0;
    else snprintf(err, err_size, "out of memory reading %s", arg + 1);
    return buf;
}
#endif

static moeq_err constraint_open(constraint *c, const char *arg, const session *s, int32_t eos, int max_new_tokens,
                                char *err, size_t err_size) {
    memset(c, 0, sizeof *c);
#ifndef MOEQ_WORKER_SHELL
    (void)arg, (void)s, (void)eos, (void)max_new_tokens;
    return moeq_errf(MOEQ_ERR_UNSUPPORTED, err, err_size, "this moeq was built without the worker (a GPU check "
                     "build): --response-format needs its logits processor");
#else
    if (!s->tok) return moeq_errf(MOEQ_ERR_UNSUPPORTED, err, err_size, "the model has no tokenizer");
    c->tok = s->tok, c->eos = eos;
    char *text = read_arg(arg, err, err_size);
    if (!text) return MOEQ_ERR_INVALID_ARG;
    /* a job around it, so that the worker's own decoder says what is wrong with it */
    size_t cap = strlen(text) + 64;
    char *doc = malloc(cap);
    if (!doc) return free(text), moeq_errf(MOEQ_ERR_NOMEM, err, err_size, "response_format");
    snprintf(doc, cap, "{\"v\":1,\"id\":\"cli\",\"tokens\":[0],\"response_format\":%s}", text);
    free(text);
    moeq_job job;
    moeq_job_reject rej;
    moeq_err e = moeq_job_decode(doc, strlen(doc), "application/json", NULL, &job, &rej);
    free(doc);
    if (e) return moeq_errf(MOEQ_ERR_INVALID_ARG, err, err_size, "%s", rej.message[0] ? rej.message : moeq_err_str(e));
    const moeq_response_format *rf = &job.response_format;
    if (rf->type == MOEQ_RESPONSE_TEXT) return moeq_job_free(&job), MOEQ_OK; /* plain text: nothing to do */
    moeq_grammar_spec spec = moeq_response_format_spec(rf);
    moeq_grammar_limits lim = moeq_grammar_default_limits();
    int vocab = moeq_model_get_config(s->model)->vocab_size;
    if (!(e = moeq_grammar_vocab_new(vocab, constraint_token, c, &c->vocab, err, err_size)))
        e = moeq_grammar_compile(&spec, c->vocab, &lim, &c->grammar, err, err_size);
    moeq_job_free(&job);
    if (e) return e;
    moeq_decode_proc_params pp = {.grammar = c->grammar, .eos_ids = &c->eos, .n_eos = eos >= 0,
                                  .max_new_tokens = max_new_tokens > 0 ? max_new_tokens : 1};
    if ((e = moeq_decode_proc_new(&pp, vocab, &c->proc, err, err_size))) return e;
    c->hook = moeq_decode_proc_hook(c->proc);
    return MOEQ_OK;
#endif
}

static void constraint_close(constraint *c) {
#ifdef MOEQ_WORKER_SHELL
    moeq_decode_proc_destroy(c->proc);
    moeq_grammar_release(c->grammar);
    moeq_grammar_vocab_destroy(c->vocab);
#endif
    (void)c;
}

static const moeq_sampler_hook *constraint_hook(const constraint *c) {
#ifdef MOEQ_WORKER_SHELL
    return c->proc ? &c->hook : NULL;
#else
    (void)c;
    return NULL;
#endif
}

int moeq_cmd_generate(int argc, char **argv);
int moeq_cmd_generate(int argc, char **argv) {
    engine_args a = {.max_new_tokens = 32, .batch_invariant = 1, .sampling = moeq_sampling_default_params()};
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) return generate_usage(stdout), 0;
    if (parse_args(argc, argv, &a) || a.max_new_tokens < 0 || a.mtp_k < 0 || a.mtp_k > MOEQ_MTP_MAX_K)
        return generate_usage(stderr), 2;
    session s = {0};
    int rc = session_open(&s, &a, a.max_new_tokens, "generate");
    if (rc) return session_close(&s), rc;
    int32_t stop = s.tok && moeq_tokenizer_eos_id(s.tok) >= 0 ? moeq_tokenizer_eos_id(s.tok)
                                                                : moeq_model_get_config(s.model)->eos_token_id;
    char err[512] = "";
    constraint con;
    memset(&con, 0, sizeof con);
    if (a.response_format) {
        moeq_err ce = constraint_open(&con, a.response_format, &s, stop, a.max_new_tokens, err, sizeof(err));
        if (ce) {
            fprintf(stderr, "moeq generate: --response-format: %s: %s\n", moeq_err_str(ce), err);
            constraint_close(&con);
            session_close(&s);
            return ce == MOEQ_ERR_INVALID_ARG ? 2 : 1;
        }
    }
    moeq_generate_stats stats = {0};
    moeq_generate_params gp = {.sampling = a.sampling, .max_new_tokens = a.max_new_tokens, .stop_ids = &stop,
                               .n_stop_ids = stop >= 0 ? 1 : 0, .mtp_k = a.mtp_k,
                               .mtp_rejection = a.mtp_rejection, .stats = &stats, .hook = constraint_hook(&con)};
    int32_t *out = NULL;
    int n_out = 0;
    moeq_err e = moeq_generate(s.engine, s.ids, s.n_ids, &gp, &out, &n_out, err, sizeof(err));
    constraint_close(&con);
    if (e) {
        fprintf(stderr, "moeq generate: %s: %s\n", moeq_err_str(e), err);
        session_close(&s);
        return 1;
    }
    putchar('{');
    print_ids("prompt_tokens", s.ids, s.n_ids);
    putchar(',');
    print_ids("tokens", out, n_out);
    if (a.mtp_k > 0)
        printf(",\"mtp\":{\"k\":%d,\"drafted\":%lld,\"accepted\":%lld,\"acceptance\":%.4f,\"steps\":%lld}", a.mtp_k,
               (long long)stats.drafted, (long long)stats.accepted,
               stats.drafted ? (double)stats.accepted / (double)stats.drafted : 0.0, (long long)stats.rounds);
    char *text = NULL;
    size_t text_len = 0;
    if (s.tok && moeq_tokenizer_decode(s.tok, out, (size_t)n_out, 0, &text, &text_len, err, sizeof(err)) == MOEQ_OK) {
        fputs(",\"text\":", stdout);
        print_json_string(text, text_len);
    }
    puts("}");
    free(text);
    free(out);
    session_close(&s);
    return 0;
}

/* The k best ids of a row, best first (ties: lower id). */
static void top_ids(const float *row, int vocab, int k, int32_t *best) {
    int m = 0;
    for (int32_t i = 0; i < vocab; i++) {
        if (m == k && !(row[i] > row[best[m - 1]])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && row[i] > row[best[j - 1]]) {
            best[j] = best[j - 1];
            j--;
        }
        best[j] = i;
    }
}

static void print_position(int pos, int32_t token, const float *row, int vocab, int top, int32_t *best) {
    printf("%s{\"pos\":%d,\"token\":%d,", pos ? ",\n" : "\n", pos, token);
    if (top == 0) {
        fputs("\"logits\":[", stdout);
        for (int i = 0; i < vocab; i++) printf("%s%.9g", i ? "," : "", row[i]);
        fputs("]}", stdout);
        return;
    }
    top_ids(row, vocab, top, best);
    print_ids("ids", best, top);
    fputs(",\"logits\":[", stdout);
    for (int i = 0; i < top; i++) printf("%s%.9g", i ? "," : "", row[best[i]]);
    fputs("]}", stdout);
}

/*
 * --mtp 1: also the MTP layer's logits of every position i < n-1 (predicting
 * token i+2 from the main hidden at i and token i+1), computed on a second,
 * speculative sequence one token at a time: step t_i, then one MTP step with
 * t_{i+1}. What tests/reference/compare_mtp.py checks.
 */
static int print_mtp_positions(session *s, float *logits, int vocab, int top, int32_t *best) {
    int seq = -1;
    char err[512] = "";
    moeq_err e = moeq_engine_seq_new(s->engine, &seq);
    if (!e) e = moeq_engine_seq_set_mtp(s->engine, seq, 1);
    fputs("\n],\"mtp_positions\":[", stdout);
    for (int i = 0; !e && i + 1 < s->n_ids; i++) {
        moeq_step_item item = {seq, s->ids + i, 1, 0};
        moeq_mtp_item draft = {seq, s->ids[i + 1]};
        e = moeq_engine_step(s->engine, &item, 1, logits, 1, err, sizeof(err));
        if (!e) e = moeq_engine_mtp_step(s->engine, &draft, 1, logits, 1, err, sizeof(err));
        if (!e) print_position(i, s->ids[i + 1], logits, vocab, top, best);
    }
    if (e) fprintf(stderr, "moeq logits --mtp: %s: %s\n", moeq_err_str(e), err);
    return e ? 1 : 0;
}

/* The first of n rows holding NaN or inf, or -1. */
static int first_nonfinite_row(const float *logits, int n, int vocab) {
    for (int r = 0; r < n; r++)
        for (int i = 0; i < vocab; i++)
            if (!isfinite(logits[(size_t)r * vocab + i])) return r;
    return -1;
}

int moeq_cmd_logits(int argc, char **argv);
int moeq_cmd_logits(int argc, char **argv) {
    engine_args a = {.top = 5, .batch_invariant = 1, .sampling = moeq_sampling_default_params()};
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) return logits_usage(stdout), 0;
    if (parse_args(argc, argv, &a) || a.top < 0 || !a.tokens) return logits_usage(stderr), 2;
    session s = {0};
    int rc = session_open(&s, &a, 0, "logits");
    if (rc) return session_close(&s), rc;
    int vocab = moeq_model_get_config(s.model)->vocab_size, chunk = s.n_ids < 512 ? s.n_ids : 512;
    if (a.top > vocab) a.top = vocab;
    float *logits = malloc((size_t)chunk * vocab * sizeof(float));
    int32_t *best = malloc((size_t)(a.top + 1) * sizeof(int32_t));
    rc = logits && best ? 0 : 1;
    int seq = -1;
    if (!rc) rc = moeq_engine_seq_new(s.engine, &seq) ? 1 : 0;
    printf("{\"vocab_size\":%d,\"positions\":[", vocab);
    for (int off = 0; !rc && off < s.n_ids; off += chunk) {
        int n = s.n_ids - off < chunk ? s.n_ids - off : chunk;
        moeq_step_item item = {seq, s.ids + off, n, 1};
        char err[512] = "";
        moeq_err e = moeq_engine_step(s.engine, &item, 1, logits, (size_t)n, err, sizeof(err));
        if (e) {
            fprintf(stderr, "moeq logits: %s: %s\n", moeq_err_str(e), err);
            rc = 1;
            break;
        }
        int bad = first_nonfinite_row(logits, n, vocab);
        if (bad >= 0) {
            int layer = moeq_engine_seq_nonfinite_layer(s.engine, seq);
            fprintf(stderr, "moeq logits: numerical: non-finite logits (NaN or inf) at position %d", off + bad);
            if (layer >= 0) fprintf(stderr, "; first seen by the router of layer %d", layer);
            fprintf(stderr, ": the weights hold non-finite or overflowing values (moeq model-info --check-weights)\n");
            rc = 1;
            break;
        }
        for (int i = 0; i < n; i++) print_position(off + i, s.ids[off + i], logits + (size_t)i * vocab, vocab, a.top, best);
    }
    if (!rc && a.mtp_k > 0) rc = print_mtp_positions(&s, logits, vocab, a.top, best);
    puts("\n]}");
    free(logits);
    free(best);
    session_close(&s);
    return rc;
}
