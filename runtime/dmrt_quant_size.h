/* dmrt_quant_size.h: the sizes of a narrow weight (dmc --quantize int8-weights,
 * int4-weights[:G]), header only so that the runtime allocates by it (gemm_quant.c) and
 * dmc --explain predicts by it (passes/explain_quant.c, which links no runtime). */
#ifndef DMRT_QUANT_SIZE_H
#define DMRT_QUANT_SIZE_H

#include <stdint.h>

/* rows per scale: a whole column for int8, group (--quantize-group) rows for int4 */
static inline int64_t dmrt_qweight_group_of(int bits, int64_t rows, int64_t group) { return bits == 8 ? rows : group; }

/* the integers of a [rows, cols] weight: a byte each for int8; int4 two to a byte along a
 * row, an odd row's last byte half used */
static inline int64_t dmrt_qweight_data_bytes(int bits, int64_t rows, int64_t cols) {
    return bits == 8 ? rows * cols : rows * ((cols + 1) / 2);
}

/* its f32 scales: one per column and per group of rows (the last group may be short) */
static inline int64_t dmrt_qweight_scale_count(int64_t rows, int64_t cols, int64_t group) {
    return (rows + group - 1) / group * cols;
}

/* The columns of a weight's [rows, cols] (or of a window of them) that a weight-only
 * product on the C target widens to f32 at once, into its thread's buffer, and multiplies
 * (runtime/gemm_quant.c): every column up to DMRT_WIDEN_FLOATS floats (16 MiB), else
 * blocks of a multiple of 64 columns that fit in it (GPT-2's head read narrow, [768,
 * 50304]: 5440 at a time, 16 MiB rather than 147). The buffer holds rows x that. */
#define DMRT_WIDEN_FLOATS ((int64_t)1 << 22)
static inline int64_t dmrt_qweight_widen_cols(int64_t rows, int64_t cols) {
    if (rows * cols <= DMRT_WIDEN_FLOATS) return cols;
    int64_t block = DMRT_WIDEN_FLOATS / (rows > 0 ? rows : 1) / 64 * 64;
    return block < 64 ? 64 : block;
}

#endif
