//! The matrix file of `loadgen matrix`: `[[row]]` tables, each a workload with its question,
//! hypothesis and expectations, checked whole before anything runs.
//!
//! A row's keys are the matrix's own (`name`, `question`, `hypothesis`, `prefix`, `expect`,
//! `rates = "search"`) and `loadgen run`'s options by their long names (`random-input-len`,
//! `duration`, `rate`, `concurrency`, `slo`, …; `_` may stand for `-`); a knee-search row
//! also takes the search's (`precision`, `max-levels`, `min-rate`, `max-rate`,
//! `probe-duration`, `probe-max-concurrency`, `min-requests`). Each value is checked by the
//! same parser as its command-line flag, so a row is refused for what `loadgen run` would
//! refuse, naming the row and the key.

use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::{Args, Command, FromArgMatches};
use reports::matrix::Expectation;

use crate::spec::run_args::RunArgs;
use crate::spec::sweep::SweepArgs;

/// The matrix the `methodology` preset writes and runs.
pub const METHODOLOGY_PRESET: &str = include_str!("../../presets/methodology.toml");

/// Whether a row's prefixes are in the server's cache when its window opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefix {
    /// Nothing of the row was sent before: its prompts' words are fresh (`--prompt-salt`).
    Cold,
    /// Each shared prefix of the row is sent once, alone, before its window.
    Warm,
}

impl Prefix {
    pub fn name(self) -> &'static str {
        match self {
            Prefix::Cold => "cold",
            Prefix::Warm => "warm",
        }
    }
}

/// One `[[row]]`, checked.
#[derive(Debug, Clone)]
pub struct RowSpec {
    /// 1-based position in the file.
    pub position: usize,
    pub name: String,
    pub question: String,
    pub hypothesis: String,
    pub prefix: Prefix,
    pub expect: Vec<Expectation>,
    /// `rates = "search"`: a knee search under the row's SLO instead of one run.
    pub search: bool,
    /// The row's run (and search) options as command-line words, `--key=value`.
    pub options: Vec<String>,
    /// The long names of the options the row sets (a flag set false too).
    pub set: Vec<String>,
}

/// A row's options, parsed with the matrix's defaults.
#[derive(Clone)]
pub enum RowArgs {
    Run(Box<RunArgs>),
    Search(Box<SweepArgs>),
}

impl RowArgs {
    pub fn run(&self) -> &RunArgs {
        match self {
            RowArgs::Run(run) => run,
            RowArgs::Search(sweep) => &sweep.run,
        }
    }

    pub fn run_mut(&mut self) -> &mut RunArgs {
        match self {
            RowArgs::Run(run) => run,
            RowArgs::Search(sweep) => &mut sweep.run,
        }
    }
}

/// The matrix's own keys of a row.
const ROW_KEYS: [&str; 6] = [
    "name",
    "question",
    "hypothesis",
    "prefix",
    "expect",
    "rates",
];
/// The search options a knee-search row may set.
const SEARCH_KEYS: [&str; 7] = [
    "precision",
    "max-levels",
    "min-rate",
    "max-rate",
    "probe-duration",
    "probe-max-concurrency",
    "min-requests",
];
/// Run options the matrix sets itself.
const MATRIX_SET: [(&str, &str); 5] = [
    ("url", "the matrix's --url or --server-cmd"),
    ("out", "the matrix's --out (each row gets its own folder)"),
    ("shard", "run and sweep (a matrix runs whole)"),
    ("start-at", "run and sweep (a matrix runs whole)"),
    (
        "fail-on-slo",
        "run and sweep (a matrix's rows are judged by their `expect`)",
    ),
];

/// The command that parses a row's words as `A`'s flags, a later word overriding an earlier.
pub fn row_command<A: Args>() -> Command {
    A::augment_args(Command::new("row"))
        .no_binary_name(true)
        .args_override_self(true)
}

/// The two loads, one of which a row that sets either replaces whole.
const LOAD_KEYS: [&str; 2] = ["rate", "concurrency"];

