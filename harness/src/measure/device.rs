//! Devices at run time: checking and opening a named device ([`DeviceSpec`], whose name lives in
//! `plan::device`), describing it for the row, synchronising before a clock is read, and reading
//! the memory counters a measurement uses.
//!
//! CUDA availability and descriptions come from [`crate::measure::gpu`] (the `cuda` cargo feature):
//! without it, asking for a CUDA device fails with one clear line ([`NO_CUDA`]), which `run`
//! prints and `bench-all` turns into an `error` row. On CUDA, [`MemoryMeter`] reads the GPU
//! memory meter (`gpu::PoolPeak`, the default pool's `USED_MEM_HIGH`) and measures what the
//! pool charges per allocation ([`MemoryMeter::pool_charges`]) for the row's prediction.

use crate::measure::alloc;
pub use crate::plan::device::{DeviceSpec, NO_CUDA};
use crate::plan::job::Math;
use anyhow::{bail, Context, Result};
use candle_core::Device;
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// What a build and machine can do with a named device: check it, open it, describe it.
pub trait DeviceOps {
    /// Errs, with one line, when this build or machine cannot use the device ([`NO_CUDA`]
    /// without the `cuda` feature).
    fn check_available(&self) -> Result<()>;
    /// The candle device.
    fn open(&self) -> Result<Device>;
    /// What the row's `device_desc` says: CPU model and thread count, or the GPU's description.
    fn describe(&self, threads: usize) -> String;
}

impl DeviceOps for DeviceSpec {
    fn check_available(&self) -> Result<()> {
        match self {
            DeviceSpec::Cpu => Ok(()),
            DeviceSpec::Cuda(n) => crate::measure::gpu::check_available(*n).map(|_| ()),
        }
    }

    fn open(&self) -> Result<Device> {
        self.check_available()?;
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(n) => {
                let dev = Device::new_cuda(*n)
                    .with_context(|| format!("opening candle's device cuda:{n}"))?;
                #[cfg(feature = "cuda")]
                if let Device::Cuda(c) = &dev {
                    // SAFETY: cudarc's event tracking exists to order a buffer's uses across
                    // streams. Every tensor of a densebench process lives on candle's one
                    // stream (its per-thread default stream; nothing here creates another, and
                    // densebench's kernels launch on it), so no use ever crosses streams, and
                    // cudarc waits on these events only in multi-stream mode anyway: tracking
                    // would only cost two event creations per allocation and two destructions
                    // per free, some 2000 driver calls per step of a BC-100 L=16 block (issue
                    // 11: host work is what a GPU step of small kernels spends its time on).
                    // Turned off before any tensor exists.
                    unsafe { c.disable_event_tracking() };
                    // cuBLAS's workspace outside the pool the row's peak is read from (and out
                    // of a captured graph): see `pin_cublas_workspace`.
                    impls::ops::dense::pin_cublas_workspace(c)
                        .with_context(|| format!("giving cuBLAS a fixed workspace on cuda:{n}"))?;
                    // Freed memory stays reserved in the pool between steps, as in PyTorch's
                    // caching allocator: see `keep_pool_reserved`.
                    crate::measure::gpu::keep_pool_reserved(*n)?;
                }
                Ok(dev)
            }
        }
    }

    fn describe(&self, threads: usize) -> String {
        match self {
            DeviceSpec::Cpu => format!("{} ({threads} threads)", cpu_model()),
            DeviceSpec::Cuda(n) => match crate::measure::gpu::check_available(*n) {
                Ok(info) => info.describe(),
                Err(e) => format!("cuda:{n} (unavailable: {e})"),
            },
        }
    }
}

