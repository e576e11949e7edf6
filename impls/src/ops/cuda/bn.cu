// BatchNorm kernels on channel-major tensors `[C, M]` (row c = channel c, M = N*H*W values),
// the CUDA twins of the CPU kernels in impls/src/fused.rs. Every pointer is the first element
// of a contiguous view (the Rust launcher adds the layout's start offset), rows are `m` apart.
//
// Per-channel tables are planar, `[Q, C]`: quantity q of channel c is `table[q * C + c]`, so a
// group of quantities is one contiguous view and a per-channel vector (dgamma, dbeta, a running stat)
// is one contiguous row.
//
// Three launch geometries (the Rust side, impls/src/ops/cuda/bn.rs, builds them):
//
// * per-channel reductions (bn_stats, bn_stats_prepare, bn_bwd_reduce[_relu]): grid =
//   (C, 1, 1), one block per channel, block = (DB_REDUCE_THREADS, 1, 1). Thread t
//   accumulates elements t, t + T, t + 2T, ... of its row in f64 (its loads issued 32 bytes
//   per row at a time, db_thread_rows, so a block
//   keeps 32 KiB of reads in flight: a BN over fewer channels than the GPU has SMs still
//   streams), then db_block_sum adds the T partial sums in a fixed tree. No atomics, no
//   dependence on scheduling: two runs are bitwise equal. Shared memory: T doubles (static).
//   The result differs from the CPU twin (16 interleaved f64 partial sums per row, added
//   pairwise) only by summation order, i.e. by a few f64 ulps before the final rounding to T.
//
// * the per-channel step (bn_prepare): 1-D, block = (256, 1, 1), grid-stride over C; one
//   thread per channel, T arithmetic in the CPU twin's order: bitwise equal.
//
// * row-wise element-wise ops (affine_rows*, relu_bwd_affine, bn_bwd_dx*): block = (256, 1, 1) threads over
//   the columns, grid = (ceil(M / 256) capped, min(C, 65535), 1). blockIdx.y walks the rows
//   (grid-stride for C > 65535), blockIdx.x and threadIdx.x the columns (grid-stride), so the
//   per-channel coefficients are read once per row and no index is divided. Each element is
//   computed with the same roundings as the CPU twin: bitwise equal results.
//
// Each kernel writes exactly its outputs: fresh tensors allocated by the launcher with the sizes
// the CPU twin allocates, or (bn_bwd_dx_accumulate) the destination view in place.
//
// Why the per-channel arithmetic (1/sqrt(var + eps), the affine coefficients, the running-stat
// update, BN backward's A, B, C) sits in these kernels: done as separate tensor ops it was about
// two dozen launches of O(C) work per layer, each a kernel launch and an allocation; here it is
// part of bn_stats' consumer (bn_prepare, one launch per BN in forward) and of bn_bwd_reduce's
// last step (none extra in backward).
//
// Element types (prelude.cuh): features `T` (x, gy, y, dx) are f32, f64 or bf16; per-channel
// tables, statistics and scalars are `A = db_acc<T>` (f32 for bf16 features, as PyTorch
// autocast keeps BatchNorm in f32). A feature is read widened to A, computed in A (sums in f64)
// and written once, rounded to T: the CPU twins' `Elem` rule, so bf16 results are bitwise the
// CPU's too. bn_prepare works on tables only and exists for f32 and f64.

// ---- per-channel reductions ------------------------------------------------------------------

// (mean; biased variance) of row c = blockIdx.x of x [C, m], each rounded to A, in every
// thread: two passes in f64, like the CPU twin (the second pass subtracts the f64 mean, not the
// mean rounded to T).
template <typename T, typename A = db_acc<T>> struct db_row_stats {
    A mean, var;
};
template <typename T, typename A = db_acc<T>>
__device__ __forceinline__ db_row_stats<T> bn_row_stats(const T *__restrict__ x, const u64 m) {
    __shared__ double buf[DB_REDUCE_THREADS];
    const T *row = x + (u64)blockIdx.x * m;
    constexpr unsigned U = db_batch<T>::value;
    const auto load = [row](const u64 i) { return row[i]; };
    double s = 0.0;
    db_thread_rows<U>(m, load, [&s](const T v) { s = db_add(s, (double)db_widen(v)); });
    const double mean = db_div(db_block_sum(s, buf), (double)m);
    double q = 0.0;
    db_thread_rows<U>(m, load, [&q, mean](const T v) {
        const double d = db_sub((double)db_widen(v), mean);
        q = db_add(q, db_mul(d, d));
    });
    const double var = db_div(db_block_sum(q, buf), (double)m);
    return {db_from_f64<A>(mean), db_from_f64<A>(var)};
}

