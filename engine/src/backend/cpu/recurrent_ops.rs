//! Gated DeltaNet layers on the CPU behind [`RecurrentOps`]: each sequence's state is
//! gathered from its pages, run through the convolution and the recurrence (value heads
//! in parallel), and scattered back.

use anyhow::ensure;
use rayon::prelude::*;

use super::backend::CpuBackend;
use super::delta_net::{self, HeadInputs};
use super::tensors::{CpuAct, CpuStep};
use crate::backend::{DeltaNetParams, RecurrentOps, StateCacheShape};
use crate::config::DeltaNetSpec;

/// One layer index's recurrent states: a page of `page_values` f32 per block, zeroed
/// (calloc'd, so pages never written cost no memory).
#[derive(Debug)]
pub struct CpuStateCache {
    values: Vec<f32>,
    num_blocks: usize,
    page_values: usize,
}

impl CpuStateCache {
    /// Copies a sequence's state out of the pages of `table` into `state`.
    fn gather(&self, table: &[u32], state: &mut [f32]) {
        for (part, &block) in state.chunks_mut(self.page_values).zip(table) {
            let start = block as usize * self.page_values;
            part.copy_from_slice(&self.values[start..start + part.len()]);
        }
    }

    /// Copies `state` into the pages of `table`.
    fn scatter(&mut self, table: &[u32], state: &[f32]) {
        for (part, &block) in state.chunks(self.page_values).zip(table) {
            let start = block as usize * self.page_values;
            self.values[start..start + part.len()].copy_from_slice(part);
        }
    }
}

impl RecurrentOps for CpuBackend {
    fn new_state_cache(&self, shape: StateCacheShape) -> anyhow::Result<CpuStateCache> {
        let len = shape.num_blocks.checked_mul(shape.page_values);
        let len = len.filter(|&n| n > 0);
        let Some(len) = len else {
            anyhow::bail!(
                "a state cache of {} pages of {} values is empty or too large",
                shape.num_blocks,
                shape.page_values
            );
        };
        Ok(CpuStateCache {
            values: vec![0.0; len],
            num_blocks: shape.num_blocks,
            page_values: shape.page_values,
        })
    }

    fn gated_delta_net(
        &self,
        proj: &CpuAct,
        spec: DeltaNetSpec,
        params: &DeltaNetParams<Vec<f32>>,
        eps: f32,
        cache: &mut CpuStateCache,
        step: &CpuStep,
        group: usize,
        out: &mut CpuAct,
    ) -> anyhow::Result<()> {
        let rows = proj.rows;
        ensure!(
            proj.cols == spec.projection_width(),
            "gated_delta_net: projection of {} columns, the layer needs {}",
            proj.cols,
            spec.projection_width()
        );
        let (channels, kernel) = (spec.conv_channels(), spec.conv_kernel);
        ensure!(
            params.conv.len() == channels * kernel
                && params.decay.len() == spec.num_value_heads
                && params.dt_bias.len() == spec.num_value_heads
                && params.norm.len() == spec.value_head_dim,
            "gated_delta_net: parameter sizes do not match the layer"
        );
        let seqs = step.attn_seqs(group)?;
        let pages = spec.state_values().div_ceil(cache.page_values);
        for (i, s) in seqs.iter().enumerate() {
            ensure!(
                s.block_table.len() == pages
                    && s.block_table
                        .iter()
                        .all(|&b| (b as usize) < cache.num_blocks),
                "sequence {i}: its state table {:?} is not {pages} pages of the {} blocks",
                s.block_table,
                cache.num_blocks
            );
        }
        let out_data = out.reshape(rows, spec.value_width());
        let mut state = vec![0.0f32; spec.state_values()];
        for s in &seqs {
            if s.start_pos == 0 {
                state.fill(0.0);
            } else {
                cache.gather(s.block_table, &mut state);
            }
            let rows = s.row_start..s.row_start + s.n_tokens;
            let input = &proj.data[rows.start * proj.cols..rows.end * proj.cols];
            let output =
                &mut out_data[rows.start * spec.value_width()..rows.end * spec.value_width()];
            sequence(spec, params, eps, input, &mut state, output);
            cache.scatter(s.block_table, &state);
        }
        Ok(())
    }

    fn sigmoid_gate(&self, x: &mut CpuAct, gate: &CpuAct) -> anyhow::Result<()> {
        ensure!(
            x.rows == gate.rows && x.cols == gate.cols,
            "sigmoid_gate: {}x{} values, {}x{} gates",
            x.rows,
            x.cols,
            gate.rows,
            gate.cols
        );
        for (v, &g) in x.data.iter_mut().zip(&gate.data) {
            *v *= sigmoid(g);
        }
        Ok(())
    }

