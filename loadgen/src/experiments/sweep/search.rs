//! The knee search's levels (`knee_search` chooses each next rate) and the repeats of its
//! final bracket, `sweep.json` rewritten after every level.

use anyhow::Result;
use reports::folders::{SweepFile, SWEEP_FILE};
use reports::search::{SearchEnd, SearchPath, StepReason};

use super::knee_search::{self, Measured, Next, RepeatRun};
use super::levels::{cut_level, LevelRun, Levels};

/// The knee search (`knee_search`), `sweep.json` rewritten after every level.
pub(super) async fn run_search(
    levels: &Levels<'_>,
    file: &mut SweepFile,
    mut search: SearchPath,
    unloaded_missed: bool,
) -> Result<()> {
    let path = levels.out.join(SWEEP_FILE);
    let mut next = knee_search::start(&mut search, unloaded_missed);
    file.search = Some(search.clone());
    file.stop_reason = search.end_reason.clone();
    file.write(&path)?;
    while let Next::Run { rate, reason } = next {
        if levels.interrupted() {
            knee_search::interrupt(&mut search, rate);
            file.search = Some(search.clone());
            file.stop_reason = search.end_reason.clone();
            file.write(&path)?;
            break;
        }
        let i = file.levels.len();
        eprintln!("loadgen sweep: search: {reason} → {rate} req/s");
        let how = LevelRun {
            doubled: reason == StepReason::Rerun,
            repeat: 0,
        };
        let (entry, _) = levels.run(i, rate, how).await?;
        if levels.interrupted() {
            knee_search::interrupt(&mut search, rate);
            file.search = Some(search.clone());
            file.stop_reason = Some(cut_level(rate, &entry.dir));
            file.write(&path)?;
            break;
        }
        let verdict = knee_search::verdict(entry.saturated, entry.slo_verdict);
        next = knee_search::record(
            &mut search,
            Measured {
                dir: entry.dir.clone(),
                offered_rate: rate,
                scheduled_rate: entry.rates.map(|r| r.scheduled),
                completed_rate: entry.completed_rate,
                verdict,
            },
            reason,
        );
        let sustained = search.steps.last().map_or(0.0, |s| s.sustained_rate);
        file.levels.push(entry);
        eprintln!(
            "loadgen sweep: search: {verdict} at {rate} req/s (sustained {sustained:.3}); bracket {}",
            search.bracket()
        );
        file.rates = file.levels.iter().map(|l| l.offered_rate).collect();
        file.rates.sort_by(f64::total_cmp);
        file.rates.dedup();
        file.search = Some(search.clone());
        file.stop_reason = search.end_reason.clone();
        file.write(&path)?;
    }
    if let Some(reason) = &search.end_reason {
        eprintln!("loadgen sweep: search ended: {reason}");
    }
    Ok(())
}

/// The repeats of the search's final bracket (`--repeats`, [`knee_search::next_repeat`]),
/// `sweep.json` rewritten after every level; none when the search was interrupted.
pub(super) async fn run_search_repeats(levels: &Levels<'_>, file: &mut SweepFile) -> Result<()> {
    let path = levels.out.join(SWEEP_FILE);
    let Some(search) = file.search.clone() else {
        return Ok(());
    };
    if file.repeats < 2 || search.end == Some(SearchEnd::Interrupted) {
        return Ok(());
    }
    let mut done: Vec<RepeatRun> = Vec::new();
    while let Some(next) = knee_search::next_repeat(&search, file.repeats, &done) {
        if levels.interrupted() {
            file.stop_reason = Some(format!(
                "{}; interrupted before repeat {} at {} req/s",
                search.end_reason.as_deref().unwrap_or("search ended"),
                next.repeat,
                next.rate
            ));
            file.write(&path)?;
            return Ok(());
        }
        eprintln!(
            "loadgen sweep: repeat {} of {}: {:?} end → {} req/s",
            next.repeat,
            file.repeats - 1,
            next.side,
            next.rate
        );
        let how = LevelRun {
            doubled: false,
            repeat: next.repeat,
        };
        let (entry, _) = levels.run(file.levels.len(), next.rate, how).await?;
        if levels.interrupted() {
            file.stop_reason = Some(format!(
                "{}; {}",
                search.end_reason.as_deref().unwrap_or("search ended"),
                cut_level(next.rate, &entry.dir)
            ));
            file.write(&path)?;
            return Ok(());
        }
        let verdict = knee_search::verdict(entry.saturated, entry.slo_verdict);
        eprintln!(
            "loadgen sweep: repeat {}: {verdict} at {} req/s",
            next.repeat, next.rate
        );
        done.push(RepeatRun {
            repeat: next.repeat,
            rate: next.rate,
            verdict,
        });
        file.levels.push(entry);
        file.rates = file.levels.iter().map(|l| l.offered_rate).collect();
        file.rates.sort_by(f64::total_cmp);
        file.rates.dedup();
        file.write(&path)?;
    }
    if done.is_empty() {
        let note = format!(
            "--repeats {}: the search left no bracket with both ends to repeat",
            file.repeats
        );
        eprintln!("loadgen sweep: {note}");
        file.stop_reason = Some(format!(
            "{}; {note}",
            search.end_reason.as_deref().unwrap_or("search ended")
        ));
        file.write(&path)?;
    }
    Ok(())
}
