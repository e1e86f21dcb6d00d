/* One device's part of a function call (the executor's, exec.c run_op ->
 * dev__fn_call.run): the body's nodes in order on this device's
 * components. Intermediates live in the call's buffer arena (one
 * allocation per call per device, at the plan's offsets) or, where the
 * plan leaves a value out (FN_NOT_PLANNED, or no plan at all), in an
 * allocation of their own; graph outputs are written straight into the
 * call's output components; aliasing ops (DEV_OP_ALIASES_INPUT) share
 * their input's bytes. Collective nodes run through the backend with the
 * rendezvous the call made at prepare, and every device calls every one of
 * them in order, passing `failed` after an earlier failure, so no peer
 * waits forever. Memory is freed after the last node: on the CPU the work
 * is done by then; on CUDA deallocate is stream-ordered (cudaFreeAsync on
 * the device's stream), so the frees follow the kernels issued before.
 * A body with collectives is different: a device's part of a collective
 * may return while its peers still read its input (the CPU backend's
 * Broadcast, AllGather and ReduceScatter end without a barrier, as eager
 * collectives do, whose inputs the op holds until every device is done) or
 * write its output, so a device that finishes early must neither reuse
 * nor free those bytes. The buffer plan keeps a collective's operands
 * live until the end of the call (passes_buffers.c), and the run hands
 * its arena and allocations to the call state (fn_call_state.mem), which
 * frees them when the op is freed, after every device is done with it
 * (fenced backends: after every device's fence; fn_run_release).
 *
 * Errors name the function and the original node(s) (fn_node_describe):
 * "function 'step', node 'dense1/relu' (fused from ...): <kernel message>
 * (on cpu:1)". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fn_call.h"

/* What one device's run of a call holds. */
typedef struct run_state {
  const fn_inst *inst;
  const fn_graph *g;
  dev_backend *b;
  int d;   /* the component index: position in the call's set */
  int dev; /* the engine device (backend calls, names) */
  const void *const *in_data;
  void *const *out_data;
  void **val;  /* [n_nodes * FN_MAX_NODE_OUTPUTS] */
  size_t *own; /* bytes + 1 of an allocation of its own, else 0 */
  char *arena;
  const uint64_t *fixed; /* CUDA graphs: every value's offset in arena */
} run_state;

static uint64_t ref_bytes(const fn_graph *g, fn_ref r, int d) {
  return (uint64_t)pd_dtype_size(fn_ref_dtype(g, r)) *
         (uint64_t)dev_num_elems(fn_ref_shape(g, r, d));
}

static const void *ref_data(const run_state *s, fn_ref r) {
  switch (r.kind) {
    case FN_REF_ARG: return s->in_data[r.idx];
    case FN_REF_CONST: {
      const dev_buffer *buf = s->inst->consts[r.idx]->comps[s->d].buf;
      return buf ? buf->data : NULL;
    }
    case FN_REF_NODE: return s->val[r.idx * FN_MAX_NODE_OUTPUTS + r.out];
  }
  return NULL;
}

/* The graph output that value (i, k) is written into directly: the first
 * output naming it, or -1. */
static int direct_output(const fn_graph *g, int i, int k) {
  fn_ref r = fn_node_ref(i, k);
  for (int o = 0; o < g->n_outputs; o++)
    if (fn_ref_eq(g->outputs[o], r)) return o;
  return -1;
}

/* Where value (i, k) lives on device d (place_output and
 * fn_transient_bytes agree through this; a CUDA graph's layout overrides
 * the arena and own allocations): *o the graph output it is written into,
 * *off its arena offset. */
enum { PL_OUTPUT, PL_ALIAS, PL_ARENA, PL_OWN };
static int placement(const fn_inst *inst, int i, int k, int d, int *o,
                     uint64_t *off) {
  const fn_graph *g = inst->g;
  const fn_node *n = &g->nodes[i];
  *o = direct_output(g, i, k);
  if (*o >= 0) return PL_OUTPUT;
  if (k == 0 && (n->def->flags & DEV_OP_ALIASES_INPUT) && n->n_in > 0 &&
      ref_bytes(g, n->in[0], d) == ref_bytes(g, fn_node_ref(i, k), d))
    return PL_ALIAS;
  const fn_buffer_plan *p = &inst->plan;
  const size_t slot = (size_t)(i * FN_MAX_NODE_OUTPUTS + k);
  *off = inst->planned && p->offset
             ? p->offset[slot * (size_t)g->n_dev + (size_t)d]
             : FN_NOT_PLANNED;
  return *off != FN_NOT_PLANNED ? PL_ARENA : PL_OWN;
}

