/*
 * table.c: a costly expression of one 16-bit value, read from a table (host).
 *
 * A bf16 or f16 value has 65,536 bit patterns, so any expression of it
 * alone has 65,536 results. swiglu's silu(g) (g bf16: an exp, an add, a
 * division, a multiply and a rounding to bf16: 22 AVX-512 instructions for
 * 16 lanes, the division alone 10 cycles) and gelu's tanh form of x + b
 * (rounded to bf16 first, as eager PyTorch rounds it) take longer per
 * element on this machine's cores than its memory takes to bring the
 * element in. A table of the results makes each one a gather: vpgatherdd,
 * 16 lanes in a few cycles where the entries are in L1, and a layer's
 * activations touch a few thousand entries (their exponents span a dozen
 * or two binades). swiglu bf16 at one thread, 256K elements in L2: 29
 * cycles per 16 elements computed, 12 through the table. From memory
 * (tools/bench/cpu_bench.py, two threads, two runs against the code
 * before): swiglu bf16 4096² from 71% and 81% of a copy's bandwidth to
 * 126% and 132% (it reads two bytes for every one it writes), gelu_bias
 * from 42% and 44% to 89% and 96%. (Those figures are an AVX-512 Intel
 * core's. Without AVX-512 the gather is lane by lane, see gather(), and
 * on AMD's Zen 3 computing instead was 1.6x slower for gelu_bias, 1.4x
 * for swiglu.)
 *
 * What is tabled. A leaf is a region input of dtype bf16 or f16, or a
 * value of those dtypes that an elementwise op of the region makes (its
 * compute value is rounded to the dtype, so its bits index a table too:
 * gelu_bias's x + b). A value v is a root when
 *   - every path from v down ends at one leaf x or at a constant (full,
 *     and views of it), through elementwise ops only (unary, binary,
 *     ternary, casts: the same index reads x wherever v is read at it),
 *     their values floats or bools: v = f(x);
 *   - f has a transcendental op in it (exp, log, tanh, sigmoid, erf, pow,
 *     sin, cos: what makes it cost more than the table's gather);
 *   - v's compute type is f32 and its shape is x's;
 *   - something reads v that is not itself a function of x alone (an op
 *     of x and another input, a reduction, a view) or v is an output: the
 *     largest f(x) is the one tabled, not each of its steps;
 *   - v has as many elements as its table or more, or a symbolic count (a
 *     smaller kernel would compute its 65,536 entries for fewer uses).
 * At most CG_TAB_MAX roots a region, the first in topological order. A
 * root of dtype bf16 or f16 has a table of its storage bits (128 KiB: half
 * the lines for the gathers to keep in L1; a lane read from it is stored
 * with no conversion), an f32 root one of f32 (256 KiB).
 *
 * The table is filled by the same code the kernel would run: an internal
 * function of the module, <kernel>_tables, emits each root over the 65,536
 * patterns (cg_value with the leaf's lanes given, 16 at a time) and stores
 * the lanes; so a tabled kernel's results are bit for bit those of the
 * computing one (tests/test_codegen.c compares them over every pattern).
 * The tables are zero-initialized internal globals (bss: nothing in the
 * object the cache keeps) and a guard word: every part's entry calls
 * <kernel>_tables, which returns at once when the guard says filled (an
 * acquire load); the first caller takes the guard from 0 to 1, fills
 * (4,096 steps of the expression: tens of microseconds), and releases it
 * as 2; a part that finds 1 waits with pause until 2. The GPU and its
 * emulation keep computing: their lanes are threads, and a gather per
 * thread from a table in global memory is no saving there.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg.h"
#include "llvm.h"

#define CG_TAB_N 65536

/* dep[] by value id: what a value is a function of */
enum { DEP_MANY = -2, DEP_CONST = -1 }; /* >= 0: the id of the leaf */

static bool half_float(fz_dtype d) { return d == FZ_BF16 || d == FZ_F16; }

