/* Optimizer plugins (optimizer.h): dlopen, PD_InitOptimizer, strict checks
 * of what the plugin filled in, the merge of the built-in passes' switches
 * with its table in the log, and one dev_fn_external_pass per plugin whose
 * run serializes the graph (convert_fn.c, the wire's one FunctionDef
 * converter), calls optimize_func and parses its output back. The ABI is
 * include/paradev/optimizer.h. */
#include "optimizer.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "convert.h"
#include "log.h"
#include "paradev/optimizer.h"

_Static_assert((int)PD_CODE_UNAUTHENTICATED == (int)PD_UNAUTHENTICATED &&
                   (int)PD_CODE_INVALID_ARGUMENT == (int)PD_INVALID_ARGUMENT,
               "PD_Code mirrors pd_code");
_Static_assert((int)PD_TRI_OFF == (int)DEV_TRI_OFF &&
                   (int)PD_TRI_ON == (int)DEV_TRI_ON &&
                   (int)PD_TRI_DEFAULT == (int)DEV_TRI_DEFAULT,
               "PD_TriState mirrors dev_tristate");
_Static_assert(DEV_PASS_COUNT == 7, "one PD_OptimizerConfigs field per pass");

/* A newer plugin may write structs larger than this daemon's: they land in
 * zeroed room past the fields the daemon knows. */
#define SRV_OPT_ROOM 1024

typedef struct srv_plugin {
  char path[1024]; /* as configured, for refusals */
  char file[256];  /* the path's last component: logs, the pass's name */
  char name[PD_OPTIMIZER_NAME_MAX + 1];
  char pass_name[340]; /* "plugin:libfoo.so/name" */
  void *dl;
  union {
    PD_Optimizer v;
    char room[SRV_OPT_ROOM];
  } opt;
  union {
    PD_OptimizerConfigs v;
    char room[SRV_OPT_ROOM];
  } cfg;
  void *state; /* create_func's */
  bool created;
  dev_fn_external_pass pass;
} srv_plugin;

static srv_plugin *plugins;
static const dev_fn_external_pass **pass_ptrs;
static int num_plugins;

/* --- the daemon's side of PD_Status and PD_Buffer ------------------------------ */

static void status_set(PD_Status *s, PD_Code code, const char *msg,
                       size_t len) {
  s->code = ((int)code < 0 || (int)code > 16) ? PD_CODE_UNKNOWN : code;
  if (len >= PD_STATUS_MESSAGE_MAX) len = PD_STATUS_MESSAGE_MAX - 1;
  if (!msg) len = 0;
  if (len) memcpy(s->message, msg, len);
  s->message[len] = 0;
}

static void status_init(PD_Status *s) {
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  s->set = status_set;
  s->code = PD_CODE_OK;
}

static void *buffer_allocate(PD_Buffer *b, size_t n) {
  free((void *)b->data);
  void *p = malloc(n ? n : 1);
  b->data = p;
  b->length = p ? n : 0;
  return p;
}

/* --- the external pass ------------------------------------------------------- */

static pd_code plugin_run(void *arg, const dev_fn_def *in,
                          const dev_tristate *passes, dev_fn_def **out,
                          bool *changed, dev_status *st) {
  (void)passes;
  srv_plugin *p = arg;
  uint8_t *bytes = NULL;
  size_t n = 0;
  PD_TRY(srv_fn_def_to_proto(in, &bytes, &n, st));
  PD_Buffer gin = {sizeof gin, NULL, bytes, n, NULL, NULL};
  PD_Buffer gout = {sizeof gout, NULL, NULL, 0, buffer_allocate, NULL};
  PD_Status ps;
  status_init(&ps);
  p->opt.v.optimize_func(p->state, &gin, &gout, &ps);
  pd_code rc = PD_OK;
  if ((int)ps.code < 0 || (int)ps.code > 16) ps.code = PD_CODE_UNKNOWN;
  if (ps.code != PD_CODE_OK) {
    char msg[DEV_STATUS_MSG_MAX / 2];
    rc = dev_error(st, (pd_code)ps.code, "optimizer plugin %s: %s: %s",
                   p->pass_name, pd_code_name((pd_code)ps.code),
                   srv_log_clean(ps.message, msg, sizeof msg));
  } else if (!gout.data || (gout.length == n && !memcmp(gout.data, bytes, n))) {
    *changed = false;
    rc = srv_fn_def_from_proto(bytes, n, out, st);
  } else {
    dev_status inner = DEV_STATUS_INIT;
    rc = srv_fn_def_from_proto(gout.data, gout.length, out, &inner);
    if (rc != PD_OK)
      dev_error(st, rc, "optimizer plugin %s: its output graph: %s",
                p->pass_name, inner.msg);
    *changed = rc == PD_OK;
  }
  free((void *)gout.data);
  free(bytes);
  return rc;
}

