/*
 * test_ir.c: the op table, extents, the verifier and the printer.
 *
 * The verifier is tested the way a pass would break a graph: by building a
 * correct trace, then tampering with it (a stored type that disagrees with
 * the op, an operand used before its definition, a composite left in the
 * IR, a future nobody waits on) and checking each is caught and named.
 *
 * The printer is tested over the whole corpus: every trace parses, prints,
 * parses back to the same graph, and prints to the same text again.
 */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusec.h"
#include "ir.h"
#include "onehot.h"

static fz_module *parse(const char *src)
{
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = fz_module_parse(src, strlen(src), "t.trace", &m, &diag);
	ck_assert_msg(st == FZ_OK, "%s", diag ? diag : "?");
	fz_free(diag);
	return m;
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/* ---- op table ---- */

START_TEST(op_table_is_consistent)
{
	for (int i = 0; i < FZ_OP_COUNT; i++) {
		const fz_opinfo *oi = &fz_ops[i];
		fz_opcode back;
		ck_assert_ptr_nonnull(oi->name);
		ck_assert(fz_op_from_name(oi->name, &back));
		ck_assert_int_eq(back, i);
		ck_assert(oi->max_args < 0 || oi->min_args <= oi->max_args);
		ck_assert_msg((oi->required & ~oi->attrs) == 0,
			      "%s requires an attribute it does not accept", oi->name);
		ck_assert_int_lt(oi->cls, FZ_CLASS_COUNT);
	}
	for (int i = 0; i < FZ_ATTR_COUNT; i++) {
		fz_attr_id back;
		ck_assert(fz_attr_from_name(fz_attr_names[i], &back));
		ck_assert_int_eq(back, i);
	}
	fz_opcode op;
	ck_assert(!fz_op_from_name("softmax2", &op));
}
END_TEST

START_TEST(every_design_op_is_in_the_table)
{
	static const char *const ops[] = {
		"neg", "abs", "exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt",
		"rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf", "floor",
		"ceil", "round", "sign", "isfinite", "logical_not", "add", "sub",
		"mul", "div", "pow", "maximum", "minimum", "fmod", "eq", "ne", "lt",
		"le", "gt", "ge", "logical_and", "logical_or", "where", "cast", "full",
		"iota", "uniform", "broadcast_in_dim", "reshape", "permute", "slice",
		"squeeze", "unsqueeze", "cat", "sum", "amax", "amin", "var_mean",
		"take", "take_along", "index_add", "matmul", "linear", "all_gather",
		"reduce_scatter", "all_reduce", "wait", "relu", "silu", "gelu",
		"softmax", "log_softmax", "mean", "layer_norm", "rms_norm",
		"transpose", "cross_entropy", "cumsum", "topk", "argmax", "argmin",
	};
	for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
		fz_opcode op;
		ck_assert_msg(fz_op_from_name(ops[i], &op), "%s missing", ops[i]);
	}
}
END_TEST

START_TEST(dtype_names)
{
	for (int i = 0; i < FZ_DTYPE_COUNT; i++) {
		fz_dtype d;
		ck_assert(fz_dtype_from_name(fz_dtype_name((fz_dtype)i), &d));
		ck_assert_int_eq(d, i);
		ck_assert_uint_gt(fz_dtype_size((fz_dtype)i), 0);
	}
	fz_dtype d;
	ck_assert(!fz_dtype_from_name("f8", &d));
	ck_assert_uint_eq(fz_dtype_size(FZ_BF16), 2);
	ck_assert_str_eq(fz_status_name(FZ_ERANGE), "index out of range");
}
END_TEST

/* ---- extents ---- */

