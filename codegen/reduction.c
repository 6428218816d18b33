/*
 * reduction.c: the row skeleton, for reduction and normalization regions.
 *
 * Every reduction of the region must reduce the same dims of the same
 * shape, the domain D. The kept dims of D are rows (K of them), the reduced
 * dims a row's elements (R). For each row, in order:
 *
 *   0. what the row's elements read through a broadcast along the reduced
 *      dims (a target, a per-row weight) is computed once, at the row's
 *      start (see "row invariants");
 *   1. every reduction, in the region's order, is a pass over the row: each
 *      thread accumulates its elements (lanes of 16 bytes along the row when
 *      the innermost dim is reduced and its extent allows; on an AVX2 host
 *      a 16-bit row's lanes in even and odd order, see "even and odd
 *      lanes"), the lanes are combined, then the threads: butterfly warp
 *      shuffles, then one slot per warp in shared memory read back by
 *      every thread in warp order.
 *      Float sums are pairs hi + lo (see "float sums" below): the result
 *      is the exact sum rounded once, nearly always, as the interpreter's
 *      f64 sum rounded to f32 is. On the host and the GPUs with full f64
 *      units, where f64 adds are as cheap as f32 ones, a sum of f32 (or
 *      f16, bf16) values is kept in f64 instead (see "wide sums"); on the
 *      host over up to four accumulators that take turns (pass()), or,
 *      for terms never negative (an exp, a square), one accumulator that
 *      takes blocks of four steps added in f32 (the block: see
 *      pass()). var_mean is two passes (the mean, then
 *      squared deviations from it), as the interpreter does, or, where
 *      f64 is fast, one pass of the sum and the sum of squares, the second
 *      pass taken only by rows where that form could cancel (see "var_mean
 *      in one pass"); its mean and variance are divided in f64 and rounded
 *      once. Later passes may use
 *      earlier reduced values (softmax sums exp(x - max)); the emitter
 *      reads them from the row's registers. On the host the last pass
 *      may stash what it reduces in an output for the tail (see "the
 *      stash"), and in a chain of 3 or more looping passes every pass
 *      does, for the next (see "the chain"); the tail's exp(y - c) is then
 *      the stashed exp(y) times exp(-c) (see "the rescale"). A sum over a
 *      one-hot select (ir/onehot.h: cross-entropy's backward) is no pass:
 *      its value is picked at the row (see "the pick").
 *   2. outputs of the row's shape (a loss per row, a mean kept for backward)
 *      are computed at the row's index and stored by one thread;
 *   3. outputs of D's shape are a last pass over the row (the normalization
 *      tail: (x - mean) * rstd * w + b), stored by every thread; on the
 *      host the tail also prefetches the rows ahead (see "the prefetch").
 *
 * How a row is spread over threads (fz_kernel.par):
 *   WARP    innermost dim reduced, a known row of at most 4 steps per lane
 *           (128 lane groups: 1024 bf16): a warp per row
 *   BLOCK   innermost dim reduced, longer or symbolic rows: a block of
 *           FZ_ROW_BLOCK threads per row
 *   THREAD  innermost dim kept (an outer reduction, sum over dim 0): rows
 *           are columns, one per thread, so consecutive threads read
 *           consecutive addresses; and every row on the host, where the
 *           parallel loops are plain loops (an outer reduction there
 *           walks blocks of columns instead: see "columns")
 *
 * The row in registers (GPU). When the row's length is a constant and a
 * thread's share of it is at most FZ_ROW_REGS elements, the passes are not
 * loops: each thread's S steps are unrolled, with index values built once
 * per row (row_regs), so the emitter's memo hands every later pass and the
 * tail the SSA values the first pass loaded; the row is read from global
 * memory once and lives in registers (the PTX has one ld.global of x per
 * step and no .local). A step that runs past the row's end (the last one,
 * when the threads do not divide the row) reads element 0 and is masked
 * out of the sums and the stores. Otherwise (long or symbolic rows, and
 * always on the host, where the row is in cache anyway) each pass is a
 * loop that re-reads the row.
 *
 * Worked example: layer_norm over [16, 128, 1600] bf16 on the GPU: 2048
 * rows of 1600 = 200 lane groups of 8; a block per row, one step per
 * thread (threads 200..255 masked): one 16-byte load of x, pass 1 sums x,
 * pass 2 sums (x - mean)^2 from the same registers, the tail loads w and b
 * and stores y. Softmax over [B, 12, T, T] f32 with T symbolic: K = B*12*T
 * rows of R = T, a block each, pass 1 amax, pass 2 sum(exp(x - max)),
 * pass 3 stores exp(x - max) / sum, each re-reading the row (from L1/L2).
 * Accumulation is in f32 for f16/bf16/f32 and f64 for f64.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Target.h>

#include "cg.h"
#include "llvm.h"
#include "onehot.h"

typedef struct rows {
	const fz_type *D;
	bool red[FZ_MAX_RANK];
	fz_type kt, rt;        /* kept dims, reduced dims */
	int kd[FZ_MAX_RANK], rd[FZ_MAX_RANK]; /* their positions in D */
	int L;                 /* lanes along the row */
	bool eo;               /* in even and odd order (see "even and odd lanes") */
	fz_rowpar par;
	V tid_in_row, nthr;    /* a thread's position in its row's group */
	V count;               /* R as ity */
	/* The row held in registers (S > 0): step k of this thread covers the
	 * lanes ix[k*L .. k*L+L), valid[k] says whether they lie in the row
	 * (NULL: always). The same index values serve every pass, so the
	 * emitter's memo hands each pass the values the first one loaded. */
	int S;
	cg_ix ix[FZ_ROW_REGS][FZ_MAX_RANK];
	V valid[FZ_ROW_REGS];
	/* The stash (host): the pass of reduction `stash_by` stores what it
	 * reduces, `stash_v`, into output `stash_o`; the tail reads it back. */
	const fz_node *stash_by;
	const fz_value *stash_v, *stash_o;
	/* The rescale (host): the tail's exp(y - c), c a row value and
	 * stash_v = exp(y), is stash_v * exp(-c) (see "the rescale");
	 * rescale_f is exp(-c) at the row, rescale_bad says the row must
	 * compute exp itself. NULL: none. */
	const fz_node *rescale_e;
	const fz_value *rescale_c;
	V rescale_f, rescale_bad;
	bool rescale_le1;     /* stash_v <= 1 or NaN: never infinite */
	/* The picks' operands (see "the pick"): x along dim d is h at index
	 * tj (ity; all ones where no index is hot), z elsewhere. */
	struct { const fz_value *x; int d; V h, z, tj; } pk[8];
	int npk;
	/* The chain (see "the chain"): every pass stores what it reduces in
	 * stash_o, and each pass but the first reads back the value the pass
	 * before it reduced, from chain[k] (NULL: none). */
	bool chained;
	const fz_value *chain[64];
	/* Float sums as (hi, lo) pairs even where f64 is fast: var_mean's
	 * exact second pass, for a row the one-pass form cannot take (see
	 * "var_mean in one pass") */
	bool pairs;
	/* The keep (host): pass `keep_pass` (counting every pass of the
	 * row, var_mean's two included; `npass` so far) stores output
	 * `keep_o`, which it computes anyway, and the passes after it and
	 * the tail read it back (see "the keep"). */
	const fz_value *keep_o;
	int keep_pass, npass;
	/* The scratch (host): where the stash, the chain and the keep put
	 * what they store, instead of the output (see "the scratch"); NULL:
	 * the output. */
	V scratch;
	T scratch_t;
	/* The prefetch (host): how far ahead of the tail's step, in elements
	 * (NULL: no prefetch; see "the prefetch") */
	V ahead;
} rows;

static V identity(cg *g, fz_opcode op, T t)
{
	bool isf = t != t_i64(g);
	if (op == FZ_OP_AMAX)
		return isf ? c_real(t, -INFINITY) : c_i64(g, INT64_MIN);
	if (op == FZ_OP_AMIN)
		return isf ? c_real(t, INFINITY) : c_i64(g, INT64_MAX);
	return isf ? c_real(t, 0.0) : c_i64(g, 0);
}

static V combine(cg *g, fz_opcode op, V acc, V v)
{
	T st = type_of(acc);
	if (LLVMGetTypeKind(st) == LLVMVectorTypeKind)
		st = LLVMGetElementType(st);
	bool isf = st != t_i64(g);
	if (op != FZ_OP_AMAX && op != FZ_OP_AMIN)
		return isf ? fadd(g, acc, v) : add(g, acc, v);
	if (!isf)
		return sel(g, icmp(g, op == FZ_OP_AMAX ? LLVMIntSGT : LLVMIntSLT, v, acc), v, acc);
	/* NaN sticks, as in the interpreter: an ordered compare is false
	 * for a NaN acc, which stays (x86's maxps keeps its second operand
	 * so), and a NaN v is taken by the outer select: four AVX-512
	 * instructions a step where an or of both NaN tests took six */
	V pick = sel(g, fcmp(g, op == FZ_OP_AMAX ? LLVMRealOGT : LLVMRealOLT, v, acc), v, acc);
	return sel(g, fcmp(g, LLVMRealUNO, v, v), v, pick);
}

/* ---- float sums as (hi, lo) pairs ---------------------------------------------
 * A float sum is kept as an unevaluated pair hi + lo (Ogita, Rump and
 * Oishi's Sum2): each addend goes into hi, and the exact rounding error of
 * that addition (TwoSum, six flops, no fma, no reassociation) into lo.
 * Pairs combine across lanes and threads the same way, and the result
 * hi + lo is rounded once. The error is that of a sum in twice the working
 * precision, rounded: in f32 the result equals the interpreter's f64 sum
 * rounded to f32 except within a hair of a rounding boundary, whatever
 * the order the threads chose.
 *
 * Wide sums. Where f64 adds cost about what f32 ones do (fast_f64: the
 * host, and the GPUs with full f64 units, sm_70, sm_80 and sm_90), an f32
 * sum is kept in f64 instead, which errs as little: one conversion and
 * one add a term where the pair takes seven flops, and var_mean's second
 * pass one subtraction and one fma in f64 where the pair took about
 * twenty. The pairs were most of the work of a normalization on the
 * GPU: bf16 layer_norm over rows of 8192 on sm_90 was 52 PTX
 * instructions an element (0.52-0.54 of a copy's bandwidth on an
 * H200), now 28 (0.62-0.66); but var_mean's two passes then held the
 * row's terms in f64 across the first one's barrier (that kernel: 56
 * registers a thread, then 124), which "var_mean in one pass" does not
 * (0.65-0.68; tools/gpu/README.md). GPUs whose f64 runs at 1/32 or 1/64
 * of f32 keep the pairs. */

/* s + e = a + b exactly, s = fl(a + b) */
static V two_sum(cg *g, V a, V b, V *e)
{
	V s = fadd_exact(g, a, b);
	V bp = fsub_exact(g, s, a);
	V ap = fsub_exact(g, s, bp);
	*e = fadd_exact(g, fsub_exact(g, a, ap), fsub_exact(g, b, bp));
	return s;
}

/* (h1, l1) + (h2, l2): hi stays the plain sum (so an inf or a NaN in it is
 * the interpreter's), lo gathers every rounding error. */
static V pair_add(cg *g, V h1, V l1, V h2, V l2, V *lo)
{
	V e;
	V s = two_sum(g, h1, h2, &e);
	*lo = fadd_exact(g, fadd_exact(g, l1, l2), e);
	return s;
}

/* hi + lo in type t (f32 or f64; hi and lo f32 or f64): where hi is inf
 * or NaN, lo is NaN and hi alone is the sum. */
static V pair_sum(cg *g, V hi, V lo, T t)
{
	if (type_of(hi) != t) {
		hi = fpext(g, hi, t);
		lo = fpext(g, lo, t);
	}
	V fin = fcmp(g, LLVMRealOLT, call_intrinsic(g, "llvm.fabs", t, t, &hi, 1),
		     c_real(t, INFINITY));
	return sel(g, fin, fadd_exact(g, hi, lo), hi);
}

static V smem_slot(cg *g, T t, int role, V i, bool st)
{
	int kind = (t == t_f32(g) ? 0 : t == t_f64(g) ? 1 : 2) * 2 + role;
	return cg_smem_ptr(g, t, kind, i, st);
}

/* Lane 0 of each warp stores its v[0..n) (n at most 2: roles 0 and 1 of
 * shared memory, at the warp's index), then a barrier; the number of
 * warps of the block, for the loop that reads them back. */
static V warps_to_smem(cg *g, T t, const V *v, int n)
{
	V tid = cg_tid(g);
	V warp = udiv(g, tid, c_int(g->ity, 32));
	V lane = urem(g, tid, c_int(g->ity, 32));
	LLVMBasicBlockRef w = block(g, "wr"), cont = block(g, "wr.done");
	cond_br(g, icmp(g, LLVMIntEQ, lane, c_int(g->ity, 0)), w, cont);
	at_end(g, w);
	for (int i = 0; i < n; i++)
		store(g, v[i], smem_slot(g, t, i, warp, true), 4);
	br(g, cont);
	at_end(g, cont);
	cg_barrier(g);
	return udiv(g, cg_ntid(g), c_int(g->ity, 32));
}

/* Combines a per-thread value across the threads that share a row: op on
 * v, or, where lo is not NULL, the pair (v, *lo). */
