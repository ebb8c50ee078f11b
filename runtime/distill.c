/* distill.c: the trainer of a distilled student (dmrt_distill_main, dmc run --teacher).
 *
 * The student was compiled with one input more than its data has, teacher_logits (its
 * last), and its loss made distillation's (passes/distill.c). The trainer is the generic
 * one (dmrt_trainer_main) on a copy of the student's descriptor that hides that input and
 * whose create, forward and train_step also hold and run the teacher: each step the
 * teacher's forward runs on the step's batch (no gradients, no optimizer state) and its
 * logits output becomes the student's teacher_logits. Every rank (a thread of the threads
 * backend) has a teacher context of its own, compiled for the rows a data rank reads of one
 * micro-batch (dmc sets its batch dim): a step's batch is M micro-batches of rows, each
 * split into `parts` blocks over the data ranks, so rank r runs the teacher once per
 * micro-batch m, on block m * parts + r of each input, and writes the logits at the same
 * rows of its teacher_logits buffer: the only rows of it that the rank's student reads. On
 * tensor and pipeline axes every rank of a data coordinate runs the teacher on the same
 * rows (its forward is replicated there, not split: the student's code reads the block of
 * teacher_logits its split names, as of any input). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt.h"
#include "dmrt_comm.h"

enum { MAX_CONTEXTS = 1024, MAX_INPUTS = 64 };

/* Which teacher context goes with which student context (one pair per rank). */
typedef struct pair {
    void *student, *teacher;
    int part;        /* the rank's data coordinate (0: serial) */
    float *logits;   /* parts x micro > 1: the whole teacher_logits, the rank's rows written */
} pair;

static struct {
    const dmrt_model *student, *teacher;
    int logits_output;
    long long parts;
    int data_axis;                    /* the student's data axis in the mesh (-1: none) */
    int micro;                        /* the student's micro-batches a step (1: none) */
    const char *init;                 /* --teacher-init */
    int teacher_input[MAX_INPUTS];    /* the student input feeding each teacher input */
    pthread_mutex_t lock;
    pair pairs[MAX_CONTEXTS];
    int n_pairs;
    dmrt_model wrapped;
} D = {.lock = PTHREAD_MUTEX_INITIALIZER};

static pair pair_of(void *student) {
    pair p = {0};
    pthread_mutex_lock(&D.lock);
    for (int i = 0; i < D.n_pairs; i++)
        if (D.pairs[i].student == student) p = D.pairs[i];
    pthread_mutex_unlock(&D.lock);
    return p;
}

/* The teacher of a new student context, its weights from --teacher-init; NULL (student
 * destroyed, message in err) when it cannot be made. It is created beside the student's
 * rank (NULL: serial): on the device the student's context uses (the CUDA target), on the
 * threads a rank here gets, until --threads sets both (set_threads). */
static void *with_teacher(void *student, dmrt_rank *rank, int part, uint64_t seed, char *err, size_t errlen) {
    if (!student) return NULL;
    const dmrt_tensor_desc *whole = &D.student->inputs[D.student->n_inputs - 1];
    const int in_parts = D.parts * D.micro > 1; /* each forward of the teacher writes a block of the input */
    float *logits = in_parts ? calloc((size_t)whole->numel, sizeof *logits) : NULL;
    void *t = NULL;
    if (in_parts && !logits) snprintf(err, errlen, "distillation: out of memory");
    else if (D.teacher->create_beside) t = D.teacher->create_beside(seed, rank, err, errlen);
    else if (!rank) t = D.teacher->create(seed, err, errlen);
    else snprintf(err, errlen, "distillation: teacher '%s' cannot be created beside a rank (no create_beside)", D.teacher->name);
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
    if (t) D.pairs[D.n_pairs++] = (pair){student, t, part, logits};
    pthread_mutex_unlock(&D.lock);
    if (!t) {
        free(logits);
        D.student->destroy(student);
    }
    return t ? student : NULL;
}

static void *create(uint64_t seed, char *err, size_t errlen) {
    return with_teacher(D.student->create(seed, err, errlen), NULL, 0, seed, err, errlen);
}

static void *create_rank(uint64_t seed, dmrt_rank *rank, char *err, size_t errlen) {
    /* the rank's block of rows: its data coordinate (tensor and pipeline ranks of one data
     * coordinate run the same teacher on the same rows) */
    void *student = D.student->create_rank(seed, rank, err, errlen); /* joins the mesh: coordinates known */
    int part = student && D.data_axis >= 0 ? dmrt_mesh_coord(rank, D.data_axis) : 0;
    return with_teacher(student, rank, part, seed, err, errlen);
}

static int set_threads(void *student, int threads) {
    pair p = pair_of(student);
    int status = D.student->set_threads(student, threads);
    if (status == DMRT_OK && p.teacher && D.teacher->set_threads) status = D.teacher->set_threads(p.teacher, threads);
    return status;
}

