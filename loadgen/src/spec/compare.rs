//! The options of `loadgen compare`, and each online side as a URL or a server command.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use reports::ab::DEFAULT_ALPHA;
use reports::comparison::PairMode;
use reports::folders::Side;

use crate::spec::run_args::RunArgs;
use crate::units::{duration_arg, parse_fraction};

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

/// One side of an online comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerSpec {
    /// A running server's base URL.
    Url(String),
    /// A command that starts the server, run afresh for each round.
    Command(String),
}

/// The side given as `--a URL` or `--a-cmd COMMAND` (and the same for B): one of the two.
pub fn server_spec(url: &Option<String>, cmd: &Option<String>, side: Side) -> Result<ServerSpec> {
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
#[cfg(test)]
mod tests {
    use super::*;

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
