//! Bounded fuzz of the case-file loader: random bytes, random JSON behind a correct length, and
//! mutated valid files (bytes flipped, cut, header length rewritten) never panic, and never
//! allocate more than the byte limit given — or, without one, more than the file's own size
//! allows. Every allocation is counted by the global allocator; this binary holds one test so
//! no other test thread allocates while it measures.

use candle_core::{DType, Device};
use impls::case::header::{HEADER_MEMORY_FACTOR, LOAD_OVERHEAD_BYTES};
use impls::{Case, Config, Family, Spatial};
use proptest::prelude::*;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

mod counting;

use counting::{Counting, LIVE, PEAK};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Bytes allocated at the peak of `f`, above what was live when it started.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let out = f();
    (out, PEAK.load(Relaxed) - base)
}

/// What a fuzz case writes to the file.
#[derive(Debug, Clone)]
enum Input {
    /// Arbitrary bytes.
    Random(Vec<u8>),
    /// A correct length prefix, then arbitrary bytes as the "JSON".
    Prefixed(Vec<u8>),
    /// A valid file (`base` picks which), with bytes overwritten, then optionally cut and its
    /// header length rewritten.
    Mutated {
        base: usize,
        edits: Vec<(usize, u8)>,
        cut: Option<usize>,
        header_len: Option<u64>,
    },
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256).prop_map(Input::Random),
        1 => prop::collection::vec(any::<u8>(), 0..256).prop_map(Input::Prefixed),
        4 => (
            0usize..2,
            prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            prop::option::weighted(0.2, any::<usize>()),
            prop::option::weighted(0.1, any::<u64>()),
        )
            .prop_map(|(base, edits, cut, header_len)| Input::Mutated {
                base,
                edits,
                cut,
                header_len,
            }),
    ]
}