// mv [2, C] = (mean; biased variance) of each row of x [C, m] (bn_row_stats).
template <typename T, typename A = db_acc<T>>
__device__ __forceinline__ void bn_stats(const T *__restrict__ x, A *__restrict__ mv,
                                         const u64 channels, const u64 m) {
    const u64 c = blockIdx.x;
    const db_row_stats<T> st = bn_row_stats<T>(x, m);
    if (threadIdx.x == 0) {
        mv[c] = st.mean;
        mv[channels + c] = st.var;
    }
}

// x * scale + shift of one feature, in A (two roundings, as on the CPU), rounded once to T:
// the value BN apply writes, and the one whose sign the ReLU masks test.
template <typename T, typename A = db_acc<T>>
__device__ __forceinline__ T db_affine(const T x, const A scale, const A shift) {
    return db_narrow<T>(db_add(db_mul(db_widen(x), scale), shift));
}

// The gradient BN's backward reads at element (x, g): g itself, or with RELU (the backward of
// a ReLU that followed BN apply, fused in) g where x * scale + shift > 0 and +0 elsewhere: the
// value relu_bwd_affine writes (same db_affine, same predicate), so the fused kernels compute
// bitwise what relu_bwd_affine[_inplace] followed by the plain kernel computes, one pass over
// [C, m] fewer and no [C, m] tensor between them.
template <bool RELU, typename T, typename A = db_acc<T>>
__device__ __forceinline__ T db_masked(const T g, const T x, const A scale, const A shift) {
    return (!RELU || db_is_positive(db_affine(x, scale, shift))) ? g : db_zero<T>();
}

// BN backward of row c: the sums S = sum(gy) and X = sum(gy * xhat) over the row, with
// xhat = (x - mean) * invstd evaluated in f64 as ((gy * (x - mean)) * invstd) like the CPU twin,
// each rounded to T; then, in T and in the CPU twin's order, the coefficients of
// dx = A * gy + B * x + C:
//   A = gamma * invstd
//   B = ((A * invstd) * X) * neg_inv_m + 0
//   C = (A * ((mean * invstd) * X - S)) * inv_m + 0
// (neg_inv_m = T(-1/m), inv_m = T(1/m): candle's scalar multiply and divide, `v * k + 0`).
// st [2, C] = (mean; invstd), gamma [C]; out [5, C] = (S = dbeta; X = dgamma; A; B; C); all
// of them, and the scalars, in the compute type (here "T" of the formulas above is A).
// With RELU, gy is the gradient of ReLU(BN(x)) (db_masked): st is BN's whole saved table
// [4, C] = (mean; invstd; scale; shift).
template <bool RELU, typename T, typename A = db_acc<T>>
__device__ __forceinline__ void bn_bwd_reduce(const T *__restrict__ gy, const T *__restrict__ x,
                                              const A *__restrict__ st,
                                              const A *__restrict__ gamma, A *__restrict__ out,
                                              const u64 channels, const u64 m, const A neg_inv_m,
                                              const A inv_m) {
    __shared__ double buf[DB_REDUCE_THREADS];
    const u64 c = blockIdx.x;
    const T *g = gy + c * m;
    const T *xr = x + c * m;
    const A mean_t = st[c], invstd_t = st[channels + c];
    const A scale = RELU ? st[2 * channels + c] : (A)0, shift = RELU ? st[3 * channels + c] : (A)0;
    const double mean = (double)mean_t;
    const double invstd = (double)invstd_t;
    double sg = 0.0, sgx = 0.0;
    struct pair {
        T g, x;
    };
    db_thread_rows<db_batch<T>::value>(
        m, [g, xr](const u64 i) { return pair{g[i], xr[i]}; },
        [&sg, &sgx, mean, invstd, scale, shift](const pair p) {
            const double gi = (double)db_widen(db_masked<RELU>(p.g, p.x, scale, shift));
            sg = db_add(sg, gi);
            sgx = db_add(sgx, db_mul(db_mul(gi, db_sub((double)db_widen(p.x), mean)), invstd));
        });
    sg = db_block_sum(sg, buf);
    sgx = db_block_sum(sgx, buf);
    if (threadIdx.x == 0) {
        const A sg_t = db_from_f64<A>(sg), sgx_t = db_from_f64<A>(sgx);
        const A a = db_mul(gamma[c], invstd_t);
        const A b = db_add(db_mul(db_mul(db_mul(a, invstd_t), sgx_t), neg_inv_m), (A)0);
        const A t = db_mul(db_mul(mean_t, invstd_t), sgx_t);
        const A cc = db_add(db_mul(db_mul(a, db_sub(t, sg_t)), inv_m), (A)0);
        out[c] = sg_t;
        out[channels + c] = sgx_t;
        out[2 * channels + c] = a;
        out[3 * channels + c] = b;
        out[4 * channels + c] = cc;
    }
}

