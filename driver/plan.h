/* plan.h: `dmc --plan` and `--mesh auto`: the search over data x tensor x pipeline
 * meshes of a device count, micro-batch counts, pipeline schedules, ZeRO stages and
 * activation recomputation, each plan timed by the cost model (passes/cost.c) and kept
 * when it fits the memory of a device. docs/cost.md describes it. */
#ifndef DM_PLAN_H
#define DM_PLAN_H

#include <stdio.h>

#include "ast.h"
#include "diag.h"
#include "lower.h"
#include "passes.h"

typedef struct dm_plan_request {
    const dm_program *prog;
    const dm_source *src;
    const char *model;
    const dm_override *dims;    /* (n_dims) --set */
    int n_dims;
    int64_t devices;
    int64_t global_batch;       /* the batch dim's value; 0: the program's */
    /* the machine and precision, the gradient buckets' size, and the memory per device
     * (memory_limit_bytes 0: the hardware's) */
    const dm_pipeline_options *pipeline;
    int64_t bucket_floats;      /* the same bucket size, as the passes take it (0: the default) */
    const char *target;
    int exhaustive;             /* compile every plan whole, even with a repeated layer */
    int fuse_attention;         /* dm_lower_options.fuse_attention of every plan */
    int precision_given;        /* --precision was given: it wins over a precision statement */
} dm_plan_request;

typedef struct dm_plan_choice {
    int64_t mesh[3];            /* data, tensor, pipeline */
    int microbatches, schedule, zero, recompute;   /* pipe_kind, ZeRO stage, ir_recompute */
    double step_seconds, schedule_seconds, update_seconds, bubble;
    double memory_bytes;        /* the largest per device */
    double model_flops;         /* per device and step */
    int exact;                  /* from compiling the whole plan (else the probe's estimate) */
    int fits;
    unsigned axes;              /* bit a: the program's mesh has axis a (dm_plan_axes), which --mesh sets */
} dm_plan_choice;

typedef struct dm_plan_result {
    dm_plan_choice *plans;      /* (n) the plans that fit by predicted step time, then the rest */
    int n, n_fit;
    int probed;                 /* estimated from two-layer probes of the repeated layer */
    const char *layer_dim;      /* the repeat count it scaled (probed) */
    int64_t layers;
    int64_t global_batch;
    const char *batch_dim;      /* the dim it sets (the program's name for it) */
    int has_axis[3];            /* the program's mesh has data, tensor, pipeline */
    double samples, tokens;     /* per step */
    double memory_bytes;        /* the limit used */
    double seconds;             /* the search took */
} dm_plan_result;

/* Returns 0, or -1 with a message on err when no plan can be made (no mesh axis the
 * search knows, a batch the devices cannot divide, a program that does not compile). */
int dm_plan_search(const dm_plan_request *req, dm_plan_result *out, FILE *err);
void dm_plan_result_free(dm_plan_result *r);
/* The best `top` plans (0: all), and why the first wins; json: one object. */
void dm_plan_print(const dm_plan_request *req, const dm_plan_result *r, int top, int json, FILE *out);
/* The options that select plan c: "--mesh data=2,tensor=1,pipeline=1 --microbatches 1 ...",
 * the --mesh of the axes the program's mesh has (c->axes) only. */
void dm_plan_options_text(const dm_plan_choice *c, char *buf, size_t size);
/* The mesh axes the search sizes, in dm_plan_choice.mesh's order. */
extern const char *const dm_plan_axes[3];

#endif
