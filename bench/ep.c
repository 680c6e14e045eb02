/*
 * bench/ep.c — bench-ep: dispatch and combine latency (1, 8, 32, 128 tokens per
 * rank) and bandwidth at a large payload, for each transport available (local;
 * ucx over each UCX_TLS asked for, 2 ranks as 2 processes on this host), beside
 * UCX's own ucx_perftest (tag_lat, tag_bw) on the same transport in the same
 * run. Prints one JSON object. Rows are DeepSeek-V3's (hidden 7168, 256 experts,
 * top-8) unless told otherwise.
 *
 * usage: bench-ep [--tls tcp,posix,sysv] [--payload f32|bf16|fp8] [--hidden H] [--quick]
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moeq/ep.h"
#include "moeq/util.h"

enum { N_LAT = 4, LAT_MAX_T = 128, EXPERTS = 256, TOP_K = 8 };
static const int lat_tokens[N_LAT] = {1, 8, 32, 128};

typedef struct bench_cfg {
    int hidden, bw_tokens, quick, n_ranks;
    char payload[8], transport[16], tls[64], dir[64];
} bench_cfg;

typedef struct bench_out {
    double dispatch_us[N_LAT], combine_us[N_LAT];
    double bw_dispatch_s, bw_combine_s; /* seconds per exchange at bw_tokens */
    int64_t bw_remote_rows;             /* token rows this rank sent to the other rank per dispatch */
    int64_t bw_remote_slots;            /* slots among them (one metadata entry, one combine row each) */
    int64_t bw_msg_bytes;               /* bytes of the dispatch message to the peer (rows + meta) */
    int64_t bw_combine_bytes;           /* bytes of the combine message back (one row per slot)    */
    char err[512];
} bench_out;

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull, z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void inputs(uint64_t seed, int64_t T, int H, int32_t *ids, float *x) {
    uint64_t s = seed;
    for (int64_t t = 0; t < T; t++) {
        for (int k = 0; k < TOP_K; k++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(mix(&s) % EXPERTS), dup = 0;
                for (int j = 0; j < k; j++) dup |= ids[t * TOP_K + j] == e;
            } while (dup);
            ids[t * TOP_K + k] = e;
        }
        for (int h = 0; h < H; h++) x[t * H + h] = (float)(mix(&s) % 1000) / 500.0f - 1.0f;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds of dispatch and of combine over iters rounds (after a few warm-up rounds). */
static moeq_err time_rounds(moeq_ep *ep, int64_t T, int H, int iters, const int32_t *ids, const float *x, float *y,
                            float *out, double *d_s, double *c_s, char *err, size_t n) {
    double *d = malloc((size_t)iters * sizeof(double)), *c = malloc((size_t)iters * sizeof(double));
    moeq_err e = d && c ? MOEQ_OK : MOEQ_ERR_NOMEM;
    for (int i = -3; i < iters && !e; i++) {
        moeq_ep_recv r;
        int64_t t0 = moeq_mono_ns();
        if ((e = moeq_ep_dispatch(ep, T, ids, x, &r, err, n))) break;
        int64_t t1 = moeq_mono_ns();
        memcpy(y, r.x, (size_t)r.n_rows * H * sizeof(float)); /* the "expert": identity */
        int64_t t2 = moeq_mono_ns();
        if ((e = moeq_ep_combine(ep, y, out, err, n))) break;
        int64_t t3 = moeq_mono_ns();
        if (i >= 0) d[i] = (double)(t1 - t0) / 1e9, c[i] = (double)(t3 - t2) / 1e9;
    }
    if (!e) {
        qsort(d, (size_t)iters, sizeof(double), cmp_double), qsort(c, (size_t)iters, sizeof(double), cmp_double);
        *d_s = d[iters / 2], *c_s = c[iters / 2];
    }
    free(d), free(c);
    return e;
}

/* Each handle has its own rendezvous folder (dir/<phase>): a new worker must never find the last one's address. */
static moeq_err open_ep(const bench_cfg *g, const char *phase, int rank, int max_tokens, moeq_ep **ep, char *err,
                        size_t n) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/%s", g->dir, phase);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return moeq_errf(MOEQ_ERR_IO, err, n, "mkdir %s failed", dir);
    moeq_ep_params p = moeq_ep_default_params();
    snprintf(p.transport, sizeof p.transport, "%s", g->transport);
    snprintf(p.payload, sizeof p.payload, "%s", g->payload);
    p.rank = rank, p.n_ranks = g->n_ranks, p.n_experts = EXPERTS, p.hidden = g->hidden;
    p.max_tokens = max_tokens, p.top_k = TOP_K, p.timeout_ms = 60000;
    moeq_ep_rendezvous rv = moeq_ep_rendezvous_dir(dir);
    return moeq_ep_new(&p, NULL, &rv, ep, err, n);
}

