//! One MCP server over streamable HTTP: its session, its tools, and JSON-RPC calls whose answers
//! come as a JSON body or as an event stream. An event stream is read event by event and left as
//! soon as the answer arrives (a server may keep it open for more messages); an answer may hold
//! at most [`MAX_ANSWER_BYTES`].

use std::collections::BTreeMap;
use std::io::BufRead;
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use turnpike_plugin_api::json::{ToolCall, ToolSpec};

/// The protocol version asked for.
const PROTOCOL: &str = "2025-06-18";

/// The most bytes of an answer read (a body, or an event stream up to the answer).
pub(crate) const MAX_ANSWER_BYTES: u64 = 16 << 20;

/// A server as configured.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServerSettings {
    /// Its name, shown as the `mcp_call` item's `server_label`.
    pub label: String,
    /// The MCP endpoint (`http://host:port/mcp`).
    url: String,
    /// Extra headers (an `Authorization`, say).
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// Only these tools (all when absent).
    #[serde(default)]
    allowed_tools: Option<Vec<String>>,
    /// Most a start-up request may take.
    #[serde(default)]
    timeout_ms: Option<u64>,
}

#[derive(Debug, Default)]
struct Session {
    id: Option<String>,
    protocol: Option<String>,
}

/// A connected server.
#[derive(Debug)]
pub(crate) struct Server {
    settings: ServerSettings,
    session: Mutex<Session>,
    tools: Vec<ToolSpec>,
}

/// Why a request failed.
#[derive(Debug)]
enum Failure {
    /// The server no longer knows the session (HTTP 404 with a session).
    SessionGone,
    /// Anything else.
    Other(String),
}

impl Server {
    /// Opens a session and lists the tools.
    pub(crate) fn connect(settings: ServerSettings) -> Result<Self, String> {
        let mut server = Self {
            settings,
            session: Mutex::default(),
            tools: Vec::new(),
        };
        server.open().map_err(text)?;
        server.tools = server.list_tools().map_err(text)?;
        Ok(server)
    }

    /// Its tools.
    pub(crate) fn tools(&self) -> &[ToolSpec] {
        &self.tools
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.settings.timeout_ms.unwrap_or(10_000))
    }

    fn session(&self) -> std::sync::MutexGuard<'_, Session> {
        self.session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `initialize` and `notifications/initialized`.
    fn open(&self) -> Result<(), Failure> {
        *self.session() = Session::default();
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "turnpike", "version": env!("CARGO_PKG_VERSION")},
        }});
        let answer = self.post(&init, self.timeout())?;
        let result = answer.ok_or_else(|| Failure::Other("initialize got no answer".into()))?;
        let protocol = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or(PROTOCOL)
            .to_string();
        self.session().protocol = Some(protocol);
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.post(&initialized, self.timeout())?;
        Ok(())
    }

    fn list_tools(&self) -> Result<Vec<ToolSpec>, Failure> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for page in 0..100 {
            let mut params = json!({});
            if let Some(c) = &cursor {
                params["cursor"] = json!(c);
            }
            let request = json!({"jsonrpc": "2.0", "id": format!("list-{page}"), "method": "tools/list", "params": params});
            let result = self
                .post(&request, self.timeout())?
                .ok_or_else(|| Failure::Other("tools/list got no answer".into()))?;
            for tool in result
                .get("tools")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let Some(name) = tool.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let allowed = self
                    .settings
                    .allowed_tools
                    .as_ref()
                    .is_none_or(|list| list.iter().any(|n| n == name));
                if !allowed {
                    continue;
                }
                tools.push(ToolSpec {
                    name: name.to_string(),
                    description: tool
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    parameters: tool
                        .get("inputSchema")
                        .cloned()
                        .unwrap_or_else(|| json!({"type": "object"})),
                    server: Some(self.settings.label.clone()),
                });
            }
            cursor = result
                .get("nextCursor")
                .and_then(Value::as_str)
                .map(str::to_string);
            if cursor.is_none() {
                break;
            }
        }
        Ok(tools)
    }

    /// Runs a tool: `Ok(Ok(text))`, `Ok(Err(text))` when the tool reports an error, `Err` when
    /// the call itself failed.
    pub(crate) fn call(&self, id: u64, call: &ToolCall) -> Result<Result<String, String>, String> {
        let arguments = match &call.arguments {
            Value::Object(_) => call.arguments.clone(),
            Value::Null => json!({}),
            other => {
                return Ok(Err(format!(
                    "the arguments must be a JSON object, not {other}"
                )));
            }
        };
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                             "params": {"name": call.name, "arguments": arguments}});
        let deadline = Duration::from_millis(call.deadline_ms.max(1));
        let result = match self.post(&request, deadline) {
            Err(Failure::SessionGone) => {
                self.open().map_err(text)?;
                self.post(&request, deadline).map_err(text)?
            }
            other => other.map_err(text)?,
        }
        .ok_or_else(|| "tools/call got no answer".to_string())?;
        let parts: Vec<String> = result
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|part| match part.get("text").and_then(Value::as_str) {
                Some(t) => t.to_string(),
                None => part.to_string(),
            })
            .collect();
        let output = if parts.is_empty() {
            result
                .get("structuredContent")
                .map(Value::to_string)
                .unwrap_or_default()
        } else {
            parts.join("\n")
        };
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            Ok(Err(output))
        } else {
            Ok(Ok(output))
        }
    }

    /// Tells the server a call was cancelled (best effort).
    pub(crate) fn cancel(&self, id: u64) {
        let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                          "params": {"requestId": id, "reason": "the client went away"}});
        let _ = self.post(&note, self.timeout());
    }

    /// POSTs one JSON-RPC message; the result of a request's answer (`None` for a notification).
    fn post(&self, message: &Value, timeout: Duration) -> Result<Option<Value>, Failure> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into();
        let mut request = agent
            .post(&self.settings.url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream");
        let had_session = {
            let session = self.session();
            if let Some(id) = &session.id {
                request = request.header("Mcp-Session-Id", id);
            }
            if let Some(protocol) = &session.protocol {
                request = request.header("MCP-Protocol-Version", protocol);
            }
            session.id.is_some()
        };
        for (name, value) in &self.settings.headers {
            request = request.header(name, value);
        }
        let mut response = request
            .send(message.to_string())
            .map_err(|e| Failure::Other(format!("{}: {e}", self.settings.url)))?;
        let status = response.status().as_u16();
        if let Some(id) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            self.session().id = Some(id.to_string());
        }
        if status == 404 && had_session {
            return Err(Failure::SessionGone);
        }
        let kind = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let reading =
            |e: &dyn std::fmt::Display| Failure::Other(format!("reading the answer: {e}"));
        if !(200..300).contains(&status) {
            let body = response
                .body_mut()
                .with_config()
                .limit(64 << 10)
                .lossy_utf8(true)
                .read_to_string()
                .unwrap_or_default();
            return Err(Failure::Other(format!(
                "HTTP {status}: {}",
                body.chars().take(300).collect::<String>()
            )));
        }
        let Some(id) = message.get("id") else {
            // A notification: nothing to wait for (the body, if any, is not read).
            return Ok(None);
        };
        let body = response.body_mut().with_config().limit(MAX_ANSWER_BYTES);
        let answer = if kind.starts_with("text/event-stream") {
            answer_in_events(std::io::BufReader::new(body.reader()), id)?
        } else {
            let text = body
                .lossy_utf8(true)
                .read_to_string()
                .map_err(|e| reading(&e))?;
            serde_json::from_str::<Value>(&text)
                .map_err(|e| Failure::Other(format!("the answer is not JSON: {e}")))?
        };
        if let Some(error) = answer.get("error") {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("error");
            return Err(Failure::Other(format!("the server answered: {message}")));
        }
        Ok(answer.get("result").cloned())
    }
}

