/* explain_compact.c: the sections of `--explain` that grow with the model, in a form
 * that reads in a screen at any size: values alike but for a layer index on one line,
 * collectives grouped by phase, mesh axis and kind with their counts, bytes and largest
 * contributors, memory as a table of stages. `--explain=full` prints every line
 * (explain.c); `--explain=json` holds every detail for tools. */
#include <stdlib.h>
#include <string.h>

#include "explain.h"

/* "512 B", "24.00 KiB", "6.00 MiB", "1.25 GiB": two decimals of the largest unit below. */
static void human_bytes(double bytes, char *buf, size_t size) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        snprintf(buf, size, "%.0f B", bytes);
        return;
    }
    int u = 0;
    for (bytes /= 1024; bytes >= 1024 && u < 3; u++) bytes /= 1024;
    snprintf(buf, size, "%.2f %s", bytes, units[u]);
}

void explain_values_collapsed(const ir_graph *g, const char *title, const int *ids, int n, FILE *out) {
    if (!n) return;
    const char **names = calloc((size_t)n, sizeof *names);
    char **tags = calloc((size_t)n, sizeof *tags);
    if (!names || !tags) abort();
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[ids[i]];
        char type[256];
        ir_format_type(g, &v->type, type, sizeof type);
        tags[i] = malloc(strlen(type) + 64); /* padded to 32, then " line N" */
        if (!tags[i]) abort();
        /* one line stands for values of one type declared on one line */
        sprintf(tags[i], "%-32s line %d", type, v->loc.line);
        names[i] = v->name ? v->name : "?";
    }
    explain_name_group *groups;
    int n_groups = explain_collapse_names(names, (const char *const *)tags, n, &groups, NULL);
    if (n_groups < n) fprintf(out, "%s (%d; alike but for a layer index on one line):\n", title, n);
    else fprintf(out, "%s:\n", title);
    for (int k = 0; k < n_groups; k++) fprintf(out, "  %-32s %s\n", groups[k].name, tags[groups[k].first]);
    explain_name_groups_free(groups, n_groups);
    for (int i = 0; i < n; i++) free(tags[i]);
    free(tags);
    free(names);
}

/* The collectives of one phase, mesh axis and kind. */
typedef struct collective_group {
    int phase, axis;
    const char *kind;
    int calls;
    int64_t bytes; /* of a rank's operand shards */
    double sent;   /* bytes a rank sends by ring algorithms */
    int n;         /* collectives, at items */
    int *items;    /* their places in the reshard list, in its order (ZeRO's rows: none) */
    char zero_largest[96]; /* ZeRO's rows: what the largest column says */
    int zero_order;        /* ZeRO's rows: their order in a phase (a bucket's reduce-scatter first) */
} collective_group;

static int by_phase_axis_first(const void *a, const void *b) {
    const collective_group *x = a, *y = b;
    if (x->phase != y->phase) return x->phase < y->phase ? -1 : 1;
    if (x->axis != y->axis) return x->axis < y->axis ? -1 : 1;
    if (!x->n || !y->n) return x->n ? -1 : y->n ? 1 : x->zero_order - y->zero_order; /* ZeRO's rows last */
    return x->items[0] < y->items[0] ? -1 : x->items[0] > y->items[0];
}

/* ZeRO's collectives (explain_zero_collectives) as rows after the reshard list's: one row
 * per kind and phase, in the order they come. */
static int zero_rows(const ir_graph *g, const dm_zero_plan *zero, collective_group *groups, int n_groups) {
    explain_zero_collective *zc;
    int n = explain_zero_collectives(g, zero, &zc), first = n_groups;
    for (int i = 0; i < n; i++) {
        int k = first;
        while (k < n_groups && !(groups[k].phase == zc[i].phase && groups[k].axis == zc[i].axis &&
                                 strcmp(groups[k].kind, zc[i].kind) == 0))
            k++;
        collective_group *grp = &groups[k];
        if (k == n_groups) {
            n_groups++;
            memset(grp, 0, sizeof *grp);
            grp->phase = zc[i].phase, grp->axis = zc[i].axis, grp->kind = zc[i].kind, grp->zero_order = k;
            snprintf(grp->zero_largest, sizeof grp->zero_largest, "%s", zc[i].what);
        }
        int times = explain_per_step(g, zc[i].phase);
        grp->calls += times;
        grp->bytes += times * zc[i].bytes;
        grp->sent += times * zc[i].sent;
    }
    free(zc);
    return n_groups;
}

/* The reshard list's collectives grouped, ordered by phase, then axis, then first appearance
 * (with ZeRO, its reduce-scatters and all-gathers in place of the buckets' allreduces). */
