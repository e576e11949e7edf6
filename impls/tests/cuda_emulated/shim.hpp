// Host emulation of the few CUDA features densebench's kernels use, so that the kernel sources
// (impls/src/ops/cuda/*.cu with prelude.cuh, exactly the text NVRTC compiles) build as ordinary
// C++ and run on the CPU: tests/cuda_emulated.rs compiles them with this header and compares
// every entry point with its CPU twin.
//
// The execution model emulated:
// - a launch runs its blocks one after another; inside a block, either one std::thread per
//   CUDA thread with a std::barrier for __syncthreads (kernels that synchronise), or the
//   threads one after another on the calling thread (kernels that never synchronise: the
//   result cannot depend on the order, each output element has one writer);
// - threadIdx / blockIdx are per-thread (thread_local), blockDim / gridDim per launch, all of
//   them per module (one library each, see below);
// - __shared__ is `static`: one array for the whole launch, which is one block's shared memory
//   because blocks never overlap;
// - the explicitly rounded intrinsics are the plain IEEE operations (the test compiles with
//   -ffp-contract=off, so nothing is fused into an FMA, as on the GPU with the intrinsics), and
//   the fused multiply-add intrinsics std::fma (one rounding, as the GPU's).
//
// - warps only where a kernel's threads exchange values through one: the tensor-core step
//   (mma.sync, conv.cu's db_mma_tf32 / db_mma_bf16) is a warp-wide barrier at which every lane
//   leaves its fragments, each lane's results computed from all 32 lanes' fragments as fused
//   multiply-adds in the order of the reduction index (PTX's fragment layouts); the real
//   tensor core's order and rounding inside one mma are its own (the GPU test bounds them).
//
// Not emulated: memory coalescing, real concurrency between blocks, the driver. Those are for
// a GPU run (tests/fused_cuda.rs with --features cuda).
#pragma once

#include <barrier>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <algorithm>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

// CUDA's vector types, as conv.cu loads shared memory through them (same sizes and alignment).
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) double2 {
    double x, y;
};

struct db_dim3 {
    unsigned x = 1, y = 1, z = 1;
};

// The emulation's state has internal linkage (`static`; each module is one translation unit
// built into its own library), never `inline`: g++ makes an inline variable (and a static local
// of a template, such as a __shared__ array) a GNU_UNIQUE symbol, one object for every library
// of the process, so the tests that run at once in one test binary shared gridDim and blockDim
// across their modules and one launch's grid-stride loops ran on another launch's geometry
// (columns left unwritten, found by a CI run). The test also builds with -fno-gnu-unique.
static thread_local db_dim3 threadIdx, blockIdx;
static db_dim3 blockDim, gridDim;
// The barrier of the block being run by threads, null when its threads run one by one.
static std::barrier<> *db_emu_barrier = nullptr;
// One barrier per warp of that block (32 consecutive linear thread indices), for the
// tensor-core step.
static std::vector<std::barrier<> *> db_emu_warps;

inline void __syncthreads() {
    if (db_emu_barrier == nullptr) {
        std::fprintf(stderr, "emulation: __syncthreads in a kernel launched without threads\n");
        std::abort();
    }
    db_emu_barrier->arrive_and_wait();
}

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __fsub_rn(float a, float b) { return a - b; }
// Fused multiply-add, one rounding (conv.cu), as the GPU's FFMA / DFMA.
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline double __drcp_rn(double a) { return 1.0 / a; }
inline float __double2float_rn(double v) { return static_cast<float>(v); }
// Bit casts (prelude.cuh's bf16 conversions).
inline unsigned __float_as_uint(float v) { return std::bit_cast<unsigned>(v); }
inline float __uint_as_float(unsigned v) { return std::bit_cast<float>(v); }
// The high 32 bits of the 64-bit product (shift.cu's division by a magic number).
inline unsigned __umulhi(unsigned a, unsigned b) {
    return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}

// ---- the tensor-core step (conv.cu's conv3x3_mma) ----------------------------------------------

// f32 -> TF32 as cvt.rna.tf32.f32: to nearest, ties away from zero (add half of the dropped
// 13 bits' range to the magnitude, drop them); infinities kept, a NaN made the canonical NaN.
inline unsigned db_tf32(float v) {
    const unsigned b = std::bit_cast<unsigned>(v);
    if ((b & 0x7F800000u) == 0x7F800000u) return (b & 0x007FFFFFu) ? 0x7FFFFFFFu : b;
    return (b + 0x1000u) & 0xFFFFE000u;
}

