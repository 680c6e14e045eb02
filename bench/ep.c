/*
 * bench/ep.c — bench-ep: dispatch and combine latency (1, 8, 32, 128 tokens per
 * rank) and bandwidth at a large payload, for each transport available (local;
 * ucx over each UCX_TLS asked for, 2 ranks as 2 processes on this host), beside
 * UCX's own ucx_perftest (tag_lat, tag_bw) on the same transport in the same
 * run. Prints one JSON object. Rows are DeepSeek-V3's (hidden 7168, 256 experts,
 * top-8) unless told otherwise.
 *
 * usage: bench-ep [--tls tcp,posix,sysv] [--payload f32|bf16|fp8] [--hidden H] [--quick]
 *        bench-ep --decode MODEL_DIR [--ranks 2] [--batch B] [--steps N] [--tls tcp]
 *
 * --decode: decode tokens/s of an expert-parallel group of engines (ranks
 * processes, one compute thread each, B sequences each, identity placement)
 * against one process running all ranks x B sequences with `ranks` threads,
 * and the peak RSS of each (VmHWM: a rank maps only its experts).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moeq/engine.h"
#include "moeq/ep.h"
#include "moeq/util.h"
#include "stats.h"

enum { N_LAT = 4, LAT_MAX_T = 128, EXPERTS = 256, TOP_K = 8 };
static const int lat_tokens[N_LAT] = {1, 8, 32, 128};

typedef struct bench_cfg {
    int hidden, bw_tokens, quick, n_ranks;
    char payload[8], transport[16], tls[64], dir[64];
} bench_cfg;

typedef struct bench_out {
    double dispatch_us[N_LAT], combine_us[N_LAT], rows_us[N_LAT], combine_rows_us[N_LAT];
    double bw_dispatch_s, bw_combine_s; /* seconds per exchange at bw_tokens */
    double bw_rows_s;                   /* moeq_ep_dispatch_rows at bw_tokens: no per-slot copy */
    double bw_combine_rows_s;           /* moeq_ep_combine_rows at bw_tokens: no copy out (what the engine runs) */
    int64_t bw_remote_rows;             /* token rows this rank sent to the other rank per dispatch */
    int64_t bw_remote_slots;            /* slots among them (one metadata entry, one combine row each) */
    int64_t bw_msg_bytes;               /* bytes of the dispatch message to the peer (rows + meta) */
    int64_t bw_combine_bytes;           /* bytes of the combine message back (one row per slot)    */
    int64_t lat1_msg_bytes;             /* bytes of the 1-token dispatch message to the peer        */
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

/*
 * Median seconds of dispatch, of combine, and of dispatch_rows (the same
 * exchange without the per-slot copy into expert groups) over iters rounds of
 * each, after a few warm-up rounds. The "expert" is the identity.
 */
