//! The CUDA sides of the op families: the `.cu` sources and their NVRTC options ([`src`]), the
//! PTX cache ([`ptx_cache`]), cuDNN's staging switch ([`staging`]) and the direct
//! convolution's geometry ([`direct`]), which need no CUDA and are checked in every build; and,
//! with the `cuda` feature, the launchers (`bn`, `shift`, `elementwise`, `dense`, `conv`: the
//! family names of [`crate::ops`]; `cudnn`, the 3×3 convolution's, with the `cudnn` feature)
//! and their shared plumbing (`launch`).

#[cfg(feature = "cuda")]
pub(crate) mod bn;
#[cfg(feature = "cuda")]
pub(crate) mod conv;
#[cfg(feature = "cudnn")]
pub(crate) mod cudnn;
#[cfg(feature = "cuda")]
pub(crate) mod dense;
pub mod direct;
#[cfg(feature = "cuda")]
pub(crate) mod elementwise;
#[cfg(feature = "cuda")]
pub(crate) mod launch;
pub mod ptx_cache;
#[cfg(feature = "cuda")]
pub(crate) mod shift;
pub mod src;
pub mod staging;
