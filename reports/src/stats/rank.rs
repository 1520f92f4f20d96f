//! Ranking with ties (average ranks), shared by the rank tests.

/// Average ranks (1-based) of `values`, in input order, and the sizes of every tie group
/// (groups of one included).
pub(crate) fn average_ranks(values: &[f64]) -> (Vec<f64>, Vec<usize>) {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&i, &j| values[i].total_cmp(&values[j]));
    let mut ranks = vec![0.0; values.len()];
    let mut groups = Vec::new();
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && values[order[end]] == values[order[start]] {
            end += 1;
        }
        // Positions start..end hold ranks start+1..=end; their mean is (start+1+end)/2.
        let rank = (start + 1 + end) as f64 / 2.0;
        for &i in &order[start..end] {
            ranks[i] = rank;
        }
        groups.push(end - start);
        start = end;
    }
    (ranks, groups)
}

/// Σ (t³ − t) over tie groups, the usual tie correction term.
pub(crate) fn tie_term(groups: &[usize]) -> f64 {
    groups
        .iter()
        .map(|&t| {
            let t = t as f64;
            t * t * t - t
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_get_average_ranks() {
        let (ranks, groups) = average_ranks(&[10.0, 20.0, 10.0, 30.0, 20.0, 20.0]);
        assert_eq!(ranks, vec![1.5, 4.0, 1.5, 6.0, 4.0, 4.0]);
        assert_eq!(groups, vec![2, 3, 1]);
        assert_eq!(tie_term(&groups), 6.0 + 24.0);
    }
}
