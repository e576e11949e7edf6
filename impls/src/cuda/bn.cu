// BatchNorm kernels on channel-major tensors `[C, M]` (row c = channel c, M = N*H*W values),
// the CUDA twins of the CPU kernels in impls/src/fused.rs. Every pointer is the first element
// of a contiguous view (the Rust launcher adds the layout's start offset), rows are `m` apart.
//
// Two launch geometries (the Rust side, impls/src/fused_cuda.rs, builds them):
//
// * per-channel reductions (bn_stats, bn_bwd_reduce): grid = (C, 1, 1), one block per channel,
//   block = (DB_REDUCE_THREADS, 1, 1). Thread t accumulates elements t, t + T, t + 2T, ... of
//   its row in f64, then db_block_sum adds the T partial sums in a fixed tree. No atomics, no
//   dependence on scheduling: two runs are bitwise equal. Shared memory: T doubles (static).
//   The result differs from the CPU twin (one sequential f64 sum per row) only by summation
//   order, i.e. by a few f64 ulps before the final rounding to T.
//
// * row-wise element-wise ops (affine_rows*, bn_bwd_dx*): block = (256, 1, 1) threads over
//   the columns, grid = (ceil(M / 256) capped, min(C, 65535), 1). blockIdx.y walks the rows
//   (grid-stride for C > 65535), blockIdx.x and threadIdx.x the columns (grid-stride), so the
//   per-channel coefficients are read once per row and no index is divided. Each element is
//   computed with the same roundings as the CPU twin: bitwise equal results.
//
// Each kernel writes exactly one output: a fresh tensor allocated by the launcher with the size
// the CPU twin allocates, or (bn_bwd_dx_accumulate) the destination view in place.

// ---- per-channel reductions ------------------------------------------------------------------

// out[c] = (mean, biased variance) of row c of x [C, m]: two passes in f64, like the CPU twin
// (the second pass subtracts the f64 mean, not the mean rounded to T). out is [C, 2].
template <typename T>
__device__ __forceinline__ void bn_stats(const T *__restrict__ x, T *__restrict__ out,
                                         const u64 m) {
    __shared__ double buf[DB_REDUCE_THREADS];
    const u64 c = blockIdx.x;
    const T *row = x + c * m;
    double s = 0.0;
    for (u64 i = threadIdx.x; i < m; i += DB_REDUCE_THREADS) s = db_add(s, (double)row[i]);
    const double mean = db_div(db_block_sum(s, buf), (double)m);
    double q = 0.0;
    for (u64 i = threadIdx.x; i < m; i += DB_REDUCE_THREADS) {
        const double d = db_sub((double)row[i], mean);
        q = db_add(q, db_mul(d, d));
    }
    const double var = db_div(db_block_sum(q, buf), (double)m);
    if (threadIdx.x == 0) {
        out[2 * c] = db_from_f64<T>(mean);
        out[2 * c + 1] = db_from_f64<T>(var);
    }
}

// out[c] = (sum gy, sum gy * xhat) over row c, xhat = (x - mean) * invstd evaluated in f64 as
// ((gy * (x - mean)) * invstd) like the CPU twin; st [C, 2] = (mean, invstd); out [C, 2].
template <typename T>
__device__ __forceinline__ void bn_bwd_reduce(const T *__restrict__ gy, const T *__restrict__ x,
                                              const T *__restrict__ st, T *__restrict__ out,
                                              const u64 m) {
    __shared__ double buf[DB_REDUCE_THREADS];
    const u64 c = blockIdx.x;
    const T *g = gy + c * m;
    const T *xr = x + c * m;
    const double mean = (double)st[2 * c];
    const double invstd = (double)st[2 * c + 1];
    double sg = 0.0, sgx = 0.0;
    for (u64 i = threadIdx.x; i < m; i += DB_REDUCE_THREADS) {
        const double gi = (double)g[i];
        sg = db_add(sg, gi);
        sgx = db_add(sgx, db_mul(db_mul(gi, db_sub((double)xr[i], mean)), invstd));
    }
    sg = db_block_sum(sg, buf);
    sgx = db_block_sum(sgx, buf);
    if (threadIdx.x == 0) {
        out[2 * c] = db_from_f64<T>(sg);
        out[2 * c + 1] = db_from_f64<T>(sgx);
    }
}

// ---- row-wise element-wise ops ---------------------------------------------------------------

