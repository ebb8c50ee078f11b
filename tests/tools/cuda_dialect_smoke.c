/* cuda_dialect_smoke: drives codegen/dialect_cuda.c's hooks with hand-made kernel
 * descriptions (no emitter) and writes two files into the directory given:
 *
 *   smoke.cu       the dialect's preamble, a stand-in context struct, its helpers, the
 *                  kernels section and host functions calling every hook: compile it with
 *                  nvcc -Werror all-warnings to prove the generated code is warning-free.
 *   smoke_emu.cpp  the same kernels and loop-nest launches, with CUDA's launch syntax
 *                  replaced by a sequential emulation of the grid, next to the C dialect's
 *                  loops for the same descriptions (the reference); its main() runs both on
 *                  random data, with the grid the dialect chose and with a tiny grid (so
 *                  that the grid-stride loops wrap), and compares every output bit for bit.
 *                  Any C++ compiler builds it: this checks the kernels' index math without
 *                  a GPU.
 *
 *   cuda_dialect_smoke OUTDIR [NESTS]
 *
 * NESTS: more loop nests, one a line, as recorded from a real model (see
 * cuda_dialect_smoke.sh): rank n_in accumulate out_elems out_offset size... out_stride...
 * then per operand var const|- stride... offset, then the scale (or -) and the expr to the
 * end of the line. They join both files (their buffers are the host function's
 * parameters), so the nvcc time of a realistic file can be measured.
 *
 * Build (from the repository root):
 *   gcc -std=c11 -Wall -Wextra -Werror -D_POSIX_C_SOURCE=200809L -Iir -Icodegen -Ifrontend \
 *       tests/tools/cuda_dialect_smoke.c codegen/dialect_cuda*.c codegen/dialect_c.c codegen/dialect_c_rows.c -o smoke */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dialect.h"

static void die(const char *what) {
    perror(what);
    exit(2);
}

/* ---- writers into memory ------------------------------------------------------------------- */

typedef struct mem_writer {
    cg_writer w;
    char *text;
    size_t len;
} mem_writer;

static void mem_open(mem_writer *m) {
    memset(m, 0, sizeof *m);
    m->w.f = open_memstream(&m->text, &m->len);
    if (!m->w.f) die("open_memstream");
}

static void mem_close(mem_writer *m) {
    fclose(m->w.f);
    m->w.f = NULL;
}

/* ---- loop-nest cases ----------------------------------------------------------------------- */

typedef struct nest_case {
    const char *what;
    cg_loop_nest k;
    int i32;                  /* buffers are int32_t (a copy of ids) */
    int out_in_scratch;       /* out is (ctx->scratch + 16): an expression, not a name */
    int cast;                 /* out also stored rounded to bf16 into `cast` (cast_out) */
    int also;                 /* expr's first local also stored into `also` (also_out: a bias's
                               * activation, pass_fuse_bias), checked as product + bias */
    char exprbuf[512], scalebuf[64], varbuf[CG_MAX_OPERANDS][16], constbuf[CG_MAX_OPERANDS][64];
} nest_case;

#define MAX_CASES 4096
static nest_case *cases;  /* the test's own table (this is a test program, not generated code) */
static int n_cases;

static nest_case *new_case(const char *what) {
    if (n_cases == MAX_CASES) {
        fprintf(stderr, "too many cases\n");
        exit(2);
    }
    nest_case *c = &cases[n_cases++];
    memset(c, 0, sizeof *c);
    c->what = what;
    return c;
}

