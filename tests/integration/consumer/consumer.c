/* A program outside the paradev tree that links libparadev as an installed
 * package (pkg-config or find_package) and uses it: prints the version and
 * checks the error a missing daemon gives. Exit 0 when all is as expected. */
#include <paradev/paradev.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  pd_status *st = pd_status_new();
  pd_client *c = pd_client_new("unix:/nonexistent/paradevd.sock", NULL, st);
  if (!c) {
    fprintf(stderr, "pd_client_new: %s\n", pd_status_message(st));
    return 1;
  }
  pd_call_options call = PD_CALL_OPTIONS_INITIALIZER;
  call.timeout_ms = 5000;
  pd_code rc = pd_client_echo(c, "hi", 2, NULL, 0, NULL, &call, st);
  int ok = rc == PD_UNAVAILABLE &&
           strstr(pd_status_message(st), "cannot reach") != NULL &&
           strcmp(pd_dtype_name(PD_BFLOAT16), "bfloat16") == 0;
  printf("libparadev %s: %s: %s\n", pd_version(), pd_code_name(rc),
         pd_status_message(st));
  pd_client_delete(c);
  pd_status_delete(st);
  return ok ? 0 : 1;
}
