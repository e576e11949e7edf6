//! Cross-framework case files: a block's parameters, input and upstream gradient in one
//! safetensors file, and one step's results written back the same way.
//!
//! Input file tensors: `input`, `grad_output`, and every parameter and BN buffer under its
//! PyTorch `state_dict` name. The config is read from the tensors: the family from which names
//! exist (`layers.0.weight` → mlp, `denselayer1.conv1.weight` → bc), N and C0 from `input`,
//! L from the number of layers, k from the last weight's output channels, bn_size from
//! `conv1.weight`, H and W from `input` (any H × W, as torchvision's `_DenseBlock` takes), the
//! dtype from `input`. A bf16 case (mixed precision, PyTorch autocast's) holds `input` and
//! `grad_output` in bf16 and every parameter and BN buffer in f32 ([`Config::param_dtype`]);
//! its result file `output` and `grad.input` in bf16, the parameter gradients and running
//! statistics in f32. f32 and f64 files hold every tensor in their one dtype. Only the mlp activation cannot be seen in the tensors: `densebench case`
//! records it in the file's `__metadata__` ([`ACTIVATION_KEY`]: `on` or `off`), else the caller
//! gives it (default on); a caller's value that contradicts the file's is refused.
//!
//! Result file tensors: `output`, `grad.input`, `grad.<param name>`, and the updated
//! `<bn name>.running_mean|running_var`.
//!
//! Loading checks a file from its header before reading any data ([`crate::case::header`]): the
//! header is bounded and consistent with the file's length, the config inferred from the
//! declared shapes passes [`Config::validate`], every expected tensor is declared with its
//! exact shape and dtype, no unknown tensor is declared (only PyTorch's i64
//! `denselayer{i}.norm{1,2}.num_batches_tracked` scalars are allowed, and skipped), and what
//! the load will allocate is within the caller's byte limit. Only then are the tensors read,
//! each into exactly its declared size. Every error names the file and the tensor.

pub mod header;

use crate::check::result::StepResult;
use crate::config::params::{self, Params};
use crate::config::spatial::Spatial;
use crate::config::{Config, Family};
use crate::error::{CandleContext, Error, Result};
use candle_core::{DType, Device, Tensor};
use header::{Entry, Header};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::Path;

/// The `__metadata__` key of a case file that says whether an mlp block has its ReLU (`on`) or
/// not (`off`): the one config field the tensors cannot show.
pub const ACTIVATION_KEY: &str = "densebench.activation";

/// Lower and upper bound of the uniform input and upstream gradient of a random case.
const CASE_RANGE: (f64, f64) = (-1.0, 1.0);

/// A block's parameters with one input and upstream gradient: everything a step needs.
#[derive(Debug, Clone)]
pub struct Case {
    pub cfg: Config,
    pub params: Params,
    pub input: Tensor,
    pub grad_output: Tensor,
}

/// Writes `map` as a safetensors file at `path` itself. Serialised in memory and written with
/// one `write`, not through `safetensors`' own `serialize_to_file`, which writes a sibling
/// temporary with a random name (`.tmpXXXXXX`) and renames it: a child killed mid-write left
/// that file behind, and nothing could tell whose it was. Callers write to a temporary path of
/// their own (named with their pid, which an interrupted sweep's cleanup recognises) and
/// rename it into place.
fn save_map(
    map: &HashMap<String, Tensor>,
    metadata: Option<HashMap<String, String>>,
    path: &Path,
) -> Result<()> {
    let mut contiguous = HashMap::new();
    for (k, t) in map {
        contiguous.insert(k.clone(), t.contiguous().ctx(k)?);
    }
    let what = format!("writing {}", path.display());
    let bytes = safetensors::serialize(&contiguous, metadata)
        .map_err(candle_core::Error::from)
        .ctx(&what)?;
    std::fs::write(path, bytes).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Opens `path` for reading, refusing anything but a regular file; returns it with its length.
fn open(path: &Path) -> Result<(File, u64)> {
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let not_regular = || Error::InFile {
        path: path.display().to_string(),
        source: Box::new(Error::BadFile {
            what: "file".to_string(),
            reason: "not a regular file (a case file is checked against its length first)"
                .to_string(),
        }),
    };
    // Checked before opening too: opening a FIFO would block until something writes to it. And
    // opened with O_NONBLOCK, so that a file replaced by a FIFO in between cannot block the open
    // either (the check below then refuses it); reads of a regular file ignore the flag.
    if !std::fs::metadata(path).map_err(io)?.is_file() {
        return Err(not_regular());
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    Ok((file, meta.len()))
}

/// Runs `f`, putting `path` in front of any error it raises (I/O errors already name it).
fn in_file<T>(path: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    f().map_err(|e| match e {
        Error::Io { .. } => e,
        other => Error::InFile {
            path: path.display().to_string(),
            source: Box::new(other),
        },
    })
}

/// The safetensors dtype name of a config dtype (`F32`, `F64`, `BF16`).
fn st_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F64 => "F64",
        DType::BF16 => "BF16",
        _ => "F32",
    }
}

