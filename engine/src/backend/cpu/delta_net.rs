//! The Gated DeltaNet's arithmetic on one value head, in f32: the token-by-token
//! recurrence (decode) and the chunked form of flash-linear-attention's
//! `chunk_gated_delta_rule` (prefill), which computes the same outputs and state with
//! matrix products over chunks of [`CHUNK`] positions (the UT / WY transform).
//!
//! The state `S` is `[key_dim, value_dim]`, row-major: row `r` holds key dimension `r`'s
//! weights over the value dimensions, so every update runs along a contiguous row.

/// Positions per chunk of the chunked form (flash-linear-attention's and transformers').
pub const CHUNK: usize = 64;

/// One value head's inputs for a run of positions: `q` and `k` rows of `key_dim`
/// (normalised, `q` scaled), `v` rows of `value_dim`, and per position `β` and the log
/// decay `g` (≤ 0).
pub struct HeadInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub beta: &'a [f32],
    pub g: &'a [f32],
    pub key_dim: usize,
    pub value_dim: usize,
}

impl HeadInputs<'_> {
    fn len(&self) -> usize {
        self.beta.len()
    }
}

/// `S ← e^g S; S += k ⊗ β(v − Sᵀk); o = Sᵀq`, position by position; `out` gets one row
/// of `value_dim` per position.
pub fn recurrence(x: &HeadInputs<'_>, state: &mut [f32], out: &mut [f32]) {
    let (dk, dv) = (x.key_dim, x.value_dim);
    let mut delta = vec![0.0f32; dv];
    for t in 0..x.len() {
        let (q, k) = (&x.q[t * dk..(t + 1) * dk], &x.k[t * dk..(t + 1) * dk]);
        let v = &x.v[t * dv..(t + 1) * dv];
        let decay = x.g[t].exp();
        // Sᵀk of the decayed state: e^g · Σ_r k[r] S[r].
        delta.fill(0.0);
        for (r, &kr) in k.iter().enumerate() {
            axpy(&mut delta, kr, &state[r * dv..(r + 1) * dv]);
        }
        for (d, &vd) in delta.iter_mut().zip(v) {
            *d = x.beta[t] * (vd - decay * *d);
        }
        let o = &mut out[t * dv..(t + 1) * dv];
        o.fill(0.0);
        for r in 0..dk {
            let row = &mut state[r * dv..(r + 1) * dv];
            for (s, &d) in row.iter_mut().zip(&delta) {
                *s = decay * *s + k[r] * d;
            }
            axpy(o, q[r], row);
        }
    }
}

/// The same as [`recurrence`], chunk by chunk. Within a chunk of `C` positions with
/// cumulative log decay `G`:
/// - `A[i][j] = −β_i (k_i·k_j) e^{G_i − G_j}` for `j < i`, and `T = (I − A)⁻¹` by forward
///   substitution (the UT transform);
/// - `U = T (β v)` and `W = T (β k e^G)` (the WY representation of the chunk's updates);
/// - with the state `S` at the chunk's start: `v' = U − W S`,
///   `o_i = e^{G_i} q_i S + Σ_{j ≤ i} (q_i·k_j) e^{G_i − G_j} v'_j`,
///   and `S ← e^{G_last} S + Σ_j e^{G_last − G_j} k_j ⊗ v'_j`.
pub fn chunked(x: &HeadInputs<'_>, state: &mut [f32], out: &mut [f32]) {
    let (dk, dv) = (x.key_dim, x.value_dim);
    let n = x.len();
    let mut scratch = ChunkScratch::new(dk, dv);
    let mut start = 0;
    while start < n {
        let c = CHUNK.min(n - start);
        let part = HeadInputs {
            q: &x.q[start * dk..(start + c) * dk],
            k: &x.k[start * dk..(start + c) * dk],
            v: &x.v[start * dv..(start + c) * dv],
            beta: &x.beta[start..start + c],
            g: &x.g[start..start + c],
            key_dim: dk,
            value_dim: dv,
        };
        chunk(
            &part,
            state,
            &mut out[start * dv..(start + c) * dv],
            &mut scratch,
        );
        start += c;
    }
}

