//! Report rendering: both files are written, every SVG is closed, nothing points outside the
//! page, and every page carries the conditions and the metric definitions.
//!
//! Set `REPORTS_DEMO_OUT=<dir>` to keep the rendered reports (scripts/check-report-html.sh
//! does this to screenshot them in headless Chromium).

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reports::ab::{compare, AbInput};
use reports::bound::DecodeBound;
use reports::capacity::{capacity_plan, PlanOptions, SweepLevel, TargetLoad};
use reports::diagnosis::{Diagnosis, Regime};
use reports::metrics::{DistStats, Metrics};
use reports::render::{
    write_report, CompareView, Conditions, Report, ReportBody, RunView, SweepView,
};
use reports::samples::{LatencySamples, RequestSample};
use reports::search::{
    Bracket, BracketEnd, SearchEnd, SearchPath, SearchStep, SearchVerdict, StepReason,
};
use reports::server_metrics::{ServerView, StepBreakdown, StepTotal};
use reports::slo::SloSpec;
use reports::stats::Bootstrap;

fn conditions() -> Conditions {
    Conditions {
        workload: "synthetic ShareGPT-like chat, seed 1".into(),
        schedule: "Poisson <rates> & warm-up 15 s".into(),
        server: "mock at http://127.0.0.1:8000".into(),
        hardware: "test host".into(),
        extra: vec![("seed".into(), "1".into())],
    }
}

/// Requests whose latencies grow with utilisation `load` (0..1).
fn samples(rng: &mut StdRng, n: u64, load: f64, scale: f64) -> LatencySamples {
    let queueing = 1.0 / (1.0 - load.min(0.97));
    let requests = (0..n)
        .map(|id| {
            let noise = |rng: &mut StdRng| -(1.0 - rng.random::<f64>()).ln();
            RequestSample {
                id,
                ttft_ms: scale * 40.0 * queueing * noise(rng),
                ttfa_ms: Some(scale * 40.0 * queueing * noise(rng)),
                tpot_ms: Some(scale * (8.0 + 4.0 * load + noise(rng))),
                e2el_ms: scale * (40.0 * queueing + 200.0 * (1.0 + noise(rng))),
            }
        })
        .collect();
    LatencySamples {
        requests,
        schedule_lag_ms: (0..n).map(|_| 0.05 + 0.3 * rng.random::<f64>()).collect(),
    }
}

fn sweep_report(rng: &mut StdRng) -> Report {
    let slo = SloSpec::parse("ttft:p99:500ms,tpot:p99:20ms").unwrap();
    let levels: Vec<SweepLevel> = [1.0, 2.0, 4.0, 6.0, 8.0]
        .iter()
        .map(|&rate| {
            let load = rate / 8.5;
            let completed = if rate > 7.0 { 7.2 } else { rate * 0.995 };
            SweepLevel {
                offered_rate: rate,
                completed_rate: completed,
                output_tokens_per_s: completed * 180.0,
                saturated: completed < 0.95 * rate,
                samples: samples(rng, 400, load, 1.0),
                server: None,
                timeline: Some(timeline()),
                scheduled_rate: None,
                saturation_rule: None,
                diagnosis: None,
                repeat: None,
            }
        })
        .collect();
    let options = PlanOptions {
        target: TargetLoad::Qps(50.0),
        gpus_per_instance: 1,
        headroom: 1.2,
        gpu_hour_usd: Some(2.5),
        bootstrap: Bootstrap::default(),
    };
    let plan = capacity_plan(&levels, &slo, &options).unwrap();
    assert!(plan.max_sustainable.is_some());
    Report {
        title: "Sweep <mock>".into(),
        conditions: conditions(),
        body: ReportBody::Sweep(SweepView {
            levels,
            slo: Some(slo),
            plan: Some(plan),
            search: Some(search_path()),
        }),
    }
}

