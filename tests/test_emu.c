/*
 * test_emu.c: the emulated GPU (codegen's EMU flavour, runtime/emu_sched.c).
 *
 * Scheduler: hand-written kernels (C functions of one GPU thread, the ABI
 * the code generator emits) prove each check fires and stays quiet when it
 * should: a thread that exits before a barrier, threads at different
 * barriers, a shared-memory write-after-read / read-after-write / write-
 * after-write with no barrier between (and none with one), a shuffle a
 * lane misses, a global access past its buffer; a correct block reduction
 * with shuffles and barriers gives the right sum.
 *
 * Generated kernels: small traces whose regions are all kernels are
 * compiled for EMU (the NVPTX skeletons: warp and block rows, the
 * register-held row and the looping one, grid-stride tails, lanes, both
 * index widths, index_add's two entries and atomics), launched with the
 * CUDA target's geometry, and compared with the interpreter; every
 * seeded fault (a dropped barrier, an offset load or store, a lane that
 * skips a shuffle) is caught with the violation it should be.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg.h"
#include "emu.h"
#include "fusec.h"
#include "ir.h"
#include "math_sweep.h"
#include "numeric.h"
#include "plan.h"

/* ---- hand-written kernels -------------------------------------------------- */

static fz_status launch_c(fz_emu_fn fn, void **bufs, int64_t grid, int block,
			  bool fibers, char **err)
{
	fz_emu_sched *s;
	ck_assert_int_eq(fz_emu_sched_new(&s, NULL), FZ_OK);
	int32_t flag = 0;
	int64_t syms[1] = {0};
	fz_emu_launch L = {"test_kernel", 7, fn, bufs, syms, &flag, grid, block,
			   fibers, 1, 0};
	fz_status st = fz_emu_run(s, &L, err);
	fz_emu_sched_free(s);
	return st;
}

#define EXPECT_VIOLATION(fn, grid, block, fibers, what) do { \
	char *e_ = NULL; \
	void *b_[2] = {in_buf, out_buf}; \
	fz_status s_ = launch_c(fn, b_, grid, block, fibers, &e_); \
	ck_assert_msg(s_ == FZ_ERUNTIME, "no violation, expected '%s'", what); \
	ck_assert_msg(e_ && strstr(e_, what), "'%s' lacks '%s'", e_ ? e_ : "", what); \
	ck_assert_msg(strstr(e_, "test_kernel (region 7)") && strstr(e_, "block "), \
		      "'%s' does not name kernel, region and block", e_); \
	free(e_); \
} while (0)

#define EXPECT_CLEAN(fn, grid, block, fibers) do { \
	char *e_ = NULL; \
	void *b_[2] = {in_buf, out_buf}; \
	fz_status s_ = launch_c(fn, b_, grid, block, fibers, &e_); \
	ck_assert_msg(s_ == FZ_OK, "violation: %s", e_ ? e_ : "?"); \
	free(e_); \
} while (0)

static float in_buf[1024], out_buf[1024];

/* A block sum as reduction.c emits it: butterfly shuffles, one slot per
 * warp in shared memory, a barrier, every thread reads all slots, a
 * barrier. out[block] = sum of in[block * ntid + tid]. */
static void k_block_sum(void **bufs, const int64_t *syms, int32_t *err, fz_emu_thread *t)
{
	(void)syms;
	(void)err;
	const float *x = bufs[0];
	float *y = bufs[1];
	float v = x[t->ctaid * t->ntid + t->tid];
	for (int m = 16; m >= 1; m /= 2) {
		int32_t bits, o;
		memcpy(&bits, &v, 4);
		o = t->shfl(t, bits, m, m);
		float f;
		memcpy(&f, &o, 4);
		v += f;
	}
	if (t->tid % 32 == 0)
		*(float *)t->smem(t, 0, t->tid / 32, 4, 1, 0) = v;
	t->barrier(t, 0);
	float acc = 0;
	for (int w = 0; w < t->ntid / 32; w++)
		acc += *(float *)t->smem(t, 0, w, 4, 0, 1);
	t->barrier(t, 1);
	if (t->tid == 0)
		y[t->ctaid] = acc;
}

START_TEST(sched_block_sum)
{
	for (int i = 0; i < 1024; i++)
		in_buf[i] = (float)(i % 7);
	EXPECT_CLEAN(k_block_sum, 4, 256, true);
	for (int b = 0; b < 4; b++) {
		float want = 0;
		for (int i = 0; i < 256; i++)
			want += (float)((b * 256 + i) % 7);
		ck_assert_msg(out_buf[b] == want, "block %d: %g, want %g", b, out_buf[b], want);
	}
}
END_TEST

/* Thread 5 leaves before the barrier the others wait at. */
static void k_exit_early(void **bufs, const int64_t *syms, int32_t *err, fz_emu_thread *t)
{
	(void)bufs; (void)syms; (void)err;
	if (t->tid == 5)
		return;
	t->barrier(t, 0);
}

/* Odd and even threads wait at two different barriers. */
static void k_two_barriers(void **bufs, const int64_t *syms, int32_t *err, fz_emu_thread *t)
{
	(void)bufs; (void)syms; (void)err;
	if (t->tid % 2)
		t->barrier(t, 1);
	else
		t->barrier(t, 2);
}

START_TEST(sched_barrier_checks)
{
	EXPECT_VIOLATION(k_exit_early, 2, 64, true, "thread 5 never reaches: it exited");
	EXPECT_VIOLATION(k_two_barriers, 1, 64, true, "waits at a different barrier");
	/* a barrier in a kernel run without fibers is the emulator's own error */
	EXPECT_VIOLATION(k_two_barriers, 1, 64, false, "without fibers");
}
END_TEST

/* Thread 0 writes slot 0, every thread reads it: with or without a
 * barrier between (mode 1: barrier, 0: none); mode 2: everyone writes
 * slot 0; mode 3: read, then thread 3 writes it with no barrier; mode 4:
 * a read of a slot no one wrote; mode 5: index 32 of a 32-element array. */
static int race_mode;
static void k_smem(void **bufs, const int64_t *syms, int32_t *err, fz_emu_thread *t)
{
	(void)syms; (void)err;
	float *y = bufs[1];
	switch (race_mode) {
	case 0:
	case 1:
		if (t->tid == 0)
			*(float *)t->smem(t, 2, 0, 4, 1, 0) = 1.0f;
		if (race_mode == 1)
			t->barrier(t, 0);
		y[t->tid] = *(float *)t->smem(t, 2, 0, 4, 0, 1);
		break;
	case 2:
		*(float *)t->smem(t, 2, 0, 4, 1, 0) = (float)t->tid;
		break;
	case 3:
		if (t->tid == 0)
			*(float *)t->smem(t, 2, 0, 4, 1, 0) = 1.0f;
		t->barrier(t, 0);
		y[t->tid] = *(float *)t->smem(t, 2, 0, 4, 0, 1);
		if (t->tid == 3)
			*(float *)t->smem(t, 2, 0, 4, 1, 2) = 2.0f;
		break;
	case 4:
		y[t->tid] = *(float *)t->smem(t, 2, 1, 4, 0, 1);
		break;
	default:
		*(float *)t->smem(t, 2, 32, 4, 1, 0) = 1.0f;
		break;
	}
}

