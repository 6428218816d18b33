/*
 * test_difftest.c: randomized differential testing of generated code
 * against the reference interpreter.
 *
 * Each trace holds CASES independent random DAGs (one output each): two
 * parameters of a random shape (extents 1, primes, powers of two and
 * non-multiples of the vector width; the second with random dims set to 1,
 * so ops broadcast), a chain of random elementwise ops over the values so
 * far (unary, binary, compare + where, casts through another dtype), and
 * in half the cases a reduction over a random set of dims (sum, amax,
 * amin, var_mean), kept or not, followed by an op that uses the reduced
 * value against the full one (the normalization pattern). The dtype is
 * f32, bf16, f16 or i32. Every trace runs on the CPU from generated code
 * (fz_trace_run) and on the interpreter; every output must agree within
 * the `fusec run --check` tolerances. A failure prints the trace.
 *
 * FUSEC_DIFFTEST_TRACES sets the number of traces (default 300, so 1200
 * cases); FUSEC_DIFFTEST_SEED the seed; FUSEC_DIFFTEST_DEVICE the device
 * (default cpu; ctest also runs it on emu, the GPU's kernels emulated).
 */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "splitmix.h"
#include "fusec.h"
#include "ir.h"
#include "numeric.h"

enum { CASES = 4 };

static uint64_t S;
static uint64_t next(void) { return splitmix_next(&S); }
static int pick(int n) { return (int)(next() % (uint64_t)n); }

typedef struct buf {
	char s[16384];
	size_t n;
} buf;

static void put(buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(b->s + b->n, sizeof b->s - b->n, fmt, ap);
	va_end(ap);
	if (k > 0)
		b->n += (size_t)k;
}

static const int EXTS[] = {1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 64, 67};
static const char *FLOATS[] = {"f32", "f32", "bf16", "f16"};

static void gen_case(buf *b, int c, char *params, size_t plen)
{
	bool isint = pick(5) == 0;
	const char *dt = isint ? "i32" : FLOATS[pick(4)];
	int rank = 1 + pick(3), d1[3], d2[3];
	for (int i = 0; i < rank; i++) {
		d1[i] = EXTS[pick(12)];
		d2[i] = pick(3) == 0 ? 1 : d1[i];
	}
	char sh1[64] = "", sh2[64] = "";
	for (int i = 0; i < rank; i++) {
		snprintf(sh1 + strlen(sh1), sizeof sh1 - strlen(sh1), "%s%d", i ? ", " : "", d1[i]);
		snprintf(sh2 + strlen(sh2), sizeof sh2 - strlen(sh2), "%s%d", i ? ", " : "", d2[i]);
	}
	snprintf(params + strlen(params), plen - strlen(params),
		 "%sx%d: %s[%s], y%d: %s[%s]", c ? ", " : "", c, dt, sh1, c, dt, sh2);
	/* values v0 = x, v1 = y (broadcast), then a chain */
	int nv = 2, steps = 2 + pick(6);
	put(b, "  c%d_0 = add(x%d, 0)\n  c%d_1 = add(y%d, 0)\n", c, c, c, c);
	(void)nv;
	int last = 0;
	for (int s = 0; s < steps; s++) {
		int a = pick(2 + s), bb = pick(2 + s);
		char A[32], B[32];
		snprintf(A, sizeof A, a < 2 ? "c%d_%d" : "c%d_s%d", c, a < 2 ? a : a - 2);
		snprintf(B, sizeof B, bb < 2 ? "c%d_%d" : "c%d_s%d", c, bb < 2 ? bb : bb - 2);
		put(b, "  c%d_s%d = ", c, s);
		int k = pick(isint ? 6 : 12);
		if (isint) {
			static const char *ops[] = {"add", "sub", "mul", "maximum", "minimum"};
			if (k < 5)
				put(b, "%s(%s, %s)\n", ops[k], A, B);
			else
				put(b, "where(gt(%s, %s), neg(%s), abs(%s))\n", A, B, A, B);
		} else {
			static const char *bin[] = {"add", "sub", "mul", "maximum", "minimum"};
			static const char *un[] = {"tanh", "sigmoid", "neg", "abs", "floor"};
			if (k < 5)
				put(b, "%s(%s, %s)\n", bin[k], A, B);
			else if (k < 10)
				put(b, "%s(%s)\n", un[k - 5], A);
			else if (k == 10)
				put(b, "div(%s, add(abs(%s), 1))\n", A, B);
			else
				put(b, "where(lt(%s, %s), exp(tanh(%s)), cast(cast(%s, dtype=%s), dtype=%s))\n",
				    A, B, A, B, strcmp(dt, "f32") ? "f32" : "bf16", dt);
		}
		last = s;
	}
	char L[32];
	snprintf(L, sizeof L, "c%d_s%d", c, last);
	/* the chain's value has x's shape only if it saw x; force it */
	put(b, "  c%d_f = add(%s, c%d_0)\n", c, L, c);
	if (pick(2) == 0) {
		put(b, "  r%d = add(c%d_f, 0)\n", c, c);
		return;
	}
	int dims[3], nd = 0;
	for (int i = 0; i < rank; i++)
		if (pick(2) == 0 || (i == rank - 1 && nd == 0))
			dims[nd++] = i;
	char dl[32] = "";
	for (int i = 0; i < nd; i++)
		snprintf(dl + strlen(dl), sizeof dl - strlen(dl), "%s%d", i ? ", " : "", dims[i]);
	bool keep = pick(2) == 0;
	int op = pick(isint ? 3 : 4);
	static const char *rops[] = {"sum", "amax", "amin"};
	if (op == 3)
		put(b, "  c%d_v, c%d_m = var_mean(c%d_f, dims=[%s], correction=0, keepdim=%s)\n"
		    "  c%d_red = add(c%d_v, c%d_m)\n", c, c, c, dl, keep ? "true" : "false", c, c, c);
	else
		put(b, "  c%d_red = %s(c%d_f, dims=[%s], keepdim=%s)\n", c, rops[op], c, dl,
		    keep ? "true" : "false");
	if (keep && pick(2) == 0)
		put(b, "  r%d = sub(c%d_f, c%d_red)\n", c, c, c);
	else
		put(b, "  r%d = add(c%d_red, 0)\n", c, c);
}

