//! A probe of a live bridge with a configuration's credentials (`ratelimit-check --probe`):
//! the calls the filter makes, each once, and what each answer says, so that a bridge that
//! refuses the filter is found before traffic is. The caller sends the requests and hands the
//! replies back; this module decides nothing else.
//!
//! Nothing of an identity's is touched: the decision is made on keys of the probe's own, under
//! the configuration's `key_prefix` (so Redis's key pattern for the user Webdis logs in as is
//! checked too), in the hash tag `{ratelimit-check}`, which no identity's key has (every
//! identity's tag holds `=` or `:`, see `request::keys`); each run has keys of its own, and
//! what its decision charged is given back at once. The keys expire like any limit's state.

use std::rc::Rc;

use super::args::DecideCall;
use super::failure::{BridgeFailure, MisconfigCause, Misconfiguration, Refused};
use super::reply::{parse_eval_reply, BridgeReply, EvalOutcome};
use super::request::BridgeRequest;
use crate::check::{BudgetCheck, LimitCheck, Mode};
use crate::config::{Admit, Algorithm, Config};
use crate::decision::{Decision, Refund};
use crate::time::UnixNs;

/// The hash tag of every probe key.
pub const PROBE_TAG: &str = "{ratelimit-check}";

/// How long after the probe's clock Redis may still run its calls (ms): far longer than a call
/// takes, so that only clocks over a minute apart make a call arrive too late.
const DEADLINE_MS: u128 = 60_000;

/// What a probe sends, in order: [`Probe::reach`], [`Program::load`](crate::program::Program),
/// [`Probe::decide`], [`Probe::give_back`].
#[derive(Debug, Clone)]
pub struct Probe {
    /// The decision asked for: one request holding every limit of every rule, each on a key
    /// of the probe's own, costing 1.
    pub checks: Vec<LimitCheck>,
    program: crate::program::Program,
    clock: UnixNs,
}

impl Probe {
    /// The probe of `config`'s bridge for run `run` (letters, digits and `-`, unique per run),
    /// on the clock `now`.
    pub fn new(config: &Config, run: &str, now: UnixNs) -> Probe {
        let base = format!("{}{PROBE_TAG}:{run}", config.key_prefix);
        let mut checks = Vec::new();
        for (r, rule) in config.rules.iter().enumerate() {
            let budget = rule.key_budget.as_ref().map(|b| BudgetCheck {
                counter_key: format!("{base}:key_budget:{}", rule.name),
                overflow_key: format!("{base}:overflow:{}", rule.name),
                new_keys: b.new_keys,
                window_ms: u64::try_from(b.window.as_millis()).unwrap_or(u64::MAX),
                over_budget: b.over_budget,
            });
            let budget = budget.map(Rc::new);
            for (l, limit) in rule.limits.iter().enumerate() {
                let after = limit
                    .usage
                    .as_ref()
                    .is_some_and(|u| u.admit == Admit::After);
                let mode = match limit.algorithm {
                    Algorithm::Concurrency => {
                        Mode::Hold(Rc::from(format!("ratelimit-check-{run}")))
                    }
                    // A lease is only asked for by requests that run low: decided plainly.
                    _ => Mode::of(after, None, rule.shadow, budget.clone()),
                };
                checks.push(LimitCheck {
                    rule: r,
                    limit: l,
                    key: Rc::from(format!("{base}:{}:{}", rule.name, limit.name)),
                    algorithm: limit.algorithm,
                    per_window: limit.shard_limit(),
                    quota: limit.quota(),
                    window: limit.window,
                    burst: limit.shard_burst(),
                    cost: 1,
                    mode,
                    overrides: limit.overrides,
                });
            }
        }
        Probe {
            checks,
            program: config.program.clone(),
            clock: now,
        }
    }

    fn deadline_ms(&self) -> u128 {
        self.clock.as_ms() + DEADLINE_MS
    }

    /// First the breaker's probe, an empty decision call: the credentials, Webdis's ACL for
    /// the decision call (`FCALL` or `EVALSHA`), Redis's for it and `TIME` (read for the deadline).
    pub fn reach(&self) -> BridgeRequest {
        let call = DecideCall::new(
            &self.clock.as_ns().to_string(),
            self.deadline_ms(),
            std::iter::empty(),
        );
        self.program.decide(&call)
    }

