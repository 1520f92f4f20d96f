//! Loading: a family's weights, read and checked by name and shape, into the layers and
//! the KV cache of a [`Model`].

use anyhow::{bail, ensure, Context};

use crate::backend::{
    refuse_what_it_lacks, state_page_values, Backend, DeltaNetParams, HostExpert, HostExperts,
    KvCacheShape, QkvLayout,
};
use crate::config::{
    DeltaNetSpec, ExpertSpec, Family, Ffn, LayerSpec, Mixer, ModelConfig, NormPlacement,
    NormWeights, RopeSpec,
};
use crate::kv_sizing::{kv_bytes_per_layer_token, layer_block_bytes, RunnerOptions};
use crate::layer_groups::LayerGroups;
use crate::weights::{HostTensor, QuantType, TensorData, WeightSource};

use super::{
    rope_positions, AttentionWeights, Buffers, DeltaNetWeights, FfnWeights, HostScratch, Layer,
    MixerWeights, Model, ModelState, SharedExpert, StepProfile,
};

/// Reads a tensor and checks its shape; errors name the tensor.
fn read(weights: &mut dyn WeightSource, name: &str, shape: &[usize]) -> anyhow::Result<HostTensor> {
    if !weights.contains(name) {
        bail!("missing tensor `{name}`");
    }
    let t = weights
        .load(name)
        .with_context(|| format!("loading tensor `{name}`"))?;
    ensure!(
        t.shape == shape,
        "tensor `{name}` has shape {:?}, expected {shape:?}",
        t.shape
    );
    Ok(t)
}

/// Stacks 2-D tensors (or 1-D vectors) along the first dimension into `name`. Quantised
/// parts stay quantised, each in its own type (their rows are whole blocks); other mixes
/// of types become f32.
fn concat_rows(name: &str, parts: Vec<HostTensor>) -> HostTensor {
    let rows: usize = parts.iter().map(|p| p.shape[0]).sum();
    let len: usize = parts.iter().map(|p| p.data.len()).sum();
    let mut shape = parts[0].shape.clone();
    shape[0] = rows;
    let same = |f: fn(&TensorData) -> bool| parts.iter().all(|p| f(&p.data));
    let data = if same(|d| matches!(d, TensorData::F16(_))) {
        let mut out = Vec::with_capacity(len);
        for p in &parts {
            if let TensorData::F16(v) = &p.data {
                out.extend_from_slice(v);
            }
        }
        TensorData::F16(out)
    } else if same(|d| matches!(d, TensorData::BF16(_))) {
        let mut out = Vec::with_capacity(len);
        for p in &parts {
            if let TensorData::BF16(v) = &p.data {
                out.extend_from_slice(v);
            }
        }
        TensorData::BF16(out)
    } else if same(|d| matches!(d, TensorData::Quant(..))) {
        let mut stacked: Vec<(QuantType, Vec<u8>)> = Vec::new();
        for p in parts {
            if let TensorData::Quant(q, b) = p.data {
                match stacked.last_mut() {
                    Some((last, bytes)) if *last == q => bytes.extend_from_slice(&b),
                    _ => stacked.push((q, b)),
                }
            }
        }
        if stacked.len() == 1 {
            let (q, b) = stacked.pop().expect("one part");
            TensorData::Quant(q, b)
        } else {
            let types: Vec<String> = stacked.iter().map(|(q, _)| format!("{q:?}")).collect();
            tracing::debug!("`{name}` stacks parts of types {}", types.join(", "));
            TensorData::QuantParts(stacked)
        }
    } else {
        let mut out = Vec::with_capacity(len);
        for p in parts {
            out.extend_from_slice(&p.data.into_f32());
        }
        TensorData::F32(out)
    };
    HostTensor { shape, data }
}

