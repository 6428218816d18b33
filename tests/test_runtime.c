/*
 * test_runtime.c: prepared programs (include/fusec.h, runtime/exec.c) and
 * the target table (runtime/target.h).
 *
 * What a framework relies on: outputs written into its own buffers, inputs
 * read in place whatever their strides or alignment, a prepared plan per
 * size binding, and every kind of bad call a clear status and message
 * naming what was wrong, never a crash.
 */
#define _DEFAULT_SOURCE /* usleep */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec.h"
#include "fusec.h"
#include "target.h"

static fz_module *parse(const char *src)
{
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = fz_module_parse(src, strlen(src), "<test>", &m, &diag);
	ck_assert_msg(st == FZ_OK, "parse: %s", diag ? diag : "?");
	return m;
}

static fz_exec *prepare(const fz_trace *t, int max_plans)
{
	fz_exec_options o;
	fz_exec_options_init(&o);
	o.disk_cache = 0;
	o.max_plans = max_plans;
	fz_exec *x = NULL;
	char *err = NULL;
	ck_assert_msg(fz_exec_new(t, "cpu", &o, &x, &err) == FZ_OK, "new: %s",
		      err ? err : "?");
	return x;
}

/* A program made with FUSEC_PROFILE=1: its steps are timed. */
static fz_exec *prepare_profiled(const fz_trace *t)
{
	setenv("FUSEC_PROFILE", "1", 1);
	fz_exec *x = prepare(t, 8);
	unsetenv("FUSEC_PROFILE");
	return x;
}

static fz_tensor vec(float *data, int64_t n, int64_t stride)
{
	fz_tensor v = {data, FZ_F32, 1, {n}, {stride}};
	return v;
}

static const char *axpy_src =
	"trace axpy(x: f32[N], y: f32[N]) {\n"
	"  z = add(mul(x, 2.0), y)\n"
	"  return z\n"
	"}\n";

START_TEST(outputs_in_place)
{
	fz_module *m = parse(axpy_src);
	fz_exec *x = prepare(fz_module_trace(m, 0), 8);
	float *a = aligned_alloc(64, 64 * 4), *b = aligned_alloc(64, 64 * 4);
	float *z = aligned_alloc(64, 64 * 4);
	for (int i = 0; i < 64; i++) {
		a[i] = (float)i;
		b[i] = 1.0f;
	}
	fz_tensor in[2] = {vec(a, 37, 1), vec(b, 37, 1)}, out = vec(z, 37, 1);
	char *err = NULL;
	ck_assert_int_eq(fz_exec_run(x, NULL, in, 2, &out, 1, NULL, &err), FZ_OK);
	ck_assert_ptr_eq(out.data, z); /* the caller's buffer, filled */
	for (int i = 0; i < 37; i++)
		ck_assert_float_eq(z[i], 2.0f * (float)i + 1.0f);
	ck_assert_str_eq(fz_exec_device(x), "cpu");
	fz_exec_free(x);
	free(a);
	free(b);
	free(z);
	fz_module_free(m);
}
END_TEST

/* An output that is a reshape of a product's result has the product
 * written into the caller's buffer (no copy step at the end); a second
 * view of the same result is copied from there, a transposed one is
 * gathered; all three right. With FUSEC_PROFILE=1 every step is timed:
 * fz_exec_profile lists them with the runs and the product's flops, and
 * its reset zeroes the sums. */
static const char *view_out_src =
	"trace t(a: f32[8, 16], b: f32[16, 12]) {\n"
	"  y = matmul(a, b)\n"
	"  r = reshape(y, shape=[96])\n"
	"  s = reshape(y, shape=[4, 24])\n"
	"  z = mul(y, 2.0)\n"
	"  u = permute(z, dims=[1, 0])\n"
	"  return r, s, u\n"
	"}\n";

START_TEST(outputs_views_in_place)
{
	fz_module *m = parse(view_out_src);
	fz_exec *x = prepare_profiled(fz_module_trace(m, 0));
	float a[8 * 16], b[16 * 12], r[96], sv[96], u[96], want[96];
	for (int i = 0; i < 8 * 16; i++)
		a[i] = (float)(i % 7) - 3.0f;
	for (int i = 0; i < 16 * 12; i++)
		b[i] = (float)(i % 5) * 0.5f;
	for (int i = 0; i < 8; i++)
		for (int j = 0; j < 12; j++) {
			float acc = 0;
			for (int k = 0; k < 16; k++)
				acc += a[i * 16 + k] * b[k * 12 + j];
			want[i * 12 + j] = acc;
		}
	fz_tensor in[2] = {{.data = a, .dtype = FZ_F32, .rank = 2, .shape = {8, 16},
			    .strides = {16, 1}},
			   {.data = b, .dtype = FZ_F32, .rank = 2, .shape = {16, 12},
			    .strides = {12, 1}}};
	fz_tensor out[3] = {vec(r, 96, 1),
			    {.data = sv, .dtype = FZ_F32, .rank = 2, .shape = {4, 24},
			     .strides = {24, 1}},
			    {.data = u, .dtype = FZ_F32, .rank = 2, .shape = {12, 8},
			     .strides = {8, 1}}};
	char *err = NULL;
	for (int run = 0; run < 2; run++) {
		memset(r, 0, sizeof r);
		ck_assert_msg(fz_exec_run(x, NULL, in, 2, out, 3, NULL, &err) == FZ_OK,
			      "run: %s", err ? err : "?");
		for (int i = 0; i < 96; i++) {
			ck_assert_float_eq(r[i], want[i]);
			ck_assert_float_eq(sv[i], want[i]);
			ck_assert_float_eq(u[(i % 12) * 8 + i / 12], 2.0f * want[i]);
		}
	}
	/* the product, the kernel, s's copy and u's gather: no copy for r */
	ck_assert_int_eq(fz_exec_stats_of(x)->steps, 4);
	char *prof = NULL;
	ck_assert_int_eq(fz_exec_profile(x, 1, &prof), FZ_OK);
	ck_assert_msg(strstr(prof, "\tmatmul\t2\t") && strstr(prof, "\t3072\tf32 8x16x12"),
		      "%s", prof);
	ck_assert_msg(strstr(prof, "\tcopy\t2\t"), "%s", prof);
	fz_free(prof);
	ck_assert_int_eq(fz_exec_profile(x, 0, &prof), FZ_OK);
	ck_assert_msg(strstr(prof, "\tmatmul\t0\t0.000000000\t"), "%s", prof);
	fz_free(prof);
	fz_exec_free(x);
	/* without FUSEC_PROFILE: the header alone */
	x = prepare(fz_module_trace(m, 0), 8);
	ck_assert_int_eq(fz_exec_run(x, NULL, in, 2, out, 3, NULL, &err), FZ_OK);
	ck_assert_int_eq(fz_exec_profile(x, 0, &prof), FZ_OK);
	ck_assert_str_eq(prof, "region\tkind\truns\tseconds\tflop\twhat\n");
	fz_free(prof);
	fz_exec_free(x);
	fz_module_free(m);
}
END_TEST

