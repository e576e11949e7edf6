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
//! item. A configuration costing more than a shard's share on its own is the exception: it may
//! be split into chunks of its jobs (each shard holding part of it computes its reference, and
//! pays for it in the balance), but only when that shortens the longest shard ([`partition`]):
//! a split that does not is extra work for nothing.
//! Within a shard, jobs keep the sweep's order (each config shallow to deep).
//!
//! The partition depends only on the sweep's jobs (their keys, configs and step counts), never
//! on the machine, the output file or what is already done, so every array task computes the
//! same split, and `--resume` on a shard filters *after* sharding. It is the same for the same
//! densebench, not promised across versions: the shards of one sweep run one binary.

use crate::plan::bounds::MAX_SHARDS;
use crate::plan::job::{self, Job, Settings, Target};
use anyhow::{bail, Context, Result};
use impls::config::variant::Intermediates;
use impls::{Config, Family, Variant};
use std::collections::{BTreeSet, HashMap};
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
/// candle's autograd on the same FLOPs as the hand-written store variants, per family. Measured
/// on 2 cores of an AMD EPYC (AVX2, 2026-11-28): on BC-100's block (L=16) one autograd step
/// took 20.4 s against 2.0 s for `cat-store-copy` (candle's CPU convolution backward, its
/// `conv_transpose2d` above all; 32.6 s before its BatchNorm took its sums one dimension at a
/// time), on bc-depth's block (N=16, 8×8) 8.2× at L=16 and 9.0× at L=48; on the forum mlp 0.64 s
/// against 0.34 s at L=16 (its Linear layers are the same GEMMs).
pub fn autograd_factor(family: Family) -> f64 {
    match family {
        Family::Bc => 10.0,
        Family::Mlp => 2.0,
    }
}
/// Recompute variants redo BN → ReLU → Conv1×1 (mlp: the Linear) in backward: about a third
/// of the forward work again, a step of 3 forward-equivalents becomes about 4.
pub const RECOMPUTE_FACTOR: f64 = 4.0 / 3.0;
/// f64 matmuls run at about half the f32 rate (half the SIMD lanes).
pub const F64_FACTOR: f64 = 2.0;
/// A bc FLOP (convolutions, BatchNorm, the tap and copy traffic between them) over an mlp FLOP
/// (one GEMM per layer): the default sweep's hand-written rows took 35 ms per GFLOP on bc and
/// 24 on the mlp (2 cores, AMD EPYC, AVX2, 2026-11-28).
pub const BC_FACTOR: f64 = 1.5;

fn dtype_factor(cfg: &Config) -> f64 {
    if cfg.dtype == candle_core::DType::F64 {
        F64_FACTOR
    } else {
        1.0
    }
}

fn family_factor(family: Family) -> f64 {
    match family {
        Family::Bc => BC_FACTOR,
        Family::Mlp => 1.0,
    }
}

/// Extra fixed cost of a peer child: starting Python and importing torch + torchvision
/// (measured: `pytorch_peer.py --check` took 12.7 s wall, 7.2 s CPU, on 2 cores shared with
/// builds), about 500 × densebench's 20 ms child start.
pub const PEER_START_FLOP: f64 = 500.0 * CHILD_OVERHEAD_FLOP;

/// Relative speed of a target on `family`'s FLOPs (1 for the hand-written store variants; a
/// peer's naive variant is taken as 1 too: PyTorch naive took 0.8× densebench's naive time on
/// BC-100 L=16, issue 12).
pub fn target_factor(target: Target, family: Family) -> f64 {
    match target {
        Target::Densebench(v) => variant_factor(v, family),
        Target::Peer(p) if p.recomputes() => RECOMPUTE_FACTOR,
        Target::Peer(_) => 1.0,
    }
}

/// Relative speed of a densebench variant on `family`'s FLOPs (1 for the hand-written store
/// variants).
pub fn variant_factor(variant: Variant, family: Family) -> f64 {
    match variant {
        Variant::Autograd => autograd_factor(family),
        Variant::Manual(st) if st.intermediates == Intermediates::Recompute => RECOMPUTE_FACTOR,
        Variant::Manual(_) => 1.0,
    }
}

