/* memory_internal.h: what the memory plan's files share (memory.c, memory_stages.c);
 * nothing else includes it. */
#ifndef DM_MEMORY_INTERNAL_H
#define DM_MEMORY_INTERNAL_H

#include "passes.h"

/* Offsets are rounded to 16 elements (64 bytes) for vector loads. */
#define ALIGN_ELEMS 16

static inline int64_t mem_round_up(int64_t n) { return (n + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS; }

/* The rank (pipeline coordinate) of stage k. */
static inline int mem_rank_of(const dm_memory_plan *plan, int k) { return plan->ranks > 1 ? k % plan->ranks : 0; }

/* n buffers, each of size[i] elements, live from def[i] to dies[i]: their offsets, placed
 * three ways and the smallest arena kept; returns its size. */
int64_t mem_place_buffers(int n, const int64_t *size, const int *def, const int *dies, int64_t *offset);
/* Whether value reader's read of its operand k extends that buffer's life (summed:
 * dm_summed_partials). */
int mem_read_keeps_alive(const int *summed, const ir_value *reader, int k);
/* The op whose operands v reads too (a bias's product, a folded cast's producer), or NULL. */
const ir_value *mem_operands_also_read(const dm_memory_plan *plan, const ir_graph *g, const ir_value *v);

#endif
