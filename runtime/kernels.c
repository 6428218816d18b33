/*
 * kernels.c: the kernels a plan launches, keyed, found or compiled, loaded.
 *
 * `fusec compile`, `fusec run` and the library used to decide this in three
 * places and disagreed (a run after a compile still compiled the per-op
 * kernels of split regions and the copies of reshapes); now this file is
 * the one answer. For a plan at bound sizes:
 *
 *   1. enumerate   each kernel region, with the strided views it reads
 *                  folded in (kinst_fold_views: it reads their bases, so
 *                  no gather runs before it; on the host attention's q,
 *                  k, v, o and do too); on the host, attention_dq and
 *                  attention_dkv of the same operands next to each other
 *                  as one kernel (attn_pair: the one backward pass); the
 *                  copy kernel of every reshape that is not a view at
 *                  these sizes;
 *   2. variant     32-bit indexing when every value of the trace has fewer
 *                  than 2^31/8 elements (unbound sizes: both widths), and
 *                  vectorized when every buffer the kernel reads will be
 *                  16-byte aligned (the runner's arena is, a contiguous view
 *                  at an offset may not be);
 *   3. key         the canonical form of the region under that variant
 *                  (cache/canon.c), so the 32 layers of a Llama share keys;
 *                  a whole region's form comes from the program's forms
 *                  (fz_program_canons: one cache entry when the program
 *                  was keyed before), respecialized to the variant, so a
 *                  warm start canonicalizes nothing;
 *   4. find        per distinct key: the device's store (loaded by another
 *                  program of this process), else the disk cache, else
 *                  compile on `jobs` threads and store; a key whose region
 *                  the skeletons do not take is remembered in the cache as
 *                  a marker entry, so a warm start never builds it to learn
 *                  that again;
 *   5. split       a region not taken whole becomes one kernel per op,
 *                  found the same way (steps 3-4); an index_add that
 *                  elementwise work in its region reads (the host gathers
 *                  it by rows) two: the scatter, then those (fz_scatter_split);
 *   6. load        with a device, each key's code is handed to tg->load
 *                  once per process and kept in the device's store.
 *
 * Compiling, the disk cache and the store are all behind one context
 * (fz_kctx) so that a command over many files counts a key once.
 *
 *     32-layer Llama forward at B=2, T=16:  ~200 kernel regions, 8 keys;
 *     cold: 8 compiled; after `fusec compile --target host --bind B=2,T=16`:
 *     8 cache hits, 0 compiled; a second program in the same process: 8
 *     mem hits.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"
#include "attention.h"



/* ---- records by canonical form ------------------------------------------- */

static uint64_t rec_hash(const void *k) { return ((const fz_kcode_rec *)k)->key.lo; }

static bool rec_eq(const void *a, const void *b)
{
	const fz_kcode_rec *x = a, *y = b;
	return fz_key_eq(x->key, y->key) && x->len == y->len &&
	       !memcmp(x->canon, y->canon, x->len);
}

static void rec_free(void *k, void *v, void *ctx)
{
	(void)v;
	(void)ctx;
	fz_kcode_rec *r = k;
	if (r)
		free(r->canon);
	free(r);
}

static const fz_lru_ops rec_ops = {rec_hash, rec_eq, rec_free};
#define REC_CAP ((size_t)1 << 40) /* a map: loaded code is never evicted */

static fz_kcode_rec *rec_new(const fz_canon *cn)
{
	fz_kcode_rec *r = calloc(1, sizeof *r);
	if (!r || !(r->canon = malloc(cn->len + 1))) {
		free(r);
		return NULL;
	}
	r->key = cn->key;
	r->len = cn->len;
	memcpy(r->canon, cn->text, cn->len + 1);
	return r;
}

struct fz_kstore {
	fz_lru *map;   /* fz_kcode_rec by canonical form, loaded on the device */
};

void fz_kstore_free(fz_kstore *s)
{
	if (!s)
		return;
	fz_lru_free(s->map);
	free(s);
}

/* ---- the context ------------------------------------------------------------ */

struct fz_kctx {
	fz_kctx_options o;
	char target[160];
	fz_lru *seen;         /* keys met by this context: fz_kcode_rec */
	fz_kstats st;
	char *first_unsupported;
};

