/*
 * tool.c: the helpers the commands share (see tool.h).
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ir.h"
#include "plan.h"
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

/* "B=8,T=2048" into b[0..max); the count, or -1 with why. */
static int parse_bindings(const char *s, tool_binding *b, int max, char *why,
			  size_t wlen)
{
	int n = 0;
	if (!*s) {
		snprintf(why, wlen, "an empty list");
		return -1;
	}
	for (;;) {
		size_t item = strcspn(s, ","), len = strcspn(s, "=,");
		if (item == 0) {
			snprintf(why, wlen, "an empty entry");
			return -1;
		}
		bool ident = len > 0 && len < sizeof b->name &&
			     (isalpha((unsigned char)s[0]) || s[0] == '_');
		for (size_t i = 1; ident && i < len; i++)
			ident = isalnum((unsigned char)s[i]) || s[i] == '_';
		if (!ident) {
			snprintf(why, wlen, "'%.*s' is not a symbol name", (int)len, s);
			return -1;
		}
		if (s[len] != '=') {
			snprintf(why, wlen, "'%.*s' has no size (NAME=SIZE)", (int)len, s);
			return -1;
		}
		if (n == max) {
			snprintf(why, wlen, "more than %d symbols", max);
			return -1;
		}
		memcpy(b[n].name, s, len);
		b[n].name[len] = '\0';
		for (int k = 0; k < n; k++)
			if (!strcmp(b[k].name, b[n].name)) {
				snprintf(why, wlen, "'%s' is bound twice", b[n].name);
				return -1;
			}
		/* decimal digits only: no sign, no space, no 0x */
		const char *v = s + len + 1, *end = v;
		long long size = 0;
		bool ok = isdigit((unsigned char)*v);
		for (; ok && isdigit((unsigned char)*end); end++)
			ok = !__builtin_mul_overflow(size, 10, &size) &&
			     !__builtin_add_overflow(size, *end - '0', &size);
		if (!ok || (*end && *end != ',')) {
			snprintf(why, wlen, "the size of '%s' must be a decimal number "
				 "below 2^63, not '%.*s'", b[n].name, (int)strcspn(v, ","), v);
			return -1;
		}
		b[n].size = size;
		b[n].used = false;
		n++;
		if (!*end)
			return n;
		s = end + 1;
	}
}

int tool_bind_option(const fz_command *c, const char *arg, tool_binding *b,
		     int *n)
{
	char why[160], msg[512];
	if (*n > 0) {
		snprintf(msg, sizeof msg, "--bind is given twice; give every size in "
			 "one list (--bind B=8,T=2048), not '%s' after it", arg);
		return tool_usage_error(c, "%s", msg);
	}
	int k = parse_bindings(arg, b, FZ_MAX_SYMS, why, sizeof why);
	if (k < 0) {
		snprintf(msg, sizeof msg, "--bind takes NAME=SIZE[,NAME=SIZE...]; in "
			 "'%s': %s", arg, why);
		return tool_usage_error(c, "%s", msg);
	}
	*n = k;
	return 0;
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
	/* derived extents (T+1) from the bound ones; a conflict is left
	 * for binding to report */
	char msg[8];
	fz_trace_syms_derive(t, sym_sizes, msg, sizeof msg);
}

double tool_now(void) { return fz_now(); }

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

int64_t tool_parse_size(const char *s)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (end == s || errno || v < 0)
		return -1;
	double mul = 1;
	if (*end) {
		switch (*end) {
		case 'k': case 'K': mul = 1024.0; break;
		case 'm': case 'M': mul = 1024.0 * 1024; break;
		case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
		case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
		default: return -1;
		}
		end++;
		if (*end == 'i')
			end++;
		if (*end == 'B')
			end++;
		if (*end)
			return -1;
	}
	v *= mul;
	if (v > 9.0e18)
		return -1;
	return (int64_t)v;
}

int tool_comm_option(const fz_command *c, int argc, char **argv, int *i,
		     fz_plan_options *po)
{
	const char *a = argv[*i];
	if (!strcmp(a, "--no-comm-waits")) {
		po->comm_waits = false;
		return 1;
	}
	if (!strcmp(a, "--no-prefetch")) {
		po->comm_prefetch = false;
		return 1;
	}
	if (!strcmp(a, "--no-early-scatter")) {
		po->comm_scatter = false;
		return 1;
	}
	if (!strcmp(a, "--no-comm-schedule")) {
		po->comm_waits = po->comm_prefetch = po->comm_scatter = false;
		po->bucket_bytes = 0;
		return 1;
	}
	bool inflight = !strcmp(a, "--max-inflight-bytes");
	bool bucket = !strcmp(a, "--bucket-bytes");
	if (!inflight && !bucket)
		return 0;
	if (*i + 1 >= argc) {
		tool_usage_error(c, "%s needs a size (bytes, or 512K, 64M, 2G)", a);
		return -1;
	}
	int64_t v = tool_parse_size(argv[++*i]);
	if (v < 0) {
		tool_usage_error(c, "bad size '%s' (bytes, or 512K, 64M, 2G)", argv[*i]);
		return -1;
	}
	if (inflight)
		po->max_inflight_bytes = v;
	else
		po->bucket_bytes = v;
	return 1;
}

int tool_check_world(const char *cmd, const fz_module *m, int world)
{
	for (int i = 0; i < fz_module_count(m); i++) {
		const fz_trace *t = fz_module_trace(m, i);
		if (world > 0 && fz_trace_world(t) != world) {
			fprintf(stderr, "fusec %s: error: trace '%s' is written for world %d "
				"(its collectives gather and scatter over %d ranks); "
				"--world %d does not match\n", cmd, fz_trace_name(t),
				fz_trace_world(t), fz_trace_world(t), world);
			return EXIT_BAD;
		}
	}
	return 0;
}
