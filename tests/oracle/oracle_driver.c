/* The C half of the NumPy oracle: runs a table of ops through the engine and
 * writes every output component to disk, for tests/oracle/oracle.py to check
 * against NumPy.
 *
 * Usage: oracle_driver MANIFEST RESULTS DIR
 *
 * MANIFEST (written by oracle.py) is line-based, whitespace-separated; file
 * names are relative to DIR:
 *
 *   case NAME NDEV OP
 *   attr NAME int V | float V | bool 0|1 | string S | dtype DTYPE
 *   attr NAME ilist N V... | flist N V... | shape RANK D...
 *   input DTYPE mirrored RANK D... FILE        host value, every device
 *   input DTYPE sharded AXIS RANK D... FILE    host value split along AXIS
 *   end
 *
 * RESULTS (read by oracle.py), one block per case:
 *
 *   case NAME ok NOUT
 *   out I DTYPE NCOMP
 *   comp D RANK D... FILE                      component D of output I
 *   case NAME err_exec CODE MESSAGE            dev_execute refused the op
 *   case NAME err_run CODE MESSAGE             the op failed while running
 *   case NAME err_setup CODE MESSAGE           upload or engine failed
 *
 * Inputs and outputs are raw, dense, row-major, little-endian. One engine per
 * mesh size is kept for the whole run, so cases after an error case also check
 * that the engine still runs good ops. Exit status 0 unless the manifest or a
 * file could not be read or written (op failures are results, not errors). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

#define MAX_LINE 8192
#define MAX_TOK 512
#define MAX_ATTRS 16
#define MAX_INPUTS 16
#define PATH_MAX_LEN 4096

typedef struct attr_store {
  char name[64];
  char str[DEV_ATTR_STRING_MAX];
  int64_t ilist[DEV_ATTR_LIST_MAX];
  double flist[DEV_ATTR_LIST_MAX];
} attr_store;

typedef struct input_spec {
  pd_dtype dtype;
  dev_layout layout;
  dev_shape shape;
  char file[PATH_MAX_LEN];
} input_spec;

typedef struct case_spec {
  char name[256];
  char op[128];
  int ndev;
  int num_attrs;
  dev_attr attrs[MAX_ATTRS];
  attr_store store[MAX_ATTRS];
  int num_inputs;
  input_spec inputs[MAX_INPUTS];
} case_spec;

static dev_engine *engines[PD_MAX_DEVICES + 1];
static const char *out_dir;

static void die(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "oracle_driver: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(2);
}

static dev_engine *engine_for(int ndev, dev_status *st) {
  if (ndev < 1 || ndev > PD_MAX_DEVICES) {
    dev_error(st, PD_INVALID_ARGUMENT, "bad mesh size %d", ndev);
    return NULL;
  }
  if (!engines[ndev]) {
    dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
    cfg.backend = "cpu";
    cfg.num_devices = ndev;
    if (dev_engine_create(&cfg, &engines[ndev], st) != PD_OK) return NULL;
  }
  return engines[ndev];
}

/* Splits `line` in place into whitespace-separated tokens. */
static int tokenize(char *line, char **tok, int max) {
  int n = 0;
  char *save = NULL;
  for (char *p = strtok_r(line, " \t\r\n", &save); p && n < max;
       p = strtok_r(NULL, " \t\r\n", &save))
    tok[n++] = p;
  return n;
}

static void need(int ntok, int want, const char *line) {
  if (ntok < want) die("malformed manifest line: %s", line);
}

static pd_dtype parse_dtype(const char *s) {
  pd_dtype dt = pd_dtype_from_name(s);
  if (dt == PD_DTYPE_INVALID) die("unknown dtype %s", s);
  return dt;
}

static void parse_attr(case_spec *c, char **tok, int ntok, const char *line) {
  need(ntok, 4, line);
  if (c->num_attrs >= MAX_ATTRS) die("too many attrs: %s", line);
  int k = c->num_attrs++;
  attr_store *s = &c->store[k];
  snprintf(s->name, sizeof s->name, "%s", tok[1]);
  const char *type = tok[2];
  dev_attr *a = &c->attrs[k];
  if (!strcmp(type, "int")) {
    *a = dev_attr_int(s->name, strtoll(tok[3], NULL, 10));
  } else if (!strcmp(type, "float")) {
    *a = dev_attr_float(s->name, strtod(tok[3], NULL));
  } else if (!strcmp(type, "bool")) {
    *a = dev_attr_bool(s->name, atoi(tok[3]) != 0);
  } else if (!strcmp(type, "string")) {
    snprintf(s->str, sizeof s->str, "%s", tok[3]);
    *a = dev_attr_string(s->name, s->str);
  } else if (!strcmp(type, "dtype")) {
    *a = dev_attr_dtype(s->name, parse_dtype(tok[3]));
  } else if (!strcmp(type, "ilist") || !strcmp(type, "flist") ||
             !strcmp(type, "shape")) {
    int n = atoi(tok[3]);
    if (n < 0 || n > DEV_ATTR_LIST_MAX) die("bad list length: %s", line);
    need(ntok, 4 + n, line);
    for (int i = 0; i < n; i++) {
      s->ilist[i] = strtoll(tok[4 + i], NULL, 10);
      s->flist[i] = strtod(tok[4 + i], NULL);
    }
    if (!strcmp(type, "ilist"))
      *a = dev_attr_int_list(s->name, s->ilist, n);
    else if (!strcmp(type, "flist"))
      *a = dev_attr_float_list(s->name, s->flist, n);
    else
      *a = dev_attr_shape(s->name, n, s->ilist);
  } else {
    die("unknown attr type in: %s", line);
  }
}

