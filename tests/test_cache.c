/*
 * test_cache.c: keys, the in-memory LRU and the disk cache (cache/).
 *
 * Keys: renaming values and symbols, and reordering independent
 * statements, leave every key alone (on whole-trace regions and on the
 * planner's regions); each thing the key is made of changes it. The LRU
 * evicts in recency order and frees exactly what it drops. The disk cache:
 * a forced hash collision is a miss, never the other form's kernel; a
 * truncated, bit-flipped, foreign-version or garbage entry is a miss that
 * is removed, reported once, and replaced by the next store; entries that
 * are not ours or writable by others are refused; eight processes storing
 * one model into an empty cache at once all succeed and leave a cache
 * that verifies clean; the size cap and prune evict least recently used
 * first; a cache that cannot be written degrades with one warning.
 * Host objects: an entry compiled for the host holds an ELF object that
 * links into another compiler's JIT and computes the region; an older
 * host entry (IR text, no object) is not usable. The runner: identical
 * layers compile once, a second runner on the same cache compiles
 * nothing and computes the same bits, a runner without a disk cache
 * compiles again. (tests/cache_run.sh does the same through the tools.)
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../cache/cache.h"
#include "codegen.h"
#include "exec.h"

/* ---- helpers ---- */

static fz_module *parse(const char *src)
{
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = fz_module_parse(src, strlen(src), "test.trace", &m, &diag);
	ck_assert_msg(st == FZ_OK, "parse failed: %s", diag ? diag : "?");
	fz_free(diag);
	return m;
}

/* The whole trace as one region: all nodes in written order, the
 * parameters they read (in first-use order) in, the outputs out. */
typedef struct whole {
	fz_region r;
	fz_value *in[64], *out[16];
} whole;

static void whole_region(const fz_trace *t, whole *w)
{
	memset(w, 0, sizeof *w);
	w->r.kind = FZ_REGION_POINTWISE;
	w->r.n_nodes = t->n_nodes;
	w->r.nodes = t->nodes;
	w->r.in = w->in;
	w->r.out = w->out;
	for (int i = 0; i < t->n_nodes; i++)
		for (int k = 0; k < t->nodes[i]->n_in; k++) {
			fz_value *v = t->nodes[i]->in[k];
			bool seen = v->def != NULL;
			for (int j = 0; j < w->r.n_in && !seen; j++)
				seen = w->in[j] == v;
			if (!seen)
				w->in[w->r.n_in++] = v;
		}
	for (int i = 0; i < t->n_outputs; i++)
		w->out[w->r.n_out++] = t->outputs[i];
}

/* Modules whose nodes canonical forms point into; freed after each test. */
static fz_module *kept[256];
static int n_kept;

static void release_modules(void)
{
	while (n_kept > 0)
		fz_module_free(kept[--n_kept]);
}

static fz_canon *canon_with(const char *src, const fz_key_params *kp)
{
	fz_module *m = parse(src);
	ck_assert_int_lt(n_kept, 256);
	kept[n_kept++] = m;
	whole w;
	whole_region(fz_module_trace(m, 0), &w);
	fz_canon *c = NULL;
	char *err = NULL;
	fz_status st = fz_canon_region(fz_module_trace(m, 0), &w.r, kp, &c, &err);
	ck_assert_msg(st == FZ_OK, "canon failed: %s", err ? err : "?");
	fz_free(err);
	return c;
}

static fz_canon *canon_of(const char *src)
{
	fz_key_params kp;
	fz_key_params_init(&kp, "sm_90", 1);
	return canon_with(src, &kp);
}

static fz_key key_of(const char *src)
{
	fz_canon *c = canon_of(src);
	fz_key k = c->key;
	fz_canon_free(c);
	return k;
}

/* rms_norm, two independent pointwise chains, and a symmetric pair
 * (exp of two inputs of one type) told apart only by how they are used. */
static const char *base_src =
	"trace t(x: bf16[B, T, 64], w: bf16[64], v: f32[B, T, 64], "
	"u: f32[B, T, 64]) {\n"
	"  xf = cast(x, dtype=f32)\n"
	"  ms = mean(mul(xf, xf), dims=[2], keepdim=true)\n"
	"  r = rsqrt(add(ms, 1e-5))\n"
	"  y = cast(mul(mul(xf, r), cast(w, dtype=f32)), dtype=bf16)\n"
	"  a = exp(v)\n"
	"  b = log(v)\n"
	"  z = sub(a, b)\n"
	"  p = exp(v)\n"
	"  q = exp(u)\n"
	"  d = div(p, q)\n"
	"  return y, z, d\n"
	"}\n";

/* The same: every name changed, symbols renamed, independent statements
 * in another order. */
static const char *renamed_src =
	"trace other(in0: bf16[N, S, 64], g: bf16[64], h: f32[N, S, 64], "
	"k: f32[N, S, 64]) {\n"
	"  e2 = exp(k)\n"
	"  lg = log(h)\n"
	"  e1 = exp(h)\n"
	"  ex = exp(h)\n"
	"  quot = div(e1, e2)\n"
	"  diff = sub(ex, lg)\n"
	"  f = cast(in0, dtype=f32)\n"
	"  msq = mean(mul(f, f), dims=[2], keepdim=true)\n"
	"  rs = rsqrt(add(msq, 1e-5))\n"
	"  out = cast(mul(mul(f, rs), cast(g, dtype=f32)), dtype=bf16)\n"
	"  return out, diff, quot\n"
	"}\n";

static char *replace(const char *s, const char *from, const char *to)
{
	const char *p = strstr(s, from);
	ck_assert_msg(p != NULL, "'%s' not in the source", from);
	char *r = malloc(strlen(s) + strlen(to) + 1);
	memcpy(r, s, (size_t)(p - s));
	strcpy(r + (p - s), to);
	strcat(r, p + strlen(from));
	return r;
}

/* ---- keys ---- */

START_TEST(key_hex_roundtrip)
{
	fz_key k = {0x0123456789abcdefull, 0xfedcba9876543210ull}, b;
	char hex[FZ_KEY_HEX];
	fz_key_hex(k, hex);
	ck_assert_str_eq(hex, "0123456789abcdeffedcba9876543210");
	ck_assert(fz_key_parse(hex, &b) && fz_key_eq(k, b));
	ck_assert(!fz_key_parse("0123", &b));
	ck_assert(!fz_key_parse("0123456789abcdeffedcba98765432100", &b));
	ck_assert(!fz_key_parse("0123456789abcdeffedcba987654321g", &b));
}
END_TEST

START_TEST(key_invariant_rename_reorder)
{
	fz_canon *a = canon_of(base_src), *b = canon_of(renamed_src);
	ck_assert_msg(fz_key_eq(a->key, b->key), "forms differ:\n%s\n---\n%s",
		      a->text, b->text);
	ck_assert_str_eq(a->text, b->text);
	/* the canonical inputs are the same parameters by position */
	ck_assert_int_eq(a->n_in, b->n_in);
	for (int i = 0; i < a->n_in; i++)
		ck_assert_int_eq(a->in[i]->param_index, b->in[i]->param_index);
	ck_assert(strstr(a->text, "B") == NULL && strstr(a->text, "xf") == NULL);
	fz_canon_free(a);
	fz_canon_free(b);
}
END_TEST

START_TEST(key_invariant_symbol_names)
{
	char *s1 = replace(base_src, "x: bf16[B, T, 64]", "x: bf16[Batch, T, 64]");
	char *s2 = replace(s1, "v: f32[B, T, 64]", "v: f32[Batch, T, 64]");
	char *s3 = replace(s2, "u: f32[B, T, 64]", "u: f32[Batch, T, 64]");
	ck_assert(fz_key_eq(key_of(base_src), key_of(s3)));
	free(s1);
	free(s2);
	free(s3);
}
END_TEST

START_TEST(key_symmetric_operands)
{
	/* d = div(p, q) vs div(q, p): same nodes, other wiring */
	char *s = replace(base_src, "d = div(p, q)", "d = div(q, p)");
	ck_assert(!fz_key_eq(key_of(base_src), key_of(s)));
	free(s);
	/* the order of a region's outputs is the kernel's, not the trace's */
	s = replace(base_src, "return y, z, d", "return d, y, z");
	ck_assert(fz_key_eq(key_of(base_src), key_of(s)));
	free(s);
}
END_TEST

/* Each edit changes one thing the key is made of. */
static const char *const edits[][2] = {
	{"z = sub(a, b)", "z = add(a, b)"},                         /* op */
	{"a = exp(v)", "a = exp2(v)"},                              /* op */
	{"dims=[2], keepdim=true", "dims=[1], keepdim=true"},       /* attribute */
	{"1e-5", "1e-6"},                                           /* constant */
	{"x: bf16[B, T, 64]", "x: f16[B, T, 64]"},                  /* dtype */
	{"dtype=bf16", "dtype=f16"},                                /* dtype attr */
	{"w: bf16[64]", "w: bf16[1]"},                              /* extent */
	{"v: f32[B, T, 64], u: f32[B, T, 64]",
	 "v: f32[B, T, 32], u: f32[B, T, 32]"},                     /* extent */
	{"v: f32[B, T, 64], u: f32[B, T, 64]",
	 "v: f32[T, B, 64], u: f32[T, B, 64]"},                     /* symbol order */
	{"v: f32[B, T, 64], u: f32[B, T, 64]",
	 "v: f32[B, B, 64], u: f32[B, B, 64]"},                     /* symbol reuse */
	{"v: f32[B, T, 64], u: f32[B, T, 64]",
	 "v: f32[B, 7, 64], u: f32[B, 7, 64]"},                     /* symbolic vs concrete */
	{"return y, z, d", "return y, z, d, a"},                    /* outputs */
	{"return y, z, d", "return y, z"},                          /* outputs */
};

START_TEST(key_sensitive_to_region)
{
	fz_key base = key_of(base_src);
	char *s = replace(base_src, edits[_i][0], edits[_i][1]);
	ck_assert_msg(!fz_key_eq(base, key_of(s)), "edit %d (%s -> %s) kept the key",
		      _i, edits[_i][0], edits[_i][1]);
	free(s);
}
END_TEST

