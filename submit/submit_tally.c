/* submit_tally.c — the summary and exit code of a `moeq submit` run (see submit_tally.h). */
#include "submit_tally.h"

#include <stdio.h>

size_t moeq_submit_tally_no_result(const moeq_submit_tally *t) {
    size_t settled = t->not_run;
    for (int s = 0; s < MOEQ_RESULT_STATUS__COUNT; s++) settled += t->by_status[s];
    return settled < t->jobs ? t->jobs - settled : 0;
}

int moeq_submit_exit_code(const moeq_submit_tally *t) {
    if (t->broker_failed) return MOEQ_SUBMIT_EXIT_BROKER;
    if (moeq_submit_tally_no_result(t)) return MOEQ_SUBMIT_EXIT_INCOMPLETE;
    size_t not_ok = t->not_run + t->invalid;
    for (int s = 0; s < MOEQ_RESULT_STATUS__COUNT; s++)
        if (s != MOEQ_RESULT_OK) not_ok += t->by_status[s];
    return not_ok ? MOEQ_SUBMIT_EXIT_NOT_OK : MOEQ_SUBMIT_EXIT_OK;
}

void moeq_submit_summary(const moeq_submit_tally *t, double seconds, char *out, size_t size) {
    snprintf(out, size,
             "summary jobs=%zu ok=%zu error=%zu expired=%zu cancelled=%zu not_run=%zu no_result=%zu invalid=%zu "
             "resumed=%zu stale=%zu seconds=%.1f exit=%d",
             t->jobs, t->by_status[MOEQ_RESULT_OK], t->by_status[MOEQ_RESULT_ERROR], t->by_status[MOEQ_RESULT_EXPIRED],
             t->by_status[MOEQ_RESULT_CANCELLED], t->not_run, moeq_submit_tally_no_result(t), t->invalid, t->resumed,
             t->stale, seconds, moeq_submit_exit_code(t));
}
