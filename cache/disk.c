/*
 * disk.c: the persistent cache: one file per compiled region, shared by
 * every process of the user, bounded in size, evicted by last use.
 *
 * Layout. The directory is $FUSEC_CACHE_DIR, else $XDG_CACHE_HOME/fusec,
 * else ~/.cache/fusec; its format lives under a version, so a later
 * format sits beside this one instead of misreading it:
 *
 *     DIR/v1/entries/3f/3fa9...e1.fzc     one entry per key (32 hex digits)
 *     DIR/v1/entries/3f/.tmp-PID-N-3fa9...  an entry being written
 *     DIR/v1/stats                         hit, miss, store, eviction counters
 *     DIR/v1/lock                          empty; guards the counters
 *
 * An entry, all integers little-endian:
 *
 *     0   magic "FZCACHE\0"
 *     8   u32 format version (1)      12  u32 header bytes (64)
 *     16  key: u64 hi, u64 lo         32  u64 canonical form bytes
 *     40  u32 sections                44  u32 zero
 *     48  u64 file bytes              56  u64 zero
 *     64  the canonical form
 *         per section: 16-byte tag ("ptx", "meta", "cubin.sm_90"),
 *                      u64 bytes, the bytes
 *     end XXH3-128 over everything before it (16 bytes)
 *
 * Writing. An entry is written whole to a temporary file in its own
 * directory, then renamed over the final name. rename is atomic, so a
 * reader opens either nothing, an older complete entry, or the new
 * complete entry; many processes can compile into one cache at once, and
 * two that make the same key write the same thing. Nothing is fsynced: a
 * crash can leave a short or zeroed file, and the checksum turns that into
 * a miss.
 *
 * Reading trusts nothing. The file is opened with O_NOFOLLOW and checked
 * through fstat on that descriptor (a regular file, owned by us, writable
 * by nobody else: loading a kernel is running code); then its size, magic,
 * version, key, every length and the checksum; then the stored canonical
 * form is compared with the one asked for, so a hash collision is a miss
 * and never a wrong kernel. A damaged or foreign-version entry is removed
 * (after checking that the name still points at the file we read, so a
 * fresh entry renamed in meanwhile survives) and reported once. A refused
 * one (not ours, writable by others) is reported and left alone; the next
 * store renames a good entry over it.
 *
 * Last use is the entry's mtime: a hit stamps it with futimens on the
 * descriptor already open, one system call. Eviction sorts by it: when a
 * store takes the cache past its cap ($FUSEC_CACHE_MAX_SIZE, 2 GiB), the
 * least recently used entries go. A process scans the directory for its
 * size at its first store, then counts what it adds, and rescans when it
 * thinks it crossed the cap; warm runs, which store nothing, never scan.
 *
 * Counters (hits, misses, stores, evictions, bad entries) add up in memory
 * and are merged into DIR/v1/stats when the cache is closed, under a POSIX
 * lock on DIR/v1/lock, by writing a new file and renaming it. The stats
 * file carries its own checksum; a damaged one is discarded and counting
 * starts again. Damage to any file therefore costs at most a recompile or
 * a count, never a wrong result.
 *
 * Degrading. A directory that cannot be created, or is not ours, or is
 * writable by others, leaves the cache disabled: every lookup misses, with
 * one warning. A full disk or a read-only directory turns storing off
 * with one warning; lookups go on. An entry whose own name is taken (a
 * directory squatting on it) fails that entry alone, with a warning about
 * its key; the others are stored. Every store that did not happen is
 * counted (fz_disk_not_stored), so `fusec compile` can fail rather than
 * say "compiled" of kernels it could not keep. Removing entries (`clear`,
 * `prune`) that the file system refuses is an error that says how many
 * and why. The stats file and the lock are opened without blocking and
 * checked to be regular files of ours: a FIFO in their place costs the
 * counts, never a hang.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "cache.h"

#define ENTRY_MAGIC "FZCACHE"     /* 8 bytes with its NUL */
#define STATS_MAGIC "FZSTATS"
#define HEADER_BYTES 64
#define STATS_BYTES 64
#define CHECKSUM_BYTES 16
#define MAX_ENTRY_BYTES ((int64_t)1 << 30)
#define STALE_TMP_SECONDS 3600

struct fz_disk {
	char *root;                 /* DIR */
	char *path;                 /* DIR/v1 */
	char *entries;              /* DIR/v1/entries */
	int64_t max_bytes;
	void (*warn)(void *ctx, const char *msg);
	void *warn_ctx;
	char *disabled;             /* why the cache is off, or NULL */

	pthread_mutex_t mu;         /* everything below */
	bool store_off;             /* a store failed: disk full, read-only */
	uint64_t not_stored;        /* stores that failed or were skipped */
	char *not_stored_why;       /* the first one's reason */
	unsigned char sub_ok[256];  /* 0 unchecked, 1 fine, 2 refused */
	bool scanned;
	int64_t total;              /* bytes in the cache, as this process knows */
	uint64_t hits, misses, stores, evictions, removed_bad;
	fz_key *warned;             /* keys already reported */
	int n_warned, cap_warned;
	unsigned tmp_counter;
};

/* ---- little-endian fields ---- */

static void put_u32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> 8 * i);
}

static void put_u64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> 8 * i);
}

