//! Limits charged by what the upstream answers (envoy/examples/charged_by_response.yaml), on
//! two Envoys of two workers sharing one Redis, in front of the tests' application
//! (`e2e::origin`): failed logins counted by their status, searches priced by a response
//! header.

use std::time::{Duration, Instant};

use e2e::auth::Fleet;
use e2e::http::post_streamed;
use e2e::llm::{chat_request, split, upstream_edits, CACHED, USAGE};
use e2e::origin::{Origin, CACHED_COST, COST_HEADER, PASSWORD, SCAN_COST};
use e2e::{
    clear_of_window_end, root, wait_until, Envoy, Keys, LlmUpstream, Redis, Webdis, WorkDir, DAY,
    TEST_SPAN,
};

const EXAMPLE: &str = "envoy/examples/charged_by_response.yaml";
const WAIT: Duration = Duration::from_secs(15);
/// The failures limit (5 a minute) gets a unit back every 12 s.
const REFILL: Duration = Duration::from_secs(12);

fn start(name: &str) -> (Origin, Fleet) {
    // The example's search credits count in a daily fixed window.
    clear_of_window_end(DAY, TEST_SPAN);
    let origin = Origin::start();
    let edits = [(
        "port_value: 8080".to_string(),
        format!("port_value: {}", origin.port),
    )];
    let fleet = Fleet::start(name, &root().join(EXAMPLE), &edits);
    (origin, fleet)
}

/// The failures a full bucket of 5 lets through within `elapsed` of its first charge.
fn failures_allowed(elapsed: Duration) -> usize {
    5 + (elapsed.as_secs_f64() / REFILL.as_secs_f64()) as usize
}

fn login(fleet: &Fleet, i: usize, user: &str, password: &str) -> u16 {
    fleet
        .send(
            i,
            "/login",
            &[
                ("x-user", user.as_bytes()),
                ("x-password", password.as_bytes()),
            ],
        )
        .status
}

#[test]
fn only_failed_logins_count_and_the_sixth_failure_is_refused_across_replicas() {
    let (origin, fleet) = start("charged-logins");
    // A user who logs in right is never refused: each attempt holds a unit while it runs and
    // gets it back with its 200. One after another, over both Envoys.
    for i in 0..100 {
        assert_eq!(login(&fleet, i, "alice", PASSWORD), 200, "login {i}");
    }
    wait_until(
        "the 100 successful logins' units given back",
        WAIT,
        || fleet.counter("ratelimit_rule.login.failures.usage_given_back"),
        |n| *n == 100,
    );

    // Five failures are answered by the application; the sixth within the minute is refused,
    // and so is the right password while no unit has come back (the account is locked).
    let started = Instant::now();
    let mut bob: Vec<u16> = (0..6).map(|i| login(&fleet, i, "bob", "guess")).collect();
    bob.push(login(&fleet, 6, "bob", PASSWORD));
    let elapsed = started.elapsed();
    assert_eq!(bob[..5], [401; 5], "{bob:?}");
    if elapsed < REFILL {
        assert_eq!(bob[5..], [429, 429], "{bob:?}");
    }

    // Twenty wrong passwords at once from four clients over both Envoys: exactly five reach
    // the application, the rest are refused.
    let started = Instant::now();
    let tally = fleet.burst_with(20, 4, |_| {
        (
            "/login".to_string(),
            vec![
                ("x-user", b"carol".as_slice()),
                ("x-password", b"guess".as_slice()),
            ],
        )
    });
    let allowed = failures_allowed(started.elapsed());
    let statuses = tally.statuses();
    let failed = statuses
        .iter()
        .find(|(s, _)| *s == 401)
        .map_or(0, |(_, n)| *n);
    assert!((5..=allowed).contains(&failed), "{statuses:?}");
    assert_eq!(statuses, [(401, failed), (429, 20 - failed)]);

    // The application answered exactly what the clients saw: no refused attempt reached it.
    let answered = origin.answered().logins;
    assert_eq!(answered.get("alice"), Some(&(100, 0)));
    assert_eq!(answered.get("carol"), Some(&(0, failed as u64)));
    assert_eq!(answered.get("bob"), Some(&statuses_of(&bob)));
}

/// (200s, 401s) among `statuses`.
fn statuses_of(statuses: &[u16]) -> (u64, u64) {
    let count = |want| statuses.iter().filter(|s| **s == want).count() as u64;
    (count(200), count(401))
}