static void add_builtin_cases(void) {
    nest_case *c;

    /* gelu forward: a unary op, contiguous */
    c = new_case("gelu");
    c->k = (cg_loop_nest){.rank = 1, .size = {1000}, .n_in = 1, .var = {"x"}, .stride = {{1}}, .out_stride = {1},
                          .out_elems = 1000, .expr = "0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)))"};

    /* gelu backward: a local `name = e;`, operands (x, y, dy) of which y is unused */
    c = new_case("gelu_grad");
    c->k = (cg_loop_nest){.rank = 1, .size = {777}, .n_in = 3, .var = {"x", "y", "dy"}, .stride = {{1}, {1}, {1}},
                          .out_stride = {1}, .out_elems = 777,
                          .expr = "tanh_inner = tanhf(0.7978845608f * (x + 0.044715f * x * x * x)); "
                                  "dy * (0.5f * (1.0f + tanh_inner) + 0.5f * x * (1.0f - tanh_inner * tanh_inner) * 0.7978845608f * (1.0f + 0.134145f * x * x))"};

    /* a + b, b broadcast along the rows (stride 0 on dim 0) */
    c = new_case("bias_add");
    c->k = (cg_loop_nest){.rank = 2, .size = {37, 24}, .n_in = 2, .var = {"a", "b"}, .stride = {{24, 1}, {0, 1}},
                          .out_stride = {24, 1}, .out_elems = 37 * 24, .expr = "a + b"};

    /* a * b with b a constant; a broadcast on its last dim */
    c = new_case("scale_by_constant");
    c->k = (cg_loop_nest){.rank = 2, .size = {9, 13}, .n_in = 2, .var = {"a", "b"}, .constant = {NULL, "0.125f"},
                          .stride = {{1, 0}, {0, 0}}, .out_stride = {13, 1}, .out_elems = 9 * 13, .expr = "a * b"};

    /* a - b, a broadcast over dim 1, b over dim 0 (outer difference) */
    c = new_case("outer_sub");
    c->k = (cg_loop_nest){.rank = 2, .size = {11, 7}, .n_in = 2, .var = {"a", "b"}, .stride = {{1, 0}, {0, 1}},
                          .out_stride = {7, 1}, .out_elems = 77, .expr = "a - b"};

    /* mean over dim 1 of (6, 50, 8): (6, 8), times 1/50 */
    c = new_case("mean_middle");
    c->k = (cg_loop_nest){.rank = 3, .size = {6, 50, 8}, .n_in = 1, .var = {"x"}, .stride = {{400, 8, 1}},
                          .out_stride = {8, 0, 1}, .out_elems = 48, .expr = "x", .accumulate = 1, .scale = "0.0199999996f"};

    /* sum_to over dims 0 and 2 of (4, 5, 6): (5) (a bias gradient of a 3-d tensor) */
    c = new_case("sum_outer_inner");
    c->k = (cg_loop_nest){.rank = 3, .size = {4, 5, 6}, .n_in = 1, .var = {"x"}, .stride = {{30, 6, 1}},
                          .out_stride = {0, 1, 0}, .out_elems = 5, .expr = "x", .accumulate = 1};

    /* sum of everything: a scalar */
    c = new_case("sum_all");
    c->k = (cg_loop_nest){.rank = 1, .size = {3001}, .n_in = 1, .var = {"x"}, .stride = {{1}}, .out_stride = {0},
                          .out_elems = 1, .expr = "x", .accumulate = 1};

    /* sum over rows of (300, 17) (the common bias gradient) */
    c = new_case("sum_rows");
    c->k = (cg_loop_nest){.rank = 2, .size = {300, 17}, .n_in = 1, .var = {"x"}, .stride = {{17, 1}}, .out_stride = {0, 1},
                          .out_elems = 17, .expr = "x", .accumulate = 1};

    /* long sums with few outputs, split in chunks (cg_cuda_sum_is_split): compared within
     * rounding, not bit for bit. Bias gradient of (4096, 24) rows */
    c = new_case("sum_rows_split");
    c->k = (cg_loop_nest){.rank = 2, .size = {4096, 24}, .n_in = 1, .var = {"x"}, .stride = {{24, 1}}, .out_stride = {0, 1},
                          .out_elems = 24, .expr = "x", .accumulate = 1};
    /* everything to a scalar: no kept dim */
    c = new_case("sum_all_split");
    c->k = (cg_loop_nest){.rank = 1, .size = {70000}, .n_in = 1, .var = {"x"}, .stride = {{1}}, .out_stride = {0},
                          .out_elems = 1, .expr = "x", .accumulate = 1};
    /* two summed dims (flattened, the outer first), a scale, and an out it covers in part */
    c = new_case("sum_two_dims_split");
    c->k = (cg_loop_nest){.rank = 3, .size = {40, 50, 33}, .n_in = 2, .var = {"a", "b"}, .stride = {{1650, 33, 1}, {0, 33, 1}},
                          .out_stride = {0, 0, 1}, .out_offset = 3, .out_elems = 40, .expr = "a * b", .accumulate = 1,
                          .scale = "0.5f"};
    /* a summed dim no operand reads (the sum of a broadcast) */
    c = new_case("sum_broadcast_split");
    c->k = (cg_loop_nest){.rank = 3, .size = {3, 2000, 12}, .n_in = 1, .var = {"x"}, .stride = {{0, 12, 1}}, .out_stride = {0, 0, 1},
                          .out_elems = 12, .expr = "x", .accumulate = 1};
    /* outputs no operand reads (every output the same sum): the chunks still
     * land at chunk * outputs + output, where the second kernel reads them */
    c = new_case("sum_to_every_output_split");
    c->k = (cg_loop_nest){.rank = 2, .size = {4, 20000}, .n_in = 1, .var = {"x"}, .stride = {{0, 1}}, .out_stride = {1, 0},
                          .out_elems = 4, .expr = "x", .accumulate = 1};

    /* transpose (3, 4, 5) -> perm (2, 0, 1): out (5, 3, 4) */
    c = new_case("transpose");
    c->k = (cg_loop_nest){.rank = 3, .size = {5, 3, 4}, .n_in = 1, .var = {"x"}, .stride = {{1, 20, 5}},
                          .out_stride = {12, 4, 1}, .out_elems = 60, .expr = "x"};

    /* attention heads: (B, T, NH, hs) -> (B, NH, T, hs) */
    c = new_case("heads");
    c->k = (cg_loop_nest){.rank = 4, .size = {2, 3, 5, 4}, .n_in = 1, .var = {"x"}, .stride = {{60, 4, 12, 1}},
                          .out_stride = {60, 20, 4, 1}, .out_elems = 120, .expr = "x"};

    /* the casts folded into the loop that writes their operand (codegen/emit_fused_cast.c):
     * the heads' merge, gelu with a local, and a sum over a dim (CUDA writes that cast in
     * a kernel of its own after the nest) */
    c = new_case("heads_merge_cast");
    c->cast = 1;
    c->k = (cg_loop_nest){.rank = 4, .size = {2, 5, 3, 4}, .n_in = 1, .var = {"x"}, .stride = {{60, 4, 20, 1}},
                          .out_stride = {60, 12, 4, 1}, .out_elems = 120, .expr = "x"};
    c = new_case("gelu_grad_cast");
    c->cast = 1;
    c->k = (cg_loop_nest){.rank = 1, .size = {777}, .n_in = 3, .var = {"x", "y", "dy"}, .stride = {{1}, {1}, {1}},
                          .out_stride = {1}, .out_elems = 777,
                          .expr = "tanh_inner = tanhf(0.7978845608f * (x + 0.044715f * x * x * x)); "
                                  "dy * (0.5f * (1.0f + tanh_inner) + 0.5f * x * (1.0f - tanh_inner * tanh_inner) * 0.7978845608f * (1.0f + 0.134145f * x * x))"};
    c = new_case("sum_cast");
    c->cast = 1;
    c->k = (cg_loop_nest){.rank = 2, .size = {6, 17}, .n_in = 1, .var = {"x"}, .stride = {{17, 1}}, .out_stride = {0, 1},
                          .out_elems = 17, .expr = "x", .accumulate = 1};

    /* a bias's activation (passes/fuse_bias.c): the product plus the bias broadcast
     * over the rows, stored (also_out), then gelu of it; and the same with its bf16 copy */
    c = new_case("bias_gelu");
    c->also = 1;
    c->k = (cg_loop_nest){.rank = 2, .size = {33, 40}, .n_in = 2, .var = {"product", "bias"}, .stride = {{40, 1}, {0, 1}},
                          .out_stride = {40, 1}, .out_elems = 33 * 40,
                          .expr = "pre_activation = product + bias; "
                                  "0.5f * pre_activation * (1.0f + tanhf(0.7978845608f * (pre_activation + 0.044715f * "
                                  "pre_activation * pre_activation * pre_activation)))"};
    c = new_case("bias_gelu_cast");
    c->also = 1, c->cast = 1;
    c->k = cases[n_cases - 2].k;

    /* pad: (4, 6) into (4, 10) at offset 3 of dim 1: out zeroed, then the window */
    c = new_case("pad");
    c->k = (cg_loop_nest){.rank = 2, .size = {4, 6}, .n_in = 1, .var = {"x"}, .stride = {{6, 1}}, .out_stride = {10, 1},
                          .out_offset = 3, .out_elems = 40, .expr = "x", .accumulate = 1};

    /* slice: (4, 10) window 2..7 of dim 1 -> (4, 5) */
    c = new_case("slice");
    c->k = (cg_loop_nest){.rank = 2, .size = {4, 5}, .n_in = 1, .var = {"x"}, .stride = {{10, 1}}, .offset = {2},
                          .out_stride = {5, 1}, .out_elems = 20, .expr = "x"};

    /* relu backward: operands (x, y, dy), y unused */
    c = new_case("relu_grad");
    c->k = (cg_loop_nest){.rank = 1, .size = {500}, .n_in = 3, .var = {"x", "y", "dy"}, .stride = {{1}, {1}, {1}},
                          .out_stride = {1}, .out_elems = 500, .expr = "x > 0.0f ? dy : 0.0f"};

    /* an all-gather's interleave, scratch (k, outer, block) -> out (outer, k, block) */
    c = new_case("gather_interleave");
    c->k = (cg_loop_nest){.rank = 3, .size = {3, 2, 5}, .n_in = 1, .var = {"x"}, .stride = {{5, 15, 1}},
                          .out_stride = {10, 5, 1}, .out_elems = 30, .expr = "x"};

    /* alltoall unpack-like: out strides not in the nest's order */
    c = new_case("unpack");
    c->k = (cg_loop_nest){.rank = 3, .size = {2, 3, 4}, .n_in = 1, .var = {"x"}, .stride = {{12, 4, 1}},
                          .out_stride = {4, 8, 1}, .out_elems = 24, .expr = "x"};

    /* a copy of int32 ids (a shard slice: this rank's block at an offset) */
    c = new_case("ids_block");
    c->i32 = 1;
    c->k = (cg_loop_nest){.rank = 1, .size = {64}, .n_in = 1, .var = {"x"}, .stride = {{1}}, .offset = {128},
                          .out_stride = {1}, .out_elems = 64, .expr = "x"};

    /* out an expression (a pointer into scratch) */
    c = new_case("into_scratch");
    c->out_in_scratch = 1;
    c->k = (cg_loop_nest){.rank = 2, .size = {3, 8}, .n_in = 1, .var = {"x"}, .stride = {{1, 3}}, .out_stride = {8, 1},
                          .out_elems = 24, .expr = "-x"};

    /* a scalar (rank 0): the loss times a constant */
    c = new_case("scalar");
    c->k = (cg_loop_nest){.rank = 0, .n_in = 2, .var = {"a", "b"}, .constant = {NULL, "2.0f"}, .out_elems = 1, .expr = "a * b"};

    /* big enough for several blocks and more than one pass of the tiny grid */
    c = new_case("many_rows");
    c->k = (cg_loop_nest){.rank = 2, .size = {1030, 3}, .n_in = 2, .var = {"a", "b"}, .stride = {{3, 1}, {0, 1}},
                          .out_stride = {3, 1}, .out_elems = 3090, .expr = "a / b"};

    /* overlapping positions (never made by the emitter): the one-thread kernel */
    c = new_case("overlap_serial");
    c->k = (cg_loop_nest){.rank = 2, .size = {4, 5}, .n_in = 1, .var = {"x"}, .stride = {{5, 1}}, .out_stride = {1, 1},
                          .out_elems = 8, .expr = "x", .accumulate = 1, .scale = "0.5f"};

    /* summed dims without accumulation (last write wins; never made): the one-thread kernel */
    c = new_case("last_write_serial");
    c->k = (cg_loop_nest){.rank = 2, .size = {4, 5}, .n_in = 1, .var = {"x"}, .stride = {{5, 1}}, .out_stride = {0, 1},
                          .out_elems = 5, .expr = "x * 3.0f"};

    /* accumulate with scale into a window: the rest stays zero */
    c = new_case("pad_scaled");
    c->k = (cg_loop_nest){.rank = 2, .size = {3, 4}, .n_in = 1, .var = {"x"}, .stride = {{4, 1}}, .out_stride = {6, 1},
                          .out_offset = 1, .out_elems = 18, .expr = "x", .accumulate = 1, .scale = "0.25f"};

    /* no elements */
    c = new_case("empty");
    c->k = (cg_loop_nest){.rank = 2, .size = {0, 4}, .n_in = 1, .var = {"x"}, .stride = {{4, 1}}, .out_stride = {4, 1},
                          .out_elems = 0, .expr = "x"};

    /* the same shape again as bias_add: reuses its kernel */
    c = new_case("bias_add_again");
    c->k = cases[2].k;
}

