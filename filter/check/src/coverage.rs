//! What a policy leaves open: requests no rule limits, and rules a client can escape by
//! making up the value of a source it chooses.
//!
//! Uncovered requests are found by asking the filter's own planner about probe requests: one
//! of each kind the config tells apart (each rule's paths and one under no rule, each method
//! it names and one it does not, each source its matches and keys read absent, present with a
//! value no rule names, and with each value a rule names). A probe no rule limits is reported
//! with what made it so.

use std::collections::BTreeSet;

use ratelimit_core::config::{BodyPath, Config, KeySource, PathMatch, Test, WhenMissing};
use ratelimit_core::request::plan::plan;
use ratelimit_core::request::view::BadRequest;
use ratelimit_core::RequestView;

/// Probes asked at most: enough for every kind of request of a config of tens of rules.
const MAX_PROBES: usize = 20_000;
/// Uncovered requests shown at most.
const SHOWN: usize = 5;
/// A value no rule names.
const UNLISTED: &[u8] = b"unlisted-value";

/// The findings, one line each (no indent), empty when every request is limited and no rule
/// keys only on what the client chooses.
pub fn findings(config: &Config) -> Vec<String> {
    let mut lines = Vec::new();
    let uncovered = uncovered(config);
    if !uncovered.is_empty() {
        lines.push(format!(
            "requests no rule limits, for example: {}",
            uncovered.join("; ")
        ));
    }
    lines.extend(client_chosen(config));
    lines.extend(body_everywhere(config));
    lines
}

/// A warning per rule that reads the request body on every path: each request with a body,
/// on any route, is held until its body ends (a stream that stays open is held as long).
fn body_everywhere(config: &Config) -> Vec<String> {
    let mut lines = Vec::new();
    let mut warned = BTreeSet::new();
    for rule in &config.rules {
        let Some(path) = rule.body_paths().next() else {
            continue;
        };
        if rule.matcher.path.is_some() || !warned.insert(rule.name.clone()) {
            continue;
        }
        lines.push(format!(
            "warning: rule {} reads body:{} on every path: each request with a body is held until it ends (a body too large for it is answered 413); give it a path_prefix or path_exact",
            rule.name,
            path.keys.join(":")
        ));
    }
    lines
}

/// A request as a probe: method, path, and the sources set on it.
#[derive(Clone, Debug, Default)]
struct Probe {
    method: String,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    query: Vec<(String, Vec<u8>)>,
    metadata: Vec<(String, Vec<u8>)>,
    body: Vec<(BodyPath, Vec<u8>)>,
    route: Option<String>,
    /// The full path with its query string (`:path`).
    full_path: String,
}

impl Probe {
    fn set(&mut self, source: &KeySource, value: &[u8]) {
        match source {
            KeySource::Header(name) => self.headers.push((name.clone(), value.to_vec())),
            KeySource::Query(name) => self.query.push((name.clone(), value.to_vec())),
            KeySource::Metadata(path) => self
                .metadata
                .push((property_name(&path.property()), value.to_vec())),
            KeySource::Body(path) => self.body.push((path.clone(), value.to_vec())),
            KeySource::Route => self.route = Some(String::from_utf8_lossy(value).into_owned()),
            KeySource::ClientIp | KeySource::Method | KeySource::Path => {}
        }
    }

    fn finish(mut self) -> Probe {
        let mut path = self.path.clone();
        for (i, (name, value)) in self.query.iter().enumerate() {
            path.push(if i == 0 { '?' } else { '&' });
            path.push_str(&encode(name.as_bytes()));
            path.push('=');
            path.push_str(&encode(value));
        }
        self.full_path = path;
        self
    }

