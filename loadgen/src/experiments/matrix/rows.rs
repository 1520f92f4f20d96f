//! A matrix's rows made ready before any runs: parsed with the matrix's defaults, scaled,
//! their plans built (no network), then clipped to the server's context.

use anyhow::{bail, Context, Result};

use super::warm;
use crate::experiments::sweep::repeat_seed;
use crate::load::workload::prompt::{salt_for, SaltFor};
use crate::load::workload::PromptSource;
use crate::run::prepare::prepare_run;
use crate::spec::matrix::MatrixArgs;
use crate::spec::matrix_toml::{Prefix, RowArgs, RowSpec};
use crate::spec::run_args::RunArgs;
use crate::spec::sweep::DEFAULT_PROBE_DURATION;
use crate::spec::RunSpec;

/// The chat template's tokens around a prompt (a system prompt, role markers), kept free
/// under the server's context when requests are clipped to it (`--backend chat`).
const CHAT_TEMPLATE_ROOM: u32 = 64;

/// One row ready to run.
#[derive(Clone)]
pub(super) struct PreparedRow {
    pub(super) spec: RowSpec,
    pub(super) args: RowArgs,
    /// Its folder, relative to the matrix's.
    pub(super) folder: String,
    /// The load in words.
    pub(super) load: String,
    /// `cold`, `warm`, or why cold cannot be promised.
    pub(super) prefix: String,
}

/// Each row parsed with the matrix's defaults, scaled, and its plan built once (no
/// network), so that a bad row is refused before anything runs.
pub(super) fn check_rows(args: &MatrixArgs, specs: Vec<RowSpec>) -> Result<Vec<PreparedRow>> {
    specs
        .into_iter()
        .enumerate()
        .map(|(i, spec)| {
            let parsed = spec.args(&args.defaults)?;
            let label = spec.label();
            let mut row_args = parsed.args.clone();
            scale_row(&mut row_args, args.scale)
                .with_context(|| format!("{label} with --scale {}", args.scale))?;
            let run = row_args.run_mut();
            // Words of this row's own: nothing an earlier row (or matrix) sent matches.
            let base = if run.prompt_salt == 0 {
                chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default() as u64
            } else {
                run.prompt_salt
            };
            run.prompt_salt = salt_for(base, SaltFor::MatrixRow, i);
            let prepared = RunSpec::from_args(run)
                .and_then(|spec| prepare_run(&spec))
                .with_context(|| format!("{label}: its workload"))?;
            crate::spec::bound::resolve(&run.bound.options(), None)
                .with_context(|| format!("{label}: the bound's inputs"))?;
            let replay = prepared.schedule_meta["arrival"] == "trace";
            if !spec.search && !parsed.gave("rate") && !parsed.gave("concurrency") && !replay {
                bail!("{label}: no load: give `rate` (requests/s), `concurrency` or `rates = \"search\"` (in the row, or as the matrix's --rate / --concurrency)");
            }
            if spec.search && !parsed.gave("slo") {
                bail!("{label}: a knee search needs an SLO: the row's `slo` (e.g. \"ttft:p90:2s,tpot:p90:100ms\") or the matrix's --slo");
            }
            if !parsed.gave("duration") && !parsed.gave("num-prompts") && !replay {
                bail!("{label}: give `duration` or `num-prompts` (in the row, or as the matrix's --duration / --num-prompts): how much of the load to measure");
            }
            if spec.prefix == Prefix::Warm && warm::prefixes(&prepared.plan).is_empty() {
                bail!("{label}, key `prefix`: `warm` sends the row's shared prefixes before its window, but its requests share none (give `prefix-len` and `prefix-groups`)");
            }
            let load = match (&row_args, prepared.schedule_meta["mode"].as_str()) {
                (RowArgs::Search(sweep), _) => {
                    format!("knee search under {}", sweep.run.slo.as_deref().unwrap_or(""))
                }
                (RowArgs::Run(run), Some("closed")) => {
                    format!("concurrency {}", run.concurrency.unwrap_or(1))
                }
                (_, _) if replay => "the trace's timestamps".into(),
                (RowArgs::Run(run), _) => format!("rate {} req/s", run.rate),
            };
            let text_prompts = prepared
                .plan
                .requests
                .iter()
                .any(|r| matches!(r.spec.prompt, PromptSource::Text(_)));
            let prefix = match spec.prefix {
                Prefix::Cold if text_prompts => {
                    "cold, except literal-text prompts (sent as they are)".into()
                }
                p => p.name().to_string(),
            };
            Ok(PreparedRow {
                folder: folder_name(&spec),
                spec,
                args: row_args,
                load,
                prefix,
            })
        })
        .collect()
}