START_TEST(extent_arithmetic)
{
	fz_ext b = fz_ext_sym(0), t = fz_ext_sym(1), r, bt;
	ck_assert(fz_ext_mul(b, t, &bt));
	ck_assert_int_eq(fz_ext_power(bt, 0), 1);
	ck_assert_int_eq(fz_ext_power(bt, 1), 1);
	ck_assert_int_eq(fz_ext_as_sym(bt), -1);
	ck_assert_int_eq(fz_ext_as_sym(t), 1);
	ck_assert(fz_ext_mul(t, t, &r));                  /* T*T: a [T, T] mask */
	ck_assert_int_eq(fz_ext_power(r, 1), 2);
	ck_assert_int_eq(fz_ext_as_sym(r), -1);
	fz_ext p = fz_ext_const(1);
	for (int i = 0; i < 15; i++)
		ck_assert(fz_ext_mul(p, b, &p));
	ck_assert(!fz_ext_mul(p, b, &r));                 /* B^16 */
	ck_assert(fz_ext_mul((fz_ext){4, b.syms}, fz_ext_const(8), &r));
	ck_assert(fz_ext_eq(r, (fz_ext){32, b.syms}));
	ck_assert(fz_ext_div((fz_ext){32, bt.syms}, (fz_ext){8, t.syms}, &r));
	ck_assert(fz_ext_eq(r, (fz_ext){4, b.syms}));
	ck_assert(!fz_ext_div((fz_ext){32, b.syms}, t, &r)); /* B/T */
	ck_assert(!fz_ext_div(fz_ext_const(10), fz_ext_const(4), &r));
	ck_assert(!fz_ext_mul(fz_ext_const(INT64_MAX / 2), fz_ext_const(3), &r));
	int64_t sizes[2] = {3, -1};
	ck_assert_int_eq(fz_ext_eval((fz_ext){5, b.syms}, sizes), 15);
	ck_assert_int_eq(fz_ext_eval((fz_ext){5, t.syms}, sizes), -1);
	sizes[1] = 7;
	ck_assert(fz_ext_mul(bt, t, &r));
	ck_assert_int_eq(fz_ext_eval(r, sizes), 3 * 7 * 7);
	int64_t big[1] = {INT64_MAX / 2};
	ck_assert_int_eq(fz_ext_eval((fz_ext){4, b.syms}, big), -1);
	char buf[64];
	ck_assert_str_eq(fz_ext_str(NULL, (fz_ext){2, bt.syms}, buf, sizeof buf),
			 "2*?*?");
}
END_TEST

/* Every symbol of sz unbound, then T (when t has it) bound to T. */
static void sizes_with_T(const fz_trace *t, int64_t *sz, int64_t T)
{
	for (int i = 0; i < FZ_MAX_SYMS; i++)
		sz[i] = -1;
	if (T >= 0)
		sz[fz_trace_symbol_find(t, "T")] = T;
}

/* Sums as derived symbols: one canonical spelling, and binding that
 * derives, checks and solves. */
