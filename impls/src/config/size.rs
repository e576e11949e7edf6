//! Size products that cannot wrap: an expression over named config fields, evaluated with
//! checked `u128` arithmetic, that can say which field made it too large and print itself.
//!
//! `Config::validate` builds one expression per quantity it bounds (`batch·(channels +
//! depth·growth)·size·size`, …). When a quantity is over its limit, the error blames the field
//! that contributes most: at each `·` or `+` the larger operand (an overflowing one counts as
//! infinite), down to a field. So `size = 4294967297` is blamed on `size`, not on `depth`.

use std::fmt::Write;
use std::ops::{Add, Mul};

/// A non-negative integer expression over named fields.
#[derive(Debug, Clone)]
pub(crate) enum Size {
    /// A config field, by the name the user writes (`batch`, `size`, …), with its value.
    Field(&'static str, u128),
    /// A constant factor of the model (the 9 taps of a 3×3 convolution, …); never blamed.
    Const(u128),
    Add(Box<Size>, Box<Size>),
    Mul(Box<Size>, Box<Size>),
    /// `x·(x−1)/2 = Σ_{i<x} i`, for sums over layers.
    Tri(Box<Size>),
    /// `x − 1` (0 for x = 0): the index of the last layer.
    Less1(Box<Size>),
}

impl Size {
    pub(crate) fn field(name: &'static str, value: usize) -> Size {
        Size::Field(name, value as u128)
    }

    /// The value, or `None` when it does not fit in `u128`.
    pub(crate) fn eval(&self) -> Option<u128> {
        match self {
            Size::Field(_, v) | Size::Const(v) => Some(*v),
            Size::Add(a, b) => a.eval()?.checked_add(b.eval()?),
            Size::Mul(a, b) => a.eval()?.checked_mul(b.eval()?),
            Size::Tri(x) => {
                let x = x.eval()?;
                // One of x and x−1 is even: halve it first so nothing overflows needlessly.
                let (a, b) = if x % 2 == 0 {
                    (x / 2, x.saturating_sub(1))
                } else {
                    (x, x.saturating_sub(1) / 2)
                };
                a.checked_mul(b)
            }
            Size::Less1(x) => Some(x.eval()?.saturating_sub(1)),
        }
    }

    /// The field contributing most to the value, with its value (`None` for a constant).
    pub(crate) fn blame(&self) -> Option<(&'static str, u128)> {
        match self {
            Size::Field(name, v) => Some((name, *v)),
            Size::Const(_) => None,
            Size::Tri(x) | Size::Less1(x) => x.blame(),
            Size::Add(a, b) | Size::Mul(a, b) => {
                // `None` (overflow) is larger than any value; a constant loses to any field.
                let key = |s: &Size| (s.blame().is_some(), s.eval().map_or(u128::MAX, |v| v));
                let (first, second) = if key(b) > key(a) { (b, a) } else { (a, b) };
                first.blame().or_else(|| second.blame())
            }
        }
    }

    /// The expression with field names, e.g. `batch·(channels + depth·growth)`.
    pub(crate) fn formula(&self) -> String {
        let mut s = String::new();
        self.write(&mut s, &|name, _| name.to_string());
        s
    }

    /// The expression with the values put in, e.g. `2·(3 + 3·2)`.
    pub(crate) fn values(&self) -> String {
        let mut s = String::new();
        self.write(&mut s, &|_, v| v.to_string());
        s
    }

    /// The value as text: the number, or `more than 2^128` when it overflows even `u128`.
    pub(crate) fn value_text(&self) -> String {
        self.eval()
            .map_or_else(|| "more than 2^128".to_string(), |v| v.to_string())
    }

    fn write(&self, out: &mut String, leaf: &dyn Fn(&str, u128) -> String) {
        match self {
            Size::Field(name, v) => out.push_str(&leaf(name, *v)),
            Size::Const(v) => {
                let _ = write!(out, "{v}");
            }
            Size::Add(a, b) => {
                a.write(out, leaf);
                out.push_str(" + ");
                b.write(out, leaf);
            }
            Size::Mul(a, b) => {
                for (i, x) in [a, b].into_iter().enumerate() {
                    if i > 0 {
                        out.push('·');
                    }
                    let paren = matches!(**x, Size::Add(..));
                    if paren {
                        out.push('(');
                    }
                    x.write(out, leaf);
                    if paren {
                        out.push(')');
                    }
                }
            }
            Size::Tri(x) => {
                let mut inner = String::new();
                x.write(&mut inner, leaf);
                let simple = matches!(**x, Size::Field(..) | Size::Const(_));
                let inner = if simple { inner } else { format!("({inner})") };
                let _ = write!(out, "{inner}·({inner} − 1)/2");
            }
            Size::Less1(x) => {
                out.push('(');
                x.write(out, leaf);
                out.push_str(" − 1)");
            }
        }
    }
}

impl Add for Size {
    type Output = Size;
    fn add(self, rhs: Size) -> Size {
        Size::Add(Box::new(self), Box::new(rhs))
    }
}

impl Mul for Size {
    type Output = Size;
    fn mul(self, rhs: Size) -> Size {
        Size::Mul(Box::new(self), Box::new(rhs))
    }
}

#[cfg(test)]
mod tests {
    use super::Size;

    #[test]
    fn blames_the_field_that_overflows_and_prints_both_forms() {
        let e = Size::field("batch", 2)
            * (Size::field("channels", 3) + Size::field("depth", 3) * Size::field("growth", 2))
            * Size::field("size", 4_294_967_297)
            * Size::field("size", 4_294_967_297);
        assert_eq!(e.formula(), "batch·(channels + depth·growth)·size·size");
        assert_eq!(e.values(), "2·(3 + 3·2)·4294967297·4294967297");
        // 18·(2^32 + 1)² fits in u128 and is ≈ 3.3e20.
        assert_eq!(e.eval(), Some(18 * 4_294_967_297u128 * 4_294_967_297));
        assert_eq!(e.blame(), Some(("size", 4_294_967_297)));
        // A constant is never blamed, even when it is the larger operand.
        let c = Size::Const(9) * Size::field("growth", 2);
        assert_eq!(c.blame(), Some(("growth", 2)));
        // Overflow beyond u128 is reported, and blamed on the overflowing operand.
        let big = Size::field("batch", 1) * Size::field("size", usize::MAX);
        let huge = big.clone() * big.clone() * big;
        assert_eq!(huge.eval(), None);
        assert_eq!(huge.value_text(), "more than 2^128");
        assert_eq!(huge.blame(), Some(("size", usize::MAX as u128)));
        // Σ_{i<5} i = 10; for odd and even x alike.
        assert_eq!(
            Size::Tri(Box::new(Size::field("depth", 5))).eval(),
            Some(10)
        );
        assert_eq!(Size::Tri(Box::new(Size::field("depth", 4))).eval(), Some(6));
        assert_eq!(Size::Tri(Box::new(Size::field("depth", 1))).eval(), Some(0));
    }
}