/* A product whose a is a transposed view (a weight gradient dW = dYᵀ·X,
 * and the batched form over a permuted operand) reads it where it lies,
 * as its transpose (fz_matmul.a_trans): no gather, and the products
 * right. With a_trans ignored, the products read dY as [M, K] rows. */
static const char *wgrad_src =
	"trace t(dy: f32[24, 12], x: f32[24, 16], q: f32[3, 10, 6], k: f32[3, 10, 5]) {\n"
	"  g = matmul(permute(dy, dims=[1, 0]), x)\n"
	"  h = matmul(permute(q, dims=[0, 2, 1]), k)\n"
	"  return g, h\n"
	"}\n";

START_TEST(transposed_a_in_place)
{
	fz_module *m = parse(wgrad_src);
	fz_exec *x = prepare_profiled(fz_module_trace(m, 0));
	float dy[24 * 12], xv[24 * 16], q[3 * 10 * 6], k[3 * 10 * 5];
	float g[12 * 16], h[3 * 6 * 5];
	for (int i = 0; i < 24 * 12; i++)
		dy[i] = (float)(i % 7) - 3.0f;
	for (int i = 0; i < 24 * 16; i++)
		xv[i] = (float)(i % 5) * 0.5f;
	for (int i = 0; i < 3 * 10 * 6; i++)
		q[i] = (float)(i % 9) - 4.0f;
	for (int i = 0; i < 3 * 10 * 5; i++)
		k[i] = (float)(i % 4) * 0.25f;
	fz_tensor in[4] = {
		{.data = dy, .dtype = FZ_F32, .rank = 2, .shape = {24, 12}, .strides = {12, 1}},
		{.data = xv, .dtype = FZ_F32, .rank = 2, .shape = {24, 16}, .strides = {16, 1}},
		{.data = q, .dtype = FZ_F32, .rank = 3, .shape = {3, 10, 6},
		 .strides = {60, 6, 1}},
		{.data = k, .dtype = FZ_F32, .rank = 3, .shape = {3, 10, 5},
		 .strides = {50, 5, 1}}};
	fz_tensor out[2] = {
		{.data = g, .dtype = FZ_F32, .rank = 2, .shape = {12, 16}, .strides = {16, 1}},
		{.data = h, .dtype = FZ_F32, .rank = 3, .shape = {3, 6, 5}, .strides = {30, 5, 1}}};
	char *err = NULL;
	ck_assert_msg(fz_exec_run(x, NULL, in, 4, out, 2, NULL, &err) == FZ_OK, "run: %s",
		      err ? err : "?");
	for (int i = 0; i < 12; i++)
		for (int j = 0; j < 16; j++) {
			float acc = 0;
			for (int r = 0; r < 24; r++)
				acc += dy[r * 12 + i] * xv[r * 16 + j];
			ck_assert_float_eq_tol(g[i * 16 + j], acc, 1e-4f);
		}
	for (int b = 0; b < 3; b++)
		for (int i = 0; i < 6; i++)
			for (int j = 0; j < 5; j++) {
				float acc = 0;
				for (int r = 0; r < 10; r++)
					acc += q[b * 60 + r * 6 + i] * k[b * 50 + r * 5 + j];
				ck_assert_float_eq_tol(h[(b * 6 + i) * 5 + j], acc, 1e-4f);
			}
	/* the two products alone: no gather of dyᵀ or of qᵀ */
	ck_assert_int_eq(fz_exec_stats_of(x)->steps, 2);
	char *prof = NULL;
	ck_assert_int_eq(fz_exec_profile(x, 0, &prof), FZ_OK);
	ck_assert_msg(strstr(prof, "f32 12x24x16 (a transposed) x1") &&
		      strstr(prof, "f32 6x10x5 (a transposed) x3") && !strstr(prof, "\tcopy\t"),
		      "%s", prof);
	fz_free(prof);
	fz_exec_free(x);
	fz_module_free(m);
}
END_TEST

/* reshape(permute(e)) is no strided view of e: the kernel that makes e
 * writes the permute (bookend.c keeps it in the kernel), and the reshape,
 * a second reshape and the transpose a weight gradient's product reads
 * (as the Llama backward does with its permuted dq) are views of that.
 * When the permute was peeled into a view too, the runner gathered it and
 * copied each view after it: a gather and three copies a run. */
static const char *permuted_view_src =
	"trace t(x: f32[2, 3, 4], w: f32[3, 5]) {\n"
	"  e = mul(x, 2)\n"
	"  r = reshape(permute(e, dims=[1, 0, 2]), shape=[3, 1, 8])\n"
	"  y = matmul(permute(reshape(r, shape=[3, 8]), dims=[1, 0]), w)\n"
	"  return y\n"
	"}\n";

