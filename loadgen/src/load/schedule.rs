//! Arrival schedules, decided in full before the run from a seed.
//!
//! Every process is generated as unit-mean gaps in "operational time" and mapped to wall
//! time through the inverse of the cumulative rate Λ(t). Without ramp-up Λ(t) = rate · t;
//! with a linear ramp from `ramp.from_rate` to `rate` over `ramp.secs`, Λ is quadratic there.

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp, Gamma};
use serde::{Deserialize, Serialize};

/// The arrival process of an open-loop run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Arrival {
    /// Exponential gaps.
    Poisson,
    /// Gamma gaps with shape = burstiness and mean 1/rate (vLLM `--burstiness`; 1 = Poisson).
    Gamma { burstiness: f64 },
    /// Equal gaps.
    Constant,
}

/// Linear ramp of the rate at the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RampUp {
    pub from_rate: f64,
    pub secs: f64,
}

/// A synthetic open-loop schedule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    pub arrival: Arrival,
    /// Requests per second (after any ramp-up).
    pub rate: f64,
    pub ramp_up: Option<RampUp>,
}

/// How many arrivals to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Extent {
    /// Arrivals strictly before this time (seconds).
    Until(f64),
    /// Exactly this many arrivals.
    Count(usize),
}

impl ScheduleSpec {
    fn validate(&self) -> Result<()> {
        if !(self.rate.is_finite() && self.rate > 0.0) {
            bail!("--rate must be a positive number of requests per second");
        }
        if let Arrival::Gamma { burstiness } = self.arrival {
            if !(burstiness.is_finite() && burstiness > 0.0) {
                bail!("--burstiness must be positive");
            }
        }
        if let Some(r) = self.ramp_up {
            if r.from_rate < 0.0 || r.from_rate > self.rate || r.secs <= 0.0 {
                bail!("ramp-up needs 0 <= start rate <= --rate and a positive duration");
            }
        }
        Ok(())
    }

    /// Wall time (s) at which the cumulative rate reaches `u`.
    fn inverse_cumulative(&self, u: f64) -> f64 {
        let Some(ramp) = self.ramp_up else {
            return u / self.rate;
        };
        let slope = (self.rate - ramp.from_rate) / ramp.secs;
        let ramp_mass = ramp.from_rate * ramp.secs + slope * ramp.secs * ramp.secs / 2.0;
        if u >= ramp_mass {
            return ramp.secs + (u - ramp_mass) / self.rate;
        }
        if slope == 0.0 {
            return u / ramp.from_rate;
        }
        // Solve slope/2 · t² + from · t − u = 0 for t ≥ 0.
        (-ramp.from_rate + (ramp.from_rate.powi(2) + 2.0 * slope * u).sqrt()) / slope
    }

    /// Send times in seconds from the run origin, increasing.
    pub fn generate(&self, extent: Extent, seed: u64) -> Result<Vec<f64>> {
        self.validate()?;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut gap: Box<dyn FnMut(&mut StdRng) -> f64> = match self.arrival {
            Arrival::Poisson => {
                let exp = Exp::new(1.0).expect("rate 1 is valid");
                Box::new(move |rng| exp.sample(rng))
            }
            Arrival::Gamma { burstiness } => {
                let gamma = Gamma::new(burstiness, 1.0 / burstiness)?;
                Box::new(move |rng| gamma.sample(rng))
            }
            Arrival::Constant => Box::new(|_| 1.0),
        };
        let mut times = Vec::new();
        // Constant arrivals start at t = 0; random ones after a first random gap.
        let mut u = if self.arrival == Arrival::Constant {
            0.0
        } else {
            gap(&mut rng)
        };
        loop {
            let t = self.inverse_cumulative(u);
            match extent {
                Extent::Until(end) if t >= end => break,
                Extent::Count(n) if times.len() >= n => break,
                _ => {}
            }
            times.push(t);
            u += gap(&mut rng);
        }
        Ok(times)
    }
}

