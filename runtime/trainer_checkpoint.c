/* trainer_checkpoint.c: the trainer's directory of checkpoints (trainer_checkpoint.h). */
#include "trainer_checkpoint.h"
#include "trainer_guards.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The file whose flock a run into a checkpoint directory holds from its start to its end. */
#define CKPT_LOCK_NAME ".lock"

/* Whether the checkpoint `file` lies in directory dir (the same directory, however named). */
static int file_in_dir(const char *file, const char *dir) {
    char parent[4096];
    return dmrt_parent_dir(file, parent, sizeof parent) == 0 && dmrt_same_file(parent, dir);
}

static int lock_path(const char *dir, char *path, size_t len) {
    int k = snprintf(path, len, "%s/" CKPT_LOCK_NAME, dir);
    return k < 0 || (size_t)k >= len ? -1 : 0;
}

/* What the lock's holder wrote into it ("pid 1234 on node7"), into buf; "" when there is
 * nothing to read (it has not written it yet). */
static void lock_holder(const char *path, char *buf, size_t len) {
    buf[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
}

/* Takes dir's lock for the run: 0 with *lock, or with -1 and a note where the file system
 * has no locks; -1 with a message where another run holds it. */
static int lock_dir(const char *dir, int *lock, char *note, size_t notelen, char *err, size_t errlen) {
    char path[4096];
    *lock = -1;
    if (lock_path(dir, path, sizeof path) != 0) return dmrt_errorf(err, errlen, "--checkpoint %s: path too long", dir);
    /* a run that ends removes the file while it holds it (dmrt_trainer_checkpoint_unlock): a
     * lock taken meanwhile is of a file no other run opens any more, so it is taken again on
     * the name's new file (a few times at most: each try follows another run's end) */
    for (int attempt = 0; attempt < 100; attempt++) {
        /* O_NOFOLLOW: a link planted at the name would make the run create a file elsewhere */
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
        if (fd < 0)
            return dmrt_errorf(err, errlen, "--checkpoint %s: cannot create its lock file %s: %s", dir, path,
                               strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            if (e == EWOULDBLOCK) {
                char holder[256];
                lock_holder(path, holder, sizeof holder);
                return dmrt_errorf(err, errlen,
                                   "--checkpoint %s is in use by another run (%s%sholds its lock %s): two runs writing "
                                   "there would replace each other's checkpoints of the same steps: wait for that run "
                                   "to end, or write this run's into another directory",
                                   dir, holder, holder[0] ? ", which " : "which ", path);
            }
            if (e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS || e == EINVAL) {
                unlink(path);
                snprintf(note, notelen,
                         "--checkpoint %s: its file system cannot lock %s (%s): a second run into it is refused only "
                         "when it starts, and temporary files of checkpoint writes that did not finish are left there",
                         dir, path, strerror(e));
                return 0;
            }
            return dmrt_errorf(err, errlen, "--checkpoint %s: cannot lock %s: %s", dir, path, strerror(e));
        }
        struct stat held, named;
        if (fstat(fd, &held) == 0 && stat(path, &named) == 0 && held.st_dev == named.st_dev &&
            held.st_ino == named.st_ino) {
            /* who holds it, for the message of a run refused (which only lacks it if this fails) */
            char who[320], host[256] = "";
            if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
            snprintf(who, sizeof who, "pid %ld%s%s\n", (long)getpid(), host[0] ? " on " : "", host);
            int told = ftruncate(fd, 0) == 0 && pwrite(fd, who, strlen(who), 0) == (ssize_t)strlen(who);
            (void)told;
            *lock = fd;
            return 0;
        }
        close(fd);
    }
    return dmrt_errorf(err, errlen, "--checkpoint %s: cannot lock %s: another run keeps replacing it", dir, path);
}

void dmrt_trainer_checkpoint_unlock(const char *dir, int lock) {
    char path[4096];
    if (lock < 0) return;
    if (lock_path(dir, path, sizeof path) == 0) unlink(path);
    close(lock);
}

int dmrt_trainer_checkpoint_dir(const char *dir, const char *run, const char *adopted, int64_t resumed_step, int *lock,
                                char *note, size_t notelen, char *err, size_t errlen) {
    *lock = -1;
    note[0] = '\0';
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return dmrt_errorf(err, errlen, "--checkpoint %s: cannot create the directory: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dmrt_errorf(err, errlen, "--checkpoint %s: not a directory", dir);
    char probe[4096];
    if (dmrt_checkpoint_path(dir, 0, probe, sizeof probe) != 0)
        return dmrt_errorf(err, errlen, "--checkpoint %s: path too long", dir);
    if (dmrt_trainer_guard_writable("--checkpoint", probe, err, errlen) != 0) return -1;
    if (lock_dir(dir, lock, note, notelen, err, errlen) != 0) return -1;
    if (*lock >= 0) {
        /* no other run writes here now: a temporary file of a checkpoint's name is a killed
         * write's, which nothing would ever remove (a preemptible job's would fill the disk) */
        char removed[2048];
        int n = dmrt_checkpoint_remove_unfinished(dir, removed, sizeof removed, err, errlen);
        if (n < 0) {
            dmrt_trainer_checkpoint_unlock(dir, *lock);
            *lock = -1;
            return -1;
        }
        if (n > 0)
            snprintf(note, notelen, "--checkpoint %s: removed %d unfinished checkpoint file%s (%s), left by a run stopped "
                     "while writing %s", dir, n, n == 1 ? "" : "s", removed, n == 1 ? "it" : "them");
    }
    /* one run per directory: another run's checkpoints would be overwritten (the same steps)
     * or pruned by this one */
    dmrt_ckpt_entry *e = NULL;
    int n = dmrt_checkpoint_list(dir, &e, err, errlen), rc = n < 0 ? -1 : 0;
    /* a run without a name (resumed from a checkpoint of before names) owns those without one
     * beside the checkpoint it resumed from, and no others */
    int legacy_ok = !run && adopted && file_in_dir(adopted, dir);
    for (int i = n - 1; i >= 0 && rc == 0; i--) {
        char what[4400];
        if (run ? dmrt_checkpoint_of_run(&e[i], run) : legacy_ok && dmrt_checkpoint_of_run(&e[i], NULL)) {
            if (resumed_step < 0 || e[i].step <= resumed_step) continue;
            /* the list is ascending: the first seen is the newest of the later ones */
            dmrt_checkpoint_describe(what, sizeof what, &e[i]);
            rc = dmrt_errorf(err, errlen,
                             "--checkpoint %s holds this run's checkpoints after step %lld, the one it resumes from "
                             "(the newest: %s): its new ones would make a second history beside them (which "
                             "--checkpoint-keep would prune first, and --resume %s would pass over): move those "
                             "away, or write this run's into another directory",
                             dir, (long long)resumed_step, what, dir);
            break;
        }
        dmrt_checkpoint_describe(what, sizeof what, &e[i]);
        rc = dmrt_errorf(err, errlen,
                         "--checkpoint %s holds checkpoints of another run (the newest: %s), which this run would "
                         "overwrite or prune: write this run's into another directory, or %s%s",
                         dir, what, e[i].unreadable ? "remove that file" : "continue that run with --resume ",
                         e[i].unreadable ? "" : dir);
    }
    dmrt_checkpoint_list_free(e, n > 0 ? n : 0);
    if (rc != 0) {
        dmrt_trainer_checkpoint_unlock(dir, *lock);
        *lock = -1;
    }
    return rc;
}

void dmrt_trainer_run_id(const dmrt_st_file *resumed, char run[DMRT_RUN_ID_SIZE]) {
    const char *kept = resumed ? dmrt_st_meta(resumed, DMRT_CKPT_RUN_KEY) : NULL;
    run[0] = '\0';
    if (resumed && (!kept || !*kept || strlen(kept) >= DMRT_RUN_ID_SIZE)) return; /* it had none: neither has this */
    if (kept) {
        snprintf(run, DMRT_RUN_ID_SIZE, "%s", kept);
        return;
    }
    uint64_t r = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &r, sizeof r) != (ssize_t)sizeof r) {
        /* no /dev/urandom: the clock and the process, distinct enough between two runs */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ (uint64_t)getpid() << 40;
        r = (r ^ r >> 33) * UINT64_C(0xff51afd7ed558ccd);
    }
    if (fd >= 0) close(fd);
    snprintf(run, DMRT_RUN_ID_SIZE, "%016llx", (unsigned long long)r);
}

