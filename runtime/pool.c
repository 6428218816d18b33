/*
 * pool.c: the CPU target's thread pool (pool.h).
 *
 * The state of a job (its function, argument, part count and the counters
 * next and finished) lives in the pool, under one mutex for what the
 * threads wait on and two atomics for the parts:
 *
 *     caller                               worker
 *     lock job_mu (one job at a time)
 *     lock mu; wait until active == 0      lock mu
 *     fn, arg, nparts; next = finished = 0 wait until gen != seen (or quit)
 *     gen++; broadcast wake; unlock        seen = gen; active++; copy the job
 *     take parts (next++ < nparts)         unlock; take parts
 *     lock mu; wait until finished ==      lock mu; active--; broadcast idle
 *     nparts; unlock; unlock job_mu
 *
 * The last part to finish broadcasts `done` under mu, so the caller's
 * check cannot miss it. A worker that wakes late (the job already done)
 * takes no part: next is past nparts. A new job waits until no worker is
 * still inside the previous one (active == 0), so no worker can take a
 * part of the new job with the old job's function: workers copy the job
 * under the mutex when they join it, and the counters are reset only
 * when nobody is left holding a copy.
 *
 * Waiting is a short spin, then sleeping on condition variables. A worker
 * that sleeps between jobs takes a futex wake and a turn of the scheduler
 * to join the next one (tens of microseconds, and on a busy machine often
 * more than a small kernel's whole run: sum(g * x * r, dims=[0]) over
 * [512, 1024] f32 took 115 us on one thread and a median of 114 on two,
 * the second thread joining late or not at all). So a worker that has
 * done its part watches gen for FZ_POOL_SPIN_US (50 us, or
 * $FUSEC_POOL_SPIN_US; 0: never) before it sleeps, pausing between
 * looks, and joins a job that comes meanwhile at once; the caller
 * watches `finished` as long before it sleeps on `done`. A spin is
 * bounded, so on a shared machine a spinning thread takes at most that
 * long from the thread that has the work, once per job; back-to-back
 * jobs (a training step's kernels) are where it pays.
 *
 * OpenMP's team. A process that already runs an OpenMP runtime (PyTorch
 * runs its CPU ops on libgomp's team) would otherwise hold two sets of
 * threads for the same cores: libgomp's spin for a while after each
 * parallel region (GOMP_SPINCOUNT, 300000 pauses by default: milliseconds
 * on a core whose pause takes 140 cycles), so a fusec job that comes
 * right after a torch op runs with its worker's core taken, and fusec's
 * spinning worker takes one from the torch op after it. So where
 * GOMP_parallel is already in the process (found with dlsym: fusec never
 * loads an OpenMP runtime itself), a job runs on that team instead, its
 * parts handed out by the same kind of counter, as Inductor's generated
 * C++ runs on it. Measured here on two cores with nothing else running:
 * the Llama step of tools/bench/step_bench.py at hidden 256, T=128, two
 * threads, went from 0.80 and 0.82 of Inductor's speed to 0.93 and 0.93
 * (two runs each way, alternating); sum(g * x * r, dims=[0]) over [512,
 * 1024] f32 took 159 us a call on fusec's threads and 86 on the team,
 * 252 and 129 us between calls of the same function in eager PyTorch.
 * The price is the team's: GOMP_parallel returns only when every thread
 * of the team has come and gone, and on a machine with more runnable
 * threads than cores a thread that is not scheduled holds it up for a
 * time slice. With two busy loops beside it on the two cores, that sum
 * took 8.0 ms a call on the team against 0.22 ms on fusec's threads,
 * which finish without a worker that never woke (PyTorch's own ops, on
 * the same team, took 1.4 to 24 ms there). fusec then behaves as the
 * framework it runs in does; $FUSEC_POOL=own keeps its own threads.
 *
 * Forks. A child has only the thread that called fork: the pool's workers
 * stay behind in the parent, a mutex one of them held is held forever,
 * and libgomp's team, once the parent has used it, hangs the child's next
 * parallel region at its barrier (PyTorch's own ops too, which is why its
 * DataLoader workers set one thread). A compiled function called in a
 * forked worker hung there for good. So a fork is counted (pthread_atfork,
 * in the child), a pool remembers the count it was made at, and a pool
 * from before the fork runs its jobs on the calling thread, part after
 * part, and says it has one thread (so the BLAS is told one too); freeing
 * it joins no thread. (A CPU device first opened in the child, none
 * being open at the fork, makes a pool of its own there.)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <dlfcn.h>

#include "pool.h"
#include "ir.h"

/* libgomp's entry for `#pragma omp parallel`: fn(data) on num_threads
 * threads (0: the runtime's default), the caller's included; it returns
 * when all have. */
typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data,
				 unsigned num_threads, unsigned flags);

