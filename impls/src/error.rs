//! The library's one error type: every failure names the field, tensor or value at fault.

/// Errors raised by densebench-impls. Binaries wrap these with `anyhow` context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration field holds a value the block cannot be built with.
    #[error("invalid config: {field} = {value}: {reason}")]
    InvalidConfig {
        field: &'static str,
        value: String,
        reason: String,
    },
    /// A variant name that no strategy answers to.
    #[error("unknown variant `{name}`; known variants: {known}")]
    UnknownVariant { name: String, known: String },
    /// A variant that exists but means nothing for this config (e.g. an in-place ReLU with the
    /// activation switched off).
    #[error("variant `{variant}` does not apply to {family} blocks: {reason}")]
    VariantNotApplicable {
        variant: String,
        family: String,
        reason: String,
    },
    /// A variant that cannot run in the config's dtype (e.g. `autograd` in bf16: candle's CPU
    /// matmul has no bf16), with why.
    #[error("variant `{variant}` does not run in {dtype}: {reason}")]
    DTypeNotSupported {
        variant: String,
        dtype: String,
        reason: String,
    },
    /// A named tensor is missing from a case file or parameter set.
    #[error("tensor `{name}` is missing{context}")]
    MissingTensor { name: String, context: String },
    /// A named tensor has the wrong shape.
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// A named tensor has the wrong dtype.
    #[error("tensor `{name}` has dtype {found}, expected {expected}")]
    DTypeMismatch {
        name: String,
        expected: String,
        found: String,
    },
    /// Misuse of an append-only buffer: a write that would overwrite rows a saved view may cover,
    /// leave a gap, or read rows that are not written yet.
    #[error("append-only buffer `{buffer}`: {reason}")]
    BufferMisuse {
        buffer: &'static str,
        reason: String,
    },
    /// An operation the chosen device cannot run (e.g. an in-place kernel without a CUDA port).
    #[error("unsupported on {device}: {what}")]
    Unsupported { device: String, what: String },
    /// A case or result file whose bytes are not a well-formed safetensors file: `what` is the
    /// part at fault (`header`, ``tensor `input` ``, `data`).
    #[error("{what}: {reason}")]
    BadFile { what: String, reason: String },
    /// Something that would need more bytes than a named limit allows; refused before the
    /// bytes are allocated or read.
    #[error("{what} needs {needed} bytes, more than {limit_name} = {limit} bytes")]
    OverLimit {
        what: String,
        needed: u128,
        limit_name: String,
        limit: u128,
    },
    /// Any error met while reading a file, with the file's path in front.
    #[error("{path}: {source}")]
    InFile {
        path: String,
        #[source]
        source: Box<Error>,
    },
    /// File I/O around case files.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// An error from the tensor library, with what we were doing when it happened.
    #[error("{context}: {source}")]
    Candle {
        context: String,
        #[source]
        source: candle_core::Error,
    },
}

impl From<candle_core::Error> for Error {
    fn from(source: candle_core::Error) -> Self {
        Error::Candle {
            context: "tensor op".to_string(),
            source,
        }
    }
}

/// Adds context to candle results: `t.matmul(&w).ctx("conv1 forward")?`.
pub trait CandleContext<T> {
    fn ctx(self, context: &str) -> Result<T>;
}

impl<T> CandleContext<T> for std::result::Result<T, candle_core::Error> {
    fn ctx(self, context: &str) -> Result<T> {
        self.map_err(|source| Error::Candle {
            context: context.to_string(),
            source,
        })
    }
}

pub type Result<T> = std::result::Result<T, Error>;