static V across_threads(cg *g, rows *R, fz_opcode op, V v, V *lo)
{
	if (R->par == FZ_PAR_THREAD)
		return v;
	for (int m = 16; m >= 1; m /= 2) {
		V o = cg_shfl_bfly(g, v, m);
		if (lo)
			v = pair_add(g, v, *lo, o, cg_shfl_bfly(g, *lo, m), lo);
		else
			v = combine(g, op, v, o);
	}
	if (R->par == FZ_PAR_WARP)
		return v;
	T t = type_of(v);
	V nw = warps_to_smem(g, t, (V[2]){v, lo ? *lo : NULL}, lo ? 2 : 1);
	V acc = cg_entry_alloca(g, t), acc_lo = lo ? cg_entry_alloca(g, t) : NULL;
	store(g, identity(g, op, t), acc, 8);
	if (lo)
		store(g, c_real(t, 0.0), acc_lo, 8);
	cg_loop L;
	cg_loop_begin(g, &L, c_int(g->ity, 0), nw, c_int(g->ity, 1));
	V a = load(g, t, acc, 8), x = load(g, t, smem_slot(g, t, 0, L.iv, false), 4);
	if (lo) {
		V l2;
		V h = pair_add(g, a, load(g, t, acc_lo, 8), x,
			       load(g, t, smem_slot(g, t, 1, L.iv, false), 4), &l2);
		store(g, h, acc, 8);
		store(g, l2, acc_lo, 8);
	} else {
		store(g, combine(g, op, a, x), acc, 8);
	}
	cg_loop_end(g, &L);
	V r = load(g, t, acc, 8);
	if (lo)
		*lo = load(g, t, acc_lo, 8);
	cg_barrier(g);
	return r;
}

/* Two sums of one type (var_mean's s1 and s2) across the threads that
 * share a row, in one round: the shuffles of both at each step, and one
 * pair of barriers where two calls of across_threads take two pairs. */
static void across_threads_two(cg *g, rows *R, V *v)
{
	if (R->par == FZ_PAR_THREAD)
		return;
	for (int m = 16; m >= 1; m /= 2)
		for (int i = 0; i < 2; i++)
			v[i] = combine(g, FZ_OP_SUM, v[i], cg_shfl_bfly(g, v[i], m));
	if (R->par == FZ_PAR_WARP)
		return;
	T t = type_of(v[0]);
	V nw = warps_to_smem(g, t, v, 2);
	V acc[2];
	for (int i = 0; i < 2; i++) {
		acc[i] = cg_entry_alloca(g, t);
		store(g, c_real(t, 0.0), acc[i], 8);
	}
	cg_loop L;
	cg_loop_begin(g, &L, c_int(g->ity, 0), nw, c_int(g->ity, 1));
	for (int i = 0; i < 2; i++)
		store(g, combine(g, FZ_OP_SUM, load(g, t, acc[i], 8),
				 load(g, t, smem_slot(g, t, i, L.iv, false), 4)), acc[i], 8);
	cg_loop_end(g, &L);
	for (int i = 0; i < 2; i++)
		v[i] = load(g, t, acc[i], 8);
	cg_barrier(g);
}

/* ---- even and odd lanes (host) ---------------------------------------------------
 * pointwise.c's even and odd lanes, for a row: where every input and
 * output that runs along the row is 16 bits wide and a step's L lanes
 * fill one register's bytes in memory (16 bf16 on AVX2), lane l of a step
 * is element cg_lane_elem(L, l) of it, so that the step loads as one
 * vector of 32-bit words (the even lanes its low halves shifted up, the
 * odd ones its high halves masked) and stores by a shift and a blend,
 * where in order each half took a vpmovzxwd and a shift, and a store two
 * shifts, a pack and a permutation across the register's halves. Every
 * lane keeps its element's index (the pick compares them, iota follows),
 * each pass reads the same lanes the same way and the scratch holds them
 * in that order, so only the order of a sum's terms changes: its lanes
 * add other elements than before, and round at other places, within the
 * sum's error bound. A value that runs along the row is told by its last
 * extent (the row's): a per-row value of that length too (rows as many as
 * their length) only turns the order off. Not with AVX-512, whose step of
 * 16 is one register (see pointwise.c). */
static bool row_even_odd(cg *g, const rows *R)
{
	return R->L * 2 == g->c->vector_bytes &&
	       cg_even_odd(g, R->L, &R->D->dims[R->D->rank - 1]);
}

/* The full domain index of lanes at reduced position jb (+ l, or in even
 * and odd order). */
static void row_lanes(cg *g, rows *R, V jb, cg_ix (*ix)[FZ_MAX_RANK])
{
	cg_ix rj[FZ_MAX_RANK];
	cg_delinearize(g, &R->rt, jb, R->L, rj);
	for (int l = 0; l < R->L; l++) {
		for (int d = 0; d < R->D->rank; d++)
			if (!R->red[d])
				ix[l][d] = g->row[d];
		for (int i = 0; i < R->rt.rank; i++)
			ix[l][R->rd[i]] = rj[i];
		if (l > 0)
			ix[l][R->rd[R->rt.rank - 1]].o += R->eo ? cg_lane_elem(R->L, l) : l;
	}
}

/* The loop over a row's elements for this thread: body(ix) per step. */
static void row_loop_begin(cg *g, rows *R, cg_loop *L)
{
	V start = mul(g, R->tid_in_row, c_int(g->ity, R->L));
	V step = mul(g, R->nthr, c_int(g->ity, R->L));
	cg_loop_begin(g, L, start, R->count, step);
}

/* The row in registers: this thread's steps, their lane indices and
 * whether they lie in the row, built once per row. A step past the row's
 * end reads element 0 instead (a valid address) and is masked. */
static void row_regs(cg *g, rows *R)
{
	int64_t nthr = LLVMConstIntGetZExtValue(R->nthr), G;
	V base = mul(g, R->tid_in_row, c_int(g->ity, R->L));
	G = LLVMConstIntGetZExtValue(R->count) / R->L;
	for (int k = 0; k < R->S; k++) {
		V jb = add(g, base, c_int(g->ity, k * nthr * R->L));
		R->valid[k] = NULL;
		if ((k + 1) * nthr > G) {
			R->valid[k] = icmp(g, LLVMIntULT, jb, R->count);
			jb = sel(g, R->valid[k], jb, c_int(g->ity, 0));
		}
		row_lanes(g, R, jb, &R->ix[k * R->L]);
	}
}

/* A pass's accumulators, one per lane: hi (and lo for float sums). On the
 * host the lanes are one vector (vt, in hi[0] and lo[0]): the steps add a
 * vector of lanes to a vector of sums, the form the SLP vectorizer gives
 * up on when it has to find it in the lanes' scalar chains. */
typedef struct accum {
	fz_opcode op;
	T t, vt;               /* vt: <L x t> on the host, else NULL */
	bool pair;
	bool wide;             /* a float sum of f32 values kept in f64 */
	V hi[FZ_VW_MAX], lo[FZ_VW_MAX];
} accum;

/* f64 adds at half the rate of f32 ones or better: the host, and the
 * GPUs with full f64 units (sm_70 V100, sm_80 A100, sm_90 H100 and H200;
 * the others run f64 at 1/32 or 1/64 of f32). See "wide sums". */
static bool fast_f64(const cg *g)
{
	if (g->o.target == FZ_CG_HOST)
		return true;
	return g->o.sm == 70 || g->o.sm == 80 || g->o.sm == 90;
}

/* An accumulator's lanes for op over values of type t: wide (f32 summed
 * in f64), a pair (hi, lo), and the type each part holds. */
static T acc_layout(cg *g, const rows *R, fz_opcode op, T t, bool *wide, bool *pair)
{
	*wide = fast_f64(g) && !R->pairs && op == FZ_OP_SUM && t == t_f32(g);
	if (*wide)
		t = t_f64(g);
	*pair = op == FZ_OP_SUM && t != t_i64(g) && !*wide;
	return t;
}

static void acc_init(cg *g, rows *R, accum *A, fz_opcode op, T t)
{
	A->op = op;
	bool host = g->o.target == FZ_CG_HOST;
	A->t = t = acc_layout(g, R, op, t, &A->wide, &A->pair);
	A->vt = host && R->L > 1 ? t_vec(t, (unsigned)R->L) : NULL;
	if (A->vt) {
		A->hi[0] = cg_entry_alloca(g, A->vt);
		store(g, c_splat(identity(g, op, t), R->L), A->hi[0], 8);
		if (A->pair) {
			A->lo[0] = cg_entry_alloca(g, A->vt);
			store(g, c_splat(c_real(t, 0.0), R->L), A->lo[0], 8);
		}
		return;
	}
	for (int l = 0; l < R->L; l++) {
		A->hi[l] = cg_entry_alloca(g, t);
		store(g, identity(g, op, t), A->hi[l], 8);
		if (A->pair) {
			A->lo[l] = cg_entry_alloca(g, t);
			store(g, c_real(t, 0.0), A->lo[l], 8);
		}
	}
}

/* x in every lane. */
static V bcast(cg *g, T vt, V x, int n)
{
	V xs[FZ_VW_MAX];
	for (int l = 0; l < n; l++)
		xs[l] = x;
	return pack(g, vt, xs, n);
}

/* Lane l takes v (and, for a pair, the extra low part e, or NULL); on the
 * host (A->vt) l is 0 and v, e are vectors of every lane. */
static void acc_add(cg *g, accum *A, int l, V v, V e)
{
	T t = A->vt ? A->vt : A->t;
	V a = load(g, t, A->hi[l], 8);
	if (!A->pair) {
		store(g, combine(g, A->op, a, v), A->hi[l], 8);
		return;
	}
	V err;
	store(g, two_sum(g, a, v, &err), A->hi[l], 8);
	V lo = fadd_exact(g, load(g, t, A->lo[l], 8), err);
	store(g, e ? fadd_exact(g, lo, e) : lo, A->lo[l], 8);
}

/* b's sums into a's (accumulators that took turns over a row). */
static void acc_merge(cg *g, rows *R, accum *a, const accum *b)
{
	T t = a->vt ? a->vt : a->t;
	for (int l = 0; l < (a->vt ? 1 : R->L); l++) {
		V h1 = load(g, t, a->hi[l], 8), h2 = load(g, t, b->hi[l], 8);
		if (!a->pair) {
			store(g, combine(g, a->op, h1, h2), a->hi[l], 8);
			continue;
		}
		V lo;
		V h = pair_add(g, h1, load(g, t, a->lo[l], 8), h2, load(g, t, b->lo[l], 8), &lo);
		store(g, h, a->hi[l], 8);
		store(g, lo, a->lo[l], 8);
	}
}

/* This thread's total of the n accumulators that took turns over its part
 * of the row: merged in a tree, the lanes combined in a tree; a pair's low
 * part in *lo (NULL for other ops, 0 for a wide sum). */
static V acc_lanes(cg *g, rows *R, accum *As, int n, V *lo)
{
	for (int w = 1; w < n; w *= 2)
		for (int i = 0; i + w < n; i += 2 * w)
			acc_merge(g, R, &As[i], &As[i + w]);
	accum *A = &As[0];
	V h[FZ_VW_MAX] = {NULL}, l[FZ_VW_MAX] = {NULL};
	if (A->vt) {
		V hv = load(g, A->vt, A->hi[0], 8);
		V lv = A->pair ? load(g, A->vt, A->lo[0], 8) : NULL;
		for (int i = 0; i < R->L; i++) {
			h[i] = extract(g, hv, (unsigned)i);
			l[i] = lv ? extract(g, lv, (unsigned)i) : NULL;
		}
	}
	for (int i = 0; i < R->L && !A->vt; i++) {
		h[i] = load(g, A->t, A->hi[i], 8);
		l[i] = A->pair ? load(g, A->t, A->lo[i], 8) : NULL;
	}
	for (int w = 1; w < R->L; w *= 2)
		for (int i = 0; i + w < R->L; i += 2 * w)
			h[i] = A->pair ? pair_add(g, h[i], l[i], h[i + w], l[i + w], &l[i]) :
			       combine(g, A->op, h[i], h[i + w]);
	*lo = A->wide ? c_real(A->t, 0.0) : l[0];
	return h[0];
}

/* The row's result: acc_lanes, then across the threads. */
static V acc_finish(cg *g, rows *R, accum *As, int n, V *lo)
{
	V h = acc_lanes(g, R, As, n, lo);
	return across_threads(g, R, As[0].op, h, As[0].pair ? lo : NULL);
}

/* Lanes vals of one step into A; with a mean (mh + ml, var_mean's second
 * pass) each lane adds its squared deviation, computed as a pair too:
 * d + de = x - mh - ml, d^2 = p + pe (fma), (d + de)^2 ~ p + (pe + 2 d de).
 * A wide sum (f32 values in f64) takes x, or (x - (mh + ml))^2 by
 * one fma, in f64: exact enough that no pair is needed. */
