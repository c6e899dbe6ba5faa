//! Response and tool-call ids: a prefix and 24 random letters and digits, as OpenAI's look.

/// A new id: `prefix` (with its separator, as in `chatcmpl-` or `call_`) and 24 random
/// letters and digits.
pub fn new_id(prefix: &str) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut id = String::with_capacity(prefix.len() + 24);
    id.push_str(prefix);
    id.extend((0..24).map(|_| char::from(CHARS[fastrand::usize(..CHARS.len())])));
    id
}
