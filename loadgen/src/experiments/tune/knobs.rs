//! The knobs of `loadgen tune`: `--knob NAME=V1,V2,…` parsed, the server command template
//! checked against them (`{NAME}` for every knob, no placeholder without one; `{port}` is the
//! server's own) and filled in verbatim, and the configurations each strategy runs.
//!
//! One at a time (the methodology's way): every knob starts at its first value; the knobs are
//! varied in the order given, each over its values while the others hold the best found so
//! far (highest capacity; a tie keeps the value listed first). Grid: every combination, the
//! first knob varying slowest.

use anyhow::{bail, Result};
use reports::tune::Knobs;

use crate::spec::tune::Strategy;

/// One `--knob`: its name and values in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knob {
    pub name: String,
    pub values: Vec<String>,
}

fn valid_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Parses `NAME=V1,V2,…` (a value may be empty: the knob's text left out).
pub fn parse_knob(text: &str) -> Result<Knob> {
    let Some((name, values)) = text.split_once('=') else {
        bail!("--knob `{text}`: expected NAME=V1,V2,… (e.g. max-num-seqs=64,128,256)");
    };
    let name = name.trim();
    if !valid_name(name) || name == "port" {
        bail!(
            "--knob `{text}`: `{name}` is not a knob name (letters, digits, `_` and `-`, not \
             `port`, which is the server's own placeholder)"
        );
    }
    let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
    for (i, v) in values.iter().enumerate() {
        if values[..i].contains(v) {
            bail!("--knob {name}: the value `{v}` is listed twice");
        }
    }
    Ok(Knob {
        name: name.to_string(),
        values,
    })
}

/// The `{NAME}` placeholders of `template`, in order, `{port}` included.
fn placeholders(template: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if let Some(close) = rest.find('}') {
            let name = &rest[..close];
            if valid_name(name) {
                found.push(name);
                rest = &rest[close + 1..];
            }
        }
    }
    found
}

/// Refuses a knob the template does not name, a placeholder with no knob, and a knob given
/// twice.
pub fn check_template(template: &str, knobs: &[Knob]) -> Result<()> {
    let names = placeholders(template);
    for (i, knob) in knobs.iter().enumerate() {
        if knobs[..i].iter().any(|k| k.name == knob.name) {
            bail!("--knob {}: given twice", knob.name);
        }
        if !names.contains(&knob.name.as_str()) {
            bail!(
                "--knob {}: the --server-cmd template has no {{{}}} to put its values in",
                knob.name,
                knob.name
            );
        }
    }
    if let Some(orphan) = names
        .iter()
        .find(|n| **n != "port" && !knobs.iter().any(|k| k.name == **n))
    {
        bail!("--server-cmd: the placeholder {{{orphan}}} has no --knob {orphan}=…");
    }
    Ok(())
}

/// `template` with each knob's value in place of `{NAME}` (`{port}` left for the server start).
pub fn fill(template: &str, knobs: &Knobs) -> String {
    let mut command = template.to_string();
    for (name, value) in knobs {
        command = command.replace(&format!("{{{name}}}"), value);
    }
    command
}

/// Every knob at value index `choice[i]`.
fn pick(knobs: &[Knob], choice: &[usize]) -> Knobs {
    knobs
        .iter()
        .zip(choice)
        .map(|(k, &i)| (k.name.clone(), k.values[i].clone()))
        .collect()
}

/// Every combination, the first knob varying slowest.
pub fn grid(knobs: &[Knob]) -> Vec<Knobs> {
    let mut all = vec![Vec::new()];
    for knob in knobs {
        all = all
            .into_iter()
            .flat_map(|prefix: Vec<usize>| {
                (0..knob.values.len()).map(move |i| {
                    let mut choice = prefix.clone();
                    choice.push(i);
                    choice
                })
            })
            .collect();
    }
    all.iter().map(|choice| pick(knobs, choice)).collect()
}

/// How many configurations `strategy` runs.
pub fn count(strategy: Strategy, knobs: &[Knob]) -> usize {
    match strategy {
        Strategy::Grid => knobs.iter().map(|k| k.values.len()).product(),
        // A guided walk moves each knob one way, one value a step: at most as many.
        Strategy::OneAtATime | Strategy::Guided => {
            1 + knobs.iter().map(|k| k.values.len() - 1).sum::<usize>()
        }
    }
}

