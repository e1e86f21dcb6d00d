/* The op reference's printers (cli_ops.c), shared by `paradev ops` (cli.c)
 * and tools/gen_ops_md.c, which writes docs/ops.md. They need no daemon:
 * only pd_op_info, pd_dtype_name and pd_attr_kind_name. */
#ifndef PARADEV_CLI_OPS_H
#define PARADEV_CLI_OPS_H

#include <stdio.h>

#include "paradev/paradev.h"

/* One line per op: name, inputs -> outputs, summary. */
void cli_ops_print_table(FILE *f, const pd_op_info *ops, int n);
/* One op in full: inputs with dtypes, outputs, attributes with kind,
 * default and range, gradient, collective, notes. */
void cli_ops_print_one(FILE *f, const pd_op_info *op);
/* docs/ops.md: an index table, then a section per op. */
void cli_ops_print_markdown(FILE *f, const pd_op_info *ops, int n);

#endif /* PARADEV_CLI_OPS_H */
