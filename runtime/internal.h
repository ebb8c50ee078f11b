/* internal.h: helpers shared by the files of libdmrt; not installed. */
#ifndef DMRT_INTERNAL_H
#define DMRT_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dmrt.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Whether the CPU has an instruction set extension, named as gcc's __builtin_cpu_supports
 * names it (a string literal: "avx512bf16", "avx512vnni"); 0 off x86 or other compilers. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define DMRT_CPU_SUPPORTS(feature) (__builtin_cpu_init(), __builtin_cpu_supports(feature) != 0)
#else
#define DMRT_CPU_SUPPORTS(feature) 0
#endif

/* oneDNN here runs on OpenMP (Debian's build: dnnl_version()->cpu_runtime is
 * DNNL_RUNTIME_OMP) and takes as many threads as omp_get_max_threads() says, all the cores
 * by default: every rank thread's product would then spread over every core. Like OpenBLAS
 * (dmrt_blas_share_cores), it runs on the calling thread alone (gemm_bf16.c, gemm_int8.c),
 * which shares a product over a rank's own threads itself. The setting is the calling
 * thread's OpenMP one, kept around each call to oneDNN and given back after. */
#ifdef _OPENMP
#define DMRT_ONEDNN_ONE_THREAD_BEGIN()           \
    int saved_threads_ = omp_get_max_threads(); \
    omp_set_num_threads(1)
#define DMRT_ONEDNN_ONE_THREAD_END() omp_set_num_threads(saved_threads_)
#else
#define DMRT_ONEDNN_ONE_THREAD_BEGIN() (void)0
#define DMRT_ONEDNN_ONE_THREAD_END() (void)0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define DMRT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define DMRT_PRINTF(f, a)

#endif

/* Formats a message into err (when err != NULL and errlen > 0); returns -1 so that
 * callers can write `return dmrt_errorf(err, errlen, "...")`. */
int dmrt_errorf(char *err, size_t errlen, const char *fmt, ...) DMRT_PRINTF(3, 4);

/* Writes "[d0, d1, ...]" into buf (truncated to buflen); returns buf. */
char *dmrt_shape_str(char *buf, size_t buflen, int rank, const int64_t *shape);

/* Product of the dims, or -1 on a negative dim or int64 overflow. */
int64_t dmrt_shape_numel(int rank, const int64_t *shape);

/* params_io.c: whether the file's tensor t (NULL: absent) can be model's `what` ("parameter")
 * d: present, of d's dtype and shape. 0, or -1 with a message naming path, the tensor and what
 * differs; also_prefix (may be NULL): the other name that was looked for, also_prefix + name. */
/* blas.c: how dmrt_sgemm_split cuts a product, shared with dmrt_gemm_bf16_split so that
 * both split alike. dmrt_sgemm_panels: the panels for `threads` threads (1: not split);
 * they run along the longer of m and n. dmrt_sgemm_panel: panel p of `panels`, a product of
 * its own: its m and n, and where it starts in a, b and c (elements). Panels begin at whole
 * multiples of 16 rows or columns (the widths BLAS kernels work in). */
typedef struct dmrt_panel {
    int64_t m, n;
    int64_t a, b, c;
} dmrt_panel;
int dmrt_sgemm_panels(int threads, int64_t m, int64_t n, int64_t k);
/* The m rows of c (ldc apart) each set to bias[0 .. n): a product's start when it adds a
 * bias (the *_bias_split products, each panel filling its own rows and columns). */
void dmrt_fill_bias_rows(int64_t m, int64_t n, const float *bias, float *c, int64_t ldc);
dmrt_panel dmrt_sgemm_panel(int p, int panels, int trans_a, int trans_b, int64_t m, int64_t n, int64_t lda,
                            int64_t ldb, int64_t ldc);
/* thread_floats.c: a growable f32 buffer, kept between calls: at least count floats (a
 * failed malloc ends the process, naming who). dmrt_thread_floats: the calling thread's own
 * (freed when the thread ends), for the widened weight of gemm_quant.c's products. */
typedef struct dmrt_float_buffer {
    float *floats;
    size_t count;
} dmrt_float_buffer;
float *dmrt_float_buffer_reserve(dmrt_float_buffer *b, size_t count, const char *who);
float *dmrt_thread_floats(size_t count, const char *who);

/* blas.c: one product of 2 m n k flops, begun at t0 (dmrt_now), in the calling thread's
 * DMRT_BLAS_TIME counts. */
