//! The operand geometry both devices' kernels agree on: the spatial grid and its 3×3 shifts
//! ([`grid`]), a matrix inside a storage and the column-major GEMM call (`matrix`).

pub mod grid;
pub(crate) mod matrix;
