/* block.c: copies between a tensor and one rank's block of it (dmrt.h). */
#include "dmrt.h"

#include <string.h>

/* Walks the block row by row (its last dim is contiguous in both layouts). */
static void block_copy(float *whole_data, float *block_data, int rank, const int64_t *whole,
                       const int64_t *block, const int64_t *start, int to_whole) {
    if (rank == 0) {
        if (to_whole) whole_data[0] = block_data[0];
        else block_data[0] = whole_data[0];
        return;
    }
    int64_t rows = 1, row_len = block[rank - 1];
    for (int d = 0; d + 1 < rank; d++) rows *= block[d];
    for (int64_t r = 0; r < rows; r++) {
        /* the whole tensor's offset of block row r */
        int64_t rest = r, offset = start[rank - 1], stride = whole[rank - 1];
        for (int d = rank - 2; d >= 0; d--) {
            int64_t i = rest % block[d];
            rest /= block[d];
            offset += (start[d] + i) * stride;
            stride *= whole[d];
        }
        float *w = whole_data + offset, *b = block_data + r * row_len;
        if (to_whole) memcpy(w, b, (size_t)row_len * sizeof(float));
        else memcpy(b, w, (size_t)row_len * sizeof(float));
    }
}

void dmrt_block_read(const float *whole_data, int rank, const int64_t *whole,
                     const int64_t *block, const int64_t *start, float *block_data) {
    block_copy((float *)whole_data, block_data, rank, whole, block, start, 0);
}

void dmrt_block_write(const float *block_data, int rank, const int64_t *whole,
                      const int64_t *block, const int64_t *start, float *whole_data) {
    block_copy(whole_data, (float *)block_data, rank, whole, block, start, 1);
}
