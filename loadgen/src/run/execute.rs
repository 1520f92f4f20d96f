//! One execution of a prepared run against a server: the model and the server's identity
//! resolved, `meta.json` written before and after, the server's metrics scraped beside the
//! send loop, and `timeline.json` at the end.

use std::path::PathBuf;

use anyhow::{Context, Result};
use reports::folders::RunEnd;
use reports::records::{RunMeta, ShardInfo, SCHEMA_VERSION};
use reports::timeline::PhaseBounds;

use crate::run::host::host_info;
use crate::run::prepare::{fnv1a, PreparedRun};
use crate::run::send::{self, RunOutcome, SendOptions};
use crate::spec::RunSpec;
use crate::wire::client;
use crate::wire::extra_body::ExtraBody;
use crate::wire::scrape::{ScrapeTarget, Scraper};
use crate::wire::target::Target;

/// Where one execution of a prepared run goes.
pub struct Execution {
    /// Base URL of the server (without /v1).
    pub url: String,
    /// Run folder (`meta.json` is written there too); `None` keeps everything in memory.
    pub out: Option<PathBuf>,
    /// Server version, when known (e.g. from its `/version`).
    pub server_version: Option<String>,
    /// Extra facts for `meta.json` (A/B side and round, server command line, …).
    pub extra: std::collections::BTreeMap<String, serde_json::Value>,
    pub progress: bool,
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// Runs `prepared` against `exec.url` with the target options of `run` (backend, model,
/// headers, timeouts); writes `meta.json` beside the records when `exec.out` is set.
pub async fn execute_prepared(
    run: &RunSpec,
    prepared: &PreparedRun,
    exec: Execution,
) -> Result<RunOutcome> {
    let target_spec = &run.target;
    let tls = Some(&target_spec.tls);
    let model = match &target_spec.model {
        Some(m) => m.clone(),
        None => {
            client::first_model(
                &crate::wire::connections::http_client(1, tls),
                &exec.url,
                &target_spec.headers,
                target_spec.api_key.as_deref(),
            )
            .await?
        }
    };
    // Who is measured, in meta.json: asked once per execution unless the caller knows.
    let mut extra = exec.extra;
    let server_version = match exec.server_version {
        Some(v) => Some(v),
        None => {
            let identity = crate::wire::identify::identify(
                &exec.url,
                &target_spec.headers,
                target_spec.api_key.as_deref(),
                tls,
            )
            .await;
            if let Some(info) = identity.info {
                extra.entry("server_info".into()).or_insert(info);
            }
            if let Some(hardware) = identity.hardware {
                extra
                    .entry("server_hardware".into())
                    .or_insert(serde_json::Value::String(hardware));
            }
            identity.version
        }
    };
    // Resolved once the server has said what it is: recorded so reports can recompute.
    let bound_inputs = crate::spec::bound::resolve(&run.bound, extra.get("server_info"))?;
    extra.insert(
        "bound_inputs".into(),
        serde_json::to_value(&bound_inputs).context("recording the bound's inputs")?,
    );
    let target = Target {
        base_url: exec.url.clone(),
        backend: target_spec.backend,
        model: model.clone(),
        headers: target_spec.headers.clone(),
        api_key: target_spec.api_key.clone(),
        timeout: target_spec.timeout,
        ignore_eos: target_spec.ignore_eos,
        min_tokens: target_spec.min_tokens,
        prompt_ids: target_spec.prompt_ids,
        continuous_usage: target_spec.continuous_usage,
        extra_body: target_spec.extra_body.clone(),
        tls: Some(target_spec.tls.clone()),
    };
    let mut meta = RunMeta {
        schema_version: SCHEMA_VERSION,
        loadgen_version: env!("CARGO_PKG_VERSION").to_string(),
        command_line: redacted_command_line(std::env::args()),
        seed: run.seed,
        workload: prepared.workload_meta.clone(),
        schedule: prepared.schedule_meta.clone(),
        url: exec.url.clone(),
        backend: target_spec.backend.name().to_string(),
        model,
        server_version,
        host: host_info(),
        start_time: chrono::Utc::now().to_rfc3339(),
        approximate_lengths: prepared.prompts.is_approximate(),
        planned_requests: prepared.plan.requests.len() as u64,
        calibration: prepared.calibration.clone(),
        extra,
        complete: false,
        shard: run.shard.zip(run.start_at).map(|(shard, at)| ShardInfo {
            index: shard.index,
            count: shard.count,
            schedule_requests: prepared.schedule_requests,
            schedule_digest: prepared.schedule_digest.clone(),
            start_at: crate::run::clock::rfc3339(at),
            ready_before_start_ms: None,
            clock: crate::run::clock::clock_sync(),
        }),
        merged_from: Vec::new(),
        extra_body: target_spec.extra_body.as_ref().map(ExtraBody::to_value),
    };
    // Written first as it stands, so that a run killed hard still says what it was.
    if let Some(dir) = &exec.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_meta(dir, &meta)?;
    }
    let scraper = match &exec.out {
        Some(dir) if !run.scrape_interval.is_zero() => Some(Scraper::start(ScrapeTarget {
            base_url: exec.url.clone(),
            headers: target_spec.headers.clone(),
            api_key: target_spec.api_key.clone(),
            interval: run.scrape_interval,
            out_dir: dir.clone(),
            start_at: run.start_at,
            tls: Some(target_spec.tls.clone()),
        })),
        _ => None,
    };
    let outcome = send::send_plan(
        prepared.plan.clone(),
        target,
        prepared.prompts.clone(),
        SendOptions {
            out_dir: exec.out.clone(),
            slos: prepared.slos.clone(),
            progress: exec.progress,
            stop: exec.stop,
            start_at: run.start_at,
        },
    )
    .await;
    if let Some(scraper) = scraper {
        scraper.finish().await;
    }
    let mut outcome = outcome?;
    if let Some(dir) = &exec.out {
        meta.start_time = outcome.start_time.to_rfc3339();
        meta.complete = true;
        if let Some(shard) = meta.shard.as_mut() {
            shard.ready_before_start_ms = outcome.ready_before_start_ms;
            shard.clock = crate::run::clock::clock_sync();
        }
        write_meta(dir, &meta)?;
        // After the scraper's last scrape, which the timeline puts beside the records.
        let plan = &prepared.plan;
        let end = RunEnd {
            records: &outcome.records,
            metrics: &outcome.metrics,
            phases: PhaseBounds {
                warmup_s: plan.warmup_s,
                measured_end_s: plan.duration_s.map(|d| plan.warmup_s + d),
            },
            origin_unix_ms: outcome.start_time.timestamp_micros() as f64 / 1000.0,
            slice_s: run.slice.map(|s| s.as_secs_f64()),
            slo: run.slo.as_ref(),
            bound_inputs: &bound_inputs,
        };
        reports::folders::finish_run(dir, &end, &mut outcome.summary)?;
    }
    Ok(outcome)
}

