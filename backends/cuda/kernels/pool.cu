// MaxPool / AvgPool and their gradients (NCHW, `valid` / `same` padding), over `planes` =
// N * C planes of (H, W). The host computes the geometry (ir/src/geometry.rs); the window of
// output pixel (oh, ow) is the rows [oh * sh - pt, + kh) and columns [ow * sw - pl, + kw)
// clipped to the plane: padding takes no part in a max and is excluded from an average.

// The clipped window of output pixel (oh, ow): rows [h0, h1), columns [w0, w1).
__device__ __forceinline__ void pool_window(i64 oh, i64 ow, i64 h, i64 w, i64 kh, i64 kw,
                                            i64 sh, i64 sw, i64 pt, i64 pl, i64* h0, i64* h1,
                                            i64* w0, i64* w1) {
    i64 a = oh * sh - pt, b = ow * sw - pl;
    i64 a1 = a + kh < h ? a + kh : h, b1 = b + kw < w ? b + kw : w;
    *h0 = a > 0 ? a : 0;
    *w0 = b > 0 ? b : 0;
    *h1 = a1 > *h0 ? a1 : *h0;
    *w1 = b1 > *w0 ? b1 : *w0;
}

// y <- the max (NaN wins) or the mean of each window. A thread per output element.
template <typename T>
__device__ __forceinline__ void pool_forward_body(const T* __restrict__ x, T* __restrict__ y,
                                                  i64 planes, i64 h, i64 w, i64 out_h,
                                                  i64 out_w, i64 kh, i64 kw, i64 sh, i64 sw,
                                                  i64 pt, i64 pl, int is_max) {
    i64 np = out_h * out_w;
    GRID_STRIDE(i, planes * np) {
        i64 p = i % np, plane = i / np;
        i64 h0, h1, w0, w1;
        pool_window(p / out_w, p % out_w, h, w, kh, kw, sh, sw, pt, pl, &h0, &h1, &w0, &w1);
        const T* xp = x + plane * h * w;
        T acc = is_max ? -(T)INFINITY : (T)0;
        for (i64 ih = h0; ih < h1; ++ih) {
            for (i64 iw = w0; iw < w1; ++iw) {
                T v = xp[ih * w + iw];
                if (is_max) {
                    acc = (v > acc || v != v) ? v : acc;
                } else {
                    acc += v;
                }
            }
        }
        if (!is_max) {
            i64 count = (h1 - h0) * (w1 - w0);
            acc = count == 0 ? (T)0 : acc / (T)count;
        }
        y[i] = acc;
    }
}

#define POOL_FORWARD(T, S)                                                                  \
    extern "C" __global__ void pool_forward_##S(const T* __restrict__ x, T* __restrict__ y, \
                                               i64 planes, i64 h, i64 w, i64 out_h,         \
                                               i64 out_w, i64 kh, i64 kw, i64 sh, i64 sw,   \
                                               i64 pt, i64 pl, int is_max) {                \
        pool_forward_body<T>(x, y, planes, h, w, out_h, out_w, kh, kw, sh, sw, pt, pl,     \
                             is_max);                                                       \
    }
FOR_FLOATS(POOL_FORWARD)

// dx <- for a max pool, dy of every window whose FIRST maximum (a NaN before any number) is
// this pixel; for an average pool, dy / count of every window that holds it. A thread per
// input element visits the windows holding it in (oh, ow) order, as the CPU adds them: no
// atomics, and dx is overwritten. A max window's argmax is recomputed (windows are small).
template <typename T>
__device__ __forceinline__ void pool_grad_body(const T* __restrict__ x, const T* __restrict__ dy,
                                               T* __restrict__ dx, i64 planes, i64 h, i64 w,
                                               i64 out_h, i64 out_w, i64 kh, i64 kw, i64 sh,
                                               i64 sw, i64 pt, i64 pl, int is_max) {
    GRID_STRIDE(i, planes * h * w) {
        i64 iw = i % w, t = i / w;
        i64 ih = t % h, plane = t / h;
        const T* xp = x + plane * h * w;
        const T* dyp = dy + plane * out_h * out_w;
        // Output rows whose window holds ih: oh * sh - pt <= ih < oh * sh - pt + kh.
        i64 lo_h = ih + pt - kh + 1, lo_w = iw + pl - kw + 1;
        i64 oh0 = lo_h > 0 ? (lo_h + sh - 1) / sh : 0, ow0 = lo_w > 0 ? (lo_w + sw - 1) / sw : 0;
        i64 oh1 = (ih + pt) / sh, ow1 = (iw + pl) / sw;
        if (oh1 > out_h - 1) oh1 = out_h - 1;
        if (ow1 > out_w - 1) ow1 = out_w - 1;
        T acc = (T)0;
        for (i64 oh = oh0; oh <= oh1; ++oh) {
            for (i64 ow = ow0; ow <= ow1; ++ow) {
                i64 h0, h1, w0, w1;
                pool_window(oh, ow, h, w, kh, kw, sh, sw, pt, pl, &h0, &h1, &w0, &w1);
                T d = dyp[oh * out_w + ow];
                if (is_max) {
                    i64 best = -1;
                    T b = (T)0;
                    for (i64 a = h0; a < h1; ++a) {
                        for (i64 c = w0; c < w1; ++c) {
                            T v = xp[a * w + c];
                            if (best < 0 || v > b || (v != v && b == b)) {
                                best = a * w + c;
                                b = v;
                            }
                        }
                    }
                    if (best == ih * w + iw) acc += d;
                } else {
                    i64 count = (h1 - h0) * (w1 - w0);
                    if (count > 0) acc += d / (T)count;
                }
            }
        }
        dx[i] = acc;
    }
}

#define POOL_GRAD(T, S)                                                                     \
    extern "C" __global__ void pool_grad_##S(const T* __restrict__ x,                       \
                                            const T* __restrict__ dy, T* __restrict__ dx,   \
                                            i64 planes, i64 h, i64 w, i64 out_h, i64 out_w, \
                                            i64 kh, i64 kw, i64 sh, i64 sw, i64 pt, i64 pl, \
                                            int is_max) {                                   \
        pool_grad_body<T>(x, dy, dx, planes, h, w, out_h, out_w, kh, kw, sh, sw, pt, pl,   \
                          is_max);                                                          \
    }
FOR_FLOATS(POOL_GRAD)
