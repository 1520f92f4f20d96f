//! Reshaping drawn requests: every length scaled by one factor (`--length-scale`), and
//! requests shortened to fit a context (`--max-model-len`), both after the draw so that the
//! seeded workload keeps its shape.

use anyhow::{bail, Result};

use super::{Block, PromptSource, RequestSpec};

/// `len` × `factor`, rounded, at least 1.
fn scaled(len: u32, factor: f64) -> u32 {
    ((f64::from(len) * factor).round() as u32).max(1)
}

/// Multiplies each request's output length and each block of its prompt (a shared prefix
/// scales as the rest) by `factor`. Literal-text prompts have no length to change: refused.
pub fn scale_lengths(specs: &mut [RequestSpec], factor: f64) -> Result<()> {
    if !(factor.is_finite() && factor > 0.0) {
        bail!("--length-scale must be a positive number, not {factor}");
    }
    for spec in specs.iter_mut() {
        let PromptSource::Blocks(blocks) = &mut spec.prompt else {
            bail!("--length-scale: this workload's prompts are literal text (a ShareGPT file or a trace with prompts), which cannot be made longer or shorter; give a length-only trace or a synthetic workload");
        };
        for block in blocks.iter_mut() {
            block.len = scaled(block.len, factor);
        }
        spec.input_len = blocks.iter().map(|b| b.len).sum();
        spec.output_len = scaled(spec.output_len, factor);
    }
    Ok(())
}

/// Shortens each request whose prompt + output passes `limit` tokens: the prompt first, from
/// its end (its own tokens before a shared prefix), down to 1 token, then the output.
/// Returns how many requests were shortened.
pub fn clip_to_context(specs: &mut [RequestSpec], limit: u32) -> Result<usize> {
    if limit < 2 {
        bail!("--max-model-len {limit}: a request needs at least 1 prompt and 1 output token");
    }
    let mut clipped = 0;
    for spec in specs.iter_mut() {
        if spec.input_len + spec.output_len <= limit {
            continue;
        }
        let PromptSource::Blocks(blocks) = &mut spec.prompt else {
            bail!("--max-model-len: this workload's prompts are literal text, which cannot be shortened to a token count; give a length-only trace or a synthetic workload");
        };
        clipped += 1;
        let prompt = limit.saturating_sub(spec.output_len).max(1);
        truncate_blocks(blocks, prompt);
        spec.input_len = blocks.iter().map(|b| b.len).sum();
        spec.output_len = spec.output_len.min(limit - spec.input_len);
    }
    Ok(clipped)
}

/// Cuts `blocks` to `len` tokens from the end.
fn truncate_blocks(blocks: &mut Vec<Block>, len: u32) {
    let mut left = len;
    blocks.retain_mut(|b| {
        if left == 0 {
            return false;
        }
        b.len = b.len.min(left);
        left -= b.len;
        true
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(blocks: &[u32], output_len: u32) -> RequestSpec {
        let blocks: Vec<Block> = blocks
            .iter()
            .enumerate()
            .map(|(i, &len)| Block { key: i as u64, len })
            .collect();
        RequestSpec {
            input_len: blocks.iter().map(|b| b.len).sum(),
            output_len,
            prefix_group: None,
            prompt: PromptSource::Blocks(blocks),
            model: None,
            class: None,
        }
    }

    fn lens(s: &RequestSpec) -> Vec<u32> {
        match &s.prompt {
            PromptSource::Blocks(b) => b.iter().map(|b| b.len).collect(),
            PromptSource::Text(_) => Vec::new(),
        }
    }

    #[test]
    fn scaling_multiplies_every_block_and_the_output() {
        let mut specs = vec![spec(&[4096, 256], 1024), spec(&[3], 2)];
        scale_lengths(&mut specs, 0.1).unwrap();
        assert_eq!(lens(&specs[0]), [410, 26]);
        assert_eq!((specs[0].input_len, specs[0].output_len), (436, 102));
        assert_eq!(
            (specs[1].input_len, specs[1].output_len),
            (1, 1),
            "at least 1"
        );
        let mut text = vec![RequestSpec {
            input_len: 5,
            output_len: 5,
            prefix_group: None,
            prompt: PromptSource::Text("hello".into()),
            model: None,
            class: None,
        }];
        assert!(scale_lengths(&mut text, 0.5).is_err());
        assert!(scale_lengths(&mut specs, 0.0).is_err());
    }

    #[test]
    fn clipping_shortens_the_prompt_from_its_end_then_the_output() {
        let mut specs = vec![
            spec(&[100, 900], 128),
            spec(&[10, 20], 30),
            spec(&[600], 2000),
        ];
        assert_eq!(clip_to_context(&mut specs, 512).unwrap(), 2);
        assert_eq!(lens(&specs[0]), [100, 284], "the shared prefix is kept");
        assert_eq!((specs[0].input_len, specs[0].output_len), (384, 128));
        assert_eq!(lens(&specs[1]), [10, 20], "fits: untouched");
        assert_eq!((specs[2].input_len, specs[2].output_len), (1, 511));
        assert!(clip_to_context(&mut specs, 1).is_err());
    }
}
