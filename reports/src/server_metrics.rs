//! The server's own view of a run: Prometheus `/metrics` scraped by the load generator at the
//! start, every few seconds and at the end (`server_metrics.jsonl` in the run folder, one line
//! per scrape), and the quantities a report shows beside the latencies: requests running and
//! waiting, KV-cache usage, preemptions and prefix-cache hits. Our engine and vLLM share
//! names; SGLang's, llama.cpp's and TGI's are mapped where they mean the same; any other
//! server's metrics are kept as found.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The file of scrapes in a run folder.
pub const SERVER_METRICS_FILE: &str = "server_metrics.jsonl";

/// One scrape: when (Unix ms) and every sample summed over its label sets, by metric name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scrape {
    pub unix_ms: f64,
    pub values: BTreeMap<String, f64>,
}

/// Parses the Prometheus text format: the samples of each metric name summed over their
/// label sets (histogram buckets left out). A histogram's `_sum` and `_count` keep a `kind`
/// label in their key (`engine:step_duration_seconds_sum{kind="mixed"}`: our engine's step
/// kinds), summed over the other labels. Lines that do not parse are skipped: a scrape is a
/// best-effort view, never a reason to stop a run.
pub fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut values = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => continue,
        };
        let (labels, rest) = match rest.strip_prefix('{') {
            Some(labelled) => match labelled.rfind('}') {
                Some(end) => (&labelled[..end], &labelled[end + 1..]),
                None => continue,
            },
            None => ("", rest),
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        if ["_bucket", "_created"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
            || !value.is_finite()
        {
            continue;
        }
        let key = match kind_label(labels) {
            Some(kind) if name.ends_with("_sum") || name.ends_with("_count") => {
                format!("{name}{{kind=\"{kind}\"}}")
            }
            _ => name.to_string(),
        };
        *values.entry(key).or_insert(0.0) += value;
    }
    values
}

/// The value of a `kind="…"` label among `labels` (`a="x, y",kind="mixed"`): each value is
/// read to its closing quote, past escaped quotes and commas inside it.
fn kind_label(labels: &str) -> Option<&str> {
    let mut rest = labels;
    loop {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start().strip_prefix('"')?;
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let end = end?;
        if key.trim().trim_start_matches(',').trim() == "kind" {
            return Some(&after[..end]);
        }
        rest = &after[end + 1..];
    }
}

/// Whether a quantity is a level (gauge) or a running total (counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Gauge,
    Counter,
}

/// A quantity a report shows, and the names servers give it (first found wins).
pub struct Quantity {
    pub label: &'static str,
    pub names: &'static [&'static str],
    pub kind: Kind,
}

/// What the report shows, under our engine's / vLLM's names and their equivalents.
pub const QUANTITIES: &[Quantity] = &[
    Quantity {
        label: "requests running",
        names: &[
            "vllm:num_requests_running",
            "sglang:num_running_reqs",
            "llamacpp:requests_processing",
            "tgi_batch_current_size",
        ],
        kind: Kind::Gauge,
    },
    Quantity {
        label: "requests waiting",
        names: &[
            "vllm:num_requests_waiting",
            "sglang:num_queue_reqs",
            "llamacpp:requests_deferred",
            "tgi_queue_size",
        ],
        kind: Kind::Gauge,
    },
    Quantity {
        label: "KV-cache usage (fraction)",
        names: &[
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
            "sglang:token_usage",
            "llamacpp:kv_cache_usage_ratio",
        ],
        kind: Kind::Gauge,
    },
    Quantity {
        label: "preemptions",
        names: &["vllm:num_preemptions_total", "vllm:num_preemptions"],
        kind: Kind::Counter,
    },
    Quantity {
        label: "prefix-cache hits (tokens)",
        names: &["vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"],
        kind: Kind::Counter,
    },
    Quantity {
        label: "prefix-cache queries (tokens)",
        names: &[
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_queries",
        ],
        kind: Kind::Counter,
    },
    Quantity {
        label: "engine busy (s)",
        names: &["engine:busy_seconds_total"],
        kind: Kind::Counter,
    },
];

/// One quantity over a run: a gauge's first, mean, max and last value; a counter's increase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantityView {
    pub label: String,
    /// The server's metric name.
    pub name: String,
    pub kind: Kind,
    pub first: f64,
    pub mean: f64,
    pub max: f64,
    pub last: f64,
}

