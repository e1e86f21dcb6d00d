/* gen_ops_md: writes docs/ops.md from the engine's op registry, without a
 * daemon, through the printers `paradev ops --markdown` uses (client/
 * cli_ops.c), so the file, the CLI and the ListOps RPC say the same.
 *
 *   gen_ops_md OUT          writes the Markdown to OUT
 *   gen_ops_md --check MD   exits 1, saying how to regenerate, when MD
 *                           differs from what the registry gives
 *
 * The registry's definitions become pd_op_info here as the server's
 * conversion (server/convert.c) and libparadev (client/ops.c) make them on
 * the wire. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_ops.h"
#include "device.h"

#define MAX_ARGS 16
#define MAX_ATTRS 16
#define MAX_ALLOWED 16

typedef struct op_store {
  pd_op_arg in[MAX_ARGS], out[MAX_ARGS];
  pd_op_attr attrs[MAX_ATTRS];
  char strs[MAX_ATTRS][256]; /* string defaults, NUL-terminated */
} op_store;

static void arg_from(pd_op_arg *a, const dev_op_arg_info *ai) {
  a->name = ai->name;
  a->is_list = ai->is_list;
  a->min_length = ai->min_len;
  a->dtypes = ai->dtypes;
  a->dtype_rule = ai->dtype_rule;
  a->doc = ai->doc;
  a->length_attr = ai->length_attr;
}

static void value_from(pd_attr_value *v, const dev_attr_value *d, char *sbuf) {
  v->kind = (pd_attr_kind)d->type;
  switch (d->type) {
    case DEV_ATTR_INT: v->i = d->u.i; break;
    case DEV_ATTR_FLOAT: v->f = d->u.f; break;
    case DEV_ATTR_BOOL: v->b = d->u.b; break;
    case DEV_ATTR_DTYPE: v->dtype = d->u.dtype; break;
    case DEV_ATTR_STRING:
      snprintf(sbuf, 256, "%.*s", (int)d->u.s.len, d->u.s.ptr);
      v->s = sbuf;
      break;
    case DEV_ATTR_SHAPE:
      v->n = d->u.shape.rank;
      v->ints = d->u.shape.dims;
      break;
    case DEV_ATTR_INT_LIST:
      v->n = d->u.ilist.n;
      v->ints = d->u.ilist.v;
      break;
    case DEV_ATTR_FLOAT_LIST:
      v->n = d->u.flist.n;
      v->floats = d->u.flist.v;
      break;
    case DEV_ATTR_NONE: break;
  }
}

static void op_from(pd_op_info *o, op_store *s, const dev_op_def *def) {
  memset(o, 0, sizeof *o);
  o->name = dev_op_def_name(def);
  o->summary = dev_op_def_summary(def);
  o->notes = dev_op_def_notes(def);
  dev_op_arg_info ai;
  dev_op_attr_info ti;
  for (int i = 0; dev_op_def_input(def, i, &ai) && i < MAX_ARGS; i++)
    arg_from(&s->in[o->num_inputs++], &ai);
  for (int i = 0; dev_op_def_output(def, i, &ai) && i < MAX_ARGS; i++)
    arg_from(&s->out[o->num_outputs++], &ai);
  for (int i = 0; dev_op_def_attr(def, i, &ti) && i < MAX_ATTRS; i++) {
    pd_op_attr *a = &s->attrs[o->num_attrs++];
    memset(a, 0, sizeof *a);
    a->name = ti.name;
    a->kind = (pd_attr_kind)ti.type;
    a->has_default = ti.has_default;
    if (ti.has_default)
      value_from(&a->default_value, &ti.default_value, s->strs[i]);
    a->has_minimum = ti.has_min;
    a->minimum = ti.min;
    a->has_maximum = ti.has_max;
    a->maximum = ti.max;
    while (ti.allowed && ti.allowed[a->num_allowed_values])
      a->num_allowed_values++;
    a->allowed_values = ti.allowed;
    a->doc = ti.doc;
  }
  o->inputs = s->in;
  o->outputs = s->out;
  o->attrs = s->attrs;
  o->has_gradient = dev_op_def_has_gradient(def);
  o->is_collective = dev_op_def_is_collective(def);
}

/* The Markdown in a malloc'd buffer; NULL when out of memory. */
static char *generate(size_t *len) {
  int n = dev_op_count();
  pd_op_info *ops = calloc((size_t)n, sizeof *ops);
  op_store *st = calloc((size_t)n, sizeof *st);
  char *buf = NULL;
  FILE *f = ops && st ? open_memstream(&buf, len) : NULL;
  if (f) {
    for (int i = 0; i < n; i++) op_from(&ops[i], &st[i], dev_op_at(i));
    cli_ops_print_markdown(f, ops, n);
    fclose(f);
  }
  free(ops);
  free(st);
  return buf;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  FILE *m = open_memstream(&buf, len);
  char chunk[65536];
  size_t k;
  while (m && (k = fread(chunk, 1, sizeof chunk, f)) > 0)
    fwrite(chunk, 1, k, m);
  fclose(f);
  if (m) fclose(m);
  return buf;
}

/* The 1-based line where a and b first differ. */
static int first_diff_line(const char *a, size_t na, const char *b, size_t nb) {
  int line = 1;
  for (size_t i = 0; i < na && i < nb && a[i] == b[i]; i++)
    if (a[i] == '\n') line++;
  return line;
}

int main(int argc, char **argv) {
  bool check = argc == 3 && strcmp(argv[1], "--check") == 0;
  if (!(argc == 2 && argv[1][0] != '-') && !check) {
    fprintf(stderr, "usage: gen_ops_md OUT | gen_ops_md --check docs/ops.md\n");
    return 2;
  }
  dev_registry_init();
  size_t glen = 0;
  char *gen = generate(&glen);
  if (!gen) {
    fprintf(stderr, "gen_ops_md: out of memory\n");
    return 1;
  }
  int rc = 0;
  if (check) {
    size_t flen = 0;
    char *cur = slurp(argv[2], &flen);
    if (!cur || flen != glen || memcmp(cur, gen, glen) != 0) {
      fprintf(
          stderr,
          "%s is stale: it differs from the op registry (device/ops/)%s%d.\n"
          "Regenerate it and check it in:\n"
          "  cmake --build build --target ops_md && cp build/docs/ops.md "
          "docs/ops.md\n",
          argv[2], cur ? " from line " : " (cannot read it)",
          cur ? first_diff_line(cur, flen, gen, glen) : 0);
      rc = 1;
    } else {
      printf("%s is current (%d ops)\n", argv[2], dev_op_count());
    }
    free(cur);
  } else {
    FILE *f = fopen(argv[1], "wb");
    if (!f || fwrite(gen, 1, glen, f) != glen || fclose(f) != 0) {
      fprintf(stderr, "gen_ops_md: cannot write %s\n", argv[1]);
      rc = 1;
    }
  }
  free(gen);
  return rc;
}
