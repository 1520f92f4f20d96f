//! Arrival schedules, decided in full before the run from a seed.
//!
//! Every process is generated as unit-mean gaps in "operational time" and mapped to wall
//! time through the inverse of the cumulative rate Λ(t). Without ramp-up Λ(t) = rate · t;
//! with a linear ramp from `ramp.from_rate` to `rate` over `ramp.secs`, Λ is quadratic there.

use anyhow::{bail, Result};
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
}