/// The server's view of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerView {
    pub scrapes: usize,
    /// Seconds from the first scrape to the last.
    pub span_s: f64,
    pub quantities: Vec<QuantityView>,
    /// Metric names found that no known quantity maps (an unknown server's, shown as found).
    pub other_names: Vec<String>,
    /// The prefix-cache hit rate over the measurement window only (warm-up excluded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_prefix_cache: Option<WindowHitRate>,
    /// The engine's steps by kind over the span, where it exports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<StepBreakdown>,
}

/// The histogram of our engine's step durations, by `kind`.
const STEP_DURATION: &str = "engine:step_duration_seconds";

/// Steps of one kind over a span: how many, and the seconds they took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTotal {
    pub steps: f64,
    pub seconds: f64,
}

impl StepTotal {
    /// The mean step in ms, when there was one.
    pub fn mean_ms(&self) -> Option<f64> {
        (self.steps > 0.0).then(|| self.seconds / self.steps * 1000.0)
    }
}

/// The engine's steps over a span by kind (`engine:step_duration_seconds`' sums and counts):
/// decode-only steps, mixed ones (prefill chunks beside decodes) and prefill-only ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepBreakdown {
    pub decode_only: StepTotal,
    pub mixed: StepTotal,
    pub prefill_only: StepTotal,
}

impl StepBreakdown {
    /// The increase of the step histogram's sums and counts from `first` to `last`; `None`
    /// when the server does not export it.
    pub fn between(first: &Scrape, last: &Scrape) -> Option<StepBreakdown> {
        let total = |kind: &str| -> Option<StepTotal> {
            let delta = |part: &str| {
                let key = format!("{STEP_DURATION}_{part}{{kind=\"{kind}\"}}");
                // A counter that fell means the server restarted between the scrapes: no
                // increase to read.
                Some(last.values.get(&key)? - first.values.get(&key).unwrap_or(&0.0))
                    .filter(|d| *d >= 0.0)
            };
            Some(StepTotal {
                steps: delta("count")?,
                seconds: delta("sum")?,
            })
        };
        let (decode_only, mixed, prefill_only) =
            (total("decode-only"), total("mixed"), total("prefill-only"));
        if decode_only.is_none() && mixed.is_none() && prefill_only.is_none() {
            return None;
        }
        Some(StepBreakdown {
            decode_only: decode_only.unwrap_or_default(),
            mixed: mixed.unwrap_or_default(),
            prefill_only: prefill_only.unwrap_or_default(),
        })
    }

    /// Seconds in steps of every kind.
    pub fn busy_seconds(&self) -> f64 {
        self.decode_only.seconds + self.mixed.seconds + self.prefill_only.seconds
    }

    /// A mixed step's mean over a decode-only step's.
    pub fn mixed_slowdown(&self) -> Option<f64> {
        let (mixed, decode) = (self.mixed.mean_ms()?, self.decode_only.mean_ms()?);
        (decode > 0.0).then(|| mixed / decode)
    }

    /// The share of the time in steps that decode (mixed and decode-only) spent in mixed
    /// ones.
    pub fn mixed_share_of_decode(&self) -> Option<f64> {
        let decode = self.mixed.seconds + self.decode_only.seconds;
        (decode > 0.0).then(|| self.mixed.seconds / decode)
    }

    /// Seconds spent on prefill, estimated: the prefill-only steps, plus what the mixed steps
    /// took beyond as many decode-only steps (all of a mixed step when no decode-only step
    /// was seen).
    pub fn prefill_seconds(&self) -> f64 {
        let decode_part = self.mixed.steps * self.decode_only.mean_ms().unwrap_or(0.0) / 1000.0;
        self.prefill_only.seconds + (self.mixed.seconds - decode_part).max(0.0)
    }

    /// [`Self::prefill_seconds`] as a share of the time in steps.
    pub fn prefill_share(&self) -> Option<f64> {
        let busy = self.busy_seconds();
        (busy > 0.0).then(|| self.prefill_seconds() / busy)
    }
}

