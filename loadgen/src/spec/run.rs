//! A run's options typed and checked once: [`RunSpec::from_args`] turns the command line's
//! [`RunArgs`] into the spec that everything below reads (prepare, execute, the probe, each
//! sweep level), each refusal naming its flag. A sweep level's spec is the sweep's own at
//! its rate ([`RunSpec::at_level`]); nothing is changed in place by whoever runs it.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Result};
use reports::slo::SloSpec;

use crate::load::schedule::TraceScaling;
use crate::load::shard::Shard;
use crate::load::workload::prompt::{salt_for, SaltFor};
use crate::load::workload::sessions::{SessionSpec, ThinkTime, TurnCount};
use crate::load::workload::traces::TraceFormat;
use crate::spec::bound::BoundOptions;
use crate::spec::run_args::{parse_headers, parse_window, ArrivalKind, RunArgs, WorkloadKind};
use crate::wire::backend::Backend;
use crate::wire::extra_body::ExtraBody;
use crate::wire::tls::TlsSettings;

/// Requests a run sends without --duration or a trace to size it.
pub const DEFAULT_NUM_PROMPTS: usize = 1000;

/// One run, as its options ask for it.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub target: TargetSpec,
    pub workload: WorkloadSpec,
    pub load: LoadSpec,
    pub window: WindowSpec,
    /// Multi-turn sessions (`--turns`), or single requests.
    pub sessions: Option<SessionsSpec>,
    pub seed: u64,
    /// The run folder; `None` keeps everything in memory.
    pub out: Option<PathBuf>,
    /// `--slo` with its `--max-error-rate`, parsed once.
    pub slo: Option<SloSpec>,
    /// `--slo` as given (recorded in the schedule's digest).
    pub slo_text: Option<String>,
    pub fail_on_slo: bool,
    pub slice: Option<Duration>,
    /// Zero: no scrape.
    pub scrape_interval: Duration,
    /// `--shard I/K` with the shared `--start-at`, checked together.
    pub shard: Option<Shard>,
    pub start_at: Option<SystemTime>,
    pub bound: BoundOptions,
    pub calibrate: bool,
    pub progress: bool,
}

/// Where requests go and how each is shaped on the wire.
#[derive(Debug, Clone)]
pub struct TargetSpec {
    pub url: String,
    pub backend: Backend,
    /// `None`: the first of GET /v1/models.
    pub model: Option<String>,
    pub headers: Vec<(String, String)>,
    pub api_key: Option<String>,
    pub tls: TlsSettings,
    pub extra_body: Option<ExtraBody>,
    pub prompt_ids: bool,
    pub ignore_eos: bool,
    pub min_tokens: bool,
    pub continuous_usage: bool,
    pub timeout: Duration,
}

/// What the requests hold.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    pub lengths: Lengths,
    /// Shared prefix tokens per group (synthetic workloads), and the number of groups.
    pub prefix_len: u32,
    pub prefix_groups: u64,
    pub tokenizer: Option<PathBuf>,
    pub length_scale: f64,
    pub max_model_len: Option<u32>,
    pub prompt_salt: u64,
}

/// Where the requests' lengths (and maybe prompts and timestamps) come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Lengths {
    /// Seeded log-normal lengths of a profile.
    SharegptLike {
        profile: String,
        max_input_len: Option<u32>,
        max_output_len: Option<u32>,
    },
    /// vLLM's `random`: uniform around these lengths.
    Random {
        input_len: u32,
        output_len: u32,
        range_ratio: f64,
    },
    /// A trace file, its format given or guessed from the file.
    Trace {
        path: PathBuf,
        format: Option<TraceFormat>,
    },
}

impl Lengths {
    /// The workload's kind, as `meta.json` names it.
    pub fn kind(&self) -> WorkloadKind {
        match self {
            Lengths::SharegptLike { .. } => WorkloadKind::SharegptLike,
            Lengths::Random { .. } => WorkloadKind::Random,
            Lengths::Trace { .. } => WorkloadKind::Trace,
        }
    }
}

/// How requests are sent: on a schedule (open loop) or by a number of workers.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadSpec {
    Open(OpenLoad),
    /// `--concurrency N`: N workers, each sending its next request when one ends.
    Closed {
        concurrency: usize,
    },
}

