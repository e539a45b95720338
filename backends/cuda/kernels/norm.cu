// LayerNorm and its gradient over (rows, d), the parameters of length p (p divides d).

#define LAYER_NORM(T, S)                                                                    \
    extern "C" __global__ void layer_norm_##S(const T* __restrict__ x,                      \
                                             const T* __restrict__ gamma,                   \
                                             const T* __restrict__ beta, T* __restrict__ y, \
                                             T* __restrict__ mean, T* __restrict__ rstd,    \
                                             i64 rows, i64 d, i64 p, double eps) {          \
        for (i64 o = blockIdx.x; o < rows; o += gridDim.x) {                                \
            const T* xr = x + o * d;                                                        \
            T* yr = y + o * d;                                                              \
            T s = (T)0;                                                                     \
            for (i64 j = threadIdx.x; j < d; j += blockDim.x) s += xr[j];                   \
            T mu = block_sum(s) / (T)d;                                                     \
            T q = (T)0;                                                                     \
            for (i64 j = threadIdx.x; j < d; j += blockDim.x) q += (xr[j] - mu) * (xr[j] - mu); \
            T rs = (T)1 / sh_sqrt(block_sum(q) / (T)d + (T)eps);                            \
            for (i64 j = threadIdx.x; j < d; j += blockDim.x) {                             \
                i64 pi = (o * d + j) % p;                                                   \
                yr[j] = (xr[j] - mu) * rs * gamma[pi] + beta[pi];                           \
            }                                                                               \
            if (threadIdx.x == 0) {                                                         \
                mean[o] = mu;                                                               \
                rstd[o] = rs;                                                               \
            }                                                                               \
        }                                                                                   \
    }
FOR_FLOATS(LAYER_NORM)

// dx of LayerNormGrad(x, dy, rstd, mean, gamma): a block per row.
#define LAYER_NORM_GRAD_X(T, S)                                                             \
    extern "C" __global__ void layer_norm_grad_x_##S(                                       \
        const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ rstd,      \
        const T* __restrict__ mean, const T* __restrict__ gamma, T* __restrict__ dx,        \
        i64 rows, i64 d, i64 p) {                                                           \
        for (i64 o = blockIdx.x; o < rows; o += gridDim.x) {                                \
            T mu = mean[o], rs = rstd[o];                                                   \
            T sg = (T)0, sgx = (T)0;                                                        \
            for (i64 j = threadIdx.x; j < d; j += blockDim.x) {                             \
                i64 i = o * d + j;                                                          \
                T g = dy[i] * gamma[i % p];                                                 \
                sg += g;                                                                    \
                sgx += g * (x[i] - mu) * rs;                                                \
            }                                                                               \
            T mg = block_sum(sg) / (T)d;                                                    \
            T mgx = block_sum(sgx) / (T)d;                                                  \
            for (i64 j = threadIdx.x; j < d; j += blockDim.x) {                             \
                i64 i = o * d + j;                                                          \
                T g = dy[i] * gamma[i % p];                                                 \
                T xhat = (x[i] - mu) * rs;                                                  \
                dx[i] = rs * (g - mg - xhat * mgx);                                         \
            }                                                                               \
        }                                                                                   \
    }
FOR_FLOATS(LAYER_NORM_GRAD_X)

// dgamma, dbeta: column sums of the (total / p, p) view, tiled as reduce_cols_tiled: a block
// per 32 adjacent parameters, its warps taking every (warps)-th row, partial sums combined in
// shared memory (blockDim a multiple of 32, at most 1024).
#define LAYER_NORM_GRAD_PARAMS(T, S)                                                        \
    extern "C" __global__ void layer_norm_grad_params_##S(                                  \
        const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ rstd,      \
        const T* __restrict__ mean, T* __restrict__ dgamma, T* __restrict__ dbeta,          \
        i64 total, i64 d, i64 p) {                                                          \
        __shared__ T part_g[1024];                                                          \
        __shared__ T part_b[1024];                                                          \
        int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;      \
        i64 rows = total / p;                                                               \
        for (i64 t = blockIdx.x; t * 32 < p; t += gridDim.x) {                              \
            i64 j = t * 32 + lane;                                                          \
            T g = (T)0, b = (T)0;                                                           \
            if (j < p) {                                                                    \
                for (i64 q = warp; q < rows; q += warps) {                                  \
                    i64 i = q * p + j, r = i / d;                                           \
                    g += dy[i] * (x[i] - mean[r]) * rstd[r];                                \
                    b += dy[i];                                                             \
                }                                                                           \
            }                                                                               \
            part_g[threadIdx.x] = g;                                                        \
            part_b[threadIdx.x] = b;                                                        \
            __syncthreads();                                                                \
            if (warp == 0 && j < p) {                                                       \
                for (int w = 1; w < warps; ++w) {                                           \
                    g += part_g[w * 32 + lane];                                             \
                    b += part_b[w * 32 + lane];                                             \
                }                                                                           \
                dgamma[j] = g;                                                              \
                dbeta[j] = b;                                                               \
            }                                                                               \
            __syncthreads();                                                                \
        }                                                                                   \
    }
FOR_FLOATS(LAYER_NORM_GRAD_PARAMS)
