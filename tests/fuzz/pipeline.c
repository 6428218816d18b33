/*
 * pipeline.c: a differential fuzzer of the whole pipeline, through the tool.
 *
 *     fuzz_pipeline --fusec build/tools/fusec [--seed N] [--start N] [--count N]
 *                   [--seconds S] [--out DIR] [--devices cpu,emu]
 *
 * It writes random valid traces and runs each with `fusec run FILE --check
 * --no-cache` on every device asked for (cpu and emu by default), so every
 * stage takes part: parse, lowering, verify, partition, bookend, schedule,
 * horizontal fusion, memplan, the code generator, the runtime, and the
 * reference interpreter as the judge, with `--check`'s tolerances and its
 * inputs (index operands within the extent they index). It covers what
 * tests/test_difftest.c (elementwise chains and one reduction, in process)
 * does not:
 *
 *   - every dtype (f64 f32 f16 bf16 i64 i32 i8 u8 bool), casts between any
 *     two of them, integer reductions and scans;
 *   - meta ops: broadcast_in_dim, reshape, permute, slice (with steps),
 *     squeeze, unsqueeze, cat;
 *   - cumsum, argmax, argmin, topk; matmul and linear; take, take_along,
 *     index_add; var_mean; full and iota;
 *   - symbolic extents, bound to 0, 1 and odd primes (an extent that some op
 *     must not see empty, a max or an index along it, is never bound to 0);
 *   - several outputs (one returned twice, sometimes), values with many
 *     consumers (a hub value that later ops prefer), and long chains.
 *
 * A trace fails when a device's run exits other than 0, or is killed (a
 * crash, or a hang past --timeout), or prints a sanitizer report. Each
 * failure is minimized while it still fails the same way on the same
 * device (the same signature: mismatch, crash, hang, sanitizer, or the
 * error's message with numbers and names taken out): statements are
 * dropped, returned values dropped, concrete extents shrunk (every copy of
 * a number that is an extent of a parameter, tried smaller), symbol
 * bindings shrunk. The minimized trace is written to DIR as
 * SEED-N-DEVICE.trace with the command and what it printed in a comment
 * header, so `fusec run` reruns it as it is.
 *
 * The count of traces, the seed and every failure are printed; the exit
 * status is 1 when any trace failed (0 otherwise), 2 on usage. With
 * --known FILE, an error whose message holds one of FILE's lines (the open
 * bugs, each with its issue: tests/fuzz/known.txt), or any failure of a
 * trace listed there as "trace SEED N", is counted as known and does not
 * fail the run; every other mismatch, crash, hang or sanitizer report
 * does. --minimize FILE shrinks a trace file (--bind, --seed and
 * the first of --devices as it ran) the same way. ctest runs a
 * short seeded pass (tests/CMakeLists.txt); tests/fuzz/pipeline.sh runs the
 * long one, bounded by time. Failures kept from earlier runs are under
 * tests/fuzz/found/.
 *
 * A generator error (a trace that does not parse) is a failure of its own
 * kind, so the generator cannot rot quietly into writing nothing valid.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../splitmix.h"

/* ---- random numbers ---------------------------------------------------- */

static uint64_t S;
static uint64_t next(void) { return splitmix_next(&S); }
static int pick(int n) { return n <= 1 ? 0 : (int)(next() % (uint64_t)n); }
static bool chance(int pct) { return pick(100) < pct; }

/* ---- the generator's model of a trace ------------------------------------ */

enum { F64, F32, F16, BF16, I64, I32, I8, U8, BOOL, NDT };
static const char *DT[NDT] = {"f64", "f32", "f16", "bf16", "i64", "i32", "i8", "u8",
			      "bool"};
static bool is_float(int d) { return d <= BF16; }
static bool is_int(int d) { return d >= I64 && d <= U8; }

enum { MAXV = 160, MAXR = 4, MAXSYM = 3, MAXP = 24, TEXT = 1 << 16 };

/* An extent: a concrete number, or a symbol (sym >= 0) whose binding is n. */
typedef struct ext {
	int sym;
	int64_t n;
} ext;

typedef struct val {
	char name[16];
	int dt, rank;
	ext d[MAXR];
	int uses;
	/* Computed exactly as the interpreter computes it (parameters, + - * /
	 * fmod, meta ops, selections, integer work): only such values feed
	 * what is discontinuous in its operand (a comparison, floor, a cast to
	 * an integer, argmax), where a last-ulp difference that --check allows
	 * a float would flip the answer. */
	bool exact;
} val;

typedef struct gen {
	val v[MAXV];
	int nv;
	char params[MAXP][128];
	int np;
	char body[TEXT];
	size_t len;
	int64_t bind[MAXSYM];
	int nsym;
	int hub;        /* a value later ops prefer (many consumers), or -1 */
} gen;

static const char *SYM[MAXSYM] = {"B", "N", "T"};

