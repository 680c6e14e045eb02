/*
 * moeq — one executable, many subcommands. This file only dispatches; each
 * subcommand lives in cli/cmd_<area>.c beside the module it fronts.
 */
#include <stdio.h>
#include <string.h>

#define MOEQ_CMD(cname, name, help) int moeq_cmd_##cname(int argc, char **argv);
#include "commands.def"
#undef MOEQ_CMD

typedef struct moeq_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} moeq_cmd;

static const moeq_cmd commands[] = {
#define MOEQ_CMD(cname, name, help) {name, moeq_cmd_##cname, help},
#include "commands.def"
#undef MOEQ_CMD
    {NULL, NULL, NULL},
};

static void usage(FILE *out) {
    fprintf(out, "usage: moeq <command> [options]\n\ncommands:\n");
    for (const moeq_cmd *c = commands; c->name; c++) fprintf(out, "  %-14s %s\n", c->name, c->help);
    fprintf(out, "\n`moeq <command> --help` describes each command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("moeq %s\n", MOEQ_VERSION);
        return 0;
    }
    for (const moeq_cmd *c = commands; c->name; c++)
        if (!strcmp(argv[1], c->name)) return c->run(argc - 1, argv + 1);
    fprintf(stderr, "moeq: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
