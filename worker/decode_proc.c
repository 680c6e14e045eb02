/*
 * decode_proc.c — see decode_proc.h.
 */
#include "decode_proc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct moeq_decode_proc {
    moeq_decode_proc_params p;
    int vocab;
    int32_t *eos, *stop;             /* copies                                              */
    int32_t *end;                    /* eos and stop ids inside the vocabulary, distinct     */
    float *end_value;                /* their values after penalties, per draw              */
    int n_end;
    moeq_grammar_matcher *matcher;   /* NULL: unconstrained                                 */
    moeq_grammar_matcher *guess;     /* scratch: the position after a round's drafts          */
    uint32_t *guess_bits;
    uint32_t *bits;                  /* [mask words]                                        */
    int n_drawn, complete_at;
    moeq_err err;
    uint8_t *seen;                   /* [vocab] 1: in prompt or output (repetition)         */
    int32_t *seen_list;              /* distinct seen ids                                   */
    int n_seen;
    int32_t *count;                  /* [vocab] output occurrences (presence/frequency)     */
    int32_t *out_list;               /* distinct output ids                                 */
    int n_out_distinct;
    int32_t *lp_token;               /* [max_new_tokens]                                    */
    float *lp_value;
    int32_t *lp_top_tokens;          /* [max_new_tokens][top]                               */
    float *lp_top_values;
};

static int repetition_on(const moeq_decode_proc_params *p) {
    return p->repetition_penalty > 0 && p->repetition_penalty != 1.0;
}

int moeq_decode_proc_needed(const moeq_decode_proc_params *p) {
    return p->grammar || p->min_tokens > 0 || repetition_on(p) || p->presence_penalty != 0 ||
           p->frequency_penalty != 0 || p->logprobs;
}

static int is_in(const int32_t *ids, int n, int32_t t) {
    for (int i = 0; i < n; i++)
        if (ids[i] == t) return 1;
    return 0;
}

static void mark_seen(moeq_decode_proc *d, int32_t t) {
    if (!d->seen || t < 0 || t >= d->vocab || d->seen[t]) return;
    d->seen[t] = 1;
    d->seen_list[d->n_seen++] = t;
}

static int alloc_state(moeq_decode_proc *d) {
    const moeq_decode_proc_params *p = &d->p;
    size_t V = (size_t)d->vocab, N = (size_t)p->max_new_tokens, top = (size_t)p->top_logprobs;
    d->eos = malloc(sizeof(int32_t) * (size_t)(p->n_eos + 1));
    d->stop = malloc(sizeof(int32_t) * (size_t)(p->n_stop_token_ids + 1));
    if (!d->eos || !d->stop) return -1;
    if (p->n_eos) memcpy(d->eos, p->eos_ids, sizeof(int32_t) * (size_t)p->n_eos);
    if (p->n_stop_token_ids) memcpy(d->stop, p->stop_token_ids, sizeof(int32_t) * (size_t)p->n_stop_token_ids);
    d->end = malloc(sizeof(int32_t) * (size_t)(p->n_eos + p->n_stop_token_ids + 1));
    d->end_value = malloc(sizeof(float) * (size_t)(p->n_eos + p->n_stop_token_ids + 1));
    if (!d->end || !d->end_value) return -1;
    for (int i = 0; i < p->n_eos + p->n_stop_token_ids; i++) {
        int32_t t = i < p->n_eos ? p->eos_ids[i] : p->stop_token_ids[i - p->n_eos];
        if (t >= 0 && t < d->vocab && !is_in(d->end, d->n_end, t)) d->end[d->n_end++] = t;
    }
    if (p->grammar) {
        if (moeq_grammar_matcher_new(p->grammar, &d->matcher) || moeq_grammar_matcher_new(p->grammar, &d->guess))
            return -1;
        if (!(d->bits = malloc(moeq_grammar_mask_words(p->grammar) * sizeof(uint32_t)))) return -1;
        if (!(d->guess_bits = malloc(moeq_grammar_mask_words(p->grammar) * sizeof(uint32_t)))) return -1;
    }
    if (repetition_on(p) &&
        (!(d->seen = calloc(V, 1)) || !(d->seen_list = malloc(sizeof(int32_t) * (V < N + (size_t)p->n_prompt ? V : N + (size_t)p->n_prompt)))))
        return -1;
    if ((p->presence_penalty != 0 || p->frequency_penalty != 0) &&
        (!(d->count = calloc(V, sizeof(int32_t))) || !(d->out_list = malloc(sizeof(int32_t) * N))))
        return -1;
    if (p->logprobs && (!(d->lp_token = malloc(sizeof(int32_t) * N)) || !(d->lp_value = malloc(sizeof(float) * N)) ||
                        !(d->lp_top_tokens = malloc(sizeof(int32_t) * (N * top + 1))) ||
                        !(d->lp_top_values = malloc(sizeof(float) * (N * top + 1)))))
        return -1;
    for (int i = 0; i < p->n_prompt; i++) mark_seen(d, p->prompt[i]);
    return 0;
}

