/*
 * submit_tally.h — how a `moeq submit` run ended: the counts of its summary
 * line and the exit code they give. Pure; the shell fills the counts.
 *
 * Exit codes (README, docs/SUBMIT.md):
 *   0  every job of the file has an `ok` result
 *   1  every job is settled, but some are not ok: error, expired or
 *      cancelled results, jobs not run (their id was already accepted), or
 *      lines skipped as invalid (--skip-invalid)
 *   2  usage, configuration or input error: nothing was sent
 *   3  the broker could not be reached or refused the jobs
 *   4  some jobs have no result yet (timeout_s passed, or interrupted):
 *      run again with --resume to wait for the rest
 */
#ifndef MOEQ_SUBMIT_TALLY_H
#define MOEQ_SUBMIT_TALLY_H

#include <stddef.h>

#include "moeq/result.h"

enum {
    MOEQ_SUBMIT_EXIT_OK = 0,
    MOEQ_SUBMIT_EXIT_NOT_OK = 1,
    MOEQ_SUBMIT_EXIT_USAGE = 2,
    MOEQ_SUBMIT_EXIT_BROKER = 3,
    MOEQ_SUBMIT_EXIT_INCOMPLETE = 4,
};

typedef struct moeq_submit_tally {
    size_t jobs;                                  /* valid job lines of the file (sent or resumed)   */
    size_t by_status[MOEQ_RESULT_STATUS__COUNT];  /* results, this run's and resumed, by status      */
    size_t not_run;      /* settled by a `duplicate` dead letter: the id was already accepted       */
    size_t invalid;      /* lines skipped with --skip-invalid (in the errors file)                   */
    size_t resumed;      /* of the results, those an earlier run had written (--resume)              */
    size_t stale;        /* results skipped: they answer an earlier job with the same id             */
    int broker_failed;   /* the broker was unreachable or refused a job                              */
} moeq_submit_tally;

/* Jobs with neither a result nor a `duplicate` dead letter. */
size_t moeq_submit_tally_no_result(const moeq_submit_tally *t);

/* The exit code of the rule above. */
int moeq_submit_exit_code(const moeq_submit_tally *t);

/*
 * The summary line (no newline): `summary jobs=N ok=N error=N expired=N
 * cancelled=N not_run=N no_result=N invalid=N resumed=N stale=N seconds=S
 * exit=C`, key=value so scripts can read it. Truncated to size.
 */
void moeq_submit_summary(const moeq_submit_tally *t, double seconds, char *out, size_t size);

#endif
