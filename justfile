# densebench tasks. Each recipe is a thin wrapper over cargo: copy the command if you do not
# have `just` (install it with `cargo install just`). `just --list` shows them all.
# Extra arguments after a recipe's parameters go to the densebench subcommand, e.g.
# `just bench-all --out results/reference-cpu.csv` or `just compare A B --format markdown`.

# Default sweep into a new results/bench-<timestamp>.csv
bench-all *ARGS:
    cargo run --release -- bench-all {{ARGS}}

# Built-in quick sweep (tiny configs, under a minute)
bench-quick *ARGS:
    cargo run --release -- bench-all --quick {{ARGS}}

# NEW/BASE per metric; exits 1 on a regression beyond 10%, or beyond PCT with `--max-regression PCT`
compare A B *ARGS:
    cargo run --release -- compare {{A}} {{B}} {{ if ARGS =~ '--max-regression' { '' } else { '--max-regression 10' } }} {{ARGS}}

# Every figure of result CSVs (default: the CPU reference and its deep bf16 rows, the H100 and H200 references) as SVG and PNG into plots/
plots *CSVS="results/reference-cpu.csv results/bf16-deep-cpu.csv results/reference-h100.csv results/reference-h200.csv":
    cargo run --release -- plots {{CSVS}} --out plots

# Markdown report of result CSVs (default: the CPU reference and its deep bf16 rows, the H100 and H200 references) into results/REPORT.md,
# linking plots/
report *CSVS="results/reference-cpu.csv results/bf16-deep-cpu.csv results/reference-h100.csv results/reference-h200.csv":
    cargo run --release -- report {{CSVS}} --out results/REPORT.md --plots plots

# PyTorch for the peer rows: uses an importable torch+torchvision, else makes harness/peer/.venv-peer
# (pinned in harness/peer/requirements.txt; ~5 GiB) and builds the CPU allocation counter
peer-setup:
    bash harness/peer/setup.sh

# densebench vs PyTorch on the same case files, side by side (harness/sweeps/versus-pytorch.toml,
# 1 thread and all cores; rows in results/versus-pytorch-*.csv); needs `just peer-setup`; a
# benchmark, not a test
bench-vs-pytorch *ARGS:
    cargo build --release && python3 scripts/bench_vs_pytorch.py {{ARGS}}

# Every test of the workspace
test:
    cargo test --workspace

# rustfmt, clippy and rustdoc, warnings as errors
lint:
    cargo fmt --all --check
    cargo clippy --workspace --all-targets -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

# What CI runs (.ci/run)
ci:
    bash .ci/run

# How deep each variant fits in a memory budget (model, confirmed by measured runs)
max-depth FAMILY="bc" BUDGET="1GiB" *ARGS:
    cargo run --release -- max-depth --family {{FAMILY}} --budget {{BUDGET}} {{ARGS}}

# CUDA from NVIDIA's PyPI wheels into ~/.cache (no root) if missing, then build, clippy-check
# and run the GPU tests with --features cuda (they skip without a GPU); DENSEBENCH_CUDA=12.8 for
# drivers older than 580
check-cuda:
    bash scripts/check-cuda.sh

# --features cuda densebench + GPU test binaries, gzipped into .gpu/ for a GPU machine without Rust
# (run there: bash scripts/gpu-session.sh; see docs/gpu.md)
gpu-pack:
    bash scripts/gpu-pack.sh

# Criterion benches (default set ~5-10 min on 2 cores; DENSEBENCH_BENCH_FULL=1 for the slow
# configurations); extra arguments go to criterion, e.g. `just bench layout` to filter
bench *ARGS:
    cargo bench -p densebench --bench bench_main -- {{ARGS}}

# criterion's estimates (target/criterion) into results/criterion.csv
criterion-import *ARGS:
    cargo run --release -- criterion-import {{ARGS}}

# Real single-node Slurm test (root; apt-installs slurm-wlm, munge); see docs/slurm.md
slurm-test:
    cargo build --release && bash scripts/slurm/single-node-test.sh
