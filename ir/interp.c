/*
 * interp.c: the reference interpreter, the oracle every backend is checked
 * against.
 *
 * It is written to be obviously right rather than fast. Every value of the
 * trace lives in a contiguous row-major buffer of its storage dtype. Nodes
 * run one at a time in trace order (which is topological). Every float op
 * loads its operands' stored values as f64, computes in f64, and rounds once
 * to the result's dtype as it stores (eager semantics: a bf16 add is the f64
 * sum of two bf16 numbers rounded to bf16). Integer ops compute in int64 and
 * wrap to the result's width. Reductions, matmul and linear accumulate in f64
 * (int64 for integers) whatever the storage dtype, so the oracle is at least
 * as accurate as any backend it judges.
 *
 * Memory: before running, each value's readers are counted; a buffer is
 * freed as soon as its last reader has run, so a 32-layer trace holds about
 * what eager execution would, not every intermediate. Outputs are never
 * freed; they are handed to the caller at the end, and only then, so on an
 * error nothing leaks and the caller's outputs are untouched.
 *
 * Worked example, with B bound to 2:
 *
 *     trace f(x: bf16[B, 3]) {
 *       y = sum(cast(x, dtype=f32), dims=[1])     # cast: x's bf16 bits -> f32
 *       return y                                  # sum: f64 accumulator,
 *     }                                           #      rounded to f32 once
 *
 * The input tensor may be strided (a transposed view, say); it is copied
 * into a contiguous buffer first, so every op below only ever sees
 * contiguous row-major data and computes offsets from shapes alone.
 *
 * Nothing here trusts its input to be in range: an index read from a tensor
 * is checked before it is used and reported (op, line:col, value, extent)
 * as FZ_ERANGE; extents are re-checked at the bound sizes, because a
 * symbolic extent that the builder could not compare may still disagree at
 * run time. Binding (fz_trace_bind) comes first and is shared: the
 * interpreter binds a copy of the caller's sizes against its inputs, so an
 * input whose shape disagrees with the sizes it was told is an error, too.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "numeric.h"
#include "philox.h"
#include "pool.h"

/* ---- errors --------------------------------------------------------------- */