static void acc_step(cg *g, rows *R, accum *A, V *vals, V valid, V mh, V ml)
{
	if (A->wide && A->vt) {
		/* host: a vector of every lane, never masked */
		int L = R->L;
		T t = A->vt;
		V v = fpext(g, pack(g, t_vec(type_of(vals[0]), (unsigned)L), vals, L), t);
		if (mh) {
			V m = fadd_exact(g, fpext(g, mh, A->t), fpext(g, ml, A->t));
			V d = fsub_exact(g, v, bcast(g, t, m, L));
			V fa[3] = {d, d, load(g, t, A->hi[0], 8)};
			store(g, call_intrinsic(g, "llvm.fma", t, t, fa, 3), A->hi[0], 8);
			return;
		}
		acc_add(g, A, 0, v, NULL);
		return;
	}
	if (A->wide) {
		/* lane by lane (GPU; the host's scalar rows), a lane outside
		 * the row adding 0 */
		V zero = c_real(A->t, 0.0);
		V m = mh ? fadd_exact(g, fpext(g, mh, A->t), fpext(g, ml, A->t)) : NULL;
		for (int l = 0; l < R->L; l++) {
			V v = fpext(g, vals[l], A->t);
			if (m)
				v = fsub_exact(g, v, m);
			if (valid)
				v = sel(g, valid, v, zero);
			V a = load(g, A->t, A->hi[l], 8);
			V fa[3] = {v, v, a};
			store(g, m ? call_intrinsic(g, "llvm.fma", A->t, A->t, fa, 3) :
				     combine(g, A->op, a, v), A->hi[l], 8);
		}
		return;
	}
	if (A->vt && !valid) {
		/* the same arithmetic on a vector of the lanes */
		int L = R->L;
		V v = pack(g, A->vt, vals, L), e = NULL;
		if (mh) {
			V de;
			V mhv = bcast(g, A->vt, mh, L), mlv = bcast(g, A->vt, ml, L);
			V d = two_sum(g, v, fneg(g, mhv), &de);
			de = fsub_exact(g, de, mlv);
			v = fmul_exact(g, d, d);
			V fa[3] = {d, d, fneg(g, v)};
			e = call_intrinsic(g, "llvm.fma", A->vt, A->vt, fa, 3);
			e = fadd(g, e, fmul(g, fmul(g, d, de), c_splat(c_real(A->t, 2.0), L)));
		}
		acc_add(g, A, 0, v, e);
		return;
	}
	for (int l = 0; l < R->L; l++) {
		V v = vals[l], e = NULL;
		if (mh) {
			V de;
			V d = two_sum(g, v, fneg(g, mh), &de);
			de = fsub_exact(g, de, ml);
			v = fmul_exact(g, d, d);
			V fa[3] = {d, d, fneg(g, v)};
			e = call_intrinsic(g, "llvm.fma", A->t, A->t, fa, 3);
			e = fadd(g, e, fmul(g, fmul(g, d, de), c_real(A->t, 2.0)));
		}
		if (valid) {
			V zero = identity(g, A->op, A->t);
			v = sel(g, valid, v, zero);
			if (e)
				e = sel(g, valid, e, c_real(A->t, 0.0));
		}
		acc_add(g, A, l, v, e);
	}
}

#define STASH_WALK 256 /* nodes a walk over a region's expression visits */

static bool region_input(const cg *g, const fz_value *v)
{
	int s = g->slot[v->id];
	return s >= 0 && s < g->r->n_in;
}

/* v's node, where a walk down the region's expression goes on past v: v
 * is neither an input of the region nor a reduced value, and the walk's
 * *budget is not spent (NULL otherwise) */
static const fz_node *inner(const cg *g, const fz_value *v, int *budget)
{
	if (--*budget < 0 || !v->def || region_input(g, v) || g->is_red[v->id])
		return NULL;
	return v->def;
}

/* v's expression, down to the region's inputs and reduced values, has a
 * transcendental op in it (pass() and the stash below ask) */
static bool costly(const cg *g, const fz_value *v, int *budget)
{
	const fz_node *n = inner(g, v, budget);
	if (!n)
		return false;
	if (cg_math_costly(n->op))
		return true;
	for (int i = 0; i < n->n_in; i++)
		if (costly(g, n->in[i], budget))
			return true;
	return false;
}

/* v >= 0 (or NaN) for every element: an exp, a square (mul(a, a), or
 * pow(a, 2) as Hugging Face's RMS norms write it), an abs, a sqrt, and
 * float casts of them (a walk of at most *budget nodes) */
static bool nonneg(const cg *g, const fz_value *v, int *budget)
{
	const fz_node *n = inner(g, v, budget);
	if (!n)
		return false;
	switch (n->op) {
	case FZ_OP_EXP: case FZ_OP_EXP2: case FZ_OP_ABS: case FZ_OP_SQRT:
		return true;
	case FZ_OP_MUL:
		return n->in[0] == n->in[1];
	case FZ_OP_POW: {
		const fz_node *e = n->in[1]->def;
		while (e && e->op == FZ_OP_BROADCAST_IN_DIM && --*budget >= 0)
			e = e->in[0]->def;
		return e && e->op == FZ_OP_FULL && e->attrs.value_sym < 0 &&
		       fmod(e->attrs.value, 2.0) == 0.0;
	}
	case FZ_OP_CAST:
		return fz_dtype_is_float(n->in[0]->type.dtype) && nonneg(g, n->in[0], budget);
	default:
		return false;
	}
}

/* One pass: op-accumulate x over the row, or x's squared deviations from
 * mh + ml. The result; a float sum's low part in *lo.
 *
 * On the host a pass is a loop whose steps are vectors of L lanes, and
 * FZ_HOST_ACCS accumulators take turns (fewer where their lanes fill more
 * registers: acc_turns): one accumulator makes every step wait for the
 * last one's add (3 to 4 cycles, where the core could start two adds per
 * cycle); the row's last steps, fewer than a turn, go to the first. A
 * pass over a costly value (an exp per element: softmax's sum)
 * has work enough between its adds, and needs the registers: it keeps
 * one (four f64 accumulators of 8 lanes are half of AVX2's registers,
 * and the math spilled).
 *
 * A wide sum pays for widening every step: 16 f32 lanes become f64 by two
 * vcvtps2pd and an extract, five uops on the ports the math needs, where
 * an f32 add is one. A sum that cannot cancel, of terms never negative
 * (nonneg(): softmax's and cross entropy's exps, rms_norm's squares),
 * adds a turn of FZ_HOST_ACCS steps in f32 first, as a tree (the block),
 * and widens the block's sum once: each block errs by at most 2 ulp of
 * f32 of its own sum, so the row's sum, in f64 from there, by at most 2
 * ulp of itself (every term >= 0) before its one rounding to f32. One f64
 * accumulator then takes the blocks, costly or not (a costly pass so
 * computes four steps' exps side by side). At one thread
 * (tools/bench/kernel_ab.py, CPU time): softmax f32 4096x2048 7.9 -> 6.3
 * ms, cross_entropy 65 -> 54, rms_norm bf16 4096^2 4.9 -> 3.9. The cost:
 * rms_norm's bf16 result, bit for bit the interpreter's before, now
 * rounds to the other neighbour in one element of its 16 million (0.24
 * of the check's tolerance). */
#define FZ_HOST_ACCS 4

/* How many accumulators take turns: FZ_HOST_ACCS, or as many as fit in
 * half of AVX2's 16 vector registers. A step's 16 lanes of an f64 sum
 * (a bf16 row's in even and odd order) are four registers and already
 * four chains of adds: four such accumulators took every register, and
 * layer_norm's mean pass spilled them in every step. */
static int acc_turns(cg *g, const rows *R, fz_opcode op, T t)
{
	bool wide, pair;
	T e = acc_layout(g, R, op, t, &wide, &pair);
	int bytes = R->L * (pair ? 2 : 1) *
		    (int)LLVMABISizeOfType(LLVMGetModuleDataLayout(g->mod), e);
	int regs = (bytes + g->c->vector_bytes - 1) / g->c->vector_bytes;
	int n = 8 / (regs > 0 ? regs : 1);
	return n < 1 ? 1 : n > FZ_HOST_ACCS ? FZ_HOST_ACCS : n;
}

static void scratch_put(cg *g, rows *R, V pos, const V *vals);
static void scratch_get(cg *g, rows *R, const fz_value *v, V pos, cg_ix (*ix)[FZ_MAX_RANK]);

/* Reads back what a pass stored at the step at row position pos (lanes
 * ix): v's values, from the scratch or from output o. */
static void reload_at(cg *g, rows *R, const fz_value *v, const fz_value *o, V pos,
		      cg_ix (*ix)[FZ_MAX_RANK])
{
	if (R->scratch)
		scratch_get(g, R, v, pos, ix);
	else
		cg_value_reload(g, v, o, R->L, ix);
}

/* A pass's store of o's values at the step at row position pos. */
static void stash_at(cg *g, rows *R, const fz_value *o, V pos, cg_ix (*ix)[FZ_MAX_RANK],
		     V *vals)
{
	if (R->scratch)
		scratch_put(g, R, pos, vals);
	else
		cg_store(g, o, R->L, ix, vals);
}

/* The keep's store in the last pass: o at the step's lanes (what computing
 * x computed already, from the emitter's memo). */
static void keep_store(cg *g, rows *R, V pos, cg_ix (*ix)[FZ_MAX_RANK])
{
	V kv[FZ_VW_MAX];
	cg_value(g, R->keep_o, R->L, ix, kv);
	stash_at(g, R, R->keep_o, pos, ix, kv);
}

/* ---- the prefetch (host) ---------------------------------------------------------
 * A row's first pass reads it from memory and the passes after it, the
 * tail last, compute from the cache; the hardware prefetcher, which follows
 * the first pass's misses, has stopped by then, so each row's first pass
 * waited for memory with nothing to compute, and the computing passes with
 * nothing to fetch. The tail now prefetches, for every input of the
 * domain's shape with rows along its innermost dims, what the first pass
 * will read next: the same position R->ahead elements on (the next row,
 * or the rows that make 4096 elements), one prefetcht0 a step. So the
 * next row's fetch overlaps this row's tail. At one thread with the rows
 * in L3 (tools/bench/kernel_ab.py, CPU time): rms_norm bf16 4096^2 5.3 ->
 * 4.9 ms, softmax f32 4096x2048 8.3-9.2 -> 6.7-6.9 ms; from memory
 * (cpu_bench.py --cold, two threads, medians of three runs on a machine
 * whose bandwidth wandered): rms_norm 4.9 -> 4.2 ms, layer_norm 2.1 -> 1.8,
 * cross_entropy 38 -> 31. Prefetching in the passes between (softmax's
 * exp) did not pay. A prefetch never faults, so the last rows' run past
 * the buffer's end: the address is made without inbounds. */
static void prefetch_ahead(cg *g, rows *R, cg_ix (*ix)[FZ_MAX_RANK])
{
	for (int i = 0; R->ahead && i < g->r->n_in; i++) {
		const fz_value *v = g->r->in[i];
		if (!fz_same_shape(&v->type, R->D))
			continue;
		cg_ix lin;
		cg_linear(g, &v->type, ix[0], &lin);
		V off = add(g, cg_ix_value(g, lin), R->ahead);
		V p = LLVMBuildGEP2(g->b, cg_stype(g, v->type.dtype), g->buf[g->slot[v->id]],
				    &off, 1, "");
		prefetch(g, p);
	}
}

/* One pass over the row: op over x (with mh, ml: var_mean's squared
 * deviations from mh + ml) into the row's result, a pair's low part in
 * *lo; stash: an output the pass stores x in; reload: an output it reads
 * back instead of computing it. With sq (the host's looping passes, a
 * wide sum of f32 x), the pass also sums x^2 in f64 into *sq (see
 * "var_mean in one pass"). */
static V pass(cg *g, rows *R, fz_opcode op, const fz_value *x, V mh, V ml, V *lo,
	      const fz_value *stash, const fz_value *reload, V *sq)
{
	int no = R->npass++;
	bool keep = R->keep_o && no == R->keep_pass;
	if (R->keep_o && no > R->keep_pass) /* the scratch has it: see "the keep" */
		reload = R->keep_o;
	accum A[FZ_HOST_ACCS];
	T t = cg_ctype(g, x->type.dtype);
	V vals[FZ_VW_MAX];
	cg_ix ix[FZ_VW_MAX][FZ_MAX_RANK];
	int budget = STASH_WALK, nb = STASH_WALK;
	bool host = g->o.target == FZ_CG_HOST;
	bool block = host && R->L > 1 && !R->S && op == FZ_OP_SUM && !mh && t == t_f32(g) &&
		     !sq && nonneg(g, x, &nb);
	/* two sums of 16 f64 lanes are 8 of AVX2's 16 registers: one
	 * accumulator each */
	int n = !host || sq ? 1 : block ? FZ_HOST_ACCS : costly(g, x, &budget) ? 1 :
		acc_turns(g, R, op, t);
	int na = block ? 1 : n; /* accumulators */
	for (int i = 0; i < na; i++)
		acc_init(g, R, &A[i], op, t);
	accum Q; /* x^2, with sq */
	V zero = NULL;
	if (sq) {
		zero = c_real(t, 0.0);
		acc_init(g, R, &Q, FZ_OP_SUM, t);
		FZ_ASSERT(Q.wide && A[0].wide && !mh);
	}
	if (R->S) {
		FZ_ASSERT(!sq); /* the row in registers: var_mean_once */
		for (int k = 0; k < R->S; k++) {
			cg_value(g, x, R->L, &R->ix[k * R->L], vals);
			acc_step(g, R, &A[0], vals, R->valid[k], mh, ml);
		}
		return acc_finish(g, R, A, na, lo);
	}
	V rest = c_int(g->ity, 0);
	if (n > 1) {
		/* host: R's threads are one (tid_in_row 0, nthr 1) */
		V turn = c_int(g->ity, n * R->L);
		rest = mul(g, udiv(g, R->count, turn), turn);
		cg_loop M;
		cg_loop_begin(g, &M, c_int(g->ity, 0), rest, turn);
		T bt = t_vec(t, (unsigned)R->L);
		V blk[FZ_HOST_ACCS];
		for (int i = 0; i < n; i++) {
			V pos = add(g, M.iv, c_int(g->ity, i * R->L));
			row_lanes(g, R, pos, ix);
			if (reload)
				reload_at(g, R, reload, R->stash_o ? R->stash_o : reload, pos, ix);
			cg_value(g, x, R->L, ix, vals);
			if (block)
				blk[i] = pack(g, bt, vals, R->L);
			else
				acc_step(g, R, &A[i], vals, NULL, mh, ml);
			if (stash)
				stash_at(g, R, stash, pos, ix, vals);
			if (keep)
				keep_store(g, R, pos, ix);
		}
		if (block) {
			for (int w = 1; w < n; w *= 2)
				for (int i = 0; i + w < n; i += 2 * w)
					blk[i] = fadd(g, blk[i], blk[i + w]);
			V bv[FZ_VW_MAX];
			for (int l = 0; l < R->L; l++)
				bv[l] = extract(g, blk[0], (unsigned)l);
			acc_step(g, R, &A[0], bv, NULL, NULL, NULL);
		}
		cg_loop_end(g, &M);
	}
	cg_loop L;
	if (n > 1)
		cg_loop_begin(g, &L, rest, R->count, c_int(g->ity, R->L));
	else
		row_loop_begin(g, R, &L);
	row_lanes(g, R, L.iv, ix);
	if (reload)
		reload_at(g, R, reload, R->stash_o ? R->stash_o : reload, L.iv, ix);
	cg_value(g, x, R->L, ix, vals);
	acc_step(g, R, &A[0], vals, NULL, mh, ml);
	if (sq)
		acc_step(g, R, &Q, vals, NULL, zero, zero); /* (x - 0)^2 */
	if (stash)
		stash_at(g, R, stash, L.iv, ix, vals);
	if (keep)
		keep_store(g, R, L.iv, ix);
	cg_loop_end(g, &L);
	if (sq)
		*sq = acc_finish(g, R, &Q, 1, &(V){NULL});
	return acc_finish(g, R, A, na, lo);
}

