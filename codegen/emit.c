/* emit.c: code generation's entry points (codegen.h): names every value after its source,
 * numbers the range checks, refuses what generated code or the dialect cannot do yet (also
 * alone: codegen_check), and writes <model>.h and <model>.<c|cu> atomically, the source in
 * sections (head, kernels, host functions). The helpers the emitter's files share are
 * emit_util.c's.
 * requires: shapes, autodiff, optimizer, shard, pipeline (+ readers), memory, buckets. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emitter.h"

/* ---- names ----------------------------------------------------------------------------- */

static const char *const reserved[] = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
    "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return",
    "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
    "volatile", "while", "ctx", "batch", "loss", "row", "drow", "max", "sum", "scale", "target", "total",
    "decay", "step_size", "bc2_sqrt", "denom", "d", "g", "r", "c", "i", "rng", "exp", "log", "sqrt",
    "pow", "expf", "logf", "tanhf", "sqrtf", "memset", "memcpy", "snprintf", "NULL", "INFINITY",
    /* locals of the rowwise, embedding and batched-matmul kernels (dialect_c.c) */
    "base", "j", "ib", "id", "query", "key", "out_row", "x_row", "y_row", "dy_row", "dot", "sum_sq", "mean", "rstd",
    "dxhat", "sum_dxhat", "sum_dxhat_xhat", "mean_dxhat", "mean_dxhat_xhat", "keys", "lane", "lanes", "inv_sum",
    "sum_lanes", "sum_sq_lanes", "sum_dxhat_lanes", "sum_dxhat_xhat_lanes",
    "scaled_max", "fault", "status", "whole", "shard", "host", "arena", "micro_loss", "trace_start",
    "comm_failed", "data_fault", "device_failed", "fault_formats",
    /* locals of elementwise expressions (ir/ops.def) */
    "tanh_inner",
};

static int is_reserved(const char *s) {
    for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
        if (strcmp(reserved[i], s) == 0) return 1;
    if (s[0] == 'i' && isdigit((unsigned char)s[1])) return 1;   /* loop indices */
    /* the runtime's names, and the CUDA dialect's kernels (k<serial>_...) */
    if (s[0] == 'k' && isdigit((unsigned char)s[1])) return 1;
    /* the ops' outlined loops (outline_loops.c: <op>_loops_<n>) */
    const char *loops = strstr(s, "_loops_");
    if (loops && loops[7] && strspn(loops + 7, "0123456789") == strlen(loops + 7)) return 1;
    return strncmp(s, "dmrt", 4) == 0;
}

/* Every value gets a distinct C identifier derived from its source name (dots become
 * underscores; a clash gets the value's number as a suffix). A hash set keeps this
 * linear. */
static void assign_names(emitter *E) {
    const ir_graph *g = E->g;
    E->cname = calloc((size_t)g->n_values + 1, sizeof(char *));
    size_t n_slots = 64;
    while (n_slots < (size_t)g->n_values * 2 + 2) n_slots *= 2;
    char **taken = calloc(n_slots, sizeof(char *));
    if (!E->cname || !taken) abort();
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        char base[200];
        if (v->name) {
            size_t n = 0;
            for (const char *p = v->name; *p && n + 1 < sizeof base; p++)
                base[n++] = isalnum((unsigned char)*p) ? *p : '_';
            base[n] = 0;
            if (isdigit((unsigned char)base[0]) || n == 0) snprintf(base, sizeof base, "v_%.180s", v->name);
        } else {
            /* unnamed: the op and the value number, unique at once */
            snprintf(base, sizeof base, "%s_%d", ir_op_info_of(v->op)->name, i);
        }
        char name[256];
        snprintf(name, sizeof name, "%s%s", base, is_reserved(base) ? "_" : "");
        for (int suffix = i + 1;; suffix++) {
            size_t slot = ir_hash_string(name) & (n_slots - 1);
            while (taken[slot] && strcmp(taken[slot], name) != 0) slot = (slot + 1) & (n_slots - 1);
            if (!taken[slot]) {
                E->cname[i] = taken[slot] = strdup(name);
                break;
            }
            snprintf(name, sizeof name, "%s_%d", base, suffix);
        }
    }
    free(taken);
}

