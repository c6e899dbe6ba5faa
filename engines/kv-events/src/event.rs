//! vLLM's KV-cache events, encoded as vLLM's publisher encodes them (msgspec, msgpack, the
//! array layout: a batch is `[ts, events, data_parallel_rank]` and an event is its tag (the
//! class name) followed by its fields in order), and decoded from that layout or from the map
//! layout (`{"type": ..., field: value}`) newer vLLM releases use.

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Full blocks entered the cache: their hashes in chain order, the hash of the block
    /// before the first (`None`: the first block of a sequence), and their tokens.
    BlockStored {
        /// The blocks' hashes (low 64 bits), in chain order.
        block_hashes: Vec<u64>,
        /// The hash of the block before the first.
        parent_block_hash: Option<u64>,
        /// The blocks' tokens, in order.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
    },
    /// Blocks left the cache.
    BlockRemoved {
        /// Their hashes.
        block_hashes: Vec<u64>,
    },
    /// The cache was emptied.
    AllBlocksCleared,
}

/// vLLM's name for an engine's own KV cache (as opposed to an offloading tier).
pub const MEDIUM: &str = "GPU";

/// A batch of events.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Seconds since the Unix epoch.
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<Event>,
    /// The publishing engine's data-parallel rank.
    pub data_parallel_rank: Option<i64>,
}

impl EventBatch {
    /// The batch as msgpack, in vLLM's array layout.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        array(&mut out, 3);
        out.push(0xcb);
        out.extend_from_slice(&self.ts.to_be_bytes());
        array(&mut out, self.events.len());
        for e in &self.events {
            match e {
                Event::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                } => {
                    array(&mut out, 8);
                    string(&mut out, "BlockStored");
                    uints(&mut out, block_hashes.iter().copied());
                    match parent_block_hash {
                        Some(h) => uint(&mut out, *h),
                        None => out.push(0xc0),
                    }
                    uints(&mut out, token_ids.iter().map(|&t| u64::from(t)));
                    uint(&mut out, u64::from(*block_size));
                    out.push(0xc0); // lora_id
                    string(&mut out, MEDIUM);
                    out.push(0xc0); // lora_name
                }
                Event::BlockRemoved { block_hashes } => {
                    array(&mut out, 3);
                    string(&mut out, "BlockRemoved");
                    uints(&mut out, block_hashes.iter().copied());
                    string(&mut out, MEDIUM);
                }
                Event::AllBlocksCleared => {
                    array(&mut out, 1);
                    string(&mut out, "AllBlocksCleared");
                }
            }
        }
        match self.data_parallel_rank {
            Some(rank) => int(&mut out, rank),
            None => out.push(0xc0),
        }
        out
    }

    /// A batch from msgpack in either layout; events of other kinds are skipped.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader { bytes, at: 0 };
        let value = r.value(0)?;
        let fields = match value {
            Value::Array(items) => items,
            Value::Map(pairs) => ["ts", "events", "data_parallel_rank"]
                .iter()
                .map(|k| lookup(&pairs, k).cloned().unwrap_or(Value::Nil))
                .collect(),
            _ => return Err("a batch is an array or a map".into()),
        };
        let ts = match fields.first() {
            Some(Value::Float(f)) => *f,
            Some(Value::Int(i)) => *i as f64,
            _ => return Err("a batch's ts is a number".into()),
        };
        let Some(Value::Array(raw)) = fields.get(1) else {
            return Err("a batch's events are an array".into());
        };
        let events = raw.iter().filter_map(event).collect();
        let data_parallel_rank = match fields.get(2) {
            Some(Value::Int(i)) => Some(*i as i64),
            _ => None,
        };
        Ok(Self {
            ts,
            events,
            data_parallel_rank,
        })
    }
}

