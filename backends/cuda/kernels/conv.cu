// Convolution (NCHW) as GEMMs: the im2col and col2im kernels around them. The host computes
// the geometry (ir/src/geometry.rs: pads, output sizes) and passes plain integers.
//
// A column matrix holds `nb` images: element (b, r, p) sits at
// `b * img_stride + r * row_stride + p`, with row r = (ch * kh + ki) * kw + kj (a channel and
// a kernel tap) and column p = oh * out_w + ow (an output pixel). `img_stride = rows * P`,
// `row_stride = P` stacks the images' matrices (one batched GEMM per group);
// `img_stride = P`, `row_stride = nb * P` puts them side by side (one GEMM over the batch).
// Threads walk p fastest, so writes (im2col) and reads (col2im) are coalesced.

// Index arithmetic in I: int where every index of the call fits (32-bit division is several
// times cheaper on a GPU), else i64.
#define CONV_FITS_INT(a, b) ((a) < 2147483647LL && (b) < 2147483647LL)

// col <- the column matrix of the images x[0..nb] (C, H, W); zero where a tap falls in the
// padding. A thread per element, p fastest.
template <typename T, typename I>
__device__ __forceinline__ void conv_im2col_body(const T* __restrict__ x, T* __restrict__ col,
                                                 I nb, I c, I h, I w, I kh, I kw, I sh, I sw,
                                                 I pt, I pl, I dh, I dw, I out_h, I out_w,
                                                 I img_stride, I row_stride) {
    I np = out_h * out_w, rows = c * kh * kw;
    GRID_STRIDE(i, (i64)nb * rows * np) {
        I p = (I)(i % np), t = (I)(i / np);
        I r = t % rows, b = t / rows;
        I oh = p / out_w, ow = p - oh * out_w;
        I kk = r / kw, kj = r - kk * kw;
        I ch = kk / kh, ki = kk - ch * kh;
        I ih = oh * sh + ki * dh - pt, iw = ow * sw + kj * dw - pl;
        T v = (T)0;
        if (ih >= 0 && ih < h && iw >= 0 && iw < w) v = x[((b * c + ch) * h + ih) * w + iw];
        col[b * img_stride + r * row_stride + p] = v;
    }
}

#define CONV_IM2COL(T, S)                                                                   \
    extern "C" __global__ void conv_im2col_##S(                                             \
        const T* __restrict__ x, T* __restrict__ col, i64 nb, i64 c, i64 h, i64 w, i64 kh,  \
        i64 kw, i64 sh, i64 sw, i64 pt, i64 pl, i64 dh, i64 dw, i64 out_h, i64 out_w,       \
        i64 img_stride, i64 row_stride) {                                                   \
        if (CONV_FITS_INT(nb * c * kh * kw * out_h * out_w, nb * c * h * w))                \
            conv_im2col_body<T, int>(x, col, (int)nb, (int)c, (int)h, (int)w, (int)kh,      \
                                     (int)kw, (int)sh, (int)sw, (int)pt, (int)pl, (int)dh,  \
                                     (int)dw, (int)out_h, (int)out_w, (int)img_stride,      \
                                     (int)row_stride);                                      \
        else                                                                                \
            conv_im2col_body<T, i64>(x, col, nb, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw,   \
                                     out_h, out_w, img_stride, row_stride);                 \
    }
FOR_FLOATS(CONV_IM2COL)

// dx (nb, C, H, W) <- the sum, per input pixel, of the column-matrix entries that read it
// (the adjoint of im2col). A thread per input element gathers its taps in (ki, kj) order, as
// the CPU's col2im adds them: no atomics, and dx is overwritten.
template <typename T, typename I>
__device__ __forceinline__ void conv_col2im_body(const T* __restrict__ col, T* __restrict__ dx,
                                                 I nb, I c, I h, I w, I kh, I kw, I sh, I sw,
                                                 I pt, I pl, I dh, I dw, I out_h, I out_w,
                                                 I img_stride, I row_stride) {
    GRID_STRIDE(i, (i64)nb * c * h * w) {
        I j = (I)i;
        I t = j / w, iw = j - t * w;
        I u = t / h, ih = t - u * h;
        I b = u / c, ch = u - b * c;
        const T* base = col + b * img_stride + ch * kh * kw * row_stride;
        T acc = (T)0;
        for (I ki = 0; ki < kh; ++ki) {
            I y = ih + pt - ki * dh;  // oh * sh for the output row that reads ih with tap ki
            if (y < 0) break;         // and smaller for every later ki
            I oh = y / sh;
            if (oh * sh != y || oh >= out_h) continue;
            for (I kj = 0; kj < kw; ++kj) {
                I xx = iw + pl - kj * dw;
                if (xx < 0) break;
                I ow = xx / sw;
                if (ow * sw != xx || ow >= out_w) continue;
                acc += base[(ki * kw + kj) * row_stride + oh * out_w + ow];
            }
        }
        dx[i] = acc;
    }
}

#define CONV_COL2IM(T, S)                                                                   \
    extern "C" __global__ void conv_col2im_##S(                                             \
        const T* __restrict__ col, T* __restrict__ dx, i64 nb, i64 c, i64 h, i64 w, i64 kh, \
        i64 kw, i64 sh, i64 sw, i64 pt, i64 pl, i64 dh, i64 dw, i64 out_h, i64 out_w,       \
        i64 img_stride, i64 row_stride) {                                                   \
        if (CONV_FITS_INT(nb * c * kh * kw * out_h * out_w, nb * c * h * w))                \
            conv_col2im_body<T, int>(col, dx, (int)nb, (int)c, (int)h, (int)w, (int)kh,     \
                                     (int)kw, (int)sh, (int)sw, (int)pt, (int)pl, (int)dh,  \
                                     (int)dw, (int)out_h, (int)out_w, (int)img_stride,      \
                                     (int)row_stride);                                      \
        else                                                                                \
            conv_col2im_body<T, i64>(col, dx, nb, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw,  \
                                     out_h, out_w, img_stride, row_stride);                 \
    }
FOR_FLOATS(CONV_COL2IM)

// y (o, nb, p) <- x (nb, o, p): the images' (O, P) matrices side by side, so that a filter
// gradient contracts over every pixel of the chunk in one GEMM.
#define CONV_GATHER(T, S)                                                                   \
    extern "C" __global__ void conv_side_by_side_##S(const T* __restrict__ x,               \
                                                    T* __restrict__ y, i64 nb, i64 o,       \
                                                    i64 p) {                                \
        GRID_STRIDE(i, nb * o * p) {                                                        \
            i64 pi = i % p, t = i / p;                                                      \
            i64 b = t % nb, oi = t / nb;                                                    \
            y[i] = x[(b * o + oi) * p + pi];                                                \
        }                                                                                   \
    }
FOR_FLOATS(CONV_GATHER)