/* hi + lo rounded once, in rt (the type of the values summed); divided by
 * den (or not, NULL) in f64 for f32 data and rounded once, as the
 * interpreter divides its f64 sum. A wide sum's hi is f64 already. */
static V pair_value(cg *g, V hi, V lo, V den, T rt)
{
	if (rt != t_f32(g))
		return den ? fdiv(g, pair_sum(g, hi, lo, rt), den) : pair_sum(g, hi, lo, rt);
	if (!den && type_of(hi) == rt)
		return pair_sum(g, hi, lo, rt);
	T d = t_f64(g);
	V s = pair_sum(g, hi, lo, d);
	return fptrunc(g, den ? fdiv(g, s, fpext(g, den, d)) : s, rt);
}

/* The f64 mean m64 of f32 data as mh + ml, two f32s (ml 0 where m64 is
 * not finite), so that the deviations are taken from the mean the
 * interpreter uses */
static void mean_split(cg *g, V m64, V *mh, V *ml)
{
	T t = t_f32(g);
	*mh = fptrunc(g, m64, t);
	V l = fptrunc(g, fsub_exact(g, m64, fpext(g, *mh, t_f64(g))), t);
	*ml = sel(g, fcmp(g, LLVMRealORD, l, l), l, c_real(t, 0.0));
}

/* var_mean's divisor in t: the count less the correction, at least 0 */
static V var_den(cg *g, const fz_node *n, V cnt, T t)
{
	V dv = fsub(g, cnt, c_real(t, (double)n->attrs.correction));
	return sel(g, fcmp(g, LLVMRealOGT, dv, c_real(t, 0.0)), dv, c_real(t, 0.0));
}

/* ---- var_mean in one pass -----------------------------------------------------
 * On a GPU with fast f64 and the row in registers, var_mean takes the sum
 * s1 and the sum of squares s2 of the row in one pass, in f64 (a square
 * of an f32 is exact there), and the deviations' sum as
 * m2 = s2 - s1 (s1 / n) by one fma: one conversion, one add and one fma a
 * term, one round of the threads for both sums (across_threads_two: two
 * barriers, where a round each took four), and no f64 copy of the row
 * held from one pass to the next (which took 124 registers a thread in
 * bf16 layer_norm over rows of 8192, and 2 blocks an SM where 4 fit).
 *
 * The form cancels: m2 errs by about c 2^-53 s2, c the depth of the sums
 * (a thread's steps, its lanes, the threads: 15 at 8192 bf16), where
 * s2 = m2 + n mean^2. So it is taken only where m2 >= s2 / 16 (the mean
 * at most sqrt(15) deviations from 0), which bounds its relative error
 * by 16 c 2^-53, about 2^-45: its rounding to f32 is the exact variance's
 * but within 2^-22 of an ulp of a boundary, as the two-pass sum's is.
 * Other rows (a far mean, a constant row, inf or NaN, where the compare
 * fails) take the exact second pass in (hi, lo) pairs from the registers,
 * a branch every thread of the row takes alike. The mean is s1 / n, as
 * the two-pass form's.
 *
 * The host takes the same form in its first looping pass (pass() with
 * sq: one f64 accumulator for each sum, 8 of AVX2's 16 registers), and
 * the second pass, wide, only for the rows that fail the compare: a
 * bf16 add + layer_norm over rows of 4096 went from 101 instructions for
 * 16 elements in three loops to 80 in two. Where the keep (below) would
 * be stored by the second pass (no scratch), var_mean keeps both passes.
 * At one thread from memory (tools/bench/kernel_ab.py, CPU time, medians
 * of 9): add + layer_norm bf16 2048x4096 6.38 -> 5.54 ms, layer_norm f32
 * 2048x1600 1.98 -> 1.74. The depth c on the host is a row's steps (256
 * at 4096 bf16) and its 16 lanes: 16 c 2^-53 is 2^-37. */

/* var_mean's variance, rounded to its dtype, from one pass's f64 sums s1
 * of x and s2 of x^2 (m64 = s1 / n) as m2 = s2 - s1 m64 by one fma where
 * that form is exact enough (m2 >= s2 / 16: see above), else from an
 * exact second pass over x from the mean mh + ml (in pairs where the row
 * is in a GPU's registers, wide on the host), a branch the whole row
 * takes. np: R->npass before the first pass; both ways count two. */
static V var_once_or_pass(cg *g, rows *R, const fz_node *n, V s1, V s2, V m64, V mh, V ml,
			  V dv, int np)
{
	T t = t_f32(g), w = t_f64(g);
	fz_dtype d = n->out[0]->type.dtype;
	V fa[3] = {fneg(g, s1), m64, s2};
	V m2 = call_intrinsic(g, "llvm.fma", w, w, fa, 3);
	V fast = cg_round_half(g, pair_value(g, m2, c_real(w, 0.0), dv, t), d);
	V ok = fcmp(g, LLVMRealOGE, fmul_exact(g, m2, c_real(w, 16.0)), s2);
	LLVMBasicBlockRef pre = current(g), sb = block(g, "var.pass"),
			  join = block(g, "var.done");
	cond_br(g, ok, join, sb);
	at_end(g, sb);
	int mark = cg_memo_mark(g), cse = g->n_cse;
	V lo;
	R->pairs = R->S > 0;
	R->npass = np + 1;
	V p2 = pass(g, R, FZ_OP_SUM, n->in[0], mh, ml, &lo, NULL, NULL, NULL);
	R->pairs = false;
	V slow = cg_round_half(g, pair_value(g, p2, lo, dv, t), d);
	LLVMBasicBlockRef end = current(g);
	br(g, join);
	at_end(g, join);
	cg_memo_pop(g, mark); /* what the branch computed lives there */
	g->n_cse = cse;
	V var = phi(g, type_of(fast));
	phi_add(var, fast, pre);
	phi_add(var, slow, end);
	R->npass = np + 2;
	return var;
}

static void var_mean_once(cg *g, rows *R, const fz_node *n, V cnt)
{
	const fz_value *x = n->in[0];
	fz_dtype d = n->out[0]->type.dtype;
	T t = t_f32(g), w = t_f64(g);
	accum A1, A2;
	acc_init(g, R, &A1, FZ_OP_SUM, t);
	acc_init(g, R, &A2, FZ_OP_SUM, t);
	FZ_ASSERT(A1.wide && A2.wide); /* fast_f64: no lo to carry */
	V zero = c_real(t, 0.0), vals[FZ_VW_MAX], lo;
	int np = R->npass;
	for (int k = 0; k < R->S; k++) {
		cg_value(g, x, R->L, &R->ix[k * R->L], vals);
		acc_step(g, R, &A1, vals, R->valid[k], NULL, NULL);
		acc_step(g, R, &A2, vals, R->valid[k], zero, zero); /* (x - 0)^2 */
	}
	V s[2] = {acc_lanes(g, R, &A1, 1, &lo), acc_lanes(g, R, &A2, 1, &lo)};
	across_threads_two(g, R, s);
	V m64 = fdiv(g, s[0], uitofp(g, R->count, w));
	V mh, ml; /* ml: the exact second pass's alone */
	mean_split(g, m64, &mh, &ml);
	g->red[n->out[0]->id] = var_once_or_pass(g, R, n, s[0], s[1], m64, mh, ml,
						 var_den(g, n, cnt, t), np);
	g->red[n->out[1]->id] = cg_round_half(g, mh, d);
}

static void reduce_node(cg *g, rows *R, const fz_node *n, int k)
{
	const fz_value *x = n->in[0];
	if (n->op == FZ_OP_AMAX || n->op == FZ_OP_AMIN)
		cg_flag_error(g, n, icmp(g, LLVMIntEQ, R->count, c_int(g->ity, 0)));
	fz_dtype d = n->out[0]->type.dtype;
	V lo = NULL;
	if (n->op != FZ_OP_VAR_MEAN) {
		V r = pass(g, R, n->op, x, NULL, NULL, &lo,
			   n == R->stash_by || R->chained ?
			   (R->stash_o ? R->stash_o : R->stash_v) : NULL,
			   R->chained ? R->chain[k] : NULL, NULL);
		T rt = cg_ctype(g, x->type.dtype);
		/* an integer sum accumulates in i64 and is a value of its
		 * dtype: u8, i8, i32 wrap before the region uses it */
		g->red[n->out[0]->id] = fz_dtype_is_float(d) ?
			cg_round_half(g, lo ? pair_value(g, r, lo, NULL, rt) : r, d) :
			cg_wrap_int(g, r, d);
		return;
	}
	/* the mean in f64 (f32 data) and split into mh + ml (mean_split) */
	T t = cg_ctype(g, x->type.dtype);
	V cnt = uitofp(g, R->count, t);
	if (R->S && t == t_f32(g) && fast_f64(g)) { /* the row in a GPU's registers */
		var_mean_once(g, R, n, cnt);
		return;
	}
	/* the host: one pass for both sums where the pass that stores the
	 * keep (if any) is this one or before it: the second pass, skipped
	 * on most rows, reads back what it stored */
	int np = R->npass;
	bool once = g->o.target == FZ_CG_HOST && t == t_f32(g) &&
		    (!R->keep_o || R->keep_pass <= np);
	V sq = NULL;
	V sh = pass(g, R, FZ_OP_SUM, x, NULL, NULL, &lo, NULL, NULL, once ? &sq : NULL);
	V mh, ml;
	if (t == t_f32(g)) {
		V s = pair_sum(g, sh, lo, t_f64(g));
		V m64 = fdiv(g, s, uitofp(g, R->count, t_f64(g)));
		mean_split(g, m64, &mh, &ml);
		if (once) {
			g->red[n->out[0]->id] = var_once_or_pass(g, R, n, s, sq, m64, mh, ml,
								 var_den(g, n, cnt, t), np);
			g->red[n->out[1]->id] = cg_round_half(g, mh, d);
			return;
		}
	} else {
		mh = fdiv(g, pair_sum(g, sh, lo, t), cnt);
		ml = c_real(t, 0.0);
	}
	V m2 = pass(g, R, FZ_OP_SUM, x, mh, ml, &lo, NULL, NULL, NULL);
	V dv = var_den(g, n, cnt, t);
	g->red[n->out[0]->id] = cg_round_half(g, pair_value(g, m2, lo, dv, t), d);
	g->red[n->out[1]->id] = cg_round_half(g, mh, d);
}

/* 1: o has the row's shape (ix filled), 2: D's shape, 0: neither. */
static int classify(cg *g, const rows *R, const fz_value *o, cg_ix *ix)
{
	const fz_type *ty = &o->type, *D = R->D;
	if (ty->rank == D->rank) {
		bool dom = true, row = true;
		for (int d = 0; d < D->rank; d++) {
			dom = dom && fz_ext_eq(ty->dims[d], D->dims[d]);
			row = row && (R->red[d] ? fz_ext_is_one(ty->dims[d]) :
				      fz_ext_eq(ty->dims[d], D->dims[d]));
		}
		if (dom)
			return 2;
		if (row) {
			for (int d = 0; d < D->rank; d++)
				ix[d] = R->red[d] ? cg_ix_zero() : g->row[d];
			return 1;
		}
		return 0;
	}
	if (ty->rank != R->kt.rank)
		return 0;
	for (int i = 0; i < R->kt.rank; i++) {
		if (!fz_ext_eq(ty->dims[i], R->kt.dims[i]))
			return 0;
		ix[i] = g->row[R->kd[i]];
	}
	return 1;
}

/* Whether the tail's store of output o could stream: o has D's shape
 * and is neither the keep nor the stash where they are in the output,
 * not the scratch (the tail does not store such a keep, and a stash's
 * lines are in the cache, written and read back: a streaming store
 * would write them out twice). */
static bool tail_streamable(cg *g, const rows *R, const fz_value *o)
{
	cg_ix tmp[FZ_MAX_RANK];
	return classify(g, R, o, tmp) == 2 &&
	       !((o == R->keep_o || o == R->stash_o) && !R->scratch);
}

/* How many outputs the tail stores and could stream */
static int tail_streams(cg *g, const rows *R)
{
	int n = 0;
	for (int i = 0; i < g->r->n_out; i++)
		n += tail_streamable(g, R, g->r->out[i]);
	return n;
}

