/* /metrics: the Prometheus text exposition format (version 0.0.4), named as
 * Prometheus asks (https://prometheus.io/docs/practices/naming/): a
 * paradev_ prefix, base units (bytes, seconds), _total on counters.
 *
 * Everything is read when scraped: the scheduler's counters, the devices'
 * memory statistics, the RPC counters of every registered method. */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "log.h"
#include "mesh.h"
#include "server.h"

typedef struct srv_buf {
  char *p;
  size_t len, cap;
  bool oom;
} srv_buf;

static void srv_buf_printf(srv_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void srv_buf_printf(srv_buf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    size_t ncap = (b->cap + (size_t)n + 1) * 2;
    char *np = realloc(b->p, ncap);
    if (!np) {
      b->oom = true;
      return;
    }
    b->p = np;
    b->cap = ncap;
  }
}

static void srv_family(srv_buf *b, const char *name, const char *type,
                       const char *help) {
  srv_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: the client's name or job id as given (UTF-8: CreateSession
 * refuses other bytes and control characters, convert.h srv_check_label),
 * with \ and " escaped as the text format requires (a line feed would be
 * \n; srv_log_utf8 has made any that could not arrive '?', as the admin
 * reply does). `out` holds 2 * SCHED_NAME_MAX + 1 bytes: every byte may
 * double. */
static void srv_label(const char *in, char *out, size_t len) {
  char clean[SCHED_NAME_MAX + 1];
  srv_log_utf8(in, clean, sizeof(clean));
  size_t j = 0;
  for (size_t i = 0; clean[i] && j + 3 < len; i++) {
    if (clean[i] == '\\' || clean[i] == '"') out[j++] = '\\';
    out[j++] = clean[i];
  }
  out[j] = '\0';
}

/* "/paradev.v1.ParallelDevice/Execute" -> service, method. */
static void srv_split_path(const char *path, char *svc, size_t slen,
                           const char **method) {
  const char *p = path[0] == '/' ? path + 1 : path;
  const char *slash = strchr(p, '/');
  size_t n = slash ? (size_t)(slash - p) : strlen(p);
  snprintf(svc, slen, "%.*s", (int)n, p);
  *method = slash ? slash + 1 : "";
}

static void srv_render_rpcs(srv_buf *b, srv *s) {
  srv_family(b, "paradev_rpcs_total", "counter",
             "gRPC calls finished, by service, method and status code.");
  for (int k = 0; k < 3; k++) {
    srv_method *const *table = k == 0   ? srv_methods
                               : k == 1 ? srv_admin_methods
                                        : srv_mesh_methods;
    for (int i = 0; table[i]; i++) {
      char svc[128];
      const char *method;
      srv_split_path(table[i]->path, svc, sizeof(svc), &method);
      for (int code = 0; code < SRV_NUM_CODES; code++) {
        uint64_t v =
            atomic_load_explicit(&table[i]->codes[code], memory_order_relaxed);
        if (v || code == 0)
          srv_buf_printf(b,
                         "paradev_rpcs_total{service=\"%s\",method=\"%s\","
                         "code=\"%s\"} %" PRIu64 "\n",
                         svc, method, pd_code_name((pd_code)code), v);
      }
    }
  }
  srv_family(b, "paradev_rpcs_unimplemented_total", "counter",
             "Calls of methods this server does not have (UNIMPLEMENTED).");
  srv_buf_printf(b, "paradev_rpcs_unimplemented_total %" PRIu64 "\n",
                 atomic_load(&s->unknown_method_calls));
}

/* Placement (issue #17): each session's allowed device set, and its bytes
 * on each device of that set (a session holds none elsewhere): at most
 * sessions x devices lines, as bounded as the per-session families. */