static moeq_err time_rounds(moeq_ep *ep, int64_t T, int H, int iters, const int32_t *ids, const float *x, float *y,
                            float *out, double *d_s, double *c_s, double *r_s, double *cr_s, char *err, size_t n) {
    double *d = malloc((size_t)iters * sizeof(double)), *c = malloc((size_t)iters * sizeof(double));
    double *rw = malloc((size_t)iters * sizeof(double)), *cr = malloc((size_t)iters * sizeof(double));
    const float **rows = malloc((size_t)(T > 0 ? T : 1) * TOP_K * sizeof(*rows));
    moeq_err e = d && c && rw && cr && rows ? MOEQ_OK : MOEQ_ERR_NOMEM;
    for (int i = -3; i < iters && !e; i++) {
        moeq_ep_recv r;
        int64_t t0 = moeq_mono_ns();
        if ((e = moeq_ep_dispatch(ep, T, ids, x, &r, err, n))) break;
        int64_t t1 = moeq_mono_ns();
        memcpy(y, r.x, (size_t)r.n_rows * H * sizeof(float));
        int64_t t2 = moeq_mono_ns();
        if ((e = moeq_ep_combine(ep, y, out, err, n))) break;
        int64_t t3 = moeq_mono_ns();
        if ((e = moeq_ep_dispatch_rows(ep, T, ids, x, &r, err, n))) break;
        int64_t t4 = moeq_mono_ns();
        for (int64_t p = 0; p < r.n_rows; p++) memcpy(y + p * H, r.row[p], (size_t)H * sizeof(float));
        int64_t t5 = moeq_mono_ns();
        if ((e = moeq_ep_combine_rows(ep, y, rows, err, n))) break;
        int64_t t6 = moeq_mono_ns();
        if (i >= 0) d[i] = (double)(t1 - t0) / 1e9, c[i] = (double)(t3 - t2) / 1e9, rw[i] = (double)(t4 - t3) / 1e9;
        if (i >= 0) cr[i] = (double)(t6 - t5) / 1e9;
    }
    if (!e) *d_s = bench_median_sort(d, iters), *c_s = bench_median_sort(c, iters), *r_s = bench_median_sort(rw, iters),
                *cr_s = bench_median_sort(cr, iters);
    free(d), free(c), free(rw), free(cr), free((void *)rows);
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

static size_t wire_row_bytes(const bench_cfg *g) {
    int H = g->hidden;
    return !strcmp(g->payload, "fp8")    ? (size_t)H + 4 * (size_t)((H + 127) / 128)
           : !strcmp(g->payload, "bf16") ? (size_t)H * 2 : (size_t)H * 4;
}

/*
 * Rank `rank`'s traffic to its peer in a round of T tokens from seed (pure:
 * the layout of its inputs on the identity placement): distinct token rows
 * and slots; returns the dispatch message's bytes (24-byte header, 8 bytes a
 * slot, one row a token). Known before anything runs, so ucx_perftest can
 * measure the same sizes before and after.
 */
static int64_t traffic(const bench_cfg *g, int rank, int T, uint64_t seed, int64_t *rows, int64_t *slots) {
    int peer = g->n_ranks == 2 ? 1 - rank : 0; /* local: rows to self */
    int32_t *ids = malloc((size_t)T * TOP_K * 4), *dr = malloc((size_t)T * TOP_K * 4), *dl = malloc((size_t)T * TOP_K * 4);
    float *x = malloc((size_t)T * g->hidden * sizeof(float));
    moeq_ep_placement *pl = NULL;
    int64_t count[2] = {0, 0}, toks = 0;
    if (ids && dr && dl && x && !moeq_ep_placement_new_identity(EXPERTS, g->n_ranks, &pl, NULL, 0)) {
        inputs(seed + (uint64_t)rank, T, g->hidden, ids, x);
        moeq_ep_layout(pl, rank, T, TOP_K, ids, dr, dl, count, NULL, 0);
        for (int t = 0; t < T; t++) {
            int any = 0;
            for (int k = 0; k < TOP_K; k++) any |= dr[t * TOP_K + k] == peer;
            toks += any;
        }
    }
    moeq_ep_placement_destroy(pl);
    free(ids), free(dr), free(dl), free(x);
    *rows = toks, *slots = count[peer];
    return 24 + toks * (int64_t)wire_row_bytes(g) + count[peer] * 8;
}

static void bw_traffic(const bench_cfg *g, int rank, bench_out *o) {
    o->bw_msg_bytes = traffic(g, rank, g->bw_tokens, 99, &o->bw_remote_rows, &o->bw_remote_slots);
    o->bw_combine_bytes = o->bw_remote_slots * (int64_t)wire_row_bytes(g);
    int64_t rows, slots;
    o->lat1_msg_bytes = traffic(g, rank, 1, 77, &rows, &slots);
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
                        &o->combine_us[i], &o->rows_us[i], &o->combine_rows_us[i], o->err, sizeof o->err);
        o->dispatch_us[i] *= 1e6, o->combine_us[i] *= 1e6, o->rows_us[i] *= 1e6, o->combine_rows_us[i] *= 1e6;
    }
    if (!e) e = moeq_ep_barrier(ep, o->err, sizeof o->err);
    moeq_ep_destroy(ep), ep = NULL;
    if (!e) e = open_ep(g, "bandwidth", rank, g->bw_tokens, &ep, o->err, sizeof o->err);
    if (!e) {
        inputs(99 + (uint64_t)rank, g->bw_tokens, H, ids, x);
        e = time_rounds(ep, g->bw_tokens, H, g->quick ? 5 : 20, ids, x, y, out, &o->bw_dispatch_s, &o->bw_combine_s,
                        &o->bw_rows_s, &o->bw_combine_rows_s, o->err, sizeof o->err);
        if (!e) e = moeq_ep_barrier(ep, o->err, sizeof o->err);
    }
    bw_traffic(g, rank, o);
    moeq_ep_destroy(ep);
    free(ids), free(x), free(y), free(out);
    return e;
}

