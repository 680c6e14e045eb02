/*
 * test_engine_group.c — the engine as one rank of an expert-parallel group:
 * 2 and 3 ranks as forked processes over UCX (UCX_TLS=tcp and shared memory),
 * each with its own sequences (data-parallel attention) and only its experts,
 * give logits bit-identical to the single-process engine running the same
 * steps, for the identity, a permuted and a replicated placement, on tiny (V3)
 * and tiny-v2 (V2, two shared experts). The script has ticks where one rank
 * has no tokens (an empty step that still serves the others' rows) and a step
 * one rank's checks refuse (it still takes part). Then a rank killed with -9
 * mid-run fails the survivors' step, naming it. moeq_ep_allgather (the worker
 * group's per-tick agreement) over UCX is checked at the end, and each rank's
 * routed-expert load table equals the single-process engine's for its tokens
 * (a rank counts its own tokens). The ranks join with expert_weights = group on "holding", the CPU backend
 * holding only the experts map_experts gives it: each holds none before its join, then its placement's local
 * experts in every MoE layer, and the engine issues no product on another (as a GPU rank would fail). Skipped
 * (77) without UCX. With --backend cuda (ctest test_engine_group_cuda, label gpu) the references and the ranks
 * run on the device, the ranks sharing it, over tcp: the experts a rank holds are then device memory (skipped,
 * 77, with the backend's reason where there is no device).
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

#include "backend.h"
#include "engine_test_util.h"
#include "expert_hold.h"
#include "model.h"
#include "moeq/engine.h"
#include "moeq/ep.h"
#include "moeq/util.h"

enum { TICKS = 7, MAX_ROWS = 16, MAX_RANKS = 3, STEP_TOKENS = 32 };

typedef enum placement_kind { IDENTITY, PERMUTED, REPLICATED } placement_kind;

static char g_dir[64];
/* --backend cuda (ctest test_engine_group_cuda, label gpu): every engine, the references' and the ranks', on the
 * CUDA backend (the ranks share the one device, each process its own context); NULL: the CPU */
static const char *g_backend;
static const char *g_presets[2] = {"tiny", "tiny-v2"};
/* Reference logits: [preset][n_ranks - 2][rank][tick][row][vocab], from the single-process engine. */
static float *g_ref[2][2][MAX_RANKS];
/* The same engines' routed-expert load tables: a rank of a group counts its own tokens, so it must match. */
static uint64_t *g_ref_counts[2][2][MAX_RANKS];
static size_t g_counts_bytes[2];
static int g_vocab[2];

/*
 * Rank r's items of one tick over its two sequences a, b. Tick 2: the last
 * rank has none; tick 3: rank 0 has none; tick 5: rank 1 asks for more than
 * max_step_tokens (refused: LIMIT, nothing appended). Returns the item count;
 * *rows the logits rows, *refused 1 for the refused step.
 */
static int tick_items(int r, int R, int tick, const int seq[2], const int32_t *ids, moeq_step_item *it, int *rows,
                      int *refused) {
    *rows = 0, *refused = 0;
    if ((tick == 2 && r == R - 1) || (tick == 3 && r == 0)) return 0;
    if (tick == 0) {
        it[0] = (moeq_step_item){seq[0], ids + r, 7 + r, 1};
        it[1] = (moeq_step_item){seq[1], ids + 20, 3, 0};
        *rows = 7 + r + 1;
        return 2;
    }
    if (tick == 5 && r == 1) {
        it[0] = (moeq_step_item){seq[0], ids, STEP_TOKENS + 1, 0};
        *refused = 1;
        return 1;
    }
    it[0] = (moeq_step_item){seq[0], ids + 30 + tick, 1, 0};
    it[1] = (moeq_step_item){seq[1], ids + 40 + 2 * tick, tick == 1 ? 2 : 1, tick == 1};
    *rows = tick == 1 ? 3 : 2;
    return 2;
}

/*
 * "holding": the CPU backend holding only the routed experts map_experts gives it, as a GPU does (none before
 * the first call with expert_weights = group): a product the engine issues on a main layer's expert it does not
 * hold is counted. Each rank is a forked process: its own counters.
 */
