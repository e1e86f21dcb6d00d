/* libparadev: checkpoints read and written by the daemon itself
 * (LoadTensors, GetLoadProgress, SaveTensors).
 *
 * Part of the API of <paradev/paradev.h>, which includes this header: include
 * that one. Its conventions hold here.
 */
#ifndef PARADEV_CHECKPOINT_H
#define PARADEV_CHECKPOINT_H

#include "paradev/paradev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Checkpoints
 *
 * The daemon reads safetensors, .npy (1.0, 2.0, 3.0) and .npz files and
 * writes safetensors and .npy, beneath the storage roots it was configured
 * with (pd_server_info's roots: local directories and http(s):// URL
 * prefixes); a checkpoint's bytes never cross the client's wire. A path
 * names a file beneath a root; symlinks or `..` out of a root, devices,
 * FIFOs and sockets are refused with PD_PERMISSION_DENIED. Reads go through
 * one RAM block cache of the daemon, shared by every session, so a file that
 * many jobs load is read from storage once.
 *
 * A load returns at once with each tensor's handle, dtype and shape; the
 * bytes stream into the devices afterwards. pd_sync or a download waits for
 * them, ops on them queue behind the load, and a read that fails is stored
 * on that tensor alone (pd_sync reports it). pd_load_progress tells how far
 * a load has come, for a progress bar.
 *
 * Source: paradev.v1.ParallelDevice/LoadTensors, GetLoadProgress and
 * SaveTensors (proto/paradev/v1/paradev.proto, "Checkpoints"); the cache is
 * TensorFlow's RamFileBlockCache; the formats are huggingface/safetensors'
 * and numpy/lib/format.py's. */

/* The numbers are the wire's CheckpointFormat. */
typedef enum pd_checkpoint_format {
  PD_CHECKPOINT_AUTO = 0, /* load: by the file's magic bytes; save: .npy by
                             extension, else safetensors */
  PD_CHECKPOINT_SAFETENSORS = 1,
  PD_CHECKPOINT_NPY = 2, /* one tensor, named "" */
  PD_CHECKPOINT_NPZ = 3, /* load only; members named without ".npy" */
} pd_checkpoint_format;

/* Longest tensor name a load reports (bytes, NUL included). */
#define PD_CHECKPOINT_NAME_MAX 256

/* One tensor to load. */
typedef struct pd_load_spec {
  const char *name; /* in the file; "" for a .npy file */
  uint64_t id;      /* the new handle; 0: a fresh id of the library */
  /* MIRRORED: the whole value on every device; SHARDED: split along axis
   * (each device reads only its own bytes where the file allows it);
   * PER_COMPONENT: one value per device, from component_sources (one file
   * per device), or, when n_component_sources is 0, from the entries
   * "<name>:<k>" that a PER_COMPONENT save wrote. A zeroed layout is
   * MIRRORED. */
  pd_layout layout;
  const char *const *component_sources;
  int n_component_sources; /* 0 or the number of devices */
  /* Placement (issue #17): the tensor's device set, daemon device indices
   * in component order (NULL / 0: pd_load_options.default_devices, else the
   * session's default). The layout splits over these devices and each
   * reads only its own part; PER_COMPONENT takes one source per device. */
  const int32_t *devices;
  int n_devices; /* 0 to PD_MAX_DEVICES */
} pd_load_spec;

typedef struct pd_load_options {
  size_t struct_size;
  pd_checkpoint_format format;
  /* With no specs (every tensor of the file): the layout of each
   * (MIRRORED or SHARDED) and the first id (0: fresh ids of the library);
   * tensors get consecutive ids in the file's order. */
  pd_layout default_layout;
  uint64_t first_id;
  /* Placement (issue #17): where a tensor goes whose spec names no devices
   * (and every tensor of a load without specs); NULL / 0: the session's
   * default. */
  const int32_t *default_devices;
  int n_default_devices; /* 0 to PD_MAX_DEVICES */
} pd_load_options;

#define PD_LOAD_OPTIONS_INITIALIZER                                            \
  {                                                                            \
    sizeof(pd_load_options), PD_CHECKPOINT_AUTO, {PD_LAYOUT_MIRRORED, 0, 0},   \
        0, NULL, 0                                                             \
  }

/* What a load started: its tensors and the load's id. */
typedef struct pd_load pd_load;

/* Loads tensors of `source` (a path beneath a storage root, or an http(s)://
 * URL beneath an allowed prefix) into new handles of the session: specs[0..n)
 * or, with n == 0, every tensor of the file. Returns once the file's header
 * was read and the handles exist; *out (free with pd_load_delete) lists them
 * in the order of specs (or of the file).
 * Each tensor's info carries its device set (pd_tensor_info.devices).
 * Errors:   PD_INVALID_ARGUMENT (a malformed file: the message names it and
 *           what is wrong; a layout that does not fit; over 4096 specs; a
 *           name over max_string_bytes; bad options; a spec's n_devices or
 *           the options' n_default_devices out of 0..PD_MAX_DEVICES or its
 *           devices NULL, checked here and naming the spec; a device out of
 *           range or named twice, from the daemon), PD_NOT_FOUND (no such
 *           file, or a name the file lacks, named), PD_ALREADY_EXISTS (an id
 *           in use), PD_PERMISSION_DENIED (outside the storage roots; a
 *           device outside the session's allowed set, named),
 *           PD_RESOURCE_EXHAUSTED (quota, device memory), PD_UNIMPLEMENTED (a
 *           dtype paradev lacks), PD_FAILED_PRECONDITION (the daemon has no
 *           storage root; session closed), PD_UNAVAILABLE (HTTP source
 *           unreachable), transport errors. On error no handle exists.
 * Thread safety: thread-safe (a pd_session may be shared).
 * Source: LoadTensorsRequest (LoadTensorSpec.devices, default_devices) of
 *         paradev.v1. */