static void srv_render_session_devices(srv_buf *b, srv *s,
                                       const sched_session_view *v, int n) {
  srv_family(b, "paradev_session_devices", "gauge",
             "Devices a session may use (its allowed device set, listed in "
             "the devices label; also its default placement).");
  for (int i = 0; i < n; i++) {
    dev_devset set = v[i].devices;
    if (set.n <= 0) dev_devset_all(s->engine, &set);
    char list[PD_MAX_DEVICES * 4] = "";
    size_t o = 0;
    for (int k = 0; k < set.n && o < sizeof list; k++) {
      int w =
          snprintf(list + o, sizeof list - o, "%s%d", k ? "," : "", set.dev[k]);
      o += w > 0 ? (size_t)w : 0;
    }
    srv_buf_printf(b,
                   "paradev_session_devices{session=\"%" PRIu64
                   "\",devices=\"%s\"} %d\n",
                   v[i].seq, list, set.n);
  }
  srv_family(b, "paradev_session_device_memory_bytes", "gauge",
             "Bytes a session holds on one device (of its allowed set), as "
             "counted against its quota there.");
  for (int i = 0; i < n; i++) {
    dev_devset set = v[i].devices;
    if (set.n <= 0) dev_devset_all(s->engine, &set);
    for (int k = 0; k < set.n; k++)
      srv_buf_printf(b,
                     "paradev_session_device_memory_bytes{session=\"%" PRIu64
                     "\",device=\"%d\"} %" PRIu64 "\n",
                     v[i].seq, set.dev[k], v[i].device_bytes[set.dev[k]]);
  }
}

static void srv_render_sessions(srv_buf *b, srv *s, const sched_stats *st) {
  srv_family(b, "paradev_sessions_open", "gauge", "Sessions open now.");
  srv_buf_printf(b, "paradev_sessions_open %d\n", st->sessions);
  srv_family(b, "paradev_sessions_created_total", "counter",
             "Sessions created.");
  srv_buf_printf(b, "paradev_sessions_created_total %" PRIu64 "\n",
                 st->sessions_created);
  srv_family(b, "paradev_sessions_closed_total", "counter",
             "Sessions closed by their clients.");
  srv_buf_printf(b, "paradev_sessions_closed_total %" PRIu64 "\n",
                 st->sessions_closed);
  srv_family(b, "paradev_session_lease_expiries_total", "counter",
             "Sessions ended because their lease ran out.");
  srv_buf_printf(b, "paradev_session_lease_expiries_total %" PRIu64 "\n",
                 st->sessions_expired);
  srv_family(b, "paradev_sessions_killed_total", "counter",
             "Sessions ended by an operator (Admin KillSession).");
  srv_buf_printf(b, "paradev_sessions_killed_total %" PRIu64 "\n",
                 st->sessions_killed);

  sched_session_view *v = NULL;
  int n = sched_list_sessions(s->sched, NULL, &v);
  srv_family(b, "paradev_session_tensors", "gauge",
             "Tensor handles a session holds (each has a component on every "
             "device).");
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1)
      srv_family(b, "paradev_session_bytes", "gauge",
                 "Device bytes a session holds over all devices, as counted "
                 "against its quota.");
    for (int i = 0; i < n; i++) {
      char cn[2 * SCHED_NAME_MAX + 2], job[2 * SCHED_NAME_MAX + 2];
      srv_label(v[i].client, cn, sizeof(cn));
      srv_label(v[i].job, job, sizeof(job));
      srv_buf_printf(b,
                     "paradev_session_%s{session=\"%" PRIu64
                     "\",client=\"%s\",job=\"%s\"} %" PRIu64 "\n",
                     pass == 0 ? "tensors" : "bytes", v[i].seq, cn, job,
                     pass == 0 ? v[i].handles : v[i].bytes);
    }
  }
  srv_render_session_devices(b, s, v, n);
  free(v);
}

