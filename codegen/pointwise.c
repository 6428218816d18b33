/*
 * pointwise.c: the pointwise skeleton, index_add's scatter, and the launch
 * heuristic of every skeleton.
 *
 * A pointwise region may return values of several shapes (dropout returns
 * y and keep, both [B, T, 768]; a region may also hand a reshaped input to
 * a later region). Outputs are grouped by shape, and each group gets one
 * grid-stride loop over its elements:
 *
 *     for (i = blockIdx.x * blockDim.x + threadIdx.x; i < N / L;
 *          i += gridDim.x * blockDim.x)
 *         lanes l = 0..L-1 at linear index i*L + l: every output of the
 *         group computed by the emitter and stored
 *
 * L (lanes) is 16 bytes over the widest element of the region when the
 * innermost extent is a constant multiple of it, else 1; so a lane group
 * never straddles a row and the innermost index of lane l is (b, l) with b a
 * multiple of L: consecutive lanes, one vector access per operand that runs
 * along the innermost dim (on a host without AVX-512, a group of 16-bit
 * values holds its even elements first: see "even and odd lanes"). A
 * buffer that is not 16-byte aligned gets the
 * variant compiled with vectorization off (the launcher checks; see
 * runtime/cpu.c). On the host, L is the machine's vector register over the
 * widest element (64 bytes with AVX-512: 16 f32 lanes, 32 with AVX2: 8),
 * at most FZ_VW_MAX (16: a bf16 kernel computes one register of f32),
 * halved until it divides the innermost extent, and the grid is the parts of a launch (fz_host_fn):
 * each part runs a contiguous chunk of the lane groups as a plain loop,
 * which the SLP vectorizer turns into vector instructions; where a cat
 * runs along a short row (rotary's rotate_half), a step of that loop is
 * one or more whole rows, its innermost indices constants (see "a row at
 * a time"). The index type is i32 when the launcher knows every extent and
 * offset fits (fz_cg_options.idx32, a separate specialization).
 *
 * index_add(x, idx, src, dim) is a scatter: the result starts as x (the
 * pointwise loop above stores x into it) and then every element of src is
 * added at the row its index names. On the GPU that is a second entry point
 * (`..._scatter`, launched after the first, with atomic adds: f32, f64, f16,
 * bf16, i64, i32, i8 and u8 (a byte's add wraps as the sum would; NVPTX
 * has no 8-bit atomics, and LLVM makes it a compare-and-swap on the word
 * around the byte); f16 and bf16 round at every add, as PyTorch's atomics on
 * the GPU and the host's loop here do); on the host both loops run in order
 * in one function, all of it in part 0 of a launch (the adds must follow
 * the copy and may not race), but for a scatter along dim 0: into rows of
 * 64 elements or more the host turns it into a gather by the rows of the
 * result, each row written once, elementwise followers included (see "the
 * scatter as a gather"); narrower rows of f32 or f64 lanes the parts split
 * by the rows of the result (see "the scatter by rows").
 */
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Target.h>

#include "cg.h"
#include "llvm.h"

/* The lane width a value of dtype d asks for. On the host a 64-bit integer
 * counts as 4 bytes: in a float region it is an index or a target (a
 * cross-entropy's class, an index_add's row), read once per row or compared
 * with an iota, and sizing the lane group for it would halve the width of
 * every float op of the region (4 lanes of f32 in a 32-byte register);
 * LLVM splits the few 64-bit integer vectors in two instead. The GPU keeps
 * its 16-byte loads. */
static size_t lane_width(cg *g, fz_dtype d)
{
	size_t w = fz_dtype_size(d);
	if (g->o.target == FZ_CG_HOST && w == 8 && fz_dtype_is_int(d))
		w = 4;
	return w;
}

/* Whether value v sizes the lane group. A value of lower rank than the
 * region's highest, or of innermost extent 1 (a cross entropy's target
 * and loss, one a row, [N] or [N, 1]; a bias, one a column) is read or
 * written once a row or broadcast into the lanes, never as a lane group
 * of its own: its dtype does not count, on the GPU, and on the host in
 * the row skeleton (reduction and normalization regions). (On the GPU an
 * i64 target made cross entropy's row kernels load bf16 logits 2 lanes,
 * 4 bytes, at a time where 16 bytes fit; on the host its f32 loss and i64
 * target made the row's steps 8 bf16 lanes where 16 fill a 32-byte
 * register, and kept them from even and odd order: with 16, cross_entropy
 * bf16 2048x32000 at one thread on a Zen 3, 1.24x.) The host's other
 * regions size by every value, 64-bit integers as 4 bytes (lane_width):
 * embedding_bwd's index_add, an i64 index [N] beside bf16 rows, was 0.78x
 * with 16 lanes. */
static bool sizes_lanes(const cg *g, const fz_value *v, int rank)
{
	const fz_type *t = &v->type;
	fz_region_kind k = g->r->kind;
	if (g->o.target == FZ_CG_HOST && k != FZ_REGION_REDUCTION &&
	    k != FZ_REGION_NORMALIZATION)
		return true;
	return t->rank >= rank && (!t->rank || !fz_ext_is_one(t->dims[t->rank - 1]));
}

int cg_lanes_for(cg *g)
{
	if (!g->o.vectorize)
		return 1;
	const fz_region *r = g->r;
	int rank = 0;
	for (int i = 0; i < r->n_in + r->n_out; i++) {
		const fz_value *v = i < r->n_in ? r->in[i] : r->out[i - r->n_in];
		rank = v->type.rank > rank ? v->type.rank : rank;
	}
	size_t w = 1;
	for (int i = 0; i < r->n_in + r->n_out; i++) {
		const fz_value *v = i < r->n_in ? r->in[i] : r->out[i - r->n_in];
		if (sizes_lanes(g, v, rank) && lane_width(g, v->type.dtype) > w)
			w = lane_width(g, v->type.dtype);
	}
	int l = (int)((size_t)cg_vector_bytes(g) / w);
	int max = g->o.target == FZ_CG_HOST ? FZ_VW_MAX : FZ_VW_GPU;
	return l > max ? max : l < 1 ? 1 : l;
}

int cg_lanes_fit(cg *g, int L, fz_ext inner)
{
	if (!fz_ext_is_const(inner))
		return 1;
	/* the host halves its lanes until they divide the extent (a 16-byte
	 * group of f32 where a 32-byte one does not fit); the GPU keeps its
	 * 16 bytes or nothing */
	while (g->o.target == FZ_CG_HOST && L > 1 && inner.c % L)
		L /= 2;
	return inner.c % L ? 1 : L;
}

static void add_work(cg *g, int e, fz_ext w)
{
	fz_kernel *k = g->k;
	if (k->n_work[e] < 8)
		k->work[e][k->n_work[e]++] = w;
}

