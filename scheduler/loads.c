/* Checkpoint loads (scheduler.h, "Checkpoints"): sched_load_new puts a
 * load on the session's list (so the session's end reaches a stalled open);
 * sched_load_run opens and indexes its sources (on the caller's thread or
 * an open worker: load_begin.c), every fetch bounded by the deadline and
 * aborted once ld->io.cancelled is set (the session's end, or
 * sched_load_abandon before the handles are published). A bad header, an
 * unknown name, a dtype or a layout that does not fit is the call's error,
 * nothing published, the load off the list; else it creates every tensor
 * pending, checks the handle limit and the quota as an upload does,
 * publishes the handles and queues the reads as pieces on the load workers.
 *
 * A piece reads one byte range of one entry in chunks (sched.load_chunk)
 * through stg_entry_read and writes it with dev_tensor_write; which pieces
 * each layout takes (mirrored, sharded along axis 0 or a later one,
 * per-component) and why: README.md, "Checkpoints". An entry that is not
 * random-access is read whole into host memory first. The last piece of a
 * tensor completes it (a read error fails that tensor alone, CANCELLED
 * when its session ended); the last tensor ends the load, whose progress
 * record stays on the session's list (workers.c). Each tensor lives on its
 * own device set (issue #17): its components are that set's, and a
 * per-component file must hold as many (sched_components_check). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

typedef struct load load;

typedef struct load_tensor {
  load *ld;
  char *name; /* in the checkpoint */
  uint64_t id;
  dev_layout layout;
  pd_dtype dtype;
  dev_shape host; /* MIRRORED, SHARDED */
  dev_devset set; /* where it goes (issue #17): its components' devices */
  /* [set.n]: PER_COMPONENT uses one per component, others [0] */
  const stg_entry **entry;
  stg_file **file;
  dev_tensor *t;
  atomic_int pieces_left;
  atomic_bool failed;
  pd_code code; /* the first piece's error (ld->mu) */
  char *msg;
} load_tensor;

typedef struct load_piece {
  sched_work work; /* first */
  load_tensor *lt;
  int src; /* which entry/file of lt */
  uint64_t src_off, len;
  dev_layout wlay; /* how it is written */
  int comp;
  uint64_t dst_off;
  bool whole; /* not random-access: read the entry at once */
} load_piece;

struct load {
  sched_io io; /* first: the session's record */
  sched_session *ss;
  pthread_mutex_t mu; /* tensors' and the load's first errors */
  stg_file **files;
  stg_index **indexes;
  int n_files, cap_files;
  load_tensor *tensors;
  int n_tensors;
  const dev_devset *dflt; /* the request's default_devices (borrowed) */
  load_piece *pieces;
  int n_pieces;
  int n_total; /* tensors, kept for progress after the job's state goes */
  atomic_int tensors_left;
  _Atomic uint64_t bytes_done;
  uint64_t bytes_total;
  atomic_int tensors_done, tensors_failed;
  pd_code code;
  char message[DEV_STATUS_MSG_MAX];
  /* The open: its bounds and request (load_begin.c) */
  double deadline_s;             /* 0: none; the reads have none */
  bool published;                /* the handles are public (ss->mu) */
  const sched_load_request *req; /* the caller's, until it ran */
};

/* --- the load's resources ------------------------------------------------- */

/* Closes the files, frees the indexes and the tensors' state (what only
 * the reads need; the progress stays). */
static void load_release_job(load *ld) {
  for (int i = 0; i < ld->n_tensors; i++) {
    dev_tensor_release(ld->tensors[i].t);
    free(ld->tensors[i].name);
    free(ld->tensors[i].msg);
    free(ld->tensors[i].entry);
    free(ld->tensors[i].file);
  }
  free(ld->tensors);
  ld->tensors = NULL;
  ld->n_tensors = 0;
  for (int i = 0; i < ld->n_files; i++) {
    stg_index_free(ld->indexes[i]);
    stg_file_close(ld->files[i]);
  }
  free(ld->files);
  free(ld->indexes);
  ld->files = NULL;
  ld->indexes = NULL;
  ld->n_files = 0;
  free(ld->pieces);
  ld->pieces = NULL;
}

static void load_free(sched_io *io) {
  load *ld = (load *)io;
  load_release_job(ld);
  pthread_mutex_destroy(&ld->mu);
  free(ld);
}

