/* The daemon's refusals of hostile strings (issue #14, "Hostile bytes"):
 *
 *  - every string field of every request message of every method
 *    (proto/paradev/v1/methods.h), at any depth, fields added later
 *    included, is refused by server/wire.c srv_unpack_bytes when it holds a
 *    NUL byte (protobuf-c 1.4.1 would cut it there: "/a\0b" -> "/a"), with
 *    INVALID_ARGUMENT naming the field; the same bytes without the NUL
 *    decode;
 *  - client names and job ids must be UTF-8 without control characters
 *    (convert.c srv_check_label), and the refusal names the byte offset;
 *    UTF-8 of any language passes, and metadata values may hold control
 *    characters but not bytes that are not UTF-8 (srv_check_string);
 *  - the byte budget: a request whose decoding needs more than its budget
 *    is RESOURCE_EXHAUSTED, and everything allocated is given back.
 *  - every `devices` field (issue #17) is checked by one function, whose
 *    refusals name the field and the entry.
 *
 * Byte offsets and code points below are worked out by hand from RFC 3629. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "convert.h"
#include "grpc/health/v1/health.pb-c.h"
#include "log.h"
#include "paradev/v1/admin.pb-c.h"
#include "paradev/v1/mesh.pb-c.h"
#include "paradev/v1/methods.h"
#include "paradev/v1/paradev.pb-c.h"
#include "server.h"

typedef struct method {
  const char *name;
  const ProtobufCMessageDescriptor *request;
} method;

#define ENTRY(SVC, METHOD, KIND, REQ, RESP) {#METHOD, &REQ##__descriptor},
static const method methods[] = {PD_ALL_METHODS(ENTRY)};
#undef ENTRY
#define N_METHODS (sizeof(methods) / sizeof(methods[0]))

/* --- wire bytes by hand ------------------------------------------------------ */

typedef struct bytes {
  uint8_t p[512];
  size_t n;
} bytes;

static size_t put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  do {
    p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return n;
}

/* `field` (wire type 2) holding `in`, in front of nothing. */
static bytes wrap(unsigned field, const bytes *in) {
  bytes out;
  out.n = put_varint(out.p, (uint64_t)field << 3 | 2);
  out.n += put_varint(out.p + out.n, in->n);
  assert_true(out.n + in->n <= sizeof out.p);
  memcpy(out.p + out.n, in->p, in->n);
  out.n += in->n;
  return out;
}

/* --- NUL in every string field ----------------------------------------------- */

typedef struct walk {
  const method *m;
  unsigned path[8];     /* field numbers from the request down */
  const char *names[8]; /* their names, for failure messages */
  const ProtobufCMessageDescriptor *seen[8];
  int depth;
  int checked; /* string fields checked */
} walk;

static void check_string_field(walk *w, const ProtobufCFieldDescriptor *f) {
  static const char *const values[2] = {"a\0b", "ab"};
  for (int with_nul = 1; with_nul >= 0; with_nul--) {
    bytes b;
    b.n = 0;
    const char *v = values[with_nul ? 0 : 1];
    bytes leaf;
    leaf.n = with_nul ? 3 : 2;
    memcpy(leaf.p, v, leaf.n);
    b = wrap(f->id, &leaf);
    for (int i = w->depth - 1; i >= 0; i--) b = wrap(w->path[i], &b);
    srv_budget bud;
    srv_budget_init(&bud, srv_budget_bytes(b.n));
    size_t budget = bud.left;
    dev_status st = DEV_STATUS_INIT;
    ProtobufCMessage *msg =
        srv_unpack_bytes(w->m->request, b.p, b.n, &bud, &st);
    char where[256];
    int k = snprintf(where, sizeof where, "%s: ", w->m->name);
    for (int i = 0; i < w->depth; i++)
      k += snprintf(where + k, sizeof where - (size_t)k, "%s.", w->names[i]);
    snprintf(where + k, sizeof where - (size_t)k, "%s", f->name);
    if (with_nul) {
      char want[128];
      snprintf(want, sizeof want, "the string field '%s' holds a NUL byte",
               f->name);
      if (msg || st.code != PD_INVALID_ARGUMENT || !strstr(st.msg, want))
        fail_msg(
            "%s with a NUL: got %s \"%s\"; expected INVALID_ARGUMENT "
            "with \"%s\"",
            where, msg ? "a message" : pd_code_name(st.code), st.msg, want);
    } else {
      if (!msg)
        fail_msg("%s without a NUL: %s \"%s\"; expected it to decode", where,
                 pd_code_name(st.code), st.msg);
      protobuf_c_message_free_unpacked(msg, &bud.alloc);
    }
    assert_int_equal(bud.left, budget); /* every byte given back */
  }
  w->checked++;
}

