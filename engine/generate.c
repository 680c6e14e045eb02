/*
 * generate.c — moeq_generate: one prompt through engine + sampler (prefill in
 * chunks of max_step_tokens, then decode one token per step) until a stop id
 * or max_new_tokens; with mtp_k, speculative rounds (mtp_spec.c) after the
 * first token. A convenience for `moeq generate` and tests; the worker
 * drives moeq_engine_step itself to batch many sequences. On a device each
 * step brings back the row's record, and the row itself only when the
 * sampler's draw needs it (moeq_engine_step_out).
 */
#include <stdio.h>
#include <stdlib.h>

#include "forward.h"

static int is_stop(const moeq_generate_params *p, int32_t id) {
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == id) return 1;
    return 0;
}

/* One step's row: on a device its record, and the row itself only when the sampler's next draw needs it. */
typedef struct gen_row {
    float *logits;
    moeq_logits_record rec;
    uint8_t have;
} gen_row;

static moeq_err step_one(moeq_engine *engine, const moeq_step_item *item, moeq_sampler *sampler, gen_row *row,
                         char *errstr, size_t errstr_size) {
    moeq_row_use use = {sampler, 0, 0};
    moeq_step_out out = {row->logits, 1, &row->rec, sampler ? &use : NULL, &row->have};
    return moeq_engine_step_out(engine, item, 1, &out, errstr, errstr_size);
}

/* The draw the sampler makes on the last step's row (moeq_sampler_sample's result). */
static int32_t sample_row(moeq_sampler *sampler, const gen_row *row) {
    return moeq_sampler_sample_out(sampler, &row->rec, row->have ? row->logits : NULL);
}

static moeq_err prefill(moeq_engine *engine, int seq, const int32_t *prompt, int n_prompt, moeq_sampler *sampler,
                        gen_row *row, char *errstr, size_t errstr_size) {
    int chunk = engine->params.max_step_tokens;
    for (int off = 0; off < n_prompt; off += chunk) {
        int n = n_prompt - off < chunk ? n_prompt - off : chunk;
        moeq_step_item item = {seq, prompt + off, n, 0};
        /* only the last chunk's row is read: the others need no row at all (their records are dropped) */
        moeq_err err = step_one(engine, &item, off + n == n_prompt ? sampler : NULL, row, errstr, errstr_size);
        if (err) return err;
    }
    return MOEQ_OK;
}

/* The row held NaN or inf (moeq_sampler_sample gave -1): the sequence cannot go on. */
static moeq_err numerical(const moeq_engine *engine, int seq, int n_out, char *errstr, size_t errstr_size) {
    int layer = moeq_engine_seq_nonfinite_layer(engine, seq);
    char where[64] = "";
    if (layer >= 0) snprintf(where, sizeof where, "; first seen by the router of layer %d", layer);
    return moeq_errf(MOEQ_ERR_NUMERIC, errstr, errstr_size,
                     "non-finite logits (NaN or inf) after %d generated tokens%s: the weights hold non-finite or "
                     "overflowing values (moeq model-info --check-weights)",
                     n_out, where);
}

/* Speculative rounds after the first token: each appends 1..k+1 tokens to ids (stops honoured). */
static moeq_err generate_mtp(moeq_engine *engine, int seq, const moeq_generate_params *params, moeq_sampler *sampler,
                             int32_t *ids, int *n, char *errstr, size_t errstr_size) {
    moeq_mtp_decoder *dec = NULL;
    moeq_err err = moeq_mtp_decoder_new(engine, 1, params->mtp_k, &dec, errstr, errstr_size);
    if (err) return err;
    /* exact mode: the sampler that drew the first token goes on drawing, so the tokens are plain decoding's;
     * rejection mode: its own counter-based draws (one was used by the first token) */
    moeq_spec_seq ss = {.seq_id = seq, .next_token = ids[*n - 1], .sampling = params->sampling, .draws = 1,
                        .sampler = params->mtp_rejection ? NULL : sampler};
    int64_t rounds = 0;
    while (*n < params->max_new_tokens && !is_stop(params, ids[*n - 1])) {
        int room = params->max_new_tokens - *n - 1;
        ss.k = params->mtp_k < room ? params->mtp_k : room;
        if ((err = moeq_mtp_decode_step(dec, &ss, 1, errstr, errstr_size))) break;
        if (ss.numerical_error) {
            err = numerical(engine, seq, *n, errstr, errstr_size);
            break;
        }
        rounds++;
        for (int j = 0; j < ss.n_out && !is_stop(params, ids[*n - 1]); j++) ids[(*n)++] = ss.out[j];
    }
    if (params->stats) *params->stats = (moeq_generate_stats){ss.drafted, ss.accepted, rounds};
    moeq_mtp_decoder_destroy(dec);
    return err;
}

