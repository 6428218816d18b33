/*
 * test_parse.c: the trace text parser (frontend/parse.c).
 *
 * Three themes. Grammar: every rule of DESIGN.md's grammar parses and builds
 * what it says (parameters of every kind of type, the world clause, nested
 * expressions, attributes of every value kind, several results, several
 * returns, several traces, comments, CRLF line ends), and the corpus under
 * tests/traces parses and prints back to the same graphs. Diagnostics: each
 * class of error is reported at its exact line and column, asserted from
 * the "FILE:LINE:COL:" prefix, with the source line echoed and the caret
 * under the right byte; several errors in one file are all reported; the
 * parser stops after 20. Robustness: deep nesting, binary garbage, NUL
 * bytes, inputs that are not NUL-terminated, every prefix of a valid trace
 * and random mutations of one: each parses or gives a diagnostic, and under
 * ASan/UBSan nothing reads out of bounds or leaks.
 */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusec.h"
#include "ir.h"

#define FILE_NAME "t.trace"

/* ---- helpers ---- */

/* A heap copy of exactly n bytes, not NUL-terminated, so that ASan sees any
 * read past the end. */
static char *exact_copy(const char *src, size_t n)
{
	char *p = malloc(n ? n : 1);
	ck_assert_ptr_nonnull(p);
	memcpy(p, src, n);
	return p;
}

static fz_status parse_n(const char *src, size_t n, fz_module **m, char **diag)
{
	char *buf = exact_copy(src, n);
	fz_status st = fz_module_parse(buf, n, FILE_NAME, m, diag);
	free(buf);
	return st;
}

static fz_module *parse_ok(const char *src)
{
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = parse_n(src, strlen(src), &m, &diag);
	ck_assert_msg(st == FZ_OK, "parse failed (%s):\n%s", fz_status_name(st),
		      diag ? diag : "(no diagnostic)");
	ck_assert_ptr_null(diag);
	ck_assert_ptr_nonnull(m);
	return m;
}

/* Parses src expecting failure; returns the diagnostics. */
static char *parse_fail(const char *src, size_t n, fz_status want)
{
	fz_module *m = (fz_module *)1;
	char *diag = NULL;
	fz_status st = parse_n(src, n, &m, &diag);
	ck_assert_msg(st == want, "status %s, expected %s; diag:\n%s",
		      fz_status_name(st), fz_status_name(want),
		      diag ? diag : "(none)");
	ck_assert_ptr_null(m);
	ck_assert_ptr_nonnull(diag);
	return diag;
}

/* Whether s[0..n) contains the string w. */
static bool contains(const char *s, size_t n, const char *w)
{
	size_t k = strlen(w);
	for (size_t i = 0; i + k <= n; i++)
		if (memcmp(s + i, w, k) == 0)
			return true;
	return false;
}

static int count_errors(const char *diag)
{
	int n = 0;
	for (const char *p = diag; (p = strstr(p, ": error: ")); p++)
		n++;
	return n;
}

/* The k-th diagnostic (0-based) of diag: checks "FILE:LINE:COL: error:",
 * that the message contains `msg`, that the echoed line is `line_text`
 * (when given) and that the caret sits under column col. */
static void check_diag_k(const char *diag, int k, int line, int col,
                         const char *msg, const char *line_text)
{
	const char *d = diag, *p = diag;
	for (int i = 0; i <= k; i++) {
		d = strstr(p, ": error: ");
		ck_assert_msg(d != NULL, "no diagnostic %d in:\n%s", k, diag);
		p = d + 1;
	}
	while (d > diag && d[-1] != '\n') /* back to the start of its line */
		d--;
	char file[64];
	int l = 0, c = 0, used = 0;
	ck_assert_msg(sscanf(d, "%63[^:]:%d:%d: error: %n", file, &l, &c, &used) == 3
		      && used > 0, "bad diagnostic prefix:\n%s", d);
	ck_assert_str_eq(file, FILE_NAME);
	ck_assert_msg(l == line && c == col, "at %d:%d, expected %d:%d:\n%s", l, c,
		      line, col, diag);
	const char *m = d + used, *eol = strchr(m, '\n');
	ck_assert_ptr_nonnull(eol);
	ck_assert_msg(contains(m, (size_t)(eol - m), msg),
		      "message lacks '%s':\n%s", msg, diag);
	const char *src = eol + 1, *src_end = strchr(src, '\n');
	ck_assert_ptr_nonnull(src_end);
	if (line_text)
		ck_assert_msg(strlen(line_text) == (size_t)(src_end - src) &&
			      memcmp(src, line_text, strlen(line_text)) == 0,
			      "echoed line differs:\n%s", diag);
	const char *caret = src_end + 1, *caret_end = strchr(caret, '\n');
	ck_assert_ptr_nonnull(caret_end);
	if (strncmp(src, "...", 3) == 0) {
		/* a window of a long line: the caret under some byte of it */
		ck_assert(caret_end - caret <= src_end - src &&
			  caret_end[-1] == '^');
		return;
	}
	ck_assert_msg(caret_end - caret == col && caret[col - 1] == '^',
		      "caret not under column %d:\n%s", col, diag);
	for (int i = 0; i < col - 1; i++)
		ck_assert_msg(caret[i] == (src[i] == '\t' ? '\t' : ' '),
			      "caret prefix byte %d:\n%s", i, diag);
}

static void check_diag(const char *diag, int line, int col, const char *msg)
{
	check_diag_k(diag, 0, line, col, msg, NULL);
}

static const fz_node *find_node(const fz_trace *t, const char *op)
{
	for (int i = 0; i < t->n_nodes; i++)
		if (strcmp(fz_ops[t->nodes[i]->op].name, op) == 0)
			return t->nodes[i];
	return NULL;
}

/* parse(print(m)) has the same graphs as m. */
static void check_round_trip(const fz_module *m)
{
	char *text = NULL;
	ck_assert_int_eq(fz_module_print(m, &text), FZ_OK);
	fz_module *m2 = parse_ok(text);
	ck_assert_int_eq(fz_module_count(m2), fz_module_count(m));
	for (int i = 0; i < fz_module_count(m); i++) {
		char why[256];
		ck_assert_msg(fz_trace_equal(fz_module_trace(m, i),
					     fz_module_trace(m2, i), why, sizeof why),
			      "trace %d differs after printing: %s\n%s", i, why, text);
	}
	fz_module_free(m2);
	free(text);
}

/* ---- grammar ---- */

