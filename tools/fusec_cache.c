/*
 * fusec-cache: inspect and maintain a fusec kernel cache.
 *
 *     fusec-cache [--cache-dir DIR] ls | stat | show KEY | verify [--fix]
 *                                   | prune --max-size SIZE | clear
 *
 * The cache is cache/disk.c's directory ($FUSEC_CACHE_DIR, else
 * $XDG_CACHE_HOME/fusec, else ~/.cache/fusec). `ls` lists entries, most
 * recently used first: key, size, last use, target and a short description
 * of the region (its ops and first input's type). `stat` sums them up with
 * the cap and the hit and miss counters. `show` prints one entry: header,
 * canonical form, PTX, launch metadata, cubin and object sizes. `verify`
 * checks every file and exits 1 when one is bad (`--fix` removes them).
 * `prune` evicts least recently used entries down to a size; `clear`
 * removes every entry. Sizes take k, M, G, T suffixes (powers of 1024).
 *
 * Exit status: 0 success, 1 a bad entry (verify) or a failure, 2 usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cache/cache.h"

enum { EXIT_BAD = 1, EXIT_USAGE = 2 };

static const char usage[] =
	"usage: fusec-cache [--cache-dir DIR] COMMAND [ARGS]\n"
	"\n"
	"commands:\n"
	"  ls                       entries, most recently used first: key, size,\n"
	"                           last use, target, the region's ops and shape\n"
	"  stat                     entries, bytes, cap, hit and miss counters\n"
	"  show KEY                 one entry (KEY or a unique prefix of it):\n"
	"                           header, canonical form, PTX, metadata\n"
	"  verify [--fix]           check every file; exit 1 if one is bad;\n"
	"                           --fix removes the bad ones\n"
	"  prune --max-size SIZE    evict least recently used entries down to SIZE\n"
	"  clear                    remove every entry\n"
	"\n"
	"  --cache-dir DIR  the cache (default $FUSEC_CACHE_DIR, else\n"
	"                   $XDG_CACHE_HOME/fusec, else ~/.cache/fusec)\n"
	"\n"
	"SIZE is bytes with an optional k, M, G or T suffix (1024-based): 500M.\n"
	"'fusec-cache COMMAND --help' says the same.\n";

static int usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "fusec-cache: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n%s", usage);
	return EXIT_USAGE;
}

static void on_warn(void *ctx, const char *msg)
{
	(void)ctx;
	fprintf(stderr, "%s\n", msg);
}

static const char *human(int64_t n, char *buf, size_t len)
{
	const char *units = "kMGT";
	double v = (double)n;
	int u = -1;
	while (v >= 1024 && u < 3) {
		v /= 1024;
		u++;
	}
	if (u < 0)
		snprintf(buf, len, "%lld", (long long)n);
	else
		snprintf(buf, len, "%.1f%c", v, units[u]);
	return buf;
}

static int cmd_ls(fz_disk *d)
{
	fz_disk_info *v;
	int n;
	if (fz_disk_list(d, &v, &n) != FZ_OK) {
		fprintf(stderr, "fusec-cache: cannot list %s\n", fz_disk_path(d));
		return EXIT_BAD;
	}
	printf("%-32s %8s  %-19s  %-10s %s\n", "key", "size", "last use", "target",
	       "region");
	for (int i = 0; i < n; i++) {
		char hex[FZ_KEY_HEX], sz[32], when[32], target[64] = "?", desc[160] = "";
		fz_key_hex(v[i].key, hex);
		time_t t = (time_t)v[i].last_use;
		struct tm tm;
		strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
		fz_entry *e;
		const char *why;
		fz_disk_read(d, v[i].key, &e, &why);
		if (e) {
			fz_canon_field(e->canon, e->canon_len, "target", target, sizeof target);
			fz_canon_describe(e->canon, e->canon_len, desc, sizeof desc);
		} else {
			snprintf(desc, sizeof desc, "(unreadable: %s)", why ? why : "?");
		}
		fz_entry_free(e);
		printf("%s %8s  %s  %-10s %s\n", hex, human(v[i].size, sz, sizeof sz), when,
		       target, desc);
	}
	free(v);
	return 0;
}

static int cmd_stat(fz_disk *d)
{
	fz_disk_stats s;
	if (fz_disk_stat(d, &s) != FZ_OK) {
		fprintf(stderr, "fusec-cache: cannot read %s\n", fz_disk_path(d));
		return EXIT_BAD;
	}
	char a[32], b[32];
	uint64_t looks = s.hits + s.misses;
	printf("directory:  %s\n", fz_disk_path(d));
	printf("entries:    %lld\n", (long long)s.entries);
	printf("bytes:      %lld (%s of a %s cap)\n", (long long)s.bytes,
	       human(s.bytes, a, sizeof a), human(s.max_bytes, b, sizeof b));
	printf("cap:        %lld\n", (long long)s.max_bytes);
	printf("hits:       %llu\n", (unsigned long long)s.hits);
	printf("misses:     %llu\n", (unsigned long long)s.misses);
	printf("hit rate:   %.1f%%\n", looks ? 100.0 * (double)s.hits / (double)looks : 0.0);
	printf("stores:     %llu\n", (unsigned long long)s.stores);
	printf("evictions:  %llu\n", (unsigned long long)s.evictions);
	printf("removed damaged entries: %llu\n", (unsigned long long)s.removed_bad);
	return 0;
}

/* KEY, or a unique prefix of at least 4 hex digits. */
static int find_key(fz_disk *d, const char *arg, fz_key *out)
{
	if (fz_key_parse(arg, out))
		return 0;
	size_t n = strlen(arg);
	if (n < 4 || n > 32)
		return usage_error("'%s' is not a key (32 hex digits, or a prefix of "
				   "4 or more)", arg);
	fz_disk_info *v;
	int count, found = 0;
	if (fz_disk_list(d, &v, &count) != FZ_OK)
		return EXIT_BAD;
	for (int i = 0; i < count; i++) {
		char hex[FZ_KEY_HEX];
		fz_key_hex(v[i].key, hex);
		if (!strncmp(hex, arg, n)) {
			*out = v[i].key;
			found++;
		}
	}
	free(v);
	if (found == 1)
		return 0;
	fprintf(stderr, "fusec-cache: %s entry matches '%s'\n",
		found ? "more than one" : "no", arg);
	return EXIT_BAD;
}