moeq_err moeq_generate(moeq_engine *engine, const int32_t *prompt, int n_prompt, const moeq_generate_params *params,
                       int32_t **out, int *n_out, char *errstr, size_t errstr_size) {
    if (!engine || !prompt || n_prompt < 1 || !params || !out || !n_out || params->max_new_tokens < 0 ||
        params->mtp_k < 0 || params->mtp_k > MOEQ_MTP_MAX_K)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "generate: engine, prompt, params, out required");
    *out = NULL;
    *n_out = 0;
    int vocab = engine->cfg->vocab_size, seq = -1, n = 0;
    float *logits = malloc((size_t)vocab * sizeof(float));
    gen_row row = {.logits = logits};
    int32_t *ids = malloc((size_t)(params->max_new_tokens + 1) * sizeof(int32_t));
    moeq_sampler *sampler = NULL;
    moeq_err err = MOEQ_ERR_NOMEM;
    if (!logits || !ids) goto free_all;
    if ((err = moeq_sampler_new(&params->sampling, vocab, &sampler))) {
        moeq_errf(err, errstr, errstr_size, "sampling params");
        goto free_all;
    }
    if (params->hook && params->mtp_k > 0 && params->mtp_rejection) { /* its draws do not go through the sampler */
        err = moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                        "a logits processor (hook) runs with MTP's exact mode only, not rejection sampling");
        goto free_all;
    }
    if (params->hook) moeq_sampler_set_hook(sampler, params->hook);
    if ((err = moeq_engine_seq_new(engine, &seq))) {
        moeq_errf(err, errstr, errstr_size, "no free sequence slot");
        goto free_all;
    }
    if (params->mtp_k > 0 && (err = moeq_engine_seq_set_mtp(engine, seq, 1))) {
        moeq_errf(err, errstr, errstr_size, "mtp_k %d: the model has no MTP layer", params->mtp_k);
        goto free_all;
    }
    if ((err = prefill(engine, seq, prompt, n_prompt, sampler, &row, errstr, errstr_size))) goto free_all;
    if (params->mtp_k > 0 && n < params->max_new_tokens) {
        if ((ids[n] = sample_row(sampler, &row)) < 0) {
            err = numerical(engine, seq, n, errstr, errstr_size);
            goto free_all;
        }
        n++;
        if ((err = generate_mtp(engine, seq, params, sampler, ids, &n, errstr, errstr_size))) goto free_all;
    }
    while (params->mtp_k <= 0 && n < params->max_new_tokens) {
        int32_t id = sample_row(sampler, &row);
        if (id < 0) {
            err = numerical(engine, seq, n, errstr, errstr_size);
            goto free_all;
        }
        ids[n++] = id;
        if (is_stop(params, id) || n == params->max_new_tokens) break;
        moeq_step_item item = {seq, &id, 1, 0};
        if ((err = step_one(engine, &item, sampler, &row, errstr, errstr_size))) goto free_all;
    }
    *out = ids;
    *n_out = n;
    ids = NULL;
    err = MOEQ_OK;
free_all:
    if (seq >= 0) moeq_engine_seq_free(engine, seq);
    moeq_sampler_destroy(sampler);
    free(logits);
    free(ids);
    return err;
}