START_TEST(sched_smem_races)
{
	race_mode = 1;
	EXPECT_CLEAN(k_smem, 3, 64, true);
	race_mode = 0;
	EXPECT_VIOLATION(k_smem, 3, 64, true, "race (read after write)");
	race_mode = 2;
	EXPECT_VIOLATION(k_smem, 3, 64, true, "race (write after write)");
	race_mode = 3;
	EXPECT_VIOLATION(k_smem, 3, 64, true, "race (write after read)");
	race_mode = 4;
	EXPECT_VIOLATION(k_smem, 3, 64, true, "no thread had written");
	race_mode = 5;
	EXPECT_VIOLATION(k_smem, 3, 64, true, "shared memory out of bounds");
}
END_TEST

/* Lane 7 of warp 1 skips the shuffle; mode 1: lanes shuffle at two sites. */
static int shfl_mode;
static void k_shfl(void **bufs, const int64_t *syms, int32_t *err, fz_emu_thread *t)
{
	(void)syms; (void)err;
	float *y = bufs[1];
	if (shfl_mode == 0 && t->tid == 39)
		return;
	int32_t r = t->shfl(t, t->tid, 1, shfl_mode == 1 ? t->tid % 2 : 0);
	y[t->tid] = (float)r;
}

START_TEST(sched_shuffle_checks)
{
	shfl_mode = 2;
	EXPECT_CLEAN(k_shfl, 1, 64, true);
	for (int i = 0; i < 64; i++)
		ck_assert(out_buf[i] == (float)(i ^ 1));
	shfl_mode = 0;
	EXPECT_VIOLATION(k_shfl, 1, 64, true, "warp 1: lane 0 reaches a shuffle (xor 1) "
			 "that lane 7 never reaches: it exited");
	shfl_mode = 1;
	EXPECT_VIOLATION(k_shfl, 1, 64, true, "never reaches: it waits at another shuffle");
	shfl_mode = 2;
	EXPECT_VIOLATION(k_shfl, 1, 48, true, "a warp of 16 threads");
}
END_TEST

START_TEST(sched_launch_limits)
{
	char *e = NULL;
	void *b[2] = {in_buf, out_buf};
	ck_assert_int_eq(launch_c(k_block_sum, b, 1, 2048, true, &e), FZ_EINVAL);
	ck_assert(strstr(e, "outside the GPU's limits"));
	free(e);
	e = NULL;
	ck_assert_int_eq(launch_c(k_block_sum, b, 0, 256, true, &e), FZ_EINVAL);
	free(e);
}
END_TEST

/* ---- generated kernels ---------------------------------------------------- */

static fz_module *parse(const char *src)
{
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = fz_module_parse(src, strlen(src), "test.trace", &m, &diag);
	ck_assert_msg(st == FZ_OK, "parse: %s", diag ? diag : "?");
	fz_free(diag);
	return m;
}

static uint64_t rng = 88172645463325252ull;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) * 0x1p-53;
}

/* A run of trace t through EMU kernels only: every region must be a
 * kernel and no value a view (what the tests below write). */
typedef struct erun {
	const fz_trace *t;
	const int64_t *syms;
	void **data;            /* per value id */
	fz_emu_sched *s;
	fz_compiler *c;
	int32_t flag;
	int launches, fibers;
	fz_status st;
	char *err;
} erun;

static fz_status on_kernel(const fz_region *r, int op, fz_kernel *k, void *ud,
			   char **err)
{
	erun *R = ud;
	/* but for a scatter and its followers, which the GPU runs as two
	 * kernels (fz_scatter_split) */
	bool scatter = false;
	for (int j = 0; j < r->n_nodes; j++)
		for (int k = 0; k < r->nodes[j]->n_in; k++)
			scatter |= r->nodes[j]->op == FZ_OP_INDEX_ADD ||
				   (r->nodes[j]->in[k]->def &&
				    r->nodes[j]->in[k]->def->op == FZ_OP_INDEX_ADD);
	ck_assert_msg(op < 0 || scatter, "region %d was split per op", r->id);
	int nb = r->n_in + r->n_out;
	void **bufs = calloc((size_t)nb, sizeof *bufs);
	for (int i = 0; i < nb; i++) {
		const fz_value *v = i < r->n_in ? r->in[i] : r->out[i - r->n_in];
		if (!R->data[v->id]) {
			int64_t n = fz_type_numel_at(&v->type, R->syms);
			R->data[v->id] = calloc((size_t)(n > 0 ? n : 1), fz_dtype_size(v->type.dtype));
		}
		bufs[i] = R->data[v->id];
	}
	fz_kernel kk = *k;
	kk.mod = NULL;
	void *obj = NULL;
	size_t len = 0;
	fz_status st = fz_kernel_object(R->c, k, &obj, &len, err);
	for (int e = 0; st == FZ_OK && e < kk.n_entries; e++) {
		fz_host_fn fn;
		st = fz_host_load(R->c, obj, len, kk.names[e], &fn, err);
		if (st != FZ_OK)
			break;
		int64_t grid;
		int block;
		fz_kernel_launch_dims(&kk, e, R->syms, &grid, &block);
		bool fibers = (kk.sk == FZ_SK_ROW && kk.par != FZ_PAR_THREAD) ||
			      kk.sk == FZ_SK_TILE;
		fz_emu_launch L = {kk.names[e], r->id, (fz_emu_fn)(void (*)(void))fn, bufs,
				   R->syms, &R->flag, grid, block, fibers, r->n_in, kk.smem};
		st = fz_emu_run(R->s, &L, err);
		R->launches++;
		R->fibers += fibers;
	}
	free(obj);
	free(bufs);
	return st;
}

static bool misalign; /* the kernels get inputs one element off 16 bytes */

/* Runs src's trace at syms through EMU (options o) and the interpreter;
 * returns the status; *worst: the worst error relative to tol. */
