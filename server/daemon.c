/* The daemon's parts, started in one order and stopped in the reverse one:
 * the engine (device.h), the storage roots and block cache (storage.c), the
 * scheduler (scheduler.h), the shared memory
 * registry (shm_region.c), health (health.c), the job tokens (jobs.c), the
 * gRPC listeners and their
 * threads (rpc.c), the HTTP listener (http.c). A start that fails half-way
 * unwinds through labelled gotos, as libuv's uv_loop_init does, so that
 * nothing it started is left running. Also the scheduler's configuration
 * from the options, and the log line of every session's end (a scheduler
 * observer, for every reason). main.c runs the service loop between. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#define SRV_LOG_SUB SRV_SUB_CORE
#include "auth.h"
#include "check.h"
#include "jobs.h"
#include "log.h"
#include "mesh.h"
#include "optimizer.h"
#include "server.h"

/* True when srv_rpc_stop left calls behind (gRPC was not shut down): the
 * shared memory registry is then left as it is too (a call may still copy). */
static bool srv_calls_left;


void srv_daemon_sched_config(const srv_options *o, dev_engine *e,
                             sched_config *sc) {
  const srv_limits *l = &o->limits;
  sc->default_lease_s = l->default_lease_s;
  sc->max_lease_s = l->max_lease_s;
  sc->max_sessions = l->max_sessions;
  sc->max_handles_per_session = l->max_handles_per_session;
  sc->max_ops_per_request = l->max_ops_per_request;
  sc->max_queued_ops = l->max_queued_ops;
  sc->default_memory_quota = srv_default_quota(o, e);
  sc->max_memory_quota = l->max_memory_quota;
  sc->policy =
      o->sched_fair_share ? SCHED_POLICY_FAIR : SCHED_POLICY_ROUND_ROBIN;
  sc->dispatch_ahead_ns = (uint64_t)o->dispatch_ahead_us * 1000u;
  sc->max_queued_device_ns = (uint64_t)l->max_queued_device_ms * 1000000u;
}

/* Every session's end, whatever the reason, in one line that names it. */
static void srv_log_session_end(void *arg, const sched_end_info *info,
                                void *state) {
  (void)arg;
  (void)state;
  static const char *const how[] = {
      [SCHED_END_CLOSED] = "closed by its client",
      [SCHED_END_EXPIRED] = "lease expired",
      [SCHED_END_KILLED] = "killed by an operator",
      [SCHED_END_STOPPED] = "ended with the daemon",
  };
  char failed[600];
  const char *why =
      (unsigned)info->why < sizeof(how) / sizeof(how[0]) && how[info->why]
          ? how[info->why]
          : sched_end_reason_name(info->why);
  if (info->why == SCHED_END_FAILED && info->message) {
    /* The daemon's own end (the mesh lost a rank): its reason. */
    snprintf(failed, sizeof failed, "ended: %s", info->message);
    why = failed;
  }
  char cn[SRV_LOG_QUOTED(64)], job[SRV_LOG_QUOTED(64)];
  SRV_LOG_AT(SRV_SUB_SCHED, SRV_LOG_INFO,
             "session %" PRIu64 " (client \"%s\" job \"%s\") %s: %" PRIu64
             " handles freed",
             info->session_seq, srv_log_quote(info->client, cn, sizeof cn),
             srv_log_quote(info->job_id, job, sizeof job), why,
             info->handles_freed);
}

/* The trail of a failure through PD_TRY / PD_TRY_GOTO (common/check.h):
 * one debug line per frame, e.g. "server/exec.c:41 srv_execute_item ->
 * INVALID_ARGUMENT" (the last two parts of the path). */
static void srv_trail(const char *file, int line, const char *func,
                      pd_code code) {
  /* Every failure passes here (a refused op is one): test the level before
   * anything else, as the SRV_ macros do. */
  if (SRV_LOG_DEBUG >
      atomic_load_explicit(&srv_log_levels[SRV_LOG_SUB], memory_order_relaxed))
    return;
  const char *short_name = file, *p = file + strlen(file);
  for (int slashes = 0; p > file; p--)
    if (p[-1] == '/' && ++slashes == 2) {
      short_name = p;
      break;
    }
  SRV_DEBUG("trail: %s:%d %s -> %s", short_name, line, func,
            pd_code_name(code));
}