struct fz_pool {
	int n;                   /* threads, the caller's included */
	pthread_t *th;           /* n - 1 workers */
	int started;             /* workers created */
	pthread_mutex_t job_mu;  /* one job at a time */
	pthread_mutex_t mu;
	pthread_cond_t wake;     /* a new job (gen) or quit */
	pthread_cond_t done;     /* finished reached nparts, or active fell */
	atomic_ulong gen;        /* written under mu; a spinning worker reads it */
	int64_t spin_ns;         /* how long a waiter spins before it sleeps */
	bool quit;
	int active;              /* workers holding a copy of the job */
	fz_pool_fn fn;
	void *arg;
	int nparts;
	atomic_int next;         /* the next part to hand out */
	atomic_int finished;     /* parts returned */
	gomp_parallel_fn omp;    /* the process's OpenMP team, or NULL */
	int forks;               /* the forks count when the pool was made */
};

static atomic_int forks; /* forks this process descends by (see "Forks") */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void count_fork(void) { atomic_fetch_add(&forks, 1); }
static void handle_forks(void) { pthread_atfork(NULL, NULL, count_fork); }

/* a pool made in a parent of this process: its threads are not here */
static bool orphaned(const fz_pool *p)
{
	return p->forks != atomic_load_explicit(&forks, memory_order_relaxed);
}

static _Thread_local fz_pool *running; /* the pool whose part this thread runs */

#define FZ_POOL_SPIN_US 50

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* Spins up to p->spin_ns until *x differs from old (gen: a new job) or,
 * with `until` >= 0, reaches it (finished: the job done). true: it did. */
static bool spin_until(const fz_pool *p, atomic_ulong *g, unsigned long old,
		       atomic_int *x, int until)
{
	if (p->spin_ns <= 0)
		return false;
	int64_t end = 0;
	for (unsigned i = 0;; i++) {
		if (g ? atomic_load_explicit(g, memory_order_acquire) != old :
		    atomic_load_explicit(x, memory_order_acquire) >= until)
			return true;
		if ((i & 63) == 0) {
			int64_t t = now_ns();
			if (!end)
				end = t + p->spin_ns;
			else if (t >= end)
				return false;
		}
		cpu_relax();
	}
}

int fz_cpu_count(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) == 0) {
		int n = CPU_COUNT(&set);
		if (n > 0)
			return n;
	}
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

/* Takes parts of the job (fn, arg, nparts) from the counter next until
 * none is left; with finished (fusec's own threads), counts each part
 * returned and wakes the caller at the last. */
static void take_parts(fz_pool *p, atomic_int *next, atomic_int *finished, fz_pool_fn fn,
		       void *arg, int nparts)
{
	fz_pool *outer = running;
	running = p;
	for (;;) {
		int i = atomic_fetch_add(next, 1);
		if (i >= nparts)
			break;
		fn(arg, i, nparts);
		if (finished && atomic_fetch_add(finished, 1) + 1 == nparts) {
			pthread_mutex_lock(&p->mu);
			pthread_cond_broadcast(&p->done);
			pthread_mutex_unlock(&p->mu);
		}
	}
	running = outer;
}

