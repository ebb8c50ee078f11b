/* plan.c: the plan search (plan.h).
 *
 * Every candidate is the program compiled for one choice of mesh, micro-batches,
 * schedule, ZeRO stage and recomputation, timed and sized as --explain times and sizes
 * it. A deep model is not compiled whole for each: when its layers are `layer NAME =
 * repeat DIM BLOCK`, the candidate is compiled with DIM = 2 and one pipeline stage (a
 * probe of a few hundred ops), and pipeline_estimate_stages lays the second layer's costs
 * out DIM - 1 times, cuts the stages as the pipeline pass would and times them; the
 * schedule is simulated per schedule kind from the same stages. The best plans are then
 * compiled whole, so the numbers printed are --explain's. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen.h"
#include "text_buf.h"
#include "compile.h"
#include "explain.h"
#include "hardware.h"
#include "plan.h"
#include "schedule.h"

enum { AXIS_DATA, AXIS_TENSOR, AXIS_PIPELINE, SEARCHED_AXES };
const char *const dm_plan_axes[SEARCHED_AXES] = {"data", "tensor", "pipeline"};
static const int recompute_modes[] = {RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL};

typedef struct front_cache front_cache;

/* What the search needs of the program, from lowering it once as written. */
typedef struct program_facts {
    int axis_of[SEARCHED_AXES];   /* the program's mesh axis index of data, tensor, pipeline; -1 */
    const char *batch_dim;        /* the inputs' leading dim */
    int64_t batch;
    const char *group, *layer_dim;/* the repeated layer and its count's dim, or NULL */
    int64_t layers;
    double param_elems;           /* every parameter, whole */
    int states;                   /* optimizer state tensors per parameter */
    double samples, tokens;
    front_cache *fronts;          /* the program lowered for the latest candidates (compile_one) */
} program_facts;

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) abort();
    return p;
}

/* The leading dim of the first input, by name (the batch micro-batches split). */
static const char *batch_dim_of(const dm_program *prog) {
    for (int i = 0; i < prog->n_stmts; i++) {
        const dm_stmt *st = prog->stmts[i];
        if (st->kind == STMT_INPUT && st->type && st->type->rank > 0 && st->type->dims[0]->kind == EXPR_NAME)
            return st->type->dims[0]->name;
    }
    return NULL;
}

/* The top-level `layer NAME = repeat DIM ...` with the most instances. */
static void repeated_layer(const dm_program *prog, const ir_graph *g, program_facts *f) {
    for (int i = 0; i < prog->n_stmts; i++) {
        const dm_stmt *st = prog->stmts[i];
        if (st->kind != STMT_LAYER || !st->repeat || st->repeat->kind != EXPR_NAME) continue;
        for (int k = 0; k < g->n_dims; k++)
            if (strcmp(g->dim_names[k], st->repeat->name) == 0 && g->dim_values[k] > f->layers) {
                f->group = st->name;
                f->layer_dim = st->repeat->name;
                f->layers = g->dim_values[k];
            }
    }
}

/* A diagnostics sink for the compiles of candidates: their errors only say the candidate
 * is not a plan (a tensor axis that does not divide the heads, say). */
static FILE *quiet(void) {
    static FILE *sink;
    if (!sink) sink = fopen("/dev/null", "w");
    return sink;
}

static int program_facts_of(const dm_plan_request *req, program_facts *f, FILE *err) {
    memset(f, 0, sizeof *f);
    dm_override *dims = xcalloc((size_t)req->n_dims + 1, sizeof *dims);
    if (req->n_dims) memcpy(dims, req->dims, sizeof *dims * (size_t)req->n_dims);
    int n_dims = req->n_dims;
    f->batch_dim = batch_dim_of(req->prog);
    if (req->global_batch > 0) {
        if (!f->batch_dim) {
            fprintf(err, "dmc: error: --global-batch: the program's inputs have no leading dim named by a dim\n");
            free(dims);
            return -1;
        }
        for (int i = 0; i < n_dims; i++)
            if (strcmp(dims[i].name, f->batch_dim) == 0) {
                fprintf(err, "dmc: error: --global-batch and --set %s both set the batch: give one\n", f->batch_dim);
                free(dims);
                return -1;
            }
        dims[n_dims++] = (dm_override){.name = f->batch_dim, .value = req->global_batch};
    }
    /* one micro-batch: the graph's batch dim is then the step's whole batch, not the
     * micro-batch of the program's own `accumulate = K` or schedule (microbatches = M),
     * which every plan replaces with its own count */
    dm_lower_options lo = {.model = req->model, .dims = dims, .n_dims = n_dims, .microbatches = 1, .schedule = -1,
                           .zero = -1, .recompute = RECOMPUTE_MARKED};
    dm_diag d;
    dm_diag_init(&d, req->src, err);
    d.quiet_warnings = 1; /* the compile of the chosen plan prints them */
    ir_graph *g = dm_lower(req->prog, &lo, &d);
    free(dims);
    if (!g) return -1;
    if (pass_trainable(g, &d)) {
        ir_graph_free(g);
        return -1;
    }
    int status = 0;
    for (int a = 0; a < SEARCHED_AXES; a++) f->axis_of[a] = -1;
    for (int k = 0; k < g->n_axes; k++) {
        int known = -1;
        for (int a = 0; a < SEARCHED_AXES; a++)
            if (strcmp(g->axes[k].name, dm_plan_axes[a]) == 0) known = a;
        if (known < 0) {
            fprintf(err, "dmc: error: --plan searches meshes of the axes data, tensor and pipeline; the program's mesh has "
                         "'%s'\n", g->axes[k].name);
            status = -1;
        } else {
            f->axis_of[known] = k;
        }
    }
    if (g->n_axes == 0) {
        fprintf(err, "dmc: error: --plan needs a mesh: the program declares none (mesh(data = 1) makes one)\n");
        status = -1;
    }
    for (int k = 0; k < g->n_dims; k++)
        if (f->batch_dim && strcmp(g->dim_names[k], f->batch_dim) == 0) f->batch = g->dim_values[k];
    if (!f->batch_dim || f->batch <= 0) {
        fprintf(err, "dmc: error: --plan splits the batch: the program's inputs need a leading dim declared with dim\n");
        status = -1;
    }
    repeated_layer(req->prog, g, f);
    for (int p = 0; p < g->n_params; p++) f->param_elems += (double)ir_numel(&g->values[g->params[p]]->type);
    f->states = dm_optimizer_states(g);
    f->samples = samples_per_step(g, &f->tokens);
    ir_graph_free(g);
    return status;
}

