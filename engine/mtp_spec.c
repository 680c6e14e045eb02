/*
 * mtp_spec.c — speculative decoding with the model's own MTP module
 * (moeq_mtp_decoder, moeq_mtp_decode_step; docs/MTP.md).
 *
 * A round, for many sequences at once:
 *   1. draft: chain the MTP module k times (one batched moeq_engine_mtp_step
 *      per chain depth over the sequences that still draft), choosing each
 *      draft greedily or by sampling from the draft distribution q;
 *   2. verify: one batched main step over [next_token, d_1..d_k] per
 *      sequence with all logits (p_0..p_k);
 *   3. accept: greedy — the longest prefix with argmax p_j == d_{j+1}, then
 *      argmax of the first disagreeing (or the bonus) row; sampling — keep
 *      d with probability min(1, p(d)/q(d)), else draw from
 *      normalize(max(0, p - q)) and stop; all kept: draw the bonus from p_k.
 *      This is the standard speculative rejection sampler (Leviathan et al.
 *      2023, Chen et al. 2023): the output distribution is exactly p.
 *      Exact mode (the sequence brings its moeq_sampler): draft greedily,
 *      then draw moeq_sampler_sample on verify rows 0, 1, ... in order,
 *      keep each draw equal to the draft, emit the first differing draw
 *      (or the bonus draw) and stop. Each emitted token is exactly one
 *      sampler draw on the same logits as plain decoding, so the tokens are
 *      the plain sampler's, token for token.
 *   4. roll back: moeq_engine_seq_truncate to the accepted tokens, which
 *      also drops the MTP entries built on rejected tokens and the drafts.
 *
 * moeq_mtp_decode_step_with also carries other sequences' ordinary items
 * (prefill chunks, plain decodes) in the verify step.
 *
 * On a device (moeq_step_out with records) a round reads records where
 * they decide: greedy drafts and verification their argmax and finite flag,
 * exact mode's draws moeq_sampler_sample_out (the engine brings a row whole
 * where the record cannot decide the draw); rejection sampling and a
 * hook's draft read whole rows.
 *
 * A round costs the verify step plus the k draft passes, nothing else: the
 * verify step runs no MTP block (mtp.c keeps the rows; the accepted
 * positions' MTP entries are computed by the next round's first draft pass,
 * and the first draft entry of this round is kept, not recomputed).
 *
 * Greedy is token-for-token plain decoding because verification rows are
 * bit-identical to single-token decode rows (batch invariance) and argmax
 * breaks ties to the lower id as the sampler does. p and q are the
 * distributions the sampler draws from (temperature, then top-k, then top-p,
 * moeq_sampler_weights, the very function the sampler uses). Randomness is
 * counter based per sequence: moeq_sampler_uniform(seed, draws++), so a
 * sequence's output depends only on its seed.
 *
 * Buffers are sized in moeq_mtp_decoder_new; a round allocates nothing.
 * Not thread-safe: one decoder per engine, used from the engine's thread.
 */
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "sampler.h"
#include "moeq/util.h"

struct moeq_mtp_decoder {
    moeq_engine *engine;
    int max_seqs, max_k, vocab;
    float *draft_logits;      /* [max_seqs][max_k][V]     (sampling only)   */
    float *logits;            /* [max_seqs * (max_k + 1) + max_extra][V] verify rows, then ordinary ones */
    moeq_logits_record *rec;  /* [same rows] on a device: each row's record  */
    moeq_row_use *use;        /* [same rows] who reads each row              */
    uint8_t *have;            /* [same rows] 1: the row came whole           */
    int32_t *tokens;          /* [max_seqs][max_k + 1] next_token, drafts   */
    int64_t *len0;            /* [max_seqs] seq_len before the round        */
    int64_t *row0;            /* [max_seqs] first verify row                */
    moeq_mtp_item *mitems;    /* [max_seqs]                                 */
    int *mseq;                /* [max_seqs] which seqs[] entry              */
    moeq_step_item *items;    /* [max_seqs + engine max_seqs] verify, then ordinary items */
    int max_extra;            /* ordinary items one step may carry (the engine's max_seqs) */
    double *p, *q;            /* [V] distributions                          */
    int32_t *cand;            /* [V] candidate order                        */
    float *weight;            /* [V] their unnormalised weights             */
    int64_t draft_ns;         /* the last round's draft passes, wall time   */
};

