/*
 * philox.h: the Philox4x32-10 counter-based generator, as static inlines.
 *
 * `uniform` draws its numbers from Philox4x32-10 (Salmon et al., "Parallel
 * random numbers: as easy as 1, 2, 3", SC 2011; the Random123 library). A
 * counter-based generator has no state to carry from one element to the
 * next: element i is a pure function of (seed, offset, i). That is what lets
 * the interpreter, a CPU kernel and a GPU kernel with any thread layout
 * produce the very same bits, so this header is shared by all of them.
 *
 * One call maps a 128-bit counter and a 64-bit key to four 32-bit words by
 * ten rounds of
 *
 *     (hi0, lo0) = M0 * c0        (hi1, lo1) = M1 * c2     (64-bit products)
 *     c = {hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0}
 *
 * with the key bumped by the Weyl constants (W0, W1) between rounds. This is
 * the standard Random123 philox4x32 with R = 10; it reproduces Random123's
 * known-answer vectors (tests/test_interp.c checks three of them).
 *
 * fusec's `uniform(shape, seed, offset, dtype)` uses it as follows:
 *   key      k0 = low 32 bits of seed, k1 = high 32 bits, where the seed
 *            is the attribute seed=S (0 when absent), or the value of the
 *            rank-0 operand of `uniform(s, shape, offset, dtype)` (an i32
 *            sign-extended), read at run time so that a new seed compiles
 *            nothing;
 *   element  i (row-major linear index) uses counter n = offset + i / 4,
 *            c0 = low 32 bits of n, c1 = high 32 bits, c2 = c3 = 0,
 *            and takes output word i % 4;
 *   the word w becomes u in [0, 1) with exactly as many bits as the dtype
 *   holds, so the value is exact in it and never rounds up to 1:
 *     f32  (w >> 8)  * 2^-24      f16  (w >> 21) * 2^-11
 *     bf16 (w >> 24) * 2^-8       f64  w * 2^-32
 */
#ifndef FUSEC_PHILOX_H
#define FUSEC_PHILOX_H

#include <math.h>
#include <stdint.h>

#include "fusec.h"

#define FZ_PHILOX_M0 UINT32_C(0xD2511F53)
#define FZ_PHILOX_M1 UINT32_C(0xCD9E8D57)
#define FZ_PHILOX_W0 UINT32_C(0x9E3779B9)
#define FZ_PHILOX_W1 UINT32_C(0xBB67AE85)

static inline void fz_philox_round(uint32_t c[4], const uint32_t k[2])
{
	uint64_t p0 = (uint64_t)FZ_PHILOX_M0 * c[0];
	uint64_t p1 = (uint64_t)FZ_PHILOX_M1 * c[2];
	uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
	uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
	uint32_t n0 = hi1 ^ c[1] ^ k[0];
	uint32_t n2 = hi0 ^ c[3] ^ k[1];
	c[0] = n0;
	c[1] = lo1;
	c[2] = n2;
	c[3] = lo0;
}

/* Philox4x32-10: out = philox(ctr, key). */
static inline void fz_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                    uint32_t out[4])
{
	uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
	uint32_t k[2] = {key[0], key[1]};
	for (int r = 0; r < 10; r++) {
		if (r > 0) {
			k[0] += FZ_PHILOX_W0;
			k[1] += FZ_PHILOX_W1;
		}
		fz_philox_round(c, k);
	}
	out[0] = c[0];
	out[1] = c[1];
	out[2] = c[2];
	out[3] = c[3];
}

/* The raw 32-bit word of element i of uniform(seed, offset). */
static inline uint32_t fz_philox_word(uint64_t seed, uint64_t offset, uint64_t i)
{
	uint64_t n = offset + i / 4;
	uint32_t ctr[4] = {(uint32_t)n, (uint32_t)(n >> 32), 0, 0};
	uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
	uint32_t out[4];
	fz_philox4x32_10(ctr, key, out);
	return out[i % 4];
}

/* A word as u in [0, 1) for a float dtype (see the table above). */
static inline double fz_philox_unit(uint32_t w, fz_dtype d)
{
	switch (d) {
	case FZ_F32: return ldexp((double)(w >> 8), -24);
	case FZ_F16: return ldexp((double)(w >> 21), -11);
	case FZ_BF16: return ldexp((double)(w >> 24), -8);
	default: return ldexp((double)w, -32);
	}
}

#endif