START_TEST(key_sensitive_to_params)
{
	fz_key_params kp;
	fz_key_params_init(&kp, "sm_90", 1);
	ck_assert_uint_eq(kp.llvm_major, 19);
	/* the build identity: 16 hex digits of codegen/'s sources, taken by
	 * cmake/build_id.cmake at build time, in the key and in the form */
	ck_assert_str_eq(kp.build_id, fz_build_id());
	ck_assert_uint_eq(strlen(kp.build_id), 16);
	ck_assert_uint_eq(strspn(kp.build_id, "0123456789abcdef"), 16);
	fz_canon *base = canon_with(base_src, &kp);
	char line[64];
	snprintf(line, sizeof line, "\nbuild %s\n", kp.build_id);
	ck_assert_ptr_nonnull(strstr(base->text, line));
	uint8_t spec0[] = {1, 0}, spec1[] = {1, 1}, spec2[] = {0, 0};
	for (int edit = 0; edit < 9; edit++) {
		fz_key_params q = kp;
		switch (edit) {
		case 0: q.target = "sm_80"; break;
		case 1: q.target = "host-x86_64"; break;
		case 2: q.codegen_version = 2; break;
		case 3: q.llvm_minor++; break;
		case 4: q.llvm_patch++; break;
		case 5: q.spec = spec0; q.n_spec = 2; break;
		case 6: q.spec = spec1; q.n_spec = 2; break;
		case 7: q.spec = spec2; q.n_spec = 1; break;
		case 8: q.build_id = "0123456789abcdef"; break; /* another build */
		}
		fz_canon *c = canon_with(base_src, &q);
		ck_assert_msg(!fz_key_eq(base->key, c->key), "param edit %d kept the key",
			      edit);
		fz_canon_free(c);
	}
	/* specialization bytes differ among themselves too */
	fz_key_params a = kp, b = kp;
	a.spec = spec0; a.n_spec = 2;
	b.spec = spec1; b.n_spec = 2;
	fz_canon *ca = canon_with(base_src, &a), *cb = canon_with(base_src, &b);
	ck_assert(!fz_key_eq(ca->key, cb->key));
	fz_canon_free(ca);
	fz_canon_free(cb);
	fz_canon_free(base);
}
END_TEST

START_TEST(key_describe)
{
	fz_canon *c = canon_of(base_src);
	char buf[256], target[32];
	fz_canon_describe(c->text, c->len, buf, sizeof buf);
	ck_assert_msg(strstr(buf, "pointwise:") == buf, "%s", buf);
	ck_assert_msg(strstr(buf, "| ") != NULL, "%s", buf);
	fz_canon_field(c->text, c->len, "target", target, sizeof target);
	ck_assert_str_eq(target, "sm_90");
	fz_canon_field(c->text, c->len, "nothing", target, sizeof target);
	ck_assert_str_eq(target, "");
	fz_canon_free(c);
}
END_TEST

/* A form respecialized is the form made with that spec: same text, same
 * key, same order of nodes and operands; and the keys of two specs
 * differ. */
START_TEST(key_respec)
{
	fz_module *m = parse(base_src);
	const fz_trace *t = fz_module_trace(m, 0);
	whole w;
	whole_region(t, &w);
	static const uint8_t sa[] = {0, 1, 0x10, 0x10}, sb[] = {1, 0, 0x10};
	fz_key_params ka, kb;
	fz_key_params_init(&ka, "sm_90", 1);
	fz_key_params_init(&kb, "sm_90", 1);
	ka.spec = sa;
	ka.n_spec = sizeof sa;
	kb.spec = sb;
	kb.n_spec = sizeof sb;
	fz_canon *a, *b, *r;
	ck_assert_int_eq(fz_canon_region(t, &w.r, &ka, &a, NULL), FZ_OK);
	ck_assert_int_eq(fz_canon_region(t, &w.r, &kb, &b, NULL), FZ_OK);
	ck_assert(!fz_key_eq(a->key, b->key));
	ck_assert_int_eq(fz_canon_respec(a, sb, sizeof sb, &r), FZ_OK);
	ck_assert_str_eq(r->text, b->text);
	ck_assert_uint_eq(r->len, b->len);
	ck_assert(fz_key_eq(r->key, b->key));
	ck_assert_int_eq(r->n_nodes, b->n_nodes);
	for (int i = 0; i < r->n_nodes; i++)
		ck_assert_ptr_eq(r->nodes[i], b->nodes[i]);
	for (int i = 0; i < r->n_in; i++)
		ck_assert_int_eq(r->in_pos[i], b->in_pos[i]);
	for (int i = 0; i < r->n_out; i++)
		ck_assert_ptr_eq(r->out[i], b->out[i]);
	fz_canon_free(r);
	/* and back; no spec line: refused */
	ck_assert_int_eq(fz_canon_respec(b, sa, sizeof sa, &r), FZ_OK);
	ck_assert_str_eq(r->text, a->text);
	fz_canon_free(r);
	fz_canon c0 = *a;
	c0.text = "fusec-canon 1\nkind pointwise\n";
	c0.len = strlen(c0.text);
	ck_assert_int_eq(fz_canon_respec(&c0, sa, sizeof sa, &r), FZ_EINVAL);
	ck_assert_ptr_null(r);
	fz_canon_free(a);
	fz_canon_free(b);
	fz_module_free(m);
}
END_TEST