static void put(gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(gen *g, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(g->body + g->len, sizeof g->body - g->len, fmt, ap);
	va_end(ap);
	if (k > 0 && (size_t)k < sizeof g->body - g->len)
		g->len += (size_t)k;
}

static void ext_str(ext e, char *b, size_t n)
{
	if (e.sym >= 0)
		snprintf(b, n, "%s", SYM[e.sym]);
	else
		snprintf(b, n, "%lld", (long long)e.n);
}

static void shape_str(const val *v, char *b, size_t n)
{
	size_t k = 0;
	k += (size_t)snprintf(b + k, n - k, "[");
	for (int i = 0; i < v->rank && k < n; i++) {
		char e[24];
		ext_str(v->d[i], e, sizeof e);
		k += (size_t)snprintf(b + k, n - k, "%s%s", i ? ", " : "", e);
	}
	if (k < n)
		snprintf(b + k, n - k, "]");
}

static bool ext_eq(ext a, ext b) { return a.sym == b.sym && (a.sym >= 0 || a.n == b.n); }
static bool concrete(ext e) { return e.sym < 0; }

/* Concrete extents: 1, primes, powers of two and their neighbours (vector
 * widths and their remainders). */
static const int64_t EXTS[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 33, 64, 67};
static const int64_t BINDS[] = {0, 1, 1, 3, 5, 7, 13, 17, 31};

static ext rand_ext(gen *g, bool allow_sym)
{
	if (allow_sym && g->nsym && chance(35)) {
		int s = pick(g->nsym);
		return (ext){s, g->bind[s]};
	}
	int64_t n = EXTS[pick((int)(sizeof EXTS / sizeof *EXTS))];
	return (ext){-1, n};
}

static val *new_val(gen *g, int dt, int rank, const ext *d)
{
	if (g->nv == MAXV)
		return NULL;
	val *v = &g->v[g->nv];
	snprintf(v->name, sizeof v->name, "v%d", g->nv);
	v->dt = dt;
	v->rank = rank;
	for (int i = 0; i < rank; i++)
		v->d[i] = d[i];
	v->uses = 0;
	v->exact = true;
	g->nv++;
	return v;
}

static val *new_param(gen *g, int dt, int rank, const ext *d)
{
	if (g->np == MAXP)
		return NULL;
	val *v = new_val(g, dt, rank, d);
	if (!v)
		return NULL;
	snprintf(v->name, sizeof v->name, "p%d", g->np);
	char sh[80];
	shape_str(v, sh, sizeof sh);
	snprintf(g->params[g->np++], sizeof g->params[0], "%s: %s%s", v->name, DT[dt], sh);
	return v;
}

/* A value for an op to use: the hub often, else recent values more than
 * old ones (long chains), any of them sometimes. */
static val *use(gen *g, val *v)
{
	(void)g;
	v->uses++;
	return v;
}

static val *pick_val(gen *g, bool (*ok)(const val *, const void *), const void *arg)
{
	int cand[MAXV], n = 0;
	for (int i = 0; i < g->nv; i++)
		if (!ok || ok(&g->v[i], arg))
			cand[n++] = i;
	if (!n)
		return NULL;
	if (g->hub >= 0 && chance(25)) {
		for (int i = 0; i < n; i++)
			if (cand[i] == g->hub)
				return &g->v[g->hub];
	}
	int k = chance(60) ? n - 1 - pick(n < 4 ? n : 4) : pick(n);
	return &g->v[cand[k]];
}

static bool any_ok(const val *v, const void *a) { (void)a; (void)v; return true; }
static bool float_ok(const val *v, const void *a) { (void)a; return is_float(v->dt); }
static bool bool_ok(const val *v, const void *a) { (void)a; return v->dt == BOOL; }
static bool same_shape(const val *a, const val *b)
{
	if (a->rank != b->rank)
		return false;
	for (int i = 0; i < a->rank; i++)
		if (!ext_eq(a->d[i], b->d[i]))
			return false;
	return true;
}
static bool like_ok(const val *v, const void *a)
{
	const val *w = a;
	return v->dt == w->dt && same_shape(v, w);
}

/* b broadcasts against a (numpy rules, b's shape no larger). */
static bool bcast_ok(const val *b, const void *pa)
{
	const val *a = pa;
	if (b->dt != a->dt || b->rank > a->rank)
		return false;
	for (int i = 0; i < b->rank; i++) {
		ext eb = b->d[b->rank - 1 - i], ea = a->d[a->rank - 1 - i];
		if (!ext_eq(eb, ea) && !(concrete(eb) && eb.n == 1))
			return false;
	}
	return true;
}

/* ---- statements ---------------------------------------------------------- */

/* A literal of dtype dt (a number takes the tensor's dtype). */
static const char *lit(int dt)
{
	static const char *F[] = {"0.5", "-1.25", "2", "3", "0.1", "-0.75"};
	static const char *I[] = {"1", "2", "3", "-1", "5", "7"};
	static const char *U[] = {"1", "2", "3", "5", "200", "7"};
	return is_float(dt) ? F[pick(6)] : dt == U8 ? U[pick(6)] : I[pick(6)];
}

static val *unary(gen *g, val *x)
{
	val *y = new_val(g, x->dt, x->rank, x->d);
	if (!y)
		return NULL;
	use(g, x);
	if (x->dt == BOOL) {
		put(g, "  %s = logical_not(%s)\n", y->name, x->name);
	} else if (is_int(x->dt)) {
		static const char *ops[] = {"neg", "abs", "sign"};
		put(g, "  %s = %s(%s)\n", y->name, ops[pick(3)], x->name);
	} else {
		static const char *raw[] = {"neg", "abs", "sin", "cos", "tanh", "sigmoid",
					    "erf", "floor", "ceil", "round", "sign", "exp2",
					    "expm1", "log1p", "sqrt", "log", "log2", "rsqrt",
					    "reciprocal"};
		int k = pick(19);
		if (!x->exact && k >= 7 && k <= 10)
			k = pick(7);
		y->exact = x->exact && (k <= 1 || (k >= 7 && k <= 10));
		/* the functions that grow fast take a bounded argument */
		if (k == 11 || k == 12)
			put(g, "  %s = %s(tanh(%s))\n", y->name, raw[k], x->name);
		else if (k >= 13 && k <= 17)
			put(g, "  %s = %s(add(abs(%s), 0.5))\n", y->name, raw[k], x->name);
		else if (k == 18)
			put(g, "  %s = reciprocal(add(abs(%s), 1))\n", y->name, x->name);
		else if (chance(10) && !(y->exact = false))
			put(g, "  %s = exp(tanh(%s))\n", y->name, x->name);
		else
			put(g, "  %s = %s(%s)\n", y->name, raw[k], x->name);
	}
	return y;
}

static val *binary(gen *g, val *a)
{
	val *b = chance(20) ? NULL : pick_val(g, bcast_ok, a);
	char B[64];
	if (!b && a->dt == BOOL)
		b = a;
	if (b) {
		use(g, b);
		snprintf(B, sizeof B, "%s", b->name);
	} else {
		snprintf(B, sizeof B, "%s", lit(a->dt));
	}
	use(g, a);
	int k = pick(10);
	bool ex = a->exact && (!b || b->exact);
	if (k >= 8 && !ex && a->dt != BOOL)
		k = pick(8);
	/* fmod too: it jumps by the divisor at each multiple of it, and its
	 * small result keeps the absolute error of a large dividend (a float
	 * matmul's of u8 casts, 2e-5 where --check allows 1e-5 of 0.1) */
	if (k == 5 && !ex && is_float(a->dt))
		k = pick(5);
	if (a->dt == BOOL) {
		val *y = new_val(g, BOOL, a->rank, a->d);
		if (y)
			put(g, "  %s = %s(%s, %s)\n", y->name, k < 4 ? "logical_and" :
			    k < 8 ? "logical_or" : k == 8 ? "eq" : "ne", a->name, B);
		return y;
	}
	if (k >= 8) { /* a comparison */
		static const char *cmp[] = {"eq", "ne", "lt", "le", "gt", "ge"};
		val *y = new_val(g, BOOL, a->rank, a->d);
		if (y)
			put(g, "  %s = %s(%s, %s)\n", y->name, cmp[pick(6)], a->name, B);
		return y;
	}
	val *y = new_val(g, a->dt, a->rank, a->d);
	if (!y)
		return NULL;
	y->exact = ex && !(k == 7 && is_float(a->dt));
	static const char *ar[] = {"add", "sub", "mul", "maximum", "minimum"};
	if (k < 5)
		put(g, "  %s = %s(%s, %s)\n", y->name, ar[k], a->name, B);
	else if (!b && k <= 7) /* a literal: nonzero, positive */
		put(g, "  %s = %s(%s, %s)\n", y->name, k == 5 ? "fmod" : is_float(a->dt) ?
		    (k == 6 ? "div" : "pow") : "mul", a->name, is_float(a->dt) ? "1.5" : "3");
	else if (k == 5) /* fmod by something nonzero */
		put(g, "  %s = fmod(%s, maximum(abs(%s), %s))\n", y->name, a->name, B,
		    is_float(a->dt) ? "0.5" : "1");
	else if (k == 6 && is_float(a->dt))
		put(g, "  %s = div(%s, add(abs(%s), 1))\n", y->name, a->name, B);
	else if (k == 7 && is_float(a->dt))
		put(g, "  %s = pow(add(abs(%s), 0.5), tanh(%s))\n", y->name, a->name, B);
	else
		put(g, "  %s = %s(%s, %s)\n", y->name, ar[pick(5)], a->name, B);
	return y;
}

static val *where_(gen *g, val *a)
{
	val *c = pick_val(g, bool_ok, NULL);
	val *b = pick_val(g, bcast_ok, a);
	if (!c || !b || !bcast_ok(c, &(val){.dt = BOOL, .rank = a->rank, .d = {
		a->d[0], a->d[1], a->d[2], a->d[3]}}))
		return NULL;
	use(g, a), use(g, b), use(g, c);
	val *y = new_val(g, a->dt, a->rank, a->d);
	if (y)
		y->exact = a->exact && b->exact;
	if (y)
		put(g, "  %s = where(%s, %s, %s)\n", y->name, c->name, a->name, b->name);
	return y;
}

static val *cast(gen *g, val *x)
{
	int to = pick(NDT);
	/* an inexact float goes only to floats no wider than its own error */
	if (!x->exact && is_float(x->dt) && (!is_float(to) || to == F64 ||
					     (to == F32 && x->dt != F64)))
		to = x->dt == F64 ? F32 : pick(2) ? F16 : BF16;
	use(g, x);
	val *y = new_val(g, to, x->rank, x->d);
	if (y)
		y->exact = x->exact;
	if (y)
		put(g, "  %s = cast(%s, dtype=%s)\n", y->name, x->name, DT[to]);
	return y;
}

static void dims_list(const int *d, int n, char *b, size_t len)
{
	size_t k = (size_t)snprintf(b, len, "[");
	for (int i = 0; i < n && k < len; i++)
		k += (size_t)snprintf(b + k, len - k, "%s%d", i ? ", " : "", d[i]);
	if (k < len)
		snprintf(b + k, len - k, "]");
}

static void ext_list(const ext *e, int n, char *b, size_t len)
{
	size_t k = (size_t)snprintf(b, len, "[");
	for (int i = 0; i < n && k < len; i++) {
		char s[24];
		ext_str(e[i], s, sizeof s);
		k += (size_t)snprintf(b + k, len - k, "%s%s", i ? ", " : "", s);
	}
	if (k < len)
		snprintf(b + k, len - k, "]");
}

static val *meta_(gen *g, val *x);
static val *meta(gen *g, val *x)
{
	val *y = meta_(g, x);
	if (y)
		y->exact = x->exact && y->exact;
	return y;
}

static val *meta_(gen *g, val *x)
{
	char A[128], Bs[128];
	ext d[MAXR];
	int k = pick(7);
	if (k == 0 && x->rank < MAXR) { /* broadcast_in_dim: a new dim, 1s stretched */
		int at = pick(x->rank + 1), map[MAXR], nd = 0;
		ext nw = rand_ext(g, true);
		for (int i = 0, j = 0; i <= x->rank; i++) {
			if (i == at) {
				d[i] = nw;
				continue;
			}
			d[i] = x->d[j];
			if (concrete(x->d[j]) && x->d[j].n == 1 && chance(50))
				d[i] = rand_ext(g, true);
			map[nd++] = i;
			j++;
		}
		dims_list(map, nd, A, sizeof A);
		ext_list(d, x->rank + 1, Bs, sizeof Bs);
		use(g, x);
		val *y = new_val(g, x->dt, x->rank + 1, d);
		if (y)
			put(g, "  %s = broadcast_in_dim(%s, shape=%s, dims=%s)\n", y->name,
			    x->name, Bs, A);
		return y;
	}
	if (k == 1 && x->rank >= 1) { /* reshape: merge two concrete dims or split one */
		int r = x->rank, nr = 0;
		int i = pick(r);
		if (i + 1 < r && concrete(x->d[i]) && concrete(x->d[i + 1]) && chance(50)) {
			for (int j = 0; j < r; j++) {
				if (j == i) {
					d[nr++] = (ext){-1, x->d[i].n * x->d[i + 1].n};
					j++;
				} else {
					d[nr++] = x->d[j];
				}
			}
		} else if (concrete(x->d[i]) && r < MAXR) {
			int64_t n = x->d[i].n, f = 1;
			for (int64_t c = 2; c <= n; c++)
				if (n % c == 0 && chance(50)) {
					f = c;
					break;
				}
			for (int j = 0; j < r; j++) {
				if (j == i) {
					d[nr++] = (ext){-1, f};
					d[nr++] = (ext){-1, n / f};
				} else {
					d[nr++] = x->d[j];
				}
			}
		} else {
			return NULL;
		}
		ext_list(d, nr, Bs, sizeof Bs);
		use(g, x);
		val *y = new_val(g, x->dt, nr, d);
		if (y)
			put(g, "  %s = reshape(%s, shape=%s)\n", y->name, x->name, Bs);
		return y;
	}
	if (k == 2 && x->rank >= 2) { /* permute */
		int p[MAXR];
		for (int i = 0; i < x->rank; i++)
			p[i] = i;
		for (int i = x->rank - 1; i > 0; i--) {
			int j = pick(i + 1), t = p[i];
			p[i] = p[j];
			p[j] = t;
		}
		for (int i = 0; i < x->rank; i++)
			d[i] = x->d[p[i]];
		dims_list(p, x->rank, A, sizeof A);
		use(g, x);
		val *y = new_val(g, x->dt, x->rank, d);
		if (y)
			put(g, "  %s = permute(%s, dims=%s)\n", y->name, x->name, A);
		return y;
	}
	if (k == 3 && x->rank >= 1) { /* slice a concrete dim, maybe with a step */
		int i = pick(x->rank);
		if (!concrete(x->d[i]))
			return NULL;
		int64_t n = x->d[i].n, lo = pick((int)n), hi = lo + 1 + pick((int)(n - lo));
		int64_t st = chance(30) ? 1 + pick(3) : 1;
		char s0[96] = "[", s1[96] = "[", s2[96] = "[";
		for (int j = 0; j < x->rank; j++) {
			char e[24];
			ext_str(x->d[j], e, sizeof e);
			snprintf(s0 + strlen(s0), sizeof s0 - strlen(s0), "%s%lld", j ? ", " : "",
				 (long long)(j == i ? lo : 0));
			snprintf(s1 + strlen(s1), sizeof s1 - strlen(s1), "%s%s", j ? ", " : "",
				 j == i ? (snprintf(e, sizeof e, "%lld", (long long)hi), e) : e);
			snprintf(s2 + strlen(s2), sizeof s2 - strlen(s2), "%s%lld", j ? ", " : "",
				 (long long)(j == i ? st : 1));
			d[j] = x->d[j];
		}
		strcat(s0, "]");
		strcat(s1, "]");
		strcat(s2, "]");
		d[i] = (ext){-1, (hi - lo + st - 1) / st};
		use(g, x);
		val *y = new_val(g, x->dt, x->rank, d);
		bool steps = st > 1 || chance(20);
		if (y)
			put(g, "  %s = slice(%s, start=%s, end=%s%s%s)\n", y->name, x->name, s0,
			    s1, steps ? ", step=" : "", steps ? s2 : "");
		return y;
	}
	if (k == 4 && x->rank >= 1) { /* squeeze a dim of 1, else unsqueeze */
		for (int i = 0; i < x->rank; i++)
			if (concrete(x->d[i]) && x->d[i].n == 1) {
				for (int j = 0, m = 0; j < x->rank; j++)
					if (j != i)
						d[m++] = x->d[j];
				use(g, x);
				val *y = new_val(g, x->dt, x->rank - 1, d);
				if (y)
					put(g, "  %s = squeeze(%s, dims=[%d])\n", y->name, x->name, i);
				return y;
			}
	}
	if ((k == 4 || k == 5) && x->rank < MAXR) { /* unsqueeze */
		int at = pick(x->rank + 1);
		for (int i = 0, j = 0; i <= x->rank; i++)
			d[i] = i == at ? (ext){-1, 1} : x->d[j++];
		use(g, x);
		val *y = new_val(g, x->dt, x->rank + 1, d);
		if (y)
			put(g, "  %s = unsqueeze(%s, dim=%d)\n", y->name, x->name, at);
		return y;
	}
	if (k == 6 && x->rank >= 1) { /* cat along a concrete dim */
		int i = pick(x->rank);
		if (!concrete(x->d[i]))
			return NULL;
		/* a second operand: an existing value that matches, or a new
		 * parameter of another extent along i */
		val *b = NULL;
		for (int j = 0; j < g->nv && !b; j++) {
			val *c = &g->v[pick(g->nv)];
			bool ok = c != x && c->dt == x->dt && c->rank == x->rank &&
				  concrete(c->d[i]);
			for (int q = 0; ok && q < x->rank; q++)
				ok = q == i || ext_eq(c->d[q], x->d[q]);
			if (ok)
				b = c;
		}
		if (!b) {
			for (int j = 0; j < x->rank; j++)
				d[j] = x->d[j];
			d[i] = rand_ext(g, false);
			if (!(b = new_param(g, x->dt, x->rank, d)))
				return NULL;
		}
		use(g, x), use(g, b);
		for (int j = 0; j < x->rank; j++)
			d[j] = x->d[j];
		d[i].n = x->d[i].n + b->d[i].n;
		bool three = chance(25);
		if (three)
			d[i].n += x->d[i].n;
		val *y = new_val(g, x->dt, x->rank, d);
		if (y)
			y->exact = b->exact;
		if (y)
			put(g, "  %s = cat(%s, %s%s%s, dim=%d)\n", y->name, x->name, b->name,
			    three ? ", " : "", three ? x->name : "", i);
		return y;
	}
	return NULL;
}

/* May op reduce over extent e? A max, a min, a selection and a variance
 * need at least one element; a sum does not. */
static bool nonempty(ext e) { return e.n > 0; }

static val *reduction(gen *g, val *x)
{
	if (x->dt == BOOL || x->rank < 1)
		return NULL;
	int k = pick(is_float(x->dt) ? 4 : 3);
	static const char *ops[] = {"sum", "amax", "amin", "var_mean"};
	int dims[MAXR], nd = 0;
	bool keep = chance(40);
	for (int i = 0; i < x->rank; i++)
		if ((chance(45) || (i == x->rank - 1 && !nd)) &&
		    (k == 0 || nonempty(x->d[i])))
			dims[nd++] = i;
	if (!nd)
		return NULL;
	ext d[MAXR];
	int r = 0;
	for (int i = 0, j = 0; i < x->rank; i++) {
		bool red = j < nd && dims[j] == i;
		if (red)
			j++;
		if (!red)
			d[r++] = x->d[i];
		else if (keep)
			d[r++] = (ext){-1, 1};
	}
	char A[64];
	dims_list(dims, nd, A, sizeof A);
	use(g, x);
	if (k == 3) {
		val *v = new_val(g, x->dt, r, d), *m = new_val(g, x->dt, r, d);
		if (!v || !m)
			return NULL;
		v->exact = m->exact = false;
		put(g, "  %s, %s = var_mean(%s, dims=%s, correction=%d, keepdim=%s)\n",
		    v->name, m->name, x->name, A, pick(2), keep ? "true" : "false");
		return chance(50) ? v : m;
	}
	/* an integer sum straight into a cast: the accumulator must wrap to
	 * the dtype before the cast reads it */
	int to = k == 0 && is_int(x->dt) && chance(40) ? (pick(2) ? F32 : F64) : -1;
	val *y = new_val(g, to >= 0 ? to : x->dt, r, d);
	if (y)
		y->exact = x->exact && (k != 0 || !is_float(x->dt));
	if (y && to >= 0)
		put(g, "  %s = cast(sum(%s, dims=%s, keepdim=%s), dtype=%s)\n", y->name,
		    x->name, A, keep ? "true" : "false", DT[to]);
	else if (y)
		put(g, "  %s = %s(%s, dims=%s, keepdim=%s)\n", y->name, ops[k], x->name, A,
		    keep ? "true" : "false");
	return y;
}

static val *scan_select(gen *g, val *x)
{
	if (x->dt == BOOL || x->rank < 1)
		return NULL;
	int i = pick(x->rank), k = pick(4);
	if (k == 0) {
		use(g, x);
		val *y = new_val(g, x->dt, x->rank, x->d);
		if (y)
			y->exact = x->exact && !is_float(x->dt);
		if (y)
			put(g, "  %s = cumsum(%s, dim=%d)\n", y->name, x->name, i);
		return y;
	}
	if (!nonempty(x->d[i]) || !x->exact) /* near-ties pick another index */
		return NULL;
	ext d[MAXR];
	if (k == 3) { /* topk along a concrete dim */
		if (!concrete(x->d[i]))
			return NULL;
		int64_t kk = 1 + pick((int)(x->d[i].n < 4 ? x->d[i].n : 4));
		for (int j = 0; j < x->rank; j++)
			d[j] = x->d[j];
		d[i] = (ext){-1, kk};
		use(g, x);
		val *v = new_val(g, x->dt, x->rank, d), *ix = new_val(g, I64, x->rank, d);
		if (!v || !ix)
			return NULL;
		put(g, "  %s, %s = topk(%s, k=%lld, dim=%d)\n", v->name, ix->name, x->name,
		    (long long)kk, i);
		return chance(50) ? v : ix;
	}
	bool keep = chance(40);
	int r = 0;
	for (int j = 0; j < x->rank; j++)
		if (j != i)
			d[r++] = x->d[j];
		else if (keep)
			d[r++] = (ext){-1, 1};
	use(g, x);
	val *y = new_val(g, I64, r, d);
	if (y)
		put(g, "  %s = %s(%s, dim=%d, keepdim=%s)\n", y->name, k == 1 ? "argmax" :
		    "argmin", x->name, i, keep ? "true" : "false");
	return y;
}

static val *library(gen *g, val *x)
{
	if (!is_float(x->dt) || x->rank < 1 || x->rank > 3)
		return NULL;
	ext K = x->d[x->rank - 1], N = rand_ext(g, true), d[MAXR];
	use(g, x);
	if (chance(50)) { /* linear(x, w[N, K], b[N]?) */
		val *w = new_param(g, x->dt, 2, (ext[]){N, K});
		val *b = chance(50) ? new_param(g, x->dt, 1, (ext[]){N}) : NULL;
		if (!w)
			return NULL;
		for (int i = 0; i < x->rank; i++)
			d[i] = x->d[i];
		d[x->rank - 1] = N;
		val *y = new_val(g, x->dt, x->rank, d);
		if (y)
			y->exact = false;
		if (y)
			put(g, "  %s = linear(%s, %s%s%s)\n", y->name, x->name, w->name,
			    b ? ", " : "", b ? b->name : "");
		return y;
	}
	/* matmul(x, w): w [K, N], or [K] (a vector), or batched [.., K, N] */
	int wr = x->rank == 1 || chance(20) ? 1 + pick(2) : 2;
	val *w = wr == 1 ? new_param(g, x->dt, 1, (ext[]){K})
			 : new_param(g, x->dt, 2, (ext[]){K, N});
	if (!w)
		return NULL;
	int r = 0;
	for (int i = 0; i < x->rank - 1; i++)
		d[r++] = x->d[i];
	if (wr == 2)
		d[r++] = N;
	val *y = new_val(g, x->dt, r, d);
	if (y)
		y->exact = false;
	if (y)
		put(g, "  %s = matmul(%s, %s)\n", y->name, x->name, w->name);
	return y;
}

/* take, take_along, index_add along a concrete, non-empty dim: the index
 * is a parameter of its own, so `fusec run` draws it within the extent. */
static val *indexing(gen *g, val *x)
{
	if (x->rank < 1)
		return NULL;
	int i = pick(x->rank), k = pick(3);
	if (!concrete(x->d[i]) || x->d[i].n < 1)
		return NULL;
	int idt = chance(50) ? I64 : I32;
	ext d[MAXR];
	if (k == 0) { /* take: idx of rank 1 or 2 */
		int ir = 1 + (x->rank < MAXR && chance(30));
		ext id[2] = {rand_ext(g, true), rand_ext(g, false)};
		if (x->rank - 1 + ir > MAXR)
			ir = 1;
		val *ix = new_param(g, idt, ir, id);
		if (!ix)
			return NULL;
		int r = 0;
		for (int j = 0; j < x->rank; j++)
			if (j == i)
				for (int q = 0; q < ir; q++)
					d[r++] = id[q];
			else
				d[r++] = x->d[j];
		use(g, x);
		val *y = new_val(g, x->dt, r, d);
		if (y)
			y->exact = x->exact;
		if (y)
			put(g, "  %s = take(%s, %s, dim=%d)\n", y->name, x->name, ix->name, i);
		return y;
	}
	if (k == 1) { /* take_along: idx of x's rank, no larger off dim */
		for (int j = 0; j < x->rank; j++)
			d[j] = j == i ? rand_ext(g, false) : x->d[j];
		val *ix = new_param(g, idt, x->rank, d);
		if (!ix)
			return NULL;
		use(g, x);
		val *y = new_val(g, x->dt, x->rank, d);
		if (y)
			y->exact = x->exact;
		if (y)
			put(g, "  %s = take_along(%s, %s, dim=%d)\n", y->name, x->name,
			    ix->name, i);
		return y;
	}
	if (x->dt == BOOL)
		return NULL;
	/* many indices sometimes: repeated ones add up in one element */
	ext n = chance(25) ? (ext){-1, 200 + pick(400)} : rand_ext(g, true);
	for (int j = 0; j < x->rank; j++)
		d[j] = j == i ? n : x->d[j];
	val *ix = new_param(g, idt, 1, &n);
	val *src = pick_val(g, like_ok, &(val){.dt = x->dt, .rank = x->rank,
			    .d = {d[0], d[1], d[2], d[3]}});
	if (!ix)
		return NULL;
	if (!src && !(src = new_param(g, x->dt, x->rank, d)))
		return NULL;
	use(g, x), use(g, src);
	val *y = new_val(g, x->dt, x->rank, x->d);
	if (y)
		y->exact = x->exact && src->exact && !is_float(x->dt);
	if (y)
		put(g, "  %s = index_add(%s, %s, %s, dim=%d)\n", y->name, x->name, ix->name,
		    src->name, i);
	return y;
}

static val *creation(gen *g)
{
	ext d[MAXR];
	if (chance(50)) {
		ext n = rand_ext(g, false);
		int dt = pick(NDT - 1); /* iota of bool is refused */
		if (dt == U8 || dt == I8)
			n.n = n.n > 64 ? 64 : n.n;
		val *y = new_val(g, dt, 1, &n);
		if (y)
			put(g, "  %s = iota(length=%lld, dtype=%s)\n", y->name, (long long)n.n,
			    DT[dt]);
		return y;
	}
	int r = pick(3);
	for (int i = 0; i < r; i++)
		d[i] = rand_ext(g, true);
	int dt = pick(NDT);
	char sh[96];
	ext_list(d, r, sh, sizeof sh);
	val *y = new_val(g, dt, r, d);
	if (y)
		put(g, "  %s = full(shape=%s, value=%s, dtype=%s)\n", y->name, sh,
		    dt == BOOL ? (chance(50) ? "true" : "false") : lit(dt), DT[dt]);
	return y;
}

/* One random trace into out: its text and the --bind list. */
static void generate(uint64_t seed, char *out, size_t len, char *binds, size_t blen)
{
	static gen G;
	gen *g = &G;
	memset(g, 0, sizeof *g);
	S = seed;
	g->hub = -1;
	g->nsym = pick(MAXSYM + 1);
	for (int s = 0; s < g->nsym; s++)
		g->bind[s] = BINDS[pick((int)(sizeof BINDS / sizeof *BINDS))];
	/* parameters: 1 to 3, of one family of shapes so ops meet */
	int np = 1 + pick(3), rank = pick(4);
	ext base[MAXR];
	for (int i = 0; i < rank; i++)
		base[i] = rand_ext(g, true);
	for (int i = 0; i < np; i++) {
		ext d[MAXR];
		for (int j = 0; j < rank; j++)
			d[j] = chance(25) ? (ext){-1, 1} : base[j];
		int dt = chance(60) ? (chance(50) ? F32 : pick(NDT)) : pick(NDT);
		new_param(g, dt, rank, d);
	}
	/* long chains sometimes */
	int steps = chance(15) ? 25 + pick(40) : 3 + pick(14);
	for (int s = 0; s < steps; s++) {
		val *y = NULL;
		for (int tries = 0; !y && tries < 8; tries++) {
			int k = pick(100);
			val *x = pick_val(g, any_ok, NULL);
			if (!x)
				break;
			if (k < 16)
				y = unary(g, x);
			else if (k < 34)
				y = binary(g, x);
			else if (k < 39)
				y = where_(g, x);
			else if (k < 49)
				y = cast(g, x);
			else if (k < 64)
				y = meta(g, x);
			else if (k < 73)
				y = reduction(g, x);
			else if (k < 81)
				y = scan_select(g, x);
			else if (k < 87)
				y = library(g, pick_val(g, float_ok, NULL) ? pick_val(g, float_ok, NULL) : x);
			else if (k < 95)
				y = indexing(g, x);
			else
				y = creation(g);
		}
		if (y && g->hub < 0 && chance(20))
			g->hub = (int)(y - g->v);
	}
	/* outputs: the last value, and unused or random ones; sometimes one
	 * returned twice */
	char ret[512] = "";
	int nout = 0, last = g->nv - 1;
	if (last < 0)
		last = 0;
	snprintf(ret, sizeof ret, "%s", g->v[last].name);
	nout++;
	for (int i = 0; i < g->nv - 1 && nout < 6; i++)
		if ((g->v[i].uses == 0 && chance(70)) || chance(8)) {
			snprintf(ret + strlen(ret), sizeof ret - strlen(ret), ", %s", g->v[i].name);
			nout++;
		}
	if (chance(5))
		snprintf(ret + strlen(ret), sizeof ret - strlen(ret), ", %s", g->v[last].name);
	size_t k = (size_t)snprintf(out, len, "trace f(");
	for (int i = 0; i < g->np && k < len; i++)
		k += (size_t)snprintf(out + k, len - k, "%s%s", i ? ", " : "", g->params[i]);
	if (k < len)
		k += (size_t)snprintf(out + k, len - k, ") {\n%s  return %s\n}\n", g->body, ret);
	binds[0] = '\0';
	for (int s = 0; s < g->nsym; s++)
		snprintf(binds + strlen(binds), blen - strlen(binds), "%s%s=%lld",
			 s ? "," : "", SYM[s], (long long)g->bind[s]);
}

/* ---- running the tool ---------------------------------------------------- */

typedef struct opts {
	const char *fusec, *out, *devices;
	const char *replay, *bind;  /* --minimize FILE, --bind LIST */
	char known[32][256];        /* --known FILE: messages of open bugs */
	int n_known;
	uint64_t seed;
	long count, start;
	double seconds, timeout;
	bool verbose;
} opts;

enum { R_PASS, R_MISMATCH, R_ERROR, R_CRASH, R_HANG, R_SANITIZER, R_GENERATOR };
static const char *RNAME[] = {"pass", "mismatch", "error", "crash", "hang",
			      "sanitizer", "generator"};

typedef struct result {
	int kind;
	char sig[160];   /* the kind, and for an error its message without numbers */
	char text[4096]; /* what the tool printed (the tail) */
} result;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char work_dir[512];

static bool write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return false;
	bool ok = fputs(text, f) >= 0;
	return fclose(f) == 0 && ok;
}

