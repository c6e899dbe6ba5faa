//! Gateway plugins on the request path: each configured plugin (a shared library speaking the
//! gateway plugin ABI, `turnpike-plugin-api`) is loaded once, attached to some models and
//! tenants, and run in the configured order.
//!
//! - A **guard** sees the request before it is templated and tokenized ([`PluginHost::guard`]):
//!   it lets it through, refuses it with its own 4xx status and code, or rewrites its texts
//!   (the next guard sees the rewrite).
//! - A **transform** sees each choice's output text as it streams ([`OutputTransforms`]), and may
//!   replace parts of it; non-streamed answers are a fold of the same events, so both agree.
//! - A **server tool** is offered to the model beside the client's tools
//!   ([`PluginHost::server_tools`]); when the model calls one, the gateway runs it
//!   ([`PluginHost::run_tool`], under the plugin's `tool_timeout_ms`, cancelled when the request
//!   goes away) and the conversation continues (`generation::tool_loop`).
//!
//! Guards and transforms run inline, on the thread serving the request: the contract says they
//! return promptly (the conformance kit measures them), and handing each guard to a blocking
//! thread cost a third of the gateway's throughput. A guard that takes longer than its plugin's
//! `timeout_ms` is treated as failed once it returns. A hook that fails, panics or overruns fails
//! the request when its plugin's `failure` is `closed` (503 `plugin_unavailable`; in a stream,
//! the error event), and is skipped when it is `open`. Each call is counted and timed
//! (`turnpike_plugin_calls_total`, `turnpike_plugin_call_duration_seconds`) and traced (a
//! `plugin` span per guard).

mod guard;
pub mod settings;
mod transform;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::Instrument as _;
use turnpike_plugin_api::abi::TG_STATUS_OK;
use turnpike_plugin_api::host::{PluginError, PluginInstance, PluginLibrary};
use turnpike_plugin_api::json::{ToolCall, ToolSpec, TransformContext, Verdict};

use crate::error::ApiError;
use crate::observability::metrics;
use crate::pipeline::request::GenerationRequest;
use settings::{OnFailure, PluginConfig};
pub(crate) use transform::OutputTransforms;

/// Why the plugins could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("plugin `{name}`: {source}")]
pub struct PluginLoadError {
    /// Which.
    pub name: String,
    /// Why.
    #[source]
    pub source: PluginError,
}

/// One loaded plugin and where it applies.
#[derive(Debug)]
struct Attached {
    config: PluginConfig,
    instance: Arc<PluginInstance>,
}

impl Attached {
    /// Whether it sees requests in `scope` (its models and tenants).
    fn applies(&self, scope: Scope<'_>) -> bool {
        self.config.models.allows_any(scope.model.into_iter())
            && self
                .config
                .tenants
                .allows_any(std::iter::once(scope.tenant))
    }
}

/// The loaded plugins, in order.
#[derive(Debug, Default)]
pub struct PluginHost {
    attached: Vec<Attached>,
    retry_after: Duration,
    /// Ids of tool calls, unique per process.
    next_call: AtomicU64,
}

/// A tool a plugin runs for the model.
#[derive(Debug, Clone)]
pub(crate) struct ServerTool {
    /// What the model is shown.
    pub spec: ToolSpec,
    /// Which plugin runs it.
    plugin: usize,
}

/// Cancels a tool call that is dropped before it answered (the request went away, or its
/// deadline passed).
struct CancelOnDrop {
    instance: Arc<PluginInstance>,
    id: u64,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.instance.cancel_tool(self.id);
        }
    }
}

/// Who is asking and for what: the plugins attached to the model and tenant apply.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scope<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The model as asked and as served.
    pub model: [&'a str; 2],
    /// The endpoint (`chat`, `completions`, `responses`).
    pub endpoint: &'a str,
}

