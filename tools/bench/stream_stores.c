/*
 * stream_stores.c: plain against streaming (non-temporal) stores, for
 * codegen/emit.c's choice of how many outputs a host loop may stream.
 *
 * A loop like a fused kernel's: read NIN inputs, store NOUT outputs, all
 * buffers of 32 MiB, split in halves over two threads, once with plain
 * vector stores and once with vmovntps (and an sfence at the end, as the
 * generated code has), the inputs prefetched 4 KiB ahead as the
 * generated code does. The inputs start D bytes behind the outputs in
 * their pages, (out - in) mod 4096 = D: 0 where every buffer starts a
 * page, 48 for an input from malloc (16 bytes in) beside an output of the
 * host cache (64 bytes in). Prints the median of 7 runs of each, in ms
 * and GB/s (bytes read and written).
 *
 *     stream_stores NIN NOUT [D]
 *     for c in "1 1" "1 2" "2 2" "4 3"; do stream_stores $c; done
 *     stream_stores 1 2 48
 *
 * x86-64 only (AVX).
 */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N (8L << 20) /* floats a buffer */
#define MAXB 16
#define RUNS 7

static float *in[MAXB], *out[MAXB];
static int nin, nout, streaming;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

__attribute__((target("avx"))) static void *half(void *arg)
{
	long h = (long)arg, lo = h * N / 2, hi = (h + 1) * N / 2;
	for (long i = lo; i < hi; i += 8) {
		__m256 s = _mm256_setzero_ps();
		for (int k = 0; k < nin; k++) {
			_mm_prefetch((const char *)(in[k] + i + 1024), _MM_HINT_T0);
			s = _mm256_add_ps(s, _mm256_loadu_ps(in[k] + i));
		}
		for (int k = 0; k < nout; k++) {
			__m256 v = _mm256_mul_ps(s, _mm256_set1_ps((float)k + 1.0f));
			if (streaming)
				_mm256_stream_ps(out[k] + i, v);
			else
				_mm256_storeu_ps(out[k] + i, v);
		}
	}
	_mm_sfence();
	return NULL;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: stream_stores NIN NOUT [D]\n");
		return 2;
	}
	nin = atoi(argv[1]);
	nout = atoi(argv[2]);
	int d = argc > 3 ? atoi(argv[3]) : 0;
	if (nin < 1 || nin > MAXB || nout < 1 || nout > MAXB || d < 0 || d > 4095) {
		fprintf(stderr, "stream_stores: NIN and NOUT in 1..%d, D in 0..4095\n", MAXB);
		return 2;
	}
	for (int k = 0; k < nin; k++) {
		char *p = aligned_alloc(4096, N * 4 + 4096);
		if (!p)
			return 1;
		memset(p, 0, N * 4 + 4096);
		in[k] = (float *)(p + (4096 - d) % 4096);
	}
	for (int k = 0; k < nout; k++) {
		out[k] = aligned_alloc(4096, N * 4);
		if (!out[k])
			return 1;
		memset(out[k], 1, N * 4);
	}
	for (streaming = 0; streaming < 2; streaming++) {
		double ts[RUNS];
		for (int r = 0; r < RUNS; r++) {
			double t0 = now();
			pthread_t th[2];
			for (long h = 0; h < 2; h++)
				pthread_create(&th[h], NULL, half, (void *)h);
			for (int h = 0; h < 2; h++)
				pthread_join(th[h], NULL);
			ts[r] = now() - t0;
		}
		qsort(ts, RUNS, sizeof ts[0], cmp);
		double t = ts[RUNS / 2];
		printf("in %2d out %2d D %4d %-9s %7.2f ms %5.1f GB/s\n", nin, nout, d,
		       streaming ? "streaming" : "plain", t * 1e3,
		       (double)N * 4.0 * (nin + nout) / t / 1e9);
	}
	return 0;
}
