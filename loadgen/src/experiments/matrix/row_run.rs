//! One row run (its prefixes first when warm) and its entry in `matrix.json`.

use std::path::Path;

use anyhow::{Context, Result};
use reports::diagnosis::Regime;
use reports::matrix::{
    row_verdict, usd_per_million_output_tokens, CapacityBracket, Evidence, MatrixRow, Verdict,
};
use reports::summary::Summary;

use super::rows::PreparedRow;
use super::warm;
use crate::experiments::launch::prepare_and_execute;
use crate::experiments::sweep::run_sweep;
use crate::spec::matrix::MatrixArgs;
use crate::spec::matrix_toml::{Prefix, RowArgs};
use crate::spec::RunSpec;

/// Runs one row (its prefixes first when warm) and decides its expectations.
pub(super) async fn run_row(
    args: &MatrixArgs,
    out: &Path,
    row: &PreparedRow,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<MatrixRow> {
    let dir = out.join(&row.folder);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut row_args = row.args.clone();
    if row.spec.prefix == Prefix::Warm {
        let run = RunSpec::from_args(row_args.run())?;
        warm::warm_prefixes(&run, dir.join("prefix-warmup"), stop).await?;
    }
    let (summary, capacity, folder) = match &mut row_args {
        RowArgs::Run(run) => {
            run.out = Some(dir.join("run"));
            let outcome = prepare_and_execute(&RunSpec::from_args(run)?, stop.clone()).await?;
            print!("{}", reports::table::render(&outcome.summary));
            (Some(outcome.summary), None, format!("{}/run", row.folder))
        }
        RowArgs::Search(sweep) => {
            let sweep_dir = dir.join("sweep");
            sweep.run.out = Some(sweep_dir.clone());
            let file = run_sweep(sweep, stop.clone()).await?;
            let bracket = file
                .search
                .as_ref()
                .map(|s| s.bracket())
                .unwrap_or_default();
            let knee = match &bracket.lower {
                Some(end) => Some(Summary::read(
                    &sweep_dir.join(&end.dir).join("summary.json"),
                )?),
                None => None,
            };
            let capacity = CapacityBracket {
                lower: bracket.lower.map(|e| e.rate),
                upper: bracket.upper.map(|e| e.rate),
            };
            (knee, Some(capacity), format!("{}/sweep", row.folder))
        }
    };
    Ok(measured_row(args, row, folder, summary.as_ref(), capacity))
}

/// The row's entry from its summary (a knee search: its knee level's) and bracket.
fn measured_row(
    args: &MatrixArgs,
    row: &PreparedRow,
    folder: String,
    summary: Option<&Summary>,
    capacity: Option<CapacityBracket>,
) -> MatrixRow {
    let empty = std::collections::BTreeMap::new();
    let diagnosis = summary.and_then(|s| s.diagnosis.as_ref());
    let evidence = Evidence {
        metrics: summary.map_or(&empty, |s| &s.metrics),
        diagnosis,
        capacity,
    };
    let expectations: Vec<_> = row
        .spec
        .expect
        .iter()
        .map(|e| e.decide(&evidence))
        .collect();
    let output = summary.map(|s| s.output_throughput);
    MatrixRow {
        folder,
        verdict: row_verdict(&expectations),
        expectations,
        regime: diagnosis.map_or(Regime::Undetermined, |d| d.regime),
        regime_evidence: diagnosis.map_or_else(
            || "no measured level to diagnose".to_string(),
            |d| d.evidence.clone(),
        ),
        tpot_p50_ms: summary
            .and_then(|s| s.metrics.get("tpot"))
            .filter(|t| t.count > 0)
            .map(|t| t.p50),
        bound_tpot_ms: diagnosis.and_then(|d| d.bound.as_ref()).map(|b| b.tpot_ms),
        bound_binds: diagnosis.and_then(|d| d.bound.as_ref()).map(|b| b.binds),
        tpot_over_bound: diagnosis.and_then(|d| d.tpot_over_bound),
        output_tok_per_s: output,
        usd_per_million_output_tokens: args.gpu_hour_usd.zip(output).and_then(|(price, tok)| {
            usd_per_million_output_tokens(price, args.gpus_per_instance, tok)
        }),
        capacity,
        ..unmeasured(row, String::new())
    }
}

/// The entry of a row without a measurement (`error` says why; empty when one follows).
pub(super) fn unmeasured(row: &PreparedRow, error: String) -> MatrixRow {
    MatrixRow {
        name: row.spec.display_name(),
        question: row.spec.question.clone(),
        hypothesis: row.spec.hypothesis.clone(),
        folder: row.folder.clone(),
        load: row.load.clone(),
        prefix: row.prefix.clone(),
        verdict: Verdict::Inconclusive,
        expectations: Vec::new(),
        regime: Regime::Undetermined,
        regime_evidence: "the row has no measurement".into(),
        tpot_p50_ms: None,
        bound_tpot_ms: None,
        bound_binds: None,
        tpot_over_bound: None,
        output_tok_per_s: None,
        usd_per_million_output_tokens: None,
        capacity: None,
        error: (!error.is_empty()).then_some(error),
        runs: Vec::new(),
    }
}

pub(super) fn print_row(row: &MatrixRow) {
    let ratio = row.tpot_over_bound.map_or("–".to_string(), |r| {
        format!(
            "{r:.2}× bound{}",
            row.bound_binds
                .map_or(String::new(), |side| format!(" ({side} binds)"))
        )
    });
    println!(
        "{:<24} {:<12} regime {:<22} TPOT/bound {ratio}",
        row.name,
        row.verdict.to_string(),
        row.regime.to_string(),
    );
    for e in &row.expectations {
        println!(
            "    {:<12} {}: {}",
            e.verdict.to_string(),
            e.expectation,
            e.reason
        );
    }
    if let Some(error) = &row.error {
        println!("    failed: {error}");
    }
}
