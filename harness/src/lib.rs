//! densebench harness library: everything the `densebench` binary does, as modules the
//! integration tests can call. The binary only installs the counting allocator and calls
//! [`cli::main`].

pub mod alloc;
pub mod child;
pub mod cli;
pub mod compare;
pub mod criterion_import;
pub mod device;
pub mod estimates;
pub mod gpu;
pub mod job;
pub mod max_depth;
pub mod measure;
pub mod merge;
pub mod plan;
pub mod plots;
pub mod progress;
pub mod reference;
pub mod report;
pub mod row;
pub mod run;
pub mod shard;
pub mod step_cmd;
pub mod sweep;
