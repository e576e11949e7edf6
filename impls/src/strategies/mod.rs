//! The strategies: the hand-written block driver over the three axes ([`block`]), the append-only
//! feature and gradient buffers it writes in place ([`buffer`]), and the forum's block through
//! candle's autograd ([`autograd`]), the independent reference. Below the one interface
//! ([`crate::step`](mod@crate::step)); above the memory model, the layer maths, the ops and the configs.

pub mod autograd;
pub mod block;
pub mod buffer;
