/* compact_io.h: --compact's files: the pruned weights read (for passes/compact_channels.c)
 * and the compacted ones written, with the runtime's safetensors reader and writer. */
#ifndef DMC_COMPACT_IO_H
#define DMC_COMPACT_IO_H

#include "passes.h"

typedef struct dm_compact_input dm_compact_input;

/* Reads path whole into c (c->path, c->file): the handle to free with dm_compact_close,
 * or NULL after a message naming --compact and the file. */
dm_compact_input *dm_compact_open(const char *path, dm_compaction *c);
void dm_compact_close(dm_compact_input *in);
/* Writes c->weights to path atomically (a file the runtime's --init reads), metadata
 * naming the pruned file: 0, or 1 after a message. */
int dm_compact_save(const dm_compaction *c, const char *path);

#endif
