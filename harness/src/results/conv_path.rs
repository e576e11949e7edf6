//! Which 3×3 convolution a GPU row of densebench's bc block was measured with (the tap stack,
//! cuDNN, densebench's direct kernels on tensor cores or in fused multiply-adds), read back
//! from the row's `note`, so that a resumed sweep or a merge never puts rows of two
//! convolutions in one file: `DENSEBENCH_CONV` picks the path, and a row's key does not carry
//! it.

use crate::results::row::Row;
use impls::layer::GpuConv;

/// The convolution a row's `note` names, for an `ok` densebench row of the bc family on a GPU
/// whose step has hand-written layer maths (not `autograd`, which always runs candle's own
/// convolution); `None` for every other row.
pub fn measured_with(row: &Row) -> Option<&'static str> {
    if row.is_peer()
        || !row.is_ok()
        || row.family != "bc"
        || !row.device.starts_with("cuda")
        || row.variant == "autograd"
    {
        return None;
    }
    Some(if row.note.contains("3×3 convolution in cuDNN") {
        "cuDNN"
    } else if row.note.contains("densebench's direct kernels (") {
        if row.note.contains("tensor cores") {
            "densebench's direct kernels on tensor cores"
        } else {
            "densebench's direct kernels in fused multiply-adds"
        }
    } else {
        "the tap stack"
    })
}

/// Whether a row measured with `measured` (see [`measured_with`]) could have come from a run
/// with `conv`: the same path, and no tensor cores under `direct-fma`. A `direct` run whose
/// row says fused multiply-adds is not refused: on a GPU before sm_80, or in IEEE math, that
/// is what `direct` computes.
pub fn compatible(measured: &str, conv: GpuConv) -> bool {
    match conv {
        GpuConv::TapStack => measured == "the tap stack",
        GpuConv::Cudnn => measured == "cuDNN",
        GpuConv::Direct { mma: true } => measured.starts_with("densebench's direct kernels"),
        GpuConv::Direct { mma: false } => {
            measured == "densebench's direct kernels in fused multiply-adds"
        }
    }
}

/// The `DENSEBENCH_CONV` value of `conv`.
pub fn setting(conv: GpuConv) -> &'static str {
    match conv {
        GpuConv::TapStack => "tap-stack",
        GpuConv::Cudnn => "cudnn",
        GpuConv::Direct { mma: true } => "direct",
        GpuConv::Direct { mma: false } => "direct-fma",
    }
}

/// The rows of `held` (a file being resumed) that this run, with `conv`, would not measure
/// the same way: `(key, what they were measured with)`, in file order.
pub fn mismatched<'a>(
    held: impl IntoIterator<Item = &'a Row>,
    conv: GpuConv,
) -> Vec<(&'a str, &'static str)> {
    held.into_iter()
        .filter_map(|r| measured_with(r).map(|m| (r.key.as_str(), m)))
        .filter(|&(_, m)| !compatible(m, conv))
        .collect()
}

/// The convolutions a file must not mix: the tap stack, cuDNN, densebench's direct kernels
/// (their tensor cores and fused multiply-adds together: `direct` computes IEEE rows with the
/// latter).
fn family(measured: &'static str) -> &'static str {
    if measured.starts_with("densebench's direct kernels") {
        "densebench's direct kernels"
    } else {
        measured
    }
}

/// One convolution of [`mixed_on_one_machine`]: which, how many rows, the index of the first.
pub type Convolution = (&'static str, usize, usize);

/// The convolutions (each [`family`]) the GPU bc rows of `rows` (index, row) were measured
/// with: `(which, rows, index of the first)`, in order of first appearance.
fn tally<'a>(rows: impl IntoIterator<Item = (usize, &'a Row)>) -> Vec<Convolution> {
    let mut seen: Vec<Convolution> = Vec::new();
    for (i, r) in rows {
        let Some(m) = measured_with(r) else { continue };
        let f = family(m);
        match seen.iter_mut().find(|(g, _, _)| *g == f) {
            Some((_, n, _)) => *n += 1,
            None => seen.push((f, 1, i)),
        }
    }
    seen
}