/* The outputs of D's shape at one step's lanes, stored where valid (NULL:
 * always): the values are computed before the branch, so a later step or
 * output still finds them in the memo. */
static void tail_step(cg *g, rows *R, cg_ix (*ix)[FZ_MAX_RANK], V valid)
{
	const fz_region *r = g->r;
	V (*vals)[FZ_VW_MAX] = calloc((size_t)r->n_out, sizeof *vals);
	if (!vals) {
		cg_fail(g, FZ_ENOMEM, NULL, "out of memory");
		return;
	}
	for (int i = 0; i < r->n_out && g->st == FZ_OK; i++) {
		cg_ix tmp[FZ_MAX_RANK];
		if (classify(g, R, r->out[i], tmp) == 2)
			cg_value(g, r->out[i], R->L, ix, vals[i]);
	}
	int cse = g->n_cse;
	LLVMBasicBlockRef cont = NULL;
	if (valid) {
		LLVMBasicBlockRef st = block(g, "tail.st");
		cont = block(g, "tail.next");
		cond_br(g, valid, st, cont);
		at_end(g, st);
	}
	for (int i = 0; i < r->n_out && g->st == FZ_OK; i++) {
		cg_ix tmp[FZ_MAX_RANK];
		if (classify(g, R, r->out[i], tmp) == 2)
			cg_store(g, r->out[i], R->L, ix, vals[i]);
	}
	if (valid) {
		br(g, cont);
		at_end(g, cont);
		g->n_cse = cse; /* what the stores built lives in tail.st only */
	}
	free(vals);
}

/* ---- the stash (host) -----------------------------------------------------------
 * Softmax's tail is exp(x - max) / sum, and the sum's pass computed
 * exp(x - max) at every index already: on the host, where one thread
 * runs a whole row, the last pass stores what it reduces into an output
 * that the tail overwrites anyway, and the tail reads it back instead of
 * computing it again (exp twice per element was over a third of
 * softmax's time). Taken when:
 *   - the region's last reduction is not var_mean (one pass) and reduces
 *     a value v made in the region by a costly op (exp, log, tanh, ...:
 *     the store and the load must cost less than what they save);
 *   - an output o of the domain's shape and v's dtype is v through
 *     elementwise ops only, so the tail asks for v at its own index;
 *   - nothing the tail computes reads a region input of the domain's
 *     shape: a caller may hand a kernel an output over its input (in
 *     place), and the tail must not read what the stash overwrote.
 * What the tail reads back is its own value: the same expression at the
 * same index, rounded to v's dtype (o's) when it was made. No later pass
 * reads o, and the tail stores over every element of it. Each check
 * visits at most STASH_WALK nodes (a region is a few dozen). */

/* o is v through elementwise ops only */
static bool is_v_pointwise(const cg *g, const fz_value *o, const fz_value *v, int *budget)
{
	if (o == v)
		return true;
	const fz_node *n = inner(g, o, budget);
	if (!n)
		return false;
	fz_opclass c = fz_ops[n->op].cls;
	if (c != FZ_CLASS_UNARY && c != FZ_CLASS_BINARY && c != FZ_CLASS_TERNARY)
		return false;
	for (int i = 0; i < n->n_in; i++)
		if (is_v_pointwise(g, n->in[i], v, budget))
			return true;
	return false;
}

/* o's expression, v taken as given, reads an input of the domain's shape
 * (or the walk ran out: counted as reading one) */
static bool reads_domain_input(const cg *g, const rows *R, const fz_value *o,
			       const fz_value *v, int *budget)
{
	if (o == v || g->is_red[o->id])
		return false;
	if (--*budget < 0)
		return true;
	if (region_input(g, o)) {
		const fz_type *t = &o->type;
		bool dom = t->rank == R->D->rank;
		for (int d = 0; dom && d < t->rank; d++)
			dom = fz_ext_eq(t->dims[d], R->D->dims[d]);
		return dom;
	}
	if (!o->def)
		return false;
	for (int i = 0; i < o->def->n_in; i++)
		if (reads_domain_input(g, R, o->def->in[i], v, budget))
			return true;
	return false;
}

/* ---- the rescale (host) ----------------------------------------------------------
 * Cross-entropy's backward takes exp of log_softmax in its tail:
 * exp((x - max) - log(sum)), where the last pass summed exp(x - max) at
 * every index already. exp(y - c) = exp(y) * exp(-c): with exp(y) stashed
 * (v) and c one value per row, the tail multiplies by exp(-c), computed
 * once per row, instead of taking an exp per element again (a third of
 * the tail's instructions). Taken when the last pass's value v is
 * exp(y) in f32 or f64 (no rounding to a half type between), a node of
 * the tail is exp(sub(y, c)) of v's dtype with c constant along the
 * reduced dims (ir/onehot.h's walk), and the row is kept: in an output
 * (the stash's rule) or in the scratch (which then needs no streaming:
 * nothing else holds v).
 *
 * The product is within a few ulps of the exp itself where nothing
 * overflows or falls to subnormals: exp(-c) is in [2^-93, 1] for c in
 * [0, 64], and v * exp(-c) is then exact to 1.5 ulps past v's own error,
 * or below v where v is subnormal (an error under 2^-126 absolute). Two
 * cases are not: a row whose c is outside [0, 64] (or NaN), and a v that
 * overflowed (y > 88.7, where exp(y - c) may be finite). There the step
 * computes exp(y - c) itself: a branch per step, on the row's flag or
 * any lane of v infinite, that is never taken in log_softmax's tail
 * (y <= 0 and 0 <= c <= log n). NaN goes through the product as it goes
 * through the exp. Where y is x - amax(x) itself, the softmax's shift (the
 * max over a group that holds the element, broadcast back to it), v is at
 * most 1 or NaN, and the step tests the row's flag alone: the lanes' test
 * for infinity was 5 of the cross entropy tail's 30 instructions for 16
 * elements. */
#define RESCALE_MAX_C 64.0

/* y = sub(x, bcast(amax(x, keepdim))), the broadcast of the rank-keeping
 * max back to x's shape: y <= 0 or NaN at every element */
static bool shifted_by_max(const fz_value *y)
{
	const fz_node *s = y->def;
	if (!s || s->op != FZ_OP_SUB)
		return false;
	const fz_value *x = s->in[0], *m = s->in[1];
	while (m->def && m->def->op == FZ_OP_BROADCAST_IN_DIM &&
	       m->def->in[0]->type.rank == m->type.rank) {
		/* the identity's dims: each element sees its own group's max */
		for (int i = 0; i < m->type.rank; i++)
			if (m->def->attrs.dims[i] != i)
				return false;
		m = m->def->in[0];
	}
	const fz_node *a = m->def;
	return a && a->op == FZ_OP_AMAX && a->in[0] == x && m->type.rank == x->type.rank;
}

static bool leaf_in(void *g, const fz_value *v);
static bool made_from(const cg *g, const fz_value *v, const fz_value *o, int *budget);
static bool scratch_fits(cg *g, const rows *R, fz_dtype d, bool stream);

static const fz_node *rescale_find(cg *g, rows *R, const fz_value *v,
				   const fz_value **c)
{
	const fz_region *r = g->r;
	fz_dtype d = v->type.dtype;
	if (!v->def || v->def->op != FZ_OP_EXP || (d != FZ_F32 && d != FZ_F64))
		return NULL;
	const fz_value *y = v->def->in[0];
	for (int i = 0; i < r->n_nodes; i++) {
		const fz_node *n = r->nodes[i];
		const fz_value *z = n->op == FZ_OP_EXP ? n->in[0] : NULL;
		cg_ix tmp[FZ_MAX_RANK];
		if (!z || n->out[0] == v || n->out[0]->type.dtype != d ||
		    classify(g, R, n->out[0], tmp) != 2 || region_input(g, z) ||
		    !z->def || z->def->op != FZ_OP_SUB || z->def->in[0] != y)
			continue;
		bool inv = true;
		for (int k = 0; k < R->D->rank && inv; k++)
			inv = !R->red[k] || fz_invariant_along(z->def->in[1], k, leaf_in, g);
		bool used = false;
		for (int k = 0; k < r->n_out && inv && !used; k++) {
			int b = STASH_WALK;
			used = classify(g, R, r->out[k], tmp) == 2 &&
			       made_from(g, r->out[k], n->out[0], &b);
		}
		if (inv && used) {
			*c = z->def->in[1];
			return n;
		}
	}
	return NULL;
}

/* At the row, before the tail: exp(-c) and the row's flag. */
static void rescale_row(cg *g, rows *R)
{
	cg_ix ix[1][FZ_MAX_RANK];
	for (int k = 0; k < R->D->rank; k++)
		ix[0][k] = R->red[k] ? cg_ix_zero() : g->row[k];
	V c;
	cg_value(g, R->rescale_c, 1, ix, &c);
	T t = type_of(c);
	R->rescale_f = cg_math_unary(g, FZ_OP_EXP, fneg(g, c));
	V ok = and_(g, fcmp(g, LLVMRealOGE, c, c_real(t, 0.0)),
		    fcmp(g, LLVMRealOLE, c, c_real(t, RESCALE_MAX_C)));
	R->rescale_bad = xor_(g, ok, c_i1(g, 1));
}

/* In the tail's step at lanes ix (v memoized there by the reload): the
 * exp's lanes, as v * exp(-c) or, on the rare branch, computed. */
static void rescale_step(cg *g, rows *R, cg_ix (*ix)[FZ_MAX_RANK])
{
	int L = R->L;
	const fz_value *e = R->rescale_e->out[0];
	V v[FZ_VW_MAX], fast[FZ_VW_MAX], slow[FZ_VW_MAX];
	cg_value(g, R->stash_v, L, ix, v);
	T t = type_of(v[0]);
	V inf = c_real(t, INFINITY), bad = R->rescale_bad;
	for (int l = 0; l < L; l++) {
		fast[l] = fmul_exact(g, v[l], R->rescale_f);
		if (!R->rescale_le1)
			bad = or_(g, bad, fcmp(g, LLVMRealOEQ, v[l], inf));
	}
	LLVMBasicBlockRef pre = current(g), sb = block(g, "rescale.exp"),
			  join = block(g, "rescale.done");
	cond_br(g, bad, sb, join);
	at_end(g, sb);
	int mark = cg_memo_mark(g), cse = g->n_cse;
	cg_value(g, e, L, ix, slow);
	LLVMBasicBlockRef end = current(g);
	br(g, join);
	at_end(g, join);
	cg_memo_pop(g, mark); /* what the branch computed lives there */
	g->n_cse = cse;
	V out[FZ_VW_MAX];
	for (int l = 0; l < L; l++) {
		out[l] = phi(g, t);
		phi_add(out[l], fast[l], pre);
		phi_add(out[l], slow[l], end);
	}
	cg_value_given(g, e, L, ix, out);
}

static void stash_pick(cg *g, rows *R, const fz_node *last)
{
	const fz_region *r = g->r;
	const fz_value *v = last->in[0];
	int budget = STASH_WALK;
	if (last->op == FZ_OP_VAR_MEAN || !costly(g, v, &budget))
		return;
	const fz_value *o = NULL;
	for (int i = 0; i < r->n_out && !o; i++) {
		cg_ix tmp[FZ_MAX_RANK];
		const fz_value *c = r->out[i];
		int b1 = STASH_WALK;
		if (c->type.dtype == v->type.dtype && classify(g, R, c, tmp) == 2 &&
		    is_v_pointwise(g, c, v, &b1))
			o = c;
	}
	for (int i = 0; i < r->n_out && o; i++) {
		cg_ix tmp[FZ_MAX_RANK];
		int b2 = STASH_WALK;
		if (classify(g, R, r->out[i], tmp) == 2 &&
		    reads_domain_input(g, R, r->out[i], v, &b2))
			o = NULL;
	}
	const fz_value *c = NULL;
	const fz_node *e = rescale_find(g, R, v, &c);
	if (!o && !(e && scratch_fits(g, R, v->type.dtype, false)))
		return;
	R->stash_by = last;
	R->stash_v = v;
	R->stash_o = o; /* NULL: the scratch alone holds it */
	R->rescale_e = e;
	R->rescale_c = c;
	R->rescale_le1 = e && shifted_by_max(v->def->in[0]);
}

/* ---- the keep (host) ------------------------------------------------------------
 * An add + rms_norm with both results as outputs (h = x + r; y = norm(h))
 * computes h in every pass, the tail included, and stores it in the tail:
 * in bf16 that is two loads, two widenings, an add and a rounding per
 * element again, a third of the tail's instructions. On the host the last
 * pass stores such an output as it computes it, and the tail reads it
 * back (one load and a widening) and does not store it again. Taken when
 * there is neither a stash nor a chain, and
 *   - an output o of the domain's shape reads no reduced value (it is
 *     computed before any reduction of the row, the same in every pass),
 *     and the last reduction's operand is made from it (the last pass
 *     computes it anyway);
 *   - no other output, o taken as given, reads a region input of the
 *     domain's shape (the stash's rule: o may be written over an input,
 *     in place; the last pass reads each index before it stores there,
 *     and no later pass reads the row; a row's output, a take_along of
 *     the row, would).
 * What the tail reads back is o's value at its own index, rounded to o's
 * dtype when the pass made it: the same as computing it again. With the
 * scratch (below), where no input lies under what the keep stores, the
 * first pass that computes o stores it and every pass after it reads it
 * back too: an add + layer_norm's variance pass then loads h instead of
 * computing it from x and r again (a third of the row's instructions in
 * bf16: two loads, two widenings, an add and a rounding per element). */

