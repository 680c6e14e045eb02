/*
 * head_screen.h — internal: the lm_head of rows read only for their argmax
 * (greedy draws, the records of rows nobody samples) without the whole row
 * on the exact path.
 *
 * Why: at a decode batch the head is the largest product of the step (on
 * the bench checkpoint, 129,280 x 1,024: half the step's multiply-adds at 32
 * tokens, and at 1 token a quarter of its bytes), yet a greedy draw reads one
 * value of it. The screen runs the head as an int8 copy (Q8R: the draft
 * kernels of cpu/ops_draft.h, exact int32 sums, half the bytes of BF16 and
 * 2-2.7x its speed on the float32 lanes) and, per token, bounds how far each
 * approximate logit y_j can be from the exact path's value E_j:
 *
 *   |y_j - E_j| <= eps_j = X * P_j + c * Q_j
 *
 * with X = ||x||_2 of the token's normed hidden state and, per head row j,
 *   P_j = ||w_j - w^_j||_2 + g * ||w_j||_2      (the int8 copy's error, and
 *                                               the exact path's own rounding:
 *                                               g = (2D + 68) 2^-24 + 2^-15)
 *   Q_j = ||w^_j||_2                            (w^_j: the copy's values)
 *   c   = ||x - x^||_2 bound + the kernel's float rounding (x^: the draft
 *         kernel's split int8 activation; ops_draft.h's element formula)
 * (Cauchy-Schwarz on each error term; derivation in head_screen.c). Every
 * row whose interval [y_j - eps_j, y_j + eps_j] reaches the highest lower end
 * T = max_j (y_j - eps_j) is a candidate; a row outside cannot hold the
 * maximum (E_j <= y_j + eps_j < T <= E of the row that set T). The caller then
 * computes the candidates' exact values on the exact path (the same per
 * element arithmetic as the whole product: batch invariance, tested) and
 * takes their argmax: the token, and its value, are exactly the full row's.
 * Speed never buys a different token; a screen that cannot decide (a
 * non-finite or enormous activation, too many candidates) says so and the
 * caller computes the row whole.
 *
 * Two passes (session 20): the whole head first with the hi codes alone
 * (half the int8 products; c from ||x - x^|| computed for the token), then,
 * where that leaves more rows than the caller computes exactly, those rows
 * again with the split codes and the tighter bound (moeq_head_screen_refine).
 * Each pass only drops rows that cannot hold the maximum, so the argmax is
 * among what is left.
 */
#ifndef MOEQ_ENGINE_HEAD_SCREEN_H
#define MOEQ_ENGINE_HEAD_SCREEN_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/util.h"
#include "tensor.h"

typedef struct moeq_head_screen moeq_head_screen;

/*
 * The screen of head (2-D, cols <= MOEQ_Q8R_MAX_COLS, any dtype but Q8R): its Q8R copy and the per-row bounds,
 * one pass over the head's rows. MOEQ_ERR_NOMEM; MOEQ_ERR_UNSUPPORTED for a head it cannot take.
 */
moeq_err moeq_head_screen_new(const moeq_tensor *head, moeq_head_screen **out, char *errstr, size_t errstr_size);
void moeq_head_screen_destroy(moeq_head_screen *screen);

/* The Q8R copy the approximate logits are computed with (rows and columns of the head); hi_only: a view of it
 * whose products take the activations' hi codes alone (the first pass: half the products, a wider bound). */
const moeq_tensor *moeq_head_screen_codes(const moeq_head_screen *screen, int hi_only);
/* Bytes the screen holds (the copy and the bounds). */
size_t moeq_head_screen_bytes(const moeq_head_screen *screen);

/*
 * The candidates of one token: x its normed hidden state (cols floats, the exact product's input), approx
 * the product of x with moeq_head_screen_codes(screen, hi_only) (rows floats). Writes the candidate row ids,
 * ascending, into ids (at most cap) and returns how many (>= 1), or 0 when the screen cannot decide: x holds
 * a non-finite value, ||x|| is so large that a product could overflow, no row has a finite bound, or more
 * than cap rows are candidates.
 */
int64_t moeq_head_screen_candidates(const moeq_head_screen *screen, const float *x, const float *approx,
                                    int32_t *ids, int64_t cap, int hi_only);

/*
 * The second pass: among rows ids[0..n) (ascending: the first pass's candidates; the rows it left out
 * cannot hold the maximum) with approx[i] their products with the split codes (hi_only 0), the candidates
 * under that pass's tighter bound, ascending into out. Returns how many, or 0 as above.
 */
int64_t moeq_head_screen_refine(const moeq_head_screen *screen, const float *x, const int32_t *ids,
                                const float *approx, int64_t n, int32_t *out, int64_t cap);

/* eps_j for token x and the pass hi_only (the bound above, as the candidates use it; +inf for a row with
 * non-finite weights). For the tests: |approx_j - exact_j| <= this for every row. */
double moeq_head_screen_bound(const moeq_head_screen *screen, const float *x, int64_t row, int hi_only);

#endif
