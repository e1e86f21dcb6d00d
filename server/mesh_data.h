/* The mesh's data plane (issue #16), private to server/mesh_fwd*.c and
 * server/mesh_apply*.c: the coordinator's state (mesh_fwd.c: the hooks that
 * send; mesh_fwd_wait.c: progress, remote waits, reads and loss, which
 * mesh_fwd.c calls) and a rank's (mesh_apply.c: the tensor table and the
 * commands; mesh_apply_progress.c: local_done, the progress sender and the
 * read worker, which mesh_apply.c calls). The public side is mesh.h. */
#ifndef PARADEV_SERVER_MESH_DATA_H
#define PARADEV_SERVER_MESH_DATA_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "mesh.h"

/* --- the coordinator ------------------------------------------------------ */

/* Writes and reads move at most this many bytes per message. */
#define FWD_CHUNK ((size_t)4 << 20)
#define FWD_WHY_MAX 256
/* Read requests a component_read keeps on its stack before it allocates. */
#define FWD_READS_INLINE 8
/* Releases wait at most this long to be sent with others, and are sent at
 * once when this many gathered for a rank. */
#define FWD_RELEASE_DELAY_NS 200000
#define FWD_RELEASE_BATCH 1024

typedef struct fwd_fail {
  uint64_t seq;
  pd_code code;
  char *msg;
} fwd_fail;

typedef struct fwd_dev {
  uint64_t done_seq;
  fwd_fail *fails; /* ascending seq */
  size_t nfails, capfails;
  pthread_cond_t cv;
  bool waiting;
} fwd_dev;

typedef struct fwd_rank {
  bool lost;
  uint64_t fail_upto; /* waits up to this seq fail with `why` */
  uint64_t losses;    /* times lost: a read sent before a loss never ends */
  uint64_t inc;
  char why[FWD_WHY_MAX];
} fwd_rank;

/* One outstanding MeshRead, on the reader's stack. */
typedef struct fwd_read {
  struct fwd_read *next;
  uint64_t request;
  uint8_t *dst;
  size_t len;
  bool done, busy; /* busy: a result is being copied into dst */
  pd_code code;
  char msg[DEV_STATUS_MSG_MAX];
} fwd_read;

typedef struct fwd {
  srv_mesh *m;
  int world, per_rank, ndev;
  pthread_mutex_t mu;
  pthread_cond_t read_cv;
  fwd_dev *dev;   /* [ndev] */
  fwd_rank *rank; /* [world] */
  fwd_read *reads;
  uint64_t next_request;
  _Atomic uint64_t last_seq; /* the last op forwarded (or being) */
  /* op_submitted's buffer: only the submit lock's holder touches it. */
  uint8_t *opbuf;
  size_t opcap;
  uint64_t pack_min_ns; /* the cheapest op's packing (the submit lock's) */
  _Atomic uint64_t ops, op_ns, pack_ns, op_bytes;
  /* Releases waiting for the flusher, per rank (see fwd_tensor_released). */
  pthread_mutex_t rel_mu;
  pthread_cond_t rel_cv;
  uint64_t **rel;
  size_t *nrel, *caprel;
  bool rel_pending, rel_stop;
  pthread_t rel_thread;
  _Atomic uint64_t releases, release_msgs;
} fwd;

static inline fwd *fwd_of(void *arg) { return srv_mesh_data((srv_mesh *)arg); }

/* mesh_fwd_wait.c. A send the control plane refused: every op up to `seq`
 * on the rank's devices fails (UNAVAILABLE, its `why`). */
void srv_mfwd_refused(fwd *f, int rank, uint64_t seq);
/* UNAVAILABLE with the rank's `why` (or a plain one) into `st`. */
pd_code srv_mfwd_rank_error(fwd *f, int rank, dev_status *st);
/* The component_read and remote_wait hooks (dev_mesh.h). */
pd_code srv_mfwd_component_read(void *arg, const dev_tensor *t, int component,
                                uint64_t offset, void *data, size_t len,
                                dev_status *st);
pd_code srv_mfwd_remote_wait(void *arg, int device, uint64_t seq,
                             dev_status *st);

/* --- a rank ------------------------------------------------------------------- */

#define AP_ARENA_BYTES (64u << 10)

typedef struct ap_slot {
  uint64_t id;   /* 0: empty */
  dev_tensor *t; /* NULL: failed here, with code and msg */
  pd_code code;
  char *msg;
} ap_slot;

typedef struct ap_fail {
  uint64_t seq, after;
  pd_code code;
  char *msg;
} ap_fail;

typedef struct ap_fails {
  ap_fail *v;
  size_t n, cap;
} ap_fails;

typedef struct ap_dev {
  uint64_t engine_done; /* the last seq local_done reported */
  uint64_t last_sub;    /* the last seq submitted to it (apply thread) */
  uint64_t report;      /* the done_seq to send */
  bool dirty;
  ap_fails out;      /* failures to send */
  ap_fails deferred; /* refused ops waiting for `after` */
} ap_dev;

typedef struct ap_read {
  struct ap_read *next;
  uint64_t request, gen, offset, length;
  int component;
  dev_tensor *t; /* NULL: answer code / msg */
  pd_code code;
  char msg[DEV_STATUS_MSG_MAX];
} ap_read;

/* protobuf-c's allocator for unpacking one command: a bump arena, big
 * blocks malloc'd and freed at the reset. */
typedef struct ap_arena {
  uint8_t buf[AP_ARENA_BYTES];
  size_t used;
  void **big;
  size_t nbig, capbig;
} ap_arena;

typedef struct apply {
  srv_mesh *m;
  int first, count; /* local devices */
  pthread_mutex_t mu;
  ap_slot *slots;
  size_t cap, used, ntensors;
  unsigned logged;

  pthread_mutex_t pmu;
  pthread_cond_t pcv;
  ap_dev *dev;
  bool stop, idle;
  uint64_t last_send_ns;
  pthread_t sender;

  pthread_mutex_t rmu;
  pthread_cond_t rcv;
  ap_read *rhead, *rtail;
  uint64_t gen;
  bool rstop;
  bool reading; /* the worker holds a tensor (drop_all waits for it) */
  pthread_t reader;

  ap_arena arena;                            /* the receive thread's */
  uint64_t ops, unpack_ns, op_ns, op_min_ns; /* the receive thread's */
} apply;

static inline uint64_t ap_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* mesh_apply_progress.c. The local_done hook (dev_mesh.h). It ignores calls
 * made while srv_mapp_in_submit is set (the apply thread's, around
 * dev_op_submit_seq: a refusal the data plane reports itself). */
extern _Thread_local bool srv_mapp_in_submit;
void srv_mapp_local_done(void *arg, int device, uint64_t seq, pd_code code,
                         const char *msg);
/* Op `seq`, which never reached the engine, failed with `st` on each local
 * device of `set`: reported once the device finished what was submitted
 * to it before (mesh_apply.c's header comment). Apply thread only. */
void srv_mapp_defer(apply *a, const dev_devset *set, uint64_t seq,
                    const dev_status *st);
/* Frees the messages of `f` and empties it (its array stays). */
void srv_mapp_fails_clear(ap_fails *f);
/* The progress sender's and the read worker's thread functions (arg: the
 * apply state); they end when a->stop / a->rstop is set and signalled. */
void *srv_mapp_sender_main(void *arg);
void *srv_mapp_reader_main(void *arg);

#endif /* PARADEV_SERVER_MESH_DATA_H */