/* v's expression reads a reduced value (or the walk ran out) */
static bool reads_reduced(const cg *g, const fz_value *v, int *budget)
{
	if (--*budget < 0 || g->is_red[v->id])
		return true;
	if (!v->def || region_input(g, v))
		return false;
	for (int i = 0; i < v->def->n_in; i++)
		if (reads_reduced(g, v->def->in[i], budget))
			return true;
	return false;
}

/* v's expression, down to the region's inputs and reduced values, has o */
static bool made_from(const cg *g, const fz_value *v, const fz_value *o, int *budget)
{
	if (v == o)
		return true;
	const fz_node *n = inner(g, v, budget);
	for (int i = 0; n && i < n->n_in; i++)
		if (made_from(g, n->in[i], o, budget))
			return true;
	return false;
}

static void keep_pick(cg *g, rows *R, const fz_node *last)
{
	const fz_region *r = g->r;
	const fz_value *o = NULL;
	for (int i = 0; i < r->n_out && !o; i++) {
		cg_ix tmp[FZ_MAX_RANK];
		const fz_value *c = r->out[i];
		int b1 = STASH_WALK, b2 = STASH_WALK;
		if (classify(g, R, c, tmp) == 2 && !region_input(g, c) &&
		    !reads_reduced(g, c, &b1) && made_from(g, last->in[0], c, &b2))
			o = c;
	}
	for (int i = 0; i < r->n_out && o; i++) {
		int b = STASH_WALK;
		if (r->out[i] != o && reads_domain_input(g, R, r->out[i], o, &b))
			o = NULL;
	}
	R->keep_o = o;
}

/* The pass that stores the keep: the last, or with the scratch the first
 * whose operand is made from it (the scratch is the part's own, so no
 * input lies under it). */
static void keep_when(cg *g, rows *R, const fz_node *const *reds, int nr)
{
	int np = 0, first = -1;
	for (int k = 0; k < nr; k++) {
		int b = STASH_WALK;
		if (first < 0 && made_from(g, reds[k]->in[0], R->keep_o, &b))
			first = np;
		np += reds[k]->op == FZ_OP_VAR_MEAN ? 2 : 1;
	}
	R->keep_pass = R->scratch && first >= 0 ? first : np - 1;
}

/* ---- the chain ------------------------------------------------------------------
 * Reductions in a chain, each over a value made from the one the pass
 * before it reduced (x1 = f(x0, r0), r1 = sum(x1), x2 = f(x1, r1), ...),
 * with the row not in registers (looping passes: the host, long or
 * symbolic rows on the GPU): pass k would compute x_k from the region's
 * inputs again, through every x before it, so the code grew as the square
 * of the chain's length and the optimizer's time as its cube (35 sums of
 * exps over a bf16 row: 20 s and 200 MB for one kernel). Instead every
 * pass stores the value it reduces in a domain-shaped output, as the
 * stash does for the last pass, and pass k reads x_{k-1} back (the same
 * thread wrote it at the same index, rounded to its dtype) and computes
 * only x_k from it. Taken when the region has 3 reductions or more (so
 * softmax, the norms and cross_entropy keep their code), none a var_mean,
 * each pass's value is made from the last one's through elementwise ops
 * and reads no domain-shaped input but through it (once the output is
 * written, an input under it may be gone: the stash's rule), and the tail
 * reads none either. The tail then reads the last pass's value back, as
 * with the stash. */
static bool chain_pick(cg *g, rows *R, const fz_node *const *reds, int nr)
{
	const fz_region *r = g->r;
	if (nr < 3)
		return false;
	for (int k = 0; k < nr; k++)
		if (reds[k]->op == FZ_OP_VAR_MEAN)
			return false;
	fz_dtype d = reds[0]->in[0]->type.dtype;
	const fz_value *o = NULL;
	for (int i = 0; i < r->n_out && !o; i++) {
		cg_ix tmp[FZ_MAX_RANK];
		if (r->out[i]->type.dtype == d && classify(g, R, r->out[i], tmp) == 2)
			o = r->out[i];
	}
	if (!o)
		return false;
	for (int k = 1; k < nr; k++) {
		const fz_value *v = reds[k]->in[0], *u = reds[k - 1]->in[0];
		int b1 = STASH_WALK, b2 = STASH_WALK;
		if (v == u || v->type.dtype != d || !is_v_pointwise(g, v, u, &b1) ||
		    reads_domain_input(g, R, v, u, &b2))
			return false;
	}
	const fz_value *last = reds[nr - 1]->in[0];
	for (int i = 0; i < r->n_out; i++) {
		cg_ix tmp[FZ_MAX_RANK];
		int b = STASH_WALK;
		if (classify(g, R, r->out[i], tmp) == 2 &&
		    reads_domain_input(g, R, r->out[i], last, &b))
			return false;
	}
	R->chained = true;
	R->chain[0] = NULL;
	for (int k = 1; k < nr; k++)
		R->chain[k] = reds[k - 1]->in[0];
	R->stash_by = reds[nr - 1];
	R->stash_v = last;
	R->stash_o = o;
	return true;
}

/* ---- the scratch (host) -------------------------------------------------------
 * The stash, the chain and the keep store a value of the row into an
 * output and read it back in a later pass: the output's lines come into
 * the cache for the store (read for ownership) and are written again by
 * the tail, so the tail cannot stream them (emit.c's "streaming stores"):
 * softmax bf16 moved three bytes of memory for every two it needed. When
 * the region streams and the row is known and small (a float row of at
 * most FZ_HOST_SCRATCH_BYTES in its compute type: 4096 bf16 are 16 KB of
 * f32), they store into a scratch row on the stack instead, the part's
 * own, indexed by the position in the row (a vector of L compute values
 * a step, already rounded to the value's dtype, so that reading back
 * gives the value itself); the tail reads it from L1 or L2 and streams
 * every output, the keep's included (stored by the tail then), where the
 * host streams that many outputs a loop; where it does not (AMD's Zen:
 * one), the scratch still saves a pass what it would compute again: an
 * add + layer_norm bf16 2048 x 4096 on a Zen 3, both outputs stored
 * plain, 5.47 ms without it, 4.16 ms with it (cpu_bench.py). */
#define FZ_HOST_SCRATCH_BYTES (256 << 10)

/* A row of values of dtype d fits a scratch (and the region is large
 * enough to stream, where stream asks). */
static bool scratch_fits(cg *g, const rows *R, fz_dtype d, bool stream)
{
	fz_ext n;
	if (!fz_dtype_is_float(d) || (stream && !cg_stream_fits(g, 1)) ||
	    g->o.target != FZ_CG_HOST ||
	    !fz_type_numel(&R->rt, &n) || !fz_ext_is_const(n) || n.c <= 0)
		return false;
	T t = cg_ctype(g, d);
	int64_t es = t == t_f64(g) ? 8 : 4;
	return n.c * es <= FZ_HOST_SCRATCH_BYTES && (t == t_f32(g) || t == t_f64(g));
}

static void scratch_pick(cg *g, rows *R)
{
	const fz_value *o = R->stash_o ? R->stash_o : R->keep_o;
	/* the rescale's stash, in no output: the scratch, streaming or not */
	bool alone = !o && R->stash_v;
	if (alone)
		o = R->stash_v;
	if (!o || !scratch_fits(g, R, o->type.dtype, !alone)) {
		FZ_ASSERT(!alone); /* stash_pick asked scratch_fits */
		return;
	}
	fz_ext n;
	fz_type_numel(&R->rt, &n);
	T t = cg_ctype(g, o->type.dtype);
	/* in the entry block: one slot for the whole part */
	LLVMBasicBlockRef here = current(g);
	at_end(g, g->entry);
	T at = LLVMArrayType2(t, (uint64_t)n.c);
	R->scratch = alloca_(g, at);
	LLVMSetAlignment(R->scratch, 64);
	at_end(g, here);
	R->scratch_t = t;
}

static unsigned scratch_align(const rows *R)
{
	unsigned a = (unsigned)R->L * (R->scratch_t == LLVMDoubleTypeInContext(
		LLVMGetTypeContext(R->scratch_t)) ? 8 : 4);
	return a > 64 ? 64 : a;
}

static void scratch_put(cg *g, rows *R, V pos, const V *vals)
{
	V vec = pack(g, t_vec(R->scratch_t, (unsigned)R->L), vals, R->L);
	store(g, vec, gep(g, R->scratch_t, R->scratch, pos), scratch_align(R));
}

static void scratch_get(cg *g, rows *R, const fz_value *v, V pos, cg_ix (*ix)[FZ_MAX_RANK])
{
	T vt = t_vec(R->scratch_t, (unsigned)R->L);
	V vec = load(g, vt, gep(g, R->scratch_t, R->scratch, pos), scratch_align(R));
	V vals[FZ_VW_MAX];
	for (int l = 0; l < R->L; l++)
		vals[l] = extract(g, vec, (unsigned)l);
	cg_value_given(g, v, R->L, ix, vals);
}

/* ---- the pick ---------------------------------------------------------------------
 * A sum over a one-hot select (ir/onehot.h: cross-entropy's backward sums
 * where(eq(iota_j, t), -1, 0) * w along the row) is no pass: its value is
 * computed at the row, from x's own expression at two indices of the row,
 * H at j = t (clamped into the row) and Z at j != t, as ir/onehot.c's
 * rule says: (0 <= t < n ? H : 0) + (some j != t ? Z : 0), Z being 0 or
 * NaN. The walks of fz_onehot_find stop at the region's inputs, so the
 * rule reads only what the region holds. A pass over 32000 elements of
 * cross-entropy's row (a fifth of its instructions) becomes a dozen
 * scalar ones. Every factor of x but the select is constant along j, so
 * the two evaluations read no element of the row: only the row's own
 * values (t, the weight), and the iota at the two indices. */

static bool leaf_in(void *g, const fz_value *v)
{
	return region_input(g, v);
}

static void pick_node(cg *g, rows *R, const fz_node *n, const fz_onehot *oh)
{
	const fz_value *x = n->in[0];
	int d = oh->dim, rank = R->D->rank;
	cg_ix ix[1][FZ_MAX_RANK], hx[1][FZ_MAX_RANK], zx[1][FZ_MAX_RANK];
	for (int k = 0; k < rank; k++)
		ix[0][k] = R->red[k] ? cg_ix_zero() : g->row[k];
	V t;
	cg_value(g, oh->index, 1, ix, &t); /* an i64 compute value */
	V zero = c_i64(g, 0), one = c_i64(g, 1);
	V ne = zext_or_trunc(g, cg_ext(g, R->D->dims[d]), t_i64(g));
	V in = and_(g, icmp(g, LLVMIntSGE, t, zero), icmp(g, LLVMIntSLT, t, ne));
	V two = icmp(g, LLVMIntSGE, ne, c_i64(g, 2));
	/* a j other than t exists: n >= 2, or t outside a row of n >= 1 */
	V other = or_(g, two, and_(g, xor_(g, in, c_i1(g, 1)),
				  icmp(g, LLVMIntSGE, ne, one)));
	V jh = sel(g, in, t, zero);
	V jz = zext(g, and_(g, and_(g, in, two), icmp(g, LLVMIntEQ, t, zero)), t_i64(g));
	memcpy(hx, ix, sizeof ix);
	memcpy(zx, ix, sizeof ix);
	hx[0][d] = cg_ix_of(zext_or_trunc(g, jh, g->ity), 1);
	zx[0][d] = cg_ix_of(zext_or_trunc(g, jz, g->ity), 1);
	V h, z;
	cg_value(g, x, 1, hx, &h);
	cg_value(g, x, 1, zx, &z);
	if (g->st != FZ_OK)
		return;
	if (R->npk < 8) {
		R->pk[R->npk].x = x;
		R->pk[R->npk].d = d;
		R->pk[R->npk].h = h;
		R->pk[R->npk].z = z;
		R->pk[R->npk++].tj = sel(g, in, zext_or_trunc(g, t, g->ity), c_int(g->ity, -1));
	}
	fz_dtype dt = n->out[0]->type.dtype;
	if (fz_dtype_is_float(dt)) {
		V fz = c_real(type_of(h), 0.0);
		V r = fadd_exact(g, sel(g, in, h, fz), sel(g, other, z, fz));
		g->red[n->out[0]->id] = cg_round_half(g, r, dt);
	} else {
		V iz = c_int(type_of(h), 0);
		g->red[n->out[0]->id] = cg_wrap_int(g, add(g, sel(g, in, h, iz),
							   sel(g, other, z, iz)), dt);
	}
}

/* In the tail's step at lanes ix: a pick's operand x, where the tail
 * reads it (cross-entropy's gradient is the one-hot product itself, less
 * softmax times the pick), is h at the hot index and z elsewhere: a
 * compare of the lanes' indices with the row's and a select, where
 * computing it compared 64-bit iota lanes and multiplied (ten
 * instructions a step of 16 lanes, four now). The same values x's
 * expression gives: every factor but the select is the same at every j. */
