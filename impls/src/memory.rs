//! What each variant keeps for backward, declared from the config alone, so memory can be
//! predicted without running anything. A test checks the declaration against the live saved
//! state the step reports at the end of forward.

use crate::block::FEATURES;
use crate::config::{Config, Family};
use crate::probe::{saved_bytes, SavedTensor};
use crate::variant::{Concat, Intermediates, Variant};

/// The tensors `variant` keeps for backward at the end of forward, or `None` for `autograd`
/// (candle's graph keeps every op input; it is not enumerable from outside).
pub fn declare_saved(variant: Variant, cfg: &Config) -> Option<Vec<SavedTensor>> {
    let Variant::Manual(s) = variant else {
        return None;
    };
    let (m, k, b) = (cfg.m(), cfg.growth, cfg.bottleneck());
    let mut out = Vec::new();
    let pieces = s.concat == Concat::Cat && s.intermediates == Intermediates::Recompute;
    if s.concat == Concat::Buffer {
        out.push(SavedTensor::owned(FEATURES, vec![cfg.c_total(), m]));
    }
    if pieces {
        out.push(SavedTensor::owned("pieces.0", vec![cfg.channels, m]));
        for j in 0..cfg.depth {
            out.push(SavedTensor::owned(format!("pieces.{}", j + 1), vec![k, m]));
        }
    }
    for i in 0..cfg.depth {
        let c = cfg.c_in(i);
        let own_or_view = |name: String, shape: Vec<usize>| {
            if s.concat == Concat::Buffer {
                SavedTensor::view(name, shape, FEATURES)
            } else {
                SavedTensor::owned(name, shape)
            }
        };
        if !pieces {
            out.push(own_or_view(format!("layer{i}.x"), vec![c, m]));
        }
        let stats = |out: &mut Vec<SavedTensor>, which: &str, ch: usize| {
            out.push(SavedTensor::owned(
                format!("layer{i}.{which}.mean"),
                vec![ch, 1],
            ));
            out.push(SavedTensor::owned(
                format!("layer{i}.{which}.invstd"),
                vec![ch, 1],
            ));
        };
        match (cfg.family, s.intermediates) {
            (Family::Mlp, _) => {
                let name = format!("layer{i}.out");
                out.push(if pieces {
                    SavedTensor::view(name, vec![k, m], &format!("pieces.{}", i + 1))
                } else {
                    own_or_view(name, vec![k, m])
                });
            }
            (Family::Bc, Intermediates::Store) => {
                stats(&mut out, "bn1", c);
                out.push(SavedTensor::owned(format!("layer{i}.r"), vec![c, m]));
                out.push(SavedTensor::owned(format!("layer{i}.z"), vec![b, m]));
                stats(&mut out, "bn2", b);
                out.push(SavedTensor::owned(format!("layer{i}.s"), vec![b, m]));
            }
            (Family::Bc, Intermediates::Recompute) => {
                stats(&mut out, "bn1", c);
                stats(&mut out, "bn2", b);
            }
        }
    }
    Some(out)
}

/// Bytes of [`declare_saved`], or `None` for `autograd`.
pub fn declared_saved_bytes(variant: Variant, cfg: &Config) -> Option<usize> {
    declare_saved(variant, cfg).map(|s| saved_bytes(&s, cfg.dtype_size()))
}
