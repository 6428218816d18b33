/*
 * cpu.c: the CPU target and the program runner (exec.h).
 *
 * The CPU target launches a kernel by calling its JIT-compiled host entry
 * point: the skeletons' parallel loops are plain loops there, so a launch
 * is one call. The runner walks the planned program:
 *
 *     bind the sizes, plan at them (ir/plan.h; re-planned when they change)
 *     copy each input into a contiguous 64-byte-aligned buffer
 *     for each region in scheduled order:
 *         view         nothing: the value is strides over its root's buffer
 *         kernel       compile on first use (idx32 when every value has
 *                      fewer than 2^31 elements; vectorized when every
 *                      buffer is 16-byte aligned), launch, check the error
 *                      word (an index out of range is FZ_ERANGE naming op)
 *         library      matmul / linear as a blocked loop, f64 accumulation
 *         collective,  world 1: the identity
 *         wait
 *     copy the trace's outputs out (fresh buffers the caller fz_frees)
 *
 * A region that the skeletons cannot take as a whole (two reductions over
 * different dims, say) runs as one kernel per op: slower, never wrong.
 * Buffers are plain allocations released at the end of the run; the memory
 * plan's arena (memplan.c) is the CUDA runtime's business.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exec.h"
#include "numeric.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void set_err(char **err, char *m)
{
	if (!err) {
		free(m);
		return;
	}
	free(*err);
	*err = m;
}

/* ---- the CPU target -------------------------------------------------------- */

static void *cpu_alloc(size_t n)
{
	n = (n + 63) / 64 * 64;
	void *p = aligned_alloc(64, n ? n : 64);
	if (p)
		memset(p, 0, n ? n : 64);
	return p;
}

static void cpu_release(void *p) { free(p); }

static fz_status cpu_launch(const fz_kernel *k, int e, void **bufs,
			    const int64_t *syms, int32_t *bad, char **err)
{
	if (!k->host || e != 0) {
		set_err(err, fz_strdup_printf("region %d: no host code for entry %d",
					      k->region, e));
		return FZ_EINVAL;
	}
	k->host(bufs, syms, bad);
	return FZ_OK;
}

static fz_status cpu_sync(char **err) { (void)err; return FZ_OK; }

const fz_exec_target fz_target_cpu = {"cpu", FZ_CG_HOST, cpu_alloc, cpu_release,
				      cpu_launch, cpu_sync};

/* ---- the runner ------------------------------------------------------------- */

typedef struct kentry {
	int key[6];
	fz_kernel *k;   /* NULL: unsupported as a whole */
} kentry;

struct fz_exec {
	const fz_trace *t;
	const fz_exec_target *tg;
	fz_compiler *c[4];     /* by variant: idx32 * 2 + vectorize */
	fz_program *p;
	int64_t psyms[FZ_MAX_SYMS];
	kentry *kc;
	int n_kc, cap_kc;
	fz_exec_stats st;
};

typedef struct run {
	fz_exec *x;
	const int64_t *syms;
	void **data;
	bool *owned;
	bool idx32;
	char **err;
} run;

fz_status fz_exec_new(const fz_trace *t, const fz_exec_target *tg, fz_exec **out,
		      char **err)
{
	if (err)
		*err = NULL;
	fz_exec *x = calloc(1, sizeof *x);
	if (!x)
		return FZ_ENOMEM;
	x->t = t;
	x->tg = tg;
	*out = x;
	return FZ_OK;
}

void fz_exec_free(fz_exec *x)
{
	if (!x)
		return;
	for (int i = 0; i < x->n_kc; i++)
		fz_kernel_free(x->kc[i].k);
	free(x->kc);
	for (int i = 0; i < 4; i++)
		fz_compiler_free(x->c[i]);
	fz_program_free(x->p);
	free(x);
}

const fz_exec_stats *fz_exec_stats_of(const fz_exec *x) { return &x->st; }

static int64_t numel_of(const fz_value *v, const int64_t *syms)
{
	int64_t n = 1;
	for (int d = 0; d < v->type.rank; d++) {
		int64_t e = fz_ext_eval(v->type.dims[d], syms);
		if (e < 0 || __builtin_mul_overflow(n, e, &n))
			return -1;
	}
	return n;
}

