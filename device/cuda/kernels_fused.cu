/* CUDA kernels of the fused ops (device/ops/fused.c, contract
 * device/ops/fused_int.h):
 *
 *  _FusedElementwise: ONE launch that interprets the program per element.
 *    The program, its constants, the input pointers and the collapsed
 *    broadcast (each input's stride per axis, as the CPU kernel's plan) are
 *    one struct passed by value in the kernel's parameters (about 2 KiB, under
 *    the 4 KiB limit), so nothing is compiled at run time and nothing is
 *    copied to the device before the launch (a launch that can be captured
 *    into a CUDA graph as is). Each opcode is the expression of the op's own
 *    CUDA kernel (kernels_elementwise.cu), products written with mul_rn so
 *    that nvcc never fuses them into a following add (an unfused chain rounds
 *    each product on its own); float16/bfloat16 are computed in float32 and
 *    round once, on store.
 *  dev_cuda_bias_act: out = act(out (+ bias)) over an [m, n] row-major
 *    output, the one element-wise launch of _FusedMatMul's activations that
 *    cuBLASLt has no epilogue for (fused_matmul.c). */
#include "kernels.cuh"
#include "../ops/fused_int.h"

using namespace pdk;

namespace {

struct FeParams {
  int n_instr, n_in, rank;
  int op[DEV_EW_MAX_INSTR];
  int a[DEV_EW_MAX_INSTR], b[DEV_EW_MAX_INSTR];
  int n_consts;
  double consts[DEV_ATTR_LIST_MAX];
  const void *in[DEV_EW_MAX_INPUTS];
  int64_t dims[PD_MAX_RANK];
  int64_t s[DEV_EW_MAX_INPUTS][PD_MAX_RANK];
};
static_assert(sizeof(FeParams) < 4000, "kernel parameters are limited to 4 KiB");

__device__ __forceinline__ float f_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double f_abs(double x) { return fabs(x); }
__device__ __forceinline__ float f_exp(float x) { return expf(x); }
__device__ __forceinline__ double f_exp(double x) { return exp(x); }
__device__ __forceinline__ float f_log(float x) { return logf(x); }
__device__ __forceinline__ double f_log(double x) { return log(x); }
__device__ __forceinline__ float f_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double f_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float f_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double f_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float f_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double f_pow(double x, double y) { return pow(x, y); }

template <class C>
__device__ __forceinline__ C f_sigmoid(C x) {
  C e = f_exp(-f_abs(x)); /* e^-|x| never overflows */
  return (x >= (C)0 ? (C)1 : e) / ((C)1 + e);
}

/* One opcode on (x, y): the expressions of kernels_elementwise.cu. */
template <class C>
__device__ __forceinline__ C apply(int op, C x, C y) {
  switch (op) {
    case DEV_EW_ADD: return x + y;
    case DEV_EW_SUB: return x - y;
    case DEV_EW_MUL: return mul_rn(x, y);
    case DEV_EW_DIV: return x / y;
    case DEV_EW_MAXIMUM: return (x != x || x > y) ? x : y;
    case DEV_EW_MINIMUM: return (x != x || x < y) ? x : y;
    case DEV_EW_POW: return f_pow(x, y);
    case DEV_EW_RELU_GRAD: return y > (C)0 ? x : (C)0; /* (dy, x) */
    case DEV_EW_TANH_GRAD: return mul_rn(y, (C)1 - mul_rn(x, x));
    case DEV_EW_SIGMOID_GRAD: return mul_rn(mul_rn(y, x), (C)1 - x);
    case DEV_EW_SQRT_GRAD: return mul_rn(y, (C)0.5) / x;
    case DEV_EW_RSQRT_GRAD: return mul_rn(mul_rn((C)-0.5, mul_rn(mul_rn(x, x), x)), y);
    case DEV_EW_NEG: return -x;
    case DEV_EW_EXP: return f_exp(x);
    case DEV_EW_LOG: return f_log(x);
    case DEV_EW_SQRT: return f_sqrt(x);
    case DEV_EW_RSQRT: return (C)1 / f_sqrt(x);
    case DEV_EW_SQUARE: return mul_rn(x, x);
    case DEV_EW_TANH: return f_tanh(x);
    case DEV_EW_SIGMOID: return f_sigmoid(x);
    case DEV_EW_RELU: return x < (C)0 ? (C)0 : x; /* NaN stays */
    case DEV_EW_ABS: return f_abs(x);
    default: return x; /* Identity */
  }
}

template <class T>
__global__ void k_fused_ew(FeParams p, T *out, int64_t n) {
  using C = typename Tr<T>::C;
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    int64_t off[DEV_EW_MAX_INPUTS];
    for (int k = 0; k < p.n_in; k++) off[k] = 0;
    int64_t r = i;
    for (int ax = p.rank - 1; ax >= 0; ax--) {
      int64_t q = r / p.dims[ax], idx = r - q * p.dims[ax];
      for (int k = 0; k < p.n_in; k++) off[k] += idx * p.s[k][ax];
      r = q;
    }
    C t[DEV_EW_MAX_INSTR];
    for (int j = 0; j < p.n_instr; j++) {
      C v[2] = {(C)0, (C)0};
      for (int w = 0; w < 2; w++) {
        int o = w ? p.b[j] : p.a[j];
        if (o == DEV_EW_NONE) continue;
        if (o >= DEV_EW_CONST_BASE) v[w] = (C)p.consts[o - DEV_EW_CONST_BASE];
        else if (o >= DEV_EW_TEMP_BASE) v[w] = t[o - DEV_EW_TEMP_BASE];
        else v[w] = Tr<T>::load(((const T *)p.in[o])[off[o]]);
      }
      t[j] = apply<C>(p.op[j], v[0], v[1]);
    }
    out[i] = Tr<T>::store(t[p.n_instr - 1]);
  }
}