    /// The probe for people: `GET /api/x with header:x-api-key = "unlisted-value"`.
    fn shown(&self, sources: &[KeySource]) -> String {
        let mut set = Vec::new();
        for (name, value) in &self.headers {
            set.push(format!(
                "header:{name} = {:?}",
                String::from_utf8_lossy(value)
            ));
        }
        for (name, value) in &self.query {
            set.push(format!(
                "query:{name} = {:?}",
                String::from_utf8_lossy(value)
            ));
        }
        for source in sources {
            if let KeySource::Metadata(path) = source {
                let name = property_name(&path.property());
                if let Some((_, value)) = self.metadata.iter().find(|(n, _)| *n == name) {
                    set.push(format!(
                        "metadata:{}:{} = {:?}",
                        path.namespace,
                        path.keys.join(":"),
                        String::from_utf8_lossy(value)
                    ));
                }
            }
        }
        for (path, value) in &self.body {
            set.push(format!(
                "body:{} = {:?}",
                path.keys.join(":"),
                String::from_utf8_lossy(value)
            ));
        }
        if let Some(route) = &self.route {
            set.push(format!("route = {route:?}"));
        }
        let mut text = format!("{} {}", self.method, self.path);
        if set.is_empty() {
            if !sources.is_empty() {
                text.push_str(" with none of the sources the rules read");
            }
        } else {
            text.push_str(" with ");
            text.push_str(&set.join(", "));
        }
        text
    }
}

fn property_name(path: &[&str]) -> String {
    path.join("\u{1f}")
}

fn encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl RequestView for Probe {
    fn header(&self, name: &str) -> Option<&[u8]> {
        match name {
            ":method" => Some(self.method.as_bytes()),
            ":path" => Some(self.full_path.as_bytes()),
            _ => self
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_slice()),
        }
    }
    fn header_copies(&self, name: &str) -> usize {
        usize::from(self.header(name).is_some())
    }
    fn source_address(&self) -> Option<String> {
        Some("192.0.2.1:40000".to_string())
    }
    fn route_name(&self) -> Option<String> {
        self.route.clone()
    }
    fn metadata(&self, path: &ratelimit_core::config::MetadataPath) -> Option<Vec<u8>> {
        let name = property_name(&path.property());
        self.metadata
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    }
    fn body_field(&self, path: &BodyPath) -> Result<Option<&[u8]>, BadRequest> {
        Ok(self
            .body
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, v)| v.as_slice()))
    }
}

/// Examples of requests no rule limits (at most [`SHOWN`]), each of another kind.
fn uncovered(config: &Config) -> Vec<String> {
    let mut paths: BTreeSet<String> = BTreeSet::new();
    let mut methods: BTreeSet<String> = ["GET", "POST"].map(String::from).into();
    let mut sources: Vec<KeySource> = Vec::new();
    let mut values: Vec<(KeySource, Vec<u8>)> = Vec::new();
    let add_source = |s: &KeySource, sources: &mut Vec<KeySource>| {
        if !sources.contains(s) {
            sources.push(s.clone());
        }
    };
    paths.insert("/".into());
    paths.insert("/no-rule-names-this-path".into());
    for rule in &config.rules {
        match &rule.matcher.path {
            Some(PathMatch::Exact(p)) => {
                paths.insert(p.clone());
            }
            Some(PathMatch::Prefix(p)) => {
                paths.insert(p.clone());
                paths.insert(format!("{p}{}x", if p.ends_with('/') { "" } else { "/" }));
            }
            None => {}
        }
        methods.extend(rule.matcher.methods.iter().cloned());
        for condition in &rule.matcher.conditions {
            add_source(&condition.source, &mut sources);
            if let Test::In(listed) | Test::NotIn(listed) = &condition.test {
                for v in listed {
                    values.push((condition.source.clone(), v.clone()));
                }
            }
        }
        for alternative in &rule.key.alternatives {
            for source in &alternative.sources {
                add_source(source, &mut sources);
            }
        }
    }
    methods.insert("PATCH".into());
    let settable: Vec<KeySource> = sources
        .into_iter()
        .filter(|s| !matches!(s, KeySource::ClientIp | KeySource::Method | KeySource::Path))
        .collect();
    // Per path and method: nothing set, everything set to an unlisted value, then each source
    // alone unlisted, and each listed value alone and over everything set.
    let mut variants: Vec<Vec<(KeySource, Vec<u8>)>> = vec![Vec::new()];
    let all_unlisted: Vec<(KeySource, Vec<u8>)> = settable
        .iter()
        .map(|s| (s.clone(), UNLISTED.to_vec()))
        .collect();
    if !settable.is_empty() {
        variants.push(all_unlisted.clone());
    }
    for s in &settable {
        variants.push(vec![(s.clone(), UNLISTED.to_vec())]);
    }
    for (s, v) in &values {
        variants.push(vec![(s.clone(), v.clone())]);
        let mut over = all_unlisted.clone();
        over.retain(|(o, _)| o != s);
        over.push((s.clone(), v.clone()));
        variants.push(over);
    }
    let mut shown = Vec::new();
    let mut kinds = BTreeSet::new();
    let mut asked = 0;
    'probes: for path in &paths {
        for method in &methods {
            for variant in &variants {
                asked += 1;
                if asked > MAX_PROBES || shown.len() >= SHOWN {
                    break 'probes;
                }
                let mut probe = Probe {
                    method: method.clone(),
                    path: path.clone(),
                    ..Probe::default()
                };
                for (source, value) in variant {
                    probe.set(source, value);
                }
                let probe = probe.finish();
                // A bad request (a source sent twice) is answered, not let through.
                let Ok(plan) = plan(config, &probe) else {
                    continue;
                };
                if !plan.checks.is_empty() {
                    continue;
                }
                // One example per path: the first, with the fewest sources set.
                if kinds.insert(path.clone()) {
                    shown.push(probe.shown(&settable));
                }
            }
        }
    }
    shown
}

