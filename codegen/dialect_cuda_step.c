/* dialect_cuda_step.c: the CUDA dialect's hooks for a serial step without host round
 * trips (codegen/emit_step_end.c, emit_clip.c): the inputs' upload, the step's one wait at
 * its end, and gradient clipping on the device. */
#include "dialect.h"

void cuda_upload(cg_writer *w, const char *dst, const char *src, const char *bytes, long long offset, const char *on_fail) {
    cg_line(w, "if (dmrt_gpu_upload(ctx->gpu, %s, %s, %s, %lld) != DMRT_OK) %s", dst, src, bytes, offset, on_fail);
}

void cuda_upload_reserve(cg_writer *w, long long bytes, const char *on_fail) {
    cg_line(w, "if (dmrt_gpu_upload_reserve(ctx->gpu, %lld) != DMRT_OK) %s", bytes, on_fail);
}

void cuda_step_end(cg_writer *w, const char *loss, const char *loss_host, const char *fault) {
    cg_line(w, "if (dmrt_gpu_step_end(ctx->gpu, %s, %s, %s) != DMRT_OK) return device_failed(ctx);", loss ? loss : "NULL",
            loss_host, fault);
}

void cuda_clip_reserve(cg_writer *w, int gradients, const char *on_fail) {
    cg_line(w, "if (dmrt_gpu_clip_reserve(ctx->gpu, %d) != DMRT_OK) %s", gradients, on_fail);
}

void cuda_clip_squares(cg_writer *w, const char *x, const char *count, int slot) {
    cg_line(w, "if (dmrt_gpu_clip_squares(ctx->gpu, %s, %s, %d) != DMRT_OK) return device_failed(ctx);", x, count, slot);
}

void cuda_clip_factor(cg_writer *w, int gradients, const char *clip) {
    cg_line(w, "if (dmrt_gpu_clip_factor(ctx->gpu, %d, %s) != DMRT_OK) return device_failed(ctx);", gradients, clip);
}

void cuda_clip_scale(cg_writer *w, const char *x, const char *count) {
    cg_line(w, "if (dmrt_gpu_clip_scale(ctx->gpu, %s, %s) != DMRT_OK) return device_failed(ctx);", x, count);
}