START_TEST(key_region_view)
{
	fz_module *m = parse(base_src);
	const fz_trace *t = fz_module_trace(m, 0);
	whole w;
	whole_region(t, &w);
	fz_key_params kp;
	fz_key_params_init(&kp, "sm_90", 1);
	fz_canon *c;
	ck_assert_int_eq(fz_canon_region(t, &w.r, &kp, &c, NULL), FZ_OK);
	fz_region v;
	fz_canon_region_view(c, &w.r, &v);
	ck_assert_int_eq(v.n_in, w.r.n_in);
	for (int i = 0; i < c->n_in; i++)
		ck_assert_ptr_eq(v.in[i], w.r.in[c->in_pos[i]]);
	for (int i = 0; i < c->n_out; i++)
		ck_assert_ptr_eq(v.out[i], w.r.out[c->out_pos[i]]);
	/* the canonical order is topological */
	for (int i = 0; i < v.n_nodes; i++)
		for (int k = 0; k < v.nodes[i]->n_in; k++) {
			const fz_node *d = v.nodes[i]->in[k]->def;
			if (!d)
				continue;
			int j = 0;
			while (v.nodes[j] != d)
				j++;
			ck_assert_int_lt(j, i);
		}
	ck_assert_int_eq(c->n_syms, 2);
	fz_canon_free(c);
	/* a region whose inputs are not what its nodes read is refused */
	w.r.n_in--;
	char *err = NULL;
	ck_assert_int_eq(fz_canon_region(t, &w.r, &kp, &c, &err), FZ_EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_ptr_nonnull(err);
	fz_free(err);
	fz_module_free(m);
}
END_TEST

/* The planner's regions: the reordered, renamed trace makes the same
 * multiset of keys. */
static int key_cmp(const void *pa, const void *pb)
{
	const fz_key *a = pa, *b = pb;
	if (a->hi != b->hi)
		return a->hi < b->hi ? -1 : 1;
	return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* The keys of src's kernel regions planned at sizes (B, T; 0: unbound). */
static int plan_keys_at(const char *src, int64_t B, int64_t T, fz_key *keys,
			int max)
{
	fz_module *m = parse(src);
	const fz_trace *t = fz_module_trace(m, 0);
	fz_plan_options o;
	fz_plan_defaults(&o);
	int64_t sizes[FZ_MAX_SYMS];
	for (int s = 0; s < FZ_MAX_SYMS; s++)
		sizes[s] = -1;
	if (B && fz_trace_symbol_find(t, "B") >= 0)
		sizes[fz_trace_symbol_find(t, "B")] = B;
	if (T && fz_trace_symbol_find(t, "T") >= 0)
		sizes[fz_trace_symbol_find(t, "T")] = T;
	o.sym_sizes = sizes;
	fz_program *p = NULL;
	char *err = NULL;
	ck_assert_msg(fz_plan(t, &o, &p, &err) == FZ_OK, "plan: %s", err);
	fz_key_params kp;
	fz_key_params_init(&kp, "sm_90", 1);
	int n = 0;
	for (int r = 0; r < p->n_regions; r++) {
		if (!fz_region_is_kernel(p->regions[r]->kind))
			continue;
		fz_canon *c;
		ck_assert_int_eq(fz_canon_region(t, p->regions[r], &kp, &c, NULL), FZ_OK);
		ck_assert_int_lt(n, max);
		keys[n++] = c->key;
		fz_canon_free(c);
	}
	fz_program_free(p);
	fz_module_free(m);
	qsort(keys, (size_t)n, sizeof *keys, key_cmp);
	return n;
}

static int plan_keys(const char *src, fz_key *keys, int max)
{
	return plan_keys_at(src, 0, 0, keys, max);
}

START_TEST(key_invariant_planned)
{
	fz_key a[64], b[64];
	int na = plan_keys(base_src, a, 64), nb = plan_keys(renamed_src, b, 64);
	ck_assert_int_gt(na, 0);
	ck_assert_int_eq(na, nb);
	for (int i = 0; i < na; i++)
		ck_assert_msg(fz_key_eq(a[i], b[i]), "planned region keys differ");
}
END_TEST

/* Extents that are sums (T+1, B*T-B) are symbols too: a new T plans the
 * same kernels, so it compiles nothing. */
START_TEST(key_same_at_two_bindings_of_sums)
{
	static const char *src =
		"trace t(x: f32[B, T, 8], lab: i64[B, T]) {\n"
		"  pad = full(shape=[B, 1], value=-100, dtype=i64)\n"
		"  lp = slice(cat(lab, pad, dim=1), start=[0, 1], end=[B, T+1])\n"
		"  keep = cast(ne(reshape(lp, shape=[B*T]), -100), dtype=f32)\n"
		"  lg = slice(x, start=[0, 0, 0], end=[B, T-1, 8])\n"
		"  f = reshape(exp(lg), shape=[B*T-B, 8])\n"
		"  s = sum(f, dims=[1])\n"
		"  k = sum(mul(keep, 2.0), dims=[0])\n"
		"  return s, k\n"
		"}\n";
	fz_key a[64], b[64];
	int na = plan_keys_at(src, 2, 16, a, 64), nb = plan_keys_at(src, 3, 7, b, 64);
	ck_assert_int_gt(na, 1);
	ck_assert_int_eq(na, nb);
	for (int i = 0; i < na; i++)
		ck_assert_msg(fz_key_eq(a[i], b[i]), "region keys differ by binding");
}
END_TEST

/* ---- LRU ---- */

static char evicted[64];

static uint64_t str_hash(const void *k)
{
	uint64_t h = 1469598103934665603ull;
	for (const char *s = k; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static uint64_t bad_hash(const void *k) { (void)k; return 42; }

static bool str_eq(const void *a, const void *b) { return !strcmp(a, b); }

static void str_free(void *k, void *v, void *ctx)
{
	int *frees = ctx;
	strncat(evicted, k, sizeof evicted - strlen(evicted) - 1);
	free(k);
	free(v);
	(*frees)++;
}

static void lru_put_str(fz_lru *l, const char *k, int v)
{
	int *val = malloc(sizeof *val);
	*val = v;
	ck_assert_int_eq(fz_lru_put(l, fz_strdup(k), val), FZ_OK);
}

static void lru_eviction_order_with(uint64_t (*hash)(const void *))
{
	int frees = 0;
	fz_lru_ops ops = {hash, str_eq, str_free};
	fz_lru *l;
	evicted[0] = '\0';
	ck_assert_int_eq(fz_lru_new(3, &ops, &frees, &l), FZ_OK);
	lru_put_str(l, "a", 1);
	lru_put_str(l, "b", 2);
	lru_put_str(l, "c", 3);
	ck_assert_int_eq(*(int *)fz_lru_get(l, "a"), 1); /* a most recent */
	lru_put_str(l, "d", 4);                          /* evicts b */
	ck_assert_str_eq(evicted, "b");
	ck_assert_ptr_null(fz_lru_get(l, "b"));
	ck_assert_uint_eq(fz_lru_count(l), 3);
	fz_lru_get(l, "c");
	lru_put_str(l, "e", 5);                          /* evicts a */
	ck_assert_str_eq(evicted, "ba");
	lru_put_str(l, "f", 6);                          /* evicts d */
	ck_assert_str_eq(evicted, "bad");
	ck_assert_uint_eq(fz_lru_evictions(l), 3);
	/* replacing frees the old element, evicts nothing */
	lru_put_str(l, "e", 50);
	ck_assert_str_eq(evicted, "bade");
	ck_assert_int_eq(*(int *)fz_lru_get(l, "e"), 50);
	ck_assert_uint_eq(fz_lru_count(l), 3);
	ck_assert_uint_eq(fz_lru_evictions(l), 3);
	ck_assert(fz_lru_remove(l, "c"));
	ck_assert(!fz_lru_remove(l, "c"));
	ck_assert_uint_eq(fz_lru_count(l), 2);
	ck_assert_int_eq(frees, 5);
	fz_lru_free(l);
	ck_assert_int_eq(frees, 7); /* the container frees what it holds */
	fz_lru_free(NULL);
}

START_TEST(lru_eviction_order) { lru_eviction_order_with(str_hash); }
END_TEST

START_TEST(lru_colliding_hashes) { lru_eviction_order_with(bad_hash); }
END_TEST

START_TEST(lru_cap_one_and_bad_args)
{
	int frees = 0;
	fz_lru_ops ops = {str_hash, str_eq, str_free}, bad = {NULL, str_eq, NULL};
	fz_lru *l;
	ck_assert_int_eq(fz_lru_new(0, &ops, &frees, &l), FZ_EINVAL);
	ck_assert_int_eq(fz_lru_new(4, &bad, &frees, &l), FZ_EINVAL);
	ck_assert_int_eq(fz_lru_new(1, &ops, &frees, &l), FZ_OK);
	evicted[0] = '\0';
	lru_put_str(l, "x", 1);
	lru_put_str(l, "y", 2);
	ck_assert_str_eq(evicted, "x");
	ck_assert_ptr_null(fz_lru_get(l, "x"));
	ck_assert_ptr_nonnull(fz_lru_get(l, "y"));
	fz_lru_free(l);
	ck_assert_int_eq(frees, 2);
}
END_TEST

static void count_each(const void *k, void *v, void *arg)
{
	strncat(arg, k, 8);
}

START_TEST(lru_many)
{
	int frees = 0;
	fz_lru_ops ops = {str_hash, str_eq, str_free};
	fz_lru *l;
	ck_assert_int_eq(fz_lru_new(100, &ops, &frees, &l), FZ_OK);
	char k[16];
	for (int i = 0; i < 1000; i++) {
		snprintf(k, sizeof k, "k%d", i);
		evicted[0] = '\0';
		lru_put_str(l, k, i);
	}
	ck_assert_uint_eq(fz_lru_count(l), 100);
	ck_assert_int_eq(frees, 900);
	for (int i = 900; i < 1000; i++) {
		snprintf(k, sizeof k, "k%d", i);
		ck_assert_int_eq(*(int *)fz_lru_get(l, k), i);
	}
	char order[2048] = "";
	fz_lru_each(l, count_each, order);
	ck_assert(strncmp(order, "k999k998", 8) == 0);
	fz_lru_free(l);
}
END_TEST

/* ---- disk ---- */

static char tmpdir[256];
static int warnings;
static char last_warning[1024];

static void on_warn(void *ctx, const char *msg)
{
	(void)ctx;
	warnings++;
	snprintf(last_warning, sizeof last_warning, "%s", msg);
}

static void rm_rf(const char *path)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
	ck_assert_int_eq(system(cmd), 0);
}

static void setup_dir(void)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/fusec-cache-test-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	warnings = 0;
	last_warning[0] = '\0';
}

static void teardown_dir(void)
{
	chmod(tmpdir, 0700);
	rm_rf(tmpdir);
}

static fz_disk *open_cache(int64_t max)
{
	char dir[300];
	snprintf(dir, sizeof dir, "%s/c", tmpdir);
	fz_disk_options o = {dir, max, on_warn, NULL};
	fz_disk *d = NULL;
	char *err = NULL;
	ck_assert_msg(fz_disk_open(&o, &d, &err) == FZ_OK, "open: %s", err);
	return d;
}

/* A made-up entry i: its form, key and payload. */
typedef struct fake {
	char canon[64];
	fz_key key;
	char ptx[2048];
	fz_section sec[2];
} fake;

static void fake_make(fake *f, int i, size_t ptx_len)
{
	snprintf(f->canon, sizeof f->canon, "fusec-canon 1\nkind pointwise\nentry %d\n", i);
	f->key = fz_key_of(f->canon, strlen(f->canon));
	if (ptx_len > sizeof f->ptx)
		ptx_len = sizeof f->ptx;
	for (size_t k = 0; k < ptx_len; k++)
		f->ptx[k] = (char)('a' + (i + (int)k) % 26);
	memset(f->sec, 0, sizeof f->sec);
	strcpy(f->sec[0].tag, "ptx");
	f->sec[0].data = f->ptx;
	f->sec[0].len = ptx_len;
	strcpy(f->sec[1].tag, "meta");
	f->sec[1].data = "entries=k0";
	f->sec[1].len = 10;
}

static void store(fz_disk *d, const fake *f)
{
	ck_assert_int_eq(fz_disk_store(d, f->key, f->canon, strlen(f->canon), f->sec, 2),
			 FZ_OK);
}

static bool hit(fz_disk *d, const fake *f)
{
	fz_entry *e = NULL;
	ck_assert_int_eq(fz_disk_lookup(d, f->key, f->canon, strlen(f->canon), &e), FZ_OK);
	if (!e)
		return false;
	const fz_section *s = fz_entry_section(e, "ptx");
	ck_assert_ptr_nonnull(s);
	ck_assert_uint_eq(s->len, f->sec[0].len);
	ck_assert(memcmp(s->data, f->ptx, s->len) == 0);
	ck_assert_ptr_nonnull(fz_entry_section(e, "meta"));
	ck_assert_ptr_null(fz_entry_section(e, "cubin.sm_90"));
	fz_entry_free(e);
	return true;
}

static void entry_file(fz_disk *d, fz_key k, char *path, size_t n)
{
	char hex[FZ_KEY_HEX];
	fz_key_hex(k, hex);
	snprintf(path, n, "%s/entries/%.2s/%s.fzc", fz_disk_path(d), hex, hex);
}

static bool exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

static int verify_bad(fz_disk *d, bool fix)
{
	int bad = -1;
	ck_assert_int_eq(fz_disk_verify(d, fix, NULL, NULL, &bad), FZ_OK);
	return bad;
}

START_TEST(disk_sizes)
{
	int64_t v;
	ck_assert(fz_size_parse("10", &v) && v == 10);
	ck_assert(fz_size_parse("1k", &v) && v == 1024);
	ck_assert(fz_size_parse("1K", &v) && v == 1024);
	ck_assert(fz_size_parse("2M", &v) && v == 2 << 20);
	ck_assert(fz_size_parse("1.5G", &v) && v == 3 << 29);
	ck_assert(fz_size_parse("1KiB", &v) && v == 1024);
	ck_assert(fz_size_parse("4GB", &v) && v == (int64_t)4 << 30);
	ck_assert(fz_size_parse("1T", &v) && v == (int64_t)1 << 40);
	ck_assert(!fz_size_parse("", &v));
	ck_assert(!fz_size_parse("x", &v));
	ck_assert(!fz_size_parse("-1", &v));
	ck_assert(!fz_size_parse("5Q", &v));
	ck_assert(!fz_size_parse("1kk", &v));
	ck_assert(!fz_size_parse(NULL, &v));
	ck_assert(!fz_size_parse("1e30", &v));
}
END_TEST

START_TEST(disk_store_lookup_layout)
{
	setup_dir();
	fz_disk *d = open_cache(0);
	ck_assert_ptr_null(fz_disk_disabled(d));
	ck_assert(fz_disk_writable(d));
	fake f;
	fake_make(&f, 1, 1000);
	ck_assert(!hit(d, &f));
	store(d, &f);
	ck_assert(hit(d, &f));
	char path[512];
	entry_file(d, f.key, path, sizeof path);
	struct stat st;
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0600);
	char dir[400];
	snprintf(dir, sizeof dir, "%s/c", tmpdir);
	ck_assert_int_eq(stat(dir, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0700);
	ck_assert_int_eq(stat(fz_disk_path(d), &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0700);
	/* the stored form is what was asked */
	fz_entry *e;
	const char *why;
	ck_assert_int_eq(fz_disk_read(d, f.key, &e, &why), FZ_OK);
	ck_assert_ptr_nonnull(e);
	ck_assert_uint_eq(e->canon_len, strlen(f.canon));
	ck_assert(memcmp(e->canon, f.canon, e->canon_len) == 0);
	fz_entry_free(e);
	fz_disk_close(d);
	/* counters survive the process */
	d = open_cache(0);
	fz_disk_stats s;
	ck_assert_int_eq(fz_disk_stat(d, &s), FZ_OK);
	ck_assert_int_eq(s.entries, 1);
	ck_assert_uint_eq(s.hits, 1);
	ck_assert_uint_eq(s.misses, 1);
	ck_assert_uint_eq(s.stores, 1);
	ck_assert_int_eq(s.max_bytes, FZ_DISK_DEFAULT_MAX);
	ck_assert_int_eq(verify_bad(d, false), 0);
	ck_assert_int_eq(warnings, 0);
	int removed;
	ck_assert_int_eq(fz_disk_clear(d, &removed, NULL), FZ_OK);
	ck_assert_int_eq(removed, 1);
	ck_assert(!hit(d, &f));
	fz_disk_close(d);
	teardown_dir();
}
END_TEST

static fz_key same_key(const void *data, size_t len)
{
	(void)data;
	(void)len;
	return (fz_key){0xc0111de, 0xc0111de};
}

START_TEST(disk_collision_is_a_miss)
{
	setup_dir();
	fz_key_set_hash(same_key);
	fake a, b;
	fake_make(&a, 1, 100);
	fake_make(&b, 2, 200);
	fz_key_set_hash(NULL);
	ck_assert(fz_key_eq(a.key, b.key));
	fz_disk *d = open_cache(0);
	store(d, &a);
	ck_assert(hit(d, &a));
	ck_assert(!hit(d, &b)); /* same key, other form: a miss */
	ck_assert(hit(d, &a));  /* and a's entry is kept */
	store(d, &b);
	ck_assert(hit(d, &b));
	ck_assert(!hit(d, &a));
	ck_assert_int_eq(verify_bad(d, false), 0);
	ck_assert_int_eq(warnings, 0);
	fz_disk_close(d);

	/* forms through fz_canon_region collide the same way */
	fz_key_set_hash(same_key);
	fz_canon *c1 = canon_of(base_src);
	char *s = replace(base_src, "exp(u)", "log(u)");
	fz_canon *c2 = canon_of(s);
	fz_key_set_hash(NULL);
	ck_assert(fz_key_eq(c1->key, c2->key));
	ck_assert_str_ne(c1->text, c2->text);
	d = open_cache(0);
	fz_section sec = {"ptx", "x", 1};
	ck_assert_int_eq(fz_disk_store(d, c1->key, c1->text, c1->len, &sec, 1), FZ_OK);
	fz_entry *e;
	ck_assert_int_eq(fz_disk_lookup(d, c2->key, c2->text, c2->len, &e), FZ_OK);
	ck_assert_ptr_null(e);
	ck_assert_int_eq(fz_disk_lookup(d, c1->key, c1->text, c1->len, &e), FZ_OK);
	ck_assert_ptr_nonnull(e);
	fz_entry_free(e);
	fz_disk_close(d);
	fz_canon_free(c1);
	fz_canon_free(c2);
	free(s);
	teardown_dir();
}
END_TEST

/* Damage kinds: truncate, flip a byte (header, form, payload, checksum),
 * another version with a good checksum, garbage, empty. */
static void damage(const char *path, int kind)
{
	int fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	struct stat st;
	fstat(fd, &st);
	unsigned char b;
	off_t at = 0;
	switch (kind) {
	case 0:
		ck_assert_int_eq(ftruncate(fd, st.st_size / 2), 0);
		break;
	case 1: case 2: case 3: case 4:
		at = kind == 1 ? 20 : kind == 2 ? 70 : kind == 3 ? st.st_size - 30 :
		     st.st_size - 1;
		ck_assert_int_eq(pread(fd, &b, 1, at), 1);
		b ^= 0x10;
		ck_assert_int_eq(pwrite(fd, &b, 1, at), 1);
		break;
	case 5: { /* version 2, checksum recomputed: a well-made foreign entry */
		unsigned char *all = malloc((size_t)st.st_size);
		ck_assert_int_eq(pread(fd, all, (size_t)st.st_size, 0), st.st_size);
		all[8] = 2;
		size_t n = (size_t)st.st_size - 16;
		/* same hash the cache uses: XXH3-128 via a key of the bytes */
		fz_key h = fz_key_of(all, n);
		for (int i = 0; i < 8; i++) {
			all[n + i] = (unsigned char)(h.hi >> 8 * i);
			all[n + 8 + i] = (unsigned char)(h.lo >> 8 * i);
		}
		ck_assert_int_eq(pwrite(fd, all, (size_t)st.st_size, 0), st.st_size);
		free(all);
		break;
	}
	case 6:
		ck_assert_int_eq(ftruncate(fd, 0), 0);
		ck_assert_int_eq(pwrite(fd, "garbage, not an entry at all, just text\n", 40, 0),
				 40);
		break;
	case 7:
		ck_assert_int_eq(ftruncate(fd, 0), 0);
		break;
	}
	close(fd);
}

#define N_DAMAGE 8

START_TEST(disk_damaged_entries)
{
	setup_dir();
	fz_disk *d = open_cache(0);
	fake f;
	fake_make(&f, 7, 500);
	store(d, &f);
	char path[512];
	entry_file(d, f.key, path, sizeof path);
	damage(path, _i);
	ck_assert_int_eq(verify_bad(d, false), 1);
	ck_assert(exists(path)); /* verify without --fix only reports */
	ck_assert(!hit(d, &f));
	ck_assert_msg(!exists(path), "damage %d: the entry was not removed", _i);
	ck_assert_int_eq(warnings, 1);
	ck_assert_msg(strstr(last_warning, "damaged") != NULL, "%s", last_warning);
	ck_assert(!hit(d, &f)); /* now simply absent, nothing more said */
	ck_assert_int_eq(warnings, 1);
	store(d, &f);           /* recompiled */
	ck_assert(hit(d, &f));
	ck_assert_int_eq(verify_bad(d, false), 0);
	fz_disk_close(d);
	d = open_cache(0);
	fz_disk_stats s;
	fz_disk_stat(d, &s);
	ck_assert_uint_eq(s.removed_bad, 1);
	fz_disk_close(d);
	teardown_dir();
}
END_TEST

START_TEST(disk_verify_fix)
{
	setup_dir();
	fz_disk *d = open_cache(0);
	fake f[4];
	for (int i = 0; i < 4; i++) {
		fake_make(&f[i], i, 300);
		store(d, &f[i]);
	}
	char path[512], junk[600], stale[600];
	entry_file(d, f[0].key, path, sizeof path);
	damage(path, 3);
	/* a stray file, a stale temporary, a fresh temporary (a writer at
	 * work: left alone), a damaged counters file */
	snprintf(junk, sizeof junk, "%s/entries/zz-not-an-entry", fz_disk_path(d));
	FILE *j = fopen(junk, "w");
	fputs("junk", j);
	fclose(j);
	entry_file(d, f[1].key, path, sizeof path);
	snprintf(stale, sizeof stale, "%.*s/.tmp-1-1-old", (int)(strrchr(path, '/') - path), path);
	j = fopen(stale, "w");
	fclose(j);
	struct timespec old[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
	utimensat(AT_FDCWD, stale, old, 0);
	char fresh[600];
	snprintf(fresh, sizeof fresh, "%.*s/.tmp-1-2-new", (int)(strrchr(path, '/') - path), path);
	j = fopen(fresh, "w");
	fclose(j);
	fz_disk_close(d); /* writes the counters */
	char stats[600];
	d = open_cache(0);
	snprintf(stats, sizeof stats, "%s/stats", fz_disk_path(d));
	ck_assert(exists(stats));
	j = fopen(stats, "r+");
	fputs("XX", j);
	fclose(j);
	fz_disk_stats s;
	ck_assert_int_eq(fz_disk_stat(d, &s), FZ_OK); /* damaged counters read 0 */
	ck_assert_uint_eq(s.stores, 0);
	ck_assert_int_eq(verify_bad(d, false), 4);
	ck_assert_int_eq(verify_bad(d, true), 4);
	ck_assert_int_eq(verify_bad(d, false), 0);
	ck_assert(!exists(junk) && !exists(stale) && exists(fresh));
	ck_assert(!hit(d, &f[0]) && hit(d, &f[1]) && hit(d, &f[2]) && hit(d, &f[3]));
	fz_disk_close(d);
	d = open_cache(0);
	ck_assert_int_eq(verify_bad(d, false), 0);
	fz_disk_close(d);
	teardown_dir();
}
END_TEST

START_TEST(disk_refuses_unsafe_files)
{
	setup_dir();
	fz_disk *d = open_cache(0);
	fake f, g;
	fake_make(&f, 1, 100);
	fake_make(&g, 2, 100);
	store(d, &f);
	store(d, &g);
	char path[512];
	entry_file(d, f.key, path, sizeof path);
	/* writable by others: refused, reported, left in place */
	ck_assert_int_eq(chmod(path, 0666), 0);
	ck_assert(!hit(d, &f));
	ck_assert(exists(path));
	ck_assert_int_eq(warnings, 1);
	ck_assert_msg(strstr(last_warning, "writable by others"), "%s", last_warning);
	ck_assert_int_eq(verify_bad(d, false), 1);
	chmod(path, 0620);
	ck_assert(!hit(d, &f));
	ck_assert_int_eq(warnings, 1); /* once per entry */
	store(d, &f); /* a good entry renamed over it */
	ck_assert(hit(d, &f));
	/* a symbolic link in an entry's place is refused */
	char gpath[512];
	entry_file(d, g.key, gpath, sizeof gpath);
	unlink(gpath);
	ck_assert_int_eq(symlink(path, gpath), 0);
	ck_assert(!hit(d, &g));
	ck_assert_int_eq(warnings, 2);
	unlink(gpath);
	/* not owned by us: needs root to make */
	if (geteuid() == 0) {
		fake o;
		fake_make(&o, 3, 100);
		store(d, &o);
		entry_file(d, o.key, path, sizeof path);
		ck_assert_int_eq(chown(path, 12345, 12345), 0);
		ck_assert(!hit(d, &o));
		ck_assert(exists(path));
		ck_assert_int_eq(warnings, 3);
		ck_assert_msg(strstr(last_warning, "not owned by you"), "%s", last_warning);
		ck_assert_int_eq(verify_bad(d, false), 1);
		ck_assert_int_eq(chown(path, 0, 0), 0);
		ck_assert(hit(d, &o));
	} else {
		fprintf(stderr, "test_cache: not root; the foreign-owner case is skipped\n");
	}
	fz_disk_close(d);

	/* a cache directory writable by others is not used at all */
	char dir[300];
	snprintf(dir, sizeof dir, "%s/c", tmpdir);
	ck_assert_int_eq(chmod(dir, 0777), 0);
	warnings = 0;
	d = open_cache(0);
	ck_assert_ptr_nonnull(fz_disk_disabled(d));
	ck_assert(!fz_disk_writable(d));
	ck_assert_int_eq(warnings, 1);
	ck_assert(!hit(d, &f));
	store(d, &g); /* a no-op */
	ck_assert_int_eq(verify_bad(d, false), 1);
	fz_disk_close(d);
	if (geteuid() == 0) {
		chmod(dir, 0700);
		ck_assert_int_eq(chown(dir, 12345, 12345), 0);
		d = open_cache(0);
		ck_assert_ptr_nonnull(fz_disk_disabled(d));
		ck_assert(strstr(fz_disk_disabled(d), "not owned by you"));
		fz_disk_close(d);
		ck_assert_int_eq(chown(dir, 0, 0), 0);
	}
	teardown_dir();
}
END_TEST

/* Eight processes store one model (the same 40 entries) into one empty
 * cache at once, then each finds every entry. */
START_TEST(disk_concurrent_processes)
{
	setup_dir();
	enum { PROCS = 8, ENTRIES = 40 };
	pid_t pids[PROCS];
	for (int p = 0; p < PROCS; p++) {
		pids[p] = fork();
		ck_assert_int_ge(pids[p], 0);
		if (pids[p] == 0) {
			char dir[300];
			snprintf(dir, sizeof dir, "%s/c", tmpdir);
			fz_disk_options o = {dir, 0, NULL, NULL};
			fz_disk *d;
			if (fz_disk_open(&o, &d, NULL) != FZ_OK || fz_disk_disabled(d))
				_exit(2);
			int bad = 0;
			for (int round = 0; round < 3; round++)
				for (int i = 0; i < ENTRIES; i++) {
					fake f;
					fake_make(&f, (i + p * 5) % ENTRIES, 1500);
					fz_entry *e = NULL;
					fz_disk_lookup(d, f.key, f.canon, strlen(f.canon), &e);
					if (!e && fz_disk_store(d, f.key, f.canon, strlen(f.canon),
								f.sec, 2) != FZ_OK)
						bad++;
					fz_entry_free(e);
				}
			for (int i = 0; i < ENTRIES; i++) {
				fake f;
				fake_make(&f, i, 1500);
				fz_entry *e = NULL;
				fz_disk_lookup(d, f.key, f.canon, strlen(f.canon), &e);
				bad += e == NULL;
				fz_entry_free(e);
			}
			bool writable = fz_disk_writable(d);
			fz_disk_close(d);
			_exit(bad || !writable ? 1 : 0);
		}
	}
	for (int p = 0; p < PROCS; p++) {
		int status;
		ck_assert_int_eq(waitpid(pids[p], &status, 0), pids[p]);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			      "process %d failed (%d)", p, status);
	}
	fz_disk *d = open_cache(0);
	ck_assert_int_eq(verify_bad(d, false), 0);
	fz_disk_stats s;
	fz_disk_stat(d, &s);
	ck_assert_int_eq(s.entries, ENTRIES);
	ck_assert_uint_eq(s.hits + s.misses, PROCS * (3 + 1) * ENTRIES);
	ck_assert_uint_ge(s.stores, ENTRIES);
	for (int i = 0; i < ENTRIES; i++) {
		fake f;
		fake_make(&f, i, 1500);
		ck_assert(hit(d, &f));
	}
	fz_disk_close(d);
	teardown_dir();
}
END_TEST

static void set_last_use(fz_disk *d, const fake *f, time_t t)
{
	char path[512];
	entry_file(d, f->key, path, sizeof path);
	struct timespec ts[2] = {{t, 0}, {t, 0}};
	ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
}

START_TEST(disk_prune_lru)
{
	setup_dir();
	fz_disk *d = open_cache(0);
	fake f[10];
	time_t now = time(NULL);
	for (int i = 0; i < 10; i++) {
		fake_make(&f[i], i, 2000);
		store(d, &f[i]);
		set_last_use(d, &f[i], now - 1000 + i * 10);
	}
	/* a hit makes the oldest the newest */
	ck_assert(hit(d, &f[0]));
	fz_disk_info *info;
	int n;
	ck_assert_int_eq(fz_disk_list(d, &info, &n), FZ_OK);
	ck_assert_int_eq(n, 10);
	ck_assert(fz_key_eq(info[0].key, f[0].key));
	ck_assert(fz_key_eq(info[1].key, f[9].key));
	ck_assert(fz_key_eq(info[9].key, f[1].key));
	int64_t one = info[0].size;
	free(info);
	int removed;
	int64_t freed;
	ck_assert_int_eq(fz_disk_prune(d, 6 * one + one / 2, &removed, &freed, NULL),
			 FZ_OK);
	ck_assert_int_eq(removed, 4);
	ck_assert_int_eq(freed, 4 * one);
	for (int i = 1; i <= 4; i++)
		ck_assert_msg(!hit(d, &f[i]), "entry %d survived", i);
	ck_assert(hit(d, &f[0]));
	for (int i = 5; i < 10; i++)
		ck_assert(hit(d, &f[i]));
	fz_disk_stats s;
	fz_disk_stat(d, &s);
	ck_assert_int_le(s.bytes, 6 * one + one / 2);
	ck_assert_uint_eq(s.evictions, 4);
	ck_assert_int_eq(fz_disk_prune(d, 0, &removed, &freed, NULL), FZ_OK);
	ck_assert_int_eq(removed, 6);
	fz_disk_close(d);
	teardown_dir();
}
END_TEST

START_TEST(disk_cap_on_store)
{
	setup_dir();
	fake f[12];
	fake_make(&f[0], 0, 2000);
	fz_disk *d = open_cache(0);
	store(d, &f[0]);
	fz_disk_info *info;
	int n;
	fz_disk_list(d, &info, &n);
	int64_t one = info[0].size;
	free(info);
	fz_disk_close(d);
	/* a second process with a cap of five entries */
	d = open_cache(5 * one);
	time_t now = time(NULL);
	set_last_use(d, &f[0], now - 5000);
	for (int i = 1; i < 12; i++) {
		fake_make(&f[i], i, 2000);
		store(d, &f[i]);
		set_last_use(d, &f[i], now - 1000 + i);
	}
	fz_disk_stats s;
	fz_disk_stat(d, &s);
	ck_assert_int_le(s.bytes, 5 * one);
	ck_assert_int_ge(s.entries, 4);
	ck_assert(hit(d, &f[11]));
	ck_assert(!hit(d, &f[0]));
	ck_assert(!hit(d, &f[1]));
	fz_disk_close(d);
	teardown_dir();
}
END_TEST

START_TEST(disk_unwritable_degrades)
{
	setup_dir();
	/* a directory that cannot be created: disabled, said once */
	fz_disk_options o = {"/proc/fusec-no-such-cache", 0, on_warn, NULL};
	fz_disk *d;
	ck_assert_int_eq(fz_disk_open(&o, &d, NULL), FZ_OK);
	ck_assert_ptr_nonnull(fz_disk_disabled(d));
	ck_assert_int_eq(warnings, 1);
	fake f;
	fake_make(&f, 1, 100);
	ck_assert(!hit(d, &f));
	store(d, &f);
	ck_assert_int_eq(warnings, 1);
	fz_disk_close(d);

	/* writes that fail (a file size limit stands in for a full disk,
	 * which root's permission bypass would not let chmod fake): storing
	 * stops with one warning, lookups go on */
	warnings = 0;
	d = open_cache(0);
	store(d, &f);
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGXFSZ, SIG_IGN);
		struct rlimit rl = {64, 64};
		setrlimit(RLIMIT_FSIZE, &rl);
		fake g, h;
		fake_make(&g, 2, 1000);
		fake_make(&h, 3, 1000);
		int bad = 0;
		bad |= fz_disk_store(d, g.key, g.canon, strlen(g.canon), g.sec, 2) != FZ_OK;
		bad |= fz_disk_writable(d) ? 2 : 0;
		bad |= warnings != 1 ? 4 : 0;
		bad |= fz_disk_store(d, h.key, h.canon, strlen(h.canon), h.sec, 2) != FZ_OK ? 8 : 0;
		bad |= warnings != 1 ? 16 : 0;
		fz_entry *e = NULL;
		fz_disk_lookup(d, f.key, f.canon, strlen(f.canon), &e);
		bad |= e ? 0 : 32;
		fz_entry_free(e);
		fz_disk_lookup(d, g.key, g.canon, strlen(g.canon), &e);
		bad |= e ? 64 : 0;
		_exit(bad);
	}
	int status;
	waitpid(pid, &status, 0);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: %d",
		      WEXITSTATUS(status));
	/* nothing half-written is left behind */
	ck_assert_int_eq(verify_bad(d, false), 0);
	fz_disk_close(d);
	teardown_dir();
}
END_TEST

