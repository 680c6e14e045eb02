/*
 * moeq tokenize — the tokenizer from the command line (moeq/tokenizer.h).
 *
 *   moeq tokenize --model DIR < text            → [id, id, ...]
 *   moeq tokenize --model DIR --decode < ids    → text ([1,2] or "1 2")
 *   moeq tokenize --model DIR --chat < messages → ids of a chat
 *       (messages: [{"role": "user", "content": "..."}, ...])
 *
 * A thin shell: reads stdin, calls the library, prints. Exit 0 on success,
 * 1 on a tokenizer error (message on stderr), 2 on bad usage.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/tokenizer.h"

#define MAX_STDIN (1u << 30)

static void usage(FILE *out) {
    fprintf(out,
            "usage: moeq tokenize (--model DIR | --tiny) [options] < input\n"
            "\n"
            "Encodes UTF-8 text from stdin and prints its ids as a JSON array.\n"
            "\n"
            "  --model DIR      tokenizer.json (+ tokenizer_config.json) in DIR\n"
            "  --tiny           the built-in tokenizer of the tiny test model\n"
            "  --decode         stdin holds ids (JSON array or whitespace-separated); print text\n"
            "  --chat           stdin holds a JSON array of {role, content} messages; print the\n"
            "                   ids of the model's chat format, ending in the assistant prompt\n"
            "  --no-gen-prompt  with --chat: do not append the assistant prompt\n"
            "  --add-bos        prepend bos (what transformers does for add_bos_token models)\n"
            "  --no-added       treat added-token text such as <｜User｜> as plain text\n"
            "  --skip-special   with --decode: drop special tokens\n"
            "  --count          print only the number of ids\n");
}

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) return NULL;
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            if (cap >= MAX_STDIN) break;
            char *grown = realloc(buf, 2 * cap + 1);
            if (!grown) free(buf);
            buf = grown;
            cap *= 2;
        }
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static int print_ids(const moeq_tokens *tokens, int count_only) {
    if (count_only) return printf("%zu\n", tokens->n) < 0;
    putchar('[');
    for (size_t i = 0; i < tokens->n; i++) printf(i ? ",%d" : "%d", (int)tokens->ids[i]);
    puts("]");
    return 0;
}

static moeq_err decode_stdin(const moeq_tokenizer *tok, const char *in, unsigned flags,
                             char *errstr, size_t errstr_size) {
    moeq_tokens tokens = {0};
    moeq_err err = MOEQ_OK;
    for (const char *p = in; *p;) {
        if (!strchr("0123456789-", *p)) {
            if (!strchr(" \t\r\n,[]", *p)) {
                err = moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size,
                                "tokenize --decode: unexpected '%c' in the ids", *p);
                break;
            }
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX) {
            err = moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "tokenize --decode: bad id near '%.10s'", p);
            break;
        }
        if (tokens.n == tokens.cap) {
            tokens.cap = tokens.cap ? 2 * tokens.cap : 1024;
            int32_t *ids = realloc(tokens.ids, tokens.cap * sizeof *ids);
            if (!ids) {
                err = moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
                break;
            }
            tokens.ids = ids;
        }
        tokens.ids[tokens.n++] = (int32_t)v;
        p = end;
    }
    char *text = NULL;
    size_t len = 0;
    if (!err) err = moeq_tokenizer_decode(tok, tokens.ids, tokens.n, flags, &text, &len, errstr, errstr_size);
    if (!err) fwrite(text, 1, len, stdout);
    free(text);
    moeq_tokens_free(&tokens);
    return err;
}

static moeq_err chat_stdin(const moeq_tokenizer *tok, const char *in, size_t len, int gen_prompt,
                           moeq_tokens *tokens, char *errstr, size_t errstr_size) {
    cJSON *root = cJSON_ParseWithLength(in, len);
    if (!cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size,
                         "tokenize --chat: stdin is not a JSON array of messages");
    }
    size_t n = (size_t)cJSON_GetArraySize(root), i = 0;
    moeq_chat_message *messages = calloc(n ? n : 1, sizeof *messages);
    moeq_err err = messages ? MOEQ_OK : moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
    for (const cJSON *m = root->child; m && !err; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content))
            err = moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size,
                            "tokenize --chat: messages[%zu] needs string \"role\" and \"content\"", i);
        else
            messages[i] = (moeq_chat_message){role->valuestring, content->valuestring};
    }
    if (!err) err = moeq_tokenizer_apply_chat(tok, messages, n, gen_prompt, tokens, errstr, errstr_size);
    free(messages);
    cJSON_Delete(root);
    return err;
}

int moeq_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL;
    int tiny = 0, decode = 0, chat = 0, gen_prompt = 1, count = 0;
    unsigned enc_flags = 0, dec_flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(a, "--tiny")) tiny = 1;
        else if (!strcmp(a, "--decode")) decode = 1;
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--no-gen-prompt")) gen_prompt = 0;
        else if (!strcmp(a, "--add-bos")) enc_flags |= MOEQ_TOKENIZE_ADD_BOS;
        else if (!strcmp(a, "--no-added")) enc_flags |= MOEQ_TOKENIZE_NO_ADDED;
        else if (!strcmp(a, "--skip-special")) dec_flags |= MOEQ_DECODE_SKIP_SPECIAL;
        else if (!strcmp(a, "--count")) count = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 0;
        else {
            fprintf(stderr, "moeq tokenize: unknown option '%s'\n", a);
            return usage(stderr), 2;
        }
    }
    if (!model == !tiny || (decode && chat)) return usage(stderr), 2;
    char errstr[512] = "";
    moeq_tokenizer *tok = NULL;
    moeq_err err = tiny ? moeq_tokenizer_load_tiny(&tok, errstr, sizeof errstr)
                        : moeq_tokenizer_load(model, &tok, errstr, sizeof errstr);
    size_t len = 0;
    char *in = err ? NULL : read_stdin(&len);
    if (!err && !in) err = moeq_errf(MOEQ_ERR_NOMEM, errstr, sizeof errstr, "cannot read stdin");
    moeq_tokens tokens = {0};
    if (!err && decode) err = decode_stdin(tok, in, dec_flags, errstr, sizeof errstr);
    else if (!err && chat) err = chat_stdin(tok, in, len, gen_prompt, &tokens, errstr, sizeof errstr);
    else if (!err) err = moeq_tokenizer_encode(tok, in, len, enc_flags, &tokens, errstr, sizeof errstr);
    if (!err && !decode) print_ids(&tokens, count);
    moeq_tokens_free(&tokens);
    free(in);
    moeq_tokenizer_destroy(tok);
    if (err) {
        fprintf(stderr, "moeq tokenize: %s: %s\n", moeq_err_str(err), errstr);
        return 1;
    }
    return 0;
}