/* ---- a row at a time (host) ------------------------------------------------------
 * Where a cat runs along the innermost dim (rotary's rotate_half:
 * cat(-x[..., D/2:], x[..., :D/2])) and the row is 8 lane groups or fewer,
 * a step of the host's loop is a whole row: its groups' innermost indices
 * are constants, so every view along that dim resolves when the code is
 * built: a slice's offset is a constant, the cat takes one operand at each
 * group (its clamped index and select fold away, the other operand is not
 * read: emit.c), and the outer dims' indices are split once a row, not once
 * a group. Where an operand is also broadcast along the dim outside the row
 * (cos and sin over the heads), a step takes 2 or more consecutive rows, up
 * to 16 groups, and reads that operand once for them.
 *
 * Rotary (q bf16 [4,1024,32,128], cos and sin [1024,1,128]) took 75
 * instructions a 16-lane group, a group a step: 35 scalar ones to split the
 * index and rebuild three addresses, and the cat's two loads of q and a
 * select. A step of 2 rows of 8 groups takes 28.5 vector instructions a
 * group (two loads of q, as itself and as the other half, and one of cos
 * or sin), and 22 others a step (the index, 8 prefetches, the loop).
 * in_cache.py at one thread, ns an element in L2: 0.439 before, 0.374
 * a row a step, 0.351 two rows (0.343 four, but a step of 32 groups took
 * 0.42 s to compile where 16 take 0.13 and one 0.03: the IR grows with the
 * step, and the SLP vectorizer with it). Without such a cat a step stays a
 * lane group: a wider step bought a wide expression (silu's exp) nothing
 * but its compile time (a tiny Llama's backward: 0.3 s to 1.5). The GPU
 * keeps a lane group a thread. */
#define STEP_GROUPS 16 /* lane groups a step at most */

/* A cat along the innermost dim, of rows as wide as ty's. */
static bool cat_along_row(const fz_region *r, const fz_type *ty)
{
	fz_ext w = ty->dims[ty->rank - 1];
	for (int j = 0; j < r->n_nodes; j++) {
		const fz_node *n = r->nodes[j];
		const fz_type *o = &n->out[0]->type;
		if (n->op == FZ_OP_CAT && n->attrs.dim == o->rank - 1 &&
		    fz_ext_eq(o->dims[o->rank - 1], w))
			return true;
	}
	return false;
}

/* An operand broadcast along the dim outside ty's rows. */
static bool bcast_outside_row(const fz_region *r, const fz_type *ty)
{
	int d = ty->rank - 2;
	for (int j = 0; j < r->n_nodes; j++) {
		const fz_node *n = r->nodes[j];
		if (n->op != FZ_OP_BROADCAST_IN_DIM || !fz_same_shape(&n->out[0]->type, ty))
			continue;
		bool maps = false; /* some dim of the operand moves along d */
		for (int i = 0; i < n->in[0]->type.rank; i++)
			maps = maps || (n->attrs.dims[i] == d &&
					!fz_ext_is_one(n->in[0]->type.dims[i]));
		if (!maps)
			return true;
	}
	return false;
}

/* Rows a step takes, 0 where a step is a lane group; *U: groups a row. */
static int rows_per_step(cg *g, const fz_type *ty, int L, int *U)
{
	int last = ty->rank - 1;
	*U = 1;
	if (g->o.target != FZ_CG_HOST || !g->o.vectorize || g->serial || g->by_rows ||
	    last < 0 || !fz_ext_is_const(ty->dims[last]) ||
	    ty->dims[last].c / L > STEP_GROUPS / 2 || !cat_along_row(g->r, ty))
		return 0;
	*U = (int)(ty->dims[last].c / L);
	int R = 1;
	if (last >= 1 && fz_ext_is_const(ty->dims[last - 1]) && bcast_outside_row(g->r, ty))
		while (ty->dims[last - 1].c % (2 * R) == 0 && 2 * R * *U <= STEP_GROUPS)
			R *= 2;
	return R;
}

/* The rows' prefetch: a step (of whole rows, or of one lane group) that
 * streams its outputs (emit.c, "streaming stores": 16 MiB or more)
 * prefetches, for every input of its shape, each 64-byte line of its
 * rows PF_BYTES on, one prefetcht0 a line (a group of 16 bf16 lanes, half
 * a line, prefetches at each group), as reduction.c's tails do ("the
 * prefetch"). swiglu bf16 4096^2 (cpu_bench.py, two threads, five pairs
 * alternated, warm and cold): 5.86 to 6.48 ms with it, 6.17 to 7.33
 * without, faster in every pair (median 0.95 of the time). Rotary from memory
 * (cpu_bench.py --cold, two threads, a busy machine, fractions of the
 * run's copy bandwidth, runs alternated): 57, 39, 52% without, 80, 50, 82%
 * 4 KiB ahead, 54, 74, 72% 8 KiB ahead; at a quieter moment 4.42 ms
 * without, 3.57 ms with (70 and 80% of copy). A prefetch never faults: the
 * last rows' run past the buffer's end, the address made without
 * inbounds.
 * Only the inputs the loop's own outputs are computed from: where the host
 * splits a group into independent parts (see "independent outputs"),
 * each part's loop prefetched every input of the shape, its own and the
 * other parts', three useless lines for each useful one in an AdamW step
 * of four tensors, fetched 4 KiB ahead and gone from the cache before the
 * part that reads them runs (cpu_bench.py's adamw on a Xeon: 72.9 ms,
 * 14 GB/s, where torch.compile took 46.9). */
#define PF_BYTES 4096

/* need[v]: value v is read, at some remove, by one of the n outputs */
static bool *values_read(cg *g, int n, const fz_value **src)
{
	bool *need = calloc((size_t)g->t->n_values + 1, 1);
	if (!need)
		return NULL;
	for (int i = 0; i < n; i++)
		need[src[i]->id] = true;
	for (int i = g->r->n_nodes - 1; i >= 0; i--) { /* reverse topological */
		const fz_node *nd = g->r->nodes[i];
		bool used = false;
		for (int o = 0; o < nd->n_out; o++)
			used = used || need[nd->out[o]->id];
		for (int a = 0; used && a < nd->n_in; a++)
			need[nd->in[a]->id] = true;
	}
	return need;
}

static void prefetch_rows(cg *g, const fz_type *ty, int N, int U, int L,
			  cg_ix (*ix)[FZ_VW_MAX][FZ_MAX_RANK], int n, const fz_value **src)
{
	bool *need = values_read(g, n, src);
	if (!need) {
		cg_fail(g, FZ_ENOMEM, NULL, "out of memory");
		return;
	}
	for (int i = 0; i < g->r->n_in; i++) {
		const fz_value *v = g->r->in[i];
		if (!need[v->id] || !fz_same_shape(&v->type, ty))
			continue;
		int es = (int)fz_dtype_size(v->type.dtype);
		for (int q = 0; q < N; q++) {
			if ((q % U) * L * es % 64)
				continue;
			cg_ix lin;
			cg_linear(g, &v->type, ix[q][0], &lin);
			/* base, then the constant on top: a displacement (emit.c's
			 * ix_ptr) */
			T st = cg_stype(g, v->type.dtype);
			V p = g->buf[g->slot[v->id]], o = c_i64(g, lin.o + PF_BYTES / es);
			if (lin.b)
				p = LLVMBuildGEP2(g->b, st, p, &lin.b, 1, "");
			p = LLVMBuildGEP2(g->b, st, p, &o, 1, "");
			prefetch(g, p);
		}
	}
	free(need);
}

