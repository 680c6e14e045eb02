/* batch_entry.c — the `jobs` blob of a batch stream entry (see batch_entry.h). */
#include "moeq/batch_entry.h"

#include <stdlib.h>
#include <string.h>

static moeq_err put_u32(moeq_buf *out, size_t v) {
    if (v > UINT32_MAX) return MOEQ_ERR_LIMIT;
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return moeq_buf_append(out, b, 4);
}

static moeq_err put_i64(moeq_buf *out, int64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)v >> (8 * i));
    return moeq_buf_append(out, b, 8);
}

static moeq_err put_bytes(moeq_buf *out, const void *p, size_t n) {
    moeq_err err = put_u32(out, n);
    return err || !n ? err : moeq_buf_append(out, p, n);
}

/* Token ids as little-endian i32, converted in chunks (one append per 256 ids). */
static moeq_err put_tokens(moeq_buf *out, const int32_t *tokens, size_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return n ? moeq_buf_append(out, tokens, n * sizeof(int32_t)) : MOEQ_OK;
#else
    uint8_t b[1024];
    for (size_t k = 0; k < n;) {
        size_t m = 0;
        for (; k < n && m < sizeof(b); k++, m += 4) {
            uint32_t t = (uint32_t)tokens[k];
            b[m] = (uint8_t)t, b[m + 1] = (uint8_t)(t >> 8), b[m + 2] = (uint8_t)(t >> 16), b[m + 3] = (uint8_t)(t >> 24);
        }
        moeq_err err = moeq_buf_append(out, b, m);
        if (err) return err;
    }
    return MOEQ_OK;
#endif
}

moeq_err moeq_batch_entry_encode_jobs(const moeq_batch_entry_job *jobs, size_t n, moeq_buf *out) {
    if (!out || (n && !jobs)) return MOEQ_ERR_INVALID_ARG;
    size_t start = out->len;
    moeq_err err = moeq_buf_append(out, MOEQ_BATCH_ENTRY_MAGIC, 4);
    if (!err) err = put_u32(out, n);
    for (size_t i = 0; !err && i < n; i++) {
        const moeq_batch_entry_job *j = &jobs[i];
        err = put_bytes(out, j->id, j->id_len);
        if (!err) err = put_bytes(out, j->content_type, j->content_type ? j->content_type_len : 0);
        if (!err) err = put_bytes(out, j->job, j->job_len);
        if (!err) err = put_i64(out, j->kafka_ts_ms);
        if (!err) err = put_i64(out, j->arrival_ms);
        if (!err) err = put_u32(out, j->n_tokens);
        if (!err) err = put_tokens(out, j->tokens, j->n_tokens);
    }
    if (err) out->len = start;
    return err;
}

typedef struct reader {
    const uint8_t *p;
    size_t len, off;
} reader;

static int get_u32(reader *r, uint32_t *v) {
    if (r->len - r->off < 4) return 0;
    const uint8_t *b = r->p + r->off;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    r->off += 4;
    return 1;
}

static int get_i64(reader *r, int64_t *v) {
    if (r->len - r->off < 8) return 0;
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)r->p[r->off + i] << (8 * i);
    *v = (int64_t)x;
    r->off += 8;
    return 1;
}

static int get_bytes(reader *r, const void **p, size_t *n) {
    uint32_t len;
    if (!get_u32(r, &len) || r->len - r->off < len) return 0;
    *p = len ? r->p + r->off : NULL;
    *n = len;
    r->off += len;
    return 1;
}

/* First pass: validate the structure and count tokens, so the second allocates once. */
static moeq_err scan(reader r, uint32_t n, size_t *total_tokens, char *errstr, size_t errn) {
    *total_tokens = 0;
    for (uint32_t i = 0; i < n; i++) {
        const void *p;
        size_t len;
        int64_t ts;
        uint32_t nt;
        if (!get_bytes(&r, &p, &len) || !get_bytes(&r, &p, &len) || !get_bytes(&r, &p, &len) ||
            !get_i64(&r, &ts) || !get_i64(&r, &ts) || !get_u32(&r, &nt) || (r.len - r.off) / 4 < nt)
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, errn, "batch entry: job %u is truncated", i);
        r.off += (size_t)nt * 4;
        *total_tokens += nt;
    }
    if (r.off != r.len)
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, errn, "batch entry: %zu trailing bytes", r.len - r.off);
    return MOEQ_OK;
}

moeq_err moeq_batch_entry_decode_jobs(const void *blob, size_t len, moeq_batch_entry_job **jobs_out,
                                      size_t *n_out, int32_t **tokens_out, char *errstr, size_t errn) {
    if (!blob || !jobs_out || !n_out || !tokens_out)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errn, "batch entry: NULL argument");
    *jobs_out = NULL;
    *tokens_out = NULL;
    *n_out = 0;
    reader r = {blob, len, 0};
    uint32_t n;
    if (len < 8 || memcmp(blob, MOEQ_BATCH_ENTRY_MAGIC, 4) != 0)
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, errn, "batch entry: no %s magic", MOEQ_BATCH_ENTRY_MAGIC);
    r.off = 4;
    get_u32(&r, &n);
    if (n > (len - 8) / 36) /* every job takes at least 36 bytes */
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, errn, "batch entry: %u jobs cannot fit in %zu bytes", n, len);
    size_t total;
    moeq_err err = scan(r, n, &total, errstr, errn);
    if (err) return err;
    moeq_batch_entry_job *jobs = calloc(n ? n : 1, sizeof(*jobs));
    int32_t *toks = malloc((total ? total : 1) * sizeof(int32_t));
    if (!jobs || !toks) {
        free(jobs);
        free(toks);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errn, "batch entry: out of memory");
    }
    size_t t = 0;
    for (uint32_t i = 0; i < n; i++) {
        moeq_batch_entry_job *j = &jobs[i];
        const void *p;
        uint32_t nt = 0;
        get_bytes(&r, &p, &j->id_len);
        j->id = p;
        get_bytes(&r, &p, &j->content_type_len);
        j->content_type = p;
        get_bytes(&r, &j->job, &j->job_len);
        get_i64(&r, &j->kafka_ts_ms);
        get_i64(&r, &j->arrival_ms);
        get_u32(&r, &nt);
        j->tokens = toks + t;
        j->n_tokens = nt;
        for (uint32_t k = 0; k < nt; k++) {
            uint32_t v = 0;
            get_u32(&r, &v);
            toks[t++] = (int32_t)v;
        }
    }
    *jobs_out = jobs;
    *n_out = n;
    *tokens_out = toks;
    return MOEQ_OK;
}

uint64_t moeq_batch_entry_prefix_key(const int32_t *tokens, size_t n_shared) {
    size_t n = n_shared < MOEQ_BATCH_PREFIX_KEY_TOKENS ? n_shared : MOEQ_BATCH_PREFIX_KEY_TOKENS;
    n -= n % MOEQ_BATCH_PREFIX_KEY_ROUND;
    if (!tokens || n == 0) return 0;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) h = (h ^ (((uint32_t)tokens[i] >> (8 * b)) & 0xff)) * 0x100000001b3ULL;
    return h ? h : 1;
}
