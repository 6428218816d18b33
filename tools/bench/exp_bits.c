/* exp_bits.c: the driver of exp_bits.sh. ka and kb are two builds' host
 * kernels of one trace (x: f32[2^24] -> two f32 outputs), called with
 * the host entry ABI (codegen.h: buffers, symbols, error word, part 0 of
 * 1); every 2^32 bit pattern goes through both, and the outputs that are
 * not the same bits (NaN and NaN count as the same) are counted. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ka(void **bufs, int64_t *syms, int64_t *err, int64_t part, int64_t nparts);
void kb(void **bufs, int64_t *syms, int64_t *err, int64_t part, int64_t nparts);

#define N (1u << 24)

int main(int argc, char **argv)
{
	const char *name[2] = {argc > 2 ? argv[1] : "a", argc > 2 ? argv[2] : "b"};
	float *x = aligned_alloc(64, N * 4), *o[2][2];
	for (int s = 0; s < 2; s++)
		for (int k = 0; k < 2; k++)
			o[s][k] = aligned_alloc(64, N * 4);
	int64_t syms[1] = {0}, err = 0;
	uint64_t diff[2] = {0, 0};
	for (uint64_t base = 0; base < (UINT64_C(1) << 32); base += N) {
		for (uint32_t i = 0; i < N; i++) {
			uint32_t u = (uint32_t)(base + i);
			memcpy(&x[i], &u, 4);
		}
		void *ba[3] = {x, o[0][0], o[0][1]}, *bb[3] = {x, o[1][0], o[1][1]};
		ka(ba, syms, &err, 0, 1);
		kb(bb, syms, &err, 0, 1);
		for (int k = 0; k < 2; k++)
			for (uint32_t i = 0; i < N; i++) {
				float p = o[0][k][i], q = o[1][k][i];
				if ((isnan(p) && isnan(q)) || memcmp(&p, &q, 4) == 0)
					continue;
				if (diff[k]++ < 5)
					printf("%s(%a): A %a, B %a\n", name[k], x[i], p, q);
			}
	}
	printf("all 2^32 f32 inputs: %s differs in %llu, %s in %llu\n", name[0],
	       (unsigned long long)diff[0], name[1], (unsigned long long)diff[1]);
	return diff[0] || diff[1];
}
