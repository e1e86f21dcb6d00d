/* Buffer planning: where each intermediate of one call lives in a per-call,
 * per-device arena (TensorFlow's BFC arena is per allocation; this follows
 * XLA's buffer assignment: offsets by lifetime, decided once per
 * instantiation).
 *
 * The model. Time is the node index: node t reads its inputs and writes its
 * outputs at step t. A value made by node i lives over [i, last], last the
 * largest index of a node reading it (i when none does), inclusive, so a
 * node's inputs and outputs never share bytes. Values not planned
 * (FN_NOT_PLANNED): graph outputs (they outlive the call), args and
 * constants (not made by the call), outputs of DEV_OP_ALIASES_INPUT nodes
 * (Reshape, Identity: they share their input's buffer, whose life then
 * extends to the alias's last use, transitively), and any value a graph
 * output aliases through such nodes. A collective's inputs and outputs
 * (through aliases) live until the end of the call: a device's part of a
 * collective may return while its peers still read its input or write its
 * output (the CPU backend's Broadcast, AllGather and ReduceScatter end
 * without a barrier, and devices run their parts of the body at their own
 * pace), so no later value of any device may take their bytes; run.c keeps
 * the arena of such a call until every device is done with it.
 * Each device is planned on its own (component shapes differ): values
 * sorted by size (largest first, then by start), each placed at the lowest
 * FN_ARENA_ALIGN-aligned offset where it overlaps no placed value whose live
 * range meets its own (first fit in the gaps). unplanned_bytes
 * (fn_unplanned_bytes) is what one allocation per planned value would take,
 * each rounded up to FN_ARENA_ALIGN as in the arena, the largest device's:
 * so arena_bytes <= unplanned_bytes always (first fit never places a value
 * past the sum of the sizes before it), and the two compare like with like;
 * the bytes a call really allocates are fn_transient_bytes (run.c). */
#include <stdlib.h>
#include <string.h>

#include "passes_int.h"

#define K FN_MAX_NODE_OUTPUTS

static pd_code oom(dev_status *st) {
  return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
}

static uint64_t align_up(uint64_t b) {
  return (b + FN_ARENA_ALIGN - 1) / FN_ARENA_ALIGN * FN_ARENA_ALIGN;
}

/* The value r stands for once aliases are followed (node index * K + out,
 * or -1 for an arg or a constant). */
static int alias_root(const fn_graph *g, fn_ref r) {
  while (r.kind == FN_REF_NODE) {
    const fn_node *n = &g->nodes[r.idx];
    if (!(n->kind == FN_NODE_OP && (n->def->flags & DEV_OP_ALIASES_INPUT) &&
          n->n_in > 0))
      return r.idx * K + r.out;
    r = n->in[0];
  }
  return -1;
}

typedef struct value {
  int v; /* node * K + out */
  int start, end;
  uint64_t size; /* aligned, this device */
  uint64_t off;
} value;

static int by_size(const void *a, const void *b) {
  const value *x = a, *y = b;
  if (x->size != y->size) return x->size > y->size ? -1 : 1;
  if (x->start != y->start) return x->start < y->start ? -1 : 1;
  return x->v - y->v;
}

