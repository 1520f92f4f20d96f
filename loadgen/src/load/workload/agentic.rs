//! The agentic workload (`--workload agentic`), synthetic and seeded: a pool of agents, each
//! a system prompt and a set of function tools (the prefix every session of that agent
//! shares), and sessions that each draw an agent and a task. A session runs while the
//! server calls tools: each turn after the first carries one result per call of the
//! answer before it, sent the tools' latency after that answer ended. What the server
//! answers decides how many turns run; the draws for every turn up to
//! `--max-session-turns` (tool latency, result length, answer cap) are made before the run.

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::prompt::PromptBuilder;
use super::synthetic::{cap_clip, sample_clipped, LengthDist};
use super::{mix, prefixed_blocks, Block, PromptSource, RequestSpec};

/// The committed parameters, compiled in.
const PARAMETERS_JSON: &str = include_str!("../../../../traces/agentic.json");

/// The agentic workload's length distributions (`traces/agentic.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgenticProfile {
    /// The system prompt of each agent (the tools' definitions come on top).
    pub system: LengthDist,
    pub tools_per_agent: u32,
    /// Each tool's description.
    pub tool_description: LengthDist,
    /// A session's first user message.
    pub task: LengthDist,
    /// Each tool call's result.
    pub tool_result: LengthDist,
    /// Each turn's `max_tokens`.
    pub output: LengthDist,
    /// Turns per session when `--max-session-turns` is not given.
    pub max_session_turns: u32,
}

/// The options of an agentic run besides its lengths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgenticOptions {
    /// Agents in the pool (`--prefix-groups`).
    pub agents: u64,
    /// `--prefix-len`: every agent's system prompt this long instead of drawn.
    pub system_len: Option<u32>,
    /// `--max-input-len`, `--max-output-len`: lower clips of the task and tool results, and
    /// of the answers.
    pub max_input_len: Option<u32>,
    pub max_output_len: Option<u32>,
}

/// A function the model is offered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionTool {
    pub name: String,
    pub description: String,
    /// The JSON schema of its arguments.
    pub parameters: serde_json::Value,
}

/// `--max-session-turns` unless given.
pub fn default_max_turns() -> Result<u32> {
    let p: AgenticProfile =
        serde_json::from_str(PARAMETERS_JSON).context("traces/agentic.json is invalid")?;
    Ok(p.max_session_turns)
}

/// One agent of the pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Agent {
    pub system: String,
    pub tools: Vec<FunctionTool>,
}

/// The tool names agents draw from (an agent's tools are distinct).
const TOOL_NAMES: [&str; 12] = [
    "read_file",
    "write_file",
    "edit_file",
    "search_code",
    "list_directory",
    "run_command",
    "run_tests",
    "web_search",
    "fetch_url",
    "query_database",
    "get_weather",
    "send_message",
];

/// Key tags of the agentic draws, apart from the other workloads' block keys.
const TAG_SYSTEM: u64 = 0xA6E7_0001;
const TAG_TOOL: u64 = 0xA6E7_0002;

impl AgenticProfile {
    /// The committed profile with the options' clips.
    pub fn new(options: &AgenticOptions) -> Result<AgenticProfile> {
        let mut p: AgenticProfile =
            serde_json::from_str(PARAMETERS_JSON).context("traces/agentic.json is invalid")?;
        cap_clip(&mut p.task, options.max_input_len, "--max-input-len")?;
        cap_clip(&mut p.tool_result, options.max_input_len, "--max-input-len")?;
        cap_clip(&mut p.output, options.max_output_len, "--max-output-len")?;
        if options.agents == 0 {
            bail!("--prefix-groups (agents in the pool) must be at least 1");
        }
        if p.tools_per_agent as usize > TOOL_NAMES.len() || p.tools_per_agent == 0 {
            bail!(
                "traces/agentic.json: tools_per_agent must be 1 to {}",
                TOOL_NAMES.len()
            );
        }
        Ok(p)
    }

