//! Admission to a model: at most `max_running` generations in flight per model, at most
//! `max_waiting` more waiting for a place, served by priority (higher first), then in arrival
//! order. A full queue is 429 `queue_full`; a request that had to wait learns its position
//! (`x-queue-position`). A place is handed from the leaving request straight to the next
//! waiter, so no arrival can overtake the queue.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::observability::metrics;

/// Queue sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Generations in flight per model.
    pub max_running: usize,
    /// Requests waiting per model.
    pub max_waiting: usize,
}

/// The queues of every model.
#[derive(Debug)]
pub struct Queues {
    limits: QueueLimits,
    models: Mutex<HashMap<String, Arc<ModelQueue>>>,
}

/// The queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull {
    /// How many were waiting.
    pub waiting: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a few plain assignments: a poisoned lock is consistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Queues {
    /// Queues of these sizes.
    pub fn new(limits: QueueLimits) -> Self {
        Self {
            limits,
            models: Mutex::default(),
        }
    }

    /// The queue of a served model (its id: the set is bounded by the registry).
    pub fn of(&self, model: &str) -> Arc<ModelQueue> {
        let mut models = lock(&self.models);
        // Looked up before the entry API, which would copy the id on every request.
        if let Some(queue) = models.get(model) {
            return Arc::clone(queue);
        }
        let (running, waiting) = metrics::queue_gauges(model);
        let queue = Arc::new(ModelQueue {
            model: model.to_string(),
            limits: self.limits,
            state: Mutex::default(),
            running,
            waiting,
        });
        models.insert(model.to_string(), Arc::clone(&queue));
        queue
    }
}

#[derive(Debug)]
struct Waiter {
    priority: i32,
    seq: u64,
    tx: oneshot::Sender<QueueSlot>,
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Waiter {}
impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Waiter {
    fn cmp(&self, other: &Self) -> Ordering {
        // The heap pops the greatest: higher priority, then the earlier arrival.
        self.priority
            .cmp(&other.priority)
            .then(other.seq.cmp(&self.seq))
    }
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    waiting: BinaryHeap<Waiter>,
    seq: u64,
}

/// One model's queue.
#[derive(Debug)]
pub struct ModelQueue {
    model: String,
    limits: QueueLimits,
    state: Mutex<State>,
    /// `turnpike_queue_running` and `turnpike_queue_waiting` of this model (set on every
    /// join and leave, so the handles are kept).
    running: ::metrics::Gauge,
    waiting: ::metrics::Gauge,
}

/// A place among the running; dropping it hands the place to the next waiter.
#[derive(Debug)]
pub struct QueueSlot {
    queue: Option<Arc<ModelQueue>>,
}

impl ModelQueue {
    /// A place now, or a wait for one: `(slot, position on arrival when it waited)`.
    pub async fn enter(
        self: &Arc<Self>,
        priority: i32,
    ) -> Result<(QueueSlot, Option<usize>), QueueFull> {
        let entry = self.join(priority)?;
        let position = entry.position();
        Ok((entry.seated().await?, position))
    }

    /// Joins the queue without waiting: a place now, or a place in line to wait on with
    /// [`QueueEntry::seated`]. A full queue refuses at once.
    pub fn join(self: &Arc<Self>, priority: i32) -> Result<QueueEntry, QueueFull> {
        let mut state = lock(&self.state);
        state.waiting.retain(|w| !w.tx.is_closed());
        if state.running < self.limits.max_running && state.waiting.is_empty() {
            state.running += 1;
            self.gauges(&state);
            return Ok(QueueEntry::Seated(QueueSlot {
                queue: Some(Arc::clone(self)),
            }));
        }
        if state.waiting.len() >= self.limits.max_waiting {
            metrics::queue_full(&self.model);
            return Err(QueueFull {
                waiting: state.waiting.len(),
            });
        }
        let ahead = state
            .waiting
            .iter()
            .filter(|w| w.priority >= priority)
            .count();
        state.seq += 1;
        let (tx, rx) = oneshot::channel();
        let seq = state.seq;
        state.waiting.push(Waiter { priority, seq, tx });
        self.gauges(&state);
        Ok(QueueEntry::Waiting {
            rx,
            position: ahead + 1,
        })
    }

