//! The top floor: one file per verb of the command line. A command reads its arguments, calls
//! the floors below (`outputs`, `results`, `measure`, `plan`) and prints; it owns no logic other
//! commands need, and no command imports another command.

pub mod bench_all;
pub mod case;
pub mod child;
pub mod compare;
pub mod criterion_import;
pub mod max_depth;
pub mod merge;
pub mod plan;
pub mod plots;
pub mod report;
pub mod run;
pub mod step;
