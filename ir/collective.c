/*
 * collective.c: what a collective computes, exactly, for one rank.
 *
 * The reference interpreter (interp.c, N ranks in lockstep) and the CPU
 * communicator (runtime/comm_cpu.c, N ranks on threads) both call this one
 * function, so emulated ranks agree with the oracle bit for bit:
 *
 *     all_gather(x, dim=d)      the ranks' x concatenated along d, rank 0
 *                               first
 *     reduce_scatter(x, dim=d)  the sum over ranks, then rank r's slice r
 *                               of N along d
 *     all_reduce(x)             the sum over ranks
 *
 * A sum adds the ranks in rank order in f64 (integers in 64 bits,
 * wrapping) and rounds once to the dtype, so it does not depend on which
 * rank arrives first: an exact collective, where NCCL's ring would add in
 * a rotating order and round at every step.
 */
#include <string.h>

#include "ir.h"
#include "numeric.h"

fz_status fz_collective_eval(fz_opcode op, fz_dtype dt, int nd,
			     const int64_t *xshape, int dim, int world, int rank,
			     const void *const *xs, void *y)
{
	if (world < 1 || rank < 0 || rank >= world || nd < 0 || nd > FZ_MAX_RANK ||
	    (op != FZ_OP_ALL_REDUCE && (dim < 0 || dim >= nd)))
		return FZ_EINVAL;
	size_t es = fz_dtype_size(dt);
	int64_t outer = 1, inner = 1, xd = op == FZ_OP_ALL_REDUCE ? 1 : xshape[dim];
	for (int i = 0; i < nd; i++) {
		if (op == FZ_OP_ALL_REDUCE || i > dim)
			inner *= xshape[i];
		else if (i < dim)
			outer *= xshape[i];
	}
	bool isfloat = fz_dtype_is_float(dt);
	switch (op) {
	case FZ_OP_ALL_GATHER: {
		size_t blk = (size_t)(xd * inner) * es;
		for (int64_t o = 0; o < outer; o++)
			for (int q = 0; q < world; q++)
				memcpy((char *)y + ((size_t)o * (size_t)world + (size_t)q) * blk,
				       (const char *)xs[q] + (size_t)o * blk, blk);
		return FZ_OK;
	}
	case FZ_OP_REDUCE_SCATTER:
	case FZ_OP_ALL_REDUCE: {
		if (xd % world && op == FZ_OP_REDUCE_SCATTER)
			return FZ_EINVAL;
		int64_t yd = op == FZ_OP_REDUCE_SCATTER ? xd / world : xd;
		int64_t first = op == FZ_OP_REDUCE_SCATTER ? (int64_t)rank * yd : 0;
		for (int64_t o = 0; o < outer; o++)
			for (int64_t j = 0; j < yd; j++)
				for (int64_t i = 0; i < inner; i++) {
					int64_t xi = (o * xd + first + j) * inner + i;
					int64_t yi = (o * yd + j) * inner + i;
					if (isfloat) {
						double s = 0;
						for (int q = 0; q < world; q++)
							s += fz_load_f64(xs[q], dt, xi);
						fz_store_f64(y, dt, yi, s);
					} else {
						uint64_t s = 0;
						for (int q = 0; q < world; q++)
							s += (uint64_t)fz_load_i64(xs[q], dt, xi);
						fz_store_i64(y, dt, yi, (int64_t)s);
					}
				}
		return FZ_OK;
	}
	default:
		return FZ_EINVAL;
	}
}
