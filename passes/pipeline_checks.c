/* pipeline_checks.c: what the pipeline pass checks of the program's requests before it
 * cuts: the interleaved schedule's model chunks, and the cuts the program names. */
#include "passes.h"
#include "schedule.h"

int pipeline_chunks(const ir_graph *g, int ranks, dm_diag *d) {
    /* where the program gave chunks, else its schedule, else (command line) the pipeline axis */
    dm_loc at = g->chunks_loc.line > 0     ? g->chunks_loc
                : g->schedule_loc.line > 0 ? g->schedule_loc
                : g->pipe_axis >= 0        ? g->axes[g->pipe_axis].loc
                                           : (dm_loc){0};
    int M = g->microbatches;
    if (g->chunks > 0 && g->schedule != PIPE_INTERLEAVED) {
        dm_error(d, at, "%d model chunks per pipeline rank, but the schedule is %s: chunks go with the interleaved schedule",
                 g->chunks, pipe_kind_name((pipe_kind)g->schedule));
        dm_note(d, at, "--schedule interleaved --chunks v, or schedule interleaved(microbatches = M, chunks = v)");
        return -1;
    }
    int chunks = pipe_chunks_for(g->schedule, ranks, g->chunks);
    if (pipe_kind_for(g->schedule, ranks) != PIPE_INTERLEAVED) return 1;
    if (g->chunks < 2) {
        dm_error(d, at, "the interleaved schedule needs 2 or more model chunks per pipeline rank");
        dm_note(d, at, "--chunks v, or schedule interleaved(microbatches = M, chunks = v)");
        return -1;
    }
    if (M % ranks != 0) {
        dm_error(d, at, "%d micro-batch%s cannot run interleaved on %d pipeline ranks: each takes micro-batches "
                 "through its chunks in groups of %d", M, M == 1 ? "" : "es", ranks, ranks);
        dm_note(d, at, "make the micro-batches a multiple of %d (--microbatches %d)", ranks, (M / ranks + 1) * ranks);
        return -1;
    }
    if (ranks * chunks > 64) {
        dm_error(d, at, "at most 64 stages, and %d pipeline ranks x %d chunks make %d", ranks, chunks, ranks * chunks);
        return -1;
    }
    /* not built yet: ZeRO lays out each stage's shares as a rank's whole region, and
     * clipping would take the norm chunk by chunk */
    if (g->zero > 0) {
        dm_error(d, g->zero_loc.line > 0 ? g->zero_loc : at, "ZeRO (zero = %d) is not built for the interleaved schedule",
                 g->zero);
        return -1;
    }
    if (g->optimizer.clip > 0) {
        dm_error(d, g->optimizer.loc, "gradient clipping is not built for the interleaved schedule");
        return -1;
    }
    /* nor gradient compression: its buckets' tables are laid out by stage, not by rank */
    if (g->compress.kind != COMPRESS_NONE) {
        char name[64];
        dm_compress_name(&g->compress, name, sizeof name);
        dm_error(d, at, "gradient compression (--compress %s) is not built for the interleaved schedule", name);
        return -1;
    }
    return chunks;
}

int pipeline_user_cuts(const ir_graph *g, int n_ops, const int *op, int stages, int chunks, int *boundary, dm_diag *d) {
    int errors = 0;
    if (g->n_cuts != stages - 1) {
        dm_error(d, g->cuts_loc, "%d cut%s make%s %d stages, but the pipeline %s %d", g->n_cuts, g->n_cuts == 1 ? "" : "s",
                 g->n_cuts == 1 ? "s" : "", g->n_cuts + 1, chunks > 1 ? "axis and its chunks make" : "axis has", stages);
        errors++;
    }
    for (int k = 0; k < g->n_cuts && !errors; k++) {
        int j = 0;
        while (j < n_ops && op[j] != g->cut_after[k]->id) j++;
        boundary[k + 1] = j + 1;
        if (j + 1 >= n_ops) {
            dm_error(d, g->cuts_loc, "the cut after '%s' leaves no op to the last stage", g->cut_after[k]->name);
            errors++;
        }
    }
    boundary[0] = 0;
    boundary[stages] = n_ops;
    return errors;
}

