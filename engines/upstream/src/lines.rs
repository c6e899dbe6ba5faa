//! Splits a node's event stream into lines as its bytes arrive, each byte looked at once (a
//! line that arrives in many frames is not rescanned per frame), and no line longer than a
//! bound: a node that streams a line that never ends costs its bytes up to the bound, then an
//! error, not the gateway's memory and CPU without end.

/// The longest line a node may send: far above any chunk a node writes (even cumulative
/// `output_ids` with alternatives for every token of a long answer).
pub(crate) const MAX_LINE_BYTES: usize = 16 << 20;

/// Bytes received and not yet returned as lines.
#[derive(Debug)]
pub(crate) struct Lines {
    buffer: Vec<u8>,
    /// Where the next line starts in `buffer`.
    start: usize,
    /// How far past `start` is known to hold no newline.
    scanned: usize,
    max: usize,
}

/// The current line passed the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooLong(pub usize);

impl Lines {
    /// An empty splitter whose lines may hold at most `max` bytes.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            buffer: Vec::new(),
            start: 0,
            scanned: 0,
            max,
        }
    }

    /// Takes more bytes.
    pub(crate) fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
            self.scanned = 0;
        } else if self.start > self.buffer.len() / 2 {
            // Consumed lines are dropped in one move, not one per line.
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        self.buffer.extend_from_slice(data);
    }

    /// The next complete line (without its newline), or `None` until more bytes come; an error
    /// once the unfinished line passes the bound.
    pub(crate) fn next_line(&mut self) -> Result<Option<&[u8]>, TooLong> {
        let from = self.start + self.scanned;
        match self.buffer[from..].iter().position(|&b| b == b'\n') {
            Some(at) => {
                let end = from + at;
                let line = self.start..end;
                self.start = end + 1;
                self.scanned = 0;
                if line.len() > self.max {
                    return Err(TooLong(line.len()));
                }
                Ok(Some(&self.buffer[line]))
            }
            None => {
                self.scanned = self.buffer.len() - self.start;
                if self.scanned > self.max {
                    return Err(TooLong(self.scanned));
                }
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(lines: &mut Lines) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(line) = lines.next_line().unwrap() {
            out.push(String::from_utf8_lossy(line).into_owned());
        }
        out
    }

    #[test]
    fn lines_come_whole_whatever_the_frames() {
        let mut lines = Lines::new(100);
        lines.push(b"data: 1\ndata: ");
        assert_eq!(drain(&mut lines), ["data: 1"]);
        lines.push(b"2");
        assert_eq!(drain(&mut lines), Vec::<String>::new());
        lines.push(b"\n\ndata: 3\n");
        assert_eq!(drain(&mut lines), ["data: 2", "", "data: 3"]);
        lines.push(b"x\n");
        assert_eq!(drain(&mut lines), ["x"]);
    }

    #[test]
    fn a_line_that_never_ends_is_refused_at_the_bound() {
        let mut lines = Lines::new(10);
        lines.push(b"0123456789");
        assert_eq!(lines.next_line(), Ok(None));
        lines.push(b"a");
        assert_eq!(lines.next_line(), Err(TooLong(11)));
        let mut whole = Lines::new(3);
        whole.push(b"abcd\n");
        assert_eq!(whole.next_line(), Err(TooLong(4)));
    }

    #[test]
    fn a_long_line_in_small_frames_is_scanned_once() {
        let mut lines = Lines::new(MAX_LINE_BYTES);
        for _ in 0..10_000 {
            lines.push(&[b'a'; 100]);
            assert_eq!(lines.next_line(), Ok(None));
            assert_eq!(lines.scanned, lines.buffer.len() - lines.start);
        }
        lines.push(b"\n");
        assert_eq!(lines.next_line().unwrap().map(<[u8]>::len), Some(1_000_000));
    }
}
