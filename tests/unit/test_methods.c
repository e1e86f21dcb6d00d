/* The wire's one list of methods (proto/paradev/v1/methods.h) against the
 * .proto files and the daemon's method table, in both directions:
 *
 *  - every method of protobuf-c's service descriptors (ParallelDevice,
 *    Admin, grpc.health.v1.Health, Mesh) is listed, with its input and output
 *    message types, and its streaming kind as the .proto's `stream` keywords
 *    say (protobuf-c's descriptors carry no streaming flags, so the test
 *    reads the .proto files themselves);
 *  - every listed method exists in its service;
 *  - the daemon's table (server/methods.c) serves every listed method with
 *    that path, kind and request type, with the handler its kind needs, and
 *    serves nothing else.
 *
 * So a method added to a .proto and forgotten in methods.h or the daemon
 * fails here (and one listed but given no handlers fails to link paradevd). */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "grpc/health/v1/health.pb-c.h"
#include "paradev/v1/admin.pb-c.h"
#include "paradev/v1/mesh.pb-c.h"
#include "paradev/v1/methods.h"
#include "paradev/v1/paradev.pb-c.h"
#include "server.h"

typedef struct listed {
  const char *service, *method, *path;
  srv_kind kind;
  const ProtobufCMessageDescriptor *request, *response;
} listed;