/* An error's message with digits and quoted names dropped: two traces that
 * fail in the same place for the same reason share it. */
static void signature(const char *msg, char *sig, size_t n)
{
	const char *p = strstr(msg, "fusec run: ");
	if (!p)
		p = msg;
	size_t k = 0;
	bool quote = false;
	for (; *p && *p != '\n' && k + 1 < n; p++) {
		if (*p == '\'')
			quote = !quote;
		else if (!quote && !isdigit((unsigned char)*p))
			sig[k++] = *p;
	}
	sig[k] = '\0';
}

/* Runs fusec on path; fills r. check_only: `fusec check` (the minimizer's
 * quick test that a candidate is still a valid trace). */
static void run_tool(const opts *o, const char *path, const char *device,
		     const char *binds, uint64_t seed, result *r)
{
	char outp[600], seeds[32];
	snprintf(outp, sizeof outp, "%s/out.txt", work_dir);
	snprintf(seeds, sizeof seeds, "%llu", (unsigned long long)(seed % 1000));
	memset(r, 0, sizeof *r);
	pid_t pid = fork();
	if (pid == 0) {
		int fd = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		setpgid(0, 0);
		const char *argv[16];
		int a = 0;
		argv[a++] = o->fusec;
		argv[a++] = "run";
		argv[a++] = path;
		argv[a++] = "--check";
		argv[a++] = "--no-cache";
		argv[a++] = "--device";
		argv[a++] = device;
		argv[a++] = "--seed";
		argv[a++] = seeds;
		if (binds && *binds) {
			argv[a++] = "--bind";
			argv[a++] = binds;
		}
		argv[a] = NULL;
		execv(o->fusec, (char *const *)argv);
		_exit(127);
	}
	int status = 0;
	bool hung = false;
	double t0 = now();
	for (;;) {
		pid_t w = waitpid(pid, &status, WNOHANG);
		if (w == pid)
			break;
		if (w < 0 && errno != EINTR)
			break;
		if (now() - t0 > o->timeout) {
			kill(-pid, SIGKILL);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			hung = true;
			break;
		}
		usleep(2000);
	}
	FILE *f = fopen(outp, "r");
	char all[1 << 16];
	size_t n = f ? fread(all, 1, sizeof all - 1, f) : 0;
	if (f)
		fclose(f);
	all[n] = '\0';
	const char *tail = n >= sizeof r->text ? all + n - (sizeof r->text - 1) : all;
	snprintf(r->text, sizeof r->text, "%s", tail);
	if (hung) {
		r->kind = R_HANG;
	} else if (strstr(all, "runtime error:") || strstr(all, "Sanitizer")) {
		r->kind = R_SANITIZER;
	} else if (WIFSIGNALED(status)) {
		r->kind = R_CRASH;
	} else if (WEXITSTATUS(status) == 0) {
		r->kind = R_PASS;
	} else if (strstr(all, "check: MISMATCH")) {
		r->kind = R_MISMATCH;
	} else if (strstr(all, ": error: ") || WEXITSTATUS(status) == 2) {
		r->kind = R_GENERATOR;
	} else {
		r->kind = R_ERROR;
	}
	if (r->kind == R_ERROR || r->kind == R_GENERATOR) {
		char s[140];
		signature(all, s, sizeof s);
		snprintf(r->sig, sizeof r->sig, "%s: %s", RNAME[r->kind], s);
	} else if (r->kind == R_CRASH) {
		snprintf(r->sig, sizeof r->sig, "crash: signal %d", WTERMSIG(status));
	} else {
		snprintf(r->sig, sizeof r->sig, "%s", RNAME[r->kind]);
	}
}