/* What pipelined code generation does not handle yet (passes/supported.c refuses the rest
 * at --check). */
static int check_stages(const emitter *E, FILE *err) {
    const ir_graph *g = E->g;
    int bad = 0;
    for (int i = 0; i < g->n_outputs; i++) {
        const ir_value *v = V(E, g->outputs[i]);
        /* passes/supported.c refuses an input, a parameter or a reshape of one, with a caret;
         * this catches what only the memory plan shares (a parameter's window read in place) */
        if (E->plan->region[v->id] != REGION_ARENA) {
            dm_loc at = g->output_locs ? g->output_locs[i] : v->loc;
            fprintf(err, "%s:%d:%d: error: output '%s' is not computed: with micro-batches or stages, outputs are results "
                         "of ops\n", E->source_path, at.line, at.col, v->name);
            bad = -1;
        }
    }
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = V(E, i);
        uint64_t others = E->needed_on[i] & ~((uint64_t)1 << v->stage);
        if (E->plan->region[i] != REGION_ARENA || !others) continue;
        /* forward values flow to later stages, gradients to earlier ones, updates nowhere */
        uint64_t earlier = ((uint64_t)1 << v->stage) - 1;
        if (v->phase == PHASE_UPDATE || (others & (v->phase == PHASE_FORWARD ? earlier : ~earlier))) {
            fprintf(err, "%s:%d: error: internal: '%s' (stage %d) is read by a stage the schedule runs before it\n",
                    E->source_path, v->loc.line, v->name ? v->name : "?", v->stage);
            bad = -1;
        }
    }
    return bad;
}

/* What SPMD code generation does not handle, or the dialect cannot do (its capabilities),
 * refused before anything is written, and by `dmc --check` (codegen_check). */
static int check_spmd(const emitter *E, FILE *err) {
    const cg_capabilities *can = &E->dialect->can;
    int bad = 0;
    if (E->scheduled && check_stages(E, err)) bad = -1;
    if (!can->interleaved && E->chunks > 1) {
        fprintf(err, "%s: error: the interleaved schedule is built for the C target only; compile with --target c or "
                     "another schedule\n", E->source_path);
        bad = -1;
    }
    if (!can->compress && E->g->compress.kind != COMPRESS_NONE) {
        char name[64];
        dm_compress_name(&E->g->compress, name, sizeof name);
        fprintf(err, "%s: error: gradient compression (--compress %s) is built for the C target only; compile with --target c "
                     "or without --compress\n", E->source_path, name);
        bad = -1;
    }
    if (!can->weight_versions && emits_2bw(E)) {
        fprintf(err, "%s: error: the %s schedule is built for the C target only; compile with --target c or another "
                     "schedule\n", E->source_path, dm_runs_pipedream(E->g) ? "pipedream" : "2bw");
        bad = -1;
    }
    if (!can->param_servers && E->g->param_servers.servers) {
        fprintf(err, "%s: error: parameter servers are built for the C target only; compile with --target c or without "
                     "--param-servers\n", E->source_path);
        bad = -1;
    }
    if (!can->zero && E->zero->n_buckets) {
        fprintf(err, "%s: error: ZeRO (zero = %d) is built for the C target only; compile with --target c or without --zero\n",
                E->source_path, E->zero->stage);
        bad = -1;
    }
    return bad;
}

