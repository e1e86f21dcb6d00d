/* Collectives whose device set spans ranks (issue #16), through the
 * mesh's dev_mesh_transport. AllReduce and ReduceScatter are hierarchical
 * (hier_run below): one transport participant per rank, the rank's own
 * participants meeting in-process. The others (and those two with
 * PARADEV_MESH_FLAT_ALLREDUCE=1, a test knob) run one participant per
 * device of the set (ctx->index), each on its own executor thread.
 * Every transport participant (a rank's leader, which first takes the
 * largest of its rank's flags) first all-reduces (MAX) an int32 failure
 * flag, ((n - index) << 5) | code for a
 * participant whose inputs failed, else 0: the largest names the failed
 * participant with the lowest index and its code, which then broadcasts
 * its message (256 bytes), so a failed input anywhere fails the output
 * everywhere with its code, naming the device and why. Then the data:
 *   AllReduce      the input copied to the output, all_reduce in place
 *                  (mean: sum, then a division by n; hierarchical: the
 *                  rank's inputs reduced into its leader's output first,
 *                  which the leader all-reduces with the other ranks'
 *                  leaders, then copied to the rank's other outputs);
 *   Broadcast      the root (attr root: an index in the set) copies its
 *                  input to its output, broadcast in place;
 *   AllGather      each participant's byte count gathered first (the
 *                  components may differ along the axis), then the bytes,
 *                  rearranged for an axis other than the outermost;
 *   ReduceScatter  all_reduce of a copy of the input (hierarchical: of
 *                  the rank's reduced inputs, in a buffer of the
 *                  leader's), then this participant's rows of axis 0 (the local collectives'
 *                  split: the first rows % n participants one more).
 * Bool reductions are logical (sum, max, mean: or; prod, min: and), as the
 * local collectives'. The CPU backend's buffers are host memory and go to
 * the transport directly; other backends' are staged through host buffers
 * (copy_d2h after synchronize, copy_h2d; on the CPU too with
 * PARADEV_MESH_STAGED=1 at the engine's creation, so tests cover it;
 * hierarchical: each participant stages its own input, the transport sees
 * the leader's one host buffer). Without a transport every local
 * participant fails at once with UNAVAILABLE; a transport error fails the
 * outputs with its code and message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh_int.h"

/* A reference on the op's transport (the one current at its submission,
 * mesh_int.h dev__mesh_coll.t), or NULL. */
static dev_mesh_transport *transport_take(const dev__mesh_coll *mc) {
  dev_mesh_transport *t = mc->t;
  if (t) t->retain(t);
  return t;
}

/* buf[0..count) /= n, in its dtype (integers truncate, as the local
 * collectives' mean does; 16-bit floats through float32). */
static void divide(void *buf, size_t count, pd_dtype dt, int n) {
  for (size_t i = 0; i < count; i++) switch (dt) {
      case PD_FLOAT32: ((float *)buf)[i] /= (float)n; break;
      case PD_FLOAT64: ((double *)buf)[i] /= (double)n; break;
      case PD_INT32: ((int32_t *)buf)[i] /= n; break;
      case PD_INT64: ((int64_t *)buf)[i] /= n; break;
      case PD_UINT8:
        ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / n);
        break;
      case PD_FLOAT16: {
        uint16_t *h = buf;
        h[i] = dev_float_to_half(dev_half_to_float(h[i]) / (float)n);
        break;
      }
      case PD_BFLOAT16: {
        uint16_t *h = buf;
        h[i] = dev_float_to_bfloat16(dev_bfloat16_to_float(h[i]) / (float)n);
        break;
      }
      default: return; /* bool: a logical or, nothing to divide */
    }
}

/* The reduction the transport runs for `red` on `dt` (mean: sum). */
static int transport_red(int red, pd_dtype dt) {
  if (dt == PD_BOOL)
    return red == DEV_RED_PROD || red == DEV_RED_MIN ? DEV_RED_MIN
                                                     : DEV_RED_MAX;
  return red == DEV_RED_MEAN ? DEV_RED_SUM : red;
}

typedef struct xfer {
  dev__mesh *m;
  dev_kernel_ctx *ctx;
  bool staged;
  const void *in; /* host view of the input */
  void *out;      /* host view of the output */
  size_t in_bytes, out_bytes;
  void *hin, *hout; /* staging buffers */
} xfer;