/// The convolutions the GPU bc rows of `rows` were measured with, when more than one: `(which,
/// rows, first key)` each, in order of first appearance; empty for rows of one (or none).
pub fn mixed<'a>(rows: impl IntoIterator<Item = &'a Row>) -> Vec<(&'static str, usize, &'a str)> {
    let rows: Vec<&'a Row> = rows.into_iter().collect();
    let convs = tally(rows.iter().copied().enumerate());
    if convs.len() < 2 {
        return Vec::new();
    }
    convs
        .into_iter()
        .map(|(f, n, i)| (f, n, rows[i].key.as_str()))
        .collect()
}

/// The first machine (`device` and `device_desc`) whose GPU bc rows in `rows` were measured
/// with more than one convolution ([`mixed`] per machine: rows of one key from two machines are
/// two measurements, from one machine a repeat): its description and `(which, rows, index of
/// the first in rows)` of each convolution, in order of first appearance. `None` when every
/// machine's rows are of one convolution (or none).
pub fn mixed_on_one_machine(rows: &[Row]) -> Option<(String, Vec<Convolution>)> {
    type Machine<'a> = ((&'a str, &'a str), Vec<(usize, &'a Row)>);
    let mut machines: Vec<Machine> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        if measured_with(r).is_none() {
            continue;
        }
        let machine = (r.device.as_str(), r.device_desc.trim());
        match machines.iter_mut().find(|(k, _)| *k == machine) {
            Some((_, of)) => of.push((i, r)),
            None => machines.push((machine, vec![(i, r)])),
        }
    }
    machines.into_iter().find_map(|((device, desc), of)| {
        let convs = tally(of);
        (convs.len() > 1).then(|| (format!("{device} ({desc})"), convs))
    })
}

/// An `ok` densebench bc row of `variant` on `device` with `note` (the tests' row, here and in
/// `commands::bench_all`).
#[cfg(test)]
pub(crate) fn test_row(variant: &str, device: &str, note: &str) -> Row {
    Row {
        key: format!("{variant}/bc/64/24/12/16/4/32/on/f32/0/{device}"),
        variant: variant.to_string(),
        family: "bc".to_string(),
        device: device.to_string(),
        status: "ok".to_string(),
        framework: "densebench".to_string(),
        note: note.to_string(),
        ..Row::default()
    }
}

#[cfg(test)]
mod tests {
    use super::test_row as row;
    use super::*;

    /// Each path's note, as `measure::step` writes it, is read back as that path; CPU, peer,
    /// `autograd`, mlp and failed rows carry none.
    #[test]
    fn a_rows_convolution_is_read_from_its_note() {
        let tap = row(
            "cat-store-copy",
            "cuda:0",
            "CUDA graph replay; 3×3 tap stack in 1 chunk",
        );
        let cudnn = row(
            "cat-store-copy",
            "cuda:0",
            "3×3 convolution in cuDNN (IMPLICIT_GEMM / ALGO_1 / ALGO_1; workspaces 0 / 0 / 0 B)",
        );
        let tc = row(
            "buffer-recompute-inplace",
            "cuda:0",
            "3×3 convolution in densebench's direct kernels (TF32 tensor cores, weight-gradient \
             partials 663552 B)",
        );
        let fma = row(
            "buffer-recompute-inplace",
            "cuda:0",
            "3×3 convolution in densebench's direct kernels (IEEE FP32 FMA, weight-gradient \
             partials 663552 B)",
        );
        assert_eq!(measured_with(&tap), Some("the tap stack"));
        assert_eq!(measured_with(&cudnn), Some("cuDNN"));
        assert_eq!(
            measured_with(&tc),
            Some("densebench's direct kernels on tensor cores")
        );
        assert_eq!(
            measured_with(&fma),
            Some("densebench's direct kernels in fused multiply-adds")
        );
        let mut none = vec![
            row("cat-store-copy", "cpu", ""),
            row("autograd", "cuda:0", ""),
            row("pytorch-naive", "cuda:0", ""),
        ];
        none[2].framework = "pytorch".to_string();
        let mut mlp = row("cat-store-copy", "cuda:0", "");
        mlp.family = "mlp".to_string();
        let mut failed = row("cat-store-copy", "cuda:0", "");
        failed.status = "error".to_string();
        none.extend([mlp, failed]);
        for r in &none {
            assert_eq!(measured_with(r), None, "{} {}", r.variant, r.device);
        }
    }