START_TEST(permute_under_a_reshape_is_written)
{
	fz_module *m = parse(permuted_view_src);
	fz_exec *x = prepare_profiled(fz_module_trace(m, 0));
	float xv[24], w[15], y[40];
	for (int i = 0; i < 24; i++)
		xv[i] = (float)(i % 7) - 2.5f;
	for (int i = 0; i < 15; i++)
		w[i] = (float)(i % 4) * 0.5f - 0.75f;
	fz_tensor in[2] = {
		{.data = xv, .dtype = FZ_F32, .rank = 3, .shape = {2, 3, 4}, .strides = {12, 4, 1}},
		{.data = w, .dtype = FZ_F32, .rank = 2, .shape = {3, 5}, .strides = {5, 1}}};
	fz_tensor out[1] = {
		{.data = y, .dtype = FZ_F32, .rank = 2, .shape = {8, 5}, .strides = {5, 1}}};
	char *err = NULL;
	ck_assert_msg(fz_exec_run(x, NULL, in, 2, out, 1, NULL, &err) == FZ_OK, "run: %s",
		      err ? err : "?");
	/* r[t, 0, b * 4 + d] = 2 x[b, t, d]; y[j, c] = sum_t r[t, j] w[t, c] */
	for (int j = 0; j < 8; j++)
		for (int c = 0; c < 5; c++) {
			float acc = 0;
			for (int t = 0; t < 3; t++)
				acc += 2 * xv[(j / 4) * 12 + t * 4 + j % 4] * w[t * 5 + c];
			ck_assert_float_eq_tol(y[j * 5 + c], acc, 1e-5f);
		}
	char *prof = NULL;
	ck_assert_int_eq(fz_exec_profile(x, 0, &prof), FZ_OK);
	ck_assert_msg(!strstr(prof, "\tcopy\t") && !strstr(prof, "reshape copy") &&
		      strstr(prof, "f32 8x3x5 (a transposed) x1"), "%s", prof);
	ck_assert_int_eq(fz_exec_stats_of(x)->steps, 2);
	fz_free(prof);
	fz_exec_free(x);
	fz_module_free(m);
}
END_TEST

/* A strided input and a misaligned one are read right (copied to
 * staging), and the plan is the same one. */
START_TEST(strided_and_misaligned_inputs)
{
	fz_module *m = parse(axpy_src);
	fz_exec *x = prepare(fz_module_trace(m, 0), 8);
	float *a = aligned_alloc(64, 256 * 4), *b = aligned_alloc(64, 256 * 4);
	float *z = aligned_alloc(64, 64 * 4);
	for (int i = 0; i < 256; i++) {
		a[i] = (float)i;
		b[i] = (float)(3 * i);
	}
	char *err = NULL;
	fz_tensor in[2] = {vec(a, 40, 3), vec(b + 1, 40, 1)}, out = vec(z, 40, 1);
	ck_assert_msg(fz_exec_run(x, NULL, in, 2, &out, 1, NULL, &err) == FZ_OK,
		      "run: %s", err ? err : "?");
	for (int i = 0; i < 40; i++)
		ck_assert_float_eq(z[i], 2.0f * (float)(3 * i) + (float)(3 * (i + 1)));
	/* contiguous again: read in place, the same prepared plan */
	fz_tensor in2[2] = {vec(a, 40, 1), vec(b, 40, 1)};
	ck_assert_int_eq(fz_exec_run(x, NULL, in2, 2, &out, 1, NULL, &err), FZ_OK);
	for (int i = 0; i < 40; i++)
		ck_assert_float_eq(z[i], 2.0f * (float)i + (float)(3 * i));
	ck_assert_int_eq(fz_exec_stats_of(x)->plans, 1);
	fz_exec_free(x);
	free(a);
	free(b);
	free(z);
	fz_module_free(m);
}
END_TEST

/* Attention on the host reads q, k, v and do where the projections left
 * them ([B, T, H D] seen as [B, H, T, D] through reshape and permute: no
 * staging copy), and runs attention_dq and attention_dkv of one set of
 * operands as one kernel (one pass over the block pairs): two steps in
 * all, and every output bit for bit what the contiguous operands give. */
#define ATB 2
#define ATT 33
#define ATH 4
#define ATK 2
#define ATD 64
static const char *attn_strided_src =
	"trace s(qp: f32[2, 33, 256], kp: f32[2, 33, 128], vp: f32[2, 33, 128],\n"
	"        dop: f32[2, 33, 256]) {\n"
	"  q = permute(reshape(qp, shape=[2, 33, 4, 64]), dims=[0, 2, 1, 3])\n"
	"  k = permute(reshape(kp, shape=[2, 33, 2, 64]), dims=[0, 2, 1, 3])\n"
	"  v = permute(reshape(vp, shape=[2, 33, 2, 64]), dims=[0, 2, 1, 3])\n"
	"  do = permute(reshape(dop, shape=[2, 33, 4, 64]), dims=[0, 2, 1, 3])\n"
	"  o, lse = attention(q, k, v, causal=true, scale=0.125)\n"
	"  dq = attention_dq(q, k, v, o, lse, do, causal=true, scale=0.125)\n"
	"  dk, dv = attention_dkv(q, k, v, o, lse, do, causal=true, scale=0.125)\n"
	"  return o, lse, dq, dk, dv\n"
	"}\n";
static const char *attn_contig_src =
	"trace c(q: f32[2, 4, 33, 64], k: f32[2, 2, 33, 64], v: f32[2, 2, 33, 64],\n"
	"        do: f32[2, 4, 33, 64]) {\n"
	"  o, lse = attention(q, k, v, causal=true, scale=0.125)\n"
	"  dq = attention_dq(q, k, v, o, lse, do, causal=true, scale=0.125)\n"
	"  dk, dv = attention_dkv(q, k, v, o, lse, do, causal=true, scale=0.125)\n"
	"  return o, lse, dq, dk, dv\n"
	"}\n";