/// The CPU model from /proc/cpuinfo (`model name`) and its widest x86 vector ISA
/// ([`cpu_model_from`]), or the architecture when unreadable.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| cpu_model_from(&text))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// `model name` of a /proc/cpuinfo text, followed by `, AVX-512` (flag `avx512f`) or `, AVX2`
/// where the first processor has it, and by `, AMX` where it has AMX's bf16 tile multiplies
/// (flag `amx_bf16`): virtual machines often report a bare family name (`AMD EPYC`), and the
/// vector ISA is what decides which kernels a CPU row ran — AMX is where PyTorch autocast's
/// oneDNN multiplies bf16 and densebench does not ([`cpu_has_amx`]). The PyTorch peer's
/// `cpu_model()` says the same, so both sides' rows carry one description.
pub fn cpu_model_from(cpuinfo: &str) -> Option<String> {
    let model = cpuinfo_field(cpuinfo, "model name")?;
    let flags: Vec<&str> = cpuinfo_field(cpuinfo, "flags")
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let isa = if flags.contains(&"avx512f") {
        ", AVX-512"
    } else if flags.contains(&"avx2") {
        ", AVX2"
    } else {
        ""
    };
    let amx = if cpu_has_amx_from(cpuinfo) {
        ", AMX"
    } else {
        ""
    };
    Some(format!("{model}{isa}{amx}"))
}

/// Whether this CPU has AMX's bf16 tile multiplies (/proc/cpuinfo flag `amx_bf16`: Intel Xeons
/// from Sapphire Rapids on). PyTorch autocast's oneDNN runs its bf16 products on them there;
/// densebench has no AMX kernel, so a bf16 row beside PyTorch's says so in its `note`.
pub fn cpu_has_amx() -> bool {
    // read once per process: every bf16 CPU row asks
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|text| cpu_has_amx_from(&text))
    })
}

/// [`cpu_has_amx`] of a /proc/cpuinfo text (the first processor's `flags`).
pub fn cpu_has_amx_from(cpuinfo: &str) -> bool {
    cpuinfo_field(cpuinfo, "flags").is_some_and(|v| v.split_whitespace().any(|f| f == "amx_bf16"))
}

/// The value of the first `key : value` line of a /proc/cpuinfo text (the first processor's).
fn cpuinfo_field<'a>(cpuinfo: &'a str, key: &str) -> Option<&'a str> {
    cpuinfo
        .lines()
        .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim())
}

/// The `note` of a bf16 CPU row on a CPU with AMX ([`cpu_has_amx`]).
pub const AMX_NOTE: &str = "this CPU has AMX (amx_bf16): PyTorch autocast's oneDNN multiplies bf16 on it, densebench's kernels do not";

/// Threads the compute libraries use when none are asked for: candle's default (which also
/// reads `RAYON_NUM_THREADS`).
pub fn default_threads() -> usize {
    candle_core::utils::get_num_threads()
}

/// Waits for queued work so a clock read after it measures the work (a no-op on CPU).
pub fn synchronize(device: &Device) -> Result<()> {
    device
        .synchronize()
        .context("synchronising the device before reading the clock")
}

/// Live/peak memory counters of a device, in bytes.
pub enum MemoryMeter {
    /// The counting global allocator (see [`crate::measure::alloc`]).
    CpuAllocator,
    /// The CUDA device's default memory pool high watermark (or a `cuMemGetInfo` sampler where
    /// pools are unsupported), see [`crate::measure::gpu::PoolPeak`]. Read it on the thread that opened
    /// the device, after synchronising.
    Gpu(crate::measure::gpu::PoolPeak),
}

impl MemoryMeter {
    pub fn for_device(spec: DeviceSpec) -> Result<Self> {
        spec.check_available()?;
        if let DeviceSpec::Cuda(n) = spec {
            return Ok(MemoryMeter::Gpu(crate::measure::gpu::PoolPeak::new(n)?));
        }
        if !alloc::installed() {
            bail!(
                "the counting allocator is not this process's global allocator: \
                 measurements must run in the `densebench` binary"
            );
        }
        Ok(MemoryMeter::CpuAllocator)
    }

    /// Live bytes now.
    pub fn current(&self) -> Result<u64> {
        match self {
            MemoryMeter::CpuAllocator => Ok(alloc::current() as u64),
            MemoryMeter::Gpu(p) => p.current(),
        }
    }