static void walk_message(walk *w, const ProtobufCMessageDescriptor *d) {
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type == PROTOBUF_C_TYPE_STRING) {
      check_string_field(w, f);
    } else if (f->type == PROTOBUF_C_TYPE_MESSAGE && w->depth < 6) {
      bool cycle = false;
      for (int k = 0; k < w->depth; k++) cycle |= w->seen[k] == f->descriptor;
      if (cycle || f->descriptor == d) continue;
      w->path[w->depth] = f->id;
      w->names[w->depth] = f->name;
      w->seen[w->depth] = d;
      w->depth++;
      walk_message(w, f->descriptor);
      w->depth--;
    }
  }
}

static void test_nul_in_every_string_field(void **state) {
  (void)state;
  int total = 0;
  for (size_t i = 0; i < N_METHODS; i++) {
    walk w;
    memset(&w, 0, sizeof w);
    w.m = &methods[i];
    walk_message(&w, methods[i].request);
    total += w.checked;
  }
  /* CreateSession's client_name and job_id, Operation.op, Attr.name, the
   * string attr value, LoadTensors' source, names and component sources,
   * SaveTensors' path, names and metadata, the shared memory names and
   * keys, ListOps' name, the admin job ids and log spec, the health
   * service: well over 20 paths. */
  printf("NUL refused in %d string fields of %zu methods' requests\n", total,
         N_METHODS);
  assert_true(total >= 20);
}

/* --- client names and job ids: UTF-8, no control characters ---------------------- */

static const srv_req_limits limits = {65536, 256, 4};

static void expect_label(const char *s, long at, const char *needle) {
  dev_status st = DEV_STATUS_INIT;
  pd_code rc = srv_check_label(&limits, s, "client_name", &st);
  if (at < 0) {
    if (rc != PD_OK) fail_msg("\"%s\": %s", s, st.msg);
    return;
  }
  char want[64];
  snprintf(want, sizeof want, "client_name: byte %ld ", at);
  if (rc != PD_INVALID_ARGUMENT || !strstr(st.msg, want) ||
      !strstr(st.msg, needle))
    fail_msg("got %s \"%s\"; expected INVALID_ARGUMENT with \"%s\" and \"%s\"",
             pd_code_name(rc), st.msg, want, needle);
}

