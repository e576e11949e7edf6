//! Element-wise kernels candle-core lacks: in-place ReLU, ReLU backward (copy and in place) and
//! in-place accumulation. Every in-place write is documented on the function that does it.
//!
//! They are candle custom ops so they run on candle tensors and respect views (a narrowed prefix
//! of a buffer is written through its layout's offset). The CPU versions are here; the CUDA
//! versions (NVRTC kernels, `cuda` feature) are in `kernels_cuda.rs`, so the variants keep their
//! in-place memory behaviour on a GPU. Without a port an op returns candle's typed "no cuda
//! implementation" error, never a panic.

use crate::error::{CandleContext, Result};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, InplaceOp1, InplaceOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

/// Elements per rayon task: large enough that scheduling is noise next to the memory traffic.
const PAR_CHUNK: usize = 1 << 15;

fn contiguous_range(l: &Layout, op: &'static str) -> candle_core::Result<(usize, usize)> {
    l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "{op}: operand must be contiguous, got strides {:?}",
            l.stride()
        ))
    })
}

/// A float type the kernels run on.
trait Float: Copy + Send + Sync + PartialOrd + std::ops::Add<Output = Self> + 'static {
    const ZERO: Self;
}
impl Float for f32 {
    const ZERO: Self = 0.0;
}
impl Float for f64 {
    const ZERO: Self = 0.0;
}

/// `x > 0`, false for NaN: ReLU maps NaN to 0 and masks the gradient where the output is NaN.
fn is_positive<T: Float>(x: T) -> bool {
    x > T::ZERO
}

// The loops below are written as selects (`if p { a } else { b }` on values), not as branches
// around a store: ReLU inputs are positive about half the time at random, and a mispredicted
// branch per element made these kernels 4× slower than a plain copy.

fn relu_slice<T: Float>(xs: &mut [T]) {
    xs.par_chunks_mut(PAR_CHUNK).for_each(|c| {
        for x in c {
            *x = if is_positive(*x) { *x } else { T::ZERO };
        }
    });
}

/// `dst[i] = out[i] > 0 ? g[i] : 0`: the ReLU derivative taken from the output, the only thing
/// an in-place ReLU leaves behind.
fn relu_bwd_new<T: Float>(g: &[T], out: &[T]) -> Vec<T> {
    g.par_iter()
        .zip(out.par_iter())
        .with_min_len(PAR_CHUNK)
        .map(|(g, o)| if is_positive(*o) { *g } else { T::ZERO })
        .collect()
}

fn relu_bwd_inplace_slice<T: Float>(g: &mut [T], out: &[T]) {
    g.par_chunks_mut(PAR_CHUNK)
        .zip(out.par_chunks(PAR_CHUNK))
        .for_each(|(g, o)| {
            for (g, o) in g.iter_mut().zip(o) {
                *g = if is_positive(*o) { *g } else { T::ZERO };
            }
        });
}

fn add_assign_slice<T: Float>(dst: &mut [T], src: &[T]) {
    dst.par_chunks_mut(PAR_CHUNK)
        .zip(src.par_chunks(PAR_CHUNK))
        .for_each(|(d, s)| {
            for (d, s) in d.iter_mut().zip(s) {
                *d = *d + *s;
            }
        });
}

fn unsupported(op: &str, s: &CpuStorage) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{op}: dtype {:?} unsupported (f32, f64 only)",
        s.dtype()
    ))
}

struct ReluInplace;
impl InplaceOp1 for ReluInplace {
    fn name(&self) -> &'static str {
        "relu-inplace"
    }
    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> candle_core::Result<()> {
        let (a, b) = contiguous_range(l, self.name())?;
        match s {
            CpuStorage::F32(v) => relu_slice(&mut v[a..b]),
            CpuStorage::F64(v) => relu_slice(&mut v[a..b]),
            other => return Err(unsupported(self.name(), other)),
        }
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &mut candle_core::CudaStorage, l: &Layout) -> candle_core::Result<()> {
        crate::kernels_cuda::relu_inplace(self.name(), s, l)
    }
}

