/*
 * cache.h: structural keys, the in-memory LRU and the persistent disk LRU.
 *
 * A model's kernels compile once per distinct structure. The 32 layers of
 * Llama-2-7B make the same fusion regions 32 times over, under other value
 * names and sometimes with independent statements written in another
 * order; all of them map to one key, so the first layer compiles and the
 * other 31 hit. A second run, or a run on another machine sharing the
 * cache directory, compiles nothing.
 *
 * The parts, one file each:
 *
 *   canon.c  the canonical form of a region: a text that says what the
 *            kernel computes and nothing else (no names, no node ids, no
 *            written order), and its XXH3-128 hash, the key;
 *   lru.c    a count-bounded LRU map that owns its elements through a
 *            table of callbacks (hash, eq, free), so it frees what it
 *            evicts;
 *   disk.c   the cache directory: one file per entry (header, canonical
 *            form, payload sections, checksum), written to a temporary
 *            file and renamed, checked on every read, evicted by last use
 *            under a size cap;
 *   plan_cache.c  whole programs in the same directory: a trace planned
 *            before at these sizes is loaded, not planned (fz_plan_cached),
 *            and so are its kernel keys (fz_program_canons), so a warm
 *            start goes parse -> hash -> load;
 *   build.c  a region compiled into an entry (PTX or a host object, the
 *            launch metadata, a cubin), with the time of each phase.
 *
 *     fz_key_params kp;  fz_key_params_init(&kp, "sm_90", FZ_CODEGEN_VERSION);
 *     fz_canon *c;       fz_canon_region(trace, region, &kp, &c, &err);
 *     fz_disk *d;        fz_disk_open(NULL, &d, &err);
 *     fz_entry *e;       fz_disk_lookup(d, c->key, c->text, c->len, &e);
 *     if (!e) { ...compile...; fz_disk_store(d, c->key, c->text, c->len, sec, n); }
 */
#ifndef FUSEC_CACHE_H
#define FUSEC_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codegen.h"
#include "ir.h"
#include "plan.h"

/* ---- Keys ---------------------------------------------------------------- */

typedef struct fz_key {
	uint64_t hi, lo;
} fz_key;

#define FZ_KEY_HEX 33 /* 32 hex digits and a NUL */

static inline bool fz_key_eq(fz_key a, fz_key b)
{
	return a.hi == b.hi && a.lo == b.lo;
}

void fz_key_hex(fz_key k, char out[FZ_KEY_HEX]);
bool fz_key_parse(const char *hex, fz_key *out); /* exactly 32 hex digits */
/* The key of bytes: XXH3-128, unless a test replaced the function. */
fz_key fz_key_of(const void *data, size_t len);
/* Tests only: hash with fn instead (NULL restores XXH3-128), so that two
 * different canonical forms can be forced onto one key. */
typedef fz_key (*fz_key_hash_fn)(const void *data, size_t len);
void fz_key_set_hash(fz_key_hash_fn fn);

/* What, besides the region itself, decides the code: filled by the caller
 * (the code generator knows its specialization). */
typedef struct fz_key_params {
	const char *target;       /* "sm_90", "host-x86_64", ... */
	int codegen_version;      /* FZ_CODEGEN_VERSION */
	const char *build_id;     /* FZ_BUILD_ID: a hash of codegen/'s
	                           * sources at build time (fz_build_id) */
	unsigned llvm_major, llvm_minor, llvm_patch;
	/* Specialization bytes from the code generator: 32-bit indexing,
	 * vectorization, per-input layout and alignment class, ... Opaque
	 * here; they enter the key as they are. */
	const uint8_t *spec;
	size_t n_spec;
} fz_key_params;

/* Zeroes kp, sets target and version, the build identity, and the LLVM
 * version of the library fusec runs with (LLVMGetVersion). */
void fz_key_params_init(fz_key_params *kp, const char *target,
                        int codegen_version);
/* The code generator's build identity: 16 hex digits of a hash of its
 * sources, computed when fusec was built (cmake/build_id.cmake). Two
 * builds that could generate different code for one region under one
 * FZ_CODEGEN_VERSION have different ids, so they never share an entry. */
const char *fz_build_id(void);

/* ---- Canonical form ------------------------------------------------------ */

