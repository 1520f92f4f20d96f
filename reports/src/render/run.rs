//! Sections of a single-run report.

use super::svg::{self, Chart, Series, Style};
use super::{fmt_ms, Plot, RunView, Section, Table};
use crate::metrics::{DistStats, Metrics, SloMetric};
use crate::samples::{metric_label, LatencySamples, LATENCY_METRICS};
use crate::server_metrics::{Kind, ServerView};

pub(super) fn sections(view: &RunView) -> Vec<Section> {
    let m = &view.metrics;
    let mut summary = Table {
        header: vec!["quantity".into(), "value".into()],
        rows: vec![
            vec!["completed requests".into(), m.completed.to_string()],
            vec!["failed requests".into(), m.failed.to_string()],
            vec![
                "measurement window (s)".into(),
                format!("{:.2}", m.duration_s),
            ],
            vec![
                "request throughput (req/s)".into(),
                format!("{:.3}", m.request_throughput),
            ],
            vec![
                "output throughput (tok/s)".into(),
                format!("{:.1}", m.output_throughput),
            ],
            vec![
                "total token throughput (tok/s)".into(),
                format!("{:.1}", m.total_token_throughput),
            ],
        ],
    };
    if let Some(goodput) = m.request_goodput {
        summary
            .rows
            .push(vec!["goodput (req/s)".into(), format!("{goodput:.3}")]);
    }
    if m.total_reasoning_tokens > 0 {
        let source = if m.counted_reasoning_tokens > 0 {
            " (counted from the chunks)"
        } else {
            " (from usage)"
        };
        summary.rows.push(vec![
            "reasoning output tokens".into(),
            format!(
                "{} of {}{source}",
                m.total_reasoning_tokens, m.total_output_tokens
            ),
        ]);
    }
    if m.no_answer > 0 {
        summary.rows.push(vec![
            "reasoning only, no answer (no TTFA)".into(),
            m.no_answer.to_string(),
        ]);
    }
    if m.client_bound {
        summary.rows.push(vec![
            "client-bound".into(),
            m.client_bound_reasons.join("; "),
        ]);
    }
    let distributions = [
        ("TTFT", &m.ttft),
        ("TTFA (first answer token)", &m.time_to_first_answer),
        ("TPOT", &m.tpot),
        ("E2E", &m.e2el),
        ("ITL (token-true)", &m.token_itl),
        ("Chunk-ITL", &m.chunk_itl),
        ("schedule lag", &m.schedule_lag),
    ];
    let latencies = Table {
        header: [
            "metric (ms)",
            "n",
            "mean",
            "p50 [95% CI]",
            "p90 [95% CI]",
            "p99 [95% CI]",
            "p99.9 [95% CI]",
            "max",
        ]
        .map(String::from)
        .to_vec(),
        rows: distributions
            .iter()
            .map(|(name, d)| dist_row(name, d))
            .collect(),
    };
    let sets = [("run".to_string(), &view.samples)];
    let mut plots: Vec<Plot> = LATENCY_METRICS
        .iter()
        .map(|&metric| cdf_plot(metric, &sets, "run"))
        .collect();
    plots.push(lag_histogram(
        "run-schedule-lag",
        &view.samples.schedule_lag_ms,
    ));
    let mut sections = vec![Section {
        heading: "Run summary".into(),
        tables: vec![summary, latencies],
        plots,
        ..Section::default()
    }];
    if let Some(d) = &view.diagnosis {
        let mut section = super::diagnosis::section(d);
        if let (Some(bound), Some(tpot)) = (&d.bound, (m.tpot.count > 0).then_some(m.tpot.p50)) {
            section.plots.extend(super::diagnosis_plots::roofline_plots(
                "run",
                &[super::diagnosis_plots::Observed {
                    tpot_ms: tpot,
                    output_tok_per_s: m.output_throughput,
                    bound,
                }],
            ));
        }
        if let Some(steps) = view.server.as_ref().and_then(|s| s.steps) {
            section.plots.push(super::diagnosis_plots::steps_plot(
                "run-steps",
                &[("run".into(), steps)],
            ));
        }
        sections.push(section);
    }
    sections.extend(view.timeline.as_ref().map(timeline_section));
    if !view.classes.is_empty() {
        sections.push(classes_section(m, &view.classes));
    }
    sections.extend(m.sessions.as_ref().map(sessions_section));
    sections.extend(view.server.as_ref().map(server_section));
    sections
}