static uint32_t get_u32(const unsigned char *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get_u64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* ---- sizes and directories ---- */

bool fz_size_parse(const char *s, int64_t *out)
{
	if (!s || !*s)
		return false;
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (end == s || errno || !(v >= 0))
		return false;
	double mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1024.0; end++; break;
	case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
	case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
	case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
	default: break;
	}
	if (mul > 1 && *end == 'i')
		end++;
	if (*end == 'B' || (*end == 'b' && mul > 1))
		end++;
	if (*end)
		return false;
	v *= mul;
	if (v > 9.0e18)
		return false;
	*out = (int64_t)v;
	return true;
}

fz_status fz_cache_dir(const char *dir, char **out, char **err)
{
	const char *e;
	if (dir && *dir)
		*out = fz_strdup(dir);
	else if ((e = getenv("FUSEC_CACHE_DIR")) && *e)
		*out = fz_strdup(e);
	else if ((e = getenv("XDG_CACHE_HOME")) && *e == '/')
		*out = fz_strdup_printf("%s/fusec", e);
	else if ((e = getenv("HOME")) && *e)
		*out = fz_strdup_printf("%s/.cache/fusec", e);
	else {
		*out = NULL;
		if (err)
			*err = fz_strdup("no cache directory: set FUSEC_CACHE_DIR or HOME");
		return FZ_EINVAL;
	}
	if (!*out) {
		if (err)
			*err = fz_strdup("out of memory");
		return FZ_ENOMEM;
	}
	return FZ_OK;
}

/* Is st a directory or file we may trust? NULL if so, else why not. */
static const char *untrusted(const struct stat *st, bool dir)
{
	if (dir ? !S_ISDIR(st->st_mode) : !S_ISREG(st->st_mode))
		return dir ? "not a directory" : "not a regular file";
	if (st->st_uid != geteuid())
		return "not owned by you";
	if (st->st_mode & (S_IWGRP | S_IWOTH))
		return "writable by others";
	return NULL;
}

/* Checks directory path: opened without following a link, fstat on it. */
static const char *check_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? "does not exist" :
		       errno == ELOOP || errno == ENOTDIR ? "not a directory" :
		       "cannot be opened";
	struct stat st;
	const char *why = fstat(fd, &st) ? "cannot be examined" : untrusted(&st, true);
	close(fd);
	return why;
}

/* mkdir -p with 0700 for what it creates. */
static int make_dirs(const char *path)
{
	char *p = fz_strdup(path);
	if (!p)
		return -1;
	int rc = 0;
	for (char *s = p + 1; ; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		char c = *s;
		*s = '\0';
		if (mkdir(p, 0700) && errno != EEXIST) {
			rc = -1;
			*s = c;
			break;
		}
		*s = c;
		if (!c)
			break;
	}
	int saved = errno;
	free(p);
	errno = saved;
	return rc;
}

/* ---- warnings ---- */

static void warn(fz_disk *d, const char *fmt, const char *a, const char *b)
{
	if (!d->warn)
		return;
	char msg[1024];
	snprintf(msg, sizeof msg, fmt, a, b);
	d->warn(d->warn_ctx, msg);
}

/* Reports a problem with one key's entry, once per process. */
static void warn_key(fz_disk *d, fz_key k, const char *what, const char *why)
{
	pthread_mutex_lock(&d->mu);
	bool seen = false;
	for (int i = 0; i < d->n_warned && !seen; i++)
		seen = fz_key_eq(d->warned[i], k);
	if (!seen && d->n_warned == d->cap_warned) {
		int cap = d->cap_warned ? 2 * d->cap_warned : 16;
		fz_key *w = realloc(d->warned, sizeof *w * (size_t)cap);
		if (w) {
			d->warned = w;
			d->cap_warned = cap;
		}
	}
	if (!seen && d->n_warned < d->cap_warned)
		d->warned[d->n_warned++] = k;
	pthread_mutex_unlock(&d->mu);
	if (seen)
		return;
	char hex[FZ_KEY_HEX], msg[256];
	fz_key_hex(k, hex);
	snprintf(msg, sizeof msg, "cache entry %s %s", hex, what);
	warn(d, "fusec: %s (%s)", msg, why);
}

/* ---- opening ---- */

fz_status fz_disk_open(const fz_disk_options *o, fz_disk **out, char **err)
{
	static const fz_disk_options none = {0};
	if (!o)
		o = &none;
	*out = NULL;
	fz_status st = FZ_ENOMEM;
	fz_disk *d = calloc(1, sizeof *d);
	if (!d)
		goto fail;
	pthread_mutex_init(&d->mu, NULL);
	d->warn = o->warn;
	d->warn_ctx = o->warn_ctx;
	d->max_bytes = o->max_bytes;
	const char *env = getenv("FUSEC_CACHE_MAX_SIZE");
	if (d->max_bytes <= 0 && env && *env && !fz_size_parse(env, &d->max_bytes)) {
		warn(d, "fusec: FUSEC_CACHE_MAX_SIZE=%s is not a size%s; using 2G",
		     env, "");
		d->max_bytes = 0;
	}
	if (d->max_bytes <= 0)
		d->max_bytes = FZ_DISK_DEFAULT_MAX;
	if ((st = fz_cache_dir(o->dir, &d->root, err)) != FZ_OK)
		goto fail;
	st = FZ_ENOMEM;
	d->path = fz_strdup_printf("%s/v%d", d->root, FZ_DISK_FORMAT);
	d->entries = fz_strdup_printf("%s/entries", d->path);
	if (!d->path || !d->entries)
		goto fail;

	const char *why = NULL, *which = d->root;
	if (make_dirs(d->entries) && errno != EROFS && errno != EACCES &&
	    errno != EPERM && errno != ENOSPC) {
		why = strerror(errno);
	} else {
		const char *dirs[3] = {d->root, d->path, d->entries};
		for (int i = 0; i < 3 && !why; i++)
			if ((why = check_dir(dirs[i])))
				which = dirs[i];
	}
	if (why) {
		d->disabled = fz_strdup_printf("cache directory %s: %s", which, why);
		if (!d->disabled)
			goto fail;
		warn(d, "fusec: %s; compiling without a cache%s", d->disabled, "");
	}
	*out = d;
	return FZ_OK;
fail:
	if (st == FZ_ENOMEM && err && !*err)
		*err = fz_strdup("out of memory");
	fz_disk_close(d);
	return st;
}

