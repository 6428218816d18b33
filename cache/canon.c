/*
 * canon.c: the canonical form of a fusion region, and its key.
 *
 * Two regions get one key exactly when they would compile to the same
 * kernel: the same ops with the same attributes on the same dtypes and
 * extents, wired the same way, for the same target and code generator.
 * Value names, node ids and the written order of independent statements
 * must not enter; everything that changes the code must.
 *
 * The form is text, so `fusec-cache show` can print it and a collision
 * check is a memcmp:
 *
 *     fusec-canon 1
 *     target sm_90
 *     codegen 1
 *     build 3f09c2a1d4b7e655        (a hash of codegen/'s sources)
 *     llvm 19.1.7
 *     spec 0101
 *     kind normalization
 *     trace-symbols 2
 *     symbols t0 t1
 *     in0 bf16[s0, s1, 4096]
 *     in1 bf16[4096]
 *     n0 = cast(in0; dtype=f32) -> f32[s0, s1, 4096]
 *     n1 = mul(n0, n0) -> f32[s0, s1, 4096]
 *     n2 = sum(n1; dims=[2] keepdim=true) -> f32[s0, s1, 1]
 *     ...
 *     out n9
 *
 * The order of nodes. A canonical order must be a topological order whose
 * ties are broken by structure alone. Each node gets
 *   - its depth: the longest path to it from the region's inputs;
 *   - an up-hash: op, attributes, result types, and for each operand the
 *     up-hash of its producer (and which result) or, for a region input,
 *     only its type;
 *   - a down-hash: an order-free sum over its uses inside the region of
 *     (the user's up-hash, the operand slot, the user's down-hash), and
 *     whether the region writes its results.
 * Nodes sort by (depth, up, down); the up-hash tells `exp(x)` from
 * `log(x)`, the down-hash tells the `exp` feeding slot 0 of a `sub` from
 * the one feeding slot 1. What is still tied after both is symmetric in
 * every case that matters, and the last resort (the position in the
 * region) can at worst cost a miss, never a wrong kernel: the key is the
 * hash of the whole form, and the disk cache compares the whole form.
 *
 * Numbering. Inputs are numbered by first use in that order (operand slots
 * left to right), outputs by their node, symbols by first appearance
 * (inputs' types, then each node's attributes and result types), so a
 * trace whose B is called N shares every kernel. An extent that is a
 * sum (T+1, B*T-B) is a derived symbol (ir/type.c) and counts here as one
 * more symbol, sized at run time: a kernel over T+1 and T takes both as
 * sizes and is right for any, so a new T finds the same kernels, and the
 * extents' own canonical form makes T+1 one symbol however it was
 * written. Hashing for the order
 * uses trace symbol ids, which depend on neither names nor statement order.
 *
 * The form also lists how many symbols the trace has and, for each
 * canonical symbol, the trace symbol id it stands for: the kernels' ABI
 * passes every trace symbol's size by trace id (a GPU entry takes one i64
 * per trace symbol, the host entry reads syms[id]), so two traces that
 * number their symbols differently must not share a kernel. Renaming or
 * reordering statements never changes trace symbol ids. (Were the code
 * generator to take only the region's symbols, in canonical order, these
 * two lines could go and more traces would share kernels.)
 *
 * The key is XXH3-128 of the form. fz_key_set_hash lets a test force
 * collisions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Core.h>
#include <xxhash.h>

#include "attention.h"
#include "cache.h"
/* FZ_BUILD_ID, written at build time by cmake/build_id.cmake; a build
 * without it (a hand-made one) keys as "unknown", never as another's */
#if defined(__has_include)
#if __has_include("fz_build_id.h")
#include "fz_build_id.h"
#endif
#endif
#ifndef FZ_BUILD_ID
#define FZ_BUILD_ID "unknown"
#endif

#define CANON_FORMAT 1

/* ---- keys ---- */

