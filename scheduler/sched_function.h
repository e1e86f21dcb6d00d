/* Graph functions in sessions (issue #11): part of scheduler.h's interface,
 * which includes this file at its end (include scheduler.h, not this).
 * scheduler/functions.c implements it. */
#ifndef PARADEV_SCHED_FUNCTION_H
#define PARADEV_SCHED_FUNCTION_H

#ifndef PARADEV_SCHEDULER_H
#error "include scheduler.h, which includes sched_function.h"
#endif

/* --- Graph functions (issue #11) ---------------------------------------- */

/* Registers `def` (borrowed for the call; the engine copies it) with `opts`
 * (NULL: defaults) in the session's function library, created with
 * sched_config.functions at the session's first registration and freed
 * when the session ends (any end: close, expiry, kill, stop). A call is
 * then an ordinary op of sched_execute whose op_name is the function's.
 * Errors: dev_fn_register's (INVALID_ARGUMENT naming the node,
 * ALREADY_EXISTS for another body under the name -- an identical one sets
 * *existed --, RESOURCE_EXHAUSTED at DEV_FN_MAX_PER_LIB functions),
 * NOT_FOUND (the session ended). Functions count toward no other limit.
 * Thread-safe. Source: TensorFlow's FunctionLibraryDefinition::AddFunctionDef. */
pd_code sched_register_function(sched_session *ss, const dev_fn_def *def,
                                const dev_fn_options *opts, bool *existed,
                                dev_status *st);

/* dev_fn_describe of the session's function `name` (out->struct_size set by
 * the caller; on success it frees out->def and out->optimized with
 * dev_fn_def_free). Errors: NOT_FOUND (no such function in the session, or
 * the session ended), RESOURCE_EXHAUSTED. Thread-safe. */
pd_code sched_describe_function(sched_session *ss, const char *name,
                                dev_fn_info *out, dev_status *st);

#endif /* PARADEV_SCHED_FUNCTION_H */