/* A directory squatting on one entry's name fails that entry alone: the
 * others are stored, storing stays on, and the failure is counted with
 * its reason (what `fusec compile` reports). */
START_TEST(disk_squatted_entry)
{
	setup_dir();
	fz_disk *d = open_cache(0);
	fake f, g, h;
	fake_make(&f, 1, 100);
	fake_make(&g, 2, 100);
	fake_make(&h, 3, 100);
	store(d, &f);
	char path[600], dir[600];
	entry_file(d, g.key, path, sizeof path);
	snprintf(dir, sizeof dir, "%s", path);
	*strrchr(dir, '/') = '\0';
	mkdir(dir, 0700);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	ck_assert_uint_eq(fz_disk_not_stored(d, NULL), 0);
	store(d, &g);
	ck_assert(fz_disk_writable(d));
	store(d, &h);
	ck_assert(hit(d, &f));
	ck_assert(!hit(d, &g));
	ck_assert(hit(d, &h));
	const char *why = NULL;
	ck_assert_uint_eq(fz_disk_not_stored(d, &why), 1);
	ck_assert_msg(why && strstr(why, path) && strstr(why, "directory"), "%s", why);
	fz_disk_close(d);
	teardown_dir();
}
END_TEST

/* A FIFO where the stats file or the lock belongs costs the counts, never
 * a hang: reading stats, flushing them at close, verify. */