/// Buffers of one chunk, reused across chunks.
struct ChunkScratch {
    cum: Vec<f32>,
    t: Vec<f32>,
    u: Vec<f32>,
    w: Vec<f32>,
    row: Vec<f32>,
}

impl ChunkScratch {
    fn new(dk: usize, dv: usize) -> Self {
        ChunkScratch {
            cum: vec![0.0; CHUNK],
            t: vec![0.0; CHUNK * CHUNK],
            u: vec![0.0; CHUNK * dv],
            w: vec![0.0; CHUNK * dk],
            row: vec![0.0; CHUNK],
        }
    }
}

fn chunk(x: &HeadInputs<'_>, state: &mut [f32], out: &mut [f32], s: &mut ChunkScratch) {
    let (dk, dv, c) = (x.key_dim, x.value_dim, x.len());
    let cum = &mut s.cum[..c];
    let mut acc = 0.0f32;
    for (g, &step) in cum.iter_mut().zip(x.g) {
        acc += step;
        *g = acc;
    }
    let key = |i: usize| &x.k[i * dk..(i + 1) * dk];
    // T: strictly lower A, then forward substitution row by row (transformers' loop:
    // row i += Σ_m A[i][m] T[m][·] over the rows above, already solved), then + I.
    let t = &mut s.t[..c * c];
    t.fill(0.0);
    for i in 1..c {
        for j in 0..i {
            t[i * c + j] = -x.beta[i] * dot(key(i), key(j)) * (cum[i] - cum[j]).exp();
        }
        let row = &mut s.row[..i];
        row.copy_from_slice(&t[i * c..i * c + i]);
        for m in 0..i {
            let a = row[m];
            if a != 0.0 {
                let (above, below) = t.split_at_mut(i * c);
                axpy(&mut below[..m], a, &above[m * c..m * c + m]);
            }
        }
    }
    for i in 0..c {
        t[i * c + i] = 1.0;
    }
    // U = T (β v), W = T (β k e^G).
    let u = &mut s.u[..c * dv];
    let w = &mut s.w[..c * dk];
    u.fill(0.0);
    w.fill(0.0);
    for i in 0..c {
        for j in 0..=i {
            let tij = t[i * c + j];
            if tij == 0.0 {
                continue;
            }
            let b = tij * x.beta[j];
            axpy(&mut u[i * dv..(i + 1) * dv], b, &x.v[j * dv..(j + 1) * dv]);
            axpy(&mut w[i * dk..(i + 1) * dk], b * cum[j].exp(), key(j));
        }
    }
    // v' = U − W S (in place in U); o_i = e^{G_i} q_i S, before S moves on.
    for i in 0..c {
        let vi = &mut u[i * dv..(i + 1) * dv];
        let oi = &mut out[i * dv..(i + 1) * dv];
        oi.fill(0.0);
        let scale = cum[i].exp();
        for r in 0..dk {
            let srow = &state[r * dv..(r + 1) * dv];
            axpy(vi, -w[i * dk + r], srow);
            axpy(oi, scale * x.q[i * dk + r], srow);
        }
    }
    // o_i += Σ_{j ≤ i} (q_i·k_j) e^{G_i − G_j} v'_j.
    for i in 0..c {
        let qi = &x.q[i * dk..(i + 1) * dk];
        for j in 0..=i {
            let a = dot(qi, key(j)) * (cum[i] - cum[j]).exp();
            let (oi, vj) = (&mut out[i * dv..(i + 1) * dv], &u[j * dv..(j + 1) * dv]);
            axpy(oi, a, vj);
        }
    }
    // S ← e^{G_last} S + Σ_j e^{G_last − G_j} k_j ⊗ v'_j.
    let last = cum[c - 1];
    let decay = last.exp();
    for r in 0..dk {
        let srow = &mut state[r * dv..(r + 1) * dv];
        for v in srow.iter_mut() {
            *v *= decay;
        }
        for j in 0..c {
            let a = x.k[j * dk + r] * (last - cum[j]).exp();
            axpy(srow, a, &u[j * dv..(j + 1) * dv]);
        }
    }
}

