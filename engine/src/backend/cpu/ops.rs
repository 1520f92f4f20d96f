//! Element-wise and row-wise CPU ops: RMSNorm (plain, fused with the residual add, and
//! per head), RoPE, SiLU-gate. Rows are split over the rayon pool in blocks; each block
//! runs an AVX2+FMA build of the same code when the CPU has it.

use rayon::prelude::*;

use super::simd::{cpu_has_avx2, fast_exp, sum_sq};

/// Rows per parallel task.
const ROW_BLOCK: usize = 16;

/// Runs `f(first_row, rows_of_out)` over blocks of rows of `out` in parallel.
fn for_row_blocks(out: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if cols == 0 {
        return;
    }
    out.par_chunks_mut(ROW_BLOCK * cols)
        .enumerate()
        .for_each(|(b, block)| f(b * ROW_BLOCK, block));
}

/// Calls `$body::<true>(args)` inside an AVX2+FMA function when the CPU has it, else `$body::<false>`.
macro_rules! dispatch {
    ($body:ident ( $($arg:expr),* $(,)? )) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn fast(f: impl FnOnce()) {
                f()
            }
            if cpu_has_avx2() {
                // SAFETY: the CPU supports the enabled features (checked just above).
                unsafe { fast(|| $body::<true>($($arg),*)) };
            } else {
                $body::<false>($($arg),*);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            $body::<false>($($arg),*);
        }
    }};
}

/// `out = x * rsqrt(mean(x²) + eps) * w` for one row (HF's order of operations).
#[inline(always)]
fn rms_row<const FMA: bool>(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let r = 1.0 / (sum_sq::<FMA>(x) / x.len() as f32 + eps).sqrt();
    for ((o, &xv), &wv) in out.iter_mut().zip(x).zip(w) {
        *o = wv * (xv * r);
    }
}

#[inline(always)]
fn rms_rows<const FMA: bool>(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let cols = w.len();
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        rms_row::<FMA>(xr, w, eps, or);
    }
}

/// Row-wise RMSNorm of `x` (`[rows, w.len()]`) into `out`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let cols = w.len();
    for_row_blocks(out, cols, |r0, block| {
        let xs = &x[r0 * cols..r0 * cols + block.len()];
        dispatch!(rms_rows(xs, w, eps, block));
    });
}

#[inline(always)]
fn add_rms_rows<const FMA: bool>(res: &mut [f32], x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let cols = w.len();
    for ((rr, xr), or) in res
        .chunks_exact_mut(cols)
        .zip(x.chunks_exact(cols))
        .zip(out.chunks_exact_mut(cols))
    {
        for (r, &v) in rr.iter_mut().zip(xr) {
            *r += v;
        }
        rms_row::<FMA>(rr, w, eps, or);
    }
}

/// `residual += x; out = rms_norm(residual)`, row-wise.
pub fn add_rms_norm(residual: &mut [f32], x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let cols = w.len();
    if cols == 0 {
        return;
    }
    residual
        .par_chunks_mut(ROW_BLOCK * cols)
        .zip(out.par_chunks_mut(ROW_BLOCK * cols))
        .enumerate()
        .for_each(|(b, (res, o))| {
            let xs = &x[b * ROW_BLOCK * cols..b * ROW_BLOCK * cols + res.len()];
            dispatch!(add_rms_rows(res, xs, w, eps, o));
        });
}

/// The per-head RMSNorms of fused QKV rows: the first `n_q` heads weighed by `q_w`, the
/// next `n_k` by `k_w`.
#[derive(Debug, Clone, Copy)]
pub struct HeadNorms<'a> {
    pub n_q: usize,
    pub n_k: usize,
    pub q_w: &'a [f32],
    pub k_w: &'a [f32],
    pub eps: f32,
}

#[inline(always)]
fn head_norm_rows<const FMA: bool>(rows: &mut [f32], width: usize, norms: &HeadNorms<'_>) {
    let HeadNorms {
        n_q,
        n_k,
        q_w,
        k_w,
        eps,
    } = *norms;
    let hd = q_w.len();
    let mut tmp = [0.0f32; 512];
    for row in rows.chunks_exact_mut(width) {
        for (h, head) in row[..(n_q + n_k) * hd].chunks_exact_mut(hd).enumerate() {
            let w = if h < n_q { q_w } else { k_w };
            let t = &mut tmp[..hd];
            t.copy_from_slice(head);
            rms_row::<FMA>(t, w, eps, head);
        }
    }
}

/// In place: `norms` over the heads of every row; rows are `width` wide. `head_dim <= 512`.
pub fn qk_head_norm(qkv: &mut [f32], width: usize, norms: HeadNorms<'_>) {
    for_row_blocks(qkv, width, |_, block| {
        dispatch!(head_norm_rows(block, width, &norms));
    });
}

