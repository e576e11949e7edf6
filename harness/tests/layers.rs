//! The shape of the code, held by a test, for both crates of the workspace:
//!
//! - `harness/src` is a house of floors (`commands` over `outputs` over `results` over
//!   `measure` over `plan`, with `progress` importing nothing of the crate); no command imports
//!   another command.
//! - `impls/src` is a house of floors too (`case` over `step` over `strategies` over `model` over
//!   `layer` over `ops` over `config` over `check` over `error`); inside `ops`, the op families
//!   sit over `cpu` and `cuda`, which sit side by side (neither imports the other) over
//!   `layout`; and no module reaches another through the crate root's re-exports (`crate::Variant`),
//!   which would hide an upward import.
//! - In both, a floor imports only floors below it, and no crate has an import cycle between its
//!   modules.
//!
//! Imports are read from the sources: every `use` tree and every inline `crate::…`, `super::…`
//! and `self::…` path outside comments and outside the `#[cfg(test)]` module at the end of a
//! file, resolved to the module (file) it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside its crate, e.g. `["results", "row"]`; the crate root is `[]`.
type ModPath = Vec<String>;

/// Every module file under `src`: its module path and its source (comments and the trailing test
/// module removed).
fn modules(src: &Path) -> BTreeMap<ModPath, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for e in entries {
            let path = e.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|x| x.to_str()) != Some("rs") {
                continue;
            }
            let rel: PathBuf = path.strip_prefix(src).expect("under src").to_path_buf();
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            match parts.last().map(String::as_str) {
                // The binary's root is its own crate; it reaches the library as `densebench::`.
                Some("main") if parts.len() == 1 => continue,
                Some("lib") if parts.len() == 1 => parts.clear(),
                Some("mod") => {
                    parts.pop();
                }
                _ => {}
            }
            let text = std::fs::read_to_string(&path).expect("readable source");
            out.insert(parts, strip(&text));
        }
    }
    out
}

/// The source without `//` comments (doc comments name modules in links, they import nothing)
/// and without the test module that ends a file by convention.
fn strip(text: &str) -> String {
    let mut kept = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") && line.starts_with('#') {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        kept.push_str(line);
        kept.push('\n');
    }
    kept
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into full paths.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|s| !s.is_empty())
        .flat_map(expand)
        .map(|s| format!("{prefix}{s}"))
        .collect()
}

/// Every path the module's source refers to that starts with `crate`, `super` or `self`.
fn referenced_paths(src: &str) -> Vec<String> {
    let mut paths = Vec::new();
    // `use` trees, which may span lines and group with braces.
    let mut rest = src;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().last();
        let tail = &rest[i + 4..];
        rest = tail;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(end) = tail.find(';') {
            paths.extend(expand(&tail[..end]));
        }
    }
    // Inline paths, e.g. `crate::measure::gpu::check_available(n)`.
    for root in ["crate::", "super::"] {
        let mut at = 0;
        while let Some(i) = src[at..].find(root) {
            let start = at + i;
            let path: String = src[start..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            paths.push(path.trim_end_matches(':').to_string());
            at = start + root.len();
        }
    }
    paths
}

/// The module a path names: resolved against the importing module, then cut to the longest
/// prefix that is a module of the crate. `None` for paths outside the crate.
fn resolve(from: &ModPath, path: &str, known: &BTreeSet<ModPath>) -> Option<ModPath> {
    let segs: Vec<&str> = path
        .split("::")
        .map(|s| s.split(" as ").next().unwrap_or(s))
        .collect();
    // `self` and `super` are relative to the module the file defines.
    let mut base: ModPath = match segs.first().copied() {
        Some("crate") => Vec::new(),
        Some("self") => from.clone(),
        Some("super") => {
            let mut b = from.clone();
            b.pop();
            b
        }
        _ => return None,
    };
    let mut rest = &segs[1..];
    while rest.first() == Some(&"super") {
        base.pop();
        rest = &rest[1..];
    }
    let mut best = None;
    let mut cur = base.clone();
    if known.contains(&cur) {
        best = Some(cur.clone());
    }
    for s in rest {
        cur.push((*s).to_string());
        if known.contains(&cur) {
            best = Some(cur.clone());
        }
    }
    best
}

