//! The geometry of the GPU's direct 3×3 convolution (`conv.cu`, `DENSEBENCH_CONV=direct`; the
//! candle ops are [`crate::ops::conv3x3::gpu`], the launcher `conv`): tile and block sizes, which
//! kernel a pass runs (tensor cores or fused multiply-adds), the weight gradient's slices and
//! the size of its one transient (the per-slice partial sums).
//! Text and arithmetic, no CUDA: the launcher, the memory model and the host emulation of the
//! kernels (`tests/cuda_emulated.rs`) use it in every build.

use crate::ops::layout::grid::Grid;

/// Rows of a forward / data-gradient tile (`DB_CONV_TILE_H` of `conv.cu`).
pub const TILE_H: usize = 8;
/// Columns of a tile (`DB_CONV_TILE_W`): each thread computes 4 adjacent columns.
pub const TILE_W: usize = 32;
/// `blockDim.x` of `conv3x3`: one thread per tile row and run of 4 columns.
pub const PIXEL_THREADS: usize = TILE_H * TILE_W / 4;
/// Most `blockDim.y` of `conv3x3`: groups of 4 output channels per block.
pub const OUT_GROUPS: usize = 4;
/// Columns of a weight-gradient unit (`DB_WGRAD_SEG`).
pub const WGRAD_SEG: usize = 32;
/// Rows of a weight-gradient unit (`DB_WGRAD_ROWS`; an image's last band may have fewer): a
/// unit is these rows of one image, [`WGRAD_SEG`] columns of them, so the staging of a unit
/// (its global loads and two barriers) is paid once per 128 pixels.
pub const WGRAD_ROWS: usize = 4;
/// Most input channels (`blockDim.x`) of a weight-gradient block: 8, so that few slices still
/// make enough blocks (BC-100: 6 channel groups × 32 slices) for the GPU to overlap one
/// block's staging with another's sums.
pub const WGRAD_C: usize = 8;
/// Most output channels (`blockDim.y`) of a weight-gradient block.
pub const WGRAD_O: usize = 16;
/// The weight gradient's blocks aim at this many (slices × channel groups): about one wave of
/// resident blocks on an H100 (132 SMs × 8 blocks), so the pixels are cut into enough slices
/// to fill the GPU even where the channels make few groups — up to [`WGRAD_MAX_SLICES`].
pub const WGRAD_TARGET_BLOCKS: usize = 1024;
/// Most slices of the weight gradient: its partials, `slices · 9·k·B` elements, are the direct
/// path's only transient and sit beside `dW` at the frugal variants' peak, so they are kept
/// small: at 32, BC-100's are 0.63 MiB (192 blocks) and `buffer-recompute-inplace` peaks under
/// the CPU's peak at L = 16 and 48 (at 342 slices, a wave of blocks, 6.8 MiB: over issue 38's
/// 345 MiB at L=48).
pub const WGRAD_MAX_SLICES: usize = 32;
/// Threads of a block of the partials' sum (`conv3x3_wgrad_sum`, one output element each).
pub const SUM_THREADS: usize = 256;
/// Most blocks in any dimension of these launches (the kernels stride over the rest).
pub const MAX_GRID: usize = 65_535;
/// Warps of a block of the tensor-core convolution (`conv3x3_mma`, `DB_MMA_WARPS`): each owns
/// two rows of a [`TILE_H`] × [`TILE_W`] tile.
pub const MMA_WARPS: usize = 4;
/// Output channels of a tensor-core block (`DB_MMA_OUT`): four column tiles of 8.
pub const MMA_OUT: usize = 32;
/// 32-bit operand slots of a tensor-core chunk (`DB_MMA_SLOTS`): one mma's reduction, 8
/// channels in TF32 or 16 in bf16.
pub const MMA_SLOTS: usize = 8;
/// Outputs a row of the tensor-core block's staged weights holds (`DB_MMA_WPITCH`): [`MMA_OUT`]
/// padded so that a fragment's 32 lanes read 32 banks.
pub const MMA_WPITCH: usize = 40;
/// The first compute capability with the `mma.sync` shapes `conv3x3_mma` uses (sm_80).
pub const MMA_MAJOR: i32 = 8;

/// Which kernel computes a pass of the direct convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvKernel {
    /// `conv3x3` / `conv3x3_wgrad`: fused multiply-adds, IEEE (f32 and bf16 features in f32,
    /// f64 in f64).
    Fma,
    /// `conv3x3_mma` / `conv3x3_wgrad_mma`: tensor cores, f32 features as TF32 operands, bf16
    /// as bf16, f32 sums.
    Mma,
}