/* ---- ucx_perftest beside it -------------------------------------------- */

/* The eager/rendezvous switch ep_ucx.c sets for itself: perftest runs under the same UCX configuration. */
#define BENCH_RNDV_THRESH "65536"

/*
 * One ucx_perftest pair (server in the background, client here): *out = column `column` (1-based) of the
 * client's "Final:" line (3: typical latency, us; 5: average bandwidth, MB/s). 0 when it did not run.
 */
static int perftest(const char *tls, const char *test, int64_t size, int iters, int port, int column, double *out) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "export UCX_RNDV_THRESH=${UCX_RNDV_THRESH:-%s}; "
             "UCX_TLS=%s ucx_perftest -p %d -t %s -s %lld -n %d >/dev/null 2>&1 & srv=$!; sleep 0.5; "
             "UCX_TLS=%s ucx_perftest 127.0.0.1 -p %d -t %s -s %lld -n %d 2>/dev/null | grep '^Final:'; wait $srv",
             BENCH_RNDV_THRESH,
             tls, port, test, (long long)size, iters, tls, port, test, (long long)size, iters);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    char line[512] = "";
    int ok = fgets(line, sizeof line, f) != NULL;
    pclose(f);
    double v[8] = {0};
    ok = ok && sscanf(line, "Final: %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 6;
    if (ok) *out = v[column - 1];
    return ok;
}

/*
 * Two tag_bw pairs at once, the traffic of one 2-rank exchange: an exchange
 * moves msg_bytes each way at the same time, tag_bw one way. Both servers
 * start in the background, then both clients together. Pinned (-c): flow 0's
 * server (its receiver) and flow 1's client (its sender) on CPU 0, the other
 * two on CPU 1, so each CPU holds one sender and one receiver, as each rank
 * of an exchange does. Unpinned, the scheduler may put both ends of a flow on
 * one CPU, and busy-polling shared memory then moves data only when a time
 * slice ends (35-230 MB/s a flow, measured on the 2-CPU development machine).
 * flow[i] = client i's overall MB/s (column 6: a run that spans perftest's
 * one-second reports has only the last interval in column 5). 0: did not run
 * (or ran past 20 s: timeout kills it). The servers get 1 s to start
 * listening: with 0.5 s one run on the loaded 2-CPU machine came back without
 * a result (a client refused is the likeliest cause; not confirmed).
 */
