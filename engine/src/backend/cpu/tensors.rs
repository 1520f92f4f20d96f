//! The CPU backend's activations and its host copy of a step's metadata.

use anyhow::ensure;

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
    pub(super) tokens: Vec<u32>,
    pub(super) positions: Vec<u32>,
    pub(super) slots: Vec<usize>,
    pub(super) logit_rows: Vec<usize>,
}

impl CpuStep {
    /// The host copy of `meta`.
    pub(super) fn new(meta: &StepMeta<'_>) -> anyhow::Result<Self> {
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
        Ok(Self {
            seqs,
            tables,
            tokens: meta.tokens.to_vec(),
            positions: meta.positions.to_vec(),
            slots: meta.slots.to_vec(),
            logit_rows: meta.logit_rows.to_vec(),
        })
    }

    pub(super) fn attn_seqs(&self) -> Vec<AttnSeq<'_>> {
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
