//! The diagnosis of a finished run (`reports::diagnosis`): its records and metrics, the
//! server's gauges scraped into its folder during the measurement window (a warm-up's or
//! the idle tail's scrapes would dilute the running batch), its SLO and the bound's inputs
//! resolved at its start (`bound_inputs`), written into `summary.json` as `regime`,
//! `regime_evidence` and `diagnosis`.

use std::path::Path;

use anyhow::Result;
use reports::bound::BoundInputs;
use reports::diagnosis::{diagnose, Observation};
use reports::metrics::Metrics;
use reports::records::{read_meta, RequestRecord};
use reports::server_metrics::{read_scrapes, Scrape, ServerView};
use reports::slo::SloSpec;
use reports::summary::Summary;

use crate::folders::measured_window_unix_ms;

/// Diagnoses the run in `dir` and records the result in `summary`.
pub fn diagnose_run(
    dir: &Path,
    records: &[RequestRecord],
    metrics: &Metrics,
    slo: Option<&SloSpec>,
    inputs: &BoundInputs,
    summary: &mut Summary,
) -> Result<()> {
    let meta = read_meta(&dir.join("meta.json"))?;
    let scrapes = read_scrapes(dir)?;
    let in_window: Vec<Scrape> = match measured_window_unix_ms(&meta, records) {
        Some((start, end)) => scrapes
            .into_iter()
            .filter(|s| (start..=end).contains(&s.unix_ms))
            .collect(),
        None => scrapes,
    };
    let server = ServerView::from_scrapes(&in_window);
    // A closed loop cannot outrun its server: only an open-loop run saturates.
    let saturation = crate::saturation::judge(records);
    let open_loop = meta.schedule["mode"] != "closed";
    let saturated = (open_loop
        && saturation.state == crate::saturation::SaturationState::Saturated)
        .then_some(saturation.rule.as_str());
    let diagnosis = diagnose(&Observation {
        records,
        server: server.as_ref(),
        slo,
        bound_inputs: inputs,
        completed_rate: Some(metrics.request_throughput),
        output_tok_per_s: metrics.output_throughput,
        client_bound_reasons: &metrics.client_bound_reasons,
        saturated,
    });
    summary.regime = Some(diagnosis.regime);
    summary.regime_evidence = Some(diagnosis.evidence.clone());
    summary.diagnosis = Some(diagnosis);
    Ok(())
}
