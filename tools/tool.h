/*
 * tool.h: what the commands of the fusec tools share.
 *
 * Each command lives in its own file (tools/cmd_*.c) and exports one
 * fz_command; tools/fusec.c holds the table and main. The helpers here load
 * trace files with diagnostics, parse --bind lists and print usage errors,
 * so every command behaves the same way at its edges.
 */
#ifndef FUSEC_TOOL_H
#define FUSEC_TOOL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "fusec.h"

enum { EXIT_BAD = 1, EXIT_USAGE = 2 };

typedef struct fz_command {
	const char *name;
	const char *summary; /* one line for `fusec --help` */
	int (*run)(int argc, char **argv);
	const char *usage;   /* the command's --help */
} fz_command;

extern const fz_command fz_cmd_check, fz_cmd_run, fz_cmd_plan, fz_cmd_emit,
	fz_cmd_compile, fz_cmd_sim;

/* Prints "fusec NAME: " + fmt(arg) + the usage to stderr; returns 2. */
int tool_usage_error(const fz_command *c, const char *fmt, const char *arg);

/* Reads a whole file ("-": standard input); NULL with errno on failure. */
char *tool_read_all(const char *path, size_t *len);

/* Parses a trace file, printing its diagnostics to stderr; NULL on error. */
fz_module *tool_load(const char *path);

typedef struct tool_binding {
	char name[64];
	int64_t size;
	bool used;
} tool_binding;

/* --bind's value ("B=8,T=2048": an empty entry, a name that is not a
 * symbol's, a name twice, a size that is not plain decimal digits are
 * refused) for command c: parsed into b (FZ_MAX_SYMS of them) and
 * *n; 0, or the usage error's status (2, printed) when arg is malformed or
 * a --bind came before (*n > 0). */
int tool_bind_option(const fz_command *c, const char *arg, tool_binding *b,
                     int *n);

/* Symbol sizes for t from the bindings (marking those used); -1 elsewhere. */
void tool_bind_symbols(const fz_trace *t, tool_binding *b, int n,
                       int64_t *sym_sizes);

double tool_now(void);

/* "4096", "512K", "64M", "2G" (powers of 1024; "MiB", "MB" accepted)
 * into bytes; -1 if malformed. */
int64_t tool_parse_size(const char *s);

/* The communication scheduling flags shared by plan and sim (--no-comm-waits,
 * --no-prefetch, --no-early-scatter, --no-comm-schedule,
 * --max-inflight-bytes SIZE, --bucket-bytes SIZE) at argv[*i]: 1 if taken
 * (advancing *i past a value), 0 if not one of them, -1 after printing a
 * usage error. */
struct fz_plan_options;
int tool_comm_option(const fz_command *c, int argc, char **argv, int *i,
		     struct fz_plan_options *po);

/* 0 when every trace of m declares world `world` (or world <= 0); else
 * prints an error and returns EXIT_BAD. */
int tool_check_world(const char *cmd, const fz_module *m, int world);

/* Prints s on stdout as a JSON string, quoted and escaped. */
void tool_json_str(const char *s);

#endif
