/*
 * util.c: the small services every stage leans on.
 *
 * The arena: a trace allocates all it holds (nodes, values, shapes, names,
 * attribute lists) from a chain of chunks and frees them in one go. Chunks
 * double in size up to 8 MiB (in huge pages, below), so a 32-layer trace
 * makes a few dozen calls to malloc, not a hundred thousand. Allocations are zeroed and 16-byte
 * aligned; a request larger than a chunk gets a chunk of its own.
 *
 * The growing string (fz_buf) used by the printer and by diagnostics; it
 * remembers running out of memory instead of failing every call, so callers
 * check once at the end.
 *
 * The names of statuses and dtypes, and the one assert that aborts.
 */
#define _DEFAULT_SOURCE /* madvise */
#include <sys/mman.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ir.h"

_Noreturn void fz_assert_fail(const char *what, const char *file, int line)
{
	fprintf(stderr, "fusec: internal error: %s:%d: assertion '%s' failed\n",
		file, line, what);
	abort();
}

void fz_free(void *p) { free(p); }

/* ---- arena ---- */

struct fz_chunk {
	fz_chunk *next;
	size_t used, cap;
	size_t mapped;       /* bytes mapped by fz_huge_alloc (then zero-filled
	                      * by the kernel: no memset), or 0: malloc */
	_Alignas(16) unsigned char data[];
};

/* Chunks double to 1 MiB, then are 8 MiB, and the whole 2 MiB pages
 * inside one of 4 MiB and more are handed to transparent huge pages
 * (madvise, where the system leaves them to madvise, as most do): a big
 * trace's arena (the 32-layer Llama's is ~20 MB) then faults in a page
 * per 2 MiB, not per 4 KiB. In a fresh process those faults were most of
 * parsing's time (34-45 ms against 13 ms for a parse into reused
 * memory). A process that parses again and again pays them each time
 * (mapped chunks go back to the system), and ASan does not watch mapped
 * chunks as it watches malloc's. */
#define ARENA_CHUNK_MAX ((size_t)8 << 20)
#define HUGE_PAGE ((uintptr_t)2 << 20)

void fz_huge_pages(void *p, size_t n)
{
#ifdef MADV_HUGEPAGE
	uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
	uintptr_t e = ((uintptr_t)p + n) & ~(HUGE_PAGE - 1);
	if (e > a)
		(void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
	(void)p;
	(void)n;
#endif
}

void *fz_huge_alloc(size_t n, size_t *mapped)
{
	*mapped = 0;
	size_t len = (n + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
	unsigned char *p = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	/* trim to a 2 MiB boundary at both ends: every page of it can be huge
	 * (a malloc'd buffer keeps up to 2 MiB at each end in 4 KiB pages) */
	unsigned char *a = (unsigned char *)(((uintptr_t)p + HUGE_PAGE - 1) &
					     ~(HUGE_PAGE - 1));
	if (a > p)
		munmap(p, (size_t)(a - p));
	if (a + len < p + len + HUGE_PAGE)
		munmap(a + len, (size_t)(p + len + HUGE_PAGE - (a + len)));
	fz_huge_pages(a, len);
	*mapped = len;
	return a;
}

void fz_huge_free(void *p, size_t mapped)
{
	if (p && mapped)
		munmap(p, mapped);
}

/* A chunk of cap bytes: big ones mapped whole in huge pages. */
static fz_chunk *chunk_new(size_t cap)
{
	fz_chunk *c;
	size_t mapped = 0;
	if (cap >= 2 * HUGE_PAGE)
		c = fz_huge_alloc(sizeof *c + cap, &mapped);
	else
		c = malloc(sizeof *c + cap);
	if (!c)
		return NULL;
	c->used = 0;
	c->cap = cap;
	c->mapped = mapped;
	return c;
}

void *fz_arena_alloc(fz_arena *a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	if (n == 0)
		n = 16;
	fz_chunk *c = a->head;
	if (!c || c->cap - c->used < n) {
		size_t cap = c ? c->cap * 2 : 4096;
		if (cap > ((size_t)1 << 20)) /* past 1 MiB: a big trace */
			cap = ARENA_CHUNK_MAX;
		if (cap < n)
			cap = n;
		c = chunk_new(cap);
		if (!c)
			return NULL;
		c->next = a->head;
		a->head = c;
		a->total += cap;
	}
	void *p = c->data + c->used;
	c->used += n;
	if (!c->mapped) /* a mapped chunk is zero where nothing was put yet */
		memset(p, 0, n);
	return p;
}

void fz_arena_reserve(fz_arena *a, size_t n)
{
	fz_chunk *c = a->head;
	if (c && c->cap - c->used >= n)
		return;
	n = (n + 15) & ~(size_t)15;
	c = chunk_new(n);
	if (!c)
		return; /* the chunks that come later are made as they are needed */
	c->next = a->head;
	a->head = c;
	a->total += n;
}

char *fz_arena_strdup(fz_arena *a, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = fz_arena_alloc(a, n);
	if (p)
		memcpy(p, s, n);
	return p;
}

void fz_arena_release(fz_arena *a)
{
	fz_chunk *c = a->head;
	while (c) {
		fz_chunk *next = c->next;
		if (c->mapped)
			fz_huge_free(c, c->mapped);
		else
			free(c);
		c = next;
	}
	a->head = NULL;
	a->total = 0;
}

/* ---- strings ---- */

void fz_set_err(char **err, char *msg)
{
	if (!err) {
		free(msg);
		return;
	}
	free(*err);
	*err = msg ? msg : fz_strdup("out of memory");
}

double fz_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

char *fz_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = malloc(n);
	if (p)
		memcpy(p, s, n);
	return p;
}

static char *vstrdup_printf(const char *fmt, va_list ap)
{
	va_list ap2;
	va_copy(ap2, ap);
	int n = vsnprintf(NULL, 0, fmt, ap2);
	va_end(ap2);
	if (n < 0)
		return NULL;
	char *p = malloc((size_t)n + 1);
	if (p)
		vsnprintf(p, (size_t)n + 1, fmt, ap);
	return p;
}

char *fz_strdup_printf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *p = vstrdup_printf(fmt, ap);
	va_end(ap);
	return p;
}

