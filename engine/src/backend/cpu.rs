//! The CPU backend: f32 activations, weights in f32 / f16 / bf16 or GGUF's quantised
//! blocks, a dedicated rayon pool.
//!
//! GGUF's quantised weights stay quantised and are multiplied with integer dot products
//! on activations quantised per block (`quant`), so decode, which is bandwidth-bound,
//! reads 0.58 bytes per Q4_K weight (0.625 per Q4_0); by default wherever the CPU has
//! integer SIMD kernels, by a fixed rule so that every process computes the same numbers
//! ([`QuantizedWeights`]).
//! Linear weights that arrive as f32 can be stored as f16
//! ([`CpuOptions::f32_weights_as_f16`]); unquantised f32 checkpoints keep full precision
//! by default.

mod attention;
pub mod compute_rate;
mod lanes;
mod matmul;
mod ops;
mod quant;
mod simd;

use anyhow::{ensure, Context};
use half::{f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;

pub use attention::{CpuKvCache, KvCacheDtype};
pub use matmul::{CpuWeight, WeightData};
pub use quant::QuantMatrix;
use simd::Isa;

use super::{routing, AttnSeq, Backend, HostExperts, QkvLayout, RowSample, ScoreSpec, StepMeta};
use crate::config::{Activation, AttentionSpan, ExpertSpec};
use crate::sampler::{sample_row, SampleSpec};
use crate::weights::ggml_quants::dequantize;
use crate::weights::{HostTensor, QuantType, TensorData};

/// How the CPU backend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuOptions {
    /// Worker threads of the backend's pool (0 = all available cores).
    pub threads: usize,
    /// Store f32 linear weights (and the embedding table) as f16.
    pub f32_weights_as_f16: bool,
    /// What to do with GGUF's quantised weights.
    pub quantized: QuantizedWeights,
    /// What the KV cache stores.
    pub kv_cache_dtype: KvCacheDtype,
}

/// What the CPU backend does with quantised weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QuantizedWeights {
    /// The integer kernels where the CPU has integer SIMD kernels (AVX2 or AVX-512 VNNI),
    /// else f16 kernels on a dequantised copy: a rule, never a timing race at load, so two
    /// processes given the same flags compute the same logits.
    #[value(alias = "fastest")]
    Auto,
    /// The integer kernels on the blocks (`quant`).
    Integer,
    /// Dequantised at load to f32 (then f16 when `f32_weights_as_f16`).
    Dequantize,
}

/// The CPU implementation of [`Backend`].
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    f32_weights_as_f16: bool,
    quantized: QuantizedWeights,
    kv_cache_dtype: KvCacheDtype,
}

impl CpuBackend {
    pub fn new(opts: &CpuOptions) -> anyhow::Result<Self> {
        let threads = if opts.threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            opts.threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("cpu-backend-{i}"))
            .build()
            .context("creating the CPU backend's thread pool")?;
        let quantized = match opts.quantized {
            QuantizedWeights::Auto if !Isa::detect().integer_simd() => QuantizedWeights::Dequantize,
            QuantizedWeights::Auto => QuantizedWeights::Integer,
            forced => forced,
        };
        match quantized {
            QuantizedWeights::Dequantize => tracing::info!(
                "CPU backend: {threads} threads; quantised weights dequantised at load"
            ),
            _ => tracing::info!(
                "CPU backend: {threads} threads; quantised weights multiplied with {} integer kernels",
                Isa::detect().integer_name()
            ),
        }
        Ok(Self {
            pool,
            f32_weights_as_f16: opts.f32_weights_as_f16,
            quantized,
            kv_cache_dtype: opts.kv_cache_dtype,
        })
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// A weight of quantised parts `(type, blocks)` stacked by rows, on the path
    /// [`QuantizedWeights`] asks for.
    fn quantized_weight(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        parts: Vec<(QuantType, Vec<u8>)>,
    ) -> anyhow::Result<WeightData> {
        let dequantized = || {
            parts
                .iter()
                .flat_map(|(kind, blocks)| dequantize(*kind, blocks))
                .collect()
        };
        if self.quantized == QuantizedWeights::Dequantize {
            return Ok(self.unquantized(dequantized()));
        }
        let mut with_rows = Vec::with_capacity(parts.len());
        for (kind, blocks) in &parts {
            let row_bytes = cols / kind.block_elems() * kind.block_bytes();
            ensure!(
                row_bytes > 0 && blocks.len() % row_bytes == 0,
                "weight `{name}`: {} bytes of {kind:?} are not whole rows of {cols}",
                blocks.len()
            );
            with_rows.push((*kind, blocks.len() / row_bytes, blocks.as_slice()));
        }
        let quant = QuantMatrix::from_parts(name, cols, &with_rows)?;
        ensure!(
            quant.rows == rows,
            "weight `{name}`: its parts hold {} rows, its shape {rows}",
            quant.rows
        );
        Ok(WeightData::Quant(quant))
    }

