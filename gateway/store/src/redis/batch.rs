//! Group commit for Redis scripts whose calls come from many requests at once (settlements,
//! budget charges): a caller waits for one script call, and the calls that arrive while that one
//! is on its way go together in the next. One request at a time waits only its own round trip;
//! under load one call does up to [`MAX_BATCH`] requests' work, so Redis and the gateway spend
//! their time on the work rather than on a call per request. Each request's part of a call is
//! applied as one step, as if it were alone, and gets its own answer.
//!
//! No task outlives its queue: the caller that finds a queue idle runs its own call at once (no
//! hand-off to another task: one request at a time pays nothing for the grouping), and when that
//! call ends, whatever arrived meanwhile is left to a drain, which runs calls until the queue is
//! empty. A queue holds at most [`MAX_QUEUED`] items (one per request
//! in flight); past it an item runs on a call of its own instead of waiting.
//!
//! A kind whose items come in pairs from one request (a take and a charge, asked for at once)
//! gathers ([`Batch::GATHER`]): the caller that finds the queue idle lets the request's other
//! futures run once before it sends, and takes what they queued into its own call. The call
//! then carries other callers' items, so it is finished even when its caller goes away.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use super::RedisStore;
use crate::StoreError;

/// Most items in one script call.
pub(crate) const MAX_BATCH: usize = 128;

/// Most items waiting for a call.
pub(crate) const MAX_QUEUED: usize = 16_384;

/// One kind of grouped call.
pub(crate) trait Batch: Send + Sync + Sized + 'static {
    /// What one request asks.
    type Item: Send + 'static;
    /// What it is answered.
    type Answer: Send + 'static;
    /// The queue's name in metrics.
    const NAME: &'static str;
    /// Whether a leading caller gathers what its request queues right after it.
    const GATHER: bool = false;
    /// Its queue in the store.
    fn queue(store: &RedisStore) -> &Queue<Self>;
    /// Runs `items` in one call; an answer per item, in order.
    fn run(
        store: &RedisStore,
        items: Vec<Self::Item>,
    ) -> impl Future<Output = Result<Vec<Self::Answer>, StoreError>> + Send;
}

type Reply<B> = oneshot::Sender<Result<<B as Batch>::Answer, StoreError>>;

/// Items waiting for the next call, and whether a drain is running.
pub(crate) struct Queue<B: Batch> {
    state: Mutex<Waiting<B>>,
}

struct Waiting<B: Batch> {
    items: Vec<(B::Item, Reply<B>)>,
    draining: bool,
    /// `turnpike_state_batch_queue{kind}`, taken from the recorder at first use.
    gauge: Option<metrics::Gauge>,
}

impl<B: Batch> Default for Queue<B> {
    fn default() -> Self {
        Self {
            state: Mutex::new(Waiting {
                items: Vec::new(),
                draining: false,
                gauge: None,
            }),
        }
    }
}

impl<B: Batch> std::fmt::Debug for Queue<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("name", &B::NAME).finish()
    }
}

/// What became of an item handed to the queue.
enum Queued<B: Batch> {
    /// The queue was idle: the caller runs it now, then hands over to a drain.
    Lead(B::Item),
    /// It waits for the running drain.
    Wait(oneshot::Receiver<Result<B::Answer, StoreError>>),
    /// The queue is full: the caller runs it alone.
    Full(B::Item),
}

impl<B: Batch> Queue<B> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting<B>> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn push(&self, item: B::Item) -> Queued<B> {
        let mut waiting = self.lock();
        if !waiting.draining {
            waiting.draining = true;
            return Queued::Lead(item);
        }
        if waiting.items.len() >= MAX_QUEUED {
            return Queued::Full(item);
        }
        let (tx, rx) = oneshot::channel();
        waiting.items.push((item, tx));
        waiting.show();
        Queued::Wait(rx)
    }

    /// The leading call ended (or was dropped): a drain takes what arrived meanwhile.
    fn hand_over(&self, store: &RedisStore) {
        let mut waiting = self.lock();
        if waiting.items.is_empty() {
            waiting.draining = false;
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(drain::<B>(store.clone()));
            }
            // Shutting down outside the runtime: the waiting callers hear there is no answer.
            Err(_) => {
                waiting.items.clear();
                waiting.draining = false;
            }
        }
    }

    /// Up to `most` waiting items, for a leading call (the queue stays draining).
    fn gather(&self, most: usize) -> Vec<(B::Item, Reply<B>)> {
        self.lock().take(most)
    }

    /// The next call's items; none (and the drain ends) when nothing waits.
    fn next_batch(&self) -> Vec<(B::Item, Reply<B>)> {
        let mut waiting = self.lock();
        let batch = waiting.take(MAX_BATCH);
        waiting.draining = !batch.is_empty();
        batch
    }
}

