/*
 * test_builder.c: the C builder API, the one path into the IR.
 *
 * Builds traces without text and checks what the builder promises: types
 * inferred for every op, literals typed by their neighbour, broadcasting
 * made explicit, composites lowered to primitives only, attributes checked
 * against the op table, negative dims normalized, and a failed op leaving
 * the trace exactly as it was. The same traces written as text must give
 * the same graph, since the parser is a client of the builder.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusec.h"
#include "ir.h"

static fz_trace *t;

static void setup(void) { t = fz_trace_new("b"); }
static void teardown(void) { fz_trace_free(t); }

static fz_value *param(const char *name, fz_dtype d, const char *shape)
{
	/* shape like "B,T,4096" */
	fz_dim dims[FZ_MAX_RANK];
	char buf[128], *save = NULL;
	int rank = 0;
	static char syms[16][16];
	static int nsyms;
	snprintf(buf, sizeof buf, "%s", shape);
	for (char *tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (tok[0] >= '0' && tok[0] <= '9') {
			dims[rank++] = (fz_dim){atoll(tok), NULL};
		} else {
			int k = nsyms++ % 16;
			snprintf(syms[k], sizeof syms[k], "%s", tok);
			dims[rank++] = (fz_dim){0, syms[k]};
		}
	}
	return fz_param(t, name, d, rank, dims);
}

static fz_value *op1(const char *op, fz_value *a, fz_value *b)
{
	fz_arg args[2] = {fz_arg_value(a), fz_arg_value(b)};
	return fz_op1(t, op, args, b ? 2 : 1, NULL, 0);
}

static fz_attr_value ilist_items[8];
static fz_attr attr_dims(const char *key, const int *d, int n)
{
	for (int i = 0; i < n; i++)
		ilist_items[i] = (fz_attr_value){.kind = FZ_AV_INT, .i = d[i]};
	return (fz_attr){key, {.kind = FZ_AV_LIST, .n = n, .items = ilist_items}};
}

static int count_op(fz_opcode op)
{
	int n = 0;
	for (int i = 0; i < t->n_nodes; i++)
		n += t->nodes[i]->op == op;
	return n;
}

START_TEST(infers_elementwise_types)
{
	fz_value *x = param("x", FZ_F32, "B,T,8");
	fz_value *y = op1("exp", x, NULL);
	ck_assert_ptr_nonnull(y);
	ck_assert_int_eq(fz_value_dtype(y), FZ_F32);
	ck_assert_int_eq(fz_value_rank(y), 3);
	ck_assert(fz_type_eq(&x->type, &y->type));
	fz_value *c = op1("lt", x, y);
	ck_assert_int_eq(fz_value_dtype(c), FZ_BOOL);
}
END_TEST

START_TEST(literal_takes_neighbour_dtype)
{
	fz_value *x = param("x", FZ_BF16, "4");
	fz_arg args[2] = {fz_arg_value(x), fz_arg_number(0.5)};
	fz_value *y = fz_op1(t, "mul", args, 2, NULL, 0);
	ck_assert_ptr_nonnull(y);
	ck_assert_int_eq(fz_value_dtype(y), FZ_BF16);
	/* full (rank 0) + broadcast_in_dim + mul */
	ck_assert_int_eq(count_op(FZ_OP_FULL), 1);
	ck_assert_int_eq(count_op(FZ_OP_BROADCAST_IN_DIM), 1);
	const fz_node *full = t->nodes[0];
	ck_assert_int_eq(full->attrs.dtype, FZ_BF16);
	ck_assert(full->attrs.value == 0.5);
	/* a literal before the tensor takes its dtype too */
	fz_arg args2[2] = {fz_arg_number(2), fz_arg_value(x)};
	ck_assert_ptr_nonnull(fz_op1(t, "sub", args2, 2, NULL, 0));
}
END_TEST

START_TEST(literal_needs_a_tensor)
{
	fz_arg args[2] = {fz_arg_number(1), fz_arg_number(2)};
	ck_assert_ptr_null(fz_op1(t, "add", args, 2, NULL, 0));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "every operand is a number"));
}
END_TEST