// ---- the per-channel step of BN forward --------------------------------------------------------

// From mv [2, C] = (mean; biased var), gamma, beta and the running stats (each [C]):
//   table [4, C] = (mean; invstd; scale; shift), invstd = 1/sqrt(var + eps), scale = gamma*invstd,
//                  shift = beta - mean*scale;
//   running [2, C] = (r_mean*(1-mu) + 0 + (mean*mu + 0); r_var*(1-mu) + 0 + (var*mu*M/(M-1) + 0)),
// all in T, in the order of the candle ops they replace (a scalar multiply is candle's affine
// `v*k + 0`). keep = T(1-mu), mom = T(mu), mom_unbias = T(mu*M/(M-1)), eps = T(eps).
// Channel c of it, from its mean and var.
template <typename T>
__device__ __forceinline__ void bn_prepare_channel(const u64 c, const T mean, const T var,
                                                   const T *__restrict__ gamma,
                                                   const T *__restrict__ beta,
                                                   const T *__restrict__ rmean,
                                                   const T *__restrict__ rvar,
                                                   T *__restrict__ table, T *__restrict__ running,
                                                   const u64 channels, const T eps, const T keep,
                                                   const T mom, const T mom_unbias) {
    const T invstd = db_rcp(db_sqrt(db_add(var, eps)));
    const T scale = db_mul(gamma[c], invstd);
    const T shift = db_sub(beta[c], db_mul(mean, scale));
    table[c] = mean;
    table[channels + c] = invstd;
    table[2 * channels + c] = scale;
    table[3 * channels + c] = shift;
    running[c] = db_add(db_add(db_mul(rmean[c], keep), (T)0), db_add(db_mul(mean, mom), (T)0));
    running[channels + c] =
        db_add(db_add(db_mul(rvar[c], keep), (T)0), db_add(db_mul(var, mom_unbias), (T)0));
}

template <typename T>
__device__ __forceinline__ void bn_prepare(const T *__restrict__ mv, const T *__restrict__ gamma,
                                           const T *__restrict__ beta,
                                           const T *__restrict__ rmean,
                                           const T *__restrict__ rvar, T *__restrict__ table,
                                           T *__restrict__ running, const u64 channels,
                                           const T eps, const T keep, const T mom,
                                           const T mom_unbias) {
    for (u64 c = db_first(); c < channels; c += db_stride())
        bn_prepare_channel<T>(c, mv[c], mv[channels + c], gamma, beta, rmean, rvar, table,
                              running, channels, eps, keep, mom, mom_unbias);
}

// bn_stats and bn_prepare in one launch (issue 38: BN2's statistics and per-channel step, one
// launch a layer fewer): block c computes row c's statistics as bn_stats does, rounded to the
// table type A as bn_stats writes them, and its thread 0 channel c's step as bn_prepare does
// from them: bitwise the two kernels, without the [2, C] statistics between them. Reduction
// geometry (one block per channel); features T, tables and scalars A.
template <typename T, typename A = db_acc<T>>
__device__ __forceinline__ void bn_stats_prepare(const T *__restrict__ x,
                                                 const A *__restrict__ gamma,
                                                 const A *__restrict__ beta,
                                                 const A *__restrict__ rmean,
                                                 const A *__restrict__ rvar,
                                                 A *__restrict__ table, A *__restrict__ running,
                                                 const u64 channels, const u64 m, const A eps,
                                                 const A keep, const A mom, const A mom_unbias) {
    const db_row_stats<T> st = bn_row_stats<T>(x, m);
    if (threadIdx.x == 0)
        bn_prepare_channel<A>(blockIdx.x, st.mean, st.var, gamma, beta, rmean, rvar, table,
                              running, channels, eps, keep, mom, mom_unbias);
}