static void srv_render_devices(srv_buf *b, srv *s, const sched_stats *st) {
  int n = dev_engine_num_devices(s->engine);
  dev_memory_stats ms[PD_MAX_DEVICES];
  bool ok[PD_MAX_DEVICES];
  for (int i = 0; i < n; i++) {
    ms[i] = (dev_memory_stats){.struct_size = sizeof(ms[i])};
    ok[i] = dev_engine_memory_stats(s->engine, i, &ms[i], NULL) == PD_OK;
  }
  static const struct {
    const char *name, *help;
  } fam[] = {
      {"paradev_device_tensors",
       "Tensors with a component on the device (every live handle)."},
      {"paradev_device_memory_used_bytes", "Device memory in use."},
      {"paradev_device_memory_free_bytes",
       "Device memory left under the limit (or the total)."},
      {"paradev_device_memory_limit_bytes",
       "Per-device memory limit (configured or the default; 0: none)."},
      {"paradev_device_memory_total_bytes",
       "Physical memory of the device (0: unknown)."},
      {"paradev_device_memory_peak_bytes", "Peak device memory in use."},
      {"paradev_device_healthy", "1 when the device is healthy."},
      {"paradev_device_memory_cached_bytes",
       "Freed blocks kept for reuse (CPU block cache), beside memory used."},
  };
  for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
    srv_family(b, fam[f].name, "gauge", fam[f].help);
    for (int i = 0; i < n; i++) {
      uint64_t cap = ms[i].bytes_limit ? ms[i].bytes_limit : ms[i].bytes_total;
      uint64_t v = 0;
      switch (f) {
        case 0: v = st->handles; break;
        case 1: v = ms[i].bytes_in_use; break;
        case 2:
          if (!cap || !ok[i]) continue;
          v = cap > ms[i].bytes_in_use ? cap - ms[i].bytes_in_use : 0;
          break;
        case 3: v = ms[i].bytes_limit; break;
        case 4: v = ms[i].bytes_total; break;
        case 5: v = ms[i].peak_bytes_in_use; break;
        case 6: v = dev_engine_device_healthy(s->engine, i); break;
        case 7: v = ms[i].bytes_cached; break;
      }
      if (f != 0 && f != 6 && !ok[i]) continue;
      srv_buf_printf(b, "%s{device=\"%d\"} %" PRIu64 "\n", fam[f].name, i, v);
    }
  }
}

/* Seconds each device's executor spent running ops: a counter, so that
 * rate(paradev_device_busy_seconds_total[1m]) is the device's utilisation
 * (0..1) and 1 minus it the share of time the device waited for work. */
static void srv_render_busy(srv_buf *b, srv *s) {
  srv_family(b, "paradev_device_busy_seconds_total", "counter",
             "Seconds the device's executor spent running ops (kernels and "
             "its share of collectives).");
  int n = dev_engine_num_devices(s->engine);
  for (int i = 0; i < n; i++)
    srv_buf_printf(b, "paradev_device_busy_seconds_total{device=\"%d\"} %.9g\n",
                   i, dev_engine_busy_seconds(s->engine, i));
  srv_family(b, "paradev_device_seconds_since_progress", "gauge",
             "Seconds since the device last made progress (an op began or "
             "finished, a kernel's heartbeat) while it had work; 0 when idle. "
             "Past stall_timeout_seconds with no op running, or past "
             "kernel_timeout_seconds in one kernel, liveness fails.");
  for (int i = 0; i < n && i < PD_MAX_DEVICES; i++)
    srv_buf_printf(b,
                   "paradev_device_seconds_since_progress{device=\"%d\"} "
                   "%.3f\n",
                   i, (double)atomic_load(&s->dev_quiet_ms[i]) / 1000.0);
}