/// A layer's experts under the prefix `p` (`model.layers.N`): the router (`mlp.gate`, or
/// gpt-oss's `mlp.router`) with its bias where the spec has biases, and each expert's gate,
/// up and down projections in one of the layouts files hold them:
/// - per expert, as HF files store Qwen3-MoE (`mlp.experts.E.gate_proj.weight`);
/// - stacked `[experts, rows, cols]`, as GGUF's `ffn_{gate,up,down}_exps` are
///   (`mlp.experts.gate_proj.weight`, biases `mlp.experts.gate_proj.bias`);
/// - gpt-oss's fused gate/up, gate and up rows interleaved, with biases
///   `gate_up_proj_bias` and `down_proj_bias`: as `[experts, out, in]` matrices where the
///   checkpoint holds MXFP4 blocks (`mlp.experts.gate_up_proj.weight`, read from
///   `gate_up_proj_blocks` and `_scales`), or as `x · W` matrices `[experts, in, out]`
///   where it holds them unquantised (`mlp.experts.gate_up_proj`, as `save_pretrained`
///   writes them).
///
/// Quantised experts stay so.
fn load_experts<B: Backend>(
    backend: &B,
    w: &mut dyn WeightSource,
    p: &str,
    e: ExpertSpec,
    h: usize,
    c: &ModelConfig,
) -> anyhow::Result<B::Experts> {
    let (n, inter) = (e.num_experts, e.intermediate_size);
    let router_name = match c.family {
        Family::GptOss => format!("{p}.mlp.router"),
        _ => format!("{p}.mlp.gate"),
    };
    let router = read(w, &format!("{router_name}.weight"), &[n, h])?;
    let router_bias = if e.biases {
        Some(read(w, &format!("{router_name}.bias"), &[n])?)
    } else {
        refuse_undescribed(w, std::iter::once(format!("{router_name}.bias")), c)?;
        None
    };
    let x = format!("{p}.mlp.experts");
    let (gates, ups, downs) = if w.contains(&format!("{x}.0.gate_proj.weight")) {
        let mut parts = [
            ("gate_proj", [inter, h]),
            ("up_proj", [inter, h]),
            ("down_proj", [h, inter]),
        ]
        .map(|(part, shape)| {
            (0..n)
                .map(|i| read(w, &format!("{x}.{i}.{part}.weight"), &shape))
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .into_iter();
        let mut next = || parts.next().expect("three parts");
        (next()?, next()?, next()?)
    } else if w.contains(&format!("{x}.gate_proj.weight")) {
        let mut stack = |part: &str, [rows, cols]: [usize; 2]| {
            let name = format!("{x}.{part}.weight");
            read(w, &name, &[n, rows, cols])?.split_outer(&name)
        };
        (
            stack("gate_proj", [inter, h])?,
            stack("up_proj", [inter, h])?,
            stack("down_proj", [h, inter])?,
        )
    } else if w.contains(&format!("{x}.gate_up_proj.weight")) {
        let name = format!("{x}.gate_up_proj.weight");
        let (gates, ups) = split_gate_up(read(w, &name, &[n, 2 * inter, h])?, &name)?;
        let name = format!("{x}.down_proj.weight");
        (
            gates,
            ups,
            read(w, &name, &[n, h, inter])?.split_outer(&name)?,
        )
    } else if w.contains(&format!("{x}.gate_up_proj")) {
        let name = format!("{x}.gate_up_proj");
        let fused = read(w, &name, &[n, h, 2 * inter])?
            .split_outer(&name)?
            .into_iter()
            .map(|t| t.transposed(&name))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (gates, ups) = fused
            .into_iter()
            .map(|t| t.split_interleaved_rows(&name))
            .collect::<anyhow::Result<(Vec<_>, Vec<_>)>>()?;
        let name = format!("{x}.down_proj");
        let downs = read(w, &name, &[n, inter, h])?
            .split_outer(&name)?
            .into_iter()
            .map(|t| t.transposed(&name))
            .collect::<anyhow::Result<Vec<_>>>()?;
        (gates, ups, downs)
    } else {
        bail!(
            "the experts of {p}: no tensor per expert (`{x}.0.gate_proj.weight`), stack (GGUF \
             `ffn_*_exps`) or fused gate/up (`{x}.gate_up_proj`, or its MXFP4 `_blocks`)"
        );
    };
    let biases = if e.biases {
        let (gate_b, up_b, down_b) = if w.contains(&format!("{x}.gate_proj.bias")) {
            let mut stack = |part: &str, len: usize| {
                let name = format!("{x}.{part}.bias");
                read(w, &name, &[n, len])?.split_outer(&name)
            };
            (
                stack("gate_proj", inter)?,
                stack("up_proj", inter)?,
                stack("down_proj", h)?,
            )
        } else {
            let name = format!("{x}.gate_up_proj_bias");
            let (gate_b, up_b) = split_gate_up(read(w, &name, &[n, 2 * inter])?, &name)?;
            let name = format!("{x}.down_proj_bias");
            (gate_b, up_b, read(w, &name, &[n, h])?.split_outer(&name)?)
        };
        let fused = gate_b
            .into_iter()
            .zip(up_b)
            .enumerate()
            .map(|(i, (g, u))| concat_rows(&format!("{x}.{i}.gate_up.bias"), vec![g, u]));
        fused.zip(down_b).map(Some).collect()
    } else {
        let names = ["gate_proj.bias", "gate_up_proj_bias", "down_proj_bias"];
        refuse_undescribed(w, names.iter().map(|b| format!("{x}.{b}")), c)?;
        vec![None; n]
    };
    let experts = gates
        .into_iter()
        .zip(ups)
        .zip(downs)
        .zip(biases)
        .enumerate()
        .map(|(i, (((gate, up), down), biases))| HostExpert {
            gate_up: concat_rows(&format!("{x}.{i}.gate_up"), vec![gate, up]),
            down,
            biases,
        })
        .collect();
    backend.upload_experts(
        p,
        HostExperts {
            router,
            router_bias,
            experts,
        },
    )
}

/// A stack of gpt-oss's fused gate/up (matrices `[experts, 2 × width, ..]` or biases
/// `[experts, 2 × width]`), gate and up rows interleaved, into each expert's gate and up.
fn split_gate_up(
    stack: HostTensor,
    name: &str,
) -> anyhow::Result<(Vec<HostTensor>, Vec<HostTensor>)> {
    stack
        .split_outer(name)?
        .into_iter()
        .map(|t| t.split_interleaved_rows(name))
        .collect()
}

impl<B: Backend> Layer<B> {
    fn load(
        backend: &B,
        c: &ModelConfig,
        w: &mut dyn WeightSource,
        i: usize,
        rope: usize,
    ) -> anyhow::Result<Self> {
        let p = format!("model.layers.{i}");
        let spec = c.layers[i].clone();
        let h = c.hidden_size;
        let norm = |w: &mut dyn WeightSource, name: String, len: usize| {
            backend.upload_param(&name, read_norm(w, &name, len, c.norm_weights)?)
        };
        let mixer = match spec.mixer {
            Mixer::Attention { output_gate } => {
                MixerWeights::Attention(load_attention(backend, c, w, &p, &spec, output_gate)?)
            }
            Mixer::GatedDeltaNet(delta_net) => {
                MixerWeights::DeltaNet(load_delta_net(backend, c, w, &p, delta_net)?)
            }
        };
        // Biases no family here has.
        let biases = [
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.gate_up_proj",
            "mlp.down_proj",
        ];
        refuse_undescribed(w, biases.iter().map(|n| format!("{p}.{n}.bias")), c)?;
        let fused = c.family.stores_fused_projections();
        let ffn = match spec.ffn {
            Ffn::Dense {
                intermediate_size: inter,
            } => {
                let (gate_up, down) =
                    load_gated_ffn(backend, w, &format!("{p}.mlp"), inter, h, fused)?;
                FfnWeights::Dense { gate_up, down }
            }
            Ffn::Experts(e) => FfnWeights::Experts(e, load_experts(backend, w, &p, e, h, c)?),
        };
        let shared_name = format!("{p}.mlp.shared_expert");
        let gate_name = format!("{p}.mlp.shared_expert_gate.weight");
        let shared_expert = match spec.shared_expert {
            Some(width) => {
                let (gate_up, down) = load_gated_ffn(backend, w, &shared_name, width, h, false)?;
                let gate = backend.upload_weight(&gate_name, read(w, &gate_name, &[1, h])?)?;
                Some(SharedExpert {
                    gate_up,
                    down,
                    gate,
                })
            }
            None => {
                let names = [format!("{shared_name}.down_proj.weight"), gate_name];
                refuse_undescribed(w, names.into_iter(), c)?;
                None
            }
        };
        // Llama's `post_attention_layernorm` is the pre-FFN norm; Gemma's is on the
        // attention output, its pre-FFN norm `pre_feedforward_layernorm`.
        let (mlp_norm, post_norms) = match spec.norms {
            NormPlacement::Pre => {
                let names = ["pre_feedforward_layernorm", "post_feedforward_layernorm"];
                refuse_undescribed(w, names.iter().map(|n| format!("{p}.{n}.weight")), c)?;
                (
                    norm(w, format!("{p}.post_attention_layernorm.weight"), h)?,
                    None,
                )
            }
            NormPlacement::Sandwich => (
                norm(w, format!("{p}.pre_feedforward_layernorm.weight"), h)?,
                Some((
                    norm(w, format!("{p}.post_attention_layernorm.weight"), h)?,
                    norm(w, format!("{p}.post_feedforward_layernorm.weight"), h)?,
                )),
            ),
        };
        Ok(Layer {
            spec,
            rope,
            attn_norm: norm(w, format!("{p}.input_layernorm.weight"), h)?,
            mixer,
            post_norms,
            mlp_norm,
            ffn,
            shared_expert,
        })
    }
}

/// A gated FFN under `prefix` (`model.layers.N.mlp`): gate and up fused row-wise (as
/// stored where the family fuses them), and down.
fn load_gated_ffn<B: Backend>(
    backend: &B,
    w: &mut dyn WeightSource,
    prefix: &str,
    inter: usize,
    h: usize,
    fused: bool,
) -> anyhow::Result<(B::Weight, B::Weight)> {
    let gate_up_name = format!("{prefix}.gate_up");
    let gate_up = if fused {
        read(w, &format!("{prefix}.gate_up_proj.weight"), &[2 * inter, h])?
    } else {
        let gate = read(w, &format!("{prefix}.gate_proj.weight"), &[inter, h])?;
        let up = read(w, &format!("{prefix}.up_proj.weight"), &[inter, h])?;
        concat_rows(&gate_up_name, vec![gate, up])
    };
    let down_name = format!("{prefix}.down_proj.weight");
    Ok((
        backend.upload_weight(&gate_up_name, gate_up)?,
        backend.upload_weight(&down_name, read(w, &down_name, &[h, inter])?)?,
    ))
}

/// An attention layer's projections under `p`: q/k/v fused (Qwen3-Next's `q_proj` split
/// into the queries and the output gate, each head's `[query | gate]`), their biases,
/// QK-norms, the output projection, sinks.
fn load_attention<B: Backend>(
    backend: &B,
    c: &ModelConfig,
    w: &mut dyn WeightSource,
    p: &str,
    spec: &LayerSpec,
    output_gate: bool,
) -> anyhow::Result<AttentionWeights<B>> {
    let (h, hd) = (c.hidden_size, c.head_dim);
    let (qw, kvw) = (c.num_heads * hd, c.num_kv_heads * hd);
    let norm = |w: &mut dyn WeightSource, name: String, len: usize| {
        backend.upload_param(&name, read_norm(w, &name, len, c.norm_weights)?)
    };
    let qkv_names = ["q_proj", "k_proj", "v_proj"].map(|n| format!("{p}.self_attn.{n}"));
    let widths = [qw, kvw, kvw];
    let qkv_name = format!("{p}.self_attn.qkv");
    let mut gate = None;
    let qkv = if c.family.stores_fused_projections() {
        read(
            w,
            &format!("{p}.self_attn.qkv_proj.weight"),
            &[qw + 2 * kvw, h],
        )?
    } else {
        let mut parts = Vec::new();
        for (n, &rows) in qkv_names.iter().zip(&widths) {
            let name = format!("{n}.weight");
            if output_gate && n.ends_with("q_proj") {
                let both = read(w, &name, &[2 * qw, h])?;
                let half = |offset: usize| -> Vec<usize> {
                    (0..qw)
                        .map(|r| (r / hd) * 2 * hd + offset + r % hd)
                        .collect()
                };
                parts.push(both.select_rows(&name, &half(0))?);
                let gate_name = format!("{p}.self_attn.gate");
                gate =
                    Some(backend.upload_weight(&gate_name, both.select_rows(&name, &half(hd))?)?);
            } else {
                parts.push(read(w, &name, &[rows, h])?);
            }
        }
        concat_rows(&qkv_name, parts)
    };
    let qkv = backend.upload_weight(&qkv_name, qkv)?;
    let qkv_bias = if spec.qkv_bias {
        let mut parts = Vec::new();
        for (n, &rows) in qkv_names.iter().zip(&widths) {
            parts.push(read(w, &format!("{n}.bias"), &[rows])?);
        }
        let name = format!("{p}.self_attn.qkv.bias");
        Some(backend.upload_param(&name, concat_rows(&name, parts))?)
    } else {
        let names = qkv_names.iter().map(|n| format!("{n}.bias"));
        let fused_bias = std::iter::once(format!("{p}.self_attn.qkv_proj.bias"));
        refuse_undescribed(w, names.chain(fused_bias), c)?;
        None
    };
    let q_norm = format!("{p}.self_attn.q_norm.weight");
    let k_norm = format!("{p}.self_attn.k_norm.weight");
    let qk_norm = if spec.qk_norm {
        Some((norm(w, q_norm, hd)?, norm(w, k_norm, hd)?))
    } else {
        refuse_undescribed(w, [q_norm, k_norm].into_iter(), c)?;
        None
    };
    let o_name = format!("{p}.self_attn.o_proj");
    let o_weight = format!("{o_name}.weight");
    let o_proj = backend.upload_weight(&o_weight, read(w, &o_weight, &[h, qw])?)?;
    let o_bias_name = format!("{o_name}.bias");
    let o_bias = if spec.o_bias {
        Some(backend.upload_param(&o_bias_name, read(w, &o_bias_name, &[h])?)?)
    } else {
        refuse_undescribed(w, std::iter::once(o_bias_name), c)?;
        None
    };
    let sinks_name = format!("{p}.self_attn.sinks");
    let sinks = if spec.sinks {
        let values = read(w, &sinks_name, &[c.num_heads])?;
        Some(backend.upload_param(&sinks_name, values)?)
    } else {
        refuse_undescribed(w, std::iter::once(sinks_name), c)?;
        None
    };
    Ok(AttentionWeights {
        qkv,
        qkv_bias,
        qk_norm,
        gate,
        o_proj,
        o_bias,
        sinks,
    })
}

/// A Gated DeltaNet under `p` (`model.layers.N`), its input projections fused row-wise as
/// `[q k v | z | b a]` in the file's value-head order: Qwen3.5's `in_proj_qkv` (all q,
/// then all k, then all v), `in_proj_z`, `in_proj_b` and `in_proj_a`, or Qwen3-Next's
/// `in_proj_qkvz` (per key head `[q | k | v of its value heads | z of them]`) and
/// `in_proj_ba` (per key head `[b | a]` of its value heads), reordered.
fn load_delta_net<B: Backend>(
    backend: &B,
    c: &ModelConfig,
    w: &mut dyn WeightSource,
    p: &str,
    spec: DeltaNetSpec,
) -> anyhow::Result<DeltaNetWeights<B>> {
    let h = c.hidden_size;
    let x = format!("{p}.linear_attn");
    let (kw, vw, nv) = (spec.key_width(), spec.value_width(), spec.num_value_heads);
    let (nk, dk) = (spec.num_key_heads, spec.key_head_dim);
    let in_proj_name = format!("{x}.in_proj");
    let qkvz_name = format!("{x}.in_proj_qkvz.weight");
    // Per key head, Qwen3-Next's fused rows: q dk, k dk, v and z of its value heads; b and a
    // of its value heads.
    let (group_v, r) = (vw / nk, nv / nk);
    let per_key_head = |offset: usize, len: usize, stride: usize| -> Vec<usize> {
        (0..nk)
            .flat_map(|k| (0..len).map(move |i| k * stride + offset + i))
            .collect()
    };
    let (qkv, z) = if w.contains(&qkvz_name) {
        let qkvz = read(w, &qkvz_name, &[2 * kw + 2 * vw, h])?;
        let stride = 2 * dk + 2 * group_v;
        let qkv_rows = [
            per_key_head(0, dk, stride),
            per_key_head(dk, dk, stride),
            per_key_head(2 * dk, group_v, stride),
        ]
        .concat();
        let z_rows = per_key_head(2 * dk + group_v, group_v, stride);
        (
            qkvz.select_rows(&qkvz_name, &qkv_rows)?,
            qkvz.select_rows(&qkvz_name, &z_rows)?,
        )
    } else {
        (
            read(w, &format!("{x}.in_proj_qkv.weight"), &[2 * kw + vw, h])?,
            read(w, &format!("{x}.in_proj_z.weight"), &[vw, h])?,
        )
    };
    let ba_name = format!("{x}.in_proj_ba.weight");
    let (b, a) = if w.contains(&ba_name) {
        let ba = read(w, &ba_name, &[2 * nv, h])?;
        (
            ba.select_rows(&ba_name, &per_key_head(0, r, 2 * r))?,
            ba.select_rows(&ba_name, &per_key_head(r, r, 2 * r))?,
        )
    } else {
        (
            read(w, &format!("{x}.in_proj_b.weight"), &[nv, h])?,
            read(w, &format!("{x}.in_proj_a.weight"), &[nv, h])?,
        )
    };
    let in_proj = concat_rows(&in_proj_name, vec![qkv, z, b, a]);
    let param = |w: &mut dyn WeightSource, part: &str, len: usize| -> anyhow::Result<HostTensor> {
        let name = format!("{x}.{part}");
        ensure!(w.contains(&name), "missing tensor `{name}`");
        let t = w
            .load(&name)
            .with_context(|| format!("loading tensor `{name}`"))?;
        ensure!(
            t.numel() == len,
            "tensor `{name}` has shape {:?}, expected {len} values",
            t.shape
        );
        Ok(HostTensor {
            shape: vec![len],
            data: TensorData::F32(t.into_f32()),
        })
    };
    // HF's `[channels, 1, kernel]`, GGUF's `[channels, kernel]`: the same values, kept
    // tap-major.
    let (channels, kernel) = (spec.conv_channels(), spec.conv_kernel);
    let by_channel = param(w, "conv1d.weight", channels * kernel)?.into_f32();
    let conv = HostTensor {
        shape: vec![channels * kernel],
        data: TensorData::F32(
            (0..kernel)
                .flat_map(|j| by_channel.iter().skip(j).step_by(kernel).copied())
                .collect(),
        ),
    };
    // HF's `A_log`, or GGUF's `ssm_a`, which llama.cpp's converter stores as `−exp(A_log)`.
    let decay = if w.contains(&format!("{x}.A_log")) {
        let a_log = param(w, "A_log", nv)?;
        HostTensor {
            shape: vec![nv],
            data: TensorData::F32(a_log.into_f32().into_iter().map(|a| -a.exp()).collect()),
        }
    } else {
        param(w, "ssm_a", nv)?
    };
    let dt_bias = param(w, "dt_bias", nv)?;
    // The gated norm multiplies by its weight as stored (`Qwen3NextRMSNormGated`).
    let norm = param(w, "norm.weight", spec.value_head_dim)?;
    refuse_undescribed(w, std::iter::once(format!("{x}.conv1d.bias")), c)?;
    let out_name = format!("{x}.out_proj.weight");
    let out_proj = read(w, &out_name, &[h, vw])?;
    let upload = |name: &str, t: HostTensor| backend.upload_param(&format!("{x}.{name}"), t);
    Ok(DeltaNetWeights {
        spec,
        in_proj: backend.upload_weight(&in_proj_name, in_proj)?,
        params: DeltaNetParams {
            conv: upload("conv1d", conv)?,
            decay: upload("decay", decay)?,
            dt_bias: upload("dt_bias", dt_bias)?,
            norm: upload("norm", norm)?,
        },
        out_proj: backend.upload_weight(&out_name, out_proj)?,
    })
}

/// An RMSNorm weight of `len` values as the forward multiplies by it: `1 + w` where the
/// file stores Gemma's `w` ([`NormWeights::PlusOne`]).
fn read_norm(
    w: &mut dyn WeightSource,
    name: &str,
    len: usize,
    style: NormWeights,
) -> anyhow::Result<HostTensor> {
    let t = read(w, name, &[len])?;
    Ok(match style {
        NormWeights::AsStored => t,
        NormWeights::PlusOne => HostTensor {
            shape: t.shape,
            data: TensorData::F32(t.data.into_f32().into_iter().map(|v| v + 1.0).collect()),
        },
    })
}

/// Fails on the first of `names` that the weights hold although the family's description
/// has no place for it: a tensor the forward would silently leave out.
fn refuse_undescribed(
    w: &dyn WeightSource,
    mut names: impl Iterator<Item = String>,
    c: &ModelConfig,
) -> anyhow::Result<()> {
    match names.find(|n| w.contains(n)) {
        Some(name) => bail!(
            "tensor `{name}` is not part of the {:?} layer description: the forward would ignore it",
            c.family
        ),
        None => Ok(()),
    }
}

impl<B: Backend> Model<B> {
    /// Loads the weights onto `backend` and allocates the KV cache: as many blocks of
    /// `opts.block_size` tokens as fit in `opts.kv_cache_bytes` (at least one).
    pub fn load(
        backend: B,
        config: &ModelConfig,
        weights: &mut dyn WeightSource,
        opts: &RunnerOptions,
    ) -> anyhow::Result<Self> {
        let c = config;
        ensure!(
            c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads.is_multiple_of(c.num_kv_heads),
            "num_attention_heads {} is not a multiple of num_key_value_heads {}",
            c.num_heads,
            c.num_kv_heads
        );
        ensure!(
            c.head_dim > 0 && c.head_dim.is_multiple_of(2),
            "head_dim {} must be even",
            c.head_dim
        );
        ensure!(
            c.hidden_size > 0 && c.vocab_size > 0 && c.num_layers() > 0,
            "empty model dimensions in the config"
        );
        refuse_what_it_lacks(&backend, c)?;
        // Sliding layers keep their windows where the backend reads a table per group.
        let groups = LayerGroups::kept(
            c,
            backend.keeps_windows(),
            layer_block_bytes(c, opts.block_size, backend.kv_value_bytes()),
        );
        let placement = groups.placement(c.num_layers());
        let num_blocks = opts.num_blocks(
            groups.group_size * kv_bytes_per_layer_token(c, backend.kv_value_bytes()),
        )?;
        let embed_name = "model.embed_tokens.weight";
        let embed = backend.upload_weight(
            embed_name,
            read(weights, embed_name, &[c.vocab_size, c.hidden_size])?,
        )?;
        // The head is the embedding table when the config ties them (as transformers ties
        // them, whatever else the file holds), else its own tensor, which must be there.
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            let t = read(weights, "lm_head.weight", &[c.vocab_size, c.hidden_size])
                .context("the config does not tie the output head to the embeddings")?;
            Some(backend.upload_weight("lm_head.weight", t)?)
        };
        let final_norm = backend.upload_param(
            "model.norm.weight",
            read_norm(weights, "model.norm.weight", c.hidden_size, c.norm_weights)?,
        )?;
        // One RoPE table per distinct spec (most models have one; some one per layer kind).
        let mut ropes: Vec<&RopeSpec> = Vec::new();
        let mut layers = Vec::with_capacity(c.num_layers());
        let mut caches = Vec::with_capacity(groups.group_size);
        for (i, spec) in c.layers.iter().enumerate() {
            let rope = match ropes.iter().position(|r| **r == spec.rope) {
                Some(k) => k,
                None => {
                    ropes.push(&spec.rope);
                    ropes.len() - 1
                }
            };
            layers.push(Layer::load(&backend, c, weights, i, rope)?);
        }
        let cache_shape = KvCacheShape {
            num_blocks,
            block_size: opts.block_size,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        for _ in 0..groups.group_size {
            caches.push(backend.new_kv_cache(cache_shape)?);
        }
        // A recurrent layer's state lives in its index's KV blocks, each block's K region
        // then its V region read as f32: a region must hold whole rows of a value head.
        let page_values = state_page_values(&cache_shape, backend.kv_value_bytes());
        for spec in c.layers.iter().filter_map(|l| match l.mixer {
            Mixer::GatedDeltaNet(spec) => Some(spec),
            Mixer::Attention { .. } => None,
        }) {
            ensure!(
                (page_values / 2).is_multiple_of(spec.value_head_dim),
                "a KV block of {} tokens holds {} f32 values in its K (and its V) per layer, \
                 not whole rows of {} values of a DeltaNet state: choose another --block-size",
                opts.block_size,
                page_values / 2,
                spec.value_head_dim
            );
        }
        let bufs = Buffers {
            x: backend.new_act(),
            h: backend.new_act(),
            qkv: backend.new_act(),
            attn: backend.new_act(),
            o: backend.new_act(),
            post: backend.new_act(),
            gate_up: backend.new_act(),
            act: backend.new_act(),
            down: backend.new_act(),
            gate: backend.new_act(),
            shared: backend.new_act(),
            last: backend.new_act(),
            logits: backend.new_act(),
        };
        let rope_positions = rope_positions(c, opts.max_model_len)?;
        let table = |name: String, v: Vec<f32>| {
            backend.upload_param(
                &name,
                HostTensor {
                    shape: vec![v.len()],
                    data: TensorData::F32(v),
                },
            )
        };
        let mut rope_tables_on_device = Vec::with_capacity(ropes.len());
        for (k, rope) in ropes.iter().enumerate() {
            let (cos, sin) = rope.tables(rope_positions);
            rope_tables_on_device.push((
                table(format!("rope.{k}.cos"), cos)?,
                table(format!("rope.{k}.sin"), sin)?,
            ));
        }
        let state = ModelState {
            config: c.clone(),
            layout: QkvLayout {
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
            },
            embed,
            lm_head,
            final_norm,
            layers,
            groups,
            placement,
            caches,
            num_blocks,
            block_size: opts.block_size,
            rope_positions,
            ropes: rope_tables_on_device,
            bufs,
            host: HostScratch::default(),
            profile: StepProfile::default(),
        };
        Ok(Model { backend, state })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 256-wide quantised tensor of `rows` rows whose blocks' bytes are all `fill`.
    fn quant(kind: QuantType, rows: usize, fill: u8) -> HostTensor {
        HostTensor {
            shape: vec![rows, 256],
            data: TensorData::Quant(kind, vec![fill; rows * kind.block_bytes()]),
        }
    }

    /// Parts of one type fuse into one quantised tensor; parts of different types stay
    /// apart, each run of one type merged, in order.
    #[test]
    fn fused_quantised_parts_keep_their_types() {
        let same = concat_rows(
            "gate_up",
            vec![quant(QuantType::Q4_K, 2, 1), quant(QuantType::Q4_K, 3, 2)],
        );
        assert_eq!(same.shape, [5, 256]);
        let mut bytes = vec![1u8; 2 * 144];
        bytes.extend(vec![2u8; 3 * 144]);
        assert_eq!(same.data, TensorData::Quant(QuantType::Q4_K, bytes.clone()));
        let parts = vec![
            quant(QuantType::Q4_K, 2, 1),
            quant(QuantType::Q4_K, 3, 2),
            quant(QuantType::Q6_K, 1, 3),
        ];
        let mixed = concat_rows("qkv", parts);
        assert_eq!(mixed.shape, [6, 256]);
        assert_eq!(
            mixed.data,
            TensorData::QuantParts(vec![
                (QuantType::Q4_K, bytes),
                (QuantType::Q6_K, vec![3u8; 210])
            ])
        );
        assert_eq!(mixed.data.len(), 6 * 256);
    }
}
