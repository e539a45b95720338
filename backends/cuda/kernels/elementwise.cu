// Elementwise kernels: unary maps, broadcasting binary maps, BiasAdd, fills and casts.
// Grid-stride loops; the launch picks any grid.

#define GELU_C 0.7978845608028654
#define GELU_A 0.044715

template <typename T> __device__ __forceinline__ T op_neg(T x) { return -x; }
template <typename T> __device__ __forceinline__ T op_square(T x) { return x * x; }
template <typename T> __device__ __forceinline__ T op_sqrt(T x) { return sh_sqrt(x); }
template <typename T> __device__ __forceinline__ T op_exp(T x) { return sh_exp(x); }
template <typename T> __device__ __forceinline__ T op_log(T x) { return sh_log(x); }
template <typename T> __device__ __forceinline__ T op_relu(T x) { return x > (T)0 ? x : (T)0; }
template <typename T> __device__ __forceinline__ T op_tanh(T x) { return sh_tanh(x); }
template <typename T> __device__ __forceinline__ T op_gelu(T x) {
    return (T)0.5 * x * ((T)1 + sh_tanh((T)GELU_C * (x + (T)GELU_A * x * x * x)));
}
template <typename T> __device__ __forceinline__ T op_sigmoid(T x) {
    if (x >= (T)0) return (T)1 / ((T)1 + sh_exp(-x));
    T e = sh_exp(x);
    return e / ((T)1 + e);
}
template <typename T> __device__ __forceinline__ T op_silu(T x) { return x * op_sigmoid(x); }
template <typename T> __device__ __forceinline__ T op_erf(T x) { return sh_erf(x); }
template <typename T> __device__ __forceinline__ T gelu_grad(T x) {
    T t = sh_tanh((T)GELU_C * (x + (T)GELU_A * x * x * x));
    return (T)0.5 * ((T)1 + t) +
           (T)0.5 * x * ((T)1 - t * t) * (T)GELU_C * ((T)1 + (T)3 * (T)GELU_A * x * x);
}

#define UNARY(T, S, NAME)                                                                   \
    extern "C" __global__ void unary_##NAME##_##S(const T* __restrict__ x, T* __restrict__ y, \
                                                 i64 n) {                                   \
        GRID_STRIDE(i, n) y[i] = op_##NAME<T>(x[i]);                                        \
    }
#define UNARY_ALL(T, S)                                                                     \
    UNARY(T, S, neg) UNARY(T, S, square) UNARY(T, S, sqrt) UNARY(T, S, exp) UNARY(T, S, log) \
    UNARY(T, S, relu) UNARY(T, S, tanh) UNARY(T, S, gelu) UNARY(T, S, sigmoid)                 \
    UNARY(T, S, silu) UNARY(T, S, erf)
FOR_FLOATS(UNARY_ALL)

template <typename T> __device__ __forceinline__ T bin_add(T a, T b) { return a + b; }
template <typename T> __device__ __forceinline__ T bin_sub(T a, T b) { return a - b; }
template <typename T> __device__ __forceinline__ T bin_mul(T a, T b) { return a * b; }
template <typename T> __device__ __forceinline__ T bin_div(T a, T b) { return a / b; }
// ReluGrad(dy, y)
template <typename T> __device__ __forceinline__ T bin_relu_grad(T dy, T y) { return y > (T)0 ? dy : (T)0; }
// SigmoidGrad(y, dy)
template <typename T> __device__ __forceinline__ T bin_sigmoid_grad(T y, T dy) { return dy * y * ((T)1 - y); }
// TanhGrad(y, dy)
template <typename T> __device__ __forceinline__ T bin_tanh_grad(T y, T dy) { return dy * ((T)1 - y * y); }
// SqrtGrad(y, dy)
template <typename T> __device__ __forceinline__ T bin_sqrt_grad(T y, T dy) { return dy / ((T)2 * y); }
// GeLUGrad(dy, x)
template <typename T> __device__ __forceinline__ T bin_gelu_grad(T dy, T x) { return dy * gelu_grad(x); }

// SiLUGrad(dy, x)
template <typename T> __device__ __forceinline__ T bin_silu_grad(T dy, T x) {
    T s = op_sigmoid(x);
    return dy * s * ((T)1 + x * ((T)1 - s));
}

#define BINARY(T, S, NAME)                                                                  \
    extern "C" __global__ void binary_##NAME##_##S(const T* __restrict__ a,                 \
                                                  const T* __restrict__ b, T* __restrict__ y, \
                                                  i64 n, Strided s) {                       \
        if (s.rank == 0) {                                                                  \
            GRID_STRIDE(i, n) y[i] = bin_##NAME<T>(a[i], b[i]);                             \
        } else {                                                                            \
            GRID_STRIDE(i, n) {                                                             \
                i64 oa, ob;                                                                 \
                strided_offsets(s, i, &oa, &ob);                                            \
                y[i] = bin_##NAME<T>(a[oa], b[ob]);                                         \
            }                                                                               \
        }                                                                                   \
    }
#define BINARY_ALL(T, S)                                                                    \
    BINARY(T, S, add) BINARY(T, S, sub) BINARY(T, S, mul) BINARY(T, S, div)                 \
    BINARY(T, S, relu_grad) BINARY(T, S, sigmoid_grad) BINARY(T, S, tanh_grad)              \
    BINARY(T, S, sqrt_grad) BINARY(T, S, gelu_grad) BINARY(T, S, silu_grad)
FOR_FLOATS(BINARY_ALL)