static int dep_of(const cg *g, const int *dep, const fz_value *w)
{
	int s = g->slot[w->id];
	if (s >= 0 && s < g->r->n_in)
		return half_float(w->type.dtype) && w->type.rank > 0 ? w->id : DEP_MANY;
	return dep[w->id];
}

static int dep_node(const cg *g, const int *dep, const fz_node *n)
{
	fz_opclass cls = fz_ops[n->op].cls;
	fz_dtype d = n->out[0]->type.dtype;
	if (n->n_out != 1)
		return DEP_MANY;
	if (cls == FZ_CLASS_CREATION)
		return n->op == FZ_OP_FULL && n->attrs.value_sym < 0 ? DEP_CONST : DEP_MANY;
	bool elementwise = cls == FZ_CLASS_UNARY || cls == FZ_CLASS_BINARY ||
			   cls == FZ_CLASS_TERNARY;
	if (!elementwise && cls != FZ_CLASS_META)
		return DEP_MANY;
	int acc = DEP_CONST;
	for (int i = 0; i < n->n_in; i++) {
		int w = dep_of(g, dep, n->in[i]);
		if (w == DEP_CONST)
			continue;
		/* a view moves the index: only constants pass through one */
		if (w == DEP_MANY || !elementwise || (acc >= 0 && acc != w))
			return DEP_MANY;
		acc = w;
	}
	/* floats and the bools of their comparisons: no op that flags an error */
	if (acc >= 0 && !fz_dtype_is_float(d) && d != FZ_BOOL)
		return DEP_MANY;
	return acc;
}

/* A value computed elementwise in the region with dtype bf16 or f16: its
 * compute value is rounded to the dtype, so it can index a table too
 * (gelu_bias's x + b) */
static bool leaf_node(const fz_node *n)
{
	fz_opclass cls = fz_ops[n->op].cls;
	return n->n_out == 1 && half_float(n->out[0]->type.dtype) &&
	       n->out[0]->type.rank > 0 && (cls == FZ_CLASS_UNARY ||
	       cls == FZ_CLASS_BINARY || cls == FZ_CLASS_TERNARY);
}

/* v's expression (a function of one leaf) has a transcendental op in it */
static bool costly(const cg *g, const int *dep, const fz_value *v, int *budget)
{
	int d = dep_of(g, dep, v);
	if (--*budget < 0 || d < 0 || d == v->id || !v->def)
		return false;
	const fz_node *n = v->def;
	if (cg_math_costly(n->op))
		return true;
	for (int i = 0; i < n->n_in; i++)
		if (costly(g, dep, n->in[i], budget))
			return true;
	return false;
}

static bool worth(cg *g, const int *dep, const fz_value *v)
{
	int leaf = dep[v->id];
	if (leaf < 0 || leaf == v->id || v->type.rank == 0 ||
	    cg_ctype(g, v->type.dtype) != t_f32(g))
		return false;
	const fz_value *x = g->t->values[leaf];
	if (x->type.rank != v->type.rank)
		return false;
	for (int i = 0; i < v->type.rank; i++)
		if (!fz_ext_eq(x->type.dims[i], v->type.dims[i]))
			return false;
	fz_ext n;
	if (!fz_type_numel(&v->type, &n) || (fz_ext_is_const(n) && n.c < CG_TAB_N))
		return false;
	int budget = 64;
	return costly(g, dep, v, &budget);
}

