// The bc layer's 3x3 convolution (padding 1, stride 1, no bias) computed directly on the
// channel-major maps `[C, M]`, M = N*H*W (image n, row y, column x at n*H*W + y*W + x): no tap
// stack, no stacked weight (issue 38 item 1, "kernels of your own"; DENSEBENCH_CONV=direct).
// The CPU's twin is impls/src/ops/conv3x3 (the same sums, in another order); the Rust launcher
// is impls/src/ops/cuda/conv.rs, its geometry impls/src/ops/cuda/direct.rs.
//
// Two sets of kernels. conv3x3 / conv3x3_wgrad (below first): fused multiply-adds
// (__fmaf_rn / __fma_rn, one rounding each) in db_acc<T> (f32 for f32 and bf16 features, f64
// for f64), each output accumulated by one thread in a fixed order from +0, features written
// once with db_narrow (bf16: the f32 sum rounded once, as autocast's convolution): IEEE
// arithmetic, the `ieee` math mode's and DENSEBENCH_CONV=direct-fma's. conv3x3_mma /
// conv3x3_wgrad_mma (further down): the same passes on tensor cores (mma.sync, sm_80+) for
// bf16 features and for f32 ones in TF32, f32 accumulation. No atomics in either: every
// output has one writer and the order of every sum is fixed by the geometry (inside one mma,
// by the tensor core), so two runs are bitwise equal and the host emulation
// (tests/cuda_emulated.rs) restates each sum exactly.
//
// conv3x3 (forward, and the data gradient as a forward convolution with the weight read
// transposed and flipped, db_conv_weight): out[o, p] = sum over c = 0..cin-1, dy = 0..2,
// dx = 0..2 (in that order, c outermost) of w(o, c, 3*dy + dx) * in[c, p + (dy - 1, dx - 1)],
// a tap outside the image reading 0. A block computes a tile of DB_CONV_TILE_H x DB_CONV_TILE_W
// pixels of one image for 4*blockDim.y output channels: threadIdx.x (64 of them) is a row of
// the tile and a run of 4 columns, threadIdx.y a group of 4 output channels; each thread holds
// its 4 x 4 outputs in registers. Input channels go through shared memory DB_CONV_CHUNK at a
// time: the tile with a one-pixel halo (zero outside the image) and the chunk's weights.
// Grid: x the tiles of all images, y the groups of 4*blockDim.y output channels (grid-stride
// both ways).
//
// conv3x3_wgrad: dW[o, c, 3*dy + dx] = sum over p of gy[o, p] * in[c, p + (dy - 1, dx - 1)].
// The pixels are cut into units (DB_WGRAD_ROWS rows of one image, fewer in its last band, and
// DB_WGRAD_SEG columns of them; units numbered image by image, band by band, segment by
// segment) and the units into slices of `per_slice` consecutive units; a block sums one slice
// for blockDim.x input channels x blockDim.y output channels, one (c, o) pair per thread, the
// units in order, a unit's rows in order and a row's columns in order, into the slice's
// partial part[slice][o][c][tap] (db_acc<T>). Several rows a unit: the staging of a unit (its
// global loads, two barriers) is paid once per 128 pixels, not 32. conv3x3_wgrad_sum adds the
// slices' partials in slice order from +0 into dW [k, B, 3, 3]. Grid of the partials: x the
// slices, y the groups of input channels, z those of output channels.

// (the launcher's constants: impls/src/ops/cuda/direct.rs, checked against these lines)
#define DB_CONV_TILE_H 8
#define DB_CONV_TILE_W 32
#define DB_CONV_QUADS (DB_CONV_TILE_W / 4)
// threadIdx.x of conv3x3: one per row and run of 4 columns of a tile
#define DB_CONV_PIXEL_THREADS (DB_CONV_TILE_H * DB_CONV_QUADS)
// most blockDim.y of conv3x3 (groups of 4 output channels)
#define DB_CONV_OUT_GROUPS 4
#define DB_CONV_CHUNK 8
#define DB_WGRAD_SEG 32
#define DB_WGRAD_ROWS 4
// most blockDim.x / blockDim.y of conv3x3_wgrad
#define DB_WGRAD_C 8
#define DB_WGRAD_O 16

__device__ __forceinline__ float db_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double db_fma(double a, double b, double c) { return __fma_rn(a, b, c); }

// Vector loads from shared memory (one LDS.128 / LDS.64 instead of four or two): `p` aligned
// to the vector (the arrays are __align__(16), their rows and the offsets read multiples of it).
__device__ __forceinline__ void db_load4(const float *p, float v[4]) {
    const float4 t = *reinterpret_cast<const float4 *>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
}
__device__ __forceinline__ void db_load4(const double *p, double v[4]) {
    const double2 a = *reinterpret_cast<const double2 *>(p);
    const double2 b = *reinterpret_cast<const double2 *>(p + 2);
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}
__device__ __forceinline__ void db_load2(const float *p, float v[2]) {
    const float2 t = *reinterpret_cast<const float2 *>(p);
    v[0] = t.x, v[1] = t.y;
}
__device__ __forceinline__ void db_load2(const double *p, double v[2]) {
    const double2 t = *reinterpret_cast<const double2 *>(p);
    v[0] = t.x, v[1] = t.y;
}