START_TEST(extent_sums)
{
	fz_module *m = parse(
		"trace d(x: f32[B, T+1], y: f32[B*T+2], z: f32[T-1]) {\n"
		"  return x, y, z\n"
		"}\n");
	fz_trace *t = fz_module_trace(m, 0);
	fz_ext e, f;
	char buf[64];
	/* spellings of one value meet; a lone monomial stays a monomial */
	ck_assert(fz_trace_ext_parse(t, "1+T", &e));
	ck_assert(fz_trace_ext_parse(t, "T+1", &f));
	ck_assert(fz_ext_eq(e, f));
	ck_assert(fz_trace_ext_parse(t, "T*B-B", &e));
	ck_assert_str_eq(fz_ext_str(t, e, buf, sizeof buf), "B*T-B");
	ck_assert_int_eq(fz_ext_power(e, fz_trace_symbol_find(t, "B")), 1);
	ck_assert(fz_trace_ext_parse(t, "T+T-T", &e));
	ck_assert(fz_ext_eq(e, fz_ext_sym(fz_trace_symbol_find(t, "T"))));
	ck_assert(fz_trace_ext_parse(t, "3*T-3", &e));
	ck_assert_int_eq(e.c, 3);
	ck_assert(fz_trace_ext_parse(t, "2-2", &e));
	ck_assert(fz_ext_eq(e, fz_ext_const(0)));
	int n_syms = t->n_syms;
	ck_assert(!fz_trace_ext_parse(t, "-T", &e));       /* negative always */
	ck_assert(!fz_trace_ext_parse(t, "T+", &e));
	ck_assert(!fz_trace_ext_parse(t, "T**2", &e));
	ck_assert(!fz_trace_ext_parse(t, "99999999999999999999", &e));
	ck_assert_int_eq(t->n_syms, n_syms);

	/* binding: T from x's T+1 rows; y's B*T+2 checks; z's T-1 derived */
	float xs[2 * 8], ys[16], zs[6];
	fz_tensor in[3];
	fz_tensor_contiguous(&in[0], xs, FZ_F32, 2, (int64_t[]){2, 8});
	fz_tensor_contiguous(&in[1], ys, FZ_F32, 1, (int64_t[]){16});
	fz_tensor_contiguous(&in[2], zs, FZ_F32, 1, (int64_t[]){6});
	int64_t sz[FZ_MAX_SYMS];
	sizes_with_T(t, sz, -1);
	char *err = NULL;
	ck_assert_int_eq(fz_trace_bind(t, in, 3, sz, &err), FZ_OK);
	ck_assert_int_eq(sz[fz_trace_symbol_find(t, "T")], 7);
	ck_assert_int_eq(sz[fz_trace_symbol_find(t, "B")], 2);
	ck_assert_int_eq(sz[fz_trace_symbol_find(t, "T-1")], 6);
	/* a size that disagrees with T+1 */
	sizes_with_T(t, sz, 5);
	ck_assert_int_eq(fz_trace_bind(t, in, 3, sz, &err), FZ_EBIND);
	ck_assert_msg(strstr(err, "T+1") != NULL, "%s", err);
	fz_free(err);
	err = NULL;
	/* y of 15 is not B*T+2 at B=2, T=7 */
	fz_tensor_contiguous(&in[1], ys, FZ_F32, 1, (int64_t[]){15});
	sizes_with_T(t, sz, -1);
	ck_assert_int_eq(fz_trace_bind(t, in, 3, sz, &err), FZ_EBIND);
	fz_free(err);
	err = NULL;
	/* T-1 below zero */
	sizes_with_T(t, sz, 0);
	ck_assert_int_eq(fz_trace_syms_derive(t, sz, buf, sizeof buf), -1);
	ck_assert_msg(strstr(buf, "T-1") != NULL, "%s", buf);
	fz_module_free(m);

	/* the first T of 64 positions: T past 64 is refused at binding */
	m = parse("trace g(pos: f32[64], x: f32[T]) {\n"
		  "  p = slice(pos, start=[0], end=[T])\n"
		  "  y = add(x, p)\n"
		  "  return y\n"
		  "}\n");
	t = fz_module_trace(m, 0);
	sizes_with_T(t, sz, 64);
	ck_assert_int_ge(fz_trace_syms_derive(t, sz, buf, sizeof buf), 0);
	sizes_with_T(t, sz, 65);
	ck_assert_int_eq(fz_trace_syms_derive(t, sz, buf, sizeof buf), -1);
	ck_assert_msg(strstr(buf, "-T+64") != NULL, "%s", buf);
	fz_module_free(m);
}
END_TEST

/* ---- verifier ---- */

static const char *const good =
	"trace v(x: f32[B, 4], w: f32[4]) {\n"
	"  y = add(x, w)\n"
	"  z = exp(y)\n"
	"  return z\n"
	"}\n";

START_TEST(verifier_accepts_good_trace)
{
	fz_module *m = parse(good);
	ck_assert_int_eq(fz_trace_verify(fz_module_trace(m, 0), NULL), FZ_OK);
	fz_module_free(m);
}
END_TEST

START_TEST(verifier_catches_wrong_stored_type)
{
	fz_module *m = parse(good);
	fz_trace *t = fz_module_trace(m, 0);
	fz_value *z = fz_lookup(t, "z");
	z->type.dtype = FZ_F16;
	char *err = NULL;
	ck_assert_int_eq(fz_trace_verify(t, &err), FZ_EVERIFY);
	ck_assert_ptr_nonnull(strstr(err, "line 3: exp: result 1 has type f16[B, 4]"));
	ck_assert_ptr_nonnull(strstr(err, "gives f32[B, 4]"));
	fz_free(err);
	fz_module_free(m);
}
END_TEST

START_TEST(verifier_catches_use_before_definition)
{
	fz_module *m = parse(good);
	fz_trace *t = fz_module_trace(m, 0);
	int last = t->n_nodes - 1;
	fz_node *tmp = t->nodes[last];
	t->nodes[last] = t->nodes[last - 1];
	t->nodes[last - 1] = tmp;
	char *err = NULL;
	ck_assert_int_eq(fz_trace_verify(t, &err), FZ_EVERIFY);
	ck_assert_ptr_nonnull(strstr(err, "exp: operand 1 is used before it is defined"));
	fz_free(err);
	fz_module_free(m);
}
END_TEST