static void srv_render_ops(srv_buf *b, srv *s, const sched_stats *st) {
  srv_family(b, "paradev_ops_total", "counter",
             "Ops that ran (or were dropped from a queue), by op and outcome "
             "(a gRPC status code name).");
  int nops = dev_op_count();
  double coll_s[256];
  int coll_i[256], ncoll = 0;
  for (int i = 0; i < nops; i++) {
    uint64_t by[SCHED_NUM_CODES];
    double run = 0;
    sched_op_stats(s->sched, i, by, &run);
    const dev_op_def *d = dev_op_at(i);
    for (int code = 0; code < SCHED_NUM_CODES; code++)
      if (by[code])
        srv_buf_printf(
            b, "paradev_ops_total{op=\"%s\",outcome=\"%s\"} %" PRIu64 "\n",
            dev_op_def_name(d), pd_code_name((pd_code)code), by[code]);
    if (dev_op_def_is_collective(d) && ncoll < 256) {
      coll_i[ncoll] = i;
      coll_s[ncoll++] = run;
    }
  }
  srv_family(b, "paradev_collective_seconds_total", "counter",
             "Seconds collectives took from submission to the devices until "
             "computed on all of them, by op.");
  for (int k = 0; k < ncoll; k++)
    srv_buf_printf(b, "paradev_collective_seconds_total{op=\"%s\"} %.9g\n",
                   dev_op_def_name(dev_op_at(coll_i[k])), coll_s[k]);
  srv_family(b, "paradev_op_duration_seconds", "histogram",
             "Seconds from an op's Execute until it was computed on every "
             "device.");
  for (int i = 0; i < SCHED_LATENCY_BUCKETS; i++)
    srv_buf_printf(
        b, "paradev_op_duration_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
        sched_latency_bounds[i], st->latency_buckets[i]);
  uint64_t count = st->latency_buckets[SCHED_LATENCY_BUCKETS];
  srv_buf_printf(
      b, "paradev_op_duration_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n",
      count);
  srv_buf_printf(b, "paradev_op_duration_seconds_sum %.9g\n",
                 st->latency_sum_s);
  srv_buf_printf(b, "paradev_op_duration_seconds_count %" PRIu64 "\n", count);
  srv_family(b, "paradev_queue_depth", "gauge",
             "Ops queued in sessions, not yet submitted to the devices.");
  srv_buf_printf(b, "paradev_queue_depth %" PRIu64 "\n", st->ops_queued);
  srv_family(b, "paradev_ops_in_flight", "gauge",
             "Ops submitted to the devices and not yet computed.");
  srv_buf_printf(b, "paradev_ops_in_flight %" PRIu64 "\n", st->ops_in_flight);
}

/* The block cache of checkpoints (storage/storage.h stg_cache_stats). */
static void srv_render_storage(srv_buf *b, srv *s) {
  if (!s->storage_cache) return;
  stg_cache_stats cs;
  memset(&cs, 0, sizeof(cs));
  stg_cache_get_stats(s->storage_cache, &cs);
  static const struct {
    const char *name, *type, *help;
    size_t off;
  } rows[] = {
      {"paradev_storage_cache_hits_total", "counter",
       "Block lookups of checkpoint reads served from the RAM block cache.",
       offsetof(stg_cache_stats, hits)},
      {"paradev_storage_cache_misses_total", "counter",
       "Block lookups that had to fetch the block from storage.",
       offsetof(stg_cache_stats, misses)},
      {"paradev_storage_cache_waits_total", "counter",
       "Block lookups that waited for another reader's fetch of the block.",
       offsetof(stg_cache_stats, waits)},
      {"paradev_storage_cache_evictions_total", "counter",
       "Blocks dropped for the cache's budget or staleness.",
       offsetof(stg_cache_stats, evictions)},
      {"paradev_storage_cache_bytes", "gauge",
       "Bytes the block cache holds now (as allocated).",
       offsetof(stg_cache_stats, bytes_cached)},
      {"paradev_storage_cache_blocks", "gauge",
       "Blocks the block cache holds now.",
       offsetof(stg_cache_stats, blocks_cached)},
      {"paradev_storage_bytes_fetched_total", "counter",
       "Bytes read from storage (files, HTTP) by every fetcher.",
       offsetof(stg_cache_stats, bytes_fetched)},
      {"paradev_storage_fetches_total", "counter",
       "Fetcher calls (preads, HTTP range requests).",
       offsetof(stg_cache_stats, fetches)},
      {"paradev_storage_fetch_errors_total", "counter",
       "Fetches that failed (each retry counts).",
       offsetof(stg_cache_stats, fetch_errors)},
      {"paradev_storage_bypass_reads_total", "counter",
       "Reads larger than the cache's budget, which bypass it.",
       offsetof(stg_cache_stats, bypass_reads)},
  };
  for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
    uint64_t v;
    memcpy(&v, (const char *)&cs + rows[i].off, sizeof(v));
    srv_family(b, rows[i].name, rows[i].type, rows[i].help);
    srv_buf_printf(b, "%s %" PRIu64 "\n", rows[i].name, v);
  }
}

