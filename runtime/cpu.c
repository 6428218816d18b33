/*
 * cpu.c: the CPU target and the program runner (exec.h).
 *
 * The CPU target launches a kernel by calling its JIT-compiled host entry
 * point: the skeletons' parallel loops are plain loops there, so a launch
 * is one call. The runner walks the planned program:
 *
 *     bind the sizes, plan at them (ir/plan.h; re-planned when they change)
 *     copy each input into a contiguous 64-byte-aligned buffer
 *     prepare the kernels when the plan is made (below)
 *     for each region in scheduled order:
 *         view         nothing: the value is strides over its root's buffer
 *         kernel       launch the prepared entry point with the buffers in
 *                      its parameter order, check the error word (an index
 *                      out of range is FZ_ERANGE naming op)
 *         library      matmul / linear as a blocked loop, f64 accumulation
 *         collective   world 1: the identity; world N: the communicator
 *         wait         (comm.h) computes it across the ranks' threads
 *     copy the trace's outputs out (fresh buffers the caller fz_frees)
 *
 * A region that the skeletons cannot take as a whole (two reductions over
 * different dims, say) runs as one kernel per op: slower, never wrong.
 * Buffers are plain allocations released at the end of the run; the memory
 * plan's arena (memplan.c) is the CUDA runtime's business.
 *
 * Kernels come from the structural cache (cache/cache.h), resolved once per
 * plan, never while running. When a plan is made, each kernel region gets
 * its variant (idx32 when every value has fewer than 2^31 / 8 elements;
 * vectorized when every buffer it reads is 16-byte aligned, which the
 * plan's view layouts decide), its canonical form and key, then code:
 *
 *     in-memory LRU (this runner's loaded kernels, by canonical form)
 *       -> disk cache (fz_exec_set_cache): link the entry's host object,
 *          no LLVM IR compiled
 *       -> compile the canonical view to a host object, store it, link it
 *
 * so the 32 layers of a Llama resolve to a handful of keys, each compiled
 * or loaded once, and a warm run compiles nothing. The kernel was compiled
 * from the canonical view of its region, so its buffers are the canonical
 * inputs, then outputs (fz_canon_region_view): the prepared record keeps
 * that view and the launch path only walks it and calls a function
 * pointer. A region the skeletons do not take is prepared as one kernel
 * per op the same way, and so is the copy that stands in for a reshape
 * that is not a view at these sizes. Were a buffer's alignment at run time
 * ever to differ from the plan's prediction, the other variant would be
 * resolved then, once (counted as `late`).
 *
 *     a 32-layer Llama: some two hundred kernel regions, 8 keys; cold:
 *     8 compiled; after `fusec compile --target host`: 8 cache hits and
 *     0 compiled; every other kernel region is a memory hit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache.h"
#include "comm.h"
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

/* A loaded kernel in the in-memory LRU, by canonical form: the element is
 * its own key. fn NULL: the skeletons do not take the region. */
typedef struct lkernel {
	fz_key key;
	char *canon;
	size_t len;
	fz_host_fn fn;
	char name[64];
} lkernel;

/* A kernel resolved at plan time: the region it runs (src, whose arrays
 * live in the plan or in this record), its canonical form, the region in
 * canonical order (the kernel's parameter order), and the code. */
typedef struct pkernel {
	fz_region src;
	fz_node *node[1];            /* src's nodes when it is one op */
	fz_value *ins[FZ_MAX_ARGS];  /* src's inputs when it is one op */
	fz_canon *cn;
	fz_region view;              /* arrays borrowed from cn */
	fz_kernel k;                 /* host set; no module */
	bool unsupported;
	bool aligned;                /* the variant chosen: buffers aligned */
	struct pkernel *alt;         /* the other alignment, resolved late */
} pkernel;

/* Per region of the plan: its kernel, or one per op when it is split. */
typedef struct pregion {
	pkernel *whole;
	pkernel **ops;
} pregion;

#define LRU_CAP 4096

