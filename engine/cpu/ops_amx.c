/*
 * ops_amx.c — the AMX BF16 tile path for NT products (see ops_amx.h for the
 * contract and the order).
 *
 * Tiles: C00 C01 C10 C11 (tmm0-3: two 16-row weight tiles x two 16-token
 * groups), A0 A1 (tmm4-5: 32 weight rows x 32 k), B0 B1 (tmm6-7: the two
 * groups' hi, then lo, pairs). A step loads 2 KiB of weights and 4 KiB of
 * packed activations for 8 TDPBF16PS; the weights stream from memory once
 * per task, the pack of a task's tokens stays in L2.
 *
 * F8 strips are widened to BF16 in the workspace once per task (exact: E4M3
 * has 4 significant bits; a task of up to four strips keeps them for its 256
 * tokens), so the tiles see the same values as for BF16; the 128x128 block
 * scale is applied to each block's partial sums (an fma per element and
 * block), which keeps the weight exact.
 *
 * Linux hands out the 8 KiB of tile state only to a process that asks
 * (arch_prctl ARCH_REQ_XCOMP_PERM); moeq_amx_supported() asks once. Each call
 * loads its tile configuration and releases the tiles at the end, so a thread
 * that is preempted between calls has no tile state to save.
 */
#include "ops_amx.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amx_inline.h"
#include "tensor.h"

#ifdef MOEQ_AMX_X86
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define TROWS 16
#define F8B MOEQ_F8_BLOCK
#define STRIP 32 /* weight rows per pass: two A tiles */

/* An F8 block of up to CACHE_STRIPS strips and many tokens keeps its widened strips while it walks its tokens
 * SUB_TOKS at a time (moeq_amx_nt_block), when they fit in CACHE_BYTES: with a sub-block's pack they stay in L2
 * (2 MiB on every AMX core so far). */
#define CACHE_STRIPS 4
#define CACHE_BYTES (640 << 10)
#define SUB_TOKS 64

static int64_t strip_bytes(int64_t K) { return (int64_t)STRIP * (K * 2 + 64); }
static int cache_fits(int64_t K) { return strip_bytes(K) * CACHE_STRIPS <= CACHE_BYTES; }
/* The workspace's strip region: the strip, or the cached ones; at least CACHE_BYTES, so that it never shrinks as K
 * grows (the backend sizes the workspace from its largest K) and holds the F8 step buffer. */
static size_t strips_region(int64_t K) {
    return strip_bytes(K) > CACHE_BYTES ? (size_t)strip_bytes(K) : (size_t)CACHE_BYTES;
}

static char amx_text[160];

int moeq_amx_fits(const moeq_tensor *w) {
    return w && (w->dtype == MOEQ_DTYPE_BF16 || w->dtype == MOEQ_DTYPE_F8_E4M3) && w->ndim == 2 &&
           moeq_tensor_cols(w) % MOEQ_AMX_STEP == 0 && moeq_tensor_cols(w) > 0;
}

int64_t moeq_amx_pack_cols(int64_t n) {
    if (n < 16) return n; /* decode: the pack stays in L1 (tile rows overlap; 64 bytes of slack at the end) */
    int64_t c = (n + 15 + 15) / 16 * 16;
    return (c / 16) % 2 ? c : c + 16;
}

int64_t moeq_amx_pack_groups(int64_t n) { return (n + 15) / 16; }

size_t moeq_amx_pack_bytes(int64_t n, int64_t K) {
    return (size_t)(K / MOEQ_AMX_STEP) * 2 * TROWS * (size_t)moeq_amx_pack_cols(n) * 4 + 64;
}

size_t moeq_amx_panel_bytes(int64_t n, int64_t K) {
    return (size_t)moeq_amx_pack_groups(n) * (size_t)(K / MOEQ_AMX_STEP) * 2 * 1024 + 64;
}

size_t moeq_amx_ws_bytes(int64_t K) {
    /* the strip (32 rows, stride K*2 + 64 against cache-set aliasing; at least the F8 step buffer) or the cached
     * strips, the F8 sums, four C tiles, and a compact copy of up to 16 tokens' pack */
    return strips_region(K) + 4 * 1024 + 4 * 1024 + (size_t)K * 64 + 128;
}

int64_t moeq_amx_block_tokens(const moeq_tensor *w) {
    return w->dtype == MOEQ_DTYPE_F8_E4M3 && cache_fits(moeq_tensor_cols(w)) ? CACHE_STRIPS * SUB_TOKS : SUB_TOKS;
}

/* ---- the emulation's scalar pieces ------------------------------------------------------------------ */

/* The weight's value as BF16 bits (exact for both dtypes). */
static uint16_t weight_bf16(const moeq_tensor *w, int64_t row, int64_t k) {
    int64_t K = moeq_tensor_cols(w);
    if (w->dtype == MOEQ_DTYPE_BF16) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)w->data + ((size_t)row * (size_t)K + (size_t)k) * 2, 2);
        return h;
    }
    float v = moeq_f8_e4m3_to_f32(((const uint8_t *)w->data)[(size_t)row * (size_t)K + (size_t)k]);
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)(u >> 16); /* exact: E4M3 has 4 significant bits, NaN stays NaN */
}

static float f8_scale(const moeq_tensor *w, int64_t row, int64_t kb) {
    if (!w->scale_inv) return 1.0f;
    int64_t ncb = (moeq_tensor_cols(w) + F8B - 1) / F8B;
    return ((const float *)w->scale_inv->data)[(row / F8B) * ncb + kb];
}

#ifdef MOEQ_AMX_X86