static int group_collectives(const ir_graph *g, const dm_reshard_list *r, const dm_zero_plan *zero,
                             collective_group *groups) {
    int n_groups = 0;
    for (int i = 0; i < r->n; i++) {
        const ir_value *c = g->values[r->items[i].value];
        if (explain_replaced(g, zero, r->items[i].value)) continue;
        int axis = explain_collective_axis(g, c), k = 0;
        const char *kind = explain_collective_kind(c);
        while (k < n_groups && !(groups[k].phase == (int)c->phase && groups[k].axis == axis &&
                                 strcmp(groups[k].kind, kind) == 0))
            k++;
        collective_group *grp = &groups[k];
        if (k == n_groups++) {
            memset(grp, 0, sizeof *grp);
            grp->phase = (int)c->phase, grp->axis = axis, grp->kind = kind;
            grp->items = malloc((size_t)r->n * sizeof *grp->items);
            if (!grp->items) abort();
        } else {
            n_groups--;
        }
        grp->items[grp->n++] = i;
        int times = explain_per_step(g, c->phase);
        grp->calls += times * explain_collective_calls(c);
        grp->bytes += times * explain_collective_bytes(g, c);
        grp->sent += times * explain_collective_sent_bytes(g, c);
    }
    n_groups = zero_rows(g, zero, groups, n_groups);
    qsort(groups, (size_t)n_groups, sizeof *groups, by_phase_axis_first);
    return n_groups;
}

/* The group's largest contributors, the values it moves collapsed by layer index and
 * summed: "h.{0..11}.mlp.c_proj.matmul 72.00 MiB, wte 6.00 MiB (+3 more)". */
static void largest_contributors(const ir_graph *g, const dm_reshard_list *r, const collective_group *grp, char *buf,
                                 size_t size) {
    enum { SHOWN = 2 };
    const char **names = calloc((size_t)grp->n, sizeof *names);
    int *group_of = calloc((size_t)grp->n, sizeof *group_of);
    double *bytes = calloc((size_t)grp->n, sizeof *bytes);
    if (!names || !group_of || !bytes) abort();
    for (int i = 0; i < grp->n; i++) {
        const ir_value *src = g->values[g->values[r->items[grp->items[i]].value]->operands[0]];
        names[i] = src->name ? src->name : ir_op_info_of(src->op)->name;
    }
    explain_name_group *named;
    int n_named = explain_collapse_names(names, NULL, grp->n, &named, group_of);
    for (int i = 0; i < grp->n; i++)
        bytes[group_of[i]] += (double)explain_per_step(g, grp->phase) *
                              (double)explain_collective_bytes(g, g->values[r->items[grp->items[i]].value]);
    size_t len = 0;
    buf[0] = 0;
    for (int shown = 0; shown < SHOWN && shown < n_named && len < size; shown++) {
        int best = -1; /* the largest not shown yet; the first of equals */
        for (int k = 0; k < n_named; k++)
            if (bytes[k] >= 0 && (best < 0 || bytes[k] > bytes[best])) best = k;
        char b[32] = "";
        if (n_named > 1) human_bytes(bytes[best], b + 1, sizeof b - 1), b[0] = ' '; /* one: the group's own */
        len += (size_t)snprintf(buf + len, size - len, "%s%s%s", shown ? ", " : "", named[best].name, b);
        bytes[best] = -1;
    }
    if (n_named > SHOWN && len < size) snprintf(buf + len, size - len, " (+%d more)", n_named - SHOWN);
    explain_name_groups_free(named, n_named);
    free(bytes);
    free(group_of);
    free(names);
}

void explain_collectives_grouped(const ir_graph *g, const dm_reshard_list *r, const dm_zero_plan *zero,
                                 const dm_pipeline_plan *pl, FILE *out) {
    if (!r || r->n == 0) {
        fprintf(out, "\ncollectives: none (every value is whole on every rank)\n\n");
        return;
    }
    collective_group *groups = calloc((size_t)r->n + 8, sizeof *groups); /* + ZeRO's rows */
    if (!groups) abort();
    int n_groups = group_collectives(g, r, zero, groups), calls = 0;
    int64_t bytes = 0;
    double sent = 0;
    for (int k = 0; k < n_groups; k++) calls += groups[k].calls, bytes += groups[k].bytes, sent += groups[k].sent;
    char b[32], s[32];
    human_bytes((double)bytes, b, sizeof b);
    fprintf(out, "\ncollectives: %d per step on %s of operands %s; ", calls, b,
            explain_pipeline_ranks(pl) > 1 ? "over the pipeline's stages" : "per rank");
    explain_sent_headline(g, r, zero, pl, sent, human_bytes, out);
    fprintf(out, "%s\n", g->microbatches > 1 ? "; the forward's and backward's once per micro-batch" : "");
    fprintf(out, "  %-8s %-8s %-20s %5s %11s %11s  %s\n", "phase", "axis", "kind", "calls", "operands", "sent", "largest");
    for (int k = 0; k < n_groups; k++) {
        const collective_group *grp = &groups[k];
        char largest[512];
        if (grp->n) largest_contributors(g, r, grp, largest, sizeof largest);
        else snprintf(largest, sizeof largest, "%s", grp->zero_largest);
        human_bytes((double)grp->bytes, b, sizeof b);
        human_bytes(grp->sent, s, sizeof s);
        fprintf(out, "  %-8s %-8s %-20s %5d %11s %11s  %s\n", explain_phase_names[grp->phase], g->axes[grp->axis].name,
                grp->kind, grp->calls, b, s, largest);
        free(grp->items);
    }
    free(groups);
    fprintf(out, "\n");
}