START_TEST(disk_fifo_stats)
{
	setup_dir();
	fz_disk *d = open_cache(0);
	fake f;
	fake_make(&f, 1, 100);
	store(d, &f);
	fz_disk_close(d); /* writes stats and lock */
	char p[600];
	d = open_cache(0);
	const char *names[] = {"stats", "lock"};
	for (int i = 0; i < 2; i++) {
		snprintf(p, sizeof p, "%s/%s", fz_disk_path(d), names[i]);
		unlink(p);
		ck_assert_int_eq(mkfifo(p, 0600), 0);
	}
	alarm(30); /* a hang fails the test instead of the suite's timeout */
	fz_disk_stats s;
	ck_assert_int_eq(fz_disk_stat(d, &s), FZ_OK);
	ck_assert_int_eq(s.entries, 1);
	ck_assert(hit(d, &f));
	ck_assert_int_eq(verify_bad(d, false), 2); /* both reported */
	fz_disk_close(d); /* a flush that must not wait on the FIFOs */
	alarm(0);
	teardown_dir();
}
END_TEST

START_TEST(disk_env_dir)
{
	setup_dir();
	char dir[300], saved_home[256] = "";
	const char *h = getenv("HOME");
	if (h)
		snprintf(saved_home, sizeof saved_home, "%s", h);
	char *p;
	snprintf(dir, sizeof dir, "%s/envcache", tmpdir);
	setenv("FUSEC_CACHE_DIR", dir, 1);
	ck_assert_int_eq(fz_cache_dir(NULL, &p, NULL), FZ_OK);
	ck_assert_str_eq(p, dir);
	free(p);
	unsetenv("FUSEC_CACHE_DIR");
	setenv("XDG_CACHE_HOME", tmpdir, 1);
	ck_assert_int_eq(fz_cache_dir(NULL, &p, NULL), FZ_OK);
	snprintf(dir, sizeof dir, "%s/fusec", tmpdir);
	ck_assert_str_eq(p, dir);
	free(p);
	setenv("XDG_CACHE_HOME", "relative", 1); /* not absolute: ignored */
	setenv("HOME", "/home/someone", 1);
	ck_assert_int_eq(fz_cache_dir(NULL, &p, NULL), FZ_OK);
	ck_assert_str_eq(p, "/home/someone/.cache/fusec");
	free(p);
	ck_assert_int_eq(fz_cache_dir("/explicit", &p, NULL), FZ_OK);
	ck_assert_str_eq(p, "/explicit");
	free(p);
	unsetenv("XDG_CACHE_HOME");
	if (saved_home[0])
		setenv("HOME", saved_home, 1);
	/* the size cap from the environment */
	setenv("FUSEC_CACHE_MAX_SIZE", "3M", 1);
	fz_disk *d = open_cache(0);
	fz_disk_stats s;
	fz_disk_stat(d, &s);
	ck_assert_int_eq(s.max_bytes, 3 << 20);
	fz_disk_close(d);
	setenv("FUSEC_CACHE_MAX_SIZE", "lots", 1);
	d = open_cache(0);
	fz_disk_stat(d, &s);
	ck_assert_int_eq(s.max_bytes, FZ_DISK_DEFAULT_MAX);
	ck_assert_int_eq(warnings, 1);
	fz_disk_close(d);
	unsetenv("FUSEC_CACHE_MAX_SIZE");
	teardown_dir();
}
END_TEST

