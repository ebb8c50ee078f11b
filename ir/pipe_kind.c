/* pipe_kind.c: the schedules' names. */
#include "pipe_kind.h"

#include <string.h>

int pipe_kind_by_name(const char *name) {
    if (strcmp(name, "gpipe") == 0) return PIPE_GPIPE;
    if (strcmp(name, "1f1b") == 0) return PIPE_1F1B;
    if (strcmp(name, "interleaved") == 0) return PIPE_INTERLEAVED;
    /* a .dm names it pipedream_2bw: a name cannot start with a digit */
    if (strcmp(name, "2bw") == 0 || strcmp(name, "pipedream_2bw") == 0) return PIPE_2BW;
    if (strcmp(name, "pipedream") == 0) return PIPE_PIPEDREAM;
    return -1;
}

const char *pipe_kind_name(pipe_kind kind) {
    return kind == PIPE_GPIPE ? "gpipe" : kind == PIPE_1F1B ? "1f1b" : kind == PIPE_2BW ? "2bw"
           : kind == PIPE_PIPEDREAM ? "pipedream"
                                    : "interleaved";
}
