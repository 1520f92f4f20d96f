//! Mixture-of-experts FFNs on the device (`kernels/experts.cu`): the experts uploaded with
//! their address tables, and one layer's route, group, gate/up, down and combine launches.

use anyhow::{bail, ensure, Context};
use cudarc::driver::CudaSlice;
use half::bf16;

use crate::backend::{Backend, ExpertOps, HostExperts};
use crate::config::{Activation, ExpertSpec, Routing};

use super::{ensure_len, int, CudaAct, CudaBackend, CudaWeight, KArg, KernelSet};

/// Grow-only buffers of the mixture-of-experts kernels: per (token, slot) entry its expert
/// and weight, the entries grouped by expert, their gated activations and down outputs.
#[derive(Default)]
pub(super) struct ExpertScratch {
    pub(super) ids: Option<CudaSlice<i32>>,
    pub(super) route_weights: Option<CudaSlice<f32>>,
    pub(super) offsets: Option<CudaSlice<i32>>,
    pub(super) order: Option<CudaSlice<i32>>,
    pub(super) act: Option<CudaSlice<bf16>>,
    pub(super) y: Option<CudaSlice<bf16>>,
}

/// A mixture-of-experts FFN on the device: the f32 router `[num_experts, hidden]`, each
/// expert's bf16 fused gate/up and down, and tables of their addresses for the kernels.
pub struct CudaExperts {
    pub(super) router: CudaSlice<f32>,
    pub(super) router_bias: Option<CudaSlice<f32>>,
    pub(super) experts: Vec<(CudaWeight, CudaWeight)>,
    pub(super) gate_up_ptrs: CudaSlice<u64>,
    pub(super) down_ptrs: CudaSlice<u64>,
    /// Each expert's gate/up and down biases (f32), and their address tables.
    pub(super) biases: Option<ExpertBiases>,
    pub(super) hidden: usize,
    pub(super) inter: usize,
}

/// A mixture of experts' biases on the device: the slices the tables point into, kept alive.
pub struct ExpertBiases {
    pub(super) _slices: Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
    pub(super) gate_up_ptrs: CudaSlice<u64>,
    pub(super) down_ptrs: CudaSlice<u64>,
}

impl CudaBackend {
    /// The expert buffers for `entries` (token, slot) entries over `num_experts` experts of
    /// width `inter` in a model of width `hidden`, grown as needed; returns the pointers of
    /// ids, weights, offsets, order, act and y.
    pub(super) fn expert_scratch(
        &self,
        entries: usize,
        num_experts: usize,
        inter: usize,
        hidden: usize,
    ) -> anyhow::Result<[u64; 6]> {
        let mut st = self.state()?;
        let s = &mut st.experts;
        let stream = &self.stream;
        let mut grew = ensure_len(stream, &mut s.ids, entries, "the experts' ids")?;
        grew |= ensure_len(
            stream,
            &mut s.route_weights,
            entries,
            "the experts' weights",
        )?;
        grew |= ensure_len(
            stream,
            &mut s.offsets,
            num_experts + 1,
            "the experts' offsets",
        )?;
        grew |= ensure_len(stream, &mut s.order, entries, "the experts' entry order")?;
        grew |= ensure_len(
            stream,
            &mut s.act,
            entries * inter,
            "the experts' activations",
        )?;
        grew |= ensure_len(stream, &mut s.y, entries * hidden, "the experts' outputs")?;
        let ptrs = [
            s.ids.as_ref().map(|b| self.ptr(b)),
            s.route_weights.as_ref().map(|b| self.ptr(b)),
            s.offsets.as_ref().map(|b| self.ptr(b)),
            s.order.as_ref().map(|b| self.ptr(b)),
            s.act.as_ref().map(|b| self.ptr(b)),
            s.y.as_ref().map(|b| self.ptr(b)),
        ]
        .map(|p| p.unwrap_or(0));
        if grew {
            st.graphs.epoch += 1;
        }
        Ok(ptrs)
    }
}