static void plugin_free_out(void *arg, dev_fn_def *out) {
  (void)arg;
  srv_fn_def_proto_free(out);
}

/* --- loading ------------------------------------------------------------------- */

/* dev_fn_pass_name's names, in PD_OptimizerConfigs' order (kept here so
 * the loader needs nothing of the engine's function code). */
static const char *const pass_names[DEV_PASS_COUNT] = {
    "pruning",         "cse",       "constant_folding", "arithmetic", "fusion",
    "buffer_planning", "cuda_graph"};

static const char *tri_name(int t) {
  return t == DEV_TRI_OFF ? "off" : t == DEV_TRI_ON ? "on" : "default";
}

/* The plugin's switch for pass `i` (PD_OptimizerConfigs in pass order). */
static int plugin_tri(const srv_plugin *p, int i) {
  const PD_TriState *t[DEV_PASS_COUNT] = {
      &p->cfg.v.pruning,    &p->cfg.v.cse,    &p->cfg.v.constant_folding,
      &p->cfg.v.arithmetic, &p->cfg.v.fusion, &p->cfg.v.buffer_planning,
      &p->cfg.v.cuda_graph};
  return (int)*t[i];
}

/* What the plugin filled in, checked strictly (the header's rules). */
static pd_code plugin_check(srv_plugin *p,
                            const PD_OptimizerRegistrationParams *rp,
                            dev_status *st) {
  const char *f = p->path;
  if (rp->plugin_major_version != PD_OPTIMIZER_MAJOR)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "optimizer plugin %s: built for optimizer ABI major "
                     "version %d; this daemon's is %d (PD_OPTIMIZER_MAJOR; "
                     "rebuild the plugin against its include/paradev/"
                     "optimizer.h)",
                     f, (int)rp->plugin_major_version, PD_OPTIMIZER_MAJOR);
  if (p->cfg.v.struct_size < PD_OPTIMIZER_CONFIGS_STRUCT_SIZE)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "optimizer plugin %s: PD_OptimizerConfigs.struct_size "
                     "is %zu; this daemon needs at least %zu "
                     "(PD_OPTIMIZER_CONFIGS_STRUCT_SIZE)",
                     f, p->cfg.v.struct_size,
                     (size_t)PD_OPTIMIZER_CONFIGS_STRUCT_SIZE);
  if (p->opt.v.struct_size < PD_OPTIMIZER_STRUCT_SIZE)
    return dev_error(
        st, PD_FAILED_PRECONDITION,
        "optimizer plugin %s: PD_Optimizer.struct_size is %zu; "
        "this daemon needs at least %zu (PD_OPTIMIZER_STRUCT_SIZE)",
        f, p->opt.v.struct_size, (size_t)PD_OPTIMIZER_STRUCT_SIZE);
  if (!p->opt.v.optimize_func)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "optimizer plugin %s: PD_Optimizer.optimize_func is "
                     "NULL; it is mandatory",
                     f);
  size_t nl = rp->name_length;
  bool ok = rp->name && nl >= 1 && nl <= PD_OPTIMIZER_NAME_MAX &&
            rp->name[nl] == '\0';
  for (size_t i = 0; ok && i < nl; i++)
    ok = rp->name[i] > 0x20 && rp->name[i] < 0x7f && rp->name[i] != '/';
  if (!ok)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "optimizer plugin %s: its name (name_length %zu) is not "
                     "1 to %d bytes of printable ASCII without spaces or '/', "
                     "NUL-terminated at name[name_length]",
                     f, nl, PD_OPTIMIZER_NAME_MAX);
  for (int i = 0; i < DEV_PASS_COUNT; i++) {
    int t = plugin_tri(p, i);
    if (t < PD_TRI_DEFAULT || t > PD_TRI_ON)
      return dev_error(st, PD_FAILED_PRECONDITION,
                       "optimizer plugin %s: PD_OptimizerConfigs.%s is %d; "
                       "expected PD_TRI_DEFAULT (0), PD_TRI_OFF (1) or "
                       "PD_TRI_ON (2)",
                       f, pass_names[i], t);
  }
  memcpy(p->name, rp->name, nl);
  p->name[nl] = 0;
  snprintf(p->pass_name, sizeof p->pass_name, "plugin:%s/%s", p->file, p->name);
  if (rp->plugin_minor_version > PD_OPTIMIZER_MINOR)
    SRV_INFO(
        "optimizer plugin %s: built for ABI %d.%d, this daemon has %d.%d:"
        " fields it does not know are ignored",
        f, (int)rp->plugin_major_version, (int)rp->plugin_minor_version,
        PD_OPTIMIZER_MAJOR, PD_OPTIMIZER_MINOR);
  return PD_OK;
}