static double tol(fz_dtype d)
{
	switch (d) {
	case FZ_F32: return 1e-5;
	case FZ_F16: return 2e-3;
	case FZ_BF16: return 2e-2;
	default: return 0;
	}
}

static int run_one(int n, long *cases, long *failed)
{
	buf body = {{0}, 0};
	char params[2048] = "";
	for (int c = 0; c < CASES; c++)
		gen_case(&body, c, params, sizeof params);
	char src[20000];
	snprintf(src, sizeof src, "trace d%d(%s) {\n%s  return r0, r1, r2, r3\n}\n", n,
		 params, body.s);
	fz_module *m = NULL;
	char *err = NULL;
	if (fz_module_parse(src, strlen(src), "random.trace", &m, &err) != FZ_OK) {
		fprintf(stderr, "generator wrote a bad trace:\n%s\n%s\n", src, err);
		fz_free(err);
		(*failed)++;
		return 1;
	}
	fz_trace *t = fz_module_trace(m, 0);
	int n_in = fz_trace_param_count(t);
	fz_tensor in[2 * CASES], got[CASES], want[CASES];
	memset(in, 0, sizeof in);
	for (int i = 0; i < n_in; i++) {
		const fz_value *p = fz_trace_param(t, i);
		fz_tensor *x = &in[i];
		x->dtype = fz_value_dtype(p);
		x->rank = fz_value_rank(p);
		int64_t acc = 1;
		for (int d = x->rank - 1; d >= 0; d--) {
			x->shape[d] = fz_value_extent(p, d, NULL);
			x->strides[d] = acc;
			acc *= x->shape[d];
		}
		x->data = malloc((size_t)acc * fz_dtype_size(x->dtype) + 8);
		for (int64_t k = 0; k < acc; k++) {
			double v = x->dtype == FZ_I32 ? (double)((int)(next() % 41) - 20) :
				   ((double)(next() >> 11) * 0x1p-53) * 4 - 2;
			fz_store_f64(x->data, x->dtype, k, v);
		}
	}
	int bad = 0;
	const char *dev = getenv("FUSEC_DIFFTEST_DEVICE");
	fz_status st = fz_trace_run(t, dev && dev[0] ? dev : "cpu", NULL, in, n_in, got,
				    CASES, &err);
	if (st != FZ_OK) {
		fprintf(stderr, "run failed: %s\n%s\n", err ? err : "?", src);
		fz_free(err);
		bad = 1;
		*failed += CASES;
		goto out;
	}
	st = fz_trace_interpret(t, NULL, in, n_in, want, CASES, &err);
	ck_assert_msg(st == FZ_OK, "interpret: %s", err ? err : "?");
	for (int k = 0; k < CASES; k++) {
		int64_t ne = 1;
		for (int d = 0; d < want[k].rank; d++)
			ne *= want[k].shape[d];
		double ss = 0, t0 = tol(want[k].dtype);
		for (int64_t i = 0; i < ne; i++) {
			double w = fz_load_f64(want[k].data, want[k].dtype, i);
			if (isfinite(w))
				ss += w * w;
		}
		double atol = t0 * fmax(1, sqrt(ss / (double)(ne ? ne : 1)));
		bool ok = true;
		for (int64_t i = 0; i < ne && ok; i++) {
			double g = fz_load_f64(got[k].data, got[k].dtype, i);
			double w = fz_load_f64(want[k].data, want[k].dtype, i);
			if ((isnan(g) && isnan(w)) || g == w)
				continue;
			ok = fabs(g - w) <= atol + t0 * fabs(w);
			if (!ok)
				fprintf(stderr, "output r%d[%lld]: got %.9g want %.9g\n", k,
					(long long)i, g, w);
		}
		(*cases)++;
		if (!ok) {
			(*failed)++;
			bad = 1;
			fprintf(stderr, "%s\n", src);
		}
		fz_free(got[k].data);
		fz_free(want[k].data);
	}
out:
	for (int i = 0; i < n_in; i++)
		free(in[i].data);
	fz_free(err);
	fz_module_free(m);
	return bad;
}

START_TEST(random_dags)
{
	const char *e = getenv("FUSEC_DIFFTEST_TRACES");
	const char *s = getenv("FUSEC_DIFFTEST_SEED");
	int n = e ? atoi(e) : 300;
	S = s ? strtoull(s, NULL, 10) : 20250101;
	long cases = 0, failed = 0;
	int bad = 0;
	for (int i = 0; i < n && bad < 5; i++)
		bad += run_one(i, &cases, &failed);
	const char *dev = getenv("FUSEC_DIFFTEST_DEVICE");
	printf("difftest: %ld cases in %d traces on %s, %ld failed\n", cases, n,
	       dev && dev[0] ? dev : "cpu", failed);
	ck_assert_msg(failed == 0, "%ld of %ld random cases differ", failed, cases);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("difftest");
	TCase *tc = tcase_create("random");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, random_dags);
	suite_add_tcase(s, tc);
	SRunner *r = srunner_create(s);
	srunner_run_all(r, CK_NORMAL);
	int f = srunner_ntests_failed(r);
	srunner_free(r);
	return f ? 1 : 0;
}
