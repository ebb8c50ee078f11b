/* distill.c: the trainer of a distilled student (dmrt_distill_main, dmc run --teacher).
 *
 * The student was compiled with one input more than its data has, teacher_logits (its
 * last), and its loss made distillation's (passes/distill.c). The trainer is the generic
 * one (dmrt_trainer_main) on a copy of the student's descriptor that hides that input and
 * whose create, forward and train_step also hold and run the teacher: each step the
 * teacher's forward runs on the step's whole batch (no gradients, no optimizer state) and
 * its logits output becomes the student's teacher_logits, which a data-parallel student
 * splits over its ranks as it splits its other inputs. Each rank (a thread of the threads
 * backend) has a teacher context of its own, so the teacher's forward is repeated on every
 * rank: the teacher is a serial program. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt.h"

enum { MAX_CONTEXTS = 1024, MAX_INPUTS = 64 };

/* Which teacher context goes with which student context (one pair per rank). */
typedef struct pair {
    void *student, *teacher;
} pair;

static struct {
    const dmrt_model *student, *teacher;
    int logits_output;
    const char *init;                 /* --teacher-init */
    int teacher_input[MAX_INPUTS];    /* the student input feeding each teacher input */
    pthread_mutex_t lock;
    pair pairs[MAX_CONTEXTS];
    int n_pairs;
    dmrt_model wrapped;
} D = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *teacher_of(void *student) {
    void *t = NULL;
    pthread_mutex_lock(&D.lock);
    for (int i = 0; i < D.n_pairs; i++)
        if (D.pairs[i].student == student) t = D.pairs[i].teacher;
    pthread_mutex_unlock(&D.lock);
    return t;
}

/* The teacher of a new student context, its weights from --teacher-init; NULL (student
 * destroyed, message in err) when it cannot be made. */
static void *with_teacher(void *student, uint64_t seed, char *err, size_t errlen) {
    if (!student) return NULL;
    void *t = D.teacher->create(seed, err, errlen);
    if (t && dmrt_load_params(D.teacher, t, D.init, err, errlen) != 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errlen, "--teacher-init: %s", why);
        D.teacher->destroy(t);
        t = NULL;
    }
    pthread_mutex_lock(&D.lock);
    if (t && D.n_pairs == MAX_CONTEXTS) {
        snprintf(err, errlen, "distillation: more than %d model contexts", MAX_CONTEXTS);
        D.teacher->destroy(t);
        t = NULL;
    }
    if (t) D.pairs[D.n_pairs++] = (pair){student, t};
    pthread_mutex_unlock(&D.lock);
    if (!t) D.student->destroy(student);
    return t ? student : NULL;
}

static void *create(uint64_t seed, char *err, size_t errlen) {
    return with_teacher(D.student->create(seed, err, errlen), seed, err, errlen);
}

static void *create_rank(uint64_t seed, dmrt_rank *rank, char *err, size_t errlen) {
    return with_teacher(D.student->create_rank(seed, rank, err, errlen), seed, err, errlen);
}

static void destroy(void *student) {
    pthread_mutex_lock(&D.lock);
    for (int i = 0; i < D.n_pairs; i++)
        if (D.pairs[i].student == student) {
            D.teacher->destroy(D.pairs[i].teacher);
            D.pairs[i] = D.pairs[--D.n_pairs];
            break;
        }
    pthread_mutex_unlock(&D.lock);
    D.student->destroy(student);
}

/* The student's inputs with teacher_logits from the teacher's forward on the same batch. */
static int with_teacher_logits(void *student, const void *const *inputs, const void **all) {
    void *t = teacher_of(student);
    const void *tin[MAX_INPUTS];
    for (int i = 0; i < D.teacher->n_inputs; i++) tin[i] = inputs[D.teacher_input[i]];
    float teacher_loss;
    if (!t || D.teacher->forward(t, tin, &teacher_loss) != 0) return -1;
    int n = D.wrapped.n_inputs;
    memcpy(all, inputs, (size_t)n * sizeof *all);
    all[n] = D.teacher->output(t, D.logits_output);
    return 0;
}

static int forward(void *ctx, const void *const *inputs, float *loss) {
    const void *all[MAX_INPUTS + 1];
    if (with_teacher_logits(ctx, inputs, all) != 0) return DMRT_ERR_DATA; /* the teacher failed: its batch */
    return D.student->forward(ctx, all, loss);
}

static int train_step(void *ctx, const void *const *inputs, float *loss) {
    const void *all[MAX_INPUTS + 1];
    if (with_teacher_logits(ctx, inputs, all) != 0) return DMRT_ERR_DATA; /* the teacher failed: its batch */
    return D.student->train_step(ctx, all, loss);
}

/* The teacher's inputs among the student's, by name (dmc checked that they are there). */
static int map_inputs(void) {
    if (D.teacher->n_inputs > MAX_INPUTS || D.student->n_inputs > MAX_INPUTS) return -1;
    for (int i = 0; i < D.teacher->n_inputs; i++) {
        D.teacher_input[i] = -1;
        for (int k = 0; k < D.wrapped.n_inputs; k++)
            if (strcmp(D.student->inputs[k].name, D.teacher->inputs[i].name) == 0) D.teacher_input[i] = k;
        if (D.teacher_input[i] < 0) return -1;
    }
    return 0;
}

int dmrt_distill_main(const dmrt_model *student, const dmrt_model *teacher, int logits_output, int argc, char **argv) {
    /* dmc run passes --teacher-init FILE first */
    if (argc < 3 || strcmp(argv[1], "--teacher-init") != 0) {
        fprintf(stderr, "%s: a distilled student runs as %s --teacher-init TEACHER.safetensors [trainer options]\n",
                argv[0], argv[0]);
        return 2;
    }
    D.student = student;
    D.teacher = teacher;
    D.logits_output = logits_output;
    D.init = argv[2];
    D.wrapped = *student;
    D.wrapped.n_inputs = student->n_inputs - 1; /* teacher_logits, the last, is the teacher's */
    D.wrapped.create = student->create ? create : NULL;
    D.wrapped.create_rank = student->create_rank ? create_rank : NULL;
    D.wrapped.destroy = destroy;
    D.wrapped.forward = forward;
    D.wrapped.train_step = train_step;
    if (map_inputs() != 0 || strcmp(student->inputs[student->n_inputs - 1].name, "teacher_logits") != 0) {
        fprintf(stderr, "%s: model '%s' was not compiled to distill model '%s'\n", argv[0], student->name, teacher->name);
        return 2;
    }
    argv[2] = argv[0];
    return dmrt_trainer_main(&D.wrapped, argc - 2, argv + 2);
}
