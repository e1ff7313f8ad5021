// One macro for host+device annotation, so core headers compile under g++ (no CUDA headers needed)
// and under nvcc.
#pragma once

#if defined(__CUDACC__)
#define EXC_HD __host__ __device__
#define EXC_INLINE __forceinline__
#else
#define EXC_HD
#define EXC_INLINE inline __attribute__((always_inline))
#endif

// True while compiling device code (nvcc's device pass).
#if defined(__CUDA_ARCH__)
#define EXC_DEVICE_PASS 1
#else
#define EXC_DEVICE_PASS 0
#endif

// Put before a loop with a compile-time trip count whose iterations index a local array (one per
// rank): unrolled, the array stays in registers; indexed at run time it goes to local memory.
#if defined(__CUDA_ARCH__)
#define EXC_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)  // nvcc's host pass: its front end knows no GCC pragma, g++ no "unroll"
#define EXC_UNROLL
#elif defined(__GNUC__)
#define EXC_UNROLL _Pragma("GCC unroll 16")
#else
#define EXC_UNROLL
#endif

// Put before a short loop over the elements of a pack: host g++ then keeps it a loop for its loop
// vectorizer instead of unrolling it first (the unrolled form is left scalar: measured on the
// simulator's folds). Nothing on the device, where the loop is unrolled as usual.
#if defined(__CUDACC__) || !defined(__GNUC__)
#define EXC_HOST_VECTOR_LOOP
#else
#define EXC_HOST_VECTOR_LOOP _Pragma("GCC unroll 1")
#endif
