//! Scrapes the server's Prometheus `/metrics` during a run: at the start, every interval and
//! at the end, each scrape appended (flushed) to the run folder's `server_metrics.jsonl`. A
//! server without `/metrics` is scraped once and then left alone; a failed scrape later is
//! skipped. Scrapes run on the run's runtime but take microseconds every few seconds.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use reports::server_metrics::{parse_prometheus, Scrape, SERVER_METRICS_FILE};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running scraper; [`Scraper::finish`] takes the last scrape and stops it.
pub struct Scraper {
    stop: watch::Sender<bool>,
    task: JoinHandle<usize>,
}

/// Where and how to scrape.
pub struct ScrapeTarget {
    pub base_url: String,
    pub headers: Vec<(String, String)>,
    pub api_key: Option<String>,
    pub interval: Duration,
    pub out_dir: PathBuf,
    /// The first scrape waits for this instant (a shared start of sharded workers), so that
    /// the scrapes cover the run, not the wait before it.
    pub start_at: Option<std::time::SystemTime>,
    /// The measured requests' TLS settings, for an `https://` server.
    pub tls: Option<crate::wire::tls::TlsSettings>,
}

async fn scrape_once(client: &reqwest::Client, target: &ScrapeTarget) -> Option<Scrape> {
    let mut request = client.get(format!("{}/metrics", target.base_url.trim_end_matches('/')));
    for (name, value) in &target.headers {
        request = request.header(name, value);
    }
    if let Some(key) = &target.api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    let text = response.text().await.ok()?;
    let values = parse_prometheus(&text);
    (!values.is_empty()).then(|| Scrape {
        unix_ms: chrono::Utc::now().timestamp_millis() as f64,
        values,
    })
}

impl Scraper {
    /// Starts scraping `target` (first scrape now, or at its start instant).
    pub fn start(target: ScrapeTarget) -> Scraper {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            if let Some(ahead) = target
                .start_at
                .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
            {
                tokio::select! {
                    () = tokio::time::sleep(ahead) => {}
                    _ = stopped.changed() => return 0,
                }
            }
            let Ok(client) =
                crate::wire::tls::reqwest_client(target.tls.as_ref(), Duration::from_secs(5))
            else {
                return 0;
            };
            let path = target.out_dir.join(SERVER_METRICS_FILE);
            let mut written = 0;
            let mut append = |scrape: &Scrape| {
                let line = serde_json::to_string(scrape).unwrap_or_default();
                let ok = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .and_then(|mut f| writeln!(f, "{line}"));
                if let Err(e) = ok {
                    eprintln!("loadgen: writing {}: {e}", path.display());
                }
                written += 1;
            };
            match scrape_once(&client, &target).await {
                Some(first) => append(&first),
                // No /metrics (or not Prometheus text): nothing to watch.
                None => return 0,
            }
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(target.interval) => {}
                    _ = stopped.changed() => break,
                }
                if let Some(s) = scrape_once(&client, &target).await {
                    append(&s);
                }
            }
            if let Some(s) = scrape_once(&client, &target).await {
                append(&s);
            }
            written
        });
        Scraper { stop, task }
    }

    /// Takes the final scrape and returns how many were written.
    pub async fn finish(self) -> usize {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or(0)
    }
}
