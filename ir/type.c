/*
 * type.c: extents and types.
 *
 * An extent is a monomial c * B^i * T^j ... over a trace's symbols (see the
 * essay in ir.h). Multiplication adds powers, division subtracts them, and
 * both refuse what a monomial cannot say: B/T, or a power above 15.
 * Equality is structural, which is exactly right for symbols: B and T are
 * different extents even if both happen to be bound to 8.
 *
 * Coefficients are checked for overflow at every step, so a type like
 * f32[4611686018427387904, 4] is an error when it is built, not a wrapped
 * element count later.
 *
 * Sums. T+1 is not a monomial; it is a derived symbol (ir.h), and this
 * file keeps the one canonical form: an extent is multiplied out into a
 * polynomial over the free symbols (fz_ext_expand), polynomials are added
 * term by term, and fz_trace_ext_of_poly turns one back into an extent by
 * pulling out the terms' common factor (gcd of coefficients, lowest power
 * of each symbol):
 *
 *     B*T-B   ->  gcd 1, common B, primitive T-1   ->  B * sym "T-1"
 *     2*T+2   ->  gcd 2, common 1, primitive T+1   ->  2 * sym "T+1"
 *     2*T     ->  one term: the monomial 2*T, no derived symbol
 *
 * The primitive part is unique, so its printed text names the derived
 * symbol and a second spelling of the same sum finds the same symbol.
 * At run time fz_trace_syms_derive computes each derived size from the
 * free ones (and solves for a free one an input's dim determines).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

bool fz_ext_mul(fz_ext a, fz_ext b, fz_ext *out)
{
	int64_t c;
	if (__builtin_mul_overflow(a.c, b.c, &c) || c > INT64_MAX / 2)
		return false;
	if (!a.syms || !b.syms) { /* no power to add: the common case */
		out->c = c;
		out->syms = a.syms | b.syms;
		return true;
	}
	uint64_t syms = 0;
	for (int s = 0; s < FZ_MAX_SYMS; s++) {
		uint64_t p = (uint64_t)(fz_ext_power(a, s) + fz_ext_power(b, s));
		if (p > 15)
			return false;
		syms |= p << (FZ_SYM_BITS * s);
	}
	out->c = c;
	out->syms = syms;
	return true;
}

bool fz_ext_div(fz_ext a, fz_ext b, fz_ext *out)
{
	if (b.c == 0 || a.c % b.c != 0)
		return false;
	uint64_t syms = 0;
	for (int s = 0; s < FZ_MAX_SYMS; s++) {
		int p = fz_ext_power(a, s) - fz_ext_power(b, s);
		if (p < 0)
			return false;
		syms |= (uint64_t)p << (FZ_SYM_BITS * s);
	}
	out->c = a.c / b.c;
	out->syms = syms;
	return true;
}

int64_t fz_ext_eval(fz_ext e, const int64_t *sym_sizes)
{
	int64_t v = e.c;
	/* only the symbols present: most extents have none (the passes
	 * evaluate hundreds of thousands of them) */
	for (uint64_t m = e.syms; m;) {
		int i = __builtin_ctzll(m) / FZ_SYM_BITS;
		m &= ~((uint64_t)15 << (FZ_SYM_BITS * i));
		for (int p = fz_ext_power(e, i); p > 0; p--) {
			if (!sym_sizes || sym_sizes[i] < 0)
				return -1;
			if (__builtin_mul_overflow(v, sym_sizes[i], &v))
				return -1;
		}
	}
	return v;
}

/* The symbols of e that are derived, as a mask of their nibbles. */
static uint64_t derived_mask(const fz_trace *t, fz_ext e)
{
	uint64_t m = 0;
	if (!t)
		return 0;
	for (uint64_t r = e.syms; r;) {
		int i = __builtin_ctzll(r) / FZ_SYM_BITS;
		r &= ~((uint64_t)15 << (FZ_SYM_BITS * i));
		if (i < t->n_syms && t->sym_def[i])
			m |= (uint64_t)15 << (FZ_SYM_BITS * i);
	}
	return m;
}

static int degree(fz_ext e)
{
	int d = 0;
	for (int i = 0; i < FZ_MAX_SYMS; i++)
		d += fz_ext_power(e, i);
	return d;
}

/* Falling degree, then the larger mask first; the constant last. */
static int term_cmp(const void *pa, const void *pb)
{
	const fz_ext *a = pa, *b = pb;
	int da = degree(*a), db = degree(*b);
	if (da != db)
		return db - da;
	return a->syms == b->syms ? 0 : a->syms > b->syms ? -1 : 1;
}

/* Adds the term m into p, merging a like term; false when full or on
 * overflow. Zero coefficients are dropped by poly_sort. */
