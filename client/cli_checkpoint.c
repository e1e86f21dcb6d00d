/* paradev load / paradev save: checkpoints read and written by the daemon
 * (include/paradev/checkpoint.h). `load` opens a session, loads a file's
 * tensors, shows the progress (a bar on a terminal, plain lines otherwise),
 * waits for every tensor, prints each one's name, dtype and shape and the
 * throughput, and closes the session. `save` does the same load and then
 * saves the tensors to another file through the daemon, so a checkpoint is
 * converted or copied without its bytes crossing the wire. Exit status as
 * the other commands: 0, 1 a failed call, 2 a bad command line. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_cmd.h"

static const char cli_load_usage[] =
    "Usage: paradev [--target ADDR] [--timeout TIME] load SOURCE [OPTIONS]\n"
    "Load a checkpoint on the daemon (LoadTensors): SOURCE is a path beneath\n"
    "one of the daemon's storage roots ('paradev info' lists them) or an\n"
    "http(s):// URL beneath an allowed prefix. Shows the progress, then each\n"
    "tensor's name, dtype and shape and the throughput; the tensors are\n"
    "freed when the command's session closes.\n"
    "  --names A,B     the tensors to load (default: every tensor of the "
    "file)\n"
    "  --layout L      mirrored (default), sharded:AXIS, or per-component\n"
    "                  (entries NAME:K of a per-component save; needs "
    "--names)\n"
    "  --format F      auto (default: by magic bytes), safetensors, npy, npz\n"
    "  --devices D     place the tensors on these devices (indices or names\n"
    "                  as 'paradev info' shows them: 0,2 or cpu:0,cpu:2;\n"
    "                  default: the session's); each line then ends with\n"
    "                  the tensor's devices\n"
    "  --session-devices D  narrow the command's session to these devices\n"
    "                  (its default placement; beyond a job's GPUs:\n"
    "                  PERMISSION_DENIED)\n"
    "  --quiet         no progress, only the tensors and the summary\n"
    "Exit status: 0 every tensor loaded; 1 a call or a tensor failed; 2 a\n"
    "bad command line.\n";

static const char cli_save_usage[] =
    "Usage: paradev [--target ADDR] [--timeout TIME] save --from SOURCE DEST\n"
    "                [OPTIONS]\n"
    "Load SOURCE on the daemon and save its tensors to DEST (SaveTensors),\n"
    "both beneath the daemon's storage roots: a checkpoint converted (.npz\n"
    "to safetensors, one tensor to .npy) or copied without its bytes\n"
    "crossing the wire. DEST is safetensors unless it ends in .npy or\n"
    "--format says otherwise; it is written atomically (a temporary file,\n"
    "fsync, rename). Give --timeout a time that fits the file (default 10s).\n"
    "  --from SOURCE   the checkpoint to read (required)\n"
    "  --names A,B     the tensors to copy (default: all)\n"
    "  --overwrite     replace DEST if it exists (default: refuse)\n"
    "  --metadata K=V  a safetensors __metadata__ entry; repeat for more\n"
    "  --name NEW      the name of the one tensor in DEST (default: its name\n"
    "                  in SOURCE; a .npy's tensor, which has none, gets the\n"
    "                  file's stem: weights.npy -> 'weights')\n"
    "  --rename OLD=NEW  save tensor OLD as NEW; repeat for more\n"
    "  --layout L      how the tensors sit on the devices meanwhile:\n"
    "                  mirrored (default), sharded:AXIS, per-component\n"
    "  --format F      of SOURCE: auto (default), safetensors, npy, npz\n"
    "  --dest-format F of DEST: auto (default), safetensors, npy\n"
    "  --devices D, --session-devices D  as for load: where the tensors sit\n"
    "                  meanwhile, and the session's devices\n"
    "  --quiet         no progress lines\n"
    "A relative DEST goes to the first storage root that already holds that\n"
    "file, else to the first root where its directory exists; the absolute\n"
    "path written is printed.\n"
    "Exit status: 0 saved; 1 a call failed; 2 a bad command line.\n";

#define CLI_CKPT_MAX_NAMES 4096
#define CLI_CKPT_MAX_META 64

typedef struct cli_ckpt_args {
  const char *source, *dest;
  char *names_buf;
  const char *names[CLI_CKPT_MAX_NAMES];
  int n_names;
  pd_layout layout;
  pd_checkpoint_format format, dest_format;
  bool overwrite, quiet, from_given;
  const char *meta_keys[CLI_CKPT_MAX_META], *meta_values[CLI_CKPT_MAX_META];
  char *meta_buf[CLI_CKPT_MAX_META];
  int n_meta;
  const char *name; /* --name */
  /* --rename OLD=NEW (split in ren_buf) */
  const char *ren_old[CLI_CKPT_MAX_META], *ren_new[CLI_CKPT_MAX_META];
  char *ren_buf[CLI_CKPT_MAX_META];
  int n_ren;
  const char *devices, *session_devices; /* as given; resolved once connected */
} cli_ckpt_args;