    /// What the reply to [`Probe::reach`] says: whether Redis has the script (a Redis that
    /// restarted lost it: the filter loads it, and so does the probe).
    pub fn read_reach(reply: BridgeReply<'_>) -> Result<bool, BridgeFailure> {
        match parse_eval_reply(reply, &[])? {
            EvalOutcome::Decided(_) => Ok(true),
            EvalOutcome::NoScript => Ok(false),
        }
    }

    /// What the reply to [`Program::load`](crate::program::Program) says: the script loaded, under the
    /// hash the filter calls it by.
    pub fn read_script_load(&self, reply: BridgeReply<'_>) -> Result<(), BridgeFailure> {
        self.program.parse_load_reply(reply)
    }

    /// The decision: every limit of the configuration on the probe's keys, with what each
    /// reads and writes (key budgets, overrides, a concurrency hold), so that every command
    /// the configuration's decisions need runs once.
    pub fn decide(&self) -> BridgeRequest {
        let call = DecideCall::new(
            &self.clock.as_ns().to_string(),
            self.deadline_ms(),
            [self.checks.as_slice()],
        );
        self.program.decide(&call)
    }

    /// What the reply to [`Probe::decide`] says: the decision, allowed (keys of its own, never
    /// used before). Redis's ACL refusing a command is a misconfiguration; so is an override
    /// read as malformed where none exists: the script reads overrides under `redis.pcall`, so
    /// the only sign of `HMGET` refused there is that.
    pub fn read_decide(&self, reply: BridgeReply<'_>) -> Result<Decision, BridgeFailure> {
        let decision = match parse_eval_reply(reply, &[self.checks.len()])? {
            EvalOutcome::NoScript => return Err(BridgeFailure::NoScript),
            EvalOutcome::Decided(mut results) => results
                .pop()
                .ok_or(BridgeFailure::BadReply("no entry for the probe's request"))??,
        };
        if decision.limits.iter().any(|l| l.bad_override) {
            return Err(BridgeFailure::Misconfigured(Misconfiguration {
                cause: MisconfigCause::RedisAcl,
                refused: Refused::Redis(
                    "reading an override (HMGET) failed on a key that holds none".to_string(),
                ),
            }));
        }
        if !decision.allowed {
            return Err(BridgeFailure::BadReply(
                "the probe's decision was refused on keys never used before",
            ));
        }
        Ok(decision)
    }

    /// Gives back what `decision` charged (and releases its concurrency holds), as a lease's
    /// give-back and a Redis Cluster refund do: their commands run too.
    pub fn give_back(&self, decision: &Decision) -> BridgeRequest {
        let refunds: Vec<Refund> = self
            .checks
            .iter()
            .zip(&decision.limits)
            .map(|(check, result)| Refund {
                check: check.clone(),
                charged_at_ns: self.clock,
                left: result.remaining,
            })
            .collect();
        let call = DecideCall::refund(self.clock.as_ns(), self.deadline_ms(), &refunds);
        self.program.decide(&call)
    }

    /// What the reply to [`Probe::give_back`] says.
    pub fn read_give_back(&self, reply: BridgeReply<'_>) -> Result<(), BridgeFailure> {
        match parse_eval_reply(reply, &[self.checks.len()])? {
            EvalOutcome::NoScript => Err(BridgeFailure::NoScript),
            EvalOutcome::Decided(mut results) => results
                .pop()
                .ok_or(BridgeFailure::BadReply(
                    "no entry for the probe's give-back",
                ))?
                .map(|_| ()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::call::sent_limits;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const NOW: UnixNs = UnixNs::from_ns(1_764_489_269_123_456_789);

    fn config() -> Config {
        Config::parse(
            br#"{"bridge": {"username": "u", "password": "p"}, "key_prefix": "lim:", "rules": [
              {"name": "api", "key_budget": {"new_keys": 100, "window": "1m"},
               "limits": [{"name": "second", "limit": 5, "window": "1s", "overrides": true},
                          {"name": "day", "algorithm": "sliding_window_log", "limit": 50, "window": "1d"}]},
              {"name": "holds", "limits": [{"name": "inflight", "algorithm": "concurrency", "limit": 2, "max_duration": "30s"}]}]}"#,
        )
        .unwrap()
    }

    fn ok(body: &str) -> BridgeReply<'_> {
        BridgeReply {
            status: Some(200),
            body: body.as_bytes(),
        }
    }