static void parse_input(case_spec *c, char **tok, int ntok, const char *line) {
  need(ntok, 4, line);
  if (c->num_inputs >= MAX_INPUTS) die("too many inputs: %s", line);
  input_spec *in = &c->inputs[c->num_inputs++];
  in->dtype = parse_dtype(tok[1]);
  int at = 3;
  if (!strcmp(tok[2], "mirrored")) {
    in->layout = (dev_layout){DEV_LAYOUT_MIRRORED, 0, 0};
  } else if (!strcmp(tok[2], "sharded")) {
    in->layout = (dev_layout){DEV_LAYOUT_SHARDED, atoi(tok[3]), 0};
    at = 4;
  } else {
    die("unknown layout in: %s", line);
  }
  need(ntok, at + 1, line);
  int rank = atoi(tok[at]);
  if (rank < 0 || rank > PD_MAX_RANK) die("bad rank in: %s", line);
  need(ntok, at + 2 + rank, line);
  in->shape.rank = rank;
  for (int i = 0; i < rank; i++)
    in->shape.dims[i] = strtoll(tok[at + 1 + i], NULL, 10);
  snprintf(in->file, sizeof in->file, "%s/%s", out_dir, tok[at + 1 + rank]);
}

/* Reads a whole file; *len receives its size. */
static void *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) die("cannot open %s: %s", path, strerror(errno));
  if (fseek(f, 0, SEEK_END) != 0) die("cannot seek %s", path);
  long sz = ftell(f);
  if (sz < 0) die("cannot size %s", path);
  rewind(f);
  void *buf = malloc(sz > 0 ? (size_t)sz : 1);
  if (!buf) die("out of memory reading %s", path);
  if (sz > 0 && fread(buf, 1, (size_t)sz, f) != (size_t)sz)
    die("short read of %s", path);
  fclose(f);
  *len = (size_t)sz;
  return buf;
}

static void write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) die("cannot create %s: %s", path, strerror(errno));
  if (len > 0 && fwrite(data, 1, len, f) != len) die("short write of %s", path);
  if (fclose(f) != 0) die("cannot close %s", path);
}

/* Writes a one-line message: newlines become spaces. */
static void put_msg(FILE *res, const char *msg) {
  for (const char *p = msg; *p; p++)
    fputc(*p == '\n' || *p == '\r' ? ' ' : *p, res);
  fputc('\n', res);
}

static void report(FILE *res, const case_spec *c, const char *what,
                   const dev_status *st) {
  fprintf(res, "case %s %s %s ", c->name, what, pd_code_name(st->code));
  put_msg(res, st->msg[0] ? st->msg : "(no message)");
}

/* Downloads every component of every output and writes the RESULTS block. */
static int download_outputs(FILE *res, const case_spec *c, dev_tensor **outs,
                            int n_out, dev_status *st) {
  for (int i = 0; i < n_out; i++) {
    if (dev_tensor_wait(outs[i], st) != PD_OK) {
      report(res, c, "err_run", st);
      return -1;
    }
  }
  fprintf(res, "case %s ok %d\n", c->name, n_out);
  for (int i = 0; i < n_out; i++) {
    dev_tensor *t = outs[i];
    int ncomp = dev_tensor_num_components(t);
    fprintf(res, "out %d %s %d\n", i, pd_dtype_name(dev_tensor_dtype(t)),
            ncomp);
    for (int d = 0; d < ncomp; d++) {
      dev_layout lay = {DEV_LAYOUT_COMPONENT, 0, d};
      dev_shape hs;
      uint64_t bytes = 0;
      if (dev_tensor_host_size(t, &lay, 0, &hs, &bytes, st) != PD_OK ||
          bytes > SIZE_MAX)
        return -2;
      void *buf = malloc(bytes ? (size_t)bytes : 1);
      if (!buf) die("out of memory");
      if (dev_tensor_to_host(t, &lay, 0, buf, (size_t)bytes, st) != PD_OK) {
        free(buf);
        return -2;
      }
      char rel[512], path[PATH_MAX_LEN + 600];
      snprintf(rel, sizeof rel, "%s.out%d.c%d.bin", c->name, i, d);
      snprintf(path, sizeof path, "%s/%s", out_dir, rel);
      write_file(path, buf, (size_t)bytes);
      free(buf);
      fprintf(res, "comp %d %d", d, hs.rank);
      for (int k = 0; k < hs.rank; k++)
        fprintf(res, " %lld", (long long)hs.dims[k]);
      fprintf(res, " %s\n", rel);
    }
  }
  return 0;
}

