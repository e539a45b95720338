// Reductions and the row-wise ops: a tensor viewed as (outer, r, inner) reduced over r.
// Row kernels (inner == 1): a block per row, block-wide sums. Column kernels (inner > 1): a
// thread per (outer, inner) result, a serial loop over r (reads coalesced along inner); for
// long columns, tiled: a block per 32 adjacent columns, its warps taking every (warps)-th row
// and their partial results combined in shared memory (a few hundred columns of a thousand
// rows, a bias's gradient, would otherwise be a few hundred threads looping a thousand times).

// y[o] = scale * sum / max of x[o, 0..r].  op: 0 sum, 1 max.
#define REDUCE_ROWS(T, S)                                                                   \
    extern "C" __global__ void reduce_rows_##S(const T* __restrict__ x, T* __restrict__ y,  \
                                              i64 outer, i64 r, int op, double scale) {     \
        for (i64 o = blockIdx.x; o < outer; o += gridDim.x) {                               \
            const T* row = x + o * r;                                                       \
            T acc = op == 0 ? (T)0 : -(T)INFINITY;                                          \
            for (i64 j = threadIdx.x; j < r; j += blockDim.x) {                             \
                T v = row[j];                                                               \
                acc = op == 0 ? acc + v : ((v > acc || v != v) ? v : acc);                  \
            }                                                                               \
            acc = op == 0 ? block_sum(acc) : block_max(acc);                                \
            if (threadIdx.x == 0) y[o] = op == 0 ? acc * (T)scale : acc;                    \
        }                                                                                   \
    }
FOR_FLOATS(REDUCE_ROWS)

#define REDUCE_COLS(T, S)                                                                   \
    extern "C" __global__ void reduce_cols_##S(const T* __restrict__ x, T* __restrict__ y,  \
                                              i64 outer, i64 r, i64 inner, int op,          \
                                              double scale) {                               \
        GRID_STRIDE(k, outer * inner) {                                                     \
            i64 o = k / inner, in = k % inner;                                              \
            const T* p = x + o * r * inner + in;                                            \
            T acc = op == 0 ? (T)0 : -(T)INFINITY;                                          \
            for (i64 j = 0; j < r; ++j) {                                                   \
                T v = p[j * inner];                                                         \
                acc = op == 0 ? acc + v : ((v > acc || v != v) ? v : acc);                 \
            }                                                                               \
            y[k] = op == 0 ? acc * (T)scale : acc;                                          \
        }                                                                                   \
    }
FOR_FLOATS(REDUCE_COLS)

// Combines two partial reductions: op 0 sums, 1 takes the maximum (NaN wins).
template <typename T>
__device__ __forceinline__ T reduce_combine(T acc, T v, int op) {
    return op == 0 ? acc + v : ((v > acc || v != v) ? v : acc);
}

// Tiled column reduction (blockDim a multiple of 32, at most 1024).
#define REDUCE_COLS_TILED(T, S)                                                             \
    extern "C" __global__ void reduce_cols_tiled_##S(const T* __restrict__ x,               \
                                                    T* __restrict__ y, i64 outer, i64 r,    \
                                                    i64 inner, int op, double scale) {      \
        __shared__ T part[1024];                                                            \
        int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;      \
        i64 tiles = (inner + 31) / 32;                                                      \
        T none = op == 0 ? (T)0 : -(T)INFINITY;                                             \
        for (i64 t = blockIdx.x; t < outer * tiles; t += gridDim.x) {                       \
            i64 o = t / tiles, in = (t % tiles) * 32 + lane;                                \
            T acc = none;                                                                   \
            if (in < inner) {                                                               \
                const T* p = x + o * r * inner + in;                                        \
                for (i64 j = warp; j < r; j += warps) acc = reduce_combine(acc, p[j * inner], op); \
            }                                                                               \
            part[threadIdx.x] = acc;                                                        \
            __syncthreads();                                                                \
            if (warp == 0 && in < inner) {                                                  \
                for (int w = 1; w < warps; ++w) acc = reduce_combine(acc, part[w * 32 + lane], op); \
                y[o * inner + in] = op == 0 ? acc * (T)scale : acc;                         \
            }                                                                               \
            __syncthreads();                                                                \
        }                                                                                   \
    }