START_TEST(test_params_types)
{
	fz_module *m = parse_ok(
		"trace f(x: f32[2, 3], y: bf16[B, T, 4096], s: f64[], "
		"i: i64[B], b: bool[7], u: u8[1], h: f16[0], j: i32[T], k: i8[4]) {\n"
		"  r = neg(x)\n"
		"  return r\n"
		"}\n");
	ck_assert_int_eq(fz_module_count(m), 1);
	fz_trace *t = fz_module_trace(m, 0);
	ck_assert_str_eq(fz_trace_name(t), "f");
	ck_assert_int_eq(fz_trace_param_count(t), 9);
	fz_value *x = fz_trace_param(t, 0), *y = fz_trace_param(t, 1),
		 *s = fz_trace_param(t, 2);
	ck_assert_str_eq(fz_value_name(x), "x");
	ck_assert_int_eq(fz_value_dtype(x), FZ_F32);
	ck_assert_int_eq(fz_value_rank(x), 2);
	ck_assert_int_eq(fz_value_extent(x, 1, NULL), 3);
	ck_assert_int_eq(fz_value_dtype(y), FZ_BF16);
	ck_assert_int_eq(fz_value_rank(y), 3);
	ck_assert_int_eq(fz_value_extent(y, 0, NULL), -1); /* B unbound */
	int64_t sizes[2] = {8, 16};
	ck_assert_int_eq(fz_trace_symbol_count(t), 2);
	ck_assert_str_eq(fz_trace_symbol(t, 0), "B");
	ck_assert_str_eq(fz_trace_symbol(t, 1), "T");
	ck_assert_int_eq(fz_value_extent(y, 1, sizes), 16);
	ck_assert_int_eq(fz_value_extent(y, 2, sizes), 4096);
	ck_assert_int_eq(fz_value_dtype(s), FZ_F64);
	ck_assert_int_eq(fz_value_rank(s), 0);
	ck_assert_int_eq(fz_value_dtype(fz_trace_param(t, 4)), FZ_BOOL);
	ck_assert_int_eq(fz_value_dtype(fz_trace_param(t, 5)), FZ_U8);
	ck_assert_int_eq(fz_value_dtype(fz_trace_param(t, 6)), FZ_F16);
	ck_assert_int_eq(fz_value_dtype(fz_trace_param(t, 7)), FZ_I32);
	ck_assert_int_eq(fz_value_dtype(fz_trace_param(t, 8)), FZ_I8);
	check_round_trip(m);
	fz_module_free(m);
}
END_TEST

START_TEST(test_no_params_and_world)
{
	fz_module *m = parse_ok(
		"trace w(x: f32[8, 4]) world 8 {\n"
		"  g = all_gather(x, dim=0)\n"
		"  y = wait(g)\n"
		"  return y\n"
		"}\n"
		"trace z() {\n"
		"  c = full(shape=[2], value=1.5, dtype=f32)\n"
		"  return c\n"
		"}\n");
	ck_assert_int_eq(fz_module_count(m), 2);
	ck_assert_int_eq(fz_trace_world(fz_module_trace(m, 0)), 8);
	ck_assert_int_eq(fz_trace_world(fz_module_trace(m, 1)), 1);
	ck_assert_int_eq(fz_trace_param_count(fz_module_trace(m, 1)), 0);
	check_round_trip(m);
	fz_module_free(m);
}
END_TEST

START_TEST(test_nested_exprs)
{
	fz_module *m = parse_ok(
		"trace rms(x: f32[B, 4096]) {\n"
		"  y = mul(x, rsqrt(add(mean(mul(x, x), dims=[1], keepdim=true), 1e-5)))\n"
		"  return y\n"
		"}\n");
	fz_trace *t = fz_module_trace(m, 0);
	/* inner first: the last node is the outer mul, named y */
	const fz_node *last = t->nodes[t->n_nodes - 1];
	ck_assert_int_eq(last->op, FZ_OP_MUL);
	ck_assert_str_eq(fz_value_name(last->out[0]), "y");
	ck_assert_ptr_nonnull(find_node(t, "rsqrt"));
	ck_assert_ptr_nonnull(find_node(t, "sum")); /* mean, lowered */
	ck_assert_ptr_eq(fz_lookup(t, "y"), last->out[0]);
	check_round_trip(m);
	fz_module_free(m);
}
END_TEST

START_TEST(test_attrs_every_kind)
{
	fz_module *m = parse_ok(
		"trace a(x: f32[4, 6], i: i64[3]) {\n"
		"  u = unsqueeze(x, dim=-1)\n"              /* INT, negative */
		"  c = cast(x, dtype=f16)\n"                /* DTYPE */
		"  s = sum(x, dims=[0, 1], keepdim=true)\n" /* LIST, BOOL */
		"  g = gelu(x, approximate=tanh)\n"         /* NAME */
		"  n = layer_norm(x, dims=[1], eps=0.001)\n" /* FLOAT */
		"  k = slice(x, start=[0, 1], end=[4, 5], step=[1, 2])\n"
		"  f = full(shape=[], value=-1e30, dtype=f32)\n"
		"  r = reshape(x, shape=[-1])\n"
		"  return u, c, s, g, n, k, f, r\n"
		"}\n");
	fz_trace *t = fz_module_trace(m, 0);
	const fz_node *nd = find_node(t, "unsqueeze");
	ck_assert_ptr_nonnull(nd);
	ck_assert_int_eq(nd->attrs.dim, 2); /* normalized */
	nd = find_node(t, "cast");
	ck_assert_int_eq(nd->attrs.dtype, FZ_F16);
	nd = find_node(t, "sum");
	ck_assert(nd->attrs.keepdim);
	ck_assert_int_eq(nd->attrs.n_dims, 2);
	ck_assert_int_eq(nd->attrs.dims[1], 1);
	ck_assert_ptr_nonnull(find_node(t, "tanh")); /* gelu(tanh) lowered */
	nd = find_node(t, "slice");
	ck_assert_int_eq(nd->attrs.n_slice, 2);
	ck_assert_int_eq(nd->attrs.step[1], 2);
	ck_assert_int_eq(nd->attrs.end[1].c, 5);
	bool saw = false;
	for (int i = 0; i < t->n_nodes; i++)
		saw |= t->nodes[i]->op == FZ_OP_FULL && t->nodes[i]->attrs.value == -1e30;
	ck_assert(saw);
	nd = find_node(t, "reshape");
	ck_assert_int_eq(nd->attrs.n_shape, 1);
	ck_assert_int_eq(nd->attrs.shape[0].c, 24);
	ck_assert_int_eq(fz_trace_output_count(t), 8);
	check_round_trip(m);
	fz_module_free(m);
}
END_TEST

/* uniform's seed as an operand (read at run time) beside the attribute
 * form: both parse, print back as written (no seed= for the operand) and
 * round-trip; the operand is the node's one input. */
START_TEST(test_uniform_seed_operand)
{
	fz_module *m = parse_ok(
		"trace r(x: f32[B, 4], s: i64[], t: i32[]) {\n"
		"  u = uniform(s, shape=[B, 4], offset=5, dtype=f32)\n"
		"  v = uniform(t, shape=[3], dtype=bf16)\n"
		"  w = uniform(shape=[2], seed=-7, offset=1, dtype=f64)\n"
		"  y = mul(x, u)\n"
		"  return y, v, w\n"
		"}\n");
	fz_trace *t = fz_module_trace(m, 0);
	const fz_node *nd = find_node(t, "uniform");
	ck_assert_int_eq(nd->n_in, 1);
	ck_assert_str_eq(nd->in[0]->name, "s");
	ck_assert(!(nd->attrs.present & AT(SEED)));
	ck_assert_int_eq(nd->attrs.offset, 5);
	char *text = NULL;
	ck_assert_int_eq(fz_module_print(m, &text), FZ_OK);
	ck_assert_msg(strstr(text, "u = uniform(s, dtype=f32, shape=[B, 4], "
			     "offset=5)"), "%s", text);
	ck_assert_msg(strstr(text, "v = uniform(t, dtype=bf16, shape=[3])"), "%s",
		      text);
	ck_assert_msg(strstr(text, "w = uniform(dtype=f64, shape=[2], seed=-7, "
			     "offset=1)"), "%s", text);
	free(text);
	check_round_trip(m);
	fz_module_free(m);
}
END_TEST