/* The canonical form of one region. Nodes are ordered by depth, then by a
 * structural hash of what they compute (up from the inputs) and of how
 * they are used (down from the outputs); inputs are numbered by first use
 * in that order, symbols by first appearance, outputs by their node. The
 * code generator compiles the region seen in this order
 * (fz_canon_region_view), so a kernel's parameters are the canonical
 * inputs, then the canonical outputs, and one kernel serves every region
 * with the same key. */
typedef struct fz_canon {
	fz_key key;
	char *text;              /* the canonical form, NUL-terminated */
	size_t len;              /* strlen(text) */
	int n_nodes;
	fz_node **nodes;         /* the region's nodes, canonical order */
	int n_in, n_out;
	fz_value **in, **out;    /* region inputs and outputs, canonical order */
	int *in_pos, *out_pos;   /* canonical i is region->in[in_pos[i]] */
	int n_syms;
	int syms[FZ_MAX_SYMS];   /* canonical symbol i is trace symbol syms[i] */
} fz_canon;

fz_status fz_canon_region(const fz_trace *t, const fz_region *r,
                          const fz_key_params *kp, fz_canon **out, char **err);
void fz_canon_free(fz_canon *c);
/* c under another specialization: the same form with its "spec" line
 * written from spec[0..n_spec) and the key hashed again, exactly what
 * fz_canon_region makes with that spec, at the cost of a copy (a
 * program's cached forms serve every variant of its kernels). FZ_EINVAL
 * when c has no spec line. */
fz_status fz_canon_respec(const fz_canon *c, const uint8_t *spec, size_t n_spec,
                          fz_canon **out);
/* *out = *r with nodes, in and out in canonical order (arrays borrowed
 * from c, valid while c lives). */
void fz_canon_region_view(const fz_canon *c, const fz_region *r,
                          fz_region *out);
/* A short description from a canonical form: "normalization: cast mul sum
 * ... | bf16[s0,s1,4096]" into buf. */
void fz_canon_describe(const char *text, size_t len, char *buf, size_t n);
/* The value of line "NAME VALUE" of a canonical form ("target"), or "". */
void fz_canon_field(const char *text, size_t len, const char *name, char *buf,
                    size_t n);

/* ---- In-memory LRU ------------------------------------------------------- */

/* How the LRU treats its keys and values. free releases one element (key
 * and value together); it runs on eviction, replacement, removal and
 * fz_lru_free. */
typedef struct fz_lru_ops {
	uint64_t (*hash)(const void *key);
	bool (*eq)(const void *a, const void *b);
	void (*free)(void *key, void *value, void *ctx); /* may be NULL */
} fz_lru_ops;

typedef struct fz_lru fz_lru;

/* An LRU holding at most cap elements (cap >= 1). */
fz_status fz_lru_new(size_t cap, const fz_lru_ops *ops, void *ctx,
                     fz_lru **out);
void fz_lru_free(fz_lru *l);
/* The value of key, made most recently used; NULL if absent. */
void *fz_lru_get(fz_lru *l, const void *key);
/* Inserts key -> value, owning both from now on (on failure too: they are
 * freed). An element with an equal key is replaced and freed; past the
 * cap, the least recently used element is evicted and freed. */
fz_status fz_lru_put(fz_lru *l, void *key, void *value);
/* Removes and frees key's element; false if absent. */
bool fz_lru_remove(fz_lru *l, const void *key);
size_t fz_lru_count(const fz_lru *l);
size_t fz_lru_evictions(const fz_lru *l);
/* Visits the elements from most to least recently used. */
void fz_lru_each(const fz_lru *l,
                 void (*fn)(const void *key, void *value, void *arg), void *arg);

/* ---- Disk cache ---------------------------------------------------------- */

#define FZ_DISK_FORMAT 1          /* the layout ($DIR/v1) and entry format */
#define FZ_SECTION_TAG 16         /* bytes of a section tag, NUL-padded */
#define FZ_ENTRY_MAX_SECTIONS 16
#define FZ_DISK_DEFAULT_MAX ((int64_t)2 << 30)

/* A payload section: "ptx", "meta", "llvm", "cubin.sm_90", ... */
typedef struct fz_section {
	char tag[FZ_SECTION_TAG];
	const void *data;
	size_t len;
} fz_section;