/// `y += a · x`.
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head's q, k, v, β and g.
    type Head = [Vec<f32>; 5];

    /// A deterministic head of `n` positions: q and k unit rows, v, β in (0, 1), g in
    /// (−0.3, 0) (slow decay: the state remembers hundreds of positions).
    fn head(n: usize, dk: usize, dv: usize) -> Head {
        let mut seed = 0x9e37_79b9_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as f32 / u32::MAX as f32
        };
        let mut unit = |len: usize| -> Vec<f32> {
            let mut rows: Vec<f32> = (0..n * len).map(|_| next() - 0.5).collect();
            for row in rows.chunks_mut(len) {
                let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
                row.iter_mut().for_each(|x| *x /= norm);
            }
            rows
        };
        let q = unit(dk);
        let k = unit(dk);
        let v: Vec<f32> = (0..n * dv).map(|_| 2.0 * next() - 1.0).collect();
        let beta: Vec<f32> = (0..n).map(|_| next()).collect();
        let g: Vec<f32> = (0..n).map(|_| -0.3 * next()).collect();
        [q, k, v, beta, g]
    }

    /// The chunked form equals the recurrence within 1e-4 of the largest output on a
    /// 1,000-position prompt (15 full chunks and a part), state included, from a
    /// non-zero state.
    #[test]
    fn the_chunked_form_equals_the_recurrence_on_a_thousand_positions() {
        let (n, dk, dv) = (1000, 32, 24);
        let [q, k, v, beta, g] = head(n, dk, dv);
        let x = HeadInputs {
            q: &q,
            k: &k,
            v: &v,
            beta: &beta,
            g: &g,
            key_dim: dk,
            value_dim: dv,
        };
        let initial: Vec<f32> = (0..dk * dv).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
        let (mut s1, mut s2) = (initial.clone(), initial);
        let (mut o1, mut o2) = (vec![0.0; n * dv], vec![0.0; n * dv]);
        recurrence(&x, &mut s1, &mut o1);
        chunked(&x, &mut s2, &mut o2);
        let close = |a: &[f32], b: &[f32], what: &str| {
            let scale = a.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!(scale > 0.1, "{what}: a trivial output ({scale})");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-4 * scale,
                    "{what}[{i}]: recurrence {x}, chunked {y} (scale {scale})"
                );
            }
        };
        close(&o1, &o2, "output");
        close(&s1, &s2, "state");
    }

    /// One position by hand: from S = 0, `S = β k ⊗ v` and `o = β (q·k) v`.
    #[test]
    fn one_position_from_a_zero_state_is_beta_k_outer_v() {
        let (q, k, v) = ([0.6f32, 0.8], [1.0f32, 0.0], [2.0f32, -1.0, 0.5]);
        let x = HeadInputs {
            q: &q,
            k: &k,
            v: &v,
            beta: &[0.5],
            g: &[-0.2],
            key_dim: 2,
            value_dim: 3,
        };
        for run in [recurrence, chunked] {
            let (mut s, mut o) = (vec![0.0; 6], vec![0.0; 3]);
            run(&x, &mut s, &mut o);
            assert_eq!(s, [1.0, -0.5, 0.25, 0.0, 0.0, 0.0]);
            let want = [0.6, -0.3, 0.15];
            for (a, b) in o.iter().zip(want) {
                assert!((a - b).abs() < 1e-6, "{o:?}");
            }
        }
    }
}