int dmrt_trainer_resume_check_data(const dmrt_st_file *f, const char *kind, const char *source, const char *hash,
                                   char *note, size_t notelen, char *err, size_t errlen) {
    note[0] = '\0';
    const char *trained_on = dmrt_st_meta(f, "trainer.data");
    if (trained_on && strcmp(trained_on, kind) != 0)
        return dmrt_errorf(err, errlen,
                           "checkpoint %s was trained on %s data, this run's is %s: resume on the same data (or start "
                           "from its parameters with --init)",
                           f->path, trained_on, kind);
    const char *its_hash = dmrt_st_meta(f, "trainer.data_hash"), *its_source = dmrt_st_meta(f, "trainer.data_source");
    if (!its_hash) {
        if (!dmrt_st_meta(f, "dmc.format")) return 0; /* not a checkpoint: loading it says so */
        snprintf(note, notelen,
                 "checkpoint %s records no hash of its data (written before checkpoints did): that this run's %s "
                 "data%s%s is the same is not checked",
                 f->path, kind, source ? " " : "", source ? source : "");
        return 0;
    }
    if (strcmp(its_hash, hash) != 0)
        return dmrt_errorf(err, errlen,
                           "checkpoint %s was trained on other data (%s %s, hash %s), this run's (%s %s, hash %s) "
                           "differs: resume on the same data, or start from its parameters with --init",
                           f->path, trained_on ? trained_on : kind, its_source ? its_source : "(not recorded)",
                           its_hash, kind, source ? source : "", hash);
    return 0;
}