/* --quantize: serial programs of a target that can (can.quantize), with a product to quantize. */
static int check_quantize(const emitter *E, FILE *err) {
    if (!E->dialect->can.quantize) {
        fprintf(err, "%s: error: --quantize is not built for the %s target; compile with --target c\n", E->source_path,
                E->dialect->name);
        return -1;
    }
    const char *why = E->partitioned || E->scheduled ? "makes serial inference programs: compile without a mesh of "
                                                         "more than one rank and without micro-batches"
                      : !E->n_quant ? "found no product reading a 2-D parameter (x @ weight, or x @ transpose(weight) "
                                      "where nothing else reads it) to quantize"
                                    : NULL;
    if (!why) return 0;
    fprintf(err, "%s: error: --quantize %s\n", E->source_path, why);
    return -1;
}

/* Ops the target has no kernel for (the driver fuses attention only where it has one). */
static int check_target(const emitter *E, FILE *err) {
    ir_dtype half = E->g->product_dtype;
    int pipedream = emits_2bw(E) && dm_runs_pipedream(E->g);
    if (E->g->loss_scale > 0 && pipedream) {
        fprintf(err, "%s: error: --precision fp16's loss scaling is not built for the pipedream schedule yet; use "
                     "--precision bf16 (no loss scale needed)\n", E->source_path);
        return -1;
    }
    if ((half == DT_BF16 && !E->dialect->can.bf16) || (half == DT_F16 && !E->dialect->can.f16)) {
        fprintf(err, "%s: error: --precision %s is not built for the %s target; compile with --target c, or "
                     "--precision fp32\n", E->source_path, half == DT_BF16 ? "bf16" : "fp16", E->dialect->name);
        return -1;
    }
    if (E->quant_bits && check_quantize(E, err)) return -1;
    for (int i = 0; i < E->g->n_values && !E->dialect->attention; i++)
        if (ir_op_info_of(V(E, i)->op)->cls == OPC_ATTENTION) {
            fprintf(err, "%s:%d: error: fused attention is built for the C target only\n", E->source_path, V(E, i)->loc.line);
            return -1;
        }
    return 0;
}

/* A section of the file being written, in memory until the file is complete. */
typedef struct section {
    char *text;
    size_t size;
} section;

static int section_open(cg_writer *w, section *sec) {
    sec->text = NULL;
    sec->size = 0;
    FILE *f = open_memstream(&sec->text, &sec->size);
    *w = (cg_writer){.f = f};
    return f ? 0 : -1;
}

/* The text of one file, rendered in memory: the source is three sections, head (includes,
 * the context), kernels (the dialect's) and body (host functions); a header is one. */
static int render_file(emitter *E, void (*head)(emitter *), void (*body)(emitter *), char **text, size_t *len) {
    section sec[3] = {{0}};
    int failed = section_open(&E->w, &sec[0]);
    if (!failed) head(E);
    if (!failed && fclose(E->w.f) != 0) failed = 1;
    E->w.f = NULL;
    if (!failed && body) {
        failed = section_open(&E->kernels, &sec[1]) || section_open(&E->w, &sec[2]);
        E->w.kernels = &E->kernels;
        outline_free(E); /* the helpers written are this file's */
        if (!failed) body(E);
        if (E->dialect->finish) E->dialect->finish(&E->w);
        if (E->kernels.f && fclose(E->kernels.f) != 0) failed = 1;
        if (E->w.f && fclose(E->w.f) != 0) failed = 1;
    }
    E->w = (cg_writer){0};
    E->kernels = (cg_writer){0};
    FILE *f = failed ? NULL : open_memstream(text, len);
    if (!f) failed = 1;
    for (int i = 0; f && i < (body ? 3 : 1); i++) {
        if (i == 1 && sec[1].size) fputs("\n/* ---- kernels ---- */\n\n", f);
        if (sec[i].size && fwrite(sec[i].text, 1, sec[i].size, f) != sec[i].size) failed = 1;
    }
    if (f && fclose(f) != 0) failed = 1;
    for (int i = 0; i < 3; i++) free(sec[i].text);
    return failed ? -1 : 0;
}

/* One file of the pair written whole under a temporary name beside it (created new, so no
 * other file is written through), flushed to the disk; renamed into place by the caller. */
typedef struct out_file {
    char path[4096], tmp[4200];
    char *text;
    size_t len;
    int written; /* the temporary holds the text */
} out_file;

