//! Mixture-of-experts routing on the host: which experts each token runs through, with
//! which weights, and the step's tokens grouped by expert so that each expert's weights are
//! read once for all its tokens.

use anyhow::ensure;

use crate::config::{ExpertSpec, Routing};

/// The experts one token runs through, best first, with the weights their outputs are
/// summed with.
pub type Route = Vec<(usize, f32)>;

/// Routes one token from its router logits (one per expert), as transformers does in f32,
/// by `spec.routing`: Qwen3-MoE's softmax over every expert, then the `top_k` most
/// probable, renormalised to sum to 1 when asked; or gpt-oss's `top_k` largest logits,
/// then a softmax over them. Ties go to the lower expert index.
pub fn route(logits: &[f32], spec: ExpertSpec) -> anyhow::Result<Route> {
    ensure!(
        logits.len() == spec.num_experts,
        "router gave {} logits for {} experts",
        logits.len(),
        spec.num_experts
    );
    ensure!(
        (1..=spec.num_experts).contains(&spec.top_k),
        "top {} of {} experts",
        spec.top_k,
        spec.num_experts
    );
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Stable: equal logits keep the lower index first.
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let best = &order[..spec.top_k];
    // Softmax over `over`, read at `best` (the best logit is the maximum of both).
    let softmax = |over: &mut dyn Iterator<Item = f32>| {
        let max = logits[best[0]];
        let sum: f32 = over.map(|l| (l - max).exp()).sum();
        best.iter()
            .map(|&e| (e, (logits[e] - max).exp() / sum))
            .collect::<Route>()
    };
    let mut chosen = match spec.routing {
        Routing::SoftmaxTopK { .. } => softmax(&mut logits.iter().copied()),
        Routing::TopKSoftmax => softmax(&mut best.iter().map(|&e| logits[e])),
    };
    if spec.routing == (Routing::SoftmaxTopK { renormalise: true }) {
        let total: f32 = chosen.iter().map(|&(_, w)| w).sum();
        chosen.iter_mut().for_each(|(_, w)| *w /= total);
    }
    Ok(chosen)
}

/// The tokens of a step by expert: entry `e` lists `(token row, weight)` of every token
/// routed to expert `e`, in row order.
pub fn group_by_expert(routes: &[Route], num_experts: usize) -> Vec<Vec<(usize, f32)>> {
    let mut groups = vec![Vec::new(); num_experts];
    for (row, r) in routes.iter().enumerate() {
        for &(e, w) in r {
            groups[e].push((row, w));
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(num_experts: usize, top_k: usize, renormalise: bool) -> ExpertSpec {
        ExpertSpec {
            num_experts,
            top_k,
            intermediate_size: 8,
            routing: Routing::SoftmaxTopK { renormalise },
            biases: false,
        }
    }

    /// Softmax over all four experts, then the best two; unnormalised weights are those
    /// probabilities, normalised ones sum to 1 in the same ratio.
    #[test]
    fn top_k_of_the_softmax_over_all_experts() {
        let logits = [0.0, 2.0, 1.0, -1.0];
        let z: f32 = logits.iter().map(|l: &f32| l.exp()).sum();
        let raw = route(&logits, spec(4, 2, false)).unwrap();
        assert_eq!(raw.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2]);
        assert!((raw[0].1 - 2f32.exp() / z).abs() < 1e-6);
        assert!((raw[1].1 - 1f32.exp() / z).abs() < 1e-6);
        let norm = route(&logits, spec(4, 2, true)).unwrap();
        let e = 1f32.exp();
        assert!((norm[0].1 - e / (e + 1.0)).abs() < 1e-6, "{norm:?}");
        assert!((norm[1].1 - 1.0 / (e + 1.0)).abs() < 1e-6, "{norm:?}");
    }

    /// gpt-oss: the best two logits, then a softmax over those two only; the others do not
    /// dilute it.
    #[test]
    fn softmax_over_the_top_k_logits() {
        let top_k_first = ExpertSpec {
            routing: Routing::TopKSoftmax,
            ..spec(4, 2, false)
        };
        let r = route(&[0.0, 2.0, 1.0, -1.0], top_k_first).unwrap();
        let e = 1f32.exp();
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 2]);
        assert!((r[0].1 - e / (e + 1.0)).abs() < 1e-6, "{r:?}");
        assert!((r[1].1 - 1.0 / (e + 1.0)).abs() < 1e-6, "{r:?}");
        let one = ExpertSpec {
            top_k: 1,
            ..top_k_first
        };
        assert_eq!(route(&[5.0, -3.0, 0.25, 4.0], one).unwrap(), vec![(0, 1.0)]);
    }

    /// Equal logits go to the lower expert index first.
    #[test]
    fn ties_go_to_the_lower_index() {
        let r = route(&[1.0, 3.0, 3.0, 3.0], spec(4, 2, true)).unwrap();
        assert_eq!(r, vec![(1, 0.5), (2, 0.5)]);
        let r = route(&[0.5; 8], spec(8, 3, false)).unwrap();
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(r.iter().all(|x| (x.1 - 0.125).abs() < 1e-7));
    }

    /// With k = 1 a normalised route is its expert at weight 1; unnormalised, the
    /// expert's probability.
    #[test]
    fn one_expert_per_token() {
        let r = route(&[-3.0, 0.25, 4.0], spec(3, 1, true)).unwrap();
        assert_eq!(r, vec![(2, 1.0)]);
        let r = route(&[-3.0, 0.25, 4.0], spec(3, 1, false)).unwrap();
        assert_eq!(r[0].0, 2);
        assert!(r[0].1 < 1.0 && r[0].1 > 0.97, "{r:?}");
    }

    /// Every token to one expert: one group holds every row in order, the others none.
    #[test]
    fn all_tokens_to_one_expert() {
        let routes: Vec<Route> = (0..5)
            .map(|i| route(&[0.0, 9.0 + i as f32, 0.0], spec(3, 1, true)).unwrap())
            .collect();
        let groups = group_by_expert(&routes, 3);
        assert!(groups[0].is_empty() && groups[2].is_empty());
        assert_eq!(groups[1], (0..5).map(|r| (r, 1.0)).collect::<Vec<_>>());
    }

    #[test]
    fn refuses_a_route_it_cannot_take() {
        assert!(route(&[0.0, 1.0], spec(3, 1, true)).is_err());
        assert!(route(&[0.0, 1.0, 2.0], spec(3, 4, true)).is_err());
    }
}
