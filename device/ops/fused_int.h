/* The fused ops the fusion pass makes (device/fn/passes_fusion.c) and their
 * kernels (device/ops/fused.c on the CPU, device/cuda/kernels_fused.cu and
 * fused_matmul.c on CUDA): what both sides must agree on. Private to device/.
 *
 * _FusedMatMul (TensorFlow's _FusedMatMul, one bias and one activation):
 *   inputs  a [M,K] (or [K,M] with transpose_a), b [K,N] (or [N,K] with
 *           transpose_b), bias [N]; one floating dtype
 *   attrs   transpose_a, transpose_b (bool, default false),
 *           activation (string: "none", "relu", "relu6", "sigmoid", "tanh";
 *           default "none")
 *   output  activation(a @ b + bias) [M,N]
 *   CPU: one sgemm/dgemm into the output, then one pass adding the bias and
 *   applying the activation; CUDA: cuBLASLt with the epilogue
 *   (CUBLASLT_EPILOGUE_BIAS, _RELU_BIAS; the others as BIAS and one
 *   elementwise pass).
 *
 * _FusedElementwise (a chain of element-wise ops evaluated per element):
 *   inputs  x: a list of 1..16 tensors of one dtype, NumPy-broadcast
 *           against each other
 *   attrs   program (list(int)): 3 ints per instruction, opcode, operand a,
 *           operand b (DEV_EW_NONE for a unary opcode); an operand is an
 *           input (0..n_inputs-1), the result of an earlier instruction j
 *           (DEV_EW_TEMP_BASE + j) or the float constant c of `constants`
 *           (DEV_EW_CONST_BASE + c); the last instruction's result is the
 *           output. At most DEV_ATTR_LIST_MAX / 3 = 21 instructions.
 *           constants (list(float), default empty)
 *   output  the broadcast shape of the inputs, their dtype
 *   Float dtypes (16-bit ones through float32). CUDA: one launch that
 *   interprets the program per element.
 */
#ifndef PARADEV_FUSED_INT_H
#define PARADEV_FUSED_INT_H

#ifdef __cplusplus /* the CUDA kernels (kernels_fused.cu) read the opcodes */
#include "../dev_backend.h"
extern "C" {
#else
#include "../device_int.h"
#endif

#define DEV_FUSED_MATMUL_OP "_FusedMatMul"
#define DEV_FUSED_ELEMENTWISE_OP "_FusedElementwise"

#define DEV_EW_MAX_INPUTS 16
#define DEV_EW_MAX_INSTR (DEV_ATTR_LIST_MAX / 3)
#define DEV_EW_NONE (-1)
#define DEV_EW_TEMP_BASE 100
#define DEV_EW_CONST_BASE 1000

/* Opcodes: the element-wise ops the pass may fuse, each the same function
 * as the registered op of that name (binary ops: a op b; the *Grad ops take
 * their operands in TensorFlow's order: ReluGrad(dy, x), TanhGrad(y, dy),
 * SigmoidGrad(y, dy), SqrtGrad(y, dy), RsqrtGrad(y, dy)). */
typedef enum dev_ew_opcode {
  DEV_EW_ADD = 1,
  DEV_EW_SUB = 2,
  DEV_EW_MUL = 3,
  DEV_EW_DIV = 4,
  DEV_EW_MAXIMUM = 5,
  DEV_EW_MINIMUM = 6,
  DEV_EW_POW = 7,
  DEV_EW_RELU_GRAD = 8,
  DEV_EW_TANH_GRAD = 9,
  DEV_EW_SIGMOID_GRAD = 10,
  DEV_EW_SQRT_GRAD = 11,
  DEV_EW_RSQRT_GRAD = 12,
  DEV_EW_NEG = 32,
  DEV_EW_EXP = 33,
  DEV_EW_LOG = 34,
  DEV_EW_SQRT = 35,
  DEV_EW_RSQRT = 36,
  DEV_EW_SQUARE = 37,
  DEV_EW_TANH = 38,
  DEV_EW_SIGMOID = 39,
  DEV_EW_RELU = 40,
  DEV_EW_ABS = 41,
  DEV_EW_IDENTITY = 42,
} dev_ew_opcode;

/* The opcode of registered op `name`, or 0 when it cannot be fused. */
int dev_ew_opcode_for(const char *op_name);
/* 1 or 2 for a valid opcode, 0 otherwise. */
int dev_ew_arity(int opcode);
/* The op's name ("Add", ...) or NULL. */
const char *dev_ew_opcode_name(int opcode);

/* Checks a program (ops/fused_program.c): n_ints a multiple of 3, 1 to
 * DEV_EW_MAX_INSTR instructions, valid opcodes, operands of binary opcodes
 * and operand a of unary ones an input (< n_inputs), an earlier result or a
 * constant (< n_consts), operand b of unary ones DEV_EW_NONE.
 * INVALID_ARGUMENT naming `op`, the instruction and what was expected. */
pd_code dev__ew_program_check(const char *op, const int64_t *prog, int n_ints,
                              int n_inputs, int n_consts, dev_status *st);

/* _FusedMatMul's attributes, in their order, and its activations. */
enum {
  DEV_FMM_TRANSPOSE_A = 0,
  DEV_FMM_TRANSPOSE_B = 1,
  DEV_FMM_ACTIVATION = 2
};
typedef enum dev_fused_act {
  DEV_ACT_NONE = 0,
  DEV_ACT_RELU = 1,    /* x < 0 ? 0 : x (NaN stays NaN, as Relu) */
  DEV_ACT_RELU6 = 2,   /* x < 0 ? 0 : x > 6 ? 6 : x (NaN stays NaN) */
  DEV_ACT_SIGMOID = 3, /* Sigmoid's formula */
  DEV_ACT_TANH = 4,
} dev_fused_act;
/* The activation named by s[0..len) ("none", "relu", ...), -1 if none. */
int dev_fused_activation(const char *s, size_t len);
/* _FusedElementwise's attributes, in their order. */
enum { DEV_FEW_PROGRAM = 0, DEV_FEW_CONSTANTS = 1 };

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_FUSED_INT_H */
