/* Device sets (issue #17: placement), part of device.h's interface (it
 * includes this header at its end; programs include device.h): the set
 * type and its helpers (device/devset.c), and the placement variants of the
 * tensor creators (device/tensor.c, device/transfer.c). The conventions of
 * device.h hold. */
#ifndef PARADEV_DEV_DEVSET_H
#define PARADEV_DEV_DEVSET_H

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- Device sets (issue #17: placement) ---------------------------------
 * A device set is an ordered subset of the engine's devices (its mesh):
 * where a parallel tensor's components live, component i on device dev[i].
 * Every tensor has one; the whole mesh [0, 1, ..., n-1] is the default. An
 * op runs on its inputs' set (inputs on different sets are refused); an op
 * without tensor inputs on the set it is prepared on (dev_op_prepare_on).
 * Layouts split over the set's size, DeviceId is the index within the set,
 * collectives run over the set. A set of one device is a plain
 * single-device tensor. Any two ops that share a device reach it in the
 * one global order, so collectives on overlapping sets never deadlock.
 * Moving a value between sets is explicit: ParallelPack, ParallelUnpack
 * (sharing buffers, TensorFlow parallel device's pack / unpack) and
 * CopyToDevices (a copy); nothing moves implicitly.
 * Source: TensorFlow's parallel device (ParallelDevice over a list of
 * underlying devices; TPUReplicatedInput / TPUReplicatedOutput). */
struct dev_devset {
  int n;                       /* 1..PD_MAX_DEVICES */
  uint8_t dev[PD_MAX_DEVICES]; /* distinct engine device indices, in order */
};

/* Room for dev_devset_str of any set: "[0, 1, ..., 63]". */
#define DEV_DEVSET_STR_MAX (PD_MAX_DEVICES * 4 + 4)

/* The whole mesh of `e`: [0, 1, ..., n-1]. Thread-safe. */
void dev_devset_all(const dev_engine *e, dev_devset *out);
/* Builds a set from `n` device indices in order. INVALID_ARGUMENT, naming
 * the entry and the mesh size, for n < 1 or over the mesh, an index outside
 * 0..num_devices-1, or an index given twice. Thread-safe. */
pd_code dev_devset_make(const dev_engine *e, const int64_t *devs, int n,
                        dev_devset *out, dev_status *st);
/* Same devices in the same order. */
bool dev_devset_equal(const dev_devset *a, const dev_devset *b);
/* Position of `device` in the set, -1 when it is not in it. */
int dev_devset_index(const dev_devset *s, int device);
/* Every device of `sub` is in `super` (order ignored). */
bool dev_devset_is_subset(const dev_devset *sub, const dev_devset *super);
/* The sets share a device. */
bool dev_devset_overlaps(const dev_devset *a, const dev_devset *b);
/* True when the set is the whole mesh of `e` in mesh order. */
bool dev_devset_is_all(const dev_engine *e, const dev_devset *s);
/* Writes "[0, 2]" (always NUL-terminated); returns buf. */
char *dev_devset_str(const dev_devset *s, char *buf, size_t len);

/* Placement variants (issue #17) of the creators above: the tensor lives on
 * `set` (NULL: the whole mesh), so layouts split over set->n and
 * PER_COMPONENT takes set->n component shapes. Errors as the plain
 * functions', plus INVALID_ARGUMENT for a set that is not of this engine
 * (an index outside the mesh). The plain functions are these with NULL. */
pd_code dev_tensor_create_on(dev_engine *e, const dev_devset *set,
                             pd_dtype dtype, const dev_shape *component_shapes,
                             dev_tensor **out, dev_status *st);
pd_code dev_tensor_create_for_layout_on(dev_engine *e, const dev_devset *set,
                                        pd_dtype dtype,
                                        const dev_layout *layout,
                                        const dev_shape *host_shape,
                                        const dev_shape *component_shapes,
                                        dev_tensor **out, dev_status *st);
pd_code dev_tensor_create_pending_on(dev_engine *e, const dev_devset *set,
                                     pd_dtype dtype, const dev_layout *layout,
                                     const dev_shape *host_shape,
                                     const dev_shape *component_shapes,
                                     dev_tensor **out, dev_status *st);
pd_code dev_tensor_from_host_on(dev_engine *e, const dev_devset *set,
                                pd_dtype dtype, const dev_layout *layout,
                                const dev_shape *host_shape, const void *data,
                                dev_tensor **out, dev_status *st);
/* dev_tensor_from_components on `set`: shapes[set->n], datas[set->n]
 * (component i on device set->dev[i]). (Added by the engine helper.) */
pd_code dev_tensor_from_components_on(dev_engine *e, const dev_devset *set,
                                      pd_dtype dtype, const dev_shape *shapes,
                                      const void *const *datas,
                                      dev_tensor **out, dev_status *st);

/* True when component `comp` of output `out` will share the buffer of
 * component *in_comp of input *in (no new memory; the scheduler charges a
 * shared buffer once): output 0 component c of a DEV_OP_ALIASES_INPUT op
 * with input 0 component c when their bytes match; ParallelPack output
 * component i with input i component 0; ParallelUnpack output o with the
 * input's component o. False otherwise (a function call, out of range).
 * From the prepared op alone. Thread-safe. */
bool dev_op_output_shares(const dev_op *op, int out, int comp, int *in,
                          int *in_comp);

#ifdef __cplusplus
}
#endif

#endif /* PARADEV_DEV_DEVSET_H */
