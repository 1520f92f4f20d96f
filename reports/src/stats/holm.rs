//! Holm–Bonferroni step-down correction for multiple tests.

/// Holm-adjusted p-values, in input order: sort ascending, multiply the i-th smallest
/// (0-based) by (m − i), enforce monotonicity with a running maximum, cap at 1.
/// A hypothesis is rejected at level α when its adjusted p-value is ≤ α.
pub fn holm_adjust(p_values: &[f64]) -> Vec<f64> {
    let m = p_values.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&i, &j| p_values[i].total_cmp(&p_values[j]));
    let mut adjusted = vec![0.0; m];
    let mut running_max: f64 = 0.0;
    for (position, &index) in order.iter().enumerate() {
        let scaled = (p_values[index] * (m - position) as f64).min(1.0);
        running_max = running_max.max(scaled);
        adjusted[index] = running_max;
    }
    adjusted
}
