//! Joining the run folders of the K shards of one schedule (`--shard I/K`) into one run
//! folder that every command reads as if one client had sent the whole schedule: records and
//! schedule lines by request id, the measured-window histograms added up (never shard
//! percentiles averaged), the summary recomputed from the merged records. A sweep's shards
//! are merged level by level.
//!
//! Before anything is written the shards must prove they are one schedule: the same seed,
//! workload, schedule, target and start instant, every shard I/K present once, every request
//! id of the schedule owned by its shard, scheduled once and recorded once, and each shard's
//! histograms equal to those of its own records.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reports::histograms::{self, Histograms, HISTOGRAMS_FILE};
use reports::metrics::{compute, window_histograms, MetricsOptions};
use reports::records::{read_meta, read_records, HostInfo, MergedShard, RequestRecord, RunMeta};
use reports::server_metrics::{read_scrapes, SERVER_METRICS_FILE};
use reports::summary::Summary;
use reports::timeline::{self, Timeline};

use reports::folders::{LevelEntry, SweepFile, SWEEP_FILE};

/// What a merge joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MergedRun {
    pub shards: u64,
    /// Requests in the schedule (each with one record).
    pub requests: u64,
}

/// One shard's folder, loaded and checked against its own files.
struct ShardRun {
    dir: PathBuf,
    meta: RunMeta,
    /// `schedule.jsonl` lines by request id.
    schedule: BTreeMap<u64, String>,
    /// The (session, turn) of each scheduled request of a session run.
    turns: BTreeMap<u64, (u64, u32)>,
    records: Vec<RequestRecord>,
    histograms: Histograms,
    summary: Option<Summary>,
}

fn load_shard(dir: &Path) -> Result<ShardRun> {
    let meta = read_meta(&dir.join("meta.json"))?;
    let shard = meta.shard.as_ref().with_context(|| {
        format!(
            "{}: not a shard (meta.json has no `shard`: the run had no --shard I/K)",
            dir.display()
        )
    })?;
    if !meta.complete {
        bail!(
            "{}: shard {}/{} did not finish (meta.json `complete: false`); its records stay \
             there, but a merge would miss requests",
            dir.display(),
            shard.index,
            shard.count
        );
    }
    let path = dir.join("schedule.jsonl");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut schedule = BTreeMap::new();
    let mut turns = BTreeMap::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let value = serde_json::from_str::<serde_json::Value>(line).ok();
        let id = value
            .as_ref()
            .and_then(|v| v["id"].as_u64())
            .with_context(|| format!("{}:{}: no request `id`", path.display(), i + 1))?;
        // Sessions are dealt whole: a session's turns belong to the shard of its id.
        let session = value.as_ref().and_then(|v| {
            let s = &v["session"];
            Some((
                s["session"].as_u64()?,
                u32::try_from(s["turn"].as_u64()?).ok()?,
            ))
        });
        let owner = session.map_or(id, |(s, _)| s);
        if owner % shard.count != shard.index {
            bail!(
                "{}:{}: request {id} is not shard {}/{}'s ({} mod {} = {})",
                path.display(),
                i + 1,
                shard.index,
                shard.count,
                if session.is_some() {
                    "its session"
                } else {
                    "its id"
                },
                shard.count,
                owner % shard.count
            );
        }
        if let Some(turn) = session {
            turns.insert(id, turn);
        }
        if schedule.insert(id, line.to_string()).is_some() {
            bail!(
                "{}:{}: request {id} is scheduled twice",
                path.display(),
                i + 1
            );
        }
    }
    let records = read_records(&dir.join("records.jsonl"))?;
    let hist_path = dir.join(HISTOGRAMS_FILE);
    let histograms = histograms::read(&hist_path)?;
    if histograms != window_histograms(&records) {
        bail!(
            "{}: the histograms differ from those of the folder's records.jsonl (edited or \
             truncated files?)",
            hist_path.display()
        );
    }
    let summary_path = dir.join("summary.json");
    let summary = summary_path
        .is_file()
        .then(|| Summary::read(&summary_path))
        .transpose()?;
    Ok(ShardRun {
        dir: dir.to_path_buf(),
        meta,
        schedule,
        turns,
        records,
        histograms,
        summary,
    })
}

