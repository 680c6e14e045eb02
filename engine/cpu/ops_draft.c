/*
 * ops_draft.c — the draft products on int8 dot products (see ops_draft.h for
 * the element and why its bits never depend on the kernel).
 *
 * The codes are laid out for it (tensor.h): a 64-byte vector holds four
 * codes of each of 16 rows, so with a token's four codes broadcast VPDPBUSD
 * gives 16 rows' partial sums in 16 lanes, and no sum ever crosses lanes.
 * A block quantises its tokens (up to 64) into the workspace once, hi and lo
 * codes of K bytes each, and keeps them for the thread's next block of the
 * same job (the caller's key); passes of up to 8 tokens then stream G groups
 * of 16 rows (G = 4 for 1-2 tokens, 2 for 3-4, 1 above), each 64 bytes of
 * codes loaded once for 2 R VPDPBUSD.
 */
#include "ops_draft.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "amx_inline.h"
#include "ops_amx.h"
#include "cpu_tuning.h"
#include "tensor.h"

#define TOKS 8    /* tokens per pass */
#define KEEP 64   /* tokens whose codes the workspace holds: the CPU backend's token blocks */
#define CHUNK 64  /* codes per VPDPBUSD */
#define GMAX 8    /* groups of 16 rows a pass holds (hi codes alone, 1-2 tokens) */
/* Each group's stream is prefetched this far ahead (into the next group's codes at its end; a prefetch never
 * faults): on an AMD Zen 5 VM (session 18) 2 tokens went 117 -> 131 GFLOP/s (bench-matmul q8r, one core).
 * Where the NT tiles prefetch into L2 (moeq_cpu_stream_l2: AMD Zen 3/4), so do these, twice as far ahead: on a
 * Zen 4 VM (session 26, bench-matmul q8r 16,384 x 1,024 from memory, one core, three runs of each build
 * alternated) 1 token went 30-32 -> 34-42 GFLOP/s and 2 tokens 54-59 -> 76-82. */
#define DRAFT_PF_BYTES 1024
#define DRAFT_PF_BYTES_L2 2048

#if defined(__x86_64__) && defined(__GNUC__)
#define DRAFT_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

static char draft_text[96];
static int draft_state, draft_amx; /* draft_amx: blocks of 16 tokens on AMX-INT8 tiles (the same sums) */
static pthread_once_t draft_once = PTHREAD_ONCE_INIT;

static void detect_once(void) {
#ifdef DRAFT_X86
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vnni")) {
        snprintf(draft_text, sizeof draft_text, "no avx512_vnni: F8 drafts on the exact path's kernels");
        return;
    }
    unsigned a, b, c, d;
    draft_amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 25)) && moeq_amx_supported();
    snprintf(draft_text, sizeof draft_text, "avx512_vnni int8 dot products%s",
             draft_amx ? ", amx_int8 tiles from 16 tokens" : "");
    draft_state = 1;
#else
    snprintf(draft_text, sizeof draft_text, "not x86-64: F8 drafts on the exact path's kernels");
#endif
}

int moeq_draft_supported(void) {
    pthread_once(&draft_once, detect_once);
    return draft_state;
}

const char *moeq_draft_describe(void) {
    pthread_once(&draft_once, detect_once);
    return draft_text;
}

int moeq_draft_fits(const moeq_tensor *w) { return w && w->dtype == MOEQ_DTYPE_Q8R; }

static int64_t padded(int64_t K) { return (K + CHUNK - 1) / CHUNK * CHUNK; }

/* The workspace: which tokens its codes are of, their scales and code sums, then KEEP tokens' hi and lo codes
 * (stride padded(K), zeros past K). */
typedef struct qhead {
    uint64_t key; /* the caller's name for (job, tokens) when the codes may be reused; 0: none */
    int64_t t0, t1, K;
    float sx[KEEP];
    int32_t hsum[KEEP], lsum[KEEP];
} qhead;

#define QHEAD_BYTES ((sizeof(qhead) + 63) / 64 * 64)

/* A pass's view of the codes of R <= TOKS tokens. */
typedef struct qtok {
    const float *sx;
    const int32_t *hsum, *lsum;
    const int8_t *hi, *lo;
} qtok;

size_t moeq_draft_ws_bytes(int64_t cols) { return QHEAD_BYTES + 2 * (size_t)KEEP * (size_t)padded(cols) + 64; }

