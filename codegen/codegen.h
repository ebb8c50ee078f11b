/* codegen.h: writes DIR/<model>.h and DIR/<model>.c for a planned graph. */
#ifndef DM_CODEGEN_H
#define DM_CODEGEN_H

#include <stdio.h>

#include "ir.h"
#include "passes.h"

/* Choices of the generated code that the graph does not fix. */
typedef struct codegen_options {
    /* the largest gradient bucket, in bytes (0: 25 MiB, as PyTorch DDP); the first bucket
     * reduced, holding the last parameters, is at most 1 MiB and never larger than this */
    int64_t bucket_bytes;
} codegen_options;

/* source_path is the .dm file (quoted in comments), source_text its contents (each op
 * gets its .dm line as a comment); options may be NULL (the defaults). Returns 0, or -1
 * with a message on err. Files are written atomically (temporary name, then rename). */
int codegen_c(const ir_graph *g, const dm_memory_plan *plan, const char *source_path,
              const char *source_text, size_t source_len, const codegen_options *options,
              const char *out_dir, FILE *err);

#endif