// Every lane's fragments of the warp's mma in progress.
static unsigned db_emu_mma_a[32][32][4], db_emu_mma_b[32][32][2];
static float db_emu_mma_c[32][32][4];

// d += A x B for the lane's four C elements (row g or g + 8, column 2t or 2t + 1); `k_of(reg,
// half)`: A (16 x K) element (row, k) sits in lane (row % 8) * 4 + (k % KL) / PER, register
// (row / 8) + 2 * (k / KL), half k % PER; B (K x 8) element (k, col) in lane col * 4 +
// (k % KL) / PER, register k / KL, half k % PER (KL = 4 * PER: a register's k range).
template <unsigned PER, class Widen>
void db_emu_mma(float d[4], const unsigned a[4], const unsigned b[2], Widen widen) {
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    if (db_emu_barrier == nullptr || (blockDim.x * blockDim.y * blockDim.z) % 32 != 0) {
        std::fprintf(stderr, "emulation: mma outside a block of whole warps run by threads\n");
        std::abort();
    }
    const unsigned wp = t / 32, lane = t % 32;
    std::memcpy(db_emu_mma_a[wp][lane], a, sizeof(unsigned) * 4);
    std::memcpy(db_emu_mma_b[wp][lane], b, sizeof(unsigned) * 2);
    std::memcpy(db_emu_mma_c[wp][lane], d, sizeof(float) * 4);
    db_emu_warps[wp]->arrive_and_wait();
    constexpr unsigned KL = 4 * PER, K = 8 * PER;
    const auto half = [](unsigned reg, unsigned h) { return PER == 1 ? reg : (reg >> (16 * h)) & 0xFFFFu; };
    float out[4];
    for (unsigned q = 0; q < 4; ++q) {
        const unsigned row = lane / 4 + 8 * (q / 2), col = 2 * (lane % 4) + q % 2;
        float acc = db_emu_mma_c[wp][lane][q];
        for (unsigned k = 0; k < K; ++k) {
            const unsigned la = (row % 8) * 4 + (k % KL) / PER, ra = row / 8 + 2 * (k / KL);
            const unsigned lb = col * 4 + (k % KL) / PER, rb = k / KL;
            const float av = widen(half(db_emu_mma_a[wp][la][ra], k % PER));
            const float bv = widen(half(db_emu_mma_b[wp][lb][rb], k % PER));
            acc = std::fma(av, bv, acc);
        }
        out[q] = acc;
    }
    db_emu_warps[wp]->arrive_and_wait();  // every lane has read the fragments
    std::memcpy(d, out, sizeof(float) * 4);
}
inline void db_mma_tf32(float d[4], const unsigned a[4], const unsigned b[2]) {
    db_emu_mma<1>(d, a, b, [](unsigned v) { return std::bit_cast<float>(v); });
}
inline void db_mma_bf16(float d[4], const unsigned a[4], const unsigned b[2]) {
    db_emu_mma<2>(d, a, b, [](unsigned v) { return std::bit_cast<float>(v << 16); });
}

// Calls `f` with its arguments read from `params` (one pointer per argument, as the driver
// API's kernelParams).
template <class... A, std::size_t... I>
void db_emu_call(void (*f)(A...), void **params, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<A> *>(params[I])...);
}

// Runs `f` over grid x block; `threads`: one std::thread per CUDA thread (for kernels that
// synchronise), else the threads one by one.
template <class... A>
int db_emu_launch(void (*f)(A...), db_dim3 grid, db_dim3 block, void **params, bool threads) {
    gridDim = grid;
    blockDim = block;
    const unsigned n = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                auto body = [&](unsigned t) {
                    blockIdx = db_dim3{bx, by, bz};
                    threadIdx = db_dim3{t % block.x, (t / block.x) % block.y,
                                        t / (block.x * block.y)};
                    db_emu_call(f, params, std::index_sequence_for<A...>{});
                };
                if (threads) {
                    std::barrier<> bar(n);
                    db_emu_barrier = &bar;
                    std::vector<std::unique_ptr<std::barrier<>>> warps;
                    for (unsigned w = 0; w * 32 < n; ++w) {
                        warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, n - 32 * w)));
                        db_emu_warps.push_back(warps.back().get());
                    }
                    std::vector<std::thread> ts;
                    ts.reserve(n);
                    for (unsigned t = 0; t < n; ++t) ts.emplace_back(body, t);
                    for (auto &t : ts) t.join();
                    db_emu_barrier = nullptr;
                    db_emu_warps.clear();
                } else {
                    for (unsigned t = 0; t < n; ++t) body(t);
                }
            }
    return 0;
}