static int perftest_two_flows(const char *tls, int64_t size, int iters, double flow[2]) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "export UCX_RNDV_THRESH=${UCX_RNDV_THRESH:-%s} UCX_TLS=%s; t='-t tag_bw -s %lld -n %d'; "
             "timeout 20 ucx_perftest -p 13334 $t -c 0 >/dev/null 2>&1 & "
             "timeout 20 ucx_perftest -p 13335 $t -c 1 >/dev/null 2>&1 & sleep 1; "
             "timeout 20 ucx_perftest 127.0.0.1 -p 13334 $t -c 1 2>/dev/null | grep '^Final:' & "
             "timeout 20 ucx_perftest 127.0.0.1 -p 13335 $t -c 0 2>/dev/null | grep '^Final:' & wait",
             BENCH_RNDV_THRESH, tls, (long long)size, iters);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    char line[512];
    int got = 0;
    while (got < 2 && fgets(line, sizeof line, f)) {
        double v[6];
        if (sscanf(line, "Final: %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 6)
            flow[got++] = v[5];
    }
    pclose(f);
    if (got < 2) flow[0] = flow[1] = 0;
    return got == 2;
}

/* ucx_perftest on the run's UCX_TLS, before and after bench-ep's own rounds. */
typedef struct perf_pair {
    double lat_us[2], bw_mb_s[2]; /* [0] before, [1] after; 0: did not run */
    double lat1_us[2];            /* tag_lat at the 1-token dispatch message's size */
    double two[2][2];             /* two tag_bw flows at once, pinned: [before, after][flow] */
} perf_pair;

static void perf_measure(const bench_cfg *g, const bench_out *o, perf_pair *pp, int when) {
    int64_t bw_bytes = o->bw_msg_bytes;
    if (!perftest(g->tls, "tag_lat", 8, g->quick ? 1000 : 10000, 13331, 3, &pp->lat_us[when])) pp->lat_us[when] = 0;
    if (!perftest(g->tls, "tag_lat", o->lat1_msg_bytes, g->quick ? 1000 : 10000, 13333, 3, &pp->lat1_us[when]))
        pp->lat1_us[when] = 0;
    if (!perftest(g->tls, "tag_bw", bw_bytes, g->quick ? 10 : 50, 13332, 5, &pp->bw_mb_s[when])) pp->bw_mb_s[when] = 0;
    /*
     * Flows that do not overlap measure one flow each: iterations for ~0.6 s (0.2 quick) at the one-flow rate
     * just measured, so the clients' start skew (a few ms) is small beside the run.
     */
    double secs = g->quick ? 0.2 : 0.6, one = pp->bw_mb_s[when] > 0 ? pp->bw_mb_s[when] : 1000;
    int iters = (int)(one * 1e6 * secs / (double)bw_bytes);
    iters = iters < 20 ? 20 : iters > 20000 ? 20000 : iters;
    perftest_two_flows(g->tls, bw_bytes, iters, pp->two[when]);
}

static double best(const double v[2], int lowest) {
    if (!v[0] || !v[1]) return v[0] ? v[0] : v[1];
    return lowest ? (v[0] < v[1] ? v[0] : v[1]) : (v[0] > v[1] ? v[0] : v[1]);
}

/* The two-flow anchor: per-flow mean and sum, before and after; fractions of the better mean. */
static void print_two_flows(const bench_out *o, const perf_pair *pp) {
    const double(*f)[2] = pp->two;
    double mb = (double)o->bw_msg_bytes / 1e6, mean[2] = {(f[0][0] + f[0][1]) / 2, (f[1][0] + f[1][1]) / 2};
    double top = best(mean, 0);
    printf(",\"tag_bw_two_flows_mb_s\":{\"pinned\":true,\"per_flow\":[%.1f,%.1f],\"sum\":[%.1f,%.1f],"
           "\"flows\":[[%.1f,%.1f],[%.1f,%.1f]]}", mean[0], mean[1], 2 * mean[0], 2 * mean[1], f[0][0], f[0][1], f[1][0], f[1][1]);
    if (top > 0 && o->bw_dispatch_s > 0 && o->bw_rows_s > 0)
        printf(",\"tag_bw_two_flows_best_mb_s\":%.1f,\"dispatch_bw_fraction_two_flows\":%.3f,"
               "\"dispatch_rows_bw_fraction_two_flows\":%.3f", top, mb / o->bw_dispatch_s / top, mb / o->bw_rows_s / top);
    double cmb = (double)o->bw_combine_bytes / 1e6;
    if (top > 0 && o->bw_combine_s > 0 && o->bw_combine_rows_s > 0)
        printf(",\"combine_bw_fraction_two_flows\":%.3f,\"combine_rows_bw_fraction_two_flows\":%.3f",
               cmb / o->bw_combine_s / top, cmb / o->bw_combine_rows_s / top);
}

static void print_perftest(const bench_out *o, const perf_pair *pp) {
    double lat = best(pp->lat_us, 1), lat1 = best(pp->lat1_us, 1), bw = best(pp->bw_mb_s, 0);
    double mb = (double)o->bw_msg_bytes / 1e6;
    printf(",\"ucx_perftest\":{\"tag_lat_us\":[%.2f,%.2f],\"tag_lat1_us\":[%.2f,%.2f],\"lat1_msg_bytes\":%lld,"
           "\"tag_bw_mb_s\":[%.1f,%.1f],\"msg_bytes\":%lld", pp->lat_us[0], pp->lat_us[1], pp->lat1_us[0],
           pp->lat1_us[1], (long long)o->lat1_msg_bytes, pp->bw_mb_s[0], pp->bw_mb_s[1], (long long)o->bw_msg_bytes);
    if (lat > 0)
        printf(",\"round_trip_us\":%.2f,\"dispatch1_over_round_trip\":%.2f,\"dispatch_rows1_over_round_trip\":%.2f",
               2 * lat, o->dispatch_us[0] / (2 * lat), o->rows_us[0] / (2 * lat));
    if (lat1 > 0)
        printf(",\"round_trip1_us\":%.2f,\"dispatch1_over_round_trip1\":%.2f", 2 * lat1, o->dispatch_us[0] / (2 * lat1));
    if (bw > 0 && o->bw_dispatch_s > 0 && o->bw_rows_s > 0)
        printf(",\"tag_bw_best_mb_s\":%.1f,\"dispatch_bw_fraction\":%.3f,\"dispatch_rows_bw_fraction\":%.3f", bw,
               mb / o->bw_dispatch_s / bw, mb / o->bw_rows_s / bw);
    print_two_flows(o, pp);
    if (!lat && !bw) printf(",\"error\":\"ucx_perftest did not run (ucx-utils installed?)\"");
    printf("}");
}

/* How each figure is computed, once per output. */
static void print_method(void) {
    printf("\"method\":{\"latency\":\"median over rounds of one rank-0 call, 2 ranks (forked) in lockstep; "
           "dispatch = moeq_ep_dispatch (exchange + per-slot copy into expert groups), dispatch_rows = "
           "moeq_ep_dispatch_rows (the exchange, rows left where they arrived); combine = moeq_ep_combine (exchange + "
           "each slot's row copied out), combine_rows = moeq_ep_combine_rows (the exchange, rows left where they "
           "arrived: what the engine runs on the CPU)\","
           "\"bandwidth\":\"msg_bytes (rank 0's dispatch message to its peer: 24-byte header, 8 bytes a slot, one row "
           "a distinct token; f32 rows sent apart from x as a span also carry the span's few gap rows, not counted) / "
           "median seconds of one call at tokens_per_rank\","
           "\"ucx_perftest\":\"tag_lat (8 bytes, and tag_lat1 at lat1_msg_bytes, the 1-token dispatch message; round "
           "trip = 2 x the one-way average) and tag_bw (msg_bytes, average MB/s) on the same UCX_TLS and "
           "UCX_RNDV_THRESH (65536 unless set, as the ep transport), run just before and just after bench-ep's "
           "rounds ([before, after]); "
           "fractions use the better of the two (higher bandwidth, lower latency)\","
           "\"ucx_perftest_two_flows\":\"an exchange moves msg_bytes both ways at once (each rank sends one message and "
           "receives one), tag_bw one way; so two tag_bw pairs run at once (both servers, then both clients together; "
           "same UCX_TLS, UCX_RNDV_THRESH and msg_bytes; ~0.6 s at the one-flow rate), before and after the rounds: "
           "per_flow = the mean of the two clients' overall MB/s, sum = twice it. Pinned with -c: each of CPUs 0 and 1 "
           "holds one flow's sender and the other flow's receiver, as each rank of an exchange does (unpinned, "
           "the scheduler can put both ends of a flow on one CPU). Four busy-polling perftest processes share the "
           "CPUs where the exchange has two ranks, so on a 2-CPU host this anchor is pessimistic. "
           "*_fraction_two_flows = the dispatch's MB/s / the better per_flow\"},");
}

static void print_run(const bench_cfg *g, const bench_out *o, const perf_pair *pp, int first) {
    printf("%s{\"transport\":\"%s\"", first ? "" : ",", g->transport);
    if (g->tls[0]) printf(",\"tls\":\"%s\"", g->tls);
    printf(",\"ranks\":%d,\"latency\":[", g->n_ranks);
    for (int i = 0; i < N_LAT; i++)
        printf("%s{\"tokens_per_rank\":%d,\"dispatch_us\":%.1f,\"dispatch_rows_us\":%.1f,\"combine_us\":%.1f,"
               "\"combine_rows_us\":%.1f}", i ? "," : "", lat_tokens[i], o->dispatch_us[i], o->rows_us[i],
               o->combine_us[i], o->combine_rows_us[i]);
    double mb = (double)o->bw_msg_bytes / 1e6, cmb = (double)o->bw_combine_bytes / 1e6;
    printf("],\"bandwidth\":{\"tokens_per_rank\":%d,\"dispatch_bytes_to_peer\":%lld,\"combine_bytes_to_peer\":%lld,"
           "\"dispatch_ms\":%.2f,\"dispatch_rows_ms\":%.2f,\"combine_ms\":%.2f,\"dispatch_mb_s\":%.1f,"
           "\"dispatch_rows_mb_s\":%.1f,\"combine_mb_s\":%.1f,\"combine_rows_ms\":%.2f,\"combine_rows_mb_s\":%.1f}",
           g->bw_tokens, (long long)o->bw_msg_bytes, (long long)o->bw_combine_bytes, o->bw_dispatch_s * 1e3,
           o->bw_rows_s * 1e3, o->bw_combine_s * 1e3, o->bw_dispatch_s > 0 ? mb / o->bw_dispatch_s : 0.0,
           o->bw_rows_s > 0 ? mb / o->bw_rows_s : 0.0, o->bw_combine_s > 0 ? cmb / o->bw_combine_s : 0.0,
           o->bw_combine_rows_s * 1e3, o->bw_combine_rows_s > 0 ? cmb / o->bw_combine_rows_s : 0.0);
    if (pp) print_perftest(o, pp);
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

/* ---- --decode: a group of engines against one process ------------------- */

typedef struct decode_cfg {
    const char *model;
    int ranks, batch, steps, rank, threads; /* rank -1: one process, all ranks' sequences */
    char tls[64], dir[64];
} decode_cfg;

typedef struct decode_out {
    double seconds; /* the timed decode steps */
    long peak_rss_kb, rss_file_kb;
    char err[512];
} decode_out;

static long status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, n)) kb = atol(line + n + 1);
    if (f) fclose(f);
    return kb;
}