static void attn_run(const char *src, float *const *in, const int64_t (*shape)[4],
		     int in_rank, float **out, int *steps)
{
	static const int64_t oshape[5][4] = {{ATB, ATH, ATT, ATD}, {ATB, ATH, ATT, 0},
		{ATB, ATH, ATT, ATD}, {ATB, ATK, ATT, ATD}, {ATB, ATK, ATT, ATD}};
	fz_module *m = parse(src);
	fz_exec *x = prepare(fz_module_trace(m, 0), 8);
	fz_tensor ti[4], to[5];
	for (int i = 0; i < 4; i++)
		fz_tensor_contiguous(&ti[i], in[i], FZ_F32, in_rank, shape[i]);
	for (int k = 0; k < 5; k++)
		fz_tensor_contiguous(&to[k], out[k], FZ_F32, k == 1 ? 3 : 4, oshape[k]);
	char *err = NULL;
	ck_assert_msg(fz_exec_run(x, NULL, ti, 4, to, 5, NULL, &err) == FZ_OK, "run: %s",
		      err ? err : "?");
	*steps = fz_exec_stats_of(x)->steps;
	fz_exec_free(x);
	fz_module_free(m);
}

START_TEST(attention_strided_one_backward)
{
	int64_t n[4] = {ATB * ATT * ATH * ATD, ATB * ATT * ATK * ATD, ATB * ATT * ATK * ATD,
			ATB * ATT * ATH * ATD};
	int heads[4] = {ATH, ATK, ATK, ATH};
	float *pin[4], *cin[4], *so[5], *co[5];
	int64_t no[5] = {n[0], ATB * ATH * ATT, n[0], n[1], n[1]};
	uint32_t r = 12345;
	for (int i = 0; i < 4; i++) {
		pin[i] = aligned_alloc(64, (size_t)n[i] * 4);
		cin[i] = aligned_alloc(64, (size_t)n[i] * 4);
		for (int64_t e = 0; e < n[i]; e++) {
			r = r * 1664525u + 1013904223u;
			pin[i][e] = (float)(r >> 8) / 16777216.0f - 0.5f;
		}
		/* [B, T, H, D] -> [B, H, T, D] */
		int h = heads[i];
		for (int b = 0; b < ATB; b++)
			for (int t = 0; t < ATT; t++)
				for (int hh = 0; hh < h; hh++)
					memcpy(&cin[i][((b * h + hh) * ATT + t) * ATD],
					       &pin[i][((b * ATT + t) * h + hh) * ATD], ATD * 4);
	}
	for (int k = 0; k < 5; k++) {
		size_t bytes = ((size_t)no[k] * 4 + 63) / 64 * 64;
		so[k] = aligned_alloc(64, bytes);
		co[k] = aligned_alloc(64, bytes);
	}
	const int64_t ps[4][4] = {{ATB, ATT, ATH * ATD}, {ATB, ATT, ATK * ATD}, {ATB, ATT, ATK * ATD},
				  {ATB, ATT, ATH * ATD}};
	const int64_t cs[4][4] = {{ATB, ATH, ATT, ATD}, {ATB, ATK, ATT, ATD}, {ATB, ATK, ATT, ATD},
				  {ATB, ATH, ATT, ATD}};
	int ssteps, csteps;
	attn_run(attn_strided_src, pin, ps, 3, so, &ssteps);
	attn_run(attn_contig_src, cin, cs, 4, co, &csteps);
	/* the forward and the one backward pass: no gathers, no dkv kernel */
	ck_assert_int_eq(ssteps, 2);
	ck_assert_int_eq(csteps, 2);
	for (int k = 0; k < 5; k++)
		ck_assert_msg(!memcmp(so[k], co[k], (size_t)no[k] * 4), "output %d differs", k);
	for (int i = 0; i < 4; i++) {
		free(pin[i]);
		free(cin[i]);
	}
	for (int k = 0; k < 5; k++) {
		free(so[k]);
		free(co[k]);
	}
}
END_TEST

/* One plan per binding, kept in an LRU of max_plans. */
START_TEST(plan_lru)
{
	fz_module *m = parse(axpy_src);
	fz_exec *x = prepare(fz_module_trace(m, 0), 2);
	float *a = aligned_alloc(64, 64 * 4), *z = aligned_alloc(64, 64 * 4);
	for (int i = 0; i < 64; i++)
		a[i] = 1.0f;
	int64_t sizes[] = {5, 6, 5, 7, 5, 6};
	int want_plans[] = {1, 2, 2, 3, 3, 4};
	for (int k = 0; k < 6; k++) {
		fz_tensor in[2] = {vec(a, sizes[k], 1), vec(a, sizes[k], 1)};
		fz_tensor out = vec(z, sizes[k], 1);
		ck_assert_int_eq(fz_exec_run(x, NULL, in, 2, &out, 1, NULL, NULL), FZ_OK);
		ck_assert_int_eq(fz_exec_stats_of(x)->plans, want_plans[k]);
		ck_assert_float_eq(z[sizes[k] - 1], 3.0f);
	}
	fz_exec_free(x);
	free(a);
	free(z);
	fz_module_free(m);
}
END_TEST

/* Outputs that are an input, a view, or another output's value are
 * copied into the caller's buffers. */