static void test_label_utf8(void **state) {
  (void)state;
  /* Any language, as it is. */
  expect_label("unié中", -1, "");
  expect_label("quo\"te\\back", -1, "");
  expect_label("\xF0\x9F\x98\x80 emoji", -1, ""); /* U+1F600 */
  expect_label("\xF4\x8F\xBF\xBF", -1, "");       /* U+10FFFF, the last */
  expect_label("", -1, "");                       /* empty: allowed */
  expect_label(NULL, -1, "");
  /* Not UTF-8: the offset of the first byte that does not begin a
   * character. */
  expect_label("bad\xFF", 3, "(0xFF) is not UTF-8");
  expect_label("\xC3\xA9\x80", 2, "(0x80) is not UTF-8"); /* é, then a lone
                                                            continuation */
  expect_label("\xC0\xAF", 0, "(0xC0) is not UTF-8");     /* overlong '/' */
  expect_label("ab\xE0\x80\xAF", 2, "is not UTF-8"); /* overlong, 3 bytes */
  expect_label("\xED\xA0\x80", 0, "(0xED) is not UTF-8"); /* U+D800 surrogate */
  expect_label("\xF4\x90\x80\x80", 0, "is not UTF-8");    /* U+110000 */
  expect_label("x\xE4\xB8", 1, "(0xE4) is not UTF-8");    /* 中, cut */
  /* Control characters: C0, DEL, C1. */
  expect_label("bad\n!", 3, "(0x0A) is a control character");
  expect_label("\x1B[31mred", 0, "(0x1B) is a control character");
  expect_label("a\x7F", 1, "(0x7F) is a control character");
  expect_label("ok\xC2\x85", 2, "(0xC2) is a control character"); /* U+0085 */
  expect_label("not-DRAINING\t", 12, "is a control character");
  /* The length limit first, in bytes: 85 three-byte characters are 255. */
  char big[300] = "";
  for (int i = 0; i < 85; i++) strcat(big, "中");
  expect_label(big, -1, "");
  strcat(big, "ab");
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_check_label(&limits, big, "job_id", &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "job_id is 257 bytes"));
}

static void test_string_utf8(void **state) {
  (void)state;
  dev_status st = DEV_STATUS_INIT;
  /* A metadata value: control characters are text there (JSON escapes
   * them), bytes that are not UTF-8 are not. */
  assert_int_equal(srv_check_string(&limits, "line 1\nline 2",
                                    "a metadata "
                                    "value",
                                    &st),
                   PD_OK);
  assert_int_equal(
      srv_check_string(&limits, "caf\xE9", "a metadata value", &st),
      PD_INVALID_ARGUMENT);
  assert_non_null(
      strstr(st.msg, "a metadata value: byte 3 (0xE9) is not UTF-8"));
  /* A metadata key (srv_check_name, not printable-only): the same. */
  dev_status st2 = DEV_STATUS_INIT;
  assert_int_equal(
      srv_check_name(&limits, "k\xFE", false, "a metadata key", &st2),
      PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st2.msg, "byte 1 (0xFE) is not UTF-8"));
  assert_int_equal(
      srv_check_name(&limits, "schritt_ü", false, "a metadata key", &st2),
      PD_OK);
}

static void test_text_check(void **state) {
  (void)state;
  const char *why = NULL;
  assert_int_equal(srv_log_text_check("abc", false, &why), -1);
  assert_int_equal(srv_log_text_check("a\tb", true, &why), -1);
  assert_int_equal(srv_log_text_check("a\tb", false, &why), 1);
  assert_string_equal(why, "is a control character");
  assert_int_equal(srv_log_text_check("\xF5\x80\x80\x80", true, &why), 0);
  assert_string_equal(why, "is not UTF-8");
}

/* What escapes a name that CreateSession passed: nothing, in any output. */
static void test_clean_names_pass_unchanged(void **state) {
  (void)state;
  const char *names[] = {"unié中", "\xF0\x9F\x98\x80", "a b", "x"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char q[SRV_LOG_QUOTED(64)], u[256], p[SRV_LOG_QUOTED(64)];
    assert_string_equal(srv_log_quote(names[i], q, sizeof q), names[i]);
    assert_string_equal(srv_log_utf8(names[i], u, sizeof u), names[i]);
    assert_string_equal(srv_log_printable(names[i], p, sizeof p), names[i]);
  }
}

/* --- the budget ------------------------------------------------------------------ */