static void cli_ckpt_args_free(cli_ckpt_args *a) {
  free(a->names_buf);
  for (int i = 0; i < a->n_meta; i++) free(a->meta_buf[i]);
  for (int i = 0; i < a->n_ren; i++) free(a->ren_buf[i]);
}

static double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --- arguments ------------------------------------------------------------------ */

static bool cli_parse_layout(const char *v, pd_layout *out) {
  if (strcmp(v, "mirrored") == 0) {
    *out = pd_layout_mirrored();
    return true;
  }
  if (strcmp(v, "per-component") == 0) {
    pd_layout l = {PD_LAYOUT_PER_COMPONENT, 0, 0};
    *out = l;
    return true;
  }
  if (strncmp(v, "sharded:", 8) == 0 && v[8] >= '0' && v[8] <= '9') {
    char *end = NULL;
    long axis = strtol(v + 8, &end, 10);
    if (*end || axis < 0 || axis >= PD_MAX_RANK) return false;
    *out = pd_layout_sharded((int)axis);
    return true;
  }
  return false;
}

static bool cli_parse_format(const char *v, bool save,
                             pd_checkpoint_format *out) {
  static const char *const names[] = {"auto", "safetensors", "npy", "npz"};
  for (int i = 0; i < (save ? 3 : 4); i++)
    if (strcmp(v, names[i]) == 0) {
      *out = (pd_checkpoint_format)i;
      return true;
    }
  return false;
}

/* Splits --names into a->names (in a->names_buf); false for an empty list
 * or an empty name, or too many. */
static bool cli_parse_names(cli_ckpt_args *a, const char *v) {
  free(a->names_buf);
  a->names_buf = strdup(v);
  a->n_names = 0;
  if (!a->names_buf || !*v) return false;
  char *p = a->names_buf;
  for (;;) {
    char *comma = strchr(p, ',');
    if (comma) *comma = '\0';
    if (a->n_names == CLI_CKPT_MAX_NAMES || !*p) return false;
    a->names[a->n_names++] = p;
    if (!comma) break;
    p = comma + 1;
  }
  return true;
}

/* --rename OLD=NEW: both non-empty. */
static bool cli_parse_rename(cli_ckpt_args *a, const char *v) {
  const char *eq = strchr(v, '=');
  if (!eq || eq == v || !eq[1] || a->n_ren == CLI_CKPT_MAX_META) return false;
  char *kv = strdup(v);
  if (!kv) return false;
  kv[eq - v] = '\0';
  a->ren_buf[a->n_ren] = kv;
  a->ren_old[a->n_ren] = kv;
  a->ren_new[a->n_ren++] = kv + (eq - v) + 1;
  return true;
}

static bool cli_parse_meta(cli_ckpt_args *a, const char *v) {
  const char *eq = strchr(v, '=');
  if (!eq || eq == v || a->n_meta == CLI_CKPT_MAX_META) return false;
  char *kv = strdup(v);
  if (!kv) return false;
  kv[eq - v] = '\0';
  a->meta_buf[a->n_meta] = kv;
  a->meta_keys[a->n_meta] = kv;
  a->meta_values[a->n_meta++] = kv + (eq - v) + 1;
  return true;
}

/* One option with its value (in argv[*i + 1] or after '='); returns 2 after
 * a usage error, 0 when handled, -1 when not an option of these commands. */