/* Step s's lane indices: ix[r * U + u][l] for row r, group u, lane l (R
 * rows of U groups of L lanes: the innermost dim of ty). */
static void step_lanes(cg *g, const fz_type *ty, V s, int R, int U, int L, bool eo,
		       cg_ix (*ix)[FZ_VW_MAX][FZ_MAX_RANK])
{
	int last = ty->rank - 1;
	fz_type steps = *ty; /* the rows in steps */
	steps.dims[last] = fz_ext_const(1);
	if (R > 1)
		steps.dims[last - 1] = fz_ext_const(ty->dims[last - 1].c / R);
	cg_ix base[FZ_MAX_RANK];
	cg_delinearize(g, &steps, s, 1, base);
	cg_ix h = R > 1 ? base[last - 1] : cg_ix_zero(), row = {NULL, h.o * R, 1};
	if (h.b) {
		row.b = mul(g, h.b, c_int(g->ity, R));
		row.m = h.m * R;
	}
	for (int r = 0; r < R; r++)
		for (int u = 0; u < U; u++)
			for (int l = 0; l < L; l++) {
				cg_ix *x = ix[r * U + u][l];
				memcpy(x, base, sizeof base);
				if (R > 1) {
					x[last - 1] = row;
					x[last - 1].o += r;
				}
				x[last] = (cg_ix){NULL, u * L + (eo ? cg_lane_elem(L, l) : l), 1};
			}
}

/* ---- even and odd lanes (host) -----------------------------------------------
 * A bf16 lane group of 16 is two registers of f32 (AVX2), widened from 16
 * elements in memory: in order, a vpmovzxwd and a shift for each half, and
 * back, two shifts, a pack, a permutation across the register's halves and
 * its extraction for the second 16-byte store. Where every value the
 * region reads or writes is 16 bits wide, the group's lanes hold its
 * elements even ones first (lane l is element cg_lane_elem(L, l)): the
 * group is then one load of 32-bit words, whose low halves shifted up are
 * the even lanes' f32 and whose high halves masked are the odd ones', and
 * one store of words put together by a shift, a mask and an or. Nothing
 * else changes: each lane's index is its element's (iota, a broadcast
 * operand, a cat's bounds follow it), and emit.c's loads and stores know
 * the order (lane_shape's 2). Not with AVX-512, whose group of 16 is one
 * register, widened by one vpmovzxwd and one shift (and stored by one
 * vcvtneps2bf16 where the host has AVX512-BF16): halves would cost it an
 * instruction to join. */
bool cg_even_odd(cg *g, int L, const fz_ext *last)
{
	const fz_region *r = g->r;
	if (g->o.target != FZ_CG_HOST || cg_host_avx512(g) || L < 4 || L % 2)
		return false;
	for (int i = 0; i < r->n_in + r->n_out; i++) {
		const fz_value *v = i < r->n_in ? r->in[i] : r->out[i - r->n_in];
		if (last && !(v->type.rank && fz_ext_eq(v->type.dims[v->type.rank - 1], *last)))
			continue;
		if (fz_dtype_size(v->type.dtype) != 2)
			return false;
	}
	return true;
}

/* One grid-stride loop over the shape of `ty`, storing each output of the
 * group; `src[i]` is what output i stores (itself, or index_add's x). */
static void group_loop(cg *g, const fz_type *ty, int n, const fz_value **outs,
		       const fz_value **src)
{
	int L = cg_lanes_for(g);
	fz_ext numel;
	if (!fz_type_numel(ty, &numel)) {
		cg_fail(g, FZ_EUNSUPPORTED, outs[0]->def, "element count overflows");
		return;
	}
	fz_ext inner = ty->rank ? ty->dims[ty->rank - 1] : fz_ext_const(1);
	L = ty->rank == 0 ? 1 : cg_lanes_fit(g, L, inner);
	if (L > g->k->vec)
		g->k->vec = L;
	fz_ext work = numel, steps = numel;
	work.c /= L;
	add_work(g, 0, work);
	int U, R = rows_per_step(g, ty, L, &U), N = R ? R * U : 1; /* groups a step */
	steps.c /= (int64_t)L * N;
	V iters = cg_ext(g, steps), gid, gsz;
	if (g->by_rows && fz_same_shape(ty, &g->by_rows->out[0]->type)) {
		/* the part's rows of index_add's result, those it adds into */
		V r0, r1, per = udiv(g, iters, cg_ext(g, ty->dims[0]));
		cg_host_chunk(g, cg_ext(g, ty->dims[0]), &r0, &r1);
		gid = mul(g, r0, per);
		iters = mul(g, r1, per);
		gsz = c_int(g->ity, 1);
	} else if (g->o.target == FZ_CG_HOST) {
		/* this part's contiguous chunk of the lane groups */
		cg_host_chunk(g, iters, &gid, &iters);
		gsz = c_int(g->ity, 1);
	} else {
		gid = add(g, mul(g, cg_ctaid(g), cg_ntid(g)), cg_tid(g));
		gsz = mul(g, cg_nctaid(g), cg_ntid(g));
	}
	cg_lanes *ix = malloc(sizeof *ix * (size_t)N);
	if (!ix) {
		cg_fail(g, FZ_ENOMEM, NULL, "out of memory");
		return;
	}
	bool eo = cg_even_odd(g, L, NULL);
	cg_loop L0;
	cg_loop_begin(g, &L0, gid, iters, gsz);
	if (R) {
		step_lanes(g, ty, L0.iv, R, U, L, eo, ix);
	} else {
		V lin = L > 1 ? mul(g, L0.iv, c_int(g->ity, L)) : L0.iv;
		cg_delinearize(g, ty, lin, L, ix[0][0]);
		for (int l = 1; l < L; l++) {
			memcpy(ix[0][l], ix[0][0], sizeof ix[0][0]);
			ix[0][l][ty->rank - 1].o += eo ? cg_lane_elem(L, l) : l;
		}
	}
	g->stream = cg_stream_fits(g, n); /* nothing here reads an output back */
	/* group u of every row, then u + 1: what a group computes is not kept
	 * for the next (the SLP vectorizer mixed the lanes of two groups' uses
	 * of one load of q: rotate_half reads the row's q again), but the rows
	 * share what they read at one offset (cos and sin) */
	if (g->stream && (R || L > 1))
		prefetch_rows(g, ty, N, R ? U : 1, L, ix, n, src);
	for (int u = 0; u < U; u++) {
		int mark = cg_memo_mark(g);
		for (int r = 0; r < (R ? R : 1); r++)
			for (int i = 0; i < n && g->st == FZ_OK; i++) {
				V vals[FZ_VW_MAX];
				cg_value(g, src[i], L, ix[r * U + u], vals);
				cg_store(g, outs[i], L, ix[r * U + u], vals);
			}
		cg_memo_pop(g, mark);
	}
	free(ix);
	g->stream = false;
	cg_loop_end(g, &L0);
}