#define ALWAYS_INLINE AMX_ALWAYS_INLINE
#define full_config moeq_amx_full_config

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int detect(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) {
        snprintf(amx_text, sizeof amx_text, "no amx_bf16");
        return 0;
    }
    unsigned a1 = 0, b1, c1, d1;
    int bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 5));
    if (!bf16 || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
        snprintf(amx_text, sizeof amx_text, "amx_bf16 without avx512_bf16 (unused)");
        return 0;
    }
    if (!__builtin_cpu_supports("avx512vbmi")) { /* every AMX CPU so far has it; a VM may hide it */
        snprintf(amx_text, sizeof amx_text, "amx_bf16 without avx512_vbmi (unused: the F8 widening needs it)");
        return 0;
    }
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        snprintf(amx_text, sizeof amx_text, "amx_bf16, but Linux refused the tile state (arch_prctl; kernel < 5.16?)");
        return 0;
    }
    snprintf(amx_text, sizeof amx_text, "amx_bf16 tiles");
    return 1;
}

static void f8_lut_init(void);

static int amx_state; /* 1 when the tiles can run here; set once */
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static void amx_detect_once(void) {
    amx_state = detect();
    if (amx_state) f8_lut_init();
}

int moeq_amx_supported(void) {
    pthread_once(&amx_once, amx_detect_once);
    return amx_state;
}

/* Step s of rows [16 g, 16 g + 16) of x (rows >= n zero), split and transposed: hi[k2], lo[k2] hold pair row
 * k2 of the step's 16 columns. */
static TAMX ALWAYS_INLINE void split_step16(const float *x, int64_t ldx, int64_t n, int64_t g, int64_t s,
                                            __m512i hi[16], __m512i lo[16]) {
    for (int r = 0; r < 16; r++) {
        int64_t row = g * 16 + r;
        if (row >= n) {
            hi[r] = lo[r] = _mm512_setzero_si512();
            continue;
        }
        const float *p = x + row * ldx + s * MOEQ_AMX_STEP;
        __m512 x0 = _mm512_loadu_ps(p), x1 = _mm512_loadu_ps(p + 16);
        __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
        __m512 l0 = _mm512_sub_ps(x0, moeq_bf16_lo_f32(h)), l1 = _mm512_sub_ps(x1, moeq_bf16_hi_f32(h));
        hi[r] = h;
        lo[r] = (__m512i)_mm512_cvtne2ps_pbh(l1, l0);
    }
    moeq_transpose16(hi);
    moeq_transpose16(lo);
}

TAMX void moeq_amx_pack_group(const float *x, int64_t ldx, int64_t n, int64_t K, uint32_t *pack, int64_t g) {
    int64_t n_pad = moeq_amx_pack_cols(n), steps = K / MOEQ_AMX_STEP;
    const __mmask16 cols = n_pad - 16 * g >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n_pad - 16 * g)) - 1u);
    for (int64_t s = 0; s < steps; s++) {
        __m512i hi[16], lo[16];
        split_step16(x, ldx, n, g, s, hi, lo);
        uint32_t *dh = pack + (s * 2 + 0) * TROWS * n_pad + g * 16, *dl = pack + (s * 2 + 1) * TROWS * n_pad + g * 16;
        for (int k2 = 0; k2 < 16; k2++) { /* n_pad < 16: only the columns there are (rows overlap) */
            _mm512_mask_storeu_epi32(dh + k2 * n_pad, cols, hi[k2]);
            _mm512_mask_storeu_epi32(dl + k2 * n_pad, cols, lo[k2]);
        }
    }
}

TAMX void moeq_amx_pack_panel(const float *x, int64_t ldx, int64_t n, int64_t K, uint32_t *pack, int64_t g) {
    const int64_t steps = K / MOEQ_AMX_STEP;
    uint32_t *panel = pack + g * steps * 2 * 256;
    for (int64_t s = 0; s < steps; s++) {
        __m512i hi[16], lo[16];
        split_step16(x, ldx, n, g, s, hi, lo);
        uint32_t *dh = panel + (s * 2 + 0) * 256, *dl = panel + (s * 2 + 1) * 256;
        for (int k2 = 0; k2 < 16; k2++) {
            _mm512_store_si512(dh + k2 * 16, hi[k2]);
            _mm512_store_si512(dl + k2 * 16, lo[k2]);
        }
    }
}

/*
 * E4M3 -> BF16 by byte tables: VPERMI2B picks a byte of two 64-byte tables by the low 7 bits of the index,
 * so one lookup gives each value's low BF16 byte and one its high byte (the sign ORed in after), and VPERMT2B
 * interleaves them: three shuffles for 32 values, four for 64, where the arithmetic conversion (shift, rebias,
 * subnormals from a table, NaN) took fourteen instructions for 32. In a decode step the widening is what the tiles
 * wait on. The tables come from moeq_f8_e4m3_to_f32 (exact: E4M3 has 4 significant bits); 0x7f stays NaN.
 */
static uint8_t f8_lut[2][128] __attribute__((aligned(64))); /* [0] low, [1] high bytes of |x|'s BF16 bits */

static void f8_lut_init(void) {
    for (int m = 0; m < 128; m++) {
        float v = moeq_f8_e4m3_to_f32((uint8_t)m);
        uint32_t u;
        memcpy(&u, &v, 4);
        uint16_t h = m == 0x7f ? 0x7fc0 : (uint16_t)(u >> 16);
        f8_lut[0][m] = (uint8_t)h, f8_lut[1][m] = (uint8_t)(h >> 8);
    }
}

typedef struct f8_tables {
    __m512i lo0, lo1, hi0, hi1, sign, first, second; /* first/second: interleave values 0-31 / 32-63 */
} f8_tables;

