/* dmc: the driver. A flat list of the passes (DESIGN.md), and `dmc run`, which builds
 * the generated code with the system C compiler and trains it: the command line is
 * args.c's, the build toolchain.c's, the processes and the build directory
 * supervise.c's. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "ast.h"
#include "calibrate.h"
#include "codegen.h"
#include "compact_io.h"
#include "compile.h"
#include "distill.h"
#include "explain.h"
#include "hardware.h"
#include "lower.h"
#include "passes.h"
#include "plan.h"
#include "supervise.h"
#include "toolchain.h"

/* The largest gradient bucket in floats (0: the default; a size under one float: 1). */
static int64_t bucket_floats(const dm_options *o) {
    return o->bucket_bytes / 4 > 0 ? o->bucket_bytes / 4 : o->bucket_bytes > 0 ? 1 : 0;
}

/* Attention is fused where the target has the kernel, unless --no-fuse-attention. */
static int fuses_attention(const dm_options *o) { return !o->no_fuse_attention && codegen_fuses_attention(o->codegen.target); }

static dm_lower_options lower_options(const dm_options *o, const char *model) {
    return (dm_lower_options){.model = model, .dims = (dm_override *)o->dims, .n_dims = o->n_dims,
                              .mesh = (dm_override *)o->mesh, .n_mesh = o->n_mesh, .microbatches = o->microbatches,
                              .schedule = o->schedule, .chunks = o->chunks, .zero = o->zero,
                              .recompute = o->recompute, .fuse_attention = fuses_attention(o), .compress = o->compress,
                              .constants_every_step = o->no_hoist_constants,
                              .sequence_parallel = o->sequence_parallel, .param_servers = o->param_servers};
}

/* --plan: prints the plans; --mesh auto: puts the best one's choices into o (and says
 * which on stderr). Returns 0, or 1 after an error. */
static int plan(dm_options *o, const dm_program *prog, const dm_source *src, const char *model) {
    dm_plan_request req = {.prog = prog, .src = src, .model = model, .dims = o->dims, .n_dims = o->n_dims,
                           .devices = o->devices, .global_batch = o->global_batch, .pipeline = &o->pipeline,
                           .precision_given = o->precision_given,
                           .bucket_floats = bucket_floats(o), .target = o->codegen.target, .exhaustive = o->plan_whole,
                           .fuse_attention = fuses_attention(o)};
    dm_plan_result r;
    if (dm_plan_search(&req, &r, stderr)) return 1;
    int status = 0;
    if (o->plan) {
        dm_plan_print(&req, &r, o->top >= 0 ? o->top : 5, o->plan == 2, stdout);
    } else if (r.n_fit == 0) {
        fprintf(stderr, "dmc: error: --mesh auto: no plan of %lld devices fits (dmc --plan lists them)\n",
                (long long)o->devices);
        status = 1;
    } else {
        const dm_plan_choice *best = &r.plans[0];
        char text[256];
        dm_plan_options_text(best, text, sizeof text);
        fprintf(stderr, "dmc: --mesh auto: %s (predicted step %.3f ms; dmc --plan lists the others)\n", text,
                best->step_seconds * 1e3);
        /* o->mesh is empty here (args.c refuses --mesh beside --mesh auto): room for 3 axes */
        for (int a = 0; a < 3 && o->n_mesh < IR_MAX_AXES; a++)
            if (r.has_axis[a])
                o->mesh[o->n_mesh++] = (dm_override){.name = strdup(dm_plan_axes[a]), .value = best->mesh[a]};
        o->microbatches = best->microbatches;
        o->schedule = best->schedule;
        o->zero = best->zero;
        o->recompute = best->recompute;
        /* the batch the plan was made for (plan.c refuses a --set of it; args.c keeps a slot) */
        if (o->global_batch && o->n_dims < DM_MAX_DIMS)
            o->dims[o->n_dims++] = (dm_override){.name = strdup(r.batch_dim), .value = o->global_batch};
    }
    dm_plan_result_free(&r);
    return status;
}