static void *worker(void *arg)
{
	fz_pool *p = arg;
	unsigned long seen = 0;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		if (!p->quit && atomic_load(&p->gen) == seen && p->spin_ns > 0) {
			pthread_mutex_unlock(&p->mu);
			spin_until(p, &p->gen, seen, NULL, 0);
			pthread_mutex_lock(&p->mu);
		}
		while (!p->quit && atomic_load(&p->gen) == seen)
			pthread_cond_wait(&p->wake, &p->mu);
		if (p->quit)
			break;
		seen = atomic_load(&p->gen);
		p->active++;
		fz_pool_fn fn = p->fn;
		void *a = p->arg;
		int nparts = p->nparts;
		pthread_mutex_unlock(&p->mu);
		take_parts(p, &p->next, &p->finished, fn, a, nparts);
		pthread_mutex_lock(&p->mu);
		if (--p->active == 0)
			pthread_cond_broadcast(&p->done);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

/* The process's GOMP_parallel, unless $FUSEC_POOL says "own". */
static gomp_parallel_fn find_openmp(void)
{
	const char *kind = getenv("FUSEC_POOL");
	if (kind && strcmp(kind, "own") == 0)
		return NULL;
	gomp_parallel_fn f;
	void *sym = dlsym(RTLD_DEFAULT, "GOMP_parallel");
	memcpy(&f, &sym, sizeof f);
	return f;
}

fz_status fz_pool_new(int threads, fz_pool **out, char **err)
{
	*out = NULL;
	if (threads <= 0)
		threads = fz_cpu_count();
	if (threads > 1024)
		threads = 1024;
	fz_pool *p = calloc(1, sizeof *p);
	if (!p || !(p->th = calloc((size_t)threads, sizeof *p->th))) {
		free(p);
		if (err)
			*err = fz_strdup("out of memory");
		return FZ_ENOMEM;
	}
	p->n = threads;
	pthread_once(&fork_once, handle_forks);
	p->forks = atomic_load(&forks);
	pthread_mutex_init(&p->job_mu, NULL);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_cond_init(&p->done, NULL);
	atomic_init(&p->next, 0);
	atomic_init(&p->finished, 0);
	atomic_init(&p->gen, 0);
	p->spin_ns = (int64_t)FZ_POOL_SPIN_US * 1000;
	const char *sp = getenv("FUSEC_POOL_SPIN_US");
	if (sp && *sp) {
		char *end;
		long us = strtol(sp, &end, 10);
		if (*end == 0 && us >= 0 && us <= 100000)
			p->spin_ns = (int64_t)us * 1000;
	}
	if (threads > 1 && (p->omp = find_openmp())) {
		*out = p;
		return FZ_OK;
	}
	for (int i = 0; i < threads - 1; i++) {
		int rc = pthread_create(&p->th[i], NULL, worker, p);
		if (rc) {
			if (err)
				*err = fz_strdup_printf("cannot start thread %d of the CPU "
							"pool: %s", i + 1, strerror(rc));
			fz_pool_free(p);
			return FZ_ERUNTIME;
		}
		p->started++;
	}
	*out = p;
	return FZ_OK;
}

void fz_pool_free(fz_pool *p)
{
	if (!p)
		return;
	if (orphaned(p)) { /* no thread to join; the mutexes may be held */
		free(p->th);
		free(p);
		return;
	}
	pthread_mutex_lock(&p->mu);
	p->quit = true;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < p->started; i++)
		pthread_join(p->th[i], NULL);
	pthread_cond_destroy(&p->wake);
	pthread_cond_destroy(&p->done);
	pthread_mutex_destroy(&p->mu);
	pthread_mutex_destroy(&p->job_mu);
	free(p->th);
	free(p);
}

int fz_pool_threads(const fz_pool *p) { return p && !orphaned(p) ? p->n : 1; }

const char *fz_pool_kind(const fz_pool *p)
{
	return p && p->omp ? "openmp" : "own";
}

int fz_pool_parts(const fz_pool *p, int64_t items, int64_t min_items)
{
	int threads = fz_pool_threads(p), most = 4 * threads;
	if (threads <= 1 || items <= 0)
		return 1;
	int64_t n = items / (min_items > 0 ? min_items : 1);
	return n < 1 ? 1 : n > most ? most : (int)n;
}

/* A job on the OpenMP team: each of its threads takes parts as fz_pool's
 * own threads do, from a counter of the job's own (jobs of several
 * callers may run at once, each on its team); GOMP_parallel's return is
 * the wait for the last. */
typedef struct omp_job {
	fz_pool *p;
	fz_pool_fn fn;
	void *arg;
	int nparts;
	atomic_int next;
} omp_job;

static void omp_body(void *data)
{
	omp_job *j = data;
	take_parts(j->p, &j->next, NULL, j->fn, j->arg, j->nparts);
}

void fz_pool_run(fz_pool *p, int nparts, fz_pool_fn fn, void *arg)
{
	if (nparts <= 0)
		return;
	if (p && orphaned(p))
		p = NULL; /* in order, here */
	if (p && p->omp && nparts > 1 && running != p) {
		omp_job j = {p, fn, arg, nparts, 0};
		unsigned n = (unsigned)(nparts < p->n ? nparts : p->n);
		p->omp(omp_body, &j, n, 0);
		return;
	}
	if (!p || p->started == 0 || nparts == 1 || running == p) {
		/* no workers, nothing to share, or a part of this pool's own
		 * job asking: in order, here */
		for (int i = 0; i < nparts; i++)
			fn(arg, i, nparts);
		return;
	}
	pthread_mutex_lock(&p->job_mu);
	pthread_mutex_lock(&p->mu);
	while (p->active > 0)
		pthread_cond_wait(&p->done, &p->mu);
	p->fn = fn;
	p->arg = arg;
	p->nparts = nparts;
	atomic_store(&p->next, 0);
	atomic_store(&p->finished, 0);
	atomic_fetch_add(&p->gen, 1);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	take_parts(p, &p->next, &p->finished, fn, arg, nparts);
	spin_until(p, NULL, 0, &p->finished, nparts);
	pthread_mutex_lock(&p->mu);
	while (atomic_load(&p->finished) < nparts)
		pthread_cond_wait(&p->done, &p->mu);
	pthread_mutex_unlock(&p->mu);
	pthread_mutex_unlock(&p->job_mu);
}