static void run_case(FILE *res, const case_spec *c) {
  dev_status st = DEV_STATUS_INIT;
  dev_engine *e = engine_for(c->ndev, &st);
  if (!e) {
    report(res, c, "err_setup", &st);
    return;
  }
  dev_tensor *ins[MAX_INPUTS] = {0};
  int n_in = 0;
  for (; n_in < c->num_inputs; n_in++) {
    const input_spec *in = &c->inputs[n_in];
    size_t len = 0;
    void *data = read_file(in->file, &len);
    size_t want = 0;
    if (dev_shape_byte_size(in->dtype, &in->shape, &want, &st) != PD_OK ||
        want != len) {
      if (st.code == PD_OK)
        dev_error(&st, PD_INTERNAL,
                  "input %d: file has %zu bytes, shape wants %zu", n_in, len,
                  want);
      free(data);
      report(res, c, "err_setup", &st);
      goto out;
    }
    pd_code rc = dev_tensor_from_host(e, in->dtype, &in->layout, &in->shape,
                                      data, &ins[n_in], &st);
    free(data);
    if (rc != PD_OK) {
      report(res, c, "err_setup", &st);
      goto out;
    }
  }
  {
    dev_tensor *outs[DEV_MAX_OUTPUTS] = {0};
    int n_out = DEV_MAX_OUTPUTS;
    if (dev_execute(e, c->op, ins, n_in, c->attrs, c->num_attrs, outs, &n_out,
                    &st) != PD_OK) {
      report(res, c, "err_exec", &st);
      goto out;
    }
    int rc = download_outputs(res, c, outs, n_out, &st);
    if (rc == -2) {
      /* The op ran but its download failed: an engine bug, not the op's. */
      fprintf(res, "case %s err_setup %s download: ", c->name,
              pd_code_name(st.code));
      put_msg(res, st.msg);
    }
    for (int i = 0; i < n_out; i++) dev_tensor_release(outs[i]);
  }
out:
  for (int i = 0; i < n_in; i++) dev_tensor_release(ins[i]);
  fflush(res);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s MANIFEST RESULTS DIR\n", argv[0]);
    return 2;
  }
  out_dir = argv[3];
  FILE *man = fopen(argv[1], "r");
  if (!man) die("cannot open manifest %s: %s", argv[1], strerror(errno));
  FILE *res = fopen(argv[2], "w");
  if (!res) die("cannot create %s: %s", argv[2], strerror(errno));

  static char line[MAX_LINE], copy[MAX_LINE];
  static case_spec c;
  bool in_case = false;
  int ncases = 0;
  while (fgets(line, sizeof line, man)) {
    snprintf(copy, sizeof copy, "%s", line);
    char *tok[MAX_TOK];
    int ntok = tokenize(line, tok, MAX_TOK);
    if (ntok == 0 || tok[0][0] == '#') continue;
    if (!strcmp(tok[0], "case")) {
      need(ntok, 4, copy);
      memset(&c, 0, sizeof c);
      snprintf(c.name, sizeof c.name, "%s", tok[1]);
      c.ndev = atoi(tok[2]);
      snprintf(c.op, sizeof c.op, "%s", tok[3]);
      in_case = true;
    } else if (!in_case) {
      die("line outside a case: %s", copy);
    } else if (!strcmp(tok[0], "attr")) {
      parse_attr(&c, tok, ntok, copy);
    } else if (!strcmp(tok[0], "input")) {
      parse_input(&c, tok, ntok, copy);
    } else if (!strcmp(tok[0], "end")) {
      run_case(res, &c);
      ncases++;
      in_case = false;
    } else {
      die("unknown manifest line: %s", copy);
    }
  }
  fclose(man);
  if (fclose(res) != 0) die("cannot close %s", argv[2]);
  for (int n = 0; n <= PD_MAX_DEVICES; n++) dev_engine_destroy(engines[n]);
  fprintf(stderr, "oracle_driver: ran %d cases\n", ncases);
  return 0;
}
