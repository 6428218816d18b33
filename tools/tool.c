/*
 * tool.c: the helpers the commands share (see tool.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ir.h"
#include "tool.h"

int tool_usage_error(const fz_command *c, const char *fmt, const char *arg)
{
	fprintf(stderr, "fusec %s: ", c->name);
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n%s", c->usage);
	return EXIT_USAGE;
}

/* Reads a whole file, or standard input for "-". */
char *tool_read_all(const char *path, size_t *len)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	if (!f)
		return NULL;
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		n += fread(buf + n, 1, cap - n, f);
		if (n < cap)
			break;
		char *nb = realloc(buf, cap *= 2);
		if (!nb) {
			free(buf);
			buf = NULL;
		}
		buf = nb;
	}
	bool bad = ferror(f);
	if (f != stdin)
		fclose(f);
	if (bad) {
		free(buf);
		return NULL;
	}
	*len = n;
	return buf;
}

fz_module *tool_load(const char *path)
{
	size_t len;
	char *src = tool_read_all(path, &len);
	if (!src) {
		fprintf(stderr, "fusec: cannot read %s: %s\n", path, strerror(errno));
		return NULL;
	}
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = fz_module_parse(src, len, strcmp(path, "-") ? path : "<stdin>",
				       &m, &diag);
	free(src);
	if (st != FZ_OK) {
		fputs(diag ? diag : "fusec: parse failed\n", stderr);
		fz_free(diag);
		return NULL;
	}
	return m;
}

int tool_parse_bindings(const char *s, tool_binding *b, int max)
{
	int n = 0;
	while (*s) {
		const char *eq = strchr(s, '=');
		size_t len = eq ? (size_t)(eq - s) : 0;
		if (!eq || len == 0 || len >= sizeof b->name || n == max)
			return -1;
		memcpy(b[n].name, s, len);
		b[n].name[len] = '\0';
		char *end;
		errno = 0;
		long long v = strtoll(eq + 1, &end, 10);
		if (end == eq + 1 || (*end && *end != ',') || v < 0 || errno)
			return -1;
		b[n].size = v;
		b[n].used = false;
		n++;
		s = *end ? end + 1 : end;
	}
	return n;
}

void tool_bind_symbols(const fz_trace *t, tool_binding *b, int n,
		       int64_t *sym_sizes)
{
	for (int i = 0; i < FZ_MAX_SYMS; i++)
		sym_sizes[i] = -1;
	for (int i = 0; i < n; i++) {
		int s = fz_trace_symbol_find(t, b[i].name);
		if (s >= 0) {
			sym_sizes[s] = b[i].size;
			b[i].used = true;
		}
	}
}

double tool_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void tool_json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			printf("\\u%04x", *s);
		else
			putchar(*s);
	}
	putchar('"');
}
