/* `paradev function check FILE.json [--describe]`: reads a FunctionDef in
 * protobuf's JSON mapping (proto or lowerCamel field names; enums by name
 * or number; dtypes also as NumPy spells them), builds it with libparadev's
 * pd_function, registers it in a fresh session (--session-devices: on
 * those devices) and prints "ok" or the
 * daemon's error, which names the node. --describe then prints
 * DescribeFunction's JSON. Exit status as every command: 0 ok, 1 a refused
 * or failed call, 2 a bad command line or a file that is not such JSON:
 * every member's JSON type is checked and an error names its path and what
 * was expected ("nodes[3].inputs: expected an array of strings, got an
 * object"); unknown members are refused (a misspelt "input" would drop the
 * inputs silently), DescribeFunction's output-only origins and
 * outputs_info accepted and ignored. */
#include <errno.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli_cmd.h"

static const char cli_function_usage[] =
    "Usage: paradev function check FILE.json [--describe] "
    "[--session-devices D]\n"
    "\n"
    "Registers the function of FILE.json (a paradev.v1.FunctionDef in\n"
    "protobuf's JSON mapping: name, args [{name, dtype}], nodes [{name, op,\n"
    "inputs, attrs [{name, value: {i|f|b|s|dtype|shape|int_list|\n"
    "float_list}}]}], outputs [{name, source}], options) in a new session,\n"
    "then prints \"ok\" or the daemon's error, which names the node.\n"
    "Every member is type-checked and unknown ones are refused (exit 2),\n"
    "naming the JSON path: \"nodes[3].inputs: expected an array of strings\".\n"
    "  --describe  after registering, print DescribeFunction's answer (JSON)\n"
    "  --session-devices D  open the session on these devices (indices or\n"
    "              names as 'paradev info' shows them: 0,2 or cpu:0,cpu:2)\n";

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

/* Where in the file a value is ("nodes[3].inputs[0]") and where an error
 * goes. */
typedef struct cli_at {
  char path[160];
  char *err;
  size_t len;
} cli_at;

static void cli_at_sub(cli_at *sub, const cli_at *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cli_at_sub(cli_at *sub, const cli_at *at, const char *fmt, ...) {
  *sub = *at;
  size_t n = strlen(at->path);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sub->path + n, sizeof sub->path - n, fmt, ap);
  va_end(ap);
  if (n == 0 && sub->path[0] == '.')
    memmove(sub->path, sub->path + 1, strlen(sub->path));
}

static const char *cli_type_name(json_object *v) {
  switch (json_object_get_type(v)) {
    case json_type_null: return "null";
    case json_type_boolean: return "a boolean";
    case json_type_double:
    case json_type_int: return "a number";
    case json_type_string: return "a string";
    case json_type_array: return "an array";
    case json_type_object: return "an object";
  }
  return "something else";
}

/* "PATH: expected WHAT, got TYPE"; returns false. */
static bool cli_expected(const cli_at *at, const char *what, json_object *v) {
  return cli_bad(at->err, at->len, "%s: expected %s, got %s", at->path, what,
                 cli_type_name(v));
}

/* Refuses members of `o` not in names (proto and lowerCamel spellings). */
static bool cli_known(const cli_at *at, json_object *o,
                      const char *const *names) {
  json_object_object_foreach(o, key, val) {
    (void)val;
    bool known = false;
    for (int k = 0; names[k] && !known; k++) known = strcmp(key, names[k]) == 0;
    if (!known) {
      char list[256] = "";
      for (int k = 0; names[k]; k += 1) {
        size_t n = strlen(list);
        snprintf(list + n, sizeof list - n, "%s%s", k ? ", " : "", names[k]);
      }
      return cli_bad(at->err, at->len,
                     "%s%s%.64s: unknown field (expected one of %s)", at->path,
                     at->path[0] ? "." : "", key, list);
    }
  }
  return true;
}

/* A member by its proto name or its lowerCamel JSON name. */
static json_object *cli_get(json_object *o, const char *proto,
                            const char *camel) {
  json_object *v = NULL;
  if (json_object_object_get_ex(o, proto, &v)) return v;
  if (camel && json_object_object_get_ex(o, camel, &v)) return v;
  return NULL;
}

