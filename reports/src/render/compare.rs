//! Sections of an A/B comparison report: verdict table, CDFs and paired differences.

use super::run::cdf_plot;
use super::svg::{self, Marker};
use super::{fmt_ms, fmt_p, CompareView, Plot, Section, Table};
use crate::ab::{MetricVerdict, Pairing};
use crate::latency::DistStats;
use crate::metrics::SloMetric;
use crate::samples::{metric_label, LatencySamples, LATENCY_METRICS};
use crate::stats::{ConfidenceInterval, PMethod};

pub(super) fn sections(view: &CompareView) -> Vec<Section> {
    let analysis = &view.analysis;
    let paired = analysis.pairing == Pairing::Paired;
    let mut paragraphs = vec![
        analysis.headline(&view.b_label),
        format!("A = {}; B = {}.", view.a_label, view.b_label),
    ];
    paragraphs.extend(analysis.notes.iter().cloned());
    let header = [
        "metric",
        "n A / B",
        "median A (ms)",
        "median B (ms)",
        "median B/A [95% CI]",
        "p99 A (ms)",
        "p99 B (ms)",
        "p99 B/A [95% CI]",
        if paired {
            "Wilcoxon p"
        } else {
            "Mann–Whitney p"
        },
        "Holm p",
        "Welch p (round p99s, Holm)",
        "verdict",
    ]
    .map(String::from)
    .to_vec();
    let rows = analysis.metrics.iter().map(verdict_row).collect();
    let mut plots: Vec<Plot> = Vec::new();
    if paired {
        plots.extend(analysis.metrics.iter().map(difference_histogram));
    }
    let sets = [("A".to_string(), &view.a), ("B".to_string(), &view.b)];
    plots.extend(
        LATENCY_METRICS
            .iter()
            .map(|&m| cdf_plot(m, &sets, "compare")),
    );
    let mut sections = vec![
        Section {
            heading: "A/B verdict".into(),
            paragraphs,
            tables: vec![Table { header, rows }],
            ..Section::default()
        },
        Section {
            heading: "Plots".into(),
            plots,
            ..Section::default()
        },
    ];
    sections.extend(classes_section(view));
    sections
}

fn ci(value: Option<ConfidenceInterval>) -> String {
    match value {
        None => "–".into(),
        Some(c) => format!("{:.3} [{:.3}, {:.3}]", c.estimate, c.lower, c.upper),
    }
}

fn verdict_row(v: &MetricVerdict) -> Vec<String> {
    let test_p = v.rank_test.map(|t| {
        let method = match t.method {
            PMethod::Exact => "exact",
            PMethod::Normal => "normal approx.",
        };
        format!("{} ({method})", fmt_p(Some(t.p_value)))
    });
    vec![
        metric_label(v.metric).into(),
        format!("{} / {}", v.n_a, v.n_b),
        fmt_ms(v.median_a),
        fmt_ms(v.median_b),
        ci(v.median_ratio),
        fmt_ms(v.p99_a),
        fmt_ms(v.p99_b),
        ci(v.p99_ratio),
        test_p.unwrap_or_else(|| "–".into()),
        fmt_p(v.p_adjusted),
        match v.welch {
            Some(w) => format!("{} ({})", fmt_p(Some(w.p_value)), fmt_p(v.welch_p_adjusted)),
            None => "– (needs ≥ 2 rounds per side)".into(),
        },
        v.verdict_text(),
    ]
}

fn difference_histogram(v: &MetricVerdict) -> Plot {
    let label = metric_label(v.metric);
    Plot {
        name: format!("compare-diff-{}", label.to_lowercase()),
        svg: svg::histogram(
            &format!("{label}: paired differences B − A ({})", v.verdict),
            &format!("{label} B − A (ms)"),
            &v.differences,
            40,
            Some(Marker {
                value: 0.0,
                label: "no difference".into(),
            }),
        ),
    }
}

/// Each class's latencies on each side beside both wholes, with their intervals (empty
/// without classes).
fn classes_section(view: &CompareView) -> Option<Section> {
    if view.a_classes.is_empty() && view.b_classes.is_empty() {
        return None;
    }
    let cells = |name: &str, side: &str, requests: usize, d: &dyn Fn(SloMetric) -> DistStats| {
        vec![
            name.to_string(),
            side.to_string(),
            requests.to_string(),
            d(SloMetric::Ttft).percentile_text(0.5, 2),
            d(SloMetric::Ttft).percentile_text(0.9, 2),
            d(SloMetric::Tpot).percentile_text(0.5, 2),
            d(SloMetric::Tpot).percentile_text(0.9, 2),
            d(SloMetric::E2el).percentile_text(0.5, 1),
        ]
    };
    let (a, b): (&LatencySamples, &LatencySamples) = (&view.a, &view.b);
    let whole_a = |m: SloMetric| DistStats::from_values(&a.values(m));
    let whole_b = |m: SloMetric| DistStats::from_values(&b.values(m));
    let mut rows = vec![
        cells("all", "A", view.a_requests, &whole_a),
        cells("all", "B", view.b_requests, &whole_b),
    ];
    let mut names: Vec<&str> = view
        .a_classes
        .iter()
        .chain(&view.b_classes)
        .map(|c| c.class.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        for (side, classes) in [("A", &view.a_classes), ("B", &view.b_classes)] {
            let Some(c) = classes.iter().find(|c| c.class == name) else {
                rows.push(vec![name.to_string(), side.to_string(), "0".into()]);
                continue;
            };
            let key = |m: SloMetric| match m {
                SloMetric::Ttft => "ttft",
                SloMetric::TimeToFirstAnswer => "time_to_first_answer",
                SloMetric::Tpot => "tpot",
                SloMetric::E2el => "e2el",
            };
            let of = |m: SloMetric| c.metrics.get(key(m)).copied().unwrap_or_default();
            rows.push(cells(name, side, c.requests as usize, &of));
        }
    }
    Some(Section {
        heading: "By class".into(),
        paragraphs: vec![
            "Each side's successful requests split by class, their latencies in ms with 95% \
             intervals, beside each whole; the verdicts above are over the whole."
                .into(),
        ],
        tables: vec![Table {
            header: [
                "class",
                "side",
                "requests",
                "TTFT p50 [95% CI]",
                "TTFT p90 [95% CI]",
                "TPOT p50 [95% CI]",
                "TPOT p90 [95% CI]",
                "E2E p50 [95% CI]",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        }],
        ..Section::default()
    })
}