START_TEST(fractional_literal_for_int_is_error)
{
	fz_value *x = param("x", FZ_I32, "4");
	fz_arg args[2] = {fz_arg_value(x), fz_arg_number(0.5)};
	ck_assert_ptr_null(fz_op1(t, "add", args, 2, NULL, 0));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "not an integer"));
	ck_assert_int_eq(t->n_nodes, 0);
}
END_TEST

START_TEST(broadcasting_is_explicit)
{
	fz_value *x = param("x", FZ_F32, "B,1,8");
	fz_value *w = param("w", FZ_F32, "5,1");
	fz_value *y = op1("add", x, w);
	ck_assert_ptr_nonnull(y);
	ck_assert_int_eq(y->type.rank, 3);
	ck_assert(fz_ext_eq(y->type.dims[1], fz_ext_const(5)));
	ck_assert(fz_ext_eq(y->type.dims[2], fz_ext_const(8)));
	ck_assert_int_eq(count_op(FZ_OP_BROADCAST_IN_DIM), 2);
	/* the add itself sees operands of one shape */
	const fz_node *add = t->nodes[t->n_nodes - 1];
	ck_assert(fz_type_eq(&add->in[0]->type, &add->in[1]->type));
	/* w (rank 2) is aligned to the right: dims [1, 2] */
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *nd = t->nodes[i];
		if (nd->op == FZ_OP_BROADCAST_IN_DIM && nd->in[0] == w) {
			ck_assert_int_eq(nd->attrs.n_dims, 2);
			ck_assert_int_eq(nd->attrs.dims[0], 1);
			ck_assert_int_eq(nd->attrs.dims[1], 2);
		}
	}
}
END_TEST

START_TEST(broadcast_mismatch_is_error)
{
	fz_value *x = param("x", FZ_F32, "4,3");
	fz_value *w = param("w", FZ_F32, "5");
	ck_assert_ptr_null(op1("add", x, w));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "do not broadcast"));
	ck_assert_int_eq(t->n_nodes, 0);
}
END_TEST

START_TEST(dtype_mismatch_is_error)
{
	fz_value *x = param("x", FZ_F32, "4");
	fz_value *w = param("w", FZ_F16, "4");
	ck_assert_ptr_null(op1("mul", x, w));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "operand 2 ('w'"));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "expected f32"));
}
END_TEST

START_TEST(composites_lower_to_primitives)
{
	static const char *const composites[] = {
		"relu", "silu", "gelu", "softmax", "log_softmax", "mean",
	};
	fz_value *x = param("x", FZ_BF16, "B,16");
	for (size_t i = 0; i < sizeof composites / sizeof *composites; i++) {
		fz_attr a[1];
		int n = 0;
		int d1[1] = {-1};
		if (!strcmp(composites[i], "softmax") ||
		    !strcmp(composites[i], "log_softmax"))
			a[n++] = (fz_attr){"dim", {.kind = FZ_AV_INT, .i = -1}};
		if (!strcmp(composites[i], "mean"))
			a[n++] = attr_dims("dims", d1, 1);
		fz_arg arg = fz_arg_value(x);
		fz_value *y = fz_op1(t, composites[i], &arg, 1, a, n);
		ck_assert_msg(y != NULL, "%s: %s", composites[i], fz_trace_error(t));
		ck_assert_int_eq(fz_value_dtype(y), FZ_BF16);
	}
	for (int i = 0; i < t->n_nodes; i++)
		ck_assert_int_ne(fz_ops[t->nodes[i]->op].cls, FZ_CLASS_COMPOSITE);
	ck_assert_int_eq(fz_trace_verify(t, NULL), FZ_EVERIFY); /* no return yet */
}
END_TEST

