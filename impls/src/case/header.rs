//! The header of a safetensors file, read and checked before any tensor data is touched.
//!
//! A safetensors file is an 8-byte little-endian header length `n`, `n` bytes of JSON mapping
//! each tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` (plus an optional
//! `__metadata__` object), then the tensor data, offsets relative to its start. [`read_header`]
//! bounds `n` ([`MAX_HEADER_BYTES`], and the caller's byte limit), checks it against the file's
//! length, parses the JSON into typed entries without building a generic JSON tree (a shape
//! longer than [`MAX_RANK`] is refused while parsing), and checks that every entry's
//! `data_offsets` span exactly its shape × dtype size and that the entries tile the data section
//! exactly: no gap, no overlap, nothing missing at the end, nothing after it. Only then does
//! [`read_f32`]/[`read_f64`] read a tensor, allocating exactly its declared size.

use crate::error::{Error, Result};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Seek, SeekFrom};

/// Longest JSON header accepted. A bc block of depth 10 000 (12 tensors per layer, including
/// PyTorch's `num_batches_tracked`, ≈ 90 bytes of JSON each) has a header of ≈ 11 MB; a longer
/// one is not a densebench case file and is refused before it is read.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;

/// Highest tensor rank accepted (densebench's tensors have rank ≤ 4).
pub const MAX_RANK: usize = 8;

/// Bytes a load may take in memory per byte of header JSON, besides the tensor data: the JSON
/// itself while parsed, then per entry its name, a 56-byte record and a map node, the list of
/// expected tensors built from the inferred config, and each tensor's own header (shape,
/// strides, reference count ≈ 300 bytes) — per-tensor costs, and each tensor has an entry of
/// ≥ 50 bytes of JSON. Measured 6.8 and 7.7 on 300-layer bc and mlp case files (headers that
/// outweigh their tiny tensors, fixed overhead included); 16 leaves a margin. Charged against
/// the caller's byte limit before the JSON is read; `tests/case_file_fuzz.rs` counts every
/// allocation of a load and checks it stays under the charge.
pub const HEADER_MEMORY_FACTOR: u64 = 16;

/// Fixed bytes a load may allocate besides the header and the tensors (the file handle, the
/// expected-tensor list of a small block, error messages), charged against the byte limit.
pub const LOAD_OVERHEAD_BYTES: u64 = 64 << 10;

/// Bytes of one read from the file while a tensor is decoded (a multiple of every dtype size).
const READ_CHUNK_BYTES: usize = 16 << 10;

/// Element types a safetensors file may declare, with their sizes in bytes.
const DTYPES: [(&str, u64); 15] = [
    ("BOOL", 1),
    ("U8", 1),
    ("I8", 1),
    ("F8_E5M2", 1),
    ("F8_E4M3", 1),
    ("I16", 2),
    ("U16", 2),
    ("F16", 2),
    ("BF16", 2),
    ("I32", 4),
    ("U32", 4),
    ("F32", 4),
    ("F64", 8),
    ("I64", 8),
    ("U64", 8),
];

/// One tensor as the header declares it, already checked for consistency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The safetensors dtype name (`F32`, `F64`, `I64`, …).
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    /// Byte range within the data section.
    pub begin: u64,
    pub end: u64,
}

impl Entry {
    pub fn bytes(&self) -> u64 {
        self.end - self.begin
    }
}

/// A checked header: the entries by name and where the data section lies in the file.
#[derive(Debug, Clone)]
pub struct Header {
    pub entries: BTreeMap<String, Entry>,
    /// The `__metadata__` object's string values (safetensors' free-form `str → str` map;
    /// values of other types are skipped): densebench's own keys are `densebench.*`.
    pub metadata: BTreeMap<String, String>,
    /// Bytes of JSON.
    pub json_len: u64,
    /// Offset of the data section in the file: 8 + `json_len`.
    pub data_start: u64,
    /// Bytes of the data section, exactly tiled by the entries.
    pub data_len: u64,
}

fn bad(what: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::BadFile {
        what: what.into(),
        reason: reason.into(),
    }
}

fn io(what: &str, source: std::io::Error) -> Error {
    bad(what, source.to_string())
}