static int cli_ckpt_option(const char *cmd, cli_ckpt_args *a, int argc,
                           char **argv, int *i) {
  const char *arg = argv[*i], *eq = strchr(arg, '=');
  char name[32];
  size_t nl = eq && arg[0] == '-' ? (size_t)(eq - arg) : strlen(arg);
  snprintf(name, sizeof(name), "%.*s", (int)(nl < 31 ? nl : 31), arg);
  static const char *const with_value[] = {
      "--names",   "--layout",         "--format", "--dest-format",
      "--from",    "--metadata",       "--name",   "--rename",
      "--devices", "--session-devices"};
  bool takes = false;
  for (size_t k = 0; k < sizeof(with_value) / sizeof(with_value[0]); k++)
    takes |= strcmp(name, with_value[k]) == 0;
  if (!takes) return -1;
  const char *v = eq && arg[0] == '-' ? eq + 1 : NULL;
  if (!v) {
    if (*i + 1 >= argc) return cli_usage_error(cmd, "%s needs a value", name);
    v = argv[++*i];
  }
  bool ok = true;
  if (strcmp(name, "--names") == 0)
    ok = cli_parse_names(a, v);
  else if (strcmp(name, "--layout") == 0)
    ok = cli_parse_layout(v, &a->layout);
  else if (strcmp(name, "--format") == 0)
    ok = cli_parse_format(v, false, &a->format);
  else if (strcmp(name, "--dest-format") == 0)
    ok = cli_parse_format(v, true, &a->dest_format);
  else if (strcmp(name, "--from") == 0) {
    a->source = v;
    a->from_given = true;
  } else if (strcmp(name, "--name") == 0)
    ok = (a->name = v)[0] != '\0';
  else if (strcmp(name, "--rename") == 0)
    ok = cli_parse_rename(a, v);
  else if (strcmp(name, "--devices") == 0)
    a->devices = v;
  else if (strcmp(name, "--session-devices") == 0)
    a->session_devices = v;
  else
    ok = cli_parse_meta(a, v);
  if (!ok)
    return cli_usage_error(
        cmd, "%s '%s': expected %s", name, v,
        strcmp(name, "--names") == 0    ? "non-empty names separated by "
                                          "commas (at most 4096)"
        : strcmp(name, "--name") == 0   ? "a non-empty name"
        : strcmp(name, "--rename") == 0 ? "OLD=NEW, both non-empty (at most "
                                          "64)"
        : strcmp(name, "--layout") == 0 ? "mirrored, sharded:AXIS or "
                                          "per-component"
        : strcmp(name, "--format") == 0 ? "auto, safetensors, npy or npz"
        : strcmp(name, "--dest-format") == 0 ? "auto, safetensors or npy"
                                             : "KEY=VALUE (at most 64)");
  return 0;
}

/* Parses the arguments of load (`save` false) or save. Returns -1 to go on,
 * else the exit status (0 after --help). */
static int cli_ckpt_args_parse(const char *cmd, bool save, int argc,
                               char **argv, cli_ckpt_args *a) {
  a->layout = pd_layout_mirrored();
  const char *positional = NULL;
  for (int i = 0; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      fputs(save ? cli_save_usage : cli_load_usage, stdout);
      return 0;
    }
    int rc = cli_ckpt_option(cmd, a, argc, argv, &i);
    if (rc > 0) return rc;
    if (rc == 0) continue;
    if (strcmp(arg, "--quiet") == 0)
      a->quiet = true;
    else if (save && strcmp(arg, "--overwrite") == 0)
      a->overwrite = true;
    else if (arg[0] == '-' && arg[1])
      return cli_usage_error(cmd, "unknown option '%s'", arg);
    else if (positional)
      return cli_usage_error(cmd, "one %s only; got '%s' and '%s'",
                             save ? "DEST" : "SOURCE", positional, arg);
    else
      positional = arg;
  }
  if (!save && a->from_given)
    return cli_usage_error(cmd,
                           "--from is an option of save; give load the "
                           "SOURCE itself");
  if (save) {
    a->dest = positional;
    if (!a->source) return cli_usage_error(cmd, "--from SOURCE is required");
    if (!a->dest) return cli_usage_error(cmd, "DEST is required");
  } else {
    a->source = positional;
    if (!a->source) return cli_usage_error(cmd, "SOURCE is required");
  }
  if (a->layout.kind == PD_LAYOUT_PER_COMPONENT && a->n_names == 0)
    return cli_usage_error(cmd, "--layout per-component needs --names");
  if (!save && (a->n_meta || a->name || a->n_ren))
    return cli_usage_error(cmd, "--%s is an option of save",
                           a->n_meta ? "metadata"
                           : a->name ? "name"
                                     : "rename");
  if (a->name && a->n_ren)
    return cli_usage_error(cmd,
                           "give --name (one tensor) or --rename, not "
                           "both");
  return -1;
}

