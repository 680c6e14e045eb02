/*
 * test_ep_nccl.c — the NCCL transport (label gpu): one rank, and two forked
 * ranks where two devices exist, give the local transport's bits. Exits 77
 * (skipped) with the reason where no CUDA device is visible. CUDA is first
 * touched in forked children only, so the parent can fork after asking.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ep_test_util.h"
#include "moeq/ep.h"

enum { E = 16, H = 64, MAXT = 32, K = 4 };

static int n_devices;
static char rendezvous_dir[64];

/* Device count from a child (0 and the reason on stdout when none). */
static int count_devices(char *why, size_t n) {
    int fd[2];
    if (pipe(fd) != 0) return 0;
    pid_t pid = fork();
    if (pid == 0) {
        int c = 0;
        cudaError_t ce = cudaGetDeviceCount(&c);
        dprintf(fd[1], "%d %s", ce == cudaSuccess ? c : 0, ce == cudaSuccess ? "no device visible" : cudaGetErrorString(ce));
        _exit(0);
    }
    close(fd[1]);
    char buf[256] = "";
    ssize_t got = read(fd[0], buf, sizeof buf - 1);
    close(fd[0]);
    waitpid(pid, NULL, 0);
    int c = 0, off = 0;
    if (got > 0 && sscanf(buf, "%d %n", &c, &off) >= 1) snprintf(why, n, "%s", buf + off);
    return c;
}

static int run_rank(int rank, int n_ranks) {
    char err[512] = "";
    moeq_ep_params p = moeq_ep_default_params();
    strcpy(p.transport, "nccl");
    p.rank = rank, p.n_ranks = n_ranks, p.n_experts = E, p.hidden = H, p.max_tokens = MAXT, p.top_k = K;
    p.timeout_ms = 60000;
    moeq_ep_rendezvous rv = moeq_ep_rendezvous_dir(rendezvous_dir);
    static int32_t ids[MAXT * K];
    static float x[MAXT * H], y[2 * MAXT * K * H], out[MAXT * K * H], want[MAXT * K * H];
    int64_t T = rank == 1 ? 0 : MAXT;
    ept_inputs(5 + (uint64_t)rank, T, K, E, H, 1, ids, x);
    moeq_ep *ep = NULL;
    int rc = moeq_ep_new(&p, NULL, &rv, &ep, err, sizeof err) || ept_reference(&p, T, ids, x, want, err, sizeof err) ||
             ept_round(ep, T, ids, x, H, y, out, err, sizeof err);
    if (!rc && memcmp(out, want, (size_t)T * K * H * sizeof(float)) != 0) rc = 1, snprintf(err, sizeof err, "rows differ");
    if (rc) fprintf(stderr, "nccl rank %d of %d: %s\n", rank, n_ranks, err);
    moeq_ep_destroy(ep);
    return rc;
}

static void group(int n_ranks) {
    snprintf(rendezvous_dir, sizeof rendezvous_dir, "/tmp/moeq-ep-nccl-XXXXXX");
    assert_non_null(mkdtemp(rendezvous_dir));
    pid_t pid[2];
    for (int r = 0; r < n_ranks; r++) {
        fflush(NULL);
        if ((pid[r] = fork()) == 0) _exit(run_rank(r, n_ranks));
    }
    int failed = 0, status;
    for (int r = 0; r < n_ranks; r++) failed |= waitpid(pid[r], &status, 0) != pid[r] || !WIFEXITED(status) || WEXITSTATUS(status);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rendezvous_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", rendezvous_dir);
    assert_false(failed);
}

static void nccl_on_one_rank_gives_the_local_transports_bits(void **state) {
    (void)state;
    group(1);
}

static void nccl_on_two_ranks_gives_the_local_transports_bits(void **state) {
    (void)state;
    if (n_devices < 2) {
        print_message("one device: two ranks need two (NCCL wants one device per rank)\n");
        skip();
    }
    group(2);
}

int main(void) {
    char why[200] = "no device";
    n_devices = count_devices(why, sizeof why);
    if (n_devices < 1) {
        printf("SKIP test_ep_nccl: no CUDA device (%s)\n", why);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nccl_on_one_rank_gives_the_local_transports_bits),
        cmocka_unit_test(nccl_on_two_ranks_gives_the_local_transports_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
