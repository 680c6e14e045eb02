/*
 * attention_amx.c — MLA attention on AMX tiles (see attention_amx.h for the
 * arithmetic and why it keeps batch invariance).
 *
 * A call is one task: up to 64 query columns (tokens x heads) over the
 * context of one sequence, in slabs of 64 cached rows. Per slab:
 *   scores  the rows are split into bf16 hi/lo rows in the workspace (the A
 *           operand, 16 rows a tile); the queries were packed once into the
 *           pair layout (the B operand); C tiles (16 rows x 16 columns) are
 *           transposed into each column's score row.
 *   output  the rows are split again into the pair layout of their latent
 *           columns (the B operand: two rows interleaved per dword), the
 *           probabilities into bf16 hi/lo rows (the A operand), and each
 *           column's accumulators stay in the workspace from slab to slab
 *           (a float32 store and reload is exact).
 * Splitting the rows costs about as much as the tiles' arithmetic for 32
 * columns, so a task takes 16 heads (decode) or up to 8 tokens x 16 heads
 * (prefill) and splits each row once for all of them.
 */
#include "attention_amx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amx_inline.h"
#include "attention.h"
#include "kv_paged.h"
#include "ops_lanes.h"

#define SLAB 64 /* context rows split at a time: two 32-row output steps, four 16-row score tiles */
#define COLS MOEQ_MLA_AMX_COLS
#define NP MOEQ_MLA_AMX_PARTS

typedef struct ws_layout {
    int L, R, E, S, Lp;     /* latent, rope, entry; steps of 32 over the entry; latent padded to 32 */
    int64_t ldr, ldp, ldc;  /* row stride of the split rows (bf16), of the pairs and of the accumulators (dwords) */
    size_t q, rows, pairs, p, acc, ctile, total; /* byte offsets */
} ws_layout;

static ws_layout layout_of(int L, int R) {
    ws_layout w = {.L = L, .R = R, .E = L + R};
    w.S = (w.E + 31) / 32;
    w.Lp = (L + 31) / 32 * 32;
    w.ldr = (int64_t)w.S * 32 + 32; /* + 64 bytes: rows do not alias in the cache sets */
    w.ldp = w.Lp + 16;
    w.ldc = w.Lp + 16;
    size_t at = 0;
    w.q = at, at += (size_t)w.S * NP * 16 * COLS * 4;
    w.rows = at, at += (size_t)NP * SLAB * (size_t)w.ldr * 2;
    w.pairs = at, at += (size_t)(SLAB / 32) * NP * 16 * (size_t)w.ldp * 4;
    w.p = at, at += (size_t)NP * COLS * SLAB * 2;
    w.acc = at, at += (size_t)COLS * (size_t)w.ldc * 4;
    w.ctile = at, at += 4 * 256 * 4;
    w.total = (at + 63) / 64 * 64;
    return w;
}

size_t moeq_mla_amx_ws_bytes(int kv_lora, int rope) { return layout_of(kv_lora, rope).total; }

#ifdef MOEQ_AMX_X86

/* 32 floats (masked loads: m0, m1) split into NP parts of 32 bf16 values each: part[0] = bf16(x), part[i] =
 * bf16(x - part[0] - ... - part[i-1]) (each difference exact in float32). */
static TAMX AMX_ALWAYS_INLINE void split32(const float *x, __mmask16 m0, __mmask16 m1, __m512i part[NP]) {
    __m512 x0 = _mm512_maskz_loadu_ps(m0, x), x1 = _mm512_maskz_loadu_ps(m1, x + 16);
    for (int i = 0; i < NP; i++) {
        __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
        part[i] = h;
        if (i + 1 < NP) x0 = _mm512_sub_ps(x0, moeq_bf16_lo_f32(h)), x1 = _mm512_sub_ps(x1, moeq_bf16_hi_f32(h));
    }
}

/* Two rows' 16 floats as NP parts in the pair layout: each dword holds (row a's bf16, row b's bf16). */
static TAMX AMX_ALWAYS_INLINE void split_pairs(__m512 xa, __m512 xb, __m512i part[NP]) {
    for (int i = 0; i < NP; i++) {
        __m512i h = (__m512i)_mm512_cvtne2ps_pbh(xb, xa); /* words 0-15: row a, 16-31: row b */
        part[i] = _mm512_or_si512(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)),
                                  _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
        if (i + 1 < NP) xa = _mm512_sub_ps(xa, moeq_bf16_lo_f32(h)), xb = _mm512_sub_ps(xb, moeq_bf16_hi_f32(h));
    }
}

