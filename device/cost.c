/* The cost of an op before it runs (dev_op_estimate, device.h): FLOPs and
 * bytes from its components' shapes, turned into device time by a roofline
 * with each backend's rates. The scheduler charges this at dispatch and
 * corrects it with the device time the executors measured, so the rates
 * only need to be right within a small factor; they bound what is
 * dispatched ahead and queued before the first completions calibrate them. */
#include <math.h>
#include <string.h>

#include "device_int.h"

/* Per device. CPU: one executor thread with its share of the cores (sgemm
 * through OpenBLAS, element-wise loops at memory speed); CUDA: an H100/H200
 * class GPU at float32 without tensor cores, and its HBM. */
#define DEV_COST_CPU_LAUNCH_NS 2000.0
#define DEV_COST_CPU_FLOPS 20e9
#define DEV_COST_CPU_BYTES_PER_S 8e9
#define DEV_COST_CUDA_LAUNCH_NS 5000.0
#define DEV_COST_CUDA_FLOPS 30e12
#define DEV_COST_CUDA_BYTES_PER_S 2e12

/* FLOPs of a MatMul / BatchMatMul: 2 * out elements * K, with K = input
 * 0's elements / (its batch * the output's M). */
static double matmul_flops(const dev_shape *a, const dev_shape *o) {
  if (a->rank < 2 || o->rank < 2) return 0;
  double m = (double)o->dims[o->rank - 2];
  double batch = (double)dev_dims_prod(a, 0, a->rank - 2);
  double k = m * batch > 0 ? (double)dev_num_elems(a) / (m * batch) : 0;
  return 2.0 * (double)dev_num_elems(o) * k;
}

/* FLOPs and bytes of one component of an op of `def` (attrs: its resolved
 * attributes, or NULL). */
static void shapes_cost(const dev_op_def *def, const dev_attr_value *attrs,
                        int num_inputs, const dev_shape *in_shape,
                        const size_t *in_bytes, int num_outputs,
                        const dev_shape *out_shape, const size_t *out_bytes,
                        double *flops, double *bytes) {
  const char *name = def->name;
  double in_elems = 0, out_elems = 0, max_elems = 0, b = 0;
  for (int i = 0; i < num_inputs; i++) {
    double n = (double)dev_num_elems(&in_shape[i]);
    in_elems += n;
    max_elems = fmax(max_elems, n);
    b += (double)in_bytes[i];
  }
  for (int i = 0; i < num_outputs; i++) {
    double n = (double)dev_num_elems(&out_shape[i]);
    out_elems += n;
    max_elems = fmax(max_elems, n);
    b += (double)out_bytes[i];
  }
  double f = max_elems;
  int pi;
  if ((strcmp(name, "MatMul") == 0 || strcmp(name, "BatchMatMul") == 0 ||
       strcmp(name, "_FusedMatMul") == 0) &&
      num_inputs > 0 && num_outputs > 0)
    f = matmul_flops(&in_shape[0], &out_shape[0]);
  else if (strcmp(name, "_FusedElementwise") == 0 && attrs &&
           (pi = dev_op_attr_index(def, "program")) >= 0 &&
           attrs[pi].type == DEV_ATTR_INT_LIST) /* a FLOP per instruction */
    f = out_elems * (double)(attrs[pi].u.ilist.n / 3);
  else if (strstr(name, "Softmax"))
    f = 5.0 * in_elems;
  else if (strncmp(name, "Random", 6) == 0)
    f = 10.0 * out_elems;
  if (def->flags & DEV_OP_ALIASES_INPUT) b = f = 0;
  if (def->flags & DEV_OP_COLLECTIVE) b *= 2.0;
  *flops = f;
  *bytes = b;
}

/* FLOPs and bytes of device d's part of op. */
static void component_cost(const dev_op *op, int d, double *flops,
                           double *bytes) {
  dev_shape in_s[DEV_MAX_INPUTS], out_s[DEV_MAX_OUTPUTS];
  size_t in_b[DEV_MAX_INPUTS], out_b[DEV_MAX_OUTPUTS];
  for (int i = 0; i < op->num_inputs; i++) {
    in_s[i] = op->inputs[i]->comps[d].shape;
    in_b[i] = op->inputs[i]->comps[d].bytes;
  }
  for (int i = 0; i < op->num_outputs; i++) {
    out_s[i] = op->outputs[i]->comps[d].shape;
    out_b[i] = op->outputs[i]->comps[d].bytes;
  }
  shapes_cost(op->def, op->attrs, op->num_inputs, in_s, in_b, op->num_outputs,
              out_s, out_b, flops, bytes);
}

