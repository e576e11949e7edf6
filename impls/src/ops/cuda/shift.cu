// The shifted views of the 3x3 convolution on channel-major maps `[C, M]`, M = N*H*W (image n,
// row y, column x at n*H*W + y*W + x), the CUDA twins of ShiftStackOp and ShiftSumOp in
// impls/src/fused.rs. H and W are separate parameters (non-square maps work).
//
// A tap is an offset (oy, ox): shift(t)[c, n, y, x] = t[c, n, y + oy, x + ox], zero where
// (y + oy, x + ox) lies outside the H x W image. The nine taps come as one `db_taps` struct by
// value (72 bytes of kernel parameters), in the order the Rust side lists them.
//
// Launch geometry (impls/src/ops/cuda/shift.rs): block = (256, 1, 1), grid = (ceil(M / 256) capped,
// min(C, 65535), 1); blockIdx.y walks the C channel rows of the map (grid-stride: the source
// rows of the stack, the output rows of the sum), blockIdx.x/threadIdx.x the columns
// (grid-stride). A thread locates its column's pixel once and handles all nine taps of it: the
// stack writes the nine output rows j*C + c of that column, the sum reads the nine input rows.
// Each output element is written by exactly one thread, reads are plain loads: no atomics,
// deterministic. shift_stack copies values (bitwise equal to the CPU); shift_sum adds the
// in-bounds taps in the order j = 0..8 starting from +0, the CPU twin's order and rounding, so
// it is bitwise equal too.
//
// Both kernels read and write row-strided views: row r of the input starts at in + r * ld_in,
// row r of the output at out + r * ld_out (ld >= m; the views of a column range of a wider map,
// which the 3x3 convolution takes a range of whole images at a time). Each writes every element
// of its output view and nothing else: [9C, m] for the stack, [C, m] for the sum.
//
// Locating a column (image, y, x) takes a division by H*W and one by W. 64-bit division is a
// software routine on the GPU (a call of some hundred instructions; ptxas adds a 32-bit path
// when the operands fit, still two dozen instructions each), more than the load and store it
// serves. Below 2^31 columns (every realistic map) the kernels divide by multiplying with a
// magic number instead (db_divider: one high multiply, an add and a shift); beyond, they keep
// the plain 64-bit division. Both give the exact quotient, so the result is the same.

struct db_taps {
    int oy[9];
    int ox[9];
};

// Exact division of any n < 2^31 by a fixed d, 1 <= d < 2^31, without a divide instruction
// (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994; the
// form of PyTorch's IntDivider): with s the least power such that 2^s >= d and
// magic = floor(2^32 * (2^s - d) / d) + 1 (< 2^32), q = (umulhi(n, magic) + n) >> s. The sum
// stays below 2^32 because umulhi(n, magic) < n < 2^31.
struct db_divider {
    unsigned d, magic, s;
};

__device__ __forceinline__ db_divider db_make_divider(const unsigned d) {
    if (d == 0) return db_divider{0, 0, 0};  // only for a map of no columns: nothing to divide
    unsigned s = 0;
    while ((1ull << s) < d) ++s;
    const u64 magic = ((1ull << 32) * ((1ull << s) - d)) / d + 1;
    return db_divider{d, (unsigned)magic, s};
}

__device__ __forceinline__ unsigned db_quotient(const unsigned n, const db_divider v) {
    return (__umulhi(n, v.magic) + n) >> v.s;
}

// A locator finds column i's pixel (`operator()`: the image's first column and (y, x), once
// per column) and the column of its source for tap (oy, ox) inside the same row (`src`: -1
// when (y + oy, x + ox) lies outside the H x W image).

// Maps of fewer than 2^31 columns (i, H*W and W below 2^31): 32-bit arithmetic and magic
// division. The tap arithmetic is unsigned: y + oy wraps to 2^31 or more exactly when it is
// negative or at least H (y < H < 2^31, |oy| <= 2^31), so one comparison tests both ends.
struct db_locate_narrow {
    struct pixel {
        unsigned image, y, x;
    };
    db_divider hw, w;
    unsigned h;
    __device__ __forceinline__ db_locate_narrow(const u64 h_, const u64 w_)
        : hw(db_make_divider((unsigned)(h_ * w_))), w(db_make_divider((unsigned)w_)),
          h((unsigned)h_) {}
    __device__ __forceinline__ pixel operator()(const u64 i) const {
        const unsigned n = (unsigned)i;
        const unsigned image = db_quotient(n, hw) * hw.d;
        const unsigned p = n - image;
        const unsigned y = db_quotient(p, w);
        return pixel{image, y, p - y * w.d};
    }
    __device__ __forceinline__ int src(const pixel px, const int oy, const int ox) const {
        const unsigned y = px.y + (unsigned)oy, x = px.x + (unsigned)ox;
        return y < h && x < w.d ? (int)(px.image + y * w.d + x) : -1;
    }
};

// Any map: 64-bit division (maps of 2^31 columns or more).
struct db_locate_wide {
    struct pixel {
        u64 image;  // n * H * W
        long long y, x;
    };
    u64 hw, h, w;
    __device__ __forceinline__ db_locate_wide(const u64 h_, const u64 w_)
        : hw(h_ * w_), h(h_), w(w_) {}
    __device__ __forceinline__ pixel operator()(const u64 i) const {
        const u64 p = i % hw;
        return pixel{i - p, (long long)(p / w), (long long)(p % w)};
    }
    __device__ __forceinline__ long long src(const pixel px, const int oy, const int ox) const {
        const long long y = px.y + oy, x = px.x + ox;
        if (y < 0 || y >= (long long)h || x < 0 || x >= (long long)w) return -1;
        return (long long)px.image + y * (long long)w + x;
    }
};

