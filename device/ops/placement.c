/* The placement ops (issue #17): ParallelPack, ParallelUnpack and
 * CopyToDevices move a value between device sets. Their outputs live on
 * other sets than their inputs, so they have no kernel and no per-component
 * inference: device/place.c prepares them (output sets and shapes) and runs
 * each device's part (aliasing buffers, or a device-to-device copy). This
 * file holds their definitions for the registry and the op reference.
 * Graph functions cannot hold them: fn/convert.c refuses such a node at
 * registration; the infer functions here answer only a graph built past
 * that check. Source: TensorFlow's parallel device (TPUReplicatedInput /
 * TPUReplicatedOutput are its pack and unpack). */
#include "device_int.h"

/* A graph function's inference reaches here (its nodes run on one set). */
static pd_code placement_infer(dev_infer_ctx *c, dev_status *st) {
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "%s moves a value between device sets and cannot be a "
                   "node of a graph function; call it outside the function",
                   c->op->name);
}

static dev_op_def pack_def = {
    .name = "ParallelPack",
    .num_inputs = 1,
    .inputs = {{"components", true, 1, DEV_MASK_ALL, "one dtype for all",
                "tensors each on a set of one device, the devices distinct"}},
    .num_outputs = 1,
    .outputs = {{"output", false, 1, DEV_MASK_ALL, "same as components",
                 "on the devices of the components, in their order"}},
    .num_attrs = 0,
    .flags = DEV_OP_PLACEMENT,
    .infer = placement_infer,
    .placement = DEV_PLACE_PACK,
    .summary =
        "Makes one parallel tensor whose component i is input i "
        "(each on one device), sharing their buffers: no copy.",
    .notes =
        "TensorFlow parallel device's pack (TPUReplicatedInput). The "
        "output is on the devices of the inputs in input order, and "
        "is marked not mirrored (a MIRRORED download is refused, except "
        "of one component: a tensor on one device is its value). No "
        "device memory is allocated. Its gradient is ParallelUnpack. "
        "Not a node of a graph function (refused at registration).",
};

static dev_op_def unpack_def = {
    .name = "ParallelUnpack",
    .num_inputs = 1,
    .inputs = {{"input", false, 1, DEV_MASK_ALL, NULL,
                "a parallel tensor on N devices"}},
    .num_outputs = 1,
    .outputs = {{"components", true, 1, DEV_MASK_ALL, "same as input",
                 "N tensors, output i on the input's device i alone", "num"}},
    .num_attrs = 1,
    .attrs = {{"num",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_INT, .u.i = 0},
               .doc = "0, or the input's device count (checked)",
               .has_min = true,
               .min = 0,
               .has_max = true,
               .max = PD_MAX_DEVICES}},
    .flags = DEV_OP_PLACEMENT,
    .infer = placement_infer,
    .placement = DEV_PLACE_UNPACK,
    .summary =
        "Splits a parallel tensor into one single-device tensor per "
        "component, sharing their buffers: no copy.",
    .notes =
        "TensorFlow parallel device's unpack (TPUReplicatedOutput). "
        "The output count is the input's device count. No device "
        "memory is allocated. Its gradient is ParallelPack. Not a node "
        "of a graph function (refused at registration).",
};

static dev_op_def copy_def = {
    .name = "CopyToDevices",
    .num_inputs = 1,
    .inputs = {{"input", false, 1, DEV_MASK_ALL}},
    .num_outputs = 1,
    .outputs = {{"output", false, 1, DEV_MASK_ALL, "same as input",
                 "on the devices of `devices`"}},
    .num_attrs = 1,
    .attrs = {{"devices",
               DEV_ATTR_INT_LIST,
               {.type = DEV_ATTR_NONE},
               .doc = "the destination set: distinct device indices",
               .has_min = true,
               .min = 0,
               .has_max = true,
               .max = PD_MAX_DEVICES - 1}},
    .flags = DEV_OP_PLACEMENT,
    .infer = placement_infer,
    .placement = DEV_PLACE_COPY,
    .summary = "Copies a tensor onto another device set.",
    .notes =
        "A paradev op (placement is explicit: nothing moves "
        "implicitly). Same device count: component i goes to "
        "devices[i]. An input on one device is replicated to every "
        "device of the new set; a mirrored input of another count "
        "sends its component 0 to every device; any other input of "
        "another count is refused. On CUDA a peer copy. Its gradient "
        "copies back (summed over the destinations when one source "
        "was replicated). Not a node of a graph function (refused at "
        "registration).",
};

void dev_register_placement_ops(void) {
  dev__register_or_die(&pack_def);
  dev__register_or_die(&unpack_def);
  dev__register_or_die(&copy_def);
}