/* ---- independent outputs (host) ------------------------------------------------
 * Horizontal fusion (ir/horizontal.c) merges the updates of several
 * tensors of one shape into one region: an AdamW step of four weights is
 * 16 inputs and 12 outputs, which one loop would read and write side by
 * side, 28 streams at a time. The GPU does not mind; a core does: its L1
 * has 8 or 12 ways, and every stream of a loop over buffers that start
 * alike in their pages falls into the same sets, while its prefetchers
 * follow a few dozen streams at most. So on the host the outputs of a
 * shape group are split into what depends on nothing in common (unions
 * of the values each node reads and writes, constants aside), and each
 * part gets a loop of its own over the same elements. On a Zen 3 (two
 * threads, `fusec run`): AdamW over four 2048 x 4096 tensors in one loop
 * 82 ms, in four 42 ms, where one 4096 x 4096 tensor (half their
 * elements) takes 20 to 23. */

static int uf_find(int *up, int v)
{
	while (up[v] != v)
		v = up[v] = up[up[v]];
	return v;
}

/* comp[i]: a representative of output i's independent part (its value
 * id's root), so that outputs with equal comp[] share an input or an
 * intermediate value. Values computed from constants alone (a number's
 * full, its broadcast) join nothing. NULL: out of memory. */
static int *independent_parts(cg *g)
{
	const fz_region *r = g->r;
	int nv = g->t->n_values;
	int *up = malloc(sizeof *up * (size_t)(nv + 1));
	bool *konst = calloc((size_t)nv + 1, 1);
	int *comp = malloc(sizeof *comp * (size_t)(r->n_out + 1));
	if (!up || !konst || !comp) {
		free(comp);
		comp = NULL;
		goto out;
	}
	for (int v = 0; v < nv; v++)
		up[v] = v;
	for (int i = 0; i < r->n_nodes; i++) { /* topological order */
		const fz_node *n = r->nodes[i];
		bool k = true;
		for (int a = 0; a < n->n_in; a++)
			k = k && konst[n->in[a]->id];
		for (int o = 0; o < n->n_out; o++) {
			konst[n->out[o]->id] = k;
			for (int a = 0; a < n->n_in; a++)
				if (!konst[n->in[a]->id])
					up[uf_find(up, n->in[a]->id)] = uf_find(up, n->out[o]->id);
		}
	}
	for (int i = 0; i < r->n_out; i++)
		comp[i] = uf_find(up, r->out[i]->id);
out:
	free(up);
	free(konst);
	return comp;
}

/* Every output in shape groups but those of shape `skip` (NULL: none);
 * index_add's result (of ia, where given) stores x. On the host a group
 * is also one independent part (see above). */
static void all_groups(cg *g, const fz_node *ia, const fz_type *skip)
{
	const fz_region *r = g->r;
	bool *done = calloc((size_t)r->n_out + 1, 1);
	const fz_value **outs = calloc((size_t)r->n_out + 1, sizeof *outs);
	const fz_value **src = calloc((size_t)r->n_out + 1, sizeof *src);
	bool split = g->o.target == FZ_CG_HOST && r->n_out > 1;
	int *comp = split ? independent_parts(g) : NULL;
	if (!done || !outs || !src || (split && !comp)) {
		cg_fail(g, FZ_ENOMEM, NULL, "out of memory");
		goto out;
	}
	for (int i = 0; i < r->n_out && g->st == FZ_OK; i++) {
		if (done[i] || (skip && fz_same_shape(&r->out[i]->type, skip)))
			continue;
		int n = 0;
		for (int j = i; j < r->n_out; j++) {
			if (done[j] || !fz_same_shape(&r->out[i]->type, &r->out[j]->type) ||
			    (comp && comp[j] != comp[i]))
				continue;
			done[j] = true;
			outs[n] = r->out[j];
			src[n] = ia && r->out[j] == ia->out[0] ? ia->in[0] : r->out[j];
			n++;
		}
		group_loop(g, &r->out[i]->type, n, outs, src);
	}
out:
	free(done);
	free(outs);
	free(src);
	free(comp);
}

void cg_pointwise(cg *g)
{
	cg_function_begin(g, g->k->names[0]);
	if (g->st == FZ_OK)
		all_groups(g, NULL, NULL);
	cg_function_end(g);
}

/* EMU: a 16-bit float atomic add as the compare-and-swap loop a GPU
 * without atom.add.bf16 runs (the host's atomicrmw fadd on bfloat would
 * call a libgcc routine this process may lack): read, add in f32, round
 * to the storage type, swap if unchanged, else again. */
static void emu_atomic_add_half(cg *g, V p, V v, fz_dtype d)
{
	T i16 = t_i16(g);
	LLVMBasicBlockRef pre = current(g), loop = block(g, "cas"), done = block(g, "cas.done");
	V first = load(g, i16, p, 2);
	br(g, loop);
	at_end(g, loop);
	V old = phi(g, i16);
	V oldv = cg_from_storage(g, d == FZ_F16 ? bitcast(g, old, t_f16(g)) : old, d);
	V nv = cg_to_storage(g, fadd(g, oldv, v), d);
	if (d == FZ_F16)
		nv = bitcast(g, nv, i16);
	V pair = LLVMBuildAtomicCmpXchg(g->b, p, old, nv, LLVMAtomicOrderingMonotonic,
					LLVMAtomicOrderingMonotonic, 0);
	V seen = LLVMBuildExtractValue(g->b, pair, 0, "");
	V ok = LLVMBuildExtractValue(g->b, pair, 1, "");
	phi_add(old, first, pre);
	phi_add(old, seen, current(g));
	cond_br(g, ok, done, loop);
	at_end(g, done);
}

/* One step of a scatter at src index J (n lanes along the innermost dim
 * under one index): reads the index, flags a bad one and skips it (a bad
 * index adds nothing anywhere: row 0 may not exist: x may have no rows at
 * all), and returns y's address for the adds, in block scatter.add; the
 * step ends in *next. What the adds add is computed before, in the step's
 * first block. */
static V scatter_target(cg *g, const fz_node *ia, const cg_ix *J, int n,
			LLVMBasicBlockRef *next)
{
	const fz_value *x = ia->in[0], *idx = ia->in[1], *y = ia->out[0];
	int dim = ia->attrs.dim;
	cg_ix K[1][FZ_MAX_RANK], I[FZ_MAX_RANK];
	K[0][0] = J[dim];
	V k;
	cg_value(g, idx, 1, K, &k);
	V E = zext_or_trunc(g, cg_ext(g, x->type.dims[dim]), t_i64(g));
	V bad = icmp(g, LLVMIntUGE, k, E);
	cg_flag_error(g, ia, bad);
	LLVMBasicBlockRef add_b = block(g, "scatter.add");
	*next = block(g, "scatter.next");
	cond_br(g, bad, *next, add_b);
	at_end(g, add_b);
	memcpy(I, J, sizeof I);
	I[dim] = cg_ix_of(zext_or_trunc(g, k, g->ity), 1);
	cg_ix lin;
	cg_linear(g, &y->type, I, &lin);
	return cg_access_ptr(g, g->slot[y->id], y->type.dtype, cg_ix_value(g, lin), n,
			     true, (unsigned)fz_dtype_size(y->type.dtype));
}