static bool poly_put(fz_poly *p, fz_ext m)
{
	for (int i = 0; i < p->n; i++)
		if (p->term[i].syms == m.syms)
			return !__builtin_add_overflow(p->term[i].c, m.c, &p->term[i].c);
	if (p->n == FZ_POLY_TERMS)
		return false;
	p->term[p->n++] = m;
	return true;
}

static void poly_sort(fz_poly *p)
{
	int k = 0;
	for (int i = 0; i < p->n; i++)
		if (p->term[i].c)
			p->term[k++] = p->term[i];
	p->n = k;
	qsort(p->term, (size_t)p->n, sizeof p->term[0], term_cmp);
}

static bool poly_mul(const fz_poly *a, const fz_poly *b, fz_poly *out)
{
	fz_poly r = {0};
	for (int i = 0; i < a->n; i++)
		for (int j = 0; j < b->n; j++) {
			fz_ext m;
			if (!fz_ext_mul(a->term[i], b->term[j], &m) || !poly_put(&r, m))
				return false;
		}
	poly_sort(&r);
	*out = r;
	return true;
}

bool fz_poly_add(const fz_poly *a, const fz_poly *b, int sign, fz_poly *out)
{
	fz_poly r = *a;
	for (int j = 0; j < b->n; j++) {
		fz_ext m = b->term[j];
		if (sign < 0 && __builtin_mul_overflow(m.c, -1, &m.c))
			return false;
		if (!poly_put(&r, m))
			return false;
	}
	poly_sort(&r);
	*out = r;
	return true;
}

bool fz_ext_expand(const fz_trace *t, fz_ext e, fz_poly *out)
{
	uint64_t dm = derived_mask(t, e);
	fz_poly r = {.n = 1, .term = {{e.c, e.syms & ~dm}}};
	for (uint64_t m = dm; m;) {
		int i = __builtin_ctzll(m) / FZ_SYM_BITS;
		m &= ~((uint64_t)15 << (FZ_SYM_BITS * i));
		for (int p = fz_ext_power(e, i); p > 0; p--)
			if (!poly_mul(&r, t->sym_def[i], &r))
				return false;
	}
	poly_sort(&r);
	*out = r;
	return true;
}

bool fz_ext_diff(const fz_trace *t, fz_ext a, fz_ext b, fz_poly *out)
{
	fz_poly pa, pb;
	return fz_ext_expand(t, a, &pa) && fz_ext_expand(t, b, &pb) &&
	       fz_poly_add(&pa, &pb, -1, out);
}

/* One monomial over free symbols: "2*B*T", "T", "3". */
static size_t mono_str(const fz_trace *t, fz_ext e, bool coef, char *buf,
		       size_t n)
{
	size_t len = 0;
	buf[0] = '\0';
	if (coef)
		len += (size_t)snprintf(buf, n, "%lld", (long long)e.c);
	for (int i = 0; i < FZ_MAX_SYMS && len < n; i++) {
		const char *s = t && i < t->n_syms ? t->syms[i] : "?";
		for (int p = fz_ext_power(e, i); p > 0 && len < n; p--)
			len += (size_t)snprintf(buf + len, n - len, "%s%s",
						len ? "*" : "", s);
	}
	return len < n ? len : n - 1;
}

/* "B*T-B+2": each term with its sign, a coefficient only where not 1. */
static void poly_str(const fz_trace *t, const fz_poly *p, char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = '\0';
	if (p->n == 0)
		snprintf(buf, n, "0");
	for (int i = 0; i < p->n && len + 1 < n; i++) {
		fz_ext m = p->term[i];
		if (m.c < 0 || i)
			buf[len++] = m.c < 0 ? '-' : '+';
		m.c = m.c < 0 ? -m.c : m.c;
		len += mono_str(t, m, m.c != 1 || m.syms == 0, buf + len, n - len);
	}
	buf[len < n ? len : n - 1] = '\0';
}

const char *fz_ext_str(const fz_trace *t, fz_ext e, char *buf, size_t n)
{
	fz_poly p;
	if (derived_mask(t, e) && fz_ext_expand(t, e, &p)) {
		poly_str(t, &p, buf, n);
		return buf;
	}
	mono_str(t, e, e.c != 1 || e.syms == 0, buf, n);
	return buf;
}

bool fz_type_eq(const fz_type *a, const fz_type *b)
{
	if (a->dtype != b->dtype || a->rank != b->rank || a->future != b->future)
		return false;
	for (int i = 0; i < a->rank; i++)
		if (!fz_ext_eq(a->dims[i], b->dims[i]))
			return false;
	return true;
}

bool fz_type_numel(const fz_type *t, fz_ext *out)
{
	fz_ext n = fz_ext_const(1);
	for (int i = 0; i < t->rank; i++)
		if (!fz_ext_mul(n, t->dims[i], &n))
			return false;
	*out = n;
	return true;
}