static expert_hold g_hold;
static long g_unheld_products;
static void (*g_cpu_matmul)(moeq_backend *, const moeq_mm_job *, int);
static moeq_err (*g_cpu_map_experts)(moeq_backend *, const moeq_model *, const uint8_t *, char *, size_t);

static void hold_matmul(moeq_backend *b, const moeq_mm_job *jobs, int n) {
    for (int i = 0; i < n; i++) g_unheld_products += !expert_hold_has(&g_hold, jobs[i].w);
    g_cpu_matmul(b, jobs, n);
}

static moeq_err hold_map_experts(moeq_backend *b, const moeq_model *m, const uint8_t *resident, char *err, size_t n) {
    expert_hold_set(&g_hold, m, resident);
    return g_cpu_map_experts(b, m, resident, err, n);
}

static moeq_err holding_new(const moeq_backend_config *config, moeq_backend **out, char *errstr, size_t errstr_size) {
    moeq_backend *b = moeq_backend_cpu_new(config);
    if (!b) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "holding backend");
    g_cpu_matmul = b->matmul, g_cpu_map_experts = b->map_experts;
    b->matmul = hold_matmul, b->map_experts = hold_map_experts;
    b->moe_experts = NULL; /* the composed path: every expert product through matmul, where it is checked */
    expert_hold_reset(&g_hold, config->experts_deferred);
    *out = b;
    return MOEQ_OK;
}

static moeq_engine *new_engine(const moeq_model *m, const char *expert_weights, char *err, size_t n) {
    moeq_engine_params p = moeq_engine_default_params();
    snprintf(p.backend, sizeof p.backend, "%s",
             g_backend ? g_backend : strcmp(expert_weights, "group") ? "cpu" : "holding");
    snprintf(p.expert_weights, sizeof p.expert_weights, "%s", expert_weights);
    p.n_threads = 1;
    p.max_seqs = 4;
    p.max_step_tokens = STEP_TOKENS;
    p.kv_cache_tokens = 256;
    p.kv_block_tokens = 4;
    moeq_engine *e = NULL;
    if (moeq_engine_new(m, &p, &e, err, n)) return NULL;
    g_hold.model = m; /* its expert tensors, known before any map_experts: none held until the join */
    return e;
}

/*
 * The script on engine e; out (when not NULL) receives each tick's rows; want (when not NULL) is compared.
 * victim/killed: that rank kills itself before tick `kill_tick`. Returns 0, or 1 with err set.
 */
static int run_script(moeq_engine *e, int r, int R, int vocab, float *out, const float *want, int kill_tick,
                      char *err, size_t n) {
    int seq[2];
    int32_t ids[64];
    moeq_test_prompt(ids, 64, 3, vocab);
    static float logits[MAX_ROWS * 4096];
    for (int i = 0; i < 2; i++)
        if (moeq_engine_seq_new(e, &seq[i])) return snprintf(err, n, "seq_new"), 1;
    for (int tick = 0; tick < TICKS; tick++) {
        if (tick == kill_tick) raise(SIGKILL);
        moeq_step_item it[2];
        int rows, refused, k = tick_items(r, R, tick, seq, ids, it, &rows, &refused);
        memset(logits, 0xff, sizeof(float) * (size_t)MAX_ROWS * vocab);
        moeq_err rc = moeq_engine_step(e, it, k, logits, MAX_ROWS, err, n);
        if (refused ? rc != MOEQ_ERR_LIMIT : rc != MOEQ_OK) {
            if (!refused || rc) return 1;
            return snprintf(err, n, "tick %d: a step past max_step_tokens was not refused", tick), 1;
        }
        size_t bytes = (size_t)rows * vocab * sizeof(float), at = (size_t)tick * MAX_ROWS * vocab;
        if (out) memcpy(out + at, logits, bytes);
        if (want && memcmp(want + at, logits, bytes) != 0)
            return snprintf(err, n, "rank %d tick %d: logits differ from the single-process engine's", r, tick), 1;
    }
    return 0;
}

