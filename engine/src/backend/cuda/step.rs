//! A step on the device: its metadata packed and uploaded once (`prepare_step`), the
//! buffers every step reuses, and the decode graphs captured and replayed per shape.

use std::collections::HashMap;

use anyhow::{anyhow, bail, ensure, Context};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};

use crate::backend::{StepMeta, StepOps};
use crate::layer_groups::NO_BLOCK;
use crate::sampler::SampleSpec;

use super::sample_words::{push_penalties, SAMPLE_MAX_TOP, SAMPLE_OUT_WORDS};
use super::{bucket_for, ensure_len, int, kernels, table_bucket, CudaAct, CudaBackend, State};

/// Offsets (in i32 words) of the step's parts inside the metadata buffer.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MetaOffsets {
    pub(super) tokens: usize,
    pub(super) positions: usize,
    pub(super) slots: usize,
    pub(super) row_start: usize,
    pub(super) n_tokens: usize,
    pub(super) start_pos: usize,
    pub(super) dec: usize,
    pub(super) tile_seq: usize,
    pub(super) tile_q0: usize,
    pub(super) logit_rows: usize,
    pub(super) temperature: usize,
    pub(super) top_k: usize,
    pub(super) top_p: usize,
    pub(super) min_p: usize,
    pub(super) n_top: usize,
    pub(super) repetition: usize,
    pub(super) presence: usize,
    pub(super) frequency: usize,
    /// u64 columns, at even offsets.
    pub(super) seeds: usize,
    pub(super) draws: usize,
    pub(super) penalties: usize,
    pub(super) tables: usize,
    /// The checkpoints of recurrent state: three columns of `num_saves` (sequence, group,
    /// rows before it), then their tables, `save_stride` apart.
    pub(super) saves: usize,
}

/// A step's metadata in the backend's one device buffer (written by one host-to-device
/// copy per step): the offsets of its parts and the sizes the launches need.
pub struct CudaStep {
    pub(super) meta: u64,
    pub(super) off: MetaOffsets,
    pub(super) rows: usize,
    pub(super) n_dec: usize,
    pub(super) n_tiles: usize,
    pub(super) n_logits: usize,
    pub(super) n_penalties: usize,
    pub(super) table_stride: usize,
    /// Layer groups: the slots and the block tables hold one part per group.
    pub(super) num_groups: usize,
    /// Sequences, padding included, and rows, padding included, of one group's part.
    pub(super) padded_seqs: usize,
    pub(super) padded_rows: usize,
    pub(super) max_ctx: usize,
    pub(super) block_size: usize,
    /// The graph shape this decode step runs as, if any.
    pub(super) graph_key: Option<GraphKey>,
    pub(super) num_saves: usize,
    pub(super) save_stride: usize,
}

impl CudaStep {
    pub(super) fn at(&self, off: usize) -> u64 {
        self.meta + 4 * off as u64
    }

    /// The rows' KV slots in layer group `group`.
    pub(super) fn slots(&self, group: usize) -> anyhow::Result<u64> {
        ensure!(
            group < self.num_groups,
            "the step has no layer group {group}"
        );
        Ok(self.at(self.off.slots + group * self.padded_rows))
    }

    /// The sequences' block tables in layer group `group`, `table_stride` apart.
    pub(super) fn tables(&self, group: usize) -> anyhow::Result<u64> {
        ensure!(
            group < self.num_groups,
            "the step has no layer group {group}"
        );
        Ok(self.at(self.off.tables + group * self.padded_seqs * self.table_stride))
    }
}

/// Device buffers allocated at start-up and reused by every step (grown, never shrunk,
/// if a step ever needs more), with their host staging copies.
#[derive(Default)]
pub(super) struct StepBuffers {
    pub(super) meta: Option<CudaSlice<i32>>,
    pub(super) meta_host: Vec<i32>,
    pub(super) logits: Option<CudaSlice<f32>>,
    pub(super) sampled: Option<CudaSlice<i32>>,
    pub(super) sampled_host: Vec<i32>,
}

/// A captured graph, only ever touched under the backend's state lock.
pub(super) struct LockedGraph(CudaGraph);

// SAFETY: CUDA graph objects may be used from any thread as long as calls on one graph are
// serialised; every use goes through `State`, behind the backend's mutex.
unsafe impl Send for LockedGraph {}

/// The shape of a graph-captured decode step: (batch bucket, table-stride bucket).
pub(super) type GraphKey = (usize, usize);

