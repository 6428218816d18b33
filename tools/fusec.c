/*
 * fusec: the command-line tool.
 *
 *     fusec check FILE...                   parse and verify
 *     fusec plan FILE [--bind ...]          regions, order, peak memory
 *     fusec emit FILE --llvm|--ptx          generated code per region
 *     fusec compile FILE...                 fill the kernel cache
 *     fusec run FILE [--bind B=8,T=2048]    run on random inputs
 *
 * One file per command (tools/cmd_*.c), found through the table below, each
 * with its own --help. The tool is the only place that prints to the
 * terminal or exits; the library reports statuses and messages. Exit
 * status: 0 success, 1 bad input or a failed check or run, 2 usage.
 */
#include <string.h>

#include "tool.h"

static const fz_command *const commands[] = {
	&fz_cmd_check,
	&fz_cmd_plan,
	&fz_cmd_emit,
	&fz_cmd_compile,
	&fz_cmd_run,
	&fz_cmd_sim,
};

#define N_COMMANDS (sizeof commands / sizeof *commands)

static void usage_all(FILE *f)
{
	fprintf(f, "usage: fusec COMMAND [ARGS]\n\ncommands:\n");
	for (size_t i = 0; i < N_COMMANDS; i++)
		fprintf(f, "  %-9s%s\n", commands[i]->name, commands[i]->summary);
	fprintf(f, "\n'fusec COMMAND --help' describes one command.\n");
}

static bool wants_help(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return true;
	return false;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage_all(stderr);
		return EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
	    !strcmp(argv[1], "help")) {
		usage_all(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("fusec %d.%d\n", FZ_VERSION_MAJOR, FZ_VERSION_MINOR);
		return 0;
	}
	for (size_t i = 0; i < N_COMMANDS; i++) {
		if (strcmp(argv[1], commands[i]->name))
			continue;
		if (wants_help(argc - 1, argv + 1)) {
			fputs(commands[i]->usage, stdout);
			return 0;
		}
		return commands[i]->run(argc - 1, argv + 1);
	}
	fprintf(stderr, "fusec: unknown command '%s'\n", argv[1]);
	usage_all(stderr);
	return EXIT_USAGE;
}
