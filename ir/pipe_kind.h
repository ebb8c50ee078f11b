/* pipe_kind.h: the pipeline schedules a program may ask for, by kind and by name. The
 * IR carries the kind (ir_graph.schedule); passes/schedule.h builds the schedules. */
#ifndef DM_PIPE_KIND_H
#define DM_PIPE_KIND_H

typedef enum pipe_kind {
    PIPE_GPIPE,       /* every forward, then every backward (Huang et al., 2019) */
    PIPE_1F1B,        /* PipeDream-flush: P - s - 1 forwards, then one forward one backward, then the rest */
    PIPE_INTERLEAVED, /* 1F1B over `chunks` model chunks per stage (Narayanan et al., 2021): micro-batches
                       * go through a stage's chunks in groups of P; the warm-up runs forwards of
                       * every chunk, then one forward one backward, then the backwards left */
    PIPE_2BW,         /* PipeDream-2BW (Narayanan et al., 2021): 1F1B without a flush between steps; a
                       * stage's last P - s - 1 backwards of batch t run in step t + 1, and batch t
                       * runs on the weights of update t - 1 (two versions kept) */
    PIPE_PIPEDREAM,   /* PipeDream with weight stashing (Narayanan et al., 2019): 2BW's stream, but each
                       * micro-batch's backward updates its stage, and its forward and backward run on
                       * the same version (P - s kept on stage s, one per micro-batch in flight) */
} pipe_kind;

/* The schedules whose steps do not flush (2BW, PipeDream): the same stream of actions. */
static inline int pipe_flushless(int kind) { return kind == PIPE_2BW || kind == PIPE_PIPEDREAM; }

/* "gpipe" / "1f1b" / "interleaved" / "2bw" (or "pipedream_2bw", as a .dm names it) /
 * "pipedream" to the kind; -1 for anything else. */
int pipe_kind_by_name(const char *name);
const char *pipe_kind_name(pipe_kind kind);

#endif