static void pick_lanes(cg *g, rows *R, cg_ix (*ix)[FZ_MAX_RANK])
{
	int L = R->L;
	for (int k = 0; k < R->npk; k++) {
		int d = R->pk[k].d;
		T it = t_vec(g->ity, (unsigned)L), vt = t_vec(type_of(R->pk[k].h), (unsigned)L);
		/* lanes at constant offsets from the first (the reduced dim
		 * innermost, in order or even and odd): lane l is hot where its
		 * offset is tj - j0, one broadcast and one compare */
		bool seq = true;
		for (int l = 1; l < L; l++)
			seq = seq && ix[l][d].b == ix[0][d].b;
		V j = c_undef(it), tv = R->pk[k].tj;
		if (seq) {
			V lanes[FZ_VW_MAX];
			for (int l = 0; l < L; l++)
				lanes[l] = c_int(g->ity, ix[l][d].o - ix[0][d].o);
			j = LLVMConstVector(lanes, (unsigned)L);
			tv = sub(g, tv, cg_ix_value(g, ix[0][d]));
		} else {
			for (int l = 0; l < L; l++)
				j = insert(g, j, cg_ix_value(g, ix[l][d]), (unsigned)l);
		}
		V hot = icmp(g, LLVMIntEQ, j, bcast(g, it, tv, L));
		V xv = sel(g, hot, bcast(g, vt, R->pk[k].h, L), bcast(g, vt, R->pk[k].z, L));
		V out[FZ_VW_MAX];
		for (int l = 0; l < L; l++)
			out[l] = extract(g, xv, (unsigned)l);
		cg_value_given(g, R->pk[k].x, L, ix, out);
	}
}

/* ---- row invariants ---------------------------------------------------------------
 * What the row's elements read through a broadcast along the reduced dims
 * (cross-entropy's target and weight, a norm's per-row scale read from an
 * input) is one value per row, but the passes and the tail loaded it at
 * every step: LLVM may not hoist a load above the tail's stores, which
 * could write where it reads for all it knows. So such values are
 * computed once, at the row's start, where the emitter's memo hands them
 * to every pass and the tail (the broadcast reads its operand at the
 * row's kept indices and index 0 of each stretched dim, the same index
 * at every step). Taken for operands made of region inputs, constants,
 * meta and elementwise ops only: no reduced value (not known yet), no
 * indexing op (its range check must not fire for a row with no
 * elements), a walk of at most INV_WALK nodes each. */
#define INV_WALK 32

static bool plain_operand(const cg *g, const fz_value *v, int *budget)
{
	if (--*budget < 0 || g->is_red[v->id])
		return false;
	if (region_input(g, v) || !v->def)
		return true;
	fz_opclass c = fz_ops[v->def->op].cls;
	if (c != FZ_CLASS_UNARY && c != FZ_CLASS_BINARY && c != FZ_CLASS_TERNARY &&
	    c != FZ_CLASS_META && c != FZ_CLASS_CREATION)
		return false;
	for (int i = 0; i < v->def->n_in; i++)
		if (!plain_operand(g, v->def->in[i], budget))
			return false;
	return true;
}

static void row_invariants(cg *g, rows *R)
{
	const fz_region *r = g->r;
	cg_ix ix[1][FZ_MAX_RANK];
	for (int k = 0; k < R->D->rank; k++)
		ix[0][k] = R->red[k] ? cg_ix_zero() : g->row[k];
	for (int i = 0; i < r->n_nodes && g->st == FZ_OK; i++) {
		const fz_node *n = r->nodes[i];
		const fz_value *y = n->out[0], *x = n->in ? n->in[0] : NULL;
		cg_ix tmp[FZ_MAX_RANK];
		if (n->op != FZ_OP_BROADCAST_IN_DIM || classify(g, R, y, tmp) != 2 ||
		    (x->def && fz_ops[x->def->op].cls == FZ_CLASS_CREATION))
			continue;
		bool stretched = true;
		for (int k = 0; k < n->attrs.n_dims && stretched; k++)
			stretched = !R->red[n->attrs.dims[k]] || fz_ext_is_one(x->type.dims[k]);
		int budget = INV_WALK;
		if (!stretched || !plain_operand(g, x, &budget))
			continue;
		V v;
		cg_value(g, y, 1, ix, &v);
	}
}

/* ---- columns (host) -------------------------------------------------------------
 * An outer reduction (sum over dim 0: a bias's or a norm weight's
 * gradient) keeps the innermost dim, so its rows are columns: one thread
 * walking down a column of [N, C] reads one element every C, and with C a
 * power of two every read lands in the same cache set (62 ms for
 * sum(g * x * r, dims=[0]) over [512, 1024] f32, 100x PyTorch). On the host
 * such a region instead walks the reduced elements in order, and at each
 * one reads a block of COL_VECS vectors of L consecutive columns, each
 * column with its own accumulator lane: the same sums, each column's
 * elements added in order (a f32 sum in f64, a f64 sum as a pair, as
 * pass() does), now read a row at a time. A work item is one block of
 * the columns of one kept outer index; with fewer columns than a block,
 * a block is one vector, and with fewer than a vector one column. The
 * last block of a row of blocks, when the columns do not fill it, is
 * moved back to end at the last column: it sums again columns that the
 * block before it summed, and stores only its own (a strided walk of one
 * column per item for the rest cost a third of the time at 1000
 * columns). After the walk every column of the
 * block is finished alone: its reduced values become the row's (g->red,
 * g->row) and its row-shaped outputs are stored, so the emitter reads
 * them as in cg_rows. Taken when the region's reductions read no reduced
 * value (no second pass), none is a var_mean, and every output has the
 * row's shape (no tail over the domain) and reads reduced values only at
 * its own index: through elementwise ops, reshape, squeeze and unsqueeze
 * (a slice or a cat of a reduced value, rotary's backward, reads another
 * column: such a region is left to the rows below, whose check of the
 * row refuses it as before; the columns set the row's rank and kept dims
 * so that the same check guards them too). */
#define COL_VECS 4
#define COL_REDS 8

/* v reads reduced values only at its own index (see above) */
static bool own_index(const cg *g, const fz_value *v, int *budget)
{
	if (--*budget < 0)
		return false;
	if (g->is_red[v->id] || !v->def || region_input(g, v))
		return true;
	const fz_node *n = v->def;
	fz_opclass c = fz_ops[n->op].cls;
	if (c != FZ_CLASS_UNARY && c != FZ_CLASS_BINARY && c != FZ_CLASS_TERNARY &&
	    n->op != FZ_OP_RESHAPE && n->op != FZ_OP_SQUEEZE && n->op != FZ_OP_UNSQUEEZE) {
		int b = STASH_WALK;
		return !reads_reduced(g, v, &b);
	}
	for (int i = 0; i < n->n_in; i++)
		if (!own_index(g, n->in[i], budget))
			return false;
	return true;
}

/* Outputs of the domain's shape a column walk stores (col_domain). */
#define COL_DOMAIN_MAX 8

static bool cols_fit(cg *g, rows *R, const fz_node *const *reds, int nr)
{
	const fz_region *r = g->r;
	if (g->o.target != FZ_CG_HOST || nr > COL_REDS || R->kt.rank == 0 ||
	    R->red[R->D->rank - 1])
		return false;
	for (int k = 0; k < nr; k++) {
		int b = STASH_WALK;
		if (reds[k]->op == FZ_OP_VAR_MEAN || reads_reduced(g, reds[k]->in[0], &b))
			return false;
	}
	int dom = 0;
	for (int i = 0; i < r->n_out; i++) {
		cg_ix tmp[FZ_MAX_RANK];
		int b = STASH_WALK, c = classify(g, R, r->out[i], tmp);
		if (c == 2 && !reads_reduced(g, r->out[i], &b) && ++dom <= COL_DOMAIN_MAX)
			continue; /* stored by the walk (col_domain) */
		b = STASH_WALK;
		if (c != 1 || !own_index(g, r->out[i], &b))
			return false;
	}
	return true;
}

/* The outputs of the domain's shape (which read no reduced value) at one
 * vector of the walk, at ix: stored whole, or, in a block moved back over
 * the one before it (lo), only the lanes of columns from lo on: the block
 * before stored the others, perhaps over an input the block reads (an
 * output in place of its input). */
static void col_domain(cg *g, rows *R, cg_ix (*ix)[FZ_MAX_RANK], int L, V col0, V lo)
{
	const fz_region *r = g->r;
	V vals[COL_DOMAIN_MAX][FZ_VW_MAX];
	int outs[COL_DOMAIN_MAX], n = 0;
	for (int i = 0; i < r->n_out && g->st == FZ_OK; i++) {
		cg_ix tmp[FZ_MAX_RANK];
		if (classify(g, R, r->out[i], tmp) != 2)
			continue;
		FZ_ASSERT(n < COL_DOMAIN_MAX); /* cols_fit */
		cg_value(g, r->out[i], L, ix, vals[n]);
		outs[n++] = i;
	}
	if (!n)
		return;
	int cse = g->n_cse;
	LLVMBasicBlockRef whole = NULL, part = NULL, cont = NULL;
	if (lo) {
		whole = block(g, "cols.dom");
		part = block(g, "cols.dom.lanes");
		cont = block(g, "cols.dom.next");
		cond_br(g, icmp(g, LLVMIntUGE, col0, lo), whole, part);
		at_end(g, whole);
	}
	for (int k = 0; k < n; k++)
		cg_store(g, r->out[outs[k]], L, ix, vals[k]);
	if (!lo)
		return;
	br(g, cont);
	g->n_cse = cse;
	at_end(g, part);
	for (int l = 0; l < L; l++) {
		LLVMBasicBlockRef st = block(g, "cols.dom.lane"), nx = block(g, "cols.dom.lane.next");
		cond_br(g, icmp(g, LLVMIntUGE, add(g, col0, c_int(g->ity, l)), lo), st, nx);
		at_end(g, st);
		for (int k = 0; k < n; k++)
			cg_store(g, r->out[outs[k]], 1, &ix[l], &vals[k][l]);
		br(g, nx);
		g->n_cse = cse;
		at_end(g, nx);
	}
	br(g, cont);
	at_end(g, cont);
	g->n_cse = cse; /* what the stores built lives in their branches */
}

/* The block of nv vectors of L columns at kept index kix (its last dim at
 * c0): the walk, then each column's values and row outputs, stored for
 * the columns from lo on (NULL: all). */
static void col_block(cg *g, rows *R, const fz_node *const *reds, int nr,
		      const cg_ix *kix, V c0, V lo, int L, int nv)
{
	const fz_region *r = g->r;
	int mark = cg_memo_mark(g), cse = g->n_cse;
	rows Rv = *R;
	Rv.L = L;
	accum A[COL_REDS][COL_VECS];
	for (int k = 0; k < nr; k++)
		for (int u = 0; u < nv; u++)
			acc_init(g, &Rv, &A[k][u], reds[k]->op,
				 cg_ctype(g, reds[k]->in[0]->type.dtype));
	int kl = R->kd[R->kt.rank - 1];
	cg_ix ix[FZ_VW_MAX][FZ_MAX_RANK];
	cg_loop J;
	cg_loop_begin(g, &J, c_int(g->ity, 0), R->count, c_int(g->ity, 1));
	cg_ix rj[FZ_MAX_RANK];
	cg_delinearize(g, &R->rt, J.iv, 1, rj);
	for (int u = 0; u < nv; u++) {
		for (int l = 0; l < L; l++) {
			for (int i = 0; i < R->kt.rank; i++)
				ix[l][R->kd[i]] = kix[i];
			ix[l][kl] = cg_ix_of(c0, 1);
			ix[l][kl].o = u * L + l;
			for (int i = 0; i < R->rt.rank; i++)
				ix[l][R->rd[i]] = rj[i];
		}
		for (int k = 0; k < nr; k++) {
			V vals[FZ_VW_MAX];
			cg_value(g, reds[k]->in[0], L, ix, vals);
			acc_step(g, &Rv, &A[k][u], vals, NULL, NULL, NULL);
		}
		col_domain(g, &Rv, ix, L, add(g, c0, c_int(g->ity, u * L)), lo);
	}
	cg_loop_end(g, &J);
	/* each column: its reduced values, then the outputs of the row */
	V hv[COL_REDS], lv[COL_REDS];
	for (int u = 0; u < nv; u++) {
		for (int k = 0; k < nr; k++) {
			accum *a = &A[k][u];
			T t = a->vt ? a->vt : a->t;
			hv[k] = load(g, t, a->hi[0], 8);
			lv[k] = a->pair ? load(g, t, a->lo[0], 8) : NULL;
		}
		for (int l = 0; l < L; l++) {
			for (int i = 0; i < R->kt.rank; i++)
				g->row[R->kd[i]] = kix[i];
			g->row[kl] = cg_ix_of(c0, 1);
			g->row[kl].o = u * L + l;
			for (int k = 0; k < nr; k++) {
				accum *a = &A[k][u];
				const fz_node *n = reds[k];
				V h = a->vt ? extract(g, hv[k], (unsigned)l) : hv[k];
				V lo = !lv[k] ? NULL : a->vt ? extract(g, lv[k], (unsigned)l) : lv[k];
				if (a->wide)
					lo = c_real(a->t, 0.0);
				fz_dtype d = n->out[0]->type.dtype;
				T rt = cg_ctype(g, n->in[0]->type.dtype);
				g->red[n->out[0]->id] = fz_dtype_is_float(d) ?
					cg_round_half(g, lo ? pair_value(g, h, lo, NULL, rt) : h, d) :
					cg_wrap_int(g, h, d);
			}
			LLVMBasicBlockRef cont = NULL;
			int mk = cg_memo_mark(g), cs = g->n_cse;
			if (lo) {
				LLVMBasicBlockRef st = block(g, "cols.st");
				cont = block(g, "cols.st.next");
				V col = add(g, c0, c_int(g->ity, u * L + l));
				cond_br(g, icmp(g, LLVMIntUGE, col, lo), st, cont);
				at_end(g, st);
			}
			for (int i = 0; i < r->n_out && g->st == FZ_OK; i++) {
				cg_ix oix[1][FZ_MAX_RANK];
				if (classify(g, R, r->out[i], oix[0]) != 1)
					continue; /* the domain's: stored by the walk */
				V v;
				cg_value(g, r->out[i], 1, oix, &v);
				cg_store(g, r->out[i], 1, oix, &v);
			}
			if (lo) {
				br(g, cont);
				at_end(g, cont);
				cg_memo_pop(g, mk); /* what the stores built lives there */
				g->n_cse = cs;
			}
		}
	}
	cg_memo_pop(g, mark); /* what the block computed lives in its branch */
	g->n_cse = cse;
}