START_TEST(test_numbers)
{
	fz_module *m = parse_ok(
		"trace n(x: f32[4], m: bool[4]) {\n"
		"  a = add(x, -1)\n"
		"  b = mul(a, 0.044715)\n"
		"  c = sub(b, +3)\n"
		"  d = where(m, c, -inf)\n"
		"  e = maximum(d, -1E+3)\n"
		"  f = full(shape=[4], value=inf, dtype=f32)\n"
		"  g = full(shape=[4], value=nan, dtype=f32)\n"
		"  return e, f, g\n"
		"}\n");
	fz_trace *t = fz_module_trace(m, 0);
	int fulls = 0;
	bool saw_minus1 = false, saw_ninf = false, saw_inf = false, saw_nan = false;
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *nd = t->nodes[i];
		if (nd->op != FZ_OP_FULL)
			continue;
		fulls++;
		double v = nd->attrs.value;
		saw_minus1 |= v == -1;
		saw_ninf |= v < -1e308;
		saw_inf |= v > 1e308;
		saw_nan |= v != v;
	}
	ck_assert_int_ge(fulls, 6);
	ck_assert(saw_minus1 && saw_ninf && saw_inf && saw_nan);
	fz_module_free(m);
}
END_TEST

START_TEST(test_product_extents)
{
	/* The printer writes a reshaped symbolic extent as a product. */
	fz_module *m = parse_ok(
		"trace p(x: f32[B, T, 8]) {\n"
		"  r = reshape(x, shape=[B*T, 8])\n"
		"  s = reshape(r, shape=[B, T * 8])\n"
		"  return s\n"
		"}\n");
	fz_trace *t = fz_module_trace(m, 0);
	const fz_node *nd = find_node(t, "reshape");
	ck_assert_int_eq(nd->attrs.shape[0].c, 1);
	ck_assert_int_eq(__builtin_popcountll(nd->attrs.shape[0].syms), 2);
	check_round_trip(m);
	fz_module_free(m);
}
END_TEST

/* Issue 23 point 9: a product in a parameter's type; and sums, which
 * extend the grammar (a derived symbol each, ir/type.c). */
START_TEST(test_sum_extents)
{
	fz_module *m = parse_ok(
		"trace s(w: f32[B*T, 4], x: f32[B, T+1], y: f32[T - 1, 2],\n"
		"        z: f32[B*T-B, 3]) {\n"
		"  a = slice(x, start=[0, 1], end=[B, T+1])\n"
		"  b = slice(x, start=[0, 0], end=[B, T-1])\n"
		"  c = cat(a, x, dim=1)\n"
		"  f = full(shape=[2*T+2, B*T+2], value=T+1, dtype=f32)\n"
		"  r = reshape(w, shape=[B, T, 4])\n"
		"  q = reshape(b, shape=[-1])\n"
		"  return a, b, c, f, r, q\n"
		"}\n");
	fz_trace *t = fz_module_trace(m, 0);
	const fz_value *w = fz_trace_param(t, 0), *x = fz_trace_param(t, 1),
		*y = fz_trace_param(t, 2), *z = fz_trace_param(t, 3);
	int B = fz_trace_symbol_find(t, "B"), T = fz_trace_symbol_find(t, "T"),
	    T1 = fz_trace_symbol_find(t, "T+1"), Tm = fz_trace_symbol_find(t, "T-1");
	ck_assert(B >= 0 && T >= 0 && T1 >= 0 && Tm >= 0);
	ck_assert_ptr_null(t->sym_def[B]);
	ck_assert_ptr_nonnull(t->sym_def[T1]);
	fz_ext bt;
	ck_assert(fz_ext_mul(fz_ext_sym(B), fz_ext_sym(T), &bt));
	ck_assert(fz_ext_eq(w->type.dims[0], bt));
	ck_assert(fz_ext_eq(x->type.dims[1], fz_ext_sym(T1)));
	ck_assert(fz_ext_eq(y->type.dims[0], fz_ext_sym(Tm))); /* spaces: same */
	fz_ext b_tm;                            /* B*T-B is B times T-1 */
	ck_assert(fz_ext_mul(fz_ext_sym(B), fz_ext_sym(Tm), &b_tm));
	ck_assert(fz_ext_eq(z->type.dims[0], b_tm));
	/* slice [1, T+1) of T+1 is T; [0, T-1) is T-1; T + (T+1) is 2*T+1 */
	const fz_value *a = fz_trace_output(t, 0), *b = fz_trace_output(t, 1),
		*c = fz_trace_output(t, 2), *f = fz_trace_output(t, 3),
		*q = fz_trace_output(t, 5);
	ck_assert(fz_ext_eq(a->type.dims[1], fz_ext_sym(T)));
	ck_assert(fz_ext_eq(b->type.dims[1], fz_ext_sym(Tm)));
	char e[64];
	ck_assert_str_eq(fz_ext_str(t, c->type.dims[1], e, sizeof e), "2*T+1");
	/* 2*T+2 is 2 times the symbol T+1, not a symbol of its own */
	ck_assert(fz_ext_eq(f->type.dims[0], (fz_ext){2, fz_ext_sym(T1).syms}));
	ck_assert_str_eq(fz_ext_str(t, f->type.dims[0], e, sizeof e), "2*T+2");
	ck_assert_str_eq(fz_ext_str(t, f->type.dims[1], e, sizeof e), "B*T+2");
	ck_assert_int_eq(find_node(t, "full")->attrs.value_sym, T1);
	ck_assert(fz_ext_eq(q->type.dims[0], b_tm)); /* reshape's -1: B*(T-1) */
	int64_t sizes[FZ_MAX_SYMS];
	for (int i = 0; i < FZ_MAX_SYMS; i++)
		sizes[i] = -1;
	sizes[B] = 3;
	sizes[T] = 5;
	ck_assert_int_eq(fz_trace_syms_derive(t, sizes, e, sizeof e), 4);
	ck_assert_int_eq(fz_value_extent(z, 0, sizes), 12);
	ck_assert_int_eq(fz_value_extent(c, 1, sizes), 11);
	ck_assert_int_eq(fz_value_extent(f, 1, sizes), 17);
	check_round_trip(m);
	fz_module_free(m);
}
END_TEST

START_TEST(test_multiple_results)
{
	fz_module *m = parse_ok(
		"trace vm(x: f32[4, 8]) {\n"
		"  v, mu = var_mean(x, dims=[1], correction=1, keepdim=true)\n"
		"  d = sub(x, mu)\n"
		"  return v, d, mu\n"
		"}\n");
	fz_trace *t = fz_module_trace(m, 0);
	const fz_node *nd = find_node(t, "var_mean");
	ck_assert_int_eq(nd->n_out, 2);
	ck_assert_str_eq(fz_value_name(nd->out[0]), "v");
	ck_assert_str_eq(fz_value_name(nd->out[1]), "mu");
	ck_assert_int_eq(nd->attrs.correction, 1);
	ck_assert_int_eq(fz_trace_output_count(t), 3);
	ck_assert_ptr_eq(fz_trace_output(t, 2), nd->out[1]);
	check_round_trip(m);
	fz_module_free(m);
}
END_TEST