/// An open-loop schedule's options.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenLoad {
    /// Requests (with sessions: sessions) per second.
    pub rate: f64,
    /// `None`: the trace's own timestamps when the trace has them, else Poisson.
    pub arrival: Option<ArrivalKind>,
    pub burstiness: f64,
    /// Linear ramp from `ramp_start_rate` to `rate` over this time.
    pub ramp_up: Option<Duration>,
    pub ramp_start_rate: f64,
    pub exact_rate: bool,
    /// A replayed trace's slice and time scaling.
    pub trace: TraceScaling,
}

/// The run's phases and how many requests it sends.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowSpec {
    pub warmup: Duration,
    /// The measured span; `None`: `num_prompts` requests.
    pub duration: Option<Duration>,
    /// `None`: 1,000, or each trace row once.
    pub num_prompts: Option<usize>,
    pub cooldown: Duration,
    /// A cap on requests in flight (either loop); queued requests record their wait.
    pub max_concurrency: Option<usize>,
}

/// `--turns` and the options that shape sessions.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionsSpec {
    pub spec: SessionSpec,
    pub max_history_tokens: Option<u64>,
    pub drain: Option<Duration>,
}

impl RunSpec {
    /// The spec of `args`, every option checked that can be without reading a file or the
    /// network (a trace's rows, its timestamps, the server are checked when the run is
    /// prepared or sent).
    pub fn from_args(args: &RunArgs) -> Result<RunSpec> {
        let sessions = sessions(args)?;
        if args.exact_rate {
            if args.concurrency.is_some() {
                bail!(
                    "--exact-rate scales an open-loop schedule: --concurrency (closed loop) has none"
                );
            }
            if args.turns.is_some() {
                bail!("--exact-rate with --turns: a session's later turns follow its answers, so no factor fixes their rate; give --rate alone");
            }
        }
        if sessions.is_some() {
            if args.length_scale != 1.0 || args.max_model_len.is_some() {
                bail!("--length-scale and --max-model-len reshape single requests; a session's prompt grows with its history: shape sessions with --max-history-tokens");
            }
            if args.backend != Backend::Chat {
                bail!("--turns needs --backend chat: a session re-sends its history as chat messages, which the {} API has no place for", args.backend.name());
            }
            if args.concurrency.is_some() {
                bail!("--turns with --concurrency: sessions arrive open-loop at --rate sessions/s; a closed loop of sessions is not supported");
            }
            if args.arrival == Some(ArrivalKind::Trace) {
                bail!("--turns: sessions arrive on --arrival poisson, gamma or constant at --rate sessions/s");
            }
        }
        let lengths = match args.workload {
            WorkloadKind::SharegptLike => Lengths::SharegptLike {
                profile: args.profile.clone(),
                max_input_len: args.max_input_len,
                max_output_len: args.max_output_len,
            },
            WorkloadKind::Random => Lengths::Random {
                input_len: args.random_input_len,
                output_len: args.random_output_len,
                range_ratio: args.random_range_ratio,
            },
            WorkloadKind::Trace => match &args.trace {
                Some(path) => Lengths::Trace {
                    path: path.clone(),
                    format: args.trace_format,
                },
                None => bail!("--workload trace needs --trace PATH"),
            },
        };
        if let (Some(s), Lengths::Trace { .. }) = (&sessions, &lengths) {
            if s.spec.turns != TurnCount::All {
                bail!("--workload trace with sessions: give --turns all to replay a ShareGPT file's conversations with all their turns");
            }
        }
        if let (Some(s), false) = (&sessions, matches!(lengths, Lengths::Trace { .. })) {
            if s.spec.turns == TurnCount::All {
                bail!("--turns all replays a ShareGPT file (--workload trace --trace FILE.json); a synthetic workload takes --turns N or constant:N");
            }
        }
        // Each API also refuses such a body per request (a `Target` built without these
        // options); here a command-line run fails before it sends anything.
        if args.prompt_ids && args.backend != Backend::Completions {
            bail!(
                "--prompt-ids needs --backend completions: only a completions prompt may be token ids"
            );
        }
        let load = match args.concurrency {
            Some(concurrency) => LoadSpec::Closed { concurrency },
            None => LoadSpec::Open(OpenLoad {
                rate: args.rate,
                arrival: args.arrival,
                burstiness: args.burstiness,
                ramp_up: args.ramp_up,
                ramp_start_rate: args.ramp_start_rate,
                exact_rate: args.exact_rate,
                trace: TraceScaling {
                    window: args.trace_window.as_deref().map(parse_window).transpose()?,
                    time_scale: args.time_scale,
                    target_rate: args.target_rate,
                },
            }),
        };
        if let Some(shard) = args.shard {
            if args.concurrency.is_some() {
                bail!("--shard splits an open-loop schedule; a closed loop (--concurrency) has none: give each worker its own --concurrency instead");
            }
            if args.start_at.is_none() {
                bail!("--shard {shard}: every worker needs the same --start-at (RFC 3339 or Unix seconds)");
            }
            if args.max_concurrency.is_some() {
                bail!("--shard with --max-concurrency: each worker would cap its own requests in flight, so K workers would allow K times the cap; leave the cap out");
            }
            if args.calibrate {
                bail!("--shard: calibrate each worker with `loadgen calibrate` before the run, not with --calibrate");
            }
        }
        Ok(RunSpec {
            target: TargetSpec {
                url: args.url.clone(),
                backend: args.backend,
                model: args.model.clone(),
                headers: parse_headers(&args.headers)?,
                api_key: args.api_key.clone(),
                tls: TlsSettings::new(&args.tls.options())?,
                extra_body: args
                    .extra_body
                    .as_deref()
                    .map(|arg| ExtraBody::parse(arg, args.backend))
                    .transpose()?,
                prompt_ids: args.prompt_ids,
                ignore_eos: !args.no_ignore_eos,
                min_tokens: args.min_tokens,
                continuous_usage: !args.no_continuous_usage,
                timeout: args.timeout,
            },
            workload: WorkloadSpec {
                lengths,
                prefix_len: args.prefix_len,
                prefix_groups: args.prefix_groups,
                tokenizer: args.tokenizer.clone(),
                length_scale: args.length_scale,
                max_model_len: args.max_model_len,
                prompt_salt: args.prompt_salt,
            },
            load,
            window: WindowSpec {
                warmup: args.warmup,
                duration: args.duration,
                num_prompts: args.num_prompts,
                cooldown: args.cooldown,
                max_concurrency: args.max_concurrency,
            },
            sessions,
            seed: args.seed,
            out: args.out.clone(),
            slo: slo_spec(args)?,
            slo_text: args.slo.clone(),
            fail_on_slo: args.fail_on_slo,
            slice: args.slice,
            scrape_interval: args.scrape_interval,
            shard: args.shard,
            start_at: args.start_at,
            bound: args.bound.options(),
            calibrate: args.calibrate,
            progress: !args.no_progress,
        })
    }