START_TEST(softmax_computes_in_f32)
{
	fz_value *x = param("x", FZ_BF16, "4,16");
	fz_attr a = {"dim", {.kind = FZ_AV_INT, .i = 1}};
	fz_arg arg = fz_arg_value(x);
	fz_value *y = fz_op1(t, "softmax", &arg, 1, &a, 1);
	ck_assert_ptr_nonnull(y);
	ck_assert_int_eq(count_op(FZ_OP_AMAX), 1);
	ck_assert_int_eq(count_op(FZ_OP_SUM), 1);
	ck_assert_int_eq(count_op(FZ_OP_EXP), 1);
	for (int i = 0; i < t->n_nodes; i++)
		if (t->nodes[i]->op == FZ_OP_EXP)
			ck_assert_int_eq(t->nodes[i]->out[0]->type.dtype, FZ_F32);
	ck_assert_int_eq(y->def->op, FZ_OP_CAST);
	ck_assert_int_eq(y->def->origin, FZ_OP_SOFTMAX);
}
END_TEST

START_TEST(mean_over_symbolic_extent)
{
	fz_value *x = param("x", FZ_F32, "B,T");
	int d[2] = {0, 1};
	fz_attr a = attr_dims("dims", d, 2);
	fz_arg arg = fz_arg_value(x);
	fz_value *y = fz_op1(t, "mean", &arg, 1, &a, 1);
	ck_assert_ptr_nonnull(y);
	ck_assert_int_eq(y->type.rank, 0);
	int syms = 0;
	for (int i = 0; i < t->n_nodes; i++)
		syms += t->nodes[i]->op == FZ_OP_FULL && t->nodes[i]->attrs.value_sym >= 0;
	ck_assert_int_eq(syms, 2); /* divides by B and by T */
}
END_TEST

START_TEST(negative_dims_are_normalized)
{
	fz_value *x = param("x", FZ_F32, "2,3,4");
	int d[1] = {-1};
	fz_attr a = attr_dims("dims", d, 1);
	fz_arg arg = fz_arg_value(x);
	fz_value *y = fz_op1(t, "sum", &arg, 1, &a, 1);
	ck_assert_ptr_nonnull(y);
	ck_assert_int_eq(y->def->attrs.dims[0], 2);
	ck_assert_int_eq(y->type.rank, 2);
	int bad[1] = {-4};
	a = attr_dims("dims", bad, 1);
	ck_assert_ptr_null(fz_op1(t, "sum", &arg, 1, &a, 1));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "out of range"));
}
END_TEST

START_TEST(attributes_checked_against_schema)
{
	fz_value *x = param("x", FZ_F32, "4");
	fz_arg arg = fz_arg_value(x);
	fz_attr unknown = {"dims", {.kind = FZ_AV_INT, .i = 0}};
	ck_assert_ptr_null(fz_op1(t, "softmax", &arg, 1, &unknown, 1));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "unknown attribute 'dims'"));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "takes: dim"));
	ck_assert_ptr_null(fz_op1(t, "softmax", &arg, 1, NULL, 0));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "missing attribute dim"));
	fz_attr twice[2] = {{"dim", {.kind = FZ_AV_INT, .i = 0}},
			    {"dim", {.kind = FZ_AV_INT, .i = 0}}};
	ck_assert_ptr_null(fz_op1(t, "softmax", &arg, 1, twice, 2));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "given twice"));
	fz_attr bad = {"dtype", {.kind = FZ_AV_INT, .i = 3}};
	ck_assert_ptr_null(fz_op1(t, "cast", &arg, 1, &bad, 1));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "must be a dtype"));
	ck_assert_int_eq(t->n_nodes, 0);
}
END_TEST

/* uniform's seed as a rank-0 operand through the C API: the node reads it,
 * the verifier passes, and the interpreter's numbers follow the seed's
 * value (the same as seed=S written in); a seed given both ways, or not a
 * rank-0 integer, fails and leaves the trace as it was. */