/// The next configuration of the one-at-a-time strategy after `ran` (each configuration run
/// so far with its capacity), or `None` when every knob has been varied.
pub fn one_at_a_time_next(knobs: &[Knob], ran: &[(Knobs, Option<f64>)]) -> Option<Knobs> {
    let mut best = vec![0; knobs.len()];
    for (k, knob) in knobs.iter().enumerate() {
        let mut best_value: Option<(usize, f64)> = None;
        for v in 0..knob.values.len() {
            let mut choice = best.clone();
            choice[k] = v;
            let candidate = pick(knobs, &choice);
            let Some((_, capacity)) = ran.iter().find(|(knobs, _)| *knobs == candidate) else {
                return Some(candidate);
            };
            if let Some(c) = capacity {
                if best_value.is_none_or(|(_, b)| *c > b) {
                    best_value = Some((v, *c));
                }
            }
        }
        if let Some((v, _)) = best_value {
            best[k] = v;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs() -> Vec<Knob> {
        vec![
            parse_knob("seqs=8,16,32").unwrap(),
            parse_knob("tokens=256,512").unwrap(),
        ]
    }

    fn config(seqs: &str, tokens: &str) -> Knobs {
        [("seqs", seqs), ("tokens", tokens)]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn knobs_and_templates_are_checked() {
        let prefix =
            parse_knob("prefix=--enable-prefix-caching,--no-enable-prefix-caching,").unwrap();
        assert_eq!(prefix.values.len(), 3, "an empty value leaves the knob out");
        assert!(parse_knob("seqs").is_err());
        assert!(parse_knob("port=1,2").is_err());
        assert!(parse_knob("9x=1").is_err());
        assert!(parse_knob("seqs=1,1").is_err());
        let template = "engine serve --port {port} --max-num-seqs {seqs} --tokens {tokens}";
        check_template(template, &knobs()).unwrap();
        let err = check_template("engine serve --max-num-seqs {seqs}", &knobs()).unwrap_err();
        assert!(err.to_string().contains("no {tokens}"), "{err}");
        let err = check_template("x {seqs} {tokens} {blocks}", &knobs()).unwrap_err();
        assert!(err.to_string().contains("{blocks} has no --knob"), "{err}");
        // JSON in a command is not a placeholder.
        check_template(r#"x {seqs} {tokens} --cfg '{"a": 1}'"#, &knobs()).unwrap();
        assert_eq!(
            fill(template, &config("16", "512")),
            "engine serve --port {port} --max-num-seqs 16 --tokens 512"
        );
    }

    #[test]
    fn grid_runs_every_combination_first_knob_slowest() {
        let all = grid(&knobs());
        assert_eq!(all.len(), 6);
        assert_eq!(all[0], config("8", "256"));
        assert_eq!(all[1], config("8", "512"));
        assert_eq!(all[5], config("32", "512"));
        assert_eq!(count(Strategy::Grid, &knobs()), 6);
    }

    #[test]
    fn one_at_a_time_varies_each_knob_around_the_best_so_far() {
        let knobs = knobs();
        assert_eq!(count(Strategy::OneAtATime, &knobs), 4);
        let capacity = |c: &Knobs| match (c["seqs"].as_str(), c["tokens"].as_str()) {
            ("8", _) => Some(2.0),
            ("16", "256") => Some(3.0),
            ("16", "512") => Some(3.5),
            ("32", _) => None,
            _ => unreachable!(),
        };
        let mut ran: Vec<(Knobs, Option<f64>)> = Vec::new();
        while let Some(next) = one_at_a_time_next(&knobs, &ran) {
            let c = capacity(&next);
            ran.push((next, c));
        }
        let order: Vec<Knobs> = ran.into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            order,
            vec![
                config("8", "256"),
                config("16", "256"),
                config("32", "256"),
                config("16", "512"),
            ]
        );
    }

    #[test]
    fn a_tie_keeps_the_value_listed_first() {
        let knobs = vec![parse_knob("a=1,2").unwrap(), parse_knob("b=x,y").unwrap()];
        let ran: Vec<(Knobs, Option<f64>)> = vec![
            (pick(&knobs, &[0, 0]), Some(5.0)),
            (pick(&knobs, &[1, 0]), Some(5.0)),
        ];
        assert_eq!(
            one_at_a_time_next(&knobs, &ran),
            Some(pick(&knobs, &[0, 1]))
        );
    }
}
