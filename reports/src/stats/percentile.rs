//! Percentiles of a sample.
//!
//! Two conventions are offered and each caller states which one it uses:
//! - nearest rank: the smallest value with at least p% of the sample at or below it. This is
//!   what an HDR histogram reports (up to its 3-significant-digit resolution), so report tables
//!   and SLO checks use it;
//! - linear interpolation between closest ranks (numpy's default `linear` method), used where a
//!   smooth estimate is wanted (plots).

/// Nearest-rank percentile `p` (0–100) of an unsorted sample; `None` for an empty sample or a
/// `p` outside [0, 100] / NaN.
pub fn percentile_nearest_rank(values: &[f64], p: f64) -> Option<f64> {
    let index = nearest_rank_index(values.len(), p)?;
    let mut scratch = values.to_vec();
    Some(select(&mut scratch, index))
}

/// Percentile `p` (0–100) by linear interpolation between closest ranks, as numpy's
/// `np.percentile(values, p)` with the default method.
pub fn percentile_linear(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let position = p / 100.0 * (sorted.len() - 1) as f64;
    let low = position.floor() as usize;
    let high = position.ceil() as usize;
    let weight = position - low as f64;
    Some(sorted[low] + (sorted[high] - sorted[low]) * weight)
}

/// Conventional median (mean of the two middle values for an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    percentile_linear(values, 50.0)
}

/// Zero-based index of the nearest-rank percentile in a sorted sample of `n` values.
pub(crate) fn nearest_rank_index(n: usize, p: f64) -> Option<usize> {
    if n == 0 || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let rank = (p / 100.0 * n as f64).ceil() as usize;
    Some(rank.clamp(1, n) - 1)
}

/// The value that would sit at `index` if `values` were sorted (reorders `values`).
pub(crate) fn select(values: &mut [f64], index: usize) -> f64 {
    let (_, value, _) = values.select_nth_unstable_by(index, f64::total_cmp);
    *value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_matches_definition() {
        let v = [15.0, 20.0, 35.0, 40.0, 50.0];
        assert_eq!(percentile_nearest_rank(&v, 5.0), Some(15.0));
        assert_eq!(percentile_nearest_rank(&v, 30.0), Some(20.0));
        assert_eq!(percentile_nearest_rank(&v, 40.0), Some(20.0));
        assert_eq!(percentile_nearest_rank(&v, 50.0), Some(35.0));
        assert_eq!(percentile_nearest_rank(&v, 100.0), Some(50.0));
        assert_eq!(percentile_nearest_rank(&v, 0.0), Some(15.0));
        assert_eq!(percentile_nearest_rank(&[], 50.0), None);
        assert_eq!(percentile_nearest_rank(&v, 101.0), None);
    }

    #[test]
    fn linear_matches_numpy() {
        // np.percentile([1, 2, 3, 4], [25, 50, 90]) == [1.75, 2.5, 3.7]
        let v = [4.0, 1.0, 3.0, 2.0];
        assert!((percentile_linear(&v, 25.0).unwrap() - 1.75).abs() < 1e-12);
        assert!((percentile_linear(&v, 50.0).unwrap() - 2.5).abs() < 1e-12);
        assert!((percentile_linear(&v, 90.0).unwrap() - 3.7).abs() < 1e-12);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    }
}