/* The element's last steps (ops_draft.h), shared by every path; hi_only: A alone. */
static inline float finish(float sw, float sx, int64_t A, int64_t B, int hi_only) {
    return hi_only ? (sw * sx) * (float)A : (sw * sx) * fmaf((float)B, 1.0f / 254.0f, (float)A);
}

/* ---- the emulation ------------------------------------------------------------------------------------ */

/* The largest |x_k| of one token and 127 / it; 0 when every value is 0, -1 when one is not finite. */
static int token_range(const float *x, int64_t K, float *amax) {
    float a = 0.0f;
    for (int64_t k = 0; k < K; k++) {
        if (!isfinite(x[k])) return -1;
        a = fmaxf(a, fabsf(x[k]));
    }
    *amax = a;
    return a > 0.0f;
}

static void code_scalar(float x, float inv, int8_t *hi, int8_t *lo) {
    float u = x * inv, h = rintf(u), l = rintf((u - h) * 254.0f);
    *hi = (int8_t)h, *lo = (int8_t)l;
}

void moeq_draft_nt_block_ref(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1) {
    const moeq_tensor *w = job->w;
    const int64_t K = moeq_tensor_cols(w);
    const float *sw = (const float *)w->scale_inv->data;
    for (int64_t t = t0; t < t1; t++) {
        const float *x = job->x + t * job->ldx;
        float amax = 0.0f;
        int range = token_range(x, K, &amax);
        float sx = range < 0 ? NAN : range ? amax / 127.0f : 0.0f, inv = range > 0 ? 127.0f / amax : 0.0f;
        for (int64_t n = n0; n < n1; n++) {
            const uint8_t *q = (const uint8_t *)w->data;
            int64_t A = 0, B = 0;
            for (int64_t k = 0; range > 0 && k < K; k++) {
                int8_t h, l;
                code_scalar(x[k], inv, &h, &l);
                int64_t c = (int64_t)q[moeq_q8r_at(K, job->row0 + n, k)] - 128;
                A += c * h, B += c * l;
            }
            job->y[t * job->ldy + n] = finish(sw[job->row0 + n], sx, A, B, job->w->q8r_hi_only);
        }
    }
}

/* ---- the kernel --------------------------------------------------------------------------------------- */

#ifdef DRAFT_X86
#define TD __attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni")))
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Tokens t0 + r (r < R) of x into slots s0 + r of the workspace: the emulation's codes, 16 at a time. */
static TD void quantize(const moeq_mm_job *job, int64_t t0, int R, int64_t K, qhead *qh, int8_t *hi0, int8_t *lo0,
                        int s0) {
    const int64_t Kp = padded(K);
    for (int r = 0; r < R; r++) {
        const float *x = job->x + (t0 + r) * job->ldx;
        int8_t *hi = hi0 + (s0 + r) * Kp, *lo = lo0 + (s0 + r) * Kp;
        __m512 a = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int64_t k = 0; k < K; k += 16) {
            __mmask16 m = K - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (K - k)) - 1);
            __m512 v = _mm512_maskz_loadu_ps(m, x + k);
            bad |= _mm512_fpclass_ps_mask(v, 0x99); /* NaN, +-inf */
            a = _mm512_max_ps(a, _mm512_abs_ps(v));
        }
        float amax = _mm512_reduce_max_ps(a);
        int range = bad ? -1 : amax > 0.0f;
        qh->sx[s0 + r] = range < 0 ? NAN : range ? amax / 127.0f : 0.0f;
        const __m512 inv = _mm512_set1_ps(range > 0 ? 127.0f / amax : 0.0f), f254 = _mm512_set1_ps(254.0f);
        __m512i hs = _mm512_setzero_si512(), ls = _mm512_setzero_si512();
        for (int64_t k = 0; k < Kp; k += 16) {
            __mmask16 m = range <= 0 ? 0
                          : K - k >= 16 ? (__mmask16)0xFFFF
                          : K > k       ? (__mmask16)((1u << (K - k)) - 1)
                                        : 0;
            __m512 u = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), inv);
            __m512 h = _mm512_roundscale_ps(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m512 l = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(u, h), f254),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m512i hv = _mm512_cvtps_epi32(h), lv = _mm512_cvtps_epi32(l);
            hs = _mm512_add_epi32(hs, hv), ls = _mm512_add_epi32(ls, lv);
            _mm_storeu_si128((__m128i *)(hi + k), _mm512_cvtepi32_epi8(hv));
            _mm_storeu_si128((__m128i *)(lo + k), _mm512_cvtepi32_epi8(lv));
        }
        qh->hsum[s0 + r] = _mm512_reduce_add_epi32(hs), qh->lsum[s0 + r] = _mm512_reduce_add_epi32(ls);
    }
}

