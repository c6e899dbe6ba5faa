//! The gateway's layers point down: no import cycle between its top-level modules, and only the
//! layers above the HTTP routes (`config`, which composes every component's settings, and
//! `server`, which serves them) import `routes`; only `server` and `cli` import `config`; the
//! protocols and routes reach the engine only through the `generation` facade, never `pipeline`;
//! only the edge (`routes`, `protocols`, and `error` for its default body) imports wire types;
//! the facade and the pipeline take typed numbers, never JSON ones; the Responses API builds
//! template messages from its items, never chat's wire messages.
//! Read from the sources as they stand (paths through `crate::` and through `super::` chains that
//! climb to the crate root); `docs/architecture.md` draws the layers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`routes` for `routes/chat.rs`).
fn module_of(root: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(root).unwrap();
    let first = relative.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

/// The bottom floors that are crates of their own, re-exported at the crate root under their
/// module names: (`crate::` name, the crate's path). The compiler keeps them from importing the
/// gateway; this test still sees who imports them, by either path.
const FLOOR_CRATES: &[(&str, &str)] = &[
    ("openai", "turnpike_wire::openai"),
    ("anthropic", "turnpike_wire::anthropic"),
    ("text", "turnpike_text"),
    ("store", "turnpike_store"),
    ("error", "turnpike_core::error"),
    ("ids", "turnpike_core::ids"),
    ("clock", "turnpike_core::clock"),
];

/// How many `super::` steps climb from a file's module to the crate root: `routes/chat.rs` is
/// `crate::routes::chat`, two; `routes/mod.rs` is `crate::routes`, one.
fn depth(root: &Path, file: &Path) -> usize {
    let relative = file.strip_prefix(root).unwrap();
    let parts = relative.components().count();
    if relative.ends_with("mod.rs") {
        parts - 1
    } else {
        parts
    }
}

/// The root-relative prefix every path to the crate root starts with in a file `depth` modules
/// down: `crate::`, or `super::` repeated `depth` times.
fn root_prefixes(depth: usize) -> Vec<String> {
    let mut prefixes = vec!["crate::".to_string()];
    if depth > 0 {
        prefixes.push("super::".repeat(depth));
    }
    prefixes
}

/// The top-level modules the code of `text` (comments and unit tests left out) names through
/// `crate::`, or through a `super::` chain that reaches the crate root from a file `depth`
/// modules down, among `modules`.
fn imports(text: &str, depth: usize, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        for prefix in root_prefixes(depth) {
            found.extend(names_after(line, &prefix, modules));
        }
        for (name, path) in FLOOR_CRATES {
            if line.contains(path) {
                found.insert(name.to_string());
            }
        }
    }
    found
}

/// The top-level modules named right after each `prefix` in `line` (`prefix::{a, b::c}` too).
fn names_after(line: &str, prefix: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let climbs = prefix.starts_with("super");
    let mut found = BTreeSet::new();
    let mut rest = line;
    while let Some(at) = rest.find(prefix) {
        // Part of a longer `super::` chain: another depth's path, not one to the root.
        let longer = climbs && rest[..at].ends_with("super::");
        rest = &rest[at + prefix.len()..];
        if longer || (climbs && rest.starts_with("super::")) {
            continue;
        }
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group
                .split('}')
                .next()
                .unwrap_or("")
                .split(',')
                .map(|n| n.trim().split("::").next().unwrap_or(""))
                .collect(),
            None => vec![
                rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next()
                    .unwrap_or(""),
            ],
        };
        found.extend(
            names
                .into_iter()
                .filter(|name| modules.contains(*name))
                .map(String::from),
        );
    }
    found
}

/// The gateway's top-level modules and what each imports.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(&root, f))
        .filter(|m| m != "lib" && m != "main")
        .chain(FLOOR_CRATES.iter().map(|(name, _)| name.to_string()))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for file in &files {
        let module = module_of(&root, file);
        let Some(edges) = graph.get_mut(&module) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        edges.extend(
            imports(&text, depth(&root, file), &modules)
                .into_iter()
                .filter(|m| *m != module),
        );
    }
    graph
}