/// A knee search that started at 8 req/s (saturated, completing 7.2) and halved to 4.
fn search_path() -> SearchPath {
    let end = |dir: &str, rate: f64| {
        Some(BracketEnd {
            dir: dir.into(),
            rate,
        })
    };
    let step = |dir: &str, rate: f64, sustained: f64, reason, verdict, bracket| SearchStep {
        dir: dir.into(),
        offered_rate: rate,
        scheduled_rate: Some(rate),
        completed_rate: Some(sustained),
        sustained_rate: sustained,
        reason,
        verdict,
        bracket,
    };
    SearchPath {
        precision: 0.1,
        max_levels: 2,
        min_rate: 1.0,
        max_rate: 32.0,
        start_rate: 8.0,
        steps: vec![
            step(
                "level-00",
                8.0,
                7.2,
                StepReason::Start,
                SearchVerdict::Saturated,
                Bracket {
                    lower: None,
                    upper: end("level-00", 7.2),
                },
            ),
            step(
                "level-01",
                4.0,
                3.98,
                StepReason::Halving,
                SearchVerdict::Met,
                Bracket {
                    lower: end("level-01", 3.98),
                    upper: end("level-00", 7.2),
                },
            ),
        ],
        end: Some(SearchEnd::MaxLevels),
        end_reason: Some("ran --max-levels 2 levels".into()),
    }
}

fn compare_report(rng: &mut StdRng) -> Report {
    let a: Vec<LatencySamples> = (0..2).map(|_| samples(rng, 200, 0.5, 1.0)).collect();
    let b: Vec<LatencySamples> = (0..2).map(|_| samples(rng, 200, 0.5, 1.15)).collect();
    let analysis = compare(
        &AbInput::from_rounds(&a, &b, true),
        0.05,
        0.02,
        Bootstrap::default(),
    );
    let pool = |rounds: &[LatencySamples]| LatencySamples {
        requests: rounds.iter().flat_map(|r| r.requests.clone()).collect(),
        schedule_lag_ms: rounds
            .iter()
            .flat_map(|r| r.schedule_lag_ms.clone())
            .collect(),
    };
    Report {
        title: "A/B".into(),
        conditions: conditions(),
        body: ReportBody::Compare(CompareView {
            a_label: "engine serve --max-num-seqs 8".into(),
            b_label: "engine serve --max-num-seqs 4".into(),
            a: pool(&a),
            b: pool(&b),
            analysis,
            a_classes: Vec::new(),
            b_classes: Vec::new(),
            a_requests: 0,
            b_requests: 0,
        }),
    }
}

/// Ten 1 s slices: warm-up for 2 s, a window to 8 s, TTFT climbing as a queue builds.
fn timeline() -> reports::timeline::Timeline {
    use reports::timeline::{PhaseBounds, Quantiles, Slice, Timeline};
    let phases = PhaseBounds {
        warmup_s: 2.0,
        measured_end_s: Some(8.0),
    };
    let slices = (0..10)
        .map(|i| Slice {
            start_s: f64::from(i),
            end_s: f64::from(i + 1),
            phase: reports::records::Phase::Measured,
            started: 5,
            finished: 5,
            finished_by_phase: [("measured".to_string(), 5)].into(),
            errors: u64::from(i == 6),
            output_tokens: 500,
            output_tok_per_s: 500.0,
            ttft_ms: Quantiles {
                n: 5,
                p50: Some(50.0 + 10.0 * f64::from(i)),
                p90: Some(80.0 + 20.0 * f64::from(i)),
            },
            tpot_ms: Quantiles::default(),
            e2el_ms: Quantiles::default(),
            server: [("requests waiting".to_string(), f64::from(i))].into(),
        })
        .collect();
    Timeline {
        slice_s: 1.0,
        phases,
        slices,
    }
}