moeq_err moeq_decode_proc_new(const moeq_decode_proc_params *params, int vocab, moeq_decode_proc **out, char *errstr,
                              size_t errstr_size) {
    if (!params || !out || vocab < 1 || params->max_new_tokens < 1 || params->top_logprobs < 0 ||
        params->top_logprobs > 20 || (params->grammar && (int)(moeq_grammar_mask_words(params->grammar) * 32) < vocab))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "decode processor: vocab %d, max_new_tokens >= 1, top_logprobs 0..20, a grammar over the "
                         "model's vocabulary",
                         vocab);
    *out = NULL;
    moeq_decode_proc *d = calloc(1, sizeof *d);
    if (!d) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "decode processor");
    d->p = *params;
    d->vocab = vocab;
    if (alloc_state(d)) {
        moeq_decode_proc_destroy(d);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "decode processor buffers (vocab %d)", vocab);
    }
    d->p.eos_ids = d->eos, d->p.stop_token_ids = d->stop, d->p.grammar = NULL;
    d->p.prompt = NULL; /* borrowed only during creation */
    *out = d;
    return MOEQ_OK;
}

void moeq_decode_proc_destroy(moeq_decode_proc *d) {
    if (!d) return;
    moeq_grammar_matcher_destroy(d->matcher);
    moeq_grammar_matcher_destroy(d->guess);
    free(d->guess_bits);
    free(d->eos), free(d->stop), free(d->end), free(d->end_value), free(d->bits), free(d->seen), free(d->seen_list), free(d->count);
    free(d->out_list), free(d->lp_token), free(d->lp_value), free(d->lp_top_tokens), free(d->lp_top_values);
    free(d);
}

/* ---- process ------------------------------------------------------------------------------ */

static void penalties(moeq_decode_proc *d, float *w) {
    const moeq_decode_proc_params *p = &d->p;
    if (d->seen) {
        float r = (float)p->repetition_penalty;
        for (int i = 0; i < d->n_seen; i++) {
            int32_t t = d->seen_list[i];
            w[t] = w[t] > 0 ? w[t] / r : w[t] * r;
        }
    }
    if (d->count)
        for (int i = 0; i < d->n_out_distinct; i++) {
            int32_t t = d->out_list[i];
            w[t] -= (float)(p->frequency_penalty * d->count[t] + p->presence_penalty);
        }
}

/* The grammar's mask: every token outside it -inf. */
static int64_t grammar_mask(moeq_decode_proc *d, float *w) {
    int32_t budget = d->p.max_new_tokens - d->n_drawn;
    moeq_err err = MOEQ_OK;
    int64_t n = moeq_grammar_matcher_mask(d->matcher, budget, d->bits, &err);
    if (n < 0) {
        d->err = err;
        return -1;
    }
    for (int word = 0; word * 32 < d->vocab; word++) {
        uint32_t m = d->bits[word];
        if (m == 0xFFFFFFFFu) continue;
        float *row = w + word * 32;
        int hi = d->vocab - word * 32 < 32 ? d->vocab - word * 32 : 32;
        if (m == 0) { /* most words of a narrow mask: a plain fill the compiler vectorizes */
            for (int b = 0; b < hi; b++) row[b] = -INFINITY;
            continue;
        }
        for (int b = 0; b < hi; b++)
            if (!(m >> b & 1)) row[b] = -INFINITY;
    }
    return n;
}

/* End-of-sequence and stop ids: their (penalised) values where ending is allowed, -inf where not. */
static int64_t ending_ids(moeq_decode_proc *d, float *w, int may_end) {
    int64_t delta = 0;
    for (int i = 0; i < d->n_end; i++) {
        int32_t t = d->end[i];
        int was = w[t] != -INFINITY;
        w[t] = may_end ? d->end_value[i] : -INFINITY;
        delta += (w[t] != -INFINITY) - was;
    }
    return delta;
}

static void process(void *ctx, const float *raw, float *w, int vocab) {
    moeq_decode_proc *d = ctx;
    (void)vocab;
    penalties(d, w);
    for (int i = 0; i < d->n_end; i++) d->end_value[i] = w[d->end[i]];
    int may_end = d->n_drawn >= d->p.min_tokens;
    int64_t allowed = d->vocab;
    if (d->matcher && !d->err && (allowed = grammar_mask(d, w)) >= 0)
        may_end = may_end && moeq_grammar_matcher_accepting(d->matcher);
    if (d->matcher && d->err) { /* the job ends with an error at this draw (worker): keep one value finite */
        for (int t = 0; t < d->vocab; t++) w[t] = -INFINITY;
        allowed = 0, may_end = 0;
    }
    allowed += ending_ids(d, w, may_end);
    if (allowed <= 0) { /* complete with nothing to follow (the job ends here: complete_at), or an error */
        int32_t t = d->n_end ? d->end[0] : 0;
        w[t] = raw[t];
    }
}

