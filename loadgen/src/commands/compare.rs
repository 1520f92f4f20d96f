//! `loadgen compare`: online (`--a URL_A --b URL_B`, or `--a-cmd "…" --b-cmd "…"`) or on saved
//! runs; the analysis itself is in `comparison`.
//!
//! Online: the plan (request list and schedule) is built once from the seed and run unchanged
//! on both sides, `--rounds` rounds per side in the alternating order A B, B A, A B, B A, …
//! (round k runs A first when k is even), each round with the plan's warm-up, into
//! `OUT/round-KK-a/` and `OUT/round-KK-b/`.
//! With `--a-cmd` / `--b-cmd` only one server is up at a time: every round starts its side's
//! server afresh on a free port (`{port}` in the command is replaced, else `--port N` is
//! appended), waits for `GET /health` = 200, runs, and stops it (SIGTERM). Restarting for every
//! round, rather than keeping a server up across its two consecutive rounds (B B, A A), keeps
//! the strict alternation and gives every round the same start: no side gains from caches
//! (prefix cache, allocator, JIT) filled by its previous round. Start-up time is not measured;
//! the warm-up absorbs start-up effects. Each round's `meta.json` records the side, the round,
//! the server's command line, its `/v1/models` and its `/version` when it has one.
//!
//! Offline (`loadgen compare A_DIR B_DIR`, or `loadgen compare DIR` on an online comparison's
//! folder): each side is a run folder or a folder of `round-*` run folders.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::units::parse_fraction;
use anyhow::{bail, Context, Result};
use clap::Args;
use reports::ab::{Verdict, DEFAULT_ALPHA};
use reports::metrics::SloMetric;
use serde_json::json;

use crate::execute::{execute_prepared, Execution};
use crate::options::RunArgs;
use crate::prepare::prepare_run;
use crate::server_proc::{self, ServerProcess};
use crate::stop::stop_on_signals;
use crate::units::duration_arg;
use reports::comparison::{analyse_rounds, AnalysisOptions, PairMode};
use reports::folders::{online_rounds, round_dir, side_rounds, CompareFile, Side};

/// `--pair`'s values (`reports::comparison::PairMode`), with their help: reports has no
/// command-line types of its own.
fn pair_mode_arg() -> impl clap::builder::TypedValueParser<Value = PairMode> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new("auto").help(
            "Paired when both sides sent the same requests: identical schedule.jsonl and \
             --extra-body",
        ),
        PossibleValue::new("yes"),
        PossibleValue::new("no"),
    ])
    .map(|value| match value.as_str() {
        "yes" => PairMode::Yes,
        "no" => PairMode::No,
        _ => PairMode::Auto,
    })
}

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Offline side A: a run folder, a folder of round-* run folders, or the folder of an
    /// online comparison (round-KK-a / round-KK-b; then give no B_DIR).
    #[arg(value_name = "A_DIR")]
    pub a_dir: Option<PathBuf>,
    /// Offline side B, likewise.
    #[arg(value_name = "B_DIR")]
    pub b_dir: Option<PathBuf>,
    /// Online: base URL of server A (without /v1).
    #[arg(long = "a", value_name = "URL_A", conflicts_with_all = ["a_dir", "a_cmd"])]
    pub a_url: Option<String>,
    /// Online: base URL of server B.
    #[arg(long = "b", value_name = "URL_B", conflicts_with_all = ["a_dir", "b_cmd"])]
    pub b_url: Option<String>,
    /// Online: command that starts server A (`{port}` is replaced by a free port, else
    /// `--port N` is appended); started afresh for each of its rounds.
    #[arg(long, conflicts_with = "a_dir")]
    pub a_cmd: Option<String>,
    /// Online: command that starts server B.
    #[arg(long, conflicts_with = "a_dir")]
    pub b_cmd: Option<String>,
    /// Online: rounds per side, run in the order A B, B A, A B, …
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// Online: how long a started server may take to answer GET /health with 200.
    #[arg(long, value_parser = duration_arg, default_value = "300s")]
    pub server_timeout: Duration,
    #[arg(long, value_parser = pair_mode_arg(), default_value = "auto")]
    pub pair: PairMode,
    #[arg(long, default_value_t = DEFAULT_ALPHA)]
    pub alpha: f64,
    /// The smallest effect that matters, as a share of A's median: `2%` or `0.02` (floors of
    /// 1 ms for TTFT and E2E, 0.1 ms for TPOT). B is called slower or faster only beyond it,
    /// equivalent when the CI lies within it, inconclusive otherwise.
    #[arg(long, value_parser = parse_fraction, default_value = "2%")]
    pub min_effect: f64,
    /// Seed of the bootstrap CIs.
    #[arg(long, default_value_t = 0x5eed)]
    pub bootstrap_seed: u64,
    /// Exit 4 when a verdict of --metrics is "B slower" (a regression of B against A).
    #[arg(long)]
    pub fail_on_regression: bool,
    /// The metrics --fail-on-regression judges (ttft, ttfa, tpot, e2el); default: all.
    #[arg(long, value_delimiter = ',', requires = "fail_on_regression")]
    pub metrics: Vec<String>,
    /// With --fail-on-regression: an inconclusive verdict fails too (exit 4).
    #[arg(long, requires = "fail_on_regression")]
    pub fail_on_inconclusive: bool,
    /// Every `loadgen run` option applies to each online round (`--url` is not used;
    /// `--out` is the comparison's output folder, required).
    #[command(flatten)]
    pub run: RunArgs,
}