/* The single-process references of every preset, rank and group size (g_ref, g_ref_counts). */
static int references(void) {
    for (int p = 0; p < 2; p++) {
        moeq_model *m = moeq_test_gen_and_load(g_dir, g_presets[p], NULL, g_presets[p]);
        if (!m) return -1;
        int vocab = g_vocab[p] = moeq_test_vocab(m);
        if (vocab > 4096) return -1;
        for (int R = 2; R <= 3; R++)
            for (int r = 0; r < R; r++) {
                char err[256] = "";
                moeq_engine *e = new_engine(m, "all", err, sizeof err);
                float *out = g_ref[p][R - 2][r] = calloc((size_t)TICKS * MAX_ROWS * vocab, sizeof(float));
                if (!e || !out || run_script(e, r, R, vocab, out, NULL, -1, err, sizeof err)) {
                    fprintf(stderr, "reference %s rank %d/%d: %s\n", g_presets[p], r, R, err);
                    return -1;
                }
                int L = 0, E = 0;
                const uint64_t *c = moeq_engine_expert_counts(e, &L, &E);
                g_counts_bytes[p] = (size_t)L * E * sizeof(uint64_t);
                if (!c || !(g_ref_counts[p][R - 2][r] = malloc(g_counts_bytes[p]))) return -1;
                memcpy(g_ref_counts[p][R - 2][r], c, g_counts_bytes[p]);
                moeq_engine_destroy(e);
            }
        moeq_model_destroy(m);
    }
    return 0;
}

/* A file of the references, written by a child that made them on the device and read back by the parent, which
 * must not touch CUDA before it forks the ranks. */
static int io(int write, void *p, size_t size, size_t n, FILE *f) {
    return (write ? fwrite(p, size, n, f) : fread(p, size, n, f)) == n;
}

static int references_file(int write) {
    char path[128];
    snprintf(path, sizeof path, "%s/references.bin", g_dir);
    FILE *f = fopen(path, write ? "wb" : "rb");
    int ok = f != NULL;
    for (int p = 0; p < 2 && ok; p++) {
        ok = io(write, &g_vocab[p], sizeof(int), 1, f) && io(write, &g_counts_bytes[p], sizeof(size_t), 1, f);
        for (int R = 2; R <= 3 && ok; R++)
            for (int r = 0; r < R && ok; r++) {
                size_t n = (size_t)TICKS * MAX_ROWS * g_vocab[p];
                if (!write && (!(g_ref[p][R - 2][r] = calloc(n, sizeof(float))) ||
                               !(g_ref_counts[p][R - 2][r] = malloc(g_counts_bytes[p]))))
                    ok = 0;
                ok = ok && io(write, g_ref[p][R - 2][r], sizeof(float), n, f) &&
                     io(write, g_ref_counts[p][R - 2][r], 1, g_counts_bytes[p], f);
            }
    }
    if (f && fclose(f)) ok = 0;
    return ok ? 0 : -1;
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/moeq-eg-XXXXXX");
    if (!mkdtemp(g_dir) || moeq_backend_register("holding", holding_new)) return -1;
    if (!g_backend) return references();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(references() || references_file(1) ? 1 : 0);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) return -1;
    return references_file(0);
}

static int teardown(void **state) {
    (void)state;
    for (int p = 0; p < 2; p++)
        for (int R = 0; R < 2; R++)
            for (int r = 0; r < MAX_RANKS; r++) free(g_ref[p][R][r]), free(g_ref_counts[p][R][r]);
    return moeq_test_remove_dir(g_dir);
}

typedef struct group_cfg {
    const char *tls;
    int preset;
    int n_ranks;
    placement_kind placement;
    int victim;   /* this rank kills itself (SIGKILL) before tick 2; -1 none */
    char rv[96];  /* rendezvous directory */
} group_cfg;

static moeq_err make_placement(const group_cfg *g, int E, moeq_ep_placement **pl, char *err, size_t n) {
    switch (g->placement) {
    case PERMUTED: return moeq_ep_placement_new_permuted(E, g->n_ranks, 11, pl, err, n);
    case REPLICATED: return moeq_ep_placement_new_replicated(E, g->n_ranks, E / 2, pl, err, n);
    case IDENTITY: break;
    }
    return moeq_ep_placement_new_identity(E, g->n_ranks, pl, err, n);
}

