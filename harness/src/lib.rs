//! densebench harness library: everything the `densebench` binary does, as modules the
//! integration tests can call. The binary only installs the counting allocator and calls
//! [`cli::main`].
//!
//! Floors, data flowing one way (a floor imports only floors below it; no cycles):
//!
//! ```text
//! cli            parse and dispatch
//! commands/      one file per verb
//! outputs/       compare, report, plots
//! results/       row schema, results store, records, runner, merge
//! measure/       child isolation, meters, devices, references, estimates
//! plan/          devices by name, jobs, sweeps, shards and cost
//! progress       progress display (imports nothing of the crate)
//! ```
//!
//! `harness/tests/layers.rs` fails when an import goes up a floor or a command imports another.

pub mod cli;
pub mod commands;
pub mod measure;
pub mod outputs;
pub mod plan;
pub mod progress;
pub mod results;
