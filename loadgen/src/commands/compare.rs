//! `loadgen compare`: online rounds (`experiments::compare`) or saved runs, the analysis in
//! `reports::comparison`, then the `--fail-on-regression` gate.

use anyhow::{bail, Context, Result};
use reports::ab::Verdict;
use reports::comparison::{analyse_rounds, AnalysisOptions};
use reports::folders::{online_rounds, side_rounds, CompareFile, Side};
use reports::metrics::SloMetric;

use crate::experiments::compare::{refuse_rounds, run_rounds};
use crate::spec::compare::{server_spec, CompareArgs};
use crate::spec::RunSpec;

/// `loadgen compare`: online when `--a`/`--a-cmd` are given, else on saved runs.
pub async fn compare_command(args: CompareArgs) -> Result<()> {
    let options = AnalysisOptions {
        pair: args.pair,
        alpha: args.alpha,
        min_effect: args.min_effect,
        bootstrap_seed: args.bootstrap_seed,
        print: true,
    };
    let out = args
        .run
        .out
        .clone()
        .context("loadgen compare: --out FOLDER is required")?;
    let online = args.a_url.is_some()
        || args.a_cmd.is_some()
        || args.b_url.is_some()
        || args.b_cmd.is_some();
    if let (true, Some(flag)) = (online, args.run.sessions_flag()) {
        bail!(
            "loadgen compare with {flag}: a session's later turns carry each server's own \
             answers, so the two sides never send identical requests to pair; compare \
             single-turn runs, or run each side alone and compare the saved runs (unpaired)"
        );
    }
    if online {
        let a = server_spec(&args.a_url, &args.a_cmd, Side::A)?;
        let b = server_spec(&args.b_url, &args.b_cmd, Side::B)?;
        // Compare's own refusals before the run options' (a shard would be asked for its
        // --start-at first).
        refuse_rounds(
            args.rounds,
            args.run.shard.is_some() || args.run.start_at.is_some(),
        )?;
        let run = RunSpec::from_args(&args.run)?;
        let (a_rounds, b_rounds) =
            run_rounds(&run, args.rounds, args.server_timeout, &a, &b, &out).await?;
        let file = analyse_rounds(a_rounds, b_rounds, options, &out)?;
        return regression_gate(&args, &file);
    }
    let (a_rounds, b_rounds) = match (&args.a_dir, &args.b_dir) {
        (Some(a), Some(b)) => (side_rounds(a)?, side_rounds(b)?),
        (Some(dir), None) => online_rounds(dir)?,
        _ => bail!("loadgen compare: give A_DIR B_DIR (saved runs), or --a/--a-cmd and --b/--b-cmd (online)"),
    };
    let file = analyse_rounds(a_rounds, b_rounds, options, &out)?;
    regression_gate(&args, &file)
}

/// `--fail-on-regression`: exit 4 when a judged metric's verdict is "B slower" (or, with
/// `--fail-on-inconclusive`, inconclusive); an inconclusive verdict otherwise passes and
/// says so.
fn regression_gate(args: &CompareArgs, file: &CompareFile) -> Result<()> {
    if !args.fail_on_regression {
        return Ok(());
    }
    let judged: Vec<SloMetric> = if args.metrics.is_empty() {
        file.analysis.metrics.iter().map(|m| m.metric).collect()
    } else {
        args.metrics
            .iter()
            .map(|name| match name.trim() {
                "ttft" => Ok(SloMetric::Ttft),
                "ttfa" | "time_to_first_answer" => Ok(SloMetric::TimeToFirstAnswer),
                "tpot" => Ok(SloMetric::Tpot),
                "e2el" | "e2e" => Ok(SloMetric::E2el),
                other => bail!("--metrics: unknown metric `{other}` (ttft, ttfa, tpot, e2el)"),
            })
            .collect::<Result<_>>()?
    };
    let mut failing = Vec::new();
    for v in file
        .analysis
        .metrics
        .iter()
        .filter(|v| judged.contains(&v.metric))
    {
        let label = reports::samples::metric_label(v.metric);
        match v.verdict {
            Verdict::BSlower => failing.push(format!("{label}: B slower")),
            Verdict::Inconclusive if args.fail_on_inconclusive => {
                failing.push(format!("{label}: inconclusive"))
            }
            Verdict::Inconclusive => eprintln!(
                "loadgen compare: {label} is inconclusive: not a regression (--fail-on-inconclusive \
                 fails on it)"
            ),
            _ => {}
        }
    }
    if failing.is_empty() {
        return Ok(());
    }
    Err(crate::gate::Gate {
        code: crate::gate::REGRESSION,
        message: format!("loadgen compare: regression: {}", failing.join(", ")),
    }
    .into())
}