/* Copies a strided tensor into contiguous dst. */
static void gather(void *dst, const void *src, size_t es, int rank,
		   const int64_t *shape, const int64_t *st, int64_t off)
{
	int64_t n = 1, idx[FZ_MAX_RANK] = {0};
	for (int d = 0; d < rank; d++)
		n *= shape[d];
	for (int64_t i = 0; i < n; i++) {
		memcpy((char *)dst + (size_t)i * es, (const char *)src + off * (int64_t)es, es);
		for (int d = rank - 1; d >= 0; d--) {
			off += st[d];
			if (++idx[d] < shape[d])
				break;
			off -= st[d] * shape[d];
			idx[d] = 0;
		}
	}
}

static bool contiguous(int rank, const int64_t *shape, const int64_t *st)
{
	int64_t acc = 1;
	for (int d = rank - 1; d >= 0; d--) {
		if (shape[d] != 1 && st[d] != acc)
			return false;
		acc *= shape[d];
	}
	return true;
}

static fz_status run_kernel(run *R, const fz_region *reg);

/* A contiguous pointer to value v's elements: computed, or a view. */
static void *get_value(run *R, const fz_value *v)
{
	if (R->data[v->id])
		return R->data[v->id];
	const fz_program *p = R->x->p;
	if (!p->view_of || !p->view_of[v->id]) {
		set_err(R->err, fz_strdup_printf("value #%d is read before it is made",
						 v->id));
		return NULL;
	}
	fz_layout lay;
	if (fz_view_eval(p, v, R->syms, &lay) != FZ_OK) {
		/* Not a view at these sizes (a reshape of a strided tensor):
		 * the meta op runs as a copy kernel instead. */
		fz_node *n = p->view_of[v->id]->node;
		fz_node *nodes[1] = {n};
		fz_value *ins[1] = {n->in[0]};
		fz_region sub = {-1, FZ_REGION_POINTWISE, 1, nodes, 1, ins, 1, n->out};
		if (run_kernel(R, &sub) != FZ_OK)
			return NULL;
		return R->data[v->id];
	}
	fz_value *root = fz_view_root(p, (fz_value *)v);
	char *base = get_value(R, root);
	if (!base)
		return NULL;
	size_t es = fz_dtype_size(v->type.dtype);
	if (contiguous(lay.rank, lay.shape, lay.strides)) {
		R->data[v->id] = base + lay.offset * (int64_t)es;
		return R->data[v->id];
	}
	int64_t n = numel_of(v, R->syms);
	void *d = R->x->tg->alloc((size_t)(n > 0 ? n : 1) * es);
	if (!d) {
		set_err(R->err, fz_strdup("out of memory"));
		return NULL;
	}
	if (n > 0)
		gather(d, base, es, lay.rank, lay.shape, lay.strides, lay.offset);
	R->data[v->id] = d;
	R->owned[v->id] = true;
	return d;
}

static void *alloc_value(run *R, const fz_value *v)
{
	if (R->data[v->id])
		return R->data[v->id];
	int64_t n = numel_of(v, R->syms);
	void *d = R->x->tg->alloc((size_t)(n > 0 ? n : 1) * fz_dtype_size(v->type.dtype));
	if (!d)
		set_err(R->err, fz_strdup("out of memory"));
	R->data[v->id] = d;
	R->owned[v->id] = d != NULL;
	return d;
}