/* The query columns' values (latent, then rope, zero padded) in the pair layout: [step][part][k2][COLS], for the
 * column tiles the chains read (columns past ncol in the last one are zeros). Sixteen columns at a time: their
 * split parts, one vector a column, transposed into 16 rows of the layout (each row a 64-byte store; storing every
 * dword where it goes took a tenth of the attention's time in a long prefill). */
static TAMX void pack_queries(const moeq_mla_params *a, const ws_layout *w, int64_t t0, int nt, int h0, int nh,
                              uint32_t *qp) {
    const int L = w->L, R = w->R, H = a->n_heads, ncol = nt * nh;
    float v[32];
    for (int c0 = 0; c0 < (ncol + 15) / 16 * 16; c0 += 16)
        for (int s = 0; s < w->S; s++) {
            __m512i blk[NP][16];
            for (int cc = 0; cc < 16; cc++) {
                const int c = c0 + cc;
                if (c >= ncol) {
                    for (int i = 0; i < NP; i++) blk[i][cc] = _mm512_setzero_si512();
                    continue;
                }
                const int64_t t = t0 + c / nh;
                const int h = h0 + c % nh;
                const float *ql = a->q_lat + (t * H + h) * L, *qr = a->q_pe + (t * H + h) * R, *src = v;
                if (s * 32 + 32 <= L) src = ql + s * 32; /* all latent */
                else
                    for (int k = 0; k < 32; k++) {
                        int idx = s * 32 + k;
                        v[k] = idx < L ? ql[idx] : idx < w->E ? qr[idx - L] : 0.0f;
                    }
                __m512i part[NP];
                split32(src, 0xFFFF, 0xFFFF, part);
                for (int i = 0; i < NP; i++) blk[i][cc] = part[i];
            }
            for (int i = 0; i < NP; i++) {
                moeq_transpose16(blk[i]); /* blk[i][k2]: pair row k2 of the 16 columns */
                for (int k2 = 0; k2 < 16; k2++)
                    _mm512_storeu_si512(qp + ((s * NP + i) * 16 + k2) * COLS + c0, blk[i][k2]);
            }
        }
}

#define DP4(NR, NG)                                          \
    do {                                                     \
        _tile_dpbf16ps(0, 4, 6);                             \
        if ((NG) == 2) _tile_dpbf16ps(1, 4, 7);              \
        if ((NR) == 2) _tile_dpbf16ps(2, 5, 6);              \
        if ((NR) == 2 && (NG) == 2) _tile_dpbf16ps(3, 5, 7); \
    } while (0)

/*
 * Score tiles: C(r, g) over the steps, A = the split rows (NR tiles of 16 rows, part a at rows + a * SLAB *
 * ldr), B = the queries (NG tiles). Per step the terms (a, b) with a + b < NP, a ascending, then b.
 */
static TAMX AMX_ALWAYS_INLINE void score_chain(const int NR, const int NG, const uint16_t *rows, int64_t ldr,
                                              int64_t apart, const uint32_t *q, int S) {
    const int64_t lda = ldr * 2, ldb = COLS * 4;
    moeq_amx_zero_c4();
    for (int s = 0; s < S; s++)
        for (int pa = 0; pa < NP; pa++) {
            const uint16_t *r = rows + pa * apart + s * 32;
            _tile_loadd(4, r, lda);
            if (NR == 2) _tile_loadd(5, r + 16 * ldr, lda);
            for (int pb = 0; pa + pb < NP; pb++) {
                const uint32_t *b = q + (s * NP + pb) * 16 * COLS;
                _tile_loadd(6, b, ldb);
                if (NG == 2) _tile_loadd(7, b + 16, ldb);
                DP4(NR, NG);
            }
        }
}

static TAMX void score_chain_any(int nr, int ng, const uint16_t *rows, int64_t ldr, int64_t apart, const uint32_t *q,
                                 int S) {
    if (nr == 2 && ng == 2) score_chain(2, 2, rows, ldr, apart, q, S);
    else if (nr == 2) score_chain(2, 1, rows, ldr, apart, q, S);
    else if (ng == 2) score_chain(1, 2, rows, ldr, apart, q, S);
    else score_chain(1, 1, rows, ldr, apart, q, S);
}

