/* `paradev ops`: the op reference printed from pd_op_info (pd_list_ops), as
 * a table of every op, one op in full, or Markdown. The formatting needs no
 * daemon, so tools/gen_ops_md.c prints docs/ops.md through the same
 * functions from the engine's registry: one source, one format. */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli_ops.h"

/* "float32, float64" for a dtype mask; "any" for every dtype. */
static void dtypes_str(uint32_t mask, char *buf, size_t len) {
  buf[0] = '\0';
  uint32_t all = 0;
  for (int dt = 1; dt < PD_DTYPE_COUNT; dt++) all |= PD_DTYPE_BIT(dt);
  if ((mask & all) == all) {
    snprintf(buf, len, "any");
    return;
  }
  size_t o = 0;
  for (int dt = 1; dt < PD_DTYPE_COUNT && o < len; dt++)
    if (mask & PD_DTYPE_BIT(dt))
      o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? ", " : "",
                            pd_dtype_name((pd_dtype)dt));
}

/* The argument's dtypes with its rule: "float32, float64 (same as a)". */
static void arg_types(const pd_op_arg *a, char *buf, size_t len) {
  char d[160];
  dtypes_str(a->dtypes, d, sizeof d);
  if (a->dtype_rule[0])
    snprintf(buf, len, "%s (%s)", d, a->dtype_rule);
  else
    snprintf(buf, len, "%s", d);
}

/* "values (list, >= 1)", "output (list of num_split)" or "a". */
static void arg_name(const pd_op_arg *a, char *buf, size_t len) {
  if (a->is_list && a->length_attr && a->length_attr[0])
    snprintf(buf, len, "%s (list of %s, >= %d)", a->name, a->length_attr,
             a->min_length);
  else if (a->is_list)
    snprintf(buf, len, "%s (list, >= %d)", a->name, a->min_length);
  else
    snprintf(buf, len, "%s", a->name);
}

static void cli_ops_value(const pd_attr_value *v, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  switch (v->kind) {
    case PD_ATTR_KIND_INT: snprintf(buf, len, "%" PRId64, v->i); return;
    case PD_ATTR_KIND_FLOAT: snprintf(buf, len, "%g", v->f); return;
    case PD_ATTR_KIND_BOOL: snprintf(buf, len, v->b ? "true" : "false"); return;
    case PD_ATTR_KIND_STRING: snprintf(buf, len, "\"%s\"", v->s); return;
    case PD_ATTR_KIND_DTYPE:
      snprintf(buf, len, "%s", pd_dtype_name(v->dtype));
      return;
    case PD_ATTR_KIND_SHAPE:
    case PD_ATTR_KIND_INT_LIST:
      o += (size_t)snprintf(buf, len, "[");
      for (int i = 0; i < v->n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? ", " : "",
                              v->ints[i]);
      if (o < len) snprintf(buf + o, len - o, "]");
      return;
    case PD_ATTR_KIND_FLOAT_LIST:
      o += (size_t)snprintf(buf, len, "[");
      for (int i = 0; i < v->n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%g", i ? ", " : "",
                              v->floats[i]);
      if (o < len) snprintf(buf + o, len - o, "]");
      return;
    case PD_ATTR_KIND_INVALID: return;
  }
}

/* "= false", "required"; and the range / allowed values. */
static void attr_default(const pd_op_attr *a, char *buf, size_t len) {
  char v[256];
  if (!a->has_default) {
    snprintf(buf, len, "required");
    return;
  }
  cli_ops_value(&a->default_value, v, sizeof v);
  snprintf(buf, len, "%s", v);
}

static void attr_range(const pd_op_attr *a, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  if (a->has_minimum && a->has_maximum)
    o += (size_t)snprintf(buf, len, "%g..%g", a->minimum, a->maximum);
  else if (a->has_minimum)
    o += (size_t)snprintf(buf, len, ">= %g", a->minimum);
  else if (a->has_maximum)
    o += (size_t)snprintf(buf, len, "<= %g", a->maximum);
  for (int i = 0; i < a->num_allowed_values && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? " | " : "",
                          a->allowed_values[i]);
}

/* "a, b -> product" (list arguments marked "values..."). */
static void signature(const pd_op_info *op, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < op->num_inputs && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%s%s", i ? ", " : "",
                          op->inputs[i].name,
                          op->inputs[i].is_list ? "..." : "");
  if (o < len)
    o += (size_t)snprintf(buf + o, len - o, "%s", o ? " -> " : "-> ");
  for (int i = 0; i < op->num_outputs && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%s%s", i ? ", " : "",
                          op->outputs[i].name,
                          op->outputs[i].is_list ? "..." : "");
}

void cli_ops_print_table(FILE *f, const pd_op_info *ops, int n) {
  char sig[256];
  fprintf(f, "%-36s %-34s %s\n", "OP", "INPUTS -> OUTPUTS", "SUMMARY");
  for (int i = 0; i < n; i++) {
    signature(&ops[i], sig, sizeof sig);
    fprintf(f, "%-36s %-34s %s\n", ops[i].name, sig, ops[i].summary);
  }
  fprintf(f, "%d ops; 'paradev ops NAME' for one in full\n", n);
}

