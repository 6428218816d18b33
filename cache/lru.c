/*
 * lru.c: a map bounded by count that forgets the least recently used.
 *
 * The runtime keeps its compiled, loaded kernels here, keyed by the
 * structural key: a lookup is a hash probe and a move to the front of a
 * list, an insert past the cap drops the element at the back. The map owns
 * what it holds through a table of callbacks (hash, eq, free), the way
 * Redis's dict does, so whoever evicts also frees: a kernel module is
 * unloaded exactly when its element leaves, never twice, never leaked.
 *
 *     fz_lru_ops ops = {key_hash, key_eq, kernel_free};
 *     fz_lru_new(256, &ops, ctx, &lru);
 *     k = fz_lru_get(lru, &key);            NULL: load or compile, then
 *     fz_lru_put(lru, key_copy, kernel);    evicts past 256, freeing it
 *
 * Buckets chain through the elements; their number doubles whenever the
 * elements outnumber half of them, so the chains stay short, and a cap far
 * above what is ever held (a map that never evicts, as the kernel store)
 * costs nothing up front. The recency list is doubly
 * linked: most recent at the head.
 */
#include <stdlib.h>

#include "cache.h"

typedef struct lru_elem lru_elem;
struct lru_elem {
	void *key, *value;
	uint64_t hash;
	lru_elem *chain;            /* next in the bucket */
	lru_elem *prev, *next;      /* recency: prev is more recent */
};

struct fz_lru {
	fz_lru_ops ops;
	void *ctx;
	size_t cap, count, evictions;
	size_t n_buckets;           /* a power of two */
	lru_elem **buckets;
	lru_elem *head, *tail;
};

fz_status fz_lru_new(size_t cap, const fz_lru_ops *ops, void *ctx,
		     fz_lru **out)
{
	*out = NULL;
	if (cap == 0 || !ops || !ops->hash || !ops->eq || cap > ((size_t)1 << 40))
		return FZ_EINVAL;
	fz_lru *l = calloc(1, sizeof *l);
	if (!l)
		goto fail;
	l->ops = *ops;
	l->ctx = ctx;
	l->cap = cap;
	l->n_buckets = 16;
	l->buckets = calloc(l->n_buckets, sizeof *l->buckets);
	if (!l->buckets)
		goto fail;
	*out = l;
	return FZ_OK;
fail:
	fz_lru_free(l);
	return FZ_ENOMEM;
}

static void elem_release(fz_lru *l, lru_elem *e)
{
	if (l->ops.free)
		l->ops.free(e->key, e->value, l->ctx);
	free(e);
}

void fz_lru_free(fz_lru *l)
{
	if (!l)
		return;
	for (lru_elem *e = l->head, *next; e; e = next) {
		next = e->next;
		elem_release(l, e);
	}
	free(l->buckets);
	free(l);
}

static lru_elem **find(fz_lru *l, const void *key, uint64_t h)
{
	lru_elem **pp = &l->buckets[h & (l->n_buckets - 1)];
	while (*pp && !((*pp)->hash == h && l->ops.eq((*pp)->key, key)))
		pp = &(*pp)->chain;
	return pp;
}

static void list_unlink(fz_lru *l, lru_elem *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		l->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		l->tail = e->prev;
	e->prev = e->next = NULL;
}

static void list_push_front(fz_lru *l, lru_elem *e)
{
	e->prev = NULL;
	e->next = l->head;
	if (l->head)
		l->head->prev = e;
	l->head = e;
	if (!l->tail)
		l->tail = e;
}

/* Takes e out of its bucket and the list, and frees it. */
static void drop(fz_lru *l, lru_elem *e)
{
	lru_elem **pp = find(l, e->key, e->hash);
	FZ_ASSERT(*pp == e);
	*pp = e->chain;
	list_unlink(l, e);
	l->count--;
	elem_release(l, e);
}

void *fz_lru_get(fz_lru *l, const void *key)
{
	lru_elem *e = *find(l, key, l->ops.hash(key));
	if (!e)
		return NULL;
	if (l->head != e) {
		list_unlink(l, e);
		list_push_front(l, e);
	}
	return e->value;
}

/* Twice the buckets, each element rechained; false when out of memory
 * (the table keeps working with longer chains). */
static bool grow(fz_lru *l)
{
	size_t n = l->n_buckets * 2;
	lru_elem **b = calloc(n, sizeof *b);
	if (!b)
		return false;
	for (lru_elem *e = l->head; e; e = e->next) {
		lru_elem **slot = &b[e->hash & (n - 1)];
		e->chain = *slot;
		*slot = e;
	}
	free(l->buckets);
	l->buckets = b;
	l->n_buckets = n;
	return true;
}

fz_status fz_lru_put(fz_lru *l, void *key, void *value)
{
	uint64_t h = l->ops.hash(key);
	lru_elem *e = malloc(sizeof *e);
	if (!e) {
		if (l->ops.free)
			l->ops.free(key, value, l->ctx);
		return FZ_ENOMEM;
	}
	lru_elem *old = *find(l, key, h);
	if (old)
		drop(l, old);
	*e = (lru_elem){key, value, h, NULL, NULL, NULL};
	lru_elem **slot = &l->buckets[h & (l->n_buckets - 1)];
	e->chain = *slot;
	*slot = e;
	list_push_front(l, e);
	l->count++;
	if (l->count > l->n_buckets / 2)
		grow(l);
	while (l->count > l->cap) {
		drop(l, l->tail);
		l->evictions++;
	}
	return FZ_OK;
}

bool fz_lru_remove(fz_lru *l, const void *key)
{
	lru_elem *e = *find(l, key, l->ops.hash(key));
	if (!e)
		return false;
	drop(l, e);
	return true;
}

size_t fz_lru_count(const fz_lru *l) { return l->count; }

size_t fz_lru_evictions(const fz_lru *l) { return l->evictions; }

void fz_lru_each(const fz_lru *l,
		 void (*fn)(const void *key, void *value, void *arg), void *arg)
{
	for (const lru_elem *e = l->head; e; e = e->next)
		fn(e->key, e->value, arg);
}