// Maps of fewer columns than this take the narrow locator. It is exact below 2^31 (i, H*W and
// W all below 2^31); the host emulation (impls/tests/cuda_emulated.rs) sets it to 0 to run the
// wide locator on small maps.
#ifndef DB_NARROW_COLUMNS
#define DB_NARROW_COLUMNS (1ull << 31)
#endif
static_assert(DB_NARROW_COLUMNS <= (1ull << 31), "the narrow locator is exact below 2^31 only");

__device__ __forceinline__ bool db_narrow(const u64 m) { return m < DB_NARROW_COLUMNS; }

// out [9C, m]: row j*C + c is row c of t [C, m] shifted by tap j. The nine loads of a column
// are issued before its nine stores.
template <typename T, typename Locate>
__device__ __forceinline__ void shift_stack(const T *__restrict__ t, const u64 ld_t,
                                            T *__restrict__ out, const u64 ld_out, const u64 c,
                                            const u64 m, const db_taps taps,
                                            const Locate locate) {
    const u64 tap_step = c * ld_out;  // from row j*C + r of the output to row (j+1)*C + r
    for (u64 r = blockIdx.y; r < c; r += gridDim.y) {
        const T *src = t + r * ld_t;
        T *dst = out + r * ld_out;
        for (u64 i = db_first(); i < m; i += db_stride()) {
            const auto px = locate(i);
            T v[9];
#pragma unroll
            for (unsigned j = 0; j < 9; ++j) {
                const auto s = locate.src(px, taps.oy[j], taps.ox[j]);
                v[j] = s < 0 ? db_zero<T>() : src[s];
            }
#pragma unroll
            for (unsigned j = 0; j < 9; ++j) dst[j * tap_step + i] = v[j];
        }
    }
}

// out [C, m]: row c = sum over j = 0..8 of row j*C + c of p [9C, m] shifted by tap j, added in
// the order j = 0..8 to +0 in db_acc<T> and rounded once to T (the CPU's order and rounding:
// bitwise the same sums; for bf16 an f32 sum rounded to bf16, prelude.cuh). The tap products
// are of type S: T itself, or (shift_sum_wide_bf16) f32 products of a bf16 convolution summed
// into bf16 features, as autocast's convolution accumulates in f32 and rounds its output once.
template <typename S, typename T, typename Locate>
__device__ __forceinline__ void shift_sum(const S *__restrict__ p, const u64 ld_p,
                                          T *__restrict__ out, const u64 ld_out, const u64 c,
                                          const u64 m, const db_taps taps, const Locate locate) {
    const u64 tap_step = c * ld_p;  // from row j*C + r of the input to row (j+1)*C + r
    for (u64 r = blockIdx.y; r < c; r += gridDim.y) {
        const S *src = p + r * ld_p;
        T *dst = out + r * ld_out;
        for (u64 i = db_first(); i < m; i += db_stride()) {
            const auto px = locate(i);
            // The nine loads first, then the additions in order, skipping taps from outside.
            S v[9];
            bool in[9];
#pragma unroll
            for (unsigned j = 0; j < 9; ++j) {
                const auto s = locate.src(px, taps.oy[j], taps.ox[j]);
                in[j] = s >= 0;
                v[j] = in[j] ? src[j * tap_step + s] : db_zero<S>();
            }
            db_acc<T> acc = 0;
#pragma unroll
            for (unsigned j = 0; j < 9; ++j)
                if (in[j]) acc = db_add(acc, db_widen(v[j]));
            dst[i] = db_narrow<T>(acc);
        }
    }
}

#define DB_SHIFT_KERNELS(T, S)                                                               \
    extern "C" __global__ void shift_stack_##S(const T *t, const u64 ld_t, T *out,            \
                                               const u64 ld_out, const u64 c, const u64 m,    \
                                               const u64 h, const u64 w, const db_taps taps) { \
        if (db_narrow(m))                                                                    \
            shift_stack<T>(t, ld_t, out, ld_out, c, m, taps, db_locate_narrow(h, w));  \
        else                                                                                 \
            shift_stack<T>(t, ld_t, out, ld_out, c, m, taps, db_locate_wide(h, w));    \
    }                                                                                        \
    extern "C" __global__ void shift_sum_##S(const T *p, const u64 ld_p, T *out,              \
                                             const u64 ld_out, const u64 c, const u64 m,      \
                                             const u64 h, const u64 w, const db_taps taps) {   \
        if (db_narrow(m))                                                                    \
            shift_sum<T, T>(p, ld_p, out, ld_out, c, m, taps, db_locate_narrow(h, w)); \
        else                                                                                 \
            shift_sum<T, T>(p, ld_p, out, ld_out, c, m, taps, db_locate_wide(h, w));   \
    }

DB_SHIFT_KERNELS(float, f32)
DB_SHIFT_KERNELS(double, f64)
DB_SHIFT_KERNELS(db_bf16, bf16)

// The bf16 convolution's sum: f32 tap products p [9C, m] into bf16 features out [C, m], each
// output the f32 sum of its taps rounded once (bitwise shift_sum_f32 followed by a rounding).
extern "C" __global__ void shift_sum_wide_bf16(const float *p, const u64 ld_p, db_bf16 *out,
                                               const u64 ld_out, const u64 c, const u64 m,
                                               const u64 h, const u64 w, const db_taps taps) {
    if (db_narrow(m))
        shift_sum<float, db_bf16>(p, ld_p, out, ld_out, c, m, taps, db_locate_narrow(h, w));
    else
        shift_sum<float, db_bf16>(p, ld_p, out, ld_out, c, m, taps, db_locate_wide(h, w));
}