impl<B: Batch> Waiting<B> {
    /// The first `most` items (all, when fewer wait).
    fn take(&mut self, most: usize) -> Vec<(B::Item, Reply<B>)> {
        let taken: Vec<_> = self.items.drain(..self.items.len().min(most)).collect();
        self.show();
        taken
    }

    /// Sets the queue's gauge to its length.
    fn show(&mut self) {
        let waiting = self.items.len() as f64;
        self.gauge
            .get_or_insert_with(|| crate::gauges::batch_queue(B::NAME))
            .set(waiting);
    }
}

impl RedisStore {
    /// Runs `item` in the next grouped call of its kind and returns its answer.
    pub(super) async fn batched<B: Batch>(&self, item: B::Item) -> Result<B::Answer, StoreError> {
        let answer = match B::queue(self).push(item) {
            Queued::Lead(item) => {
                let _leading = Leading::<B> {
                    store: self,
                    batch: std::marker::PhantomData,
                };
                if B::GATHER {
                    return self.gathered::<B>(item).await;
                }
                return self.alone::<B>(item).await;
            }
            Queued::Wait(answer) => answer,
            Queued::Full(item) => return self.alone::<B>(item).await,
        };
        answer.await.unwrap_or_else(|_| Err(no_answer::<B>()))
    }

    async fn alone<B: Batch>(&self, item: B::Item) -> Result<B::Answer, StoreError> {
        let mut answers = B::run(self, vec![item]).await?;
        answers.pop().ok_or_else(no_answer::<B>)
    }

    /// Leads a call with `item` and what the same request queues right after it.
    async fn gathered<B: Batch>(&self, item: B::Item) -> Result<B::Answer, StoreError> {
        YieldOnce(false).await;
        let others = B::queue(self).gather(MAX_BATCH - 1);
        if others.is_empty() {
            return self.alone::<B>(item).await;
        }
        let (own, answer) = oneshot::channel();
        let (mut items, mut replies): (Vec<_>, Vec<_>) = others.into_iter().unzip();
        items.insert(0, item);
        replies.insert(0, own);
        let store = self.clone();
        Finish(Some(Box::pin(async move {
            answer_all::<B>(replies, B::run(&store, items).await);
        })))
        .await;
        answer.await.unwrap_or_else(|_| Err(no_answer::<B>()))
    }
}

/// Pending once, woken at once: the other futures of the caller's task (a `join!`) run before
/// it goes on. The task stays on its worker; nothing else is scheduled.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A call that answers other callers too: when its caller goes away before it ends, it runs to
/// the end on its own task.
struct Finish(Option<Pin<Box<dyn Future<Output = ()> + Send>>>);

impl Future for Finish {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(call) = self.0.as_mut() else {
            return Poll::Ready(());
        };
        std::task::ready!(call.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(())
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if let (Some(call), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(call);
        }
    }
}

/// Sends each caller its answer, or the call's error. A caller that stopped waiting has nothing
/// to hear; one left without an answer (a short reply) hears that its call gave none.
fn answer_all<B: Batch>(replies: Vec<Reply<B>>, answers: Result<Vec<B::Answer>, StoreError>) {
    match answers {
        Ok(answers) => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

fn no_answer<B: Batch>() -> StoreError {
    StoreError(format!("no answer from the {} call", B::NAME))
}

/// The leading call of a queue: hands over when it ends, however it ends.
struct Leading<'a, B: Batch> {
    store: &'a RedisStore,
    batch: std::marker::PhantomData<B>,
}

impl<B: Batch> Drop for Leading<'_, B> {
    fn drop(&mut self) {
        B::queue(self.store).hand_over(self.store);
    }
}

async fn drain<B: Batch>(store: RedisStore) {
    loop {
        let batch = B::queue(&store).next_batch();
        if batch.is_empty() {
            return;
        }
        let (items, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
        answer_all::<B>(replies, B::run(&store, items).await);
    }
}