START_TEST(uniform_seed_operand)
{
	fz_value *s = fz_param(t, "seed", FZ_I64, 0, NULL);
	fz_value *x = param("x", FZ_F32, "3");
	fz_attr_value shape_items[1] = {{.kind = FZ_AV_INT, .i = 5}};
	fz_attr at[3] = {{"shape", {.kind = FZ_AV_LIST, .n = 1, .items = shape_items}},
			 {"dtype", {.kind = FZ_AV_DTYPE, .i = FZ_F32}},
			 {"seed", {.kind = FZ_AV_INT, .i = 77}}};
	fz_arg a = fz_arg_value(s), bad = fz_arg_value(x);
	int before = t->n_nodes;
	ck_assert_ptr_null(fz_op1(t, "uniform", &a, 1, at, 3));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "seed is given twice"));
	ck_assert_ptr_null(fz_op1(t, "uniform", &bad, 1, at, 2));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "must be a rank-0 i64"));
	ck_assert_int_eq(t->n_nodes, before);
	fz_value *u = fz_op1(t, "uniform", &a, 1, at, 2);
	fz_value *w = fz_op1(t, "uniform", NULL, 0, at, 3);
	ck_assert_ptr_nonnull(u);
	ck_assert_ptr_nonnull(w);
	ck_assert_ptr_eq(u->def->in[0], s);
	fz_value *outs[2] = {u, w};
	ck_assert_int_eq(fz_return(t, outs, 2), FZ_OK);
	char *err = NULL;
	ck_assert_int_eq(fz_trace_verify(t, &err), FZ_OK);
	int64_t seed = 77;
	float xs[3] = {0};
	int64_t xshape[] = {3};
	fz_tensor in[2], out[2];
	fz_tensor_contiguous(&in[0], &seed, FZ_I64, 0, NULL);
	fz_tensor_contiguous(&in[1], xs, FZ_F32, 1, xshape);
	ck_assert_int_eq(fz_trace_interpret(t, NULL, in, 2, out, 2, &err), FZ_OK);
	ck_assert_int_eq(memcmp(out[0].data, out[1].data, 5 * sizeof(float)), 0);
	fz_free(out[0].data);
	fz_free(out[1].data);
	seed = 78;
	ck_assert_int_eq(fz_trace_interpret(t, NULL, in, 2, out, 2, &err), FZ_OK);
	ck_assert_int_ne(memcmp(out[0].data, out[1].data, 5 * sizeof(float)), 0);
	fz_free(out[0].data);
	fz_free(out[1].data);
}
END_TEST

START_TEST(arity_checked)
{
	fz_value *x = param("x", FZ_F32, "4");
	fz_arg args[3] = {fz_arg_value(x), fz_arg_value(x), fz_arg_value(x)};
	ck_assert_ptr_null(fz_op1(t, "exp", args, 2, NULL, 0));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "expected 1"));
	ck_assert_ptr_null(fz_op1(t, "nosuchop", args, 1, NULL, 0));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "unknown op 'nosuchop'"));
}
END_TEST

START_TEST(reshape_infers_minus_one_symbolically)
{
	fz_value *x = param("x", FZ_F32, "B,T,64");
	fz_attr_value items[2] = {{.kind = FZ_AV_INT, .i = -1},
				  {.kind = FZ_AV_INT, .i = 64}};
	fz_attr a = {"shape", {.kind = FZ_AV_LIST, .n = 2, .items = items}};
	fz_arg arg = fz_arg_value(x);
	fz_value *y = fz_op1(t, "reshape", &arg, 1, &a, 1);
	ck_assert_ptr_nonnull(y);
	int b = fz_trace_symbol_find(t, "B"), tt = fz_trace_symbol_find(t, "T");
	fz_ext bt;
	ck_assert(fz_ext_mul(fz_ext_sym(b), fz_ext_sym(tt), &bt));
	ck_assert(fz_ext_eq(y->type.dims[0], bt));
	int64_t sizes[FZ_MAX_SYMS] = {0};
	sizes[b] = 3;
	sizes[tt] = 5;
	ck_assert_int_eq(fz_value_extent(y, 0, sizes), 15);
	/* two -1 */
	items[1].i = -1;
	ck_assert_ptr_null(fz_op1(t, "reshape", &arg, 1, &a, 1));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "more than one -1"));
	/* wrong count */
	items[0].i = 7;
	items[1].i = 64;
	ck_assert_ptr_null(fz_op1(t, "reshape", &arg, 1, &a, 1));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "elements"));
}
END_TEST