/// Whether a pass may run on tensor cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mma {
    /// Never (`DENSEBENCH_CONV=direct-fma`).
    Refused,
    /// Where the math allows it (`DENSEBENCH_CONV=direct`): bf16 features, f32 under `tf32`.
    Allowed,
    /// f32 features in TF32 whatever the math mode (the GPU tests of the kernel; never the
    /// layer's choice).
    Forced,
}

/// The kernel of a pass on features of `dtype`: the tensor cores where they
/// are not refused (`mma`), the GPU has them (compute capability `major` ≥ [`MMA_MAJOR`]) and
/// the math allows them — bf16 features always (autocast's convolution), f32 only under the
/// `tf32` math mode (`tf32`) or [`Mma::Forced`]; the fused multiply-adds otherwise (f32 in
/// `ieee`, f64). The same for each of the three passes.
pub fn conv_kernel(dtype: candle_core::DType, tf32: bool, major: i32, mma: Mma) -> ConvKernel {
    use candle_core::DType;
    let math = match dtype {
        DType::BF16 => true,
        DType::F32 => tf32 || mma == Mma::Forced,
        _ => false,
    };
    if mma != Mma::Refused && math && major >= MMA_MAJOR {
        ConvKernel::Mma
    } else {
        ConvKernel::Fma
    }
}

/// A launch's `(grid, block)` dimensions.
pub type Dims = ((u32, u32, u32), (u32, u32, u32));

fn dim(n: usize) -> u32 {
    // clamped to [1, MAX_GRID], which fits in u32
    n.clamp(1, MAX_GRID) as u32
}

/// `conv3x3` (forward, or the data gradient) of `cin` channels into `cout` on `g`: blocks of
/// [`PIXEL_THREADS`] × (groups of 4 output channels, at most [`OUT_GROUPS`]), the grid's x over
/// the tiles of all images, y over the groups of output channels of a block.
pub fn conv_dims(g: Grid, cout: usize) -> Dims {
    let groups = cout.div_ceil(4).clamp(1, OUT_GROUPS);
    let tiles = g.n * g.h.div_ceil(TILE_H) * g.w.div_ceil(TILE_W);
    let per_block = 4 * groups;
    (
        (dim(tiles), dim(cout.div_ceil(per_block)), 1),
        (PIXEL_THREADS as u32, groups as u32, 1),
    )
}

/// How the weight gradient cuts the pixels: `units` ([`WGRAD_ROWS`] rows of one image,
/// [`WGRAD_SEG`] columns of them; numbered image by image, band by band, segment by segment),
/// `per_slice` consecutive units a slice, `slices` slices (each a block's partial sum for a
/// group of channels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slices {
    pub units: usize,
    pub per_slice: usize,
    pub slices: usize,
}

/// [`Slices`] of the weight gradient of a convolution of `b` channels into `k` on `g`: as many
/// slices as give about [`WGRAD_TARGET_BLOCKS`] blocks with the channel groups, at most
/// [`WGRAD_MAX_SLICES`], whole units each.
pub fn weight_slices(g: Grid, b: usize, k: usize) -> Slices {
    let units = g.n * g.h.div_ceil(WGRAD_ROWS) * g.w.div_ceil(WGRAD_SEG);
    let groups = b.div_ceil(WGRAD_C).max(1) * k.div_ceil(WGRAD_O).max(1);
    let wanted = WGRAD_TARGET_BLOCKS
        .div_ceil(groups)
        .clamp(1, WGRAD_MAX_SLICES);
    let per_slice = units.div_ceil(wanted).max(1);
    Slices {
        units,
        per_slice,
        slices: units.div_ceil(per_slice),
    }
}

/// Elements (of the parameter dtype: f32, or f64 for f64 features) of the weight gradient's
/// partial sums, `slices · 9·k·B`: the convolution's only transient, what the memory model
/// charges.
pub fn partial_elems(g: Grid, b: usize, k: usize) -> usize {
    weight_slices(g, b, k).slices * 9 * k * b
}