const char *fz_disk_path(const fz_disk *d) { return d->path; }
const char *fz_disk_disabled(const fz_disk *d) { return d->disabled; }

bool fz_disk_writable(const fz_disk *d)
{
	return !d->disabled && !d->store_off;
}

/* ---- counters ---- */

typedef struct counters {
	uint64_t hits, misses, stores, evictions, removed_bad;
} counters;

/* Reads DIR/v1/stats; false (and zeros) when absent or damaged. */
static bool stats_read(const fz_disk *d, counters *c, const char **why)
{
	memset(c, 0, sizeof *c);
	char *p = fz_strdup_printf("%s/stats", d->path);
	if (!p) {
		*why = "out of memory";
		return false;
	}
	/* O_NONBLOCK: a FIFO in its place must not wait for a writer (the
	 * fstat below then refuses it) */
	int fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	free(p);
	if (fd < 0) {
		*why = errno == ENOENT ? NULL : "cannot be opened";
		return false;
	}
	unsigned char b[STATS_BYTES + 1];
	struct stat st;
	*why = fstat(fd, &st) ? "cannot be examined" : untrusted(&st, false);
	ssize_t n = *why ? -1 : pread(fd, b, sizeof b, 0);
	close(fd);
	if (*why)
		return false;
	if (n != STATS_BYTES || memcmp(b, STATS_MAGIC, 8) ||
	    get_u32(b + 8) != FZ_DISK_FORMAT ||
	    get_u64(b + 56) != XXH3_64bits(b, 56)) {
		*why = "damaged";
		return false;
	}
	c->hits = get_u64(b + 16);
	c->misses = get_u64(b + 24);
	c->stores = get_u64(b + 32);
	c->evictions = get_u64(b + 40);
	c->removed_bad = get_u64(b + 48);
	return true;
}