/// One tensor a file must declare: its name, shape and dtype.
type Expected = (String, Vec<usize>, DType);

/// The expected entry of a feature tensor (`input`, `grad_output`; `output`, `grad.input`):
/// in the config's dtype.
fn feature(cfg: &Config, name: &str, shape: Vec<usize>) -> Expected {
    (name.to_string(), shape, cfg.dtype)
}

/// The declared entry of `name`, which must exist.
fn entry<'h>(h: &'h Header, name: &str, why: &str) -> Result<&'h Entry> {
    h.entries.get(name).ok_or_else(|| Error::MissingTensor {
        name: name.to_string(),
        context: why.to_string(),
    })
}

/// Dimension `axis` of a declared tensor that must have rank `rank`.
fn dim(h: &Header, name: &str, axis: usize, rank: usize) -> Result<usize> {
    let e = entry(h, name, "")?;
    if e.shape.len() != rank {
        return Err(Error::BadFile {
            what: format!("tensor `{name}`"),
            reason: format!(
                "shape {:?} has rank {}, expected rank {rank}",
                e.shape,
                e.shape.len()
            ),
        });
    }
    Ok(e.shape[axis])
}

/// Infers a case file's config from its declared tensors (see the module docs) and validates
/// it; nothing is read but the header.
fn infer_config(h: &Header, activation: Option<bool>) -> Result<Config> {
    if !h.entries.contains_key("input")
        && h.entries.contains_key("output")
        && h.entries.contains_key("grad.input")
    {
        return Err(Error::BadFile {
            what: "the file".to_string(),
            reason: "it is a step's results (`output`, `grad.input`, `grad.…`), not a case: give \
                     `--case` a file `densebench case` wrote"
                .to_string(),
        });
    }
    let input = entry(h, "input", "")?;
    let dtype = match input.dtype {
        "F32" => DType::F32,
        "F64" => DType::F64,
        "BF16" => DType::BF16,
        other => {
            return Err(Error::DTypeMismatch {
                name: "input".to_string(),
                expected: "f32, f64 or bf16".to_string(),
                found: other.to_lowercase(),
            })
        }
    };
    let family = if h.entries.contains_key(&params::mlp_weight(0)) {
        Family::Mlp
    } else if h.entries.contains_key(&params::conv_name(0, 1)) {
        Family::Bc
    } else {
        return Err(Error::BadFile {
            what: "the file".to_string(),
            reason: format!(
                "it has neither `{}` (an mlp block's first Linear) nor `{}` (a bc block's first \
                 Conv1×1), so it is a case of neither family",
                params::mlp_weight(0),
                params::conv_name(0, 1)
            ),
        });
    };
    let first_of = |i: usize| match family {
        Family::Mlp => params::mlp_weight(i),
        Family::Bc => params::conv_name(i, 1),
    };
    let depth = (0..)
        .take_while(|&i| h.entries.contains_key(&first_of(i)))
        .count();
    // A later layer's first weight without this one's: a layer missing in the middle, said as
    // such (else the block reads as `depth` layers deep and a later check blames a shape).
    let last = h
        .entries
        .keys()
        .filter_map(|n| layer_of(family, n).filter(|&i| *n == first_of(i)))
        .max();
    if let Some(last) = last {
        if last >= depth {
            return Err(Error::MissingTensor {
                name: first_of(depth),
                context: format!(
                    " (layer {} of the file's {}: its layers must run from the first without a \
                     gap)",
                    depth + 1,
                    last + 1
                ),
            });
        }
    }
    let rank = if family == Family::Mlp { 2 } else { 4 };
    let batch = dim(h, "input", 0, rank)?;
    let channels = dim(h, "input", 1, rank)?;
    let (growth, bn_size, size) = match family {
        Family::Mlp => (dim(h, &params::mlp_weight(0), 0, 2)?, 1, Spatial::square(1)),
        Family::Bc => {
            let k = dim(h, &params::conv_name(0, 2), 0, 4)?;
            let b = dim(h, &params::conv_name(0, 1), 0, 4)?;
            if k == 0 || b % k != 0 {
                return Err(Error::BadFile {
                    what: format!("tensor `{}`", params::conv_name(0, 1)),
                    reason: format!(
                        "its {b} output channels are not a positive multiple of the growth \
                         rate k = {k} (the output channels of `{}`): bn_size·k expected",
                        params::conv_name(0, 2)
                    ),
                });
            }
            // `dim` above checked that `input` has rank 4: [N, C0, H, W].
            (k, b / k, Spatial::new(input.shape[2], input.shape[3]))
        }
    };
    let activation = match family {
        Family::Bc => true,
        Family::Mlp => resolve_activation(h, activation)?,
    };
    let cfg = Config {
        family,
        batch,
        channels,
        growth,
        depth,
        bn_size,
        size,
        activation,
        dtype,
        seed: 0,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// The layer (from 0) a parameter name of `family` belongs to: `layers.{i}.…` (mlp) or
/// `denselayer{i+1}.…` (bc); `None` for any other name.
fn layer_of(family: Family, name: &str) -> Option<usize> {
    let (index, _) = match family {
        Family::Mlp => name.strip_prefix("layers.")?.split_once('.')?,
        Family::Bc => name.strip_prefix("denselayer")?.split_once('.')?,
    };
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) || index.len() > 9 {
        return None;
    }
    let i: usize = index.parse().ok()?;
    match family {
        Family::Mlp => Some(i),
        Family::Bc => i.checked_sub(1),
    }
}

/// The [`ACTIVATION_KEY`] value of an activation.
fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// An mlp case's activation: the file's [`ACTIVATION_KEY`] and the caller's value, which must
/// agree where both are given; either alone; on where neither is.
fn resolve_activation(h: &Header, caller: Option<bool>) -> Result<bool> {
    let file = match h.metadata.get(ACTIVATION_KEY).map(String::as_str) {
        None => None,
        Some("on") => Some(true),
        Some("off") => Some(false),
        Some(other) => {
            return Err(Error::BadFile {
                what: format!("`__metadata__` key `{ACTIVATION_KEY}`"),
                reason: format!("`{other}` is not `on` or `off`"),
            })
        }
    };
    match (file, caller) {
        (Some(f), Some(c)) if f != c => Err(Error::BadFile {
            what: format!("`__metadata__` key `{ACTIVATION_KEY}`"),
            reason: format!(
                "the file says the mlp's ReLU is {} (`densebench case --activation {}` wrote it), \
                 but --activation {} was asked for: drop the flag, or make the case again",
                on_off(f),
                on_off(f),
                on_off(c)
            ),
        }),
        (Some(v), _) | (None, Some(v)) => Ok(v),
        (None, None) => Ok(true),
    }
}

/// Whether `name` is a tensor PyTorch adds that densebench does not use: the i64
/// `num_batches_tracked` counter of a bc layer's BatchNorms.
fn ignored_extra(cfg: &Config, name: &str) -> bool {
    // `denselayer{i}.norm{1,2}.num_batches_tracked` (i from 1), parsed rather than generated
    // per layer so that a header with many extras is checked in linear time.
    let Some((layer, rest)) = name
        .strip_prefix("denselayer")
        .and_then(|rest| rest.split_once('.'))
    else {
        return false;
    };
    let canonical = layer
        .parse::<usize>()
        .is_ok_and(|i| (1..=cfg.depth).contains(&i) && i.to_string() == layer);
    cfg.family == Family::Bc
        && canonical
        && matches!(
            rest,
            "norm1.num_batches_tracked" | "norm2.num_batches_tracked"
        )
}

/// The error for an expected tensor the header does not declare.
fn missing(name: &str, shape: &[usize], dtype: DType, cfg: &Config) -> Error {
    Error::MissingTensor {
        name: name.to_string(),
        context: format!(
            " (expected shape {shape:?}, dtype {} for {})",
            dtype.as_str(),
            cfg.describe_block()
        ),
    }
}

/// Errs with the first tensor of `fixed`, then of the layers (as `rename` names a parameter),
/// that the header does not declare. Runs layer by layer before the full list of expected
/// tensors is built, so a header naming few tensors of a deep block cannot make the loader
/// allocate far more than the header itself (the list is built only once the header is known
/// to hold at least as many entries).
fn check_declared(
    h: &Header,
    cfg: &Config,
    fixed: &[Expected],
    rename: impl Fn(&params::Spec) -> String,
) -> Result<()> {
    let per_layer = params::layer_specs(cfg, 0).len() as u128;
    let total = cfg.depth as u128 * per_layer + fixed.len() as u128;
    if h.entries.len() as u128 >= total {
        return Ok(());
    }
    for (name, shape, dtype) in fixed {
        if !h.entries.contains_key(name) {
            return Err(missing(name, shape, *dtype, cfg));
        }
    }
    for i in 0..cfg.depth {
        for spec in params::layer_specs(cfg, i) {
            let name = rename(&spec);
            if !h.entries.contains_key(&name) {
                return Err(missing(&name, &spec.shape, cfg.param_dtype(), cfg));
            }
        }
    }
    Ok(())
}

/// Checks that the header declares exactly `expected` (name, shape, dtype), besides
/// PyTorch's ignored extras; then that the load fits `max_bytes`; then reads the tensors.
fn read_expected(
    file: &mut File,
    h: &Header,
    cfg: &Config,
    expected: &[Expected],
    max_bytes: Option<u64>,
    finite: bool,
) -> Result<HashMap<String, Tensor>> {
    let mut data_bytes = 0u128;
    for (name, shape, dtype) in expected {
        let e = h
            .entries
            .get(name)
            .ok_or_else(|| missing(name, shape, *dtype, cfg))?;
        if e.shape != *shape {
            return Err(Error::ShapeMismatch {
                name: name.clone(),
                expected: shape.clone(),
                found: e.shape.clone(),
            });
        }
        if e.dtype != st_name(*dtype) {
            return Err(Error::DTypeMismatch {
                name: name.clone(),
                expected: dtype.as_str().to_string(),
                found: e.dtype.to_lowercase(),
            });
        }
        data_bytes += u128::from(e.bytes());
    }
    // Every expected name was found above; whatever else the header declares must be an
    // allowed extra. Counting is enough: the header has no duplicate names.
    if h.entries.len() != expected.len() {
        let known: HashSet<&str> = expected.iter().map(|(n, _, _)| n.as_str()).collect();
        for (name, e) in &h.entries {
            if known.contains(name.as_str()) {
                continue;
            }
            if !ignored_extra(cfg, name) {
                let shown: String = name.chars().take(80).collect();
                return Err(Error::BadFile {
                    what: format!("tensor `{shown}`"),
                    reason: format!("not a tensor of {} (unknown name)", cfg.describe_block()),
                });
            }
            if e.dtype != "I64" || e.shape.iter().product::<usize>() != 1 {
                return Err(Error::BadFile {
                    what: format!("tensor `{name}`"),
                    reason: format!(
                        "PyTorch's BatchNorm counter must be one i64, found {} of shape {:?}",
                        e.dtype.to_lowercase(),
                        e.shape
                    ),
                });
            }
        }
    }
    if let Some(limit) = max_bytes {
        let header_bytes = u128::from(h.json_len) * u128::from(header::HEADER_MEMORY_FACTOR);
        let needed = header_bytes + data_bytes + u128::from(header::LOAD_OVERHEAD_BYTES);
        if needed > u128::from(limit) {
            return Err(Error::OverLimit {
                what: format!(
                    "loading {} ({data_bytes} bytes of tensors, {header_bytes} for the header, \
                     {} of overhead)",
                    cfg.describe_block(),
                    header::LOAD_OVERHEAD_BYTES
                ),
                needed,
                limit_name: "the memory limit".to_string(),
                limit: limit.into(),
            });
        }
    }
    let device = Device::Cpu;
    let mut out = HashMap::new();
    for (name, shape, dtype) in expected {
        let e = entry(h, name, "")?;
        let t = match dtype {
            DType::F64 => {
                let v = header::read_f64(file, h, e)?;
                if finite {
                    check_finite(name, v.iter().map(|x| x.is_finite()))?;
                }
                Tensor::from_vec(v, shape.as_slice(), &device)
            }
            DType::BF16 => {
                let v = header::read_bf16(file, h, e)?;
                if finite {
                    check_finite(name, v.iter().map(|x| x.is_finite()))?;
                }
                Tensor::from_vec(v, shape.as_slice(), &device)
            }
            _ => {
                let v = header::read_f32(file, h, e)?;
                if finite {
                    check_finite(name, v.iter().map(|x| x.is_finite()))?;
                }
                Tensor::from_vec(v, shape.as_slice(), &device)
            }
        }
        .ctx(name)?;
        out.insert(name.clone(), t);
    }
    Ok(out)
}

/// Errs when a case's tensor `name` holds a NaN or an infinity (`ok`: each value's finiteness,
/// in order): every result of a step on it would be NaN, and a benchmark row of it no result.
fn check_finite(name: &str, ok: impl Iterator<Item = bool>) -> Result<()> {
    let (mut bad, mut first) = (0usize, None);
    for (i, fine) in ok.enumerate() {
        if !fine {
            bad += 1;
            first.get_or_insert(i);
        }
    }
    match first {
        None => Ok(()),
        Some(i) => Err(Error::BadFile {
            what: format!("tensor `{name}`"),
            reason: format!(
                "{bad} value(s) are NaN or infinite (the first at flat index {i}): a case's \
                 inputs, upstream gradient and parameters must be finite"
            ),
        }),
    }
}

/// Moves every tensor of `map` to `device` (a no-op on the CPU).
fn to_device(map: HashMap<String, Tensor>, device: &Device) -> Result<HashMap<String, Tensor>> {
    if device.is_cpu() {
        return Ok(map);
    }
    map.into_iter()
        .map(|(k, v)| {
            let t = v.to_device(device).ctx(&k)?;
            Ok((k, t))
        })
        .collect()
}

impl Case {
    /// Seeded random parameters (see [`Params::init`]), input and upstream gradient. A bf16
    /// case is the f32 case of the same config and seed with its input and upstream gradient
    /// rounded to bf16 (its parameters and BN buffers are the f32 case's), so the f64 case its
    /// values widen to exactly is the reference of both.
    pub fn random(cfg: &Config, device: &Device) -> Result<Case> {
        let params = Params::init(cfg, device)?;
        let feature = |name, shape: Vec<usize>| {
            params::uniform_tensor(cfg, name, &shape, CASE_RANGE, cfg.dtype, device)
        };
        let input = feature("input", cfg.input_shape())?;
        let grad_output = feature("grad_output", cfg.output_shape())?;
        Ok(Case {
            cfg: cfg.clone(),
            params,
            input,
            grad_output,
        })
    }

    /// The same case in another dtype: the features (input, upstream gradient) in `dtype`, the
    /// parameters and BN buffers in its [`Config::param_dtype`]. Widening f32 or bf16 → f64 is
    /// exact, so an f64 step on the widened case is the exact-arithmetic reference for the f32
    /// and the bf16 case.
    pub fn to_dtype(&self, dtype: candle_core::DType) -> Result<Case> {
        let cfg = Config {
            dtype,
            ..self.cfg.clone()
        };
        let tensors = self
            .params
            .tensors
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.to_dtype(cfg.param_dtype()).ctx(k)?)))
            .collect::<Result<_>>()?;
        Ok(Case {
            params: Params { tensors },
            input: self.input.to_dtype(dtype).ctx("input")?,
            grad_output: self.grad_output.to_dtype(dtype).ctx("grad_output")?,
            cfg,
        })
    }

    /// Runs one step of `variant` on this case.
    pub fn step(&self, variant: crate::config::variant::Variant) -> Result<StepResult> {
        crate::step::step(
            variant,
            &self.cfg,
            &self.params,
            &self.input,
            &self.grad_output,
            &mut crate::check::probe::NoProbe,
        )
    }

    /// Runs one step of a hand-written `strategy` on this case as given, without the schedule
    /// [`crate::step::step()`] picks: the front split on the CPU unless inside
    /// [`crate::layer::with_whole_front`], ReLU1's output remade for dW1 on a whole
    /// front if `defer_r`. For tests and timings of one schedule choice against another.
    pub fn step_manual(
        &self,
        strategy: crate::config::variant::Strategy,
        defer_r: bool,
    ) -> Result<StepResult> {
        crate::strategies::block::step_manual(
            strategy,
            &self.cfg,
            &self.params,
            &self.input,
            &self.grad_output,
            defer_r,
            &mut crate::check::probe::NoProbe,
        )
    }

    /// The reference results: `autograd` (independent of every hand-written backward) run in
    /// f64 on this case widened to f64 — exact-arithmetic truth up to f64 rounding, whatever
    /// the case's own dtype.
    pub fn reference(&self) -> Result<StepResult> {
        self.to_dtype(candle_core::DType::F64)?
            .step(crate::config::variant::Variant::Autograd)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let mut map: HashMap<String, Tensor> = self
            .params
            .tensors
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        map.insert("input".to_string(), self.input.clone());
        map.insert("grad_output".to_string(), self.grad_output.clone());
        // the mlp activation, which the tensors cannot show (a bc block always has its ReLUs)
        let metadata = (self.cfg.family == Family::Mlp).then(|| {
            HashMap::from([(
                ACTIVATION_KEY.to_string(),
                on_off(self.cfg.activation).to_string(),
            )])
        });
        save_map(&map, metadata, path)
    }

    /// Loads a case, inferring the config from the tensors (see the module docs). `activation`
    /// sets the mlp ReLU, which the tensors cannot show, where the file does not record it
    /// ([`ACTIVATION_KEY`]; a value contradicting the file's is an error; `None`: the file's, else
    /// on). No byte limit: see [`Case::load_with_limit`].
    pub fn load(path: &Path, activation: Option<bool>, device: &Device) -> Result<Case> {
        Case::load_with_limit(path, activation, device, None)
    }

    /// Loads a case, checking the whole file from its header before reading any data (see the
    /// module docs). With `max_bytes`, a load that would allocate more than that (the tensors,
    /// plus the header × [`header::HEADER_MEMORY_FACTOR`], plus
    /// [`header::LOAD_OVERHEAD_BYTES`]) is refused before it allocates them, naming the limit.
    /// Every error names the file.
    pub fn load_with_limit(
        path: &Path,
        activation: Option<bool>,
        device: &Device,
        max_bytes: Option<u64>,
    ) -> Result<Case> {
        let (mut file, len) = open(path)?;
        in_file(path, || {
            let h = header::read_header(&mut file, len, max_bytes)?;
            let cfg = infer_config(&h, activation)?;
            let mut expected = vec![
                feature(&cfg, "input", cfg.input_shape()),
                feature(&cfg, "grad_output", cfg.output_shape()),
            ];
            check_declared(&h, &cfg, &expected, |s| s.name.clone())?;
            let param = cfg.param_dtype();
            expected.extend(
                params::specs(&cfg)
                    .into_iter()
                    .map(|s| (s.name, s.shape, param)),
            );
            let read = read_expected(&mut file, &h, &cfg, &expected, max_bytes, true)?;
            // The header and the list are no longer needed: free them before the tensors are
            // sorted into parameters.
            drop((h, expected));
            let mut map = to_device(read, device)?;
            let mut take = |name: &str| {
                map.remove(name).ok_or_else(|| Error::MissingTensor {
                    name: name.to_string(),
                    context: String::new(),
                })
            };
            let input = take("input")?;
            let grad_output = take("grad_output")?;
            let params = Params::from_tensors(&cfg, map.into_iter().collect())?;
            Ok(Case {
                cfg,
                params,
                input,
                grad_output,
            })
        })
    }
}

