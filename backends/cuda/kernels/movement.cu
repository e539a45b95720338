// Data movement that is not a plain strided copy: scatters (StridedSliceGrad, Concat), Gather,
// Dropout's masks (the hash of shardc_ir::dropout, bit for bit), Equal.

// y[offset_a(i)] = x[i]: writes x (contiguous, the result dims of s) into a strided region.
#define STRIDED_SCATTER(T, S)                                                               \
    extern "C" __global__ void strided_scatter_##S(const T* __restrict__ x, T* __restrict__ y, \
                                                  i64 n, Strided s) {                       \
        GRID_STRIDE(i, n) {                                                                 \
            i64 oa, ob;                                                                     \
            strided_offsets(s, i, &oa, &ob);                                                \
            y[oa] = x[i];                                                                   \
        }                                                                                   \
    }
STRIDED_SCATTER(float, f32)
STRIDED_SCATTER(double, f64)
STRIDED_SCATTER(int, i32)
STRIDED_SCATTER(i64, i64)
// Bit copies for the narrow types, as the strided copies (elementwise.cu).
STRIDED_SCATTER(unsigned char, b8)
STRIDED_SCATTER(unsigned short, b16)

// Gather(params (pre, dim, post), indices (n)) -> (pre, n, post). `params` holds rows
// [lo, lo + dim) of a table of `bound` rows (the whole table: lo = 0, bound = dim); rows it
// does not hold give 0. An index outside [0, bound) sets *status to (position + 1) and
// writes 0.
#define GATHER(I_T, I_S, T, S)                                                              \
    extern "C" __global__ void gather_##I_S##_##S(const T* __restrict__ p,                  \
                                                 const I_T* __restrict__ idx,               \
                                                 T* __restrict__ y, i64 pre, i64 dim,       \
                                                 i64 n, i64 post, i64 lo, i64 bound,        \
                                                 int* status) {                             \
        GRID_STRIDE(i, pre * n * post) {                                                    \
            i64 q = i % post, j = (i / post) % n, o = i / (post * n);                       \
            i64 k = (i64)idx[j];                                                            \
            if (k < 0 || k >= bound) {                                                      \
                *(volatile int*)status = (int)(j + 1);                                      \
                y[i] = (T)0;                                                                \
            } else if (k < lo || k >= lo + dim) {                                           \
                y[i] = (T)0;                                                                \
            } else {                                                                        \
                y[i] = p[(o * dim + (k - lo)) * post + q];                                  \
            }                                                                               \
        }                                                                                   \
    }
GATHER(int, i32, float, f32)
GATHER(i64, i64, float, f32)
GATHER(int, i32, double, f64)
GATHER(i64, i64, double, f64)
GATHER(int, i32, int, i32)
GATHER(i64, i64, int, i32)
GATHER(int, i32, i64, i64)
GATHER(i64, i64, i64, i64)

// UnsortedSegmentSum(x (n, inner), ids (n)) -> y (num, inner): y holds segments
// [lo, lo + num) of a result of `bound` segments. Thread t owns column q = t % inner of the
// segments of range r = t / inner ([r * per, (r + 1) * per) of y's), zeroes them, then adds
// the rows of x in index order: every element is the same sum, in the same order, as the
// CPU's, with no atomics. Negative ids are dropped; an id of `bound` or more sets *status to
// (position + 1).
#define SEGMENT_SUM(I_T, I_S, T, S)                                                         \
    extern "C" __global__ void unsorted_segment_sum_##I_S##_##S(                            \
        const T* __restrict__ x, const I_T* __restrict__ ids, T* __restrict__ y, i64 n,     \
        i64 inner, i64 num, i64 per, i64 ranges, i64 lo, i64 bound, int* status) {          \
        GRID_STRIDE(t, ranges * inner) {                                                    \
            i64 q = t % inner, r = t / inner;                                               \
            i64 s0 = r * per, s1 = s0 + per < num ? s0 + per : num;                         \
            for (i64 s = s0; s < s1; ++s) y[s * inner + q] = (T)0;                          \
            for (i64 i = 0; i < n; ++i) {                                                   \
                i64 k = (i64)ids[i];                                                        \
                if (k >= bound) {                                                           \
                    *(volatile int*)status = (int)(i + 1);                                  \
                    continue;                                                               \
                }                                                                           \
                i64 s = k - lo;                                                             \
                if (k >= 0 && s >= s0 && s < s1) y[s * inner + q] += x[i * inner + q];      \
            }                                                                               \
        }                                                                                   \
    }
SEGMENT_SUM(int, i32, float, f32)
SEGMENT_SUM(i64, i64, float, f32)
SEGMENT_SUM(int, i32, double, f64)
SEGMENT_SUM(i64, i64, double, f64)

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// Dropout(x) -> (y, mask): element i's global index is i (rank 0 of s) or base + the `a`
// offset of i (a rank's block of the global tensor); kept when its uniform is below keep.
// The step's key is read from device memory (the executor writes it before each step), so a
// recorded step replays with each step's own masks.
#define DROPOUT(T, S)                                                                       \
    extern "C" __global__ void dropout_##S(const T* __restrict__ x, T* __restrict__ y,      \
                                          T* __restrict__ mask, i64 n,                      \
                                          const unsigned long long* __restrict__ key_at,    \
                                          double keep, i64 base, Strided s) {               \
        T scale = (T)(1.0 / keep);                                                          \
        unsigned long long key = *key_at;                                                   \
        GRID_STRIDE(i, n) {                                                                 \
            unsigned long long g = (unsigned long long)i;                                   \
            if (s.rank != 0) {                                                              \
                i64 oa, ob;                                                                 \
                strided_offsets(s, i, &oa, &ob);                                            \
                g = (unsigned long long)(base + oa);                                        \
            }                                                                               \
            unsigned long long h = mix64(key ^ (g * 0x9e3779b97f4a7c15ULL));                \
            double u = (double)(h >> 11) * (1.0 / 9007199254740992.0);                      \
            T m = u < keep ? scale : (T)0;                                                  \
            mask[i] = m;                                                                    \
            y[i] = x[i] * m;                                                                \
        }                                                                                   \
    }
FOR_FLOATS(DROPOUT)

// Equal(a, b) -> Bool (one byte per element), broadcasting through s.
#define EQUAL(T, S)                                                                         \
    extern "C" __global__ void equal_##S(const T* __restrict__ a, const T* __restrict__ b,  \
                                        unsigned char* __restrict__ y, i64 n, Strided s) {  \
        GRID_STRIDE(i, n) {                                                                 \
            i64 oa = i, ob = i;                                                             \
            if (s.rank != 0) strided_offsets(s, i, &oa, &ob);                               \
            y[i] = a[oa] == b[ob] ? 1 : 0;                                                  \
        }                                                                                   \
    }
EQUAL(float, f32)
EQUAL(double, f64)
EQUAL(int, i32)
EQUAL(i64, i64)
