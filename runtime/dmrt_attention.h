/* dmrt_attention.h: fused attention, the kernels of dmc's attention op for the C target
 * (passes/fuse_attention.c): out = softmax(q @ kT * scale) @ v per head, keys after the
 * query hidden when causal, without ever holding a head's T x T scores.
 *
 * The kernels are compiled into libdmrt (runtime/attention.c, from attention_kernels.h)
 * once for each of four instruction sets: base x86-64 (or the host's own, off x86),
 * AVX2 + FMA + F16C, AVX-512 (F, BW, DQ, VL) and AVX-512 with AVX512-BF16, whose bf16 tile
 * products use vdpbf16ps (dmrt_attention_tiles.h). The functions below call the widest of
 * them that the code including this header is compiled for: generated code built with
 * `-march=native` gets the machine's own, one built with `--march x86-64` the base one,
 * and neither ever runs an instruction its build did not allow. Compiling the kernels
 * here instead of in every generated file took 35% of a small GPT's compile time at -O2
 * and 55% at -O3 (docs/compiler.md, "Fused attention"). The compiler (codegen/dialect_c.c)
 * includes this header for the sizes.
 *
 * Layout: a head is a (positions, width) matrix. q, k, v, out, dout, dq, dk, dv are
 * (heads / inner, positions, inner, width) and lse (heads / inner, positions, inner): with
 * inner 1, heads one after the other; with inner H, the rows of H heads side by side, as
 * [B, T, H * D] reshaped to [B, T, H, D] has them, so that no transpose is needed around
 * the attention (head h's rows are then H * width floats apart).
 *
 * Grouped-query attention (the _grouped kernels, inner 1): k, v, dk and dv have heads /
 * group heads, query head h reading their head h / group, as Hugging Face's repeat_kv
 * would have copied it; the backward sums a kv head's gradients over its group's query
 * heads, one after the other, and the threads take whole groups (the same bits for any
 * thread count). group 1 is plain multi-head attention, the same arithmetic.
 *
 * Heads are independent: `threads` threads take blocks of them, each block computed as one
 * thread computes it (the same bits for any count). `work` holds
 * dmrt_attention_work_floats_of(operands, positions, width) floats, the first block's;
 * the other threads' work lies on their stacks. */
#ifndef DMRT_ATTENTION_H
#define DMRT_ATTENTION_H

#include <stdint.h>

/* The attention's operand types (the kernels' `operands`): f32, or each tile product's
 * operands rounded to bf16 first (--precision bf16). */
enum { DMRT_ATTENTION_F32 = 0, DMRT_ATTENTION_BF16 = 1 };

/* Queries and keys per block: a block's scores are 16 KiB, the tile products a size BLAS
 * runs well on one core. Shorter sequences take one block. */
#define DMRT_ATTENTION_TILE 64

static inline int64_t dmrt_attention_tile(int64_t positions) {
    return positions < DMRT_ATTENTION_TILE ? (positions > 0 ? positions : 1) : DMRT_ATTENTION_TILE;
}

/* Floats of work either kernel needs (the context's scratch) with f32 operands: two blocks
 * of scores, two values per query of a block, one per position of a head. */
static inline int64_t dmrt_attention_work_floats(int64_t positions) {
    int64_t tile = dmrt_attention_tile(positions);
    return 2 * tile * tile + 2 * tile + positions;
}

/* Columns of a packed right operand of the bf16 tile products, padded so that the kernel's
 * 32-column blocks read zeros past n. */
static inline int64_t dmrt_attention_packed_cols_(int64_t n) { return (n + 31) / 32 * 32; }

/* bf16 values of room for one packed operand of tiles `tile` rows and heads `width` wide:
 * at most max(tile, width) + 1 rows (pairs of rows) by that rounded up to 32. */
static inline int64_t dmrt_attention_pack_room_(int64_t tile, int64_t width) {
    int64_t side = (tile > width ? tile : width) + 1;
    return side * dmrt_attention_packed_cols_(side);
}

/* Floats of work the bf16 tile products need beside the kernel's own: two operands' rounded
 * f32 copies, or five packed as bf16 (a product's two, and the backward's three of a block
 * of keys, kept for its blocks of queries). */
static inline int64_t dmrt_attention_pack_floats_(int64_t tile, int64_t width) {
    return 5 * dmrt_attention_pack_room_(tile, width) / 2 + 8;
}

/* The same as dmrt_attention_work_floats with `operands` (DMRT_ATTENTION_F32 or _BF16) and
 * heads `width` wide: the bf16 kernels pack their tile products' rounded operands after
 * the rest. */
static inline int64_t dmrt_attention_work_floats_of(int operands, int64_t positions, int64_t width) {
    int64_t f32 = dmrt_attention_work_floats(positions);
    if (operands == DMRT_ATTENTION_F32) return f32;
    return f32 + dmrt_attention_pack_floats_(dmrt_attention_tile(positions), width);
}

/* ---- the kernels, one set per instruction set ------------------------------------------- */