/// The steps a measured row runs: warm-up, the untimed probe step (the memory timeline, on
/// densebench's side and the peer's alike) and the timed steps.
pub fn steps_run(s: &Settings) -> usize {
    s.warmup + 1 + s.steps
}

/// Predicted cost of one job in FLOP-equivalents: the FLOP model (`impls::model::flops`) of
/// one step × the steps it runs ([`steps_run`]) × [`target_factor`] × the family's and the
/// dtype's factors, plus [`CHILD_OVERHEAD_FLOP`]. A relative estimate for balancing and the
/// ETA, not a prediction of seconds. A peer's job adds [`PEER_START_FLOP`].
pub fn job_cost(variant: impl Into<Target>, cfg: &Config, s: &Settings) -> f64 {
    let target = variant.into();
    let steps = steps_run(s) as f64;
    let start = if target.is_peer() {
        CHILD_OVERHEAD_FLOP + PEER_START_FLOP
    } else {
        CHILD_OVERHEAD_FLOP
    };
    step_cost(cfg, dtype_factor(cfg)) * steps * target_factor(target, cfg.family) + start
}

/// One step of a hand-written store variant on `cfg` at a dtype's factor, in FLOP-equivalents.
fn step_cost(cfg: &Config, dtype: f64) -> f64 {
    impls::model::flops(cfg) as f64 * family_factor(cfg.family) * dtype
}

/// Predicted cost of a config's reference (computed once per shard that holds the config, if
/// not cached): one step of `variant` in f64, in one child process.
pub fn reference_cost_of(cfg: &Config, variant: Variant) -> f64 {
    step_cost(cfg, F64_FACTOR) * variant_factor(variant, cfg.family) + CHILD_OVERHEAD_FLOP
}

