//! Layers point one way: no import cycle between the modules of `engine`, `loadgen` or
//! `reports`.
//!
//! Every `crate::`, `super::` and `self::` path in non-test code is an edge from the file it
//! is written in to the module it names (the longest prefix of the path that is a module
//! file, so a path through a re-export is an edge to the re-exporting module). Only
//! `#[cfg(test)] mod NAME { … }` blocks are test code. Cycles are looked for between files
//! and between top-level modules (each file counted as its first path segment). A module
//! naming its own child modules by a plain path (`mod.rs`'s `pub use child::Thing`) is not an
//! edge: a parent's surface is made of its children, which may use the parent's shared
//! pieces through `super::`. Paths inside an inline non-test `mod x { … }` resolve from the
//! file's module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate's modules: `a::b` for `src/a/b.rs` or `src/a/b/mod.rs`, `""` for lib.rs.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<String, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                let mut p = prefix.to_vec();
                p.push(name);
                walk(&path, &p, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let mut p = prefix.to_vec();
                if !(name == "mod" || (prefix.is_empty() && (name == "lib" || name == "main"))) {
                    p.push(name.clone());
                }
                if name != "main" {
                    out.insert(p.join("::"), path);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, &[], &mut out);
    out
}

/// `text` without comments, string and char literals, and `#[cfg(test)] mod NAME { … }`.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && b.get(i + 1).is_some_and(|&c| c == b'"' || c == b'#') {
            // A raw string r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(b[i] as char);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            j += 1;
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i += 3;
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            i += 2;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    strip_test_modules(&out)
}

/// Removes each `#[cfg(test)]` followed by `mod NAME { … }` (brace-matched).
fn strip_test_modules(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_mod = ["mod ", "pub mod ", "pub(crate) mod ", "pub(super) mod "]
            .iter()
            .any(|start| trimmed.starts_with(start));
        let open = trimmed.find('{');
        let semicolon = trimmed.find(';');
        if !is_mod || open.is_none() || semicolon.is_some_and(|s| s < open.unwrap()) {
            out.push_str(&rest[..at + "#[cfg(test)]".len()]);
            rest = after;
            continue;
        }
        out.push_str(&rest[..at]);
        let body = &trimmed[open.unwrap()..];
        let mut depth = 0;
        let mut end = body.len();
        for (k, c) in body.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &body[end..];
    }
    out.push_str(rest);
    out
}

/// The paths written in `code` that start with `crate`, `super` or `self`, `use` trees
/// expanded (`crate::{a, b::{c, d}}` gives `crate::a`, `crate::b::c`, `crate::b::d`).
fn paths(code: &str) -> Vec<Vec<String>> {
    let tokens = tokenize(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        let starts = matches!(t.as_str(), "crate" | "super" | "self")
            && tokens.get(i + 1).is_some_and(|n| n == "::")
            && (i == 0 || tokens[i - 1] != "::");
        if starts {
            let (mut found, next) = tree(&tokens, i, Vec::new());
            out.append(&mut found);
            i = next;
        } else {
            i += 1;
        }
    }
    out
}

/// Identifiers, `::`, braces and commas; everything else one character each.
fn tokenize(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
        } else if c.is_whitespace() {
            i += 1;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// Reads the path (or use tree) starting at `tokens[i]` under `prefix`; returns every full
/// path and the index after it.
fn tree(tokens: &[String], mut i: usize, mut prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    loop {
        let t = &tokens[i];
        if t == "{" {
            let mut out = Vec::new();
            i += 1;
            while i < tokens.len() && tokens[i] != "}" {
                if tokens[i] == "," {
                    i += 1;
                    continue;
                }
                let (mut found, next) = tree(tokens, i, prefix.clone());
                out.append(&mut found);
                i = next;
            }
            return (out, i + 1);
        }
        if !(t.chars().all(|c| c.is_alphanumeric() || c == '_')) {
            return (vec![prefix], i);
        }
        prefix.push(t.clone());
        i += 1;
        if tokens.get(i).is_some_and(|n| n == "::") {
            i += 1;
        } else {
            return (vec![prefix], i);
        }
    }
}

/// The module a path written in module `from` names: resolves `crate`, `super` and `self`,
/// then takes the longest prefix that is a module.
fn target(from: &str, path: &[String], mods: &BTreeMap<String, PathBuf>) -> Option<String> {
    let mut base: Vec<String> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").map(String::from).collect()
    };
    let rest = match path.first()?.as_str() {
        "crate" => {
            base.clear();
            &path[1..]
        }
        "self" => &path[1..],
        "super" => {
            // `super` is the module path's parent (a mod.rs's module is its folder).
            let k = path.iter().take_while(|s| *s == "super").count();
            for _ in 0..k {
                base.pop();
            }
            &path[k..]
        }
        _ => return None,
    };
    let mut full = base;
    full.extend(rest.iter().cloned());
    (0..=full.len())
        .rev()
        .map(|n| full[..n].join("::"))
        .find(|m| mods.contains_key(m))
}