/* ---- recorded nests ------------------------------------------------------------------------ */

static void read_nests(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) die(path);
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        nest_case *c = new_case("recorded");
        cg_loop_nest *k = &c->k;
        char *p = line, *end;
        long long v[8];
        for (int i = 0; i < 5; i++) {
            v[i] = strtoll(p, &end, 10);
            p = end;
        }
        k->rank = (int)v[0], k->n_in = (int)v[1], k->accumulate = (int)v[2], k->out_elems = v[3], k->out_offset = v[4];
        for (int d = 0; d < k->rank; d++) k->size[d] = strtoll(p, &p, 10);
        for (int d = 0; d < k->rank; d++) k->out_stride[d] = strtoll(p, &p, 10);
        for (int i = 0; i < k->n_in; i++) {
            int n = 0;
            if (sscanf(p, " %15s %63s%n", c->varbuf[i], c->constbuf[i], &n) != 2) {
                fprintf(stderr, "%s: bad line\n", path);
                exit(2);
            }
            p += n;
            k->var[i] = c->varbuf[i];
            k->constant[i] = strcmp(c->constbuf[i], "-") ? c->constbuf[i] : NULL;
            for (int d = 0; d < k->rank; d++) k->stride[i][d] = strtoll(p, &p, 10);
            k->offset[i] = strtoll(p, &p, 10);
        }
        int n = 0;
        if (sscanf(p, " %63s %n", c->scalebuf, &n) != 1) {
            fprintf(stderr, "%s: bad line\n", path);
            exit(2);
        }
        p += n;
        k->scale = strcmp(c->scalebuf, "-") ? c->scalebuf : NULL;
        snprintf(c->exprbuf, sizeof c->exprbuf, "%s", p);
        c->exprbuf[strcspn(c->exprbuf, "\n")] = 0;
        k->expr = c->exprbuf;
    }
    fclose(f);
}

