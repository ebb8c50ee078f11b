/* trainer_run.h: the trainer's options as parsed (trainer.c) and one rank's run of them
 * (trainer_run.c: data, model, the step loop, the end). Not installed. */
#ifndef DMRT_TRAINER_RUN_H
#define DMRT_TRAINER_RUN_H

#include "internal.h"
#include "dmrt_comm.h"

#include <stdint.h>

#define TR_TEXT_PREFIX "text:"

/* TR_STOPPED: a signal asked to stop and every rank stopped at the same step boundary;
 * the process exits with 128 + the signal, as a shell reports a process it ended. */
enum { TR_OK = 0, TR_RUNTIME = 1, TR_USAGE = 2, TR_HELP = 3, TR_STOPPED = 4 };

typedef struct tr_opts {
    int64_t steps;  /* -1 when not given */
    int64_t epochs; /* -1 when not given */
    uint64_t seed;
    int seed_given;         /* --seed was given (a resumed run takes its checkpoint's) */
    const char *init, *save, *save_quantized, *batch_file, *data, *data_dir, *dump_grads;
    const char *checkpoint; /* --checkpoint DIR (trainer_checkpoint.c) */
    int64_t checkpoint_every, checkpoint_keep; /* 0: at the end only; 0: keep all */
    const char *resume;     /* --resume PATH */
    const char *trace;      /* --trace FILE: the pipeline's timeline (trace_files.c) */
    const char *text_files; /* --data text:FILES: the part after "text:"; else NULL */
    int64_t eval_every;     /* 0: the validation loss only at the end */
    int64_t sample;         /* bytes to generate; -1 when --sample is not given */
    const char *prompt;     /* NULL when not given (then "\n") */
    double temperature;     /* -1 when not given (then 1) */
    int64_t top_k;          /* -1 when not given (then 40) */
    int quiet;
    int memory;             /* --memory: every rank reports what its model allocated */
    int predict;            /* --predict: inference on --batch-file into --out (predict.c) */
    int evaluate;           /* --evaluate: no step; the end-of-run evaluation of --init's parameters */
    int64_t threads;        /* --threads N: each rank's loops and products on N threads (0: the default) */
    const char *out;
    int64_t calibrate;           /* --calibrate N (0: not given) */
    double calibrate_percentile; /* --calibrate-percentile P (0: not given: min-max) */
} tr_opts;

/* What --init and an int8 program's calibration take of the options. */
static inline dmrt_init_opts dmrt_trainer_init_opts(const tr_opts *o) {
    return (dmrt_init_opts){o->init, o->calibrate, o->calibrate_percentile, o->data_dir, o->quiet, o->text_files};
}

/* Trains on one rank (rank NULL: the serial model) and returns a TR_ status. Only the lead
 * rank (world rank 0) prints; a rank's failure message goes to fail (its launcher reports
 * it), the serial run's to stderr. */
int dmrt_trainer_run(const dmrt_model *m, const tr_opts *o, const char *prog, dmrt_rank *rank, char *fail,
                     size_t faillen);

#endif