/* Opens and indexes `name` (a file of the load); *ix gets its index. */
static pd_code load_open(load *ld, const char *name, stg_format format,
                         stg_index **ix, dev_status *st) {
  sched *s = ld->ss->owner;
  if (ld->n_files == ld->cap_files) {
    int cap = ld->cap_files ? ld->cap_files * 2 : 4;
    stg_file **f = realloc(ld->files, sizeof(*f) * (size_t)cap);
    if (f) ld->files = f;
    stg_index **x = f ? realloc(ld->indexes, sizeof(*x) * (size_t)cap) : NULL;
    if (!x) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    ld->indexes = x;
    ld->cap_files = cap;
  }
  stg_file *f = NULL;
  /* Every fetch of the open and index (and, once the deadline is lifted,
   * of the reads) stops when the session ends or the caller gives up. */
  stg_io_ctl ctl = {.deadline_s = ld->deadline_s, .cancel = &ld->io.cancelled};
  pd_code oc = stg_file_open_ctl(s->cfg.storage_cache, ld->ss->roots, name,
                                 &ctl, &f, st);
  if (oc != PD_OK) return sched_tenant_roots_note(s, ld->ss, oc, st);
  stg_index *x = NULL;
  pd_code c = stg_index_read(f, format, &x, st);
  if (c != PD_OK) {
    stg_file_close(f);
    return c;
  }
  ld->files[ld->n_files] = f;
  ld->indexes[ld->n_files++] = *ix = x;
  return PD_OK;
}

/* --- planning: entries, shapes, pieces ------------------------------------ */

static pd_code load_find(const stg_index *ix, stg_file *f, const char *name,
                         const stg_entry **out, dev_status *st) {
  const stg_entry *e = stg_index_find(ix, name);
  if (!e)
    return dev_error(st, PD_NOT_FOUND,
                     "tensor '%s' is not in %s (it holds %d tensors)", name,
                     stg_file_name(f), ix->n);
  *out = e;
  return PD_OK;
}

/* Resolves the entries of a PER_COMPONENT tensor: one file per component,
 * or entries "<name>:<k>" of the main file. */
static pd_code load_plan_components(load *ld, load_tensor *lt,
                                    const sched_load_tensor *rt,
                                    dev_status *st) {
  int n = lt->set.n; /* one component per device of its set */
  bool srcs = rt && rt->n_component_sources;
  if (srcs && rt->n_component_sources != n)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "tensor '%s': %d component sources for %d devices; "
                     "expected one file per device of its set (or none: "
                     "entries '%s:<k>')",
                     lt->name, rt->n_component_sources, n, lt->name);
  if (!srcs && ld->n_files > 0) /* as many as it has devices (issue #17) */
    PD_TRY(sched_components_check(ld->indexes[0], stg_file_name(ld->files[0]),
                                  lt->name, &lt->set, st));
  for (int k = 0; k < n; k++) {
    if (srcs) {
      stg_index *ix = NULL; /* each file by its own magic bytes */
      PD_TRY(load_open(ld, rt->component_sources[k], STG_FORMAT_AUTO, &ix, st));
      lt->file[k] = ld->files[ld->n_files - 1];
      PD_TRY(load_find(ix, lt->file[k], lt->name, &lt->entry[k], st));
    } else {
      if (ld->n_files == 0)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "tensor '%s': per-component without component "
                         "sources needs the request's source",
                         lt->name);
      char key[SCHED_NAME_MAX + 16];
      snprintf(key, sizeof key, "%s:%d", lt->name, k);
      lt->file[k] = ld->files[0];
      PD_TRY(load_find(ld->indexes[0], ld->files[0], key, &lt->entry[k], st));
    }
    if (lt->entry[k]->dtype != lt->entry[0]->dtype)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "tensor '%s': component %d is %s but component 0 is "
                       "%s; expected one dtype",
                       lt->name, k, pd_dtype_name(lt->entry[k]->dtype),
                       pd_dtype_name(lt->entry[0]->dtype));
  }
  return PD_OK;
}

/* Fills lt from the request's tensor (or, rt NULL, from a whole-file load
 * of `name` by `layout`), placed on rt's devices, else on ld->dflt. */
