/*
 * head_screen.c — the screened lm_head's bounds (head_screen.h).
 *
 * The bound, for head row j (exact weights w, the Q8R copy's w^ = s_w q) and a token x (D values; x^ its
 * split int8 form in the draft kernel, s_x = fl(a / 127), a = max |x_k|):
 *
 *   y_j - E_j = (y_j - w^.x^) + (w^.x^ - w.x) + (w.x - E_j)
 *
 * - w^.x^ - w.x = -(w - w^).x - w^.(x - x^): at most ||w - w^|| X + ||w^|| ||x - x^|| (Cauchy-Schwarz).
 *   Per element the kernel's u_k = fl(x_k fl(127 / a)) is within 4 * 127 * 2^-24 of x_k / s_x, and
 *   hi_k + lo_k / 254 within (0.5 + 127 * 2^-24) / 254 of u_k (lo_k = rint(fl((u_k - hi_k) * 254))): so
 *   |x_k - x^_k| <= 0.00205 s_x, and ||x - x^|| <= sqrt(D) 0.00205 s_x.
 * - y_j - w^.x^: y = fl(fl(s_w s_x) fma(fl(B), fl(1/254), fl(A))) with A, B exact int32 sums; each of the
 *   five roundings is relative, against s_w s_x (|A| + |B| / 254) <= sum_k |w^_k| (|x_k| + 0.51 s_x):
 *   at most 8.5 * 2^-24 ||w^|| (X + 0.51 s_x sqrt(D)).
 * - w.x - E_j: the exact path's own error, whatever path (cpu_matrix): the float32 lanes' fixed-order
 *   chains (at most (D + 64) 2^-24 sum |w_k x_k|), AMX tiles with the activation split in two BF16 parts
 *   (the residual below 2^-16 |x_k|, the tile's sums (2D + 64) 2^-24), F8 weights dequantised per element
 *   (one more rounding): g = (2D + 68) 2^-24 + 2^-15 of ||w|| X bounds them all. Subnormal products that a
 *   path flushes add at most 2D 2^-126: the absolute 2^-90.
 * The per-row parts are computed in double at creation and rounded up into floats; the per-token terms in
 * double with a 2^-40 margin, then rounded up into floats for the candidates' passes (see there).
 *
 * The first pass (hi codes alone, q8r_hi_only: half the products) has x^_k = s_x hi_k, up to s_x / 2 from x_k:
 * as a worst case (0.5 sqrt(D) s_x) that bound is ~3x the split's on the bench head, so ||x - x^|| is
 * computed instead, exactly as the kernel quantises (u_k = fl(x_k fl(127 / a)), hi_k = rint(u_k)), in double
 * (s_x hi_k is exact there): about sqrt(D / 12) s_x for a typical token. Its float steps y = fl(fl(s_w s_x)
 * fl(A)) are three relative roundings of |w^.x^| <= ||w^|| (X + ||x - x^||). The rows that pass it are
 * refined with the split (the bound above) before any is computed exactly.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "head_screen.h"

struct moeq_head_screen {
    moeq_tensor *codes; /* the Q8R copy (one allocation: free())                  */
    moeq_tensor hi;     /* a view of it whose products take the hi codes alone    */
    int64_t rows, cols;
    float *p, *q;       /* [rows] P_j and Q_j rounded up; +inf: non-finite weights */
    double max_wnorm;   /* the largest finite ||w_j||: the overflow guard          */
    int64_t n_finite;   /* rows with finite bounds                                */
};

/* Per-token constants: X (inflated), c (inflated), and whether the screen may decide at all. */
typedef struct token_terms {
    double x, c;
    int ok;
} token_terms;

/* ||x - x^|| of the hi codes alone, as the kernel makes them (ops_draft.c quantize; a = max |x_k| > 0). */
static double hi_residual(const float *x, int64_t D, float a) {
    const float inv = 127.0f / a, sx = a / 127.0f;
    double ee = 0.0;
    for (int64_t k = 0; k < D; k++) {
        float u = x[k] * inv, h = rintf(u);
        double d = (double)x[k] - (double)sx * (double)h; /* the product is exact in double */
        ee += d * d;
    }
    return sqrt(ee) * (1.0 + 0x1p-40);
}

