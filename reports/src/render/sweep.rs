//! Sections of a sweep report: levels, SLO, capacity plan and the rate plots.

use super::run::{cdf_plot, lag_histogram};
use super::svg::{self, Chart, Marker, Series, Style};
use super::{fmt_ms, Plot, Section, SweepView, Table};
use crate::capacity::{CapacityPlan, SweepLevel};
use crate::metrics::SloMetric;
use crate::metrics::PERCENTILE_CI_LEVEL;
use crate::samples::{metric_label, LATENCY_METRICS};
use crate::search::SearchPath;
use crate::server_metrics::QuantityView;
use crate::stats::{min_sample_for_quantile, percentile_nearest_rank, quantile_ci};

pub(super) fn sections(view: &SweepView) -> Vec<Section> {
    let mut levels: Vec<&SweepLevel> = view.levels.iter().collect();
    levels.sort_by(|a, b| a.offered_rate.total_cmp(&b.offered_rate));
    let knee = view
        .plan
        .as_ref()
        .and_then(|p| p.max_sustainable)
        .map(|m| m.offered_rate);
    let mut out = vec![levels_section(view, &levels)];
    out.extend(regimes_section(&levels));
    if let Some(search) = &view.search {
        out.push(search_section(search));
    }
    if let Some(plan) = &view.plan {
        out.push(plan_section(plan));
    }
    let mut plots: Vec<Plot> = [SloMetric::Ttft, SloMetric::Tpot]
        .iter()
        .map(|&metric| percentile_vs_rate(view, &levels, metric, knee))
        .collect();
    plots.push(completed_vs_offered(&levels, knee));
    plots.push(throughput_vs_latency(&levels));
    let sets: Vec<(String, &crate::samples::LatencySamples)> = levels
        .iter()
        .map(|l| (format!("{} req/s", rate(l.offered_rate)), &l.samples))
        .collect();
    plots.extend(LATENCY_METRICS.iter().map(|&m| cdf_plot(m, &sets, "sweep")));
    let lag: Vec<f64> = levels
        .iter()
        .flat_map(|l| l.samples.schedule_lag_ms.iter().copied())
        .collect();
    plots.push(lag_histogram("sweep-schedule-lag", &lag));
    plots.extend(levels_over_time(&levels));
    out.push(Section {
        heading: "Plots".into(),
        paragraphs: vec![
            "Dashed horizontal lines: SLO limits. Dotted vertical line: the knee (max sustainable QPS)."
                .into(),
        ],
        plots,
        ..Section::default()
    });
    out
}

/// Each level's TTFT p90 and output tok/s over its own time, one series a level (from the
/// levels' `timeline.json`): a level whose latency climbs from slice to slice was building a
/// queue, whatever its averages say.
fn levels_over_time(levels: &[&SweepLevel]) -> Vec<Plot> {
    let timed: Vec<(&SweepLevel, &crate::timeline::Timeline)> = levels
        .iter()
        .filter_map(|l| l.timeline.as_ref().map(|t| (*l, t)))
        .collect();
    if timed.is_empty() {
        return Vec::new();
    }
    let series = |value: fn(&crate::timeline::Slice) -> Option<f64>| -> Vec<Series> {
        timed
            .iter()
            .map(|(level, t)| Series {
                name: format!("{} req/s", rate(level.offered_rate)),
                points: t
                    .slices
                    .iter()
                    .filter_map(|s| value(s).map(|v| ((s.start_s + s.end_s) / 2.0, v)))
                    .collect(),
                style: Style::Line,
                error_bars: Vec::new(),
            })
            .collect()
    };
    let chart = |name: &str, title: &str, y_label: &str, series: Vec<Series>| Plot {
        name: format!("sweep-timeline-{name}"),
        svg: svg::chart(&Chart {
            title: title.into(),
            x_label: "time since the level's start (s)".into(),
            y_label: y_label.into(),
            series,
            ..Chart::default()
        }),
    };
    vec![
        chart(
            "ttft",
            "TTFT p90 over each level's time",
            "TTFT p90 (ms)",
            series(|s| s.ttft_ms.p90),
        ),
        chart(
            "throughput",
            "Output tok/s over each level's time",
            "tok/s",
            series(|s| Some(s.output_tok_per_s)),
        ),
    ]
}

