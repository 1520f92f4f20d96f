//! `engine` command line: `serve` (the OpenAI-compatible server), `generate` (one-off
//! prompts, batched) and `bench` (offline throughput in the manner of nano-vLLM's bench.py).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{ensure, Context};
use clap::{Args, Parser, Subcommand};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use engine::grammar::{GrammarCompiler, GrammarSpec};
use engine::loader::{load_engine, EngineArgs};
use engine::sampler::SamplingParams;
use engine::tokenizer::{ChatMessage, Tokenizer};

#[derive(Parser)]
#[command(name = "engine", version, about = "LLM inference engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generates continuations of one or more prompts, all batched together.
    Generate(GenerateArgs),
    /// Offline throughput: random prompts and output lengths, ignore_eos, warm-up excluded.
    Bench(BenchArgs),
    /// Serves the OpenAI-compatible HTTP API: completions, chat completions, models, health, metrics.
    Serve(engine::server::ServeArgs),
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The prompt text.
    #[arg(
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    prompt: Option<String>,
    /// A file with one prompt per line (empty lines skipped), all run batched together.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Wrap each prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long)]
    ignore_eos: bool,
    /// Print each prompt's answer as one JSON line instead of its text: `text`, `token_ids`
    /// and each token's `logprobs` (as `/v1/completions` reports them).
    #[arg(long)]
    logprobs: bool,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    engine: EngineArgs,
    #[arg(long, default_value_t = 32)]
    num_seqs: usize,
    #[arg(long, default_value_t = 32)]
    min_input_len: usize,
    #[arg(long, default_value_t = 256)]
    max_input_len: usize,
    #[arg(long, default_value_t = 32)]
    min_output_len: usize,
    #[arg(long, default_value_t = 128)]
    max_output_len: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Every sequence's output follows this JSON schema (structured output), to measure
    /// what the grammar masks cost; the summary adds the mask time per token.
    #[arg(long, value_name = "FILE")]
    json_schema: Option<PathBuf>,
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match Cli::parse().command {
        Command::Generate(args) => generate(args),
        Command::Bench(args) => bench(args),
        Command::Serve(args) => engine::server::serve(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    let texts: Vec<String> = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => vec![p.clone()],
        (None, Some(file)) => std::fs::read_to_string(file)
            .with_context(|| format!("reading --prompt-file {}", file.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
        (None, None) => anyhow::bail!("give --prompt or --prompt-file"),
    };
    ensure!(!texts.is_empty(), "the prompt file holds no prompts");
    let mut engine = load_engine(&args.engine)?.engine;
    let tokenizer = engine.tokenizer().clone();
    let prompts = texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            encode_prompt(&tokenizer, text, args.chat).with_context(|| format!("prompt {i}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let params = SamplingParams {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        ignore_eos: args.ignore_eos,
        logprobs: args.logprobs.then_some(0),
        ..SamplingParams::default()
    };
    let num_prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    let started = Instant::now();
    let outputs = engine.generate(prompts, &params)?;
    let secs = started.elapsed().as_secs_f64();
    let num_generated: usize = outputs.iter().map(|o| o.token_ids.len()).sum();
    for (i, output) in outputs.iter().enumerate() {
        tracing::debug!(prompt = i, tokens = ?output.token_ids, "generated");
        if args.logprobs {
            let line = serde_json::json!({
                "prompt": i,
                "text": output.text,
                "token_ids": output.token_ids,
                "logprobs": output.logprobs,
                "finish": output.finish,
            });
            println!("{line}");
            continue;
        }
        if outputs.len() > 1 {
            println!("### prompt {i} (finish: {:?})", output.finish);
        }
        println!("{}", output.text);
    }
    eprintln!(
        "prompt tokens: {num_prompt_tokens}, generated tokens: {num_generated}, time: {secs:.2}s, {:.2} tok/s",
        num_generated as f64 / secs
    );
    Ok(())
}

fn encode_prompt(tokenizer: &Tokenizer, text: &str, chat: bool) -> anyhow::Result<Vec<u32>> {
    if chat {
        let message = ChatMessage {
            role: "user".into(),
            content: text.into(),
            reasoning_content: None,
            ..ChatMessage::default()
        };
        let rendered = tokenizer.apply_chat_template(&[message], true, &Default::default())?;
        tokenizer.encode(&rendered, false)
    } else {
        tokenizer.encode(text, true)
    }
}

fn bench(args: BenchArgs) -> anyhow::Result<()> {
    ensure!(
        args.num_seqs > 0
            && args.min_input_len >= 1
            && args.min_input_len <= args.max_input_len
            && args.min_output_len >= 1
            && args.min_output_len <= args.max_output_len,
        "need --num-seqs >= 1, 1 <= --min-input-len <= --max-input-len and 1 <= --min-output-len <= --max-output-len"
    );
    let loaded = load_engine(&args.engine)?;
    let mut engine = loaded.engine;
    let grammar = match &args.json_schema {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --json-schema {}", path.display()))?;
            let schema: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("--json-schema {} is not JSON", path.display()))?;
            let compiler =
                GrammarCompiler::new(loaded.tokenizer.clone(), loaded.config.vocab_size)?;
            let spec = GrammarSpec::JsonSchema(schema);
            compiler
                .compile(&spec)
                .with_context(|| format!("compiling --json-schema {}", path.display()))?;
            Some((compiler, spec))
        }
    };
    let mut rng = StdRng::seed_from_u64(args.seed);
    let vocab = engine.vocab_size().min(10_000) as u32;
    let requests: Vec<(Vec<u32>, SamplingParams)> = (0..args.num_seqs)
        .map(|i| {
            let input_len = rng.random_range(args.min_input_len..=args.max_input_len);
            let prompt = (0..input_len).map(|_| rng.random_range(0..vocab)).collect();
            let params = SamplingParams {
                max_tokens: rng.random_range(args.min_output_len..=args.max_output_len),
                temperature: 0.6,
                seed: Some(args.seed.wrapping_add(i as u64)),
                ignore_eos: true,
                ..SamplingParams::default()
            };
            (prompt, params)
        })
        .collect();

    let warm_up = SamplingParams {
        max_tokens: 4,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    engine.generate(vec![(1..=16).collect()], &warm_up)?;
    engine.reset_timings();

    let num_prompt_tokens: usize = requests.iter().map(|(p, _)| p.len()).sum();
    let started = Instant::now();
    for (prompt, params) in requests {
        // Compiled per sequence, as the server does per request.
        let matcher = match &grammar {
            Some((compiler, spec)) => Some(compiler.compile(spec)?),
            None => None,
        };
        let checked = engine.limits().check(prompt, params)?;
        engine.add_checked(checked, matcher)?;
    }
    let mut num_output_tokens = 0usize;
    while engine.has_unfinished() {
        num_output_tokens += engine.step()?.iter().filter(|u| u.token.is_some()).count();
    }
    let secs = started.elapsed().as_secs_f64();
    let t = engine.timings();
    let stats = engine.stats();
    println!(
        "Total: {num_output_tokens}tok, Time: {secs:.2}s, Throughput: {:.2}tok/s",
        num_output_tokens as f64 / secs
    );
    println!(
        "Prefill: {}tok computed ({num_prompt_tokens} prompt), Time: {:.2}s in {} steps, Throughput: {:.2}tok/s",
        t.prefill_tokens,
        t.prefill_secs,
        t.prefill_steps,
        t.prefill_tokens as f64 / t.prefill_secs.max(1e-9)
    );
    println!(
        "Decode: {}tok, Time: {:.2}s in {} steps, Throughput: {:.2}tok/s",
        t.decode_tokens,
        t.decode_secs,
        t.decode_steps,
        t.decode_tokens as f64 / t.decode_secs.max(1e-9)
    );
    if t.prefill_experts_secs > 0.0 {
        println!(
            "Prefill experts (mixture-of-experts FFNs): {:.2}s of the {:.2}s",
            t.prefill_experts_secs, t.prefill_secs
        );
    }
    if t.prefill_delta_net_secs > 0.0 {
        println!(
            "Prefill DeltaNet layers (projections, convolution, recurrence): {:.2}s of the {:.2}s ({:.1}%)",
            t.prefill_delta_net_secs,
            t.prefill_secs,
            100.0 * t.prefill_delta_net_secs / t.prefill_secs.max(1e-9)
        );
    }
    if t.decode_steps > 0 {
        let d = t.decode;
        let ms = |x: f64| 1e3 * x / t.decode_steps as f64;
        println!(
            "Decode step (mean of {}): {:.3}ms = schedule {:.3}ms + runner {:.3}ms (prepare {:.3}ms, forward {:.3}ms, sample {:.3}ms on the device) + update {:.3}ms",
            t.decode_steps,
            ms(t.decode_secs),
            ms(d.schedule_secs),
            ms(d.runner_wall_secs),
            ms(d.prepare_secs),
            ms(d.forward_secs),
            ms(d.sample_secs),
            ms(d.update_secs)
        );
        if d.delta_net_secs > 0.0 {
            println!(
                "Decode step DeltaNet layers (projections, convolution, recurrence): {:.3}ms of the forward's {:.3}ms ({:.1}%)",
                ms(d.delta_net_secs),
                ms(d.forward_secs),
                100.0 * d.delta_net_secs / d.forward_secs.max(1e-9)
            );
        }
        if d.experts_secs > 0.0 {
            println!(
                "Decode step experts (mixture-of-experts FFNs: routing, expert GEMMs, weighted sums): {:.3}ms of the forward's {:.3}ms",
                ms(d.experts_secs),
                ms(d.forward_secs)
            );
        }
    }
    if t.grammar_masks > 0 {
        let per_token = |x: f64| 1e6 * x / t.grammar_masks as f64;
        println!(
            "Grammar: {} masks, {:.1}us per token to compute the mask (summed over threads) + {:.1}us to advance past the token; {:.1}% of the run's time",
            t.grammar_masks,
            per_token(t.grammar_mask_secs),
            per_token(t.grammar_accept_secs),
            100.0 * (t.grammar_mask_secs + t.grammar_accept_secs) / secs
        );
    }
    tracing::info!(
        preemptions = stats.num_preemptions,
        prefix_cache_hits = stats.prefix_cache_hits,
        "bench done"
    );
    Ok(())
}
