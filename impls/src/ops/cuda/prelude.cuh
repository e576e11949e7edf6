// densebench CUDA prelude: prepended by `impls/src/ops/cuda/src.rs` to every kernel module before
// NVRTC compiles it (NVRTC reads no files, so there is no #include of this header).
//
// Rounding: every arithmetic step of a kernel that has a CPU twin goes through the explicitly
// rounded intrinsics below (`__fmul_rn`, `__dadd_rn`, ...). NVRTC contracts `a * b + c` into one
// fused multiply-add by default (--fmad=true), which rounds once instead of twice; Rust never
// contracts. With the intrinsics an element-wise kernel rounds exactly like its CPU twin, so the
// CUDA and CPU results are bitwise equal, and reductions differ from the CPU only by summation
// order.
//
// Sizes and indices are `unsigned long long`: a [9C, M] tensor passes 2^31 elements at
// realistic sizes.

typedef unsigned long long u64;

// Threads per block of the per-channel reductions. The Rust launcher passes the same value as
// -DDB_REDUCE_THREADS (crate::cuda_src::REDUCE_THREADS); the default keeps this file compilable
// alone. Must be a power of two (the tree reduction halves it) and at most 1024.
#ifndef DB_REDUCE_THREADS
#define DB_REDUCE_THREADS 1024
#endif
static_assert((DB_REDUCE_THREADS & (DB_REDUCE_THREADS - 1)) == 0 && DB_REDUCE_THREADS >= 32 &&
                  DB_REDUCE_THREADS <= 1024,
              "DB_REDUCE_THREADS must be a power of two in [32, 1024]");

__device__ __forceinline__ float db_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float db_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double db_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double db_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double db_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double db_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float db_sub(float a, float b) { return __fsub_rn(a, b); }
// Correctly rounded square root and reciprocal (Rust's `sqrt` and `1.0 / x`).
__device__ __forceinline__ float db_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double db_sqrt(double a) { return __dsqrt_rn(a); }
__device__ __forceinline__ float db_rcp(float a) { return __frcp_rn(a); }
__device__ __forceinline__ double db_rcp(double a) { return __drcp_rn(a); }

// Conversion from the f64 accumulator to the tensor's type, round to nearest even (Rust `as`).
template <typename T> __device__ __forceinline__ T db_from_f64(double v);
template <> __device__ __forceinline__ float db_from_f64<float>(double v) {
    return __double2float_rn(v);
}
template <> __device__ __forceinline__ double db_from_f64<double>(double v) { return v; }

// ---- element types: how a feature is stored (T) and the float type it is computed in -----------
//
// f32 and f64 features are computed in themselves. bf16 features (PyTorch autocast's) are
// stored as bf16 and computed in f32, with per-channel tables, statistics and scalars in f32:
// a kernel reads a feature with db_widen (exact), computes in db_acc<T> with the rounded
// intrinsics, and writes a feature once with db_narrow (round to nearest, ties to even). This is
// `Elem` of impls/src/ops/cpu/shared.rs, so a bf16 kernel rounds exactly like its CPU twin; for
// f32 and f64 both conversions are the identity and the kernels are the ones they were.
//
// bf16 is a struct of its bits, not cuda_bf16.h's __nv_bfloat16: the same text compiles with
// NVRTC (no include paths) and in the host emulation, the conversions are the `half` crate's bit
// for bit (NaN quietened both ways), and a struct cannot slip into arithmetic unconverted (an
// `unsigned short` would, silently, as an integer). Same size and alignment as a bf16 element of
// a candle CUDA tensor (2 bytes).
struct db_bf16 {
    unsigned short bits;
};

template <typename T> struct db_acc_of {
    using type = T;
};
template <> struct db_acc_of<db_bf16> {
    using type = float;
};
// The float type features of type T are computed in, and per-channel tables stored in.
template <typename T> using db_acc = typename db_acc_of<T>::type;

__device__ __forceinline__ float db_widen(const float v) { return v; }
__device__ __forceinline__ double db_widen(const double v) { return v; }
// bf16 -> f32, exact: the bits in the high half (a NaN quietened, as `half::bf16::to_f32`).
__device__ __forceinline__ float db_widen(const db_bf16 v) {
    const unsigned b = v.bits;
    return __uint_as_float(((b & 0x7FFFu) > 0x7F80u ? b | 0x0040u : b) << 16);
}