/// A warning per rule whose key can be a value the client chooses (a header, a query
/// parameter, the path) where no rule limits the same requests by the client's IP: each
/// made-up value gets a fresh bucket.
fn client_chosen(config: &Config) -> Vec<String> {
    let mut lines = Vec::new();
    let mut warned = BTreeSet::new();
    for rule in &config.rules {
        let chosen: Vec<&str> = rule
            .key
            .alternatives
            .iter()
            .filter(|a| a.sources.iter().any(KeySource::client_chosen))
            .map(|a| a.label.as_str())
            .collect();
        if chosen.is_empty() || warned.contains(&rule.name) {
            continue;
        }
        let held = config.rules.iter().any(|ceiling| {
            let by_ip = ceiling.key.alternatives.iter().all(|a| {
                a.sources
                    .iter()
                    .all(|s| matches!(s, KeySource::ClientIp | KeySource::Route))
            }) && ceiling.key.when_missing == WhenMissing::Anonymous;
            // A shadow rule is held (in its reports) by a shadow ceiling too.
            by_ip && (!ceiling.shadow || rule.shadow) && covers(&ceiling.matcher, &rule.matcher)
        });
        if !held {
            warned.insert(rule.name.clone());
            lines.push(format!(
                "warning: rule {} keys on {}, which the client chooses: every made-up value gets a bucket of its own, and no rule limits the same requests by client_ip (see docs/security.md)",
                rule.name,
                chosen.join(", ")
            ));
        }
    }
    lines
}

