//! Chat templates: the Jinja template a model folder ships (`tokenizer_config.json`'s
//! `chat_template`, or `chat_template.jinja`), rendered with `minijinja` the way Hugging Face
//! `transformers` renders it, so a prompt is the same token for token:
//! `trim_blocks` and `lstrip_blocks`, Python string and dict methods, `raise_exception`,
//! `strftime_now`, and a `tojson` that writes what Python's `json.dumps` writes (`", "` and
//! `": "` separators, no HTML escaping, keys in order).

use std::path::Path;

use minijinja::{Environment, Error, ErrorKind, Value};
use serde::Serialize;
use serde_json::{Map, Value as Json};

/// Instructions a template may run per render (a guard against runaway templates).
const FUEL: u64 = 50_000_000;

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    source: String,
}

/// Why a template could not be rendered (a template's own `raise_exception` included).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(pub String);

impl ChatTemplate {
    /// The template of a model folder, if it has one.
    pub fn from_folder(folder: &Path, tokenizer_config: &Json) -> Result<Option<Self>, String> {
        let source = match &tokenizer_config["chat_template"] {
            Json::String(s) => Some(s.clone()),
            // A list of named templates: the one named `default`, else the first.
            Json::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .or_else(|| list.first())
                .and_then(|t| t["template"].as_str())
                .map(str::to_string),
            _ => std::fs::read_to_string(folder.join("chat_template.jinja")).ok(),
        };
        let Some(source) = source else {
            return Ok(None);
        };
        let token = |key: &str| match &tokenizer_config[key] {
            Json::String(s) => s.clone(),
            Json::Object(o) => o
                .get("content")
                .and_then(Json::as_str)
                .unwrap_or("")
                .to_string(),
            _ => String::new(),
        };
        Self::new(source, token("bos_token"), token("eos_token")).map(Some)
    }

    /// Compiles `source`.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<Self, String> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| format!("chat template syntax: {e}"))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| {
            super::strftime::now(&format)
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.clone())
            .map_err(|e| format!("chat template: {e}"))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
            source,
        })
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template shows the model the tools a request offers: a probe function's
    /// name reaches the rendered prompt (a template that ignores `tools`, or refuses them, does
    /// not).
    pub fn shows_tools(&self) -> bool {
        const PROBE: &str = "turnpike_probe_function";
        let tools = serde_json::json!([{"type": "function", "function": {
            "name": PROBE, "description": "A probe.", "parameters": {"type": "object", "properties": {}}}}]);
        let messages = [serde_json::json!({"role": "user", "content": "probe"})];
        self.render(&messages, Some(&tools), true, None)
            .is_ok_and(|text| text.contains(PROBE))
    }

    /// Renders `messages` (OpenAI-shaped JSON objects) with `tools`; `kwargs` are extra
    /// variables (`chat_template_kwargs`), which cannot replace the standard ones.
    pub fn render(
        &self,
        messages: &[Json],
        tools: Option<&Json>,
        add_generation_prompt: bool,
        kwargs: Option<&Map<String, Json>>,
    ) -> Result<String, TemplateError> {
        let mut vars: Map<String, Json> = kwargs.cloned().unwrap_or_default();
        vars.insert("messages".into(), Json::Array(messages.to_vec()));
        vars.insert("tools".into(), tools.cloned().unwrap_or(Json::Null));
        vars.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );
        vars.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        vars.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError(e.to_string()))?;
        template
            .render(Value::from(minijinja::value::Serde(&vars)))
            .map_err(|e| {
                // A template's own `raise_exception` is the user's error, in the template's words.
                let detail = e
                    .detail()
                    .map(str::to_string)
                    .unwrap_or_else(|| e.to_string());
                TemplateError(detail)
            })
    }
}

/// `tojson(indent=None)` as Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn tojson(value: &Value, kwargs: minijinja::value::Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let formatter = PyFormatter { indent, level: 0 };
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    value
        .serialize(&mut serializer)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from_safe_string(text))
}

/// JSON as Python's `json.dumps` writes it: `", "` and `": "` without an indent, newlines and
/// `","` with one.
struct PyFormatter {
    indent: Option<usize>,
    level: usize,
}

impl PyFormatter {
    fn newline<W: ?Sized + std::io::Write>(&self, w: &mut W) -> std::io::Result<()> {
        if let Some(n) = self.indent {
            w.write_all(b"\n")?;
            w.write_all(" ".repeat(n * self.level).as_bytes())?;
        }
        Ok(())
    }
}

impl serde_json::ser::Formatter for PyFormatter {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.level += 1;
        w.write_all(b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.level -= 1;
        self.newline(w)?;
        w.write_all(b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if !first {
            w.write_all(if self.indent.is_some() { b"," } else { b", " })?;
        }
        self.newline(w)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.level += 1;
        w.write_all(b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.level -= 1;
        self.newline(w)?;
        w.write_all(b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if !first {
            w.write_all(if self.indent.is_some() { b"," } else { b", " })?;
        }
        self.newline(w)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(source: &str, messages: Json) -> Result<String, TemplateError> {
        let t = ChatTemplate::new(source.into(), "<s>".into(), "</s>".into()).expect("compiles");
        t.render(messages.as_array().expect("list"), None, true, None)
    }

    #[test]
    fn tojson_writes_what_python_writes() {
        let out = render(
            "{{ messages[0] | tojson }}",
            json!([{"role": "user", "content": "<a & 'b'>", "n": [1, 2]}]),
        );
        assert_eq!(
            out.as_deref(),
            Ok(r#"{"role": "user", "content": "<a & 'b'>", "n": [1, 2]}"#)
        );
        let indented = render("{{ messages[0] | tojson(indent=2) }}", json!([{"a": [1]}]));
        assert_eq!(indented.as_deref(), Ok("{\n  \"a\": [\n    1\n  ]\n}"));
    }

    #[test]
    fn python_methods_blocks_and_exceptions() {
        let source = "{% for m in messages %}\n{{ m.content.strip().upper() }}{% if not loop.last %}|{% endif %}\n{% endfor %}";
        let out = render(source, json!([{"content": " a "}, {"content": "b"}]));
        assert_eq!(out.as_deref(), Ok("A|B"));
        let failing = render("{{ raise_exception('roles must alternate') }}", json!([]));
        assert_eq!(failing, Err(TemplateError("roles must alternate".into())));
    }

    #[test]
    fn the_sim_models_template_renders_a_conversation() {
        let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/models/sim-small");
        let config: Json = serde_json::from_str(
            &std::fs::read_to_string(folder.join("tokenizer_config.json")).expect("read"),
        )
        .expect("json");
        let t = ChatTemplate::from_folder(&folder, &config)
            .expect("compiles")
            .expect("present");
        let messages =
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]);
        let out = t
            .render(messages.as_array().expect("list"), None, true, None)
            .expect("renders");
        assert_eq!(
            out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }
}