static fz_status emu_compare(const char *src, const int64_t *syms2, fz_cg_options o,
			     double tol, double *worst, char **err, int *fibers)
{
	int64_t syms[FZ_MAX_SYMS];
	for (int s = 0; s < FZ_MAX_SYMS; s++)
		syms[s] = s < 2 ? syms2[s] : -1;
	fz_module *m = parse(src);
	fz_trace *t = fz_module_trace(m, 0);
	int n_in = fz_trace_param_count(t), n_out = fz_trace_output_count(t);
	erun R = {0};
	R.t = t;
	R.syms = syms;
	R.data = calloc((size_t)t->n_values + 1, sizeof *R.data);
	ck_assert_int_eq(fz_emu_sched_new(&R.s, NULL), FZ_OK);
	ck_assert_int_eq(fz_compiler_new(&o, &R.c, NULL), FZ_OK);
	fz_tensor *in = calloc((size_t)n_in, sizeof *in);
	for (int i = 0; i < n_in; i++) {
		const fz_value *p = fz_trace_param(t, i);
		fz_tensor *x = &in[i];
		x->dtype = p->type.dtype;
		x->rank = p->type.rank;
		int64_t acc = 1;
		for (int d = x->rank - 1; d >= 0; d--) {
			x->shape[d] = fz_ext_eval(p->type.dims[d], syms);
			x->strides[d] = acc;
			acc *= x->shape[d];
		}
		x->data = calloc((size_t)(acc > 0 ? acc : 1) + 1, fz_dtype_size(x->dtype));
		for (int64_t k = 0; k < acc; k++)
			fz_store_f64(x->data, x->dtype, k, fz_dtype_is_float(x->dtype) ?
				     urand() * 4 - 2 : (double)(int64_t)(urand() * (double)syms[0]));
		R.data[p->id] = (char *)x->data + (misalign ? fz_dtype_size(x->dtype) : 0);
	}
	fz_status st = fz_compile_trace(R.c, t, syms, -1, on_kernel, &R, err);
	for (int i = 0; i < n_in; i++)
		in[i].data = R.data[fz_trace_param(t, i)->id];
	if (st == FZ_OK && R.flag)
		st = FZ_ERANGE;
	*worst = 0;
	if (st == FZ_OK) {
		fz_tensor *want = calloc((size_t)n_out, sizeof *want);
		ck_assert_int_eq(fz_trace_interpret(t, syms, in, n_in, want, n_out, NULL), FZ_OK);
		for (int k = 0; k < n_out; k++) {
			const fz_value *v = fz_trace_output(t, k);
			int64_t n = fz_type_numel_at(&v->type, syms);
			ck_assert_msg(R.data[v->id], "output %d not computed", k);
			for (int64_t i = 0; i < n; i++) {
				double g = fz_load_f64(R.data[v->id], v->type.dtype, i);
				double w = fz_load_f64(want[k].data, want[k].dtype, i);
				if (g == w || (isnan(g) && isnan(w)))
					continue;
				double r = fabs(g - w) / (tol + tol * fabs(w));
				if (!(r <= *worst))
					*worst = isnan(r) ? INFINITY : r;
			}
			fz_free(want[k].data);
		}
		free(want);
	}
	if (fibers)
		*fibers = R.fibers;
	for (int v = 0; v < t->n_values; v++) {
		bool param = false;
		for (int i = 0; i < n_in; i++)
			param |= v == fz_trace_param(t, i)->id;
		if (!param)
			free(R.data[v]);
	}
	for (int i = 0; i < n_in; i++)
		free((char *)in[i].data - (misalign ? fz_dtype_size(in[i].dtype) : 0));
	free(in);
	free(R.data);
	fz_compiler_free(R.c);
	fz_emu_sched_free(R.s);
	fz_module_free(m);
	return st;
}

static fz_cg_options emu_opts(bool idx32, bool vec, fz_emu_fault f)
{
	fz_cg_options o;
	ck_assert_int_eq(fz_cg_options_parse("emu", &o, NULL), FZ_OK);
	o.idx32 = idx32;
	o.vectorize = vec;
	o.emu_fault = f;
	return o;
}

/* Traces covering the skeletons: B, T symbolic, so sizes hit tails. */
static const char *const SRCS[] = {
	/* pointwise, lanes (inner 12 f32: L = 4) */
	"trace f(x: f32[B, T, 12], w: f32[B, T, 12]) {\n"
	"  y = mul(add(x, w), 0.5)\n  return y\n}\n",
	/* pointwise, odd inner extent (no lanes), bf16 */
	"trace f(x: bf16[B, T], y: bf16[B, T]) {\n"
	"  z = sub(mul(x, y), y)\n  return z\n}\n",
	/* layer norm, f32 rows of 4096: a block per row, row in registers */
	"trace f(x: f32[B, T, 4096], w: f32[B, T, 4096], b: f32[B, T, 4096]) {\n"
	"  y = layer_norm(x, w, b, dims=[2], eps=1e-5)\n  return y\n}\n",
	/* rms norm, bf16 rows of 256: a warp per row */
	"trace f(x: bf16[B, T, 256], w: bf16[256]) {\n"
	"  y = rms_norm(x, w, dims=[2], eps=1e-5)\n  return y\n}\n",
	/* softmax over a symbolic row: a block per row, looping passes */
	"trace f(x: f32[B, 3, T]) {\n"
	"  y = softmax(x, dim=2)\n  return y\n}\n",
	/* an outer reduction: a thread per column */
	"trace f(x: f32[B, T, 6]) {\n"
	"  s = sum(x, dims=[0, 1])\n  return s\n}\n",
	/* index_add: init, then the scatter with atomics */
	"trace f(x: f32[B, 8], idx: i64[T], src: f32[T, 8]) {\n"
	"  y = index_add(x, idx, src, dim=0)\n  return y\n}\n",
	/* take: a gather */
	"trace f(e: f32[B, 16], idx: i64[T]) {\n"
	"  y = take(e, idx, dim=0)\n  return y\n}\n",
	/* cumsum: a block per row, shfl.up, warp totals in shared memory */
	"trace f(x: f32[B, T]) {\n"
	"  y = cumsum(x, dim=1)\n  return y\n}\n",
	/* topk: a block per row, butterfly picks, shared memory */
	"trace f(x: f32[B, T, 40]) {\n"
	"  v, i = topk(x, k=3, dim=2)\n  return v, i\n}\n",
};

static const int64_t SIZES[][2] = {{1, 1}, {3, 17}, {17, 3}, {2, 100}};

START_TEST(generated_kernels_match)
{
	int nfib = 0;
	for (size_t i = 0; i < sizeof SRCS / sizeof *SRCS; i++)
		for (size_t z = 0; z < sizeof SIZES / sizeof *SIZES; z++)
			for (int w = 0; w < 2; w++) {
				int64_t syms[2] = {SIZES[z][0], SIZES[z][1]};
				double worst;
				char *err = NULL;
				int fib = 0;
				fz_status st = emu_compare(SRCS[i], syms, emu_opts(w, true, 0),
							   1e-2, &worst, &err, &fib);
				ck_assert_msg(st == FZ_OK, "trace %zu at %lld,%lld idx%s: %s", i,
					      (long long)syms[0], (long long)syms[1],
					      w ? "32" : "64", err ? err : fz_status_name(st));
				ck_assert_msg(worst <= 1, "trace %zu at %lld,%lld: worst %g", i,
					      (long long)syms[0], (long long)syms[1], worst);
				nfib += fib;
				free(err);
			}
	ck_assert_msg(nfib > 0, "no kernel ran its threads as fibers");
}
END_TEST

