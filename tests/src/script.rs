//! The decision script against a real Redis, as the Lua tests drive it: a limit as a test
//! writes it ([`L`]), sent through the filter's own argument builder, and the script as the
//! restricted user Webdis logs in as ([`Script`]), with the clock injected.

use std::rc::Rc;

pub use ratelimit_core::bridge::DecideCall;
pub use ratelimit_core::check::{BudgetCheck, LimitCheck, Mode};
pub use ratelimit_core::config::{Algorithm, Calendar, CalendarUnit, Lease, OverBudget, Window};
pub use ratelimit_core::decision::{Refund, Settlement};
pub use ratelimit_core::program::{CallKind, Program};
pub use ratelimit_core::testing::cases::{self, CaseTable};
pub use ratelimit_core::time::UnixNs;

pub use crate::procs::{Redis, WorkDir};
pub use crate::resp::{RedisConn, Resp};

pub const T0: u128 = 1_764_489_600_000_000_000; // a whole second (and minute) in Unix ns
pub const MS: u128 = 1_000_000;
pub const S: u128 = 1_000_000_000;

/// One limit as a test writes it; sent through the filter's own argument builder.
#[derive(Clone)]
pub struct L {
    pub key: &'static str,
    pub algorithm: Algorithm,
    pub limit: u64,
    pub window: Window,
    pub burst: u64,
    pub cost: u64,
    pub shadow: bool,
    /// The rule's key budget: (rule name, new keys per window, window ms, over_budget).
    pub budget: Option<(&'static str, u64, u64, OverBudget)>,
    /// Asks for a lease of the limit's units.
    pub lease: Option<Lease>,
    /// A usage limit in mode `after`.
    pub after: bool,
    /// Reads its identity's override (`"overrides": true`).
    pub overrides: bool,
    /// A concurrency limit's request id (the hold it takes).
    pub member: &'static str,
}

pub fn limit(key: &'static str, algorithm: Algorithm, limit: u64, window_ms: u64) -> L {
    L {
        key,
        algorithm,
        limit,
        window: Window::ms(window_ms),
        burst: limit,
        cost: 1,
        shadow: false,
        budget: None,
        lease: None,
        after: false,
        overrides: false,
        member: "",
    }
}

impl L {
    /// The same limit with `burst` units at once.
    pub fn with_burst(self, burst: u64) -> L {
        L { burst, ..self }
    }

    /// The same concurrency limit, for the request `member`.
    pub fn held_by(self, member: &'static str) -> L {
        L { member, ..self }
    }

    /// The same limit, reading its identity's override.
    pub fn with_overrides(self) -> L {
        L {
            overrides: true,
            ..self
        }
    }

    /// The same limit over calendar windows of `unit` at `offset_minutes` east of UTC.
    pub fn calendar(self, unit: CalendarUnit, offset_minutes: i16) -> L {
        let window = Window::Calendar(Calendar {
            unit,
            offset_minutes,
        });
        L { window, ..self }
    }

    pub fn check(&self) -> LimitCheck {
        LimitCheck {
            rule: 0,
            limit: 0,
            key: self.key.into(),
            algorithm: self.algorithm,
            per_window: self.limit,
            quota: self.burst,
            window: self.window,
            burst: self.burst,
            cost: self.cost,
            mode: if self.algorithm == Algorithm::Concurrency {
                Mode::Hold(self.member.into())
            } else {
                Mode::of(
                    self.after,
                    self.lease,
                    self.shadow,
                    self.budget.map(|(rule, new_keys, window_ms, over_budget)| {
                        Rc::new(BudgetCheck {
                            counter_key: format!("rl:{{key_budget}}:{rule}"),
                            overflow_key: format!(
                                "rl:{{overflow}}:{rule}:{}",
                                self.algorithm.name()
                            ),
                            new_keys,
                            window_ms,
                            over_budget,
                        })
                    }),
                )
            },
            overrides: self.overrides,
        }
    }
}

/// One limit's answer: (allowed, remaining, reset_ms, retry_ms).
pub type Answer = (i64, String, String, String);

/// One request's answer: (committed, its limits' answers), or the error Redis gave for it.
pub type RequestAnswer = Result<(i64, Vec<Answer>), String>;

/// The decision code loaded into a Redis as Webdis's user, both ways the filter calls it: as
/// the library's function (`FCALL`, the default) and as the script (`EVALSHA`, a Redis
/// Cluster's). Calls go through `program`.
pub struct Script {
    pub conn: RedisConn,
    pub sha: String,
    pub program: Program,
    /// Sends each field of a definition's or a limit's argument as an argument of its own:
    /// the layout of the releases before those fields were joined (`tests/upgrade/`).
    pub fields_apart: bool,
}

impl Script {
    /// Calls through the function, as the filter does by default.
    pub fn new(redis: &Redis) -> Script {
        Script::calling(redis, CallKind::Function)
    }

