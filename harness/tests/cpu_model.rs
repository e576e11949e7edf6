//! The CPU description both sides of a comparison write into `device_desc`: densebench's
//! `cpu_model_from` and the PyTorch peer's `cpu_model_from` give the same string for the same
//! /proc/cpuinfo, with the vector ISA that decides which kernels ran (issue 41: rows from an
//! AMD EPYC and an Intel Xeon, both reported by VMs as bare family names, must be told apart).

use densebench::measure::device::{cpu_has_amx_from, cpu_model_from};
use std::path::Path;
use std::process::Command;

const AVX512: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 avx512f avx512bw\n\nprocessor\t: 1\nmodel name\t: AMD EPYC\n";
const AVX2: &str = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nflags\t\t: fpu sse2 avx avx2 fma\n";
const PLAIN: &str = "processor\t: 0\nmodel name\t: QEMU Virtual CPU\nflags\t\t: fpu sse2\n";
const NO_MODEL: &str = "processor\t: 0\nflags\t\t: avx512f\n";
const AMX: &str = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n";

#[test]
fn the_description_carries_the_widest_vector_isa() {
    assert_eq!(cpu_model_from(AVX512).as_deref(), Some("AMD EPYC, AVX-512"));
    assert_eq!(
        cpu_model_from(AVX2).as_deref(),
        Some("Intel(R) Xeon(R) CPU @ 2.20GHz, AVX2")
    );
    assert_eq!(cpu_model_from(PLAIN).as_deref(), Some("QEMU Virtual CPU"));
    assert_eq!(cpu_model_from(NO_MODEL), None);
    // `avx512f` as a substring of another flag is not the flag
    let fake = "model name\t: X\nflags\t\t: avx512fx avx2\n";
    assert_eq!(cpu_model_from(fake).as_deref(), Some("X, AVX2"));
    // AMX's bf16 tiles (oneDNN's bf16 kernels there, not densebench's) are named after the ISA
    assert_eq!(
        cpu_model_from(AMX).as_deref(),
        Some("Intel(R) Xeon(R) Platinum 8480+, AVX-512, AMX")
    );
    assert!(cpu_has_amx_from(AMX));
    for text in [AVX512, AVX2, PLAIN, NO_MODEL] {
        assert!(!cpu_has_amx_from(text), "{text}");
    }
    // `amx_bf16` as a substring of another flag is not the flag
    assert!(!cpu_has_amx_from("flags\t\t: amx_bf16x avx2\n"));
    assert_eq!(
        cpu_model_from("model name\t: X\nflags\t\t: amx_tile avx2\n").as_deref(),
        Some("X, AVX2")
    );
}

/// The peer's function, run by python3 on the same texts, says exactly the same (the peer
/// module imports torch only when it runs a step, so no PyTorch is needed here).
#[test]
fn the_pytorch_peer_describes_the_cpu_identically() {
    let peer_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("peer");
    let dir = tempfile::tempdir().expect("temp dir");
    for (i, text) in [AVX512, AVX2, PLAIN, NO_MODEL, AMX].iter().enumerate() {
        let file = dir.path().join(format!("cpuinfo-{i}"));
        std::fs::write(&file, text).expect("write cpuinfo");
        let out = Command::new("python3")
            .arg("-c")
            .arg(
                "import sys; sys.path.insert(0, sys.argv[1]); import pytorch_peer; \
                 print(pytorch_peer.cpu_model_from(open(sys.argv[2]).read()))",
            )
            .arg(&peer_dir)
            .arg(&file)
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "python3: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let peer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let ours = cpu_model_from(text).unwrap_or_else(|| "None".to_string());
        assert_eq!(peer, ours, "cpuinfo {i}");
    }
}