void dmrt_blas_count_product(int64_t m, int64_t n, int64_t k, double t0);

/* safetensors.c: a new temporary file beside path for writing, to be renamed over path:
 * named "PATH.tmp.XXXXXX" by mkstemp (no other process's, even one of the same pid in
 * another container; never an existing file or a link planted at the name), with the
 * permissions fopen would have given (0666 less the umask); its name into tmp (len bytes:
 * strlen(path) + 12 at least). NULL with errno set on failure (ENAMETOOLONG when the name
 * does not fit). */
FILE *dmrt_temporary_beside(const char *path, char *tmp, size_t len);
/* safetensors.c: the path an atomic write of path renames onto: path itself (a new name, a
 * regular file, a dangling link), or a symbolic link's regular target (into buf, len bytes),
 * so that the link stays and what it names is replaced; NULL with the reason in err (not
 * naming path) for anything else (a directory, FIFO, device or socket: the rename would
 * replace it). */
const char *dmrt_atomic_target(const char *path, char *buf, size_t len, char *err, size_t errlen);
/* safetensors.c: the directory holding path ("." for a bare name, "/" for one in the root)
 * into dir: 0, or -1 when it does not fit. */
int dmrt_parent_dir(const char *path, char *dir, size_t len);
/* params_io.c: 0 when the file's F32 tensor t for the model's `what` d is finite, else -1
 * with a message naming path, the tensor and the element (--init, --resume). */
int dmrt_check_finite_to_load(const char *path, const dmrt_st_tensor *t, const dmrt_tensor_desc *d, const char *what,
                               char *err, size_t errlen);
/* params_io.c: the first element of the floats x[0..n) that is not finite, or -1; x may
 * lie at any address (a file's f32 tensor after 1-byte ones). */
int64_t dmrt_first_non_finite(const void *x, int64_t n);
/* params_io.c: 0 when the whole tensor d (data) is finite, else -1 with the message "PATH not
 * written: <what> 'NAME' holds a non-finite value (... at element E of SHAPE) after step S":
 * the one check of what --save, checkpoints and <model>_save_weights write. */
int dmrt_check_finite_to_write(const char *path, const char *what, const dmrt_tensor_desc *d, const float *data,
                               int64_t step, char *err, size_t errlen);
int dmrt_check_tensor(const dmrt_model *model, const char *path, const dmrt_st_tensor *t, const dmrt_tensor_desc *d,
                      const char *what, const char *also_prefix, char *err, size_t errlen);

/* safetensors.c: only the header's "__metadata__" of a safetensors file into f (no tensors:
 * n_tensors 0), reading the length and the header, not the data. dmrt_st_close frees it. */
int dmrt_st_read_meta(dmrt_st_file *f, const char *path, char *err, size_t errlen);

/* checkpoint.c: the metadata of a file of n tensors (descs, data): the caller's n_own pairs,
 * then every tensor's "dmc.crc32c.<name>", the CRC-32C of its bytes as stored (8 lowercase
 * hex digits), which dmrt_check_crc32c checks on load (--init, --resume, a quantized file's
 * --init). Checkpoints, --save, --dump-grads and --save-quantized files carry them. keys and
 * values point into meta (free with dmrt_file_meta_free); 0, or -1 when out of memory. */
typedef struct dmrt_file_meta {
    int n;
    const char **keys, **values;
    char *text; /* the checksums' keys and values */
} dmrt_file_meta;
int dmrt_file_meta_with_crc32c(dmrt_file_meta *meta, int n_own, const char *const *own_keys,
                               const char *const *own_values, int n, const dmrt_tensor_desc *descs,
                               const void *const *data);
void dmrt_file_meta_free(dmrt_file_meta *meta);

/* checkpoint.c: the trainer's directory of checkpoints, DIR/step-<8 digits>.safetensors.
 * path: the file of step (-1: too long for len). */
int dmrt_checkpoint_path(const char *dir, int64_t step, char *path, size_t len);
/* The step of path when it names a checkpoint of dir (a file of dir, or one it would hold,
 * named step-<8 or more digits>.safetensors as the trainer names them), else -1. */
int64_t dmrt_checkpoint_file_step(const char *dir, const char *path);
/* Removes dir's temporary files of checkpoint writes that never reached their rename
 * (step-<N>.safetensors.tmp.XXXXXX: a run killed while writing); only a writer that holds
 * the directory's lock may call it, as no other can be writing. Their names, comma-separated,
 * into removed (truncated to len); how many, or -1 with a message. */