fn rate(r: f64) -> String {
    let s = format!("{r:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn levels_section(view: &SweepView, levels: &[&SweepLevel]) -> Section {
    let mut header: Vec<String> = [
        "offered (req/s)",
        "scheduled (req/s)",
        "completed (req/s)",
        "output (tok/s)",
        "n",
    ]
    .map(String::from)
    .to_vec();
    // The tail shown is the SLO's percentile (p99 without an SLO).
    let tail = view
        .slo
        .as_ref()
        .map(|s| s.targets.iter().map(|t| t.percentile).fold(0.0, f64::max))
        .filter(|p| *p > 0.0)
        .unwrap_or(99.0);
    for metric in LATENCY_METRICS {
        let label = metric_label(metric);
        header.push(format!("{label} p50 (ms)"));
        header.push(format!("{label} p{tail} (ms)"));
    }
    let scraped = levels.iter().any(|l| l.server.is_some());
    if scraped {
        for h in [
            "server running (mean)",
            "server waiting (max)",
            "server KV usage (max)",
        ] {
            header.push(h.into());
        }
    }
    header.push("saturated".into());
    if view.slo.is_some() {
        header.push("meets SLO".into());
    }
    let rows = levels
        .iter()
        .map(|level| {
            let mut row = vec![
                rate(level.offered_rate),
                level
                    .scheduled_rate
                    .map_or("–".into(), |r| format!("{r:.3}")),
                format!("{:.3}", level.completed_rate),
                format!("{:.1}", level.output_tokens_per_s),
                level.samples.requests.len().to_string(),
            ];
            for metric in LATENCY_METRICS {
                let values = level.samples.values(metric);
                row.push(percentile_cell(&values, 50.0));
                row.push(percentile_cell(&values, tail));
            }
            if scraped {
                let server = level.server.as_ref();
                let get = |label: &str, f: fn(&QuantityView) -> f64| {
                    server
                        .and_then(|v| v.get(label))
                        .map_or("–".to_string(), |q| format!("{:.2}", f(q)))
                };
                row.push(get("requests running", |q| q.mean));
                row.push(get("requests waiting", |q| q.max));
                row.push(get("KV-cache usage (fraction)", |q| q.max));
            }
            let saturated = if level.saturated { "yes" } else { "no" };
            row.push(match &level.saturation_rule {
                Some(rule) => format!("{saturated}: {rule}"),
                None => saturated.into(),
            });
            if let Some(slo) = &view.slo {
                let verdict = slo.check(&level.samples).verdict;
                row.push(match (verdict, level.saturated) {
                    (crate::slo::SloVerdict::Met, true) => "no (saturated)".into(),
                    (verdict, _) => verdict.to_string(),
                });
            }
            row
        })
        .collect();
    let mut paragraphs = vec![
        format!("{} levels, sorted by offered rate.", levels.len()),
        crate::rates::DEFINITIONS.to_string(),
    ];
    if let Some(slo) = &view.slo {
        paragraphs.push(format!(
            "SLO: {slo}. A level meets it when every target holds and it did not saturate \
             (the saturated column gives the rule that decided)."
        ));
    }
    Section {
        heading: "Sweep levels".into(),
        paragraphs,
        tables: vec![Table { header, rows }],
        ..Section::default()
    }
}

/// What limited each level (its diagnosis), when the levels were diagnosed.
fn regimes_section(levels: &[&SweepLevel]) -> Option<Section> {
    let rows: Vec<Vec<String>> = levels
        .iter()
        .filter_map(|l| {
            let d = l.diagnosis.as_ref()?;
            Some(vec![
                rate(l.offered_rate),
                d.regime.to_string(),
                d.tpot_over_bound.map_or("–".into(), |r| format!("{r:.2}×")),
                d.evidence.clone(),
            ])
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    let observed: Vec<super::diagnosis_plots::Observed> = levels
        .iter()
        .filter_map(|l| {
            let bound = l.diagnosis.as_ref()?.bound.as_ref()?;
            let tpot = crate::stats::median(&l.samples.values(crate::metrics::SloMetric::Tpot))?;
            Some(super::diagnosis_plots::Observed {
                tpot_ms: tpot,
                output_tok_per_s: l.output_tokens_per_s,
                bound,
            })
        })
        .collect();
    let mut plots = Vec::new();
    if !observed.is_empty() {
        plots.extend(super::diagnosis_plots::roofline_plots("sweep", &observed));
    }
    let steps: Vec<(String, crate::server_metrics::StepBreakdown)> = levels
        .iter()
        .filter_map(|l| Some((rate(l.offered_rate), l.server.as_ref()?.steps?)))
        .collect();
    if !steps.is_empty() {
        plots.push(super::diagnosis_plots::steps_plot("sweep-steps", &steps));
    }
    Some(Section {
        heading: "What limited each level".into(),
        plots,
        paragraphs: vec![
            "Each level's regime (see the run reports' definitions) with the numbers that decided \
             it; TPOT / bound: the observed TPOT median over the roofline (the larger of bytes / \
             bandwidth and FLOPs / compute) at the level's batch and context. The plots set each \
             level's TPOT and output tok/s beside both sides at its batch, and, where the engine \
             exports its steps, its time in steps by kind (offered req/s per bar)."
                .into(),
        ],
        tables: vec![Table {
            header: ["offered (req/s)", "regime", "TPOT / bound", "evidence"]
                .map(String::from)
                .to_vec(),
            rows,
        }],
    })
}

/// The knee search's path: each level in the order run, why its rate, its verdict and the
/// bracket after it.
fn search_section(search: &SearchPath) -> Section {
    let rows = search
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            vec![
                (i + 1).to_string(),
                step.dir.clone(),
                rate(step.offered_rate),
                step.reason.to_string(),
                step.verdict.to_string(),
                rate(step.sustained_rate),
                step.bracket.to_string(),
            ]
        })
        .collect();
    let mut paragraphs = vec![format!(
        "Bracket the SLO crossing with a level that meets the SLO and one that does not \
         (halving or doubling from the probe's estimate, {} req/s, within {}–{} req/s), then \
         bisect at the geometric mid-point until the upper end is within {:.0}% of the lower, \
         at most {} levels. A saturated level counts as not meeting the SLO; an unknown one is \
         re-run once with twice the requests and is never an end. The lower end is the passing \
         level's sustained rate; the upper end the failing level's sustained rate (its offered \
         rate when it sustained no more than the lower end).",
        rate(search.start_rate),
        rate(search.min_rate),
        rate(search.max_rate),
        search.precision * 100.0,
        search.max_levels
    )];
    paragraphs.push(match &search.end_reason {
        Some(reason) => format!("The search ended: {reason}."),
        None => "The search did not end (cut short).".into(),
    });
    Section {
        heading: "Knee search".into(),
        paragraphs,
        tables: vec![Table {
            header: [
                "#",
                "level",
                "offered (req/s)",
                "why this rate",
                "verdict",
                "sustained (req/s)",
                "bracket after (req/s)",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        }],
        ..Section::default()
    }
}

pub(super) fn plan_section(plan: &CapacityPlan) -> Section {
    let mut rows = Vec::new();
    if let Some(max) = plan.max_sustainable {
        rows.push(vec![
            "max sustainable QPS (highest level meeting the SLO, the rate it sustained)".into(),
            format!(
                "{} req/s sustained ({} req/s offered; {:.1} output tok/s); the plan sizes from \
                 the sustained rate",
                rate(max.sustained_rate),
                rate(max.offered_rate),
                max.output_tokens_per_s
            ),
        ]);
    }
    if let Some(c) = plan.crossing {
        rows.push(vec![
            "interpolated crossing".into(),
            format!(
                "{:.3} req/s ({:.0}% CI {:.3}–{:.3}, bootstrap of the boundary levels: one \
                 run's sampling error)",
                c.estimate,
                c.confidence * 100.0,
                c.lower,
                c.upper
            ),
        ]);
    }
    if let Some(c) = plan.crossing_between_runs {
        rows.push(vec![
            "crossing between runs".into(),
            format!(
                "{:.3} req/s ({:.0}% Student t-interval {:.3}–{:.3} over the runs' crossings \
                 {}: the variation from run to run included)",
                c.estimate,
                c.confidence * 100.0,
                c.lower,
                c.upper,
                plan.run_crossings_text()
            ),
        ]);
    }
    if let Some(s) = &plan.sizing {
        rows.push(vec![
            "sized from".into(),
            format!(
                "{} req/s per instance: {}",
                rate(s.capacity_per_instance),
                s.sized_from
            ),
        ]);
        rows.push(vec![
            "target load".into(),
            format!("{:.3} req/s", s.target_qps),
        ]);
        rows.push(vec![
            "instances".into(),
            format!(
                "{} (= ⌈target × headroom {} / capacity per instance⌉)",
                s.instances, s.headroom
            ),
        ]);
        rows.push(vec![
            "GPUs".into(),
            format!("{} ({} per instance)", s.gpus, s.gpus_per_instance),
        ]);
        if let Some(cost) = s.cost {
            rows.push(vec![
                "cost per million output tokens at capacity".into(),
                format!(
                    "${:.4} (at ${}/GPU-hour)",
                    cost.usd_per_million_output_tokens_at_capacity, cost.gpu_hour_usd
                ),
            ]);
            rows.push(vec![
                "fleet cost".into(),
                format!(
                    "${:.2}/hour; ${:.4} per million output tokens at the target load",
                    cost.fleet_usd_per_hour, cost.usd_per_million_output_tokens_at_target
                ),
            ]);
        }
    }
    Section {
        heading: "Capacity plan".into(),
        paragraphs: plan.notes.clone(),
        tables: if rows.is_empty() {
            Vec::new()
        } else {
            vec![Table {
                header: vec!["quantity".into(), "value".into()],
                rows,
            }]
        },
        ..Section::default()
    }
}

fn knee_marker(knee: Option<f64>) -> Vec<Marker> {
    knee.map(|value| Marker {
        value,
        label: format!("knee {} req/s", rate(value)),
    })
    .into_iter()
    .collect()
}

/// A level's percentile for the table: the value, or "too few (n < needed)" when the level's
/// requests cannot bound it from above (the value would be the maximum, not the percentile).
fn percentile_cell(values: &[f64], p: f64) -> String {
    let needed = min_sample_for_quantile(p / 100.0, PERCENTILE_CI_LEVEL);
    if !values.is_empty() && (values.len() as u64) < needed {
        return format!("too few ({} < {needed})", values.len());
    }
    fmt_ms(percentile_nearest_rank(values, p))
}

/// The 95% order-statistic interval of a level's p-th percentile, as an error bar.
fn percentile_bar(values: &[f64], p: f64) -> (Option<f64>, Option<f64>) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let ci = quantile_ci(&sorted, p / 100.0, PERCENTILE_CI_LEVEL);
    (ci.lower, ci.upper)
}

fn percentile_vs_rate(
    view: &SweepView,
    levels: &[&SweepLevel],
    metric: SloMetric,
    knee: Option<f64>,
) -> Plot {
    let label = metric_label(metric);
    let series = [50.0, 99.0]
        .iter()
        .map(|&p| Series {
            name: format!("{label} p{p}"),
            points: levels
                .iter()
                .filter_map(|l| {
                    Some((
                        l.offered_rate,
                        percentile_nearest_rank(&l.samples.values(metric), p)?,
                    ))
                })
                .collect(),
            style: Style::LinePoints,
            error_bars: levels
                .iter()
                .filter(|l| !l.samples.requests.is_empty())
                .map(|l| {
                    let (low, high) = percentile_bar(&l.samples.values(metric), p);
                    (l.offered_rate, low, high)
                })
                .collect(),
        })
        .collect();
    let h_markers = view
        .slo
        .iter()
        .flat_map(|s| &s.targets)
        .filter(|t| t.metric == metric)
        .map(|t| Marker {
            value: t.limit_ms,
            label: format!("SLO p{} {} ms", t.percentile, t.limit_ms),
        })
        .collect();
    Plot {
        name: format!("sweep-{}-vs-rate", label.to_lowercase()),
        svg: svg::chart(&Chart {
            title: format!("{label} p50 and p99 vs offered rate (95% CI bars)"),
            x_label: "offered rate (req/s)".into(),
            y_label: format!("{label} (ms)"),
            series,
            h_markers,
            v_markers: knee_marker(knee),
            shaded: Vec::new(),
        }),
    }
}

fn completed_vs_offered(levels: &[&SweepLevel], knee: Option<f64>) -> Plot {
    let offered: Vec<(f64, f64)> = levels
        .iter()
        .map(|l| (l.offered_rate, l.offered_rate))
        .collect();
    Plot {
        name: "sweep-completed-vs-offered".into(),
        svg: svg::chart(&Chart {
            title: "Completed vs offered rate".into(),
            x_label: "offered rate (req/s)".into(),
            y_label: "completed rate (req/s)".into(),
            series: vec![
                Series {
                    name: "completed".into(),
                    points: levels
                        .iter()
                        .map(|l| (l.offered_rate, l.completed_rate))
                        .collect(),
                    style: Style::LinePoints,
                    error_bars: Vec::new(),
                },
                Series {
                    name: "completed = offered".into(),
                    points: offered,
                    style: Style::DashedLine,
                    error_bars: Vec::new(),
                },
            ],
            v_markers: knee_marker(knee),
            ..Chart::default()
        }),
    }
}

fn throughput_vs_latency(levels: &[&SweepLevel]) -> Plot {
    let series = [50.0, 99.0]
        .iter()
        .map(|&p| Series {
            name: format!("E2E p{p}"),
            points: levels
                .iter()
                .filter_map(|l| {
                    let v = percentile_nearest_rank(&l.samples.values(SloMetric::E2el), p)?;
                    Some((l.output_tokens_per_s, v))
                })
                .collect(),
            style: Style::LinePoints,
            error_bars: Vec::new(),
        })
        .collect();
    Plot {
        name: "sweep-throughput-vs-latency".into(),
        svg: svg::chart(&Chart {
            title: "Output throughput vs E2E latency".into(),
            x_label: "output throughput (tok/s)".into(),
            y_label: "E2E (ms)".into(),
            series,
            ..Chart::default()
        }),
    }
}
