//! `tune --strategy guided`: one knob at a time, moved by the diagnosis. From every knob at
//! its first value, each step reads the regime of the configuration's failing bracket end
//! (the lowest rate that broke the SLO), takes the knob whose role that regime names
//! (`reports::knob_roles`) one value in its direction, and keeps the move only when the
//! capacity improves beyond its interval (`reports::tune::results::move_improves`). The walk
//! stops when the regime names no knob of the list, a move fails to improve, or a value list
//! ends; each step, the stop included, is written to `tune.json`'s `steps`.

use std::path::Path;

use anyhow::{bail, Result};
use reports::diagnosis::Regime;
use reports::folders::run_diagnosis;
use reports::knob_roles::{regime_moves, role_of_flag, Direction, KnobRole};
use reports::tune::results::move_improves;
use reports::tune::{ConfigStatus, Knobs, TuneFile, TuneStep};

use super::knobs::Knob;

/// How a guided tune judges a move.
pub struct Guide {
    /// Each knob's role (`None`: the walk cannot move it).
    pub roles: Vec<Option<KnobRole>>,
    pub repeats: u32,
    pub alpha: f64,
    pub min_effect: f64,
}

/// The flag written just before `{name}` in `template` (`--max-num-seqs {seqs}` or
/// `--max-num-seqs={seqs}`).
fn flag_before<'t>(template: &'t str, name: &str) -> Option<&'t str> {
    let at = template.find(&format!("{{{name}}}"))?;
    let before = &template[..at];
    match before.strip_suffix('=') {
        Some(joined) => joined.split_whitespace().last(),
        None => before.split_whitespace().last(),
    }
}

/// Each knob's role: its `--knob-role NAME=ROLE`, else the role of the flag before `{NAME}`
/// in the template (the server tables of `reports::knob_roles`). A `--knob-role` naming no
/// knob or no role is refused.
pub fn knob_roles(
    template: &str,
    knobs: &[Knob],
    overrides: &[String],
) -> Result<Vec<Option<KnobRole>>> {
    let mut roles: Vec<Option<KnobRole>> = knobs
        .iter()
        .map(|k| flag_before(template, &k.name).and_then(role_of_flag))
        .collect();
    for text in overrides {
        let Some((name, role)) = text.split_once('=') else {
            bail!("--knob-role `{text}`: expected NAME=ROLE (e.g. slots=concurrency)");
        };
        let Some(index) = knobs.iter().position(|k| k.name == name.trim()) else {
            bail!("--knob-role `{text}`: no --knob is named `{}`", name.trim());
        };
        let Some(role) = KnobRole::named(role) else {
            let names: Vec<&str> = KnobRole::ALL.iter().map(|r| r.name()).collect();
            bail!(
                "--knob-role `{text}`: `{}` is not a role ({})",
                role.trim(),
                names.join(", ")
            );
        };
        roles[index] = Some(role);
    }
    Ok(roles)
}

/// The value after `current` in `values` in `direction`, by number: the nearest above
/// (`Up`) or below (`Down`); `Err` says why there is none.
fn next_value(values: &[String], current: &str, direction: Direction) -> Result<String, String> {
    let number = |v: &str| v.trim().parse::<f64>().ok();
    let Some(now) = number(current) else {
        return Err(format!(
            "its value `{current}` is not a number, so it has no direction"
        ));
    };
    let candidates = values.iter().filter_map(|v| Some((number(v)?, v)));
    let next = match direction {
        Direction::Up => candidates
            .filter(|(x, _)| *x > now)
            .min_by(|a, b| a.0.total_cmp(&b.0)),
        Direction::Down => candidates
            .filter(|(x, _)| *x < now)
            .max_by(|a, b| a.0.total_cmp(&b.0)),
    };
    next.map(|(_, v)| v.clone()).ok_or_else(|| {
        format!(
            "its values end at {current} going {}",
            match direction {
                Direction::Up => "up",
                Direction::Down => "down",
            }
        )
    })
}

