/* trainer_checkpoint.h: where the trainer's checkpoints go and which one a run resumes
 * (--checkpoint DIR, --checkpoint-every N, --checkpoint-keep K, --resume PATH;
 * trainer_checkpoint.c). trainer.c decides when to write and records its data's position.
 * Not installed. Functions return 0, or -1 with a message in err. */
#ifndef DMRT_TRAINER_CHECKPOINT_H
#define DMRT_TRAINER_CHECKPOINT_H

#include "internal.h"

/* --checkpoint DIR, before training (the lead rank: world rank 0, the one rank that writes
 * checkpoints, in a process of its own under MPI or a thread of the process of every rank):
 * DIR is created when missing (its parent must exist) and a file is tried there. The run
 * then holds DIR's lock until dmrt_trainer_checkpoint_unlock (*lock: its descriptor, or -1
 * where the file system has no locks, said in note): an exclusive flock of DIR/.lock, which
 * another run holds is refused, naming DIR and the holder; the kernel lets go of a killed
 * run's. The check below is once, at the start; the lock keeps a second run out for the
 * whole run (it would replace checkpoints of the same steps, which the first has not
 * written yet). Holding it, no other run can be writing there: temporary files of
 * checkpoint writes that never reached their rename (a run killed while writing) are
 * removed, and note says which. A DIR that holds checkpoints of a run other than run (or
 * without a run, or unreadable) is refused, naming the newest such file. A run without a
 * name (run NULL: resumed from a checkpoint without one, adopted) owns the files without a
 * run of adopted's directory, and no others. A run resumed after step resumed_step (-1: not
 * resumed) is refused where DIR holds its own checkpoints of later steps: its new ones would
 * make a second history beside them, which --checkpoint-keep would prune first (they are
 * older by step) and --resume DIR would pass over. note: "" when there is nothing to say.
 * A refusal lets go of the lock. */
int dmrt_trainer_checkpoint_dir(const char *dir, const char *run, const char *adopted, int64_t resumed_step, int *lock,
                                char *note, size_t notelen, char *err, size_t errlen);
/* The end of the run: DIR/.lock removed while still held (a run that opened it meanwhile
 * finds its lock is of a removed file, and takes a new one), then let go. */
void dmrt_trainer_checkpoint_unlock(const char *dir, int lock);

/* A run's identity ("trainer.run"): the resumed checkpoint's ("" when it has none), else 16
 * hex digits of a fresh random 64-bit number. Only world rank 0 writes checkpoints and
 * checks directories, so the other ranks' identities, which differ in a fresh run, are
 * never used. */
#define DMRT_RUN_ID_SIZE 65
void dmrt_trainer_run_id(const dmrt_st_file *resumed, char run[DMRT_RUN_ID_SIZE]);

/* --resume: whether checkpoint f was trained on this run's data: its "trainer.data" (the
 * kind) and its "trainer.data_hash" (dmrt_trainer_data_hash) must be this run's, else -1 with
 * a message naming both. A checkpoint without a hash passes with a note in note (else ""). */
int dmrt_trainer_resume_check_data(const dmrt_st_file *f, const char *kind, const char *source, const char *hash,
                                   char *note, size_t notelen, char *err, size_t errlen);

/* A step's inputs as the checkpoints' "trainer.inputs" records them ("x: f32[32, 784], y:
 * i32[32]": each input's name, dtype and whole shape), into buf. */
#define DMRT_CKPT_INPUTS_KEY "trainer.inputs"
#define DMRT_INPUTS_META_SIZE 4096
char *dmrt_trainer_inputs_meta(char *buf, size_t len, const dmrt_model *m);

/* --resume: whether checkpoint f's run stepped on this program's inputs ("trainer.inputs"):
 * the data's position follows from the step and the batch's sizes, so a program of another
 * batch size or context length would train on other rows than the run's next ones; -1 with a
 * message naming both. A checkpoint without it (written before) passes. */
int dmrt_trainer_resume_check_inputs(const dmrt_st_file *f, const dmrt_model *m, char *err, size_t errlen);

/* --resume PATH: PATH a checkpoint file, or a directory whose newest checkpoint it takes,
 * read whole into f (f->path: the file). */
int dmrt_trainer_resume_read(const char *path, dmrt_st_file *f, char *err, size_t errlen);

/* The metadata value of key as an unsigned integer: 1 with *v set, 0 when absent, -1 (with a
 * message naming the file) when it is not one. */
int dmrt_trainer_meta_u64(const dmrt_st_file *f, const char *key, uint64_t *v, char *err, size_t errlen);

/* Writes the checkpoint of the model's current step into dir (every rank calls it; world rank
 * 0 writes) with the trainer's metadata (n_meta pairs), then, on the lead rank, removes all but
 * the newest keep of run's checkpoints (run NULL: those without a run; 0: keeps all; other
 * files are never removed). path receives the file's name. */
int dmrt_trainer_checkpoint_write(const dmrt_model *m, void *ctx, const char *dir, int64_t keep, const char *run,
                                  int lead, int n_meta,
                                  const char *const *keys, const char *const *values, char *path, size_t len,
                                  char *err, size_t errlen);

#endif
