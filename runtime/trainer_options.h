/* trainer_options.h: the options of the trainer (dmrt_trainer_main, runtime/trainer.c),
 * one row each. Not installed.
 *
 * Two programs read this table: the trainer, which prints its usage from it and parses
 * what it lists, and dmc, whose `dmc run` checks the trainer's options before compiling
 * (a typo should not cost a C build) and lists them in `dmc run --help`. One table keeps
 * the two from disagreeing.
 *
 * DMRT_TRAINER_OPTIONS(X) calls X(name, value, help): value is what the option takes
 * ("N", "FILE"; NULL for a flag), help its description, lines separated by '\n'. -h and
 * --help are not rows: every program answers them itself. */
#ifndef DMRT_TRAINER_OPTIONS_H
#define DMRT_TRAINER_OPTIONS_H

#include <stdio.h>
#include <string.h>

#define DMRT_TRAINER_DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"

#define DMRT_TRAINER_OPTIONS(X)                                                              \
    X("--steps", "N", "train N steps, cycling through the data as needed")                  \
    X("--epochs", "N",                                                                       \
      "train N passes over the data (default 1); with --steps, stop\n"                      \
      "at whichever limit comes first")                                                      \
    X("--seed", "S",                                                                         \
      "seed of parameter initialisation, shuffling, text windows and\n"                     \
      "sampling (default 0; decimal, or hex after 0x)")                                                                \
    X("--init", "FILE", "load the parameters from a safetensors file after initialisation") \
    X("--save", "FILE", "write the parameters to a safetensors file at the end (atomically)") \
    X("--checkpoint", "DIR",                                                                 \
      "write checkpoints into DIR (created when missing): DIR/step-<N>.\n"                  \
      "safetensors holds the parameters, the optimizer state, the step\n"                   \
      "and the seed and data the position follows from, written\n"                          \
      "atomically at the end, every --checkpoint-every steps, and when\n"                   \
      "a signal stops training")                                                             \
    X("--checkpoint-every", "N", "with --checkpoint: also after every N-th step")            \
    X("--checkpoint-keep", "K", "with --checkpoint: keep this run's newest K checkpoints (default: all)") \
    X("--resume", "PATH",                                                                    \
      "continue from a checkpoint: PATH a file, or a --checkpoint DIR (its\n"               \
      "newest); --steps and --epochs count from the start of training,\n"                  \
      "so a run of --steps 10 resumed from its checkpoint of step 5 gives\n"               \
      "the weights of 10 steps straight (a decaying learning rate spans\n"                 \
      "--steps: give the resumed run the first run's; one of --steps 5\n"                  \
      "resumed with --steps 10 decays differently)")                                       \
    X("--batch-file", "FILE",                                                                \
      "safetensors file with one tensor per model input, named after it,\n"                 \
      "with a leading step dimension: step i trains on slice i modulo\n"                   \
      "the file's slices (more steps cycle through them again)")                            \
    X("--data", "NAME",                                                                      \
      "built-in data set: fashion-mnist (the default for models whose\n"                    \
      "inputs are f32[B, 784] and i32[B]);\n"                                               \
      "--data text:FILE[,FILE...]: byte-level language modelling on the\n"                  \
      "files' bytes, concatenated (models with inputs tokens, targets:\n"                   \
      "i32[B, T] and an output logits: f32[B, T, V], V >= 256): each\n"                    \
      "step trains on B windows at random offsets of the first 90%; the\n"                  \
      "last 10% (at least T+1 bytes) is held out for the validation loss;\n"               \
      "an epoch is floor(training bytes / (B*T)) steps")                                     \
    X("--data-dir", "DIR",                                                                   \
      "directory of the fashion-mnist files\n"                                              \
      "(default " DMRT_TRAINER_DEFAULT_DATA_DIR ")")                                         \
    X("--eval-every", "N", "with --data text: also print the validation loss every N steps") \
    X("--sample", "N",                                                                       \
      "after training, generate N bytes with the language model (with\n"                    \
      "--steps 0 or --epochs 0 no data is needed)")                                                        \
    X("--prompt", "TEXT", "the bytes the sample continues (default: a newline)")            \
    X("--temperature", "X", "sampling temperature (default 1; 0: greedy, the likeliest byte)") \
    X("--top-k", "K", "sample among the K likeliest bytes (default 40; 0: all 256)")        \
    X("--dump-grads", "FILE", "after the first step, write every parameter's gradient")     \
    X("--trace", "FILE",                                                                     \
      "record every rank's forward and backward actions (pipelines,\n"                      \
      "micro-batches): FILE a Chrome trace (Perfetto), FILE's .svg\n"                       \
      "the last step; prints the measured pipeline bubble")                                  \
    X("--predict", NULL,                                                                     \
      "inference instead of training: the model's outputs for the rows of\n"                \
      "--batch-file (one tensor per input the outputs read, named after it,\n"             \
      "[rows, ...], any number of rows) into --out, with the parameters of\n"              \
      "--init")                                                                              \
    X("--save-quantized", "FILE",                                                            \
      "a program compiled with --quantize: write its narrow weights (from\n"               \
      "--init; int8: with the calibrated input scales) to a safetensors\n"                \
      "file, which its --init loads, and exit")                                              \
    X("--calibrate", "N",                                                                    \
      "a program compiled with --quantize int8, given f32 weights: the\n"                  \
      "products' input scales from the first N Fashion-MNIST training rows\n"             \
      "(--data-dir), or a language model's first N --data text windows, through\n"      \
      "the f32 forward (default 512); min-max: the largest |x| / 127")                      \
    X("--calibrate-percentile", "P",                                                         \
      "with --quantize int8: the scale from the P-th percentile of |x|\n"                 \
      "(0 < P <= 100; numpy's 'lower': sorted |x| at floor(P/100 (n-1)))\n"              \
      "instead of the largest")                                                              \
    X("--out", "FILE", "with --predict: the safetensors file of the outputs (atomically)")  \
    X("--evaluate", NULL,                                                                    \
      "train nothing: print what a run prints at its end (test accuracy on\n"              \
      "fashion-mnist, val loss on --data text) for the parameters of --init")                \
    X("--threads", "N",                                                                      \
      "run each rank's loops and matrix products on N threads, 1 to 1024\n"                \
      "(default: $DMC_THREADS, else the machine's cores shared by its ranks)")                         \
    X("--quiet", NULL, "no progress bar and no summary on stderr")                          \
    X("--memory", NULL,                                                                      \
      "at the end, every rank prints 'memory rank <r>: model peak <bytes>\n"                \
      "bytes' on stderr (what dmc --explain predicts per rank), and the\n"                  \
      "first rank 'memory: process peak RSS <MiB> MiB'")


/* One row as the usages print it: "  --steps N          train N steps ...", the help's
 * further lines indented under its first. */
static inline void dmrt_trainer_option_print(FILE *fp, const char *name, const char *value,
                                             const char *help) {
    char head[64];
    snprintf(head, sizeof head, "%s%s%s", name, value ? " " : "", value ? value : "");
    fprintf(fp, "  %-18s ", head);
    for (const char *line = help; *line;) {
        size_t n = strcspn(line, "\n");
        fprintf(fp, "%s%.*s\n", line == help ? "" : "                     ", (int)n, line);
        line += n + (line[n] == '\n');
    }
}

/* Every row of the table. */
static inline void dmrt_trainer_options_print(FILE *fp) {
#define DMRT_TRAINER_OPTION_PRINT(name, value, help) dmrt_trainer_option_print(fp, name, value, help);
    DMRT_TRAINER_OPTIONS(DMRT_TRAINER_OPTION_PRINT)
#undef DMRT_TRAINER_OPTION_PRINT
}

#endif