static void rates(dev_backend_kind kind, double *launch, double *peak,
                  double *bw) {
  bool cuda = kind == DEV_BACKEND_CUDA;
  *launch = cuda ? DEV_COST_CUDA_LAUNCH_NS : DEV_COST_CPU_LAUNCH_NS;
  *peak = cuda ? DEV_COST_CUDA_FLOPS : DEV_COST_CPU_FLOPS;
  *bw = cuda ? DEV_COST_CUDA_BYTES_PER_S : DEV_COST_CPU_BYTES_PER_S;
}

double dev__cost_node(dev_backend_kind kind, const dev_op_def *def,
                      const dev_attr_value *attrs, int num_inputs,
                      const dev_shape *in_shape, const size_t *in_bytes,
                      int num_outputs, const dev_shape *out_shape,
                      const size_t *out_bytes, double *flops, double *bytes) {
  double launch, peak, bw;
  rates(kind, &launch, &peak, &bw);
  shapes_cost(def, attrs, num_inputs, in_shape, in_bytes, num_outputs,
              out_shape, out_bytes, flops, bytes);
  return launch + fmax(*flops / peak, *bytes / bw) * 1e9;
}

/* True when every input and output has one shape on every device (its
 * common shape has no -1, dev_tensor.shape). */
static bool same_shapes(const dev_op *op) {
  for (int i = 0; i < op->num_inputs + op->num_outputs; i++) {
    const dev_tensor *t =
        i < op->num_inputs ? op->inputs[i] : op->outputs[i - op->num_inputs];
    for (int k = 0; k < t->shape.rank; k++)
      if (t->shape.dims[k] < 0) return false;
  }
  return true;
}

pd_code dev_op_estimate(const dev_op *op, dev_op_cost *out, dev_status *st) {
  if (!op || !out ||
      out->struct_size < offsetof(dev_op_cost, flops) + sizeof out->flops)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_op_estimate: NULL op or out, or out->struct_size "
                     "%zu below %zu (use DEV_OP_COST_INITIALIZER)",
                     out ? out->struct_size : (size_t)0, sizeof(dev_op_cost));
  if (op->def->flags & DEV_OP_FUNCTION) { /* the sum of its nodes */
    double f = 0, b = 0, ns = 0;
    ((const dev__fn_call *)op->fn_call)->estimate(op, &f, &b, &ns);
    dev_op_cost fr = {out->struct_size, f, b, (uint64_t)fmin(ns, 1e18)};
    memcpy(out, &fr,
           out->struct_size < sizeof fr ? out->struct_size : sizeof fr);
    return PD_OK;
  }
  double launch, peak, bw;
  rates(op->engine->backend->kind, &launch, &peak, &bw);
  double flops = 0, bytes = 0, worst = 0;
  /* Components of one shape (the common case) cost the same everywhere. A
   * placement op moves bytes only: its largest output component. */
  if (op->def->flags & DEV_OP_PLACEMENT) {
    for (int o = 0; o < op->num_outputs; o++)
      for (int c = 0; c < op->outputs[o]->n; c++)
        if (op->def->placement == DEV_PLACE_COPY)
          bytes = fmax(bytes, 2.0 * (double)op->outputs[o]->comps[c].bytes);
    worst = bytes / bw * 1e9;
    dev_op_cost r = {out->struct_size, 0, bytes,
                     (uint64_t)fmin(launch + worst, 1e18)};
    memcpy(out, &r, out->struct_size < sizeof r ? out->struct_size : sizeof r);
    return PD_OK;
  }
  int ndev = same_shapes(op) ? 1 : op->set.n;
  for (int d = 0; d < ndev; d++) {
    double f = 0, b = 0;
    component_cost(op, d, &f, &b);
    double t = fmax(f / peak, b / bw) * 1e9;
    if (d == 0 || t > worst) {
      worst = t;
      flops = f;
      bytes = b;
    }
  }
  dev_op_cost r = {out->struct_size, flops, bytes,
                   (uint64_t)fmin(launch + worst, 1e18)};
  size_t n = out->struct_size < sizeof r ? out->struct_size : sizeof r;
  memcpy(out, &r, n);
  return PD_OK;
}

void dev_op_set_time_sink(dev_op *op, uint64_t *sink) {
  if (op) op->time_sink = sink;
}
