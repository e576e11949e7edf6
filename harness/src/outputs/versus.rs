//! The report's "Versus PyTorch" section: per configuration and depth that has PyTorch peer rows,
//! the peer's own rows (peak, time, gradient check, note) and every densebench variant's peak and
//! time as a ratio to each peer variant. A ratio is taken only between ok rows of the same
//! configuration, depth, device, dtype, threads and math; a row whose gradients are out of
//! tolerance or unchecked still gives its ratio, marked, never silently.

use crate::outputs::compare::markdown_table;
use crate::outputs::plots::data::{
    fmt_err, fmt_num, incomparable, mib, ms, peer_label, variant_order, Group,
};
use crate::results::row::Row;
use std::fmt::Write as _;

/// Marks a ratio one of whose rows has gradients outside tolerance.
pub const OUT_OF_TOLERANCE: &str = "†";
/// Marks a ratio one of whose rows carries no gradient check.
pub const UNCHECKED: &str = "‡";

/// The one line a report without peer rows says instead of the section.
pub const NO_PEERS: &str = "No PyTorch peer rows in this result set: `densebench bench-all \
     --peer pytorch` measures them beside densebench's (PyTorch from `just peer-setup`).";

/// `within tolerance`, `out of tolerance †` or `not checked ‡`.
fn grad_cell(r: &Row) -> String {
    match r.grad_ok {
        Some(true) => "within tolerance".to_string(),
        Some(false) => format!("out of tolerance {OUT_OF_TOLERANCE}"),
        None => format!("not checked {UNCHECKED}"),
    }
}

/// The marker a ratio between `a` and `b` carries: `†` when either's gradients are out of
/// tolerance, else `‡` when either's are unchecked, else nothing.
fn marker(a: &Row, b: &Row) -> &'static str {
    if a.grad_ok == Some(false) || b.grad_ok == Some(false) {
        OUT_OF_TOLERANCE
    } else if a.grad_ok.is_none() || b.grad_ok.is_none() {
        UNCHECKED
    } else {
        ""
    }
}

/// One ratio cell: `0.15×` (with its marker), or `–` and why it cannot be taken.
fn ratio_cell(ours: &Row, peer: &Row, value: fn(&Row) -> Option<u64>) -> String {
    ratio_cell_of(ours, value, peer, value)
}

/// [`ratio_cell`] of `ours_value(ours)` over `peer_value(peer)` (e.g. densebench's graph replay
/// time over PyTorch's eager time).
fn ratio_cell_of(
    ours: &Row,
    ours_value: fn(&Row) -> Option<u64>,
    peer: &Row,
    value: fn(&Row) -> Option<u64>,
) -> String {
    if !ours.is_ok() {
        return format!("– ({})", ours.status);
    }
    if !peer.is_ok() {
        return format!("– (PyTorch {})", peer.status);
    }
    if let Some(why) = incomparable(ours, peer) {
        return format!("– ({why})");
    }
    match (ours_value(ours), value(peer)) {
        (Some(a), Some(b)) if b > 0 => {
            let m = marker(ours, peer);
            let r = a as f64 / b as f64;
            if m.is_empty() {
                format!("{r:.2}×")
            } else {
                format!("{r:.2}× {m}")
            }
        }
        _ => "–".to_string(),
    }
}

fn num_cell(v: Option<u64>, unit: fn(u64) -> f64) -> String {
    v.map(|x| fmt_num(unit(x)))
        .unwrap_or_else(|| "–".to_string())
}

/// What a reader of a peer row must know: its note, and why it failed or is out of tolerance.
fn peer_note(r: &Row) -> String {
    let mut parts = Vec::new();
    if !r.note.trim().is_empty() {
        parts.push(r.note.trim().to_string());
    }
    if (!r.is_ok() || r.grad_ok == Some(false)) && !r.error.trim().is_empty() {
        parts.push(r.error.trim().to_string());
    }
    parts.join("; ").replace('\n', " ")
}

