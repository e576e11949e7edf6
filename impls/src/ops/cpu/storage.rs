//! Reading candle's storages inside a CPU custom op, shared by every op family: an operand's
//! elements as a contiguous slice of its dtype (or the op's dtype or layout error), the
//! one-input kernel pattern ([`map1`]), tensors an op carries besides its operands, and whether
//! a tensor lives where the families' kernels run ([`has_kernels`]).

use crate::ops::cpu::shared::Elem;
use crate::ops::layout::matrix::Mat;
use candle_core::{CpuStorage, Layout, Tensor};

pub(crate) fn slice<'a, T>(v: &'a [T], l: &Layout, op: &str) -> candle_core::Result<&'a [T]> {
    let (a, b) = l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "{op}: operand must be contiguous, got strides {:?}",
            l.stride()
        ))
    })?;
    Ok(&v[a..b])
}

/// The feature elements (see [`Elem`]) of `s` within layout `l`, or the op's dtype or layout
/// error.
pub(crate) fn features<'a, E: Elem>(
    s: &'a CpuStorage,
    l: &Layout,
    op: &str,
) -> candle_core::Result<&'a [E]> {
    slice(E::in_storage(s).ok_or_else(|| bad_dtype(op))?, l, op)
}

/// A CPU operand of an op: its storage and its layout.
pub(crate) type Operand<'a> = (&'a CpuStorage, &'a Layout);

pub(crate) fn bad_dtype(op: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{op}: operands must all be f32, all f64, or bf16 features with f32 tables"
    ))
}

/// A one-input kernel written once, generic over the feature type (candle's `Map1` pattern),
/// its output in the compute type ([`Elem::Acc`]): [`map1`] does the dtype dispatch and the
/// layout checks.
pub(crate) trait Kernel1 {
    const NAME: &'static str;
    fn run<E: Elem>(&self, x: &[E], rows: usize, cols: usize) -> Vec<E::Acc>;
}

pub(crate) fn map1<K: Kernel1>(
    k: &K,
    s: &CpuStorage,
    l: &Layout,
) -> candle_core::Result<CpuStorage> {
    fn go<K: Kernel1, E: Elem>(
        k: &K,
        s: &CpuStorage,
        l: &Layout,
    ) -> candle_core::Result<CpuStorage> {
        let (rows, cols) = l.shape().dims2()?;
        let x = features::<E>(s, l, K::NAME)?;
        Ok(E::Acc::storage(k.run(x, rows, cols)))
    }
    match s {
        CpuStorage::F32(_) => go::<K, f32>(k, s, l),
        CpuStorage::F64(_) => go::<K, f64>(k, s, l),
        CpuStorage::BF16(_) => go::<K, half::bf16>(k, s, l),
        _ => Err(bad_dtype(K::NAME)),
    }
}

/// The CPU elements of a tensor an op carries besides its operands (a lock guard on its storage
/// and its layout), or an error naming the op and where the tensor lives.
pub(crate) fn carried<'a>(
    op: &str,
    t: &'a Tensor,
) -> candle_core::Result<(
    impl std::ops::Deref<Target = candle_core::Storage> + 'a,
    &'a Layout,
)> {
    let (s, l) = t.storage_and_layout();
    if !matches!(&*s, candle_core::Storage::Cpu(_)) {
        return Err(candle_core::Error::Msg(format!(
            "{op}: operand on {:?}, the others on the CPU",
            t.device().location()
        )));
    }
    Ok((s, l))
}

/// The CPU storage behind a guard of [`carried`].
pub(crate) fn cpu_of(s: &candle_core::Storage) -> &CpuStorage {
    match s {
        candle_core::Storage::Cpu(c) => c,
        // `carried` checked the device
        _ => unreachable!("carried() returns CPU storages only"),
    }
}

/// The error for a carried tensor that is not on the CUDA device of the op's operands.
#[cfg(feature = "cuda")]
pub(crate) fn not_on_cuda(op: &str, what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("{op}: {what} not on the operands' CUDA device"))
}

/// Whether `t` lives where the fused kernels run: the CPU, or a CUDA device with the `cuda`
/// feature (without it no CUDA tensor can exist). Others take the `generic_*` path.
pub(crate) fn has_kernels(t: &Tensor) -> bool {
    t.device().is_cpu() || (cfg!(feature = "cuda") && t.device().is_cuda())
}

/// Whether `t` is 2-D rows of unit column stride ([`Mat::rows_of`]'s test: a contiguous map
/// or a column range of a wider one; its storage bounds are checked when the kernel runs).
pub(crate) fn unit_column_stride(t: &Tensor) -> bool {
    Mat::rows_of(t.layout(), usize::MAX, "", "").is_ok()
}
