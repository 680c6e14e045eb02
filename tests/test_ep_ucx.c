/*
 * test_ep_ucx.c — the UCX transport with 1-4 ranks as forked processes on one
 * host, over TCP loopback (UCX_TLS=tcp) and shared memory (UCX_TLS=posix,sysv):
 * the per-slot rows after dispatch (and dispatch_rows) → expert → combine equal, bit for bit, the
 * one-process local transport's, for identity, permuted and replicated
 * placements, F32, BF16 and FP8 payloads, with a rank that has zero tokens. Then
 * faults: a rank killed with -9, or stopped, fails the survivors' exchange
 * within ep.timeout_ms with an error naming it; a rank whose dispatch message
 * is malformed (cut short, counts that do not match its bytes, out of range)
 * fails the receivers' dispatch with MOEQ_ERR_FORMAT naming it. The same with
 * f32 rows sent apart from x in the second exchange (forced at these small
 * sizes): the same bits, and rows one short fail the receivers naming the
 * sender. Skipped (77) without UCX.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ep_int.h"
#include "ep_test_util.h"
#include "moeq/ep.h"
#include "moeq/util.h"

enum { E = 16, H = 32, MAXT = 24, K = 4, ROUNDS = 3 };

typedef enum placement_kind { IDENTITY, PERMUTED, REPLICATED } placement_kind;

typedef struct group_cfg {
    const char *tls;
    int n_ranks;
    placement_kind placement;
    const char *payload;
    int victim;        /* rank that dies (SIGKILL) or stops (SIGSTOP) before round 1; -1: none */
    int victim_signal;
    int timeout_ms;
    char dir[64];
    int late_ms;       /* rank 0 starts round 1 this much later (0: on time) */
    int odd_rank;      /* > 0: this rank alone uses a permuted placement (a misconfigured group) */
    moeq_ep_mangle mangle; /* rank 1 malforms its round-1 dispatch messages this way */
    int apart;             /* 1: every f32 span to a peer goes apart from x (moeq_ep_test_apart_always) */
} group_cfg;

static moeq_err make_placement(const group_cfg *g, int rank, moeq_ep_placement **pl, char *err, size_t n) {
    if (g->odd_rank > 0 && rank == g->odd_rank) return moeq_ep_placement_new_permuted(E, g->n_ranks, 9, pl, err, n);
    switch (g->placement) {
    case PERMUTED: return moeq_ep_placement_new_permuted(E, g->n_ranks, 42, pl, err, n);
    case REPLICATED:
        if (g->n_ranks > 1) return moeq_ep_placement_new_replicated(E, g->n_ranks, 5, pl, err, n);
        /* fall through: one rank cannot hold a replica */
    case IDENTITY: break;
    }
    return moeq_ep_placement_new_identity(E, g->n_ranks, pl, err, n);
}

/* Tokens of round `round` on `rank`: the last rank has none in round 1. */
static int64_t tokens_of(const group_cfg *g, int rank, int round) {
    if (round == 1 && rank == g->n_ranks - 1 && g->n_ranks > 1) return 0;
    return round == 2 ? 1 : MAXT - rank;
}

static moeq_err last_code; /* the last failed round's error code */

static int check_round(const group_cfg *g, moeq_ep *ep, int rank, int round, char *err, size_t n) {
    static int32_t ids[MAXT * K];
    static float x[MAXT * H], y[4 * MAXT * K * H], out[MAXT * K * H], want[MAXT * K * H];
    int64_t T = tokens_of(g, rank, round);
    ept_inputs(1000 * (uint64_t)round + (uint64_t)rank, T, K, E, H, 1, ids, x);
    moeq_ep_params p = moeq_ep_default_params();
    p.n_experts = E, p.hidden = H, p.max_tokens = MAXT, p.top_k = K;
    snprintf(p.payload, sizeof p.payload, "%s", g->payload);
    if (ept_reference(&p, T, ids, x, want, err, n)) return 1;
    if ((last_code = ept_round(ep, T, ids, x, H, y, out, err, n))) return 2;
    if (memcmp(out, want, (size_t)T * K * H * sizeof(float)) != 0) {
        snprintf(err, n, "rank %d round %d: rows differ from the local transport's", rank, round);
        return 1;
    }
    /* the same round through dispatch_rows, the rows gathered here: the same bits */
    static float xs[4 * MAXT * K * H];
    moeq_ep_recv r;
    if ((last_code = moeq_ep_dispatch_rows(ep, T, ids, x, &r, err, n))) return 2;
    for (int64_t i = 0; i < r.n_rows; i++) memcpy(xs + i * H, r.row[i], H * sizeof(float));
    r.x = xs;
    ept_experts(&r, H, y);
    /* and combined through combine_rows (each slot's row where the transport left it): the same bits */
    static const float *rows[MAXT * K];
    if ((last_code = moeq_ep_combine_rows(ep, y, rows, err, n))) return 2;
    for (int64_t s = 0; s < (int64_t)T * K; s++)
        if (memcmp(rows[s], want + s * H, H * sizeof(float)) != 0) {
            snprintf(err, n, "rank %d round %d: dispatch_rows' and combine_rows' slot %lld differs from the local "
                     "transport's", rank, round, (long long)s);
            return 1;
        }
    return 0;
}