START_TEST(outputs_that_alias)
{
	fz_module *m = parse(
		"trace f(x: f32[2, 3]) {\n"
		"  y = add(x, 1.0)\n"
		"  t = permute(y, dims=[1, 0])\n"
		"  return x, y, t, y\n"
		"}\n");
	fz_exec *x = prepare(fz_module_trace(m, 0), 8);
	float *a = aligned_alloc(64, 64), *o[4];
	for (int i = 0; i < 6; i++)
		a[i] = (float)i;
	fz_tensor in = {a, FZ_F32, 2, {2, 3}, {3, 1}}, out[4];
	for (int k = 0; k < 4; k++) {
		o[k] = aligned_alloc(64, 64);
		out[k] = (fz_tensor){o[k], FZ_F32, 2, {2, 3}, {3, 1}};
	}
	out[2].shape[0] = 3;
	out[2].shape[1] = 2;
	out[2].strides[0] = 2;
	char *err = NULL;
	ck_assert_msg(fz_exec_run(x, NULL, &in, 1, out, 4, NULL, &err) == FZ_OK,
		      "run: %s", err ? err : "?");
	for (int r = 0; r < 2; r++)
		for (int c = 0; c < 3; c++) {
			ck_assert_float_eq(o[0][r * 3 + c], (float)(r * 3 + c));
			ck_assert_float_eq(o[1][r * 3 + c], (float)(r * 3 + c) + 1);
			ck_assert_float_eq(o[3][r * 3 + c], (float)(r * 3 + c) + 1);
			ck_assert_float_eq(o[2][c * 2 + r], (float)(r * 3 + c) + 1);
		}
	fz_exec_free(x);
	free(a);
	for (int k = 0; k < 4; k++)
		free(o[k]);
	fz_module_free(m);
}
END_TEST

/* Each bad call: its status, and a message naming the culprit. */
START_TEST(bad_calls)
{
	fz_module *m = parse(axpy_src);
	const fz_trace *t = fz_module_trace(m, 0);
	fz_exec *x = prepare(t, 8);
	float *a = aligned_alloc(64, 64 * 4), *z = aligned_alloc(64, 64 * 4);
	memset(a, 0, 64 * 4);
	char *err = NULL;
	fz_tensor in[2] = {vec(a, 8, 1), vec(a, 8, 1)}, out = vec(z, 8, 1);
	struct {
		const char *what, *says;
		fz_status st;
	} cases[] = {
		{"dtype", "input 1 ('y', f32[N]) is given a tensor of dtype f64", FZ_EINVAL},
		{"rank", "input 1 ('y', f32[N]) is given a tensor of rank 2", FZ_EINVAL},
		{"shape", "symbol 'N' is bound to 9", FZ_EBIND},
		{"count", "takes 2 inputs; got 1", FZ_EINVAL},
		{"out shape", "output 0 ('z') is given extent 7 in dim 0", FZ_EINVAL},
		{"out strided", "output 0 ('z') is not contiguous", FZ_EINVAL},
		{"out misaligned", "output 0 ('z'): data is not 16-byte aligned", FZ_EINVAL},
		{"out null", "output 0 ('z'): data is NULL", FZ_EINVAL},
		{"out count", "returns 1 value; 2 output tensors given", FZ_EINVAL},
		{"unbound", "symbol 'N' is given the size -5", FZ_EBIND},
	};
	for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
		fz_tensor i2[2] = {in[0], in[1]}, o2[2] = {out, out};
		int n_in = 2, n_out = 1;
		int64_t bad_size = -5, *sizes = NULL;
		switch (c) {
		case 0: i2[1].dtype = FZ_F64; break;
		case 1: i2[1].rank = 2; i2[1].shape[1] = 1; i2[1].strides[1] = 1; break;
		case 2: i2[1].shape[0] = 9; break;
		case 3: n_in = 1; break;
		case 4: o2[0].shape[0] = 7; break;
		case 5: o2[0].strides[0] = 2; break;
		case 6: o2[0].data = z + 1; break;
		case 7: o2[0].data = NULL; break;
		case 8: n_out = 2; break;
		case 9: sizes = &bad_size; break;
		}
		fz_status st = fz_exec_run(x, sizes, i2, n_in, o2, n_out, NULL, &err);
		ck_assert_msg(st == cases[c].st, "%s: status %s", cases[c].what,
			      fz_status_name(st));
		ck_assert_msg(err && strstr(err, cases[c].says), "%s: message '%s'",
			      cases[c].what, err ? err : "(none)");
		fz_free(err);
		err = NULL;
	}
	/* still fine after all that */
	ck_assert_int_eq(fz_exec_run(x, NULL, in, 2, &out, 1, NULL, &err), FZ_OK);

	/* handles and devices */
	struct { uint32_t magic; char rest[60]; } foreign = {0x1234, {0}};
	ck_assert_int_eq(fz_exec_run((fz_exec *)&foreign, NULL, in, 2, &out, 1, NULL,
				     &err), FZ_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "not an fz_exec handle"));
	fz_free(err);
	err = NULL;
	ck_assert_int_eq(fz_exec_run(NULL, NULL, in, 2, &out, 1, NULL, &err), FZ_EINVAL);
	fz_free(err);
	err = NULL;
	fz_exec *y = NULL;
	ck_assert_int_eq(fz_exec_new(t, "tpu", NULL, &y, &err), FZ_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "unknown device 'tpu'"));
	ck_assert_ptr_null(y);
	fz_free(err);
	err = NULL;
	ck_assert_int_eq(fz_exec_new(NULL, "cpu", NULL, &y, &err), FZ_EINVAL);
	fz_free(err);
	err = NULL;
	fz_exec_free(x);
#if !defined(__SANITIZE_ADDRESS__)
	/* a freed handle (under ASan, the sanitizer itself reports the use) */
	ck_assert_int_eq(fz_exec_run(x, NULL, in, 2, &out, 1, NULL, &err), FZ_EINVAL);
	fz_free(err);
#endif
	free(a);
	free(z);
	fz_module_free(m);
}
END_TEST

/* One fz_exec runs on one thread at a time; a call that enters it while
 * another is inside is refused with a status and a message, never let in
 * to share the plan's arena. Made deterministic by entering from inside
 * the first run itself: the caller's allocator is called as that run sizes
 * its arena, and calls run, sync and profile on the same fz_exec there. */
struct reentry {
	fz_exec *x;
	fz_tensor in[2], out;
	fz_status st[3];
	char *err[3];
	int calls;
};