static pd_code load_plan_tensor(load *ld, load_tensor *lt, const char *name,
                                uint64_t id, const dev_layout *layout,
                                const sched_load_tensor *rt, dev_status *st) {
  if (!name)
    return dev_error(st, PD_INVALID_ARGUMENT, "handle %llu: no tensor name",
                     (unsigned long long)id);
  if (id == 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "tensor '%s': handle id 0 is reserved", name);
  lt->ld = ld;
  lt->id = id;
  lt->layout = *layout;
  dev_status in = DEV_STATUS_INIT; /* placement (issue #17) */
  if (sched_place(ld->ss, rt && rt->devices ? rt->devices : ld->dflt, &lt->set,
                  &in) != PD_OK)
    return dev_error(st, in.code, "tensor '%s': %s", name, in.msg);
  int ndev = lt->set.n;
  lt->name = strdup(name);
  lt->entry = calloc((size_t)ndev, sizeof(*lt->entry));
  lt->file = calloc((size_t)ndev, sizeof(*lt->file));
  if (!lt->name || !lt->entry || !lt->file)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  if (layout->kind == DEV_LAYOUT_PER_COMPONENT) {
    PD_TRY(load_plan_components(ld, lt, rt, st));
  } else if (layout->kind == DEV_LAYOUT_MIRRORED ||
             layout->kind == DEV_LAYOUT_SHARDED) {
    if (ld->n_files == 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "tensor '%s': the request names no source", name);
    lt->file[0] = ld->files[0];
    PD_TRY(load_find(ld->indexes[0], ld->files[0], name, &lt->entry[0], st));
    lt->host = lt->entry[0]->shape;
    if (layout->kind == DEV_LAYOUT_SHARDED &&
        (layout->axis < 0 || layout->axis >= lt->host.rank)) {
      char sb[160];
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "tensor '%s': sharded along axis %d, but its shape %s "
                       "has axes 0 to %d",
                       name, layout->axis,
                       dev_shape_str(&lt->host, sb, sizeof sb),
                       lt->host.rank - 1);
    }
  } else {
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "tensor '%s': layout kind %d; expected mirrored, sharded "
                     "or per-component",
                     name, (int)layout->kind);
  }
  lt->dtype = lt->entry[0]->dtype;
  return PD_OK;
}

/* Host bytes the tensor reads from storage, and the device bytes it takes. */
static void load_tensor_sizes(const load_tensor *lt, int n, uint64_t *read,
                              uint64_t *dev) {
  if (lt->layout.kind == DEV_LAYOUT_PER_COMPONENT) {
    *read = 0;
    for (int k = 0; k < n; k++) *read += lt->entry[k]->bytes;
    *dev = *read;
  } else {
    *read = lt->entry[0]->bytes;
    *dev = lt->layout.kind == DEV_LAYOUT_MIRRORED ? *read * (uint64_t)n : *read;
  }
}

static void piece_run(sched_work *w);

static load_piece *piece_add(load *ld, load_tensor *lt, int src,
                             uint64_t src_off, uint64_t len, dev_layout wlay,
                             int comp, uint64_t dst_off) {
  load_piece *p = &ld->pieces[ld->n_pieces++];
  p->work.run = piece_run;
  p->work.ss = ld->ss;
  p->lt = lt;
  p->src = src;
  p->src_off = src_off;
  p->len = len;
  p->wlay = wlay;
  p->comp = comp;
  p->dst_off = dst_off;
  p->whole = !stg_entry_random_access(lt->entry[src]);
  atomic_fetch_add(&lt->pieces_left, 1);
  return p;
}

/* Product of the dims before `axis`: 1 when a shard is one contiguous run. */
static int64_t dims_before(const dev_shape *s, int axis) {
  int64_t p = 1;
  for (int i = 0; i < axis; i++) p *= s->dims[i];
  return p;
}

/* A tensor written whole by its own layout (MIRRORED, or SHARDED along a
 * later axis): a random-access entry in up to n byte ranges, on chunk
 * boundaries, so that the workers share it; dev_tensor_write places any
 * range (one worker alone made four device copies of every byte). */
