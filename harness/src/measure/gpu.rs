//! NVIDIA GPU discovery and memory statistics through the CUDA driver API (cudarc).
//!
//! - [`check_available`]: is `cuda:N` usable, and what is it (name, memory, driver and CUDA
//!   versions)? Fails with one line ([`GpuError`]) instead of cudarc's panics.
//! - [`PoolPeak`]: the peak of one measured step. candle allocates through cudarc's
//!   stream-ordered allocator (`cuMemAllocAsync`) whenever the device supports memory pools, so
//!   the device's default pool's `CU_MEMPOOL_ATTR_USED_MEM_HIGH`, reset before the step and read
//!   after synchronising, is the allocator-level peak. Where pools are unsupported, a background
//!   thread samples `cuMemGetInfo` instead and [`PoolPeak::warning`] says so.
//!
//! With the `cuda` feature off every entry point returns [`GpuError::NotBuilt`]; nothing here
//! touches a CUDA library then.

use std::fmt;

/// The one line a CUDA request gets from a build without CUDA support (same text as
/// `device::NO_CUDA`).
pub const NOT_BUILT: &str = "built without CUDA support: rebuild with --features cuda";

/// Interval of the `cuMemGetInfo` fallback sampler: short enough to catch layer-sized
/// transients of a training step (which last milliseconds), long enough to stay off a core.
pub const SAMPLE_INTERVAL: std::time::Duration = std::time::Duration::from_micros(100);

/// The warning a row carries when its GPU peak comes from the sampler.
pub const SAMPLED_WARNING: &str = "device has no memory pools: peak sampled from cuMemGetInfo \
     every 100 us (device-wide: includes the CUDA context, cuBLAS workspaces and other \
     processes; misses transients shorter than the interval)";

/// Why a GPU cannot be used, as one line each. Returned inside `anyhow::Error`; callers that
/// must tell the cases apart (skip a test, mark a row) can `downcast_ref::<GpuError>()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuError {
    /// The binary was built without the `cuda` feature.
    NotBuilt,
    /// The CUDA driver library (libcuda.so) is not installed.
    NoDriver,
    /// The ordinal is out of range (`count` may be 0: no GPU, or no driver kernel module).
    NoDevice { ordinal: usize, count: usize },
    /// A driver call failed: which call, and the driver's name and text for the error.
    Driver { call: &'static str, error: String },
    /// The NVRTC this process loaded (it compiles densebench's kernels to PTX at run time) is of
    /// a newer CUDA than the driver: the driver refuses its PTX
    /// (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`), so every fused kernel would fail.
    NvrtcNewerThanDriver {
        nvrtc: (i32, i32),
        driver: (i32, i32),
    },
}

/// [`GpuError::NvrtcNewerThanDriver`] when NVRTC's CUDA version (if known) is newer than the
/// driver's: PTX from a newer toolkit does not load, minor version compatibility included
/// (NVIDIA's CUDA compatibility guide: it covers binaries, not JIT-compiling newer PTX).
pub fn check_nvrtc_against_driver(
    nvrtc: Option<(i32, i32)>,
    driver: (i32, i32),
) -> std::result::Result<(), GpuError> {
    match nvrtc {
        Some(nvrtc) if nvrtc > driver => Err(GpuError::NvrtcNewerThanDriver { nvrtc, driver }),
        _ => Ok(()),
    }
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::NotBuilt => f.write_str(NOT_BUILT),
            GpuError::NoDriver => {
                f.write_str("no CUDA driver found (libcuda.so could not be loaded)")
            }
            GpuError::NoDevice { ordinal, count } => {
                let devices = if *count == 1 { "device" } else { "devices" };
                write!(
                    f,
                    "device cuda:{ordinal} does not exist ({count} {devices})"
                )
            }
            GpuError::Driver { call, error } => write!(f, "CUDA driver: {call} failed: {error}"),
            GpuError::NvrtcNewerThanDriver { nvrtc, driver } => write!(
                f,
                "the NVRTC library loaded (CUDA {}.{}) is newer than the driver (CUDA {}.{}), \
                 which cannot load the PTX it makes: put the libnvrtc.so of a CUDA {}.{} or older \
                 toolkit first on LD_LIBRARY_PATH",
                nvrtc.0, nvrtc.1, driver.0, driver.1, driver.0, driver.1
            ),
        }
    }
}