/// Every `crate::…` path of a module that names an item of the crate root itself (a re-export,
/// `crate::Variant`) rather than a module: `(module, path)`.
fn through_root(src: &Path) -> Vec<(String, String)> {
    let mods = modules(src);
    let known: BTreeSet<ModPath> = mods.keys().cloned().collect();
    let mut out = Vec::new();
    for (m, text) in &mods {
        if m.is_empty() {
            continue;
        }
        out.extend(
            root_paths(m, text, &known)
                .into_iter()
                .map(|p| (name(m), p)),
        );
    }
    out
}

/// The paths of one module's source that resolve to the crate root but name something in it.
fn root_paths(from: &ModPath, text: &str, known: &BTreeSet<ModPath>) -> Vec<String> {
    let paths: BTreeSet<String> = referenced_paths(text)
        .into_iter()
        .filter(|p| p.starts_with("crate::") && resolve(from, p, known) == Some(Vec::new()))
        .collect();
    paths.into_iter().collect()
}

/// Module → the modules it imports (itself, its ancestors and the crate root left out).
fn graph(src: &Path) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mods = modules(src);
    let known: BTreeSet<ModPath> = mods.keys().cloned().collect();
    let mut g = BTreeMap::new();
    for (m, text) in &mods {
        let mut deps = BTreeSet::new();
        for p in referenced_paths(text) {
            if let Some(target) = resolve(m, &p, &known) {
                if !target.is_empty() && &target != m && !m.starts_with(&target) {
                    deps.insert(target);
                }
            }
        }
        g.insert(m.clone(), deps);
    }
    g
}

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".to_string()
    } else {
        m.join("::")
    }
}