static void load_plan_ranges(load *ld, load_tensor *lt, int n) {
  const stg_entry *e = lt->entry[0];
  uint64_t chunk = ld->ss->owner->load_chunk;
  uint64_t chunks = (e->bytes + chunk - 1) / chunk;
  uint64_t k = stg_entry_random_access(e) && chunks > 1 ? chunks : 1;
  if (k > (uint64_t)n) k = (uint64_t)n;
  uint64_t per = (chunks + k - 1) / k * chunk, off = 0;
  do {
    uint64_t len = e->bytes - off < per ? e->bytes - off : per;
    piece_add(ld, lt, 0, off, len, lt->layout, 0, off);
    off += len;
  } while (off < e->bytes);
}

/* The pieces of one created tensor (see the top of the file). */
static void load_plan_pieces(load *ld, load_tensor *lt, int n) {
  const dev_layout comp_lay = {DEV_LAYOUT_PER_COMPONENT, 0, 0};
  const stg_entry *e = lt->entry[0];
  if (lt->layout.kind == DEV_LAYOUT_PER_COMPONENT) {
    for (int k = 0; k < n; k++)
      piece_add(ld, lt, k, 0, lt->entry[k]->bytes, comp_lay, k, 0);
    return;
  }
  bool split = lt->layout.kind == DEV_LAYOUT_SHARDED &&
               stg_entry_random_access(e) &&
               dims_before(&lt->host, lt->layout.axis) == 1;
  if (!split) {
    load_plan_ranges(ld, lt, n);
    return;
  }
  uint64_t off = 0;
  for (int k = 0; k < n; k++) {
    size_t bytes = 0;
    (void)dev_shape_byte_size(lt->dtype, dev_tensor_component_shape(lt->t, k),
                              &bytes, NULL); /* checked at creation */
    piece_add(ld, lt, 0, off, bytes, comp_lay, k, 0);
    off += bytes;
  }
}

/* --- the reads (on a load worker) ----------------------------------------- */

/* Before each chunk: the session's end, the test hook, a failed sibling. A
 * cancelled piece never calls the hook (it may run on the ending thread). */
static pd_code piece_check(const load_piece *p, uint64_t off, dev_status *st) {
  load_tensor *lt = p->lt;
  load *ld = lt->ld;
  sched *s = ld->ss->owner;
  if (!atomic_load(&ld->io.cancelled) && s->hook) {
    int comp = p->wlay.kind == DEV_LAYOUT_PER_COMPONENT ? p->comp : -1;
    PD_TRY(s->hook(s->hook_arg, lt->name, comp, p->src_off + off, st));
  }
  if (atomic_load(&ld->io.cancelled))
    return dev_error(st, PD_CANCELLED,
                     "the session ended while the tensor was loading");
  if (atomic_load(&lt->failed))
    return dev_error(st, PD_ABORTED, "another part of the tensor failed");
  return PD_OK;
}

static pd_code piece_copy(load_piece *p, const char *buf, uint64_t off,
                          size_t n, dev_status *st) {
  load_tensor *lt = p->lt;
  PD_TRY(
      dev_tensor_write(lt->t, &p->wlay, p->comp, p->dst_off + off, buf, n, st));
  atomic_fetch_add(&lt->ld->bytes_done, (uint64_t)n);
  return PD_OK;
}

static size_t piece_chunk(const load_piece *p, uint64_t off) {
  size_t chunk = p->lt->ld->ss->owner->load_chunk;
  uint64_t left = p->len - off;
  return left < chunk ? (size_t)left : chunk;
}

typedef struct piece_span {
  load_piece *p;
  uint64_t off; /* of the chunk, in the piece */
} piece_span;

static pd_code piece_span_write(void *arg, uint64_t done, const void *data,
                                size_t len, dev_status *st) {
  piece_span *ps = arg;
  return piece_copy(ps->p, data, ps->off + done, len, st);
}

/* A random-access range, chunk by chunk, each written to the device straight
 * from the cache's blocks (stg_entry_read_spans): no staging buffer, one
 * copy less. */
static pd_code piece_read_chunks(load_piece *p, dev_status *st) {
  load_tensor *lt = p->lt;
  if (p->len == 0) return piece_check(p, 0, st); /* an empty shard */
  uint64_t off = 0;
  do {
    size_t n = piece_chunk(p, off);
    PD_TRY(piece_check(p, off, st));
    piece_span ps = {p, off};
    PD_TRY(stg_entry_read_spans(lt->file[p->src], lt->entry[p->src],
                                p->src_off + off, n, piece_span_write, &ps,
                                st));
    atomic_fetch_add(&lt->ld->ss->owner->n_load_steps, 1);
    off += n;
  } while (off < p->len);
  return PD_OK;
}

