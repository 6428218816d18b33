/*
 * test_interp.c: the reference interpreter, its conversions (numeric.h) and
 * its random numbers (philox.h).
 *
 * The interpreter is the oracle every backend is judged by, so its tests
 * compare with values worked out by hand or computed independently (libm on
 * f64, the compiler's own _Float16, the bit trick for bf16), never with the
 * interpreter itself. Most traces are written as text and parsed, because a
 * trace reads best as a trace; a few are built with the C builder.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusec.h"
#include "ir.h"
#include "numeric.h"
#include "philox.h"

/* ---- helpers ---------------------------------------------------------------- */

static fz_tensor tens(fz_dtype d, void *data, int rank, const int64_t *shape)
{
	fz_tensor t;
	memset(&t, 0, sizeof t);
	t.data = data;
	t.dtype = d;
	t.rank = rank;
	int64_t acc = 1;
	for (int i = rank - 1; i >= 0; i--) {
		t.shape[i] = shape[i];
		t.strides[i] = acc;
		acc *= shape[i];
	}
	return t;
}

#define SHAPE(...) (const int64_t[]){__VA_ARGS__}

static fz_module *parse(const char *src)
{
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = fz_module_parse(src, strlen(src), "test.trace", &m, &diag);
	ck_assert_msg(st == FZ_OK, "parse failed: %s", diag ? diag : "(no message)");
	fz_free(diag);
	return m;
}

/* Parses one trace and interprets it with every symbol taken from the
 * inputs. The message, if any, goes to *err (the caller frees it). */
static fz_status run(const char *src, const fz_tensor *in, int n_in,
		     fz_tensor *out, int n_out, char **err)
{
	fz_module *m = parse(src);
	fz_trace *t = fz_module_trace(m, 0);
	int64_t syms[FZ_MAX_SYMS];
	for (int i = 0; i < FZ_MAX_SYMS; i++)
		syms[i] = -1;
	fz_status st = fz_trace_interpret(t, syms, in, n_in, out, n_out, err);
	fz_module_free(m);
	return st;
}

static void run_ok(const char *src, const fz_tensor *in, int n_in, fz_tensor *out,
		   int n_out)
{
	char *err = NULL;
	fz_status st = run(src, in, n_in, out, n_out, &err);
	ck_assert_msg(st == FZ_OK, "interpret failed (%s): %s", fz_status_name(st),
		      err ? err : "(no message)");
	ck_assert_ptr_null(err);
}

/* Runs and expects failure with `st`; the message must contain every
 * string in want[] (NULL-terminated). */
static void run_fail(const char *src, const fz_tensor *in, int n_in, int n_out,
		     fz_status want_st, const char *const *want)
{
	fz_tensor out[4];
	for (int i = 0; i < 4; i++) {
		memset(&out[i], 0xab, sizeof out[i]);
	}
	fz_tensor before[4];
	memcpy(before, out, sizeof out);
	char *err = NULL;
	fz_status st = run(src, in, n_in, out, n_out, &err);
	ck_assert_msg(st == want_st, "status %s, expected %s (%s)",
		      fz_status_name(st), fz_status_name(want_st), err ? err : "");
	ck_assert_ptr_nonnull(err);
	for (int i = 0; want && want[i]; i++)
		ck_assert_msg(strstr(err, want[i]), "message '%s' lacks '%s'", err,
			      want[i]);
	ck_assert_msg(memcmp(before, out, sizeof out) == 0,
		      "outputs were touched on error");
	fz_free(err);
}

static double at(const fz_tensor *t, int64_t i)
{
	return fz_load_f64(t->data, t->dtype, i);
}

static void check_out(const fz_tensor *t, fz_dtype d, int rank, const int64_t *shape)
{
	ck_assert_int_eq(t->dtype, d);
	ck_assert_int_eq(t->rank, rank);
	int64_t acc = 1;
	for (int i = rank - 1; i >= 0; i--) {
		ck_assert_int_eq(t->shape[i], shape[i]);
		ck_assert_int_eq(t->strides[i], acc);
		acc *= shape[i];
	}
	ck_assert_ptr_nonnull(t->data);
}

/* Values equal, NaN equal to NaN. */
static void expect_vals(const fz_tensor *t, const double *want, int n)
{
	for (int i = 0; i < n; i++) {
		double g = at(t, i);
		if (isnan(want[i]))
			ck_assert_msg(isnan(g), "element %d: got %.17g, want nan", i, g);
		else
			ck_assert_msg(g == want[i], "element %d: got %.17g, want %.17g",
				      i, g, want[i]);
	}
}

static void expect_close(const fz_tensor *t, const double *want, int n, double tol)
{
	for (int i = 0; i < n; i++) {
		double g = at(t, i);
		ck_assert_msg(fabs(g - want[i]) <= tol * (1 + fabs(want[i])),
			      "element %d: got %.17g, want %.17g", i, g, want[i]);
	}
}

/* ---- numeric.h: conversions ------------------------------------------------- */

