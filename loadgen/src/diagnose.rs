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
use reports::slo::SloSpec;
use reports::summary::Summary;

use reports::folders::window_server_view;

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
    let server = window_server_view(dir, &meta, records)?;
    // A closed loop cannot outrun its server: only an open-loop run saturates.
    let saturation = reports::saturation::judge(
        records,
        reports::saturation::JudgeContext::new(slo, server.as_ref()),
    );
    let open_loop = meta.schedule["mode"] != "closed";
    let saturated = (open_loop
        && saturation.state == reports::saturation::SaturationState::Saturated)
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