/* ---- minimizing ------------------------------------------------------------ */

typedef struct lines {
	char *l[512];
	int n;
} lines;

static void split(const char *text, lines *L)
{
	L->n = 0;
	const char *p = text;
	while (*p && L->n < 512) {
		const char *e = strchr(p, '\n');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		L->l[L->n] = strndup(p, n);
		L->n++;
		p += n + (e ? 1 : 0);
	}
}

static void join(const lines *L, char *out, size_t len)
{
	size_t k = 0;
	out[0] = '\0';
	for (int i = 0; i < L->n && k < len; i++)
		if (L->l[i])
			k += (size_t)snprintf(out + k, len - k, "%s\n", L->l[i]);
}

static void free_lines(lines *L)
{
	for (int i = 0; i < L->n; i++)
		free(L->l[i]);
	L->n = 0;
}

/* The minimizer's deadline: past it every candidate "passes", so each
 * loop ends at once (a few minutes per failure, whatever the trace). */
static double min_deadline;

/* Does text still fail as want did? */
static bool still_fails(const opts *o, const char *text, const char *device,
			const char *binds, uint64_t seed, const result *want, int *tries)
{
	if (now() > min_deadline)
		return false;
	char path[600];
	snprintf(path, sizeof path, "%s/cand.trace", work_dir);
	if (!write_file(path, text))
		return false;
	result r;
	run_tool(o, path, device, binds, seed, &r);
	(*tries)++;
	return !strcmp(r.sig, want->sig);
}