/// The regime and evidence at the failing end of the search of the configuration at
/// `index`; `Err` says why there is none.
fn failing_end(out: &Path, file: &TuneFile, index: usize) -> Result<(Regime, String), String> {
    let config = &file.configurations[index];
    if config.status != ConfigStatus::Ok {
        return Err(format!(
            "{} did not run to the end of its search",
            config.dir
        ));
    }
    let Some(end) = config.search.as_ref().and_then(|s| s.bracket().upper) else {
        return Err(format!(
            "{}'s search found no rate that broke the SLO",
            config.dir
        ));
    };
    let level = out.join(&config.dir).join("sweep").join(&end.dir);
    match run_diagnosis(&level) {
        Ok(Some(d)) => Ok((
            d.regime,
            format!("at {:.3} req/s ({}): {}", end.rate, end.dir, d.evidence),
        )),
        Ok(None) => Err(format!("{} holds no diagnosis", level.display())),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// The configuration the walk stands on after `steps`: the last one whose move was kept,
/// else the first (each moving step ran one configuration, in order).
fn base_index(steps: &[TuneStep]) -> usize {
    let mut base = 0;
    let mut moved = 0;
    for step in steps.iter().filter(|s| s.to.is_some()) {
        moved += 1;
        if step.kept == Some(true) {
            base = moved;
        }
    }
    base
}

/// The walk's end against its start, for the comparison that closes the tune: (the
/// configuration it ended on, the first), each when it met the SLO, the first left out when
/// the walk never moved from it.
pub fn end_and_start(file: &TuneFile) -> (Option<usize>, Option<usize>) {
    let met = |i: usize| {
        file.configurations
            .get(i)
            .is_some_and(|c| c.status == ConfigStatus::Ok && c.capacity.is_some())
    };
    let end = base_index(&file.steps);
    (met(end).then_some(end), (end != 0 && met(0)).then_some(0))
}

/// The next configuration of the guided walk, or `None` when it stops; settles the pending
/// move's `kept` and adds the step it takes (or the stop) to `file.steps`.
pub fn next(out: &Path, knobs: &[Knob], file: &mut TuneFile, guide: &Guide) -> Option<Knobs> {
    if file.configurations.is_empty() {
        return Some(
            knobs
                .iter()
                .map(|k| (k.name.clone(), k.values[0].clone()))
                .collect(),
        );
    }
    if let Some(pending) = file
        .steps
        .iter()
        .rposition(|s| s.kept.is_none() && s.to.is_some())
    {
        let from = base_index(&file.steps[..pending]);
        let moved = file.configurations.len() - 1;
        let (kept, why) = move_improves(
            &file.configurations[from],
            &file.configurations[moved],
            guide.repeats,
            guide.alpha,
            guide.min_effect,
        );
        let step = &mut file.steps[pending];
        step.kept = Some(kept);
        step.why = why;
        if !kept {
            return None;
        }
    }
    let base = base_index(&file.steps);
    let config = &file.configurations[base];
    let mut step = TuneStep {
        knobs: config.knobs.clone(),
        base: config.dir.clone(),
        regime: None,
        evidence: String::new(),
        knob: None,
        from: None,
        to: None,
        kept: None,
        why: String::new(),
    };
    let (regime, evidence) = match failing_end(out, file, base) {
        Ok(found) => found,
        Err(why) => {
            step.why = format!("stopped: {why}");
            file.steps.push(step);
            return None;
        }
    };
    step.regime = Some(regime);
    step.evidence = evidence;
    let moves = regime_moves(regime);
    if moves.is_empty() {
        step.why = format!(
            "stopped: {regime} names no server knob ({})",
            regime.knob_to_try()
        );
        file.steps.push(step);
        return None;
    }
    // The first knob, of the roles the regime names in its order, that can move one value.
    let mut ends = Vec::new();
    for &(role, direction) in moves {
        for (index, _) in guide
            .roles
            .iter()
            .enumerate()
            .filter(|(_, r)| **r == Some(role))
        {
            let knob = &knobs[index];
            let current = config.knobs.get(&knob.name).cloned().unwrap_or_default();
            match next_value(&knob.values, &current, direction) {
                Ok(to) => {
                    let mut next = config.knobs.clone();
                    next.insert(knob.name.clone(), to.clone());
                    step.knob = Some(knob.name.clone());
                    step.from = Some(current);
                    step.to = Some(to);
                    file.steps.push(step);
                    return Some(next);
                }
                Err(why) => ends.push(format!("--knob {}: {why}", knob.name)),
            }
        }
    }
    let roles: Vec<&str> = moves.iter().map(|(r, _)| r.name()).collect();
    step.why = if ends.is_empty() {
        format!(
            "stopped: {regime} asks for the {} knob ({}), and no --knob has that role (the \
             server tables, or --knob-role NAME={})",
            roles.join(" or "),
            regime.knob_to_try(),
            roles[0]
        )
    } else {
        format!("stopped: {}", ends.join("; "))
    };
    file.steps.push(step);
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knob(name: &str, values: &[&str]) -> Knob {
        Knob {
            name: name.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn roles_come_from_the_flags_or_the_user() {
        let knobs = [
            knob("seqs", &["8", "16"]),
            knob("budget", &["512", "256"]),
            knob("slots", &["1", "2"]),
        ];
        let template = "engine serve --port {port} --max-num-seqs {seqs} \
                        --max-num-batched-tokens={budget} --x {slots}";
        let roles = knob_roles(template, &knobs, &[]).unwrap();
        assert_eq!(
            roles,
            [
                Some(KnobRole::Concurrency),
                Some(KnobRole::TokenBudget),
                None
            ]
        );
        let roles = knob_roles(template, &knobs, &["slots=concurrency".into()]).unwrap();
        assert_eq!(roles[2], Some(KnobRole::Concurrency));
        let err = knob_roles(template, &knobs, &["slots=speed".into()]).unwrap_err();
        assert!(err.to_string().contains("`speed` is not a role"), "{err}");
        let err = knob_roles(template, &knobs, &["nope=concurrency".into()]).unwrap_err();
        assert!(
            err.to_string().contains("no --knob is named `nope`"),
            "{err}"
        );
    }

    #[test]
    fn the_next_value_goes_by_number_in_the_direction() {
        let values: Vec<String> = ["4", "1", "8", "2"].iter().map(|v| v.to_string()).collect();
        assert_eq!(next_value(&values, "2", Direction::Up), Ok("4".into()));
        assert_eq!(next_value(&values, "2", Direction::Down), Ok("1".into()));
        assert!(next_value(&values, "8", Direction::Up)
            .unwrap_err()
            .contains("end at 8 going up"));
        let flags = ["--on".to_string(), "--off".to_string()];
        assert!(next_value(&flags, "--on", Direction::Up)
            .unwrap_err()
            .contains("not a number"));
    }
}