START_TEST(test_several_traces_comments_crlf)
{
	const char *src =
		"# a file of two traces\r\n"
		"\r\n"
		"trace one(x: f32[2]) {   # the first\r\n"
		"\ty = neg(x)  # tab-indented\r\n"
		"\treturn y\r\n"
		"}\r\n"
		"# between\r\n"
		"trace two(x: f32[2],\r\n"
		"          w: f32[2]) {\r\n"
		"  z = add(x,\r\n"
		"          w)\r\n"
		"  return z, x\r\n"
		"}"; /* no newline at the end */
	fz_module *m = parse_ok(src);
	ck_assert_int_eq(fz_module_count(m), 2);
	ck_assert_str_eq(fz_trace_name(fz_module_trace(m, 0)), "one");
	ck_assert_str_eq(fz_trace_name(fz_module_trace(m, 1)), "two");
	ck_assert_int_eq(fz_trace_output_count(fz_module_trace(m, 1)), 2);
	ck_assert_ptr_null(fz_module_trace(m, 2));
	ck_assert_ptr_null(fz_module_trace(m, -1));
	check_round_trip(m);
	fz_module_free(m);
}
END_TEST

START_TEST(test_node_locations)
{
	fz_module *m = parse_ok(
		"trace loc(x: f32[2]) {\n"
		"  y = neg(x)\n"
		"  z = add(y,\n"
		"     exp(x))\n"
		"  return z\n"
		"}\n");
	fz_trace *t = fz_module_trace(m, 0);
	const fz_node *nd = find_node(t, "neg");
	ck_assert_int_eq(nd->line, 2);
	ck_assert_int_eq(nd->col, 7);
	nd = find_node(t, "exp");
	ck_assert_int_eq(nd->line, 4);
	ck_assert_int_eq(nd->col, 6);
	nd = find_node(t, "add");
	ck_assert_int_eq(nd->line, 3);
	ck_assert_int_eq(nd->col, 7);
	fz_module_free(m);
}
END_TEST

START_TEST(test_names_and_symbols_apart)
{
	/* Extent names and value names are separate namespaces. */
	fz_module *m = parse_ok(
		"trace s(B: f32[B, 2], T: f32[T]) {\n"
		"  return_ = neg(B)\n"
		"  trace = neg(T)\n"
		"  world = exp(trace)\n"
		"  return return_, world\n"
		"}\n");
	fz_trace *t = fz_module_trace(m, 0);
	ck_assert_int_eq(fz_trace_symbol_count(t), 2);
	ck_assert_ptr_nonnull(fz_lookup(t, "B"));
	ck_assert_ptr_nonnull(fz_lookup(t, "world"));
	fz_module_free(m);
}
END_TEST

START_TEST(test_corpus)
{
	char dir[512];
	snprintf(dir, sizeof dir, "%s/tests/traces", FZ_SOURCE_DIR);
	DIR *d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	int files = 0, parsed = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t n = strlen(e->d_name);
		if (n < 7 || strcmp(e->d_name + n - 6, ".trace") != 0)
			continue;
		char path[1024];
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		fz_module *m = NULL;
		char *diag = NULL;
		fz_status st = fz_module_parse_file(path, &m, &diag);
		files++;
		ck_assert_msg(st == FZ_OK, "%s does not parse:\n%s", e->d_name,
			      diag ? diag : "(no diagnostic)");
		ck_assert_ptr_null(diag);
		parsed++;
		ck_assert_int_ge(fz_module_count(m), 1);
		check_round_trip(m);
		fz_module_free(m);
	}
	closedir(d);
	ck_assert_int_gt(files, 0);
	ck_assert_int_eq(parsed, files);
}
END_TEST

START_TEST(test_parse_file_errors)
{
	fz_module *m = (fz_module *)1;
	char *diag = NULL;
	ck_assert_int_eq(fz_module_parse_file("/nonexistent/x.trace", &m, &diag),
			 FZ_EIO);
	ck_assert_ptr_null(m);
	ck_assert_ptr_nonnull(diag);
	ck_assert_msg(strstr(diag, "cannot read /nonexistent/x.trace: ") == diag,
		      "%s", diag);
	free(diag);
	ck_assert_int_eq(fz_module_parse_file("/", &m, &diag), FZ_EIO);
	ck_assert_ptr_nonnull(strstr(diag, "cannot read /: "));
	free(diag);
	/* a NULL out or diag is allowed */
	ck_assert_int_eq(fz_module_parse("trace f() {", 11, NULL, NULL, NULL),
			 FZ_EPARSE);
	ck_assert_int_eq(fz_module_parse("trace f(x: f32[]) { return x }", 30,
					 NULL, NULL, NULL), FZ_OK);
	fz_module_free(NULL);
	ck_assert_int_eq(fz_module_count(NULL), 0);
}
END_TEST

/* ---- diagnostics ---- */

#define HDR "trace f(x: f32[2], w: f32[3]) {\n"

typedef struct diag_case {
	const char *src;
	int line, col;
	const char *msg;
	fz_status status;
} diag_case;