/*
 * The element's float steps for one group of 16 rows (lanes) and R tokens: sums ah[t], al[t] (with the + 128
 * of the codes still in them), the rows' scales at sw (valid: how many exist), into y (rows [r0, r1) of the
 * group stored, row r at column col + r; token t at t * ldy).
 */
static TD ALWAYS_INLINE void store_group(const int R, const int LO, const __m512i *ah, const __m512i *al,
                                         const qtok *qt, const float *sw, int64_t valid, float *y, int64_t col,
                                         int64_t ldy, int64_t r0, int64_t r1) {
    int64_t lo = r0 < 0 ? 0 : r0, hi = r1 > 16 ? 16 : r1;
    if (lo >= hi) return;
    /* lanes [lo, hi) move to the front, so the store starts at the block's own first column */
    const __mmask16 m = (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
    const __mmask16 mo = (__mmask16)((1u << (hi - lo)) - 1u);
    const __mmask16 ms = valid >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << valid) - 1u); /* no read past */
    const __m512 s = _mm512_maskz_loadu_ps(ms, sw), inv254 = _mm512_set1_ps(1.0f / 254.0f);
#pragma GCC unroll 16
    for (int t = 0; t < R; t++) {
        const __m512i h128 = _mm512_slli_epi32(_mm512_set1_epi32(qt->hsum[t]), 7); /* 128 * sum, wrapping */
        __m512 A = _mm512_cvtepi32_ps(_mm512_sub_epi32(ah[t], h128));
        if (LO) {
            const __m512i l128 = _mm512_slli_epi32(_mm512_set1_epi32(qt->lsum[t]), 7);
            A = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(al[t], l128)), inv254, A);
        }
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(s, _mm512_set1_ps(qt->sx[t])), A);
        _mm512_mask_storeu_ps(y + t * ldy + (col + lo), mo, _mm512_maskz_compress_ps(m, v));
    }
}

/*
 * G groups of 16 rows x R tokens: group g's codes at wq + g * gstride, quad j of it 64 bytes at j * 64 (row r's
 * four codes at r * 4); each quad of a token's codes is broadcast to the 16 rows, so a lane is a row and no
 * sum crosses lanes. Then the element's float steps, 16 rows at once, into y (rows [r0, r1) counted from
 * group 0's first row are stored, row r of that count at column col + r; token t at t * ldy).
 */