/* The request's pipeline options, the cut unlimited (plans over the memory are listed, not
 * refused), on the links of the mesh axis_sizes (NULL: the compiled one). */
static dm_pipeline_options probe_options(const dm_plan_request *req, const int64_t *axis_sizes) {
    dm_pipeline_options po = *req->pipeline;
    po.memory_limit_bytes = 0;
    po.cost.axis_sizes = axis_sizes;
    return po;
}

/* One compile of the program: the user's --set with the batch (and the layer count of a
 * probe) replaced, the mesh by searched axis, and the plan's other choices. */
typedef struct compile_choice {
    const dm_plan_request *req;
    const program_facts *f;
    int64_t mesh[SEARCHED_AXES];
    int64_t batch, layers;        /* layers 0: the program's */
    int microbatches, schedule, zero, recompute;
    const int64_t *axis_sizes;    /* the links' mesh, NULL: the compiled one */
} compile_choice;

/* The program lowered and differentiated for the choices that shape it. The candidates of
 * one mesh and micro-batch count differ only in ZeRO and recomputation, which the passes
 * after autodiff read: they compile from copies of one such graph (lowering and autodiff
 * were a seventh of the search). The search goes mesh by mesh: the latest few are kept. */
enum { KEPT_FRONTS = 4 };

typedef struct lowered_front {
    int kept;
    int64_t mesh[SEARCHED_AXES], batch, layers;
    int microbatches, schedule;
    ir_graph *g;                  /* NULL: these choices do not lower */
} lowered_front;

struct front_cache {
    lowered_front front[KEPT_FRONTS];
    int next;                     /* the one replaced next, the oldest */
};

static void front_cache_free(front_cache *fc) {
    for (int i = 0; i < KEPT_FRONTS; i++) ir_graph_free(fc->front[i].g);
    memset(fc, 0, sizeof *fc);
}

static int same_front(const lowered_front *x, const compile_choice *cc) {
    return x->kept && memcmp(x->mesh, cc->mesh, sizeof x->mesh) == 0 && x->batch == cc->batch &&
           x->layers == cc->layers && x->microbatches == cc->microbatches && x->schedule == cc->schedule;
}

/* The graph for cc, lowered with lo (its choices but ZeRO's and recomputation's) unless
 * kept; owned by the cache. NULL when the choices do not lower. */
static const ir_graph *front_for(const compile_choice *cc, const dm_lower_options *lo, dm_diag *d) {
    front_cache *fc = cc->f->fronts;
    for (int i = 0; i < KEPT_FRONTS; i++)
        if (same_front(&fc->front[i], cc)) return fc->front[i].g;
    lowered_front *x = &fc->front[fc->next];
    fc->next = (fc->next + 1) % KEPT_FRONTS;
    ir_graph_free(x->g);
    *x = (lowered_front){.kept = 1, .batch = cc->batch, .layers = cc->layers, .microbatches = cc->microbatches,
                         .schedule = cc->schedule};
    memcpy(x->mesh, cc->mesh, sizeof x->mesh);
    x->g = dm_lower_differentiated(cc->req->prog, lo, cc->req->target, d);
    return x->g;
}

