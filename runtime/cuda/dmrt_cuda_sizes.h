/* dmrt_cuda_sizes.h: the scratch sizes of libdmrt_cuda's kernels, as formulas that both
 * sides use: the compiler (codegen/dialect_cuda.c) sizes the context's storage with them
 * at compile time, where it cannot call the CUDA runtime, and the runtime
 * (dmrt_gpu_xent_scratch, dmrt_gpu_embed_grad_scratch) returns them, and checks at run
 * time that what it actually lays out fits (failing with a message otherwise, never
 * overrunning). Plain C, no CUDA types: included by C11 and by CUDA C++. The bounds are
 * generous on purpose; each term says what it holds. */
#ifndef DMRT_CUDA_SIZES_H
#define DMRT_CUDA_SIZES_H

#include <stdint.h>

#include "../dmrt_quant_size.h"

/* Room for aligning sub-buffers (each to 256 bytes) and for the partials of a final
 * fixed-order sum: 4096 floats (16 KiB). */
#define DMRT_CUDA_SCRATCH_SLACK_FLOATS 4096

/* Floats of the device buffer generated reduction kernels keep their chunk sums in
 * (dmrt_gpu_sum_partials): 4 MiB. The compiler splits a sum into at most this many
 * (output, chunk) partials. */
#define DMRT_CUDA_SUM_PARTIALS_FLOATS ((int64_t)1 << 20)

/* Floats of device scratch cross-entropy's statistics of `rows` rows need, their classes
 * split over comm_size ranks (1: whole; the loss and the gradient need none). A bound,
 * not a layout; what the runtime lays out today:
 *   split  (comm_size + 2) * rows: every rank's row maxima (the all-gather), then the
 *          sums of exp(logit - max) and the target's logits (allreduced at once)
 *   whole  nothing: each row's statistics stay in its block
 * The bound gives (comm_size + 4) * rows + slack, room for 2 more floats a row. */
static inline int64_t dmrt_cuda_xent_scratch_floats(int64_t rows, int64_t comm_size) {
    if (rows < 0) rows = 0;
    if (comm_size <= 1) return 0;
    return rows * (comm_size + 4) + DMRT_CUDA_SCRATCH_SLACK_FLOATS;
}

/* Bytes of device scratch an embedding gradient of `rows` positions needs. The runtime
 * sorts (id, position) int32 pairs by id with a CUB radix sort, so that each table row
 * sums its positions in position order (deterministic, the C target's order):
 *   16 * rows + 1.3 KiB  keys and positions, each double-buffered: 4 arrays of rows int32,
 *                        each rounded up to 256 bytes, plus 256 bytes to align the start
 *   the rest             CUB's temporary storage and any per-run arrays: 48 * rows + 1 MiB
 *                        less the 1.3 KiB above. CUB's size can only be asked at run time
 *                        (it needs the device); for a sort of int32 pairs it is histograms
 *                        and per-tile digit counts, about 1 byte per item plus a fixed part
 *                        of a few KiB, so the bound holds with a wide margin. The runtime
 *                        asks CUB and fails with a message (never overruns) if it ever
 *                        does not fit. */
static inline int64_t dmrt_cuda_embed_grad_scratch_bytes(int64_t rows) {
    if (rows < 0) rows = 0;
    return 64 * rows + ((int64_t)1 << 20);
}

/* Chunks of rows a layernorm weight gradient of `rows` rows sums separately (each
 * column of a chunk in row order, then the chunks in order: deterministic). */
static inline int64_t dmrt_cuda_wgrad_chunks(int64_t rows) {
    int64_t per_chunk = 256, chunks = (rows + per_chunk - 1) / per_chunk;
    if (chunks > 4096) {
        per_chunk = (rows + 4095) / 4096;
        chunks = (rows + per_chunk - 1) / per_chunk;
    }
    return chunks;
}

/* Floats of device scratch a layernorm weight gradient of (rows, n) needs: each row's
 * mean and rstd (2 * rows), and each chunk's column sums when there is more than one
 * chunk (chunks * n), twice: the weight's and the bias's, which it may sum too. */
static inline int64_t dmrt_cuda_layernorm_wgrad_scratch_floats(int64_t rows, int64_t n) {
    if (rows < 0) rows = 0;
    if (n < 0) n = 0;
    int64_t chunks = dmrt_cuda_wgrad_chunks(rows);
    return 2 * rows + (chunks > 1 ? 2 * chunks * n : 0);
}

/* Bytes of device work a quantized product (--quantize, dmrt_gpu_gemm_wq/_i8) of m rows by
 * a [rows, cols] weight (or window of one) needs: the weight-only modes widen the columns
 * to f32, a block of dmrt_qweight_widen_cols at a time (the C target's blocks,
 * dmrt_quant_size.h: every column but for a weight over 16 MiB in f32); int8 quantizes the
 * left operand (m x rows int8, the sums' start rounded up to 256 bytes) and keeps the
 * int32 sums (m x cols). */
static inline int64_t dmrt_cuda_quant_work_bytes(int activations, int64_t m, int64_t rows, int64_t cols) {
    if (!activations) return rows * dmrt_qweight_widen_cols(rows, cols) * (int64_t)sizeof(float);
    return (m * rows + 255) / 256 * 256 + m * cols * 4;
}

/* Bytes of device scratch the 16-bit fused attention (attention16.cu, through cuDNN) of
 * `heads` heads of (positions, width) needs, the forward or the backward:
 *   the 16-bit copies  forward q, k, v and out; backward q, k, v, out, dout, dq, dk and dv:
 *                      2 bytes an element each, each rounded up to 256 bytes
 *   the statistics     cuDNN's lse with the heads one after the other, 4 bytes a row
 *                      rounded up alike: relaid from or into the op's lse where the
 *                      heads lie side by side (the _inner calls)
 *   the graph's own    backward: rowsum(dout * out), 4 bytes a row, and dq accumulated
 *                      in f32, 4 bytes an element (cudnn_sdpa.h), each rounded up alike
 *   cuDNN's engine     its workspace, which only cuDNN on a device can say: allowed
 *                      4 bytes an element plus 1 MiB. A guess, not measured on a GPU: the
 *                      runtime checks cuDNN's figure when it makes the plan and fails with
 *                      a message naming the attention (never overruns) if it does not fit.
 * No term is positions x positions: no scores are held. */
static inline int64_t dmrt_cuda_attention16_scratch_bytes(int64_t heads, int64_t positions, int64_t width,
                                                          int backward) {
    int64_t n = heads * positions * width, rows = heads * positions, part = (2 * n + 255) / 256 * 256;
    int64_t stats = (4 * rows + 255) / 256 * 256;
    int64_t own = backward ? stats + (4 * n + 255) / 256 * 256 : 0;
    return (backward ? 8 : 4) * part + stats + own + 4 * n + ((int64_t)1 << 20);
}

#endif