START_TEST(verifier_catches_composite_in_ir)
{
	fz_module *m = parse(good);
	fz_trace *t = fz_module_trace(m, 0);
	t->nodes[t->n_nodes - 1]->op = FZ_OP_RELU;
	char *err = NULL;
	ck_assert_int_eq(fz_trace_verify(t, &err), FZ_EVERIFY);
	ck_assert_ptr_nonnull(strstr(err, "not a primitive op"));
	fz_free(err);
	fz_module_free(m);
}
END_TEST

START_TEST(verifier_catches_bad_operand_count)
{
	fz_module *m = parse(good);
	fz_trace *t = fz_module_trace(m, 0);
	t->nodes[t->n_nodes - 1]->n_in = 2;
	t->nodes[t->n_nodes - 1]->in = t->nodes[t->n_nodes - 2]->in;
	char *err = NULL;
	ck_assert_int_eq(fz_trace_verify(t, &err), FZ_EVERIFY);
	ck_assert_ptr_nonnull(strstr(err, "exp: 2 operands; expected 1"));
	fz_free(err);
	fz_module_free(m);
}
END_TEST

START_TEST(verifier_catches_missing_return)
{
	fz_trace *t = fz_trace_new("r");
	fz_dim d = {4, NULL};
	fz_value *x = fz_param(t, "x", FZ_F32, 1, &d);
	fz_arg a = fz_arg_value(x);
	ck_assert_ptr_nonnull(fz_op1(t, "exp", &a, 1, NULL, 0));
	char *err = NULL;
	ck_assert_int_eq(fz_trace_verify(t, &err), FZ_EVERIFY);
	ck_assert_ptr_nonnull(strstr(err, "has no return"));
	fz_free(err);
	fz_trace_free(t);
}
END_TEST

START_TEST(verifier_catches_unwaited_future)
{
	static const char src[] =
		"trace f(x: f32[8]) {\n"
		"  g = all_gather(x, dim=0)\n"
		"  return x\n"
		"}\n";
	fz_module *m = NULL;
	char *diag = NULL;
	ck_assert_int_ne(fz_module_parse(src, strlen(src), "f.trace", &m, &diag), FZ_OK);
	ck_assert_ptr_nonnull(strstr(diag, "never waited on"));
	fz_free(diag);
}
END_TEST

START_TEST(world_size_shapes_collectives)
{
	static const char src[] =
		"trace f(x: f32[8, 3]) world 4 {\n"
		"  g = wait(all_gather(x, dim=0))\n"
		"  s = wait(reduce_scatter(x, dim=0))\n"
		"  return g, s\n"
		"}\n";
	fz_module *m = parse(src);
	fz_trace *t = fz_module_trace(m, 0);
	ck_assert_int_eq(fz_trace_world(t), 4);
	ck_assert(fz_ext_eq(fz_lookup(t, "g")->type.dims[0], fz_ext_const(32)));
	ck_assert(fz_ext_eq(fz_lookup(t, "s")->type.dims[0], fz_ext_const(2)));
	fz_module_free(m);
}
END_TEST

/* ---- printer ---- */

static void round_trip(const char *path)
{
	char *src = read_file(path);
	fz_module *m1 = NULL, *m2 = NULL;
	char *diag = NULL, *p1 = NULL, *p2 = NULL, why[256];
	ck_assert_msg(fz_module_parse(src, strlen(src), path, &m1, &diag) == FZ_OK,
		      "%s", diag);
	ck_assert_int_eq(fz_module_print(m1, &p1), FZ_OK);
	ck_assert_msg(fz_module_parse(p1, strlen(p1), "printed", &m2, &diag) == FZ_OK,
		      "%s: printed text does not parse:\n%s\n%s", path, diag, p1);
	ck_assert_int_eq(fz_module_count(m1), fz_module_count(m2));
	for (int i = 0; i < fz_module_count(m1); i++)
		ck_assert_msg(fz_trace_equal(fz_module_trace(m1, i),
					     fz_module_trace(m2, i), why, sizeof why),
			      "%s trace %d: %s", path, i, why);
	ck_assert_int_eq(fz_module_print(m2, &p2), FZ_OK);
	ck_assert_str_eq(p1, p2);
	free(src);
	fz_free(p1);
	fz_free(p2);
	fz_module_free(m1);
	fz_module_free(m2);
}