static int srv_engine_start(srv *s) {
  srv_options *o = &s->opt;
  dev_status st = DEV_STATUS_INIT;
  dev_engine_config ec = DEV_ENGINE_CONFIG_INITIALIZER;
  ec.backend = o->backend;
  ec.num_devices = o->num_devices;
  ec.memory_limit = o->memory_limit;
  ec.memory_reserve = o->memory_reserve;
  ec.blas_threads = o->blas_threads;
  ec.mesh = o->mesh[0] ? o->mesh : NULL;
  ec.cuda_allow_tf32 = o->cuda_allow_tf32;
  ec.cuda_pool_release_threshold = o->cuda_pool_release_threshold;
  ec.cuda_collective_timeout_ms = o->cuda_collective_timeout_ms;
  ec.cuda_collectives = (dev_cuda_collectives)o->cuda_collectives;
  if (s->mesh) srv_mesh_engine_config(s->mesh, &ec);
  char devs[512];
  srv_config_describe_devices(o, devs, sizeof(devs));
  SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO, "devices: %s", devs);
  if (dev_engine_create(&ec, &s->engine, &st) != PD_OK) {
    SRV_ERROR("cannot start the %s backend: %s", o->backend, st.msg);
    sd_notifyf(0, "STATUS=failed: cannot start the %s backend: %s", o->backend,
               st.msg);
    return -1;
  }
  /* The runtime copy was taken before the engine existed: a default quota
   * that is a share of the mesh's memory reads 0 there until now. */
  atomic_store(&s->rt.default_memory_quota, srv_default_quota(o, s->engine));
  dev_memory_stats ms = {.struct_size = sizeof ms};
  if (dev_engine_memory_stats(s->engine, 0, &ms, NULL) == PD_OK) {
    const uint64_t q = srv_default_quota(o, s->engine);
    char qs[48];
    if (q)
      snprintf(qs, sizeof qs, "%" PRIu64 " bytes", q);
    else
      snprintf(qs, sizeof qs, "unlimited");
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO,
               "device memory: %s has a limit of %" PRIu64
               " bytes (%.1f GiB); sessions' default quota %s; OpenBLAS "
               "threads %d",
               dev_engine_device_name(s->engine, 0), ms.bytes_limit,
               (double)ms.bytes_limit / (1 << 30), qs, dev_cpu_blas_threads());
  }
  return 0;
}

/* What the engine reports of graph functions (dev_fn_config.log): a cache
 * miss and its reason at info, a pass rolled back or an external pass
 * refused at warning. Names and reasons may hold a client's bytes. */
/* The engine's function log lines (a cache miss, a pass rolled back, a
 * plugin refused): any client can provoke them (a miss per new shape), so
 * at most SRV_FN_LOG_PER_S a second daemon-wide; the next line that passes
 * says how many were not written. */
#define SRV_FN_LOG_PER_S 20
static void srv_fn_log(void *arg, dev_fn_log_level level, const char *fn_name,
                       const char *what) {
  srv *s = arg;
  uint64_t skipped = 0;
  if (!srv_rate_ok(&s->fn_log_rate, SRV_FN_LOG_PER_S, &skipped)) return;
  char fq[SRV_LOG_QUOTED(128)], wq[SRV_LOG_QUOTED(512)], more[96] = "";
  if (skipped)
    snprintf(more, sizeof more,
             " (%" PRIu64
             " earlier function log lines not written: at most "
             "%d a second)",
             skipped, SRV_FN_LOG_PER_S);
  SRV_LOG_AT(SRV_SUB_SCHED,
             level == DEV_FN_LOG_INFO ? SRV_LOG_INFO : SRV_LOG_WARN,
             "function \"%s\": %s%s", srv_log_quote(fn_name, fq, sizeof fq),
             srv_log_printable(what ? what : "", wq, sizeof wq), more);
}