/* Replaces every whole-number token equal to from (not part of a longer
 * number, a name or a decimal) by to. */
static bool replace_number(const char *in, char *out, size_t len, long long from,
			   long long to)
{
	char f[32];
	snprintf(f, sizeof f, "%lld", from);
	size_t fl = strlen(f), k = 0;
	bool any = false;
	for (const char *p = in; *p && k + 32 < len;) {
		bool edge = p == in || !(isalnum((unsigned char)p[-1]) || p[-1] == '_' ||
					 p[-1] == '.' || p[-1] == '-');
		if (edge && !strncmp(p, f, fl) &&
		    !(isalnum((unsigned char)p[fl]) || p[fl] == '.' || p[fl] == '_')) {
			k += (size_t)snprintf(out + k, len - k, "%lld", to);
			p += fl;
			any = true;
		} else {
			out[k++] = *p++;
		}
	}
	out[k] = '\0';
	return any;
}

/* The extents the parameters use (the numbers inside the first line's
 * brackets), largest first. */
static int param_extents(const char *text, long long *ext, int max)
{
	int n = 0;
	const char *e = strchr(text, '\n');
	for (const char *p = text; p < e && n < max; p++) {
		if (!isdigit((unsigned char)*p) || isalnum((unsigned char)p[-1]))
			continue;
		long long v = strtoll(p, NULL, 10);
		while (isdigit((unsigned char)*p))
			p++;
		bool seen = v <= 1;
		for (int i = 0; i < n && !seen; i++)
			seen = ext[i] == v;
		if (!seen)
			ext[n++] = v;
	}
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (ext[j] > ext[i]) {
				long long t = ext[i];
				ext[i] = ext[j];
				ext[j] = t;
			}
	return n;
}

