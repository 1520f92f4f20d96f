//! What a server knob controls, and which way a regime says to turn it. A knob's role comes
//! from the flag that sets it, in a table per server kind (ours, vLLM, SGLang, llama.cpp,
//! TGI, the built-in mock), or from the user (`--knob-role NAME=ROLE`) for a server the table
//! does not know.

use serde::{Deserialize, Serialize};

use crate::diagnosis::Regime;

/// What a knob controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KnobRole {
    /// Sequences served at once.
    Concurrency,
    /// Tokens one engine step may carry (prefill chunks beside decodes).
    TokenBudget,
    /// Memory for the KV cache.
    KvMemory,
    /// The longest context a sequence may have.
    MaxContext,
}

impl KnobRole {
    pub const ALL: [KnobRole; 4] = [
        KnobRole::Concurrency,
        KnobRole::TokenBudget,
        KnobRole::KvMemory,
        KnobRole::MaxContext,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KnobRole::Concurrency => "concurrency",
            KnobRole::TokenBudget => "token-budget",
            KnobRole::KvMemory => "kv-memory",
            KnobRole::MaxContext => "max-context",
        }
    }

    /// The role named `name` (as [`Self::name`] gives it).
    pub fn named(name: &str) -> Option<KnobRole> {
        KnobRole::ALL.into_iter().find(|r| r.name() == name.trim())
    }
}

/// Which way to turn a knob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    Up,
    Down,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
        }
    }
}

/// One server's flag for a role.
pub struct ServerKnob {
    /// The server kind, as `loadgen` names it from `/version`, `/props` or `/v1/models`.
    pub server: &'static str,
    pub flag: &'static str,
    pub role: KnobRole,
}

const fn knob(server: &'static str, flag: &'static str, role: KnobRole) -> ServerKnob {
    ServerKnob { server, flag, role }
}

/// The flags each server kind takes for each role (read from each server's `--help` and
/// argument sources: vLLM's `EngineArgs`, SGLang's `ServerArgs`, llama.cpp's
/// `common/arg.cpp`, TGI's launcher).
pub const SERVER_KNOBS: &[ServerKnob] = &[
    knob("engine", "--max-num-seqs", KnobRole::Concurrency),
    knob("engine", "--max-num-batched-tokens", KnobRole::TokenBudget),
    knob("engine", "--kv-cache-memory", KnobRole::KvMemory),
    knob("engine", "--gpu-memory-utilization", KnobRole::KvMemory),
    knob("engine", "--max-model-len", KnobRole::MaxContext),
    knob("vllm", "--max-num-seqs", KnobRole::Concurrency),
    knob("vllm", "--max-num-batched-tokens", KnobRole::TokenBudget),
    knob("vllm", "--gpu-memory-utilization", KnobRole::KvMemory),
    knob("vllm", "--kv-cache-memory-bytes", KnobRole::KvMemory),
    knob("vllm", "--max-model-len", KnobRole::MaxContext),
    knob("sglang", "--max-running-requests", KnobRole::Concurrency),
    knob("sglang", "--chunked-prefill-size", KnobRole::TokenBudget),
    knob("sglang", "--max-prefill-tokens", KnobRole::TokenBudget),
    knob("sglang", "--mem-fraction-static", KnobRole::KvMemory),
    knob("sglang", "--context-length", KnobRole::MaxContext),
    knob("llama.cpp", "-np", KnobRole::Concurrency),
    knob("llama.cpp", "--parallel", KnobRole::Concurrency),
    knob("llama.cpp", "-b", KnobRole::TokenBudget),
    knob("llama.cpp", "--batch-size", KnobRole::TokenBudget),
    knob("llama.cpp", "-ub", KnobRole::TokenBudget),
    knob("llama.cpp", "--ubatch-size", KnobRole::TokenBudget),
    knob("llama.cpp", "-c", KnobRole::KvMemory),
    knob("llama.cpp", "--ctx-size", KnobRole::KvMemory),
    knob("tgi", "--max-concurrent-requests", KnobRole::Concurrency),
    knob("tgi", "--max-batch-prefill-tokens", KnobRole::TokenBudget),
    knob("tgi", "--max-total-tokens", KnobRole::MaxContext),
    knob("mock", "--slots", KnobRole::Concurrency),
];

/// The role of `flag` (`--max-num-seqs`, `-np`; a `--flag=value` form is read up to its
/// `=`), by the first server kind whose table has it (no flag means two roles across the
/// tables).
pub fn role_of_flag(flag: &str) -> Option<KnobRole> {
    let flag = flag.split('=').next().unwrap_or(flag);
    SERVER_KNOBS.iter().find(|k| k.flag == flag).map(|k| k.role)
}