/// The latency table of each class beside the whole's, with intervals.
pub(super) fn classes_section(m: &Metrics, classes: &[crate::classes::ClassStats]) -> Section {
    let row = |name: &str, requests: u64, failed: u64, d: &dyn Fn(&str) -> DistStats| {
        vec![
            name.to_string(),
            requests.to_string(),
            failed.to_string(),
            d("ttft").percentile_text(0.5, 2),
            d("ttft").percentile_text(0.9, 2),
            d("tpot").percentile_text(0.5, 2),
            d("tpot").percentile_text(0.9, 2),
            d("e2el").percentile_text(0.5, 1),
            d("e2el").percentile_text(0.9, 1),
        ]
    };
    let whole = |key: &str| match key {
        "ttft" => m.ttft,
        "tpot" => m.tpot,
        _ => m.e2el,
    };
    let mut rows = vec![row("all", m.completed + m.failed, m.failed, &whole)];
    for c in classes {
        let of = |key: &str| c.metrics.get(key).copied().unwrap_or_default();
        rows.push(row(&c.class, c.requests, c.failed, &of));
    }
    Section {
        heading: "By class".into(),
        paragraphs: vec![format!(
            "The measured requests split by their class ({} classes: a trace's model or service \
             column, a model mix's models, a session turn's kind or a prefix group, as \
             `--class-by` chose; meta.json says which), each with its latencies in ms and their \
             95% intervals, beside the whole run's. A class with few requests bounds only its \
             lower percentiles.",
            classes.len()
        )],
        tables: vec![Table {
            header: [
                "class",
                "requests",
                "failed",
                "TTFT p50 [95% CI]",
                "TTFT p90 [95% CI]",
                "TPOT p50 [95% CI]",
                "TPOT p90 [95% CI]",
                "E2E p50 [95% CI]",
                "E2E p90 [95% CI]",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        }],
        ..Section::default()
    }
}

/// The run over time: latencies, throughput, requests and the server's gauges per slice,
/// with the measurement window marked.
fn timeline_section(t: &crate::timeline::Timeline) -> Section {
    let mid = |s: &crate::timeline::Slice| (s.start_s + s.end_s) / 2.0;
    let line = |name: &str, points: Vec<(f64, f64)>| Series {
        name: name.into(),
        points,
        style: Style::Line,
        error_bars: Vec::new(),
    };
    let end = t.slices.last().map_or(0.0, |s| s.end_s);
    let mut shaded = Vec::new();
    if t.phases.warmup_s > 0.0 {
        shaded.push((0.0, t.phases.warmup_s, "warm-up".to_string()));
    }
    if let Some(cool) = t.phases.measured_end_s.filter(|&e| e < end) {
        shaded.push((cool, end, "cool-down".to_string()));
    }
    let chart = |name: &str, title: &str, y_label: &str, series: Vec<Series>| Plot {
        name: format!("run-timeline-{name}"),
        svg: svg::chart(&Chart {
            title: title.into(),
            x_label: "time since the run's start (s)".into(),
            y_label: y_label.into(),
            series,
            shaded: shaded.clone(),
            ..Chart::default()
        }),
    };
    let quantile = |f: fn(&crate::timeline::Slice) -> Option<f64>| -> Vec<(f64, f64)> {
        t.slices
            .iter()
            .filter_map(|s| f(s).map(|v| (mid(s), v)))
            .collect()
    };
    let counts = |f: fn(&crate::timeline::Slice) -> u64| -> Vec<(f64, f64)> {
        t.slices.iter().map(|s| (mid(s), f(s) as f64)).collect()
    };
    let mut plots = vec![
        chart(
            "ttft",
            "TTFT over time (requests finished in each slice)",
            "TTFT (ms)",
            vec![
                line("p50", quantile(|s| s.ttft_ms.p50)),
                line("p90", quantile(|s| s.ttft_ms.p90)),
            ],
        ),
        chart(
            "throughput",
            "Output tokens per second over time",
            "tok/s",
            vec![line(
                "output tok/s",
                t.slices
                    .iter()
                    .map(|s| (mid(s), s.output_tok_per_s))
                    .collect(),
            )],
        ),
        chart(
            "requests",
            "Requests started, finished and failed per slice",
            "requests",
            vec![
                line("started", counts(|s| s.started)),
                line("finished", counts(|s| s.finished)),
                line("errors", counts(|s| s.errors)),
            ],
        ),
    ];
    let gauges: std::collections::BTreeSet<&String> =
        t.slices.iter().flat_map(|s| s.server.keys()).collect();
    if !gauges.is_empty() {
        let series = gauges
            .iter()
            .map(|label| {
                let points = t
                    .slices
                    .iter()
                    .filter_map(|s| s.server.get(*label).map(|v| (mid(s), *v)))
                    .collect();
                line(label, points)
            })
            .collect();
        plots.push(chart(
            "server",
            "The server's gauges over time",
            "value",
            series,
        ));
    }
    Section {
        heading: "The run over time".into(),
        paragraphs: vec![format!(
            "{} slices of {:.2} s from the run's start (timeline.json); a request counts in the \
             slice where it finished, its tokens where they arrived. Warm-up and cool-down are \
             shaded: a queue building up, a warm-up inside the window or a server stall shows \
             here.",
            t.slices.len(),
            t.slice_s
        )],
        plots,
        ..Section::default()
    }
}

/// Multi-turn sessions: how many, how they ended, each turn index's numbers, per-session
/// totals, tool use and TTFT by context length.
fn sessions_section(s: &crate::sessions::SessionStats) -> Section {
    let ended: Vec<String> = s.ended.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let by_turn = Table {
        header: [
            "turn",
            "ok",
            "failed",
            "TTFT p50 [95% CI]",
            "TTFT p90 [95% CI]",
            "E2E p50 [95% CI]",
            "prompt tokens (mean, history included)",
            "prompt tokens from prefix cache",
        ]
        .map(String::from)
        .to_vec(),
        rows: s
            .by_turn
            .iter()
            .map(|t| {
                vec![
                    t.turn.to_string(),
                    t.completed.to_string(),
                    t.failed.to_string(),
                    t.ttft.percentile_text(0.5, 2),
                    t.ttft.percentile_text(0.9, 2),
                    t.e2el.percentile_text(0.5, 2),
                    format!("{:.0}", t.prompt_tokens_mean),
                    t.cached_share
                        .map_or("not reported".into(), |c| format!("{:.1}%", c * 100.0)),
                ]
            })
            .collect(),
    };
    let mut paragraphs = vec![format!(
        "{} sessions started in the measurement window ({:.3} sessions/s, {:.2} requests \
         each); ended: {}. Each later turn carries the conversation so far (the history and \
         the server's answers, or a trace's recorded prompt), so its prompt grows and a server \
         with a prefix cache serves the shared part from it.",
        s.sessions,
        s.session_rate,
        s.requests_per_session,
        ended.join(", ")
    )];
    if let Some(t) = &s.tools {
        paragraphs.push(format!(
            "Tools: {} of {} answered turns that offered tools called one ({} calls in all); \
             {} sessions failed on a call the client could not run.",
            t.turns_with_calls, t.turns, t.calls, t.unusable_calls
        ));
    }
    let mut tables = vec![by_turn];
    if let Some(p) = &s.per_session {
        paragraphs.push(format!(
            "Per session, over the {} that completed or were capped: end to end from the first \
             turn's scheduled send to the last answer's end, the time in the server (the turns' \
             send-to-end times) and the time waiting between turns ({}), in ms. They sent {} \
             prompt tokens in all; {}.",
            p.sessions,
            if s.tools.is_some() { "the tools' latency" } else { "think time" },
            p.prompt_tokens,
            match p.cached_tokens {
                Some((cached, of)) if of > 0 => format!(
                    "the server took {cached} of the {of} it reported on from its prefix cache ({:.1}%)",
                    100.0 * cached as f64 / of as f64
                ),
                _ => "the server did not report cached tokens".into(),
            }
        ));
        tables.push(Table {
            header: ["per session (ms)", "mean", "p50 [95% CI]", "p90 [95% CI]"]
                .map(String::from)
                .to_vec(),
            rows: [
                ("end to end", &p.e2e),
                ("in the server", &p.server),
                ("waiting", &p.waiting),
            ]
            .iter()
            .map(|(name, d)| {
                vec![
                    name.to_string(),
                    format!("{:.1}", d.mean),
                    d.percentile_text(0.5, 1),
                    d.percentile_text(0.9, 1),
                ]
            })
            .collect(),
        });
    }
    if !s.ttft_by_context.is_empty() {
        paragraphs.push(
            "TTFT against the context length: each measured turn by its prompt (history \
             included); with prefix caching the history costs little and TTFT grows slowly."
                .into(),
        );
        tables.push(Table {
            header: [
                "prompt tokens",
                "turns",
                "TTFT p50 [95% CI]",
                "TTFT p90 [95% CI]",
                "from prefix cache",
            ]
            .map(String::from)
            .to_vec(),
            rows: s
                .ttft_by_context
                .iter()
                .map(|b| {
                    vec![
                        format!("[{}, {})", b.from, b.to),
                        b.ttft.count.to_string(),
                        b.ttft.percentile_text(0.5, 2),
                        b.ttft.percentile_text(0.9, 2),
                        b.cached_share
                            .map_or("not reported".into(), |c| format!("{:.1}%", c * 100.0)),
                    ]
                })
                .collect(),
        });
    }
    Section {
        heading: "Sessions".into(),
        paragraphs,
        tables,
        ..Section::default()
    }
}

/// The server's own view of the run, from its `/metrics`.
pub(super) fn server_section(server: &ServerView) -> Section {
    let mut paragraphs = vec![format!(
        "What the server reported on its /metrics: {} scrapes over {:.1} s (warm-up included). \
         Gauges: first, mean, max and last value; counters: their increase over the run.",
        server.scrapes, server.span_s
    )];
    if let Some(w) = &server.window_prefix_cache {
        paragraphs.push(format!(
            "Prefix-cache hit rate over the measurement window (warm-up excluded): {:.1}%, from \
             {} between scrapes {:.1} s apart.",
            w.rate * 100.0,
            w.source,
            (w.to_unix_ms - w.from_unix_ms) / 1000.0
        ));
    }
    if let Some(busy) = server.busy_share() {
        paragraphs.push(format!(
            "The engine was in steps {:.0}% of the scraped span (engine:busy_seconds_total).",
            busy * 100.0
        ));
    }
    if let Some(st) = &server.steps {
        paragraphs.push(format!(
            "Its steps: {:.0} decode-only ({:.1} s, {} each), {:.0} mixed with prefill chunks \
             ({:.1} s, {} each), {:.0} prefill-only ({:.1} s); prefill took about {} of the \
             time in steps (the prefill-only steps and what the mixed ones took beyond as many \
             decode-only steps).",
            st.decode_only.steps,
            st.decode_only.seconds,
            fmt_ms(st.decode_only.mean_ms()),
            st.mixed.steps,
            st.mixed.seconds,
            fmt_ms(st.mixed.mean_ms()),
            st.prefill_only.steps,
            st.prefill_only.seconds,
            st.prefill_share()
                .map_or("–".to_string(), |p| format!("{:.0}%", p * 100.0)),
        ));
    }
    if !server.other_names.is_empty() {
        paragraphs.push(format!(
            "No metric under a known name; found: {}.",
            server.other_names.join(", ")
        ));
    }
    let number = |v: f64| {
        if v.fract() == 0.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.3}")
        }
    };
    let rows = server
        .quantities
        .iter()
        .map(|q| match q.kind {
            Kind::Gauge => vec![
                q.label.clone(),
                q.name.clone(),
                number(q.first),
                number(q.mean),
                number(q.max),
                number(q.last),
            ],
            Kind::Counter => vec![
                q.label.clone(),
                q.name.clone(),
                format!("+{}", number(q.last - q.first)),
                "–".into(),
                "–".into(),
                number(q.last),
            ],
        })
        .collect();
    Section {
        heading: "Server's view".into(),
        paragraphs,
        tables: vec![Table {
            header: [
                "quantity",
                "server metric",
                "first (counter: increase)",
                "mean",
                "max",
                "last",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        }],
        ..Section::default()
    }
}

