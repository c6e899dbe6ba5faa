//! `turnpike keys`: make API keys and manage the keys file. A new key is printed once, on
//! stdout; the file keeps only its hash. Every change is an audit record in the log.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use crate::config::keys_file::{StoredKey, format_time, parse_keys, parse_time};
use crate::tenancy::keys;

/// A keys subcommand.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Print a new random key (for an environment variable), storing nothing.
    Generate,
    /// Make a key for a tenant, add its hash to the keys file, print the key once.
    Create(CreateArgs),
    /// Replace a key: a new key for the same tenant and scopes; the old one keeps working
    /// until the grace time ends.
    Rotate(RotateArgs),
    /// Revoke a key at once.
    Revoke(IdArgs),
}

/// Arguments of `keys create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The keys file (created when missing).
    #[arg(long)]
    pub file: PathBuf,
    /// The tenant the key belongs to.
    #[arg(long)]
    pub tenant: String,
    /// Expiry, RFC 3339 (`2027-01-01T00:00:00Z`).
    #[arg(long)]
    pub expires: Option<String>,
    /// Limit the key to this model (repeatable).
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// Limit the key to this endpoint (repeatable): chat, completions, embeddings, responses,
    /// models, messages; `admin` lets it call the admin API.
    #[arg(long = "endpoint")]
    pub endpoints: Vec<String>,
}

/// Arguments of `keys rotate`.
#[derive(Debug, Args)]
pub struct RotateArgs {
    /// The keys file.
    #[arg(long)]
    pub file: PathBuf,
    /// The public id of the key to replace.
    #[arg(long)]
    pub id: String,
    /// Seconds the old key keeps working.
    #[arg(long, default_value_t = 86_400)]
    pub grace_secs: i64,
}

/// Arguments naming one key.
#[derive(Debug, Args)]
pub struct IdArgs {
    /// The keys file.
    #[arg(long)]
    pub file: PathBuf,
    /// The key's public id.
    #[arg(long)]
    pub id: String,
}

/// Why a keys command failed.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// Reading or writing the file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file or an argument is invalid.
    #[error("{0}")]
    Invalid(String),
    /// The system's random source failed.
    #[error("no random bytes: {0}")]
    Random(String),
}

fn now() -> i64 {
    i64::try_from(crate::clock::unix_now()).unwrap_or(i64::MAX)
}

fn load(path: &Path) -> Result<(toml::Table, Vec<StoredKey>), KeysError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(KeysError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| KeysError::Invalid(format!("{}: {e}", path.display())))?;
    let keys =
        parse_keys(&text).map_err(|e| KeysError::Invalid(format!("{}: {e}", path.display())))?;
    Ok((table, keys))
}

/// Writes the file whole, through a temporary file and a rename, so a gateway reloading it
/// never reads half a file.
fn save(path: &Path, mut table: toml::Table, keys: &[StoredKey]) -> Result<(), KeysError> {
    let io = |source| KeysError::Io {
        path: path.to_path_buf(),
        source,
    };
    let list = toml::Value::try_from(keys).map_err(|e| KeysError::Invalid(e.to_string()))?;
    table.insert("keys".into(), list);
    let text = toml::to_string(&table).map_err(|e| KeysError::Invalid(e.to_string()))?;
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

fn new_key() -> Result<(String, String), KeysError> {
    keys::generate().map_err(|e| KeysError::Random(e.to_string()))
}

/// Runs a keys subcommand.
pub(super) fn run(command: KeysCommand, out: &mut dyn Write) -> Result<(), KeysError> {
    let key = match command {
        KeysCommand::Generate => new_key()?.0,
        KeysCommand::Create(args) => {
            let (key, id) = new_key()?;
            crate::config::tenancy_name_check(&args.tenant).map_err(KeysError::Invalid)?;
            if let Some(t) = &args.expires {
                parse_time(t, "--expires").map_err(KeysError::Invalid)?;
            }
            let (table, mut list) = load(&args.file)?;
            list.push(StoredKey {
                id: id.clone(),
                hash: keys::hash_text(&keys::hash(&key)),
                tenant: args.tenant.clone(),
                created: Some(format_time(now())),
                expires: args.expires,
                models: (!args.models.is_empty()).then_some(args.models),
                endpoints: (!args.endpoints.is_empty()).then_some(args.endpoints),
                revoked: false,
                budget: None,
            });
            save(&args.file, table, &list)?;
            tracing::info!(target: "turnpike::audit", event = "key_created", key_id = %id, tenant = %args.tenant, file = %args.file.display(), "API key created");
            key
        }
        KeysCommand::Rotate(args) => {
            let (key, id) = new_key()?;
            let (table, mut list) = load(&args.file)?;
            let old = list
                .iter_mut()
                .find(|k| k.id == args.id)
                .ok_or_else(|| KeysError::Invalid(format!("no key {} in the file", args.id)))?;
            let grace_end = format_time(now().saturating_add(args.grace_secs.max(0)));
            old.expires = Some(grace_end.clone());
            let mut new = old.clone();
            new.id = id.clone();
            new.hash = keys::hash_text(&keys::hash(&key));
            new.created = Some(format_time(now()));
            new.expires = None;
            let tenant = new.tenant.clone();
            list.push(new);
            save(&args.file, table, &list)?;
            tracing::info!(target: "turnpike::audit", event = "key_rotated", key_id = %id, replaces = %args.id, old_key_expires = %grace_end, tenant = %tenant, "API key rotated");
            key
        }
        KeysCommand::Revoke(args) => {
            let (table, mut list) = load(&args.file)?;
            let k = list
                .iter_mut()
                .find(|k| k.id == args.id)
                .ok_or_else(|| KeysError::Invalid(format!("no key {} in the file", args.id)))?;
            k.revoked = true;
            let tenant = k.tenant.clone();
            save(&args.file, table, &list)?;
            tracing::info!(target: "turnpike::audit", event = "key_revoked", key_id = %args.id, tenant = %tenant, "API key revoked");
            return Ok(());
        }
    };
    // The key itself, once; nothing else on stdout, so scripts can capture it.
    let _ = writeln!(out, "{key}");
    Ok(())
}