static const diag_case diag_cases[] = {
	/* extents that are sums */
	{"trace f(x: f32[T+]) {\n  return x\n}\n", 1, 18,
	 "expected an extent (an integer or a name), found ']'", FZ_EPARSE},
	{"trace f(x: f32[T+1]) {\n  y = slice(x, start=[0], end=[T+T+2])\n"
	 "  return y\n}\n", 2, 7, "slice: end 2*T+2 in dim 0 passes the extent "
	 "T+1", FZ_EVERIFY},
	{"trace f(x: f32[T]) {\n  y = slice(x, start=[0], end=[T], step=[2])\n"
	 "  return y\n}\n", 2, 7, "it takes step 1 and a start >= 0",
	 FZ_EVERIFY},
	{"trace f(x: f32[T]) {\n  y = full(shape=[-T], value=0, dtype=f32)\n"
	 "  return y\n}\n", 2, 7, "entry 0 of 'shape' must be an extent",
	 FZ_EVERIFY},
	{"trace f(x: f32[T], y: f32[T+1]) {\n  z = add(x, y)\n"
	 "  return z\n}\n", 2, 7, "operand 2 has extent T+1 where another has T",
	 FZ_EVERIFY},
	/* unexpected tokens */
	{HDR "  y = neg(x x)\n  return y\n}\n", 2, 13,
	 "expected ',' or ')' after an argument, found 'x'", FZ_EPARSE},
	{HDR "  y neg(x)\n  return y\n}\n", 2, 5,
	 "expected '=' or ',' after a name, found 'neg'", FZ_EPARSE},
	{HDR "  y = x\n  return y\n}\n", 3, 3,
	 "expected '(' after the op name, found 'return'", FZ_EPARSE},
	{HDR "  y = 3\n  return y\n}\n", 2, 7, "expected an op name, found '3'",
	 FZ_EPARSE},
	{HDR "  y = neg(,)\n  return y\n}\n", 2, 11,
	 "expected an operand or an attribute, found ','", FZ_EPARSE},
	{HDR "  y = sum(x, dims=[0 1])\n  return y\n}\n", 2, 22,
	 "expected ',' or ']' in a list, found '1'", FZ_EPARSE},
	{HDR "  y = sum(x, dims=)\n  return y\n}\n", 2, 19,
	 "expected a value (a number, a name or a list), found ')'", FZ_EPARSE},
	{"trace f(x f32[2]) {\n  return x\n}\n", 1, 11,
	 "expected ':' after the parameter name, found 'f32'", FZ_EPARSE},
	{"trace f(x: f32[2] {\n  return x\n}\n", 1, 19,
	 "expected ',' or ')' after a parameter, found '{'", FZ_EPARSE},
	{"trace f(x: f32[2,]) {\n  return x\n}\n", 1, 18,
	 "expected an extent (an integer or a name), found ']'", FZ_EPARSE},
	{"trace f(x: f32) {\n  return x\n}\n", 1, 15,
	 "expected '[' after the dtype, found ')'", FZ_EPARSE},
	{"trace (x: f32[2]) {\n  return x\n}\n", 1, 7,
	 "expected a trace name after 'trace', found '('", FZ_EPARSE},
	{"trace f[x: f32[2]) {\n  return x\n}\n", 1, 8,
	 "expected '(' after the trace name, found '['", FZ_EPARSE},
	{"trace f(x: f32[2]) world {\n  return x\n}\n", 1, 26,
	 "expected the number of ranks after 'world', found '{'", FZ_EPARSE},
	{"trace f(x: f32[2]) }\n", 1, 20,
	 "expected '{' to open the trace body, found '}'", FZ_EPARSE},
	{"tracer f() {}\n", 1, 1, "expected 'trace', found 'tracer'", FZ_EPARSE},
	{HDR "  return x\n  y = neg(x)\n}\n", 3, 3,
	 "expected '}' after the returned values, found 'y'", FZ_EPARSE},
	{HDR "  return\n}\n", 3, 1,
	 "expected the name of a value to return, found '}'", FZ_EPARSE},
	{HDR "  y = neg(x) @\n  return y\n}\n", 2, 14, "unexpected character '@'",
	 FZ_EPARSE},
	/* uniform's seed operand */
	{"trace f(s: i64[]) {\n  y = uniform(s, shape=[2], seed=1, dtype=f32)\n"
	 "  return y\n}\n", 2, 7, "uniform: the seed is given twice, as operand 1 "
	 "('s', i64[]) and as the attribute seed=", FZ_EVERIFY},
	{"trace f(s: i64[2]) {\n  y = uniform(s, shape=[2], dtype=f32)\n"
	 "  return y\n}\n", 2, 7, "uniform: the seed, operand 1 ('s', i64[2]), "
	 "must be a rank-0 i64 or i32", FZ_EVERIFY},
	{"trace f(s: f32[]) {\n  y = uniform(s, shape=[2], dtype=f32)\n"
	 "  return y\n}\n", 2, 7, "must be a rank-0 i64 or i32", FZ_EVERIFY},
	{"trace f(s: i64[]) {\n  y = uniform(7, shape=[2], dtype=f32)\n"
	 "  return y\n}\n", 2, 7, "uniform: operand 1 is a number; expected a "
	 "tensor", FZ_EVERIFY},
	{"trace f(s: i64[]) {\n  y = uniform(s, s, shape=[2], dtype=f32)\n"
	 "  return y\n}\n", 2, 7, "uniform: 2 operands; expected 0 to 1",
	 FZ_EVERIFY},
	/* scans and selection */
	{HDR "  y, i = topk(x, k=3, dim=0)\n  return y\n}\n", 2, 10,
	 "topk: k=3 exceeds extent 2 of dim 0", FZ_EVERIFY},
	{HDR "  y, i = topk(x, k=0, dim=0)\n  return y\n}\n", 2, 10,
	 "topk: k=0; expected 1 or more", FZ_EVERIFY},
	{"trace f(x: f32[T]) {\n  y, i = topk(x, k=1, dim=0)\n  return y\n}\n",
	 2, 10, "(a symbolic extent: k must not exceed a known one)", FZ_EVERIFY},
	{HDR "  y = topk(x, dim=0)\n  return y\n}\n", 2, 7,
	 "topk: missing attribute k", FZ_EVERIFY},
	{HDR "  y = cumsum(x, dim=1)\n  return y\n}\n", 2, 7,
	 "cumsum: dim 1 is out of range for rank 1", FZ_EVERIFY},
	{"trace f(x: bool[2]) {\n  y = argmax(x, dim=0)\n  return y\n}\n", 2, 7,
	 "argmax: operand 1 ('x', bool[2]) is bool; expected a numeric dtype",
	 FZ_EVERIFY},
	{"trace f(x: f32[0]) {\n  y = argmin(x, dim=0)\n  return y\n}\n", 2, 7,
	 "argmin: dim 0 is empty (extent 0): the index of the minimum of no "
	 "elements is undefined", FZ_EVERIFY},
	/* unknown dtype */
	{"trace f(x: f31[2]) {\n  return x\n}\n", 1, 12, "unknown dtype 'f31'",
	 FZ_EVERIFY},
	{HDR "  y = cast(x, dtype=f31)\n  return y\n}\n", 2, 21,
	 "unknown dtype 'f31'", FZ_EVERIFY},
	/* names */
	{HDR "  y = neg(z)\n  return y\n}\n", 2, 11, "undefined value 'z'",
	 FZ_EVERIFY},
	{HDR "  y = neg(x)\n  return q\n}\n", 3, 10, "undefined value 'q'",
	 FZ_EVERIFY},
	{HDR "  y = neg(x)\n  y = neg(y)\n  return y\n}\n", 3, 3,
	 "redefinition of 'y' (first defined at line 2)", FZ_EVERIFY},
	{HDR "  x = neg(w)\n  return x\n}\n", 2, 3,
	 "redefinition of 'x' (first defined at line 1)", FZ_EVERIFY},
	{"trace f(x: f32[2],\n        x: f32[3]) {\n  return x\n}\n", 2, 9,
	 "redefinition of 'x' (first defined at line 1)", FZ_EVERIFY},
	{HDR "  a, a = var_mean(x, dims=[0])\n  return a\n}\n", 2, 6,
	 "'a' is bound twice", FZ_EVERIFY},
	{"trace f(x: f32[2]) {\n  return x\n}\ntrace f(x: f32[2]) {\n"
	 "  return x\n}\n", 4, 7, "redefinition of trace 'f' (first defined at "
	 "line 1)", FZ_EVERIFY},
	/* results */
	{HDR "  y = var_mean(x, dims=[0])\n  return y\n}\n", 2, 7,
	 "op 'var_mean' returns 2 values but 1 name is given", FZ_EVERIFY},
	{HDR "  a, b = neg(x)\n  return a\n}\n", 2, 10,
	 "op 'neg' returns 1 value but 2 names are given", FZ_EVERIFY},
	{HDR "  y = neg(var_mean(x, dims=[0]))\n  return y\n}\n", 2, 11,
	 "only an op with one result can be nested", FZ_EVERIFY},
	/* structure */
	{HDR "  y = neg(x)\n}\n", 3, 1, "missing return in trace 'f'", FZ_EPARSE},
	{HDR "  y = neg(x)\n", 1, 7, "unterminated trace 'f'", FZ_EPARSE},
	{HDR "  y = neg(x)\n  return y\n", 1, 7, "unterminated trace 'f'",
	 FZ_EPARSE},
	{HDR "  y = neg(x)\ntrace g(x: f32[2]) {\n  return x\n}\n", 1, 7,
	 "unterminated trace 'f': the next trace", FZ_EPARSE},
	{"", 1, 1, "no trace in file", FZ_EPARSE},
	{"# only a comment\n\n", 1, 1, "no trace in file", FZ_EPARSE},
	/* numbers */
	{HDR "  y = add(x, 1e)\n  return y\n}\n", 2, 14, "bad number '1e'",
	 FZ_EPARSE},
	{HDR "  y = add(x, 1.2.3)\n  return y\n}\n", 2, 14, "bad number '1.2.3'",
	 FZ_EPARSE},
	{HDR "  y = add(x, 12abc)\n  return y\n}\n", 2, 14, "bad number '12abc'",
	 FZ_EPARSE},
	{HDR "  y = add(x, 99999999999999999999)\n  return y\n}\n", 2, 14,
	 "integer '99999999999999999999' out of range", FZ_EVERIFY},
	{HDR "  y = add(x, -9223372036854775809)\n  return y\n}\n", 2, 14,
	 "out of range", FZ_EVERIFY},
	{HDR "  y = add(x, 1e999)\n  return y\n}\n", 2, 14,
	 "number '1e999' out of range", FZ_EVERIFY},
	{HDR "  y = sum(x, dims=[99999999999999999999])\n  return y\n}\n", 2, 20,
	 "out of range", FZ_EVERIFY},
	{"trace f(x: f32[99999999999999999999]) {\n  return x\n}\n", 1, 16,
	 "extent '99999999999999999999' out of range", FZ_EVERIFY},
	{"trace f(x: f32[1,2,3,4,5,6,7,8,9]) {\n  return x\n}\n", 1, 32,
	 "too many extents (the largest rank is 8)", FZ_EVERIFY},
	{"trace f(x: f32[2]) world 99999999999 {\n  return x\n}\n", 1, 26,
	 "world size '99999999999' out of range", FZ_EVERIFY},
	/* the builder's and the verifier's errors */
	{HDR "  y = foo(x)\n  return y\n}\n", 2, 7, "unknown op 'foo'", FZ_EVERIFY},
	{HDR "  y = add(x, w)\n  return y\n}\n", 2, 7, "broadcast", FZ_EVERIFY},
	{HDR "  y = neg(x, foo=1)\n  return y\n}\n", 2, 14,
	 "unknown attribute 'foo'", FZ_EVERIFY},
	{HDR "  y = sum(x, dims=[0], dims=[0])\n  return y\n}\n", 2, 24,
	 "attribute 'dims' given twice", FZ_EVERIFY},
	{HDR "  y = neg(x, x)\n  return y\n}\n", 2, 7, "neg: 2 operands",
	 FZ_EVERIFY},
	{"trace f(x: f32[2]) world 0 {\n  return x\n}\n", 1, 26,
	 "world size 0 is out of range", FZ_EVERIFY},
	{"trace f(x: f32[-2]) {\n  return x\n}\n", 1, 9, "negative",
	 FZ_EVERIFY},
	{HDR "  g = all_reduce(x)\n  return g\n}\n", 3, 3, "future", FZ_EVERIFY},
	{HDR "  g = all_reduce(x)\n  y = neg(x)\n  return y\n}\n", 2, 3,
	 "never waited on", FZ_EVERIFY},
	/* bytes that are not text */
	{"\x01\x02\xff", 1, 1, "invalid byte 0x01 in input", FZ_EPARSE},
	{"\xff\xfe trace", 1, 1, "invalid byte 0xff in input", FZ_EPARSE},
};

