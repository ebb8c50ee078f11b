/* explain.h: `dmc --explain`, the partition and memory plan in words (or JSON). */
#ifndef DM_EXPLAIN_H
#define DM_EXPLAIN_H

#include <stdio.h>

#include "passes.h"

/* text: a screen at any size (names alike but for a layer index on one line, collectives
 * grouped by phase, axis and kind); full: every parameter and collective on its own line;
 * json: everything, for tools. */
typedef enum explain_format { EXPLAIN_TEXT, EXPLAIN_FULL, EXPLAIN_JSON } explain_format;

/* pipeline may be NULL (or of one stage and micro-batch): no pipeline section; zero NULL
 * or without buckets: no ZeRO section. */
void explain_print(const ir_graph *g, const dm_memory_plan *plan, const dm_reshard_list *reshards,
                   const dm_pipeline_plan *pipeline, const dm_zero_plan *zero, const char *source_path,
                   explain_format format, FILE *out);

/* Within --explain: the predicted step (explain_time.c; full: with the notes on what it
 * leaves out), and JSON strings. */
void explain_time_text(const ir_graph *g, const dm_pipeline_plan *pipeline, int full, FILE *out);
void explain_time_json(const ir_graph *g, const dm_pipeline_plan *pipeline, FILE *out);
void explain_json_string(FILE *out, const char *s);
/* Samples in one step (the inputs' leading dim, every micro-batch), and tokens when the
 * first input is integer ids with a sequence dim (0 otherwise). */
double samples_per_step(const ir_graph *g, double *tokens);

/* The collectives as explain.c counts them: the mesh axis, the kind ("allreduce",
 * "allgather+allreduce" for a split cross-entropy's statistics), calls (2 for that pair),
 * bytes of a rank's operand shard, bytes a rank sends by ring algorithms. */
extern const char *const explain_phase_names[3];
int explain_collective_axis(const ir_graph *g, const ir_value *c);
const char *explain_collective_kind(const ir_value *c);
int explain_collective_calls(const ir_value *c);
int64_t explain_collective_bytes(const ir_graph *g, const ir_value *c);
double explain_collective_sent_bytes(const ir_graph *g, const ir_value *c);
/* How many times a step runs a collective of this phase: a forward or backward one once per
 * micro-batch (the step's M of them), an update's once. The per-step sums multiply by it. */
int explain_per_step(const ir_graph *g, int phase);
/* ZeRO's collectives (passes/zero.c) in place of its buckets' gradient allreduces: per
 * bucket a reduce-scatter in the update and, for a bucket held whole, an all-gather of its
 * parameters after it; per ZeRO 3 gather, an all-gather before its readers in the forward or
 * backward pass. bytes: a rank's operand (a reduce-scatter's the bucket, an all-gather's the
 * share); sent: what a rank sends by ring, (k-1)/k of the bucket. */
typedef struct explain_zero_collective {
    int phase, axis;
    const char *kind; /* "reduce_scatter", "allgather" */
    const char *what; /* "ZeRO buckets' gradients", ... */
    int bucket;
    int64_t bytes;
    double sent;
} explain_zero_collective;
/* The count, in *out (free it); none (0) without ZeRO (zero NULL or no buckets). */
int explain_zero_collectives(const ir_graph *g, const dm_zero_plan *zero, explain_zero_collective **out);
/* Whether ZeRO reduces this gradient allreduce's bucket instead (zero may be NULL); whether
 * parameter servers take its place (--param-servers); either. */
int explain_replaced_by_zero(const ir_graph *g, const dm_zero_plan *zero, int value);
int explain_replaced_by_param_servers(const ir_graph *g, int value);
int explain_replaced(const ir_graph *g, const dm_zero_plan *zero, int value);
/* The line on the values made once at create (passes/hoist_constants.c; nothing when there
 * are none): their ops, the tables the steps read and the arena they keep (explain_compact.c). */
void explain_at_create(const ir_graph *g, const dm_memory_plan *plan, FILE *out);
/* "12.50 MiB" of elements of 4 bytes */
void explain_mib(double elems, char *buf, size_t size);

/* What --compress sends per step next to the uncompressed allreduce (explain_compress.c;
 * nothing without compression; full: a line per gradient). */
void explain_compress_text(const ir_graph *g, int full, FILE *out);
void explain_compress_json(const ir_graph *g, FILE *out);

/* What --param-servers sends per worker and per server next to the allreduce plan it
 * replaces (explain_ps.c; nothing, and no JSON key, without servers). */
