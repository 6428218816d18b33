/*
 * ops.c: the tables that expand from ops.def.
 *
 * fz_ops[] gives each op its name, operand count, class, dtype flags and
 * attribute schema. The parser finds ops here by name, the builder checks
 * arity and attributes against it, the verifier and the printer read it, and
 * later stages switch on the enum. Adding an op is one line in ops.def plus
 * its semantics (inference, interpreter, code generator).
 */
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
	"select",
};

int fz_op_from_name(const char *name, fz_opcode *out)
{
	for (int i = 0; i < FZ_OP_COUNT; i++) {
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
