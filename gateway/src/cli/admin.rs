//! `turnpike admin`: the admin API from the command line. Each subcommand is one HTTP call
//! to a running gateway's `/admin/v1`; the answer is printed as JSON. The admin key comes from
//! `--key` or `TURNPIKE_ADMIN_KEY`; `--ca-file` trusts a private CA, and `--cert-file` with
//! `--key-file` presents a client certificate (for `admin.client_certificate = "required"`).

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::{Value, json};

/// Where the gateway is and how to reach it.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// The gateway's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// An admin key (else `TURNPIKE_ADMIN_KEY`).
    #[arg(long)]
    pub key: Option<String>,
    /// PEM file of the CA that signs the gateway's certificate.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain to present.
    #[arg(long, requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate.
    #[arg(long, requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// Make the change only if the admin state is still at this revision.
    #[arg(long)]
    pub if_match: Option<u64>,
    /// What to do.
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// An admin subcommand.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Print the whole admin state and its revision.
    State,
    /// List tenants.
    Tenants,
    /// Create or replace a tenant (limits as JSON, like a config file's `[tenants.NAME]`).
    PutTenant(NamedLimits),
    /// Remove a tenant the admin API made, with its keys.
    DeleteTenant(Named),
    /// List the plans the admin API made.
    Plans,
    /// Create or replace a plan.
    PutPlan(NamedLimits),
    /// Remove a plan.
    DeletePlan(Named),
    /// List keys (never their secrets).
    Keys {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Make a key; it is printed once.
    CreateKey {
        /// Its tenant.
        #[arg(long)]
        tenant: String,
        /// Limit it to this model (repeatable).
        #[arg(long = "model")]
        models: Vec<String>,
        /// Limit it to this endpoint (repeatable; `admin` makes an admin key).
        #[arg(long = "endpoint")]
        endpoints: Vec<String>,
        /// Expiry, RFC 3339.
        #[arg(long)]
        expires: Option<String>,
        /// Its own spend budget as JSON: `{"per_day": 5.0, "total": 100}`.
        #[arg(long)]
        budget: Option<String>,
    },
    /// Replace a key; the old one works until the grace ends.
    RotateKey {
        /// The key's id.
        id: String,
        /// Seconds the old key keeps working.
        #[arg(long, default_value_t = 86_400)]
        grace_secs: u64,
    },
    /// Revoke a key at once.
    RevokeKey(Named),
    /// List public model ids, aliases and shutdown dates.
    Models,
    /// Point an alias at a configured model id (a pinned version, say).
    Alias {
        /// The alias.
        alias: String,
        /// The configured id it names.
        model: String,
    },
    /// Remove an alias.
    Unalias(Named),
    /// Announce a model's shutdown date (YYYY-MM-DD).
    Shutdown {
        /// The model id or alias.
        model: String,
        /// The date.
        date: String,
    },
    /// Withdraw a shutdown date.
    Unshutdown(Named),
    /// Set a model's prices, replacing the configuration's for it.
    Price {
        /// The model id or alias.
        model: String,
        /// The prices as JSON: `[{"input": 0.15, "output": 0.6}, {"from": "2027-01-01", …}]`.
        prices: String,
    },
    /// Remove a model's prices (the configuration's apply again).
    Unprice(Named),
    /// Read the audit log.
    Audit {
        /// Only revisions after this one.
        #[arg(long)]
        after: Option<u64>,
        /// Only this action (`key.create`, …).
        #[arg(long)]
        action: Option<String>,
        /// Only this target.
        #[arg(long)]
        target: Option<String>,
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Report usage and cost from the daily sums (JSON, or CSV with `--format csv`).
    Usage {
        /// First day, YYYY-MM-DD (default: `--to`).
        #[arg(long)]
        from: Option<String>,
        /// Last day, YYYY-MM-DD (default: today, UTC).
        #[arg(long)]
        to: Option<String>,
        /// Only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Only this key id.
        #[arg(long)]
        key_id: Option<String>,
        /// Only this model.
        #[arg(long)]
        model: Option<String>,
        /// Group rows by these, comma-separated: day, tenant, key, model.
        #[arg(long)]
        group_by: Option<String>,
        /// `json` or `csv`.
        #[arg(long)]
        format: Option<String>,
    },
}

/// A name.
#[derive(Debug, Args)]
pub struct Named {
    /// The name or id.
    pub name: String,
}

/// A name and limits.
#[derive(Debug, Args)]
pub struct NamedLimits {
    /// The name.
    pub name: String,
    /// Limits as JSON: `{"plan": "pro", "requests_per_minute": 600}`.
    #[arg(long, default_value = "{}")]
    pub limits: String,
}

/// Why an admin command failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminCliError {
    /// No key given.
    #[error("no admin key: pass --key or set TURNPIKE_ADMIN_KEY")]
    NoKey,
    /// A bad argument.
    #[error("{0}")]
    Argument(String),
    /// The call failed before an answer.
    #[error("admin call failed: {0}")]
    Transport(String),
    /// The gateway refused it.
    #[error("the gateway answered {status}: {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Its error message.
        message: String,
    },
}

