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
    int64_t offset[CG_MAX_OPERANDS];                /* (n_in) element of operand k at index 0 */
    const char *out;
    int64_t out_stride[IR_MAX_RANK];                /* (rank) */
    int64_t out_offset;
    int64_t out_elems;                              /* elements of out (zeroed first when accumulating) */
    const char *expr;
    int accumulate;
    const char *scale;                              /* multiply out by this literal afterwards, or NULL */
} cg_loop_nest;

/* Row-major c = op(a) @ op(b) (+ c when accumulate), batch times: the i-th product
 * reads a + i * batch_stride_a and b + i * batch_stride_b and writes c + i * batch_stride_c. */
typedef struct cg_gemm {
    int trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldc;
    const char *a, *b, *c;
    int accumulate;
    int64_t batch;                                  /* 1 for a single product */
    int64_t batch_stride_a, batch_stride_b, batch_stride_c;
} cg_gemm;

/* A kernel along one dim of a tensor seen as (outer, n, inner): softmax and its
 * gradient work along n; layernorm and its gradients along the last dim (inner 1); the
 * causal mask sees (outer, n queries, inner keys). Unused operands are NULL. */
typedef struct cg_rowwise {
    int64_t outer, n, inner;
    const char *x, *y, *dy, *weight, *bias, *out;
    const char *fill;                               /* causal mask: C literal of masked elements */
    const char *eps;                                /* layernorm: C literal */
    const char *scale;                              /* softmax: C literal the input is multiplied by, or NULL */
    int64_t causal_queries;                         /* softmax: rows are queries cycling through this
                                                     * many, seeing keys up to their own (0: every key) */
} cg_rowwise;

/* Embedding rows: out (rows, cols) = table[ids[r]] for ids in [0, n); the gradient adds
 * the rows of dy into a zeroed table (n, cols). */
typedef struct cg_embed {
    int64_t rows, n, cols;
    int64_t vocab;                                  /* ids must be in [0, vocab) */
    const char *first_row;                          /* C expression: the id of table row 0 when the
                                                     * table holds a window of the vocabulary (ids
                                                     * outside it give zero rows); NULL: 0, n == vocab */
    const char *table, *ids, *dy, *out;
    const char *where;                              /* .dm location for the range error */
} cg_embed;

/* Mean cross-entropy over rows of logits (rows, classes) with i32 targets; or, for the
 * gradient, dlogits = (softmax - onehot) * dloss / rows. */
typedef struct cg_xent {
    int64_t rows, classes;
    int64_t mean_rows;                              /* the divisor of the mean: rows of every rank */
    const char *logits, *targets, *out;
    const char *dloss;                              /* C expression of the scalar; NULL for the forward */
    const char *where;                              /* .dm location for the range error */
    /* classes split over ranks (vocabulary-parallel): this rank holds classes
     * [coord * classes, (coord + 1) * classes) of all_classes; the row maxima are gathered
     * and the sums reduced over comm, in scratch ((comm_size + 3) * rows floats) */
    int64_t all_classes;                            /* = classes when whole */
    const char *coord, *comm, *scratch;             /* C expressions (coord: this rank's place on
                                                     * comm); NULL when whole */
    int64_t comm_size;
    const char *logits_name;                        /* for the collectives' labels */
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
    void (*softmax)(cg_writer *w, const cg_rowwise *k);
    void (*softmax_grad)(cg_writer *w, const cg_rowwise *k);
    void (*causal_mask)(cg_writer *w, const cg_rowwise *k);
    void (*layernorm)(cg_writer *w, const cg_rowwise *k);
    void (*layernorm_grad)(cg_writer *w, const cg_rowwise *k);
    void (*layernorm_wgrad)(cg_writer *w, const cg_rowwise *k);
    void (*embed)(cg_writer *w, const cg_embed *k);
    void (*embed_grad)(cg_writer *w, const cg_embed *k);
} cg_dialect;

extern const cg_dialect cg_dialect_c;

/* A float as a C literal ("0.5f", "1e-08f"). */
void cg_float_literal(double v, char *buf, size_t size);

#endif
