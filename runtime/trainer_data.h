/* trainer_data.h: where the trainer's batches come from (trainer_data.c): a --batch-file,
 * Fashion-MNIST, or the windows of a text corpus, and the evaluations on them (test
 * accuracy, validation loss). Not installed. Functions returning int return 0, or -1 with a
 * message in err. */
#ifndef DMRT_TRAINER_DATA_H
#define DMRT_TRAINER_DATA_H

#include "internal.h"

/* Byte-level language models: bytes are tokens 0..255; larger ids are never sampled. */
#define TR_BYTE_TOKENS 256
#define TR_MNIST_PIXELS 784
#define TR_MNIST_CLASSES 10
/* Stream of dmrt_rng used for shuffling (the model's create() uses its own). */
#define TR_SHUFFLE_STREAM UINT64_C(0x73687566666c65) /* "shuffle" */
/* The stream of the offsets of text training windows. */
#define TR_WINDOWS_STREAM UINT64_C(0x77696e646f7773) /* "windows" */
/* The validation loss uses at most this many windows, so that it stays cheap enough to
 * run every few steps (--eval-every). */
#define TR_MAX_VAL_WINDOWS 32

/* A byte-level language model as text training and sampling need it: inputs tokens and
 * targets, both i32[B, T], and an output logits f32[B, T, V] with V >= 256. */
typedef struct tr_lm {
    int tokens, targets; /* input indices */
    int logits;          /* output index */
    int64_t batch, len, vocab; /* B, T, V */
} tr_lm;

/* Fills *lm when the model is a byte-level language model (see tr_lm); else returns -1
 * with what does not fit in why. */
int dmrt_trainer_find_lm(const dmrt_model *m, tr_lm *lm, char *why, size_t whylen);

/* Where the batches come from: at most one of the three parts is in use (none when
 * only sampling). */
typedef struct tr_data {
    int mnist, text;
    int64_t steps_per_epoch;
    char *source;              /* the batch file, the fashion-mnist directory, the text list */
    /* --batch-file */
    dmrt_st_file bf;
    const dmrt_st_tensor **bt; /* (n_inputs) tensor feeding input i */
    /* fashion-mnist */
    int64_t batch;             /* B */
    dmrt_idx train_x, train_y, test_x, test_y;
    int64_t *perm;             /* (train n) order of the current epoch */
    dmrt_rng shuffle;
    /* --data text: the corpus is bytes [0, train_bytes) for training windows, then
     * val_bytes for validation */
    tr_lm lm;
    char *text_list;           /* copy of the file list, split in place at the commas */
    const char **text_paths;   /* (n_text_paths) into text_list */
    int n_text_paths;
    dmrt_text corpus;
    int64_t train_bytes, val_bytes;
    int64_t val_windows, val_stride; /* validation windows start at val_stride * k */
    dmrt_rng windows;
} tr_data;

/* B when the model takes Fashion-MNIST (inputs f32[B, 784] and i32[B]), else 0. */
int64_t dmrt_trainer_mnist_batch(const dmrt_model *m);

static inline size_t dmrt_trainer_desc_bytes(const dmrt_tensor_desc *d) {
    return (size_t)d->numel * dmrt_dtype_size(d->dtype);
}

static inline const char *dmrt_trainer_ctx_error(const dmrt_model *m, void *ctx) {
    const char *e = m->error ? m->error(ctx) : NULL;
    return e && *e ? e : "(no message)";
}

/* Descriptions for messages: "x: f32[8, 784]", a list of them, the model's inputs. */
char *dmrt_trainer_desc_str(char *buf, size_t len, const dmrt_tensor_desc *d);
char *dmrt_trainer_descs_str(char *buf, size_t len, int n, const dmrt_tensor_desc *descs);
char *dmrt_trainer_inputs_str(char *buf, size_t len, const dmrt_model *m);

/* Opening: d zeroed first; dmrt_trainer_data_close frees what any of them opened. */
int dmrt_trainer_open_batch_file(tr_data *d, const dmrt_model *m, const char *path, char *err, size_t errlen);
int dmrt_trainer_open_mnist(tr_data *d, int64_t batch, const char *dir, uint64_t seed, char *err, size_t errlen);
int dmrt_trainer_open_text(tr_data *d, const tr_lm *lm, const char *list, uint64_t seed, char *err, size_t errlen);
void dmrt_trainer_data_close(tr_data *d);

/* What identifies the data a checkpoint was trained on ("trainer.data_hash"): FNV-1a 64 of the
 * bytes the run trains on, in order, as 16 hex digits into hex[17]: a batch file's tensors of
 * the model's inputs (their data, input by input); a text corpus's bytes (the files
 * concatenated in the order given); fashion-mnist's examples as read (training pixels and
 * labels, then test pixels and labels). */
void dmrt_trainer_data_hash(const tr_data *d, const dmrt_model *m, char hex[17]);

/* Fashion-MNIST's order of the next epoch (Fisher-Yates, the rng carrying on from epoch to
 * epoch). */
void dmrt_trainer_shuffle(tr_data *d);
/* The input buffers for global step `step` (0-based), batch `b` of its epoch. */
void dmrt_trainer_fill_batch(tr_data *d, const dmrt_model *m, void **in, int64_t step, int64_t b);
/* A resumed run's data where the run it continues left it after `steps` steps (--resume). */
void dmrt_trainer_skip_steps(tr_data *d, int64_t steps);
/* The mean validation loss of a text corpus; the test accuracy of Fashion-MNIST on output
 * `out` (the logits). */
int dmrt_trainer_validation_loss(tr_data *d, const dmrt_model *m, void *ctx, void **in, double *loss, char *err, size_t errlen);
int dmrt_trainer_evaluate(tr_data *d, const dmrt_model *m, void *ctx, void **in, int out, double *acc, char *err, size_t errlen);

#endif
