//! Who may hold a WebSocket connection: at most `server.websocket_max_connections` on this
//! replica in all, and at most its plan's `max_websockets` (else
//! `server.websocket_max_per_tenant`) for one tenant, so one tenant's idle sockets cannot lock
//! every other tenant out. A [`Slot`] is held for the connection's life and gives both back when
//! dropped. The per-tenant counts hold only tenants with a socket open.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::observability::metrics;
use crate::tenancy::Tenant;

/// The WebSocket connections this replica holds.
#[derive(Debug)]
pub struct WebSocketSlots {
    max_total: usize,
    per_tenant_default: usize,
    open: Mutex<Open>,
}

/// The connections open: in all, and per tenant with any.
#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_tenant: HashMap<String, usize>,
}

/// Why a connection gets no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSlot {
    /// The replica holds its most connections.
    Server(usize),
    /// The tenant holds its most connections.
    Tenant(usize),
}

/// One open connection's place.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<WebSocketSlots>,
    tenant: String,
}

impl WebSocketSlots {
    /// At most `max_total` connections, `per_tenant` for a tenant whose plan does not say.
    pub fn new(max_total: usize, per_tenant: usize) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            per_tenant_default: per_tenant,
            open: Mutex::default(),
        })
    }

    /// A slot for a connection of `tenant`, or why there is none.
    pub fn take(self: &Arc<Self>, tenant: &Tenant) -> Result<Slot, NoSlot> {
        let cap = tenant.plan.websockets.map_or(self.per_tenant_default, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        });
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let held = open.by_tenant.get(&tenant.name).copied().unwrap_or(0);
        if held >= cap {
            metrics::rate_limited(&tenant.name, "websockets");
            return Err(NoSlot::Tenant(cap));
        }
        if open.total >= self.max_total {
            return Err(NoSlot::Server(self.max_total));
        }
        open.total += 1;
        open.by_tenant.insert(tenant.name.clone(), held + 1);
        Ok(Slot {
            slots: Arc::clone(self),
            tenant: tenant.name.clone(),
        })
    }

    /// Connections `tenant` holds now.
    #[cfg(test)]
    fn held_by(&self, tenant: &str) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.by_tenant.get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.total -= 1;
        if let Some(held) = open.by_tenant.get_mut(&self.tenant) {
            *held -= 1;
            if *held == 0 {
                open.by_tenant.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenancy::Plan;

    fn tenant(name: &str, websockets: Option<u64>) -> Tenant {
        Tenant {
            name: name.into(),
            plan: Plan {
                websockets,
                ..Plan::default()
            },
        }
    }

    #[test]
    fn a_tenant_at_its_cap_leaves_room_for_others() {
        let slots = WebSocketSlots::new(4, 2);
        let (acme, globex, big) = (
            tenant("acme", None),
            tenant("globex", None),
            tenant("big", Some(3)),
        );
        let a = [slots.take(&acme).unwrap(), slots.take(&acme).unwrap()];
        assert_eq!(slots.take(&acme).unwrap_err(), NoSlot::Tenant(2));
        let g = slots.take(&globex).unwrap();
        let b = slots.take(&big).unwrap();
        assert_eq!(slots.take(&big).unwrap_err(), NoSlot::Server(4));
        drop(a);
        assert_eq!(slots.held_by("acme"), 0);
        assert!(
            !slots.open.lock().unwrap().by_tenant.contains_key("acme"),
            "no entry is kept for a tenant with none open"
        );
        let _more = slots.take(&big).unwrap();
        drop((g, b));
        assert_eq!(slots.held_by("big"), 1);
    }
}