fn bytes_of(input: &Input, bases: &[Vec<u8>]) -> Vec<u8> {
    match input {
        Input::Random(b) => b.clone(),
        Input::Prefixed(b) => {
            let mut out = (b.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(b);
            out
        }
        Input::Mutated {
            base,
            edits,
            cut,
            header_len,
        } => {
            let mut b = bases[*base].clone();
            // Edits land in the header (where they matter most) three times out of four.
            let json_end = 8 + u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
            for (i, &(pos, byte)) in edits.iter().enumerate() {
                let span = if i % 4 == 3 { b.len() } else { json_end };
                b[pos % span] = byte;
            }
            if let Some(c) = cut {
                b.truncate(c % (b.len() + 1));
            }
            if let (Some(n), true) = (header_len, b.len() >= 8) {
                b[..8].copy_from_slice(&n.to_le_bytes());
            }
            b
        }
    }
}

fn load(path: &Path, limit: Option<u64>) -> (Result<Case, impls::Error>, usize) {
    peak_of(|| Case::load_with_limit(path, None, &Device::Cpu, limit))
}

#[test]
fn loader_never_panics_nor_allocates_beyond_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let bases: Vec<Vec<u8>> = [
        Config::tiny(Family::Bc),
        Config {
            dtype: DType::F32,
            ..Config::tiny(Family::Mlp)
        },
    ]
    .iter()
    .map(|cfg| {
        let p = dir.path().join("base.safetensors");
        Case::random(cfg, &Device::Cpu).unwrap().save(&p).unwrap();
        std::fs::read(&p).unwrap()
    })
    .collect();
    let path = dir.path().join("fuzz.safetensors");
    // The unmutated files load, and within the limit the loader computes for them; deep
    // blocks too, whose headers (≈ 280 KB and 40 KB for 300 layers) outweigh their tensors.
    let deep: Vec<Vec<u8>> = [Family::Bc, Family::Mlp]
        .into_iter()
        .map(|family| {
            let cfg = Config {
                depth: 300,
                growth: 1,
                size: Spatial::square(2),
                ..Config::tiny(family)
            };
            let p = dir.path().join("deep.safetensors");
            Case::random(&cfg, &Device::Cpu).unwrap().save(&p).unwrap();
            std::fs::read(&p).unwrap()
        })
        .collect();
    for b in bases.iter().chain(&deep) {
        std::fs::write(&path, b).unwrap();
        let (r, peak) = load(&path, None);
        let case = r.expect("a valid file loads");
        let json = u64::from_le_bytes(b[..8].try_into().unwrap());
        let data = b.len() as u64 - 8 - json;
        let charged = data + json * HEADER_MEMORY_FACTOR + LOAD_OVERHEAD_BYTES;
        assert!(
            peak as u64 <= charged,
            "{}: peak {peak} > charged {charged}",
            case.cfg.describe()
        );
        eprintln!(
            "{}: {data} bytes of data, {json} of header, peak {peak}: {:.1} bytes per header byte",
            case.cfg.describe(),
            (peak as f64 - data as f64) / json as f64
        );
    }

    // A deep bc block's header naming only the conv1 weights (20 000 layers, ≈ 1.5 MB of
    // JSON): refused as missing its BatchNorm tensors, within the header's own charge — the
    // list of 200 000 expected tensors (≈ 25 MB) is never built.
    let depth = 20_000;
    let mut header = String::from("{");
    let mut pos = 0usize;
    let mut entry = |name: &str, shape: &str, bytes: usize| {
        header.push_str(&format!(
            r#""{name}":{{"dtype":"F32","shape":{shape},"data_offsets":[{pos},{}]}},"#,
            pos + bytes
        ));
        pos += bytes;
    };
    entry("input", "[2,3,3,3]", 4 * 54);
    // C0 + L·k = 3 + 20 000·2 channels.
    entry("grad_output", "[2,40003,3,3]", 4 * 2 * 40003 * 9);
    entry("denselayer1.conv2.weight", "[2,4,3,3]", 4 * 72);
    for i in 1..=depth {
        entry(&format!("denselayer{i}.conv1.weight"), "[4,3,1,1]", 4 * 12);
    }
    header.pop();
    header.push('}');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + pos, 0);
    std::fs::write(&path, &bytes).unwrap();
    let limit = header.len() as u64 * HEADER_MEMORY_FACTOR + LOAD_OVERHEAD_BYTES;
    let (r, peak) = load(&path, Some(limit));
    assert!(peak as u64 <= limit, "peak {peak} > limit {limit}");
    let e = r.expect_err("norm1 tensors are missing").to_string();
    assert!(
        e.contains("tensor `denselayer1.norm1.weight` is missing"),
        "{e}"
    );

    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        // ~5 ms each (a file written and loaded): about 3 s in all.
        cases: 600,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let loaded = std::cell::Cell::new(0usize);
    runner
        .run(
            &(input(), prop::option::of(0u64..1 << 20)),
            |(input, extra)| {
                let bytes = bytes_of(&input, &bases);
                std::fs::write(&path, &bytes).unwrap();
                // A limit of at least the fixed overhead (real limits are megabytes).
                let limit = extra.map(|e| LOAD_OVERHEAD_BYTES + e);
                let (r, peak) = load(&path, limit);
                let bound = match limit {
                    Some(l) => l,
                    // Without a limit: never more than the file's own bytes allow.
                    None => bytes.len() as u64 * HEADER_MEMORY_FACTOR + LOAD_OVERHEAD_BYTES,
                };
                prop_assert!(
                    peak as u64 <= bound,
                    "peak {} > bound {} for {:?}",
                    peak,
                    bound,
                    input
                );
                match r {
                    Ok(case) => {
                        prop_assert!(case.cfg.validate().is_ok());
                        loaded.set(loaded.get() + 1);
                    }
                    Err(e) => {
                        // Every error names the file.
                        let e = e.to_string();
                        prop_assert!(e.contains("fuzz.safetensors"), "{}", e);
                    }
                }
                Ok(())
            },
        )
        .unwrap();
    // Mutations of the data section leave valid files: some cases must load, or the fuzz is
    // only exercising the first check.
    assert!(loaded.get() > 0, "no fuzz case loaded");
}