fz_status fz_kctx_new(const fz_kctx_options *o, fz_kctx **out, char **err)
{
	*out = NULL;
	fz_kctx *cx = calloc(1, sizeof *cx);
	if (!cx || fz_lru_new(REC_CAP, &rec_ops, NULL, &cx->seen) != FZ_OK) {
		free(cx);
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	cx->o = *o;
	if (cx->o.jobs <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		cx->o.jobs = n > 0 ? (int)n : 1;
	}
	fz_cache_target(&cx->o.cg, cx->target, sizeof cx->target);
	if (o->dev) {
		fz_device *d = o->dev;
		pthread_mutex_lock(&d->mu);
		if (!d->store) {
			d->store = calloc(1, sizeof *d->store);
			if (d->store && fz_lru_new(REC_CAP, &rec_ops, NULL,
						   &d->store->map) != FZ_OK) {
				free(d->store);
				d->store = NULL;
			}
		}
		bool ok = d->store != NULL;
		pthread_mutex_unlock(&d->mu);
		if (!ok) {
			fz_kctx_free(cx);
			fz_set_err(err, fz_strdup("out of memory"));
			return FZ_ENOMEM;
		}
	}
	*out = cx;
	return FZ_OK;
}

void fz_kctx_free(fz_kctx *cx)
{
	if (!cx)
		return;
	fz_lru_free(cx->seen);
	free(cx->first_unsupported);
	free(cx);
}

const fz_kstats *fz_kctx_stats(const fz_kctx *cx) { return &cx->st; }
const char *fz_kctx_target(const fz_kctx *cx) { return cx->target; }
const char *fz_kctx_first_unsupported(const fz_kctx *cx)
{
	return cx->first_unsupported;
}

/* ---- sets --------------------------------------------------------------------- */

static void kinst_free(fz_kinst *ki)
{
	if (ki) {
		fz_canon_free(ki->cn);
		free(ki->folded);
		free(ki->pair);
	}
	free(ki);
}

void fz_kset_free(fz_kset *ks)
{
	if (!ks)
		return;
	for (int i = 0; i < ks->n_inst; i++)
		kinst_free(ks->inst[i]);
	for (int r = 0; ks->ops && r < ks->n_regions; r++)
		free(ks->ops[r]);
	free(ks->inst);
	free(ks->whole);
	free(ks->ops);
	free(ks->copy);
	free(ks->joined);
	free(ks);
}


/* The layouts of a program's views at sizes, each computed once from its
 * source's (values are numbered in topological order, so one pass in id
 * order): fz_view_eval per value walks the whole chain of views under it,
 * once per region input that reads it. ok[k] false: the view cannot be
 * evaluated at these sizes (a reshape that must be copied). */
typedef struct views {
	int *at;            /* value id -> index in lay, -1: not a view */
	fz_layout *lay;
	bool *ok;
} views;

static void views_free(views *w)
{
	free(w->at);
	free(w->lay);
	free(w->ok);
	memset(w, 0, sizeof *w);
}

static fz_status views_eval(const fz_program *p, const int64_t *syms, views *w)
{
	const fz_trace *t = p->trace;
	memset(w, 0, sizeof *w);
	if (!p->view_of)
		return FZ_OK;
	int n = 0;
	for (int v = 0; v < t->n_values; v++)
		n += p->view_of[v] != NULL;
	w->at = malloc(sizeof *w->at * ((size_t)t->n_values + 1));
	w->lay = malloc(sizeof *w->lay * ((size_t)n + 1));
	w->ok = malloc(sizeof *w->ok * ((size_t)n + 1));
	if (!w->at || !w->lay || !w->ok) {
		views_free(w);
		return FZ_ENOMEM;
	}
	int k = 0;
	for (int v = 0; v < t->n_values; v++) {
		const fz_view *vw = p->view_of[v];
		w->at[v] = -1;
		if (!vw)
			continue;
		const fz_value *src = vw->node->in[0];
		int j = src->id < v ? w->at[src->id] : -2;
		fz_layout in;
		bool ok;
		if (j == -2) /* not in id order: the general walk */
			ok = fz_view_eval(p, src, syms, &in) == FZ_OK;
		else if (j >= 0)
			ok = w->ok[j] && (in = w->lay[j], true);
		else
			ok = fz_layout_contiguous(src, syms, &in);
		w->ok[k] = ok && fz_meta_layout(vw->node, syms, &in, &w->lay[k]);
		w->at[v] = k++;
	}
	return FZ_OK;
}

/* Will the buffer of v handed to a kernel be 16-byte aligned? The arena's
 * blocks and parameters are (the runner copies a parameter that is not),
 * a strided view is gathered into an arena block, a reshape that is not a
 * view is copied into one; a contiguous view points into its root at its
 * offset. exec.c binds exactly what this predicts. Unbound sizes: judged
 * at the plan's probe sizes. */
static bool value_aligned(const views *w, const fz_value *v)
{
	int k = w->at ? w->at[v->id] : -1;
	if (k < 0 || !w->ok[k] || !fz_layout_is_contiguous(&w->lay[k]))
		return true;
	return w->lay[k].offset * (int64_t)fz_dtype_size(v->type.dtype) % 16 == 0;
}

static int vectorize_of(const views *w, const fz_region *r)
{
	for (int i = 0; i < r->n_in; i++)
		if (!value_aligned(w, r->in[i]))
			return 0;
	return 1;
}

bool fz_kernels_idx32(const fz_trace *t, const int64_t *syms)
{
	for (int v = 0; v < t->n_values; v++) {
		int64_t n = fz_type_numel_at(&t->values[v]->type, syms);
		if (n < 0 || n >= (INT64_C(1) << 31) / 8)
			return false;
	}
	return true;
}

/* A pending instance: what it runs and its variant; keyed below. */
/* An instance with room for n_ins inputs (a warm start makes hundreds:
 * sized to what they hold, not to the most an op may have). */
static fz_kinst *kinst_new(fz_kset *ks, int region, int op, int variant, int n_ins)
{
	if (ks->n_inst == ks->cap_inst) {
		int cap = ks->cap_inst ? 2 * ks->cap_inst : 64;
		fz_kinst **ni = realloc(ks->inst, sizeof *ni * (size_t)cap);
		if (!ni)
			return NULL;
		ks->inst = ni;
		ks->cap_inst = cap;
	}
	fz_kinst *ki = calloc(1, sizeof *ki + sizeof ki->ins[0] * (size_t)n_ins);
	if (!ki)
		return NULL;
	ks->inst[ks->n_inst++] = ki;
	ki->region = region;
	ki->op = op;
	ki->variant = variant;
	return ki;
}

/* Op n alone, its distinct operands the inputs. */
static void kinst_one_op(fz_kinst *ki, fz_node *n, int id)
{
	int ni = 0;
	for (int a = 0; a < n->n_in; a++) {
		bool dup = false;
		for (int b = 0; b < ni; b++)
			dup |= ki->ins[b] == n->in[a];
		if (!dup)
			ki->ins[ni++] = n->in[a];
	}
	ki->node[0] = n;
	ki->src = (fz_region){id, FZ_REGION_POINTWISE, 1, ki->node, ni, ki->ins,
			      n->n_out, n->out, NULL, NULL};
}

/* Attention regions r and r2 as one region for the host's one backward
 * pass (fz_attn_describe's FZ_ATTN_BWD in f32 at head dims the kernels
 * take): the region, its arrays after it, in one malloc; its nodes NULL
 * when the two are not such a pair. NULL: out of memory. */
static fz_region *attn_pair(const fz_program *p, const fz_region *r, const fz_region *r2)
{
	int nn = r->n_nodes + r2->n_nodes, ni = r->n_in + r2->n_in, no = r->n_out + r2->n_out;
	fz_region *two = calloc(1, sizeof *two + sizeof(void *) * (size_t)(nn + ni + no));
	if (!two)
		return NULL;
	fz_node **nodes = (fz_node **)(two + 1);
	fz_value **in = (fz_value **)(nodes + nn), **out = in + ni;
	*two = *r;
	two->nodes = nodes;
	two->in = in;
	two->out = out;
	two->n_nodes = two->n_in = two->n_out = 0;
	const fz_region *rs[2] = {r, r2};
	for (int k = 0; k < 2; k++) {
		for (int j = 0; j < rs[k]->n_nodes; j++)
			nodes[two->n_nodes++] = rs[k]->nodes[j];
		for (int j = 0; j < rs[k]->n_in; j++)
			if (!fz_value_listed(in, two->n_in, rs[k]->in[j]))
				in[two->n_in++] = rs[k]->in[j];
		for (int j = 0; j < rs[k]->n_out; j++)
			out[two->n_out++] = rs[k]->out[j];
	}
	/* the same inputs (not, say, dq reading kv heads unrepeated where
	 * dkv, whose dk is returned repeated, reads them repeated) */
	bool same = r->n_in == r2->n_in && two->n_in == r->n_in;
	fz_attn A;
	if (!same || !fz_attn_describe(p->trace, two, &A, NULL, 0) || A.pass != FZ_ATTN_BWD ||
	    A.dtype != FZ_F32 || A.d % 16 || A.dv % 16 || A.d > 512 || A.dv > 512)
		two->nodes = NULL;
	return two;
}

/* Region r as its kernel computes it: ir/plan.c's fz_region_fold_views. */
static bool kinst_fold_views(fz_kinst *ki, const fz_program *p, const fz_region *r,
			     bool host)
{
	return fz_region_fold_views(p, r, host, &ki->src, &ki->folded, ki->ins);
}

/* The instance's key: a whole region's (its views folded in, the same at
 * every width) from the program's forms (cs, from the cache when the
 * program was keyed before) under the instance's spec; anything else
 * canonicalized here. */
static fz_status kinst_key(fz_kctx *cx, const fz_trace *t, fz_canon **cs,
			   fz_kinst *ki, char **err)
{
	fz_cg_options o = cx->o.cg;
	o.idx32 = ki->variant >= 2;
	o.vectorize = ki->variant & 1;
	fz_status st;
	if (cs && ki->op == -1 && ki->region >= 0 && cs[ki->region]) {
		uint8_t spec[2 + 256];
		size_t n = fz_cache_spec(&o, &ki->src, spec, sizeof spec);
		st = fz_canon_respec(cs[ki->region], spec, n, &ki->cn);
		if (st == FZ_ENOMEM)
			fz_set_err(err, fz_strdup("out of memory"));
		else if (st != FZ_OK)
			st = fz_cache_canon(t, &ki->src, &o, cx->target, &ki->cn, err);
	} else {
		st = fz_cache_canon(t, &ki->src, &o, cx->target, &ki->cn, err);
	}
	if (st == FZ_OK)
		fz_canon_region_view(ki->cn, &ki->src, &ki->view);
	return st;
}

/* ---- finding and compiling ----------------------------------------------------- */

/* A key to compile: its instance (for the region and canonical form) and
 * what came of it. */
typedef struct job {
	fz_kinst *ki;
	fz_kcode_rec *rec;
	fz_status st;
	char *msg;
	fz_build_info info;
} job;

typedef struct jobs {
	fz_kctx *cx;
	const fz_trace *t;
	job *j;
	int n, next, done;
	pthread_mutex_t mu;
} jobs;

static void *worker(void *arg)
{
	jobs *J = arg;
	fz_kctx *cx = J->cx;
	fz_compiler *cs[4] = {NULL, NULL, NULL, NULL};
	fz_disk *disk = cx->o.disk && fz_disk_writable(cx->o.disk) ? cx->o.disk : NULL;
	for (;;) {
		pthread_mutex_lock(&J->mu);
		int i = J->next < J->n ? J->next++ : -1;
		pthread_mutex_unlock(&J->mu);
		if (i < 0)
			break;
		job *jb = &J->j[i];
		int v = jb->ki->variant;
		if (!cs[v]) {
			fz_cg_options o = cx->o.cg;
			o.idx32 = v >= 2;
			o.vectorize = v & 1;
			jb->st = fz_compiler_new(&o, &cs[v], &jb->msg);
		}
		if (cs[v]) {
			jb->info.want_code = cx->o.dev != NULL;
			jb->st = fz_cache_build(cs[v], disk, J->t, &jb->ki->src, jb->ki->cn,
						cx->o.cubins, &jb->info, &jb->msg);
		}
		if (jb->st == FZ_EUNSUPPORTED && disk) {
			/* remembered, so a warm start does not build it again */
			fz_section s = {"unsupported", jb->msg ? jb->msg : "", 0};
			s.len = strlen(s.data);
			fz_disk_store(disk, jb->ki->cn->key, jb->ki->cn->text,
				      jb->ki->cn->len, &s, 1);
		}
		pthread_mutex_lock(&J->mu);
		J->done++;
		if (cx->o.progress)
			cx->o.progress(cx->o.progress_ctx, J->done, J->n);
		pthread_mutex_unlock(&J->mu);
	}
	for (int v = 0; v < 4; v++)
		fz_compiler_free(cs[v]);
	return NULL;
}

static fz_status run_jobs(fz_kctx *cx, const fz_trace *t, job *j, int n)
{
	jobs J = {cx, t, j, n, 0, 0, PTHREAD_MUTEX_INITIALIZER};
	int want = cx->o.jobs < n ? cx->o.jobs : n;
	pthread_t th[64];
	int started = 0;
	for (int i = 1; i < want && i < 64; i++)
		if (pthread_create(&th[started], NULL, worker, &J) == 0)
			started++;
	worker(&J);
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&J.mu);
	return FZ_OK;
}

