//! Checking a step: what it returns ([`result`]), the hooks it calls at layer boundaries and the
//! tensors it says it keeps ([`probe`]), and how far two steps' gradients are apart ([`compare`]).
//! The floor below the configs: it imports only the crate's errors.

pub mod compare;
pub mod probe;
pub mod result;