    /// Calls through `kind`, both forms loaded.
    pub fn calling(redis: &Redis, kind: CallKind) -> Script {
        let mut conn = redis.webdis_user();
        let sha = conn
            .cmd(&["SCRIPT", "LOAD", &ratelimit_core::decision_script()])
            .unwrap()
            .text();
        assert_eq!(
            sha,
            crate::script_sha(),
            "Redis and the filter name the script alike"
        );
        let function = Program::new(CallKind::Function);
        let library = function.library();
        let loaded = conn
            .cmd(&["FUNCTION", "LOAD", "REPLACE", &library])
            .unwrap()
            .text();
        assert_eq!(loaded, function.library_name(), "the library loads");
        let program = Program::new(kind);
        Script {
            conn,
            sha,
            program,
            fields_apart: false,
        }
    }

    /// The command the filter would send for these requests, built by the filter's builder.
    pub fn command(&self, clock: &str, requests: &[&[L]]) -> Vec<String> {
        self.decide_call(clock, requests)
            .command(self.program.command(), &self.program.handle)
            .pipe_layout(self.fields_apart)
    }

    /// [`Script::command`] as a Redis Cluster call for several slots of one node sends it:
    /// no key declared, the keys at the head of `ARGV`; `ask_map` asks for the slot map.
    pub fn command_on_node(&self, clock: &str, requests: &[&[L]], ask_map: bool) -> Vec<String> {
        self.decide_call(clock, requests)
            .command_on_node("EVALSHA", &self.sha, ask_map)
            .pipe_layout(self.fields_apart)
    }

    fn decide_call(&self, clock: &str, requests: &[&[L]]) -> DecideCall {
        let checks: Vec<Vec<LimitCheck>> = requests
            .iter()
            .map(|r| r.iter().map(L::check).collect())
            .collect();
        // A request whose limits all carry a lease asks for one, as the engine does.
        let asks = checks.iter().map(|c| {
            (
                c.as_slice(),
                c.iter()
                    .all(|l| l.mode.lease().is_some())
                    .then_some(u64::MAX),
            )
        });
        DecideCall::leasing(clock, 0, asks)
    }

    pub fn call_batch(&mut self, clock: &str, requests: &[&[L]]) -> Resp {
        let command = self.command(clock, requests);
        self.conn.cmd(&command).unwrap()
    }

    /// As the filter sends it, with a deadline (Unix ms) after which Redis must not charge.
    pub fn call_with_deadline(&mut self, clock: &str, deadline_ms: u128, limits: &[L]) -> Resp {
        let checks: Vec<LimitCheck> = limits.iter().map(L::check).collect();
        let command = DecideCall::new(clock, deadline_ms, [&checks[..]])
            .command(self.program.command(), &self.program.handle)
            .pipe_layout(self.fields_apart);
        self.conn.cmd(&command).unwrap()
    }

    pub fn call(&mut self, clock: &str, limits: &[L]) -> Resp {
        self.call_batch(clock, &[limits])
    }

    /// Every request's answer for a batch decided at `now`.
    pub fn decide_batch(&mut self, now: u128, requests: &[&[L]]) -> Vec<RequestAnswer> {
        let items = self.call_batch(&now.to_string(), requests).items();
        let (out, rest) = read_answers(&items, requests.len());
        assert!(rest.is_empty(), "nothing after the last request");
        out
    }

    /// [`Script::decide_batch`] sent as a Redis Cluster call for several slots of one node
    /// ([`Script::command_on_node`]): every request's answer, and what the reply adds after
    /// them (the slot map, when `ask_map`).
    pub fn decide_on_node(
        &mut self,
        now: u128,
        requests: &[&[L]],
        ask_map: bool,
    ) -> (Vec<RequestAnswer>, Vec<Resp>) {
        let command = self.command_on_node(&now.to_string(), requests, ask_map);
        let items = self.conn.cmd(&command).unwrap().items();
        let (out, rest) = read_answers(&items, requests.len());
        (out, rest.to_vec())
    }

    /// (committed, answers) of one request alone at `now`.
    pub fn decide(&mut self, now: u128, limits: &[L]) -> (i64, Vec<Answer>) {
        match self.decide_batch(now, &[limits]).remove(0) {
            Ok(answer) => answer,
            Err(message) => panic!("request failed in Redis: {message}"),
        }
    }