/* One rank in a forked child: its own model, engine and ep handle; the exit status is the verdict. */
static int run_rank(const group_cfg *g, int r) {
    char err[512] = "", path[160];
    setenv("UCX_TLS", g->tls, 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    snprintf(path, sizeof path, "%s/%s", g_dir, g_presets[g->preset]);
    moeq_model *m = NULL;
    moeq_engine *e = NULL;
    moeq_ep *ep = NULL;
    moeq_ep_placement *pl = NULL;
    moeq_ep_params base = moeq_ep_default_params(), p;
    strcpy(base.transport, "ucx");
    base.rank = r, base.n_ranks = g->n_ranks, base.timeout_ms = 20000;
    moeq_ep_rendezvous rv = moeq_ep_rendezvous_dir(g->rv);
    int64_t held0 = -1, held = 0, total = 0;
    size_t bytes = 0;
    /* a rank maps its own experts at the join (expert_weights = group, as the worker runs it), none before */
    int rc = moeq_model_load(path, NULL, &m, err, sizeof err) || !(e = new_engine(m, "group", err, sizeof err)) ||
             (moeq_engine_expert_residency(e, &held0, &total, NULL), 0) ||
             moeq_engine_ep_params(e, &base, &p, err, sizeof err) ||
             make_placement(g, moeq_model_get_config(m)->n_routed_experts, &pl, err, sizeof err) ||
             moeq_ep_new(&p, pl, &rv, &ep, err, sizeof err) || moeq_engine_join_group(e, ep, &p, err, sizeof err);
    if (!rc) {
        moeq_engine_expert_residency(e, &held, &total, &bytes);
        const moeq_model_config *c = moeq_model_get_config(m);
        int64_t moe_layers = total / c->n_routed_experts, want = moe_layers * moeq_ep_placement_n_local(pl, r);
        if (held0 != 0 || held != want || total != moe_layers * c->n_routed_experts || !bytes)
            rc = 1, snprintf(err, sizeof err, "residency: %lld held before the join (want 0), %lld of %lld after "
                             "(want %lld), %zu bytes", (long long)held0, (long long)held, (long long)total,
                             (long long)want, bytes);
    }
    int has_mtp = m && moeq_model_get_config(m)->num_nextn_predict_layers > 0;
    if (!rc && (moeq_engine_mtp_available(e) != has_mtp || !moeq_engine_in_group(e)))
        rc = 1, snprintf(err, sizeof err, "in a group: MTP as the model has it, and the engine in the group");
    if (rc) {
        fprintf(stderr, "rank %d: setup: %s\n", r, err);
    } else if (g->victim >= 0) {
        int64_t t0 = moeq_now_ms();
        rc = run_script(e, r, g->n_ranks, g_vocab[g->preset], NULL, NULL, r == g->victim ? 2 : -1, err, sizeof err);
        char name[32];
        snprintf(name, sizeof name, "rank %d", g->victim);
        int ok = rc == 1 && strstr(err, name) && moeq_now_ms() - t0 < 20000 + 5000;
        if (!ok) fprintf(stderr, "rank %d: expected a failed step naming %s; rc %d: %s\n", r, name, rc, err);
        rc = !ok;
    } else {
        rc = run_script(e, r, g->n_ranks, g_vocab[g->preset], NULL, g_ref[g->preset][g->n_ranks - 2][r], -1, err,
                        sizeof err);
        if (!rc && g_unheld_products)
            rc = 1, snprintf(err, sizeof err, "%ld products on experts the rank does not hold", g_unheld_products);
        int L = 0, E = 0;
        const uint64_t *c = moeq_engine_expert_counts(e, &L, &E);
        if (!rc && (!c || memcmp(c, g_ref_counts[g->preset][g->n_ranks - 2][r], g_counts_bytes[g->preset])))
            rc = 1, snprintf(err, sizeof err, "its expert load table differs from the single-process engine's");
        int64_t all[MAX_RANKS] = {0}; /* the worker's per-tick agreement; nobody leaves while another still steps */
        if (!rc) rc = moeq_ep_allgather(ep, 1000 + r, all, err, sizeof err) != MOEQ_OK;
        for (int q = 0; q < g->n_ranks && !rc; q++)
            if (all[q] != 1000 + q)
                rc = 1, snprintf(err, sizeof err, "allgather: rank %d sent %lld", q, (long long)all[q]);
        if (rc) fprintf(stderr, "rank %d (%s, %d ranks, placement %d): %s\n", r, g->tls, g->n_ranks, g->placement, err);
    }
    moeq_engine_destroy(e);
    moeq_ep_destroy(ep);
    moeq_ep_placement_destroy(pl);
    moeq_model_destroy(m);
    return rc;
}

static void run_group(group_cfg g) {
    snprintf(g.rv, sizeof g.rv, "%s/rv-XXXXXX", g_dir);
    assert_non_null(mkdtemp(g.rv));
    pid_t pid[MAX_RANKS];
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
            int ok = r == g.victim ? WIFSIGNALED(status) : WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (!ok) fprintf(stderr, "%s %s, %d ranks: rank %d ended with status 0x%x\n", g_presets[g.preset], g.tls,
                             g.n_ranks, r, status);
            failed |= !ok, pid[r] = 0, left--;
        }
        if (moeq_now_ms() > deadline) {
            for (int r = 0; r < g.n_ranks; r++)
                if (pid[r] > 0) kill(pid[r], SIGKILL), waitpid(pid[r], NULL, 0), pid[r] = 0, left--;
            fail_msg("%s, %d ranks: the group hung", g.tls, g.n_ranks);
        }
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    assert_false(failed);
}