/* dlopen, PD_InitOptimizer, checks, create_func. On error the caller
 * unloads what was set (p->dl). */
static pd_code plugin_load(srv_plugin *p, const char *path, dev_status *st) {
  snprintf(p->path, sizeof p->path, "%s", path);
  const char *slash = strrchr(path, '/');
  snprintf(p->file, sizeof p->file, "%s", slash ? slash + 1 : path);
  p->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!p->dl)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "optimizer plugin %s: cannot load it: %s", path,
                     dlerror());
  PD_InitOptimizerFn init;
  *(void **)&init = dlsym(p->dl, "PD_InitOptimizer");
  if (!init)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "optimizer plugin %s: no PD_InitOptimizer symbol (see "
                     "include/paradev/optimizer.h)",
                     path);
  PD_OptimizerRegistrationParams rp;
  memset(&rp, 0, sizeof rp);
  rp.struct_size = PD_OPTIMIZER_REGISTRATION_PARAMS_STRUCT_SIZE;
  rp.major_version = PD_OPTIMIZER_MAJOR;
  rp.minor_version = PD_OPTIMIZER_MINOR;
  rp.configs = &p->cfg.v;
  rp.optimizer = &p->opt.v;
  PD_Status ps;
  status_init(&ps);
  init(&rp, &ps);
  if (ps.code != PD_CODE_OK) {
    char msg[DEV_STATUS_MSG_MAX / 2];
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "optimizer plugin %s: PD_InitOptimizer refused to "
                     "register: %s: %s",
                     path, pd_code_name((pd_code)ps.code),
                     srv_log_clean(ps.message, msg, sizeof msg));
  }
  PD_TRY(plugin_check(p, &rp, st));
  if (p->opt.v.create_func) p->state = p->opt.v.create_func();
  p->created = true;
  p->pass = (dev_fn_external_pass){sizeof p->pass, p->pass_name, p, plugin_run,
                                   plugin_free_out};
  return PD_OK;
}

/* The merge (OFF wins, then ON, else DEFAULT), its table, and a warning per
 * pass on which plugins disagree. */
