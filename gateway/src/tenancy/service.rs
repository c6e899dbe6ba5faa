//! The tenancy services a request goes through, built from the configuration: authentication,
//! limits on the state store, model queues, idempotency; and [`Admission`], what a generation
//! holds while it runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Directory;
use super::auth::{Authenticator, Caller};
use super::keys_file::{self, KeysDoc};
use super::limits::{Limiter, StreamPermit, TokenHold};
use super::queue::{QueueEntry, Queues};
use super::settings::TenancyConfig;
use crate::engine_host::ServedModel;
use crate::error::ApiError;
use crate::idempotency::Idempotency;
use crate::spend::hold::{RecordWrite, SpendHold};
use crate::spend::prices::Price;
use crate::spend::settings::SpendConfig;
use crate::spend::usage::RecordContext;
use crate::spend::{Money, Usage};
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::store::{Store, StoreError};

/// Authentication, limits, queues and idempotency.
#[derive(Debug)]
pub struct Tenancy {
    /// Credentials to principals.
    pub auth: Authenticator,
    /// Per-tenant limits.
    pub limiter: Limiter,
    /// Per-model queues.
    pub queues: Queues,
    /// Idempotency, unless switched off.
    pub idempotency: Option<Arc<Idempotency>>,
    /// Whether the state store answers (see [`crate::store::health`]).
    pub store_health: Arc<crate::store::health::StoreHealth>,
    /// Whether every generation needs the store: a request, token or concurrency limit fails
    /// closed, so while the store is away nothing can be served (`/ready` says so).
    pub needs_store: bool,
    /// What the directory is composed from.
    layers: std::sync::Mutex<Layers>,
    /// Prices and the currency, swapped whole on reload.
    spend: std::sync::RwLock<Arc<SpendConfig>>,
    /// The budget counters callers are charged to, by caller and day.
    charge_plans: super::charge_plans::ChargePlans,
}

/// The layers of the tenant directory: the configuration (with its keys file) and the admin
/// API's document. A change to one is composed with the others, validated, then swapped in
/// whole; one that fails validation changes nothing.
#[derive(Debug, Clone)]
struct Layers {
    config: TenancyConfig,
    managed: Option<Arc<KeysDoc>>,
    /// Keys the configuration and its keys file gave at the last install.
    config_keys: usize,
}

/// What a generation asks [`Tenancy::admit`] for.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmitRequest {
    /// Its prompt tokens.
    pub prompt: u64,
    /// The most new tokens it may produce (every choice together).
    pub most_new: u64,
    /// Its place in the model's queue: higher goes first.
    pub priority: i32,
    /// When the request times out.
    pub deadline: Instant,
    /// Whether to wait for a place in the model's queue before answering.
    pub wait: bool,
    /// Its price, when its model has one.
    pub price: Option<Price>,
    /// What its usage record says besides the counts.
    pub record: RecordContext,
}

/// What a running generation holds: its token reservation, its concurrency lease and its place
/// in the model's queue. Dropping it returns all three (unused tokens included).
#[derive(Debug, Default)]
pub struct Admission {
    tokens: Option<TokenHold>,
    /// Its cost held against the caller's budgets (also without budgets: it prices the usage).
    spend: Option<SpendHold>,
    /// Where the settled cost is reported (`x-turnpike-cost`).
    caller: Option<Caller>,
    /// The usage record's write, once billed: the final usage waits for it.
    writing: Option<PendingWrite>,
    _permit: Option<StreamPermit>,
    place: Option<QueueEntry>,
    /// The prompt's tokens, charged once the generation has its place.
    prompt: u64,
}

impl Admission {
    /// Whether the generation still waits for its place in the model's queue.
    pub fn is_waiting(&self) -> bool {
        matches!(self.place, Some(QueueEntry::Waiting { .. }))
    }

    /// Waits (until `deadline`) for the place in the model's queue, if it is not taken yet. A
    /// generation that got its place is charged its prompt (one that gave up waiting is not).
    pub async fn seated(&mut self, deadline: Instant) -> Result<(), ApiError> {
        let Some(entry) = self.place.take() else {
            return Ok(());
        };
        match tokio::time::timeout_at(deadline.into(), entry.seated()).await {
            Ok(Ok(slot)) => {
                self.place = Some(QueueEntry::Seated(slot));
                self.record(self.prompt);
                Ok(())
            }
            Ok(Err(_)) => Err(ApiError::Overloaded {
                message: "the model's queue let this request go; retry it".into(),
                retry_after: Duration::from_secs(1),
            }),
            Err(_) => Err(ApiError::Timeout(
                deadline.saturating_duration_since(Instant::now()),
            )),
        }
    }