    pub fn one(&mut self, now: u128, l: &L) -> Answer {
        self.decide(now, std::slice::from_ref(l)).1.remove(0)
    }
}

/// The answers of a reply of `requests` requests, and the items after them.
fn read_answers(items: &[Resp], requests: usize) -> (Vec<RequestAnswer>, &[Resp]) {
    assert_eq!(items[0].int(), requests as i64, "{items:?}");
    let mut rest = &items[1..];
    let mut out = Vec::new();
    for _ in 0..requests {
        if rest[0].int() == -1 {
            out.push(Err(rest[1].text()));
            rest = &rest[2..];
            continue;
        }
        let n = rest[1].int() as usize;
        let answers = rest[2..2 + 4 * n]
            .chunks(4)
            .map(|c| (c[0].int(), c[1].text(), c[2].text(), c[3].text()))
            .collect();
        out.push(Ok((rest[0].int(), answers)));
        rest = &rest[2 + 4 * n..];
    }
    (out, rest)
}

/// A fresh Redis in work dir `name`, and the script loaded into it as Webdis's user.
pub fn script(name: &str) -> (WorkDir, Redis, Script) {
    let (dir, redis) = start(name);
    let script = Script::new(&redis);
    (dir, redis, script)
}

pub fn start(name: &str) -> (WorkDir, Redis) {
    let dir = WorkDir::new(name);
    let redis = Redis::start(&dir);
    (dir, redis)
}

/// `(now, cost, allowed, remaining, reset_ms, retry_ms)`, in order, on one limit.
pub type Case = (u128, u64, i64, &'static str, &'static str, &'static str);

/// The script against one of the case tables the Rust twin is held to too
/// (`ratelimit_core::testing::cases`), on a fresh key: the remaining, reset and retry it
/// replies are read as numbers.
pub fn run_table(script: &mut Script, key: &'static str, table: &CaseTable) {
    let base = L {
        burst: table.burst,
        window: table.window,
        ..limit(key, table.algorithm, table.limit, 1)
    };
    for (i, &(at, cost, allowed, remaining, reset, retry)) in table.cases.iter().enumerate() {
        let l = L {
            cost,
            ..base.clone()
        };
        let (got, left, resets, waits) = script.one(T0 + u128::from(at) * MS, &l);
        let number = |text: &str| text.parse::<f64>().ok();
        assert_eq!(
            (got == 1, number(&left), number(&resets), number(&waits)),
            (allowed, Some(remaining), Some(reset), Some(retry)),
            "{} case {i}: {at} ms, cost {cost}",
            table.algorithm.name()
        );
    }
}

pub fn run_cases(script: &mut Script, base: &L, cases: &[Case]) {
    for (i, &(now, cost, allowed, remaining, reset, retry)) in cases.iter().enumerate() {
        let l = L {
            cost,
            ..base.clone()
        };
        let got = script.one(now, &l);
        let want = (
            allowed,
            remaining.to_string(),
            reset.to_string(),
            retry.to_string(),
        );
        assert_eq!(
            got,
            want,
            "{} case {i}: now=T0+{}ms cost={cost}",
            base.algorithm.name(),
            (now - T0) / MS
        );
    }
}

impl Script {
    /// Gives back a charge made at `charged_at` that replied `left`, with the refund's clock.
    pub fn refund(&mut self, clock: u128, l: &L, charged_at: u128, left: f64) {
        let refund = Refund {
            check: l.check(),
            charged_at_ns: UnixNs::from_ns(charged_at),
            left,
        };
        let command = DecideCall::refund(clock, 0, &[refund])
            .command(self.program.command(), &self.program.handle)
            .pipe_layout(self.fields_apart);
        let items = self.conn.cmd(&command).unwrap().items();
        assert_eq!(
            (items[0].int(), items[1].int(), items[2].int()),
            (1, 1, 1),
            "{items:?}"
        );
    }
}

impl Script {
    /// Settles `delta` units on `l` at `clock` (positive: debt; negative: a give-back).
    pub fn settle(&mut self, clock: u128, l: &L, delta: i64) {
        let settlement = Settlement {
            check: l.check(),
            delta,
        };
        let command = DecideCall::settle(clock, 0, &[settlement])
            .command(self.program.command(), &self.program.handle)
            .pipe_layout(self.fields_apart);
        let items = self.conn.cmd(&command).unwrap().items();
        assert_eq!(
            (items[0].int(), items[1].int(), items[2].int()),
            (1, 1, 1),
            "{items:?}"
        );
    }
}

/// A command as [`Script::fields_apart`] asks for it.
trait Layout {
    fn pipe_layout(self, fields_apart: bool) -> Vec<String>;
}

impl Layout for Vec<String> {
    fn pipe_layout(self, fields_apart: bool) -> Vec<String> {
        if !fields_apart {
            return self;
        }
        self.iter()
            .flat_map(|arg| arg.split(ratelimit_core::bridge::FIELD_SEPARATOR))
            .map(str::to_string)
            .collect()
    }
}