static void cg_cols(cg *g, rows *R, const fz_node *const *reds, int nr)
{
	fz_type ko = R->kt;
	ko.rank--;
	fz_ext KO;
	if (!fz_type_numel(&ko, &KO)) {
		cg_fail(g, FZ_EUNSUPPORTED, reds[0], "element count overflows");
		return;
	}
	int L = cg_lanes_for(g), W = COL_VECS * L;
	V C = cg_ext(g, R->kt.dims[R->kt.rank - 1]);
	V Wv = c_int(g->ity, W), Lv = c_int(g->ity, L), one = c_int(g->ity, 1);
	V wide = icmp(g, LLVMIntUGE, C, Wv), narrow = icmp(g, LLVMIntUGE, C, Lv);
	V w = sel(g, wide, Wv, sel(g, narrow, Lv, one)); /* a block's columns */
	V per = udiv(g, add(g, C, sub(g, w, one)), w); /* blocks of an outer index */
	V b, e;
	cg_host_chunk(g, mul(g, cg_ext(g, KO), per), &b, &e);
	for (int k = 0; k < nr; k++)
		if (reds[k]->op == FZ_OP_AMAX || reds[k]->op == FZ_OP_AMIN)
			cg_flag_error(g, reds[k], icmp(g, LLVMIntEQ, R->count, c_int(g->ity, 0)));
	cg_loop IT;
	cg_loop_begin(g, &IT, b, e, one);
	V o = udiv(g, IT.iv, per), lo = mul(g, urem(g, IT.iv, per), w);
	V last = sub(g, C, w); /* the last block's start */
	V c0 = sel(g, icmp(g, LLVMIntULT, lo, last), lo, last);
	cg_ix kix[FZ_MAX_RANK];
	cg_delinearize(g, &ko, o, 1, kix);
	g->row_rank = R->D->rank;
	for (int d = 0; d < R->D->rank; d++)
		g->row_kept[d] = !R->red[d];
	g->row_valid = true;
	LLVMBasicBlockRef bw = block(g, "cols.wide"), bn = block(g, "cols.narrow"),
			  b1 = block(g, "cols.one"), t2 = block(g, "cols.tier"),
			  next = block(g, "cols.next");
	cond_br(g, wide, bw, t2);
	at_end(g, t2);
	cond_br(g, narrow, bn, b1);
	at_end(g, bw);
	col_block(g, R, reds, nr, kix, c0, lo, L, COL_VECS);
	br(g, next);
	at_end(g, bn);
	col_block(g, R, reds, nr, kix, c0, lo, L, 1);
	br(g, next);
	at_end(g, b1);
	col_block(g, R, reds, nr, kix, lo, NULL, 1, 1);
	br(g, next);
	at_end(g, next);
	cg_loop_end(g, &IT);
	g->row_valid = false;
}

void cg_rows(cg *g)
{
	const fz_region *r = g->r;
	const fz_node *reds[64];
	int nr = 0;
	for (int i = 0; i < r->n_nodes; i++)
		if (fz_ops[r->nodes[i]->op].cls == FZ_CLASS_REDUCTION) {
			if (nr == 64) {
				cg_fail(g, FZ_EUNSUPPORTED, r->nodes[i], "more than 64 reductions");
				return;
			}
			reds[nr++] = r->nodes[i];
		}
	if (nr == 0) {
		cg_fail(g, FZ_EUNSUPPORTED, r->nodes[0], "a rows region with no reduction");
		return;
	}
	rows R;
	memset(&R, 0, sizeof R);
	R.D = &reds[0]->in[0]->type;
	for (int i = 0; i < reds[0]->attrs.n_dims; i++)
		R.red[reds[0]->attrs.dims[i]] = true;
	for (int k = 1; k < nr; k++) {
		const fz_type *t = &reds[k]->in[0]->type;
		bool same = t->rank == R.D->rank && reds[k]->attrs.n_dims == reds[0]->attrs.n_dims;
		for (int d = 0; same && d < t->rank; d++)
			same = fz_ext_eq(t->dims[d], R.D->dims[d]);
		for (int i = 0; same && i < reds[k]->attrs.n_dims; i++)
			same = R.red[reds[k]->attrs.dims[i]];
		if (!same) {
			cg_fail(g, FZ_EUNSUPPORTED, reds[k], "reduces other dims or another "
				"shape than the region's first reduction");
			return;
		}
	}
	for (int d = 0; d < R.D->rank; d++) {
		if (R.red[d]) {
			R.rd[R.rt.rank] = d;
			R.rt.dims[R.rt.rank++] = R.D->dims[d];
		} else {
			R.kd[R.kt.rank] = d;
			R.kt.dims[R.kt.rank++] = R.D->dims[d];
		}
	}
	for (int i = 0; i < nr; i++)
		for (int j = 0; j < reds[i]->n_out; j++)
			g->is_red[reds[i]->out[j]->id] = true;
	/* the picks (computed at the row) and the passes */
	fz_onehot oh[64];
	bool is_pick[64];
	const fz_node *passes[64];
	int np = 0, npick = 0;
	for (int i = 0; i < nr; i++) {
		is_pick[i] = fz_onehot_find(reds[i], leaf_in, g, &oh[i]);
		npick += is_pick[i];
		if (!is_pick[i])
			passes[np++] = reds[i];
	}

	fz_ext K, Rn;
	if (!fz_type_numel(&R.kt, &K) || !fz_type_numel(&R.rt, &Rn)) {
		cg_fail(g, FZ_EUNSUPPORTED, reds[0], "element count overflows");
		return;
	}
	bool inner = R.rt.rank > 0 && R.red[R.D->rank - 1];
	fz_ext last = R.rt.rank ? R.rt.dims[R.rt.rank - 1] : fz_ext_const(1);
	R.L = inner ? cg_lanes_fit(g, cg_lanes_for(g), last) : 1;
	R.eo = inner && row_even_odd(g, &R);
	/* GPU, row along the innermost dim: a warp per row when each lane has
	 * at most 4 steps, else a block of FZ_ROW_BLOCK threads; the row in
	 * registers when its length is known and a thread's share of it is at
	 * most FZ_ROW_REGS elements */
	int64_t nthr = 1;
	if (!cg_gpu(g) || !inner) {
		R.par = FZ_PAR_THREAD;
	} else if (fz_ext_is_const(Rn) && Rn.c > 0) {
		int64_t G = Rn.c / R.L; /* lane groups: L divides the last extent */
		R.par = G <= 4 * 32 ? FZ_PAR_WARP : FZ_PAR_BLOCK;
		nthr = R.par == FZ_PAR_WARP ? 32 : FZ_ROW_BLOCK;
		int64_t S = (G + nthr - 1) / nthr;
		if (S * R.L <= FZ_ROW_REGS)
			R.S = (int)S;
	} else {
		R.par = FZ_PAR_BLOCK;
	}
	g->k->par = R.par;
	g->k->vec = R.L;
	g->k->n_work[0] = 1;
	g->k->work[0][0] = K; /* columns: as many items or fewer */

	cg_function_begin(g, g->k->names[0]);
	if (g->st != FZ_OK) {
		cg_function_end(g);
		return;
	}
	R.count = cg_ext(g, Rn);
	/* the prefetch: rows along the innermost dims, one after another */
	bool trailing = g->o.target == FZ_CG_HOST && inner;
	for (int i = 0; i < R.rt.rank; i++)
		trailing = trailing && R.rd[i] == R.D->rank - R.rt.rank + i;
	if (trailing) {
		int64_t rows_ahead = 1;
		if (fz_ext_is_const(Rn) && Rn.c > 0)
			rows_ahead = (4096 + Rn.c - 1) / Rn.c;
		R.ahead = mul(g, R.count, c_int(g->ity, rows_ahead));
	}
	if (!npick && cols_fit(g, &R, reds, nr)) {
		cg_cols(g, &R, reds, nr);
		cg_function_end(g);
		return;
	}
	V row0, rstep;
	V tid = cg_tid(g), ntid = cg_ntid(g), cta = cg_ctaid(g), ncta = cg_nctaid(g);
	if (R.par == FZ_PAR_BLOCK) {
		row0 = cta;
		rstep = ncta;
		R.tid_in_row = tid;
		/* registers: steps of a known stride, so the launch must give
		 * FZ_ROW_BLOCK threads (fz_kernel_launch_dims does) */
		R.nthr = R.S ? c_int(g->ity, nthr) : ntid;
	} else if (R.par == FZ_PAR_WARP) {
		V wpb = udiv(g, ntid, c_int(g->ity, 32));
		row0 = add(g, mul(g, cta, wpb), udiv(g, tid, c_int(g->ity, 32)));
		rstep = mul(g, ncta, wpb);
		R.tid_in_row = urem(g, tid, c_int(g->ity, 32));
		R.nthr = c_int(g->ity, 32);
	} else {
		row0 = add(g, mul(g, cta, ntid), tid);
		rstep = mul(g, ncta, ntid);
		R.tid_in_row = c_int(g->ity, 0);
		R.nthr = c_int(g->ity, 1);
	}
	V nrows = cg_ext(g, K);
	if (g->o.target == FZ_CG_HOST) /* this part's contiguous chunk of rows */
		cg_host_chunk(g, nrows, &row0, &nrows);
	cg_loop RL;
	cg_loop_begin(g, &RL, row0, nrows, rstep);
	cg_ix kix[FZ_MAX_RANK];
	cg_delinearize(g, &R.kt, RL.iv, 1, kix);
	g->row_rank = R.D->rank;
	for (int d = 0; d < R.D->rank; d++) {
		g->row_kept[d] = !R.red[d];
		g->row[d] = cg_ix_zero();
	}
	for (int i = 0; i < R.kt.rank; i++)
		g->row[R.kd[i]] = kix[i];
	g->row_valid = true;
	row_invariants(g, &R);
	if (R.S)
		row_regs(g, &R);
	else if (np && !chain_pick(g, &R, passes, np) && g->o.target == FZ_CG_HOST)
		stash_pick(g, &R, passes[np - 1]);
	if (np && !R.S && !R.chained && !R.stash_v && g->o.target == FZ_CG_HOST)
		keep_pick(g, &R, passes[np - 1]);
	if (!R.S)
		scratch_pick(g, &R);
	if (R.keep_o)
		keep_when(g, &R, passes, np);

	for (int i = 0, k = 0; i < nr && g->st == FZ_OK; i++) {
		if (is_pick[i])
			pick_node(g, &R, reds[i], &oh[i]);
		else
			reduce_node(g, &R, reds[i], k++);
	}
	g->k->row_passes = R.npass;

	/* row-shaped outputs, then the tail over the row */
	V leader = icmp(g, LLVMIntEQ, R.tid_in_row, c_int(g->ity, 0));
	int n_tail = 0;
	for (int i = 0; i < r->n_out && g->st == FZ_OK; i++) {
		cg_ix ix[1][FZ_MAX_RANK];
		int kind = classify(g, &R, r->out[i], ix[0]);
		if (kind == 0) {
			cg_fail(g, FZ_EUNSUPPORTED, r->out[i]->def, "an output whose shape "
				"is neither the rows' nor the reduced domain's");
			break;
		}
		if (kind == 2) {
			n_tail += r->out[i] != R.keep_o || R.scratch;
			continue;
		}
		V v;
		cg_value(g, r->out[i], 1, ix, &v);
		int cse = g->n_cse;
		LLVMBasicBlockRef st = block(g, "row.out"), cont = block(g, "row.next");
		cond_br(g, leader, st, cont);
		at_end(g, st);
		cg_store(g, r->out[i], 1, ix, &v);
		br(g, cont);
		at_end(g, cont);
		g->n_cse = cse; /* what the store built lives in row.out only */
	}
	if (n_tail && g->st == FZ_OK && R.S) {
		for (int k = 0; k < R.S && g->st == FZ_OK; k++)
			tail_step(g, &R, &R.ix[k * R.L], R.valid[k]);
	} else if (n_tail && g->st == FZ_OK) {
		if (R.rescale_e)
			rescale_row(g, &R);
		bool streams = cg_stream_fits(g, tail_streams(g, &R));
		cg_loop L;
		row_loop_begin(g, &R, &L);
		cg_ix ix[FZ_VW_MAX][FZ_MAX_RANK];
		row_lanes(g, &R, L.iv, ix);
		prefetch_ahead(g, &R, ix);
		if (R.stash_v)
			reload_at(g, &R, R.stash_v, R.stash_o ? R.stash_o : R.stash_v, L.iv, ix);
		if (R.rescale_e)
			rescale_step(g, &R, ix);
		pick_lanes(g, &R, ix);
		if (R.keep_o)
			reload_at(g, &R, R.keep_o, R.keep_o, L.iv, ix);
		for (int i = 0; i < r->n_out && g->st == FZ_OK; i++) {
			cg_ix tmp[FZ_MAX_RANK];
			if ((r->out[i] == R.keep_o && !R.scratch) ||
			    classify(g, &R, r->out[i], tmp) != 2)
				continue;
			V vals[FZ_VW_MAX];
			cg_value(g, r->out[i], R.L, ix, vals);
			g->stream = streams && tail_streamable(g, &R, r->out[i]);
			cg_store(g, r->out[i], R.L, ix, vals);
			g->stream = false;
		}
		cg_loop_end(g, &L);
	}
	cg_loop_end(g, &RL);
	g->row_valid = false;
	cg_function_end(g);
}