fn run_report(rng: &mut StdRng) -> Report {
    let samples = samples(rng, 500, 0.5, 1.0);
    let metrics = Metrics {
        completed: 500,
        duration_s: 100.0,
        request_throughput: 5.0,
        output_throughput: 900.0,
        ttft: DistStats::from_values(&samples.values(reports::metrics::SloMetric::Ttft)),
        tpot: DistStats::from_values(&samples.values(reports::metrics::SloMetric::Tpot)),
        schedule_lag: DistStats::from_values(&samples.schedule_lag_ms),
        sessions: Some(reports::sessions::SessionStats {
            sessions: 125,
            session_rate: 1.25,
            requests_per_session: 4.0,
            ended: [("completed".to_string(), 120), ("capped".to_string(), 5)].into(),
            by_turn: (1..=4)
                .map(|turn| reports::sessions::TurnStats {
                    turn,
                    completed: 125,
                    failed: 0,
                    ttft: DistStats::from_values(&[40.0, 50.0, 60.0]),
                    e2el: DistStats::from_values(&[400.0, 500.0]),
                    prompt_tokens_mean: 120.0 * f64::from(turn),
                    cached_share: Some(1.0 - 1.0 / f64::from(turn)),
                })
                .collect(),
            per_session: Some(reports::sessions::PerSession {
                sessions: 125,
                e2e: DistStats::from_values(&[4000.0, 5000.0]),
                server: DistStats::from_values(&[2000.0, 2500.0]),
                waiting: DistStats::from_values(&[2000.0, 2500.0]),
                prompt_tokens: 150_000,
                cached_tokens: Some((100_000, 150_000)),
            }),
            tools: Some(reports::sessions::ToolUse {
                turns: 500,
                turns_with_calls: 375,
                calls: 400,
                unusable_calls: 1,
            }),
            ttft_by_context: vec![reports::sessions::ContextBin {
                from: 0,
                to: 512,
                ttft: DistStats::from_values(&[40.0, 50.0, 60.0]),
                cached_share: Some(0.5),
            }],
        }),
        ..Metrics::default()
    };
    Report {
        title: "Run".into(),
        conditions: conditions(),
        body: ReportBody::Run(Box::new(RunView {
            metrics,
            samples,
            server: Some(ServerView {
                scrapes: 20,
                span_s: 100.0,
                quantities: Vec::new(),
                other_names: Vec::new(),
                window_prefix_cache: None,
                steps: Some(StepBreakdown {
                    decode_only: StepTotal {
                        steps: 4000.0,
                        seconds: 60.0,
                    },
                    mixed: StepTotal {
                        steps: 100.0,
                        seconds: 20.0,
                    },
                    prefill_only: StepTotal {
                        steps: 10.0,
                        seconds: 5.0,
                    },
                }),
            }),
            timeline: Some(timeline()),
            diagnosis: Some(Diagnosis {
                regime: Regime::DecodeMemoryBound,
                evidence: "the TPOT median, 3.00 ms, is 1.47× the bandwidth bound".into(),
                bound: Some(DecodeBound {
                    batch: 2.0,
                    context: 210.0,
                    bytes_per_step: 2.042e9,
                    tpot_ms: 2.042,
                    output_tok_per_s: 979.4,
                    memory_ms: 2.042,
                    flops_per_step: Some(4e9),
                    compute_ms: Some(0.4),
                    binds: reports::bound::Side::Memory,
                }),
                tpot_over_bound: Some(1.47),
                throughput_over_bound: Some(0.2),
                missing: vec!["parameters and FLOP/s".into()],
                knob_flags: None,
            }),
            classes: vec![reports::classes::ClassStats {
                class: "text".into(),
                requests: 300,
                completed: 300,
                metrics: [
                    (
                        "ttft".to_string(),
                        DistStats::from_values(&(1..=100).map(f64::from).collect::<Vec<_>>()),
                    ),
                    ("tpot".to_string(), DistStats::from_values(&[7.0, 8.0, 9.0])),
                    ("e2el".to_string(), DistStats::from_values(&[400.0, 500.0])),
                ]
                .into(),
                ..Default::default()
            }],
        })),
    }
}

fn output_dir(name: &str, temp: &Path) -> PathBuf {
    match std::env::var_os("REPORTS_DEMO_OUT") {
        Some(dir) => PathBuf::from(dir).join(name),
        None => temp.join(name),
    }
}