static int compile_one(const compile_choice *cc, dm_compiled *out) {
    const dm_plan_request *req = cc->req;
    const program_facts *f = cc->f;
    dm_override *dims = xcalloc((size_t)req->n_dims + 2, sizeof *dims), mesh[SEARCHED_AXES];
    int n_dims = 0, n_mesh = 0;
    for (int i = 0; i < req->n_dims; i++)
        if (strcmp(req->dims[i].name, f->batch_dim) != 0 && !(cc->layers && strcmp(req->dims[i].name, f->layer_dim) == 0))
            dims[n_dims++] = (dm_override){.name = req->dims[i].name, .value = req->dims[i].value};
    dims[n_dims++] = (dm_override){.name = f->batch_dim, .value = cc->batch};
    if (cc->layers) dims[n_dims++] = (dm_override){.name = f->layer_dim, .value = cc->layers};
    for (int a = 0; a < SEARCHED_AXES; a++)
        if (f->axis_of[a] >= 0) mesh[n_mesh++] = (dm_override){.name = dm_plan_axes[a], .value = cc->mesh[a]};
    /* a candidate that does not lower is not a plan, whatever else is wrong with it: a
     * third of the 1T GPT's probes fail on the vocabulary (its first layer), and lowering
     * the rest of the program after it took 5% of the search */
    dm_lower_options lo = {.model = req->model, .dims = dims, .n_dims = n_dims, .mesh = mesh, .n_mesh = n_mesh,
                           .microbatches = cc->microbatches, .schedule = cc->schedule, .zero = cc->zero,
                           .recompute = cc->recompute, .stop_at_error = 1, .fuse_attention = req->fuse_attention};
    dm_pipeline_options po = probe_options(req, cc->axis_sizes);
    dm_compile_request cr = {.lower = &lo, .pipeline = &po, .target = req->target, .plan_memory = 1,
                             .bucket_floats = req->bucket_floats, .precision_given = req->precision_given};
    dm_diag d;
    dm_diag_init(&d, req->src, quiet());
    /* counted, not printed: a third of the 1T GPT's probes fail (a tensor axis that does
     * not divide the vocabulary), and formatting their messages for /dev/null was 2% of
     * the search */
    d.max_errors = 0;
    const ir_graph *front = front_for(cc, &lo, &d);
    int status = 1;
    if (front) {
        ir_graph *g = ir_graph_copy(front);
        dm_lower_set_choices(g, &lo);
        status = dm_compile_differentiated(g, &cr, &d, out);
    } else {
        memset(out, 0, sizeof *out);
    }
    free(dims);
    return status;
}

/* The plan compiled whole: --explain's numbers. */
static int evaluate_exact(const dm_plan_request *req, const program_facts *f, dm_plan_choice *p) {
    compile_choice cc = {.req = req, .f = f, .batch = f->batch, .microbatches = p->microbatches,
                         .schedule = p->schedule, .zero = p->zero, .recompute = p->recompute};
    memcpy(cc.mesh, p->mesh, sizeof cc.mesh);
    dm_compiled c;
    int status = compile_one(&cc, &c);
    if (status == 0) {
        const dm_pipeline_plan *pl = &c.pipeline;
        p->step_seconds = pl->step_seconds;
        p->schedule_seconds = pl->timed.step;
        p->update_seconds = pl->update_seconds;
        p->bubble = pl->bubble;
        p->model_flops = pl->model_flops;
        p->memory_bytes = (double)dm_compiled_peak_bytes(&c);
        p->exact = 1;
    }
    dm_compiled_free(&c);
    return status;
}

/* A probe's (one micro-batch's) outputs, as a stage keeps them for every micro-batch. */
static double probe_output_bytes(const ir_graph *g) {
    double bytes = 0;
    for (int i = 0; i < g->n_outputs; i++) bytes += 4.0 * (double)ir_local_numel(g, &g->values[g->outputs[i]]->type);
    return bytes;
}

/* The probe's gradients held in its arena until the update (the operands of their
 * allreduces); with several micro-batches each is added to the step's sum at once. */
static double probe_partial_gradient_bytes(const ir_graph *g) {
    double bytes = 0;
    for (int p = 0; g->grads && p < g->n_params; p++)
        if (dm_micro_grad_is_temporary(g, p)) bytes += 4.0 * (double)ir_local_numel(g, &g->values[dm_micro_grad(g, p)]->type);
    return bytes;
}

/* Estimates of a candidate for each schedule from one probe: the plan with 2 layers and
 * one stage, on the whole mesh's links. Fills plans[0..kinds), returns how many (0 when
 * the probe does not compile, -1 when the model's layers cannot be laid out from it). */
