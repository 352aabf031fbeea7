//! ratelimit-check and the filter in a real Envoy agree: for the shipped config and broken
//! variants of it, the checker accepts what `envoy --mode validate` accepts, and refuses what it
//! refuses with the very message the filter logs.

use e2e::procs::{validate_config, WorkDir};
use e2e::root;

/// The shipped config, and variants of it each with one edit, by name.
fn cases(shipped: &str) -> Vec<(&'static str, String)> {
    let value_start = shipped.find("                configuration:").unwrap();
    let value_end = shipped
        .find("          - name: envoy.filters.http.router")
        .unwrap();
    let as_struct = format!(
        "{}{}{}",
        &shipped[..value_start],
        r#"                configuration:
                  "@type": type.googleapis.com/google.protobuf.Struct
                  value:
                    bridge: { cluster: webdis, authority: webdis, timeout: 150ms }
                    rules:
                    - name: per_client
                      limits: [{ name: per_minute, limit: 10, window: 1m }]
"#,
        &shipped[value_end..]
    );
    let edit = |from: &str, to: &str| {
        assert!(shipped.contains(from), "{from} is not in envoy/envoy.yaml");
        shipped.replacen(from, to, 1)
    };
    vec![
        ("shipped", shipped.to_string()),
        ("limit 0", edit(r#""limit": 10"#, r#""limit": 0"#)),
        (
            "bad window",
            edit(r#""window": "1m""#, r#""window": "fortnight""#),
        ),
        ("unknown algorithm", edit("token_bucket", "leaky_bucket")),
        ("unknown field", edit(r#""key_prefix""#, r#""key_prefixx""#)),
        ("a Struct", as_struct),
    ]
}

#[test]
fn checker_and_envoy_agree_on_each_config() {
    e2e::wasm_path();
    let shipped = std::fs::read_to_string(root().join("envoy/envoy.yaml")).unwrap();
    let dir = WorkDir::new("checker-agrees");
    let mut refused = 0;
    for (name, yaml) in cases(&shipped) {
        let found = ratelimit_check::find(&yaml).unwrap();
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        let path = dir.file(&format!("{}.yaml", name.replace(' ', "-")));
        std::fs::write(&path, &yaml).unwrap();
        let (envoy_ok, output) = validate_config(&root(), &path);
        match &found[0].result {
            Ok(_) => assert!(envoy_ok, "{name}: checked OK, Envoy refuses it:\n{output}"),
            Err(error) => {
                assert!(
                    !envoy_ok,
                    "{name}: the checker refuses it ({error}), Envoy accepts it"
                );
                let line = format!("invalid filter configuration: {error}");
                assert!(
                    output.contains(&line),
                    "{name}: Envoy's log lacks `{line}`:\n{output}"
                );
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 5, "every broken variant is refused");
}