static int write_temporary(out_file *o, FILE *err) {
    static int serial;
    int n = snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld.%d", o->path, (long)getpid(), serial++);
    int fd = n > 0 && (size_t)n < sizeof o->tmp ? open(o->tmp, O_WRONLY | O_CREAT | O_EXCL, 0666) : -1;
    int failed = fd < 0;
    /* a file replaced keeps its permissions (a group-readable pair stays so) */
    struct stat old;
    if (!failed && stat(o->path, &old) == 0 && fchmod(fd, old.st_mode & 07777) != 0) failed = 1;
    for (size_t done = 0; !failed && done < o->len;) {
        ssize_t n = write(fd, o->text + done, o->len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) failed = 1;
        else done += (size_t)n;
    }
    if (!failed && fsync(fd) != 0) failed = 1;
    int saved = errno;
    if (fd >= 0 && close(fd) != 0 && !failed) failed = 1, saved = errno;
    if (failed) {
        fprintf(err, "dmc: error: cannot write %s: %s\n", o->path, strerror(saved));
        if (fd >= 0) unlink(o->tmp);
        return -1;
    }
    o->written = 1;
    return 0;
}

/* Writes the header and the source as a pair: both are rendered and written to temporaries
 * first, and only when both are whole are they renamed into place, so that a failed run (a
 * full disk, an emitter error) leaves the previous pair as it was, never a new header beside
 * an old source. */
static int write_pair(emitter *E, const char *dir, const char *header, const char *source, FILE *err) {
    out_file files[2];
    memset(files, 0, sizeof files);
    snprintf(files[0].path, sizeof files[0].path, "%s/%s", dir, header);
    snprintf(files[1].path, sizeof files[1].path, "%s/%s", dir, source);
    int failed = render_file(E, emit_header, NULL, &files[0].text, &files[0].len) ||
                 render_file(E, emit_source_head, emit_source_body, &files[1].text, &files[1].len);
    if (failed) fprintf(err, "dmc: error: cannot render %s: %s\n", files[1].path, strerror(errno));
    /* what a rename cannot replace is refused before either file changes */
    for (int i = 0; i < 2 && !failed; i++) {
        struct stat st;
        if (stat(files[i].path, &st) == 0 && !S_ISREG(st.st_mode)) {
            fprintf(err, "dmc: error: cannot write %s: not a regular file\n", files[i].path);
            failed = 1;
        }
    }
    for (int i = 0; i < 2 && !failed; i++) failed = write_temporary(&files[i], err);
    for (int i = 0; i < 2 && !failed; i++)
        if (rename(files[i].tmp, files[i].path) != 0) {
            fprintf(err, "dmc: error: cannot write %s: %s\n", files[i].path, strerror(errno));
            failed = 1;
        } else {
            files[i].written = 0;
        }
    for (int i = 0; i < 2; i++) {
        if (files[i].written) unlink(files[i].tmp);
        free(files[i].text);
    }
    return failed ? -1 : 0;
}

int codegen_target_known(const char *name) { return cg_dialect_find(name) != NULL; }

/* The target's capabilities (the default target's when target is NULL); none for an
 * unknown target. */
static cg_capabilities capabilities_of(const char *target) {
    const cg_dialect *d = cg_dialect_find(target ? target : "c");
    return d ? d->can : (cg_capabilities){0};
}

/* Whether the target has attention kernels at all (the fusion's precondition). */
static int has_attention(const char *target) {
    const cg_dialect *d = cg_dialect_find(target ? target : "c");
    return d && d->attention;
}

