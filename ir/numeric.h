/*
 * numeric.h: element conversions between fusec's dtypes, as static inlines.
 *
 * The reference interpreter computes every float op in f64 and every integer
 * op in int64, and rounds once, at the op's output, to the result's storage
 * dtype. That needs three things, all here:
 *
 *   - f64 <-> f16 and f64 <-> bf16 with round-to-nearest-even, done in
 *     integer arithmetic on the bits so that it does not depend on the host
 *     having _Float16 or on the FPU's rounding mode. Rounding goes straight
 *     from f64 (one rounding, never f64 -> f32 -> f16, which can round twice
 *     and miss a tie). NaN stays NaN (quiet, sign kept); values at or past
 *     max + half an ulp become inf; tiny values become subnormals or zero.
 *   - loading an element of any dtype as a double or as an int64;
 *   - storing a double or an int64 into an element of any dtype, with the
 *     semantics of cast: float -> int truncates toward zero, NaN gives 0 and
 *     out-of-range values saturate; int -> int wraps to the width; -> bool is
 *     x != 0; -> f16/bf16 rounds to nearest even.
 *
 * Worked example: 1 + 2^-8 is exactly halfway between the bf16 neighbours
 * 1 and 1 + 2^-7. The discarded bits are exactly half an ulp and the kept
 * mantissa is even, so it rounds to 1.0 (0x3f80); 1 + 3*2^-8 is halfway
 * between 1 + 2^-7 (odd) and 1 + 2^-6 and rounds up to 1 + 2^-6 (0x3f82).
 *
 * Codegen reuses these for constant folding and for its host-side checks, so
 * they take no fusec state and include nothing but fusec.h and libc.
 */
#ifndef FUSEC_NUMERIC_H
#define FUSEC_NUMERIC_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "fusec.h"

/* ---- f64 <-> small floats ------------------------------------------------ */

/* Rounds x to the binary format with `ebits` exponent bits and `mbits`
 * stored mantissa bits (f16: 5, 10; bf16: 8, 7), nearest even. */