// ---- row-wise element-wise ops ---------------------------------------------------------------

// y = x * scale + shift per row (db_affine), coef [2, rows] = (scale; shift) in A. With RELU,
// y = y > 0 ? y : 0 (NaN -> 0) on the rounded value: bitwise the CPU's BN apply followed by
// its in-place ReLU, in one pass and one output. x's rows start ld_x apart (ld_x >= m: a column
// range of a wider map, the split front's chunks); y is a contiguous [rows, m].
template <typename T, bool RELU, typename A = db_acc<T>>
__device__ __forceinline__ void affine_rows(const T *__restrict__ x, const u64 ld_x,
                                            const A *__restrict__ coef, T *__restrict__ y,
                                            const u64 rows, const u64 m) {
    for (u64 r = blockIdx.y; r < rows; r += gridDim.y) {
        const A scale = coef[r], shift = coef[rows + r];
        const T *xr = x + r * ld_x;
        T *yr = y + r * m;
        for (u64 i = db_first(); i < m; i += db_stride()) {
            const T v = db_affine(xr[i], scale, shift);
            yr[i] = (!RELU || db_is_positive(v)) ? v : db_zero<T>();
        }
    }
}

// out [C, m] = (x * scale + shift > 0) ? g : 0 per row, coef [2, rows] = (scale; shift): the
// backward of affine_rows_relu's ReLU (and of a ReLU after affine_rows) masked from BN's input
// x rather than from the ReLU's output, so the output need not be kept for it. v is computed as
// affine_rows computes it (same roundings, same predicate), so the mask is the one relu_bwd
// reads from the output, bit for bit. out may be g itself (in place): each element is read and
// then written by one thread, so g and out are not __restrict__.
template <typename T, typename A = db_acc<T>>
__device__ __forceinline__ void relu_bwd_affine(const T *g, const T *__restrict__ x,
                                                const A *__restrict__ coef, T *out,
                                                const u64 rows, const u64 m) {
    for (u64 r = blockIdx.y; r < rows; r += gridDim.y) {
        const A scale = coef[r], shift = coef[rows + r];
        const T *gr = g + r * m;
        const T *xr = x + r * m;
        T *o = out + r * m;
        for (u64 i = db_first(); i < m; i += db_stride()) {
            const T v = db_affine(xr[i], scale, shift);
            o[i] = db_is_positive(v) ? gr[i] : db_zero<T>();
        }
    }
}

// A * gy + B * x + C per row as ((A*gy) + (B*x)) + C from the widened features, like the CPU
// twin (`dx_value`): for f32 and f64 features evaluated in f64 and rounded once to the compute
// type A; for bf16 features (the specialisation below) in f32, each operation rounded, as
// PyTorch autocast computes it (then rounded to bf16 when written).
template <typename T, typename A = db_acc<T>>
__device__ __forceinline__ A bn_dx_value(const A a, const A b, const A cc, const T g, const T x) {
    return db_from_f64<A>(db_add(db_add(db_mul((double)a, (double)db_widen(g)),
                                        db_mul((double)b, (double)db_widen(x))),
                                 (double)cc));
}
template <>
__device__ __forceinline__ float bn_dx_value<db_bf16, float>(const float a, const float b,
                                                             const float cc, const db_bf16 g,
                                                             const db_bf16 x) {
    return db_add(db_add(db_mul(a, db_widen(g)), db_mul(b, db_widen(x))), cc);
}

