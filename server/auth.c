/* Who is calling (auth.h). Today: no identities yet; a call on the admin
 * socket is an operator's (the socket's mode and group decide who reaches
 * it). Issue #14 adds certificates, tokens, Unix peers and tenants here. */
#include "auth.h"

#include <stdlib.h>

pd_code srv_call_identity(srv_call *c, const srv_identity **out,
                          dev_status *st) {
  if (!c->identity) {
    c->identity = calloc(1, sizeof(*c->identity));
    if (!c->identity)
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    c->identity->kind = SRV_IDENTITY_NONE;
    c->identity->is_operator =
        c->s->admin_server && c->gs == c->s->admin_server;
  }
  *out = c->identity;
  return PD_OK;
}
