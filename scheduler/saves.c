/* Checkpoint saves (scheduler.h, "Checkpoints"): sched_save_begin checks a
 * request at once (live ids, names non-empty and unique, layouts that fit
 * the tensors by dev_tensor_host_size, the path beneath a root) and creates
 * the atomic output file at once (stg_out_create: ALREADY_EXISTS and
 * PERMISSION_DENIED are the call's errors). It then holds references on the
 * tensors and waits for them without a thread (sched_tensor_notify: ops
 * still queued, or tensors still loading, come first); when the last is
 * ready the save is queued on the load workers (workers.c), which pull each
 * tensor's bytes through dev_tensor_read while stg_write_safetensors or
 * stg_write_npy writes them, commit the file and call `done`.
 *
 * What lands in the file per layout: MIRRORED, component 0 once; SHARDED,
 * the components gathered along the axis (the layout's download);
 * PER_COMPONENT, one entry "<name>:<k>" per component, and __metadata__
 * "paradev.components.<name>" = the number of components (what a load by
 * PER_COMPONENT without component sources reads back). A tensor that failed
 * fails the save, naming it; the session's end cancels it (the temporary
 * file is removed, `done` gets CANCELLED). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

typedef struct save_entry {
  int src;             /* index of the request's tensor */
  int comp;            /* PER_COMPONENT: the component */
  dev_layout read_lay; /* how dev_tensor_read pulls it */
} save_entry;

typedef struct save {
  sched_io io;     /* first: the session's record */
  sched_work work; /* queued once every tensor is ready */
  sched_session *ss;
  pthread_mutex_t mu; /* bad, bad_code */
  stg_out *out;
  bool npy;
  char path[4096];    /* as given, for messages */
  char written[4096]; /* the absolute path (stg_out_path) */
  int n;              /* request tensors */
  char **names;
  uint64_t *ids;
  dev_tensor **ts;
  int n_entries;
  stg_save_tensor *entries; /* names point into entry_names */
  char **entry_names;
  save_entry *map;
  char **meta_keys, **meta_values;
  int n_meta;
  uint64_t bytes;
  atomic_int waits_left;
  int bad; /* the first tensor that failed, -1: none */
  pd_code bad_code;
  sched_save_done_fn done;
  void *arg;
} save;

static void strv_free(char **v, int n) {
  for (int i = 0; v && i < n; i++) free(v[i]);
  free(v);
}

/* What only the write needs: references, names, entries. */
static void save_release_job(save *sv) {
  for (int i = 0; sv->ts && i < sv->n; i++) dev_tensor_release(sv->ts[i]);
  free(sv->ts);
  sv->ts = NULL;
  strv_free(sv->names, sv->n);
  sv->names = NULL;
  free(sv->ids);
  sv->ids = NULL;
  strv_free(sv->entry_names, sv->n_entries);
  sv->entry_names = NULL;
  free(sv->entries);
  sv->entries = NULL;
  free(sv->map);
  sv->map = NULL;
  strv_free(sv->meta_keys, sv->n_meta);
  strv_free(sv->meta_values, sv->n_meta);
  sv->meta_keys = sv->meta_values = NULL;
  stg_out_abort(sv->out);
  sv->out = NULL;
}

static void save_free(sched_io *io) {
  save *sv = (save *)io;
  save_release_job(sv);
  pthread_mutex_destroy(&sv->mu);
  free(sv);
}

/* --- checking the request ------------------------------------------------- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* No two of v[0..n) are equal; *dup gets one that is. */
static bool strv_unique(char **v, int n, const char **dup) {
  char **c = malloc(sizeof(*c) * (size_t)(n ? n : 1));
  if (!c) return true; /* host memory: the writer refuses duplicates too */
  memcpy(c, v, sizeof(*c) * (size_t)n);
  qsort(c, (size_t)n, sizeof(*c), cmp_str);
  bool ok = true;
  for (int i = 1; ok && i < n; i++)
    if (strcmp(c[i - 1], c[i]) == 0) {
      ok = false;
      *dup = c[i]; /* a string of v */
    }
  free(c);
  return ok;
}