/* ---- the files ----------------------------------------------------------------------------- */

/* Elements operand i reaches (its largest index + 1). */
static int64_t operand_elems(const cg_loop_nest *k, int i) {
    int64_t last = k->offset[i];
    for (int d = 0; d < k->rank; d++) {
        if (k->size[d] == 0) return 0;
        last += k->stride[i][d] * (k->size[d] - 1);
    }
    return last + 1;
}

/* The case's buffer names, set in its cg_loop_nest: out (or scratch), in_<var>. */
static void name_buffers(nest_case *c, char names[CG_MAX_OPERANDS][32]) {
    c->k.out = c->out_in_scratch ? "(ctx->scratch + 16)" : "out";
    if (c->cast) c->k.cast_out = "cast", c->k.cast_dtype = DT_BF16;
    if (c->also) c->k.also_out = "also";
    for (int i = 0; i < c->k.n_in; i++) {
        snprintf(names[i], 32, "in_%s", c->k.var[i]);
        c->k.buffer[i] = c->k.constant[i] ? NULL : names[i];
    }
}

/* "struct_ctx *ctx, float *out, const float *in_x" */
static void params(FILE *f, const nest_case *c) {
    const char *t = c->i32 ? "int32_t" : "float";
    fprintf(f, "struct_ctx *ctx");
    if (!c->out_in_scratch) fprintf(f, ", %s *out", t);
    for (int i = 0; i < c->k.n_in; i++)
        if (!c->k.constant[i]) fprintf(f, ", const %s *in_%s", t, c->k.var[i]);
    if (c->also) fprintf(f, ", float *also");
    if (c->cast) fprintf(f, ", uint16_t *cast");
}

static void host_nests(const cg_dialect *d, cg_writer *w, int reference) {
    for (int n = 0; n < n_cases; n++) {
        nest_case *c = &cases[n];
        char names[CG_MAX_OPERANDS][32];
        name_buffers(c, names);
        fprintf(w->f, "/* %s */\n%s %s_%d(", c->what, reference ? "static int" : "int", reference ? "ref" : "nest", n);
        params(w->f, c);
        fprintf(w->f, ") {\n");
        w->indent = 1;
        /* a loop nest ignores the operands its expression does not name (and C ignores ctx) */
        cg_line(w, "(void)ctx;");
        if (!c->out_in_scratch) cg_line(w, "(void)out;");
        for (int i = 0; i < c->k.n_in; i++)
            if (!c->k.constant[i]) cg_line(w, "(void)in_%s;", c->k.var[i]);
        if (c->cast) cg_line(w, "(void)cast;");
        if (c->also) cg_line(w, "(void)also;");
        d->loop_nest(w, &c->k);
        cg_line(w, "return 0;");
        w->indent = 0;
        cg_line(w, "}");
        cg_blank(w);
    }
}