static TAMX ALWAYS_INLINE f8_tables f8_tables_load(void) {
    uint8_t first[64], second[64];
    for (int i = 0; i < 32; i++) first[2 * i] = (uint8_t)i, first[2 * i + 1] = (uint8_t)(64 + i);
    for (int i = 0; i < 64; i++) second[i] = (uint8_t)(first[i] + 32);
    return (f8_tables){_mm512_load_si512(f8_lut[0]),         _mm512_load_si512(f8_lut[0] + 64),
                       _mm512_load_si512(f8_lut[1]),         _mm512_load_si512(f8_lut[1] + 64),
                       _mm512_set1_epi8((char)0x80),          _mm512_loadu_si512(first),
                       _mm512_loadu_si512(second)};
}

/* The low and high BF16 bytes of 64 E4M3 values x (high with the sign: hi | (x & 0x80)). */
static TAMX ALWAYS_INLINE void f8_bytes(const f8_tables *t, __m512i x, __m512i *lo, __m512i *hi) {
    *lo = _mm512_permutex2var_epi8(t->lo0, x, t->lo1);
    *hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t->hi0, x, t->hi1), x, t->sign, 0xf8);
}

/* 32 E4M3 bytes -> 32 BF16 values. */
static TAMX ALWAYS_INLINE __m512i f8_to_bf16_32(const f8_tables *t, const uint8_t *p) {
    __m512i lo, hi;
    f8_bytes(t, _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)p)), &lo, &hi);
    return _mm512_permutex2var_epi8(lo, t->first, hi);
}

/* 64 E4M3 bytes -> 64 BF16 values: the first 32 at d0, the next 32 at d1. */
static TAMX ALWAYS_INLINE void f8_to_bf16_64(const f8_tables *t, const uint8_t *p, void *d0, void *d1) {
    __m512i lo, hi;
    f8_bytes(t, _mm512_loadu_si512(p), &lo, &hi);
    _mm512_storeu_si512(d0, _mm512_permutex2var_epi8(lo, t->first, hi));
    _mm512_storeu_si512(d1, _mm512_permutex2var_epi8(lo, t->second, hi));
}

TAMX void moeq_amx_widen_f8(const uint8_t *in, uint16_t *out, size_t n) {
    const f8_tables t = f8_tables_load();
    size_t i = 0;
    for (; i + 64 <= n; i += 64) f8_to_bf16_64(&t, in + i, out + i, out + i + 32);
    if (i < n) { /* the tail through a zero-padded block */
        uint8_t b[64] = {0};
        uint16_t o[64];
        memcpy(b, in + i, n - i);
        f8_to_bf16_64(&t, b, o, o + 32);
        memcpy(out + i, o, (n - i) * 2);
    }
}

/* Where a task's B tiles are: the (step, part) s * 2 + p of token group g (0, 1) at b + (s * 2 + p) * part +
 * g * gs, its 16 pair rows ldb bytes apart (the row layout: part = 16 n_pad, gs = 16, ldb = 4 n_pad; panels:
 * part = 256, gs = a panel, ldb = 64). */
typedef struct bsrc {
    const uint32_t *b;
    int64_t part, gs, ldb;
} bsrc;

/* C tile c into drain[c * 256] and zeroed, unless drain is NULL. */
static TAMX ALWAYS_INLINE void drain_c(int c, float *drain) {
    if (drain) {
        moeq_amx_store_c(c, drain + c * 256, 64);
        switch (c) {
        case 0: _tile_zero(0); break;
        case 1: _tile_zero(1); break;
        case 2: _tile_zero(2); break;
        default: _tile_zero(3); break;
        }
    }
}

/*
 * Step s's products with the A tiles loaded (tmm4-5): the hi pairs, then the lo pairs, of NG token groups. With
 * drain, each C tile is stored there and zeroed just before its first product of the step (an F8 scale block's
 * start): the tiles' unit runs in order, so storing all four first left it idle until the last one's chain was done.
 */