/* Does text, past its first line, name `name` as a whole word? */
static bool names(const char *text, const char *name)
{
	const char *body = strchr(text, '\n');
	size_t n = strlen(name);
	for (const char *p = body; p && (p = strstr(p, name)); p += n)
		if (!(isalnum((unsigned char)p[-1]) || p[-1] == '_') &&
		    !(isalnum((unsigned char)p[n]) || p[n] == '_'))
			return true;
	return false;
}

/* Tries dropping each parameter that nothing uses any more. */
static bool drop_params(const opts *o, char *text, char *cand, size_t len,
			const char *device, const char *binds, uint64_t seed,
			const result *want, int *tries)
{
	bool progress = false;
	for (int i = 0;; i++) {
		char *open = strchr(text, '('), *nl = strchr(text, '\n');
		if (!open || !nl || open > nl)
			return progress;
		/* the i-th parameter: [start, end) at bracket depth 0 */
		char *p = open + 1, *start = NULL, *end = NULL;
		for (int k = 0, depth = 0; p < nl; p++) {
			if (k == i && !start)
				start = p;
			if (*p == '[')
				depth++;
			else if (*p == ']')
				depth--;
			else if ((*p == ',' || *p == ')') && depth == 0) {
				if (k == i) {
					end = p;
					break;
				}
				k++;
				if (*p == ')')
					break;
			}
		}
		while (start && start < end && *start == ' ')
			start++;
		if (!start || !end || start == end) /* no parameter left */
			return progress;
		char name[32];
		size_t nn = strcspn(start, ":");
		snprintf(name, sizeof name, "%.*s", (int)(nn < 31 ? nn : 31), start);
		if (names(text, name))
			continue;
		/* cut the parameter and one comma beside it */
		char *a = start, *b = end;
		if (*b == ',')
			b++;
		else if (a > open + 1)
			for (a--; a > open + 1 && *a != ','; a--)
				;
		snprintf(cand, len, "%.*s%s", (int)(a - text), text, b);
		if (strcmp(cand, text) && still_fails(o, cand, device, binds, seed, want,
						      tries)) {
			snprintf(text, len, "%s", cand);
			progress = true;
			i--;
		}
	}
}

