//! Exit codes a CI pipeline can gate on. 0: success; 1: an error (bad input, server
//! unreachable); 2: a usage error (clap's); 3: the SLO was not met (`--fail-on-slo`; `tune`:
//! no configuration meets it; `matrix --fail-on-refuted`: a row refuted); 4: a regression
//! (`compare --fail-on-regression`, and an inconclusive metric with `--fail-on-inconclusive`);
//! 5: the SLO is unknown, the sample too small to bound its percentile (`--fail-on-slo`).

use reports::slo::{SloCheck, SloVerdict};

pub const SLO_NOT_MET: i32 = 3;
pub const REGRESSION: i32 = 4;
pub const SLO_UNKNOWN: i32 = 5;

/// A verdict that ends the command with its own exit code (the results are written first).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Gate {
    pub code: i32,
    pub message: String,
}

/// The gate of an SLO check: `Ok` when met, else the exit code of its verdict.
pub fn slo_gate(what: &str, check: &SloCheck) -> Result<(), Gate> {
    let targets: Vec<String> = check
        .targets
        .iter()
        .map(|t| {
            let observed = t
                .observed_ms
                .map_or("no value".to_string(), |v| format!("{v:.2} ms"));
            let bound = if t.bounded {
                ""
            } else {
                ", too few to bound it"
            };
            format!(
                "{:?} p{} {observed} (limit {:.2} ms{bound})",
                t.target.metric, t.target.percentile, t.target.limit_ms
            )
            .to_lowercase()
        })
        .collect();
    let detail = format!(
        "{}; errors {:.2}%",
        targets.join(", "),
        check.error_rate * 100.0
    );
    match check.verdict {
        SloVerdict::Met => Ok(()),
        SloVerdict::NotMet => Err(Gate {
            code: SLO_NOT_MET,
            message: format!("{what}: SLO not met: {detail}"),
        }),
        SloVerdict::Unknown => Err(Gate {
            code: SLO_UNKNOWN,
            message: format!(
                "{what}: SLO unknown: too few measured requests to bound its percentile ({detail}); \
                 run longer or at a higher rate"
            ),
        }),
    }
}
