//! A ZeroMQ PUB socket for event batches, as vLLM's publisher runs one: it binds, each
//! subscriber connects and subscribes to topic prefixes, and every batch goes out as three
//! frames (topic, sequence number as 8 bytes big-endian, msgpack payload).
//!
//! Bounded everywhere: [`Publisher::publish`] never blocks the engine; batches wait in a
//! queue of `queue` batches (beyond it they are dropped and counted), and each subscriber has
//! a queue of its own of the same size (a slow subscriber loses batches, as a ZeroMQ PUB
//! socket at its high-water mark does, and the sequence numbers show the gap).

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::event::{Event, EventBatch};
use crate::zmtp::{self, Incoming};

/// Counters a publisher keeps.
#[derive(Debug, Default)]
pub struct PublisherStats {
    /// Batches sent (to every subscriber that wanted them).
    pub published: AtomicU64,
    /// Batches dropped: the queue was full, or a subscriber's was.
    pub dropped: AtomicU64,
    /// Subscribers connected now.
    pub subscribers: AtomicU64,
}

/// One connected subscriber.
struct Subscriber {
    prefixes: Arc<Mutex<Vec<Vec<u8>>>>,
    outbox: SyncSender<Arc<Vec<u8>>>,
    /// Set when its connection closed.
    closed: Arc<AtomicBool>,
}

/// A bound publisher.
#[derive(Debug)]
pub struct Publisher {
    queue: SyncSender<Vec<Event>>,
    /// The address it listens on.
    pub local_addr: std::net::SocketAddr,
    /// Its counters.
    pub stats: Arc<PublisherStats>,
}

/// How long a connecting subscriber may take to greet.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

impl Publisher {
    /// Binds `endpoint` (`tcp://host:port`; `*` for every interface) and publishes on `topic`
    /// with at most `queue` batches waiting.
    pub fn bind(endpoint: &str, topic: &str, queue: usize) -> std::io::Result<Self> {
        let address = endpoint
            .strip_prefix("tcp://")
            .ok_or_else(|| std::io::Error::other(format!("`{endpoint}` is not tcp://host:port")))?
            .replacen('*', "0.0.0.0", 1);
        let listener = TcpListener::bind(&address)?;
        let local_addr = listener.local_addr()?;
        let stats = Arc::new(PublisherStats::default());
        let subscribers: Arc<Mutex<Vec<Subscriber>>> = Arc::default();
        let (tx, rx) = sync_channel::<Vec<Event>>(queue.max(1));
        {
            let (subscribers, stats) = (Arc::clone(&subscribers), Arc::clone(&stats));
            std::thread::Builder::new()
                .name("kv-events-accept".into())
                .spawn(move || accept(&listener, &subscribers, &stats, queue.max(1)))?;
        }
        {
            let topic = topic.as_bytes().to_vec();
            let stats = Arc::clone(&stats);
            std::thread::Builder::new()
                .name("kv-events-publish".into())
                .spawn(move || fan_out(&rx, &topic, &subscribers, &stats))?;
        }
        Ok(Self {
            queue: tx,
            local_addr,
            stats,
        })
    }