/* Every other hook, in the shape of the emitter's functions. */
static void host_others(const cg_dialect *d, cg_writer *w) {
    char callee[128];
    ir_optimizer sgd = {.kind = OPTIM_SGD, .lr = 0.01, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-4, .nesterov = 1};
    ir_optimizer adamw = {.kind = OPTIM_ADAMW, .lr = 6e-4, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};

    cg_line(w, "struct_ctx *smoke_create(dmrt_rank *rank, const float *host_params) {");
    w->indent++;
    cg_line(w, "struct_ctx *ctx = (struct_ctx *)calloc(1, sizeof *ctx);");
    cg_line(w, "if (!ctx) return NULL;");
    cg_line(w, "ctx->rank = rank;");
    d->ctx_open(w, 1, 1, "goto fail;");
    d->alloc(w, "ctx->params", "4096 * sizeof(float)", "goto fail;");
    d->alloc(w, "ctx->scratch", "65536 * sizeof(float)", "goto fail;");
    d->copy(w, "ctx->params", "host_params", "4096 * sizeof(float)", CG_HOST_TO_DEVICE, "goto fail;");
    d->zero(w, "ctx->scratch", "65536 * sizeof(float)", "goto fail;");
    cg_line(w, "return ctx;");
    w->indent--;
    cg_line(w, "fail:");
    w->indent++;
    cg_line(w, "fprintf(stderr, \"smoke: %%s\\n\", ctx->error);");
    d->free(w, "ctx->scratch");
    d->free(w, "ctx->params");
    d->ctx_close(w);
    cg_line(w, "free(ctx);");
    cg_line(w, "return NULL;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);

    cg_line(w, "struct_ctx *smoke_create_serial(dmrt_rank *beside) {");
    w->indent++;
    cg_line(w, "struct_ctx *ctx = (struct_ctx *)calloc(1, sizeof *ctx);");
    cg_line(w, "if (!ctx) return NULL;");
    d->ctx_open(w, 0, 0, "{ free(ctx); return NULL; }");
    cg_line(w, "return ctx;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);

    cg_line(w, "void smoke_destroy(struct_ctx *ctx) {");
    w->indent++;
    d->free(w, "ctx->scratch");
    d->free(w, "ctx->params");
    d->ctx_close(w);
    cg_line(w, "free(ctx);");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);

    cg_line(w, "int smoke_read(struct_ctx *ctx, float *host) {");
    w->indent++;
    d->copy(w, "host", "ctx->params", "16 * sizeof(float)", CG_DEVICE_TO_HOST, "return device_failed(ctx);");
    d->copy(w, "ctx->scratch", "ctx->params", "16 * sizeof(float)", CG_DEVICE_TO_DEVICE, "return device_failed(ctx);");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);

    /* a forward and backward over buffers in ctx->params and ctx->scratch */
    cg_line(w, "int smoke_step(struct_ctx *ctx, const int32_t *ids, const int32_t *targets) {");
    w->indent++;
    cg_line(w, "float *x = ctx->params + 0; /* (4, 8) */");
    cg_line(w, "float *wt = ctx->params + 32; /* (8, 8) */");
    cg_line(w, "float *h = ctx->scratch + 0; /* (4, 8) */");
    cg_line(w, "float *g = ctx->scratch + 32; /* (4, 8) */");
    cg_line(w, "float *ln_w = ctx->params + 96, *ln_b = ctx->params + 104; /* (8) */");
    cg_line(w, "float *loss = ctx->scratch + 64; /* (1) */");
    cg_line(w, "float *stats = ctx->scratch + 80; /* (4, 3) */");
    cg_line(w, "float *m = ctx->params + 200, *v = ctx->params + 300, *grad = ctx->scratch + 400; /* (64) */");

    cg_gemm mm = {.m = 4, .n = 8, .k = 8, .lda = 8, .ldb = 8, .ldc = 8, .a = "x", .b = "wt", .c = "h", .batch = 1};
    d->gemm(w, &mm);
    cg_gemm mm2 = {.trans_a = 1, .m = 8, .n = 8, .k = 4, .lda = 8, .ldb = 8, .ldc = 8, .a = "x", .b = "g", .c = "wt", .accumulate = 1,
                   .batch = 1};
    d->gemm(w, &mm2);
    cg_gemm bmm = {.trans_b = 1, .m = 2, .n = 2, .k = 4, .lda = 4, .ldb = 4, .ldc = 2, .a = "x", .b = "h", .c = "g", .batch = 4,
                   .batch_stride_a = 8, .batch_stride_b = 8, .batch_stride_c = 4};
    d->gemm(w, &bmm);

    cg_rowwise sm = {.outer = 4, .n = 8, .inner = 1, .x = "h", .out = "g", .scale = "0.353553385f", .causal_queries = 4};
    d->softmax(w, &sm);
    cg_rowwise sm2 = {.outer = 2, .n = 4, .inner = 4, .x = "h", .out = "g"};
    d->softmax(w, &sm2);
    cg_rowwise smg = {.outer = 4, .n = 8, .inner = 1, .y = "g", .dy = "h", .out = "x", .scale = "0.353553385f", .causal_queries = 4};
    d->softmax_grad(w, &smg);
    cg_rowwise smg2 = {.outer = 4, .n = 8, .inner = 1, .y = "g", .dy = "h", .out = "x"};
    d->softmax_grad(w, &smg2);
    cg_rowwise cm = {.outer = 1, .n = 4, .inner = 8, .x = "h", .out = "g", .fill = "-INFINITY"};
    d->causal_mask(w, &cm);
    cg_rowwise cm0 = {.outer = 1, .n = 4, .inner = 8, .x = "g", .out = "h", .fill = "0.0f"};
    d->causal_mask(w, &cm0);
    cg_rowwise ln = {.outer = 4, .n = 8, .inner = 1, .x = "x", .weight = "ln_w", .bias = "ln_b", .out = "h", .eps = "9.99999975e-06f"};
    d->layernorm(w, &ln);
    cg_rowwise lnr = ln;
    lnr.sum_a = "g", lnr.sum_b = "wt";
    d->layernorm(w, &lnr);
    cg_rowwise lng = {.outer = 4, .n = 8, .inner = 1, .x = "x", .weight = "ln_w", .dy = "h", .out = "g", .eps = "9.99999975e-06f"};
    d->layernorm_grad(w, &lng);
    cg_rowwise lnga = lng;
    lnga.accumulate = 1;
    d->layernorm_grad(w, &lnga);
    cg_rowwise lnw = {.outer = 4, .n = 8, .inner = 1, .x = "x", .dy = "h", .out = "ln_w", .eps = "9.99999975e-06f"};
    d->layernorm_wgrad(w, &lnw);
    cg_rowwise lnwb = lnw;
    lnwb.bias_grad_out = "ln_b";
    d->layernorm_wgrad(w, &lnwb);

    cg_embed em = {.rows = 4, .n = 8, .cols = 8, .vocab = 8, .table = "wt", .ids = "ids", .out = "h", .fault_site = 1};
    d->embed(w, &em);
    d->fault_check(w, 0);
    cg_embed em2 = {.rows = 4, .n = 4, .cols = 8, .vocab = 8, .first_row = "ctx->coord[1] * 4", .table = "wt", .ids = "ids",
                    .out = "h", .fault_site = 2};
    d->embed(w, &em2);
    cg_embed eg = {.rows = 4, .n = 8, .cols = 8, .vocab = 8, .ids = "ids", .dy = "h", .out = "wt",
                   .scratch = "(ctx->scratch + 1024)"};
    d->embed_grad(w, &eg);
    cg_embed eg2 = {.rows = 4, .n = 4, .cols = 8, .vocab = 8, .first_row = "ctx->coord[1] * 4", .ids = "ids", .dy = "h",
                    .out = "wt", .scratch = "(ctx->scratch + 1024)"};
    d->embed_grad(w, &eg2);

    cg_xent xe = {.rows = 4, .classes = 8, .mean_rows = 8, .logits = "h", .targets = "targets", .stats = "stats", .out = "stats",
                  .fault_site = 3, .where = "smoke.dm:12", .all_classes = 8, .scratch = "(ctx->scratch + 2048)", .comm_size = 1};
    d->xent_stats(w, &xe);
    cg_xent xs = xe;
    xs.comm = "ctx->comm[1]", xs.coord = "ctx->coord[1]", xs.comm_size = 2, xs.all_classes = 16, xs.fault_site = 4;
    xs.logits_name = "logits \"quoted\"";
    xs.where = "dir\\smoke.dm:12";
    d->xent_stats(w, &xs);
    cg_xent xl = xe;
    xl.out = "loss";
    d->cross_entropy(w, &xl);
    cg_xent xg = xe;
    xg.out = "g", xg.dloss = "1.0f";
    d->cross_entropy_grad(w, &xg);
    xg.dloss = "loss", xg.dloss_is_buffer = 1;
    d->cross_entropy_grad(w, &xg);
    cg_xent xgs = xs;
    xgs.comm = NULL, xgs.out = "g", xgs.dloss = "0.5f";
    d->cross_entropy_grad(w, &xgs);
    xgs.dloss = "loss", xgs.dloss_is_buffer = 1;
    d->cross_entropy_grad(w, &xgs);

    d->comm_callee(callee, sizeof callee, "allreduce_sum");
    cg_line(w, "if (%sctx->comm[0], grad, 64, \"allreduce of the gradients\") != DMRT_OK) return device_failed(ctx);", callee);
    d->comm_callee(callee, sizeof callee, "allgather");
    cg_line(w, "if (%sctx->comm[0], grad, g, 16, \"allgather\") != DMRT_OK) return device_failed(ctx);", callee);

    cg_update us = {.opt = &sgd, .count = "64", .param = "m", .grad = "grad", .state0 = "v", .updates = "ctx->step"};
    d->sgd(w, &us);
    cg_update us0 = {.opt = &sgd, .count = "64", .param = "m", .grad = "grad", .updates = "ctx->step"};
    d->sgd(w, &us0);
    cg_update ua = {.opt = &adamw, .count = "64", .param = "x", .grad = "grad", .state0 = "m", .state1 = "v", .updates = "ctx->step"};
    d->adamw(w, &ua);
    /* gradient clipping's norm and scaling */
    cg_line(w, "double sum_squares = 0.0;");
    d->sum_squares(w, "grad", "64", "sum_squares");
    d->scale(w, "grad", "64", "(float)(1.0 / (1.0 + sum_squares))");
    d->fault_check(w, 1);
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* The emulation's text of the host functions: `name<<<blocks, threads, 0, stream>>>(args);`
 * becomes `EMU_LAUNCH(blocks, threads, name(args));`. */
static void emulated(FILE *f, const char *text) {
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char buf[8192];
        snprintf(buf, sizeof buf, "%.*s", (int)len, line);
        char *open = strstr(buf, "<<<"), *close = open ? strstr(open, ">>>(") : NULL;
        if (open && close) {
            char *name = open;
            while (name > buf && name[-1] != ' ') name--;
            long long blocks;
            int threads;
            if (sscanf(open, "<<<%lld, %d,", &blocks, &threads) != 2) {
                fprintf(stderr, "cannot read the launch: %s\n", buf);
                exit(1);
            }
            char *args = close + 3; /* "(...);" */
            fprintf(f, "%.*sEMU_LAUNCH(%lld, %d, %.*s%.*s);\n", (int)(name - buf), buf, blocks, threads, (int)(open - name), name,
                    (int)(strlen(args) - 1), args);
        } else {
            fprintf(f, "%s\n", buf);
        }
        line += len + (nl ? 1 : 0);
    }
}