fn check_files(md: &Path, html: &Path, expected_plots: usize) {
    let html_text = std::fs::read_to_string(html).unwrap();
    let md_text = std::fs::read_to_string(md).unwrap();
    let opened = html_text.matches("<svg").count();
    assert_eq!(opened, expected_plots, "plots in {}", html.display());
    assert_eq!(
        opened,
        html_text.matches("</svg>").count(),
        "every <svg> is closed"
    );
    assert_eq!(
        html_text.matches("<figure").count(),
        html_text.matches("</figure>").count()
    );
    assert_eq!(
        html_text.matches("<table>").count(),
        html_text.matches("</table>").count()
    );
    assert!(html_text.trim_end().ends_with("</html>"));
    for forbidden in [
        "http://", "https://", "<script", "src=", "href=", "url(", "@import",
    ] {
        let outside_text = html_text.replace("http://127.0.0.1:8000", "");
        assert!(
            !outside_text.contains(forbidden),
            "{forbidden} in {}",
            html.display()
        );
    }
    for text in [&html_text, &md_text] {
        for needle in [
            "Conditions",
            "workload",
            "schedule",
            "server",
            "hardware",
            "Metric definitions",
            "TPOT = (e − f) / (n − 1)",
        ] {
            assert!(text.contains(needle), "{needle} missing");
        }
    }
    // Every plot linked from the Markdown exists.
    let dir = md.parent().unwrap();
    let links: Vec<&str> = md_text
        .match_indices("](plots/")
        .map(|(i, _)| &md_text[i + 2..])
        .collect();
    assert_eq!(links.len(), expected_plots);
    for link in links {
        let path = &link[..link.find(')').unwrap()];
        assert!(dir.join(path).is_file(), "{path} not written");
    }
}

#[test]
fn sweep_compare_and_run_reports_are_self_contained() {
    let temp = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(11);

    let sweep = sweep_report(&mut rng);
    let (md, html) = write_report(&output_dir("sweep", temp.path()), &sweep).unwrap();
    // TTFT and TPOT vs rate, completed vs offered, throughput vs latency, 4 CDFs (TTFT, TTFA,
    // TPOT, E2E), lag histogram, and the levels' TTFT and tok/s over time.
    check_files(&md, &html, 11);
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(text.contains("Capacity plan") && text.contains("max sustainable QPS"));
    assert!(text.contains("SLO p99 500 ms") && text.contains("knee"));
    assert!(text.contains("Sweep &lt;mock&gt;"), "title is escaped");
    assert!(text.contains("Knee search") && text.contains("bracketing: halving"));
    assert!(text.contains("[3.98, 7.2] (width 80.9%)") && text.contains("ran --max-levels 2"));

    let ab = compare_report(&mut rng);
    let (md, html) = write_report(&output_dir("compare", temp.path()), &ab).unwrap();
    // 4 paired-difference histograms and 4 CDFs.
    check_files(&md, &html, 8);
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(text.contains("B slower (margin ±") && text.contains("Wilcoxon p"));

    let run = run_report(&mut rng);
    let (md, html) = write_report(&output_dir("run", temp.path()), &run).unwrap();
    // 4 CDFs, the lag histogram, the timeline's TTFT, throughput, requests and gauges, TPOT
    // and output tok/s against the roofline, and the engine's steps by kind.
    check_files(&md, &html, 12);
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(text.contains("<h2>Sessions</h2>"));
    // Each class's table beside the whole's.
    assert!(
        text.contains("<h2>By class</h2>")
            && text.contains("<td>text</td><td>300</td><td>0</td><td>50.")
    );
    assert!(text.contains("ended: capped 5, completed 120"));
    // Tool use, per-session totals and TTFT by context length.
    assert!(
        text.contains("375 of 500 answered turns that offered tools called one (400 calls in all)")
    );
    assert!(text.contains(
        "the server took 100000 of the 150000 it reported on from its prefix cache (66.7%)"
    ));
    assert!(text.contains("[0, 512)"));
    assert!(
        text.contains("<td>75.0%</td>"),
        "turn 4's prefix-cache share"
    );
    assert!(text.contains("What limited this run") && text.contains("decode-memory-bound"));
    assert!(
        text.contains("2.042 GB")
            && text.contains("1.47×")
            && text.contains("Not known: parameters")
    );
    assert!(text.contains("The run over time") && text.contains(">warm-up</text>"));
    assert!(text.contains(">cool-down</text>"));
}