// y = x * scale + shift per row in T (two roundings, as on the CPU), coef [C, 2] =
// (scale, shift). With RELU, y = y > 0 ? y : 0 (NaN -> 0): bitwise the CPU's BN apply
// followed by its in-place ReLU, in one pass and one output.
template <typename T, bool RELU>
__device__ __forceinline__ void affine_rows(const T *__restrict__ x, const T *__restrict__ coef,
                                            T *__restrict__ y, const u64 rows, const u64 m) {
    for (u64 r = blockIdx.y; r < rows; r += gridDim.y) {
        const T scale = coef[2 * r], shift = coef[2 * r + 1];
        const T *xr = x + r * m;
        T *yr = y + r * m;
        for (u64 i = db_first(); i < m; i += db_stride()) {
            const T v = db_add(db_mul(xr[i], scale), shift);
            yr[i] = (!RELU || db_is_positive(v)) ? v : (T)0;
        }
    }
}

// A * gy + B * x + C per row, evaluated in f64 as ((A*gy) + (B*x)) + C and rounded to T once,
// like the CPU twin; coef [C, 3] = (A, B, C) in T.
template <typename T>
__device__ __forceinline__ T bn_dx_value(const double a, const double b, const double cc,
                                         const T g, const T x) {
    return db_from_f64<T>(db_add(db_add(db_mul(a, (double)g), db_mul(b, (double)x)), cc));
}

// dx [C, m] = A * gy + B * x + C (a fresh tensor).
template <typename T>
__device__ __forceinline__ void bn_bwd_dx(const T *__restrict__ gy, const T *__restrict__ x,
                                          const T *__restrict__ coef, T *__restrict__ dx,
                                          const u64 rows, const u64 m) {
    for (u64 r = blockIdx.y; r < rows; r += gridDim.y) {
        const double a = (double)coef[3 * r], b = (double)coef[3 * r + 1],
                     cc = (double)coef[3 * r + 2];
        const T *g = gy + r * m;
        const T *xr = x + r * m;
        T *d = dx + r * m;
        for (u64 i = db_first(); i < m; i += db_stride()) d[i] = bn_dx_value<T>(a, b, cc, g[i], xr[i]);
    }
}

// dst [C, m] += T(A * gy + B * x + C), **in place** (dst is a view of the gradient buffer):
// the same rounding as bn_bwd_dx followed by one addition in T, so the result is bitwise that
// of bn_bwd_dx then add_assign, without the [C, m] temporary.
template <typename T>
__device__ __forceinline__ void bn_bwd_dx_accumulate(T *__restrict__ dst, const T *__restrict__ gy,
                                                     const T *__restrict__ x,
                                                     const T *__restrict__ coef, const u64 rows,
                                                     const u64 m) {
    for (u64 r = blockIdx.y; r < rows; r += gridDim.y) {
        const double a = (double)coef[3 * r], b = (double)coef[3 * r + 1],
                     cc = (double)coef[3 * r + 2];
        const T *g = gy + r * m;
        const T *xr = x + r * m;
        T *d = dst + r * m;
        for (u64 i = db_first(); i < m; i += db_stride())
            d[i] = db_add(d[i], bn_dx_value<T>(a, b, cc, g[i], xr[i]));
    }
}

// ---- extern "C" entry points, one per dtype ---------------------------------------------------

#define DB_BN_KERNELS(T, S)                                                                    \
    extern "C" __global__ void __launch_bounds__(DB_REDUCE_THREADS)                            \
        bn_stats_##S(const T *x, T *out, const u64 m) {                                        \
        bn_stats<T>(x, out, m);                                                                \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(DB_REDUCE_THREADS)                            \
        bn_bwd_reduce_##S(const T *gy, const T *x, const T *st, T *out, const u64 m) {         \
        bn_bwd_reduce<T>(gy, x, st, out, m);                                                   \
    }                                                                                          \
    extern "C" __global__ void affine_rows_##S(const T *x, const T *coef, T *y, const u64 rows, \
                                               const u64 m) {                                  \
        affine_rows<T, false>(x, coef, y, rows, m);                                            \
    }                                                                                          \
    extern "C" __global__ void affine_rows_relu_##S(const T *x, const T *coef, T *y,            \
                                                    const u64 rows, const u64 m) {             \
        affine_rows<T, true>(x, coef, y, rows, m);                                             \
    }                                                                                          \
    extern "C" __global__ void bn_bwd_dx_##S(const T *gy, const T *x, const T *coef, T *dx,     \
                                             const u64 rows, const u64 m) {                    \
        bn_bwd_dx<T>(gy, x, coef, dx, rows, m);                                                \
    }                                                                                          \
    extern "C" __global__ void bn_bwd_dx_accumulate_##S(T *dst, const T *gy, const T *x,        \
                                                        const T *coef, const u64 rows,         \
                                                        const u64 m) {                         \
        bn_bwd_dx_accumulate<T>(dst, gy, x, coef, rows, m);                                    \
    }

DB_BN_KERNELS(float, f32)
DB_BN_KERNELS(double, f64)
