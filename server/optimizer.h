/* Optimizer plugins (issue #11): shared objects listed in [functions]
 * optimizer_plugins, loaded at start through include/paradev/optimizer.h's
 * entry point, and handed to the engine as external passes
 * (dev_fn_external_pass) that run after the built-in ones on every
 * instantiation of a graph function. The plugins' configs are merged into
 * the passes the daemon runs ("off" wins, as TensorFlow merges Grappler
 * plugin configs) and the table of who asked what is logged.
 *
 * Thread safety: srv_optimizer_load and srv_optimizer_unload run once, at
 * start and stop, on the main thread; the passes they return may run on
 * any thread (the engine instantiates on the calling thread). */
#ifndef PARADEV_SERVER_OPTIMIZER_H
#define PARADEV_SERVER_OPTIMIZER_H

#include "device.h"

/* Loads paths[0..n) in order. A plugin that cannot be loaded or is refused
 * (no entry point, a struct_size smaller than the daemon knows, another
 * major version, a missing optimize function, an error from its entry
 * point) is an error naming the file and the reason (both sizes or
 * versions): the daemon does not start with a plugin it was told to load.
 * A file listed twice (the same path or the same realpath) is refused
 * before anything is loaded, naming both occurrences. --check-config loads
 * and unloads the list the same way (daemon.c srv_functions_check).
 * On success *passes / *n_passes receive the external passes (in the order
 * of the list; owned by the loader until srv_optimizer_unload) and
 * merged[DEV_PASS_COUNT] the built-in passes' switches merged from the
 * daemon's own (`daemon_passes`) and every plugin's config: OFF where any
 * says OFF, else ON where any says ON, else DEFAULT.
 * Errors: FAILED_PRECONDITION (a plugin refused, as above),
 * RESOURCE_EXHAUSTED. */
pd_code srv_optimizer_load(const char *const *paths, int n,
                           const dev_tristate *daemon_passes,
                           const dev_fn_external_pass *const **passes,
                           int *n_passes, dev_tristate *merged,
                           dev_status *st);

/* Calls each plugin's destroy and unloads it. Accepts being called when
 * nothing was loaded. After dev_engine_destroy / every library is gone. */
void srv_optimizer_unload(void);

#endif /* PARADEV_SERVER_OPTIMIZER_H */