pd_code pd_load_tensors(pd_session *s, const char *source,
                        const pd_load_spec *specs, int n,
                        const pd_load_options *opts, pd_load **out,
                        const pd_call_options *call, pd_status *st);

/* Accepts NULL. */
void pd_load_delete(pd_load *l);
/* The load's id (for pd_load_progress) and the host bytes it reads. */
uint64_t pd_load_id(const pd_load *l);
uint64_t pd_load_total_bytes(const pd_load *l);
/* Its tensors: name (owned by `l`) and handle, dtype and shape. i in
 * [0, pd_load_num_tensors); NULL / false outside. */
int pd_load_num_tensors(const pd_load *l);
const char *pd_load_tensor_name(const pd_load *l, int i);
bool pd_load_tensor_info(const pd_load *l, int i, pd_tensor_info *out);
/* The value's shape in the file (SHARDED: the whole value's, where the
 * handle's own shape is its components'): *rank and dims[0..rank). False
 * for PER_COMPONENT tensors (no one shape) and outside the range. */
bool pd_load_tensor_host_shape(const pd_load *l, int i, int *rank,
                               int64_t dims[PD_MAX_RANK]);

/* How far a load has come. */
typedef struct pd_load_progress_info {
  uint64_t bytes_done, bytes_total; /* host bytes */
  int tensors_done, tensors_total, tensors_failed;
  bool done;    /* every tensor is ready or failed */
  pd_code code; /* the first failure's; PD_OK while none */
  char message[512];
} pd_load_progress_info;

/* Reads the progress of load `load_id` of the session. wait_ms 0 answers at
 * once; otherwise the daemon answers once bytes_done changed or the load
 * ended, after at most wait_ms (0 to 60000) milliseconds, or shortly before
 * the call's deadline: a progress bar need not spin.
 * Errors:   PD_NOT_FOUND (a load id the session never had; the last 64
 *           finished loads of a session are kept), PD_INVALID_ARGUMENT
 *           (wait_ms over 60000), PD_FAILED_PRECONDITION (session closed),
 *           transport errors. A failed tensor is not an error of this call:
 *           it is out->code.
 * Thread safety: thread-safe. */
pd_code pd_load_progress(pd_session *s, uint64_t load_id, uint32_t wait_ms,
                         pd_load_progress_info *out,
                         const pd_call_options *call, pd_status *st);

/* One handle to save. */
typedef struct pd_save_spec {
  const char *name; /* in the file, 1 to 255 bytes (a .npy keeps none) */
  uint64_t id;      /* a live handle */
  /* Required (UNSPECIFIED is PD_INVALID_ARGUMENT, as for a download).
   * MIRRORED: component 0, once; SHARDED: the components gathered along
   * axis; PER_COMPONENT: entries "<name>:<k>" and metadata
   * "paradev.components.<name>". */
  pd_layout layout;
} pd_save_spec;

typedef struct pd_save_options {
  size_t struct_size;
  pd_checkpoint_format format; /* AUTO, SAFETENSORS or NPY */
  bool overwrite;              /* replace an existing file */
  /* safetensors __metadata__: n_meta string pairs (at most 64). */
  const char *const *meta_keys;
  const char *const *meta_values;
  int n_meta;
  /* Where the daemon wrote the file (may be NULL): the absolute path,
   * NUL-terminated, cut to path_cap bytes. A relative `path` goes to the
   * first storage root that already holds that file, else to the first
   * root where its directory exists. Added after n_meta: a struct_size of
   * offsetof(pd_save_options, path_out) (an older caller) is accepted. */
  char *path_out;
  size_t path_cap;
} pd_save_options;

#define PD_SAVE_OPTIONS_INITIALIZER                                            \
  { sizeof(pd_save_options), PD_CHECKPOINT_AUTO, false, NULL, NULL, 0, NULL, 0 }

/* Saves specs[0..n) (1 to 4096; .npy: 1) to `path` beneath a storage root:
 * the daemon waits for the tensors, writes a temporary file in the same
 * directory, fsyncs it and renames it into place, so a crash leaves the old
 * file or the new one. Returns once the file is in place; *bytes_written
 * (may be NULL) gets the tensor bytes written (the file less its header). Give `call` a timeout that fits the file
 * (the default is 10 s); a call that times out does not stop the save.
 * Errors:   PD_INVALID_ARGUMENT (no specs, over 4096, duplicate or bad
 *           names, bad layouts or options), PD_NOT_FOUND (an unknown handle;
 *           a directory that does not exist), PD_ALREADY_EXISTS (the file
 *           exists and !overwrite), PD_PERMISSION_DENIED (outside the roots),
 *           PD_RESOURCE_EXHAUSTED (disk full), PD_FAILED_PRECONDITION (no
 *           storage root; session closed), a tensor's stored error (nothing
 *           is written), PD_CANCELLED (the session ended first), transport
 *           errors.
 * Thread safety: thread-safe. */
pd_code pd_save_tensors(pd_session *s, const char *path,
                        const pd_save_spec *specs, int n,
                        const pd_save_options *opts, uint64_t *bytes_written,
                        const pd_call_options *call, pd_status *st);

#ifdef __cplusplus
}
#endif

#endif /* PARADEV_CHECKPOINT_H */