/* Output tiles: C(m, n) += over the slab's steps, A = the probabilities (NM tiles of 16 columns, part a at
 * p + a * COLS * SLAB), B = the pairs; the same terms in the same order as the scores'. */
static TAMX AMX_ALWAYS_INLINE void out_chain(const int NM, const int ND, const uint16_t *p, const uint32_t *pairs,
                                            int64_t ldp, int nu) {
    const int64_t lda = SLAB * 2, ldb = ldp * 4, bpart = 16 * ldp, apart = COLS * SLAB;
    for (int u = 0; u < nu; u++)
        for (int pa = 0; pa < NP; pa++) {
            const uint16_t *a = p + pa * apart + u * 32;
            _tile_loadd(4, a, lda);
            if (NM == 2) _tile_loadd(5, a + 16 * SLAB, lda);
            for (int pb = 0; pa + pb < NP; pb++) {
                const uint32_t *b = pairs + (u * NP + pb) * bpart;
                _tile_loadd(6, b, ldb);
                if (ND == 2) _tile_loadd(7, b + 16, ldb);
                DP4(NM, ND);
            }
        }
}

static TAMX void out_chain_any(int nm, int nd, const uint16_t *p, const uint32_t *pairs, int64_t ldp, int nu) {
    if (nm == 2 && nd == 2) out_chain(2, 2, p, pairs, ldp, nu);
    else if (nm == 2) out_chain(2, 1, p, pairs, ldp, nu);
    else if (nd == 2) out_chain(1, 2, p, pairs, ldp, nu);
    else out_chain(1, 1, p, pairs, ldp, nu);
}

static const float zero_row[2048];

/* Rows [j0, j0 + fill) of the cache (fill <= SLAB; zeros from row n on) split for the scores: part i of row j0 + r
 * at dst + (i * apart + r) * ldr. */
static TAMX void split_rows_slab(const ws_layout *w, const moeq_kv_view *kv, int64_t n, int64_t j0, uint16_t *dst,
                                 int64_t apart, int fill) {
    const int E = w->E;
    const int64_t entry_bytes = (int64_t)E * 4, nrows = n - j0 < SLAB ? n - j0 : SLAB;
    for (int r = 0; r < fill; r++) {
        if (r >= nrows) {
            for (int i = 0; i < NP; i++) memset(dst + (i * apart + r) * w->ldr, 0, (size_t)w->S * 64);
            continue;
        }
        const float *e = moeq_kv_view_entry(kv, j0 + r);
        if (j0 + r + 8 < n) { /* the blocks are scattered: the prefetcher restarts at each */
            const char *pe = (const char *)moeq_kv_view_entry(kv, j0 + r + 8);
            for (int64_t b = 0; b < entry_bytes; b += 64) _mm_prefetch(pe + b, _MM_HINT_T0);
        }
        for (int s = 0; s < w->S; s++) {
            __m512i part[NP];
            split32(e + s * 32, moeq_tail_mask16(E - s * 32), moeq_tail_mask16(E - s * 32 - 16), part);
            for (int i = 0; i < NP; i++) _mm512_storeu_si512(dst + (i * apart + r) * w->ldr + s * 32, part[i]);
        }
    }
}

/* Rows [j0, j0 + 32 nu) of the cache (nu <= SLAB / 32; zeros from row n on) in the output's pair layout: for each
 * 32 rows u, part i, pair row k2 at dst + ((u * NP + i) * 16 + k2) * ldp. */
static TAMX void split_pairs_slab(const ws_layout *w, const moeq_kv_view *kv, int64_t n, int64_t j0, uint32_t *dst,
                                  int nu) {
    const int L = w->L;
    for (int u = 0; u < nu; u++)
        for (int k2 = 0; k2 < 16; k2++) {
            const int64_t ja = j0 + u * 32 + 2 * k2, jb = ja + 1;
            const float *ea = ja < n ? moeq_kv_view_entry(kv, ja) : zero_row;
            const float *eb = jb < n ? moeq_kv_view_entry(kv, jb) : zero_row;
            uint32_t *d = dst + (u * NP * 16 + k2) * w->ldp;
            for (int c = 0; c < w->Lp; c += 16) {
                const __mmask16 m = moeq_tail_mask16(L - c);
                __m512i part[NP];
                split_pairs(_mm512_maskz_loadu_ps(m, ea + c), _mm512_maskz_loadu_ps(m, eb + c), part);
                for (int i = 0; i < NP; i++) _mm512_storeu_si512(d + i * 16 * w->ldp + c, part[i]);
            }
        }
}

