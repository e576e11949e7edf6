//! Hostile case and result files: truncated, lying headers, wrong dtypes, missing and unknown
//! tensors, oversized headers, shapes implying an invalid config, byte limits. Each is refused
//! from its header, before its data are read, with an error naming the file and the tensor;
//! PyTorch's extra `num_batches_tracked` scalars are accepted.

use candle_core::{DType, Device};
use impls::case::header::{HEADER_MEMORY_FACTOR, LOAD_OVERHEAD_BYTES, MAX_HEADER_BYTES};
use impls::case::{load_result, load_result_with_limit, save_result};
use impls::check::compare::compare;
use impls::{Case, Config, Family, Spatial, Variant};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

/// One tensor of a hand-made safetensors file: name, dtype, shape, bytes.
struct T {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn t(name: &str, dtype: &'static str, shape: &[usize], data: Vec<u8>) -> T {
    T {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

/// Serialises tensors back to back, as safetensors does.
fn safetensors(tensors: &[T]) -> Vec<u8> {
    let mut header = Map::new();
    let mut pos = 0usize;
    for x in tensors {
        header.insert(
            x.name.clone(),
            json!({"dtype": x.dtype, "shape": x.shape, "data_offsets": [pos, pos + x.data.len()]}),
        );
        pos += x.data.len();
    }
    let mut out = with_header(&Value::Object(header).to_string());
    for x in tensors {
        out.extend_from_slice(&x.data);
    }
    out
}

/// The 8-byte length and the JSON.
fn with_header(json: &str) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out
}

/// Splits a safetensors file into its header (as JSON) and its data section.
fn split(bytes: &[u8]) -> (Map<String, Value>, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header.as_object().unwrap().clone(), bytes[8 + n..].to_vec())
}

fn join(header: &Map<String, Value>, data: &[u8]) -> Vec<u8> {
    let mut out = with_header(&Value::Object(header.clone()).to_string());
    out.extend_from_slice(data);
    out
}

struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    fn new() -> Dir {
        Dir {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
    /// A valid tiny case file of `family` (f64), its bytes and the case.
    fn valid(&self, family: Family) -> (Vec<u8>, Case) {
        let case = Case::random(&Config::tiny(family), &Device::Cpu).unwrap();
        let p = self.dir.path().join(format!("valid-{family}.safetensors"));
        case.save(&p).unwrap();
        (std::fs::read(&p).unwrap(), case)
    }
}

/// Loads `path` as a case, expecting an error; returns its message.
fn load_err(path: &Path, limit: Option<u64>) -> String {
    match Case::load_with_limit(path, None, &Device::Cpu, limit) {
        Ok(c) => panic!("{} loaded as {}", path.display(), c.cfg.describe()),
        Err(e) => e.to_string(),
    }
}

/// The error names the file and every fragment.
fn assert_names(e: &str, path: &Path, fragments: &[&str]) {
    assert!(
        e.starts_with(&path.display().to_string()),
        "the file is named first: {e}"
    );
    for f in fragments {
        assert!(e.contains(f), "expected `{f}` in: {e}");
    }
}

#[test]
fn truncated_file_is_refused_naming_the_tensor_cut_off() {
    let d = Dir::new();
    let (bytes, _) = d.valid(Family::Bc);
    let (header, data) = split(&bytes);
    // The tensor whose data ends last is the one a truncation cuts.
    let last = header
        .iter()
        .max_by_key(|(_, v)| v["data_offsets"][1].as_u64().unwrap())
        .map(|(k, _)| k.clone())
        .unwrap();
    let p = d.write("cut.safetensors", &bytes[..bytes.len() - 3]);
    let e = load_err(&p, None);
    assert_names(
        &e,
        &p,
        &[
            &format!("tensor `{last}`"),
            &format!("{} bytes of data", data.len() - 3),
            "truncated",
        ],
    );
    // Cut inside the header, and before the header length is complete.
    let p = d.write("cut-header.safetensors", &bytes[..20]);
    assert_names(
        &load_err(&p, None),
        &p,
        &["header length field says", "truncated"],
    );
    let p = d.write("cut-len.safetensors", &bytes[..5]);
    assert_names(
        &load_err(&p, None),
        &p,
        &["the file is 5 bytes", "8-byte header length"],
    );
    let p = d.write("empty.safetensors", &[]);
    assert_names(&load_err(&p, None), &p, &["the file is 0 bytes"]);
}

#[test]
fn header_claiming_4_gib_of_data_is_refused_without_reading_it() {
    let d = Dir::new();
    // `input` claims [2^30] f32 = 4 GiB; the file is sparse: 4 GiB long but takes no disk.
    let four_gib: u64 = 1 << 32;
    let json =
        json!({"input": {"dtype": "F32", "shape": [1usize << 30], "data_offsets": [0, four_gib]}})
            .to_string();
    let p = d.write("huge.safetensors", &with_header(&json));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(8 + json.len() as u64 + four_gib)
        .unwrap();
    // Structurally sound, but the family's weights are missing: refused from the header.
    let e = load_err(&p, None);
    assert_names(&e, &p, &["layers.0.weight", "case of neither family"]);
    // A header that claims more data than the file holds, refused with the sizes.
    let short = d.write("short.safetensors", &with_header(&json));
    let e = load_err(&short, None);
    assert_names(
        &e,
        &short,
        &["tensor `input`", "ends at byte 4294967296", "only 0 bytes"],
    );
}

#[test]
fn byte_limit_refuses_a_load_that_would_not_fit_naming_the_limit() {
    let d = Dir::new();
    let (bytes, case) = d.valid(Family::Bc);
    let p = d.write("case.safetensors", &bytes);
    let (_, data) = split(&bytes);
    // The JSON length as written (safetensors pads the header with spaces).
    let json_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    // Exactly what the load charges: tensors + header × factor + fixed overhead.
    let needed = data.len() as u64 + json_len * HEADER_MEMORY_FACTOR + LOAD_OVERHEAD_BYTES;
    let loaded = Case::load_with_limit(&p, None, &Device::Cpu, Some(needed)).unwrap();
    // The seed is not stored in a case file; every other field is inferred.
    let seed0 = Config {
        seed: 0,
        ..case.cfg.clone()
    };
    assert_eq!(loaded.cfg, seed0);
    let e = load_err(&p, Some(needed - 1));
    assert_names(
        &e,
        &p,
        &[
            &format!("needs {needed} bytes"),
            &format!("the memory limit = {} bytes", needed - 1),
        ],
    );
    // A limit below even the header's parse cost is refused before the JSON is read.
    let e = load_err(&p, Some(10));
    assert_names(&e, &p, &["parsing the", "the memory limit = 10 bytes"]);
}

#[test]
fn wrong_dtypes_are_named_with_what_was_expected() {
    let d = Dir::new();
    let (bytes, _) = d.valid(Family::Mlp);
    let (mut header, data) = split(&bytes);
    // One f64 weight relabelled as i64 (same size: the layout stays consistent).
    header["layers.1.weight"]["dtype"] = json!("I64");
    let p = d.write("i64.safetensors", &join(&header, &data));
    assert_names(
        &load_err(&p, None),
        &p,
        &["tensor `layers.1.weight` has dtype i64, expected f64"],
    );
    // The input in f16 (half the bytes): the config's dtype itself is refused.
    let x = t("input", "F16", &[2, 3], vec![0; 12]);
    let p = d.write("f16.safetensors", &safetensors(&[x]));
    assert_names(
        &load_err(&p, None),
        &p,
        &["tensor `input` has dtype f16, expected f32, f64 or bf16"],
    );
    // An unknown dtype name.
    let (mut header, data) = split(&bytes);
    header["input"]["dtype"] = json!("Q7");
    let p = d.write("q7.safetensors", &join(&header, &data));
    assert_names(
        &load_err(&p, None),
        &p,
        &["tensor `input`", "unknown dtype `Q7`"],
    );
}

#[test]
fn missing_and_unknown_tensors_are_named() {
    let d = Dir::new();
    let (bytes, case) = d.valid(Family::Bc);
    // Missing: drop one tensor from the case and save it.
    let mut missing = case.clone();
    missing.params.tensors.remove("denselayer3.conv2.weight");
    let p = d.dir.path().join("missing.safetensors");
    missing.save(&p).unwrap();
    assert_names(
        &load_err(&p, None),
        &p,
        &[
            "tensor `denselayer3.conv2.weight` is missing",
            "[2, 4, 3, 3]",
        ],
    );
    // Unknown: an extra tensor that is not PyTorch's BatchNorm counter.
    let (header, data) = split(&bytes);
    let mut tensors: Vec<T> = Vec::new();
    for (name, v) in &header {
        let [b, e] = [0, 1].map(|i| v["data_offsets"][i].as_u64().unwrap() as usize);
        let shape: Vec<usize> = v["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        tensors.push(t(name, "F64", &shape, data[b..e].to_vec()));
    }
    tensors.push(t("denselayer1.conv3.weight", "F64", &[1], vec![0; 8]));
    let p = d.write("unknown.safetensors", &safetensors(&tensors));
    assert_names(
        &load_err(&p, None),
        &p,
        &[
            "tensor `denselayer1.conv3.weight`",
            "not a tensor of bc",
            "unknown name",
        ],
    );
    // A counter of a layer the block does not have is unknown too.
    tensors.pop();
    tensors.push(t(
        "denselayer9.norm1.num_batches_tracked",
        "I64",
        &[],
        vec![0; 8],
    ));
    let p = d.write("counter9.safetensors", &safetensors(&tensors));
    assert_names(
        &load_err(&p, None),
        &p,
        &["denselayer9.norm1.num_batches_tracked"],
    );
}

#[test]
fn pytorch_num_batches_tracked_scalars_are_accepted_and_skipped() {
    let d = Dir::new();
    let (bytes, case) = d.valid(Family::Bc);
    let (header, data) = split(&bytes);
    let mut tensors: Vec<T> = Vec::new();
    for (name, v) in &header {
        let [b, e] = [0, 1].map(|i| v["data_offsets"][i].as_u64().unwrap() as usize);
        let shape: Vec<usize> = v["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        tensors.push(t(name, "F64", &shape, data[b..e].to_vec()));
    }
    for i in 1..=case.cfg.depth {
        for n in [1, 2] {
            let name = format!("denselayer{i}.norm{n}.num_batches_tracked");
            tensors.push(t(&name, "I64", &[], 5i64.to_le_bytes().to_vec()));
        }
    }
    let p = d.write("torch.safetensors", &safetensors(&tensors));
    let loaded = Case::load(&p, None, &Device::Cpu).unwrap();
    let v = Variant::NAIVE;
    let c = compare(&loaded.step(v).unwrap(), &case.step(v).unwrap()).unwrap();
    assert!(c.overall.bitwise, "the extras change nothing");
    // A counter with the wrong dtype is refused, naming it.
    let last = tensors.len() - 1;
    tensors[last] = t(&tensors[last].name.clone(), "F64", &[], vec![0; 8]);
    let p = d.write("torch-f64-counter.safetensors", &safetensors(&tensors));
    assert_names(
        &load_err(&p, None),
        &p,
        &["denselayer3.norm2.num_batches_tracked", "must be one i64"],
    );
}

#[test]
fn oversized_header_is_refused_before_it_is_read() {
    let d = Dir::new();
    // A header length of 2^40 in a 16-byte file, and one byte over the limit in a file that
    // really is that long (sparse).
    let mut bytes = (1u64 << 40).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}      ");
    let p = d.write("2tb-header.safetensors", &bytes);
    assert_names(
        &load_err(&p, None),
        &p,
        &[
            "the header's JSON needs 1099511627776 bytes",
            &format!("MAX_HEADER_BYTES = {MAX_HEADER_BYTES} bytes"),
        ],
    );
    let over = MAX_HEADER_BYTES + 1;
    let p = d.write("over.safetensors", &over.to_le_bytes());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(8 + over)
        .unwrap();
    assert_names(&load_err(&p, None), &p, &[&format!("needs {over} bytes")]);
}

#[test]
fn inconsistent_offsets_are_refused_naming_the_tensor() {
    let d = Dir::new();
    let (bytes, _) = d.valid(Family::Mlp);
    let (header, data) = split(&bytes);
    let first = |h: &Map<String, Value>| {
        h.iter()
            .find(|(_, v)| v["data_offsets"][0] == 0)
            .map(|(k, _)| k.clone())
            .unwrap()
    };
    // Offsets that do not match shape × dtype size.
    let mut h = header.clone();
    let name = first(&h);
    let end = h[&name]["data_offsets"][1].as_u64().unwrap();
    h[&name]["data_offsets"][1] = json!(end - 8);
    let p = d.write("short-span.safetensors", &join(&h, &data));
    assert_names(
        &load_err(&p, None),
        &p,
        &[
            &format!("tensor `{name}`"),
            &format!("span {} bytes", end - 8),
        ],
    );
    // Two tensors on the same bytes: an overlap.
    let mut h = header.clone();
    let other = h
        .keys()
        .find(|k| **k != name && *k != "__metadata__")
        .unwrap()
        .clone();
    h[&other]["data_offsets"] = h[&name]["data_offsets"].clone();
    h[&other]["shape"] = h[&name]["shape"].clone();
    let p = d.write("overlap.safetensors", &join(&h, &data));
    let e = load_err(&p, None);
    assert_names(&e, &p, &["an overlap"]);
    // Extra bytes after the last tensor.
    let mut padded = data.clone();
    padded.extend_from_slice(&[0; 16]);
    let p = d.write("trailing.safetensors", &join(&header, &padded));
    assert_names(
        &load_err(&p, None),
        &p,
        &["16 unexplained bytes at the end"],
    );
    // A rank beyond MAX_RANK, a duplicate name, and JSON that is not a header.
    let json = r#"{"input":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}"#;
    let mut f = with_header(json);
    f.extend_from_slice(&[0; 4]);
    let p = d.write("rank9.safetensors", &f);
    assert_names(
        &load_err(&p, None),
        &p,
        &["tensor `input`", "more than MAX_RANK = 8"],
    );
    let json = r#"{"input":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"input":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let mut f = with_header(json);
    f.extend_from_slice(&[0; 8]);
    let p = d.write("dup.safetensors", &f);
    assert_names(&load_err(&p, None), &p, &["tensor `input` appears twice"]);
    let p = d.write("garbage.safetensors", &with_header("not json"));
    assert_names(&load_err(&p, None), &p, &["not a safetensors JSON header"]);
}

#[test]
fn shapes_implying_an_invalid_config_are_refused_by_validation() {
    let d = Dir::new();
    // bc input with batch 0 (zero bytes, so the layout is consistent): batch = 0 refused.
    let tensors = [
        t("input", "F64", &[0, 3, 3, 3], vec![]),
        t(
            "denselayer1.conv1.weight",
            "F64",
            &[4, 3, 1, 1],
            vec![0; 96],
        ),
        t(
            "denselayer1.conv2.weight",
            "F64",
            &[2, 4, 3, 3],
            vec![0; 576],
        ),
    ];
    let p = d.write("batch0.safetensors", &safetensors(&tensors));
    assert_names(
        &load_err(&p, None),
        &p,
        &["batch = 0", "must be at least 1"],
    );
    // conv1 outputs 5 channels with k = 2: not bn_size·k.
    let tensors = [
        t("input", "F64", &[2, 3, 3, 3], vec![0; 432]),
        t(
            "denselayer1.conv1.weight",
            "F64",
            &[5, 3, 1, 1],
            vec![0; 120],
        ),
        t(
            "denselayer1.conv2.weight",
            "F64",
            &[2, 5, 3, 3],
            vec![0; 720],
        ),
    ];
    let p = d.write("bn.safetensors", &safetensors(&tensors));
    assert_names(
        &load_err(&p, None),
        &p,
        &[
            "tensor `denselayer1.conv1.weight`",
            "not a positive multiple",
        ],
    );
    // A 1×1 map with batch 1: BatchNorm would see one value per channel.
    let tensors = [
        t("input", "F64", &[1, 3, 1, 1], vec![0; 24]),
        t(
            "denselayer1.conv1.weight",
            "F64",
            &[4, 3, 1, 1],
            vec![0; 96],
        ),
        t(
            "denselayer1.conv2.weight",
            "F64",
            &[2, 4, 3, 3],
            vec![0; 576],
        ),
    ];
    let p = d.write("bn1.safetensors", &safetensors(&tensors));
    assert_names(&load_err(&p, None), &p, &["batch = 1", "BatchNorm"]);
    // A non-square map is accepted (H = 3 and W = 4 read from `input` in order): the header
    // check goes on to the next tensor, whose expected shape carries both sides.
    let tensors = [
        t("input", "F64", &[2, 3, 3, 4], vec![0; 576]),
        t(
            "denselayer1.conv1.weight",
            "F64",
            &[4, 3, 1, 1],
            vec![0; 96],
        ),
        t(
            "denselayer1.conv2.weight",
            "F64",
            &[2, 4, 3, 3],
            vec![0; 576],
        ),
    ];
    let p = d.write("rect.safetensors", &safetensors(&tensors));
    assert_names(
        &load_err(&p, None),
        &p,
        &["tensor `grad_output` is missing", "[2, 5, 3, 4]", " 3x4 "],
    );
}

#[test]
fn a_directory_is_not_a_case_file() {
    let d = Dir::new();
    let e = load_err(d.dir.path(), None);
    assert!(e.contains("not a regular file"), "{e}");
}

#[test]
fn result_files_are_checked_from_their_header_too() {
    let d = Dir::new();
    let cfg = Config {
        dtype: DType::F32,
        ..Config::tiny(Family::Bc)
    };
    let case = Case::random(&cfg, &Device::Cpu).unwrap();
    let result = case.step(Variant::NAIVE).unwrap();
    let p = d.dir.path().join("result.safetensors");
    save_result(&result, &p).unwrap();
    let back = load_result(&cfg, &p, &Device::Cpu).unwrap();
    assert!(compare(&back, &result).unwrap().overall.bitwise);
    // Read with the wrong config: a deeper block lacks layer 4's tensors; a wider growth finds
    // every name but the first tensor's shape differs (C0 + L·k = 3 + 3·3 = 12 channels).
    let deeper = Config {
        depth: 4,
        ..cfg.clone()
    };
    let e = load_result(&deeper, &p, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert_names(
        &e,
        &p,
        &["tensor `grad.denselayer4.norm1.weight` is missing"],
    );
    let wider = Config {
        growth: 3,
        ..cfg.clone()
    };
    let e = load_result(&wider, &p, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert_names(
        &e,
        &p,
        &["tensor `output` has shape [2, 9, 3, 3], expected [2, 12, 3, 3]"],
    );
    // In the wrong dtype.
    let f64 = Config {
        dtype: DType::F64,
        ..cfg.clone()
    };
    let e = load_result(&f64, &p, &Device::Cpu).unwrap_err().to_string();
    assert_names(&e, &p, &["tensor `output` has dtype f32, expected f64"]);
    // Under a limit too small, naming it.
    let e = load_result_with_limit(&cfg, &p, &Device::Cpu, Some(1000))
        .unwrap_err()
        .to_string();
    assert_names(&e, &p, &["the memory limit = 1000 bytes"]);
    // An invalid config is refused before the file is opened.
    let bad = Config {
        size: Spatial::square(4_294_967_297),
        ..cfg
    };
    let e = load_result(&bad, &p, &Device::Cpu).unwrap_err().to_string();
    assert!(e.contains("size = 4294967297"), "{e}");
}

/// `__metadata__`: densebench's activation key must say `on` or `off`; other writers' keys,
/// of any JSON type, are no reason to refuse a file.
#[test]
fn case_metadata_is_checked_where_it_is_densebenchs() {
    let d = Dir::new();
    let (bytes, case) = d.valid(Family::Mlp);
    let (header, data) = split(&bytes);
    assert_eq!(
        header["__metadata__"][impls::case::ACTIVATION_KEY],
        json!(if case.cfg.activation { "on" } else { "off" })
    );
    let mut h = header.clone();
    h["__metadata__"][impls::case::ACTIVATION_KEY] = json!("maybe");
    let p = d.write("maybe.safetensors", &join(&h, &data));
    assert_names(&load_err(&p, None), &p, &["`maybe` is not `on` or `off`"]);
    let mut h = header.clone();
    h["__metadata__"] = json!({"format": "pt", "steps": 3, "nested": {"a": [1, 2]}});
    let p = d.write("foreign.safetensors", &join(&h, &data));
    let loaded = Case::load(&p, None, &Device::Cpu).unwrap();
    assert!(loaded.cfg.activation, "no key: on");
}

/// A FIFO named as a case file is refused at once, never opened and waited on (opening a FIFO
/// blocks until a writer comes; the load checks the path first and opens with O_NONBLOCK).
#[cfg(unix)]
#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("case.safetensors");
    let c = std::ffi::CString::new(fifo.to_str().expect("utf-8 path")).expect("no NUL");
    // SAFETY: a valid NUL-terminated path and a mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(
            Case::load(&path, None, &Device::Cpu)
                .err()
                .map(|e| e.to_string()),
        );
    });
    let err = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("loading a FIFO must not block")
        .expect("a FIFO is not a case file");
    assert!(err.contains("not a regular file"), "{err}");
}

/// Defects found by a hostile user (session 25): a case missing a layer in the middle (its
/// tensors packed correctly) was blamed on `grad_output`'s shape; a step's result file given as
/// a case was "missing `input`"; a file of neither family named a tensor
/// `layers.0.weight or denselayer1.conv1.weight`; a NaN input or an infinite upstream gradient
/// loaded, and every result was NaN; and the messages gave the block a `seed=0` a case file does
/// not have.
#[test]
fn gaps_results_foreign_files_and_non_finite_values_are_named() {
    let d = Dir::new();
    for family in [Family::Bc, Family::Mlp] {
        let (_, case) = d.valid(family);
        assert!(case.cfg.depth >= 3, "the tiny block has a middle layer");
        // layer 2 (of 3) dropped whole
        let mut gap = case.clone();
        let prefix = match family {
            Family::Bc => "denselayer2.",
            Family::Mlp => "layers.1.",
        };
        gap.params.tensors.retain(|k, _| !k.starts_with(prefix));
        let p = d.dir.path().join(format!("gap-{family}.safetensors"));
        gap.save(&p).unwrap();
        let e = load_err(&p, None);
        let first = match family {
            Family::Bc => "denselayer2.conv1.weight",
            Family::Mlp => "layers.1.weight",
        };
        assert_names(
            &e,
            &p,
            &[&format!("tensor `{first}` is missing"), "without a gap"],
        );
        assert!(!e.contains("grad_output"), "{e}");
        // a step's results
        let result = case.step(Variant::NAIVE).unwrap();
        let p = d.dir.path().join(format!("result-{family}.safetensors"));
        save_result(&result, &p).unwrap();
        assert_names(
            &load_err(&p, None),
            &p,
            &["is a step's results", "not a case"],
        );
        // non-finite values, in the input and in the upstream gradient
        for (name, bad) in [("input", f64::NAN), ("grad_output", f64::INFINITY)] {
            let mut c = case.clone();
            let t = if name == "input" {
                &mut c.input
            } else {
                &mut c.grad_output
            };
            let mut v: Vec<f64> = t.flatten_all().unwrap().to_vec1().unwrap();
            v[1] = bad;
            *t = candle_core::Tensor::from_vec(v, t.shape(), &Device::Cpu).unwrap();
            let p = d.dir.path().join(format!("{name}-{family}.safetensors"));
            c.save(&p).unwrap();
            let e = load_err(&p, None);
            assert_names(
                &e,
                &p,
                &[
                    &format!("tensor `{name}`"),
                    "1 value(s) are NaN or infinite",
                    "flat index 1",
                ],
            );
        }
    }
    // neither family's first weight
    let p = d.write(
        "foreign.safetensors",
        &safetensors(&[t("input", "F64", &[2, 2], vec![0; 32])]),
    );
    let e = load_err(&p, None);
    assert_names(&e, &p, &["case of neither family", "`layers.0.weight`"]);
    assert!(!e.contains(" or denselayer"), "{e}");
    // no seed in a case's block description
    let (_, case) = d.valid(Family::Bc);
    let mut missing = case.clone();
    missing.params.tensors.remove("denselayer3.conv2.weight");
    let p = d.dir.path().join("missing-seed.safetensors");
    missing.save(&p).unwrap();
    let e = load_err(&p, None);
    assert!(!e.contains("seed="), "{e}");
}