    fn add_gated(&self, out: &mut CpuAct, x: &CpuAct, gate: &CpuAct) -> anyhow::Result<()> {
        ensure!(
            out.rows == x.rows && out.cols == x.cols && gate.rows == x.rows && gate.cols == 1,
            "add_gated: {}x{} into {}x{}, gates {}x{}",
            x.rows,
            x.cols,
            out.rows,
            out.cols,
            gate.rows,
            gate.cols
        );
        for ((o, xr), &g) in out
            .data
            .chunks_mut(x.cols)
            .zip(x.data.chunks(x.cols))
            .zip(&gate.data)
        {
            let g = sigmoid(g);
            for (o, &v) in o.iter_mut().zip(xr) {
                *o += g * v;
            }
        }
        Ok(())
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `log(1 + e^x)`, without overflow for large `x` (PyTorch's threshold of 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// One sequence's rows through the layer: `input` rows of the projection, `state` its
/// state at the first row (left at the last), `output` rows of `value_width`.
fn sequence(
    spec: DeltaNetSpec,
    params: &DeltaNetParams<Vec<f32>>,
    eps: f32,
    input: &[f32],
    state: &mut [f32],
    output: &mut [f32],
) {
    let n = input.len() / spec.projection_width();
    let (channels, kernel) = (spec.conv_channels(), spec.conv_kernel);
    let (heads, dk, dv) = (spec.num_value_heads, spec.key_head_dim, spec.value_head_dim);
    let width = spec.projection_width();
    let (matrices, conv_state) = state.split_at_mut(heads * dk * dv);
    // The convolution over q, k and v; its state holds, per channel, the last
    // `kernel − 1` inputs, oldest first.
    let history = kernel - 1;
    let mut mixed = vec![0.0f32; n * channels];
    for c in 0..channels {
        let w = &params.conv[c * kernel..(c + 1) * kernel];
        let past = &mut conv_state[c * history..(c + 1) * history];
        let at = |t: isize, past: &[f32]| -> f32 {
            if t >= 0 {
                input[t as usize * width + c]
            } else {
                past[(history as isize + t) as usize]
            }
        };
        for t in 0..n {
            let mut acc = 0.0f32;
            for (j, &wj) in w.iter().enumerate() {
                acc += wj * at(t as isize - history as isize + j as isize, past);
            }
            mixed[t * channels + c] = acc * sigmoid(acc);
        }
        let next: Vec<f32> = (0..history)
            .map(|j| at(n as isize - history as isize + j as isize, past))
            .collect();
        past.copy_from_slice(&next);
    }
    // q and k L2-normalised per key head (q scaled), β and g per value head.
    let (kw, scale) = (spec.key_width(), (dk as f32).powf(-0.5));
    for row in mixed.chunks_mut(channels) {
        for (h, head) in row[..2 * kw].chunks_mut(dk).enumerate() {
            let norm = (head.iter().map(|x| x * x).sum::<f32>() + 1e-6)
                .sqrt()
                .recip();
            let factor = if h < spec.num_key_heads {
                norm * scale
            } else {
                norm
            };
            head.iter_mut().for_each(|x| *x *= factor);
        }
    }
    let gates_at = channels + spec.value_width();
    let mut beta = vec![0.0f32; heads * n];
    let mut g = vec![0.0f32; heads * n];
    for t in 0..n {
        let row = &input[t * width..(t + 1) * width];
        for j in 0..heads {
            beta[j * n + t] = sigmoid(row[gates_at + j]);
            g[j * n + t] =
                params.decay[j] * softplus(row[gates_at + heads + j] + params.dt_bias[j]);
        }
    }
    // Per value head: its inputs gathered contiguous, the recurrence, the gated norm.
    let head_out: Vec<Vec<f32>> = matrices
        .par_chunks_mut(dk * dv)
        .enumerate()
        .map(|(j, s)| {
            let kh = spec.key_head(j);
            let gather = |offset: usize, len: usize| -> Vec<f32> {
                mixed
                    .chunks(channels)
                    .flat_map(|row| &row[offset..offset + len])
                    .copied()
                    .collect()
            };
            let q = gather(kh * dk, dk);
            let k = gather(kw + kh * dk, dk);
            let v = gather(2 * kw + j * dv, dv);
            let x = HeadInputs {
                q: &q,
                k: &k,
                v: &v,
                beta: &beta[j * n..(j + 1) * n],
                g: &g[j * n..(j + 1) * n],
                key_dim: dk,
                value_dim: dv,
            };
            let mut o = vec![0.0f32; n * dv];
            if n == 1 {
                delta_net::recurrence(&x, s, &mut o);
            } else {
                delta_net::chunked(&x, s, &mut o);
            }
            for (t, ot) in o.chunks_mut(dv).enumerate() {
                let z = &input[t * width + channels + j * dv..][..dv];
                let rms = (ot.iter().map(|x| x * x).sum::<f32>() / dv as f32 + eps)
                    .sqrt()
                    .recip();
                for ((o, &w), &z) in ot.iter_mut().zip(&params.norm).zip(z) {
                    *o = *o * rms * w * (z * sigmoid(z));
                }
            }
            o
        })
        .collect();
    for (j, o) in head_out.iter().enumerate() {
        for (t, ot) in o.chunks(dv).enumerate() {
            output[t * spec.value_width() + j * dv..][..dv].copy_from_slice(ot);
        }
    }
}
