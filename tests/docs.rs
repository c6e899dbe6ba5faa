//! The documentation a newcomer reads: every relative link in the repository's Markdown files
//! resolves to a file or folder inside the repository (nothing outside it is linked), and the
//! front door (README.md, docs/, tests/README.md, bench/README.md) keeps its paragraphs short.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Component, Path, PathBuf};

use turnpike_tests::workspace_root;

/// Folders whose Markdown is not documentation: build output, caches, installed packages.
const SKIPPED: &[&str] = &["target", ".git", "node_modules", "__pycache__"];

/// The pages a newcomer reads first, held to short paragraphs.
const FRONT_DOOR: &[&str] = &["README.md", "docs", "tests/README.md", "bench/README.md"];
/// The longest paragraph (or list item) the front door allows, in words.
const MOST_WORDS: usize = 80;
/// Reference pages that are read in part, not front to back: their paragraphs may run longer.
const REFERENCE: &[&str] = &["docs/configuration.md", "docs/architecture.md"];

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !SKIPPED.contains(&name.as_str()) {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The text outside fenced code blocks and inline code spans, line by line.
fn prose_lines(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            lines.push(String::new());
            continue;
        }
        if fenced {
            lines.push(String::new());
            continue;
        }
        // Drop inline code: `[x](y)` inside backticks is an example, not a link.
        let mut kept = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(part);
            } else {
                kept.push_str("code");
            }
        }
        lines.push(kept);
    }
    lines
}

/// The targets of inline links `[text](target)` in a line.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

/// Where a relative link points, or the reason it is wrong.
fn resolve(root: &Path, page: &Path, target: &str) -> Result<(), String> {
    if target.starts_with('#') || target.starts_with("mailto:") {
        return Ok(());
    }
    if target.contains("://") {
        return Err("links outside the repository".into());
    }
    let path = target.split('#').next().unwrap_or("");
    let base = page.parent().unwrap();
    let mut joined = if path.starts_with('/') {
        root.to_path_buf()
    } else {
        base.to_path_buf()
    };
    for component in Path::new(path.trim_start_matches('/')).components() {
        let escaped = match component {
            Component::ParentDir => !joined.pop() || !joined.starts_with(root),
            Component::Normal(part) => {
                joined.push(part);
                false
            }
            _ => false,
        };
        if escaped {
            return Err("leaves the repository".into());
        }
    }
    if !joined.starts_with(root) {
        return Err("leaves the repository".into());
    }
    if !joined.exists() {
        return Err("does not exist".into());
    }
    Ok(())
}

#[test]
fn every_relative_link_resolves_inside_the_repository() {
    let root = workspace_root();
    let mut pages = Vec::new();
    markdown_files(&root, &mut pages);
    assert!(
        pages.len() > 10,
        "found only {} Markdown files",
        pages.len()
    );
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (number, line) in prose_lines(&text).iter().enumerate() {
            for target in link_targets(line) {
                if let Err(why) = resolve(&root, page, &target) {
                    let shown = page.strip_prefix(&root).unwrap().display();
                    broken.push(format!("{shown}:{}: ({target}) {why}", number + 1));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_front_door_keeps_paragraphs_short() {
    let root = workspace_root();
    let mut pages = Vec::new();
    for entry in FRONT_DOOR {
        let path = root.join(entry);
        if path.is_dir() {
            markdown_files(&path, &mut pages);
        } else {
            pages.push(path);
        }
    }
    let mut long = Vec::new();
    for page in &pages {
        let shown = page
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if REFERENCE.contains(&shown.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(page).unwrap();
        // A paragraph: consecutive prose lines; a list item or heading starts a new one, a table
        // row or a blank line ends one.
        let mut words = 0;
        let mut start = 0;
        for (number, line) in prose_lines(&text).iter().enumerate() {
            let trimmed = line.trim_start();
            let item = trimmed.starts_with("- ")
                || trimmed.starts_with("* ")
                || trimmed.starts_with('#')
                || trimmed
                    .split_once(". ")
                    .is_some_and(|(n, _)| n.parse::<u32>().is_ok());
            if trimmed.is_empty() || trimmed.starts_with('|') || item {
                if words > MOST_WORDS {
                    long.push(format!("{shown}:{}: {words} words", start + 1));
                }
                words = 0;
                start = number;
            }
            if !trimmed.starts_with('|') {
                words += trimmed.split_whitespace().count();
            }
        }
        if words > MOST_WORDS {
            long.push(format!("{shown}:{}: {words} words", start + 1));
        }
    }
    assert!(
        long.is_empty(),
        "paragraphs over {MOST_WORDS} words:\n{}",
        long.join("\n")
    );
}