struct ReluBwd;
impl CustomOp2 for ReluBwd {
    fn name(&self) -> &'static str {
        "relu-bwd"
    }
    fn cpu_fwd(
        &self,
        g: &CpuStorage,
        lg: &Layout,
        out: &CpuStorage,
        lo: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (ga, gb) = contiguous_range(lg, self.name())?;
        let (oa, ob) = contiguous_range(lo, self.name())?;
        let res = match (g, out) {
            (CpuStorage::F32(g), CpuStorage::F32(o)) => {
                CpuStorage::F32(relu_bwd_new(&g[ga..gb], &o[oa..ob]))
            }
            (CpuStorage::F64(g), CpuStorage::F64(o)) => {
                CpuStorage::F64(relu_bwd_new(&g[ga..gb], &o[oa..ob]))
            }
            (other, _) => return Err(unsupported(self.name(), other)),
        };
        Ok((res, lg.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        g: &candle_core::CudaStorage,
        lg: &Layout,
        out: &candle_core::CudaStorage,
        lo: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::kernels_cuda::relu_bwd(self.name(), g, lg, out, lo)
    }
}

struct ReluBwdInplace;
impl InplaceOp2 for ReluBwdInplace {
    fn name(&self) -> &'static str {
        "relu-bwd-inplace"
    }
    fn cpu_fwd(
        &self,
        g: &mut CpuStorage,
        lg: &Layout,
        out: &CpuStorage,
        lo: &Layout,
    ) -> candle_core::Result<()> {
        let (ga, gb) = contiguous_range(lg, self.name())?;
        let (oa, ob) = contiguous_range(lo, self.name())?;
        match (g, out) {
            (CpuStorage::F32(g), CpuStorage::F32(o)) => {
                relu_bwd_inplace_slice(&mut g[ga..gb], &o[oa..ob])
            }
            (CpuStorage::F64(g), CpuStorage::F64(o)) => {
                relu_bwd_inplace_slice(&mut g[ga..gb], &o[oa..ob])
            }
            (other, _) => return Err(unsupported(self.name(), other)),
        }
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        g: &mut candle_core::CudaStorage,
        lg: &Layout,
        out: &candle_core::CudaStorage,
        lo: &Layout,
    ) -> candle_core::Result<()> {
        use crate::kernels_cuda::{inplace2, Inplace2};
        inplace2(Inplace2::ReluBwd, self.name(), g, lg, out, lo)
    }
}

struct AddAssign;
impl InplaceOp2 for AddAssign {
    fn name(&self) -> &'static str {
        "add-assign"
    }
    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        ld: &Layout,
        src: &CpuStorage,
        ls: &Layout,
    ) -> candle_core::Result<()> {
        let (da, db) = contiguous_range(ld, self.name())?;
        let (sa, sb) = contiguous_range(ls, self.name())?;
        match (dst, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => {
                add_assign_slice(&mut d[da..db], &s[sa..sb])
            }
            (CpuStorage::F64(d), CpuStorage::F64(s)) => {
                add_assign_slice(&mut d[da..db], &s[sa..sb])
            }
            (other, _) => return Err(unsupported(self.name(), other)),
        }
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        ld: &Layout,
        src: &candle_core::CudaStorage,
        ls: &Layout,
    ) -> candle_core::Result<()> {
        use crate::kernels_cuda::{inplace2, Inplace2};
        inplace2(Inplace2::AddAssign, self.name(), dst, ld, src, ls)
    }
}

fn same_shape(op: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dims() != b.dims() {
        return Err(crate::Error::ShapeMismatch {
            name: format!("{op} operand"),
            expected: a.dims().to_vec(),
            found: b.dims().to_vec(),
        });
    }
    Ok(())
}

/// ReLU in place: **overwrites `x`** with max(x, 0) and returns it. Taking `x` by value means the
/// pre-activation handle is gone; backward must use the output mask ([`relu_bwd`]).
pub fn relu_inplace(x: Tensor) -> Result<Tensor> {
    x.inplace_op1(&ReluInplace).ctx("relu-inplace")?;
    Ok(x)
}

/// ReLU backward into a new tensor: `out > 0 ? g : 0`.
pub fn relu_bwd(g: &Tensor, out: &Tensor) -> Result<Tensor> {
    same_shape("relu-bwd", g, out)?;
    g.apply_op2_no_bwd(out, &ReluBwd).ctx("relu-bwd")
}

/// ReLU backward in place: **overwrites `g`** with `out > 0 ? g : 0` and returns it.
pub fn relu_bwd_inplace(g: Tensor, out: &Tensor) -> Result<Tensor> {
    same_shape("relu-bwd-inplace", &g, out)?;
    g.inplace_op2(out, &ReluBwdInplace)
        .ctx("relu-bwd-inplace")?;
    Ok(g)
}

/// `dst += src`, **writing into `dst`'s storage** (which may be a view of a larger buffer).
pub fn add_assign(dst: &Tensor, src: &Tensor) -> Result<()> {
    same_shape("add-assign", dst, src)?;
    dst.inplace_op2(src, &AddAssign).ctx("add-assign")
}