moeq_err moeq_mtp_decoder_new(moeq_engine *engine, int max_seqs, int max_k, moeq_mtp_decoder **out, char *errstr,
                              size_t errstr_size) {
    if (!engine || !out || max_seqs < 1 || max_k < 0 || max_k > MOEQ_MTP_MAX_K)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "mtp decoder: max_seqs >= 1, max_k 0..%d",
                         MOEQ_MTP_MAX_K);
    *out = NULL;
    if (!moeq_engine_mtp_available(engine))
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "mtp decoder: the model has no MTP layer");
    moeq_mtp_decoder *d = calloc(1, sizeof(*d));
    if (!d) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "mtp decoder");
    size_t S = (size_t)max_seqs, K = (size_t)max_k, V = (size_t)engine->cfg->vocab_size;
    size_t X = (size_t)engine->params.max_seqs;
    d->engine = engine;
    d->max_seqs = max_seqs, d->max_k = max_k, d->vocab = (int)V, d->max_extra = (int)X;
    d->draft_logits = malloc(S * (K ? K : 1) * V * sizeof(float));
    d->logits = malloc((S * (K + 1) + X) * V * sizeof(float));
    d->rec = malloc((S * (K + 1) + X) * sizeof(moeq_logits_record));
    d->use = calloc(S * (K + 1) + X, sizeof(moeq_row_use));
    d->have = calloc(S * (K + 1) + X, 1);
    d->tokens = malloc(S * (K + 1) * sizeof(int32_t));
    d->len0 = malloc(S * sizeof(int64_t));
    d->row0 = malloc(S * sizeof(int64_t));
    d->mitems = malloc(S * sizeof(moeq_mtp_item));
    d->mseq = malloc(S * sizeof(int));
    d->items = calloc(S + X, sizeof(moeq_step_item));
    d->p = malloc(V * sizeof(double));
    d->q = malloc(V * sizeof(double));
    d->cand = malloc(V * sizeof(int32_t));
    d->weight = malloc(V * sizeof(float));
    if (!d->draft_logits || !d->logits || !d->rec || !d->use || !d->have || !d->tokens || !d->len0 || !d->row0 ||
        !d->mitems || !d->mseq || !d->items || !d->p || !d->q || !d->cand || !d->weight) {
        moeq_mtp_decoder_destroy(d);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "mtp decoder buffers (%zu seqs, k %zu, vocab %zu)", S,
                         K, V);
    }
    *out = d;
    return MOEQ_OK;
}

int64_t moeq_mtp_decoder_last_draft_ns(const moeq_mtp_decoder *d) { return d ? d->draft_ns : 0; }

void moeq_mtp_decoder_destroy(moeq_mtp_decoder *d) {
    if (!d) return;
    free(d->draft_logits);
    free(d->logits);
    free(d->rec);
    free(d->use);
    free(d->have);
    free(d->tokens);
    free(d->len0);
    free(d->row0);
    free(d->mitems);
    free(d->mseq);
    free(d->items);
    free(d->p);
    free(d->q);
    free(d->cand);
    free(d->weight);
    free(d);
}

/* ---- distributions (sampler.c's, as full vectors) ----------------------- */

/* probs (V) = the distribution moeq_sampler_sample draws from for these logits (temperature > 0). */
static void distribution(moeq_mtp_decoder *d, const moeq_sampling_params *sp, const float *logits, double *probs) {
    double sum;
    int m = moeq_sampler_weights(sp, logits, d->vocab, 0, d->cand, d->weight, &sum);
    for (int i = 0; i < d->vocab; i++) probs[i] = 0.0;
    for (int i = 0; i < m; i++) probs[d->cand[i]] = d->weight[i] / sum;
}

/* A draw from probs (sums to ~1) with u in [0, 1); the last positive id when rounding runs past the end. */
static int32_t draw(const double *probs, int V, double u) {
    double acc = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < V; i++) {
        if (probs[i] <= 0.0) continue;
        acc += probs[i];
        last = i;
        if (u < acc) return i;
    }
    return last;
}

/* ---- rows or records ------------------------------------------------------ */

/* Row r of the last step: whole (host memory, or brought back), else NULL (its record says what is needed). */
static const float *row_at(const moeq_mtp_decoder *d, int64_t r) {
    return d->have[r] ? d->logits + (size_t)r * d->vocab : NULL;
}