/// Reads and checks the header of a safetensors file of `file_len` bytes from `r`, positioned
/// at its start. `max_bytes` bounds what the parsed header may take in memory (the JSON length
/// × [`HEADER_MEMORY_FACTOR`]); `None` leaves only [`MAX_HEADER_BYTES`].
pub fn read_header<R: Read>(r: &mut R, file_len: u64, max_bytes: Option<u64>) -> Result<Header> {
    if file_len < 8 {
        return Err(bad(
            "header",
            format!(
                "the file is {file_len} bytes, shorter than the 8-byte header length every \
                 safetensors file starts with"
            ),
        ));
    }
    let mut len = [0u8; 8];
    r.read_exact(&mut len).map_err(|e| io("header length", e))?;
    let json_len = u64::from_le_bytes(len);
    if json_len > MAX_HEADER_BYTES && json_len > file_len - 8 {
        // More than the limit and the whole file: most likely not a safetensors file at all.
        let text = std::str::from_utf8(&len)
            .ok()
            .filter(|t| t.chars().all(|c| c.is_ascii_graphic() || c == ' '))
            .map(|t| format!(" (its first 8 bytes are the text `{t}`)"))
            .unwrap_or_default();
        return Err(bad(
            "header",
            format!(
                "not a safetensors file{text}: read as a header length, its first 8 bytes say \
                 the header's JSON needs {json_len} bytes, more than MAX_HEADER_BYTES = \
                 {MAX_HEADER_BYTES} bytes and than the whole file ({file_len} bytes)"
            ),
        ));
    }
    if json_len > MAX_HEADER_BYTES {
        return Err(Error::OverLimit {
            what: "the header's JSON".to_string(),
            needed: json_len.into(),
            limit_name: "MAX_HEADER_BYTES".to_string(),
            limit: MAX_HEADER_BYTES.into(),
        });
    }
    if json_len > file_len - 8 {
        return Err(bad(
            "header",
            format!(
                "the header length field says {json_len} bytes of JSON, but only {} bytes \
                 follow it (truncated file?)",
                file_len - 8
            ),
        ));
    }
    let parse_bytes = u128::from(json_len) * u128::from(HEADER_MEMORY_FACTOR);
    if let Some(limit) = max_bytes {
        if parse_bytes > u128::from(limit) {
            return Err(Error::OverLimit {
                what: format!("parsing the {json_len}-byte header"),
                needed: parse_bytes,
                limit_name: "the memory limit".to_string(),
                limit: limit.into(),
            });
        }
    }
    // json_len ≤ MAX_HEADER_BYTES, so it fits in usize on every host densebench builds on.
    let mut json = vec![0u8; json_len as usize];
    r.read_exact(&mut json).map_err(|e| io("header", e))?;
    let parsed: Parsed = serde_json::from_slice(&json)
        .map_err(|e| bad("header", format!("not a safetensors JSON header: {e}")))?;
    drop(json);
    let data_start = 8 + json_len;
    let data_len = file_len - data_start;
    check_layout(&parsed.0, data_len)?;
    Ok(Header {
        entries: parsed.0,
        metadata: parsed.1,
        json_len,
        data_start,
        data_len,
    })
}

/// Every entry spans exactly its shape × dtype size, and the entries tile `[0, data_len)`.
fn check_layout(entries: &BTreeMap<String, Entry>, data_len: u64) -> Result<()> {
    let size_of = |dtype: &str| {
        DTYPES
            .iter()
            .find(|(n, _)| *n == dtype)
            .map_or(0, |(_, s)| *s)
    };
    for (name, e) in entries {
        let what = || format!("tensor `{name}`");
        let elements = e
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        let bytes = elements.and_then(|n| n.checked_mul(size_of(e.dtype)));
        let Some(bytes) = bytes else {
            return Err(bad(
                what(),
                format!(
                    "shape {:?} of {} overflows a 64-bit byte count",
                    e.shape, e.dtype
                ),
            ));
        };
        if e.end < e.begin || e.end - e.begin != bytes {
            return Err(bad(
                what(),
                format!(
                    "shape {:?} of {} takes {bytes} bytes, but its data_offsets [{}, {}] \
                     span {}",
                    e.shape,
                    e.dtype,
                    e.begin,
                    e.end,
                    if e.end < e.begin {
                        "a negative range".to_string()
                    } else {
                        format!("{} bytes", e.end - e.begin)
                    }
                ),
            ));
        }
    }
    let mut order: Vec<(&String, &Entry)> = entries.iter().collect();
    order.sort_by_key(|(name, e)| (e.begin, e.end, *name));
    let mut pos = 0u64;
    let mut prev: Option<&str> = None;
    for (name, e) in order {
        if e.begin != pos {
            let after = prev.map_or("the start of the data".to_string(), |p| {
                format!("tensor `{p}`, which ends at byte {pos}")
            });
            let how = if e.begin > pos { "a gap" } else { "an overlap" };
            return Err(bad(
                format!("tensor `{name}`"),
                format!(
                    "its data starts at byte {} of the data section, {how} after {after} \
                     (safetensors tensors are packed back to back)",
                    e.begin
                ),
            ));
        }
        if e.end > data_len {
            return Err(bad(
                format!("tensor `{name}`"),
                format!(
                    "its data ends at byte {} of the data section, but the file holds only \
                     {data_len} bytes of data after the header (truncated file?)",
                    e.end
                ),
            ));
        }
        pos = e.end;
        prev = Some(name);
    }
    if pos != data_len {
        return Err(bad(
            "data",
            format!(
                "the header's tensors cover {pos} bytes, but the file holds {data_len} bytes \
                 of data after the header ({} unexplained bytes at the end)",
                data_len - pos
            ),
        ));
    }
    Ok(())
}

/// Reads `entry`'s data as f32 values (little-endian), allocating exactly its size.
pub fn read_f32<R: Read + Seek>(r: &mut R, header: &Header, entry: &Entry) -> Result<Vec<f32>> {
    read_values(r, header, entry, f32::from_le_bytes)
}