static const char emu_prelude[] =
    "/* smoke_emu.cpp: written by cuda_dialect_smoke; see there. */\n"
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "#include <stdio.h>\n"
    "#include <stdlib.h>\n"
    "#include <string.h>\n"
    "\n"
    "#include \"dmrt.h\"\n"
    "\n"
    "#define __global__\n"
    "typedef void *cudaStream_t;\n"
    "typedef struct dmrt_gpu dmrt_gpu;\n"
    "struct emu_dim3 { unsigned x, y, z; };\n"
    "static emu_dim3 blockIdx, threadIdx, blockDim, gridDim;\n"
    "static int emu_tiny;      /* launch 2 blocks of 3 threads where many were asked */\n"
    "static long long emu_launches;\n"
    "#define EMU_LAUNCH(blocks, threads, call) do { \\\n"
    "    int tiny_ = emu_tiny && (threads) > 1; \\\n"
    "    gridDim.x = tiny_ ? 2u : (unsigned)(blocks); blockDim.x = tiny_ ? 3u : (unsigned)(threads); \\\n"
    "    emu_launches++; \\\n"
    "    for (unsigned b_ = 0; b_ < gridDim.x; b_++) \\\n"
    "        for (unsigned t_ = 0; t_ < blockDim.x; t_++) { blockIdx.x = b_; threadIdx.x = t_; call; } \\\n"
    "} while (0)\n"
    "static inline void *dmrt_gpu_stream(const dmrt_gpu *g) { (void)g; return NULL; }\n"
    "static int dmrt_gpu_check_launch(dmrt_gpu *g, const char *what, const char *file, int line) {\n"
    "    (void)g, (void)what, (void)file, (void)line; return DMRT_OK; }\n"
    "static int dmrt_gpu_zero(dmrt_gpu *g, void *p, size_t bytes) { (void)g; memset(p, 0, bytes); return DMRT_OK; }\n"
    "static float emu_partials[1 << 20];\n"
    "static float *dmrt_gpu_sum_partials(const dmrt_gpu *g) { (void)g; return emu_partials; }\n"
    "typedef struct struct_ctx { dmrt_gpu *gpu; dmrt_fault fault; char error[512]; int64_t step; double lr; float *scratch; } struct_ctx;\n"
    "static int device_failed(struct_ctx *ctx) { (void)ctx; return DMRT_ERR_DEVICE; }\n"
    "\n";

