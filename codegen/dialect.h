/* dialect.h: how a target spells kernels. The emitter (emit.c) decides what to emit,
 * with buffers named and shapes resolved; a dialect turns each kernel description into
 * source text. The C dialect is dialect_c.c; a CUDA dialect implements the same hooks. */
#ifndef DM_DIALECT_H
#define DM_DIALECT_H

#include <stdint.h>
#include <stdio.h>

#include "ir.h"

typedef struct cg_writer {
    FILE *f;
    int indent;
} cg_writer;

void cg_line(cg_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_blank(cg_writer *w);

/* out[...] (=|+=) expr over a loop nest. Operand k is named in expr by var[k] ("x",
 * "a", ...); its element at the loop position is at[k] + sum_d index_d * stride[k][d],
 * or the literal constant[k] when that is set. Dims are coalesced already. */
#define CG_MAX_OPERANDS 4
typedef struct cg_loop_nest {
    int rank;
    int64_t size[IR_MAX_RANK];                      /* (rank) */
    int n_in;
    const char *var[CG_MAX_OPERANDS];
    const char *buffer[CG_MAX_OPERANDS];            /* C name of the operand buffer */
    const char *constant[CG_MAX_OPERANDS];          /* C literal, or NULL */
    int64_t stride[CG_MAX_OPERANDS][IR_MAX_RANK];   /* (n_in, rank) */
    const char *out;
    int64_t out_stride[IR_MAX_RANK];                /* (rank) */
    int64_t out_elems;                              /* elements of out (zeroed first when accumulating) */
    const char *expr;
    int accumulate;
    const char *scale;                              /* multiply out by this literal afterwards, or NULL */
} cg_loop_nest;

/* Row-major c = op(a) @ op(b) (+ c when accumulate). */
typedef struct cg_gemm {
    int trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldc;
    const char *a, *b, *c;
    int accumulate;
} cg_gemm;

/* Mean cross-entropy over rows of logits (rows, classes) with i32 targets; or, for the
 * gradient, dlogits = (softmax - onehot) * dloss / rows. */
typedef struct cg_xent {
    int64_t rows, classes;
    const char *logits, *targets, *out;
    const char *dloss;                              /* C expression of the scalar; NULL for the forward */
    const char *where;                              /* .dm location for the range error */
} cg_xent;

typedef struct cg_update {
    const ir_optimizer *opt;
    int64_t n;
    const char *param, *grad, *state0, *state1;     /* state NULL when unused */
} cg_update;

typedef struct cg_dialect {
    const char *name;
    void (*loop_nest)(cg_writer *w, const cg_loop_nest *k);
    void (*gemm)(cg_writer *w, const cg_gemm *k);
    void (*cross_entropy)(cg_writer *w, const cg_xent *k);
    void (*cross_entropy_grad)(cg_writer *w, const cg_xent *k);
    void (*sgd)(cg_writer *w, const cg_update *k);
    void (*adamw)(cg_writer *w, const cg_update *k);
} cg_dialect;

extern const cg_dialect cg_dialect_c;

/* A float as a C literal ("0.5f", "1e-08f"). */
void cg_float_literal(double v, char *buf, size_t size);

#endif