static void minimize(const opts *o, char *text, size_t len, const char *device,
		     char *binds, uint64_t seed, const result *want)
{
	int tries = 0;
	double t0 = now();
	min_deadline = t0 + 300;
	char *cand = malloc(len);
	if (!cand)
		return;
	for (bool progress = true; progress && tries < 600 && now() - t0 < 300;) {
		progress = false;
		/* drop statements, last first (what uses them goes first) */
		lines L;
		split(text, &L);
		for (int i = L.n - 1; i > 0; i--) {
			if (!L.l[i] || strncmp(L.l[i], "  ", 2) || !strncmp(L.l[i], "  return", 8))
				continue;
			char *keep = L.l[i];
			L.l[i] = NULL;
			join(&L, cand, len);
			if (still_fails(o, cand, device, binds, seed, want, &tries)) {
				free(keep);
				progress = true;
			} else {
				L.l[i] = keep;
			}
		}
		/* drop returned values, keeping one */
		for (int i = 0; i < L.n; i++) {
			if (!L.l[i] || strncmp(L.l[i], "  return ", 9))
				continue;
			for (;;) {
				char *r = L.l[i] + 9, *c = strchr(r, ',');
				if (!c)
					break;
				bool dropped = false;
				/* try each name in turn */
				char names[32][32];
				int nn = 0;
				for (char *p = r; *p && nn < 32;) {
					while (*p == ' ' || *p == ',')
						p++;
					int q = 0;
					while (*p && *p != ',' && *p != ' ' && q < 31)
						names[nn][q++] = *p++;
					names[nn][q] = '\0';
					if (q)
						nn++;
				}
				for (int drop = 0; drop < nn && !dropped; drop++) {
					char nr[1280] = "  return ";
					for (int j = 0, first = 1; j < nn; j++) {
						if (j == drop)
							continue;
						snprintf(nr + strlen(nr), sizeof nr - strlen(nr), "%s%s",
							 first ? "" : ", ", names[j]);
						first = 0;
					}
					char *old = L.l[i];
					L.l[i] = strdup(nr);
					join(&L, cand, len);
					if (still_fails(o, cand, device, binds, seed, want, &tries)) {
						free(old);
						dropped = progress = true;
					} else {
						free(L.l[i]);
						L.l[i] = old;
					}
				}
				if (!dropped)
					break;
			}
		}
		join(&L, text, len);
		free_lines(&L);
		progress |= drop_params(o, text, cand, len, device, binds, seed, want, &tries);
		/* shrink concrete extents: every copy of the number */
		long long ex[32];
		int ne = param_extents(text, ex, 32);
		for (int i = 0; i < ne; i++) {
			long long to[] = {1, 2, 3, ex[i] / 2};
			for (int j = 0; j < 4; j++) {
				if (to[j] >= ex[i] || to[j] < 1)
					continue;
				if (!replace_number(text, cand, len, ex[i], to[j]))
					continue;
				if (still_fails(o, cand, device, binds, seed, want, &tries)) {
					snprintf(text, len, "%s", cand);
					progress = true;
					break;
				}
			}
		}
		/* shrink bindings */
		char *p = binds;
		while (p && *p) {
			char *eq = strchr(p, '='), *end;
			if (!eq)
				break;
			long long v = strtoll(eq + 1, &end, 10);
			long long to[] = {0, 1, 2, 3, v / 2};
			for (int j = 0; j < 5; j++) {
				if (to[j] >= v || to[j] < 0)
					continue;
				char nb[256];
				snprintf(nb, sizeof nb, "%.*s%lld%s", (int)(eq + 1 - binds), binds,
					 to[j], end);
				if (still_fails(o, text, device, nb, seed, want, &tries)) {
					size_t off = (size_t)(p - binds);
					snprintf(binds, 256, "%s", nb);
					p = binds + off;
					progress = true;
					break;
				}
			}
			eq = strchr(p, '=');
			p = eq ? strchr(eq, ',') : NULL;
			if (p)
				p++;
		}
	}
	free(cand);
}

/* ---- the loop ---------------------------------------------------------------- */

/* --minimize FILE: runs a trace file as the loop runs a generated one
 * (--seed is the run's, --bind its list, the first of --devices its
 * device) and minimizes it if it fails. */
static int replay(const opts *o, const char *device)
{
	static char text[TEXT + 4096];
	char binds[256], path[600];
	FILE *f = fopen(o->replay, "r");
	size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
	if (f)
		fclose(f);
	if (!f) {
		perror(o->replay);
		return 2;
	}
	text[n] = '\0';
	/* comments go: the minimizer's lines are statements */
	char *w = text;
	for (char *p = text; *p;) {
		size_t k = strcspn(p, "\n");
		bool comment = *p == '#';
		if (!comment) {
			memmove(w, p, k);
			w += k;
			*w++ = '\n';
		}
		p += k + (p[k] == '\n');
	}
	*w = '\0';
	snprintf(binds, sizeof binds, "%s", o->bind ? o->bind : "");
	snprintf(path, sizeof path, "%s/case.trace", work_dir);
	write_file(path, text);
	result r;
	run_tool(o, path, device, binds, o->seed, &r);
	printf("%s on %s: %s\n", o->replay, device, r.sig);
	if (r.kind == R_PASS)
		return 0;
	minimize(o, text, sizeof text, device, binds, o->seed, &r);
	write_file(path, text);
	run_tool(o, path, device, binds, o->seed, &r);
	printf("--- minimized (--bind '%s'):\n%s--- fusec said:\n%s\n", binds, text,
	       r.text);
	return 1;
}

static int usage(void)
{
	fprintf(stderr, "usage: fuzz_pipeline --fusec PATH [--seed N] [--start N] [--count N] "
		"[--known FILE] [--minimize FILE [--bind LIST]] "
		"[--seconds S] [--out DIR] [--devices cpu,emu] [--timeout S] "
		"[--verbose]\n");
	return 2;
}