START_TEST(printer_round_trips_corpus)
{
	DIR *d = opendir(FZ_SOURCE_DIR "/tests/traces");
	ck_assert_ptr_nonnull(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t len = strlen(e->d_name);
		if (len < 7 || strcmp(e->d_name + len - 6, ".trace"))
			continue;
		char path[1024];
		snprintf(path, sizeof path, "%s/tests/traces/%s", FZ_SOURCE_DIR, e->d_name);
		round_trip(path);
		n++;
	}
	closedir(d);
	ck_assert_int_ge(n, 10);
}
END_TEST

START_TEST(printer_writes_extensions)
{
	static const char src[] =
		"trace p(x: f32[B, T, 4]) {\n"
		"  y = reshape(x, shape=[-1, 4])\n"
		"  z = add(y, 1)\n"
		"  m = maximum(z, -inf)\n"
		"  return m\n"
		"}\n";
	fz_module *m = parse(src);
	char *out = NULL;
	ck_assert_int_eq(fz_module_print(m, &out), FZ_OK);
	ck_assert_ptr_nonnull(strstr(out, "reshape(x, shape=[-1, 4])"));
	ck_assert_ptr_nonnull(strstr(out, "shape=[B*T, 4]"));
	ck_assert_ptr_nonnull(strstr(out, "value=-inf"));
	fz_free(out);
	fz_module_free(m);
}
END_TEST

START_TEST(printed_names_avoid_user_names)
{
	static const char src[] =
		"trace p(_1: f32[4]) {\n"
		"  _3 = add(_1, 1)\n"
		"  return _3\n"
		"}\n";
	fz_module *m = parse(src);
	char *out = NULL;
	ck_assert_int_eq(fz_module_print(m, &out), FZ_OK);
	fz_module *m2 = parse(out);
	char why[256];
	ck_assert_msg(fz_trace_equal(fz_module_trace(m, 0), fz_module_trace(m2, 0),
				     why, sizeof why), "%s\n%s", why, out);
	fz_free(out);
	fz_module_free(m);
	fz_module_free(m2);
}
END_TEST

/* ---- a sum over a one-hot select (ir/onehot.c) ---- */

/* Whether the trace's last sum is a one-hot pick; where it is, its index
 * must be the value named `index` (NULL: unnamed). */
static bool last_sum_picks(const char *src, const char *index)
{
	fz_module *m = parse(src);
	const fz_trace *t = fz_module_trace(m, 0);
	const fz_node *n = NULL;
	for (int i = 0; i < t->n_nodes; i++)
		if (t->nodes[i]->op == FZ_OP_SUM)
			n = t->nodes[i];
	ck_assert_ptr_nonnull(n);
	fz_onehot oh;
	bool yes = fz_onehot_find(n, NULL, NULL, &oh);
	if (yes) {
		ck_assert_int_eq(oh.dim, n->attrs.dims[0]);
		ck_assert(oh.index->type.dtype == FZ_I64 || oh.index->type.dtype == FZ_I32);
		/* the index is the broadcast of the named value */
		const fz_value *b = oh.index->def ? oh.index->def->in[0] : NULL;
		if (index)
			ck_assert(b && b->name && strcmp(b->name, index) == 0);
	}
	fz_module_free(m);
	return yes;
}

#define ONEHOT_HEAD "trace f(t: i64[8], w: f32[8], x: f32[8, 16]) {\n" \
	"  i = reshape(iota(length=16, dtype=i64), shape=[1, 16])\n" \
	"  tt = unsqueeze(t, dim=1)\n" \
	"  wt = unsqueeze(w, dim=1)\n" \
	"  z = full(shape=[8, 16], value=0, dtype=f32)\n"