/* Builds the program and trains it: its status (see toolchain.h). */
static int build_and_run(const dm_options *o, const ir_graph *g, const dm_teacher_link *teacher, const char *dir) {
    char exe[PATH_MAX];
    int status = dm_build(o, g, teacher, dir, exe);
    return status != 0 ? status : dm_run_trainer(o, g, exe);
}

/* The passes, from the parsed program to the plans: 0, or 1 after errors. */
/* With --teacher, the student's loss is distillation's and the teacher is compiled into
 * *teacher (driver/distill.c). */
/* With --compact, compaction holds the pruned file's tensors, and gets the compacted ones. */
static int compile(const dm_options *o, const dm_program *prog, dm_diag *diag, const char *model, dm_compiled *c,
                   dm_teacher *teacher, dm_compaction *compaction) {
    dm_lower_options lo = lower_options(o, model);
    dm_compile_request req = {.lower = &lo, .pipeline = &o->pipeline, .bucket_floats = bucket_floats(o),
                              .target = o->codegen.target, .stop_after = o->stop_after, .plan_memory = !o->emit,
                              .precision_given = o->precision_given, .no_fuse_casts = o->no_fuse_casts,
                              .loss_scale = o->loss_scale,
                              .loss_scale_interval = o->loss_scale_interval,
                              .prune = o->prune, .compact = o->compact ? compaction : NULL,
                              .quantize_bits = o->codegen.quantize_bits, .quantize_group = o->codegen.quantize_group,
                              .quantize_activations = o->codegen.quantize_activations,
                              .quantize_embeddings = o->quantize_embeddings};
    int distill = dm_distill_options(o, &req.distill_temperature, &req.distill_alpha);
    if (distill < 0) return 1;
    if (dm_compile(prog, &req, diag, c) != 0) return 1;
    return distill && dm_distill_teacher(o, c->g, &req, teacher) ? 1 : 0;
}

static codegen_plans plans_of(const dm_compiled *c) {
    return (codegen_plans){.memory = &c->memory, .pipeline = &c->pipeline, .buckets = &c->buckets, .zero = &c->zero,
                           .compress = &c->compress, .bias = &c->bias};
}

/* --check: what -o would refuse, refused with the same messages (codegen_check), once the
 * plans are made (not after --stop-after). */
static int check(const dm_options *o, const dm_compiled *c) {
    if (!c->planned) return 0;
    codegen_plans plans = plans_of(c);
    return codegen_check(c->g, &plans, o->input, &o->codegen, stderr) ? 1 : 0;
}

/* -o DIR and dmc run: the code written into DIR, --keep DIR or a temporary directory
 * (removed at the end, also when dmc is killed: supervise.h), then built and trained. */
/* --compact: the compacted weights written to --save-compacted's path or dir's
 * compacted.safetensors (the path into path): 0, or 1 after a message. */
static int save_compacted(const dm_options *o, const dm_compaction *compaction, const char *dir, char *path) {
    int n = o->save_compacted ? snprintf(path, PATH_MAX, "%s", o->save_compacted)
                              : snprintf(path, PATH_MAX, "%.*s/compacted.safetensors", PATH_MAX - 32, dir);
    if (n < 0 || n >= PATH_MAX) {
        fprintf(stderr, "dmc: error: --save-compacted: the path is too long\n");
        return 1;
    }
    /* the pruned weights stay: compacting is not undone */
    struct stat in, out;
    if (stat(o->compact, &in) == 0 && stat(path, &out) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino) {
        fprintf(stderr, "dmc: error: --save-compacted %s is the --compact file: the compacted weights would replace the "
                        "pruned ones (give --save-compacted another file)\n", path);
        return 1;
    }
    return dm_compact_save(compaction, path);
}

