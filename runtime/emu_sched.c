/*
 * emu_sched.c: the threads of a GPU block as fibers on one host thread,
 * with compute-sanitizer's memcheck and racecheck built in.
 *
 * The emulated GPU runs the very kernels the NVPTX target gets (codegen's
 * EMU flavour: same skeletons, launch geometry, index width and lanes),
 * compiled for the host. Each kernel is a function of one GPU thread:
 * it reads threadIdx/blockIdx from its fz_emu_thread and calls back here
 * for bar.sync, shfl.sync.bfly and shared memory. Two ways to run such
 * code were on the table:
 *
 *   loop fission at barriers: cut the kernel at every barrier and run each
 *     piece for all threads in a loop. That is a compiler transformation
 *     on the generated IR (values live across a cut go to per-thread
 *     arrays, a barrier inside a loop splits the loop) and it is exactly
 *     the code the checks should check that it would rewrite. Shuffles
 *     need the same treatment at warp granularity.
 *   fibers: each thread of the block is a coroutine with its own small
 *     stack; a barrier or a shuffle is a yield. The kernel runs as
 *     compiled, with no transformation at all, so what runs is what the
 *     GPU runs, and a thread that misses a barrier is visible as such.
 *
 * Fibers it is. A block of B threads gets B fibers (stacks of 64 KiB, 128
 * under ASan, with a guard page, made once and reused). A fiber runs
 * until it blocks (at a barrier or a shuffle) or returns, then hands the
 * CPU straight to the next ready fiber in thread order (one switch, not
 * two through a scheduler). The last to arrive releases:
 *
 *   the 32nd lane of a warp at a shuffle: each lane gets lane ^ mask's
 *     value (computed for all lanes before any resumes), all ready again;
 *   the B-th thread at a barrier: the barrier epoch advances (shared-
 *     memory accesses are ordered by it), all ready again.
 *
 * So a block reduction goes warp by warp through each shuffle and thread
 * by thread to each barrier, round robin. When no fiber is ready the CPU
 * returns to the launch: the block is done, or it is stuck, which is a
 * violation, and the launch says which.
 *
 * Anything else is a violation: a warp where some lanes wait at a shuffle
 * and others exited, wait at a barrier or at another shuffle ("every lane
 * of a warp reaching each shuffle"); a barrier that some thread of the
 * block exited without reaching, or threads waiting at different barriers
 * ("a barrier reached by every thread of the block"). Kernels with neither
 * barriers nor shuffles (pointwise, scatter, a thread per row) need no
 * fibers: their threads are called one after another on this stack.
 *
 * The context switch is fourteen instructions of x86-64 (callee-saved
 * registers pushed on the old stack, swap the stack pointer, pop, ret),
 * which matters: layer_norm's block reduction yields about 25 times per
 * thread per row (two passes of ten shuffles, hi and lo of a float pair,
 * and two barriers). Elsewhere it is ucontext (correct, slower:
 * swapcontext makes a system call for the signal mask). Under AddressSanitizer every switch
 * is announced with __sanitizer_start_switch_fiber / _finish_switch_fiber,
 * so ASan follows the stacks and its fake stacks.
 *
 * Checks, on every run:
 *   global memory: every load and store the kernel makes is compared
 *     with its buffer's extent by the kernel itself (codegen/emit.c,
 *     cg_access_ptr); out of bounds it calls oob() here, which reports it
 *     and hands back scratch memory, so nothing outside the buffer is
 *     touched. A vector access must also be aligned as its instruction
 *     says (a GPU faults on a misaligned ld.global.v4).
 *   shared memory: each element has a shadow: the last writer and the
 *     epoch of that write, the reader(s) of the current epoch. A read of
 *     an element another thread wrote in the same epoch (read after write),
 *     a write of one another thread wrote (write after write) or read
 *     (write after read) in the same epoch, is a race: no barrier orders
 *     the two. Whatever order the fibers ran in, a conflicting pair in one
 *     epoch is caught. A read of an element no thread wrote is reported
 *     too (uninitialized shared memory: at the next barrier, unless a
 *     write in the same epoch showed it a race first), and so is an index
 *     past the array.
 * The first violation stops the launch: the blocked fibers are abandoned
 * (their stacks are reset before the next launch) and the error names the
 * kernel, its region, the block and the thread.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu.h"
#include "numeric.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_STACK (128 * 1024)
#else
#define EMU_STACK (64 * 1024)
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#define SMEM_ARRAYS 16 /* reductions' 6 by type and part (codegen/reduction.c),
                        * then named ones (scan.c, select.c) */
#define SMEM_ELEMS 32
#define SMEM_ELEM 8    /* bytes per element, at most */
#define MAX_BLOCK 1024

/* ---- the context switch ------------------------------------------------------- */

#if defined(__x86_64__)
/* Saves the callee-saved registers on the current stack, stores the stack
 * pointer in *from, switches to `to`, restores that stack's registers and
 * returns into it. */
void fz_emu_switch(void **from, void *to);
__asm__(".text\n"
	".globl fz_emu_switch\n"
	".hidden fz_emu_switch\n"
	".type fz_emu_switch,@function\n"
	"fz_emu_switch:\n"
	"\tpushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n"
	"\tmovq %rsp, (%rdi)\n"
	"\tmovq %rsi, %rsp\n"
	"\tpopq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n"
	"\tret\n"
	".size fz_emu_switch,.-fz_emu_switch\n");
