// Element-wise in-place kernels (the CUDA twins of impls/src/kernels.rs): in-place ReLU, ReLU
// backward into a fresh tensor and in place, and in-place accumulation. Pointers are the first
// element of contiguous views (the Rust launcher, impls/src/ops/cuda/elementwise.rs, adds the layout's
// start offset), so a prefix of a buffer is written through its view.
//
// Launch geometry: 1-D, block = (256, 1, 1), grid = (ceil(n / 256) capped at 65535, 1, 1);
// grid-stride loops cover any n. One thread per element, no reductions: deterministic and
// bitwise equal to the CPU (selections, and one IEEE addition in db_acc<T> rounded once to T:
// f32, f64, or for bf16 features f32 then bf16, the CPU's `Elem` rule; see prelude.cuh).

template <typename T> __device__ __forceinline__ void relu_inplace(T *x, const u64 n) {
    for (u64 i = db_first(); i < n; i += db_stride())
        if (!db_is_positive(x[i])) x[i] = db_zero<T>();
}

template <typename T>
__device__ __forceinline__ void relu_bwd(T *__restrict__ dst, const T *__restrict__ g,
                                         const T *__restrict__ out, const u64 n) {
    for (u64 i = db_first(); i < n; i += db_stride()) dst[i] = db_is_positive(out[i]) ? g[i] : db_zero<T>();
}

template <typename T>
__device__ __forceinline__ void relu_bwd_inplace(T *__restrict__ g, const T *__restrict__ out,
                                                 const u64 n) {
    for (u64 i = db_first(); i < n; i += db_stride())
        if (!db_is_positive(out[i])) g[i] = db_zero<T>();
}

template <typename T>
__device__ __forceinline__ void add_assign(T *__restrict__ dst, const T *__restrict__ src,
                                           const u64 n) {
    for (u64 i = db_first(); i < n; i += db_stride())
        dst[i] = db_narrow<T>(db_add(db_widen(dst[i]), db_widen(src[i])));
}

#define DB_INPLACE_KERNELS(T, S)                                                               \
    extern "C" __global__ void relu_inplace_##S(T *x, const u64 n) { relu_inplace<T>(x, n); }   \
    extern "C" __global__ void relu_bwd_##S(T *dst, const T *g, const T *out, const u64 n) {    \
        relu_bwd<T>(dst, g, out, n);                                                           \
    }                                                                                          \
    extern "C" __global__ void relu_bwd_inplace_##S(T *g, const T *out, const u64 n) {          \
        relu_bwd_inplace<T>(g, out, n);                                                        \
    }                                                                                          \
    extern "C" __global__ void add_assign_##S(T *dst, const T *src, const u64 n) {              \
        add_assign<T>(dst, src, n);                                                            \
    }

DB_INPLACE_KERNELS(float, f32)
DB_INPLACE_KERNELS(double, f64)
DB_INPLACE_KERNELS(db_bf16, bf16)
