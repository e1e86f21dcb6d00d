/* The opcodes of _FusedElementwise (ops/fused_int.h): which registered op
 * each one is, its arity, and the check of a whole program (opcodes,
 * operands in range and earlier, arities, constants) that the op's
 * inference runs and the fusion pass (device/fn/passes_fusion.c) may run
 * before it emits a node. Calls nothing else of device/ops/. */
#include <string.h>

#include "ops/fused_int.h"

typedef struct ew_opinfo {
  int opcode;
  const char *name;
  int arity;
} ew_opinfo;

static const ew_opinfo k_ops[] = {
    {DEV_EW_ADD, "Add", 2},
    {DEV_EW_SUB, "Sub", 2},
    {DEV_EW_MUL, "Mul", 2},
    {DEV_EW_DIV, "Div", 2},
    {DEV_EW_MAXIMUM, "Maximum", 2},
    {DEV_EW_MINIMUM, "Minimum", 2},
    {DEV_EW_POW, "Pow", 2},
    {DEV_EW_RELU_GRAD, "ReluGrad", 2},
    {DEV_EW_TANH_GRAD, "TanhGrad", 2},
    {DEV_EW_SIGMOID_GRAD, "SigmoidGrad", 2},
    {DEV_EW_SQRT_GRAD, "SqrtGrad", 2},
    {DEV_EW_RSQRT_GRAD, "RsqrtGrad", 2},
    {DEV_EW_NEG, "Neg", 1},
    {DEV_EW_EXP, "Exp", 1},
    {DEV_EW_LOG, "Log", 1},
    {DEV_EW_SQRT, "Sqrt", 1},
    {DEV_EW_RSQRT, "Rsqrt", 1},
    {DEV_EW_SQUARE, "Square", 1},
    {DEV_EW_TANH, "Tanh", 1},
    {DEV_EW_SIGMOID, "Sigmoid", 1},
    {DEV_EW_RELU, "Relu", 1},
    {DEV_EW_ABS, "Abs", 1},
    {DEV_EW_IDENTITY, "Identity", 1},
};

#define N_OPS ((int)(sizeof k_ops / sizeof k_ops[0]))

static const ew_opinfo *info(int opcode) {
  for (int i = 0; i < N_OPS; i++)
    if (k_ops[i].opcode == opcode) return &k_ops[i];
  return NULL;
}

int dev_ew_opcode_for(const char *op_name) {
  if (!op_name) return 0;
  for (int i = 0; i < N_OPS; i++)
    if (strcmp(k_ops[i].name, op_name) == 0) return k_ops[i].opcode;
  return 0;
}

int dev_ew_arity(int opcode) {
  const ew_opinfo *o = info(opcode);
  return o ? o->arity : 0;
}

const char *dev_ew_opcode_name(int opcode) {
  const ew_opinfo *o = info(opcode);
  return o ? o->name : NULL;
}

/* One operand of instruction j: an input, an earlier result or a constant. */
static pd_code check_operand(const char *op, int j, char which, int64_t v,
                             int n_inputs, int n_consts, dev_status *st) {
  if (v >= 0 && v < n_inputs) return PD_OK;
  if (v >= DEV_EW_TEMP_BASE && v < DEV_EW_TEMP_BASE + j) return PD_OK;
  if (v >= DEV_EW_CONST_BASE && v < DEV_EW_CONST_BASE + n_consts) return PD_OK;
  return dev_error(
      st, PD_INVALID_ARGUMENT,
      "%s: attribute 'program': instruction %d operand %c is %lld; expected "
      "an input 0..%d, an earlier result %d..%d or a constant %d..%d",
      op, j, which, (long long)v, n_inputs - 1, DEV_EW_TEMP_BASE,
      DEV_EW_TEMP_BASE + j - 1, DEV_EW_CONST_BASE,
      DEV_EW_CONST_BASE + n_consts - 1);
}

pd_code dev__ew_program_check(const char *op, const int64_t *prog, int n_ints,
                              int n_inputs, int n_consts, dev_status *st) {
  if (n_ints == 0 || n_ints % 3 != 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: attribute 'program' has %d ints; expected 3 per "
                     "instruction (opcode, a, b), at least one instruction",
                     op, n_ints);
  int n = n_ints / 3;
  if (n > DEV_EW_MAX_INSTR)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: attribute 'program' has %d instructions; the limit "
                     "is %d",
                     op, n, DEV_EW_MAX_INSTR);
  for (int j = 0; j < n; j++) {
    int64_t code = prog[3 * j], a = prog[3 * j + 1], b = prog[3 * j + 2];
    int arity = code > 0 && code < 1000 ? dev_ew_arity((int)code) : 0;
    if (!arity)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: attribute 'program': instruction %d has opcode "
                       "%lld, which is none of ops/fused_int.h's opcodes",
                       op, j, (long long)code);
    PD_TRY(check_operand(op, j, 'a', a, n_inputs, n_consts, st));
    if (arity == 2) {
      PD_TRY(check_operand(op, j, 'b', b, n_inputs, n_consts, st));
    } else if (b != DEV_EW_NONE) {
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: attribute 'program': instruction %d (%s) is unary "
                       "but operand b is %lld; expected %d",
                       op, j, dev_ew_opcode_name((int)code), (long long)b,
                       DEV_EW_NONE);
    }
  }
  return PD_OK;
}

int dev_fused_activation(const char *s, size_t len) {
  static const char *const names[] = {"none", "relu", "relu6", "sigmoid",
                                      "tanh"};
  for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
    if (s && strlen(names[i]) == len && memcmp(names[i], s, len) == 0) return i;
  return -1;
}
