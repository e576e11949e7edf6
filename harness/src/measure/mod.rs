//! Measuring one job: the counting allocator and the GPU memory meter, devices at run time, the
//! isolated child process (spawning, limits, how it ended), the in-child measured step, the
//! f64 reference results and their cache (with the case files and the peer errors), the PyTorch
//! peer's child process, and the model's estimates.
//!
//! May import: `plan` (and `progress`). Never `results`, `outputs` or `commands`: a
//! measurement knows nothing of rows, files or figures.

pub mod alloc;
pub mod capacity;
pub mod child;
pub mod device;
pub mod estimates;
pub mod gpu;
pub mod graph;
pub mod interrupt;
pub mod peer;
pub mod reference;
pub mod step;
