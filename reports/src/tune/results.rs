//! What `loadgen tune` makes of each configuration and of the two best: a configuration's
//! capacity, crossing interval and numbers at capacity from its knee search's folder; the
//! ranking; and the verdict of the paired comparison between the winner and the runner-up.

use std::path::Path;

use super::{ConfigStatus, Configuration, LevelPoint, Separation, TuneFile};
use crate::ab::{AbReport, Verdict};
use crate::capacity::{capacity_plan, CapacityPlan, PlanOptions, TargetLoad};
use crate::samples::metric_label;
use crate::slo::SloSpec;
use crate::stats::{percentile_nearest_rank, Bootstrap};
use anyhow::Result;

use crate::folders::{load_sweep, SweepFile, SWEEP_FILE};
use crate::metrics::SloMetric;

/// The knee search's results in `sweep_dir`, filled into `config`; returns the capacity
/// plan under `options` (its crossing is the capacity's interval), or `None` when the search
/// ran no level (not met even unloaded).
pub fn measure(
    config: &mut Configuration,
    sweep_dir: &Path,
    slo: &SloSpec,
    options: &PlanOptions,
) -> Result<Option<CapacityPlan>> {
    let file = SweepFile::read(&sweep_dir.join(SWEEP_FILE))?;
    config.search_end = file.stop_reason.clone();
    config.search = file.search.clone();
    if file.levels.is_empty() {
        return Ok(None);
    }
    let sweep = load_sweep(sweep_dir)?;
    let plan = capacity_plan(&sweep.levels, slo, options)?;
    config.levels = sweep
        .levels
        .iter()
        .map(|l| LevelPoint {
            offered_rate: l.offered_rate,
            sustained_rate: l.sustained_rate(),
            output_tok_per_s: l.output_tokens_per_s,
            per_user_tok_per_s: percentile_nearest_rank(&l.samples.values(SloMetric::Tpot), 50.0)
                .filter(|t| *t > 0.0)
                .map(|t| 1000.0 / t),
            passed: slo.check(&l.samples).met && !l.saturated,
        })
        .collect();
    let Some(max) = plan.max_sustainable else {
        return Ok(Some(plan));
    };
    config.capacity = Some(max.sustained_rate);
    config.capacity_offered_rate = Some(max.offered_rate);
    config.crossing = plan.crossing;
    config.crossing_between_runs = plan.crossing_between_runs;
    config.run_crossings = plan.run_crossings.clone();
    if let Some(search) = &file.search {
        let bracket = search.bracket();
        config.capacity_low = bracket.lower.map(|e| e.rate);
        config.capacity_high = bracket.upper.map(|e| e.rate);
    }
    // The plan pools the levels run at one rate: the last run at the knee's rate is its own.
    let level = sweep
        .levels
        .iter()
        .rfind(|l| l.offered_rate == max.offered_rate);
    if let Some(level) = level {
        let p = config.latency_percentile;
        config.ttft_ms = percentile_nearest_rank(&level.samples.values(SloMetric::Ttft), p);
        config.tpot_ms = percentile_nearest_rank(&level.samples.values(SloMetric::Tpot), p);
        config.output_tok_per_s = Some(level.output_tokens_per_s);
        let server = level.server.as_ref();
        config.server_running_mean = server
            .and_then(|s| s.get("requests running"))
            .map(|q| q.mean);
        config.server_kv_usage_max = server
            .and_then(|s| s.get("KV-cache usage (fraction)"))
            .map(|q| q.max);
    }
    Ok(Some(plan))
}

/// Plan options that size nothing the tune reports: a stand-in target for a configuration's
/// own plan, whose max sustainable level and crossing are all it uses.
pub fn measuring_options(seed: u64) -> PlanOptions {
    PlanOptions {
        target: TargetLoad::Qps(1.0),
        gpus_per_instance: 1,
        headroom: 1.0,
        gpu_hour_usd: None,
        bootstrap: Bootstrap {
            seed,
            ..Bootstrap::default()
        },
    }
}

/// The configurations that met the SLO, best first: by capacity, a tie to the one whose
/// values come first in the knob lists.
pub fn ranking(file: &TuneFile) -> Vec<usize> {
    let mut ranked: Vec<usize> = (0..file.configurations.len())
        .filter(|&i| {
            let c = &file.configurations[i];
            c.status == ConfigStatus::Ok && c.capacity.is_some()
        })
        .collect();
    ranked.sort_by(|&a, &b| {
        let (ca, cb) = (&file.configurations[a], &file.configurations[b]);
        cb.capacity
            .unwrap_or_default()
            .total_cmp(&ca.capacity.unwrap_or_default())
            .then_with(|| {
                file.value_order(&ca.knobs)
                    .cmp(&file.value_order(&cb.knobs))
            })
    });
    ranked
}

