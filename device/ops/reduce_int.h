/* Private header of device/ops/reduce.c (Sum, Mean, Max, Min, ArgMax) and
 * softmax.c (Softmax, LogSoftmax, SparseSoftmaxCrossEntropyWithLogits): the
 * output check of their infer functions and the float32 path of their
 * float16/bfloat16 kernels. */
#ifndef PARADEV_OPS_REDUCE_INT_H
#define PARADEV_OPS_REDUCE_INT_H

#include <stdlib.h>

#include "../device_int.h"

static inline pd_code check_output(const dev_infer_ctx *c, int i,
                                   dev_status *st) {
  size_t bytes;
  return dev_shape_byte_size(c->out_dtype[i], &c->out_shape[i], &bytes, st);
}

static inline bool is_half(pd_dtype dt) {
  return dt == PD_FLOAT16 || dt == PD_BFLOAT16;
}

/* Runs a float32 kernel body on float16/bfloat16 data: widens input
 * `in_count` elements (of ctx->in_data[0]), hands float32 buffers to `fn`,
 * rounds `out_count` results back into out_data[0] (and out_count2 into
 * out_data[1] when the op has two floating outputs). */
typedef pd_code (*f32_body)(dev_kernel_ctx *ctx, const float *in, float *out,
                            float *out2, dev_status *st);

static inline pd_code run_widened(dev_kernel_ctx *ctx, f32_body fn,
                                  int64_t in_count, int64_t out_count,
                                  int64_t out_count2, dev_status *st) {
  pd_dtype dt = ctx->in_dtype[0];
  int64_t total = in_count + out_count + out_count2;
  /* calloc: GCC 12 at -O3 cannot see that dev__widen_16() fills the input part. */
  float *buf = calloc((size_t)(total > 0 ? total : 1), sizeof(float));
  if (!buf) return dev__scratch_error(ctx, total, st);
  float *fin = buf, *fout = buf + in_count, *fout2 = fout + out_count;
  dev__widen_16(dt, ctx->in_data[0], fin, in_count);
  pd_code rc = fn(ctx, fin, fout, fout2, st);
  if (rc == PD_OK) {
    dev__narrow_16(dt, fout, ctx->out_data[0], out_count);
    if (out_count2) dev__narrow_16(dt, fout2, ctx->out_data[1], out_count2);
  }
  free(buf);
  return rc;
}

#endif /* PARADEV_OPS_REDUCE_INT_H */
