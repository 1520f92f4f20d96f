//! Sections of a matrix report: one line per row (verdict, regime, TPOT against the bound,
//! output rate, cost), each expectation with the interval that decided it, then each row's
//! question and hypothesis followed by its own run or sweep report.

use super::{fmt_ms, sections as report_sections, MatrixView, Section, Table};
use crate::matrix::{MatrixFile, MatrixRow};

/// Rows' own sections that the matrix states once for all.
const SHARED_SECTIONS: [&str; 1] = ["Metric definitions"];

pub(super) fn sections(view: &MatrixView) -> Vec<Section> {
    let mut out = vec![rows_section(&view.file), expectations_section(&view.file)];
    for (i, row) in view.file.rows.iter().enumerate() {
        let report = view.reports.get(i);
        let mut section = row_section(row);
        if let Some(Err(why)) = report.filter(|_| row.error.is_none()) {
            section.paragraphs.push(format!("No report: {why}"));
        }
        out.push(section);
        let Some(Ok(report)) = report else {
            continue;
        };
        for mut section in report_sections(report) {
            if SHARED_SECTIONS.contains(&section.heading.as_str()) {
                continue;
            }
            section.heading = format!("{}: {}", row.name, section.heading);
            for plot in &mut section.plots {
                plot.name = format!("row-{:02}-{}", i + 1, plot.name);
            }
            out.push(section);
        }
    }
    out
}

fn number(value: Option<f64>, digits: usize) -> String {
    value.map_or("–".into(), |v| format!("{v:.digits$}"))
}

fn rows_section(file: &MatrixFile) -> Section {
    let header = [
        "row",
        "load",
        "prefix",
        "verdict",
        "regime",
        "TPOT p50 (ms)",
        "bound TPOT (ms)",
        "TPOT / bound",
        "output tok/s",
        "USD / M output tokens",
    ];
    let rows = file
        .rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.load.clone(),
                r.prefix.clone(),
                if r.error.is_some() {
                    format!("{} (failed)", r.verdict)
                } else {
                    r.verdict.to_string()
                },
                r.regime.to_string(),
                fmt_ms(r.tpot_p50_ms),
                match r.bound_binds {
                    Some(side) => format!("{} ({side})", fmt_ms(r.bound_tpot_ms)),
                    None => fmt_ms(r.bound_tpot_ms),
                },
                number(r.tpot_over_bound, 2),
                number(r.output_tok_per_s, 1),
                number(r.usd_per_million_output_tokens, 3),
            ]
        })
        .collect();
    let mut paragraphs = vec![format!(
        "{} rows from {} against {}, lengths and durations scaled by {}.",
        file.rows.len(),
        file.source,
        file.server,
        file.scale
    )];
    paragraphs.push(
        "An expectation is confirmed when the whole 95% interval of what it is about satisfies \
         it, refuted when the whole interval violates it, and inconclusive otherwise; a row is \
         refuted by one refuted expectation and confirmed when all are confirmed. A knee-search \
         row is measured at its knee (the highest rate that met its SLO). A row run several \
         times (--repeats) decides each statement across its runs as well: a latency statement \
         by the Student t-interval over the runs' values, each against its own limit, and only \
         where every run's own interval agrees; any other statement where every run agrees."
            .into(),
    );
    match file.gpu_hour_usd {
        Some(price) => paragraphs.push(format!(
            "Cost at {price} USD per GPU-hour × {} GPU(s), at the output rate each row \
             sustained over its measured window.",
            file.gpus_per_instance
        )),
        None => paragraphs.push("Cost: give --gpu-hour-usd (and --gpus-per-instance).".into()),
    }
    if let Some(reason) = &file.stop_reason {
        paragraphs.push(format!("The matrix stopped early: {reason}."));
    }
    Section {
        heading: "Matrix".into(),
        paragraphs,
        tables: vec![Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows,
        }],
        ..Section::default()
    }
}

fn expectations_section(file: &MatrixFile) -> Section {
    let header = [
        "row",
        "expectation",
        "verdict",
        "observed",
        "95% interval",
        "limit",
        "why",
    ];
    let rows = file
        .rows
        .iter()
        .flat_map(|r| {
            r.expectations.iter().map(|e| {
                let interval = e.interval.map_or("–".into(), |[lo, hi]| {
                    format!("[{}, {}]", number(lo, 3), number(hi, 3))
                });
                vec![
                    r.name.clone(),
                    e.expectation.clone(),
                    e.verdict.to_string(),
                    number(e.observed, 3),
                    interval,
                    number(e.limit, 3),
                    e.reason.clone(),
                ]
            })
        })
        .collect();
    Section {
        heading: "Expectations".into(),
        paragraphs: vec![
            "Latencies in ms, capacities in requests/s; an interval's end is `–` where it lies \
             beyond the sample (or no level ran on that side of a bracket)."
                .into(),
        ],
        tables: vec![Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows,
        }],
        ..Section::default()
    }
}

fn row_section(row: &MatrixRow) -> Section {
    let or_none = |text: &str| {
        if text.is_empty() {
            "none stated".to_string()
        } else {
            text.to_string()
        }
    };
    let mut paragraphs = vec![
        format!("Question: {}", or_none(&row.question)),
        format!("Hypothesis: {}", or_none(&row.hypothesis)),
        format!(
            "Verdict: {}. Regime: {} ({}). Folder: {}.",
            row.verdict, row.regime, row.regime_evidence, row.folder
        ),
    ];
    if let Some(error) = &row.error {
        paragraphs.push(format!("The row failed: {error}"));
    }
    Section {
        heading: format!("Row {}", row.name),
        paragraphs,
        ..Section::default()
    }
}
