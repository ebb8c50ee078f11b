/* distill.h: dmc run --teacher, knowledge distillation (docs/compression.md). */
#ifndef DM_DISTILL_H
#define DM_DISTILL_H

#include "args.h"
#include "compile.h"
#include "diag.h"
#include "toolchain.h"

/* The teacher, compiled and checked against the student. */
typedef struct dm_teacher {
    char model[300];          /* teacher_<student's model>: its generated module's prefix */
    dm_source src;
    int has_src;
    dm_compiled compiled;
    dm_teacher_link link;
} dm_teacher;

/* --teacher, --teacher-init, --distill-temperature and --distill-alpha checked: 1 with the
 * temperature and alpha (defaults 4 and 0.5) when distilling, 0 when not, -1 after a
 * message. */
int dm_distill_options(const dm_options *o, double *temperature, double *alpha);

/* The teacher of o->teacher compiled (base's target and pipeline options; its own dims and
 * mesh) and checked against the student compiled for distillation (its last input the
 * teacher's logits): 0, or -1 after a message. Free out with dm_teacher_free either way. */
int dm_distill_teacher(const dm_options *o, const ir_graph *student, const dm_compile_request *base, dm_teacher *out);
void dm_teacher_free(dm_teacher *t);

#endif