int64_t fz_type_numel_at(const fz_type *t, const int64_t *sizes)
{
	int64_t n = 1;
	for (int i = 0; i < t->rank; i++) {
		int64_t e = fz_ext_eval(t->dims[i], sizes);
		if (e < 0 || __builtin_mul_overflow(n, e, &n))
			return -1;
	}
	return n;
}

const char *fz_type_str(const fz_trace *t, const fz_type *ty, char *buf, size_t n)
{
	size_t len = (size_t)snprintf(buf, n, "%s%s[", ty->future ? "future " : "",
				      fz_dtype_name(ty->dtype));
	for (int i = 0; i < ty->rank && len < n; i++) {
		char e[128];
		len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "",
					fz_ext_str(t, ty->dims[i], e, sizeof e));
	}
	if (len < n)
		snprintf(buf + len, n - len, "]");
	return buf;
}

int fz_trace_symbol_find(const fz_trace *t, const char *name)
{
	for (int i = 0; i < t->n_syms; i++)
		if (strcmp(t->syms[i], name) == 0)
			return i;
	return -1;
}

int fz_trace_symbol_intern(fz_trace *t, const char *name)
{
	int i = fz_trace_symbol_find(t, name);
	if (i >= 0)
		return i;
	if (t->n_syms == FZ_MAX_SYMS)
		return -1;
	const char *s = fz_arena_strdup(&t->arena, name);
	if (!s)
		return -1;
	t->syms[t->n_syms] = s;
	return t->n_syms++;
}

int fz_trace_symbol_count(const fz_trace *t) { return t->n_syms; }

const char *fz_trace_symbol(const fz_trace *t, int i)
{
	return i >= 0 && i < t->n_syms ? t->syms[i] : NULL;
}

/* ---- Derived symbols ---------------------------------------------------- */

static int64_t gcd64(int64_t a, int64_t b)
{
	while (b) {
		int64_t r = a % b;
		a = b;
		b = r;
	}
	return a;
}

bool fz_trace_ext_of_poly(fz_trace *t, const fz_poly *in, fz_ext *out)
{
	fz_poly p = *in;
	poly_sort(&p);
	if (p.n == 0) {
		*out = fz_ext_const(0);
		return true;
	}
	if (p.n == 1) {
		*out = p.term[0];
		return out->c >= 0;
	}
	bool all_negative = true; /* then negative at every size */
	for (int i = 0; i < p.n; i++)
		all_negative &= p.term[i].c < 0;
	if (all_negative)
		return false;
	/* the common factor: gcd of the coefficients, lowest powers */
	int64_t g = 0;
	uint64_t common = 0;
	for (int s = 0; s < FZ_MAX_SYMS; s++) {
		int lo = 15;
		for (int i = 0; i < p.n; i++) {
			int pw = fz_ext_power(p.term[i], s);
			lo = pw < lo ? pw : lo;
		}
		common |= (uint64_t)lo << (FZ_SYM_BITS * s);
	}
	for (int i = 0; i < p.n; i++) {
		if (p.term[i].c == INT64_MIN)
			return false;
		g = gcd64(g, p.term[i].c < 0 ? -p.term[i].c : p.term[i].c);
	}
	fz_ext f = {g, common};
	for (int i = 0; i < p.n; i++)
		if (!fz_ext_div(p.term[i], f, &p.term[i]))
			return false;
	poly_sort(&p);
	char name[256];
	poly_str(t, &p, name, sizeof name);
	if (strlen(name) + 1 >= sizeof name)
		return false; /* a name cut short could meet another sum's */
	int s = fz_trace_symbol_find(t, name);
	if (s < 0) {
		fz_poly *def = fz_arena_alloc(&t->arena, sizeof *def);
		if (!def || (s = fz_trace_symbol_intern(t, name)) < 0)
			return false;
		*def = p;
		t->sym_def[s] = def;
	} else if (!t->sym_def[s]) {
		return false; /* a free symbol spelled like a sum: never valid */
	}
	return fz_ext_mul(f, fz_ext_sym(s), out);
}