/// The peer rows (ok or not) of one group at one depth, in the peer order.
fn peers_at(g: &Group, depth: usize) -> Vec<&Row> {
    let mut rows: Vec<&Row> = g
        .peers
        .iter()
        .chain(g.skipped.iter().filter(|r| r.is_peer()))
        .filter(|r| r.depth == depth)
        .collect();
    let order = variant_order(rows.iter().map(|r| r.variant.as_str()));
    rows.sort_by_key(|r| order.iter().position(|v| *v == r.variant));
    rows
}

/// densebench's rows (ok, then not ok) of one group at one depth, in the variant order.
fn ours_at(g: &Group, depth: usize) -> Vec<&Row> {
    let mut rows = g.at_depth(depth);
    rows.extend(
        g.skipped
            .iter()
            .filter(|r| !r.is_peer() && r.depth == depth),
    );
    rows
}

fn depth_tables(g: &Group, depth: usize, out: &mut String) {
    let peers = peers_at(g, depth);
    let peer_rows: Vec<Vec<String>> = peers
        .iter()
        .map(|p| {
            vec![
                peer_label(&p.variant),
                p.status.clone(),
                p.threads.to_string(),
                p.math.clone(),
                p.execution().to_string(),
                p.compile_ns
                    .map(|ns| format!("{:.1}", ns as f64 / 1e9))
                    .unwrap_or_else(|| "–".into()),
                num_cell(p.peak_bytes, mib),
                num_cell(p.median_ns, ms),
                p.max_rel_err.map(fmt_err).unwrap_or_else(|| "–".into()),
                p.tolerance.map(fmt_err).unwrap_or_else(|| "–".into()),
                if p.is_ok() {
                    grad_cell(p)
                } else {
                    "–".to_string()
                },
                peer_note(p),
            ]
        })
        .collect();
    let _ = writeln!(out, "PyTorch's rows (absolute):\n");
    out.push_str(&markdown_table(
        &[
            "PyTorch",
            "status",
            "threads",
            "math",
            "execution",
            "compile (s)",
            "peak (MiB)",
            "time (ms)",
            "max rel err",
            "tolerance",
            "gradients",
            "note",
        ],
        &peer_rows,
        &[0, 1, 3, 4, 10, 11],
    ));
    let ours = ours_at(g, depth);
    if ours.is_empty() {
        let _ = writeln!(
            out,
            "\nNo densebench row of this configuration at L={depth}: nothing to set against \
             PyTorch.\n"
        );
        return;
    }
    let mut headers: Vec<String> = [
        "densebench",
        "threads",
        "peak (MiB)",
        "time (ms)",
        "gradients",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for p in &peers {
        let l = peer_label(&p.variant);
        headers.push(format!("peak / {l}"));
        headers.push(format!("time / {l}"));
    }
    let rows: Vec<Vec<String>> = ours
        .iter()
        .map(|r| {
            let mut cells = vec![
                format!("`{}`", r.variant),
                r.threads.to_string(),
                num_cell(r.peak_bytes, mib),
                num_cell(r.median_ns, ms),
                if r.is_ok() {
                    grad_cell(r)
                } else {
                    r.status.clone()
                },
            ];
            for p in &peers {
                cells.push(ratio_cell(r, p, |x| x.peak_bytes));
                cells.push(ratio_cell(r, p, |x| x.median_ns));
            }
            cells
        })
        .collect();
    let h: Vec<&str> = headers.iter().map(String::as_str).collect();
    let _ = writeln!(
        out,
        "\ndensebench's rows, peak and time as a ratio to each PyTorch row (below 1: densebench \
         smaller or faster):\n"
    );
    out.push_str(&markdown_table(&h, &rows, &[0, 4]));
    // Every pair of ok rows refused: say once why, and how to get ratios.
    let pairs: Vec<Option<String>> = ours
        .iter()
        .filter(|r| r.is_ok())
        .flat_map(|r| {
            peers
                .iter()
                .filter(|p| p.is_ok())
                .map(move |p| incomparable(r, p))
        })
        .collect();
    if let Some(Some(why)) = pairs.first() {
        if pairs.iter().all(Option::is_some) {
            let _ = writeln!(
                out,
                "\nNo ratio at L={depth}: densebench vs PyTorch {why}; measure both with the same \
                 threads and math."
            );
        }
    }
    let flagged: Vec<String> = ours
        .iter()
        .chain(peers.iter())
        .filter(|r| r.is_ok() && r.grad_ok != Some(true))
        .map(|r| {
            let name = if r.is_peer() {
                peer_label(&r.variant)
            } else {
                format!("`{}`", r.variant)
            };
            match r.grad_ok {
                Some(false) => format!(
                    "{OUT_OF_TOLERANCE} {name}: gradients out of tolerance (max rel err {}{})",
                    r.max_rel_err.map(fmt_err).unwrap_or_else(|| "–".into()),
                    r.tolerance
                        .map(|t| format!(" > {}", fmt_err(t)))
                        .unwrap_or_default()
                ),
                _ => format!("{UNCHECKED} {name}: gradients not checked"),
            }
        })
        .collect();
    if !flagged.is_empty() {
        let _ = writeln!(out);
        for f in flagged {
            let _ = writeln!(out, "- {f}");
        }
    }
    let _ = writeln!(out);
}

/// The "Versus PyTorch" section of the report; one line saying how to get it when no group has
/// a peer row.
pub fn section(groups: &[Group], out: &mut String) {
    let _ = writeln!(out, "## Versus PyTorch\n");
    let peer_rows: Vec<&Row> = groups
        .iter()
        .flat_map(|g| g.peers.iter().chain(g.skipped.iter()))
        .filter(|r| r.is_peer())
        .collect();
    if peer_rows.is_empty() {
        let _ = writeln!(out, "{NO_PEERS}\n");
        return;
    }
    let mut versions: Vec<&str> = peer_rows
        .iter()
        .map(|r| r.framework_version.as_str())
        .filter(|v| !v.is_empty())
        .collect();
    versions.sort_unstable();
    versions.dedup();
    let versions = if versions.is_empty() {
        "(version not recorded)".to_string()
    } else {
        versions.join("; ")
    };
    let _ = writeln!(
        out,
        "PyTorch peer: {versions}. The peer ran torchvision's `_DenseBlock` (bc: naive and \
         `memory_efficient=True`) and the forum's Linear block (mlp: naive and \
         `torch.utils.checkpoint`), the bc blocks also in `channels_last` memory format (module \
         and input converted once, outside the step) where the label ends in `CL`, \
         and the same blocks under `torch.compile` where the rows say `compiled` (default mode, the CPU) or `graph` (`reduce-overhead`: CUDA graphs), on \
         the same case files densebench measures, measured the same way (allocator peak above \
         the baseline, median step, nothing in a timed step but the step) and checked against \
         densebench's f64 reference; a compiled row's compile time is outside its step. A ratio \
         is densebench / PyTorch at the same configuration and depth, taken only between ok rows \
         with the same device, dtype, threads and math, and like execution (an eager step with \
         an eager or compiled one, a CUDA-graph replay with a CUDA-graph replay; else – and \
         why); {OUT_OF_TOLERANCE} marks a ratio one of whose rows has gradients out of tolerance, \
         {UNCHECKED} one whose gradients were not checked.\n"
    );
    for g in groups {
        let mut depths: Vec<usize> = g
            .peers
            .iter()
            .chain(g.skipped.iter().filter(|r| r.is_peer()))
            .map(|r| r.depth)
            .collect();
        depths.sort_unstable();
        depths.dedup();
        for d in depths {
            let _ = writeln!(out, "### {} L={d}\n", g.label);
            let _ = writeln!(out, "{} · seed {}\n", g.device_label, g.key.seed);
            if let Some(line) = default_math_line(&g.key.family, &g.key.device, &g.key.math) {
                let _ = writeln!(out, "{line}\n");
            }
            depth_tables(g, d, out);
        }
    }
}

/// On a GPU, which math a PyTorch user gets by default for this block, and whether this table
/// is in it: cuDNN convolutions may use TF32 by default (`torch.backends.cudnn.allow_tf32`,
/// true), matmuls may not (`torch.backends.cuda.matmul.allow_tf32`, false). Both sides of every
/// ratio run the table's math; `None` on the CPU (no TF32 there) and for an unknown family.
fn default_math_line(family: &str, device: &str, math: &str) -> Option<String> {
    if !device.starts_with("cuda") {
        return None;
    }
    let (default, why) = match family {
        "bc" => (
            "tf32",
            "its 3×3 and 1×1 convolutions run in cuDNN, which PyTorch lets use TF32 by default \
             (`torch.backends.cudnn.allow_tf32 = True`)",
        ),
        "mlp" => (
            "ieee",
            "its Linear layers are matmuls, which PyTorch keeps in full FP32 by default \
             (`torch.backends.cuda.matmul.allow_tf32 = False`)",
        ),
        _ => return None,
    };
    let this = if math == default {
        "this table is in that math"
    } else {
        "this table is not: both sides here run"
    };
    Some(format!(
        "Math: `{math}` on both sides. PyTorch's default for this block is `{default}`: {why}; \
         {this}{}.",
        if math == default {
            String::new()
        } else {
            format!(" `{math}`")
        }
    ))
}

/// The report's "CUDA graph replay" section ([`Row::cuda_graph_median_ns`], docs/gpu.md "CUDA
/// graphs"): per configuration, each densebench row that has a graph timing, its eager and
/// graph medians, the graph time over the eager one, and over each PyTorch peer row of the same
/// depth (PyTorch's eager step, as the peer runs), with the markers and refusals of the ratios
/// above. Nothing when no row has a graph timing.
pub fn graph_section(groups: &[Group], out: &mut String) {
    let graph = |r: &Row| r.cuda_graph_median_ns();
    let timed: Vec<(&Group, Vec<&Row>)> = groups
        .iter()
        .map(|g| (g, g.ok.iter().filter(|r| graph(r).is_some()).collect()))
        .filter(|(_, rows): &(&Group, Vec<&Row>)| !rows.is_empty())
        .collect();
    if timed.is_empty() {
        return;
    }
    let _ = writeln!(out, "## CUDA graph replay\n");
    let _ = writeln!(
        out,
        "The whole training step captured once as a CUDA graph and replayed; a timing is \
         given only where the replayed results compared with the reference bit for bit as the \
         eager step's did. The report's other time columns are the eager step's. Ratios to \
         PyTorch are to its eager step.\n"
    );
    for (g, mut rows) in timed {
        let _ = writeln!(out, "### {}\n", g.label);
        let order = variant_order(rows.iter().map(|r| r.variant.as_str()));
        rows.sort_by_key(|r| (order.iter().position(|v| *v == r.variant), r.depth));
        let peers = g.peer_variants();
        let mut headers: Vec<String> = ["variant", "L", "eager ms", "graph ms", "graph / eager"]
            .map(String::from)
            .to_vec();
        headers.extend(peers.iter().map(|p| format!("graph / {}", peer_label(p))));
        let table: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                let mut cells = vec![
                    format!("`{}`", r.variant),
                    r.depth.to_string(),
                    num_cell(r.median_ns, ms),
                    num_cell(graph(r), ms),
                    ratio_cell_of(r, graph, r, |x| x.median_ns),
                ];
                for p in &peers {
                    cells.push(
                        peers_at(g, r.depth)
                            .into_iter()
                            .find(|q| &q.variant == p)
                            .map_or("–".to_string(), |q| {
                                ratio_cell_of(r, graph, q, |x| x.median_ns)
                            }),
                    );
                }
                cells
            })
            .collect();
        let h: Vec<&str> = headers.iter().map(String::as_str).collect();
        let _ = writeln!(out, "{}", markdown_table(&h, &table, &[0]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outputs::plots::data::group_rows;

    fn row(variant: &str, framework: &str, peak: u64, time: u64, grad_ok: Option<bool>) -> Row {
        Row {
            variant: variant.to_string(),
            framework: framework.to_string(),
            status: "ok".to_string(),
            family: "bc".to_string(),
            depth: 16,
            threads: 1,
            math: "ieee".to_string(),
            device: "cpu".to_string(),
            dtype: "f32".to_string(),
            peak_bytes: Some(peak),
            median_ns: Some(time),
            grad_ok,
            ..Row::default()
        }
    }

    fn render(rows: &[Row]) -> String {
        let (groups, _) = group_rows(rows);
        let mut out = String::new();
        section(&groups, &mut out);
        out
    }

    #[test]
    fn a_gpu_table_says_which_math_pytorch_users_get_by_default() {
        assert_eq!(default_math_line("bc", "cpu", "ieee"), None);
        let bc_tf32 = default_math_line("bc", "cuda:0", "tf32").unwrap_or_default();
        assert!(
            bc_tf32.contains("default for this block is `tf32`"),
            "{bc_tf32}"
        );
        assert!(bc_tf32.contains("this table is in that math"), "{bc_tf32}");
        let bc_ieee = default_math_line("bc", "cuda:0", "ieee").unwrap_or_default();
        assert!(
            bc_ieee.contains("is not: both sides here run `ieee`"),
            "{bc_ieee}"
        );
        let mlp = default_math_line("mlp", "cuda:1", "ieee").unwrap_or_default();
        assert!(mlp.contains("default for this block is `ieee`"), "{mlp}");
        assert!(mlp.contains("matmul.allow_tf32 = False"), "{mlp}");
    }

    #[test]
    fn without_peers_one_line_says_how_to_get_them() {
        let md = render(&[row("cat-store-copy", "densebench", 4, 4, Some(true))]);
        assert_eq!(md, format!("## Versus PyTorch\n\n{NO_PEERS}\n\n"));
    }

    #[test]
    fn ratios_are_marked_or_refused_never_silent() {
        let mut other_threads = row("buffer-store-copy", "densebench", 10, 10, Some(true));
        other_threads.threads = 2;
        let rows = [
            // 300 / 400 = 0.75 peak, 600 / 200 = 3 time: a clean ratio.
            row("cat-store-copy", "densebench", 300, 600, Some(true)),
            // A densebench row out of tolerance: its ratio is marked.
            row("cat-store-inplace", "densebench", 100, 100, Some(false)),
            other_threads,
            row("pytorch-naive", "pytorch", 400, 200, Some(true)),
        ];
        let md = render(&rows);
        assert!(
            md.contains("| `cat-store-copy` | 1 | ") && md.contains("| 0.75× | 3.00× |"),
            "{md}"
        );
        assert!(md.contains("| 0.25× † | 0.50× † |"), "{md}");
        assert!(md.contains("– (2 vs 1 threads)"), "{md}");
        assert!(md.contains("† `cat-store-inplace`: gradients out of tolerance"));
    }

    #[test]
    fn a_table_of_refused_ratios_says_why_once() {
        let mut ours = row("cat-store-copy", "densebench", 3, 6, Some(true));
        ours.threads = 2;
        let md = render(&[ours, row("pytorch-naive", "pytorch", 4, 4, Some(true))]);
        assert!(
            md.contains("No ratio at L=16: densebench vs PyTorch 2 vs 1 threads"),
            "{md}"
        );
    }

    #[test]
    fn a_failed_peer_gives_no_ratio() {
        let mut oom = row("pytorch-naive", "pytorch", 0, 0, None);
        oom.status = "oom".to_string();
        oom.peak_bytes = None;
        oom.median_ns = None;
        oom.error = "out of memory".to_string();
        let md = render(&[row("cat-store-copy", "densebench", 3, 6, Some(true)), oom]);
        assert!(md.contains("– (PyTorch oom)"), "{md}");
        assert!(
            !md.contains("No ratio at"),
            "an oom is not a mismatch:\n{md}"
        );
        assert!(md.contains("| PyTorch naive | oom |"), "{md}");
        assert!(md.contains("out of memory"), "the reason is shown:\n{md}");
    }
}