#[test]
fn a_search_is_charged_exactly_the_price_its_answer_names_across_replicas() {
    let (origin, fleet) = start("charged-search");
    // 40 searches by four clients at once over both Envoys: 30 from the cache, 10 full scans.
    let tally = fleet.burst_with(40, 4, |i| {
        let q = if i % 4 == 0 { "scan" } else { "cached" };
        (
            format!("/search?q={q}-{i}"),
            vec![("x-api-key", b"team-a".as_slice())],
        )
    });
    assert_eq!(tally.statuses(), [(200, 40)]);
    // Two answers naming prices past the config's bounds (1 to 20): charged 20 and 1.
    for (i, price) in [500, 0].into_iter().enumerate() {
        let key: &[u8] = b"team-a";
        let r = fleet.send(
            i,
            &format!("/search?q=price-{price}"),
            &[("x-api-key", key)],
        );
        assert_eq!(r.status, 200);
    }
    let named = 30 * CACHED_COST + 10 * SCAN_COST;
    assert_eq!(origin.answered().priced.get("team-a"), Some(&(named + 500)));
    let priced = named + 20 + 1;
    // Each search held the estimate (20) while it ran; the day's count in Redis ends at what
    // the answers' COST_HEADER said within the bounds, once every settlement has landed.
    let key = fleet
        .keys()
        .limit_key("search", "credits", "header:x-api-key", b"team-a");
    let want = priced.to_string();
    wait_until(
        &format!("the day's credits in Redis at the {COST_HEADER} total"),
        WAIT,
        || {
            fleet
                .redis
                .admin()
                .cmd(&["HGET", &key, "n"])
                .ok()
                .map(|v| v.text())
        },
        |n| n.as_deref() == Some(want.as_str()),
    );
    wait_until(
        "the settlements counted",
        WAIT,
        || fleet.counter("ratelimit_rule.search.credits.usage_charged"),
        |n| *n == priced,
    );
}

/// OpenAI's counts weighted as a gateway prices them: input 1, output 4, cached input 0.5.
const WEIGHTED: &str = r#"{
  "bridge": {"cluster": "webdis", "authority": "webdis", "username": "ratelimit",
             "password": "ratelimit-demo-secret", "timeout": "150ms"},
  "rules": [{"name": "llm", "key": {"from": ["header:x-api-key"]}, "limits": [
    {"name": "credits", "algorithm": "fixed_window", "limit": 1000000000, "window": "1d",
     "usage": {"from": "openai", "estimate": {"request": {"completion_default": 4000}},
               "weights": {"input": 1, "output": 4, "cached_input": 0.5}}}]}]
}"#;

#[test]
fn weighted_tokens_are_charged_exactly_across_replicas() {
    clear_of_window_end(DAY, TEST_SPAN);
    let dir = WorkDir::new("charged-weighted");
    let redis = Redis::start(&dir);
    let upstream = LlmUpstream::start();
    let owned = upstream_edits(WEIGHTED, upstream.port);
    let edits: Vec<(&str, &str)> = owned
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let webdis: Vec<Webdis> = (0..2).map(|_| Webdis::start(&dir, redis.port)).collect();
    let envoys: Vec<Envoy> = webdis
        .iter()
        .map(|w| Envoy::start(&dir, w.port, &edits))
        .collect();
    // 24 completions from 4 clients over both Envoys (2 workers each): answer i reports a
    // total of 40 + 8i tokens (a quarter of them prompt) with i % 3 of the prompt cached.
    let answer = |i: u64| (40 + 8 * i, i % 3);
    let body = chat_request("Say hello.", false, Some(100));
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (envoys, body) = (&envoys, &body);
            scope.spawn(move || {
                for i in (t..24).step_by(4) {
                    let (total, cached) = answer(i);
                    let (total, cached) = (total.to_string(), cached.to_string());
                    let r = post_streamed(
                        envoys[i as usize % 2].port,
                        "/v1/chat/completions",
                        &[
                            ("x-api-key", b"weighted".as_slice()),
                            ("content-type", b"application/json".as_slice()),
                            (USAGE, total.as_bytes()),
                            (CACHED, cached.as_bytes()),
                        ],
                        body,
                    )
                    .expect("an answer through envoy");
                    assert_eq!(r.status, 200, "request {i}");
                }
            });
        }
    });
    // Each answer charged (prompt - cached) × 1 + cached × 0.5 + completion × 4, rounded up
    // to a whole unit.
    let want: u64 = (0..24)
        .map(|i| {
            let (total, cached) = answer(i);
            let (prompt, completion) = split(total);
            let milli = (prompt - cached) * 1000 + cached * 500 + completion * 4000;
            milli.div_ceil(1000)
        })
        .sum();
    let key =
        Keys::from_json(WEIGHTED).limit_key("llm", "credits", "header:x-api-key", b"weighted");
    let want_text = want.to_string();
    wait_until(
        "the weighted usage settled in Redis",
        WAIT,
        || {
            redis
                .admin()
                .cmd(&["HGET", &key, "n"])
                .ok()
                .map(|v| v.text())
        },
        |n| n.as_deref() == Some(want_text.as_str()),
    );
    assert_eq!(upstream.served_for("weighted").count, 24);
}