// Where weight element (o, c, tap) of a convolution lies: w[first + o*out + c*in + tap*step].
// Forward on a PyTorch weight [k, B, 3, 3]: (B*9, 9, 1, 0). The data gradient, a convolution
// of the k gradient rows into B outputs with the weight transposed and flipped:
// (9, B*9, -1, 8).
struct db_conv_weight {
    long long out, in, step, first;
};

template <typename T>
__device__ __forceinline__ void conv3x3(const T *__restrict__ x, const u64 cin,
                                        T *__restrict__ y, const u64 cout,
                                        const T *__restrict__ w, const db_conv_weight wl,
                                        const u64 n, const u64 h, const u64 wd) {
    using A = db_acc<T>;
    // rows of the haloed tile padded from TILE_W + 2 to TILE_W + 4 values, so that every row
    // starts 16-byte aligned and a thread's 6 values load as one 4-vector and one 2-vector
    constexpr unsigned PITCH = DB_CONV_TILE_W + 4;
    __shared__ __align__(16) A xs[DB_CONV_CHUNK][DB_CONV_TILE_H + 2][PITCH];
    __shared__ __align__(16) A ws[DB_CONV_CHUNK][9][4 * DB_CONV_OUT_GROUPS];
    const u64 tiles_x = (wd + DB_CONV_TILE_W - 1) / DB_CONV_TILE_W;
    const u64 tiles_y = (h + DB_CONV_TILE_H - 1) / DB_CONV_TILE_H;
    const u64 per_image = tiles_x * tiles_y, tiles = n * per_image;
    const u64 plane = h * wd, m = n * plane;
    const unsigned kb = 4 * blockDim.y;  // output channels of a block
    const u64 groups = (cout + kb - 1) / kb;
    const unsigned tid = threadIdx.y * blockDim.x + threadIdx.x;
    const unsigned nthreads = blockDim.x * blockDim.y;
    const unsigned ty = threadIdx.x / DB_CONV_QUADS, qx = threadIdx.x % DB_CONV_QUADS;
    constexpr unsigned HALO_W = DB_CONV_TILE_W + 2, HALO = (DB_CONV_TILE_H + 2) * HALO_W;
    static_assert(HALO_W <= PITCH, "a haloed row fits its padded row");
    for (u64 g = blockIdx.y; g < groups; g += gridDim.y) {
        for (u64 t = blockIdx.x; t < tiles; t += gridDim.x) {
            const u64 img = t / per_image, r = t % per_image;
            const long long y0 = (long long)((r / tiles_x) * DB_CONV_TILE_H);
            const long long x0 = (long long)((r % tiles_x) * DB_CONV_TILE_W);
            const T *xi = x + img * plane;
            A acc[4][4];
#pragma unroll
            for (unsigned o = 0; o < 4; ++o)
#pragma unroll
                for (unsigned q = 0; q < 4; ++q) acc[o][q] = 0;
            for (u64 c0 = 0; c0 < cin; c0 += DB_CONV_CHUNK) {
                const unsigned nc = (unsigned)(cin - c0 < DB_CONV_CHUNK ? cin - c0 : DB_CONV_CHUNK);
                __syncthreads();  // every thread is done with the previous chunk
                for (unsigned e = tid; e < nc * HALO; e += nthreads) {
                    const unsigned cc = e / HALO, rem = e % HALO;
                    const long long yy = y0 + (long long)(rem / HALO_W) - 1;
                    const long long xx = x0 + (long long)(rem % HALO_W) - 1;
                    A v = 0;
                    if (yy >= 0 && yy < (long long)h && xx >= 0 && xx < (long long)wd)
                        v = db_widen(xi[(c0 + cc) * m + (u64)yy * wd + (u64)xx]);
                    xs[cc][rem / HALO_W][rem % HALO_W] = v;
                }
                for (unsigned e = tid; e < nc * 9 * kb; e += nthreads) {
                    const unsigned cc = e / (9 * kb), rem = e % (9 * kb);
                    const unsigned j = rem / kb, ol = rem % kb;
                    const u64 o = g * kb + ol;
                    A v = 0;
                    if (o < cout)
                        v = db_widen(w[wl.first + (long long)o * wl.out +
                                       (long long)(c0 + cc) * wl.in + (long long)j * wl.step]);
                    ws[cc][j][ol] = v;
                }
                __syncthreads();
                for (unsigned cc = 0; cc < nc; ++cc) {
#pragma unroll
                    for (unsigned dy = 0; dy < 3; ++dy) {
                        A v[6];
                        db_load4(&xs[cc][ty + dy][4 * qx], v);
                        db_load2(&xs[cc][ty + dy][4 * qx + 4], v + 4);
#pragma unroll
                        for (unsigned dx = 0; dx < 3; ++dx) {
                            A wv[4];
                            db_load4(&ws[cc][3 * dy + dx][4 * threadIdx.y], wv);
#pragma unroll
                            for (unsigned o = 0; o < 4; ++o)
#pragma unroll
                                for (unsigned q = 0; q < 4; ++q)
                                    acc[o][q] = db_fma(wv[o], v[q + dx], acc[o][q]);
                        }
                    }
                }
            }
            const long long yy = y0 + ty;
            if (yy < (long long)h) {
#pragma unroll
                for (unsigned o = 0; o < 4; ++o) {
                    const u64 oc = g * kb + 4 * threadIdx.y + o;
                    if (oc >= cout) continue;
#pragma unroll
                    for (unsigned q = 0; q < 4; ++q) {
                        const long long xx = x0 + 4 * qx + q;
                        if (xx < (long long)wd)
                            y[oc * m + img * plane + (u64)yy * wd + (u64)xx] =
                                db_narrow<T>(acc[o][q]);
                    }
                }
            }
        }
    }
}