static fz_key xxh3_key(const void *data, size_t len)
{
	XXH128_hash_t h = XXH3_128bits(data, len);
	fz_key k = {h.high64, h.low64};
	return k;
}

static fz_key_hash_fn key_hash = xxh3_key;

void fz_key_set_hash(fz_key_hash_fn fn) { key_hash = fn ? fn : xxh3_key; }

fz_key fz_key_of(const void *data, size_t len) { return key_hash(data, len); }

void fz_key_hex(fz_key k, char out[FZ_KEY_HEX])
{
	snprintf(out, FZ_KEY_HEX, "%016llx%016llx", (unsigned long long)k.hi,
		 (unsigned long long)k.lo);
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

bool fz_key_parse(const char *hex, fz_key *out)
{
	uint64_t w[2] = {0, 0};
	for (int i = 0; i < 32; i++) {
		int v = hexval(hex[i]);
		if (v < 0)
			return false;
		w[i / 16] = w[i / 16] << 4 | (uint64_t)v;
	}
	if (hex[32])
		return false;
	out->hi = w[0];
	out->lo = w[1];
	return true;
}

const char *fz_build_id(void) { return FZ_BUILD_ID; }

void fz_key_params_init(fz_key_params *kp, const char *target,
			int codegen_version)
{
	memset(kp, 0, sizeof *kp);
	kp->target = target;
	kp->codegen_version = codegen_version;
	kp->build_id = FZ_BUILD_ID;
	LLVMGetVersion(&kp->llvm_major, &kp->llvm_minor, &kp->llvm_patch);
}

/* ---- a small map from ids to local indices (open addressing) ---- */

typedef struct idmap {
	int *key, *val;
	int cap;
} idmap;

static bool idmap_init(idmap *m, int n)
{
	m->cap = 16;
	while (m->cap < 2 * n + 2)
		m->cap *= 2;
	m->key = malloc(sizeof *m->key * (size_t)m->cap);
	m->val = malloc(sizeof *m->val * (size_t)m->cap);
	if (!m->key || !m->val)
		return false;
	for (int i = 0; i < m->cap; i++)
		m->key[i] = -1;
	return true;
}

static void idmap_release(idmap *m)
{
	free(m->key);
	free(m->val);
}

static int *idmap_slot(idmap *m, int id)
{
	unsigned h = (unsigned)id * 2654435761u & (unsigned)(m->cap - 1);
	while (m->key[h] != -1 && m->key[h] != id)
		h = (h + 1) & (unsigned)(m->cap - 1);
	return (int *)&m->key[h];
}

static void idmap_put(idmap *m, int id, int v)
{
	int *k = idmap_slot(m, id);
	*k = id;
	m->val[k - m->key] = v;
}

static int idmap_get(idmap *m, int id)
{
	int *k = idmap_slot(m, id);
	return *k == id ? m->val[k - m->key] : -1;
}

/* ---- writing extents, types and attributes ---- */

/* Symbol numbering: sym[trace id] = canonical number or -1; NULL writes
 * trace ids ("t3"), for the hashes that order the nodes. */
typedef struct symnum {
	int of[FZ_MAX_SYMS];
	int n;
	int syms[FZ_MAX_SYMS];
} symnum;

static void see_ext(symnum *s, fz_ext e)
{
	for (int i = 0; i < FZ_MAX_SYMS; i++)
		if (fz_ext_power(e, i) && s->of[i] < 0) {
			s->syms[s->n] = i;
			s->of[i] = s->n++;
		}
}

static void see_type(symnum *s, const fz_type *ty)
{
	for (int i = 0; i < ty->rank; i++)
		see_ext(s, ty->dims[i]);
}

static void see_node(symnum *s, const fz_node *n)
{
	const fz_attrs *a = &n->attrs;
	unsigned at = fz_ops[n->op].attrs;
	if (at & AT(SHAPE))
		for (int i = 0; i < a->n_shape; i++)
			see_ext(s, a->shape[i]);
	if (at & AT(START))
		for (int i = 0; i < a->n_slice; i++)
			see_ext(s, a->end[i]);
	if ((at & AT(VALUE)) && a->value_sym >= 0 && a->value_sym < FZ_MAX_SYMS &&
	    s->of[a->value_sym] < 0) {
		s->syms[s->n] = a->value_sym;
		s->of[a->value_sym] = s->n++;
	}
	for (int k = 0; k < n->n_out; k++)
		see_type(s, &n->out[k]->type);
}

static void put_sym(fz_buf *b, const symnum *s, int id)
{
	fz_buf_putc(b, s ? 's' : 't');
	fz_buf_put_int(b, s ? s->of[id] : id);
}

static void put_ext(fz_buf *b, const symnum *s, fz_ext e)
{
	/* factors in canonical order, so 2*B*T and 2*T*B read the same */
	int ids[FZ_MAX_SYMS], n = 0;
	for (int i = 0; i < FZ_MAX_SYMS; i++)
		if (fz_ext_power(e, i))
			ids[n++] = i;
	for (int i = 1; s && i < n; i++)
		for (int j = i; j > 0 && s->of[ids[j]] < s->of[ids[j - 1]]; j--) {
			int x = ids[j];
			ids[j] = ids[j - 1];
			ids[j - 1] = x;
		}
	if (e.c != 1 || n == 0)
		fz_buf_put_int(b, e.c);
	for (int i = 0; i < n; i++) {
		if (i || e.c != 1)
			fz_buf_putc(b, '*');
		put_sym(b, s, ids[i]);
		int p = fz_ext_power(e, ids[i]);
		if (p > 1)
			fz_buf_printf(b, "^%d", p);
	}
}

static void put_type(fz_buf *b, const symnum *s, const fz_type *ty)
{
	if (ty->future)
		fz_buf_puts(b, "future ");
	fz_buf_puts(b, fz_dtype_name(ty->dtype));
	fz_buf_putc(b, '[');
	for (int i = 0; i < ty->rank; i++) {
		if (i)
			fz_buf_puts(b, ", ");
		put_ext(b, s, ty->dims[i]);
	}
	fz_buf_puts(b, "]");
}

static void put_ints(fz_buf *b, const char *key, const int *v, int n)
{
	fz_buf_putc(b, ' ');
	fz_buf_puts(b, key);
	fz_buf_puts(b, "=[");
	for (int i = 0; i < n; i++) {
		if (i)
			fz_buf_putc(b, ',');
		fz_buf_put_int(b, v[i]);
	}
	fz_buf_puts(b, "]");
}

static void put_i64s(fz_buf *b, const char *key, const int64_t *v, int n)
{
	fz_buf_putc(b, ' ');
	fz_buf_puts(b, key);
	fz_buf_puts(b, "=[");
	for (int i = 0; i < n; i++) {
		if (i)
			fz_buf_putc(b, ',');
		fz_buf_put_int(b, v[i]);
	}
	fz_buf_puts(b, "]");
}

static void put_exts(fz_buf *b, const symnum *s, const char *key,
		     const fz_ext *v, int n)
{
	fz_buf_putc(b, ' ');
	fz_buf_puts(b, key);
	fz_buf_puts(b, "=[");
	for (int i = 0; i < n; i++) {
		if (i)
			fz_buf_putc(b, ',');
		put_ext(b, s, v[i]);
	}
	fz_buf_puts(b, "]");
}

/* Every attribute the op accepts (the builder fills defaults, so each is
 * meaningful); floats in hex, exactly. */
static void put_attrs(fz_buf *b, const symnum *s, const fz_node *n)
{
	const fz_attrs *a = &n->attrs;
	unsigned at = fz_ops[n->op].attrs;
	if (at & AT(DTYPE))
		fz_buf_printf(b, " dtype=%s", fz_dtype_name(a->dtype));
	if (at & AT(SHAPE))
		put_exts(b, s, "shape", a->shape, a->n_shape);
	if (at & AT(DIMS))
		put_ints(b, "dims", a->dims, a->n_dims);
	if (at & AT(DIM))
		fz_buf_printf(b, " dim=%d", a->dim);
	if (at & AT(KEEPDIM))
		fz_buf_printf(b, " keepdim=%d", a->keepdim ? 1 : 0);
	if (at & AT(VALUE)) {
		if (a->value_sym >= 0 && a->value_sym < FZ_MAX_SYMS) {
			fz_buf_puts(b, " value=");
			put_sym(b, s, a->value_sym);
		} else {
			fz_buf_printf(b, " value=%a", a->value);
		}
	}
	if (at & AT(LENGTH)) {
		fz_buf_puts(b, " length=");
		put_ext(b, s, a->length);
	}
	/* a seed written in is part of the kernel; a seed operand is a
	 * run-time input like any other, and its value is no part of the key */
	if ((at & AT(SEED)) && n->n_in == 0)
		fz_buf_printf(b, " seed=%lld offset=%lld", (long long)a->seed,
			      (long long)a->offset);
	else if (at & AT(SEED))
		fz_buf_printf(b, " seed=operand offset=%lld", (long long)a->offset);
	if (at & AT(START)) {
		put_i64s(b, "start", a->start, a->n_slice);
		put_exts(b, s, "end", a->end, a->n_slice);
		put_i64s(b, "step", a->step, a->n_slice);
	}
	if (at & AT(CORRECTION))
		fz_buf_printf(b, " correction=%lld", (long long)a->correction);
	if (at & AT(APPROXIMATE))
		fz_buf_printf(b, " approximate=%d", a->approximate);
	if (at & AT(EPS))
		fz_buf_printf(b, " eps=%a", a->eps);
	if (at & AT(K))
		fz_buf_printf(b, " k=%lld", (long long)a->k);
	if (at & AT(CAUSAL))
		fz_buf_printf(b, " causal=%d scale=%a window=%lld softcap=%a",
			      a->causal ? 1 : 0, a->scale, (long long)a->window,
			      a->softcap);
}

/* "op; attrs -> types": what a node computes, without its operands. */
static void put_sig(fz_buf *b, const symnum *s, const fz_node *n)
{
	fz_buf_puts(b, fz_ops[n->op].name);
	put_attrs(b, s, n);
	fz_buf_puts(b, " ->");
	for (int k = 0; k < n->n_out; k++) {
		fz_buf_puts(b, k ? ", " : " ");
		put_type(b, s, &n->out[k]->type);
	}
}

/* ---- ordering ---- */

typedef struct cnode {
	fz_node *n;
	int pos;            /* in the region's own order */
	int depth;
	uint64_t up, down;
	int rank;           /* canonical index */
} cnode;

static uint64_t mix(uint64_t h, uint64_t x)
{
	x ^= h + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	x ^= x >> 31;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 29;
	return x;
}

static int cnode_cmp(const void *pa, const void *pb)
{
	const cnode *a = *(const cnode *const *)pa, *b = *(const cnode *const *)pb;
	if (a->depth != b->depth)
		return a->depth < b->depth ? -1 : 1;
	if (a->up != b->up)
		return a->up < b->up ? -1 : 1;
	if (a->down != b->down)
		return a->down < b->down ? -1 : 1;
	return a->pos - b->pos;
}

typedef struct canon_work {
	const fz_trace *t;
	const fz_region *r;
	cnode *cn;
	cnode **sorted;
	idmap node_of;      /* node id -> index in cn */
	idmap in_of;        /* value id -> canonical input number */
	idmap out_of;       /* value id -> 1 when the region writes it */
	fz_buf tmp;
} canon_work;

static uint64_t hash_text(fz_buf *b)
{
	return b->oom ? 0 : XXH3_64bits(b->data, b->len);
}

static fz_status order_nodes(canon_work *w)
{
	const fz_region *r = w->r;
	int n = r->n_nodes;
	/* up: the region's own order is topological */
	for (int i = 0; i < n; i++) {
		cnode *c = &w->cn[i];
		const fz_node *nd = c->n;
		w->tmp.len = 0;
		put_sig(&w->tmp, NULL, nd);
		uint64_t h = hash_text(&w->tmp);
		c->depth = 0;
		for (int k = 0; k < nd->n_in; k++) {
			const fz_value *v = fz_attn_operand(w->r, nd, k);
			int j = v->def ? idmap_get(&w->node_of, v->def->id) : -1;
			if (j >= 0) {
				h = mix(h, w->cn[j].up + (uint64_t)v->out_index);
				if (w->cn[j].depth + 1 > c->depth)
					c->depth = w->cn[j].depth + 1;
			} else {
				w->tmp.len = 0;
				put_type(&w->tmp, NULL, &v->type);
				h = mix(h, hash_text(&w->tmp) ^ 0x5555);
			}
		}
		c->up = h;
	}
	if (w->tmp.oom)
		return FZ_ENOMEM;
	/* down: users come later in a topological order */
	for (int i = n - 1; i >= 0; i--) {
		cnode *c = &w->cn[i];
		uint64_t d = 0;
		for (int k = 0; k < c->n->n_out; k++)
			if (idmap_get(&w->out_of, c->n->out[k]->id) >= 0)
				d += mix(0x77, (uint64_t)k);
		c->down = d;
	}
	for (int i = n - 1; i >= 0; i--) {
		cnode *c = &w->cn[i];
		const fz_node *nd = c->n;
		for (int k = 0; k < nd->n_in; k++) {
			const fz_value *v = fz_attn_operand(w->r, nd, k);
			int j = v->def ? idmap_get(&w->node_of, v->def->id) : -1;
			if (j >= 0)
				w->cn[j].down += mix(mix(c->up, c->down),
						     (uint64_t)k << 8 | (uint64_t)v->out_index);
		}
	}
	for (int i = 0; i < n; i++)
		w->sorted[i] = &w->cn[i];
	qsort(w->sorted, (size_t)n, sizeof *w->sorted, cnode_cmp);
	for (int i = 0; i < n; i++)
		w->sorted[i]->rank = i;
	return FZ_OK;
}

/* ---- the form ---- */

typedef struct outref {
	fz_value *v;
	int pos;        /* in region->out */
	int rank;       /* canonical index of its node */
} outref;

static int outref_cmp(const void *pa, const void *pb)
{
	const outref *a = pa, *b = pb;
	if (a->rank != b->rank)
		return a->rank - b->rank;
	return a->v->out_index - b->v->out_index;
}

static void put_operand(fz_buf *b, canon_work *w, const fz_value *v)
{
	int j = v->def ? idmap_get(&w->node_of, v->def->id) : -1;
	if (j >= 0) {
		fz_buf_putc(b, 'n');
		fz_buf_put_int(b, w->cn[j].rank);
		if (w->cn[j].n->n_out > 1) {
			fz_buf_putc(b, '.');
			fz_buf_put_int(b, v->out_index);
		}
	} else {
		fz_buf_puts(b, "in");
		fz_buf_put_int(b, idmap_get(&w->in_of, v->id));
	}
}

fz_status fz_canon_region(const fz_trace *t, const fz_region *r,
			  const fz_key_params *kp, fz_canon **out, char **err)
{
	*out = NULL;
	if (!t || !r || !kp || !kp->target || (kp->n_spec && !kp->spec)) {
		if (err)
			*err = fz_strdup("fz_canon_region: bad arguments");
		return FZ_EINVAL;
	}
	fz_status st = FZ_ENOMEM;
	canon_work w = {t, r, NULL, NULL, {0}, {0}, {0}, {0}};
	fz_buf b = {0};
	outref *outs = NULL;
	fz_canon *c = calloc(1, sizeof *c);
	if (!c)
		goto fail;
	int n = r->n_nodes;
	c->n_nodes = n;
	c->n_in = r->n_in;
	c->n_out = r->n_out;
	c->nodes = calloc((size_t)n + 1, sizeof *c->nodes);
	c->in = calloc((size_t)r->n_in + 1, sizeof *c->in);
	c->out = calloc((size_t)r->n_out + 1, sizeof *c->out);
	c->in_pos = calloc((size_t)r->n_in + 1, sizeof *c->in_pos);
	c->out_pos = calloc((size_t)r->n_out + 1, sizeof *c->out_pos);
	w.cn = calloc((size_t)n + 1, sizeof *w.cn);
	w.sorted = calloc((size_t)n + 1, sizeof *w.sorted);
	outs = calloc((size_t)r->n_out + 1, sizeof *outs);
	if (!c->nodes || !c->in || !c->out || !c->in_pos || !c->out_pos ||
	    !w.cn || !w.sorted || !outs || !idmap_init(&w.node_of, n) ||
	    !idmap_init(&w.in_of, r->n_in) || !idmap_init(&w.out_of, r->n_out))
		goto fail;
	for (int i = 0; i < n; i++) {
		w.cn[i].n = r->nodes[i];
		w.cn[i].pos = i;
		idmap_put(&w.node_of, r->nodes[i]->id, i);
	}
	for (int i = 0; i < r->n_out; i++)
		idmap_put(&w.out_of, r->out[i]->id, i);
	if ((st = order_nodes(&w)) != FZ_OK)
		goto fail;
	st = FZ_ENOMEM;

	/* inputs by first use; every value a node reads from outside must be
	 * one of the region's inputs, and every input must be read */
	for (int i = 0; i < r->n_in; i++)
		idmap_put(&w.in_of, r->in[i]->id, -2 - i);
	int n_in = 0;
	bool bad = false;
	for (int i = 0; i < n; i++) {
		const fz_node *nd = w.sorted[i]->n;
		c->nodes[i] = w.sorted[i]->n;
		for (int k = 0; k < nd->n_in; k++) {
			fz_value *v = (fz_value *)fz_attn_operand(r, nd, k);
			if (v->def && idmap_get(&w.node_of, v->def->id) >= 0)
				continue;
			int at = idmap_get(&w.in_of, v->id);
			if (at == -1) {
				bad = true;
			} else if (at <= -2) {
				c->in_pos[n_in] = -2 - at;
				idmap_put(&w.in_of, v->id, n_in);
				c->in[n_in++] = v;
			}
		}
	}
	if (bad || n_in != r->n_in) {
		st = FZ_EINVAL;
		if (err)
			*err = fz_strdup_printf("region %d: its inputs are not the "
						"values its nodes read", r->id);
		goto fail;
	}
	for (int i = 0; i < r->n_out; i++) {
		int j = r->out[i]->def ? idmap_get(&w.node_of, r->out[i]->def->id) : -1;
		if (j < 0) {
			st = FZ_EINVAL;
			if (err)
				*err = fz_strdup_printf("region %d: output %d is not "
							"made by the region", r->id, i);
			goto fail;
		}
		outs[i] = (outref){r->out[i], i, w.cn[j].rank};
	}
	qsort(outs, (size_t)r->n_out, sizeof *outs, outref_cmp);
	for (int i = 0; i < r->n_out; i++) {
		c->out[i] = outs[i].v;
		c->out_pos[i] = outs[i].pos;
	}

	/* symbols by first appearance */
	symnum s;
	memset(&s, 0, sizeof s);
	for (int i = 0; i < FZ_MAX_SYMS; i++)
		s.of[i] = -1;
	for (int i = 0; i < r->n_in; i++)
		see_type(&s, &c->in[i]->type);
	for (int i = 0; i < n; i++)
		see_node(&s, c->nodes[i]);
	c->n_syms = s.n;
	memcpy(c->syms, s.syms, sizeof s.syms);

	fz_buf_printf(&b, "fusec-canon %d\ntarget %s\ncodegen %d\nbuild %s\n"
		      "llvm %u.%u.%u\nspec ", CANON_FORMAT, kp->target,
		      kp->codegen_version, kp->build_id ? kp->build_id : "-",
		      kp->llvm_major, kp->llvm_minor, kp->llvm_patch);
	for (size_t i = 0; i < kp->n_spec; i++)
		fz_buf_printf(&b, "%02x", kp->spec[i]);
	fz_buf_printf(&b, "\nkind %s\ntrace-symbols %d\nsymbols",
		      fz_region_kind_names[r->kind], t->n_syms);
	for (int i = 0; i < s.n; i++)
		fz_buf_printf(&b, " t%d", s.syms[i]);
	fz_buf_puts(&b, "\n");
	for (int i = 0; i < r->n_in; i++) {
		fz_buf_puts(&b, "in");
		fz_buf_put_int(&b, i);
		fz_buf_putc(&b, ' ');
		put_type(&b, &s, &c->in[i]->type);
		fz_buf_puts(&b, "\n");
	}
	for (int i = 0; i < n; i++) {
		const fz_node *nd = c->nodes[i];
		fz_buf_putc(&b, 'n');
		fz_buf_put_int(&b, i);
		fz_buf_puts(&b, " = ");
		fz_buf_puts(&b, fz_ops[nd->op].name);
		fz_buf_putc(&b, '(');
		for (int k = 0; k < nd->n_in; k++) {
			if (k)
				fz_buf_puts(&b, ", ");
			put_operand(&b, &w, fz_attn_operand(r, nd, k));
		}
		fz_buf_puts(&b, ";");
		size_t before = b.len;
		put_attrs(&b, &s, nd);
		if (b.len == before && !b.oom)
			b.data[--b.len] = '\0'; /* no attributes: no ';' */
		fz_buf_puts(&b, ") ->");
		for (int k = 0; k < nd->n_out; k++) {
			fz_buf_puts(&b, k ? ", " : " ");
			put_type(&b, &s, &nd->out[k]->type);
		}
		fz_buf_puts(&b, "\n");
	}
	for (int i = 0; i < r->n_out; i++) {
		fz_buf_puts(&b, "out ");
		put_operand(&b, &w, c->out[i]);
		fz_buf_puts(&b, "\n");
	}
	if (b.oom || w.tmp.oom)
		goto fail;
	c->len = b.len;
	c->text = fz_buf_take(&b);
	if (!c->text)
		goto fail;
	c->key = fz_key_of(c->text, c->len);
	st = FZ_OK;
	*out = c;
	c = NULL;
fail:
	if (st == FZ_ENOMEM && err && !*err)
		*err = fz_strdup("out of memory");
	free(outs);
	free(w.cn);
	free(w.sorted);
	idmap_release(&w.node_of);
	idmap_release(&w.in_of);
	idmap_release(&w.out_of);
	free(fz_buf_take(&w.tmp));
	free(fz_buf_take(&b));
	fz_canon_free(c);
	return st;
}

fz_status fz_canon_respec(const fz_canon *c, const uint8_t *spec, size_t n_spec,
			  fz_canon **out)
{
	*out = NULL;
	const char *line = strstr(c->text, "\nspec ");
	const char *end = line ? strchr(line + 6, '\n') : NULL;
	if (!end)
		return FZ_EINVAL;
	size_t head = (size_t)(line + 6 - c->text), tail = c->len - (size_t)(end - c->text);
	fz_canon *d = calloc(1, sizeof *d);
	if (!d)
		return FZ_ENOMEM;
	*d = *c;
	d->text = NULL;
	d->nodes = NULL;
	d->in = d->out = NULL;
	d->in_pos = d->out_pos = NULL;
	d->len = head + 2 * n_spec + tail;
	d->text = malloc(d->len + 1);
	d->nodes = malloc(sizeof *d->nodes * ((size_t)c->n_nodes + 1));
	d->in = malloc(sizeof *d->in * ((size_t)c->n_in + 1));
	d->out = malloc(sizeof *d->out * ((size_t)c->n_out + 1));
	d->in_pos = malloc(sizeof *d->in_pos * ((size_t)c->n_in + 1));
	d->out_pos = malloc(sizeof *d->out_pos * ((size_t)c->n_out + 1));
	if (!d->text || !d->nodes || !d->in || !d->out || !d->in_pos || !d->out_pos) {
		fz_canon_free(d);
		return FZ_ENOMEM;
	}
	static const char hex[] = "0123456789abcdef";
	memcpy(d->text, c->text, head);
	for (size_t i = 0; i < n_spec; i++) {
		d->text[head + 2 * i] = hex[spec[i] >> 4];
		d->text[head + 2 * i + 1] = hex[spec[i] & 15];
	}
	memcpy(d->text + head + 2 * n_spec, end, tail + 1);
	memcpy(d->nodes, c->nodes, sizeof *d->nodes * (size_t)c->n_nodes);
	memcpy(d->in, c->in, sizeof *d->in * (size_t)c->n_in);
	memcpy(d->out, c->out, sizeof *d->out * (size_t)c->n_out);
	memcpy(d->in_pos, c->in_pos, sizeof *d->in_pos * (size_t)c->n_in);
	memcpy(d->out_pos, c->out_pos, sizeof *d->out_pos * (size_t)c->n_out);
	d->key = fz_key_of(d->text, d->len);
	*out = d;
	return FZ_OK;
}

void fz_canon_free(fz_canon *c)
{
	if (!c)
		return;
	free(c->text);
	free(c->nodes);
	free(c->in);
	free(c->out);
	free(c->in_pos);
	free(c->out_pos);
	free(c);
}

void fz_canon_region_view(const fz_canon *c, const fz_region *r, fz_region *out)
{
	*out = *r;
	out->nodes = c->nodes;
	out->in = c->in;
	out->out = c->out;
	out->in_id = out->out_id = NULL;
}

/* ---- reading a form back (ls, show) ---- */

void fz_canon_field(const char *text, size_t len, const char *name, char *buf,
		    size_t n)
{
	size_t nl = strlen(name);
	const char *p = text, *end = text + len;
	buf[0] = '\0';
	while (p < end) {
		const char *eol = memchr(p, '\n', (size_t)(end - p));
		if (!eol)
			eol = end;
		if ((size_t)(eol - p) > nl && !memcmp(p, name, nl) && p[nl] == ' ') {
			size_t k = (size_t)(eol - p) - nl - 1;
			if (k >= n)
				k = n - 1;
			memcpy(buf, p + nl + 1, k);
			buf[k] = '\0';
			return;
		}
		p = eol + 1;
	}
}

void fz_canon_describe(const char *text, size_t len, char *buf, size_t n)
{
	char kind[32], in0[96];
	fz_canon_field(text, len, "kind", kind, sizeof kind);
	fz_canon_field(text, len, "in0", in0, sizeof in0);
	size_t k = (size_t)snprintf(buf, n, "%s:", kind[0] ? kind : "?");
	const char *p = text, *end = text + len;
	int ops = 0;
	while (p < end && k + 1 < n) {
		const char *eol = memchr(p, '\n', (size_t)(end - p));
		if (!eol)
			eol = end;
		const char *eq = p[0] == 'n' ? memchr(p, '=', (size_t)(eol - p)) : NULL;
		const char *par = eq ? memchr(eq, '(', (size_t)(eol - eq)) : NULL;
		if (eq && par && eq + 2 <= par) {
			if (ops++ == 6) {
				k += (size_t)snprintf(buf + k, n - k, " ...");
				break;
			}
			k += (size_t)snprintf(buf + k, n - k, " %.*s",
					      (int)(par - eq - 2), eq + 2);
		}
		p = eol + 1;
	}
	if (k + 1 < n && in0[0])
		snprintf(buf + k, n - k, " | %s", in0);
}
