/* Private header of the built-in passes (device/fn/passes_*.c): helpers
 * more than one pass uses. Each is defined in the file named beside it;
 * the files call each other one way only (fusion -> arith -> cse -> prune).
 */
#ifndef PARADEV_FN_PASSES_INT_H
#define PARADEV_FN_PASSES_INT_H

#include "fn_int.h"

/* passes_prune.c: marks dead every live node none of whose outputs reaches
 * a graph output (directly or through other nodes) and returns how many it
 * marked; the caller compacts. */
int fn__mark_unreachable(fn_graph *g);
/* Ends a rewriting pass: marks what became unreachable, compacts when
 * anything changed, adds the nodes marked to *changes, and checks the
 * invariants (INTERNAL naming the node on a violation: the pipeline then
 * rolls the pass back). */
pd_code fn__finish_pass(fn_graph *g, int *changes, dev_status *st);

/* passes_cse.c: attributes of two OP nodes of one def are equal (strings
 * and lists compared by content, floats bit for bit). */
bool fn__attrs_equal(const fn_node *a, const fn_node *b);
/* True for ops whose two nodes with equal inputs may differ, or that must
 * not be moved or evaluated on the host: collectives, function calls,
 * random ops (an attribute "seed"), DeviceId. */
bool fn__op_is_special(const dev_op_def *def);

/* passes_arith.c: when every element of value r (a constant, or a Fill
 * node) is the same number, writes it to *v (as stored in r's dtype) and
 * returns true. */
bool fn__uniform_value(const fn_graph *g, fn_ref r, double *v);
/* Component shapes of a and b equal on every device. */
bool fn__same_shapes(const fn_graph *g, fn_ref a, fn_ref b);
/* Replaces node `old` by a new node of `def` inserted just before it, with
 * inputs in[0..n_in) and attributes attrs[0..n_attrs), origins the union of
 * those of nodes from[0..n_from) (indices before the insertion), and old's
 * name; redirects old's uses to the new node and marks old dead. The new
 * node must infer to old's dtypes and component shapes, else nothing is
 * changed and false is returned (*rc PD_OK), as when the graph already
 * has DEV_FN_MAX_NODES nodes; *rc gets an error only for host memory.
 * *at receives the new node's index (old is then at *at + 1). */
bool fn__replace_node(fn_graph *g, int old, const dev_op_def *def,
                      const fn_ref *in, int n_in, const dev_attr *attrs,
                      int n_attrs, const int *from, int n_from, int *at,
                      pd_code *rc, dev_status *st);

#endif /* PARADEV_FN_PASSES_INT_H */
