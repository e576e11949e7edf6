// The shifted views of the 3x3 convolution on channel-major maps `[C, M]`, M = N*H*W (image n,
// row y, column x at n*H*W + y*W + x), the CUDA twins of ShiftStackOp and ShiftSumOp in
// impls/src/fused.rs. H and W are separate parameters (non-square maps work).
//
// A tap is an offset (oy, ox): shift(t)[c, n, y, x] = t[c, n, y + oy, x + ox], zero where
// (y + oy, x + ox) lies outside the H x W image. The nine taps come as one `db_taps` struct by
// value (72 bytes of kernel parameters), in the order the Rust side lists them.
//
// Launch geometry (impls/src/fused_cuda.rs): block = (256, 1, 1), grid = (ceil(M / 256) capped,
// min(rows, 65535), 1); blockIdx.y walks the output rows (grid-stride), blockIdx.x/threadIdx.x
// the columns (grid-stride), one thread per output element. Each output element is written by
// exactly one thread, reads are plain loads: no atomics, deterministic. shift_stack copies
// values (bitwise equal to the CPU); shift_sum adds the in-bounds taps in the order j = 0..8
// starting from +0, the CPU twin's order and rounding, so it is bitwise equal too.
//
// Both kernels read and write row-strided views: row r of the input starts at in + r * ld_in,
// row r of the output at out + r * ld_out (ld >= m; the views of a column range of a wider map,
// which the 3x3 convolution takes a range of whole images at a time). Each writes every element
// of its output view and nothing else: [9C, m] for the stack, [C, m] for the sum.

struct db_taps {
    int oy[9];
    int ox[9];
};

// Position of column i (image n, row y, column x) of a row: the image's first column and
// (y, x). Computed once per output element, so the nine taps cost no further division.
struct db_pixel {
    u64 image;  // n * H * W
    long long y, x;
};

__device__ __forceinline__ db_pixel db_locate(const u64 i, const u64 h, const u64 w) {
    const u64 p = i % (h * w);
    db_pixel px;
    px.image = i - p;
    px.y = (long long)(p / w);
    px.x = (long long)(p % w);
    return px;
}

// Column of the source pixel of `px` for tap (oy, ox) inside its row, or -1 when the source
// pixel (y + oy, x + ox) is outside the H x W image.
__device__ __forceinline__ long long db_tap_src(const db_pixel px, const u64 h, const u64 w,
                                                const int oy, const int ox) {
    const long long y = px.y + oy, x = px.x + ox;
    if (y < 0 || y >= (long long)h || x < 0 || x >= (long long)w) return -1;
    return (long long)px.image + y * (long long)w + x;
}

// out [9C, m]: row j*C + c is row c of t [C, m] shifted by tap j.
template <typename T>
__device__ __forceinline__ void shift_stack(const T *__restrict__ t, const u64 ld_t,
                                            T *__restrict__ out, const u64 ld_out, const u64 c,
                                            const u64 m, const u64 h, const u64 w,
                                            const db_taps taps) {
    const u64 rows = 9 * c;
    for (u64 r = blockIdx.y; r < rows; r += gridDim.y) {
        const unsigned j = (unsigned)(r / c);
        const int oy = taps.oy[j], ox = taps.ox[j];
        const T *src = t + (r % c) * ld_t;
        T *dst = out + r * ld_out;
        for (u64 i = db_first(); i < m; i += db_stride()) {
            const long long s = db_tap_src(db_locate(i, h, w), h, w, oy, ox);
            dst[i] = s < 0 ? (T)0 : src[s];
        }
    }
}

// out [C, m]: row c = sum over j = 0..8 of row j*C + c of p [9C, m] shifted by tap j, added in
// the order j = 0..8 to +0 (the CPU's order: bitwise the same sums).
template <typename T>
__device__ __forceinline__ void shift_sum(const T *__restrict__ p, const u64 ld_p,
                                          T *__restrict__ out, const u64 ld_out, const u64 c,
                                          const u64 m, const u64 h, const u64 w,
                                          const db_taps taps) {
    for (u64 r = blockIdx.y; r < c; r += gridDim.y) {
        T *dst = out + r * ld_out;
        for (u64 i = db_first(); i < m; i += db_stride()) {
            const db_pixel px = db_locate(i, h, w);
            T acc = (T)0;
#pragma unroll
            for (unsigned j = 0; j < 9; ++j) {
                const long long s = db_tap_src(px, h, w, taps.oy[j], taps.ox[j]);
                if (s >= 0) acc = db_add(acc, p[(j * c + r) * ld_p + s]);
            }
            dst[i] = acc;
        }
    }
}

#define DB_SHIFT_KERNELS(T, S)                                                               \
    extern "C" __global__ void shift_stack_##S(const T *t, const u64 ld_t, T *out,            \
                                               const u64 ld_out, const u64 c, const u64 m,    \
                                               const u64 h, const u64 w, const db_taps taps) { \
        shift_stack<T>(t, ld_t, out, ld_out, c, m, h, w, taps);                              \
    }                                                                                        \
    extern "C" __global__ void shift_sum_##S(const T *p, const u64 ld_p, T *out,              \
                                             const u64 ld_out, const u64 c, const u64 m,      \
                                             const u64 h, const u64 w, const db_taps taps) {   \
        shift_sum<T>(p, ld_p, out, ld_out, c, m, h, w, taps);                                \
    }

DB_SHIFT_KERNELS(float, f32)
DB_SHIFT_KERNELS(double, f64)
