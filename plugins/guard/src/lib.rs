//! `guard`: a Turnpike gateway plugin that judges requests before they reach a model, per
//! tenant: size limits, deny-lists of words, regex rules, rewrites (mask or remove text before
//! the model sees it) and a prompt-injection heuristic. A refusal is a 400 in OpenAI's error
//! shape with a code that says which check refused it; the message names the rule, never the
//! matched text.
//!
//! ```toml
//! [[plugins]]
//! library = "libturnpike_plugin_guard.so"
//! [plugins.config]
//! max_prompt_chars = 100000          # all message contents or prompts together
//! max_messages = 256
//! deny = ["forbidden phrase"]        # whole words, any case
//! deny_regex = ["(?i)\\bssn\\s*:\\s*\\d{3}-\\d{2}-\\d{4}\\b"]
//! rewrite = [{ pattern = "[\\u200B-\\u200D\\uFEFF]", replacement = "" }]
//! injection = true                   # the prompt-injection heuristic
//! injection_threshold = 1            # phrases needed to refuse
//! [plugins.config.tenants.acme]      # a tenant's own policy, over the defaults above
//! max_prompt_chars = 20000
//! ```

mod policy;

use std::collections::HashMap;

use serde_json::Value;
use turnpike_plugin_api::export_gateway_plugin;
use turnpike_plugin_api::json::{GuardRequest, Rejection, Verdict};
use turnpike_plugin_api::plugin::{GatewayPlugin, Hooks, Host};

use policy::{Policy, RawPolicy};

/// The plugin: a default policy and tenants' own.
#[derive(Debug)]
pub struct Guard {
    default: Policy,
    tenants: HashMap<String, Policy>,
}

fn reject(code: &str, message: String) -> Verdict {
    Verdict::Reject(Rejection {
        status: 400,
        code: code.to_string(),
        message,
    })
}

impl GatewayPlugin for Guard {
    const HOOKS: Hooks = Hooks {
        guard: true,
        transform: false,
        tools: false,
    };

    fn create(config: &Value, _host: Host) -> Result<Self, String> {
        let mut config = config.clone();
        let tenants = config
            .as_object_mut()
            .and_then(|o| o.remove("tenants"))
            .unwrap_or(Value::Null);
        let base: RawPolicy = serde_json::from_value(config).map_err(|e| format!("guard: {e}"))?;
        let default = Policy::compile(&base).map_err(|e| format!("guard: {e}"))?;
        let mut own = HashMap::new();
        if let Value::Object(map) = tenants {
            for (name, raw) in map {
                let raw: RawPolicy = serde_json::from_value(raw)
                    .map_err(|e| format!("guard: tenants.{name}: {e}"))?;
                let policy = Policy::compile(&base.under(raw))
                    .map_err(|e| format!("guard: tenants.{name}: {e}"))?;
                own.insert(name, policy);
            }
        }
        Ok(Self {
            default,
            tenants: own,
        })
    }

    fn guard(&self, request: &GuardRequest) -> Result<Verdict, String> {
        let policy = self.tenants.get(&request.tenant).unwrap_or(&self.default);
        let texts: Vec<(&str, &str)> = match (&request.messages, &request.prompt) {
            (Some(messages), _) => messages
                .iter()
                .map(|m| (m.role.as_str(), m.content.as_deref().unwrap_or("")))
                .collect(),
            (None, Some(prompts)) => prompts.iter().map(|p| ("user", p.as_str())).collect(),
            (None, None) => Vec::new(),
        };
        if let Some(max) = policy.max_messages
            && texts.len() > max
        {
            return Ok(reject(
                "too_many_messages",
                format!(
                    "The request has {} messages; this gateway allows at most {max}.",
                    texts.len()
                ),
            ));
        }
        let chars: usize = texts.iter().map(|(_, t)| t.chars().count()).sum();
        if let Some(max) = policy.max_prompt_chars
            && chars > max
        {
            return Ok(reject(
                "prompt_too_large",
                format!(
                    "The request's text is {chars} characters; this gateway allows at most {max}."
                ),
            ));
        }
        for (_, text) in &texts {
            if let Some(rule) = policy.denied(text) {
                return Ok(reject(
                    "content_policy_violation",
                    format!(
                        "The request was refused by this gateway's content policy (rule `{rule}`)."
                    ),
                ));
            }
        }
        if policy.injection_threshold > 0 {
            let hits: usize = texts
                .iter()
                .filter(|(role, _)| matches!(*role, "user" | "tool"))
                .map(|(_, t)| policy::injection_hits(t))
                .sum();
            if hits >= policy.injection_threshold {
                return Ok(reject(
                    "prompt_injection_suspected",
                    "The request looks like an attempt to override the model's instructions, and was refused.".into(),
                ));
            }
        }
        match policy.rewrite(request) {
            Some(rewritten) => Ok(Verdict::Rewrite(rewritten)),
            None => Ok(Verdict::Allow),
        }
    }
}

export_gateway_plugin!(Guard, "guard");

#[cfg(test)]
mod tests;