fn dist_row(name: &str, d: &DistStats) -> Vec<String> {
    let mut row = vec![name.to_string(), d.count.to_string(), fmt_ms(Some(d.mean))];
    row.extend([0.5, 0.9, 0.99, 0.999].map(|q| d.percentile_text(q, 2)));
    row.push(fmt_ms(Some(d.max)));
    row
}

/// CDF of `metric` for each labelled sample set.
pub(super) fn cdf_plot(
    metric: SloMetric,
    sets: &[(String, &LatencySamples)],
    prefix: &str,
) -> Plot {
    let label = metric_label(metric);
    let series = sets
        .iter()
        .map(|(name, samples)| Series {
            name: name.clone(),
            points: svg::cdf_points(&samples.values(metric), 400),
            style: Style::Line,
            error_bars: Vec::new(),
        })
        .collect();
    Plot {
        name: format!("{prefix}-cdf-{}", label.to_lowercase()),
        svg: svg::chart(&Chart {
            title: format!("{label} CDF"),
            x_label: format!("{label} (ms)"),
            y_label: "fraction of requests ≤ x".into(),
            series,
            ..Chart::default()
        }),
    }
}

pub(super) fn lag_histogram(name: &str, lag_ms: &[f64]) -> Plot {
    Plot {
        name: name.into(),
        svg: svg::histogram(
            "Schedule lag (actual − scheduled send)",
            "lag (ms)",
            lag_ms,
            40,
            None,
        ),
    }
}
