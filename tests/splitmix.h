/*
 * splitmix.h: SplitMix64, the seeded generator of the random tests
 * (test_difftest.c, fuzz/pipeline.c): one state word, every seed a good
 * stream, the same numbers on every machine.
 */
#ifndef FUSEC_TESTS_SPLITMIX_H
#define FUSEC_TESTS_SPLITMIX_H

#include <stdint.h>

static inline uint64_t splitmix_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

#endif