START_TEST(iota_length_may_be_symbolic)
{
	fz_attr_value items[1] = {{.kind = FZ_AV_NAME, .name = "T"}};
	fz_attr a[2] = {{"length", items[0]},
			{"dtype", {.kind = FZ_AV_DTYPE, .i = FZ_I64}}};
	fz_value *i = fz_op1(t, "iota", NULL, 0, a, 2);
	ck_assert_msg(i != NULL, "%s", fz_trace_error(t));
	ck_assert(fz_ext_eq(i->type.dims[0], fz_ext_sym(fz_trace_symbol_find(t, "T"))));
	a[0].value = (fz_attr_value){.kind = FZ_AV_INT, .i = -2};
	ck_assert_ptr_null(fz_op1(t, "iota", NULL, 0, a, 2));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "must be an extent"));
}
END_TEST

START_TEST(var_mean_gives_two_results)
{
	fz_value *x = param("x", FZ_F32, "4,8");
	int d[1] = {1};
	fz_attr a = attr_dims("dims", d, 1);
	fz_arg arg = fz_arg_value(x);
	fz_value *out[2];
	ck_assert_int_eq(fz_op(t, "var_mean", &arg, 1, &a, 1, out, 2), 2);
	ck_assert_int_eq(out[0]->type.rank, 1);
	ck_assert_ptr_eq(out[0]->def, out[1]->def);
	ck_assert_ptr_null(fz_op1(t, "var_mean", &arg, 1, &a, 1));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "2 results"));
}
END_TEST

START_TEST(futures_must_be_waited)
{
	fz_value *x = param("x", FZ_F32, "4");
	fz_arg arg = fz_arg_value(x);
	fz_value *f = fz_op1(t, "all_reduce", &arg, 1, NULL, 0);
	ck_assert_ptr_nonnull(f);
	ck_assert(f->type.future);
	ck_assert_ptr_null(op1("exp", f, NULL));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "wait on it first"));
	ck_assert_int_ne(fz_return(t, &f, 1), FZ_OK);
	ck_assert_ptr_null(op1("wait", x, NULL));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "not a future"));
	/* a future never waited on fails verification */
	ck_assert_int_eq(fz_return(t, &x, 1), FZ_OK);
	char *err = NULL;
	ck_assert_int_eq(fz_trace_verify(t, &err), FZ_EVERIFY);
	ck_assert_ptr_nonnull(strstr(err, "never waited on"));
	fz_free(err);
}
END_TEST

START_TEST(failed_composite_rolls_back)
{
	fz_value *x = param("x", FZ_F32, "4,8");
	fz_value *w = param("w", FZ_F32, "5");
	int d[1] = {1};
	fz_attr a = attr_dims("dims", d, 1);
	fz_arg args[2] = {fz_arg_value(x), fz_arg_value(w)};
	ck_assert_ptr_null(fz_op1(t, "rms_norm", args, 2, &a, 1));
	ck_assert_int_eq(t->n_nodes, 0);
	ck_assert_int_eq(t->n_values, 2);
	ck_assert_int_eq(x->n_uses, 0);
	ck_assert_int_eq(w->n_uses, 0);
}
END_TEST

START_TEST(names_are_unique)
{
	fz_value *x = param("x", FZ_F32, "4");
	ck_assert_ptr_null(param("x", FZ_F32, "4"));
	fz_value *y = op1("exp", x, NULL);
	ck_assert_int_eq(fz_name(t, y, "x"), FZ_EVERIFY);
	ck_assert_int_eq(fz_name(t, y, "9bad"), FZ_EINVAL);
	ck_assert_int_eq(fz_name(t, y, "y"), FZ_OK);
	ck_assert_ptr_eq(fz_lookup(t, "y"), y);
	ck_assert_ptr_null(fz_lookup(t, "z"));
}
END_TEST

