//! Opening a plugin library and checking its function table.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::PluginError;
use super::engine::EngineHandle;
use super::log::HostTable;
use super::writer::{OutBuf, SMALL_LIMIT};
use crate::abi::{self, TpEngine, TpEngineApiV1, TpEntryV1};
use crate::event::Status;
use crate::layout;

/// What a plugin says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// Where it was loaded from (canonical).
    pub path: PathBuf,
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// ABI major it was built for (always 1 here).
    pub abi_major: u16,
    /// ABI minor it was built for.
    pub abi_minor: u16,
    /// Its table's `struct_size`.
    pub table_size: u32,
    /// Whether it exports `stats`.
    pub has_stats: bool,
    /// Whether it exports `health`.
    pub has_health: bool,
    /// Whether it serves embeddings.
    pub has_embed: bool,
}

/// A loaded plugin library. Cheap to clone; the library stays loaded for the process's life.
#[derive(Debug, Clone)]
pub struct Plugin {
    info: Arc<PluginInfo>,
    api: TpEngineApiV1,
}

impl Plugin {
    /// Opens the library at `path` and checks that it is a Turnpike engine plugin this host can
    /// drive.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, PluginError> {
        let given = path.as_ref().to_path_buf();
        // dlopen searches the library path for a name without a slash; always pass a full path.
        let path = std::fs::canonicalize(&given).map_err(|_| PluginError::NotFound {
            path: given.clone(),
        })?;
        if !path.is_file() {
            return Err(PluginError::NotALibrary {
                path: given,
                reason: "not a file".into(),
            });
        }
        let library = open(&path).map_err(|reason| PluginError::NotALibrary {
            path: given.clone(),
            reason,
        })?;
        let entry = match entry_symbol(&library) {
            Some(entry) => entry,
            None => {
                return Err(match other_major(&library) {
                    Some(found) => PluginError::AbiMajorMismatch { path: given, found },
                    None => PluginError::NotAPlugin { path: given },
                });
            }
        };
        let bad = |reason: String| PluginError::BadTable {
            path: given.clone(),
            reason,
        };
        // SAFETY: the symbol has the documented signature of `turnpike_engine_v1`.
        let table = unsafe { entry() };
        if table.is_null() {
            return Err(bad("turnpike_engine_v1 returned NULL".into()));
        }
        // SAFETY: non-null; every table starts with struct_size.
        let declared = unsafe { layout::declared_size(table) };
        if declared < 8 {
            return Err(bad(format!(
                "struct_size {declared} is too small to hold a version"
            )));
        }
        // SAFETY: the first eight bytes (struct_size, abi_major, abi_minor) are readable.
        let abi_major = unsafe { (*table).abi_major };
        if abi_major != abi::TP_ABI_MAJOR {
            return Err(PluginError::AbiMajorMismatch {
                path: given,
                found: abi_major,
            });
        }
        if declared < layout::ENGINE_API_V1_MIN_SIZE {
            return Err(bad(format!(
                "struct_size {declared} does not cover the required entries ({} bytes)",
                layout::ENGINE_API_V1_MIN_SIZE
            )));
        }
        // SAFETY: the table covers `declared` bytes; `read_prefix` reads no more than that.
        let api = unsafe { layout::read_prefix(table) };
        for (name, present) in [
            ("create", api.create.is_some()),
            ("destroy", api.destroy.is_some()),
            ("models", api.models.is_some()),
            ("submit", api.submit.is_some()),
            ("cancel", api.cancel.is_some()),
        ] {
            if !present {
                return Err(bad(format!("required entry `{name}` is NULL")));
            }
        }
        let name = static_str(api.name).ok_or_else(|| bad("name is NULL".into()))?;
        let version = static_str(api.version).ok_or_else(|| bad("version is NULL".into()))?;
        // Never unloaded: engines may leave threads and thread-locals that outlive any handle.
        std::mem::forget(library);
        let info = PluginInfo {
            path,
            name,
            version,
            abi_major,
            abi_minor: api.abi_minor,
            table_size: declared,
            has_stats: api.stats.is_some(),
            has_health: api.health.is_some(),
            has_embed: api.embed.is_some(),
        };
        Ok(Self {
            info: Arc::new(info),
            api,
        })
    }

    /// What the plugin says about itself.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// The function table as this host reads it (entries beyond the plugin's `struct_size` are
    /// `None`).
    pub fn api(&self) -> &TpEngineApiV1 {
        &self.api
    }

    /// Builds an engine from a JSON configuration.
    pub fn create(&self, config_json: &str) -> Result<EngineHandle, PluginError> {
        let host = HostTable::new(&self.info.name);
        let mut err = OutBuf::new(SMALL_LIMIT);
        let mut engine: *mut TpEngine = std::ptr::null_mut();
        let create = self.api.create.ok_or_else(|| PluginError::BadTable {
            path: self.info.path.clone(),
            reason: "required entry `create` is NULL".into(),
        })?;
        // SAFETY: `create` comes from a checked v1 table; the host table and config outlive the
        // call, and `engine` is a valid out-pointer.
        let status = unsafe {
            create(
                host.as_ptr(),
                layout::tp_str(config_json),
                &mut engine,
                err.writer(),
            )
        };
        let status = Status::from_raw(status);
        if status != Status::Ok || engine.is_null() {
            let message = if status == Status::Ok {
                "returned OK but no engine".to_string()
            } else {
                err.message("no reason given")
            };
            let status = if status == Status::Ok {
                Status::Internal
            } else {
                status
            };
            return Err(PluginError::CreateFailed {
                path: self.info.path.clone(),
                status,
                message,
            });
        }
        Ok(EngineHandle::new(
            Arc::clone(&self.info),
            self.api,
            engine,
            host,
        ))
    }
}

fn open(path: &Path) -> Result<libloading::Library, String> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: loading runs the library's initialisers; that a plugin's initialisers are sound
        // is the trust an operator places in the file they configure. RTLD_NOW makes missing
        // symbols fail here rather than on first call.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }
            .map(libloading::Library::from)
            .map_err(|e| loader_reason(&e, path))
    }
    #[cfg(not(unix))]
    {
        // SAFETY: as above.
        unsafe { libloading::Library::new(path) }.map_err(|e| loader_reason(&e, path))
    }
}

/// The loader's message without the path it repeats.
fn loader_reason(e: &libloading::Error, path: &Path) -> String {
    let text = match e {
        libloading::Error::DlOpen { source } => source.to_string(),
        other => other.to_string(),
    };
    let prefix = format!("{}: ", path.display());
    text.strip_prefix(&prefix).unwrap_or(&text).to_string()
}

fn entry_symbol(library: &libloading::Library) -> Option<TpEntryV1> {
    // SAFETY: if present, the symbol is the v1 entry point with the `TpEntryV1` signature.
    unsafe { library.get::<TpEntryV1>(abi::TP_ENTRY_SYMBOL_V1) }
        .ok()
        .map(|s| *s)
}

/// The major of a `turnpike_engine_vN` entry for another major, if the library has one.
fn other_major(library: &libloading::Library) -> Option<u16> {
    (2..=16u16).find(|major| {
        let symbol = format!("turnpike_engine_v{major}");
        // SAFETY: only the symbol's presence is checked; it is never called.
        unsafe { library.get::<*const ()>(symbol.as_str()) }.is_ok()
    })
}

fn static_str(ptr: *const std::ffi::c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the ABI makes `name` and `version` static NUL-terminated strings.
    Some(
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned(),
    )
}
