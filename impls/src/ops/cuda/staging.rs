//! How cuDNN's passes meet the channel-major features (the `cudnn` feature's 3×3 convolution,
//! `ops::cuda::cudnn`): the staging switch (`DENSEBENCH_CUDNN_STAGING`), its thread-local
//! override, and where a packed pass keeps its copies in its workspace. Needs no CUDA:
//! checked in every build.

use crate::error::Result;

/// The environment variable that says how cuDNN's passes meet the channel-major features (a
/// `cudnn` build with `DENSEBENCH_CONV=cudnn`): `auto` (the default) each pass on the features
/// where they lie where cuDNN plans it so, else on packed copies; `strided` or `packed` every
/// pass one way (`packed` to check the fallback on a GPU whose cuDNN plans the strided one).
pub const CUDNN_STAGING_ENV: &str = "DENSEBENCH_CUDNN_STAGING";

/// How a cuDNN pass meets its feature operands (`ops::cuda::cudnn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudnnStaging {
    /// On the features where they lie: NCHW descriptors with the channel-major strides.
    Strided,
    /// Through packed NCHW copies of its feature operands and result, made by
    /// `cudnnTransformTensor` in the pass's workspace (counted in it).
    Packed,
}

/// Which stagings a cuDNN plan may use: `None` is `auto` (strided, else packed).
pub type CudnnStagingChoice = Option<CudnnStaging>;

thread_local! {
    static STAGING_OVERRIDE: std::cell::Cell<Option<CudnnStagingChoice>> =
        const { std::cell::Cell::new(None) };
}

/// The stagings a cuDNN plan may use now: the override of [`with_cudnn_staging`] on this
/// thread, else [`CUDNN_STAGING_ENV`]. An error for a value of it other than `auto`,
/// `strided`, `packed` or empty.
pub fn cudnn_staging() -> Result<CudnnStagingChoice> {
    if let Some(choice) = STAGING_OVERRIDE.with(|o| o.get()) {
        return Ok(choice);
    }
    parse_cudnn_staging(crate::config::switch::env_value(CUDNN_STAGING_ENV).as_deref())
}

fn parse_cudnn_staging(value: Option<&str>) -> Result<CudnnStagingChoice> {
    match value.map(str::trim) {
        None | Some("") | Some("auto") => Ok(None),
        Some("strided") => Ok(Some(CudnnStaging::Strided)),
        Some("packed") => Ok(Some(CudnnStaging::Packed)),
        Some(other) => Err(crate::error::Error::InvalidConfig {
            field: CUDNN_STAGING_ENV,
            value: other.to_string(),
            reason: "expected `auto`, `strided` or `packed`, or unset".to_string(),
        }),
    }
}

/// `f` with cuDNN's stagings set to `choice` on this thread (whatever [`CUDNN_STAGING_ENV`]
/// says): the GPU tests run both stagings in one process without touching the environment.
pub fn with_cudnn_staging<R>(choice: CudnnStagingChoice, f: impl FnOnce() -> R) -> R {
    crate::config::switch::scoped(&STAGING_OVERRIDE, Some(choice), f)
}

/// `bytes` rounded up to 256, cuDNN's alignment for the operands a pass keeps in its
/// workspace (`Wᵀ` of the strided data pass, the packed copies).
pub fn workspace_aligned(bytes: usize) -> usize {
    bytes.div_ceil(256) * 256
}

/// Where a packed cuDNN pass keeps its copies in its workspace, in bytes: the `b`-channel
/// tensor at 0, the `k`-channel one at the first return value, the algorithm's own workspace
/// from the second on (each copy of `m` columns of `elem` bytes [`workspace_aligned`]).
pub fn packed_copies_bytes(b: usize, k: usize, m: usize, elem: usize) -> (usize, usize) {
    let first = workspace_aligned(b * m * elem);
    (first, first + workspace_aligned(k * m * elem))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `DENSEBENCH_CUDNN_STAGING`: unset, empty or `auto` lets each pass fall back, `strided`
    /// and `packed` pin every pass, anything else is an error naming the variable and what it
    /// expects; the thread's override wins over the environment and ends with its closure.
    #[test]
    fn the_cudnn_staging_is_read_strictly() {
        for auto in [None, Some(""), Some(" auto ")] {
            assert_eq!(parse_cudnn_staging(auto).unwrap(), None, "{auto:?}");
        }
        assert_eq!(
            parse_cudnn_staging(Some("strided")).unwrap(),
            Some(CudnnStaging::Strided)
        );
        assert_eq!(
            parse_cudnn_staging(Some("packed")).unwrap(),
            Some(CudnnStaging::Packed)
        );
        for bad in ["Packed", "nchw", "1"] {
            let e = parse_cudnn_staging(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains(CUDNN_STAGING_ENV) && e.contains("`strided` or `packed`"),
                "{bad}: {e}"
            );
        }
        let packed = Some(CudnnStaging::Packed);
        let inner = with_cudnn_staging(packed, || {
            let nested = with_cudnn_staging(None, || cudnn_staging().unwrap());
            (nested, cudnn_staging().unwrap())
        });
        assert_eq!(inner, (None, packed));
        assert_eq!(STAGING_OVERRIDE.with(|o| o.get()), None);
    }

    /// The packed copies: each rounded up to 256 bytes, the second after the first, the
    /// algorithm's workspace after both (B = 48, k = 12 of BC-100 on 6×5 maps of 3 images).
    #[test]
    fn packed_copies_are_laid_out_in_aligned_slots() {
        let (b, k, m) = (48, 12, 3 * 6 * 5);
        let (second, algo) = packed_copies_bytes(b, k, m, 4);
        assert_eq!(second, (b * m * 4).div_ceil(256) * 256);
        assert_eq!(second, 17_408);
        assert_eq!(algo, second + 4_352);
        assert_eq!(packed_copies_bytes(1, 1, 1, 2), (256, 512));
        assert_eq!(packed_copies_bytes(2, 2, 64, 2), (256, 512));
    }
}