/* A required string member, or NULL with the error written. */
static const char *cli_want_str(const cli_at *at, json_object *o,
                                const char *name) {
  cli_at sub;
  cli_at_sub(&sub, at, ".%s", name);
  json_object *v = cli_get(o, name, NULL);
  if (!v) {
    cli_bad(at->err, at->len, "%s: expected a string, missing", sub.path);
    return NULL;
  }
  if (!json_object_is_type(v, json_type_string)) {
    cli_expected(&sub, "a string", v);
    return NULL;
  }
  return json_object_get_string(v);
}

/* An optional array member: *arr NULL when absent. */
static bool cli_want_array(const cli_at *at, json_object *v, const char *what) {
  return json_object_is_type(v, json_type_array) || cli_expected(at, what, v);
}

/* An int64: a JSON integer or, as protobuf's mapping allows, a string of
 * decimal digits. */
static bool cli_int64(const cli_at *at, json_object *v, int64_t *out) {
  if (json_object_is_type(v, json_type_int)) {
    *out = json_object_get_int64(v);
    return true;
  }
  if (json_object_is_type(v, json_type_string)) {
    const char *s = json_object_get_string(v);
    char *end = NULL;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (*s && end && *end == '\0' && errno == 0) {
      *out = (int64_t)x;
      return true;
    }
  }
  return cli_expected(at, "an integer", v);
}

/* A double: a JSON number or "NaN", "Infinity", "-Infinity". */
static bool cli_double(const cli_at *at, json_object *v, double *out) {
  if (json_object_is_type(v, json_type_int) ||
      json_object_is_type(v, json_type_double)) {
    *out = json_object_get_double(v);
    return true;
  }
  const char *s =
      json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "";
  if (strcmp(s, "NaN") == 0 || strcmp(s, "Infinity") == 0 ||
      strcmp(s, "-Infinity") == 0) {
    *out = strtod(s, NULL);
    return true;
  }
  return cli_expected(at, "a number", v);
}

/* "DTYPE_FLOAT32", "float32" or 1. */
static bool cli_dtype(const cli_at *at, json_object *v, pd_dtype *out) {
  if (json_object_is_type(v, json_type_int)) {
    *out = (pd_dtype)json_object_get_int(v);
    return true;
  }
  if (!json_object_is_type(v, json_type_string))
    return cli_expected(at, "a dtype (a name such as \"float32\" or a number)",
                        v);
  const char *s = json_object_get_string(v);
  char low[32];
  if (strncmp(s, "DTYPE_", 6) == 0) {
    size_t i = 0;
    for (const char *p = s + 6; *p && i + 1 < sizeof low; p++)
      low[i++] = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    low[i] = '\0';
    s = low;
  }
  *out = pd_dtype_from_name(s);
  if (*out == PD_DTYPE_INVALID)
    return cli_bad(at->err, at->len, "%s: unknown dtype \"%.32s\"", at->path,
                   json_object_get_string(v));
  return true;
}

/* Numbers of an IntList / FloatList ({"values": [...]}) or a Shape
 * ({"dims": [...]}): the count, or -1 with the error written. */
static int cli_numbers(const cli_at *at, json_object *o, const char *member,
                       double *d, int64_t *i, int cap) {
  static const char *const fields[2][2] = {{"values", NULL}, {"dims", NULL}};
  if (!json_object_is_type(o, json_type_object))
    return cli_expected(at,
                        strcmp(member, "dims") ? "an object {values: [...]}"
                                               : "an object {dims: [...]}",
                        o)
               ? 0
               : -1;
  if (!cli_known(at, o, fields[strcmp(member, "dims") == 0])) return -1;
  cli_at sub;
  cli_at_sub(&sub, at, ".%s", member);
  json_object *arr = cli_get(o, member, NULL);
  if (!arr) return 0;
  if (!cli_want_array(&sub, arr,
                      d ? "an array of numbers" : "an array of integers"))
    return -1;
  int n = (int)json_object_array_length(arr);
  if (n > cap) {
    cli_bad(at->err, at->len, "%s: more than %d values", sub.path, cap);
    return -1;
  }
  for (int k = 0; k < n; k++) {
    json_object *e = json_object_array_get_idx(arr, (size_t)k);
    cli_at el;
    cli_at_sub(&el, &sub, "[%d]", k);
    if (d ? !cli_double(&el, e, &d[k]) : !cli_int64(&el, e, &i[k])) return -1;
  }
  return n;
}