size_t moeq_mla_amx_split_bytes(int kv_lora, int rope, int64_t n) {
    const ws_layout w = layout_of(kv_lora, rope);
    const int64_t n_pad = (n + SLAB - 1) / SLAB * SLAB;
    return (size_t)NP * (size_t)n_pad * (size_t)w.ldr * 2 + (size_t)(n_pad / 32) * NP * 16 * (size_t)w.ldp * 4;
}

moeq_mla_amx_split moeq_mla_amx_split_at(int kv_lora, int rope, int32_t seq, int64_t n, void *buf) {
    const ws_layout w = layout_of(kv_lora, rope);
    const int64_t n_pad = (n + SLAB - 1) / SLAB * SLAB;
    uint16_t *rows = buf;
    return (moeq_mla_amx_split){rows, (uint32_t *)(rows + (size_t)NP * (size_t)n_pad * (size_t)w.ldr), n, n_pad, seq};
}

int64_t moeq_mla_amx_split_slabs(int64_t n) { return (n + SLAB - 1) / SLAB; }

TAMX void moeq_mla_amx_split_slab(const moeq_mla_params *a, const moeq_mla_amx_split *sp, int64_t k) {
    const ws_layout w = layout_of(a->kv_lora, a->rope);
    const moeq_kv_view kv = moeq_kv_paged_view(&a->kv, sp->seq);
    split_rows_slab(&w, &kv, sp->n, k * SLAB, sp->rows + k * SLAB * w.ldr, sp->n_pad, SLAB);
    split_pairs_slab(&w, &kv, sp->n, k * SLAB, sp->pairs + (k * SLAB / 32) * NP * 16 * w.ldp, SLAB / 32);
}

