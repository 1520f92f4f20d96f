//! The diagnosis of a finished run (`reports::diagnosis`): its records and metrics, the
//! server's gauges scraped into its folder, its SLO and the bound's inputs resolved at its
//! start (`bound_inputs`), written into `summary.json` as `regime`, `regime_evidence` and
//! `diagnosis`.

use std::path::Path;

use anyhow::Result;
use reports::bound::BoundInputs;
use reports::diagnosis::{diagnose, Observation};
use reports::metrics::Metrics;
use reports::records::RequestRecord;
use reports::server_metrics::{read_scrapes, ServerView};
use reports::slo::SloSpec;
use reports::summary::Summary;

/// Diagnoses the run in `dir` and records the result in `summary`.
pub fn diagnose_run(
    dir: &Path,
    records: &[RequestRecord],
    metrics: &Metrics,
    slo: Option<&SloSpec>,
    inputs: &BoundInputs,
    summary: &mut Summary,
) -> Result<()> {
    let scrapes = read_scrapes(dir)?;
    let server = ServerView::from_scrapes(&scrapes);
    let diagnosis = diagnose(&Observation {
        records,
        server: server.as_ref(),
        slo,
        bound_inputs: inputs,
        completed_rate: Some(metrics.request_throughput),
        output_tok_per_s: metrics.output_throughput,
        client_bound_reasons: &metrics.client_bound_reasons,
    });
    summary.regime = Some(diagnosis.regime);
    summary.regime_evidence = Some(diagnosis.evidence.clone());
    summary.diagnosis = Some(diagnosis);
    Ok(())
}