/* One of AttrValue's oneof members (exactly one). */
static bool cli_attr_value(pd_attrs *a, const char *name, const cli_at *at,
                           json_object *v) {
  static const char *const kinds[] = {
      "i",        "f",       "b",          "s",         "dtype", "shape",
      "int_list", "intList", "float_list", "floatList", NULL};
  if (!json_object_is_type(v, json_type_object))
    return cli_expected(at,
                        "an object with one of i, f, b, s, dtype, shape, "
                        "int_list, float_list",
                        v);
  if (!cli_known(at, v, kinds)) return false;
  if (json_object_object_length(v) != 1)
    return cli_bad(at->err, at->len,
                   "%s: expected exactly one of i, f, b, s, dtype, shape, "
                   "int_list, float_list; got %d members",
                   at->path, json_object_object_length(v));
  enum { CAP = 1024 };
  static int64_t iv[CAP];
  static double fv[CAP];
  json_object_object_foreach(v, key, x) {
    cli_at sub;
    cli_at_sub(&sub, at, ".%s", key);
    int n = 0;
    if (strcmp(key, "i") == 0) {
      if (!cli_int64(&sub, x, &iv[0])) return false;
      pd_attrs_set_int(a, name, iv[0]);
    } else if (strcmp(key, "f") == 0) {
      if (!cli_double(&sub, x, &fv[0])) return false;
      pd_attrs_set_float(a, name, fv[0]);
    } else if (strcmp(key, "b") == 0) {
      if (!json_object_is_type(x, json_type_boolean))
        return cli_expected(&sub, "a boolean", x);
      pd_attrs_set_bool(a, name, json_object_get_boolean(x));
    } else if (strcmp(key, "s") == 0) {
      if (!json_object_is_type(x, json_type_string))
        return cli_expected(&sub, "a string", x);
      pd_attrs_set_string(a, name, json_object_get_string(x));
    } else if (strcmp(key, "dtype") == 0) {
      pd_dtype dt;
      if (!cli_dtype(&sub, x, &dt)) return false;
      pd_attrs_set_dtype(a, name, dt);
    } else if (strcmp(key, "shape") == 0) {
      if ((n = cli_numbers(&sub, x, "dims", NULL, iv, CAP)) < 0) return false;
      pd_attrs_set_shape(a, name, iv, n);
    } else if (key[0] == 'i') { /* int_list, intList */
      if ((n = cli_numbers(&sub, x, "values", NULL, iv, CAP)) < 0) return false;
      pd_attrs_set_int_list(a, name, iv, n);
    } else { /* float_list, floatList */
      if ((n = cli_numbers(&sub, x, "values", fv, NULL, CAP)) < 0) return false;
      pd_attrs_set_float_list(a, name, fv, n);
    }
  }
  return true;
}

static bool cli_attr(pd_attrs *a, const cli_at *at, json_object *at_obj) {
  static const char *const fields[] = {"name", "value", NULL};
  if (!json_object_is_type(at_obj, json_type_object))
    return cli_expected(at, "an object {name, value}", at_obj);
  if (!cli_known(at, at_obj, fields)) return false;
  const char *name = cli_want_str(at, at_obj, "name");
  if (!name) return false;
  cli_at sub;
  cli_at_sub(&sub, at, ".value");
  json_object *v = cli_get(at_obj, "value", NULL);
  if (!v)
    return cli_bad(at->err, at->len, "%s: expected an object, missing",
                   sub.path);
  return cli_attr_value(a, name, &sub, v);
}

