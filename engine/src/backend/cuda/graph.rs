//! CUDA-graph shapes for decode steps.
//!
//! A decode step of `n` sequences whose block tables are at most `t` blocks long runs the
//! graph captured for (the smallest batch bucket `>= n`, the smallest table bucket `>= t`):
//! extra rows are padding (slot -1, so they write no KV; their results are dropped), and
//! every table is padded to the bucket's stride, so a shape's kernels always read the same
//! offsets of the step's metadata. Batch buckets are 1, 2, 4, 8, then multiples of 16 up to
//! `max_num_seqs` (and `max_num_seqs` itself when it is not one); table buckets are powers
//! of two from 16 blocks.

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

/// The padded block-table stride of a graph step whose longest table has `blocks` entries.
pub fn table_bucket(blocks: usize) -> usize {
    blocks.max(16).next_power_of_two()
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
        let b = graph_buckets(256);
        assert_eq!(b.len(), 4 + 16);
        assert_eq!(bucket_for(&b, 0), None);
        assert_eq!(bucket_for(&b, 3), Some(4));
        assert_eq!(bucket_for(&b, 9), Some(16));
        assert_eq!(bucket_for(&b, 256), Some(256));
        assert_eq!(bucket_for(&b, 257), None);
        for n in 1..=100 {
            let got = bucket_for(&graph_buckets(100), n).expect("a bucket up to max_num_seqs");
            assert!(got >= n && got < 2 * n.max(8), "batch {n} -> bucket {got}");
        }
    }

    #[test]
    fn table_buckets_are_powers_of_two_from_16() {
        assert_eq!(table_bucket(0), 16);
        assert_eq!(table_bucket(16), 16);
        assert_eq!(table_bucket(17), 32);
        assert_eq!(table_bucket(2560), 4096);
    }
}