/* --- the load -------------------------------------------------------------------- */

/* A progress line: a bar redrawn in place on a terminal, else a line per
 * tenth of the bytes (and the last). */
static void cli_progress_show(const pd_load_progress_info *p, bool tty,
                              int *last_tenth, double t0) {
  double frac =
      p->bytes_total ? (double)p->bytes_done / (double)p->bytes_total : 1.0;
  double secs = cli_now() - t0;
  char done[32], total[32], rate[32];
  cli_size(p->bytes_done, done, sizeof done);
  cli_size(p->bytes_total, total, sizeof total);
  cli_size(secs > 0 ? (uint64_t)((double)p->bytes_done / secs) : 0, rate,
           sizeof rate);
  if (tty) {
    char bar[41];
    int fill = (int)(frac * 40);
    for (int i = 0; i < 40; i++) bar[i] = i < fill ? '#' : '.';
    bar[40] = '\0';
    fprintf(stderr, "\r[%s] %5.1f%%  %s / %s  %s/s  %d/%d tensors", bar,
            frac * 100, done, total, rate, p->tensors_done, p->tensors_total);
    if (p->done) fputc('\n', stderr);
    fflush(stderr);
    return;
  }
  int tenth = (int)(frac * 10);
  if (tenth == *last_tenth && !p->done) return;
  *last_tenth = tenth;
  fprintf(stderr, "progress: %.1f%% %s of %s, %d of %d tensors%s\n", frac * 100,
          done, total, p->tensors_done, p->tensors_total,
          p->done ? ", done" : "");
}

/* Waits for the load's end, showing the progress; 0, or 1 after reporting
 * a failed call or tensor. */
static int cli_load_wait(const char *cmd, pd_session *s, const pd_load *l,
                         bool quiet, double t0, pd_status *st) {
  bool tty = !quiet && isatty(STDERR_FILENO);
  int last = -1;
  pd_load_progress_info p;
  for (;;) {
    if (pd_load_progress(s, pd_load_id(l), 500, &p, NULL, st) != PD_OK)
      return cli_fail(cmd, st);
    if (!quiet) cli_progress_show(&p, tty, &last, t0);
    if (p.done) break;
  }
  if (p.tensors_failed) {
    fprintf(stderr, "paradev %s: %d of %d tensors failed; the first: %s: %s\n",
            cmd, p.tensors_failed, p.tensors_total, pd_code_name(p.code),
            p.message);
    return 1;
  }
  return 0;
}

static void cli_load_print(const pd_load *l, bool placed, double secs) {
  int n = pd_load_num_tensors(l);
  for (int i = 0; i < n; i++) {
    pd_tensor_info ti;
    pd_load_tensor_info(l, i, &ti);
    const char *name = pd_load_tensor_name(l, i);
    /* The shape in the file; a per-component tensor has none: its
     * components' (with -1 where they differ). */
    int rank = ti.rank;
    int64_t dims[PD_MAX_RANK];
    memcpy(dims, ti.dims, sizeof(dims));
    bool host = pd_load_tensor_host_shape(l, i, &rank, dims);
    char shape[PD_MAX_RANK * 24 + 32] = "[";
    for (int k = 0; k < rank; k++)
      snprintf(shape + strlen(shape), sizeof(shape) - strlen(shape),
               "%s%" PRId64, k ? ", " : "", dims[k]);
    strcat(shape, host ? "]" : "] per component");
    char devs[PD_MAX_DEVICES * 12 + 8] = "";
    if (placed) {
      strcpy(devs, "  on ");
      cli_devices_str(ti.devices, ti.num_devices, devs + 5, sizeof(devs) - 5);
    }
    printf("%-40s %-9s %s%s\n", *name ? name : "(the .npy array)",
           pd_dtype_name(ti.dtype), shape, devs);
  }
  char total[32], rate[32];
  cli_size(pd_load_total_bytes(l), total, sizeof total);
  cli_size(secs > 0 ? (uint64_t)((double)pd_load_total_bytes(l) / secs) : 0,
           rate, sizeof rate);
  printf("%d tensors, %s in %.3f s (%s/s)\n", n, total, secs, rate);
}

