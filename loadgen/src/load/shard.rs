//! One worker's share of a seeded schedule (`--shard I/K`): every worker builds the same
//! request list and keeps the requests whose id ≡ I (mod K), so K workers send the whole
//! schedule exactly once between them, each request at its own scheduled instant.

use std::fmt;

use anyhow::{bail, Context, Result};

use crate::load::plan::Plan;

/// Shard `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
}

impl Shard {
    /// Parses `I/K` with 0 ≤ I < K.
    pub fn parse(text: &str) -> Result<Shard> {
        let (i, k) = text
            .split_once('/')
            .with_context(|| format!("--shard `{text}`: expected I/K, e.g. 0/3"))?;
        let index: u64 = i
            .trim()
            .parse()
            .with_context(|| format!("--shard `{text}`: index `{i}` is not a whole number"))?;
        let count: u64 = k
            .trim()
            .parse()
            .with_context(|| format!("--shard `{text}`: count `{k}` is not a whole number"))?;
        if count == 0 || index >= count {
            bail!("--shard `{text}`: needs 0 ≤ I < K");
        }
        Ok(Shard { index, count })
    }

    /// Whether request `id` of the schedule is this shard's.
    pub fn owns(&self, id: u64) -> bool {
        id % self.count == self.index
    }

    /// Keeps this shard's requests of `plan` (a session's turns go with its session, whole);
    /// fails when none is left.
    pub fn restrict(&self, plan: &mut Plan) -> Result<()> {
        let total = plan.requests.len();
        plan.requests
            .retain(|r| self.owns(r.session.map_or(r.id, |t| t.session)));
        if plan.requests.is_empty() {
            bail!("--shard {self}: the schedule's {total} requests leave none to this shard");
        }
        Ok(())
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::workload::{PromptSource, RequestSpec};

    #[test]
    fn shards_split_a_schedule_exactly_once() {
        assert_eq!(Shard::parse("2/3").unwrap(), Shard { index: 2, count: 3 });
        for bad in ["3/3", "1", "a/3", "0/0", "-1/3"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
        let times: Vec<f64> = (0..10).map(|id| id as f64 * 0.1).collect();
        let plan = Plan::open(times, |_| RequestSpec {
            input_len: 8,
            output_len: 4,
            prefix_group: None,
            prompt: PromptSource::Text("x".into()),
            model: None,
            class: None,
        });
        let mut seen = Vec::new();
        for index in 0..3 {
            let mut p = plan.clone();
            Shard { index, count: 3 }.restrict(&mut p).unwrap();
            for r in &p.requests {
                assert_eq!(r.at_s, Some(r.id as f64 * 0.1), "send times are kept");
            }
            seen.extend(p.requests.iter().map(|r| r.id));
        }
        seen.sort();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        let mut p = plan.clone();
        assert!(Shard {
            index: 11,
            count: 12
        }
        .restrict(&mut p)
        .is_err());
    }
}