static pd_code stage_in(xfer *x, dev_status *st) {
  dev_kernel_ctx *c = x->ctx;
  const size_t es = pd_dtype_size(c->in_dtype[0]);
  x->in_bytes = (size_t)dev_num_elems(&c->in_shape[0]) * es;
  x->out_bytes =
      (size_t)dev_num_elems(&c->out_shape[0]) * pd_dtype_size(c->out_dtype[0]);
  x->staged = x->m->staged;
  if (!x->staged) {
    x->in = c->in_data[0];
    x->out = c->out_data[0];
    return PD_OK;
  }
  dev_backend *b = x->m->inner;
  const int dl = c->device - x->m->first;
  x->hin = malloc(x->in_bytes ? x->in_bytes : 1);
  x->hout = malloc(x->out_bytes ? x->out_bytes : 1);
  if (!x->hin || !x->hout)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "%s: cannot allocate %zu bytes of host staging",
                     c->op->name, x->in_bytes + x->out_bytes);
  PD_TRY(b->synchronize(b, dl, st));
  if (x->in_bytes)
    PD_TRY(b->copy_d2h(b, dl, x->hin, c->in_data[0], x->in_bytes, st));
  x->in = x->hin;
  x->out = x->hout;
  return PD_OK;
}

static pd_code stage_out(xfer *x, dev_status *st) {
  if (!x->staged || !x->out_bytes) return PD_OK;
  dev_backend *b = x->m->inner;
  return b->copy_h2d(b, x->ctx->device - x->m->first, x->ctx->out_data[0],
                     x->hout, x->out_bytes, st);
}

/* Moves t's status into *st, naming the collective. */
static pd_code transport_error(const dev_kernel_ctx *c, const char *what,
                               const dev_status *ts, dev_status *st) {
  char sb[DEV_DEVSET_STR_MAX];
  return dev_error(st, ts->code == PD_OK ? PD_UNKNOWN : ts->code,
                   "%s over devices %s (%s): %s", c->op->name,
                   dev_devset_str(c->devset, sb, sizeof sb), what, ts->msg);
}

static pd_code gather(dev_mesh_transport *t, void *g, xfer *x, dev_status *st) {
  dev_kernel_ctx *c = x->ctx;
  const int n = c->devset->n;
  dev_status ts = DEV_STATUS_INIT;
  uint64_t mine = x->in_bytes, sizes[PD_MAX_DEVICES];
  size_t eight[PD_MAX_DEVICES], in_bytes[PD_MAX_DEVICES];
  for (int i = 0; i < n; i++) eight[i] = sizeof(uint64_t);
  if (t->all_gather(t, g, &mine, eight, sizes, &ts) != PD_OK)
    return transport_error(c, "sizes", &ts, st);
  size_t total = 0;
  for (int i = 0; i < n; i++) total += in_bytes[i] = (size_t)sizes[i];
  if (total != x->out_bytes)
    return dev_error(st, PD_INTERNAL,
                     "%s: the participants send %zu bytes in all; the output "
                     "holds %zu",
                     c->op->name, total, x->out_bytes);
  const dev_shape *s = &c->in_shape[0];
  int axis = (int)c->attrs[0].u.i;
  if (axis < 0) axis += s->rank;
  int64_t outer = 1;
  for (int i = 0; i < axis; i++) outer *= s->dims[i];
  if (outer <= 1) { /* participant-major is the output's order */
    if (t->all_gather(t, g, x->in, in_bytes, x->out, &ts) != PD_OK)
      return transport_error(c, "data", &ts, st);
    return PD_OK;
  }
  char *tmp = malloc(total ? total : 1);
  if (!tmp)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "%s: cannot allocate %zu bytes to gather into",
                     c->op->name, total);
  pd_code rc = t->all_gather(t, g, x->in, in_bytes, tmp, &ts);
  if (rc != PD_OK) {
    free(tmp);
    return transport_error(c, "data", &ts, st);
  }
  /* Participant p's block is [outer, rows_p * inner] bytes: row x of the
   * output is each participant's row x, in order. */
  size_t off[PD_MAX_DEVICES + 1] = {0}, out_row = total / (size_t)outer;
  for (int p = 0; p < n; p++) off[p + 1] = off[p] + in_bytes[p];
  char *o = x->out;
  for (int64_t r = 0; r < outer; r++) {
    size_t at = (size_t)r * out_row;
    for (int p = 0; p < n; p++) {
      size_t run = in_bytes[p] / (size_t)outer;
      if (run) memcpy(o + at, tmp + off[p] + (size_t)r * run, run);
      at += run;
    }
  }
  free(tmp);
  return PD_OK;
}

