//! Where a model's replicas come from, kept current while it serves: the configured
//! `endpoints`, then those listed in `endpoints_file` (one base URL per line, `#` comments),
//! re-read every `refresh_ms`, so an operator changes a pool by rewriting one file. With
//! `resolve`, each host name stands for every address it resolves to, re-resolved on the same
//! tick: a Kubernetes headless service lists its ready pods this way, so pods that come and go
//! join and leave the pool. A round that cannot read the file, finds a bad line or cannot
//! resolve a name changes nothing and is logged; the pool keeps serving as it was.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use turnpike_engine_api::plugin::Host;

use crate::Model;
use crate::config::base_url;
use crate::pool::Pool;

/// Where a pool's replicas come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Membership {
    /// Base URLs (`http://host:port`) given in the configuration.
    pub endpoints: Vec<String>,
    /// A file of more base URLs (one per line, `#` comments), re-read every `refresh_ms`.
    pub endpoints_file: Option<String>,
    /// Each host name stands for every address it resolves to (a Kubernetes headless
    /// service), re-resolved every `refresh_ms`; otherwise a name is one replica.
    pub resolve: bool,
    /// How often the endpoints file is re-read and names re-resolved.
    pub refresh_ms: u64,
}

/// How long one name may take to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The replicas' base URLs now, in order, without repeats.
pub(crate) async fn targets(c: &Membership) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for url in listed(c)? {
        let expanded = if c.resolve {
            addresses(&url).await?
        } else {
            vec![url]
        };
        for u in expanded {
            if !out.contains(&u) {
                out.push(u);
            }
        }
    }
    Ok(out)
}

/// The configured endpoints and the file's, names unresolved.
pub(crate) fn listed(c: &Membership) -> Result<Vec<String>, String> {
    let mut listed = c.endpoints.clone();
    if let Some(path) = &c.endpoints_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read endpoints_file `{path}`: {e}"))?;
        for (n, line) in text.lines().enumerate() {
            let url = line.split('#').next().unwrap_or_default().trim();
            if url.is_empty() {
                continue;
            }
            base_url(url)
                .map_err(|why| format!("endpoints_file `{path}` line {}: {why}", n + 1))?;
            listed.push(url.trim_end_matches('/').to_string());
        }
    }
    Ok(listed)
}

/// `http://name:port` as one URL per address of `name` (sorted); an address literal as itself.
async fn addresses(url: &str) -> Result<Vec<String>, String> {
    let authority = url.trim_start_matches("http://");
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => {
            (h, p.parse::<u16>().map_err(|e| format!("`{url}`: {e}"))?)
        }
        _ => (authority, 80),
    };
    if host.trim_matches(['[', ']']).parse::<IpAddr>().is_ok() {
        return Ok(vec![url.to_string()]);
    }
    let found = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| format!("resolving `{host}` took over {RESOLVE_TIMEOUT:?}"))?
        .map_err(|e| format!("cannot resolve `{host}`: {e}"))?;
    let set: BTreeSet<String> = found.map(|addr| format!("http://{addr}")).collect();
    Ok(set.into_iter().collect())
}

/// Refreshes `model`'s replicas every `refresh_ms`, until the runtime stops.
pub(crate) async fn refresh_forever(model: Arc<Model>, host: Host) {
    let what = format!("upstream model `{}`", model.config.id);
    keep_current(&what, &model.config.members, &model.pool, |warn, line| {
        if warn {
            host.warn(line);
        } else {
            host.info(line);
        }
    })
    .await;
}

/// Makes `pool`'s replicas `members`' targets every `refresh_ms`, until the runtime stops;
/// `log(warn, line)` says what changed (`what` names the pool).
pub(crate) async fn keep_current(
    what: &str,
    members: &Membership,
    pool: &Pool,
    log: impl Fn(bool, &str),
) {
    let mut tick = tokio::time::interval(Duration::from_millis(members.refresh_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error = String::new();
    loop {
        tick.tick().await;
        match targets(members).await {
            Ok(urls) => {
                last_error.clear();
                if pool.set_members(&urls) {
                    let now = if urls.is_empty() {
                        "none".into()
                    } else {
                        urls.join(", ")
                    };
                    log(false, &format!("{what} replicas now: {now}"));
                }
            }
            // Said once per distinct error, not every tick.
            Err(why) if why != last_error => {
                log(true, &format!("{what}: replicas unchanged: {why}"));
                last_error = why;
            }
            Err(_) => {}
        }
    }
}

/// Whether `c`'s replicas can change while it serves.
pub(crate) fn dynamic(c: &Membership) -> bool {
    c.endpoints_file.is_some() || c.resolve
}

/// The replicas to start with. An endpoints file that cannot be read is a configuration
/// error; a name that does not resolve yet is one replica until a refresh resolves it (`warn`
/// says why).
pub(crate) fn initial(
    members: &Membership,
    runtime: &tokio::runtime::Runtime,
    warn: impl Fn(&str),
) -> Result<Vec<String>, String> {
    if !dynamic(members) {
        return Ok(members.endpoints.clone());
    }
    let listed = listed(members)?;
    Ok(runtime.block_on(targets(members)).unwrap_or_else(|why| {
        warn(&why);
        listed
    }))
}
