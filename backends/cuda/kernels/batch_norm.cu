// BatchNorm and the synchronised BatchNorm ops over x viewed as (n, c, s): per-channel
// statistics (a block per channel, or per chunk of a long channel; block-wide sums, two
// passes for the variance as the CPU),
// then elementwise normalisation and gradients (a thread per element).
// Element k of channel ch is x[((k / s) * c + ch) * s + k % s]: reads coalesced along s.

// Runs the statement after it for the elements k = threadIdx.x, + blockDim.x, ... of channel
// ch of x viewed as (n, c, s), with `i` their index in x: image b_ = k / s and position
// j_ = k % s are stepped along, not divided out per element (a 64-bit division costs dozens
// of instructions). The same elements in the same order as the division would give.
#define FOR_CHANNEL_ELEMENT(i, ch, n, c, s)                                                 \
    for (i64 s_ = (s) > 0 ? (s) : 1, b_ = (s) > 0 ? threadIdx.x / s_ : (n),                 \
             j_ = threadIdx.x % s_, db_ = blockDim.x / s_, dj_ = blockDim.x % s_,           \
             i = (b_ * (c) + (ch)) * s_ + j_;                                               \
         b_ < (n);                                                                          \
         b_ += db_ + (j_ + dj_ >= s_), j_ = j_ + dj_ >= s_ ? j_ + dj_ - s_ : j_ + dj_,      \
             i = (b_ * (c) + (ch)) * s_ + j_)

// Runs the statement after it for the elements k = k0 + threadIdx.x, + blockDim.x, ... below k1
// of channel ch of x viewed as (c, s) per image, as FOR_CHANNEL_ELEMENT steps them (one
// division per thread, at the start).
#define FOR_CHANNEL_RANGE(i, ch, c, s, k0, k1)                                              \
    for (i64 s_ = (s) > 0 ? (s) : 1, k_ = (k0) + threadIdx.x, b_ = k_ / s_, j_ = k_ % s_,    \
             db_ = blockDim.x / s_, dj_ = blockDim.x % s_, i = (b_ * (c) + (ch)) * s_ + j_; \
         k_ < (k1);                                                                         \
         k_ += blockDim.x, b_ += db_ + (j_ + dj_ >= s_),                                    \
             j_ = j_ + dj_ >= s_ ? j_ + dj_ - s_ : j_ + dj_, i = (b_ * (c) + (ch)) * s_ + j_)

// Runs the block after it for the blocks b = blockIdx.x, + gridDim.x, ... below c * parts,
// with ch = b / parts and [k0, k1) the elements of chunk b % parts of that channel.
#define FOR_CHANNEL_CHUNK(b, ch, k0, k1, c, m, parts, chunk)                                \
    for (i64 b = blockIdx.x, ch = 0, k0 = 0, k1 = 0;                                         \
         b < (c) * (parts) && (ch = b / (parts), k0 = (b % (parts)) * (chunk),               \
                               k1 = k0 + (chunk) < (m) ? k0 + (chunk) : (m), true);          \
         b += gridDim.x)

// A channel too long for one block to reduce quickly is split into `parts` chunks of `chunk`
// elements, block b reducing chunk b % parts of channel b / parts into partial[b]; a thread per
// channel then adds its partials in order. Training statistics take two such passes (the
// sums, then the squares about the mean), as the CPU's two passes.
#define BN_PARTIAL_SUMS(T, S)                                                               \
    extern "C" __global__ void bn_partial_sums_##S(                                         \
        const T* __restrict__ x, const T* __restrict__ mean, T* __restrict__ partial, i64 c, \
        i64 s, i64 m, i64 parts, i64 chunk, int centered) {                                 \
        FOR_CHANNEL_CHUNK(b, ch, k0, k1, c, m, parts, chunk) {                             \
            T mu = centered ? mean[ch] : (T)0;                                              \
            T acc = (T)0;                                                                   \
            FOR_CHANNEL_RANGE(i, ch, c, s, k0, k1) {                                        \
                T d = x[i] - mu;                                                            \
                acc += centered ? d * d : d;                                                \
            }                                                                               \
            acc = block_sum(acc);                                                           \
            if (threadIdx.x == 0) partial[b] = acc;                                         \
        }                                                                                   \
    }
FOR_FLOATS(BN_PARTIAL_SUMS)

// mean[ch] = the sum of channel ch's partials / m.
#define BN_MEAN_FROM_PARTIALS(T, S)                                                         \
    extern "C" __global__ void bn_mean_from_partials_##S(                                   \
        const T* __restrict__ partial, T* __restrict__ mean, i64 c, i64 parts, i64 m) {     \
        GRID_STRIDE(ch, c) {                                                                \
            T a = (T)0;                                                                     \
            for (i64 p = 0; p < parts; p++) a += partial[ch * parts + p];                   \
            mean[ch] = a / (T)m;                                                            \
        }                                                                                   \
    }
