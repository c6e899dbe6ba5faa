//! A public model served by more than one engine (seed §19): its own engine (the primary),
//! standbys tried in order when that one is unavailable, and a canary that takes named tenants
//! and a share of the others. It is a [`Backend`] like any engine, so nothing above the engine
//! host knows a model is routed.
//!
//! - **Failover** happens at submit: an engine that answers `unavailable` (the upstream plugin
//!   does when every replica's breaker is open) passes the request to the next target; any
//!   other refusal is the request's answer. An engine that fails after it started (an internal
//!   or unavailable end) hands the request on too, each choice from the tokens it delivered
//!   ([`super::failover`]).
//! - **Canary**: a tenant named in `tenants` always takes it; the others by a hash of the
//!   tenant's name under `percent`, so each tenant sticks to one side. A canary that is
//!   unavailable falls back on the primary, then the standbys.
//! - **Visible**: each request's route is logged (`route`, `engine`, `request_id`), counted in
//!   `turnpike_model_route_total{model, route, engine}`, and answered in the response header
//!   `x-turnpike-route` (`primary fleet-a`, `canary fleet-new`, `standby fleet-b`).

use std::fmt;
use std::sync::Arc;

use turnpike_engine_api::host::EngineRequest;
use turnpike_engine_api::{EmbedParams, EngineError, ModelInfo, Stats, Status};

use super::backend::{Backend, EngineRun};

/// An engine and the model's id in it.
#[derive(Debug, Clone)]
pub struct Target {
    /// The engine's configured name.
    pub engine: String,
    /// The engine.
    pub backend: Arc<dyn Backend>,
    /// The model's id in it.
    pub engine_model: String,
}

/// Which side of a routed model served a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The model's own engine.
    Primary,
    /// The canary.
    Canary,
    /// A standby, after the targets before it were unavailable.
    Standby,
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Self::Primary => "primary",
            Self::Canary => "canary",
            Self::Standby => "standby",
        }
    }
}

/// The canary's share.
#[derive(Debug, Clone)]
pub struct Canary {
    /// Where it goes.
    pub target: Target,
    /// Percent of tenants.
    pub percent: u32,
    /// Tenants that always take it.
    pub tenants: Vec<String>,
}

/// A model over a primary, standbys and a canary.
pub struct RoutedBackend {
    model: String,
    primary: Target,
    standby: Vec<Target>,
    canary: Option<Canary>,
}

impl fmt::Debug for RoutedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoutedBackend")
            .field("model", &self.model)
            .field("primary", &self.primary.engine)
            .finish_non_exhaustive()
    }
}

impl RoutedBackend {
    /// `model` (its public name, for logs and metrics) over these targets.
    pub fn new(
        model: String,
        primary: Target,
        standby: Vec<Target>,
        canary: Option<Canary>,
    ) -> Self {
        Self {
            model,
            primary,
            standby,
            canary,
        }
    }

    /// The targets to try for `tenant`, in order, each with its route.
    fn order(&self, tenant: Option<&str>) -> Vec<(Route, &Target)> {
        let mut order = Vec::with_capacity(self.standby.len() + 2);
        if let Some(c) = &self.canary
            && takes_canary(c.percent, &c.tenants, tenant)
        {
            order.push((Route::Canary, &c.target));
        }
        order.push((Route::Primary, &self.primary));
        order.extend(self.standby.iter().map(|t| (Route::Standby, t)));
        order
    }
}

/// Whether `tenant` takes the canary: named, or under its percent by a stable hash.
fn takes_canary(percent: u32, tenants: &[String], tenant: Option<&str>) -> bool {
    let tenant = tenant.unwrap_or_default();
    if tenants.iter().any(|t| t == tenant) {
        return true;
    }
    // FNV-1a: stable across processes and releases, so a tenant keeps its side.
    let hash = tenant.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % 100) < u64::from(percent)
}

impl Backend for RoutedBackend {
    fn label(&self) -> String {
        self.primary.backend.label()
    }

    fn models(&self) -> Result<Vec<ModelInfo>, EngineError> {
        self.primary.backend.models()
    }

    fn submit(&self, request: &EngineRequest) -> Result<EngineRun, EngineError> {
        let mut last = None;
        // One copy of the request, its model id set per target.
        let mut routed = request.clone();
        let order = self.order(request.params.tenant.as_deref());
        for (at, &(route, target)) in order.iter().enumerate() {
            routed.model.clone_from(&target.engine_model);
            match target.backend.submit(&routed) {
                Ok(mut run) => {
                    run.route = Some(format!("{} {}", route.name(), target.engine));
                    tracing::info!(
                        model = %self.model,
                        route = route.name(),
                        engine = %target.engine,
                        request_id = request.params.request_id.as_deref().unwrap_or_default(),
                        "routed"
                    );
                    metrics::counter!("turnpike_model_route_total", "model" => self.model.clone(), "route" => route.name(), "engine" => target.engine.clone())
                        .increment(1);
                    let rest: Vec<Target> =
                        order[at + 1..].iter().map(|(_, t)| (*t).clone()).collect();
                    if rest.is_empty() {
                        return Ok(run);
                    }
                    return Ok(super::failover::resuming(&self.model, request, run, rest));
                }
                Err(e) if e.status == Status::Unavailable => {
                    tracing::warn!(model = %self.model, engine = %target.engine, error = %e, "engine unavailable; trying the next");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            EngineError::new(Status::Unavailable, "no engine of the model is available")
        }))
    }

    fn embed(
        &self,
        _model: &str,
        inputs: &[Vec<u32>],
        params: &EmbedParams,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        self.primary
            .backend
            .embed(&self.primary.engine_model, inputs, params)
    }

    fn supports_embeddings(&self) -> bool {
        self.primary.backend.supports_embeddings()
    }

    fn health(&self) -> Result<(), EngineError> {
        self.primary.backend.health()
    }

    fn stats(&self) -> Result<Stats, EngineError> {
        self.primary.backend.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_canary_takes_named_tenants_and_a_sticky_share_of_the_rest() {
        let named = ["acme".to_string()];
        assert!(takes_canary(20, &named, Some("acme")));
        let tenants: Vec<String> = (0..1000).map(|i| format!("tenant-{i}")).collect();
        let taken = tenants
            .iter()
            .filter(|t| takes_canary(20, &named, Some(t)))
            .count();
        assert!((150..=250).contains(&taken), "{taken}");
        // Sticky: the same answer every time.
        assert!(
            tenants
                .iter()
                .all(|t| takes_canary(20, &named, Some(t)) == takes_canary(20, &named, Some(t)))
        );
        assert!(!takes_canary(0, &named, Some("other")));
        assert!(takes_canary(100, &[], None));
    }
}