static void *reentering_alloc(void *ctx, size_t bytes)
{
	struct reentry *r = ctx;
	if (r->calls++ == 0) {
		r->st[0] = fz_exec_run(r->x, NULL, r->in, 2, &r->out, 1, NULL, &r->err[0]);
		r->st[1] = fz_exec_sync(r->x, NULL, &r->err[1]);
		char *prof = NULL;
		r->st[2] = fz_exec_profile(r->x, 0, &prof);
		fz_free(prof);
	}
	return aligned_alloc(256, (bytes + 255) / 256 * 256);
}

static void plain_release(void *ctx, void *p)
{
	(void)ctx;
	free(p);
}

START_TEST(a_run_inside_a_run_is_refused)
{
	fz_module *m = parse(axpy_src);
	const fz_trace *t = fz_module_trace(m, 0);
	struct reentry r = {0};
	fz_exec_options o;
	fz_exec_options_init(&o);
	o.disk_cache = 0;
	o.alloc = reentering_alloc;
	o.release = plain_release;
	o.alloc_ctx = &r;
	char *err = NULL;
	ck_assert_int_eq(fz_exec_new(t, "cpu", &o, &r.x, &err), FZ_OK);
	float x[8], y[8], z[8] __attribute__((aligned(64)));
	for (int i = 0; i < 8; i++)
		x[i] = (float)i, y[i] = 1.0f;
	r.in[0] = vec(x, 8, 1);
	r.in[1] = vec(y, 8, 1);
	r.out = vec(z, 8, 1);
	ck_assert_int_eq(fz_exec_run(r.x, NULL, r.in, 2, &r.out, 1, NULL, &err), FZ_OK);
	ck_assert_msg(r.calls >= 1, "the allocator was never called");
	const char *names[3] = {"fz_exec_run", "fz_exec_sync", "fz_exec_profile"};
	for (int k = 0; k < 3; k++) {
		ck_assert_msg(r.st[k] == FZ_EINVAL, "%s inside a run: %s", names[k],
			      fz_status_name(r.st[k]));
		if (k < 2) /* profile has no message */
			ck_assert_msg(r.err[k] && strstr(r.err[k], "running already") &&
				      strstr(r.err[k], names[k]), "%s: message '%s'", names[k],
				      r.err[k] ? r.err[k] : "(none)");
		fz_free(r.err[k]);
	}
	for (int i = 0; i < 8; i++)
		ck_assert_float_eq(z[i], 2.0f * (float)i + 1.0f);
	/* and the fz_exec is free again once the run is over */
	memset(z, 0, sizeof z);
	ck_assert_int_eq(fz_exec_run(r.x, NULL, r.in, 2, &r.out, 1, NULL, &err), FZ_OK);
	ck_assert_int_eq(fz_exec_sync(r.x, NULL, &err), FZ_OK);
	ck_assert_float_eq(z[7], 15.0f);
	fz_exec_free(r.x);
	fz_module_free(m);
}
END_TEST

START_TEST(index_out_of_range)
{
	fz_module *m = parse(
		"trace emb(w: f32[4, 2], i: i64[3]) {\n"
		"  e = take(w, i, dim=0)\n"
		"  return e\n"
		"}\n");
	fz_exec *x = prepare(fz_module_trace(m, 0), 8);
	float *w = aligned_alloc(64, 64), *e = aligned_alloc(64, 64);
	int64_t *idx = aligned_alloc(64, 64);
	for (int i = 0; i < 8; i++)
		w[i] = (float)i;
	idx[0] = 1;
	idx[1] = 3;
	idx[2] = 0;
	fz_tensor in[2] = {{w, FZ_F32, 2, {4, 2}, {2, 1}}, {idx, FZ_I64, 1, {3}, {1}}};
	fz_tensor out = {e, FZ_F32, 2, {3, 2}, {2, 1}};
	char *err = NULL;
	ck_assert_int_eq(fz_exec_run(x, NULL, in, 2, &out, 1, NULL, &err), FZ_OK);
	ck_assert_float_eq(e[2], 6.0f);
	idx[1] = 4;
	ck_assert_int_eq(fz_exec_run(x, NULL, in, 2, &out, 1, NULL, &err), FZ_ERANGE);
	ck_assert_msg(strstr(err, "take at 2:7: an index is out of range"), "%s", err);
	fz_free(err);
	err = NULL;
	idx[1] = 2; /* and the next run is clean */
	ck_assert_int_eq(fz_exec_run(x, NULL, in, 2, &out, 1, NULL, &err), FZ_OK);
	ck_assert_int_eq(fz_exec_sync(x, NULL, &err), FZ_OK);
	fz_exec_free(x);
	free(w);
	free(e);
	free(idx);
	fz_module_free(m);
}
END_TEST

/* Every target in the list fills every slot: the runner calls them all
 * without checking. */
START_TEST(targets_fill_every_slot)
{
	const char *names = fz_target_names();
	ck_assert_ptr_nonnull(strstr(names, "cpu"));
	const fz_target *tg = fz_target_find("cpu");
	ck_assert_ptr_nonnull(tg);
	ck_assert_ptr_null(fz_target_find("nope"));
	ck_assert_ptr_null(fz_target_find(NULL));
	char buf[128];
	snprintf(buf, sizeof buf, "%s", names);
	for (char *n = strtok(buf, ", "); n; n = strtok(NULL, ", ")) {
		tg = fz_target_find(n);
		ck_assert_msg(tg && tg->open && tg->close && tg->alloc && tg->release &&
			      tg->upload && tg->download && tg->copy && tg->load &&
			      tg->launch && tg->matmul && tg->collective &&
			      tg->event_record && tg->event_wait && tg->sync,
			      "target %s leaves a slot empty", n);
	}
}
END_TEST