/* Sequences with 16-token prompts, one warm-up step, then `steps` decode steps of every sequence, timed. */
static moeq_err decode_steps(moeq_engine *e, int n_seq, int vocab, int steps, double *seconds, char *err, size_t n) {
    moeq_step_item *it = calloc((size_t)n_seq, sizeof *it);
    int32_t *tok = calloc((size_t)n_seq * 16, sizeof *tok);
    float *logits = malloc((size_t)n_seq * vocab * sizeof(float));
    moeq_err rc = it && tok && logits ? MOEQ_OK : MOEQ_ERR_NOMEM;
    for (int s = 0; s < n_seq && !rc; s++) {
        for (int k = 0; k < 16; k++) tok[s * 16 + k] = (int32_t)((s * 131 + k * 17 + 3) % vocab);
        int seq;
        if (!(rc = moeq_engine_seq_new(e, &seq))) it[s] = (moeq_step_item){seq, tok + s * 16, 16, 0};
    }
    if (!rc) rc = moeq_engine_step(e, it, n_seq, logits, (size_t)n_seq, err, n); /* prefill */
    int64_t t0 = 0;
    for (int step = 0; step <= steps && !rc; step++) {
        if (step == 1) t0 = moeq_mono_ns(); /* step 0 warms up */
        for (int s = 0; s < n_seq; s++) it[s].tokens = tok + s * 16 + (step % 16), it[s].n_tokens = 1;
        rc = moeq_engine_step(e, it, n_seq, logits, (size_t)n_seq, err, n);
    }
    *seconds = (double)(moeq_mono_ns() - t0) / 1e9;
    free(it), free(tok), free(logits);
    return rc;
}

