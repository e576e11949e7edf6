//! What the CPU sides of the op families share: the float type they run on, the pointer their
//! parallel tasks write through, the thread pool and `gemm`'s tuning ([`shared`]); reading candle's storages in a custom op
//! (`storage`); the bf16 dot-product kernel of bf16-operand products ([`bf16_dot`]).

pub mod bf16_dot;
pub mod shared;
pub(crate) mod storage;