/// Captured decode graphs. A graph bakes in the addresses of every buffer it touches, so
/// each reallocation of one (activations, partials, step metadata) bumps `epoch`, and the
/// graphs of an older epoch are dropped. A shape is captured the second time it is seen
/// in one epoch: the first, eager, run sizes every buffer, so nothing is allocated while
/// capturing.
#[derive(Default)]
pub(super) struct GraphState {
    /// Batch buckets; empty when graphs are off (`enforce_eager`).
    pub(super) buckets: Vec<usize>,
    pub(super) epoch: u64,
    pub(super) graphs_epoch: u64,
    /// The graph of each shape, with the width of the logits it writes.
    pub(super) graphs: HashMap<GraphKey, (LockedGraph, usize)>,
    pub(super) warmed: HashMap<GraphKey, u64>,
    /// Shapes whose capture failed: they run eagerly from then on.
    pub(super) eager_only: std::collections::HashSet<GraphKey>,
    /// The shape being captured and the epoch the capture began in.
    pub(super) capturing: Option<(GraphKey, u64)>,
}

/// Appends a column of `f32` values as their bit patterns.
pub(super) fn push_f32s(m: &mut Vec<i32>, values: impl Iterator<Item = f32>) -> usize {
    let at = m.len();
    m.extend(values.map(|v| v.to_bits() as i32));
    at
}

/// Appends a column of `u64` values (two words each, at an even offset).
pub(super) fn push_u64s(m: &mut Vec<i32>, values: impl Iterator<Item = u64>) -> usize {
    if m.len() % 2 == 1 {
        m.push(0);
    }
    let at = m.len();
    for v in values {
        m.push(v as u32 as i32);
        m.push((v >> 32) as u32 as i32);
    }
    at
}

impl CudaBackend {
    /// Sizes the step buffers for the scheduler's limits once, at start-up, so that steps
    /// within them allocate nothing.
    pub(super) fn reserve_step_buffers(
        &self,
        max_tokens: usize,
        max_seqs: usize,
        num_groups: usize,
        max_blocks_per_seq: usize,
        vocab: usize,
    ) -> anyhow::Result<()> {
        let tiles = max_tokens.div_ceil(kernels::PREFILL_TILE) + max_seqs;
        let words = (2 + num_groups) * max_tokens
            + 5 * max_seqs
            + 2 * tiles
            + 18 * max_seqs
            + 2
            + num_groups * max_seqs * max_blocks_per_seq;
        let mut st = self.state()?;
        let b = &mut st.step;
        ensure_len(&self.stream, &mut b.meta, words, "the step metadata buffer")?;
        b.meta_host.reserve(words);
        ensure_len(
            &self.stream,
            &mut b.logits,
            max_seqs * vocab,
            "the f32 logits buffer",
        )?;
        ensure_len(
            &self.stream,
            &mut b.sampled,
            max_seqs * SAMPLE_OUT_WORDS,
            "the sampling output buffer",
        )?;
        b.sampled_host.reserve(max_seqs * SAMPLE_OUT_WORDS);
        Ok(())
    }
}

impl StepOps for CudaBackend {
    fn runs_ops_as_issued(&self) -> bool {
        false
    }