/* The code of a disk entry as the target's load wants it: the machine
 * code under the device's tag (its own arch), else under the compiler's. */
static void code_of_entry(const fz_entry *e, const fz_device *dev, int sm,
			  fz_kcode *c)
{
	memset(c, 0, sizeof *c);
	const fz_section *s;
	if ((s = fz_entry_section(e, "obj"))) {
		c->obj = s->data;
		c->obj_len = s->len;
	}
	if ((s = fz_entry_section(e, "ptx"))) {
		c->ptx = s->data;
		c->ptx_len = s->len;
	}
	char tag[FZ_SECTION_TAG];
	if (dev && dev->native_tag[0])
		snprintf(tag, sizeof tag, "%s", dev->native_tag);
	else
		snprintf(tag, sizeof tag, "cubin.sm_%d", sm);
	if ((s = fz_entry_section(e, tag))) {
		c->cubin = s->data;
		c->cubin_len = s->len;
	}
}

/* Where the cache has no machine code for the device (PTX only: made
 * where nvJitLink was absent, or for another arch), the target makes it
 * once (tg->native: the driver's JIT for this GPU) and it is stored back
 * into the entry beside the PTX, so the next process loads machine code.
 * A failure leaves c as it was: the PTX still serves. *bin: the caller's
 * to free. */