START_TEST(jitlink_optional)
{
	void *cubin;
	size_t n;
	char *err = NULL;
	if (!fz_jitlink_available()) {
		ck_assert_int_eq(fz_jitlink_cubin("x", 1, 90, &cubin, &n, &err),
				 FZ_EUNSUPPORTED);
		fz_free(err);
		return;
	}
	static const char ptx[] =
		".version 8.0\n.target sm_90\n.address_size 64\n"
		".visible .entry k(.param .u64 p)\n{\n"
		"  .reg .b64 %rd<2>;\n  ld.param.u64 %rd1, [p];\n  ret;\n}\n";
	ck_assert_int_eq(fz_jitlink_cubin(ptx, sizeof ptx - 1, 90, &cubin, &n, &err),
			 FZ_OK);
	ck_assert_uint_gt(n, 16);
	ck_assert(memcmp(cubin, "\177ELF", 4) == 0);
	free(cubin);
	ck_assert_int_eq(fz_jitlink_cubin("not ptx", 7, 90, &cubin, &n, &err),
			 FZ_ERUNTIME);
	ck_assert_ptr_nonnull(err);
	ck_assert_ptr_null(cubin);
	fz_free(err);
}
END_TEST

/* ---- host objects and the runner ---- */

START_TEST(host_object_entry)
{
	setup_dir();
	fz_disk *d = open_cache(0);
	fz_module *m = parse("trace p(x: f32[N, 4], y: f32[4]) {\n"
			     "  z = add(mul(x, y), exp(y))\n  return z\n}\n");
	const fz_trace *t = fz_module_trace(m, 0);
	whole w;
	whole_region(t, &w);
	fz_cg_options o;
	ck_assert_int_eq(fz_cg_options_parse("host", &o, NULL), FZ_OK);
	fz_compiler *c1, *c2;
	ck_assert_int_eq(fz_compiler_new(&o, &c1, NULL), FZ_OK);
	ck_assert_int_eq(fz_compiler_new(&o, &c2, NULL), FZ_OK);
	char target[160];
	fz_cache_target(&o, target, sizeof target);
	uint8_t spec[64];
	fz_key_params kp;
	fz_key_params_init(&kp, target, FZ_CODEGEN_VERSION);
	kp.spec = spec;
	kp.n_spec = fz_cache_spec(&o, &w.r, spec, sizeof spec);
	fz_canon *cn;
	ck_assert_int_eq(fz_canon_region(t, &w.r, &kp, &cn, NULL), FZ_OK);
	fz_build_info info = {.want_code = true};
	char *err = NULL;
	ck_assert_msg(fz_cache_build(c1, d, t, &w.r, cn, false, &info, &err) == FZ_OK,
		      "build: %s", err ? err : "?");
	ck_assert_ptr_nonnull(info.object);
	ck_assert(memcmp(info.object, "\177ELF", 4) == 0);
	free(info.object);

	fz_entry *e;
	ck_assert_int_eq(fz_disk_lookup(d, cn->key, cn->text, cn->len, &e), FZ_OK);
	ck_assert_ptr_nonnull(e);
	ck_assert(fz_cache_usable(e, &o));
	ck_assert_ptr_null(fz_entry_section(e, "llvm"));
	fz_cg_options gpu;
	ck_assert_int_eq(fz_cg_options_parse("sm_90", &gpu, NULL), FZ_OK);
	ck_assert(!fz_cache_usable(e, &gpu));

	/* linked into another compiler: computes the region, buffers in the
	 * canonical order */
	fz_host_fn fn = NULL, again = NULL;
	ck_assert_msg(fz_cache_load_host(c2, e, w.r.n_in, w.r.n_out, &fn, &err) == FZ_OK,
		      "load: %s", err ? err : "?");
	float x[8], y[4], z[8];
	for (int i = 0; i < 8; i++)
		x[i] = (float)i * 0.25f - 1.0f;
	for (int i = 0; i < 4; i++)
		y[i] = (float)i * 0.5f;
	void *bufs[3];
	for (int i = 0; i < cn->n_in; i++)
		bufs[i] = cn->in[i] == t->params[0] ? (void *)x : (void *)y;
	bufs[2] = z;
	int64_t syms[FZ_MAX_SYMS] = {2};
	int32_t bad = 0;
	fn(bufs, syms, &bad, 0, 1);
	ck_assert_int_eq(bad, 0);
	for (int i = 0; i < 8; i++)
		ck_assert_float_eq_tol(z[i], x[i] * y[i % 4] + expf(y[i % 4]), 1e-5);
	/* the same name again: the code already there */
	ck_assert_int_eq(fz_cache_load_host(c2, e, w.r.n_in, w.r.n_out, &again, NULL),
			 FZ_OK);
	ck_assert_ptr_eq((void *)again, (void *)fn);
	/* metadata that does not fit the region, and bytes that are no object */
	ck_assert_int_eq(fz_cache_load_host(c2, e, w.r.n_in + 1, w.r.n_out, &again, &err),
			 FZ_EINVAL);
	ck_assert_ptr_null((void *)again);
	fz_free(err);
	err = NULL;
	ck_assert_int_ne(fz_host_load(c2, "not an object", 13, "fz_x", &again, &err),
			 FZ_OK);
	fz_free(err);
	fz_entry_free(e);

	/* an older host entry (optimized IR text) is not usable */
	fz_section old[2];
	memset(old, 0, sizeof old);
	strcpy(old[0].tag, "llvm");
	old[0].data = "; ModuleID\n";
	old[0].len = 11;
	strcpy(old[1].tag, "meta");
	old[1].data = "fusec-kernel 1\n";
	old[1].len = 15;
	ck_assert_int_eq(fz_disk_store(d, cn->key, cn->text, cn->len, old, 2), FZ_OK);
	ck_assert_int_eq(fz_disk_lookup(d, cn->key, cn->text, cn->len, &e), FZ_OK);
	ck_assert_ptr_nonnull(e);
	ck_assert(!fz_cache_usable(e, &o));
	fz_entry_free(e);

	fz_canon_free(cn);
	fz_compiler_free(c1);
	fz_compiler_free(c2);
	fz_module_free(m);
	fz_disk_close(d);
	teardown_dir();
}
END_TEST

/* Two layers with one normalization between library calls. */
static const char *layers_src =
	"trace t(x: f32[N, 16], w1: f32[16], w2: f32[16], m: f32[16, 16]) {\n"
	"  h1 = rms_norm(x, w1, dims=[1], eps=1e-5)\n"
	"  y1 = linear(h1, m)\n"
	"  h2 = rms_norm(y1, w2, dims=[1], eps=1e-5)\n"
	"  y2 = linear(h2, m)\n"
	"  return y2\n"
	"}\n";

/* Runs layers_src at N = n through x; the output's data (fz_free it). */
static float *run_layers(fz_exec *x, const fz_trace *t, int64_t n)
{
	static float data[4][16 * 16];
	fz_tensor in[4];
	memset(in, 0, sizeof in);
	int64_t shapes[4][2] = {{n, 16}, {16, 0}, {16, 0}, {16, 16}};
	for (int i = 0; i < 4; i++) {
		in[i].data = data[i];
		in[i].dtype = FZ_F32;
		in[i].rank = i == 1 || i == 2 ? 1 : 2;
		in[i].shape[0] = shapes[i][0];
		in[i].shape[1] = shapes[i][1];
		in[i].strides[0] = in[i].rank == 2 ? 16 : 1;
		in[i].strides[1] = 1;
		for (int k = 0; k < 16 * 16; k++)
			data[i][k] = (float)((k * 7 + i * 3) % 11) * 0.1f - 0.5f;
	}
	fz_tensor out = {aligned_alloc(64, 64 * 16), FZ_F32, 2, {n, 16}, {16, 1}};
	char *err = NULL;
	fz_status st = fz_exec_run(x, NULL, in, 4, &out, 1, NULL, &err);
	ck_assert_msg(st == FZ_OK, "run: %s", err ? err : "?");
	return out.data;
}