/// Writes a step's results: `output`, `grad.input`, `grad.<param>`, `<bn>.running_*`.
pub fn save_result(result: &StepResult, path: &Path) -> Result<()> {
    let mut map = HashMap::new();
    map.insert("output".to_string(), result.output.clone());
    map.insert("grad.input".to_string(), result.grad_input.clone());
    for (k, v) in &result.grads {
        map.insert(format!("grad.{k}"), v.clone());
    }
    for (k, v) in &result.running {
        map.insert(k.clone(), v.clone());
    }
    save_map(&map, None, path)
}

/// The name of a parameter's entry in a result file: `grad.<param>`, or the running stat itself.
fn result_name(spec: &params::Spec) -> String {
    match spec.kind {
        params::Kind::Param => format!("grad.{}", spec.name),
        params::Kind::RunningStat => spec.name.clone(),
    }
}

/// Reads a result file written by [`save_result`] for `cfg`, checking every tensor. No byte
/// limit: see [`load_result_with_limit`].
pub fn load_result(cfg: &Config, path: &Path, device: &Device) -> Result<StepResult> {
    load_result_with_limit(cfg, path, device, None)
}

/// Reads a result file for `cfg`, checked from its header before any data are read like
/// [`Case::load_with_limit`]: exactly the tensors [`save_result`] writes for `cfg`, each with
/// its shape and dtype (`output` and `grad.input` in `cfg`'s dtype, the rest in its
/// [`Config::param_dtype`]), within `max_bytes`. Every error names the file.
pub fn load_result_with_limit(
    cfg: &Config,
    path: &Path,
    device: &Device,
    max_bytes: Option<u64>,
) -> Result<StepResult> {
    cfg.validate()?;
    let (mut file, len) = open(path)?;
    in_file(path, || {
        let h = header::read_header(&mut file, len, max_bytes)?;
        let mut expected = vec![
            feature(cfg, "output", cfg.output_shape()),
            feature(cfg, "grad.input", cfg.input_shape()),
        ];
        check_declared(&h, cfg, &expected, result_name)?;
        let specs = params::specs(cfg);
        let param = cfg.param_dtype();
        expected.extend(
            specs
                .iter()
                .map(|s| (result_name(s), s.shape.clone(), param)),
        );
        let read = read_expected(&mut file, &h, cfg, &expected, max_bytes, false)?;
        drop((h, expected));
        let mut map = to_device(read, device)?;
        let mut take = |name: &str| {
            map.remove(name).ok_or_else(|| Error::MissingTensor {
                name: name.to_string(),
                context: String::new(),
            })
        };
        let output = take("output")?;
        let grad_input = take("grad.input")?;
        let mut grads = BTreeMap::new();
        let mut running = BTreeMap::new();
        for spec in specs {
            match spec.kind {
                params::Kind::Param => {
                    grads.insert(spec.name.clone(), take(&format!("grad.{}", spec.name))?);
                }
                params::Kind::RunningStat => {
                    running.insert(spec.name.clone(), take(&spec.name)?);
                }
            }
        }
        Ok(StepResult {
            output,
            grad_input,
            grads,
            running,
        })
    })
}