/* ---- MTP rounds in a group ------------------------------------------------------------------------------ */

enum { MTP_PROMPT = 9, MTP_NEW = 24, MTP_K = 2 };

/* Rank r's prompt of sequence i (two per rank), and the plain greedy continuation the single process gives. */
static void mtp_prompt(int r, int i, int vocab, int32_t *ids) { moeq_test_prompt(ids, MTP_PROMPT, 40 + 2 * r + i, vocab); }

static int greedy_plain(const moeq_model *m, const int32_t *prompt, int vocab, int32_t *out) {
    char err[256] = "";
    moeq_engine *e = new_engine(m, "all", err, sizeof err);
    static float logits[4096];
    int seq = -1, rc = !e || moeq_engine_seq_new(e, &seq);
    moeq_step_item it = {seq, prompt, MTP_PROMPT, 0};
    for (int t = 0; !rc && t < MTP_NEW; t++) {
        rc = moeq_engine_step(e, &it, 1, logits, 1, err, sizeof err) != MOEQ_OK;
        int best = 0;
        for (int v = 1; v < vocab; v++) best = logits[v] > logits[best] ? v : best;
        out[t] = best;
        it = (moeq_step_item){seq, &out[t], 1, 0};
    }
    moeq_engine_destroy(e);
    return rc;
}

/*
 * Rank r of a group: prefill its two sequences, then greedy MTP rounds (k = 2) until each has MTP_NEW tokens;
 * the last rank stops drafting its second sequence early (k = 0: a plain decode in the round) and every rank
 * that is done runs empty steps while the others go on, `ticks` ticks in all. Returns 0 when every token equals
 * want (the single process's plain greedy decode).
 */