// ---- the same convolution on tensor cores (f32 features in TF32, bf16 features) -------------
//
// conv3x3_mma: out[o, p] as conv3x3 computes it, with the products on tensor cores
// (mma.sync, sm_80 and later; the launcher takes it there only): f32 features under the
// `tf32` math mode (m16n8k8, operands rounded to TF32 to nearest, ties away, as cvt.rna; the
// f32 product of two TF32 values is exact), bf16 features always (m16n8k16, exact products:
// autocast's convolution), accumulated in f32 by the tensor core. The convolution is an
// implicit GEMM per tap: rows = 16 pixels of a tile row, columns = 8 output channels, the
// reduction = the input channels of a chunk. A "slot" is one 32-bit operand register: one
// TF32 channel, or a pair of bf16 channels (the lower channel in the low half), so a chunk of
// DB_MMA_SLOTS slots is 8 channels (f32) or 16 (bf16), one mma per tap. Order: for each chunk,
// for tap 3*dy + dx in order, acc = mma(acc, the chunk's channels at that tap); inside an mma
// the tensor core's own order (the host emulation restates it as fused multiply-adds over the
// chunk's channels in order; the GPU test bounds it against the CPU).
//
// A block: DB_MMA_WARPS warps on a DB_CONV_TILE_H x DB_CONV_TILE_W tile of one image for
// DB_MMA_OUT output channels; warp w owns tile rows 2w and 2w + 1, each two 16-pixel halves
// (4 row tiles), and all the block's column tiles of 8 channels that exist (a uniform count per
// block, no divergence). Shared memory: the haloed chunk as 32-bit slots (rows padded to 36:
// the 32 lanes of a fragment load hit 32 banks) and the chunk's weights [tap][slot][out]
// (padded to DB_MMA_WPITCH outputs: again 32 banks). Channels past cin, outputs past cout and
// pixels outside the image are zero slots, so a partial chunk adds only zeros.
//
// Fragments (PTX ISA, mma.m16n8k8 .tf32 and mma.m16n8k16 .bf16; g = lane / 4, t = lane % 4):
// A (16 x 8 slots) a0 = (row g, slot t), a1 = (g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4);
// B (8 slots x 8) b0 = (slot t, col g), b1 = (t + 4, g); C (16 x 8) c0, c1 = (row g, cols 2t,
// 2t + 1), c2, c3 = (row g + 8, cols 2t, 2t + 1).

// (the launcher's constants: impls/src/ops/cuda/direct.rs, checked against these lines)
#define DB_MMA_WARPS 4
#define DB_MMA_OUT 32
#define DB_MMA_SLOTS 8
#define DB_MMA_WPITCH 40

#if defined(__CUDA_ARCH__)
// f32 -> TF32, to nearest, ties away from zero (the low 13 bits zero).
__device__ __forceinline__ unsigned db_tf32(const float v) {
#if __CUDA_ARCH__ >= 800
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
#else
    return __float_as_uint(v);
#endif
}
// d += A x B on one warp's fragments (every lane of the warp calls it with its own): NAME for
// the mma.sync of SHAPE_TYPES ("m16n8k8.row.col.f32.tf32.tf32.f32", ...).
#if __CUDA_ARCH__ >= 800
#define DB_MMA_SYNC(NAME, SHAPE_TYPES)                                                           \
    __device__ __forceinline__ void NAME(float d[4], const unsigned a[4], const unsigned b[2]) {  \
        asm("mma.sync.aligned." SHAPE_TYPES " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "          \
            "{%0,%1,%2,%3};"                                                                     \
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                     \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));                 \
    }
#else
#define DB_MMA_SYNC(NAME, SHAPE_TYPES)                                                           \
    __device__ __forceinline__ void NAME(float *, const unsigned *, const unsigned *) {          \
        __trap();                                                                                \
    }
#endif
DB_MMA_SYNC(db_mma_tf32, "m16n8k8.row.col.f32.tf32.tf32.f32")
DB_MMA_SYNC(db_mma_bf16, "m16n8k16.row.col.f32.bf16.bf16.f32")
#endif