/// The first import cycle found, as a list of modules, or `None`.
fn find_cycle(g: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Active,
        Done,
    }
    fn visit(
        m: &ModPath,
        g: &BTreeMap<ModPath, BTreeSet<ModPath>>,
        marks: &mut BTreeMap<ModPath, Mark>,
        stack: &mut Vec<ModPath>,
    ) -> Option<Vec<String>> {
        marks.insert(m.clone(), Mark::Active);
        stack.push(m.clone());
        for d in g.get(m).into_iter().flatten() {
            match marks.get(d).copied().unwrap_or(Mark::New) {
                Mark::Active => {
                    let from = stack.iter().position(|x| x == d).unwrap_or(0);
                    let mut cyc: Vec<String> = stack[from..].iter().map(name).collect();
                    cyc.push(name(d));
                    return Some(cyc);
                }
                Mark::New => {
                    if let Some(c) = visit(d, g, marks, stack) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks.insert(m.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for m in g.keys() {
        if marks.get(m).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(c) = visit(m, g, &mut marks, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// The floor of a harness module: higher floors may import lower ones, never the reverse.
fn floor(m: &ModPath) -> Option<u8> {
    match m.first().map(String::as_str) {
        Some("progress") => Some(0),
        Some("plan") => Some(1),
        Some("measure") => Some(2),
        Some("results") => Some(3),
        Some("outputs") => Some(4),
        Some("commands") => Some(5),
        Some("cli") | None => Some(6),
        Some(_) => None,
    }
}

/// The floor of an impls module, `(floor, sub-floor)`: higher may import lower, never the
/// reverse. `ops` has sub-floors: its op families (2) over `cpu` and `cuda` (1) over `layout` (0).
fn impls_floor(m: &ModPath) -> Option<(u8, u8)> {
    let f = match m.first().map(String::as_str) {
        None => 10,
        Some("case") => 9,
        Some("step") => 8,
        Some("strategies") => 7,
        Some("model") => 6,
        Some("layer") => 5,
        Some("ops") => {
            let sub = match m.get(1).map(String::as_str) {
                None => 3,
                Some("layout") => 0,
                Some("cpu") | Some("cuda") => 1,
                Some(_) => 2,
            };
            return Some((4, sub));
        }
        Some("config") => 3,
        Some("check") => 2,
        Some("error") => 1,
        Some(_) => return None,
    };
    Some((f, 0))
}

/// What breaks the impls floors in an import graph: an import up a floor, or between the two
/// device sides of `ops` (`cpu` and `cuda`).
fn impls_violations(g: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<String> {
    let side = |m: &ModPath| {
        (m.first().map(String::as_str) == Some("ops"))
            .then(|| m.get(1).cloned())
            .flatten()
            .filter(|s| s == "cpu" || s == "cuda")
    };
    let mut bad = Vec::new();
    for (m, deps) in g {
        for d in deps {
            let (Some(fm), Some(fd)) = (impls_floor(m), impls_floor(d)) else {
                continue;
            };
            if fd > fm {
                bad.push(format!(
                    "{} (floor {fm:?}) imports {} (floor {fd:?})",
                    name(m),
                    name(d)
                ));
            }
            if let (Some(a), Some(b)) = (side(m), side(d)) {
                if a != b {
                    bad.push(format!(
                        "{} imports {}: ops::cpu and ops::cuda sit side by side",
                        name(m),
                        name(d)
                    ));
                }
            }
        }
    }
    bad
}

fn src_dir(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src")
}

#[test]
fn every_harness_module_sits_on_a_known_floor() {
    let g = graph(&src_dir("harness"));
    let lost: Vec<String> = g.keys().filter(|m| floor(m).is_none()).map(name).collect();
    assert!(
        lost.is_empty(),
        "modules outside the floors (put them in plan/, measure/, results/, outputs/ or \
         commands/, and teach this test their floor): {lost:?}"
    );
}

#[test]
fn no_import_goes_up_a_floor_and_no_command_imports_another() {
    let g = graph(&src_dir("harness"));
    let mut bad = Vec::new();
    for (m, deps) in &g {
        for d in deps {
            let (Some(fm), Some(fd)) = (floor(m), floor(d)) else {
                continue;
            };
            if fd > fm {
                bad.push(format!(
                    "{} (floor {fm}) imports {} (floor {fd})",
                    name(m),
                    name(d)
                ));
            }
            if fm == 5 && fd == 5 && m.len() > 1 && d.len() > 1 {
                bad.push(format!("command {} imports command {}", name(m), name(d)));
            }
            if fm == 0 {
                bad.push(format!(
                    "{} must import nothing of the crate, imports {}",
                    name(m),
                    name(d)
                ));
            }
        }
    }
    assert!(bad.is_empty(), "upward imports:\n{}", bad.join("\n"));
}

#[test]
fn no_import_cycles_in_the_workspace() {
    for krate in ["harness", "impls"] {
        let g = graph(&src_dir(krate));
        assert!(g.len() > 5, "{krate}: found only {} modules", g.len());
        if let Some(c) = find_cycle(&g) {
            panic!("{krate}: import cycle {}", c.join(" → "));
        }
    }
}

#[test]
fn every_impls_module_sits_on_a_known_floor() {
    let g = graph(&src_dir("impls"));
    let lost: Vec<String> = g
        .keys()
        .filter(|m| impls_floor(m).is_none())
        .map(name)
        .collect();
    assert!(
        lost.is_empty(),
        "impls modules outside the floors (put them in case/, strategies/, model/, layer/, ops/, \
         config/ or check/, and teach this test their floor): {lost:?}"
    );
}

#[test]
fn no_impls_import_goes_up_a_floor_or_through_the_root() {
    let g = graph(&src_dir("impls"));
    let bad = impls_violations(&g);
    assert!(bad.is_empty(), "impls upward imports:\n{}", bad.join("\n"));
    let via_root = through_root(&src_dir("impls"));
    assert!(
        via_root.is_empty(),
        "impls modules importing through the crate root's re-exports (import the defining \
         module instead): {via_root:?}"
    );
}

/// The impls checker on planted sources: an upward import, an import between `ops::cpu` and
/// `ops::cuda`, and a path through the root are each seen; the real tree's downward ones pass.
#[test]
fn the_impls_checker_sees_what_it_must() {
    let m = |s: &str| -> ModPath { s.split("::").map(String::from).collect() };
    let known: BTreeSet<ModPath> = [
        vec![],
        m("model"),
        m("strategies"),
        m("strategies::block"),
        m("layer"),
        m("ops"),
        m("ops::cpu"),
        m("ops::cpu::shared"),
        m("ops::cuda"),
        m("ops::cuda::bn"),
        m("ops::bn"),
        m("ops::layout"),
        m("ops::layout::grid"),
    ]
    .into_iter()
    .collect();
    let edges = |from: &str, src: &str| -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        let from = m(from);
        let deps = referenced_paths(src)
            .iter()
            .filter_map(|p| resolve(&from, p, &known))
            .filter(|d| !d.is_empty() && !from.starts_with(d))
            .collect();
        [(from, deps)].into_iter().collect()
    };
    let up = impls_violations(&edges(
        "model",
        "use crate::strategies::block::LayerSaved;\n",
    ));
    assert_eq!(up.len(), 1, "{up:?}");
    let sideways = impls_violations(&edges(
        "ops::cpu::shared",
        "fn f() { crate::ops::cuda::bn::bn_stats(); }\n",
    ));
    assert_eq!(sideways.len(), 1, "{sideways:?}");
    let down = impls_violations(&edges(
        "ops::bn",
        "use crate::ops::{cpu::shared::Float, cuda::bn, layout::grid::Grid};\n",
    ));
    assert!(down.is_empty(), "{down:?}");
    let up_in_ops = impls_violations(&edges(
        "ops::layout::grid",
        "use crate::ops::bn::bn_stats;\n",
    ));
    assert_eq!(up_in_ops.len(), 1, "{up_in_ops:?}");
    let root = root_paths(
        &m("layer"),
        "use crate::Variant;\nuse crate::ops;\n",
        &known,
    );
    assert_eq!(root, vec!["crate::Variant".to_string()]);
}

/// The checker itself: a planted upward import, a planted cycle and a grouped `use` are seen.
#[test]
fn the_checker_sees_what_it_must() {
    let known: BTreeSet<ModPath> = [
        vec![],
        vec!["plan".into()],
        vec!["plan".into(), "job".into()],
        vec!["results".into(), "row".into()],
        vec!["results".into()],
    ]
    .into_iter()
    .collect();
    let from: ModPath = vec!["plan".into(), "job".into()];
    let paths = referenced_paths(
        "use crate::{results::row::{Row, X}, plan::job};\nfn f() { crate::results::row::g(); }\n",
    );
    let targets: BTreeSet<String> = paths
        .iter()
        .filter_map(|p| resolve(&from, p, &known))
        .map(|m| name(&m))
        .collect();
    assert!(
        targets.contains("results::row"),
        "{targets:?} from {paths:?}"
    );
    assert!(floor(&["results".into()].to_vec()) > floor(&from));
    let mut g: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    g.insert(vec!["a".into()], [vec!["b".into()]].into_iter().collect());
    g.insert(vec!["b".into()], [vec!["a".into()]].into_iter().collect());
    assert!(find_cycle(&g).is_some());
    g.insert(vec!["b".into()], BTreeSet::new());
    assert!(find_cycle(&g).is_none());
    assert_eq!(
        resolve(
            &vec!["outputs".into(), "plots".into(), "grad_error".into()],
            "super::style::frame",
            &[vec!["outputs".into(), "plots".into(), "style".into()]]
                .into_iter()
                .collect()
        ),
        Some(vec![
            "outputs".to_string(),
            "plots".to_string(),
            "style".to_string()
        ])
    );
}
