//! The live progress line: sent, in flight, done, errors, TTFT p50/p99, and the sends per
//! second since the origin (a live view, not the sent rate of `reports::rates`).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use reports::metrics::{new_histogram, to_micros};
use reports::records::RequestRecord;

/// Counters shared by the run loop and the printer.
pub struct Progress {
    planned: u64,
    /// `planned` is an upper bound (agent sessions plan every turn up to the cap; the server
    /// decides how many run).
    at_most: bool,
    sent: AtomicU64,
    done: AtomicU64,
    errors: AtomicU64,
    ttft: Mutex<Histogram<u64>>,
}

impl Progress {
    pub fn new(planned: u64, at_most: bool) -> Progress {
        Progress {
            planned,
            at_most,
            sent: AtomicU64::new(0),
            done: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            ttft: Mutex::new(new_histogram()),
        }
    }

    pub fn on_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    pub fn on_done(&self, r: &RequestRecord) {
        self.done.fetch_add(1, Ordering::Relaxed);
        match (&r.error, r.first_token_ms) {
            (None, Some(first)) => {
                if let Ok(mut h) = self.ttft.lock() {
                    h.saturating_record(to_micros(first - r.sent_ms));
                }
            }
            _ => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The current line.
    pub fn line(&self, origin: Instant) -> String {
        let sent = self.sent.load(Ordering::Relaxed);
        let done = self.done.load(Ordering::Relaxed);
        let errors = self.errors.load(Ordering::Relaxed);
        let elapsed = Instant::now()
            .saturating_duration_since(origin)
            .as_secs_f64();
        let (p50, p99) = self.ttft.lock().map_or((0.0, 0.0), |h| {
            (
                h.value_at_quantile(0.5) as f64 / 1000.0,
                h.value_at_quantile(0.99) as f64 / 1000.0,
            )
        });
        let rate = if elapsed > 0.0 {
            sent as f64 / elapsed
        } else {
            0.0
        };
        format!(
            "[{elapsed:7.1}s] sent {sent}/{}{} | in flight {} | done {done} | errors {errors} | TTFT p50 {p50:.1} ms p99 {p99:.1} ms | {rate:.2} sent/s",
            if self.at_most { "at most " } else { "" },
            self.planned,
            sent.saturating_sub(done),
        )
    }

    /// Prints the line once (carriage return on a terminal, a new line otherwise).
    pub fn print_line(&self, origin: Instant) {
        if std::io::stderr().is_terminal() {
            eprint!("\r{}", self.line(origin));
        } else {
            eprintln!("{}", self.line(origin));
        }
    }

    /// Prints every `period` on a terminal, every 10 periods otherwise.
    pub async fn print_every(self: Arc<Self>, period: Duration, origin: Instant) {
        let period = if std::io::stderr().is_terminal() {
            period
        } else {
            period * 10
        };
        let mut tick = tokio::time::interval(period);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.print_line(origin);
        }
    }
}