static void print_args(FILE *f, const char *title, const pd_op_arg *args,
                       int n) {
  char nm[160], ty[320];
  fprintf(f, "%s:%s\n", title, n ? "" : " none");
  for (int i = 0; i < n; i++) {
    arg_name(&args[i], nm, sizeof nm);
    arg_types(&args[i], ty, sizeof ty);
    fprintf(f, "  %-22s %s%s%s\n", nm, ty, args[i].doc[0] ? "; " : "",
            args[i].doc);
  }
}

void cli_ops_print_one(FILE *f, const pd_op_info *op) {
  char def[300], rng[300];
  fprintf(f, "%s: %s\n\n", op->name, op->summary);
  print_args(f, "Inputs", op->inputs, op->num_inputs);
  print_args(f, "Outputs", op->outputs, op->num_outputs);
  fprintf(f, "Attributes:%s\n", op->num_attrs ? "" : " none");
  for (int i = 0; i < op->num_attrs; i++) {
    const pd_op_attr *a = &op->attrs[i];
    attr_default(a, def, sizeof def);
    attr_range(a, rng, sizeof rng);
    fprintf(f, "  %-22s %-11s %s%s%s%s%s\n", a->name,
            pd_attr_kind_name(a->kind), a->has_default ? "default " : "", def,
            rng[0] ? "; " : "", rng, "");
    if (a->doc[0]) fprintf(f, "  %-22s %s\n", "", a->doc);
  }
  fprintf(f, "Gradient: %s\n", op->has_gradient ? "yes" : "no");
  fprintf(f, "Collective: %s\n", op->is_collective ? "yes" : "no");
  if (op->notes[0]) fprintf(f, "Notes: %s\n", op->notes);
}

/* Markdown table cells: '|' would end the cell. */
static void md_cell(FILE *f, const char *s) {
  for (; *s; s++)
    if (*s == '|')
      fputs("\\|", f);
    else
      fputc(*s, f);
}

static void md_args(FILE *f, const char *title, const pd_op_arg *args, int n) {
  char nm[160], ty[320];
  if (!n) return;
  fprintf(f, "\n%s:\n\n| name | dtypes | |\n| --- | --- | --- |\n", title);
  for (int i = 0; i < n; i++) {
    arg_name(&args[i], nm, sizeof nm);
    arg_types(&args[i], ty, sizeof ty);
    fprintf(f, "| `%s` | %s | ", nm, ty);
    md_cell(f, args[i].doc);
    fputs(" |\n", f);
  }
}

void cli_ops_print_markdown(FILE *f, const pd_op_info *ops, int n) {
  char sig[256], def[300], rng[300];
  fputs(
      "# paradev ops\n\n"
      "<!-- Generated from the op registry (device/ops/) by "
      "tools/gen_ops_md; do not edit.\n"
      "     Regenerate: cmake --build build --target ops_md && cp "
      "build/docs/ops.md docs/ops.md -->\n\n"
      "Every op paradevd runs, as its registry declares it (the same data "
      "as `paradev ops` and the ListOps RPC). Names are TensorFlow's "
      "raw-op spelling; where an op differs from `tf.raw_ops` of the same "
      "name, its notes say how. Attributes are given as `pd_attrs` (C) or "
      "keyword arguments (Python).\n\n"
      "| op | inputs -> outputs | summary |\n| --- | --- | --- |\n",
      f);
  for (int i = 0; i < n; i++) {
    signature(&ops[i], sig, sizeof sig);
    char anchor[128];
    size_t k = 0;
    for (; ops[i].name[k] && k + 1 < sizeof anchor; k++)
      anchor[k] = (char)tolower((unsigned char)ops[i].name[k]);
    anchor[k] = '\0';
    fprintf(f, "| [%s](#%s) | `%s` | ", ops[i].name, anchor, sig);
    md_cell(f, ops[i].summary);
    fputs(" |\n", f);
  }
  for (int i = 0; i < n; i++) {
    const pd_op_info *op = &ops[i];
    fprintf(f, "\n## %s\n\n%s\n", op->name, op->summary);
    md_args(f, "Inputs", op->inputs, op->num_inputs);
    md_args(f, "Outputs", op->outputs, op->num_outputs);
    if (op->num_attrs) {
      fputs(
          "\nAttributes:\n\n| name | kind | default | range | |\n"
          "| --- | --- | --- | --- | --- |\n",
          f);
      for (int j = 0; j < op->num_attrs; j++) {
        const pd_op_attr *a = &op->attrs[j];
        attr_default(a, def, sizeof def);
        attr_range(a, rng, sizeof rng);
        fprintf(f, "| `%s` | %s | ", a->name, pd_attr_kind_name(a->kind));
        md_cell(f, def);
        fputs(" | ", f);
        md_cell(f, rng);
        fputs(" | ", f);
        md_cell(f, a->doc);
        fputs(" |\n", f);
      }
    }
    fprintf(f, "\nGradient: %s. Collective: %s.\n",
            op->has_gradient ? "yes" : "no", op->is_collective ? "yes" : "no");
    if (op->notes[0]) fprintf(f, "\n%s\n", op->notes);
  }
}