/* Opens a session and loads a->source; *s and *l for the caller to free
 * (also on failure). Returns 0 or the exit status. */
static int cli_ckpt_load(const char *cmd, pd_client *c, const cli_ckpt_args *a,
                         pd_session **s, pd_load **l, double *secs,
                         pd_status *st) {
  int32_t sdev[PD_MAX_DEVICES], ldev[PD_MAX_DEVICES];
  int n_sdev = 0, n_ldev = 0, prc = 0;
  if (a->session_devices)
    prc = cli_parse_devices(c, cmd, "--session-devices", a->session_devices,
                            sdev, &n_sdev, st);
  if (prc == 0 && a->devices)
    prc = cli_parse_devices(c, cmd, "--devices", a->devices, ldev, &n_ldev, st);
  if (prc) return prc;
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = cmd[0] == 'l' ? "paradev load" : "paradev save";
  so.devices = sdev;
  so.num_devices = n_sdev;
  *s = pd_session_new(c, &so, NULL, st);
  if (!*s) return cli_fail(cmd, st);
  pd_load_spec *specs = NULL;
  if (a->n_names) {
    specs = calloc((size_t)a->n_names, sizeof(*specs));
    if (!specs) {
      fprintf(stderr, "paradev %s: out of memory\n", cmd);
      return 1;
    }
    for (int i = 0; i < a->n_names; i++) {
      specs[i].name = a->names[i];
      specs[i].layout = a->layout; /* devices: the default below */
    }
  }
  pd_load_options lo = PD_LOAD_OPTIONS_INITIALIZER;
  lo.format = a->format;
  lo.default_layout = a->layout;
  lo.default_devices = ldev;
  lo.n_default_devices = n_ldev;
  double t0 = cli_now();
  pd_code rc =
      pd_load_tensors(*s, a->source, specs, a->n_names, &lo, l, NULL, st);
  free(specs);
  if (rc != PD_OK) return cli_fail(cmd, st);
  int wrc = cli_load_wait(cmd, *s, *l, a->quiet, t0, st);
  *secs = cli_now() - t0;
  return wrc;
}

/* --- the save ---------------------------------------------------------------------- */

/* The stem of SOURCE's last component ("/m/weights.npy" -> "weights"; a
 * URL's query cut), into buf; "tensor" when nothing is left. */
static const char *cli_source_stem(const char *source, char *buf, size_t cap) {
  size_t len = strcspn(source, "?#");
  const char *base = source;
  for (size_t i = 0; i < len; i++)
    if (source[i] == '/') base = source + i + 1;
  size_t bl = (size_t)(source + len - base);
  for (size_t i = bl; i > 0; i--)
    if (base[i - 1] == '.') {
      bl = i - 1;
      break;
    }
  if (bl == 0) return "tensor";
  snprintf(buf, cap, "%.*s", (int)(bl < cap - 1 ? bl : cap - 1), base);
  return buf;
}

/* The name tensor i of the load gets in DEST: --name, a --rename of its
 * name, its name, or for a nameless .npy tensor the source's stem. Returns
 * 2 after a usage error (a --rename of a name the load lacks, --name with
 * several tensors), else 0. */