static int cmd_show(fz_disk *d, const char *arg)
{
	fz_key k;
	int rc = find_key(d, arg, &k);
	if (rc)
		return rc;
	fz_entry *e;
	const char *why;
	fz_disk_read(d, k, &e, &why);
	char hex[FZ_KEY_HEX];
	fz_key_hex(k, hex);
	if (!e) {
		fprintf(stderr, "fusec-cache: entry %s: %s\n", hex, why ? why : "?");
		return EXIT_BAD;
	}
	printf("key:      %s\nformat:   %u\nsize:     %zu bytes\ncanonical form: %zu bytes\n",
	       hex, e->version, e->size, e->canon_len);
	for (int i = 0; i < e->n_sections; i++)
		printf("section:  %-16s %zu bytes\n", e->sections[i].tag, e->sections[i].len);
	printf("\n--- canonical form\n%.*s", (int)e->canon_len, e->canon);
	for (int i = 0; i < e->n_sections; i++) {
		const fz_section *s = &e->sections[i];
		if (!strncmp(s->tag, "cubin", 5) || !strcmp(s->tag, "obj"))
			continue; /* machine code: its size is above */
		printf("\n--- %s\n%.*s", s->tag, (int)s->len, (const char *)s->data);
		if (s->len && ((const char *)s->data)[s->len - 1] != '\n')
			printf("\n");
	}
	fz_entry_free(e);
	return 0;
}

static void report_bad(void *ctx, const char *path, const char *why)
{
	int *fix = ctx;
	printf("%s: %s%s\n", path, why, *fix ? " (removed)" : "");
}

static int cmd_verify(fz_disk *d, bool fix)
{
	int bad = 0, f = fix;
	if (fz_disk_verify(d, fix, report_bad, &f, &bad) != FZ_OK) {
		fprintf(stderr, "fusec-cache: cannot walk %s\n", fz_disk_path(d));
		return EXIT_BAD;
	}
	fz_disk_stats s;
	fz_disk_stat(d, &s);
	printf("%lld entries checked, %d bad%s\n", (long long)s.entries, bad,
	       bad && fix ? " (removed)" : "");
	return bad ? EXIT_BAD : 0;
}

