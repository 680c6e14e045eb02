/*
 * cli.h — what every configurable subcommand shares: the one precedence
 * (file < MOEQ_* < flags), one file for every role (keys of the other roles
 * are checked and ignored, unknown keys warned about), `--print-config`.
 */
#ifndef MOEQ_CLI_H
#define MOEQ_CLI_H

#include "moeq/config.h"

/* Every role's table but self, NULL-terminated (static storage). */
const moeq_prop *const *moeq_cli_other_tables(const moeq_prop *self);

/*
 * Load params (defaults already set) from argv for subcommand cmd: every
 * --config FILE, then MOEQ_*, then flags. argv is compacted as
 * moeq_config_apply_args does; *rest receives what is left (argv[0]
 * included). With --print-config anywhere in argv the effective
 * configuration is printed to stdout as a config file (secrets masked) and
 * *printed is set. Returns 0, or 2 after printing the error to stderr.
 */
int moeq_cli_load(const char *cmd, const moeq_prop *table, void *params, moeq_kvlist *kafka, moeq_kvlist *redis,
                  int argc, char **argv, int *rest, int *printed);

#endif
