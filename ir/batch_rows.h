/* batch_rows.h: which ops combine rows of the batch. Predict needs its outputs' rows
 * independent (codegen/emit_predict.c), and micro-batches need the loss to be a mean over
 * independent rows (passes/microbatch_loss.c): both ask the same question of an op. */
#ifndef DM_BATCH_ROWS_H
#define DM_BATCH_ROWS_H

#include "ir.h"

/* Where t has the dim named name: its index, -1 when it has none, -2 when more than one
 * (a [B, B] value: rows against rows). */
int ir_batch_dim_at(const ir_type *t, const char *name);

/* Whether op v makes a row of its result from other rows of the batch (the dim named
 * batch): a reduction or contraction over the batch, a value holding it twice or anywhere
 * but first (moved there: the ops after it would work along it), a result whose batch is
 * not its operands' (a reduction kept as a dim of 1, a slice), or an op along the batch
 * itself (softmax, a mask, a norm, a slice or pad along it). */
int ir_mixes_rows(const ir_graph *g, const ir_value *v, const char *batch);

#endif