int codegen_fuses_bias(const char *target) { return capabilities_of(target).bias_activation; }
int codegen_flat_update(const char *target) { return capabilities_of(target).flat_update; }
int codegen_narrow_only(const char *target) { return capabilities_of(target).narrow_only; }
int codegen_fuses_casts(const char *target) { return capabilities_of(target).fused_cast; }
int codegen_residual_norms(const char *target) { return capabilities_of(target).residual_norm; }
int codegen_loss_grad_16bit(const char *target) { return capabilities_of(target).loss_grad_16bit; }
int codegen_attention_16bit(const char *target, ir_dtype dtype) {
    cg_capabilities can = capabilities_of(target);
    return has_attention(target) && (dtype == DT_BF16 ? can.attention_bf16 : dtype == DT_F16 && can.attention_f16);
}
int codegen_attention_heads_inner(const char *target) {
    return has_attention(target) && capabilities_of(target).attention_heads_inner;
}
int codegen_attention_kv_groups(const char *target) {
    return has_attention(target) && capabilities_of(target).attention_kv_groups;
}
int codegen_fuses_attention(const char *target) { return has_attention(target); }

void codegen_scratch_rules(const char *target, dm_scratch_rules *out) {
    const cg_dialect *d = cg_dialect_find(target ? target : "c");
    if (!d) d = &cg_dialect_c;
    *out = (dm_scratch_rules){.xent_floats = d->xent_scratch_floats, .embed_grad_bytes = d->embed_grad_scratch_bytes,
                              .wgrad_floats = d->wgrad_scratch_floats, .attention_floats = d->attention_scratch_floats};
}

const codegen_toolchain *codegen_toolchain_of(const char *target) {
    const cg_dialect *d = cg_dialect_find(target ? target : "c");
    return &(d ? d : &cg_dialect_c)->toolchain;
}

const char *codegen_source_suffix(const char *target) {
    const cg_dialect *d = cg_dialect_find(target ? target : "c");
    return d ? d->source_suffix : "c";
}

/* Numbers every range check (an embedding's ids, a cross-entropy's targets: its
 * statistics) from 1. */
static void number_faults(emitter *E) {
    E->fault_site = calloc((size_t)E->g->n_values + 1, sizeof(int));
    if (!E->fault_site) abort();
    for (int i = 0; i < E->g->n_values; i++)
        if (V(E, i)->op == OP_EMBED || V(E, i)->op == OP_XENT_STATS) E->fault_site[i] = ++E->n_faults;
}

/* Everything codegen_write decides before it writes: E set up for g and its plans. 0, or
 * -1 after a message (an unknown target). */