/// The measured window of a run's schedule: sends at `warmup_s` ≤ t < `warmup_s` +
/// `duration_s` are measured (every send from `warmup_s` on without a duration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub warmup_s: f64,
    pub duration_s: Option<f64>,
}

/// How a draw was scaled to hold its target rate over the measured window (`--exact-rate`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ExactRate {
    /// The rate asked for, requests/s.
    pub target_rate: f64,
    /// Every send time of the draw was divided by this (its rate multiplied by it).
    pub factor: f64,
    /// The draw was first shifted this much earlier (seconds, before the scaling): 0 unless
    /// no factor alone landed within the tolerance.
    pub shift_s: f64,
    /// The draw's first sends, which the shift put before the origin and which were dropped.
    #[serde(default)]
    pub dropped: usize,
    /// The scaled draw's scheduled rate over the measured window, (n − 1) / span.
    pub scheduled_rate: f64,
    /// scheduled / target − 1: within ±[`EXACT_RATE_TOLERANCE`] unless no factor lands
    /// there (a window of a few requests).
    pub residual: f64,
}

/// How close `--exact-rate` brings the scheduled rate to its target.
pub const EXACT_RATE_TOLERANCE: f64 = 0.005;

/// The indices `lo..hi` of the sends of `times` (increasing) / `factor` in `window`.
fn measured_range(times: &[f64], factor: f64, window: Window) -> (usize, usize) {
    let lo = times.partition_point(|&t| t / factor < window.warmup_s);
    let hi = match window.duration_s {
        Some(d) => times.partition_point(|&t| t / factor < window.warmup_s + d),
        None => times.len(),
    };
    (lo, hi.max(lo))
}

/// (n − 1) / span of the sends of `times` (increasing) / `factor` that fall in `window`.
fn scheduled_over(times: &[f64], factor: f64, window: Window) -> Option<f64> {
    let (lo, hi) = measured_range(times, factor, window);
    if hi - lo < 2 {
        return None;
    }
    let span = (times[hi - 1] - times[lo]) / factor;
    (span > 0.0).then(|| (hi - lo - 1) as f64 / span)
}

/// The factor nearest `times`' own that makes their scheduled rate over `window` equal to
/// `target`, and its residual (scheduled / target − 1): between two factors at which a send
/// crosses an edge of the window the measured set is fixed and the rate proportional to the
/// factor, so each such interval holds an exact solution or none; the exact solution nearest
/// the draw's own factor wins, else the factor with the smallest residual.
fn best_factor(times: &[f64], target: f64, window: Window) -> Option<(f64, f64)> {
    let guess = target / scheduled_over(times, 1.0, window)?;
    let (low, high) = (guess / 2.0, guess * 2.0);
    let mut breaks: Vec<f64> = vec![low, high];
    for &t in times {
        if window.warmup_s > 0.0 {
            breaks.push(t / window.warmup_s);
        }
        if let Some(d) = window.duration_s {
            breaks.push(t / (window.warmup_s + d));
        }
    }
    breaks.retain(|f| (low..=high).contains(f));
    breaks.sort_by(f64::total_cmp);
    breaks.dedup();
    let mut exact: Option<f64> = None;
    let mut best: Option<(f64, f64)> = None;
    for pair in breaks.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let Some(rate) = scheduled_over(times, (a + b) / 2.0, window) else {
            continue;
        };
        let solution = ((a + b) / 2.0 * target / rate).clamp(a, b);
        let Some(residual) = scheduled_over(times, solution, window).map(|r| r / target - 1.0)
        else {
            continue;
        };
        if residual.abs() <= 1e-9 {
            let distance = |f: f64| (f / guess).ln().abs();
            if exact.is_none_or(|e| distance(solution) < distance(e)) {
                exact = Some(solution);
            }
        }
        if best.is_none_or(|(_, old)| residual.abs() < old.abs()) {
            best = Some((solution, residual));
        }
    }
    exact.map(|f| (f, 0.0)).or(best)
}

/// Shifts tried, in mean gaps of the draw, when no factor alone lands within the tolerance.
const EXACT_RATE_SHIFTS: usize = 32;

