//! Case files: save a case, load it, step, and compare with the in-memory step; results files
//! round-trip; the saved-state declaration matches what a step really keeps.

use candle_core::{DType, Device};
use impls::case::{load_result, save_result};
use impls::check::compare::compare;
use impls::model::declare_saved;
use impls::{Case, Config, Event, Family, Probe, SavedTensor, Spatial, Variant};

/// The tiny configs of both families, and the tiny bc block on 3x5 and 5x3 maps (a case file's
/// `input` [N, C0, H, W] gives H and W; reading them swapped would change the config).
fn configs() -> Vec<Config> {
    let mut out: Vec<Config> = Family::ALL.into_iter().map(Config::tiny).collect();
    for size in [Spatial::new(3, 5), Spatial::new(5, 3)] {
        out.push(Config {
            size,
            ..Config::tiny(Family::Bc)
        });
    }
    out
}

#[test]
fn case_round_trip_gives_bitwise_the_same_step() {
    let dir = tempfile::tempdir().unwrap();
    for tiny in configs() {
        for dtype in [DType::F32, DType::F64] {
            let cfg = Config {
                dtype,
                seed: 0,
                ..tiny.clone()
            };
            let case = Case::random(&cfg, &Device::Cpu).unwrap();
            let path = dir
                .path()
                .join(format!("{}-{}-{dtype:?}.safetensors", cfg.family, cfg.size));
            case.save(&path).unwrap();
            let loaded = Case::load(&path, None, &Device::Cpu).unwrap();
            assert_eq!(
                loaded.cfg.describe(),
                cfg.describe(),
                "config inferred from the tensors"
            );
            if cfg.family == Family::Bc {
                assert_eq!(loaded.cfg.size, cfg.size, "H and W read from `input`");
            }
            for v in Variant::for_config(&cfg) {
                let a = case.step(v).unwrap();
                let b = loaded.step(v).unwrap();
                assert!(compare(&b, &a).unwrap().overall.bitwise, "{v}");
                let out = dir.path().join("result.safetensors");
                save_result(&a, &out).unwrap();
                let back = load_result(&cfg, &out, &Device::Cpu).unwrap();
                assert!(
                    compare(&back, &a).unwrap().overall.bitwise,
                    "{v} result round trip"
                );
            }
        }
    }
}

struct Saved(Vec<SavedTensor>);
impl Probe for Saved {
    fn event(&mut self, e: Event<'_>) {
        if let Event::ForwardEnd { saved } = e {
            self.0 = saved.to_vec();
        }
    }
}

#[test]
fn declared_saved_state_matches_the_live_one() {
    for cfg in configs() {
        let case = Case::random(&cfg, &Device::Cpu).unwrap();
        for v in Variant::for_config(&cfg) {
            let Some(declared) = declare_saved(v, &cfg) else {
                assert_eq!(v, Variant::Autograd);
                continue;
            };
            let mut probe = Saved(Vec::new());
            impls::step(
                v,
                &cfg,
                &case.params,
                &case.input,
                &case.grad_output,
                &mut probe,
            )
            .unwrap();
            assert_eq!(probe.0, declared, "{v} on {}", cfg.describe());
        }
    }
}
