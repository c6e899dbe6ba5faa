//! The usage journal against a real `redis-server` (started here on a free port): requests'
//! ends are settled at once into the local file, shipped in order, and applied exactly once
//! (records counted, refunds given back) when calls time out and are sent again, and when the
//! process dies with settlements unshipped and a batch on its way: a later process on the same
//! file ships the rest.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::{redis_server, usage_record};

use turnpike_store::redis::RedisStore;
use turnpike_store::{Refund, Settlement, Store, Tally};

/// The spend tally every settlement refunds 1 to.
fn tally() -> Vec<Tally> {
    vec![Tally {
        key: "tp:{t}:sp:t".into(),
        limit: None,
        lapses_at: None,
    }]
}

fn settlement(i: u64) -> Settlement {
    Settlement {
        refund: Some(Refund {
            tallies: tally().into(),
            amount: 1,
        }),
        record: Some(usage_record(i)),
        ..Settlement::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A process's life on the journal at `path`: settles `records`, then waits `flush` for the
/// shipper; whether everything shipped. The runtime (and with it the shipper) ends abruptly.
fn life(url: &str, path: &Path, records: std::ops::Range<u64>, flush: Duration) -> bool {
    life_with(url, path, records, flush, Duration::from_secs(5))
}

/// [`life`] with the store's call timeout.
fn life_with(
    url: &str,
    path: &Path,
    records: std::ops::Range<u64>,
    flush: Duration,
    timeout: Duration,
) -> bool {
    let rt = runtime();
    let shipped = rt.block_on(async {
        let store = RedisStore::new(url, timeout)
            .unwrap()
            .with_journal(path, 1 << 20)
            .unwrap();
        let burst = records.start + 20;
        for i in records {
            // Two bursts: a batch of the first is on its way when the second comes, so a batch
            // sent again takes in more than the first held.
            if i == burst {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let started = Instant::now();
            store.settle(settlement(i)).await.expect("settled");
            assert!(
                started.elapsed() < Duration::from_millis(200),
                "a journaled settle waits"
            );
        }
        store.flush(flush).await.expect("flush")
    });
    rt.shutdown_background();
    shipped
}

/// The requests and input tokens summed, and what is left of the spend tally's 1000.
fn requests_input_and_held(url: &str) -> (u64, u64, u64) {
    let rt = runtime();
    rt.block_on(async {
        let store = RedisStore::new(url, Duration::from_secs(5)).unwrap();
        let sums = store.usage_sums("20261130").await.expect("sums");
        let get = |name: &str| sums.iter().find(|s| s.0 == name).map_or(0, |s| s.1);
        let held = store.charge(&tally(), 0).await.expect("a charge").totals[0];
        (get("t\t-\tm\trequests"), get("t\t-\tm\tinput_tokens"), held)
    })
}

/// What the sums and the tally must say after the settlements `0..n`, each once.
fn once(n: u64) -> (u64, u64, u64) {
    (n, (0..n).sum(), 1000 - n)
}

#[test]
fn journaled_records_reach_redis_once_across_a_crash() {
    let (_server, url) = redis_server();
    let dir = std::env::temp_dir().join(format!("tp-redis-journal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("usage.journal");
    let _ = std::fs::remove_file(&path);
    runtime().block_on(async {
        let store = RedisStore::new(&url, Duration::from_secs(5)).unwrap();
        assert!(store.charge(&tally(), 1000).await.unwrap().allowed);
    });

    // Redis answers: everything ships.
    assert!(life(&url, &path, 0..100, Duration::from_secs(5)));
    assert_eq!(requests_input_and_held(&url), once(100));

    // Redis holds writes for 1.5 s; calls time out after 0.3 s, so the shipper sends the batch
    // again and again, taking in the second burst, and Redis runs every copy once the pause
    // ends: the first copy lands, the longer ones find the mark inside them and the shipper
    // sends only what lies past it. Each counts once.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut admin = client.get_connection().unwrap();
    let pause = |admin: &mut redis::Connection| {
        redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(1500)
            .arg("WRITE")
            .query::<()>(admin)
            .unwrap();
    };
    pause(&mut admin);
    let short = Duration::from_millis(300);
    assert!(life_with(
        &url,
        &path,
        100..150,
        Duration::from_secs(6),
        short
    ));
    assert_eq!(requests_input_and_held(&url), once(150));

    // Paused again, the process dies with 50 records in the journal and a batch on its way.
    pause(&mut admin);
    assert!(!life(&url, &path, 150..200, Duration::from_millis(300)));
    std::thread::sleep(Duration::from_millis(1600));

    // The next process on the same journal ships what Redis lacks, and nothing twice.
    assert!(life(&url, &path, 200..210, Duration::from_secs(5)));
    assert_eq!(requests_input_and_held(&url), once(210));
    assert!(life(&url, &path, 0..0, Duration::from_secs(5)));
    assert_eq!(requests_input_and_held(&url), once(210));
    let _ = std::fs::remove_dir_all(&dir);
}
