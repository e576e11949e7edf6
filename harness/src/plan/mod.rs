//! The bottom floor: what is to be measured, before anything runs. Device names, jobs and their
//! settings and keys, sweep files and their expansion, shards and predicted costs.
//!
//! May import: nothing else of the harness (only `impls` and external crates). Everything
//! above may import it.

pub mod bounds;
pub mod device;
pub mod input;
pub mod job;
pub mod shard;
pub mod sweep;
pub mod target;
