#pragma once
// RLSYNC_HD marks a function nvcc compiles for both the host and the device,
// so that the CPU path and the CUDA kernels share one definition (dtype
// conversions, plan replay indexing, the device checksum) and agree bit for
// bit. Plain C++ compilers see an empty macro.
#if defined(__CUDACC__)
#define RLSYNC_HD __host__ __device__
#else
#define RLSYNC_HD
#endif
