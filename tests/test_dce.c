/*
 * test_dce.c: dead code (ir/dce.c) and the errors that say what happened
 * (issue 23, points 6 and 7, found by tests/fuzz/pipeline.c).
 *
 *   - ops whose results nothing needs are in no region: nothing plans,
 *     compiles or launches them, and a dead max over an empty extent (a
 *     softmax nobody reads) fails neither the generated code nor the
 *     interpreter;
 *   - a max, min, argmax or argmin over an empty extent is refused where it
 *     runs: by the verifier (file:line:col) when the extent is concrete, at
 *     binding when a symbol is bound to 0, each naming the op;
 *   - a kernel's error flag says what failed: an index out of range, an
 *     integer fmod by zero;
 *   - slice bounds past 2^31 are bounds outside the extent, not
 *     "must be an integer";
 *   - horizontal fusion of two regions that read nothing (UBSan's
 *     memcpy(NULL, 0) in ir/horizontal.c).
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "fusec.h"
#include "ir.h"
#include "plan.h"

static fz_module *parse(const char *src)
{
	fz_module *m = NULL;
	char *err = NULL;
	fz_status st = fz_module_parse(src, strlen(src), "t.trace", &m, &err);
	ck_assert_msg(st == FZ_OK, "%s", err ? err : "?");
	return m;
}

/* The parse fails with a diagnostic holding want. */
static void parse_fails(const char *src, const char *want)
{
	fz_module *m = NULL;
	char *err = NULL;
	ck_assert_int_ne(fz_module_parse(src, strlen(src), "t.trace", &m, &err), FZ_OK);
	ck_assert_msg(err && strstr(err, want), "'%s' lacks '%s'", err ? err : "", want);
	fz_free(err);
}

/* Runs trace 0 of src on device (NULL: the interpreter) with N bound to n,
 * inputs of ones (f32) or zeros (integers); returns the status, *err the
 * message. The outputs are freed. */
static fz_status run(const char *src, const char *device, int64_t n, char **err)
{
	fz_module *m = parse(src);
	fz_trace *t = fz_module_trace(m, 0);
	int64_t syms[FZ_MAX_SYMS];
	for (int s = 0; s < FZ_MAX_SYMS; s++)
		syms[s] = n;
	int n_in = fz_trace_param_count(t), n_out = fz_trace_output_count(t);
	fz_tensor in[8], out[8];
	for (int i = 0; i < n_in; i++) {
		const fz_value *p = fz_trace_param(t, i);
		int64_t shape[FZ_MAX_RANK], k = 1;
		for (int d = 0; d < fz_value_rank(p); d++)
			k *= shape[d] = fz_value_extent(p, d, syms);
		void *data = calloc((size_t)k + 1, 8);
		for (int64_t j = 0; fz_value_dtype(p) == FZ_F32 && j < k; j++)
			((float *)data)[j] = 1.0f;
		fz_tensor_contiguous(&in[i], data, fz_value_dtype(p), fz_value_rank(p), shape);
	}
	/* both allocate the outputs (fz_trace_run, fz_trace_interpret) */
	memset(out, 0, sizeof out);
	*err = NULL;
	fz_status st = device ? fz_trace_run(t, device, syms, in, n_in, out, n_out, err)
			      : fz_trace_interpret(t, syms, in, n_in, out, n_out, err);
	for (int k = 0; k < n_out && st == FZ_OK; k++)
		fz_free(out[k].data);
	for (int i = 0; i < n_in; i++)
		free(in[i].data);
	fz_module_free(m);
	return st;
}

/* src runs cleanly on cpu, emu and the interpreter at N = n. */
static void runs_everywhere(const char *src, int64_t n)
{
	const char *devs[] = {"cpu", "emu", NULL};
	for (int d = 0; d < 3; d++) {
		char *err = NULL;
		fz_status st = run(src, devs[d], n, &err);
		ck_assert_msg(st == FZ_OK, "%s: %s", devs[d] ? devs[d] : "interpreter",
			      err ? err : fz_status_name(st));
		fz_free(err);
	}
}

/* src fails on cpu, emu and the interpreter at N = n with a message that
 * holds every string of want. */
static void fails_everywhere(const char *src, int64_t n, fz_status want_st,
			     const char *const *want)
{
	const char *devs[] = {"cpu", "emu", NULL};
	for (int d = 0; d < 3; d++) {
		char *err = NULL;
		fz_status st = run(src, devs[d], n, &err);
		const char *on = devs[d] ? devs[d] : "interpreter";
		ck_assert_msg(st == want_st, "%s: status %s, %s", on, fz_status_name(st),
			      err ? err : "");
		for (int k = 0; want[k]; k++)
			ck_assert_msg(err && strstr(err, want[k]), "%s: '%s' lacks '%s'", on,
				      err ? err : "", want[k]);
		fz_free(err);
	}
}