static token_terms terms_of(const moeq_head_screen *s, const float *x, int hi_only) {
    token_terms t = {0, 0, 0};
    double ss = 0.0, a = 0.0;
    for (int64_t k = 0; k < s->cols; k++) {
        double v = x[k];
        if (!(fabs(v) <= FLT_MAX)) return t; /* inf or NaN: the caller computes the row whole */
        ss += v * v;
        a = fabs(v) > a ? fabs(v) : a;
    }
    double X = sqrt(ss) * (1.0 + 0x1p-40), sx = a / 127.0 * (1.0 + 0x1p-20), rd = sqrt((double)s->cols);
    /* a product as large as 2^100 is far from any logit; beyond, the exact path's partial sums could overflow */
    if (X * s->max_wnorm > 0x1p100) return t;
    t.x = X;
    if (hi_only) {
        double r = a > 0.0 ? hi_residual(x, s->cols, (float)a) : 0.0; /* a = 0: x^ = x = 0 */
        t.c = (r + 3.01 * 0x1p-24 * (X + r)) * (1.0 + 0x1p-40);
    } else t.c = (rd * 0.00205 * sx + 8.5 * 0x1p-24 * (X + 0.51 * sx * rd)) * (1.0 + 0x1p-40);
    t.ok = 1;
    return t;
}

static double eps_of(const moeq_head_screen *s, const token_terms *t, int64_t j) {
    return t->x * (double)s->p[j] + t->c * (double)s->q[j] + 0x1p-90;
}

static float round_up(double v) {
    float f = (float)v;
    return (double)f >= v ? f : nextafterf(f, INFINITY);
}

moeq_err moeq_head_screen_new(const moeq_tensor *head, moeq_head_screen **out, char *errstr, size_t errstr_size) {
    *out = NULL;
    if (!head || head->ndim != 2 || head->dtype == MOEQ_DTYPE_Q8R || moeq_tensor_cols(head) > MOEQ_Q8R_MAX_COLS)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "head screen: a 2-D head of at most %d columns",
                         MOEQ_Q8R_MAX_COLS);
    moeq_head_screen *s = calloc(1, sizeof *s);
    const int64_t rows = moeq_tensor_rows(head), cols = moeq_tensor_cols(head);
    float *row = malloc((size_t)cols * sizeof(float));
    if (s) {
        s->rows = rows, s->cols = cols;
        s->codes = moeq_tensor_q8r_copy(head);
        s->p = malloc((size_t)rows * sizeof(float));
        s->q = malloc((size_t)rows * sizeof(float));
    }
    if (!s || !row || !s->codes || !s->p || !s->q) {
        free(row);
        moeq_head_screen_destroy(s);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "head screen: an int8 copy of %lld x %lld",
                         (long long)rows, (long long)cols);
    }
    const double g = (2.0 * (double)cols + 68.0) * 0x1p-24 + 0x1p-15;
    const float *scales = s->codes->scale_inv->data;
    for (int64_t j = 0; j < rows; j++) {
        moeq_tensor_rows_to_f32(head, j, 1, row);
        const uint8_t *codes = s->codes->data;
        double ww = 0.0, ee = 0.0, qq = 0.0, sw = scales[j];
        for (int64_t k = 0; k < cols; k++) {
            double w = row[k], wh = (double)((int)codes[moeq_q8r_at(cols, j, k)] - 128) * sw; /* exact */
            ww += w * w, ee += (w - wh) * (w - wh), qq += wh * wh;
        }
        double wn = sqrt(ww), P = (sqrt(ee) + g * wn) * (1.0 + 0x1p-40), Q = sqrt(qq) * (1.0 + 0x1p-40);
        if (!(P <= FLT_MAX && Q <= FLT_MAX && sw == sw)) {
            s->p[j] = s->q[j] = INFINITY; /* non-finite weights: always a candidate, its exact value decides */
            continue;
        }
        s->p[j] = round_up(P), s->q[j] = round_up(Q);
        s->max_wnorm = wn > s->max_wnorm ? wn : s->max_wnorm;
        s->n_finite++;
    }
    free(row);
    s->hi = *s->codes;
    s->hi.q8r_hi_only = 1;
    *out = s;
    return MOEQ_OK;
}

void moeq_head_screen_destroy(moeq_head_screen *s) {
    if (!s) return;
    free(s->codes);
    free(s->p);
    free(s->q);
    free(s);
}

const moeq_tensor *moeq_head_screen_codes(const moeq_head_screen *s, int hi_only) {
    return hi_only ? &s->hi : s->codes;
}

size_t moeq_head_screen_bytes(const moeq_head_screen *s) {
    return s->codes->nbytes + s->codes->scale_inv->nbytes + 2 * (size_t)s->rows * sizeof(float);
}

