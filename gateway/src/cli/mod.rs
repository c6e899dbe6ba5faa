//! The command line: `turnpike [serve]`, `turnpike plugin check`, `turnpike plugin conformance`.

mod admin;
mod keys;
mod make_model;
mod plugin_check;
mod plugin_config;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, ConfigError};
use crate::observability::LogFormat;
use crate::server::{ServeError, Server, reload, shutdown_signal};

pub use plugin_check::PluginCommandError;

/// Turnpike: an OpenAI-compatible LLM gateway with run-time engine plugins.
#[derive(Debug, Parser)]
#[command(name = "turnpike", version, about)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Log format on stderr: `json`, `text`, or `auto` (text on a terminal, JSON otherwise).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,
}

impl Cli {
    /// `info` for the server; `warn` for the plugin tools, whose output is their report.
    pub fn default_log_level(&self) -> &'static str {
        match self.command {
            Some(Command::Plugin(_)) => "warn",
            _ => "info",
        }
    }
}

/// A subcommand.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve(ServeArgs),
    /// Inspect and check engine plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Make API keys and manage the keys file.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Change tenants, plans, keys and the model map of a running gateway (its admin API).
    Admin(admin::AdminArgs),
    /// Write a Llama-family model folder with deterministic random weights (for tests, demos
    /// and benchmarks).
    MakeModel(make_model::MakeModelArgs),
}

/// Arguments of `serve`.
#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// TOML configuration file; without one, the built-in default (loopback, the default engine
    /// serving SmolLM2-135M-Instruct, fetched on first start).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Listen address, overriding the configuration (port 0 picks a free port).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Serve this model alone through the default engine: a `.gguf` file, a Hugging Face model
    /// folder, or a Hub id in the Hub cache (`org/name[@revision][/FILE.gguf]`); replaces the
    /// configuration's engines and models.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The name clients call `--model` by (the file's or folder's name by default).
    #[arg(long, requires = "model")]
    pub name: Option<String>,
    /// How the served models write tool calls, where their configuration names no format:
    /// `hermes` (`<tool_call>` blocks; also `qwen`), `llama3_json` or `mistral`. Without it, the
    /// format their chat template teaches, else `hermes`; a template that shows no tools gets the
    /// generic tool prompt in that format.
    #[arg(long, value_parser = parse_tool_call_parser)]
    pub tool_call_parser: Option<crate::config::ToolCallFormat>,
}

fn parse_tool_call_parser(text: &str) -> Result<crate::config::ToolCallFormat, String> {
    serde_json::from_value(serde_json::Value::String(text.to_string()))
        .map_err(|_| format!("`{text}` is not hermes, qwen, llama3_json or mistral"))
}

/// A plugin subcommand.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Load a plugin, list its models, run one short generation and one cancel.
    Check(PluginArgs),
    /// Run the conformance kit over a plugin.
    Conformance(PluginArgs),
    /// Run the gateway plugin conformance kit over a gateway plugin (guards, transforms, tools).
    GatewayConformance(PluginArgs),
}

/// Arguments of the plugin subcommands.
#[derive(Debug, Args)]
pub struct PluginArgs {
    /// The plugin library (`.so`).
    pub path: PathBuf,
    /// Engine configuration: inline JSON, or `@FILE` (JSON, or TOML when FILE ends in `.toml`).
    #[arg(long)]
    pub config: Option<String>,
    /// Model to exercise; the first one served by default.
    #[arg(long)]
    pub model: Option<String>,
    /// Seconds to wait for any one expected event.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
}

/// Why a command failed; its message is one line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The gateway configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The server could not start or failed.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// A plugin command failed.
    #[error(transparent)]
    Plugin(#[from] PluginCommandError),
    /// A keys command failed.
    #[error(transparent)]
    Keys(#[from] keys::KeysError),
    /// An admin command failed.
    #[error(transparent)]
    Admin(#[from] admin::AdminCliError),
    /// `make-model` failed.
    #[error(transparent)]
    MakeModel(#[from] make_model::MakeModelError),
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// Traces cannot be exported as configured.
    #[error(transparent)]
    Traces(#[from] crate::observability::traces::TracesError),
}

/// Runs a parsed command line; user-facing output goes to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<(), CliError> {
    match cli.command.unwrap_or(Command::Serve(ServeArgs::default())) {
        Command::Serve(args) => serve(args, out),
        Command::Plugin(PluginCommand::Check(args)) => {
            let runtime = current_thread_runtime()?;
            Ok(runtime.block_on(plugin_check::check(&args, out))?)
        }
        Command::Plugin(PluginCommand::GatewayConformance(args)) => {
            let runtime = current_thread_runtime()?;
            Ok(runtime.block_on(plugin_check::gateway_conformance(&args, out))?)
        }
        Command::Plugin(PluginCommand::Conformance(args)) => {
            Ok(plugin_check::conformance(&args, out)?)
        }
        Command::Keys(command) => Ok(keys::run(command, out)?),
        Command::Admin(args) => Ok(admin::run(&args, out)?),
        Command::MakeModel(args) => Ok(make_model::run(&args, out)?),
    }
}

fn current_thread_runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)
}

fn serve(args: ServeArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let mut config = match (&args.model, &args.config) {
        (Some(model), file) => Config::with_model(file.as_deref(), model, args.name.as_deref())?,
        (None, Some(path)) => Config::load(path)?,
        (None, None) => Config::builtin_default()?,
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(format) = args.tool_call_parser {
        config.defaults.tool_call_parser = Some(format);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    if let Some(tracing) = &config.tracing {
        crate::observability::traces::install(tracing, runtime.handle().clone())?;
    }
    runtime.block_on(async {
        let mut server = Server::bind(&config).await?;
        if let Some(file) = args.config.clone() {
            let (path, model, name) = (file.clone(), args.model.clone(), args.name.clone());
            let (listen, tool_call_parser) = (args.listen, args.tool_call_parser);
            server.reload_from(reload::Source {
                file,
                loader: Box::new(move || {
                    let mut config = match &model {
                        Some(model) => Config::with_model(Some(&path), model, name.as_deref())?,
                        None => Config::load(&path)?,
                    };
                    if let Some(listen) = listen {
                        config.listen = listen;
                    }
                    if let Some(format) = tool_call_parser {
                        config.defaults.tool_call_parser = Some(format);
                    }
                    Ok(config)
                }),
            });
        }
        let addr = server.local_addr()?;
        // One line on stdout for scripts and tests that start the gateway on port 0.
        let _ = writeln!(out, "turnpike listening on {}://{addr}", server.scheme());
        if let Some(health) = server.health_addr()? {
            let _ = writeln!(out, "turnpike health on http://{health}");
        }
        let _ = out.flush();
        server.run(shutdown_signal()).await?;
        Ok::<(), CliError>(())
    })?;
    // The last spans go out while the runtime still runs their exporter's requests.
    let flushing = std::thread::spawn(crate::observability::traces::flush);
    let _ = flushing.join();
    // Engines are destroyed as the registry drops; give in-flight plugin threads a moment.
    runtime.shutdown_timeout(Duration::from_secs(5));
    Ok(())
}