/* The host's scatter of f32 or f64 along a dim other than the innermost
 * (an embedding's backward: rows of dy added into the rows of the table
 * that idx names): L lanes along the innermost dim share one index, so a
 * step reads the index once and adds a vector of src into a vector of y
 * (the one-element loop read the index, checked it and added one element
 * at a time). false: not such a scatter. */
static bool scatter_lanes(cg *g, const fz_node *ia, fz_ext numel)
{
	const fz_value *src = ia->in[2], *y = ia->out[0];
	int dim = ia->attrs.dim, last = src->type.rank - 1;
	fz_dtype d = y->type.dtype;
	if (g->o.target != FZ_CG_HOST || last < 0 || dim == last ||
	    (d != FZ_F32 && d != FZ_F64) || src->type.dtype != d)
		return false;
	int L = cg_lanes_fit(g, cg_lanes_for(g), src->type.dims[last]);
	if (L < 2)
		return false;
	if (L > g->k->vec)
		g->k->vec = L;
	fz_ext work = numel;
	work.c /= L;
	V gid, lim = cg_ext(g, work);
	cg_host_chunk(g, lim, &gid, &lim); /* serial: after the copy, in part 0 */
	cg_loop Lp;
	cg_loop_begin(g, &Lp, gid, lim, c_int(g->ity, 1));
	cg_ix J[FZ_VW_MAX][FZ_MAX_RANK];
	cg_delinearize(g, &src->type, mul(g, Lp.iv, c_int(g->ity, L)), L, J[0]);
	for (int l = 1; l < L; l++) {
		memcpy(J[l], J[0], sizeof J[0]);
		J[l][last].o += l;
	}
	V v[FZ_VW_MAX];
	cg_value(g, src, L, J, v);
	LLVMBasicBlockRef next;
	V p = scatter_target(g, ia, J[0], L, &next);
	unsigned es = (unsigned)fz_dtype_size(d);
	T vt = t_vec(cg_stype(g, d), (unsigned)L);
	store(g, fadd(g, load(g, vt, p, es), pack(g, vt, v, L)), p, es);
	br(g, next);
	at_end(g, next);
	cg_loop_end(g, &Lp);
	return true;
}

/* ---- the scatter by rows (host) ---------------------------------------------------
 * A scatter along dim 0 of f32 or f64 lanes into rows narrower than a
 * gather takes (fz_index_add_gathers: under 64 elements), which part 0 of
 * a launch did alone, the copy too, the other threads idle. The host
 * splits it by the rows of the result y instead: part p copies its chunk of y's rows [r0, r1) from x
 * (cg_host_chunk over the rows, the copy's group_loop the same), then
 * walks every row n of src in order, reads idx[n] and adds row n into y
 * when the index falls in [r0, r1). So each element of y gets its adds
 * from one part, in src's order, as the serial loop adds them (the same
 * f32 sums, bit for bit), a part adds only into rows it copied itself (no
 * wait between the copy and the adds, no race), and a bad index is
 * flagged by every part and added nowhere. Every part reads the whole of
 * idx (8 bytes a row of src); rows that many indices name (a padding
 * token's) stay with one part, as they were with part 0. A large copy
 * streams (emit.c's "streaming stores"): the adds read back only the rows
 * idx names. */
static bool rows_fit(cg *g, const fz_node *ia)
{
	const fz_value *src = ia->in[2], *y = ia->out[0];
	int last = src->type.rank - 1;
	fz_dtype d = y->type.dtype;
	return g->o.target == FZ_CG_HOST && ia->attrs.dim == 0 && last >= 1 &&
	       (d == FZ_F32 || d == FZ_F64) && src->type.dtype == d &&
	       cg_lanes_fit(g, cg_lanes_for(g), src->type.dims[last]) >= 2;
}

static void scatter_rows(cg *g, const fz_node *ia)
{
	const fz_value *idx = ia->in[1], *src = ia->in[2], *y = ia->out[0];
	int last = src->type.rank - 1;
	fz_dtype d = y->type.dtype;
	int L = cg_lanes_fit(g, cg_lanes_for(g), src->type.dims[last]);
	if (L > g->k->vec)
		g->k->vec = L;
	fz_type rest = src->type; /* a row of src */
	rest.rank--;
	memmove(rest.dims, rest.dims + 1, sizeof rest.dims[0] * (size_t)rest.rank);
	fz_ext rn;
	if (!fz_type_numel(&rest, &rn)) {
		cg_fail(g, FZ_EUNSUPPORTED, ia, "element count overflows");
		return;
	}
	V E = cg_ext(g, y->type.dims[0]), r0, r1;
	cg_host_chunk(g, E, &r0, &r1);
	T i64 = t_i64(g);
	V E64 = zext_or_trunc(g, E, i64), lo = zext_or_trunc(g, r0, i64),
	  hi = zext_or_trunc(g, r1, i64);
	V per = udiv(g, cg_ext(g, rn), c_int(g->ity, L));
	cg_loop Ln;
	cg_loop_begin(g, &Ln, c_int(g->ity, 0), cg_ext(g, src->type.dims[0]),
		      c_int(g->ity, 1));
	cg_ix K[1][FZ_MAX_RANK];
	K[0][0] = cg_ix_of(Ln.iv, 1);
	V k;
	cg_value(g, idx, 1, K, &k);
	cg_flag_error(g, ia, icmp(g, LLVMIntUGE, k, E64));
	LLVMBasicBlockRef row = block(g, "scatter.row"), next = block(g, "scatter.next");
	cond_br(g, and_(g, icmp(g, LLVMIntUGE, k, lo), icmp(g, LLVMIntULT, k, hi)), row, next);
	at_end(g, row);
	V kk = zext_or_trunc(g, k, g->ity);
	cg_loop Lc;
	cg_loop_begin(g, &Lc, c_int(g->ity, 0), per, c_int(g->ity, 1));
	cg_ix R[FZ_MAX_RANK], J[FZ_VW_MAX][FZ_MAX_RANK];
	cg_delinearize(g, &rest, mul(g, Lc.iv, c_int(g->ity, L)), L, R);
	J[0][0] = K[0][0];
	memcpy(&J[0][1], R, sizeof R[0] * (size_t)rest.rank);
	for (int l = 1; l < L; l++) {
		memcpy(J[l], J[0], sizeof J[0]);
		J[l][last].o += l;
	}
	V v[FZ_VW_MAX];
	cg_value(g, src, L, J, v);
	cg_ix I[FZ_MAX_RANK], lin;
	memcpy(I, J[0], sizeof I);
	I[0] = cg_ix_of(kk, 1);
	cg_linear(g, &y->type, I, &lin);
	unsigned es = (unsigned)fz_dtype_size(d);
	V p = cg_access_ptr(g, g->slot[y->id], d, cg_ix_value(g, lin), L, true, es);
	T vt = t_vec(cg_stype(g, d), (unsigned)L);
	store(g, fadd(g, load(g, vt, p, es), pack(g, vt, v, L)), p, es);
	cg_loop_end(g, &Lc);
	br(g, next);
	at_end(g, next);
	cg_loop_end(g, &Ln);
}