#endif

typedef enum tstate { T_READY, T_BAR, T_SHFL, T_WARP, T_DONE } tstate;

/* A lane's part in a warp-wide matrix operation (T_WARP), on its stack. */
typedef struct warp_op {
	int kind;               /* W_LDMATRIX, W_MMA */
	int32_t how;            /* ldmatrix: n | 16 (.trans); mma: 0 bf16, 1 f16 */
	int64_t off;            /* ldmatrix: this lane's row */
	int32_t size;
	int32_t *out;           /* ldmatrix: n registers */
	const int32_t *a, *b;   /* mma fragments */
	const float *c;
	float *d;
} warp_op;
enum { W_LDMATRIX, W_MMA };

/* A cp.async in flight: lands at the wait_group that retires its group. */
typedef struct cp_copy {
	int64_t dst;
	int32_t group, bytes;
	unsigned char data[16];
} cp_copy;

typedef struct fiber {
	fz_emu_thread ctx;      /* first: the kernel's pointer is the fiber's */
	struct fz_emu_sched *s;
	int idx;                /* its thread index in a block */
	tstate st;
	int32_t site, mask, val, res;
	warp_op *op;            /* T_WARP: what this lane brings */
	cp_copy *cp;            /* copies in flight, oldest first */
	int n_cp, cap_cp;
	int32_t groups;         /* cp.async groups committed */
	char *map;              /* guard page + stack */
	size_t map_len;
#if defined(__x86_64__)
	void *sp;
#else
	ucontext_t uc;
#endif
	void *fake;             /* ASan's fake stack while switched away */
} fiber;

typedef struct shadow {
	int32_t w, we;          /* last writer and its epoch (-1: none) */
	int32_t r, re;          /* reader of epoch re; -2: several */
	int32_t ur;             /* read before any write, by this thread (-1) */
} shadow;

/* Tile memory's shadow, per 2-byte element: valid in block `gen` only
 * (older ones read as fresh, so a block starts clean without a sweep). */
typedef struct tshadow {
	shadow h;
	int32_t pend;           /* thread whose cp.async to it is in flight (-1) */
	int32_t gen;
} tshadow;
#define TILE_ELEMS (FZ_EMU_TILE_MAX / 2)

struct fz_emu_sched {
	fiber **f;              /* each allocated once: a fiber never moves */
	int nf;
	bool dirty;             /* fibers abandoned mid-kernel: reset them */
	fiber *cur;             /* running (NULL: the scheduler) */
	fz_emu_thread plain;    /* the context of fiberless threads */
#if defined(__x86_64__)
	void *main_sp;
#else
	ucontext_t main_uc;
#endif
	void *main_fake;
	const void *main_bottom;
	size_t main_size;
	bool from_main;         /* the last switch left the scheduler */
	int bar_arr;            /* threads waiting at the barrier */
	int warp_arr[MAX_BLOCK / 32]; /* lanes waiting at a shuffle, per warp */
	const fz_emu_launch *L;
	int64_t block;
	int nthr;
	int32_t epoch;
	_Alignas(64) unsigned char smem[SMEM_ARRAYS * SMEM_ELEMS * SMEM_ELEM];
	shadow sh[SMEM_ARRAYS * SMEM_ELEMS];
	_Alignas(64) unsigned char scratch[128];
	unsigned char *tile;    /* FZ_EMU_TILE_MAX bytes, on first use */
	tshadow *tsh;
	int32_t tgen;           /* the block's stamp for tsh */
	int64_t tile_hi;        /* bytes a kernel declared: made garbage per block */
	bool bad;
	char msg[768];
	fz_emu_stats stats;
};


/* ---- violations ------------------------------------------------------------------ */

