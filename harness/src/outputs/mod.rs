//! What people read, made only from result rows: comparisons of two result sets, the markdown
//! report (with its versus-PyTorch section) and the figures.
//!
//! May import: `results` (rows) and, where a figure needs a model fact, `measure` and `plan`.
//! Never `commands`.

pub mod compare;
pub mod plots;
pub mod report;
pub mod versus;