    /// An f32 weight as stored: f16 when asked, else f32.
    fn unquantized(&self, v: Vec<f32>) -> WeightData {
        if self.f32_weights_as_f16 {
            f16_data(&v)
        } else {
            WeightData::F32(v)
        }
    }
}

/// Weight values stored as f16.
fn f16_data(values: &[f32]) -> WeightData {
    let mut h = vec![f16::ZERO; values.len()];
    h.convert_from_f32_slice(values);
    WeightData::F16(h)
}

/// A mixture-of-experts FFN's weights: the f32 router, row-major `[num_experts, hidden]`,
/// with its bias, and each expert's fused gate/up and down.
pub struct CpuExperts {
    router: Vec<f32>,
    router_bias: Option<Vec<f32>>,
    experts: Vec<CpuExpert>,
}

/// One expert: gate/up and down, with their biases where the model has them.
struct CpuExpert {
    gate_up: CpuWeight,
    down: CpuWeight,
    biases: Option<(Vec<f32>, Vec<f32>)>,
}

/// A row-major f32 activation matrix.
#[derive(Debug, Clone, Default)]
pub struct CpuAct {
    data: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl CpuAct {
    /// From row-major data.
    pub fn from_rows(rows: usize, cols: usize, data: Vec<f32>) -> anyhow::Result<Self> {
        ensure!(
            data.len() == rows * cols,
            "activation of {rows}x{cols} needs {} values, got {}",
            rows * cols,
            data.len()
        );
        Ok(Self { data, rows, cols })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// Resizes (keeping the allocation) and returns the data to overwrite.
    fn reshape(&mut self, rows: usize, cols: usize) -> &mut [f32] {
        self.rows = rows;
        self.cols = cols;
        self.data.resize(rows * cols, 0.0);
        &mut self.data
    }
}

/// One sequence of a [`CpuStep`], with its block table stored in `CpuStep::tables`.
#[derive(Debug, Clone, Copy)]
struct StepSeq {
    row_start: usize,
    n_tokens: usize,
    start_pos: usize,
    table: (usize, usize),
}

/// A host copy of [`StepMeta`].
#[derive(Debug, Clone)]
pub struct CpuStep {
    seqs: Vec<StepSeq>,
    tables: Vec<u32>,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    slots: Vec<usize>,
    logit_rows: Vec<usize>,
}

impl CpuStep {
    fn attn_seqs(&self) -> Vec<AttnSeq<'_>> {
        self.seqs
            .iter()
            .map(|s| AttnSeq {
                row_start: s.row_start,
                n_tokens: s.n_tokens,
                start_pos: s.start_pos,
                block_table: &self.tables[s.table.0..s.table.1],
            })
            .collect()
    }
}

impl Backend for CpuBackend {
    type Act = CpuAct;
    type Weight = CpuWeight;
    type Param = Vec<f32>;
    type KvCache = CpuKvCache;
    type Step = CpuStep;
    type Experts = CpuExperts;

    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    fn new_act(&self) -> CpuAct {
        CpuAct::default()
    }

