/*
 * model_check.c — moeq_model_check_weights: every tensor of a loaded model,
 * dequantised row block by row block through moeq_tensor_rows_to_f32 (the
 * path the forward pass uses, so an FP8 value times its block scale that
 * overflows float32 is seen as the forward would see it), checked for NaN,
 * inf and values too large to multiply safely.
 *
 * Not on any hot path: it reads every page of the checkpoint (minutes for
 * DeepSeek-V3), which is why the worker runs it only when asked
 * (check_weights). It changes nothing; a bad checkpoint still loads.
 */
#include <math.h>
#include <stdlib.h>

#include "model.h"

/* Rows of at most this many floats are widened at once. */
#define CHECK_CHUNK_FLOATS (1 << 20)

/* A view of t as the 2-D matrix rows_to_f32 walks (tensors of more dimensions: all leading ones as rows). */
static moeq_tensor as_matrix(const moeq_tensor *t) {
    moeq_tensor v = *t;
    if (v.ndim > 2) {
        int64_t rows = 1;
        for (int d = 0; d + 1 < v.ndim; d++) rows *= v.shape[d];
        v.shape[0] = rows;
        v.shape[1] = t->shape[t->ndim - 1];
        v.ndim = 2;
    }
    return v;
}

static void scan_values(const float *x, int64_t n, int64_t base, moeq_weight_issue *issue) {
    for (int64_t i = 0; i < n; i++) {
        int bad = !isfinite(x[i]) ? 1 : fabsf(x[i]) >= MOEQ_WEIGHT_HUGE ? 2 : 0;
        if (!bad) continue;
        if (issue->nonfinite + issue->huge == 0) issue->first = base + i;
        if (bad == 1) issue->nonfinite++;
        else issue->huge++;
    }
}

static void scan_tensor(const moeq_tensor *t, float *buf, moeq_weight_issue *issue) {
    moeq_tensor v = as_matrix(t);
    int64_t rows = moeq_tensor_rows(&v), cols = moeq_tensor_cols(&v);
    int64_t step = cols > 0 && cols < CHECK_CHUNK_FLOATS ? CHECK_CHUNK_FLOATS / cols : 1;
    for (int64_t r = 0; r < rows && cols > 0; r += step) {
        int64_t n = rows - r < step ? rows - r : step;
        moeq_tensor_rows_to_f32(&v, r, n, buf);
        scan_values(buf, n * cols, r * cols, issue);
    }
}

moeq_err moeq_model_check_weights(const moeq_model *model, moeq_weight_issue_fn fn, void *ctx, int *n_bad,
                                  char *errstr, size_t errstr_size) {
    if (!model || !n_bad) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "model and n_bad are required");
    *n_bad = 0;
    int64_t widest = 1;
    for (int i = 0; i < model->n_tensors; i++) {
        moeq_tensor v = as_matrix(&model->tensors[i]);
        if (moeq_tensor_cols(&v) > widest) widest = moeq_tensor_cols(&v);
    }
    float *buf = malloc((size_t)(widest > CHECK_CHUNK_FLOATS ? widest : CHECK_CHUNK_FLOATS) * sizeof(float));
    if (!buf) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "check_weights: a row buffer");
    for (int i = 0; i < model->n_tensors; i++) {
        moeq_weight_issue issue = {model->tensors[i].name, 0, 0, -1};
        scan_tensor(&model->tensors[i], buf, &issue);
        if (issue.nonfinite + issue.huge == 0) continue;
        (*n_bad)++;
        if (fn) fn(ctx, &issue);
    }
    free(buf);
    return MOEQ_OK;
}
