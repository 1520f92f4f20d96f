//! The layer ops on the device (`kernels/elementwise.cu`, cuBLAS): the embedding gather,
//! GEMMs, norms, RoPE, gated activations and scaling.

use anyhow::{anyhow, bail, ensure};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm, GemmConfig};
use half::bf16;

use crate::backend::{LayerOps, QkvLayout};
use crate::config::Activation;

use super::step::CudaStep;
use super::{int, CudaAct, CudaBackend, CudaParam, CudaWeight, KArg, KernelSet};

impl CudaBackend {
    /// Runs an element-wise kernel of [`kernels::EXTENDED_KERNELS`] (`x`, one f32, the
    /// element count) over every value of `x`, in place.
    pub(super) fn map_in_place(
        &self,
        kernel: &str,
        x: &mut CudaAct,
        value: f32,
    ) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(
            self.kernel_set == KernelSet::Extended,
            "{kernel}: this backend's kernels were compiled for a model that does not need it"
        );
        let n = x.rows * x.cols;
        let args = [
            KArg::Ptr(self.ptr(x.slice()?)),
            KArg::F32(value),
            KArg::I64(n as i64),
        ];
        self.launch(kernel, (n.div_ceil(256) as u32, 1, 1), 256, 0, &args)
    }

    /// Launches a norm kernel over the rows of `x` (with `residual` first where it adds one).
    fn launch_norm(
        &self,
        kernel: &str,
        residual: Option<&CudaAct>,
        x: &CudaAct,
        w: &CudaParam,
        eps: f32,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        let o = self.shape(out, x.rows, x.cols)?;
        let mut args = Vec::with_capacity(6);
        if let Some(r) = residual {
            args.push(KArg::Ptr(self.ptr(r.slice()?)));
        }
        args.extend([
            KArg::Ptr(self.ptr(x.slice()?)),
            KArg::Ptr(self.ptr(&w.data)),
            KArg::Ptr(o),
            KArg::I32(int(x.cols, "cols")?),
            KArg::F32(eps),
        ]);
        self.launch_per_row(kernel, x.rows, &args)
    }

    /// Launches a row kernel: one block of 256 threads per row of `rows`.
    fn launch_per_row(&self, kernel: &str, rows: usize, args: &[KArg]) -> anyhow::Result<()> {
        let grid = (int(rows, "rows")? as u32, 1, 1);
        self.launch(kernel, grid, 256, 0, args)
    }
}

impl LayerOps for CudaBackend {
    fn embed(&self, table: &CudaWeight, step: &CudaStep, out: &mut CudaAct) -> anyhow::Result<()> {
        self.flush()?;
        let o = self.shape(out, step.rows, table.cols)?;
        if step.rows == 0 {
            return Ok(());
        }
        let args = [
            KArg::Ptr(self.ptr(&table.data)),
            KArg::Ptr(step.at(step.off.tokens)),
            KArg::Ptr(o),
            KArg::I32(int(table.cols, "hidden")?),
        ];
        self.launch_per_row("embedding_gather", step.rows, &args)
    }

    fn matmul(
        &self,
        x: &CudaAct,
        w: &CudaWeight,
        bias: Option<&CudaParam>,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(
            x.cols == w.cols,
            "matmul: input width {} but the weight takes {}",
            x.cols,
            w.cols
        );
        let (m, n, k) = (x.rows, w.rows, w.cols);
        self.shape(out, m, n)?;
        // Row-major Y[m,n] = X[m,k]·W[n,k]ᵀ is column-major Yᵀ[n,m] = W·Xᵀ: op(A) = Wᵀ of the
        // column-major [k,n] view of W, B = the column-major [k,m] view of X.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: int(n, "matmul N")?,
            n: int(m, "matmul M")?,
            k: int(k, "matmul K")?,
            alpha: bf16::ONE,
            lda: int(k, "matmul K")?,
            ldb: int(k, "matmul K")?,
            beta: bf16::ZERO,
            ldc: int(n, "matmul N")?,
        };
        let xs = x.slice()?;
        let ys = out
            .buf
            .as_mut()
            .ok_or_else(|| anyhow!("matmul output not allocated"))?;
        // SAFETY: W holds n*k, X at least m*k and Y at least m*n elements (checked above).
        unsafe { self.blas.gemm(cfg, &w.data, xs, ys) }
            .map_err(|e| anyhow!("cuBLAS gemm {m}x{k}x{n}: {e:?}"))?;
        if let Some(b) = bias {
            ensure!(b.len == n, "matmul: bias of {} for {n} outputs", b.len);
            let args = [
                KArg::Ptr(self.ptr(out.slice()?)),
                KArg::Ptr(self.ptr(&b.data)),
                KArg::I32(int(n, "cols")?),
            ];
            self.launch(
                "add_bias",
                (n.div_ceil(256) as u32, int(m, "rows")? as u32, 1),
                256,
                0,
                &args,
            )?;
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CudaAct,
        w: &CudaParam,
        eps: f32,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(
            x.cols == w.len,
            "rms_norm: width {} but weight {}",
            x.cols,
            w.len
        );
        self.launch_norm("rms_norm", None, x, w, eps, out)
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaAct,
        x: &CudaAct,
        w: &CudaParam,
        eps: f32,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(
            residual.rows == x.rows && residual.cols == x.cols && x.cols == w.len,
            "add_rms_norm: shapes {}x{}, {}x{}, weight {}",
            residual.rows,
            residual.cols,
            x.rows,
            x.cols,
            w.len
        );
        self.launch_norm("add_rms_norm", Some(residual), x, w, eps, out)
    }

