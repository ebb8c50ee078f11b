/* toolchain.h: how `dmc run` builds the generated code and starts it: main.c (the
 * generic trainer of libdmrt on the model), nvcc for --target cuda, the C compiler (cc,
 * $CC, --cc, or mpicc for --backend mpi) with -march (--march) and $DMC_CFLAGS, linked
 * against the runtime (DMC_RUNTIME_DIR, the build tree or the install prefix), then the
 * program, under mpirun for --backend mpi. The processes run under supervise.h. */
#ifndef DMC_TOOLCHAIN_H
#define DMC_TOOLCHAIN_H

#include <limits.h>

#include "args.h"
#include "ir.h"

/* A distillation teacher linked beside the student (driver/distill.c): its generated
 * module's model name (its source dir/<model>.c), the output holding its logits, the
 * student's data ranks (each rank's teacher runs on its rows), their axis' index in the
 * mesh (-1: none) and the student's micro-batches a step. */
typedef struct dm_teacher_link {
    const char *model;
    int logits_output;
    long long parts;
    int data_axis;
    int microbatches;
} dm_teacher_link;

/* Builds g's code, written into dir, into the program exe (dir/<model>), with the teacher's
 * module and runtime/distill.c's trainer when teacher is not NULL: 0, 1 after a message, or
 * 128 + the signal that stopped dmc run before or during the build. */
int dm_build(const dm_options *o, const ir_graph *g, const dm_teacher_link *teacher, const char *dir,
             char exe[PATH_MAX]);
/* Runs exe with the trainer's arguments (under mpirun with -np the ranks of g's mesh and
 * its parameter servers for --backend mpi): its exit status, or 128 + the signal that
 * stopped it or dmc run. */
int dm_run_trainer(const dm_options *o, const ir_graph *g, const char *exe);

#endif
