/*
 * test_cuda.c: the CUDA target on a GPU. Exits 77 (skipped) where none is.
 *
 * What only a device can show: the gather kernel's PTX copies strided
 * views right; cuBLASLt's products match a host reference for f32 and
 * bf16, batched with broadcast and with the bias epilogue; generated
 * kernels (a pointwise chain, a row normalization, a reduction, a matmul
 * region) run through fz_exec on device pointers and match the
 * interpreter within `fusec run --check`'s tolerances; an index out of
 * range is reported by fz_exec_sync naming the op, and the run does not
 * fault; two programs of the same trace share the device and its modules
 * (the second loads nothing); the primary context is the thread's current
 * one for torch to share; a run captured into a CUDA graph replays to the
 * same outputs (fz_exec_run_graph). The corpus and model sweep is
 * tools/gpu/run.sh.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_target.h"
#include "exec.h"
#include "fusec.h"
#include "ir.h"
#include "math_sweep.h"
#include "target.h"

static fz_device *dev;
static bool use_graph; /* run_and_check through fz_exec_run_graph */

static void *dalloc(size_t n)
{
	void *p = NULL;
	char *err = NULL;
	fz_status st = fz_target_cuda.alloc(dev, n, &p, &err);
	ck_assert_msg(st == FZ_OK, "%s", err ? err : "?");
	return p;
}

static void *to_dev(const void *h, size_t n)
{
	void *p = dalloc(n);
	char *err = NULL;
	ck_assert_int_eq(fz_target_cuda.upload(dev, p, h, n, NULL, &err), FZ_OK);
	return p;
}