/// Scales the draw `times` (seconds, increasing) by one factor so that its scheduled rate over
/// `window` is `target` req/s, keeping the draw's shape: its gaps, up to that factor. Scaling
/// moves sends across the window's edges, which changes the measured set and makes the rate
/// jump (by up to a gap over the window's span), so the factor is searched over the scaled
/// draw's own measured set ([`best_factor`]). Where no factor lands within
/// [`EXACT_RATE_TOLERANCE`], the draw is also shifted earlier by sixteenths of its mean gap
/// (dropping the sends that fall before the origin; its gaps stay as they are) until one
/// does; the smallest residual is recorded either way. The scaled sends at or after `end_s`
/// are dropped; `times` must reach past `end_s` × `target` / the draw's own scheduled rate
/// for the window to stay full.
pub fn scale_to_rate(
    times: &[f64],
    target: f64,
    window: Window,
    end_s: Option<f64>,
) -> Result<(Vec<f64>, ExactRate)> {
    if !(target.is_finite() && target > 0.0) {
        bail!("--exact-rate needs a positive rate, not {target}");
    }
    let Some(raw) = scheduled_over(times, 1.0, window) else {
        bail!("--exact-rate: the schedule holds fewer than two sends in the measured window");
    };
    let mut chosen: Option<(f64, f64, f64)> = None;
    for step in 0..=EXACT_RATE_SHIFTS {
        let shift = step as f64 / 16.0 / raw;
        let shifted: Vec<f64> = times
            .iter()
            .filter(|&&t| t >= shift)
            .map(|t| t - shift)
            .collect();
        let Some((factor, residual)) = best_factor(&shifted, target, window) else {
            continue;
        };
        if chosen.is_none_or(|(_, _, r)| residual.abs() < r.abs()) {
            chosen = Some((shift, factor, residual));
        }
        if residual.abs() <= EXACT_RATE_TOLERANCE {
            break;
        }
    }
    let (shift, factor, _) =
        chosen.context("--exact-rate: no scaling keeps two sends in the measured window")?;
    let dropped = times.partition_point(|&t| t < shift);
    let scaled: Vec<f64> = times
        .iter()
        .filter(|&&t| t >= shift)
        .map(|t| (t - shift) / factor)
        .filter(|&t| end_s.is_none_or(|end| t < end))
        .collect();
    let scheduled_rate = scheduled_over(&scaled, 1.0, window)
        .context("--exact-rate: the scaled schedule holds fewer than two measured sends")?;
    Ok((
        scaled,
        ExactRate {
            target_rate: target,
            factor,
            shift_s: shift,
            dropped,
            scheduled_rate,
            residual: scheduled_rate / target - 1.0,
        },
    ))
}

/// How trace timestamps are rescaled before replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceScaling {
    /// Keep arrivals with trace time in `[start, end)` seconds (relative to the first row).
    pub window: Option<(f64, f64)>,
    /// Replay this many times faster than recorded (2 = twice as fast).
    pub time_scale: Option<f64>,
    /// Instead of `time_scale`, rescale so the mean rate (n − 1) / span equals this.
    pub target_rate: Option<f64>,
}