static fz_kernel *kernel_for(run *R, const fz_region *reg, int variant,
			     fz_status *st)
{
	fz_exec *x = R->x;
	int key[6] = {reg->nodes[0]->id, reg->nodes[reg->n_nodes - 1]->id,
		      reg->n_nodes, reg->n_in, reg->n_out, variant};
	for (int i = 0; i < x->n_kc; i++)
		if (!memcmp(x->kc[i].key, key, sizeof key)) {
			*st = x->kc[i].k ? FZ_OK : FZ_EUNSUPPORTED;
			return x->kc[i].k;
		}
	if (!x->c[variant]) {
		fz_cg_options o = {x->tg->codegen, 90, variant >= 2, variant & 1};
		if ((*st = fz_compiler_new(&o, &x->c[variant], R->err)) != FZ_OK)
			return NULL;
	}
	double t0 = now();
	fz_kernel *k = NULL;
	char *msg = NULL;
	*st = fz_compiler_build(x->c[variant], x->t, reg, &k, &msg);
	if (*st == FZ_OK)
		*st = fz_compiler_optimize(x->c[variant], k, &msg);
	if (*st == FZ_OK)
		*st = fz_kernel_jit(x->c[variant], k, &msg);
	x->st.compile_seconds += now() - t0;
	if (*st != FZ_OK && *st != FZ_EUNSUPPORTED) {
		fz_kernel_free(k);
		set_err(R->err, msg);
		return NULL;
	}
	free(msg);
	if (*st != FZ_OK) {
		fz_kernel_free(k);
		k = NULL;
	} else {
		x->st.compiled++;
	}
	if (x->n_kc == x->cap_kc) {
		int cap = x->cap_kc ? 2 * x->cap_kc : 32;
		kentry *kc = realloc(x->kc, sizeof *kc * (size_t)cap);
		if (!kc) {
			fz_kernel_free(k);
			*st = FZ_ENOMEM;
			return NULL;
		}
		x->kc = kc;
		x->cap_kc = cap;
	}
	memcpy(x->kc[x->n_kc].key, key, sizeof key);
	x->kc[x->n_kc++].k = k;
	return k;
}

static fz_status run_kernel(run *R, const fz_region *reg)
{
	int nb = reg->n_in + reg->n_out;
	void **bufs = calloc((size_t)nb + 1, sizeof *bufs);
	if (!bufs)
		return FZ_ENOMEM;
	fz_status st = FZ_OK;
	bool aligned = true;
	for (int i = 0; i < reg->n_in && st == FZ_OK; i++) {
		bufs[i] = get_value(R, reg->in[i]);
		if (!bufs[i])
			st = FZ_EINVAL;
		else
			aligned = aligned && ((uintptr_t)bufs[i] % 16 == 0);
	}
	for (int i = 0; i < reg->n_out && st == FZ_OK; i++)
		if (!(bufs[reg->n_in + i] = alloc_value(R, reg->out[i])))
			st = FZ_ENOMEM;
	fz_kernel *k = NULL;
	if (st == FZ_OK)
		k = kernel_for(R, reg, (R->idx32 ? 2 : 0) + (aligned ? 1 : 0), &st);
	if (st == FZ_OK) {
		int32_t bad = 0;
		st = R->x->tg->launch(k, 0, bufs, R->syms, &bad, R->err);
		R->x->st.kernels++;
		if (st == FZ_OK && bad > 0 && bad <= R->x->t->n_nodes) {
			const fz_node *n = R->x->t->nodes[bad - 1];
			char where[64] = "";
			if (n->line > 0)
				snprintf(where, sizeof where, " at %d:%d", n->line, n->col);
			set_err(R->err, fz_strdup_printf("region %d: %s%s: an index is "
				"out of range (or an integer fmod divides by zero)",
				reg->id, fz_ops[n->op].name, where));
			st = FZ_ERANGE;
		}
	}
	free(bufs);
	return st;
}

/* The region as one kernel per op. */
static fz_status run_split(run *R, const fz_region *reg)
{
	R->x->st.split++;
	for (int i = 0; i < reg->n_nodes; i++) {
		fz_node *n = reg->nodes[i];
		fz_value *ins[FZ_MAX_ARGS];
		int ni = 0;
		for (int a = 0; a < n->n_in; a++) {
			bool dup = false;
			for (int b = 0; b < ni; b++)
				dup |= ins[b] == n->in[a];
			if (!dup)
				ins[ni++] = n->in[a];
		}
		fz_node *nodes[1] = {n};
		fz_region sub = {reg->id, FZ_REGION_POINTWISE, 1, nodes, ni, ins,
				 n->n_out, n->out};
		fz_status st = run_kernel(R, &sub);
		if (st != FZ_OK)
			return st;
	}
	return FZ_OK;
}

