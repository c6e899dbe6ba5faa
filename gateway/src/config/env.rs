//! Environment overrides: `TURNPIKE__SERVER__LISTEN=0.0.0.0:9000` sets `server.listen`, and
//! `TURNPIKE__ENGINES__0__PLUGIN=...` the first engine's plugin. Keys are lower-cased; values are
//! read as TOML values (numbers, booleans, arrays), else as strings. Overrides are applied to the
//! file's table before validation, so they are checked exactly like the file.

use toml::{Table, Value};

const PREFIX: &str = "TURNPIKE__";

/// This process's `TURNPIKE__` variables. Others are not read, so a variable that is not valid
/// UTF-8 matters only when it is one of ours, and then it is an error that names it.
pub(super) fn from_process() -> Result<Vec<(String, String)>, String> {
    let mut vars = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str().filter(|n| n.starts_with(PREFIX)) else {
            continue;
        };
        let value = value
            .into_string()
            .map_err(|_| format!("{name}: the value is not valid UTF-8"))?;
        vars.push((name.to_string(), value));
    }
    Ok(vars)
}

/// Applies every `TURNPIKE__` variable in `vars`; returns the names applied.
pub(super) fn apply(table: &mut Table, vars: &[(String, String)]) -> Result<Vec<String>, String> {
    let mut applied = Vec::new();
    for (name, text) in vars {
        let Some(path) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let keys: Vec<String> = path.split("__").map(str::to_ascii_lowercase).collect();
        if keys.iter().any(String::is_empty) {
            return Err(format!("{name}: an empty key in the variable name"));
        }
        let mut root = Value::Table(std::mem::take(table));
        let result = set(&mut root, &keys, parse(text));
        if let Value::Table(t) = root {
            *table = t;
        }
        result.map_err(|e| format!("{name}: {e}"))?;
        applied.push(name.clone());
    }
    Ok(applied)
}

/// A TOML value (number, boolean, array, inline table), else the text itself. A date stays text:
/// no setting is a TOML datetime, and dates in settings (pinned versions) are written as strings.
fn parse(text: &str) -> Value {
    toml::from_str::<Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|v| !matches!(v, Value::Datetime(_)))
        .unwrap_or_else(|| Value::String(text.to_string()))
}

fn set(node: &mut Value, keys: &[String], value: Value) -> Result<(), String> {
    let Some((first, rest)) = keys.split_first() else {
        return Ok(());
    };
    match node {
        Value::Table(t) => {
            if rest.is_empty() {
                t.insert(first.clone(), value);
                return Ok(());
            }
            let child = t
                .entry(first.clone())
                .or_insert_with(|| Value::Table(Table::new()));
            set(child, rest, value)
        }
        Value::Array(items) => {
            let i: usize = first
                .parse()
                .map_err(|_| format!("`{first}` is not an index into a list"))?;
            let len = items.len();
            let child = items
                .get_mut(i)
                .ok_or_else(|| format!("index {i} is past the end of a list of {len}"))?;
            if rest.is_empty() {
                *child = value
            } else {
                set(child, rest, value)?
            }
            Ok(())
        }
        _ => Err(format!("`{first}` is inside a value that is not a table")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn sets_nested_keys_and_list_items() {
        let mut table: Table = toml::from_str("[[engines]]\nplugin = \"a.so\"\n").expect("toml");
        let applied = apply(
            &mut table,
            &vars(&[
                ("TURNPIKE__ENGINES__0__PLUGIN", "b.so"),
                ("TURNPIKE__SERVER__MAX_BODY_BYTES", "1024"),
                ("TURNPIKE__SERVER__RELEASED", "2026-01-15"),
                ("PATH", "/bin"),
            ]),
        )
        .expect("applies");
        assert_eq!(applied.len(), 3);
        assert_eq!(table["server"]["released"].as_str(), Some("2026-01-15"));
        assert_eq!(table["engines"][0]["plugin"].as_str(), Some("b.so"));
        assert_eq!(table["server"]["max_body_bytes"].as_integer(), Some(1024));
    }

    #[test]
    fn bad_paths_are_named() {
        let mut table = Table::new();
        let err = apply(
            &mut table,
            &vars(&[("TURNPIKE__SERVER", "1"), ("TURNPIKE__SERVER__LISTEN", "x")]),
        )
        .expect_err("not a table");
        assert!(err.starts_with("TURNPIKE__SERVER__LISTEN: "), "{err}");
        let mut table: Table = toml::from_str("engines = []").expect("toml");
        let err =
            apply(&mut table, &vars(&[("TURNPIKE__ENGINES__3__PLUGIN", "x")])).expect_err("short");
        assert!(err.contains("past the end"), "{err}");
    }
}

/// Replaces `${NAME}` in every string of the file with the environment variable `NAME`
/// (upper-case letters, digits and `_`), so one file serves paths an operator sets per machine
/// (`path = "${MODEL_DIR}"`). A variable that is not set is an error naming it and its key.
/// Lower-case references such as `${config_dir}` are left for their own expansion.
pub(super) fn expand_references(
    table: &mut Table,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    for (key, value) in table.iter_mut() {
        expand_value(value, key, lookup)?;
    }
    Ok(())
}

fn expand_value(
    value: &mut Value,
    at: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    match value {
        Value::String(s) => *s = expand_text(s, at, lookup)?,
        Value::Array(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                expand_value(v, &format!("{at}[{i}]"), lookup)?;
            }
        }
        Value::Table(t) => {
            for (k, v) in t.iter_mut() {
                expand_value(v, &format!("{at}.{k}"), lookup)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn expand_text(
    text: &str,
    at: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let name = after.find('}').map(|end| &after[..end]).filter(|n| {
            !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        });
        match name {
            Some(name) => {
                let value = lookup(name)
                    .ok_or_else(|| format!("{at}: the environment variable {name} is not set"))?;
                out.push_str(&value);
                rest = &after[name.len() + 1..];
            }
            None => {
                out.push_str("${");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod reference_tests {
    use super::*;

    #[test]
    fn references_expand_and_unset_ones_are_named() {
        let lookup = |n: &str| (n == "MODEL_DIR").then(|| "/models/x".to_string());
        let mut table: Table =
            toml::from_str("a = \"${MODEL_DIR}/w\"\nb = [\"${config_dir}\"]\n").expect("toml");
        expand_references(&mut table, &lookup).expect("expands");
        assert_eq!(table["a"].as_str(), Some("/models/x/w"));
        assert_eq!(table["b"][0].as_str(), Some("${config_dir}"));
        let mut bad: Table = toml::from_str("[m]\np = \"${NOPE}\"\n").expect("toml");
        let err = expand_references(&mut bad, &lookup).expect_err("unset");
        assert!(err.contains("m.p") && err.contains("NOPE"), "{err}");
    }
}
