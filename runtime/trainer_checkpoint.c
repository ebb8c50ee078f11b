/* trainer_checkpoint.c: the trainer's directory of checkpoints (trainer_checkpoint.h). */
#include "trainer_checkpoint.h"
#include "trainer_guards.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int dmrt_trainer_checkpoint_dir(const char *dir, char *err, size_t errlen) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return dmrt_errorf(err, errlen, "--checkpoint %s: cannot create the directory: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dmrt_errorf(err, errlen, "--checkpoint %s: not a directory", dir);
    char probe[4096];
    if (dmrt_checkpoint_path(dir, 0, probe, sizeof probe) != 0)
        return dmrt_errorf(err, errlen, "--checkpoint %s: path too long", dir);
    return dmrt_trainer_guard_writable("--checkpoint", probe, err, errlen);
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
    if (errno || end == s || *end || s[0] == '-')
        return dmrt_errorf(err, errlen, "%s: metadata \"%s\" is '%s', not a non-negative integer", f->path, key, s);
    *v = x;
    return 1;
}

int dmrt_trainer_checkpoint_write(const dmrt_model *m, void *ctx, const char *dir, int64_t keep, int lead, int n_meta,
                                  const char *const *keys, const char *const *values, char *path, size_t len,
                                  char *err, size_t errlen) {
    if (dmrt_checkpoint_path(dir, m->step(ctx), path, len) != 0)
        return dmrt_errorf(err, errlen, "--checkpoint %s: path too long", dir);
    if (dmrt_save_checkpoint(m, ctx, path, n_meta, keys, values, err, errlen) != 0) return -1;
    if (lead && keep > 0 && dmrt_checkpoint_prune(dir, keep > INT32_MAX ? INT32_MAX : (int)keep, err, errlen) != 0)
        return -1;
    return 0;
}