uint64_t fn_transient_bytes(const fn_inst *inst) {
  const fn_graph *g = inst->g;
  uint64_t sum = 0;
  for (int d = 0; d < g->n_dev; d++) {
    if (inst->planned) sum += inst->plan.arena_bytes[d];
    for (int i = 0; i < g->n_nodes; i++)
      for (int k = 0; k < g->nodes[i].n_out; k++) {
        int o;
        uint64_t off;
        if (placement(inst, i, k, d, &o, &off) == PL_OWN)
          sum += ref_bytes(g, fn_node_ref(i, k), d);
      }
  }
  return sum;
}

/* Places output k of node i: a graph output, an alias, the arena or its own
 * allocation. *alias_of: the input it aliases (0), else -1. */
static pd_code place_output(run_state *s, int i, int k, int *alias_of,
                            dev_status *st) {
  const fn_graph *g = s->g;
  const int slot = i * FN_MAX_NODE_OUTPUTS + k;
  *alias_of = -1;
  int o;
  uint64_t off;
  switch (placement(s->inst, i, k, s->d, &o, &off)) {
    case PL_OUTPUT: s->val[slot] = s->out_data[o]; return PD_OK;
    case PL_ALIAS:
      s->val[slot] = (void *)ref_data(s, g->nodes[i].in[0]);
      *alias_of = 0;
      return PD_OK;
    case PL_ARENA:
      if (s->fixed || !s->arena) break;
      s->val[slot] = s->arena + off;
      return PD_OK;
    default: break;
  }
  if (s->fixed) {
    s->val[slot] = s->arena + s->fixed[slot];
    return PD_OK;
  }
  const uint64_t bytes = ref_bytes(g, fn_node_ref(i, k), s->d);
  void *ptr = NULL;
  PD_TRY(s->b->allocate(s->b, s->dev, (size_t)bytes, &ptr, st));
  s->val[slot] = ptr;
  s->own[slot] = (size_t)bytes + 1;
  return PD_OK;
}

/* Runs node i (not a collective); true when work was issued. */
static bool run_node(run_state *s, dev_op *op, int i, _Atomic uint64_t *beats,
                     dev_kernel_ctx *ctx, dev_status *st) {
  const fn_graph *g = s->g;
  const fn_node *n = &g->nodes[i];
  int alias_of = -1;
  bool all_aliased = n->n_out > 0;
  void *out_data[FN_MAX_NODE_OUTPUTS];
  int out_alias[FN_MAX_NODE_OUTPUTS];
  dev_status kst = DEV_STATUS_INIT;
  for (int k = 0; k < n->n_out; k++) {
    if (place_output(s, i, k, &alias_of, &kst) != PD_OK) goto fail;
    out_data[k] = s->val[i * FN_MAX_NODE_OUTPUTS + k];
    out_alias[k] = alias_of;
    all_aliased &= alias_of >= 0;
  }
  if (all_aliased) return false; /* a view of its input: nothing to run */
  ctx->out_data = out_data;
  ctx->out_alias = out_alias;
  dev_kernel_fn fn = n->def->kernels[s->b->kind];
  if (!fn && (n->def->flags & DEV_OP_ALIASES_INPUT) && n->n_in > 0) {
    /* A view written into a graph output: copy its input's bytes. */
    uint64_t bytes = ref_bytes(g, fn_node_ref(i, 0), s->d);
    if (!bytes || s->b->copy_d2d(s->b, s->dev, out_data[0], s->dev,
                                 ctx->in_data[0], (size_t)bytes, &kst) == PD_OK)
      return bytes > 0;
    goto fail;
  }
  if (!fn) {
    dev_error(&kst, PD_UNIMPLEMENTED, "%s has no kernel for the %s backend",
              n->def->name, s->b->name);
    goto fail;
  }
  (void)op;
  (void)beats;
  if (s->b->run_kernel(s->b, fn, ctx, &kst) == PD_OK) return true;
fail : {
  char where[400];
  fn_node_describe(g, i, where, sizeof where);
  dev_error(st, kst.code, "%s: %s (on %s)", where, kst.msg,
            s->b->device_name(s->b, s->dev));
  return false;
}
}

