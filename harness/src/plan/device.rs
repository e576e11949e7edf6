//! Device names: `cpu` / `cuda:N` as written on the command line, in sweep files and in the
//! CSV. Only the name lives here (plans and keys need it); opening, describing and metering a
//! device is `measure::device`'s.

use anyhow::{bail, Context, Result};
use std::fmt;
use std::str::FromStr;

/// The one line a CUDA request gets from a build without CUDA support.
pub const NO_CUDA: &str = "built without CUDA support: rebuild with --features cuda";

/// A device as named on the command line and in the CSV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => match s.strip_prefix("cuda:") {
                Some(n) => n
                    .parse::<usize>()
                    .map(DeviceSpec::Cuda)
                    .with_context(|| format!("device `{s}`: `{n}` is not a device ordinal")),
                None => bail!("unknown device `{s}`: expected `cpu` or `cuda:N`"),
            },
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}
