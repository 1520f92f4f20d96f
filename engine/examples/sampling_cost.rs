//! Per-token cost of the CPU sampler with all three penalties, against the length of the
//! sequence so far: it stays flat, because the token history is kept incrementally
//! (`TokenCounts`) and a step reads only the distinct tokens, never the whole sequence.
//!
//! `cargo run --release -p engine --example sampling_cost`

use std::time::Instant;

use engine::sampler::{sample_row, SampleSpec, SamplingParams, TokenCounts};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VOCAB: usize = 49_152;

fn main() {
    let mut rng = StdRng::seed_from_u64(1);
    let logits: Vec<f32> = (0..VOCAB).map(|_| rng.random_range(-8.0f32..8.0)).collect();
    let params = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        repetition_penalty: 1.2,
        presence_penalty: 0.5,
        frequency_penalty: 0.3,
        ..SamplingParams::default()
    };
    // Text-like ids: a few thousand distinct tokens, frequent ones far more frequent.
    let draw_id = |rng: &mut StdRng| (rng.random::<f64>().powi(3) * 4000.0) as u32;
    let mut counts = TokenCounts::new(&(0..200).map(|_| draw_id(&mut rng)).collect::<Vec<_>>());
    let mut row = logits.clone();
    let mut generated = 0usize;
    println!("tokens so far | distinct | per-token cost (push + penalised sample), mean of 200");
    for checkpoint in [256usize, 1024, 4096, 16_384, 65_536] {
        while generated < checkpoint - 200 {
            counts.push_output(draw_id(&mut rng));
            generated += 1;
        }
        let started = Instant::now();
        for _ in 0..200 {
            row.copy_from_slice(&logits);
            let u = rng.random::<f64>();
            let spec = SampleSpec::new(&params, 1, generated as u64, u, &[], Some(&counts));
            let token = sample_row(&mut row, &spec).token;
            counts.push_output(token % 4000);
            generated += 1;
        }
        let per_token = started.elapsed().as_secs_f64() / 200.0;
        println!(
            "{checkpoint:>13} | {:>8} | {:.1} us",
            counts.seen().len(),
            per_token * 1e6
        );
    }
}
