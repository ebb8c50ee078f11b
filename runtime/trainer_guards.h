/* trainer_guards.h: the trainer's checks that end a run cleanly (trainer_guards.c);
 * not installed. Functions returning int return 0, or -1 with a message in err. */
#ifndef DMRT_TRAINER_GUARDS_H
#define DMRT_TRAINER_GUARDS_H

#include "internal.h"

struct dmrt_rank;

/* SIGINT and SIGTERM set the stop request (dmrt_trainer_guard_stop_signal: the signal, 0: none)
 * instead of ending the process, while a rank is between dmrt_trainer_guard_stepping(1) and
 * (0) (its step loop); a second one, or one outside the step loops, ends it. */
void dmrt_trainer_guard_install_signals(void);
void dmrt_trainer_guard_stepping(int entering);
int dmrt_trainer_guard_stop_signal(void);

/* Whether the trainer can write path atomically (a file beside it, then a rename), for
 * the option that names it; checked before training. */
int dmrt_trainer_guard_writable(const char *option, const char *path, char *err, size_t errlen);

/* At a step boundary: whether any rank of the training ranks (the mesh's: parameter
 * servers take no steps) was asked to stop (*stop) and whether any one's loss is not
 * finite (*non_finite). rank NULL: this process alone. Every training rank calls it. */
int dmrt_trainer_guard_agree(const dmrt_model *m, struct dmrt_rank *rank, float loss, int *stop, int *non_finite, char *err,
                             size_t errlen);

/* After --resume: whether every training rank continues from the same step (each reads
 * its own file: on several hosts, `--resume DIR` may name different newest checkpoints).
 * rank NULL: 0. Every training rank calls it. */
int dmrt_trainer_guard_same_start(const dmrt_model *m, struct dmrt_rank *rank, const char *resume, int64_t step,
                                  char *err, size_t errlen);

/* The message for a step whose loss or gradients are not finite: the first f32 input of
 * the batch holding a non-finite value, else the first parameter whose gradient does.
 * Gathers gradients on a mesh: every rank calls it. Returns -1 with the message in err. */
int dmrt_trainer_guard_explain_non_finite(const dmrt_model *m, void *ctx, const void *const *inputs, int64_t step,
                                float loss, int loss_non_finite, char *err, size_t errlen);

/* A serial model on the host: whether every gradient of the last step is finite (a mesh
 * or device model: 1, not checked every step; its loss is). */
int dmrt_trainer_guard_serial_gradients_finite(const dmrt_model *m, void *ctx);

#endif