static void test_budget(void **state) {
  (void)state;
  /* An ExecuteRequest of 1000 empty operations: 2000 bytes that unpack to
   * 1000 Operation structs (each well over 2 bytes). */
  static uint8_t req[2000];
  for (size_t i = 0; i < sizeof req; i += 2) {
    req[i] = 0x12; /* field 2, wire type 2 */
    req[i + 1] = 0x00;
  }
  srv_budget b;
  srv_budget_init(&b, 4096);
  dev_status st = DEV_STATUS_INIT;
  ProtobufCMessage *m = srv_unpack_bytes(
      &paradev__v1__execute_request__descriptor, req, sizeof req, &b, &st);
  assert_null(m);
  assert_int_equal(st.code, PD_RESOURCE_EXHAUSTED);
  assert_non_null(
      strstr(st.msg, "needs more than its decoding budget of 4096"));
  assert_int_equal(b.left, 4096);
  /* With the budget a call gets (16x plus 1 MiB) it decodes. */
  srv_budget_init(&b, srv_budget_bytes(sizeof req));
  assert_int_equal(srv_budget_bytes(sizeof req), 16 * 2000 + (1 << 20));
  size_t given = b.left;
  m = srv_unpack_bytes(&paradev__v1__execute_request__descriptor, req,
                       sizeof req, &b, &st);
  assert_non_null(m);
  assert_int_equal(((Paradev__V1__ExecuteRequest *)m)->n_ops, 1000);
  protobuf_c_message_free_unpacked(m, &b.alloc);
  assert_int_equal(b.left, given);
  /* Far beyond: the extra is capped at 256 MiB. */
  assert_int_equal(srv_budget_bytes((size_t)1 << 30),
                   ((size_t)1 << 30) + ((size_t)256 << 20) + (1 << 20));
}

/* Issue #17: the one check of every `devices` field (convert.c
 * srv_devset_from_pb) against a mesh of 4 (limits.num_devices): empty is
 * NULL (the session's default); a set keeps its order; an index off the
 * mesh, one given twice and more entries than the mesh has are
 * INVALID_ARGUMENT naming the field and the entry. */
static void test_devices_field(void **state) {
  (void)state;
  dev_devset room;
  const dev_devset *set = &room;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(
      srv_devset_from_pb(&limits, NULL, 0, "F.devices", &room, &set, &st),
      PD_OK);
  assert_null(set);
  const int32_t ok[] = {3, 1};
  assert_int_equal(
      srv_devset_from_pb(&limits, ok, 2, "F.devices", &room, &set, &st), PD_OK);
  assert_ptr_equal(set, &room);
  assert_int_equal(room.n, 2);
  assert_int_equal(room.dev[0], 3);
  assert_int_equal(room.dev[1], 1);
  int32_t out[PD_MAX_DEVICES];
  assert_int_equal(srv_devset_to_pb(&room, out), 2);
  assert_int_equal(out[0], 3);
  assert_int_equal(out[1], 1);
  static const struct {
    int32_t d[6];
    size_t n;
    const char *msg;
  } bad[] = {
      {{1, 7}, 2, "UploadHeader.devices[1] = 7: the mesh has devices 0..3"},
      {{-1}, 1, "UploadHeader.devices[0] = -1: the mesh has devices 0..3"},
      {{2, 0, 2},
       3,
       "UploadHeader.devices[2] = 2: device 2 is listed at [0] already; "
       "each device may appear once"},
      {{0, 1, 2, 3, 0},
       5,
       "UploadHeader.devices lists 5 devices: the mesh has 4 (devices "
       "0..3), each listed at most once"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    st = (dev_status)DEV_STATUS_INIT;
    assert_int_equal(
        srv_devset_from_pb(&limits, bad[i].d, bad[i].n, "UploadHeader.devices",
                           &room, &set, &st),
        PD_INVALID_ARGUMENT);
    assert_null(set);
    assert_string_equal(st.msg, bad[i].msg);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nul_in_every_string_field),
      cmocka_unit_test(test_label_utf8),
      cmocka_unit_test(test_string_utf8),
      cmocka_unit_test(test_text_check),
      cmocka_unit_test(test_clean_names_pass_unchanged),
      cmocka_unit_test(test_budget),
      cmocka_unit_test(test_devices_field),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