void explain_ps_text(const ir_graph *g, FILE *out);
void explain_ps_json(const ir_graph *g, FILE *out);
/* explain_prune.c: --prune's ratio, schedule and pruned weights (nothing without it). */
void explain_prune_text(const ir_graph *g, FILE *out);
void explain_prune_json(const ir_graph *g, FILE *out);
/* explain_channels.c: --compact's weights, channels before and after, and why others stay
 * (nothing without --compact). */
void explain_compaction_text(const dm_compaction *c, FILE *out);
/* explain_quant.c: --quantize's narrow weights, bytes per parameter, the parameters' bytes
 * quantized vs f32 and the program's memory (nothing, and no JSON key, without it). */
void explain_quant_text(const ir_graph *g, const dm_memory_plan *plan, const dm_pipeline_plan *pipeline, int full,
                        FILE *out);
void explain_quant_json(const ir_graph *g, const dm_memory_plan *plan, const dm_pipeline_plan *pipeline, FILE *out);

/* What --sequence-parallel holds in row blocks and which collectives it uses
 * (explain_sequence.c; nothing, and no JSON key, when it is off). */
void explain_sequence_text(const ir_graph *g, int full, FILE *out);
void explain_sequence_json(const ir_graph *g, FILE *out);

/* The compact sections of the default text (explain_compact.c). */
void explain_values_collapsed(const ir_graph *g, const char *title, const int *ids, int n, FILE *out);
/* zero: its buckets' reduce-scatters and all-gathers replace their allreduces (may be NULL) */
void explain_collectives_grouped(const ir_graph *g, const dm_reshard_list *r, const dm_zero_plan *zero,
                                 const dm_pipeline_plan *pl, FILE *out);
/* The pipeline ranks a collective's traffic is told apart by (1 without a pipeline). */
int explain_pipeline_ranks(const dm_pipeline_plan *pl);
/* What a rank at each pipeline coordinate sends in a step (by ring algorithms): the
 * collectives of its stages (by_rank: explain_pipeline_ranks entries). */
void explain_sent_by_pipeline_rank(const ir_graph *g, const dm_reshard_list *r, const dm_zero_plan *zero,
                                   const dm_pipeline_plan *pl, double *by_rank);
/* "by ring algorithms each rank sends X (and receives as much)", or per pipeline coordinate;
 * total: the bytes of every collective; bytes_str writes a count of bytes as the table does. */
void explain_sent_headline(const ir_graph *g, const dm_reshard_list *r, const dm_zero_plan *zero, const dm_pipeline_plan *pl,
                           double total, void (*bytes_str)(double bytes, char *buf, size_t size), FILE *out);
/* A pipeline's point-to-point traffic in a step (explain_p2p.c): what each pipeline rank
 * sends to the others, and the value that moves the most. */
typedef struct explain_p2p {
    int ranks;          /* pipeline ranks: by_rank's entries */
    double *by_rank;    /* (ranks) bytes each sends in a step */
    int largest;        /* the value whose sends move the most bytes in a step; -1: none */
    double largest_bytes;
} explain_p2p;
/* Fills p; returns its ranks (<= 1: no pipeline traffic, nothing to free). */
int explain_p2p_of(const ir_graph *g, const dm_memory_plan *mem, const dm_pipeline_plan *pl, explain_p2p *p);
void explain_p2p_free(explain_p2p *p);
/* The pipeline section's line, and the JSON's communication.p2p_sent_bytes_by_pipeline_rank. */
void explain_p2p_text(const ir_graph *g, const dm_memory_plan *mem, const dm_pipeline_plan *pl, int full, FILE *out);
void explain_p2p_json(const ir_graph *g, const dm_memory_plan *mem, const dm_pipeline_plan *pl, FILE *out);
void explain_memory_table(const ir_graph *g, const dm_memory_plan *plan, const dm_pipeline_plan *pipeline, FILE *out);

/* One line of a collapsed list of names (explain_names.c). */
typedef struct explain_name_group {
    int first;  /* the place of its first member in the list */
    int count;  /* members */
    char *name; /* "h.{0..11}.attn.c_proj.weight", or the one member's name */
} explain_name_group;

/* Groups the names that differ only in their layer index (their first dot-separated part
 * written as a number) and have equal tags (tags NULL: all equal). Returns the number of
 * groups, in *groups in the order of their first member (free them with
 * explain_name_groups_free); group_of (NULL, or n entries): each name's group. */
int explain_collapse_names(const char *const *names, const char *const *tags, int n, explain_name_group **groups,
                           int *group_of);
void explain_name_groups_free(explain_name_group *groups, int n);

#endif