TAMX void moeq_mla_group_amx(const moeq_mla_params *a, int64_t t0, int nt, int h0, int h1, const moeq_mla_amx_split *sp,
                             float *scores, void *ws, size_t ws_bytes) {
    const ws_layout w = layout_of(a->kv_lora, a->rope);
    const int nh = h1 - h0, ncol = nt * nh, H = a->n_heads, L = w.L, E = w.E;
    if (ncol <= 0) return;
    if (ncol > COLS || ws_bytes < w.total || E > 2048) {
        fprintf(stderr, "moeq: amx attention: %d columns (at most %d), workspace %zu of %zu bytes, entry %d\n", ncol,
                COLS, ws_bytes, w.total, E);
        abort(); /* the backend sizes the tasks and the workspace */
    }
    const int64_t ld = a->pos[t0 + nt - 1] + 1;
    const moeq_kv_view kv = moeq_kv_paged_view(&a->kv, a->seq[t0]);
    uint8_t *base = ws;
    uint32_t *q = (uint32_t *)(base + w.q), *pairs = (uint32_t *)(base + w.pairs);
    uint16_t *rows = (uint16_t *)(base + w.rows), *pbuf = (uint16_t *)(base + w.p);
    float *acc = (float *)(base + w.acc), *ctile = (float *)(base + w.ctile);
    int64_t n_ctx[COLS];
    for (int c = 0; c < ncol; c++) n_ctx[c] = a->pos[t0 + c / nh] + 1;
    const int nct = (ncol + 15) / 16; /* column tiles */
    if (sp && (sp->seq != a->seq[t0] || sp->n < ld)) abort(); /* the backend splits the rows its tasks read */
    pack_queries(a, &w, t0, nt, h0, nh, q);
    _tile_loadconfig(&moeq_amx_full_config);

    /* scores */
    for (int64_t j0 = 0; j0 < ld; j0 += SLAB) {
        const int nrows = (int)(ld - j0 < SLAB ? ld - j0 : SLAB), nrt = (nrows + 15) / 16;
        /* the last slab is split here, as without sp: rows past ld are zeros (the output's last step reads them) */
        const int own = !sp || j0 + SLAB >= ld;
        if (own) split_rows_slab(&w, &kv, ld, j0, rows, SLAB, nrt * 16); /* the row tiles the chains read */
        const uint16_t *srows = own ? rows : sp->rows + j0 * w.ldr;
        const int64_t apart = (own ? SLAB : sp->n_pad) * w.ldr;
        for (int rt = 0; rt < nrt; rt += 2) {
            const int nr = nrt - rt >= 2 ? 2 : 1;
            for (int ct = 0; ct < nct; ct += 2) {
                const int ng = nct - ct >= 2 ? 2 : 1;
                score_chain_any(nr, ng, srows + rt * 16 * w.ldr, w.ldr, apart, q + ct * 16, w.S);
                for (int i = 0; i < nr; i++)
                    for (int g = 0; g < ng; g++) {
                        moeq_amx_store_c(2 * i + g, ctile, 64);
                        __m512i v[16];
                        for (int r = 0; r < 16; r++) v[r] = _mm512_loadu_si512(ctile + 16 * r);
                        moeq_transpose16(v); /* v[c]: column c's 16 rows */
                        const int64_t j = j0 + (rt + i) * 16;
                        for (int c = 0; c < 16; c++) {
                            const int col = (ct + g) * 16 + c;
                            if (col >= ncol) break;
                            _mm512_mask_storeu_ps(scores + col * ld + j, moeq_tail_mask16(n_ctx[col] - j),
                                                  _mm512_mul_ps(_mm512_castsi512_ps(v[c]), _mm512_set1_ps(a->scale)));
                        }
                    }
            }
        }
    }
    for (int c = 0; c < ncol; c++) moeq_mla_softmax(scores + c * ld, n_ctx[c]);

    /* output */
    const int nmt = nct, ndt = w.Lp / 16;
    for (int64_t j0 = 0; j0 < ld; j0 += SLAB) {
        const int nrows = (int)(ld - j0 < SLAB ? ld - j0 : SLAB), nu = (nrows + 31) / 32;
        const int own = !sp || j0 + SLAB >= ld;
        if (own) split_pairs_slab(&w, &kv, ld, j0, pairs, nu);
        const uint32_t *spairs = own ? pairs : sp->pairs + (j0 / 32) * NP * 16 * w.ldp;
        for (int c = 0; c < nmt * 16; c++) { /* probabilities, 0 past each column's context */
            if (c >= ncol) {
                for (int i = 0; i < NP; i++) memset(pbuf + (i * COLS + c) * SLAB, 0, SLAB * 2);
                continue;
            }
            const float *p = scores + c * ld + j0;
            for (int jj = 0; jj < SLAB; jj += 32) {
                __m512i part[NP];
                split32(p + jj, moeq_tail_mask16(n_ctx[c] - j0 - jj), moeq_tail_mask16(n_ctx[c] - j0 - jj - 16), part);
                for (int i = 0; i < NP; i++) _mm512_storeu_si512(pbuf + (i * COLS + c) * SLAB + jj, part[i]);
            }
        }
        for (int mt = 0; mt < nmt; mt += 2) {
            const int nm = nmt - mt >= 2 ? 2 : 1;
            for (int dt = 0; dt < ndt; dt += 2) {
                const int nd = ndt - dt >= 2 ? 2 : 1;
                if (!j0) moeq_amx_zero_c4();
                for (int i = 0; j0 && i < nm; i++) /* later slabs continue the chains */
                    for (int g = 0; g < nd; g++)
                        moeq_amx_load_c(2 * i + g, acc + (mt + i) * 16 * w.ldc + (dt + g) * 16, w.ldc * 4);
                out_chain_any(nm, nd, pbuf + mt * 16 * SLAB, spairs + dt * 16, w.ldp, nu);
                for (int i = 0; i < nm; i++)
                    for (int g = 0; g < nd; g++) moeq_amx_store_c(2 * i + g, acc + (mt + i) * 16 * w.ldc + (dt + g) * 16, w.ldc * 4);
            }
        }
    }
    _tile_release();
    for (int c = 0; c < ncol; c++)
        memcpy(a->out_lat + ((t0 + c / nh) * H + h0 + c % nh) * L, acc + c * w.ldc, (size_t)L * sizeof(float));
}

/* One chain step on one element: C = tdp(C, row 0 of A, column 0 of B) for each (A, B) of the step. */
static TAMX void element_step(float *C, const uint16_t *A, const uint16_t *B) {
    _tile_loadd(0, C, 64);
    _tile_loadd(1, A, 64);
    _tile_loadd(2, B, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, C, 64);
}