/// The server kind of a run from the version it reported (loadgen's one line from
/// `/version`, `/props` or `/info`, prefixed by the owner `/v1/models` names).
pub fn server_kind(version: &str) -> Option<&'static str> {
    let v = version.trim();
    [
        ("engine ", "engine"),
        ("vLLM ", "vllm"),
        ("SGLang ", "sglang"),
        ("llama.cpp", "llama.cpp"),
        ("TGI ", "tgi"),
        ("loadgen-mock", "mock"),
    ]
    .into_iter()
    .find(|(prefix, _)| v.starts_with(prefix))
    .map(|(_, kind)| kind)
}

/// The server's flags for the move `regime` asks for, in words ("engine:
/// --max-num-batched-tokens down"); `None` when no knob helps or the table has none.
pub fn knob_flags(regime: Regime, server: &str) -> Option<String> {
    let moves: Vec<String> = regime_moves(regime)
        .iter()
        .filter_map(|&(role, direction)| {
            let flags = flags_for(server, role);
            (!flags.is_empty()).then(|| format!("{flags} {}", direction.name()))
        })
        .collect();
    (!moves.is_empty()).then(|| format!("{server}: {}", moves.join(", else ")))
}

/// The flags of `server`'s table for `role`, joined with " or " (empty when it has none).
pub fn flags_for(server: &str, role: KnobRole) -> String {
    SERVER_KNOBS
        .iter()
        .filter(|k| k.server == server && k.role == role)
        .map(|k| k.flag)
        .collect::<Vec<_>>()
        .join(" or ")
}

/// The knobs a regime turns and which way, in order of preference, where a server knob
/// helps: a queue or a batch too small wants more concurrency; prefill chunks slowing
/// decodes want a smaller token budget; a full KV cache wants more KV memory, else a smaller
/// max context.
pub fn regime_moves(regime: Regime) -> &'static [(KnobRole, Direction)] {
    match regime {
        Regime::Queueing | Regime::DecodeMemoryBound | Regime::StepOverhead => {
            &[(KnobRole::Concurrency, Direction::Up)]
        }
        Regime::PrefillInterference | Regime::PrefillComputeBound => {
            &[(KnobRole::TokenBudget, Direction::Down)]
        }
        Regime::KvPressure => &[
            (KnobRole::KvMemory, Direction::Up),
            (KnobRole::MaxContext, Direction::Down),
        ],
        Regime::ServerErrors
        | Regime::DecodeComputeBound
        | Regime::ColdCache
        | Regime::Tail
        | Regime::ClientBound
        | Regime::Undetermined => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_name_their_roles_and_regimes_their_moves() {
        assert_eq!(role_of_flag("--max-num-seqs"), Some(KnobRole::Concurrency));
        assert_eq!(role_of_flag("-ub"), Some(KnobRole::TokenBudget));
        assert_eq!(
            role_of_flag("--max-num-batched-tokens=512"),
            Some(KnobRole::TokenBudget)
        );
        assert_eq!(role_of_flag("--slots"), Some(KnobRole::Concurrency));
        assert_eq!(role_of_flag("--port"), None);
        assert_eq!(
            flags_for("llama.cpp", KnobRole::Concurrency),
            "-np or --parallel"
        );
        assert_eq!(flags_for("unknown", KnobRole::Concurrency), "");
        assert_eq!(KnobRole::named("token-budget"), Some(KnobRole::TokenBudget));
        assert_eq!(KnobRole::named("speed"), None);
        assert_eq!(
            regime_moves(Regime::Queueing),
            [(KnobRole::Concurrency, Direction::Up)]
        );
        assert_eq!(
            regime_moves(Regime::PrefillInterference),
            [(KnobRole::TokenBudget, Direction::Down)]
        );
        assert!(regime_moves(Regime::DecodeComputeBound).is_empty());
        assert_eq!(
            knob_flags(Regime::KvPressure, "vllm").as_deref(),
            Some("vllm: --gpu-memory-utilization or --kv-cache-memory-bytes up, else --max-model-len down")
        );
        assert_eq!(server_kind("engine 0.1.0"), Some("engine"));
        assert_eq!(server_kind("llama.cpp b1-0c1e570"), Some("llama.cpp"));
        assert_eq!(server_kind("vLLM 0.11.0"), Some("vllm"));
        assert_eq!(server_kind("0.11.0"), None);
        assert_eq!(
            knob_flags(Regime::PrefillInterference, "engine").as_deref(),
            Some("engine: --max-num-batched-tokens down")
        );
        assert_eq!(
            knob_flags(Regime::Queueing, "llama.cpp").as_deref(),
            Some("llama.cpp: -np or --parallel up")
        );
        assert_eq!(knob_flags(Regime::Tail, "engine"), None);
    }
}