FOR_FLOATS(REDUCE_COLS_TILED)

// BiasAddGrad for x (n, c, inner): db[ch] = sum over n and inner. A block per channel.
#define BIAS_GRAD(T, S)                                                                     \
    extern "C" __global__ void bias_add_grad_##S(const T* __restrict__ dy, T* __restrict__ db, \
                                                i64 n, i64 c, i64 inner) {                  \
        for (i64 ch = blockIdx.x; ch < c; ch += gridDim.x) {                                \
            T acc = (T)0;                                                                   \
            for (i64 k = threadIdx.x; k < n * inner; k += blockDim.x) {                     \
                i64 b = k / inner, in = k % inner;                                          \
                acc += dy[(b * c + ch) * inner + in];                                       \
            }                                                                               \
            acc = block_sum(acc);                                                           \
            if (threadIdx.x == 0) db[ch] = acc;                                             \
        }                                                                                   \
    }
FOR_FLOATS(BIAS_GRAD)

// Softmax (log = 0) or LogSoftmax (log = 1) over the middle axis of (outer, cols, inner):
// rows = outer * inner rows of cols elements, `inner` apart (1: the last axis, contiguous).
#define SOFTMAX(T, S)                                                                       \
    extern "C" __global__ void softmax_##S(const T* __restrict__ x, T* __restrict__ y,      \
                                          i64 rows, i64 cols, i64 inner, int log) {         \
        for (i64 o = blockIdx.x; o < rows; o += gridDim.x) {                                \
            i64 base = (o / inner) * cols * inner + o % inner;                              \
            const T* xr = x + base;                                                         \
            T* yr = y + base;                                                               \
            T m = -(T)INFINITY;                                                             \
            for (i64 j = threadIdx.x; j < cols; j += blockDim.x)                            \
                m = (xr[j * inner] > m || xr[j * inner] != xr[j * inner]) ? xr[j * inner] : m; \
            m = block_max(m);                                                               \
            T s = (T)0;                                                                     \
            for (i64 j = threadIdx.x; j < cols; j += blockDim.x)                            \
                s += sh_exp(xr[j * inner] - m);                                             \
            s = block_sum(s);                                                               \
            if (log) {                                                                      \
                T lse = m + sh_log(s);                                                      \
                for (i64 j = threadIdx.x; j < cols; j += blockDim.x)                        \
                    yr[j * inner] = xr[j * inner] - lse;                                    \
            } else {                                                                        \
                T inv = (T)1 / s;                                                           \
                for (i64 j = threadIdx.x; j < cols; j += blockDim.x)                        \
                    yr[j * inner] = sh_exp(xr[j * inner] - m) * inv;                        \
            }                                                                               \
        }                                                                                   \
    }
FOR_FLOATS(SOFTMAX)

// SoftmaxGrad(y, dy) = y * (dy - sum(dy * y)); LogSoftmaxGrad(y, dy) = dy - exp(y) * sum(dy),
// over the middle axis of (outer, cols, inner) as in softmax.
#define SOFTMAX_GRAD(T, S)                                                                  \
    extern "C" __global__ void softmax_grad_##S(const T* __restrict__ y,                    \
                                               const T* __restrict__ dy, T* __restrict__ dx, \
                                               i64 rows, i64 cols, i64 inner, int log) {    \
        for (i64 o = blockIdx.x; o < rows; o += gridDim.x) {                                \
            i64 base = (o / inner) * cols * inner + o % inner;                              \
            const T* yr = y + base;                                                         \
            const T* dr = dy + base;                                                        \
            T* xr = dx + base;                                                              \
            T s = (T)0;                                                                     \
            for (i64 j = threadIdx.x; j < cols; j += blockDim.x)                            \
                s += log ? dr[j * inner] : dr[j * inner] * yr[j * inner];                   \
            s = block_sum(s);                                                               \
            for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {                          \
                i64 k = j * inner;                                                          \
                xr[k] = log ? dr[k] - sh_exp(yr[k]) * s : yr[k] * (dr[k] - s);              \
            }                                                                               \
        }                                                                                   \
    }
FOR_FLOATS(SOFTMAX_GRAD)