static int mtp_rank_script(moeq_engine *e, int r, int R, int vocab, int ticks, const int32_t *want, char *err,
                           size_t n) {
    moeq_mtp_decoder *d = NULL;
    if (moeq_mtp_decoder_new(e, 2, MTP_K, &d, err, n)) return 1;
    static float logits[2 * 4096];
    moeq_spec_seq sq[2];
    int32_t prompt[2][MTP_PROMPT], got[2][MTP_NEW + MTP_K + 1];
    int have[2] = {0, 0}, rc = 0;
    moeq_step_item it[2];
    for (int i = 0; i < 2 && !rc; i++) {
        mtp_prompt(r, i, vocab, prompt[i]);
        memset(&sq[i], 0, sizeof sq[i]);
        sq[i].sampling = moeq_sampling_default_params(); /* temperature 0: greedy */
        rc = moeq_engine_seq_new(e, &sq[i].seq_id) || moeq_engine_seq_set_mtp(e, sq[i].seq_id, 1);
        it[i] = (moeq_step_item){sq[i].seq_id, prompt[i], MTP_PROMPT, 0};
    }
    rc = rc || moeq_engine_step(e, it, 2, logits, 2, err, n); /* tick 0: both prefills */
    for (int i = 0; i < 2 && !rc; i++) {
        int best = 0;
        for (int v = 1; v < vocab; v++) best = logits[(size_t)i * vocab + v] > logits[(size_t)i * vocab + best] ? v : best;
        sq[i].next_token = got[i][have[i]++] = best;
    }
    for (int tick = 1; tick < ticks && !rc; tick++) {
        moeq_spec_seq *run[2];
        int k = 0;
        for (int i = 0; i < 2; i++)
            if (have[i] < MTP_NEW) {
                sq[i].k = r == R - 1 && i == 1 && tick > 3 ? 0 : MTP_K;
                run[k++] = &sq[i];
            }
        if (k == 0) { /* done: serve the others' rows */
            rc = moeq_engine_step(e, NULL, 0, NULL, 0, err, n) != MOEQ_OK;
            continue;
        }
        moeq_spec_seq batch[2];
        for (int j = 0; j < k; j++) batch[j] = *run[j];
        rc = moeq_mtp_decode_step(d, batch, k, err, n) != MOEQ_OK;
        for (int j = 0; j < k && !rc; j++) {
            int i = run[j] == &sq[0] ? 0 : 1;
            sq[i] = batch[j];
            for (int o = 0; o < batch[j].n_out; o++) got[i][have[i]++] = batch[j].out[o];
        }
    }
    for (int i = 0; i < 2 && !rc; i++) {
        if (have[i] < MTP_NEW) rc = 1, snprintf(err, n, "rank %d seq %d: %d tokens after %d ticks", r, i, have[i], ticks);
        else if (memcmp(got[i], want + (size_t)i * MTP_NEW, MTP_NEW * sizeof(int32_t)))
            rc = 1, snprintf(err, n, "rank %d seq %d: MTP tokens in the group differ from plain greedy decoding", r, i);
        else if (sq[i].drafted == 0 && !(r == R - 1 && i == 1))
            rc = 1, snprintf(err, n, "rank %d seq %d drafted nothing", r, i);
    }
    moeq_mtp_decoder_destroy(d);
    return rc;
}

/* Every rank runs the same number of ticks: the most any rank needs, at worst one token a round. */
static void mtp_in_a_group(const char *tls, int R) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s", g_dir, g_presets[0]);
    moeq_model *m = NULL;
    char err[512] = "";
    assert_int_equal(moeq_model_load(path, NULL, &m, err, sizeof err), MOEQ_OK);
    int vocab = moeq_test_vocab(m);
    int32_t want[MAX_RANKS][2 * MTP_NEW];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 2; i++) {
            int32_t prompt[MTP_PROMPT];
            mtp_prompt(r, i, vocab, prompt);
            assert_int_equal(greedy_plain(m, prompt, vocab, want[r] + i * MTP_NEW), 0);
        }
    moeq_model_destroy(m);
    char rv[96];
    snprintf(rv, sizeof rv, "%s/rv-XXXXXX", g_dir);
    assert_non_null(mkdtemp(rv));
    pid_t pid[MAX_RANKS];
    for (int r = 0; r < R; r++) {
        fflush(NULL);
        if ((pid[r] = fork()) == 0) {
            setenv("UCX_TLS", tls, 1);
            setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
            moeq_model *mm = NULL;
            moeq_engine *e = NULL;
            moeq_ep *ep = NULL;
            moeq_ep_params base = moeq_ep_default_params(), p;
            strcpy(base.transport, "ucx");
            base.rank = r, base.n_ranks = R, base.timeout_ms = 20000;
            moeq_ep_rendezvous rvz = moeq_ep_rendezvous_dir(rv);
            int rc = moeq_model_load(path, NULL, &mm, err, sizeof err) ||
                     !(e = new_engine(mm, "group", err, sizeof err)) ||
                     moeq_engine_ep_params(e, &base, &p, err, sizeof err) ||
                     moeq_ep_new(&p, NULL, &rvz, &ep, err, sizeof err) ||
                     moeq_engine_join_group(e, ep, &p, err, sizeof err);
            if (!rc && !moeq_engine_mtp_available(e)) rc = 1, snprintf(err, sizeof err, "MTP is off in the group");
            if (!rc) rc = mtp_rank_script(e, r, R, moeq_test_vocab(mm), 1 + MTP_NEW, want[r], err, sizeof err);
            if (!rc && g_unheld_products)
                rc = 1, snprintf(err, sizeof err, "%ld products on experts the rank does not hold", g_unheld_products);
            if (rc) fprintf(stderr, "mtp rank %d/%d (%s): %s\n", r, R, tls, err);
            moeq_engine_destroy(e);
            moeq_ep_destroy(ep);
            moeq_model_destroy(mm);
            _exit(rc);
        }
        assert_true(pid[r] > 0);
    }
    int failed = 0;
    for (int r = 0; r < R; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        failed |= !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    assert_false(failed);
}