/* ---- accept --------------------------------------------------------------------------------- */

/* log-softmax of raw at token t and the top alternatives (float64 sums). */
static void record_logprob(moeq_decode_proc *d, const float *raw, int32_t t) {
    int V = d->vocab, k = d->p.top_logprobs, i = d->n_drawn;
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; j++)
        if (raw[j] > mx) mx = raw[j];
    for (int j = 0; j < V; j++) sum += exp((double)raw[j] - mx);
    double lse = mx + log(sum);
    d->lp_token[i] = t;
    d->lp_value[i] = t >= 0 && t < V ? (float)((double)raw[t] - lse) : -INFINITY;
    int32_t *top = d->lp_top_tokens + (size_t)i * (size_t)k;
    float *topv = d->lp_top_values + (size_t)i * (size_t)k;
    int m = 0;
    for (int32_t j = 0; j < V && k > 0; j++) { /* bounded insertion: highest first, lower id on ties */
        if (m == k && !(raw[j] > raw[top[m - 1]])) continue;
        int at = m < k ? m++ : k - 1;
        while (at > 0 && raw[j] > raw[top[at - 1]]) top[at] = top[at - 1], at--;
        top[at] = j;
    }
    for (int j = 0; j < m; j++) topv[j] = (float)((double)raw[top[j]] - lse);
}

static void count_output(moeq_decode_proc *d, int32_t t) {
    mark_seen(d, t);
    if (!d->count || t < 0 || t >= d->vocab) return;
    if (d->count[t]++ == 0) d->out_list[d->n_out_distinct++] = t;
}

static void accept(void *ctx, const float *raw, int32_t t) {
    moeq_decode_proc *d = ctx;
    if (d->n_drawn >= d->p.max_new_tokens) return; /* a round drew past the job's end: nothing reads it */
    if (d->lp_token) record_logprob(d, raw, t);
    count_output(d, t);
    d->n_drawn++;
    if (!d->matcher || d->err || d->complete_at) return;
    if (is_in(d->eos, d->p.n_eos, t) || is_in(d->stop, d->p.n_stop_token_ids, t)) {
        if (moeq_grammar_matcher_accepting(d->matcher)) d->complete_at = d->n_drawn;
        return;
    }
    moeq_err e = moeq_grammar_matcher_accept(d->matcher, t);
    if (e) d->err = e == MOEQ_ERR_INVALID_ARG ? MOEQ_ERR_INTERNAL : e; /* the mask allowed it: cannot happen */
    else if (moeq_grammar_matcher_done(d->matcher)) d->complete_at = d->n_drawn;
}

static int32_t argmax_row(const float *row, int V) {
    int32_t best = 0;
    for (int32_t t = 1; t < V; t++)
        if (row[t] > row[best]) best = t;
    return best;
}

/*
 * A speculative round's draft: the MTP row's best token that the grammar allows after the drafts so far
 * (a forbidden draft could never be accepted). Unconstrained, failed or finished: the plain argmax.
 */
static int32_t draft(void *ctx, const float *row, int V, const int32_t *prefix, int n_prefix) {
    moeq_decode_proc *d = ctx;
    if (!d->matcher || d->err || d->complete_at || moeq_grammar_matcher_copy(d->guess, d->matcher))
        return argmax_row(row, V);
    for (int i = 0; i < n_prefix; i++)
        if (moeq_grammar_matcher_accept(d->guess, prefix[i])) return argmax_row(row, V); /* an end id, or done */
    moeq_err err;
    if (moeq_grammar_matcher_mask(d->guess, d->p.max_new_tokens - d->n_drawn - n_prefix, d->guess_bits, &err) <= 0)
        return argmax_row(row, V);
    int32_t best = -1;
    for (int32_t t = 0; t < V; t++)
        if ((d->guess_bits[t >> 5] >> (t & 31) & 1) && (best < 0 || row[t] > row[best])) best = t;
    return best;
}

moeq_sampler_hook moeq_decode_proc_hook(moeq_decode_proc *d) {
    return (moeq_sampler_hook){d, process, accept, draft};
}

int moeq_decode_proc_n_drawn(const moeq_decode_proc *d) { return d ? d->n_drawn : 0; }
int moeq_decode_proc_complete_at(const moeq_decode_proc *d) { return d ? d->complete_at : 0; }
moeq_err moeq_decode_proc_error(const moeq_decode_proc *d) { return d ? d->err : MOEQ_OK; }

int moeq_decode_proc_logprob(const moeq_decode_proc *d, int i, moeq_logprob *out) {
    if (!d || !d->lp_token || i < 0 || i >= d->n_drawn) return -1;
    size_t k = (size_t)d->p.top_logprobs;
    *out = (moeq_logprob){d->lp_token[i], d->lp_value[i], (int)k, d->lp_top_tokens + (size_t)i * k,
                          d->lp_top_values + (size_t)i * k};
    return 0;
}