/* ---- dead code ---- */

static const char *DEAD =
	"trace t(x: f32[64, 8], y: f32[64]) {\n"
	"  a = exp(x)\n"
	"  b = sum(a, dims=[1])\n"
	"  d = matmul(x, permute(x, dims=[1, 0]))\n"
	"  c = mul(y, 2.0)\n"
	"  return c\n"
	"}\n";

START_TEST(dead_ops_in_no_region)
{
	fz_module *m = parse(DEAD);
	fz_program *p = NULL;
	ck_assert_int_eq(fz_plan(fz_module_trace(m, 0), NULL, &p, NULL), FZ_OK);
	/* exp, sum, permute and matmul: dead; only c's kernel is left */
	ck_assert_int_eq(p->n_dead, 4);
	ck_assert_int_eq(p->n_regions, 1);
	ck_assert_int_eq(fz_program_kernels(p), 1);
	const fz_trace *t = p->trace;
	for (int i = 0; i < t->n_nodes; i++)
		ck_assert_int_eq(p->region_of[i] < 0, p->dead[i]);
	/* nothing is written but c: x's exp and the product are not planned */
	ck_assert_int_eq(p->peak_bytes, 64 * 4);
	fz_program_free(p);
	runs_everywhere(DEAD, 1);
	fz_module_free(m);
}
END_TEST