/* An entry read back: everything points into one block. */
typedef struct fz_entry {
	fz_key key;
	uint32_t version;
	const char *canon;       /* not NUL-terminated: canon_len bytes */
	size_t canon_len;
	int n_sections;
	fz_section sections[FZ_ENTRY_MAX_SECTIONS];
	size_t size;             /* bytes of the file */
	void *block;
	size_t mapped;           /* block is the file mapped (read only), or 0 */
} fz_entry;

const fz_section *fz_entry_section(const fz_entry *e, const char *tag);
void fz_entry_free(fz_entry *e);

typedef struct fz_disk_options {
	const char *dir;        /* NULL: $FUSEC_CACHE_DIR, $XDG_CACHE_HOME/fusec,
	                           ~/.cache/fusec */
	int64_t max_bytes;      /* 0: $FUSEC_CACHE_MAX_SIZE, else 2 GiB */
	/* Warnings (a damaged entry removed, a refused file, caching turned
	 * off): each said once. NULL: kept silent. */
	void (*warn)(void *ctx, const char *msg);
	void *warn_ctx;
} fz_disk_options;

typedef struct fz_disk fz_disk;

typedef struct fz_disk_stats {
	int64_t entries, bytes, max_bytes;
	uint64_t hits, misses, stores, evictions, removed_bad;
} fz_disk_stats;

/* One entry as ls shows it. */
typedef struct fz_disk_info {
	fz_key key;
	int64_t size;
	int64_t last_use;        /* seconds since the epoch */
} fz_disk_info;

/* "1.5G", "200M", "64k", "1024" (bytes; k M G T are powers of 1024, an
 * optional trailing B or iB); false if malformed. */
bool fz_size_parse(const char *s, int64_t *out);
/* The directory the options name (a heap string). */
fz_status fz_cache_dir(const char *dir, char **out, char **err);

/* Opens (creating, 0700) the cache. A directory that cannot be created or
 * used (read-only, not ours, writable by others) is not an error: the
 * cache comes up disabled, every lookup misses, and the reason is warned
 * once and kept in fz_disk_disabled. */
fz_status fz_disk_open(const fz_disk_options *o, fz_disk **out, char **err);
/* Flushes the hit and miss counters; accepts NULL. */
void fz_disk_close(fz_disk *d);
const char *fz_disk_path(const fz_disk *d);          /* $DIR/v1 */
const char *fz_disk_disabled(const fz_disk *d);      /* reason, or NULL */
bool fz_disk_writable(const fz_disk *d);

/* The entry for key whose canonical form is canon[0..len): *out, or NULL
 * on a miss (absent, damaged, refused, or another form under the key). A
 * hit stamps the entry's last use. Safe to call from many threads. */
fz_status fz_disk_lookup(fz_disk *d, fz_key key, const char *canon, size_t len,
                         fz_entry **out);
/* Stores an entry atomically (temporary file, then rename) and evicts past
 * the size cap. A full disk or a read-only directory turns storing off
 * with one warning and returns FZ_OK. */
fz_status fz_disk_store(fz_disk *d, fz_key key, const char *canon, size_t len,
                        const fz_section *sections, int n_sections);

/* Maintenance, for fusec-cache. */
fz_status fz_disk_stat(fz_disk *d, fz_disk_stats *out);
/* Every entry, most recently used first; *out is freed with free. */
fz_status fz_disk_list(fz_disk *d, fz_disk_info **out, int *n);
/* Reads and checks one entry without the canonical form to compare: *out,
 * or NULL with the reason in *why (a static string). Stamps nothing. */
fz_status fz_disk_read(fz_disk *d, fz_key key, fz_entry **out,
                       const char **why);
/* Checks every file the cache keeps; calls report(path, why) for each bad
 * one and removes it when fix. *n_bad: how many. */
fz_status fz_disk_verify(fz_disk *d, bool fix,
                         void (*report)(void *ctx, const char *path,
                                        const char *why),
                         void *ctx, int *n_bad);
/* Evicts least recently used entries until the cache holds at most
 * max_bytes. An entry that cannot be removed (a read-only cache) is
 * FZ_EIO with *err saying how many and why (freed with free); *removed
 * and *freed count what went. */