impl ExpertOps for CudaBackend {
    fn upload_experts(&self, name: &str, host: HostExperts) -> anyhow::Result<CudaExperts> {
        let HostExperts {
            router,
            router_bias,
            experts,
        } = host;
        ensure!(
            experts.iter().all(|e| e.biases.is_some())
                || experts.iter().all(|e| e.biases.is_none()),
            "{name}: some experts have biases and some not"
        );
        let router_name = format!("{name}'s router");
        let (num_experts, hidden) = router.matrix_dims(&router_name)?;
        ensure!(
            experts.len() == num_experts,
            "`{router_name}` routes to {num_experts} experts but {} were loaded",
            experts.len()
        );
        let router = self
            .stream
            .clone_htod(&router.into_f32())
            .with_context(|| format!("uploading `{router_name}`"))?;
        let router_bias = match router_bias {
            Some(b) => Some(self.upload_param(&format!("{router_name} bias"), b)?.data),
            None => None,
        };
        let mut weights = Vec::with_capacity(num_experts);
        let mut bias_slices = Vec::new();
        for (x, e) in experts.into_iter().enumerate() {
            let at = format!("{name}.mlp.experts.{x}");
            weights.push((
                self.upload_weight(&format!("{at}.gate_up"), e.gate_up)?,
                self.upload_weight(&format!("{at}.down_proj.weight"), e.down)?,
            ));
            if let Some((gate_up, down)) = e.biases {
                bias_slices.push((
                    self.upload_param(&format!("{at}.gate_up.bias"), gate_up)?
                        .data,
                    self.upload_param(&format!("{at}.down_proj.bias"), down)?
                        .data,
                ));
            }
        }
        let inter = weights.first().map_or(0, |(_, down)| down.cols);
        for (x, (gate_up, down)) in weights.iter().enumerate() {
            ensure!(
                (gate_up.rows, gate_up.cols, down.rows, down.cols)
                    == (2 * inter, hidden, hidden, inter),
                "{name}: expert {x}'s gate/up is {}x{} and its down {}x{}, where the router's \
                 width {hidden} and expert 0's down give {}x{hidden} and {hidden}x{inter}",
                gate_up.rows,
                gate_up.cols,
                down.rows,
                down.cols,
                2 * inter
            );
        }
        let table = |ptrs: Vec<u64>| {
            self.stream
                .clone_htod(&ptrs)
                .with_context(|| format!("uploading {name}'s expert address table"))
        };
        let gate_up_ptrs = table(weights.iter().map(|(g, _)| self.ptr(&g.data)).collect())?;
        let down_ptrs = table(weights.iter().map(|(_, d)| self.ptr(&d.data)).collect())?;
        let biases = if bias_slices.is_empty() {
            None
        } else {
            Some(ExpertBiases {
                gate_up_ptrs: table(bias_slices.iter().map(|(g, _)| self.ptr(g)).collect())?,
                down_ptrs: table(bias_slices.iter().map(|(_, d)| self.ptr(d)).collect())?,
                _slices: bias_slices,
            })
        };
        Ok(CudaExperts {
            router,
            router_bias,
            experts: weights,
            gate_up_ptrs,
            down_ptrs,
            biases,
            hidden,
            inter,
        })
    }

    fn expert_bytes(&self, experts: &CudaExperts) -> (usize, usize) {
        let one = experts
            .experts
            .first()
            .map_or(0, |(g, d)| self.weight_bytes(g) + self.weight_bytes(d));
        (experts.router.len() * std::mem::size_of::<f32>(), one)
    }