START_TEST(test_diag_case)
{
	const diag_case *c = &diag_cases[_i];
	char *diag = parse_fail(c->src, strlen(c->src), c->status);
	check_diag(diag, c->line, c->col, c->msg);
	ck_assert_msg(count_errors(diag) == 1, "more than one error:\n%s", diag);
	free(diag);
}
END_TEST

START_TEST(test_diag_echo_and_tabs)
{
	const char *src = "trace f(x: f32[2]) {\n\t y = neg(z)\n  return x\n}\n";
	char *diag = parse_fail(src, strlen(src), FZ_EVERIFY);
	check_diag_k(diag, 0, 2, 11, "undefined value 'z'", "\t y = neg(z)");
	ck_assert_str_eq(diag, "t.trace:2:11: error: undefined value 'z'\n"
			 "\t y = neg(z)\n"
			 "\t         ^\n");
	free(diag);

	/* CRLF: the '\r' is not echoed */
	src = "trace f(x: f32[2]) {\r\n  y = neg(z)\r\n  return x\r\n}\r\n";
	diag = parse_fail(src, strlen(src), FZ_EVERIFY);
	check_diag_k(diag, 0, 2, 11, "undefined value 'z'", "  y = neg(z)");
	free(diag);

	/* The end of file, after the last token. */
	src = "trace f(x: f32[2]) {\n  y = neg(x";
	diag = parse_fail(src, strlen(src), FZ_EPARSE);
	check_diag_k(diag, 0, 2, 12, "found end of file", "  y = neg(x");
	free(diag);
}
END_TEST

START_TEST(test_diag_nul_bytes)
{
	static const char src[] = "trace f(x: f32[2]) {\n  y = neg(x)\0\n"
				  "  return y\n}\n";
	char *diag = parse_fail(src, sizeof src - 1, FZ_EPARSE);
	check_diag(diag, 2, 13, "NUL byte in input");
	ck_assert_int_eq(count_errors(diag), 1);
	free(diag);

	/* in a comment too */
	static const char src2[] = "# a \0 b\ntrace f(x: f32[2]) {\n  return x\n}\n";
	diag = parse_fail(src2, sizeof src2 - 1, FZ_EPARSE);
	check_diag(diag, 1, 5, "NUL byte in input");
	free(diag);

	/* a lone NUL */
	diag = parse_fail("\0", 1, FZ_EPARSE);
	check_diag(diag, 1, 1, "NUL byte");
	free(diag);
}
END_TEST

START_TEST(test_diag_multiple)
{
	const char *src =
		"trace f(x: f32[2], w: f32[3]) {\n"   /* 1 */
		"  a = neg(q)\n"                       /* 2: undefined q */
		"  b = neg(a)\n"                       /* 3: a poisoned, quiet */
		"  c = add(x x)\n"                     /* 4: syntax */
		"  d = exp(x)\n"                       /* 5: fine */
		"  e = add(x, w)\n"                    /* 6: broadcast */
		"  f2 = foo(d)\n"                      /* 7: unknown op */
		"  return d\n"
		"}\n"
		"trace g(x: f32[2]) {\n"               /* 10 */
		"  y = neg(x,\n"
		"          bad=1)\n"                   /* 12: unknown attribute */
		"  return y\n"
		"}\n"
		"trace h(x: f33[2]) {\n"               /* 15: unknown dtype */
		"  y = neg(x)\n"                       /* x poisoned: quiet */
		"  return y\n"
		"}\n";
	char *diag = parse_fail(src, strlen(src), FZ_EPARSE);
	ck_assert_msg(count_errors(diag) == 6, "%s", diag);
	check_diag_k(diag, 0, 2, 11, "undefined value 'q'", "  a = neg(q)");
	check_diag_k(diag, 1, 4, 13, "expected ',' or ')'", "  c = add(x x)");
	check_diag_k(diag, 2, 6, 7, "broadcast", "  e = add(x, w)");
	check_diag_k(diag, 3, 7, 8, "unknown op 'foo'", "  f2 = foo(d)");
	check_diag_k(diag, 4, 12, 11, "unknown attribute 'bad'", NULL);
	check_diag_k(diag, 5, 15, 12, "unknown dtype 'f33'", NULL);
	free(diag);
}
END_TEST

