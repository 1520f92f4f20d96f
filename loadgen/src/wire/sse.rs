//! Server-sent events parser: accepts events split across reads and several events in one
//! read, `\n` or `\r\n` line ends; yields the `data` of each event (multi-line data joined
//! by `\n`). Comments and other fields are ignored.

/// Incremental SSE parser.
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one read; returns the data of every event it completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut consumed = 0;
        while let Some((end, next)) = find_event_end(&self.buffer[consumed..]) {
            let raw = &self.buffer[consumed..consumed + end];
            if let Some(data) = event_data(raw) {
                events.push(data);
            }
            consumed += next;
        }
        self.buffer.drain(..consumed);
        events
    }

    /// Bytes received but not yet forming a complete event.
    pub fn pending(&self) -> &[u8] {
        &self.buffer
    }
}

/// (end of the event, start of the next) for the first blank line in `buf`.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == b'\n' {
            let rest = &buf[i + 1..];
            if rest.first() == Some(&b'\n') {
                return Some((i, i + 2));
            }
            if rest.starts_with(b"\r\n") {
                return Some((i, i + 3));
            }
        }
        i += 1;
    }
    None
}

fn event_data(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    let mut data: Option<String> = None;
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(value) = line.strip_prefix("data:") {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_string()),
            }
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_events_in_one_read() {
        let mut p = SseParser::new();
        let ev = p.push(b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\n: keep-alive\n\ndata: [DONE]\n\n");
        assert_eq!(ev, vec!["{\"a\":1}", "{\"b\":2}", "[DONE]"]);
        assert!(p.pending().is_empty());
    }

    #[test]
    fn events_split_across_reads_at_every_byte() {
        let stream = b"data: {\"x\": \"hello\"}\r\n\r\nevent: message\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            let mut p = SseParser::new();
            let mut events = p.push(&stream[..cut]);
            events.extend(p.push(&stream[cut..]));
            assert_eq!(
                events,
                vec!["{\"x\": \"hello\"}", "line1\nline2", "[DONE]"],
                "cut at {cut}"
            );
        }
        let mut p = SseParser::new();
        let mut events = Vec::new();
        for b in stream {
            events.extend(p.push(std::slice::from_ref(b)));
        }
        assert_eq!(events.len(), 3);
    }

    #[test]
    fn incomplete_event_stays_pending() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: {\"partial\"").is_empty());
        assert_eq!(p.pending(), b"data: {\"partial\"");
    }
}