impl std::error::Error for GpuError {}

/// What a usable GPU is, for the row and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub ordinal: usize,
    /// e.g. `NVIDIA A100-SXM4-80GB`.
    pub name: String,
    pub total_memory_bytes: u64,
    /// Compute capability (major, minor), e.g. (8, 0).
    pub compute_capability: (i32, i32),
    /// The newest CUDA version the driver supports (`cuDriverGetVersion`), e.g. (12, 4).
    pub driver_cuda_version: (i32, i32),
    /// The driver release from /proc/driver/nvidia/version (e.g. `535.104.05`), if readable.
    pub driver_release: Option<String>,
    /// The toolkit the kernels were built against, from NVRTC (e.g. (11, 8)), if it answers.
    pub toolkit_cuda_version: Option<(i32, i32)>,
    /// Whether the device has stream-ordered memory pools (else [`PoolPeak`] samples).
    pub memory_pools: bool,
}

impl GpuInfo {
    /// One line for the row's `device_desc`: name, capability, memory, driver and CUDA versions.
    pub fn describe(&self) -> String {
        const GIB: f64 = (1u64 << 30) as f64;
        let (cc_major, cc_minor) = self.compute_capability;
        let (drv_major, drv_minor) = self.driver_cuda_version;
        let release = self.driver_release.as_deref().unwrap_or("unknown");
        let toolkit = self
            .toolkit_cuda_version
            .map_or_else(|| "unknown".to_string(), |(a, b)| format!("{a}.{b}"));
        format!(
            "{} (sm_{cc_major}{cc_minor}, {:.1} GiB; driver {release}, CUDA {drv_major}.{drv_minor}; \
             toolkit {toolkit})",
            self.name,
            self.total_memory_bytes as f64 / GIB,
        )
    }
}

/// Parses the driver release from the first line of /proc/driver/nvidia/version: the first
/// word after `Kernel Module` made of digits and dots, e.g. `535.104.05` in
/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023`
/// or `580.159.04` in the open driver's
/// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build …`.
pub fn parse_driver_release(proc_version: &str) -> Option<String> {
    let line = proc_version.lines().next()?;
    let rest = line.split("Kernel Module").nth(1)?;
    rest.split_whitespace()
        .find(|w| {
            w.contains('.')
                && w.chars().all(|c| c.is_ascii_digit() || c == '.')
                && w.chars().next().is_some_and(|c| c.is_ascii_digit())
        })
        .map(str::to_string)
}

/// Where a [`PoolPeak`]'s numbers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeakSource {
    /// The default memory pool's `USED_MEM_HIGH`: exact for everything allocated from the pool.
    Pool,
    /// `cuMemGetInfo` sampled every [`SAMPLE_INTERVAL`]: device-wide and approximate.
    Sampled,
}

#[cfg(not(feature = "cuda"))]
mod imp {
    //! Without the `cuda` feature: every entry point is the typed "not built" error.
    use super::{GpuError, GpuInfo, PeakSource};
    use anyhow::Result;

    pub fn check_available(_ordinal: usize) -> Result<GpuInfo> {
        Err(GpuError::NotBuilt.into())
    }

    /// Uninhabited without CUDA: no value of it can exist.
    pub struct PoolPeak {
        never: std::convert::Infallible,
    }

    impl PoolPeak {
        pub fn new(_ordinal: usize) -> Result<Self> {
            Err(GpuError::NotBuilt.into())
        }
        pub fn source(&self) -> PeakSource {
            match self.never {}
        }
        pub fn reset(&self) -> Result<u64> {
            match self.never {}
        }
        pub fn read(&self) -> Result<u64> {
            match self.never {}
        }
        pub fn current(&self) -> Result<u64> {
            match self.never {}
        }
    }
}

#[cfg(feature = "cuda")]
mod imp {
    //! The CUDA driver calls. cudarc is linked (candle's `dynamic-linking`): a process that runs
    //! at all has libcuda.so.1 loaded, so cudarc's calls cannot panic for a missing library.
    use super::{
        check_nvrtc_against_driver, parse_driver_release, GpuError, GpuInfo, PeakSource,
        SAMPLE_INTERVAL,
    };
    use anyhow::Result;
    use cudarc::driver::{result, sys, DriverError};
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;

