/* dialect_c_internal.h: what the C dialect's files share (dialect_c.c, dialect_c_rows.c);
 * nothing else includes it. */
#ifndef DM_DIALECT_C_INTERNAL_H
#define DM_DIALECT_C_INTERNAL_H

#include "dialect.h"

/* Loops over fewer elements than this stay on one thread: starting the others would
 * cost more than they save. */
#define PARALLEL_MIN_ELEMS (1 << 15)
/* A split loop wants at least this many iterations, so that 16 threads get 4 each. */
#define PARALLEL_MIN_ITERATIONS 64
/* The groups of rows layernorm's weight gradient sums apart (cg_c_layernorm_wgrad). */
#define WGRAD_GROUPS 16

/* The loop (or the `loops` nested loops) after it runs on the context's threads. */
void cg_c_parallel_for(cg_writer *w, int loops);

/* the rowwise hooks (dialect_c_rows.c) */
void cg_c_softmax(cg_writer *w, const cg_rowwise *k);
void cg_c_softmax_grad(cg_writer *w, const cg_rowwise *k);
void cg_c_causal_mask(cg_writer *w, const cg_rowwise *k);
void cg_c_layernorm(cg_writer *w, const cg_rowwise *k);
void cg_c_layernorm_grad(cg_writer *w, const cg_rowwise *k);
void cg_c_layernorm_wgrad(cg_writer *w, const cg_rowwise *k);
/* Layernorm's weight gradient's scratch (the dialect's wgrad_scratch_floats). */
int64_t cg_c_wgrad_scratch_floats(int64_t rows, int64_t n);

#endif