struct fz_exec {
	const fz_trace *t;
	const fz_exec_target *tg;
	fz_compiler *c[4];     /* by variant: idx32 * 2 + vectorize */
	fz_program *p;
	int64_t psyms[FZ_MAX_SYMS];
	bool idx32;            /* the plan's index width */
	pregion *pr;           /* per region id of p */
	pkernel **copy;        /* per value id: the copy of a non-view reshape */
	fz_lru *lru;
	fz_disk *disk;         /* NULL: no disk cache */
	char target[160];      /* the key's target, "" until first needed */
	fz_exec_stats st;
	fz_comm *comm;         /* NULL: world 1, collectives are the identity */
	int rank;
};

typedef struct run {
	fz_exec *x;
	const int64_t *syms;
	void **data;
	bool *owned;
	char **err;
} run;

static uint64_t lk_hash(const void *k) { return ((const lkernel *)k)->key.lo; }

static bool lk_eq(const void *a, const void *b)
{
	const lkernel *x = a, *y = b;
	return fz_key_eq(x->key, y->key) && x->len == y->len &&
	       !memcmp(x->canon, y->canon, x->len);
}

static void lk_free(void *k, void *v, void *ctx)
{
	(void)v;
	(void)ctx;
	lkernel *l = k;
	free(l->canon);
	free(l);
}

fz_status fz_exec_new(const fz_trace *t, const fz_exec_target *tg, fz_exec **out,
		      char **err)
{
	if (err)
		*err = NULL;
	*out = NULL;
	fz_exec *x = calloc(1, sizeof *x);
	static const fz_lru_ops ops = {lk_hash, lk_eq, lk_free};
	if (!x || fz_lru_new(LRU_CAP, &ops, NULL, &x->lru) != FZ_OK) {
		free(x);
		set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	x->t = t;
	x->tg = tg;
	*out = x;
	return FZ_OK;
}

fz_status fz_exec_set_cache(fz_exec *x, const fz_exec_cache *o, char **err)
{
	if (err)
		*err = NULL;
	fz_disk_close(x->disk);
	x->disk = NULL;
	if (!o || !o->disk)
		return FZ_OK;
	fz_disk_options dopt = {o->dir, 0, o->warn, o->warn_ctx};
	return fz_disk_open(&dopt, &x->disk, err);
}

static void pkernel_free(pkernel *pk)
{
	if (!pk)
		return;
	pkernel_free(pk->alt);
	fz_canon_free(pk->cn);
	free(pk);
}

/* Drops what was prepared for the current plan. */
static void unprepare(fz_exec *x)
{
	for (int i = 0; x->pr && x->p && i < x->p->n_regions; i++) {
		pregion *pr = &x->pr[i];
		if (pr->ops)
			for (int j = 0; j < x->p->regions[i]->n_nodes; j++)
				pkernel_free(pr->ops[j]);
		free(pr->ops);
		pkernel_free(pr->whole);
	}
	free(x->pr);
	x->pr = NULL;
	for (int v = 0; x->copy && v < x->t->n_values; v++)
		pkernel_free(x->copy[v]);
	free(x->copy);
	x->copy = NULL;
}

void fz_exec_free(fz_exec *x)
{
	if (!x)
		return;
	unprepare(x);
	fz_lru_free(x->lru);
	fz_disk_close(x->disk);
	for (int i = 0; i < 4; i++)
		fz_compiler_free(x->c[i]);
	fz_program_free(x->p);
	free(x);
}

const fz_exec_stats *fz_exec_stats_of(const fz_exec *x) { return &x->st; }

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

static fz_status run_kernel(run *R, pkernel *pk);

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
		 * the meta op runs as the copy kernel prepared for it. */
		pkernel *pk = R->x->copy ? R->x->copy[v->id] : NULL;
		if (!pk) {
			set_err(R->err, fz_strdup_printf("value #%d: no copy kernel "
							 "was prepared", v->id));
			return NULL;
		}
		if (run_kernel(R, pk) != FZ_OK)
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
	int64_t n = fz_type_numel_at(&v->type, R->syms);
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
	int64_t n = fz_type_numel_at(&v->type, R->syms);
	void *d = R->x->tg->alloc((size_t)(n > 0 ? n : 1) * fz_dtype_size(v->type.dtype));
	if (!d)
		set_err(R->err, fz_strdup("out of memory"));
	R->data[v->id] = d;
	R->owned[v->id] = d != NULL;
	return d;
}