static void destroy(void *student) {
    pthread_mutex_lock(&D.lock);
    for (int i = 0; i < D.n_pairs; i++)
        if (D.pairs[i].student == student) {
            D.teacher->destroy(D.pairs[i].teacher);
            free(D.pairs[i].logits);
            D.pairs[i] = D.pairs[--D.n_pairs];
            break;
        }
    pthread_mutex_unlock(&D.lock);
    D.student->destroy(student);
}

/* The student's inputs with teacher_logits from the teacher's forward on the same rows: 0,
 * or -1 when the teacher's forward failed (a target outside its classes), all filled
 * still, so that the student's step runs as on the other ranks, which would otherwise wait
 * for this one's collectives; the failure is reported after it (error). */
static int with_teacher_logits(void *student, const void *const *inputs, const void **all) {
    pair p = pair_of(student);
    int failed = 0;
    const float *logits = NULL;
    for (int m = 0; m < D.micro; m++) {
        size_t block = (size_t)m * (size_t)D.parts + (size_t)p.part; /* micro-batch m's rows of this data rank */
        const void *tin[MAX_INPUTS];
        for (int i = 0; i < D.teacher->n_inputs; i++) {
            const dmrt_tensor_desc *part = &D.teacher->inputs[i];
            tin[i] = (const char *)inputs[D.teacher_input[i]] + block * (size_t)part->numel * dmrt_dtype_size(part->dtype);
        }
        float teacher_loss;
        failed |= D.teacher->forward(p.teacher, tin, &teacher_loss) != DMRT_OK;
        logits = D.teacher->output(p.teacher, D.logits_output);
        if (p.logits) {
            int64_t elems = D.teacher->outputs[D.logits_output].numel; /* a block's rows of them */
            memcpy(p.logits + block * (size_t)elems, logits, (size_t)elems * sizeof *logits);
            logits = p.logits;
        }
    }
    int n = D.wrapped.n_inputs;
    memcpy(all, inputs, (size_t)n * sizeof *all);
    all[n] = logits;
    return failed ? -1 : 0;
}

static int forward(void *ctx, const void *const *inputs, float *loss) {
    const void *all[MAX_INPUTS + 1];
    int teacher_failed = with_teacher_logits(ctx, inputs, all) != 0;
    int status = D.student->forward(ctx, all, loss);
    return teacher_failed ? DMRT_ERR_DATA : status;
}

static int train_step(void *ctx, const void *const *inputs, float *loss) {
    const void *all[MAX_INPUTS + 1];
    int teacher_failed = with_teacher_logits(ctx, inputs, all) != 0;
    int status = D.student->train_step(ctx, all, loss);
    return teacher_failed ? DMRT_ERR_DATA : status;
}

/* The teacher's error where its forward failed, else the student's. */
static const char *error(void *student) {
    pair p = pair_of(student);
    const char *teacher = p.teacher && D.teacher->error ? D.teacher->error(p.teacher) : NULL;
    return teacher && *teacher ? teacher : D.student->error(student);
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

int dmrt_distill_main(const dmrt_model *student, const dmrt_model *teacher, const dmrt_distill_layout *layout,
                      int argc, char **argv) {
    /* dmc run passes --teacher-init FILE first */
    if (argc < 3 || strcmp(argv[1], "--teacher-init") != 0) {
        fprintf(stderr, "%s: a distilled student runs as %s --teacher-init TEACHER.safetensors [trainer options]\n",
                argv[0], argv[0]);
        return 2;
    }
    D.student = student;
    D.teacher = teacher;
    D.logits_output = layout->logits_output;
    D.parts = layout->parts > 1 ? layout->parts : 1;
    D.data_axis = D.parts > 1 ? layout->data_axis : -1;
    D.micro = layout->microbatches > 1 ? layout->microbatches : 1;
    D.init = argv[2];
    D.wrapped = *student;
    D.wrapped.n_inputs = student->n_inputs - 1; /* teacher_logits, the last, is the teacher's */
    D.wrapped.create = student->create ? create : NULL;
    D.wrapped.create_rank = student->create_rank ? create_rank : NULL;
    D.wrapped.destroy = destroy;
    D.wrapped.forward = forward;
    D.wrapped.train_step = train_step;
    D.wrapped.error = error;
    D.wrapped.set_threads = student->set_threads ? set_threads : NULL;
    if (map_inputs() != 0 || strcmp(student->inputs[student->n_inputs - 1].name, "teacher_logits") != 0) {
        fprintf(stderr, "%s: model '%s' was not compiled to distill model '%s'\n", argv[0], student->name, teacher->name);
        return 2;
    }
    argv[2] = argv[0];
    return dmrt_trainer_main(&D.wrapped, argc - 2, argv + 2);
}
