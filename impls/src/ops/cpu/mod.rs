//! What the CPU sides of the op families share: the float type they run on, the pointer their
//! parallel tasks write through, the thread pool and `gemm`'s tuning ([`shared`]); reading candle's storages in a custom op
//! (`storage`).

pub mod shared;
pub(crate) mod storage;