/// Import edges between a crate's modules (files), self-edges left out.
fn edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, file) in &mods {
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        for path in paths(&code) {
            if let Some(to) = target(name, &path, &mods) {
                if &to != name {
                    out.entry(name.clone()).or_default().insert(to);
                }
            }
        }
    }
    out
}

/// Every cycle's members (strongly connected components of more than one node).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Kosaraju: order by finish time, then walk the reversed graph.
    let nodes: BTreeSet<&String> = edges
        .iter()
        .flat_map(|(a, bs)| std::iter::once(a).chain(bs.iter()))
        .collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    fn visit<'a>(
        n: &'a String,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        seen: &mut BTreeSet<&'a String>,
        order: &mut Vec<&'a String>,
    ) {
        if !seen.insert(n) {
            return;
        }
        for m in edges.get(n).into_iter().flatten() {
            visit(m, edges, seen, order);
        }
        order.push(n);
    }
    for n in &nodes {
        visit(n, edges, &mut seen, &mut order);
    }
    let mut reversed: BTreeMap<&String, Vec<&String>> = BTreeMap::new();
    for (a, bs) in edges {
        for b in bs {
            reversed.entry(b).or_default().push(a);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for n in order.into_iter().rev() {
        if assigned.contains(n) {
            continue;
        }
        let mut component = Vec::new();
        let mut stack = vec![n];
        while let Some(x) = stack.pop() {
            if !assigned.insert(x) {
                continue;
            }
            component.push(x.clone());
            stack.extend(reversed.get(x).into_iter().flatten().copied());
        }
        if component.len() > 1 {
            component.sort();
            out.push(component);
        }
    }
    out
}

/// The same edges between top-level modules (a file counts as its first path segment; the
/// crate root as `lib`).
fn top_level(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let top = |m: &String| match m.split("::").next() {
        Some("") | None => "lib".to_string(),
        Some(t) => t.to_string(),
    };
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, bs) in edges {
        for b in bs {
            if top(a) != top(b) {
                out.entry(top(a)).or_default().insert(top(b));
            }
        }
    }
    out
}

fn assert_no_cycles(krate: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src");
    let files = edges(&src);
    assert!(
        files.values().map(BTreeSet::len).sum::<usize>() > 10,
        "{krate}: too few import edges found; the scanner is broken"
    );
    let between_files = cycles(&files);
    let between_modules = cycles(&top_level(&files));
    assert!(
        between_files.is_empty() && between_modules.is_empty(),
        "{krate}: import cycles between files {between_files:?} and between top-level modules \
         {between_modules:?}"
    );
}

#[test]
fn loadgen_modules_import_one_way() {
    assert_no_cycles("loadgen");
}

#[test]
fn reports_modules_import_one_way() {
    assert_no_cycles("reports");
}

/// The checker itself: it sees a cycle through a use tree and a `super::` path, ignores
/// test modules, comments and strings, and counts a re-export as an edge to its module.
#[test]
fn the_checker_finds_cycles_and_ignores_tests() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("b")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    std::fs::write(
        src.join("a.rs"),
        "use crate::{b::{c::Thing}};\n// crate::d::x\nconst S: &str = \"crate::b\";\n",
    )
    .unwrap();
    std::fs::write(src.join("b/mod.rs"), "pub mod c;\npub use c::Thing;\n").unwrap();
    std::fs::write(
        src.join("b/c.rs"),
        "pub struct Thing;\n#[cfg(test)]\nmod tests { use crate::a::X; }\n\
         #[cfg(test)]\npub(crate) mod shared { use crate::a::Y; }\n",
    )
    .unwrap();
    let e = edges(src);
    assert_eq!(
        e.get("a").cloned().unwrap_or_default(),
        ["b::c".to_string()].into()
    );
    assert!(cycles(&e).is_empty(), "{e:?}");
    // A real edge back from b::c to a makes a cycle between files and between modules.
    std::fs::write(
        src.join("b/c.rs"),
        "pub struct Thing;\nfn f() { super::super::a::g(); }\n",
    )
    .unwrap();
    let e = edges(src);
    assert_eq!(cycles(&e), vec![vec!["a".to_string(), "b::c".to_string()]]);
    assert_eq!(
        cycles(&top_level(&e)),
        vec![vec!["a".to_string(), "b".to_string()]]
    );
    // A path through the re-export is an edge to the re-exporting module.
    std::fs::write(src.join("a.rs"), "use crate::b::Thing;\n").unwrap();
    assert_eq!(edges(src)["a"], ["b".to_string()].into());
}

#[test]
fn engine_modules_import_one_way() {
    assert_no_cycles("engine");
}