    /// Highest live bytes since the last [`MemoryMeter::reset_peak`].
    pub fn peak(&self) -> Result<u64> {
        match self {
            MemoryMeter::CpuAllocator => Ok(alloc::peak() as u64),
            MemoryMeter::Gpu(p) => p.read(),
        }
    }

    pub fn reset_peak(&self) -> Result<()> {
        match self {
            MemoryMeter::CpuAllocator => {
                alloc::reset_peak();
                Ok(())
            }
            MemoryMeter::Gpu(p) => p.reset().map(|_| ()),
        }
    }

    /// What the device's memory pool charges for one allocation of each of `sizes` bytes,
    /// measured: for each size, one tensor of that many bytes allocated alone and the pool's
    /// bytes in use read before and after (synchronised). `None` where the meter is not a
    /// pool (the CPU's counting allocator charges request sizes exactly; the `cuMemGetInfo`
    /// sampler has no per-allocation resolution). Raw: a charge below its request (the meter
    /// would not be what it is taken for) is returned as measured, for the caller to judge
    /// ([`undercharged`]) after it has recorded the numbers.
    pub fn pool_charges(
        &self,
        device: &Device,
        sizes: &BTreeSet<u64>,
    ) -> Result<Option<BTreeMap<u64, u64>>> {
        let MemoryMeter::Gpu(p) = self else {
            return Ok(None);
        };
        if p.source() != crate::measure::gpu::PeakSource::Pool {
            return Ok(None);
        }
        let mut charges = BTreeMap::new();
        for &bytes in sizes {
            let len = usize::try_from(bytes).context("allocation size")?;
            synchronize(device)?;
            let before = self.current()?;
            let t = candle_core::Tensor::zeros(len, candle_core::DType::U8, device)
                .with_context(|| format!("allocating {bytes} B to measure the pool's charge"))?;
            synchronize(device)?;
            let after = self.current()?;
            drop(t);
            synchronize(device)?;
            charges.insert(bytes, after.saturating_sub(before));
        }
        Ok(Some(charges))
    }

    /// Whether this is a GPU's stream-ordered memory pool (not the CPU's allocator, not the
    /// `cuMemGetInfo` sampler): where allocations are stream-ordered, which a CUDA graph
    /// capture records.
    pub fn is_gpu_pool(&self) -> bool {
        matches!(self, MemoryMeter::Gpu(p) if p.source() == crate::measure::gpu::PeakSource::Pool)
    }

    /// Why this meter's peak is less than exact, if it is (a row warning).
    pub fn warning(&self) -> Option<&'static str> {
        match self {
            MemoryMeter::CpuAllocator => None,
            MemoryMeter::Gpu(p) => p.warning(),
        }
    }
}

/// Why measured pool `charges` cannot be taken as the pool's rounding: the first size charged
/// less than its request (`USED_MEM_CURRENT` would then not count this process's allocations
/// as it is taken to), or `None` when every charge is at least its request.
pub fn undercharged(charges: &BTreeMap<u64, u64>) -> Option<String> {
    charges
        .iter()
        .find(|(&bytes, &charged)| charged < bytes)
        .map(|(bytes, charged)| {
            format!(
                "the memory pool's used bytes grew by {charged} B for a {bytes}-B allocation: \
                 USED_MEM_CURRENT does not count this process's allocations as assumed"
            )
        })
}

/// Times a span of a step's queued work on the device itself: on a GPU the host runs ahead of
/// the kernels it queues, so the host's clock at the end of forward says when forward was
/// *queued*, not when it ran. Two CUDA events with timing, recorded on candle's stream at the
/// step's start and at the end of its forward; read after the step's final synchronisation.
/// `None` on the CPU (whose host clock is the work's).
pub struct StreamClock {
    #[cfg(feature = "cuda")]
    stream: std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    #[cfg(feature = "cuda")]
    marks: [candle_core::cuda_backend::cudarc::driver::CudaEvent; 2],
}