/* inputs: an array of strings, copied into a NULL-terminated vector. */
static bool cli_inputs(const cli_at *at, json_object *nd, const char ***in,
                       int *n) {
  cli_at sub;
  cli_at_sub(&sub, at, ".inputs");
  json_object *ins = cli_get(nd, "inputs", NULL);
  *n = 0;
  if (ins && !cli_want_array(&sub, ins, "an array of strings")) return false;
  *n = ins ? (int)json_object_array_length(ins) : 0;
  *in = calloc((size_t)*n + 1, sizeof(**in));
  if (!*in) return cli_bad(at->err, at->len, "out of memory");
  for (int k = 0; k < *n; k++) {
    json_object *e = json_object_array_get_idx(ins, (size_t)k);
    if (!json_object_is_type(e, json_type_string)) {
      cli_at el;
      cli_at_sub(&el, &sub, "[%d]", k);
      return cli_expected(&el, "a string", e);
    }
    (*in)[k] = json_object_get_string(e);
  }
  return true;
}

/* origins and outputs_info are DescribeFunction's (output only): accepted so
 * that its JSON can be checked again, and ignored. */
static bool cli_node(pd_function *f, const cli_at *at, json_object *nd,
                     pd_status *st) {
  static const char *const fields[] = {"name",        "op",      "inputs",
                                       "attrs",       "origins", "outputs_info",
                                       "outputsInfo", NULL};
  if (!json_object_is_type(nd, json_type_object))
    return cli_expected(at, "an object {name, op, inputs, attrs}", nd);
  if (!cli_known(at, nd, fields)) return false;
  const char *name = cli_want_str(at, nd, "name");
  const char *op = name ? cli_want_str(at, nd, "op") : NULL;
  if (!name || !op) return false;
  const char **in = NULL;
  int n = 0;
  pd_attrs *a = pd_attrs_new();
  bool ok = a ? cli_inputs(at, nd, &in, &n)
              : cli_bad(at->err, at->len, "out of memory");
  cli_at sub;
  cli_at_sub(&sub, at, ".attrs");
  json_object *ats = cli_get(nd, "attrs", NULL);
  if (ok && ats) ok = cli_want_array(&sub, ats, "an array of objects");
  int na = ok && ats ? (int)json_object_array_length(ats) : 0;
  for (int k = 0; ok && k < na; k++) {
    cli_at el;
    cli_at_sub(&el, &sub, "[%d]", k);
    ok = cli_attr(a, &el, json_object_array_get_idx(ats, (size_t)k));
  }
  if (ok && pd_function_add_node(f, name, op, in, n, a, st) != PD_OK)
    ok = cli_bad(at->err, at->len, "%s (%s): %s", at->path, name,
                 pd_status_message(st));
  free(in);
  pd_attrs_delete(a);
  return ok;
}

/* "constant_folding" -> "constantFolding". */
static void cli_camel(const char *proto, char *out, size_t len) {
  size_t i = 0;
  for (const char *p = proto; *p && i + 1 < len; p++)
    if (*p == '_' && p[1])
      out[i++] = (char)(*++p - 'a' + 'A');
    else
      out[i++] = *p;
  out[i] = '\0';
}

static bool cli_options(pd_function *f, const cli_at *at, json_object *o) {
  if (!json_object_is_type(o, json_type_object))
    return cli_expected(at, "an object", o);
  char camel[PD_PASS_COUNT][32];
  const char *fields[2 * PD_PASS_COUNT + 3];
  int nf = 0;
  for (int p = 0; p < PD_PASS_COUNT; p++) {
    cli_camel(pd_pass_name((pd_pass)p), camel[p], sizeof camel[p]);
    fields[nf++] = pd_pass_name((pd_pass)p);
    if (strcmp(camel[p], pd_pass_name((pd_pass)p)) != 0)
      fields[nf++] = camel[p];
  }
  fields[nf++] = "max_instantiations";
  fields[nf++] = "maxInstantiations";
  fields[nf] = NULL;
  if (!cli_known(at, o, fields)) return false;
  for (int p = 0; p < PD_PASS_COUNT; p++) {
    const char *pn = pd_pass_name((pd_pass)p);
    json_object *v = cli_get(o, pn, camel[p]);
    if (!v) continue;
    int t = -1;
    if (json_object_is_type(v, json_type_int)) {
      t = json_object_get_int(v);
    } else if (json_object_is_type(v, json_type_string)) {
      const char *s = json_object_get_string(v);
      static const char *const names[] = {"TRI_STATE_DEFAULT", "TRI_STATE_OFF",
                                          "TRI_STATE_ON"};
      for (int k = 0; k < 3; k++)
        if (strcmp(s, names[k]) == 0 || strcasecmp(s, names[k] + 10) == 0)
          t = k;
    }
    if (t < 0 || t > 2)
      return cli_bad(at->err, at->len,
                     "%s.%s: expected TRI_STATE_DEFAULT, TRI_STATE_OFF "
                     "or TRI_STATE_ON (or 0, 1, 2)",
                     at->path, pn);
    pd_function_set_pass(f, (pd_pass)p, (pd_tristate)t);
  }
  json_object *m = cli_get(o, "max_instantiations", "maxInstantiations");
  cli_at sub;
  cli_at_sub(&sub, at, ".max_instantiations");
  int64_t mi = 0;
  if (m && !cli_int64(&sub, m, &mi)) return false;
  if (m && (mi < 0 || mi > INT32_MAX))
    return cli_bad(at->err, at->len, "%s: expected 0 to %d, got %lld", sub.path,
                   INT32_MAX, (long long)mi);
  if (m) pd_function_set_max_instantiations(f, (int)mi);
  return true;
}

