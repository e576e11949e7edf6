//! densebench: the benchmark harness binary. It installs the counting allocator (CPU peak
//! memory) and hands over to the library's command line.

/// Every allocation of the process passes through this counter.
#[global_allocator]
static GLOBAL: densebench::measure::alloc::Counting = densebench::measure::alloc::Counting::new();

fn main() -> std::process::ExitCode {
    densebench::cli::main()
}