/* Copies the graph outputs not written directly: arguments, constants and
 * a value named by a second output. */
static pd_code copy_outputs(run_state *s, dev_op *op, dev_status *st) {
  const fn_graph *g = s->g;
  for (int o = 0; o < g->n_outputs; o++) {
    fn_ref r = g->outputs[o];
    if (r.kind == FN_REF_NODE && direct_output(g, r.idx, r.out) == o) continue;
    size_t bytes = op->outputs[o]->comps[s->d].bytes;
    if (!bytes) continue;
    dev_status cst = DEV_STATUS_INIT;
    if (s->b->copy_d2d(s->b, s->dev, s->out_data[o], s->dev, ref_data(s, r),
                       bytes, &cst) != PD_OK)
      return dev_error(st, cst.code, "function '%s', output '%s': %s (on %s)",
                       g->fn_name, g->out_names[o], cst.msg,
                       s->b->device_name(s->b, s->dev));
  }
  return PD_OK;
}

void fn_run_release(const fn_inst *inst, int index, fn_run_mem *m) {
  dev_backend *b = inst->engine->backend;
  const int device = inst->set.dev[index];
  const fn_graph *g = inst->g;
  for (int i = 0; m->own && i < g->n_nodes * FN_MAX_NODE_OUTPUTS; i++)
    if (m->own[i]) b->deallocate(b, device, m->val[i], m->own[i] - 1);
  if (m->arena)
    b->deallocate(b, device, m->arena, (size_t)inst->plan.arena_bytes[index]);
  free(m->val);
  free(m->own);
  memset(m, 0, sizeof *m);
}

/* Frees what device s->d's run allocated now, or, for a body with
 * collectives (cs->mem), leaves it to the call state's free. */
static void release_memory(run_state *s, fn_call_state *cs) {
  fn_run_mem m = {s->val, s->own, s->arena};
  s->val = NULL;
  s->own = NULL;
  s->arena = NULL;
  if (cs && cs->mem)
    cs->mem[s->d] = m;
  else
    fn_run_release(s->inst, s->d, &m);
}

static void fill_inputs(const run_state *s, const fn_node *n, pd_dtype *dt,
                        dev_shape *sh, const void **data) {
  for (int j = 0; j < n->n_in; j++) {
    dt[j] = fn_ref_dtype(s->g, n->in[j]);
    sh[j] = *fn_ref_shape(s->g, n->in[j], s->d);
    data[j] = ref_data(s, n->in[j]);
  }
}

/* Walks the body on one device; true when work was issued. *failed on
 * entry: an input failed (only the collective nodes are called then). */