    /// Queues `events` as one batch; never blocks (a full queue drops it, counted).
    pub fn publish(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.queue.try_send(events)
        {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn accept(
    listener: &TcpListener,
    subscribers: &Arc<Mutex<Vec<Subscriber>>>,
    stats: &Arc<PublisherStats>,
    queue: usize,
) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
        if zmtp::handshake(&mut stream, "PUB").is_err() {
            continue;
        }
        let _ = stream.set_read_timeout(None);
        let Ok(mut reader) = stream.try_clone() else {
            continue;
        };
        let prefixes: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let (outbox, inbox) = sync_channel::<Arc<Vec<u8>>>(queue);
        let closed = Arc::new(AtomicBool::new(false));
        lock(subscribers).push(Subscriber {
            prefixes: Arc::clone(&prefixes),
            outbox,
            closed: Arc::clone(&closed),
        });
        stats.subscribers.fetch_add(1, Ordering::Relaxed);
        let stats = Arc::clone(stats);
        // Subscriptions come in on one thread, batches go out on another; the writer ends
        // when the reader sees the connection close (its outbox is dropped with it).
        let _ = std::thread::Builder::new()
            .name("kv-events-subscriber".into())
            .spawn(move || {
                // The writer ends at its first failed write or when the next batch finds
                // this subscriber closed and drops its outbox.
                let _writer = std::thread::spawn(move || write_out(stream, &inbox));
                while let Ok(incoming) = zmtp::read(&mut reader, true) {
                    if let Incoming::Subscription(on, prefix) = incoming {
                        let mut p = lock(&prefixes);
                        if on {
                            p.push(prefix);
                        } else if let Some(i) = p.iter().position(|x| *x == prefix) {
                            p.remove(i);
                        }
                    }
                }
                closed.store(true, Ordering::Relaxed);
                let _ = reader.shutdown(std::net::Shutdown::Both);
                stats.subscribers.fetch_sub(1, Ordering::Relaxed);
            });
    }
}

fn write_out(mut stream: TcpStream, inbox: &Receiver<Arc<Vec<u8>>>) {
    use std::io::Write;
    while let Ok(message) = inbox.recv() {
        if stream.write_all(&message).is_err() {
            return;
        }
    }
}

fn fan_out(
    rx: &Receiver<Vec<Event>>,
    topic: &[u8],
    subscribers: &Mutex<Vec<Subscriber>>,
    stats: &PublisherStats,
) {
    let mut seq: u64 = 0;
    while let Ok(events) = rx.recv() {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let payload = EventBatch {
            ts,
            events,
            data_parallel_rank: Some(0),
        }
        .encode();
        let mut message = Vec::with_capacity(payload.len() + topic.len() + 32);
        let seq_bytes = seq.to_be_bytes();
        let _ = zmtp::write_message(&mut message, &[topic, &seq_bytes, &payload]);
        let message = Arc::new(message);
        seq += 1;
        let mut subs = lock(subscribers);
        subs.retain(|s| {
            if s.closed.load(Ordering::Relaxed) {
                // Dropping its outbox ends its writer.
                return false;
            }
            if !lock(&s.prefixes).iter().any(|p| topic.starts_with(p)) {
                return true;
            }
            match s.outbox.try_send(Arc::clone(&message)) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    stats.dropped.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(TrySendError::Disconnected(_)) => false,
            }
        });
        stats.published.fetch_add(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_subscriber_receives_batches_in_order_on_its_topic() {
        let publisher = Publisher::bind("tcp://127.0.0.1:0", "kv@node@m", 16).unwrap();
        let mut sub = TcpStream::connect(publisher.local_addr).unwrap();
        zmtp::handshake(&mut sub, "SUB").unwrap();
        zmtp::subscribe(&mut sub, b"kv@").unwrap();
        while publisher.stats.subscribers.load(Ordering::Relaxed) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // The subscription may still be in flight: publish until one arrives.
        sub.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let first = loop {
            publisher.publish(vec![Event::AllBlocksCleared]);
            if let Ok(Incoming::Message(frames)) = zmtp::read(&mut sub, false) {
                break frames;
            }
        };
        assert_eq!(first[0], b"kv@node@m");
        let seq = u64::from_be_bytes(first[1].as_slice().try_into().unwrap());
        publisher.publish(vec![Event::BlockRemoved {
            block_hashes: vec![9],
        }]);
        sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let next = loop {
            let Incoming::Message(frames) = zmtp::read(&mut sub, false).unwrap() else {
                continue;
            };
            let batch = EventBatch::decode(&frames[2]).unwrap();
            if batch.events[0] != Event::AllBlocksCleared {
                break (frames, batch);
            }
        };
        assert!(u64::from_be_bytes(next.0[1].as_slice().try_into().unwrap()) > seq);
        assert_eq!(
            next.1.events,
            [Event::BlockRemoved {
                block_hashes: vec![9]
            }]
        );
    }
}
