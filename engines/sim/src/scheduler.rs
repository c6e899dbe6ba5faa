//! The simulator's clock: one thread that owns every live request. It admits queued requests
//! (highest priority first, then in arrival order) while fewer than `max_running` run, emits each
//! running request's next tokens when they are due, and finishes cancelled requests.
//!
//! Host threads never wait on it: `submit` and `cancel` send a message down a channel, and the
//! thread drains its inbox between rounds, waiting on the channel (with the next token's due time
//! as the timeout) when nothing is due. One thread serves any number of requests, so the
//! simulator stays cheap under load, and even at zero latency a cancel lands within one round.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use turnpike_engine_api::plugin::Sink;
use turnpike_engine_api::{EngineError, FinalEvent, Stats, Status, Usage};

use crate::generation::{Generation, Step};

struct Entry {
    sink: Sink,
    generation: Generation,
}

enum Message {
    Submit {
        id: u64,
        priority: i32,
        entry: Box<Entry>,
    },
    Cancel(u64),
    Shutdown,
}

/// Counters shared with host threads (written by the clock thread, and by `enqueue` for the
/// reservation of a place).
#[derive(Default)]
struct Counters {
    /// Accepted and not yet finished: queued, running, or on the way to the clock.
    live: AtomicU64,
    running: AtomicU64,
    completed: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    tokens: AtomicU64,
}

pub(crate) struct Scheduler {
    inbox: Mutex<Sender<Message>>,
    counters: Arc<Counters>,
    closed: AtomicBool,
    /// `max_running + max_queued`: the most requests accepted at once.
    capacity: u64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Scheduler {
    pub(crate) fn start(max_running: usize, max_queued: usize) -> std::io::Result<Self> {
        let (tx, rx) = channel();
        let counters = Arc::new(Counters::default());
        let clock = Clock {
            counters: Arc::clone(&counters),
            max_running,
            ..Clock::default()
        };
        let thread = std::thread::Builder::new()
            .name("turnpike-sim".into())
            .spawn(move || clock.run(&rx))?;
        Ok(Self {
            inbox: Mutex::new(tx),
            counters,
            closed: AtomicBool::new(false),
            capacity: (max_running + max_queued) as u64,
            thread: Mutex::new(Some(thread)),
        })
    }

    fn send(&self, message: Message) -> bool {
        let inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        inbox.send(message).is_ok()
    }

    /// Queues a request; refuses when the queue is full or the engine is closing.
    pub(crate) fn enqueue(
        &self,
        id: u64,
        sink: Sink,
        generation: Generation,
        priority: i32,
    ) -> Result<(), EngineError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(EngineError::new(
                Status::Unavailable,
                "the engine is shutting down",
            ));
        }
        // Reserve a place first, so concurrent submits cannot overshoot the limit.
        let live = self.counters.live.fetch_add(1, Ordering::AcqRel);
        if live >= self.capacity {
            self.counters.live.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::overloaded(format!(
                "the queue is full ({live} requests running or waiting)"
            )));
        }
        if !self.send(Message::Submit {
            id,
            priority,
            entry: Box::new(Entry { sink, generation }),
        }) {
            self.counters.live.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::new(
                Status::Unavailable,
                "the engine is shutting down",
            ));
        }
        Ok(())
    }

    pub(crate) fn cancel(&self, id: u64) {
        self.send(Message::Cancel(id));
    }

    pub(crate) fn stats(&self) -> Stats {
        let c = &self.counters;
        let running = c.running.load(Ordering::Relaxed);
        let mut stats = Stats {
            queued: c.live.load(Ordering::Relaxed).saturating_sub(running),
            running,
            completed: c.completed.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            extra: Default::default(),
        };
        stats.extra.insert(
            "completion_tokens".into(),
            c.tokens.load(Ordering::Relaxed).into(),
        );
        stats
    }

    /// Finishes every live request as cancelled and stops the thread. Idempotent.
    pub(crate) fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        self.send(Message::Shutdown);
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The state only the clock thread touches.
#[derive(Default)]
struct Clock {
    counters: Arc<Counters>,
    max_running: usize,
    queued: HashMap<u64, Entry>,
    /// (priority, earlier first, id); ids no longer queued are skipped.
    order: BinaryHeap<(i32, Reverse<u64>, u64)>,
    running: HashMap<u64, Entry>,
    /// (due, tie-break, id); ids no longer running are skipped.
    timers: BinaryHeap<Reverse<(Instant, u64, u64)>>,
    /// Scratch list of the requests due in a round, kept to avoid an allocation per round.
    due: Vec<(Instant, u64)>,
    seq: u64,
}

