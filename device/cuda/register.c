/* Registration of the CUDA kernels: each kernel file registers its ops' CUDA
 * kernels beside the CPU ones the op files registered (the op definitions,
 * their validation and shape inference are shared; only kernels differ). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_int.h"

void dev_cuda_register(const char *op, dev_kernel_fn fn) {
  dev_status st = DEV_STATUS_INIT;
  if (dev_kernel_register(DEV_BACKEND_CUDA, op, fn, &st) != PD_OK) {
    fprintf(stderr, "paradev: CUDA kernel registration failed: %s\n", st.msg);
    abort();
  }
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void register_once(void) {
  dev_registry_init(); /* the op definitions first */
  dev_cuda_register_elementwise();
  dev_cuda_register_linalg();
  dev_cuda_register_reduce();
  dev_cuda_register_array();
}

void dev_register_cuda_kernels(void) { pthread_once(&g_once, register_once); }