/* One rank's life in a forked child; the exit status is the verdict (0 ok). */
static int run_rank(const group_cfg *g, int rank) {
    char err[512] = "";
    setenv("UCX_TLS", g->tls, 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    moeq_ep_params p = moeq_ep_default_params();
    strcpy(p.transport, "ucx");
    p.rank = rank, p.n_ranks = g->n_ranks, p.n_experts = E, p.hidden = H, p.max_tokens = MAXT, p.top_k = K;
    p.timeout_ms = g->timeout_ms;
    snprintf(p.payload, sizeof p.payload, "%s", g->payload);
    moeq_ep_placement *pl = NULL;
    moeq_ep *ep = NULL;
    moeq_ep_rendezvous rv = moeq_ep_rendezvous_dir(g->dir);
    int rc = make_placement(g, rank, &pl, err, sizeof err) || moeq_ep_new(&p, pl, &rv, &ep, err, sizeof err) ? 3 : 0;
    if (!rc && g->apart) moeq_ep_test_apart_always(ep);
    int64_t t0 = 0;
    for (int round = 0; round < ROUNDS && !rc; round++) {
        if (round == 1 && rank == g->victim) raise(g->victim_signal);
        if (round == 1 && rank == 0 && g->late_ms)
            nanosleep(&(struct timespec){g->late_ms / 1000, (long)(g->late_ms % 1000) * 1000000L}, NULL);
        if (round == 1 && rank == 1 && g->mangle) {
            moeq_ep_test_mangle(ep, g->mangle);
            check_round(g, ep, rank, round, err, sizeof err); /* the others refuse it and leave: no verdict here */
            break;
        }
        t0 = moeq_mono_ns();
        rc = check_round(g, ep, rank, round, err, sizeof err);
    }
    if (rc == 0 && !ep) rc = 3;
    if (rc == 0) rc = moeq_ep_barrier(ep, err, sizeof err) ? 2 : 0;
    if (g->odd_rank > 0) {
        /* every rank refuses the group at creation, naming a rank that disagrees with it */
        int ok = rc == 3 && strstr(err, "another group shape") &&
                 (rank == g->odd_rank ? strstr(err, "rank 0") != NULL : strstr(err, "rank ") != NULL);
        if (!ok) fprintf(stderr, "rank %d: expected a refusal at creation; rc %d: %s\n", rank, rc, err);
        rc = ok ? 0 : 1;
    } else if (g->mangle) {
        /* every receiver refuses rank 1's message as malformed, naming it; rank 1 itself gives no verdict */
        int ok = rank == 1 || (rc == 2 && last_code == MOEQ_ERR_FORMAT && strstr(err, "rank 1") != NULL);
        if (!ok) fprintf(stderr, "rank %d: expected a format error naming rank 1; rc %d (%d): %s\n", rank, rc,
                         (int)last_code, err);
        rc = ok ? 0 : 1;
    } else if (g->victim >= 0 && rank != g->victim) {
        /* a survivor: the exchange must fail, naming the victim, within the timeout (+ slack for a loaded host) */
        char name[32];
        snprintf(name, sizeof name, "rank %d", g->victim);
        double ms = (double)(moeq_mono_ns() - t0) / 1e6;
        int ok = rc == 2 && strstr(err, name) && ms < g->timeout_ms + 3000;
        if (!ok) fprintf(stderr, "rank %d: expected a failure naming %s within %d ms; rc %d after %.0f ms: %s\n",
                         rank, name, g->timeout_ms, rc, ms, err);
        rc = ok ? 0 : 1;
    } else if (rc) {
        fprintf(stderr, "rank %d (%s, %d ranks): %s\n", rank, g->tls, g->n_ranks, err);
    }
    moeq_ep_destroy(ep);
    moeq_ep_placement_destroy(pl);
    return rc;
}

/* Fork every rank, wait for all (never longer than 120 s: then kill them and fail). */
static void run_group(group_cfg g) {
    snprintf(g.dir, sizeof g.dir, "/tmp/moeq-ep-XXXXXX");
    assert_non_null(mkdtemp(g.dir));
    pid_t pid[8];
    for (int r = 0; r < g.n_ranks; r++) {
        fflush(NULL);
        pid[r] = fork();
        assert_true(pid[r] >= 0);
        if (pid[r] == 0) _exit(run_rank(&g, r));
    }
    int64_t deadline = moeq_now_ms() + 120000;
    int failed = 0, left = g.n_ranks, status;
    while (left > 0) {
        for (int r = 0; r < g.n_ranks; r++) {
            if (pid[r] <= 0 || waitpid(pid[r], &status, WNOHANG) != pid[r]) continue;
            int expect_killed = r == g.victim;
            int ok = expect_killed ? WIFSIGNALED(status) : WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (!ok) fprintf(stderr, "%s, %d ranks: rank %d ended with status 0x%x\n", g.tls, g.n_ranks, r, status);
            failed |= !ok, pid[r] = 0, left--;
            /* a stopped victim is killed once every survivor has given its verdict */
            if (g.victim >= 0 && g.victim_signal == SIGSTOP && left == 1 && pid[g.victim] > 0) kill(pid[g.victim], SIGKILL);
        }
        if (moeq_now_ms() > deadline) {
            for (int r = 0; r < g.n_ranks; r++)
                if (pid[r] > 0) kill(pid[r], SIGKILL), waitpid(pid[r], NULL, 0), pid[r] = 0, left--;
            fail_msg("%s, %d ranks: the group hung", g.tls, g.n_ranks);
        }
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g.dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g.dir);
    assert_false(failed);
}

static void every_group_apart(const char *tls, const char *payload, int apart) {
    for (int n = 1; n <= 4; n++)
        for (int pl = IDENTITY; pl <= REPLICATED; pl++) {
            if (n == 1 && pl != IDENTITY) continue;
            run_group((group_cfg){tls, n, (placement_kind)pl, payload, -1, 0, 20000, "", 0, 0, MOEQ_EP_MANGLE_NONE,
                                  apart});
        }
}

static void every_group(const char *tls, const char *payload) { every_group_apart(tls, payload, 0); }

static void ucx_over_tcp_gives_the_local_transports_bits_on_one_to_four_ranks(void **state) {
    (void)state;
    every_group("tcp", "f32");
}

static void ucx_over_shared_memory_gives_the_local_transports_bits_on_one_to_four_ranks(void **state) {
    (void)state;
    every_group("posix,sysv", "f32");
}

/* A span of x from a rank's first token to its last (gap rows too) in the second exchange: the same bits. */
static void rows_sent_apart_from_x_give_the_local_transports_bits_over_tcp_and_shared_memory(void **state) {
    (void)state;
    every_group_apart("tcp", "f32", 1);
    every_group_apart("posix,sysv", "f32", 1);
}

static void bf16_and_fp8_payloads_over_ucx_give_the_local_transports_bits(void **state) {
    (void)state;
    run_group((group_cfg){"tcp", 3, REPLICATED, "bf16", -1, 0, 20000, "", 0, 0, MOEQ_EP_MANGLE_NONE, 0});
    run_group((group_cfg){"posix,sysv", 2, PERMUTED, "bf16", -1, 0, 20000, "", 0, 0, MOEQ_EP_MANGLE_NONE, 0});
    run_group((group_cfg){"tcp", 4, REPLICATED, "fp8", -1, 0, 20000, "", 0, 0, MOEQ_EP_MANGLE_NONE, 0});
}

static void a_rank_killed_with_sigkill_fails_the_exchange_naming_it_over_tcp(void **state) {
    (void)state;
    run_group((group_cfg){"tcp", 3, IDENTITY, "f32", 2, SIGKILL, 2000, "", 0, 0, MOEQ_EP_MANGLE_NONE, 0});
}

/* Rank 1 sees rank 2 die and leaves before rank 0 even starts the round: rank 0 must still blame rank 2. */
static void a_survivor_that_comes_late_still_names_the_rank_that_died(void **state) {
    (void)state;
    run_group((group_cfg){"tcp", 3, IDENTITY, "f32", 2, SIGKILL, 2000, "", 500, 0, MOEQ_EP_MANGLE_NONE, 0});
}

static void a_rank_killed_with_sigkill_fails_the_exchange_naming_it_over_shared_memory(void **state) {
    (void)state;
    run_group((group_cfg){"posix,sysv", 3, IDENTITY, "f32", 1, SIGKILL, 2000, "", 0, 0, MOEQ_EP_MANGLE_NONE, 0});
}

static void ranks_that_disagree_on_the_placement_refuse_to_form_a_group(void **state) {
    (void)state;
    run_group((group_cfg){"tcp", 3, IDENTITY, "f32", -1, 0, 20000, "", 0, 2, MOEQ_EP_MANGLE_NONE, 0});
}

static void a_rank_that_stops_answering_fails_the_exchange_within_the_timeout(void **state) {
    (void)state;
    run_group((group_cfg){"tcp", 2, IDENTITY, "f32", 1, SIGSTOP, 1500, "", 0, 0, MOEQ_EP_MANGLE_NONE, 0});
}

/*
 * Cut short, counts that do not match the bytes, counts out of range, an
 * expert this rank does not hold; then each again with the rows apart from x,
 * and rows apart one row short of what the header announced.
 */
static void a_malformed_dispatch_message_fails_the_receivers_naming_the_sender(void **state) {
    (void)state;
    for (int how = MOEQ_EP_MANGLE_TRUNCATED; how <= MOEQ_EP_MANGLE_BAD_EXPERT; how++)
        run_group((group_cfg){"tcp", 3, IDENTITY, "f32", -1, 0, 3000, "", 0, 0, (moeq_ep_mangle)how, 0});
    run_group((group_cfg){"posix,sysv", 2, IDENTITY, "bf16", -1, 0, 3000, "", 0, 0, MOEQ_EP_MANGLE_SHORT, 0});
    for (int how = MOEQ_EP_MANGLE_TRUNCATED; how <= MOEQ_EP_MANGLE_ROWS_SHORT; how++)
        run_group((group_cfg){"tcp", 3, IDENTITY, "f32", -1, 0, 3000, "", 0, 0, (moeq_ep_mangle)how, 1});
    run_group((group_cfg){"posix,sysv", 2, IDENTITY, "f32", -1, 0, 3000, "", 0, 0, MOEQ_EP_MANGLE_ROWS_SHORT, 1});
}

int main(void) {
    moeq_ep_params p = moeq_ep_default_params();
    strcpy(p.transport, "ucx");
    moeq_ep *ep = NULL;
    char err[256];
    if (moeq_ep_new(&p, NULL, NULL, &ep, err, sizeof err) == MOEQ_ERR_UNSUPPORTED) {
        printf("skipped: %s\n", err);
        return 77;
    }
    moeq_ep_destroy(ep);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ucx_over_tcp_gives_the_local_transports_bits_on_one_to_four_ranks),
        cmocka_unit_test(ucx_over_shared_memory_gives_the_local_transports_bits_on_one_to_four_ranks),
        cmocka_unit_test(rows_sent_apart_from_x_give_the_local_transports_bits_over_tcp_and_shared_memory),
        cmocka_unit_test(bf16_and_fp8_payloads_over_ucx_give_the_local_transports_bits),
        cmocka_unit_test(a_rank_killed_with_sigkill_fails_the_exchange_naming_it_over_tcp),
        cmocka_unit_test(a_survivor_that_comes_late_still_names_the_rank_that_died),
        cmocka_unit_test(a_rank_killed_with_sigkill_fails_the_exchange_naming_it_over_shared_memory),
        cmocka_unit_test(ranks_that_disagree_on_the_placement_refuse_to_form_a_group),
        cmocka_unit_test(a_rank_that_stops_answering_fails_the_exchange_within_the_timeout),
        cmocka_unit_test(a_malformed_dispatch_message_fails_the_receivers_naming_the_sender),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