/* x's NP parts at A[i][k] (row 0 of an A tile) or at B's column 0 (pair index bi). */
static void split_parts(float x, uint16_t *dst, size_t part_stride) {
    for (int i = 0; i < NP; i++) {
        uint16_t h = moeq_bf16_rne_daz(x);
        dst[(size_t)i * part_stride] = h;
        x -= moeq_bf16_to_f32(h);
    }
}

/* The terms (a, b) with a + b < NP, a ascending, then b, on one element. */
static TAMX void element_terms(float *C, const uint16_t A[NP][512], const uint16_t B[NP][512]) {
    for (int pa = 0; pa < NP; pa++)
        for (int pb = 0; pa + pb < NP; pb++) element_step(C, A[pa], B[pb]);
}

TAMX void moeq_mla_block_amx_ref(const moeq_mla_params *a, int64_t t, int h0, int h1, float *scores) {
    const int L = a->kv_lora, R = a->rope, H = a->n_heads, E = L + R, S = (E + 31) / 32;
    const int64_t n_ctx = a->pos[t] + 1;
    const moeq_kv_view kv = moeq_kv_paged_view(&a->kv, a->seq[t]);
    static _Thread_local uint16_t A[NP][16 * 32], B[NP][16 * 32];
    static _Thread_local float C[256];
    memset(A, 0, sizeof A), memset(B, 0, sizeof B), memset(C, 0, sizeof C);
    _tile_loadconfig(&moeq_amx_full_config);
    for (int h = h0; h < h1; h++) {
        const float *ql = a->q_lat + (t * H + h) * L, *qr = a->q_pe + (t * H + h) * R;
        float *sc = scores + (int64_t)(h - h0) * n_ctx;
        for (int64_t j = 0; j < n_ctx; j++) {
            const float *e = moeq_kv_view_entry(&kv, j);
            C[0] = 0.0f;
            for (int s = 0; s < S; s++) {
                for (int k = 0; k < 32; k++) {
                    int idx = s * 32 + k, bi = (k / 2) * 32 + k % 2;
                    split_parts(idx < E ? e[idx] : 0.0f, &A[0][k], 512);
                    split_parts(idx < L ? ql[idx] : idx < E ? qr[idx - L] : 0.0f, &B[0][bi], 512);
                }
                element_terms(C, A, B);
            }
            sc[j] = C[0] * a->scale;
        }
        moeq_mla_softmax(sc, n_ctx);
        for (int d = 0; d < L; d++) {
            C[0] = 0.0f;
            for (int64_t u = 0; u * 32 < n_ctx; u++) {
                for (int k = 0; k < 32; k++) {
                    int64_t j = u * 32 + k;
                    int bi = (k / 2) * 32 + k % 2;
                    split_parts(j < n_ctx ? sc[j] : 0.0f, &A[0][k], 512);
                    split_parts(j < n_ctx ? moeq_kv_view_entry(&kv, j)[d] : 0.0f, &B[0][bi], 512);
                }
                element_terms(C, A, B);
            }
            a->out_lat[(t * H + h) * L + d] = C[0];
        }
    }
    _tile_release();
}

#else /* no AMX in this build */

void moeq_mla_group_amx(const moeq_mla_params *a, int64_t t0, int nt, int h0, int h1, const moeq_mla_amx_split *sp,
                        float *scores, void *ws, size_t ws_bytes) {
    (void)a, (void)t0, (void)nt, (void)h0, (void)h1, (void)sp, (void)scores, (void)ws, (void)ws_bytes;
    abort();
}
size_t moeq_mla_amx_split_bytes(int kv_lora, int rope, int64_t n) {
    (void)kv_lora, (void)rope, (void)n;
    return 0;
}
moeq_mla_amx_split moeq_mla_amx_split_at(int kv_lora, int rope, int32_t seq, int64_t n, void *buf) {
    (void)kv_lora, (void)rope, (void)seq, (void)n, (void)buf;
    abort();
}
int64_t moeq_mla_amx_split_slabs(int64_t n) { return (n + SLAB - 1) / SLAB; }
void moeq_mla_amx_split_slab(const moeq_mla_params *a, const moeq_mla_amx_split *sp, int64_t k) {
    (void)a, (void)sp, (void)k;
    abort();
}
void moeq_mla_block_amx_ref(const moeq_mla_params *a, int64_t t, int h0, int h1, float *scores) {
    (void)a, (void)t, (void)h0, (void)h1, (void)scores;
    abort();
}
#endif
