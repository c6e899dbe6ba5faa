//! A journal frame: sequence number, body length, a checksum (FNV-1a over the sequence number
//! and the body), then the body, a request's whole [`Settlement`]: its unused tokens, its unused
//! spend and its usage record, each optional. Numbers are little-endian; strings and byte
//! fields carry a 4-byte length.

use std::sync::Arc;
use std::time::Duration;

use crate::{GiveBack, Record, Refund, Settlement, Tally, UsageEntry, Window};

/// Sequence number, body length, checksum.
pub(super) const FRAME_HEAD: usize = 8 + 4 + 4;

const GIVE_BACK: u8 = 1;
const REFUND: u8 = 2;
const RECORD: u8 = 4;
const KEEP_LOG: u8 = 8;

pub(super) fn read4(bytes: &[u8], at: usize) -> [u8; 4] {
    let mut out = [0; 4];
    out.copy_from_slice(&bytes[at..at + 4]);
    out
}

pub(super) fn read8(bytes: &[u8], at: usize) -> [u8; 8] {
    let mut out = [0; 8];
    out.copy_from_slice(&bytes[at..at + 8]);
    out
}

fn checksum(seq: u64, body: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for &b in seq.to_le_bytes().iter().chain(body) {
        hash = (hash ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    hash
}

/// A frame of `settlement` with its head left blank, for [`seal`] to fill in.
pub(super) fn encode(settlement: &Settlement) -> Vec<u8> {
    let record_len = settlement
        .record
        .as_ref()
        .map_or(0, |r| r.entry.record.len());
    let mut out = Vec::with_capacity(FRAME_HEAD + 256 + record_len);
    out.extend_from_slice(&[0; FRAME_HEAD]);
    let mut flags = 0;
    if settlement.give_back.is_some() {
        flags |= GIVE_BACK;
    }
    if settlement.refund.is_some() {
        flags |= REFUND;
    }
    if let Some(r) = &settlement.record {
        flags |= RECORD | if r.keep_log { KEEP_LOG } else { 0 };
    }
    out.push(flags);
    if let Some(g) = &settlement.give_back {
        put_bytes(&mut out, g.key.as_bytes());
        put_u32(&mut out, g.windows.len());
        for w in &g.windows {
            out.extend_from_slice(&w.capacity.to_le_bytes());
            let ms = u64::try_from(w.period.as_millis()).unwrap_or(u64::MAX);
            out.extend_from_slice(&ms.to_le_bytes());
        }
        out.extend_from_slice(&g.amount.to_le_bytes());
    }
    if let Some(r) = &settlement.refund {
        put_u32(&mut out, r.tallies.len());
        for t in r.tallies.iter() {
            put_bytes(&mut out, t.key.as_bytes());
        }
        out.extend_from_slice(&r.amount.to_le_bytes());
    }
    if let Some(r) = &settlement.record {
        let entry = &r.entry;
        put_bytes(&mut out, entry.day.as_bytes());
        put_bytes(&mut out, &entry.record);
        put_u32(&mut out, entry.sums.len());
        for (name, amount) in &entry.sums {
            put_bytes(&mut out, name.as_bytes());
            out.extend_from_slice(&amount.to_le_bytes());
        }
    }
    out
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// Fills in the head of a frame [`encode`] made.
pub(super) fn seal(out: &mut [u8], seq: u64) {
    let body_len = u32::try_from(out.len() - FRAME_HEAD).unwrap_or(u32::MAX);
    let check = checksum(seq, &out[FRAME_HEAD..]);
    out[..8].copy_from_slice(&seq.to_le_bytes());
    out[8..12].copy_from_slice(&body_len.to_le_bytes());
    out[12..16].copy_from_slice(&check.to_le_bytes());
}

/// The frame at `at`: its sequence number, settlement and end; none when it is incomplete or
/// fails its checksum.
pub(super) fn decode(bytes: &[u8], at: usize) -> Option<(u64, Settlement, usize)> {
    let head = bytes.get(at..at + FRAME_HEAD)?;
    let seq = u64::from_le_bytes(read8(head, 0));
    let len = u32::from_le_bytes(read4(head, 8)) as usize;
    let body = bytes.get(at + FRAME_HEAD..at + FRAME_HEAD + len)?;
    if checksum(seq, body) != u32::from_le_bytes(read4(head, 12)) {
        return None;
    }
    let mut c = Cursor { bytes: body, at: 0 };
    let flags = c.take(1)?[0];
    let mut settlement = Settlement::default();
    if flags & GIVE_BACK != 0 {
        let key = c.text()?;
        let windows = (0..c.u32()?)
            .map(|_| {
                Some(Window {
                    capacity: c.u64()?,
                    period: Duration::from_millis(c.u64()?),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let amount = c.u64()?;
        settlement.give_back = Some(GiveBack {
            key,
            windows,
            amount,
        });
    }
    if flags & REFUND != 0 {
        let tallies = (0..c.u32()?)
            .map(|_| {
                Some(Tally {
                    key: c.text()?,
                    limit: None,
                    lapses_at: None,
                })
            })
            .collect::<Option<Arc<[_]>>>()?;
        let amount = c.u64()?;
        settlement.refund = Some(Refund { tallies, amount });
    }
    if flags & RECORD != 0 {
        let day = c.text()?;
        let record = c.field()?.to_vec();
        let sums = (0..c.u32()?)
            .map(|_| Some((c.text()?, c.u64()?)))
            .collect::<Option<Vec<_>>>()?;
        let entry = UsageEntry { record, day, sums };
        let keep_log = flags & KEEP_LOG != 0;
        settlement.record = Some(Record { entry, keep_log });
    }
    Some((seq, settlement, at + FRAME_HEAD + len))
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(out)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn field(&mut self) -> Option<&'a [u8]> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    fn text(&mut self) -> Option<String> {
        String::from_utf8(self.field()?.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_settlement_reads_back_as_written() {
        let settlement = Settlement {
            give_back: Some(GiveBack {
                key: "tp:{acme}:tk".into(),
                windows: vec![Window {
                    capacity: 1000,
                    period: Duration::from_secs(60),
                }],
                amount: 7,
            }),
            refund: Some(Refund {
                tallies: Arc::from([Tally {
                    key: "tp:{acme}:sp:t".into(),
                    limit: None,
                    lapses_at: None,
                }]),
                amount: 300,
            }),
            record: Some(Record {
                entry: UsageEntry {
                    record: b"{\"x\":1}".to_vec(),
                    day: "20261130".into(),
                    sums: vec![("acme\t-\tm\trequests".into(), 1)],
                },
                keep_log: true,
            }),
        };
        let mut out = encode(&settlement);
        seal(&mut out, 42);
        let (seq, back, end) = decode(&out, 0).unwrap();
        assert_eq!((seq, end), (42, out.len()));
        assert_eq!(back, settlement);
        // One byte flipped fails the checksum.
        out[FRAME_HEAD + 3] ^= 1;
        assert!(decode(&out, 0).is_none());
        let mut bare = encode(&Settlement::default());
        seal(&mut bare, 1);
        assert_eq!(decode(&bare, 0).unwrap().1, Settlement::default());
    }
}