static bool walk(run_state *s, dev_op *op, bool *failed,
                 _Atomic uint64_t *beats, dev_status *st) {
  const fn_call_state *cs = op->fn_call;
  const fn_graph *g = s->g;
  const int device = s->d; /* component index: shapes are per component */
  bool issued = false;
  int ci = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const fn_node *n = &g->nodes[i];
    const bool coll = (n->def->flags & DEV_OP_COLLECTIVE) != 0;
    if (*failed && !coll) continue;
    pd_dtype in_dt[DEV_MAX_INPUTS], out_dt[FN_MAX_NODE_OUTPUTS];
    dev_shape in_sh[DEV_MAX_INPUTS], out_sh[FN_MAX_NODE_OUTPUTS];
    const void *in_p[DEV_MAX_INPUTS];
    void *out_p[FN_MAX_NODE_OUTPUTS] = {0};
    int out_alias[FN_MAX_NODE_OUTPUTS];
    for (int k = 0; k < n->n_out; k++) {
      out_dt[k] = n->out_dtype[k];
      out_sh[k] = n->out_shape[k * g->n_dev + device];
      out_alias[k] = -1;
    }
    if (!*failed) fill_inputs(s, n, in_dt, in_sh, in_p);
    dev_kernel_ctx ctx = {
        .op = n->def,
        .attrs = n->attrs,
        .device = s->dev,
        .num_devices = g->n_dev,
        .backend = s->b,
        .op_seq = op->seq,
        .num_inputs = *failed ? 0 : n->n_in,
        .in_dtype = in_dt,
        .in_shape = in_sh,
        .in_data = in_p,
        .num_outputs = *failed ? 0 : n->n_out,
        .out_dtype = out_dt,
        .out_shape = out_sh,
        .out_data = out_p,
        .out_alias = out_alias,
        .collective = coll ? cs->colls[ci++] : NULL,
        .heartbeat = beats,
        .index = device,
        .devset = &op->set,
    };
    if (coll) {
      int alias_of;
      dev_status pst = DEV_STATUS_INIT;
      for (int k = 0; !*failed && k < n->n_out; k++) {
        if (place_output(s, i, k, &alias_of, &pst) != PD_OK) {
          char where[400];
          dev_error(st, pst.code, "%s: %s",
                    fn_node_describe(g, i, where, sizeof where), pst.msg);
          *failed = true;
        }
        out_p[k] = s->val ? s->val[i * FN_MAX_NODE_OUTPUTS + k] : NULL;
      }
      dev_status cst = DEV_STATUS_INIT;
      if (s->b->collective_run(s->b, &ctx, *failed ? st : NULL, &cst) !=
          PD_OK) {
        if (!*failed) {
          char where[400];
          dev_error(st, cst.code, "%s: %s",
                    fn_node_describe(g, i, where, sizeof where), cst.msg);
        }
        *failed = true;
      } else if (!*failed) {
        issued = true;
      }
    } else {
      issued |= run_node(s, op, i, beats, &ctx, st);
      *failed = st->code != PD_OK;
    }
    if (beats) atomic_fetch_add_explicit(beats, 1, memory_order_relaxed);
  }
  if (!*failed && copy_outputs(s, op, st) != PD_OK)
    *failed = true;
  else if (!*failed)
    issued = true;
  return issued;
}

/* --- CUDA graphs (DEV_PASS_CUDA_GRAPH) -------------------------------------
 * A body without collectives on a backend with the capture hooks: the first
 * call on a device lays its inputs, outputs and values out at fixed offsets
 * of one persistent allocation and captures the walk over them
 * (capture_begin .. capture_end); every call then copies its inputs in,
 * launches the graph and copies the outputs out, all on the device's
 * stream. Any capture error falls back to stream execution for good. */

static uint64_t cg_align(uint64_t x) {
  return (x + FN_ARENA_ALIGN - 1) / FN_ARENA_ALIGN * FN_ARENA_ALIGN;
}

/* Lays device d's values out and allocates the persistent memory. */
static bool cg_layout(run_state *s, dev_op *op, fn_cg *cg) {
  const fn_graph *g = s->g;
  const int na = g->n_args, no = g->n_outputs;
  const size_t nv = (size_t)g->n_nodes * FN_MAX_NODE_OUTPUTS;
  cg->off = calloc((size_t)(na + no) + nv + 1, sizeof *cg->off);
  if (!cg->off) return false;
  uint64_t at = 0;
  for (size_t v = 0; v < (size_t)(na + no) + nv; v++) {
    uint64_t bytes;
    if (v < (size_t)na) {
      bytes = op->inputs[v]->comps[s->d].bytes;
    } else if (v < (size_t)(na + no)) {
      bytes = op->outputs[v - (size_t)na]->comps[s->d].bytes;
    } else {
      int slot = (int)(v - (size_t)(na + no));
      int i = slot / FN_MAX_NODE_OUTPUTS, k = slot % FN_MAX_NODE_OUTPUTS;
      bytes = k < g->nodes[i].n_out ? ref_bytes(g, fn_node_ref(i, k), s->d) : 0;
    }
    cg->off[v] = at;
    at = cg_align(at + bytes);
  }
  cg->mem_bytes = (size_t)at;
  dev_status ast = DEV_STATUS_INIT;
  return s->b->allocate(s->b, s->dev, cg->mem_bytes, (void **)&cg->mem, &ast) ==
         PD_OK;
}

