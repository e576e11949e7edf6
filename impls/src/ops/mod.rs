//! The ops the layer maths calls, one module per op family; each public function picks its
//! kernel by device. On the CPU a family's candle custom op runs its own loops (with the shared
//! machinery of [`cpu`]); on CUDA (`cuda` feature) the same op's `cuda_fwd` launches its twin from
//! [`cuda`] — the same family names there. Both sides share the operand geometry of [`layout`].
//!
//! Floors inside: the families ([`bn`], [`bn_backward`], [`shift`], [`elementwise`], [`dense`], [`conv3x3`]) above [`cpu`]
//! and [`cuda`], which sit side by side (neither imports the other) above [`layout`].

pub mod bn;
pub mod bn_backward;
pub mod conv3x3;
pub mod cpu;
pub mod cuda;
pub mod dense;
pub mod elementwise;
pub mod layout;
pub mod shift;