/// The server's prefix-cache hit rate over the measurement window, from its counters (the
/// increase between the last scrape before the window and the first after it) or its own
/// hit-rate gauge (the mean of the scrapes inside the window).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowHitRate {
    pub rate: f64,
    /// The metrics it comes from.
    pub source: String,
    /// The span the scrapes cover (Unix ms), the window included.
    pub from_unix_ms: f64,
    pub to_unix_ms: f64,
}

/// Hit and query token counters of a prefix cache (our engine's and vLLM's names).
const PREFIX_CACHE_COUNTERS: &[(&str, &str)] = &[
    (
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
    ),
    ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
];
/// Hit-rate gauges (SGLang's).
const PREFIX_CACHE_GAUGES: &[&str] = &["sglang:cache_hit_rate"];

/// The prefix-cache hit rate of `scrapes` (in time order) over the window
/// `start_ms..end_ms` (Unix ms).
pub fn window_hit_rate(scrapes: &[Scrape], start_ms: f64, end_ms: f64) -> Option<WindowHitRate> {
    let before = scrapes
        .iter()
        .rev()
        .find(|s| s.unix_ms <= start_ms)
        .or(scrapes.first())?;
    let after = scrapes
        .iter()
        .find(|s| s.unix_ms >= end_ms)
        .or(scrapes.last())?;
    for (hits, queries) in PREFIX_CACHE_COUNTERS {
        let delta = |name: &str| Some(after.values.get(name)? - before.values.get(name)?);
        if let (Some(h), Some(q)) = (delta(hits), delta(queries)) {
            return (q > 0.0).then(|| WindowHitRate {
                rate: h / q,
                source: format!("{hits} / {queries}"),
                from_unix_ms: before.unix_ms,
                to_unix_ms: after.unix_ms,
            });
        }
    }
    for gauge in PREFIX_CACHE_GAUGES {
        let inside: Vec<f64> = scrapes
            .iter()
            .filter(|s| (start_ms..=end_ms).contains(&s.unix_ms))
            .filter_map(|s| s.values.get(*gauge).copied())
            .collect();
        if !inside.is_empty() {
            return Some(WindowHitRate {
                rate: inside.iter().sum::<f64>() / inside.len() as f64,
                source: format!("{gauge} (mean of {} scrapes)", inside.len()),
                from_unix_ms: start_ms,
                to_unix_ms: end_ms,
            });
        }
    }
    None
}

/// The readings of the quantity labelled `label` (one of [`QUANTITIES`]) over `scrapes`, as
/// (Unix ms, value), under the first of its names the first scrape carries; `None` when it
/// carries none of them.
pub fn readings(scrapes: &[Scrape], label: &str) -> Option<Vec<(f64, f64)>> {
    let quantity = QUANTITIES.iter().find(|q| q.label == label)?;
    let first = scrapes.first()?;
    let name = quantity
        .names
        .iter()
        .find(|n| first.values.contains_key(**n))?;
    Some(
        scrapes
            .iter()
            .filter_map(|s| Some((s.unix_ms, *s.values.get(*name)?)))
            .collect(),
    )
}

