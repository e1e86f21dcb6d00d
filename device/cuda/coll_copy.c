/* The copy path of the CUDA collectives, when mesh entries share a GPU or
 * NCCL is not built in: each device of the collective's set reads its peers'
 * buffers with kernels and copies on its own stream, with three phase events
 * ordering the streams (collective.c's opening comment). Ranks are positions
 * in the set; a rank's events and stream are its engine device's. */
#include "coll_int.h"

/* Runs `call` unless an earlier step failed; a failure lands in rc/lst. */
#define TRY(CALL)                                                              \
  do {                                                                         \
    if (rc == PD_OK) {                                                         \
      cudaError_t try_e_ = (CALL);                                             \
      if (try_e_ != cudaSuccess)                                               \
        rc = dev_cuda_fail(b, d, try_e_, #CALL, &lst);                         \
    }                                                                          \
  } while (0)

/* Every device meets its peers the same number of times whatever fails on
 * the way (a device that skipped a meeting would leave its peers waiting):
 * failures are recorded and acted on only after the meetings. */
pd_code cu_copy_run(cu_backend *c, cu_coll *k, dev_kernel_ctx *ctx,
                    dev_status *st) {
  dev_backend *b = &c->base;
  /* d: this engine device; r: its rank; peers by rank p are engine devices
   * cu_coll_dev(k, p). k->in/out/in_shape are by rank. */
  const int d = ctx->device, r = cu_coll_rank(k, ctx), n = k->n;
  cu_device *dev = &c->devs[d];
  cudaStream_t s = dev->stream;
  const pd_dtype dt = ctx->in_dtype[0];
  const int64_t es = (int64_t)pd_dtype_size(dt);
  pd_code rc = PD_OK;
  dev_status lst = DEV_STATUS_INIT;

  /* Phase 0 was recorded before the first meeting: wait for every input. */
  for (int p = 0; p < n; p++)
    if (p != r)
      TRY(cudaStreamWaitEvent(s, c->devs[cu_coll_dev(k, p)].coll_ev[0], 0));

  switch (k->kind) {
    case DEV_COLL_ALL_REDUCE: {
      /* Reduce-scatter: my 1/n of the elements, from every input. */
      int red = cu_coll_reduction(ctx);
      int64_t count = cu_coll_elems(&k->in_shape[r]);
      int64_t lo = count * r / n, hi = count * (r + 1) / n;
      if (hi > lo)
        TRY(dev_cuda_coll_reduce(dt, red, n, k->in, lo,
                                 (char *)k->out[r] + lo * es, hi - lo, s));
      TRY(cudaEventRecord(dev->coll_ev[1], s));
      if (rc != PD_OK) cu_coll_run_failed(k, d, &lst);
      cu_coll_meet(k, NULL, NULL);
      if (k->run_failed) break;
      /* All-gather: everyone else's parts, from their outputs. */
      for (int p = 0; p < n; p++) {
        if (p == r) continue;
        const int pd = cu_coll_dev(k, p);
        int64_t plo = count * p / n, phi = count * (p + 1) / n;
        TRY(cudaStreamWaitEvent(s, c->devs[pd].coll_ev[1], 0));
        TRY(cu_copy_rows(c, d, (char *)k->out[r] + plo * es, 0, pd,
                         (const char *)k->out[p] + plo * es, 0,
                         (size_t)((phi - plo) * es), 1, s));
      }
      break;
    }
    case DEV_COLL_BROADCAST: {
      int root = (int)ctx->attrs[0].u.i;
      size_t bytes = (size_t)(cu_coll_elems(&k->in_shape[root]) * es);
      TRY(cu_copy_rows(c, d, k->out[r], 0, cu_coll_dev(k, root), k->in[root], 0,
                       bytes, 1, s));
      break;
    }
    case DEV_COLL_ALL_GATHER: {
      int axis = (int)ctx->attrs[0].u.i;
      int rank = k->in_shape[0].rank;
      if (axis < 0) axis += rank;
      int64_t outer = 1, inner = es, out_rows = 0;
      for (int i = 0; i < axis; i++) outer *= k->in_shape[0].dims[i];
      for (int i = axis + 1; i < rank; i++) inner *= k->in_shape[0].dims[i];
      for (int p = 0; p < n; p++) out_rows += k->in_shape[p].dims[axis];
      int64_t row = 0;
      for (int p = 0; p < n; p++) {
        int64_t rows = k->in_shape[p].dims[axis];
        size_t w = (size_t)(rows * inner);
        TRY(cu_copy_rows(c, d, (char *)k->out[r] + row * inner,
                         (size_t)(out_rows * inner), cu_coll_dev(k, p),
                         k->in[p], w, w, (size_t)outer, s));
        row += rows;
      }
      break;
    }
    case DEV_COLL_REDUCE_SCATTER: {
      int red = cu_coll_reduction(ctx);
      const dev_shape *sh = &k->in_shape[r];
      int64_t rows = sh->dims[0],
              row_elems = rows ? cu_coll_elems(sh) / rows : 0;
      int64_t q = rows / n, rem = rows % n;
      int64_t first = r * q + (r < rem ? r : rem), mine = q + (r < rem ? 1 : 0);
      if (mine * row_elems > 0)
        TRY(dev_cuda_coll_reduce(dt, red, n, k->in, first * row_elems,
                                 k->out[r], mine * row_elems, s));
      break;
    }
    case DEV_COLL_NONE: break;
  }
  TRY(cudaEventRecord(dev->coll_ev[2], s));
  if (rc != PD_OK) cu_coll_run_failed(k, d, &lst);
  cu_coll_meet(k, NULL, NULL);
  /* Nobody frees or overwrites a buffer a peer may still read. */
  pd_code wrc = PD_OK;
  for (int p = 0; p < n; p++) {
    if (p == r) continue;
    cudaError_t e =
        cudaStreamWaitEvent(s, c->devs[cu_coll_dev(k, p)].coll_ev[2], 0);
    if (e != cudaSuccess && wrc == PD_OK)
      wrc = dev_cuda_fail(b, d, e, "cudaStreamWaitEvent", &lst);
  }
  if (wrc != PD_OK) return dev_error(st, wrc, "%s", lst.msg);
  return cu_coll_run_result(b, k, ctx, st);
}