int srv_functions_check(const srv_options *o, srv_config_report_fn report) {
  char buf[SRV_AUTH_LIST_MAX];
  const char *paths[SRV_MAX_PLUGINS];
  int n = srv_config_plugin_paths(o, buf, sizeof buf, paths);
  if (n == 0) return 0;
  dev_tristate daemon[DEV_PASS_COUNT], merged[DEV_PASS_COUNT];
  for (int p = 0; p < DEV_PASS_COUNT; p++)
    daemon[p] = (dev_tristate)o->fn_passes[p];
  const dev_fn_external_pass *const *ext = NULL;
  int n_ext = 0;
  dev_status st = DEV_STATUS_INIT;
  pd_code rc = srv_optimizer_load(paths, n, daemon, &ext, &n_ext, merged, &st);
  srv_optimizer_unload();
  if (rc == PD_OK) return 0;
  char msg[sizeof st.msg + 512];
  snprintf(msg, sizeof msg,
           "%s: [functions] optimizer_plugins: %s; a start refuses it",
           o->config_loaded ? o->config_path : "configuration", st.msg);
  report(true, msg);
  return 1;
}

/* [functions]: loads the optimizer plugins (their passes run after the
 * built-in ones; their switches merge into the daemon's) and fills the
 * settings every session's function library gets. */
static int srv_functions_start(srv *s, dev_fn_config *fc) {
  const srv_options *o = &s->opt;
  char buf[SRV_AUTH_LIST_MAX];
  const char *paths[SRV_MAX_PLUGINS];
  int n = srv_config_plugin_paths(o, buf, sizeof buf, paths);
  dev_tristate daemon[DEV_PASS_COUNT];
  for (int p = 0; p < DEV_PASS_COUNT; p++)
    daemon[p] = (dev_tristate)o->fn_passes[p];
  *fc = (dev_fn_config)DEV_FN_CONFIG_INITIALIZER;
  const dev_fn_external_pass *const *ext = NULL;
  int n_ext = 0;
  dev_status st = DEV_STATUS_INIT;
  if (srv_optimizer_load(paths, n, daemon, &ext, &n_ext, fc->passes, &st) !=
      PD_OK) {
    SRV_ERROR("[functions] optimizer_plugins: %s", st.msg);
    sd_notifyf(0, "STATUS=failed: [functions] optimizer_plugins: %s", st.msg);
    return -1;
  }
  memcpy(s->fn_passes, fc->passes, sizeof(s->fn_passes));
  fc->external = ext;
  fc->num_external = n_ext;
  fc->max_instantiations = o->fn_max_instantiations;
  fc->fold_max_bytes = o->fn_fold_max_bytes;
  fc->fold_max_ms = o->fn_fold_max_ms;
  fc->instantiation_max_ms = o->fn_inst_max_ms;
  fc->log = srv_fn_log;
  fc->log_arg = s;
  fc->counters = &s->fn_counters;
  char about[1024];
  srv_config_describe_functions(o, about, sizeof(about));
  SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO, "functions: %s; %d external passes",
             about, n_ext);
  return 0;
}

static int srv_sched_start(srv *s) {
  dev_status st = DEV_STATUS_INIT;
  sched_config sc = SCHED_CONFIG_INITIALIZER;
  sc.incarnation = s->incarnation;
  srv_daemon_sched_config(&s->opt, s->engine, &sc);
  if (srv_functions_start(s, &sc.functions) != 0) return -1;
  sc.storage_roots = s->storage_roots;
  sc.storage_cache = s->storage_cache;
  sc.load_workers = s->opt.storage_load_workers;
  if (sched_create(s->engine, &sc, &s->sched, &st) != PD_OK) {
    SRV_ERROR("cannot start the scheduler: %s", st.msg);
    return -1; /* the plugins: unloaded by srv_daemon_start's unwinding */
  }
  sched_observer log = {"log", srv_log_session_end, s};
  if (sched_observer_add(s->sched, &log) < 0) {
    SRV_ERROR("internal: no observer slot left in the scheduler for the log");
    sched_destroy(s->sched);
    return -1;
  }
  return 0;
}