fn text(failure: Failure) -> String {
    match failure {
        Failure::SessionGone => "the server forgot the session".into(),
        Failure::Other(text) => text,
    }
}

/// The message answering `id` in an event stream (each event's `data:` lines joined), read
/// event by event and returned as soon as it arrives: the stream may stay open after it.
fn answer_in_events(mut reader: impl BufRead, id: &Value) -> Result<Value, Failure> {
    let mut data = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        let read = reader
            .read_line(&mut line)
            .map_err(|e| Failure::Other(format!("reading the event stream: {e}")))?;
        let text = line.trim_end_matches(['\n', '\r']);
        if read == 0 || text.is_empty() {
            if !data.is_empty() {
                if let Ok(message) = serde_json::from_str::<Value>(&data)
                    && message.get("id") == Some(id)
                {
                    return Ok(message);
                }
                data.clear();
            }
            if read == 0 {
                return Err(Failure::Other("the event stream held no answer".into()));
            }
        } else if let Some(rest) = text.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Cursor, Read};

    use serde_json::json;

    use super::{Failure, answer_in_events};

    /// Bytes, then a read that fails: a stream the server holds open.
    struct OpenStream(Cursor<Vec<u8>>);

    impl Read for OpenStream {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match self.0.read(buf)? {
                0 => Err(std::io::Error::other("read past the answer")),
                n => Ok(n),
            }
        }
    }

    #[test]
    fn the_answer_is_taken_as_soon_as_it_arrives() {
        let body = "event: message\ndata: {\"id\":1,\"result\":{}}\n\n: ping\n\ndata: {\"id\":\ndata: 2, \"result\": 7}\n\n";
        let open = || BufReader::new(OpenStream(Cursor::new(body.as_bytes().to_vec())));
        assert_eq!(answer_in_events(open(), &json!(2)).unwrap()["result"], 7);
        assert_eq!(
            answer_in_events(open(), &json!(1)).unwrap()["result"],
            json!({})
        );
        let ended = BufReader::new(Cursor::new(b"data: {\"id\": 3}".to_vec()));
        assert_eq!(answer_in_events(ended, &json!(3)).unwrap()["id"], 3);
        let none = BufReader::new(Cursor::new(b"data: {\"id\": 4}\n\n".to_vec()));
        assert!(matches!(
            answer_in_events(none, &json!(5)),
            Err(Failure::Other(_))
        ));
    }
}