/// One event in either layout (`None`: not one of the three).
fn event(v: &Value) -> Option<Event> {
    const STORED: [&str; 4] = [
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
    ];
    let (tag, fields): (&str, Vec<Value>) = match v {
        Value::Array(items) => match items.first()? {
            Value::Str(tag) => (tag, items[1..].to_vec()),
            _ => return None,
        },
        Value::Map(pairs) => {
            let Value::Str(tag) = lookup(pairs, "type")? else {
                return None;
            };
            let fields = STORED
                .iter()
                .map(|k| lookup(pairs, k).cloned().unwrap_or(Value::Nil))
                .collect();
            (tag, fields)
        }
        _ => return None,
    };
    match tag {
        "BlockStored" => Some(Event::BlockStored {
            block_hashes: hashes(fields.first()?)?,
            parent_block_hash: hash(fields.get(1)?),
            token_ids: match fields.get(2)? {
                Value::Array(ids) => ids
                    .iter()
                    .map(|i| match i {
                        Value::Int(i) => u32::try_from(*i).ok(),
                        _ => None,
                    })
                    .collect::<Option<Vec<u32>>>()?,
                _ => return None,
            },
            block_size: match fields.get(3)? {
                Value::Int(i) => u32::try_from(*i).ok()?,
                _ => return None,
            },
        }),
        "BlockRemoved" => Some(Event::BlockRemoved {
            block_hashes: hashes(fields.first()?)?,
        }),
        "AllBlocksCleared" => Some(Event::AllBlocksCleared),
        _ => None,
    }
}

/// A hash as events carry it: an integer, or bytes (whose last eight are taken, as vLLM's
/// integer form does).
fn hash(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => Some(*i as u64),
        Value::Bin(b) if b.len() >= 8 => {
            let mut low = [0u8; 8];
            low.copy_from_slice(&b[b.len() - 8..]);
            Some(u64::from_be_bytes(low))
        }
        _ => None,
    }
}

fn hashes(v: &Value) -> Option<Vec<u64>> {
    match v {
        Value::Array(items) => items.iter().map(hash).collect(),
        _ => None,
    }
}

fn lookup<'a>(pairs: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    pairs
        .iter()
        .find(|(k, _)| matches!(k, Value::Str(s) if s == key))
        .map(|(_, v)| v)
}

