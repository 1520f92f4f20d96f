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

use anyhow::{bail, Context, Result};
use reports::folders::{round_dir, Side};
use serde_json::json;

use crate::experiments::server::{self, ServerProcess};
use crate::run::execute::{execute_prepared, Execution};
use crate::run::prepare::prepare_run;
use crate::run::stop::stop_on_signals;
use crate::spec::compare::ServerSpec;
use crate::spec::RunSpec;

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

/// Refuses what online rounds cannot run: no rounds, or a sharded schedule (`sharded`: a
/// `--shard` or `--start-at` given).
pub fn refuse_rounds(rounds: usize, sharded: bool) -> Result<()> {
    if rounds == 0 {
        bail!("loadgen compare: --rounds must be at least 1");
    }
    if sharded {
        bail!("loadgen compare: --shard / --start-at are for run and sweep; an online comparison alternates its rounds from one client");
    }
    Ok(())
}

/// Runs `rounds` online rounds per side of `run` (see the module doc), each server command
/// given `server_timeout` to answer `/health`; returns each side's round folders in order.
pub async fn run_rounds(
    run: &RunSpec,
    rounds: usize,
    server_timeout: Duration,
    a: &ServerSpec,
    b: &ServerSpec,
    out: &Path,
) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    refuse_rounds(rounds, run.shard.is_some() || run.start_at.is_some())?;
    let stop = stop_on_signals()?;
    // Built once: both sides and every round get the identical requests and schedule.
    let prepared = prepare_run(run)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let order = round_order(rounds);
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
                let s = server::start(cmd, &dir.join("server.log"), server_timeout)
                    .await
                    .with_context(|| {
                        format!("starting server {} for round {round}", side.label())
                    })?;
                (s.url.clone(), Some(s))
            }
        };
        let identity = crate::wire::identify::identify(
            &url,
            &run.target.headers,
            run.target.api_key.as_deref(),
            Some(&run.target.tls),
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
            run,
            &prepared,
            Execution {
                url,
                out: Some(dir.clone()),
                server_version: identity.version,
                extra,
                progress: run.progress,
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
}
