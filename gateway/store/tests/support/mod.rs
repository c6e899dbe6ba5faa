//! A real `redis-server` for the store's tests, on a free loopback port, stopped when dropped,
//! and the usage record they settle.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use turnpike_store::{Record, UsageEntry};

/// A running `redis-server`, killed when dropped.
pub(crate) struct Redis(Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh redis-server without persistence, and its URL.
pub(crate) fn redis_server() -> (Redis, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is needed (tests/setup.sh installs it)");
    let server = Redis(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (server, format!("redis://127.0.0.1:{port}/0"))
}

/// Request `i`'s usage record: one request and `i` input tokens on day 20261130, kept for export.
pub(crate) fn usage_record(i: u64) -> Record {
    Record {
        entry: UsageEntry {
            record: format!("{{\"n\":{i}}}").into_bytes(),
            day: "20261130".into(),
            sums: vec![
                ("t\t-\tm\trequests".into(), 1),
                ("t\t-\tm\tinput_tokens".into(), i),
            ],
        },
        keep_log: true,
    }
}