    /// The pool of `options.agents` agents drawn from `seed`, their text from `prompts`.
    pub fn agents(
        &self,
        options: &AgenticOptions,
        seed: u64,
        prompts: &PromptBuilder,
    ) -> Result<Vec<Agent>> {
        let mut rng = StdRng::seed_from_u64(mix(seed, TAG_SYSTEM));
        (0..options.agents)
            .map(|a| {
                let len = match options.system_len {
                    Some(len) => len,
                    None => sample_clipped(&self.system, &mut rng)?,
                };
                let system = prompts.text(&[Block {
                    key: mix(mix(seed, TAG_SYSTEM), a),
                    len,
                }]);
                let first = rng.random_range(0..TOOL_NAMES.len());
                let tools = (0..self.tools_per_agent as usize)
                    .map(|t| {
                        let name = TOOL_NAMES[(first + t) % TOOL_NAMES.len()];
                        let len = sample_clipped(&self.tool_description, &mut rng)?;
                        let key = mix(mix(mix(seed, TAG_TOOL), a), t as u64);
                        let description = prompts.text(&[Block { key, len }]);
                        Ok(FunctionTool {
                            name: name.to_string(),
                            description: description.trim().to_string(),
                            parameters: json!({
                                "type": "object",
                                "properties": {"query": {"type": "string",
                                    "description": "What to look for or act on."}},
                                "required": ["query"],
                            }),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Agent {
                    system: system.trim().to_string(),
                    tools,
                })
            })
            .collect()
    }

    /// The planned turns of sessions `turns[s]` long, drawn from `seed`: per session its
    /// agent (`prefix_group`) and task (the first turn's prompt), then per later turn the
    /// length of its tool results (its prompt: each call's result has it) and the answer's
    /// cap.
    pub fn turns(
        &self,
        turns: impl IntoIterator<Item = usize>,
        agents: u64,
        seed: u64,
    ) -> Result<Vec<Vec<RequestSpec>>> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut index = 0u64;
        turns
            .into_iter()
            .map(|turns| {
                let agent = rng.random_range(0..agents);
                (0..turns)
                    .map(|k| {
                        let dist = if k == 0 {
                            &self.task
                        } else {
                            &self.tool_result
                        };
                        let input_len = sample_clipped(dist, &mut rng)?;
                        let output_len = sample_clipped(&self.output, &mut rng)?;
                        index += 1;
                        Ok(RequestSpec {
                            input_len,
                            output_len,
                            prefix_group: Some(agent),
                            prompt: PromptSource::Blocks(prefixed_blocks(
                                seed, index, input_len, None,
                            )),
                            model: None,
                            class: None,
                        })
                    })
                    .collect()
            })
            .collect()
    }
}

/// The text of the result of the `call`-th tool call of a turn whose prompt is `source`:
/// each call's result has the drawn length and words of its own.
pub fn tool_result(source: &PromptSource, call: usize, prompts: &PromptBuilder) -> String {
    match source {
        PromptSource::Blocks(blocks) => {
            let keyed: Vec<Block> = blocks
                .iter()
                .map(|b| Block {
                    key: if call == 0 {
                        b.key
                    } else {
                        mix(b.key, call as u64)
                    },
                    len: b.len,
                })
                .collect();
            prompts.text(&keyed)
        }
        PromptSource::Text(text) => text.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(agents: u64) -> AgenticOptions {
        AgenticOptions {
            agents,
            system_len: None,
            max_input_len: None,
            max_output_len: Some(64),
        }
    }

    #[test]
    fn agents_differ_and_sessions_of_one_agent_share_its_prefix() {
        let prompts = PromptBuilder::approximate();
        let o = options(3);
        let p = AgenticProfile::new(&o).unwrap();
        let agents = p.agents(&o, 5, &prompts).unwrap();
        assert_eq!(agents.len(), 3);
        assert!(agents.iter().all(|a| a.tools.len() == 8));
        assert_ne!(agents[0].system, agents[1].system);
        // The same seed gives the same pool, word for word.
        assert_eq!(agents, p.agents(&o, 5, &prompts).unwrap());
        let names: std::collections::BTreeSet<_> =
            agents[0].tools.iter().map(|t| &t.name).collect();
        assert_eq!(names.len(), 8, "an agent's tools are distinct");
        let sessions = p.turns([4; 400], 3, 7).unwrap();
        for s in &sessions {
            assert_eq!(s.len(), 4);
            assert!(s.iter().all(|t| t.prefix_group == s[0].prefix_group));
            assert!(s.iter().all(|t| (16..=64).contains(&t.output_len)));
        }
        let used: std::collections::BTreeSet<_> =
            sessions.iter().map(|s| s[0].prefix_group).collect();
        assert_eq!(used.len(), 3, "every agent gets sessions");
        // Tool results (turns after the first) have the profile's median, about e^5.99 ≈ 400.
        let mut results: Vec<u32> = sessions
            .iter()
            .flat_map(|s| s[1..].iter().map(|t| t.input_len))
            .collect();
        results.sort_unstable();
        let median = results[results.len() / 2];
        assert!((340..470).contains(&median), "median tool result {median}");
        let r0 = tool_result(&sessions[0][1].prompt, 0, &prompts);
        let r1 = tool_result(&sessions[0][1].prompt, 1, &prompts);
        assert_ne!(r0, r1);
        assert_eq!(r0.split_whitespace().count(), r1.split_whitespace().count());
    }
}
