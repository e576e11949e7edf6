//! 2-D operands inside a storage (`Mat`: rows × cols at an offset with two element strides),
//! checked against the storage they lie in, and their products' shapes; and the column-major
//! GEMM call (BLAS's convention, cuBLAS on a GPU) that adds one row-major product into a
//! destination ([`ColMajorGemm`]). Shared by the CPU's products ([`crate::ops::dense`]) and their
//! cuBLAS twin (`ops/cuda/dense.rs`, `cuda` feature).

use candle_core::Layout;

/// A 2-D operand inside a storage slice: rows × cols at `off` with element strides `rs`, `cs`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mat {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) off: usize,
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

impl Mat {
    /// The operand `l` describes in a storage of `len` elements, or an error naming `what`.
    pub(crate) fn of(l: &Layout, len: usize, op: &str, what: &str) -> candle_core::Result<Mat> {
        let (rows, cols) = l.shape().dims2().map_err(|_| {
            candle_core::Error::Msg(format!(
                "{op}: {what} must be 2-D, got shape {:?}",
                l.dims()
            ))
        })?;
        let (rs, cs) = (l.stride()[0], l.stride()[1]);
        let m = Mat {
            rows,
            cols,
            off: l.start_offset(),
            rs,
            cs,
        };
        if rows > 0 && cols > 0 && m.off + (rows - 1) * rs + (cols - 1) * cs >= len {
            return Err(candle_core::Error::Msg(format!(
                "{op}: {what} {rows}×{cols} (offset {}, strides {rs}, {cs}) lies outside its storage of {len} elements",
                m.off
            )));
        }
        Ok(m)
    }

    /// The operand `l` describes as rows of unit column stride, `rs ≥ cols` elements apart (a
    /// contiguous matrix, or a column range of a wider one): what the row-wise kernels take.
    /// An error naming `what` for any other layout (a transposed view, overlapping rows).
    pub(crate) fn rows_of(
        l: &Layout,
        len: usize,
        op: &str,
        what: &str,
    ) -> candle_core::Result<Mat> {
        let mut v = Mat::of(l, len, op, what)?;
        if v.cols <= 1 {
            v.cs = 1;
        }
        if v.rows <= 1 {
            v.rs = v.cols;
        }
        if v.cs != 1 || v.rs < v.cols {
            return Err(candle_core::Error::Msg(format!(
                "{op}: {what} {}×{} with strides {:?} is not rows of unit column stride",
                v.rows,
                v.cols,
                l.stride()
            )));
        }
        Ok(v)
    }

    /// The elements `[start, end)` of the storage that this operand's rows span (for a
    /// [`Mat::rows_of`] view: the first row's start to the last row's end).
    pub(crate) fn span(self) -> (usize, usize) {
        if self.rows == 0 || self.cols == 0 {
            (self.off, self.off)
        } else {
            (
                self.off,
                self.off + (self.rows - 1) * self.rs + (self.cols - 1) * self.cs + 1,
            )
        }
    }

    /// Rows `r0 .. r0 + n` of this operand.
    pub(crate) fn rows(self, r0: usize, n: usize) -> Mat {
        Mat {
            rows: n,
            off: self.off + r0 * self.rs,
            ..self
        }
    }

    /// Columns `c0 .. c0 + n` of this operand.
    pub(crate) fn columns(self, c0: usize, n: usize) -> Mat {
        Mat {
            cols: n,
            off: self.off + c0 * self.cs,
            ..self
        }
    }
}

pub(crate) fn check_shapes(op: &str, d: Option<Mat>, a: Mat, b: Mat) -> candle_core::Result<()> {
    let fits = a.cols == b.rows && d.is_none_or(|d| d.rows == a.rows && d.cols == b.cols);
    if fits {
        Ok(())
    } else {
        Err(candle_core::Error::Msg(format!(
            "{op}: cannot multiply {}×{} by {}×{}{}",
            a.rows,
            a.cols,
            b.rows,
            b.cols,
            d.map(|d| format!(" into {}×{}", d.rows, d.cols))
                .unwrap_or_default()
        )))
    }
}

