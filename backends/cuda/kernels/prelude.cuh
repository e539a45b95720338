// shardc CUDA kernels: the prelude every kernel source starts with.
//
// The same sources compile with NVRTC for a GPU and, for tests on machines without one, with
// the host C++ compiler under `emulator.hpp` (see src/emulator.rs). So every kernel keeps to a
// small dialect: static `__shared__` arrays, `__syncthreads()` reached by every thread of the
// block the same number of times (no early return before a barrier), warp shuffles only in
// code every thread of the block runs, and block sizes that are a multiple of 32 (at most 1024).

typedef long long i64;

// NVRTC has no <math.h>; the host emulator gets INFINITY from it.
#ifndef INFINITY
#define INFINITY (__int_as_float(0x7f800000))
#endif

// Kernel parameter blocks passed by value (their Rust twins are `#[repr(C)]` in src/kernels.rs).
#define SHARDC_MAX_RANK 8
struct Strided {
    int rank;                       // 0: contiguous operands of the result's length
    int pad;
    i64 out[SHARDC_MAX_RANK];       // the result's dims
    i64 a[SHARDC_MAX_RANK];         // element strides of operand a per result dim (0: broadcast)
    i64 b[SHARDC_MAX_RANK];         // element strides of operand b per result dim (0: broadcast)
};

// A scalar operand: a device pointer to one element (a rank-0 tensor) or, when null, a value.
template <typename T>
__device__ __forceinline__ T scalar_of(const T* p, double v) {
    return p ? *p : (T)v;
}

// The offsets into a and b of result element i.
__device__ __forceinline__ void strided_offsets(const Strided& s, i64 i, i64* oa, i64* ob) {
    i64 a = 0, b = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
        i64 n = s.out[d];
        i64 k = i % n;
        i /= n;
        a += k * s.a[d];
        b += k * s.b[d];
    }
    *oa = a;
    *ob = b;
}

#define GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

// The channel of element i of a tensor viewed as (outer, c, inner): by 32-bit division where
// the numbers fit (a 64-bit division costs several times as many instructions).
__device__ __forceinline__ i64 channel_of(i64 i, i64 inner, i64 c) {
    if (i <= 0xffffffffLL && inner <= 0xffffffffLL && c <= 0xffffffffLL) {
        unsigned int q = (unsigned int)i / (unsigned int)inner;
        return (i64)(q % (unsigned int)c);
    }
    return (i / inner) % c;
}

// Sum over a warp; every lane gets the total.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) {
        T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = (w > v || w != w) ? w : v;  // a NaN from either side wins
    }
    return v;
}

// Sum over the block; every thread gets the total. Every thread of the block must call it.
template <typename T>
__device__ __forceinline__ T block_sum(T v) {
    __shared__ T part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // the previous call's readers are done with `part`
    if (lane == 0) part[warp] = v;
    __syncthreads();
    T r = lane < warps ? part[lane] : (T)0;
    return warp_sum(r);
}

// Max over the block (NaN wins); every thread gets it. Every thread of the block must call it.
template <typename T>
__device__ __forceinline__ T block_max(T v) {
    __shared__ T part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    T r = lane < warps ? part[lane] : -(T)INFINITY;
    return warp_max(r);
}

__device__ __forceinline__ float sh_exp(float x) { return expf(x); }
__device__ __forceinline__ double sh_exp(double x) { return exp(x); }
__device__ __forceinline__ float sh_log(float x) { return logf(x); }
__device__ __forceinline__ double sh_log(double x) { return log(x); }
__device__ __forceinline__ float sh_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double sh_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float sh_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double sh_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float sh_erf(float x) { return erff(x); }
__device__ __forceinline__ double sh_erf(double x) { return erf(x); }

// Defines kernel family K for both float types: K(float, f32) and K(double, f64), each
// writing `extern "C" __global__ void name_f32(...)` with T the element type.
#define FOR_FLOATS(K) K(float, f32) K(double, f64)
