/*
 * tokenizer_chat.c — built-in chat formats, rendered as the model's Jinja
 * chat_template would render them, then encoded.
 *
 * DeepSeek-V3 (tokenizer_config.json chat_template, without tool calls):
 *
 *   bos + system prompts joined by "\n\n"
 *   user:       "<｜User｜>" + content
 *   assistant:  "<｜Assistant｜>" + content + "<｜end▁of▁sentence｜>"
 *               (after tool outputs: "<｜tool▁outputs▁end｜>" + content + eos)
 *   tool:       first "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" + content
 *               + "<｜tool▁output▁end｜>", later ones "\n<｜tool▁output▁begin｜>"...
 *   end:        "<｜tool▁outputs▁end｜>" if the last turn was a tool output;
 *               add_generation_prompt (and not after a tool) → "<｜Assistant｜>"
 *
 * It does not interpret Jinja: an unknown template is MOEQ_CHAT_FORMAT_NONE
 * and rendering it is MOEQ_ERR_UNSUPPORTED.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

typedef struct strbuf {
    char *s;
    size_t len, cap;
    int oom;
} strbuf;

static void sb_add(strbuf *sb, const char *s) {
    size_t n = strlen(s);
    if (sb->oom) return;
    if (sb->len + n + 1 > sb->cap) {
        size_t cap = 2 * (sb->len + n + 1) + 64;
        char *p = realloc(sb->s, cap);
        if (!p) {
            sb->oom = 1;
            return;
        }
        sb->s = p;
        sb->cap = cap;
    }
    memcpy(sb->s + sb->len, s, n + 1);
    sb->len += n;
}

static moeq_err check_messages(const moeq_chat_message *messages, size_t n, char *errstr,
                               size_t errstr_size) {
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    for (size_t i = 0; i < n; i++) {
        int known = 0;
        for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++)
            known |= messages[i].role && !strcmp(messages[i].role, roles[r]);
        if (!known)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                             "chat: messages[%zu].role \"%s\" is not system, user, assistant or tool",
                             i, messages[i].role ? messages[i].role : "(null)");
        if (!messages[i].content)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                             "chat: messages[%zu].content is missing (tool calls are not supported)", i);
    }
    return MOEQ_OK;
}

static void render_deepseek_v3(const moeq_tokenizer *tok, const moeq_chat_message *m, size_t n,
                               int add_generation_prompt, strbuf *sb) {
    sb_add(sb, tok->bos_text ? tok->bos_text : "");
    int first_system = 1;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(m[i].role, "system")) continue;
        if (!first_system) sb_add(sb, "\n\n");
        sb_add(sb, m[i].content);
        first_system = 0;
    }
    int is_tool = 0, is_output_first = 1;
    for (size_t i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (!strcmp(role, "user")) {
            is_tool = 0;
            sb_add(sb, "<｜User｜>");
            sb_add(sb, m[i].content);
        } else if (!strcmp(role, "assistant")) {
            sb_add(sb, is_tool ? "<｜tool▁outputs▁end｜>" : "<｜Assistant｜>");
            sb_add(sb, m[i].content);
            sb_add(sb, "<｜end▁of▁sentence｜>");
            is_tool = 0;
        } else if (!strcmp(role, "tool")) {
            is_tool = 1;
            sb_add(sb, is_output_first ? "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>"
                                       : "\n<｜tool▁output▁begin｜>");
            sb_add(sb, m[i].content);
            sb_add(sb, "<｜tool▁output▁end｜>");
            is_output_first = 0;
        }
    }
    if (is_tool) sb_add(sb, "<｜tool▁outputs▁end｜>");
    if (add_generation_prompt && !is_tool) sb_add(sb, "<｜Assistant｜>");
}

moeq_err moeq_tokenizer_render_chat(const moeq_tokenizer *tok, const moeq_chat_message *messages,
                                    size_t n, int add_generation_prompt, char **out,
                                    char *errstr, size_t errstr_size) {
    if (!tok || !out || (!messages && n))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "chat: NULL argument");
    *out = NULL;
    if (tok->chat != MOEQ_CHAT_FORMAT_DEEPSEEK_V3)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "chat: tokenizer_config.json has no chat_template moeq knows");
    moeq_err err = check_messages(messages, n, errstr, errstr_size);
    if (err) return err;
    strbuf sb = {0};
    sb_add(&sb, "");
    render_deepseek_v3(tok, messages, n, add_generation_prompt, &sb);
    if (sb.oom) {
        free(sb.s);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "chat: out of memory");
    }
    *out = sb.s;
    return MOEQ_OK;
}

moeq_err moeq_tokenizer_apply_chat(const moeq_tokenizer *tok, const moeq_chat_message *messages,
                                   size_t n, int add_generation_prompt, moeq_tokens *out,
                                   char *errstr, size_t errstr_size) {
    char *text = NULL;
    moeq_err err = moeq_tokenizer_render_chat(tok, messages, n, add_generation_prompt, &text,
                                              errstr, errstr_size);
    if (err) return err;
    err = moeq_tokenizer_encode(tok, text, strlen(text), 0, out, errstr, errstr_size);
    free(text);
    return err;
}