/* ---- the scatter as a gather (host) ----------------------------------------------
 * An embedding's backward is index_add(zeros f32, idx, dy, dim=0) and a
 * cast to bf16: 8192 rows of 1024 added into a table of 32000 rows. As a
 * scatter it wrote the f32 table (131 MB of zeros), added into it, and a
 * second kernel read it all again to write 65 MB of bf16: 54% of a copy's
 * bandwidth for what reads 17 MB and writes 65. The host turns index_add
 * along dim 0 around instead (into rows of 64 elements or more,
 * fz_index_add_gathers: each row costs a few words of the inverse and a
 * turn of the loops; a million rows of one f32 took 7 times the serial
 * scatter's time): each row of the result y is
 * written once, from x's row and the rows of src that idx sends there,
 * summed in registers; elementwise work at y's shape in the same region
 * (the cast: ir/partition.c's scatter_follower) takes the sums where they
 * are, and only the region's outputs are written.
 *
 * Which rows of src go to row r is idx's inverse: a stable counting sort
 * by destination, in the kernel's scratch block (fz_kernel.scratch:
 * E + N index words, for E rows of y and N of src; runtime/exec.c gives
 * it). The parts of a launch split y's rows and need no barrier: a part
 * with rows [r0, r1) sorts only those, in its own words of the block:
 *
 *   count   cnt[r] = 0 for r in [r0, r1); for n in 0 .. N-1: k = idx[n],
 *           flagged where bad (every part flags; nothing adds it),
 *           below += k < r0, cnt[k]++ where r0 <= k < r1
 *   offsets cnt[r] = below + the counts of rows r0 .. r-1
 *   place   for n in 0 .. N-1 in order: pos[cnt[k]++] = n where
 *           r0 <= k < r1 (pos: the N words after the E counts; the part's
 *           sources land at pos[below ..], where a sort of all rows would
 *           put them, so no two parts write one word)
 *   rows    for r in [r0, r1), for each U lane groups of the row: acc = x
 *           there; acc += src's row pos[j] there for j from the end of
 *           row r - 1 (below for r0) to cnt[r], in order; y is acc there,
 *           and each output at y's shape is stored there
 *
 * So each element adds its sources to x in index order, as the serial
 * scatter does (f16 and bf16 round at each add, integers wrap), bit for
 * bit; a row no index names is x's (the cast of zero, streamed), in a
 * loop of its own where what x folds to is stored as it is (zeros: most
 * of an embedding's rows, which computed the rounding of a zero sum for
 * each lane group before). A part reads the whole of idx twice (16
 * bytes a row of src); each row of src is read once, U lane groups at a
 * time (4 of 16 lanes: two cache lines of a bf16 row, which a row of many
 * sources, a padding token's, walks line by line). Outputs of other
 * shapes (values made before the index_add that other regions read) are
 * written by group loops first, as the pointwise skeleton writes them.
 * cpu_bench.py's case (32000 x 1024 from 8192 rows of bf16) at one
 * thread, CPU time (kernel_ab.py, indices in [0, 97)): 19.8 ms for the
 * two kernels before, 3.8 ms with the gather, 4.3 against 6.3 on a Zen 3
 * with the empty rows' loop. */
static unsigned word_bytes(cg *g) { return LLVMGetIntTypeWidth(g->ity) / 8; }

static V word_load(cg *g, V base, V i)
{
	return load(g, g->ity, gep(g, g->ity, base, i), word_bytes(g));
}

static void word_store(cg *g, V base, V i, V x)
{
	store(g, x, gep(g, g->ity, base, i), word_bytes(g));
}

/* A loop over the rows n of src (its iv), reading k = idx[n] as i64. */
static V idx_loop_begin(cg *g, const fz_node *ia, cg_loop *L)
{
	cg_loop_begin(g, L, c_int(g->ity, 0), cg_ext(g, ia->in[2]->type.dims[0]),
		      c_int(g->ity, 1));
	cg_ix K[1][FZ_MAX_RANK];
	K[0][0] = cg_ix_of(L->iv, 1);
	V k;
	cg_value(g, ia->in[1], 1, K, &k);
	return k;
}

/* count, offsets, place: the part's rows [r0, r1) of idx's inverse;
 * returns the slot holding `below`, where the part's sources start. */
static V inverse(cg *g, const fz_node *ia, V r0, V r1)
{
	T i64 = t_i64(g);
	V E64 = zext_or_trunc(g, cg_ext(g, ia->out[0]->type.dims[0]), i64);
	V lo = zext_or_trunc(g, r0, i64), hi = zext_or_trunc(g, r1, i64);
	V zero = c_int(g->ity, 0), one = c_int(g->ity, 1), cnt = g->scratch;
	V pos = gep(g, g->ity, cnt, cg_ext(g, ia->out[0]->type.dims[0]));
	unsigned ws = word_bytes(g);
	cg_loop Lz, Lc, Lo, Lp;
	cg_loop_begin(g, &Lz, r0, r1, one);
	word_store(g, cnt, Lz.iv, zero);
	cg_loop_end(g, &Lz);
	V below = cg_entry_alloca(g, g->ity), run = cg_entry_alloca(g, g->ity);
	store(g, zero, below, ws);

	V k = idx_loop_begin(g, ia, &Lc);
	cg_flag_error(g, ia, icmp(g, LLVMIntUGE, k, E64));
	store(g, add(g, load(g, g->ity, below, ws),
		     zext_or_trunc(g, icmp(g, LLVMIntULT, k, lo), g->ity)), below, ws);
	LLVMBasicBlockRef mine = block(g, "count.mine"), next = block(g, "count.next");
	cond_br(g, and_(g, icmp(g, LLVMIntUGE, k, lo), icmp(g, LLVMIntULT, k, hi)), mine, next);
	at_end(g, mine);
	V kk = zext_or_trunc(g, k, g->ity);
	word_store(g, cnt, kk, add(g, word_load(g, cnt, kk), one));
	br(g, next);
	at_end(g, next);
	cg_loop_end(g, &Lc);

	store(g, load(g, g->ity, below, ws), run, ws);
	cg_loop_begin(g, &Lo, r0, r1, one);
	V c = word_load(g, cnt, Lo.iv), at = load(g, g->ity, run, ws);
	word_store(g, cnt, Lo.iv, at);
	store(g, add(g, at, c), run, ws);
	cg_loop_end(g, &Lo);

	k = idx_loop_begin(g, ia, &Lp);
	mine = block(g, "place.mine");
	next = block(g, "place.next");
	cond_br(g, and_(g, icmp(g, LLVMIntUGE, k, lo), icmp(g, LLVMIntULT, k, hi)), mine, next);
	at_end(g, mine);
	kk = zext_or_trunc(g, k, g->ity);
	at = word_load(g, cnt, kk);
	word_store(g, pos, at, Lp.iv);
	word_store(g, cnt, kk, add(g, at, one));
	br(g, next);
	at_end(g, next);
	cg_loop_end(g, &Lp);
	return below;
}