/* The data part of the collective (the failure flag said none failed). */
static pd_code run_data(dev_mesh_transport *t, void *g, xfer *x,
                        dev_status *st) {
  dev_kernel_ctx *c = x->ctx;
  const int n = c->devset->n, me = c->index;
  const pd_dtype dt = c->in_dtype[0];
  const size_t es = pd_dtype_size(dt);
  dev_status ts = DEV_STATUS_INIT;
  switch ((dev_collective_kind)c->op->collective) {
    case DEV_COLL_ALL_REDUCE: {
      const int red =
          dev_reduction_from_name(c->attrs[0].u.s.ptr, c->attrs[0].u.s.len);
      if (x->in_bytes) memcpy(x->out, x->in, x->in_bytes);
      const size_t count = x->in_bytes / es;
      if (t->all_reduce(t, g, x->out, count, dt, transport_red(red, dt), &ts) !=
          PD_OK)
        return transport_error(c, "all-reduce", &ts, st);
      if (red == DEV_RED_MEAN) divide(x->out, count, dt, n);
      return PD_OK;
    }
    case DEV_COLL_BROADCAST: {
      const int root = (int)c->attrs[0].u.i;
      if (me == root && x->in_bytes) memcpy(x->out, x->in, x->out_bytes);
      if (t->broadcast(t, g, x->out, x->out_bytes, root, &ts) != PD_OK)
        return transport_error(c, "broadcast", &ts, st);
      return PD_OK;
    }
    case DEV_COLL_ALL_GATHER: return gather(t, g, x, st);
    case DEV_COLL_REDUCE_SCATTER: {
      const int red =
          dev_reduction_from_name(c->attrs[0].u.s.ptr, c->attrs[0].u.s.len);
      const dev_shape *s = &c->in_shape[0];
      const int64_t rows = s->rank > 0 ? s->dims[0] : 1;
      const size_t count = x->in_bytes / es;
      const size_t row_bytes = rows ? x->in_bytes / (size_t)rows : 0;
      void *tmp = malloc(x->in_bytes ? x->in_bytes : 1);
      if (!tmp)
        return dev_error(st, PD_RESOURCE_EXHAUSTED,
                         "%s: cannot allocate %zu bytes to reduce into",
                         c->op->name, x->in_bytes);
      if (x->in_bytes) memcpy(tmp, x->in, x->in_bytes);
      if (t->all_reduce(t, g, tmp, count, dt, transport_red(red, dt), &ts) !=
          PD_OK) {
        free(tmp);
        return transport_error(c, "all-reduce", &ts, st);
      }
      const int64_t q = rows / n, r = rows % n;
      const int64_t first = me * q + (me < r ? me : r);
      const int64_t mine = q + (me < r ? 1 : 0);
      char *from = (char *)tmp + (size_t)first * row_bytes;
      if (red == DEV_RED_MEAN)
        divide(from, (size_t)mine * row_bytes / es, dt, n);
      if (mine * (int64_t)row_bytes > 0)
        memcpy(x->out, from, (size_t)mine * row_bytes);
      free(tmp);
      return PD_OK;
    }
    case DEV_COLL_NONE: break;
  }
  return dev_error(st, PD_INTERNAL, "%s: unknown collective kind %d",
                   c->op->name, c->op->collective);
}

/* --- AllReduce and ReduceScatter, one participant per rank ----------------- */

/* The transport moves the data in chunks of at least this many bytes (an
 * eighth of the buffer when that is more: each of Gloo's calls costs a few
 * round trips, 1 MiB chunks ran at 0.6x of one call here), so the local
 * reduction of the next chunk and the copies of the last overlap it. */
#define CHUNK_BYTES ((size_t)4 << 20)

typedef enum { H_WAIT, H_DATA, H_FLAG, H_NOTRANS, H_ERR } hphase;

typedef struct hslot {
  const void *in; /* host view of the participant's input */
  int32_t flag;   /* its failure flag (above), 0 when its input is good */
  dev_status fail;
} hslot;