static int evaluate_probe(const dm_plan_request *req, const program_facts *f, const dm_plan_choice *base, int kinds,
                          dm_plan_choice *plans) {
    int64_t axis_sizes[IR_MAX_AXES] = {0}, share = base->mesh[AXIS_DATA] * base->microbatches;
    for (int a = 0; a < SEARCHED_AXES; a++)
        if (f->axis_of[a] >= 0) axis_sizes[f->axis_of[a]] = base->mesh[a];
    compile_choice cc = {.req = req, .f = f, .batch = f->batch / share * base->mesh[AXIS_DATA], .layers = 2,
                         .microbatches = 1, .schedule = PIPE_GPIPE, .zero = base->zero, .recompute = base->recompute,
                         .axis_sizes = axis_sizes};
    memcpy(cc.mesh, base->mesh, sizeof cc.mesh);
    cc.mesh[AXIS_PIPELINE] = 1;
    dm_compiled c;
    int made = 0;
    if (compile_one(&cc, &c) == 0) {
        dm_pipeline_options po = probe_options(req, axis_sizes);
        po.microbatches = base->microbatches;
        int stages = (int)base->mesh[AXIS_PIPELINE];
        dm_stage_estimate whole;
        made = -1;
        if (pipeline_estimate_stages(c.g, &po, f->group, f->layers, stages, &whole) == 0) {
            /* as the generated code allocates (passes/memory.c): a stage's kept activations
             * once per micro-batch in flight, one set of working buffers (the probe's arena
             * less its kept activations, and less its gradients when several micro-batches
             * add each to the step's sum as it is computed), the outputs of every
             * micro-batch on the last stage, and the scratch */
            dm_memory_peak pk;
            dm_memory_peak_of(&c.memory, c.g, &c.pipeline, c.memory.scratch_elems, 0, &pk);
            double working = (double)pk.activations - whole.probe_activation_bytes;
            if (base->microbatches > 1) working -= probe_partial_gradient_bytes(c.g);
            if (working < 0) working = 0;
            double outputs = probe_output_bytes(c.g) * base->microbatches; /* on the last stage */
            /* several micro-batches: the step's gradient sum, laid out whole (4 bytes a
             * parameter element of the stage, what state_bytes counts per element) */
            double sum_per_state_byte = base->microbatches > 1 && pk.grads > 0 /* it trains */
                                            ? 1.0 / dm_state_per_param(base->zero, f->states, (double)base->mesh[AXIS_DATA])
                                            : 0;
            for (int k = 0; k < kinds; k++) {
                dm_plan_choice *p = &plans[k];
                *p = *base;
                p->schedule = k;
                pipe_schedule s;
                if (pipe_schedule_build_sends(&s, pipe_kind_for(k, stages), stages, 1, p->microbatches, whole.forward,
                                              whole.backward, whole.send))
                    abort();
                p->schedule_seconds = s.makespan;
                p->bubble = pipe_bubble(&s);
                p->update_seconds = 0;
                p->memory_bytes = 0;
                for (int q = 0; q < stages; q++) {
                    if (whole.update[q] > p->update_seconds) p->update_seconds = whole.update[q];
                    double bytes = whole.state_bytes[q] * (1 + sum_per_state_byte) + working +
                                   whole.activation_bytes[q] * pipe_in_flight(&s, q) + (double)pk.scratch +
                                   (q == stages - 1 ? outputs : 0);
                    if (bytes > p->memory_bytes) p->memory_bytes = bytes;
                }
                p->step_seconds = p->schedule_seconds + p->update_seconds;
                p->model_flops = whole.model_flops * p->microbatches / stages;
                p->exact = 0;
                pipe_schedule_free(&s);
            }
            made = kinds;
        }
        dm_stage_estimate_free(&whole);
    }
    dm_compiled_free(&c);
    return made;
}

/* Parameters, gradients and optimizer state per device can be no smaller than every
 * parameter over tensor x pipeline (ZeRO's shares over data): a plan over the limit by
 * this alone is not compiled. */
static double state_lower_bound(const program_facts *f, const dm_plan_choice *p) {
    double per = dm_state_per_param(p->zero, f->states, (double)p->mesh[AXIS_DATA]);
    return 4.0 * f->param_elems * per / (double)(p->mesh[AXIS_TENSOR] * p->mesh[AXIS_PIPELINE]);
}

typedef struct plan_list {
    dm_plan_choice *items;
    int n, cap;
} plan_list;

static dm_plan_choice *plan_push(plan_list *l) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->items = realloc(l->items, sizeof *l->items * (size_t)l->cap);
        if (!l->items) abort();
    }
    memset(&l->items[l->n], 0, sizeof l->items[0]);
    return &l->items[l->n++];
}

/* Where r is in recompute_modes: the simplest first. */
static int recompute_rank(int r) {
    int k = 0;
    while (k < (int)(sizeof recompute_modes / sizeof *recompute_modes) && recompute_modes[k] != r) k++;
    return k;
}

static int by_step(const void *a, const void *b) {
    const dm_plan_choice *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    if (x->step_seconds != y->step_seconds) return x->step_seconds < y->step_seconds ? -1 : 1;
    if (x->memory_bytes != y->memory_bytes) return x->memory_bytes < y->memory_bytes ? -1 : 1;
    /* equal: the simpler plan (less recomputation, less ZeRO, fewer micro-batches) */
    if (x->recompute != y->recompute) return recompute_rank(x->recompute) - recompute_rank(y->recompute);
    if (x->zero != y->zero) return x->zero - y->zero;
    return x->microbatches - y->microbatches;
}

/* Micro-batches of 1, 2, 4 or 8 samples per rank, or the rank's whole share (no
 * accumulation): what the search tries for a share of `share` samples. */
