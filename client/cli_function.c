/* `paradev function check FILE.json [--describe]`: reads a FunctionDef in
 * protobuf's JSON mapping (proto or lowerCamel field names; enums by name
 * or number; dtypes also as NumPy spells them), builds it with libparadev's
 * pd_function, registers it in a fresh session and prints "ok" or the
 * daemon's error, which names the node. --describe then prints
 * DescribeFunction's JSON. Exit status as every command: 0 ok, 1 a refused
 * or failed call, 2 a bad command line or a file that is not such JSON. */
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli_cmd.h"

static const char cli_function_usage[] =
    "Usage: paradev function check FILE.json [--describe]\n"
    "\n"
    "Registers the function of FILE.json (a paradev.v1.FunctionDef in\n"
    "protobuf's JSON mapping: name, args [{name, dtype}], nodes [{name, op,\n"
    "inputs, attrs [{name, value: {i|f|b|s|dtype|shape|int_list|\n"
    "float_list}}]}], outputs [{name, source}], options) in a new session,\n"
    "then prints \"ok\" or the daemon's error, which names the node.\n"
    "  --describe  after registering, print DescribeFunction's answer (JSON)\n";

/* A member by its proto name or its lowerCamel JSON name. */
static json_object *cli_get(json_object *o, const char *proto,
                            const char *camel) {
  json_object *v = NULL;
  if (json_object_object_get_ex(o, proto, &v)) return v;
  if (camel && json_object_object_get_ex(o, camel, &v)) return v;
  return NULL;
}

static const char *cli_str(json_object *o, const char *name) {
  json_object *v = cli_get(o, name, NULL);
  return v && json_object_is_type(v, json_type_string)
             ? json_object_get_string(v)
             : NULL;
}

