//! An OTLP/HTTP endpoint that accepts trace exports and counts their bytes, for
//! `bench/run-tracing.sh`: as cheap as an endpoint can be, so the benchmark measures what
//! tracing costs the gateway rather than what the receiver costs the shared machine. It does not
//! decode the exports (the tests do that); `GET` answers the bytes received so far.
//!
//!     otlp-sink PORT

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

fn serve(stream: TcpStream, received: &AtomicU64) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        received.fetch_add(length as u64, Ordering::Relaxed);
        let answer = if request_line.starts_with("GET") {
            received.load(Ordering::Relaxed).to_string()
        } else {
            String::new()
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        writer.write_all(response.as_bytes())?;
    }
}

fn main() -> std::io::Result<()> {
    let port = std::env::args().nth(1).unwrap_or_else(|| "4318".into());
    let listener = TcpListener::bind(format!("127.0.0.1:{port}"))?;
    let received = Arc::new(AtomicU64::new(0));
    for stream in listener.incoming().flatten() {
        let received = Arc::clone(&received);
        std::thread::spawn(move || {
            let _ = serve(stream, &received);
        });
    }
    Ok(())
}