/// A row's options parsed with the matrix's defaults, and the flags given either way.
pub struct ParsedRow {
    pub args: RowArgs,
    /// The long names of the flags given, by the row or as the matrix's defaults.
    pub given: Vec<String>,
}

impl ParsedRow {
    pub fn gave(&self, long: &str) -> bool {
        self.given.iter().any(|g| g == long)
    }
}

/// The long name of a `--long` or `--long=value` word.
fn long_of(word: &str) -> &str {
    let flag = word.trim_start_matches("--");
    flag.split_once('=').map_or(flag, |(long, _)| long)
}

impl RowSpec {
    /// "row `decode`" or "row 3" (its position, where it has no name).
    pub fn label(&self) -> String {
        label(&self.name, self.position)
    }

    /// The row's name, or "row N" where it has none.
    pub fn display_name(&self) -> String {
        if self.name.is_empty() {
            format!("row {}", self.position)
        } else {
            self.name.clone()
        }
    }

    /// The row's options after `defaults` (the matrix's own run options as words), parsed
    /// as `loadgen run` (or `sweep --rates search`) would parse them. A key the row sets
    /// replaces the default whole (a list of headers too, a flag set false too); a row that
    /// sets `rate` or `concurrency`, or searches, replaces the default load.
    pub fn args(&self, defaults: &[String]) -> Result<ParsedRow> {
        let sets_load = self.search || self.set.iter().any(|k| LOAD_KEYS.contains(&k.as_str()));
        let mut words: Vec<String> = defaults
            .iter()
            .filter(|w| {
                let long = long_of(w);
                let replaced = self.set.iter().any(|k| k == long)
                    || (sets_load && LOAD_KEYS.contains(&long))
                    || (self.search && long == "target-rate");
                !replaced
            })
            .cloned()
            .collect();
        words.extend(self.options.iter().cloned());
        let given: Vec<String> = words.iter().map(|w| long_of(w).to_string()).collect();
        let parsed = if self.search {
            words.push("--rates=search".into());
            row_command::<SweepArgs>()
                .try_get_matches_from(&words)
                .and_then(|m| SweepArgs::from_arg_matches(&m))
                .map(|a| RowArgs::Search(Box::new(a)))
        } else {
            row_command::<RunArgs>()
                .try_get_matches_from(&words)
                .and_then(|m| RunArgs::from_arg_matches(&m))
                .map(|a| RowArgs::Run(Box::new(a)))
        };
        let args = parsed.map_err(|e| {
            let key = e
                .get(clap::error::ContextKind::InvalidArg)
                .map(|arg| arg.to_string())
                .map(|arg| format!(", key `{}`", long_of(arg.split(' ').next().unwrap_or(""))))
                .unwrap_or_default();
            anyhow::anyhow!("{}{key}: {}", self.label(), clap_message(&e))
        })?;
        Ok(ParsedRow { args, given })
    }
}

fn label(name: &str, position: usize) -> String {
    if name.is_empty() {
        format!("row {position}")
    } else {
        format!("row `{name}`")
    }
}

/// clap's message without its "error: " prefix and its usage and help lines.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    text.lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information")
        })
        .map(|l| l.trim_start_matches("error: "))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A TOML value as the words of `--long`: `None` for a flag set to false.
fn value_words(arg: &clap::Arg, long: &str, value: &toml::Value) -> Result<Vec<String>> {
    let takes_values = arg.get_action().takes_values();
    let scalar = |v: &toml::Value| -> Result<String> {
        Ok(match v {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            other => bail!("expected a string or a number, not {}", other.type_str()),
        })
    };
    match value {
        toml::Value::Boolean(on) if !takes_values => Ok(if *on {
            vec![format!("--{long}")]
        } else {
            Vec::new()
        }),
        _ if !takes_values => bail!("a flag: give true or false"),
        toml::Value::Array(items) => {
            if !matches!(arg.get_action(), clap::ArgAction::Append) {
                bail!("takes one value, not a list");
            }
            items
                .iter()
                .map(|v| Ok(format!("--{long}={}", scalar(v)?)))
                .collect()
        }
        v => Ok(vec![format!("--{long}={}", scalar(v)?)]),
    }
}