/* Every rank runs the same sequence of collectives; rank 0's figures are reported. */
static moeq_err run_rank(const bench_cfg *g, int rank, bench_out *o) {
    int H = g->hidden, maxT = g->bw_tokens > LAT_MAX_T ? g->bw_tokens : LAT_MAX_T;
    size_t rows = (size_t)g->n_ranks * maxT * TOP_K;
    int32_t *ids = malloc((size_t)maxT * TOP_K * sizeof(int32_t));
    float *x = malloc((size_t)maxT * H * sizeof(float)), *y = malloc(rows * H * sizeof(float));
    float *out = malloc((size_t)maxT * TOP_K * H * sizeof(float));
    moeq_ep *ep = NULL;
    moeq_err e = ids && x && y && out ? MOEQ_OK : MOEQ_ERR_NOMEM;
    if (!e) e = open_ep(g, "latency", rank, LAT_MAX_T, &ep, o->err, sizeof o->err);
    for (int i = 0; i < N_LAT && !e; i++) {
        inputs(77 + (uint64_t)rank, lat_tokens[i], H, ids, x);
        e = time_rounds(ep, lat_tokens[i], H, g->quick ? 20 : 200, ids, x, y, out, &o->dispatch_us[i],
                        &o->combine_us[i], o->err, sizeof o->err);
        o->dispatch_us[i] *= 1e6, o->combine_us[i] *= 1e6;
    }
    if (!e) e = moeq_ep_barrier(ep, o->err, sizeof o->err);
    moeq_ep_destroy(ep), ep = NULL;
    if (!e) e = open_ep(g, "bandwidth", rank, g->bw_tokens, &ep, o->err, sizeof o->err);
    if (!e) {
        inputs(99 + (uint64_t)rank, g->bw_tokens, H, ids, x);
        int32_t *dr = malloc((size_t)g->bw_tokens * TOP_K * 4), *dl = malloc((size_t)g->bw_tokens * TOP_K * 4);
        int64_t count[2] = {0, 0}, toks = 0;
        int peer = g->n_ranks == 2 ? 1 - rank : 0; /* local: rows to self */
        if (dr && dl)
            moeq_ep_layout(moeq_ep_placement_of(ep), rank, g->bw_tokens, TOP_K, ids, dr, dl, count, NULL, 0);
        for (int t = 0; dr && dl && t < g->bw_tokens; t++) {
            int any = 0;
            for (int k = 0; k < TOP_K; k++) any |= dr[t * TOP_K + k] == peer;
            toks += any;
        }
        o->bw_remote_rows = toks, o->bw_remote_slots = count[peer];
        free(dr), free(dl);
        e = time_rounds(ep, g->bw_tokens, H, g->quick ? 3 : 10, ids, x, y, out, &o->bw_dispatch_s, &o->bw_combine_s,
                        o->err, sizeof o->err);
        if (!e) e = moeq_ep_barrier(ep, o->err, sizeof o->err);
    }
    size_t row_bytes = !strcmp(g->payload, "fp8")    ? (size_t)H + 4 * (size_t)((H + 127) / 128)
                       : !strcmp(g->payload, "bf16") ? (size_t)H * 2 : (size_t)H * 4;
    o->bw_msg_bytes = o->bw_remote_rows * (int64_t)row_bytes + o->bw_remote_slots * 8;
    o->bw_combine_bytes = o->bw_remote_slots * (int64_t)row_bytes;
    moeq_ep_destroy(ep);
    free(ids), free(x), free(y), free(out);
    return e;
}

/* ---- ucx_perftest beside it -------------------------------------------- */

/* One ucx_perftest pair (server in the background, client here); the client's "Final:" line, or "". */
static int perftest(const char *tls, const char *test, int64_t size, int iters, int port, double *field3,
                    double *field5) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "UCX_TLS=%s ucx_perftest -p %d -t %s -s %lld -n %d >/dev/null 2>&1 & srv=$!; sleep 0.5; "
             "UCX_TLS=%s ucx_perftest 127.0.0.1 -p %d -t %s -s %lld -n %d 2>/dev/null | grep '^Final:'; wait $srv",
             tls, port, test, (long long)size, iters, tls, port, test, (long long)size, iters);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    char line[512] = "";
    int ok = fgets(line, sizeof line, f) != NULL;
    pclose(f);
    double v[8] = {0};
    ok = ok && sscanf(line, "Final: %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 6;
    if (ok) *field3 = v[2], *field5 = v[4];
    return ok;
}

/* ---- output ------------------------------------------------------------- */