/// A (the higher capacity) against B (the runner-up) on the SLO's metrics. At the
/// runner-up's capacity both meet the SLO, so a better configuration may show only in the
/// tail: a metric favours A when its verdict is "B slower" (medians) or when the 95%
/// bootstrap CI of B's p99 over A's lies wholly beyond 1 + the margin; it favours B the other
/// way round. Better: some SLO metric favours A and none B; else indistinguishable.
pub fn separation(analysis: &AbReport, slo: &SloSpec) -> (Separation, Vec<(String, String)>) {
    let judged: Vec<_> = analysis
        .metrics
        .iter()
        .filter(|m| slo.targets.iter().any(|t| t.metric == m.metric))
        .collect();
    let tail = |m: &crate::ab::MetricVerdict| -> (bool, bool) {
        match (m.p99_ratio, m.margin) {
            (Some(ci), Some(margin)) => (ci.lower > 1.0 + margin, ci.upper < 1.0 - margin),
            _ => (false, false),
        }
    };
    let verdicts = judged
        .iter()
        .map(|m| {
            let p99 = m.p99_ratio.map_or("–".into(), |c| {
                format!("p99 B/A {:.3} [{:.3}, {:.3}]", c.estimate, c.lower, c.upper)
            });
            (
                metric_label(m.metric).to_string(),
                format!("median: {}; {p99}", m.verdict_text()),
            )
        })
        .collect();
    let favours_a = judged
        .iter()
        .any(|m| m.verdict == Verdict::BSlower || tail(m).0);
    let favours_b = judged
        .iter()
        .any(|m| m.verdict == Verdict::BFaster || tail(m).1);
    let separation = if favours_a && !favours_b {
        Separation::Better
    } else {
        Separation::Indistinguishable
    };
    (separation, verdicts)
}

