//! The Redis store's grouped calls against a real `redis-server` (started here on a free port):
//! charges and settlements from many concurrent requests share script calls, yet each request
//! is charged all or none and answered for itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use support::{Redis, redis_server, usage_record};

use turnpike_store::redis::RedisStore;
use turnpike_store::{GiveBack, Refund, Settlement, Store, Tally, Window};

/// A fresh redis-server and a store on it.
fn redis() -> (Redis, RedisStore) {
    let (server, url) = redis_server();
    let store = RedisStore::new(&url, Duration::from_secs(5)).expect("a store");
    (server, store)
}

/// A plain client connection to the server at `url`, to look at what the store wrote; tried
/// again for a few seconds while a server that just started is not answering yet.
async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).expect("a client");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match client.get_multiplexed_async_connection().await {
            Ok(connection) => return connection,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no connection to {url}: {e}"),
        }
    }
}

fn tally(key: &str, limit: u64) -> Tally {
    Tally {
        key: key.into(),
        limit: Some(limit),
        lapses_at: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_charges_are_each_all_or_none() {
    let (_server, store) = redis();
    // Two counters: the tighter one (500) decides; every charge is answered for itself.
    let tallies = vec![tally("tp:{t}:sp:d", 500), tally("tp:{t}:sp:t", 10_000)];
    let charges = (0..200).map(|_| store.charge(&tallies, 10));
    let answers = futures_util::future::join_all(charges).await;
    let allowed = answers
        .iter()
        .filter(|a| a.as_ref().expect("an answer").allowed)
        .count();
    assert_eq!(allowed, 50);
    for answer in answers.iter().flatten().filter(|a| a.allowed) {
        assert_eq!(answer.totals.len(), 2);
        assert!(answer.totals[0] <= 500);
        assert_eq!(answer.totals[0], answer.totals[1]);
    }
    let refused = answers
        .iter()
        .flatten()
        .find(|a| !a.allowed)
        .expect("a refusal");
    assert_eq!(refused.refused_by(&tallies, 10), Some(0));
    // Nothing was charged past the limit: a charge of the room left still fits.
    assert!(!store.charge(&tallies, 1).await.expect("an answer").allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_charged_by_many_requests_at_once_counts_each_and_lapses_from_its_first() {
    let (_server, url) = redis_server();
    let store = RedisStore::new(&url, Duration::from_secs(5)).expect("a store");
    let mut redis = connection(&url).await;
    let in_an_hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock")
        .as_secs()
        + 3600;
    let day = Tally {
        lapses_at: Some(in_an_hour),
        ..tally("tp:{t}:sp:d", 1000)
    };
    let total = Tally {
        limit: None,
        ..tally("tp:{t}:sp:t", 0)
    };
    let tallies = vec![day, total];
    let charges = (0..200).map(|_| store.charge(&tallies, 7));
    let answers = futures_util::future::join_all(charges).await;
    let allowed = answers.iter().flatten().filter(|a| a.allowed).count();
    assert_eq!(allowed, 1000 / 7);
    let counts: Vec<u64> = redis::cmd("MGET")
        .arg("tp:{t}:sp:d")
        .arg("tp:{t}:sp:t")
        .query_async(&mut redis)
        .await
        .expect("the counts");
    assert_eq!(counts, vec![994, 994]);
    let lapse = |key: &'static str| redis::cmd("PTTL").arg(key).to_owned();
    let day_ttl: i64 = lapse("tp:{t}:sp:d").query_async(&mut redis).await.unwrap();
    assert!(day_ttl > 3_500_000 && day_ttl <= 3_600_000, "{day_ttl}");
    let total_ttl: i64 = lapse("tp:{t}:sp:t").query_async(&mut redis).await.unwrap();
    assert_eq!(total_ttl, -1);
    // A counter that already holds something keeps its time to live.
    let _: () = redis::cmd("PEXPIRE")
        .arg("tp:{t}:sp:d")
        .arg(5000)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(store.charge(&tallies, 6).await.unwrap().allowed);
    let day_ttl: i64 = lapse("tp:{t}:sp:d").query_async(&mut redis).await.unwrap();
    assert!(day_ttl > 0 && day_ttl <= 5000, "{day_ttl}");
    // One charge of nothing on a fresh counter still starts its period.
    let fresh = vec![Tally {
        lapses_at: Some(in_an_hour),
        ..tally("tp:{u}:sp:d", 10)
    }];
    assert_eq!(store.charge(&fresh, 0).await.unwrap().totals, vec![0]);
    let fresh_ttl: i64 = lapse("tp:{u}:sp:d").query_async(&mut redis).await.unwrap();
    assert!(fresh_ttl > 3_500_000, "{fresh_ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_settlements_each_give_back_refund_and_record_once() {
    let (_server, store) = redis();
    let windows = vec![Window {
        capacity: 100_000,
        period: Duration::from_secs(3600),
    }];
    let tallies = vec![tally("tp:{t}:sp:m", 1_000_000)];
    let n = 300;
    assert!(
        store
            .take("tp:{t}:tk", &windows, n * 100)
            .await
            .expect("taken")
            .allowed
    );
    assert!(
        store
            .charge(&tallies, n * 40)
            .await
            .expect("charged")
            .allowed
    );
    let settlements = (0..n).map(|i| Settlement {
        give_back: Some(GiveBack {
            key: "tp:{t}:tk".into(),
            windows: windows.clone(),
            amount: 100,
        }),
        refund: Some(Refund {
            tallies: tallies.clone().into(),
            amount: 30,
        }),
        record: Some(usage_record(i)),
    });
    let settled = futures_util::future::join_all(settlements.map(|s| store.settle(s))).await;
    assert!(settled.iter().all(Result::is_ok));
    // The bucket is full again, 10 of each charge of 40 stay, and each record was written once.
    assert!(
        store
            .take("tp:{t}:tk", &windows, 100_000)
            .await
            .expect("taken")
            .allowed
    );
    let left = store.charge(&tallies, 0).await.expect("an answer");
    assert_eq!(left.totals, vec![n * 10]);
    let mut sums = store.usage_sums("20261130").await.expect("sums");
    sums.sort();
    let expected_input = (0..n).sum::<u64>();
    assert_eq!(
        sums,
        vec![
            ("t\t-\tm\tinput_tokens".to_string(), expected_input),
            ("t\t-\tm\trequests".to_string(), n),
        ]
    );
    let mut exported = 0;
    loop {
        let drained = store.usage_drain("test", 100).await.expect("drained");
        if drained.is_empty() {
            break;
        }
        exported += drained.len();
        let ids: Vec<String> = drained.into_iter().map(|(id, _)| id).collect();
        store.usage_ack(&ids).await.expect("acknowledged");
    }
    assert_eq!(exported, n as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_takes_are_each_all_or_none() {
    let (_server, store) = redis();
    let hour = Duration::from_secs(3600);
    // Two windows: the smaller (500 an hour) decides, and the larger loses only what it allowed.
    let windows = vec![
        Window {
            capacity: 500,
            period: hour,
        },
        Window {
            capacity: 5000,
            period: hour,
        },
    ];
    let takes = (0..200).map(|_| store.take("tp:{t}:tk", &windows, 10));
    let answers = futures_util::future::join_all(takes).await;
    let allowed: Vec<_> = answers.iter().flatten().filter(|t| t.allowed).collect();
    assert_eq!(allowed.len(), 50);
    let refused = answers.iter().flatten().find(|t| !t.allowed).unwrap();
    assert!(!refused.never);
    assert!(refused.retry_after > Duration::ZERO);
    assert_eq!(refused.levels.len(), 2);
    assert!(refused.levels[0].remaining < 10);
    assert!(refused.levels[1].remaining >= 4500);
    // More than a window holds is never allowed.
    let never = store.take("tp:{t}:other", &windows, 501).await.unwrap();
    assert!(!never.allowed && never.never);
}

/// Script calls Redis has run since its counters were reset.
async fn script_calls(redis: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await
        .expect("the command stats");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_s_take_and_charge_go_in_one_call_and_each_is_answered_for_itself() {
    let (_server, url) = redis_server();
    let store = RedisStore::new(&url, Duration::from_secs(5)).expect("a store");
    let mut redis = connection(&url).await;
    let windows = vec![Window {
        capacity: 1000,
        period: Duration::from_secs(3600),
    }];
    let tallies = vec![tally("tp:{t}:sp:d", 100)];
    // The script is loaded by a first call.
    assert!(store.take("tp:{w}:tk", &windows, 1).await.unwrap().allowed);
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut redis)
        .await
        .unwrap();
    let (take, charge) = tokio::join!(
        store.take("tp:{t}:tk", &windows, 30),
        store.charge(&tallies, 7)
    );
    let (take, charge) = (take.unwrap(), charge.unwrap());
    assert!(take.allowed && charge.allowed);
    assert_eq!(take.levels.len(), 1);
    assert_eq!(charge.totals, vec![7]);
    assert_eq!(script_calls(&mut redis).await, 1);
    // Many requests at once, each a take and a charge: every answer is its own. The bucket
    // holds 1000 - 30 = 970 (32 takes of 30), the counter 100 - 7 = 93 (13 charges of 7).
    let pairs = (0..64).map(|_| async {
        tokio::join!(
            store.take("tp:{t}:tk", &windows, 30),
            store.charge(&tallies, 7)
        )
    });
    let answers = futures_util::future::join_all(pairs).await;
    let takes = answers.iter().filter(|(t, _)| t.as_ref().unwrap().allowed);
    let charges = answers.iter().filter(|(_, c)| c.as_ref().unwrap().allowed);
    assert_eq!(takes.count(), 32);
    assert_eq!(charges.count(), 13);
    let count: u64 = redis::cmd("GET")
        .arg("tp:{t}:sp:d")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(count, 7 + 13 * 7);
    assert!(script_calls(&mut redis).await < 1 + 64 * 2);
}