fz_status fz_disk_prune(fz_disk *d, int64_t max_bytes, int *removed,
                        int64_t *freed, char **err);
/* Removes every entry; errors as fz_disk_prune's. */
fz_status fz_disk_clear(fz_disk *d, int *removed, char **err);
/* Stores that did not happen in this process (storing off: read-only or
 * full; an entry whose own name is taken by a directory; a disabled
 * cache), with the first one's reason in *why (owned by d). */
uint64_t fz_disk_not_stored(fz_disk *d, const char **why);

/* ---- Programs (plan_cache.c) -------------------------------------------- */

/* The program fz_plan makes of t under o, from the cache when an entry for
 * (t, o's sizes, o's options) is there, else planned and stored: the warm
 * start of `fusec compile` and of a prepared program.
 *
 *     fz_disk *d;      fz_disk_open(NULL, &d, &err);
 *     fz_program *p;   bool hit;
 *     fz_plan_cached(d, trace, &opts, &p, &hit, &err);  ... fz_program_free(p);
 *
 * d NULL or disabled, or o asking for a dump (dump_after >= 0): plans,
 * stores nothing. The key is the hash of the form fz_plan_form writes (the
 * trace's image, without value names, the sizes and the options); the
 * entry keeps that form and is compared on lookup. An entry that is
 * damaged, or whose payload does not read back as a program of t, is a
 * miss: the program is planned again and the entry replaced. The program
 * returned is the one fz_plan would make (same regions, nodes, order,
 * offsets); its trace is t, which must outlive it. Errors are fz_plan's. */
fz_status fz_plan_cached(fz_disk *d, const fz_trace *t,
                         const fz_plan_options *o, fz_program **out,
                         bool *hit, char **err);
/* fz_plan_cached, calling on_plan(ctx) (when not NULL) right before it
 * plans, that is on a miss: a caller starts there what it does beside the
 * planning of a cold start (`fusec compile` sets up its compilers). */
fz_status fz_plan_cached_hook(fz_disk *d, const fz_trace *t,
                              const fz_plan_options *o,
                              void (*on_plan)(void *ctx), void *ctx,
                              fz_program **out, bool *hit, char **err);
/* The compared form and the payload, for tests and tools. *form and *data
 * are freed with free. */
fz_status fz_plan_form(const fz_trace *t, const fz_plan_options *o,
                       void **form, size_t *len);
fz_status fz_plan_serialize(const fz_program *p, void **data, size_t *len);
/* FZ_EINVAL when data is not a program of t (every id checked). */
fz_status fz_plan_deserialize(const fz_trace *t, const fz_plan_options *o,
                              const void *data, size_t len, fz_program **out);

struct fz_cg_options;

/* The canonical form of every kernel region of p for compiler options o,
 * as fz_canon_region makes it with fz_cache_target(o) and FZ_CODEGEN_VERSION
 * and each region's fz_cache_spec: (*out)[r] for kernel region r, NULL
 * for the others; free with fz_program_canons_free. From the cache (one
 * entry per program and options, compared and checked like the program's)
 * when there, else computed and stored; d NULL or disabled: computed.
 * *hit says which. p must be the program of a trace that outlives *out. */
fz_status fz_program_canons(fz_disk *d, const fz_program *p,
                            const struct fz_cg_options *o, fz_canon ***out,
                            bool *hit, char **err);
/* The same for regions rs[r] in place of p->regions[r] (NULL: none; a
 * kernel region with the views it reads folded in, as runtime/kernels.c
 * compiles it: its nodes are its own and those of the views), filed under
 * their node and input counts beside the specs. */
fz_status fz_program_canons_of(fz_disk *d, const fz_program *p,
                               const fz_region *const *rs,
                               const struct fz_cg_options *o, fz_canon ***out,
                               bool *hit, char **err);
void fz_program_canons_free(const fz_program *p, fz_canon **cs);

/* ---- Cubins through nvJitLink -------------------------------------------- */

/* True when libnvJitLink could be opened (dlopen, once). */
bool fz_jitlink_available(void);
/* The cubin for sm (90 for sm_90) from PTX text: FZ_EUNSUPPORTED when
 * nvJitLink is absent, FZ_ERUNTIME with its log on failure. *cubin is
 * freed with free. */