/// The tokens kept free under the server's context when a request is clipped to it: a
/// chat template's tokens around the prompt, or a BOS.
fn context_room(run: &RunArgs) -> u32 {
    if run.backend.takes_conversations() {
        CHAT_TEMPLATE_ROOM
    } else {
        1
    }
}

/// Clips every row's requests to its model's context on the server at `url` (where the
/// server says it), and builds each plan again so that a row that cannot fit fails here,
/// before the first row runs.
pub(super) async fn fit_rows(rows: &mut [PreparedRow], url: &str) -> Result<()> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let run = first.args.run();
    let headers = crate::spec::run_args::parse_headers(&run.headers)?;
    let tls = crate::wire::tls::TlsSettings::new(&run.tls.options())?;
    let identity =
        crate::wire::identify::identify(url, &headers, run.api_key.as_deref(), Some(&tls)).await;
    for row in rows.iter_mut() {
        let label = row.spec.label();
        let run = row.args.run_mut();
        run.url = url.to_string();
        if run.sessions_flag().is_some() {
            continue;
        }
        let Some(context) = identity.context_len(run.model.as_deref()) else {
            continue;
        };
        let mut limit = context.saturating_sub(context_room(run));
        // Without the model's tokenizer a prompt's length is approximate: a margin of 10%.
        if run.tokenizer.is_none() {
            limit = limit / 10 * 9;
        }
        run.max_model_len = Some(run.max_model_len.map_or(limit, |own| own.min(limit)));
        let prepared = RunSpec::from_args(run)
            .and_then(|spec| prepare_run(&spec))
            .with_context(|| {
                format!("{label}: its workload clipped to the server's context of {context} tokens")
            })?;
        let clipped = prepared.workload_meta["max_model_len"]["clipped_requests"]
            .as_u64()
            .unwrap_or(0);
        if clipped > 0 {
            let applied = run.max_model_len.unwrap_or(limit);
            eprintln!("loadgen matrix: {label}: {clipped} request(s) shortened to {applied} tokens (the server's context: {context})");
        }
    }
    Ok(())
}

impl PreparedRow {
    /// The row's `repeat`-th repeat (`--repeats`; 0: the row itself): a fresh seed and
    /// prompt words, in `row-NN-NAME/repeat-K/`.
    pub(super) fn repeat(&self, repeat: usize) -> PreparedRow {
        let mut row = self.clone();
        if repeat > 0 {
            row.folder = format!("{}/repeat-{repeat}", self.folder);
            let run = row.args.run_mut();
            run.seed = repeat_seed(run.seed, repeat);
            run.prompt_salt = salt_for(run.prompt_salt, SaltFor::MatrixRepeat, repeat);
        }
        row
    }
}

/// `row-03-NAME`: the position keeps folders apart and in order.
fn folder_name(spec: &RowSpec) -> String {
    let slug: String = spec
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if slug.is_empty() {
        format!("row-{:02}", spec.position)
    } else {
        format!("row-{:02}-{slug}", spec.position)
    }
}

/// `--scale`: lengths through `--length-scale`, request counts and durations multiplied
/// here. A trace's own timestamps are not: scaling them would change the rate.
fn scale_row(args: &mut RowArgs, scale: f64) -> Result<()> {
    if scale == 1.0 {
        return Ok(());
    }
    let run = args.run_mut();
    if run.sessions_flag().is_some() {
        bail!("a multi-turn session's prompts grow with its history and cannot be scaled; run this matrix at --scale 1 or shape the row with max-history-tokens");
    }
    run.length_scale *= scale;
    run.warmup = run.warmup.mul_f64(scale);
    run.cooldown = run.cooldown.mul_f64(scale);
    run.duration = run.duration.map(|d| d.mul_f64(scale));
    run.ramp_up = run.ramp_up.map(|d| d.mul_f64(scale));
    run.num_prompts = run
        .num_prompts
        .map(|n| ((n as f64 * scale).ceil() as usize).max(1));
    if let RowArgs::Search(sweep) = args {
        sweep.probe_duration = Some(
            sweep
                .probe_duration
                .unwrap_or(DEFAULT_PROBE_DURATION)
                .mul_f64(scale),
        );
    }
    Ok(())
}