static TAMX ALWAYS_INLINE void step_tiles(const int NR, const int NG, const bsrc *src, int64_t s, float *drain) {
    for (int p = 0; p < 2; p++) {
        const uint32_t *bp = src->b + (s * 2 + p) * src->part;
        float *d = p == 0 ? drain : NULL;
        _tile_loadd(6, bp, src->ldb);
        if (NG == 2) _tile_loadd(7, bp + src->gs, src->ldb);
        drain_c(0, d);
        _tile_dpbf16ps(0, 4, 6);
        if (NG == 2) {
            drain_c(1, d);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (NR == 2) {
            drain_c(2, d);
            _tile_dpbf16ps(2, 5, 6);
        }
        if (NR == 2 && NG == 2) {
            drain_c(3, d);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
}

/* Step s with its A tiles loaded from a (32 weight rows, lda bytes apart). */
static TAMX ALWAYS_INLINE void step_from(const int NR, const int NG, const uint8_t *a, int64_t lda, const bsrc *src,
                                         int64_t s, float *drain) {
    _tile_loadd(4, a, lda);
    if (NR == 2) _tile_loadd(5, a + 16 * lda, lda);
    step_tiles(NR, NG, src, s, drain);
}

/*
 * An F8 pass's scale blocks run as one chain: the first step of block kb stores the C tiles of block kb - 1 into buf
 * (step_tiles' drain), and right after that step's products are issued, the vector unit folds them into acc, scaled
 * by block kb - 1's scale, while the tiles go on. Each block's sums start from zero and acc gathers the blocks in
 * order, as in the emulation.
 */
typedef struct f8_fold {
    const moeq_tensor *w;
    int64_t grow, rs, kb; /* kb: the block being folded */
    int rows, nr, ng;
    float *buf, *acc;     /* the four drained tiles; their sums so far, tile c at acc + c * 256 */
} f8_fold;

static TAMX void fold_tiles(const f8_fold *f) {
    for (int i = 0; i < f->nr; i++) {
        /* a tile's 16 rows share one scale when they sit in one 128-row block (rows past the strip's hold zeros, and
         * their results are never written) */
        const int64_t r0 = f->grow + 16 * i * f->rs;
        const int one = f->rs == 1 && r0 / F8B == (r0 + 15) / F8B;
        const __m512 f1 = _mm512_set1_ps(one ? f8_scale(f->w, r0, f->kb) : 0.0f);
        for (int g = 0; g < f->ng; g++) {
            const float *c = f->buf + (2 * i + g) * 256;
            float *ac = f->acc + (2 * i + g) * 256;
            for (int r = 0; r < 16; r++) {
                __m512 sc = one ? f1
                                : _mm512_set1_ps(r < f->rows - 16 * i ? f8_scale(f->w, f->grow + (16 * i + r) * f->rs,
                                                                                  f->kb)
                                                                      : 0.0f);
                _mm512_storeu_ps(ac + 16 * r,
                                 _mm512_fmadd_ps(sc, _mm512_loadu_ps(c + 16 * r), _mm512_loadu_ps(ac + 16 * r)));
            }
        }
    }
}

/* Step s from a; with fd (s the first step of a scale block after the first), the drain and fold of fd's block. */
static TAMX ALWAYS_INLINE void step_fold(const int NR, const int NG, const uint8_t *a, int64_t lda, const bsrc *src,
                                         int64_t s, const f8_fold *fd) {
    step_from(NR, NG, a, lda, src, s, fd ? fd->buf : NULL);
    if (fd) fold_tiles(fd);
}

static TAMX void out_tile(const moeq_mm_job *job, const float *c, int64_t t, int64_t n, int64_t rs, int rows, int nt,
                          int i, int g);

/*
 * A pass's C tiles waiting to be written out. Writing a tile out (a 16 x 16 transpose into y) is vector work the
 * tiles would wait for; the next chain does it instead, one tile a step after that step's products are issued,
 * so it runs beside them. The tiles' values are stored when their pass ends, so the output is the same.
 */
typedef struct pending_out {
    float *buf; /* the four tiles, 2 i + g at buf + (2 i + g) * 256 */
    const moeq_mm_job *job;
    int64_t t, n, rs;
    int rows, nt, nr, ng, left; /* left: tiles not yet written, the last `left` of nr x ng */
} pending_out;

static TAMX void pending_one(pending_out *p) {
    const int k = p->nr * p->ng - p->left, i = k / p->ng, g = k % p->ng;
    out_tile(p->job, p->buf + (2 * i + g) * 256, p->t, p->n, p->rs, p->rows, p->nt, i, g);
    p->left--;
}

static TAMX void pending_flush(pending_out *p) {
    while (p->left > 0) pending_one(p);
}

/* The next strip's weight rows, for a pass to fetch into L2 (see strip_pass): STRIP rows of `bytes`, ld apart, from
 * rows (NULL: none); the next block's first strip (moeq_amx_then) is one too. A prefetch never faults, so rows past a
 * tensor's end are harmless. */
typedef moeq_amx_then next_strip;

/* Line s of each of next's rows into L2 (none past their end). */
static TAMX ALWAYS_INLINE void fetch_next(const next_strip *next, int64_t s) {
    if (next->rows && s * 64 < next->bytes)
        for (int r = 0; r < STRIP; r++)
            _mm_prefetch((const char *)next->rows + r * next->ld + s * 64, _MM_HINT_T1);
}

/* The chain over steps [s0, s1) into C tiles (not zeroed here); NR weight tiles, NG token groups. Step s fetches line
 * s of each of next's rows into L2. */
static TAMX ALWAYS_INLINE void chain(const int NR, const int NG, const uint8_t *a, int64_t lda, const next_strip *next,
                                     pending_out *pd, const f8_fold *fd, const bsrc *src, int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; s++) {
        if (NG == 1) /* few tokens: the weights' 32 row streams, four lines ahead (decode b1 ~1.04x) */
            for (int r = 0; r < NR * 16; r++) _mm_prefetch((const char *)(a + r * lda + (s + 4) * 64), _MM_HINT_T0);
        else fetch_next(next, s);
        step_fold(NR, NG, a + s * 64, lda, src, s, s == s0 ? fd : NULL);
        if (pd && pd->left > 0) pending_one(pd);
    }
}

/* The same chain for an F8 strip read by one token pass (decode): the weights are widened into buf (4 KiB, L1)
 * just before its tiles load them, two steps at a time, so each strip row is read as whole 64-byte lines
 * (one step's 32 bytes per row left the loads waiting on memory). Loads of a strip widened whole come from
 * L2, and tile loads from L2 run at about half the rate of L1's. */
static TAMX ALWAYS_INLINE void chain_f8(const int NR, const int NG, const uint8_t *w8, int64_t ldw, int rows,
                                        uint8_t *buf, const next_strip *next, const f8_fold *fd, const bsrc *src,
                                        int64_t s0, int64_t s1) {
    const f8_tables t = f8_tables_load();
    int64_t s = s0;
    for (; s + 2 <= s1; s += 2) { /* ldw: bytes from one strip row to the next; step s at buf, s + 1 at buf + 2 KiB */
        for (int r = 0; r < rows; r++) {
            /* four lines ahead in each of the 32 rows (stretches): the hardware prefetcher loses most of them
             * (bench-engine F8 decode b1 1.17x, b32 1.22x; a prefetch past a row's end is harmless) */
            _mm_prefetch((const char *)(w8 + r * ldw + (s + 8) * MOEQ_AMX_STEP), _MM_HINT_T0);
            f8_to_bf16_64(&t, w8 + r * ldw + s * MOEQ_AMX_STEP, buf + r * 64, buf + 2048 + r * 64);
        }
        fetch_next(next, s);
        fetch_next(next, s + 1);
        step_fold(NR, NG, buf, 64, src, s, s == s0 ? fd : NULL);
        step_from(NR, NG, buf + 2048, 64, src, s + 1, NULL);
    }
    if (s < s1) { /* an odd last step (K not a multiple of 64) */
        for (int r = 0; r < rows; r++)
            _mm512_storeu_si512(buf + r * 64, f8_to_bf16_32(&t, w8 + r * ldw + s * MOEQ_AMX_STEP));
        step_fold(NR, NG, buf, 64, src, s, s == s0 ? fd : NULL);
    }
}

/*
 * The first of several passes over an F8 strip (prefill): each pair of steps is widened into the strip copy (rows
 * lds apart) one pair ahead of its products, so the widening runs beside the products of the pair before (widening
 * the whole strip first left the tiles idle while it waited on memory); the passes after it read the copy. Steps
 * [s0, s1) of a scale block; s0 is even.
 */
static TAMX ALWAYS_INLINE void widen_pair(const f8_tables *t, const uint8_t *w8, int64_t ldw, int rows, uint8_t *strip,
                                          int64_t lds, int64_t s, int64_t s1) {
    if (s + 2 <= s1)
        for (int r = 0; r < rows; r++)
            f8_to_bf16_64(t, w8 + r * ldw + s * MOEQ_AMX_STEP, strip + r * lds + s * 64,
                          strip + r * lds + (s + 1) * 64);
    else
        for (int r = 0; r < rows; r++)
            _mm512_storeu_si512(strip + r * lds + s * 64, f8_to_bf16_32(t, w8 + r * ldw + s * MOEQ_AMX_STEP));
}

static TAMX ALWAYS_INLINE void chain_f8_first(const int NR, const int NG, const uint8_t *w8, int64_t ldw, int rows,
                                              uint8_t *strip, int64_t lds, const next_strip *next, const f8_fold *fd,
                                              const bsrc *src, int64_t s0, int64_t s1) {
    const f8_tables t = f8_tables_load();
    widen_pair(&t, w8, ldw, rows, strip, lds, s0, s1);
    for (int64_t s = s0; s < s1; s += 2) {
        if (s + 2 < s1) widen_pair(&t, w8, ldw, rows, strip, lds, s + 2, s1);
        for (int64_t q = s; q < s + 2 && q < s1; q++) {
            fetch_next(next, q);
            step_fold(NR, NG, strip + q * 64, lds, src, q, q == s0 ? fd : NULL);
        }
    }
}

static TAMX void chain_f8_first_any(int nr, int ng, const uint8_t *w8, int64_t ldw, int rows, uint8_t *strip,
                                    int64_t lds, const next_strip *next, const f8_fold *fd, const bsrc *src, int64_t s0,
                                    int64_t s1) {
    if (nr == 2 && ng == 2) chain_f8_first(2, 2, w8, ldw, rows, strip, lds, next, fd, src, s0, s1);
    else if (nr == 2) chain_f8_first(2, 1, w8, ldw, rows, strip, lds, next, fd, src, s0, s1);
    else if (ng == 2) chain_f8_first(1, 2, w8, ldw, rows, strip, lds, next, fd, src, s0, s1);
    else chain_f8_first(1, 1, w8, ldw, rows, strip, lds, next, fd, src, s0, s1);
}

static TAMX void chain_f8_any(int nr, int ng, const uint8_t *w8, int64_t ldw, int rows, uint8_t *buf,
                              const next_strip *next, const f8_fold *fd, const bsrc *src, int64_t s0, int64_t s1) {
    if (nr == 2 && ng == 2) chain_f8(2, 2, w8, ldw, rows, buf, next, fd, src, s0, s1);
    else if (nr == 2) chain_f8(2, 1, w8, ldw, rows, buf, next, fd, src, s0, s1);
    else if (ng == 2) chain_f8(1, 2, w8, ldw, rows, buf, next, fd, src, s0, s1);
    else chain_f8(1, 1, w8, ldw, rows, buf, next, fd, src, s0, s1);
}

static TAMX void chain_any(int nr, int ng, const uint8_t *a, int64_t lda, const next_strip *next, pending_out *pd,
                           const f8_fold *fd, const bsrc *src, int64_t s0, int64_t s1) {
    if (nr == 2 && ng == 2) chain(2, 2, a, lda, next, pd, fd, src, s0, s1);
    else if (nr == 2) chain(2, 1, a, lda, next, pd, fd, src, s0, s1);
    else if (ng == 2) chain(1, 2, a, lda, next, pd, fd, src, s0, s1);
    else chain(1, 1, a, lda, next, pd, fd, src, s0, s1);
}

/* c (16 weight rows x 16 tokens) transposed into y: tokens [0, nt) of rows [0, nr), row r at y[r * rs]. */
static TAMX void write_out(const float *c, float *y, int64_t ldy, int nr, int nt, int64_t rs) {
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(c + 16 * i);
    moeq_transpose16(r);
    __mmask16 m = (__mmask16)((1u << nr) - 1u);
    if (rs == 1) {
        for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + t * ldy, m, _mm512_castsi512_ps(r[t]));
        return;
    }
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32((int)rs));
    for (int t = 0; t < nt; t++) _mm512_mask_i32scatter_ps(y + t * ldy, m, idx, _mm512_castsi512_ps(r[t]), 4);
}