static moeq_err decode_run(const decode_cfg *g, decode_out *o) {
    moeq_model *m = NULL;
    moeq_engine *e = NULL;
    moeq_ep *ep = NULL;
    int n_seq = g->rank < 0 ? g->ranks * g->batch : g->batch;
    moeq_err rc = moeq_model_load(g->model, NULL, &m, o->err, sizeof o->err);
    moeq_engine_params p = moeq_engine_default_params();
    p.n_threads = g->threads, p.max_seqs = n_seq, p.max_step_tokens = n_seq * 16, p.kv_cache_tokens = n_seq * 64;
    if (!rc) rc = moeq_engine_new(m, &p, &e, o->err, sizeof o->err);
    if (!rc && g->rank >= 0) {
        moeq_ep_params base = moeq_ep_default_params(), ep_p;
        strcpy(base.transport, "ucx");
        base.rank = g->rank, base.n_ranks = g->ranks, base.timeout_ms = 120000;
        moeq_ep_rendezvous rv = moeq_ep_rendezvous_dir(g->dir);
        rc = moeq_engine_ep_params(e, &base, &ep_p, o->err, sizeof o->err);
        if (!rc) rc = moeq_ep_new(&ep_p, NULL, &rv, &ep, o->err, sizeof o->err);
        if (!rc) rc = moeq_engine_join_group(e, ep, &ep_p, o->err, sizeof o->err);
    }
    int vocab = m ? moeq_model_get_config(m)->vocab_size : 0;
    if (!rc) rc = decode_steps(e, n_seq, vocab, g->steps, &o->seconds, o->err, sizeof o->err);
    if (!rc && ep) rc = moeq_ep_barrier(ep, o->err, sizeof o->err);
    o->peak_rss_kb = status_kb("VmHWM:"), o->rss_file_kb = status_kb("RssFile:");
    moeq_engine_destroy(e);
    moeq_ep_destroy(ep);
    moeq_model_destroy(m);
    return rc;
}