static pd_code save_format(save *sv, const sched_save_request *req,
                           dev_status *st) {
  size_t len = req->path ? strlen(req->path) : 0;
  if (len == 0 || len >= sizeof sv->path)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "save path is %zu bytes; expected 1 to %zu", len,
                     sizeof sv->path - 1);
  memcpy(sv->path, req->path, len + 1);
  if (req->format == STG_FORMAT_NPZ)
    return dev_error(st, PD_UNIMPLEMENTED,
                     "%s: saving .npz is not supported; save safetensors or "
                     "(one tensor) .npy",
                     req->path);
  if (req->format != STG_FORMAT_AUTO && req->format != STG_FORMAT_NPY &&
      req->format != STG_FORMAT_SAFETENSORS)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: unknown format %d",
                     req->path, (int)req->format);
  sv->npy = req->format == STG_FORMAT_NPY ||
            (req->format == STG_FORMAT_AUTO && len > 4 &&
             strcmp(req->path + len - 4, ".npy") == 0);
  return PD_OK;
}

/* One entry of the file: name, what it reads (host_size checks the fit). */
static pd_code save_add_entry(save *sv, int src, int comp, dev_layout lay,
                              const char *name, dev_status *st) {
  int i = sv->n_entries;
  dev_shape host;
  uint64_t bytes = 0;
  dev_status inner = DEV_STATUS_INIT;
  if (dev_tensor_host_size(sv->ts[src], &lay, comp, &host, &bytes, &inner) !=
      PD_OK)
    return dev_error(st, inner.code, "tensor '%s' (handle %llu): %s",
                     sv->names[src], (unsigned long long)sv->ids[src],
                     inner.msg);
  sv->entry_names[i] = strdup(name);
  if (!sv->entry_names[i])
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  sv->n_entries++;
  sv->entries[i] = (stg_save_tensor){
      sv->entry_names[i], dev_tensor_dtype(sv->ts[src]), host, bytes};
  sv->map[i] = (save_entry){src, comp, lay};
  sv->bytes += bytes;
  return PD_OK;
}

/* Adds a metadata pair (copied). */
static pd_code save_add_meta(save *sv, const char *k, const char *v,
                             dev_status *st) {
  sv->meta_keys[sv->n_meta] = strdup(k);
  sv->meta_values[sv->n_meta] = strdup(v);
  sv->n_meta++;
  if (!sv->meta_keys[sv->n_meta - 1] || !sv->meta_values[sv->n_meta - 1])
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  return PD_OK;
}

/* The file's entries from the request's tensors (per layout): a
 * per-component tensor has one per component of its own set (issue #17:
 * a tensor on a subset, or any in a narrowed session, has fewer than the
 * mesh has devices). */
static pd_code save_plan(save *sv, const sched_save_request *req,
                         dev_status *st) {
  size_t cap = 0;
  for (int i = 0; i < req->n; i++)
    cap += req->tensors[i].layout.kind == DEV_LAYOUT_PER_COMPONENT
               ? (size_t)dev_tensor_num_components(sv->ts[i])
               : 1;
  sv->entries = calloc(cap, sizeof(*sv->entries));
  sv->entry_names = calloc(cap, sizeof(*sv->entry_names));
  sv->map = calloc(cap, sizeof(*sv->map));
  sv->meta_keys = calloc((size_t)(req->n_meta + req->n), sizeof(char *));
  sv->meta_values = calloc((size_t)(req->n_meta + req->n), sizeof(char *));
  if (!sv->entries || !sv->entry_names || !sv->map || !sv->meta_keys ||
      !sv->meta_values)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < req->n_meta; i++) {
    if (!req->meta_keys[i] || !req->meta_keys[i][0] || !req->meta_values[i])
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "metadata %d: expected a non-empty key and a value", i);
    PD_TRY(save_add_meta(sv, req->meta_keys[i], req->meta_values[i], st));
  }
  for (int i = 0; i < req->n; i++) {
    dev_layout lay = req->tensors[i].layout;
    if (lay.kind == DEV_LAYOUT_MIRRORED || lay.kind == DEV_LAYOUT_SHARDED) {
      PD_TRY(save_add_entry(sv, i, 0, lay, sv->names[i], st));
    } else if (lay.kind == DEV_LAYOUT_PER_COMPONENT) {
      char key[SCHED_NAME_MAX + 64], num[16];
      int ndev = dev_tensor_num_components(sv->ts[i]);
      for (int k = 0; k < ndev; k++) {
        snprintf(key, sizeof key, "%s:%d", sv->names[i], k);
        PD_TRY(save_add_entry(sv, i, k, lay, key, st));
      }
      snprintf(key, sizeof key, "paradev.components.%s", sv->names[i]);
      snprintf(num, sizeof num, "%d", ndev);
      PD_TRY(save_add_meta(sv, key, num, st));
    } else {
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "tensor '%s': layout kind %d; expected mirrored, "
                       "sharded or per-component",
                       sv->names[i], (int)lay.kind);
    }
  }
  const char *dup = NULL;
  if (!strv_unique(sv->entry_names, sv->n_entries, &dup))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: the name '%s' is given twice (per-component "
                     "tensors are saved as '<name>:<k>')",
                     sv->path, dup);
  if (!strv_unique(sv->meta_keys, sv->n_meta, &dup))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: the metadata key '%s' is given twice", sv->path, dup);
  if (sv->npy && (sv->n_entries != 1 || sv->n_meta != 0))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: a .npy file holds exactly one tensor and no "
                     "metadata (this save has %d entries and %d metadata "
                     "pairs); save safetensors instead",
                     sv->path, sv->n_entries, sv->n_meta);
  return PD_OK;
}

