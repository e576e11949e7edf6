//! The spatial size of a bc block's feature maps, H × W: written `32` when square (H = W = 32)
//! and `HxW`, height first, otherwise (`360x480`, FC-DenseNet's CamVid frames). One value has
//! one text, so a config has one key: `3x3` is read as `3` and printed as `3`.
//!
//! The text is the sweep files' `size`, the `--size` flag, the result CSV's `size` column and
//! the size field of a row key. Parsing checks only the syntax (two decimal integers, each
//! fitting `usize`); zero sides are refused by [`crate::config::Config::validate`], which names
//! `size`, `height` or `width`.

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// Height and width of a feature map, in pixels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Spatial {
    /// H: rows of the image (the third axis of `[N, C, H, W]`).
    pub height: usize,
    /// W: columns of the image (the last axis, contiguous in memory).
    pub width: usize,
}

/// What a size is written as, for messages.
pub const SIZE_SYNTAX: &str =
    "expected an integer such as 32 (32×32) or HxW, height first, such as 360x480";

impl Spatial {
    /// H = W = `side`.
    pub const fn square(side: usize) -> Self {
        Spatial {
            height: side,
            width: side,
        }
    }

    pub const fn new(height: usize, width: usize) -> Self {
        Spatial { height, width }
    }

    pub fn is_square(self) -> bool {
        self.height == self.width
    }

    /// `HxW` even when square (`32x32`): for labels that show both sides.
    pub fn label(self) -> String {
        format!("{}x{}", self.height, self.width)
    }

    /// Reads `32` (32×32) or `HxW` (`360x480`); the error names `size`, the text and the part
    /// at fault.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |reason: String| Error::InvalidConfig {
            field: "size",
            value: format!("\"{text}\""),
            reason,
        };
        let side = |part: &str, which: &str| -> Result<usize> {
            if part.is_empty() {
                return Err(bad(format!("the {which} is missing: {SIZE_SYNTAX}")));
            }
            if !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(format!(
                    "the {which} `{part}` is not a non-negative integer: {SIZE_SYNTAX}"
                )));
            }
            part.parse::<usize>().map_err(|_| {
                bad(format!(
                    "the {which} {part} is more than usize::MAX = {}",
                    usize::MAX
                ))
            })
        };
        match text.split_once('x') {
            None => Ok(Spatial::square(side(text, "side")?)),
            Some((h, w)) => Ok(Spatial::new(side(h, "height")?, side(w, "width")?)),
        }
    }
}

impl From<usize> for Spatial {
    fn from(side: usize) -> Self {
        Spatial::square(side)
    }
}

/// `32` when square, `HxW` otherwise.
impl fmt::Display for Spatial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_square() {
            write!(f, "{}", self.height)
        } else {
            write!(f, "{}x{}", self.height, self.width)
        }
    }
}

impl FromStr for Spatial {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Spatial::parse(s)
    }
}

/// A square size is an integer (`32`, what schema-2 CSVs and JSON always held), any other the
/// string `HxW`.
impl serde::Serialize for Spatial {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        if self.is_square() {
            s.serialize_u64(self.height as u64)
        } else {
            s.collect_str(self)
        }
    }
}

/// Reads an integer (`32`) or a string (`"32"`, `"360x480"`).
impl<'de> serde::Deserialize<'de> for Spatial {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Spatial;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size: an integer such as 32 or HxW such as 360x480")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Spatial, E> {
                usize::try_from(v).map(Spatial::square).map_err(|_| {
                    E::custom(format!("size {v} is more than usize::MAX = {}", usize::MAX))
                })
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<Spatial, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("size {v} is negative: {SIZE_SYNTAX}")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Spatial, E> {
                Spatial::parse(v).map_err(|e| match e {
                    Error::InvalidConfig { value, reason, .. } => {
                        E::custom(format!("size {value}: {reason}"))
                    }
                    other => E::custom(other),
                })
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::Spatial;

    #[test]
    fn reads_and_prints_square_and_non_square_sizes() {
        for (text, h, w, shown) in [
            ("32", 32, 32, "32"),
            ("360x480", 360, 480, "360x480"),
            ("3x5", 3, 5, "3x5"),
            ("5x3", 5, 3, "5x3"),
            // Square written as HxW is the same size as its side: one key per config.
            ("7x7", 7, 7, "7"),
            ("0x5", 0, 5, "0x5"),
        ] {
            let s = Spatial::parse(text).map_err(|e| e.to_string());
            assert_eq!(s, Ok(Spatial::new(h, w)), "{text}");
            assert_eq!(Spatial::new(h, w).to_string(), shown);
        }
        assert_eq!(Spatial::square(32).label(), "32x32");
    }

    #[test]
    fn bad_sizes_are_one_line_naming_the_part() {
        for (text, part) in [
            ("", "side is missing"),
            ("5x", "width is missing"),
            ("x5", "height is missing"),
            ("axb", "height `a`"),
            ("3xb", "width `b`"),
            ("-3", "side `-3`"),
            ("3x5x7", "width `5x7`"),
            ("3 x 5", "height `3 `"),
            ("3X5", "side `3X5`"),
            ("99999999999999999999999x3", "more than usize::MAX"),
            (
                "3x99999999999999999999999",
                "width 99999999999999999999999 is more",
            ),
        ] {
            let e = Spatial::parse(text).map(|s| s.to_string());
            let e = e.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                e.starts_with("invalid config: size = ") && e.contains(part) && !e.contains('\n'),
                "{text:?}: {e}"
            );
        }
    }

    #[test]
    fn serde_reads_integers_and_strings_and_writes_squares_as_integers() {
        let j = |v: &str| serde_json::from_str::<Spatial>(v).map_err(|e| e.to_string());
        assert_eq!(j("32"), Ok(Spatial::square(32)));
        assert_eq!(j("\"32\""), Ok(Spatial::square(32)));
        assert_eq!(j("\"360x480\""), Ok(Spatial::new(360, 480)));
        assert!(j("-1").is_err_and(|e| e.contains("negative")));
        assert!(j("\"5x\"").is_err_and(|e| e.contains("width is missing")));
        let w = |s: Spatial| serde_json::to_string(&s).unwrap_or_default();
        assert_eq!(w(Spatial::square(32)), "32");
        assert_eq!(w(Spatial::new(3, 5)), "\"3x5\"");
    }
}