/* The collapsed broadcast of every input onto the output (fused.c's
 * fe_plan_make). */
void fe_plan(const dev_shape *out, const dev_shape *in, int n_in, FeParams *p) {
  int64_t s[DEV_EW_MAX_INPUTS][PD_MAX_RANK];
  for (int k = 0; k < n_in; k++) {
    int64_t stride = 1;
    for (int i = out->rank - 1; i >= 0; i--) {
      int j = i - (out->rank - in[k].rank);
      int64_t d = j >= 0 ? in[k].dims[j] : 1;
      s[k][i] = d == 1 ? 0 : stride;
      stride *= d;
    }
  }
  p->rank = 0;
  for (int i = 0; i < out->rank; i++) {
    int64_t d = out->dims[i];
    if (d == 1) continue;
    int r = p->rank - 1;
    bool merge = r >= 0;
    for (int k = 0; merge && k < n_in; k++) merge = p->s[k][r] == s[k][i] * d;
    if (merge) {
      p->dims[r] *= d;
      for (int k = 0; k < n_in; k++) p->s[k][r] = s[k][i];
      continue;
    }
    p->dims[p->rank] = d;
    for (int k = 0; k < n_in; k++) p->s[k][p->rank] = s[k][i];
    p->rank++;
  }
  if (p->rank == 0) {
    p->rank = 1;
    p->dims[0] = 1;
    for (int k = 0; k < n_in; k++) p->s[k][0] = 0;
  }
}

pd_code fused_elementwise(dev_kernel_ctx *c, dev_status *st) {
  int64_t n = num_elements(&c->out_shape[0]);
  if (n == 0) return PD_OK;
  const dev_attr_value *pv = &c->attrs[DEV_FEW_PROGRAM];
  const dev_attr_value *kv = &c->attrs[DEV_FEW_CONSTANTS];
  FeParams p;
  memset(&p, 0, sizeof p);
  p.n_instr = pv->u.ilist.n / 3;
  p.n_in = c->num_inputs;
  for (int j = 0; j < p.n_instr; j++) {
    p.op[j] = (int)pv->u.ilist.v[3 * j];
    p.a[j] = (int)pv->u.ilist.v[3 * j + 1];
    p.b[j] = (int)pv->u.ilist.v[3 * j + 2];
  }
  p.n_consts = kv->u.flist.n;
  for (int k = 0; k < p.n_consts; k++) p.consts[k] = kv->u.flist.v[k];
  for (int k = 0; k < p.n_in; k++) p.in[k] = c->in_data[k];
  fe_plan(&c->out_shape[0], c->in_shape, p.n_in, &p);
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  unsigned grid = launch_grid(n, dev_cuda_sm_count(c->backend, c->device));
  bool launched = false;
  PDK_DISPATCH_FLOAT(c->out_dtype[0],
                     k_fused_ew<T><<<grid, kThreads, 0, s>>>(p, (T *)c->out_data[0], n);
                     launched = true)
  if (!launched)
    return dev_error(st, PD_INTERNAL, "%s: no CUDA kernel for dtype %s", c->op->name,
                     pd_dtype_name(c->out_dtype[0]));
  CU_CHECK_LAUNCH(c, c->op->name, st);
  return PD_OK;
}

/* out[i, j] = act(out[i, j] (+ bias[j])), fused.c's activations. */
template <class T>
__global__ void k_bias_act(T *out, const T *bias, int64_t m, int64_t n, int act, bool add) {
  using C = typename Tr<T>::C;
  int64_t total = m * n;
  for (int64_t i = global_index(); i < total; i += global_stride()) {
    C x = Tr<T>::load(out[i]);
    if (add) x = x + Tr<T>::load(bias[i % n]);
    switch (act) {
      case DEV_ACT_RELU: x = x < (C)0 ? (C)0 : x; break;
      case DEV_ACT_RELU6: x = x < (C)0 ? (C)0 : (x > (C)6 ? (C)6 : x); break;
      case DEV_ACT_SIGMOID: x = f_sigmoid(x); break;
      case DEV_ACT_TANH: x = f_tanh(x); break;
      default: break;
    }
    out[i] = Tr<T>::store(x);
  }
}

}  // namespace

extern "C" cudaError_t dev_cuda_bias_act(pd_dtype dt, void *out, const void *bias, int64_t m,
                                         int64_t n, int act, int add_bias, int sm_count,
                                         cudaStream_t s) {
  if (m * n <= 0) return cudaSuccess;
  unsigned grid = launch_grid(m * n, sm_count);
  PDK_DISPATCH_FLOAT(dt, k_bias_act<T><<<grid, kThreads, 0, s>>>((T *)out, (const T *)bias, m, n,
                                                                  act, add_bias != 0))
  return cudaGetLastError();
}

extern "C" void dev_cuda_register_fused(void) {
  dev_cuda_register(DEV_FUSED_ELEMENTWISE_OP, fused_elementwise);
}