fz_status fz_jitlink_cubin(const char *ptx, size_t len, int sm, void **cubin,
                           size_t *cubin_len, char **err);

/* ---- Compiling through the cache (build.c) ------------------------------ */

struct fz_compiler;
struct fz_cg_options;

/* The key's target for a compiler's options: "sm_90", or for the host
 * "host-TRIPLE-CPU-FEATURES" (host code is tuned to the CPU it is built
 * on; FEATURES: 16 hex digits hashing LLVM's list of the CPU's features),
 * or for the emulated GPU "emu-sm_90[+fault-F][+idx64]-host-TRIPLE-CPU-
 * FEATURES". */
void fz_cache_target(const struct fz_cg_options *o, char *buf, size_t n);
/* The specialization bytes for compiling region r with options o: 32-bit
 * indexing, vectorization, one layout and alignment class per input. */
size_t fz_cache_spec(const struct fz_cg_options *o, const fz_region *r,
                     uint8_t *buf, size_t cap);

/* The canonical form (and key) of region r of t compiled with options o
 * for the key target `target` (fz_cache_target of o): the one place that
 * puts the code generator's version and specialization into a key, for
 * the kernel module, the program cache and the benchmarks alike. */
fz_status fz_cache_canon(const fz_trace *t, const fz_region *r,
                         const struct fz_cg_options *o, const char *target,
                         fz_canon **out, char **err);

typedef struct fz_build_info {
	bool want_code;        /* in: hand the code back (object, or ptx and cubin) */
	bool cubin;            /* a cubin was built and stored */
	char *cubin_error;     /* why not, when nvJitLink failed (free it) */
	size_t code_bytes, cubin_bytes;
	void *object;          /* host, when want_code: the object (free it) */
	size_t object_len;
	char *ptx;             /* NVPTX, when want_code: PTX text (free it) */
	void *cubin_data;      /* NVPTX, when want_code and built (free it) */
	fz_kernel kernel;      /* the launch record, as "meta" stores it */
	/* Where the time went: LLVM IR built and optimized, PTX or the host
	 * object emitted, the cubin linked, the entry stored. */
	double llvm_seconds, code_seconds, cubin_seconds, store_seconds;
} fz_build_info;

/* The seconds every fz_cache_build of this process has spent in each phase
 * (llvm_seconds, code_seconds, ...), summed over threads: a tool reads it
 * before and after to report where a compile's time went. */
typedef struct fz_build_times {
	double llvm, code, cubin, store;
	int builds;
} fz_build_times;
void fz_cache_build_times(fz_build_times *out);

/* Compiles region r of t (whose canonical form is cn) with compiler c and
 * stores the entry in d (NULL: stores nothing): PTX (NVPTX) or a host
 * object whose entry point is fz_cache_entry_name(key), the kernel's launch
 * metadata, and, when cubins and nvJitLink is present, the cubin for the
 * compiler's arch. FZ_EUNSUPPORTED when the skeletons do not take the
 * region. info is zeroed first, except want_code, which it reads. */
fz_status fz_cache_build(struct fz_compiler *c, fz_disk *d, const fz_trace *t,
                         const fz_region *r, const fz_canon *cn, bool cubins,
                         fz_build_info *info, char **err);
/* Does entry e hold what a kernel for options o needs ("meta", and "ptx" or
 * "obj")? An entry that does not is a miss to its callers. */
bool fz_cache_usable(const fz_entry *e, const struct fz_cg_options *o);
/* The launch record of entry e's "meta" section (no module, no code):
 * FZ_EINVAL when it is missing or malformed. */
fz_status fz_cache_meta_read(const fz_entry *e, fz_kernel *k);
/* The host entry point of key's kernel: "fz_" and 32 hex digits. */
void fz_cache_entry_name(fz_key key, char *buf, size_t n);
/* Links entry e's host object into compiler c's JIT: *fn, after checking
 * that its metadata names one entry point and n_in inputs, n_out outputs. */
fz_status fz_cache_load_host(struct fz_compiler *c, const fz_entry *e,
                             int n_in, int n_out,
                             void (**fn)(void **, const int64_t *, int32_t *,
                                         int64_t, int64_t),
                             char **err);

#endif
