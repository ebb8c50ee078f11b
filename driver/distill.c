/* distill.c: dmc run --teacher (distill.h): the options, the teacher compiled as a module
 * of its own, and the checks that it fits the student.
 *
 * The teacher is compiled as written (its own dims and mesh; a serial program; its batch
 * dim set to the student's rows, on a student of N data ranks and M micro-batches those of
 * one rank and micro-batch, which each rank's teacher runs on), named
 * teacher_<student> so that its symbols are not the student's, and linked beside the
 * student; runtime/distill.c runs its forward on every step's batch. Everything is checked
 * before a file is written. */
#include "distill.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ast.h"
#include "passes.h"

#define DEFAULT_TEMPERATURE 4.0
#define DEFAULT_ALPHA 0.5

static int number(const char *option, const char *text, double fallback, double *out) {
    if (!text) {
        *out = fallback;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    *out = strtod(text, &end);
    if (!end || end == text || *end || errno) {
        fprintf(stderr, "dmc: error: %s takes a number, got '%s'\n", option, text);
        return -1;
    }
    return 0;
}

int dm_distill_options(const dm_options *o, double *temperature, double *alpha) {
    *temperature = 0;
    *alpha = 0;
    if (!o->teacher) {
        const char *given = o->teacher_init ? "--teacher-init" : o->distill_temperature ? "--distill-temperature"
                            : o->distill_alpha ? "--distill-alpha" : NULL;
        if (!given) return 0;
        fprintf(stderr, "dmc: error: %s needs --teacher TEACHER.dm\n", given);
        return -1;
    }
    double t, a;
    if (number("--distill-temperature", o->distill_temperature, DEFAULT_TEMPERATURE, &t) ||
        number("--distill-alpha", o->distill_alpha, DEFAULT_ALPHA, &a))
        return -1;
    if (!(t > 0) || t > 1e6) {
        fprintf(stderr, "dmc: error: --distill-temperature must be a number > 0, got %s\n", o->distill_temperature);
        return -1;
    }
    if (!(a >= 0 && a <= 1)) {
        fprintf(stderr, "dmc: error: --distill-alpha must be in [0, 1], got %s\n", o->distill_alpha);
        return -1;
    }
    if (!o->teacher_init) {
        fprintf(stderr, "dmc: error: --teacher needs --teacher-init FILE.safetensors, the teacher's weights\n");
        return -1;
    }
    if (access(o->teacher_init, R_OK) != 0) {
        fprintf(stderr, "dmc: error: --teacher-init %s: %s\n", o->teacher_init, strerror(errno));
        return -1;
    }
    if (o->backend && strcmp(o->backend, "mpi") == 0) {
        fprintf(stderr, "dmc: error: --teacher: distillation runs with --backend threads only, not mpi\n");
        return -1;
    }
    *temperature = t;
    *alpha = a;
    return 1;
}

/* The student's mesh: any of data, tensor and pipeline axes, micro-batches; not parameter
 * servers (their ranks hold no batch). On every target: each rank's teacher is created
 * beside its rank (on its device). */
static int check_student(const ir_graph *g, const char *path) {
    if (g->param_servers.servers > 0) {
        fprintf(stderr, "dmc: error: --teacher: %s uses parameter servers, which distillation does not support\n", path);
        return -1;
    }
    return 0;
}

static void shape_text(const ir_type *t, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "%s[", ir_dtype_name(t->dtype));
    for (int d = 0; d < t->rank && n < len; d++) n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (n < len) snprintf(buf + n, len - n, "]");
}

