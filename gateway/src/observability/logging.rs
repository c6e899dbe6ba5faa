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

/// The filter's directives as configured (`RUST_LOG` or the default level), and the handle that
/// swaps the filter when traces are turned on.
struct Filter {
    directives: String,
    handle: tracing_subscriber::reload::Handle<EnvFilter, tracing_subscriber::Registry>,
}

static FILTER: std::sync::OnceLock<Filter> = std::sync::OnceLock::new();

/// `directives` with trace spans on or off.
fn filter(directives: &str, traces: bool) -> EnvFilter {
    let level = if traces { "info" } else { "off" };
    let text = format!("{directives},{}={level}", super::traces::TARGET);
    EnvFilter::try_new(&text)
        .unwrap_or_else(|_| EnvFilter::new(format!("info,{}={level}", super::traces::TARGET)))
}

/// Installs the global subscriber, filtered by `RUST_LOG` or else `default_level`, with the
/// (idle) trace layer; a second call does nothing.
pub fn init_logging(format: LogFormat, default_level: &str) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|d| EnvFilter::try_new(d).is_ok())
        .unwrap_or_else(|| default_level.to_string());
    let (filter_layer, handle) = tracing_subscriber::reload::Layer::new(filter(&directives, false));
    let json = match format {
        LogFormat::Auto => !std::io::stderr().is_terminal(),
        LogFormat::Json => true,
        LogFormat::Text => false,
    };
    // Log lines do not carry trace spans (the request's line names its trace id): the writer
    // never sees them, so it formats none of their fields.
    let not_traces = tracing_subscriber::filter::filter_fn(|meta| {
        !(meta.is_span() && meta.target() == super::traces::TARGET)
    });
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry()
        .with(filter_layer)
        .with(super::traces::layer());
    let installed = if json {
        registry
            .with(
                fmt.json()
                    .flatten_event(true)
                    .with_span_list(false)
                    .with_filter(not_traces),
            )
            .try_init()
    } else {
        registry.with(fmt.with_filter(not_traces)).try_init()
    };
    if installed.is_ok() {
        let _ = FILTER.set(Filter { directives, handle });
    }
}

/// Lets trace spans be created (see `traces`).
pub(super) fn enable_traces() {
    if let Some(f) = FILTER.get()
        && let Err(e) = f.handle.reload(filter(&f.directives, true))
    {
        tracing::warn!(error = %e, "cannot turn trace spans on");
    }
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

/// The most bytes of a client's text a log line holds as written; longer text is cut there and
/// marked with its length and hash, so a megabyte `user` costs a log line no more than this.
pub(super) const MAX_LOGGED_TEXT: usize = 256;

/// Client-supplied `text` as the policy logs it, bounded by [`MAX_LOGGED_TEXT`].
pub fn client_text(text: &str) -> std::borrow::Cow<'_, str> {
    use sha2::Digest;
    let hashed = HASH_CONTENT.load(std::sync::atomic::Ordering::Relaxed);
    if text.is_empty() || (!hashed && text.len() <= MAX_LOGGED_TEXT) {
        return std::borrow::Cow::Borrowed(text);
    }
    let digest = sha2::Sha256::digest(text.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    if hashed {
        return std::borrow::Cow::Owned(format!("sha256:{hex}"));
    }
    let mut end = MAX_LOGGED_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}…({} bytes, sha256:{hex})",
        &text[..end],
        text.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_client_text_is_cut_and_marked() {
        assert_eq!(client_text("alice"), "alice");
        let long = "é".repeat(1 << 20);
        let logged = client_text(&long);
        assert!(logged.len() < MAX_LOGGED_TEXT + 64, "{}", logged.len());
        assert!(logged.starts_with("éé") && logged.contains("…(2097152 bytes, sha256:"));
    }
}