    fn prepare_step(&self, meta: &StepMeta<'_>) -> anyhow::Result<CudaStep> {
        let rows = meta.tokens.len();
        let n_seqs = meta.seqs.len();
        let groups = meta.num_groups;
        ensure!(
            meta.slots.len() == groups * rows
                && meta.seqs.iter().all(|s| s.block_tables.len() == groups),
            "step metadata: {} slots and the block tables do not make {groups} groups of {rows} rows",
            meta.slots.len()
        );
        let n_logits = meta.logit_rows.len();
        ensure!(
            meta.tokens.len() == rows && meta.positions.len() == rows,
            "step metadata: {} tokens and {} positions for {rows} rows",
            meta.tokens.len(),
            meta.positions.len()
        );
        ensure!(
            meta.samples.len() == n_logits,
            "{} sampling specs for {n_logits} sampled rows",
            meta.samples.len()
        );
        let longest_table = meta
            .seqs
            .iter()
            .flat_map(|s| s.block_tables.iter().map(Vec::len))
            .max()
            .unwrap_or(0);
        let mut st = self.state()?;
        // A decode-only step whose every sequence samples runs as a graph shape: padded to
        // the bucket's rows and table stride (see graph.rs).
        // A step that writes checkpoints runs eagerly: their number is baked into a graph.
        let all_decode = n_seqs > 0
            && rows == n_seqs
            && n_logits == n_seqs
            && meta.seqs.iter().all(|s| s.state_saves.is_empty());
        let graph_key = match bucket_for(&st.graphs.buckets, n_seqs) {
            Some(b) if all_decode => Some((b, table_bucket(longest_table))),
            _ => None,
        };
        let (padded, table_stride) = graph_key.unwrap_or((rows, longest_table.max(1)));
        let pad = padded - rows;
        let m = &mut st.step.meta_host;
        m.clear();
        let mut off = MetaOffsets::default();
        m.extend(meta.tokens.iter().map(|&t| t as i32));
        m.extend(std::iter::repeat_n(0, pad));
        off.positions = m.len();
        m.extend(meta.positions.iter().map(|&p| p as i32));
        m.extend(std::iter::repeat_n(0, pad));
        off.slots = m.len();
        for group in meta.slots.chunks(rows.max(1)) {
            for &s in group {
                // A recurrent group's rows have no slot (usize::MAX): -1, as padding's.
                m.push(if s == usize::MAX {
                    -1
                } else {
                    int(s, "KV slot")?
                });
            }
            m.extend(std::iter::repeat_n(-1, pad));
        }
        off.row_start = m.len();
        for s in meta.seqs {
            m.push(int(s.row_start, "row")?);
        }
        m.extend((rows..padded).map(|r| r as i32));
        off.n_tokens = m.len();
        for s in meta.seqs {
            m.push(int(s.n_tokens, "tokens")?);
        }
        m.extend(std::iter::repeat_n(1, pad));
        off.start_pos = m.len();
        for s in meta.seqs {
            m.push(int(s.start_pos, "position")?);
        }
        m.extend(std::iter::repeat_n(0, pad));
        off.dec = m.len();
        let dec = (0..n_seqs).filter(|&i| meta.seqs[i].n_tokens == 1);
        m.extend(dec.map(|i| i as i32));
        m.extend((n_seqs..n_seqs + pad).map(|i| i as i32));
        let n_dec = m.len() - off.dec;
        let tiles = || {
            meta.seqs
                .iter()
                .enumerate()
                .filter(|(_, s)| s.n_tokens > 1)
                .flat_map(|(i, s)| {
                    (0..s.n_tokens)
                        .step_by(kernels::PREFILL_TILE)
                        .map(move |q0| (i as i32, q0 as i32))
                })
        };
        off.tile_seq = m.len();
        m.extend(tiles().map(|(i, _)| i));
        let n_tiles = m.len() - off.tile_seq;
        off.tile_q0 = m.len();
        m.extend(tiles().map(|(_, q0)| q0));
        off.logit_rows = m.len();
        for &r in meta.logit_rows {
            m.push(int(r, "logits row")?);
        }
        m.extend((rows..padded).map(|r| r as i32));
        // Padding rows sample greedily with no logprobs; their results are never read.
        let samples = || {
            let padding = std::iter::repeat_n(SampleSpec::GREEDY, pad);
            meta.samples.iter().copied().chain(padding)
        };
        off.temperature = push_f32s(m, samples().map(|s| s.temperature));
        off.top_k = m.len();
        for s in samples() {
            m.push(int(s.top_k, "top_k")?);
        }
        off.top_p = push_f32s(m, samples().map(|s| s.top_p));
        off.min_p = push_f32s(m, samples().map(|s| s.min_p));
        off.n_top = m.len();
        for s in samples() {
            let n = s.logprobs.map_or(Ok(-1), |n| int(n, "logprobs"))?;
            ensure!(
                n <= SAMPLE_MAX_TOP as i32,
                "logprobs {n} > {SAMPLE_MAX_TOP}"
            );
            m.push(n);
        }
        off.repetition = push_f32s(m, samples().map(|s| s.repetition_penalty));
        off.presence = push_f32s(m, samples().map(|s| s.presence_penalty));
        off.frequency = push_f32s(m, samples().map(|s| s.frequency_penalty));
        off.seeds = push_u64s(m, samples().map(|s| s.seed));
        off.draws = push_u64s(m, samples().map(|s| s.draw));
        off.tables = m.len();
        for g in 0..groups {
            for s in meta.seqs {
                let table = &s.block_tables[g];
                // A window's passed entries hold no block: block 0 stands in, as vLLM's
                // null block does (a kernel's tile may load it; its keys are masked).
                for &b in table {
                    let b = if b == NO_BLOCK { 0 } else { b as usize };
                    m.push(int(b, "block id")?);
                }
                m.extend(std::iter::repeat_n(0, table_stride - table.len()));
            }
            m.extend(std::iter::repeat_n(0, pad * table_stride));
        }
        // Last, as their number changes from step to step (a graph's offsets must not).
        let (penalties, n_penalties) = push_penalties(m, meta.samples)?;
        off.penalties = penalties;
        let saves: Vec<(usize, &crate::layer_groups::StateCopy)> = meta
            .seqs
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.state_saves.iter().map(move |c| (i, c)))
            .collect();
        let save_stride = saves.iter().map(|(_, c)| c.blocks.len()).max().unwrap_or(1);
        off.saves = m.len();
        for &(i, _) in &saves {
            m.push(int(i, "sequence")?);
        }
        for (_, c) in &saves {
            m.push(int(c.group, "layer group")?);
        }
        for (i, c) in &saves {
            m.push(int(c.position - meta.seqs[*i].start_pos, "checkpoint row")?);
        }
        for (_, c) in &saves {
            for &b in &c.blocks {
                m.push(int(b as usize, "block id")?);
            }
            m.extend(std::iter::repeat_n(0, save_stride - c.blocks.len()));
        }
        let max_ctx = match graph_key {
            Some((_, t)) => t * meta.block_size,
            None => meta
                .seqs
                .iter()
                .map(|s| s.start_pos + s.n_tokens)
                .max()
                .unwrap_or(0),
        };
        let words = m.len();
        let State {
            step:
                StepBuffers {
                    meta: dev,
                    meta_host,
                    ..
                },
            graphs,
            ..
        } = &mut *st;
        // Grown to twice the need: penalty entries vary from step to step, and each
        // reallocation drops the captured graphs.
        let need = if dev.as_ref().is_none_or(|b| b.len() < words) {
            2 * words
        } else {
            words
        };
        if ensure_len(&self.stream, dev, need, "the step metadata buffer")? {
            graphs.epoch += 1;
        }
        let dev = dev
            .as_mut()
            .ok_or_else(|| anyhow!("step metadata buffer missing"))?;
        self.stream
            .memcpy_htod(meta_host.as_slice(), &mut dev.slice_mut(..words))
            .context("uploading step metadata")?;
        Ok(CudaStep {
            meta: self.ptr(dev),
            off,
            rows: padded,
            n_dec,
            n_tiles,
            n_logits: padded - (rows - n_logits),
            n_penalties,
            table_stride,
            num_groups: groups,
            padded_seqs: n_seqs + pad,
            padded_rows: padded,
            max_ctx,
            block_size: meta.block_size,
            graph_key,
            num_saves: saves.len(),
            save_stride,
        })
    }

    fn replay_layers(&self, step: &CudaStep, logits: &mut CudaAct) -> anyhow::Result<bool> {
        let Some(key) = step.graph_key else {
            return Ok(false);
        };
        let mut st = self.state()?;
        let g = &mut st.graphs;
        if g.graphs_epoch != g.epoch {
            g.graphs.clear();
            g.graphs_epoch = g.epoch;
        }
        match g.graphs.get(&key) {
            Some((graph, vocab)) => {
                graph.0.launch().context("launching a decode graph")?;
                logits.rows = step.n_logits;
                logits.cols = *vocab;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn begin_layers(&self, step: &CudaStep) -> anyhow::Result<()> {
        let Some(key) = step.graph_key else {
            return Ok(());
        };
        let mut st = self.state()?;
        let g = &mut st.graphs;
        let epoch = g.epoch;
        if g.eager_only.contains(&key) || g.warmed.insert(key, epoch) != Some(epoch) {
            return Ok(()); // first run of this shape in this epoch: eager, sizes the buffers
        }
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .context("starting a decode graph capture")?;
        g.capturing = Some((key, epoch));
        Ok(())
    }

    fn end_layers(&self, _step: &CudaStep, logits: &CudaAct, issued: bool) -> anyhow::Result<bool> {
        let mut st = self.state()?;
        let g = &mut st.graphs;
        let Some((key, epoch)) = g.capturing.take() else {
            return Ok(true);
        };
        let graph = match self.stream.end_capture(CUgraphInstantiate_flags(0)) {
            Ok(graph) if issued => graph,
            Ok(_) => return Ok(false), // an op failed: the partial capture is dropped
            Err(e) => {
                g.eager_only.insert(key);
                tracing::warn!("decode graph {key:?} could not be captured, runs eagerly: {e:?}");
                return Ok(false);
            }
        };
        let Some(graph) = graph.filter(|_| g.epoch == epoch) else {
            // A buffer was reallocated while capturing: nothing ran, and the capture is stale.
            tracing::debug!("decode graph {key:?} discarded (a buffer moved while capturing)");
            return Ok(false);
        };
        graph.launch().context("launching a decode graph")?;
        tracing::debug!(
            "decode graph captured for batch {} and table stride {}",
            key.0,
            key.1
        );
        g.graphs.insert(key, (LockedGraph(graph), logits.cols));
        Ok(true)
    }

    fn record_mark(&self, slot: usize) -> anyhow::Result<()> {
        let event = self
            .marks
            .get(slot)
            .ok_or_else(|| anyhow!("no timing mark {slot}"))?;
        event
            .record(&self.stream)
            .context("recording a timing event")
    }

    fn elapsed_between_marks(&self, from: usize, to: usize) -> anyhow::Result<Option<f64>> {
        let (Some(a), Some(b)) = (self.marks.get(from), self.marks.get(to)) else {
            bail!("no timing marks {from}..{to}");
        };
        let ms = a.elapsed_ms(b).context("reading timing events")?;
        Ok(Some(f64::from(ms) / 1e3))
    }
}