int dmrt_checkpoint_remove_unfinished(const char *dir, char *removed, size_t len, char *err, size_t errlen);
/* Before a checkpoint is gathered: a model whose checkpoints drain its pipeline first
 * (checkpoint_drains: 2bw, pipedream) drained, so that its step is the one the file records
 * (nothing owed: nothing done); a model with parameter servers given their snapshot
 * (ps_snapshot: once a step). Every rank calls it: 0, or -1 with a message naming path.
 * dmrt_save_checkpoint calls it. */
int dmrt_checkpoint_drain(const dmrt_model *m, void *ctx, const char *path, char *err, size_t errlen);
/* dmrt_load_checkpoint from a file already read (the trainer reads its metadata first). */
int dmrt_load_checkpoint_file(const dmrt_model *m, void *ctx, const dmrt_st_file *f, char *err, size_t errlen);
/* What loading f into m does otherwise than as the file holds it (gradient compression's
 * state of another data-axis size, missing, or of another mesh: dmrt_state_layout), as a
 * sentence into buf (empty when nothing); its length. */
size_t dmrt_checkpoint_adapted(const dmrt_model *m, const dmrt_st_file *f, char *buf, size_t len);
/* Tensor t of file f against its CRC-32C in f's metadata ("dmc.crc32c.<name>"): 0 when they
 * agree, or when there is none and !required; else -1 with a message naming the file and the
 * tensor. */
int dmrt_check_crc32c(const dmrt_st_file *f, const dmrt_st_tensor *t, int required, char *err, size_t errlen);

/* The run a checkpoint belongs to (the trainer's metadata: 16 hex digits, drawn when a run
 * starts and kept by a run resumed from it). A directory's checkpoints, as listed: */
#define DMRT_CKPT_RUN_KEY "trainer.run"
typedef struct dmrt_ckpt_entry {
    int64_t step;
    char path[4096];
    char *run;        /* its DMRT_CKPT_RUN_KEY; NULL when it has none, or "" (or is unreadable) */
    char *unreadable; /* why its header cannot be read; NULL when it can */
    int not_a_file;   /* a directory or a FIFO of a checkpoint's name: never opened */
} dmrt_ckpt_entry;
/* dir's checkpoints, ascending by step, with their runs (headers only: cheap); malloc'd into
 * *out, free with dmrt_checkpoint_list_free. How many, or -1 with a message. */
int dmrt_checkpoint_list(const char *dir, dmrt_ckpt_entry **out, char *err, size_t errlen);
void dmrt_checkpoint_list_free(dmrt_ckpt_entry *e, int n);
/* Whether e is a readable checkpoint of run (NULL: one without a run). */
int dmrt_checkpoint_of_run(const dmrt_ckpt_entry *e, const char *run);
/* "DIR/step-00000020.safetensors of run 0123456789abcdef" (or why it has none) into buf;
 * the length written. */
size_t dmrt_checkpoint_describe(char *buf, size_t len, const dmrt_ckpt_entry *e);
/* The newest checkpoint of dir into path; -1 with a message when there is none, when the
 * directory cannot be read, or when it holds checkpoints of several runs (each named). */
int dmrt_checkpoint_latest(const char *dir, char *path, size_t len, char *err, size_t errlen);
/* Removes the oldest checkpoints of run (NULL: those without a run) from dir, all but its
 * newest keep; the files of other runs and unreadable ones stay. */
int dmrt_checkpoint_prune(const char *dir, int keep, const char *run, char *err, size_t errlen);

/* trace_files.c: the picture --trace writes beside its file: FILE.json's FILE.svg, any other
 * name's FILE.svg appended. */
void dmrt_trace_picture_path(const char *trace, char *out, size_t size);
/* trace_files.c: the trainer's --trace: every rank's pipeline actions into path (a Chrome
 * trace) and path's .svg (the last training step), and the measured bubble on out.
 * Every rank calls it; world rank 0 writes. 0, or -1 with a message in err. */
struct dmrt_rank;
int dmrt_trace_write(const dmrt_model *m, struct dmrt_rank *rank, const char *path, FILE *out, char *err,
                     size_t errlen);
/* The trainer's --trace, on the lead rank: the measured step time (the median of
 * seconds[1..n), the first step warming caches left out) beside dmc's prediction. */
void dmrt_trace_step_time(const dmrt_model *m, const double *seconds, int64_t n, FILE *out);

