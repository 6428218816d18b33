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

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
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

typedef enum tstate { T_READY, T_BAR, T_SHFL, T_DONE } tstate;

typedef struct fiber {
	fz_emu_thread ctx;      /* first: the kernel's pointer is the fiber's */
	struct fz_emu_sched *s;
	int idx;                /* its thread index in a block */
	tstate st;
	int32_t site, mask, val, res;
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
	shadow *h = &s->sh[e];
	int32_t me = t->tid, ep = s->epoch;
	if (store) {
		if (h->we == ep && h->w != me)
			violate(s, me, "shared-memory race (write after write): element %lld "
				"of shared array %d, written by thread %d with no barrier "
				"between", (long long)i, arr, h->w);
		else if (h->re == ep && h->r != me)
			violate(s, me, "shared-memory race (write after read): element %lld "
				"of shared array %d, read by thread %s%d with no barrier "
				"between", (long long)i, arr, h->r == -2 ? "(several, e.g.) " : "",
				h->r == -2 ? 0 : h->r);
		h->w = me;
		h->we = ep;
	} else {
		/* a read of an element no thread wrote yet: reported at the
		 * next barrier, unless a write in this epoch shows it a race */
		if (h->we < 0 && h->ur < 0)
			h->ur = me;
		else if (h->we == ep && h->w != me)
			violate(s, me, "shared-memory race (read after write): element %lld "
				"of shared array %d, written by thread %d with no barrier "
				"between", (long long)i, arr, h->w);
		if (h->re != ep) {
			h->r = me;
			h->re = ep;
		} else if (h->r != me) {
			h->r = -2;
		}
	}
	return s->smem + (size_t)e * SMEM_ELEM;
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
}

/* ---- one block ------------------------------------------------------------------- */

/* The 32 lanes of the warp at w0 all wait at a shuffle: each gets lane
 * (lane ^ mask)'s value, computed for all before any resumes. */
static void warp_release(fz_emu_sched *s, int w0)
{
	fiber *a = s->f[w0];
	for (int i = w0 + 1; i < w0 + 32; i++) {
		fiber *b = s->f[i];
		if (b->site != a->site || b->mask != a->mask) {
			violate(s, a->ctx.tid, "warp %d: lane 0 reaches a shuffle (%s %d) "
				"that lane %d never reaches: it waits at another shuffle",
				w0 / 32, a->mask & 0x100 ? "up" : "xor", a->mask & 31, i - w0);
			return;
		}
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

static const char *state_name(const fiber *f)
{
	switch (f->st) {
	case T_BAR: return "waits at a barrier";
	case T_SHFL: return "waits at another shuffle";
	case T_DONE: return "exited";
	default: return "runs";
	}
}

/* No fiber can run and not all are done: say why. */
static void report_stuck(fz_emu_sched *s)
{
	int n = s->nthr;
	for (int w0 = 0; w0 < n && !s->bad; w0 += 32) {
		int w1 = w0 + 32 < n ? w0 + 32 : n, lead = -1;
		for (int i = w0; i < w1 && lead < 0; i++)
			if (s->f[i]->st == T_SHFL)
				lead = i;
		if (lead < 0)
			continue;
		fiber *a = s->f[lead];
		for (int i = w0; i < w1 && !s->bad; i++) {
			fiber *b = s->f[i];
			if (b->st != T_SHFL || b->site != a->site || b->mask != a->mask)
				violate(s, a->ctx.tid, "warp %d: lane %d reaches a shuffle (%s "
					"%d) that lane %d never reaches: it %s", w0 / 32,
					lead - w0, a->mask & 0x100 ? "up" : "xor", a->mask & 31,
					i - w0, state_name(b));
		}
		if (!s->bad)
			violate(s, a->ctx.tid, "a full-warp shuffle in a warp of %d threads "
				"(the block has %d)", w1 - w0, n);
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
}

static void block_fibers(fz_emu_sched *s, int64_t b)
{
	const fz_emu_launch *L = s->L;
	int n = L->block;
	for (int i = 0; i < n; i++) {
		ctx_init(&s->f[i]->ctx, i, L, b);
		s->f[i]->st = T_READY;
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
		free(s->f[i]);
	}
	free(s->f);
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
