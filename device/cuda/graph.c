/* CUDA graphs of the CUDA backend (dev_backend.capture_begin / capture_end /
 * graph_launch / graph_destroy; issue #11): the executor of a graph function
 * (device/fn/run.c) captures the kernels of one call on the device's stream
 * at instantiation and replays them per call. Source: CUDA Programming
 * Guide, "CUDA Graphs" (stream capture, graph memory nodes).
 *
 * Capture is cudaStreamBeginCapture on the entry's stream in relaxed mode
 * (cudaStreamCaptureModeRelaxed: other threads' calls of "unsafe" APIs such
 * as cudaMalloc are not refused while a capture is open, since a daemon's
 * other devices and downloads go on meanwhile). What gets captured is
 * everything issued on that stream until capture_end, from ANY thread: the
 * backend cannot tell the executor's launches from another thread's.
 *
 * What the executor must (not) do between capture_begin and capture_end:
 *  - issue only kernels: no host copies (copy_h2d / copy_d2h wait for an
 *    event, which a capture forbids), no completion fence (fence_record and
 *    fence_wait of work inside the capture: the event is captured, waiting
 *    on it fails), no synchronize, no op whose kernel reads its check word
 *    back (integer Div and Pow, Gather, OneHot and the other ops that call
 *    dev_cuda_flag_read: it synchronizes the stream; the capture is then
 *    invalidated, capture_end fails, and the call must run as a stream);
 *  - no collective (the copy path joins the peers' streams, NCCL needs every
 *    rank captured together);
 *  - nothing else may issue on the device's stream meanwhile: uploads,
 *    downloads and the frees other threads make (a tensor's last reference
 *    dropped by a download or a session close) would join the capture. So
 *    the executor captures while it holds its device (at instantiation, the
 *    device's queue drained) and keeps every tensor it did not allocate inside
 *    the capture alive until capture_end;
 *  - memory: allocate (cudaMallocFromPoolAsync) inside a capture makes a
 *    graph memory node: the memory is the graph's, not the pool's, at the
 *    same address on every replay; a free of it inside the capture makes a
 *    free node (intermediates of the call are then reused by lifetime within
 *    the graph). A buffer allocated before the capture must not be freed
 *    inside it. Graph allocations not freed inside the graph (the call's
 *    outputs) are freed at the next launch (cudaGraphInstantiateFlagAutoFree
 *    OnLaunch), so outputs must be allocated before the capture (their
 *    addresses are baked into the graph, as every kernel argument is: a
 *    replay reads and writes exactly the buffers the capture saw). The
 *    backend's per-entry accounting counts a capture's allocations when they
 *    are captured, not per replay.
 * A replay (graph_launch) is ordinary stream work: a fence recorded after it
 * covers it, and an error inside it comes back from that fence. */
#include <stdio.h>

#include "cuda_int.h"

pd_code cu_capture_begin(dev_backend *b, int device, dev_status *st) {
  cu_backend *c = cu_of(b);
  PD_TRY(cu_check_healthy(c, device, st));
  PD_TRY(cu_bind(c, device, st));
  cudaStream_t s = c->devs[device].stream;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  CU_CHECK(b, device, cudaStreamIsCapturing(s, &cs), st);
  if (cs != cudaStreamCaptureStatusNone)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "%s: a CUDA graph capture is already open on its stream; "
                     "expected capture_end first",
                     c->devs[device].name);
  CU_CHECK(b, device, cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed),
           st);
  return PD_OK;
}

pd_code cu_capture_end(dev_backend *b, int device, void **graph,
                       dev_status *st) {
  cu_backend *c = cu_of(b);
  PD_TRY(cu_bind(c, device, st));
  cudaStream_t s = c->devs[device].stream;
  cudaGraph_t g = NULL;
  /* Ends the capture in every case: the stream is back to normal even when
   * the capture was invalidated (a synchronizing call inside it). */
  cudaError_t e = cudaStreamEndCapture(s, &g);
  if (e != cudaSuccess) {
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    if (dev_cuda_error_is_sticky(e))
      return dev_cuda_fail(b, device, e, "cudaStreamEndCapture", st);
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "%s: the work could not be captured into a CUDA graph: "
                     "cudaStreamEndCapture: %s (%s); nothing of it ran",
                     c->devs[device].name, cudaGetErrorString(e),
                     cudaGetErrorName(e));
  }
  cudaGraphExec_t x = NULL;
  e = cudaGraphInstantiateWithFlags(&x, g,
                                    cudaGraphInstantiateFlagAutoFreeOnLaunch);
  cudaGraphDestroy(g); /* the executable graph keeps what it needs */
  if (e != cudaSuccess)
    return dev_cuda_fail(b, device, e, "cudaGraphInstantiateWithFlags", st);
  *graph = x;
  return PD_OK;
}

pd_code cu_graph_launch(dev_backend *b, int device, void *graph,
                        dev_status *st) {
  cu_backend *c = cu_of(b);
  if (!graph)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: no CUDA graph to launch",
                     c->devs[device].name);
  PD_TRY(cu_check_healthy(c, device, st));
  PD_TRY(cu_bind(c, device, st));
  CU_CHECK(b, device,
           cudaGraphLaunch((cudaGraphExec_t)graph, c->devs[device].stream), st);
  return PD_OK;
}

void cu_graph_destroy(dev_backend *b, int device, void *graph) {
  if (!graph) return;
  cu_backend *c = cu_of(b);
  /* A lost context has taken its graphs with it. */
  if (atomic_load(&c->gpus[c->devs[device].gpu].unhealthy)) return;
  if (cudaSetDevice(c->devs[device].ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  cudaError_t e = cudaGraphExecDestroy((cudaGraphExec_t)graph);
  if (e != cudaSuccess)
    dev_cuda_fail(b, device, e, "cudaGraphExecDestroy", NULL);
}