static bool is_ident_start(char c)
{
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_ident_char(char c)
{
	return is_ident_start(c) || (c >= '0' && c <= '9');
}

/* ext := ['+'|'-'] term (('+'|'-') term)*;  term := factor ('*' factor)*;
 * factor := INT | NAME (a free symbol) */
bool fz_trace_ext_parse(fz_trace *t, const char *s, fz_ext *out)
{
	fz_poly p = {0};
	int sign = 1;
	if (*s == '+' || *s == '-')
		sign = *s++ == '-' ? -1 : 1;
	for (;;) {
		fz_ext m = fz_ext_const(sign);
		for (;;) {
			fz_ext f;
			if (*s >= '0' && *s <= '9') {
				int64_t v = 0;
				for (; *s >= '0' && *s <= '9'; s++)
					if (__builtin_mul_overflow(v, 10, &v) ||
					    __builtin_add_overflow(v, *s - '0', &v))
						return false;
				f = fz_ext_const(v);
			} else if (is_ident_start(*s)) {
				char name[128];
				size_t k = 0;
				while (is_ident_char(*s) && k + 1 < sizeof name)
					name[k++] = *s++;
				if (is_ident_char(*s))
					return false;
				name[k] = '\0';
				int sym = fz_trace_symbol_intern(t, name);
				if (sym < 0)
					return false;
				f = fz_ext_sym(sym);
			} else {
				return false;
			}
			if (!fz_ext_mul(m, f, &m))
				return false;
			if (*s != '*')
				break;
			s++;
		}
		if (!poly_put(&p, m))
			return false;
		if (*s == '\0')
			break;
		if (*s != '+' && *s != '-')
			return false;
		sign = *s++ == '-' ? -1 : 1;
	}
	return fz_trace_ext_of_poly(t, &p, out);
}

/* The size of p at syms into *v; false when it needs an unbound symbol.
 * *ovf on overflow. */
static bool poly_eval(const fz_poly *p, const int64_t *syms, int64_t *v,
		      bool *ovf)
{
	*v = 0;
	for (int i = 0; i < p->n; i++) {
		fz_ext m = p->term[i];
		int64_t x = m.c;
		for (int s = 0; s < FZ_MAX_SYMS; s++)
			for (int pw = fz_ext_power(m, s); pw > 0; pw--) {
				if (syms[s] < 0)
					return false;
				*ovf |= __builtin_mul_overflow(x, syms[s], &x);
			}
		*ovf |= __builtin_add_overflow(*v, x, v);
	}
	return true;
}

/* Solves p == want for the one unbound symbol of p, if it appears in one
 * term to the first power: 1 when solved, 0 when p cannot say, -1 when
 * no size does it. */
static int poly_solve(const fz_poly *p, int64_t *syms, int64_t want)
{
	int x = -1, at = -1;
	for (int i = 0; i < p->n; i++)
		for (int s = 0; s < FZ_MAX_SYMS; s++) {
			int pw = fz_ext_power(p->term[i], s);
			if (!pw || syms[s] >= 0)
				continue;
			if (x >= 0 || pw != 1)
				return 0;
			x = s;
			at = i;
		}
	if (x < 0)
		return 0;
	fz_poly rest = *p;
	fz_ext m = rest.term[at];
	rest.term[at] = rest.term[--rest.n];
	m.syms &= ~((uint64_t)15 << (FZ_SYM_BITS * x));
	fz_poly k1 = {.n = 1, .term = {m}};
	int64_t r, k;
	bool ovf = false;
	poly_eval(&rest, syms, &r, &ovf);
	poly_eval(&k1, syms, &k, &ovf);
	if (ovf || k == 0 || __builtin_sub_overflow(want, r, &r) || r % k ||
	    r / k < 0)
		return -1;
	syms[x] = r / k;
	return 1;
}

int fz_trace_syms_derive(const fz_trace *t, int64_t *syms, char *msg, size_t n)
{
	int bound = 0;
	for (bool progress = true; progress;) {
		progress = false;
		for (int s = 0; s < t->n_syms; s++) {
			const fz_poly *d = t->sym_def[s];
			int64_t v;
			bool ovf = false;
			if (!d)
				continue;
			if (!poly_eval(d, syms, &v, &ovf)) {
				if (syms[s] < 0)
					continue;
				int r = poly_solve(d, syms, syms[s]);
				if (r < 0) {
					snprintf(msg, n, "extent %s is given the size "
						 "%lld, which no size of its symbols "
						 "gives", t->syms[s], (long long)syms[s]);
					return -1;
				}
				if (r > 0)
					progress = true, bound++;
				continue;
			}
			if (ovf) {
				snprintf(msg, n, "extent %s overflows at the bound "
					 "sizes", t->syms[s]);
				return -1;
			}
			if (v < 0) {
				snprintf(msg, n, "extent %s is %lld at the bound sizes; "
					 "an extent cannot be negative", t->syms[s],
					 (long long)v);
				return -1;
			}
			if (syms[s] < 0) {
				syms[s] = v;
				bound++;
			} else if (syms[s] != v) {
				snprintf(msg, n, "extent %s is given the size %lld; the "
					 "bound sizes make it %lld", t->syms[s],
					 (long long)syms[s], (long long)v);
				return -1;
			}
		}
	}
	return bound;
}