/* A trace with no dead op plans as before: dead stays NULL. */
START_TEST(all_live)
{
	fz_module *m = parse("trace t(x: f32[8]) {\n  y = exp(x)\n  return y\n}\n");
	fz_program *p = NULL;
	ck_assert_int_eq(fz_plan(fz_module_trace(m, 0), NULL, &p, NULL), FZ_OK);
	ck_assert_ptr_null(p->dead);
	ck_assert_int_eq(p->n_dead, 0);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

/* A value read by a dead op only is not written out of its region. */
START_TEST(dead_reader_writes_nothing)
{
	fz_module *m = parse("trace t(x: f32[64]) {\n  a = exp(x)\n  b = mul(a, 2.0)\n"
			     "  c = sum(a, dims=[0])\n  return b\n}\n");
	fz_program *p = NULL;
	ck_assert_int_eq(fz_plan(fz_module_trace(m, 0), NULL, &p, NULL), FZ_OK);
	ck_assert_int_eq(p->n_regions, 1);
	ck_assert_int_eq(p->regions[0]->n_out, 1); /* b, not a */
	ck_assert_int_eq(p->regions[0]->kind, FZ_REGION_POINTWISE);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

/* An unused softmax over an extent bound to 0 (or written 0) fails
 * nothing: it is not run. The same softmax, returned, is refused. */
START_TEST(unused_softmax_over_empty)
{
	runs_everywhere("trace t(x: f32[3, N], y: f32[4]) {\n"
			"  s = softmax(x, dim=1)\n  z = add(y, 1.0)\n  return z\n}\n", 0);
	runs_everywhere("trace t(x: f32[3, 0], y: f32[4]) {\n"
			"  s = softmax(x, dim=1)\n  z = add(y, 1.0)\n  return z\n}\n", 0);
	fails_everywhere("trace t(x: f32[3, N]) {\n  s = softmax(x, dim=1)\n"
			 "  return s\n}\n", 0, FZ_ERANGE,
			 (const char *const[]){"amax at 2:7", "empty", "softmax", NULL});
}
END_TEST

/* Two regions that read nothing (an iota's, a full's), merged by
 * horizontal fusion: the merge copied their empty input lists from a NULL
 * pointer, which UBSan reports (the sanitized build runs this). */
START_TEST(merge_of_inputless_regions)
{
	const char *src = "trace t(x: f32[8]) {\n"
			  "  a = add(iota(length=8, dtype=f32), 1.0)\n"
			  "  b = mul(full(shape=[8], value=2, dtype=f32), 3.0)\n"
			  "  return a, b, x\n}\n";
	fz_module *m = parse(src);
	fz_program *p = NULL;
	ck_assert_int_eq(fz_plan(fz_module_trace(m, 0), NULL, &p, NULL), FZ_OK);
	ck_assert_int_eq(p->horizontal_merged, 1);
	ck_assert_int_eq(fz_program_kernels(p), 1);
	fz_program_free(p);
	fz_module_free(m);
	runs_everywhere(src, 1);
}
END_TEST

/* ---- messages ---- */

START_TEST(extremum_over_empty_concrete)
{
	parse_fails("trace t(x: f32[3, 0]) {\n  s = amax(x, dims=[1])\n  return s\n}\n",
		    "t.trace:2:7: error: amax: dim 1 is empty (extent 0): the maximum "
		    "of no elements is undefined");
	parse_fails("trace t(x: i32[0, 3]) {\n  s = amin(x, dims=[0, 1], keepdim=true)\n"
		    "  return s\n}\n", "t.trace:2:7: error: amin: dim 0 is empty");
	parse_fails("trace t(x: f32[4, 0]) {\n  s = argmin(x, dim=1)\n  return s\n}\n",
		    "index of the minimum");
	/* nothing to give: an empty result is fine */
	runs_everywhere("trace t(x: f32[0, 0]) {\n  s = amax(x, dims=[1])\n"
			"  return s\n}\n", 1);
	/* a sum over nothing is 0 */
	runs_everywhere("trace t(x: f32[3, 0]) {\n  s = sum(x, dims=[1])\n  return s\n}\n", 1);
}
END_TEST

START_TEST(extremum_over_empty_bound)
{
	const char *src[] = {
		"trace t(x: f32[3, N]) {\n  s = amax(x, dims=[1])\n  return s\n}\n",
		"trace t(x: i64[N, 2]) {\n  s = amin(x, dims=[0])\n  return s\n}\n",
		"trace t(x: f32[3, N]) {\n  s = argmax(x, dim=1, keepdim=true)\n  return s\n}\n",
	};
	const char *op[] = {"amax at 2:7", "amin at 2:7", "argmax at 2:7"};
	for (int i = 0; i < 3; i++) {
		fails_everywhere(src[i], 0, FZ_ERANGE,
				 (const char *const[]){op[i], "is empty (extent N = 0)",
						       "no elements", NULL});
		runs_everywhere(src[i], 3);
	}
}
END_TEST

START_TEST(flag_says_what)
{
	const char *take = "trace t(x: f32[8, 4], i: i64[5]) {\n  j = add(i, 100)\n"
			   "  s = take(x, j, dim=0)\n  return s\n}\n";
	const char *fmod = "trace t(x: i32[8]) {\n  z = full(shape=[8], value=0, dtype=i32)\n"
			   "  s = fmod(x, z)\n  return s\n}\n";
	const char *devs[] = {"cpu", "emu"};
	for (int d = 0; d < 2; d++) {
		char *err = NULL;
		ck_assert_int_eq(run(take, devs[d], 1, &err), FZ_ERANGE);
		ck_assert_msg(strstr(err, "take at 3:7: an index is out of range") &&
			      !strstr(err, "fmod"), "%s", err);
		fz_free(err);
		ck_assert_int_eq(run(fmod, devs[d], 1, &err), FZ_ERANGE);
		ck_assert_msg(strstr(err, "fmod at 3:7: an integer fmod divides by zero") &&
			      !strstr(err, "index"), "%s", err);
		fz_free(err);
	}
	char *err = NULL;
	ck_assert_int_eq(run(fmod, NULL, 1, &err), FZ_ERANGE);
	ck_assert_msg(strstr(err, "fmod at 3:7: integer fmod by zero"), "%s", err);
	fz_free(err);
}
END_TEST

START_TEST(slice_bounds_past_int32)
{
	parse_fails("trace t(x: f32[8]) {\n  s = slice(x, start=[3000000000], end=[8])\n"
		    "  return s\n}\n", "slice: bounds [3000000000, 8) in dim 0 lie "
		    "outside the extent 8");
	/* a step past 2^31 takes one element, without overflow */
	fz_module *m = parse("trace t(x: f32[8]) {\n  s = slice(x, start=[1], end=[8], "
			     "step=[9223372036854775807])\n  return s\n}\n");
	ck_assert_int_eq(fz_value_extent(fz_trace_output(fz_module_trace(m, 0), 0), 0,
					 NULL), 1);
	fz_module_free(m);
	parse_fails("trace t(x: f32[8]) {\n  s = sum(x, dims=[4294967296])\n  return s\n}\n",
		    "is 4294967296, out of range for a dim");
	parse_fails("trace t(x: f32[8]) {\n  s = slice(x, start=[0.5], end=[8])\n"
		    "  return s\n}\n", "must be an integer");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("dce");
	TCase *tc = tcase_create("dead code");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, dead_ops_in_no_region);
	tcase_add_test(tc, all_live);
	tcase_add_test(tc, dead_reader_writes_nothing);
	tcase_add_test(tc, unused_softmax_over_empty);
	tcase_add_test(tc, merge_of_inputless_regions);
	suite_add_tcase(s, tc);
	tc = tcase_create("messages");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, extremum_over_empty_concrete);
	tcase_add_test(tc, extremum_over_empty_bound);
	tcase_add_test(tc, flag_says_what);
	tcase_add_test(tc, slice_bounds_past_int32);
	suite_add_tcase(s, tc);
	SRunner *r = srunner_create(s);
	srunner_run_all(r, CK_NORMAL);
	int f = srunner_ntests_failed(r);
	srunner_free(r);
	return f ? 1 : 0;
}