/// Whether every request `inner` matches, `outer` matches too (sure cases only).
fn covers(outer: &ratelimit_core::config::Match, inner: &ratelimit_core::config::Match) -> bool {
    let path = match (&outer.path, &inner.path) {
        (None, _) => true,
        (Some(PathMatch::Exact(o)), Some(PathMatch::Exact(i))) => o == i,
        (Some(PathMatch::Prefix(o)), Some(PathMatch::Exact(i) | PathMatch::Prefix(i))) => {
            i.starts_with(o.as_str())
        }
        _ => false,
    };
    let methods = outer.methods.is_empty()
        || (!inner.methods.is_empty() && inner.methods.iter().all(|m| outer.methods.contains(m)));
    let conditions = outer
        .conditions
        .iter()
        .all(|c| inner.conditions.contains(c));
    path && methods && conditions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rules: &str) -> Config {
        Config::parse(format!(r#"{{"rules": [{rules}]}}"#).as_bytes())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    const LIMITS: &str = r#""limits": [{"name": "l", "limit": 5, "window": "1s"}]"#;

    #[test]
    fn a_catch_all_rule_leaves_nothing_open() {
        let c = config(&format!(
            r#"{{"name": "ip", "key": {{"from": ["client_ip"]}}, {LIMITS}}}"#
        ));
        assert_eq!(findings(&c), Vec::<String>::new());
    }

    #[test]
    fn uncovered_paths_methods_and_skipped_keys_are_shown() {
        let c = config(&format!(
            r#"{{"name": "login", "match": {{"path_exact": "/login", "methods": ["POST"]}}, "key": {{"from": ["client_ip"]}}, {LIMITS}}},
               {{"name": "api", "match": {{"path_prefix": "/api/"}}, "key": {{"from": ["metadata:envoy.filters.http.jwt_authn:jwt_payload:sub"], "when_missing": "skip"}}, {LIMITS}}}"#
        ));
        let found = findings(&c);
        assert_eq!(found.len(), 1, "{found:?}");
        let line = &found[0];
        assert!(
            line.starts_with("requests no rule limits, for example: "),
            "{line}"
        );
        assert!(line.contains("GET / with none of the sources"), "{line}");
        assert!(
            line.contains("GET /api/ with none of the sources"),
            "{line}"
        );
        assert!(line.contains("GET /login with none"), "{line}");
        assert!(!line.contains("POST /login"), "{line}");
    }

    #[test]
    fn plans_cover_every_request_of_their_rule() {
        let c = config(&format!(
            r#"{{"name": "api", "key": {{"from": ["metadata:ns:sub", "client_ip"]}}, "plan_from": "metadata:ns:plan", "plans": [
                 {{"name": "pro", "values": ["pro"], {LIMITS}}},
                 {{"name": "other", "default": true, {LIMITS}}}]}}"#
        ));
        assert_eq!(findings(&c), Vec::<String>::new());
        // The same written as rules, without a default and anonymous requests taken apart:
        // the unknown plans are left open.
        let listed = config(&format!(
            r#"{{"name": "pro", "match": {{"sources": [{{"source": "metadata:ns:plan", "in": ["pro"]}}]}}, "key": {{"from": ["client_ip"]}}, {LIMITS}}},
               {{"name": "anonymous", "match": {{"sources": [{{"source": "metadata:ns:plan", "present": false}}]}}, "key": {{"from": ["client_ip"]}}, {LIMITS}}}"#
        ));
        let found = findings(&listed);
        assert!(
            found[0].contains("GET / with metadata:ns:plan = \"unlisted-value\""),
            "{found:?}"
        );
    }

    #[test]
    fn a_client_chosen_key_without_an_ip_ceiling_is_warned() {
        let alone = config(&format!(
            r#"{{"name": "api", "key": {{"from": ["header:x-api-key", "client_ip"]}}, {LIMITS}}}"#
        ));
        let found = findings(&alone);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0]
            .starts_with("warning: rule api keys on header:x-api-key, which the client chooses"));
        let held = config(&format!(
            r#"{{"name": "api", "match": {{"path_prefix": "/api/"}}, "key": {{"from": ["header:x-api-key", "client_ip"]}}, {LIMITS}}},
               {{"name": "per_ip", "key": {{"from": ["client_ip"]}}, {LIMITS}}}"#
        ));
        assert_eq!(findings(&held), Vec::<String>::new());
        let verified = config(&format!(
            r#"{{"name": "api", "key": {{"from": ["metadata:ns:sub", "client_ip"]}}, {LIMITS}}}"#
        ));
        assert_eq!(findings(&verified), Vec::<String>::new());
    }

    #[test]
    fn a_rule_reading_the_body_on_every_path_is_warned() {
        let everywhere = config(&format!(
            r#"{{"name": "m", "match": {{"sources": [{{"source": "body:model", "in": ["x"]}}]}}, "key": {{"from": ["client_ip"]}}, {LIMITS}}}"#
        ));
        let found = findings(&everywhere);
        assert!(
            found.iter().any(|l| l.starts_with(
                "warning: rule m reads body:model on every path: each request with a body is held"
            )),
            "{found:?}"
        );
        let scoped = config(&format!(
            r#"{{"name": "m", "match": {{"path_prefix": "/v1/"}}, "key": {{"from": ["client_ip+body:model"]}}, {LIMITS}}}"#
        ));
        assert!(findings(&scoped).iter().all(|l| !l.contains("reads body:")));
    }
}
