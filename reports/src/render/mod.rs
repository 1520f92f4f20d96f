//! Reports people can read: `report.md` and a self-contained `report.html` (inline SVG plots,
//! no scripts, no network) for a run, a sweep (with its capacity plan), an A/B comparison or
//! a tune.
//! Every page states the conditions (workload, schedule, server, hardware) and the metric
//! definitions used.
//!
//! The views are turned into [`Section`]s once; the Markdown and HTML writers only lay them out.

mod compare;
mod diagnosis;
mod diagnosis_plots;
mod html;
mod markdown;
mod matrix;
mod run;
pub mod svg;
mod sweep;
mod tune;
pub mod views;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::ab::AbReport;
use crate::capacity::{CapacityPlan, SweepLevel};
use crate::metrics::Metrics;
use crate::samples::LatencySamples;
use crate::server_metrics::ServerView;
use crate::slo::SloSpec;

pub use crate::conditions::Conditions;
pub use html::render_html;
pub use markdown::render_markdown;

/// One run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunView {
    pub metrics: Metrics,
    pub samples: LatencySamples,
    /// The server's own view (its `/metrics`), when it exposes one.
    pub server: Option<ServerView>,
    /// The run over time (`timeline.json`), when the folder has one.
    pub timeline: Option<crate::timeline::Timeline>,
    /// What limited the run, when diagnosed.
    pub diagnosis: Option<crate::diagnosis::Diagnosis>,
    /// Results by class (`--class-by`), when the requests have classes.
    pub classes: Vec<crate::classes::ClassStats>,
}

/// A sweep, with its SLO and capacity plan when given.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepView {
    pub levels: Vec<SweepLevel>,
    pub slo: Option<SloSpec>,
    pub plan: Option<CapacityPlan>,
    /// The knee search's path, for `--rates search`.
    pub search: Option<crate::search::SearchPath>,
}

/// An A/B comparison: the pooled samples of each side and the analysis.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareView {
    pub a_label: String,
    pub b_label: String,
    pub a: LatencySamples,
    pub b: LatencySamples,
    pub analysis: AbReport,
    /// Each side's results by class, over its pooled rounds (empty without classes).
    pub a_classes: Vec<crate::classes::ClassStats>,
    pub b_classes: Vec<crate::classes::ClassStats>,
    /// Each side's measured requests, failed ones included.
    pub a_requests: usize,
    pub b_requests: usize,
}

/// A matrix: `matrix.json` and each row's own report, or why it has none.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixView {
    pub file: crate::matrix::MatrixFile,
    pub reports: Vec<Result<Report, String>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ReportBody {
    /// Boxed: the run metrics dwarf the other variants.
    Run(Box<RunView>),
    Sweep(SweepView),
    Compare(CompareView),
    Tune(Box<crate::tune::TuneFile>),
    Matrix(Box<MatrixView>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub title: String,
    pub conditions: Conditions,
    pub body: ReportBody,
}

/// A titled block of paragraphs, tables and plots, shared by both writers.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Section {
    pub heading: String,
    pub paragraphs: Vec<String>,
    pub tables: Vec<Table>,
    pub plots: Vec<Plot>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// An SVG plot; `name` is its file stem under `plots/`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plot {
    pub name: String,
    pub svg: String,
}

/// How the metrics are defined (docs/ARCHITECTURE.md, "Metric definitions").
const METRIC_DEFINITIONS: [&str; 8] = [
    "All times come from a monotonic clock on the client; latencies are measured from the actual send time s.",
    "TTFT = f − s, where f is the first chunk carrying output of any kind: answer text, reasoning text (delta.reasoning or delta.reasoning_content), a tool call or tokens; not a role-only prelude or an empty chunk.",
    "TTFA (time to first answer token) = a − s, where a is the first chunk carrying answer output (text or a tool call, not reasoning); equal to TTFT when the server streams no reasoning. Requests that streamed reasoning only have none and are counted apart.",
    "E2E = e − s, where e is the last content chunk (not the usage chunk or [DONE]).",
    "TPOT = (e − f) / (n − 1) for n > 1 output tokens, reasoning and answer alike; n is the server's usage.completion_tokens when given, else counted (and flagged).",
    "Schedule lag = actual send − scheduled send. Throughput is over the measurement window (sends after warm-up and before cool-down; from the first such send to the last such completion).",
    "Percentiles are nearest-rank (as HDR histograms with 3 significant digits report them); failed requests are counted and excluded from latency percentiles.",
    "A/B: ratios are B / A (above 1: B slower) with 95% percentile-bootstrap CIs from resampling requests; p-values are two-sided and Holm-corrected across the metrics tested.",
];

/// All sections of a report, in display order.
pub(crate) fn sections(report: &Report) -> Vec<Section> {
    let c = &report.conditions;
    let mut conditions = Table {
        header: vec!["condition".into(), "value".into()],
        rows: vec![
            vec!["workload".into(), c.workload.clone()],
            vec!["schedule".into(), c.schedule.clone()],
            vec!["server".into(), c.server.clone()],
            vec!["hardware".into(), c.hardware.clone()],
        ],
    };
    conditions
        .rows
        .extend(c.extra.iter().map(|(k, v)| vec![k.clone(), v.clone()]));
    let mut all = vec![Section {
        heading: "Conditions".into(),
        tables: vec![conditions],
        ..Section::default()
    }];
    all.extend(match &report.body {
        ReportBody::Run(view) => run::sections(view),
        ReportBody::Sweep(view) => sweep::sections(view),
        ReportBody::Compare(view) => compare::sections(view),
        ReportBody::Tune(file) => tune::sections(file),
        ReportBody::Matrix(view) => matrix::sections(view),
    });
    all.push(Section {
        heading: "Metric definitions".into(),
        paragraphs: METRIC_DEFINITIONS.iter().map(|s| s.to_string()).collect(),
        ..Section::default()
    });
    all
}

/// Writes `report.md`, `report.html` and the plots as `plots/*.svg` (linked from the Markdown)
/// into `dir`, creating it. Returns the paths of the Markdown and HTML files.
pub fn write_report(dir: &Path, report: &Report) -> Result<(PathBuf, PathBuf)> {
    let plots_dir = dir.join("plots");
    fs::create_dir_all(&plots_dir)
        .with_context(|| format!("creating report folder {}", plots_dir.display()))?;
    let all = sections(report);
    for plot in all.iter().flat_map(|s| &s.plots) {
        let path = plots_dir.join(format!("{}.svg", plot.name));
        let standalone =
            plot.svg
                .replacen("<svg ", "<svg xmlns=\"http://www.w3.org/2000/svg\" ", 1);
        fs::write(&path, standalone).with_context(|| format!("writing {}", path.display()))?;
    }
    let md = dir.join("report.md");
    fs::write(&md, markdown::markdown(&report.title, &all))
        .with_context(|| format!("writing {}", md.display()))?;
    let html = dir.join("report.html");
    fs::write(&html, html::html(&report.title, &all))
        .with_context(|| format!("writing {}", html.display()))?;
    Ok((md, html))
}

/// Milliseconds with adaptive precision, or "–".
pub(crate) fn fmt_ms(value: Option<f64>) -> String {
    match value {
        None => "–".into(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.1}"),
        Some(v) if v.abs() >= 1.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.3}"),
    }
}

/// A p-value: 4 decimals, or scientific below 1e-4.
pub(crate) fn fmt_p(value: Option<f64>) -> String {
    match value {
        None => "–".into(),
        Some(p) if p < 1e-4 => format!("{p:.1e}"),
        Some(p) => format!("{p:.4}"),
    }
}