static int cli_save_names(const cli_ckpt_args *a, const pd_load *l,
                          pd_save_spec *specs, int n, char *stem,
                          size_t stem_cap) {
  if (a->name && n != 1)
    return cli_usage_error("save",
                           "--name names one tensor; SOURCE has %d (give "
                           "--rename OLD=NEW)",
                           n);
  for (int r = 0; r < a->n_ren; r++) {
    bool found = false;
    for (int i = 0; i < n; i++)
      found |= !strcmp(pd_load_tensor_name(l, i), a->ren_old[r]);
    if (!found)
      return cli_usage_error("save",
                             "--rename %s=%s: SOURCE has no tensor "
                             "'%s'",
                             a->ren_old[r], a->ren_new[r], a->ren_old[r]);
  }
  for (int i = 0; i < n; i++) {
    const char *nm = pd_load_tensor_name(l, i);
    for (int r = 0; r < a->n_ren; r++)
      if (!strcmp(nm, a->ren_old[r])) nm = a->ren_new[r];
    if (a->name) nm = a->name;
    if (!*nm) nm = cli_source_stem(a->source, stem, stem_cap);
    specs[i].name = nm;
  }
  return 0;
}

static int cli_ckpt_save(const cli_ckpt_args *a, pd_session *s,
                         const pd_load *l, pd_status *st) {
  int n = pd_load_num_tensors(l);
  pd_save_spec *specs = calloc((size_t)(n ? n : 1), sizeof(*specs));
  if (!specs) {
    fprintf(stderr, "paradev save: out of memory\n");
    return 1;
  }
  for (int i = 0; i < n; i++) {
    pd_tensor_info ti;
    pd_load_tensor_info(l, i, &ti);
    specs[i].id = ti.id;
    specs[i].layout = a->layout;
  }
  char stem[256], written[4096] = "";
  int urc = cli_save_names(a, l, specs, n, stem, sizeof stem);
  if (urc) {
    free(specs);
    return urc;
  }
  pd_save_options so = PD_SAVE_OPTIONS_INITIALIZER;
  so.format = a->dest_format;
  so.overwrite = a->overwrite;
  so.meta_keys = a->meta_keys;
  so.meta_values = a->meta_values;
  so.n_meta = a->n_meta;
  so.path_out = written;
  so.path_cap = sizeof written;
  uint64_t bytes = 0;
  double t0 = cli_now();
  pd_code rc = pd_save_tensors(s, a->dest, specs, n, &so, &bytes, NULL, st);
  free(specs);
  if (rc != PD_OK)
    return cli_fail_hint(
        "save", st,
        rc == PD_ALREADY_EXISTS ? "give --overwrite to replace it" : NULL);
  double secs = cli_now() - t0;
  char size[32];
  printf("saved %d tensors (%s) to %s in %.3f s\n", n,
         cli_size(bytes, size, sizeof size), written[0] ? written : a->dest,
         secs);
  return 0;
}

/* `paradev load` and `paradev save`: one session, the load, then for save
 * the save; the session closed whatever happened. */
static int cli_ckpt_run(const cli_opts *o, const char *cmd, bool save, int argc,
                        char **argv) {
  cli_ckpt_args a = {0};
  int rc = cli_ckpt_args_parse(cmd, save, argc, argv, &a);
  if (rc >= 0) {
    cli_ckpt_args_free(&a);
    return rc;
  }
  pd_status *st = pd_status_new();
  rc = 0;
  pd_client *c = cli_connect(o, cmd, st, &rc);
  pd_session *s = NULL;
  pd_load *l = NULL;
  double secs = 0;
  if (c) rc = cli_ckpt_load(cmd, c, &a, &s, &l, &secs, st);
  if (c && rc == 0) {
    if (save)
      rc = cli_ckpt_save(&a, s, l, st);
    else
      cli_load_print(l, a.devices || a.session_devices, secs);
  }
  if (s && pd_session_close(s, NULL, st) != PD_OK && rc == 0)
    rc = cli_fail(cmd, st);
  pd_load_delete(l);
  pd_session_delete(s);
  pd_client_delete(c);
  pd_status_delete(st);
  cli_ckpt_args_free(&a);
  return rc;
}

int cli_load(const cli_opts *o, int argc, char **argv) {
  return cli_ckpt_run(o, "load", false, argc, argv);
}

int cli_save(const cli_opts *o, int argc, char **argv) {
  return cli_ckpt_run(o, "save", true, argc, argv);
}