/// Fails unless every shard describes the same schedule as the first.
fn check_one_schedule(shards: &[ShardRun]) -> Result<u64> {
    let first = &shards[0];
    let info = first.meta.shard.as_ref().expect("checked in load_shard");
    let count = info.count;
    let same = |s: &ShardRun| -> Vec<(&str, bool)> {
        let (a, b) = (&first.meta, &s.meta);
        let (sa, sb) = (info, b.shard.as_ref().expect("checked in load_shard"));
        vec![
            ("shard count K", sa.count == sb.count),
            ("seed", a.seed == b.seed),
            ("workload", a.workload == b.workload),
            ("schedule", a.schedule == b.schedule),
            (
                "requests in the schedule",
                sa.schedule_requests == sb.schedule_requests,
            ),
            ("start instant (--start-at)", sa.start_at == sb.start_at),
            (
                "extra request body (--extra-body)",
                a.extra_body == b.extra_body,
            ),
            (
                "request options (digest of the request list and of every option that shapes \
                 a request)",
                sa.schedule_digest == sb.schedule_digest,
            ),
            ("server URL", a.url == b.url),
            ("backend", a.backend == b.backend),
            ("model", a.model == b.model),
        ]
    };
    for s in &shards[1..] {
        if let Some((what, _)) = same(s).into_iter().find(|(_, ok)| !ok) {
            bail!(
                "{} and {}: their {what} differ, so they are not shards of one schedule",
                first.dir.display(),
                s.dir.display()
            );
        }
    }
    let mut seen: BTreeMap<u64, &Path> = BTreeMap::new();
    for s in shards {
        let index = s.meta.shard.as_ref().expect("checked").index;
        if let Some(other) = seen.insert(index, &s.dir) {
            bail!(
                "{} and {} are both shard {index}/{count}",
                other.display(),
                s.dir.display()
            );
        }
    }
    if let Some(missing) = (0..count).find(|i| !seen.contains_key(i)) {
        bail!(
            "shard {missing}/{count} is missing ({} folders given)",
            shards.len()
        );
    }
    Ok(info.schedule_requests)
}

/// The shards of one schedule, checked, with their merged records; nothing written yet.
struct CheckedMerge {
    /// In shard order.
    shards: Vec<ShardRun>,
    /// Requests in the schedule.
    n: u64,
    /// The merged `schedule.jsonl` lines, by id.
    schedule: Vec<String>,
    records: Vec<RequestRecord>,
    histograms: Histograms,
}

/// Merges the shard run folders `dirs` into `out` (a new or empty folder).
pub fn merge_runs(dirs: &[PathBuf], out: &Path) -> Result<MergedRun> {
    let checked = check_shards(dirs)?;
    prepare_out(out)?;
    write_merge(&checked, out)
}

/// Loads the shard folders `dirs` and checks that they are one schedule, every request
/// scheduled and recorded once.
fn check_shards(dirs: &[PathBuf]) -> Result<CheckedMerge> {
    if dirs.is_empty() {
        bail!("loadgen merge: no shard folder given");
    }
    let mut shards = dirs
        .iter()
        .map(|d| load_shard(d))
        .collect::<Result<Vec<_>>>()?;
    let n = check_one_schedule(&shards)?;
    shards.sort_by_key(|s| s.meta.shard.as_ref().map(|i| i.index));
    // Every id of the schedule scheduled by its shard once, and recorded once.
    let mut schedule: BTreeMap<u64, &str> = BTreeMap::new();
    let mut records: Vec<RequestRecord> = Vec::new();
    for s in &shards {
        for (&id, line) in &s.schedule {
            if id >= n {
                bail!(
                    "{}: request {id} is past the schedule's {n} requests",
                    s.dir.display()
                );
            }
            schedule.insert(id, line);
        }
        let mut recorded = BTreeSet::new();
        for r in &s.records {
            if !s.schedule.contains_key(&r.id) {
                bail!(
                    "{}/records.jsonl: request {} is not in this shard's schedule",
                    s.dir.display(),
                    r.id
                );
            }
            if !recorded.insert(r.id) {
                bail!(
                    "{}/records.jsonl: request {} is recorded twice",
                    s.dir.display(),
                    r.id
                );
            }
        }
        // A session's later turns have no record once it ended before them (its last
        // record says how).
        let mut ended: BTreeMap<u64, u32> = BTreeMap::new();
        for r in &s.records {
            if let Some(t) = r.session.filter(|t| t.end.is_some()) {
                ended.insert(t.session, t.turn);
            }
        }
        let never_sent = |id: &u64| {
            s.turns
                .get(id)
                .is_some_and(|(session, turn)| ended.get(session).is_some_and(|last| turn > last))
        };
        if let Some(id) = s
            .schedule
            .keys()
            .find(|id| !recorded.contains(id) && !never_sent(id))
        {
            bail!("{}: scheduled request {id} has no record", s.dir.display());
        }
        records.extend(s.records.iter().cloned());
    }
    if let Some(id) = (0..n).find(|id| !schedule.contains_key(id)) {
        bail!("request {id} of the {n}-request schedule is in no shard");
    }
    records.sort_by_key(|r| r.id);

    let mut merged = Histograms::new();
    for s in &shards {
        histograms::add(&mut merged, &s.histograms)
            .with_context(|| format!("{}", s.dir.display()))?;
    }
    let schedule = schedule.values().map(|l| l.to_string()).collect();
    Ok(CheckedMerge {
        shards,
        n,
        schedule,
        records,
        histograms: merged,
    })
}