/* Each run in children of its own (a fresh RSS); results come back through a pipe. */
static int decode_fork(decode_cfg g, int n, decode_out *out) {
    int fd[2];
    if (pipe(fd)) return 1;
    pid_t pid[8];
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        if ((pid[r] = fork()) == 0) {
            close(fd[0]);
            decode_cfg mine = g;
            if (n > 1) mine.rank = r;
            decode_out o;
            memset(&o, 0, sizeof o);
            moeq_err e = decode_run(&mine, &o);
            if (e) fprintf(stderr, "bench-ep --decode rank %d: %s\n", mine.rank, o.err);
            struct { int r; decode_out o; } msg = {r, o};
            ssize_t w = write(fd[1], &msg, sizeof msg);
            _exit(e || w != (ssize_t)sizeof msg ? 1 : 0);
        }
    }
    close(fd[1]);
    int bad = 0, status;
    for (int r = 0; r < n; r++) {
        struct { int r; decode_out o; } msg;
        if (read(fd[0], &msg, sizeof msg) == (ssize_t)sizeof msg && msg.r >= 0 && msg.r < n) out[msg.r] = msg.o;
        else bad = 1;
    }
    close(fd[0]);
    for (int r = 0; r < n; r++)
        bad |= waitpid(pid[r], &status, 0) != pid[r] || !WIFEXITED(status) || WEXITSTATUS(status);
    return bad;
}