    fn qk_head_norm(
        &self,
        qkv: &mut CudaAct,
        layout: QkvLayout,
        q_w: &CudaParam,
        k_w: &CudaParam,
        eps: f32,
    ) -> anyhow::Result<()> {
        crate::backend::check_qk_head_norm(qkv.cols, layout, q_w.len, k_w.len, 256)?;
        let norm = (self.ptr(&q_w.data), self.ptr(&k_w.data), eps);
        self.defer(self.ptr(qkv.slice()?), qkv.rows, layout, |p| {
            let fresh = p.norm.is_none() && p.rope.is_none();
            if fresh {
                p.norm = Some(norm);
            }
            fresh
        })
    }

    fn rope(
        &self,
        qkv: &mut CudaAct,
        layout: QkvLayout,
        rotary_dim: usize,
        cos: &CudaParam,
        sin: &CudaParam,
        step: &CudaStep,
    ) -> anyhow::Result<()> {
        ensure!(
            qkv.cols == layout.qkv_width() && qkv.rows == step.rows,
            "rope: qkv is {}x{}",
            qkv.rows,
            qkv.cols
        );
        ensure!(
            rotary_dim == layout.head_dim
                || (self.unverified_kernels
                    && rotary_dim > 0
                    && rotary_dim.is_multiple_of(2)
                    && rotary_dim < layout.head_dim),
            "rope: {rotary_dim} of {} dimensions rotated (part of each head runs only with \
             --cuda-unverified-kernels)",
            layout.head_dim
        );
        ensure!(
            layout.head_dim <= 256,
            "rope: head_dim {} (at most 256)",
            layout.head_dim
        );
        ensure!(
            cos.len == sin.len && cos.len.is_multiple_of(rotary_dim / 2),
            "rope: tables of {} and {} values for {rotary_dim} rotated dimensions",
            cos.len,
            sin.len
        );
        let tables = (
            self.ptr(&cos.data),
            self.ptr(&sin.data),
            step.at(step.off.positions),
            rotary_dim,
        );
        self.defer(self.ptr(qkv.slice()?), qkv.rows, layout, |p| {
            let free = p.rope.is_none();
            if free {
                p.rope = Some(tables);
            }
            free
        })
    }

    fn gated_activation(
        &self,
        gate_up: &CudaAct,
        act: Activation,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        let kernel = match act {
            Activation::Silu => "silu_mul",
            Activation::GeluTanh => {
                ensure!(
                    self.kernel_set == KernelSet::Extended,
                    "gated_activation: this backend's kernels were compiled for a model \
                     without GeGLU"
                );
                "gelu_tanh_mul"
            }
            Activation::ClampedSwiglu { .. } => {
                bail!("gated_activation: the clamped SwiGLU has no CUDA kernel yet")
            }
        };
        ensure!(
            gate_up.cols.is_multiple_of(2),
            "gated_activation: odd width {}",
            gate_up.cols
        );
        let inter = gate_up.cols / 2;
        let o = self.shape(out, gate_up.rows, inter)?;
        let args = [
            KArg::Ptr(self.ptr(gate_up.slice()?)),
            KArg::Ptr(o),
            KArg::I32(int(inter, "intermediate")?),
        ];
        self.launch(
            kernel,
            (
                inter.div_ceil(256) as u32,
                int(gate_up.rows, "rows")? as u32,
                1,
            ),
            256,
            0,
            &args,
        )
    }

    fn scale(&self, x: &mut CudaAct, factor: f32) -> anyhow::Result<()> {
        self.map_in_place("scale_bf16", x, factor)
    }

    fn softcap(&self, x: &mut CudaAct, cap: f32) -> anyhow::Result<()> {
        ensure!(cap > 0.0, "softcap: cap {cap}");
        self.map_in_place("softcap_bf16", x, cap)
    }
}