static void from_dev(void *h, const void *p, size_t n)
{
	char *err = NULL;
	fz_status st = fz_target_cuda.download(dev, h, p, n, NULL, &err);
	ck_assert_msg(st == FZ_OK, "%s", err ? err : "?");
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static double urand(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

static uint16_t to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* ---- the gather ------------------------------------------------------------ */

START_TEST(gather_matches_host)
{
	enum { A = 5, B = 7, C = 9 };
	static float src[A * B * C], got[A * B * C];
	for (int i = 0; i < A * B * C; i++)
		src[i] = (float)i;
	void *s = to_dev(src, sizeof src), *d = dalloc(sizeof src);
	/* [A, B, C] permuted to [C, A, B] */
	fz_layout l = {3, {C, A, B}, {1, B * C, C}, 0};
	char *err = NULL;
	ck_assert_int_eq(fz_target_cuda.copy(dev, d, s, 4, &l, NULL, &err), FZ_OK);
	from_dev(got, d, sizeof got);
	for (int c = 0; c < C; c++)
		for (int a = 0; a < A; a++)
			for (int b = 0; b < B; b++)
				ck_assert_float_eq(got[(c * A + a) * B + b],
				                   src[(a * B + b) * C + c]);
	/* every element size, over a slice with an offset */
	for (size_t es = 1; es <= 8; es *= 2) {
		fz_layout sl = {2, {3, 4}, {(int64_t)(2 * C), 2}, 5};
		ck_assert_int_eq(fz_target_cuda.copy(dev, d, s, es, &sl, NULL, &err), FZ_OK);
		unsigned char g[12 * 8];
		from_dev(g, d, 12 * es);
		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 4; j++)
				ck_assert_int_eq(memcmp(g + (i * 4 + j) * es,
				                        (const char *)src + (5 + i * 2 * C + j * 2) * es,
				                        es), 0);
	}
	fz_target_cuda.release(dev, s);
	fz_target_cuda.release(dev, d);
}
END_TEST

/* ---- cuBLASLt ---------------------------------------------------------------- */

static void matmul_case(fz_dtype dt, int64_t M, int64_t N, int64_t K, bool trans,
                        bool bias, int nbd, const int64_t *bs, const int64_t *sa,
                        const int64_t *sb, int64_t na, int64_t nw)
{
	int64_t nb = 1;
	for (int i = 0; i < nbd; i++)
		nb *= bs[i];
	int64_t ny = nb * M * N;
	size_t es = fz_dtype_size(dt);
	float *a = malloc((size_t)na * 4), *w = malloc((size_t)nw * 4);
	float *bi = malloc((size_t)N * 4), *ref = malloc((size_t)ny * 4);
	void *ha = malloc((size_t)na * es), *hw = malloc((size_t)nw * es);
	void *hb = malloc((size_t)N * es), *hy = malloc((size_t)ny * es);
	float *arr[3] = {a, w, bi};
	void *harr[3] = {ha, hw, hb};
	int64_t n[3] = {na, nw, N};
	for (int t = 0; t < 3; t++)
		for (int64_t i = 0; i < n[t]; i++) {
			float v = (float)urand();
			if (dt == FZ_BF16) {
				((uint16_t *)harr[t])[i] = to_bf16(v);
				v = from_bf16(to_bf16(v));
			} else {
				((float *)harr[t])[i] = v;
			}
			arr[t][i] = v;
		}
	fz_matmul m = {.region = 1, .dtype = dt, .M = M, .N = N, .K = K,
	               .b_trans = trans, .nbd = nbd};
	for (int i = 0; i < nbd; i++)
		m.bshape[i] = bs[i], m.a_bstride[i] = sa[i], m.b_bstride[i] = sb[i];
	double worst = 0;
	for (int64_t b = 0; b < nb; b++) {
		int64_t oa = 0, ow = 0, r = b;
		for (int d = nbd - 1; d >= 0; d--) {
			oa += (r % bs[d]) * sa[d];
			ow += (r % bs[d]) * sb[d];
			r /= bs[d];
		}
		for (int64_t i = 0; i < M; i++)
			for (int64_t j = 0; j < N; j++) {
				double s = bias ? bi[j] : 0;
				for (int64_t l = 0; l < K; l++)
					s += (double)a[oa + i * K + l] *
					     w[ow + (trans ? j * K + l : l * N + j)];
				ref[b * M * N + i * N + j] = (float)s;
			}
	}
	void *da = to_dev(ha, (size_t)na * es), *dw = to_dev(hw, (size_t)nw * es);
	void *db = to_dev(hb, (size_t)N * es), *dy = dalloc((size_t)ny * es);
	void *ws = dalloc(fz_target_cuda.matmul_workspace);
	m.a = da, m.b = dw, m.bias = bias ? db : NULL, m.y = dy;
	m.workspace = ws;
	m.workspace_bytes = fz_target_cuda.matmul_workspace;
	char *err = NULL;
	fz_status st = fz_target_cuda.matmul(dev, &m, NULL, &err);
	ck_assert_msg(st == FZ_OK, "%s", err ? err : "?");
	from_dev(hy, dy, (size_t)ny * es);
	/* f32 without TF32: K products in f32 with f32 sums; bf16: the
	 * result rounded to bf16 */
	double tol = dt == FZ_BF16 ? 1.0 / 128 : 1e-5 * sqrt((double)K);
	for (int64_t i = 0; i < ny; i++) {
		double g = dt == FZ_BF16 ? from_bf16(((uint16_t *)hy)[i]) : ((float *)hy)[i];
		double e = fabs(g - ref[i]) / (1 + fabs(ref[i]));
		if (e > worst)
			worst = e;
		ck_assert_msg(e <= tol, "%s %lldx%lldx%lld y[%lld] = %g, want %g",
		              fz_dtype_name(dt), (long long)M, (long long)N, (long long)K,
		              (long long)i, g, ref[i]);
	}
	void *ps[5] = {da, dw, db, dy, ws};
	for (int i = 0; i < 5; i++)
		fz_target_cuda.release(dev, ps[i]);
	free(a), free(w), free(bi), free(ref), free(ha), free(hw), free(hb), free(hy);
}

START_TEST(matmul_matches_host)
{
	matmul_case(FZ_F32, 33, 65, 129, false, false, 0, NULL, NULL, NULL, 33 * 129, 129 * 65);
	matmul_case(FZ_F32, 16, 48, 32, true, true, 0, NULL, NULL, NULL, 16 * 32, 48 * 32);
	matmul_case(FZ_BF16, 64, 96, 128, true, true, 0, NULL, NULL, NULL, 64 * 128, 96 * 128);
	/* linear over [2, 3, M, K]: folds into one GEMM */
	int64_t bs[2] = {2, 3}, sa[2] = {3 * 8 * 16, 8 * 16}, s0[2] = {0, 0};
	matmul_case(FZ_BF16, 8, 24, 16, true, true, 2, bs, sa, s0, 6 * 8 * 16, 24 * 16);
	/* attention-like batches, and a weight shared over the outer dim */
	int64_t sw[2] = {3 * 16 * 24, 16 * 24}, sw0[2] = {0, 16 * 24};
	matmul_case(FZ_F32, 8, 24, 16, false, false, 2, bs, sa, sw, 6 * 8 * 16, 6 * 16 * 24);
	matmul_case(FZ_BF16, 8, 24, 16, false, false, 2, bs, sa, sw0, 6 * 8 * 16, 3 * 16 * 24);
}
END_TEST

/* ---- programs through fz_exec ----------------------------------------------- */

static fz_trace *parse(const char *text, fz_module **m)
{
	char *diag = NULL;
	fz_status st = fz_module_parse(text, strlen(text), "test.trace", m, &diag);
	ck_assert_msg(st == FZ_OK, "%s", diag ? diag : "?");
	return fz_module_trace(*m, 0);
}

static double tol_rel(fz_dtype d) { return d == FZ_BF16 ? 1e-2 : 1e-5; }
static double tol_abs(fz_dtype d) { return d == FZ_BF16 ? 4e-2 : 1e-5; }

/* Runs t on the GPU and the interpreter over the same random inputs
 * (floats in [-1, 1), integers in [0, lim)) and compares every output as
 * `fusec run --check` does. */
static void run_and_check(const fz_trace *t, const int64_t *syms, int64_t lim)
{
	int ni = fz_trace_param_count(t), no = fz_trace_output_count(t);
	fz_tensor in[8], hin[8], out[8], want[8];
	ck_assert_int_le(ni, 8);
	ck_assert_int_le(no, 8);
	for (int i = 0; i < ni; i++) {
		fz_value *v = fz_trace_param(t, i);
		fz_tensor *h = &hin[i];
		memset(h, 0, sizeof *h);
		h->dtype = fz_value_dtype(v);
		h->rank = fz_value_rank(v);
		int64_t n = 1;
		for (int d = h->rank - 1; d >= 0; d--) {
			h->shape[d] = fz_value_extent(v, d, syms);
			h->strides[d] = n;
			n *= h->shape[d];
		}
		size_t es = fz_dtype_size(h->dtype);
		h->data = malloc((size_t)n * es + 1);
		for (int64_t k = 0; k < n; k++) {
			double r = urand();
			switch (h->dtype) {
			case FZ_F32: ((float *)h->data)[k] = (float)r; break;
			case FZ_BF16: ((uint16_t *)h->data)[k] = to_bf16((float)r); break;
			case FZ_I64: ((int64_t *)h->data)[k] = (int64_t)((r + 1) / 2 * lim); break;
			case FZ_I32: ((int32_t *)h->data)[k] = (int32_t)((r + 1) / 2 * lim); break;
			default: ck_abort_msg("dtype %s in a test trace", fz_dtype_name(h->dtype));
			}
		}
		in[i] = *h;
		in[i].data = to_dev(h->data, (size_t)n * es);
	}
	char *err = NULL;
	ck_assert_int_eq(fz_trace_interpret(t, syms, hin, ni, want, no, &err), FZ_OK);
	for (int o = 0; o < no; o++) {
		out[o] = want[o];
		int64_t n = 1;
		for (int d = 0; d < want[o].rank; d++)
			n *= want[o].shape[d];
		out[o].data = dalloc((size_t)n * fz_dtype_size(want[o].dtype));
	}
	fz_exec *x = NULL;
	fz_status st = fz_exec_new(t, "cuda", NULL, &x, &err);
	ck_assert_msg(st == FZ_OK, "%s", err ? err : "?");
	ck_assert_str_eq(fz_exec_device(x), "cuda");
	void *stream = NULL;
	if (!use_graph) {
		st = fz_exec_run(x, syms, in, ni, out, no, NULL, &err);
	} else {
		/* captured by the first run; the outputs cleared, then the
		 * graph replayed must write them again */
		ck_assert_int_eq(fz_cuda_stream_new(dev, &stream, &err), FZ_OK);
		st = fz_exec_run_graph(x, syms, in, ni, out, no, stream, &err);
		for (int o = 0; st == FZ_OK && o < no; o++) {
			int64_t n = 1;
			for (int d = 0; d < want[o].rank; d++)
				n *= want[o].shape[d];
			size_t bytes = (size_t)n * fz_dtype_size(want[o].dtype) / 4 * 4;
			if (bytes)
				st = fz_target_cuda.zero(dev, out[o].data, bytes, stream, &err);
		}
		if (st == FZ_OK)
			st = fz_exec_run_graph(x, syms, in, ni, out, no, stream, &err);
		ck_assert_int_eq(fz_exec_stats_of(x)->graph_captures, 1);
		ck_assert_int_eq(fz_exec_stats_of(x)->graph_launches, 2);
	}
	ck_assert_msg(st == FZ_OK, "%s", err ? err : "?");
	st = fz_exec_sync(x, stream, &err);
	ck_assert_msg(st == FZ_OK, "%s", err ? err : "?");
	ck_assert_int_eq(fz_exec_host_syncs(x), 0);
	if (stream)
		fz_cuda_stream_free(dev, stream);
	for (int o = 0; o < no; o++) {
		int64_t n = 1;
		for (int d = 0; d < want[o].rank; d++)
			n *= want[o].shape[d];
		fz_dtype dt = want[o].dtype;
		size_t es = fz_dtype_size(dt);
		void *got = malloc((size_t)n * es + 1);
		from_dev(got, out[o].data, (size_t)n * es);
		double rms = 0;
		for (int64_t k = 0; k < n; k++) {
			double w = dt == FZ_BF16 ? from_bf16(((uint16_t *)want[o].data)[k])
			                         : ((float *)want[o].data)[k];
			rms += w * w;
		}
		rms = n ? sqrt(rms / (double)n) : 0;
		for (int64_t k = 0; k < n; k++) {
			double w = dt == FZ_BF16 ? from_bf16(((uint16_t *)want[o].data)[k])
			                         : ((float *)want[o].data)[k];
			double g = dt == FZ_BF16 ? from_bf16(((uint16_t *)got)[k])
			                         : ((float *)got)[k];
			double lim2 = tol_abs(dt) * (rms > 1 ? rms : 1) + tol_rel(dt) * fabs(w);
			ck_assert_msg(fabs(g - w) <= lim2 || (isnan(g) && isnan(w)),
			              "output %d [%lld]: got %.9g, want %.9g", o, (long long)k,
			              g, w);
		}
		free(got);
		fz_free(want[o].data);
		fz_target_cuda.release(dev, out[o].data);
	}
	fz_exec_free(x);
	for (int i = 0; i < ni; i++) {
		free(hin[i].data);
		fz_target_cuda.release(dev, in[i].data);
	}
}

START_TEST(programs_match_interpreter)
{
	static const char *traces[] = {
		"trace pw(x: f32[N, 300], y: f32[300]) {\n"
		"  z = tanh(add(mul(x, y), exp(neg(abs(x)))))\n  return z\n}\n",
		"trace rms(x: bf16[N, 4096], w: bf16[4096]) {\n"
		"  y = rms_norm(x, w, dims=[1], eps=1e-5)\n  return y\n}\n",
		"trace sm(x: f32[N, 1000]) {\n  y = softmax(x, dim=1)\n"
		"  s = sum(x, dims=[0])\n  return y, s\n}\n",
		"trace mlp(x: bf16[N, 256], w1: bf16[512, 256], w2: bf16[256, 512]) {\n"
		"  h = gelu(linear(x, w1))\n  y = linear(h, w2)\n  return y\n}\n",
	};
	int64_t sizes[] = {1, 17, 512};
	for (size_t i = 0; i < sizeof traces / sizeof *traces; i++)
		for (size_t s = 0; s < 3; s++) {
			fz_module *m = NULL;
			fz_trace *t = parse(traces[i], &m);
			int64_t syms[FZ_MAX_SYMS];
			for (int k = 0; k < FZ_MAX_SYMS; k++)
				syms[k] = sizes[s];
			run_and_check(t, syms, 1);
			fz_module_free(m);
		}
}
END_TEST

/* The same programs through a CUDA graph: captured once, replayed. */
START_TEST(graph_replay_matches_interpreter)
{
	use_graph = true;
	static const char *traces[] = {
		"trace pw(x: f32[N, 300], y: f32[300]) {\n"
		"  z = tanh(add(mul(x, y), exp(neg(abs(x)))))\n  return z\n}\n",
		"trace mlp(x: bf16[N, 256], w1: bf16[512, 256], w2: bf16[256, 512]) {\n"
		"  h = gelu(linear(x, w1))\n  y = linear(h, w2)\n  return y\n}\n",
	};
	for (size_t i = 0; i < sizeof traces / sizeof *traces; i++) {
		fz_module *m = NULL;
		fz_trace *t = parse(traces[i], &m);
		int64_t syms[FZ_MAX_SYMS];
		for (int k = 0; k < FZ_MAX_SYMS; k++)
			syms[k] = 17;
		run_and_check(t, syms, 1);
		fz_module_free(m);
	}
	use_graph = false;
}
END_TEST

START_TEST(bad_index_is_reported)
{
	const char *text =
		"trace emb(w: f32[100, 64], i: i64[N]) {\n"
		"  y = take(w, i, dim=0)\n  return y\n}\n";
	fz_module *m = NULL;
	fz_trace *t = parse(text, &m);
	int64_t idx[4] = {3, 99, 100, 7}; /* 100 is out of range */
	static float w[100 * 64];
	fz_tensor in[2] = {
		{to_dev(w, sizeof w), FZ_F32, 2, {100, 64}, {64, 1}},
		{to_dev(idx, sizeof idx), FZ_I64, 1, {4}, {1}},
	};
	fz_tensor out = {dalloc(4 * 64 * 4), FZ_F32, 2, {4, 64}, {64, 1}};
	fz_exec *x = NULL;
	char *err = NULL;
	ck_assert_int_eq(fz_exec_new(t, "cuda", NULL, &x, &err), FZ_OK);
	fz_status st = fz_exec_run(x, NULL, in, 2, &out, 1, NULL, &err);
	if (st == FZ_OK)
		st = fz_exec_sync(x, NULL, &err);
	ck_assert_int_eq(st, FZ_ERANGE);
	ck_assert_msg(strstr(err, "take"), "%s", err);
	free(err);
	/* the device is still usable: a good index runs */
	idx[2] = 0;
	char *e2 = NULL;
	fz_target_cuda.upload(dev, in[1].data, idx, sizeof idx, NULL, &e2);
	ck_assert_int_eq(fz_exec_run(x, NULL, in, 2, &out, 1, NULL, &e2), FZ_OK);
	ck_assert_int_eq(fz_exec_sync(x, NULL, &e2), FZ_OK);
	fz_exec_free(x);
	fz_module_free(m);
}
END_TEST

START_TEST(modules_shared_across_programs)
{
	const char *text = "trace pw(x: f32[N, 64]) {\n  y = sigmoid(x)\n  return y\n}\n";
	fz_module *m = NULL;
	fz_trace *t = parse(text, &m);
	int64_t syms[FZ_MAX_SYMS] = {8};
	run_and_check(t, syms, 1);
	cu_dev *d = (cu_dev *)dev;
	int mods = d->n_mods;
	run_and_check(t, syms, 1);
	ck_assert_int_eq(d->n_mods, mods);
	fz_module_free(m);
}
END_TEST

/* ---- the math: the GPU's results are the host's ---------------------------- */

/* codegen/math.c's recip_small on the GPU: rcp.approx.ftz.f32 and one
 * Newton step with fma, in place of the correctly rounded division the
 * host and emu take. Here the same instructions against rcp.rn.f32 for
 * every d in [1, 256): all 2^23 mantissas at eight exponents. The thread
 * that finds a difference counts it and keeps its d. */
static const char rcp_ptx[] =
	".version 7.0\n.target sm_70\n.address_size 64\n"
	".visible .entry rcp_check(.param .u64 out, .param .u32 n) {\n"
	"  .reg .pred %p<3>;\n  .reg .b32 %r<10>;\n  .reg .f32 %f<7>;\n"
	"  .reg .b64 %rd<3>;\n"
	"  mov.u32 %r1, %ctaid.x;\n  mov.u32 %r2, %ntid.x;\n  mov.u32 %r3, %tid.x;\n"
	"  mad.lo.u32 %r4, %r1, %r2, %r3;\n  ld.param.u32 %r5, [n];\n"
	"  setp.ge.u32 %p1, %r4, %r5;\n  @%p1 bra DONE;\n"
	"  add.u32 %r6, %r4, 0x3f800000;\n  mov.b32 %f1, %r6;\n"
	"  rcp.approx.ftz.f32 %f2, %f1;\n  neg.f32 %f3, %f1;\n"
	"  fma.rn.f32 %f4, %f3, %f2, 0f3F800000;\n  fma.rn.f32 %f5, %f2, %f4, %f2;\n"
	"  rcp.rn.f32 %f6, %f1;\n  mov.b32 %r7, %f5;\n  mov.b32 %r8, %f6;\n"
	"  setp.eq.u32 %p2, %r7, %r8;\n  @%p2 bra DONE;\n"
	"  ld.param.u64 %rd1, [out];\n  atom.global.add.u32 %r9, [%rd1], 1;\n"
	"  st.global.u32 [%rd1+4], %r6;\n"
	"DONE:\n  ret;\n}\n";

START_TEST(rcp_sequence_is_division)
{
	cu_dev *d = (cu_dev *)dev;
	const fz_cu_api *cu = d->cu;
	ck_assert_int_eq(cu->CtxPushCurrent(d->ctx), 0);
	CUmodule mod = NULL;
	CUfunction fn = NULL;
	ck_assert_int_eq(cu->ModuleLoadDataEx(&mod, rcp_ptx, 0, NULL, NULL), 0);
	ck_assert_int_eq(cu->ModuleGetFunction(&fn, mod, "rcp_check"), 0);
	uint32_t zero[2] = {0, 0}, got[2];
	void *out = to_dev(zero, sizeof zero);
	unsigned n = 8u << 23;
	CUdeviceptr o = (CUdeviceptr)(uintptr_t)out;
	void *args[2] = {&o, &n};
	ck_assert_int_eq(cu->LaunchKernel(fn, n / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL), 0);
	ck_assert_int_eq(cu->StreamSynchronize(NULL), 0);
	from_dev(got, out, sizeof got);
	float bad;
	memcpy(&bad, &got[1], 4);
	ck_assert_msg(got[0] == 0, "%u of %u divisors differ from rcp.rn.f32 (one: %.9g)",
		      got[0], n, (double)bad);
	fz_target_cuda.release(dev, out);
	cu->ModuleUnload(mod);
	CUcontext popped;
	cu->CtxPopCurrent(&popped);
}
END_TEST

/* The f32 math functions of codegen/math.c on the GPU against the host
 * (the cpu device), bit for bit (a NaN as a NaN), over math_sweep.h's
 * inputs: what test_emu's math_matches_host shows for the emulated GPU,
 * on the real one, whose reciprocals take other instructions. */
START_TEST(math_matches_host)
{
	const int64_t n = 1 << 20;
	fz_module *m = NULL;
	fz_trace *t = parse(math_sweep_trace, &m);
	int64_t syms[FZ_MAX_SYMS] = {n};
	float *x = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
	math_sweep_inputs(x, n, n / 2);
	fz_tensor hin = {.dtype = FZ_F32, .rank = 1, .shape = {n}, .strides = {1}, .data = x};
	fz_tensor host[MATH_SWEEP_OUTS], din = hin, dout[MATH_SWEEP_OUTS];
	memset(host, 0, sizeof host);
	char *err = NULL;
	ck_assert_msg(fz_trace_run(t, "cpu", syms, &hin, 1, host, MATH_SWEEP_OUTS, &err) ==
		      FZ_OK, "%s", err ? err : "?");
	din.data = to_dev(x, (size_t)n * 4);
	for (int o = 0; o < MATH_SWEEP_OUTS; o++) {
		dout[o] = host[o];
		dout[o].data = dalloc((size_t)n * 4);
	}
	fz_exec *ex = NULL;
	ck_assert_int_eq(fz_exec_new(t, "cuda", NULL, &ex, &err), FZ_OK);
	ck_assert_msg(fz_exec_run(ex, syms, &din, 1, dout, MATH_SWEEP_OUTS, NULL, &err) ==
		      FZ_OK, "%s", err ? err : "?");
	ck_assert_int_eq(fz_exec_sync(ex, NULL, &err), FZ_OK);
	for (int o = 0; o < MATH_SWEEP_OUTS; o++) {
		from_dev(got, dout[o].data, (size_t)n * 4);
		const float *want = host[o].data;
		int64_t k, bad = math_sweep_diff(got, want, n, &k);
		ck_assert_msg(bad == 0, "%s: %lld of %lld differ from the host; x = %.9g: "
			      "got %.9g, want %.9g", math_sweep_names[o], (long long)bad,
			      (long long)n, (double)x[k], (double)got[k], (double)want[k]);
		fz_target_cuda.release(dev, dout[o].data);
		fz_free(host[o].data);
	}
	fz_exec_free(ex);
	fz_target_cuda.release(dev, din.data);
	free(got);
	free(x);
	fz_module_free(m);
}
END_TEST

START_TEST(primary_context_is_current_for_others)
{
	/* fusec leaves the thread's context as it found it, and the device's
	 * context is the primary one the runtime (torch) uses */
	cu_dev *d = (cu_dev *)dev;
	const fz_cu_api *cu = fz_cu_load(NULL);
	CUcontext before = NULL, after = NULL, prim = NULL;
	cu->CtxGetCurrent(&before);
	void *p = dalloc(64);
	fz_target_cuda.release(dev, p);
	cu->CtxGetCurrent(&after);
	ck_assert_ptr_eq(before, after);
	ck_assert_int_eq(cu->DevicePrimaryCtxRetain(&prim, d->dev), 0);
	ck_assert_ptr_eq(prim, d->ctx);
	cu->DevicePrimaryCtxRelease(d->dev);
}
END_TEST

static Suite *cuda_suite(void)
{
	Suite *s = suite_create("cuda");
	TCase *t = tcase_create("device");
	tcase_set_timeout(t, 600);
	tcase_add_test(t, gather_matches_host);
	tcase_add_test(t, matmul_matches_host);
	tcase_add_test(t, programs_match_interpreter);
	tcase_add_test(t, graph_replay_matches_interpreter);
	tcase_add_test(t, bad_index_is_reported);
	tcase_add_test(t, modules_shared_across_programs);
	tcase_add_test(t, primary_context_is_current_for_others);
	tcase_add_test(t, rcp_sequence_is_division);
	tcase_add_test(t, math_matches_host);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	char *err = NULL;
	fz_status st = fz_target_cuda.open(NULL, &dev, &err);
	if (st == FZ_EUNSUPPORTED) {
		printf("skipped: %s\n", err ? err : "no CUDA device");
		free(err);
		return 77;
	}
	if (st != FZ_OK) {
		fprintf(stderr, "cannot open the CUDA device: %s\n", err ? err : "?");
		return 1;
	}
	SRunner *r = srunner_create(cuda_suite());
	/* one process: the device and its modules stay open across tests */
	srunner_set_fork_status(r, CK_NOFORK);
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	fz_device_release(dev);
	return failed ? 1 : 0;
}