static int decode_main(decode_cfg g) {
    decode_out one, ranks[8];
    memset(ranks, 0, sizeof ranks);
    g.rank = -1, g.threads = g.ranks;
    if (decode_fork(g, 1, &one)) return 1;
    snprintf(g.dir, sizeof g.dir, "/tmp/moeq-bench-epd-XXXXXX");
    if (!mkdtemp(g.dir)) return 1;
    if (g.tls[0]) setenv("UCX_TLS", g.tls, 1);
    g.rank = 0, g.threads = 1;
    int bad = decode_fork(g, g.ranks, ranks);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g.dir);
    if (system(cmd) != 0) fprintf(stderr, "bench-ep: could not remove %s\n", g.dir);
    if (bad) return 1;
    double tokens = (double)g.ranks * g.batch * g.steps, slowest = 0;
    for (int r = 0; r < g.ranks; r++) slowest = ranks[r].seconds > slowest ? ranks[r].seconds : slowest;
    printf("{\"bench\":\"ep-decode\",\"model\":\"%s\",\"ranks\":%d,\"batch_per_rank\":%d,\"steps\":%d,\"tls\":\"%s\",",
           g.model, g.ranks, g.batch, g.steps, g.tls);
    printf("\"one_process\":{\"threads\":%d,\"batch\":%d,\"tokens_per_s\":%.2f,\"peak_rss_mb\":%.1f,"
           "\"rss_file_mb\":%.1f},",
           g.ranks, g.ranks * g.batch, tokens / one.seconds, one.peak_rss_kb / 1024.0, one.rss_file_kb / 1024.0);
    printf("\"group\":{\"threads_per_rank\":1,\"tokens_per_s\":%.2f,\"ranks\":[", tokens / slowest);
    for (int r = 0; r < g.ranks; r++)
        printf("%s{\"rank\":%d,\"seconds\":%.3f,\"peak_rss_mb\":%.1f,\"rss_file_mb\":%.1f}", r ? "," : "", r,
               ranks[r].seconds, ranks[r].peak_rss_kb / 1024.0, ranks[r].rss_file_kb / 1024.0);
    printf("]},\"group_over_one_process\":%.3f}\n", one.seconds / slowest);
    return 0;
}

int main(int argc, char **argv) {
    bench_cfg base = {.hidden = 7168, .bw_tokens = 256, .n_ranks = 1};
    char tls_list[128] = "tcp,posix";
    strcpy(base.payload, "f32");
    decode_cfg dc = {.ranks = 2, .batch = 4, .steps = 32, .tls = "tcp"};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--decode") && i + 1 < argc) dc.model = argv[++i];
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) dc.ranks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) dc.batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) dc.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) base.quick = 1, base.bw_tokens = 128;
        else if (!strcmp(argv[i], "--tls") && i + 1 < argc) snprintf(tls_list, sizeof tls_list, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--payload") && i + 1 < argc) snprintf(base.payload, sizeof base.payload, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) base.hidden = atoi(argv[++i]);
        else
            return fprintf(stderr, "usage: bench-ep [--tls tcp,posix] [--payload f32|bf16|fp8] [--hidden H] [--quick]\n"
                                   "       bench-ep --decode MODEL_DIR [--ranks 2] [--batch B] [--steps N] [--tls tcp]\n"),
                   2;
    }
    if (dc.model) {
        if (dc.ranks < 1 || dc.ranks > 8 || dc.batch < 1 || dc.steps < 1)
            return fprintf(stderr, "bench-ep: --ranks 1..8, --batch and --steps >= 1\n"), 2;
        snprintf(dc.tls, sizeof dc.tls, "%s", strchr(tls_list, ',') ? "tcp" : tls_list);
        return decode_main(dc);
    }
    printf("{\"bench\":\"ep\",\"hidden\":%d,\"experts\":%d,\"top_k\":%d,\"payload\":\"%s\",", base.hidden, EXPERTS,
           TOP_K, base.payload);
    print_method();
    printf("\"runs\":[");
    int first = 1, rc = 0;
    bench_cfg g = base;
    strcpy(g.transport, "local");
    bench_out o;
    memset(&o, 0, sizeof o);
    if (run_group(&g, &o)) fprintf(stderr, "bench-ep local: %s\n", o.err), rc = 1;
    else print_run(&g, &o, NULL, first), first = 0;
    for (char *save = NULL, *tls = strtok_r(tls_list, ",", &save); tls; tls = strtok_r(NULL, ",", &save)) {
        g = base, g.n_ranks = 2;
        strcpy(g.transport, "ucx");
        snprintf(g.tls, sizeof g.tls, "%s", tls);
        memset(&o, 0, sizeof o);
        perf_pair pp;
        memset(&pp, 0, sizeof pp);
        bw_traffic(&g, 0, &o);
        perf_measure(&g, &o, &pp, 0);
        if (run_group(&g, &o)) {
            fprintf(stderr, "bench-ep ucx/%s: %s\n", tls, o.err[0] ? o.err : "a rank failed");
            rc = 1;
            continue;
        }
        perf_measure(&g, &o, &pp, 1);
        print_run(&g, &o, &pp, first), first = 0;
        fflush(stdout);
    }
    printf("]}\n");
    return rc;
}