/* What gather_rows' row loop needs of a row's lane groups */
typedef struct gather_at {
	const fz_node *ia;
	fz_type rest;          /* a row of y */
	fz_ext per;            /* U lane groups a step of the row */
	int L, U;
	V acc[4][FZ_VW_MAX];
	T ct;
	unsigned ca;
	V pos;                 /* the inverse's positions */
} gather_at;

/* Row r's lane groups: acc = x, plus src's rows pos[s .. e) unless the row
 * is empty (none), then y and every output of y's shape stored. */
static void gather_cols(cg *g, const gather_at *G, V r, V s, V e, bool empty)
{
	const fz_region *rg = g->r;
	const fz_value *x = G->ia->in[0], *src = G->ia->in[2], *y = G->ia->out[0];
	fz_dtype d = y->type.dtype;
	int L = G->L, U = G->U, nr = G->rest.rank;
	V zero = c_int(g->ity, 0), one = c_int(g->ity, 1);
	cg_loop Lc, Lj;
	cg_loop_begin(g, &Lc, zero, cg_ext(g, G->per), one);
	cg_ix ix[4][FZ_VW_MAX][FZ_MAX_RANK];
	V a[4][FZ_VW_MAX];
	for (int u = 0; u < U; u++) {
		ix[u][0][0] = cg_ix_of(r, 1);
		if (nr)
			cg_delinearize(g, &G->rest, mul(g, add(g, mul(g, Lc.iv, c_int(g->ity, U)),
							       c_int(g->ity, u)),
							c_int(g->ity, L)), L, &ix[u][0][1]);
		for (int l = 1; l < L; l++) {
			memcpy(ix[u][l], ix[u][0], sizeof ix[u][0]);
			ix[u][l][nr].o += l;
		}
		cg_value(g, x, L, ix[u], a[u]);
		for (int l = 0; l < L && !empty; l++)
			store(g, a[u][l], G->acc[u][l], G->ca);
	}
	if (!empty) {
		cg_loop_begin(g, &Lj, s, e, one);
		V n = word_load(g, G->pos, Lj.iv);
		for (int u = 0; u < U; u++) {
			cg_ix J[FZ_VW_MAX][FZ_MAX_RANK];
			memcpy(J, ix[u], sizeof J);
			for (int l = 0; l < L; l++)
				J[l][0] = cg_ix_of(n, 1);
			V v[FZ_VW_MAX];
			cg_value(g, src, L, J, v);
			for (int l = 0; l < L; l++) {
				V t = load(g, G->ct, G->acc[u][l], G->ca);
				V sum = fz_dtype_is_float(d) ? fadd_exact(g, t, v[l]) : add(g, t, v[l]);
				store(g, cg_from_storage(g, cg_to_storage(g, sum, d), d),
				      G->acc[u][l], G->ca);
			}
		}
		cg_loop_end(g, &Lj);
		for (int u = 0; u < U; u++)
			for (int l = 0; l < L; l++)
				a[u][l] = load(g, G->ct, G->acc[u][l], G->ca);
	}
	for (int u = 0; u < U && g->st == FZ_OK; u++) {
		cg_value_given(g, y, L, ix[u], a[u]);
		for (int i = 0; i < rg->n_out && g->st == FZ_OK; i++) {
			if (!fz_same_shape(&rg->out[i]->type, &y->type))
				continue;
			V v[FZ_VW_MAX];
			cg_value(g, rg->out[i], L, ix[u], v);
			cg_store(g, rg->out[i], L, ix[u], v);
		}
	}
	cg_loop_end(g, &Lc);
}

static void gather_rows(cg *g, const fz_node *ia)
{
	const fz_region *r = g->r;
	const fz_value *src = ia->in[2], *y = ia->out[0];
	fz_dtype d = y->type.dtype;
	gather_at G = {.ia = ia, .rest = y->type};
	G.rest.rank--; /* a row of y */
	memmove(G.rest.dims, G.rest.dims + 1, sizeof G.rest.dims[0] * (size_t)G.rest.rank);
	fz_ext rn, numel;
	if (!fz_type_numel(&G.rest, &rn) || !fz_type_numel(&y->type, &numel)) {
		cg_fail(g, FZ_EUNSUPPORTED, ia, "element count overflows");
		return;
	}
	int L = G.rest.rank ? cg_lanes_fit(g, cg_lanes_for(g), G.rest.dims[G.rest.rank - 1]) : 1;
	int U = 4;
	while (U > 1 && (rn.c / L) % U)
		U /= 2;
	if (L > g->k->vec)
		g->k->vec = L;
	G.L = L;
	G.U = U;
	fz_ext work = numel;
	G.per = rn;
	G.per.c /= L * U;
	work.c /= L;
	add_work(g, 0, work);
	/* the inverse's words: E counts, then N positions */
	g->k->n_scratch = 2;
	g->k->scratch[0] = y->type.dims[0];
	g->k->scratch[1] = src->type.dims[0];
	for (int i = 0; i < 2; i++)
		g->k->scratch[i].c *= (int64_t)word_bytes(g);
	cg_function_begin(g, g->k->names[0]);
	if (g->st != FZ_OK)
		return;
	all_groups(g, NULL, &y->type);
	if (g->st != FZ_OK)
		return;

	V one = c_int(g->ity, 1), r0, r1;
	unsigned ws = word_bytes(g);
	cg_host_chunk(g, cg_ext(g, y->type.dims[0]), &r0, &r1);
	V below = inverse(g, ia, r0, r1);
	G.pos = gep(g, g->ity, g->scratch, cg_ext(g, y->type.dims[0]));
	G.ct = cg_ctype(g, d);
	G.ca = LLVMABIAlignmentOfType(LLVMGetModuleDataLayout(g->mod), G.ct);
	for (int u = 0; u < U; u++)
		for (int l = 0; l < L; l++)
			G.acc[u][l] = cg_entry_alloca(g, G.ct);
	V start = cg_entry_alloca(g, g->ity);
	store(g, load(g, g->ity, below, ws), start, ws);

	int ny = 0;
	for (int i = 0; i < r->n_out; i++)
		ny += fz_same_shape(&r->out[i]->type, &y->type);
	g->stream = cg_stream_fits(g, ny); /* each row written once, never read */
	cg_loop Lr;
	cg_loop_begin(g, &Lr, r0, r1, one);
	V s = load(g, g->ity, start, ws), e = word_load(g, g->scratch, Lr.iv);
	store(g, e, start, ws);
	/* a row no index names (most of an embedding's) is x's: its own loop,
	 * where what x's value folds to (a cast of zero) is stored as such */
	LLVMBasicBlockRef none = block(g, "row.empty"), some = block(g, "row.sources"),
			  next = block(g, "row.next");
	cond_br(g, icmp(g, LLVMIntEQ, s, e), none, some);
	for (int k = 0; k < 2 && g->st == FZ_OK; k++) {
		at_end(g, k ? some : none);
		int mark = cg_memo_mark(g), cse = g->n_cse;
		gather_cols(g, &G, Lr.iv, s, e, k == 0);
		cg_memo_pop(g, mark); /* what each branch computed lives there */
		g->n_cse = cse;
		br(g, next);
	}
	at_end(g, next);
	cg_loop_end(g, &Lr);
	g->stream = false;
	cg_function_end(g);
}