/* Names and ids of the request; references on the tensors (NOT_FOUND). */
static pd_code save_collect(save *sv, const sched_save_request *req,
                            dev_status *st) {
  sv->n = req->n;
  sv->names = calloc((size_t)req->n, sizeof(*sv->names));
  sv->ids = calloc((size_t)req->n, sizeof(*sv->ids));
  if (!sv->names || !sv->ids)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < req->n; i++) {
    const char *nm = req->tensors[i].name;
    /* A .npy holds no name: "" is fine there (a .npy loads as ""). */
    if (!nm || (!nm[0] && !sv->npy) || strlen(nm) >= SCHED_NAME_MAX)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "tensor %d ('%.64s'%s): a safetensors entry needs a "
                       "name of 1 to %d bytes; give one (a tensor loaded "
                       "from a .npy has the name '')",
                       i, nm ? nm : "", nm && strlen(nm) > 64 ? "..." : "",
                       SCHED_NAME_MAX - 1);
    sv->names[i] = strdup(nm);
    if (!sv->names[i])
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    sv->ids[i] = req->tensors[i].id;
  }
  sched_ref *refs = NULL;
  size_t k = 0;
  PD_TRY(sched_collect(sv->ss, sv->ids, sv->n, &refs, &k, st));
  sv->ts = calloc((size_t)sv->n, sizeof(*sv->ts));
  if (!sv->ts) {
    sched_refs_release(refs, k);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  for (size_t i = 0; i < k; i++) sv->ts[i] = refs[i].t; /* the references */
  free(refs);
  return PD_OK;
}

/* --- writing (on a load worker) -------------------------------------------- */

static pd_code save_read(void *arg, int i, uint64_t offset, void *buf,
                         size_t len, dev_status *st) {
  save *sv = arg;
  if (atomic_load(&sv->io.cancelled))
    return dev_error(st, PD_CANCELLED,
                     "the session ended while %s was being written", sv->path);
  const save_entry *m = &sv->map[i];
  return dev_tensor_read(sv->ts[m->src], &m->read_lay, m->comp, offset, buf,
                         len, st);
}

static pd_code save_write(save *sv, dev_status *st) {
  if (atomic_load(&sv->io.cancelled))
    return dev_error(st, PD_CANCELLED,
                     "the session ended before %s was written", sv->path);
  if (sv->bad >= 0) {
    dev_status ts = DEV_STATUS_INIT;
    dev_tensor_wait(sv->ts[sv->bad], &ts); /* ready: for its message */
    return dev_error(st, sv->bad_code,
                     "%s: cannot save tensor '%s' (handle %llu): it failed: "
                     "%s",
                     sv->path, sv->names[sv->bad],
                     (unsigned long long)sv->ids[sv->bad], ts.msg);
  }
  for (int i = 0; i < sv->n; i++) {
    dev_status ts = DEV_STATUS_INIT;
    if (dev_tensor_wait(sv->ts[i], &ts) != PD_OK)
      return dev_error(st, ts.code, "%s: cannot save tensor '%s': %s", sv->path,
                       sv->names[i], ts.msg);
  }
  if (sv->npy)
    PD_TRY(stg_write_npy(sv->out, &sv->entries[0], save_read, sv, st));
  else
    PD_TRY(stg_write_safetensors(sv->out, sv->entries, sv->n_entries, save_read,
                                 sv, (const char *const *)sv->meta_keys,
                                 (const char *const *)sv->meta_values,
                                 sv->n_meta, st));
  stg_out *o = sv->out;
  sv->out = NULL; /* commit frees it whatever it returns */
  return stg_out_commit(o, st);
}