static inline uint16_t fz_f64_to_small(double x, int ebits, int mbits)
{
	uint64_t b;
	memcpy(&b, &x, sizeof b);
	uint16_t sign = (uint16_t)((b >> 63) << (ebits + mbits));
	int e = (int)((b >> 52) & 0x7ff);
	uint64_t m = b & ((UINT64_C(1) << 52) - 1);
	int emax = (1 << ebits) - 1;           /* the all-ones exponent field */
	int bias = (1 << (ebits - 1)) - 1;
	uint16_t inf = (uint16_t)(emax << mbits);

	if (e == 0x7ff) {
		if (m == 0)
			return sign | inf;
		return sign | inf | (uint16_t)(1u << (mbits - 1)); /* quiet NaN */
	}
	if (e == 0) /* zero or an f64 subnormal: far below half the smallest */
		return sign;

	int E = e - 1023;                      /* x = 1.m * 2^E */
	if (E + bias >= emax)
		return sign | inf;
	uint64_t sig = (UINT64_C(1) << 52) | m; /* 53 bits */
	int shift = 52 - mbits;                 /* bits to drop */
	if (E < 1 - bias)                       /* subnormal in the target */
		shift += (1 - bias) - E;
	if (shift > 62)
		return sign;
	uint64_t q = sig >> shift;
	uint64_t rem = sig & ((UINT64_C(1) << shift) - 1);
	uint64_t half = UINT64_C(1) << (shift - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	uint64_t bits;
	if (E < 1 - bias)
		bits = q; /* a carry into 1 << mbits is the smallest normal */
	else
		/* q carries the implicit bit, which adds one to the exponent
		 * field; a carry out of the mantissa bumps it again. */
		bits = ((uint64_t)(E + bias - 1) << mbits) + q;
	if (bits >= inf)
		return sign | inf;
	return sign | (uint16_t)bits;
}

static inline double fz_small_to_f64(uint16_t h, int ebits, int mbits)
{
	int emax = (1 << ebits) - 1;
	int bias = (1 << (ebits - 1)) - 1;
	bool neg = (h >> (ebits + mbits)) & 1;
	int e = (h >> mbits) & emax;
	int m = h & ((1 << mbits) - 1);
	double v;
	if (e == emax)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp((double)m, 1 - bias - mbits);
	else
		v = ldexp((double)((1 << mbits) | m), e - bias - mbits);
	return neg ? -v : v;
}

static inline uint16_t fz_f64_to_f16(double x) { return fz_f64_to_small(x, 5, 10); }
static inline uint16_t fz_f64_to_bf16(double x) { return fz_f64_to_small(x, 8, 7); }
static inline uint16_t fz_f32_to_f16(float x) { return fz_f64_to_small(x, 5, 10); }
static inline uint16_t fz_f32_to_bf16(float x) { return fz_f64_to_small(x, 8, 7); }
static inline double fz_f16_to_f64(uint16_t h) { return fz_small_to_f64(h, 5, 10); }
static inline double fz_bf16_to_f64(uint16_t h) { return fz_small_to_f64(h, 8, 7); }
static inline float fz_f16_to_f32(uint16_t h) { return (float)fz_f16_to_f64(h); }
static inline float fz_bf16_to_f32(uint16_t h) { return (float)fz_bf16_to_f64(h); }

/* ---- float -> int with cast semantics ------------------------------------ */

/* Truncates toward zero and saturates to [lo, hi]; NaN gives 0. lo and hi
 * are compared as doubles, so hi = INT64_MAX (2^63 - 1, which rounds up to
 * 2^63) works: anything >= 2^63 saturates. */
static inline int64_t fz_f64_to_int_sat(double x, int64_t lo, int64_t hi)
{
	if (isnan(x))
		return 0;
	x = trunc(x);
	if (x <= (double)lo)
		return lo;
	if (x >= (double)hi)
		return hi;
	return (int64_t)x;
}

/* Wraps an int64 to the width of an integer dtype (two's complement). */
static inline int64_t fz_int_wrap(int64_t x, fz_dtype d)
{
	switch (d) {
	case FZ_I32: return (int32_t)(uint32_t)(uint64_t)x;
	case FZ_I8: return (int8_t)(uint8_t)(uint64_t)x;
	case FZ_U8: return (uint8_t)(uint64_t)x;
	case FZ_BOOL: return x != 0;
	default: return x;
	}
}

/* ---- load and store one element ------------------------------------------ */

static inline double fz_load_f64(const void *p, fz_dtype d, int64_t i)
{
	switch (d) {
	case FZ_F64: return ((const double *)p)[i];
	case FZ_F32: return ((const float *)p)[i];
	case FZ_F16: return fz_f16_to_f64(((const uint16_t *)p)[i]);
	case FZ_BF16: return fz_bf16_to_f64(((const uint16_t *)p)[i]);
	case FZ_I64: return (double)((const int64_t *)p)[i];
	case FZ_I32: return ((const int32_t *)p)[i];
	case FZ_I8: return ((const int8_t *)p)[i];
	case FZ_U8: return ((const uint8_t *)p)[i];
	case FZ_BOOL: return ((const uint8_t *)p)[i] != 0;
	default: return 0;
	}
}

/* Floats load with cast semantics (truncated, saturated to int64). */
static inline int64_t fz_load_i64(const void *p, fz_dtype d, int64_t i)
{
	switch (d) {
	case FZ_I64: return ((const int64_t *)p)[i];
	case FZ_I32: return ((const int32_t *)p)[i];
	case FZ_I8: return ((const int8_t *)p)[i];
	case FZ_U8: return ((const uint8_t *)p)[i];
	case FZ_BOOL: return ((const uint8_t *)p)[i] != 0;
	default:
		return fz_f64_to_int_sat(fz_load_f64(p, d, i), INT64_MIN, INT64_MAX);
	}
}

static inline void fz_store_f64(void *p, fz_dtype d, int64_t i, double x)
{
	switch (d) {
	case FZ_F64: ((double *)p)[i] = x; break;
	case FZ_F32: ((float *)p)[i] = (float)x; break;
	case FZ_F16: ((uint16_t *)p)[i] = fz_f64_to_f16(x); break;
	case FZ_BF16: ((uint16_t *)p)[i] = fz_f64_to_bf16(x); break;
	case FZ_I64:
		((int64_t *)p)[i] = fz_f64_to_int_sat(x, INT64_MIN, INT64_MAX);
		break;
	case FZ_I32:
		((int32_t *)p)[i] = (int32_t)fz_f64_to_int_sat(x, INT32_MIN, INT32_MAX);
		break;
	case FZ_I8:
		((int8_t *)p)[i] = (int8_t)fz_f64_to_int_sat(x, INT8_MIN, INT8_MAX);
		break;
	case FZ_U8:
		((uint8_t *)p)[i] = (uint8_t)fz_f64_to_int_sat(x, 0, UINT8_MAX);
		break;
	case FZ_BOOL: ((uint8_t *)p)[i] = x != 0; break; /* NaN is true */
	default: break;
	}
}

static inline void fz_store_i64(void *p, fz_dtype d, int64_t i, int64_t x)
{
	switch (d) {
	case FZ_I64: ((int64_t *)p)[i] = x; break;
	case FZ_I32: ((int32_t *)p)[i] = (int32_t)fz_int_wrap(x, d); break;
	case FZ_I8: ((int8_t *)p)[i] = (int8_t)fz_int_wrap(x, d); break;
	case FZ_U8: ((uint8_t *)p)[i] = (uint8_t)fz_int_wrap(x, d); break;
	case FZ_BOOL: ((uint8_t *)p)[i] = x != 0; break;
	case FZ_F32: ((float *)p)[i] = (float)x; break; /* one rounding */
	default: fz_store_f64(p, d, i, (double)x); break;
	}
}

#endif