// dx [C, m] = A * gy + B * x + C (a fresh tensor); coef [3, rows] = (A; B; C) in A. With
// RELU, gy is db_masked (the gradient of ReLU(BN(x))) by aff [2, rows] = (scale; shift), rows
// 2..4 of BN's saved table (unread without).
template <bool RELU, typename T, typename A = db_acc<T>>
__device__ __forceinline__ void bn_bwd_dx(const T *__restrict__ gy, const T *__restrict__ x,
                                          const A *__restrict__ coef, const A *__restrict__ aff,
                                          T *__restrict__ dx, const u64 rows, const u64 m) {
    for (u64 r = blockIdx.y; r < rows; r += gridDim.y) {
        const A a = coef[r], b = coef[rows + r], cc = coef[2 * rows + r];
        const A scale = RELU ? aff[r] : (A)0, shift = RELU ? aff[rows + r] : (A)0;
        const T *g = gy + r * m;
        const T *xr = x + r * m;
        T *d = dx + r * m;
        for (u64 i = db_first(); i < m; i += db_stride()) {
            const T xi = xr[i];
            d[i] = db_narrow<T>(
                bn_dx_value<T>(a, b, cc, db_masked<RELU>(g[i], xi, scale, shift), xi));
        }
    }
}

// dst [C, m] += A(A * gy + B * x + C), **in place** (dst is a view of the gradient buffer):
// the same rounding as bn_bwd_dx followed by one addition in the compute type, rounded once to
// T, so for f32 and f64 the result is bitwise that of bn_bwd_dx then add_assign, without the
// [C, m] temporary; a bf16 dst is bf16(f32(dst) + f32(A * gy + B * x + C)), the CPU twin's.
// RELU as in bn_bwd_dx.
template <bool RELU, typename T, typename A = db_acc<T>>
__device__ __forceinline__ void bn_bwd_dx_accumulate(T *__restrict__ dst, const T *__restrict__ gy,
                                                     const T *__restrict__ x,
                                                     const A *__restrict__ coef,
                                                     const A *__restrict__ aff, const u64 rows,
                                                     const u64 m) {
    for (u64 r = blockIdx.y; r < rows; r += gridDim.y) {
        const A a = coef[r], b = coef[rows + r], cc = coef[2 * rows + r];
        const A scale = RELU ? aff[r] : (A)0, shift = RELU ? aff[rows + r] : (A)0;
        const T *g = gy + r * m;
        const T *xr = x + r * m;
        T *d = dst + r * m;
        for (u64 i = db_first(); i < m; i += db_stride()) {
            const T xi = xr[i];
            const A v = bn_dx_value<T>(a, b, cc, db_masked<RELU>(g[i], xi, scale, shift), xi);
            d[i] = db_narrow<T>(db_add(db_widen(d[i]), v));
        }
    }
}

// ---- extern "C" entry points, one per dtype ---------------------------------------------------
//
// DB_BN_KERNELS(T, S): the kernels of features T (tables in db_acc<T>), for f32, f64 and bf16.
// DB_BN_TABLE_KERNELS(T, S): bn_prepare, tables only, for f32 and f64 (bf16 features take the
// f32 one, their statistics being f32).

