//! `mcp`: a Turnpike gateway plugin that offers the tools of Model Context Protocol servers to
//! the model as server tools. The gateway runs a call when the model makes one and continues the
//! conversation with its result; in the Responses API the call shows as an `mcp_call` item with
//! the server's label.
//!
//! It speaks MCP's streamable HTTP transport (protocol 2025-06-18, JSON or event-stream answers)
//! to servers the operator configures: at start it opens a session with each and lists its tools
//! (a server that cannot be reached stops the start, with the reason); a call is one
//! `tools/call` on its own thread, within the call's deadline; a cancelled call is answered at
//! once and the server is told (`notifications/cancelled`). A session the server forgot (404) is
//! opened again once.
//!
//! ```toml
//! [[plugins]]
//! library = "libturnpike_plugin_mcp.so"
//! [[plugins.config.servers]]
//! label = "time"
//! url = "http://127.0.0.1:8000/mcp"
//! headers = { Authorization = "Bearer ..." }   # optional
//! allowed_tools = ["get_time"]                 # optional: only these
//! timeout_ms = 10000                           # connect and list at start
//! ```

mod session;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::Value;
use turnpike_plugin_api::export_gateway_plugin;
use turnpike_plugin_api::json::{ToolCall, ToolSpec};
use turnpike_plugin_api::plugin::{GatewayPlugin, Hooks, Host, LogLevel, ToolDone, ToolOutcome};

use session::{Server, ServerSettings};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    servers: Vec<ServerSettings>,
}

/// The plugin: its servers and the tools each offers.
#[derive(Debug)]
pub struct Mcp {
    servers: Vec<Arc<Server>>,
    /// Tool name → which server, and the spec the model sees.
    tools: Vec<(usize, ToolSpec)>,
    /// Calls under way (with their server), answered by whichever comes first: the server or a
    /// cancel.
    calls: Arc<Mutex<HashMap<u64, (usize, ToolDone)>>>,
    host: Host,
}

impl GatewayPlugin for Mcp {
    const HOOKS: Hooks = Hooks {
        guard: false,
        transform: false,
        tools: true,
    };

    fn create(config: &Value, host: Host) -> Result<Self, String> {
        let settings: Settings =
            serde_json::from_value(config.clone()).map_err(|e| format!("mcp: {e}"))?;
        if settings.servers.is_empty() {
            return Err("mcp: configure at least one server".into());
        }
        let mut servers = Vec::new();
        let mut tools: Vec<(usize, ToolSpec)> = Vec::new();
        for (i, settings) in settings.servers.into_iter().enumerate() {
            let label = settings.label.clone();
            let server =
                Server::connect(settings).map_err(|e| format!("mcp: server `{label}`: {e}"))?;
            for spec in server.tools() {
                if tools.iter().any(|(_, t)| t.name == spec.name) {
                    host.log(LogLevel::Warn, &format!("tool `{}` of server `{label}` is offered by an earlier server too; the earlier one is used", spec.name));
                    continue;
                }
                tools.push((i, spec.clone()));
            }
            host.log(
                LogLevel::Info,
                &format!("MCP server `{label}`: {} tools", server.tools().len()),
            );
            servers.push(Arc::new(server));
        }
        Ok(Self {
            servers,
            tools,
            calls: Arc::default(),
            host,
        })
    }

    fn tools(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|(_, spec)| spec.clone()).collect()
    }

    fn call_tool(&self, id: u64, call: ToolCall, done: ToolDone) -> Result<(), String> {
        let Some((index, _)) = self.tools.iter().find(|(_, t)| t.name == call.name) else {
            return Err(format!("no MCP tool `{}`", call.name));
        };
        let server = Arc::clone(&self.servers[*index]);
        let calls = Arc::clone(&self.calls);
        lock(&calls).insert(id, (*index, done));
        let host = self.host.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("mcp-call-{id}"))
            .spawn(move || {
                let outcome = match server.call(id, &call) {
                    Ok(Ok(text)) => ToolOutcome::Done(text),
                    Ok(Err(text)) => ToolOutcome::Failed(text),
                    Err(e) => {
                        host.log(
                            LogLevel::Warn,
                            &format!("MCP call {id} of `{}`: {e}", call.name),
                        );
                        ToolOutcome::Failed(e)
                    }
                };
                if let Some((_, done)) = lock(&calls).remove(&id) {
                    done.finish(outcome);
                }
            });
        if let Err(e) = spawned {
            // Taken back unanswered: the call is refused.
            drop(lock(&self.calls).remove(&id));
            return Err(format!("cannot start the call: {e}"));
        }
        Ok(())
    }

    fn cancel_tool(&self, id: u64) {
        let Some((index, done)) = lock(&self.calls).remove(&id) else {
            return;
        };
        done.finish(ToolOutcome::Cancelled);
        let server = Arc::clone(&self.servers[index]);
        // Telling the server may take a round trip; the host is not kept waiting.
        let _ = std::thread::Builder::new()
            .name(format!("mcp-cancel-{id}"))
            .spawn(move || server.cancel(id));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

export_gateway_plugin!(Mcp, "mcp");