static int microbatch_counts(int64_t share, int *counts) {
    int n = 0;
    int64_t sizes[] = {share, 8, 4, 2, 1};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        if (sizes[k] > share || share % sizes[k] != 0 || share / sizes[k] > 4096) continue;
        int m = (int)(share / sizes[k]), seen = 0;
        for (int q = 0; q < n; q++) seen |= counts[q] == m;
        if (!seen) counts[n++] = m;
    }
    return n;
}

/* Every candidate of one mesh: estimated (probe) or compiled whole. */
static void search_mesh(const dm_plan_request *req, const program_facts *f, const int64_t mesh[SEARCHED_AXES],
                        int probing, plan_list *out, double limit, int *too_big) {
    int counts[8], n_counts = microbatch_counts(f->batch / mesh[AXIS_DATA], counts);
    int kinds = mesh[AXIS_PIPELINE] > 1 ? 2 : 1, zeros = mesh[AXIS_DATA] > 1 ? 4 : 1;
    for (int mc = 0; mc < n_counts; mc++)
        for (int z = 0; z < zeros; z++)
            for (size_t r = 0; r < sizeof recompute_modes / sizeof *recompute_modes; r++) {
                dm_plan_choice base = {.microbatches = counts[mc], .zero = z, .recompute = recompute_modes[r]};
                for (int a = 0; a < SEARCHED_AXES; a++)
                    if (f->axis_of[a] >= 0) base.axes |= 1u << a;
                memcpy(base.mesh, mesh, sizeof base.mesh);
                if (state_lower_bound(f, &base) > limit) {
                    (*too_big)++;
                    continue;
                }
                dm_plan_choice made[2];
                int n = 0;
                if (probing) n = evaluate_probe(req, f, &base, kinds, made);
                if (!probing || n < 0) {
                    /* no probe, or layers not laid out as a probe needs: compiled whole */
                    n = 0;
                    for (int k = 0; k < kinds; k++) {
                        made[n] = base;
                        made[n].schedule = k;
                        if (evaluate_exact(req, f, &made[n]) == 0) n++;
                    }
                }
                for (int k = 0; k < n; k++) {
                    made[k].fits = made[k].memory_bytes <= limit;
                    *plan_push(out) = made[k];
                }
            }
}

static void search_all(const dm_plan_request *req, const program_facts *f, int probing, plan_list *out, double limit,
                       int *too_big) {
    int64_t n = req->devices;
    for (int64_t t = 1; t <= n; t++) {
        if (n % t || (t > 1 && f->axis_of[AXIS_TENSOR] < 0)) continue;
        for (int64_t p = 1; p <= n / t; p++) {
            if ((n / t) % p || (p > 1 && f->axis_of[AXIS_PIPELINE] < 0)) continue;
            int64_t d = n / t / p;
            if ((d > 1 && f->axis_of[AXIS_DATA] < 0) || f->batch % d) continue;
            if (f->layers && p > f->layers) continue;
            int64_t mesh[SEARCHED_AXES] = {d, t, p};
            search_mesh(req, f, mesh, probing, out, limit, too_big);
        }
    }
}

/* The first CONFIRMED plans that fit, compiled whole: an estimate that turns out slower or
 * larger moves down and the next is compiled, until the first few are exact (a plan whose
 * whole compile fails is dropped). list is sorted by by_step. */
enum { CONFIRMED = 5 };
static void confirm_best(const dm_plan_request *req, const program_facts *f, plan_list *list, double limit) {
    for (;;) {
        int i = 0;
        while (i < list->n && i < CONFIRMED && list->items[i].fits && list->items[i].exact) i++;
        if (i == list->n || i == CONFIRMED || !list->items[i].fits) return;
        dm_plan_choice *p = &list->items[i];
        if (evaluate_exact(req, f, p) == 0) p->fits = p->memory_bytes <= limit;
        else *p = list->items[--list->n];
        qsort(list->items, (size_t)list->n, sizeof *list->items, by_step);
    }
}

