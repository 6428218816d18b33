/*
 * math_sweep.h: one trace of the f32 math functions and the inputs that
 * sweep them, for the tests that hold a GPU kernel's math to the host's
 * bit for bit (test_emu.c on the emulated GPU, test_cuda.c on a real one).
 * codegen/math.c emits each function from one source on every target, so
 * the CPU tests test the GPU's math; these tests are where that is shown.
 */
#ifndef FUSEC_TESTS_MATH_SWEEP_H
#define FUSEC_TESTS_MATH_SWEEP_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

enum { MATH_SWEEP_OUTS = 8 };

static const char math_sweep_trace[] =
	"trace m(x: f32[N]) {\n  a = exp(x)\n  b = sigmoid(x)\n  c = silu(x)\n"
	"  d = tanh(x)\n  e = gelu(x, approximate=tanh)\n  f = log(abs(x))\n"
	"  g = sin(x)\n  h = expm1(x)\n  return a, b, c, d, e, f, g, h\n}\n";

static const char *const math_sweep_names[MATH_SWEEP_OUTS] = {
	"exp", "sigmoid", "silu", "tanh", "gelu", "log", "sin", "expm1"};

/* n inputs: specials (zeros, infinities, NaNs of both signs and a
 * signaling one, the largest and smallest floats), 8192 consecutive
 * floats around each edge of exp's range (subnormal results below
 * -87.336, the smallest at -103.279, 0 below -103.972, inf above 88.722),
 * `dense` of them spread evenly over [-20, 20), and the rest bit patterns
 * at a stride over all 2^32, which cross every exponent. n must exceed
 * 12 + 4 * 8192 + dense. (test_codegen's host_exp_matches_generic takes
 * them with no dense part.) */
static inline void math_sweep_inputs(float *x, int64_t n, int64_t dense)
{
	static const uint32_t sp[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000,
				      0x7fc00000, 0xffc00000, 0x7fa00000, 0x7f7fffff,
				      0xff7fffff, 0x00000001, 0x80000001, 0x00800000};
	static const float edge[] = {-87.336f, -103.279f, -103.972f, 88.722f};
	int64_t i = 0;
	for (; i < 12; i++)
		memcpy(&x[i], &sp[i], 4);
	for (int e = 0; e < 4; e++) {
		float v = edge[e];
		for (int k = 0; k < 4096; k++)
			v = nextafterf(v, -INFINITY);
		for (int k = 0; k < 8192; k++, i++)
			x[i] = v = nextafterf(v, INFINITY);
	}
	for (int64_t k = 0; k < dense; k++, i++)
		x[i] = (float)(-20.0 + 40.0 * (double)k / (double)dense);
	uint32_t stride = (uint32_t)(UINT64_C(0xffffffff) / (uint64_t)(n - i)) | 1;
	for (uint32_t u = 0x9e3779b9; i < n; i++, u += stride)
		memcpy(&x[i], &u, 4);
}

/* How many of got[0..n) differ from want's bits (a NaN matching a NaN);
 * *first: the first such index, or -1. */
static inline int64_t math_sweep_diff(const float *got, const float *want, int64_t n,
				      int64_t *first)
{
	int64_t bad = 0;
	*first = -1;
	for (int64_t k = 0; k < n; k++) {
		bool same = memcmp(&got[k], &want[k], 4) == 0 || (isnan(got[k]) && isnan(want[k]));
		if (!same && bad++ == 0)
			*first = k;
	}
	return bad;
}

#endif