#define DMRT_ATTENTION_PASTE_(name, isa) name##_##isa
/* name_isa, with isa expanded first */
#define DMRT_ATTENTION_NAME_(name, isa) DMRT_ATTENTION_PASTE_(name, isa)

/* The four kernels of one instruction set: the forward writes out and lse; the backward
 * writes dq, dk and dv. The _grouped forms take group (k and v have heads / group heads,
 * heads one after the other) where the others take inner. */
#define DMRT_ATTENTION_DECLARE_(isa)                                                                              \
    void DMRT_ATTENTION_NAME_(dmrt_attention_forward, isa)(                                                       \
        const float *q, const float *k, const float *v, float *out, float *lse, int64_t heads, int64_t inner,    \
        int64_t positions, int64_t width, float scale, int causal, int operands, int threads, float *work);      \
    void DMRT_ATTENTION_NAME_(dmrt_attention_forward_grouped, isa)(                                               \
        const float *q, const float *k, const float *v, float *out, float *lse, int64_t heads, int64_t group,    \
        int64_t positions, int64_t width, float scale, int causal, int operands, int threads, float *work);      \
    void DMRT_ATTENTION_NAME_(dmrt_attention_backward, isa)(                                                      \
        const float *q, const float *k, const float *v, const float *out, const float *lse, const float *dout,   \
        float *dq, float *dk, float *dv, int64_t heads, int64_t inner, int64_t positions, int64_t width,         \
        float scale, int causal, int operands, int threads, float *work);                                        \
    void DMRT_ATTENTION_NAME_(dmrt_attention_backward_grouped, isa)(                                              \
        const float *q, const float *k, const float *v, const float *out, const float *lse, const float *dout,   \
        float *dq, float *dk, float *dv, int64_t heads, int64_t group, int64_t positions, int64_t width,         \
        float scale, int causal, int operands, int threads, float *work);

DMRT_ATTENTION_DECLARE_(base)
DMRT_ATTENTION_DECLARE_(avx2)
DMRT_ATTENTION_DECLARE_(avx512)
DMRT_ATTENTION_DECLARE_(avx512bf16)

/* The widest set this compilation may run (each asks for every flag its build used). */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
#define DMRT_ATTENTION_ISA avx512bf16
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512DQ__) && defined(__AVX512VL__)
#define DMRT_ATTENTION_ISA avx512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DMRT_ATTENTION_ISA avx2
#else
#define DMRT_ATTENTION_ISA base
#endif
#define DMRT_ATTENTION_QUOTE_(x) #x
#define DMRT_ATTENTION_STRING_(x) DMRT_ATTENTION_QUOTE_(x)
/* "avx512bf16", "avx512", "avx2" or "base": the set of kernels this compilation calls */
#define DMRT_ATTENTION_ISA_NAME DMRT_ATTENTION_STRING_(DMRT_ATTENTION_ISA)

static inline void dmrt_attention_forward(const float *q, const float *k, const float *v, float *out, float *lse,
                                          int64_t heads, int64_t inner, int64_t positions, int64_t width, float scale,
                                          int causal, int operands, int threads, float *work) {
    DMRT_ATTENTION_NAME_(dmrt_attention_forward, DMRT_ATTENTION_ISA)
    (q, k, v, out, lse, heads, inner, positions, width, scale, causal, operands, threads, work);
}

static inline void dmrt_attention_forward_grouped(const float *q, const float *k, const float *v, float *out,
                                                  float *lse, int64_t heads, int64_t group, int64_t positions,
                                                  int64_t width, float scale, int causal, int operands, int threads,
                                                  float *work) {
    DMRT_ATTENTION_NAME_(dmrt_attention_forward_grouped, DMRT_ATTENTION_ISA)
    (q, k, v, out, lse, heads, group, positions, width, scale, causal, operands, threads, work);
}

static inline void dmrt_attention_backward(const float *q, const float *k, const float *v, const float *out,
                                           const float *lse, const float *dout, float *dq, float *dk, float *dv,
                                           int64_t heads, int64_t inner, int64_t positions, int64_t width,
                                           float scale, int causal, int operands, int threads, float *work) {
    DMRT_ATTENTION_NAME_(dmrt_attention_backward, DMRT_ATTENTION_ISA)
    (q, k, v, out, lse, dout, dq, dk, dv, heads, inner, positions, width, scale, causal, operands, threads, work);
}

static inline void dmrt_attention_backward_grouped(const float *q, const float *k, const float *v, const float *out,
                                                   const float *lse, const float *dout, float *dq, float *dk,
                                                   float *dv, int64_t heads, int64_t group, int64_t positions,
                                                   int64_t width, float scale, int causal, int operands, int threads,
                                                   float *work) {
    DMRT_ATTENTION_NAME_(dmrt_attention_backward_grouped, DMRT_ATTENTION_ISA)
    (q, k, v, out, lse, dout, dq, dk, dv, heads, group, positions, width, scale, causal, operands, threads, work);
}

#endif