/// Writes the merged run folder of `checked` into `out` (already created, empty).
fn write_merge(checked: &CheckedMerge, out: &Path) -> Result<MergedRun> {
    let (shards, n, records) = (&checked.shards, checked.n, &checked.records);
    let mut file = std::io::BufWriter::new(create(&out.join("schedule.jsonl"))?);
    for line in &checked.schedule {
        writeln!(file, "{line}")?;
    }
    file.flush()?;
    let mut file = std::io::BufWriter::new(create(&out.join("records.jsonl"))?);
    for r in records {
        writeln!(file, "{}", serde_json::to_string(r)?)?;
    }
    file.flush()?;

    let slos = shards[0]
        .summary
        .as_ref()
        .map(|s| s.slos.clone())
        .unwrap_or_default();
    // The busiest worker decides whether the client may have been the bottleneck.
    let client_cpu = shards
        .iter()
        .filter_map(|s| s.summary.as_ref().and_then(|m| m.client_cpu))
        .reduce(f64::max);
    let opts = MetricsOptions {
        slos: slos.clone(),
        open_loop: true,
        client_cpu,
    };
    let metrics = compute(records, &opts);
    let mut summary = Summary::new(&metrics, &slos, false, 0);
    summary.classes = reports::classes::of(records, &opts, metrics.duration_s);
    summary.write(&out.join("summary.json"))?;
    let start = chrono::DateTime::parse_from_rfc3339(&shards[0].meta.start_time)
        .with_context(|| format!("{}/meta.json: start_time", shards[0].dir.display()))?;
    histograms::write(
        &out.join(HISTOGRAMS_FILE),
        &checked.histograms,
        start.into(),
        Duration::from_secs_f64(metrics.duration_s),
    )?;
    // Every worker scraped the same server; the first worker's scrapes stand for all.
    let scrapes = shards[0].dir.join(SERVER_METRICS_FILE);
    if scrapes.is_file() {
        std::fs::copy(&scrapes, out.join(SERVER_METRICS_FILE))
            .with_context(|| format!("copying {}", scrapes.display()))?;
    }
    let meta = merged_meta(shards, n);
    std::fs::write(
        out.join("meta.json"),
        serde_json::to_string_pretty(&meta)? + "\n",
    )
    .with_context(|| format!("writing {}", out.join("meta.json").display()))?;
    // The merged timeline is rebuilt from the merged records, in the first shard's slices.
    if let Some(first) = Timeline::read(&shards[0].dir)? {
        let scrapes = read_scrapes(out)?;
        let origin_unix_ms = start.timestamp_micros() as f64 / 1000.0;
        timeline::build(
            records,
            first.phases,
            Some(first.slice_s),
            &scrapes,
            origin_unix_ms,
        )
        .write(out)?;
    }
    Ok(MergedRun {
        shards: shards.len() as u64,
        requests: n,
    })
}

