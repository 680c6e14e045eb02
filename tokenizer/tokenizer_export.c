/*
 * tokenizer_export.c — the tokenizers that generated checkpoints carry: the
 * built-in tiny one (embedded from tokenizer/data/tiny/ by tokenizer/data/
 * embed.cmake) and DeepSeek-V3's real files (copied from the directory
 * scripts/setup.sh fills). It does not generate or train tokenizers
 * (tokenizer/data/train_tiny.js did, once).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/util.h"
#include "tokenizer_internal.h"

#ifndef MOEQ_SOURCE_DIR
#define MOEQ_SOURCE_DIR "."
#endif

#define TINY_VOCAB 1024
#define DEEPSEEK_V3_VOCAB 129280

extern const unsigned char moeq_tokenizer_tiny_json[];
extern const size_t moeq_tokenizer_tiny_json_len;
extern const unsigned char moeq_tokenizer_tiny_config[];
extern const size_t moeq_tokenizer_tiny_config_len;

moeq_err moeq_tokenizer_load_tiny(moeq_tokenizer **out, char *errstr, size_t errstr_size) {
    return moeq_tokenizer_load_json((const char *)moeq_tokenizer_tiny_json,
                                    moeq_tokenizer_tiny_json_len,
                                    (const char *)moeq_tokenizer_tiny_config,
                                    moeq_tokenizer_tiny_config_len, out, errstr, errstr_size);
}

static moeq_err write_file(const char *dir, const char *name, const void *data, size_t len,
                           char *errstr, size_t errstr_size) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return moeq_errf(MOEQ_ERR_IO, errstr, errstr_size, "tokenizer_export: cannot create %s: %s",
                         tmp, strerror(errno));
    int ok = fwrite(data, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return moeq_errf(MOEQ_ERR_IO, errstr, errstr_size, "tokenizer_export: cannot write %s: %s",
                         path, strerror(errno));
    }
    return MOEQ_OK;
}

static moeq_err copy_file(const char *src_dir, const char *dst_dir, const char *name, char *errstr,
                          size_t errstr_size) {
    char path[4096];
    char *data = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", src_dir, name);
    moeq_err err = moeq_read_file(path, 256u << 20, &data, &len, errstr, errstr_size);
    if (err == MOEQ_ERR_NOT_FOUND || err == MOEQ_ERR_IO)
        return moeq_errf(MOEQ_ERR_NOT_FOUND, errstr, errstr_size,
                         "tokenizer_export: %s is missing; run scripts/setup.sh (it extracts "
                         "DeepSeek-V3's tokenizer) or set MOEQ_TOKENIZER_DIR", path);
    if (err) return err;
    err = write_file(dst_dir, name, data, len, errstr, errstr_size);
    free(data);
    return err;
}

moeq_err moeq_tokenizer_export(const char *out_dir, int vocab_size, char *errstr,
                               size_t errstr_size) {
    if (!out_dir)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "tokenizer_export: NULL out_dir");
    if (vocab_size == TINY_VOCAB) {
        moeq_err err = write_file(out_dir, "tokenizer.json", moeq_tokenizer_tiny_json,
                                  moeq_tokenizer_tiny_json_len, errstr, errstr_size);
        if (!err)
            err = write_file(out_dir, "tokenizer_config.json", moeq_tokenizer_tiny_config,
                             moeq_tokenizer_tiny_config_len, errstr, errstr_size);
        return err;
    }
    if (vocab_size != DEEPSEEK_V3_VOCAB)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "tokenizer_export: no tokenizer for vocab_size %d (1024: tiny, 129280: "
                         "DeepSeek-V3)", vocab_size);
    char src[4096];
    const char *env = getenv("MOEQ_TOKENIZER_DIR");
    if (env && *env) snprintf(src, sizeof src, "%s", env);
    else snprintf(src, sizeof src, "%s/.deps/tokenizers/deepseek_v3", MOEQ_SOURCE_DIR);
    moeq_err err = copy_file(src, out_dir, "tokenizer.json", errstr, errstr_size);
    if (!err) err = copy_file(src, out_dir, "tokenizer_config.json", errstr, errstr_size);
    return err;
}
