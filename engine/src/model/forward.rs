//! The forward pass: a batch's inputs checked and uploaded, the layers issued, and the
//! rows sampled or their logits returned.

use anyhow::{anyhow, bail, ensure};

use std::time::Instant;

use crate::backend::{
    check_block_table, check_state_pages_distinct, check_state_table, Backend, RowSample,
    ScoreSpec, StepMeta, StepSeq,
};
use crate::kv_sizing::KvFootprint;
use crate::layer_groups::{GroupKind, LayerGroups};
use crate::sampler::SampleSpec;

use super::{
    Buffers, FfnWeights, Footprint, MixerWeights, Model, ModelRunner, ModelState, SeqInput,
    StepProfile,
};

impl<B: Backend> ModelState<B> {
    /// Checks the batch and fills the host scratch (tokens, positions, each group's slots,
    /// logits rows).
    fn prepare_inputs<'a>(&mut self, batch: &[SeqInput<'a>]) -> anyhow::Result<Vec<StepSeq<'a>>> {
        for (i, s) in batch.iter().enumerate() {
            self.check_state_copies(s)
                .map_err(|e| anyhow!("batch entry {i}: {e}"))?;
        }
        let bs = self.block_size;
        let kinds = self.groups.kinds();
        let host = &mut self.host;
        host.tokens.clear();
        host.positions.clear();
        host.slots.clear();
        host.logit_rows.clear();
        let mut seqs = Vec::with_capacity(batch.len());
        for (i, s) in batch.iter().enumerate() {
            ensure!(!s.tokens.is_empty(), "batch entry {i} has no tokens");
            if let Some(&t) = s
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.config.vocab_size)
            {
                bail!(
                    "batch entry {i}: token id {t} is outside the vocabulary ({})",
                    self.config.vocab_size
                );
            }
            let end = s.start_pos + s.tokens.len();
            ensure!(
                end <= self.rope_positions,
                "batch entry {i}: positions up to {end} exceed the model's {}",
                self.rope_positions
            );
            ensure!(
                s.block_tables.len() == kinds.len(),
                "batch entry {i}: {} block tables for {} layer groups",
                s.block_tables.len(),
                kinds.len()
            );
            for (g, (&kind, table)) in kinds.iter().zip(s.block_tables).enumerate() {
                let checked = match kind {
                    GroupKind::Recurrent { blocks } => {
                        check_state_table(table, blocks, self.num_blocks)
                    }
                    _ => {
                        let first_key = kind.first_kept_block(s.start_pos, bs) * bs;
                        check_block_table(table, first_key, end, bs, self.num_blocks)
                    }
                };
                checked.map_err(|e| anyhow!("batch entry {i}, layer group {g}: {e}"))?;
            }

            let row_start = host.tokens.len();
            host.tokens.extend_from_slice(s.tokens);
            host.positions.extend((s.start_pos..end).map(|p| p as u32));
            if s.sample.is_some() {
                host.logit_rows.push(host.tokens.len() - 1);
            }
            seqs.push(StepSeq {
                row_start,
                n_tokens: s.tokens.len(),
                start_pos: s.start_pos,
                block_tables: s.block_tables,
                state_saves: s.state_saves,
            });
        }
        for (g, kind) in kinds.iter().enumerate() {
            for (s, input) in seqs.iter().zip(batch) {
                let table = &input.block_tables[g];
                let end = s.start_pos + s.n_tokens;
                match kind {
                    // A state has no slot per token: its pages are the whole table.
                    GroupKind::Recurrent { .. } => {
                        host.slots.extend((s.start_pos..end).map(|_| usize::MAX))
                    }
                    _ => host.slots.extend(
                        (s.start_pos..end).map(|pos| table[pos / bs] as usize * bs + pos % bs),
                    ),
                }
            }
        }
        Ok(seqs)
    }

    /// Checks an entry's checkpoints of recurrent state: the one to restore at its start,
    /// those to save within its tokens, each of a recurrent group, in whole state tables,
    /// none sharing a page with another or with the sequence's own state.
    fn check_state_copies(&self, s: &SeqInput<'_>) -> anyhow::Result<()> {
        let kinds = self.groups.kinds();
        let end = s.start_pos + s.tokens.len();
        let copies = s.state_restores.iter().map(|c| (c, true));
        for (copy, restore) in copies.chain(s.state_saves.iter().map(|c| (c, false))) {
            let Some(&GroupKind::Recurrent { blocks }) = kinds.get(copy.group) else {
                bail!(
                    "layer group {} keeps no recurrent state to copy",
                    copy.group
                );
            };
            let (what, fits) = if restore {
                ("restored", copy.position == s.start_pos)
            } else {
                ("saved", copy.position > s.start_pos && copy.position <= end)
            };
            ensure!(
                fits,
                "a state {what} at position {} does not fit a step of positions {}..{end}",
                copy.position,
                s.start_pos
            );
            check_state_table(&copy.blocks, blocks, self.num_blocks)
                .map_err(|e| anyhow!("a state {what} at position {}: {e}", copy.position))?;
        }
        for (g, table) in s.block_tables.iter().enumerate() {
            if !matches!(kinds.get(g), Some(GroupKind::Recurrent { .. })) {
                continue;
            }
            let copies = s.state_restores.iter().chain(s.state_saves);
            let pages = copies.filter(|c| c.group == g).map(|c| c.blocks.as_slice());
            check_state_pages_distinct(std::iter::once(table.as_slice()).chain(pages))
                .map_err(|e| anyhow!("layer group {g}: {e}"))?;
        }
        Ok(())
    }

    /// Copies each entry's restored checkpoints into its own state, in every layer of
    /// their group, before the step's layers read it.
    fn restore_states(&mut self, b: &B, batch: &[SeqInput<'_>]) -> anyhow::Result<()> {
        for s in batch {
            for copy in s.state_restores {
                let own = &s.block_tables[copy.group];
                for &(group, index) in &self.placement {
                    if group == copy.group {
                        b.copy_state(&mut self.caches[index], &copy.blocks, own)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs the layers and leaves the sampled rows' logits in `bufs.logits`; returns the
    /// device step, or `None` when no entry samples.
    fn run_layers(
        &mut self,
        b: &B,
        batch: &[SeqInput<'_>],
        samples: &[SampleSpec<'_>],
    ) -> anyhow::Result<Option<B::Step>> {
        let started = Instant::now();
        let seqs = self.prepare_inputs(batch)?;
        self.restore_states(b, batch)?;
        let step = b.prepare_step(&StepMeta {
            seqs: &seqs,
            num_groups: self.groups.groups.len(),
            tokens: &self.host.tokens,
            positions: &self.host.positions,
            slots: &self.host.slots,
            logit_rows: &self.host.logit_rows,
            samples,
            block_size: self.block_size,
        })?;
        self.profile.prepare_secs = started.elapsed().as_secs_f64();
        b.record_mark(0)?;
        let samples_rows = !self.host.logit_rows.is_empty();
        if !b.replay_layers(&step, &mut self.bufs.logits)? {
            b.begin_layers(&step)?;
            let issued = self.issue_layers(b, &step);
            let ran = b.end_layers(&step, &self.bufs.logits, issued.is_ok())?;
            issued?;
            if !ran {
                self.issue_layers(b, &step)?;
            }
        }
        b.record_mark(1)?;
        Ok(samples_rows.then_some(step))
    }

    /// Issues the layers' ops: embedding, decoder layers, and (when rows are sampled) the
    /// final norm, the sampled rows and the LM head into `bufs.logits`.
    fn issue_layers(&mut self, b: &B, step: &B::Step) -> anyhow::Result<()> {
        let eps = self.config.rms_norm_eps;
        let layout = self.layout;
        let Buffers {
            x,
            h,
            qkv,
            attn,
            o,
            post,
            gate_up,
            act,
            down,
            gate,
            shared,
            last,
            logits,
        } = &mut self.bufs;
        b.embed(&self.embed, step, x)?;
        if self.config.embedding_scale != 1.0 {
            b.scale(x, self.config.embedding_scale)?;
        }
        // Where the last FFN's output waits for its residual add: `down`, or `post` after
        // its post-norm.
        let mut ffn_in_post = false;
        for (i, (layer, &(group, index))) in self.layers.iter().zip(&self.placement).enumerate() {
            if i == 0 {
                b.rms_norm(x, &layer.attn_norm, eps, h)?;
            } else {
                let ffn_out = if ffn_in_post { &*post } else { &*down };
                b.add_rms_norm(x, ffn_out, &layer.attn_norm, eps, h)?;
            }
            match &layer.mixer {
                MixerWeights::Attention(a) => {
                    b.matmul(h, &a.qkv, a.qkv_bias.as_ref(), qkv)?;
                    if let Some((q_w, k_w)) = &a.qk_norm {
                        b.qk_head_norm(qkv, layout, q_w, k_w, eps)?;
                    }
                    let (cos, sin) = &self.ropes[layer.rope];
                    b.rope(qkv, layout, layer.spec.rope.rotary_dim, cos, sin, step)?;
                    let scores = ScoreSpec {
                        scale: layer.spec.attn_scale,
                        softcap: layer.spec.attn_softcap,
                    };
                    let span = layer.spec.attention;
                    let sinks = a.sinks.as_ref();
                    let cache = &mut self.caches[index];
                    b.attention(qkv, layout, span, scores, sinks, cache, step, group, attn)?;
                    if let Some(w_gate) = &a.gate {
                        b.matmul(h, w_gate, None, gate)?;
                        b.sigmoid_gate(attn, gate)?;
                    }
                    b.matmul(attn, &a.o_proj, a.o_bias.as_ref(), o)?;
                }
                MixerWeights::DeltaNet(d) => {
                    let started = Instant::now();
                    b.matmul(h, &d.in_proj, None, qkv)?;
                    let state = &mut self.caches[index];
                    b.gated_delta_net(qkv, d.spec, &d.params, eps, state, step, group, attn)?;
                    b.matmul(attn, &d.out_proj, None, o)?;
                    if b.runs_ops_as_issued() {
                        self.profile.delta_net_secs += started.elapsed().as_secs_f64();
                    }
                }
            }
            match &layer.post_norms {
                None => b.add_rms_norm(x, o, &layer.mlp_norm, eps, h)?,
                Some((post_attn, _)) => {
                    b.rms_norm(o, post_attn, eps, post)?;
                    b.add_rms_norm(x, post, &layer.mlp_norm, eps, h)?;
                }
            }
            match &layer.ffn {
                FfnWeights::Dense {
                    gate_up: w_gate_up,
                    down: w_down,
                } => {
                    b.matmul(h, w_gate_up, None, gate_up)?;
                    b.gated_activation(gate_up, layer.spec.activation, act)?;
                    b.matmul(act, w_down, None, down)?;
                }
                FfnWeights::Experts(spec, experts) => {
                    let started = Instant::now();
                    b.experts_ffn(h, experts, *spec, layer.spec.activation, down)?;
                    if b.runs_ops_as_issued() {
                        self.profile.experts_secs += started.elapsed().as_secs_f64();
                    }
                }
            }
            if let Some(e) = &layer.shared_expert {
                b.matmul(h, &e.gate_up, None, gate_up)?;
                b.gated_activation(gate_up, layer.spec.activation, act)?;
                b.matmul(act, &e.down, None, shared)?;
                b.matmul(h, &e.gate, None, gate)?;
                b.add_gated(down, shared, gate)?;
            }
            ffn_in_post = match &layer.post_norms {
                None => false,
                Some((_, post_ffn)) => {
                    b.rms_norm(down, post_ffn, eps, post)?;
                    true
                }
            };
        }
        if self.host.logit_rows.is_empty() {
            return Ok(());
        }
        let ffn_out = if ffn_in_post { &*post } else { &*down };
        b.add_rms_norm(x, ffn_out, &self.final_norm, eps, h)?;
        b.gather_logit_rows(h, step, last)?;
        b.matmul(
            last,
            self.lm_head.as_ref().unwrap_or(&self.embed),
            None,
            logits,
        )?;
        if let Some(cap) = self.config.final_logit_softcap {
            b.softcap(logits, cap)?;
        }
        Ok(())
    }

    fn forward(&mut self, b: &B, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<RowSample>> {
        let started = Instant::now();
        self.profile = StepProfile::default();
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let samples: Vec<SampleSpec<'_>> = batch.iter().filter_map(|s| s.sample).collect();
        let (layers_done, out) = match self.run_layers(b, batch, &samples)? {
            Some(step) => {
                let layers_done = started.elapsed().as_secs_f64();
                let out = b.sample(&mut self.bufs.logits, &samples, &step)?;
                b.record_mark(2)?;
                (layers_done, out)
            }
            None => (started.elapsed().as_secs_f64(), Vec::new()),
        };
        // Device timelines where the backend keeps one, else the host's clock.
        let device = |from, to| b.elapsed_between_marks(from, to);
        let host_forward = layers_done - self.profile.prepare_secs;
        self.profile.forward_secs = device(0, 1)?.unwrap_or(host_forward);
        self.profile.sample_secs = if out.is_empty() {
            0.0
        } else {
            let host_sample = started.elapsed().as_secs_f64() - layers_done;
            device(1, 2)?.unwrap_or(host_sample)
        };
        self.profile.wall_secs = started.elapsed().as_secs_f64();
        Ok(out)
    }

    fn logits(&mut self, b: &B, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
        let samples: Vec<SampleSpec<'_>> = batch.iter().filter_map(|s| s.sample).collect();
        match self.run_layers(b, batch, &samples)? {
            Some(_) => {
                // A padded (graph) step has more logits rows than sampled entries.
                let mut rows = b.to_host(&self.bufs.logits)?;
                rows.truncate(samples.len());
                Ok(rows)
            }
            None => Ok(Vec::new()),
        }
    }
}

impl<B: Backend> ModelRunner for Model<B> {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<RowSample>> {
        let Model { backend, state } = self;
        backend.install(|| state.forward(backend, batch))
    }

    fn logits(&mut self, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
        let Model { backend, state } = self;
        backend.install(|| state.logits(backend, batch))
    }

    fn profile(&self) -> StepProfile {
        self.state.profile
    }

    fn vocab_size(&self) -> usize {
        self.state.config.vocab_size
    }

    fn num_blocks(&self) -> usize {
        self.state.num_blocks
    }

    fn block_size(&self) -> usize {
        self.state.block_size
    }

    fn kv_layer_groups(&self) -> LayerGroups {
        self.state.groups.clone()
    }

    fn footprint(&self) -> Footprint {
        let (b, s) = (&self.backend, &self.state);
        let c = &s.config;
        // 1-D parameters are stored as f32 on every backend.
        let mut vector_params = c.hidden_size;
        let mut weight_bytes = 0;
        let h = c.hidden_size;
        let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let mut matrices = 0;
        let mut attention_layers = 0;
        for l in &s.layers {
            match &l.mixer {
                MixerWeights::Attention(a) => {
                    attention_layers += 1;
                    weight_bytes += b.weight_bytes(&a.qkv) + b.weight_bytes(&a.o_proj);
                    matrices += h * (q + 2 * kv) + q * h;
                    if let Some(gate) = &a.gate {
                        weight_bytes += b.weight_bytes(gate);
                        matrices += q * h;
                    }
                    if a.qkv_bias.is_some() {
                        vector_params += q + 2 * kv;
                    }
                    if a.o_bias.is_some() {
                        vector_params += h;
                    }
                    if a.sinks.is_some() {
                        vector_params += c.num_heads;
                    }
                    if a.qk_norm.is_some() {
                        vector_params += 2 * c.head_dim;
                    }
                }
                MixerWeights::DeltaNet(d) => {
                    weight_bytes += b.weight_bytes(&d.in_proj) + b.weight_bytes(&d.out_proj);
                    let spec = d.spec;
                    matrices += h * spec.projection_width() + spec.value_width() * h;
                    vector_params += spec.conv_channels() * spec.conv_kernel
                        + 2 * spec.num_value_heads
                        + spec.value_head_dim;
                }
            }
            weight_bytes += match &l.ffn {
                FfnWeights::Dense { gate_up, down } => {
                    b.weight_bytes(gate_up) + b.weight_bytes(down)
                }
                // One sequence's step reads the router and `top_k` experts.
                FfnWeights::Experts(spec, experts) => {
                    let (router, expert) = b.expert_bytes(experts);
                    router + spec.top_k * expert
                }
            };
            matrices += l.spec.ffn.active_matrix_params(h);
            if let Some(e) = &l.shared_expert {
                weight_bytes +=
                    b.weight_bytes(&e.gate_up) + b.weight_bytes(&e.down) + b.weight_bytes(&e.gate);
                matrices += 3 * h * l.spec.shared_expert.unwrap_or(0) + h;
            }
            vector_params += 2 * h;
            // gpt-oss's router bias, and the biases of the `top_k` experts a token runs.
            if let FfnWeights::Experts(e, _) = &l.ffn {
                if e.biases {
                    vector_params += e.num_experts + e.top_k * (2 * e.intermediate_size + h);
                }
            }
        }
        weight_bytes += b.weight_bytes(s.lm_head.as_ref().unwrap_or(&s.embed))
            + vector_params * std::mem::size_of::<f32>();
        let tables = if s.lm_head.is_some() { 2 } else { 1 };
        Footprint {
            weight_bytes,
            parameters: matrices + tables * c.vocab_size * c.hidden_size + vector_params,
            kv: KvFootprint::of(c, &s.groups, s.block_size, b.kv_value_bytes()),
            attention_flops_per_context_token: 4 * attention_layers * q,
        }
    }
}
