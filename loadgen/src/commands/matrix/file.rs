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
use clap::{ArgMatches, Args, Command, FromArgMatches};
use reports::matrix::Expectation;

use crate::commands::sweep::SweepArgs;
use crate::options::RunArgs;

/// The matrix the `methodology` preset writes and runs.
pub const METHODOLOGY_PRESET: &str = include_str!("../../../presets/methodology.toml");

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
}

/// A row's options, parsed with the matrix's defaults.
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

fn run_command() -> Command {
    RunArgs::augment_args(Command::new("row"))
        .no_binary_name(true)
        .args_override_self(true)
}

fn search_command() -> Command {
    SweepArgs::augment_args(Command::new("row"))
        .no_binary_name(true)
        .args_override_self(true)
}

impl RowSpec {
    /// "row `decode`" or "row 3" (its position, where it has no name).
    pub fn label(&self) -> String {
        label(&self.name, self.position)
    }

    /// The row's options after `defaults` (the matrix's own run options as words), parsed
    /// as `loadgen run` (or `sweep --rates search`) would parse them.
    pub fn args(&self, defaults: &[String]) -> Result<RowArgs> {
        let mut words: Vec<String> = if self.search {
            // A search sets each level's rate: a default rate would conflict.
            defaults
                .iter()
                .filter(|w| {
                    !["--rate=", "--target-rate=", "--concurrency="]
                        .iter()
                        .any(|f| w.starts_with(f))
                })
                .cloned()
                .collect()
        } else {
            defaults.to_vec()
        };
        words.extend(self.options.iter().cloned());
        let given = |flag: &str| {
            words
                .iter()
                .any(|w| w == flag || w.starts_with(&format!("{flag}=")))
        };
        let label = self.label();
        let replay = words.iter().any(|w| w == "--arrival=trace");
        if !self.search && !given("--rate") && !given("--concurrency") && !replay {
            bail!("{label}: no load: give `rate` (requests/s), `concurrency` or `rates = \"search\"` (in the row, or as the matrix's --rate / --concurrency)");
        }
        if self.search && !given("--slo") {
            bail!("{label}: a knee search needs an SLO: the row's `slo` (e.g. \"ttft:p90:2s,tpot:p90:100ms\") or the matrix's --slo");
        }
        if !given("--duration") && !given("--num-prompts") {
            bail!("{label}: give `duration` or `num-prompts` (in the row, or as the matrix's --duration / --num-prompts): how much of the load to measure");
        }
        let parsed = if self.search {
            words.push("--rates=search".into());
            search_command()
                .try_get_matches_from(&words)
                .and_then(|m| SweepArgs::from_arg_matches(&m))
                .map(|a| RowArgs::Search(Box::new(a)))
        } else {
            run_command()
                .try_get_matches_from(&words)
                .and_then(|m| RunArgs::from_arg_matches(&m))
                .map(|a| RowArgs::Run(Box::new(a)))
        };
        parsed.map_err(|e| anyhow::anyhow!("{}: {}", self.label(), clap_message(&e)))
    }
}

fn label(name: &str, position: usize) -> String {
    if name.is_empty() {
        format!("row {position}")
    } else {
        format!("row `{name}`")
    }
}

/// clap's message without its "error: " and usage lines.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.trim_start_matches("error: ").to_string()
}

/// The words of the run options given on the matrix's own command line (`matches`), which
/// every row starts from; `--url` and `--out` are the matrix's and are left out.
pub fn given_run_options(matches: &ArgMatches) -> Vec<String> {
    let command = run_command();
    let mut words = Vec::new();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "url" | "out")
            || !matches!(
                matches.value_source(id),
                Some(
                    clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable
                )
            )
        {
            continue;
        }
        if !arg.get_action().takes_values() {
            words.push(format!("--{long}"));
            continue;
        }
        let Ok(Some(occurrences)) = matches.try_get_raw_occurrences(id) else {
            continue;
        };
        for values in occurrences {
            for value in values {
                words.push(format!("--{long}={}", value.to_string_lossy()));
            }
        }
    }
    words
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
    command
        .clone()
        .try_get_matches_from(words)
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("{}", clap_message(&e)))
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
    let run = run_command();
    let search = search_command();
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
            .unwrap();
        let run = args.run();
        assert_eq!((run.random_input_len, run.random_output_len), (16, 8));
        assert_eq!(run.rate, 2.5, "the row's value wins over the default");
        assert_eq!(run.seed, 7, "the default holds where the row is silent");
        let second = rows[1].args(&["--header=X-Z: 0".into()]).unwrap();
        assert_eq!(second.run().headers, ["X-Z: 0", "X-A: 1", "X-B: 2"]);
        assert!(second.run().no_ignore_eos && !second.run().min_tokens);
        assert_eq!(second.run().concurrency, Some(4));
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
        let row_refused = |text: &str, defaults: &[&str]| {
            let defaults: Vec<String> = defaults.iter().map(|d| d.to_string()).collect();
            let rows = parse_matrix(text, "m.toml").unwrap();
            rows[0].args(&defaults).err().map(|e| format!("{e:#}"))
        };
        let no_length = row_refused("[[row]]\nrate = 1\n", &[]).unwrap();
        assert!(no_length.contains("row 1: give `duration`"), "{no_length}");
        assert!(row_refused("[[row]]\nrate = 1\n", &["--duration=5s"]).is_none());
        let no_load = row_refused("[[row]]\nduration = \"1s\"\n", &[]).unwrap();
        assert!(no_load.contains("row 1: no load"), "{no_load}");
        assert!(row_refused("[[row]]\nduration = \"1s\"\n", &["--rate=3"]).is_none());
        let search = "[[row]]\nrates = \"search\"\nduration = \"1s\"\n";
        assert!(row_refused(search, &[])
            .unwrap()
            .contains("a knee search needs an SLO"));
        assert!(row_refused(search, &["--slo=ttft:p90:1s"]).is_none());
        assert!(refused("[[rows]]\nrate = 1\n").contains("unknown top-level key `rows`"));
        assert!(refused("x = 1").contains("unknown top-level key `x`"));
        assert!(refused("").contains("no [[row]] table"));
        let twice = format!("{base}{base}");
        assert!(refused(&twice).contains("used by an earlier row"));
        // Cross-option problems surface when the row is parsed with the defaults.
        let rows = parse_matrix(
            "[[row]]\nname = \"s\"\nrates = \"search\"\nslo = \"ttft:p90:1s\"\nduration = \"1s\"\nprecision = 0.2\n",
            "m.toml",
        )
        .unwrap();
        let RowArgs::Search(sweep) = rows[0].args(&["--rate=3".into()]).unwrap() else {
            panic!("a search row");
        };
        assert_eq!(sweep.search.precision, Some(0.2));
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
            let args = row.args(&[]).unwrap();
            assert!(args.run().duration.is_some(), "{}", row.label());
        }
    }
}