int dm_plan_search(const dm_plan_request *req, dm_plan_result *out, FILE *err) {
    memset(out, 0, sizeof *out);
    double started = now_seconds();
    program_facts f;
    if (req->devices < 1) {
        fprintf(err, "dmc: error: --plan needs --devices N (N >= 1)\n");
        return -1;
    }
    if (program_facts_of(req, &f, err)) return -1;
    front_cache fronts = {0};
    f.fronts = &fronts;
    const struct dm_hardware *hw = cost_hardware(&req->pipeline->cost);
    double limit = req->pipeline->memory_limit_bytes > 0 ? req->pipeline->memory_limit_bytes : hw->memory_bytes;
    int probing = !req->exhaustive && f.group && f.layers >= 4;
    /* the request with the cut searches of the probes' estimates remembered */
    dm_pipeline_options pipeline = *req->pipeline;
    pipeline.cut_memo = dm_cut_memo_new();
    dm_plan_request searched = *req;
    searched.pipeline = &pipeline;
    plan_list list = {0};
    int too_big = 0;
    search_all(&searched, &f, probing, &list, limit, &too_big);
    if (list.n > 1) qsort(list.items, (size_t)list.n, sizeof *list.items, by_step); /* (none: items NULL) */
    if (probing) confirm_best(&searched, &f, &list, limit);
    dm_cut_memo_free(pipeline.cut_memo);
    front_cache_free(&fronts);
    for (int i = 0; i < list.n; i++) out->n_fit += list.items[i].fits;
    out->plans = list.items;
    out->n = list.n;
    out->probed = probing;
    out->layer_dim = f.layer_dim;
    out->layers = f.layers;
    out->global_batch = f.batch;
    out->batch_dim = f.batch_dim;
    for (int a = 0; a < SEARCHED_AXES; a++) out->has_axis[a] = f.axis_of[a] >= 0;
    out->samples = f.samples;
    out->tokens = f.tokens;
    out->memory_bytes = limit;
    out->seconds = now_seconds() - started;
    if (list.n == 0 && too_big) {
        fprintf(err, "dmc: error: --plan: no plan of %lld devices fits %.3g GiB per device: parameters, gradients and "
                     "optimizer state alone need more (--memory-gb sets the limit)\n", (long long)req->devices,
                limit / (1024.0 * 1024 * 1024));
        return -1;
    }
    if (list.n == 0) {
        fprintf(err, "dmc: error: --plan: no plan of %lld devices compiles for this program (the batch %lld must divide "
                     "by data, the sizes the tensor axis splits by tensor)\n",
                (long long)req->devices, (long long)f.batch);
        return -1;
    }
    return 0;
}

void dm_plan_result_free(dm_plan_result *r) {
    free(r->plans);
    memset(r, 0, sizeof *r);
}

static const char *recompute_name(int r) {
    return r == RECOMPUTE_FULL ? "full" : r == RECOMPUTE_SELECTIVE ? "selective" : r == RECOMPUTE_NONE ? "off" : "marked";
}

void dm_plan_options_text(const dm_plan_choice *c, char *buf, size_t size) {
    /* the axes the program has (a --mesh naming another is refused); an axis left out
     * would keep the program's size, so each is given, 1 included */
    char mesh[160] = "";
    size_t n = 0;
    for (int a = 0; a < SEARCHED_AXES && n < sizeof mesh; a++)
        if (!c->axes || (c->axes >> a & 1))
            n += (size_t)snprintf(mesh + n, sizeof mesh - n, "%s%s=%lld", n ? "," : "", dm_plan_axes[a],
                                  (long long)c->mesh[a]);
    snprintf(buf, size, "--mesh %s --microbatches %d%s%s --zero %d --recompute %s", mesh, c->microbatches,
             c->mesh[2] > 1 ? " --schedule " : "", c->mesh[2] > 1 ? pipe_kind_name((pipe_kind)c->schedule) : "", c->zero,
             recompute_name(c->recompute));
}

/* One word of a shell command: single-quoted unless it needs no quotes. */
static void text_word(dm_text *t, const char *w) {
    int plain = *w != 0;
    for (const char *p = w; *p; p++)
        if (!(isalnum((unsigned char)*p) || strchr("_-./=,:+@%", *p))) plain = 0;
    if (plain) {
        dm_text_printf(t, " %s", w);
        return;
    }
    dm_text_printf(t, " '");
    for (const char *p = w; *p; p++) {
        if (*p == '\'') dm_text_printf(t, "'\\''");
        else dm_text_printf(t, "%c", *p);
    }
    dm_text_printf(t, "'");
}

/* bytes over unit in the fewest digits that args.c reads back as bytes (times unit;
 * rounded up to a byte where ceiled, as --bucket-mb is). */
static void shortest(double bytes, double unit, int ceiled, char *buf, size_t size) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, size, "%.*g", digits, bytes / unit);
        double back = strtod(buf, NULL) * unit;
        if ((ceiled ? ceil(back) : back) == bytes) return;
    }
}

/* The options besides the plan's own that shaped the search, as dmc run takes them: the
 * --set dims and the batch (--global-batch, which dmc run takes only with --mesh auto, as
 * one more --set), --hardware, --precision (and --tf32), --target, --no-fuse-attention,
 * --bucket-mb and --memory-gb. With the plan's options (dm_plan_options_text), or with
 * --mesh auto --devices N, dmc run compiles the plan --plan printed. */