    /// A resumed file is refused rows of another path, and `direct-fma` rows of tensor cores;
    /// `direct` takes FMA rows (IEEE math, or a GPU without `mma.sync`).
    #[test]
    fn only_rows_of_the_runs_own_convolution_are_compatible() {
        use GpuConv::{Cudnn, Direct, TapStack};
        let all = [
            "the tap stack",
            "cuDNN",
            "densebench's direct kernels on tensor cores",
            "densebench's direct kernels in fused multiply-adds",
        ];
        let ok = |conv| all.iter().filter(|m| compatible(m, conv)).count();
        assert_eq!(ok(TapStack), 1);
        assert!(compatible(all[0], TapStack));
        assert_eq!(ok(Cudnn), 1);
        assert!(compatible(all[1], Cudnn));
        assert_eq!(ok(Direct { mma: true }), 2);
        assert_eq!(ok(Direct { mma: false }), 1);
        assert!(compatible(all[3], Direct { mma: false }));
        let held = [
            row("cat-store-copy", "cuda:0", "3×3 tap stack in 1 chunk"),
            row("cat-store-copy", "cpu", ""),
        ];
        assert!(mismatched(&held, TapStack).is_empty());
        let m = mismatched(&held, Direct { mma: true });
        assert_eq!(m, vec![(held[0].key.as_str(), "the tap stack")]);
        assert_eq!(setting(Direct { mma: false }), "direct-fma");
    }

    /// A file of one convolution is not mixed (direct's tensor-core and FMA rows are one), a
    /// file of two is, each with its count and first key.
    #[test]
    fn mixed_files_are_found_with_counts_and_first_keys() {
        let tap = row("cat-store-copy", "cuda:0", "3×3 tap stack in 1 chunk");
        let tc = row(
            "buffer-recompute-inplace",
            "cuda:0",
            "3×3 convolution in densebench's direct kernels (TF32 tensor cores, weight-gradient \
             partials 1 B)",
        );
        let mut fma = row(
            "cat-store-copy",
            "cuda:0",
            "3×3 convolution in densebench's direct kernels (IEEE FP32 FMA, weight-gradient \
             partials 1 B)",
        );
        fma.key.push_str("/x");
        let cpu = row("cat-store-copy", "cpu", "");
        assert!(mixed([&tc, &fma, &cpu]).is_empty());
        assert!(mixed([&tap, &cpu]).is_empty());
        assert_eq!(
            mixed([&cpu, &tc, &tap, &fma]),
            vec![
                ("densebench's direct kernels", 2, tc.key.as_str()),
                ("the tap stack", 1, tap.key.as_str()),
            ]
        );
    }

    /// Rows of two convolutions on two machines are not mixed (each machine measured one);
    /// on one machine they are, with the index of each convolution's first row in the file.
    #[test]
    fn a_machine_of_two_convolutions_is_found_with_its_first_rows() {
        let on = |desc: &str, note: &str| {
            let mut r = row("cat-store-copy", "cuda:0", note);
            r.device_desc = desc.to_string();
            r
        };
        let cudnn = "3×3 convolution in cuDNN (…)";
        let tap = "3×3 tap stack in 1 chunk";
        let rows = [
            on("NVIDIA H100", cudnn),
            row("cat-store-copy", "cpu", ""),
            on("NVIDIA H200", tap),
            on("NVIDIA H100", cudnn),
        ];
        assert_eq!(mixed_on_one_machine(&rows), None);
        let mut rows = rows.to_vec();
        rows.push(on("NVIDIA H200 ", cudnn));
        assert_eq!(
            mixed_on_one_machine(&rows),
            Some((
                "cuda:0 (NVIDIA H200)".to_string(),
                vec![("the tap stack", 1, 2), ("cuDNN", 1, 4)]
            ))
        );
    }
}