static void scatter_loop(cg *g, const fz_node *ia)
{
	const fz_value *src = ia->in[2], *y = ia->out[0];
	fz_dtype d = y->type.dtype;
	fz_ext numel;
	if (!fz_type_numel(&src->type, &numel)) {
		cg_fail(g, FZ_EUNSUPPORTED, ia, "element count overflows");
		return;
	}
	add_work(g, cg_gpu(g) ? 1 : 0, numel);
	if (g->by_rows) {
		scatter_rows(g, ia);
		return;
	}
	if (scatter_lanes(g, ia, numel))
		return;
	if (cg_gpu(g) && d == FZ_BOOL) {
		cg_fail(g, FZ_EUNSUPPORTED, ia, "index_add of %s needs an atomic add "
			"the GPU lacks", fz_dtype_name(d));
		return;
	}
	V gid = add(g, mul(g, cg_ctaid(g), cg_ntid(g)), cg_tid(g));
	V gsz = mul(g, cg_nctaid(g), cg_ntid(g));
	V lim = cg_ext(g, numel);
	if (g->o.target == FZ_CG_HOST) /* serial: after the copy, in part 0 */
		cg_host_chunk(g, lim, &gid, &lim);
	cg_loop L;
	cg_loop_begin(g, &L, gid, lim, gsz);
	cg_ix J[1][FZ_MAX_RANK];
	cg_delinearize(g, &src->type, L.iv, 1, J[0]);
	V v;
	cg_value(g, src, 1, J, &v);
	LLVMBasicBlockRef next;
	V p = scatter_target(g, ia, J[0], 1, &next);
	if (g->o.target == FZ_CG_EMU && (d == FZ_BF16 || d == FZ_F16)) {
		emu_atomic_add_half(g, p, v, d);
	} else if (cg_gpu(g) && d == FZ_BF16) {
		/* bf16 is i16 in storage; the atomic adds a bfloat (atom.add.bf16
		 * on sm_90, a compare-and-swap loop that LLVM writes below) */
		V b = bitcast(g, cg_to_storage(g, v, d), LLVMBFloatTypeInContext(g->ctx));
		atomic_add(g, LLVMAtomicRMWBinOpFAdd, p, b);
	} else if (cg_gpu(g)) {
		atomic_add(g, fz_dtype_is_float(d) ? LLVMAtomicRMWBinOpFAdd :
			   LLVMAtomicRMWBinOpAdd, p, cg_to_storage(g, v, d));
	} else {
		unsigned es = (unsigned)fz_dtype_size(d);
		V old = cg_from_storage(g, load(g, cg_stype(g, d), p, es), d);
		V sum = fz_dtype_is_float(d) ? fadd(g, old, v) : add(g, old, v);
		store(g, cg_to_storage(g, sum, d), p, es);
	}
	br(g, next);
	at_end(g, next);
	cg_loop_end(g, &L);
}

void cg_scatter(cg *g, const fz_node *ia)
{
	if (g->o.target == FZ_CG_HOST && fz_index_add_gathers(ia)) {
		gather_rows(g, ia);
		return;
	}
	for (int j = 0; j < g->r->n_nodes; j++)
		for (int a = 0; a < g->r->nodes[j]->n_in; a++)
			if (g->r->nodes[j]->in[a] == ia->out[0]) {
				cg_fail(g, FZ_EUNSUPPORTED, ia, "the result of index_add is "
					"read inside its own region (only the host's "
					"gather by rows takes that)");
				return;
			}
	if (g->slot[ia->out[0]->id] < g->r->n_in) {
		cg_fail(g, FZ_EUNSUPPORTED, ia, "index_add's result is not a region output");
		return;
	}
	/* On the host both loops are one function: the scatter must follow
	 * the whole copy and its adds must not race, so part 0 runs it all,
	 * or each part its rows (see "the scatter by rows") */
	g->by_rows = rows_fit(g, ia) ? ia : NULL;
	g->serial = g->o.target == FZ_CG_HOST && !g->by_rows;
	cg_function_begin(g, g->k->names[0]);
	if (g->st == FZ_OK)
		all_groups(g, ia, NULL);
	if (cg_gpu(g)) {
		cg_function_end(g);
		cg_memo_pop(g, 0);
		g->n_cse = 0;
		g->k->n_entries = 2;
		cg_function_begin(g, g->k->names[1]);
	}
	if (g->st == FZ_OK)
		scatter_loop(g, ia);
	cg_function_end(g);
}

/* ---- launch heuristic -------------------------------------------------------- */

static int64_t eval_max(const fz_kernel *k, int e, const int64_t *syms)
{
	int64_t w = 0;
	for (int i = 0; i < k->n_work[e]; i++) {
		int64_t x = fz_ext_eval(k->work[e][i], syms);
		if (x > w)
			w = x;
	}
	return w;
}

void fz_kernel_launch_dims(const fz_kernel *k, int e, const int64_t *syms,
			   int64_t *grid, int *block)
{
	fz_kernel_launch_dims_on(k, e, syms, 132, grid, block);
}

void fz_kernel_launch_dims_on(const fz_kernel *k, int e, const int64_t *syms,
			      int sm_count, int64_t *grid, int *block)
{
	if (k->sk == FZ_SK_TILE) {
		/* tiles of k->vec rows of work[0], times work[1] (codegen/mma.c) */
		int64_t rows = fz_ext_eval(k->work[e][0], syms), per = k->vec > 0 ? k->vec : 1;
		int64_t n = k->n_work[e] > 1 ? fz_ext_eval(k->work[e][1], syms) : 1;
		int64_t g = (rows + per - 1) / per * n;
		*grid = g < 1 ? 1 : g > INT32_MAX ? INT32_MAX : g;
		*block = FZ_TILE_BLOCK;
		return;
	}
	int64_t w = eval_max(k, e, syms), gmax = 65535;
	int b = 256;
	int64_t per = 256; /* work items per block */
	if (k->sk == FZ_SK_ROW) {
		if (k->par == FZ_PAR_BLOCK) {
			per = 1;
			b = FZ_ROW_BLOCK; /* a register-held row's stride needs it */
		} else if (k->par == FZ_PAR_WARP) {
			b = 128;
			per = 4;
		}
	} else {
		/* a grid-stride loop: a few waves of blocks */
		gmax = (int64_t)(sm_count > 0 ? sm_count : 132) * 32;
	}
	int64_t g = (w + per - 1) / per;
	*grid = g < 1 ? 1 : g > gmax ? gmax : g;
	*block = b;
}
