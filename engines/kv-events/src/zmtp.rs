//! The ZeroMQ wire (ZMTP 3.0, RFC 23) as far as a PUB socket that binds and a SUB socket that
//! connects need it over TCP: the greeting with the NULL mechanism, the READY handshake, frames
//! (short and long, MORE), subscriptions (a message whose first byte is 1, or ZMTP 3.1's
//! `SUBSCRIBE` command) and PING answered with PONG. Blocking std sockets; callers own threads.

use std::io::{self, Read, Write};
use std::net::TcpStream;

const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;

/// The largest frame read (events batches are far smaller).
pub const MAX_FRAME: usize = 64 << 20;

/// What one read from a peer gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    /// A whole message (its frames).
    Message(Vec<Vec<u8>>),
    /// A subscription (`true`) or its cancellation for a topic prefix.
    Subscription(bool, Vec<u8>),
}

/// Sends the greeting and READY as `socket_type` (`PUB`, `SUB`), then reads the peer's.
pub fn handshake(stream: &mut TcpStream, socket_type: &str) -> io::Result<()> {
    let mut greeting = [0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3; // version 3.0
    greeting[12..16].copy_from_slice(b"NULL");
    stream.write_all(&greeting)?;
    let mut theirs = [0u8; 64];
    stream.read_exact(&mut theirs)?;
    if theirs[0] != 0xff || theirs[9] & 1 != 1 || theirs[10] < 3 || &theirs[12..16] != b"NULL" {
        return Err(bad("the peer is not a ZMTP 3 peer with the NULL mechanism"));
    }
    let mut ready = Vec::with_capacity(32);
    ready.push(5);
    ready.extend_from_slice(b"READY");
    ready.push(11);
    ready.extend_from_slice(b"Socket-Type");
    ready.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    ready.extend_from_slice(socket_type.as_bytes());
    write_frame(stream, FLAG_COMMAND, &ready)?;
    let (flags, body) = read_frame(stream)?;
    if flags & FLAG_COMMAND == 0 || !body.starts_with(b"\x05READY") {
        return Err(bad("the peer did not send READY"));
    }
    Ok(())
}

/// Writes one message of `frames`.
pub fn write_message(stream: &mut impl Write, frames: &[&[u8]]) -> io::Result<()> {
    let mut out = Vec::with_capacity(frames.iter().map(|f| f.len() + 9).sum());
    for (i, frame) in frames.iter().enumerate() {
        let more = if i + 1 < frames.len() { FLAG_MORE } else { 0 };
        frame_into(&mut out, more, frame);
    }
    stream.write_all(&out)
}

/// Subscribes to `prefix` (as a SUB socket, ZMTP 3.0's way).
pub fn subscribe(stream: &mut TcpStream, prefix: &[u8]) -> io::Result<()> {
    let mut body = Vec::with_capacity(prefix.len() + 1);
    body.push(1);
    body.extend_from_slice(prefix);
    write_frame(stream, 0, &body)
}

/// Reads until a message or a subscription arrives (PINGs are answered on the way).
pub fn read(stream: &mut TcpStream, subscriptions: bool) -> io::Result<Incoming> {
    let mut frames = Vec::new();
    loop {
        let (flags, body) = read_frame(stream)?;
        if flags & FLAG_COMMAND != 0 {
            if let Some(rest) = command(&body, b"PING") {
                // PONG carries the ping's context (after its 2-byte TTL).
                let mut pong = vec![4];
                pong.extend_from_slice(b"PONG");
                pong.extend_from_slice(rest.get(2..).unwrap_or_default());
                write_frame(stream, FLAG_COMMAND, &pong)?;
            } else if let Some(topic) = command(&body, b"SUBSCRIBE") {
                return Ok(Incoming::Subscription(true, topic.to_vec()));
            } else if let Some(topic) = command(&body, b"CANCEL") {
                return Ok(Incoming::Subscription(false, topic.to_vec()));
            }
            continue;
        }
        if subscriptions && frames.is_empty() && flags & FLAG_MORE == 0 {
            match body.first() {
                Some(1) => return Ok(Incoming::Subscription(true, body[1..].to_vec())),
                Some(0) => return Ok(Incoming::Subscription(false, body[1..].to_vec())),
                _ => {}
            }
        }
        frames.push(body);
        if flags & FLAG_MORE == 0 {
            return Ok(Incoming::Message(frames));
        }
    }
}

/// The body after a command's name, if `body` is that command.
fn command<'a>(body: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let (&len, rest) = body.split_first()?;
    let len = usize::from(len);
    (len == name.len() && rest.get(..len)? == name).then(|| &rest[len..])
}

fn frame_into(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    if body.len() > 255 {
        out.push(flags | FLAG_LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
}

fn write_frame(stream: &mut impl Write, flags: u8, body: &[u8]) -> io::Result<()> {
    let mut out = Vec::with_capacity(body.len() + 9);
    frame_into(&mut out, flags, body);
    stream.write_all(&out)
}

fn read_frame(stream: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let mut flags = [0u8; 1];
    stream.read_exact(&mut flags)?;
    let len = if flags[0] & FLAG_LONG != 0 {
        let mut n = [0u8; 8];
        stream.read_exact(&mut n)?;
        usize::try_from(u64::from_be_bytes(n)).unwrap_or(usize::MAX)
    } else {
        let mut n = [0u8; 1];
        stream.read_exact(&mut n)?;
        usize::from(n[0])
    };
    if len > MAX_FRAME {
        return Err(bad("a frame over the size limit"));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok((flags[0], body))
}

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_commands_read_back() {
        let mut wire = Vec::new();
        write_message(&mut wire, &[b"kv", &[0u8; 8], &[7u8; 300]]).ok();
        let mut r = wire.as_slice();
        let (f1, b1) = read_frame(&mut r).unwrap_or_default();
        let (_, b2) = read_frame(&mut r).unwrap_or_default();
        let (f3, b3) = read_frame(&mut r).unwrap_or_default();
        assert_eq!((f1, b1.as_slice()), (FLAG_MORE, b"kv".as_slice()));
        assert_eq!(b2, [0u8; 8]);
        assert_eq!((f3, b3.len()), (FLAG_LONG, 300));
        assert_eq!(
            command(b"\x09SUBSCRIBEkv", b"SUBSCRIBE"),
            Some(b"kv".as_slice())
        );
        assert_eq!(command(b"\x04PING", b"SUBSCRIBE"), None);
    }
}