static int cmd_prune(fz_disk *d, int64_t max)
{
	int removed;
	int64_t freed;
	char *err = NULL, a[32];
	fz_status st = fz_disk_prune(d, max, &removed, &freed, &err);
	if (removed || st == FZ_OK)
		printf("removed %d entries, %s bytes\n", removed,
		       human(freed, a, sizeof a));
	if (st != FZ_OK)
		fprintf(stderr, "fusec-cache: cannot prune %s: %s\n", fz_disk_path(d),
			err ? err : fz_status_name(st));
	free(err);
	return st == FZ_OK ? 0 : EXIT_BAD;
}

static int cmd_clear(fz_disk *d)
{
	int removed;
	char *err = NULL;
	fz_status st = fz_disk_clear(d, &removed, &err);
	if (removed || st == FZ_OK)
		printf("removed %d entries\n", removed);
	if (st != FZ_OK)
		fprintf(stderr, "fusec-cache: cannot clear %s: %s\n", fz_disk_path(d),
			err ? err : fz_status_name(st));
	free(err);
	return st == FZ_OK ? 0 : EXIT_BAD;
}

int main(int argc, char **argv)
{
	const char *dir = NULL, *cmd = NULL, *arg = NULL, *max_s = NULL;
	bool fix = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h") || !strcmp(a, "help")) {
			fputs(usage, stdout);
			return 0;
		} else if (!strcmp(a, "--cache-dir") || !strcmp(a, "--max-size")) {
			if (i + 1 >= argc)
				return usage_error("%s needs a value", a);
			if (!strcmp(a, "--cache-dir"))
				dir = argv[++i];
			else
				max_s = argv[++i];
		} else if (!strncmp(a, "--cache-dir=", 12)) {
			dir = a + 12;
		} else if (!strncmp(a, "--max-size=", 11)) {
			max_s = a + 11;
		} else if (!strcmp(a, "--fix")) {
			fix = true;
		} else if (a[0] == '-' && a[1]) {
			return usage_error("unknown option '%s'", a);
		} else if (!cmd) {
			cmd = a;
		} else if (!arg) {
			arg = a;
		} else {
			return usage_error("unexpected argument '%s'", a);
		}
	}
	if (!cmd)
		return usage_error("no command%s", "");
	static const char *const cmds[] = {"ls", "stat", "show", "verify", "prune", "clear"};
	bool known = false;
	for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
		known |= !strcmp(cmd, cmds[i]);
	if (!known)
		return usage_error("unknown command '%s'", cmd);
	if (!strcmp(cmd, "show") != !!arg)
		return usage_error(arg ? "unexpected argument '%s'" : "show needs a KEY%s",
				   arg ? arg : "");
	if (fix && strcmp(cmd, "verify"))
		return usage_error("--fix is for verify%s", "");
	int64_t max = 0;
	if (!strcmp(cmd, "prune") && !max_s)
		return usage_error("prune needs --max-size SIZE%s", "");
	if (max_s && strcmp(cmd, "prune"))
		return usage_error("--max-size is for prune%s", "");
	if (max_s && !fz_size_parse(max_s, &max))
		return usage_error("bad size '%s' (bytes, or with k, M, G, T)", max_s);

	fz_disk_options o = {dir, 0, on_warn, NULL};
	fz_disk *d = NULL;
	char *err = NULL;
	if (fz_disk_open(&o, &d, &err) != FZ_OK) {
		fprintf(stderr, "fusec-cache: %s\n", err ? err : "cannot open the cache");
		fz_free(err);
		return EXIT_BAD;
	}
	int rc;
	if (fz_disk_disabled(d) && strcmp(cmd, "verify")) {
		fprintf(stderr, "fusec-cache: %s\n", fz_disk_disabled(d));
		rc = EXIT_BAD;
	} else if (!strcmp(cmd, "ls")) {
		rc = cmd_ls(d);
	} else if (!strcmp(cmd, "stat")) {
		rc = cmd_stat(d);
	} else if (!strcmp(cmd, "show")) {
		rc = cmd_show(d, arg);
	} else if (!strcmp(cmd, "verify")) {
		rc = cmd_verify(d, fix);
	} else if (!strcmp(cmd, "prune")) {
		rc = cmd_prune(d, max);
	} else {
		rc = cmd_clear(d);
	}
	fz_disk_close(d);
	return rc;
}