START_TEST(onehot_sum_found)
{
	/* the exporter's form, both operand orders of eq and of mul, no
	 * keepdim, a select of a row value, an i32 iota */
	static const char *yes[] = {
		ONEHOT_HEAD "  oh = where(eq(i, tt), -1, z)\n"
		"  r = sum(mul(oh, wt), dims=[1], keepdim=true)\n  return r\n}\n",
		ONEHOT_HEAD "  oh = where(eq(tt, i), wt, z)\n"
		"  r = sum(mul(wt, mul(oh, 2)), dims=[1])\n  return r\n}\n",
		ONEHOT_HEAD "  oh = where(eq(i, tt), exp(wt), z)\n"
		"  r = sum(oh, dims=[1])\n  return r\n}\n",
		"trace f(t: i32[8]) {\n"
		"  i = iota(length=16, dtype=i32)\n"
		"  oh = where(eq(i, unsqueeze(t, dim=1)), 3, full(shape=[8, 16], value=0, dtype=i32))\n"
		"  r = sum(oh, dims=[1])\n  return r\n}\n",
	};
	for (size_t k = 0; k < sizeof yes / sizeof yes[0]; k++) {
		ck_assert_msg(last_sum_picks(yes[k], k == 3 ? NULL : "tt"), "case %zu", k);
	}
}
END_TEST

START_TEST(onehot_sum_refused)
{
	/* not one-hot (ne; a nonzero else), a value or a factor that varies
	 * along the row, the iota along the kept dim, two reduced dims, a
	 * float iota, amax */
	static const char *no[] = {
		ONEHOT_HEAD "  oh = where(ne(i, tt), -1, z)\n"
		"  r = sum(mul(oh, wt), dims=[1])\n  return r\n}\n",
		ONEHOT_HEAD "  oh = where(eq(i, tt), -1, add(z, 1))\n"
		"  r = sum(mul(oh, wt), dims=[1])\n  return r\n}\n",
		ONEHOT_HEAD "  oh = where(eq(i, tt), x, z)\n"
		"  r = sum(mul(oh, wt), dims=[1])\n  return r\n}\n",
		ONEHOT_HEAD "  oh = where(eq(i, tt), -1, z)\n"
		"  r = sum(mul(oh, x), dims=[1])\n  return r\n}\n",
		ONEHOT_HEAD "  oh = where(eq(i, tt), -1, z)\n"
		"  r = sum(mul(oh, wt), dims=[0])\n  return r\n}\n",
		ONEHOT_HEAD "  oh = where(eq(i, tt), -1, z)\n"
		"  r = sum(mul(oh, wt), dims=[0, 1])\n  return r\n}\n",
		ONEHOT_HEAD "  oh = where(eq(i, add(tt, i)), -1, z)\n"
		"  r = sum(oh, dims=[1])\n  return r\n}\n",
		"trace f(t: f32[8], w: f32[8]) {\n"
		"  i = iota(length=16, dtype=f32)\n"
		"  oh = where(eq(i, unsqueeze(t, dim=1)), -1, full(shape=[8, 16], value=0, dtype=f32))\n"
		"  r = sum(oh, dims=[1])\n  return r\n}\n",
	};
	for (size_t k = 0; k < sizeof no / sizeof no[0]; k++) {
		ck_assert_msg(!last_sum_picks(no[k], NULL), "case %zu", k);
	}
}
END_TEST

static Suite *ir_suite(void)
{
	Suite *s = suite_create("ir");
	TCase *tc = tcase_create("table");
	tcase_add_test(tc, op_table_is_consistent);
	tcase_add_test(tc, every_design_op_is_in_the_table);
	tcase_add_test(tc, dtype_names);
	tcase_add_test(tc, extent_arithmetic);
	tcase_add_test(tc, extent_sums);
	suite_add_tcase(s, tc);

	tc = tcase_create("verifier");
	tcase_add_test(tc, verifier_accepts_good_trace);
	tcase_add_test(tc, verifier_catches_wrong_stored_type);
	tcase_add_test(tc, verifier_catches_use_before_definition);
	tcase_add_test(tc, verifier_catches_composite_in_ir);
	tcase_add_test(tc, verifier_catches_bad_operand_count);
	tcase_add_test(tc, verifier_catches_missing_return);
	tcase_add_test(tc, verifier_catches_unwaited_future);
	tcase_add_test(tc, world_size_shapes_collectives);
	suite_add_tcase(s, tc);

	tc = tcase_create("onehot");
	tcase_add_test(tc, onehot_sum_found);
	tcase_add_test(tc, onehot_sum_refused);
	suite_add_tcase(s, tc);

	tc = tcase_create("printer");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, printer_round_trips_corpus);
	tcase_add_test(tc, printer_writes_extensions);
	tcase_add_test(tc, printed_names_avoid_user_names);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(ir_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
