//! densebench-impls: every way of implementing a DenseNet dense block, each computing one
//! training step with a hand-written backward (or candle's autograd), behind one interface.
//!
//! The crate is built in floors; a module imports only from floors below its own (checked by
//! `harness/tests/layers.rs`), never back up through this root:
//!
//! - [`case`]: safetensors case and result files, each checked from its header before its data
//!   are read; it runs a case through the interface below.
//! - [`step`](mod@step): the one interface the harness drives.
//! - [`strategies`]: the block driver over the strategy axes, the append buffer and its
//!   gradient, and the autograd reference.
//! - [`model`]: the memory model: what each variant keeps for backward and the schedule
//!   (tap chunks, split front) that bounds its peak, predicted from the config.
//! - [`layer`]: the layer maths, forward and hand-written backward of every op, written once.
//! - [`ops`]: the kernels by op family, CPU and CUDA side by side, picked by device.
//! - [`config`]: families, sizes, spatial shape, parameters, variants as points on the axes.
//! - [`check`]: what a step returns, the probes it calls, gradient comparison.
//! - [`error`]: the crate's one error type.
//!
//! The re-exports below are this crate's front for its users (the harness, tests, examples);
//! the crate's own modules import by full path.

pub mod case;
pub mod check;
pub mod config;
pub mod error;
pub mod layer;
pub mod model;
pub mod ops;
pub mod step;
pub mod strategies;

pub use case::Case;
pub use check::probe::{Event, NoProbe, Probe, SavedTensor};
pub use check::result::StepResult;
pub use config::params::Params;
pub use config::spatial::Spatial;
pub use config::variant::{Concat, Intermediates, Relu, Strategy, Variant};
pub use config::{Config, Family};
pub use error::{Error, Result};
pub use step::step;