static void print_run(const bench_cfg *g, const bench_out *o, int first) {
    printf("%s{\"transport\":\"%s\"", first ? "" : ",", g->transport);
    if (g->tls[0]) printf(",\"tls\":\"%s\"", g->tls);
    printf(",\"ranks\":%d,\"latency\":[", g->n_ranks);
    for (int i = 0; i < N_LAT; i++)
        printf("%s{\"tokens_per_rank\":%d,\"dispatch_us\":%.1f,\"combine_us\":%.1f}", i ? "," : "", lat_tokens[i],
               o->dispatch_us[i], o->combine_us[i]);
    double bytes = (double)o->bw_msg_bytes;
    double cbytes = (double)o->bw_combine_bytes;
    printf("],\"bandwidth\":{\"tokens_per_rank\":%d,\"dispatch_bytes_to_peer\":%.0f,\"combine_bytes_to_peer\":%.0f,"
           "\"dispatch_ms\":%.2f,\"combine_ms\":%.2f,\"dispatch_mb_s\":%.1f,\"combine_mb_s\":%.1f}",
           g->bw_tokens, bytes, cbytes, o->bw_dispatch_s * 1e3, o->bw_combine_s * 1e3,
           o->bw_dispatch_s > 0 ? bytes / o->bw_dispatch_s / 1e6 : 0.0,
           o->bw_combine_s > 0 ? cbytes / o->bw_combine_s / 1e6 : 0.0);
    if (!strcmp(g->transport, "ucx") && o->bw_msg_bytes > 0) {
        double lat_us = 0, bw = 0, dummy = 0;
        int have_lat = perftest(g->tls, "tag_lat", 8, g->quick ? 1000 : 10000, 13331, &lat_us, &dummy);
        int have_bw = perftest(g->tls, "tag_bw", o->bw_msg_bytes, g->quick ? 5 : 20, 13332, &dummy, &bw);
        printf(",\"ucx_perftest\":{");
        if (have_lat)
            printf("\"tag_lat_us\":%.2f,\"round_trip_us\":%.2f,\"dispatch1_over_round_trip\":%.2f", lat_us, 2 * lat_us,
                   o->dispatch_us[0] / (2 * lat_us));
        if (have_bw)
            printf("%s\"tag_bw_mb_s\":%.1f,\"msg_bytes\":%lld,\"dispatch_bw_fraction\":%.3f", have_lat ? "," : "", bw,
                   (long long)o->bw_msg_bytes, bw > 0 && o->bw_dispatch_s > 0 ? bytes / o->bw_dispatch_s / 1e6 / bw : 0.0);
        if (!have_lat && !have_bw) printf("\"error\":\"ucx_perftest did not run (ucx-utils installed?)\"");
        printf("}");
    }
    printf("}");
}

/* Rank 1 in a child, rank 0 here. */
static int run_group(bench_cfg *g, bench_out *o) {
    snprintf(g->dir, sizeof g->dir, "/tmp/moeq-bench-ep-XXXXXX");
    if (!mkdtemp(g->dir)) return snprintf(o->err, sizeof o->err, "mkdtemp failed"), 1;
    if (g->tls[0]) setenv("UCX_TLS", g->tls, 1);
    pid_t child = -1;
    if (g->n_ranks == 2) {
        fflush(NULL);
        child = fork();
        if (child == 0) {
            bench_out mine;
            memset(&mine, 0, sizeof mine);
            moeq_err e = run_rank(g, 1, &mine);
            if (e) fprintf(stderr, "bench-ep rank 1: %s\n", mine.err);
            _exit(e ? 1 : 0);
        }
    }
    moeq_err e = run_rank(g, 0, o);
    int status = 0;
    if (child > 0) waitpid(child, &status, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g->dir);
    if (system(cmd) != 0) fprintf(stderr, "bench-ep: could not remove %s\n", g->dir);
    unsetenv("UCX_TLS");
    return e || (child > 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

int main(int argc, char **argv) {
    bench_cfg base = {.hidden = 7168, .bw_tokens = 256, .n_ranks = 1};
    char tls_list[128] = "tcp,posix";
    strcpy(base.payload, "f32");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) base.quick = 1, base.bw_tokens = 128;
        else if (!strcmp(argv[i], "--tls") && i + 1 < argc) snprintf(tls_list, sizeof tls_list, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--payload") && i + 1 < argc) snprintf(base.payload, sizeof base.payload, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) base.hidden = atoi(argv[++i]);
        else return fprintf(stderr, "usage: bench-ep [--tls tcp,posix] [--payload f32|bf16|fp8] [--hidden H] [--quick]\n"), 2;
    }
    printf("{\"bench\":\"ep\",\"hidden\":%d,\"experts\":%d,\"top_k\":%d,\"payload\":\"%s\",\"runs\":[", base.hidden,
           EXPERTS, TOP_K, base.payload);
    int first = 1, rc = 0;
    bench_cfg g = base;
    strcpy(g.transport, "local");
    bench_out o;
    memset(&o, 0, sizeof o);
    if (run_group(&g, &o)) fprintf(stderr, "bench-ep local: %s\n", o.err), rc = 1;
    else print_run(&g, &o, first), first = 0;
    for (char *save = NULL, *tls = strtok_r(tls_list, ",", &save); tls; tls = strtok_r(NULL, ",", &save)) {
        g = base, g.n_ranks = 2;
        strcpy(g.transport, "ucx");
        snprintf(g.tls, sizeof g.tls, "%s", tls);
        memset(&o, 0, sizeof o);
        if (run_group(&g, &o)) {
            fprintf(stderr, "bench-ep ucx/%s: %s\n", tls, o.err[0] ? o.err : "a rank failed");
            rc = 1;
            continue;
        }
        print_run(&g, &o, first), first = 0;
        fflush(stdout);
    }
    printf("]}\n");
    return rc;
}
