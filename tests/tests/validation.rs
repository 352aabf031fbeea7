//! The shipped configurations and what refuses a bad one, end to end: a bad filter
//! configuration stops Envoy naming the field, one over a bound fails `envoy --mode validate`
//! naming it, every shipped Envoy config validates, and the shipped Webdis refuses every
//! command but the limiter's.

use std::time::Duration;

use e2e::procs::{envoy_config, filter_config_edit, validate_config, WorkDir};
use e2e::shipped::hit;
use e2e::{free_port, get, root, Envoy, Stack};

#[test]
fn bad_filter_config_stops_envoy_and_names_the_field() {
    let dir = WorkDir::new("e2e-bad-config");
    let cases = [
        (
            "\"limit\": 10",
            "\"limit\": 0",
            "rules[0].limits[0].limit: must be >= 1",
        ),
        (
            "\"limit\": 10, \"window\": \"1m\"",
            "\"limit\": 10, \"window\": \"0s\"",
            "rules[0].limits[0].window: must be > 0",
        ),
        (
            "\"token_bucket\", \"limit\": 10",
            "\"leaky_bucket\", \"limit\": 10",
            "rules[0].limits[0].algorithm: unknown variant `leaky_bucket`",
        ),
        (
            "\"failure_mode\": \"open\"",
            "\"failure_mode\": \"sometimes\"",
            "failure_mode: unknown variant `sometimes`",
        ),
        (
            "\"timeout\": \"150ms\"",
            "\"timeout\": \"0ms\"",
            "bridge.timeout: must be between 1ms and 60s",
        ),
        (
            "\"key_prefix\": \"rl:\"",
            "\"key_prefx\": \"rl:\"",
            "key_prefx: unknown field `key_prefx`",
        ),
    ];
    for (from, to, message) in cases {
        // Webdis is never reached: the config is refused before any request.
        let mut envoy = Envoy::launch(&dir, 1, &[(from, to)]);
        let status = envoy
            .process
            .wait_exit(Duration::from_secs(30))
            .expect("envoy should exit on a bad filter config");
        assert!(!status.success(), "{to}: exit status {status}");
        let log = envoy.process.log_text();
        assert!(
            log.contains(&format!("invalid filter configuration: {message}")),
            "{to}: log does not name the field:\n{log}"
        );
    }
}