static void set_err(char **err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void set_err(char **err, const char *fmt, ...)
{
	if (!err)
		return;
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	fz_set_err(err, fz_strdup(buf));
}

/* "take at 3:7" or "take": how a node is named in messages. */
static const char *node_where(const fz_node *n, char *buf, size_t len)
{
	if (n->line > 0)
		snprintf(buf, len, "%s at %d:%d", fz_ops[n->op].name, n->line, n->col);
	else
		snprintf(buf, len, "%s", fz_ops[n->op].name);
	return buf;
}

/* "input 1 ('x', f32[B, 4])" */
static const char *param_desc(const fz_trace *t, int i, char *buf, size_t len)
{
	const fz_value *p = t->params[i];
	char ty[256];
	fz_type_str(t, &p->type, ty, sizeof ty);
	if (p->name)
		snprintf(buf, len, "input %d ('%s', %s)", i, p->name, ty);
	else
		snprintf(buf, len, "input %d (%s)", i, ty);
	return buf;
}

/* ---- binding ---------------------------------------------------------------- */

static bool single_sym(fz_ext e, int *s)
{
	*s = fz_ext_as_sym(e);
	return *s >= 0;
}

/* Element count of a type at the bound sizes; -1 if it cannot be evaluated
 * or its byte size overflows. Zero extents are counted as 1 for the
 * overflow check, so that every partial product of the shape (strides,
 * outer and inner sizes) fits too: [0, 2^40, 2^40] is refused. */
static int64_t type_numel(const fz_type *ty, const int64_t *syms)
{
	int64_t n = 1, nz = 1;
	for (int d = 0; d < ty->rank; d++) {
		int64_t e = fz_ext_eval(ty->dims[d], syms);
		if (e < 0 || __builtin_mul_overflow(nz, e ? e : 1, &nz))
			return -1;
		n *= e;
	}
	int64_t bytes;
	if (__builtin_mul_overflow(nz, (int64_t)fz_dtype_size(ty->dtype), &bytes) ||
	    (uint64_t)bytes > SIZE_MAX / 2)
		return -1;
	return n;
}

/* Where symbol s first appears: a param's dim (set *param), else the first
 * node whose result type or attributes mention it (set *node). */
static void sym_site(const fz_trace *t, int s, int *param, const fz_node **node)
{
	uint64_t bit = UINT64_C(15) << (FZ_SYM_BITS * s);
	*param = -1;
	*node = NULL;
	for (int i = 0; i < t->n_params; i++)
		for (int d = 0; d < t->params[i]->type.rank; d++)
			if (t->params[i]->type.dims[d].syms & bit) {
				*param = i;
				return;
			}
	for (int k = 0; k < t->n_nodes; k++) {
		const fz_node *n = t->nodes[k];
		const fz_attrs *a = &n->attrs;
		bool hit = a->value_sym == s && (a->present & AT(VALUE));
		for (int i = 0; !hit && i < a->n_shape; i++)
			hit = a->shape[i].syms & bit;
		for (int i = 0; !hit && a->end && i < a->n_slice; i++)
			hit = a->end[i].syms & bit;
		for (int j = 0; !hit && j < n->n_out; j++)
			for (int d = 0; !hit && d < n->out[j]->type.rank; d++)
				hit = n->out[j]->type.dims[d].syms & bit;
		if (hit) {
			*node = n;
			return;
		}
	}
}

/* bind_into: binds syms[] (n_syms entries, -1 unknown) in place. */
static fz_status bind_into(const fz_trace *t, const fz_tensor *inputs, int n_in,
			   int64_t *syms, char **err)
{
	char pd[400], e1[128];
	int from[FZ_MAX_SYMS]; /* the input that bound each symbol, or -1 */

	if (n_in != t->n_params) {
		set_err(err, "trace '%s' takes %d input%s; got %d", t->name,
			t->n_params, t->n_params == 1 ? "" : "s", n_in);
		return FZ_EINVAL;
	}
	if (n_in > 0 && !inputs) {
		set_err(err, "trace '%s': inputs is NULL", t->name);
		return FZ_EINVAL;
	}
	for (int s = 0; s < t->n_syms; s++) {
		from[s] = -1;
		if (syms[s] < -1) {
			set_err(err, "symbol '%s' is given the size %lld; expected a "
				"size >= 0, or -1 to take it from the inputs",
				t->syms[s], (long long)syms[s]);
			return FZ_EBIND;
		}
	}

	/* Pass 1: dtypes, ranks, concrete extents, and dims that are one symbol. */
	for (int i = 0; i < n_in; i++) {
		const fz_type *p = &t->params[i]->type;
		const fz_tensor *x = &inputs[i];
		if (x->dtype != p->dtype) {
			set_err(err, "%s is given a tensor of dtype %s",
				param_desc(t, i, pd, sizeof pd),
				fz_dtype_name(x->dtype));
			return FZ_EINVAL;
		}
		if (x->rank != p->rank) {
			set_err(err, "%s is given a tensor of rank %d; expected %d",
				param_desc(t, i, pd, sizeof pd), x->rank, p->rank);
			return FZ_EINVAL;
		}
		for (int d = 0; d < p->rank; d++) {
			fz_ext e = p->dims[d];
			int64_t got = x->shape[d];
			int s;
			if (got < 0) {
				set_err(err, "%s is given a negative extent %lld in dim %d",
					param_desc(t, i, pd, sizeof pd), (long long)got, d);
				return FZ_EINVAL;
			}
			if (fz_ext_is_const(e)) {
				if (e.c != got) {
					set_err(err, "%s is given extent %lld in dim %d; "
						"expected %lld",
						param_desc(t, i, pd, sizeof pd),
						(long long)got, d, (long long)e.c);
					return FZ_EINVAL;
				}
				continue;
			}
			if (!single_sym(e, &s))
				continue; /* a product like 2*B: pass 2 */
			if (syms[s] == -1) {
				syms[s] = got;
				from[s] = i;
			} else if (syms[s] != got) {
				char other[400];
				if (from[s] >= 0)
					param_desc(t, from[s], other, sizeof other);
				else
					snprintf(other, sizeof other, "the given sizes");
				set_err(err, "symbol '%s' is bound to %lld by %s, dim %d; "
					"but to %lld by %s", t->syms[s], (long long)got,
					param_desc(t, i, pd, sizeof pd), d,
					(long long)syms[s], other);
				return FZ_EBIND;
			}
		}
	}

	/* Pass 2: product extents. Each either checks out, or has exactly one
	 * unbound symbol it can solve for; repeat while that makes progress. */
	for (bool progress = true; progress;) {
		progress = false;
		/* derived symbols (T+1): sized from the free ones, or solved */
		char msg[300];
		int derived = fz_trace_syms_derive(t, syms, msg, sizeof msg);
		if (derived < 0) {
			set_err(err, "%s", msg);
			return FZ_EBIND;
		}
		progress = derived > 0;
		for (int i = 0; i < n_in; i++) {
			const fz_type *p = &t->params[i]->type;
			for (int d = 0; d < p->rank; d++) {
				fz_ext e = p->dims[d];
				int s;
				if (fz_ext_is_const(e) || single_sym(e, &s))
					continue;
				int64_t got = inputs[i].shape[d], known = e.c;
				int unbound = -1, n_unbound = 0;
				bool ovf = false;
				for (int k = 0; k < t->n_syms; k++) {
					int pw = fz_ext_power(e, k);
					if (pw == 0)
						continue;
					if (syms[k] < 0) {
						unbound = pw == 1 ? k : -2;
						n_unbound++;
					} else {
						for (; pw > 0; pw--)
							ovf |= __builtin_mul_overflow(known, syms[k], &known);
					}
				}
				if (n_unbound == 0 && !ovf && known == got)
					continue;
				if (n_unbound == 1 && unbound >= 0 && !ovf && known > 0 &&
				    got % known == 0) {
					syms[unbound] = got / known;
					from[unbound] = i;
					progress = true;
					continue;
				}
				if (n_unbound > 1 || (n_unbound == 1 && known == 0))
					continue; /* not solvable yet; maybe later */
				set_err(err, "%s is given extent %lld in dim %d, which "
					"does not fit %s at the bound sizes",
					param_desc(t, i, pd, sizeof pd), (long long)got, d,
					fz_ext_str(t, e, e1, sizeof e1));
				return FZ_EBIND;
			}
		}
	}

	for (int s = 0; s < t->n_syms; s++) {
		if (syms[s] >= 0)
			continue;
		int pi;
		const fz_node *n;
		char where[600] = "";
		sym_site(t, s, &pi, &n);
		if (pi >= 0) {
			char b[400];
			snprintf(where, sizeof where, " (%s does not determine it)",
				 param_desc(t, pi, b, sizeof b));
		} else if (n) {
			char b[128];
			snprintf(where, sizeof where, " (it appears only in ops, first "
				 "in %s)", node_where(n, b, sizeof b));
		}
		set_err(err, "symbol '%s' is unbound: bind it (e.g. --bind %s=128)%s",
			t->syms[s], t->syms[s], where);
		return FZ_EBIND;
	}

	for (int v = 0; v < t->n_values; v++) {
		const fz_value *val = t->values[v];
		if (type_numel(&val->type, syms) >= 0)
			continue;
		char ty[256], b[128] = "a parameter", vname[160];
		fz_type_str(t, &val->type, ty, sizeof ty);
		if (val->def)
			node_where(val->def, b, sizeof b);
		if (val->name)
			snprintf(vname, sizeof vname, "'%s'", val->name);
		else
			snprintf(vname, sizeof vname, "#%d", val->id);
		set_err(err, "value %s (%s, from %s) has too many elements at the "
			"bound sizes", vname, ty, b);
		return FZ_EBIND;
	}
	/* a max over a symbol bound to 0: refused before anything runs (the
	 * verifier refused the concrete ones already) */
	return t->n_syms ? fz_trace_empty_extremum(t, syms, err) : FZ_OK;
}

fz_status fz_trace_bind(const fz_trace *t, const fz_tensor *inputs, int n_in,
			int64_t *sym_sizes, char **err)
{
	if (err)
		*err = NULL;
	if (!t) {
		set_err(err, "fz_trace_bind: trace is NULL");
		return FZ_EINVAL;
	}
	if (t->n_syms > 0 && !sym_sizes) {
		set_err(err, "trace '%s' has %d symbols; sym_sizes is NULL", t->name,
			t->n_syms);
		return FZ_EINVAL;
	}
	int64_t syms[FZ_MAX_SYMS];
	for (int s = 0; s < t->n_syms; s++)
		syms[s] = sym_sizes[s];
	fz_status st = bind_into(t, inputs, n_in, syms, err);
	if (st != FZ_OK)
		return st;
	for (int s = 0; s < t->n_syms; s++)
		sym_sizes[s] = syms[s];
	return FZ_OK;
}

/* ---- the interpreter's state ------------------------------------------------ */

typedef struct slot {
	void *data;          /* owned; NULL when not (or no longer) held */
	fz_dtype dtype;
	int rank;
	int64_t shape[FZ_MAX_RANK];
	int64_t numel;
	int uses;            /* readers not yet run */
	bool output;         /* returned: never freed before the end */
} slot;

typedef struct interp {
	const fz_trace *t;
	const bool *live;    /* per node: run it (dce.c); NULL: all */
	const int64_t *syms;
	slot *slots;         /* by value id */
	char **err;
} interp;

static slot *S(interp *I, const fz_value *v) { return &I->slots[v->id]; }

static fz_status fail(interp *I, fz_status st, const fz_node *n,
		      const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static fz_status fail(interp *I, fz_status st, const fz_node *n,
		      const char *fmt, ...)
{
	char msg[768], where[128];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	set_err(I->err, "%s: %s", node_where(n, where, sizeof where), msg);
	return st;
}

static fz_status oom(interp *I, const fz_node *n)
{
	return fail(I, FZ_ENOMEM, n, "out of memory");
}

static size_t nbytes(const slot *s)
{
	size_t b = (size_t)s->numel * fz_dtype_size(s->dtype);
	return b ? b : 1; /* so an empty tensor still has a buffer */
}

/* Row-major strides (in elements) of a shape. */
static void strides_of(int rank, const int64_t *shape, int64_t *st)
{
	int64_t acc = 1;
	for (int d = rank - 1; d >= 0; d--) {
		st[d] = acc;
		acc *= shape[d];
	}
}

/* a * b * c == want, without overflowing on the way. */
static bool size_is(int64_t a, int64_t b, int64_t c, int64_t want)
{
	int64_t p;
	return !__builtin_mul_overflow(a, b, &p) &&
	       !__builtin_mul_overflow(p, c, &p) && p == want;
}

static int64_t prod(const int64_t *shape, int lo, int hi)
{
	int64_t p = 1;
	for (int d = lo; d < hi; d++)
		p *= shape[d];
	return p;
}

/* Copies a strided view (src + off, element strides sst, shape) into the
 * contiguous dst. The workhorse of every layout op. */
static void gather(void *dst, const void *src, size_t es, int rank,
		   const int64_t *shape, const int64_t *sst, int64_t off)
{
	int64_t n = prod(shape, 0, rank);
	int64_t idx[FZ_MAX_RANK] = {0};
	char *o = dst;
	const char *s = src;
	for (int64_t i = 0; i < n; i++) {
		memcpy(o + (size_t)i * es, s + off * (int64_t)es, es);
		for (int d = rank - 1; d >= 0; d--) {
			off += sst[d];
			if (++idx[d] < shape[d])
				break;
			off -= sst[d] * shape[d];
			idx[d] = 0;
		}
	}
}

/* Loads a whole buffer as f64 (or int64); NULL when out of memory. */
static double *load_all_f64(const slot *s)
{
	double *p = malloc(sizeof *p * (size_t)(s->numel ? s->numel : 1));
	if (p)
		for (int64_t i = 0; i < s->numel; i++)
			p[i] = fz_load_f64(s->data, s->dtype, i);
	return p;
}

static int64_t *load_all_i64(const slot *s)
{
	int64_t *p = malloc(sizeof *p * (size_t)(s->numel ? s->numel : 1));
	if (p)
		for (int64_t i = 0; i < s->numel; i++)
			p[i] = fz_load_i64(s->data, s->dtype, i);
	return p;
}

/* ---- elementwise -------------------------------------------------------------- */

static double unary_f(int op, double x)
{
	switch (op) {
	case FZ_OP_NEG: return -x;
	case FZ_OP_ABS: return fabs(x);
	case FZ_OP_EXP: return exp(x);
	case FZ_OP_EXP2: return exp2(x);
	case FZ_OP_LOG: return log(x);
	case FZ_OP_LOG2: return log2(x);
	case FZ_OP_LOG1P: return log1p(x);
	case FZ_OP_EXPM1: return expm1(x);
	case FZ_OP_SQRT: return sqrt(x);
	case FZ_OP_RSQRT: return 1.0 / sqrt(x);
	case FZ_OP_RECIPROCAL: return 1.0 / x;
	case FZ_OP_SIN: return sin(x);
	case FZ_OP_COS: return cos(x);
	case FZ_OP_TANH: return tanh(x);
	case FZ_OP_SIGMOID: return 1.0 / (1.0 + exp(-x));
	case FZ_OP_ERF: return erf(x);
	case FZ_OP_FLOOR: return floor(x);
	case FZ_OP_CEIL: return ceil(x);
	case FZ_OP_ROUND: return nearbyint(x); /* half to even (FE_TONEAREST) */
	case FZ_OP_SIGN:
		return isnan(x) ? x : x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
	default: FZ_ASSERT(!"unary_f: not a float unary op"); return 0;
	}
}

static int64_t unary_i(int op, int64_t x)
{
	uint64_t u = (uint64_t)x;
	switch (op) {
	case FZ_OP_NEG: return (int64_t)(0 - u);
	case FZ_OP_ABS: return x < 0 ? (int64_t)(0 - u) : x;
	case FZ_OP_SIGN: return (x > 0) - (x < 0);
	default: FZ_ASSERT(!"unary_i: not an integer unary op"); return 0;
	}
}

static fz_status run_unary(interp *I, const fz_node *n)
{
	slot *x = S(I, n->in[0]), *y = S(I, n->out[0]);
	fz_dtype xd = x->dtype, yd = y->dtype;
	int64_t N = y->numel;
	if (x->numel != N)
		return fail(I, FZ_EVERIFY, n, "operand size %lld differs from the "
			    "result's %lld", (long long)x->numel, (long long)N);
	switch (n->op) {
	case FZ_OP_CAST:
		if (fz_dtype_is_float(xd))
			for (int64_t i = 0; i < N; i++)
				fz_store_f64(y->data, yd, i, fz_load_f64(x->data, xd, i));
		else
			for (int64_t i = 0; i < N; i++)
				fz_store_i64(y->data, yd, i, fz_load_i64(x->data, xd, i));
		return FZ_OK;
	case FZ_OP_ISFINITE:
		for (int64_t i = 0; i < N; i++)
			fz_store_i64(y->data, yd, i, isfinite(fz_load_f64(x->data, xd, i)));
		return FZ_OK;
	case FZ_OP_LOGICAL_NOT:
		for (int64_t i = 0; i < N; i++)
			fz_store_i64(y->data, yd, i, !fz_load_i64(x->data, xd, i));
		return FZ_OK;
	default:
		break;
	}
	if (fz_dtype_is_float(xd)) {
		for (int64_t i = 0; i < N; i++)
			fz_store_f64(y->data, yd, i, unary_f(n->op, fz_load_f64(x->data, xd, i)));
		return FZ_OK;
	}
	if (n->op != FZ_OP_NEG && n->op != FZ_OP_ABS && n->op != FZ_OP_SIGN)
		return fail(I, FZ_EVERIFY, n, "operand has dtype %s; expected a "
			    "floating dtype", fz_dtype_name(xd));
	for (int64_t i = 0; i < N; i++)
		fz_store_i64(y->data, yd, i, unary_i(n->op, fz_load_i64(x->data, xd, i)));
	return FZ_OK;
}

static double binary_f(int op, double a, double b)
{
	switch (op) {
	case FZ_OP_ADD: return a + b;
	case FZ_OP_SUB: return a - b;
	case FZ_OP_MUL: return a * b;
	case FZ_OP_DIV: return a / b;
	case FZ_OP_POW: return pow(a, b);
	case FZ_OP_MAXIMUM: return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
	case FZ_OP_MINIMUM: return isnan(a) || isnan(b) ? NAN : a < b ? a : b;
	case FZ_OP_FMOD: return fmod(a, b);
	default: FZ_ASSERT(!"binary_f: not a float binary op"); return 0;
	}
}

/* Integer arithmetic wraps: it is done on uint64 and wrapped to the
 * result's width when stored. */
static int64_t binary_i(int op, int64_t a, int64_t b)
{
	uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
	switch (op) {
	case FZ_OP_ADD: return (int64_t)(ua + ub);
	case FZ_OP_SUB: return (int64_t)(ua - ub);
	case FZ_OP_MUL: return (int64_t)(ua * ub);
	case FZ_OP_MAXIMUM: return a > b ? a : b;
	case FZ_OP_MINIMUM: return a < b ? a : b;
	case FZ_OP_FMOD: return b == -1 ? 0 : a % b; /* b != 0 checked */
	case FZ_OP_LOGICAL_AND: return a && b;
	case FZ_OP_LOGICAL_OR: return a || b;
	default: FZ_ASSERT(!"binary_i: not an integer binary op"); return 0;
	}
}

static bool compare(int op, int c, bool unordered)
{
	if (unordered) /* a NaN: only ne holds */
		return op == FZ_OP_NE;
	switch (op) {
	case FZ_OP_EQ: return c == 0;
	case FZ_OP_NE: return c != 0;
	case FZ_OP_LT: return c < 0;
	case FZ_OP_LE: return c <= 0;
	case FZ_OP_GT: return c > 0;
	default: return c >= 0;
	}
}

static fz_status run_binary(interp *I, const fz_node *n)
{
	slot *a = S(I, n->in[0]), *b = S(I, n->in[1]), *y = S(I, n->out[0]);
	fz_dtype xd = a->dtype, yd = y->dtype;
	int64_t N = y->numel;
	bool isfloat = fz_dtype_is_float(xd);

	if (a->dtype != b->dtype)
		return fail(I, FZ_EVERIFY, n, "operand dtypes %s and %s differ",
			    fz_dtype_name(a->dtype), fz_dtype_name(b->dtype));
	if (a->numel != N || b->numel != N)
		return fail(I, FZ_EVERIFY, n, "operand sizes %lld and %lld differ "
			    "from the result's %lld", (long long)a->numel,
			    (long long)b->numel, (long long)N);
	if (n->op >= FZ_OP_EQ && n->op <= FZ_OP_GE) {
		for (int64_t i = 0; i < N; i++) {
			int c;
			bool nan = false;
			if (isfloat) {
				double p = fz_load_f64(a->data, xd, i);
				double q = fz_load_f64(b->data, xd, i);
				nan = isnan(p) || isnan(q);
				c = (p > q) - (p < q);
			} else {
				int64_t p = fz_load_i64(a->data, xd, i);
				int64_t q = fz_load_i64(b->data, xd, i);
				c = (p > q) - (p < q);
			}
			fz_store_i64(y->data, yd, i, compare(n->op, c, nan));
		}
		return FZ_OK;
	}
	if (isfloat && n->op != FZ_OP_LOGICAL_AND && n->op != FZ_OP_LOGICAL_OR) {
		for (int64_t i = 0; i < N; i++)
			fz_store_f64(y->data, yd, i,
				     binary_f(n->op, fz_load_f64(a->data, xd, i),
					      fz_load_f64(b->data, xd, i)));
		return FZ_OK;
	}
	if (n->op == FZ_OP_DIV || n->op == FZ_OP_POW)
		return fail(I, FZ_EVERIFY, n, "operands have dtype %s; expected a "
			    "floating dtype", fz_dtype_name(xd));
	for (int64_t i = 0; i < N; i++) {
		int64_t p = fz_load_i64(a->data, xd, i);
		int64_t q = fz_load_i64(b->data, xd, i);
		if (n->op == FZ_OP_FMOD && q == 0)
			return fail(I, FZ_ERANGE, n, "integer fmod by zero (element "
				    "%lld of %lld)", (long long)i, (long long)N);
		fz_store_i64(y->data, yd, i, binary_i(n->op, p, q));
	}
	return FZ_OK;
}

static fz_status run_where(interp *I, const fz_node *n)
{
	slot *c = S(I, n->in[0]), *a = S(I, n->in[1]), *b = S(I, n->in[2]);
	slot *y = S(I, n->out[0]);
	size_t es = fz_dtype_size(y->dtype);
	if (c->dtype != FZ_BOOL || a->dtype != y->dtype || b->dtype != y->dtype)
		return fail(I, FZ_EVERIFY, n, "operand dtypes do not fit the result's");
	if (c->numel != y->numel || a->numel != y->numel || b->numel != y->numel)
		return fail(I, FZ_EVERIFY, n, "operand sizes differ from the result's");
	const uint8_t *cd = c->data;
	for (int64_t i = 0; i < y->numel; i++) {
		const char *src = cd[i] ? a->data : b->data;
		memcpy((char *)y->data + (size_t)i * es, src + (size_t)i * es, es);
	}
	return FZ_OK;
}

/* ---- creation ------------------------------------------------------------------ */

static fz_status run_creation(interp *I, const fz_node *n)
{
	slot *y = S(I, n->out[0]);
	const fz_attrs *a = &n->attrs;
	switch (n->op) {
	case FZ_OP_FULL:
		if (a->value_sym >= 0) {
			if (a->value_sym >= I->t->n_syms)
				return fail(I, FZ_EVERIFY, n, "value names symbol %d of %d",
					    a->value_sym, I->t->n_syms);
			int64_t v = I->syms[a->value_sym];
			for (int64_t i = 0; i < y->numel; i++)
				fz_store_i64(y->data, y->dtype, i, v);
		} else {
			for (int64_t i = 0; i < y->numel; i++)
				fz_store_f64(y->data, y->dtype, i, a->value);
		}
		return FZ_OK;
	case FZ_OP_IOTA:
		if (y->numel != fz_ext_eval(a->length, I->syms))
			return fail(I, FZ_EVERIFY, n, "length %lld disagrees with the "
				    "result's %lld elements",
				    (long long)fz_ext_eval(a->length, I->syms),
				    (long long)y->numel);
		for (int64_t i = 0; i < y->numel; i++)
			fz_store_i64(y->data, y->dtype, i, i);
		return FZ_OK;
	case FZ_OP_UNIFORM:
		if (!fz_dtype_is_float(y->dtype))
			return fail(I, FZ_EVERIFY, n, "dtype %s; expected a floating dtype",
				    fz_dtype_name(y->dtype));
	{
		/* the seed: the operand's value when there is one */
		uint64_t seed = (uint64_t)a->seed;
		if (n->n_in == 1) {
			slot *s = S(I, n->in[0]);
			seed = (uint64_t)fz_load_i64(s->data, s->dtype, 0);
		}
		for (int64_t i = 0; i < y->numel; i++) {
			uint32_t w = fz_philox_word(seed, (uint64_t)a->offset,
						    (uint64_t)i);
			fz_store_f64(y->data, y->dtype, i, fz_philox_unit(w, y->dtype));
		}
		return FZ_OK;
	}
	default:
		return fail(I, FZ_EUNSUPPORTED, n, "not a creation op");
	}
}

/* ---- meta ---------------------------------------------------------------------- */

static fz_status run_meta(interp *I, const fz_node *n)
{
	slot *x = S(I, n->in[0]), *y = S(I, n->out[0]);
	const fz_attrs *a = &n->attrs;
	size_t es = fz_dtype_size(y->dtype);
	int64_t xst[FZ_MAX_RANK], sst[FZ_MAX_RANK] = {0};
	strides_of(x->rank, x->shape, xst);
	for (int k = 0; k < n->n_in; k++)
		if (S(I, n->in[k])->dtype != y->dtype)
			return fail(I, FZ_EVERIFY, n, "operand %d has dtype %s; the "
				    "result %s", k + 1,
				    fz_dtype_name(S(I, n->in[k])->dtype),
				    fz_dtype_name(y->dtype));

	switch (n->op) {
	case FZ_OP_RESHAPE:
	case FZ_OP_SQUEEZE:
	case FZ_OP_UNSQUEEZE:
		if (x->numel != y->numel)
			return fail(I, FZ_EVERIFY, n, "%lld elements become %lld",
				    (long long)x->numel, (long long)y->numel);
		memcpy(y->data, x->data, (size_t)y->numel * es);
		return FZ_OK;

	case FZ_OP_BROADCAST_IN_DIM:
		if (a->n_dims != x->rank)
			return fail(I, FZ_EVERIFY, n, "dims has %d entries for rank %d",
				    a->n_dims, x->rank);
		for (int i = 0; i < x->rank; i++) {
			int d = a->dims[i];
			if (d < 0 || d >= y->rank)
				return fail(I, FZ_EVERIFY, n, "dim %d out of range", d);
			if (x->shape[i] == 1 && y->shape[d] != 1)
				sst[d] = 0; /* stretched */
			else if (x->shape[i] == y->shape[d])
				sst[d] = xst[i];
			else
				return fail(I, FZ_EVERIFY, n, "operand extent %lld in dim "
					    "%d does not broadcast to %lld",
					    (long long)x->shape[i], i,
					    (long long)y->shape[d]);
		}
		gather(y->data, x->data, es, y->rank, y->shape, sst, 0);
		return FZ_OK;

	case FZ_OP_PERMUTE:
		if (a->n_dims != x->rank || y->rank != x->rank)
			return fail(I, FZ_EVERIFY, n, "dims has %d entries for rank %d",
				    a->n_dims, x->rank);
		for (int i = 0; i < y->rank; i++) {
			int d = a->dims[i];
			if (d < 0 || d >= x->rank || x->shape[d] != y->shape[i])
				return fail(I, FZ_EVERIFY, n, "bad permutation");
			sst[i] = xst[d];
		}
		gather(y->data, x->data, es, y->rank, y->shape, sst, 0);
		return FZ_OK;

	case FZ_OP_SLICE: {
		int64_t off = 0;
		if (a->n_slice != x->rank || y->rank != x->rank || !a->start || !a->end)
			return fail(I, FZ_EVERIFY, n, "start/end have %d entries for "
				    "rank %d", a->n_slice, x->rank);
		for (int d = 0; d < x->rank; d++) {
			int64_t s = a->start[d], st = a->step ? a->step[d] : 1;
			int64_t e = fz_ext_eval(a->end[d], I->syms);
			if (st < 1 || s < 0 || e < s || e > x->shape[d])
				return fail(I, FZ_ERANGE, n, "bounds [%lld, %lld) step %lld "
					    "in dim %d lie outside the extent %lld",
					    (long long)s, (long long)e, (long long)st, d,
					    (long long)x->shape[d]);
			int64_t ext = (e - s + st - 1) / st;
			if (ext != y->shape[d])
				return fail(I, FZ_EVERIFY, n, "dim %d has %lld elements; "
					    "its type says %lld", d, (long long)ext,
					    (long long)y->shape[d]);
			off += s * xst[d];
			sst[d] = st * xst[d];
		}
		gather(y->data, x->data, es, y->rank, y->shape, sst, off);
		return FZ_OK;
	}

	case FZ_OP_CAT: {
		int dim = a->dim;
		if (dim < 0 || dim >= y->rank)
			return fail(I, FZ_EVERIFY, n, "dim %d out of range", dim);
		int64_t outer = prod(y->shape, 0, dim);
		int64_t inner = prod(y->shape, dim + 1, y->rank) * (int64_t)es;
		int64_t total = 0;
		for (int k = 0; k < n->n_in; k++) {
			slot *p = S(I, n->in[k]);
			bool ok = p->rank == y->rank;
			for (int d = 0; ok && d < y->rank; d++)
				ok = d == dim || p->shape[d] == y->shape[d];
			if (!ok)
				return fail(I, FZ_EVERIFY, n, "operand %d does not fit the "
					    "result's shape", k + 1);
			total += p->shape[dim];
		}
		if (total != y->shape[dim])
			return fail(I, FZ_EVERIFY, n, "operands add up to %lld along dim "
				    "%d; the result has %lld", (long long)total, dim,
				    (long long)y->shape[dim]);
		char *o = y->data;
		for (int64_t i = 0; i < outer; i++) {
			for (int k = 0; k < n->n_in; k++) {
				slot *p = S(I, n->in[k]);
				size_t run = (size_t)(p->shape[dim] * inner);
				memcpy(o, (char *)p->data + (size_t)i * run, run);
				o += run;
			}
		}
		return FZ_OK;
	}
	default:
		return fail(I, FZ_EUNSUPPORTED, n, "not a meta op");
	}
}

/* ---- reductions ------------------------------------------------------------------ */

/* Output offset strides for an input of rank r: 0 on reduced dims, the
 * row-major strides of the kept dims otherwise (keepdim's 1s change
 * nothing in a row-major layout). */
static int64_t reduce_strides(const slot *x, const bool *red, int64_t *ost)
{
	int64_t acc = 1;
	for (int d = x->rank - 1; d >= 0; d--) {
		ost[d] = red[d] ? 0 : acc;
		if (!red[d])
			acc *= x->shape[d];
	}
	return acc; /* output element count */
}

/* Steps the multi-index idx over x in row-major order and returns the
 * output offset of the next element, given this one's offset o. */
static int64_t next_out(const slot *x, const int64_t *ost, int64_t *idx, int64_t o)
{
	for (int d = x->rank - 1; d >= 0; d--) {
		o += ost[d];
		if (++idx[d] < x->shape[d])
			return o;
		o -= ost[d] * x->shape[d];
		idx[d] = 0;
	}
	return o;
}

static fz_status run_reduction(interp *I, const fz_node *n)
{
	slot *x = S(I, n->in[0]), *y = S(I, n->out[0]);
	const fz_attrs *a = &n->attrs;
	bool red[FZ_MAX_RANK] = {0};
	int64_t ost[FZ_MAX_RANK], count = 1;
	fz_status st = FZ_OK;

	for (int i = 0; i < a->n_dims; i++) {
		int d = a->dims[i];
		if (d < 0 || d >= x->rank || red[d])
			return fail(I, FZ_EVERIFY, n, "bad reduction dim %d", d);
		red[d] = true;
		count *= x->shape[d];
	}
	int64_t m = reduce_strides(x, red, ost);
	if (m != y->numel)
		return fail(I, FZ_EVERIFY, n, "%lld results; its type says %lld",
			    (long long)m, (long long)y->numel);
	if (count == 0 && m > 0 && (n->op == FZ_OP_AMAX || n->op == FZ_OP_AMIN))
		return fail(I, FZ_ERANGE, n, "reducing an empty extent has no "
			    "identity (input has %lld elements)", (long long)x->numel);

	bool isfloat = fz_dtype_is_float(x->dtype);
	size_t mm = (size_t)(m ? m : 1);
	if (!isfloat) {
		int64_t *acc = malloc(sizeof *acc * mm);
		if (!acc)
			return oom(I, n);
		for (int64_t o = 0; o < m; o++)
			acc[o] = n->op == FZ_OP_AMAX ? INT64_MIN :
				 n->op == FZ_OP_AMIN ? INT64_MAX : 0;
		int64_t idx[FZ_MAX_RANK] = {0}, o = 0;
		for (int64_t i = 0; i < x->numel; i++, o = next_out(x, ost, idx, o)) {
			int64_t v = fz_load_i64(x->data, x->dtype, i);
			if (n->op == FZ_OP_SUM)
				acc[o] = (int64_t)((uint64_t)acc[o] + (uint64_t)v);
			else if (n->op == FZ_OP_AMAX)
				acc[o] = v > acc[o] ? v : acc[o];
			else if (n->op == FZ_OP_AMIN)
				acc[o] = v < acc[o] ? v : acc[o];
		}
		if (n->op == FZ_OP_VAR_MEAN)
			st = fail(I, FZ_EVERIFY, n, "operand has dtype %s; expected a "
				  "floating dtype", fz_dtype_name(x->dtype));
		else
			for (int64_t o = 0; o < m; o++)
				fz_store_i64(y->data, y->dtype, o, acc[o]);
		free(acc);
		return st;
	}

	double *acc = malloc(sizeof *acc * mm);
	if (!acc)
		return oom(I, n);
	for (int64_t o = 0; o < m; o++)
		acc[o] = n->op == FZ_OP_AMAX ? -INFINITY :
			 n->op == FZ_OP_AMIN ? INFINITY : 0.0;
	int64_t idx[FZ_MAX_RANK] = {0}, o = 0;
	for (int64_t i = 0; i < x->numel; i++, o = next_out(x, ost, idx, o)) {
		double v = fz_load_f64(x->data, x->dtype, i);
		if (n->op == FZ_OP_SUM || n->op == FZ_OP_VAR_MEAN)
			acc[o] += v;
		else if (isnan(acc[o]))
			;
		else if (isnan(v) || (n->op == FZ_OP_AMAX ? v > acc[o] : v < acc[o]))
			acc[o] = v;
	}
	if (n->op != FZ_OP_VAR_MEAN) {
		for (int64_t o = 0; o < m; o++)
			fz_store_f64(y->data, y->dtype, o, acc[o]);
		free(acc);
		return FZ_OK;
	}

	/* var_mean: two passes, the mean first, then squared deviations. */
	slot *mean = S(I, n->out[1]);
	double *m2 = calloc(mm, sizeof *m2);
	if (!m2) {
		free(acc);
		return oom(I, n);
	}
	for (int64_t o = 0; o < m; o++)
		acc[o] /= (double)count;
	memset(idx, 0, sizeof idx);
	o = 0;
	for (int64_t i = 0; i < x->numel; i++, o = next_out(x, ost, idx, o)) {
		double dv = fz_load_f64(x->data, x->dtype, i) - acc[o];
		m2[o] += dv * dv;
	}
	/* torch: the divisor is max(N - correction, 0); 0 gives inf or nan. */
	double div = count - a->correction > 0 ? (double)(count - a->correction) : 0.0;
	for (int64_t o = 0; o < m; o++) {
		fz_store_f64(y->data, y->dtype, o, m2[o] / div);
		fz_store_f64(mean->data, mean->dtype, o, acc[o]);
	}
	free(m2);
	free(acc);
	return FZ_OK;
}

/* ---- scans and selection ----------------------------------------------------------
 * Both work on rows: x seen as [outer, n, inner] around dim, a row being the
 * n elements at one (outer, inner), inner apart. */

static fz_status run_scan(interp *I, const fz_node *n)
{
	slot *x = S(I, n->in[0]), *y = S(I, n->out[0]);
	int dim = n->attrs.dim;
	if (dim < 0 || dim >= x->rank || x->numel != y->numel || x->dtype != y->dtype)
		return fail(I, FZ_EVERIFY, n, "result disagrees with its operand");
	int64_t outer = prod(x->shape, 0, dim), N = x->shape[dim];
	int64_t inner = prod(x->shape, dim + 1, x->rank);
	bool isfloat = fz_dtype_is_float(x->dtype);
	for (int64_t o = 0; o < outer; o++)
		for (int64_t i = 0; i < inner; i++) {
			double s = 0.0;
			uint64_t si = 0;
			for (int64_t j = 0; j < N; j++) {
				int64_t e = (o * N + j) * inner + i;
				if (isfloat) {
					s += fz_load_f64(x->data, x->dtype, e);
					fz_store_f64(y->data, y->dtype, e, s);
				} else {
					si += (uint64_t)fz_load_i64(x->data, x->dtype, e);
					fz_store_i64(y->data, y->dtype, e, (int64_t)si);
				}
			}
		}
	return FZ_OK;
}

/* The order of selection: does element (a, ia) come before (b, ib)? NaN
 * first, then larger (argmin: smaller) values, then the lower index. */
typedef struct sel_row {
	const double *f;
	const int64_t *i;
	bool least;
} sel_row;

static bool sel_before(const sel_row *r, int64_t a, int64_t b)
{
	if (r->f) {
		double x = r->f[a], y = r->f[b];
		if (isnan(x) || isnan(y))
			return isnan(x) && (!isnan(y) || a < b);
		if (x != y)
			return r->least ? x < y : x > y;
	} else if (r->i[a] != r->i[b]) {
		return r->least ? r->i[a] < r->i[b] : r->i[a] > r->i[b];
	}
	return a < b;
}

/* Merge sort of idx[0..n) in selection order (tmp: n slots of scratch). */
static void sel_sort(const sel_row *r, int64_t *idx, int64_t *tmp, int64_t n)
{
	if (n < 2)
		return;
	int64_t h = n / 2;
	sel_sort(r, idx, tmp, h);
	sel_sort(r, idx + h, tmp, n - h);
	int64_t a = 0, b = h, k = 0;
	while (a < h || b < n)
		tmp[k++] = b >= n || (a < h && !sel_before(r, idx[b], idx[a])) ?
			   idx[a++] : idx[b++];
	memcpy(idx, tmp, sizeof *idx * (size_t)n);
}

static fz_status run_select(interp *I, const fz_node *n)
{
	slot *x = S(I, n->in[0]), *y = S(I, n->out[0]);
	int dim = n->attrs.dim;
	if (dim < 0 || dim >= x->rank)
		return fail(I, FZ_EVERIFY, n, "dim %d out of range for rank %d", dim,
			    x->rank);
	int64_t outer = prod(x->shape, 0, dim), N = x->shape[dim];
	int64_t inner = prod(x->shape, dim + 1, x->rank);
	int64_t K = n->op == FZ_OP_TOPK ? n->attrs.k : 1;
	slot *yi = n->op == FZ_OP_TOPK ? S(I, n->out[1]) : y;
	if (K > N || (N == 0 && outer * inner > 0))
		return fail(I, FZ_ERANGE, n, "selecting %lld of an extent of %lld",
			    (long long)K, (long long)N);
	if (!size_is(outer, K, inner, yi->numel) || yi->dtype != FZ_I64)
		return fail(I, FZ_EVERIFY, n, "result disagrees with its type");
	bool isfloat = fz_dtype_is_float(x->dtype);
	double *f = isfloat ? malloc(sizeof *f * (size_t)(N + 1)) : NULL;
	int64_t *iv = isfloat ? NULL : malloc(sizeof *iv * (size_t)(N + 1));
	int64_t *idx = malloc(sizeof *idx * (size_t)(N + 1));
	int64_t *tmp = malloc(sizeof *tmp * (size_t)(N + 1));
	if ((!f && !iv) || !idx || !tmp) {
		free(f);
		free(iv);
		free(idx);
		free(tmp);
		return oom(I, n);
	}
	sel_row r = {f, iv, n->op == FZ_OP_ARGMIN};
	for (int64_t o = 0; o < outer; o++)
		for (int64_t i = 0; i < inner; i++) {
			for (int64_t j = 0; j < N; j++) {
				int64_t e = (o * N + j) * inner + i;
				if (isfloat)
					f[j] = fz_load_f64(x->data, x->dtype, e);
				else
					iv[j] = fz_load_i64(x->data, x->dtype, e);
				idx[j] = j;
			}
			sel_sort(&r, idx, tmp, N);
			for (int64_t j = 0; j < K; j++) {
				int64_t e = (o * K + j) * inner + i;
				fz_store_i64(yi->data, FZ_I64, e, idx[j]);
				if (n->op != FZ_OP_TOPK)
					continue;
				if (isfloat)
					fz_store_f64(y->data, y->dtype, e, f[idx[j]]);
				else
					fz_store_i64(y->data, y->dtype, e, iv[idx[j]]);
			}
		}
	free(f);
	free(iv);
	free(idx);
	free(tmp);
	return FZ_OK;
}

/* ---- indexing ---------------------------------------------------------------------- */

static fz_status check_index(interp *I, const fz_node *n, const slot *idx,
			     int64_t j, int64_t extent, int dim, int64_t *out)
{
	int64_t k = fz_load_i64(idx->data, idx->dtype, j);
	if (k < 0 || k >= extent)
		return fail(I, FZ_ERANGE, n, "index %lld (element %lld of the index "
			    "tensor) is out of range for extent %lld of dim %d",
			    (long long)k, (long long)j, (long long)extent, dim);
	*out = k;
	return FZ_OK;
}

static fz_status run_indexing(interp *I, const fz_node *n)
{
	slot *x = S(I, n->in[0]), *idx = S(I, n->in[1]), *y = S(I, n->out[0]);
	int dim = n->attrs.dim;
	size_t es = fz_dtype_size(y->dtype);
	fz_status st;

	if (idx->dtype != FZ_I32 && idx->dtype != FZ_I64)
		return fail(I, FZ_EVERIFY, n, "index has dtype %s; expected i32 or i64",
			    fz_dtype_name(idx->dtype));
	if (dim < 0 || dim >= x->rank)
		return fail(I, FZ_EVERIFY, n, "dim %d out of range for rank %d", dim,
			    x->rank);
	if (x->dtype != y->dtype)
		return fail(I, FZ_EVERIFY, n, "operand dtype %s differs from the "
			    "result's %s", fz_dtype_name(x->dtype),
			    fz_dtype_name(y->dtype));
	int64_t outer = prod(x->shape, 0, dim), E = x->shape[dim];
	int64_t inner = prod(x->shape, dim + 1, x->rank);

	if (n->op == FZ_OP_TAKE) {
		int64_t J = idx->numel;
		if (!size_is(outer, J, inner, y->numel))
			return fail(I, FZ_EVERIFY, n, "result size disagrees with its type");
		for (int64_t j = 0; j < J; j++) {
			int64_t k = 0;
			if ((st = check_index(I, n, idx, j, E, dim, &k)) != FZ_OK)
				return st;
			for (int64_t o = 0; o < outer; o++)
				memcpy((char *)y->data + (size_t)((o * J + j) * inner) * es,
				       (char *)x->data + (size_t)((o * E + k) * inner) * es,
				       (size_t)inner * es);
		}
		return FZ_OK;
	}

	if (n->op == FZ_OP_TAKE_ALONG) {
		if (idx->rank != x->rank || y->numel != idx->numel)
			return fail(I, FZ_EVERIFY, n, "index rank %d; expected %d",
				    idx->rank, x->rank);
		for (int d = 0; d < x->rank; d++)
			if (d != dim && idx->shape[d] > x->shape[d])
				return fail(I, FZ_ERANGE, n, "index extent %lld in dim %d "
					    "exceeds the operand's %lld",
					    (long long)idx->shape[d], d,
					    (long long)x->shape[d]);
		int64_t xst[FZ_MAX_RANK], ix[FZ_MAX_RANK] = {0};
		strides_of(x->rank, x->shape, xst);
		for (int64_t j = 0; j < idx->numel; j++) {
			int64_t k = 0, off = 0;
			if ((st = check_index(I, n, idx, j, E, dim, &k)) != FZ_OK)
				return st;
			for (int d = 0; d < x->rank; d++)
				off += (d == dim ? k : ix[d]) * xst[d];
			memcpy((char *)y->data + (size_t)j * es,
			       (char *)x->data + (size_t)off * es, es);
			for (int d = idx->rank - 1; d >= 0; d--) {
				if (++ix[d] < idx->shape[d])
					break;
				ix[d] = 0;
			}
		}
		return FZ_OK;
	}

	/* index_add: result = x; result[.., idx[j], ..] += src[.., j, ..],
	 * accumulated in f64 (int64) and rounded once. */
	slot *src = S(I, n->in[2]);
	int64_t J = idx->numel;
	bool ok = idx->rank == 1 && src->rank == x->rank && y->numel == x->numel;
	for (int d = 0; ok && d < x->rank; d++)
		ok = src->shape[d] == (d == dim ? J : x->shape[d]);
	if (!ok)
		return fail(I, FZ_EVERIFY, n, "source shape does not match the "
			    "operand and the index");
	for (int64_t j = 0; j < J; j++) { /* all indices first: no partial work */
		int64_t k = 0;
		if ((st = check_index(I, n, idx, j, E, dim, &k)) != FZ_OK)
			return st;
	}
	if (fz_dtype_is_float(x->dtype)) {
		double *acc = load_all_f64(x);
		if (!acc)
			return oom(I, n);
		for (int64_t j = 0; j < J; j++) {
			int64_t k = fz_load_i64(idx->data, idx->dtype, j);
			for (int64_t o = 0; o < outer; o++)
				for (int64_t r = 0; r < inner; r++)
					acc[(o * E + k) * inner + r] +=
						fz_load_f64(src->data, src->dtype,
							    (o * J + j) * inner + r);
		}
		for (int64_t i = 0; i < y->numel; i++)
			fz_store_f64(y->data, y->dtype, i, acc[i]);
		free(acc);
	} else {
		int64_t *acc = load_all_i64(x);
		if (!acc)
			return oom(I, n);
		for (int64_t j = 0; j < J; j++) {
			int64_t k = fz_load_i64(idx->data, idx->dtype, j);
			for (int64_t o = 0; o < outer; o++)
				for (int64_t r = 0; r < inner; r++) {
					int64_t *p = &acc[(o * E + k) * inner + r];
					*p = (int64_t)((uint64_t)*p +
						       (uint64_t)fz_load_i64(src->data,
							src->dtype, (o * J + j) * inner + r));
				}
		}
		for (int64_t i = 0; i < y->numel; i++)
			fz_store_i64(y->data, y->dtype, i, acc[i]);
		free(acc);
	}
	return FZ_OK;
}

/* ---- library: matmul and linear ------------------------------------------------------ */

/* C[M,N] = A[M,K] B[K,N], all contiguous, in f64 (or wrapping int64). The
 * i-k-j order streams rows of B and C through an inner loop the compiler
 * vectorizes (restrict: no aliasing to test for); blocks of MM_KB rows of
 * B, MM_JB columns wide (256 KB), stay in L2 while every row of A runs over
 * them. Each element's terms are added in order of k whatever the blocks,
 * so the sums are those of the plain triple loop, bit for bit. */
enum { MM_KB = 64, MM_JB = 512 };

void fz_matmul_f64(const double *restrict A, const double *restrict B,
		   double *restrict C, int64_t M, int64_t K, int64_t N)
{
	memset(C, 0, sizeof *C * (size_t)(M * N));
	for (int64_t j0 = 0; j0 < N; j0 += MM_JB) {
		int64_t nj = N - j0 < MM_JB ? N - j0 : MM_JB;
		for (int64_t k0 = 0; k0 < K; k0 += MM_KB) {
			int64_t k1 = k0 + MM_KB < K ? k0 + MM_KB : K;
			for (int64_t i = 0; i < M; i++) {
				double *restrict c = C + i * N + j0;
				for (int64_t k = k0; k < k1; k++) {
					double aik = A[i * K + k];
					const double *restrict b = B + k * N + j0;
					for (int64_t j = 0; j < nj; j++)
						c[j] += aik * b[j];
				}
			}
		}
	}
}

static void mm_i64(const int64_t *A, const int64_t *B, int64_t *C, int64_t M,
		   int64_t K, int64_t N)
{
	memset(C, 0, sizeof *C * (size_t)(M * N));
	for (int64_t i = 0; i < M; i++)
		for (int64_t k = 0; k < K; k++) {
			uint64_t aik = (uint64_t)A[i * K + k];
			for (int64_t j = 0; j < N; j++)
				C[i * N + j] = (int64_t)((uint64_t)C[i * N + j] +
							 aik * (uint64_t)B[k * N + j]);
		}
}

static fz_status run_matmul(interp *I, const fz_node *n)
{
	slot *a = S(I, n->in[0]), *b = S(I, n->in[1]), *y = S(I, n->out[0]);
	if (a->rank == 0 || b->rank == 0)
		return fail(I, FZ_EVERIFY, n, "a rank-0 operand");
	int64_t M = a->rank >= 2 ? a->shape[a->rank - 2] : 1;
	int64_t K = a->shape[a->rank - 1];
	int64_t K2 = b->rank >= 2 ? b->shape[b->rank - 2] : b->shape[0];
	int64_t N = b->rank >= 2 ? b->shape[b->rank - 1] : 1;
	if (K != K2)
		return fail(I, FZ_EVERIFY, n, "contracted extents %lld and %lld differ",
			    (long long)K, (long long)K2);

	/* Batch dims, aligned from the right; stride 0 where one side is 1. */
	int ab = a->rank > 2 ? a->rank - 2 : 0, bb = b->rank > 2 ? b->rank - 2 : 0;
	int nb = ab > bb ? ab : bb;
	int64_t bshape[FZ_MAX_RANK], ast[FZ_MAX_RANK], bst[FZ_MAX_RANK];
	int64_t as = M * K, bs = K * N;
	for (int i = nb - 1; i >= 0; i--) {
		int ia = i - (nb - ab), ib = i - (nb - bb);
		int64_t ea = ia >= 0 ? a->shape[ia] : 1, eb = ib >= 0 ? b->shape[ib] : 1;
		if (ea != eb && ea != 1 && eb != 1)
			return fail(I, FZ_EVERIFY, n, "batch extents %lld and %lld do "
				    "not broadcast", (long long)ea, (long long)eb);
		bshape[i] = ea == 1 ? eb : ea;
		ast[i] = ea == 1 ? 0 : as;
		bst[i] = eb == 1 ? 0 : bs;
		as *= ea;
		bs *= eb;
	}
	int64_t batches = 1;
	for (int d = 0; d < nb; d++)
		if (__builtin_mul_overflow(batches, bshape[d], &batches))
			return fail(I, FZ_EVERIFY, n, "batch size overflows");
	if (!size_is(batches, M, N, y->numel))
		return fail(I, FZ_EVERIFY, n, "result size disagrees with its type");

	bool isfloat = fz_dtype_is_float(y->dtype);
	size_t cells = M * N > 0 ? (size_t)(M * N) : 1;
	void *A = isfloat ? (void *)load_all_f64(a) : (void *)load_all_i64(a);
	void *B = isfloat ? (void *)load_all_f64(b) : (void *)load_all_i64(b);
	void *C = malloc(8 * cells);
	if (!A || !B || !C) {
		free(A);
		free(B);
		free(C);
		return oom(I, n);
	}
	int64_t bi[FZ_MAX_RANK] = {0};
	for (int64_t t = 0; t < batches; t++) {
		int64_t ao = 0, bo = 0;
		for (int d = 0; d < nb; d++) {
			ao += bi[d] * ast[d];
			bo += bi[d] * bst[d];
		}
		if (isfloat) {
			fz_matmul_f64((double *)A + ao, (double *)B + bo, C, M, K, N);
			for (int64_t i = 0; i < M * N; i++)
				fz_store_f64(y->data, y->dtype, t * M * N + i, ((double *)C)[i]);
		} else {
			mm_i64((int64_t *)A + ao, (int64_t *)B + bo, C, M, K, N);
			for (int64_t i = 0; i < M * N; i++)
				fz_store_i64(y->data, y->dtype, t * M * N + i, ((int64_t *)C)[i]);
		}
		for (int d = nb - 1; d >= 0; d--) {
			if (++bi[d] < bshape[d])
				break;
			bi[d] = 0;
		}
	}
	free(A);
	free(B);
	free(C);
	return FZ_OK;
}

/* linear(x, w, b?) = x wᵀ + b with w [out, in]: x's leading dims flatten to
 * R rows, wᵀ is formed once, and the product goes through mm_*, so it
 * accumulates exactly like matmul. */
static fz_status run_linear(interp *I, const fz_node *n)
{
	slot *x = S(I, n->in[0]), *w = S(I, n->in[1]), *y = S(I, n->out[0]);
	slot *bias = n->n_in == 3 ? S(I, n->in[2]) : NULL;
	if (x->rank < 1 || w->rank != 2)
		return fail(I, FZ_EVERIFY, n, "expected x of rank >= 1 and w [out, in]");
	int64_t K = x->shape[x->rank - 1], O = w->shape[0];
	int64_t R = prod(x->shape, 0, x->rank - 1);
	if (w->shape[1] != K || !size_is(R, O, 1, y->numel) ||
	    (bias && bias->numel != O))
		return fail(I, FZ_EVERIFY, n, "operand shapes disagree");

	bool isfloat = fz_dtype_is_float(y->dtype);
	size_t ok = O * K > 0 ? (size_t)(O * K) : 1;
	size_t ro = R * O > 0 ? (size_t)(R * O) : 1;
	void *X = isfloat ? (void *)load_all_f64(x) : (void *)load_all_i64(x);
	void *Bv = !bias ? NULL : isfloat ? (void *)load_all_f64(bias)
					  : (void *)load_all_i64(bias);
	void *WT = malloc(8 * ok), *C = malloc(8 * ro);
	if (!X || !WT || !C || (bias && !Bv)) {
		free(X);
		free(Bv);
		free(WT);
		free(C);
		return oom(I, n);
	}
	for (int64_t o = 0; o < O; o++)
		for (int64_t k = 0; k < K; k++) {
			if (isfloat)
				((double *)WT)[k * O + o] = fz_load_f64(w->data, w->dtype, o * K + k);
			else
				((int64_t *)WT)[k * O + o] = fz_load_i64(w->data, w->dtype, o * K + k);
		}
	if (isfloat) {
		double *c = C, *b = Bv;
		fz_matmul_f64(X, WT, c, R, K, O);
		for (int64_t i = 0; i < R * O; i++)
			fz_store_f64(y->data, y->dtype, i, b ? c[i] + b[i % O] : c[i]);
	} else {
		int64_t *c = C, *b = Bv;
		mm_i64(X, WT, c, R, K, O);
		for (int64_t i = 0; i < R * O; i++)
			fz_store_i64(y->data, y->dtype, i, b ? (int64_t)((uint64_t)c[i] +
						(uint64_t)b[i % O]) : c[i]);
	}
	free(X);
	free(Bv);
	free(WT);
	free(C);
	return FZ_OK;
}

/* attention, attention_dq, attention_dkv (ops.def) in f64, one query row
 * at a time over the keys it may see: the scores of the row are formed
 * whole, so the oracle has no blocks and no online softmax to get wrong.
 * The backward uses the lse and o it is given, as its definition says:
 * p = exp(s - lse), di = rowsum(do o), ds = p (do.v - di).
 *
 * It is the oracle at T = 4097 too, so it does no work it can prove away
 * and it uses the CPUs, without changing a single value:
 *   - the band. A causal mask or a window hides every key outside
 *     [lo, hi) of query i (attn_band); a hidden key's terms are
 *     exp(-inf) = 0 in every sum, so they are not formed at all.
 *   - dot products, key by key, each summed over e in order, as
 *     q_i . k_j is written; but ATTN_JB keys at once, from K and V
 *     transposed to [D][Tk], so the compiler may use vector lanes
 *     across keys, never across e (no reassociation).
 *   - parts: the forward and dq over (batch, query head, block of
 *     rows), dk and dv over (batch, kv head, block of keys), on a pool
 *     of $FUSEC_THREADS (else every CPU) threads. Each output element
 *     belongs to one part and is summed in the order one thread would
 *     sum it: a key's dk, dv over the query heads of its group, then
 *     rows, ascending. The result does not depend on the thread count. */
#define ATTN_JB 8    /* keys per dot-product group */
#define ATTN_BLK 64  /* rows (keys for dk, dv) per part, at least */

typedef struct attn_shape {
	int64_t batch, hq, hkv, tq, tk, d, dv, group;
	int64_t mst[4];      /* the mask's strides over (batch, h, i, j) */
	int64_t mb[FZ_MAX_RANK]; /* per batch dim of the scores: mask stride */
	int nb;
	const int64_t *bshape;
} attn_shape;

/* The mask's offset of (bt, h, i, 0). */
static int64_t attn_mask_row(const attn_shape *A, int64_t bt, int64_t h, int64_t i)
{
	int64_t off = h * A->mst[1] + i * A->mst[2];
	for (int d = A->nb - 1; d >= 0; d--) {
		off += bt % A->bshape[d] * A->mb[d];
		bt /= A->bshape[d];
	}
	return off;
}

/* The keys [lo, hi) of query i that causal and window leave visible. */
static void attn_band(const fz_attrs *a, int64_t tk, int64_t i, int64_t *lo,
		      int64_t *hi)
{
	int64_t l = 0, h = tk;
	if (a->causal && i + 1 < h)
		h = i + 1;
	if (a->window > 0) {
		if (i >= a->window)
			l = i - a->window + 1;
		if (!a->causal && a->window < tk - i)
			h = i + a->window;
	}
	*lo = l < h ? l : h;
	*hi = h;
}

/* The logit of raw product x (mask at offset mo), and d logit / dx; false
 * when the key is hidden. */
static bool attn_logit(const fz_attrs *a, const slot *m, int64_t mo, double x,
		       double *logit, double *dx)
{
	double s = a->scale * x, g = a->scale;
	if (a->softcap > 0) {
		double th = tanh(s / a->softcap);
		s = a->softcap * th;
		g *= 1 - th * th;
	}
	if (m) {
		double mv = fz_load_f64(m->data, m->dtype, mo);
		if (m->dtype == FZ_BOOL) {
			if (mv == 0)
				return false;
		} else {
			s += mv;
		}
	}
	*logit = s;
	*dx = g;
	return s > -INFINITY;
}

typedef struct attn_job {
	const fz_node *n;
	const attn_shape *A;
	const slot *m;
	slot *o, *lse;          /* the forward's outputs */
	const double *q, *k, *v, *O, *dO, *L, *Di;
	const double *kT, *vT;  /* [batch * hkv][D][tkp], zero past tk */
	double *g0, *g1;        /* dq, or dk and dv */
	int64_t tkp;            /* kT's and vT's rows */
	int64_t blk, nblk;      /* rows (keys) per part; parts per head */
	int64_t part0;          /* the first part of this run of the pool */
	atomic_bool oom;
} attn_job;

/* dot[j - j0] = x . t[e][j] summed over e in order, for the ATTN_JB keys
 * from j0 (t: a transposed [n][tkp] matrix). */
static void attn_dots(const double *x, const double *t, int64_t n, int64_t tkp,
		      int64_t j0, double *dot)
{
	double acc[ATTN_JB] = {0};
	for (int64_t e = 0; e < n; e++) {
		double xe = x[e];
		const double *r = t + e * tkp + j0;
		for (int jj = 0; jj < ATTN_JB; jj++)
			acc[jj] += xe * r[jj];
	}
	memcpy(dot, acc, sizeof acc);
}

/* s[j], dx[j] for the keys [lo, hi) of query row (bt, h, i); s[j] is -inf
 * where the key is hidden. */
static void attn_scores(const attn_job *J, int64_t bt, int64_t h, int64_t i,
			int64_t lo, int64_t hi, double *s, double *dx)
{
	const attn_shape *A = J->A;
	const fz_attrs *a = &J->n->attrs;
	const double *qi = J->q + ((bt * A->hq + h) * A->tq + i) * A->d;
	const double *kt = J->kT + (bt * A->hkv + h / A->group) * A->d * J->tkp;
	int64_t mo = J->m ? attn_mask_row(A, bt, h, i) : 0;
	for (int64_t j0 = lo; j0 < hi; j0 += ATTN_JB) {
		double x[ATTN_JB];
		attn_dots(qi, kt, A->d, J->tkp, j0, x);
		for (int64_t j = j0; j < hi && j < j0 + ATTN_JB; j++)
			if (!attn_logit(a, J->m, mo + j * A->mst[3], x[j - j0], &s[j], &dx[j]))
				s[j] = -INFINITY;
	}
}

static double *attn_scratch(attn_job *J, int64_t n)
{
	double *p = malloc(sizeof(double) * (size_t)n);
	if (!p)
		atomic_store(&J->oom, true);
	return p;
}

/* o and lse of the rows of one block. */
static void attn_fwd_part(void *arg, int part, int nparts)
{
	(void)nparts;
	attn_job *J = arg;
	const attn_shape *A = J->A;
	int64_t pt = J->part0 + part, head = pt / J->nblk, bt = head / A->hq, h = head % A->hq;
	int64_t i0 = pt % J->nblk * J->blk, i1 = i0 + J->blk < A->tq ? i0 + J->blk : A->tq;
	const double *vb = J->v + (bt * A->hkv + h / A->group) * A->tk * A->dv;
	double *s = attn_scratch(J, 2 * J->tkp + A->dv);
	if (!s)
		return;
	double *dx = s + J->tkp, *acc = dx + J->tkp;
	for (int64_t i = i0; i < i1; i++) {
		int64_t row = head * A->tq + i, lo, hi;
		attn_band(&J->n->attrs, A->tk, i, &lo, &hi);
		attn_scores(J, bt, h, i, lo, hi, s, dx);
		double mx = -INFINITY, sum = 0, lse = -INFINITY;
		for (int64_t j = lo; j < hi; j++)
			if (s[j] > mx)
				mx = s[j];
		if (mx > -INFINITY) {
			for (int64_t j = lo; j < hi; j++)
				sum += exp(s[j] - mx);
			lse = mx + log(sum);
		}
		for (int64_t e = 0; e < A->dv; e++)
			acc[e] = 0;
		for (int64_t j = lo; j < hi; j++) {
			if (s[j] == -INFINITY)
				continue;
			double p = exp(s[j] - lse);
			for (int64_t e = 0; e < A->dv; e++)
				acc[e] += p * vb[j * A->dv + e];
		}
		for (int64_t e = 0; e < A->dv; e++)
			fz_store_f64(J->o->data, J->o->dtype, row * A->dv + e, acc[e]);
		fz_store_f64(J->lse->data, J->lse->dtype, row, lse);
	}
	free(s);
}

/* The backward of query row (bt, h, i) over its keys in [k0, k1): dq's
 * row, or the keys' dk and dv rows. */
static void attn_bwd_row(attn_job *J, int64_t bt, int64_t h, int64_t i,
			 int64_t k0, int64_t k1, double *s, double *dx)
{
	const attn_shape *A = J->A;
	int64_t row = (bt * A->hq + h) * A->tq + i, lo, hi;
	int64_t kvh = bt * A->hkv + h / A->group;
	double lse = J->L[row], di = J->Di[row];
	attn_band(&J->n->attrs, A->tk, i, &lo, &hi);
	lo = lo > k0 ? lo : k0;
	hi = hi < k1 ? hi : k1;
	if (lo >= hi || lse == -INFINITY)
		return;
	attn_scores(J, bt, h, i, lo, hi, s, dx);
	const double *doi = J->dO + row * A->dv, *qi = J->q + row * A->d;
	const double *kb = J->k + kvh * A->tk * A->d;
	const double *vt = J->vT + kvh * A->dv * J->tkp;
	bool dq = J->n->op == FZ_OP_ATTENTION_DQ;
	for (int64_t j0 = lo; j0 < hi; j0 += ATTN_JB) {
		double dp[ATTN_JB];
		attn_dots(doi, vt, A->dv, J->tkp, j0, dp);
		for (int64_t j = j0; j < hi && j < j0 + ATTN_JB; j++) {
			if (s[j] == -INFINITY)
				continue;
			double p = exp(s[j] - lse);
			double ds = p * (dp[j - j0] - di) * dx[j];
			int64_t kr = kvh * A->tk + j;
			if (dq) {
				for (int64_t e = 0; e < A->d; e++)
					J->g0[row * A->d + e] += ds * kb[j * A->d + e];
				continue;
			}
			for (int64_t e = 0; e < A->d; e++)
				J->g0[kr * A->d + e] += ds * qi[e];
			for (int64_t e = 0; e < A->dv; e++)
				J->g1[kr * A->dv + e] += p * doi[e];
		}
	}
}

/* dq: the rows of one block of one query head. dk, dv: the keys of one
 * block of one kv head, over the rows of every query head that shares it. */
static void attn_bwd_part(void *arg, int part, int nparts)
{
	(void)nparts;
	attn_job *J = arg;
	const attn_shape *A = J->A;
	int64_t pt = J->part0 + part, head = pt / J->nblk, b0 = pt % J->nblk * J->blk;
	double *s = attn_scratch(J, 2 * J->tkp);
	if (!s)
		return;
	if (J->n->op == FZ_OP_ATTENTION_DQ) {
		int64_t bt = head / A->hq, h = head % A->hq;
		for (int64_t i = b0; i < b0 + J->blk && i < A->tq; i++)
			attn_bwd_row(J, bt, h, i, 0, A->tk, s, s + J->tkp);
	} else {
		int64_t bt = head / A->hkv, hk = head % A->hkv;
		for (int64_t h = hk * A->group; h < (hk + 1) * A->group; h++)
			for (int64_t i = 0; i < A->tq; i++)
				attn_bwd_row(J, bt, h, i, b0, b0 + J->blk, s, s + J->tkp);
	}
	free(s);
}

/* x [heads][t][n] -> [heads][n][tkp], zero past t. */
static double *attn_transpose(const double *x, int64_t heads, int64_t t, int64_t n,
			      int64_t tkp)
{
	double *y = calloc((size_t)(heads * n * tkp + 1), sizeof *y);
	if (y)
		for (int64_t hd = 0; hd < heads; hd++)
			for (int64_t j = 0; j < t; j++)
				for (int64_t e = 0; e < n; e++)
					y[(hd * n + e) * tkp + j] = x[(hd * t + j) * n + e];
	return y;
}

/* Cuts `heads` heads of t rows (keys) each into parts and runs them: on
 * a pool when there is enough work to share. */
static void attn_run_parts(attn_job *J, int64_t heads, int64_t t, int64_t work,
			   fz_pool_fn fn)
{
	J->blk = ATTN_BLK;
	while ((t + J->blk - 1) / J->blk > (1 << 20) / (heads > 0 ? heads : 1) &&
	       J->blk < t)
		J->blk *= 2;
	J->nblk = (t + J->blk - 1) / J->blk;
	int64_t nparts = heads * J->nblk;
	const char *env = getenv("FUSEC_THREADS");
	int threads = env && atoi(env) > 0 ? atoi(env) : fz_cpu_count();
	fz_pool *pool = NULL;
	if (threads > 1 && nparts > 1 && work >= (int64_t)1 << 22 &&
	    fz_pool_new(threads, &pool, NULL) != FZ_OK)
		pool = NULL; /* no threads to be had: run here */
	for (J->part0 = 0; J->part0 < nparts; J->part0 += INT_MAX)
		fz_pool_run(pool, (int)(nparts - J->part0 < INT_MAX ? nparts - J->part0 : INT_MAX),
			    fn, J);
	fz_pool_free(pool);
}

static fz_status run_attention(interp *I, const fz_node *n)
{
	bool fwd = n->op == FZ_OP_ATTENTION;
	const slot *q = S(I, n->in[0]), *k = S(I, n->in[1]), *v = S(I, n->in[2]);
	int nm = fwd ? 3 : 6;
	const slot *m = n->n_in > nm ? S(I, n->in[nm]) : NULL;
	int r = q->rank;
	attn_shape A = {0};
	A.nb = r - 3;
	A.bshape = q->shape;
	A.batch = prod(q->shape, 0, r - 3);
	A.hq = q->shape[r - 3];
	A.tq = q->shape[r - 2];
	A.d = q->shape[r - 1];
	A.hkv = k->shape[r - 3];
	A.tk = k->shape[r - 2];
	A.dv = v->shape[r - 1];
	if (A.hkv <= 0 || A.hq % A.hkv || k->shape[r - 1] != A.d)
		return fail(I, FZ_EVERIFY, n, "q, k and v disagree at these sizes");
	A.group = A.hq / A.hkv;
	if (m) {
		int64_t st = 1;
		for (int d = m->rank - 1; d >= 0; d--) {
			int sd = r - m->rank + d; /* the scores' dim */
			int64_t want = sd == r - 1 ? A.tk : q->shape[sd];
			if (m->shape[d] != 1 && m->shape[d] != want)
				return fail(I, FZ_EVERIFY, n, "the mask does not broadcast "
					    "at these sizes");
			int64_t x = m->shape[d] == 1 ? 0 : st;
			if (sd >= r - 3)
				A.mst[sd - (r - 3) + 1] = x;
			else
				A.mb[sd] = x;
			st *= m->shape[d];
		}
	}
	attn_job J = {.n = n, .A = &A, .m = m};
	atomic_init(&J.oom, false);
	/* room for the last group of ATTN_JB keys from any j0 < tk */
	J.tkp = (A.tk + 2 * ATTN_JB - 1) / ATTN_JB * ATTN_JB;
	double *qv = load_all_f64(q), *kv = load_all_f64(k), *vv = load_all_f64(v);
	double *kT = NULL, *vT = NULL, *O = NULL, *L = NULL, *dO = NULL;
	double *Di = NULL, *g0 = NULL, *g1 = NULL;
	fz_status st = FZ_OK;
	if (qv && kv)
		kT = attn_transpose(kv, A.batch * A.hkv, A.tk, A.d, J.tkp);
	if (!fwd) {
		O = load_all_f64(S(I, n->in[3]));
		L = load_all_f64(S(I, n->in[4]));
		dO = load_all_f64(S(I, n->in[5]));
		Di = malloc(sizeof(double) * (size_t)(A.batch * A.hq * A.tq + 1));
		if (vv)
			vT = attn_transpose(vv, A.batch * A.hkv, A.tk, A.dv, J.tkp);
		/* dq, or dk and dv, summed in f64 */
		g0 = calloc((size_t)(n->op == FZ_OP_ATTENTION_DQ ? q->numel : k->numel) + 1,
			    sizeof(double));
		g1 = calloc((size_t)v->numel + 1, sizeof(double));
	}
	if (!qv || !kv || !vv || !kT ||
	    (!fwd && (!O || !L || !dO || !Di || !vT || !g0 || !g1))) {
		st = oom(I, n);
		goto done;
	}
	J.q = qv, J.k = kv, J.v = vv, J.kT = kT, J.vT = vT;
	J.O = O, J.L = L, J.dO = dO, J.Di = Di, J.g0 = g0, J.g1 = g1;
	int64_t work = A.batch * A.hq * A.tq * A.tk * (A.d + A.dv);
	if (fwd) {
		J.o = S(I, n->out[0]);
		J.lse = S(I, n->out[1]);
		attn_run_parts(&J, A.batch * A.hq, A.tq, work, attn_fwd_part);
	} else {
		for (int64_t row = 0; row < A.batch * A.hq * A.tq; row++) {
			double di = 0;
			for (int64_t e = 0; e < A.dv; e++)
				di += dO[row * A.dv + e] * O[row * A.dv + e];
			Di[row] = di;
		}
		bool dq = n->op == FZ_OP_ATTENTION_DQ;
		attn_run_parts(&J, A.batch * (dq ? A.hq : A.hkv), dq ? A.tq : A.tk, work,
			       attn_bwd_part);
	}
	if (atomic_load(&J.oom)) {
		st = oom(I, n);
		goto done;
	}
	if (!fwd) {
		slot *y0 = S(I, n->out[0]);
		for (int64_t e = 0; e < y0->numel; e++)
			fz_store_f64(y0->data, y0->dtype, e, g0[e]);
		if (n->op == FZ_OP_ATTENTION_DKV) {
			slot *y1 = S(I, n->out[1]);
			for (int64_t e = 0; e < y1->numel; e++)
				fz_store_f64(y1->data, y1->dtype, e, g1[e]);
		}
	}
done:
	free(qv);
	free(kv);
	free(vv);
	free(kT);
	free(vT);
	free(O);
	free(L);
	free(dO);
	free(Di);
	free(g0);
	free(g1);
	return st;
}

/* ---- the walk -------------------------------------------------------------------------- */

static fz_status run_node(interp *I, const fz_node *n)
{
	switch (fz_ops[n->op].cls) {
	case FZ_CLASS_UNARY: return run_unary(I, n);
	case FZ_CLASS_BINARY: return run_binary(I, n);
	case FZ_CLASS_TERNARY: return run_where(I, n);
	case FZ_CLASS_CREATION: return run_creation(I, n);
	case FZ_CLASS_META: return run_meta(I, n);
	case FZ_CLASS_REDUCTION: return run_reduction(I, n);
	case FZ_CLASS_INDEXING: return run_indexing(I, n);
	case FZ_CLASS_SCAN: return run_scan(I, n);
	case FZ_CLASS_SELECT: return run_select(I, n);
	case FZ_CLASS_ATTENTION: return run_attention(I, n);
	case FZ_CLASS_LIBRARY:
		return n->op == FZ_OP_MATMUL ? run_matmul(I, n) : run_linear(I, n);
	case FZ_CLASS_WAIT: {
		slot *x = S(I, n->in[0]), *y = S(I, n->out[0]);
		if (x->numel != y->numel || x->dtype != y->dtype)
			return fail(I, FZ_EVERIFY, n, "result disagrees with its type");
		memcpy(y->data, x->data, (size_t)y->numel * fz_dtype_size(y->dtype));
		return FZ_OK;
	}
	default:
		return fail(I, FZ_EUNSUPPORTED, n, "the interpreter does not run "
			    "%s ops", fz_class_names[fz_ops[n->op].cls]);
	}
}

/* Drops a value's buffer once its last reader has run. */
static void release_use(slot *s)
{
	if (--s->uses <= 0 && !s->output) {
		free(s->data);
		s->data = NULL;
	}
}

static fz_status copy_in(interp *I, const fz_tensor *x, slot *s, int i)
{
	if (s->numel > 0 && !x->data) {
		set_err(I->err, "input %d has no data", i);
		return FZ_EINVAL;
	}
	s->data = malloc(nbytes(s));
	if (!s->data) {
		set_err(I->err, "out of memory copying input %d", i);
		return FZ_ENOMEM;
	}
	if (s->numel > 0)
		gather(s->data, x->data, fz_dtype_size(s->dtype), s->rank, s->shape,
		       x->strides, 0);
	return FZ_OK;
}

/* One rank's state: its slots, set up from its inputs. */
static fz_status rank_setup(interp *I, const fz_trace *t, const int64_t *syms,
			    const fz_tensor *inputs, char **err)
{
	I->t = t;
	I->syms = syms;
	I->err = err;
	I->slots = calloc((size_t)(t->n_values ? t->n_values : 1), sizeof(slot));
	if (!I->slots) {
		set_err(err, "out of memory");
		return FZ_ENOMEM;
	}
	for (int v = 0; v < t->n_values; v++) {
		const fz_value *val = t->values[v];
		slot *s = &I->slots[v];
		s->dtype = val->type.dtype;
		s->rank = val->type.rank;
		for (int d = 0; d < s->rank; d++)
			s->shape[d] = fz_ext_eval(val->type.dims[d], syms);
		s->numel = type_numel(&val->type, syms); /* >= 0: bind checked */
	}
	for (int k = 0; k < t->n_nodes; k++)
		for (int i = 0; (!I->live || I->live[k]) && i < t->nodes[k]->n_in; i++)
			I->slots[t->nodes[k]->in[i]->id].uses++;
	for (int k = 0; k < t->n_outputs; k++)
		I->slots[t->outputs[k]->id].output = true;
	fz_status st = FZ_OK;
	for (int i = 0; i < t->n_params && st == FZ_OK; i++) {
		slot *s = S(I, t->params[i]);
		if (s->uses > 0 || s->output)
			st = copy_in(I, &inputs[i], s, i);
	}
	return st;
}

static void rank_free(interp *I)
{
	for (int v = 0; I->slots && v < I->t->n_values; v++)
		free(I->slots[v].data);
	free(I->slots);
	I->slots = NULL;
}

static fz_status alloc_outputs(interp *I, const fz_node *n)
{
	for (int j = 0; j < n->n_out; j++) {
		slot *y = S(I, n->out[j]);
		y->data = malloc(nbytes(y));
		if (!y->data)
			return oom(I, n);
	}
	return FZ_OK;
}

static void release_after(interp *I, const fz_node *n)
{
	for (int i = 0; i < n->n_in; i++)
		release_use(S(I, n->in[i]));
	for (int j = 0; j < n->n_out; j++) {
		slot *y = S(I, n->out[j]);
		if (y->uses == 0 && !y->output) {
			free(y->data);
			y->data = NULL;
		}
	}
}

/* Hands rank I's outputs over; a value returned twice gets a second copy. */
static fz_status rank_outputs(interp *I, fz_tensor *outputs)
{
	const fz_trace *t = I->t;
	char **err = I->err;
	fz_status st = FZ_OK;
	size_t no = (size_t)(t->n_outputs ? t->n_outputs : 1);
	void **out_data = calloc(no, sizeof *out_data);
	bool *copied = calloc(no, sizeof *copied);
	if (!out_data || !copied) {
		set_err(err, "out of memory");
		st = FZ_ENOMEM;
	}
	for (int k = 0; k < t->n_outputs && st == FZ_OK; k++) {
		slot *s = S(I, t->outputs[k]);
		for (int j = 0; j < k; j++)
			copied[k] |= t->outputs[j] == t->outputs[k];
		if (!copied[k]) {
			out_data[k] = s->data;
			continue;
		}
		out_data[k] = malloc(nbytes(s));
		if (!out_data[k]) {
			set_err(err, "out of memory copying output %d", k);
			st = FZ_ENOMEM;
			break;
		}
		memcpy(out_data[k], s->data, nbytes(s));
	}
	if (st == FZ_OK) {
		for (int k = 0; k < t->n_outputs; k++) {
			slot *s = S(I, t->outputs[k]);
			fz_tensor *o = &outputs[k];
			memset(o, 0, sizeof *o);
			o->data = out_data[k];
			o->dtype = s->dtype;
			o->rank = s->rank;
			memcpy(o->shape, s->shape, sizeof(int64_t) * (size_t)s->rank);
			strides_of(s->rank, s->shape, o->strides);
		}
		for (int k = 0; k < t->n_outputs; k++)
			S(I, t->outputs[k])->data = NULL; /* now the caller's */
	} else if (out_data) {
		for (int k = 0; k < t->n_outputs; k++)
			if (copied[k])
				free(out_data[k]);
	}
	free(out_data);
	free(copied);
	return st;
}

/* A collective across the ranks in lockstep: every rank's operand is there. */
static fz_status run_collective(interp *R, int world, const fz_node *n)
{
	const void *xs_small[8];
	const void **xs = world <= 8 ? xs_small : malloc(sizeof(void *) * (size_t)world);
	if (!xs)
		return oom(&R[0], n);
	slot *x0 = S(&R[0], n->in[0]);
	for (int r = 0; r < world; r++)
		xs[r] = S(&R[r], n->in[0])->data;
	fz_status st = FZ_OK;
	for (int r = 0; r < world && st == FZ_OK; r++) {
		st = fz_collective_eval(n->op, x0->dtype, x0->rank, x0->shape,
					n->attrs.dim, world, r, xs,
					S(&R[r], n->out[0])->data);
		if (st != FZ_OK)
			st = fail(&R[r], st, n, "operand disagrees with the world size");
	}
	if (xs != xs_small)
		free((void *)xs);
	return st;
}

fz_status fz_trace_interpret_world(const fz_trace *t, const int64_t *sym_sizes,
				   int world, const fz_tensor *inputs, int n_in,
				   fz_tensor *outputs, int n_out, char **err)
{
	if (err)
		*err = NULL;
	if (!t) {
		set_err(err, "fz_trace_interpret: trace is NULL");
		return FZ_EINVAL;
	}
	if (world < 1 || world != t->world) {
		set_err(err, "trace '%s' is written for world %d; %d rank%s given",
			t->name, t->world, world, world == 1 ? "" : "s");
		return FZ_EINVAL;
	}
	if (n_out != t->n_outputs || (n_out > 0 && !outputs)) {
		set_err(err, "trace '%s' returns %d value%s; %d output slot%s given",
			t->name, t->n_outputs, t->n_outputs == 1 ? "" : "s", n_out,
			n_out == 1 ? "" : "s");
		return FZ_EINVAL;
	}
	int64_t syms[FZ_MAX_SYMS], rs[FZ_MAX_SYMS];
	for (int s = 0; s < t->n_syms; s++)
		syms[s] = sym_sizes ? sym_sizes[s] : -1;
	fz_status st = bind_into(t, inputs, n_in, syms, err);
	for (int r = 1; r < world && st == FZ_OK; r++) {
		for (int s = 0; s < t->n_syms; s++)
			rs[s] = sym_sizes ? sym_sizes[s] : -1;
		st = bind_into(t, inputs + (size_t)r * (size_t)n_in, n_in, rs, err);
		for (int s = 0; s < t->n_syms && st == FZ_OK; s++)
			if (rs[s] != syms[s]) {
				set_err(err, "rank %d binds %s = %lld; rank 0 binds %lld: every "
					"rank runs the same shapes", r, t->syms[s],
					(long long)rs[s], (long long)syms[s]);
				st = FZ_EINVAL;
			}
	}
	if (st != FZ_OK)
		return st;
	interp *R = calloc((size_t)world, sizeof *R);
	if (!R) {
		set_err(err, "out of memory");
		return FZ_ENOMEM;
	}
	/* what nothing needs is not run (dce.c), as in generated code: a
	 * dead max over an empty extent fails neither */
	bool *live = malloc(sizeof *live * ((size_t)t->n_nodes + 1));
	if (!live || fz_trace_live(t, live) < 0) {
		set_err(err, "out of memory");
		st = FZ_ENOMEM;
	}
	for (int r = 0; r < world; r++) {
		R[r].t = t;
		R[r].live = live;
	}
	for (int r = 0; r < world && st == FZ_OK; r++)
		st = rank_setup(&R[r], t, syms, inputs + (size_t)r * (size_t)n_in, err);
	for (int k = 0; k < t->n_nodes && st == FZ_OK; k++) {
		const fz_node *n = t->nodes[k];
		if (!live[k])
			continue;
		for (int r = 0; r < world && st == FZ_OK; r++)
			st = alloc_outputs(&R[r], n);
		if (st != FZ_OK)
			break;
		if (fz_ops[n->op].cls == FZ_CLASS_COLLECTIVE) {
			st = run_collective(R, world, n);
		} else {
			for (int r = 0; r < world && st == FZ_OK; r++) {
				st = run_node(&R[r], n);
				if (st != FZ_OK && world > 1 && err && *err) {
					char *m = *err;
					*err = NULL;
					set_err(err, "rank %d: %s", r, m);
					free(m);
				}
			}
		}
		for (int r = 0; r < world && st == FZ_OK; r++)
			release_after(&R[r], n);
	}
	int done = 0;
	for (; done < world && st == FZ_OK; done++)
		st = rank_outputs(&R[done], outputs + (size_t)done * (size_t)n_out);
	if (st != FZ_OK) /* give back what earlier ranks handed over */
		for (int r = 0; r < done - 1; r++)
			for (int k = 0; k < n_out; k++) {
				fz_tensor *o = &outputs[(size_t)r * (size_t)n_out + (size_t)k];
				bool dup = false;
				for (int j = 0; j < k; j++)
					dup |= outputs[(size_t)r * (size_t)n_out + (size_t)j].data == o->data;
				if (!dup)
					free(o->data);
				o->data = NULL;
			}
	for (int r = 0; r < world; r++)
		rank_free(&R[r]);
	free(R);
	free(live);
	return st;
}

fz_status fz_trace_interpret(const fz_trace *t, const int64_t *sym_sizes,
			     const fz_tensor *inputs, int n_in,
			     fz_tensor *outputs, int n_out, char **err)
{
	if (t && t->world > 1) {
		if (err)
			*err = NULL;
		set_err(err, "trace '%s' declares world %d: interpret its %d ranks "
			"together (fz_trace_interpret_world)", t->name, t->world,
			t->world);
		return FZ_EUNSUPPORTED;
	}
	return fz_trace_interpret_world(t, sym_sizes, 1, inputs, n_in, outputs,
					n_out, err);
}
