//! The A/B analysis of saved rounds: the verdict per latency metric (ratio of medians and of
//! p99s with bootstrap CIs, Wilcoxon signed-rank on paired per-request differences, Welch on
//! per-round p99s, Holm across metrics), `compare.json` and the comparison's report.
//! Requests are paired by id when both sides ran the identical schedule, unpaired tests
//! otherwise (and said so).

use std::path::{Path, PathBuf};

use crate::ab::{compare, AbInput, AbReport};
use crate::render::{write_report, CompareView, Conditions, Report, ReportBody};
use crate::samples::LatencySamples;
use crate::stats::Bootstrap;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::folders::{load_run, same_requests, CompareFile, COMPARE_FILE};

/// Whether the two sides' requests are paired (`loadgen compare --pair`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairMode {
    /// Paired when both sides sent the same requests: identical schedule.jsonl and --extra-body.
    Auto,
    Yes,
    No,
}

struct Sides {
    a: Vec<LatencySamples>,
    b: Vec<LatencySamples>,
    /// Each side's classes over its pooled rounds.
    a_classes: Vec<crate::classes::ClassStats>,
    b_classes: Vec<crate::classes::ClassStats>,
    conditions: Conditions,
    a_label: String,
    b_label: String,
}

/// Per-round samples of one side, the first round's conditions and the server's command line
/// when this tool started it.
type Side = (
    Vec<LatencySamples>,
    Vec<crate::classes::ClassStats>,
    Conditions,
    Option<String>,
);

fn load_side(dirs: &[PathBuf]) -> Result<Side> {
    let mut samples = Vec::new();
    let mut conditions = Conditions::default();
    let mut server_command = None;
    let mut records = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let run = load_run(dir, &[])?;
        records.extend(crate::records::read_records(&dir.join("records.jsonl"))?);
        if i == 0 {
            conditions = Conditions::from_meta(&run.meta);
            server_command = run
                .meta
                .extra
                .get("server_command")
                .and_then(|v| v.as_str())
                .map(str::to_string);
        }
        samples.push(run.samples);
    }
    let opts = crate::metrics::MetricsOptions {
        slos: Vec::new(),
        open_loop: false,
        client_cpu: None,
    };
    let classes = crate::classes::of(&records, &opts, 0.0);
    Ok((samples, classes, conditions, server_command))
}

fn load_sides(a_rounds: &[PathBuf], b_rounds: &[PathBuf]) -> Result<Sides> {
    let (a, a_classes, ca, a_cmd) = load_side(a_rounds)?;
    let (b, b_classes, cb, b_cmd) = load_side(b_rounds)?;
    let mut extra = vec![("rounds".into(), format!("A: {}, B: {}", a.len(), b.len()))];
    match (a_cmd, b_cmd) {
        (None, None) => extra.push((
            "command".into(),
            both(&extra_of(&ca, "command"), &extra_of(&cb, "command")),
        )),
        (a_cmd, b_cmd) => {
            extra.push(("loadgen command".into(), extra_of(&ca, "command")));
            extra.push((
                "A server command".into(),
                a_cmd.unwrap_or_else(|| "not started by loadgen".into()),
            ));
            extra.push((
                "B server command".into(),
                b_cmd.unwrap_or_else(|| "not started by loadgen".into()),
            ));
        }
    }
    let conditions = Conditions {
        workload: both(&ca.workload, &cb.workload),
        schedule: both(&ca.schedule, &cb.schedule),
        server: format!("A: {}; B: {}", ca.server, cb.server),
        hardware: both(&ca.hardware, &cb.hardware),
        extra,
    };
    Ok(Sides {
        a,
        b,
        a_classes,
        b_classes,
        a_label: ca.server,
        b_label: cb.server,
        conditions,
    })
}

fn both(a: &str, b: &str) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("A: {a}; B: {b}")
    }
}