static int same_shape(const ir_type *a, const ir_type *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) return 0;
    for (int d = 0; d < a->rank; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

/* The student's ranks along its data axis (1: serial). */
static int64_t data_parts(const ir_graph *g) {
    for (int k = 0; k < g->n_axes; k++)
        if (strcmp(g->axes[k].name, "data") == 0) return g->axes[k].size;
    return 1;
}

/* What one of `parts` data ranks holds of a micro-batch of a student tensor split over data
 * on its leading dim (the IR's types are a micro-batch's; the whole micro-batch when parts
 * is 1): the rows a teacher's forward runs on. NULL when it is not split so. */
static const ir_type *rank_part(const ir_graph *g, const ir_type *t, int64_t parts, ir_type *out) {
    *out = *t;
    if (parts == 1) return out;
    if (t->rank == 0 || t->split[0] < 0 || strcmp(g->axes[t->split[0]].name, "data") != 0) return NULL;
    out->shape[0] /= parts;
    return out;
}

/* The teacher against the student: a serial program, its logits an output shaped as the
 * student's (a data rank's rows of them), each of its inputs one of the student's. Returns
 * the logits' output index. */
static int check_teacher(const ir_graph *t, const ir_graph *s, const char *path, const char *student_path) {
    char a[128], b[128];
    int64_t parts = data_parts(s);
    ir_type part;
    const char *per_rank = parts > 1 ? (s->microbatches > 1 ? " (a data rank's rows of a micro-batch)" : " (a data rank's rows)")
                           : s->microbatches > 1 ? " (a micro-batch's rows)" : "";
    if (ir_mesh_ranks(t) > 1 || t->microbatches > 1) {
        fprintf(stderr, "dmc: error: --teacher %s: the teacher must be a serial program (its mesh has %lld ranks%s)\n",
                path, (long long)ir_mesh_ranks(t), t->microbatches > 1 ? ", and micro-batches" : "");
        return -1;
    }
    int tl = distill_loss_logits(t), output = -1;
    if (tl < 0) {
        fprintf(stderr, "dmc: error: --teacher %s: the teacher's loss is not cross_entropy(logits, targets), so it has "
                        "no logits to distill\n", path);
        return -1;
    }
    for (int i = 0; i < t->n_outputs; i++)
        if (t->outputs[i] == tl) output = i;
    const ir_value *tv = t->values[tl], *sv = s->values[s->inputs[s->n_inputs - 1]];
    if (output < 0) {
        fprintf(stderr, "dmc: error: --teacher %s: the teacher's logits %s are not an output (add `output %s`)\n", path,
                tv->name ? tv->name : "", tv->name ? tv->name : "logits");
        return -1;
    }
    if (!rank_part(s, &sv->type, parts, &part)) {
        fprintf(stderr, "dmc: error: --teacher: the student's (%s) logits are not split over data by rows\n", student_path);
        return -1;
    }
    if (!same_shape(&tv->type, &part)) {
        shape_text(&tv->type, a, sizeof a);
        shape_text(&part, b, sizeof b);
        fprintf(stderr, "dmc: error: --teacher %s: the teacher's logits are %s, the student's (%s) %s%s: they must match "
                        "(the same batch and classes)\n", path, a, student_path, b, per_rank);
        return -1;
    }
    for (int i = 0; i < t->n_inputs; i++) {
        const ir_value *ti = t->values[t->inputs[i]], *match = NULL;
        for (int k = 0; k + 1 < s->n_inputs; k++)
            if (strcmp(s->values[s->inputs[k]]->name, ti->name) == 0) match = s->values[s->inputs[k]];
        if (!match) {
            fprintf(stderr, "dmc: error: --teacher %s: the teacher's input %s is not an input of the student (%s)\n",
                    path, ti->name, student_path);
            return -1;
        }
        if (!rank_part(s, &match->type, parts, &part)) {
            fprintf(stderr, "dmc: error: --teacher: the student's (%s) input %s is not split over data by rows\n",
                    student_path, ti->name);
            return -1;
        }
        if (!same_shape(&ti->type, &part)) {
            shape_text(&ti->type, a, sizeof a);
            shape_text(&part, b, sizeof b);
            fprintf(stderr, "dmc: error: --teacher %s: the teacher's input %s is %s, the student's %s%s: they must "
                            "match\n", path, ti->name, a, b, per_rank);
            return -1;
        }
    }
    return output;
}

/* The teacher's batch dim (its first input's leading dim, by name) set to a data rank's
 * rows of a micro-batch of the student's: B / (M N), the student's B on a student of one
 * data rank and no micro-batches (serial, or split over tensor or pipeline only). A
 * teacher whose leading dim is not a name is compiled as written where the student is
 * neither data-parallel nor of micro-batches (check_teacher then compares its shapes). 0,
 * or -1 after a message. */
static int teacher_batch(const dm_program *prog, const ir_graph *student, dm_override *out) {
    int64_t parts = data_parts(student);
    const ir_type *logits = &student->values[student->inputs[student->n_inputs - 1]]->type;
    for (int i = 0; i < prog->n_stmts; i++) {
        const dm_stmt *st = prog->stmts[i];
        if (st->kind != STMT_INPUT || !st->type || st->type->rank == 0) continue;
        if (st->type->dims[0]->kind != EXPR_NAME) break;
        *out = (dm_override){.name = st->type->dims[0]->name, .value = logits->shape[0] / parts};
        return 0;
    }
    if (parts == 1 && student->microbatches <= 1) return 0;
    fprintf(stderr, "dmc: error: --teacher: on a data-parallel student or one of micro-batches the teacher runs on "
                    "each rank's rows of a micro-batch, so its first input's leading dim must be a named dim (its "
                    "batch)\n");
    return -1;
}

int dm_distill_teacher(const dm_options *o, const ir_graph *student, const dm_compile_request *base,
                       dm_teacher *out) {
    memset(out, 0, sizeof *out);
    if (check_student(student, o->input)) return -1;
    snprintf(out->model, sizeof out->model, "teacher_%s", student->model);
    if (dm_source_read(&out->src, o->teacher, stderr)) return -1;
    out->has_src = 1;
    dm_diag diag;
    dm_diag_init(&diag, &out->src, stderr);
    dm_program *prog = dm_parse(&diag);
    if (diag.n_errors) {
        dm_program_free(prog);
        return -1;
    }
    /* as written, but for its batch: each data rank's teacher runs on the rank's rows of a
     * micro-batch, the student's batch when serial (the student's --set and --mesh are the
     * student's) */
    dm_override batch = {0};
    if (teacher_batch(prog, student, &batch)) {
        dm_program_free(prog);
        return -1;
    }
    dm_lower_options lo = {.model = out->model, .dims = &batch, .n_dims = batch.name ? 1 : 0, .schedule = -1,
                           .zero = -1, .recompute = RECOMPUTE_MARKED, .fuse_attention = base->lower->fuse_attention};
    dm_compile_request req = *base;
    req.lower = &lo;
    req.distill_temperature = 0;
    req.compact = NULL; /* --compact shrinks the student only */
    req.stop_after = NULL;
    req.plan_memory = 1;
    int status = dm_compile(prog, &req, &diag, &out->compiled);
    dm_diag_finish(&diag);
    dm_program_free(prog);
    if (status) return -1;
    int output = check_teacher(out->compiled.g, student, o->teacher, o->input);
    if (output < 0) return -1;
    int data_axis = -1;
    for (int k = 0; k < student->n_axes; k++)
        if (strcmp(student->axes[k].name, "data") == 0 && student->axes[k].size > 1) data_axis = k;
    out->link = (dm_teacher_link){.model = out->model, .logits_output = output, .parts = (long long)data_parts(student),
                                  .data_axis = data_axis,
                                  .microbatches = student->microbatches > 1 ? student->microbatches : 1};
    return 0;
}

void dm_teacher_free(dm_teacher *t) {
    dm_compiled_free(&t->compiled);
    if (t->has_src) dm_source_free(&t->src);
    memset(t, 0, sizeof *t);
}
