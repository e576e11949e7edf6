//! CUDA-graph timing of a GPU row (issue 11, item 5): the whole training step captured once
//! through the driver's stream capture and replayed, so that the host's per-op work (candle's
//! op dispatch, allocations, launches) leaves the timed path and the GPU runs the step's kernels
//! back to back.
//!
//! How it runs, in the child, after the eager steps and the memory model (which it does not
//! touch): candle's host-to-device layout uploads are switched to its capture cache
//! (`CudaDevice::enable_cuda_graph_htod_cache`) and one eager step fills it; the next step is
//! captured on candle's stream (`begin_capture` in relaxed mode … `end_capture`, instantiated with
//! `AUTO_FREE_ON_LAUNCH`, so the captured outputs are reallocated at their fixed addresses on
//! each launch); one untimed replay, then `steps` replays each timed between two device
//! synchronisations. The last replay's results must then be the eager step's bit for bit,
//! tensor by tensor and element by element (SHA-256 of each tensor's bits,
//! `impls::check::compare::digests`; the same kernels on the same inputs, deterministic): the
//! timing is reported only then, never otherwise. The eager step was checked against the
//! reference, so the replay is too. Before the capture the pool's unused reserve is given
//! back (`gpu::trim_pool`): a graph allocates its own memory.
//!
//! Run for graph rows only (`--execution graph`, the row's `execution` column, issue 36): the
//! replays' times are the row's timing columns. Anything that fails (capture refused, an op
//! that cannot be captured, a panic, results that differ) makes the graph row an `error` saying
//! why. Rows of schema 2 carried the timing in an eager row's `note`
//! (`cuda_graph_median_ns=…;cuda_graph_min_ns=…;cuda_graph_max_ns=…`, [`note`]); readers still
//! understand it. `DENSEBENCH_CUDA_GRAPH=0` in the environment turns it off.

/// The environment variable that turns graph timing off (`0`); on by default for CUDA rows.
pub const ENV: &str = "DENSEBENCH_CUDA_GRAPH";

/// Whether graph timing is allowed (the environment does not say `0`, `off` or `false`).
pub fn enabled() -> bool {
    enabled_by(std::env::var(ENV).ok().as_deref())
}

fn enabled_by(value: Option<&str>) -> bool {
    !matches!(
        value.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
        Some("0" | "off" | "false" | "no")
    )
}

/// The key of the replays' median in a row's note ([`note`]), as results read it back.
pub const MEDIAN_KEY: &str = "cuda_graph_median_ns=";

/// The note of a verified graph timing as rows of schema 2 carried it: the replays' median, min
/// and max in ns (what [`MEDIAN_KEY`] finds).
pub fn note(median_ns: u64, min_ns: u64, max_ns: u64) -> String {
    format!(
        "{MEDIAN_KEY}{median_ns};cuda_graph_min_ns={min_ns};cuda_graph_max_ns={max_ns} \
         (the whole step replayed as one CUDA graph; results bitwise those of the eager step; \
         the timing columns are eager)"
    )
}

#[cfg(feature = "cuda")]
pub use cuda::{replay, Replayed};

#[cfg(feature = "cuda")]
mod cuda {
    use anyhow::{anyhow, Context, Result};
    use candle_core::cuda_backend::cudarc::driver::sys::{
        CUgraphInstantiate_flags, CUstreamCaptureMode, CUstreamCaptureStatus,
    };
    use candle_core::cuda_backend::cudarc::driver::CudaStream;
    use candle_core::Device;
    use impls::{Case, StepResult, Variant};
    use std::mem::ManuallyDrop;
    use std::sync::Arc;
    use std::time::Instant;