START_TEST(bf16_rounding)
{
	static const struct { double x; uint16_t bits; } cases[] = {
		{1.0, 0x3f80},
		{1.0 + 0x1p-8, 0x3f80},            /* tie, kept mantissa even: down */
		{1.0 + 3 * 0x1p-8, 0x3f82},        /* tie, odd: up */
		{1.0 + 0x1p-8 + 0x1p-30, 0x3f81},  /* just above the tie */
		{1.0 + 0x1p-8 - 0x1p-30, 0x3f80},  /* just below */
		{-1.0 - 3 * 0x1p-8, 0xbf82},
		{3.3895313892515355e38, 0x7f7f},   /* the largest finite bf16 */
		{0x1.fep127 + 0x1p119, 0x7f80},    /* max + half an ulp: to inf */
		{0x1.fep127 + 0x1p119 - 0x1p100, 0x7f7f},
		{1e39, 0x7f80},
		{-1e39, 0xff80},
		{INFINITY, 0x7f80},
		{-INFINITY, 0xff80},
		{0x1p-133, 0x0001},                /* the smallest subnormal */
		{0x1p-134, 0x0000},                /* half of it: tie to even 0 */
		{0x1.8p-134, 0x0001},
		{0x1p-126, 0x0080},                /* the smallest normal */
		{0x1p-126 - 0x1p-134, 0x0080},     /* 127.5 subnormal ulps: to 128 */
		{-0.0, 0x8000},
		{0.0, 0x0000},
		{4.9e-324, 0x0000},                /* an f64 subnormal */
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		uint16_t b = fz_f64_to_bf16(cases[i].x);
		ck_assert_msg(b == cases[i].bits, "bf16(%a) = %04x, want %04x",
			      cases[i].x, b, cases[i].bits);
	}
	uint16_t n = fz_f64_to_bf16(NAN);
	ck_assert((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
	ck_assert(isnan(fz_bf16_to_f64(n)));
	n = fz_f64_to_bf16(-NAN);
	ck_assert(isnan(fz_bf16_to_f64(n)) && (n & 0x8000));
}
END_TEST

START_TEST(f16_rounding)
{
	static const struct { double x; uint16_t bits; } cases[] = {
		{1.0, 0x3c00},
		{1.0 + 0x1p-11, 0x3c00},           /* tie, even: down */
		{1.0 + 3 * 0x1p-11, 0x3c02},       /* tie, odd: up */
		{65504.0, 0x7bff},                 /* the largest finite f16 */
		{65519.99, 0x7bff},
		{65520.0, 0x7c00},                 /* max + half an ulp: inf */
		{-65520.0, 0xfc00},
		{1e10, 0x7c00},
		{0x1p-24, 0x0001},                 /* the smallest subnormal */
		{0x1p-25, 0x0000},                 /* tie to even: 0 */
		{0x1.8p-24, 0x0002},               /* 1.5 ulps: tie to even 2 */
		{0x1.4p-24, 0x0001},
		{0x1p-14, 0x0400},                 /* the smallest normal */
		{0x1p-14 - 0x1p-25, 0x0400},       /* 1023.5 ulps: to 1024 */
		{-0.0, 0x8000},
		{0.1, 0x2e66},
		{-2.5, 0xc100},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		uint16_t b = fz_f64_to_f16(cases[i].x);
		ck_assert_msg(b == cases[i].bits, "f16(%a) = %04x, want %04x",
			      cases[i].x, b, cases[i].bits);
	}
	ck_assert_uint_eq(fz_f64_to_f16(INFINITY), 0x7c00);
	ck_assert_uint_eq(fz_f64_to_f16(NAN) & 0x7e00, 0x7e00);
	ck_assert(isnan(fz_f16_to_f64(fz_f64_to_f16(NAN))));
}
END_TEST

/* Every bit pattern survives a round trip through f64. */
START_TEST(small_float_roundtrip)
{
	for (uint32_t b = 0; b < 0x10000; b++) {
		double h = fz_f16_to_f64((uint16_t)b), g = fz_bf16_to_f64((uint16_t)b);
		if (isnan(h))
			ck_assert(isnan(fz_f16_to_f64(fz_f64_to_f16(h))));
		else
			ck_assert_uint_eq(fz_f64_to_f16(h), b);
		if (isnan(g))
			ck_assert(isnan(fz_bf16_to_f64(fz_f64_to_bf16(g))));
		else
			ck_assert_uint_eq(fz_f64_to_bf16(g), b);
	}
	ck_assert(fz_f16_to_f64(0x0001) == 0x1p-24);
	ck_assert(fz_f16_to_f64(0x7bff) == 65504.0);
	ck_assert(fz_bf16_to_f64(0x0001) == 0x1p-133);
	ck_assert(isinf(fz_bf16_to_f64(0xff80)) && fz_bf16_to_f64(0xff80) < 0);
}
END_TEST

/* Against independent implementations: the classic bit trick for
 * f32 -> bf16 and, where the compiler has it, _Float16. */
START_TEST(small_float_vs_reference)
{
	uint64_t s = 0x9e3779b97f4a7c15u;
	for (int i = 0; i < 200000; i++) {
		s = s * 6364136223846793005u + 1442695040888963407u;
		uint32_t u = (uint32_t)(s >> 32);
		float f;
		memcpy(&f, &u, 4);
		if (isnan(f))
			continue;
		uint16_t want = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
		ck_assert_msg(fz_f32_to_bf16(f) == want, "bf16(%a): %04x, want %04x",
			      (double)f, fz_f32_to_bf16(f), want);
#ifdef __FLT16_MAX__
		double d;
		uint64_t w = s ^ (s >> 29);
		memcpy(&d, &w, 8);
		d = ldexp(frexp(d, &(int){0}), (int)(s % 64) - 40); /* around f16 range */
		if (isnan(d))
			continue;
		_Float16 h = (_Float16)d;
		uint16_t hb;
		memcpy(&hb, &h, 2);
		ck_assert_msg(fz_f64_to_f16(d) == hb, "f16(%a): %04x, want %04x", d,
			      fz_f64_to_f16(d), hb);
#endif
	}
}
END_TEST

START_TEST(store_cast_semantics)
{
	int32_t i32;
	fz_store_f64(&i32, FZ_I32, 0, 3.9);
	ck_assert_int_eq(i32, 3);
	fz_store_f64(&i32, FZ_I32, 0, -3.9);
	ck_assert_int_eq(i32, -3);
	fz_store_f64(&i32, FZ_I32, 0, NAN);
	ck_assert_int_eq(i32, 0);
	fz_store_f64(&i32, FZ_I32, 0, 1e20);
	ck_assert_int_eq(i32, INT32_MAX);
	fz_store_f64(&i32, FZ_I32, 0, -INFINITY);
	ck_assert_int_eq(i32, INT32_MIN);
	int64_t i64;
	fz_store_f64(&i64, FZ_I64, 0, 1e300);
	ck_assert(i64 == INT64_MAX);
	fz_store_f64(&i64, FZ_I64, 0, -0x1p63);
	ck_assert(i64 == INT64_MIN);
	uint8_t u8;
	fz_store_f64(&u8, FZ_U8, 0, -5.0);
	ck_assert_uint_eq(u8, 0);
	fz_store_f64(&u8, FZ_U8, 0, 300.0);
	ck_assert_uint_eq(u8, 255);
	fz_store_i64(&u8, FZ_U8, 0, 300);
	ck_assert_uint_eq(u8, 44);
	int8_t i8;
	fz_store_i64(&i8, FZ_I8, 0, 200);
	ck_assert_int_eq(i8, -56);
	fz_store_i64(&i32, FZ_I32, 0, INT64_C(0x100000005));
	ck_assert_int_eq(i32, 5);
	uint8_t b;
	fz_store_f64(&b, FZ_BOOL, 0, NAN);
	ck_assert_uint_eq(b, 1);
	fz_store_f64(&b, FZ_BOOL, 0, -0.0);
	ck_assert_uint_eq(b, 0);
	fz_store_i64(&b, FZ_BOOL, 0, 256);
	ck_assert_uint_eq(b, 1);
	float f;
	fz_store_i64(&f, FZ_F32, 0, INT64_C(16777217)); /* 2^24 + 1: ties to even */
	ck_assert(f == 16777216.0f);
	ck_assert(fz_load_i64(&(double){-7.9}, FZ_F64, 0) == -7);
}
END_TEST

/* ---- philox.h ------------------------------------------------------------------- */

/* Random123's kat_vectors for philox4x32_10. */
START_TEST(philox_known_answers)
{
	static const struct { uint32_t ctr[4], key[2], out[4]; } kat[] = {
		{{0, 0, 0, 0}, {0, 0},
		 {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
		{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
		 {0xffffffff, 0xffffffff},
		 {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
		{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
		 {0xa4093822, 0x299f31d0},
		 {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
	};
	for (size_t k = 0; k < sizeof kat / sizeof *kat; k++) {
		uint32_t out[4];
		fz_philox4x32_10(kat[k].ctr, kat[k].key, out);
		for (int i = 0; i < 4; i++)
			ck_assert_msg(out[i] == kat[k].out[i], "vector %zu word %d: "
				      "%08x, want %08x", k, i, out[i], kat[k].out[i]);
	}
	/* element i of (seed 0, offset 0) is word i of counter 0, key 0 */
	ck_assert_uint_eq(fz_philox_word(0, 0, 2), 0xbc57ac4c);
	/* the counter carries into its high word: offset 2^32 - 1, element 4 */
	uint32_t ctr[4] = {0, 1, 0, 0}, key[2] = {5, 6}, out[4];
	fz_philox4x32_10(ctr, key, out);
	ck_assert_uint_eq(fz_philox_word(UINT64_C(0x600000005), 0xffffffffu, 5), out[1]);
}
END_TEST

START_TEST(uniform_values)
{
	fz_tensor out[1];
	run_ok("trace u() {\n"
	       "  y = uniform(shape=[2, 5], seed=81985529216486895, offset=3,"
	       " dtype=f32)\n"
	       "  return y\n}\n", NULL, 0, out, 1);
	check_out(&out[0], FZ_F32, 2, SHAPE(2, 5));
	const uint64_t seed = 81985529216486895u; /* 0x0123456789abcdef */
	for (uint64_t i = 0; i < 10; i++) {
		uint64_t n = 3 + i / 4;
		uint32_t ctr[4] = {(uint32_t)n, (uint32_t)(n >> 32), 0, 0};
		uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
		uint32_t w[4];
		fz_philox4x32_10(ctr, key, w);
		double want = (double)(w[i % 4] >> 8) / 16777216.0;
		ck_assert_msg(at(&out[0], (int64_t)i) == want, "element %d",
			      (int)i);
	}
	fz_free(out[0].data);
}
END_TEST

/* Range, exactness per dtype, and counter arithmetic: offset 1 starts
 * where element 4 of offset 0 is. */
START_TEST(uniform_range)
{
	static const char *const dts[] = {"f64", "f32", "f16", "bf16"};
	static const double ulp[] = {0x1p-32, 0x1p-24, 0x1p-11, 0x1p-8};
	for (int k = 0; k < 4; k++) {
		char src[256];
		fz_tensor out[2];
		snprintf(src, sizeof src, "trace u() {\n"
			 "  a = uniform(shape=[4096], seed=7, offset=0, dtype=%s)\n"
			 "  b = uniform(shape=[8], seed=7, offset=1, dtype=%s)\n"
			 "  return a, b\n}\n", dts[k], dts[k]);
		run_ok(src, NULL, 0, out, 2);
		double sum = 0;
		for (int i = 0; i < 4096; i++) {
			double u = at(&out[0], i);
			ck_assert(u >= 0 && u < 1);
			ck_assert(u / ulp[k] == floor(u / ulp[k]));
			sum += u;
		}
		ck_assert(sum / 4096 > 0.45 && sum / 4096 < 0.55);
		for (int i = 0; i < 8; i++)
			ck_assert(at(&out[1], i) == at(&out[0], i + 4));
		fz_free(out[0].data);
		fz_free(out[1].data);
	}
}
END_TEST

/* ---- elementwise ------------------------------------------------------------------ */

static double ref_unary(const char *op, double x)
{
	if (!strcmp(op, "neg")) return -x;
	if (!strcmp(op, "abs")) return fabs(x);
	if (!strcmp(op, "exp")) return exp(x);
	if (!strcmp(op, "exp2")) return exp2(x);
	if (!strcmp(op, "log")) return log(x);
	if (!strcmp(op, "log2")) return log2(x);
	if (!strcmp(op, "log1p")) return log1p(x);
	if (!strcmp(op, "expm1")) return expm1(x);
	if (!strcmp(op, "sqrt")) return sqrt(x);
	if (!strcmp(op, "rsqrt")) return 1 / sqrt(x);
	if (!strcmp(op, "reciprocal")) return 1 / x;
	if (!strcmp(op, "sin")) return sin(x);
	if (!strcmp(op, "cos")) return cos(x);
	if (!strcmp(op, "tanh")) return tanh(x);
	if (!strcmp(op, "sigmoid")) return 1 / (1 + exp(-x));
	if (!strcmp(op, "erf")) return erf(x);
	if (!strcmp(op, "floor")) return floor(x);
	if (!strcmp(op, "ceil")) return ceil(x);
	if (!strcmp(op, "round")) return x - floor(x) == 0.5 ?
		(fmod(floor(x), 2) == 0 ? floor(x) : ceil(x)) : floor(x + 0.5);
	if (!strcmp(op, "sign")) return isnan(x) ? x : (x > 0) - (x < 0);
	ck_abort_msg("no reference for %s", op);
	return 0;
}

/* Every float unary op of the table, in f64, f32 and bf16, against libm:
 * the result is libm's f64 value of the stored input, rounded once. */
START_TEST(unary_ops_vs_libm)
{
	static const double xs[] = {-2.5, -1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 1.5,
				    2.5, 3.7, 1e-3, 40.0, -INFINITY, NAN};
	enum { N = sizeof xs / sizeof *xs };
	int tested = 0;
	for (int op = 0; op < FZ_OP_COUNT; op++) {
		const fz_opinfo *oi = &fz_ops[op];
		if (oi->cls != FZ_CLASS_UNARY || op == FZ_OP_CAST ||
		    (oi->flags & (FL_BOOL | FL_BOOLRES)))
			continue;
		tested++;
		for (int k = 0; k < 3; k++) {
			const fz_dtype dt[] = {FZ_F64, FZ_F32, FZ_BF16};
			char src[256];
			snprintf(src, sizeof src, "trace f(x: %s[%d]) {\n  y = %s(x)\n"
				 "  return y\n}\n", fz_dtype_name(dt[k]), N, oi->name);
			double buf[N];
			for (int i = 0; i < N; i++)
				fz_store_f64(buf, dt[k], i, xs[i]);
			fz_tensor in = tens(dt[k], buf, 1, SHAPE(N)), out;
			run_ok(src, &in, 1, &out, 1);
			check_out(&out, dt[k], 1, SHAPE(N));
			for (int i = 0; i < N; i++) {
				double xv = fz_load_f64(buf, dt[k], i);
				double want_f64 = ref_unary(oi->name, xv), want[1];
				fz_store_f64(want, dt[k], 0, want_f64);
				double w = fz_load_f64(want, dt[k], 0), g = at(&out, i);
				ck_assert_msg((isnan(w) && isnan(g)) || w == g,
					      "%s %s(%g) = %.17g, want %.17g",
					      fz_dtype_name(dt[k]), oi->name, xv, g, w);
			}
			fz_free(out.data);
		}
	}
	ck_assert_int_eq(tested, 20);
}
END_TEST

START_TEST(unary_special_values)
{
	double xs[] = {0.5, 1.5, 2.5, -0.5, -2.5, NAN, -3.0, 0.0};
	fz_tensor in = tens(FZ_F64, xs, 1, SHAPE(8)), out[3];
	run_ok("trace f(x: f64[8]) {\n  r = round(x)\n  s = sign(x)\n"
	       "  g = sigmoid(x)\n  return r, s, g\n}\n", &in, 1, out, 3);
	expect_vals(&out[0], (double[]){0, 2, 2, -0.0, -2, NAN, -3, 0}, 8);
	expect_vals(&out[1], (double[]){1, 1, 1, -1, -1, NAN, -1, 0}, 8);
	ck_assert(at(&out[2], 7) == 0.5);
	for (int i = 0; i < 3; i++)
		fz_free(out[i].data);

	double ys[] = {1.0, INFINITY, -INFINITY, NAN, -0.0};
	in = tens(FZ_F64, ys, 1, SHAPE(5));
	run_ok("trace f(x: f64[5]) {\n  y = isfinite(x)\n  z = logical_not(y)\n"
	       "  return y, z\n}\n", &in, 1, out, 2);
	check_out(&out[0], FZ_BOOL, 1, SHAPE(5));
	expect_vals(&out[0], (double[]){1, 0, 0, 0, 1}, 5);
	expect_vals(&out[1], (double[]){0, 1, 1, 1, 0}, 5);
	fz_free(out[0].data);
	fz_free(out[1].data);
}
END_TEST

START_TEST(unary_int)
{
	int32_t xs[] = {5, -7, 0, INT32_MIN, INT32_MAX};
	fz_tensor in = tens(FZ_I32, xs, 1, SHAPE(5)), out[3];
	run_ok("trace f(x: i32[5]) {\n  a = neg(x)\n  b = abs(x)\n  c = sign(x)\n"
	       "  return a, b, c\n}\n", &in, 1, out, 3);
	const int32_t *a = out[0].data, *b = out[1].data, *c = out[2].data;
	ck_assert_int_eq(a[0], -5);
	ck_assert_int_eq(a[3], INT32_MIN); /* wraps */
	ck_assert_int_eq(a[4], -INT32_MAX);
	ck_assert_int_eq(b[1], 7);
	ck_assert_int_eq(b[3], INT32_MIN);
	ck_assert_int_eq(c[0], 1);
	ck_assert_int_eq(c[1], -1);
	ck_assert_int_eq(c[2], 0);
	for (int i = 0; i < 3; i++)
		fz_free(out[i].data);
}
END_TEST

START_TEST(binary_float)
{
	double a[] = {1.0, -7.5, 2.0, NAN, 0.0, 3.0};
	double b[] = {2.0, 2.0, -3.0, 1.0, 0.0, NAN};
	fz_tensor in[2] = {tens(FZ_F64, a, 1, SHAPE(6)), tens(FZ_F64, b, 1, SHAPE(6))};
	fz_tensor out[8];
	run_ok("trace f(a: f64[6], b: f64[6]) {\n"
	       "  s = add(a, b)\n  d = sub(a, b)\n  m = mul(a, b)\n  q = div(a, b)\n"
	       "  p = pow(a, b)\n  hi = maximum(a, b)\n  lo = minimum(a, b)\n"
	       "  r = fmod(a, b)\n"
	       "  return s, d, m, q, p, hi, lo, r\n}\n", in, 2, out, 8);
	expect_vals(&out[0], (double[]){3, -5.5, -1, NAN, 0, NAN}, 6);
	expect_vals(&out[1], (double[]){-1, -9.5, 5, NAN, 0, NAN}, 6);
	expect_vals(&out[2], (double[]){2, -15, -6, NAN, 0, NAN}, 6);
	expect_vals(&out[3], (double[]){0.5, -3.75, -2.0 / 3, NAN, NAN, NAN}, 6);
	expect_vals(&out[4], (double[]){1, 56.25, 0.125, NAN, 1, NAN}, 6);
	expect_vals(&out[5], (double[]){2, 2, 2, NAN, 0, NAN}, 6);
	expect_vals(&out[6], (double[]){1, -7.5, -3, NAN, 0, NAN}, 6);
	expect_vals(&out[7], (double[]){1, -1.5, 2, NAN, NAN, NAN}, 6);
	for (int i = 0; i < 8; i++)
		fz_free(out[i].data);
}
END_TEST

/* bf16 ops round at their output: 1 + 2^-8 is a tie that goes to 1. A
 * literal takes the tensor's dtype. */
START_TEST(binary_eager_rounding)
{
	uint16_t a[] = {fz_f64_to_bf16(1.0), fz_f64_to_bf16(1.0 + 0x1p-7),
			fz_f64_to_bf16(3.0)};
	fz_tensor in = tens(FZ_BF16, a, 1, SHAPE(3)), out[2];
	run_ok("trace f(x: bf16[3]) {\n  y = add(x, 0.00390625)\n"
	       "  z = div(x, 3)\n  return y, z\n}\n", &in, 1, out, 2);
	expect_vals(&out[0], (double[]){1.0, 1.0 + 0x1p-6, 3.0}, 3);
	for (int i = 0; i < 3; i++) {
		double x = fz_bf16_to_f64(a[i]);
		ck_assert(at(&out[1], i) == fz_bf16_to_f64(fz_f64_to_bf16(x / 3)));
	}
	fz_free(out[0].data);
	fz_free(out[1].data);
}
END_TEST

START_TEST(binary_int)
{
	int8_t a[] = {100, -7, 7, -128, 5};
	int8_t b[] = {100, 3, -3, -1, 9};
	fz_tensor in[2] = {tens(FZ_I8, a, 1, SHAPE(5)), tens(FZ_I8, b, 1, SHAPE(5))};
	fz_tensor out[6];
	run_ok("trace f(a: i8[5], b: i8[5]) {\n"
	       "  s = add(a, b)\n  m = mul(a, b)\n  r = fmod(a, b)\n"
	       "  hi = maximum(a, b)\n  d = sub(a, b)\n  l = lt(a, b)\n"
	       "  return s, m, r, hi, d, l\n}\n", in, 2, out, 6);
	const int8_t *s = out[0].data, *m = out[1].data, *r = out[2].data;
	const int8_t *hi = out[3].data, *d = out[4].data;
	ck_assert_int_eq(s[0], -56);         /* 200 wraps */
	ck_assert_int_eq(m[0], 16);          /* 10000 mod 256 */
	ck_assert_int_eq(r[1], -1);          /* truncated remainder */
	ck_assert_int_eq(r[2], 1);
	ck_assert_int_eq(r[3], 0);           /* -128 % -1 */
	ck_assert_int_eq(hi[1], 3);
	ck_assert_int_eq(d[3], -127);
	expect_vals(&out[5], (double[]){0, 1, 0, 1, 1}, 5);
	for (int i = 0; i < 6; i++)
		fz_free(out[i].data);

	int64_t big[] = {INT64_MAX, 1};
	fz_tensor bi = tens(FZ_I64, big, 1, SHAPE(2));
	run_ok("trace f(a: i64[2]) {\n  y = add(a, 1)\n  e = eq(a, 9223372036854775807)"
	       "\n  return y, e\n}\n", &bi, 1, out, 2);
	ck_assert(((int64_t *)out[0].data)[0] == INT64_MIN);
	ck_assert(((int64_t *)out[0].data)[1] == 2);
	expect_vals(&out[1], (double[]){1, 0}, 2);
	fz_free(out[0].data);
	fz_free(out[1].data);
}
END_TEST

START_TEST(fmod_int_by_zero)
{
	int32_t a[] = {4, 5}, b[] = {2, 0};
	fz_tensor in[2] = {tens(FZ_I32, a, 1, SHAPE(2)), tens(FZ_I32, b, 1, SHAPE(2))};
	run_fail("trace f(a: i32[2], b: i32[2]) {\n  r = fmod(a, b)\n  return r\n}\n",
		 in, 2, 1, FZ_ERANGE, (const char *const[]){"fmod", "2:", "zero", NULL});
}
END_TEST

START_TEST(compare_and_logic)
{
	double a[] = {1, 2, NAN, 3}, b[] = {1, 1, NAN, 4};
	fz_tensor in[2] = {tens(FZ_F32, NULL, 1, SHAPE(4)),
			   tens(FZ_F32, NULL, 1, SHAPE(4))};
	float fa[4], fb[4];
	for (int i = 0; i < 4; i++) {
		fa[i] = (float)a[i];
		fb[i] = (float)b[i];
	}
	in[0].data = fa;
	in[1].data = fb;
	fz_tensor out[8];
	run_ok("trace f(a: f32[4], b: f32[4]) {\n"
	       "  e = eq(a, b)\n  n = ne(a, b)\n  l = lt(a, b)\n  le_ = le(a, b)\n"
	       "  g = gt(a, b)\n  ge_ = ge(a, b)\n"
	       "  x = logical_and(e, ge_)\n  o = logical_or(l, g)\n"
	       "  return e, n, l, le_, g, ge_, x, o\n}\n", in, 2, out, 8);
	expect_vals(&out[0], (double[]){1, 0, 0, 0}, 4);
	expect_vals(&out[1], (double[]){0, 1, 1, 1}, 4);
	expect_vals(&out[2], (double[]){0, 0, 0, 1}, 4);
	expect_vals(&out[3], (double[]){1, 0, 0, 1}, 4);
	expect_vals(&out[4], (double[]){0, 1, 0, 0}, 4);
	expect_vals(&out[5], (double[]){1, 1, 0, 0}, 4);
	expect_vals(&out[6], (double[]){1, 0, 0, 0}, 4);
	expect_vals(&out[7], (double[]){0, 1, 0, 1}, 4);
	for (int i = 0; i < 8; i++) {
		ck_assert_int_eq(out[i].dtype, FZ_BOOL);
		fz_free(out[i].data);
	}
}
END_TEST

START_TEST(where_op)
{
	uint8_t c[] = {1, 0, 1, 0};
	uint16_t a[4], b[4];
	for (int i = 0; i < 4; i++) {
		a[i] = fz_f64_to_f16(i + 0.5);
		b[i] = fz_f64_to_f16(-i);
	}
	fz_tensor in[3] = {tens(FZ_BOOL, c, 1, SHAPE(4)), tens(FZ_F16, a, 1, SHAPE(4)),
			   tens(FZ_F16, b, 1, SHAPE(4))};
	fz_tensor out;
	run_ok("trace f(c: bool[4], a: f16[4], b: f16[4]) {\n  y = where(c, a, b)\n"
	       "  return y\n}\n", in, 3, &out, 1);
	expect_vals(&out, (double[]){0.5, -1, 2.5, -3}, 4);
	fz_free(out.data);
}
END_TEST

START_TEST(cast_op)
{
	float xs[] = {2.7f, -2.7f, NAN, 1e10f, -1e10f, 0.0f, 70000.0f, 1.0f + 0x1p-11f};
	fz_tensor in = tens(FZ_F32, xs, 1, SHAPE(8)), out[5];
	run_ok("trace f(x: f32[8]) {\n  i = cast(x, dtype=i32)\n"
	       "  u = cast(x, dtype=u8)\n  b = cast(x, dtype=bool)\n"
	       "  h = cast(x, dtype=f16)\n  f = cast(b, dtype=f32)\n"
	       "  return i, u, b, h, f\n}\n", &in, 1, out, 5);
	const int32_t *i = out[0].data;
	ck_assert_int_eq(i[0], 2);
	ck_assert_int_eq(i[1], -2);
	ck_assert_int_eq(i[2], 0);
	ck_assert_int_eq(i[3], INT32_MAX);
	ck_assert_int_eq(i[4], INT32_MIN);
	expect_vals(&out[1], (double[]){2, 0, 0, 255, 0, 0, 255, 1}, 8);
	expect_vals(&out[2], (double[]){1, 1, 1, 1, 1, 0, 1, 1}, 8);
	expect_vals(&out[3], (double[]){2.69921875, -2.69921875, NAN, INFINITY,
					-INFINITY, 0, INFINITY, 1.0}, 8);
	expect_vals(&out[4], (double[]){1, 1, 1, 1, 1, 0, 1, 1}, 8);
	for (int k = 0; k < 5; k++)
		fz_free(out[k].data);

	int32_t ys[] = {300, -129, 7};
	in = tens(FZ_I32, ys, 1, SHAPE(3));
	run_ok("trace f(x: i32[3]) {\n  a = cast(x, dtype=i8)\n"
	       "  b = cast(x, dtype=bf16)\n  return a, b\n}\n", &in, 1, out, 2);
	expect_vals(&out[0], (double[]){44, 127, 7}, 3);
	expect_vals(&out[1], (double[]){300, -129, 7}, 3);
	fz_free(out[0].data);
	fz_free(out[1].data);
}
END_TEST

/* ---- creation ----------------------------------------------------------------------- */

START_TEST(creation_ops)
{
	float xs[3] = {0};
	fz_tensor in = tens(FZ_F32, xs, 2, SHAPE(3, 1)), out[4];
	run_ok("trace f(x: f32[T, 1]) {\n  a = full(shape=[2, 3], value=1.5, dtype=f32)\n"
	       "  b = iota(length=5, dtype=i64)\n  c = full(shape=[], value=T, dtype=f32)\n"
	       "  d = iota(length=3, dtype=bf16)\n  return a, b, c, d\n}\n",
	       &in, 1, out, 4);
	check_out(&out[0], FZ_F32, 2, SHAPE(2, 3));
	expect_vals(&out[0], (double[]){1.5, 1.5, 1.5, 1.5, 1.5, 1.5}, 6);
	check_out(&out[1], FZ_I64, 1, SHAPE(5));
	expect_vals(&out[1], (double[]){0, 1, 2, 3, 4}, 5);
	check_out(&out[2], FZ_F32, 0, NULL);
	expect_vals(&out[2], (double[]){3}, 1);
	expect_vals(&out[3], (double[]){0, 1, 2}, 3);
	for (int i = 0; i < 4; i++)
		fz_free(out[i].data);
}
END_TEST

/* ---- meta ------------------------------------------------------------------------------ */

static double seq[24] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
			 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23};

START_TEST(broadcast_op)
{
	fz_tensor in = tens(FZ_F64, seq, 2, SHAPE(3, 1)), out[2];
	run_ok("trace f(x: f64[3, 1]) {\n"
	       "  a = broadcast_in_dim(x, shape=[2, 3, 4], dims=[1, 2])\n"
	       "  b = mul(x, full(shape=[1, 2], value=10, dtype=f64))\n"
	       "  return a, b\n}\n", &in, 1, out, 2);
	check_out(&out[0], FZ_F64, 3, SHAPE(2, 3, 4));
	for (int i = 0; i < 24; i++)
		ck_assert(at(&out[0], i) == (i / 4) % 3);
	check_out(&out[1], FZ_F64, 2, SHAPE(3, 2));
	expect_vals(&out[1], (double[]){0, 0, 10, 10, 20, 20}, 6);
	fz_free(out[0].data);
	fz_free(out[1].data);
}
END_TEST

START_TEST(reshape_permute)
{
	fz_tensor in = tens(FZ_F64, seq, 3, SHAPE(2, 3, 4)), out[3];
	run_ok("trace f(x: f64[2, 3, 4]) {\n  r = reshape(x, shape=[4, -1])\n"
	       "  p = permute(x, dims=[2, 0, 1])\n  q = permute(x, dims=[1, 0, 2])\n"
	       "  return r, p, q\n}\n", &in, 1, out, 3);
	check_out(&out[0], FZ_F64, 2, SHAPE(4, 6));
	expect_vals(&out[0], seq, 24);
	check_out(&out[1], FZ_F64, 3, SHAPE(4, 2, 3));
	for (int k = 0; k < 4; k++)
		for (int i = 0; i < 2; i++)
			for (int j = 0; j < 3; j++)
				ck_assert(at(&out[1], (k * 2 + i) * 3 + j) ==
					  (i * 3 + j) * 4 + k);
	check_out(&out[2], FZ_F64, 3, SHAPE(3, 2, 4));
	ck_assert(at(&out[2], 4) == 12); /* q[0][1][0] = x[1][0][0] */
	for (int i = 0; i < 3; i++)
		fz_free(out[i].data);
}
END_TEST

START_TEST(slice_squeeze_unsqueeze)
{
	fz_tensor in = tens(FZ_F64, seq, 2, SHAPE(4, 6)), out[4];
	run_ok("trace f(x: f64[4, 6]) {\n"
	       "  s = slice(x, start=[1, 0], end=[4, 6], step=[2, 3])\n"
	       "  t = slice(x, start=[2, 5], end=[3, 6])\n"
	       "  u = squeeze(t, dims=[0, 1])\n  v = unsqueeze(s, dim=1)\n"
	       "  return s, t, u, v\n}\n", &in, 1, out, 4);
	check_out(&out[0], FZ_F64, 2, SHAPE(2, 2));
	expect_vals(&out[0], (double[]){6, 9, 18, 21}, 4);
	check_out(&out[1], FZ_F64, 2, SHAPE(1, 1));
	expect_vals(&out[1], (double[]){17}, 1);
	check_out(&out[2], FZ_F64, 0, NULL);
	expect_vals(&out[2], (double[]){17}, 1);
	check_out(&out[3], FZ_F64, 3, SHAPE(2, 1, 2));
	expect_vals(&out[3], (double[]){6, 9, 18, 21}, 4);
	for (int i = 0; i < 4; i++)
		fz_free(out[i].data);
}
END_TEST

START_TEST(cat_op)
{
	fz_tensor in[3] = {tens(FZ_F64, seq, 2, SHAPE(2, 1)),
			   tens(FZ_F64, seq + 10, 2, SHAPE(2, 2)),
			   tens(FZ_F64, seq + 20, 2, SHAPE(2, 1))};
	fz_tensor out[2];
	run_ok("trace f(a: f64[2, 1], b: f64[2, 2], c: f64[2, 1]) {\n"
	       "  y = cat(a, b, c, dim=1)\n  z = cat(b, b, dim=0)\n"
	       "  return y, z\n}\n", in, 3, out, 2);
	check_out(&out[0], FZ_F64, 2, SHAPE(2, 4));
	expect_vals(&out[0], (double[]){0, 10, 11, 20, 1, 12, 13, 21}, 8);
	check_out(&out[1], FZ_F64, 2, SHAPE(4, 2));
	expect_vals(&out[1], (double[]){10, 11, 12, 13, 10, 11, 12, 13}, 8);
	fz_free(out[0].data);
	fz_free(out[1].data);
}
END_TEST

/* ---- reductions ------------------------------------------------------------------------ */

START_TEST(reductions)
{
	fz_tensor in = tens(FZ_F64, seq, 3, SHAPE(2, 3, 4)), out[4];
	run_ok("trace f(x: f64[2, 3, 4]) {\n  a = sum(x, dims=[1])\n"
	       "  b = sum(x, dims=[0, 2], keepdim=true)\n"
	       "  c = amax(x, dims=[2], keepdim=true)\n  d = amin(x, dims=[0, 1, 2])\n"
	       "  return a, b, c, d\n}\n", &in, 1, out, 4);
	check_out(&out[0], FZ_F64, 2, SHAPE(2, 4));
	expect_vals(&out[0], (double[]){12, 15, 18, 21, 48, 51, 54, 57}, 8);
	check_out(&out[1], FZ_F64, 3, SHAPE(1, 3, 1));
	expect_vals(&out[1], (double[]){60, 92, 124}, 3);
	check_out(&out[2], FZ_F64, 3, SHAPE(2, 3, 1));
	expect_vals(&out[2], (double[]){3, 7, 11, 15, 19, 23}, 6);
	check_out(&out[3], FZ_F64, 0, NULL);
	expect_vals(&out[3], (double[]){0}, 1);
	for (int i = 0; i < 4; i++)
		fz_free(out[i].data);
}
END_TEST

START_TEST(reductions_nan_and_int)
{
	float xs[] = {1, NAN, 3, -2, 5, 4};
	fz_tensor in = tens(FZ_F32, xs, 2, SHAPE(2, 3)), out[3];
	run_ok("trace f(x: f32[2, 3]) {\n  a = amax(x, dims=[1])\n"
	       "  b = amin(x, dims=[1])\n  c = sum(x, dims=[0])\n"
	       "  return a, b, c\n}\n", &in, 1, out, 3);
	expect_vals(&out[0], (double[]){NAN, 5}, 2);
	expect_vals(&out[1], (double[]){NAN, -2}, 2);
	expect_vals(&out[2], (double[]){-1, NAN, 7}, 3);
	for (int i = 0; i < 3; i++)
		fz_free(out[i].data);

	int8_t ys[] = {100, 100, -128, 1};
	in = tens(FZ_I8, ys, 1, SHAPE(4));
	run_ok("trace f(x: i8[4]) {\n  s = sum(x, dims=[0])\n  m = amax(x, dims=[0])\n"
	       "  return s, m\n}\n", &in, 1, out, 2);
	ck_assert_int_eq(((int8_t *)out[0].data)[0], 73); /* 73 = 200-128+1 */
	ck_assert_int_eq(((int8_t *)out[1].data)[0], 100);
	fz_free(out[0].data);
	fz_free(out[1].data);
}
END_TEST

/* cumsum: inclusive, along any dim; integers wrap to their dtype; f32
 * accumulates wide (1 + 2^-25 + ... stays visible once it adds up). */
START_TEST(cumsum_op)
{
	float xs[] = {1, 2, 3, 4, 5, 6};
	fz_tensor in = tens(FZ_F32, xs, 2, SHAPE(2, 3)), out[2];
	run_ok("trace f(x: f32[2, 3]) {\n  a = cumsum(x, dim=1)\n"
	       "  b = cumsum(x, dim=-2)\n  return a, b\n}\n", &in, 1, out, 2);
	check_out(&out[0], FZ_F32, 2, SHAPE(2, 3));
	expect_vals(&out[0], (double[]){1, 3, 6, 4, 9, 15}, 6);
	expect_vals(&out[1], (double[]){1, 2, 3, 5, 7, 9}, 6);
	fz_free(out[0].data);
	fz_free(out[1].data);

	int8_t ys[] = {100, 100, -128, 1};
	in = tens(FZ_I8, ys, 1, SHAPE(4));
	run_ok("trace f(x: i8[4]) {\n  s = cumsum(x, dim=0)\n  return s\n}\n",
	       &in, 1, out, 1);
	expect_vals(&out[0], (double[]){100, -56, 72, 73}, 4);
	fz_free(out[0].data);

	float zs[] = {1, 0x1p-25f, 0x1p-25f, 0x1p-25f, 0x1p-25f};
	in = tens(FZ_F32, zs, 1, SHAPE(5));
	run_ok("trace f(x: f32[5]) {\n  s = cumsum(x, dim=0)\n  return s\n}\n",
	       &in, 1, out, 1);
	/* an f32 accumulator would stay at 1 */
	expect_vals(&out[0], (double[]){1, 1, 1, 1 + 0x1p-23, 1 + 0x1p-23}, 5);
	fz_free(out[0].data);
}
END_TEST

/* Selection order: NaN first, then larger values (argmin: smaller), then
 * the lower index. */
START_TEST(select_ops)
{
	float xs[] = {1, 3, NAN, 3, 0, -1, 2, 2, -1, 2};
	fz_tensor in = tens(FZ_F32, xs, 2, SHAPE(2, 5)), out[5];
	run_ok("trace f(x: f32[2, 5]) {\n  v, i = topk(x, k=3, dim=1)\n"
	       "  a = argmax(x, dim=1)\n  b = argmin(x, dim=-1, keepdim=true)\n"
	       "  c = argmax(x, dim=0)\n  return v, i, a, b, c\n}\n", &in, 1, out, 5);
	check_out(&out[0], FZ_F32, 2, SHAPE(2, 3));
	check_out(&out[1], FZ_I64, 2, SHAPE(2, 3));
	check_out(&out[3], FZ_I64, 2, SHAPE(2, 1));
	expect_vals(&out[0], (double[]){NAN, 3, 3, 2, 2, 2}, 6);
	expect_vals(&out[1], (double[]){2, 1, 3, 1, 2, 4}, 6);
	expect_vals(&out[2], (double[]){2, 1}, 2);
	expect_vals(&out[3], (double[]){2, 0}, 2);
	expect_vals(&out[4], (double[]){0, 0, 0, 0, 1}, 5);
	for (int i = 0; i < 5; i++)
		fz_free(out[i].data);

	int64_t ys[] = {INT64_MAX, INT64_MAX - 1, INT64_MIN, INT64_MAX};
	in = tens(FZ_I64, ys, 1, SHAPE(4));
	run_ok("trace f(x: i64[4]) {\n  v, i = topk(x, k=4, dim=0)\n"
	       "  a = argmin(x, dim=0)\n  return v, i, a\n}\n", &in, 1, out, 3);
	ck_assert(((int64_t *)out[0].data)[1] == INT64_MAX);
	ck_assert(((int64_t *)out[0].data)[2] == INT64_MAX - 1);
	expect_vals(&out[1], (double[]){0, 3, 1, 2}, 4);
	expect_vals(&out[2], (double[]){2}, 1);
	for (int i = 0; i < 3; i++)
		fz_free(out[i].data);
}
END_TEST

/* bf16 sums accumulate in f64: 1 + 4 * 2^-9 is exactly 1 + 2^-7, while a
 * bf16 accumulator would stay at 1. */
START_TEST(reduction_accumulates_wide)
{
	uint16_t xs[5] = {fz_f64_to_bf16(1.0)};
	for (int i = 1; i < 5; i++)
		xs[i] = fz_f64_to_bf16(0x1p-9);
	fz_tensor in = tens(FZ_BF16, xs, 1, SHAPE(5)), out;
	run_ok("trace f(x: bf16[5]) {\n  s = sum(x, dims=[0])\n  return s\n}\n",
	       &in, 1, &out, 1);
	expect_vals(&out, (double[]){1.0 + 0x1p-7}, 1);
	fz_free(out.data);
}
END_TEST

START_TEST(var_mean_op)
{
	double xs[] = {1, 2, 3, 4, 10, 10, 10, 10};
	fz_tensor in = tens(FZ_F64, xs, 2, SHAPE(2, 4)), out[6];
	run_ok("trace f(x: f64[2, 4]) {\n"
	       "  v0, m0 = var_mean(x, dims=[1])\n"
	       "  v1, m1 = var_mean(x, dims=[1], correction=1, keepdim=true)\n"
	       "  v9, m9 = var_mean(x, dims=[1], correction=9)\n"
	       "  return v0, m0, v1, m1, v9, m9\n}\n", &in, 1, out, 6);
	check_out(&out[0], FZ_F64, 1, SHAPE(2));
	expect_vals(&out[0], (double[]){1.25, 0}, 2);
	expect_vals(&out[1], (double[]){2.5, 10}, 2);
	check_out(&out[2], FZ_F64, 2, SHAPE(2, 1));
	expect_close(&out[2], (double[]){5.0 / 3, 0}, 2, 1e-15);
	check_out(&out[3], FZ_F64, 2, SHAPE(2, 1));
	expect_vals(&out[3], (double[]){2.5, 10}, 2);
	/* divisor N - correction <= 0: inf, or nan where the sum is 0 */
	expect_vals(&out[4], (double[]){INFINITY, NAN}, 2);
	for (int i = 0; i < 6; i++)
		fz_free(out[i].data);
}
END_TEST

/* Empty extents: sums are 0, a mean is nan, amax has no identity, and a
 * matmul over K = 0 is all zeros. */
START_TEST(empty_extents)
{
	float buf[1] = {0};
	fz_tensor in[2] = {tens(FZ_F32, buf, 2, SHAPE(0, 3)),
			   tens(FZ_F32, buf, 2, SHAPE(3, 0))};
	fz_tensor out[4];
	run_ok("trace f(x: f32[B, 3], w: f32[3, B]) {\n  s = sum(x, dims=[0])\n"
	       "  v, m = var_mean(x, dims=[0])\n  p = matmul(w, x)\n"
	       "  c = cat(x, x, dim=0)\n  return s, m, p, c\n}\n", in, 2, out, 4);
	expect_vals(&out[0], (double[]){0, 0, 0}, 3);
	expect_vals(&out[1], (double[]){NAN, NAN, NAN}, 3);
	check_out(&out[2], FZ_F32, 2, SHAPE(3, 3));
	expect_vals(&out[2], (double[]){0, 0, 0, 0, 0, 0, 0, 0, 0}, 9);
	check_out(&out[3], FZ_F32, 2, SHAPE(0, 3));
	for (int i = 0; i < 4; i++)
		fz_free(out[i].data);
	run_fail("trace f(x: f32[B, 3]) {\n  a = amax(x, dims=[0])\n  return a\n}\n",
		 in, 1, 1, FZ_ERANGE, (const char *const[]){"amax", "empty", NULL});
}
END_TEST

/* ---- library --------------------------------------------------------------------------- */

static void naive_mm(const double *a, const double *b, double *c, int m, int k, int n)
{
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++) {
			double s = 0;
			for (int q = 0; q < k; q++)
				s += a[i * k + q] * b[q * n + j];
			c[i * n + j] = s;
		}
}

START_TEST(matmul_shapes)
{
	fz_tensor out[4];
	fz_tensor in[2] = {tens(FZ_F64, seq, 1, SHAPE(3)), tens(FZ_F64, seq + 1, 1, SHAPE(3))};
	run_ok("trace f(a: f64[3], b: f64[3]) {\n  y = matmul(a, b)\n  return y\n}\n",
	       in, 2, out, 1);
	check_out(&out[0], FZ_F64, 0, NULL);
	expect_vals(&out[0], (double[]){0 * 1 + 1 * 2 + 2 * 3}, 1);
	fz_free(out[0].data);

	/* [2,3] x [3,2], [3] x [3,2], [2,3] x [3] */
	in[0] = tens(FZ_F64, seq, 2, SHAPE(2, 3));
	in[1] = tens(FZ_F64, seq + 6, 2, SHAPE(3, 2));
	fz_tensor v = tens(FZ_F64, seq + 1, 1, SHAPE(3));
	fz_tensor in3[3] = {in[0], in[1], v};
	run_ok("trace f(a: f64[2, 3], b: f64[3, 2], v: f64[3]) {\n"
	       "  p = matmul(a, b)\n  q = matmul(v, b)\n  r = matmul(a, v)\n"
	       "  return p, q, r\n}\n", in3, 3, out, 3);
	double want[4];
	naive_mm(seq, seq + 6, want, 2, 3, 2);
	check_out(&out[0], FZ_F64, 2, SHAPE(2, 2));
	expect_vals(&out[0], want, 4);
	naive_mm(seq + 1, seq + 6, want, 1, 3, 2);
	check_out(&out[1], FZ_F64, 1, SHAPE(2));
	expect_vals(&out[1], want, 2);
	naive_mm(seq, seq + 1, want, 2, 3, 1);
	check_out(&out[2], FZ_F64, 1, SHAPE(2));
	expect_vals(&out[2], want, 2);
	for (int i = 0; i < 3; i++)
		fz_free(out[i].data);
}
END_TEST

/* [2, 1, 2, 3] x [3, 3, 2]: batch dims broadcast to [2, 3]. */
START_TEST(matmul_batched_broadcast)
{
	double a[12], b[18];
	for (int i = 0; i < 12; i++)
		a[i] = i * 0.5 - 2;
	for (int i = 0; i < 18; i++)
		b[i] = (i % 5) - 1.25;
	fz_tensor in[2] = {tens(FZ_F32, NULL, 4, SHAPE(2, 1, 2, 3)),
			   tens(FZ_F32, NULL, 3, SHAPE(3, 3, 2))};
	float fa[12], fb[18];
	for (int i = 0; i < 12; i++)
		fa[i] = (float)a[i];
	for (int i = 0; i < 18; i++)
		fb[i] = (float)b[i];
	in[0].data = fa;
	in[1].data = fb;
	fz_tensor out;
	run_ok("trace f(a: f32[2, 1, 2, 3], b: f32[3, 3, 2]) {\n  y = matmul(a, b)\n"
	       "  return y\n}\n", in, 2, &out, 1);
	check_out(&out, FZ_F32, 4, SHAPE(2, 3, 2, 2));
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 3; j++) {
			double want[4];
			naive_mm(a + i * 6, b + j * 6, want, 2, 3, 2);
			for (int k = 0; k < 4; k++)
				ck_assert(at(&out, (i * 3 + j) * 4 + k) == (float)want[k]);
		}
	fz_free(out.data);

	/* a 1-D operand against a batched one: [3] x [3, 3, 2] is [3, 2], and
	 * [2, 1, 2, 3] x [3] is [2, 1, 2] */
	fz_tensor in2[3] = {tens(FZ_F32, fb, 1, SHAPE(3)), in[1], in[0]};
	fz_tensor o2[2];
	run_ok("trace f(v: f32[3], b: f32[3, 3, 2], a: f32[2, 1, 2, 3]) {\n"
	       "  y = matmul(v, b)\n  z = matmul(a, v)\n  return y, z\n}\n",
	       in2, 3, o2, 2);
	check_out(&o2[0], FZ_F32, 2, SHAPE(3, 2));
	check_out(&o2[1], FZ_F32, 3, SHAPE(2, 1, 2));
	for (int j = 0; j < 3; j++) {
		double want[2];
		naive_mm(b, b + j * 6, want, 1, 3, 2);
		ck_assert(at(&o2[0], j * 2) == (float)want[0]);
		ck_assert(at(&o2[0], j * 2 + 1) == (float)want[1]);
	}
	for (int r = 0; r < 4; r++) {
		double want[1];
		naive_mm(a + r * 3, b, want, 1, 3, 1);
		ck_assert(at(&o2[1], r) == (float)want[0]);
	}
	fz_free(o2[0].data);
	fz_free(o2[1].data);
}
END_TEST

/* A matmul larger than one block, in bf16: f64 accumulation, one rounding. */
START_TEST(matmul_blocked_bf16)
{
	enum { M = 5, K = 150, N = 7 };
	uint16_t a[M * K], b[K * N];
	double da[M * K], db[K * N], want[M * N];
	for (int i = 0; i < M * K; i++) {
		a[i] = fz_f64_to_bf16(sin(i));
		da[i] = fz_bf16_to_f64(a[i]);
	}
	for (int i = 0; i < K * N; i++) {
		b[i] = fz_f64_to_bf16(cos(i * 0.7));
		db[i] = fz_bf16_to_f64(b[i]);
	}
	naive_mm(da, db, want, M, K, N);
	fz_tensor in[2] = {tens(FZ_BF16, a, 2, SHAPE(M, K)), tens(FZ_BF16, b, 2, SHAPE(K, N))};
	fz_tensor out;
	run_ok("trace f(a: bf16[5, 150], b: bf16[150, 7]) {\n  y = matmul(a, b)\n"
	       "  return y\n}\n", in, 2, &out, 1);
	for (int i = 0; i < M * N; i++) {
		/* summation order may differ from naive_mm by an f64 ulp, so the
		 * bf16 result may differ only where want sits on a tie */
		double g = at(&out, i), w = fz_bf16_to_f64(fz_f64_to_bf16(want[i]));
		ck_assert_msg(fabs(g - w) <= fabs(w) * 0x1p-7, "%d: %g vs %g", i, g, w);
	}
	fz_free(out.data);
}
END_TEST

START_TEST(linear_op)
{
	double x[] = {1, 2, 3, 4, 5, 6};       /* [2, 3] */
	double w[] = {1, 0, -1, 2, 2, 2};      /* [2, 3] */
	double b[] = {0.5, -1};
	fz_tensor in[3] = {tens(FZ_F64, x, 2, SHAPE(2, 3)), tens(FZ_F64, w, 2, SHAPE(2, 3)),
			   tens(FZ_F64, b, 1, SHAPE(2))};
	fz_tensor out[2];
	run_ok("trace f(x: f64[2, 3], w: f64[2, 3], b: f64[2]) {\n"
	       "  y = linear(x, w, b)\n  z = linear(x, w)\n  return y, z\n}\n",
	       in, 3, out, 2);
	check_out(&out[0], FZ_F64, 2, SHAPE(2, 2));
	expect_vals(&out[0], (double[]){-1.5, 11, -1.5, 29}, 4);
	expect_vals(&out[1], (double[]){-2, 12, -2, 30}, 4);
	fz_free(out[0].data);
	fz_free(out[1].data);

	int32_t xi[] = {1, 2, 3}, wi[] = {4, 5, 6, -1, -1, -1};
	fz_tensor ii[2] = {tens(FZ_I32, xi, 2, SHAPE(1, 3)), tens(FZ_I32, wi, 2, SHAPE(2, 3))};
	run_ok("trace f(x: i32[1, 3], w: i32[2, 3]) {\n  y = linear(x, w)\n"
	       "  z = matmul(x, permute(w, dims=[1, 0]))\n  return y, z\n}\n",
	       ii, 2, out, 2);
	expect_vals(&out[0], (double[]){32, -6}, 2);
	expect_vals(&out[1], (double[]){32, -6}, 2);
	fz_free(out[0].data);
	fz_free(out[1].data);
}
END_TEST

/* ---- indexing -------------------------------------------------------------------------- */

/* ---- attention ---------------------------------------------------------------- */

/* attention, attention_dq and attention_dkv of the interpreter against the
 * definition written as plain loops over every key, each sum in the same
 * order, on f64: the same values bit for bit. The interpreter skips the
 * keys a causal mask or window hides, forms dot products eight keys at a
 * time and splits the work over threads; none of that may change a value,
 * at any thread count. GQA 2:1, Tq != Tk, a bool mask that hides a whole
 * row now and then. */
enum { AB = 1, AHQ = 4, AHK = 2, ATQ = 150, ATK = 180, AD = 24, ADV = 16 };

static void attn_reference(const double *q, const double *k, const double *v,
			   const double *dO, const bool *m, bool causal, int64_t window,
			   double *o, double *lse, double *dq, double *dk, double *dv)
{
	const double scale = 0.2;
	static double s[ATK];
	memset(dq, 0, sizeof(double) * AHQ * ATQ * AD);
	memset(dk, 0, sizeof(double) * AHK * ATK * AD);
	memset(dv, 0, sizeof(double) * AHK * ATK * ADV);
	for (int h = 0; h < AHQ; h++)
		for (int i = 0; i < ATQ; i++) {
			int row = h * ATQ + i, hk = h / (AHQ / AHK);
			const double *qi = q + row * AD, *kb = k + hk * ATK * AD;
			const double *vb = v + hk * ATK * ADV, *doi = dO + row * ADV;
			double mx = -INFINITY, sum = 0;
			for (int j = 0; j < ATK; j++) {
				double x = 0;
				for (int e = 0; e < AD; e++)
					x += qi[e] * kb[j * AD + e];
				bool hid = (causal && j > i) || !m[i * ATK + j] ||
					   (window && (i - j >= window ||
						       (!causal && j - i >= window)));
				s[j] = hid ? -INFINITY : scale * x;
				mx = s[j] > mx ? s[j] : mx;
			}
			for (int j = 0; j < ATK && mx > -INFINITY; j++)
				sum += exp(s[j] - mx);
			lse[row] = mx > -INFINITY ? mx + log(sum) : -INFINITY;
			double di = 0;
			for (int e = 0; e < ADV; e++) {
				double acc = 0;
				for (int j = 0; j < ATK; j++)
					if (s[j] > -INFINITY)
						acc += exp(s[j] - lse[row]) * vb[j * ADV + e];
				o[row * ADV + e] = acc;
				di += doi[e] * acc;
			}
			for (int j = 0; j < ATK; j++) {
				if (s[j] == -INFINITY)
					continue;
				double p = exp(s[j] - lse[row]), dp = 0;
				for (int e = 0; e < ADV; e++)
					dp += doi[e] * vb[j * ADV + e];
				double ds = p * (dp - di) * scale;
				for (int e = 0; e < AD; e++) {
					dq[row * AD + e] += ds * kb[j * AD + e];
					dk[(hk * ATK + j) * AD + e] += ds * qi[e];
				}
				for (int e = 0; e < ADV; e++)
					dv[(hk * ATK + j) * ADV + e] += p * doi[e];
			}
		}
}

START_TEST(attention_matches_plain_loops)
{
	static double q[AHQ * ATQ * AD], k[AHK * ATK * AD], v[AHK * ATK * ADV];
	static double dO[AHQ * ATQ * ADV];
	static double o[AHQ * ATQ * ADV], lse[AHQ * ATQ], dq[AHQ * ATQ * AD];
	static double dk[AHK * ATK * AD], dv[AHK * ATK * ADV];
	static bool m[ATQ * ATK];
	uint64_t x = 88172645463325252ull;
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, (double)(x >> 11) / 9007199254740992.0)
	for (size_t i = 0; i < sizeof q / sizeof *q; i++)
		q[i] = 4 * RND() - 2;
	for (size_t i = 0; i < sizeof k / sizeof *k; i++)
		k[i] = 4 * RND() - 2;
	for (size_t i = 0; i < sizeof v / sizeof *v; i++)
		v[i] = 2 * RND() - 1;
	for (size_t i = 0; i < sizeof dO / sizeof *dO; i++)
		dO[i] = 2 * RND() - 1;
	for (int i = 0; i < ATQ * ATK; i++) /* row 7 hides every key */
		m[i] = i / ATK != 7 && RND() < 0.8;
#undef RND
	const char *attrs[] = {", causal=true, window=37", ", window=37", ", causal=true", ""};
	const char *threads[] = {"1", "3"};
	for (int a = 0; a < 4; a++) {
		bool causal = strstr(attrs[a], "causal");
		attn_reference(q, k, v, dO, m, causal, strstr(attrs[a], "window") ? 37 : 0,
			       o, lse, dq, dk, dv);
		char src[1024];
		snprintf(src, sizeof src,
			 "trace a(q: f64[1, 4, 150, 24], k: f64[1, 2, 180, 24], "
			 "v: f64[1, 2, 180, 16], do: f64[1, 4, 150, 16], m: bool[1, 1, 150, 180]) {\n"
			 "  o, lse = attention(q, k, v, m, scale=0.2%s)\n"
			 "  dq = attention_dq(q, k, v, o, lse, do, m, scale=0.2%s)\n"
			 "  dk, dv = attention_dkv(q, k, v, o, lse, do, m, scale=0.2%s)\n"
			 "  return o, lse, dq, dk, dv\n}\n", attrs[a], attrs[a], attrs[a]);
		fz_tensor in[5] = {
			tens(FZ_F64, q, 4, SHAPE(AB, AHQ, ATQ, AD)),
			tens(FZ_F64, k, 4, SHAPE(AB, AHK, ATK, AD)),
			tens(FZ_F64, v, 4, SHAPE(AB, AHK, ATK, ADV)),
			tens(FZ_F64, dO, 4, SHAPE(AB, AHQ, ATQ, ADV)),
			tens(FZ_BOOL, m, 4, SHAPE(1, 1, ATQ, ATK)),
		};
		const double *want[5] = {o, lse, dq, dk, dv};
		size_t bytes[5] = {sizeof o, sizeof lse, sizeof dq, sizeof dk, sizeof dv};
		for (int th = 0; th < 2; th++) {
			setenv("FUSEC_THREADS", threads[th], 1);
			fz_tensor out[5];
			run_ok(src, in, 5, out, 5);
			for (int r = 0; r < 5; r++) {
				ck_assert_msg(memcmp(out[r].data, want[r], bytes[r]) == 0,
					      "attrs '%s', %s threads: output %d differs "
					      "from the plain loops", attrs[a], threads[th], r);
				fz_free(out[r].data);
			}
		}
		unsetenv("FUSEC_THREADS");
	}
}
END_TEST

START_TEST(take_op)
{
	int64_t idx[] = {2, 0, 2, 1};
	fz_tensor in[2] = {tens(FZ_F64, seq, 2, SHAPE(3, 4)),
			   tens(FZ_I64, idx, 2, SHAPE(2, 2))};
	fz_tensor out[2];
	run_ok("trace f(x: f64[3, 4], i: i64[2, 2]) {\n  a = take(x, i, dim=0)\n"
	       "  b = take(x, i, dim=1)\n  return a, b\n}\n", in, 2, out, 2);
	check_out(&out[0], FZ_F64, 3, SHAPE(2, 2, 4));
	expect_vals(&out[0], (double[]){8, 9, 10, 11, 0, 1, 2, 3,
					8, 9, 10, 11, 4, 5, 6, 7}, 16);
	check_out(&out[1], FZ_F64, 3, SHAPE(3, 2, 2));
	expect_vals(&out[1], (double[]){2, 0, 2, 1, 6, 4, 6, 5, 10, 8, 10, 9}, 12);
	fz_free(out[0].data);
	fz_free(out[1].data);
}
END_TEST

START_TEST(take_along_op)
{
	int32_t idx[] = {3, 0, 1, 1};
	fz_tensor in[2] = {tens(FZ_F64, seq, 2, SHAPE(3, 4)),
			   tens(FZ_I32, idx, 2, SHAPE(2, 2))};
	fz_tensor out[1];
	run_ok("trace f(x: f64[3, 4], i: i32[2, 2]) {\n  a = take_along(x, i, dim=1)\n"
	       "  return a\n}\n", in, 2, out, 1);
	check_out(&out[0], FZ_F64, 2, SHAPE(2, 2));
	expect_vals(&out[0], (double[]){3, 0, 5, 5}, 4);
	fz_free(out[0].data);

	int64_t j[] = {2, 0, 1};
	in[1] = tens(FZ_I64, j, 2, SHAPE(1, 3));
	run_ok("trace f(x: f64[3, 4], i: i64[1, 3]) {\n  a = take_along(x, i, dim=0)\n"
	       "  return a\n}\n", in, 2, out, 1);
	expect_vals(&out[0], (double[]){8, 1, 6}, 3);
	fz_free(out[0].data);
}
END_TEST

START_TEST(index_add_op)
{
	double x[6] = {1, 1, 1, 1, 1, 1};
	int64_t idx[] = {0, 2, 0};
	double src[6] = {10, 20, 30, 40, 50, 60};
	fz_tensor in[3] = {tens(FZ_F64, x, 2, SHAPE(2, 3)), tens(FZ_I64, idx, 1, SHAPE(3)),
			   tens(FZ_F64, src, 2, SHAPE(2, 3))};
	fz_tensor out;
	run_ok("trace f(x: f64[2, 3], i: i64[3], s: f64[2, 3]) {\n"
	       "  y = index_add(x, i, s, dim=1)\n  return y\n}\n", in, 3, &out, 1);
	expect_vals(&out, (double[]){41, 1, 21, 101, 1, 51}, 6);
	fz_free(out.data);

	/* bf16 accumulating in f64: 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly, where
	 * adding one at a time in bf16 would tie back to 1 twice */
	uint16_t bx[2] = {fz_f64_to_bf16(1.0), fz_f64_to_bf16(0.0)};
	uint16_t bs[2] = {fz_f64_to_bf16(0x1p-8), fz_f64_to_bf16(0x1p-8)};
	int32_t bi[2] = {0, 0};
	fz_tensor bin[3] = {tens(FZ_BF16, bx, 1, SHAPE(2)), tens(FZ_I32, bi, 1, SHAPE(2)),
			    tens(FZ_BF16, bs, 1, SHAPE(2))};
	run_ok("trace f(x: bf16[2], i: i32[2], s: bf16[2]) {\n"
	       "  y = index_add(x, i, s, dim=0)\n  return y\n}\n", bin, 3, &out, 1);
	expect_vals(&out, (double[]){1.0 + 0x1p-7, 0}, 2);
	fz_free(out.data);
}
END_TEST

START_TEST(index_errors)
{
	int64_t bad[] = {0, 3};
	fz_tensor in[3] = {tens(FZ_F64, seq, 2, SHAPE(3, 4)), tens(FZ_I64, bad, 1, SHAPE(2))};
	run_fail("trace f(x: f64[3, 4], i: i64[2]) {\n  a = take(x, i, dim=0)\n"
		 "  return a\n}\n", in, 2, 1, FZ_ERANGE,
		 (const char *const[]){"take", "2:", "index 3", "extent 3", NULL});

	int64_t neg[] = {-1};
	in[1] = tens(FZ_I64, neg, 1, SHAPE(1));
	run_fail("trace f(x: f64[3, 4], i: i64[1]) {\n  a = take(x, i, dim=1)\n"
		 "  return a\n}\n", in, 2, 1, FZ_ERANGE,
		 (const char *const[]){"take", "index -1", "extent 4", NULL});

	int32_t ta[] = {0, 4, 1};
	in[1] = tens(FZ_I32, ta, 2, SHAPE(3, 1));
	run_fail("trace f(x: f64[3, 4], i: i32[3, 1]) {\n"
		 "  a = take_along(x, i, dim=1)\n  return a\n}\n", in, 2, 1, FZ_ERANGE,
		 (const char *const[]){"take_along", "index 4", "extent 4", NULL});

	int64_t ia[] = {5};
	double src[3] = {1, 2, 3};
	in[0] = tens(FZ_F64, seq, 2, SHAPE(4, 3));
	in[1] = tens(FZ_I64, ia, 1, SHAPE(1));
	in[2] = tens(FZ_F64, src, 2, SHAPE(1, 3));
	run_fail("trace f(x: f64[4, 3], i: i64[1], s: f64[1, 3]) {\n"
		 "  a = index_add(x, i, s, dim=0)\n  return a\n}\n", in, 3, 1, FZ_ERANGE,
		 (const char *const[]){"index_add", "index 5", "extent 4", NULL});
}
END_TEST

/* ---- binding ----------------------------------------------------------------------------- */

START_TEST(bind_symbols)
{
	fz_module *m = parse("trace f(x: f32[B, T], y: f32[T]) {\n"
			     "  z = add(x, y)\n  return z\n}\n");
	fz_trace *t = fz_module_trace(m, 0);
	ck_assert_int_eq(fz_trace_symbol_count(t), 2);
	float buf[12] = {0};
	fz_tensor in[2] = {tens(FZ_F32, buf, 2, SHAPE(4, 3)), tens(FZ_F32, buf, 1, SHAPE(3))};
	int64_t syms[2] = {-1, -1};
	char *err = NULL;
	ck_assert_int_eq(fz_trace_bind(t, in, 2, syms, &err), FZ_OK);
	ck_assert_ptr_null(err);
	int b = strcmp(fz_trace_symbol(t, 0), "B") == 0 ? 0 : 1;
	ck_assert_int_eq(syms[b], 4);
	ck_assert_int_eq(syms[1 - b], 3);

	/* a conflict names the symbol and both inputs; sizes stay untouched */
	in[1] = tens(FZ_F32, buf, 1, SHAPE(5));
	int64_t s2[2] = {-1, -1};
	ck_assert_int_eq(fz_trace_bind(t, in, 2, s2, &err), FZ_EBIND);
	ck_assert_ptr_nonnull(strstr(err, "'T'"));
	ck_assert_ptr_nonnull(strstr(err, "'y'"));
	ck_assert_ptr_nonnull(strstr(err, "'x'"));
	ck_assert(s2[0] == -1 && s2[1] == -1);
	fz_free(err);

	/* a given size that the inputs contradict */
	in[1] = tens(FZ_F32, buf, 1, SHAPE(3));
	int64_t s3[2];
	s3[b] = 5;
	s3[1 - b] = -1;
	ck_assert_int_eq(fz_trace_bind(t, in, 2, s3, &err), FZ_EBIND);
	ck_assert_ptr_nonnull(strstr(err, "'B'"));
	fz_free(err);

	/* wrong rank, dtype, count */
	in[1] = tens(FZ_F32, buf, 2, SHAPE(3, 1));
	ck_assert_int_eq(fz_trace_bind(t, in, 2, syms, &err), FZ_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "rank"));
	fz_free(err);
	in[1] = tens(FZ_F16, buf, 1, SHAPE(3));
	ck_assert_int_eq(fz_trace_bind(t, in, 2, syms, &err), FZ_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "f16"));
	fz_free(err);
	ck_assert_int_eq(fz_trace_bind(t, in, 1, syms, &err), FZ_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "2 inputs"));
	fz_free(err);
	fz_module_free(m);
}
END_TEST

START_TEST(bind_unbound_and_concrete)
{
	float buf[8] = {0};
	fz_tensor in = tens(FZ_F32, buf, 1, SHAPE(4));
	run_fail("trace f(x: f32[4]) {\n  y = full(shape=[T, 2], value=1, dtype=f32)\n"
		 "  return y\n}\n", &in, 1, 1, FZ_EBIND,
		 (const char *const[]){"symbol 'T' is unbound", "--bind T=128", "full",
				       NULL});
	in = tens(FZ_F32, buf, 1, SHAPE(5));
	run_fail("trace f(x: f32[4]) {\n  y = neg(x)\n  return y\n}\n", &in, 1, 1,
		 FZ_EINVAL, (const char *const[]){"'x'", "extent 5", "expected 4", NULL});
}
END_TEST

/* Sizes given for symbols that occur only in attributes make the trace
 * runnable; element counts that overflow at the bound sizes are refused. */
START_TEST(bind_given_and_overflow)
{
	fz_module *m = parse("trace f() {\n  y = iota(length=3, dtype=f32)\n"
			     "  z = full(shape=[N, M], value=N, dtype=i64)\n"
			     "  return z\n}\n");
	fz_trace *t = fz_module_trace(m, 0);
	int n = strcmp(fz_trace_symbol(t, 0), "N") == 0 ? 0 : 1;
	int64_t syms[2];
	syms[n] = 2;
	syms[1 - n] = 3;
	fz_tensor out;
	char *err = NULL;
	ck_assert_int_eq(fz_trace_interpret(t, syms, NULL, 0, &out, 1, &err), FZ_OK);
	check_out(&out, FZ_I64, 2, SHAPE(2, 3));
	expect_vals(&out, (double[]){2, 2, 2, 2, 2, 2}, 6);
	fz_free(out.data);

	syms[n] = INT64_C(1) << 32;
	syms[1 - n] = INT64_C(1) << 31;
	ck_assert_int_eq(fz_trace_interpret(t, syms, NULL, 0, &out, 1, &err), FZ_EBIND);
	ck_assert_ptr_nonnull(strstr(err, "too many elements"));
	fz_free(err);
	syms[n] = -7;
	ck_assert_int_eq(fz_trace_bind(t, NULL, 0, syms, &err), FZ_EBIND);
	fz_free(err);
	ck_assert_int_eq(fz_trace_interpret(t, syms, NULL, 0, &out, 2, &err), FZ_EINVAL);
	fz_free(err);
	fz_module_free(m);
}
END_TEST

/* A mean over a symbolic extent divides by full(value=B). */
START_TEST(symbolic_mean)
{
	double xs[] = {1, 2, 3, 4, 5, 6};
	fz_tensor in = tens(FZ_F64, xs, 2, SHAPE(3, 2)), out;
	run_ok("trace f(x: f64[B, 2]) {\n  m = mean(x, dims=[0])\n  return m\n}\n",
	       &in, 1, &out, 1);
	expect_vals(&out, (double[]){3, 4}, 2);
	fz_free(out.data);
}
END_TEST

/* ---- inputs, outputs, memory -------------------------------------------------------------- */

/* A transposed view and a broadcast (stride 0) view are copied in. */
START_TEST(strided_inputs)
{
	fz_tensor in = tens(FZ_F64, seq, 2, SHAPE(3, 2)), out;
	in.strides[0] = 1; /* seq viewed as the transpose of a [2, 3] matrix */
	in.strides[1] = 3;
	run_ok("trace f(x: f64[3, 2]) {\n  y = neg(x)\n  return y\n}\n", &in, 1, &out, 1);
	expect_vals(&out, (double[]){-0.0, -3, -1, -4, -2, -5}, 6);
	fz_free(out.data);

	in.strides[0] = 0;
	in.strides[1] = 1;
	run_ok("trace f(x: f64[3, 2]) {\n  y = neg(x)\n  return y\n}\n", &in, 1, &out, 1);
	expect_vals(&out, (double[]){-0.0, -1, -0.0, -1, -0.0, -1}, 6);
	fz_free(out.data);

	in.strides[0] = -2; /* rows reversed */
	in.data = seq + 4;
	run_ok("trace f(x: f64[3, 2]) {\n  y = neg(x)\n  return y\n}\n", &in, 1, &out, 1);
	expect_vals(&out, (double[]){-4, -5, -2, -3, -0.0, -1}, 6);
	fz_free(out.data);
}
END_TEST

/* Returning a value twice, or a parameter, gives independent buffers. */
START_TEST(outputs_independent)
{
	double xs[] = {1, 2};
	fz_tensor in = tens(FZ_F64, xs, 1, SHAPE(2)), out[3];
	run_ok("trace f(x: f64[2]) {\n  y = neg(x)\n  return y, y, x\n}\n", &in, 1, out, 3);
	ck_assert_ptr_ne(out[0].data, out[1].data);
	ck_assert_ptr_ne(out[2].data, xs);
	expect_vals(&out[0], (double[]){-1, -2}, 2);
	expect_vals(&out[1], (double[]){-1, -2}, 2);
	expect_vals(&out[2], (double[]){1, 2}, 2);
	for (int i = 0; i < 3; i++)
		fz_free(out[i].data);
}
END_TEST

/* A chain long enough that keeping every intermediate would be obvious
 * under a leak checker; the result is still right. */
START_TEST(long_chain)
{
	char src[16384];
	size_t n = (size_t)snprintf(src, sizeof src, "trace f(x: f32[64]) {\n  v0 = add(x, 1)\n");
	for (int i = 1; i < 200; i++)
		n += (size_t)snprintf(src + n, sizeof src - n, "  v%d = add(v%d, 1)\n", i, i - 1);
	snprintf(src + n, sizeof src - n, "  return v199\n}\n");
	float xs[64] = {0};
	fz_tensor in = tens(FZ_F32, xs, 1, SHAPE(64)), out;
	run_ok(src, &in, 1, &out, 1);
	for (int i = 0; i < 64; i++)
		ck_assert(at(&out, i) == 200);
	fz_free(out.data);
}
END_TEST

/* Ranks in lockstep: each collective against its definition, by hand. */
START_TEST(collectives_world_n)
{
	const char *src =
		"trace f(x: f32[2, 4]) world 4 {\n"
		"  g = wait(all_gather(x, dim=1))\n"
		"  s = wait(reduce_scatter(x, dim=1))\n"
		"  r = wait(all_reduce(x))\n"
		"  g0 = wait(all_gather(x, dim=0))\n"
		"  return g, s, r, g0\n}\n";
	fz_module *m = NULL;
	char *diag = NULL;
	ck_assert_int_eq(fz_module_parse(src, strlen(src), "w.trace", &m, &diag), FZ_OK);
	fz_trace *t = fz_module_trace(m, 0);
	enum { W = 4 };
	float xs[W][8];
	fz_tensor in[W], out[W * 4];
	for (int r = 0; r < W; r++) {
		for (int i = 0; i < 8; i++)
			xs[r][i] = (float)(100 * r + i);
		in[r] = tens(FZ_F32, xs[r], 2, SHAPE(2, 4));
	}
	char *err = NULL;
	fz_status st = fz_trace_interpret_world(t, NULL, W, in, 1, out, 4, &err);
	ck_assert_msg(st == FZ_OK, "%s", err ? err : "");
	for (int r = 0; r < W; r++) {
		fz_tensor *g = &out[r * 4], *s = &out[r * 4 + 1], *a = &out[r * 4 + 2],
			  *g0 = &out[r * 4 + 3];
		check_out(g, FZ_F32, 2, SHAPE(2, 16));
		check_out(s, FZ_F32, 2, SHAPE(2, 1));
		check_out(a, FZ_F32, 2, SHAPE(2, 4));
		check_out(g0, FZ_F32, 2, SHAPE(8, 4));
		for (int i = 0; i < 2; i++)
			for (int q = 0; q < W; q++)
				for (int j = 0; j < 4; j++)
					ck_assert(at(g, i * 16 + q * 4 + j) == xs[q][i * 4 + j]);
		for (int i = 0; i < 8 * 4; i++)
			ck_assert(at(g0, i) == xs[i / 8][i % 8]);
		for (int i = 0; i < 2; i++) {
			double want = 0;
			for (int q = 0; q < W; q++)
				want += xs[q][i * 4 + r];
			ck_assert(at(s, i) == want);
			for (int j = 0; j < 4; j++) {
				double w2 = 0;
				for (int q = 0; q < W; q++)
					w2 += xs[q][i * 4 + j];
				ck_assert(at(a, i * 4 + j) == w2);
			}
		}
	}
	for (int i = 0; i < W * 4; i++)
		fz_free(out[i].data);
	/* the world must be the trace's, the sizes every rank's */
	st = fz_trace_interpret_world(t, NULL, 2, in, 1, out, 4, &err);
	ck_assert_int_eq(st, FZ_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "world 4; 2 ranks"));
	fz_free(err);
	err = NULL;
	fz_module_free(m);
	const char *sym = "trace f(x: f32[B, 4]) world 2 {\n"
			  "  r = wait(all_reduce(x))\n  return r\n}\n";
	ck_assert_int_eq(fz_module_parse(sym, strlen(sym), "s.trace", &m, &diag), FZ_OK);
	fz_tensor two[2] = {tens(FZ_F32, xs[0], 2, SHAPE(2, 4)),
			    tens(FZ_F32, xs[1], 2, SHAPE(1, 4))};
	st = fz_trace_interpret_world(fz_module_trace(m, 0), NULL, 2, two, 1, out,
				      1, &err);
	ck_assert_int_eq(st, FZ_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "rank 1 binds B = 1; rank 0 binds 2"));
	fz_free(err);
	fz_module_free(m);
}
END_TEST

