//! Append-only feature storage and its mirror for gradients: the types that make "this write only
//! appends" a guarantee rather than a hope.
//!
//! Both hold a channel-major 2-D tensor `[rows, cols]` (rows = channels, cols = N·H·W), so every
//! prefix is a contiguous view and every append a contiguous copy.
//!
//! - [`AppendBuffer`]: forward features. Its only write moves a fill mark forward; views can only
//!   be taken of filled rows. A view saved for backward therefore covers rows no write can reach:
//!   overwriting a saved region is an `Err`, not silent corruption.
//! - [`GradBuffer`]: backward. Starts as the upstream gradient; the newest layer's rows are
//!   *sealed* (handed out as final) before that layer accumulates into the prefix below them.
//!   Accumulating into sealed rows is an `Err`.

use crate::error::{CandleContext, Error, Result};
use crate::ops::elementwise;
use candle_core::{DType, Device, Tensor};

/// One preallocated buffer the dense block appends its features into.
#[derive(Debug)]
pub struct AppendBuffer {
    name: &'static str,
    storage: Tensor,
    filled: usize,
}

impl AppendBuffer {
    /// Allocates `[capacity, cols]` with nothing written yet. The storage is not filled (on a
    /// GPU a fill is a memset over the whole buffer, `C_L·M` elements, every step): a row can
    /// only be viewed once written ([`AppendBuffer::rows`], [`AppendBuffer::into_full`]).
    pub fn new(
        name: &'static str,
        capacity: usize,
        cols: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        // SAFETY: every view of the storage is of written rows (`rows` and `into_full` check
        // the fill mark, the only other access is `write_at`'s write), so no element is read
        // before it is written.
        let storage =
            unsafe { crate::ops::cpu::shared::unfilled((capacity, cols), dtype, device, name)? };
        Ok(AppendBuffer {
            name,
            storage,
            filled: 0,
        })
    }

    pub fn capacity(&self) -> usize {
        self.storage.dims()[0]
    }

    pub fn cols(&self) -> usize {
        self.storage.dims()[1]
    }

    /// Rows written so far.
    pub fn filled(&self) -> usize {
        self.filled
    }

    fn misuse(&self, reason: String) -> Error {
        Error::BufferMisuse {
            buffer: self.name,
            reason,
        }
    }

    /// Writes `src` (`[n, cols]`, contiguous) at rows `[offset, offset + n)`, **in place**.
    ///
    /// Only `offset == filled()` is accepted: a lower offset would overwrite rows that views may
    /// cover (and that backward still needs), a higher one would leave unwritten rows inside the
    /// filled region.
    pub fn write_at(&mut self, offset: usize, src: &Tensor) -> Result<()> {
        if offset < self.filled {
            return Err(self.misuse(format!(
                "write at row {offset} overlaps rows [{offset}, {}) already written and possibly saved for backward",
                self.filled
            )));
        }
        if offset > self.filled {
            return Err(self.misuse(format!(
                "write at row {offset} is out of order: rows [{}, {offset}) would stay unwritten",
                self.filled
            )));
        }
        let dims = src.dims();
        if dims.len() != 2 || dims[1] != self.cols() {
            return Err(Error::ShapeMismatch {
                name: format!("append into {}", self.name),
                expected: vec![dims.first().copied().unwrap_or(0), self.cols()],
                found: dims.to_vec(),
            });
        }
        let n = dims[0];
        if offset + n > self.capacity() {
            return Err(self.misuse(format!(
                "appending {n} rows at {offset} exceeds the capacity of {} rows",
                self.capacity()
            )));
        }
        self.storage.slice_set(src, 0, offset).ctx(self.name)?;
        self.filled += n;
        Ok(())
    }

    /// Appends `src` after the filled rows, **in place**.
    pub fn append(&mut self, src: &Tensor) -> Result<()> {
        self.write_at(self.filled, src)
    }

    /// A read-only view of rows `[0, rows)`; errs unless they are all written.
    pub fn prefix(&self, rows: usize) -> Result<Tensor> {
        self.rows(0, rows)
    }