START_TEST(test_diag_recovery_from_header)
{
	/* A broken parameter list: the body is still read for its own
	 * errors, but names it cannot know are not reported. */
	const char *src =
		"trace f(x: f32[2] w: f32[2]) {\n"
		"  y = add(x, w)\n"
		"  z = neg(y y)\n"
		"  return z\n"
		"}\n";
	char *diag = parse_fail(src, strlen(src), FZ_EPARSE);
	ck_assert_msg(count_errors(diag) == 2, "%s", diag);
	check_diag_k(diag, 0, 1, 19, "expected ',' or ')' after a parameter", NULL);
	check_diag_k(diag, 1, 3, 13, "expected ',' or ')'", NULL);
	free(diag);
}
END_TEST

START_TEST(test_diag_too_many)
{
	char src[8192];
	size_t n = (size_t)snprintf(src, sizeof src, "trace f(x: f32[2]) {\n");
	for (int i = 0; i < 30; i++)
		n += (size_t)snprintf(src + n, sizeof src - n, "  y%d = neg(q%d)\n", i, i);
	n += (size_t)snprintf(src + n, sizeof src - n, "  return x\n}\n");
	char *diag = parse_fail(src, n, FZ_EVERIFY);
	ck_assert_int_eq(count_errors(diag), 21);
	check_diag_k(diag, 0, 2, 12, "undefined value 'q0'", NULL);
	check_diag_k(diag, 19, 21, 13, "undefined value 'q19'", NULL);
	check_diag_k(diag, 20, 22, 13, "too many errors", NULL);
	free(diag);
}
END_TEST

START_TEST(test_diag_deep_nesting)
{
	/* 300 levels: the error is at the 201st call. */
	char src[4096];
	size_t n = (size_t)snprintf(src, sizeof src, "trace f(x: f32[2]) {\n  y = ");
	for (int i = 0; i < 300; i++)
		n += (size_t)snprintf(src + n, sizeof src - n, "neg(");
	src[n++] = 'x';
	for (int i = 0; i < 300; i++)
		src[n++] = ')';
	n += (size_t)snprintf(src + n, sizeof src - n, "\n  return y\n}\n");
	char *diag = parse_fail(src, n, FZ_EPARSE);
	ck_assert_int_eq(count_errors(diag), 1);
	check_diag(diag, 2, 7 + 4 * 200, "expression nested too deeply");
	free(diag);

	/* 200 levels are fine */
	n = (size_t)snprintf(src, sizeof src, "trace f(x: f32[2]) {\n  y = ");
	for (int i = 0; i < 200; i++)
		n += (size_t)snprintf(src + n, sizeof src - n, "neg(");
	src[n++] = 'x';
	for (int i = 0; i < 200; i++)
		src[n++] = ')';
	n += (size_t)snprintf(src + n, sizeof src - n, "\n  return y\n}\n");
	fz_module *m = NULL;
	char *d = NULL;
	ck_assert_int_eq(parse_n(src, n, &m, &d), FZ_OK);
	ck_assert_int_eq(fz_trace_op_count(fz_module_trace(m, 0)), 200);
	fz_module_free(m);
}
END_TEST

START_TEST(test_diag_long_line)
{
	/* An error at the end of a 100 kB line: the echo is a window. */
	size_t pad = 100000;
	char *src = malloc(pad + 200);
	size_t n = (size_t)sprintf(src, "trace f(x: f32[2]) {\n  y = neg(x");
	for (size_t i = 0; i < pad; i++)
		src[n++] = ' ';
	n += (size_t)sprintf(src + n, "z)\n  return y\n}\n");
	char *diag = parse_fail(src, n, FZ_EPARSE);
	char file[64];
	int l, c;
	ck_assert_int_eq(sscanf(diag, "%63[^:]:%d:%d:", file, &l, &c), 3);
	ck_assert_int_eq(l, 2);
	ck_assert_int_eq(c, (int)(12 + pad));
	ck_assert_uint_lt(strlen(diag), 1000);
	/* the caret is under the 'z' of the echoed window */
	const char *echo = strchr(diag, '\n') + 1, *caret = strchr(echo, '\n') + 1;
	const char *hat = strchr(caret, '^');
	ck_assert_ptr_nonnull(hat);
	ck_assert_int_eq(echo[hat - caret], 'z');
	free(diag);
	free(src);
}
END_TEST

/* ---- robustness ---- */

START_TEST(test_very_deep_nesting)
{
	/* 100000 nested calls and lists: no stack overflow, one error each. */
	size_t depth = 100000;
	char *src = malloc(depth * 6 + 200);
	size_t n = (size_t)sprintf(src, "trace f(x: f32[2]) {\n  y = ");
	for (size_t i = 0; i < depth; i++)
		memcpy(src + n, "neg(", 4), n += 4;
	src[n++] = 'x';
	memset(src + n, ')', depth);
	n += depth;
	n += (size_t)sprintf(src + n, "\n  z = sum(x, dims=");
	memset(src + n, '[', depth);
	n += depth;
	n += (size_t)sprintf(src + n, "\n  return x\n}\n");
	char *diag = parse_fail(src, n, FZ_EPARSE);
	ck_assert_int_eq(count_errors(diag), 2);
	ck_assert_ptr_nonnull(strstr(diag, "expression nested too deeply"));
	ck_assert_ptr_nonnull(strstr(diag, "list nested too deeply"));
	free(diag);
	free(src);
}
END_TEST

START_TEST(test_token_counts)
{
	/* Inputs of 1 to 600 tokens, across the growth of the token array. */
	char *src = malloc(2 * 600);
	for (size_t n = 1; n <= 600; n++) {
		for (size_t i = 0; i < n; i++)
			src[2 * i] = 'x', src[2 * i + 1] = ' ';
		char *diag = parse_fail(src, 2 * n - 1, FZ_EPARSE);
		check_diag(diag, 1, 1, "expected 'trace', found 'x'");
		free(diag);
	}
	free(src);
}
END_TEST

/* A trace of n chained statements, each on its own line (line 3 + i),
 * "  v<i> = add(v<i-1>, x)  # padding", long enough past a few thousand
 * statements to be lexed in two halves (frontend/parse.c). The statement
 * at index bad, when not -1, reads an undefined value. */
static char *chain_src(int n, int bad, size_t *len)
{
	size_t cap = (size_t)n * 96 + 256, k = 0;
	char *s = malloc(cap);
	ck_assert_ptr_nonnull(s);
	k += (size_t)snprintf(s + k, cap - k, "# a long chain\n"
			      "trace t(x: f32[8]) {\n  v0 = neg(x)\n");
	for (int i = 1; i < n; i++)
		k += (size_t)snprintf(s + k, cap - k,
				      "  v%d = add(v%d, %s)  # padding padding\n",
				      i, i - 1, i == bad ? "nope" : "x");
	k += (size_t)snprintf(s + k, cap - k, "  return v%d\n}\n", n - 1);
	*len = k;
	return s;
}