/// Reads `entry`'s data as f64 values (little-endian), allocating exactly its size.
pub fn read_f64<R: Read + Seek>(r: &mut R, header: &Header, entry: &Entry) -> Result<Vec<f64>> {
    read_values(r, header, entry, f64::from_le_bytes)
}

/// Reads `entry`'s data as bf16 values (little-endian), allocating exactly its size.
pub fn read_bf16<R: Read + Seek>(
    r: &mut R,
    header: &Header,
    entry: &Entry,
) -> Result<Vec<half::bf16>> {
    read_values(r, header, entry, half::bf16::from_le_bytes)
}

fn read_values<R: Read + Seek, T, const W: usize>(
    r: &mut R,
    header: &Header,
    entry: &Entry,
    decode: fn([u8; W]) -> T,
) -> Result<Vec<T>> {
    let what = "tensor data";
    let count = usize::try_from(entry.bytes() / W as u64)
        .map_err(|_| bad(what, "more elements than this host can address"))?;
    r.seek(SeekFrom::Start(header.data_start + entry.begin))
        .map_err(|e| io(what, e))?;
    let mut out = Vec::with_capacity(count);
    let mut chunk = [0u8; READ_CHUNK_BYTES];
    let mut left = count * W;
    while left > 0 {
        let n = left.min(READ_CHUNK_BYTES);
        r.read_exact(&mut chunk[..n]).map_err(|e| io(what, e))?;
        for bytes in chunk[..n].chunks_exact(W) {
            let mut a = [0u8; W];
            a.copy_from_slice(bytes);
            out.push(decode(a));
        }
        left -= n;
    }
    Ok(out)
}

/// The JSON header as typed entries (duplicate names refused).
struct Parsed(BTreeMap<String, Entry>, BTreeMap<String, String>);

/// One `__metadata__` value: a string is kept, anything else skipped (not a reason to refuse
/// a file that another writer annotated).
#[derive(Deserialize)]
#[serde(untagged)]
enum MetaValue {
    Text(String),
    Other(IgnoredAny),
}

impl<'de> Deserialize<'de> for Parsed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Parsed;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object mapping tensor names to their descriptions")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Parsed, A::Error> {
                let mut out = BTreeMap::new();
                let mut meta = BTreeMap::new();
                while let Some(name) = map.next_key::<String>()? {
                    if name == "__metadata__" {
                        let m: Option<BTreeMap<String, MetaValue>> = map
                            .next_value()
                            .map_err(|e| de::Error::custom(format!("`__metadata__`: {e}")))?;
                        meta = m
                            .unwrap_or_default()
                            .into_iter()
                            .filter_map(|(k, v)| match v {
                                MetaValue::Text(t) => Some((k, t)),
                                MetaValue::Other(_) => None,
                            })
                            .collect();
                        continue;
                    }
                    let raw: RawEntry = map
                        .next_value()
                        .map_err(|e| de::Error::custom(format!("tensor `{name}`: {e}")))?;
                    let entry = Entry {
                        dtype: raw.dtype.0,
                        shape: raw.shape.0,
                        begin: raw.data_offsets[0],
                        end: raw.data_offsets[1],
                    };
                    if out.insert(name.clone(), entry).is_some() {
                        return Err(de::Error::custom(format!("tensor `{name}` appears twice")));
                    }
                }
                Ok(Parsed(out, meta))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    dtype: DTypeName,
    shape: Shape,
    data_offsets: [u64; 2],
}

/// A safetensors dtype name, resolved while parsing (unknown names refused).
struct DTypeName(&'static str);

impl<'de> Deserialize<'de> for DTypeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DTypeName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a safetensors dtype name such as \"F32\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<DTypeName, E> {
                DTYPES
                    .iter()
                    .find(|(n, _)| *n == s)
                    .map(|(n, _)| DTypeName(n))
                    .ok_or_else(|| {
                        // Quote at most a few characters of a hostile name.
                        let shown: String = s.chars().take(16).collect();
                        E::custom(format!("unknown dtype `{shown}`"))
                    })
            }
        }
        d.deserialize_str(V)
    }
}

/// A shape of at most [`MAX_RANK`] dimensions (a longer one is refused while parsing, so a
/// hostile header cannot make it allocate more than its own length).
struct Shape(Vec<usize>);

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Shape;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "an array of at most {MAX_RANK} dimensions")
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Shape, A::Error> {
                let mut dims = Vec::new();
                while let Some(d) = seq.next_element::<u64>()? {
                    if dims.len() == MAX_RANK {
                        return Err(de::Error::custom(format!(
                            "shape has more than MAX_RANK = {MAX_RANK} dimensions"
                        )));
                    }
                    let d = usize::try_from(d).map_err(|_| {
                        de::Error::custom(format!("dimension {d} does not fit in usize"))
                    })?;
                    dims.push(d);
                }
                Ok(Shape(dims))
            }
        }
        d.deserialize_seq(V)
    }
}
