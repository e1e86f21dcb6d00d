/* dev_fn_def <-> serialized paradev.v1.FunctionDef, the bytes optimizer
 * plugins read and write (include/paradev/optimizer.h). The wire's
 * RegisterFunction/DescribeFunction converters (server/convert_fn.c) do the
 * same through proto structs; the two are to be folded into one at merge.
 *
 * Thread-safe: no state. Depends on convert.h (the arena) only. */
#ifndef PARADEV_SERVER_OPTIMIZER_CONVERT_H
#define PARADEV_SERVER_OPTIMIZER_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "device.h"

/* Serializes `def` (every field, outputs_info and origins included; no
 * FunctionOptions) into *out (malloc'd, the caller frees it with free) and
 * returns its length in bytes; 0 with `st` set on error: INVALID_ARGUMENT
 * (a dtype or attribute type outside the enums, a shape of rank over
 * PD_MAX_RANK), RESOURCE_EXHAUSTED. An empty FunctionDef serializes to 0
 * bytes too: *out is then a valid 1-byte block and st stays OK. */
size_t srv_fn_def_packed(const dev_fn_def *def, uint8_t **out, dev_status *st);

/* Parses `len` bytes of a serialized FunctionDef into *out: one malloc'd
 * block holding the def and everything it points to, freed with
 * srv_fn_def_unpacked_free (not dev_fn_def_free, which is the engine's for
 * the defs it makes). Checks what the engine's types need (dtypes in range,
 * every attribute with a value, ranks up to PD_MAX_RANK, lists up to
 * DEV_ATTR_LIST_MAX, strings up to DEV_ATTR_STRING_MAX, at most
 * DEV_FN_MAX_NODES nodes and DEV_FN_MAX_ARGS arguments); the graph's own
 * validity (ops, inputs, arity) is the engine's to check.
 * Errors: INVALID_ARGUMENT (not a FunctionDef, or naming the node, argument
 * or attribute that is wrong), RESOURCE_EXHAUSTED. */
pd_code srv_fn_def_unpack(const uint8_t *data, size_t len, dev_fn_def **out,
                          dev_status *st);
void srv_fn_def_unpacked_free(dev_fn_def *def);

#endif /* PARADEV_SERVER_OPTIMIZER_CONVERT_H */