// Channels per slot and the tensor-core step of features T.
template <typename T> struct db_mma_of;
template <> struct db_mma_of<float> {
    static constexpr unsigned PER = 1;
    static __device__ __forceinline__ void mma(float d[4], const unsigned a[4],
                                               const unsigned b[2]) {
        db_mma_tf32(d, a, b);
    }
};
template <> struct db_mma_of<db_bf16> {
    static constexpr unsigned PER = 2;
    static __device__ __forceinline__ void mma(float d[4], const unsigned a[4],
                                               const unsigned b[2]) {
        db_mma_bf16(d, a, b);
    }
};

// The slot of channels c, c + 1, ... (PER of them) whose first element is at p, consecutive
// channels `step` elements apart; `valid` of them exist (the rest read as zero).
__device__ __forceinline__ unsigned db_slot(const float *p, const long long, const unsigned valid) {
    return valid > 0 ? db_tf32(*p) : 0u;
}
__device__ __forceinline__ unsigned db_slot(const db_bf16 *p, const long long step,
                                            const unsigned valid) {
    const unsigned lo = valid > 0 ? p[0].bits : 0u;
    const unsigned hi = valid > 1 ? p[step].bits : 0u;
    return lo | (hi << 16);
}

template <typename T>
__device__ __forceinline__ void conv3x3_mma(const T *__restrict__ x, const u64 cin,
                                            T *__restrict__ y, const u64 cout,
                                            const T *__restrict__ w, const db_conv_weight wl,
                                            const u64 n, const u64 h, const u64 wd) {
    constexpr unsigned PER = db_mma_of<T>::PER, SLOTS = DB_MMA_SLOTS;
    constexpr unsigned CHUNK = SLOTS * PER;  // channels of a chunk
    constexpr unsigned PITCH = DB_CONV_TILE_W + 4, NT = DB_MMA_OUT / 8;
    static_assert(DB_CONV_TILE_H == 2 * DB_MMA_WARPS && DB_CONV_TILE_W == 32,
                  "a warp owns two rows of two 16-pixel halves");
    __shared__ __align__(16) unsigned xs[SLOTS][DB_CONV_TILE_H + 2][PITCH];
    __shared__ __align__(16) unsigned ws[9][SLOTS][DB_MMA_WPITCH];
    const u64 tiles_x = (wd + DB_CONV_TILE_W - 1) / DB_CONV_TILE_W;
    const u64 tiles_y = (h + DB_CONV_TILE_H - 1) / DB_CONV_TILE_H;
    const u64 per_image = tiles_x * tiles_y, tiles = n * per_image;
    const u64 plane = h * wd, m = n * plane;
    const u64 groups = (cout + DB_MMA_OUT - 1) / DB_MMA_OUT;
    const unsigned tid = threadIdx.x, nthreads = blockDim.x;
    const unsigned warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    constexpr unsigned HALO_W = DB_CONV_TILE_W + 2, HALO = (DB_CONV_TILE_H + 2) * HALO_W;
    for (u64 gr = blockIdx.y; gr < groups; gr += gridDim.y) {
        const u64 o_first = gr * DB_MMA_OUT;
        // column tiles of 8 outputs this block computes (the same in every warp)
        const unsigned ntc = (unsigned)((cout - o_first + 7) / 8 < NT ? (cout - o_first + 7) / 8 : NT);
        for (u64 tl = blockIdx.x; tl < tiles; tl += gridDim.x) {
            const u64 img = tl / per_image, r = tl % per_image;
            const long long y0 = (long long)((r / tiles_x) * DB_CONV_TILE_H);
            const long long x0 = (long long)((r % tiles_x) * DB_CONV_TILE_W);
            const T *xi = x + img * plane;
            float acc[4][NT][4];
#pragma unroll
            for (unsigned i = 0; i < 4; ++i)
#pragma unroll
                for (unsigned j = 0; j < NT; ++j)
#pragma unroll
                    for (unsigned q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
            for (u64 c0 = 0; c0 < cin; c0 += CHUNK) {
                const u64 left = cin - c0;
                __syncthreads();  // every warp is done with the previous chunk
                for (unsigned e = tid; e < SLOTS * HALO; e += nthreads) {
                    const unsigned s = e / HALO, rem = e % HALO;
                    const long long yy = y0 + (long long)(rem / HALO_W) - 1;
                    const long long xx = x0 + (long long)(rem % HALO_W) - 1;
                    const u64 first = (u64)s * PER;  // the slot's first channel in the chunk
                    const unsigned valid = first < left ? (unsigned)(left - first) : 0u;
                    unsigned v = 0;
                    if (valid > 0 && yy >= 0 && yy < (long long)h && xx >= 0 && xx < (long long)wd)
                        v = db_slot(xi + (c0 + first) * m + (u64)yy * wd + (u64)xx, (long long)m,
                                    valid);
                    xs[s][rem / HALO_W][rem % HALO_W] = v;
                }
                for (unsigned e = tid; e < 9 * SLOTS * DB_MMA_OUT; e += nthreads) {
                    const unsigned j = e / (SLOTS * DB_MMA_OUT), rem = e % (SLOTS * DB_MMA_OUT);
                    const unsigned s = rem / DB_MMA_OUT, ol = rem % DB_MMA_OUT;
                    const u64 o = o_first + ol, first = (u64)s * PER;
                    const unsigned valid = o < cout && first < left ? (unsigned)(left - first) : 0u;
                    unsigned v = 0;
                    if (valid > 0)
                        v = db_slot(w + wl.first + (long long)o * wl.out +
                                        (long long)(c0 + first) * wl.in + (long long)j * wl.step,
                                    wl.in, valid);
                    ws[j][s][ol] = v;
                }
                __syncthreads();
#pragma unroll
                for (unsigned dy = 0; dy < 3; ++dy) {
#pragma unroll
                    for (unsigned dx = 0; dx < 3; ++dx) {
                        unsigned b[NT][2] = {};
#pragma unroll
                        for (unsigned j = 0; j < NT; ++j)
                            if (j < ntc) {
                                b[j][0] = ws[3 * dy + dx][t][8 * j + g];
                                b[j][1] = ws[3 * dy + dx][t + 4][8 * j + g];
                            }
#pragma unroll
                        for (unsigned i = 0; i < 4; ++i) {
                            const unsigned row = 2 * warp + i / 2 + dy, col = 16 * (i % 2) + g + dx;
                            const unsigned a[4] = {xs[t][row][col], xs[t][row][col + 8],
                                                   xs[t + 4][row][col], xs[t + 4][row][col + 8]};
#pragma unroll
                            for (unsigned j = 0; j < NT; ++j)
                                if (j < ntc) db_mma_of<T>::mma(acc[i][j], a, b[j]);
                        }
                    }
                }
            }
#pragma unroll
            for (unsigned i = 0; i < 4; ++i) {
                const long long yy = y0 + 2 * warp + i / 2;
                if (yy >= (long long)h) continue;
#pragma unroll
                for (unsigned j = 0; j < NT; ++j) {
                    if (j >= ntc) continue;
#pragma unroll
                    for (unsigned q = 0; q < 4; ++q) {
                        const u64 oc = o_first + 8 * j + 2 * t + q % 2;
                        const long long xx = x0 + 16 * (i % 2) + g + 8 * (q / 2);
                        if (oc < cout && xx < (long long)wd)
                            y[oc * m + img * plane + (u64)yy * wd + (u64)xx] =
                                db_narrow<T>(acc[i][j][q]);
                    }
                }
            }
        }
    }
}

template <typename T>
__device__ __forceinline__ void conv3x3_wgrad(const T *__restrict__ gy, const T *__restrict__ s,
                                              db_acc<T> *__restrict__ part, const u64 cin,
                                              const u64 cout, const u64 n, const u64 h,
                                              const u64 wd, const u64 per_slice) {
    using A = db_acc<T>;
    constexpr unsigned R = DB_WGRAD_ROWS, SW = DB_WGRAD_SEG + 2;
    __shared__ A gs[DB_WGRAD_O][R][DB_WGRAD_SEG];
    __shared__ A ss[DB_WGRAD_C][R + 2][SW];
    const u64 segs = (wd + DB_WGRAD_SEG - 1) / DB_WGRAD_SEG, bands = (h + R - 1) / R;
    const u64 units = n * bands * segs;
    const u64 slices = (units + per_slice - 1) / per_slice;
    const u64 plane = h * wd, m = n * plane;
    const u64 cgroups = (cin + blockDim.x - 1) / blockDim.x;
    const u64 ogroups = (cout + blockDim.y - 1) / blockDim.y;
    const unsigned tid = threadIdx.y * blockDim.x + threadIdx.x;
    const unsigned nthreads = blockDim.x * blockDim.y;
    for (u64 og = blockIdx.z; og < ogroups; og += gridDim.z) {
        for (u64 cg = blockIdx.y; cg < cgroups; cg += gridDim.y) {
            const u64 c_first = cg * blockDim.x, o_first = og * blockDim.y;
            const unsigned nc = (unsigned)(cin - c_first < blockDim.x ? cin - c_first : blockDim.x);
            const unsigned no = (unsigned)(cout - o_first < blockDim.y ? cout - o_first : blockDim.y);
            for (u64 sl = blockIdx.x; sl < slices; sl += gridDim.x) {
                A acc[9];
#pragma unroll
                for (unsigned j = 0; j < 9; ++j) acc[j] = 0;
                const u64 u_end = (sl + 1) * per_slice < units ? (sl + 1) * per_slice : units;
                for (u64 u = sl * per_slice; u < u_end; ++u) {
                    // unit u: image img, rows y0 .. y0 + nr - 1, columns x0 .. x0 + sw - 1
                    const u64 img = u / (bands * segs);
                    const u64 y0 = ((u / segs) % bands) * R, x0 = (u % segs) * DB_WGRAD_SEG;
                    const unsigned nr = (unsigned)(h - y0 < R ? h - y0 : R);
                    const unsigned sw = (unsigned)(wd - x0 < DB_WGRAD_SEG ? wd - x0 : DB_WGRAD_SEG);
                    const u64 first = img * plane + y0 * wd + x0;  // the unit's first pixel
                    __syncthreads();  // every thread is done with the previous unit
                    for (unsigned e = tid; e < no * R * DB_WGRAD_SEG; e += nthreads) {
                        const unsigned ol = e / (R * DB_WGRAD_SEG), rem = e % (R * DB_WGRAD_SEG);
                        const unsigned r = rem / DB_WGRAD_SEG, q = rem % DB_WGRAD_SEG;
                        gs[ol][r][q] = r < nr && q < sw
                                           ? db_widen(gy[(o_first + ol) * m + first + r * wd + q])
                                           : (A)0;
                    }
                    for (unsigned e = tid; e < nc * (R + 2) * SW; e += nthreads) {
                        const unsigned cl = e / ((R + 2) * SW), rem = e % ((R + 2) * SW);
                        const long long yy = (long long)y0 + (long long)(rem / SW) - 1;
                        const long long xx = (long long)x0 + (long long)(rem % SW) - 1;
                        A v = 0;
                        if (yy >= 0 && yy < (long long)h && xx >= 0 && xx < (long long)wd)
                            v = db_widen(s[(c_first + cl) * m + img * plane + (u64)yy * wd +
                                           (u64)xx]);
                        ss[cl][rem / SW][rem % SW] = v;
                    }
                    __syncthreads();
                    if (threadIdx.x < nc && threadIdx.y < no) {
                        for (unsigned r = 0; r < nr; ++r) {
                            const A *srow = &ss[threadIdx.x][r][0];
                            const A *grow = gs[threadIdx.y][r];
                            // the 3x3 window of s under column q, slid along the row: three
                            // new values a column instead of nine (ptxas renames the shifts
                            // away in the unrolled loop); the sums are the plain loop's, in
                            // its order
                            A win[3][3];
#pragma unroll
                            for (unsigned dy = 0; dy < 3; ++dy)
                                win[dy][0] = srow[dy * SW], win[dy][1] = srow[dy * SW + 1];
#pragma unroll 4
                            for (unsigned q = 0; q < sw; ++q) {
                                const A gv = grow[q];
#pragma unroll
                                for (unsigned dy = 0; dy < 3; ++dy)
                                    win[dy][2] = srow[dy * SW + q + 2];
#pragma unroll
                                for (unsigned dy = 0; dy < 3; ++dy)
#pragma unroll
                                    for (unsigned dx = 0; dx < 3; ++dx)
                                        acc[3 * dy + dx] =
                                            db_fma(gv, win[dy][dx], acc[3 * dy + dx]);
#pragma unroll
                                for (unsigned dy = 0; dy < 3; ++dy)
                                    win[dy][0] = win[dy][1], win[dy][1] = win[dy][2];
                            }
                        }
                    }
                }
                if (threadIdx.x < nc && threadIdx.y < no) {
                    const u64 o = o_first + threadIdx.y, c = c_first + threadIdx.x;
                    A *dst = part + ((sl * cout + o) * cin + c) * 9;
#pragma unroll
                    for (unsigned j = 0; j < 9; ++j) dst[j] = acc[j];
                }
            }
        }
    }
}

// conv3x3_wgrad_mma: conv3x3_wgrad's partials on tensor cores (the same units, slices and
// partial layout, so the same sum kernel and the same memory): for each tap an implicit GEMM,
// rows = 16 output channels, columns = 8 input channels, the reduction = pixels, 8 (TF32) or
// 16 (bf16, two to a register) a step. A block of DB_MMA_WARPS warps takes a slice for 16
// outputs x 8 inputs; warp w sums row w of every unit (DB_WGRAD_ROWS = 4 rows) into its nine
// tap accumulators: for each unit of the slice in order, each step of DB_MMA_SLOTS slots of the
// row's columns in order (a step wholly past the unit's columns skipped; a row past the image's
// last band skipped), acc[tap] = mma(acc[tap], the step's pixels). At the slice's end the four
// warps' sums are added in warp order from warp 0's, in f32, into part[slice][o][c][tap].
// Shared memory: the unit's output gradient as operand slots (16 outputs x 4 rows, a row of
// 32 / PER slots padded by one: the A fragment's lanes hit 32 banks), its inputs with the halo
// as raw operands (TF32 bits or bf16 bits; a bf16 B register is two neighbouring pixels, which
// a tap dx may put across a 32-bit boundary, so it is put together from two 16-bit reads),
// and the warps' sums.
template <typename T> struct db_raw_of {
    using type = unsigned;  // TF32 bits
};
template <> struct db_raw_of<db_bf16> {
    using type = unsigned short;  // bf16 bits
};
__device__ __forceinline__ unsigned db_raw(const float v) { return db_tf32(v); }
__device__ __forceinline__ unsigned short db_raw(const db_bf16 v) { return v.bits; }
// The B register of slot u at column q of a raw row: one operand, or two neighbouring ones.
__device__ __forceinline__ unsigned db_pair(const unsigned *row, const unsigned q) { return row[q]; }
__device__ __forceinline__ unsigned db_pair(const unsigned short *row, const unsigned q) {
    return (unsigned)row[q] | ((unsigned)row[q + 1] << 16);
}

template <typename T>
__device__ __forceinline__ void conv3x3_wgrad_mma(const T *__restrict__ gy,
                                                  const T *__restrict__ s,
                                                  float *__restrict__ part, const u64 cin,
                                                  const u64 cout, const u64 n, const u64 h,
                                                  const u64 wd, const u64 per_slice) {
    using Raw = typename db_raw_of<T>::type;
    constexpr unsigned PER = db_mma_of<T>::PER, R = DB_WGRAD_ROWS, SEG = DB_WGRAD_SEG;
    constexpr unsigned SLOTS = SEG / PER, GP = SLOTS + 1, SW = SEG + 2;
    constexpr unsigned STEP = DB_MMA_SLOTS * PER;  // pixels of one mma
    static_assert(R == DB_MMA_WARPS, "a warp a row of the unit");
    __shared__ unsigned gs[16][R][GP];
    __shared__ Raw ss[8][R + 2][SW + 2];
    __shared__ float red[DB_MMA_WARPS][9][16][8];
    const u64 segs = (wd + SEG - 1) / SEG, bands = (h + R - 1) / R;
    const u64 units = n * bands * segs;
    const u64 slices = (units + per_slice - 1) / per_slice;
    const u64 plane = h * wd, m = n * plane;
    const u64 cgroups = (cin + 7) / 8, ogroups = (cout + 15) / 16;
    const unsigned tid = threadIdx.x, nthreads = blockDim.x;
    const unsigned warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    for (u64 og = blockIdx.z; og < ogroups; og += gridDim.z) {
        for (u64 cg = blockIdx.y; cg < cgroups; cg += gridDim.y) {
            const u64 c_first = cg * 8, o_first = og * 16;
            const unsigned nc = (unsigned)(cin - c_first < 8 ? cin - c_first : 8);
            const unsigned no = (unsigned)(cout - o_first < 16 ? cout - o_first : 16);
            for (u64 sl = blockIdx.x; sl < slices; sl += gridDim.x) {
                float acc[9][4];
#pragma unroll
                for (unsigned j = 0; j < 9; ++j)
#pragma unroll
                    for (unsigned q = 0; q < 4; ++q) acc[j][q] = 0.0f;
                const u64 u_end = (sl + 1) * per_slice < units ? (sl + 1) * per_slice : units;
                for (u64 u = sl * per_slice; u < u_end; ++u) {
                    const u64 img = u / (bands * segs);
                    const u64 y0 = ((u / segs) % bands) * R, x0 = (u % segs) * SEG;
                    const unsigned nr = (unsigned)(h - y0 < R ? h - y0 : R);
                    const unsigned sw = (unsigned)(wd - x0 < SEG ? wd - x0 : SEG);
                    const u64 first = img * plane + y0 * wd + x0;
                    __syncthreads();  // every warp is done with the previous unit
                    for (unsigned e = tid; e < 16 * R * SLOTS; e += nthreads) {
                        const unsigned ol = e / (R * SLOTS), rem = e % (R * SLOTS);
                        const unsigned r = rem / SLOTS, slot = rem % SLOTS, q = slot * PER;
                        unsigned v = 0;
                        if (ol < no && r < nr && q < sw)
                            v = db_slot(gy + (o_first + ol) * m + first + r * wd + q, 1,
                                        sw - q);
                        gs[ol][r][slot] = v;
                    }
                    for (unsigned e = tid; e < 8 * (R + 2) * (SW + 2); e += nthreads) {
                        const unsigned cl = e / ((R + 2) * (SW + 2)), rem = e % ((R + 2) * (SW + 2));
                        const long long yy = (long long)y0 + (long long)(rem / (SW + 2)) - 1;
                        const long long xx = (long long)x0 + (long long)(rem % (SW + 2)) - 1;
                        Raw v = 0;
                        if (cl < nc && yy >= 0 && yy < (long long)h && xx >= 0 &&
                            xx < (long long)wd)
                            v = db_raw(s[(c_first + cl) * m + img * plane + (u64)yy * wd +
                                         (u64)xx]);
                        ss[cl][rem / (SW + 2)][rem % (SW + 2)] = v;
                    }
                    __syncthreads();
                    if (warp < nr) {
                        for (unsigned k0 = 0; k0 < sw; k0 += STEP) {
                            const unsigned sl0 = k0 / PER;  // the step's first slot
                            const unsigned a[4] = {gs[g][warp][sl0 + t], gs[g + 8][warp][sl0 + t],
                                                   gs[g][warp][sl0 + t + 4],
                                                   gs[g + 8][warp][sl0 + t + 4]};
#pragma unroll
                            for (unsigned dy = 0; dy < 3; ++dy) {
                                const Raw *row = ss[g][warp + dy];
#pragma unroll
                                for (unsigned dx = 0; dx < 3; ++dx) {
                                    const unsigned b[2] = {db_pair(row, k0 + PER * t + dx),
                                                           db_pair(row, k0 + PER * (t + 4) + dx)};
                                    db_mma_of<T>::mma(acc[3 * dy + dx], a, b);
                                }
                            }
                        }
                    }
                }
                // the warps' sums, added in warp order
#pragma unroll
                for (unsigned j = 0; j < 9; ++j)
#pragma unroll
                    for (unsigned q = 0; q < 4; ++q)
                        red[warp][j][g + 8 * (q / 2)][2 * t + q % 2] = acc[j][q];
                __syncthreads();
                for (unsigned e = tid; e < 16 * 8 * 9; e += nthreads) {
                    const unsigned ol = e / (8 * 9), cl = (e / 9) % 8, j = e % 9;
                    if (ol >= no || cl >= nc) continue;
                    float v = red[0][j][ol][cl];
#pragma unroll
                    for (unsigned w = 1; w < DB_MMA_WARPS; ++w) v = db_add(v, red[w][j][ol][cl]);
                    part[((sl * cout + o_first + ol) * cin + c_first + cl) * 9 + j] = v;
                }
            }
        }
    }
}

// dW[i] = sum over the slices, in order from +0, of part[slice][i], i < len = 9*k*B.
template <typename A>
__device__ __forceinline__ void conv3x3_wgrad_sum(const A *__restrict__ part, A *__restrict__ dw,
                                                  const u64 slices, const u64 len) {
    for (u64 i = db_first(); i < len; i += db_stride()) {
        A acc = 0;
        for (u64 sl = 0; sl < slices; ++sl) acc = db_add(acc, part[sl * len + i]);
        dw[i] = acc;
    }
}

#define DB_CONV_KERNELS(T, S)                                                                \
    extern "C" __global__ void conv3x3_##S(const T *x, const u64 cin, T *y, const u64 cout,   \
                                           const T *w, const db_conv_weight wl, const u64 n,  \
                                           const u64 h, const u64 wd) {                       \
        conv3x3<T>(x, cin, y, cout, w, wl, n, h, wd);                                        \
    }                                                                                        \
    extern "C" __global__ void conv3x3_wgrad_##S(const T *gy, const T *s, db_acc<T> *part,    \
                                                 const u64 cin, const u64 cout, const u64 n,  \
                                                 const u64 h, const u64 wd,                   \
                                                 const u64 per_slice) {                       \
        conv3x3_wgrad<T>(gy, s, part, cin, cout, n, h, wd, per_slice);                       \
    }