#define DB_BN_KERNELS(T, S)                                                                    \
    extern "C" __global__ void __launch_bounds__(DB_REDUCE_THREADS)                            \
        bn_stats_##S(const T *x, db_acc<T> *mv, const u64 channels, const u64 m) {             \
        bn_stats<T>(x, mv, channels, m);                                                       \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(DB_REDUCE_THREADS) bn_stats_prepare_##S(      \
        const T *x, const db_acc<T> *gamma, const db_acc<T> *beta, const db_acc<T> *rmean,     \
        const db_acc<T> *rvar, db_acc<T> *table, db_acc<T> *running, const u64 channels,       \
        const u64 m, const db_acc<T> eps, const db_acc<T> keep, const db_acc<T> mom,           \
        const db_acc<T> mom_unbias) {                                                          \
        bn_stats_prepare<T>(x, gamma, beta, rmean, rvar, table, running, channels, m, eps,     \
                            keep, mom, mom_unbias);                                            \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(DB_REDUCE_THREADS)                            \
        bn_bwd_reduce_##S(const T *gy, const T *x, const db_acc<T> *st,                        \
                          const db_acc<T> *gamma, db_acc<T> *out, const u64 channels,          \
                          const u64 m, const db_acc<T> neg_inv_m, const db_acc<T> inv_m) {     \
        bn_bwd_reduce<false, T>(gy, x, st, gamma, out, channels, m, neg_inv_m, inv_m);         \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(DB_REDUCE_THREADS)                            \
        bn_bwd_reduce_relu_##S(const T *gy, const T *x, const db_acc<T> *table,                \
                               const db_acc<T> *gamma, db_acc<T> *out, const u64 channels,     \
                               const u64 m, const db_acc<T> neg_inv_m,                         \
                               const db_acc<T> inv_m) {                                        \
        bn_bwd_reduce<true, T>(gy, x, table, gamma, out, channels, m, neg_inv_m, inv_m);       \
    }                                                                                          \
    extern "C" __global__ void affine_rows_##S(const T *x, const u64 ld_x,                      \
                                               const db_acc<T> *coef, T *y, const u64 rows,    \
                                               const u64 m) {                                  \
        affine_rows<T, false>(x, ld_x, coef, y, rows, m);                                      \
    }                                                                                          \
    extern "C" __global__ void affine_rows_relu_##S(const T *x, const u64 ld_x,                 \
                                                    const db_acc<T> *coef, T *y,               \
                                                    const u64 rows, const u64 m) {             \
        affine_rows<T, true>(x, ld_x, coef, y, rows, m);                                       \
    }                                                                                          \
    extern "C" __global__ void relu_bwd_affine_##S(const T *g, const T *x,                      \
                                                   const db_acc<T> *coef, T *out,              \
                                                   const u64 rows, const u64 m) {              \
        relu_bwd_affine<T>(g, x, coef, out, rows, m);                                          \
    }                                                                                          \
    extern "C" __global__ void relu_bwd_affine_inplace_##S(T *g, const T *x,                    \
                                                           const db_acc<T> *coef,              \
                                                           const u64 rows, const u64 m) {      \
        relu_bwd_affine<T>(g, x, coef, g, rows, m);                                            \
    }                                                                                          \
    extern "C" __global__ void bn_bwd_dx_##S(const T *gy, const T *x, const db_acc<T> *coef,    \
                                             T *dx, const u64 rows, const u64 m) {             \
        bn_bwd_dx<false, T>(gy, x, coef, (const db_acc<T> *)nullptr, dx, rows, m);          \
    }                                                                                          \
    extern "C" __global__ void bn_bwd_dx_relu_##S(const T *gy, const T *x,                      \
                                                  const db_acc<T> *coef,                       \
                                                  const db_acc<T> *aff, T *dx,                 \
                                                  const u64 rows, const u64 m) {               \
        bn_bwd_dx<true, T>(gy, x, coef, aff, dx, rows, m);                                     \
    }                                                                                          \
    extern "C" __global__ void bn_bwd_dx_accumulate_##S(T *dst, const T *gy, const T *x,        \
                                                        const db_acc<T> *coef, const u64 rows, \
                                                        const u64 m) {                         \
        bn_bwd_dx_accumulate<false, T>(dst, gy, x, coef, (const db_acc<T> *)nullptr, rows, m); \
    }                                                                                          \
    extern "C" __global__ void bn_bwd_dx_accumulate_relu_##S(                                  \
        T *dst, const T *gy, const T *x, const db_acc<T> *coef, const db_acc<T> *aff,          \
        const u64 rows, const u64 m) {                                                         \
        bn_bwd_dx_accumulate<true, T>(dst, gy, x, coef, aff, rows, m);                         \
    }

#define DB_BN_TABLE_KERNELS(T, S)                                                              \
    extern "C" __global__ void bn_prepare_##S(const T *mv, const T *gamma, const T *beta,       \
                                              const T *rmean, const T *rvar, T *table,         \
                                              T *running, const u64 channels, const T eps,     \
                                              const T keep, const T mom, const T mom_unbias) { \
        bn_prepare<T>(mv, gamma, beta, rmean, rvar, table, running, channels, eps, keep, mom,  \
                      mom_unbias);                                                             \
    }

DB_BN_KERNELS(float, f32)
DB_BN_KERNELS(double, f64)
DB_BN_KERNELS(db_bf16, bf16)
DB_BN_TABLE_KERNELS(float, f32)
DB_BN_TABLE_KERNELS(double, f64)