/* ---- library calls: blocked matmul with f64 accumulation -------------------- */

static double *as_f64(const void *p, fz_dtype d, int64_t n)
{
	double *o = malloc(sizeof *o * (size_t)(n > 0 ? n : 1));
	if (o)
		for (int64_t i = 0; i < n; i++)
			o[i] = fz_load_f64(p, d, i);
	return o;
}

/* C[M,N] (+)= A[M,K] B[K,N], row strides K and N; blocked over k. */
static void mm(const double *A, const double *B, double *C, int64_t M, int64_t K,
	       int64_t N)
{
	memset(C, 0, sizeof *C * (size_t)(M * N > 0 ? M * N : 1));
	for (int64_t k0 = 0; k0 < K; k0 += 64) {
		int64_t k1 = k0 + 64 < K ? k0 + 64 : K;
		for (int64_t i = 0; i < M; i++)
			for (int64_t k = k0; k < k1; k++) {
				double a = A[i * K + k];
				const double *b = B + k * N;
				double *c = C + i * N;
				for (int64_t j = 0; j < N; j++)
					c[j] += a * b[j];
			}
	}
}

static void store_all(void *y, fz_dtype d, const double *C, int64_t off, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		if (fz_dtype_is_float(d))
			fz_store_f64(y, d, off + i, C[i]);
		else
			fz_store_i64(y, d, off + i, (int64_t)C[i]);
	}
}

static fz_status run_library(run *R, const fz_region *reg)
{
	const fz_node *n = reg->nodes[0];
	const fz_value *a = n->in[0], *b = n->in[1], *y = n->out[0];
	int64_t sa[FZ_MAX_RANK], sb[FZ_MAX_RANK];
	for (int d = 0; d < a->type.rank; d++)
		sa[d] = fz_ext_eval(a->type.dims[d], R->syms);
	for (int d = 0; d < b->type.rank; d++)
		sb[d] = fz_ext_eval(b->type.dims[d], R->syms);
	void *pa = get_value(R, a), *pb = get_value(R, b);
	void *pc = n->n_in == 3 ? get_value(R, n->in[2]) : NULL;
	void *py = alloc_value(R, y);
	if (!pa || !pb || !py || (n->n_in == 3 && !pc))
		return FZ_EINVAL;
	int64_t na = numel_of(a, R->syms), nbn = numel_of(b, R->syms);
	double *A = as_f64(pa, a->type.dtype, na), *B = as_f64(pb, b->type.dtype, nbn);
	double *C = NULL;
	fz_status st = FZ_OK;
	if (!A || !B) {
		st = FZ_ENOMEM;
		goto out;
	}
	if (n->op == FZ_OP_LINEAR) {
		int64_t K = sa[a->type.rank - 1], O = sb[0];
		int64_t M = K ? na / K : numel_of(y, R->syms) / (O ? O : 1);
		/* x wT: transpose w once into [K, O] */
		double *WT = malloc(sizeof *WT * (size_t)(K * O > 0 ? K * O : 1));
		C = malloc(sizeof *C * (size_t)(M * O > 0 ? M * O : 1));
		if (!WT || !C) {
			free(WT);
			st = FZ_ENOMEM;
			goto out;
		}
		for (int64_t o = 0; o < O; o++)
			for (int64_t k = 0; k < K; k++)
				WT[k * O + o] = B[o * K + k];
		mm(A, WT, C, M, K, O);
		free(WT);
		if (pc)
			for (int64_t i = 0; i < M; i++)
				for (int64_t o = 0; o < O; o++)
					C[i * O + o] += fz_load_f64(pc, n->in[2]->type.dtype, o);
		store_all(py, y->type.dtype, C, 0, M * O);
		goto out;
	}
	/* matmul: torch semantics, batch dims broadcast from the right */
	int ra = a->type.rank, rb = b->type.rank;
	int64_t M = ra >= 2 ? sa[ra - 2] : 1, K = sa[ra - 1];
	int64_t N = rb >= 2 ? sb[rb - 1] : 1;
	int ab = ra > 2 ? ra - 2 : 0, bb = rb > 2 ? rb - 2 : 0, nbt = ab > bb ? ab : bb;
	int64_t bs[FZ_MAX_RANK], ast[FZ_MAX_RANK], bst[FZ_MAX_RANK], as = M * K, bsz = K * N;
	for (int i = nbt - 1; i >= 0; i--) {
		int ia = i - (nbt - ab), ib = i - (nbt - bb);
		int64_t ea = ia >= 0 ? sa[ia] : 1, eb = ib >= 0 ? sb[ib] : 1;
		bs[i] = ea == 1 ? eb : ea;
		ast[i] = ea == 1 ? 0 : as;
		bst[i] = eb == 1 ? 0 : bsz;
		as *= ea;
		bsz *= eb;
	}
	int64_t batches = 1;
	for (int i = 0; i < nbt; i++)
		batches *= bs[i];
	C = malloc(sizeof *C * (size_t)(M * N > 0 ? M * N : 1));
	if (!C) {
		st = FZ_ENOMEM;
		goto out;
	}
	int64_t bi[FZ_MAX_RANK] = {0};
	for (int64_t tb = 0; tb < batches; tb++) {
		int64_t ao = 0, bo = 0;
		for (int d = 0; d < nbt; d++) {
			ao += bi[d] * ast[d];
			bo += bi[d] * bst[d];
		}
		mm(A + ao, B + bo, C, M, K, N);
		store_all(py, y->type.dtype, C, tb * M * N, M * N);
		for (int d = nbt - 1; d >= 0; d--) {
			if (++bi[d] < bs[d])
				break;
			bi[d] = 0;
		}
	}
out:
	free(A);
	free(B);
	free(C);
	if (st != FZ_OK)
		set_err(R->err, fz_strdup_printf("region %d: out of memory", reg->id));
	return st;
}