/// Whether `a`'s capacity exceeds `b`'s beyond the spread of their runs' crossings
/// (`--repeats`): Welch's t-test over the crossings each run bracketed, one-sided at
/// `alpha`; why, in words. Fewer than two runs of either that bracketed a crossing leave
/// the spread unknown, and "better" is not claimed.
pub fn beyond_between_runs(a: &Configuration, b: &Configuration, alpha: f64) -> (bool, String) {
    let crossings =
        |c: &Configuration| -> Vec<f64> { c.run_crossings.iter().flatten().copied().collect() };
    let (xa, xb) = (crossings(a), crossings(b));
    let listed = |x: &[f64]| {
        x.iter()
            .map(|v| format!("{v:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(test) = crate::stats::welch_t_test(&xa, &xb) else {
        return (
            false,
            format!(
                "the runs' crossings ({}: {}; {}: {} req/s) are too few to measure their \
                 spread: better is not claimed",
                a.dir,
                listed(&xa),
                b.dir,
                listed(&xb)
            ),
        );
    };
    let one_sided = if test.t > 0.0 {
        test.p_value / 2.0
    } else {
        1.0 - test.p_value / 2.0
    };
    let beyond = one_sided < alpha;
    (
        beyond,
        format!(
            "the runs' crossings, {}: {} against {}: {} req/s: Welch t = {:.2}, {:.1} df, \
             one-sided p = {one_sided:.3} ({} α = {alpha})",
            a.dir,
            listed(&xa),
            b.dir,
            listed(&xb),
            test.t,
            test.df,
            if beyond { "<" } else { "≥" }
        ),
    )
}

/// Whether a guided tune keeps a move from `base` to `moved`, and why in words. With
/// `repeats` > 1: `moved`'s runs' crossings exceed `base`'s beyond their spread
/// ([`beyond_between_runs`]) and its capacity gains at least `min_effect`. Without repeats
/// the run-to-run spread is unmeasured, so the single run's interval stands in, and the
/// words say so: the lower end of `moved`'s crossing interval (its capacity without one)
/// must lie above the upper end of `base`'s (the rate that broke its SLO without one), and
/// the gain be at least `min_effect`.
pub fn move_improves(
    base: &Configuration,
    moved: &Configuration,
    repeats: u32,
    alpha: f64,
    min_effect: f64,
) -> (bool, String) {
    let Some(after) = moved.capacity.filter(|_| moved.status == ConfigStatus::Ok) else {
        return (
            false,
            format!("{} found no capacity under the SLO", moved.dir),
        );
    };
    let Some(before) = base.capacity else {
        return (
            true,
            format!(
                "{} met the SLO at no rate, {} up to {after:.3} req/s",
                base.dir, moved.dir
            ),
        );
    };
    let gain = after / before - 1.0;
    let effect = format!(
        "capacity {before:.3} → {after:.3} req/s ({:+.1}%, --min-effect {:.1}%)",
        gain * 100.0,
        min_effect * 100.0
    );
    if repeats > 1 {
        let (beyond, why) = beyond_between_runs(moved, base, alpha);
        let kept = beyond && gain >= min_effect;
        return (kept, format!("{effect}; {why}"));
    }
    let base_high = base.crossing.map(|c| c.upper).or(base.capacity_high);
    let moved_low = moved.crossing.map_or(after, |c| c.lower);
    let Some(base_high) = base_high else {
        return (
            false,
            format!(
                "{effect}; {}'s search broke its SLO at no rate, so there is no interval to beat",
                base.dir
            ),
        );
    };
    let kept = moved_low > base_high && gain >= min_effect;
    (
        kept,
        format!(
            "{effect}; without --repeats the run-to-run spread is not measured, so the single \
             runs' intervals decide: {}'s lower end {moved_low:.3} {} {}'s upper end \
             {base_high:.3} req/s",
            moved.dir,
            if moved_low > base_high { ">" } else { "≤" },
            base.dir
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::Knobs;

    #[test]
    fn a_move_is_kept_beyond_the_interval_and_the_effect() {
        let with = |slots: &str, capacity: f64, low: f64, high: f64| {
            let mut c = config(slots, Some(capacity), ConfigStatus::Ok);
            c.crossing = Some(crate::stats::ConfidenceInterval {
                estimate: (low + high) / 2.0,
                lower: low,
                upper: high,
                confidence: 0.95,
            });
            c
        };
        let base = with("1", 10.0, 10.2, 10.8);
        let (kept, why) = move_improves(&base, &with("2", 20.0, 20.1, 21.0), 1, 0.05, 0.02);
        assert!(kept, "{why}");
        assert!(
            why.starts_with("capacity 10.000 → 20.000 req/s (+100.0%, --min-effect 2.0%)"),
            "{why}"
        );
        assert!(
            why.contains("config-2's lower end 20.100 > config-1's upper end 10.800"),
            "{why}"
        );
        // Overlapping intervals, or a gain under --min-effect, are not kept.
        assert!(!move_improves(&base, &with("2", 10.5, 10.6, 11.0), 1, 0.05, 0.02).0);
        assert!(!move_improves(&base, &with("2", 10.1, 10.9, 11.0), 1, 0.05, 0.02).0);
        // A move that met the SLO at no rate is not kept; one from such a base is.
        assert!(!move_improves(&base, &config("2", None, ConfigStatus::Ok), 1, 0.05, 0.02).0);
        assert!(move_improves(&config("1", None, ConfigStatus::Ok), &base, 1, 0.05, 0.02).0);
        // With repeats, the runs' crossings decide.
        let mut runs = with("2", 20.0, 20.1, 21.0);
        runs.run_crossings = vec![Some(20.0), Some(21.0), Some(19.5)];
        let mut base_runs = base.clone();
        base_runs.run_crossings = vec![Some(10.0), Some(11.0), Some(10.5)];
        let (kept, why) = move_improves(&base_runs, &runs, 3, 0.05, 0.02);
        assert!(kept && why.contains("Welch"), "{why}");
    }

    fn config(slots: &str, capacity: Option<f64>, status: ConfigStatus) -> Configuration {
        let mut c = Configuration::new(
            Knobs::from([("slots".to_string(), slots.to_string())]),
            format!("mock --slots {slots}"),
            format!("config-{slots}"),
            90.0,
        );
        c.status = status;
        c.capacity = capacity;
        c
    }

    /// Better beyond the between-run spread: separated crossings are; overlapping ones,
    /// reversed ones, and too few runs are not.
    #[test]
    fn between_runs_needs_crossings_apart_beyond_their_spread() {
        let with = |crossings: &[Option<f64>]| {
            let mut c = config("4", Some(10.0), ConfigStatus::Ok);
            c.run_crossings = crossings.to_vec();
            c
        };
        let apart = with(&[Some(20.0), Some(21.0), Some(19.5)]);
        let below = with(&[Some(10.0), Some(11.0), Some(10.5)]);
        let (beyond, why) = beyond_between_runs(&apart, &below, 0.05);
        assert!(beyond, "{why}");
        assert!(
            why.starts_with("the runs' crossings, config-4: 20.000, 21.000, 19.500 against"),
            "{why}"
        );
        assert!(!beyond_between_runs(&below, &apart, 0.05).0);
        let overlapping = with(&[Some(11.0), Some(19.0), Some(15.0)]);
        let near = with(&[Some(13.0), Some(14.0), Some(12.0)]);
        assert!(!beyond_between_runs(&overlapping, &near, 0.05).0);
        let (beyond, why) = beyond_between_runs(&apart, &with(&[Some(10.0), None, None]), 0.05);
        assert!(!beyond && why.contains("too few"), "{why}");
    }

    #[test]
    fn ranking_is_by_capacity_then_by_the_knob_lists_order() {
        let file = TuneFile {
            schema_version: 1,
            slo: "ttft:p90:1s".into(),
            strategy: "grid".into(),
            template: "mock --slots {slots}".into(),
            knobs: vec![(
                "slots".into(),
                vec!["1".into(), "2".into(), "4".into(), "8".into()],
            )],
            winner: None,
            runner_up: None,
            winner_vs_runner_up: Separation::NotCompared,
            between_runs: None,
            duel: None,
            steps: Vec::new(),
            configurations: vec![
                config("1", Some(10.0), ConfigStatus::Ok),
                config("8", Some(30.0), ConfigStatus::Ok),
                config("4", Some(30.0), ConfigStatus::Ok),
                config("2", None, ConfigStatus::Ok),
                config("16", Some(99.0), ConfigStatus::Died),
            ],
            plan: None,
            stop_reason: None,
        };
        assert_eq!(ranking(&file), vec![2, 1, 0]);
    }
}
