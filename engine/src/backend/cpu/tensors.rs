//! The CPU backend's activations and its host copy of a step's metadata.

use anyhow::{anyhow, ensure};

use crate::backend::{AttnSeq, StepMeta};

/// A row-major f32 activation matrix.
#[derive(Debug, Clone, Default)]
pub struct CpuAct {
    pub(super) data: Vec<f32>,
    pub(super) rows: usize,
    pub(super) cols: usize,
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
    pub(super) fn reshape(&mut self, rows: usize, cols: usize) -> &mut [f32] {
        self.rows = rows;
        self.cols = cols;
        self.data.resize(rows * cols, 0.0);
        &mut self.data
    }
}

/// One sequence of a [`CpuStep`], with its block tables (one per layer group) stored in
/// `CpuStep::tables`.
#[derive(Debug, Clone)]
struct HostSeq {
    row_start: usize,
    n_tokens: usize,
    start_pos: usize,
    tables: Vec<(usize, usize)>,
    /// Checkpoints of recurrent state: (group, position, its blocks' range in `tables`).
    saves: Vec<(usize, usize, (usize, usize))>,
}

/// A host copy of [`StepMeta`].
#[derive(Debug, Clone)]
pub struct CpuStep {
    seqs: Vec<HostSeq>,
    tables: Vec<u32>,
    pub(super) tokens: Vec<u32>,
    pub(super) positions: Vec<u32>,
    /// Group-major, as [`StepMeta::slots`].
    slots: Vec<usize>,
    pub(super) logit_rows: Vec<usize>,
}

impl CpuStep {
    /// The host copy of `meta`.
    pub(super) fn new(meta: &StepMeta<'_>) -> anyhow::Result<Self> {
        let rows = meta.tokens.len();
        ensure!(
            meta.slots.len() == meta.num_groups * rows,
            "{} KV slots for {} groups of {rows} rows",
            meta.slots.len(),
            meta.num_groups
        );
        let mut tables = Vec::new();
        let mut seqs = Vec::with_capacity(meta.seqs.len());
        for (i, s) in meta.seqs.iter().enumerate() {
            ensure!(
                s.block_tables.len() == meta.num_groups,
                "sequence {i} has {} block tables for {} groups",
                s.block_tables.len(),
                meta.num_groups
            );
            let ranges = s
                .block_tables
                .iter()
                .map(|t| {
                    let start = tables.len();
                    tables.extend_from_slice(t);
                    (start, tables.len())
                })
                .collect();
            let end = s.start_pos + s.n_tokens;
            let mut saves = Vec::with_capacity(s.state_saves.len());
            for save in s.state_saves {
                ensure!(
                    save.group < meta.num_groups
                        && (s.start_pos + 1..=end).contains(&save.position),
                    "sequence {i}: a checkpoint at position {} of group {} is outside its \
                     step ({}..{end}, {} groups)",
                    save.position,
                    save.group,
                    s.start_pos,
                    meta.num_groups
                );
                let start = tables.len();
                tables.extend_from_slice(&save.blocks);
                saves.push((save.group, save.position, (start, tables.len())));
            }
            seqs.push(HostSeq {
                row_start: s.row_start,
                n_tokens: s.n_tokens,
                start_pos: s.start_pos,
                tables: ranges,
                saves,
            });
        }
        ensure!(
            meta.samples.len() == meta.logit_rows.len(),
            "{} sampling specs for {} sampled rows",
            meta.samples.len(),
            meta.logit_rows.len()
        );
        Ok(Self {
            seqs,
            tables,
            tokens: meta.tokens.to_vec(),
            positions: meta.positions.to_vec(),
            slots: meta.slots.to_vec(),
            logit_rows: meta.logit_rows.to_vec(),
        })
    }

    /// The checkpoints sequence `index` of the step writes in layer group `group`: each
    /// position with its blocks.
    pub(super) fn state_saves(&self, index: usize, group: usize) -> Vec<(usize, &[u32])> {
        self.seqs[index]
            .saves
            .iter()
            .filter(|&&(g, _, _)| g == group)
            .map(|&(_, position, (start, end))| (position, &self.tables[start..end]))
            .collect()
    }

    /// The sequences as the attention of layer group `group` reads them.
    pub(super) fn attn_seqs(&self, group: usize) -> anyhow::Result<Vec<AttnSeq<'_>>> {
        self.seqs
            .iter()
            .map(|s| {
                let &(start, end) = s
                    .tables
                    .get(group)
                    .ok_or_else(|| anyhow!("the step has no layer group {group}"))?;
                Ok(AttnSeq {
                    row_start: s.row_start,
                    n_tokens: s.n_tokens,
                    start_pos: s.start_pos,
                    block_table: &self.tables[start..end],
                })
            })
            .collect()
    }

    /// Every row's KV slot in layer group `group`.
    pub(super) fn slots(&self, group: usize) -> anyhow::Result<&[usize]> {
        let rows = self.tokens.len();
        self.slots
            .get(group * rows..(group + 1) * rows)
            .ok_or_else(|| anyhow!("the step has no layer group {group}"))
    }
}