/// Checks one `--key=value` word alone with `command`, as a command line holding only it.
fn check_value(command: &Command, word: &str, search: bool) -> Result<()> {
    let mut words = vec![word];
    if search {
        words.push("--rates=search");
    }
    match command.clone().try_get_matches_from(words) {
        // Relations between flags (`requires`) are checked when the row is parsed whole.
        Err(e) if e.kind() == clap::error::ErrorKind::MissingRequiredArgument => Ok(()),
        Err(e) => Err(anyhow::anyhow!("{}", clap_message(&e))),
        Ok(_) => Ok(()),
    }
}

fn string(value: &toml::Value) -> Result<String> {
    value
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("expected a string, not {}", value.type_str()))
}

/// Parses and checks a matrix file's text; `source` names it in errors.
pub fn parse_matrix(text: &str, source: &str) -> Result<Vec<RowSpec>> {
    let table: toml::Table =
        toml::from_str(text).with_context(|| format!("{source}: not a valid TOML file"))?;
    if let Some(key) = table.keys().find(|k| k.as_str() != "row") {
        bail!("{source}: unknown top-level key `{key}`: a matrix file holds only [[row]] tables");
    }
    let rows = match table.get("row") {
        Some(toml::Value::Array(rows)) if !rows.is_empty() => rows,
        Some(toml::Value::Array(_)) | None => {
            bail!("{source}: no [[row]] table: a matrix needs at least one row")
        }
        Some(other) => bail!(
            "{source}: `row` must be an array of tables ([[row]]), not {}",
            other.type_str()
        ),
    };
    let mut specs: Vec<RowSpec> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let position = i + 1;
        let toml::Value::Table(row) = row else {
            bail!("{source}: row {position} is not a table");
        };
        let spec = parse_row(row, position).with_context(|| source.to_string())?;
        if !spec.name.is_empty() && specs.iter().any(|s| s.name == spec.name) {
            bail!(
                "{source}: {}: the name is used by an earlier row",
                spec.label()
            );
        }
        specs.push(spec);
    }
    Ok(specs)
}

