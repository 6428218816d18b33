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
 */
#include <stdio.h>
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

const char *fz_ext_str(const fz_trace *t, fz_ext e, char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = '\0';
	if (e.c != 1 || e.syms == 0)
		len += (size_t)snprintf(buf, n, "%lld", (long long)e.c);
	for (int i = 0; i < FZ_MAX_SYMS && len < n; i++) {
		const char *s = t && i < t->n_syms ? t->syms[i] : "?";
		for (int p = fz_ext_power(e, i); p > 0 && len < n; p--)
			len += (size_t)snprintf(buf + len, n - len, "%s%s",
						len ? "*" : "", s);
	}
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
