// Optimizer updates, functional: new values are written to results. A result may be the very
// operand it updates (the executor writes weights in place, see src/in_place.rs): every kernel
// reads element i of its operands before it writes element i of its results, and no pointer is
// __restrict__. Scalar
// operands (learning rate, momentum, ...) are a device pointer to a rank-0 tensor or, when
// null, the value passed beside it.

// One element of ApplyMomentum, from its loaded values (apply_momentum and
// apply_momentum_multi share it, so both give the same bits).
template <typename T>
__device__ __forceinline__ void momentum_at(T* var_out, T* acc_out, T var, T acc, T g, T lr,
                                            T mom, int nesterov) {
    T a = acc * mom + g;
    *acc_out = a;
    *var_out = nesterov ? var - lr * (g + mom * a) : var - lr * a;
}

#define APPLY_MOMENTUM(T, S)                                                                \
    extern "C" __global__ void apply_momentum_##S(                                          \
        const T* var, const T* acc, const T* lr_p, double lr_v,   \
        const T* grad, const T* mom_p, double mom_v, T* var_out,  \
        T* acc_out, i64 n, int nesterov) {                                     \
        T lr = scalar_of(lr_p, lr_v), mom = scalar_of(mom_p, mom_v);                        \
        GRID_STRIDE(i, n) {                                                                 \
            momentum_at<T>(var_out + i, acc_out + i, var[i], acc[i], grad[i], lr, mom,      \
                           nesterov);                                                       \
        }                                                                                   \
    }
FOR_FLOATS(APPLY_MOMENTUM)

#define APPLY_GD(T, S)                                                                      \
    extern "C" __global__ void apply_gradient_descent_##S(                                  \
        const T* var, const T* alpha_p, double alpha_v,                        \
        const T* delta, T* out, i64 n) {                          \
        T alpha = scalar_of(alpha_p, alpha_v);                                              \
        GRID_STRIDE(i, n) out[i] = var[i] - alpha * delta[i];                               \
    }
FOR_FLOATS(APPLY_GD)

// SGD(parameters, gradient, learning_rate, accum, momentum, stat), MindSpore's op.
#define SGD(T, S)                                                                           \
    extern "C" __global__ void sgd_##S(                                                     \
        const T* param, const T* grad, const T* lr_p, double lr_v, \
        const T* accum, const T* mom_p, double mom_v,                          \
        const T* stat, T* p_out, T* a_out,           \
        T* s_out, i64 n, double dampening, double weight_decay, int nesterov) { \
        T lr = scalar_of(lr_p, lr_v), mom = scalar_of(mom_p, mom_v);                        \
        T damp = (T)dampening, wd = (T)weight_decay;                                        \
        GRID_STRIDE(i, n) {                                                                 \
            T g = grad[i];                                                                  \
            if (wd > (T)0) g += param[i] * wd;                                              \
            T a = accum[i], s = stat[i];                                                    \
            if (mom > (T)0) {                                                               \
                if (s > (T)0) {                                                             \
                    a = g;                                                                  \
                    s = (T)0;                                                               \
                } else {                                                                    \
                    a = a * mom + ((T)1 - damp) * g;                                        \
                }                                                                           \
                g = nesterov ? g + a * mom : a;                                             \
            }                                                                               \
            p_out[i] = param[i] - lr * g;                                                   \
            a_out[i] = a;                                                                   \
            s_out[i] = s;                                                                   \
        }                                                                                   \
    }
FOR_FLOATS(SGD)

// One element of Adam, from its loaded values (adam and adam_multi share it, so both give
// the same bits).
template <typename T>
__device__ __forceinline__ void adam_at(T* var_out, T* m_out, T* v_out, T var, T m, T v, T g,
                                        T b1, T b2, T eps, T lr_t, int nesterov) {
    T nm = b1 * m + ((T)1 - b1) * g;
    T nv = b2 * v + ((T)1 - b2) * g * g;
    T num = nesterov ? nm * b1 + ((T)1 - b1) * g : nm;
    *var_out = var - lr_t * num / (sh_sqrt(nv) + eps);
    *m_out = nm;
    *v_out = nv;
}

// Adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, gradient).
#define ADAM(T, S)                                                                          \
    extern "C" __global__ void adam_##S(                                                    \
        const T* var, const T* m, const T* v,        \
        const T* b1p_p, double b1p_v, const T* b2p_p, double b2p_v, const T* lr_p,          \
        double lr_v, const T* b1_p, double b1_v, const T* b2_p, double b2_v,                \
        const T* eps_p, double eps_v, const T* grad, T* var_out,  \
        T* m_out, T* v_out, i64 n, int nesterov) {                \
        double b1p = (double)scalar_of(b1p_p, b1p_v), b2p = (double)scalar_of(b2p_p, b2p_v); \
        double lr = (double)scalar_of(lr_p, lr_v);                                          \
        T b1 = scalar_of(b1_p, b1_v), b2 = scalar_of(b2_p, b2_v), eps = scalar_of(eps_p, eps_v); \
        T lr_t = (T)(lr * sqrt(1.0 - b2p) / (1.0 - b1p));                                   \
        GRID_STRIDE(i, n) {                                                                 \
            adam_at<T>(var_out + i, m_out + i, v_out + i, var[i], m[i], v[i], grad[i], b1,  \
                       b2, eps, lr_t, nesterov);                                            \
        }                                                                                   \
    }
FOR_FLOATS(ADAM)

// The row of a multi-weight table (rows of `width` i64, the last one each row's start; starts
// increasing from 0) that element i of the concatenation belongs to: the last row whose start
// is at most i.
__device__ __forceinline__ i64 table_row(const i64* table, i64 count, i64 width, i64 i) {
    i64 lo = 0, hi = count - 1;
    while (lo < hi) {
        i64 mid = (lo + hi + 1) / 2;
        if (table[mid * width + width - 1] <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// ApplyMomentum of many weights in one launch, each in place (see src/in_place.rs): `table`
// holds per weight (var, accum, grad, n, start) as i64. The arithmetic is apply_momentum's,
// so the results are the same bits.
#define APPLY_MOMENTUM_MULTI(T, S)                                                          \
    extern "C" __global__ void apply_momentum_multi_##S(                                    \
        const i64* __restrict__ table, i64 count, i64 total, const T* lr_p, double lr_v,    \
        const T* mom_p, double mom_v, int nesterov) {                                       \
        T lr = scalar_of(lr_p, lr_v), mom = scalar_of(mom_p, mom_v);                        \
        GRID_STRIDE(i, total) {                                                             \
            const i64* e = table + table_row(table, count, 5, i) * 5;                       \
            T* var = (T*)e[0];                                                              \
            T* acc = (T*)e[1];                                                              \
            const T* grad = (const T*)e[2];                                                 \
            i64 j = i - e[4];                                                               \
            momentum_at<T>(var + j, acc + j, var[j], acc[j], grad[j], lr, mom, nesterov);   \
        }                                                                                   \
    }
FOR_FLOATS(APPLY_MOMENTUM_MULTI)

// Adam of many weights in one launch, each in place: `table` holds per weight
// (var, m, v, grad, n, start) as i64; the scalars are shared. The arithmetic is adam's, so
// the results are the same bits.
#define ADAM_MULTI(T, S)                                                                    \
    extern "C" __global__ void adam_multi_##S(                                              \
        const i64* __restrict__ table, i64 count, i64 total, const T* b1p_p, double b1p_v,  \
        const T* b2p_p, double b2p_v, const T* lr_p, double lr_v, const T* b1_p,            \
        double b1_v, const T* b2_p, double b2_v, const T* eps_p, double eps_v,              \
        int nesterov) {                                                                     \
        double b1p = (double)scalar_of(b1p_p, b1p_v), b2p = (double)scalar_of(b2p_p, b2p_v); \
        double lr = (double)scalar_of(lr_p, lr_v);                                          \
        T b1 = scalar_of(b1_p, b1_v), b2 = scalar_of(b2_p, b2_v), eps = scalar_of(eps_p, eps_v); \
        T lr_t = (T)(lr * sqrt(1.0 - b2p) / (1.0 - b1p));                                   \
        GRID_STRIDE(i, total) {                                                             \
            const i64* e = table + table_row(table, count, 6, i) * 6;                       \
            T* var = (T*)e[0];                                                              \
            T* m = (T*)e[1];                                                                \
            T* v = (T*)e[2];                                                                \
            const T* grad = (const T*)e[3];                                                 \
            i64 j = i - e[5];                                                               \
            adam_at<T>(var + j, m + j, v + j, var[j], m[j], v[j], grad[j], b1, b2, eps, lr_t, \
                       nesterov);                                                           \
        }                                                                                   \
    }
FOR_FLOATS(ADAM_MULTI)
