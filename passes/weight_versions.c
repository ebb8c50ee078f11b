/* weight_versions.c: what the schedules that do not flush (2bw, pipedream) keep across a
 * step's end (codegen allocates it, --explain counts it): more versions of every parameter
 * (2bw a second; pipedream one per micro-batch in flight), and of the previous batch the
 * inputs that the backwards a stage owes read. requires: pipeline (stages), memory. */
#include "passes.h"
#include "schedule.h"

int dm_runs_2bw(const ir_graph *g) {
    int axis = ir_pipeline_axis(g);
    int ranks = axis >= 0 ? (int)g->axes[axis].size : 1;
    return pipe_flushless(pipe_kind_for(g->schedule, ranks)) && g->loss >= 0 && g->grads;
}

int dm_runs_pipedream(const ir_graph *g) {
    return dm_runs_2bw(g) && g->schedule == PIPE_PIPEDREAM;
}

int dm_weight_versions(const ir_graph *g, int stage) {
    if (!dm_runs_2bw(g)) return 1;
    if (!dm_runs_pipedream(g)) return 2;
    /* stage s runs P - s - 1 forwards ahead of its backwards: P - s micro-batches in flight */
    return (int)g->axes[ir_pipeline_axis(g)].size - stage;
}

uint64_t dm_2bw_kept_inputs(const ir_graph *g, const dm_memory_plan *plan, int stage) {
    int axis = ir_pipeline_axis(g);
    if (!dm_runs_2bw(g) || pipe_2bw_owed((int)g->axes[axis].size, stage) == 0) return 0;
    uint64_t kept = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_BACKWARD || v->stage != stage) continue;
        for (int k = 0; k < v->n_operands; k++) {
            int root = plan->storage_of[v->operands[k]];
            if (!ir_reads_operand(v, k) || plan->region[root] != REGION_INPUT) continue;
            for (int n = 0; n < g->n_inputs && n < 64; n++)
                if (g->inputs[n] == root) kept |= (uint64_t)1 << n;
        }
    }
    return kept;
}