/* The one-shot entry point allocates its outputs. */
START_TEST(trace_run_one_shot)
{
	fz_module *m = parse(axpy_src);
	float a[5] = {1, 2, 3, 4, 5}, b[5] = {1, 1, 1, 1, 1};
	fz_tensor in[2] = {vec(a, 5, 1), vec(b, 5, 1)}, out;
	char *err = NULL;
	ck_assert_int_eq(fz_trace_run(fz_module_trace(m, 0), "cpu", NULL, in, 2, &out,
				      1, &err), FZ_OK);
	ck_assert_int_eq(out.shape[0], 5);
	ck_assert_float_eq(((float *)out.data)[4], 11.0f);
	fz_free(out.data);
	fz_module_free(m);
}
END_TEST

/* The host cache: a released block serves the next request of its size
 * class, the limit evicts the blocks released longest ago, and a DLPack
 * tensor made of a block describes it and releases it when deleted. Each
 * test runs in its own process (Check forks), so the cache starts empty. */
#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static void *churn(void *arg)
{
	atomic_int *stop = arg;
	while (!atomic_load(stop)) {
		void *d;
		fz_host_release(fz_host_alloc(64 * KIB, &d));
	}
	return NULL;
}

/* Forks while another thread takes and gives back blocks all the time:
 * each child allocates at once and exits. Without the fork handlers a
 * child forked while the other thread held the cache's lock waits for it
 * forever (93 of 200 forks did, here). */
/* Waits up to ms milliseconds for child pid; false (and the child killed)
 * if it has not exited by then. */
static bool wait_child(pid_t pid, int ms, int *status)
{
	int waited = 0;
	while (waitpid(pid, status, WNOHANG) == 0 && waited < ms) {
		usleep(1000);
		waited++;
	}
	if (waited < ms)
		return true;
	kill(pid, SIGKILL);
	waitpid(pid, status, 0);
	return false;
}

START_TEST(a_forked_child_runs_and_frees)
{
	/* the pool's workers stay in the parent: a forked child runs the
	 * parent's program on its own thread and frees it without joining
	 * threads it does not have (that join waited forever) */
	fz_module *m = parse(axpy_src);
	const fz_trace *t = fz_module_trace(m, 0);
	fz_exec_options o;
	fz_exec_options_init(&o);
	o.disk_cache = 0;
	o.threads = 2;
	fz_exec *x = NULL;
	char *err = NULL;
	ck_assert_int_eq(fz_exec_new(t, "cpu", &o, &x, &err), FZ_OK);
	enum { N = 1 << 20 };
	float *a = aligned_alloc(64, N * 4), *z = aligned_alloc(64, N * 4);
	for (int i = 0; i < N; i++)
		a[i] = (float)(i % 1000);
	fz_tensor in[2] = {vec(a, N, 1), vec(a, N, 1)}, out = vec(z, N, 1);
	ck_assert_int_eq(fz_exec_run(x, NULL, in, 2, &out, 1, NULL, &err), FZ_OK);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		memset(z, 0, N * 4);
		int bad = fz_exec_run(x, NULL, in, 2, &out, 1, NULL, NULL) != FZ_OK;
		for (int i = 0; i < N && !bad; i++)
			bad = z[i] != 3.0f * (float)(i % 1000);
		fz_exec_free(x); /* the last fz_exec: the device and its pool go */
		_exit(bad ? 2 : 0);
	}
	int status = 0;
	ck_assert_msg(wait_child(pid, 30000, &status), "the forked child hung");
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
	ck_assert_int_eq(fz_exec_run(x, NULL, in, 2, &out, 1, NULL, &err), FZ_OK);
	ck_assert_float_eq(z[N - 1], 3.0f * (float)((N - 1) % 1000));
	fz_exec_free(x);
	free(a);
	free(z);
	fz_module_free(m);
}
END_TEST

START_TEST(host_cache_survives_fork)
{
	atomic_int stop = 0;
	pthread_t th;
	void *d;
	fz_host_release(fz_host_alloc(64 * KIB, &d));
	ck_assert_int_eq(pthread_create(&th, NULL, churn, &stop), 0);
	int hung = 0;
	for (int i = 0; i < 200; i++) {
		pid_t pid = fork();
		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			fz_host_release(fz_host_alloc(64 * KIB, &d));
			_exit(0);
		}
		int status = 0;
		hung += !wait_child(pid, 2000, &status);
	}
	atomic_store(&stop, 1);
	pthread_join(th, NULL);
	ck_assert_int_eq(hung, 0);
}
END_TEST

START_TEST(host_cache_reuses_a_class)
{
	void *a, *b, *c;
	fz_host_block *ba = fz_host_alloc(100 * KIB, &a);
	ck_assert_ptr_nonnull(ba);
	ck_assert_uint_eq((uintptr_t)a % (2 * MIB), 0);
	memset(a, 7, 100 * KIB);
	fz_host_stats s;
	fz_host_cache_stats(&s);
	ck_assert_uint_eq(s.live_bytes, 128 * KIB); /* 64 KiB classes */
	ck_assert_int_eq(s.misses, 1);
	fz_host_release(ba);
	fz_host_cache_stats(&s);
	ck_assert_uint_eq(s.live_bytes, 0);
	ck_assert_uint_eq(s.cached_bytes, 128 * KIB);
	/* 70 KiB is the same class: the same block, still mapped */
	fz_host_block *bb = fz_host_alloc(70 * KIB, &b);
	ck_assert_ptr_eq(b, a);
	ck_assert_int_eq(((unsigned char *)b)[100 * KIB - 1], 7);
	/* 200 KiB is another: new memory */
	fz_host_block *bc = fz_host_alloc(200 * KIB, &c);
	ck_assert_ptr_ne(c, a);
	fz_host_cache_stats(&s);
	ck_assert_int_eq(s.hits, 1);
	ck_assert_int_eq(s.misses, 2);
	ck_assert_uint_eq(s.cached_bytes, 0);
	ck_assert_uint_eq(s.live_bytes, 128 * KIB + 256 * KIB);
	/* above 4 MiB the classes step by 2 MiB */
	void *d;
	fz_host_block *bd = fz_host_alloc(5 * MIB, &d);
	fz_host_cache_stats(&s);
	ck_assert_uint_eq(s.live_bytes, 384 * KIB + 6 * MIB);
	memset(d, 1, 5 * MIB);
	fz_host_release(bb);
	fz_host_release(bc);
	fz_host_release(bd);
	fz_host_release(NULL);
	fz_host_cache_empty();
	fz_host_cache_stats(&s);
	ck_assert_uint_eq(s.cached_bytes, 0);
	ck_assert_uint_eq(s.live_bytes, 0);
}
END_TEST

