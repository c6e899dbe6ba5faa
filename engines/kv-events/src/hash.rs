//! vLLM's block hashes (`sha256_cbor`): `hash(block) = SHA-256(CBOR([parent, [tokens...],
//! null]))` with canonical CBOR, where the first block's parent is `NONE_HASH =
//! SHA-256(CBOR(seed))` and the seed is `PYTHONHASHSEED`'s value, or `"vllm-none-hash"` where
//! it is unset. Events carry `int.from_bytes(hash, "big") & (2**64 - 1)`.

use sha2::{Digest, Sha256};

/// A block's full hash.
pub type BlockHash = [u8; 32];

/// vLLM's seed when `PYTHONHASHSEED` is unset (cryptographic hash algorithms).
pub const DEFAULT_SEED: &str = "vllm-none-hash";

/// Chains block hashes from a seed.
#[derive(Debug, Clone)]
pub struct BlockHasher {
    none_hash: BlockHash,
}

impl BlockHasher {
    /// Hashes chained from `seed` (vLLM's `PYTHONHASHSEED`, or [`DEFAULT_SEED`]).
    pub fn new(seed: &str) -> Self {
        let mut cbor = Vec::with_capacity(seed.len() + 9);
        head(&mut cbor, 3, seed.len() as u64);
        cbor.extend_from_slice(seed.as_bytes());
        Self {
            none_hash: Sha256::digest(&cbor).into(),
        }
    }

    /// The hash of the block of `tokens` after the block hashed `parent` (`None`: the first).
    pub fn block(&self, parent: Option<&BlockHash>, tokens: &[u32]) -> BlockHash {
        let mut cbor = Vec::with_capacity(40 + tokens.len() * 5);
        head(&mut cbor, 4, 3);
        head(&mut cbor, 2, 32);
        cbor.extend_from_slice(parent.unwrap_or(&self.none_hash));
        head(&mut cbor, 4, tokens.len() as u64);
        for &t in tokens {
            head(&mut cbor, 0, u64::from(t));
        }
        cbor.push(0xf6);
        Sha256::digest(&cbor).into()
    }

    /// The hashes of every full block of `tokens`, in order.
    pub fn chain(&self, tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
        let mut out: Vec<BlockHash> = Vec::with_capacity(tokens.len() / block_size.max(1));
        for block in tokens.chunks_exact(block_size.max(1)) {
            let next = self.block(out.last(), block);
            out.push(next);
        }
        out
    }
}

impl Default for BlockHasher {
    fn default() -> Self {
        Self::new(DEFAULT_SEED)
    }
}

/// The integer events carry for `hash`: its last eight bytes, big-endian.
pub fn external(hash: &BlockHash) -> u64 {
    let mut low = [0u8; 8];
    low.copy_from_slice(&hash[24..]);
    u64::from_be_bytes(low)
}

/// A canonical CBOR head: major type and argument in the shortest form.
fn head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    match n {
        0..=23 => out.push(m | n as u8),
        24..=0xff => out.extend_from_slice(&[m | 24, n as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_heads_are_shortest() {
        let mut out = Vec::new();
        for n in [0, 23, 24, 255, 256, 65_535, 65_536] {
            head(&mut out, 0, n);
        }
        assert_eq!(
            out,
            [
                0x00, 0x17, 0x18, 0x18, 0x18, 0xff, 0x19, 0x01, 0x00, 0x19, 0xff, 0xff, 0x1a, 0x00,
                0x01, 0x00, 0x00
            ]
        );
    }

    #[test]
    fn a_chain_depends_on_every_earlier_block_and_the_seed() {
        let h = BlockHasher::default();
        let a = h.chain(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0], h.block(None, &[1, 2, 3, 4]));
        assert_eq!(a[1], h.block(Some(&a[0]), &[5, 6, 7, 8]));
        let b = h.chain(&[0, 2, 3, 4, 5, 6, 7, 8], 4);
        assert_ne!(a[1], b[1]);
        assert_ne!(BlockHasher::new("0").block(None, &[1]), h.block(None, &[1]));
        assert_eq!(external(&[7; 32]), 0x0707_0707_0707_0707);
    }
}