char *dmrt_trainer_inputs_meta(char *buf, size_t len, const dmrt_model *m) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < m->n_inputs && used < len; i++) {
        char shape[256], dtype[16];
        const dmrt_tensor_desc *d = &m->inputs[i];
        /* as a .dm spells it (f32), not safetensors (F32) */
        snprintf(dtype, sizeof dtype, "%s", dmrt_dtype_name(d->dtype));
        for (char *c = dtype; *c; c++) *c = (char)tolower((unsigned char)*c);
        int w = snprintf(buf + used, len - used, "%s%s: %s%s", i ? ", " : "", d->name, dtype,
                         dmrt_shape_str(shape, sizeof shape, d->rank, d->shape));
        if (w < 0) break;
        used += (size_t)w;
    }
    return buf;
}

int dmrt_trainer_resume_check_inputs(const dmrt_st_file *f, const dmrt_model *m, char *err, size_t errlen) {
    const char *its = dmrt_st_meta(f, DMRT_CKPT_INPUTS_KEY);
    char ours[DMRT_INPUTS_META_SIZE];
    if (!its) return 0; /* written before checkpoints recorded them: not checked */
    dmrt_trainer_inputs_meta(ours, sizeof ours, m);
    if (strcmp(its, ours) == 0) return 0;
    return dmrt_errorf(err, errlen,
                       "checkpoint %s was trained on steps of inputs %s, this program's are %s: its data's position "
                       "(the rows or windows the next step reads) follows from the step and those sizes, so another "
                       "batch size or context length would not continue the run: resume with a program of the "
                       "checkpoint's inputs (compiled with the same --set), or start from its parameters with --init",
                       f->path, its, ours);
}

int dmrt_trainer_resume_read(const char *path, dmrt_st_file *f, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) return dmrt_errorf(err, errlen, "--resume %s: %s", path, strerror(errno));
    char newest[4096];
    if (S_ISDIR(st.st_mode)) {
        if (dmrt_checkpoint_latest(path, newest, sizeof newest, err, errlen) != 0) return -1;
        path = newest;
    }
    return dmrt_st_read(f, path, err, errlen);
}

int dmrt_trainer_meta_u64(const dmrt_st_file *f, const char *key, uint64_t *v, char *err, size_t errlen) {
    const char *s = dmrt_st_meta(f, key);
    if (!s) return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || !isdigit((unsigned char)s[0]) || *end)
        return dmrt_errorf(err, errlen, "%s: metadata \"%s\" is '%s', not a non-negative integer", f->path, key, s);
    *v = x;
    return 1;
}

int dmrt_trainer_checkpoint_write(const dmrt_model *m, void *ctx, const char *dir, int64_t keep, const char *run,
                                  int lead, int n_meta,
                                  const char *const *keys, const char *const *values, char *path, size_t len,
                                  char *err, size_t errlen) {
    /* (a pipeline that a checkpoint drains makes its owed updates first: the file's step) */
    if (dmrt_checkpoint_drain(m, ctx, dir, err, errlen) != 0) return -1;
    if (dmrt_checkpoint_path(dir, m->step(ctx), path, len) != 0)
        return dmrt_errorf(err, errlen, "--checkpoint %s: path too long", dir);
    if (dmrt_save_checkpoint(m, ctx, path, n_meta, keys, values, err, errlen) != 0) return -1;
    if (lead && keep > 0 && dmrt_checkpoint_prune(dir, keep > INT32_MAX ? INT32_MAX : (int)keep, run, err, errlen) != 0)
        return -1;
    return 0;
}