/* ---- kernels: resolved at plan time ------------------------------------------ */

/* Finds or makes the code of pk (whose src is set) for variant: its key,
 * then the in-memory LRU, the disk cache, or the compiler. */
static fz_status resolve(fz_exec *x, pkernel *pk, int variant, char **err)
{
	const fz_region *r = &pk->src;
	pk->aligned = variant & 1;
	if (!x->c[variant]) {
		fz_cg_options o = {x->tg->codegen, 90, variant >= 2, variant & 1};
		fz_status st = fz_compiler_new(&o, &x->c[variant], err);
		if (st != FZ_OK)
			return st;
	}
	fz_compiler *c = x->c[variant];
	const fz_cg_options *o = fz_compiler_options(c);
	if (!x->target[0])
		fz_cache_target(o, x->target, sizeof x->target);
	uint8_t spec[2 + 256];
	fz_key_params kp;
	fz_key_params_init(&kp, x->target, FZ_CODEGEN_VERSION);
	kp.spec = spec;
	kp.n_spec = fz_cache_spec(o, r, spec, sizeof spec);
	fz_status st = fz_canon_region(x->t, r, &kp, &pk->cn, err);
	if (st != FZ_OK)
		return st;
	fz_canon_region_view(pk->cn, r, &pk->view);
	fz_kernel *k = &pk->k;
	k->region = r->id;
	k->n_in = r->n_in;
	k->n_out = r->n_out;
	k->n_entries = 1;

	lkernel probe = {pk->cn->key, pk->cn->text, pk->cn->len, NULL, ""};
	lkernel *lk = fz_lru_get(x->lru, &probe);
	if (lk) {
		x->st.mem_hits++;
		goto found;
	}
	x->st.unique++;
	double t0 = now();
	lk = calloc(1, sizeof *lk);
	if (!lk || !(lk->canon = malloc(pk->cn->len + 1))) {
		free(lk);
		set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	lk->key = pk->cn->key;
	lk->len = pk->cn->len;
	memcpy(lk->canon, pk->cn->text, pk->cn->len + 1);
	fz_cache_entry_name(lk->key, lk->name, sizeof lk->name);
	fz_entry *e = NULL;
	if (x->disk && (st = fz_disk_lookup(x->disk, lk->key, lk->canon, lk->len,
					    &e)) != FZ_OK)
		goto fail;
	if (e && fz_cache_usable(e, o)) {
		char *msg = NULL;
		/* an object that does not link is a miss, compiled again */
		if (fz_cache_load_host(c, e, r->n_in, r->n_out, &lk->fn, &msg) == FZ_OK)
			x->st.cache_hits++;
		free(msg);
	}
	fz_entry_free(e);
	if (!lk->fn) {
		fz_build_info info = {.want_object = true};
		char *msg = NULL;
		st = fz_cache_build(c, x->disk && fz_disk_writable(x->disk) ? x->disk : NULL,
				    x->t, r, pk->cn, false, &info, &msg);
		if (st == FZ_OK)
			st = fz_host_load(c, info.object, info.object_len, lk->name,
					  &lk->fn, &msg);
		free(info.object);
		free(info.cubin_error);
		if (st == FZ_OK) {
			x->st.compiled++;
		} else if (st == FZ_EUNSUPPORTED) {
			free(msg);
			msg = NULL;
			st = FZ_OK; /* remembered: lk->fn stays NULL */
		} else {
			set_err(err, msg);
			goto fail;
		}
	}
	x->st.compile_seconds += now() - t0;
	if ((st = fz_lru_put(x->lru, lk, lk)) != FZ_OK)
		return st; /* lk was freed */
found:
	pk->unsupported = !lk->fn;
	k->host = lk->fn;
	memcpy(k->names[0], lk->name, sizeof k->names[0]);
	return FZ_OK;
fail:
	x->st.compile_seconds += now() - t0;
	lk_free(lk, lk, NULL);
	return st;
}

/* A prepared kernel for region r (copied: its arrays must outlive the
 * plan's use of it) at variant. */
static pkernel *prepare_kernel(fz_exec *x, const fz_region *r, int variant,
			       fz_status *st, char **err)
{
	pkernel *pk = calloc(1, sizeof *pk);
	if (!pk) {
		*st = FZ_ENOMEM;
		set_err(err, fz_strdup("out of memory"));
		return NULL;
	}
	pk->src = *r;
	if ((*st = resolve(x, pk, variant, err)) != FZ_OK) {
		pkernel_free(pk);
		return NULL;
	}
	return pk;
}

static int variant_of(const fz_exec *x, const fz_region *r, const int64_t *syms);

/* Op n as a region of its own (its distinct operands the inputs), for a
 * region the skeletons do not take whole or a reshape run as a copy. */
static pkernel *prepare_op(fz_exec *x, int id, fz_node *n, const int64_t *syms,
			   fz_status *st, char **err)
{
	pkernel *pk = calloc(1, sizeof *pk);
	if (!pk) {
		*st = FZ_ENOMEM;
		set_err(err, fz_strdup("out of memory"));
		return NULL;
	}
	int ni = 0;
	for (int a = 0; a < n->n_in; a++) {
		bool dup = false;
		for (int b = 0; b < ni; b++)
			dup |= pk->ins[b] == n->in[a];
		if (!dup)
			pk->ins[ni++] = n->in[a];
	}
	pk->node[0] = n;
	pk->src = (fz_region){id, FZ_REGION_POINTWISE, 1, pk->node, ni, pk->ins,
			      n->n_out, n->out};
	if ((*st = resolve(x, pk, variant_of(x, &pk->src, syms), err)) != FZ_OK) {
		pkernel_free(pk);
		return NULL;
	}
	return pk;
}

/* Will the buffer of v handed to a kernel be 16-byte aligned? Values own
 * 64-byte-aligned buffers, a strided view is gathered into one, a reshape
 * that is not a view is copied into one; a contiguous view points into its
 * root at its offset. (get_value does what this predicts.) */
static bool value_aligned(const fz_program *p, const fz_value *v,
			  const int64_t *syms)
{
	if (!p->view_of || !p->view_of[v->id])
		return true;
	fz_layout lay;
	if (fz_view_eval(p, v, syms, &lay) != FZ_OK ||
	    !contiguous(lay.rank, lay.shape, lay.strides))
		return true;
	return lay.offset * (int64_t)fz_dtype_size(v->type.dtype) % 16 == 0;
}

static int variant_of(const fz_exec *x, const fz_region *r, const int64_t *syms)
{
	bool aligned = true;
	for (int i = 0; i < r->n_in && aligned; i++)
		aligned = value_aligned(x->p, r->in[i], syms);
	return (x->idx32 ? 2 : 0) + (aligned ? 1 : 0);
}

/* Plan time: every kernel the plan launches, resolved. */
static fz_status prepare(fz_exec *x, const int64_t *syms, char **err)
{
	const fz_trace *t = x->t;
	fz_program *p = x->p;
	x->idx32 = true;
	for (int v = 0; v < t->n_values; v++) {
		int64_t n = fz_type_numel_at(&t->values[v]->type, syms);
		if (n < 0 || n >= (INT64_C(1) << 31) / 8)
			x->idx32 = false;
	}
	x->pr = calloc((size_t)p->n_regions + 1, sizeof *x->pr);
	x->copy = calloc((size_t)t->n_values + 1, sizeof *x->copy);
	if (!x->pr || !x->copy) {
		set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	fz_status st = FZ_OK;
	for (int i = 0; i < p->n_regions && st == FZ_OK; i++) {
		const fz_region *r = p->regions[p->order[i]];
		if (!fz_region_is_kernel(r->kind))
			continue;
		pregion *pr = &x->pr[r->id];
		pr->whole = prepare_kernel(x, r, variant_of(x, r, syms), &st, err);
		if (!pr->whole || !pr->whole->unsupported)
			continue;
		x->st.split++;
		pr->ops = calloc((size_t)r->n_nodes + 1, sizeof *pr->ops);
		if (!pr->ops) {
			st = FZ_ENOMEM;
			break;
		}
		for (int j = 0; j < r->n_nodes && st == FZ_OK; j++) {
			pr->ops[j] = prepare_op(x, r->id, r->nodes[j], syms, &st, err);
			if (st == FZ_OK && pr->ops[j]->unsupported) {
				set_err(err, fz_strdup_printf("region %d: the code generator "
					"does not take %s", r->id, fz_ops[r->nodes[j]->op].name));
				st = FZ_EUNSUPPORTED;
			}
		}
	}
	/* reshapes that are not views at these sizes run as copies */
	for (int v = 0; v < t->n_values && st == FZ_OK; v++) {
		fz_layout lay;
		if (!p->view_of || !p->view_of[v] ||
		    fz_view_eval(p, t->values[v], syms, &lay) == FZ_OK)
			continue;
		x->copy[v] = prepare_op(x, -1, p->view_of[v]->node, syms, &st, err);
	}
	return st;
}

static fz_status run_kernel(run *R, pkernel *pk)
{
	const fz_region *reg = &pk->view;
	int nb = reg->n_in + reg->n_out;
	void *stack[16];
	void **bufs = nb <= 16 ? stack : calloc((size_t)nb, sizeof *bufs);
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
	if (st == FZ_OK && aligned != pk->aligned) {
		/* not what the plan predicted: the other variant, once */
		fz_exec *x = R->x;
		if (!pk->alt) {
			pkernel *alt = calloc(1, sizeof *alt);
			if (!alt) {
				st = FZ_ENOMEM;
			} else {
				*alt = *pk;
				alt->cn = NULL;
				alt->alt = NULL;
				alt->src.nodes = pk->src.nodes == pk->node ? alt->node : pk->src.nodes;
				alt->src.in = pk->src.in == pk->ins ? alt->ins : pk->src.in;
				x->st.late++;
				st = resolve(x, alt, (x->idx32 ? 2 : 0) + (aligned ? 1 : 0), R->err);
				if (st == FZ_OK && alt->unsupported)
					st = FZ_EUNSUPPORTED;
				if (st == FZ_OK)
					pk->alt = alt;
				else
					pkernel_free(alt);
			}
		}
		if (st == FZ_OK) {
			/* its buffers in its own canonical order */
			if (bufs != stack)
				free(bufs);
			return run_kernel(R, pk->alt);
		}
	}
	if (st == FZ_OK) {
		int32_t bad = 0;
		st = R->x->tg->launch(&pk->k, 0, bufs, R->syms, &bad, R->err);
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
	if (bufs != stack)
		free(bufs);
	return st;
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
	int64_t na = fz_type_numel_at(&a->type, R->syms);
	int64_t nbn = fz_type_numel_at(&b->type, R->syms);
	double *A = as_f64(pa, a->type.dtype, na), *B = as_f64(pb, b->type.dtype, nbn);
	double *C = NULL;
	fz_status st = FZ_OK;
	if (!A || !B) {
		st = FZ_ENOMEM;
		goto out;
	}
	if (n->op == FZ_OP_LINEAR) {
		int64_t K = sa[a->type.rank - 1], O = sb[0];
		int64_t M = K ? na / K : fz_type_numel_at(&y->type, R->syms) / (O ? O : 1);
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
	case FZ_REGION_WAIT: /* a bucket holds several */
		for (int i = 0; i < reg->n_nodes; i++) {
			const fz_node *n = reg->nodes[i];
			if (reg->kind == FZ_REGION_COLLECTIVE && R->x->comm) {
				/* the CPU's collectives complete here; wait copies */
				const fz_value *x = n->in[0];
				int64_t shape[FZ_MAX_RANK];
				for (int d = 0; d < x->type.rank; d++)
					shape[d] = fz_ext_eval(x->type.dims[d], R->syms);
				void *px = get_value(R, x), *py = alloc_value(R, n->out[0]);
				if (!px || !py)
					return FZ_EINVAL;
				fz_status st = fz_comm_collective(R->x->comm, R->x->rank, n->op,
								  x->type.dtype, x->type.rank,
								  shape, n->attrs.dim, px, py,
								  R->err);
				if (st != FZ_OK)
					return st;
				continue;
			}
			const fz_value *x = reg->nodes[i]->in[0], *y = reg->nodes[i]->out[0];
			void *px = get_value(R, x), *py = alloc_value(R, y);
			if (!px || !py)
				return FZ_EINVAL;
			int64_t ne = fz_type_numel_at(&y->type, R->syms);
			memcpy(py, px, (size_t)(ne > 0 ? ne : 0) * fz_dtype_size(y->type.dtype));
		}
		return FZ_OK;
	default: {
		const pregion *pr = &R->x->pr[reg->id];
		if (!pr->whole) {
			set_err(R->err, fz_strdup_printf("region %d: no kernel was "
							 "prepared", reg->id));
			return FZ_EINVAL;
		}
		if (!pr->whole->unsupported)
			return run_kernel(R, pr->whole);
		fz_status st = FZ_OK;
		for (int i = 0; i < reg->n_nodes && st == FZ_OK; i++)
			st = run_kernel(R, pr->ops[i]);
		return st;
	}
	}
}

static fz_status exec_run(fz_exec *x, const int64_t *sym_sizes, const fz_tensor *in,
		      int n_in, fz_tensor *out, int n_out, char **err)
{
	if (err)
		*err = NULL;
	const fz_trace *t = x->t;
	int world = x->comm ? fz_comm_world(x->comm) : 1;
	if (t->world != world) {
		set_err(err, fz_strdup_printf("trace '%s' is written for world %d; this "
					      "runner has %d rank%s (fz_exec_set_comm)",
					      t->name, t->world, world,
					      world == 1 ? "" : "s"));
		return FZ_EINVAL;
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
	if (!x->p || !x->pr ||
	    memcmp(x->psyms, syms, sizeof(int64_t) * (size_t)t->n_syms)) {
		unprepare(x);
		fz_program_free(x->p);
		x->p = NULL;
		fz_plan_options po;
		fz_plan_defaults(&po);
		po.sym_sizes = syms;
		if ((st = fz_plan(t, &po, &x->p, err)) != FZ_OK)
			return st;
		if ((st = prepare(x, syms, err)) != FZ_OK) {
			unprepare(x);
			return st;
		}
		memcpy(x->psyms, syms, sizeof(int64_t) * (size_t)t->n_syms);
	}
	run R = {x, syms, calloc((size_t)t->n_values + 1, sizeof(void *)),
		 calloc((size_t)t->n_values + 1, sizeof(bool)), err};
	if (!R.data || !R.owned) {
		st = FZ_ENOMEM;
		goto done;
	}
	for (int i = 0; i < t->n_params; i++) {
		const fz_value *p = t->params[i];
		int64_t n = fz_type_numel_at(&p->type, syms);
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
		int64_t n = fz_type_numel_at(&v->type, syms);
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

fz_status fz_exec_run(fz_exec *x, const int64_t *sym_sizes, const fz_tensor *in,
		      int n_in, fz_tensor *out, int n_out, char **err)
{
	fz_status st = exec_run(x, sym_sizes, in, n_in, out, n_out, err);
	if (st != FZ_OK && x->comm) /* the other ranks must not wait for us */
		fz_comm_abort(x->comm, x->rank, err && *err ? *err : fz_status_name(st));
	return st;
}

void fz_exec_set_comm(fz_exec *x, fz_comm *c, int rank)
{
	x->comm = c;
	x->rank = rank;
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
