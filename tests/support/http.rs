//! A minimal HTTP/1.1 client for loopback tests (one request per connection).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A response: status code and body.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Body as text.
    pub body: String,
}

impl Response {
    /// The body parsed as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }
}

/// Sends `method path` with no body and reads the whole response.
pub fn request(addr: SocketAddr, method: &str, path: &str) -> Response {
    send(addr, method, path, "")
}

/// POSTs a JSON body and reads the whole response.
pub fn request_json(addr: SocketAddr, path: &str, body: &str) -> Response {
    send(addr, "POST", path, body)
}

fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> Response {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    Response {
        status,
        body: body.to_string(),
    }
}