static int32_t argmax_at(const moeq_mtp_decoder *d, int64_t r) {
    const float *row = row_at(d, r);
    return row ? moeq_sampler_argmax(row, d->vocab) : d->rec[r].argmax;
}

static int finite_at(const moeq_mtp_decoder *d, int64_t r) {
    const float *row = row_at(d, r);
    return row ? moeq_sampler_finite(row, d->vocab) : d->rec[r].finite;
}

/* The step's output: whole rows where the round reads them whole, records for the rest (on a device). */
static moeq_step_out round_out(moeq_mtp_decoder *d, size_t rows) {
    return (moeq_step_out){.logits = d->logits, .logits_rows = rows, .records = d->rec, .use = d->use,
                           .have_row = d->have};
}

/* What a draft row of sq is read for: its argmax (greedy, exact mode without a draft hook) or whole. */
static moeq_row_use draft_use(const moeq_spec_seq *sq) {
    int whole = sq->sampler ? moeq_sampler_has_draft_hook(sq->sampler) : sq->sampling.temperature > 0.0;
    return (moeq_row_use){NULL, 0, whole};
}

/* Verify row a of sq: exact mode draws on it (the sampler's a-th next draw), greedy reads its argmax,
 * rejection sampling its whole distribution. */
static moeq_row_use verify_use(const moeq_spec_seq *sq, int a) {
    if (sq->sampler) return (moeq_row_use){sq->sampler, a, 0};
    return (moeq_row_use){NULL, 0, sq->sampling.temperature > 0.0};
}

/* ---- a round -------------------------------------------------------------- */

static moeq_err check_round(const moeq_mtp_decoder *d, const moeq_spec_seq *seqs, int n, char *errstr,
                            size_t errstr_size) {
    if (n < 0 || n > d->max_seqs || (n > 0 && !seqs))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "mtp round: %d sequences, decoder holds %d", n,
                         d->max_seqs);
    for (int i = 0; i < n; i++)
        if (seqs[i].k < 0 || seqs[i].k > d->max_k || seqs[i].next_token < 0 || seqs[i].next_token >= d->vocab ||
            seqs[i].sampling.temperature < 0 || seqs[i].sampling.top_k < 0 ||
            !(seqs[i].sampling.top_p > 0 && seqs[i].sampling.top_p <= 1.0))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                             "mtp round: seq %d: k %d (max %d), next_token %d, or sampling params out of range",
                             seqs[i].seq_id, seqs[i].k, d->max_k, seqs[i].next_token);
    return MOEQ_OK;
}

/* Draft depth j for every sequence with k > j: one batched MTP step. */
static moeq_err draft_depth(moeq_mtp_decoder *d, moeq_spec_seq *seqs, int n_seqs, int j, char *errstr,
                            size_t errstr_size) {
    int n = 0, V = d->vocab, K1 = d->max_k + 1;
    for (int i = 0; i < n_seqs; i++)
        if (seqs[i].k > j) {
            d->mitems[n] = (moeq_mtp_item){seqs[i].seq_id, d->tokens[(size_t)i * K1 + j]};
            d->use[n] = draft_use(&seqs[i]);
            d->mseq[n++] = i;
        }
    if (n == 0) return MOEQ_OK;
    moeq_step_out out = round_out(d, (size_t)d->max_seqs * K1);
    moeq_err err = moeq_engine_mtp_step_out(d->engine, d->mitems, n, &out, errstr, errstr_size);
    if (err) return err;
    for (int r = 0; r < n; r++) {
        moeq_spec_seq *sq = &seqs[d->mseq[r]];
        const float *row = row_at(d, r);
        int32_t x;
        if (!row) { /* a device's record: greedy drafts need its argmax alone */
            x = d->rec[r].argmax;
        } else if (sq->sampler) { /* exact mode: greedy, or what the sampler's hook allows (structured output) */
            x = moeq_sampler_draft(sq->sampler, row, d->tokens + (size_t)d->mseq[r] * K1 + 1, j);
        } else if (sq->sampling.temperature <= 0.0) {
            x = moeq_sampler_argmax(row, V);
        } else {
            float *keep = d->draft_logits + ((size_t)d->mseq[r] * d->max_k + j) * V;
            memcpy(keep, row, (size_t)V * sizeof(float));
            distribution(d, &sq->sampling, keep, d->q);
            x = draw(d->q, V, moeq_sampler_uniform(sq->sampling.seed, sq->draws++));
        }
        d->tokens[(size_t)d->mseq[r] * K1 + j + 1] = x;
    }
    return MOEQ_OK;
}

