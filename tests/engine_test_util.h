/*
 * engine_test_util.h — helpers for engine tests that run on checkpoints
 * written by the built `moeq gen-model` ($MOEQ_BUILD_DIR/cli/moeq): write a
 * preset into a temporary directory and load it, make deterministic prompts,
 * and remove that directory afterwards. Header-only, tests only; no
 * assertions (the model helpers run in cmocka setup/teardown, which report
 * failure by return value).
 */
#ifndef MOEQ_TESTS_ENGINE_TEST_UTIL_H
#define MOEQ_TESTS_ENGINE_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "model.h"

/* Write `preset` into dir/name with `moeq gen-model` and load it. dtype is a
 * gen-model --dtype value, or NULL for gen-model's default. Returns the model
 * (caller destroys it), or NULL after printing why to stderr. */
static inline moeq_model *moeq_test_gen_and_load(const char *dir, const char *preset, const char *dtype,
                                                 const char *name) {
    const char *build = getenv("MOEQ_BUILD_DIR");
    char cmd[1024], dtype_arg[64] = "", path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (dtype) snprintf(dtype_arg, sizeof(dtype_arg), " --dtype %s", dtype);
    snprintf(cmd, sizeof(cmd), "'%s/cli/moeq' gen-model --preset %s%s --out '%s' >/dev/null 2>&1",
             build ? build : ".", preset, dtype_arg, path);
    if (system(cmd) != 0) {
        fprintf(stderr, "gen-model failed: %s\n", cmd);
        return NULL;
    }
    moeq_model *m = NULL;
    if (moeq_model_load(path, NULL, &m, err, sizeof(err)) != MOEQ_OK) fprintf(stderr, "load %s: %s\n", path, err);
    return m;
}

static inline int moeq_test_vocab(const moeq_model *m) { return moeq_model_get_config(m)->vocab_size; }

/* A deterministic prompt of n token ids below vocab; another salt gives another prompt. */
static inline void moeq_test_prompt(int32_t *ids, int n, int salt, int vocab) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + salt * 101 + 5) % vocab);
}

/* rm -rf dir; 0 on success, -1 otherwise (a teardown's return value). */
static inline int moeq_test_remove_dir(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

#endif