START_TEST(collectives_world1)
{
	double xs[] = {1, 2, 3, 4};
	fz_tensor in = tens(FZ_F64, xs, 2, SHAPE(2, 2)), out[3];
	run_ok("trace f(x: f64[2, 2]) {\n  a = wait(all_reduce(x))\n"
	       "  b = wait(all_gather(x, dim=0))\n  c = wait(reduce_scatter(x, dim=1))\n"
	       "  return a, b, c\n}\n", &in, 1, out, 3);
	for (int i = 0; i < 3; i++) {
		check_out(&out[i], FZ_F64, 2, SHAPE(2, 2));
		expect_vals(&out[i], xs, 4);
		fz_free(out[i].data);
	}
	run_fail("trace f(x: f64[2, 2]) world 2 {\n  a = wait(all_reduce(x))\n"
		 "  return a\n}\n", &in, 1, 1, FZ_EUNSUPPORTED,
		 (const char *const[]){"world 2", "fz_trace_interpret_world", NULL});
}
END_TEST

/* The builder path: a trace built in C with a composite (rms_norm). */
START_TEST(builder_trace)
{
	fz_trace *t = fz_trace_new("rms");
	fz_dim d[] = {{0, "B"}, {4, NULL}};
	fz_value *x = fz_param(t, "x", FZ_F32, 2, d);
	ck_assert_ptr_nonnull(x);
	fz_attr_value dims1 = {.kind = FZ_AV_INT, .i = 1};
	fz_attr attrs[] = {
		{"dims", {.kind = FZ_AV_LIST, .n = 1, .items = &dims1}},
		{"eps", {.kind = FZ_AV_FLOAT, .f = 0.0}},
	};
	fz_arg a[] = {fz_arg_value(x)};
	fz_value *y = fz_op1(t, "rms_norm", a, 1, attrs, 2);
	ck_assert_msg(y != NULL, "%s", fz_trace_error(t));
	ck_assert_int_eq(fz_return(t, &y, 1), FZ_OK);

	float xs[8] = {1, 1, 1, 1, 3, -3, 3, -3};
	fz_tensor in = tens(FZ_F32, xs, 2, SHAPE(2, 4)), out;
	int64_t syms[1] = {-1};
	char *err = NULL;
	ck_assert_int_eq(fz_trace_interpret(t, syms, &in, 1, &out, 1, &err), FZ_OK);
	expect_close(&out, (double[]){1, 1, 1, 1, 1, -1, 1, -1}, 8, 1e-6);
	fz_free(out.data);
	fz_trace_free(t);
}
END_TEST