fn extra_of(c: &Conditions, key: &str) -> String {
    c.extra
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

fn pooled(rounds: &[LatencySamples]) -> LatencySamples {
    LatencySamples {
        requests: rounds.iter().flat_map(|r| r.requests.clone()).collect(),
        schedule_lag_ms: rounds
            .iter()
            .flat_map(|r| r.schedule_lag_ms.clone())
            .collect(),
    }
}

/// The report of a comparison (re-running the seeded analysis on the saved runs).
pub fn compare_view(file: &CompareFile) -> Result<Report> {
    let sides = load_sides(&file.a_rounds, &file.b_rounds)?;
    let input = AbInput::from_rounds(&sides.a, &sides.b, file.pair_by_id);
    let analysis = compare(&input, file.alpha, file.min_effect, file.bootstrap);
    Ok(Report {
        title: "A/B comparison".into(),
        conditions: sides.conditions,
        body: ReportBody::Compare(CompareView {
            a_label: sides.a_label,
            b_label: sides.b_label,
            a: pooled(&sides.a),
            b: pooled(&sides.b),
            analysis,
            a_classes: sides.a_classes,
            b_classes: sides.b_classes,
            a_requests: sides.a.iter().map(|s| s.schedule_lag_ms.len()).sum(),
            b_requests: sides.b.iter().map(|s| s.schedule_lag_ms.len()).sum(),
        }),
    })
}

/// How the analysis is run.
#[derive(Debug, Clone, Copy)]
pub struct AnalysisOptions {
    pub pair: PairMode,
    pub alpha: f64,
    /// The smallest effect that matters, as a fraction of A's median.
    pub min_effect: f64,
    pub bootstrap_seed: u64,
    /// Print the verdicts and the file / report paths.
    pub print: bool,
}

/// Analyses the rounds of both sides, writes `compare.json` and the report into `out`.
pub fn analyse_rounds(
    a_rounds: Vec<PathBuf>,
    b_rounds: Vec<PathBuf>,
    options: AnalysisOptions,
    out: &Path,
) -> Result<CompareFile> {
    let identical = a_rounds.len() == b_rounds.len()
        && a_rounds
            .iter()
            .zip(&b_rounds)
            .all(|(a, b)| same_requests(a, b));
    let pair_by_id = match options.pair {
        PairMode::Auto => identical,
        PairMode::Yes => true,
        PairMode::No => false,
    };
    if options.pair == PairMode::Auto && !identical {
        eprintln!(
            "loadgen compare: the sides' requests differ (schedule.jsonl, or --extra-body in \
             meta.json): unpaired tests"
        );
    }
    let bootstrap = Bootstrap {
        seed: options.bootstrap_seed,
        ..Bootstrap::default()
    };
    let sides = load_sides(&a_rounds, &b_rounds)?;
    let analysis = compare(
        &AbInput::from_rounds(&sides.a, &sides.b, pair_by_id),
        options.alpha,
        options.min_effect,
        bootstrap,
    );
    if options.print {
        println!("{}", analysis.headline(&sides.b_label));
        print!("{}", verdict_text(&analysis));
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let file = CompareFile {
        schema_version: 1,
        a_rounds,
        b_rounds,
        pair_by_id,
        alpha: options.alpha,
        min_effect: options.min_effect,
        bootstrap,
        analysis,
    };
    let path = out.join(COMPARE_FILE);
    std::fs::write(&path, serde_json::to_string_pretty(&file)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    let (_, html) = write_report(out, &compare_view(&file)?)?;
    if options.print {
        println!("comparison: {}  report: {}", path.display(), html.display());
    }
    Ok(file)
}

/// The verdicts as terminal text, one line per metric, then the notes.
pub fn verdict_text(analysis: &AbReport) -> String {
    let mut out = String::new();
    for v in &analysis.metrics {
        let ratio = v
            .median_ratio
            .map(|c| format!("{:.3} [{:.3}, {:.3}]", c.estimate, c.lower, c.upper))
            .unwrap_or_else(|| "–".into());
        out.push_str(&format!(
            "{:<5} median B/A {ratio}  p (Holm) {}  → {}\n",
            crate::samples::metric_label(v.metric),
            v.p_adjusted.map_or("–".into(), |p| format!("{p:.4}")),
            v.verdict_text()
        ));
    }
    for note in &analysis.notes {
        out.push_str(note);
        out.push('\n');
    }
    out
}