static void shaping_options(const dm_plan_request *req, const dm_plan_result *r, dm_text *t) {
    if (req->n_dims || req->global_batch > 0) {
        dm_text set = {0};
        for (int i = 0; i < req->n_dims; i++)
            dm_text_printf(&set, "%s%s=%lld", i ? "," : "", req->dims[i].name, (long long)req->dims[i].value);
        if (req->global_batch > 0)
            dm_text_printf(&set, "%s%s=%lld", req->n_dims ? "," : "", r->batch_dim, (long long)req->global_batch);
        dm_text_printf(t, " --set");
        text_word(t, set.s);
        dm_text_free(&set);
    }
    const dm_pipeline_options *po = req->pipeline;
    const struct dm_hardware *hw = cost_hardware(&po->cost);
    const char *preset = "preset ";
    if (strncmp(hw->source, preset, strlen(preset)) == 0) {
        if (strcmp(hw->source + strlen(preset), "nominal") != 0) dm_text_printf(t, " --hardware %s", hw->source + strlen(preset));
    } else {
        dm_text_printf(t, " --hardware");
        text_word(t, hw->source);
    }
    if (req->target && strcmp(req->target, "c") != 0) dm_text_printf(t, " --target %s", req->target);
    /* --tf32 is what makes the precision tf32 (cuda); --precision wins over a program's
     * precision statement only when given */
    if (po->cost.precision == DM_TF32) dm_text_printf(t, " --tf32");
    if (req->precision_given) dm_text_printf(t, " --precision %s", dm_precision_name((dm_precision)po->cost.precision));
    if (!req->fuse_attention && codegen_fuses_attention(req->target)) dm_text_printf(t, " --no-fuse-attention");
    char number[32];
    if (po->bucket_bytes > 0) {
        shortest(po->bucket_bytes, 1024.0 * 1024, 1, number, sizeof number);
        dm_text_printf(t, " --bucket-mb %s", number);
    }
    if (po->memory_limit_bytes > 0) {
        shortest(po->memory_limit_bytes, 1024.0 * 1024 * 1024, 0, number, sizeof number);
        dm_text_printf(t, " --memory-gb %s", number);
    }
}

/* What --mesh auto needs besides the shaping options to pick the same plan. */
static void auto_options(const dm_plan_request *req, dm_text *t) {
    dm_text_printf(t, " --mesh auto --devices %lld%s", (long long)req->devices, req->exhaustive ? " --plan-whole" : "");
}

