/*
 * ops.c: the tables that expand from ops.def.
 *
 * fz_ops[] gives each op its name, operand count, class, dtype flags and
 * attribute schema. The parser finds ops here by name, the builder checks
 * arity and attributes against it, the verifier and the printer read it, and
 * later stages switch on the enum. Adding an op is one line in ops.def plus
 * its semantics (inference, interpreter, code generator).
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "ir.h"

const fz_opinfo fz_ops[FZ_OP_COUNT] = {
#define OP(id, name, lo, hi, cls, flags, attrs, req) \
	[FZ_OP_##id] = {name, lo, hi, FZ_CLASS_##cls, flags, attrs, req},
#include "ops.def"
#undef OP
};

const char *const fz_attr_names[FZ_ATTR_COUNT] = {
#define ATTR(id, key, kind) [FZ_ATTR_##id] = key,
	FZ_ATTRS(ATTR)
#undef ATTR
};

const char *const fz_class_names[FZ_CLASS_COUNT] = {
	"unary", "binary", "ternary", "creation", "meta", "reduction",
	"indexing", "library", "collective", "wait", "composite", "scan",
	"select", "attention",
};

/* Ops by name: an open-addressed table of the op numbers + 1, filled once
 * (the parser asks twice per statement; a scan of the table with strcmp
 * was 5% of parsing a 32-layer Llama). */
enum { OP_SLOTS = 512 };
static unsigned char op_slot[OP_SLOTS];
static pthread_once_t op_once = PTHREAD_ONCE_INIT;

static unsigned op_hash(const char *s)
{
	uint32_t h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h & (OP_SLOTS - 1);
}

static void op_table_fill(void)
{
	_Static_assert(FZ_OP_COUNT < 255 && 2 * FZ_OP_COUNT < OP_SLOTS,
		       "the op table outgrew its hash table");
	for (int i = 0; i < FZ_OP_COUNT; i++) {
		unsigned h = op_hash(fz_ops[i].name);
		while (op_slot[h])
			h = (h + 1) & (OP_SLOTS - 1);
		op_slot[h] = (unsigned char)(i + 1);
	}
}

int fz_op_from_name(const char *name, fz_opcode *out)
{
	pthread_once(&op_once, op_table_fill);
	for (unsigned h = op_hash(name); op_slot[h]; h = (h + 1) & (OP_SLOTS - 1)) {
		int i = op_slot[h] - 1;
		if (strcmp(fz_ops[i].name, name) == 0) {
			*out = (fz_opcode)i;
			return 1;
		}
	}
	return 0;
}

int fz_attr_from_name(const char *name, fz_attr_id *out)
{
	for (int i = 0; i < FZ_ATTR_COUNT; i++) {
		if (strcmp(fz_attr_names[i], name) == 0) {
			*out = (fz_attr_id)i;
			return 1;
		}
	}
	return 0;
}