static int generate(const dm_options *o, const dm_compiled *c, const dm_source *src, const dm_teacher *teacher,
                    const dm_compaction *compaction) {
    const char *given = o->out_dir ? o->out_dir : o->keep_dir;
    char dir[PATH_MAX];
    if (o->run) dm_pass_on_signals(); /* from here on there is a directory to remove */
    if (dm_make_dir(given, dir)) return 1;
    if (o->run) dm_watch_start(dir, !given);
    codegen_plans plans = plans_of(c);
    int status = codegen_write(c->g, &plans, o->input, src->text, src->len, &o->codegen, dir, stderr) ? 1 : 0;
    const dm_teacher_link *link = teacher->link.model ? &teacher->link : NULL;
    if (status == 0 && link) {
        codegen_plans teacher_plans = plans_of(&teacher->compiled);
        status = codegen_write(teacher->compiled.g, &teacher_plans, o->teacher, teacher->src.text, teacher->src.len,
                               &o->codegen, dir, stderr) ? 1 : 0;
    }
    char compacted[PATH_MAX];
    dm_options with_init = *o;
    if (status == 0 && o->compact) {
        status = save_compacted(o, compaction, dir, compacted);
        with_init.compacted_init = compacted;
    }
    if (status == 0 && o->run) {
        status = build_and_run(&with_init, c->g, link, dir);
        /* a build the signal ended reports that, not a failure of its own */
        if (dm_stop_signal() && status == 1) status = 128 + dm_stop_signal();
    }
    if (!given) dm_remove_tree(dir);
    if (o->run) dm_watch_end();
    return status;
}

/* What the compiled program is for: --emit=ir, --explain, --check, or code (-o, dmc run). */
static int output(const dm_options *o, const dm_compiled *c, const dm_source *src, const dm_teacher *teacher,
                  const dm_compaction *compaction) {
    if (o->emit) {
        ir_print(c->g, stdout);
        return 0;
    }
    if (o->explain) {
        if (o->explain - 1 != EXPLAIN_JSON) explain_compaction_text(compaction, stdout);
        explain_print(c->g, &c->memory, &c->reshards, &c->pipeline, &c->zero, o->input, (explain_format)(o->explain - 1),
                      stdout);
        return 0;
    }
    return o->check ? check(o, c) : generate(o, c, src, teacher, compaction);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "calibrate") == 0) return dm_calibrate_main(argc - 1, argv + 1);
    dm_options o;
    char model[256];
    if (dm_parse_args(argc, argv, &o) || dm_resolve_precision(&o) || dm_model_name(&o, model, sizeof model)) {
        dm_options_free(&o);
        return 2;
    }
    dm_source src;
    if (dm_source_read(&src, o.input, stderr)) {
        dm_options_free(&o);
        return 1;
    }
    dm_diag diag;
    dm_diag_init(&diag, &src, stderr);
    dm_program *prog = dm_parse(&diag);
    int status = diag.n_errors ? 1 : 0;
    /* --plan prints plans and is done; --mesh auto puts the best one's choices into o */
    if (status == 0 && (o.plan || o.mesh_auto)) status = plan(&o, prog, &src, model);
    dm_compiled c = {0};
    dm_teacher teacher = {0};
    dm_compaction compaction = {0};
    dm_compact_input *pruned = NULL;
    if (status == 0 && o.compact && !(pruned = dm_compact_open(o.compact, &compaction))) status = 1;
    if (status == 0 && !o.plan) status = compile(&o, prog, &diag, model, &c, &teacher, &compaction);
    dm_diag_finish(&diag);
    dm_program_free(prog);
    if (status == 0 && !o.plan) status = output(&o, &c, &src, &teacher, &compaction);
    dm_compaction_free(&compaction);
    dm_compact_close(pruned);
    dm_teacher_free(&teacher);
    dm_compiled_free(&c);
    dm_source_free(&src);
    dm_options_free(&o);
    /* --explain, --emit and --plan write to stdout: a full disk or a closed pipe there is a
     * failure, not a truncated plan reported as success */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "dmc: error: writing to standard output: %s\n", strerror(errno));
        if (status == 0) status = 1;
    }
    return status;
}