/* Tile (i, g) of a strip's results, c, into y: weight rows 16 i.. of the strip, tokens t + 16 g.. . */
static TAMX void out_tile(const moeq_mm_job *job, const float *c, int64_t t, int64_t n, int64_t rs, int rows, int nt,
                          int i, int g) {
    int rr = rows - 16 * i < 16 ? rows - 16 * i : 16, tt = nt - 16 * g < 16 ? nt - 16 * g : 16;
    write_out(c, job->y + (t + 16 * g) * job->ldy + n + 16 * i * rs, job->ldy, rr, tt, rs);
}

typedef struct amx_scratch {
    uint8_t *strip;   /* STRIP rows of K bf16 at stride lds (F8 widened, or a padded copy) */
    int64_t lds;
    uint8_t *stepbuf; /* the F8 step buffer (two steps) */
    float *c4, *acc;  /* four C tiles (BF16: a pass's, pending; F8: a block's, drained); F8 sums (4 tiles) */
    pending_out *pd;  /* BF16 passes' C tiles, written out during the next chain */
} amx_scratch;

/*
 * One strip: output rows n + r * rs of the job (r < rows <= 32), i.e. weight rows row0 + n + r * rs, for
 * tokens [t0, t1). rs > 1 are the decode stretches (see moeq_amx_nt_block). widened: an F8 strip's copy in
 * sc->strip holds it already (an earlier sub-block widened it).
 */