/* Writes a file error; returns false. */
static bool cli_bad(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool cli_bad(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return false;
}

/* "DTYPE_FLOAT32", "float32" or 1. */
static bool cli_dtype(json_object *v, pd_dtype *out) {
  if (json_object_is_type(v, json_type_int)) {
    *out = (pd_dtype)json_object_get_int(v);
    return true;
  }
  const char *s = json_object_get_string(v);
  if (!s) return false;
  char low[32];
  if (strncmp(s, "DTYPE_", 6) == 0) {
    size_t i = 0;
    for (const char *p = s + 6; *p && i + 1 < sizeof low; p++)
      low[i++] = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    low[i] = '\0';
    s = low;
  }
  *out = pd_dtype_from_name(s);
  return *out != PD_DTYPE_INVALID;
}

/* Numbers of an IntList / FloatList ({"values": [...]}) or a Shape
 * ({"dims": [...]}); 64-bit integers may be strings. */
static int cli_numbers(json_object *o, const char *member, double *d,
                       int64_t *i, int cap) {
  json_object *arr = o ? cli_get(o, member, NULL) : NULL;
  int n = arr && json_object_is_type(arr, json_type_array)
              ? (int)json_object_array_length(arr)
              : 0;
  if (n > cap) return -1;
  for (int k = 0; k < n; k++) {
    json_object *e = json_object_array_get_idx(arr, (size_t)k);
    if (d) d[k] = json_object_get_double(e);
    if (i) i[k] = json_object_get_int64(e);
  }
  return n;
}

static bool cli_attr(pd_attrs *a, json_object *at, char *err, size_t len) {
  const char *name = cli_str(at, "name");
  json_object *v = cli_get(at, "value", NULL), *x = NULL;
  if (!name || !v) return cli_bad(err, len, "an attr without name or value");
  enum { CAP = 1024 };
  static int64_t iv[CAP];
  static double fv[CAP];
  if ((x = cli_get(v, "i", NULL))) {
    pd_attrs_set_int(a, name, json_object_get_int64(x));
  } else if ((x = cli_get(v, "f", NULL))) {
    pd_attrs_set_float(a, name, json_object_get_double(x));
  } else if ((x = cli_get(v, "b", NULL))) {
    pd_attrs_set_bool(a, name, json_object_get_boolean(x));
  } else if ((x = cli_get(v, "s", NULL))) {
    pd_attrs_set_string(a, name, json_object_get_string(x));
  } else if ((x = cli_get(v, "dtype", NULL))) {
    pd_dtype dt;
    if (!cli_dtype(x, &dt))
      return cli_bad(err, len, "attr %s: an unknown dtype", name);
    pd_attrs_set_dtype(a, name, dt);
  } else if ((x = cli_get(v, "shape", NULL))) {
    int n = cli_numbers(x, "dims", NULL, iv, CAP);
    if (n < 0) return cli_bad(err, len, "attr %s: too many dims", name);
    pd_attrs_set_shape(a, name, iv, n);
  } else if ((x = cli_get(v, "int_list", "intList"))) {
    int n = cli_numbers(x, "values", NULL, iv, CAP);
    if (n < 0) return cli_bad(err, len, "attr %s: a list too long", name);
    pd_attrs_set_int_list(a, name, iv, n);
  } else if ((x = cli_get(v, "float_list", "floatList"))) {
    int n = cli_numbers(x, "values", fv, NULL, CAP);
    if (n < 0) return cli_bad(err, len, "attr %s: a list too long", name);
    pd_attrs_set_float_list(a, name, fv, n);
  } else {
    return cli_bad(err, len,
                   "attr %s: a value without i, f, b, s, dtype, shape, "
                   "int_list or float_list",
                   name);
  }
  return true;
}

static bool cli_node(pd_function *f, json_object *nd, int idx, char *err,
                     size_t len, pd_status *st) {
  const char *name = cli_str(nd, "name"), *op = cli_str(nd, "op");
  if (!name || !op)
    return cli_bad(err, len, "node %d: expected a name and an op", idx);
  json_object *ins = cli_get(nd, "inputs", NULL);
  int n = ins && json_object_is_type(ins, json_type_array)
              ? (int)json_object_array_length(ins)
              : 0;
  const char **in = calloc((size_t)n + 1, sizeof(*in));
  pd_attrs *a = pd_attrs_new();
  bool ok = in && a;
  for (int k = 0; ok && k < n; k++)
    in[k] = json_object_get_string(json_object_array_get_idx(ins, (size_t)k));
  json_object *ats = cli_get(nd, "attrs", NULL);
  int na = ats && json_object_is_type(ats, json_type_array)
               ? (int)json_object_array_length(ats)
               : 0;
  for (int k = 0; ok && k < na; k++)
    if (!cli_attr(a, json_object_array_get_idx(ats, (size_t)k), err, len)) {
      char tmp[600];
      snprintf(tmp, sizeof tmp, "node %d (%.64s): %s", idx, name, err);
      size_t m = strnlen(tmp, len - 1);
      memcpy(err, tmp, m);
      err[m] = '\0';
      ok = false;
    }
  if (ok && pd_function_add_node(f, name, op, in, n, a, st) != PD_OK)
    ok =
        cli_bad(err, len, "node %d (%s): %s", idx, name, pd_status_message(st));
  if (!in || !a) cli_bad(err, len, "out of memory");
  free(in);
  pd_attrs_delete(a);
  return ok;
}

static bool cli_options(pd_function *f, json_object *o, char *err, size_t len) {
  for (int p = 0; p < PD_PASS_COUNT; p++) {
    const char *pn = pd_pass_name((pd_pass)p);
    json_object *v = cli_get(o, pn, NULL);
    if (!v) continue;
    int t = -1;
    if (json_object_is_type(v, json_type_int)) {
      t = json_object_get_int(v);
    } else {
      const char *s = json_object_get_string(v);
      static const char *const names[] = {"TRI_STATE_DEFAULT", "TRI_STATE_OFF",
                                          "TRI_STATE_ON"};
      for (int k = 0; k < 3; k++)
        if (strcmp(s, names[k]) == 0 || strcasecmp(s, names[k] + 10) == 0)
          t = k;
    }
    if (t < 0 || t > 2)
      return cli_bad(err, len,
                     "options.%s: expected TRI_STATE_DEFAULT, TRI_STATE_OFF "
                     "or TRI_STATE_ON",
                     pn);
    pd_function_set_pass(f, (pd_pass)p, (pd_tristate)t);
  }
  json_object *m = cli_get(o, "max_instantiations", "maxInstantiations");
  if (m) pd_function_set_max_instantiations(f, json_object_get_int(m));
  return true;
}

/* FILE.json -> *out; false with the reason in err. */
static bool cli_function_from_json(json_object *j, pd_function **out, char *err,
                                   size_t len, pd_status *st) {
  const char *name = cli_str(j, "name");
  if (!name) return cli_bad(err, len, "no \"name\" (a string)");
  pd_function *f = pd_function_new(name);
  if (!f) return cli_bad(err, len, "out of memory");
  bool ok = true;
  json_object *args = cli_get(j, "args", NULL);
  for (size_t k = 0; ok && args && k < json_object_array_length(args); k++) {
    json_object *a = json_object_array_get_idx(args, k), *dt = NULL;
    pd_dtype d = PD_DTYPE_INVALID;
    if (!(dt = cli_get(a, "dtype", NULL)) || !cli_dtype(dt, &d))
      ok = cli_bad(err, len, "arg %zu: expected a dtype", k);
    else
      pd_function_add_arg(f, cli_str(a, "name"), d);
  }
  json_object *nodes = cli_get(j, "nodes", NULL);
  for (size_t k = 0; ok && nodes && k < json_object_array_length(nodes); k++)
    ok = cli_node(f, json_object_array_get_idx(nodes, k), (int)k, err, len, st);
  json_object *outs = cli_get(j, "outputs", NULL);
  for (size_t k = 0; ok && outs && k < json_object_array_length(outs); k++) {
    json_object *o = json_object_array_get_idx(outs, k);
    if (pd_function_add_output(f, cli_str(o, "name"), cli_str(o, "source"),
                               st) != PD_OK)
      ok = cli_bad(err, len, "output %zu: %s", k, pd_status_message(st));
  }
  json_object *opts = cli_get(j, "options", NULL);
  if (ok && opts) ok = cli_options(f, opts, err, len);
  if (!ok) {
    pd_function_delete(f);
    return false;
  }
  *out = f;
  return true;
}

static int cli_function_check(const cli_opts *o, const char *file,
                              bool describe) {
  json_object *j = json_object_from_file(file);
  if (!j || !json_object_is_type(j, json_type_object)) {
    fprintf(stderr, "paradev function: %s: not a JSON object (%s)\n", file,
            json_util_get_last_err() ? json_util_get_last_err() : "");
    json_object_put(j);
    return 2;
  }
  pd_status *st = pd_status_new();
  pd_function *f = NULL;
  char err[512];
  int rc = 0;
  if (!st || !cli_function_from_json(j, &f, err, sizeof err, st)) {
    fprintf(stderr, "paradev function: %s: %s\n", file, st ? err : "no memory");
    rc = 2;
  }
  pd_client *c = rc ? NULL : cli_connect(o, "function", st, &rc);
  pd_session *s = NULL;
  if (c) {
    pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
    so.client_name = "paradev function";
    if (!(s = pd_session_new(c, &so, NULL, st))) rc = cli_fail("function", st);
  }
  bool existed = false;
  if (s && pd_register_function(s, f, &existed, NULL, st) != PD_OK)
    rc = cli_fail("function", st);
  else if (s)
    printf("ok\n");
  char *json = NULL;
  if (s && rc == 0 && describe) {
    if (pd_describe_function(s, cli_str(j, "name"), &json, NULL, st) != PD_OK)
      rc = cli_fail("function", st);
    else
      printf("%s\n", json);
  }
  free(json);
  if (s && pd_session_close(s, NULL, st) != PD_OK && rc == 0)
    rc = cli_fail("function", st);
  pd_session_delete(s);
  pd_client_delete(c);
  pd_function_delete(f);
  pd_status_delete(st);
  json_object_put(j);
  return rc;
}

int cli_function(const cli_opts *o, int argc, char **argv) {
  const char *file = NULL;
  bool describe = false;
  if (argc >= 1 &&
      (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0)) {
    fputs(cli_function_usage, stdout);
    return 0;
  }
  if (argc < 1 || strcmp(argv[0], "check") != 0)
    return cli_usage_error("function", "expected 'check FILE.json'");
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--describe") == 0)
      describe = true;
    else if (strcmp(argv[i], "--help") == 0) {
      fputs(cli_function_usage, stdout);
      return 0;
    } else if (argv[i][0] == '-' || file)
      return cli_usage_error("function", "unknown argument '%s'", argv[i]);
    else
      file = argv[i];
  }
  if (!file) return cli_usage_error("function", "check needs FILE.json");
  return cli_function_check(o, file, describe);
}
