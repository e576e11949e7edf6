//! densebench-impls: every way of implementing a DenseNet dense block, each computing one
//! training step with a hand-written backward (or candle's autograd), behind one interface.
//!
//! - [`config`]: families, sizes, validation; [`spatial`]: H × W (`32`, `360x480`);
//!   [`params`]: PyTorch-named parameters.
//! - [`maths`]: the layer maths, written once; [`kernels`]: in-place element-wise ops;
//!   [`fused`]: fused BatchNorm and 3×3-shift kernels; [`dense`]: the CPU Linear/Conv1×1
//!   products, threaded by panels and accumulating in place; [`conv3x3`]: the direct CPU 3×3
//!   convolution; [`shared`]: the float type and shared pointer of these CPU kernels;
//!   [`cuda_src`]: their CUDA sources
//!   (`src/cuda/*.cu`, compiled with NVRTC at first use with the `cuda` feature).
//! - [`buffer`]: the append-only feature buffer and gradient buffer.
//! - [`variant`]: strategies as axes, variants as named points; [`block`]: the hand-written step;
//!   [`autograd`]: the forum's code through candle's autograd.
//! - [`step`](mod@step): the interface the harness drives, [`result`]: what a step returns; [`probe`]:
//!   layer-boundary hooks.
//! - [`compare`]: gradient errors; [`case`]: safetensors case files, each checked from its
//!   header ([`header`]) before its data are read; [`memory`]: what each variant keeps for
//!   backward, predicted from the config.

pub mod autograd;
pub mod block;
pub mod buffer;
pub mod case;
pub mod compare;
pub mod config;
pub mod conv3x3;
#[cfg(feature = "cuda")]
mod cuda_launch;
pub mod cuda_src;
pub mod dense;
#[cfg(feature = "cuda")]
mod dense_cuda;
pub mod error;
pub mod fused;
#[cfg(feature = "cuda")]
mod fused_cuda;
pub mod grid;
pub mod header;
pub mod kernels;
#[cfg(feature = "cuda")]
mod kernels_cuda;
pub mod maths;
mod matrix;
pub mod memory;
pub mod params;
pub mod probe;
pub mod ptx_cache;
pub mod result;
pub mod shared;
mod size;
pub mod spatial;
pub mod step;
pub mod variant;

pub use case::Case;
pub use config::{Config, Family};
pub use error::{Error, Result};
pub use params::Params;
pub use probe::{Event, NoProbe, Probe, SavedTensor};
pub use result::StepResult;
pub use spatial::Spatial;
pub use step::step;
pub use variant::{Concat, Intermediates, Relu, Strategy, Variant};