/* Accept drafts of sequence i against its verify rows; fills out/n_out. */
static void accept(moeq_mtp_decoder *d, moeq_spec_seq *sq, int i) {
    int V = d->vocab, K1 = d->max_k + 1, k = sq->k, a = 0;
    const int32_t *drafts = d->tokens + (size_t)i * K1 + 1;
    const float *P = d->logits + (size_t)d->row0[i] * V;
    int64_t r0 = d->row0[i];
    if (sq->sampler) { /* exact: the sampler's own draws, one per emitted token */
        for (;; a++) { /* the bonus row (a == k) always ends the round */
            sq->out[a] = moeq_sampler_sample_out(sq->sampler, &d->rec[r0 + a], row_at(d, r0 + a));
            if (a == k || sq->out[a] != drafts[a]) break;
        }
        sq->n_out = a + 1;
        return;
    }
    if (sq->sampling.temperature <= 0.0) {
        while (a < k && argmax_at(d, r0 + a) == drafts[a]) sq->out[a] = drafts[a], a++;
        sq->out[a] = argmax_at(d, r0 + a);
        sq->n_out = a + 1;
        return;
    }
    for (; a < k; a++) {
        int32_t x = drafts[a];
        distribution(d, &sq->sampling, P + (size_t)a * V, d->p);
        distribution(d, &sq->sampling, d->draft_logits + ((size_t)i * d->max_k + a) * V, d->q);
        if (moeq_sampler_uniform(sq->sampling.seed, sq->draws++) * d->q[x] < d->p[x]) {
            sq->out[a] = x;
            continue;
        }
        double sum = 0.0; /* rejected: draw from normalize(max(0, p - q)) */
        for (int t = 0; t < V; t++) sum += d->p[t] = d->p[t] > d->q[t] ? d->p[t] - d->q[t] : 0.0;
        if (sum > 0.0)
            for (int t = 0; t < V; t++) d->p[t] /= sum;
        else
            distribution(d, &sq->sampling, P + (size_t)a * V, d->p);
        sq->out[a] = draw(d->p, V, moeq_sampler_uniform(sq->sampling.seed, sq->draws++));
        sq->n_out = a + 1;
        return;
    }
    distribution(d, &sq->sampling, P + (size_t)k * V, d->p);
    sq->out[k] = draw(d->p, V, moeq_sampler_uniform(sq->sampling.seed, sq->draws++));
    sq->n_out = k + 1;
}

/*
 * The verify rows the accepted tokens came from (0..n_out-1) are all finite. A draft chosen from a non-finite
 * draft row needs no check of its own: the main model's row judges it; the rows after the first rejection are
 * never read, just as plain decoding never computes them.
 */
static int rows_finite(const moeq_mtp_decoder *d, const moeq_spec_seq *sq, int i) {
    for (int a = 0; a < sq->n_out; a++)
        if (!finite_at(d, d->row0[i] + a)) return 0;
    return 1;
}

/* Drop everything the round appended (error path): main back to len0, MTP drafts gone. */
static void undo(moeq_mtp_decoder *d, const moeq_spec_seq *seqs, int n) {
    for (int i = 0; i < n; i++) moeq_engine_seq_truncate(d->engine, seqs[i].seq_id, (int)d->len0[i]);
}

moeq_err moeq_mtp_decode_step(moeq_mtp_decoder *d, moeq_spec_seq *seqs, int n_seqs, char *errstr,
                              size_t errstr_size) {
    return moeq_mtp_decode_step_with(d, seqs, n_seqs, NULL, 0, NULL, 0, errstr, errstr_size);
}

moeq_err moeq_mtp_decode_step_with(moeq_mtp_decoder *d, moeq_spec_seq *seqs, int n_seqs, const moeq_step_item *extra,
                                   int n_extra, float *extra_logits, size_t extra_rows, char *errstr,
                                   size_t errstr_size) {
    moeq_step_out out = {.logits = extra_logits, .logits_rows = extra_rows};
    return moeq_mtp_decode_step_out(d, seqs, n_seqs, extra, n_extra, &out, errstr, errstr_size);
}

