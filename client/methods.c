/* libparadev: the path of every method it calls, expanded from the one list
 * of the wire's methods (proto/paradev/v1/methods.h), in pdc_method's order.
 * tests/unit/test_methods.c checks that list against the services'
 * descriptors. */
#include "client_int.h"

#define PDC_METHOD_PATH(SERVICE, METHOD, KIND, REQUEST, RESPONSE)              \
  [PDC_M_##METHOD] = PD_METHOD_PATH(SERVICE, METHOD),

const char *const pdc_method_paths[PDC_NUM_METHODS] = {
    PD_PARALLEL_DEVICE_METHODS(PDC_METHOD_PATH)
        PD_HEALTH_METHODS(PDC_METHOD_PATH)};