    /// Records the tokens used so far, so a drop (cancel, error) settles with them.
    pub fn record(&self, used: u64) {
        if let Some(t) = &self.tokens {
            t.record(used);
        }
        if let Some(s) = &self.spend {
            s.record(self.prompt, used.saturating_sub(self.prompt));
        }
    }

    /// Settles the cost of `usage` (the generation's final count) and the tokens it left of
    /// its reservation, reports the cost to the caller and starts writing the usage record
    /// ([`Admission::poll_written`]); the cost, when the model has a price.
    pub fn bill(&mut self, usage: Usage) -> Option<Money> {
        let used = usage.prompt + usage.completion;
        let Some(spend) = self.spend.take() else {
            if let Some(tokens) = self.tokens.take() {
                tokens.settle(used);
            }
            return None;
        };
        let give_back = self.tokens.take().and_then(|t| t.into_give_back(used));
        let (cost, write) = spend.bill(usage, give_back);
        self.writing = write.map(PendingWrite);
        if let (Some(caller), Some(cost)) = (&self.caller, cost) {
            caller.report(|r| r.cost = Some(Money(r.cost.map_or(0, |c| c.0) + cost.0)));
        }
        cost
    }

    /// Ready once the usage record [`Admission::bill`] started is written.
    pub fn poll_written(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if let Some(PendingWrite(write)) = &mut self.writing {
            std::task::ready!(write.as_mut().poll(cx));
            self.writing = None;
        }
        std::task::Poll::Ready(())
    }

    /// Waits for the usage record [`Admission::bill`] started.
    pub async fn written(mut self) {
        std::future::poll_fn(|cx| self.poll_written(cx)).await;
    }

    /// Marks the generation as failed (its error was sent), for its usage record.
    pub fn fail(&self) {
        if let Some(s) = &self.spend {
            s.fail();
        }
    }

    /// Settles with the tokens used (an embedding request: `used` are its input tokens);
    /// what is left holds the usage record's write ([`Admission::written`]).
    pub fn settle(mut self, used: u64) -> Self {
        self.bill(Usage {
            prompt: used,
            ..Usage::default()
        });
        self
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        // A record still being written is finished, not dropped with the generation.
        if let Some(PendingWrite(write)) = self.writing.take() {
            crate::spend::hold::spawn(write);
        }
    }
}

/// A usage record being written.
struct PendingWrite(RecordWrite);

impl std::fmt::Debug for PendingWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingWrite")
    }
}

impl Tenancy {
    /// Builds the services. Needs a Tokio runtime (the Redis connection lives on it).
    pub fn build(config: &TenancyConfig, retry_after: Duration) -> Result<Self, StoreError> {
        let store: Arc<dyn Store> = match &config.redis_url {
            Some(url) => {
                let store = RedisStore::new(url, config.state_timeout)?;
                Arc::new(match &config.spend.journal {
                    Some((path, max_bytes)) => store.with_journal(path, *max_bytes)?,
                    None => store,
                })
            }
            None => Arc::new(MemoryStore::new(config.memory)),
        };
        let mut config_keys = 0;
        let auth = if config.auth_required {
            let directory = keys_file::directory(config).map_err(StoreError)?;
            config_keys = directory.keys.len();
            Authenticator::required(directory, config.jwt.as_ref().map(|j| (*j.0).clone()))
        } else {
            Authenticator::off()
        };
        let limiter = Limiter::new(
            Arc::clone(&store),
            config.failure,
            config.lease_ttl,
            retry_after,
        );
        let idempotency = config.idempotency.clone().map(|settings| {
            Arc::new(Idempotency::new(
                Arc::clone(&store),
                settings,
                config.failure.idempotency,
                retry_after,
            ))
        });
        let closed = |mode| matches!(mode, crate::tenancy::limits::FailureMode::Closed);
        let failure = config.failure;
        Ok(Self {
            auth,
            limiter,
            queues: Queues::new(config.queue),
            idempotency,
            store_health: Arc::default(),
            needs_store: config.redis_url.is_some()
                && (closed(failure.requests)
                    || closed(failure.tokens)
                    || closed(failure.concurrency)),
            layers: std::sync::Mutex::new(Layers {
                config: config.clone(),
                managed: None,
                config_keys,
            }),
            spend: std::sync::RwLock::new(Arc::new(config.spend.clone())),
            charge_plans: Default::default(),
        })
    }

    pub(super) fn spend_config(&self) -> &std::sync::RwLock<Arc<SpendConfig>> {
        &self.spend
    }

    pub(super) fn charge_plans(&self) -> &super::charge_plans::ChargePlans {
        &self.charge_plans
    }

