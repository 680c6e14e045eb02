/*
 * args.h — a command line's numbers, read whole: "8x", "auto", "" or an
 * out-of-range value is refused with the flag named, never read as 0 (atoi's
 * answer, which turned `--mtp auto` into MTP off and `--ranks abc` into a
 * missing flag).
 */
#ifndef MOEQ_CLI_ARGS_H
#define MOEQ_CLI_ARGS_H

#include <stdint.h>

/* Each returns 0 with *out set, or -1 after printing "moeq: FLAG: 'V' is not ..." to stderr. */
int moeq_cli_int_arg(const char *flag, const char *v, int *out);
int moeq_cli_double_arg(const char *flag, const char *v, double *out); /* finite or infinite, never NaN */
int moeq_cli_u64_arg(const char *flag, const char *v, uint64_t *out);  /* decimal, 0x hex or 0 octal; no sign */

#endif