    /// The driver's name and text for an error, e.g.
    /// `CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)`.
    fn describe(e: &DriverError) -> String {
        let name = e.error_name().map(|s| s.to_string_lossy().into_owned());
        let text = e.error_string().map(|s| s.to_string_lossy().into_owned());
        match (name, text) {
            (Ok(n), Ok(t)) => format!("{n} ({t})"),
            (Ok(n), Err(_)) => n,
            _ => format!("CUresult {:?}", e.0),
        }
    }

    fn driver(call: &'static str) -> impl Fn(DriverError) -> anyhow::Error {
        move |e| {
            GpuError::Driver {
                call,
                error: describe(&e),
            }
            .into()
        }
    }

    /// Whether the CUDA driver library can be loaded. With cudarc linked (candle's
    /// `dynamic-linking`, the only mode the `cuda` feature builds) the loader has already loaded
    /// it or the process would not have started; the check still guards every driver call so
    /// that a dynamically loading cudarc (which panics without the library) stays safe.
    fn driver_library_present() -> bool {
        ["libcuda.so.1", "libcuda.so"].iter().any(|name| {
            let Ok(c) = std::ffi::CString::new(*name) else {
                return false;
            };
            // SAFETY: dlopen with a valid C string; the handle is closed at once.
            let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
            if handle.is_null() {
                return false;
            }
            // SAFETY: `handle` came from dlopen above.
            unsafe { libc::dlclose(handle) };
            true
        })
    }

    /// `cuInit` and the device count. `CUDA_ERROR_NO_DEVICE` (driver library present, no GPU
    /// or no kernel module) counts as zero devices rather than a driver failure.
    fn init_and_count() -> Result<usize> {
        if !driver_library_present() {
            return Err(GpuError::NoDriver.into());
        }
        match result::init() {
            Ok(()) => {}
            Err(DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE)) => return Ok(0),
            Err(e) => return Err(driver("cuInit")(e)),
        }
        let n = result::device::get_count().map_err(driver("cuDeviceGetCount"))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// The device handle of `cuda:ordinal`, or [`GpuError::NoDevice`].
    fn device(ordinal: usize) -> Result<sys::CUdevice> {
        let count = init_and_count()?;
        let Ok(ord) = i32::try_from(ordinal) else {
            return Err(GpuError::NoDevice { ordinal, count }.into());
        };
        if ordinal >= count {
            return Err(GpuError::NoDevice { ordinal, count }.into());
        }
        result::device::get(ord).map_err(driver("cuDeviceGet"))
    }

    fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
        // SAFETY: `dev` comes from cuDeviceGet after cuInit.
        unsafe { result::device::get_attribute(dev, attr) }.map_err(driver("cuDeviceGetAttribute"))
    }

    fn pools_supported(dev: sys::CUdevice) -> Result<bool> {
        let v = attribute(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        )?;
        Ok(v != 0)
    }

    pub fn check_available(ordinal: usize) -> Result<GpuInfo> {
        let dev = device(ordinal)?;
        let name = result::device::get_name(dev).map_err(driver("cuDeviceGetName"))?;
        // SAFETY: `dev` is valid (above).
        let total =
            unsafe { result::device::total_mem(dev) }.map_err(driver("cuDeviceTotalMem"))?;
        let cc = (
            attribute(
                dev,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            )?,
            attribute(
                dev,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            )?,
        );
        let mut version = 0;
        // SAFETY: cuDriverGetVersion writes one int we own.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(driver("cuDriverGetVersion"))?;
        let driver_release = std::fs::read_to_string("/proc/driver/nvidia/version")
            .ok()
            .and_then(|s| parse_driver_release(&s));
        // The driver encodes 12.4 as 12040.
        let driver_cuda_version = (version / 1000, (version % 1000) / 10);
        // NVRTC's version: the toolkit the process compiles its run-time kernels with.
        let toolkit_cuda_version = impls::ops::cuda::ptx_cache::nvrtc_version();
        // Refused here, before any row: otherwise every fused kernel's module load fails.
        check_nvrtc_against_driver(toolkit_cuda_version, driver_cuda_version)?;
        Ok(GpuInfo {
            ordinal,
            name,
            total_memory_bytes: total as u64,
            compute_capability: cc,
            driver_cuda_version,
            driver_release,
            toolkit_cuda_version,
            memory_pools: pools_supported(dev)?,
        })
    }

    /// The background `cuMemGetInfo` sampler of devices without memory pools.
    struct Sampler {
        stop: Arc<AtomicBool>,
        peak: Arc<AtomicU64>,
        handle: JoinHandle<std::result::Result<(), String>>,
    }

    /// Used bytes of the device (total − free), device-wide. Needs a current context.
    fn used_now() -> std::result::Result<u64, DriverError> {
        let (free, total) = result::mem_get_info()?;
        Ok(total.saturating_sub(free) as u64)
    }

    impl Sampler {
        /// Starts sampling on a thread bound to the device's primary context (candle's).
        fn start(ordinal: usize) -> Result<Self> {
            let dev = device(ordinal)?;
            let stop = Arc::new(AtomicBool::new(false));
            let peak = Arc::new(AtomicU64::new(0));
            let (s, p) = (stop.clone(), peak.clone());
            let handle = std::thread::Builder::new()
                .name(format!("cuda{ordinal}-mem-sampler"))
                .spawn(move || sample(dev, &s, &p))
                .map_err(|e| anyhow::anyhow!("starting the GPU memory sampler thread: {e}"))?;
            Ok(Sampler { stop, peak, handle })
        }

        /// Stops the thread and returns the largest used-bytes value it saw.
        fn finish(self) -> Result<u64> {
            self.stop.store(true, Ordering::Relaxed);
            match self.handle.join() {
                Ok(Ok(())) => Ok(self.peak.load(Ordering::Relaxed)),
                Ok(Err(e)) => anyhow::bail!("GPU memory sampler: {e}"),
                Err(_) => anyhow::bail!("GPU memory sampler thread panicked"),
            }
        }
    }

    /// The sampler thread: binds the primary context, polls until told to stop (and once more
    /// after, so the final state is seen), releases the context.
    fn sample(
        dev: sys::CUdevice,
        stop: &AtomicBool,
        peak: &AtomicU64,
    ) -> std::result::Result<(), String> {
        // SAFETY: `dev` is valid; the retain is paired with the release below.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(|e| describe(&e))?;
        // SAFETY: `ctx` was just retained.
        let run = unsafe { result::ctx::set_current(ctx) }.and_then(|()| loop {
            let done = stop.load(Ordering::Relaxed);
            peak.fetch_max(used_now()?, Ordering::Relaxed);
            if done {
                break Ok(());
            }
            std::thread::sleep(SAMPLE_INTERVAL);
        });
        // SAFETY: pairs the retain above.
        let released = unsafe { result::primary_ctx::release(dev) };
        run.and(released).map_err(|e| describe(&e))
    }

    enum Meter {
        /// The device's default memory pool (the one cuMemAllocAsync uses unless told otherwise).
        Pool(sys::CUmemoryPool),
        /// The sampler, running between `reset` and `read`.
        Sampled {
            ordinal: usize,
            running: RefCell<Option<Sampler>>,
        },
    }

    /// The peak GPU memory of one measured step. Usage:
    /// `let p = PoolPeak::new(n)?; sync; let base = p.reset()?; step; sync; let peak = p.read()?;`
    /// and the step's own peak is `peak - base`. Not `Send` (it holds the driver's pool handle):
    /// create and use it on the thread that opened the candle device.
    pub struct PoolPeak {
        meter: Meter,
    }

    impl PoolPeak {
        /// The meter of `cuda:ordinal`: its default pool, or the sampler where pools are
        /// unsupported (then [`PoolPeak::source`] is [`PeakSource::Sampled`]).
        pub fn new(ordinal: usize) -> Result<Self> {
            let meter = match default_pool(ordinal)? {
                Some(pool) => Meter::Pool(pool),
                None => Meter::Sampled {
                    ordinal,
                    running: RefCell::new(None),
                },
            };
            Ok(PoolPeak { meter })
        }

        pub fn source(&self) -> PeakSource {
            match self.meter {
                Meter::Pool(_) => PeakSource::Pool,
                Meter::Sampled { .. } => PeakSource::Sampled,
            }
        }

        /// Starts a measurement: resets the pool's high watermark to zero (or starts the
        /// sampler) and returns the bytes in use now, the baseline. Synchronise the device
        /// first so that no queued free or allocation lands on the wrong side.
        pub fn reset(&self) -> Result<u64> {
            match &self.meter {
                Meter::Pool(pool) => {
                    let mut zero: u64 = 0;
                    // SAFETY: USED_MEM_HIGH is a cuuint64_t; the driver only accepts 0 for it.
                    unsafe {
                        result::mem_pool::set_attribute(
                            *pool,
                            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                            (&mut zero as *mut u64).cast(),
                        )
                    }
                    .map_err(driver("cuMemPoolSetAttribute(USED_MEM_HIGH)"))?;
                    pool_attr(
                        *pool,
                        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                    )
                }
                Meter::Sampled { ordinal, running } => {
                    if let Some(old) = running.take() {
                        old.finish()?;
                    }
                    let base = used_now().map_err(driver("cuMemGetInfo"))?;
                    running.replace(Some(Sampler::start(*ordinal)?));
                    Ok(base)
                }
            }
        }

        /// Ends a measurement: synchronises the current context (if any) and returns the peak
        /// bytes in use since [`PoolPeak::reset`], never below the bytes in use now.
        pub fn read(&self) -> Result<u64> {
            if let Ok(Some(_)) = result::ctx::get_current() {
                result::ctx::synchronize().map_err(driver("cuCtxSynchronize"))?;
            }
            match &self.meter {
                Meter::Pool(pool) => {
                    use sys::CUmemPool_attribute as A;
                    let high = pool_attr(*pool, A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?;
                    let now = pool_attr(*pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
                    Ok(high.max(now))
                }
                Meter::Sampled { running, .. } => {
                    let now = used_now().map_err(driver("cuMemGetInfo"))?;
                    let peak = match running.take() {
                        Some(s) => s.finish()?,
                        None => now,
                    };
                    Ok(peak.max(now))
                }
            }
        }

        /// Bytes in use now (pool: allocated from the pool; sampled: device-wide used).
        pub fn current(&self) -> Result<u64> {
            match &self.meter {
                Meter::Pool(pool) => pool_attr(
                    *pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                ),
                Meter::Sampled { .. } => used_now().map_err(driver("cuMemGetInfo")),
            }
        }
    }

    /// Makes the default memory pool of `cuda:ordinal` keep what it has reserved
    /// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` = `u64::MAX`); a no-op without pool support. The
    /// default threshold, 0, returns every freed byte to the OS at each synchronisation, so each
    /// timed step would map its whole peak again (some 9 GB a step for BC-100 L = 48
    /// `cat-store-copy`) — a cost PyTorch's caching allocator does not pay, biased against the
    /// variants with the largest peaks. The `USED_MEM_*` counters a row's peak is read from
    /// count bytes handed out, not reserved, so they do not change.
    pub fn keep_pool_reserved(ordinal: usize) -> Result<()> {
        let Some(pool) = default_pool(ordinal)? else {
            return Ok(());
        };
        let mut keep_all = u64::MAX;
        // SAFETY: RELEASE_THRESHOLD is a cuuint64_t we own for the call.
        unsafe {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep_all as *mut u64).cast(),
            )
        }
        .map_err(driver("cuMemPoolSetAttribute(RELEASE_THRESHOLD)"))?;
        Ok(())
    }

    /// Gives the memory the default pool of `cuda:ordinal` holds unused back to the device
    /// (`cuMemPoolTrimTo(pool, 0)`; the device must be synchronised first). [`keep_pool_reserved`]
    /// keeps a step's whole peak reserved; a CUDA graph allocates from its own memory, not the
    /// pool, so without this a row would need its peak twice to be replayed (and the deepest
    /// rows could not be). Nothing measured changes: the `USED_MEM_*` counters count bytes in
    /// use.
    pub fn trim_pool(ordinal: usize) -> Result<()> {
        let Some(pool) = default_pool(ordinal)? else {
            return Ok(());
        };
        // SAFETY: `pool` is the device's default pool.
        unsafe { result::mem_pool::trim_to(pool, 0) }.map_err(driver("cuMemPoolTrimTo"))
    }

    /// The default memory pool of `cuda:ordinal`, or `None` where the device has no pools.
    fn default_pool(ordinal: usize) -> Result<Option<sys::CUmemoryPool>> {
        let dev = device(ordinal)?;
        if !pools_supported(dev)? {
            return Ok(None);
        }
        // SAFETY: `dev` is valid.
        let pool = unsafe { result::device::get_default_mem_pool(dev) }
            .map_err(driver("cuDeviceGetDefaultMemPool"))?;
        Ok(Some(pool))
    }

    fn pool_attr(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: the USED_MEM_* attributes are cuuint64_t; `pool` is the device's default pool.
        unsafe { result::mem_pool::get_attribute(pool, attr, (&mut v as *mut u64).cast()) }
            .map_err(driver("cuMemPoolGetAttribute"))?;
        Ok(v)
    }
}