static TAMX void strip_pass(const moeq_mm_job *job, const moeq_amx_xview *xv, int64_t n, int64_t rs, int rows,
                            int64_t t0, int64_t t1, int last, const next_strip *then, int widened,
                            const amx_scratch *sc) {
    const moeq_tensor *w = job->w;
    const int64_t K = moeq_tensor_cols(w), steps = K / MOEQ_AMX_STEP, total_rows = w->shape[0];
    const int f8 = w->dtype == MOEQ_DTYPE_F8_E4M3, nr = rows > 16 ? 2 : 1;
    const int64_t grow = job->row0 + n; /* the weight's own row */
    const uint8_t *a = NULL;
    int64_t lda = 0;
    const int f8_steps = f8 && t1 - t0 <= 32 && !widened; /* one token pass: widen step by step */
    if (f8_steps) {
        memset(sc->stepbuf, 0, 4096); /* rows past the strip's stay zero */
    } else if (f8) { /* rs == 1 here: stretches are for decode; the first pass widens the strip (chain_f8_first) */
        if (!widened)
            for (int r = rows; r < STRIP; r++) memset(sc->strip + r * sc->lds, 0, (size_t)K * 2);
        a = sc->strip, lda = sc->lds;
    } else if (grow + (nr * 16 - 1) * rs >= total_rows) { /* the tile would read past the tensor: a padded copy */
        for (int r = 0; r < STRIP; r++) {
            if (r < rows)
                memcpy(sc->strip + r * sc->lds, (const uint8_t *)w->data + (size_t)(grow + r * rs) * (size_t)K * 2,
                       (size_t)K * 2);
            else memset(sc->strip + r * sc->lds, 0, (size_t)K * 2);
        }
        a = sc->strip, lda = sc->lds;
    } else {
        a = (const uint8_t *)w->data + (size_t)grow * (size_t)K * 2, lda = rs * K * 2;
    }
    /* A strip's first pass with 17 tokens or more (prefill, batched decode) reads the weights from memory: BF16 tile
     * loads that miss stall the products behind them (tiles are not renamed, so the next step's loads cannot run
     * ahead), and an F8 strip is widened before its products. That pass fetches the next strip's rows into L2
     * beside its own steps, 32 lines a step: the block's next strip, or for its final strip the first strip of the
     * thread's next block (then), so no strip but a dispatch's first few starts from memory. F8 strips of 17-32
     * tokens, widened step by step in one pass, fetch too (bench-engine F8 batch 128 1.03-1.04x). */
    next_strip next = {0};
    if (rs == 1 && t1 - t0 > 16) {
        const uint8_t *w0 = (const uint8_t *)w->data;
        if (!last && !widened)
            next = f8 ? (next_strip){w0 + (size_t)(grow + STRIP) * (size_t)K, K, K}
                      : (next_strip){w0 + (size_t)(grow + STRIP) * (size_t)K * 2, K * 2, K * 2};
        else if (then) next = *then;
    }
    const next_strip none = {0};
    for (int64_t t = t0; t < t1; t += 32) {
        const int nt = (int)(t1 - t < 32 ? t1 - t : 32), ng = nt > 16 ? 2 : 1;
        bsrc src;
        if (xv->panels) /* tok0 + t is a multiple of 16 here (moeq_amx_xview) */
            src = (bsrc){xv->pack + (xv->tok0 + t) / 16 * (steps * 2 * 256), 256, steps * 2 * 256, 64};
        else /* tok0 < 0 for a compact copy */
            src = (bsrc){xv->pack + (xv->tok0 + t), TROWS * xv->n_pad, 16, xv->n_pad * 4};
        if (!f8) {
            moeq_amx_zero_c4();
            chain_any(nr, ng, a, lda, t == t0 ? &next : &none, sc->pd, NULL, &src, 0, steps);
            pending_out *pd = sc->pd;
            pending_flush(pd); /* a chain shorter than the tiles left */
            for (int i = 0; i < nr; i++)
                for (int g = 0; g < ng; g++) moeq_amx_store_c(2 * i + g, pd->buf + (2 * i + g) * 256, 64);
            pd->job = job, pd->t = t, pd->n = n, pd->rs = rs, pd->rows = rows, pd->nt = nt, pd->nr = nr, pd->ng = ng;
            pd->left = nr * ng;
            continue;
        }
        memset(sc->acc, 0, 4 * 256 * sizeof(float));
        f8_fold fold = {w, grow, rs, 0, rows, nr, ng, sc->c4, sc->acc};
        const uint8_t *w8 = (const uint8_t *)w->data + (size_t)grow * (size_t)K;
        moeq_amx_zero_c4();
        for (int64_t s = 0, kb = 0; s < steps; s += F8B / MOEQ_AMX_STEP, kb++) {
            const int64_t s1 = s + F8B / MOEQ_AMX_STEP < steps ? s + F8B / MOEQ_AMX_STEP : steps;
            fold.kb = kb - 1;
            const f8_fold *fd = kb > 0 ? &fold : NULL;
            if (f8_steps) chain_f8_any(nr, ng, w8, rs * K, rows, sc->stepbuf, &next, fd, &src, s, s1);
            else if (t == t0 && !widened)
                chain_f8_first_any(nr, ng, w8, K, rows, sc->strip, sc->lds, &next, fd, &src, s, s1);
            else chain_any(nr, ng, a, lda, t == t0 ? &next : &none, NULL, fd, &src, s, s1);
        }
        for (int i = 0; i < nr; i++)
            for (int g = 0; g < ng; g++) moeq_amx_store_c(2 * i + g, sc->c4 + (2 * i + g) * 256, 64);
        fold.kb = (steps - 1) / (F8B / MOEQ_AMX_STEP);
        fold_tiles(&fold);
        for (int i = 0; i < nr; i++)
            for (int g = 0; g < ng; g++) out_tile(job, sc->acc + (2 * i + g) * 256, t, n, rs, rows, nt, i, g);
    }
}