impl StreamClock {
    /// A clock for `device`'s stream, `None` on the CPU. Its events are created here, before
    /// the step, so recording them during it is one driver call each.
    pub fn new(device: &Device) -> Result<Option<StreamClock>> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(c) = device {
            use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
            let stream = c.cuda_stream();
            let event = || {
                stream
                    .context()
                    .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(|e| anyhow::anyhow!("creating a timing event: {e:?}"))
            };
            let marks = [event()?, event()?];
            return Ok(Some(StreamClock { stream, marks }));
        }
        let _ = device;
        Ok(None)
    }

    /// Records mark `i` (0: the step's start, 1: the end of its forward) on the stream.
    pub fn mark(&self, i: usize) -> Result<()> {
        #[cfg(feature = "cuda")]
        {
            let m = self.marks.get(i).context("no such timing mark")?;
            m.record(&self.stream)
                .map_err(|e| anyhow::anyhow!("recording a timing event: {e:?}"))?;
        }
        let _ = i;
        Ok(())
    }

    /// Device time from mark 0 to mark 1, in ns (waits for both: call it after the step's
    /// synchronisation).
    pub fn forward_ns(&self) -> Result<u64> {
        #[cfg(feature = "cuda")]
        {
            let ms = self.marks[0]
                .elapsed_ms(&self.marks[1])
                .map_err(|e| anyhow::anyhow!("reading the timing events: {e:?}"))?;
            Ok((f64::from(ms) * 1e6).round().max(0.0) as u64)
        }
        #[cfg(not(feature = "cuda"))]
        bail!("no device clock in a build without CUDA")
    }
}

/// Peak resident set size of this process in bytes (getrusage; Linux reports KiB).
pub fn peak_rss_bytes() -> Option<u64> {
    // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF is always valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return None;
    }
    let kib = u64::try_from(usage.ru_maxrss).ok()?;
    Some(kib * 1024)
}

/// Checks a `--devices` list: no device twice, and `cpu` only alone (two CPU children at once
/// would measure each other's contention, not the variants).
pub fn check_devices(devices: &[DeviceSpec]) -> Result<()> {
    let mut seen = HashSet::new();
    for d in devices {
        if !seen.insert(*d) {
            bail!("--devices lists {d} twice: one child per device");
        }
    }
    if devices.len() > 1 && devices.contains(&DeviceSpec::Cpu) {
        bail!(
            "--devices: `cpu` can only be used alone (concurrent CPU children would share the \
             cores and measure each other); list GPUs, e.g. cuda:0,cuda:1"
        );
    }
    Ok(())
}

/// Sets the process-wide f32 math of candle's GEMMs (convolutions here are GEMMs too): TF32
/// tensor cores for [`Math::Tf32`], full f32 otherwise. A no-op without CUDA support (candle's
/// stand-in backend); [`Math::check`] has already refused `tf32` on the CPU.
pub fn set_math(math: Math) {
    candle_core::cuda::set_gemm_reduced_precision_f32(math == Math::Tf32);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A charge below its request is named (size and charge); charges at or above are fine.
    #[test]
    fn undercharged_names_the_first_size_charged_below_its_request() {
        let fine: BTreeMap<u64, u64> = [(4, 512), (1 << 20, 2 << 20)].into_iter().collect();
        assert_eq!(undercharged(&fine), None);
        let odd: BTreeMap<u64, u64> = [(4, 0), (1000, 0), (4096, 4096)].into_iter().collect();
        let why = undercharged(&odd).unwrap_or_default();
        assert!(why.contains("grew by 0 B for a 4-B allocation"), "{why}");
    }

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse::<DeviceSpec>().ok(), Some(DeviceSpec::Cpu));
        assert_eq!(
            "cuda:1".parse::<DeviceSpec>().ok(),
            Some(DeviceSpec::Cuda(1))
        );
        assert!("gpu".parse::<DeviceSpec>().is_err());
        assert!("cuda:x".parse::<DeviceSpec>().is_err());
        // Without the cuda feature the error is the one documented line.
        let e = DeviceSpec::Cuda(0).open().err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some(NO_CUDA));
    }
}