/* Refusals by reason (auth.h), every reason listed even at 0. */
static void srv_render_auth(srv_buf *b, srv *s) {
  srv_family(b, "paradev_auth_refusals_total", "counter",
             "Requests refused for who sent them: no identity, a bad "
             "token, no tenant, another tenant's session, a tenant's "
             "limit, no operator rights.");
  for (int r = 0; r < SRV_REFUSE_COUNT; r++)
    srv_buf_printf(
        b, "paradev_auth_refusals_total{reason=\"%s\"} %" PRIu64 "\n",
        srv_refusal_name((srv_refusal)r), srv_auth_refusals(s, (srv_refusal)r));
}

/* Graph functions' instantiation caches, summed over every session's
 * library (device/dev_function.h dev_fn_counters). */
static void srv_render_functions(srv_buf *b, srv *s) {
  static const struct {
    const char *name, *help;
  } fam[] = {
      {"paradev_function_cache_hits_total",
       "Function calls that found their instantiation in the cache."},
      {"paradev_function_cache_misses_total",
       "Function calls that found no instantiation for their inputs' "
       "signature (failed instantiations included)."},
      {"paradev_function_instantiations_total",
       "Instantiations made (inlined, optimized, planned) after a miss."},
      {"paradev_function_cache_evictions_total",
       "Instantiations dropped for a function's max_instantiations."},
  };
  const dev_fn_counters *c = &s->fn_counters;
  uint64_t v[4] = {
      atomic_load_explicit(&c->hits, memory_order_relaxed),
      atomic_load_explicit(&c->misses, memory_order_relaxed),
      atomic_load_explicit(&c->instantiations, memory_order_relaxed),
      atomic_load_explicit(&c->evictions, memory_order_relaxed)};
  for (int i = 0; i < 4; i++) {
    srv_family(b, fam[i].name, "counter", fam[i].help);
    srv_buf_printf(b, "%s %" PRIu64 "\n", fam[i].name, v[i]);
  }
}

/* A mesh across machines (issue #16); nothing without one. */
static void srv_render_mesh(srv_buf *b, srv *s) {
  if (!s->mesh) return;
  srv_mesh_view *v = malloc(sizeof *v);
  if (!v) {
    b->oom = true;
    return;
  }
  srv_mesh_info(s->mesh, v);
  if (v->rank != 0) v->tensors = srv_mesh_apply_tensors(s->mesh);
  static const struct {
    const char *name, *help;
  } g[] = {
      {"paradev_mesh_world_size", "Ranks (daemons) of the mesh."},
      {"paradev_mesh_rank", "This daemon's rank (0: the coordinator)."},
      {"paradev_mesh_formed",
       "1 while every rank is attached and the epoch's transports are built "
       "(a rank: joined)."},
      {"paradev_mesh_degraded", "1 while a lost rank has not come back."},
      {"paradev_mesh_epoch", "The mesh's epoch (grows at each formation)."},
  };
  uint64_t val[5] = {(uint64_t)v->world, (uint64_t)v->rank, v->formed,
                     v->degraded, v->epoch};
  for (int i = 0; i < 5; i++) {
    srv_family(b, g[i].name, "gauge", g[i].help);
    srv_buf_printf(b, "%s %" PRIu64 "\n", g[i].name, val[i]);
  }
  if (v->rank == 0) {
    srv_family(b, "paradev_mesh_rank_attached", "gauge",
               "1 while the rank's Attach stream is open (rank 0: itself).");
    for (int r = 0; r < v->world; r++)
      srv_buf_printf(b, "paradev_mesh_rank_attached{rank=\"%d\"} %d\n", r,
                     v->ranks[r].attached ? 1 : 0);
    srv_family(b, "paradev_mesh_rank_last_seen_seconds", "gauge",
               "Seconds since the rank's last message (0 for rank 0 and "
               "ranks never seen).");
    for (int r = 0; r < v->world; r++)
      srv_buf_printf(b,
                     "paradev_mesh_rank_last_seen_seconds{rank=\"%d\"} "
                     "%.3f\n",
                     r, v->ranks[r].last_seen_s);
    srv_family(b, "paradev_mesh_sessions_killed_total", "counter",
               "Sessions ended because the mesh lost a rank.");
    srv_buf_printf(b, "paradev_mesh_sessions_killed_total %" PRIu64 "\n",
                   v->sessions_killed);
  } else {
    srv_family(b, "paradev_mesh_tensors", "gauge",
               "Tensors this rank holds for the coordinator.");
    srv_buf_printf(b, "paradev_mesh_tensors %zu\n", v->tensors);
  }
  free(v);
}