impl Clock {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn finish(&self, entry: Entry, fin: FinalEvent) {
        let c = &self.counters;
        c.tokens
            .fetch_add(u64::from(fin.usage.completion_tokens), Ordering::Relaxed);
        let counter = match fin.status {
            Status::Ok => &c.completed,
            Status::Cancelled => &c.cancelled,
            _ => &c.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        c.live.fetch_sub(1, Ordering::AcqRel);
        entry.sink.finish(fin);
    }

    fn take(&mut self, id: u64) -> Option<Entry> {
        if let Some(entry) = self.queued.remove(&id) {
            return Some(entry);
        }
        let entry = self.running.remove(&id)?;
        self.counters.running.fetch_sub(1, Ordering::AcqRel);
        Some(entry)
    }

    /// Applies one message; false on shutdown.
    fn handle(&mut self, message: Message) -> bool {
        match message {
            Message::Submit {
                id,
                priority,
                entry,
            } => {
                if self.queued.contains_key(&id) || self.running.contains_key(&id) {
                    let fin = FinalEvent::failed(
                        Status::Internal,
                        "request id already live",
                        Usage::default(),
                    );
                    self.finish(*entry, fin);
                    return true;
                }
                let seq = self.next_seq();
                self.queued.insert(id, *entry);
                self.order.push((priority, Reverse(seq), id));
            }
            Message::Cancel(id) => {
                if let Some(entry) = self.take(id) {
                    let usage = entry.generation.usage();
                    self.finish(
                        entry,
                        FinalEvent::failed(Status::Cancelled, "cancelled", usage),
                    );
                }
            }
            Message::Shutdown => return false,
        }
        true
    }

    fn run(mut self, inbox: &Receiver<Message>) {
        'serve: loop {
            while let Ok(message) = inbox.try_recv() {
                if !self.handle(message) {
                    break 'serve;
                }
            }
            self.admit();
            let now = Instant::now();
            if !self.step_due(now) {
                let message = match self.timers.peek() {
                    Some(&Reverse((at, _, _))) => {
                        match inbox.recv_timeout(at.saturating_duration_since(now)) {
                            Ok(message) => message,
                            Err(RecvTimeoutError::Timeout) => continue,
                            Err(RecvTimeoutError::Disconnected) => break,
                        }
                    }
                    None => match inbox.recv() {
                        Ok(message) => message,
                        Err(_) => break,
                    },
                };
                if !self.handle(message) {
                    break;
                }
            }
        }
        // Shutdown: what is live, and what was sent after the last drain, ends cancelled.
        while let Ok(message) = inbox.try_recv() {
            if let Message::Submit {
                id,
                priority,
                entry,
            } = message
            {
                self.handle(Message::Submit {
                    id,
                    priority,
                    entry,
                });
            }
        }
        let ids: Vec<u64> = self
            .queued
            .keys()
            .chain(self.running.keys())
            .copied()
            .collect();
        for id in ids {
            if let Some(entry) = self.take(id) {
                let usage = entry.generation.usage();
                self.finish(
                    entry,
                    FinalEvent::failed(Status::Cancelled, "engine destroyed", usage),
                );
            }
        }
    }

    fn admit(&mut self) {
        while self.running.len() < self.max_running {
            let Some((_, _, id)) = self.order.pop() else {
                break;
            };
            let Some(mut entry) = self.queued.remove(&id) else {
                continue;
            };
            self.counters.running.fetch_add(1, Ordering::AcqRel);
            let due = Instant::now() + entry.generation.first_delay();
            let seq = self.next_seq();
            self.timers.push(Reverse((due, seq, id)));
            self.running.insert(id, entry);
        }
    }

    /// Steps every request whose next token is due; false when none was.
    fn step_due(&mut self, now: Instant) -> bool {
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        while let Some(&Reverse((at, _, id))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            due.push((at, id));
        }
        for &(at, id) in &due {
            let Some(entry) = self.running.get_mut(&id) else {
                continue;
            };
            match entry.generation.step(&mut entry.sink) {
                Step::Continue(delay) => {
                    let seq = self.next_seq();
                    self.timers.push(Reverse((at + delay, seq, id)));
                }
                Step::Done(fin) => {
                    if let Some(entry) = self.take(id) {
                        self.finish(entry, fin);
                    }
                }
            }
        }
        let any = !due.is_empty();
        self.due = due;
        any
    }
}
