//! A run's options typed and checked once: `RunSpec::from_args` (beside the clap types, in
//! `spec::run_args`) turns the command line into the spec that everything below reads
//! (prepare, execute, the probe, each sweep level), each refusal naming its flag. A sweep
//! level's spec is the sweep's own at its rate ([`RunSpec::at_level`]); nothing is changed in
//! place by whoever runs it.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use reports::slo::SloSpec;

use crate::load::plan::ClassBy;
use crate::load::schedule::TraceScaling;
use crate::load::shard::Shard;
use crate::load::workload::agentic::AgenticOptions;
use crate::load::workload::prompt::{salt_for, SaltFor};
use crate::load::workload::sessions::SessionSpec;
use crate::load::workload::traces::TraceFormat;
use crate::spec::bound::BoundOptions;
use crate::wire::backend::Backend;
use crate::wire::extra_body::ExtraBody;
use crate::wire::tls::TlsSettings;

/// Requests a run sends without --duration or a trace to size it.
pub const DEFAULT_NUM_PROMPTS: usize = 1000;

/// One run, as its options ask for it.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// `--model-mix`: models and their relative weights (empty: the run's model).
    pub model_mix: Vec<(String, f64)>,
    /// `--class-by`; `None` for `auto`, resolved when the plan is built.
    pub class_by: Option<ClassBy>,
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

/// `--workload`: where the requests' lengths come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    SharegptLike,
    Random,
    Trace,
    Agentic,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 4] = [
        WorkloadKind::SharegptLike,
        WorkloadKind::Random,
        WorkloadKind::Trace,
        WorkloadKind::Agentic,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::SharegptLike => "sharegpt-like",
            WorkloadKind::Random => "random",
            WorkloadKind::Trace => "trace",
            WorkloadKind::Agentic => "agentic",
        }
    }

    /// The value's help in `--help`.
    pub fn help(self) -> &'static str {
        match self {
            WorkloadKind::SharegptLike => {
                "Seeded log-normal lengths (`--profile`), parameters in traces/sharegpt-like.json"
            }
            WorkloadKind::Random => {
                "vLLM `random`: uniform lengths around --random-input-len / --random-output-len"
            }
            WorkloadKind::Trace => "Lengths (and timestamps) from `--trace`",
            WorkloadKind::Agentic => {
                "Agent sessions (chat or responses): a shared system prompt and tools, turns that \
                 answer the server's tool calls after --tool-latency; parameters in traces/agentic.json"
            }
        }
    }
}

/// `--arrival`: the process that spaces an open loop's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrivalKind {
    Poisson,
    Gamma,
    Constant,
    /// The trace's own timestamps.
    Trace,
}

impl ArrivalKind {
    pub const ALL: [ArrivalKind; 4] = [
        ArrivalKind::Poisson,
        ArrivalKind::Gamma,
        ArrivalKind::Constant,
        ArrivalKind::Trace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ArrivalKind::Poisson => "poisson",
            ArrivalKind::Gamma => "gamma",
            ArrivalKind::Constant => "constant",
            ArrivalKind::Trace => "trace",
        }
    }

    /// The value's help in `--help`, where it has one.
    pub fn help(self) -> Option<&'static str> {
        match self {
            ArrivalKind::Trace => Some(
                "The trace's own timestamps (after --trace-window, --time-scale / --target-rate)",
            ),
            _ => None,
        }
    }
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
    /// Agent sessions (`traces/agentic.json`).
    Agentic {
        options: AgenticOptions,
        /// `--tool-choice required`: the first turn of each session must call a tool.
        require_first_call: bool,
    },
}

impl Lengths {
    /// The workload's kind, as `meta.json` names it.
    pub fn kind(&self) -> WorkloadKind {
        match self {
            Lengths::SharegptLike { .. } => WorkloadKind::SharegptLike,
            Lengths::Random { .. } => WorkloadKind::Random,
            Lengths::Trace { .. } => WorkloadKind::Trace,
            Lengths::Agentic { .. } => WorkloadKind::Agentic,
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
    /// `--max-concurrency`: a cap on requests in flight; queued requests record their wait.
    pub max_concurrency: Option<usize>,
}

/// `--turns` (or `--workload agentic`) and the options that shape sessions.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionsSpec {
    pub spec: SessionSpec,
    pub max_history_tokens: Option<u64>,
    pub drain: Option<Duration>,
}

impl RunSpec {
    /// Whether the workload is a trace that links turns into sessions (Bailian, TraceLab,
    /// WEKA), whose rate is then one of sessions or turns and whose turns follow answers.
    pub fn links_sessions(&self) -> bool {
        let Lengths::Trace { path, format } = &self.workload.lengths else {
            return false;
        };
        let format = format.or_else(|| crate::load::workload::traces::detect_format(path).ok());
        matches!(
            format,
            Some(TraceFormat::Bailian | TraceFormat::Tracelab | TraceFormat::Weka)
        )
    }

    /// The spec of a sweep's level `index` at `rate` into `out`: its own rate (a replayed
    /// trace rescaled to it, else Poisson unless another arrival was asked for), a schedule
    /// scaled to hold that rate over the window (but for sessions, whose later turns follow
    /// the answers), and prompt words of its own.
    pub fn at_level(&self, rate: f64, index: usize, out: PathBuf) -> RunSpec {
        let mut level = self.at_rate(rate, out);
        if let LoadSpec::Open(open) = &mut level.load {
            open.exact_rate = self.sessions.is_none() && !self.links_sessions();
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
