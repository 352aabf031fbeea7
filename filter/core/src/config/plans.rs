//! A rule's `plans`: "pro gets 1,000 a minute, free 100, anything else 10". Each plan becomes
//! a rule of its own with the plan's limits, under the rule's name, its match narrowed by a
//! condition on `plan_from`: a plan's own values, or for the default plan every value no other
//! plan names (absent and empty included). So every request the rule matches lands in exactly
//! one plan, and the request path knows nothing of plans.
//!
//! A limit keeps its state across plans (its key is the rule's and the limit's name, as
//! without plans): a caller moving from free to pro keeps what it spent and gets pro's numbers
//! from its next request, as with an override. So limits of one name must keep their state's
//! shape in every plan: the same algorithm, window and shards.

use super::fields::check_name;
use super::raw::{RawLimit, RawPlan};
use super::sources::{condition_values, parse_source};
use super::{invalid, Algorithm, Condition, ConfigError, Limit, Rule, Test, Window};
use crate::bounds::MAX_PLANS;

pub(super) fn expand(
    rule: Rule,
    from: &str,
    plans: Vec<RawPlan>,
    field: &str,
    limits_of: impl Fn(Vec<RawLimit>, &str) -> Result<Vec<Limit>, ConfigError>,
) -> Result<Vec<Rule>, ConfigError> {
    let from_field = format!("{field}.plan_from");
    if from.contains('+') {
        return Err(invalid(&from_field, "names one source"));
    }
    let source = parse_source(from, &from_field)?;
    let plans_field = format!("{field}.plans");
    if plans.is_empty() {
        return Err(invalid(&plans_field, "must hold at least one plan"));
    }
    if plans.len() > MAX_PLANS {
        return Err(invalid(
            &plans_field,
            format!("must hold at most {MAX_PLANS} plans"),
        ));
    }
    // Every plan's values, each value in one plan only.
    let mut owner: Vec<(&[u8], usize)> = Vec::new();
    let mut values: Vec<Vec<Vec<u8>>> = Vec::with_capacity(plans.len());
    let mut default = None;
    for (p, plan) in plans.iter().enumerate() {
        let plan_field = format!("{plans_field}[{p}]");
        check_name(&plan.name, &format!("{plan_field}.name"))?;
        if let Some(first) = plans[..p].iter().position(|q| q.name == plan.name) {
            return Err(invalid(
                &format!("{plan_field}.name"),
                format!("duplicate plan name \"{}\" (plans[{first}])", plan.name),
            ));
        }
        if plan.default {
            if let Some(d) = default {
                return Err(invalid(
                    &format!("{plan_field}.default"),
                    format!("plans[{d}] is the default already: one plan takes every request the others do not"),
                ));
            }
            default = Some(p);
        }
        let own = if plan.values.is_empty() && plan.default {
            Vec::new()
        } else if plan.values.is_empty() {
            return Err(invalid(
                &format!("{plan_field}.values"),
                "must name the values of plan_from this plan takes (only the default plan may name none)",
            ));
        } else {
            condition_values(plan.values.clone(), &format!("{plan_field}.values"))?
        };
        values.push(own);
    }
    // Sorted, a value named twice is next to itself: the first in config order is kept.
    for (p, own) in values.iter().enumerate() {
        owner.extend(own.iter().map(|v| (v.as_slice(), p)));
    }
    owner.sort();
    if let Some(pair) = owner
        .windows(2)
        .find(|w| w[0].0 == w[1].0 && w[0].1 != w[1].1)
    {
        let (value, (first, second)) = (pair[0].0, (pair[0].1, pair[1].1));
        let v = values[second].iter().position(|x| x == value).unwrap_or(0);
        return Err(invalid(
            &format!("{plans_field}[{second}].values[{v}]"),
            format!(
                "\"{}\" is a value of plans[{first}] already: a request is in one plan",
                String::from_utf8_lossy(value)
            ),
        ));
    }
    let Some(default) = default else {
        return Err(invalid(
            &plans_field,
            "no plan is the default: mark one \"default\": true; it takes every request whose plan_from is absent or names no plan (anonymous requests, unknown plans)",
        ));
    };
    let named: Vec<Vec<u8>> = values
        .iter()
        .enumerate()
        .filter(|(p, _)| *p != default)
        .flat_map(|(_, v)| v.iter().cloned())
        .collect();
    let mut rules = Vec::with_capacity(plans.len());
    // The first plan defining a limit of each name: the shape the others must keep.
    let mut shapes: Vec<(String, (Algorithm, Window, u64))> = Vec::new();
    for (p, (plan, own)) in plans.into_iter().zip(values).enumerate() {
        let plan_field = format!("{plans_field}[{p}]");
        let limits = limits_of(plan.limits, &format!("{plan_field}.limits"))?;
        for (l, limit) in limits.iter().enumerate() {
            let shape = (limit.algorithm, limit.window, limit.shards);
            match shapes.iter().find(|(name, _)| *name == limit.name) {
                None => shapes.push((limit.name.clone(), shape)),
                Some(&(_, first)) => {
                    if first != shape {
                        let (algorithm, window, shards) = first;
                        return Err(invalid(
                            &format!("{plan_field}.limits[{l}]"),
                            format!(
                                "\"{}\" is a {} of window {} and {} shard(s) in an earlier plan: a limit keeps its state across plans, so one name keeps its algorithm, window and shards (give this one another name)",
                                limit.name,
                                algorithm.name(),
                                window.show(),
                                shards
                            ),
                        ));
                    }
                }
            }
        }
        let test = if p == default {
            Test::NotIn(named.clone())
        } else {
            Test::In(own)
        };
        let mut matcher = rule.matcher.clone();
        matcher.conditions.push(Condition {
            source: source.clone(),
            test,
        });
        rules.push(Rule {
            matcher,
            limits,
            plan: Some(plan.name),
            ..rule.clone()
        });
    }
    Ok(rules)
}
