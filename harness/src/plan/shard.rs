//! Splitting a sweep into N deterministic, cost-balanced shards (`bench-all --shard I/N`,
//! `plan --shards N`), and the cost model that balances them.
//!
//! The unit of work a shard gets is a **configuration**: every variant of one config (the key
//! without its variant, [`job::config_key`]) goes to the same shard. Two reasons: the variants
//! of a config are compared with each other, so they must be measured on the same node (a
//! heterogeneous cluster would otherwise mix machines inside one comparison); and the reference
//! of a config (an f64 autograd step, the most expensive single step) is computed once per
//! shard that needs it, so splitting a config would recompute it up to N times.
//!
//! Configurations are assigned greedily, longest predicted cost first, each to the shard where
//! it leaves the least predicted cost (ties: the lower shard index; equal costs: sweep order).
//! This is Graham's LPT rule: the largest shard exceeds the mean by at most the cost of one
//! item. A configuration costing more than a shard's share on its own is the exception: it is
//! split into its jobs (each shard holding part of it computes its reference, and pays for it
//! in the balance). Within a shard, jobs keep the sweep's order (each config shallow to deep).
//!
//! The partition depends only on the sweep's jobs (their keys, configs and step counts), never
//! on the machine, the output file or what is already done, so every array task computes the
//! same split, and `--resume` on a shard filters *after* sharding.

use crate::plan::bounds::MAX_SHARDS;
use crate::plan::job::{self, Job, Settings, Target};
use anyhow::{bail, Context, Result};
use impls::variant::Intermediates;
use impls::{Config, Variant};
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

/// One shard of N, `I/N` on the command line. Shards count from 1: `1/3`, `2/3`, `3/3`
/// (so a Slurm array `--array=1-N` passes `$SLURM_ARRAY_TASK_ID` unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShardSpec {
    /// 1-based index, `1 ..= count`.
    pub index: usize,
    pub count: usize,
}

impl FromStr for ShardSpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let (i, n) = s
            .split_once('/')
            .with_context(|| format!("shard `{s}` is not I/N (e.g. 2/3)"))?;
        let index: usize = i
            .trim()
            .parse()
            .with_context(|| format!("shard `{s}`: `{i}` is not a shard number"))?;
        let count: usize = n
            .trim()
            .parse()
            .with_context(|| format!("shard `{s}`: `{n}` is not a shard count"))?;
        if count == 0 {
            bail!("shard `{s}`: the shard count must be at least 1");
        }
        if count > MAX_SHARDS {
            bail!("shard `{s}`: the shard count must be at most {MAX_SHARDS}, got {count}");
        }
        if index == 0 || index > count {
            bail!(
                "shard `{s}`: shards count from 1, so I must be in 1..={count} (a Slurm array \
                 starting at 0 needs `--shard $((SLURM_ARRAY_TASK_ID + 1))/N`)"
            );
        }
        Ok(ShardSpec { index, count })
    }
}

impl fmt::Display for ShardSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Fixed cost of one child process in FLOP-equivalents: process start, case construction and
/// result parsing take about 20 ms whatever the config (the quick sweep's 49 tiny jobs run in
/// 1.4 s on 2 cores), which at the tens of GFLOP/s a CPU reaches is about 1e9 FLOP. It makes
/// tiny configs balance by count and large ones by FLOPs.
pub const CHILD_OVERHEAD_FLOP: f64 = 1e9;
/// candle's autograd runs every op through its graph with NCHW convolutions: about 3× the
/// hand-written variants' time on the same FLOPs (the factor the sweep's ETA always used).
pub const AUTOGRAD_FACTOR: f64 = 3.0;
/// Recompute variants redo BN → ReLU → Conv1×1 (mlp: the Linear) in backward: about a third
/// of the forward work again, a step of 3 forward-equivalents becomes about 4.
pub const RECOMPUTE_FACTOR: f64 = 4.0 / 3.0;
/// f64 matmuls run at about half the f32 rate (half the SIMD lanes).
pub const F64_FACTOR: f64 = 2.0;

fn dtype_factor(cfg: &Config) -> f64 {
    if cfg.dtype == candle_core::DType::F64 {
        F64_FACTOR
    } else {
        1.0
    }
}

/// Extra fixed cost of a peer child: starting Python and importing torch + torchvision
/// (measured: `pytorch_peer.py --check` took 12.7 s wall, 7.2 s CPU, on 2 cores shared with
/// builds), about 500 × densebench's 20 ms child start.
pub const PEER_START_FLOP: f64 = 500.0 * CHILD_OVERHEAD_FLOP;

