/*
 * cmd_ep.c — `moeq ep-plan`: a placement for an expert-parallel group from
 * measured per-expert token counts (EPLB's greedy: replicas first, then
 * balanced packing), printed as a placement file (ep.placement) with the
 * predicted load in comments, or as JSON with --json. No I/O beyond the stats files
 * (several: summed, as each rank of a group counts its own tokens).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "moeq/ep_placement.h"
#include "moeq/ep_plan.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: moeq ep-plan --stats FILE [--stats FILE ...] --ranks N [--replicas R] [--json]\n"
            "  --stats FILE    per-expert token counts (integers separated by blanks, commas, newlines; # comments),\n"
            "                  e.g. a worker's expert_stats_path; several files (one per rank of a group) are summed\n"
            "  --ranks N       ranks in the group (1..%d)\n"
            "  --replicas R    extra expert replicas allowed in all (default 0; fewer are used when they do not help)\n"
            "  --json          print the plan as JSON instead of a placement file\n",
            MOEQ_EP_MAX_RANKS);
}

static void print_json(const moeq_ep_placement *pl, const double *load, double max, double mean, double id_ratio,
                       int budget) {
    int E = moeq_ep_placement_n_experts(pl), R = moeq_ep_placement_n_ranks(pl), used = -E;
    for (int e = 0; e < E; e++) used += moeq_ep_placement_n_replicas(pl, e);
    printf("{\"experts\":%d,\"ranks\":%d,\"replicas_allowed\":%d,\"replicas_used\":%d,\"max_load\":%.1f,"
           "\"mean_load\":%.1f,\"max_over_mean\":%.4f,\"identity_max_over_mean\":%.4f,\"rank_load\":[",
           E, R, budget, used, max, mean, mean > 0 ? max / mean : 1.0, id_ratio);
    for (int r = 0; r < R; r++) printf("%s%.1f", r ? "," : "", load[r]);
    printf("],\"placement\":[");
    for (int e = 0; e < E; e++) {
        printf("%s[", e ? "," : "");
        for (int i = 0; i < moeq_ep_placement_n_replicas(pl, e); i++)
            printf("%s%d", i ? "," : "", moeq_ep_placement_replica(pl, e, i));
        printf("]");
    }
    printf("]}\n");
}

static void print_text(const moeq_ep_placement *pl, const double *load, double max, double mean, double id_ratio,
                       int budget) {
    int E = moeq_ep_placement_n_experts(pl), R = moeq_ep_placement_n_ranks(pl), used = -E;
    for (int e = 0; e < E; e++) used += moeq_ep_placement_n_replicas(pl, e);
    printf("# moeq ep-plan: %d experts on %d ranks, %d extra replicas allowed, %d used\n", E, R, budget, used);
    printf("# predicted load per rank:");
    for (int r = 0; r < R; r++) printf(" %.1f", load[r]);
    printf("\n# predicted max %.1f mean %.1f max/mean %.4f (identity placement: %.4f)\n", max, mean,
           mean > 0 ? max / mean : 1.0, id_ratio);
    moeq_ep_placement_print(pl, stdout);
}

int moeq_cmd_ep_plan(int argc, char **argv) {
    enum { MAX_STATS = 64 };
    const char *stats[MAX_STATS];
    int n_stats = 0, ranks = 0, replicas = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 0;
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!v) return fprintf(stderr, "ep-plan: %s needs a value\n", a), usage(stderr), 2;
        if (!strcmp(a, "--stats")) {
            if (n_stats == MAX_STATS) return fprintf(stderr, "ep-plan: at most %d --stats files\n", MAX_STATS), 2;
            stats[n_stats++] = v;
        }
        else if (!strcmp(a, "--ranks")) {
            if (moeq_cli_int_arg(a, v, &ranks)) return 2;
            if (ranks < 1) return fprintf(stderr, "ep-plan: --ranks %d: give 1 or more\n", ranks), 2;
        } else if (!strcmp(a, "--replicas")) {
            if (moeq_cli_int_arg(a, v, &replicas)) return 2;
            if (replicas < 0) return fprintf(stderr, "ep-plan: --replicas %d: give 0 or more\n", replicas), 2;
        } else return fprintf(stderr, "ep-plan: unknown option '%s'\n", a), usage(stderr), 2;
        i++;
    }
    if (!n_stats || ranks < 1) return fprintf(stderr, "ep-plan: --stats and --ranks are required\n"), usage(stderr), 2;
    char err[512];
    int64_t *counts = NULL;
    int E = 0;
    moeq_ep_placement *pl = NULL, *id = NULL;
    double *load = malloc((size_t)ranks * sizeof(double)), max, mean, id_max, id_mean;
    int rc = 1;
    if (!load) goto done;
    if (moeq_ep_stats_load_sum(stats, n_stats, &counts, &E, err, sizeof err) || moeq_ep_plan(counts, E, ranks, replicas, &pl, err, sizeof err) ||
        moeq_ep_placement_new_identity(E, ranks, &id, err, sizeof err)) {
        fprintf(stderr, "ep-plan: %s\n", err);
        goto done;
    }
    moeq_ep_plan_predict(pl, counts, load, &max, &mean);
    moeq_ep_plan_predict(id, counts, NULL, &id_max, &id_mean);
    (json ? print_json : print_text)(pl, load, max, mean, id_mean > 0 ? id_max / id_mean : 1.0, replicas);
    rc = 0;
done:
    free(load), free(counts);
    moeq_ep_placement_destroy(pl), moeq_ep_placement_destroy(id);
    return rc;
}