static bool cli_arg(pd_function *f, const cli_at *at, json_object *a) {
  static const char *const fields[] = {"name", "dtype", NULL};
  if (!json_object_is_type(a, json_type_object))
    return cli_expected(at, "an object {name, dtype}", a);
  if (!cli_known(at, a, fields)) return false;
  const char *name = cli_want_str(at, a, "name");
  if (!name) return false;
  cli_at sub;
  cli_at_sub(&sub, at, ".dtype");
  json_object *dt = cli_get(a, "dtype", NULL);
  pd_dtype d = PD_DTYPE_INVALID;
  if (!dt)
    return cli_bad(at->err, at->len, "%s: expected a dtype, missing", sub.path);
  if (!cli_dtype(&sub, dt, &d)) return false;
  pd_function_add_arg(f, name, d);
  return true;
}

static bool cli_output(pd_function *f, const cli_at *at, json_object *o,
                       pd_status *st) {
  static const char *const fields[] = {"name", "source", NULL};
  if (!json_object_is_type(o, json_type_object))
    return cli_expected(at, "an object {name, source}", o);
  if (!cli_known(at, o, fields)) return false;
  const char *name = cli_want_str(at, o, "name");
  const char *src = name ? cli_want_str(at, o, "source") : NULL;
  if (!name || !src) return false;
  if (pd_function_add_output(f, name, src, st) != PD_OK)
    return cli_bad(at->err, at->len, "%s: %s", at->path, pd_status_message(st));
  return true;
}

/* FILE.json -> *out; false with the reason in err ("PATH: expected X, got
 * Y"). Unknown members are refused, as a typo ("input") would otherwise
 * drop what it meant silently. */
static bool cli_function_from_json(json_object *j, pd_function **out, char *err,
                                   size_t len, pd_status *st) {
  static const char *const fields[] = {"name",    "args",    "nodes",
                                       "outputs", "options", NULL};
  cli_at top = {.path = "", .err = err, .len = len};
  if (!cli_known(&top, j, fields)) return false;
  const char *name = cli_want_str(&top, j, "name");
  if (!name) return false;
  pd_function *f = pd_function_new(name);
  if (!f) return cli_bad(err, len, "out of memory");
  static const char *const lists[] = {"args", "nodes", "outputs"};
  bool ok = true;
  for (int l = 0; ok && l < 3; l++) {
    cli_at sub;
    cli_at_sub(&sub, &top, "%s", lists[l]);
    json_object *arr = cli_get(j, lists[l], NULL);
    if (!arr) continue;
    ok = cli_want_array(&sub, arr, "an array of objects");
    size_t n = ok ? json_object_array_length(arr) : 0;
    for (size_t k = 0; ok && k < n; k++) {
      cli_at el;
      cli_at_sub(&el, &sub, "[%zu]", k);
      json_object *e = json_object_array_get_idx(arr, k);
      ok = l == 0   ? cli_arg(f, &el, e)
           : l == 1 ? cli_node(f, &el, e, st)
                    : cli_output(f, &el, e, st);
    }
  }
  cli_at osub;
  cli_at_sub(&osub, &top, "options");
  json_object *opts = cli_get(j, "options", NULL);
  if (ok && opts) ok = cli_options(f, &osub, opts);
  if (!ok) {
    pd_function_delete(f);
    return false;
  }
  *out = f;
  return true;
}