static int by_off(const void *a, const void *b) {
  const value *x = *(const value *const *)a, *y = *(const value *const *)b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* First fit of vals[0..n) (sorted by size) into one arena; returns its size.
 * tmp: room for n pointers. */
static uint64_t place(value *vals, int n, const value **tmp) {
  uint64_t arena = 0;
  for (int i = 0; i < n; i++) {
    int m = 0;
    for (int j = 0; j < i; j++)
      if (vals[j].size && vals[j].start <= vals[i].end &&
          vals[i].start <= vals[j].end)
        tmp[m++] = &vals[j];
    qsort(tmp, (size_t)m, sizeof *tmp, by_off);
    uint64_t off = 0;
    for (int j = 0; j < m && vals[i].size; j++) {
      if (tmp[j]->off >= off + vals[i].size) break; /* the gap fits */
      if (tmp[j]->off + tmp[j]->size > off) off = tmp[j]->off + tmp[j]->size;
    }
    vals[i].off = vals[i].size ? off : 0;
    if (off + vals[i].size > arena) arena = off + vals[i].size;
  }
  return arena;
}

/* Live ranges and which values are planned. end[v] -1: not planned. */
static void live_ranges(const fn_graph *g, int *end) {
  const int nv = g->n_nodes * K;
  for (int v = 0; v < nv; v++) end[v] = -1;
  for (int i = 0; i < g->n_nodes; i++) {
    const fn_node *n = &g->nodes[i];
    if (n->dead || n->kind != FN_NODE_OP) continue;
    bool alias = (n->def->flags & DEV_OP_ALIASES_INPUT) && n->n_in > 0;
    for (int k = 0; k < n->n_out; k++)
      if (!alias) end[i * K + k] = i;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const fn_node *n = &g->nodes[i];
    if (n->dead || n->kind != FN_NODE_OP) continue;
    bool coll = (n->def->flags & DEV_OP_COLLECTIVE) != 0;
    int t = coll ? g->n_nodes : i; /* a collective's: the end of the call */
    for (int j = 0; j < n->n_in; j++) {
      int v = alias_root(g, n->in[j]);
      if (v >= 0 && end[v] >= 0 && end[v] < t) end[v] = t;
    }
    if (coll)
      for (int k = 0; k < n->n_out; k++)
        if (end[i * K + k] >= 0 && end[i * K + k] < t) end[i * K + k] = t;
  }
  for (int o = 0; o < g->n_outputs; o++) {
    int v = alias_root(g, g->outputs[o]);
    if (v >= 0) end[v] = -1;
  }
}

/* Value v's bytes on device d, aligned. */
static uint64_t value_size(const fn_graph *g, int v, int d) {
  const fn_node *nn = &g->nodes[v / K];
  size_t b = 0;
  dev_shape_byte_size(nn->out_dtype[v % K],
                      &nn->out_shape[(v % K) * g->n_dev + d], &b, NULL);
  return align_up(b);
}

uint64_t fn_unplanned_bytes(const fn_graph *g) {
  const int nv = g->n_nodes * K;
  int *end = malloc(sizeof *end * (size_t)(nv ? nv : 1));
  if (!end) return 0;
  live_ranges(g, end);
  uint64_t worst = 0;
  for (int d = 0; d < g->n_dev; d++) {
    uint64_t sum = 0;
    for (int v = 0; v < nv; v++)
      if (end[v] >= 0) sum += value_size(g, v, d);
    if (sum > worst) worst = sum;
  }
  free(end);
  return worst;
}

pd_code fn_plan_buffers(const fn_graph *g, fn_buffer_plan *out,
                        dev_status *st) {
  memset(out, 0, sizeof *out);
  const int nd = g->n_dev > 0 ? g->n_dev : 1, nv = g->n_nodes * K;
  out->n_dev = nd;
  out->arena_bytes = calloc((size_t)nd, sizeof *out->arena_bytes);
  out->offset =
      malloc(sizeof *out->offset * (size_t)(nv ? nv : 1) * (size_t)nd);
  int *end = malloc(sizeof *end * (size_t)(nv ? nv : 1));
  value *vals = malloc(sizeof *vals * (size_t)(nv ? nv : 1));
  const value **tmp = malloc(sizeof *tmp * (size_t)(nv ? nv : 1));
  if (!out->arena_bytes || !out->offset || !end || !vals || !tmp) {
    free(end);
    free(vals);
    free(tmp);
    fn_buffer_plan_free(out);
    return oom(st);
  }
  for (size_t i = 0; i < (size_t)nv * (size_t)nd; i++)
    out->offset[i] = FN_NOT_PLANNED;
  live_ranges(g, end);
  for (int d = 0; d < g->n_dev; d++) {
    int n = 0;
    uint64_t sum = 0;
    for (int v = 0; v < nv; v++) {
      if (end[v] < 0) continue;
      vals[n] = (value){v, v / K, end[v], value_size(g, v, d), 0};
      sum += vals[n].size;
      n++;
    }
    qsort(vals, (size_t)n, sizeof *vals, by_size);
    out->arena_bytes[d] = place(vals, n, tmp);
    for (int k = 0; k < n; k++)
      out->offset[(size_t)vals[k].v * (size_t)nd + (size_t)d] = vals[k].off;
    if (sum > out->unplanned_bytes) out->unplanned_bytes = sum;
  }
  free(end);
  free(vals);
  free(tmp);
  return PD_OK;
}

void fn_buffer_plan_free(fn_buffer_plan *p) {
  if (!p) return;
  free(p->arena_bytes);
  free(p->offset);
  memset(p, 0, sizeof *p);
}