START_TEST(generated_unvectorized)
{
	for (size_t i = 0; i < sizeof SRCS / sizeof *SRCS; i++) {
		int64_t syms[2] = {3, 17};
		double worst;
		char *err = NULL;
		fz_status st = emu_compare(SRCS[i], syms, emu_opts(true, false, 0), 1e-2,
					   &worst, &err, NULL);
		ck_assert_msg(st == FZ_OK && worst <= 1, "trace %zu: %s (worst %g)", i,
			      err ? err : "", worst);
		free(err);
	}
}
END_TEST

/* Each seeded fault on the trace it should trip, with its violation. */
START_TEST(seeded_faults_caught)
{
	struct { fz_emu_fault f; int src; const char *what; } cases[] = {
		{FZ_EMU_FAULT_BARRIER, 2, "shared-memory race"},
		{FZ_EMU_FAULT_BARRIER, 4, "shared-memory race"},
		{FZ_EMU_FAULT_LOAD, 0, "global load out of bounds"},
		{FZ_EMU_FAULT_LOAD, 2, "global load out of bounds"},
		{FZ_EMU_FAULT_STORE, 0, "global store out of bounds"},
		{FZ_EMU_FAULT_STORE, 5, "global store out of bounds"},
		{FZ_EMU_FAULT_SHFL, 3, "that lane 31 never reaches: it exited"},
		{FZ_EMU_FAULT_SHFL, 2, "never reaches"},
		{FZ_EMU_FAULT_BARRIER, 8, "shared-memory race"},
		{FZ_EMU_FAULT_SHFL, 8, "shuffle (up 1) that lane 31 never reaches"},
		{FZ_EMU_FAULT_BARRIER, 9, "shared-memory race"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
		for (int w = 0; w < 2; w++) {
			int64_t syms[2] = {3, 17};
			double worst;
			char *err = NULL;
			if (getenv("EMU_TEST_TRACE"))
				fprintf(stderr, "case %zu w %d\n", i, w);
			fz_status st = emu_compare(SRCS[cases[i].src], syms,
						   emu_opts(w, true, cases[i].f), 1e-2,
						   &worst, &err, NULL);
			ck_assert_msg(st == FZ_ERUNTIME && err && strstr(err, cases[i].what),
				      "fault %d on trace %d: %s, '%s'", cases[i].f, cases[i].src,
				      fz_status_name(st), err ? err : "");
			ck_assert_msg(strstr(err, "kernel fz_region_") && strstr(err, "block ") &&
				      strstr(err, "thread "), "'%s' names no kernel, block, thread",
				      err);
			free(err);
		}
}
END_TEST


/* The 64-bit index variant on demand: idx32 with emu_idx64 is the IR of
 * idx32 off, and differs from idx32's. */
static fz_status keep_ir(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	(void)r; (void)op;
	return fz_kernel_llvm(k, (char **)ud, err);
}

static char *ir_of(const char *src, fz_cg_options o)
{
	fz_module *m = parse(src);
	fz_compiler *c;
	ck_assert_int_eq(fz_compiler_new(&o, &c, NULL), FZ_OK);
	char *ir = NULL;
	ck_assert_int_eq(fz_compile_trace(c, fz_module_trace(m, 0), NULL, -1, keep_ir,
					  &ir, NULL), FZ_OK);
	fz_compiler_free(c);
	fz_module_free(m);
	return ir;
}

START_TEST(forced_64bit_indices)
{
	for (int i = 2; i <= 4; i++) {
		fz_cg_options o32 = emu_opts(true, true, 0), o64 = emu_opts(false, true, 0);
		fz_cg_options forced = o32;
		forced.emu_idx64 = true;
		char *a = ir_of(SRCS[i], o32), *b = ir_of(SRCS[i], o64), *c = ir_of(SRCS[i], forced);
		ck_assert_msg(strcmp(a, b) != 0, "trace %d: idx32 makes no difference", i);
		ck_assert_msg(strcmp(b, c) == 0, "trace %d: forced 64-bit IR differs", i);
		fz_free(a);
		fz_free(b);
		fz_free(c);
	}
}
END_TEST


/* A vectorized kernel handed a buffer that is not 16-byte aligned faults
 * on a GPU; the emulator says so (the unvectorized variant runs). */
START_TEST(misaligned_vector_access)
{
	int64_t syms[2] = {3, 17};
	double worst;
	char *err = NULL;
	misalign = true;
	fz_status st = emu_compare(SRCS[0], syms, emu_opts(true, true, 0), 1e-2, &worst,
				   &err, NULL);
	ck_assert_msg(st == FZ_ERUNTIME && err && strstr(err, "misaligned vector load"),
		      "%s", err ? err : "no violation");
	free(err);
	err = NULL;
	st = emu_compare(SRCS[0], syms, emu_opts(true, false, 0), 1e-2, &worst, &err, NULL);
	misalign = false;
	ck_assert_msg(st == FZ_OK && worst <= 1, "%s", err ? err : "");
	free(err);
}
END_TEST


/* index_add of 16-bit floats: the atomic add is a compare-and-swap loop
 * (no libcall the JIT cannot resolve), rounding at every add. */
START_TEST(half_atomics)
{
	const char *const srcs[] = {
		"trace f(x: bf16[B, 8], idx: i64[T], src: bf16[T, 8]) {\n"
		"  y = index_add(x, idx, src, dim=0)\n  return y\n}\n",
		"trace f(x: f16[B, 8], idx: i64[T], src: f16[T, 8]) {\n"
		"  y = index_add(x, idx, src, dim=0)\n  return y\n}\n",
	};
	for (int i = 0; i < 2; i++) {
		int64_t syms[2] = {3, 17};
		double worst;
		char *err = NULL;
		fz_status st = emu_compare(srcs[i], syms, emu_opts(true, true, 0), 5e-2,
					   &worst, &err, NULL);
		ck_assert_msg(st == FZ_OK && worst <= 1, "%s: %s (worst %g)", i ? "f16" : "bf16",
			      err ? err : "", worst);
		free(err);
	}
}
END_TEST

/* src at B, T on emu (32-bit indices, lanes): must run; the worst error
 * relative to tol */
static double emu_worst(const char *src, int64_t B, int64_t T, double tol)
{
	int64_t syms[2] = {B, T};
	double worst;
	char *err = NULL;
	fz_status st = emu_compare(src, syms, emu_opts(true, true, 0), tol, &worst,
				   &err, NULL);
	ck_assert_msg(st == FZ_OK, "%s", err ? err : fz_status_name(st));
	free(err);
	return worst;
}

/* The GPU's f64 -> f16/bf16 casts round once (issue 23.4; test_codegen
 * has the host's): values just above a halfway point round up, bit for
 * bit as the interpreter's. */
START_TEST(cast_f64_half_once)
{
	const char *src =
		"trace f(x: f64[B, T]) {\n"
		"  s = add(mul(x, 1e-12), 1.00048828125)\n"
		"  a = cast(add(s, 0.00341796875), dtype=bf16)\n"
		"  h = cast(neg(s), dtype=f16)\n"
		"  return a, h\n}\n";
	double worst = emu_worst(src, 3, 17, 0x1p-1000);
	ck_assert_msg(worst == 0, "not bit for bit: worst %g", worst);
}
END_TEST

/* Float sums on the GPU are the exact sum rounded once, as the
 * interpreter's f64 sum rounded to f32 is: kept in f64 where the GPU's f64
 * runs at half the f32 rate (sm_90: codegen/reduction.c, "wide sums"), as
 * (hi, lo) pairs where it does not (sm_86). Both ways, bit for bit: a
 * row's sum and var_mean in registers (rows of 1000, a block each, its
 * last threads masked; on sm_90 var_mean in one pass: "var_mean in one
 * pass") and looping (a symbolic row), layer_norm in a warp (rows of 256,
 * bf16) and rms_norm's sum of squares. A constant row's variance is 0
 * exactly (sm_90: the second pass; the one-pass form leaves the rounding
 * of its sum of squares). A row whose mean is 10^6 of its deviations is
 * within 2^-11 both ways: the pairs hold the mean to 48 bits, and their
 * deviations err by 2^-48 of it (2^-12 of this variance; the one-pass
 * form, were it taken, 2^-14). */
/* src on emu for GPU target (emu-sm_NN) at B = 5, T = 1000 against the
 * interpreter: the worst error relative to tol */
static double on_target(const char *src, const char *target, double tol)
{
	fz_cg_options o;
	ck_assert_int_eq(fz_cg_options_parse(target, &o, NULL), FZ_OK);
	int64_t syms[2] = {5, 1000};
	double worst;
	char *err = NULL;
	fz_status st = emu_compare(src, syms, o, tol, &worst, &err, NULL);
	ck_assert_msg(st == FZ_OK, "on %s: %s", target, err ? err : fz_status_name(st));
	free(err);
	return worst;
}

START_TEST(float_sums_both_ways)
{
	const char *const srcs[] = {
		"trace f(x: f32[B, 1000]) {\n"
		"  s = sum(x, dims=[1])\n  v, m = var_mean(x, dims=[1])\n"
		"  c = add(mul(x, 0.0), 3.3)\n  cv, cm = var_mean(c, dims=[1])\n"
		"  return s, v, m, cv, cm\n}\n",
		"trace f(x: f32[B, T]) {\n"
		"  s = sum(x, dims=[1])\n  v, m = var_mean(x, dims=[1])\n"
		"  return s, v, m\n}\n",
		"trace f(x: bf16[B, 256], w: bf16[256], b: bf16[256]) {\n"
		"  y = layer_norm(x, w, b, dims=[1], eps=1e-5)\n  return y\n}\n",
		"trace f(x: f32[B, T]) {\n"
		"  s = sum(mul(x, x), dims=[1])\n  return s\n}\n",
	};
	const char *far = "trace f(x: f32[B, 1000]) {\n"
			  "  v, m = var_mean(add(x, 1000000.0), dims=[1])\n"
			  "  return v, m\n}\n";
	const char *const targets[] = {"emu-sm_86", "emu-sm_90"};
	for (int k = 0; k < 2; k++) {
		for (size_t i = 0; i < sizeof srcs / sizeof *srcs; i++) {
			double worst = on_target(srcs[i], targets[k], 0x1p-1000);
			ck_assert_msg(worst == 0, "trace %zu on %s: not bit for bit (worst %g)",
				      i, targets[k], worst);
		}
		double worst = on_target(far, targets[k], 0x1p-11);
		ck_assert_msg(worst <= 1, "a far mean on %s: worst %g", targets[k], worst);
	}
}
END_TEST

/* take, take_along and index_add into an extent of 0 (issue 23.5): every
 * index is out of range and is reported, and the kernels load and store
 * nothing (they read or wrote element 0 of the empty buffer, which the
 * emulator caught); at an extent of 5 they match the interpreter. */
START_TEST(index_into_empty_extent)
{
	const char *const srcs[] = {
		"trace f(w: f32[V, 4], ids: i64[B]) {\n"
		"  y = take(w, ids, dim=0)\n  return y\n}\n",
		"trace f(w: f32[V, 4], ids: i64[B]) {\n"
		"  y = take(mul(w, 2.0), ids, dim=0)\n  return y\n}\n",
		"trace f(w: f32[V, B], ids: i64[3, B]) {\n"
		"  y = take_along(w, ids, dim=0)\n  return y\n}\n",
		"trace f(x: f32[V, 4], ids: i64[B], s: f32[B, 4]) {\n"
		"  y = index_add(x, ids, s, dim=0)\n  return y\n}\n",
	};
	for (size_t i = 0; i < sizeof srcs / sizeof *srcs; i++)
		for (int64_t V = 0; V <= 5; V += 5) {
			int64_t syms[2] = {V, 3};
			double worst;
			char *err = NULL;
			fz_status st = emu_compare(srcs[i], syms, emu_opts(true, true, 0),
						   1e-6, &worst, &err, NULL);
			ck_assert_msg(st == (V ? FZ_OK : FZ_ERANGE), "trace %zu at V=%lld: %s "
				      "(%s)", i, (long long)V, fz_status_name(st), err ? err : "");
			ck_assert_msg(worst <= 1, "trace %zu: worst %g", i, worst);
			free(err);
		}
}
END_TEST

/* The GPU's f64 math (issue 23.8: it refused these ops): within a few
 * ulp of the interpreter's libm over ranges that reach overflow to inf
 * and underflow to 0 (exp at +-800, exp2 at +-1100), subnormal and huge
 * logs, angles to 100, erf's series, continued fraction and tail. */
START_TEST(f64_math)
{
	const char *src =
		"trace f(x: f64[B, T], y: f64[B, T]) {\n"
		"  e = exp(mul(x, 400.0))\n  e2 = exp2(mul(x, 550.0))\n"
		"  l = log(mul(abs(x), 1e300))\n  ls = log(mul(abs(x), 1e-312))\n"
		"  l2 = log2(abs(x))\n  lp = log1p(mul(x, 0.49))\n"
		"  em = expm1(x)\n  s = sin(mul(x, 50.0))\n  c = cos(mul(x, 50.0))\n"
		"  th = tanh(mul(x, 12.0))\n  sg = sigmoid(mul(x, 20.0))\n"
		"  ef = erf(mul(x, 3.5))\n"
		"  p = pow(abs(mul(x, 10.0)), mul(y, 8.0))\n"
		"  return e, e2, l, ls, l2, lp, em, s, c, th, sg, ef, p\n}\n";
	double worst = emu_worst(src, 5, 97, 1e-14);
	ck_assert_msg(worst <= 1, "worst %g x 1e-14", worst);
}
END_TEST

/* The f32 math functions on the emulated GPU against the host, bit for
 * bit (a NaN as a NaN) over math_sweep.h's inputs: the two compile
 * math.c's functions into different skeletons (lanes of one thread; the
 * host's AVX-512 exp and sigmoid in vectors), and the GPU's kernels must
 * still compute what the CPU tests test. test_cuda's math_matches_host
 * shows the same on a GPU. */
START_TEST(math_matches_host)
{
	const int64_t n = 1 << 17;
	fz_module *m = parse(math_sweep_trace);
	fz_trace *t = fz_module_trace(m, 0);
	int64_t syms[FZ_MAX_SYMS] = {n};
	float *x = malloc((size_t)n * 4);
	math_sweep_inputs(x, n, n / 2);
	fz_tensor in = {.dtype = FZ_F32, .rank = 1, .shape = {n}, .strides = {1}, .data = x};
	fz_tensor out[2][MATH_SWEEP_OUTS];
	const char *dev[2] = {"cpu", "emu"};
	for (int d = 0; d < 2; d++) {
		char *err = NULL;
		memset(out[d], 0, sizeof out[d]);
		ck_assert_msg(fz_trace_run(t, dev[d], syms, &in, 1, out[d], MATH_SWEEP_OUTS,
					   &err) == FZ_OK, "%s: %s", dev[d], err ? err : "?");
	}
	for (int o = 0; o < MATH_SWEEP_OUTS; o++) {
		const float *want = out[0][o].data, *got = out[1][o].data;
		int64_t k, bad = math_sweep_diff(got, want, n, &k);
		ck_assert_msg(bad == 0, "%s: %lld of %lld differ on emu; x = %.9g: got %.9g, "
			      "want %.9g", math_sweep_names[o], (long long)bad, (long long)n,
			      (double)x[k], (double)got[k], (double)want[k]);
		fz_free(out[0][o].data);
		fz_free(out[1][o].data);
	}
	free(x);
	fz_module_free(m);
}
END_TEST

START_TEST(options_parse)
{
	fz_cg_options o;
	ck_assert_int_eq(fz_cg_options_parse("emu", &o, NULL), FZ_OK);
	ck_assert(o.target == FZ_CG_EMU && o.sm == 90);
	ck_assert_int_eq(fz_cg_options_parse("emu-sm_80", &o, NULL), FZ_OK);
	ck_assert(o.target == FZ_CG_EMU && o.sm == 80);
	char *err = NULL;
	ck_assert_int_eq(fz_cg_options_parse("emu-sm_60", &o, &err), FZ_EINVAL);
	ck_assert(err && strstr(err, "emu[-sm_NN]"));
	free(err);
	ck_assert_int_eq(fz_cg_options_parse("emux", &o, NULL), FZ_EINVAL);
}
END_TEST

/* ---- warp-level matrix operations (codegen/mma.c) --------------------------- */

/* The GEMM tile kernel of spec sp on EMU (options o) against a plain f64
 * product of the same 16-bit inputs: the status, and the worst error
 * relative to 1e-5 of the sum of |a b| (an f32 accumulation's bound). */
static fz_status gemm_emu(fz_cg_options o, cg_gemm_spec sp, double *worst, char **err,
			  fz_emu_stats *stats)
{
	fz_compiler *c;
	ck_assert_int_eq(fz_compiler_new(&o, &c, NULL), FZ_OK);
	fz_kernel *k = NULL;
	fz_status st = cg_gemm_build(c, &sp, &k, err);
	ck_assert_msg(st == FZ_OK, "build: %s", *err ? *err : "?");
	int64_t M = sp.M, N = sp.N, K = sp.K;
	uint16_t *a = malloc(sizeof *a * (size_t)(M * K)), *b = malloc(sizeof *b * (size_t)(N * K));
	float *y = malloc(sizeof *y * (size_t)(M * N));
	for (int64_t i = 0; i < M * K; i++)
		fz_store_f64(a, sp.dtype, i, urand() * 4 - 2);
	for (int64_t i = 0; i < N * K; i++)
		fz_store_f64(b, sp.dtype, i, urand() * 4 - 2);
	fz_kernel kk = *k;
	kk.mod = NULL;
	void *obj = NULL;
	size_t len = 0;
	fz_host_fn fn = NULL;
	st = fz_kernel_object(c, k, &obj, &len, err);
	if (st == FZ_OK)
		st = fz_host_load(c, obj, len, kk.names[0], &fn, err);
	ck_assert_msg(st == FZ_OK, "%s", *err ? *err : "?");
	int64_t grid;
	int block;
	fz_kernel_launch_dims(&kk, 0, NULL, &grid, &block);
	ck_assert_int_eq(block, FZ_TILE_BLOCK);
	ck_assert_int_eq(grid, (M + 63) / 64 * ((N + 31) / 32));
	fz_emu_sched *s;
	ck_assert_int_eq(fz_emu_sched_new(&s, NULL), FZ_OK);
	void *bufs[3] = {a, b, y};
	int32_t flag = 0;
	int64_t syms[1] = {0};
	/* fewer blocks than tiles as well: the grid-stride loop */
	for (int pass = 0; pass < 2 && st == FZ_OK; pass++) {
		for (int64_t i = 0; i < M * N; i++)
			y[i] = NAN;
		fz_emu_launch L = {kk.names[0], 0, (fz_emu_fn)(void (*)(void))fn, bufs, syms,
				   &flag, pass ? 1 : grid, block, true, 2, kk.smem};
		st = fz_emu_run(s, &L, err);
		*worst = 0;
		for (int64_t i = 0; st == FZ_OK && i < M; i++)
			for (int64_t j = 0; j < N; j++) {
				double want = 0, mag = 0;
				for (int64_t q = 0; q < K; q++) {
					double x = fz_load_f64(a, sp.dtype, i * K + q);
					double w = fz_load_f64(b, sp.dtype, sp.kn ? q * N + j : j * K + q);
					want += x * w;
					mag += fabs(x * w);
				}
				double r = fabs(y[i * N + j] - want) / (1e-5 * mag + 1e-30);
				if (!(r <= *worst))
					*worst = isnan(r) ? INFINITY : r;
			}
	}
	if (stats)
		*stats = *fz_emu_sched_stats(s);
	fz_emu_sched_free(s);
	free(obj);
	free(a);
	free(b);
	free(y);
	fz_kernel_free(k);
	fz_compiler_free(c);
	return st;
}

/* mma.sync, ldmatrix (plain for A and for B stored [n][k], .trans for B
 * stored [k][n]) and cp.async with double buffering, in the PTX layouts:
 * the product is right at full tiles, at tails in M, N and K, and at one
 * row; every mma and ldmatrix went through the warp. */
START_TEST(gemm_tile_matches)
{
	static const int64_t sizes[][3] = {{64, 32, 32}, {100, 72, 40}, {1, 8, 8},
					   {129, 40, 96}};
	for (int v = 0; v < 4; v++)
		for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++) {
			cg_gemm_spec sp = {sizes[z][0], sizes[z][1], sizes[z][2],
					   v & 1 ? FZ_F16 : FZ_BF16, v >= 2};
			double worst = 0;
			char *err = NULL;
			fz_emu_stats stats;
			fz_status st = gemm_emu(emu_opts(true, true, 0), sp, &worst, &err, &stats);
			ck_assert_msg(st == FZ_OK, "%s %s %lldx%lldx%lld: %s", v & 1 ? "f16" : "bf16",
				      v >= 2 ? "kn" : "nk", (long long)sp.M, (long long)sp.N,
				      (long long)sp.K, err ? err : "?");
			ck_assert_msg(worst <= 1, "%s %s %lldx%lldx%lld: worst %g",
				      v & 1 ? "f16" : "bf16", v >= 2 ? "kn" : "nk",
				      (long long)sp.M, (long long)sp.N, (long long)sp.K, worst);
			/* per tile and k step: 4 warps x 4 n-tiles of mma, 4 x (1 + 2)
			 * ldmatrix; twice (grid, then one block) */
			int64_t tiles = (sp.M + 63) / 64 * ((sp.N + 31) / 32);
			int64_t ks = (sp.K + 31) / 32 * 2;
			ck_assert_int_eq(stats.mmas, 2 * tiles * ks * 16);
			ck_assert_int_eq(stats.ldmatrix, 2 * tiles * ks * 12);
			ck_assert(stats.cp_async > 0);
			free(err);
		}
}
END_TEST

/* Each seeded fault trips the GEMM tile with its violation. */
START_TEST(gemm_tile_faults)
{
	struct { fz_emu_fault f; const char *what; } cases[] = {
		{FZ_EMU_FAULT_MMA, "reaches an mma.sync (site"},
		{FZ_EMU_FAULT_CPWAIT, "before the cp.async.wait_group that delivers it"},
		{FZ_EMU_FAULT_BARRIER, "shared-memory race"},
		{FZ_EMU_FAULT_LOAD, "global load out of bounds"},
		{FZ_EMU_FAULT_STORE, "global store out of bounds"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		cg_gemm_spec sp = {100, 72, 40, FZ_BF16, i % 2};
		double worst;
		char *err = NULL;
		fz_status st = gemm_emu(emu_opts(true, true, cases[i].f), sp, &worst, &err, NULL);
		ck_assert_msg(st == FZ_ERUNTIME && err && strstr(err, cases[i].what),
			      "fault %d: %s '%s'", cases[i].f, fz_status_name(st), err ? err : "");
		free(err);
	}
	/* the mma fault names the lane that never came (it went on to the
	 * next ldmatrix) */
	cg_gemm_spec sp = {64, 32, 32, FZ_F16, false};
	double worst;
	char *err = NULL;
	gemm_emu(emu_opts(true, true, FZ_EMU_FAULT_MMA), sp, &worst, &err, NULL);
	ck_assert_msg(err && strstr(err, "that lane 31 never reaches: it waits at another"),
		      "%s", err ? err : "");
	free(err);
}
END_TEST

/* Hand-written: ldmatrix x1, x2, x4, plain and .trans, against the layout
 * (lane l: row l / 4, elements 2(l % 4) and + 1 of each matrix; .trans:
 * the transpose); the tile is filled by cp.async (half of it zero-filled)
 * and read after the wait and a barrier. Modes: 0 clean; 1 a read before
 * the wait; 2 a read before the barrier by another warp's thread; 3 lane
 * 9 skips the ldmatrix; 4 an ldmatrix row past the tile; 5 a misaligned
 * row. */
static int ldm_mode, ldm_n, ldm_trans;
static uint16_t ldm_src[64 * 8];
static void k_ldmatrix(void **bufs, const int64_t *syms, int32_t *err, fz_emu_thread *t)
{
	(void)syms; (void)err;
	int32_t *y = bufs[1];
	int size = 64 * 16;
	/* 64 rows of 16 bytes: thread i copies row i (rows 32.. zeros) */
	if (t->tid < 64)
		t->cp_async(t, t->tid * 16, ldm_src + t->tid * 8, t->tid < 32 ? 16 : 0, size, 0);
	t->cp_group(t, -1, 1);
	if (ldm_mode == 1 && t->tid == 3) /* its own row, still in flight */
		(void)*(volatile int16_t *)t->tile(t, 3 * 16, 2, 0, size, 2);
	t->cp_group(t, 0, 3);
	if (ldm_mode != 2)
		t->barrier(t, 4);
	if (ldm_mode == 2 && t->tid == 40)
		(void)*(volatile int16_t *)t->tile(t, 16 * 5, 2, 0, size, 5);
	int lane = t->tid % 32, warp = t->tid / 32;
	int64_t off = (warp * 32 + lane) * 16; /* warp w: rows 32w .. */
	if (ldm_mode == 4 && lane == 0)
		off = 64 * 16;
	if (ldm_mode == 5 && lane == 1)
		off += 2;
	int32_t r[4] = {0};
	if (!(ldm_mode == 3 && lane == 9))
		t->ldmatrix(t, off, ldm_n | (ldm_trans ? 16 : 0), size, r, 6);
	for (int m = 0; m < 4; m++)
		y[t->tid * 4 + m] = r[m];
}

START_TEST(ldmatrix_layouts)
{
	for (int i = 0; i < 64 * 8; i++)
		ldm_src[i] = (uint16_t)(i + 1);
	static int32_t y[64 * 4];
	void *bufs[2] = {ldm_src, y};
	for (int n = 1; n <= 4; n *= 2)
		for (int tr = 0; tr < 2; tr++) {
			ldm_mode = 0;
			ldm_n = n;
			ldm_trans = tr;
			char *e = NULL;
			ck_assert_msg(launch_c(k_ldmatrix, bufs, 2, 64, true, &e) == FZ_OK, "%s", e);
			for (int tid = 0; tid < 64; tid++)
				for (int m = 0; m < n; m++) {
					int l = tid % 32, w = tid / 32, g = l / 4, c = 2 * (l % 4);
					/* element (row, col) of matrix m of warp w */
					int rlo = tr ? c : g, clo = tr ? g : c;
					int rhi = tr ? c + 1 : g, chi = tr ? g : c + 1;
					int base = (w * 32 + 8 * m) * 8;
					uint32_t lo = w ? 0 : ldm_src[base + rlo * 8 + clo];
					uint32_t hi = w ? 0 : ldm_src[base + rhi * 8 + chi];
					ck_assert_msg((uint32_t)y[tid * 4 + m] == (lo | hi << 16),
						      "x%d%s thread %d matrix %d: %08x, want %08x", n,
						      tr ? ".trans" : "", tid, m, (uint32_t)y[tid * 4 + m],
						      lo | hi << 16);
				}
		}
	ldm_n = 4;
	ldm_trans = 0;
	struct { int mode; const char *what; } bad[] = {
		{1, "load of byte 48 of tile memory before the cp.async.wait_group"},
		{2, "shared-memory race (read after write): byte 80 of tile memory"},
		{3, "reaches an ldmatrix (site 6) that lane 9 never reaches: it exited"},
		{4, "shared memory out of bounds: ldmatrix of bytes [1024, 1040)"},
		{5, "misaligned ldmatrix"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		ldm_mode = bad[i].mode;
		char *e = NULL;
		ck_assert_int_eq(launch_c(k_ldmatrix, bufs, 1, 64, true, &e), FZ_ERUNTIME);
		ck_assert_msg(e && strstr(e, bad[i].what), "mode %d: '%s'", bad[i].mode, e);
		free(e);
	}
}
END_TEST

/* ---- attention on tensor cores (codegen/attention_gpu.c) -------------------- */

/* Under AddressSanitizer the emulator is tens of times slower: the
 * sanitized build runs the small attention cases only. */
#if defined(__SANITIZE_ADDRESS__)
#define ATTN_LIGHT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_LIGHT 1
#endif
#endif
#ifndef ATTN_LIGHT
#define ATTN_LIGHT 0
#endif

/* Forward, dq and dk/dv of one configuration as three regions; B and T
 * symbolic (T queries and keys). */
static char *attn_src(const char *dt, int hq, int hkv, int d, const char *opts, bool pad)
{
	char mp[64] = "", ma[8] = "";
	if (pad) {
		snprintf(mp, sizeof mp, ", m: bool[B, 1, 1, T]");
		snprintf(ma, sizeof ma, ", m");
	}
	return fz_strdup_printf(
		"trace a(q: %s[B, %d, T, %d], k: %s[B, %d, T, %d], v: %s[B, %d, T, %d], "
		"do: %s[B, %d, T, %d]%s) {\n"
		"  o, lse = attention(q, k, v%s%s)\n"
		"  dq = attention_dq(q, k, v, o, lse, do%s%s)\n"
		"  dk, dv = attention_dkv(q, k, v, o, lse, do%s%s)\n"
		"  return o, lse, dq, dk, dv\n}\n", dt, hq, d, dt, hkv, d, dt, hkv, d, dt, hq, d,
		mp, ma, opts, ma, opts, ma, opts);
}

/* The GPU's attention kernels on emu against the interpreter: causal and
 * not, GQA 4:1, a bool padding mask, a sliding window, softcap, head dims
 * 32, 64, 80 and 128, bf16 and f16 (and f32's forward), at lengths around
 * the blocks of 64 (1, 17, 64, 127, 128, 129), two batches. */
START_TEST(attention_matches)
{
	struct { const char *dt; int hq, hkv, d; const char *opts; bool pad; int64_t T; } c[] = {
		{"bf16", 8, 2, 64, ", causal=true", false, 129},
		{"bf16", 8, 2, 64, ", causal=true", false, 1},
		{"bf16", 2, 2, 64, "", false, 17},
		{"bf16", 2, 2, 80, ", causal=true", false, 64},
		{"bf16", 2, 2, 64, "", true, 127},
		{"f16", 2, 2, 128, ", causal=true, window=20", false, 128},
		{"bf16", 2, 2, 32, ", softcap=5.0", false, 129},
		{"f32", 4, 1, 64, ", causal=true", true, 65}, /* FMA; forward only */
	};
	int64_t tiles = 0, want = 0;
	for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
		if (ATTN_LIGHT && c[i].T > 17)
			continue;
		char *src = attn_src(c[i].dt, c[i].hq, c[i].hkv, c[i].d, c[i].opts, c[i].pad);
		bool fwd_only = !strcmp(c[i].dt, "f32"); /* the GPU's f32 path */
		if (fwd_only) {
			*strstr(src, "  dq =") = 0;
			strcat(src, "  return o, lse\n}\n");
		}
		want += fwd_only ? 1 : 3;
		int64_t syms[2] = {2, c[i].T};
		double worst;
		char *err = NULL;
		int fib = 0;
		fz_status st = emu_compare(src, syms, emu_opts(true, true, 0), 2e-2, &worst, &err,
					   &fib);
		ck_assert_msg(st == FZ_OK, "case %zu (%s d %d%s T %lld): %s", i, c[i].dt, c[i].d,
			      c[i].opts, (long long)c[i].T, err ? err : fz_status_name(st));
		ck_assert_msg(worst <= 1, "case %zu (%s d %d%s T %lld): worst %g", i, c[i].dt,
			      c[i].d, c[i].opts, (long long)c[i].T, worst);
		tiles += fib;
		free(err);
		fz_free(src);
	}
	ck_assert_int_eq(tiles, want); /* every kernel on fibers */
}
END_TEST

/* The seeded faults trip the attention kernels too. */
START_TEST(attention_faults)
{
	struct { fz_emu_fault f; const char *what; } c[] = {
		{FZ_EMU_FAULT_MMA, "that lane 31 never reaches"},
		{FZ_EMU_FAULT_CPWAIT, "before the cp.async.wait_group that delivers it"},
		{FZ_EMU_FAULT_BARRIER, "shared-memory race"},
		{FZ_EMU_FAULT_LOAD, "global load out of bounds"},
		{FZ_EMU_FAULT_STORE, "global store out of bounds"},
	};
	char *src = attn_src("bf16", 4, 1, 64, ", causal=true", false);
	for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
		int64_t syms[2] = {1, ATTN_LIGHT ? 17 : 70};
		double worst;
		char *err = NULL;
		fz_status st = emu_compare(src, syms, emu_opts(true, true, c[i].f), 2e-2, &worst,
					   &err, NULL);
		ck_assert_msg(st == FZ_ERUNTIME && err && strstr(err, c[i].what),
			      "fault %d: %s '%s'", c[i].f, fz_status_name(st), err ? err : "");
		free(err);
	}
	fz_free(src);
}
END_TEST

static Suite *emu_suite(void)
{
	Suite *s = suite_create("emu");
	TCase *tc = tcase_create("scheduler");
	tcase_add_test(tc, sched_block_sum);
	tcase_add_test(tc, sched_barrier_checks);
	tcase_add_test(tc, sched_smem_races);
	tcase_add_test(tc, sched_shuffle_checks);
	tcase_add_test(tc, sched_launch_limits);
	suite_add_tcase(s, tc);
	tc = tcase_create("generated");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, options_parse);
	tcase_add_test(tc, generated_kernels_match);
	tcase_add_test(tc, generated_unvectorized);
	tcase_add_test(tc, seeded_faults_caught);
	tcase_add_test(tc, forced_64bit_indices);
	tcase_add_test(tc, misaligned_vector_access);
	tcase_add_test(tc, half_atomics);
	tcase_add_test(tc, cast_f64_half_once);
	tcase_add_test(tc, float_sums_both_ways);
	tcase_add_test(tc, index_into_empty_extent);
	tcase_add_test(tc, f64_math);
	tcase_add_test(tc, math_matches_host);
	suite_add_tcase(s, tc);
	tc = tcase_create("mma");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, ldmatrix_layouts);
	tcase_add_test(tc, gemm_tile_matches);
	tcase_add_test(tc, gemm_tile_faults);
	tcase_add_test(tc, attention_matches);
	tcase_add_test(tc, attention_faults);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(emu_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
