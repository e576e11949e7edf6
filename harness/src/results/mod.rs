//! Results: the row schema (results/README.md), the results store every command reads and
//! writes result CSVs through, turning a measurement into a row, running a sweep's jobs into the
//! store, merging result sets, criterion's estimates as rows, what an output may replace, and
//! which 3×3 convolution a GPU row was measured with.
//!
//! May import: `measure`, `plan` and `progress`. Never `outputs` or `commands`.

pub mod conv_path;
pub mod criterion;
pub mod merge;
pub mod record;
pub mod replace;
pub mod row;
pub mod runner;
pub mod store;