fn array(out: &mut Vec<u8>, n: usize) {
    match n {
        0..=15 => out.push(0x90 | n as u8),
        16..=0xffff => {
            out.push(0xdc);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            out.push(0xdd);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    match s.len() {
        0..=31 => out.push(0xa0 | s.len() as u8),
        32..=0xff => out.extend_from_slice(&[0xd9, s.len() as u8]),
        n => {
            out.push(0xda);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    out.extend_from_slice(s.as_bytes());
}

fn uint(out: &mut Vec<u8>, n: u64) {
    match n {
        0..=0x7f => out.push(n as u8),
        0x80..=0xff => out.extend_from_slice(&[0xcc, n as u8]),
        0x100..=0xffff => {
            out.push(0xcd);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(0xce);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        _ => {
            out.push(0xcf);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

fn int(out: &mut Vec<u8>, n: i64) {
    if n >= 0 {
        uint(out, n as u64);
    } else {
        out.push(0xd3);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

fn uints(out: &mut Vec<u8>, items: impl ExactSizeIterator<Item = u64>) {
    array(out, items.len());
    for n in items {
        uint(out, n);
    }
}

/// A decoded msgpack value (integers as i128, so every uint64 fits).
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Nil,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

/// The deepest nesting decoded (a batch needs three levels).
const MAX_DEPTH: usize = 16;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or("msgpack: truncated")?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn be(&mut self, n: usize) -> Result<u64, String> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err("msgpack: nested too deep".into());
        }
        let b = self.take(1)?[0];
        Ok(match b {
            0x00..=0x7f => Value::Int(i128::from(b)),
            0xe0..=0xff => Value::Int(i128::from(b as i8)),
            0x80..=0x8f => self.map(usize::from(b & 0x0f), depth)?,
            0x90..=0x9f => self.array(usize::from(b & 0x0f), depth)?,
            0xa0..=0xbf => self.string(usize::from(b & 0x1f))?,
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4..=0xc6 => {
                let n = self.be(1 << (b - 0xc4))? as usize;
                Value::Bin(self.take(n)?.to_vec())
            }
            0xca => Value::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.be(8)?)),
            0xcc..=0xcf => Value::Int(i128::from(self.be(1 << (b - 0xcc))?)),
            0xd0..=0xd3 => {
                let n = 1usize << (b - 0xd0);
                let raw = self.be(n)?;
                let shift = 64 - 8 * n as u32;
                Value::Int(i128::from(((raw << shift) as i64) >> shift))
            }
            0xd9..=0xdb => {
                let n = self.be(1 << (b - 0xd9))? as usize;
                self.string(n)?
            }
            0xdc | 0xdd => {
                let n = self.be(if b == 0xdc { 2 } else { 4 })? as usize;
                self.array(n, depth)?
            }
            0xde | 0xdf => {
                let n = self.be(if b == 0xde { 2 } else { 4 })? as usize;
                self.map(n, depth)?
            }
            other => return Err(format!("msgpack: type 0x{other:02x} is not read here")),
        })
    }

    fn string(&mut self, n: usize) -> Result<Value, String> {
        let raw = self.take(n)?;
        Ok(Value::Str(String::from_utf8_lossy(raw).into_owned()))
    }

    fn array(&mut self, n: usize, depth: usize) -> Result<Value, String> {
        // Every element takes at least a byte: a length past the input is refused early.
        if n > self.bytes.len() - self.at {
            return Err("msgpack: truncated".into());
        }
        (0..n)
            .map(|_| self.value(depth + 1))
            .collect::<Result<_, _>>()
            .map(Value::Array)
    }

    fn map(&mut self, n: usize, depth: usize) -> Result<Value, String> {
        if n > self.bytes.len() - self.at {
            return Err("msgpack: truncated".into());
        }
        (0..n)
            .map(|_| Ok((self.value(depth + 1)?, self.value(depth + 1)?)))
            .collect::<Result<_, String>>()
            .map(Value::Map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_survives_a_round_trip() {
        let batch = EventBatch {
            ts: 1_796_000_000.25,
            events: vec![
                Event::BlockStored {
                    block_hashes: vec![1, u64::MAX, 300],
                    parent_block_hash: None,
                    token_ids: (0..48).collect(),
                    block_size: 16,
                },
                Event::BlockStored {
                    block_hashes: vec![7],
                    parent_block_hash: Some(300),
                    token_ids: vec![70_000; 16],
                    block_size: 16,
                },
                Event::BlockRemoved {
                    block_hashes: vec![1 << 40],
                },
                Event::AllBlocksCleared,
            ],
            data_parallel_rank: Some(0),
        };
        assert_eq!(EventBatch::decode(&batch.encode()), Ok(batch));
    }

    #[test]
    fn the_map_layout_and_bad_input_are_read_too() {
        // {"ts": 1.5, "events": [{"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"}]}
        let mut m = vec![0x82];
        string(&mut m, "ts");
        m.push(0xcb);
        m.extend_from_slice(&1.5f64.to_be_bytes());
        string(&mut m, "events");
        m.push(0x91);
        m.push(0x83);
        for (k, v) in [("type", "BlockRemoved"), ("medium", "GPU")] {
            string(&mut m, k);
            string(&mut m, v);
        }
        string(&mut m, "block_hashes");
        uints(&mut m, [5u64].into_iter());
        let batch = EventBatch::decode(&m);
        assert_eq!(
            batch.map(|b| b.events),
            Ok(vec![Event::BlockRemoved {
                block_hashes: vec![5]
            }])
        );
        assert!(EventBatch::decode(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(EventBatch::decode(&[0x93, 0xcb]).is_err());
        assert!(EventBatch::decode(&[0x91; 40]).is_err());
    }
}
