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
 *   4. roll back: moeq_engine_seq_truncate to the accepted tokens, which
 *      also drops the MTP entries built on rejected tokens and the drafts.
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
 * sampler.c's rules). Randomness is counter based per sequence:
 * uniform(seed, draws++), so a sequence's output depends only on its seed.
 *
 * Buffers are sized in moeq_mtp_decoder_new; a round allocates nothing.
 * Not thread-safe: one decoder per engine, used from the engine's thread.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"

struct moeq_mtp_decoder {
    moeq_engine *engine;
    int max_seqs, max_k, vocab;
    float *draft_logits;      /* [max_seqs][max_k][V]     (sampling only)   */
    float *logits;            /* [max_seqs * (max_k + 1)][V] verify rows    */
    int32_t *tokens;          /* [max_seqs][max_k + 1] next_token, drafts   */
    int64_t *len0;            /* [max_seqs] seq_len before the round        */
    int64_t *row0;            /* [max_seqs] first verify row                */
    moeq_mtp_item *mitems;    /* [max_seqs]                                 */
    int *mseq;                /* [max_seqs] which seqs[] entry              */
    moeq_step_item *items;    /* [max_seqs]                                 */
    double *p, *q;            /* [V] distributions                          */
    int32_t *cand;            /* [V] candidate order                        */
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
    d->engine = engine;
    d->max_seqs = max_seqs, d->max_k = max_k, d->vocab = (int)V;
    d->draft_logits = malloc(S * (K ? K : 1) * V * sizeof(float));
    d->logits = malloc(S * (K + 1) * V * sizeof(float));
    d->tokens = malloc(S * (K + 1) * sizeof(int32_t));
    d->len0 = malloc(S * sizeof(int64_t));
    d->row0 = malloc(S * sizeof(int64_t));
    d->mitems = malloc(S * sizeof(moeq_mtp_item));
    d->mseq = malloc(S * sizeof(int));
    d->items = calloc(S, sizeof(moeq_step_item));
    d->p = malloc(V * sizeof(double));
    d->q = malloc(V * sizeof(double));
    d->cand = malloc(V * sizeof(int32_t));
    if (!d->draft_logits || !d->logits || !d->tokens || !d->len0 || !d->row0 || !d->mitems || !d->mseq ||
        !d->items || !d->p || !d->q || !d->cand) {
        moeq_mtp_decoder_destroy(d);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "mtp decoder buffers (%zu seqs, k %zu, vocab %zu)", S,
                         K, V);
    }
    *out = d;
    return MOEQ_OK;
}

void moeq_mtp_decoder_destroy(moeq_mtp_decoder *d) {
    if (!d) return;
    free(d->draft_logits);
    free(d->logits);
    free(d->tokens);
    free(d->len0);
    free(d->row0);
    free(d->mitems);
    free(d->mseq);
    free(d->items);
    free(d->p);
    free(d->q);
    free(d->cand);
    free(d);
}

/* ---- distributions (sampler.c's rules, as full vectors) ------------------- */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static double uniform(uint64_t seed, uint64_t n) {
    return (double)(splitmix64(splitmix64(seed) ^ n) >> 11) * 0x1p-53;
}

static int32_t argmax(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static _Thread_local const float *g_logits; /* qsort has no context argument */

static int before(const float *l, int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); }

static int cmp_cand(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return before(g_logits, a, b) ? -1 : (before(g_logits, b, a) ? 1 : 0);
}

/* cand[0..m) in sampler order (logit descending, id ascending), m = top_k or all. */
static int order_candidates(const float *logits, int V, int top_k, int32_t *cand) {
    int k = top_k > 0 && top_k < V ? top_k : V, m = 0;
    if (k > 64) {
        for (int32_t i = 0; i < V; i++) cand[i] = i;
        g_logits = logits;
        qsort(cand, (size_t)V, sizeof(int32_t), cmp_cand);
        return k;
    }
    for (int32_t i = 0; i < V; i++) {
        if (m == k && !before(logits, i, cand[m - 1])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && before(logits, i, cand[j - 1])) {
            cand[j] = cand[j - 1];
            j--;
        }
        cand[j] = i;
    }
    return m;
}

