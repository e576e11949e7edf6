//! densebench harness library: everything the `densebench` binary does, as modules the
//! integration tests can call. The binary only installs the counting allocator and calls
//! [`cli::main`].

pub mod alloc;
pub mod cli;
pub mod compare;
pub mod plots;
pub mod report;
pub mod row;
pub mod run;
pub mod step_cmd;
pub mod sweep;
