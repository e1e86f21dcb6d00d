/* Test optimizer plugins (include/paradev/optimizer.h), one source built
 * once per variant (PD_TEST_PLUGIN, see CMakeLists.txt); each breaks one
 * rule, or asks one thing, for tests/unit/test_srv_optimizer.c and the
 * daemon's integration test:
 *   SMALL_STRUCT   PD_Optimizer.struct_size 8 bytes short
 *   WRONG_MAJOR    claims PD_OPTIMIZER_MAJOR + 1 (and skips its own check)
 *   FAILING        optimize reports INTERNAL "deliberate failure"
 *   GARBAGE        optimize writes bytes that are no FunctionDef
 *   INVALID_GRAPH  optimize adds an input naming a node that does not exist
 *   CSE_OFF        asks cse off, leaves graphs alone
 *   CSE_ON         asks cse on and fusion off, leaves graphs alone
 *   BLOCKING       for functions named "slow*": creates the file
 *                  $PD_TEST_BLOCK_FILE.in, waits until $PD_TEST_BLOCK_FILE
 *                  exists (at most 60 s), then 20 ms
 *                  more; leaves graphs alone (tests/integration/
 *                  test_function_stall.py: a slow instantiation must not
 *                  stall other sessions, and is bounded)
 * Never installed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "paradev/optimizer.h"
#include "paradev/v1/paradev.pb-c.h"

#define V_SMALL_STRUCT 1
#define V_WRONG_MAJOR 2
#define V_FAILING 3
#define V_GARBAGE 4
#define V_INVALID_GRAPH 5
#define V_CSE_OFF 6
#define V_CSE_ON 7
#define V_BLOCKING 8

static int destroyed_marker;

static void *create(void) { return &destroyed_marker; }
static void destroy(void *p) { (void)p; }

static __attribute__((unused)) void write_def(Paradev__V1__FunctionDef *def,
                                              PD_Buffer *out, PD_Status *st) {
  size_t n = paradev__v1__function_def__get_packed_size(def);
  void *b = out->allocate(out, n);
  if (!b)
    PD_SetStatus(st, PD_CODE_RESOURCE_EXHAUSTED, "out of memory");
  else
    paradev__v1__function_def__pack(def, b);
}

static void optimize(void *optimizer, const PD_Buffer *in, PD_Buffer *out,
                     PD_Status *st) {
  if (optimizer != &destroyed_marker) {
    PD_SetStatus(st, PD_CODE_INTERNAL, "create_func's state was not passed");
    return;
  }
#if PD_TEST_PLUGIN == V_FAILING
  (void)in, (void)out;
  static const char msg[] = "deliberate failure (and this tail is cut)";
  st->set(st, PD_CODE_INTERNAL, msg, 18); /* length-delimited */
#elif PD_TEST_PLUGIN == V_GARBAGE
  (void)in, (void)st;
  unsigned char *b = out->allocate(out, 7);
  if (b) memset(b, 0xff, 7);
#elif PD_TEST_PLUGIN == V_INVALID_GRAPH
  Paradev__V1__FunctionDef *def =
      paradev__v1__function_def__unpack(NULL, in->length, in->data);
  Paradev__V1__FunctionNode *nd = NULL;
  for (size_t i = 0; def && i < def->n_nodes && !nd; i++)
    if (def->nodes[i]->n_inputs > 0) nd = def->nodes[i];
  if (!nd) {
    PD_SetStatus(st, PD_CODE_INVALID_ARGUMENT, "no node with inputs to break");
  } else {
    static char dangling[] = "no_such_node";
    char *keep = nd->inputs[0];
    nd->inputs[0] = dangling;
    write_def(def, out, st);
    nd->inputs[0] = keep;
  }
  if (def) paradev__v1__function_def__free_unpacked(def, NULL);
#elif PD_TEST_PLUGIN == V_BLOCKING
  (void)out, (void)st;
  Paradev__V1__FunctionDef *def =
      paradev__v1__function_def__unpack(NULL, in->length, in->data);
  const char *file = getenv("PD_TEST_BLOCK_FILE");
  if (def && def->name && strncmp(def->name, "slow", 4) == 0 && file) {
    char in_file[4096];
    snprintf(in_file, sizeof in_file, "%s.in", file); /* "entered" */
    FILE *f = fopen(in_file, "w");
    if (f) fclose(f);
    struct timespec ms = {0, 1000000}, tail = {0, 20000000};
    for (int i = 0; i < 60000 && access(file, F_OK) != 0; i++)
      nanosleep(&ms, NULL);
    nanosleep(&tail, NULL);
  }
  if (def) paradev__v1__function_def__free_unpacked(def, NULL);
#else
  (void)in, (void)out, (void)st; /* unchanged */

#endif
}

__attribute__((visibility("default"))) void PD_InitOptimizer(
    PD_OptimizerRegistrationParams *p, PD_Status *st) {
#if PD_TEST_PLUGIN != V_WRONG_MAJOR
  if (p->major_version != PD_OPTIMIZER_MAJOR) {
    PD_SetStatus(st, PD_CODE_FAILED_PRECONDITION, "wrong daemon major");
    return;
  }
  p->plugin_major_version = PD_OPTIMIZER_MAJOR;
#else
  (void)st;
  p->plugin_major_version = PD_OPTIMIZER_MAJOR + 1;
#endif
  p->plugin_minor_version = PD_OPTIMIZER_MINOR;
  p->name = PD_TEST_PLUGIN_NAME;
  p->name_length = strlen(p->name);
  p->configs->struct_size = PD_OPTIMIZER_CONFIGS_STRUCT_SIZE;
#if PD_TEST_PLUGIN == V_CSE_OFF
  p->configs->cse = PD_TRI_OFF;
#elif PD_TEST_PLUGIN == V_CSE_ON
  p->configs->cse = PD_TRI_ON;
  p->configs->fusion = PD_TRI_OFF;
#endif
  p->optimizer->struct_size = PD_OPTIMIZER_STRUCT_SIZE;
#if PD_TEST_PLUGIN == V_SMALL_STRUCT
  p->optimizer->struct_size = PD_OPTIMIZER_STRUCT_SIZE - 8;
#endif
  p->optimizer->create_func = create;
  p->optimizer->optimize_func = optimize;
  p->optimizer->destroy_func = destroy;
}