impl PluginHost {
    /// Loads and creates every plugin (blocking: a plugin may read files as it starts).
    pub fn load(configs: &[PluginConfig], retry_after: Duration) -> Result<Self, PluginLoadError> {
        let mut attached = Vec::with_capacity(configs.len());
        for config in configs {
            let fail = |source| PluginLoadError {
                name: config.name.clone(),
                source,
            };
            let library = PluginLibrary::load(&config.library).map_err(fail)?;
            let instance = library
                .create(&config.config_json, &config.name)
                .map_err(fail)?;
            tracing::info!(plugin = %config.name, library = %library.name(), version = %library.version(), hooks = ?instance.hooks(), tools = instance.tools().len(), "gateway plugin loaded");
            attached.push(Attached {
                config: config.clone(),
                instance,
            });
        }
        Ok(Self {
            attached,
            retry_after,
            next_call: AtomicU64::new(1),
        })
    }

    /// The server tools offered to a request in `scope`: each applying plugin's, in order (a
    /// name an earlier plugin took is skipped).
    pub(crate) fn server_tools(&self, scope: Scope<'_>) -> Vec<ServerTool> {
        let mut seen = HashSet::new();
        let mut tools = Vec::new();
        for (i, plugin) in self.attached.iter().enumerate() {
            if !plugin.instance.hooks().tools || !plugin.applies(scope) {
                continue;
            }
            for spec in plugin.instance.tools() {
                if seen.insert(spec.name.clone()) {
                    tools.push(ServerTool {
                        spec: spec.clone(),
                        plugin: i,
                    });
                }
            }
        }
        tools
    }

    /// Most tokens of `tool`'s answer the model is shown.
    pub(crate) fn result_tokens(&self, tool: &ServerTool) -> usize {
        self.attached[tool.plugin].config.tool_result_tokens
    }

    /// The server `tool` belongs to: the one it names, else its plugin.
    pub(crate) fn server_of<'a>(&'a self, tool: &'a ServerTool) -> &'a str {
        tool.spec
            .server
            .as_deref()
            .unwrap_or(&self.attached[tool.plugin].config.name)
    }

    /// Runs `tool` with the model's `arguments`: its output, or why it failed (a message the
    /// model is shown). Dropping the future cancels the call.
    pub(crate) async fn run_tool(
        &self,
        tool: &ServerTool,
        arguments: &str,
        tenant: &str,
        model: &str,
    ) -> Result<String, String> {
        let plugin = &self.attached[tool.plugin];
        let id = self.next_call.fetch_add(1, Ordering::Relaxed);
        let call = ToolCall {
            name: tool.spec.name.clone(),
            arguments: serde_json::from_str(arguments)
                .unwrap_or_else(|_| Value::String(arguments.to_string())),
            deadline_ms: plugin.config.tool_timeout.as_millis() as u64,
            tenant: tenant.to_string(),
            model: model.to_string(),
        };
        let name = &plugin.config.name;
        let span = tracing::info_span!(target: crate::observability::traces::TARGET, "plugin", plugin = %name, hook = "tool", tool = %tool.spec.name);
        let started = Instant::now();
        let answer = match plugin.instance.call_tool(id, &call) {
            Ok(answer) => answer,
            Err(e) => {
                metrics::plugin_call(name, "tool", "failed", started.elapsed());
                return Err(format!(
                    "the tool `{}` could not start: {e}",
                    tool.spec.name
                ));
            }
        };
        let mut guard = CancelOnDrop {
            instance: Arc::clone(&plugin.instance),
            id,
            armed: true,
        };
        let outcome = tokio::time::timeout(plugin.config.tool_timeout, answer)
            .instrument(span)
            .await;
        let took = started.elapsed();
        let result = match outcome {
            Ok(Ok((status, text))) => {
                guard.armed = false;
                if status == TG_STATUS_OK {
                    metrics::plugin_call(name, "tool", "ok", took);
                    Ok(text)
                } else {
                    metrics::plugin_call(name, "tool", "failed", took);
                    Err(text)
                }
            }
            Ok(Err(_)) => {
                guard.armed = false;
                metrics::plugin_call(name, "tool", "failed", took);
                Err("the tool's plugin dropped the call".into())
            }
            Err(_) => {
                metrics::plugin_call(name, "tool", "timeout", took);
                Err(format!(
                    "the tool `{}` did not answer within {:?}",
                    tool.spec.name, plugin.config.tool_timeout
                ))
            }
        };
        drop(guard);
        result
    }

    /// Whether no plugin is loaded.
    pub fn is_empty(&self) -> bool {
        self.attached.is_empty()
    }