// A binary op with a scalar operand (a constant or a rank-0 tensor): y = x op c, or c op x
// when `scalar_first`.
#define BINARY_SCALAR(T, S, NAME)                                                           \
    extern "C" __global__ void scalar_##NAME##_##S(const T* __restrict__ x, const T* cp,    \
                                                  double cv, int scalar_first,              \
                                                  T* __restrict__ y, i64 n) {               \
        T c = scalar_of(cp, cv);                                                            \
        if (scalar_first) {                                                                 \
            GRID_STRIDE(i, n) y[i] = bin_##NAME<T>(c, x[i]);                                \
        } else {                                                                            \
            GRID_STRIDE(i, n) y[i] = bin_##NAME<T>(x[i], c);                                \
        }                                                                                   \
    }
#define BINARY_SCALAR_ALL(T, S)                                                             \
    BINARY_SCALAR(T, S, add) BINARY_SCALAR(T, S, sub) BINARY_SCALAR(T, S, mul)              \
    BINARY_SCALAR(T, S, div)
FOR_FLOATS(BINARY_SCALAR_ALL)

// BiasAdd(x, b): b along axis 1 of x viewed as (outer, c, inner).
#define BIAS_ADD(T, S)                                                                      \
    extern "C" __global__ void bias_add_##S(const T* __restrict__ x, const T* __restrict__ b, \
                                           T* __restrict__ y, i64 n, i64 c, i64 inner) {    \
        GRID_STRIDE(i, n) y[i] = x[i] + b[channel_of(i, inner, c)];                         \
    }
FOR_FLOATS(BIAS_ADD)

// Strided copy: y[i] = x[offset of i]; a transpose (permuted strides) or a broadcast (zero
// strides). Uses the `a` strides of `s`.
#define STRIDED_COPY(T, S)                                                                  \
    extern "C" __global__ void strided_copy_##S(const T* __restrict__ x, T* __restrict__ y, \
                                               i64 n, Strided s) {                          \
        GRID_STRIDE(i, n) {                                                                 \
            i64 oa, ob;                                                                     \
            strided_offsets(s, i, &oa, &ob);                                                \
            y[i] = x[oa];                                                                   \
        }                                                                                   \
    }
STRIDED_COPY(float, f32)
STRIDED_COPY(double, f64)
STRIDED_COPY(int, i32)
STRIDED_COPY(i64, i64)
// Bit copies for the narrow types (Bool, the 8- and 16-bit integers and floats): a move
// only needs the element's size.
STRIDED_COPY(unsigned char, b8)
STRIDED_COPY(unsigned short, b16)

#define FILL(T, S)                                                                          \
    extern "C" __global__ void fill_##S(T* __restrict__ y, i64 n, double v) {               \
        T t = (T)v;                                                                         \
        GRID_STRIDE(i, n) y[i] = t;                                                         \
    }
FILL(float, f32)
FILL(double, f64)
FILL(int, i32)
FILL(i64, i64)

#define CAST(S_T, S_S, D_T, D_S)                                                            \
    extern "C" __global__ void cast_##S_S##_##D_S(const S_T* __restrict__ x,                \
                                                 D_T* __restrict__ y, i64 n) {              \
        GRID_STRIDE(i, n) y[i] = (D_T)x[i];                                                 \
    }
#define CAST_FROM(S_T, S_S)                                                                 \
    CAST(S_T, S_S, float, f32) CAST(S_T, S_S, double, f64) CAST(S_T, S_S, int, i32)         \
    CAST(S_T, S_S, i64, i64)
CAST_FROM(float, f32)
CAST_FROM(double, f64)
CAST_FROM(int, i32)
CAST_FROM(i64, i64)

// Casts from and to Bool (one byte, 0 or 1): a value is true when it is not zero (NaN too),
// as on the CPU.
#define CAST_FROM_BOOL(D_T, D_S)                                                            \
    extern "C" __global__ void cast_b8_##D_S(const unsigned char* __restrict__ x,           \
                                            D_T* __restrict__ y, i64 n) {                   \
        GRID_STRIDE(i, n) y[i] = x[i] != 0 ? (D_T)1 : (D_T)0;                               \
    }
#define CAST_TO_BOOL(S_T, S_S)                                                              \
    extern "C" __global__ void cast_##S_S##_b8(const S_T* __restrict__ x,                   \
                                              unsigned char* __restrict__ y, i64 n) {       \
        GRID_STRIDE(i, n) y[i] = x[i] != (S_T)0 ? 1 : 0;                                    \
    }
CAST_FROM_BOOL(float, f32)
CAST_FROM_BOOL(double, f64)
CAST_FROM_BOOL(int, i32)
CAST_FROM_BOOL(i64, i64)
CAST_FROM_BOOL(unsigned char, b8)
CAST_TO_BOOL(float, f32)
CAST_TO_BOOL(double, f64)
CAST_TO_BOOL(int, i32)
CAST_TO_BOOL(i64, i64)

// OneHot(indices, depth, on, off) with axis -1: y (n, depth).
#define ONE_HOT(I_T, I_S, T, S)                                                             \
    extern "C" __global__ void one_hot_##I_S##_##S(const I_T* __restrict__ idx,             \
                                                  T* __restrict__ y, i64 n, i64 depth,      \
                                                  double on, double off) {                  \
        GRID_STRIDE(i, n * depth) {                                                         \
            i64 r = i / depth, j = i % depth;                                               \
            y[i] = (i64)idx[r] == j ? (T)on : (T)off;                                       \
        }                                                                                   \
    }
ONE_HOT(int, i32, float, f32)
ONE_HOT(i64, i64, float, f32)
ONE_HOT(int, i32, double, f64)
ONE_HOT(i64, i64, double, f64)