/* ---- the walk ------------------------------------------------------------------ */

static fz_status run_region(run *R, const fz_region *reg)
{
	switch (reg->kind) {
	case FZ_REGION_VIEW:
		return FZ_OK;
	case FZ_REGION_LIBRARY:
		return run_library(R, reg);
	case FZ_REGION_COLLECTIVE:
	case FZ_REGION_WAIT: {
		const fz_value *x = reg->nodes[0]->in[0], *y = reg->nodes[0]->out[0];
		void *px = get_value(R, x), *py = alloc_value(R, y);
		if (!px || !py)
			return FZ_EINVAL;
		int64_t n = numel_of(y, R->syms);
		memcpy(py, px, (size_t)(n > 0 ? n : 0) * fz_dtype_size(y->type.dtype));
		return FZ_OK;
	}
	default: {
		fz_status st = run_kernel(R, reg);
		if (st == FZ_EUNSUPPORTED)
			st = run_split(R, reg);
		return st;
	}
	}
}

fz_status fz_exec_run(fz_exec *x, const int64_t *sym_sizes, const fz_tensor *in,
		      int n_in, fz_tensor *out, int n_out, char **err)
{
	if (err)
		*err = NULL;
	const fz_trace *t = x->t;
	if (t->world > 1) {
		set_err(err, fz_strdup_printf("the CPU runs world size 1; trace '%s' "
					      "declares world %d", t->name, t->world));
		return FZ_EUNSUPPORTED;
	}
	if (n_out != t->n_outputs || (n_out && !out)) {
		set_err(err, fz_strdup_printf("trace '%s' returns %d values; %d output "
					      "slots given", t->name, t->n_outputs, n_out));
		return FZ_EINVAL;
	}
	int64_t syms[FZ_MAX_SYMS];
	for (int s = 0; s < t->n_syms; s++)
		syms[s] = sym_sizes ? sym_sizes[s] : -1;
	fz_status st = fz_trace_bind(t, in, n_in, syms, err);
	if (st != FZ_OK)
		return st;
	if (!x->p || memcmp(x->psyms, syms, sizeof(int64_t) * (size_t)t->n_syms)) {
		fz_program_free(x->p);
		x->p = NULL;
		fz_plan_options po;
		fz_plan_defaults(&po);
		po.sym_sizes = syms;
		if ((st = fz_plan(t, &po, &x->p, err)) != FZ_OK)
			return st;
		memcpy(x->psyms, syms, sizeof(int64_t) * (size_t)t->n_syms);
	}
	run R = {x, syms, calloc((size_t)t->n_values + 1, sizeof(void *)),
		 calloc((size_t)t->n_values + 1, sizeof(bool)), true, err};
	if (!R.data || !R.owned) {
		st = FZ_ENOMEM;
		goto done;
	}
	for (int v = 0; v < t->n_values; v++) {
		int64_t n = numel_of(t->values[v], syms);
		if (n < 0 || n >= (INT64_C(1) << 31) / 8)
			R.idx32 = false;
	}
	for (int i = 0; i < t->n_params; i++) {
		const fz_value *p = t->params[i];
		int64_t n = numel_of(p, syms);
		size_t es = fz_dtype_size(p->type.dtype);
		void *d = x->tg->alloc((size_t)(n > 0 ? n : 1) * es);
		if (!d) {
			st = FZ_ENOMEM;
			goto done;
		}
		if (n > 0)
			gather(d, in[i].data, es, in[i].rank, in[i].shape, in[i].strides, 0);
		R.data[p->id] = d;
		R.owned[p->id] = true;
	}
	x->st.regions = 0;
	for (int i = 0; i < x->p->n_regions && st == FZ_OK; i++) {
		const fz_region *reg = x->p->regions[x->p->order[i]];
		x->st.regions++;
		st = run_region(&R, reg);
		if (st != FZ_OK && err && !*err)
			*err = fz_strdup_printf("region %d failed: %s", reg->id,
						fz_status_name(st));
	}
	if (st == FZ_OK)
		st = x->tg->sync(err);
	/* outputs: contiguous copies the caller owns */
	for (int k = 0; k < n_out && st == FZ_OK; k++) {
		const fz_value *v = t->outputs[k];
		void *src = get_value(&R, v);
		int64_t n = numel_of(v, syms);
		size_t bytes = (size_t)(n > 0 ? n : 0) * fz_dtype_size(v->type.dtype);
		void *d = malloc(bytes ? bytes : 1);
		if (!src || !d) {
			free(d);
			st = src ? FZ_ENOMEM : FZ_EINVAL;
			for (int j = 0; j < k; j++) {
				free(out[j].data);
				out[j].data = NULL;
			}
			break;
		}
		memcpy(d, src, bytes);
		fz_tensor *o = &out[k];
		memset(o, 0, sizeof *o);
		o->data = d;
		o->dtype = v->type.dtype;
		o->rank = v->type.rank;
		int64_t acc = 1;
		for (int dd = v->type.rank - 1; dd >= 0; dd--) {
			o->shape[dd] = fz_ext_eval(v->type.dims[dd], syms);
			o->strides[dd] = acc;
			acc *= o->shape[dd];
		}
	}
done:
	for (int v = 0; R.data && v < t->n_values; v++)
		if (R.owned[v])
			x->tg->release(R.data[v]);
	free(R.data);
	free(R.owned);
	return st;
}

/* ---- the public entry point ------------------------------------------------------ */

fz_status fz_trace_run(const fz_trace *t, const char *device, const int64_t *sym_sizes,
		       const fz_tensor *inputs, int n_in, fz_tensor *outputs,
		       int n_out, char **err)
{
	if (err)
		*err = NULL;
	if (!t) {
		set_err(err, fz_strdup("fz_trace_run: trace is NULL"));
		return FZ_EINVAL;
	}
	if (device && strcmp(device, "cpu") && strcmp(device, "auto")) {
		set_err(err, fz_strdup_printf("device '%s' is not available; this "
					      "build runs on 'cpu'", device));
		return FZ_EUNSUPPORTED;
	}
	fz_exec *x;
	fz_status st = fz_exec_new(t, &fz_target_cpu, &x, err);
	if (st == FZ_OK)
		st = fz_exec_run(x, sym_sizes, inputs, n_in, outputs, n_out, err);
	fz_exec_free(x);
	return st;
}