/// Shard 0's conditions, for the whole schedule, with every shard's own account (`shards`
/// in shard order).
fn merged_meta(shards: &[ShardRun], n: u64) -> RunMeta {
    let sorted = shards;
    let mut meta = sorted[0].meta.clone();
    meta.command_line = crate::run::execute::redacted_command_line(std::env::args());
    meta.planned_requests = n;
    meta.shard = None;
    meta.complete = true;
    meta.calibration = None;
    let distinct = |f: fn(&HostInfo) -> &String| {
        let names: BTreeSet<&str> = sorted.iter().map(|s| f(&s.meta.host).as_str()).collect();
        names.into_iter().collect::<Vec<_>>().join(", ")
    };
    meta.host = HostInfo {
        hostname: format!("{} workers: {}", sorted.len(), distinct(|h| &h.hostname)),
        cpu_model: distinct(|h| &h.cpu_model),
        // Workers on one host share its cores.
        cores: sorted
            .iter()
            .map(|s| (&s.meta.host.hostname, s.meta.host.cores))
            .collect::<BTreeMap<_, _>>()
            .values()
            .sum(),
        os: distinct(|h| &h.os),
    };
    meta.merged_from = sorted
        .iter()
        .map(|s| MergedShard {
            folder: s.dir.display().to_string(),
            command_line: s.meta.command_line.clone(),
            shard: s.meta.shard.clone().expect("checked in load_shard"),
            host: s.meta.host.clone(),
            records: s.records.len() as u64,
            client_cpu: s.summary.as_ref().and_then(|m| m.client_cpu),
        })
        .collect();
    meta
}

fn create(path: &Path) -> Result<std::fs::File> {
    std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))
}

/// Creates `out`, which must not hold anything yet (a merge never overwrites a run).
fn prepare_out(out: &Path) -> Result<()> {
    if out.exists()
        && std::fs::read_dir(out)
            .with_context(|| format!("reading {}", out.display()))?
            .next()
            .is_some()
    {
        bail!(
            "--out {}: the folder is not empty (a merge writes a new run folder)",
            out.display()
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))
}

/// Merges the shard sweep folders `dirs` level by level into `out`, and writes its
/// `sweep.json` with each level judged again on the merged records.
pub fn merge_sweeps(dirs: &[PathBuf], out: &Path) -> Result<Vec<MergedRun>> {
    let files = dirs
        .iter()
        .map(|d| SweepFile::read(&d.join(SWEEP_FILE)))
        .collect::<Result<Vec<_>>>()?;
    let Some(first) = files.first() else {
        bail!("loadgen merge: no sweep folder given");
    };
    for (d, f) in dirs.iter().zip(&files).skip(1) {
        let levels = |f: &SweepFile| f.levels.iter().map(|l| l.dir.clone()).collect::<Vec<_>>();
        let differ = if f.rates != first.rates {
            "rates"
        } else if f.slo != first.slo {
            "SLOs"
        } else if levels(f) != levels(first) {
            "completed levels"
        } else {
            continue;
        };
        bail!(
            "{} and {}: their {differ} differ, so they are not shards of one sweep",
            dirs[0].display(),
            d.display()
        );
    }
    // Every level checked before anything is written.
    let checked = first
        .levels
        .iter()
        .map(|level| {
            let level_dirs: Vec<PathBuf> = dirs.iter().map(|d| d.join(&level.dir)).collect();
            check_shards(&level_dirs).with_context(|| format!("sweep level {}", level.dir))
        })
        .collect::<Result<Vec<_>>>()?;
    prepare_out(out)?;
    let slo = first
        .slo
        .as_deref()
        .map(reports::slo::SloSpec::parse)
        .transpose()?;
    let mut merged = SweepFile {
        schema_version: first.schema_version,
        slo: first.slo.clone(),
        rates: first.rates.clone(),
        probe: None,
        search: None,
        repeats: 1,
        levels: Vec::new(),
        stop_reason: None,
    };
    let mut runs = Vec::new();
    for (level, checked) in first.levels.iter().zip(&checked) {
        let level_out = out.join(&level.dir);
        std::fs::create_dir_all(&level_out)
            .with_context(|| format!("creating {}", level_out.display()))?;
        runs.push(write_merge(checked, &level_out)?);
        let (entry, _) =
            LevelEntry::measure(out, level.dir.clone(), level.offered_rate, slo.as_ref())?;
        merged.levels.push(entry);
    }
    merged.write(&out.join(SWEEP_FILE))?;
    Ok(runs)
}