#define DB_CONV_SUM_KERNELS(T, S)                                                            \
    extern "C" __global__ void conv3x3_wgrad_sum_##S(const T *part, T *dw, const u64 slices, \
                                                     const u64 len) {                         \
        conv3x3_wgrad_sum<T>(part, dw, slices, len);                                         \
    }

DB_CONV_KERNELS(float, f32)
DB_CONV_KERNELS(double, f64)
DB_CONV_KERNELS(db_bf16, bf16)
// the partials are db_acc<T>: f32 for bf16 features, so bf16 takes the f32 sum
DB_CONV_SUM_KERNELS(float, f32)
DB_CONV_SUM_KERNELS(double, f64)
// the tensor-core convolution, for the feature types that have one (f32 as TF32, bf16)
extern "C" __global__ void __launch_bounds__(32 * DB_MMA_WARPS)
    conv3x3_mma_f32(const float *x, const u64 cin, float *y, const u64 cout, const float *w,
                    const db_conv_weight wl, const u64 n, const u64 h, const u64 wd) {
    conv3x3_mma<float>(x, cin, y, cout, w, wl, n, h, wd);
}
extern "C" __global__ void __launch_bounds__(32 * DB_MMA_WARPS)
    conv3x3_mma_bf16(const db_bf16 *x, const u64 cin, db_bf16 *y, const u64 cout,
                     const db_bf16 *w, const db_conv_weight wl, const u64 n, const u64 h,
                     const u64 wd) {
    conv3x3_mma<db_bf16>(x, cin, y, cout, w, wl, n, h, wd);
}
extern "C" __global__ void __launch_bounds__(32 * DB_MMA_WARPS)
    conv3x3_wgrad_mma_f32(const float *gy, const float *s, float *part, const u64 cin,
                          const u64 cout, const u64 n, const u64 h, const u64 wd,
                          const u64 per_slice) {
    conv3x3_wgrad_mma<float>(gy, s, part, cin, cout, n, h, wd, per_slice);
}
extern "C" __global__ void __launch_bounds__(32 * DB_MMA_WARPS)
    conv3x3_wgrad_mma_bf16(const db_bf16 *gy, const db_bf16 *s, float *part, const u64 cin,
                           const u64 cout, const u64 n, const u64 h, const u64 wd,
                           const u64 per_slice) {
    conv3x3_wgrad_mma<db_bf16>(gy, s, part, cin, cout, n, h, wd, per_slice);
}