#[inline(always)]
fn rope_rows<const FMA: bool>(
    rows: &mut [f32],
    width: usize,
    (n_heads, head_dim): (usize, usize),
    half: usize,
    positions: &[u32],
    (cos, sin): (&[f32], &[f32]),
) {
    for (row, &pos) in rows.chunks_exact_mut(width).zip(positions) {
        let p = pos as usize;
        let (c, s) = (
            &cos[p * half..(p + 1) * half],
            &sin[p * half..(p + 1) * half],
        );
        for head in row[..n_heads * head_dim].chunks_exact_mut(head_dim) {
            let (x1, x2) = head[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (a, b) = (x1[i], x2[i]);
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        }
    }
}

/// In place: rotate-half RoPE on the first `2 * half` dimensions of the first `n_heads`
/// heads (`head_dim` wide) of every row (`width` wide); row `t` reads row `positions[t]`
/// of the `[positions, half]` tables `cos` and `sin` (the caller checks that every
/// position is inside them).
pub fn rope(
    qkv: &mut [f32],
    width: usize,
    heads: (usize, usize),
    half: usize,
    positions: &[u32],
    tables: (&[f32], &[f32]),
) {
    if width == 0 {
        return;
    }
    for_row_blocks(qkv, width, |r0, block| {
        let n = block.len() / width;
        let pos = &positions[r0..r0 + n];
        dispatch!(rope_rows(block, width, heads, half, pos, tables));
    });
}

#[inline(always)]
fn silu_rows<const FMA: bool>(gate_up: &[f32], inter: usize, out: &mut [f32]) {
    for (gu, o) in gate_up
        .chunks_exact(2 * inter)
        .zip(out.chunks_exact_mut(inter))
    {
        let (g, u) = gu.split_at(inter);
        for ((ov, &gv), &uv) in o.iter_mut().zip(g).zip(u) {
            *ov = gv / (1.0 + fast_exp(-gv)) * uv;
        }
    }
}

/// `out[r] = silu(gate) * up` where each row of `gate_up` is `[gate | up]`, `inter` wide each.
pub fn silu_mul(gate_up: &[f32], inter: usize, out: &mut [f32]) {
    for_row_blocks(out, inter, |r0, block| {
        let n = block.len() / inter;
        let gu = &gate_up[r0 * 2 * inter..(r0 + n) * 2 * inter];
        dispatch!(silu_rows(gu, inter, block));
    });
}

/// gpt-oss's clamped SwiGLU, `(clamp(up, −limit, limit) + 1) · g · σ(alpha · g)` with
/// `g = min(gate, limit)`, where each row of `gate_up` is `[gate | up]`, `inter` wide each.
pub fn clamped_swiglu_mul(gate_up: &[f32], inter: usize, alpha: f32, limit: f32, out: &mut [f32]) {
    gated_map(gate_up, inter, out, |gv, uv| {
        let g = gv.min(limit);
        let u = uv.clamp(-limit, limit);
        (u + 1.0) * g / (1.0 + (-alpha * g).exp())
    });
}

/// `out[r][i] = f(gate[i], up[i])` where each row of `gate_up` is `[gate | up]`, `inter`
/// wide each, over row blocks on the pool.
fn gated_map(gate_up: &[f32], inter: usize, out: &mut [f32], f: impl Fn(f32, f32) -> f32 + Sync) {
    for_row_blocks(out, inter, |r0, block| {
        let n = block.len() / inter;
        let gu = &gate_up[r0 * 2 * inter..(r0 + n) * 2 * inter];
        for (g_u, o) in gu
            .chunks_exact(2 * inter)
            .zip(block.chunks_exact_mut(inter))
        {
            let (g, u) = g_u.split_at(inter);
            for ((ov, &gv), &uv) in o.iter_mut().zip(g).zip(u) {
                *ov = f(gv, uv);
            }
        }
    });
}

/// `out = act(gate) · up` for the gated activation `act`, where each row of `gate_up` is
/// `[gate | up]`, `inter` wide each.
pub fn gated(act: crate::config::Activation, gate_up: &[f32], inter: usize, out: &mut [f32]) {
    use crate::config::Activation;
    match act {
        Activation::Silu => silu_mul(gate_up, inter, out),
        Activation::GeluTanh => gelu_tanh_mul(gate_up, inter, out),
        Activation::ClampedSwiglu { alpha, limit } => {
            clamped_swiglu_mul(gate_up, inter, alpha, limit, out)
        }
    }
}

/// GELU with the tanh approximation (PyTorch's `gelu(approximate="tanh")`,
/// transformers' `gelu_pytorch_tanh`).
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// `out[r] = gelu_tanh(gate) * up` where each row of `gate_up` is `[gate | up]`, `inter`
/// wide each (GeGLU).
pub fn gelu_tanh_mul(gate_up: &[f32], inter: usize, out: &mut [f32]) {
    gated_map(gate_up, inter, out, |g, u| gelu_tanh(g) * u);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GeGLU's GELU against its formula at a few points (PyTorch's values at ±1, 2).
    #[test]
    fn gelu_tanh_mul_matches_pytorch() {
        let gu = [1.0f32, -1.0, 2.0, 3.0, 0.5, -2.0];
        let mut out = [0.0; 3];
        gelu_tanh_mul(&gu, 3, &mut out);
        // torch.nn.functional.gelu(torch.tensor([1., -1., 2.]), approximate="tanh")
        let want = [0.841_192, -0.158_808, 1.954_598];
        for ((o, w), u) in out.iter().zip(want).zip([3.0, 0.5, -2.0]) {
            assert!((o - w * u).abs() < 1e-5, "{out:?}");
        }
    }

    #[test]
    fn rms_norm_matches_formula() {
        let x = [1.0f32, -2.0, 3.0, 0.5, 4.0, 0.0];
        let w = [0.5f32, 1.0, 2.0];
        let mut out = [0.0; 6];
        rms_norm(&x, &w, 1e-6, &mut out);
        let r0 = 1.0 / ((1.0f32 + 4.0 + 9.0) / 3.0 + 1e-6).sqrt();
        assert!((out[2] - 3.0 * r0 * 2.0).abs() < 1e-6);
        let r1 = 1.0 / ((0.25f32 + 16.0) / 3.0 + 1e-6).sqrt();
        assert!((out[4] - 4.0 * r1).abs() < 1e-6);
    }

    #[test]
    fn add_rms_norm_updates_residual() {
        let mut res = vec![1.0f32; 40 * 3];
        let x: Vec<f32> = (0..120).map(|i| i as f32).collect();
        let mut out = vec![0.0; 120];
        add_rms_norm(&mut res, &x, &[1.0, 1.0, 1.0], 0.0, &mut out);
        assert_eq!(res[119], 120.0);
        let row = [118.0f32, 119.0, 120.0];
        let r = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / 3.0).sqrt();
        assert!((out[119] - 120.0 * r).abs() < 1e-5);
    }

    #[test]
    fn rope_rotates_pairs_by_angle() {
        // one row, two heads of dim 4: pairs (0,2) and (1,3) rotate by angles a0, a1
        let mut x = vec![1.0f32, 2.0, 3.0, 4.0, 1.0, 0.0, 0.0, 1.0, 9.0];
        let (a0, a1) = (0.3f32, -1.2f32);
        // position 1 reads the second row of the tables
        let cos = [1.0, 1.0, a0.cos(), a1.cos()];
        let sin = [0.0, 0.0, a0.sin(), a1.sin()];
        rope(&mut x, 9, (2, 4), 2, &[1], (&cos, &sin));
        assert!((x[0] - (a0.cos() - 3.0 * a0.sin())).abs() < 1e-6);
        assert!((x[2] - (3.0 * a0.cos() + a0.sin())).abs() < 1e-6);
        assert!((x[3] - (4.0 * a1.cos() + 2.0 * a1.sin())).abs() < 1e-6);
        assert!((x[7] - a1.cos()).abs() < 1e-6);
        assert_eq!(x[8], 9.0, "columns past the rotated heads are untouched");
    }

    /// Partial rotary: two heads of dim 6 rotate their first 4 dimensions (pairs (0,2) and
    /// (1,3)); the last two of each head pass through.
    #[test]
    fn partial_rope_rotates_the_leading_dimensions_of_each_head() {
        let mut x: Vec<f32> = (1..=12).map(|v| v as f32).collect();
        let a = 0.7f32;
        let (cos, sin) = ([a.cos(), 1.0], [a.sin(), 0.0]);
        rope(&mut x, 12, (2, 6), 2, &[0], (&cos, &sin));
        for (h, base) in [(0usize, 1.0f32), (1, 7.0)] {
            let o = 6 * h;
            assert!((x[o] - (base * a.cos() - (base + 2.0) * a.sin())).abs() < 1e-5);
            assert!((x[o + 2] - ((base + 2.0) * a.cos() + base * a.sin())).abs() < 1e-5);
            assert_eq!(x[o + 1], base + 1.0, "angle 0 leaves its pair");
            assert_eq!(x[o + 3], base + 3.0);
            assert_eq!(
                &x[o + 4..o + 6],
                &[base + 4.0, base + 5.0],
                "unrotated tail"
            );
        }
    }

    #[test]
    fn silu_mul_matches_formula() {
        let gu = [1.0f32, -2.0, 3.0, 4.0];
        let mut out = [0.0; 2];
        silu_mul(&gu, 2, &mut out);
        let silu = |v: f32| v / (1.0 + (-v).exp());
        assert!((out[0] - silu(1.0) * 3.0).abs() < 1e-6);
        assert!((out[1] - silu(-2.0) * 4.0).abs() < 1e-6);
    }
}