    fn applying<'a>(&'a self, scope: Scope<'a>) -> impl Iterator<Item = &'a Attached> + 'a {
        self.attached.iter().filter(move |a| a.applies(scope))
    }

    fn failed(&self, plugin: &Attached, hook: &str, why: String) -> Option<ApiError> {
        let detail = format!("plugin `{}` {hook}: {why}", plugin.config.name);
        match plugin.config.failure {
            OnFailure::Closed => Some(ApiError::PluginFailed {
                detail,
                retry_after: self.retry_after,
            }),
            OnFailure::Open => {
                tracing::warn!(%detail, "gateway plugin failed; skipped (failure = open)");
                None
            }
        }
    }

    /// Runs the guards that apply, in order: `Ok(None)` lets `req` through as it is,
    /// `Ok(Some(rewritten))` lets the rewrite through, `Err` refuses it.
    pub(crate) async fn guard(
        &self,
        scope: Scope<'_>,
        req: &GenerationRequest,
    ) -> Result<Option<GenerationRequest>, ApiError> {
        let mut current: Option<GenerationRequest> = None;
        for plugin in self.applying(scope).filter(|a| a.instance.hooks().guard) {
            let seen = guard::guard_request(
                current.as_ref().unwrap_or(req),
                scope.tenant,
                scope.model[0],
                scope.endpoint,
            );
            let span = tracing::info_span!(target: crate::observability::traces::TARGET, "plugin", plugin = %plugin.config.name, hook = "guard");
            let started = Instant::now();
            let outcome = span.in_scope(|| plugin.instance.guard(&seen));
            let took = started.elapsed();
            let failure = match &outcome {
                Err(e) => Some(("failed", e.to_string())),
                Ok(_) if took > plugin.config.timeout => Some((
                    "timeout",
                    format!("took {took:?}, more than its {:?}", plugin.config.timeout),
                )),
                Ok(_) => None,
            };
            if let Some((label, why)) = failure {
                metrics::plugin_call(&plugin.config.name, "guard", label, took);
                match self.failed(plugin, "guard", why) {
                    Some(error) => return Err(error),
                    None => continue,
                }
            }
            let Ok(verdict) = outcome else { continue };
            match verdict {
                Verdict::Allow => metrics::plugin_call(&plugin.config.name, "guard", "allow", took),
                Verdict::Reject(r) => {
                    metrics::plugin_call(&plugin.config.name, "guard", "reject", took);
                    return Err(ApiError::PluginRejected {
                        status: r.status,
                        code: r.code,
                        message: r.message,
                    });
                }
                Verdict::Rewrite(rewritten) => {
                    metrics::plugin_call(&plugin.config.name, "guard", "rewrite", took);
                    let next = guard::apply_rewrite(current.as_ref().unwrap_or(req), &rewritten);
                    current = Some(next);
                }
            }
        }
        Ok(current)
    }

    /// The response transforms that apply, if any.
    pub(crate) fn transforms(self: &Arc<Self>, scope: Scope<'_>) -> Option<OutputTransforms> {
        let indices: Vec<usize> = self
            .attached
            .iter()
            .enumerate()
            .filter(|(_, a)| a.instance.hooks().transform && a.applies(scope))
            .map(|(i, _)| i)
            .collect();
        if indices.is_empty() {
            return None;
        }
        let host = Arc::clone(self);
        let (tenant, model, endpoint) = (
            scope.tenant.to_string(),
            scope.model[0].to_string(),
            scope.endpoint.to_string(),
        );
        let open = move |choice: u32| {
            let context = TransformContext {
                tenant: tenant.clone(),
                model: model.clone(),
                endpoint: endpoint.clone(),
                choice,
            };
            let mut chain = Vec::new();
            for &i in &indices {
                let plugin = &host.attached[i];
                match plugin.instance.open_transform(&context) {
                    Ok(handle) => chain.push(transform::Link {
                        plugin: plugin.config.name.clone(),
                        handle,
                        feeds: 0,
                        time: Duration::ZERO,
                        failed: false,
                    }),
                    Err(e) => {
                        if let Some(error) = host.failed(plugin, "transform_open", e.to_string()) {
                            return Err(error);
                        }
                    }
                }
            }
            Ok(chain)
        };
        Some(OutputTransforms::new(Box::new(open), self.retry_after))
    }
}