static fz_exec *layers_exec(const fz_trace *t, bool disk)
{
	char dir[300];
	snprintf(dir, sizeof dir, "%s/c", tmpdir);
	fz_exec *x;
	fz_exec_options o;
	fz_exec_options_init(&o);
	o.disk_cache = disk;
	o.cache_dir = dir;
	o.warn = on_warn;
	ck_assert_int_eq(fz_exec_new(t, "cpu", &o, &x, NULL), FZ_OK);
	return x;
}

START_TEST(exec_cache)
{
	setup_dir();
	fz_module *m = parse(layers_src);
	const fz_trace *t = fz_module_trace(m, 0);

	fz_exec *x = layers_exec(t, true);
	float *cold = run_layers(x, t, 4);
	const fz_exec_stats *s = fz_exec_stats_of(x);
	ck_assert_int_eq(s->k.unique, 1);       /* two layers, one key */
	ck_assert_int_eq(s->k.compiled, 1);
	ck_assert_int_eq(s->k.cache_hits, 0);
	ck_assert_int_eq(s->k.mem_hits, 0);
	/* a second program while the first lives: the device's store */
	fz_exec *x2 = layers_exec(t, true);
	fz_free(run_layers(x2, t, 4));
	s = fz_exec_stats_of(x2);
	ck_assert_int_eq(s->k.compiled, 0);
	ck_assert_int_eq(s->k.cache_hits, 0);
	ck_assert_int_eq(s->k.mem_hits, 1);
	fz_exec_free(x2);
	fz_exec_free(x);

	x = layers_exec(t, true);            /* a warm start: the device is gone */
	float *warm = run_layers(x, t, 4);
	s = fz_exec_stats_of(x);
	ck_assert_int_eq(s->k.compiled, 0);
	ck_assert_int_eq(s->k.cache_hits, 1);
	ck_assert(memcmp(cold, warm, sizeof(float) * 4 * 16) == 0);
	fz_free(warm);
	/* other sizes: planned again, the same key, already resolved */
	fz_free(run_layers(x, t, 3));
	s = fz_exec_stats_of(x);
	ck_assert_int_eq(s->k.compiled, 0);
	ck_assert_int_eq(s->k.cache_hits, 1);
	ck_assert_int_eq(s->k.unique, 1);
	ck_assert_int_eq(s->plans, 2);
	fz_exec_free(x);

	x = layers_exec(t, false);           /* no disk cache */
	warm = run_layers(x, t, 4);
	ck_assert_int_eq(fz_exec_stats_of(x)->k.compiled, 1);
	ck_assert(memcmp(cold, warm, sizeof(float) * 4 * 16) == 0);
	fz_exec_free(x);
	fz_free(warm);
	fz_free(cold);
	ck_assert_int_eq(warnings, 0);
	fz_module_free(m);
	teardown_dir();
}
END_TEST

/* ---- programs in the cache (plan_cache.c) ---- */

static const char *const plan_traces[] = {
	"llama_tiny_2layer.trace", "torch_gpt2_ckpt.trace", "rotary.trace",
	"seed004_chain_efficient.trace",
	"torch_nanogpt_ckpt.trace", /* 4 dead permutes: in no region (ir/dce.c) */
};

static fz_module *load_corpus(const char *name)
{
	char path[512];
	snprintf(path, sizeof path, "%s/tests/traces/%s", FZ_SOURCE_DIR, name);
	fz_module *m = NULL;
	char *diag = NULL;
	ck_assert_msg(fz_module_parse_file(path, &m, &diag) == FZ_OK, "%s: %s",
		      path, diag ? diag : "?");
	return m;
}

static void ids_eq(fz_value **a, int na, fz_value **b, int nb)
{
	ck_assert_int_eq(na, nb);
	for (int i = 0; i < na; i++)
		ck_assert_int_eq(a[i]->id, b[i]->id);
}

/* Everything a runner or a code generator reads is the same. */
static void programs_eq(const fz_program *a, const fz_program *b)
{
	const fz_trace *t = a->trace;
	int nv = t->n_values;
	ck_assert_int_eq(a->n_regions, b->n_regions);
	for (int r = 0; r < a->n_regions; r++) {
		const fz_region *x = a->regions[r], *y = b->regions[r];
		ck_assert_int_eq(x->id, y->id);
		ck_assert_int_eq(x->kind, y->kind);
		ck_assert_int_eq(x->n_nodes, y->n_nodes);
		for (int j = 0; j < x->n_nodes; j++)
			ck_assert_ptr_eq(x->nodes[j], y->nodes[j]);
		ids_eq(x->in, x->n_in, y->in, y->n_in);
		ids_eq(x->out, x->n_out, y->out, y->n_out);
		ck_assert_int_eq(a->order[r], b->order[r]);
		ck_assert_int_eq(a->trace_order[r], b->trace_order[r]);
		ck_assert_int_eq(a->vec_width[r], b->vec_width[r]);
		ck_assert_int_eq(a->vec_bytes[r], b->vec_bytes[r]);
	}
	for (int i = 0; i < t->n_nodes; i++) {
		ck_assert_int_eq(a->region_of[i], b->region_of[i]);
		ck_assert_int_eq(a->canon_rank[i], b->canon_rank[i]);
	}
	ck_assert_int_eq(a->n_views, b->n_views);
	for (int v = 0; v < nv; v++) {
		ck_assert(!a->view_of[v] == !b->view_of[v]);
		if (a->view_of[v]) {
			ck_assert_ptr_eq(a->view_of[v]->base, b->view_of[v]->base);
			ck_assert_ptr_eq(a->view_of[v]->node, b->view_of[v]->node);
			ck_assert(!memcmp(&a->view_of[v]->lay, &b->view_of[v]->lay,
					  sizeof(fz_layout)));
		}
		ck_assert_int_eq(a->bytes[v], b->bytes[v]);
		ck_assert_int_eq(a->buffer[v], b->buffer[v]);
		ck_assert_int_eq(a->offset[v], b->offset[v]);
		ck_assert_int_eq(a->n_donors[v], b->n_donors[v]);
		for (int d = 0; d < a->n_donors[v]; d++)
			ck_assert_int_eq(a->donors[v][d], b->donors[v][d]);
	}
	ck_assert(!memcmp(a->sym_sizes, b->sym_sizes, sizeof a->sym_sizes));
	ck_assert_uint_eq(a->unbound_syms, b->unbound_syms);
	ck_assert_int_eq(a->peak_bytes, b->peak_bytes);
	ck_assert_int_eq(a->peak_bytes_trace_order, b->peak_bytes_trace_order);
	ck_assert_int_eq(a->arena_bytes, b->arena_bytes);
	ck_assert_int_eq(a->method, b->method);
}

static fz_key plan_key(const fz_trace *t, const fz_plan_options *o)
{
	void *form = NULL;
	size_t len = 0;
	ck_assert_int_eq(fz_plan_form(t, o, &form, &len), FZ_OK);
	fz_key k = fz_key_of(form, len);
	free(form);
	return k;
}

START_TEST(plan_cache_roundtrip)
{
	setup_dir();
	fz_disk *d = open_cache(0);
	fz_module *m = load_corpus(plan_traces[_i]);
	const fz_trace *t = fz_module_trace(m, 0);
	int64_t sizes[FZ_MAX_SYMS];
	for (int s = 0; s < FZ_MAX_SYMS; s++)
		sizes[s] = s < t->n_syms ? 4 + s : -1;
	fz_plan_options o;
	fz_plan_defaults(&o);
	o.sym_sizes = sizes;
	fz_program *p0 = NULL, *p1 = NULL, *p2 = NULL, *p3 = NULL;
	char *err = NULL;
	bool hit = true;
	ck_assert_int_eq(fz_plan(t, &o, &p0, &err), FZ_OK);
	/* a miss plans and stores; then a hit loads the same program */
	ck_assert_int_eq(fz_plan_cached(d, t, &o, &p1, &hit, &err), FZ_OK);
	ck_assert(!hit);
	programs_eq(p0, p1);
	ck_assert_int_eq(fz_plan_cached(d, t, &o, &p2, &hit, &err), FZ_OK);
	ck_assert(hit);
	programs_eq(p0, p2);
	/* other options are another entry */
	fz_plan_options o2 = o;
	o2.horizontal = false;
	ck_assert(!fz_key_eq(plan_key(t, &o), plan_key(t, &o2)));
	ck_assert_int_eq(fz_plan_cached(d, t, &o2, &p3, &hit, &err), FZ_OK);
	ck_assert(!hit);
	fz_program_free(p3);
	p3 = NULL;
	if (t->n_syms) { /* and so are other sizes */
		sizes[0] = 1000;
		ck_assert_int_eq(fz_plan_cached(d, t, &o, &p3, &hit, &err), FZ_OK);
		ck_assert(!hit);
		ck_assert_int_ne(p3->sym_sizes[0], p0->sym_sizes[0]);
		fz_program_free(p3);
		p3 = NULL;
		sizes[0] = 4;
	}
	/* a damaged entry is a miss, removed, planned and stored again */
	char path[600];
	entry_file(d, plan_key(t, &o), path, sizeof path);
	ck_assert(exists(path));
	damage(path, 3);
	ck_assert_int_eq(fz_plan_cached(d, t, &o, &p3, &hit, &err), FZ_OK);
	ck_assert(!hit);
	programs_eq(p0, p3);
	fz_program_free(p3);
	p3 = NULL;
	ck_assert_int_eq(fz_plan_cached(d, t, &o, &p3, &hit, &err), FZ_OK);
	ck_assert(hit);
	/* no cache: plans */
	fz_program_free(p3);
	ck_assert_int_eq(fz_plan_cached(NULL, t, &o, &p3, &hit, &err), FZ_OK);
	ck_assert(!hit);
	programs_eq(p0, p3);
	fz_program_free(p0);
	fz_program_free(p1);
	fz_program_free(p2);
	fz_program_free(p3);
	fz_disk_close(d);
	fz_module_free(m);
	teardown_dir();
}
END_TEST