static void mtp_rounds_in_a_group_give_the_plain_greedy_tokens_and_keep_the_lockstep(void **state) {
    (void)state;
    mtp_in_a_group("tcp", 2);
    mtp_in_a_group("tcp", 3);
}

static void every_group(const char *tls) {
    for (int p = 0; p < 2; p++)
        for (int R = 2; R <= 3; R++)
            for (int pl = IDENTITY; pl <= REPLICATED; pl++)
                run_group((group_cfg){tls, p, R, (placement_kind)pl, -1, ""});
}

static void two_and_three_ranks_over_tcp_give_the_single_process_logits_bit_for_bit(void **state) {
    (void)state;
    if (!g_backend) {
        every_group("tcp");
        return;
    }
    /* on the device: fewer groups (each rank a CUDA context): both presets, the placements that move experts */
    for (int p = 0; p < 2; p++) {
        run_group((group_cfg){"tcp", p, 2, PERMUTED, -1, ""});
        run_group((group_cfg){"tcp", p, 2, REPLICATED, -1, ""});
    }
    run_group((group_cfg){"tcp", 0, 3, PERMUTED, -1, ""});
}

static void two_and_three_ranks_over_shared_memory_give_the_single_process_logits_bit_for_bit(void **state) {
    (void)state;
    every_group("posix,sysv");
}

static void a_rank_killed_mid_run_fails_the_survivors_step_naming_it(void **state) {
    (void)state;
    run_group((group_cfg){"tcp", 0, 3, PERMUTED, 1, ""});
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--backend")) g_backend = argv[2];
    moeq_ep_params p = moeq_ep_default_params();
    strcpy(p.transport, "ucx");
    moeq_ep *ep = NULL;
    char err[256];
    if (moeq_ep_new(&p, NULL, NULL, &ep, err, sizeof err) == MOEQ_ERR_UNSUPPORTED) {
        printf("skipped: %s\n", err);
        return 77;
    }
    moeq_ep_destroy(ep);
    if (g_backend) { /* a child asks, so that this process never makes a CUDA context before it forks ranks */
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            char why[256] = "";
            moeq_backend_config bc = {.n_threads = 1, .batch_invariant = 1, .max_k = 64, .max_ctx = 64, .max_jobs = 8};
            moeq_backend *b = NULL;
            if (moeq_backend_new(g_backend, &bc, &b, why, sizeof why)) {
                printf("SKIP test_engine_group --backend %s: %s\n", g_backend, why);
                fflush(stdout);
                _exit(77);
            }
            moeq_backend_destroy(b);
            _exit(0);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return 1;
        if (WEXITSTATUS(st)) return WEXITSTATUS(st);
        const struct CMUnitTest device[] = {
            cmocka_unit_test(two_and_three_ranks_over_tcp_give_the_single_process_logits_bit_for_bit),
        };
        return cmocka_run_group_tests(device, setup, teardown);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_and_three_ranks_over_tcp_give_the_single_process_logits_bit_for_bit),
        cmocka_unit_test(two_and_three_ranks_over_shared_memory_give_the_single_process_logits_bit_for_bit),
        cmocka_unit_test(a_rank_killed_mid_run_fails_the_survivors_step_naming_it),
        cmocka_unit_test(mtp_rounds_in_a_group_give_the_plain_greedy_tokens_and_keep_the_lockstep),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
