//! CUDA launcher of the 3×3 shift kernels (`ops/cuda/shift.cu`): the `cuda_fwd` of
//! [`crate::ops::shift`]'s op, the shift stack and shift sum written into a destination view,
//! one launch over the channel rows, no allocation. Grid: [`crate::ops::cuda::src::ELEMENTWISE_THREADS`]
//! threads over the columns of a row, the grid's y dimension over the rows.
//!
//! Only compiled with the `cuda` feature.

use crate::ops::cuda::launch::{function, rows_config, view, view_mut, Float};
use crate::ops::cuda::src::SHIFT;
use crate::ops::layout::grid::{Grid, Shift};
use crate::ops::layout::matrix::Mat;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaStorage, WrapErr};
use candle_core::{DType, Layout};
use half::bf16;

/// The nine taps as the kernels take them: `struct db_taps { int oy[9]; int ox[9]; }`, by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Taps {
    oy: [i32; 9],
    ox: [i32; 9],
}

// SAFETY: `Taps` is `repr(C)`, plain integers, no padding, laid out exactly like the kernels'
// `db_taps`; it is passed by value as a kernel parameter.
unsafe impl DeviceRepr for Taps {}

impl Taps {
    fn new(op: &str, offsets: &[(isize, isize); 9]) -> candle_core::Result<Self> {
        let mut t = Taps {
            oy: [0; 9],
            ox: [0; 9],
        };
        for (j, &(oy, ox)) in offsets.iter().enumerate() {
            let conv = |v: isize| {
                i32::try_from(v).map_err(|_| {
                    crate::ops::cuda::launch::msg(format!(
                        "{op} (cuda): tap offset {v} out of range"
                    ))
                })
            };
            t.oy[j] = conv(oy)?;
            t.ox[j] = conv(ox)?;
        }
        Ok(t)
    }
}

/// Checks `cols == N·H·W` of `grid`, so the kernels' image indexing stays inside each row.
fn check_grid(op: &str, grid: Grid, cols: usize) -> candle_core::Result<()> {
    if grid.n * grid.h * grid.w != cols {
        return Err(crate::ops::cuda::launch::msg(format!(
            "{op} (cuda): {cols} columns, but the grid is N={} × H={} × W={}",
            grid.n, grid.h, grid.w
        )));
    }
    Ok(())
}

/// [`Shift::Stack`] (`src [C, m] → dst [9C, m]`) or [`Shift::Sum`] (`src [9C, m] → dst [C, m]`)
/// with the nine `offsets`, written into `dst`'s view; both operands rows of unit column stride
/// (any row stride ≥ m: column ranges of wider maps). `(c, m)` as checked by the op. One dtype,
/// or for the sum f32 tap products into bf16 (`shift_sum_wide_bf16`).
pub(crate) fn shift_into(
    op: &str,
    kind: Shift,
    (d, dl): (&mut CudaStorage, &Layout),
    (s, sl): (&CudaStorage, &Layout),
    (c, m): (usize, usize),
    grid: Grid,
    offsets: &[(isize, isize); 9],
) -> candle_core::Result<()> {
    /// The kernel `{kernel}_{D::SUFFIX}` from `S` into `D`.
    #[allow(clippy::too_many_arguments)]
    fn run<S: Float, D: Float>(
        op: &str,
        kind: Shift,
        kernel: &str,
        (d, dl): (&mut CudaStorage, &Layout),
        (s, sl): (&CudaStorage, &Layout),
        (c, m): (usize, usize),
        grid: Grid,
        taps: Taps,
    ) -> candle_core::Result<()> {
        check_grid(op, grid, m)?;
        // Both kernels walk the C channel rows in the grid's y (a stack thread writes the nine
        // tap rows of its column); the destination has 9C rows for the stack.
        let out_rows = match kind {
            Shift::Stack => 9 * c,
            Shift::Sum => c,
        };
        let dv = Mat::rows_of(dl, d.as_cuda_slice::<D>()?.len(), op, "the destination")?;
        let sv = Mat::rows_of(sl, s.as_cuda_slice::<S>()?.len(), op, "the source")?;
        if dv.rows != out_rows || dv.cols != m {
            return Err(crate::ops::cuda::launch::msg(format!(
                "{op} (cuda): the destination is {}×{}, expected {out_rows}×{m}",
                dv.rows, dv.cols
            )));
        }
        if out_rows * m == 0 {
            return Ok(());
        }
        let dev = d.device.clone();
        let func = function::<D>(&dev, &SHIFT, kernel)?;
        let src = view(op, s.as_cuda_slice::<S>()?, sv.span())?;
        let mut dst = view_mut(op, d.as_cuda_slice_mut::<D>()?, dv.span())?;
        let (ld_s, ld_d) = (sv.rs, dv.rs);
        let (h, w) = (grid.h, grid.w);
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        b.arg(&src)
            .arg(&ld_s)
            .arg(&mut dst)
            .arg(&ld_d)
            .arg(&c)
            .arg(&m)
            .arg(&h)
            .arg(&w)
            .arg(&taps);
        // SAFETY: m = N·H·W (checked), so every source index stays inside its row (m elements
        // from row r's start r·ld_s, all inside the source view's span, as the destination's
        // rows are in dst's); candle hands dst as `&mut` and the source as another storage
        // (it rejects aliasing for an in-place op).
        unsafe { b.launch(rows_config(c, m)) }.w()?;
        Ok(())
    }
    let taps = Taps::new(op, offsets)?;
    let kernel = match kind {
        Shift::Stack => "shift_stack",
        Shift::Sum => "shift_sum",
    };
    let (d, s) = ((d, dl), (s, sl));
    match (d.0.dtype(), s.0.dtype()) {
        (DType::BF16, DType::F32) if kind == Shift::Sum => {
            run::<f32, bf16>(op, kind, "shift_sum_wide", d, s, (c, m), grid, taps)
        }
        (dd, sd) if dd != sd => Err(crate::ops::cuda::launch::msg(format!(
            "{op} (cuda): a {dd:?} destination from a {sd:?} source (one dtype, or for a sum \
             f32 tap products into bf16)"
        ))),
        (DType::F32, _) => run::<f32, f32>(op, kind, kernel, d, s, (c, m), grid, taps),
        (DType::F64, _) => run::<f64, f64>(op, kind, kernel, d, s, (c, m), grid, taps),
        (DType::BF16, _) => run::<bf16, bf16>(op, kind, kernel, d, s, (c, m), grid, taps),
        (other, _) => Err(crate::ops::cuda::launch::unsupported(op, other)),
    }
}