static void violate(fz_emu_sched *s, int tid, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void violate(fz_emu_sched *s, int tid, const char *fmt, ...)
{
	if (s->bad)
		return;
	s->bad = true;
	char what[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	const fz_emu_launch *L = s->L;
	if (tid >= 0)
		snprintf(s->msg, sizeof s->msg, "emu: kernel %s (region %d), block %lld "
			 "thread %d: %s", L->kernel, L->region, (long long)s->block, tid, what);
	else
		snprintf(s->msg, sizeof s->msg, "emu: kernel %s (region %d), block %lld: %s",
			 L->kernel, L->region, (long long)s->block, what);
}

static void slot_name(const fz_emu_launch *L, int slot, char *buf, size_t n)
{
	if (slot < L->n_in)
		snprintf(buf, n, "input %d", slot);
	else
		snprintf(buf, n, "output %d", slot - L->n_in);
}

/* ---- fibers ------------------------------------------------------------------------ */

/* The scheduler of this host thread's running launch. */
static _Thread_local fz_emu_sched *fz_emu_current;

static void fiber_yield(fiber *f);

/* Every fiber runs this loop: one thread of a block per turn. */
static void fiber_main(void)
{
	/* entered from fiber_switch, with s->cur set to this fiber */
	fz_emu_sched *s = fz_emu_current;
	fiber *f = s->cur;
#ifdef EMU_ASAN
	if (s->from_main)
		__sanitizer_finish_switch_fiber(NULL, &s->main_bottom, &s->main_size);
	else
		__sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
	for (;;) {
		const fz_emu_launch *L = s->L;
		L->fn(L->bufs, L->syms, L->flag, &f->ctx);
		f->st = T_DONE;
		fiber_yield(f);
	}
}

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static void fiber_reset(fiber *f)
{
	char *top = f->map + f->map_len;
#if defined(__x86_64__)
	void **sp = (void **)((uintptr_t)top & ~(uintptr_t)15);
	*--sp = NULL;                      /* fiber_main's return address */
	*--sp = (void *)(uintptr_t)fiber_main;
	for (int i = 0; i < 6; i++)
		*--sp = NULL;              /* rbp rbx r12 r13 r14 r15 */
	f->sp = sp;
#else
	(void)top;
	getcontext(&f->uc);
	f->uc.uc_stack.ss_sp = f->map + page_size();
	f->uc.uc_stack.ss_size = f->map_len - page_size();
	f->uc.uc_link = NULL;
	makecontext(&f->uc, fiber_main, 0);
#endif
	f->fake = NULL;
	f->st = T_DONE;
#ifdef EMU_ASAN
	/* an abandoned fiber's frames leave their redzones poisoned, where
	 * the next kernel's uninstrumented frames (whose registers the warp's
	 * last lane writes: ldmatrix, mma) will lie */
	__asan_unpoison_memory_region(f->map + page_size(), f->map_len - page_size());
#endif
}

static fz_status fibers_grow(fz_emu_sched *s, int n)
{
	if (n <= s->nf)
		return FZ_OK;
	fiber **nfb = realloc(s->f, sizeof *nfb * (size_t)n);
	if (!nfb)
		return FZ_ENOMEM;
	s->f = nfb;
	size_t page = page_size();
	for (int i = s->nf; i < n; i++) {
		fiber *f = calloc(1, sizeof *f);
		if (!f)
			return FZ_ENOMEM;
		f->map_len = EMU_STACK + page;
		f->map = mmap(NULL, f->map_len, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (f->map == MAP_FAILED) {
			free(f);
			return FZ_ENOMEM;
		}
		mprotect(f->map, page, PROT_NONE); /* the guard page */
		f->s = s;
		f->idx = i;
		fiber_reset(f);
		s->f[i] = f;
		s->nf = i + 1;
	}
	return FZ_OK;
}

/* From fiber `from` (NULL: the scheduler) to fiber `to` (NULL: the
 * scheduler); returns when someone switches back to `from`. */
static void fiber_switch(fz_emu_sched *s, fiber *from, fiber *to)
{
	void **fake = from ? &from->fake : &s->main_fake;
	s->cur = to;
	s->from_main = from == NULL;
#ifdef EMU_ASAN
	if (to)
		__sanitizer_start_switch_fiber(fake, to->map + page_size(),
					       to->map_len - page_size());
	else
		__sanitizer_start_switch_fiber(fake, s->main_bottom, s->main_size);
#endif
#if defined(__x86_64__)
	fz_emu_switch(from ? &from->sp : &s->main_sp, to ? to->sp : s->main_sp);
#else
	swapcontext(from ? &from->uc : &s->main_uc, to ? &to->uc : &s->main_uc);
#endif
#ifdef EMU_ASAN
	__sanitizer_finish_switch_fiber(*fake, NULL, NULL);
#else
	(void)fake;
#endif
}

/* The next ready fiber after thread i, round robin (i itself last). */
static fiber *next_ready(fz_emu_sched *s, int i)
{
	int n = s->nthr;
	for (int k = 1; k <= n; k++) {
		int j = i + k < n ? i + k : i + k - n;
		if (s->f[j]->st == T_READY)
			return s->f[j];
	}
	return NULL;
}

/* Fiber f has stopped (its state says why): the CPU goes straight to the
 * next ready fiber, or back to the scheduler when none is (the block is
 * done, or stuck: a violation) or a violation was found. */
static void fiber_yield(fiber *f)
{
	fz_emu_sched *s = f->s;
	fiber *next = s->bad ? NULL : next_ready(s, f->idx);
	if (next != f)
		fiber_switch(s, f, next);
}

/* ---- the SIMT primitives (fz_emu_thread's callbacks) ------------------------------ */

static fiber *fiber_of(fz_emu_thread *t) { return (fiber *)t; }

static bool in_fiber(fz_emu_sched *s, fz_emu_thread *t)
{
	return t != &s->plain;
}

static fz_emu_sched *sched_of(fz_emu_thread *t)
{
	return fz_emu_current;
	(void)t;
}

static void barrier_release(fz_emu_sched *s);
static void warp_release(fz_emu_sched *s, int w0);

static void emu_barrier(fz_emu_thread *t, int32_t site)
{
	fz_emu_sched *s = sched_of(t);
	if (!in_fiber(s, t)) {
		violate(s, t->tid, "a barrier in a kernel launched without fibers "
			"(the emulator took it for one with neither barriers nor "
			"shuffles)");
		return;
	}
	fiber *f = fiber_of(t);
	f->st = T_BAR;
	f->site = site;
	if (++s->bar_arr == s->nthr)
		barrier_release(s); /* the last to arrive lets all go */
	fiber_yield(f);
}

static int32_t emu_shfl(fz_emu_thread *t, int32_t x, int32_t mask, int32_t site)
{
	fz_emu_sched *s = sched_of(t);
	if (!in_fiber(s, t)) {
		violate(s, t->tid, "a shuffle in a kernel launched without fibers");
		return x;
	}
	fiber *f = fiber_of(t);
	f->st = T_SHFL;
	f->site = site;
	f->mask = mask;
	f->val = x;
	int w0 = f->idx & ~31;
	/* a whole warp waits: release it; a partial warp never is (stuck) */
	if (w0 + 32 <= s->nthr && ++s->warp_arr[w0 / 32] == 32)
		warp_release(s, w0);
	fiber_yield(f);
	return f->res;
}

/* Names an element for a message: of shared array arr, or (arr < 0) the
 * 2-byte element at byte i of tile memory. */
static const char *elem_name(char *buf, size_t n, int32_t arr, int64_t i)
{
	if (arr >= 0)
		snprintf(buf, n, "element %lld of shared array %d", (long long)i, arr);
	else
		snprintf(buf, n, "byte %lld of tile memory", (long long)i);
	return buf;
}

/* The race checks of one access of an element by thread me (see the
 * essay); true when the access is clean. */
static bool shadow_access(fz_emu_sched *s, shadow *h, int32_t me, bool store, int32_t arr,
			  int64_t i)
{
	int32_t ep = s->epoch;
	char nm[64];
	if (store) {
		if (h->we == ep && h->w != me)
			violate(s, me, "shared-memory race (write after write): %s, written "
				"by thread %d with no barrier between", elem_name(nm, sizeof nm,
				arr, i), h->w);
		else if (h->re == ep && h->r != me)
			violate(s, me, "shared-memory race (write after read): %s, read by "
				"thread %s%d with no barrier between", elem_name(nm, sizeof nm,
				arr, i), h->r == -2 ? "(several, e.g.) " : "", h->r == -2 ? 0 : h->r);
		h->w = me;
		h->we = ep;
	} else {
		/* a read of an element no thread wrote yet: reported at the
		 * next barrier, unless a write in this epoch shows it a race */
		if (h->we < 0 && h->ur < 0)
			h->ur = me;
		else if (h->we == ep && h->w != me)
			violate(s, me, "shared-memory race (read after write): %s, written by "
				"thread %d with no barrier between", elem_name(nm, sizeof nm, arr,
				i), h->w);
		if (h->re != ep) {
			h->r = me;
			h->re = ep;
		} else if (h->r != me) {
			h->r = -2;
		}
	}
	return !s->bad;
}

static void *emu_smem(fz_emu_thread *t, int32_t arr, int64_t i, int32_t bytes,
		      int32_t store, int32_t site)
{
	fz_emu_sched *s = sched_of(t);
	(void)site;
	s->stats.smem_accesses++;
	if (arr < 0 || arr >= SMEM_ARRAYS || i < 0 || i >= SMEM_ELEMS ||
	    bytes <= 0 || bytes > SMEM_ELEM) {
		violate(s, t->tid, "shared memory out of bounds: %s of element %lld of "
			"shared array %d (%d elements)", store ? "store" : "load",
			(long long)i, arr, SMEM_ELEMS);
		return s->scratch;
	}
	int e = arr * SMEM_ELEMS + (int)i;
	shadow_access(s, &s->sh[e], t->tid, store, arr, i);
	return s->smem + (size_t)e * SMEM_ELEM;
}

/* ---- tile memory and the warp-level matrix operations ------------------------------ */

static tshadow *tile_shadow(fz_emu_sched *s, int64_t byte)
{
	tshadow *h = &s->tsh[byte / 2];
	if (h->gen != s->tgen)
		*h = (tshadow){{-1, -1, -1, -1, -1}, -1, s->tgen};
	return h;
}

/* Bytes [off, off + n) of a tile of `size` bytes, accessed by thread me
 * (what: for messages): bounds, alignment to `align`, then every element's
 * race checks; a read also of bytes a cp.async has not delivered, and of
 * bytes nothing wrote. NULL on a violation. */
static unsigned char *tile_access(fz_emu_sched *s, int32_t me, int64_t off, int64_t n,
				  int32_t size, bool store, int align, const char *what)
{
	if (!s->tile) {
		s->tile = malloc(FZ_EMU_TILE_MAX);
		s->tsh = calloc(TILE_ELEMS, sizeof *s->tsh);
		if (!s->tile || !s->tsh) {
			violate(s, me, "out of memory for the tile memory");
			return NULL;
		}
		memset(s->tile, 0xa5, FZ_EMU_TILE_MAX);
		s->tgen = 1; /* calloc's shadows are of no block */
	}
	if (size <= 0 || size > FZ_EMU_TILE_MAX) {
		violate(s, me, "a kernel with %d bytes of tile memory (at most %d)", size,
			FZ_EMU_TILE_MAX);
		return NULL;
	}
	if (size > FZ_TILE_STATIC_MAX && size > s->L->smem) {
		violate(s, me, "a kernel with %d bytes of tile memory launched with %d bytes of "
			"dynamic shared memory (static shared memory ends at %d bytes)", size,
			s->L->smem, FZ_TILE_STATIC_MAX);
		return NULL;
	}
	if (size > s->tile_hi)
		s->tile_hi = size;
	if (off < 0 || n <= 0 || off + n > size) {
		violate(s, me, "shared memory out of bounds: %s of bytes [%lld, %lld) of "
			"tile memory (%d bytes)", what, (long long)off, (long long)(off + n), size);
		return NULL;
	}
	if (off % align || off % 2) {
		violate(s, me, "misaligned %s: byte %lld of tile memory, not aligned to %d",
			what, (long long)off, align > 2 ? align : 2);
		return NULL;
	}
	s->stats.smem_accesses++;
	for (int64_t b = off; b < off + n; b += 2) {
		tshadow *h = tile_shadow(s, b);
		if (!store && h->pend >= 0) {
			violate(s, me, "%s of byte %lld of tile memory before the "
				"cp.async.wait_group that delivers it (thread %d's copy in "
				"flight)", what, (long long)b, h->pend);
			return NULL;
		}
		if (!store && h->h.we < 0) {
			violate(s, me, "%s of tile memory no thread had written: byte %lld",
				what, (long long)b);
			return NULL;
		}
		if (!shadow_access(s, &h->h, me, store, -1, b))
			return NULL;
	}
	return s->tile + off;
}

static void *emu_tile(fz_emu_thread *t, int64_t off, int32_t bytes, int32_t store,
		      int32_t size, int32_t site)
{
	(void)site;
	fz_emu_sched *s = sched_of(t);
	unsigned char *p = tile_access(s, t->tid, off, bytes, size, store,
				       bytes <= 16 ? bytes : 16, store ? "store" : "load");
	if (!p) {
		memset(s->scratch, 0, sizeof s->scratch);
		return s->scratch;
	}
	return p;
}

/* The fiber of thread t for operation `what`; NULL (a violation) when the
 * kernel was launched without fibers. */
static fiber *fiber_for(fz_emu_sched *s, fz_emu_thread *t, const char *what)
{
	if (in_fiber(s, t))
		return fiber_of(t);
	violate(s, t->tid, "%s in a kernel launched without fibers", what);
	return NULL;
}

static void cp_async(fz_emu_thread *t, int64_t dst, const void *src, int32_t src_bytes,
		     int32_t size, int32_t site)
{
	(void)site;
	fz_emu_sched *s = sched_of(t);
	fiber *f = fiber_for(s, t, "cp.async");
	if (!f)
		return;
	/* the copy writes its bytes some time before the wait: a write now,
	 * for the race checks, and in flight until then */
	if (!tile_access(s, t->tid, dst, 16, size, true, 16, "cp.async"))
		return;
	if (f->n_cp == f->cap_cp) {
		int cap = f->cap_cp ? 2 * f->cap_cp : 64;
		cp_copy *n = realloc(f->cp, sizeof *n * (size_t)cap);
		if (!n) {
			violate(s, t->tid, "out of memory for cp.async");
			return;
		}
		f->cp = n;
		f->cap_cp = cap;
	}
	cp_copy *c = &f->cp[f->n_cp++];
	c->dst = dst;
	c->group = f->groups;
	c->bytes = src_bytes < 0 ? 0 : src_bytes > 16 ? 16 : src_bytes;
	memset(c->data, 0, 16);
	memcpy(c->data, src, (size_t)c->bytes);
	for (int b = 0; b < 16; b += 2)
		tile_shadow(s, dst + b)->pend = t->tid;
	s->stats.cp_async++;
}

static void cp_group(fz_emu_thread *t, int32_t n, int32_t site)
{
	(void)site;
	fz_emu_sched *s = sched_of(t);
	fiber *f = fiber_for(s, t, "cp.async");
	if (!f)
		return;
	if (n < 0) { /* commit_group */
		f->groups++;
		return;
	}
	/* wait_group n: every committed group but the n newest lands now */
	int keep = 0;
	for (int i = 0; i < f->n_cp; i++) {
		cp_copy *c = &f->cp[i];
		if (c->group >= f->groups - n) {
			f->cp[keep++] = *c;
			continue;
		}
		memcpy(s->tile + c->dst, c->data, 16);
		for (int b = 0; b < 16; b += 2) {
			tshadow *h = tile_shadow(s, c->dst + b);
			h->pend = -1;
			shadow_access(s, &h->h, t->tid, true, -1, c->dst + b);
		}
	}
	f->n_cp = keep;
}

/* A warp-wide operation: this lane waits until all 32 bring theirs. */
static void warp_op_wait(fz_emu_thread *t, warp_op *op, int32_t site, const char *what)
{
	fz_emu_sched *s = sched_of(t);
	fiber *f = fiber_for(s, t, what);
	if (!f)
		return;
	f->st = T_WARP;
	f->site = site;
	f->op = op;
	int w0 = f->idx & ~31;
	if (w0 + 32 <= s->nthr && ++s->warp_arr[w0 / 32] == 32)
		warp_release(s, w0);
	fiber_yield(f);
}

static void emu_ldmatrix(fz_emu_thread *t, int64_t off, int32_t how, int32_t size,
			 int32_t *out, int32_t site)
{
	warp_op op = {.kind = W_LDMATRIX, .how = how, .off = off, .size = size, .out = out};
	warp_op_wait(t, &op, site, "ldmatrix");
}

static void emu_mma(fz_emu_thread *t, int32_t kind, const int32_t *a, const int32_t *b,
		    const float *c, float *d, int32_t site)
{
	warp_op op = {.kind = W_MMA, .how = kind, .a = a, .b = b, .c = c, .d = d};
	warp_op_wait(t, &op, site, "mma.sync");
}

/* ldmatrix for the warp at w0 (every lane at it): lane 8m + r names row r
 * of matrix m; lane l gets row l / 4, elements 2(l % 4) and + 1 of each
 * matrix (.trans: column l / 4, rows 2(l % 4) and + 1). */
static void ldmatrix_release(fz_emu_sched *s, int w0)
{
	warp_op *op0 = s->f[w0]->op;
	int n = op0->how & 7;
	bool trans = op0->how & 16;
	if (n != 1 && n != 2 && n != 4) {
		violate(s, s->f[w0]->ctx.tid, "ldmatrix of %d matrices", n);
		return;
	}
	const unsigned char *row[32];
	for (int l = 0; l < 8 * n; l++) {
		fiber *f = s->f[w0 + l];
		row[l] = tile_access(s, f->ctx.tid, f->op->off, 16, f->op->size, false, 16,
				     "ldmatrix");
		if (!row[l])
			return;
	}
	for (int l = 0; l < 32; l++) {
		int g = l / 4, c2 = 2 * (l % 4);
		for (int m = 0; m < n; m++) {
			uint16_t lo, hi;
			if (!trans) {
				memcpy(&lo, row[8 * m + g] + 2 * c2, 2);
				memcpy(&hi, row[8 * m + g] + 2 * c2 + 2, 2);
			} else {
				memcpy(&lo, row[8 * m + c2] + 2 * g, 2);
				memcpy(&hi, row[8 * m + c2 + 1] + 2 * g, 2);
			}
			s->f[w0 + l]->op->out[m] = (int32_t)((uint32_t)lo | (uint32_t)hi << 16);
		}
	}
	s->stats.ldmatrix++;
}

static double half_of(int32_t reg, int hi, int f16)
{
	uint16_t h = (uint16_t)((uint32_t)reg >> (hi ? 16 : 0));
	return f16 ? fz_f16_to_f64(h) : fz_bf16_to_f64(h);
}

/* mma.m16n8k16 for the warp at w0, the fragments as the PTX ISA lays them
 * out (codegen/mma.c): D = A B + C, products exact, summed in f64, each
 * result rounded once to f32. */
static void mma_release(fz_emu_sched *s, int w0)
{
	double A[16][16], B[16][8], C[16][8];
	int f16 = s->f[w0]->op->how;
	for (int l = 0; l < 32; l++) {
		const warp_op *op = s->f[w0 + l]->op;
		int g = l / 4, t2 = 2 * (l % 4);
		for (int e = 0; e < 2; e++) {
			A[g][t2 + e] = half_of(op->a[0], e, f16);
			A[g + 8][t2 + e] = half_of(op->a[1], e, f16);
			A[g][t2 + 8 + e] = half_of(op->a[2], e, f16);
			A[g + 8][t2 + 8 + e] = half_of(op->a[3], e, f16);
			B[t2 + e][g] = half_of(op->b[0], e, f16);
			B[t2 + 8 + e][g] = half_of(op->b[1], e, f16);
			C[g][t2 + e] = op->c[e];
			C[g + 8][t2 + e] = op->c[2 + e];
		}
	}
	for (int l = 0; l < 32; l++) {
		const warp_op *op = s->f[w0 + l]->op;
		int g = l / 4, t2 = 2 * (l % 4);
		for (int i = 0; i < 4; i++) {
			int r = g + (i >= 2 ? 8 : 0), c = t2 + (i & 1);
			double acc = C[r][c];
			for (int k = 0; k < 16; k++)
				acc += A[r][k] * B[k][c];
			op->d[i] = (float)acc;
		}
	}
	s->stats.mmas++;
}

static void *emu_oob(fz_emu_thread *t, int32_t slot, int64_t off, int64_t n,
		     int64_t ext, int32_t how)
{
	fz_emu_sched *s = sched_of(t);
	char name[32];
	bool store = how & 1;
	slot_name(s->L, slot, name, sizeof name);
	if ((how & 2) && off >= 0 && off + n <= ext)
		violate(s, t->tid, "misaligned vector %s: elements [%lld, %lld) of buffer "
			"%d (%s) at %p, not aligned to %lld elements", store ? "store" : "load",
			(long long)off, (long long)(off + n), slot, name,
			(void *)((char **)s->L->bufs)[slot], (long long)n);
	else if (n == 1)
		violate(s, t->tid, "global %s out of bounds: element %lld of buffer %d "
			"(%s), which has %lld", store ? "store" : "load", (long long)off,
			slot, name, (long long)ext);
	else
		violate(s, t->tid, "global %s out of bounds: elements [%lld, %lld) of "
			"buffer %d (%s), which has %lld", store ? "store" : "load",
			(long long)off, (long long)(off + n), slot, name, (long long)ext);
	memset(s->scratch, 0, sizeof s->scratch);
	return s->scratch;
}

static void ctx_init(fz_emu_thread *c, int tid, const fz_emu_launch *L, int64_t b)
{
	c->tid = tid;
	c->ntid = L->block;
	c->ctaid = (int32_t)b;
	c->nctaid = (int32_t)L->grid;
	c->barrier = emu_barrier;
	c->shfl = emu_shfl;
	c->smem = emu_smem;
	c->oob = emu_oob;
	c->tile = emu_tile;
	c->ldmatrix = emu_ldmatrix;
	c->mma = emu_mma;
	c->cp_async = cp_async;
	c->cp_group = cp_group;
}

/* ---- one block ------------------------------------------------------------------- */

static const char *state_name(const fiber *f)
{
	switch (f->st) {
	case T_BAR: return "waits at a barrier";
	case T_SHFL: return "waits at another shuffle";
	case T_WARP: return f->op->kind == W_MMA ? "waits at another mma.sync" :
			    "waits at another ldmatrix";
	case T_DONE: return "exited";
	default: return "runs";
	}
}

/* "a shuffle (xor 4)", "an mma.sync (site 12)": what lane f waits at. */
static void warp_what(const fiber *f, char *buf, size_t n)
{
	if (f->st == T_SHFL)
		snprintf(buf, n, "a shuffle (%s %d)", f->mask & 0x100 ? "up" : "xor",
			 f->mask & 31);
	else
		snprintf(buf, n, "%s (site %d)", f->op->kind == W_MMA ? "an mma.sync" :
			 "an ldmatrix", f->site);
}

/* The 32 lanes of the warp at w0 all wait at a shuffle: each gets lane
 * (lane ^ mask)'s value, computed for all before any resumes. */
static void warp_release(fz_emu_sched *s, int w0)
{
	fiber *a = s->f[w0];
	for (int i = w0 + 1; i < w0 + 32; i++) {
		fiber *b = s->f[i];
		if (b->st != a->st || b->site != a->site ||
		    (a->st == T_SHFL && b->mask != a->mask)) {
			char what[48];
			warp_what(a, what, sizeof what);
			violate(s, a->ctx.tid, "warp %d: lane 0 reaches %s that lane %d never "
				"reaches: it %s", w0 / 32, what, i - w0, state_name(b));
			return;
		}
	}
	if (a->st == T_WARP) {
		if (a->op->kind == W_LDMATRIX)
			ldmatrix_release(s, w0);
		else
			mma_release(s, w0);
		for (int i = w0; i < w0 + 32; i++)
			s->f[i]->st = T_READY;
		s->warp_arr[w0 / 32] = 0;
		return;
	}
	for (int i = w0; i < w0 + 32; i++) {
		fiber *b = s->f[i];
		int lane = i - w0, d = b->mask & 31;
		if (b->mask & 0x100) /* shfl.up: lanes below d keep their own */
			b->res = lane >= d ? s->f[i - d]->val : b->val;
		else
			b->res = s->f[w0 + (lane ^ d)]->val;
	}
	for (int i = w0; i < w0 + 32; i++)
		s->f[i]->st = T_READY;
	s->warp_arr[w0 / 32] = 0;
	s->stats.shuffles++;
}

/* Reads of shared memory that no thread had written when they read it. */
static void check_uninit(fz_emu_sched *s)
{
	for (int e = 0; e < SMEM_ARRAYS * SMEM_ELEMS && !s->bad; e++)
		if (s->sh[e].ur >= 0)
			violate(s, s->sh[e].ur, "a read of shared memory no thread had "
				"written: element %d of shared array %d", e % SMEM_ELEMS,
				e / SMEM_ELEMS);
}

/* Every thread waits at a barrier: the same one, or a violation; then
 * the next epoch. */
static void barrier_release(fz_emu_sched *s)
{
	int n = s->nthr;
	for (int i = 1; i < n; i++)
		if (s->f[i]->site != s->f[0]->site) {
			violate(s, i, "waits at a different barrier than thread 0: the "
				"threads of a block must reach the same __syncthreads()");
			return;
		}
	check_uninit(s);
	if (s->bad)
		return;
	for (int i = 0; i < n; i++)
		s->f[i]->st = T_READY;
	s->bar_arr = 0;
	s->epoch++;
	s->stats.barriers++;
}


/* No fiber can run and not all are done: say why. */
static void report_stuck(fz_emu_sched *s)
{
	int n = s->nthr;
	for (int w0 = 0; w0 < n && !s->bad; w0 += 32) {
		int w1 = w0 + 32 < n ? w0 + 32 : n, lead = -1;
		for (int i = w0; i < w1 && lead < 0; i++)
			if (s->f[i]->st == T_SHFL || s->f[i]->st == T_WARP)
				lead = i;
		if (lead < 0)
			continue;
		fiber *a = s->f[lead];
		char what[48];
		warp_what(a, what, sizeof what);
		for (int i = w0; i < w1 && !s->bad; i++) {
			fiber *b = s->f[i];
			if (b->st != a->st || b->site != a->site ||
			    (a->st == T_SHFL && b->mask != a->mask))
				violate(s, a->ctx.tid, "warp %d: lane %d reaches %s that lane "
					"%d never reaches: it %s", w0 / 32, lead - w0, what,
					i - w0, state_name(b));
		}
		if (!s->bad)
			violate(s, a->ctx.tid, "a full-warp %s in a warp of %d threads "
				"(the block has %d)", a->st == T_SHFL ? "shuffle" :
				"matrix operation", w1 - w0, n);
	}
	int first = -1;
	for (int i = 0; i < n && first < 0 && !s->bad; i++)
		if (s->f[i]->st == T_BAR)
			first = i;
	for (int i = 0; i < n && first >= 0 && !s->bad; i++)
		if (s->f[i]->st != T_BAR)
			violate(s, first, "waits at a barrier that thread %d never reaches: "
				"it %s", i, state_name(s->f[i]));
	if (!s->bad)
		violate(s, -1, "the threads of the block are stuck (an emulator bug)");
}

static void smem_reset(fz_emu_sched *s)
{
	for (int i = 0; i < SMEM_ARRAYS * SMEM_ELEMS; i++)
		s->sh[i] = (shadow){-1, -1, -1, -1, -1};
	s->epoch = 0;
	/* garbage, as a GPU's shared memory is at a block's start */
	memset(s->smem, 0xa5, sizeof s->smem);
	if (s->tile && s->tile_hi)
		memset(s->tile, 0xa5, (size_t)s->tile_hi);
	s->tgen++;
}

static void block_fibers(fz_emu_sched *s, int64_t b)
{
	const fz_emu_launch *L = s->L;
	int n = L->block;
	for (int i = 0; i < n; i++) {
		ctx_init(&s->f[i]->ctx, i, L, b);
		s->f[i]->st = T_READY;
		s->f[i]->n_cp = 0; /* copies a thread left in flight end with it */
		s->f[i]->groups = 0;
	}
	s->bar_arr = 0;
	memset(s->warp_arr, 0, sizeof s->warp_arr);
	/* the fibers pass the CPU among themselves; it comes back here when
	 * none can run */
	fiber_switch(s, NULL, s->f[0]);
	if (s->bad)
		return;
	for (int i = 0; i < n; i++)
		if (s->f[i]->st != T_DONE) {
			report_stuck(s);
			return;
		}
	check_uninit(s);
}

static void block_plain(fz_emu_sched *s, int64_t b)
{
	const fz_emu_launch *L = s->L;
	for (int i = 0; i < L->block && !s->bad; i++) {
		ctx_init(&s->plain, i, L, b);
		L->fn(L->bufs, L->syms, L->flag, &s->plain);
	}
}

/* ---- the scheduler ------------------------------------------------------------------ */

fz_status fz_emu_sched_new(fz_emu_sched **out, char **err)
{
	*out = NULL;
	fz_emu_sched *s = aligned_alloc(64, sizeof *s);
	if (!s) {
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	memset(s, 0, sizeof *s);
	*out = s;
	return FZ_OK;
}

void fz_emu_sched_free(fz_emu_sched *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->nf; i++) {
		munmap(s->f[i]->map, s->f[i]->map_len);
		free(s->f[i]->cp);
		free(s->f[i]);
	}
	free(s->f);
	free(s->tile);
	free(s->tsh);
	free(s);
}

const fz_emu_stats *fz_emu_sched_stats(const fz_emu_sched *s) { return &s->stats; }

fz_status fz_emu_run(fz_emu_sched *s, const fz_emu_launch *L, char **err)
{
	if (err)
		*err = NULL;
	if (L->block < 1 || L->block > MAX_BLOCK || L->grid < 1 || L->grid > INT32_MAX) {
		fz_set_err(err, fz_strdup_printf("emu: kernel %s (region %d): launch of %lld "
					      "blocks of %d threads is outside the GPU's limits",
					      L->kernel, L->region, (long long)L->grid, L->block));
		return FZ_EINVAL;
	}
	if (L->fibers) {
		if (fibers_grow(s, L->block) != FZ_OK) {
			fz_set_err(err, fz_strdup("emu: out of memory for fiber stacks"));
			return FZ_ENOMEM;
		}
		if (s->dirty)
			for (int i = 0; i < s->nf; i++)
				fiber_reset(s->f[i]);
		s->dirty = false;
	}
	fz_emu_sched *saved = fz_emu_current;
	fz_emu_current = s;
	s->L = L;
	s->bad = false;
	s->msg[0] = 0;
	s->nthr = L->block;
	s->stats.launches++;
	for (int64_t b = 0; b < L->grid && !s->bad; b++) {
		s->block = b;
		smem_reset(s);
		if (L->fibers)
			block_fibers(s, b);
		else
			block_plain(s, b);
		s->stats.blocks++;
		s->stats.threads += L->block;
	}
	fz_emu_current = saved;
	s->L = NULL;
	if (!s->bad)
		return FZ_OK;
	/* fibers blocked mid-kernel are abandoned: fresh stacks next time */
	s->dirty = L->fibers;
	fz_set_err(err, fz_strdup(s->msg));
	return FZ_ERUNTIME;
}
