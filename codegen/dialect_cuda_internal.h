/* dialect_cuda_internal.h: what the CUDA dialect's files share (dialect_cuda.c,
 * dialect_cuda_nest.c, dialect_cuda_step.c, dialect_cuda_attention.c); nothing else
 * includes it. */
#ifndef DM_DIALECT_CUDA_INTERNAL_H
#define DM_DIALECT_CUDA_INTERNAL_H

#include "dialect.h"

/* "if (<call>) != DMRT_OK)" and the failure on the next line; call has no ')' yet. */
void cg_cuda_checked(cg_writer *w, const char *call);

/* the loop-nest hook and the end of the file's kernels (dialect_cuda_nest.c) */
void cg_cuda_loop_nest(cg_writer *w, const cg_loop_nest *k);
void cg_cuda_finish(cg_writer *w);
/* s as the body of a C string literal (into out, at most size bytes) */
void cg_cuda_c_string(const char *s, char *out, size_t size);

/* the attention hooks (dialect_cuda_attention.c) */
void cg_cuda_attention(cg_writer *w, const cg_attention *k);
void cg_cuda_attention_grad(cg_writer *w, const cg_attention *k);
int64_t cg_cuda_attention_scratch_floats(int64_t heads, int64_t positions, int64_t width, ir_dtype dtype);

#endif
