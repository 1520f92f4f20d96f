//! Shared by the online A/B tests: short comparisons of two fresh in-process mocks.

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use loadgen::experiments::compare::run_rounds;
use loadgen::mock::{self, MockConfig};
use loadgen::spec::compare::{CompareArgs, ServerSpec};
use loadgen::spec::RunSpec;
use reports::ab::{MetricVerdict, DEFAULT_ALPHA, DEFAULT_MIN_EFFECT};
use reports::comparison::{analyse_rounds, AnalysisOptions, PairMode};
use reports::folders::CompareFile;
use reports::metrics::SloMetric;

#[derive(Parser)]
pub struct Compare {
    #[command(flatten)]
    pub args: CompareArgs,
}

/// 40 ms TTFT, 5 ms ITL (with 16 output tokens: about 115 ms per request).
pub fn base_mock() -> MockConfig {
    MockConfig {
        ttft: Duration::from_millis(40),
        itl: Duration::from_millis(5),
        ..MockConfig::default()
    }
}

/// The `loadgen compare` options of every test comparison: 16 input and 16 output tokens,
/// Poisson at 60 req/s, 150 ms warm-up + 500 ms measured per round (about 30 requests).
pub fn run_options(seed: u64, rounds: usize, out: &Path) -> Vec<String> {
    let options = [
        "--rounds",
        &rounds.to_string(),
        "--model",
        "loadgen-mock",
        "--workload",
        "random",
        "--random-input-len",
        "16",
        "--random-output-len",
        "16",
        "--rate",
        "60",
        "--warmup",
        "150ms",
        "--duration",
        "500ms",
        "--seed",
        &seed.to_string(),
        "--no-progress",
        "--out",
        out.to_str().unwrap(),
    ];
    options.iter().map(|s| s.to_string()).collect()
}

/// One online comparison of two fresh in-process mocks, `rounds` rounds per side.
pub async fn compare_mocks(
    a: MockConfig,
    b: MockConfig,
    rounds: usize,
    seed: u64,
    out: &Path,
) -> CompareFile {
    let (a_addr, a_handle) = mock::spawn(a).await.unwrap();
    let (b_addr, b_handle) = mock::spawn(b).await.unwrap();
    let (a_url, b_url) = (format!("http://{a_addr}"), format!("http://{b_addr}"));
    let mut argv: Vec<String> = ["compare", "--a", &a_url, "--b", &b_url]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.extend(run_options(seed, rounds, out));
    let args = Compare::try_parse_from(argv).unwrap().args;
    let (a_rounds, b_rounds) = run_rounds(
        &RunSpec::from_args(&args.run).unwrap(),
        args.rounds,
        args.server_timeout,
        &ServerSpec::Url(a_url),
        &ServerSpec::Url(b_url),
        out,
    )
    .await
    .unwrap();
    a_handle.shutdown().await;
    b_handle.shutdown().await;
    let options = AnalysisOptions {
        pair: PairMode::Auto,
        alpha: DEFAULT_ALPHA,
        min_effect: DEFAULT_MIN_EFFECT,
        bootstrap_seed: 7,
        print: false,
    };
    analyse_rounds(a_rounds, b_rounds, options, out).unwrap()
}

pub fn metric(file: &CompareFile, metric: SloMetric) -> &MetricVerdict {
    file.analysis
        .metrics
        .iter()
        .find(|m| m.metric == metric)
        .unwrap()
}

/// One line per comparison for the test log.
pub fn summary(file: &CompareFile) -> String {
    file.analysis
        .metrics
        .iter()
        .map(|m| {
            format!(
                "{:?} n={} median {:.2}/{:.2} p_holm {:.3} → {}",
                m.metric,
                m.n_a,
                m.median_a.unwrap_or(f64::NAN),
                m.median_b.unwrap_or(f64::NAN),
                m.p_adjusted.unwrap_or(f64::NAN),
                m.verdict
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}