/// The command line with the values of `--api-key` and `--header` replaced by a digest: enough
/// to tell two runs apart, never the secret.
pub fn redacted_command_line(args: impl IntoIterator<Item = String>) -> Vec<String> {
    const SECRET_FLAGS: [&str; 2] = ["--api-key", "--header"];
    let digest = |value: &str| format!("<redacted fnv1a:{:016x}>", fnv1a(value.as_bytes()));
    let mut out = Vec::new();
    let mut secret_next = false;
    for arg in args {
        if secret_next {
            out.push(digest(&arg));
            secret_next = false;
        } else if let Some((flag, value)) = arg
            .split_once('=')
            .filter(|(flag, _)| SECRET_FLAGS.contains(flag))
        {
            out.push(format!("{flag}={}", digest(value)));
        } else {
            secret_next = SECRET_FLAGS.contains(&arg.as_str());
            out.push(arg);
        }
    }
    out
}

fn write_meta(dir: &std::path::Path, meta: &RunMeta) -> Result<()> {
    let path = dir.join("meta.json");
    std::fs::write(&path, serde_json::to_string_pretty(meta)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_reach_the_recorded_command_line() {
        let argv = [
            "loadgen",
            "run",
            "--api-key",
            "sk-live-123",
            "--header=X-Token: abc",
            "--header",
            "Authorization: Bearer xyz",
            "--rate",
            "2",
        ];
        let line = redacted_command_line(argv.iter().map(|s| s.to_string())).join(" ");
        for secret in ["sk-live-123", "abc", "xyz"] {
            assert!(!line.contains(secret), "{line}");
        }
        assert!(
            line.contains("--api-key <redacted fnv1a:") && line.contains("--rate 2"),
            "{line}"
        );
        assert!(line.contains("--header=<redacted fnv1a:"), "{line}");
        // Two runs with another key tell apart.
        let other = redacted_command_line(["--api-key", "sk-live-124"].map(String::from));
        assert!(!line.contains(&other[1]));
    }
}