/* An entry that must be read whole (deflated, byte-swapped, transposed):
 * into host memory at once, then written chunk by chunk. */
static pd_code piece_read_whole(load_piece *p, dev_status *st) {
  load_tensor *lt = p->lt;
  const stg_entry *e = lt->entry[p->src];
  PD_TRY(piece_check(p, 0, st));
  char *buf = malloc(e->bytes ? (size_t)e->bytes : 1);
  if (!buf)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "out of host memory for the %llu bytes of tensor '%s'",
                     (unsigned long long)e->bytes, lt->name);
  pd_code c = PD_OK;
  if (e->bytes)
    PD_TRY_GOTO(
        stg_entry_read(lt->file[p->src], e, 0, buf, (size_t)e->bytes, st), c,
        out);
  for (uint64_t off = 0; off < p->len;) {
    size_t n = piece_chunk(p, off);
    if (off > 0) PD_TRY_GOTO(piece_check(p, off, st), c, out);
    PD_TRY_GOTO(piece_copy(p, buf + p->src_off + off, off, n, st), c, out);
    atomic_fetch_add(&lt->ld->ss->owner->n_load_steps, 1);
    off += n;
  }
out:
  free(buf);
  return c;
}

/* The load ended: what only the reads needed goes, the record stays. */
static void load_end(load *ld) {
  sched_session *ss = ld->ss;
  sched *s = ss->owner;
  load_release_job(ld);
  atomic_store(&ld->io.finished, true);
  sched_io_unref(&ld->io); /* the job's */
  sched_session_put(ss);
  sched_io_end(s);
}

static void tensor_end(load_tensor *lt) {
  load *ld = lt->ld;
  pthread_mutex_lock(&ld->mu);
  pd_code code = lt->code;
  if (code != PD_OK && ld->code == PD_OK) {
    ld->code = code;
    snprintf(ld->message, sizeof ld->message, "%s", lt->msg ? lt->msg : "");
  }
  pthread_mutex_unlock(&ld->mu);
  dev_tensor_complete(lt->t, code, lt->msg ? lt->msg : "");
  atomic_fetch_add(&ld->ss->owner->n_load_steps, 1);
  if (code != PD_OK) atomic_fetch_add(&ld->tensors_failed, 1);
  atomic_fetch_add(&ld->tensors_done, 1);
  if (atomic_fetch_sub(&ld->tensors_left, 1) == 1) load_end(ld);
}

static void piece_end(load_piece *p, pd_code c, const dev_status *st) {
  load_tensor *lt = p->lt;
  if (c != PD_OK) {
    pthread_mutex_lock(&lt->ld->mu);
    if (lt->code == PD_OK) {
      lt->code = c;
      size_t len = strlen(lt->name) + strlen(st->msg) + 16;
      lt->msg = malloc(len);
      if (lt->msg) snprintf(lt->msg, len, "tensor '%s': %s", lt->name, st->msg);
    }
    pthread_mutex_unlock(&lt->ld->mu);
    atomic_store(&lt->failed, true); /* after the code: siblings see it */
  }
  if (atomic_fetch_sub(&lt->pieces_left, 1) == 1) tensor_end(lt);
}

static void piece_run(sched_work *w) {
  load_piece *p = (load_piece *)w;
  dev_status st = DEV_STATUS_INIT;
  pd_code c = p->whole ? piece_read_whole(p, &st) : piece_read_chunks(p, &st);
  piece_end(p, c, &st); /* may free p */
}

/* --- sched_load_begin ------------------------------------------------------ */

static pd_code load_check_name(const char *name, dev_status *st) {
  if (strlen(name) >= SCHED_NAME_MAX)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "tensor name '%.64s...' is %zu bytes; the limit is %d",
                     name, strlen(name), SCHED_NAME_MAX - 1);
  return PD_OK;
}

/* True for an entry "<name>:0" (component 0 of a per-component save). */
static bool is_component0(const char *name) {
  size_t len = strlen(name);
  return len > 2 && strcmp(name + len - 2, ":0") == 0;
}

