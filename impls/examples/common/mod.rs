//! What the timing examples (`gemm_shapes`, `bn_shapes`) share: the best wall time of repeated
//! calls.

use std::time::Instant;

/// The best wall time in seconds of `reps + 1` calls of `f` (the first warms up and may still
/// be the best), or `f`'s first error.
pub fn best_of<E>(reps: usize, f: &mut dyn FnMut() -> Result<(), E>) -> Result<f64, E> {
    let mut best = f64::INFINITY;
    for _ in 0..=reps {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}