FOR_FLOATS(BN_MEAN_FROM_PARTIALS)

// The statistics from the partial sums of squares about saved_mean (which holds the mean).
#define BN_STATS_FROM_PARTIALS(T, S)                                                        \
    extern "C" __global__ void bn_stats_from_partials_##S(                                  \
        const T* __restrict__ partial, const T* __restrict__ saved_mean,                    \
        T* __restrict__ batch_mean, T* __restrict__ batch_var, T* __restrict__ saved_rstd,  \
        i64 c, i64 parts, i64 m, double eps) {                                              \
        GRID_STRIDE(ch, c) {                                                                \
            T sq = (T)0;                                                                    \
            for (i64 p = 0; p < parts; p++) sq += partial[ch * parts + p];                  \
            T var = m > 0 ? sq / (T)m : (T)0;                                               \
            batch_mean[ch] = saved_mean[ch];                                                \
            batch_var[ch] = m > 1 ? sq / (T)(m - 1) : var;                                  \
            saved_rstd[ch] = (T)1 / sh_sqrt(var + (T)eps);                                  \
        }                                                                                   \
    }
FOR_FLOATS(BN_STATS_FROM_PARTIALS)

// Per channel: training mode, the batch mean and variance (biased for rstd, unbiased for
// batch_var); inference mode, mean_in / var_in.
#define BN_STATS(T, S)                                                                      \
    extern "C" __global__ void bn_stats_##S(                                                \
        const T* __restrict__ x, const T* __restrict__ mean_in,                             \
        const T* __restrict__ var_in, T* __restrict__ batch_mean, T* __restrict__ batch_var, \
        T* __restrict__ saved_mean, T* __restrict__ saved_rstd, i64 n, i64 c, i64 s,        \
        double eps, int training) {                                                         \
        i64 m = n * s;                                                                      \
        for (i64 ch = blockIdx.x; ch < c; ch += gridDim.x) {                                \
            T mean, var, unbiased;                                                          \
            if (training) {                                                                 \
                T acc = (T)0;                                                               \
                FOR_CHANNEL_ELEMENT(i, ch, n, c, s) acc += x[i];                            \
                mean = block_sum(acc) / (T)m;                                               \
                T sq = (T)0;                                                                \
                FOR_CHANNEL_ELEMENT(i, ch, n, c, s) {                                       \
                    T d = x[i] - mean;                                                      \
                    sq += d * d;                                                            \
                }                                                                           \
                sq = block_sum(sq);                                                         \
                var = m > 0 ? sq / (T)m : (T)0;                                             \
                unbiased = m > 1 ? sq / (T)(m - 1) : var;                                   \
            } else {                                                                        \
                mean = mean_in[ch];                                                         \
                var = var_in[ch];                                                           \
                unbiased = var;                                                             \
            }                                                                               \
            if (threadIdx.x == 0) {                                                         \
                batch_mean[ch] = mean;                                                      \
                batch_var[ch] = unbiased;                                                   \
                saved_mean[ch] = mean;                                                      \
                saved_rstd[ch] = (T)1 / sh_sqrt(var + (T)eps);                              \
            }                                                                               \
        }                                                                                   \
    }
FOR_FLOATS(BN_STATS)

// y = (x - mean) * (rstd * scale) + bias, per channel.
#define BN_NORMALIZE(T, S)                                                                  \
    extern "C" __global__ void bn_normalize_##S(                                            \
        const T* __restrict__ x, const T* __restrict__ mean, const T* __restrict__ rstd,    \
        const T* __restrict__ scale, const T* __restrict__ bias, T* __restrict__ y,         \
        i64 total, i64 c, i64 s) {                                                          \
        GRID_STRIDE(i, total) {                                                             \
            i64 ch = channel_of(i, s, c);                                                   \
            T k = rstd[ch] * scale[ch];                                                     \
            y[i] = (x[i] - mean[ch]) * k + bias[ch];                                        \
        }                                                                                   \
    }
FOR_FLOATS(BN_NORMALIZE)

// BNTrainingReduce: sum and square_sum per channel.
#define BN_REDUCE(T, S)                                                                     \
    extern "C" __global__ void bn_reduce_##S(const T* __restrict__ x, T* __restrict__ sum,  \
                                            T* __restrict__ square_sum, i64 n, i64 c,       \
                                            i64 s) {                                        \
        for (i64 ch = blockIdx.x; ch < c; ch += gridDim.x) {                                \
            T a = (T)0, q = (T)0;                                                           \
            FOR_CHANNEL_ELEMENT(i, ch, n, c, s) {                                           \
                T v = x[i];                                                                 \
                a += v;                                                                     \
                q += v * v;                                                                 \
            }                                                                               \
            a = block_sum(a);                                                               \
            q = block_sum(q);                                                               \
            if (threadIdx.x == 0) {                                                         \
                sum[ch] = a;                                                                \
                square_sum[ch] = q;                                                         \
            }                                                                               \
        }                                                                                   \
    }