struct dev__mesh_hier {
  int nloc;                /* this rank's participants */
  int loc[PD_MAX_DEVICES]; /* their set indices, in set order; [0] leads */
  dev_devset leaders;      /* each rank's first participant, in set order */
  int me_leader;           /* this rank's leader's index in `leaders` */
  pthread_mutex_t mu;      /* everything below */
  pthread_cond_t cv;
  int arrived, finished;
  hphase phase;
  int who;        /* H_FLAG: the failed participant (set index) ... */
  pd_code code;   /* ... its code ... */
  char why[256];  /* ... and its message */
  dev_status err; /* H_NOTRANS, H_ERR, or `aborted`: the error */
  char *buf;      /* H_DATA: the leader's buffer the transport reduces */
  size_t count, chunk;
  int nch, transported;
  bool aborted;                /* the transport failed during the data */
  int reduced[PD_MAX_DEVICES]; /* chunks reduced, per helper */
  hslot slot[];                /* nloc, in set order */
};

bool dev__mesh_hier_init(dev__mesh *m, dev__mesh_coll *mc) {
  mc->hier = NULL;
  if (m->flat ||
      (mc->kind != DEV_COLL_ALL_REDUCE && mc->kind != DEV_COLL_REDUCE_SCATTER))
    return true;
  const dev_devset *set = &mc->set;
  int nloc = 0;
  for (int i = 0; i < set->n; i++)
    nloc += dev__mesh_rank_of(m, set->dev[i]) == m->rank;
  if (nloc == 0) return true; /* nothing of it runs here */
  dev__mesh_hier *h = calloc(1, sizeof *h + sizeof(hslot) * (size_t)nloc);
  if (!h) return false;
  bool seen[PD_MAX_DEVICES] = {false};
  for (int i = 0; i < set->n; i++) {
    const int r = dev__mesh_rank_of(m, set->dev[i]);
    if (!seen[r]) {
      seen[r] = true;
      if (r == m->rank) h->me_leader = h->leaders.n;
      h->leaders.dev[h->leaders.n++] = set->dev[i];
    }
    if (r == m->rank) h->loc[h->nloc++] = i;
  }
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  mc->hier = h;
  return true;
}

void dev__mesh_hier_free(dev__mesh_coll *mc) {
  dev__mesh_hier *h = mc->hier;
  if (!h) return;
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  free(h);
  mc->hier = NULL;
}