/* probs (V) = the distribution moeq_sampler_sample draws from for these logits (temperature > 0). */
static void distribution(const moeq_sampling_params *sp, const float *logits, int V, int32_t *cand, double *probs) {
    double inv_t = 1.0 / sp->temperature, top = logits[argmax(logits, V)], sum = 0.0;
    for (int i = 0; i < V; i++) probs[i] = 0.0;
    if (sp->top_k <= 0 && sp->top_p >= 1.0) { /* every token: no ordering needed */
        for (int i = 0; i < V; i++) sum += probs[i] = (float)exp(((double)logits[i] - top) * inv_t);
    } else {
        int m = order_candidates(logits, V, sp->top_k, cand);
        for (int i = 0; i < m; i++) sum += probs[cand[i]] = (float)exp(((double)logits[cand[i]] - top) * inv_t);
        if (sp->top_p < 1.0) { /* smallest prefix whose mass reaches top_p */
            double acc = 0.0;
            int keep = m;
            for (int i = 0; i < m; i++) {
                acc += probs[cand[i]];
                if (acc >= sp->top_p * sum) {
                    keep = i + 1;
                    break;
                }
            }
            for (int i = keep; i < m; i++) probs[cand[i]] = 0.0;
            sum = acc;
        }
    }
    for (int i = 0; i < V; i++) probs[i] /= sum;
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
            d->mseq[n++] = i;
        }
    if (n == 0) return MOEQ_OK;
    moeq_err err = moeq_engine_mtp_step(d->engine, d->mitems, n, d->logits, (size_t)d->max_seqs * K1, errstr,
                                        errstr_size);
    if (err) return err;
    for (int r = 0; r < n; r++) {
        moeq_spec_seq *sq = &seqs[d->mseq[r]];
        const float *row = d->logits + (size_t)r * V;
        int32_t x;
        if (sq->sampling.temperature <= 0.0) {
            x = argmax(row, V);
        } else {
            float *keep = d->draft_logits + ((size_t)d->mseq[r] * d->max_k + j) * V;
            memcpy(keep, row, (size_t)V * sizeof(float));
            distribution(&sq->sampling, keep, V, d->cand, d->q);
            x = draw(d->q, V, uniform(sq->sampling.seed, sq->draws++));
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
    if (sq->sampling.temperature <= 0.0) {
        while (a < k && argmax(P + (size_t)a * V, V) == drafts[a]) sq->out[a] = drafts[a], a++;
        sq->out[a] = argmax(P + (size_t)a * V, V);
        sq->n_out = a + 1;
        return;
    }
    for (; a < k; a++) {
        int32_t x = drafts[a];
        distribution(&sq->sampling, P + (size_t)a * V, V, d->cand, d->p);
        distribution(&sq->sampling, d->draft_logits + ((size_t)i * d->max_k + a) * V, V, d->cand, d->q);
        if (uniform(sq->sampling.seed, sq->draws++) * d->q[x] < d->p[x]) {
            sq->out[a] = x;
            continue;
        }
        double sum = 0.0; /* rejected: draw from normalize(max(0, p - q)) */
        for (int t = 0; t < V; t++) sum += d->p[t] = d->p[t] > d->q[t] ? d->p[t] - d->q[t] : 0.0;
        if (sum > 0.0)
            for (int t = 0; t < V; t++) d->p[t] /= sum;
        else
            distribution(&sq->sampling, P + (size_t)a * V, V, d->cand, d->p);
        sq->out[a] = draw(d->p, V, uniform(sq->sampling.seed, sq->draws++));
        sq->n_out = a + 1;
        return;
    }
    distribution(&sq->sampling, P + (size_t)k * V, V, d->cand, d->p);
    sq->out[k] = draw(d->p, V, uniform(sq->sampling.seed, sq->draws++));
    sq->n_out = k + 1;
}

/* Drop everything the round appended (error path): main back to len0, MTP drafts gone. */
static void undo(moeq_mtp_decoder *d, const moeq_spec_seq *seqs, int n) {
    for (int i = 0; i < n; i++) moeq_engine_seq_truncate(d->engine, seqs[i].seq_id, (int)d->len0[i]);
}

moeq_err moeq_mtp_decode_step(moeq_mtp_decoder *d, moeq_spec_seq *seqs, int n_seqs, char *errstr,
                              size_t errstr_size) {
    if (!d) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "decoder is NULL");
    moeq_err err = check_round(d, seqs, n_seqs, errstr, errstr_size);
    if (err || n_seqs == 0) return err;
    int K1 = d->max_k + 1, max_depth = 0;
    int64_t rows = 0;
    for (int i = 0; i < n_seqs; i++) {
        d->len0[i] = moeq_engine_seq_len(d->engine, seqs[i].seq_id);
        d->tokens[(size_t)i * K1] = seqs[i].next_token;
        if (seqs[i].k > max_depth) max_depth = seqs[i].k;
    }
    for (int j = 0; j < max_depth; j++)
        if ((err = draft_depth(d, seqs, n_seqs, j, errstr, errstr_size))) goto undo_round;
    for (int i = 0; i < n_seqs; i++) {
        d->items[i] = (moeq_step_item){seqs[i].seq_id, d->tokens + (size_t)i * K1, seqs[i].k + 1, 1};
        d->row0[i] = rows;
        rows += seqs[i].k + 1;
    }
    if ((err = moeq_engine_step(d->engine, d->items, n_seqs, d->logits, (size_t)d->max_seqs * K1, errstr,
                                errstr_size)))
        goto undo_round;
    for (int i = 0; i < n_seqs; i++) {
        moeq_spec_seq *sq = &seqs[i];
        accept(d, sq, i);
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