    /// Every limit of every rule, on keys of the probe's run under the prefix, in a tag no
    /// identity has; the key budget on a counter of its own; costing 1.
    #[test]
    fn the_probe_decides_every_limit_on_keys_of_its_own() {
        let c = config();
        let probe = Probe::new(&c, "42-7", NOW);
        let keys: Vec<&str> = probe.checks.iter().map(|k| &*k.key).collect();
        assert_eq!(
            keys,
            [
                "lim:{ratelimit-check}:42-7:api:second",
                "lim:{ratelimit-check}:42-7:api:day",
                "lim:{ratelimit-check}:42-7:holds:inflight"
            ]
        );
        assert!(probe.checks.iter().all(|k| k.cost == 1));
        assert!(probe.checks[0].overrides);
        let Some(budget) = probe.checks[0].mode.budget() else {
            panic!("the rule's key budget is exercised");
        };
        assert_eq!(
            budget.counter_key,
            "lim:{ratelimit-check}:42-7:key_budget:api"
        );
        assert!(matches!(probe.checks[2].mode, Mode::Hold(_)));
        let decide = probe.decide();
        let sent = sent_limits(&decide.path).expect("a decision call");
        assert_eq!(sent.len(), 3);
        assert!(
            probe.reach().path.ends_with("/0~0~0"),
            "{}",
            probe.reach().path
        );
        // The deadline is a minute after the clock.
        let deadline = format!("/{}/{}/", NOW.as_ns(), NOW.as_ms() + 60_000);
        assert!(decide.path.contains(&deadline), "{}", decide.path);
    }

    #[test]
    fn the_decision_must_be_allowed_and_read_no_override() {
        let probe = Probe::new(&config(), "1", NOW);
        let allowed = r#"{"EVALSHA":[1,1,3,1,"4","1000","0",1,"49","86400000","0",1,"1","0","0"]}"#;
        let decision = probe.read_decide(ok(allowed)).unwrap();
        assert!(decision.allowed);
        let back = probe.give_back(&decision);
        let sent = sent_limits(&back.path).expect("a give-back");
        assert_eq!(sent.len(), 3);
        // An override read as malformed where none exists: HMGET refused under pcall.
        let bad = r#"{"EVALSHA":[1,1,3,9,"4","1000","0",1,"49","86400000","0",1,"1","0","0"]}"#;
        let failure = probe.read_decide(ok(bad)).unwrap_err();
        assert_eq!(
            failure.misconfiguration().map(|m| m.cause),
            Some(MisconfigCause::RedisAcl)
        );
        let refused =
            r#"{"EVALSHA":[1,0,3,0,"0","1000","500",1,"49","86400000","0",1,"1","0","0"]}"#;
        assert!(matches!(
            probe.read_decide(ok(refused)),
            Err(BridgeFailure::BadReply(_))
        ));
        let acl = r#"{"EVALSHA":[1,-1,"ERR The user executing the script can't run this command or subcommand"]}"#;
        let failure = probe.read_decide(ok(acl)).unwrap_err();
        assert_eq!(
            failure.misconfiguration().map(|m| m.cause),
            Some(MisconfigCause::RedisAcl)
        );
    }

    #[test]
    fn reaching_tells_a_missing_script_from_a_refusal() {
        assert_eq!(Probe::read_reach(ok(r#"{"EVALSHA":[0]}"#)), Ok(true));
        assert_eq!(
            Probe::read_reach(ok(
                r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#
            )),
            Ok(false)
        );
        let refused = Probe::read_reach(BridgeReply {
            status: Some(403),
            body: b"",
        })
        .unwrap_err();
        assert_eq!(
            refused.misconfiguration().map(|m| m.cause),
            Some(MisconfigCause::BridgeAuth)
        );
    }
}