static int emitter_open(emitter *E, const ir_graph *g, const codegen_plans *plans, const char *source_path,
                        const char *source_text, size_t source_len, const codegen_options *options, FILE *err) {
    const char *base = strrchr(source_path, '/');
    const cg_dialect *dialect = cg_dialect_find(options && options->target ? options->target : "c");
    if (!dialect) {
        fprintf(err, "dmc: error: unknown target '%s'\n", options->target);
        return -1;
    }
    *E = (emitter){.g = g, .plan = plans->memory, .dialect = dialect, .source_path = base ? base + 1 : source_path,
                   .source_text = source_text, .source_len = source_len,
                   .tf32 = options && options->tf32,
                   .quant_bits = options ? options->quantize_bits : 0, .quant_group = options ? options->quantize_group : 0,
                   .quant_act = options && options->quantize_activations, .on_fail = "return device_failed(ctx);", .cur_stage = -1};
    size_t n = 0;
    for (const char *p = g->model; *p && n + 1 < sizeof E->prefix_upper; p++) E->prefix_upper[n++] = (char)toupper((unsigned char)*p);
    E->prefix_upper[n] = 0;
    E->line_start = malloc((source_len + 2) * sizeof(size_t));
    if (!E->line_start) abort();
    E->line_start[E->n_lines++] = 0;
    for (size_t i = 0; i < source_len; i++)
        if (source_text[i] == '\n') E->line_start[E->n_lines++] = i + 1;
    assign_names(E);
    E->local = malloc(((size_t)g->n_values + 1) * sizeof *E->local);
    if (!E->local) abort();
    for (int i = 0; i < g->n_values; i++) {
        E->local[i] = ir_local_type(g, &g->values[i]->type);
    }
    E->partitioned = ir_is_partitioned(g);
    E->arena_var = "ctx->arena";
    E->pipe_axis = ir_pipeline_axis(g);
    E->ranks = E->pipe_axis >= 0 ? (int)g->axes[E->pipe_axis].size : 1;
    E->chunks = plans->pipeline && plans->pipeline->chunks > 1 ? plans->pipeline->chunks : 1;
    E->stages = E->ranks * E->chunks;
    E->scheduled = ir_is_scheduled(g);
    if (plans->pipeline && plans->pipeline->timed.actions) E->predicted = plans->pipeline;
    if (E->pipe_axis >= 0) E->partitioned = 1;
    if (E->scheduled) {
        E->sched = &plans->pipeline->schedule;
        E->needed_on = plans->pipeline->readers;
        E->slots = calloc((size_t)E->stages, sizeof(int));
        if (!E->slots) abort();
        for (int st = 0; st < E->stages; st++) E->slots[st] = plans->pipeline->stage[st].in_flight;
    }
    E->summed = dm_summed_partials(g);
    if (plans->bias && plans->bias->activation_of && dialect->can.bias_activation) {
        E->activation_of_bias = plans->bias->activation_of;
    } else {
        int *none = malloc(((size_t)g->n_values + 1) * sizeof(int));
        if (!none) abort();
        for (int i = 0; i < g->n_values; i++) none[i] = -1;
        E->activation_of_bias = E->no_bias_activations = none;
    }
    E->bucket_lead = plans->buckets->lead;
    E->bucket_ready = plans->buckets->ready;
    static const dm_zero_plan no_zero = {0};
    E->zero = plans->zero ? plans->zero : &no_zero;
    static const dm_compress_plan no_compress = {0};
    E->compress = plans->compress ? plans->compress : &no_compress;
    cg_index_readers(E);
    number_faults(E);
    predict_mark(E);
    quant_mark(E);
    cg_mark_copy_alone(E);
    cg_plan_flat_update(E);
    E->scratch_elems = plans->memory->scratch_elems;
    return 0;
}

/* What codegen refuses for E's program and dialect: 0, or -1 after the messages. */
static int emitter_check(emitter *E, FILE *err) {
    int status = check_spmd(E, err) || check_target(E, err) || check_prune(E, err) ? -1 : 0;
    if (!status) status = emit_dropout_prepare(E, err);
    return status;
}

static void emitter_close(emitter *E) {
    free(E->local);
    free(E->slots);
    free(E->summed);
    free(E->no_bias_activations);
    free(E->copy_alone);
    free(E->reader_at);
    free(E->reader_ids);
    free(E->reads);
    free(E->fault_site);
    free(E->for_outputs);
    free(E->quant_slot);
    free(E->quant_param);
    free(E->quant_transposed);
    free(E->quant_narrow);
    outline_free(E);
    for (int i = 0; i < E->g->n_values; i++) free(E->cname[i]);
    free(E->cname);
    free(E->line_start);
}

int codegen_check(const ir_graph *g, const codegen_plans *plans, const char *source_path, const codegen_options *options,
                  FILE *err) {
    emitter E;
    if (emitter_open(&E, g, plans, source_path, "", 0, options, err)) return -1;
    int status = emitter_check(&E, err);
    emitter_close(&E);
    return status;
}

int codegen_write(const ir_graph *g, const codegen_plans *plans, const char *source_path, const char *source_text,
                  size_t source_len, const codegen_options *options, const char *out_dir, FILE *err) {
    emitter E;
    if (emitter_open(&E, g, plans, source_path, source_text, source_len, options, err)) return -1;
    int status = emitter_check(&E, err);
    char h[300], c[300];
    snprintf(h, sizeof h, "%s.h", g->model);
    snprintf(c, sizeof c, "%s.%s", g->model, E.dialect->source_suffix);
    if (!status) status = write_pair(&E, out_dir, h, c, err);
    emitter_close(&E);
    return status;
}
