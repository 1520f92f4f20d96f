//! CUDA-graph batch buckets for decode steps.
//!
//! A decode step of `n` sequences runs the graph captured for the smallest bucket `>= n`,
//! with the extra rows padded (slot -1, so they write no KV). Buckets are 1, 2, 4, 8,
//! then multiples of 16 up to `max_num_seqs` (and `max_num_seqs` itself when it is not one).

/// The decode batch sizes that get a captured graph.
pub fn graph_buckets(max_num_seqs: usize) -> Vec<usize> {
    let mut out: Vec<usize> = [1, 2, 4, 8]
        .into_iter()
        .filter(|&b| b <= max_num_seqs)
        .collect();
    out.extend((16..=max_num_seqs).step_by(16));
    if max_num_seqs > 0 && out.last() != Some(&max_num_seqs) {
        out.push(max_num_seqs);
    }
    out
}

/// The bucket a decode batch of `batch` sequences runs in, or `None` when it is empty or
/// larger than every bucket (then the step runs eagerly).
pub fn bucket_for(buckets: &[usize], batch: usize) -> Option<usize> {
    if batch == 0 {
        return None;
    }
    buckets.iter().copied().find(|&b| b >= batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_powers_then_steps_of_16() {
        assert_eq!(graph_buckets(1), vec![1]);
        assert_eq!(graph_buckets(6), vec![1, 2, 4, 6]);
        assert_eq!(graph_buckets(40), vec![1, 2, 4, 8, 16, 32, 40]);
        assert_eq!(graph_buckets(0), Vec::<usize>::new());
        assert_eq!(bucket_for(&graph_buckets(256), 9), Some(16));
    }
}