    fn upload_weight(&self, name: &str, tensor: HostTensor) -> anyhow::Result<CpuWeight> {
        let (rows, cols) = tensor.matrix_dims(name)?;
        let data = match tensor.data {
            TensorData::Quant(kind, blocks) => {
                self.quantized_weight(name, rows, cols, vec![(kind, blocks)])?
            }
            TensorData::QuantParts(parts) => self.quantized_weight(name, rows, cols, parts)?,
            TensorData::F32(v) => self.unquantized(v),
            TensorData::F16(v) => WeightData::F16(v),
            TensorData::BF16(v) => WeightData::BF16(v),
        };
        Ok(CpuWeight { rows, cols, data })
    }

    fn upload_param(&self, name: &str, tensor: HostTensor) -> anyhow::Result<Vec<f32>> {
        tensor.into_param(name)
    }

    fn upload_experts(&self, name: &str, host: HostExperts) -> anyhow::Result<CpuExperts> {
        let router_name = format!("{name}'s router");
        let (num_experts, _) = host.router.matrix_dims(&router_name)?;
        let router_bias = match host.router_bias {
            Some(b) => Some(b.into_param(&format!("{router_name} bias"))?),
            None => None,
        };
        ensure!(
            router_bias.as_ref().is_none_or(|b| b.len() == num_experts),
            "`{router_name} bias` does not have one value per expert"
        );
        let mut experts = Vec::with_capacity(host.experts.len());
        for (x, e) in host.experts.into_iter().enumerate() {
            let at = format!("{name}.mlp.experts.{x}");
            let biases = match e.biases {
                Some((gate_up, down)) => Some((
                    gate_up.into_param(&format!("{at}.gate_up.bias"))?,
                    down.into_param(&format!("{at}.down_proj.bias"))?,
                )),
                None => None,
            };
            experts.push(CpuExpert {
                gate_up: self.upload_weight(&format!("{at}.gate_up"), e.gate_up)?,
                down: self.upload_weight(&format!("{at}.down_proj.weight"), e.down)?,
                biases,
            });
        }
        Ok(CpuExperts {
            router: host.router.into_f32(),
            router_bias,
            experts,
        })
    }

    fn expert_bytes(&self, experts: &CpuExperts) -> (usize, usize) {
        let all: usize = experts
            .experts
            .iter()
            .map(|e| e.gate_up.bytes() + e.down.bytes())
            .sum();
        (
            experts.router.len() * std::mem::size_of::<f32>(),
            all / experts.experts.len().max(1),
        )
    }

    fn kv_value_bytes(&self) -> usize {
        self.kv_cache_dtype.bytes()
    }

    fn weight_bytes(&self, w: &CpuWeight) -> usize {
        w.bytes()
    }