/// `conv3x3_mma` (forward, or the data gradient) of `cin` channels into `cout` on `g`: blocks
/// of [`MMA_WARPS`] warps, the grid's x over the tiles of all images, y over the groups of
/// [`MMA_OUT`] output channels.
pub fn mma_dims(g: Grid, cout: usize) -> Dims {
    let tiles = g.n * g.h.div_ceil(TILE_H) * g.w.div_ceil(TILE_W);
    (
        (dim(tiles), dim(cout.div_ceil(MMA_OUT)), 1),
        ((32 * MMA_WARPS) as u32, 1, 1),
    )
}

/// `conv3x3_wgrad_mma`: the slices of [`weight_slices`] (the same partials as the FMA kernel's),
/// blocks of [`MMA_WARPS`] warps (a warp a row of a unit) for 8 input × 16 output channels, the
/// grid's x over the slices, y and z over the channel groups.
pub fn wgrad_mma_dims(g: Grid, b: usize, k: usize) -> Dims {
    let s = weight_slices(g, b, k);
    (
        (dim(s.slices), dim(b.div_ceil(8)), dim(k.div_ceil(16))),
        ((32 * MMA_WARPS) as u32, 1, 1),
    )
}

/// `conv3x3_wgrad`: blocks of (input channels, output channels) = (min(B, [`WGRAD_C`]),
/// min(k, [`WGRAD_O`])), the grid's x over the slices, y and z over the channel groups.
pub fn wgrad_dims(g: Grid, b: usize, k: usize) -> Dims {
    let (bx, by) = (b.clamp(1, WGRAD_C), k.clamp(1, WGRAD_O));
    let s = weight_slices(g, b, k);
    (
        (dim(s.slices), dim(b.div_ceil(bx)), dim(k.div_ceil(by))),
        (bx as u32, by as u32, 1),
    )
}

/// `conv3x3_wgrad_sum` over `len` = 9·k·B outputs: one thread each, grid-stride.
pub fn sum_dims(len: usize) -> Dims {
    (
        (dim(len.div_ceil(SUM_THREADS)), 1, 1),
        (SUM_THREADS as u32, 1, 1),
    )
}