/// One GEMM in BLAS's column-major convention, `C (m×n) += op(X) (m×k) · op(Y) (k×n)` with
/// β = 1: each operand at an element offset of its storage with its leading dimension, `X` and
/// `Y` transposed or not. What cuBLAS is called with for `dense::accumulate` on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the CUDA build's, and the tests'
pub(crate) struct ColMajorGemm {
    pub(crate) trans_x: bool,
    pub(crate) trans_y: bool,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    /// `(offset, leading dimension)` of X, Y and C.
    pub(crate) x: (usize, usize),
    pub(crate) y: (usize, usize),
    pub(crate) c: (usize, usize),
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl ColMajorGemm {
    /// Row-major `d += a · b` as one column-major GEMM: `dᵀ += bᵀ · aᵀ`, where a row-major
    /// operand with unit column stride is, read column-major, its own transpose with the row
    /// stride as leading dimension, and one with unit row stride (a transposed view such as
    /// `Wᵀ`) is itself with the column stride as leading dimension. An error where `d` has no
    /// unit column stride, an operand has no unit stride, or a size exceeds BLAS's `int`.
    pub(crate) fn of(op: &str, d: Mat, a: Mat, b: Mat) -> candle_core::Result<Self> {
        check_shapes(op, Some(d), a, b)?;
        let err = |what: &str, m: Mat| {
            candle_core::Error::Msg(format!(
                "{op}: the {what} {}×{} with strides ({}, {}) is not a BLAS operand (one stride must be 1)",
                m.rows, m.cols, m.rs, m.cs
            ))
        };
        // (transposed, offset, leading dimension) of `mᵀ` read column-major
        let operand = |what: &str, m: Mat| -> candle_core::Result<(bool, (usize, usize))> {
            if m.cs == 1 || m.cols <= 1 {
                let ld = if m.rows > 1 { m.rs } else { m.cols.max(1) };
                if ld >= m.cols.max(1) {
                    return Ok((false, (m.off, ld)));
                }
            }
            if m.rs == 1 || m.rows <= 1 {
                let ld = if m.cols > 1 { m.cs } else { m.rows.max(1) };
                if ld >= m.rows.max(1) {
                    return Ok((true, (m.off, ld)));
                }
            }
            Err(err(what, m))
        };
        // C is written column-major as dᵀ: only a destination with unit column stride is
        let (trans_c, c) = operand("destination", d)?;
        if trans_c {
            return Err(err("destination", d));
        }
        let (trans_x, x) = operand("right operand", b)?;
        let (trans_y, y) = operand("left operand", a)?;
        let g = ColMajorGemm {
            trans_x,
            trans_y,
            m: d.cols,
            n: d.rows,
            k: a.cols,
            x,
            y,
            c,
        };
        let int = |v: usize| i32::try_from(v).is_ok();
        if [g.m, g.n, g.k, g.x.1, g.y.1, g.c.1].into_iter().all(int) {
            Ok(g)
        } else {
            Err(candle_core::Error::Msg(format!(
                "{op}: {}×{} · {}×{} exceeds a BLAS int",
                a.rows, a.cols, b.rows, b.cols
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What BLAS computes for `g` (column-major, β = 1), on host slices: `c += op(x) · op(y)`.
    fn col_major_gemm_on_host(g: ColMajorGemm, x: &[f64], y: &[f64], c: &mut [f64]) {
        for j in 0..g.n {
            for i in 0..g.m {
                let mut acc = 0.0;
                for l in 0..g.k {
                    let xv = if g.trans_x {
                        x[g.x.0 + l + i * g.x.1]
                    } else {
                        x[g.x.0 + i + l * g.x.1]
                    };
                    let yv = if g.trans_y {
                        y[g.y.0 + j + l * g.y.1]
                    } else {
                        y[g.y.0 + l + j * g.y.1]
                    };
                    acc += xv * yv;
                }
                c[g.c.0 + i + j * g.c.1] += acc;
            }
        }
    }

    /// Row-major `d += a · b` element by element from the operands' own offsets and strides.
    fn row_major_on_host(d: Mat, a: Mat, b: Mat, av: &[f64], bv: &[f64], dv: &mut [f64]) {
        for r in 0..d.rows {
            for c in 0..d.cols {
                let sum: f64 = (0..a.cols)
                    .map(|l| av[a.off + r * a.rs + l * a.cs] * bv[b.off + l * b.rs + c * b.cs])
                    .sum();
                dv[d.off + r * d.rs + c * d.cs] += sum;
            }
        }
    }

    fn mat(rows: usize, cols: usize, off: usize, rs: usize, cs: usize) -> Mat {
        Mat {
            rows,
            cols,
            off,
            rs,
            cs,
        }
    }

    /// The cuBLAS call of `dense::accumulate` on a GPU, checked without one: the column-major GEMM
    /// [`ColMajorGemm::of`] describes, run on the host the way BLAS defines it, adds exactly
    /// the row-major product into the destination (small integers: every sum is exact) for
    /// the layouts the layers pass — `Wᵀ` as a transposed view, a buffer prefix at an offset,
    /// a tail of the destination's own rows, padded rows, single rows, columns and k = 1 —
    /// and refuses what BLAS cannot take.
    #[test]
    fn column_major_gemm_adds_the_row_major_product() {
        let values = |n: usize, seed: usize| -> Vec<f64> {
            (0..n)
                .map(|i| ((i * 7 + seed * 13) % 11) as f64 - 5.0)
                .collect()
        };
        // (destination, lhs, rhs); `None` rhs: the destination's rows after `top` (a tail)
        let cases: [(Mat, Mat, Option<Mat>); 7] = [
            // dst += Wᵀ · gy: W [2, 3] → Wᵀ 3×2 strides (1, 3); dst a prefix at offset 7
            (
                mat(3, 5, 7, 5, 1),
                mat(3, 2, 0, 1, 3),
                Some(mat(2, 5, 4, 5, 1)),
            ),
            // contiguous lhs, transposed rhs view
            (
                mat(4, 3, 0, 3, 1),
                mat(4, 6, 2, 6, 1),
                Some(mat(6, 3, 1, 1, 6)),
            ),
            // padded destination rows (stride 9 for 4 columns), k = 1
            (
                mat(2, 4, 3, 9, 1),
                mat(2, 1, 5, 1, 1),
                Some(mat(1, 4, 0, 4, 1)),
            ),
            // one row, one column
            (
                mat(1, 6, 0, 6, 1),
                mat(1, 3, 0, 3, 1),
                Some(mat(3, 6, 0, 6, 1)),
            ),
            (
                mat(5, 1, 2, 1, 1),
                mat(5, 2, 0, 1, 5),
                Some(mat(2, 1, 3, 1, 1)),
            ),
            // a tail: rows [0, 3) += Wᵀ · rows [3, 5) of one view at offset 6
            (mat(5, 4, 6, 4, 1), mat(3, 2, 0, 1, 3), None),
            (mat(6, 8, 0, 8, 1), mat(2, 4, 0, 1, 2), None),
        ];
        for (n, &(d, a, b)) in cases.iter().enumerate() {
            let (d, b) = match b {
                Some(b) => (d, b),
                None => {
                    let top = a.rows;
                    (d.rows(0, top), d.rows(top, d.rows - top))
                }
            };
            let tail = cases[n].2.is_none();
            let g = ColMajorGemm::of("test", d, a, b).unwrap_or_else(|e| panic!("case {n}: {e}"));
            let av = values(64, 1);
            let mut dv = values(96, 2);
            let bv = if tail { dv.clone() } else { values(64, 3) };
            let mut want = dv.clone();
            row_major_on_host(d, a, b, &av, &bv, &mut want);
            col_major_gemm_on_host(g, &bv, &av, &mut dv);
            assert_eq!(dv, want, "case {n}: {g:?}");
            assert_ne!(dv, values(96, 2), "case {n} added nothing");
        }
        // refused: a transposed destination, an operand without a unit stride, a mismatch
        let bad = [
            (mat(3, 4, 0, 1, 3), mat(3, 2, 0, 2, 1), mat(2, 4, 0, 4, 1)),
            (mat(3, 4, 0, 4, 1), mat(3, 2, 0, 4, 2), mat(2, 4, 0, 4, 1)),
            (mat(3, 4, 0, 4, 1), mat(3, 2, 0, 2, 1), mat(3, 4, 0, 4, 1)),
        ];
        for (d, a, b) in bad {
            assert!(
                ColMajorGemm::of("test", d, a, b).is_err(),
                "{d:?} {a:?} {b:?}"
            );
        }
    }
}