static void h_publish(dev__mesh_hier *h, hphase p) {
  pthread_mutex_lock(&h->mu);
  h->phase = p;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

/* Participant (local slot li, set index me)'s outcome of a phase that
 * moves no data. */
static pd_code h_outcome(dev__mesh *m, const dev__mesh_coll *mc,
                         const dev__mesh_hier *h, int li,
                         const dev_kernel_ctx *c, dev_status *st) {
  const hslot *s = &h->slot[li];
  if (h->phase == H_ERR || (h->phase == H_NOTRANS && !s->flag))
    return dev_error(st, h->err.code, "%s", h->err.msg);
  if (s->flag && (h->phase == H_NOTRANS || h->who == c->index))
    return dev_error(st, s->fail.code, "%s", s->fail.msg);
  const int dev = mc->set.dev[h->who];
  return dev_error(st, h->code == PD_OK ? PD_UNKNOWN : h->code,
                   "%s: cancelled because its input failed on device %d "
                   "(rank %d of the mesh): %s",
                   c->op->name, dev, dev__mesh_rank_of(m, dev), h->why);
}

/* Participant me's rows of ReduceScatter's reduced `buf`, into its output
 * (the local collectives' split: the first rows % n one more). */
static pd_code rs_take(xfer *x, const char *buf, int red, dev_status *st) {
  dev_kernel_ctx *c = x->ctx;
  const int n = c->devset->n, me = c->index;
  const pd_dtype dt = c->in_dtype[0];
  const size_t es = pd_dtype_size(dt);
  const dev_shape *s = &c->in_shape[0];
  const int64_t rows = s->rank > 0 ? s->dims[0] : 1;
  const size_t row_bytes = rows ? x->in_bytes / (size_t)rows : 0;
  const int64_t q = rows / n, r = rows % n;
  const int64_t first = me * q + (me < r ? me : r);
  const int64_t mine = q + (me < r ? 1 : 0);
  const size_t bytes = (size_t)mine * row_bytes;
  if (bytes) memcpy(x->out, buf + (size_t)first * row_bytes, bytes);
  if (red == DEV_RED_MEAN) divide(x->out, bytes / es, dt, n);
  return stage_out(x, st);
}

/* The leader: the flag and the data over the transport, among leaders. */
static pd_code h_lead(dev__mesh *m, const dev__mesh_coll *mc, dev__mesh_hier *h,
                      xfer *x, int red, dev_status *st) {
  dev_kernel_ctx *c = x->ctx;
  const int n = mc->set.n, nhelp = h->nloc - 1;
  const pd_dtype dt = c->in_dtype[0];
  const size_t es = pd_dtype_size(dt);
  const bool ar = mc->kind == DEV_COLL_ALL_REDUCE;
  dev_status ts = DEV_STATUS_INIT;
  pthread_mutex_lock(&h->mu);
  while (h->arrived < h->nloc) pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
  /* The buffer the transport reduces: this output (AllReduce) or a copy
   * of the whole input (ReduceScatter); none is this leader's failure. */
  h->count = x->in_bytes / es;
  char *own = NULL;
  if (!h->slot[0].flag) {
    h->buf = ar ? x->out : (own = malloc(x->in_bytes ? x->in_bytes : 1));
    if (!h->buf) {
      h->slot[0].flag =
          (int32_t)(((n - c->index) << 5) | PD_RESOURCE_EXHAUSTED);
      dev_error(&h->slot[0].fail, PD_RESOURCE_EXHAUSTED,
                "%s: cannot allocate %zu bytes to reduce into", c->op->name,
                x->in_bytes);
    }
  }
  dev_mesh_transport *t = transport_take(mc);
  if (!t) {
    char sb[DEV_DEVSET_STR_MAX];
    dev_error(&h->err, PD_UNAVAILABLE,
              "%s over devices %s: the mesh has no collective transport (not "
              "formed, or degraded)",
              c->op->name, dev_devset_str(&mc->set, sb, sizeof sb));
    free(own);
    h_publish(h, H_NOTRANS);
    return h_outcome(m, mc, h, 0, c, st);
  }
  void *g = NULL;
  int32_t flag = 0;
  for (int i = 0; i < h->nloc; i++)
    flag = h->slot[i].flag > flag ? h->slot[i].flag : flag;
  const char *what = "joining its group";
  if (t->group_get(t, &h->leaders, h->me_leader, &g, &ts) != PD_OK) goto terr;
  what = "failure flag";
  if (t->all_reduce(t, g, &flag, 1, PD_INT32, DEV_RED_MAX, &ts) != PD_OK)
    goto terr;
  if (flag != 0) {
    h->who = n - (flag >> 5);
    h->code = (pd_code)(flag & 31);
    const int owner = dev__mesh_rank_of(m, mc->set.dev[h->who]);
    int root = 0;
    while (dev__mesh_rank_of(m, h->leaders.dev[root]) != owner) root++;
    if (root == h->me_leader)
      for (int i = 0; i < h->nloc; i++)
        if (h->loc[i] == h->who)
          snprintf(h->why, sizeof h->why, "%.255s", h->slot[i].fail.msg);
    what = "failure message";
    if (t->broadcast(t, g, h->why, sizeof h->why, root, &ts) != PD_OK)
      goto terr;
    h->why[sizeof h->why - 1] = '\0';
    free(own);
    t->release(t);
    h_publish(h, H_FLAG);
    return h_outcome(m, mc, h, 0, c, st);
  }
  const size_t cb =
      x->in_bytes / 8 > CHUNK_BYTES ? x->in_bytes / 8 : CHUNK_BYTES;
  h->chunk = nhelp ? (cb / es ? cb / es : 1) : h->count;
  h->nch = h->count ? (int)((h->count + h->chunk - 1) / h->chunk) : 0;
  if (!nhelp && x->in_bytes && h->buf != x->in)
    memcpy(h->buf, x->in, x->in_bytes);
  h_publish(h, H_DATA);
  const int tred = transport_red(red, dt);
  pd_code rc = PD_OK;
  for (int k = 0; k < h->nch; k++) {
    const size_t lo = (size_t)k * h->chunk;
    const size_t len = h->count - lo < h->chunk ? h->count - lo : h->chunk;
    pthread_mutex_lock(&h->mu);
    for (int j = 0; j < nhelp; j++)
      while (h->reduced[j] <= k) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    if (t->all_reduce(t, g, h->buf + lo * es, len, dt, tred, &ts) != PD_OK) {
      pthread_mutex_lock(&h->mu);
      transport_error(c, "all-reduce", &ts, &h->err);
      h->aborted = true;
      pthread_cond_broadcast(&h->cv);
      pthread_mutex_unlock(&h->mu);
      rc = dev_error(st, h->err.code, "%s", h->err.msg);
      break;
    }
    if (ar && red == DEV_RED_MEAN) divide(h->buf + lo * es, len, dt, n);
    pthread_mutex_lock(&h->mu);
    h->transported = k + 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
  }
  if (rc == PD_OK) rc = ar ? stage_out(x, st) : rs_take(x, h->buf, red, st);
  pthread_mutex_lock(&h->mu); /* the helpers read h->buf until they finish */
  while (h->finished < nhelp) pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
  free(own);
  t->release(t);
  return rc;
terr:
  transport_error(c, what, &ts, &h->err);
  free(own);
  t->release(t);
  h_publish(h, H_ERR);
  return dev_error(st, h->err.code, "%s", h->err.msg);
}

/* A helper (local slot li >= 1): reduces its part of each chunk of every
 * local input into the leader's buffer, then takes the result. */
static pd_code h_help(dev__mesh *m, dev__mesh_hier *h, int li, xfer *x, int red,
                      dev_status *st) {
  dev_kernel_ctx *c = x->ctx;
  const int nhelp = h->nloc - 1, k = li - 1;
  const pd_dtype dt = c->in_dtype[0];
  const size_t es = pd_dtype_size(dt);
  const bool ar = c->op->collective == DEV_COLL_ALL_REDUCE;
  const bool stream = ar && !x->staged; /* copy chunk by chunk */
  const void *ins[PD_MAX_DEVICES];
  for (int i = 0; i < h->nloc; i++) ins[i] = h->slot[i].in;
  const int tred = transport_red(red, dt);
  int copied = 0;
  bool aborted = false;
  for (int j = 0; j < h->nch && !aborted; j++) {
    const size_t lo = (size_t)j * h->chunk;
    const size_t len = h->count - lo < h->chunk ? h->count - lo : h->chunk;
    dev__mesh_reduce(dt, tred, h->nloc, ins, h->buf,
                     lo + len * (size_t)k / (size_t)nhelp,
                     lo + len * (size_t)(k + 1) / (size_t)nhelp);
    pthread_mutex_lock(&h->mu);
    h->reduced[k] = j + 1;
    pthread_cond_broadcast(&h->cv);
    const int done = h->transported;
    aborted = h->aborted;
    pthread_mutex_unlock(&h->mu);
    if (stream && done > copied) {
      const size_t a = (size_t)copied * h->chunk * es;
      const size_t b = (size_t)done * h->chunk * es;
      memcpy((char *)x->out + a, h->buf + a,
             (b < x->out_bytes ? b : x->out_bytes) - a);
      copied = done;
    }
  }
  while (!aborted && copied < h->nch) {
    pthread_mutex_lock(&h->mu);
    while (h->transported <= copied && !h->aborted)
      pthread_cond_wait(&h->cv, &h->mu);
    const int done = h->transported;
    aborted = h->aborted;
    pthread_mutex_unlock(&h->mu);
    if (stream && done > copied) {
      const size_t a = (size_t)copied * h->chunk * es;
      const size_t b = (size_t)done * h->chunk * es;
      memcpy((char *)x->out + a, h->buf + a,
             (b < x->out_bytes ? b : x->out_bytes) - a);
    }
    copied = done;
  }
  pd_code rc = PD_OK;
  if (aborted) {
    rc = dev_error(st, h->err.code, "%s", h->err.msg);
  } else if (!ar) {
    rc = rs_take(x, h->buf, red, st);
  } else if (x->staged && x->out_bytes) {
    dev_backend *b = m->inner;
    rc = b->copy_h2d(b, c->device - m->first, c->out_data[0], h->buf,
                     x->out_bytes, st);
  }
  pthread_mutex_lock(&h->mu);
  h->finished++;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  return rc;
}

/* AllReduce / ReduceScatter through mc->hier: this rank's participants
 * meet here; the leader (the first) alone talks to the other ranks'
 * leaders (the failure flag, its message, then the data in chunks) while
 * the others reduce every local input into its buffer, chunk by chunk, and
 * copy each finished chunk out. The transport sees one participant and
 * one host buffer per rank (a staged backend's leader stages it once). */
static pd_code hier_run(dev__mesh *m, const dev__mesh_coll *mc,
                        dev_kernel_ctx *ctx, const dev_status *failed,
                        dev_status *st) {
  dev__mesh_hier *h = mc->hier;
  int li = 0;
  while (li < h->nloc && h->loc[li] != ctx->index) li++;
  if (li == h->nloc)
    return dev_error(st, PD_INTERNAL,
                     "%s: device %d is not a participant of this rank",
                     ctx->op->name, ctx->device);
  const int red =
      dev_reduction_from_name(ctx->attrs[0].u.s.ptr, ctx->attrs[0].u.s.len);
  xfer x = {.m = m, .ctx = ctx};
  dev_status own = DEV_STATUS_INIT;
  if (failed)
    own = *failed;
  else
    (void)stage_in(&x, &own); /* a staging error fails this input */
  hslot *s = &h->slot[li];
  s->in = x.in;
  s->flag = own.code != PD_OK
                ? (int32_t)(((mc->set.n - ctx->index) << 5) | (own.code & 31))
                : 0;
  if (s->flag) s->fail = own;
  pthread_mutex_lock(&h->mu);
  h->arrived++;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  pd_code rc;
  if (li == 0) {
    rc = h_lead(m, mc, h, &x, red, st);
  } else {
    pthread_mutex_lock(&h->mu);
    while (h->phase == H_WAIT) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    rc = h->phase == H_DATA ? h_help(m, h, li, &x, red, st)
                            : h_outcome(m, mc, h, li, ctx, st);
  }
  free(x.hin);
  free(x.hout);
  return rc;
}

pd_code dev__mesh_coll_run(dev__mesh *m, const dev__mesh_coll *mc,
                           dev_kernel_ctx *ctx, const dev_status *failed,
                           dev_status *st) {
  if (mc->hier) return hier_run(m, mc, ctx, failed, st);
  const int n = mc->set.n, me = ctx->index;
  dev_mesh_transport *t = transport_take(mc);
  if (!t) {
    if (failed) return dev_error(st, failed->code, "%s", failed->msg);
    char sb[DEV_DEVSET_STR_MAX];
    return dev_error(st, PD_UNAVAILABLE,
                     "%s over devices %s: the mesh has no collective "
                     "transport (not formed, or degraded)",
                     ctx->op->name, dev_devset_str(&mc->set, sb, sizeof sb));
  }
  void *g = NULL;
  dev_status ts = DEV_STATUS_INIT;
  pd_code rc = PD_OK;
  xfer x = {.m = m, .ctx = ctx};
  if (t->group_get(t, &mc->set, me, &g, &ts) != PD_OK) {
    rc = transport_error(ctx, "joining its group", &ts, st);
    goto out;
  }
  int32_t flag =
      failed ? (int32_t)(((n - me) << 5) | ((int)failed->code & 31)) : 0;
  if (t->all_reduce(t, g, &flag, 1, PD_INT32, DEV_RED_MAX, &ts) != PD_OK) {
    rc = transport_error(ctx, "failure flag", &ts, st);
    goto out;
  }
  if (flag != 0) {
    /* The failed participant with the lowest index tells its message. */
    const int who = n - (flag >> 5);
    const pd_code code = (pd_code)(flag & 31);
    const int dev = mc->set.dev[who];
    char why[256] = {0};
    if (who == me && failed) snprintf(why, sizeof why, "%.255s", failed->msg);
    if (t->broadcast(t, g, why, sizeof why, who, &ts) != PD_OK) {
      rc = transport_error(ctx, "failure message", &ts, st);
      goto out;
    }
    why[sizeof why - 1] = '\0';
    if (who == me && failed)
      rc = dev_error(st, failed->code, "%s", failed->msg);
    else
      rc = dev_error(st, code == PD_OK ? PD_UNKNOWN : code,
                     "%s: cancelled because its input failed on device %d "
                     "(rank %d of the mesh): %s",
                     ctx->op->name, dev, dev__mesh_rank_of(m, dev), why);
    goto out;
  }
  rc = stage_in(&x, st);
  if (rc == PD_OK) rc = run_data(t, g, &x, st);
  if (rc == PD_OK) rc = stage_out(&x, st);
out:
  free(x.hin);
  free(x.hout);
  t->release(t);
  return rc;
}