/// Which pass a launch of the direct kernels computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// `(s [B, M], w [k, B, 3, 3]) → y [k, M]`.
    Forward,
    /// `(gy [k, M], w [k, B, 3, 3]) → ds [B, M]`: a forward convolution with the weight read
    /// transposed and flipped.
    Data,
    /// `(gy [k, M], s [B, M]) → dW [k, B, 3, 3]`: slice partials, then their sum.
    Weight,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants are the kernel file's `#define`s: the launches and the kernels' shared
    /// arrays agree by construction.
    #[test]
    fn the_geometry_is_the_kernel_files() {
        let body = super::super::src::CONV.body;
        for (name, value) in [
            ("DB_CONV_TILE_H", TILE_H),
            ("DB_CONV_TILE_W", TILE_W),
            ("DB_CONV_OUT_GROUPS", OUT_GROUPS),
            ("DB_WGRAD_SEG", WGRAD_SEG),
            ("DB_WGRAD_ROWS", WGRAD_ROWS),
            ("DB_WGRAD_C", WGRAD_C),
            ("DB_WGRAD_O", WGRAD_O),
            ("DB_MMA_WARPS", MMA_WARPS),
            ("DB_MMA_OUT", MMA_OUT),
            ("DB_MMA_SLOTS", MMA_SLOTS),
            ("DB_MMA_WPITCH", MMA_WPITCH),
        ] {
            let line = format!("#define {name} {value}\n");
            assert!(body.contains(&line), "conv.cu has no `{}`", line.trim());
        }
        assert_eq!(PIXEL_THREADS, 64);
        // a tensor-core weight-gradient warp sums one row of a unit
        assert_eq!(MMA_WARPS, WGRAD_ROWS);
    }

    /// BC-100's layer (B = 48 into k = 12 on 64 images of 32×32) and the torchvision-style one
    /// (128 into 32 on 32 of 56×56): at most 32 slices (0.66 MB of partials on BC-100, 4.7 MB on
    /// the torchvision-style block), every unit in exactly one slice.
    #[test]
    fn weight_slices_cover_every_unit_once() {
        let bc = Grid {
            n: 64,
            h: 32,
            w: 32,
        };
        let s = weight_slices(bc, 48, 12);
        assert_eq!((s.units, s.per_slice, s.slices), (512, 16, 32));
        assert_eq!(partial_elems(bc, 48, 12), 32 * 9 * 12 * 48);
        let ((gx, gy, gz), (bx, by, _)) = wgrad_dims(bc, 48, 12);
        assert_eq!(((gx, gy, gz), (bx, by)), ((32, 6, 1), (8, 12)));
        let tv = Grid {
            n: 32,
            h: 56,
            w: 56,
        };
        let s = weight_slices(tv, 128, 32);
        assert_eq!((s.units, s.per_slice, s.slices), (896, 28, 32));
        // few units: one slice each, never an empty one
        let small = Grid { n: 2, h: 9, w: 40 };
        assert_eq!(weight_slices(small, 3, 18).units, 2 * 3 * 2);
        assert_eq!(weight_slices(small, 3, 18).slices, 12);
        for (g, b, k) in [
            (bc, 48, 12),
            (tv, 128, 32),
            (Grid { n: 1, h: 1, w: 1 }, 1, 1),
            (Grid { n: 3, h: 5, w: 70 }, 20, 17),
            (Grid { n: 0, h: 4, w: 4 }, 8, 4),
        ] {
            let s = weight_slices(g, b, k);
            assert!(s.per_slice >= 1);
            assert!(s.slices * s.per_slice >= s.units, "{g:?}: {s:?}");
            assert!(
                s.slices == 0 || (s.slices - 1) * s.per_slice < s.units,
                "{g:?}: an empty slice {s:?}"
            );
        }
    }

    /// Forward tiles: 64 threads a block, the output channels in groups of 4 (k = 12: 3 groups
    /// in one block; 48 outputs: 4 groups, 3 blocks), tiles of 8×32 pixels.
    #[test]
    fn conv_blocks_cover_the_tiles_and_channels() {
        let bc = Grid {
            n: 64,
            h: 32,
            w: 32,
        };
        assert_eq!(conv_dims(bc, 12), ((256, 1, 1), (64, 3, 1)));
        assert_eq!(conv_dims(bc, 48), ((256, 3, 1), (64, 4, 1)));
        let tv = Grid {
            n: 32,
            h: 56,
            w: 56,
        };
        assert_eq!(conv_dims(tv, 32), ((448, 2, 1), (64, 4, 1)));
        assert_eq!(
            conv_dims(Grid { n: 1, h: 1, w: 1 }, 1),
            ((1, 1, 1), (64, 1, 1))
        );
        assert_eq!(sum_dims(5184), ((21, 1, 1), (256, 1, 1)));
        // tensor cores: 128 threads, up to 32 outputs a block (k = 12: one block of two
        // column tiles; the data gradient's 48: two blocks)
        assert_eq!(mma_dims(bc, 12), ((256, 1, 1), (128, 1, 1)));
        assert_eq!(mma_dims(bc, 48), ((256, 2, 1), (128, 1, 1)));
        assert_eq!(mma_dims(tv, 128), ((448, 4, 1), (128, 1, 1)));
        // the weight gradient: BC-100's 32 slices × 6 groups of 8 inputs × one of 16 outputs
        assert_eq!(wgrad_mma_dims(bc, 48, 12), ((32, 6, 1), (128, 1, 1)));
        assert_eq!(wgrad_mma_dims(tv, 128, 32), ((32, 16, 2), (128, 1, 1)));
    }

    /// Tensor cores for bf16 features, and for f32 ones only in TF32, on sm_80 and later, unless
    /// refused; f64 never.
    #[test]
    fn tensor_cores_only_where_the_math_allows_them() {
        use candle_core::DType::{BF16, F32, F64};
        use ConvKernel::Fma;
        use Mma::{Allowed, Forced, Refused};
        let tc = ConvKernel::Mma;
        assert_eq!(conv_kernel(BF16, false, 9, Allowed), tc);
        assert_eq!(conv_kernel(F32, true, 9, Allowed), tc);
        assert_eq!(conv_kernel(F32, true, 8, Allowed), tc);
        assert_eq!(conv_kernel(F32, false, 9, Allowed), Fma);
        assert_eq!(conv_kernel(F32, false, 9, Forced), tc);
        assert_eq!(conv_kernel(F64, true, 9, Allowed), Fma);
        assert_eq!(conv_kernel(F64, true, 9, Forced), Fma);
        assert_eq!(conv_kernel(BF16, true, 7, Allowed), Fma);
        assert_eq!(conv_kernel(F32, true, 7, Forced), Fma);
        assert_eq!(conv_kernel(BF16, true, 9, Refused), Fma);
        assert_eq!(conv_kernel(F32, true, 9, Refused), Fma);
    }
}