static void save_run(sched_work *w) {
  save *sv = (save *)((char *)w - offsetof(save, work));
  dev_status st = DEV_STATUS_INIT;
  pd_code c = save_write(sv, &st);
  sched_save_result res;
  memset(&res, 0, sizeof res);
  res.bytes_written = c == PD_OK ? sv->bytes : 0;
  snprintf(res.path, sizeof res.path, "%s",
           sv->written[0] ? sv->written : sv->path);
  sched_session *ss = sv->ss;
  sched *s = ss->owner;
  save_release_job(sv); /* aborts the temporary file on failure */
  sv->done(sv->arg, c, &st, &res);
  atomic_store(&sv->io.finished, true);
  sched_io_unref(&sv->io); /* the job's */
  sched_session_put(ss);
  sched_io_end(s);
}

/* A tensor of the save is ready (sched_tensor_notify; must not block). */
static void save_ready(void *arg, dev_tensor *t, pd_code code) {
  save *sv = arg;
  if (code != PD_OK) {
    pthread_mutex_lock(&sv->mu);
    for (int i = 0; sv->bad < 0 && i < sv->n; i++)
      if (sv->ts[i] == t) {
        sv->bad = i;
        sv->bad_code = code;
      }
    pthread_mutex_unlock(&sv->mu);
  }
  if (atomic_fetch_sub(&sv->waits_left, 1) == 1)
    sched_work_queue(sv->ss->owner, &sv->work);
}

/* --- sched_save_begin ------------------------------------------------------ */

static pd_code save_check_request(sched *s, const sched_save_request *req,
                                  sched_save_done_fn done, dev_status *st) {
  if (!s->cfg.storage_roots)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "no storage root is configured: the daemon writes "
                     "checkpoints only beneath [storage] roots "
                     "(--storage-root)");
  if (!req || !done)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "sched_save_begin: NULL request or callback");
  if (req->n < 1 || req->n > SCHED_LOAD_MAX_TENSORS || !req->tensors)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "a save names %d tensors; expected 1 to %d", req->n,
                     SCHED_LOAD_MAX_TENSORS);
  if (req->n_meta < 0 || req->n_meta > SCHED_LOAD_MAX_TENSORS ||
      (req->n_meta && (!req->meta_keys || !req->meta_values)))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%d metadata pairs; expected 0 to %d, keys and values "
                     "given",
                     req->n_meta, SCHED_LOAD_MAX_TENSORS);
  return PD_OK;
}

/* Puts the save on the session's list (it must still be open). */
static pd_code save_register(save *sv, dev_status *st) {
  sched_session *ss = sv->ss;
  pthread_mutex_lock(&ss->mu);
  pd_code c = ss->closed ? sched_closed_error(ss, st) : PD_OK;
  if (c == PD_OK) sched_io_add_locked(ss, &sv->io);
  pthread_mutex_unlock(&ss->mu);
  return c;
}

pd_code sched_save_begin(sched_session *ss, const sched_save_request *req,
                         sched_save_done_fn done, void *arg, dev_status *st) {
  sched *s = ss->owner;
  PD_TRY(save_check_request(s, req, done, st));
  save *sv = calloc(1, sizeof(*sv));
  if (!sv) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  sv->ss = ss;
  sv->bad = -1;
  sv->done = done;
  sv->arg = arg;
  sv->work.run = save_run;
  sv->work.ss = ss;
  pthread_mutex_init(&sv->mu, NULL);
  atomic_init(&sv->io.refs, 1); /* the list's, once registered */
  sv->io.free = save_free;
  pd_code c = PD_OK;
  PD_TRY_GOTO(save_format(sv, req, st), c, fail);
  PD_TRY_GOTO(save_collect(sv, req, st), c, fail);
  PD_TRY_GOTO(save_plan(sv, req, st), c, fail);
  PD_TRY_GOTO(
      sched_tenant_roots_note(
          s, sv->ss,
          stg_out_create(sv->ss->roots, sv->path, req->overwrite, &sv->out, st),
          st),
      c, fail);
  snprintf(sv->written, sizeof sv->written, "%s", stg_out_path(sv->out));
  sched_io_begin(s);
  if ((c = save_register(sv, st)) != PD_OK) {
    sched_io_end(s);
    goto fail;
  }
  sched_session_ref(ss); /* the job's */
  sched_io_ref(&sv->io);
  /* One count per tensor and one held here, so the save cannot be queued
   * while registrations are still being made. */
  atomic_init(&sv->waits_left, sv->n + 1);
  for (int i = 0; i < sv->n; i++) {
    dev_status ns = DEV_STATUS_INIT;
    if (sched_tensor_notify(ss, sv->ts[i], save_ready, sv, &ns) != PD_OK)
      save_ready(sv, sv->ts[i], ns.code); /* host memory: fails the save */
  }
  save_ready(sv, NULL, PD_OK);
  return PD_OK;

fail:
  save_free(&sv->io);
  return c;
}