START_TEST(many_names_grow_the_table)
{
	fz_value *x = param("x", FZ_F32, "4");
	char name[32];
	for (int i = 0; i < 5000; i++) {
		fz_value *y = op1("neg", x, NULL);
		snprintf(name, sizeof name, "v%d", i);
		ck_assert_int_eq(fz_name(t, y, name), FZ_OK);
	}
	for (int i = 0; i < 5000; i += 97) {
		snprintf(name, sizeof name, "v%d", i);
		ck_assert_ptr_nonnull(fz_lookup(t, name));
	}
}
END_TEST

START_TEST(element_count_overflow)
{
	fz_dim d[2] = {{1ll << 40, NULL}, {1ll << 40, NULL}};
	ck_assert_ptr_null(fz_param(t, "x", FZ_F32, 2, d));
	ck_assert_ptr_nonnull(strstr(fz_trace_error(t), "overflows"));
	fz_dim neg = {-3, NULL};
	ck_assert_ptr_null(fz_param(t, "y", FZ_F32, 1, &neg));
}
END_TEST

START_TEST(builder_matches_parser)
{
	static const char src[] =
		"trace b(x: f32[B, 8], w: f32[8]) {\n"
		"  y = mul(exp(x), 2)\n"
		"  z = add(y, w)\n"
		"  return z\n"
		"}\n";
	fz_value *x = param("x", FZ_F32, "B,8");
	fz_value *w = param("w", FZ_F32, "8");
	fz_value *e = op1("exp", x, NULL);
	fz_arg args[2] = {fz_arg_value(e), fz_arg_int(2)};
	fz_value *y = fz_op1(t, "mul", args, 2, NULL, 0);
	fz_name(t, y, "y");
	fz_value *z = op1("add", y, w);
	fz_name(t, z, "z");
	ck_assert_int_eq(fz_return(t, &z, 1), FZ_OK);
	ck_assert_int_eq(fz_trace_verify(t, NULL), FZ_OK);

	fz_module *m = NULL;
	char *diag = NULL;
	ck_assert_int_eq(fz_module_parse(src, strlen(src), "b.trace", &m, &diag), FZ_OK);
	char why[256];
	ck_assert_msg(fz_trace_equal(t, fz_module_trace(m, 0), why, sizeof why), "%s",
		      why);
	fz_module_free(m);
}
END_TEST

static Suite *builder_suite(void)
{
	Suite *s = suite_create("builder");
	TCase *tc = tcase_create("types");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, infers_elementwise_types);
	tcase_add_test(tc, uniform_seed_operand);
	tcase_add_test(tc, literal_takes_neighbour_dtype);
	tcase_add_test(tc, literal_needs_a_tensor);
	tcase_add_test(tc, fractional_literal_for_int_is_error);
	tcase_add_test(tc, broadcasting_is_explicit);
	tcase_add_test(tc, broadcast_mismatch_is_error);
	tcase_add_test(tc, dtype_mismatch_is_error);
	tcase_add_test(tc, reshape_infers_minus_one_symbolically);
	tcase_add_test(tc, var_mean_gives_two_results);
	tcase_add_test(tc, iota_length_may_be_symbolic);
	tcase_add_test(tc, futures_must_be_waited);
	tcase_add_test(tc, element_count_overflow);
	suite_add_tcase(s, tc);

	tc = tcase_create("lowering");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, composites_lower_to_primitives);
	tcase_add_test(tc, softmax_computes_in_f32);
	tcase_add_test(tc, mean_over_symbolic_extent);
	tcase_add_test(tc, failed_composite_rolls_back);
	suite_add_tcase(s, tc);

	tc = tcase_create("attributes");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, negative_dims_are_normalized);
	tcase_add_test(tc, attributes_checked_against_schema);
	tcase_add_test(tc, arity_checked);
	suite_add_tcase(s, tc);

	tc = tcase_create("names");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, names_are_unique);
	tcase_add_test(tc, many_names_grow_the_table);
	tcase_add_test(tc, builder_matches_parser);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(builder_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