int fz_fail(fz_trace *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t->error, sizeof t->error, fmt, ap);
	va_end(ap);
	return -1;
}

static bool buf_reserve(fz_buf *b, size_t extra)
{
	if (b->oom)
		return false;
	if (b->len + extra + 1 <= b->cap)
		return true;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < b->len + extra + 1)
		cap *= 2;
	char *p = realloc(b->data, cap);
	if (!p) {
		b->oom = true;
		return false;
	}
	b->data = p;
	b->cap = cap;
	return true;
}

void fz_buf_printf(fz_buf *b, const char *fmt, ...)
{
	/* format straight into the room left (one pass when it fits, which
	 * is nearly always), measuring only when it does not */
	if (!buf_reserve(b, 64))
		return;
	va_list ap;
	va_start(ap, fmt);
	size_t room = b->cap - b->len;
	int n = vsnprintf(b->data + b->len, room, fmt, ap);
	va_end(ap);
	if (n < 0) {
		b->data[b->len] = '\0';
		return;
	}
	if ((size_t)n >= room) {
		if (!buf_reserve(b, (size_t)n))
			return;
		va_start(ap, fmt);
		vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
		va_end(ap);
	}
	b->len += (size_t)n;
}

void fz_buf_putc(fz_buf *b, char c)
{
	if (!buf_reserve(b, 1))
		return;
	b->data[b->len++] = c;
	b->data[b->len] = '\0';
}

void fz_buf_put_int(fz_buf *b, int64_t v)
{
	char tmp[24];
	int n = 0;
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
	do {
		tmp[n++] = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	if (v < 0)
		tmp[n++] = '-';
	if (!buf_reserve(b, (size_t)n))
		return;
	while (n)
		b->data[b->len++] = tmp[--n];
	b->data[b->len] = '\0';
}

void fz_buf_puts(fz_buf *b, const char *s)
{
	size_t n = strlen(s);
	if (!buf_reserve(b, n))
		return;
	memcpy(b->data + b->len, s, n + 1);
	b->len += n;
}

char *fz_buf_take(fz_buf *b)
{
	if (b->oom || !buf_reserve(b, 0)) {
		free(b->data);
		*b = (fz_buf){0};
		return NULL;
	}
	b->data[b->len] = '\0';
	char *p = b->data;
	*b = (fz_buf){0};
	return p;
}

/* ---- names ---- */

const char *fz_status_name(fz_status s)
{
	static const char *const names[FZ_STATUS_COUNT] = {
		"ok", "parse error", "verify error", "binding error",
		"index out of range", "out of memory", "i/o error",
		"invalid argument", "unsupported", "runtime error",
	};
	return (unsigned)s < FZ_STATUS_COUNT ? names[s] : "unknown status";
}

static const char *const dtype_names[FZ_DTYPE_COUNT] = {
	"f64", "f32", "f16", "bf16", "i64", "i32", "i8", "u8", "bool",
};
static const size_t dtype_sizes[FZ_DTYPE_COUNT] = {8, 4, 2, 2, 8, 4, 1, 1, 1};

const char *fz_dtype_name(fz_dtype d)
{
	return (unsigned)d < FZ_DTYPE_COUNT ? dtype_names[d] : "?";
}

size_t fz_dtype_size(fz_dtype d)
{
	return (unsigned)d < FZ_DTYPE_COUNT ? dtype_sizes[d] : 0;
}

int fz_dtype_from_name(const char *name, fz_dtype *out)
{
	for (int i = 0; i < FZ_DTYPE_COUNT; i++) {
		if (strcmp(name, dtype_names[i]) == 0) {
			*out = (fz_dtype)i;
			return 1;
		}
	}
	return 0;
}

void fz_tensor_contiguous(fz_tensor *t, void *data, fz_dtype dtype, int rank,
			  const int64_t *shape)
{
	memset(t, 0, sizeof *t);
	t->data = data;
	t->dtype = dtype;
	t->rank = rank < 0 ? 0 : rank > FZ_MAX_RANK ? FZ_MAX_RANK : rank;
	int64_t acc = 1;
	for (int d = t->rank - 1; d >= 0; d--) {
		t->shape[d] = shape[d];
		t->strides[d] = acc;
		acc *= shape[d];
	}
}
