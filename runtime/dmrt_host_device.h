/* dmrt_host_device.h: DMRT_HOST_DEVICE marks the runtime's inline functions that C and CUDA
 * compile alike (dmrt_philox.h, dmrt_half.h): __host__ __device__ under nvcc, nothing in C. */
#ifndef DMRT_HOST_DEVICE_H
#define DMRT_HOST_DEVICE_H

#ifdef __CUDACC__
#define DMRT_HOST_DEVICE __host__ __device__
#else
#define DMRT_HOST_DEVICE
#endif

#endif