/// The predicted cost of the reference of a configuration of `jobs` (`members`, indices into
/// it): `autograd`'s when the sweep measures `autograd` on it (its author expects it to fit,
/// and its f64 step is what the reference cache computes first), else naive's in f64 (a sweep
/// leaves `autograd` out where it cannot fit, as the default one does at BC-100 L=32/48, and a
/// hand-written reference serves: 10× cheaper on bc). Depends on the sweep's jobs only, so every
/// shard of a sweep computes the same plan.
pub fn reference_cost(jobs: &[Job], members: &[usize]) -> f64 {
    let Some(&first) = members.first() else {
        return 0.0;
    };
    let autograd = members
        .iter()
        .any(|&i| jobs[i].variant == Target::Densebench(Variant::Autograd));
    let variant = if autograd {
        Variant::Autograd
    } else {
        Variant::NAIVE
    };
    reference_cost_of(&jobs[first].cfg, variant)
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
    /// The part of `cost` that is the configuration's reference ([`reference_cost`]).
    pub reference: f64,
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
                    cost: 0.0,
                    reference: 0.0,
                });
                out.len() - 1
            }
        };
        out[g].jobs.push(i);
        out[g].cost += j.cost;
    }
    for g in &mut out {
        g.reference = reference_cost(jobs, &g.jobs);
        g.cost += g.reference;
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

/// How much the search for splits may do beyond the two partitions always computed (whole
/// configurations, and the oversized ones cut to the mean), in chunks placed and shards set
/// up by [`Planner::place`]: a few tenths of a second. Counted, not timed, so the split stays
/// deterministic.
const SEARCH_BUDGET: usize = 1_000_000;

/// How much shorter a split must make the longest shard to be worth the references it adds:
/// a split that shortens it by less (1%; the predicted costs are estimates) is not made.
pub const WORTH_SPLITTING: f64 = 0.01;

/// Splits `jobs` into `count` parts (LPT over configurations, see the module docs). Part `i`
/// (0-based) is shard `i + 1`. Some parts are empty when there are fewer configs than shards
/// and splitting one would not shorten the longest shard.
///
/// A configuration that alone costs more than a shard's share makes its shard the straggler.
/// It may be cut into chunks of its jobs (LPT over its jobs); every shard holding a chunk
/// computes the config's reference and is charged for it. A configuration is split only when
/// that shortens the longest shard (by [`WORTH_SPLITTING`] at least):
///
/// 1. candidates: whole configurations; every configuration above the mean cut into
///    `ceil(cost / mean)` chunks (the rule before); and, for every target shard length below
///    the longest shard of whole configurations at which some configuration's chunk count
///    changes, each configuration cut into as many chunks as that length needs. Of those whose
///    longest shard is within [`WORTH_SPLITTING`] of the shortest, the one with the least
///    total cost wins (the first on a tie: whole configurations first);
/// 2. one chunk more for a configuration of the longest shard, while that shortens it by
///    [`WORTH_SPLITTING`];
/// 3. one chunk less for any split configuration while the longest shard stays within
///    [`WORTH_SPLITTING`] of the shortest found: no split is left that does not shorten it.
///
/// Beyond a fixed budget of search steps (sweeps of many thousands of configurations over thousands of
/// shards) the search stops early, deterministically, with the best partition found.
pub fn partition(jobs: &[Job], count: usize) -> Vec<Part> {
    let count = count.max(1);
    let plan = Planner::new(jobs, count);
    let whole = vec![1; plan.groups.len()];
    let mut budget = SEARCH_BUDGET;
    // Spends the budget for placing `chunks` unless that leaves less than `keep` (kept for the
    // later steps); false when it does.
    let mut spend = |chunks: &[usize], keep: usize| {
        let steps = chunks.iter().sum::<usize>() + count;
        let ok = budget >= steps + keep;
        if ok {
            budget -= steps;
        }
        ok
    };
    // 1. The candidates: whole configurations and the rule before (always), then every target
    // length at which some configuration's chunk count changes (sampled evenly when there are
    // more than the budget allows).
    let first = plan.place(&whole);
    let mean = plan.groups.iter().map(|g| g.cost).sum::<f64>() / count as f64;
    let to_mean: Vec<usize> = plan
        .groups
        .iter()
        .map(|g| {
            if g.cost > mean && mean > 0.0 {
                ((g.cost / mean).ceil() as usize).clamp(1, g.jobs.len())
            } else {
                1
            }
        })
        .collect();
    let mut targets: Vec<f64> = Vec::new();
    for (gi, g) in plan.groups.iter().enumerate() {
        for k in 2..=g.jobs.len() {
            let t = plan.jobs_cost[gi] / k as f64 + plan.refs[gi];
            if t < first.longest() {
                targets.push(t);
            }
        }
    }
    targets.sort_by(|a, b| b.total_cmp(a));
    targets.dedup();
    let room = (SEARCH_BUDGET / 2 / (plan.groups.len() + count)).max(1);
    let stride = targets.len().div_ceil(room).max(1);
    let mut scored = vec![(whole.clone(), first.longest(), first.total())];
    let old = plan.place(&to_mean);
    scored.push((to_mean, old.longest(), old.total()));
    for &t in targets.iter().step_by(stride) {
        let chunks = plan.chunks_for(t);
        // Lower targets cut no configuration into fewer chunks: equal candidates are
        // neighbours (or one of the first two).
        if scored
            .iter()
            .take(2)
            .chain(scored.last())
            .any(|c| c.0 == chunks)
        {
            continue;
        }
        if !spend(&chunks, SEARCH_BUDGET / 2) {
            break;
        }
        let p = plan.place(&chunks);
        scored.push((chunks, p.longest(), p.total()));
    }
    let shortest = scored.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
    let mut chunks = whole;
    let mut least = f64::INFINITY;
    for (c, longest, total) in scored {
        if longest <= shortest * (1.0 + WORTH_SPLITTING) && total < least {
            (chunks, least) = (c, total);
        }
    }
    let mut best = plan.place(&chunks);
    // 2. One chunk more for a configuration of the longest shard, while that shortens it.
    'grow: loop {
        let max = best.longest();
        let mut next: Option<(Vec<usize>, Placement)> = None;
        for g in best.longest_groups() {
            if chunks[g] >= plan.groups[g].jobs.len() {
                continue;
            }
            let mut more = chunks.clone();
            more[g] += 1;
            if !spend(&more, SEARCH_BUDGET / 4) {
                break 'grow;
            }
            let cand = plan.place(&more);
            let shorter = cand.longest() < max * (1.0 - WORTH_SPLITTING);
            let better = |n: &Placement| (cand.longest(), cand.total()) < (n.longest(), n.total());
            if shorter && next.as_ref().is_none_or(|(_, n)| better(n)) {
                next = Some((more, cand));
            }
        }
        match next {
            Some((c, p)) => (chunks, best) = (c, p),
            None => break,
        }
    }
    // 3. One chunk less wherever the longest shard stays within WORTH_SPLITTING of the
    // shortest found (a fixed bound, so that removals do not creep up on it).
    let bound = shortest.min(best.longest()) * (1.0 + WORTH_SPLITTING);
    'prune: loop {
        let mut changed = false;
        for g in 0..chunks.len() {
            if chunks[g] <= 1 {
                continue;
            }
            let mut fewer = chunks.clone();
            fewer[g] -= 1;
            if !spend(&fewer, 0) {
                break 'prune;
            }
            let cand = plan.place(&fewer);
            if cand.longest() <= bound && cand.total() <= best.total() {
                (chunks, best) = (fewer, cand);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    plan.parts(&best)
}

/// Where [`Planner::place`] put each chunk, and the shards' costs.
struct Placement {
    /// Each shard's cost, references included.
    loads: Vec<f64>,
    /// (configuration, its chunk, shard) for every chunk.
    placed: Vec<(usize, usize, usize)>,
    /// The chunk count of each configuration.
    chunks: Vec<usize>,
}

impl Placement {
    fn longest(&self) -> f64 {
        self.loads.iter().copied().fold(0.0, f64::max)
    }

    fn total(&self) -> f64 {
        self.loads.iter().sum()
    }

    /// The configurations of the first longest shard.
    fn longest_groups(&self) -> Vec<usize> {
        let max = self.longest();
        let Some(at) = self.loads.iter().position(|&l| l == max) else {
            return Vec::new();
        };
        let mut gs: Vec<usize> = self
            .placed
            .iter()
            .filter(|p| p.2 == at)
            .map(|p| p.0)
            .collect();
        gs.sort_unstable();
        gs.dedup();
        gs
    }
}

/// One configuration cut into chunks: each chunk's jobs (sweep order) and their cost.
type Cut = std::rc::Rc<Vec<(Vec<usize>, f64)>>;

/// What assigning a sweep's configurations to shards needs: the configurations, their
/// references' costs, their jobs' costs, and each cut of a configuration made so far.
struct Planner<'a> {
    jobs: &'a [Job],
    count: usize,
    groups: Vec<Group>,
    refs: Vec<f64>,
    /// Per configuration, its jobs' cost without the reference.
    jobs_cost: Vec<f64>,
    cuts: std::cell::RefCell<HashMap<(usize, usize), Cut>>,
}

impl<'a> Planner<'a> {
    fn new(jobs: &'a [Job], count: usize) -> Self {
        let groups = groups(jobs);
        let refs: Vec<f64> = groups.iter().map(|g| g.reference).collect();
        let jobs_cost = groups
            .iter()
            .map(|g| g.jobs.iter().map(|&j| jobs[j].cost).sum())
            .collect();
        Planner {
            jobs,
            count,
            groups,
            refs,
            jobs_cost,
            cuts: Default::default(),
        }
    }

    /// The chunk count of each configuration for shards of about `target` (a chunk's jobs and
    /// its reference): one when the whole configuration fits, every job alone at most.
    fn chunks_for(&self, target: f64) -> Vec<usize> {
        (0..self.groups.len())
            .map(|g| {
                let room = target - self.refs[g];
                let n = self.groups[g].jobs.len();
                if self.jobs_cost[g] + self.refs[g] <= target {
                    1
                } else if room <= 0.0 {
                    n
                } else {
                    ((self.jobs_cost[g] / room).ceil() as usize).clamp(1, n)
                }
            })
            .collect()
    }

    /// Configuration `g` cut into `k` chunks (LPT over its jobs), computed once.
    fn cut(&self, g: usize, k: usize) -> Cut {
        let mut cuts = self.cuts.borrow_mut();
        cuts.entry((g, k))
            .or_insert_with(|| {
                let costs = self.groups[g]
                    .jobs
                    .iter()
                    .map(|&j| (j, self.jobs[j].cost))
                    .collect();
                let chunks = lpt_bins(costs, k)
                    .into_iter()
                    .map(|c| {
                        let cost = c.iter().map(|&j| self.jobs[j].cost).sum();
                        (c, cost)
                    })
                    .collect();
                std::rc::Rc::new(chunks)
            })
            .clone()
    }

    /// Greedy (LPT) placement of the configurations, configuration `g` cut into `chunks[g]`
    /// chunks, on the shards: longest chunk (with its reference) first, each to the first
    /// shard where it leaves the least (see the module docs).
    fn place(&self, chunks: &[usize]) -> Placement {
        let refs = &self.refs;
        // (configuration, chunk, the chunk's jobs' cost)
        let mut items: Vec<(usize, usize, f64)> = Vec::new();
        for (g, &k) in chunks.iter().enumerate() {
            for (c, (_, cost)) in self.cut(g, k).iter().enumerate() {
                items.push((g, c, *cost));
            }
        }
        // Longest (with its reference) first; equal costs keep sweep order (the sort is
        // stable). `total_cmp` is a total order, so the split never depends on float
        // comparison quirks.
        items.sort_by(|a, b| (b.2 + refs[b.0]).total_cmp(&(a.2 + refs[a.0])));
        let count = self.count;
        let mut loads = vec![0.0; count];
        // The shards by load (a load is ≥ 0, so its bits order as it does), and the shards
        // holding each configuration so far: an item goes to the least loaded shard without its
        // reference or to one holding it already, found without a pass over every shard.
        let mut by_load: BTreeSet<(u64, usize)> = (0..count).map(|i| (0, i)).collect();
        let mut holders: Vec<Vec<usize>> = vec![Vec::new(); self.groups.len()];
        let mut placed = Vec::with_capacity(items.len());
        for (g, c, cost) in items {
            // The first shard (lowest index) where it leaves the least, as a scan of every
            // shard would find it: the least loaded ones not holding it (cost after them rises
            // with their load), then those holding it.
            let mut best: Option<(f64, usize)> = None;
            let mut consider = |after: f64, i: usize| {
                let better = match best {
                    None => true,
                    Some((b, j)) => after.total_cmp(&b).then(i.cmp(&j)).is_lt(),
                };
                if better {
                    best = Some((after, i));
                }
            };
            let mut first: Option<f64> = None;
            let mut from = (0, 0);
            while let Some(&(bits, i)) = by_load.range(from..).next() {
                if holders[g].contains(&i) {
                    from = (bits, i + 1);
                    continue;
                }
                let after = loads[i] + cost + refs[g];
                if first.is_some_and(|f| after.total_cmp(&f).is_gt()) {
                    break;
                }
                first.get_or_insert(after);
                consider(after, i);
                // The other shards of this load leave as much and come later: past them.
                match bits.checked_add(1) {
                    Some(b) => from = (b, 0),
                    None => break,
                }
            }
            for &h in &holders[g] {
                // `+ 0.0`: the very sum a scan of every shard makes (no reference to pay).
                consider(loads[h] + cost + 0.0, h);
            }
            let Some((least, target)) = best else {
                continue;
            };
            if !holders[g].contains(&target) {
                holders[g].push(target);
            }
            by_load.remove(&(loads[target].to_bits(), target));
            loads[target] = least;
            by_load.insert((least.to_bits(), target));
            placed.push((g, c, target));
        }
        Placement {
            loads,
            placed,
            chunks: chunks.to_vec(),
        }
    }

    /// The shards of a placement.
    fn parts(&self, p: &Placement) -> Vec<Part> {
        let mut parts: Vec<Part> = p
            .loads
            .iter()
            .map(|&cost| Part {
                cost,
                ..Part::default()
            })
            .collect();
        for &(g, c, shard) in &p.placed {
            let cut = self.cut(g, p.chunks[g]);
            parts[shard].configs.insert(g);
            parts[shard].jobs.extend_from_slice(&cut[c].0);
        }
        for part in &mut parts {
            part.jobs.sort_unstable();
        }
        parts
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

    /// A row runs its warm-up, the untimed probe step and its timed steps: one timed step
    /// without warm-up is two steps of work, not one (bc100-deep's rows took twice what the
    /// ETA had counted).
    #[test]
    fn a_row_costs_every_step_it_runs() {
        let cfg = Config::tiny(Family::Bc);
        let settings = |steps, warmup| Settings {
            steps,
            warmup,
            ..Settings::cpu_test(None)
        };
        let cost = |steps, warmup| job_cost(Variant::NAIVE, &cfg, &settings(steps, warmup));
        let step = cost(2, 0) - cost(1, 0);
        assert!(step > 0.0);
        assert!((cost(1, 0) - CHILD_OVERHEAD_FLOP - 2.0 * step).abs() < 1e-6 * step);
        assert!((cost(2, 1) - CHILD_OVERHEAD_FLOP - 4.0 * step).abs() < 1e-6 * step);
        // a reference is one step, in f64, of the variant that computes it
        let reference = reference_cost_of(&cfg, Variant::NAIVE) - CHILD_OVERHEAD_FLOP;
        assert!((reference - step * F64_FACTOR / dtype_factor(&cfg)).abs() < 1e-6 * step);
    }

    /// A shard plans a configuration's reference as `autograd`'s f64 step where the sweep
    /// measures `autograd` on it, else as naive's (where a sweep leaves autograd out, it does
    /// not fit, and neither would its reference): the same plan on every machine.
    #[test]
    fn a_configuration_without_autograd_plans_a_hand_written_reference() {
        let jobs = crate::plan::sweep::parse(
            r#"
[[group]]
family = "bc"
batch = 2
channels = 3
growth = 2
depth = [2, 3]
size = 4
variants = ["autograd", "cat-store-copy"]

[[group]]
family = "bc"
batch = 2
channels = 3
growth = 2
depth = 4
size = 4
variants = ["cat-store-copy", "buffer-recompute-inplace"]
"#,
            "test",
            None,
        )
        .expect("the sweep parses");
        let groups = groups(&jobs);
        assert_eq!(groups.len(), 3);
        for g in &groups {
            let cfg = &jobs[g.jobs[0]].cfg;
            let planned = if cfg.depth == 4 {
                Variant::NAIVE
            } else {
                Variant::Autograd
            };
            let own: f64 = g.jobs.iter().map(|&i| jobs[i].cost).sum();
            let reference = reference_cost_of(cfg, planned);
            assert!(
                (g.cost - own - reference).abs() < 1e-9 * g.cost,
                "{}",
                g.config_key
            );
            assert_eq!(reference_cost(&jobs, &g.jobs), reference);
        }
        // on bc, autograd's reference is dearer than naive's by autograd's factor
        let cfg = &jobs[groups[2].jobs[0]].cfg;
        let step = |v| reference_cost_of(cfg, v) - CHILD_OVERHEAD_FLOP;
        let ratio = step(Variant::Autograd) / step(Variant::NAIVE);
        assert!(
            (ratio - autograd_factor(Family::Bc)).abs() < 1e-9,
            "{ratio}"
        );
    }

    #[test]
    fn variant_factors_order_the_costs() {
        // autograd is the slowest path, recomputation costs more than storing.
        let recompute = Variant::parse("buffer-recompute-copy").unwrap();
        for family in [Family::Bc, Family::Mlp] {
            assert!(variant_factor(Variant::Autograd, family) > variant_factor(recompute, family));
            assert!(variant_factor(recompute, family) > variant_factor(Variant::NAIVE, family));
        }
    }
}