/* Whole-file load: every entry by the default layout (per-component: the
 * tensors whose entry "<name>:0" exists), ids first_id, first_id + 1, ... */
static pd_code load_plan_all(load *ld, const sched_load_request *req,
                             dev_status *st) {
  if (ld->n_files == 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "a load of every tensor needs a source");
  const stg_index *ix = ld->indexes[0];
  bool per = req->default_layout.kind == DEV_LAYOUT_PER_COMPONENT;
  int n = 0;
  for (int i = 0; i < ix->n; i++)
    n += !per || is_component0(ix->entries[i].name);
  if (n > SCHED_LOAD_MAX_TENSORS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s holds %d tensors; one load takes at most %d (name "
                     "them in batches)",
                     stg_file_name(ld->files[0]), n, SCHED_LOAD_MAX_TENSORS);
  if (req->first_id == 0 || req->first_id - 1 > UINT64_MAX - (uint64_t)n)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "first_id %llu: expected 1 or more, with room for %d ids",
                     (unsigned long long)req->first_id, n);
  ld->tensors = calloc(n ? (size_t)n : 1, sizeof(*ld->tensors));
  if (!ld->tensors)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  for (int i = 0; i < ix->n; i++) {
    char name[SCHED_NAME_MAX + 1];
    size_t len = strlen(ix->entries[i].name);
    if (per && !is_component0(ix->entries[i].name)) continue;
    PD_TRY(load_check_name(ix->entries[i].name, st));
    snprintf(name, sizeof name, "%.*s", (int)(per ? len - 2 : len),
             ix->entries[i].name);
    load_tensor *lt = &ld->tensors[ld->n_tensors++];
    PD_TRY(load_plan_tensor(ld, lt, name,
                            req->first_id + (uint64_t)(ld->n_tensors - 1),
                            &req->default_layout, NULL, st));
  }
  return PD_OK;
}

static pd_code load_plan(load *ld, const sched_load_request *req,
                         dev_status *st) {
  ld->dflt = req->default_devices;
  if (req->n == 0) return load_plan_all(ld, req, st);
  ld->tensors = calloc((size_t)req->n, sizeof(*ld->tensors));
  if (!ld->tensors)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  for (int i = 0; i < req->n; i++) {
    const sched_load_tensor *rt = &req->tensors[i];
    if (rt->name) PD_TRY(load_check_name(rt->name, st));
    for (int j = 0; j < i; j++)
      if (req->tensors[j].id == rt->id)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "handle %llu is named twice (tensors %d and %d)",
                         (unsigned long long)rt->id, j, i);
    load_tensor *lt = &ld->tensors[ld->n_tensors++];
    PD_TRY(load_plan_tensor(ld, lt, rt->name, rt->id, &rt->layout, rt, st));
  }
  return PD_OK;
}

/* The session is open, no id is live, and the tensors fit (ss->mu held). */
static pd_code load_room_locked(load *ld, uint64_t bytes, dev_status *st) {
  sched_session *ss = ld->ss;
  if (ss->closed) return sched_closed_error(ss, st);
  for (int i = 0; i < ld->n_tensors; i++)
    if (sched_htab_find(&ss->handles, ld->tensors[i].id))
      return dev_error(st, PD_ALREADY_EXISTS,
                       "tensor '%s': handle %llu is already live in this "
                       "session",
                       ld->tensors[i].name,
                       (unsigned long long)ld->tensors[i].id);
  return sched_check_room_locked(ss, ld->n_tensors, bytes, st);
}

static pd_code load_room(load *ld, uint64_t bytes, dev_status *st) {
  pthread_mutex_lock(&ld->ss->mu);
  pd_code c = load_room_locked(ld, bytes, st);
  pthread_mutex_unlock(&ld->ss->mu);
  return c;
}