    fn gauges(&self, state: &State) {
        self.running.set(state.running as f64);
        self.waiting.set(state.waiting.len() as f64);
    }

    fn leave(self: &Arc<Self>) {
        loop {
            let next = {
                let mut state = lock(&self.state);
                match state.waiting.pop() {
                    Some(w) => Some(w),
                    None => {
                        state.running = state.running.saturating_sub(1);
                        self.gauges(&state);
                        None
                    }
                }
            };
            let Some(waiter) = next else { return };
            let slot = QueueSlot {
                queue: Some(Arc::clone(self)),
            };
            match waiter.tx.send(slot) {
                Ok(()) => {
                    self.gauges(&lock(&self.state));
                    return;
                }
                // The waiter left; disarm the slot and offer the place to the next one.
                Err(mut slot) => slot.queue = None,
            }
        }
    }
}

/// A place in a model's queue: taken, or in line (leaving the line by dropping it).
#[derive(Debug)]
pub enum QueueEntry {
    /// The place is taken.
    Seated(QueueSlot),
    /// In line, `position` from the front on arrival.
    Waiting {
        /// Where the place arrives.
        rx: oneshot::Receiver<QueueSlot>,
        /// The position on arrival.
        position: usize,
    },
}

impl QueueEntry {
    /// The position on arrival when in line.
    pub fn position(&self) -> Option<usize> {
        match self {
            Self::Seated(_) => None,
            Self::Waiting { position, .. } => Some(*position),
        }
    }

    /// The place, once it is this entry's turn.
    pub async fn seated(self) -> Result<QueueSlot, QueueFull> {
        match self {
            Self::Seated(slot) => Ok(slot),
            // The queue never drops a waiter's sender without sending, except when the waiter
            // was pruned as closed, which cannot happen while this future waits.
            Self::Waiting { rx, .. } => rx.await.map_err(|_| QueueFull { waiting: 0 }),
        }
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        if let Some(queue) = self.queue.take() {
            queue.leave();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn queues(running: usize, waiting: usize) -> Queues {
        Queues::new(QueueLimits {
            max_running: running,
            max_waiting: waiting,
        })
    }

    #[tokio::test]
    async fn full_queues_refuse_and_places_pass_by_priority() {
        let q = queues(1, 2).of("m");
        let (first, pos) = q.enter(0).await.unwrap();
        assert_eq!(pos, None);
        let low = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.enter(0).await.map(|(_, p)| p) }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let (tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        let high = tokio::spawn({
            let q = Arc::clone(&q);
            async move {
                let r = q.enter(5).await;
                tx.send("high").ok();
                r.map(|(_, p)| p)
            }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(q.enter(0).await.unwrap_err(), QueueFull { waiting: 2 });
        drop(first);
        assert_eq!(
            high.await.unwrap(),
            Ok(Some(1)),
            "the higher priority goes first"
        );
        assert_eq!(order.recv().await, Some("high"));
        assert_eq!(low.await.unwrap(), Ok(Some(1)));
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_gives_up_its_turn() {
        let q = queues(1, 1).of("m");
        let (first, _) = q.enter(0).await.unwrap();
        let waiting = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.enter(0).await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        waiting.abort();
        tokio::time::sleep(Duration::from_millis(5)).await;
        // The cancelled waiter no longer counts against the queue.
        let next = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.enter(0).await.map(|(_, p)| p) }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(first);
        assert_eq!(next.await.unwrap(), Ok(Some(1)));
        // Everything returned: a place is free at once.
        assert_eq!(q.enter(0).await.unwrap().1, None);
    }
}
