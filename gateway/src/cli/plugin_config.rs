//! The `--config` argument of the plugin commands: inline JSON, or `@FILE` holding JSON or TOML.
//! Whatever the form, the plugin receives JSON.

use std::path::Path;

/// The JSON text to give `create`; the error is a one-line reason.
pub(super) fn plugin_config(arg: Option<&str>) -> Result<String, String> {
    let Some(arg) = arg else {
        return Ok("{}".into());
    };
    let Some(file) = arg.strip_prefix('@') else {
        return check_json(arg).map_err(|e| format!("--config: not valid JSON: {e}"));
    };
    let path = Path::new(file);
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--config: cannot read {file}: {e}"))?;
    if path.extension().is_some_and(|ext| ext == "toml") {
        let table: toml::Table =
            toml::from_str(&text).map_err(|e| format!("--config: {file}: {e}"))?;
        serde_json::to_string(&table).map_err(|e| format!("--config: {file}: {e}"))
    } else {
        check_json(&text).map_err(|e| format!("--config: {file}: not valid JSON: {e}"))
    }
}

fn check_json(text: &str) -> Result<String, serde_json::Error> {
    serde_json::from_str::<serde_json::Value>(text).map(|_| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_json_and_files() {
        assert_eq!(plugin_config(None).as_deref(), Ok("{}"));
        assert_eq!(
            plugin_config(Some(r#"{"seed": 1}"#)).as_deref(),
            Ok(r#"{"seed": 1}"#)
        );
        let err = plugin_config(Some("{seed")).expect_err("malformed");
        assert!(err.starts_with("--config: not valid JSON"), "{err}");

        let dir = tempfile::tempdir().expect("tempdir");
        let toml_file = dir.path().join("sim.toml");
        std::fs::write(&toml_file, "seed = 4\n[[models]]\nid = \"m\"\n").expect("write");
        let json = plugin_config(Some(&format!("@{}", toml_file.display()))).expect("toml");
        let value: serde_json::Value = serde_json::from_str(&json).expect("json");
        assert_eq!(value["models"][0]["id"], "m");

        let missing = plugin_config(Some("@/no/such/file.json")).expect_err("missing");
        assert!(missing.contains("cannot read"), "{missing}");
    }
}