void explain_memory_table(const ir_graph *g, const dm_memory_plan *plan, const dm_pipeline_plan *pipeline, FILE *out) {
    /* by pipeline coordinate: interleaved, a rank holds several stages */
    int n_peaks = plan->stages > 1 ? plan->ranks : 1, chunked = plan->stages > plan->ranks;
    int64_t gathered = 0, versions = 0, previous = 0;
    /* 2bw and pipedream: a column for the previous batch's inputs, so that each row's parts
     * sum to its peak (the parameters column holds every weight version) */
    int kept_inputs = dm_runs_2bw(g) && n_peaks > 1;
    fprintf(out, "%-15s %10s %11s %10s %10s %12s %10s %8s %8s%s  (MiB)\n", "memory per rank", "peak", "parameters",
            "gradients", "optimizer", "activations", "grad sums", "scratch", "outputs", kept_inputs ? "  prev inputs" : "");
    for (int k = 0; k < n_peaks; k++) {
        dm_memory_peak pk;
        dm_memory_peak_of(plan, g, pipeline, plan->scratch_elems, k, &pk);
        char label[24];
        if (n_peaks > 1) snprintf(label, sizeof label, "%s %d", chunked ? "rank" : "stage", k);
        else snprintf(label, sizeof label, "rank");
        const double mib = 1024.0 * 1024.0;
        fprintf(out, "  %-13s %10.2f %11.2f %10.2f %10.2f %12.2f %10.2f %8.2f %8.2f", label, pk.total / mib,
                (pk.params + pk.weight_version) / mib, pk.grads / mib, pk.optimizer_state / mib, pk.activations / mib, pk.gradient_sums / mib,
                pk.scratch / mib, pk.outputs / mib);
        if (kept_inputs) fprintf(out, " %12.2f", pk.previous_inputs / mib);
        fprintf(out, "\n");
        if (pk.gathered_outputs > gathered) gathered = pk.gathered_outputs;
        if (pk.weight_version > versions) versions = pk.weight_version;
        if (pk.previous_inputs > previous) previous = pk.previous_inputs;
    }
    if (kept_inputs) {
        char second[32], inputs[32];
        human_bytes((double)versions, second, sizeof second);
        human_bytes((double)previous, inputs, sizeof inputs);
        if (dm_runs_pipedream(g))
            fprintf(out, "  pipedream: parameters are P - s weight versions on stage s, one per micro-batch in flight (the\n"
                         "  stashed ones up to %s, an empty buffer 64 bytes); prev inputs: the previous batch's inputs\n"
                         "  kept for the backwards a stage owes across a step's end (up to %s)\n", second, inputs);
        else
            fprintf(out, "  2bw: parameters are two weight versions (the second up to %s); prev inputs: the previous\n"
                         "  batch's inputs kept for the backwards a stage owes across a step's end (up to %s)\n", second, inputs);
    }
    char arena[32], unshared[32];
    explain_mib((double)plan->arena_elems, arena, sizeof arena);
    explain_mib((double)plan->arena_unshared_elems, unshared, sizeof unshared);
    /* --quantize's narrow weights and their buffers are allocated apart from the context's
     * tracked buffers: neither this peak nor `dmc run --memory`'s model peak counts them */
    fprintf(out, "  peak: %s; activations: those in flight, one micro-batch's arena %s%s (%s without buffer reuse)\n",
            g->quantize_bits ? "the f32 parameters and the forward's buffers, tracked (`dmc run --memory`'s model peak), "
                               "not the narrow weights (below)"
                             : "what a rank allocates at most",
            arena, plan->stages > 1 ? " at most" : "", unshared);
    explain_at_create(g, plan, out);
    if (gathered) {
        char host[32];
        human_bytes((double)gathered, host, sizeof host);
        fprintf(out, "  and %s of host memory once the outputs are asked for whole\n", host);
    }
}

void explain_at_create(const ir_graph *g, const dm_memory_plan *plan, FILE *out) {
    char *read = dm_read_by_steps(g, plan);
    int ops = 0, tables = 0;
    int64_t kept = 0;
    const char *first = NULL;
    for (int i = 0; i < g->n_values; i++) {
        ops += dm_made_at_create(plan, i);
        if (!read[i]) continue;
        tables++;
        kept += ir_storage_elems(g, g->values[i]);
        if (!first) first = g->values[i]->name;
    }
    free(read);
    if (!ops) return;
    char bytes[32];
    explain_mib((double)kept, bytes, sizeof bytes);
    fprintf(out, "  made once at create, not in each step: %d ops of constants (no input or parameter reaches them), "
                 "%d table%s the steps read (%s%s), %s of the arena kept through every step\n",
            ops, tables, tables == 1 ? "" : "s", tables > 1 && first ? "the first " : "", first ? first : "unnamed", bytes);
}