char *srv_metrics_render(srv *s, size_t *len) {
  srv_buf b = {malloc(16384), 0, 16384, false};
  if (!b.p) return NULL;
  b.p[0] = '\0';
  sched_stats st = {.struct_size = sizeof(st)};
  sched_get_stats(s->sched, &st);
  const char *be_name = dev_engine_backend_name(s->engine);
  srv_family(&b, "paradev_build_info", "gauge",
             "paradevd's version and backend (always 1).");
  srv_buf_printf(&b, "paradev_build_info{version=\"%s\",backend=\"%s\"} 1\n",
                 SRV_VERSION, *be_name ? be_name : s->opt.backend);
  srv_family(&b, "paradev_start_time_seconds", "gauge",
             "When paradevd started (Unix time).");
  srv_buf_printf(&b, "paradev_start_time_seconds %.3f\n",
                 (double)s->start_unix_ms / 1000.0);
  srv_family(&b, "paradev_serving", "gauge",
             "1 when the daemon takes new sessions and work (readiness: "
             "health paradev.readiness SERVING, /readyz 200).");
  srv_buf_printf(&b, "paradev_serving %d\n", srv_serving(s) ? 1 : 0);
  srv_family(&b, "paradev_live", "gauge",
             "1 while alive and not wedged (liveness: health "
             "paradev.liveness SERVING, /healthz 200); a drain keeps it 1.");
  srv_buf_printf(&b, "paradev_live %d\n", srv_alive(s) ? 1 : 0);
  srv_family(&b, "paradev_draining", "gauge",
             "1 while draining (SIGTERM or Admin Drain).");
  srv_buf_printf(&b, "paradev_draining %d\n",
                 atomic_load(&s->draining) ? 1 : 0);
  srv_render_sessions(&b, s, &st);
  srv_render_devices(&b, s, &st);
  srv_render_busy(&b, s);
  srv_render_ops(&b, s, &st);
  srv_render_rpcs(&b, s);
  srv_family(&b, "paradev_upload_bytes_total", "counter",
             "Tensor bytes received by Upload.");
  srv_buf_printf(&b, "paradev_upload_bytes_total %" PRIu64 "\n",
                 atomic_load(&s->upload_bytes));
  srv_family(&b, "paradev_download_bytes_total", "counter",
             "Tensor bytes sent by Download.");
  srv_buf_printf(&b, "paradev_download_bytes_total %" PRIu64 "\n",
                 atomic_load(&s->download_bytes));
  uint64_t shm_regions = 0, shm_bytes = 0;
  srv_shm_stats(s, &shm_regions, &shm_bytes);
  srv_family(&b, "paradev_shared_memory_regions", "gauge",
             "Clients' shared memory regions registered (mapped) now.");
  srv_buf_printf(&b, "paradev_shared_memory_regions %" PRIu64 "\n",
                 shm_regions);
  srv_family(&b, "paradev_shared_memory_mapped_bytes", "gauge",
             "Bytes of clients' shared memory regions mapped now.");
  srv_buf_printf(&b, "paradev_shared_memory_mapped_bytes %" PRIu64 "\n",
                 shm_bytes);
  srv_family(&b, "paradev_shared_memory_upload_bytes_total", "counter",
             "Tensor bytes read from shared memory by UploadFromSharedMemory.");
  srv_buf_printf(&b, "paradev_shared_memory_upload_bytes_total %" PRIu64 "\n",
                 atomic_load(&s->shm_upload_bytes));
  srv_family(&b, "paradev_shared_memory_download_bytes_total", "counter",
             "Tensor bytes written to shared memory by "
             "DownloadToSharedMemory.");
  srv_buf_printf(&b, "paradev_shared_memory_download_bytes_total %" PRIu64 "\n",
                 atomic_load(&s->shm_download_bytes));
  srv_render_storage(&b, s);
  srv_render_auth(&b, s);
  srv_render_functions(&b, s);
  srv_render_mesh(&b, s);
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  *len = b.len;
  return b.p;
}