static void native_store_back(fz_kctx *cx, const fz_kcode_rec *rec,
			      fz_kcode *c, void **bin)
{
	fz_device *dev = cx->o.dev;
	*bin = NULL;
	if (!dev || !dev->tg->native || !dev->native_tag[0] || !c->ptx || c->cubin ||
	    rec->unsupported)
		return;
	size_t n = 0;
	char *msg = NULL;
	if (dev->tg->native(dev, &rec->k, c, bin, &n, &msg) != FZ_OK) {
		free(msg);
		return;
	}
	c->cubin = *bin;
	c->cubin_len = n;
	fz_disk *d = cx->o.disk;
	fz_entry *e = NULL;
	if (!d || !fz_disk_writable(d) ||
	    fz_disk_lookup(d, rec->key, rec->canon, rec->len, &e) != FZ_OK || !e)
		return;
	fz_section s[FZ_ENTRY_MAX_SECTIONS];
	int k = 0;
	for (int i = 0; i < e->n_sections && k < FZ_ENTRY_MAX_SECTIONS - 1; i++)
		if (strncmp(e->sections[i].tag, dev->native_tag, FZ_SECTION_TAG))
			s[k++] = e->sections[i];
	memset(&s[k], 0, sizeof s[k]);
	snprintf(s[k].tag, FZ_SECTION_TAG, "%s", dev->native_tag);
	s[k].data = *bin;
	s[k++].len = n;
	fz_disk_store(d, rec->key, rec->canon, rec->len, s, k);
	fz_entry_free(e);
}

