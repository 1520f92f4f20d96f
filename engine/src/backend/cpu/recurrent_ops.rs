//! Gated DeltaNet layers on the CPU behind [`RecurrentOps`]: per sequence, the convolution
//! over its last inputs (copied out of its pages and back), then the recurrence on each
//! value head's state rows where they sit in their pages (value heads in parallel).

use anyhow::ensure;
use rayon::prelude::*;

use super::backend::CpuBackend;
use super::delta_net::{self, zeroed, HeadInputs, Rows, Scratch};
use super::simd::SendPtr;
use super::tensors::{CpuAct, CpuStep};
use super::CpuKvCache;
use crate::backend::{check_gates, check_state_pages_distinct, DeltaNetParams, RecurrentOps};
use crate::config::DeltaNetSpec;

/// One sequence's state in the blocks of a layer index's KV cache: its pages, each a
/// block's K region then its V region read as f32 (`half` values each).
struct SequenceState<'a> {
    pages: &'a [u32],
    half: usize,
    k: SendPtr<f32>,
    v: SendPtr<f32>,
}

impl SequenceState<'_> {
    /// The `len` values from flat position `at` that do not cross a region, as a slice.
    ///
    /// # Safety
    /// No other live slice may overlap it (the pages of a table are distinct, checked by
    /// the caller, and each flat position is taken once), and the regions' memory is the
    /// KV cache's, mutably borrowed for the call.
    #[allow(clippy::mut_from_ref)] // the pages are shared across the heads' threads
    unsafe fn run(&self, at: usize, len: usize) -> &mut [f32] {
        let (page, offset) = (at / (2 * self.half), at % (2 * self.half));
        let (base, offset) = if offset < self.half {
            (self.k.get(), offset)
        } else {
            (self.v.get(), offset - self.half)
        };
        debug_assert!(offset + len <= self.half);
        let start = self.pages[page] as usize * self.half + offset;
        std::slice::from_raw_parts_mut(base.add(start), len)
    }

    /// Copies `len` values from flat position `at` to `out` (`to_pages` false) or from
    /// `out` to them.
    fn copy(&mut self, at: usize, out: &mut [f32], to_pages: bool) {
        let mut done = 0;
        while done < out.len() {
            let pos = at + done;
            let len = (self.half - pos % self.half).min(out.len() - done);
            // SAFETY: `&mut self` holds the only access; the run is within one region.
            let run = unsafe { self.run(pos, len) };
            if to_pages {
                run.copy_from_slice(&out[done..done + len]);
            } else {
                out[done..done + len].copy_from_slice(run);
            }
            done += len;
        }
    }
}