fn parse_row(row: &toml::Table, position: usize) -> Result<RowSpec> {
    let name = row.get("name").map(string).transpose();
    let name = name.map_err(|e| anyhow::anyhow!("row {position}, key `name`: {e}"))?;
    let mut spec = RowSpec {
        position,
        name: name.unwrap_or_default(),
        question: String::new(),
        hypothesis: String::new(),
        prefix: Prefix::Cold,
        expect: Vec::new(),
        search: false,
        options: Vec::new(),
        set: Vec::new(),
    };
    let label = spec.label();
    let fail = |key: &str, e: anyhow::Error| anyhow::anyhow!("{label}, key `{key}`: {e:#}");
    spec.search = match row.get("rates") {
        None => false,
        Some(v) => match string(v).map_err(|e| fail("rates", e))?.as_str() {
            "search" => true,
            other => {
                return Err(fail(
                    "rates",
                    anyhow::anyhow!("`{other}`: a row runs one load (`rate` or `concurrency`) or a knee search (`rates = \"search\"`)"),
                ))
            }
        },
    };
    let run = row_command::<RunArgs>();
    let search = row_command::<SweepArgs>();
    let mut keys: Vec<String> = Vec::new();
    for (raw_key, value) in row {
        let key = raw_key.replace('_', "-");
        if keys.contains(&key) {
            return Err(fail(
                raw_key,
                anyhow::anyhow!("given twice (as `-` and `_`)"),
            ));
        }
        keys.push(key.clone());
        match key.as_str() {
            "name" | "rates" => continue,
            "question" => spec.question = string(value).map_err(|e| fail(raw_key, e))?,
            "hypothesis" => spec.hypothesis = string(value).map_err(|e| fail(raw_key, e))?,
            "prefix" => {
                spec.prefix = match string(value).map_err(|e| fail(raw_key, e))?.as_str() {
                    "cold" => Prefix::Cold,
                    "warm" => Prefix::Warm,
                    other => return Err(fail(raw_key, anyhow::anyhow!("`{other}`: cold or warm"))),
                }
            }
            "expect" => {
                let statements: Vec<String> = match value {
                    toml::Value::Array(items) => items
                        .iter()
                        .map(string)
                        .collect::<Result<_>>()
                        .map_err(|e| fail(raw_key, e))?,
                    other => vec![string(other).map_err(|e| fail(raw_key, e))?],
                };
                for statement in statements {
                    spec.expect
                        .push(Expectation::parse(&statement).map_err(|e| fail(raw_key, e))?);
                }
            }
            _ => {
                if let Some((_, why)) = MATRIX_SET.iter().find(|(k, _)| *k == key) {
                    return Err(fail(raw_key, anyhow::anyhow!("set by {why}")));
                }
                let in_run = run
                    .get_arguments()
                    .find(|a| a.get_long() == Some(key.as_str()));
                let (command, arg, is_search) = match in_run {
                    Some(arg) => (&run, arg, false),
                    None if SEARCH_KEYS.contains(&key.as_str()) => {
                        if !spec.search {
                            return Err(fail(
                                raw_key,
                                anyhow::anyhow!(
                                    "a knee-search option: give `rates = \"search\"` too"
                                ),
                            ));
                        }
                        let arg = search
                            .get_arguments()
                            .find(|a| a.get_long() == Some(key.as_str()))
                            .expect("every search key is a sweep option");
                        (&search, arg, true)
                    }
                    None => {
                        return Err(fail(
                            raw_key,
                            anyhow::anyhow!(
                                "unknown key: neither a matrix key ({}) nor a `loadgen run` option",
                                ROW_KEYS.join(", ")
                            ),
                        ))
                    }
                };
                let words = value_words(arg, &key, value).map_err(|e| fail(raw_key, e))?;
                for word in &words {
                    check_value(command, word, is_search).map_err(|e| fail(raw_key, e))?;
                }
                spec.options.extend(words);
                spec.set.push(key.clone());
            }
        }
    }
    let has = |k: &str| keys.iter().any(|key| key == k);
    let loads = ["rate", "concurrency", "rates"]
        .iter()
        .filter(|k| has(k))
        .count();
    if loads > 1 {
        bail!("{label}: give one load: `rate`, `concurrency` or `rates = \"search\"`");
    }
    if let Some(e) = spec.expect.iter().find(|e| e.is_capacity() && !spec.search) {
        bail!("{label}, key `expect`: `{e}` is about a knee search's capacity: give `rates = \"search\"` too");
    }
    Ok(spec)
}

/// Reads and checks a matrix file.
pub fn read_matrix(path: &Path) -> Result<Vec<RowSpec>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_matrix(&text, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        format!("{:#}", parse_matrix(text, "m.toml").unwrap_err())
    }

    const GOOD: &str = r#"
[[row]]
name = "short"
question = "q"
hypothesis = "h"
workload = "random"
random_input_len = 16
random-output-len = 8
rate = 2.5
duration = "2s"
expect = ["ttft:p50 < 1s", "regime != queueing"]