    /// Routes on the device (`moe_route`), groups the entries by expert (`moe_group`), runs
    /// each expert's gate/up with SwiGLU and its down over its entries (`moe_gate_up`,
    /// `moe_down`: one warp per output row, a matrix-vector product per entry on CUDA cores,
    /// written for correctness first), and sums each token's slots (`moe_combine`). No host
    /// synchronisation: graphs capture it.
    fn experts_ffn(
        &self,
        x: &CudaAct,
        experts: &CudaExperts,
        spec: ExpertSpec,
        act: Activation,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(
            self.kernel_set == KernelSet::Extended,
            "experts_ffn: this backend's kernels were compiled for a model without experts"
        );
        // moe_gate_up's activation: SwiGLU (a limit of 0) or the clamped SwiGLU.
        let (alpha, limit) = match act {
            Activation::Silu => (0.0, 0.0),
            Activation::ClampedSwiglu { alpha, limit } => {
                ensure!(limit > 0.0, "experts_ffn: a clamped SwiGLU's limit {limit}");
                (alpha, limit)
            }
            Activation::GeluTanh => bail!("experts_ffn: GeGLU experts have no CUDA kernel"),
        };
        let (renormalise, top_k_first) = match spec.routing {
            Routing::SoftmaxTopK { renormalise } => (renormalise, false),
            Routing::TopKSoftmax => (false, true),
        };
        ensure!(
            (1..=spec.num_experts).contains(&spec.top_k),
            "experts_ffn: top_k {} is not between 1 and the {} experts",
            spec.top_k,
            spec.num_experts
        );
        ensure!(
            x.cols == experts.hidden
                && spec.num_experts == experts.experts.len()
                && spec.intermediate_size == experts.inter,
            "experts_ffn: input width {} and {} experts of width {} for a layer of {} experts \
             of width {} over {}",
            x.cols,
            spec.num_experts,
            spec.intermediate_size,
            experts.experts.len(),
            experts.inter,
            experts.hidden
        );
        let (rows, h, e, k, inter) = (
            x.rows,
            experts.hidden,
            spec.num_experts,
            spec.top_k,
            experts.inter,
        );
        let entries = rows * k;
        let [ids, weights, offsets, order, act_buf, y] =
            self.expert_scratch(entries, e, inter, h)?;
        let xp = self.ptr(x.slice()?);
        let out_ptr = self.shape(out, rows, h)?;
        let (hi, ei, ki, ii) = (
            int(h, "hidden")?,
            int(e, "experts")?,
            int(k, "top_k")?,
            int(inter, "expert width")?,
        );
        // An address table of the experts' biases, null without them.
        let bias_table = |which: fn(&ExpertBiases) -> &CudaSlice<u64>| {
            experts.biases.as_ref().map_or(0, |b| self.ptr(which(b)))
        };
        // One f32 (moe_route's scores) or i32 (moe_group's cursors) per expert.
        let smem = int(4 * e, "expert shared memory")? as u32;
        let rows_u = int(rows, "rows")? as u32;
        self.launch(
            "moe_route",
            (rows_u, 1, 1),
            128,
            smem,
            &[
                KArg::Ptr(xp),
                KArg::Ptr(self.ptr(&experts.router)),
                KArg::Ptr(experts.router_bias.as_ref().map_or(0, |b| self.ptr(b))),
                KArg::Ptr(ids),
                KArg::Ptr(weights),
                KArg::I32(hi),
                KArg::I32(ei),
                KArg::I32(ki),
                KArg::I32(renormalise as i32),
                KArg::I32(top_k_first as i32),
            ],
        )?;
        self.launch(
            "moe_group",
            (1, 1, 1),
            1024,
            smem,
            &[
                KArg::Ptr(ids),
                KArg::I32(int(entries, "expert entries")?),
                KArg::I32(ei),
                KArg::Ptr(offsets),
                KArg::Ptr(order),
            ],
        )?;
        self.launch(
            "moe_gate_up",
            (inter.div_ceil(8) as u32, e as u32, 1),
            256,
            0,
            &[
                KArg::Ptr(xp),
                KArg::Ptr(self.ptr(&experts.gate_up_ptrs)),
                KArg::Ptr(bias_table(|b| &b.gate_up_ptrs)),
                KArg::Ptr(offsets),
                KArg::Ptr(order),
                KArg::Ptr(act_buf),
                KArg::I32(hi),
                KArg::I32(ii),
                KArg::I32(ki),
                KArg::F32(alpha),
                KArg::F32(limit),
            ],
        )?;
        self.launch(
            "moe_down",
            (h.div_ceil(8) as u32, e as u32, 1),
            256,
            0,
            &[
                KArg::Ptr(act_buf),
                KArg::Ptr(self.ptr(&experts.down_ptrs)),
                KArg::Ptr(bias_table(|b| &b.down_ptrs)),
                KArg::Ptr(offsets),
                KArg::Ptr(order),
                KArg::Ptr(y),
                KArg::I32(hi),
                KArg::I32(ii),
            ],
        )?;
        self.launch(
            "moe_combine",
            (h.div_ceil(256) as u32, rows_u, 1),
            256,
            0,
            &[
                KArg::Ptr(y),
                KArg::Ptr(weights),
                KArg::Ptr(out_ptr),
                KArg::I32(hi),
                KArg::I32(ki),
            ],
        )
    }
}
