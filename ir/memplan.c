/*
 * memplan.c: an offset in one arena for every buffer the program allocates.
 *
 * The schedule fixed the order; this pass replays it with the same rule as
 * fz_order_peak: before a region runs, each output that owns storage gets a
 * block, unless it takes over an input that dies there (a pointwise region
 * reading it only elementwise, same bytes); after it runs, each buffer it
 * read for the last time goes back to the free list, unless it is a program
 * output, which is never freed. Parameters live outside the arena; a view
 * has the offset of its base.
 *
 * Blocks are 256-byte aligned (what cuBLAS and 16-byte vector accesses
 * want). A request takes the smallest free block that fits (best fit), else
 * grows the arena at its end; freed blocks merge with their neighbours.
 * The free list is a plain array sorted by offset, scanned linearly: the
 * number of live buffers at once is small.
 *
 *     seed-004, planned order:  p0 @0  m0 @262144  r0 in place of m0
 *                               acc0 @0  p1 @524288 ...   arena 786432
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define ALIGN 256

typedef struct block {
	int64_t off, size;
} block;

typedef struct heap_arena {
	block *free;
	int n, cap;
	int64_t top;
} heap_arena;

static int64_t round_up(int64_t x)
{
	return (x + ALIGN - 1) / ALIGN * ALIGN;
}

static int64_t take(heap_arena *h, int64_t size, int64_t *work)
{
	int best = -1;
	*work += 1 + h->n;
	for (int i = 0; i < h->n; i++)
		if (h->free[i].size >= size &&
		    (best < 0 || h->free[i].size < h->free[best].size))
			best = i;
	if (best >= 0) {
		int64_t off = h->free[best].off;
		h->free[best].off += size;
		h->free[best].size -= size;
		if (h->free[best].size == 0) {
			memmove(&h->free[best], &h->free[best + 1],
				sizeof(block) * (size_t)(h->n - best - 1));
			h->n--;
		}
		return off;
	}
	/* grow at the end, starting inside a free block that touches it */
	if (h->n && h->free[h->n - 1].off + h->free[h->n - 1].size == h->top) {
		int64_t off = h->free[h->n - 1].off;
		h->n--;
		h->top = off + size;
		return off;
	}
	int64_t off = h->top;
	h->top += size;
	return off;
}

static bool give(heap_arena *h, int64_t off, int64_t size, int64_t *work)
{
	if (size == 0)
		return true;
	*work += 1 + h->n;
	if (h->n == h->cap) {
		int nc = h->cap ? h->cap * 2 : 16;
		block *b = realloc(h->free, sizeof(block) * (size_t)nc);
		if (!b)
			return false;
		h->free = b;
		h->cap = nc;
	}
	int i = 0;
	while (i < h->n && h->free[i].off < off)
		i++;
	memmove(&h->free[i + 1], &h->free[i], sizeof(block) * (size_t)(h->n - i));
	h->free[i] = (block){off, size};
	h->n++;
	if (i + 1 < h->n && h->free[i].off + h->free[i].size == h->free[i + 1].off) {
		h->free[i].size += h->free[i + 1].size;
		memmove(&h->free[i + 1], &h->free[i + 2],
			sizeof(block) * (size_t)(h->n - i - 2));
		h->n--;
	}
	if (i > 0 && h->free[i - 1].off + h->free[i - 1].size == h->free[i].off) {
		h->free[i - 1].size += h->free[i].size;
		memmove(&h->free[i], &h->free[i + 1],
			sizeof(block) * (size_t)(h->n - i - 1));
		h->n--;
	}
	return true;
}

fz_status fz_memplan(fz_program *p)
{
	const fz_trace *t = p->trace;
	int nv = t->n_values;
	p->buffer = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)nv + 1));
	p->offset = fz_arena_alloc(&p->arena, sizeof(int64_t) * ((size_t)nv + 1));
	int *readers = calloc((size_t)nv + 1, sizeof(int));
	int *seen = calloc((size_t)nv + 1, sizeof(int));
	bool *pinned = calloc((size_t)nv + 1, sizeof(bool));
	bool *donated = calloc((size_t)nv + 1, sizeof(bool));
	heap_arena h = {0};
	fz_status st = FZ_ENOMEM;
	if (!p->buffer || !p->offset || !readers || !seen || !pinned || !donated)
		goto done;
	for (int v = 0; v < nv; v++) {
		p->buffer[v] = v;
		p->offset[v] = -1;
	}
	fz_program_count_readers(p, readers, seen, pinned);
	memset(seen, 0, sizeof(int) * (size_t)nv);
	for (int s = 0; s < p->n_regions; s++) {
		const fz_region *R = p->regions[p->order[s]];
		int stamp = s + 1;
		p->work += 1 + 2 * R->n_out + 2 * R->n_in; /* and in count_readers */
		for (int k = 0; k < R->n_out; k++) {
			const fz_value *o = R->out[k];
			if (fz_view_root(p, (fz_value *)o) != o)
				continue;
			int donor = fz_pick_donor(p, o, readers, pinned, donated);
			if (donor >= 0) {
				donated[donor] = true;
				p->buffer[o->id] = p->buffer[donor];
				p->offset[o->id] = p->offset[donor];
			} else {
				p->offset[o->id] = take(&h, round_up(p->bytes[o->id]), &p->work);
			}
		}
		for (int k = 0; k < R->n_in; k++) {
			fz_value *b = fz_view_root(p, R->in[k]);
			if (seen[b->id] == stamp || b->param_index >= 0)
				continue;
			seen[b->id] = stamp;
			if (--readers[b->id] == 0 && !pinned[b->id] && !donated[b->id] &&
			    !give(&h, p->offset[b->id], round_up(p->bytes[b->id]), &p->work))
				goto done;
		}
		for (int k = 0; k < R->n_out; k++) {
			const fz_value *o = R->out[k];
			if (fz_view_root(p, (fz_value *)o) == o && readers[o->id] == 0 &&
			    !pinned[o->id] && p->offset[o->id] >= 0 &&
			    !give(&h, p->offset[o->id], round_up(p->bytes[o->id]), &p->work))
				goto done;
		}
	}
	/* views take their base's place */
	p->work += 2 * (int64_t)nv;
	for (int v = 0; v < nv; v++) {
		fz_value *b = fz_view_root(p, t->values[v]);
		if (b != t->values[v]) {
			p->buffer[v] = p->buffer[b->id];
			p->offset[v] = p->offset[b->id];
		}
	}
	p->arena_bytes = h.top;
	st = FZ_OK;
done:
	free(h.free);
	free(readers);
	free(seen);
	free(pinned);
	free(donated);
	return st;
}