static void add_root(cg *g, const int *dep, const fz_value *v)
{
	if (g->n_tabs == CG_TAB_MAX || g->tab[v->id] || !worth(g, dep, v))
		return;
	struct cg_table *tb = &g->tabs[g->n_tabs++];
	tb->root = v;
	tb->leaf = g->t->values[dep[v->id]];
	char name[96];
	snprintf(name, sizeof name, "%s.tab%d", g->k->names[0], g->n_tabs - 1);
	/* a bf16 or f16 root's table holds its storage bits: half the lines
	 * for the gathers to keep in L1, and a lane read from it is stored
	 * without a conversion (emit.c's stored() takes the bits of an fpext
	 * of bf16; fptrunc of fpext of half folds); two entries more, for the
	 * 4-byte gather of the last one */
	bool half = half_float(v->type.dtype);
	T at = half ? t_arr(t_i16(g), CG_TAB_N + 2) : t_arr(t_f32(g), CG_TAB_N);
	tb->glob = LLVMAddGlobal(g->mod, at, name);
	LLVMSetInitializer(tb->glob, LLVMConstNull(at));
	LLVMSetLinkage(tb->glob, LLVMInternalLinkage);
	LLVMSetAlignment(tb->glob, 64);
	g->tab[v->id] = g->n_tabs;
}

/* The roots of the region (g->tabs, g->tab), host kernels only. */
static void plan(cg *g)
{
	const fz_region *r = g->r;
	int *dep = malloc(sizeof *dep * (size_t)(g->t->n_values + 1));
	g->tab = calloc((size_t)g->t->n_values + 1, sizeof *g->tab);
	if (!dep || !g->tab) {
		free(dep);
		cg_fail(g, FZ_ENOMEM, NULL, "out of memory");
		return;
	}
	for (int i = 0; i < g->t->n_values; i++)
		dep[i] = DEP_MANY;
	for (int i = 0; i < r->n_nodes; i++) {
		const fz_node *n = r->nodes[i];
		int d = dep_node(g, dep, n);
		if (d == DEP_MANY && leaf_node(n))
			d = n->out[0]->id;
		for (int o = 0; o < n->n_out; o++)
			dep[n->out[o]->id] = d;
	}
	for (int i = 0; i < r->n_nodes; i++) {
		const fz_node *n = r->nodes[i];
		for (int k = 0; k < n->n_in; k++) {
			int d = dep_of(g, dep, n->in[k]);
			if (d >= 0 && d != dep[n->out[0]->id])
				add_root(g, dep, n->in[k]);
		}
	}
	for (int i = 0; i < r->n_out; i++)
		if (dep[r->out[i]->id] >= 0)
			add_root(g, dep, r->out[i]);
	free(dep);
}

/* One table's 65,536 entries, 16 patterns a step. */
static void fill(cg *g, const struct cg_table *tb)
{
	enum { NL = FZ_VW_MAX };
	const fz_value *x = tb->leaf;
	cg_loop L;
	cg_loop_begin(g, &L, c_int(g->ity, 0), c_int(g->ity, CG_TAB_N), c_int(g->ity, NL));
	cg_ix ix[NL][FZ_MAX_RANK];
	V xs[NL], out[NL];
	T st = cg_stype(g, x->type.dtype);
	V base = trunc_(g, zext_or_trunc(g, L.iv, t_i32(g)), t_i16(g));
	for (int l = 0; l < NL; l++) {
		for (int d = 0; d < FZ_MAX_RANK; d++)
			ix[l][d] = cg_ix_zero();
		ix[l][x->type.rank - 1].o = l;
		V bits = add(g, base, c_int(t_i16(g), l));
		xs[l] = cg_from_storage(g, st == t_i16(g) ? bits : bitcast(g, bits, st),
					x->type.dtype);
	}
	cg_value_given(g, x, NL, ix, xs);
	cg_value(g, tb->root, NL, ix, out);
	fz_dtype d = tb->root->type.dtype;
	T et = half_float(d) ? t_i16(g) : t_f32(g);
	for (int l = 0; l < NL && half_float(d); l++) {
		V s = cg_to_storage(g, out[l], d);
		out[l] = type_of(s) == et ? s : bitcast(g, s, et);
	}
	V p = gep(g, et, tb->glob, zext_or_trunc(g, L.iv, t_i64(g)));
	store(g, pack(g, t_vec(et, NL), out, NL), p, (unsigned)fz_dtype_size(d) * NL);
	cg_loop_end(g, &L);
}