/* Captures device d's walk into cg->graph; false (nothing run) on error. */
static bool cg_capture(run_state *s, dev_op *op, fn_cg *cg) {
  const fn_graph *g = s->g;
  const int na = g->n_args, no = g->n_outputs;
  const void *in[DEV_MAX_INPUTS];
  void *out[DEV_MAX_OUTPUTS];
  for (int a = 0; a < na; a++) in[a] = cg->mem + cg->off[a];
  for (int o = 0; o < no; o++) out[o] = cg->mem + cg->off[na + o];
  run_state c = *s;
  c.in_data = in;
  c.out_data = out;
  c.arena = cg->mem;
  c.fixed = cg->off + na + no;
  dev_status st = DEV_STATUS_INIT;
  if (s->b->capture_begin(s->b, s->dev, &st) != PD_OK) return false;
  bool failed = false;
  walk(&c, op, &failed, NULL, &st);
  void *graph = NULL;
  dev_status est = DEV_STATUS_INIT;
  pd_code rc = s->b->capture_end(s->b, s->dev, &graph, &est);
  if (failed || rc != PD_OK) {
    if (graph) s->b->graph_destroy(s->b, s->dev, graph);
    return false;
  }
  cg->graph = graph;
  return true;
}

/* Runs the call through device d's graph: in, launch, out. False when the
 * graph path is not (or no longer) taken; *issued otherwise. */
static bool cg_call(run_state *s, dev_op *op, bool *issued, dev_status *st) {
  fn_cg *cg = &s->inst->cg[s->d];
  if (cg->state < 0) return false;
  if (cg->state == 0) {
    cg->state = -1;
    if (!cg_layout(s, op, cg) || !cg_capture(s, op, cg)) return false;
    cg->state = 1;
    atomic_store(&((fn_inst *)s->inst)->cg_captured, true);
  }
  const fn_graph *g = s->g;
  const int na = g->n_args, no = g->n_outputs;
  dev_status cst = DEV_STATUS_INIT;
  pd_code rc = PD_OK;
  for (int a = 0; a < na && rc == PD_OK; a++)
    if (op->inputs[a]->comps[s->d].bytes)
      rc =
          s->b->copy_d2d(s->b, s->dev, cg->mem + cg->off[a], s->dev,
                         s->in_data[a], op->inputs[a]->comps[s->d].bytes, &cst);
  if (rc == PD_OK) rc = s->b->graph_launch(s->b, s->dev, cg->graph, &cst);
  for (int o = 0; o < no && rc == PD_OK; o++)
    if (op->outputs[o]->comps[s->d].bytes)
      rc = s->b->copy_d2d(s->b, s->dev, s->out_data[o], s->dev,
                          cg->mem + cg->off[na + o],
                          op->outputs[o]->comps[s->d].bytes, &cst);
  if (rc != PD_OK)
    dev_error(st, cst.code, "function '%s' (CUDA graph): %s (on %s)",
              g->fn_name, cst.msg, s->b->device_name(s->b, s->dev));
  *issued = rc == PD_OK;
  return true;
}

bool fn_run_call(dev_op *op, int device, const void *const *in_data,
                 void *const *out_data, bool failed, _Atomic uint64_t *beats,
                 dev_status *st) {
  fn_call_state *cs = op->fn_call;
  const fn_inst *inst = cs->inst;
  const fn_graph *g = inst->g;
  const int idx = op->index[device]; /* per component from here on */
  run_state s = {inst,     g,      op->engine->backend,
                 idx,      device, in_data,
                 out_data, NULL,   NULL,
                 NULL,     NULL};
  const size_t nv = (size_t)(g->n_nodes ? g->n_nodes : 1) * FN_MAX_NODE_OUTPUTS;
  if (!failed) {
    s.val = calloc(nv, sizeof *s.val);
    s.own = calloc(nv, sizeof *s.own);
    uint64_t ab = inst->planned ? inst->plan.arena_bytes[idx] : 0;
    dev_status ast = DEV_STATUS_INIT;
    bool issued = false;
    if (!s.val || !s.own) {
      failed = true;
      dev_error(st, PD_RESOURCE_EXHAUSTED, "function '%s': host out of memory",
                g->fn_name);
    } else if (inst->cg && cg_call(&s, op, &issued, st)) {
      release_memory(&s, NULL);
      return issued;
    } else if (ab && s.b->allocate(s.b, device, (size_t)ab, (void **)&s.arena,
                                   &ast) != PD_OK) {
      s.arena = NULL;
      failed = true;
      dev_error(st, ast.code, "function '%s': buffer arena of %llu bytes: %s",
                g->fn_name, (unsigned long long)ab, ast.msg);
    }
  }
  bool issued = walk(&s, op, &failed, beats, st);
  release_memory(&s, cs);
  return issued && !failed;
}
