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
 * want), and a buffer of a page or more starts on a page (4 KiB) of the
 * arena, whose base is page aligned too (cpu_alloc). That is for the CPU:
 * a core checks a load against the stores still in flight by the address's
 * low 12 bits only, so a loop that writes y while it reads x, with y a
 * little past x modulo 4 KiB (y = x + d, 0 < d <= 256 or so), has each
 * load wait on a store it merely seems to follow ("4K aliasing"): measured
 * here, a bf16 rms_norm 4096x4096 on one thread takes 4.7 ms at d = 0 or
 * 512 and up, 7.8 at d = 64 or 128, 11 at d = 32. With every large buffer
 * on a page boundary, d between two of them is 0; against a PyTorch
 * tensor (glibc's large blocks: a page + 64) it is -64, also harmless
 * (codegen/emit.c's streaming stores meet the same check, worse). So the
 * small buffers and the large ones are planned in two heaps, the small
 * heap first and the large one after it from the next page.
 *
 * A request takes the smallest free block of its heap that fits (best
 * fit), else grows the heap at its end; freed blocks merge with their
 * neighbours. The free blocks are kept in two treaps (see heap_arena), so
 * each request and each release is O(log blocks).
 *
 *     seed-004, planned order:  p0 @0  m0 @262144  r0 in place of m0
 *                               acc0 @0  p1 @524288 ...   arena 786432
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define ALIGN 256
#define PAGE 4096

/*
 * The free blocks, in two treaps over one pool of nodes: one ordered by
 * (size, offset), where best fit is the first block at or above the size
 * asked for (the smallest that fits, the lowest offset among equals), one
 * by offset, where a freed block finds the neighbours it merges with and
 * growth finds the last block. Each request and each release is O(log
 * blocks), so the pass is O((regions + edges) log regions) however many
 * buffers a checkpointed step keeps alive at once (one per layer: a free
 * list scanned linearly made it grow as n times the depth).
 */
typedef struct fnode {
	int64_t off, size;
	uint32_t pri;
	int kid[2][2];   /* [tree][left, right] */
} fnode;

enum { BY_SIZE, BY_OFF };

typedef struct heap_arena {
	fnode *nodes;
	int n, cap, free_slot; /* free_slot: a list of unused nodes, via kid */
	int root[2];
	int64_t top;
	uint32_t seed;
	int64_t *work;
} heap_arena;

static bool node_less(const heap_arena *h, int tree, int a, int64_t off,
		      int64_t size)
{
	const fnode *x = &h->nodes[a];
	if (tree == BY_SIZE && x->size != size)
		return x->size < size;
	return x->off < off;
}

/* Splits tree t under root into keys < (off, size) and the rest. */
static void split(heap_arena *h, int tree, int root, int64_t off, int64_t size,
		  int *lo, int *hi)
{
	if (root < 0) {
		*lo = *hi = -1;
		return;
	}
	++*h->work;
	fnode *x = &h->nodes[root];
	if (node_less(h, tree, root, off, size)) {
		split(h, tree, x->kid[tree][1], off, size, &x->kid[tree][1], hi);
		*lo = root;
	} else {
		split(h, tree, x->kid[tree][0], off, size, lo, &x->kid[tree][0]);
		*hi = root;
	}
}

static int join(heap_arena *h, int tree, int a, int b)
{
	if (a < 0)
		return b;
	if (b < 0)
		return a;
	++*h->work;
	if (h->nodes[a].pri > h->nodes[b].pri) {
		h->nodes[a].kid[tree][1] = join(h, tree, h->nodes[a].kid[tree][1], b);
		return a;
	}
	h->nodes[b].kid[tree][0] = join(h, tree, a, h->nodes[b].kid[tree][0]);
	return b;
}

static void tree_insert(heap_arena *h, int tree, int x)
{
	int lo, hi;
	split(h, tree, h->root[tree], h->nodes[x].off, h->nodes[x].size, &lo, &hi);
	h->nodes[x].kid[tree][0] = h->nodes[x].kid[tree][1] = -1;
	h->root[tree] = join(h, tree, join(h, tree, lo, x), hi);
}

static void tree_erase(heap_arena *h, int tree, int x)
{
	/* offsets are distinct, so x's key is the only one in
	 * [(size, off), (size, off + 1)) */
	int lo, mid, hi;
	int64_t off = h->nodes[x].off, size = h->nodes[x].size;
	split(h, tree, h->root[tree], off, size, &lo, &mid);
	split(h, tree, mid, off + 1, size, &mid, &hi);
	FZ_ASSERT(mid == x);
	h->root[tree] = join(h, tree, lo, hi);
}

static int block_new(heap_arena *h, int64_t off, int64_t size)
{
	int x = h->free_slot;
	if (x >= 0) {
		h->free_slot = h->nodes[x].kid[0][0];
	} else {
		if (h->n == h->cap) {
			int nc = h->cap ? h->cap * 2 : 64;
			fnode *b = realloc(h->nodes, sizeof *b * (size_t)nc);
			if (!b)
				return -1;
			h->nodes = b;
			h->cap = nc;
		}
		x = h->n++;
	}
	h->seed = h->seed * 1664525u + 1013904223u;
	h->nodes[x] = (fnode){off, size, h->seed, {{-1, -1}, {-1, -1}}};
	tree_insert(h, BY_SIZE, x);
	tree_insert(h, BY_OFF, x);
	return x;
}

static void block_drop(heap_arena *h, int x)
{
	tree_erase(h, BY_SIZE, x);
	tree_erase(h, BY_OFF, x);
	h->nodes[x].kid[0][0] = h->free_slot;
	h->free_slot = x;
}

/* The first block of tree at or above key (off, size), or -1. */
static int lower_bound(heap_arena *h, int tree, int64_t off, int64_t size)
{
	int best = -1;
	for (int x = h->root[tree]; x >= 0;) {
		++*h->work;
		if (node_less(h, tree, x, off, size)) {
			x = h->nodes[x].kid[tree][1];
		} else {
			best = x;
			x = h->nodes[x].kid[tree][0];
		}
	}
	return best;
}

/* The last block of tree below key (off, size), or -1. */
static int below(heap_arena *h, int tree, int64_t off, int64_t size)
{
	int best = -1;
	for (int x = h->root[tree]; x >= 0;) {
		++*h->work;
		if (node_less(h, tree, x, off, size)) {
			best = x;
			x = h->nodes[x].kid[tree][1];
		} else {
			x = h->nodes[x].kid[tree][0];
		}
	}
	return best;
}

static int64_t round_to(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* The heap of a buffer of x bytes: 1 for a page or more */
static int heap_of(int64_t x) { return round_to(x, ALIGN) >= PAGE; }

/* The bytes x takes in its heap */
static int64_t round_up(int64_t x) { return round_to(x, heap_of(x) ? PAGE : ALIGN); }

/* An offset for size bytes; -1 if out of memory. */
static int64_t take(heap_arena *h, int64_t size)
{
	int best = lower_bound(h, BY_SIZE, INT64_MIN, size);
	if (best >= 0) {
		int64_t off = h->nodes[best].off, rest = h->nodes[best].size - size;
		block_drop(h, best);
		if (rest > 0 && block_new(h, off + size, rest) < 0)
			return -1;
		return off;
	}
	/* grow at the end, starting inside a free block that touches it */
	int last = below(h, BY_OFF, INT64_MAX, 0);
	if (last >= 0 && h->nodes[last].off + h->nodes[last].size == h->top) {
		int64_t off = h->nodes[last].off;
		block_drop(h, last);
		h->top = off + size;
		return off;
	}
	int64_t off = h->top;
	h->top += size;
	return off;
}

static bool give(heap_arena *h, int64_t off, int64_t size)
{
	if (size == 0)
		return true;
	int prev = below(h, BY_OFF, off, 0);
	if (prev >= 0 && h->nodes[prev].off + h->nodes[prev].size == off) {
		off = h->nodes[prev].off;
		size += h->nodes[prev].size;
		block_drop(h, prev);
	}
	int next = lower_bound(h, BY_OFF, off + size, 0);
	if (next >= 0 && h->nodes[next].off == off + size) {
		size += h->nodes[next].size;
		block_drop(h, next);
	}
	return block_new(h, off, size) >= 0;
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
	heap_arena h[2];
	for (int i = 0; i < 2; i++)
		h[i] = (heap_arena){.free_slot = -1, .root = {-1, -1},
				    .seed = 12345, .work = &p->work};
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
			int o = fz_out_id(R, k);
			if (fz_root_id(p, o) != o)
				continue;
			int donor = fz_pick_donor(p, o, readers, pinned, donated);
			if (donor >= 0) {
				FZ_ASSERT(heap_of(p->bytes[o]) == heap_of(p->bytes[donor]));
				donated[donor] = true;
				p->buffer[o] = p->buffer[donor];
				p->offset[o] = p->offset[donor];
			} else {
				p->offset[o] = take(&h[heap_of(p->bytes[o])],
						    round_up(p->bytes[o]));
				if (p->offset[o] < 0)
					goto done;
			}
		}
		for (int k = 0; k < R->n_in; k++) {
			int b = fz_root_id(p, fz_in_id(R, k));
			if (seen[b] == stamp || fz_id_is_param(p, b))
				continue;
			seen[b] = stamp;
			if (--readers[b] == 0 && !pinned[b] && !donated[b] &&
			    !give(&h[heap_of(p->bytes[b])], p->offset[b],
				  round_up(p->bytes[b])))
				goto done;
		}
		for (int k = 0; k < R->n_out; k++) {
			int o = fz_out_id(R, k);
			if (fz_root_id(p, o) == o && readers[o] == 0 && !pinned[o] &&
			    p->offset[o] >= 0 &&
			    !give(&h[heap_of(p->bytes[o])], p->offset[o],
				  round_up(p->bytes[o])))
				goto done;
		}
	}
	/* the large buffers' heap after the small one's, from a page */
	int64_t base = round_to(h[0].top, PAGE);
	p->work += nv;
	for (int v = 0; v < nv; v++)
		if (p->offset[v] >= 0 && heap_of(p->bytes[v]))
			p->offset[v] += base;
	/* views take their base's place */
	p->work += 2 * (int64_t)nv;
	for (int v = 0; v < nv; v++) {
		int b = p->view_root ? p->view_root[v] :
			fz_view_root(p, t->values[v])->id;
		if (b != v) {
			p->buffer[v] = p->buffer[b];
			p->offset[v] = p->offset[b];
		}
	}
	p->arena_bytes = h[1].top ? base + h[1].top : h[0].top;
	st = FZ_OK;
done:
	free(h[0].nodes);
	free(h[1].nodes);
	free(readers);
	free(seen);
	free(pinned);
	free(donated);
	return st;
}
