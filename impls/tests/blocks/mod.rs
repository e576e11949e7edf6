//! Block configs that more than one test binary builds (a module of each, not a test itself).

use candle_core::DType;
use impls::{Config, Family, Spatial};

/// A bc block wide enough for a split front to have several pieces of each kind (M = 8464:
/// three column chunks, three column groups for dW1; C_i = 170, 172: three blocks for BN1's
/// backward).
pub fn split_front_block(dtype: DType, seed: u64) -> Config {
    Config {
        batch: 1,
        channels: 170,
        growth: 2,
        depth: 2,
        bn_size: 2,
        size: Spatial::square(92),
        activation: true,
        dtype,
        seed,
        family: Family::Bc,
    }
}