/* Creates the pending tensors and plans their pieces. */
static pd_code load_create(load *ld, dev_status *st) {
  dev_engine *e = ld->ss->owner->engine;
  int n = dev_engine_num_devices(e);
  ld->pieces =
      calloc((size_t)ld->n_tensors * (size_t)n + 1, sizeof(*ld->pieces));
  if (!ld->pieces) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  dev_shape *shapes = calloc((size_t)n, sizeof(*shapes));
  if (!shapes) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  pd_code c = PD_OK;
  for (int i = 0; c == PD_OK && i < ld->n_tensors; i++) {
    load_tensor *lt = &ld->tensors[i];
    bool per = lt->layout.kind == DEV_LAYOUT_PER_COMPONENT;
    int nc = lt->set.n;
    for (int k = 0; per && k < nc; k++) shapes[k] = lt->entry[k]->shape;
    dev_status inner = DEV_STATUS_INIT;
    if (dev_tensor_create_pending_on(e, &lt->set, lt->dtype, &lt->layout,
                                     &lt->host, per ? shapes : NULL, &lt->t,
                                     &inner) != PD_OK)
      c = dev_error(st, inner.code, "tensor '%s': %s", lt->name, inner.msg);
    else
      load_plan_pieces(ld, lt, nc);
  }
  free(shapes);
  return c;
}

static pd_code load_result_new(load *ld, sched_load_result **out,
                               dev_status *st) {
  sched_load_result *r = calloc(1, sizeof(*r));
  if (r)
    r->tensors =
        calloc(ld->n_tensors ? (size_t)ld->n_tensors : 1, sizeof(*r->tensors));
  if (!r || !r->tensors) {
    free(r); /* r->tensors is NULL */
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  r->n = ld->n_tensors;
  r->total_bytes = ld->bytes_total;
  for (int i = 0; i < ld->n_tensors; i++) {
    load_tensor *lt = &ld->tensors[i];
    snprintf(r->tensors[i].name, sizeof r->tensors[i].name, "%s", lt->name);
    r->tensors[i].id = lt->id;
    r->tensors[i].dtype = lt->dtype;
    r->tensors[i].shape = *dev_tensor_shape(lt->t);
  }
  *out = r;
  return PD_OK;
}

/* Publishes the handles and lists the load, all or none (ss->mu). */
static pd_code load_publish(load *ld, uint64_t bytes, dev_status *st) {
  sched_session *ss = ld->ss;
  pthread_mutex_lock(&ss->mu);
  pd_code c = load_room_locked(ld, bytes, st);
  if (c == PD_OK && atomic_load(&ld->io.cancelled))
    c = dev_error(st, PD_CANCELLED,
                  "the load was abandoned before its handles were published "
                  "(its call was cancelled or its session ended)");
  if (c == PD_OK && !sched_htab_reserve(&ss->handles, (size_t)ld->n_tensors))
    c = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  if (c == PD_OK) {
    for (int i = 0; i < ld->n_tensors; i++) {
      load_tensor *lt = &ld->tensors[i];
      uint64_t b = dev_tensor_bytes(lt->t);
      dev_tensor_retain(lt->t);
      sched_htab_insert(&ss->handles, lt->id, lt->t, b, NULL);
      sched_charge_tensor_locked(ss, lt->t, b, true);
    }
    ld->published = true;
  }
  pthread_mutex_unlock(&ss->mu);
  return c;
}

/* Hands the pieces to the workers (or, with no tensor, ends at once). */
static void load_start(load *ld) {
  sched *s = ld->ss->owner;
  sched_session_ref(ld->ss); /* the job's */
  sched_io_ref(&ld->io);
  atomic_store(&ld->tensors_left, ld->n_tensors);
  if (ld->n_tensors == 0) {
    load_end(ld);
    return;
  }
  int n = ld->n_pieces;
  load_piece *pieces = ld->pieces; /* the last piece may free ld */
  for (int i = 0; i < n; i++) sched_work_queue(s, &pieces[i].work);
}

static pd_code load_check_request(sched *s, const sched_load_request *req,
                                  dev_status *st) {
  if (!s->cfg.storage_roots)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "no storage root is configured: the daemon reads "
                     "checkpoints only beneath [storage] roots "
                     "(--storage-root)");
  if (!req)
    return dev_error(st, PD_INVALID_ARGUMENT, "sched_load_begin: NULL request");
  if (req->n < 0 || req->n > SCHED_LOAD_MAX_TENSORS ||
      (req->n && !req->tensors))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "a load names %d tensors; expected 0 (all) to %d", req->n,
                     SCHED_LOAD_MAX_TENSORS);
  return PD_OK;
}