    /// The spec of a sweep's level `index` at `rate` into `out`: its own rate (a replayed
    /// trace rescaled to it, else Poisson unless another arrival was asked for), a schedule
    /// scaled to hold that rate over the window (but for sessions, whose later turns follow
    /// the answers), and prompt words of its own.
    pub fn at_level(&self, rate: f64, index: usize, out: PathBuf) -> RunSpec {
        let mut level = self.at_rate(rate, out);
        if let LoadSpec::Open(open) = &mut level.load {
            open.exact_rate = self.sessions.is_none();
        }
        level.workload.prompt_salt =
            salt_for(self.workload.prompt_salt, SaltFor::SweepLevel, index);
        level
    }

    /// The spec at `rate` into `out`: a replayed trace rescaled to it, else Poisson unless
    /// another arrival was asked for (a sweep level, and each round of `tune`'s comparison).
    pub fn at_rate(&self, rate: f64, out: PathBuf) -> RunSpec {
        let mut run = self.clone();
        if let LoadSpec::Open(open) = &mut run.load {
            open.rate = rate;
            match open.arrival {
                Some(ArrivalKind::Trace) => open.trace.target_rate = Some(rate),
                None => open.arrival = Some(ArrivalKind::Poisson),
                Some(_) => {}
            }
        }
        run.out = Some(out);
        run
    }

    /// The open-loop rate, if the run has a schedule.
    pub fn rate(&self) -> Option<f64> {
        match &self.load {
            LoadSpec::Open(open) => Some(open.rate),
            LoadSpec::Closed { .. } => None,
        }
    }

