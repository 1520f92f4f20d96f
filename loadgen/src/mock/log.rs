//! The mock's own records: the request bodies it received, and its account of each
//! streamed request's lateness.

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use anyhow::{Context, Result};
use serde_json::{json, Value};

/// Request bodies received, each with its `x-loadgen-request-id`.
pub type BodyLog = Arc<Mutex<Vec<(Option<u64>, Value)>>>;

/// The mock's own account of one streamed request, so that its lateness can be told apart
/// from the client's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MockEvent {
    /// The client's request id (`x-loadgen-request-id`), when sent.
    pub id: Option<u64>,
    /// When the handler received the request.
    pub arrival: Instant,
    /// The same instant on the wall clock (comparable across processes).
    pub arrival_wall: SystemTime,
    /// How late the first content chunk left the mock against its configured TTFT, in ms.
    pub first_chunk_lateness_ms: f64,
}

/// A shared log of [`MockEvent`]s: kept in memory ([`MockLog::default`], read back with
/// [`MockLog::events`]), or written as JSON lines (`id`, `arrival_unix_us`,
/// `first_chunk_lateness_ms`) to a file by a thread of its own ([`MockLog::to_file`]), for a
/// mock in another process; the handler only hands the event over, never waits on the disk.
#[derive(Debug, Clone, Default)]
pub struct MockLog {
    events: Arc<Mutex<Vec<MockEvent>>>,
    file: Option<std::sync::mpsc::Sender<MockEvent>>,
}

impl MockLog {
    /// A log written to `path` (created, or truncated) as events happen.
    pub fn to_file(path: &std::path::Path) -> Result<MockLog> {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let (tx, rx) = std::sync::mpsc::channel::<MockEvent>();
        std::thread::Builder::new()
            .name("mock-arrival-log".into())
            .spawn(move || {
                let mut out = std::io::LineWriter::new(file);
                for event in rx {
                    let arrival_us = event
                        .arrival_wall
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_micros());
                    let line = json!({"id": event.id, "arrival_unix_us": arrival_us,
                        "first_chunk_lateness_ms": event.first_chunk_lateness_ms});
                    // The log is a test aid: a full disk loses lines, never a response.
                    let _ = writeln!(out, "{line}");
                }
            })
            .context("starting the arrival-log writer")?;
        Ok(MockLog {
            events: Arc::default(),
            file: Some(tx),
        })
    }

    /// The events so far (of a log kept in memory).
    pub fn events(&self) -> Vec<MockEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    pub(super) fn push(&self, event: MockEvent) {
        if let Some(file) = &self.file {
            let _ = file.send(event);
        } else if let Ok(mut events) = self.events.lock() {
            events.push(event);
        }
    }
}