/* <kernel>_tables: fills the tables once, whichever part comes first. */
static V init_fn(cg *g)
{
	V fn = g->fn;
	LLVMBasicBlockRef entry = g->entry, at = current(g);
	char name[96];
	snprintf(name, sizeof name, "%s_tables", g->k->names[0]);
	T fty = LLVMFunctionType(t_void(g), NULL, 0, 0);
	g->fn = LLVMAddFunction(g->mod, name, fty);
	LLVMSetLinkage(g->fn, LLVMInternalLinkage);
	LLVMAddAttributeAtIndex(g->fn, LLVMAttributeFunctionIndex,
				LLVMCreateEnumAttribute(g->ctx,
					LLVMGetEnumAttributeKindForName("noinline", 8), 0));
	snprintf(name, sizeof name, "%s.tabs", g->k->names[0]);
	V guard = LLVMAddGlobal(g->mod, t_i32(g), name);
	LLVMSetInitializer(guard, c_i32(g, 0));
	LLVMSetLinkage(guard, LLVMInternalLinkage);
	LLVMBasicBlockRef b0 = block(g, "entry"), take = block(g, "take"),
			  wait = block(g, "wait"), work = block(g, "fill"), done = block(g, "done");
	g->entry = b0;
	at_end(g, b0);
	V s = load(g, t_i32(g), guard, 4);
	LLVMSetOrdering(s, LLVMAtomicOrderingAcquire);
	cond_br(g, icmp(g, LLVMIntEQ, s, c_i32(g, 2)), done, take);
	at_end(g, take);
	V x = LLVMBuildAtomicCmpXchg(g->b, guard, c_i32(g, 0), c_i32(g, 1),
				     LLVMAtomicOrderingAcquireRelease,
				     LLVMAtomicOrderingAcquire, 0);
	cond_br(g, LLVMBuildExtractValue(g->b, x, 1, ""), work, wait);
	at_end(g, wait);
	call_named(g, "llvm.x86.sse2.pause", fty, NULL, 0);
	s = load(g, t_i32(g), guard, 4);
	LLVMSetOrdering(s, LLVMAtomicOrderingAcquire);
	cond_br(g, icmp(g, LLVMIntEQ, s, c_i32(g, 2)), done, wait);
	at_end(g, work);
	g->tab_fill = true;
	for (int i = 0; i < g->n_tabs; i++)
		fill(g, &g->tabs[i]);
	g->tab_fill = false;
	V st = store(g, c_i32(g, 2), guard, 4);
	LLVMSetOrdering(st, LLVMAtomicOrderingRelease);
	br(g, done);
	at_end(g, done);
	ret_void(g);
	V init = g->fn;
	g->fn = fn;
	g->entry = entry;
	at_end(g, at);
	return init;
}

void cg_tables_begin(cg *g)
{
	if (g->o.target != FZ_CG_HOST || g->c->vector_bytes < 32 || !g->o.vectorize ||
	    g->r->kind == FZ_REGION_ATTENTION || !g->c->triple ||
	    strncmp(g->c->triple, "x86_64", 6) != 0)
		return;
	if (!g->tab) {
		plan(g);
		if (g->n_tabs)
			g->tab_init = init_fn(g);
	}
	if (g->tab_init)
		LLVMBuildCall2(g->b, LLVMGlobalGetValueType(g->tab_init), g->tab_init,
			       NULL, 0, "");
}