    /// Ends a capture still open on `stream` when dropped (an error or a panic inside the
    /// captured step), so the stream is usable again.
    struct Capturing<'a>(&'a Arc<CudaStream>);
    impl Drop for Capturing<'_> {
        fn drop(&mut self) {
            // A free that failed while the step unwound (a panic under capture) leaves its
            // error stored in the context, and `capture_status` would return that error
            // instead of the status, leaving the capture open: take it out first.
            let _ = self.0.context().check_err();
            if matches!(
                self.0.capture_status(),
                Ok(s) if s != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
            ) {
                let _ = self.0.end_capture(CUgraphInstantiate_flags(0));
            }
        }
    }

    /// The results of the last replay and the graph that made them. The results' tensors are
    /// the captured step's outputs (graph allocations at fixed addresses, valid after a
    /// launch); fields drop in order, so they are freed before the graph is destroyed.
    pub struct Replayed {
        pub result: StepResult,
        _graph: candle_core::cuda_backend::cudarc::driver::CudaGraph,
    }

    /// Captures one step of `variant` on `case` as a CUDA graph and replays it: the replay
    /// times in ns (`steps` of them, after one untimed replay) and the last replay's results.
    pub fn replay(
        variant: Variant,
        case: &Case,
        device: &Device,
        steps: usize,
    ) -> Result<(Vec<u64>, Replayed)> {
        let cuda = device.as_cuda_device().context("not a CUDA device")?;
        let stream = cuda.cuda_stream();
        let _cache = cuda.enable_cuda_graph_htod_cache();
        // Fills the upload cache with every layout this step uploads (and loads every module).
        drop(
            case.step(variant)
                .map_err(|e| anyhow!("eager step before capture: {e}"))?,
        );
        device.synchronize()?;
        if let candle_core::DeviceLocation::Cuda { gpu_id } = device.location() {
            crate::measure::gpu::trim_pool(gpu_id)?;
        }
        let guard = Capturing(&stream);
        // Relaxed: a call the driver deems unsafe during a capture (a lazy cuBLAS or module
        // initialisation, say) runs instead of failing the capture; whatever it did outside
        // the graph would show in the replay's results, which must equal the eager step's.
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(|e| anyhow!("beginning the capture: {e:?}"))?;
        let captured = case.step(variant);
        let graph = stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        drop(guard);
        // The tensors the step made under capture are the graph's allocations: they exist only
        // once the graph has run. Until every launch has succeeded they are never dropped (a
        // free of an address nothing allocated is a driver error at a later call): on any
        // failure from here on they are forgotten instead. Destroying a graph does not free
        // what it allocated; the child exits after its row, which does.
        let graph = match graph {
            Ok(Some(g)) => g,
            failed => {
                if let Ok(r) = captured {
                    std::mem::forget(r);
                }
                return Err(match failed {
                    Err(e) => anyhow!("ending the capture / instantiating the graph: {e:?}"),
                    _ => anyhow!("the capture recorded nothing"),
                });
            }
        };
        let result =
            ManuallyDrop::new(captured.map_err(|e| anyhow!("the step under capture: {e}"))?);
        let launch = || -> Result<u64> {
            device.synchronize()?;
            let t = Instant::now();
            graph
                .launch()
                .map_err(|e| anyhow!("launching the graph: {e:?}"))?;
            device.synchronize()?;
            Ok(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX))
        };
        graph
            .upload()
            .map_err(|e| anyhow!("uploading the graph: {e:?}"))?;
        launch()?;
        let times = (0..steps.max(1))
            .map(|_| launch())
            .collect::<Result<Vec<_>>>()?;
        // every launch succeeded: the outputs are the last replay's, live until it is freed
        let result = ManuallyDrop::into_inner(result);
        Ok((
            times,
            Replayed {
                result,
                _graph: graph,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_unless_the_environment_says_off() {
        for on in [None, Some("1"), Some("on"), Some("")] {
            assert!(enabled_by(on), "{on:?}");
        }
        for off in ["0", "off", "OFF", "false", " no "] {
            assert!(!enabled_by(Some(off)), "{off}");
        }
    }

    #[test]
    fn the_note_carries_the_three_figures_parseably() {
        let n = note(5, 4, 9);
        assert!(n.starts_with("cuda_graph_median_ns=5;cuda_graph_min_ns=4;cuda_graph_max_ns=9 "));
    }
}