/* A payload that is not a program of the trace never reads back. */
START_TEST(plan_cache_payload_checked)
{
	fz_module *m = load_corpus("llama_tiny_2layer.trace");
	fz_module *other = load_corpus("rotary.trace");
	const fz_trace *t = fz_module_trace(m, 0);
	fz_program *p = NULL, *q = NULL;
	ck_assert_int_eq(fz_plan(t, NULL, &p, NULL), FZ_OK);
	void *data = NULL;
	size_t len = 0;
	ck_assert_int_eq(fz_plan_serialize(p, &data, &len), FZ_OK);
	ck_assert_int_eq(fz_plan_deserialize(t, NULL, data, len, &q), FZ_OK);
	programs_eq(p, q);
	fz_program_free(q);
	/* every truncation, a byte too many */
	for (size_t cut = 0; cut < len; cut += 1 + cut / 8) {
		ck_assert_int_eq(fz_plan_deserialize(t, NULL, data, cut, &q), FZ_EINVAL);
		ck_assert_ptr_null(q);
	}
	unsigned char *more = malloc(len + 1);
	memcpy(more, data, len);
	more[len] = 0;
	ck_assert_int_eq(fz_plan_deserialize(t, NULL, more, len + 1, &q), FZ_EINVAL);
	/* ids out of range: the region count, then each region's first node */
	int32_t big = 1 << 30;
	size_t at = 2 * sizeof p->sym_sizes + 8;
	memcpy(more, data, len);
	memcpy(more + at, &big, 4);
	ck_assert_int_eq(fz_plan_deserialize(t, NULL, more, len, &q), FZ_EINVAL);
	memcpy(more, data, len);
	memcpy(more + at + 12, &big, 4);
	ck_assert_int_eq(fz_plan_deserialize(t, NULL, more, len, &q), FZ_EINVAL);
	/* another trace's program */
	ck_assert_int_eq(fz_plan_deserialize(fz_module_trace(other, 0), NULL, data,
					     len, &q), FZ_EINVAL);
	free(more);
	free(data);
	fz_program_free(p);
	fz_module_free(m);
	fz_module_free(other);
}
END_TEST

static void canon_same(const fz_canon *a, const fz_canon *b)
{
	ck_assert(fz_key_eq(a->key, b->key));
	ck_assert_uint_eq(a->len, b->len);
	ck_assert(!memcmp(a->text, b->text, a->len));
	ck_assert_int_eq(a->n_nodes, b->n_nodes);
	for (int j = 0; j < a->n_nodes; j++)
		ck_assert_ptr_eq(a->nodes[j], b->nodes[j]);
	ck_assert_int_eq(a->n_in, b->n_in);
	ck_assert_int_eq(a->n_out, b->n_out);
	for (int i = 0; i < a->n_in; i++) {
		ck_assert_ptr_eq(a->in[i], b->in[i]);
		ck_assert_int_eq(a->in_pos[i], b->in_pos[i]);
	}
	for (int i = 0; i < a->n_out; i++) {
		ck_assert_ptr_eq(a->out[i], b->out[i]);
		ck_assert_int_eq(a->out_pos[i], b->out_pos[i]);
	}
	ck_assert_int_eq(a->n_syms, b->n_syms);
	for (int i = 0; i < a->n_syms; i++)
		ck_assert_int_eq(a->syms[i], b->syms[i]);
}

/* The kernel keys of a program from the cache are the forms
 * fz_canon_region makes, region by region; another target is another
 * entry; a damaged entry is computed again. */
START_TEST(program_canons_cached)
{
	setup_dir();
	fz_disk *d = open_cache(0);
	fz_module *m = load_corpus(plan_traces[_i]);
	const fz_trace *t = fz_module_trace(m, 0);
	fz_program *p = NULL;
	char *err = NULL;
	ck_assert_int_eq(fz_plan_cached(d, t, NULL, &p, NULL, &err), FZ_OK);
	for (int round = 0; round < 4; round++) {
		fz_cg_options o;
		ck_assert_int_eq(fz_cg_options_parse(round == 2 ? "sm_80" : "sm_90",
						     &o, &err), FZ_OK);
		fz_canon **cs = NULL;
		bool hit = true;
		if (round == 3) { /* damage the entries: recomputed */
			fz_canon **c0 = NULL;
			ck_assert_int_eq(fz_program_canons(d, p, &o, &c0, &hit, &err),
					 FZ_OK);
			ck_assert(hit);
			fz_program_canons_free(p, c0);
			fz_disk_info *inf = NULL;
			int n = 0;
			ck_assert_int_eq(fz_disk_list(d, &inf, &n), FZ_OK);
			for (int k = 0; k < n; k++) { /* the program's too: p is loaded */
				char path[600];
				entry_file(d, inf[k].key, path, sizeof path);
				damage(path, 3);
			}
			free(inf);
		}
		ck_assert_int_eq(fz_program_canons(d, p, &o, &cs, &hit, &err), FZ_OK);
		ck_assert_msg(hit == (round == 1), "round %d: hit %d", round, hit);
		char tname[160];
		fz_cache_target(&o, tname, sizeof tname);
		int kernels = 0;
		for (int r = 0; r < p->n_regions; r++) {
			const fz_region *R = p->regions[r];
			if (!fz_region_is_kernel(R->kind)) {
				ck_assert_ptr_null(cs[r]);
				continue;
			}
			kernels++;
			uint8_t spec[2 + 256];
			fz_key_params kp;
			fz_key_params_init(&kp, tname, FZ_CODEGEN_VERSION);
			kp.spec = spec;
			kp.n_spec = fz_cache_spec(&o, R, spec, sizeof spec);
			fz_canon *c = NULL;
			ck_assert_int_eq(fz_canon_region(t, R, &kp, &c, &err), FZ_OK);
			ck_assert_ptr_nonnull(cs[r]);
			canon_same(c, cs[r]);
			fz_canon_free(c);
		}
		ck_assert_int_gt(kernels, 0);
		fz_program_canons_free(p, cs);
	}
	/* no cache: computed */
	fz_canon **cs = NULL;
	bool hit = true;
	fz_cg_options o;
	ck_assert_int_eq(fz_cg_options_parse("sm_90", &o, &err), FZ_OK);
	ck_assert_int_eq(fz_program_canons(NULL, p, &o, &cs, &hit, &err), FZ_OK);
	ck_assert(!hit);
	fz_program_canons_free(p, cs);
	/* other regions in place of the program's (here: only the first
	 * kernel region): filed apart from the program's own forms, each
	 * region's form as fz_canon_region makes it, a hit the second time */
	const fz_region **rs = calloc((size_t)p->n_regions + 1, sizeof *rs);
	int first = -1, nk = 0;
	for (int r = 0; r < p->n_regions; r++)
		if (fz_region_is_kernel(p->regions[r]->kind) && nk++ == 0)
			rs[first = r] = p->regions[r];
	ck_assert_int_ge(first, 0);
	for (int round = 0; round < 2; round++) {
		ck_assert_int_eq(fz_program_canons_of(d, p, rs, &o, &cs, &hit, &err), FZ_OK);
		/* (one kernel region: the program's own forms, stored above) */
		ck_assert_msg(hit == (round == 1 || nk == 1), "subset round %d: hit %d",
			      round, hit);
		for (int r = 0; r < p->n_regions; r++)
			if (r != first)
				ck_assert_ptr_null(cs[r]);
		char tname[160];
		fz_cache_target(&o, tname, sizeof tname);
		uint8_t spec[2 + 256];
		fz_key_params kp;
		fz_key_params_init(&kp, tname, FZ_CODEGEN_VERSION);
		kp.spec = spec;
		kp.n_spec = fz_cache_spec(&o, rs[first], spec, sizeof spec);
		fz_canon *c = NULL;
		ck_assert_int_eq(fz_canon_region(t, rs[first], &kp, &c, &err), FZ_OK);
		canon_same(c, cs[first]);
		fz_canon_free(c);
		fz_program_canons_free(p, cs);
	}
	free(rs);
	fz_program_free(p);
	fz_disk_close(d);
	fz_module_free(m);
	teardown_dir();
}
END_TEST

static Suite *cache_suite(void)
{
	Suite *s = suite_create("cache");
	TCase *tc = tcase_create("keys");
	tcase_add_checked_fixture(tc, NULL, release_modules);
	tcase_add_test(tc, key_hex_roundtrip);
	tcase_add_test(tc, key_respec);
	tcase_add_test(tc, key_invariant_rename_reorder);
	tcase_add_test(tc, key_invariant_symbol_names);
	tcase_add_test(tc, key_symmetric_operands);
	tcase_add_loop_test(tc, key_sensitive_to_region, 0,
			    (int)(sizeof edits / sizeof *edits));
	tcase_add_test(tc, key_sensitive_to_params);
	tcase_add_test(tc, key_describe);
	tcase_add_test(tc, key_region_view);
	tcase_add_test(tc, key_invariant_planned);
	tcase_add_test(tc, key_same_at_two_bindings_of_sums);
	suite_add_tcase(s, tc);

	tc = tcase_create("lru");
	tcase_add_test(tc, lru_eviction_order);
	tcase_add_test(tc, lru_colliding_hashes);
	tcase_add_test(tc, lru_cap_one_and_bad_args);
	tcase_add_test(tc, lru_many);
	suite_add_tcase(s, tc);

	tc = tcase_create("disk");
	tcase_add_test(tc, disk_sizes);
	tcase_add_test(tc, disk_store_lookup_layout);
	tcase_add_test(tc, disk_collision_is_a_miss);
	tcase_add_loop_test(tc, disk_damaged_entries, 0, N_DAMAGE);
	tcase_add_test(tc, disk_verify_fix);
	tcase_add_test(tc, disk_refuses_unsafe_files);
	tcase_add_test(tc, disk_concurrent_processes);
	tcase_add_test(tc, disk_prune_lru);
	tcase_add_test(tc, disk_cap_on_store);
	tcase_add_test(tc, disk_unwritable_degrades);
	tcase_add_test(tc, disk_squatted_entry);
	tcase_add_test(tc, disk_fifo_stats);
	tcase_add_test(tc, disk_env_dir);
	tcase_add_test(tc, jitlink_optional);
	tcase_add_test(tc, host_object_entry);
	tcase_add_test(tc, exec_cache);
	tcase_add_loop_test(tc, plan_cache_roundtrip, 0,
			    (int)(sizeof plan_traces / sizeof *plan_traces));
	tcase_add_test(tc, plan_cache_payload_checked);
	tcase_add_loop_test(tc, program_canons_cached, 0,
			    (int)(sizeof plan_traces / sizeof *plan_traces));
	tcase_add_checked_fixture(tc, NULL, release_modules);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(cache_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
