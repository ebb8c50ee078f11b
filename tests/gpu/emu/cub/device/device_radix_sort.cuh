/* cub/device/device_radix_sort.cuh for the CPU emulation (cuda_emu.h): the part of CUB's
 * radix sort embed.cu uses, on host memory. SortPairs is CUB's: stable, on the key bits
 * [begin_bit, end_bit), the result in the buffers' other halves (the selector flips), and a
 * sizing call (temp NULL) that only says how much storage it wants. */
#ifndef DM_CUDA_EMU_CUB_RADIX_SORT
#define DM_CUDA_EMU_CUB_RADIX_SORT

#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace cub {

template <typename T>
struct DoubleBuffer {
    T *d_buffers[2];
    int selector;
    DoubleBuffer(T *current, T *alternate) : d_buffers{current, alternate}, selector(0) {}
    T *Current() { return d_buffers[selector]; }
    T *Alternate() { return d_buffers[selector ^ 1]; }
};

struct DeviceRadixSort {
    template <typename K, typename V>
    static cudaError_t SortPairs(void *temp, size_t &temp_bytes, DoubleBuffer<K> &keys, DoubleBuffer<V> &values,
                                 int items, int begin_bit = 0, int end_bit = (int)(sizeof(K) * 8),
                                 cudaStream_t stream = 0) {
        (void)stream;
        if (!temp) {
            temp_bytes = 256;
            return cudaSuccess;
        }
        const K mask = end_bit - begin_bit >= (int)(sizeof(K) * 8) ? (K)~(K)0 : (K)(((K)1 << (end_bit - begin_bit)) - 1);
        std::vector<int> order((size_t)items);
        std::iota(order.begin(), order.end(), 0);
        const K *k = keys.Current();
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return ((k[a] >> begin_bit) & mask) < ((k[b] >> begin_bit) & mask); });
        for (int i = 0; i < items; i++) {
            keys.Alternate()[i] = keys.Current()[order[(size_t)i]];
            values.Alternate()[i] = values.Current()[order[(size_t)i]];
        }
        keys.selector ^= 1;
        values.selector ^= 1;
        return cudaSuccess;
    }
};

}  // namespace cub

#endif
