/*
 * generate.c — the engine as a library, in one page.
 *
 *   moeq-example-generate MODEL_DIR [TOKEN_ID ...]
 *
 * Loads a checkpoint in the Hugging Face layout (config.json + safetensors,
 * memory-mapped), creates an engine (KV cache pool and scratch, sized once),
 * runs a prompt through it and greedily decodes 16 tokens. Everything the
 * worker does with the engine is a batched version of this loop.
 */
#include <stdio.h>
#include <stdlib.h>

#include "moeq/engine.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [TOKEN_ID ...]\n", argv[0]);
        return 2;
    }
    char err[512];
    moeq_model *model = NULL;
    moeq_engine *engine = NULL;
    int32_t *out = NULL;
    int n_out = 0, rc = 1;

    /* 1. The model: weights stay in the mmapped files, in their stored dtype. */
    moeq_model_params mparams = moeq_model_default_params();
    if (moeq_model_load(argv[1], &mparams, &model, err, sizeof err) != MOEQ_OK) {
        fprintf(stderr, "load: %s\n", err);
        goto done;
    }

    /* 2. The engine: one per thread of control; it owns the cache and its compute threads. */
    moeq_engine_params eparams = moeq_engine_default_params();
    eparams.max_seqs = 1;
    if (moeq_engine_new(model, &eparams, &engine, err, sizeof err) != MOEQ_OK) {
        fprintf(stderr, "engine: %s\n", err);
        goto done;
    }

    /* 3. A prompt of token ids (a tokenizer turns text into these: moeq/tokenizer.h). */
    int n_prompt = argc > 2 ? argc - 2 : 3;
    int32_t *prompt = calloc((size_t)n_prompt, sizeof *prompt);
    if (!prompt) goto done;
    for (int i = 0; i < n_prompt; i++) prompt[i] = argc > 2 ? (int32_t)atoi(argv[i + 2]) : 10 + i;

    /* 4. Generate: greedy (temperature 0), stop at end-of-sequence or after 16 tokens. */
    moeq_generate_params gparams = {0};
    gparams.sampling = moeq_sampling_default_params();
    gparams.max_new_tokens = 16;
    int32_t eos = moeq_model_get_config(model)->eos_token_id;
    gparams.stop_ids = &eos;
    gparams.n_stop_ids = 1;
    moeq_err e = moeq_generate(engine, prompt, n_prompt, &gparams, &out, &n_out, err, sizeof err);
    free(prompt);
    if (e != MOEQ_OK) {
        fprintf(stderr, "generate: %s\n", err);
        goto done;
    }
    for (int i = 0; i < n_out; i++) printf("%s%d", i ? " " : "", out[i]);
    printf("\n");
    rc = 0;

done:
    free(out);
    moeq_engine_destroy(engine);
    moeq_model_destroy(model);
    return rc;
}
