/* codegen.h: writes DIR/<model>.h and DIR/<model>.c for a planned graph. */
#ifndef DM_CODEGEN_H
#define DM_CODEGEN_H

#include <stdio.h>

#include "ir.h"
#include "passes.h"

/* source_path is the .dm file (quoted in comments), source_text its contents (each op
 * gets its .dm line as a comment). Returns 0, or -1 with a message on err. Files are
 * written atomically (temporary name, then rename). */
int codegen_c(const ir_graph *g, const dm_memory_plan *plan, const char *source_path,
              const char *source_text, size_t source_len, const char *out_dir, FILE *err);

#endif