pd_code sched_load_new(sched_session *ss, const sched_load_request *req,
                       double deadline_s, sched_io **out, dev_status *st) {
  PD_TRY(load_check_request(ss->owner, req, st));
  load *ld = calloc(1, sizeof(*ld));
  if (!ld) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  ld->ss = ss;
  ld->req = req;
  ld->deadline_s = deadline_s;
  pthread_mutex_init(&ld->mu, NULL);
  atomic_init(&ld->io.refs, 2); /* the list's and the caller's */
  ld->io.is_load = true;
  ld->io.free = load_free;
  pthread_mutex_lock(&ss->mu);
  bool closed = ss->closed;
  if (!closed) {
    ld->io.id = ++ss->last_load_id;
    sched_io_add_locked(ss, &ld->io);
  }
  pthread_mutex_unlock(&ss->mu);
  if (closed) {
    load_free(&ld->io);
    return sched_closed_error(ss, st);
  }
  sched_io_begin(ss->owner);
  *out = &ld->io;
  return PD_OK;
}

/* Opens, plans, creates and publishes (the result in *out), all or none. */
static pd_code load_prepare(load *ld, const sched_load_request *req,
                            sched_load_result **out, dev_status *st) {
  stg_index *ix = NULL;
  if (req->source && req->source[0])
    PD_TRY(load_open(ld, req->source, req->format, &ix, st));
  PD_TRY(load_plan(ld, req, st));
  ld->n_total = ld->n_tensors;
  uint64_t dev_bytes = 0;
  for (int i = 0; i < ld->n_tensors; i++) {
    uint64_t rd = 0, dv = 0;
    load_tensor_sizes(&ld->tensors[i], ld->tensors[i].set.n, &rd, &dv);
    ld->bytes_total += rd;
    dev_bytes += dv;
  }
  PD_TRY(load_room(ld, dev_bytes, st)); /* before allocating */
  PD_TRY(load_create(ld, st));
  sched_load_result *r = NULL;
  PD_TRY(load_result_new(ld, &r, st));
  pd_code c = load_publish(ld, dev_bytes, st);
  if (c != PD_OK) {
    free(r->tensors);
    free(r);
    return c;
  }
  r->load_id = ld->io.id;
  *out = r;
  return PD_OK;
}

pd_code sched_load_run(sched_io *io, sched_load_result **out, dev_status *st) {
  load *ld = (load *)io;
  sched_load_result *r = NULL;
  pd_code c = load_prepare(ld, ld->req, &r, st);
  if (c != PD_OK) {
    sched_io_remove(ld->ss, &ld->io);
    sched_io_end(ld->ss->owner);
    return c;
  }
  for (int i = 0; i < ld->n_files; i++) stg_file_set_deadline(ld->files[i], 0);
  load_start(ld); /* may end the load at once */
  *out = r;
  return PD_OK;
}

void sched_load_abandon(sched_io *io) {
  load *ld = (load *)io;
  pthread_mutex_lock(&ld->ss->mu);
  if (!ld->published) atomic_store(&ld->io.cancelled, true);
  pthread_mutex_unlock(&ld->ss->mu);
}

pd_code sched_load_get_progress(sched_session *ss, uint64_t load_id,
                                sched_load_progress *out, dev_status *st) {
  pthread_mutex_lock(&ss->mu);
  sched_io *io = ss->io;
  while (io && !(io->is_load && io->id == load_id)) io = io->next;
  if (io) sched_io_ref(io);
  pthread_mutex_unlock(&ss->mu);
  if (!io)
    return dev_error(st, PD_NOT_FOUND,
                     "load %llu not found in this session (never begun, or "
                     "older than the last %d finished loads)",
                     (unsigned long long)load_id, SCHED_LOADS_KEPT);
  load *ld = (load *)io;
  sched_load_progress p;
  memset(&p, 0, sizeof p);
  p.done = atomic_load(&io->finished);
  p.bytes_done = atomic_load(&ld->bytes_done);
  p.bytes_total = ld->bytes_total;
  p.tensors_done = atomic_load(&ld->tensors_done);
  p.tensors_failed = atomic_load(&ld->tensors_failed);
  p.tensors_total = ld->n_total;
  pthread_mutex_lock(&ld->mu);
  p.code = ld->code;
  snprintf(p.message, sizeof p.message, "%s", ld->message);
  pthread_mutex_unlock(&ld->mu);
  sched_io_unref(io);
  *out = p;
  return PD_OK;
}
