//! Mixture-of-experts FFNs on the CPU: the router in f32, each expert's matrices stored as
//! every other weight, the step's rows grouped by expert.

use anyhow::ensure;
use rayon::prelude::*;

use super::backend::CpuBackend;
use super::matmul::{self, CpuWeight};
use super::ops;
use super::tensors::CpuAct;
use crate::backend::{routing, Backend, ExpertOps, HostExperts};
use crate::config::{Activation, ExpertSpec};

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

impl ExpertOps for CpuBackend {
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
}