static bool write_all(int fd, const void *buf, size_t n)
{
	const char *p = buf;
	while (n) {
		ssize_t k = write(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return false;
		p += k;
		n -= (size_t)k;
	}
	return true;
}

/* Writes a file whole under a temporary name in the same directory, then
 * renames it to path. -1 with errno on failure. */
static int write_atomic(fz_disk *d, const char *dir, const char *path,
			const char *tag, const void *data, size_t n)
{
	pthread_mutex_lock(&d->mu);
	unsigned k = d->tmp_counter++;
	pthread_mutex_unlock(&d->mu);
	char *tmp = fz_strdup_printf("%s/.tmp-%ld-%u-%s", dir, (long)getpid(), k, tag);
	if (!tmp) {
		errno = ENOMEM;
		return -1;
	}
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	int rc = -1, saved = 0;
	if (fd >= 0) {
		bool ok = write_all(fd, data, n);
		saved = errno;
		if (close(fd) == 0 && ok)
			rc = rename(tmp, path);
		else if (!saved)
			saved = errno ? errno : EIO;
		if (rc)
			saved = saved ? saved : errno;
		if (rc)
			unlink(tmp);
	} else {
		saved = errno;
	}
	free(tmp);
	errno = saved;
	return rc;
}

static void stats_encode(const counters *c, unsigned char *b)
{
	memset(b, 0, STATS_BYTES);
	memcpy(b, STATS_MAGIC, 8);
	put_u32(b + 8, FZ_DISK_FORMAT);
	put_u64(b + 16, c->hits);
	put_u64(b + 24, c->misses);
	put_u64(b + 32, c->stores);
	put_u64(b + 40, c->evictions);
	put_u64(b + 48, c->removed_bad);
	put_u64(b + 56, XXH3_64bits(b, 56));
}

/* Merges this process's counts into the stats file, under the lock. */
static void stats_flush(fz_disk *d, bool reset)
{
	if (d->disabled || d->store_off)
		return;
	if (!reset && !(d->hits | d->misses | d->stores | d->evictions | d->removed_bad))
		return;
	char *lockp = fz_strdup_printf("%s/lock", d->path);
	char *statp = fz_strdup_printf("%s/stats", d->path);
	int fd = lockp ? open(lockp, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC |
			      O_NONBLOCK, 0600) : -1;
	struct stat lst;
	if (fd >= 0 && (fstat(fd, &lst) || untrusted(&lst, false))) {
		/* not a lock we can trust (a FIFO, another's file): the counts
		 * are lost, which costs a number, never a hang */
		close(fd);
		fd = -1;
	}
	if (fd >= 0) {
		struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
		while (fcntl(fd, F_SETLKW, &fl) == -1 && errno == EINTR)
			;
		counters c;
		const char *why;
		stats_read(d, &c, &why);
		if (reset)
			memset(&c, 0, sizeof c);
		c.hits += d->hits;
		c.misses += d->misses;
		c.stores += d->stores;
		c.evictions += d->evictions;
		c.removed_bad += d->removed_bad;
		unsigned char b[STATS_BYTES];
		stats_encode(&c, b);
		if (statp)
			write_atomic(d, d->path, statp, "stats", b, sizeof b);
		close(fd); /* drops the lock */
	}
	d->hits = d->misses = d->stores = d->evictions = d->removed_bad = 0;
	free(lockp);
	free(statp);
}

void fz_disk_close(fz_disk *d)
{
	if (!d)
		return;
	if (d->path)
		stats_flush(d, false);
	pthread_mutex_destroy(&d->mu);
	free(d->root);
	free(d->path);
	free(d->entries);
	free(d->disabled);
	free(d->not_stored_why);
	free(d->warned);
	free(d);
}

/* ---- entries ---- */

static char *entry_dir(const fz_disk *d, const char *hex)
{
	return fz_strdup_printf("%s/%.2s", d->entries, hex);
}

static char *entry_path(const fz_disk *d, const char *hex)
{
	return fz_strdup_printf("%s/%.2s/%s.fzc", d->entries, hex, hex);
}

const fz_section *fz_entry_section(const fz_entry *e, const char *tag)
{
	for (int i = 0; e && i < e->n_sections; i++)
		if (!strncmp(e->sections[i].tag, tag, FZ_SECTION_TAG))
			return &e->sections[i];
	return NULL;
}

void fz_entry_free(fz_entry *e)
{
	if (!e)
		return;
	if (e->mapped)
		munmap(e->block, e->mapped);
	else
		free(e->block);
	free(e);
}

#define MAP_ENTRY_BYTES ((size_t)256 << 10)

typedef enum { RD_OK, RD_ABSENT, RD_DAMAGED, RD_REFUSED, RD_ERROR } rd_result;

/* Parses and checks an entry image of n bytes. */
static const char *entry_check(const unsigned char *b, size_t n, fz_key key,
			       fz_entry *e)
{
	if (n < HEADER_BYTES + CHECKSUM_BYTES)
		return "truncated";
	if (memcmp(b, ENTRY_MAGIC, 8))
		return "not a cache entry";
	if (get_u32(b + 8) != FZ_DISK_FORMAT)
		return "another format version";
	if (get_u32(b + 12) != HEADER_BYTES)
		return "bad header";
	if (get_u64(b + 48) != n)
		return "truncated";
	XXH128_hash_t h = XXH3_128bits(b, n - CHECKSUM_BYTES);
	if (get_u64(b + n - 16) != h.high64 || get_u64(b + n - 8) != h.low64)
		return "checksum mismatch";
	fz_key k = {get_u64(b + 16), get_u64(b + 24)};
	if (!fz_key_eq(k, key))
		return "stored under another key";
	uint64_t canon_len = get_u64(b + 32);
	uint32_t ns = get_u32(b + 40);
	size_t end = n - CHECKSUM_BYTES, off = HEADER_BYTES;
	if (canon_len > end - off || ns > FZ_ENTRY_MAX_SECTIONS)
		return "bad lengths";
	e->key = k;
	e->version = FZ_DISK_FORMAT;
	e->canon = (const char *)b + off;
	e->canon_len = (size_t)canon_len;
	off += (size_t)canon_len;
	e->n_sections = (int)ns;
	for (uint32_t i = 0; i < ns; i++) {
		if (end - off < FZ_SECTION_TAG + 8)
			return "bad lengths";
		fz_section *s = &e->sections[i];
		memcpy(s->tag, b + off, FZ_SECTION_TAG);
		s->tag[FZ_SECTION_TAG - 1] = '\0';
		uint64_t len = get_u64(b + off + FZ_SECTION_TAG);
		off += FZ_SECTION_TAG + 8;
		if (len > end - off)
			return "bad lengths";
		s->data = b + off;
		s->len = (size_t)len;
		off += (size_t)len;
	}
	if (off != end)
		return "bad lengths";
	e->size = n;
	return NULL;
}

/* Reads the entry open on fd, expected to hold key. */
static rd_result entry_read(int fd, fz_key key, fz_entry **out, const char **why)
{
	*out = NULL;
	struct stat st;
	if (fstat(fd, &st)) {
		*why = "cannot be examined";
		return RD_ERROR;
	}
	if ((*why = untrusted(&st, false)))
		return RD_REFUSED;
	if (st.st_size > MAX_ENTRY_BYTES) {
		*why = "too large";
		return RD_DAMAGED;
	}
	size_t n = (size_t)st.st_size;
	fz_entry *e = calloc(1, sizeof *e);
	/* A big entry (a program: megabytes) is mapped from the page cache
	 * rather than copied into fresh memory, a page fault per 64 KiB
	 * instead of per 4 KiB. Entries are written whole and renamed into
	 * place, never changed in place, so what is mapped stays. */
	if (e && n >= MAP_ENTRY_BYTES) {
		void *m = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
		if (m != MAP_FAILED) {
			if ((*why = entry_check(m, n, key, e))) {
				munmap(m, n);
				free(e);
				return RD_DAMAGED;
			}
			e->block = m;
			e->mapped = n;
			*out = e;
			return RD_OK;
		}
	}
	unsigned char *b = malloc(n + 1);
	if (!e || !b) {
		free(e);
		free(b);
		*why = "out of memory";
		return RD_ERROR;
	}
	size_t got = 0;
	while (got < n) {
		ssize_t k = pread(fd, b + got, n - got, (off_t)got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	*why = got != n ? "truncated" : entry_check(b, n, key, e);
	if (*why) {
		free(e);
		free(b);
		return RD_DAMAGED;
	}
	e->block = b;
	*out = e;
	return RD_OK;
}

/* Removes path if it is still the file open on fd. */
static bool unlink_if_same(const char *path, int fd)
{
	struct stat a, b;
	if (fstat(fd, &a) || lstat(path, &b) || a.st_dev != b.st_dev ||
	    a.st_ino != b.st_ino)
		return false;
	return unlink(path) == 0;
}

/* Opens and reads key's entry; a damaged one is removed when remove. */
static rd_result entry_load(fz_disk *d, fz_key key, bool remove,
			    fz_entry **out, const char **why, int *fd_out)
{
	char hex[FZ_KEY_HEX];
	fz_key_hex(key, hex);
	*out = NULL;
	*fd_out = -1;
	char *path = entry_path(d, hex);
	if (!path) {
		*why = "out of memory";
		return RD_ERROR;
	}
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		rd_result r = errno == ENOENT ? RD_ABSENT :
			      errno == ELOOP ? RD_REFUSED : RD_ERROR;
		*why = r == RD_REFUSED ? "a symbolic link" : strerror(errno);
		free(path);
		return r;
	}
	rd_result r = entry_read(fd, key, out, why);
	if (r == RD_DAMAGED && remove && unlink_if_same(path, fd)) {
		pthread_mutex_lock(&d->mu);
		d->removed_bad++;
		pthread_mutex_unlock(&d->mu);
	}
	free(path);
	*fd_out = fd;
	return r;
}

fz_status fz_disk_lookup(fz_disk *d, fz_key key, const char *canon, size_t len,
			 fz_entry **out)
{
	*out = NULL;
	if (d->disabled)
		return FZ_OK;
	const char *why = NULL;
	fz_entry *e;
	int fd;
	rd_result r = entry_load(d, key, true, &e, &why, &fd);
	if (r == RD_DAMAGED)
		warn_key(d, key, "is damaged and was removed", why);
	else if (r == RD_REFUSED)
		warn_key(d, key, "is refused", why);
	bool hit = r == RD_OK && e->canon_len == len && !memcmp(e->canon, canon, len);
	if (hit)
		futimens(fd, NULL); /* last use: now */
	if (fd >= 0)
		close(fd);
	if (!hit)
		fz_entry_free(e);
	pthread_mutex_lock(&d->mu);
	if (hit)
		d->hits++;
	else
		d->misses++;
	pthread_mutex_unlock(&d->mu);
	if (r == RD_ERROR && !strcmp(why, "out of memory"))
		return FZ_ENOMEM;
	*out = hit ? e : NULL;
	return FZ_OK;
}

fz_status fz_disk_read(fz_disk *d, fz_key key, fz_entry **out, const char **why)
{
	*out = NULL;
	*why = NULL;
	if (d->disabled) {
		*why = "the cache is disabled";
		return FZ_OK;
	}
	int fd;
	rd_result r = entry_load(d, key, false, out, why, &fd);
	if (fd >= 0)
		close(fd);
	if (r == RD_ABSENT)
		*why = "no such entry";
	return r == RD_ERROR && !strcmp(*why, "out of memory") ? FZ_ENOMEM : FZ_OK;
}

/* Is the entry subdirectory for hex ours (creating it if needed)? */
static bool subdir_ready(fz_disk *d, const char *hex, const char *dir)
{
	int i = (int)strtol((char[3]){hex[0], hex[1], 0}, NULL, 16);
	pthread_mutex_lock(&d->mu);
	int known = d->sub_ok[i];
	pthread_mutex_unlock(&d->mu);
	if (known)
		return known == 1;
	if (mkdir(dir, 0700) && errno != EEXIST)
		return false; /* the caller looks at errno */
	const char *why = check_dir(dir);
	if (why)
		warn(d, "fusec: cache directory %s is refused (%s)", dir, why);
	pthread_mutex_lock(&d->mu);
	d->sub_ok[i] = why ? 2 : 1;
	pthread_mutex_unlock(&d->mu);
	errno = 0;
	return !why;
}

static void maybe_evict(fz_disk *d, int64_t added);

/* Does a write that failed with errno e stop storing for the whole cache
 * (read-only, full, not ours), or only for the entry it wrote? */
static bool whole_cache(int e)
{
	return e == EROFS || e == EACCES || e == EPERM || e == ENOSPC ||
	       e == EDQUOT || e == EFBIG || e == EIO || e == ENOMEM;
}

/* Counts a store that did not happen, keeping the first reason. */
static void not_stored(fz_disk *d, const char *why)
{
	pthread_mutex_lock(&d->mu);
	d->not_stored++;
	if (!d->not_stored_why)
		d->not_stored_why = fz_strdup(why);
	pthread_mutex_unlock(&d->mu);
}

uint64_t fz_disk_not_stored(fz_disk *d, const char **why)
{
	pthread_mutex_lock(&d->mu);
	uint64_t n = d->not_stored;
	if (why)
		*why = d->not_stored_why;
	pthread_mutex_unlock(&d->mu);
	return n;
}

fz_status fz_disk_store(fz_disk *d, fz_key key, const char *canon, size_t len,
			const fz_section *sections, int n_sections)
{
	if (n_sections < 0 || n_sections > FZ_ENTRY_MAX_SECTIONS ||
	    (n_sections && !sections) || (len && !canon))
		return FZ_EINVAL;
	if (!fz_disk_writable(d)) {
		not_stored(d, d->disabled ? d->disabled : "storing is off");
		return FZ_OK;
	}
	size_t n = HEADER_BYTES + len + CHECKSUM_BYTES;
	for (int i = 0; i < n_sections; i++)
		n += FZ_SECTION_TAG + 8 + sections[i].len;
	if ((int64_t)n > MAX_ENTRY_BYTES)
		return FZ_EINVAL;
	unsigned char *b = calloc(1, n);
	char hex[FZ_KEY_HEX];
	fz_key_hex(key, hex);
	char *dir = entry_dir(d, hex), *path = entry_path(d, hex);
	fz_status st = FZ_ENOMEM;
	if (!b || !dir || !path)
		goto done;
	memcpy(b, ENTRY_MAGIC, 8);
	put_u32(b + 8, FZ_DISK_FORMAT);
	put_u32(b + 12, HEADER_BYTES);
	put_u64(b + 16, key.hi);
	put_u64(b + 24, key.lo);
	put_u64(b + 32, len);
	put_u32(b + 40, (uint32_t)n_sections);
	put_u64(b + 48, n);
	size_t off = HEADER_BYTES;
	if (len)
		memcpy(b + off, canon, len);
	off += len;
	for (int i = 0; i < n_sections; i++) {
		strncpy((char *)b + off, sections[i].tag, FZ_SECTION_TAG - 1);
		put_u64(b + off + FZ_SECTION_TAG, sections[i].len);
		off += FZ_SECTION_TAG + 8;
		if (sections[i].len)
			memcpy(b + off, sections[i].data, sections[i].len);
		off += sections[i].len;
	}
	XXH128_hash_t h = XXH3_128bits(b, off);
	put_u64(b + off, h.high64);
	put_u64(b + off + 8, h.low64);
	st = FZ_OK;
	errno = 0;
	if (!subdir_ready(d, hex, dir)) {
		if (errno && whole_cache(errno)) /* read-only, full */
			goto off;
		not_stored(d, "its directory is refused");
		goto done;   /* refused, said once */
	}
	if (write_atomic(d, dir, path, hex, b, n)) {
		if (whole_cache(errno))
			goto off;
		/* this entry's own trouble (a directory squatting on its
		 * name): it alone is not stored */
		int e = errno;
		warn_key(d, key, "cannot be stored", strerror(e));
		char *why = fz_strdup_printf("%s: %s", path, strerror(e));
		not_stored(d, why ? why : strerror(e));
		free(why);
		goto done;
	}
	pthread_mutex_lock(&d->mu);
	d->stores++;
	pthread_mutex_unlock(&d->mu);
	maybe_evict(d, (int64_t)n);
	goto done;
off:;
	int e = errno;
	pthread_mutex_lock(&d->mu);
	bool first = !d->store_off;
	d->store_off = true;
	pthread_mutex_unlock(&d->mu);
	char *why = fz_strdup_printf("cannot write to %s: %s", d->path, strerror(e));
	not_stored(d, why ? why : strerror(e));
	free(why);
	if (first)
		warn(d, "fusec: cannot write to the cache in %s (%s); compiling "
		     "without caching", d->path, strerror(e));
done:
	free(b);
	free(dir);
	free(path);
	return st;
}

/* ---- walking the directory ---- */

typedef enum { F_ENTRY, F_TMP, F_OTHER, F_BADDIR } file_kind;

typedef struct walk_file {
	char *path;
	file_kind kind;
	fz_key key;
	struct stat st;
} walk_file;

typedef struct walk {
	walk_file *f;
	int n, cap;
	bool oom;
} walk;

static bool is_hex(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

static void walk_add(walk *w, char *path, file_kind k, fz_key key,
		     const struct stat *st)
{
	if (!path) {
		w->oom = true;
		return;
	}
	if (w->n == w->cap) {
		int cap = w->cap ? 2 * w->cap : 64;
		walk_file *f = realloc(w->f, sizeof *f * (size_t)cap);
		if (!f) {
			free(path);
			w->oom = true;
			return;
		}
		w->f = f;
		w->cap = cap;
	}
	w->f[w->n++] = (walk_file){path, k, key, *st};
}

static void walk_release(walk *w)
{
	for (int i = 0; i < w->n; i++)
		free(w->f[i].path);
	free(w->f);
	memset(w, 0, sizeof *w);
}

/* Every file under DIR/v1/entries, classified. */
static fz_status walk_entries(fz_disk *d, walk *w)
{
	memset(w, 0, sizeof *w);
	DIR *top = opendir(d->entries);
	if (!top)
		return errno == ENOENT ? FZ_OK : FZ_EIO;
	struct dirent *de;
	while ((de = readdir(top))) {
		const char *sub = de->d_name;
		if (!strcmp(sub, ".") || !strcmp(sub, ".."))
			continue;
		char *subp = fz_strdup_printf("%s/%s", d->entries, sub);
		struct stat st;
		if (!subp || lstat(subp, &st)) {
			w->oom |= !subp;
			free(subp);
			continue;
		}
		if (!S_ISDIR(st.st_mode) || strlen(sub) != 2 || !is_hex(sub, 2) ||
		    untrusted(&st, true)) {
			walk_add(w, subp, S_ISDIR(st.st_mode) ? F_BADDIR : F_OTHER,
				 (fz_key){0, 0}, &st);
			continue;
		}
		DIR *dd = opendir(subp);
		while (dd && (de = readdir(dd))) {
			const char *name = de->d_name;
			if (!strcmp(name, ".") || !strcmp(name, ".."))
				continue;
			char *fp = fz_strdup_printf("%s/%s", subp, name);
			if (!fp || lstat(fp, &st)) {
				w->oom |= !fp;
				free(fp);
				continue;
			}
			fz_key k = {0, 0};
			char hex[FZ_KEY_HEX];
			size_t nl = strlen(name);
			file_kind kind = F_OTHER;
			if (!strncmp(name, ".tmp-", 5))
				kind = F_TMP;
			else if (nl == 36 && !strcmp(name + 32, ".fzc") &&
				 is_hex(name, 32) && !memcmp(name, sub, 2)) {
				memcpy(hex, name, 32);
				hex[32] = '\0';
				if (fz_key_parse(hex, &k))
					kind = F_ENTRY;
			}
			walk_add(w, fp, kind, k, &st);
		}
		if (dd)
			closedir(dd);
		free(subp);
	}
	closedir(top);
	return w->oom ? FZ_ENOMEM : FZ_OK;
}

static int by_mtime_asc(const void *pa, const void *pb)
{
	const walk_file *a = pa, *b = pb;
	if (a->st.st_mtim.tv_sec != b->st.st_mtim.tv_sec)
		return a->st.st_mtim.tv_sec < b->st.st_mtim.tv_sec ? -1 : 1;
	if (a->st.st_mtim.tv_nsec != b->st.st_mtim.tv_nsec)
		return a->st.st_mtim.tv_nsec < b->st.st_mtim.tv_nsec ? -1 : 1;
	return strcmp(a->path, b->path);
}

static bool stale_tmp(const walk_file *f)
{
	return f->kind == F_TMP && time(NULL) - f->st.st_mtime > STALE_TMP_SECONDS;
}

/* What removing entries could not do: how many, and the first errno. */
typedef struct unremoved {
	int n, err;
} unremoved;

static void unremoved_add(unremoved *u, int e)
{
	if (u && !u->n++)
		u->err = e;
}

/* "cannot remove 3 entries from DIR (Read-only file system)", or NULL. */
static char *unremoved_msg(const fz_disk *d, const unremoved *u)
{
	if (!u->n)
		return NULL;
	return fz_strdup_printf("cannot remove %d entr%s from %s (%s)", u->n,
				u->n == 1 ? "y" : "ies", d->entries, strerror(u->err));
}

/* Removes the least recently used entries until at most max bytes remain;
 * returns the bytes left. What could not be removed is counted in u. */
static int64_t prune_to(fz_disk *d, int64_t max, int *removed, int64_t *freed,
			unremoved *u)
{
	walk w;
	int64_t total = 0;
	if (removed)
		*removed = 0;
	if (freed)
		*freed = 0;
	if (walk_entries(d, &w) != FZ_OK) {
		walk_release(&w);
		return -1;
	}
	int n = 0;
	for (int i = 0; i < w.n; i++) {
		if (w.f[i].kind == F_ENTRY) {
			w.f[n++] = w.f[i];
			continue;
		}
		if (stale_tmp(&w.f[i]))
			unlink(w.f[i].path);
		free(w.f[i].path);
	}
	for (int i = 0; i < n; i++)
		total += w.f[i].st.st_size;
	qsort(w.f, (size_t)n, sizeof *w.f, by_mtime_asc);
	for (int i = 0; i < n && total > max; i++) {
		if (unlink(w.f[i].path) && errno != ENOENT) {
			unremoved_add(u, errno);
			continue;
		}
		total -= w.f[i].st.st_size;
		if (removed)
			(*removed)++;
		if (freed)
			*freed += w.f[i].st.st_size;
		pthread_mutex_lock(&d->mu);
		d->evictions++;
		pthread_mutex_unlock(&d->mu);
	}
	for (int i = 0; i < n; i++)
		free(w.f[i].path);
	free(w.f);
	return total;
}

/* After a store of `added` bytes: scan once, count, evict past the cap. */
static void maybe_evict(fz_disk *d, int64_t added)
{
	pthread_mutex_lock(&d->mu);
	bool scan = !d->scanned;
	d->total += added;
	bool over = d->scanned && d->total > d->max_bytes;
	d->scanned = true;
	pthread_mutex_unlock(&d->mu);
	if (!scan && !over)
		return;
	int64_t total = prune_to(d, scan ? INT64_MAX : d->max_bytes, NULL, NULL, NULL);
	if (scan && total > d->max_bytes)
		total = prune_to(d, d->max_bytes, NULL, NULL, NULL);
	pthread_mutex_lock(&d->mu);
	if (total >= 0)
		d->total = total;
	pthread_mutex_unlock(&d->mu);
}

/* ---- maintenance ---- */

fz_status fz_disk_stat(fz_disk *d, fz_disk_stats *s)
{
	memset(s, 0, sizeof *s);
	s->max_bytes = d->max_bytes;
	if (d->disabled)
		return FZ_EIO;
	walk w;
	fz_status st = walk_entries(d, &w);
	for (int i = 0; i < w.n; i++)
		if (w.f[i].kind == F_ENTRY) {
			s->entries++;
			s->bytes += w.f[i].st.st_size;
		}
	walk_release(&w);
	counters c;
	const char *why;
	stats_read(d, &c, &why);
	s->hits = c.hits + d->hits;
	s->misses = c.misses + d->misses;
	s->stores = c.stores + d->stores;
	s->evictions = c.evictions + d->evictions;
	s->removed_bad = c.removed_bad + d->removed_bad;
	return st;
}

static int info_by_use_desc(const void *pa, const void *pb)
{
	const fz_disk_info *a = pa, *b = pb;
	if (a->last_use != b->last_use)
		return a->last_use > b->last_use ? -1 : 1;
	return a->key.hi != b->key.hi ? (a->key.hi < b->key.hi ? -1 : 1) :
	       a->key.lo < b->key.lo ? -1 : a->key.lo > b->key.lo;
}

fz_status fz_disk_list(fz_disk *d, fz_disk_info **out, int *n)
{
	*out = NULL;
	*n = 0;
	if (d->disabled)
		return FZ_EIO;
	walk w;
	fz_status st = walk_entries(d, &w);
	fz_disk_info *v = st == FZ_OK ? calloc((size_t)w.n + 1, sizeof *v) : NULL;
	if (st == FZ_OK && !v)
		st = FZ_ENOMEM;
	for (int i = 0; v && i < w.n; i++)
		if (w.f[i].kind == F_ENTRY)
			v[(*n)++] = (fz_disk_info){w.f[i].key, w.f[i].st.st_size,
						   w.f[i].st.st_mtime};
	walk_release(&w);
	if (v)
		qsort(v, (size_t)*n, sizeof *v, info_by_use_desc);
	*out = v;
	return st;
}

fz_status fz_disk_verify(fz_disk *d, bool fix,
			 void (*report)(void *ctx, const char *path,
					const char *why),
			 void *ctx, int *n_bad)
{
	*n_bad = 0;
	if (d->disabled) {
		if (report)
			report(ctx, d->root, d->disabled);
		(*n_bad)++;
		return FZ_OK;
	}
	walk w;
	fz_status st = walk_entries(d, &w);
	for (int i = 0; i < w.n; i++) {
		walk_file *f = &w.f[i];
		const char *why = NULL;
		if (f->kind == F_ENTRY) {
			int fd = open(f->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
			if (fd < 0) {
				why = errno == ENOENT ? NULL : errno == ELOOP ?
				      "a symbolic link" : "cannot be opened";
			} else {
				fz_entry *e;
				entry_read(fd, f->key, &e, &why);
				fz_entry_free(e);
				close(fd);
			}
		} else if (f->kind == F_TMP) {
			why = stale_tmp(f) ? "a stale temporary file" : NULL;
		} else if (f->kind == F_BADDIR) {
			why = untrusted(&f->st, true) ? untrusted(&f->st, true) :
			      "not an entry directory";
		} else {
			why = "not a cache entry";
		}
		if (!why)
			continue;
		(*n_bad)++;
		if (report)
			report(ctx, f->path, why);
		if (fix) {
			if (f->kind == F_BADDIR) {
				rmdir(f->path); /* only an empty one goes */
			} else {
				unlink(f->path);
			}
		}
	}
	walk_release(&w);
	/* the counters and the lock */
	counters c;
	const char *why = NULL;
	if (!stats_read(d, &c, &why) && why) {
		char *p = fz_strdup_printf("%s/stats", d->path);
		(*n_bad)++;
		if (report)
			report(ctx, p ? p : "stats", why);
		if (fix && p) {
			unlink(p);
			stats_flush(d, true);
		}
		free(p);
	}
	char *lp = fz_strdup_printf("%s/lock", d->path);
	struct stat lst;
	if (lp && !lstat(lp, &lst) && (why = untrusted(&lst, false))) {
		(*n_bad)++;
		if (report)
			report(ctx, lp, why);
		if (fix)
			unlink(lp);
	}
	free(lp);
	return st;
}

/* The error of a maintenance command: why the cache is off, a walk that
 * failed, or what could not be removed. */
static fz_status maint_error(const fz_disk *d, fz_status st, const unremoved *u,
			     char **err)
{
	char *msg = d->disabled ? fz_strdup(d->disabled) :
		    st != FZ_OK ? fz_strdup_printf("cannot read %s", d->entries) :
		    unremoved_msg(d, u);
	if (err)
		*err = msg;
	else
		free(msg);
	return d->disabled || u->n ? FZ_EIO : st;
}

fz_status fz_disk_prune(fz_disk *d, int64_t max_bytes, int *removed,
			int64_t *freed, char **err)
{
	unremoved u = {0, 0};
	if (err)
		*err = NULL;
	*removed = 0;
	*freed = 0;
	if (d->disabled)
		return maint_error(d, FZ_EIO, &u, err);
	int64_t left = prune_to(d, max_bytes, removed, freed, &u);
	return maint_error(d, left < 0 ? FZ_EIO : FZ_OK, &u, err);
}

fz_status fz_disk_clear(fz_disk *d, int *removed, char **err)
{
	unremoved u = {0, 0};
	if (err)
		*err = NULL;
	*removed = 0;
	if (d->disabled)
		return maint_error(d, FZ_EIO, &u, err);
	walk w;
	fz_status st = walk_entries(d, &w);
	for (int i = 0; i < w.n; i++) {
		if (w.f[i].kind != F_ENTRY && w.f[i].kind != F_TMP)
			continue;
		if (!unlink(w.f[i].path))
			*removed += w.f[i].kind == F_ENTRY;
		else if (errno != ENOENT)
			unremoved_add(&u, errno);
	}
	walk_release(&w);
	return maint_error(d, st, &u, err);
}