/// Relative speed of a variant on the same FLOPs (1 for the hand-written store variants; a
/// peer's naive variant is taken as 1 too: PyTorch naive took 0.8× densebench's naive time on
/// BC-100 L=16, issue 12).
pub fn target_factor(target: Target) -> f64 {
    match target {
        Target::Densebench(v) => variant_factor(v),
        Target::Peer(p) if p.recomputes() => RECOMPUTE_FACTOR,
        Target::Peer(_) => 1.0,
    }
}

/// Relative speed of a densebench variant on the same FLOPs (1 for the hand-written store
/// variants).
pub fn variant_factor(variant: Variant) -> f64 {
    match variant {
        Variant::Autograd => AUTOGRAD_FACTOR,
        Variant::Manual(st) if st.intermediates == Intermediates::Recompute => RECOMPUTE_FACTOR,
        Variant::Manual(_) => 1.0,
    }
}

/// Predicted cost of one job in FLOP-equivalents: the FLOP model (`impls::memory::flops`) of
/// one step × (measured + warm-up steps) × [`variant_factor`] × the dtype's factor, plus
/// [`CHILD_OVERHEAD_FLOP`]. A relative estimate for balancing and the ETA, not a prediction
/// of seconds. A peer's job adds [`PEER_START_FLOP`].
pub fn job_cost(variant: impl Into<Target>, cfg: &Config, s: &Settings) -> f64 {
    let target = variant.into();
    let steps = (s.steps + s.warmup) as f64;
    let start = if target.is_peer() {
        CHILD_OVERHEAD_FLOP + PEER_START_FLOP
    } else {
        CHILD_OVERHEAD_FLOP
    };
    impls::memory::flops(cfg) as f64 * steps * target_factor(target) * dtype_factor(cfg) + start
}

/// Predicted cost of a config's reference (computed once per shard that holds the config, if
/// not cached): one autograd step in f64, in one child process.
pub fn reference_cost(cfg: &Config) -> f64 {
    impls::memory::flops(cfg) as f64 * AUTOGRAD_FACTOR * F64_FACTOR + CHILD_OVERHEAD_FLOP
}

/// The configuration part of a job's key (`family/N/…/device`): what a shard is made of.
pub fn group_key(j: &Job) -> String {
    job::config_key(&j.cfg, j.settings.device)
}

/// A configuration of a sweep: its jobs (indices into the sweep's jobs, in sweep order) and
/// their total predicted cost, its reference included.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub config_key: String,
    pub jobs: Vec<usize>,
    pub cost: f64,
}

/// The jobs grouped by configuration, in order of first appearance.
pub fn groups(jobs: &[Job]) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for (i, j) in jobs.iter().enumerate() {
        let key = group_key(j);
        let g = match at.get(&key) {
            Some(&g) => g,
            None => {
                at.insert(key.clone(), out.len());
                out.push(Group {
                    config_key: key,
                    jobs: Vec::new(),
                    cost: reference_cost(&j.cfg),
                });
                out.len() - 1
            }
        };
        out[g].jobs.push(i);
        out[g].cost += j.cost;
    }
    out
}

/// One shard of a partition: the indices of its jobs (sweep order), the configurations it
/// holds (indices into [`groups`]) and its predicted cost, references included.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Part {
    pub jobs: Vec<usize>,
    pub configs: std::collections::BTreeSet<usize>,
    pub cost: f64,
}

/// A unit of assignment: a whole configuration, or one job of a split one.
struct Item {
    group: usize,
    jobs: Vec<usize>,
    /// The jobs' cost, without the reference.
    cost: f64,
}

/// Splits `jobs` into `count` parts (LPT over configurations, see the module docs). Part `i`
/// (0-based) is shard `i + 1`. Some parts are empty when there are fewer configs than shards.
///
/// A configuration that alone costs more than a shard's share (the mean) makes its shard the
/// straggler. Such a configuration may be split into `ceil(cost / mean)` chunks of its jobs;
/// every shard holding a chunk computes the config's reference and is charged for it. Both
/// partitions (whole configurations only, and with the oversized ones split) are computed and
/// the one whose largest shard is cheaper is kept (on a tie, whole configurations).
pub fn partition(jobs: &[Job], count: usize) -> Vec<Part> {
    let whole = partition_with(jobs, count, false);
    let split = partition_with(jobs, count, true);
    let max = |ps: &[Part]| ps.iter().map(|p| p.cost).fold(0.0, f64::max);
    if max(&split) < max(&whole) {
        split
    } else {
        whole
    }
}