/// Maps trace timestamps (ms) to send times (s): rows are put in time order (stable, so rows
/// with equal timestamps keep their file order), shifted so the first kept row is at 0, then
/// divided by the speed-up factor. Returns the kept row indices and their times, both in time order.
pub fn scale_trace(
    timestamps_ms: &[f64],
    scaling: &TraceScaling,
) -> Result<(Vec<usize>, Vec<f64>)> {
    if let Some(i) = timestamps_ms.iter().position(|t| !t.is_finite()) {
        bail!(
            "trace row {} has a timestamp that is not a finite number",
            i + 1
        );
    }
    let mut order: Vec<usize> = (0..timestamps_ms.len()).collect();
    order.sort_by(|&a, &b| timestamps_ms[a].total_cmp(&timestamps_ms[b]));
    let Some(&origin) = order.first().map(|&i| &timestamps_ms[i]) else {
        bail!("the trace has no rows");
    };
    let kept: Vec<usize> = order
        .into_iter()
        .filter(|&i| {
            scaling.window.is_none_or(|(start, end)| {
                let t = (timestamps_ms[i] - origin) / 1000.0;
                t >= start && t < end
            })
        })
        .collect();
    let Some(&first) = kept.first() else {
        bail!("--trace-window keeps no rows of the trace");
    };
    let base = timestamps_ms[first];
    let relative: Vec<f64> = kept
        .iter()
        .map(|&i| (timestamps_ms[i] - base) / 1000.0)
        .collect();
    let speedup = match (scaling.target_rate, scaling.time_scale) {
        (Some(_), Some(_)) => bail!("give --time-scale or --target-rate, not both"),
        (Some(rate), None) => {
            let span = relative.last().copied().unwrap_or(0.0);
            if relative.len() < 2 || span <= 0.0 || rate <= 0.0 {
                bail!("--target-rate needs at least two rows spanning a positive time and a positive rate");
            }
            rate / ((relative.len() - 1) as f64 / span)
        }
        (None, Some(scale)) if scale > 0.0 => scale,
        (None, Some(_)) => bail!("--time-scale must be positive"),
        (None, None) => 1.0,
    };
    let times = relative.iter().map(|t| t / speedup).collect();
    Ok((kept, times))
}

#[cfg(test)]
mod tests {
    use super::*;
    use statrs::distribution::{ContinuousCDF, Exp as ExpDist};

    fn gaps(times: &[f64]) -> Vec<f64> {
        let mut g = vec![times[0]];
        g.extend(times.windows(2).map(|w| w[1] - w[0]));
        g
    }