    fn new_kv_cache(
        &self,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> anyhow::Result<CpuKvCache> {
        CpuKvCache::new(
            self.kv_cache_dtype,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
        )
    }

    fn prepare_step(&self, meta: &StepMeta<'_>) -> anyhow::Result<CpuStep> {
        let mut tables = Vec::new();
        let seqs = meta
            .seqs
            .iter()
            .map(|s| {
                let start = tables.len();
                tables.extend_from_slice(s.block_table);
                StepSeq {
                    row_start: s.row_start,
                    n_tokens: s.n_tokens,
                    start_pos: s.start_pos,
                    table: (start, tables.len()),
                }
            })
            .collect();
        ensure!(
            meta.samples.len() == meta.logit_rows.len(),
            "{} sampling specs for {} sampled rows",
            meta.samples.len(),
            meta.logit_rows.len()
        );
        Ok(CpuStep {
            seqs,
            tables,
            tokens: meta.tokens.to_vec(),
            positions: meta.positions.to_vec(),
            slots: meta.slots.to_vec(),
            logit_rows: meta.logit_rows.to_vec(),
        })
    }

    fn embed(&self, table: &CpuWeight, step: &CpuStep, out: &mut CpuAct) -> anyhow::Result<()> {
        let tokens = &step.tokens;
        let cols = table.cols;
        let data = out.reshape(tokens.len(), cols);
        for (&tok, row) in tokens.iter().zip(data.chunks_exact_mut(cols.max(1))) {
            ensure!(
                (tok as usize) < table.rows,
                "token id {tok} is outside the vocabulary ({})",
                table.rows
            );
            table.row_to_f32(tok as usize, row);
        }
        Ok(())
    }

    fn matmul(
        &self,
        x: &CpuAct,
        w: &CpuWeight,
        bias: Option<&Vec<f32>>,
        out: &mut CpuAct,
    ) -> anyhow::Result<()> {
        ensure!(
            x.cols == w.cols,
            "matmul: input width {} but the weight takes {}",
            x.cols,
            w.cols
        );
        if let Some(b) = bias {
            ensure!(
                b.len() == w.rows,
                "matmul: bias of {} for {} outputs",
                b.len(),
                w.rows
            );
        }
        let threads = self.threads();
        let rows = x.rows;
        matmul::matmul(
            &x.data,
            rows,
            w,
            bias.map(|b| b.as_slice()),
            out.reshape(rows, w.rows),
            threads,
        );
        Ok(())
    }

    fn rms_norm(&self, x: &CpuAct, w: &Vec<f32>, eps: f32, out: &mut CpuAct) -> anyhow::Result<()> {
        ensure!(
            x.cols == w.len(),
            "rms_norm: width {} but weight {}",
            x.cols,
            w.len()
        );
        ops::rms_norm(&x.data, w, eps, out.reshape(x.rows, x.cols));
        Ok(())
    }

    fn add_rms_norm(
        &self,
        residual: &mut CpuAct,
        x: &CpuAct,
        w: &Vec<f32>,
        eps: f32,
        out: &mut CpuAct,
    ) -> anyhow::Result<()> {
        ensure!(
            residual.rows == x.rows && residual.cols == x.cols && x.cols == w.len(),
            "add_rms_norm: shapes {}x{}, {}x{}, weight {}",
            residual.rows,
            residual.cols,
            x.rows,
            x.cols,
            w.len()
        );
        ops::add_rms_norm(
            &mut residual.data,
            &x.data,
            w,
            eps,
            out.reshape(x.rows, x.cols),
        );
        Ok(())
    }

    fn qk_head_norm(
        &self,
        qkv: &mut CpuAct,
        layout: QkvLayout,
        q_w: &Vec<f32>,
        k_w: &Vec<f32>,
        eps: f32,
    ) -> anyhow::Result<()> {
        super::check_qk_head_norm(qkv.cols, layout, q_w.len(), k_w.len(), 512)?;
        ops::qk_head_norm(
            &mut qkv.data,
            qkv.cols,
            layout.num_heads,
            layout.num_kv_heads,
            q_w,
            k_w,
            eps,
        );
        Ok(())
    }

    fn rope(
        &self,
        qkv: &mut CpuAct,
        layout: QkvLayout,
        rotary_dim: usize,
        cos: &Vec<f32>,
        sin: &Vec<f32>,
        step: &CpuStep,
    ) -> anyhow::Result<()> {
        ensure!(qkv.cols == layout.qkv_width(), "rope: width {}", qkv.cols);
        ensure!(
            rotary_dim > 0 && rotary_dim <= layout.head_dim && rotary_dim.is_multiple_of(2),
            "rope: {rotary_dim} rotated dimensions of heads {} wide",
            layout.head_dim
        );
        let half = rotary_dim / 2;
        let positions = cos.len() / half.max(1);
        ensure!(
            step.positions.len() == qkv.rows && sin.len() == cos.len(),
            "rope: {} positions for {} rows",
            step.positions.len(),
            qkv.rows
        );
        if let Some(&p) = step.positions.iter().find(|&&p| p as usize >= positions) {
            anyhow::bail!("rope: position {p} is past the tables ({positions} positions)");
        }
        let heads = layout.num_heads + layout.num_kv_heads;
        let cols = qkv.cols;
        ops::rope(
            &mut qkv.data,
            cols,
            (heads, layout.head_dim),
            half,
            &step.positions,
            (cos, sin),
        );
        Ok(())
    }

    fn attention(
        &self,
        qkv: &CpuAct,
        layout: QkvLayout,
        span: AttentionSpan,
        scores: ScoreSpec,
        sinks: Option<&Vec<f32>>,
        cache: &mut CpuKvCache,
        step: &CpuStep,
        out: &mut CpuAct,
    ) -> anyhow::Result<()> {
        ensure!(
            qkv.cols == layout.qkv_width() && qkv.rows == step.slots.len(),
            "attention: qkv shape"
        );
        let seqs = step.attn_seqs();
        let out_data = out.reshape(qkv.rows, layout.q_width());
        let window = match span {
            AttentionSpan::Full => None,
            AttentionSpan::Sliding { window } => Some(window),
        };
        let softmax = attention::Softmax {
            window,
            scores,
            sinks: sinks.map(Vec::as_slice),
        };
        attention::attention(
            &qkv.data,
            layout,
            softmax,
            cache,
            &seqs,
            &step.slots,
            out_data,
            self.threads(),
            Isa::detect(),
        )
    }

    fn gated_activation(
        &self,
        gate_up: &CpuAct,
        act: Activation,
        out: &mut CpuAct,
    ) -> anyhow::Result<()> {
        ensure!(
            gate_up.cols.is_multiple_of(2),
            "gated_activation: odd width {}",
            gate_up.cols
        );
        let inter = gate_up.cols / 2;
        let out = out.reshape(gate_up.rows, inter);
        ops::gated(act, &gate_up.data, inter, out);
        Ok(())
    }

    /// The step's tokens grouped by expert: each expert with tokens gathers its rows and
    /// runs one GEMM per matrix over them (its weights read once a step, on the integer
    /// kernels where quantised). When at least as many experts have tokens as there are
    /// threads, the experts run side by side, one task each; otherwise one after another,
    /// each GEMM over every thread. The rows' outputs are summed in expert order, as
    /// transformers' loop adds them.
    fn experts_ffn(
        &self,
        x: &CpuAct,
        experts: &CpuExperts,
        spec: ExpertSpec,
        act: Activation,
        out: &mut CpuAct,
    ) -> anyhow::Result<()> {
        ensure!(
            experts.experts.len() == spec.num_experts,
            "experts_ffn: {} experts loaded for {}",
            experts.experts.len(),
            spec.num_experts
        );
        let (rows, h) = (x.rows, x.cols);
        ensure!(
            experts.router.len() == spec.num_experts * h,
            "experts_ffn: a router of {} values for {} experts of width {h}",
            experts.router.len(),
            spec.num_experts
        );
        let routes = (0..rows)
            .map(|r| {
                let row = &x.data[r * h..][..h];
                let mut logits: Vec<f32> = experts
                    .router
                    .chunks(h)
                    .map(|w| w.iter().zip(row).map(|(a, b)| a * b).sum())
                    .collect();
                if let Some(bias) = &experts.router_bias {
                    logits.iter_mut().zip(bias).for_each(|(l, b)| *l += b);
                }
                routing::route(&logits, spec)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let groups = routing::group_by_expert(&routes, spec.num_experts);
        let active: Vec<usize> = (0..spec.num_experts)
            .filter(|&e| !groups[e].is_empty())
            .collect();
        // Expert `e` over its rows: its outputs, one row of `h` per entry of its group.
        let run = |e: usize, threads: usize| -> anyhow::Result<Vec<f32>> {
            let group = &groups[e];
            let CpuExpert {
                gate_up: w_gate_up,
                down: w_down,
                biases,
            } = &experts.experts[e];
            let (gate_up_bias, down_bias) = match biases {
                Some((g, d)) => (Some(g.as_slice()), Some(d.as_slice())),
                None => (None, None),
            };
            let n = group.len();
            ensure!(
                w_gate_up.rows.is_multiple_of(2) && w_gate_up.cols == h && w_down.rows == h,
                "experts_ffn: expert {e}'s gate/up is {}x{} and its down {}x{} in a model of \
                 width {h}",
                w_gate_up.rows,
                w_gate_up.cols,
                w_down.rows,
                w_down.cols
            );
            let inter = w_gate_up.rows / 2;
            let mut xe = Vec::with_capacity(n * h);
            for &(r, _) in group {
                xe.extend_from_slice(&x.data[r * h..][..h]);
            }
            let mut gate_up = vec![0f32; n * 2 * inter];
            matmul::matmul(&xe, n, w_gate_up, gate_up_bias, &mut gate_up, threads);
            let mut inner = vec![0f32; n * inter];
            ops::gated(act, &gate_up, inter, &mut inner);
            let mut y = vec![0f32; n * h];
            matmul::matmul(&inner, n, w_down, down_bias, &mut y, threads);
            Ok(y)
        };
        let threads = self.threads();
        let outputs: Vec<Vec<f32>> = if threads > 1 && active.len() >= threads {
            self.pool.install(|| {
                active
                    .par_iter()
                    .map(|&e| run(e, 1))
                    .collect::<anyhow::Result<Vec<_>>>()
            })?
        } else {
            active
                .iter()
                .map(|&e| run(e, threads))
                .collect::<anyhow::Result<_>>()?
        };
        let sum = out.reshape(rows, h);
        sum.fill(0.0);
        for (&e, y) in active.iter().zip(&outputs) {
            for (i, &(r, weight)) in groups[e].iter().enumerate() {
                let dst = &mut sum[r * h..][..h];
                for (d, v) in dst.iter_mut().zip(&y[i * h..][..h]) {
                    *d += weight * v;
                }
            }
        }
        Ok(())
    }

    fn scale(&self, x: &mut CpuAct, factor: f32) -> anyhow::Result<()> {
        x.data.iter_mut().for_each(|v| *v *= factor);
        Ok(())
    }

    fn softcap(&self, x: &mut CpuAct, cap: f32) -> anyhow::Result<()> {
        ensure!(cap > 0.0, "softcap: cap {cap}");
        x.data.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        Ok(())
    }

    fn gather_logit_rows(
        &self,
        x: &CpuAct,
        step: &CpuStep,
        out: &mut CpuAct,
    ) -> anyhow::Result<()> {
        let rows = &step.logit_rows;
        let cols = x.cols;
        let data = out.reshape(rows.len(), cols);
        for (&r, dst) in rows.iter().zip(data.chunks_exact_mut(cols.max(1))) {
            ensure!(r < x.rows, "gather_rows: row {r} of {}", x.rows);
            dst.copy_from_slice(&x.data[r * cols..(r + 1) * cols]);
        }
        Ok(())
    }

    fn sample(
        &self,
        logits: &mut CpuAct,
        samples: &[SampleSpec<'_>],
        _step: &CpuStep,
    ) -> anyhow::Result<Vec<RowSample>> {
        ensure!(
            samples.len() == logits.rows,
            "sample: {} specs for {} logits rows",
            samples.len(),
            logits.rows
        );
        let cols = logits.cols.max(1);
        Ok(logits
            .data
            .chunks_exact_mut(cols)
            .zip(samples)
            .map(|(row, spec)| Ok(sample_row(row, spec)))
            .collect())
    }

    fn to_host(&self, x: &CpuAct) -> anyhow::Result<Vec<Vec<f32>>> {
        Ok(x.data
            .chunks_exact(x.cols.max(1))
            .take(x.rows)
            .map(|r| r.to_vec())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// A Q4_1 weight as GGUF blocks: d = 0.01, m = -0.08, nibbles from `seed`.
    fn q4_1_tensor(rows: usize, cols: usize, seed: u8) -> HostTensor {
        let mut blocks = Vec::new();
        for b in 0..rows * cols / 32 {
            blocks.extend(f16::from_f32(0.01).to_le_bytes());
            blocks.extend(f16::from_f32(-0.08).to_le_bytes());
            blocks.extend((0..16).map(|i| (b as u8).wrapping_mul(31).wrapping_add(i * 7 + seed)));
        }
        HostTensor {
            shape: vec![rows, cols],
            data: TensorData::Quant(QuantType::Q4_1, blocks),
        }
    }

    #[test]
    fn quantised_weights_follow_the_chosen_path() {
        let backend = |quantized| {
            CpuBackend::new(&CpuOptions {
                threads: 2,
                f32_weights_as_f16: true,
                quantized,
                kv_cache_dtype: KvCacheDtype::F16,
            })
            .unwrap()
        };
        let integer = backend(QuantizedWeights::Integer);
        let w = integer.upload_weight("w", q4_1_tensor(48, 64, 1)).unwrap();
        assert!(matches!(w.data, WeightData::Quant(_)));
        let dequantised = backend(QuantizedWeights::Dequantize);
        let w = dequantised
            .upload_weight("w", q4_1_tensor(48, 64, 1))
            .unwrap();
        assert!(matches!(w.data, WeightData::F16(_)));

        // Auto follows a rule, the same in every process: the integer kernels wherever
        // the CPU has integer SIMD kernels, else the dequantised copy.
        let auto = backend(QuantizedWeights::Auto);
        let a = auto.upload_weight("a", q4_1_tensor(48, 64, 2)).unwrap();
        let simd = Isa::detect().integer_simd();
        assert_eq!(matches!(a.data, WeightData::Quant(_)), simd);
        assert_eq!(matches!(a.data, WeightData::F16(_)), !simd);
        // Either way the product is the dequantised one, within the activations' rounding.
        let want = q4_1_tensor(48, 64, 2).data.to_f32();
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut out = CpuAct::default();
        auto.matmul(
            &CpuAct::from_rows(1, 64, x.clone()).unwrap(),
            &a,
            None,
            &mut out,
        )
        .unwrap();
        for (j, got) in out.data().iter().enumerate() {
            let exact: f32 = x.iter().zip(&want[j * 64..]).map(|(p, q)| p * q).sum();
            assert!((got - exact).abs() < 0.01, "row {j}: {got} vs {exact}");
        }
    }

    #[test]
    fn f32_weights_become_f16_when_asked() {
        let t = HostTensor {
            shape: vec![1, 2],
            data: TensorData::F32(vec![1.0, 0.1]),
        };
        let b = CpuBackend::new(&CpuOptions {
            threads: 1,
            f32_weights_as_f16: true,
            quantized: QuantizedWeights::Auto,
            kv_cache_dtype: KvCacheDtype::F16,
        })
        .unwrap();
        let w = b.upload_weight("w", t.clone()).unwrap();
        assert!(matches!(w.data, WeightData::F16(_)));
        let b = CpuBackend::new(&CpuOptions {
            threads: 1,
            f32_weights_as_f16: false,
            quantized: QuantizedWeights::Auto,
            kv_cache_dtype: KvCacheDtype::F16,
        })
        .unwrap();
        assert!(matches!(
            b.upload_weight("w", t).unwrap().data,
            WeightData::F32(_)
        ));
        let bad = HostTensor {
            shape: vec![3],
            data: TensorData::BF16(vec![bf16::ONE; 3]),
        };
        assert!(b
            .upload_weight("bad", bad)
            .unwrap_err()
            .to_string()
            .contains("`bad`"));
    }
}