static void merge_configs(const dev_tristate *daemon_passes,
                          dev_tristate *merged) {
  char head[1024];
  int o = snprintf(head, sizeof head, "pass             | daemon  ");
  for (int j = 0; j < num_plugins && o < (int)sizeof head; j++)
    o += snprintf(head + o, sizeof head - (size_t)o, "| %s ",
                  plugins[j].pass_name);
  if (num_plugins) {
    SRV_INFO(
        "optimizer plugins: what each asked of the built-in passes "
        "(off wins, then on):");
    SRV_INFO("optimizer plugins: %s| in force", head);
  }
  for (int i = 0; i < DEV_PASS_COUNT; i++) {
    int d = (int)daemon_passes[i];
    bool off = d == DEV_TRI_OFF, on = d == DEV_TRI_ON;
    char row[1024], offs[512] = "", ons[512] = "";
    o = snprintf(row, sizeof row, "%-16s | %-7s ", pass_names[i], tri_name(d));
    for (int j = 0; j < num_plugins; j++) {
      int t = plugin_tri(&plugins[j], i);
      off |= t == PD_TRI_OFF, on |= t == PD_TRI_ON;
      char *w = t == PD_TRI_OFF ? offs : t == PD_TRI_ON ? ons : NULL;
      if (w)
        snprintf(w + strlen(w), 512 - strlen(w), "%s%s", *w ? ", " : "",
                 plugins[j].file);
      if (o < (int)sizeof row)
        o += snprintf(row + o, sizeof row - (size_t)o, "| %-*s ",
                      (int)strlen(plugins[j].pass_name), tri_name(t));
    }
    merged[i] = off ? DEV_TRI_OFF : on ? DEV_TRI_ON : DEV_TRI_DEFAULT;
    if (num_plugins)
      SRV_INFO("optimizer plugins: %s| %s", row, tri_name(merged[i]));
    if (*offs && *ons)
      SRV_WARN(
          "optimizer plugins disagree on pass %s: %s ask off, %s ask "
          "on; off wins",
          pass_names[i], offs, ons);
  }
}

/* The same file listed twice (the same path, or two paths with one
 * realpath) would be loaded once by dlopen but run as two passes, its
 * create_func state shared: refused, naming both occurrences. */
static pd_code plugin_duplicates(const char *const *paths, int n,
                                 dev_status *st) {
  for (int i = 1; i < n; i++) {
    char ri[PATH_MAX], rj[PATH_MAX];
    bool has_ri = realpath(paths[i], ri) != NULL;
    for (int j = 0; j < i; j++) {
      bool same = strcmp(paths[i], paths[j]) == 0 ||
                  (has_ri && realpath(paths[j], rj) && strcmp(ri, rj) == 0);
      if (same)
        return dev_error(st, PD_FAILED_PRECONDITION,
                         "optimizer plugin %d (%s) is the same file as "
                         "plugin %d (%s)%s%s; list it once (it would be "
                         "loaded once and run twice)",
                         i + 1, paths[i], j + 1, paths[j],
                         strcmp(paths[i], paths[j]) ? ": both are " : "",
                         strcmp(paths[i], paths[j]) ? ri : "");
    }
  }
  return PD_OK;
}

pd_code srv_optimizer_load(const char *const *paths, int n,
                           const dev_tristate *daemon_passes,
                           const dev_fn_external_pass *const **passes,
                           int *n_passes, dev_tristate *merged,
                           dev_status *st) {
  srv_optimizer_unload();
  PD_TRY(plugin_duplicates(paths, n, st));
  if (n > 0) {
    plugins = calloc((size_t)n, sizeof *plugins);
    pass_ptrs = calloc((size_t)n + 1, sizeof *pass_ptrs);
    if (!plugins || !pass_ptrs) {
      srv_optimizer_unload();
      return dev_error(st, PD_RESOURCE_EXHAUSTED,
                       "optimizer plugins: out of memory");
    }
  }
  for (int i = 0; i < n; i++) {
    num_plugins = i + 1; /* what unload undoes */
    pd_code rc = plugin_load(&plugins[i], paths[i], st);
    if (rc != PD_OK) {
      srv_optimizer_unload();
      return rc;
    }
    pass_ptrs[i] = &plugins[i].pass;
    SRV_INFO("optimizer plugin %s loaded as %s", paths[i],
             plugins[i].pass_name);
  }
  merge_configs(daemon_passes, merged);
  static const dev_fn_external_pass *const none[1] = {NULL};
  *passes = n > 0 ? (const dev_fn_external_pass *const *)pass_ptrs : none;
  *n_passes = n;
  return PD_OK;
}

void srv_optimizer_unload(void) {
  for (int i = num_plugins - 1; i >= 0; i--) {
    srv_plugin *p = &plugins[i];
    if (p->created && p->opt.v.destroy_func) p->opt.v.destroy_func(p->state);
    if (p->dl) dlclose(p->dl);
  }
  free(plugins);
  free(pass_ptrs);
  plugins = NULL;
  pass_ptrs = NULL;
  num_plugins = 0;
}