int main(int argc, char **argv)
{
	opts o = {.devices = "cpu,emu", .seed = 1, .count = -1, .seconds = 0,
		  .timeout = 120, .out = NULL};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool nx = i + 1 < argc;
		if (!strcmp(a, "--fusec") && nx)
			o.fusec = argv[++i];
		else if (!strcmp(a, "--seed") && nx)
			o.seed = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(a, "--known") && nx) {
			FILE *f = fopen(argv[++i], "r");
			char line[256];
			if (!f) {
				perror(argv[i]);
				return 2;
			}
			while (fgets(line, sizeof line, f) && o.n_known < 32) {
				line[strcspn(line, "\n")] = '\0';
				if (line[0] && line[0] != '#')
					snprintf(o.known[o.n_known++], sizeof o.known[0], "%s",
						 line);
			}
			fclose(f);
		} else if (!strcmp(a, "--minimize") && nx)
			o.replay = argv[++i];
		else if (!strcmp(a, "--bind") && nx)
			o.bind = argv[++i];
		else if (!strcmp(a, "--start") && nx)
			o.start = strtol(argv[++i], NULL, 10);
		else if (!strcmp(a, "--count") && nx)
			o.count = strtol(argv[++i], NULL, 10);
		else if (!strcmp(a, "--seconds") && nx)
			o.seconds = strtod(argv[++i], NULL);
		else if (!strcmp(a, "--timeout") && nx)
			o.timeout = strtod(argv[++i], NULL);
		else if (!strcmp(a, "--out") && nx)
			o.out = argv[++i];
		else if (!strcmp(a, "--devices") && nx)
			o.devices = argv[++i];
		else if (!strcmp(a, "--verbose"))
			o.verbose = true;
		else
			return usage();
	}
	if (!o.fusec || (o.count < 0 && o.seconds <= 0 && !o.replay) || o.timeout <= 0)
		return usage();
	snprintf(work_dir, sizeof work_dir, "%s/fuzz-pipeline-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(work_dir)) {
		perror("fuzz_pipeline: mkdtemp");
		return 1;
	}
	if (o.out)
		mkdir(o.out, 0755);
	char devs[8][16];
	int nd = 0;
	for (const char *p = o.devices; *p && nd < 8;) {
		size_t n = strcspn(p, ",");
		snprintf(devs[nd++], sizeof devs[0], "%.*s", (int)n, p);
		p += n + (p[n] == ',');
	}
	if (o.replay)
		return replay(&o, devs[0]);
	if (o.count < 0)
		printf("fuzz_pipeline: seed %llu, traces for %.0f s, devices %s\n",
		       (unsigned long long)o.seed, o.seconds, o.devices);
	else
		printf("fuzz_pipeline: seed %llu, %ld traces%s, devices %s\n",
		       (unsigned long long)o.seed, o.count, o.seconds > 0 ?
		       " or the time bound" : "", o.devices);
	fflush(stdout);
	double t0 = now();
	long cases = 0, runs = 0, failed = 0, known = 0;
	static char text[TEXT + 4096];
	char binds[256], path[600];
	char seen[64][160];
	int n_seen = 0;
	for (long n = o.start; o.count < 0 || n < o.start + o.count; n++) {
		if (o.seconds > 0 && now() - t0 > o.seconds)
			break;
		uint64_t ts = o.seed * 1000003ull + (uint64_t)n;
		generate(ts, text, sizeof text, binds, sizeof binds);
		snprintf(path, sizeof path, "%s/case.trace", work_dir);
		write_file(path, text);
		cases++;
		if (o.verbose)
			printf("== trace %ld (--bind %s)\n%s", n, binds, text);
		for (int d = 0; d < nd; d++) {
			result r;
			run_tool(&o, path, devs[d], binds, ts, &r);
			runs++;
			if (r.kind == R_PASS)
				continue;
			/* an open bug, listed with its issue: counted, not failed
			 * (an error by its message; any failure of one trace by
			 * "trace SEED N") */
			int kn = -1;
			char tr[64];
			snprintf(tr, sizeof tr, "trace %llu %ld", (unsigned long long)o.seed, n);
			for (int k = 0; k < o.n_known && kn < 0; k++)
				if (!strcmp(o.known[k], tr) ||
				    (r.kind == R_ERROR && strncmp(o.known[k], "trace ", 6) &&
				     strstr(r.text, o.known[k])))
					kn = k;
			if (kn >= 0) {
				known++;
				if (o.verbose)
					printf("KNOWN trace %ld on %s: %s\n", n, devs[d],
					       o.known[kn]);
				continue;
			}
			failed++;
			/* an error names its op and cause: one minimized case
			 * each is enough; every mismatch, crash, hang and
			 * sanitizer report is minimized */
			bool dup = false;
			for (int k = 0; k < n_seen && !dup && r.kind == R_ERROR; k++)
				dup = !strcmp(seen[k], r.sig);
			printf("FAIL trace %ld (seed %llu, --device %s --bind '%s'): %s%s\n", n,
			       (unsigned long long)o.seed, devs[d], binds, r.sig,
			       dup ? " (seen before)" : "");
			fflush(stdout);
			if (dup)
				continue;
			char orig[TEXT + 4096], ob[256];
			snprintf(orig, sizeof orig, "%s", text);
			snprintf(ob, sizeof ob, "%s", binds);
			if (r.kind != R_GENERATOR)
				minimize(&o, orig, sizeof orig, devs[d], ob, ts, &r);
			result fin;
			snprintf(path, sizeof path, "%s/cand.trace", work_dir);
			write_file(path, orig);
			run_tool(&o, path, devs[d], ob, ts, &fin);
			printf("%s--- minimized (%s):\n%s--- fusec said:\n%s\n",
			       dup ? "" : "", fin.sig, orig, fin.text);
			if (o.out) {
				char fp[800];
				snprintf(fp, sizeof fp, "%s/%llu-%ld-%s.trace", o.out,
					 (unsigned long long)o.seed, n, devs[d]);
				FILE *f = fopen(fp, "w");
				if (f) {
					fprintf(f, "# fuzz_pipeline seed %llu trace %ld: %s\n"
						"# fusec run FILE --check --no-cache --device %s "
						"--seed %llu%s%s\n", (unsigned long long)o.seed, n,
						fin.sig, devs[d],
						(unsigned long long)(ts % 1000), *ob ? " --bind " : "",
						ob);
					for (char *p = fin.text; *p;) {
						size_t k = strcspn(p, "\n");
						fprintf(f, "#   %.*s\n", (int)k, p);
						p += k + (p[k] == '\n');
					}
					fputs(orig, f);
					fclose(f);
					printf("written %s\n", fp);
				}
			}
			if (!dup && n_seen < 64)
				snprintf(seen[n_seen++], sizeof seen[0], "%s", r.sig);
			snprintf(path, sizeof path, "%s/case.trace", work_dir);
			write_file(path, text);
			fflush(stdout);
		}
		if (o.seconds > 0 && (cases % 50) == 0) {
			printf("fuzz_pipeline: %ld traces, %ld runs, %ld failed, %.0f s\n",
			       cases, runs, failed, now() - t0);
			fflush(stdout);
		}
	}
	printf("fuzz_pipeline: seed %llu: %ld traces, %ld runs (%s), %ld failed, "
	       "%ld known, %.1f s\n", (unsigned long long)o.seed, cases, runs,
	       o.devices, failed, known, now() - t0);
	char cmd[700];
	snprintf(cmd, sizeof cmd, "%s/out.txt", work_dir);
	unlink(cmd);
	snprintf(cmd, sizeof cmd, "%s/case.trace", work_dir);
	unlink(cmd);
	snprintf(cmd, sizeof cmd, "%s/cand.trace", work_dir);
	unlink(cmd);
	rmdir(work_dir);
	return failed ? 1 : 0;
}