/*
 * Blocks of at most 16 tokens (decode) whose block holds at least STREAM_MIN_SPAN x 32 rows take each
 * strip's 32 rows one from each of 32 stretches of the block: row n0 + j * span + i for tile row j of
 * strip i, so every tile row continues one long sequential run of the weight (the next row of its
 * stretch); adjacent-row strips read 32 runs of one row each, restarting every strip, which the hardware
 * prefetcher follows worse. The rows the stretches leave over take adjacent-row strips. Which rows share
 * a strip changes no element's chain.
 */
#define STREAM_TOKS 16
#define STREAM_MIN_SPAN 4

TAMX void moeq_amx_nt_block(const moeq_mm_job *job, const moeq_amx_xview *xv, int64_t n0, int64_t n1, int64_t t0,
                            int64_t t1, const moeq_amx_then *then, void *ws, size_t ws_bytes) {
    const int64_t K = moeq_tensor_cols(job->w), steps = K / MOEQ_AMX_STEP;
    if (n0 >= n1 || t0 >= t1) return;
    if (ws_bytes < moeq_amx_ws_bytes(K)) abort(); /* the backend sizes it from max_k */
    if (xv->panels && (xv->tok0 + t0) % 16) abort(); /* a panel's tokens start at multiples of 16 */
    amx_scratch sc = {.strip = ws, .lds = K * 2 + 64, .stepbuf = ws};
    sc.acc = (float *)(sc.strip + strips_region(K));
    sc.c4 = sc.acc + 4 * 256;
    pending_out pd = {.buf = sc.c4};
    sc.pd = &pd;
    /* A block of at most 16 tokens reading a wide pack (the experts' slices of one gathered array) takes
     * its columns into a compact copy first: its B tiles then come from L1, not from L2. */
    moeq_amx_xview local = *xv;
    if (t1 - t0 <= 16 && !xv->panels && xv->n_pad > 16) {
        uint32_t *compact = (uint32_t *)(sc.c4 + 4 * 256);
        const int64_t nt = t1 - t0;
        const __mmask16 m = (__mmask16)((1u << nt) - 1u);
        const uint32_t *src = xv->pack + xv->tok0 + t0;
        for (int64_t row = 0; row < steps * 2 * TROWS; row++)
            _mm512_mask_storeu_epi32(compact + row * nt, m, _mm512_maskz_loadu_epi32(m, src + row * xv->n_pad));
        local = (moeq_amx_xview){compact, nt, -t0, 0};
        xv = &local;
    }
    _tile_loadconfig(&full_config);
    int64_t n = n0, span = (n1 - n0) / STRIP;
    if (t1 - t0 <= STREAM_TOKS && span >= STREAM_MIN_SPAN) {
        for (int64_t i = 0; i < span; i++) strip_pass(job, xv, n0 + i, span, STRIP, t0, t1, 1, NULL, 0, &sc);
        n = n0 + span * STRIP;
    }
    if (job->w->dtype == MOEQ_DTYPE_F8_E4M3 && t1 - t0 > 32 && n1 - n0 <= CACHE_STRIPS * STRIP && cache_fits(K)) {
        /* Widening an F8 strip costs its first pass more than the weights' memory does (the vector unit's byte
         * shuffles; bench-engine F8 prefill 2,048 ran 1.15x faster without it, results aside). So a block of many
         * tokens widens each strip once, in the first sub-block, and walks its tokens SUB_TOKS at a time over the
         * kept copies; the passes over a sub-block read its slice of the pack from L2, as for a block of SUB_TOKS.
         * The copies hold the values a strip's own widening gives, so each element's chain is the same. */
        uint8_t *cache = ws;
        for (int64_t u = t0; u < t1; u += SUB_TOKS) {
            const int64_t u1 = u + SUB_TOKS < t1 ? u + SUB_TOKS : t1;
            for (int64_t i = 0; n + i * STRIP < n1; i++) {
                const int64_t ni = n + i * STRIP;
                sc.strip = cache + i * strip_bytes(K);
                strip_pass(job, xv, ni, 1, (int)(n1 - ni < STRIP ? n1 - ni : STRIP), u, u1, ni + 2 * STRIP > n1,
                           ni + STRIP >= n1 && u1 == t1 ? then : NULL, u > t0, &sc);
            }
        }
    } else {
        for (; n < n1; n += STRIP)
            strip_pass(job, xv, n, 1, (int)(n1 - n < STRIP ? n1 - n : STRIP), t0, t1, n + 2 * STRIP > n1,
                       n + STRIP >= n1 ? then : NULL, 0, &sc);
    }
    pending_flush(&pd);
    _tile_release();
}