double moeq_head_screen_bound(const moeq_head_screen *s, const float *x, int64_t row, int hi_only) {
    token_terms t = terms_of(s, x, hi_only);
    if (!t.ok || !(s->p[row] <= FLT_MAX)) return INFINITY;
    return eps_of(s, &t, row);
}

/*
 * Two passes over the rows in float, 16 lanes at a time (the compiler vectorises the lane loops; a max
 * reduction over doubles it does not): ~1 ns a row less than doubles. The float steps lean to inclusion:
 * X and c are rounded up with a 2^-19 margin, so each eps_f = fl(X P + c Q + 2^-88) is at least the exact
 * bound whatever its two roundings; lo = fl(y - eps_f) may round up by 2^-24 |lo|, so T is lowered by
 * 2^-22 |T|; hi = fl(y + eps_f) may round down by 2^-24 |hi|, so a row counts when hi + 2^-21 |hi| >= T.
 */
int64_t moeq_head_screen_candidates(const moeq_head_screen *s, const float *x, const float *approx, int32_t *ids,
                                    int64_t cap, int hi_only) {
    token_terms t = terms_of(s, x, hi_only);
    if (!t.ok || s->n_finite == 0) return 0;
    const float *p = s->p, *q = s->q, X = round_up(t.x * (1.0 + 0x1p-19)), c = round_up(t.c * (1.0 + 0x1p-19)),
                a = 0x1p-88f; /* 2^-90 and the roundings around it */
    const int64_t V = s->rows, V16 = V / 16 * 16;
    float m[16];
    for (int l = 0; l < 16; l++) m[l] = -INFINITY;
    for (int64_t j = 0; j < V16; j += 16)
        for (int l = 0; l < 16; l++) { /* an infinite P gives -inf, a NaN y (non-finite weights) nothing */
            float lo = approx[j + l] - (X * p[j + l] + c * q[j + l] + a);
            m[l] = lo > m[l] ? lo : m[l];
        }
    for (int64_t j = V16; j < V; j++) {
        float lo = approx[j] - (X * p[j] + c * q[j] + a);
        m[0] = lo > m[0] ? lo : m[0];
    }
    float Tf = -INFINITY;
    for (int l = 0; l < 16; l++) Tf = m[l] > Tf ? m[l] : Tf;
    if (!(Tf > -INFINITY)) return 0;
    double Td = (double)Tf - fabs((double)Tf) * 0x1p-22;
    float T = (float)Td;
    if ((double)T > Td) T = nextafterf(T, -INFINITY);
    int64_t n = 0;
    for (int64_t j0 = 0; j0 < V; j0 += 16) {
        int any = 0;
        if (j0 + 16 <= V)
            for (int l = 0; l < 16; l++) {
                float hi = approx[j0 + l] + (X * p[j0 + l] + c * q[j0 + l] + a);
                any |= !(hi + fabsf(hi) * 0x1p-21f < T); /* NaN hi (non-finite weights): a candidate */
            }
        else any = 1;
        if (!any) continue;
        for (int64_t j = j0; j < j0 + 16 && j < V; j++) {
            float hi = approx[j] + (X * p[j] + c * q[j] + a);
            if (hi + fabsf(hi) * 0x1p-21f < T) continue;
            if (n == cap) return 0;
            ids[n++] = (int32_t)j;
        }
    }
    return n;
}

/*
 * The same selection among n rows only, in double (few rows): every bound term is already inflated, and each
 * double step rounds by at most 2^-53 of its value, so T is lowered, and each upper end raised, by 2^-50 of
 * its size. A NaN value or an infinite bound keeps its row.
 */
int64_t moeq_head_screen_refine(const moeq_head_screen *s, const float *x, const int32_t *ids, const float *approx,
                                int64_t n, int32_t *out, int64_t cap) {
    token_terms t = terms_of(s, x, 0);
    if (!t.ok || n <= 0) return 0;
    double T = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double lo = (double)approx[i] - eps_of(s, &t, ids[i]);
        T = lo > T ? lo : T;
    }
    if (!(T > -INFINITY)) return 0;
    T -= fabs(T) * 0x1p-50;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        double hi = (double)approx[i] + eps_of(s, &t, ids[i]);
        if (hi + fabs(hi) * 0x1p-50 < T) continue;
        if (m == cap) return 0;
        out[m++] = ids[i];
    }
    return m;
}
