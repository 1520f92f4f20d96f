//! A warm row's shared prefixes, each sent once, alone, before the row's window: what the
//! server's prefix cache holds when the row's measurement starts.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Result};

use crate::load::plan::Plan;
use crate::load::workload::{PromptSource, RequestSpec};
use crate::run::execute::{execute_prepared, Execution};
use crate::run::prepare::prepare_run;
use crate::spec::RunSpec;

/// The distinct shared prefixes of a plan's requests, each as a request of its own (one
/// output token).
pub fn prefixes(plan: &Plan) -> Vec<RequestSpec> {
    let mut seen = std::collections::HashSet::new();
    plan.requests
        .iter()
        .filter(|r| r.spec.prefix_group.is_some())
        .filter_map(|r| match &r.spec.prompt {
            PromptSource::Blocks(blocks) => blocks.first().copied(),
            PromptSource::Text(_) => None,
        })
        .filter(|block| seen.insert(block.key))
        .map(|block| RequestSpec {
            input_len: block.len,
            output_len: 1,
            prefix_group: None,
            prompt: PromptSource::Blocks(vec![block]),
            model: None,
            class: None,
        })
        .collect()
}

/// Sends the prefixes of `run`'s plan one at a time into `dir`, a run folder of its own so
/// that what warmed the cache is on record; fails when any of them failed.
pub async fn warm_prefixes(
    run: &RunSpec,
    dir: PathBuf,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<usize> {
    let mut prepared = prepare_run(run)?;
    let specs = prefixes(&prepared.plan);
    let n = specs.len();
    let mut specs = specs.into_iter();
    prepared.plan = Arc::new(Plan::closed(1, n, |_| {
        specs.next().expect("one prefix per request")
    }));
    let mut args = run.clone();
    args.slo = None;
    args.slo_text = None;
    args.out = Some(dir.clone());
    eprintln!(
        "loadgen matrix: warming {n} shared prefix(es) → {}",
        dir.display()
    );
    let outcome = execute_prepared(
        &args,
        &prepared,
        Execution {
            url: run.target.url.clone(),
            out: Some(dir),
            server_version: None,
            extra: Default::default(),
            progress: false,
            stop: stop.clone(),
        },
    )
    .await?;
    if outcome.summary.failed > 0 {
        bail!(
            "{} of the {n} prefix warm-up requests failed: {:?}",
            outcome.summary.failed,
            outcome.summary.errors
        );
    }
    Ok(n)
}