/// Whether `to` is reachable from `from`.
fn reaches(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_string()];
    while let Some(m) = stack.pop() {
        for next in &graph[&m] {
            if next == to {
                return true;
            }
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    false
}

#[test]
fn no_module_imports_the_layers_above_it() {
    let graph = graph();
    assert!(graph.len() > 10, "the sources were not found: {graph:?}");
    for (module, edges) in &graph {
        for top in ["routes", "config", "server", "cli"] {
            let allowed = match top {
                "routes" => ["config", "server"].as_slice(),
                "config" => &["server", "cli"],
                "server" => &["cli"],
                _ => &[],
            };
            assert!(
                !edges.contains(top) || allowed.contains(&module.as_str()),
                "`{module}` imports `{top}`, a layer above it"
            );
        }
    }
}

#[test]
fn no_import_cycles_between_top_level_modules() {
    let graph = graph();
    let cycles: Vec<String> = graph
        .iter()
        .flat_map(|(module, edges)| {
            let graph = &graph;
            edges
                .iter()
                .filter(move |next| reaches(graph, next, module))
                .map(move |next| format!("{module} -> {next}"))
        })
        .collect();
    assert!(cycles.is_empty(), "import cycles through: {cycles:?}");
}

#[test]
fn protocols_and_routes_reach_the_engine_only_through_the_facade() {
    let graph = graph();
    for module in ["protocols", "routes", "openai", "anthropic"] {
        let edges = &graph[module];
        assert!(
            !edges.contains("pipeline"),
            "`{module}` imports `pipeline`: protocols render what `generation` re-exports"
        );
    }
}

#[test]
fn only_the_edge_speaks_wire_types() {
    // The routes and protocols translate; `error` renders the default (OpenAI) error body.
    let edge = ["routes", "protocols", "error", "openai", "anthropic"];
    let graph = graph();
    for (module, edges) in &graph {
        for wire in ["openai", "anthropic"] {
            assert!(
                !edges.contains(wire) || edge.contains(&module.as_str()),
                "`{module}` imports the wire types of `{wire}`: the generation request is neutral"
            );
        }
    }
}

/// The code lines (comments dropped) of every file of top-level module `module`, by file.
fn code_of(module: &str) -> Vec<(PathBuf, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files
        .into_iter()
        .filter(|f| f.strip_prefix(&root).unwrap().starts_with(module))
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            let code: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect();
            (f, code.join("\n"))
        })
        .collect()
}

#[test]
fn the_facade_takes_typed_numbers() {
    // Integers are checked and typed once, at the edge (`protocols::numbers`).
    for module in ["generation", "pipeline"] {
        let files = code_of(module);
        assert!(!files.is_empty(), "no sources of `{module}`");
        for (file, code) in files {
            let raw = code.contains("serde_json::Number")
                || code
                    .lines()
                    .any(|l| l.contains("use serde_json::") && l.contains("Number"));
            assert!(
                !raw,
                "{} reads JSON numbers: the edge types them (protocols/numbers.rs)",
                file.display()
            );
        }
    }
}

#[test]
fn responses_builds_template_messages_directly() {
    let files = code_of("protocols/responses");
    assert!(!files.is_empty(), "no sources of the Responses API");
    for (file, code) in files {
        assert!(
            !code.contains("ChatMessage"),
            "{} builds chat wire messages: the Responses API builds template messages",
            file.display()
        );
    }
}

#[test]
fn the_scan_sees_paths_that_climb_to_the_root_through_super() {
    let modules: BTreeSet<String> = ["pipeline", "generation", "error"]
        .into_iter()
        .map(String::from)
        .collect();
    let names = |text: &str, depth: usize| imports(text, depth, &modules);
    assert_eq!(
        names("use super::super::pipeline::run::GenEvent;", 2),
        BTreeSet::from(["pipeline".to_string()])
    );
    // One level short of the root: a sibling module, not a top-level one.
    assert!(names("use super::super::pipeline::run::GenEvent;", 3).is_empty());
    assert_eq!(
        names("use crate::{error::ApiError, generation::Generation};", 1),
        BTreeSet::from(["error".to_string(), "generation".to_string()])
    );
    assert!(names("// use crate::pipeline;", 1).is_empty());
}
