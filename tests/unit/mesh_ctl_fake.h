/* A test double of the mesh's control plane (server/mesh.h, issue #16) for
 * tests of the data plane without a network: one in-process "world" of W
 * srv_mesh objects, one per rank. srv_mesh_send_command queues the packed
 * bytes for the rank, and a thread per rank hands them, in order and in
 * batches, to that rank's srv_mesh_apply_commands; srv_mesh_send_to_coordinator
 * queues a RankMessage that one thread unpacks and hands to
 * srv_mesh_fwd_on_message on rank 0. The accessors answer from the world.
 * Thread-safe. */
#ifndef PARADEV_TESTS_MESH_CTL_FAKE_H
#define PARADEV_TESTS_MESH_CTL_FAKE_H

#include <stdbool.h>

#include "mesh.h"

typedef struct fake_world fake_world;

/* W ranks of `per_rank` devices; NULL when out of memory. */
fake_world *fake_world_create(int world, int per_rank);
/* Stops the delivery threads (queued bytes are dropped) and frees the
 * world; the data planes and engines must be gone already. */
void fake_world_destroy(fake_world *w);
/* Stops the delivery threads (joined; what is queued stays undelivered):
 * the daemon's srv_mesh_stop, after which no command reaches a rank. */
void fake_world_stop(fake_world *w);
srv_mesh *fake_world_mesh(fake_world *w, int rank);
/* The engine srv_mesh_server(m)->engine gives for `rank`. */
void fake_world_set_engine(fake_world *w, int rank, dev_engine *e);
/* Holds (true) or resumes delivery of the commands queued for `rank`
 * (a stalled rank: the sends still succeed). */
void fake_world_pause(fake_world *w, int rank, bool paused);
/* The rank's stream ended: its queued commands are dropped and further
 * sends to it, and from it, return false. */
void fake_world_detach(fake_world *w, int rank);
/* A new stream of the rank: sends to and from it work again (delivery
 * resumed). */
void fake_world_reattach(fake_world *w, int rank);
/* Waits until nothing is queued or being delivered anywhere (paused ranks
 * excepted), at most `timeout_s`; false when the time passed. */
bool fake_world_quiet(fake_world *w, double timeout_s);
/* Commands sent to `rank` so far. */
unsigned long fake_world_commands(fake_world *w, int rank);

#endif