#define UNARY_K SRV_UNARY
#define CLIENT_STREAM_K SRV_CLIENT_STREAM
#define SERVER_STREAM_K SRV_SERVER_STREAM
#define BIDI_K SRV_BIDI
#define ENTRY(SVC, METHOD, KIND, REQ, RESP)                                    \
  {SVC,                                                                        \
   #METHOD,                                                                    \
   PD_METHOD_PATH(SVC, METHOD),                                                \
   KIND##_K,                                                                   \
   &REQ##__descriptor,                                                         \
   &RESP##__descriptor},
static const listed methods[] = {PD_ALL_METHODS(ENTRY)};
#undef ENTRY
#define N_LISTED (sizeof(methods) / sizeof(methods[0]))

typedef struct service {
  const ProtobufCServiceDescriptor *desc;
  const char *proto; /* the .proto file that declares it */
} service;

static const service services[] = {
    {&paradev__v1__parallel_device__descriptor, PD_TEST_PARADEV_PROTO},
    {&paradev__v1__admin__descriptor, PD_TEST_ADMIN_PROTO},
    {&grpc__health__v1__health__descriptor, PD_TEST_HEALTH_PROTO},
    {&paradev__v1__mesh__descriptor, PD_TEST_MESH_PROTO},
};
#define N_SERVICES (sizeof(services) / sizeof(services[0]))

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static const char *skip_space(const char *p) {
  while (*p && isspace((unsigned char)*p)) p++;
  return p;
}

/* True when the parenthesised type at *pp starts with `stream`; moves past
 * the closing parenthesis. */
static bool paren_streams(const char **pp) {
  const char *p = skip_space(*pp);
  assert_int_equal(*p, '(');
  p = skip_space(p + 1);
  bool stream = strncmp(p, "stream", 6) == 0 && isspace((unsigned char)p[6]);
  const char *close = strchr(p, ')');
  assert_non_null(close);
  *pp = close + 1;
  return stream;
}

/* The kind of `rpc METHOD(...) returns (...)` in a .proto's text. */
static srv_kind proto_kind(const char *text, const char *method) {
  char pat[160];
  snprintf(pat, sizeof(pat), "rpc %s", method);
  const char *p = text;
  while ((p = strstr(p, pat)) != NULL) {
    const char *q = skip_space(p + strlen(pat));
    if (*q == '(') break;
    p += strlen(pat);
  }
  if (!p) fail_msg("rpc %s not found in its .proto", method);
  p += strlen(pat);
  bool in = paren_streams(&p);
  p = skip_space(p);
  assert_true(strncmp(p, "returns", 7) == 0);
  p += 7;
  bool out = paren_streams(&p);
  return in && out ? SRV_BIDI
         : in      ? SRV_CLIENT_STREAM
         : out     ? SRV_SERVER_STREAM
                   : SRV_UNARY;
}

static const listed *find_listed(const char *svc, const char *method) {
  for (size_t i = 0; i < N_LISTED; i++)
    if (strcmp(methods[i].service, svc) == 0 &&
        strcmp(methods[i].method, method) == 0)
      return &methods[i];
  return NULL;
}

/* Every method of every service descriptor is listed, rightly. */
static void test_descriptors_are_listed(void **state) {
  (void)state;
  size_t total = 0;
  for (size_t k = 0; k < N_SERVICES; k++) {
    const ProtobufCServiceDescriptor *d = services[k].desc;
    char *text = read_file(services[k].proto);
    for (unsigned i = 0; i < d->n_methods; i++) {
      const ProtobufCMethodDescriptor *md = &d->methods[i];
      const listed *l = find_listed(d->name, md->name);
      if (!l)
        fail_msg("%s/%s is in the proto but not in methods.h", d->name,
                 md->name);
      if (l->request != md->input || l->response != md->output)
        fail_msg("%s/%s: methods.h says %s -> %s; the proto says %s -> %s",
                 d->name, md->name, l->request->name, l->response->name,
                 md->input->name, md->output->name);
      srv_kind want = proto_kind(text, md->name);
      if (l->kind != want)
        fail_msg(
            "%s/%s: methods.h says kind %d; the proto's stream keywords say %d",
            d->name, md->name, (int)l->kind, (int)want);
      total++;
    }
    free(text);
  }
  assert_int_equal(total, N_LISTED);
}

/* Every listed method exists in its service. */
static void test_listed_exist(void **state) {
  (void)state;
  for (size_t i = 0; i < N_LISTED; i++) {
    const ProtobufCServiceDescriptor *d = NULL;
    for (size_t k = 0; k < N_SERVICES; k++)
      if (strcmp(services[k].desc->name, methods[i].service) == 0)
        d = services[k].desc;
    if (!d)
      fail_msg("methods.h lists service %s, which no proto declares",
               methods[i].service);
    if (!protobuf_c_service_descriptor_get_method_by_name(d, methods[i].method))
      fail_msg("methods.h lists %s, which %s does not declare", methods[i].path,
               d->name);
    char want[256];
    snprintf(want, sizeof(want), "/%s/%s", d->name, methods[i].method);
    assert_string_equal(methods[i].path, want);
  }
}

/* The daemon serves every listed method as listed, and nothing else. */
static void test_daemon_serves_every_method(void **state) {
  (void)state;
  for (size_t i = 0; i < N_LISTED; i++) {
    const srv_method *m = srv_method_find(methods[i].path);
    if (!m) fail_msg("paradevd does not serve %s", methods[i].path);
    assert_string_equal(m->path, methods[i].path);
    assert_int_equal(m->kind, methods[i].kind);
    assert_ptr_equal(m->request, methods[i].request);
    assert_ptr_equal(m->response, methods[i].response);
    assert_non_null(m->h);
    bool unary_like = m->kind == SRV_UNARY || m->kind == SRV_SERVER_STREAM;
    if (unary_like && !m->h->on_request)
      fail_msg("%s has no on_request", m->path);
    if (!unary_like && !m->h->on_message)
      fail_msg("%s has no on_message", m->path);
    /* Admin only on the admin socket, the rest on the listen addresses. */
    bool admin = strcmp(methods[i].service, PD_SVC_ADMIN) == 0;
    bool mesh = strcmp(methods[i].service, PD_SVC_MESH) == 0;
    srv_method *const *table = admin  ? srv_admin_methods
                               : mesh ? srv_mesh_methods
                                      : srv_methods;
    bool found = false;
    for (size_t j = 0; table[j]; j++) found |= table[j] == m;
    if (!found) fail_msg("%s is served on the wrong server", m->path);
  }
  size_t n = 0;
  for (size_t j = 0; srv_methods[j]; j++) n++;
  for (size_t j = 0; srv_admin_methods[j]; j++) n++;
  for (size_t j = 0; srv_mesh_methods[j]; j++) n++;
  assert_int_equal(n, N_LISTED);
  assert_null(srv_method_find("/paradev.v1.ParallelDevice/NoSuchMethod"));
}

/* The .proto reader itself, on text whose answers are known. */
static void test_proto_kind_reader(void **state) {
  (void)state;
  const char *text =
      "service S {\n"
      "  rpc A(Req) returns (Resp);\n"
      "  rpc AB(stream Req) returns (Resp);\n"
      "  rpc C (Req) returns (stream Resp) {}\n"
      "  rpc D( stream Req ) returns ( stream Resp );\n"
      "  rpc E(streamer.Req) returns (Resp);\n"
      "}\n";
  assert_int_equal(proto_kind(text, "A"), SRV_UNARY);
  assert_int_equal(proto_kind(text, "AB"), SRV_CLIENT_STREAM);
  assert_int_equal(proto_kind(text, "C"), SRV_SERVER_STREAM);
  assert_int_equal(proto_kind(text, "D"), SRV_BIDI);
  assert_int_equal(proto_kind(text, "E"), SRV_UNARY);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_proto_kind_reader),
      cmocka_unit_test(test_descriptors_are_listed),
      cmocka_unit_test(test_listed_exist),
      cmocka_unit_test(test_daemon_serves_every_method),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