FOR_FLOATS(BN_REDUCE)

// BNTrainingUpdate's statistics from the global sums: mean = sum / count, the biased
// var = square_sum / count - mean^2 (never below 0), batch_var the unbiased one. A thread per
// channel.
#define BN_UPDATE_STATS(T, S)                                                               \
    extern "C" __global__ void bn_update_stats_##S(                                         \
        const T* __restrict__ sum, const T* __restrict__ square_sum,                        \
        T* __restrict__ batch_mean, T* __restrict__ batch_var, T* __restrict__ saved_mean,  \
        T* __restrict__ saved_rstd, i64 c, double count_v, double eps) {                    \
        T count = (T)count_v;                                                               \
        GRID_STRIDE(ch, c) {                                                                \
            T mu = sum[ch] / count;                                                         \
            T var = square_sum[ch] / count - mu * mu;                                       \
            if (var < (T)0) var = (T)0;                                                     \
            T unbiased = count > (T)1 ? var * count / (count - (T)1) : var;                 \
            batch_mean[ch] = mu;                                                            \
            batch_var[ch] = unbiased;                                                       \
            saved_mean[ch] = mu;                                                            \
            saved_rstd[ch] = (T)1 / sh_sqrt(var + (T)eps);                                  \
        }                                                                                   \
    }
FOR_FLOATS(BN_UPDATE_STATS)


// dscale = sum(dy * (x - mean) * rstd), dbias = sum(dy) over chunks of the channels (see
// BN_PARTIAL_SUMS; with parts 1, a channel each: dscale and dbias themselves).
#define BN_GRAD_SUMS(T, S)                                                                  \
    extern "C" __global__ void bn_grad_sums_##S(                                            \
        const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ mean,      \
        const T* __restrict__ rstd, T* __restrict__ partial_ds, T* __restrict__ partial_db, \
        i64 c, i64 s, i64 m, i64 parts, i64 chunk) {                                        \
        FOR_CHANNEL_CHUNK(b, ch, k0, k1, c, m, parts, chunk) {                             \
            T mu = mean[ch], r = rstd[ch];                                                  \
            T ds = (T)0, db = (T)0;                                                         \
            FOR_CHANNEL_RANGE(i, ch, c, s, k0, k1) {                                        \
                ds += dy[i] * ((x[i] - mu) * r);                                            \
                db += dy[i];                                                                \
            }                                                                               \
            ds = block_sum(ds);                                                             \
            db = block_sum(db);                                                             \
            if (threadIdx.x == 0) {                                                         \
                partial_ds[b] = ds;                                                         \
                partial_db[b] = db;                                                         \
            }                                                                               \
        }                                                                                   \
    }
FOR_FLOATS(BN_GRAD_SUMS)

// dscale and dbias from their partials, in order.
#define BN_GRAD_SUMS_FROM_PARTIALS(T, S)                                                    \
    extern "C" __global__ void bn_grad_sums_from_partials_##S(                              \
        const T* __restrict__ partial_ds, const T* __restrict__ partial_db,                 \
        T* __restrict__ dscale, T* __restrict__ dbias, i64 c, i64 parts) {                  \
        GRID_STRIDE(ch, c) {                                                                \
            T ds = (T)0, db = (T)0;                                                         \
            for (i64 p = 0; p < parts; p++) {                                               \
                ds += partial_ds[ch * parts + p];                                           \
                db += partial_db[ch * parts + p];                                           \
            }                                                                               \
            dscale[ch] = ds;                                                                \
            dbias[ch] = db;                                                                 \
        }                                                                                   \
    }
FOR_FLOATS(BN_GRAD_SUMS_FROM_PARTIALS)

// dx, training mode: scale * rstd / m * (m * dy - dbias - xhat * dscale), m the (global)
// count per channel; inference mode: dy * scale * rstd.
#define BN_GRAD_DX(T, S)                                                                    \
    extern "C" __global__ void bn_grad_dx_##S(                                              \
        const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ scale,     \
        const T* __restrict__ mean, const T* __restrict__ rstd,                             \
        const T* __restrict__ dscale, const T* __restrict__ dbias, T* __restrict__ dx,      \
        i64 total, i64 c, i64 s, double m_v, int training) {                                \
        T m = (T)m_v;                                                                       \
        GRID_STRIDE(i, total) {                                                             \
            i64 ch = channel_of(i, s, c);                                                   \
            T r = rstd[ch], g = scale[ch];                                                  \
            if (training) {                                                                 \
                T xhat = (x[i] - mean[ch]) * r;                                             \
                dx[i] = g * r / m * (m * dy[i] - dbias[ch] - xhat * dscale[ch]);            \
            } else {                                                                        \
                dx[i] = dy[i] * g * r;                                                      \
            }                                                                               \
        }                                                                                   \
    }
FOR_FLOATS(BN_GRAD_DX)
