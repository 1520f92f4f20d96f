//! The layer ops on the CPU: shapes checked, then the kernels of `ops` and `matmul`.

use anyhow::ensure;

use super::backend::CpuBackend;
use super::matmul::{self, CpuWeight};
use super::ops;
use super::tensors::{CpuAct, CpuStep};
use crate::backend::{check_qk_head_norm, LayerOps, QkvLayout};
use crate::config::Activation;

impl LayerOps for CpuBackend {
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
        check_qk_head_norm(qkv.cols, layout, q_w.len(), k_w.len(), 512)?;
        let norms = ops::HeadNorms {
            n_q: layout.num_heads,
            n_k: layout.num_kv_heads,
            q_w,
            k_w,
            eps,
        };
        ops::qk_head_norm(&mut qkv.data, qkv.cols, norms);
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

    fn scale(&self, x: &mut CpuAct, factor: f32) -> anyhow::Result<()> {
        x.data.iter_mut().for_each(|v| *v *= factor);
        Ok(())
    }

    fn softcap(&self, x: &mut CpuAct, cap: f32) -> anyhow::Result<()> {
        ensure!(cap > 0.0, "softcap: cap {cap}");
        x.data.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        Ok(())
    }
}