static void emu_main(FILE *f) {
    int split_cases = 0;
    fprintf(f, "static uint32_t emu_rng = 12345u;\n");
    fprintf(f, "static float emu_float(void) { emu_rng = emu_rng * 1664525u + 1013904223u; return (float)(emu_rng >> 8) / 8388608.0f * 4.0f - 2.0f; }\n");
    fprintf(f, "static void fill(float *p, int64_t n) { for (int64_t i = 0; i < n; i++) p[i] = emu_float(); }\n");
    fprintf(f, "static void fill_i32(int32_t *p, int64_t n) { for (int64_t i = 0; i < n; i++) p[i] = (int32_t)(emu_float() * 1000.0f); }\n\n");
    fprintf(f, "int main(void) {\n");
    fprintf(f, "    int failed = 0;\n");
    fprintf(f, "    static float scratch_ref[1 << 16], scratch_emu[1 << 16];\n");
    fprintf(f, "    struct_ctx ctx_ref, ctx_emu;\n");
    fprintf(f, "    memset(&ctx_ref, 0, sizeof ctx_ref), memset(&ctx_emu, 0, sizeof ctx_emu);\n");
    fprintf(f, "    ctx_ref.scratch = scratch_ref, ctx_emu.scratch = scratch_emu;\n");
    for (int n = 0; n < n_cases; n++) {
        const nest_case *c = &cases[n];
        const cg_loop_nest *k = &c->k;
        const char *t = c->i32 ? "int32_t" : "float";
        int64_t out_elems = k->out_elems > 0 ? k->out_elems : 1;
        if (c->out_in_scratch && 16 + out_elems > (1 << 16)) continue;
        fprintf(f, "    for (int tiny = 0; tiny < 2; tiny++) { /* %d: %s */\n", n, c->what);
        for (int i = 0; i < k->n_in; i++) {
            if (k->constant[i]) continue;
            int64_t e = operand_elems(k, i);
            if (e < 1) e = 1;
            fprintf(f, "        %s *in_%s = (%s *)malloc(%lld * sizeof(%s));\n", t, k->var[i], t, (long long)e, t);
            fprintf(f, "        fill%s(in_%s, %lld);\n", c->i32 ? "_i32" : "", k->var[i], (long long)e);
        }
        fprintf(f, "        %s *out_ref = (%s *)malloc(%lld * sizeof(%s)), *out_emu = (%s *)malloc(%lld * sizeof(%s));\n", t, t,
                (long long)out_elems, t, t, (long long)out_elems, t);
        fprintf(f, "        fill%s(out_ref, %lld);\n", c->i32 ? "_i32" : "", (long long)out_elems);
        fprintf(f, "        memcpy(out_emu, out_ref, %lld * sizeof(%s));\n", (long long)out_elems, t);
        if (c->out_in_scratch) {
            fprintf(f, "        memcpy(scratch_ref + 16, out_ref, %lld * sizeof(float));\n", (long long)out_elems);
            fprintf(f, "        memcpy(scratch_emu + 16, out_ref, %lld * sizeof(float));\n", (long long)out_elems);
        }
        if (c->cast) {
            fprintf(f, "        uint16_t *cast_ref = (uint16_t *)calloc(%lld, 2), *cast_emu = (uint16_t *)calloc(%lld, 2);\n",
                    (long long)out_elems, (long long)out_elems);
        }
        if (c->also)
            fprintf(f, "        float *also_ref = (float *)calloc(%lld, 4), *also_emu = (float *)calloc(%lld, 4);\n",
                    (long long)out_elems, (long long)out_elems);
        fprintf(f, "        emu_tiny = tiny;\n");
        for (int r = 0; r < 2; r++) {
            fprintf(f, "        %s_%d(&ctx_%s", r ? "nest" : "ref", n, r ? "emu" : "ref");
            if (!c->out_in_scratch) fprintf(f, ", out_%s", r ? "emu" : "ref");
            for (int i = 0; i < k->n_in; i++)
                if (!k->constant[i]) fprintf(f, ", in_%s", k->var[i]);
            if (c->also) fprintf(f, ", also_%s", r ? "emu" : "ref");
            if (c->cast) fprintf(f, ", cast_%s", r ? "emu" : "ref");
            fprintf(f, ");\n");
        }
        if (c->out_in_scratch) {
            fprintf(f, "        memcpy(out_ref, scratch_ref + 16, %lld * sizeof(float));\n", (long long)out_elems);
            fprintf(f, "        memcpy(out_emu, scratch_emu + 16, %lld * sizeof(float));\n", (long long)out_elems);
        }
        if (cg_cuda_sum_is_split(k)) {
            /* summed in chunks: within the rounding of summed_total terms of at most 2 */
            int64_t summed = 1;
            for (int d = 0; d < k->rank; d++)
                if (k->out_stride[d] == 0) summed *= k->size[d];
            fprintf(f, "        int off = 0;\n");
            fprintf(f, "        for (int64_t i = 0; i < %lld; i++) off |= fabsf(out_ref[i] - out_emu[i]) > %.9gf;\n",
                    (long long)out_elems, 2e-5 * (double)summed);
            fprintf(f, "        if (off) {\n");
            split_cases++;
        } else {
            fprintf(f, "        if (memcmp(out_ref, out_emu, %lld * sizeof(%s)) != 0) {\n", (long long)out_elems, t);
        }
        fprintf(f, "            printf(\"FAIL %d %s (tiny grid %%d)\\n\", tiny);\n", n, c->what);
        fprintf(f, "            failed++;\n");
        fprintf(f, "        }\n");
        if (c->cast) {
            /* the copy is out rounded, on both sides: compared with each other and with out */
            fprintf(f, "        int cast_bad = memcmp(cast_ref, cast_emu, %lld * 2) != 0;\n", (long long)out_elems);
            fprintf(f, "        for (int64_t i = 0; i < %lld; i++) cast_bad |= cast_ref[i] != dmrt_bf16_round(out_ref[i]);\n",
                    (long long)out_elems);
            fprintf(f, "        if (cast_bad) {\n");
            fprintf(f, "            printf(\"FAIL %d %s: the bf16 copy (tiny grid %%d)\\n\", tiny);\n", n, c->what);
            fprintf(f, "            failed++;\n");
            fprintf(f, "        }\n");
            fprintf(f, "        free(cast_ref), free(cast_emu);\n");
        }
        if (c->also) {
            /* the stored sum, on both sides: compared with each other and with product +
             * bias (the case's operands: product dense, bias along the last dim) */
            int64_t cols = k->size[k->rank - 1];
            fprintf(f, "        int also_bad = memcmp(also_ref, also_emu, %lld * 4) != 0;\n", (long long)out_elems);
            fprintf(f, "        for (int64_t i = 0; i < %lld; i++) also_bad |= also_ref[i] != in_product[i] + in_bias[i %% %lld];\n",
                    (long long)out_elems, (long long)cols);
            fprintf(f, "        if (also_bad) {\n");
            fprintf(f, "            printf(\"FAIL %d %s: the stored sum (tiny grid %%d)\\n\", tiny);\n", n, c->what);
            fprintf(f, "            failed++;\n");
            fprintf(f, "        }\n");
            fprintf(f, "        free(also_ref), free(also_emu);\n");
        }
        for (int i = 0; i < k->n_in; i++)
            if (!k->constant[i]) fprintf(f, "        free(in_%s);\n", k->var[i]);
        fprintf(f, "        free(out_ref), free(out_emu);\n");
        fprintf(f, "    }\n");
    }
    fprintf(f, "    printf(\"%%d cases (%%d sums split in chunks), %%lld launches, %%d failed\\n\", %d, %d, emu_launches, failed);\n",
            n_cases, split_cases);
    fprintf(f, "    return failed != 0;\n");
    fprintf(f, "}\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: cuda_dialect_smoke OUTDIR [NESTS]\n");
        return 2;
    }
    cases = calloc(MAX_CASES, sizeof *cases);
    if (!cases) die("calloc");
    add_builtin_cases();
    if (argc == 3) read_nests(argv[2]);
    const cg_dialect *d = &cg_dialect_cuda;

    /* the CUDA file */
    mem_writer pre, kern, host, ref;
    mem_open(&pre), mem_open(&kern), mem_open(&host), mem_open(&ref);
    host.w.kernels = &kern.w;
    pre.w.kernels = &kern.w;
    cg_line(&pre.w, "/* smoke.cu: written by cuda_dialect_smoke (tests/tools/cuda_dialect_smoke.c) */");
    d->preamble(&pre.w);
    cg_blank(&pre.w);
    cg_line(&pre.w, "typedef struct struct_ctx {");
    pre.w.indent++;
    d->ctx_fields(&pre.w);
    cg_line(&pre.w, "dmrt_fault fault;");
    cg_line(&pre.w, "char error[512];");
    cg_line(&pre.w, "int64_t step;");
    cg_line(&pre.w, "double lr; /* the update's learning rate (emit_schedule.c) */");
    cg_line(&pre.w, "dmrt_rank *rank;");
    cg_line(&pre.w, "dmrt_comm *comm[2];");
    cg_line(&pre.w, "int coord[2];");
    cg_line(&pre.w, "float *params;");
    cg_line(&pre.w, "float *scratch;");
    pre.w.indent--;
    cg_line(&pre.w, "} struct_ctx;");
    cg_blank(&pre.w);
    d->ctx_helpers(&pre.w);
    cg_blank(&pre.w);
    cg_line(&pre.w, "static int data_fault(struct_ctx *ctx) {");
    cg_line(&pre.w, "    snprintf(ctx->error, sizeof ctx->error, \"fault at site %%d\", (int)ctx->fault.site);");
    cg_line(&pre.w, "    return DMRT_ERR_DATA;");
    cg_line(&pre.w, "}");
    cg_blank(&pre.w);
    host_nests(d, &host.w, 0);
    host_others(d, &host.w);
    d->finish(&host.w);
    host_nests(&cg_dialect_c, &ref.w, 1);
    mem_close(&pre), mem_close(&kern), mem_close(&host), mem_close(&ref);

    char path[4096];
    snprintf(path, sizeof path, "%s/smoke.cu", argv[1]);
    FILE *f = fopen(path, "w");
    if (!f) die(path);
    fprintf(f, "%s%s%s", pre.text, kern.text, host.text);
    fclose(f);

    snprintf(path, sizeof path, "%s/smoke_emu.cpp", argv[1]);
    f = fopen(path, "w");
    if (!f) die(path);
    fputs(emu_prelude, f);
    fputs(kern.text, f);
    /* the loop-nest functions only: the rest calls the real runtime */
    char *others = strstr(host.text, "struct_ctx *smoke_create(");
    if (others) *others = 0;
    emulated(f, host.text);
    fputs(ref.text, f);
    emu_main(f);
    fclose(f);

    int kernels = 0;
    for (const char *p = kern.text; (p = strstr(p, "__global__")); p++) kernels++;
    printf("cuda_dialect_smoke: %d loop nests, %d kernels; wrote %s/smoke.cu and %s/smoke_emu.cpp\n", n_cases, kernels, argv[1],
           argv[1]);
    free(pre.text), free(kern.text), free(host.text), free(ref.text);
    free(cases);
    return 0;
}