/// Greedy (LPT) assignment of `costs` (indices, costs) into `k` bins; each bin sorted.
fn lpt_bins(mut items: Vec<(usize, f64)>, k: usize) -> Vec<Vec<usize>> {
    items.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut bins: Vec<(f64, Vec<usize>)> = vec![(0.0, Vec::new()); k.max(1)];
    for (i, c) in items {
        let t = (0..bins.len())
            .min_by(|&a, &b| bins[a].0.total_cmp(&bins[b].0).then(a.cmp(&b)))
            .unwrap_or(0);
        bins[t].0 += c;
        bins[t].1.push(i);
    }
    bins.into_iter()
        .map(|(_, mut b)| {
            b.sort_unstable();
            b
        })
        .filter(|b| !b.is_empty())
        .collect()
}

fn partition_with(jobs: &[Job], count: usize, split: bool) -> Vec<Part> {
    let count = count.max(1);
    let gs = groups(jobs);
    let refs: Vec<f64> = gs
        .iter()
        .map(|g| reference_cost(&jobs[g.jobs[0]].cfg))
        .collect();
    let mean = gs.iter().map(|g| g.cost).sum::<f64>() / count as f64;
    let mut items: Vec<Item> = Vec::new();
    for (gi, g) in gs.iter().enumerate() {
        let chunks = if split && g.cost > mean && mean > 0.0 {
            ((g.cost / mean).ceil() as usize).min(g.jobs.len())
        } else {
            1
        };
        let costs = g.jobs.iter().map(|&j| (j, jobs[j].cost)).collect();
        for chunk in lpt_bins(costs, chunks) {
            items.push(Item {
                group: gi,
                cost: chunk.iter().map(|&j| jobs[j].cost).sum(),
                jobs: chunk,
            });
        }
    }
    // Longest (with its reference) first; equal costs keep sweep order (the sort is stable).
    // `total_cmp` is a total order, so the split never depends on float comparison quirks.
    items.sort_by(|a, b| (b.cost + refs[b.group]).total_cmp(&(a.cost + refs[a.group])));
    let mut parts = vec![Part::default(); count];
    for item in items {
        let after = |p: &Part| {
            p.cost
                + item.cost
                + if p.configs.contains(&item.group) {
                    0.0
                } else {
                    refs[item.group]
                }
        };
        let target = (0..count)
            .min_by(|&a, &b| {
                after(&parts[a])
                    .total_cmp(&after(&parts[b]))
                    .then(a.cmp(&b))
            })
            .unwrap_or(0);
        let p = &mut parts[target];
        p.cost = after(p);
        p.configs.insert(item.group);
        p.jobs.extend_from_slice(&item.jobs);
    }
    for p in &mut parts {
        p.jobs.sort_unstable();
    }
    parts
}

/// The jobs of one shard, in sweep order.
pub fn select(jobs: Vec<Job>, spec: ShardSpec) -> Vec<Job> {
    let parts = partition(&jobs, spec.count);
    let mine: std::collections::HashSet<usize> = parts
        .get(spec.index - 1)
        .map(|p| p.jobs.iter().copied().collect())
        .unwrap_or_default();
    jobs.into_iter()
        .enumerate()
        .filter(|(i, _)| mine.contains(i))
        .map(|(_, j)| j)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_specs_parse_one_based() {
        let s: ShardSpec = "2/3"
            .parse()
            .map_err(|e: anyhow::Error| e.to_string())
            .unwrap();
        assert_eq!((s.index, s.count), (2, 3));
        assert_eq!(s.to_string(), "2/3");
        for bad in ["0/3", "4/3", "1/0", "3", "a/3", "1/b", "", "1/100000000"] {
            assert!(bad.parse::<ShardSpec>().is_err(), "{bad} parsed");
        }
        // The 0-based mistake names the fix.
        let e = "0/3".parse::<ShardSpec>().err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("count from 1")));
    }

    #[test]
    fn variant_factors_order_the_costs() {
        // autograd is the slowest path, recomputation costs more than storing.
        let recompute = Variant::parse("buffer-recompute-copy").unwrap();
        assert!(variant_factor(Variant::Autograd) > variant_factor(recompute));
        assert!(variant_factor(recompute) > variant_factor(Variant::NAIVE));
    }
}
