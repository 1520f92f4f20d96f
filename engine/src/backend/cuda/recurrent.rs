//! Gated DeltaNet layers and their neighbours' gates on CUDA (`kernels/delta_net.cu`),
//! behind `--cuda-unverified-kernels`: never run on a GPU yet (issue 63). The recurrent
//! states are f32 pages in the memory of the KV pool's blocks (each block's K region, then
//! its V region), laid out as the CPU backend lays them.

use anyhow::{bail, ensure, Context};
use cudarc::driver::CudaSlice;

use super::{ensure_len, int, CudaAct, CudaBackend, CudaKvCache, CudaParam, CudaStep, KArg};
use crate::backend::{check_gates, DeltaNetParams, RecurrentOps};
use crate::config::{DeltaNetSpec, ValueHeadOrder};

/// Key head dims the recurrence kernel is instantiated for (`delta_net_recurrence_dk*`).
pub const DELTA_NET_KEY_DIMS: [usize; 4] = [16, 32, 64, 128];

/// The step buffers of a DeltaNet layer, in f32: the convolved q, k and v, the gates, the
/// recurrence's outputs before the gated norm.
#[derive(Default)]
pub(super) struct DeltaNetScratch {
    mixed: Option<CudaSlice<f32>>,
    gates: Option<CudaSlice<f32>>,
    core: Option<CudaSlice<f32>>,
}

impl CudaBackend {
    fn refuse_unverified(&self, what: &str) -> anyhow::Result<()> {
        ensure!(
            self.unverified_kernels,
            "{what} has never run on a GPU: --cuda-unverified-kernels runs it"
        );
        Ok(())
    }

    /// The K and V bases of `cache` (as f32 pointers), the f32 values of one block's
    /// region of either, and the cache's blocks.
    fn state_regions(&self, cache: &CudaKvCache) -> (u64, u64, usize, usize) {
        let region = cache.block_size * cache.num_kv_heads * cache.head_dim;
        let blocks = cache.k.len() / region.max(1);
        (self.ptr(&cache.k), self.ptr(&cache.v), region / 2, blocks)
    }
}

impl RecurrentOps for CudaBackend {
    fn copy_state(&self, cache: &mut CudaKvCache, from: &[u32], to: &[u32]) -> anyhow::Result<()> {
        self.refuse_unverified("a Gated DeltaNet layer")?;
        self.flush()?;
        let (k, v, half, num_blocks) = self.state_regions(cache);
        ensure!(
            from.len() == to.len() && from.iter().chain(to).all(|&b| (b as usize) < num_blocks),
            "copy_state: pages {from:?} to {to:?} of a cache of {num_blocks} blocks"
        );
        crate::backend::check_state_pages_distinct([from, to])?;
        if from.is_empty() {
            return Ok(());
        }
        let from_dev = self.stream.clone_htod(from).context("uploading page ids")?;
        let to_dev = self.stream.clone_htod(to).context("uploading page ids")?;
        let args = [
            KArg::Ptr(k),
            KArg::Ptr(v),
            KArg::Ptr(self.ptr(&from_dev)),
            KArg::Ptr(self.ptr(&to_dev)),
            KArg::I32(int(half, "region values")?),
        ];
        self.launch("copy_state_pages", (from.len() as u32, 1, 1), 256, 0, &args)?;
        // The id buffers are freed on the stream, after the copy has read them.
        drop((from_dev, to_dev));
        Ok(())
    }