    #[test]
    fn poisson_gaps_pass_ks_against_exponential() {
        let rate = 10.0;
        let spec = ScheduleSpec {
            arrival: Arrival::Poisson,
            rate,
            ramp_up: None,
        };
        let times = spec.generate(Extent::Count(10_000), 42).unwrap();
        let mut g = gaps(&times);
        g.sort_by(f64::total_cmp);
        let exp = ExpDist::new(rate).unwrap();
        let n = g.len() as f64;
        let d = g
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let f = exp.cdf(x);
                (f - i as f64 / n).max((i + 1) as f64 / n - f)
            })
            .fold(0.0, f64::max);
        // Critical value of the one-sample KS test at alpha = 0.01: 1.628 / sqrt(n).
        let critical = 1.628 / n.sqrt();
        assert!(d < critical, "KS D = {d} >= {critical}");
    }

    #[test]
    fn gamma_gaps_have_right_mean_and_cv() {
        for burstiness in [0.25, 1.0, 4.0] {
            let spec = ScheduleSpec {
                arrival: Arrival::Gamma { burstiness },
                rate: 5.0,
                ramp_up: None,
            };
            let g = gaps(&spec.generate(Extent::Count(20_000), 7).unwrap());
            let n = g.len() as f64;
            let mean = g.iter().sum::<f64>() / n;
            let sd = (g.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
            let cv = sd / mean;
            let expected_cv = 1.0 / burstiness.sqrt();
            assert!(
                (mean - 0.2).abs() < 0.2 * 0.04,
                "mean {mean} (b={burstiness})"
            );
            assert!(
                (cv / expected_cv - 1.0).abs() < 0.05,
                "cv {cv} vs {expected_cv}"
            );
        }
    }

    #[test]
    fn realised_rate_within_two_percent() {
        for arrival in [
            Arrival::Poisson,
            Arrival::Gamma { burstiness: 2.0 },
            Arrival::Constant,
        ] {
            let spec = ScheduleSpec {
                arrival,
                rate: 50.0,
                ramp_up: None,
            };
            let times = spec.generate(Extent::Until(200.0), 3).unwrap();
            let realised = times.len() as f64 / 200.0;
            assert!(
                (realised / 50.0 - 1.0).abs() < 0.02,
                "{arrival:?}: {realised}"
            );
        }
    }

    #[test]
    fn ramp_up_rate_grows_linearly() {
        let spec = ScheduleSpec {
            arrival: Arrival::Constant,
            rate: 100.0,
            ramp_up: Some(RampUp {
                from_rate: 0.0,
                secs: 10.0,
            }),
        };
        let times = spec.generate(Extent::Until(20.0), 1).unwrap();
        // Λ(10) = 500 during the ramp, then 100/s for 10 s.
        assert_eq!(times.iter().filter(|&&t| t < 10.0).count(), 500);
        assert_eq!(times.len(), 1500);
        let first_half = times.iter().filter(|&&t| t < 5.0).count();
        assert_eq!(first_half, 125);
    }

    #[test]
    fn trace_replay_preserves_relative_timestamps() {
        let ts = [1000.0, 1000.0, 1250.5, 4000.0, 9000.25];
        let (kept, times) = scale_trace(&ts, &TraceScaling::default()).unwrap();
        assert_eq!(kept, vec![0, 1, 2, 3, 4]);
        assert_eq!(times, vec![0.0, 0.0, 0.2505, 3.0, 8.00025]);
        let scaled = scale_trace(
            &ts,
            &TraceScaling {
                time_scale: Some(4.0),
                ..Default::default()
            },
        )
        .unwrap()
        .1;
        for (a, b) in times.iter().zip(&scaled) {
            assert_eq!(*b, a / 4.0);
        }
        let (kept, at_rate) = scale_trace(
            &ts,
            &TraceScaling {
                target_rate: Some(2.0),
                window: Some((0.2, 10.0)),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(kept, vec![2, 3, 4]);
        let rate = 2.0 / at_rate[2];
        assert!((rate - 2.0).abs() < 1e-12);
        assert!((at_rate[1] / at_rate[2] - (4000.0 - 1250.5) / (9000.25 - 1250.5)).abs() < 1e-15);
    }

    #[test]
    fn unsorted_traces_replay_in_time_order() {
        // A row stamped before the first one must not give a negative send time.
        let ts = [1000.0, 0.0, 500.0, 500.0];
        let (kept, times) = scale_trace(&ts, &TraceScaling::default()).unwrap();
        assert_eq!(kept, vec![1, 2, 3, 0]);
        assert_eq!(times, vec![0.0, 0.5, 0.5, 1.0]);
        let err = scale_trace(&[0.0, f64::NAN], &TraceScaling::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("row 2"), "{err}");
    }

    #[test]
    fn an_exact_rate_draw_holds_its_target_over_the_window() {
        let window = Window {
            warmup_s: 5.0,
            duration_s: Some(25.0),
        };
        for (seed, rate) in [(1, 4.39), (2, 8.78), (3, 0.9), (4, 40.0)] {
            let spec = ScheduleSpec {
                arrival: Arrival::Poisson,
                rate,
                ramp_up: None,
            };
            let draw = spec.generate(Extent::Until(2.0 * 35.0), seed).unwrap();
            let (times, exact) = scale_to_rate(&draw, rate, window, Some(35.0)).unwrap();
            assert!(exact.residual.abs() <= EXACT_RATE_TOLERANCE, "{exact:?}");
            let measured: Vec<f64> = times
                .iter()
                .copied()
                .filter(|&t| (5.0..30.0).contains(&t))
                .collect();
            let held = (measured.len() - 1) as f64 / (measured.last().unwrap() - measured[0]);
            assert!(
                (held / rate - 1.0).abs() <= EXACT_RATE_TOLERANCE,
                "{held} for {rate}"
            );
            assert_eq!(held, exact.scheduled_rate);
            // The draw's shape: every gap is the raw draw's divided by the one factor.
            let kept: Vec<f64> = draw
                .iter()
                .copied()
                .filter(|&t| t >= exact.shift_s)
                .collect();
            for (scaled, raw) in times.iter().zip(&kept) {
                assert!((scaled * exact.factor + exact.shift_s - raw).abs() < 1e-9);
            }
            assert!(times.iter().all(|&t| t < 35.0));
        }
        let none = scale_to_rate(&[1.0], 1.0, window, None).unwrap_err();
        assert!(none.to_string().contains("fewer than two"), "{none}");
    }
}