/* Loads rec's code on the device and files it in the store (the caller
 * holds dev->mu). The store owns rec afterwards, on failure too. */
static fz_status load_rec(fz_kctx *cx, fz_kcode_rec *rec, const fz_kcode *code,
			  char **err)
{
	fz_device *dev = cx->o.dev;
	fz_status st = FZ_OK;
	if (!rec->unsupported)
		st = dev->tg->load(dev, &rec->k, code, rec->fn, err);
	if (st != FZ_OK) {
		rec_free(rec, rec, NULL);
		return st;
	}
	return fz_lru_put(dev->store->map, rec, rec);
}

/* Resolves every instance of ks from index `from` on: found, compiled or
 * loaded; sets ki->code. */
static fz_status resolve(fz_kctx *cx, const fz_trace *t, fz_canon **cs,
			 fz_kset *ks, int from, char **err)
{
	fz_device *dev = cx->o.dev;
	int n = ks->n_inst - from;
	job *todo = calloc((size_t)n + 1, sizeof *todo);
	fz_entry **entries = calloc((size_t)n + 1, sizeof *entries);
	fz_kcode_rec **entry_rec = calloc((size_t)n + 1, sizeof *entry_rec);
	int n_todo = 0, n_entries = 0;
	fz_status st = FZ_OK;
	if (!todo || !entries || !entry_rec) {
		free(todo);
		free(entries);
		free(entry_rec);
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	if (dev)
		pthread_mutex_lock(&dev->mu);
	for (int i = from; i < ks->n_inst && st == FZ_OK; i++) {
		fz_kinst *ki = ks->inst[i];
		if ((st = kinst_key(cx, t, cs, ki, err)) != FZ_OK)
			break;
		fz_kcode_rec probe = {.key = ki->cn->key, .canon = ki->cn->text,
				      .len = ki->cn->len};
		fz_kcode_rec *rec;
		if ((rec = fz_lru_get(cx->seen, &probe)) != NULL) {
			ki->code = rec; /* (pending records are filled below) */
			continue;
		}
		cx->st.unique++;
		if (dev && (rec = fz_lru_get(dev->store->map, &probe)) != NULL) {
			cx->st.mem_hits++;
			fz_kcode_rec *seen = rec_new(ki->cn);
			if (!seen || fz_lru_put(cx->seen, seen, seen) != FZ_OK) {
				st = FZ_ENOMEM;
				break;
			}
			/* a record in seen stands for the store's: copy the code */
			seen->unsupported = rec->unsupported;
			seen->k = rec->k;
			memcpy(seen->fn, rec->fn, sizeof seen->fn);
			ki->code = seen;
			continue;
		}
		if (!(rec = rec_new(ki->cn))) {
			st = FZ_ENOMEM;
			break;
		}
		if ((st = fz_lru_put(cx->seen, rec, rec)) != FZ_OK)
			break;
		ki->code = rec;
		fz_entry *e = NULL;
		if (cx->o.disk &&
		    (st = fz_disk_lookup(cx->o.disk, ki->cn->key, ki->cn->text,
					 ki->cn->len, &e)) != FZ_OK)
			break;
		if (e && fz_entry_section(e, "unsupported")) {
			rec->unsupported = true;
			cx->st.cache_hits++;
			fz_entry_free(e);
			continue;
		}
		if (e && fz_cache_usable(e, &cx->o.cg) &&
		    fz_cache_meta_read(e, &rec->k) == FZ_OK) {
			cx->st.cache_hits++;
			entry_rec[n_entries] = rec;
			entries[n_entries++] = e;
			continue;
		}
		fz_entry_free(e);
		todo[n_todo++] = (job){ki, rec, FZ_OK, NULL, {0}};
	}
	if (dev)
		pthread_mutex_unlock(&dev->mu);
	if (st == FZ_OK && n_todo)
		run_jobs(cx, t, todo, n_todo);
	if (dev)
		pthread_mutex_lock(&dev->mu);
	/* the cache's code, then what was compiled, onto the device */
	for (int i = 0; i < n_entries && st == FZ_OK; i++) {
		const fz_entry *e = entries[i];
		fz_kcode_rec *rec = entry_rec[i];
		if (!dev)
			continue;
		fz_kcode c;
		void *bin = NULL;
		code_of_entry(e, dev, cx->o.cg.sm, &c);
		native_store_back(cx, rec, &c, &bin);
		fz_kcode_rec *loaded = rec_new(&(fz_canon){.key = rec->key,
			.text = rec->canon, .len = rec->len});
		if (!loaded) {
			free(bin);
			st = FZ_ENOMEM;
			break;
		}
		loaded->k = rec->k;
		if ((st = load_rec(cx, loaded, &c, err)) == FZ_OK)
			memcpy(rec->fn, loaded->fn, sizeof rec->fn);
		free(bin);
	}
	for (int i = 0; i < n_todo && st == FZ_OK; i++) {
		job *jb = &todo[i];
		if (jb->st == FZ_EUNSUPPORTED) {
			jb->rec->unsupported = true;
			cx->st.unsupported++;
			if (!cx->first_unsupported) {
				cx->first_unsupported = jb->msg;
				jb->msg = NULL;
			}
		} else if (jb->st != FZ_OK) {
			st = jb->st;
			fz_set_err(err, jb->msg);
			jb->msg = NULL;
			break;
		} else {
			cx->st.compiled++;
			cx->st.cubins += jb->info.cubin;
			jb->rec->k = jb->info.kernel;
		}
		if (!dev)
			continue;
		fz_kcode c = {jb->info.object, jb->info.object_len, jb->info.ptx,
			      jb->info.ptx ? strlen(jb->info.ptx) : 0,
			      jb->info.cubin_data, jb->info.cubin_bytes};
		void *bin = NULL;
		/* a cubin built for the compiler's arch serves only a device
		 * of that arch */
		char tag[FZ_SECTION_TAG];
		snprintf(tag, sizeof tag, "cubin.sm_%d", cx->o.cg.sm);
		if (c.cubin && dev->native_tag[0] && strcmp(tag, dev->native_tag))
			c.cubin = NULL, c.cubin_len = 0;
		native_store_back(cx, jb->rec, &c, &bin);
		fz_kcode_rec *loaded = rec_new(jb->ki->cn);
		if (!loaded) {
			free(bin);
			st = FZ_ENOMEM;
			break;
		}
		loaded->k = jb->rec->k;
		loaded->unsupported = jb->rec->unsupported;
		if ((st = load_rec(cx, loaded, &c, err)) == FZ_OK)
			memcpy(jb->rec->fn, loaded->fn, sizeof jb->rec->fn);
		free(bin);
	}
	if (dev)
		pthread_mutex_unlock(&dev->mu);
	if (st == FZ_ENOMEM && err && !*err)
		fz_set_err(err, fz_strdup("out of memory"));
	for (int i = 0; i < n_entries; i++)
		fz_entry_free(entries[i]);
	for (int i = 0; i < n_todo; i++) {
		free(todo[i].msg);
		free(todo[i].info.object);
		free(todo[i].info.ptx);
		free(todo[i].info.cubin_data);
		free(todo[i].info.cubin_error);
	}
	free(entries);
	free(entry_rec);
	free(todo);
	return st;
}

fz_status fz_kset_build(fz_kctx *cx, const fz_program *p, const int64_t *syms,
			fz_kset **out, char **err)
{
	*out = NULL;
	double t0 = fz_now();
	const fz_trace *t = p->trace;
	views vw = {0};
	fz_kset *ks = calloc(1, sizeof *ks);
	if (!ks)
		goto oom;
	ks->n_regions = p->n_regions;
	ks->n_values = t->n_values;
	ks->whole = calloc((size_t)p->n_regions + 1, sizeof *ks->whole);
	ks->ops = calloc((size_t)p->n_regions + 1, sizeof *ks->ops);
	ks->copy = calloc((size_t)t->n_values + 1, sizeof *ks->copy);
	ks->joined = calloc((size_t)p->n_regions + 1, sizeof *ks->joined);
	if (!ks->whole || !ks->ops || !ks->copy || !ks->joined)
		goto oom;
	bool bound = true;
	for (int s = 0; s < t->n_syms; s++)
		bound = bound && syms && syms[s] >= 0;
	const int64_t *at = bound ? syms : p->sym_sizes;
	/* unbound sizes: the run picks the width, so both are made */
	int widths[2], n_widths = 0;
	ks->idx32 = bound && fz_kernels_idx32(t, syms);
	widths[n_widths++] = ks->idx32 ? 2 : 0;
	if (!bound)
		widths[n_widths++] = 2;

	if (views_eval(p, at, &vw) != FZ_OK)
		goto oom;
	/* 1-3: whole regions and reshape copies */
	bool host = cx->o.cg.target == FZ_CG_HOST;
	for (int i = 0; i < p->n_regions; i++) {
		const fz_region *r = p->regions[p->order[i]];
		if (!fz_region_is_kernel(r->kind))
			continue;
		cx->st.regions++;
		if (ks->joined[r->id])
			continue;
		/* attention_dq and attention_dkv of one set of operands, next to
		 * each other: one kernel for both on the host */
		fz_region *two = NULL;
		if (host && r->kind == FZ_REGION_ATTENTION) {
			int j = i + 1;
			while (j < p->n_regions && p->regions[p->order[j]]->kind == FZ_REGION_VIEW)
				j++;
			const fz_region *r2 = j < p->n_regions ? p->regions[p->order[j]] : NULL;
			if (r2 && r2->kind == FZ_REGION_ATTENTION) {
				if (!(two = attn_pair(p, r, r2)))
					goto oom;
				if (!two->nodes) {
					free(two);
					two = NULL;
				} else {
					ks->joined[r2->id] = true;
				}
			}
		}
		const fz_region *src = two ? two : r;
		int vec = vectorize_of(&vw, src);
		for (int w = 0; w < n_widths; w++) {
			fz_kinst *ki = kinst_new(ks, r->id, -1, widths[w] + vec, src->n_in);
			if (!ki) {
				free(two);
				goto oom;
			}
			/* the first instance owns the pair's arrays */
			ki->pair = two;
			two = NULL;
			if (!kinst_fold_views(ki, p, src, host))
				goto oom;
			if (w == 0)
				ks->whole[r->id] = ki;
		}
	}
	for (int v = 0; v < t->n_values; v++) {
		if (!vw.at || vw.at[v] < 0 || vw.ok[vw.at[v]])
			continue;
		fz_node *n = p->view_of[v]->node;
		for (int w = 0; w < n_widths; w++) {
			fz_kinst *ki = kinst_new(ks, -1, -1, widths[w], n->n_in);
			if (!ki)
				goto oom;
			kinst_one_op(ki, n, -1);
			ki->variant += vectorize_of(&vw, &ki->src);
			if (w == 0)
				ks->copy[v] = ki;
		}
	}
	/* 3-4: keyed from the program's forms (one lookup in the cache when
	 * this program was keyed before: a warm start canonicalizes nothing),
	 * then found or compiled */
	fz_canon **cs = NULL;
	const fz_region **srcs = calloc((size_t)p->n_regions + 1, sizeof *srcs);
	if (!srcs)
		goto oom;
	for (int r = 0; r < p->n_regions; r++)
		if (ks->whole[r])
			srcs[r] = &ks->whole[r]->src; /* views folded in */
	fz_status st = fz_program_canons_of(cx->o.disk, p, srcs, &cx->o.cg, &cs,
					    NULL, err);
	if (st == FZ_OK)
		st = resolve(cx, t, cs, ks, 0, err);
	fz_program_canons_free(p, cs);
	free(srcs);
	/* 5: split what the skeletons do not take whole */
	int first_op = ks->n_inst;
	for (int i = 0; i < first_op && st == FZ_OK; i++) {
		fz_kinst *ki = ks->inst[i];
		if (ki->op != -1 || ki->region < 0 || !ki->code->unsupported)
			continue;
		const fz_region *r = p->regions[ki->region];
		bool main_width = ks->whole[r->id] == ki;
		if (ks->whole[r->id]->pair) { /* attn_pair takes only what compiles */
			fz_set_err(err, fz_strdup_printf("region %d: the one attention "
				"backward pass does not compile: %s", r->id,
				cx->first_unsupported ? cx->first_unsupported : "?"));
			st = FZ_EUNSUPPORTED;
			break;
		}
		if (main_width && !(ks->ops[r->id] = calloc((size_t)r->n_nodes + 1,
							   sizeof(fz_kinst *))))
			goto oom;
		/* the scatter, then its followers (ops[0] and ops[n - 1]; the
		 * runner skips the empty places between) */
		bool oom = false;
		fz_region *two = fz_scatter_split(r, &oom);
		if (oom)
			goto oom;
		for (int h = 0; two && h < 2; h++) {
			fz_kinst *oi = kinst_new(ks, r->id, h ? r->n_nodes - 1 : 0, ki->variant & 2, 0);
			if (!oi) {
				free(two);
				goto oom;
			}
			oi->src = two[h];
			oi->node[0] = two[h].nodes[0];
			oi->pair = h ? NULL : two; /* the first owns both */
			oi->variant += vectorize_of(&vw, &oi->src);
			if (main_width)
				ks->ops[r->id][oi->op] = oi;
		}
		for (int j = 0; !two && j < r->n_nodes; j++) {
			/* an attention region split on a target with no attention
			 * kernel: its products are library calls (exec.c) */
			if (fz_ops[r->nodes[j]->op].cls == FZ_CLASS_LIBRARY)
				continue;
			fz_kinst *oi = kinst_new(ks, r->id, j, ki->variant & 2,
						 r->nodes[j]->n_in);
			if (!oi)
				goto oom;
			kinst_one_op(oi, r->nodes[j], r->id);
			oi->variant += vectorize_of(&vw, &oi->src);
			if (main_width)
				ks->ops[r->id][j] = oi;
		}
	}
	views_free(&vw);
	if (st == FZ_OK && ks->n_inst > first_op)
		st = resolve(cx, t, NULL, ks, first_op, err);
	for (int i = first_op; i < ks->n_inst && st == FZ_OK; i++) {
		fz_kinst *oi = ks->inst[i];
		if (oi->code->unsupported) {
			const fz_node *n = oi->node[0];
			char where[64] = "";
			if (n->line > 0)
				snprintf(where, sizeof where, " at %d:%d", n->line, n->col);
			fz_set_err(err, fz_strdup_printf("region %d: the code generator does "
				"not take %s%s", oi->region, fz_ops[n->op].name, where));
			st = FZ_EUNSUPPORTED;
		}
	}
	cx->st.seconds += fz_now() - t0;
	if (st != FZ_OK) {
		fz_kset_free(ks);
		return st;
	}
	for (int i = 0; i < ks->n_inst; i++)
		if (!(ks->inst[i]->op == -1 && ks->inst[i]->region >= 0 &&
		      ks->inst[i]->code->unsupported))
			cx->st.instances++;
	*out = ks;
	return FZ_OK;
oom:
	views_free(&vw);
	fz_kset_free(ks);
	fz_set_err(err, fz_strdup("out of memory"));
	return FZ_ENOMEM;
}