fn enc(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn json_arg(text: &str, flag: &str) -> Result<Value, AdminCliError> {
    serde_json::from_str(text).map_err(|e| AdminCliError::Argument(format!("{flag}: {e}")))
}

fn limits(text: &str) -> Result<Value, AdminCliError> {
    json_arg(text, "--limits")
}

/// `path` with the query pairs that have a value.
fn with_query(path: &str, pairs: &[(&str, Option<String>)]) -> String {
    let query: Vec<String> = pairs
        .iter()
        .filter_map(|(name, value)| value.as_ref().map(|v| format!("{name}={}", enc(v))))
        .collect();
    if query.is_empty() {
        path.into()
    } else {
        format!("{path}?{}", query.join("&"))
    }
}

/// The call a subcommand makes: method, path under `/admin/v1`, body.
fn call(command: &AdminCommand) -> Result<(&'static str, String, Option<Value>), AdminCliError> {
    use AdminCommand as C;
    let list = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
    Ok(match command {
        C::State => ("GET", "/state".into(), None),
        C::Tenants => ("GET", "/tenants".into(), None),
        C::PutTenant(n) => (
            "PUT",
            format!("/tenants/{}", enc(&n.name)),
            Some(limits(&n.limits)?),
        ),
        C::DeleteTenant(n) => ("DELETE", format!("/tenants/{}", enc(&n.name)), None),
        C::Plans => ("GET", "/plans".into(), None),
        C::PutPlan(n) => (
            "PUT",
            format!("/plans/{}", enc(&n.name)),
            Some(limits(&n.limits)?),
        ),
        C::DeletePlan(n) => ("DELETE", format!("/plans/{}", enc(&n.name)), None),
        C::Keys { tenant } => (
            "GET",
            with_query("/keys", &[("tenant", tenant.clone())]),
            None,
        ),
        C::CreateKey {
            tenant,
            models,
            endpoints,
            expires,
            budget,
        } => {
            let mut body = json!({"tenant": tenant});
            if let Some(m) = list(models) {
                body["models"] = json!(m);
            }
            if let Some(e) = list(endpoints) {
                body["endpoints"] = json!(e);
            }
            if let Some(x) = expires {
                body["expires"] = json!(x);
            }
            if let Some(b) = budget {
                body["budget"] = json_arg(b, "--budget")?;
            }
            ("POST", "/keys".into(), Some(body))
        }
        C::RotateKey { id, grace_secs } => (
            "POST",
            format!("/keys/{}/rotate", enc(id)),
            Some(json!({"grace_seconds": grace_secs})),
        ),
        C::RevokeKey(n) => ("POST", format!("/keys/{}/revoke", enc(&n.name)), None),
        C::Models => ("GET", "/models".into(), None),
        C::Alias { alias, model } => (
            "PUT",
            format!("/models/aliases/{}", enc(alias)),
            Some(json!({"model": model})),
        ),
        C::Unalias(n) => ("DELETE", format!("/models/aliases/{}", enc(&n.name)), None),
        C::Shutdown { model, date } => (
            "PUT",
            format!("/models/shutdown_dates/{}", enc(model)),
            Some(json!({"date": date})),
        ),
        C::Unshutdown(n) => (
            "DELETE",
            format!("/models/shutdown_dates/{}", enc(&n.name)),
            None,
        ),
        C::Price { model, prices } => (
            "PUT",
            format!("/models/prices/{}", enc(model)),
            Some(json!({"prices": json_arg(prices, "prices")?})),
        ),
        C::Unprice(n) => ("DELETE", format!("/models/prices/{}", enc(&n.name)), None),
        C::Audit {
            after,
            action,
            target,
            limit,
        } => {
            let pairs = [
                ("after", after.map(|a| a.to_string())),
                ("action", action.clone()),
                ("target", target.clone()),
                ("limit", limit.map(|l| l.to_string())),
            ];
            ("GET", with_query("/audit", &pairs), None)
        }
        C::Usage {
            from,
            to,
            tenant,
            key_id,
            model,
            group_by,
            format,
        } => {
            let pairs = [
                ("from", from.clone()),
                ("to", to.clone()),
                ("tenant", tenant.clone()),
                ("key", key_id.clone()),
                ("model", model.clone()),
                ("group_by", group_by.clone()),
                ("format", format.clone()),
            ];
            ("GET", with_query("/usage", &pairs), None)
        }
    })
}

fn read(path: &Path) -> Result<Vec<u8>, AdminCliError> {
    std::fs::read(path).map_err(|e| AdminCliError::Argument(format!("{}: {e}", path.display())))
}

fn agent(args: &AdminArgs) -> Result<ureq::Agent, AdminCliError> {
    use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};
    let pem_error = |what: &str, e: ureq::Error| AdminCliError::Argument(format!("{what}: {e}"));
    let mut tls = TlsConfig::builder();
    if let Some(ca) = &args.ca_file {
        let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&read(ca)?)
            .filter_map(|item| match item {
                Ok(PemItem::Certificate(c)) => Some(Ok(c)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<_, _>>()
            .map_err(|e| pem_error("--ca-file", e))?;
        tls = tls.root_certs(RootCerts::new_with_certs(&certs));
    }
    if let (Some(cert), Some(key)) = (&args.cert_file, &args.key_file) {
        let chain: Vec<Certificate<'static>> = ureq::tls::parse_pem(&read(cert)?)
            .filter_map(|item| match item {
                Ok(PemItem::Certificate(c)) => Some(Ok(c)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<_, _>>()
            .map_err(|e| pem_error("--cert-file", e))?;
        let key = PrivateKey::from_pem(&read(key)?).map_err(|e| pem_error("--key-file", e))?;
        tls = tls.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
    }
    Ok(ureq::Agent::config_builder()
        .http_status_as_error(false)
        .tls_config(tls.build())
        .build()
        .new_agent())
}

/// Runs one admin subcommand, printing the gateway's answer.
pub(super) fn run(args: &AdminArgs, out: &mut dyn Write) -> Result<(), AdminCliError> {
    let key = args
        .key
        .clone()
        .or_else(|| std::env::var("TURNPIKE_ADMIN_KEY").ok())
        .ok_or(AdminCliError::NoKey)?;
    let (method, path, body) = call(&args.command)?;
    let url = format!("{}/admin/v1{path}", args.url.trim_end_matches('/'));
    let request = ureq::http::Request::builder()
        .method(method)
        .uri(&url)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json");
    let request = match args.if_match {
        Some(revision) => request.header("if-match", format!("\"{revision}\"")),
        None => request,
    };
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = request
        .body(body)
        .map_err(|e| AdminCliError::Argument(e.to_string()))?;
    let mut response = agent(args)?
        .run(request)
        .map_err(|e| AdminCliError::Transport(e.to_string()))?;
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .read_to_string()
        .map_err(|e| AdminCliError::Transport(e.to_string()))?;
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if !(200..300).contains(&status) {
        let message = value["error"]["message"]
            .as_str()
            .map_or_else(|| value.to_string(), str::to_string);
        return Err(AdminCliError::Refused { status, message });
    }
    // A CSV report is printed as it came.
    let shown = match &value {
        Value::String(text) => text.trim_end().to_string(),
        other => serde_json::to_string_pretty(other).unwrap_or_default(),
    };
    writeln!(out, "{shown}").map_err(|e| AdminCliError::Transport(e.to_string()))
}
