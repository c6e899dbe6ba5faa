//! A gateway plugin that breaks the rules when asked to, so tests can see the kit report it and
//! the gateway survive it. Its configuration's `break` names what breaks:
//!
//! - `guard_panic`: the guard panics on every request;
//! - `guard_slow`: the guard takes 300 ms;
//! - `guard_bad_status`: the guard rejects with status 200;
//! - `transform_chunky`: the transform marks every piece it is fed, so its output depends on
//!   how the text was cut;
//! - `transform_panic`: the transform panics on its third piece;
//! - `tool_silent`: the tool keeps its calls and never answers them (a cancel is logged).
//!
//! With nothing broken it is a well-behaved plugin: it allows every request, passes text
//! through, and its tool `echo` answers its arguments.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use turnpike_plugin_api::export_gateway_plugin;
use turnpike_plugin_api::json::{
    GuardRequest, Rejection, ToolCall, ToolSpec, TransformContext, Verdict,
};
use turnpike_plugin_api::plugin::{GatewayPlugin, Hooks, Host, ToolDone, ToolOutcome, Transform};

/// The plugin.
#[derive(Debug)]
pub struct Faulty {
    broken: String,
    kept: Mutex<Vec<ToolDone>>,
    host: Host,
}

struct Chunky {
    broken: bool,
    panics: bool,
    fed: usize,
}

impl Transform for Chunky {
    fn feed(&mut self, text: &str, _last: bool) -> String {
        self.fed += 1;
        if self.panics && self.fed == 3 {
            panic!("the faulty transform panics, as asked");
        }
        if self.broken {
            format!("{text}|")
        } else {
            text.to_string()
        }
    }
}

impl GatewayPlugin for Faulty {
    const HOOKS: Hooks = Hooks {
        guard: true,
        transform: true,
        tools: true,
    };

    fn create(config: &Value, host: Host) -> Result<Self, String> {
        Ok(Self {
            broken: config
                .get("break")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            kept: Mutex::new(Vec::new()),
            host,
        })
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "echo".into(),
            description: "Answers its arguments.".into(),
            parameters: serde_json::json!({"type": "object"}),
            server: None,
        }]
    }

    fn guard(&self, _request: &GuardRequest) -> Result<Verdict, String> {
        match self.broken.as_str() {
            "guard_panic" => panic!("the faulty guard panics, as asked"),
            "guard_slow" => {
                std::thread::sleep(Duration::from_millis(300));
                Ok(Verdict::Allow)
            }
            "guard_bad_status" => Ok(Verdict::Reject(Rejection {
                status: 200,
                code: "not_an_error".into(),
                message: "a rejection with a success status".into(),
            })),
            _ => Ok(Verdict::Allow),
        }
    }

    fn transform(&self, _context: &TransformContext) -> Result<Box<dyn Transform>, String> {
        Ok(Box::new(Chunky {
            broken: self.broken == "transform_chunky",
            panics: self.broken == "transform_panic",
            fed: 0,
        }))
    }

    fn call_tool(&self, _id: u64, call: ToolCall, done: ToolDone) -> Result<(), String> {
        if self.broken == "tool_silent" {
            self.kept
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(done);
            return Ok(());
        }
        done.finish(ToolOutcome::Done(call.arguments.to_string()));
        Ok(())
    }

    fn cancel_tool(&self, id: u64) {
        self.host.log(
            turnpike_plugin_api::plugin::LogLevel::Info,
            &format!("tool call {id} cancelled"),
        );
    }
}

export_gateway_plugin!(Faulty, "faulty-gateway");