    fn gated_delta_net(
        &self,
        proj: &CudaAct,
        spec: DeltaNetSpec,
        params: &DeltaNetParams<CudaParam>,
        eps: f32,
        cache: &mut CudaKvCache,
        step: &CudaStep,
        group: usize,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.refuse_unverified("a Gated DeltaNet layer")?;
        self.flush()?;
        let (rows, width) = (proj.rows, proj.cols);
        ensure!(
            width == spec.projection_width(),
            "gated_delta_net: projection of {width} columns, the layer needs {}",
            spec.projection_width()
        );
        let dk = spec.key_head_dim;
        let Some(&dk_kernel) = DELTA_NET_KEY_DIMS.iter().find(|&&d| d == dk) else {
            bail!("gated_delta_net: no CUDA kernel for key heads of {dk} (it has {DELTA_NET_KEY_DIMS:?})");
        };
        let dv = spec.value_head_dim;
        let (k_base, v_base, half, _) = self.state_regions(cache);
        ensure!(
            dv <= 1024 && half.is_multiple_of(dv),
            "gated_delta_net: value heads of {dv} in K and V regions of {half} f32 values"
        );
        ensure!(
            spec.conv_kernel <= 8,
            "gated_delta_net: a convolution of {} taps (at most 8)",
            spec.conv_kernel
        );
        let channels = spec.conv_channels();
        let heads = spec.num_value_heads;
        let value_width = spec.value_width();
        let seqs = step.padded_seqs;
        let o = self.shape(out, rows, value_width)?;
        let mut st = self.state()?;
        let scratch = &mut st.delta_net;
        ensure_len(
            &self.stream,
            &mut scratch.mixed,
            rows * channels,
            "DeltaNet inputs",
        )?;
        ensure_len(
            &self.stream,
            &mut scratch.gates,
            rows * 2 * heads,
            "DeltaNet gates",
        )?;
        ensure_len(
            &self.stream,
            &mut scratch.core,
            rows * value_width,
            "DeltaNet outputs",
        )?;
        let ptr = |b: &Option<CudaSlice<f32>>| b.as_ref().map(|b| self.ptr(b)).unwrap_or(0);
        let (mixed, gates, core) = (ptr(&scratch.mixed), ptr(&scratch.gates), ptr(&scratch.core));
        drop(st);
        let p = self.ptr(proj.slice()?);
        let matrices = (heads * dk * dv) as i64;
        let saves = step.at(step.off.saves);
        let n = step.num_saves;
        let sequences = [
            KArg::Ptr(step.at(step.off.row_start)),
            KArg::Ptr(step.at(step.off.n_tokens)),
            KArg::Ptr(step.at(step.off.start_pos)),
            KArg::Ptr(step.tables(group)?),
            KArg::I32(int(step.table_stride, "table stride")?),
            KArg::Ptr(saves),
            KArg::Ptr(saves + 4 * n as u64),
            KArg::Ptr(saves + 8 * n as u64),
            KArg::Ptr(saves + 12 * n as u64),
            KArg::I32(int(step.save_stride, "checkpoint table stride")?),
            KArg::I32(int(n, "checkpoints")?),
            KArg::I32(int(group, "layer group")?),
        ];
        let mut conv = vec![
            KArg::Ptr(p),
            KArg::I32(int(width, "width")?),
            KArg::Ptr(self.ptr(&params.conv.data)),
            KArg::I32(int(spec.conv_kernel, "taps")?),
            KArg::I32(int(channels, "channels")?),
            KArg::Ptr(mixed),
            KArg::Ptr(k_base),
            KArg::Ptr(v_base),
            KArg::I32(int(half, "region values")?),
            KArg::I64(matrices),
        ];
        conv.extend(sequences.iter().copied());
        let seq_blocks = int(seqs, "sequences")? as u32;
        self.launch(
            "delta_net_conv",
            (seq_blocks, channels.div_ceil(256) as u32, 1),
            256,
            0,
            &conv,
        )?;
        let prep = [
            KArg::Ptr(p),
            KArg::I32(int(width, "width")?),
            KArg::Ptr(mixed),
            KArg::I32(int(channels, "channels")?),
            KArg::I32(int(spec.num_key_heads, "key heads")?),
            KArg::I32(int(dk, "key head dim")?),
            KArg::I32(int(heads, "value heads")?),
            KArg::I32(int(channels + value_width, "gate column")?),
            KArg::Ptr(self.ptr(&params.decay.data)),
            KArg::Ptr(self.ptr(&params.dt_bias.data)),
            KArg::Ptr(gates),
        ];
        self.launch(
            "delta_net_prep",
            (int(rows, "rows")? as u32, 1, 1),
            128,
            0,
            &prep,
        )?;
        let tiled = spec.value_head_order == ValueHeadOrder::Tiled;
        let mut recurrence = vec![
            KArg::Ptr(mixed),
            KArg::I32(int(channels, "channels")?),
            KArg::Ptr(gates),
            KArg::Ptr(core),
            KArg::Ptr(k_base),
            KArg::Ptr(v_base),
            KArg::I32(int(half, "region values")?),
            KArg::I32(int(spec.num_key_heads, "key heads")?),
            KArg::I32(int(heads, "value heads")?),
            KArg::I32(int(dv, "value head dim")?),
            KArg::I32(i32::from(tiled)),
        ];
        recurrence.extend(sequences.iter().copied());
        self.launch(
            &format!("delta_net_recurrence_dk{dk_kernel}"),
            (seq_blocks, heads as u32, 1),
            dv as u32,
            0,
            &recurrence,
        )?;
        let norm = [
            KArg::Ptr(core),
            KArg::Ptr(p),
            KArg::I32(int(width, "width")?),
            KArg::I32(int(channels, "z column")?),
            KArg::Ptr(self.ptr(&params.norm.data)),
            KArg::I32(int(dv, "value head dim")?),
            KArg::F32(eps),
            KArg::Ptr(o),
        ];
        self.launch(
            "delta_net_gated_norm",
            (int(rows, "rows")? as u32, heads as u32, 1),
            128,
            0,
            &norm,
        )
    }

    fn sigmoid_gate(&self, x: &mut CudaAct, gate: &CudaAct) -> anyhow::Result<()> {
        self.refuse_unverified("an attention output gate")?;
        self.flush()?;
        check_gates(
            (x.rows, x.cols),
            (x.rows, x.cols),
            (gate.rows, gate.cols),
            false,
        )?;
        let n = x.rows * x.cols;
        let args = [
            KArg::Ptr(self.ptr(x.slice()?)),
            KArg::Ptr(self.ptr(gate.slice()?)),
            KArg::I64(n as i64),
        ];
        self.launch(
            "sigmoid_gate_bf16",
            (n.div_ceil(256).max(1) as u32, 1, 1),
            256,
            0,
            &args,
        )
    }

    fn add_gated(&self, out: &mut CudaAct, x: &CudaAct, gate: &CudaAct) -> anyhow::Result<()> {
        self.refuse_unverified("a gated shared expert")?;
        self.flush()?;
        check_gates(
            (out.rows, out.cols),
            (x.rows, x.cols),
            (gate.rows, gate.cols),
            true,
        )?;
        let args = [
            KArg::Ptr(self.ptr(out.slice()?)),
            KArg::Ptr(self.ptr(x.slice()?)),
            KArg::Ptr(self.ptr(gate.slice()?)),
            KArg::I32(int(x.cols, "columns")?),
        ];
        self.launch(
            "add_gated_bf16",
            (int(x.rows, "rows")? as u32, 1, 1),
            256,
            0,
            &args,
        )
    }
}