[[row]]
concurrency = 4
num-prompts = 10
header = ["X-A: 1", "X-B: 2"]
no-ignore-eos = true
min-tokens = false
"#;

    #[test]
    fn rows_become_run_options_checked_by_their_own_parsers() {
        let rows = parse_matrix(GOOD, "m.toml").unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].label(), "row `short`");
        assert_eq!(rows[1].label(), "row 2");
        assert_eq!(rows[0].expect.len(), 2);
        let args = rows[0]
            .args(&["--seed=7".into(), "--rate=9".into()])
            .unwrap()
            .args;
        let run = args.run();
        assert_eq!((run.random_input_len, run.random_output_len), (16, 8));
        assert_eq!(run.rate, 2.5, "the row's value wins over the default");
        assert_eq!(run.seed, 7, "the default holds where the row is silent");
        let defaults: Vec<String> = ["--header=X-Z: 0", "--min-tokens", "--rate=3", "--seed=1"]
            .iter()
            .map(|w| w.to_string())
            .collect();
        let second = rows[1].args(&defaults).unwrap();
        let run = second.args.run();
        assert_eq!(
            run.headers,
            ["X-A: 1", "X-B: 2"],
            "the row's list replaces the default's"
        );
        assert!(run.no_ignore_eos);
        assert!(!run.min_tokens, "a flag the row sets false is off");
        assert_eq!(run.concurrency, Some(4));
        assert!(
            !second.gave("rate"),
            "the row's load replaces the default load"
        );
        assert!(second.gave("seed") && second.gave("concurrency"));
        // A default closed loop does not override a row's rate.
        let first = rows[0].args(&["--concurrency=8".into()]).unwrap();
        assert_eq!(first.args.run().concurrency, None);
    }

    #[test]
    fn a_bad_row_is_refused_naming_the_row_and_the_key() {
        let base = "[[row]]\nname = \"b\"\nrate = 1\nduration = \"1s\"\n";
        for (extra, says) in [
            (
                "random-input-lenn = 5",
                "row `b`, key `random-input-lenn`: unknown key",
            ),
            (
                "random-input-len = -5",
                "row `b`, key `random-input-len`: invalid value '-5'",
            ),
            (
                "expect = [\"ttft:p95 < 1 parsec\"]",
                "row `b`, key `expect`",
            ),
            ("prefix = \"tepid\"", "row `b`, key `prefix`: `tepid`"),
            ("url = \"http://x\"", "row `b`, key `url`: set by"),
            (
                "precision = 0.1",
                "row `b`, key `precision`: a knee-search option",
            ),
            ("no-ignore-eos = 1", "row `b`, key `no-ignore-eos`: a flag"),
            ("rates = \"1,2\"", "row `b`, key `rates`"),
            ("concurrency = 2", "row `b`: give one load"),
            (
                "expect = \"capacity > 2\"",
                "about a knee search's capacity",
            ),
        ] {
            let err = refused(&format!("{base}{extra}\n"));
            assert!(err.contains(says), "{extra}: {err}");
        }
        let err = refused("[[row]]\nrate = 1\nduration = \"1s\"\nbogus = 1\n");
        assert!(err.contains("row 1, key `bogus`"), "{err}");
        // Cross-option problems surface when the row is parsed with the defaults.
        let rows = parse_matrix(
            "[[row]]\nname = \"s\"\nrates = \"search\"\nslo = \"ttft:p90:1s\"\nduration = \"1s\"\nprecision = 0.2\n",
            "m.toml",
        )
        .unwrap();
        let RowArgs::Search(sweep) = rows[0].args(&["--rate=3".into()]).unwrap().args else {
            panic!("a search row");
        };
        assert_eq!(sweep.search.precision, Some(0.2));
        // A flag that requires another is checked with the row whole.
        let dtype = "[[row]]\nrate = 1\nduration = \"1s\"\nweight-dtype = \"fp8\"\n";
        let rows = parse_matrix(dtype, "m.toml").unwrap();
        let err = format!("{:#}", rows[0].args(&[]).err().unwrap());
        assert!(
            err.contains("row 1") && err.contains("--model-config"),
            "{err}"
        );
        let with_config = format!("{dtype}model-config = \"c.json\"\n");
        let rows = parse_matrix(&with_config, "m.toml").unwrap();
        assert!(rows[0].args(&[]).is_ok());
        assert_eq!(sweep.rates, "search");
    }

    #[test]
    fn the_methodology_preset_holds_six_rows_that_parse() {
        let rows = parse_matrix(METHODOLOGY_PRESET, "preset").unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names.len(), 6);
        assert!(rows
            .iter()
            .all(|r| !r.question.is_empty() && !r.hypothesis.is_empty() && !r.expect.is_empty()));
        assert_eq!(rows.iter().filter(|r| r.prefix == Prefix::Warm).count(), 1);
        for row in &rows {
            let parsed = row.args(&[]).unwrap();
            assert!(parsed.args.run().duration.is_some(), "{}", row.label());
        }
    }
}