template <typename T> __device__ __forceinline__ T db_narrow(db_acc<T> v);
template <> __device__ __forceinline__ float db_narrow<float>(const float v) { return v; }
template <> __device__ __forceinline__ double db_narrow<double>(const double v) { return v; }
// f32 -> bf16, round to nearest, ties to even (`half::bf16::from_f32`, bit for bit): add one
// to the kept half when the dropped half is above the midpoint, or at it with the kept half
// odd; a NaN keeps its high bits and is made quiet. Overflow rounds to infinity by the carry.
template <> __device__ __forceinline__ db_bf16 db_narrow<db_bf16>(const float v) {
    const unsigned x = __float_as_uint(v);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return db_bf16{(unsigned short)((x >> 16) | 0x0040u)};
    const unsigned round_bit = 0x8000u;
    const bool up = (x & round_bit) != 0 && (x & (3 * round_bit - 1)) != 0;
    return db_bf16{(unsigned short)((x >> 16) + (up ? 1u : 0u))};
}

// +0 as a feature.
template <typename T> __device__ __forceinline__ T db_zero() { return T{}; }

// `x > 0`, false for NaN: ReLU maps NaN to 0 and masks the gradient where the output is NaN,
// exactly like `kernels::is_positive` on the CPU (a bf16 compares as its f32 value).
template <typename T> __device__ __forceinline__ bool db_is_positive(T x) {
    return db_widen(x) > (db_acc<T>)0;
}

// First element and stride of a grid-stride loop over a 1-D grid of 1-D blocks.
__device__ __forceinline__ u64 db_first() { return blockIdx.x * (u64)blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 db_stride() { return (u64)blockDim.x * gridDim.x; }

// Loads in flight per thread in the reductions' loops: a 32-byte batch of each row they read
// (8 f32 or 4 f64 values). The plain strided loop (one load per iteration) leaves the batching
// to ptxas, which unrolled it 4x (sm_90 SASS of NVRTC 13.0): 256 threads x 4 f32 = 4 KiB of
// reads in flight per block, one block per channel, so a BN over fewer channels than the GPU
// has SMs (BN2's 4k rows: 48 on BC-100, 132 SMs on an H100) could stream at most a few hundred
// GB/s. 1024 threads x 8 f32 = 32 KiB per block.
template <typename T> struct db_batch {
    static constexpr unsigned value = 32 / sizeof(T) > 0 ? 32 / sizeof(T) : 1;
};

// Calls `use(load(i))` for i = t, t + R, t + 2R, ... < m (t = threadIdx.x, R =
// DB_REDUCE_THREADS), in this order, issuing the loads of U consecutive calls before the first
// of them is used. The order of the calls is exactly the plain loop's, so a sum accumulated in
// `use` is bitwise the plain loop's: only when the loads are issued changes. `load` is never
// called with i >= m.
template <unsigned U, typename Load, typename Use>
__device__ __forceinline__ void db_thread_rows(const u64 m, Load load, Use use) {
    using V = decltype(load(u64(0)));
    constexpr u64 R = DB_REDUCE_THREADS;
    for (u64 base = threadIdx.x; base < m; base += U * R) {
        V v[U];
#pragma unroll
        for (unsigned k = 0; k < U; ++k) {
            const u64 i = base + k * R;
            v[k] = i < m ? load(i) : V{};
        }
#pragma unroll
        for (unsigned k = 0; k < U; ++k)
            if (base + k * R < m) use(v[k]);
    }
}

// Sum of `v` over the DB_REDUCE_THREADS threads of a block, returned to thread 0 (the other
// threads get a partial sum). Fixed-shape tree: in round s = T/2, T/4, ..., 1 thread t < s adds
// the value of thread t + s. The order of the additions depends only on DB_REDUCE_THREADS, never
// on timing, so the result is the same bit for bit on every run. `buf` is a shared array of
// DB_REDUCE_THREADS doubles; the function starts and ends with a barrier, so one buffer can be
// reused by consecutive calls. Every thread of the block must call it (it synchronises).
__device__ __forceinline__ double db_block_sum(double v, double *buf) {
    const unsigned t = threadIdx.x;
    __syncthreads();
    buf[t] = v;
    __syncthreads();
    for (unsigned s = DB_REDUCE_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] = db_add(buf[t], buf[t + s]);
        __syncthreads();
    }
    const double r = buf[0];
    __syncthreads();
    return r;
}
