//! Logs on stderr through `tracing`, filtered by `RUST_LOG` (or a default level), as JSON lines or
//! as text. Plugin log lines arrive here too, with target `turnpike::plugin`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Text on a terminal, JSON otherwise.
    Auto,
    /// One JSON object per line.
    Json,
    /// Human-readable text.
    Text,
}

/// Installs the global subscriber, filtered by `RUST_LOG` or else `default_level`; a second call
/// does nothing.
pub fn init_logging(format: LogFormat, default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let json = match format {
        LogFormat::Auto => !std::io::stderr().is_terminal(),
        LogFormat::Json => true,
        LogFormat::Text => false,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

/// What `[logging]` configures: how text a client supplies appears in log lines. Prompts and
/// answers are never logged, at any level; the client's own identifiers (the `user` field of a
/// request) are, as written or, with `content = "hash"`, as `sha256:` and 16 hex digits of their
/// SHA-256, which still joins a user's lines without naming them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoggingSettings {
    /// Log client-supplied text as hashes.
    pub hash_content: bool,
}

/// `[logging]` as written.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLogging {
    #[serde(default = "plain")]
    content: String,
}

fn plain() -> String {
    "plain".into()
}

impl Default for RawLogging {
    fn default() -> Self {
        Self { content: plain() }
    }
}

impl RawLogging {
    /// The settings, or why not.
    pub fn validate(self) -> Result<LoggingSettings, String> {
        match self.content.as_str() {
            "plain" => Ok(LoggingSettings {
                hash_content: false,
            }),
            "hash" => Ok(LoggingSettings { hash_content: true }),
            other => Err(format!(
                "logging.content: `{other}` is not \"plain\" or \"hash\""
            )),
        }
    }
}

static HASH_CONTENT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Applies `settings` to every log line from now on.
pub(super) fn apply(settings: LoggingSettings) {
    HASH_CONTENT.store(settings.hash_content, std::sync::atomic::Ordering::Relaxed);
}

/// Client-supplied `text` as the policy logs it.
pub fn client_text(text: &str) -> std::borrow::Cow<'_, str> {
    use sha2::Digest;
    if text.is_empty() || !HASH_CONTENT.load(std::sync::atomic::Ordering::Relaxed) {
        return std::borrow::Cow::Borrowed(text);
    }
    let digest = sha2::Sha256::digest(text.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    std::borrow::Cow::Owned(format!("sha256:{hex}"))
}