static const char *cli_name_of(json_object *j) {
  return json_object_get_string(cli_get(j, "name", NULL));
}

/* The file's JSON (an object), or NULL with why in `why`: the parser's
 * reason and the byte where it stopped, or "ends before the JSON does". */
static json_object *cli_read_json(const char *file, char *why, size_t len) {
  FILE *f = fopen(file, "rb");
  if (!f) {
    snprintf(why, len, "cannot read it: %s", strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap || cap >= (64u << 20)) break;
    char *more = realloc(buf, cap * 2);
    if (!more) free(buf);
    buf = more;
    cap *= 2;
  }
  bool too_big = buf && n == cap, bad = ferror(f);
  fclose(f);
  if (buf && !too_big) buf[n] = '\0'; /* json-c: the end of the text */
  json_tokener *tok = buf && !too_big && !bad ? json_tokener_new() : NULL;
  json_object *j = tok ? json_tokener_parse_ex(tok, buf, (int)n + 1) : NULL;
  enum json_tokener_error e =
      tok ? json_tokener_get_error(tok) : json_tokener_error_size;
  size_t end = tok ? json_tokener_get_parse_end(tok) : 0;
  if (!buf || bad || too_big)
    snprintf(why, len, "%s",
             !buf  ? "out of memory"
             : bad ? "cannot read it"
                   : "over 64 MiB");
  else if (e == json_tokener_continue)
    snprintf(why, len, "not JSON: the file ends before the JSON does");
  else if (e != json_tokener_success)
    snprintf(why, len, "not JSON: %s at byte %zu", json_tokener_error_desc(e),
             end);
  else if (end < n && strspn(buf + end, " \t\r\n") < n - end)
    snprintf(why, len, "not JSON: more after the object, at byte %zu", end);
  else if (!json_object_is_type(j, json_type_object))
    snprintf(why, len, "expected a JSON object (a FunctionDef), got %s",
             cli_type_name(j));
  else {
    json_tokener_free(tok);
    free(buf);
    return j;
  }
  json_object_put(j);
  if (tok) json_tokener_free(tok);
  free(buf);
  return NULL;
}

static int cli_function_check(const cli_opts *o, const char *file,
                              bool describe, const char *sdevs) {
  char why[256];
  json_object *j = cli_read_json(file, why, sizeof why);
  if (!j) {
    fprintf(stderr, "paradev function: %s: %s\n", file, why);
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
  int32_t dev[PD_MAX_DEVICES];
  int n_dev = 0;
  if (c && sdevs)
    rc = cli_parse_devices(c, "function", "--session-devices", sdevs, dev,
                           &n_dev, st);
  if (c && rc == 0) {
    pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
    so.client_name = "paradev function";
    so.devices = dev;
    so.num_devices = n_dev;
    if (!(s = pd_session_new(c, &so, NULL, st))) rc = cli_fail("function", st);
  }
  bool existed = false;
  if (s && pd_register_function(s, f, &existed, NULL, st) != PD_OK)
    rc = cli_fail("function", st);
  else if (s)
    printf("ok\n");
  char *json = NULL;
  if (s && rc == 0 && describe) {
    if (pd_describe_function(s, cli_name_of(j), &json, NULL, st) != PD_OK)
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
  const char *file = NULL, *sdevs = NULL;
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
    else if (strncmp(argv[i], "--session-devices=", 18) == 0)
      sdevs = argv[i] + 18;
    else if (strcmp(argv[i], "--session-devices") == 0) {
      if (i + 1 >= argc)
        return cli_usage_error("function", "--session-devices needs a value");
      sdevs = argv[++i];
    } else if (strcmp(argv[i], "--help") == 0) {
      fputs(cli_function_usage, stdout);
      return 0;
    } else if (argv[i][0] == '-' || file)
      return cli_usage_error("function", "unknown argument '%s'", argv[i]);
    else
      file = argv[i];
  }
  if (!file) return cli_usage_error("function", "check needs FILE.json");
  return cli_function_check(o, file, describe, sdevs);
}