impl RecurrentOps for CpuBackend {
    fn copy_state(&self, cache: &mut CpuKvCache, from: &[u32], to: &[u32]) -> anyhow::Result<()> {
        let num_blocks = cache.num_blocks();
        ensure!(
            from.len() == to.len() && from.iter().chain(to).all(|&b| (b as usize) < num_blocks),
            "copy_state: pages {from:?} to {to:?} of a cache of {num_blocks} blocks"
        );
        check_state_pages_distinct([from, to])?;
        let (k, v, half) = cache.state_regions()?;
        for (&f, &t) in from.iter().zip(to) {
            for base in [k, v] {
                // SAFETY: distinct blocks (checked above) within the cache's memory, which
                // `cache` borrows mutably for the call.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        base.add(f as usize * half),
                        base.add(t as usize * half),
                        half,
                    );
                }
            }
        }
        Ok(())
    }

    fn gated_delta_net(
        &self,
        proj: &CpuAct,
        spec: DeltaNetSpec,
        params: &DeltaNetParams<Vec<f32>>,
        eps: f32,
        cache: &mut CpuKvCache,
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
        let num_blocks = cache.num_blocks();
        let (k, v, half) = cache.state_regions()?;
        let pages = spec.state_values().div_ceil(2 * half);
        ensure!(
            half.is_multiple_of(spec.value_head_dim),
            "gated_delta_net: a block's K or V region of {half} f32 values holds no whole rows \
             of {}",
            spec.value_head_dim
        );
        let mut checkpoints = Vec::with_capacity(seqs.len());
        for (i, s) in seqs.iter().enumerate() {
            let saves = step.state_saves(i, group);
            for table in std::iter::once(s.block_table).chain(saves.iter().map(|&(_, t)| t)) {
                ensure!(
                    table.len() == pages && table.iter().all(|&b| (b as usize) < num_blocks),
                    "sequence {i}: the state pages {table:?} are not {pages} of the {num_blocks} blocks"
                );
            }
            check_state_pages_distinct(
                std::iter::once(s.block_table).chain(saves.iter().map(|&(_, t)| t)),
            )
            .map_err(|e| anyhow::anyhow!("sequence {i}: {e}"))?;
            checkpoints.push(saves);
        }
        let width = spec.value_width();
        let out_data = out.reshape(rows, width);
        let (k, v) = (SendPtr(k), SendPtr(v));
        let mut scratch = self
            .delta_net_scratch
            .lock()
            .map_err(|_| anyhow::anyhow!("gated_delta_net: a previous step panicked"))?;
        for (s, saves) in seqs.iter().zip(checkpoints) {
            let mut state = SequenceState {
                pages: s.block_table,
                half,
                k,
                v,
            };
            let mut saves: Vec<(usize, SequenceState<'_>)> = saves
                .into_iter()
                .map(|(position, pages)| {
                    let state = SequenceState { pages, half, k, v };
                    (position - s.start_pos, state)
                })
                .collect();
            saves.sort_unstable_by_key(|&(rows, _)| rows);
            let rows = s.row_start..s.row_start + s.n_tokens;
            let input = &proj.data[rows.start * proj.cols..rows.end * proj.cols];
            let output = &mut out_data[rows.start * width..rows.end * width];
            let fresh = s.start_pos == 0;
            sequence(
                spec,
                params,
                eps,
                input,
                &mut state,
                fresh,
                &mut saves,
                &mut scratch,
                output,
            );
        }
        Ok(())
    }

    fn sigmoid_gate(&self, x: &mut CpuAct, gate: &CpuAct) -> anyhow::Result<()> {
        check_gates(
            (x.rows, x.cols),
            (x.rows, x.cols),
            (gate.rows, gate.cols),
            false,
        )?;
        for (v, &g) in x.data.iter_mut().zip(&gate.data) {
            *v *= sigmoid(g);
        }
        Ok(())
    }

    fn add_gated(&self, out: &mut CpuAct, x: &CpuAct, gate: &CpuAct) -> anyhow::Result<()> {
        check_gates(
            (out.rows, out.cols),
            (x.rows, x.cols),
            (gate.rows, gate.cols),
            true,
        )?;
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
/// state at the first row (zero where `fresh`), left at the last; each of `saves` (rows
/// computed before it, ascending, none past the last) gets the state after its rows;
/// `output` rows of `value_width`.
#[allow(clippy::too_many_arguments)]
fn sequence(
    spec: DeltaNetSpec,
    params: &DeltaNetParams<Vec<f32>>,
    eps: f32,
    input: &[f32],
    state: &mut SequenceState<'_>,
    fresh: bool,
    saves: &mut [(usize, SequenceState<'_>)],
    scratch: &mut Scratch,
    output: &mut [f32],
) {
    let width = spec.projection_width();
    let n = input.len() / width;
    let (channels, kernel) = (spec.conv_channels(), spec.conv_kernel);
    let (heads, dk, dv) = (spec.num_value_heads, spec.key_head_dim, spec.value_head_dim);
    let matrices = heads * dk * dv;
    // The convolution over q, k and v: its last `kernel − 1` inputs, then this step's.
    let history = kernel - 1;
    let inputs = zeroed(&mut scratch.inputs, (history + n) * channels);
    if !fresh {
        state.copy(matrices, &mut inputs[..history * channels], false);
    }
    for (t, row) in input.chunks(width).enumerate() {
        inputs[(history + t) * channels..(history + t + 1) * channels]
            .copy_from_slice(&row[..channels]);
    }
    state.copy(matrices, &mut inputs[n * channels..], true);
    // A checkpoint after `rows` rows holds the `history` inputs before row `rows`.
    for (rows, save) in saves.iter_mut() {
        save.copy(
            matrices,
            &mut inputs[*rows * channels..][..history * channels],
            true,
        );
    }
    let mixed = zeroed(&mut scratch.mixed, n * channels);
    conv_silu(&params.conv, kernel, inputs, mixed);
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
    let beta = zeroed(&mut scratch.beta, heads * n);
    let g = zeroed(&mut scratch.g, heads * n);
    for (t, row) in input.chunks(width).enumerate() {
        for j in 0..heads {
            beta[j * n + t] = sigmoid(row[gates_at + j]);
            g[j * n + t] =
                params.decay[j] * softplus(row[gates_at + heads + j] + params.dt_bias[j]);
        }
    }
    // Per value head (in parallel): its state's rows in their pages, the recurrence, the
    // gated norm, into its rows of `head_rows`.
    let (state, saves, mixed, beta, g) = (&*state, &*saves, &*mixed, &*beta, &*g);
    let head_rows = zeroed(&mut scratch.heads, heads * n * dv);
    head_rows
        .par_chunks_mut(n * dv)
        .enumerate()
        .for_each(|(j, o)| {
            let kh = spec.key_head(j);
            // SAFETY: head j's rows are its own (flat positions j·dk·dv onwards, whole rows
            // within regions: a region holds whole rows of dv, checked by the caller).
            let mut rows: Vec<&mut [f32]> = (0..dk)
                .map(|r| unsafe { state.run((j * dk + r) * dv, dv) })
                .collect();
            if fresh {
                rows.iter_mut().for_each(|r| r.fill(0.0));
            }
            // Rows `from..to`, then the checkpoint there (if any) takes the head's rows.
            let mut from = 0;
            let ends = saves.iter().map(|(rows, save)| (*rows, Some(save)));
            for (to, save) in ends.chain(std::iter::once((n, None))) {
                if to == from && save.is_none() {
                    break;
                }
                let columns = |offset: usize, len: usize| {
                    Rows::new(&mixed[from * channels + offset..], channels, len)
                };
                let x = HeadInputs {
                    q: columns(kh * dk, dk),
                    k: columns(kw + kh * dk, dk),
                    v: columns(2 * kw + j * dv, dv),
                    beta: &beta[j * n + from..j * n + to],
                    g: &g[j * n + from..j * n + to],
                    value_dim: dv,
                };
                delta_net::run(&x, &mut rows, &mut o[from * dv..to * dv]);
                if let Some(save) = save {
                    for (r, row) in rows.iter().enumerate() {
                        // SAFETY: head j's rows of the checkpoint are its own, as above.
                        unsafe { save.run((j * dk + r) * dv, dv) }.copy_from_slice(row);
                    }
                }
                from = to;
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
        });
    for (j, o) in head_rows.chunks(n * dv).enumerate() {
        for (t, ot) in o.chunks(dv).enumerate() {
            output[t * spec.value_width() + j * dv..][..dv].copy_from_slice(ot);
        }
    }
}

/// `mixed[t] = silu(Σ_j conv[j] ⊙ inputs[t + j])`: the causal depthwise convolution of
/// `kernel` taps (tap-major weights) over rows of channels, `inputs` holding the
/// `kernel − 1` rows before the first output's.
fn conv_silu(conv: &[f32], kernel: usize, inputs: &[f32], mixed: &mut [f32]) {
    let channels = conv.len() / kernel;
    mixed
        .par_chunks_mut(channels * 16)
        .enumerate()
        .for_each(|(block, out)| {
            for (i, row) in out.chunks_mut(channels).enumerate() {
                let t = block * 16 + i;
                for (j, taps) in conv.chunks(channels).enumerate() {
                    let x = &inputs[(t + j) * channels..(t + j + 1) * channels];
                    for ((o, &w), &x) in row.iter_mut().zip(taps).zip(x) {
                        *o += w * x;
                    }
                }
                for o in row.iter_mut() {
                    *o *= sigmoid(*o);
                }
            }
        });
}
