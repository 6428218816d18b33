/*
 * glibc_compat.c: arc4random for the packed GPU build (tools/gpu/pack.sh).
 *
 * Debian's static LLVM 19 was configured on glibc 2.36, which added
 * arc4random, so libLLVMSupport.a calls it (Process::GetRandomNumber, for
 * seeds) and every binary linked against it needs GLIBC_2.36: it will not
 * start on glibc 2.35 (Ubuntu 22.04, one of CUDA 13's base images), where
 * everything else it calls exists. pack.sh links this object into each
 * binary and into libfusec.so; the static archive's reference then binds
 * to this definition at link time, hidden, so no GLIBC_2.36 version is
 * asked of the loader (pack.sh checks the newest version the packed files
 * need). LLVM wants a seed, not a key: getrandom (glibc 2.25), and if the
 * kernel refuses it, the clock and a counter mixed by splitmix64.
 */
#include <errno.h>
#include <stdint.h>
#include <sys/random.h>
#include <time.h>

__attribute__((visibility("hidden"))) uint32_t arc4random(void)
{
	uint32_t v;
	for (;;) {
		ssize_t n = getrandom(&v, sizeof v, 0);
		if (n == (ssize_t)sizeof v)
			return v;
		if (n < 0 && errno != EINTR)
			break;
	}
	static uint64_t counter;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t z = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec +
	             0x9e3779b97f4a7c15u * ++counter;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return (uint32_t)(z ^ (z >> 31));
}