#[test]
fn over_bound_configs_fail_validation_naming_the_field() {
    let dir = WorkDir::new("e2e-over-bound");
    let limit = "\"algorithm\": \"token_bucket\", \"limit\": 10, \"window\": \"1m\"";
    // Five rules applying to every request, 13 limits each: 65 limits in one call.
    let limits: Vec<String> = (0..13)
        .map(|j| format!(r#"{{"name": "l{j}", "limit": 1, "window": "1s"}}"#))
        .collect();
    let rules: Vec<String> = (0..5)
        .map(|i| format!(r#"{{"name": "r{i}", "limits": [{}]}}"#, limits.join(", ")))
        .collect();
    let (filter_from, filter_to) =
        filter_config_edit(&format!(r#"{{"rules": [{}]}}"#, rules.join(", ")));
    let cases = [
        (
            limit.to_string(),
            limit.replace("\"1m\"", "\"99999999999d\""),
            "rules[0].limits[0].window: must be at most 366d",
        ),
        (
            limit.to_string(),
            limit.replace("10", "1000000000001"),
            "rules[0].limits[0].limit: must be at most 1000000000000",
        ),
        (
            limit.to_string(),
            limit.replace("\"1m\"", "\"366d\", \"burst\": 30"),
            "rules[0].limits[0].burst: the state would live burst / limit × window, longer than 732d: lower burst or window",
        ),
        (
            limit.to_string(),
            limit
                .replace("token_bucket", "sliding_window_log")
                .replace("10", "10001"),
            "rules[0].limits[0].limit: sliding_window_log keeps one entry per unit: must be at most 10000",
        ),
        (
            filter_from,
            filter_to,
            "rules[0]: a request it matches can carry 65 limits",
        ),
    ];
    for (i, (from, to, message)) in cases.iter().enumerate() {
        let yaml = envoy_config(free_port(), free_port(), 1, &[(from.as_str(), to.as_str())]);
        let path = dir.file(&format!("over-bound-{i}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let (ok, output) = validate_config(&root(), &path);
        assert!(!ok, "case {i} validated:\n{output}");
        assert!(
            output.contains(&format!("invalid filter configuration: {message}")),
            "case {i}: the output does not name the field:\n{output}"
        );
    }
}

#[test]
fn shipped_envoy_configs_validate() {
    e2e::wasm_path();
    let mut checked = Vec::new();
    let envoy = root().join("envoy");
    for dir in [envoy.clone(), envoy.join("examples"), envoy.join("cluster")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let (ok, output) = validate_config(&root(), &path);
                assert!(ok, "{} does not validate:\n{output}", path.display());
                assert!(output.contains("OK"), "{output}");
                let name = path.strip_prefix(&envoy).unwrap();
                checked.push(name.to_string_lossy().into_owned());
            }
        }
    }
    checked.sort();
    assert_eq!(
        checked,
        [
            "cluster/envoy.yaml",
            "envoy.yaml",
            "examples/charged_by_response.yaml",
            "examples/ext_authz_plans.yaml",
            "examples/internal_shadow.yaml",
            "examples/jwt_plans.yaml",
            "examples/llm_models.yaml",
            "examples/llm_tokens.yaml",
            "examples/login_per_ip.yaml",
            "examples/plans.yaml",
            "examples/public_api_tiers.yaml",
            "examples/remote_module.yaml"
        ]
    );
}

#[test]
fn webdis_with_the_shipped_config_refuses_everything_but_the_limiter() {
    let stack = Stack::start("e2e-lockdown", &[]);
    assert_eq!(hit(&stack.envoy, Some(b"k")).status, 200);
    let port = stack.webdis.port;
    let auth = stack.webdis.authorization();
    let with_auth: [(&str, &[u8]); 1] = [("authorization", &auth)];
    for path in [
        "/FLUSHALL",
        "/KEYS/*",
        "/CONFIG/GET/*",
        "/EVAL/return%201/0",
        "/EVAL/return%20redis.call('FLUSHALL')/0",
        "/SET/rl:x/1",
        "/DEL/rl:x",
        "/HSET/rl:x/tokens/999",
    ] {
        let r = get(port, path, &with_auth).unwrap();
        assert_eq!(
            r.status,
            403,
            "{path} should be refused by Webdis's ACL: {}",
            r.text()
        );
    }
    // Without the credentials even the limiter's own commands are refused: the function's
    // call (the default) and the script's (`bridge.redis_calls: "script"`).
    let function = e2e::decision_function();
    let sha = e2e::script_sha();
    for call in [
        format!("/FCALL/{}/1/rl:x/1/1/1/1", function.handle),
        format!("/EVALSHA/{sha}/1/rl:x/1/1/1/1"),
    ] {
        let r = get(port, &call, &[]).unwrap();
        assert_eq!(r.status, 403, "{call}: {}", r.text());
    }
    // The script loaded too (the filter here runs the function), to show SCRIPT FLUSH keeps it.
    let mut admin = stack.redis.admin();
    assert_eq!(
        admin
            .cmd(&["SCRIPT", "LOAD", &ratelimit_core::decision_script()])
            .unwrap()
            .text(),
        sha
    );
    // FUNCTION and SCRIPT pass Webdis (its ACL cannot tell LOAD from FLUSH or DELETE), Redis's
    // ACL stops all but LOAD.
    let library = function.library_name();
    for path in [
        "/SCRIPT/FLUSH".to_string(),
        "/FUNCTION/FLUSH".to_string(),
        format!("/FUNCTION/DELETE/{library}"),
    ] {
        let r = get(port, &path, &with_auth).unwrap();
        assert!(r.text().contains("NOPERM"), "{path}: {}", r.text());
    }
    // Nothing was flushed: the buckets (the key's and the address's) are still there, the
    // library the filter loaded, and the script.
    assert_eq!(admin.cmd(&["DBSIZE"]).unwrap().int(), 2);
    let libraries = admin
        .cmd(&["FUNCTION", "LIST", "LIBRARYNAME", &library])
        .unwrap()
        .items();
    assert_eq!(libraries.len(), 1, "{libraries:?}");
    let exists = admin.cmd(&["SCRIPT", "EXISTS", &sha]).unwrap().items();
    assert_eq!(exists[0].int(), 1);
}
