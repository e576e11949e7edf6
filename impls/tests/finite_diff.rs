//! Finite differences in f64 on tiny configs: every variant's input and parameter gradients
//! against central differences of the loss `sum(output · grad_output)` along random directions.

use candle_core::{DType, Device, Tensor};
use impls::config::params::{specs, uniform, Kind};
use impls::{step, Case, Config, Family, NoProbe, Params, Spatial, Variant};

/// Central-difference step. With f64 the truncation error is O(ε²·L''') ≈ 1e-12 and the
/// rounding error O(u·|L|/ε) ≈ 1e-10 for |L| ~ 1, so 1e-6 balances both.
const EPS: f64 = 1e-6;
/// Relative agreement required between the directional derivative and ⟨grad, d⟩: three
/// orders above the ~1e-9 error budget of the difference quotient, far below a wrong term.
const FD_REL_TOL: f64 = 1e-6;
/// Random directions per variant and config.
const DIRECTIONS: u64 = 4;

fn loss(
    cfg: &Config,
    params: &Params,
    input: &Tensor,
    g: &Tensor,
    v: Variant,
) -> impls::Result<f64> {
    let r = step(v, cfg, params, input, g, &mut NoProbe)?;
    Ok(r.output.mul(g)?.sum_all()?.to_scalar::<f64>()?)
}

fn direction(cfg: &Config, name: &str, shape: &[usize], seed: u64) -> impls::Result<Tensor> {
    let n = shape.iter().product();
    Ok(
        Tensor::from_vec(uniform(seed, name, n, -1.0, 1.0), shape, &Device::Cpu)?
            .to_dtype(cfg.dtype)?,
    )
}

fn dot(a: &Tensor, b: &Tensor) -> impls::Result<f64> {
    Ok(a.mul(b)?.sum_all()?.to_scalar::<f64>()?)
}

/// The tiny configs of both families, and the tiny bc block on non-square maps both ways round
/// (3x5 and 5x3, so a kernel that swaps H and W is caught).
fn configs() -> Vec<Config> {
    let mut out: Vec<Config> = Family::ALL.into_iter().map(Config::tiny).collect();
    for size in [Spatial::new(3, 5), Spatial::new(5, 3)] {
        out.push(Config {
            size,
            ..Config::tiny(Family::Bc)
        });
    }
    out
}

#[test]
fn gradients_match_central_differences() -> impls::Result<()> {
    for cfg in configs() {
        let cfg = Config {
            dtype: DType::F64,
            ..cfg
        };
        let case = Case::random(&cfg, &Device::Cpu)?;
        for v in Variant::for_config(&cfg) {
            let r = case.step(v)?;
            for seed in 0..DIRECTIONS {
                // A direction over the input and every trained parameter.
                let d_in = direction(&cfg, "input", &cfg.input_shape(), 1000 + seed)?;
                let mut predicted = dot(&r.grad_input, &d_in)?;
                let (mut plus, mut minus) = (case.params.clone(), case.params.clone());
                for spec in specs(&cfg).into_iter().filter(|s| s.kind == Kind::Param) {
                    let d = direction(&cfg, &spec.name, &spec.shape, 2000 + seed)?;
                    predicted += dot(&r.grads[&spec.name], &d)?;
                    let p = case.params.get(&spec.name)?;
                    plus.tensors.insert(spec.name.clone(), (p + (&d * EPS)?)?);
                    minus.tensors.insert(spec.name.clone(), (p - (&d * EPS)?)?);
                }
                let x_plus = (&case.input + (&d_in * EPS)?)?;
                let x_minus = (&case.input - (&d_in * EPS)?)?;
                let fd = (loss(&cfg, &plus, &x_plus, &case.grad_output, v)?
                    - loss(&cfg, &minus, &x_minus, &case.grad_output, v)?)
                    / (2.0 * EPS);
                let rel = (fd - predicted).abs() / predicted.abs().max(1.0);
                assert!(
                    rel <= FD_REL_TOL,
                    "{v} on {}: finite difference {fd} vs gradient {predicted} (rel {rel:e})",
                    cfg.describe()
                );
            }
        }
    }
    Ok(())
}
