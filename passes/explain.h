/* explain.h: `dmc --explain`, the partition and memory plan in words (or JSON). */
#ifndef DM_EXPLAIN_H
#define DM_EXPLAIN_H

#include <stdio.h>

#include "passes.h"

/* pipeline may be NULL (or of one stage and micro-batch): no pipeline section; zero NULL
 * or without buckets: no ZeRO section. */
void explain_print(const ir_graph *g, const dm_memory_plan *plan, const dm_reshard_list *reshards,
                   const dm_pipeline_plan *pipeline, const dm_zero_plan *zero, const char *source_path, int json,
                   FILE *out);

/* Within --explain: the predicted step (explain_time.c), and JSON strings. */
void explain_time_text(const ir_graph *g, const dm_pipeline_plan *pipeline, FILE *out);
void explain_time_json(const ir_graph *g, const dm_pipeline_plan *pipeline, FILE *out);
void explain_json_string(FILE *out, const char *s);
/* Samples in one step (the inputs' leading dim, every micro-batch), and tokens when the
 * first input is integer ids with a sequence dim (0 otherwise). */
double samples_per_step(const ir_graph *g, double *tokens);

#endif
