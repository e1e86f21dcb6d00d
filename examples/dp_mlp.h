/* A data-parallel multilayer perceptron trained on a paradevd daemon with
 * libparadev: the weights live on the daemon, mirrored (the same on every
 * device); each step's batch is uploaded sharded along its rows; every
 * device runs the forward pass and the loss on its shard under a gradient
 * tape, the gradients are averaged with AllReduce(mean), and every device
 * applies the same update (Adam, or SGD with momentum). Everything after the
 * upload is an item of one Enqueue stream: a step costs no round trip to
 * the daemon beyond the batch's upload.
 *
 * Model: inputs -> hidden (ReLU) -> classes, softmax cross-entropy
 * (SparseSoftmaxCrossEntropyWithLogits). Used by train_digits.c and by the
 * training benchmark (bench/bench_train.c). Links libparadev only. */
#ifndef PARADEV_EXAMPLES_DP_MLP_H
#define PARADEV_EXAMPLES_DP_MLP_H

#include <stdbool.h>
#include <stdint.h>

#include "paradev/paradev.h"

typedef enum dp_mlp_optimizer {
  DP_MLP_ADAM = 0, /* Kingma & Ba, with Keras's epsilon (1e-7) */
  DP_MLP_SGD = 1,  /* SGD with momentum 0.9 (v = 0.9 v + g; w -= lr v) */
} dp_mlp_optimizer;

/* How a step reaches the daemon. */
typedef enum dp_mlp_mode {
  /* Every op of the step is its own item of the Enqueue stream (about 60
   * for Adam), with a gradient tape for the backward pass. */
  DP_MLP_EAGER = 0,
  /* The whole step -- forward, loss, Gradients, AllReduce(mean) of the
   * gradients, the update -- is one graph function registered at
   * dp_mlp_new and called once per step (one stream item); the weights and
   * the optimizer's state are handles the call replaces, and the
   * step-dependent scalars (the loss scale, Adam's bias-corrected rate) its
   * inputs. The batch goes up as one tensor (labels as a float column,
   * split off inside): one upload per step instead of two. The values are
   * eager mode's; the gradients' AllReduce is one collective over them
   * joined. */
  DP_MLP_FUNCTION = 1,
} dp_mlp_mode;

typedef struct dp_mlp_config {
  int inputs;  /* features per row */
  int hidden;  /* units of the hidden layer */
  int classes; /* labels are 0..classes-1 */
  dp_mlp_optimizer optimizer;
  double lr;        /* learning rate */
  uint64_t seed;    /* of the weights' random initialisation */
  dp_mlp_mode mode; /* zero: eager */
} dp_mlp_config;

typedef struct dp_mlp dp_mlp;

/* Creates the model on session `s`: opens an Enqueue stream and queues the
 * weights' initialisation (He-normal from seeded RandomNormal with
 * per_device=false, so every device draws the same values; zero biases) and
 * the optimizer's state; in DP_MLP_FUNCTION mode registers the step's
 * function (RegisterFunction, named by dp_mlp_function_name). Returns NULL
 * with `st` set on failure (a refused registration: the daemon's message,
 * naming the node). */
dp_mlp *dp_mlp_new(pd_session *s, const dp_mlp_config *cfg, pd_status *st);

/* Queues one training step on `rows` rows (x: rows*inputs floats, y: rows
 * labels), uploaded sharded over the mesh: rows/n per device, the first
 * rows%n devices one more (a device may get none). Returns once the batch is
 * uploaded and the step's items are queued; errors of the items show in
 * dp_mlp_epoch_end. The loss and correct predictions accumulate on the
 * devices. */
pd_code dp_mlp_step(dp_mlp *m, const float *x, const int32_t *y, int rows,
                    pd_status *st);

/* Waits for every step queued so far and returns, over them, the summed
 * per-example loss and the number of correct predictions (with the weights
 * of the step that saw each example); then resets both. */
pd_code dp_mlp_epoch_end(dp_mlp *m, double *loss_sum, double *correct,
                         pd_status *st);

/* Number of correct predictions of the current weights on `rows` rows
 * (sharded over the mesh like a batch). Waits. */
pd_code dp_mlp_evaluate(dp_mlp *m, const float *x, const int32_t *y, int rows,
                        double *correct, pd_status *st);

/* Downloads every component of every weight and compares them bit for bit;
 * *identical tells whether all devices hold the same weights. *bytes gets
 * the bytes of one replica of the weights. */
pd_code dp_mlp_check_replicas(dp_mlp *m, bool *identical, uint64_t *bytes,
                              pd_status *st);

/* Names of the weights in a checkpoint, in the model's order (the
 * hidden layer's kernel [inputs, hidden] and bias [hidden], the output
 * layer's kernel [hidden, classes] and bias [classes]). */
extern const char *const dp_mlp_weight_names[4];

/* Waits for every step queued so far, then has the daemon write the weights
 * (one replica: they are mirrored) as a safetensors file at `path` beneath
 * one of its storage roots (SaveTensors), with the model's sizes in its
 * metadata. Replaces an existing file only when `overwrite`. *bytes (may be
 * NULL) gets the tensor bytes written. Errors: pd_save_tensors'. */
pd_code dp_mlp_save(dp_mlp *m, const char *path, bool overwrite,
                    uint64_t *bytes, pd_status *st);

/* Replaces the model's weights with those of the checkpoint `path` (as
 * dp_mlp_save writes it), loaded by the daemon mirrored on every device
 * (LoadTensors); the optimizer's state is left as it is. INVALID_ARGUMENT
 * when a weight's dtype or shape differs from the model's (naming it), and
 * pd_load_tensors' errors; the old weights stay on failure. */
pd_code dp_mlp_load(dp_mlp *m, const char *path, pd_status *st);

/* The name of the step's function in the session ("" in eager mode). */
const char *dp_mlp_function_name(const dp_mlp *m);

/* Steps queued so far. */
long dp_mlp_steps(const dp_mlp *m);

/* Closes the stream and deletes the model's handles (best effort); frees
 * `m`. NULL is a no-op. */
void dp_mlp_delete(dp_mlp *m);

#endif /* PARADEV_EXAMPLES_DP_MLP_H */