START_TEST(bad_arguments)
{
	char *err = NULL;
	fz_tensor out;
	ck_assert_int_eq(fz_trace_interpret(NULL, NULL, NULL, 0, &out, 1, &err), FZ_EINVAL);
	fz_free(err);
	ck_assert_int_eq(fz_trace_bind(NULL, NULL, 0, NULL, &err), FZ_EINVAL);
	fz_free(err);
	fz_module *m = parse("trace f(x: f32[B]) {\n  y = neg(x)\n  return y\n}\n");
	fz_trace *t = fz_module_trace(m, 0);
	ck_assert_int_eq(fz_trace_bind(t, NULL, 1, NULL, &err), FZ_EINVAL);
	fz_free(err);
	fz_tensor in = tens(FZ_F32, NULL, 1, SHAPE(3));
	ck_assert_int_eq(fz_trace_interpret(t, NULL, &in, 1, &out, 1, &err), FZ_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "no data"));
	fz_free(err);
	in = tens(FZ_F32, NULL, 1, SHAPE(0)); /* empty: no data needed */
	ck_assert_int_eq(fz_trace_interpret(t, NULL, &in, 1, &out, 1, &err), FZ_OK);
	ck_assert_int_eq(out.shape[0], 0);
	fz_free(out.data);
	in.shape[0] = -3;
	ck_assert_int_eq(fz_trace_interpret(t, NULL, &in, 1, &out, 1, &err), FZ_EINVAL);
	fz_free(err);
	fz_module_free(m);
}
END_TEST