/// The online run order: `rounds` rounds per side, A first in even rounds and B first in odd
/// ones (A B, B A, A B, B A, …).
pub fn round_order(rounds: usize) -> Vec<(usize, Side)> {
    (0..rounds)
        .flat_map(|k| {
            if k % 2 == 0 {
                [(k, Side::A), (k, Side::B)]
            } else {
                [(k, Side::B), (k, Side::A)]
            }
        })
        .collect()
}

/// One side of an online comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerSpec {
    /// A running server's base URL.
    Url(String),
    /// A command that starts the server, run afresh for each round.
    Command(String),
}

fn server_spec(url: &Option<String>, cmd: &Option<String>, side: Side) -> Result<ServerSpec> {
    match (url, cmd) {
        (Some(u), None) => Ok(ServerSpec::Url(u.trim_end_matches('/').to_string())),
        (None, Some(c)) => Ok(ServerSpec::Command(c.clone())),
        _ => bail!(
            "loadgen compare: give side {} as --{s} URL or --{s}-cmd COMMAND",
            side.label(),
            s = side.suffix()
        ),
    }
}

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
    if online && args.run.turns.is_some() {
        bail!(
            "loadgen compare with --turns: a session's later turns carry each server's own \
             answers, so the two sides never send identical requests to pair; compare \
             single-turn runs, or run each side alone and compare the saved runs (unpaired)"
        );
    }
    if online {
        let a = server_spec(&args.a_url, &args.a_cmd, Side::A)?;
        let b = server_spec(&args.b_url, &args.b_cmd, Side::B)?;
        let (a_rounds, b_rounds) = run_rounds(&args, &a, &b, &out).await?;
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

/// Runs the online rounds (see the module doc); returns each side's round folders in order.
pub async fn run_rounds(
    args: &CompareArgs,
    a: &ServerSpec,
    b: &ServerSpec,
    out: &Path,
) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    if args.rounds == 0 {
        bail!("loadgen compare: --rounds must be at least 1");
    }
    if args.run.shard.is_some() || args.run.start_at.is_some() {
        bail!("loadgen compare: --shard / --start-at are for run and sweep; an online comparison alternates its rounds from one client");
    }
    let stop = stop_on_signals()?;
    // Built once: both sides and every round get the identical requests and schedule.
    let prepared = prepare_run(&args.run)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let order = round_order(args.rounds);
    let order_text: Vec<&str> = order.iter().map(|(_, s)| s.label()).collect();
    let order_text = order_text.join(" ");
    let (mut a_rounds, mut b_rounds) = (Vec::new(), Vec::new());
    for (step, &(round, side)) in order.iter().enumerate() {
        if *stop.borrow() {
            bail!(
                "loadgen compare: stopped after {step} of {} runs",
                order.len()
            );
        }
        let dir = round_dir(out, round, side);
        let spec = match side {
            Side::A => a,
            Side::B => b,
        };
        let (url, server): (String, Option<ServerProcess>) = match spec {
            ServerSpec::Url(u) => (u.clone(), None),
            ServerSpec::Command(cmd) => {
                let s = server_proc::start(cmd, &dir.join("server.log"), args.server_timeout)
                    .await
                    .with_context(|| {
                        format!("starting server {} for round {round}", side.label())
                    })?;
                (s.url.clone(), Some(s))
            }
        };
        let identity = server_proc::identify(
            &url,
            &prepared.headers,
            args.run.api_key.as_deref(),
            prepared.tls.as_ref(),
        )
        .await;
        let mut extra = std::collections::BTreeMap::new();
        extra.insert("ab_side".to_string(), json!(side.label()));
        extra.insert("ab_round".to_string(), json!(round));
        extra.insert("ab_order".to_string(), json!(order_text));
        if let Some(s) = &server {
            extra.insert("server_command".to_string(), json!(s.command));
        }
        if let Some(models) = identity.models {
            extra.insert("server_models".to_string(), models);
        }
        if let Some(info) = identity.info {
            extra.insert("server_info".to_string(), info);
        }
        if let Some(hardware) = identity.hardware {
            extra.insert("server_hardware".to_string(), json!(hardware));
        }
        eprintln!(
            "loadgen compare: run {}/{}: round {round} side {} ({url}) → {}",
            step + 1,
            order.len(),
            side.label(),
            dir.display()
        );
        let result = execute_prepared(
            &args.run,
            &prepared,
            Execution {
                url,
                out: Some(dir.clone()),
                server_version: identity.version,
                extra,
                progress: !args.run.no_progress,
                stop: stop.clone(),
            },
        )
        .await;
        if let Some(s) = server {
            s.stop().await?;
        }
        result.with_context(|| format!("round {round}, side {}", side.label()))?;
        let dir = dir.canonicalize()?;
        match side {
            Side::A => a_rounds.push(dir),
            Side::B => b_rounds.push(dir),
        }
    }
    Ok((a_rounds, b_rounds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_a_b_b_a() {
        let order: Vec<String> = round_order(4)
            .iter()
            .map(|(k, s)| format!("{k}{}", s.suffix()))
            .collect();
        assert_eq!(order, ["0a", "0b", "1b", "1a", "2a", "2b", "3b", "3a"]);
        assert_eq!(
            round_dir(Path::new("out"), 3, Side::B),
            Path::new("out/round-03-b")
        );
    }

    #[test]
    fn each_side_is_a_url_or_a_command() {
        let url = Some("http://h:1/".to_string());
        let cmd = Some("engine serve".to_string());
        assert_eq!(
            server_spec(&url, &None, Side::A).unwrap(),
            ServerSpec::Url("http://h:1".into())
        );
        assert_eq!(
            server_spec(&None, &cmd, Side::B).unwrap(),
            ServerSpec::Command("engine serve".into())
        );
        assert!(server_spec(&None, &None, Side::A).is_err());
        assert!(server_spec(&url, &cmd, Side::A).is_err());
    }
}
