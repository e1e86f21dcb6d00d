/* Private header of the CPU backend. */
#ifndef PARADEV_CPU_INT_H
#define PARADEV_CPU_INT_H

#include "../device_int.h"

void *dev_cpu_collective_create(dev_backend *b, dev_collective_kind kind,
                                const struct dev_devset *set);
pd_code dev_cpu_collective_run(dev_backend *b, dev_kernel_ctx *ctx,
                               const dev_status *failed, dev_status *st);
void dev_cpu_collective_release(dev_backend *b, void *coll);

#endif