/* The trainer's --init, and for a --quantize int8 program the calibration of its input
 * scales (trainer_calibrate.c). */
typedef struct dmrt_init_opts {
    const char *init;     /* --init FILE, or NULL */
    int64_t calibrate;    /* --calibrate N: training rows; 0 when not given (512) */
    double percentile;    /* --calibrate-percentile P (0 < P <= 100); 0: min-max */
    const char *data_dir; /* --data-dir: where Fashion-MNIST is; NULL: the default */
    int quiet;
    const char *text;     /* --data text:FILES' list (a language model calibrates on it), or NULL */
} dmrt_init_opts;
/* dmrt_load_init of io->init (when given), then, for a --quantize int8 program whose input
 * scales it did not read, the calibration (dmrt_calibration_begin) on io->calibrate rows of
 * Fashion-MNIST's training images (the first, in the files' order), or for a byte-level
 * language model of io->text's training windows (the first, T bytes apart), through the
 * f32 forward;
 * --calibrate with a file that holds the scales is refused. 0, or -1 with a message. */
int dmrt_trainer_init_params(const dmrt_model *m, void *ctx, const dmrt_init_opts *io, char *err, size_t errlen);

/* trainer_data.c: whether paths a and b name one file: the same string; else, both existing,
 * the same device and inode (another name, a hard or symbolic link); else, neither existing
 * yet, the same name in the same directory ("./w.st" and "w.st"). */
int dmrt_same_file(const char *a, const char *b);

/* trainer_data.c: what a run reads and writes, for the check, before anything runs, that it
 * writes no file it reads (--save over --init's weights, or the --batch-file) and no file
 * twice (--dump-grads over --save), and no output over a checkpoint of its --checkpoint
 * directory: each file with what names it in messages. */
typedef struct dmrt_run_file {
    const char *option;  /* "--save": what the message asks to give another file */
    const char *subject; /* how the message names it first: "--save", "--trace's picture" */
    const char *object;  /* how it names it second: "the --init file", "a --data text: file" */
    const char *holds;   /* "the trained weights", "the inputs" */
    char *path;          /* as given (a copy) */
    char *target;        /* what is read or written: through a symbolic link, the file it names */
    int writes;
    int checkpoint;      /* the --resume checkpoint: may lie in --checkpoint's directory */
} dmrt_run_file;
typedef struct dmrt_run_files {
    dmrt_run_file *files;
    int n, cap;
    int out_of_memory;
} dmrt_run_files;
/* A file the run reads (path NULL: none). */
void dmrt_run_files_read(dmrt_run_files *fs, const char *option, const char *object, const char *holds,
                         const char *path);
/* The --resume checkpoint the run reads. */
void dmrt_run_files_resumed(dmrt_run_files *fs, const char *path);
/* A file the run writes (path NULL: none); subject NULL: the option. */
void dmrt_run_files_write(dmrt_run_files *fs, const char *option, const char *subject, const char *object,
                          const char *holds, const char *path);
/* The data files the run reads: text_list's files (--data text:A,B), else, when mnist_dir is
 * not NULL, Fashion-MNIST's four files in it. */
void dmrt_run_files_data(dmrt_run_files *fs, const char *text_list, const char *mnist_dir);
/* Every written file against every other one and, with checkpoint_dir, against the
 * checkpoints of that directory (which the run writes and prunes); so is every file read but
 * the --resume checkpoint. 0, or -1 with a message naming both files. */
int dmrt_run_files_check(const dmrt_run_files *fs, const char *checkpoint_dir, char *err, size_t errlen);
void dmrt_run_files_free(dmrt_run_files *fs);

/* predict.c: the trainer's --predict for one rank (NULL: serial); the exit status (0 or 1). */
int dmrt_trainer_save_quantized(const dmrt_model *m, uint64_t seed, const dmrt_init_opts *io, const char *path,
                                int threads, const char *prog);
int dmrt_trainer_predict(const dmrt_model *m, uint64_t seed, const dmrt_init_opts *io, const char *batch_file,
                         const char *out, int threads, const char *prog, struct dmrt_rank *rank, char *fail,
                         size_t faillen);

/* --threads N: the context's loops and products on N threads (model->set_threads). 0, or -1
 * with a message in err (a model built before the option cannot take it). */
int dmrt_trainer_set_threads(const dmrt_model *m, void *ctx, int threads, char *err, size_t errlen);

#define DMRT_STR2_(x) #x
#define DMRT_STR_(x) DMRT_STR2_(x)

#endif