impl ServerView {
    /// The view of `scrapes` (in time order); `None` without any.
    pub fn from_scrapes(scrapes: &[Scrape]) -> Option<ServerView> {
        let (first, last) = (scrapes.first()?, scrapes.last()?);
        let mut known_names = Vec::new();
        let quantities: Vec<QuantityView> = QUANTITIES
            .iter()
            .filter_map(|q| {
                let name = q.names.iter().find(|n| first.values.contains_key(**n))?;
                known_names.extend(q.names.iter().copied());
                let series: Vec<f64> = scrapes
                    .iter()
                    .filter_map(|s| s.values.get(*name).copied())
                    .collect();
                let n = series.len() as f64;
                Some(QuantityView {
                    label: q.label.to_string(),
                    name: name.to_string(),
                    kind: q.kind,
                    first: series[0],
                    mean: series.iter().sum::<f64>() / n,
                    max: series.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    last: series[series.len() - 1],
                })
            })
            .collect();
        // A histogram's sums and counts are kept for the step breakdown, not shown as names.
        let other_names = if quantities.is_empty() {
            first
                .values
                .keys()
                .filter(|k| !k.contains("_sum") && !k.contains("_count"))
                .take(40)
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        Some(ServerView {
            scrapes: scrapes.len(),
            span_s: (last.unix_ms - first.unix_ms) / 1000.0,
            quantities,
            other_names,
            window_prefix_cache: None,
            steps: StepBreakdown::between(first, last),
        })
    }

    /// A quantity by its label.
    pub fn get(&self, label: &str) -> Option<&QuantityView> {
        self.quantities.iter().find(|q| q.label == label)
    }

    /// The share of the scraped span the engine spent in steps (`engine:busy_seconds_total`'s
    /// increase over the span), where the server exports it and the span is not empty.
    pub fn busy_share(&self) -> Option<f64> {
        let busy = self.get("engine busy (s)")?;
        (self.span_s > 0.0).then(|| (busy.last - busy.first) / self.span_s)
    }
}

/// Reads a run folder's scrapes, if it has any (a line that does not parse is an error that
/// names the file and line).
pub fn read_scrapes(dir: &Path) -> Result<Vec<Scrape>> {
    let path = dir.join(SERVER_METRICS_FILE);
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{}: line {}: not a scrape", path.display(), i + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENGINE: &str = "# HELP vllm:num_requests_running Running.\n\
        # TYPE vllm:num_requests_running gauge\n\
        vllm:num_requests_running{model_name=\"m\"} 3.0\n\
        vllm:num_requests_waiting{model_name=\"m\"} 5\n\
        vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n\
        vllm:num_preemptions_total{model_name=\"m\"} 2\n\
        vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 9\n\
        vllm:request_success_total{model_name=\"m\",finished_reason=\"stop\"} 4\n\
        vllm:request_success_total{model_name=\"m\",finished_reason=\"length\"} 6\n\
        vllm:request_prefill_time_seconds_sum{model_name=\"m\"} 1.5\n\
        engine:step_duration_seconds_sum{model_name=\"m\",kind=\"mixed\"} 0.5\n\
        engine:step_duration_seconds_count{model_name=\"m\",kind=\"mixed\"} 2\n\
        engine:step_duration_seconds_sum{model_name=\"n, a=b\",kind=\"mixed\"} 0.25\n\
        engine:step_duration_seconds_count{model_name=\"say \\\"kind=\\\"x\",kind=\"mixed\"} 1\n\
        garbage line\n";

    #[test]
    fn the_window_hit_rate_leaves_the_warm_up_out() {
        let scrape = |t: f64, hits: f64, queries: f64| Scrape {
            unix_ms: t,
            values: BTreeMap::from([
                ("vllm:prefix_cache_hits_total".to_string(), hits),
                ("vllm:prefix_cache_queries_total".to_string(), queries),
            ]),
        };
        // Warm-up until 2,000 ms: 90 of 100 tokens hit; in the window, 30 of 300.
        let scrapes = [
            scrape(0.0, 0.0, 0.0),
            scrape(2000.0, 90.0, 100.0),
            scrape(4000.0, 100.0, 250.0),
            scrape(6000.0, 120.0, 400.0),
        ];
        let w = window_hit_rate(&scrapes, 2000.0, 5500.0).unwrap();
        assert!((w.rate - 0.1).abs() < 1e-12, "{w:?}");
        assert_eq!((w.from_unix_ms, w.to_unix_ms), (2000.0, 6000.0));
        let gauge = |t: f64, rate: f64| Scrape {
            unix_ms: t,
            values: BTreeMap::from([("sglang:cache_hit_rate".to_string(), rate)]),
        };
        let sglang = [gauge(0.0, 0.9), gauge(2000.0, 0.2), gauge(4000.0, 0.4)];
        let w = window_hit_rate(&sglang, 1000.0, 5000.0).unwrap();
        assert!((w.rate - 0.3).abs() < 1e-12, "{w:?}");
        assert_eq!(window_hit_rate(&[gauge(0.0, 0.5)], 1000.0, 2000.0), None);
    }

    #[test]
    fn samples_are_summed_over_labels_and_buckets_skipped() {
        let v = parse_prometheus(ENGINE);
        assert_eq!(v["vllm:num_requests_running"], 3.0);
        assert_eq!(v["vllm:request_success_total"], 10.0);
        assert!(!v.contains_key("vllm:time_to_first_token_seconds_bucket"));
        assert!(!v.contains_key("garbage"));
        // Sums and counts are kept, by kind where they have one.
        assert_eq!(v["vllm:request_prefill_time_seconds_sum"], 1.5);
        assert_eq!(v["engine:step_duration_seconds_sum{kind=\"mixed\"}"], 0.75);
        // A label value holding a comma, or an escaped quote and `kind=`, does not misread.
        assert_eq!(v["engine:step_duration_seconds_count{kind=\"mixed\"}"], 3.0);
        assert!(!v.contains_key("engine:step_duration_seconds_sum"));
    }

    #[test]
    fn the_step_breakdown_by_hand() {
        let scrape = |t: f64, counts: [f64; 3], sums: [f64; 3]| {
            let mut values = BTreeMap::new();
            for (i, kind) in ["decode-only", "mixed", "prefill-only"].iter().enumerate() {
                let key = |part: &str| format!("{STEP_DURATION}_{part}{{kind=\"{kind}\"}}");
                values.insert(key("count"), counts[i]);
                values.insert(key("sum"), sums[i]);
            }
            Scrape { unix_ms: t, values }
        };
        // Over the span: 100 decode-only steps in 5 s (50 ms each), 10 mixed in 3 s (300 ms
        // each, 6×), 2 prefill-only in 1 s.
        let view = ServerView::from_scrapes(&[
            scrape(0.0, [10.0, 1.0, 0.0], [0.5, 0.3, 0.0]),
            scrape(10_000.0, [110.0, 11.0, 2.0], [5.5, 3.3, 1.0]),
        ])
        .unwrap();
        let steps = view.steps.unwrap();
        assert!((steps.busy_seconds() - 9.0).abs() < 1e-9);
        assert!((steps.mixed_slowdown().unwrap() - 6.0).abs() < 1e-9);
        // Mixed steps are 3 of the 8 decode-carrying seconds.
        assert!((steps.mixed_share_of_decode().unwrap() - 0.375).abs() < 1e-9);
        // Prefill: 1 s alone, and 3 s − 10 × 50 ms = 2.5 s inside the mixed steps: 3.5 of 9 s.
        assert!((steps.prefill_seconds() - 3.5).abs() < 1e-9);
        assert!((steps.prefill_share().unwrap() - 3.5 / 9.0).abs() < 1e-9);
        // A server restarted between the scrapes (its counters fell) gives no breakdown.
        let restarted = ServerView::from_scrapes(&[
            scrape(0.0, [110.0, 11.0, 2.0], [5.5, 3.3, 1.0]),
            scrape(10_000.0, [10.0, 1.0, 0.0], [0.5, 0.3, 0.0]),
        ])
        .unwrap();
        assert_eq!(restarted.steps, None);
        let none = Scrape {
            unix_ms: 0.0,
            values: BTreeMap::from([("vllm:num_requests_running".to_string(), 1.0)]),
        };
        assert_eq!(ServerView::from_scrapes(&[none]).unwrap().steps, None);
    }

    #[test]
    fn the_view_maps_known_names_and_keeps_others_as_found() {
        let scrape = |t: f64, running: f64, preempt: f64| Scrape {
            unix_ms: t,
            values: BTreeMap::from([
                ("vllm:num_requests_running".to_string(), running),
                ("vllm:num_preemptions_total".to_string(), preempt),
            ]),
        };
        let view =
            ServerView::from_scrapes(&[scrape(0.0, 1.0, 2.0), scrape(2000.0, 5.0, 7.0)]).unwrap();
        assert_eq!(view.scrapes, 2);
        assert_eq!(view.span_s, 2.0);
        let running = view.get("requests running").unwrap();
        assert_eq!((running.first, running.mean, running.max), (1.0, 3.0, 5.0));
        let preempt = view.get("preemptions").unwrap();
        assert_eq!(preempt.last - preempt.first, 5.0);
        assert!(view.other_names.is_empty());
        let other = Scrape {
            unix_ms: 0.0,
            values: BTreeMap::from([("tgi_other".to_string(), 1.0)]),
        };
        let view = ServerView::from_scrapes(&[other]).unwrap();
        assert!(view.quantities.is_empty());
        assert_eq!(view.other_names, ["tgi_other"]);
        assert_eq!(ServerView::from_scrapes(&[]), None);
    }
}