START_TEST(host_cache_limit_evicts_the_oldest)
{
	fz_host_cache_set_limit(256 * KIB);
	void *p[3];
	fz_host_block *b[3];
	for (int i = 0; i < 3; i++)
		b[i] = fz_host_alloc(128 * KIB, &p[i]);
	for (int i = 0; i < 3; i++)
		fz_host_release(b[i]);
	fz_host_stats s;
	fz_host_cache_stats(&s);
	ck_assert_uint_eq(s.limit_bytes, 256 * KIB);
	ck_assert_uint_eq(s.cached_bytes, 256 * KIB);
	/* the most recently released first; the first one was unmapped */
	void *q[2];
	fz_host_block *c0 = fz_host_alloc(128 * KIB, &q[0]);
	fz_host_block *c1 = fz_host_alloc(128 * KIB, &q[1]);
	ck_assert_ptr_eq(q[0], p[2]);
	ck_assert_ptr_eq(q[1], p[1]);
	fz_host_cache_stats(&s);
	ck_assert_int_eq(s.hits, 2);
	fz_host_release(c0);
	fz_host_release(c1);
	fz_host_cache_set_limit(0);
	fz_host_cache_stats(&s);
	ck_assert_uint_eq(s.cached_bytes, 0);
	void *r;
	fz_host_release(fz_host_alloc(128 * KIB, &r)); /* not kept */
	fz_host_cache_stats(&s);
	ck_assert_uint_eq(s.cached_bytes, 0);
	ck_assert_int_eq(s.misses, 4);
}
END_TEST

/* DLPack's ABI (dlpack.h), as a consumer reads it. */
typedef struct {
	void *data;
	int32_t device_type, device_id;
	int32_t ndim;
	uint8_t code, bits;
	uint16_t lanes;
	int64_t *shape, *strides;
	uint64_t byte_offset;
	void *manager_ctx;
	void (*deleter)(void *self);
} dl_managed;

START_TEST(host_cache_dlpack)
{
	void *p;
	fz_host_block *b = fz_host_alloc(3 * 5 * 7 * 2, &p);
	int64_t shape[3] = {3, 5, 7};
	dl_managed *m = fz_host_block_dlpack(b, FZ_BF16, 3, shape);
	ck_assert_ptr_nonnull(m);
	ck_assert_ptr_eq(m->data, p);
	ck_assert_int_eq(m->device_type, 1); /* kDLCPU */
	ck_assert_int_eq(m->ndim, 3);
	ck_assert_int_eq(m->code, 4);        /* kDLBfloat */
	ck_assert_int_eq(m->bits, 16);
	ck_assert_int_eq(m->lanes, 1);
	ck_assert_int_eq(m->shape[0], 3);
	ck_assert_int_eq(m->shape[2], 7);
	ck_assert_int_eq(m->strides[0], 35);
	ck_assert_int_eq(m->strides[1], 7);
	ck_assert_int_eq(m->strides[2], 1);
	ck_assert_uint_eq(m->byte_offset, 0);
	/* a shape larger than the block, a bad rank: no tensor */
	int64_t big[2] = {1 << 20, 1 << 20}, neg[1] = {-1};
	ck_assert_ptr_null(fz_host_block_dlpack(b, FZ_F32, 2, big));
	ck_assert_ptr_null(fz_host_block_dlpack(b, FZ_F32, 1, neg));
	ck_assert_ptr_null(fz_host_block_dlpack(b, FZ_F32, FZ_MAX_RANK + 1, shape));
	/* a scalar */
	m = fz_host_block_dlpack(b, FZ_F64, 0, NULL);
	ck_assert_ptr_nonnull(m);
	ck_assert_int_eq(m->ndim, 0);
	/* the deleter gives the block back */
	m->deleter(m);
	fz_host_stats s;
	fz_host_cache_stats(&s);
	ck_assert_uint_eq(s.live_bytes, 0);
	ck_assert_uint_eq(s.cached_bytes, 64 * KIB);
}
END_TEST

static Suite *runtime_suite(void)
{
	Suite *s = suite_create("runtime");
	TCase *c = tcase_create("prepared");
	tcase_add_test(c, outputs_in_place);
	tcase_add_test(c, outputs_views_in_place);
	tcase_add_test(c, transposed_a_in_place);
	tcase_add_test(c, permute_under_a_reshape_is_written);
	tcase_add_test(c, strided_and_misaligned_inputs);
	tcase_add_test(c, attention_strided_one_backward);
	tcase_add_test(c, plan_lru);
	tcase_add_test(c, outputs_that_alias);
	tcase_add_test(c, trace_run_one_shot);
	tcase_add_test(c, a_forked_child_runs_and_frees);
	suite_add_tcase(s, c);
	c = tcase_create("errors");
	tcase_add_test(c, bad_calls);
	tcase_add_test(c, index_out_of_range);
	tcase_add_test(c, a_run_inside_a_run_is_refused);
	suite_add_tcase(s, c);
	c = tcase_create("host_cache");
	tcase_add_test(c, host_cache_reuses_a_class);
	tcase_add_test(c, host_cache_survives_fork);
	tcase_add_test(c, host_cache_limit_evicts_the_oldest);
	tcase_add_test(c, host_cache_dlpack);
	suite_add_tcase(s, c);
	c = tcase_create("targets");
	tcase_add_test(c, targets_fill_every_slot);
	suite_add_tcase(s, c);
	return s;
}

int main(void)
{
	SRunner *r = srunner_create(runtime_suite());
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