    fn layers(&self) -> std::sync::MutexGuard<'_, Layers> {
        // Layers change by whole assignments; a poisoned lock holds consistent data.
        self.layers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The state store.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.limiter.store()
    }

    /// The directory `managed` would make with the configuration in force, or why it is invalid.
    pub fn check_managed(&self, managed: &KeysDoc) -> Result<Directory, String> {
        let config = self.layers().config.clone();
        keys_file::compose(&config, &keys_file::read(&config)?, Some(managed))
    }

    /// Replaces the admin API's layer and swaps in the directory it makes.
    pub fn install_managed(&self, managed: Arc<KeysDoc>) -> Result<(), String> {
        let mut layers = self.layers();
        let config = &layers.config;
        let directory = keys_file::compose(config, &keys_file::read(config)?, Some(&managed))?;
        self.auth.replace(directory);
        layers.managed = Some(managed);
        Ok(())
    }

    /// Replaces the configuration's layer (a reload) and swaps in the directory it makes with
    /// the admin API's; returns that directory's size (tenants, keys).
    ///
    /// A configuration whose file and keys file leave no tenant, while the running ones gave
    /// keys, is refused unless it sets `auth.allow_empty_directory`: an emptied or truncated
    /// file would otherwise lock every caller out until the next good write.
    pub fn install_config(&self, config: &TenancyConfig) -> Result<(usize, usize), String> {
        let mut layers = self.layers();
        let file = keys_file::read(config)?;
        let own = keys_file::compose(config, &file, None)?;
        if config.auth_required
            && own.tenants.is_empty()
            && layers.config_keys > 0
            && !config.allow_empty_directory
        {
            return Err(format!(
                "the configuration and its keys file define no tenant, while the running ones                  give {} keys: refused so every caller is not locked out (set                  auth.allow_empty_directory = true to allow it)",
                layers.config_keys
            ));
        }
        let directory = keys_file::compose(config, &file, layers.managed.as_deref())?;
        let size = (directory.tenants.len(), directory.keys.len());
        self.auth.replace(directory);
        *self
            .spend
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config.spend.clone());
        layers.config = config.clone();
        layers.config_keys = own.keys.len();
        Ok(size)
    }

    /// Refuses a model the caller may not use (403).
    pub fn check_model(
        &self,
        caller: &Caller,
        model: &ServedModel,
        asked: &str,
    ) -> Result<(), ApiError> {
        let names = [asked, model.id.as_str()];
        if caller.principal.may_use(names.iter().copied()) {
            return Ok(());
        }
        Err(ApiError::Forbidden {
            param: Some("model".into()),
            code: "model_not_allowed",
            message: format!("Your plan or key does not allow the model `{asked}`."),
        })
    }

    /// Admits a generation of `ask.prompt` tokens that may produce `ask.most_new` more:
    /// reserves the tokens, takes a concurrency lease, then joins the model's queue. With
    /// `ask.wait`, it waits (until `ask.deadline`) for its place; else the admission may still
    /// wait (see [`Admission::seated`]), as a background response does after it answered
    /// `queued`.
    pub async fn admit(
        &self,
        caller: &Caller,
        model: &ServedModel,
        ask: AdmitRequest,
    ) -> Result<Admission, ApiError> {
        let AdmitRequest {
            prompt,
            most_new,
            priority,
            deadline,
            wait,
            price,
            record,
        } = ask;
        // The token reservation and the spend hold are asked for at once (one round trip to
        // a shared store, not two); when one refuses, the other is given back.
        let mut report = caller.snapshot();
        let (reserved, spend) = tokio::join!(
            self.limiter
                .reserve(&caller.principal, prompt + most_new, &mut report),
            self.hold_spend(caller, price, prompt, most_new, record),
        );
        caller.report(|r| r.tokens = report.tokens);
        let (tokens, spend) = match (reserved, spend) {
            (Ok(tokens), Ok(spend)) => (tokens, spend),
            (Err(e), spend) => {
                if let Ok(Some(hold)) = spend {
                    hold.release();
                }
                return Err(e);
            }
            (Ok(_), Err(e)) => return Err(e),
        };
        let permit = self.limiter.acquire(&caller.principal).await?;
        let entry =
            self.queues
                .of(&model.id)
                .join(priority)
                .map_err(|full| ApiError::Overloaded {
                    message: format!(
                        "the queue of model `{}` is full ({} waiting)",
                        model.id, full.waiting
                    ),
                    retry_after: self.limiter.retry_after(),
                })?;
        caller.report(|r| r.queue_position = entry.position());
        let mut admission = Admission {
            tokens,
            spend,
            caller: Some(caller.clone()),
            writing: None,
            _permit: permit,
            place: Some(entry),
            prompt,
        };
        if wait || !admission.is_waiting() {
            admission.seated(deadline).await?;
        }
        Ok(admission)
    }
}