    /// The closed loop's concurrency, if the run has one.
    pub fn concurrency(&self) -> Option<usize> {
        match self.load {
            LoadSpec::Closed { concurrency } => Some(concurrency),
            LoadSpec::Open(_) => None,
        }
    }

    /// `self` lengthened to hold at least `min` measured requests at `rate`.
    pub fn lengthened_to(mut self, rate: f64, min: Option<u64>) -> RunSpec {
        let Some(min) = min else {
            return self;
        };
        // A Poisson schedule's count over a span varies by √n: the span expects three
        // standard deviations more than `min`, so that its seeded draw holds `min` all but
        // rarely.
        let expected = min as f64 + 3.0 * (min as f64).sqrt();
        match self.window.duration {
            Some(d) if rate * d.as_secs_f64() < expected => {
                self.window.duration = Some(Duration::from_secs_f64(expected / rate));
            }
            Some(_) => {}
            None => {
                let n = self.window.num_prompts.unwrap_or(DEFAULT_NUM_PROMPTS);
                self.window.num_prompts = Some(n.max(min as usize));
            }
        }
        self
    }

    /// `self` with twice the requests: twice the duration, or twice the number of prompts.
    pub fn doubled(mut self) -> RunSpec {
        match self.window.duration {
            Some(d) => self.window.duration = Some(d * 2),
            None => {
                self.window.num_prompts =
                    Some(2 * self.window.num_prompts.unwrap_or(DEFAULT_NUM_PROMPTS))
            }
        }
        self
    }

    /// One closed-loop probe step: `concurrency` workers for `duration` after a quarter of
    /// it as warm-up, no SLO, prompt words of the `index`-th step's own.
    pub fn probe_step(&self, concurrency: usize, duration: Duration, index: usize) -> RunSpec {
        let mut step = self.clone();
        step.load = LoadSpec::Closed { concurrency };
        step.window = WindowSpec {
            warmup: duration / 4,
            duration: Some(duration),
            num_prompts: self.window.num_prompts,
            cooldown: Duration::ZERO,
            max_concurrency: None,
        };
        step.slo = None;
        step.slo_text = None;
        step.workload.prompt_salt = salt_for(self.workload.prompt_salt, SaltFor::ProbeStep, index);
        step
    }
}

/// The session options of `args`; the options that only sessions take are refused without
/// `--turns`, never ignored.
fn sessions(args: &RunArgs) -> Result<Option<SessionsSpec>> {
    let Some(turns) = args.turns.as_deref() else {
        let stray = [
            ("--think-time", args.think_time.is_some()),
            ("--max-session-turns", args.max_session_turns.is_some()),
            ("--max-history-tokens", args.max_history_tokens.is_some()),
            ("--session-drain", args.session_drain.is_some()),
        ];
        if let Some((flag, _)) = stray.iter().find(|(_, given)| *given) {
            bail!("{flag} shapes multi-turn sessions: give --turns too");
        }
        return Ok(None);
    };
    let think = match args.think_time.as_deref() {
        Some(t) => ThinkTime::parse(t)?,
        None => ThinkTime::Constant { secs: 0.0 },
    };
    if args.max_session_turns == Some(0) {
        bail!("--max-session-turns must be at least 1");
    }
    if args.session_drain.is_some() && args.duration.is_none() {
        bail!("--session-drain limits sessions after --duration; without --duration every session runs to its end");
    }
    Ok(Some(SessionsSpec {
        spec: SessionSpec {
            turns: TurnCount::parse(turns)?,
            think,
            max_turns: args.max_session_turns,
        },
        max_history_tokens: args.max_history_tokens,
        drain: args.session_drain,
    }))
}

/// The `--slo` of `args` with its `--max-error-rate`.
fn slo_spec(args: &RunArgs) -> Result<Option<SloSpec>> {
    if args.fail_on_slo && args.slo.is_none() {
        bail!("--fail-on-slo needs --slo (e.g. --slo ttft:p90:2s,tpot:p90:100ms)");
    }
    Ok(args
        .slo
        .as_deref()
        .map(SloSpec::parse)
        .transpose()?
        .map(|spec| SloSpec {
            max_error_rate: args.max_error_rate,
            ..spec
        }))
}
