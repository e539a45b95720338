// Losses over logits (n, c). A bad label sets *status to (row + 1); the executor reads it
// after the step and reports the op.

// The log-sum-exp of a row, with the block's threads; every thread gets it.
template <typename T>
__device__ __forceinline__ T row_lse(const T* xr, i64 c) {
    T m = -(T)INFINITY;
    for (i64 j = threadIdx.x; j < c; j += blockDim.x) m = (xr[j] > m || xr[j] != xr[j]) ? xr[j] : m;
    m = block_max(m);
    T s = (T)0;
    for (i64 j = threadIdx.x; j < c; j += blockDim.x) s += sh_exp(xr[j] - m);
    return m + sh_log(block_sum(s));
}

// SoftmaxCrossEntropyWithLogits(logits, labels) -> (loss (n), backprop (n, c)).
#define SOFTMAX_CE(T, S)                                                                    \
    extern "C" __global__ void softmax_ce_##S(const T* __restrict__ x,                      \
                                             const T* __restrict__ labels,                  \
                                             T* __restrict__ loss, T* __restrict__ back,    \
                                             i64 n, i64 c) {                                \
        for (i64 r = blockIdx.x; r < n; r += gridDim.x) {                                   \
            const T* xr = x + r * c;                                                        \
            const T* yr = labels + r * c;                                                   \
            T lse = row_lse(xr, c);                                                         \
            T acc = (T)0;                                                                   \
            for (i64 j = threadIdx.x; j < c; j += blockDim.x) {                             \
                acc += yr[j] * (lse - xr[j]);                                               \
                back[r * c + j] = sh_exp(xr[j] - lse) - yr[j];                              \
            }                                                                               \
            acc = block_sum(acc);                                                           \
            if (threadIdx.x == 0) loss[r] = acc;                                            \
        }                                                                                   \
    }
FOR_FLOATS(SOFTMAX_CE)

// SparseSoftmaxCrossEntropyWithLogits, is_grad false: the mean loss. One block: a thread per
// row, then a block sum (launch with grid 1).
#define SPARSE_CE_LOSS(I_T, I_S, T, S)                                                      \
    extern "C" __global__ void sparse_ce_loss_##I_S##_##S(                                  \
        const T* __restrict__ x, const I_T* __restrict__ labels, T* __restrict__ y, i64 n,  \
        i64 c, int* status) {                                                               \
        T acc = (T)0;                                                                       \
        for (i64 r = threadIdx.x; r < n; r += blockDim.x) {                                 \
            const T* xr = x + r * c;                                                        \
            i64 l = (i64)labels[r];                                                         \
            if (l < 0 || l >= c) {                                                          \
                *(volatile int*)status = (int)(r + 1);                                      \
                continue;                                                                   \
            }                                                                               \
            T m = -(T)INFINITY;                                                             \
            for (i64 j = 0; j < c; ++j) m = (xr[j] > m || xr[j] != xr[j]) ? xr[j] : m;     \
            T s = (T)0;                                                                     \
            for (i64 j = 0; j < c; ++j) s += sh_exp(xr[j] - m);                             \
            acc += m + sh_log(s) - xr[l];                                                   \
        }                                                                                   \
        acc = block_sum(acc);                                                               \
        if (threadIdx.x == 0) y[0] = acc / (T)n;                                            \
    }
SPARSE_CE_LOSS(int, i32, float, f32)
SPARSE_CE_LOSS(i64, i64, float, f32)
SPARSE_CE_LOSS(int, i32, double, f64)
SPARSE_CE_LOSS(i64, i64, double, f64)

// SparseSoftmaxCrossEntropyWithLogits, is_grad true: (softmax - onehot) / n, a block per row.
#define SPARSE_CE_GRAD(I_T, I_S, T, S)                                                      \
    extern "C" __global__ void sparse_ce_grad_##I_S##_##S(                                  \
        const T* __restrict__ x, const I_T* __restrict__ labels, T* __restrict__ g, i64 n,  \
        i64 c, int* status) {                                                               \
        for (i64 r = blockIdx.x; r < n; r += gridDim.x) {                                   \
            const T* xr = x + r * c;                                                        \
            i64 l = (i64)labels[r];                                                         \
            if ((l < 0 || l >= c) && threadIdx.x == 0) *(volatile int*)status = (int)(r + 1); \
            T lse = row_lse(xr, c);                                                         \
            T inv = (T)1 / (T)n;                                                            \
            for (i64 j = threadIdx.x; j < c; j += blockDim.x)                               \
                g[r * c + j] = (sh_exp(xr[j] - lse) - (j == l ? (T)1 : (T)0)) * inv;        \
        }                                                                                   \
    }
SPARSE_CE_GRAD(int, i32, float, f32)
SPARSE_CE_GRAD(i64, i64, float, f32)
SPARSE_CE_GRAD(int, i32, double, f64)
SPARSE_CE_GRAD(i64, i64, double, f64)