/* r[0..n) = entries idx[0..n) (i32) of table tab: f32, or with half the
 * 16-bit entry in the low half of an i32 (a 4-byte read at 2-byte steps:
 * x86 is little-endian).
 *
 * With AVX-512, x86's own gathers, with dword indices (LLVM's
 * masked.gather took the indices' zext from i16 for 64-bit ones: a
 * vpgatherqd per 8 lanes). Without, lane by lane: each index extracted
 * (vpextrw) and its entry loaded into its lane (vpinsrd from memory):
 * AVX2's vpgatherdd is slow on AMD's Zen 3 (LLVM's cost model scalarizes
 * masked.gather for it, and for Haswell), and took longer than the loads
 * do: gelu_bias bf16 4096^2 at one thread 13.8 -> 8.6 ms, swiglu 11.7 ->
 * 9.0 (tools/bench/kernel_ab.py, Zen 3). Writing the indices to the
 * stack for scalar loads was slower still (12.1 -> 13.2 ms: the loads
 * wait on the vector store). */
static void gather(cg *g, V tab, bool half, int n, const V *idx, V *r)
{
	T et = half ? t_i32(g) : t_f32(g);
	unsigned scale = half ? 2 : 4;
	bool own = cg_host_avx512(g);
	const char *name = NULL;
	if (own && n == 16 && cg_host_avx512_isa(g)) /* (a model: lane by lane) */
		name = half ? "llvm.x86.avx512.mask.gather.dpi.512" :
			      "llvm.x86.avx512.mask.gather.dps.512";
	else if (own && n == 8)
		name = half ? "llvm.x86.avx2.gather.d.d.256" : "llvm.x86.avx2.gather.d.ps.256";
	else if (own && n == 4)
		name = half ? "llvm.x86.avx2.gather.d.d" : "llvm.x86.avx2.gather.d.ps";
	if (!name) {
		for (int l = 0; l < n; l++)
			r[l] = load(g, et, gep(g, half ? t_i16(g) : t_f32(g), tab, idx[l]), scale);
		return;
	}
	T vi = t_vec(t_i32(g), (unsigned)n), ve = t_vec(et, (unsigned)n);
	/* AVX-512: an i1 mask and an i32 scale; AVX2: the mask's sign bits, of
	 * the element type, and an i8 scale */
	V args[5] = {c_undef(ve), tab, pack(g, vi, idx, n),
		     n == 16 ? c_splat(c_i1(g, 1), n) :
			       LLVMConstBitCast(c_splat(c_i32(g, -1), n), ve),
		     n == 16 ? c_i32(g, scale) : c_int(t_i8(g), scale)};
	V all = call_intrinsic(g, name, NULL, NULL, args, 5);
	for (int l = 0; l < n; l++)
		r[l] = extract(g, all, (unsigned)l);
}

bool cg_table_lanes(cg *g, const fz_value *v, int n, cg_ix (*ix)[FZ_MAX_RANK], V *out)
{
	if (!g->tab || g->tab_fill || !g->tab[v->id])
		return false;
	const struct cg_table *tb = &g->tabs[g->tab[v->id] - 1];
	const fz_value *x = tb->leaf;
	V a[FZ_VW_MAX], idx[FZ_VW_MAX];
	cg_value(g, x, n, ix, a);
	for (int l = 0; l < n; l++) {
		V bits = x->type.dtype == FZ_BF16 ?
			 lshr(g, bitcast(g, a[l], t_i32(g)), c_i32(g, 16)) :
			 zext(g, bitcast(g, fptrunc(g, a[l], t_f16(g)), t_i16(g)), t_i32(g));
		idx[l] = bits;
	}
	fz_dtype d = tb->root->type.dtype;
	bool half = half_float(d);
	V r[FZ_VW_MAX];
	gather(g, tb->glob, half, n, idx, r);
	for (int l = 0; l < n; l++) {
		if (!half)
			out[l] = r[l];
		else if (d == FZ_BF16) /* as emit.c widens a load: one shift */
			out[l] = bitcast(g, shl(g, r[l], c_i32(g, 16)), t_f32(g));
		else
			out[l] = fpext(g, bitcast(g, trunc_(g, r[l], t_i16(g)), t_f16(g)),
				       t_f32(g));
	}
	return true;
}