static TD ALWAYS_INLINE void groups_pass(const int G, const int R, const int LO, const int L2, const uint8_t *wq,
                                         int64_t gstride, int64_t quads, const qtok *qt, int64_t Kp, const float *sw,
                                         int64_t srows, float *y, int64_t col, int64_t ldy, int64_t r0, int64_t r1) {
    __m512i ah[GMAX][TOKS], al[GMAX][TOKS];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 8
        for (int t = 0; t < R; t++) ah[g][t] = al[g][t] = _mm512_setzero_si512();
    for (int64_t j = 0; j < quads; j++) {
        __m512i xh[TOKS], xl[TOKS];
#pragma GCC unroll 8
        for (int t = 0; t < R; t++) {
            int32_t h, l;
            memcpy(&h, qt->hi + t * Kp + 4 * j, 4);
            xh[t] = _mm512_set1_epi32(h);
            if (LO) memcpy(&l, qt->lo + t * Kp + 4 * j, 4), xl[t] = _mm512_set1_epi32(l);
        }
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) {
            moeq_cpu_stream_prefetch(wq + g * gstride + j * 64 + (L2 ? DRAFT_PF_BYTES_L2 : DRAFT_PF_BYTES), L2);
            const __m512i wv = _mm512_loadu_si512(wq + g * gstride + j * 64);
#pragma GCC unroll 8
            for (int t = 0; t < R; t++) {
                ah[g][t] = _mm512_dpbusd_epi32(ah[g][t], wv, xh[t]);
                if (LO) al[g][t] = _mm512_dpbusd_epi32(al[g][t], wv, xl[t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; g++)
        store_group(R, LO, ah[g], al[g], qt, sw + 16 * g, srows - 16 * g, y, col + 16 * g, ldy, r0 - 16 * g,
                    r1 - 16 * g);
}

/* Groups [g0, g1) against R tokens, G at a time (G shrinks as R grows so the G R accumulators, 2 G R with lo
 * codes, stay in registers); output rows [n0, n1) counted from group g0's first row (the block may start inside it), row r
 * of that count at column col + r of y. */
static TD ALWAYS_INLINE void groups_r(const int R, const int LO, const int L2, const uint8_t *wq, int64_t g0,
                                      int64_t g1, int64_t quads, const qtok *qt, int64_t Kp, const float *sw,
                                      int64_t rows, float *y, int64_t col, int64_t ldy, int64_t n0, int64_t n1) {
    /* the hi codes alone need half the accumulators: twice the groups up to 4 tokens; past 4, one group (an
     * in-process A/B on a Zen 5 VM, 129,280 x 1,024: 2 groups at 6-8 tokens took 1.2-1.35x the time of 1) */
    const int G = LO ? (R <= 2 ? 4 : R <= 4 ? 2 : 1) : (R <= 2 ? 8 : R <= 4 ? 4 : 1);
    const int64_t gstride = quads * 64;
    int64_t g = g0;
    for (; g + G <= g1; g += G) {
        int64_t base = (g - g0) * 16;
        groups_pass(G, R, LO, L2, wq + g * gstride, gstride, quads, qt, Kp, sw + g * 16, rows - g * 16, y, col + base,
                    ldy, n0 - base, n1 - base);
    }
    for (; g < g1; g++) {
        int64_t base = (g - g0) * 16;
        groups_pass(1, R, LO, L2, wq + g * gstride, gstride, quads, qt, Kp, sw + g * 16, rows - g * 16, y, col + base,
                    ldy, n0 - base, n1 - base);
    }
}

static TD void groups_any(int R, int lo, const uint8_t *wq, int64_t g0, int64_t g1, int64_t quads, const qtok *qt,
                          int64_t Kp, const float *sw, int64_t rows, float *y, int64_t col, int64_t ldy, int64_t n0,
                          int64_t n1) {
    const int l2 = moeq_cpu_stream_l2();
    switch (R * 4 + !!lo * 2 + l2) {
#define CASE(n)                                                                                                    \
    case n * 4 + 3: groups_r(n, 1, 1, wq, g0, g1, quads, qt, Kp, sw, rows, y, col, ldy, n0, n1); break;           \
    case n * 4 + 2: groups_r(n, 1, 0, wq, g0, g1, quads, qt, Kp, sw, rows, y, col, ldy, n0, n1); break;           \
    case n * 4 + 1: groups_r(n, 0, 1, wq, g0, g1, quads, qt, Kp, sw, rows, y, col, ldy, n0, n1); break;           \
    case n * 4: groups_r(n, 0, 0, wq, g0, g1, quads, qt, Kp, sw, rows, y, col, ldy, n0, n1); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
}

#ifdef MOEQ_AMX_X86
#define TDA __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,amx-tile,amx-int8")))

/*
 * 16 tokens x groups [g0, g1) on AMX-INT8 tiles: A = the tokens' hi (lo) codes, 16 rows of 64 (signed), B = 16
 * quads of the group as stored (unsigned q + 128: the layout is already the tiles' four-byte pairs), C = 16
 * tokens x 16 rows of int32 sums, the same integers as VPDPBUSD's lanes, so the same bits. Arguments as
 * groups_r's.
 */
static TDA void groups_amx16(int lo, const uint8_t *wq, int64_t g0, int64_t g1, int64_t quads, const qtok *qt,
                             int64_t Kp, const float *sw, int64_t rows, float *y, int64_t col, int64_t ldy,
                             int64_t n0, int64_t n1) {
    const int64_t gstride = quads * 64, steps = (quads + 15) / 16;
    _Alignas(64) int32_t ch[256], cl[256];
    _Alignas(64) uint8_t tail[1024];
    _tile_loadconfig(&moeq_amx_full_config);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *b = wq + g * gstride;
        _tile_zero(0);
        _tile_zero(1);
        for (int64_t s = 0; s < steps; s++) {
            const uint8_t *bs = b + s * 1024;
            if ((s + 1) * 16 > quads) { /* the group's last quads: the rest zero (the codes past K are 0 too) */
                memset(tail, 0, sizeof tail);
                memcpy(tail, bs, (size_t)(quads - s * 16) * 64);
                bs = tail;
            }
            _tile_loadd(2, qt->hi + s * 64, Kp);
            _tile_loadd(4, bs, 64);
            _tile_dpbsud(0, 2, 4);
            if (lo) {
                _tile_loadd(3, qt->lo + s * 64, Kp);
                _tile_dpbsud(1, 3, 4);
            }
        }
        _tile_stored(0, ch, 64);
        _tile_stored(1, cl, 64); /* zeros without lo: store_group does not read them then */
        __m512i ah[16], al[16];
        for (int t = 0; t < 16; t++) ah[t] = _mm512_load_si512(ch + 16 * t), al[t] = _mm512_load_si512(cl + 16 * t);
        const int64_t base = (g - g0) * 16;
        store_group(16, lo, ah, al, qt, sw + g * 16, rows - g * 16, y, col + base, ldy, n0 - base, n1 - base);
    }
    _tile_release();
}
#endif

/*
 * cap: tokens the workspace holds (1..KEEP; K = 16,384 takes 2 MiB for 64, its pages touched only as
 * used). When [t0, t1) fits, its codes are made once and, under a nonzero
 * key, kept for the next block of the same key and tokens (the other row blocks of the job on this thread);
 * else each pass makes its own.
 */
static TD void nt_block_vnni(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1, int64_t cap,
                             void *ws, uint64_t key) {
    const moeq_tensor *w = job->w;
    const int64_t K = moeq_tensor_cols(w), Kp = padded(K), quads = moeq_q8r_quads(K);
    qhead *qh = ws;
    int8_t *hi = (int8_t *)ws + QHEAD_BYTES, *lo = hi + cap * Kp;
    const int keep = t1 - t0 <= cap;
    if (keep && !(key && qh->key == key && qh->t0 == t0 && qh->t1 == t1 && qh->K == K)) {
        quantize(job, t0, (int)(t1 - t0), K, qh, hi, lo, 0);
        qh->key = key, qh->t0 = t0, qh->t1 = t1, qh->K = K;
    }
    /* absolute rows [a, b): whole 16-row groups, each stored only where it lies inside the block */
    const int64_t a = job->row0 + n0, b = job->row0 + n1, g0 = a / 16, g1 = (b + 15) / 16;
    const float *sw = (const float *)w->scale_inv->data;
    const int64_t col = n0 - (a - g0 * 16); /* column of group g0's first row (negative inside the group) */
    const int64_t per = cap < TOKS ? cap : TOKS;
    for (int64_t t = t0, step; t < t1; t += step) {
        const int s0 = keep ? (int)(t - t0) : 0;
#ifdef MOEQ_AMX_X86
        if (keep && draft_amx && t1 - t >= 16) { /* the tiles give the lanes' integers: the same bits */
            const qtok qt = {qh->sx + s0, qh->hsum + s0, qh->lsum + s0, hi + s0 * Kp, lo + s0 * Kp};
            groups_amx16(!job->w->q8r_hi_only, (const uint8_t *)w->data, g0, g1, quads, &qt, Kp, sw, w->shape[0],
                         job->y + t * job->ldy, col, job->ldy, a - g0 * 16, b - g0 * 16);
            step = 16;
            continue;
        }
#endif
        step = per;
        const int R = (int)(t1 - t < per ? t1 - t : per);
        if (!keep) {
            quantize(job, t, R, K, qh, hi, lo, 0);
            qh->key = 0;
        }
        const qtok qt = {qh->sx + s0, qh->hsum + s0, qh->lsum + s0, hi + s0 * Kp, lo + s0 * Kp};
        groups_any(R, !job->w->q8r_hi_only, (const uint8_t *)w->data, g0, g1, quads, &qt, Kp, sw, w->shape[0],
                   job->y + t * job->ldy, col, job->ldy, a - g0 * 16, b - g0 * 16);
    }
}
#endif

void moeq_draft_nt_block(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1, void *ws,
                         size_t ws_bytes, uint64_t key) {
    const int64_t Kp = padded(moeq_tensor_cols(job->w));
    int64_t cap = ws && ws_bytes > QHEAD_BYTES ? (int64_t)((ws_bytes - QHEAD_BYTES) / (2 * (size_t)Kp)) : 0;
    if (cap > KEEP) cap = KEEP;
    if (n0 >= n1 || t0 >= t1) return;
#ifdef DRAFT_X86
    if (cap >= 1 && moeq_draft_supported()) {
        nt_block_vnni(job, n0, n1, t0, t1, cap, ws, key);
        return;
    }
#else
    (void)key;
#endif
    moeq_draft_nt_block_ref(job, n0, n1, t0, t1); /* the same bits */
}