/* The job tokens' table, and its file when there is one. */
static int srv_jobs_start(srv *s) {
  if (!(s->jobs = srv_jobs_new(s->opt.max_job_tokens))) {
    SRV_ERROR("out of memory for %d job tokens", s->opt.max_job_tokens);
    return -1;
  }
  const char *f = s->opt.job_tokens_file;
  if (!f[0]) return 0;
  int loaded = 0, dropped = 0;
  dev_status st = DEV_STATUS_INIT;
  if (srv_jobs_open_file(s->jobs, f, &loaded, &dropped, &st) != PD_OK) {
    SRV_ERROR("cannot start: %s", st.msg);
    srv_jobs_free(s->jobs);
    s->jobs = NULL;
    return -1;
  }
  SRV_INFO(
      "job tokens: %d live from %s%s", loaded, f,
      dropped ? " (more than [auth] max_job_tokens: the rest dropped)" : "");
  return 0;
}

int srv_daemon_start(srv *s) {
  pdcom_set_trail(srv_trail);
  if (getrandom(&s->incarnation, sizeof(s->incarnation), 0) !=
      (ssize_t)sizeof(s->incarnation)) {
    SRV_ERROR("getrandom failed: %s", strerror(errno));
    return -1;
  }
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  s->start_unix_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;

  if (srv_mesh_create(s) != 0) goto fail;
  if (srv_engine_start(s) != 0) goto fail_mesh;
  if (srv_storage_init(s) != 0) goto fail_engine;
  if (srv_sched_start(s) != 0) goto fail_storage;
  if (srv_auth_init(s) != 0) goto fail_sched;
  if (srv_shm_init(s) != 0) goto fail_auth;
  if (srv_health_init(s) != 0) {
    SRV_ERROR("out of memory");
    goto fail_shm;
  }
  if (srv_jobs_start(s) != 0) goto fail_health;
  if (srv_rpc_start(s) != 0) goto fail_jobs;
  if (srv_http_start(s) != 0) goto fail_rpc;
  /* The mesh (issue #16) once its port or link can be served: returns
   * when the mesh formed, or after join_timeout_s. */
  if (srv_mesh_start(s) != 0) goto fail_http;
  return 0;

fail_http:
  srv_mesh_stop(s);
  srv_http_stop(s);
fail_rpc:
  srv_rpc_stop(s);
fail_jobs:
  srv_jobs_free(s->jobs);
  s->jobs = NULL;
fail_health:
  srv_health_destroy(s);
fail_shm:
  srv_shm_destroy(s);
fail_auth:
fail_sched:
  sched_destroy(s->sched);
  s->sched = NULL;
  srv_auth_destroy(s); /* after the scheduler: its tenants' roots */
fail_storage:
  srv_storage_destroy(s);
fail_engine:
  dev_engine_destroy(s->engine);
  s->engine = NULL;
  srv_optimizer_unload(); /* after every function library and call */
fail_mesh:
  srv_mesh_destroy(s);
fail:
  sd_notify(0, "STATUS=failed to start (see the log)");
  return -1;
}

void srv_daemon_stop_serving(srv *s, void (*phase)(const char *what)) {
  phase("stopping the mesh (srv_mesh_stop: its streams end)");
  srv_mesh_stop(s); /* before the listeners: its streams never end alone */
  srv_health_update(s);
  srv_health_close(s);
  phase(
      "closing the gRPC listeners (srv_stop: the calls' grace "
      "period, then grpc_shutdown)");
  srv_calls_left = !srv_rpc_stop(s);
  phase("stopping the HTTP listener");
  srv_http_stop(s);
}

void srv_daemon_stop_devices(srv *s, void (*phase)(const char *what)) {
  phase(
      "stopping the scheduler (sched_destroy: the sessions end, the ops "
      "on the devices end)");
  sched_destroy(s->sched); /* every session ends: its regions go */
  s->sched = NULL;
  if (!srv_calls_left) {
    srv_jobs_free(s->jobs);
    s->jobs = NULL;
    srv_shm_destroy(s);
    srv_auth_destroy(s);    /* after the scheduler: tenants' roots */
    srv_storage_destroy(s); /* after the scheduler, which borrows it */
  }
  srv_health_destroy(s);
  phase("stopping the engine (dev_engine_destroy)");
  dev_engine_destroy(s->engine);
  s->engine = NULL;
  srv_mesh_destroy(s); /* after the engine, whose hooks it served */
  phase("unloading the optimizer plugins");
  srv_optimizer_unload(); /* the sessions' function libraries are gone */
}