/* ---- the suite ------------------------------------------------------------------------------ */

Suite *interp_suite(void)
{
	Suite *s = suite_create("interp");
	TCase *tc;

	tc = tcase_create("numeric");
	tcase_add_test(tc, bf16_rounding);
	tcase_add_test(tc, f16_rounding);
	tcase_add_test(tc, small_float_roundtrip);
	tcase_add_test(tc, small_float_vs_reference);
	tcase_add_test(tc, store_cast_semantics);
	suite_add_tcase(s, tc);

	tc = tcase_create("philox");
	tcase_add_test(tc, philox_known_answers);
	tcase_add_test(tc, uniform_values);
	tcase_add_test(tc, uniform_range);
	suite_add_tcase(s, tc);

	tc = tcase_create("elementwise");
	tcase_add_test(tc, unary_ops_vs_libm);
	tcase_add_test(tc, unary_special_values);
	tcase_add_test(tc, unary_int);
	tcase_add_test(tc, binary_float);
	tcase_add_test(tc, binary_eager_rounding);
	tcase_add_test(tc, binary_int);
	tcase_add_test(tc, fmod_int_by_zero);
	tcase_add_test(tc, compare_and_logic);
	tcase_add_test(tc, where_op);
	tcase_add_test(tc, cast_op);
	suite_add_tcase(s, tc);

	tc = tcase_create("creation_and_meta");
	tcase_add_test(tc, creation_ops);
	tcase_add_test(tc, broadcast_op);
	tcase_add_test(tc, reshape_permute);
	tcase_add_test(tc, slice_squeeze_unsqueeze);
	tcase_add_test(tc, cat_op);
	suite_add_tcase(s, tc);

	tc = tcase_create("reduction");
	tcase_add_test(tc, reductions);
	tcase_add_test(tc, reductions_nan_and_int);
	tcase_add_test(tc, cumsum_op);
	tcase_add_test(tc, select_ops);
	tcase_add_test(tc, reduction_accumulates_wide);
	tcase_add_test(tc, var_mean_op);
	tcase_add_test(tc, empty_extents);
	suite_add_tcase(s, tc);

	tc = tcase_create("library");
	tcase_add_test(tc, matmul_shapes);
	tcase_add_test(tc, matmul_batched_broadcast);
	tcase_add_test(tc, matmul_blocked_bf16);
	tcase_add_test(tc, attention_matches_plain_loops);
	tcase_add_test(tc, linear_op);
	suite_add_tcase(s, tc);

	tc = tcase_create("indexing");
	tcase_add_test(tc, take_op);
	tcase_add_test(tc, take_along_op);
	tcase_add_test(tc, index_add_op);
	tcase_add_test(tc, index_errors);
	suite_add_tcase(s, tc);

	tc = tcase_create("binding");
	tcase_add_test(tc, bind_symbols);
	tcase_add_test(tc, bind_unbound_and_concrete);
	tcase_add_test(tc, bind_given_and_overflow);
	tcase_add_test(tc, symbolic_mean);
	tcase_add_test(tc, bad_arguments);
	suite_add_tcase(s, tc);

	tc = tcase_create("running");
	tcase_add_test(tc, strided_inputs);
	tcase_add_test(tc, outputs_independent);
	tcase_add_test(tc, long_chain);
	tcase_add_test(tc, collectives_world1);
	tcase_add_test(tc, collectives_world_n);
	tcase_add_test(tc, builder_trace);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(interp_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
