//! The CPU backend itself: its options, its thread pool, and the weights it loads (GGUF's
//! quantised blocks kept for the integer kernels, or dequantised, by [`QuantizedWeights`]).

use anyhow::{ensure, Context};
use half::{f16, slice::HalfFloatSliceExt};

use super::attention::KvCacheDtype;
use super::matmul::{CpuWeight, WeightData};
use super::quant::QuantMatrix;
use super::simd::Isa;
use super::tensors::{CpuAct, CpuStep};
use crate::backend::{Backend, StepMeta, StepOps};
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
    pub(super) pool: rayon::ThreadPool,
    f32_weights_as_f16: bool,
    quantized: QuantizedWeights,
    pub(super) kv_cache_dtype: KvCacheDtype,
    /// The Gated DeltaNet layers' step buffers, one set for all of them (the layers run
    /// one after another).
    pub(super) delta_net_scratch: std::sync::Mutex<super::delta_net::Scratch>,
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
            delta_net_scratch: Default::default(),
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

impl StepOps for CpuBackend {
    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    fn prepare_step(&self, meta: &StepMeta<'_>) -> anyhow::Result<CpuStep> {
        CpuStep::new(meta)
    }
}

impl Backend for CpuBackend {
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

    fn weight_bytes(&self, w: &CpuWeight) -> usize {
        w.bytes()
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
    use crate::backend::LayerOps;
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