/* One element's chain on one tile: row 0 of A is the weight's step, column 0 of B the activation's. */
TAMX void moeq_amx_nt_block_ref(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1) {
    const moeq_tensor *w = job->w;
    const int64_t K = moeq_tensor_cols(w), steps = K / MOEQ_AMX_STEP, per_block = F8B / MOEQ_AMX_STEP;
    const int f8 = w->dtype == MOEQ_DTYPE_F8_E4M3;
    static _Thread_local uint16_t A[16 * 32], B[2][16 * 32];
    static _Thread_local float C[256];
    _tile_loadconfig(&full_config);
    for (int64_t n = n0; n < n1; n++)
        for (int64_t t = t0; t < t1; t++) {
            const float *x = job->x + t * job->ldx;
            float y = 0.0f;
            memset(A, 0, sizeof A), memset(B, 0, sizeof B), memset(C, 0, sizeof C);
            for (int64_t s = 0; s < steps; s++) {
                for (int k = 0; k < 32; k++) {
                    A[k] = weight_bf16(w, job->row0 + n, s * 32 + k);
                    moeq_bf16_split(x[s * 32 + k], &B[0][(k / 2) * 32 + (k % 2)], &B[1][(k / 2) * 32 + (k % 2)]);
                }
                _tile_loadd(0, C, 64);
                _tile_loadd(1, A, 64);
                _tile_loadd(2, B[0], 64);
                _tile_dpbf16ps(0, 1, 2);
                _tile_loadd(2, B[1], 64);
                _tile_dpbf16ps(0, 1, 2);
                _tile_stored(0, C, 64);
                if (f8 && ((s + 1) % per_block == 0 || s + 1 == steps)) {
                    y = fmaf(f8_scale(w, job->row0 + n, s / per_block), C[0], y);
                    C[0] = 0.0f;
                }
            }
            job->y[t * job->ldy + n] = f8 ? y : C[0];
        }
    _tile_release();
}

#else /* no AMX in this build */

int moeq_amx_supported(void) {
    snprintf(amx_text, sizeof amx_text, "no amx (not an x86-64 Linux build)");
    return 0;
}
void moeq_amx_pack_group(const float *x, int64_t ldx, int64_t n, int64_t K, uint32_t *pack, int64_t g) {
    (void)x, (void)ldx, (void)n, (void)K, (void)pack, (void)g;
    abort();
}
void moeq_amx_pack_panel(const float *x, int64_t ldx, int64_t n, int64_t K, uint32_t *pack, int64_t g) {
    (void)x, (void)ldx, (void)n, (void)K, (void)pack, (void)g;
    abort();
}
void moeq_amx_nt_block(const moeq_mm_job *job, const moeq_amx_xview *xv, int64_t n0, int64_t n1, int64_t t0,
                       int64_t t1, const moeq_amx_then *then, void *ws, size_t ws_bytes) {
    (void)job, (void)xv, (void)n0, (void)n1, (void)t0, (void)t1, (void)then, (void)ws, (void)ws_bytes;
    abort();
}
void moeq_amx_nt_block_ref(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1) {
    (void)job, (void)n0, (void)n1, (void)t0, (void)t1;
    abort();
}
void moeq_amx_widen_f8(const uint8_t *in, uint16_t *out, size_t n) {
    (void)in, (void)out, (void)n;
    abort();
}
#endif

const char *moeq_amx_describe(void) {
    moeq_amx_supported();
    return amx_text;
}

int moeq_amx_nt_job(const moeq_mm_job *job) {
    int64_t K = moeq_tensor_cols(job->w), n = job->n_tok;
    if (n <= 0) return 0;
    const int panels = n >= 16; /* as the backend lays them out */
    size_t pb = panels ? moeq_amx_panel_bytes(n, K) : moeq_amx_pack_bytes(n, K), wb = (moeq_amx_ws_bytes(K) + 63) / 64 * 64;
    uint32_t *pack = aligned_alloc(64, (pb + 63) / 64 * 64);
    void *ws = aligned_alloc(64, wb);
    if (!pack || !ws) {
        free(pack), free(ws);
        return -1;
    }
    for (int64_t g = 0; g < moeq_amx_pack_groups(n); g++)
        if (panels) moeq_amx_pack_panel(job->x, job->ldx, n, K, pack, g);
        else moeq_amx_pack_group(job->x, job->ldx, n, K, pack, g);
    moeq_amx_xview xv = {pack, moeq_amx_pack_cols(n), 0, panels};
    moeq_amx_nt_block(job, &xv, 0, job->n_rows, 0, n, NULL, ws, wb);
    free(pack), free(ws);
    return 0;
}