    /// A view of rows `[start, start + len)`; errs unless they are all written.
    pub fn rows(&self, start: usize, len: usize) -> Result<Tensor> {
        if start + len > self.filled {
            return Err(self.misuse(format!(
                "rows [{start}, {}) requested but only {} are written",
                start + len,
                self.filled
            )));
        }
        self.storage.narrow(0, start, len).ctx(self.name)
    }

    /// The whole buffer, once every row is written.
    pub fn into_full(self) -> Result<Tensor> {
        if self.filled != self.capacity() {
            return Err(self.misuse(format!(
                "only {} of {} rows written",
                self.filled,
                self.capacity()
            )));
        }
        Ok(self.storage)
    }
}

/// The gradient of an [`AppendBuffer`]'s contents, accumulated newest layer first.
#[derive(Debug)]
pub struct GradBuffer {
    name: &'static str,
    storage: Tensor,
    /// Rows `[0, open)` may still receive contributions; rows `[open, capacity)` are final.
    open: usize,
}

impl GradBuffer {
    /// Takes ownership of the upstream gradient `[rows, cols]` (contiguous); it is accumulated
    /// into in place from now on.
    pub fn from_upstream(name: &'static str, upstream: Tensor) -> Result<Self> {
        if upstream.rank() != 2 || !upstream.is_contiguous() {
            return Err(Error::BufferMisuse {
                buffer: name,
                reason: format!(
                    "the upstream gradient must be a contiguous [rows, cols] tensor, got shape {:?}",
                    upstream.dims()
                ),
            });
        }
        let open = upstream.dims()[0];
        Ok(GradBuffer {
            name,
            storage: upstream,
            open,
        })
    }

    /// Rows still open for accumulation.
    pub fn open(&self) -> usize {
        self.open
    }

    /// Seals the newest `len` open rows and returns them: the final gradient of the newest
    /// layer's output. The caller owns the view and may overwrite it in place.
    pub fn seal_top(&mut self, len: usize) -> Result<Tensor> {
        if len > self.open {
            return Err(Error::BufferMisuse {
                buffer: self.name,
                reason: format!("cannot seal {len} rows: only {} are open", self.open),
            });
        }
        self.open -= len;
        self.storage.narrow(0, self.open, len).ctx(self.name)
    }

    /// Adds `delta` (`[rows, cols]`) to rows `[0, rows)`, **in place**. Errs if any of those rows
    /// is sealed: its gradient was already handed out and must not change.
    pub fn accumulate_prefix(&mut self, delta: &Tensor) -> Result<()> {
        let rows = delta.dims().first().copied().unwrap_or(0);
        let prefix = self.prefix_for_accumulation(rows)?;
        elementwise::add_assign(&prefix, delta)
    }

    /// A view of rows `[0, rows)` for an in-place accumulation the caller performs (e.g. a fused
    /// kernel adding its result straight into the buffer). Errs if any of those rows is sealed.
    pub fn prefix_for_accumulation(&mut self, rows: usize) -> Result<Tensor> {
        if rows > self.open {
            return Err(Error::BufferMisuse {
                buffer: self.name,
                reason: format!(
                    "accumulating into rows [0, {rows}) reaches sealed rows [{}, {rows})",
                    self.open
                ),
            });
        }
        self.storage.narrow(0, 0, rows).ctx(self.name)
    }

    /// A view of the open rows and the `sealed` rows sealed last, `[0, open + sealed)`, for an
    /// in-place accumulation into the open rows that reads the sealed ones (the mlp input
    /// gradient `Wᵀ·gy` added into the prefix, `gy` the rows after it). The caller writes only
    /// rows `[0, open)`.
    pub fn open_and_sealed(&self, sealed: usize) -> Result<Tensor> {
        let rows = self.storage.dims()[0];
        if self.open + sealed > rows {
            return Err(Error::BufferMisuse {
                buffer: self.name,
                reason: format!(
                    "{sealed} sealed rows after the {} open ones exceed its {rows} rows",
                    self.open
                ),
            });
        }
        self.storage.narrow(0, 0, self.open + sealed).ctx(self.name)
    }

    /// The gradient of rows `[0, open)`: after the last layer, the block input's gradient.
    pub fn into_open(self) -> Result<Tensor> {
        self.storage.narrow(0, 0, self.open).ctx(self.name)
    }
}