/// loadgen's wings, each importing only the wings after it (a leaf module such as `units` or
/// `gate` belongs to none): `commands` parse, print and map exit codes; `experiments` run
/// many runs; `mock` serves and calibrates; `run` executes one run; `spec` is the typed
/// options; `wire` sends; `load` says what is sent and when.
const WINGS: [&str; 7] = [
    "commands",
    "experiments",
    "mock",
    "run",
    "spec",
    "wire",
    "load",
];

fn wing(module: &str) -> Option<usize> {
    let top = module.split("::").next()?;
    WINGS.iter().position(|w| *w == top)
}

fn loadgen_edges() -> BTreeMap<String, BTreeSet<String>> {
    edges(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The wings point one way: no module imports a wing listed before its own, so nothing in
/// `load/`, `wire/` or `run/` imports `experiments/`, and `mock/` imports no command.
#[test]
fn loadgen_wings_point_one_way() {
    let files = loadgen_edges();
    assert!(
        files.keys().any(|m| m.starts_with("experiments::"))
            && files.keys().any(|m| m.starts_with("wire::")),
        "the scanner is broken: {:?}",
        files.keys().collect::<Vec<_>>()
    );
    let mut upward: Vec<String> = Vec::new();
    for (from, tos) in &files {
        for to in tos {
            if let (Some(a), Some(b)) = (wing(from), wing(to)) {
                if b < a {
                    upward.push(format!("{from} -> {to}"));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the wings' order: {upward:?}"
    );
}

/// No command imports another: a subcommand's shared work lives in a wing below
/// `commands`, never in another command's file.
#[test]
fn no_command_imports_another() {
    let files = loadgen_edges();
    assert!(
        files.contains_key("commands::sweep"),
        "the scanner is broken"
    );
    let crossings: Vec<String> = files
        .iter()
        .filter(|(from, _)| from.starts_with("commands::"))
        .flat_map(|(from, tos)| {
            tos.iter()
                .filter(|to| to.starts_with("commands::") || to.as_str() == "commands")
                .map(move |to| format!("{from} -> {to}"))
        })
        .collect();
    assert!(
        crossings.is_empty(),
        "commands importing commands: {crossings:?}"
    );
}

/// A run does not link the mock server: nothing any module of `run/` reaches imports
/// `mock/`; calibration, which runs the mock, is called from `experiments::launch` and the
/// `calibrate` command.
#[test]
fn a_run_does_not_reach_the_mock() {
    let files = loadgen_edges();
    let mut frontier: Vec<String> = files
        .keys()
        .filter(|m| m.starts_with("run::"))
        .cloned()
        .collect();
    let mut reached: BTreeSet<String> = frontier.iter().cloned().collect();
    while let Some(module) = frontier.pop() {
        // A module reached reaches its children too: a parent's `pub use child::X` is no edge.
        let children = files
            .keys()
            .filter(|m| m.starts_with(&format!("{module}::")));
        for next in files.get(&module).into_iter().flatten().chain(children) {
            if reached.insert(next.clone()) {
                frontier.push(next.clone());
            }
        }
    }
    assert!(
        reached.contains("run::send") && reached.contains("wire::client"),
        "the scanner is broken: {reached:?}"
    );
    let mock: Vec<&String> = reached
        .iter()
        .filter(|m| *m == "mock" || m.starts_with("mock::"))
        .collect();
    assert!(mock.is_empty(), "run/ reaches {mock:?}");
}

/// reports judges what loadgen sends: it imports nothing of loadgen, in its code or its
/// manifest.
#[test]
fn reports_imports_nothing_of_loadgen() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("reports");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let depends: Vec<&str> = manifest
        .lines()
        .filter(|l| l.trim_start().starts_with("loadgen") || l.contains("../loadgen"))
        .collect();
    assert!(
        depends.is_empty(),
        "reports/Cargo.toml depends on loadgen: {depends:?}"
    );
    let mods = modules(&root.join("src"));
    assert!(mods.len() > 10, "the scanner is broken");
    let naming: Vec<&String> = mods
        .iter()
        .filter(|(_, path)| {
            code_only(&std::fs::read_to_string(path).unwrap()).contains("loadgen::")
        })
        .map(|(m, _)| m)
        .collect();
    assert!(
        naming.is_empty(),
        "reports modules naming loadgen: {naming:?}"
    );
}

/// Nothing below the typed options sees a command-line type: no module of `run/`, `wire/`
/// or `load/` names clap or `RunArgs` (outside its tests), nor imports a module that does
/// (`spec::run_args`, where the clap types live); they read `spec::RunSpec`.
#[test]
fn below_the_spec_no_command_line_types() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    let files = edges(&src);
    assert!(mods.contains_key("run::prepare"), "the scanner is broken");
    let names_clap = |m: &str| {
        mods.get(m).is_some_and(|path| {
            let code = code_only(&std::fs::read_to_string(path).unwrap());
            code.contains("clap") || code.contains("RunArgs")
        })
    };
    assert!(names_clap("spec::run_args"), "the scanner is broken");
    let below = |m: &str| ["run", "wire", "load"].contains(&m.split("::").next().unwrap_or(""));
    let mut seen: Vec<String> = Vec::new();
    for m in mods.keys().filter(|m| below(m)) {
        if names_clap(m) {
            seen.push(m.clone());
        }
        for to in files.get(m).into_iter().flatten() {
            if names_clap(to) {
                seen.push(format!("{m} -> {to}"));
            }
        }
    }
    assert!(
        seen.is_empty(),
        "command-line types below the spec: {seen:?}"
    );
}

/// The leaves `units` (value parsing) and `gate` (exit codes) import no module of loadgen.
#[test]
fn the_leaves_import_nothing_of_loadgen() {
    let files = loadgen_edges();
    assert!(files.contains_key("commands::run"), "the scanner is broken");
    for leaf in ["units", "gate"] {
        let to = files.get(leaf).cloned().unwrap_or_default();
        assert!(to.is_empty(), "{leaf} imports {to:?}");
    }
}

fn engine_edges() -> BTreeMap<String, BTreeSet<String>> {
    edges(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("engine")
            .join("src"),
    )
}

/// Every module that `from` modules reach through imports, a reached module's children
/// included (a parent's `pub use child::X` is no edge).
fn reached_from(
    files: &BTreeMap<String, BTreeSet<String>>,
    from: impl Fn(&str) -> bool,
) -> BTreeSet<String> {
    let mut frontier: Vec<String> = files.keys().filter(|m| from(m)).cloned().collect();
    let mut reached: BTreeSet<String> = frontier.iter().cloned().collect();
    while let Some(module) = frontier.pop() {
        let children = files
            .keys()
            .filter(|m| m.starts_with(&format!("{module}::")));
        for next in files.get(&module).into_iter().flatten().chain(children) {
            if reached.insert(next.clone()) {
                frontier.push(next.clone());
            }
        }
    }
    reached
}

/// The engine's chat formats reach no handler: nothing `server::formats` imports leads to
/// the HTTP handlers (`server::http`, `server::info`), the server's root (which starts it)
/// or the response writer; a format answers the request room and the writer, never the
/// other way round.
#[test]
fn engine_chat_formats_reach_no_handler() {
    let files = engine_edges();
    let reached = reached_from(&files, |m| {
        m == "server::formats" || m.starts_with("server::formats::")
    });
    assert!(
        reached.contains("server::formats::harmony") && reached.contains("server::tools"),
        "the scanner is broken: {reached:?}"
    );
    let handlers: Vec<&String> = reached
        .iter()
        .filter(|m| {
            [
                "server",
                "server::http",
                "server::info",
                "server::engine_loop",
            ]
            .contains(&m.as_str())
                || m.starts_with("server::response::")
                || m.starts_with("server::request::")
        })
        .collect();
    assert!(handlers.is_empty(), "server::formats reaches {handlers:?}");
}

/// The backends import nothing of the server, directly or through another module.
#[test]
fn engine_backends_reach_nothing_of_the_server() {
    let files = engine_edges();
    let reached = reached_from(&files, |m| m == "backend" || m.starts_with("backend::"));
    assert!(
        reached.contains("backend::cpu") && reached.contains("config"),
        "the scanner is broken: {reached:?}"
    );
    let server: Vec<&String> = reached
        .iter()
        .filter(|m| *m == "server" || m.starts_with("server::"))
        .collect();
    assert!(server.is_empty(), "backend reaches {server:?}");
}

/// No chat format reads a case it cannot reach: no `unreachable!` in any file under
/// `engine/src/server/formats/` nor in any engine file named for harmony, test code included.
#[test]
fn engine_chat_formats_have_no_unreachable_arm() {
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let engine = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("engine");
    let mut files = Vec::new();
    rust_files(&engine.join("src"), &mut files);
    rust_files(&engine.join("tests"), &mut files);
    let formats = engine.join("src").join("server").join("formats");
    let checked: Vec<&PathBuf> = files
        .iter()
        .filter(|p| {
            p.starts_with(&formats)
                || p.file_name()
                    .is_some_and(|n| n.to_string_lossy().contains("harmony"))
        })
        .collect();
    assert!(
        checked.len() >= 6,
        "the scanner is broken: it found {checked:?}"
    );
    let with: Vec<&&PathBuf> = checked
        .iter()
        .filter(|p| std::fs::read_to_string(p).unwrap().contains("unreachable!"))
        .collect();
    assert!(with.is_empty(), "`unreachable!` in {with:?}");
}
