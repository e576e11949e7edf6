//! Criterion benches of densebench, in candle's layout: this file only lists the themes, each
//! theme is a module under `benchmarks/`.
//!
//! - `steps`: one training step of every variant on a few canonical configurations, one group
//!   per family and config (`mlp-N4096-C256-k64`, …), `BenchmarkId` = variant and depth.
//! - `layout`: BN+ReLU+Conv1×1 and the concatenation on channel-major `[C, N·H·W]` against NCHW.
//!
//! `cargo bench -p densebench` runs the default set (about 5–10 minutes on 2 cores);
//! `DENSEBENCH_BENCH_FULL=1` adds deeper blocks and every manual variant of DenseNet-BC-100's
//! block; `DENSEBENCH_BENCH_DEVICE=cuda:0` (with `--features cuda`) runs on a GPU.
//! `densebench criterion-import` writes the estimates to results/criterion.csv.

mod benchmarks;

criterion::criterion_main!(benchmarks::steps::benches, benchmarks::layout::benches);