pub use imp::PoolPeak;
#[cfg(feature = "cuda")]
pub use imp::{keep_pool_reserved, trim_pool};

/// Checks that `cuda:ordinal` can be used and describes it; one clear error line otherwise:
/// "built without CUDA support…", "no CUDA driver found…", "device cuda:3 does not exist
/// (2 devices)", or the failing driver call with the driver's error name.
pub fn check_available(ordinal: usize) -> anyhow::Result<GpuInfo> {
    imp::check_available(ordinal)
}

impl PoolPeak {
    /// The warning a row must carry when the peak is sampled rather than exact.
    pub fn warning(&self) -> Option<&'static str> {
        match self.source() {
            PeakSource::Pool => None,
            PeakSource::Sampled => Some(SAMPLED_WARNING),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_one_line_and_say_what_to_do() {
        let cases = [
            (GpuError::NotBuilt, NOT_BUILT.to_string()),
            (
                GpuError::NoDriver,
                "no CUDA driver found (libcuda.so could not be loaded)".to_string(),
            ),
            (
                GpuError::NoDevice {
                    ordinal: 3,
                    count: 2,
                },
                "device cuda:3 does not exist (2 devices)".to_string(),
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.to_string(), want);
            assert!(!e.to_string().contains('\n'));
        }
        let newer = GpuError::NvrtcNewerThanDriver {
            nvrtc: (13, 1),
            driver: (13, 0),
        }
        .to_string();
        assert!(!newer.contains('\n'), "{newer}");
        for part in [
            "CUDA 13.1",
            "driver (CUDA 13.0)",
            "13.0 or older",
            "LD_LIBRARY_PATH",
        ] {
            assert!(newer.contains(part), "{part}: {newer}");
        }
    }

    /// PTX of a newer toolkit does not load: a newer NVRTC is refused, an equal or older one
    /// (and an unknown one) is not.
    #[test]
    fn nvrtc_newer_than_the_driver_is_refused() {
        let drv = (13, 0);
        assert_eq!(
            check_nvrtc_against_driver(Some((13, 1)), drv),
            Err(GpuError::NvrtcNewerThanDriver {
                nvrtc: (13, 1),
                driver: drv
            })
        );
        assert!(check_nvrtc_against_driver(Some((14, 0)), drv).is_err());
        for ok in [Some((13, 0)), Some((12, 9)), None] {
            assert_eq!(check_nvrtc_against_driver(ok, drv), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn driver_release_is_read_from_the_kernel_module_line() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 \
                    01:15:15 UTC 2023\nGCC version:  gcc version 12.2.0\n";
        assert_eq!(parse_driver_release(text).as_deref(), Some("535.104.05"));
        // The open kernel module (driver 580 on an H100) puts words before the version.
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release \
                    Build  (dvs-builder@U22-I3-AF03-09-1)  Thu Sep 18 2025\n";
        assert_eq!(parse_driver_release(open).as_deref(), Some("580.159.04"));
        assert_eq!(parse_driver_release("garbage"), None);
    }

    /// Without the feature the API answers with the typed error, never a panic.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_cuda_everything_is_not_built() {
        let e = check_available(0)
            .err()
            .map(|e| e.downcast::<GpuError>().ok());
        assert_eq!(e, Some(Some(GpuError::NotBuilt)));
        let e = PoolPeak::new(0).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some(NOT_BUILT));
    }
}