static void gib(double bytes, char *buf, size_t size) {
    snprintf(buf, size, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
}

/* Why the best plan wins: against the next plan that fits, and the fastest plan that does
 * not fit (when it is faster). */
static void print_why(const dm_plan_result *r, FILE *out) {
    const dm_plan_choice *best = &r->plans[0];
    fprintf(out, "\nwhy the first: ");
    const dm_plan_choice *next = NULL;
    for (int i = 1; i < r->n_fit && !next; i++)
        if (memcmp(r->plans[i].mesh, best->mesh, sizeof best->mesh) != 0) next = &r->plans[i];
    if (!next) fprintf(out, "it is the only mesh that fits.");
    else {
        fprintf(out, "the fastest other mesh, data=%lld x tensor=%lld x pipeline=%lld with %d micro-batch%s, takes %.1f%% longer: its "
                     "schedule %.3f ms (bubble %.1f%%) and update %.3f ms against %.3f ms (bubble %.1f%%) and %.3f ms.",
                (long long)next->mesh[0], (long long)next->mesh[1], (long long)next->mesh[2], next->microbatches,
                next->microbatches == 1 ? "" : "es", 100 * (next->step_seconds / best->step_seconds - 1),
                next->schedule_seconds * 1e3, 100 * next->bubble, next->update_seconds * 1e3,
                best->schedule_seconds * 1e3, 100 * best->bubble, best->update_seconds * 1e3);
    }
    for (int i = r->n_fit; i < r->n; i++) {
        const dm_plan_choice *q = &r->plans[i];
        if (q->step_seconds >= best->step_seconds) continue;
        char need[32], limit[32];
        gib(q->memory_bytes, need, sizeof need);
        gib(r->memory_bytes, limit, sizeof limit);
        fprintf(out, "\n  Faster plans do not fit: data=%lld x tensor=%lld x pipeline=%lld (zero %d, recompute %s) would "
                     "take %.3f ms but needs %s of the %s a device has.",
                (long long)q->mesh[0], (long long)q->mesh[1], (long long)q->mesh[2], q->zero, recompute_name(q->recompute),
                q->step_seconds * 1e3, need, limit);
        break;
    }
    fprintf(out, "\n");
}

static void print_json(const dm_plan_request *req, const dm_plan_result *r, int top, FILE *out) {
    const struct dm_hardware *hw = cost_hardware(&req->pipeline->cost);
    fprintf(out, "{\"devices\": %lld, \"hardware\": ", (long long)req->devices);
    explain_json_string(out, hw->name);
    fprintf(out, ", \"precision\": \"%s\", \"global_batch\": %lld, "
                 "\"memory_limit_bytes\": %.0f, \"method\": \"%s\", \"searched\": %d, \"fit\": %d, \"seconds\": %.6f, "
                 "\"run_options\": ",
            dm_precision_name((dm_precision)req->pipeline->cost.precision),
            (long long)r->global_batch, r->memory_bytes, r->probed ? "probe" : "whole", r->n, r->n_fit, r->seconds);
    /* dmc run FILE run_options options: a plan as --plan made it; run_options auto_options:
     * the first that fits, as --mesh auto picks it */
    dm_text shaping = {0}, auto_text = {0};
    dm_text_printf(&shaping, "%s", "");
    shaping_options(req, r, &shaping);
    auto_options(req, &auto_text);
    explain_json_string(out, shaping.s + (shaping.n > 0));
    fprintf(out, ", \"auto_options\": ");
    explain_json_string(out, auto_text.s + 1);
    fprintf(out, ", \"plans\": [");
    dm_text_free(&shaping);
    dm_text_free(&auto_text);
    int shown = top > 0 && top < r->n ? top : r->n;
    for (int i = 0; i < shown; i++) {
        const dm_plan_choice *c = &r->plans[i];
        char opts[256];
        dm_plan_options_text(c, opts, sizeof opts);
        fprintf(out, "%s\n  {\"mesh\": {\"data\": %lld, \"tensor\": %lld, \"pipeline\": %lld}, \"microbatches\": %d, "
                     "\"schedule\": \"%s\", \"zero\": %d, \"recompute\": \"%s\", \"step_seconds\": %.10g, "
                     "\"schedule_seconds\": %.10g, \"update_seconds\": %.10g, \"bubble\": %.10g, \"memory_bytes\": %.0f, "
                     "\"samples_per_second\": %.10g, \"tflops_per_device\": %.10g, \"fits\": %s, \"exact\": %s, "
                     "\"options\": \"%s\"}",
                i ? "," : "", (long long)c->mesh[0], (long long)c->mesh[1], (long long)c->mesh[2], c->microbatches,
                pipe_kind_name(pipe_kind_for(c->schedule, (int)c->mesh[2])), c->zero, recompute_name(c->recompute),
                c->step_seconds, c->schedule_seconds, c->update_seconds, c->bubble, c->memory_bytes,
                r->samples / c->step_seconds, c->model_flops / c->step_seconds / 1e12, c->fits ? "true" : "false",
                c->exact ? "true" : "false", opts);
    }
    fprintf(out, "\n]}\n");
}

void dm_plan_print(const dm_plan_request *req, const dm_plan_result *r, int top, int json, FILE *out) {
    if (json) {
        print_json(req, r, top, out);
        return;
    }
    const struct dm_hardware *hw = cost_hardware(&req->pipeline->cost);
    char limit[32];
    gib(r->memory_bytes, limit, sizeof limit);
    fprintf(out, "plans of %lld device%s of %s (%s), %s products, global batch %lld, %s per device\n",
            (long long)req->devices, req->devices == 1 ? "" : "s", hw->name, hw->source,
            dm_precision_name((dm_precision)req->pipeline->cost.precision), (long long)r->global_batch, limit);
    fprintf(out, "searched %d plans in %.3f s, %d fit", r->n, r->seconds, r->n_fit);
    if (r->probed)
        fprintf(out, "; estimated from two-layer probes of %s = %lld layers, the best compiled whole", r->layer_dim,
                (long long)r->layers);
    fprintf(out, "\n\n  #  data tensor pipe  micro schedule zero recompute   step ms  bubble  update ms   memory/dev  %s\n",
            r->tokens > 0 ? "tokens/s" : "samples/s");
    int shown = top > 0 && top < r->n ? top : r->n;
    for (int i = 0; i < shown; i++) {
        const dm_plan_choice *c = &r->plans[i];
        char mem[32];
        gib(c->memory_bytes, mem, sizeof mem);
        double rate = (r->tokens > 0 ? r->tokens : r->samples) / c->step_seconds;
        fprintf(out, "%3d %5lld %6lld %4lld %6d %-8s %4d %-9s %9.3f %6.1f%% %10.3f %12s  %.4g%s%s\n", i + 1,
                (long long)c->mesh[0], (long long)c->mesh[1], (long long)c->mesh[2], c->microbatches,
                c->mesh[2] > 1 ? pipe_kind_name((pipe_kind)c->schedule) : "-", c->zero, recompute_name(c->recompute),
                c->step_seconds * 1e3, c->bubble > 0 ? 100 * c->bubble : 0.0, c->update_seconds * 1e3, mem, rate,
                c->exact ? "" : " (estimate)", c->fits ? "" : " (does not fit)");
    }
    if (r->n_fit == 0) {
        double smallest = r->plans[0].memory_bytes;
        for (int i = 1; i < r->n; i++)
            if (r->plans[i].memory_bytes < smallest) smallest = r->plans[i].memory_bytes;
        char need[32];
        gib(smallest, need, sizeof need);
        fprintf(out, "\nno plan fits %s per device: the smallest needs %s (--memory-gb sets the limit; more devices "
                     "split more)\n", limit, need);
        return;
    }
    print_why(r, out);
    char opts[256];
    dm_plan_options_text(&r->plans[0], opts, sizeof opts);
    dm_text cmd = {0};
    dm_text_printf(&cmd, "dmc run");
    text_word(&cmd, req->src->path);
    shaping_options(req, r, &cmd);
    size_t common = cmd.n;
    fprintf(out, "\nrun it: %s %s\n", cmd.s, opts);
    cmd.n = common;
    auto_options(req, &cmd);
    fprintf(out, "    or: %s\n", cmd.s);
    dm_text_free(&cmd);
}