/* The ordinary items' rows (after the verify rows) into the caller's out: records, and the rows that came. */
static void extra_rows_out(const moeq_mtp_decoder *d, int64_t rows, int n_extra, const moeq_step_out *out) {
    size_t V = (size_t)d->vocab;
    for (int j = 0; j < n_extra; j++) {
        int64_t r = rows + j;
        if (out->records) out->records[j] = d->rec[r], out->have_row[j] = d->have[r];
        if (!out->records || d->have[r])
            memcpy(out->logits + (size_t)j * V, d->logits + (size_t)r * V, V * sizeof(float));
    }
}

moeq_err moeq_mtp_decode_step_out(moeq_mtp_decoder *d, moeq_spec_seq *seqs, int n_seqs, const moeq_step_item *extra,
                                  int n_extra, const moeq_step_out *extra_out, char *errstr, size_t errstr_size) {
    if (!d) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "decoder is NULL");
    moeq_err err = check_round(d, seqs, n_seqs, errstr, errstr_size);
    if (err) return err;
    if (n_extra < 0 || n_extra > d->max_extra ||
        (n_extra > 0 && (!extra || !extra_out || !extra_out->logits || (extra_out->records && !extra_out->have_row))) ||
        (n_extra > 0 && (size_t)n_extra > extra_out->logits_rows))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "mtp round: %d ordinary items (at most %d, one logits row each; %zu rows given)", n_extra,
                         d->max_extra, n_extra > 0 && extra_out ? extra_out->logits_rows : 0);
    for (int i = 0; i < n_extra; i++)
        if (extra[i].all_logits)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                             "mtp round: ordinary item %d asks for all logits (only the last row is kept)", i);
    d->draft_ns = 0;
    if (n_seqs == 0) /* nothing to draft: the ordinary step alone */
        return n_extra ? moeq_engine_step_out(d->engine, extra, n_extra, extra_out, errstr, errstr_size) : MOEQ_OK;
    int K1 = d->max_k + 1, max_depth = 0;
    int64_t rows = 0;
    for (int i = 0; i < n_seqs; i++) {
        d->len0[i] = moeq_engine_seq_len(d->engine, seqs[i].seq_id);
        d->tokens[(size_t)i * K1] = seqs[i].next_token;
        if (seqs[i].k > max_depth) max_depth = seqs[i].k;
    }
    int64_t t0 = moeq_mono_ns();
    for (int j = 0; j < max_depth; j++)
        if ((err = draft_depth(d, seqs, n_seqs, j, errstr, errstr_size))) goto undo_round;
    d->draft_ns = moeq_mono_ns() - t0;
    for (int i = 0; i < n_seqs; i++) {
        d->items[i] = (moeq_step_item){seqs[i].seq_id, d->tokens + (size_t)i * K1, seqs[i].k + 1, 1};
        d->row0[i] = rows;
        for (int a = 0; a <= seqs[i].k; a++) d->use[rows + a] = verify_use(&seqs[i], a);
        rows += seqs[i].k + 1;
    }
    /* The ordinary items ride in the verify step (batch invariance: the same bits as a step of their own), so
     * a plan with both reads the weights once, not twice. Their rows follow the verify rows. */
    for (int i = 0; i < n_extra; i++) {
        d->items[n_seqs + i] = extra[i];
        d->use[rows + i] = !extra_out->records ? (moeq_row_use){NULL, 0, 1}
                           : extra_out->use    ? extra_out->use[i]
                                               : (moeq_row_use){NULL, 0, 0};
    }
    moeq_step_out out = round_out(d, (size_t)d->max_seqs * K1 + (size_t)d->max_extra);
    if ((err = moeq_engine_step_out(d->engine, d->items, n_seqs + n_extra, &out, errstr, errstr_size)))
        goto undo_round;
    if (n_extra) extra_rows_out(d, rows, n_extra, extra_out);
    for (int i = 0; i < n_seqs; i++) {
        moeq_spec_seq *sq = &seqs[i];
        accept(d, sq, i);
        sq->numerical_error = !rows_finite(d, sq, i);
        if (sq->numerical_error) { /* nothing of this round is kept; the caller ends the sequence */
            moeq_engine_seq_truncate(d->engine, sq->seq_id, (int)d->len0[i]);
            sq->n_out = 0;
            continue;
        }
        moeq_engine_seq_truncate(d->engine, sq->seq_id, (int)(d->len0[i] + sq->n_out));
        sq->next_token = sq->out[sq->n_out - 1];
        sq->drafted += sq->k;
        sq->accepted += sq->n_out - 1;
    }
    return MOEQ_OK;
undo_round:
    undo(d, seqs, n_seqs);
    return err;
}
