//! The command as a user runs it: what it prints and its exit status.

// A failed setup step (writing a file, starting the binary) is the test failing.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

const GOOD: &str = r#"{"bridge": {"cluster": "webdis"}, "rules": [{"name": "r", "limits": [{"name": "m", "limit": 10, "window": "1m"}]}]}"#;

/// A file of this test's own under the target directory.
fn file(name: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ratelimit-check-cli");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn check(args: &[&str], files: &[&PathBuf]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(env!("CARGO_BIN_EXE_ratelimit-check"))
        .args(args)
        .args(files)
        .output()
        .unwrap();
    (
        status.code().unwrap(),
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(stderr).unwrap(),
    )
}

#[test]
fn a_valid_config_prints_ok_and_its_policy() {
    let path = file("good.json", GOOD);
    let (code, out, err) = check(&[], &[&path]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert_eq!(
        out,
        format!(
            "{}: document 1: OK\n  bridge: cluster webdis, authority webdis, no auth, timeout 150ms\n  rule r: every request; key header:x-api-key, else client_ip, else one shared anonymous key; failure mode open\n    limit m: token_bucket 10 per 1m, burst 10, cost 1, no lease\n  warning: rule r keys on header:x-api-key, which the client chooses: every made-up value gets a bucket of its own, and no rule limits the same requests by client_ip (see docs/security.md)\n",
            path.display()
        )
    );
}

#[test]
fn a_usage_limit_is_summed_up_by_where_its_usage_is_read_and_how_it_admits() {
    let config = r#"{"bridge": {"cluster": "webdis"}, "rules": [{"name": "r", "limits": [
        {"name": "t", "limit": 1000, "window": "1m", "usage": {"from": "body:usage.total_tokens", "estimate": 100}},
        {"name": "a", "limit": 1000, "window": "1m", "usage": {"from": "header:x-usage", "admit": "after", "estimate": 5}}]}]}"#;
    let path = file("usage.json", config);
    let (code, out, err) = check(&[], &[&path]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert!(
        out.contains("limit t: token_bucket 1000 per 1m, burst 1000, metered by the usage in the response's body usage.total_tokens: estimate 100 reserved up front, settled to the usage, no lease\n"),
        "{out}"
    );
    assert!(
        out.contains("limit a: token_bucket 1000 per 1m, burst 1000, metered by the usage in the response's header x-usage: admitted while the balance is positive, charged after (estimate 5 when unreadable), no lease\n"),
        "{out}"
    );
}

#[test]
fn a_broken_config_in_a_config_map_names_file_document_object_and_field() {
    let manifest = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{ name: shop }}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: ratelimit-filter }}\ndata:\n  filter.json: '{}'\n",
        GOOD.replace(r#""limit": 10"#, r#""limit": 0"#)
    );
    let path = file("broken.yaml", &manifest);
    let (code, out, err) = check(&[], &[&path]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err,
        format!(
            "{}: document 2 (ConfigMap ratelimit-filter): data[\"filter.json\"]: invalid filter configuration: rules[0].limits[0].limit: must be >= 1\n",
            path.display()
        )
    );
}

#[test]
fn a_file_without_a_config_fails_unless_another_holds_one() {
    let path = file(
        "none.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata: { name: shop }\n",
    );
    let good = file("good3.json", GOOD);
    let (code, _, err) = check(&[], &[&path, &good]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!("{}: no rate-limit filter config found\n", path.display())
    );
    let (code, out, err) = check(&["--allow-none"], &[&path, &good]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert!(
        out.starts_with(&format!(
            "{}: no rate-limit filter config\n",
            path.display()
        )),
        "{out}"
    );
    let (code, _, err) = check(&["--allow-none"], &[&path]);
    assert_eq!(code, 1);
    assert_eq!(err, "no rate-limit filter config in any of the files\n");
}

#[test]
fn unreadable_or_unparsable_files_exit_2_naming_file_and_line() {
    let path = file("bad.yaml", "a: 1\nb: [1, 2\nc: 3\n");
    let good = file("good2.json", GOOD);
    let (code, _, err) = check(&[], &[&path, &good]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with(&format!("{}: not valid YAML or JSON: ", path.display()))
            && err.contains("line 3"),
        "{err}"
    );
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such-file.yaml");
    let (code, _, err) = check(&[], &[&missing]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with(&format!("{}: cannot read: ", missing.display())),
        "{err}"
    );
}

#[test]
fn a_probe_needs_an_http_url() {
    let path = file("good4.json", GOOD);
    for args in [
        &["--probe", "https://127.0.0.1:7379"][..],
        &["--probe=127.0.0.1:7379"],
        &["--probe"],
    ] {
        let (code, out, err) = check(args, &[&path]);
        assert_eq!((code, out.as_str()), (2, ""), "{args:?}");
        assert!(err.starts_with("ratelimit-check: --probe: "), "{err}");
    }
}

/// A bridge that cannot be reached is an outage, not a setting: exit 3, after the config's
/// own check; an invalid config is not probed.
#[test]
fn a_probe_of_a_bridge_that_does_not_answer_exits_3() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let url = format!("http://127.0.0.1:{port}");
    let path = file("good5.json", GOOD);
    let (code, out, err) = check(&["--probe", &url], &[&path]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(out.contains("document 1: OK\n"), "{out}");
    assert!(
        out.contains("(the filter's decision call): FAILED: cannot connect to 127.0.0.1:"),
        "{out}"
    );
    assert_eq!(
        err,
        format!(
            "{}: document 1: the bridge at {url} did not answer as the filter needs (see above)\n",
            path.display()
        )
    );
    let broken = file(
        "broken2.json",
        &GOOD.replace(r#""limit": 10"#, r#""limit": 0"#),
    );
    let (code, out, _) = check(&["--probe", &url], &[&broken]);
    assert_eq!(code, 1);
    assert!(!out.contains("probing"), "{out}");
}
