/* Registration of the CUDA kernels: each kernel file registers its ops' CUDA
 * kernels beside the CPU ones the op files registered (the op definitions,
 * their validation and shape inference are shared; only kernels differ),
 * through dev_cuda_register (device.c), so this file calls the kernel files
 * and none calls back. */
#include <pthread.h>

#include "cuda_int.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void register_once(void) {
  dev_registry_init(); /* the op definitions first */
  dev_cuda_register_elementwise();
  dev_cuda_register_linalg();
  dev_cuda_register_reduce();
  dev_cuda_register_array();
  dev_cuda_register_fused();
  dev_cuda_register_fused_matmul();
  dev_cuda_register_split();
}

void dev_register_cuda_kernels(void) { pthread_once(&g_once, register_once); }