START_TEST(test_big_input_two_halves)
{
	/* 12,000 statements: 500 KB, past the split; every node is there, in
	 * order, wherever the split fell */
	int n = 12000;
	size_t len;
	char *src = chain_src(n, -1, &len);
	ck_assert_uint_gt(len, 256 << 10);
	fz_module *m = NULL;
	char *diag = NULL;
	ck_assert_int_eq(parse_n(src, len, &m, &diag), FZ_OK);
	ck_assert_ptr_null(diag);
	const fz_trace *t = fz_module_trace(m, 0);
	ck_assert_int_eq(fz_trace_op_count(t), n);
	ck_assert_ptr_eq(t->nodes[n - 1]->in[0]->def, t->nodes[n - 2]);
	ck_assert_int_eq(t->nodes[n - 1]->line, n + 2);
	fz_module_free(m);
	free(src);
	/* errors in either half are reported at their exact line and column */
	for (int k = 0; k < 2; k++) {
		int bad = k ? n - 7 : 11;
		src = chain_src(n, bad, &len);
		diag = parse_fail(src, len, FZ_EVERIFY);
		char col_of[64];
		int col = snprintf(col_of, sizeof col_of, "  v%d = add(v%d, ", bad,
				   bad - 1) + 1;
		check_diag(diag, bad + 3, col, "undefined value 'nope'");
		free(diag);
		free(src);
	}
}
END_TEST

static const char valid_src[] =
	"# a valid trace, cut at every length\n"
	"trace t(x: bf16[B, T, 64], w: bf16[64], m: bool[64]) world 2 {\n"
	"  xf = cast(x, dtype=f32)\n"
	"  v, mu = var_mean(xf, dims=[2], correction=0, keepdim=true)\n"
	"  y = mul(sub(xf, mu), rsqrt(add(v, 1e-5)))\n"
	"  z = where(m, y, -1e30)\n"
	"  r = reshape(z, shape=[B*T, 64])\n"
	"  s = sum(r, dims=[-1], keepdim=false)\n"
	"  return s, y\n"
	"}\n"
	"trace u(a: f32[]) {\n"
	"  b = neg(a)\n"
	"  return b\n"
	"}\n";

START_TEST(test_every_prefix)
{
	size_t len = sizeof valid_src - 1;
	int ok = 0;
	for (size_t n = 0; n <= len; n++) {
		fz_module *m = NULL;
		char *diag = NULL;
		fz_status st = parse_n(valid_src, n, &m, &diag);
		if (st == FZ_OK) {
			ck_assert_ptr_nonnull(m);
			ck_assert_ptr_null(diag);
			ok++;
		} else {
			ck_assert_msg(st == FZ_EPARSE || st == FZ_EVERIFY,
				      "prefix %zu: status %s", n, fz_status_name(st));
			ck_assert_ptr_null(m);
			ck_assert_msg(diag && strncmp(diag, FILE_NAME ":", 8) == 0,
				      "prefix %zu: no diagnostic", n);
			ck_assert_int_ge(count_errors(diag), 1);
		}
		fz_module_free(m);
		free(diag);
	}
	/* The whole text, and the text cut just after the first trace. */
	ck_assert_int_ge(ok, 2);
}
END_TEST

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

START_TEST(test_garbage)
{
	/* Random bytes, and random printable tokens. */
	static const char *const words[] = {
		"trace", "f", "(", ")", "[", "]", "{", "}", ",", "=", ":", "*",
		"x", "f32", "B", "return", "neg", "add", "var_mean", "dims", "1",
		"-1", "1e5", "\n", " ", "#c\n", "world", "true", "\0", "\xff", "inf",
	};
	char buf[512];
	for (int iter = 0; iter < 3000; iter++) {
		size_t n = rng() % sizeof buf;
		if (iter % 2) {
			for (size_t i = 0; i < n; i++)
				buf[i] = (char)rng();
		} else {
			size_t k = 0;
			while (k < n) {
				const char *w = words[rng() % (sizeof words / sizeof *words)];
				size_t wl = w[0] ? strlen(w) : 1;
				if (k + wl > n)
					break;
				memcpy(buf + k, w, wl);
				k += wl;
			}
			n = k;
		}
		fz_module *m = NULL;
		char *diag = NULL;
		fz_status st = parse_n(buf, n, &m, &diag);
		ck_assert(st == FZ_OK || (diag && !m));
		fz_module_free(m);
		free(diag);
	}
}
END_TEST

START_TEST(test_mutations)
{
	/* Flip, delete or insert bytes of a valid trace; whatever parses must
	 * print and parse again to the same graphs. */
	size_t len = sizeof valid_src - 1;
	char buf[sizeof valid_src + 8];
	static const char alphabet[] = "()[]{},=:*-+.e0123456789xyzBT \n\t#";
	int parsed = 0;
	for (int iter = 0; iter < 3000; iter++) {
		memcpy(buf, valid_src, len);
		size_t n = len;
		for (int k = 0; k < 1 + (int)(rng() % 3); k++) {
			size_t at = rng() % n;
			char c = alphabet[rng() % (sizeof alphabet - 1)];
			switch (rng() % 3) {
			case 0: buf[at] = c; break;
			case 1: memmove(buf + at, buf + at + 1, n - at - 1); n--; break;
			default:
				if (n < sizeof buf) {
					memmove(buf + at + 1, buf + at, n - at);
					buf[at] = c;
					n++;
				}
			}
		}
		fz_module *m = NULL;
		char *diag = NULL;
		fz_status st = parse_n(buf, n, &m, &diag);
		if (st == FZ_OK) {
			parsed++;
			check_round_trip(m);
		} else {
			ck_assert_ptr_nonnull(diag);
		}
		fz_module_free(m);
		free(diag);
	}
	ck_assert_int_gt(parsed, 0);
}
END_TEST

Suite *parse_suite(void)
{
	Suite *s = suite_create("parse");

	TCase *tc = tcase_create("grammar");
	tcase_add_test(tc, test_params_types);
	tcase_add_test(tc, test_no_params_and_world);
	tcase_add_test(tc, test_nested_exprs);
	tcase_add_test(tc, test_attrs_every_kind);
	tcase_add_test(tc, test_uniform_seed_operand);
	tcase_add_test(tc, test_numbers);
	tcase_add_test(tc, test_product_extents);
	tcase_add_test(tc, test_sum_extents);
	tcase_add_test(tc, test_multiple_results);
	tcase_add_test(tc, test_several_traces_comments_crlf);
	tcase_add_test(tc, test_node_locations);
	tcase_add_test(tc, test_names_and_symbols_apart);
	tcase_add_test(tc, test_corpus);
	tcase_add_test(tc, test_parse_file_errors);
	suite_add_tcase(s, tc);

	tc = tcase_create("diagnostics");
	tcase_add_loop_test(tc, test_diag_case, 0,
			    (int)(sizeof diag_cases / sizeof *diag_cases));
	tcase_add_test(tc, test_diag_echo_and_tabs);
	tcase_add_test(tc, test_diag_nul_bytes);
	tcase_add_test(tc, test_diag_multiple);
	tcase_add_test(tc, test_diag_recovery_from_header);
	tcase_add_test(tc, test_diag_too_many);
	tcase_add_test(tc, test_diag_deep_nesting);
	tcase_add_test(tc, test_diag_long_line);
	suite_add_tcase(s, tc);

	tc = tcase_create("robustness");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_very_deep_nesting);
	tcase_add_test(tc, test_token_counts);
	tcase_add_test(tc, test_big_input_two_halves);
	tcase_add_test(tc, test_every_prefix);
	tcase_add_test(tc, test_garbage);
	tcase_add_test(tc, test_mutations);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(parse_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed != 0;
}
