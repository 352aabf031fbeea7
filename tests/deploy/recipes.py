"""Checks that each deployment recipe under deploy/ fits together across its files, which no
schema sees: the filter's bridge.cluster is a cluster of that Envoy whose endpoint is the
Webdis beside it; the bridge credentials are a basic-auth user of that Webdis; Webdis's
redis_auth is the password of the recipe's Redis `default` user and its redis_host the recipe's
Redis; Webdis keeps the shipped lock-down (envoy/webdis.json); the stats tags are those of
envoy/envoy.yaml; what the manifests mount exists. Every check is first shown to fail on a
broken copy of a recipe. Run from anywhere: python3 tests/deploy/recipes.py"""

import copy
import json
import os
import re
import sys

import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
WASM_FILTER = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"


def load(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(docs, kind, name, namespace=None):
    for d in docs:
        meta = d.get("metadata", {})
        if d.get("kind") == kind and meta.get("name") == name and (
            namespace is None or meta.get("namespace") == namespace
        ):
            return d
    raise SystemExit(f"no {kind} {namespace}/{name} in the recipe")


def walk(node):
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    for child in children:
        yield from walk(child)


def envoy_filters(envoy):
    """The rate-limit filter configs (parsed JSON) of an Envoy config."""
    return [
        json.loads(n["typed_config"]["config"]["configuration"]["value"])
        for n in walk(envoy)
        if isinstance(n, dict) and n.get("typed_config", {}).get("@type") == WASM_FILTER
    ]


def endpoints(clusters):
    """{cluster name: (address, port)} of static clusters with one endpoint."""
    out = {}
    for c in clusters:
        lb = c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        out[c["name"]] = (lb["socket_address"]["address"], lb["socket_address"]["port_value"])
    return out


def default_user_password(users):
    line = next(l.strip() for l in users.splitlines() if l.strip().startswith("user default "))
    return re.search(r"\s>(\S+)", line).group(1)


def k8s_service_hosts(docs):
    return {
        f"{d['metadata']['name']}.{d['metadata']['namespace']}.svc.cluster.local"
        for d in docs
        if d["kind"] == "Service"
    }


def pod_refs(pod_spec, namespace):
    """(kind, namespace, name) of the Secrets and ConfigMaps a pod spec's volumes name."""
    refs = set()
    for v in pod_spec.get("volumes", []):
        if "secret" in v:
            refs.add(("Secret", namespace, v["secret"]["secretName"]))
        if "configMap" in v:
            refs.add(("ConfigMap", namespace, v["configMap"]["name"]))
    return refs


def redis_part():
    docs = load("deploy/kubernetes/10-redis.yaml")
    users = find(docs, "Secret", "redis-users", "ratelimit")["stringData"]
    return docs, users


def kubernetes():
    redis_docs, users = redis_part()
    docs = load("deploy/kubernetes/20-envoy.yaml")
    envoy = yaml.safe_load(find(docs, "ConfigMap", "envoy-config", "ratelimit")["data"]["envoy.yaml"])
    pod = find(docs, "Deployment", "envoy", "ratelimit")["spec"]["template"]["spec"]
    return {
        "filters": envoy_filters(envoy),
        "clusters": endpoints(envoy["static_resources"]["clusters"]),
        "stats_tags": envoy["stats_config"]["stats_tags"],
        "webdis": json.loads(find(docs, "Secret", "webdis-config", "ratelimit")["stringData"]["webdis.json"]),
        "redis_users": users["users.acl"],
        "redis_hosts": k8s_service_hosts(redis_docs),
        "refs": pod_refs(pod, "ratelimit"),
        "objects": {(d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs + redis_docs},
        "extra": [("admin-password is the admin user's", users["admin-password"]
                   == re.search(r"user admin on >(\S+)", users["users.acl"]).group(1))],
    }


def istio():
    redis_docs, users = redis_part()
    docs = load("deploy/istio/10-gateway.yaml") + load("deploy/istio/20-webdis-cluster.yaml")
    plugin = load("deploy/istio/30-wasmplugin.yaml")[0]["spec"]
    clusters = {}
    for se in (d for d in docs if d["kind"] == "ServiceEntry"):
        for host in se["spec"]["hosts"]:
            for port in se["spec"]["ports"]:
                for ep in se["spec"]["endpoints"]:
                    clusters[f"outbound|{port['number']}||{host}"] = (ep["address"], port["number"])
    bootstrap = find(docs, "ConfigMap", "ratelimit-bootstrap", "istio-ingress")["data"]["custom_bootstrap.json"]
    template = find(docs, "Deployment", "ratelimit-gateway", "istio-ingress")["spec"]["template"]
    proxy = next(c for c in template["spec"]["containers"] if c["name"] == "istio-proxy")
    override = next(e["value"] for e in proxy["env"] if e["name"] == "ISTIO_BOOTSTRAP_OVERRIDE")
    mounts = {m["name"]: m["mountPath"] for m in proxy["volumeMounts"]}
    volume = next(v["name"] for v in template["spec"]["volumes"]
                  if v.get("configMap", {}).get("name") == "ratelimit-bootstrap")
    matcher = yaml.safe_load(template["metadata"]["annotations"]["proxy.istio.io/config"])
    prefixes = matcher["proxyStatsMatcher"]["inclusionPrefixes"]
    return {
        "filters": [plugin["pluginConfig"]],
        "clusters": clusters,
        "stats_tags": json.loads(bootstrap)["stats_config"]["stats_tags"],
        "webdis": json.loads(find(docs, "Secret", "webdis-config", "istio-ingress")["stringData"]["webdis.json"]),
        "redis_users": users["users.acl"],
        "redis_hosts": k8s_service_hosts(redis_docs),
        "refs": pod_refs(template["spec"], "istio-ingress"),
        "objects": {(d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs},
        "extra": [
            ("ISTIO_BOOTSTRAP_OVERRIDE is the mounted ConfigMap's file",
             override == mounts.get(volume, "?") + "/custom_bootstrap.json"),
            ("the proxy keeps the filter's stats (proxyStatsMatcher)",
             any("wasmcustom.ratelimit_rule.".startswith(p) for p in prefixes)),
            ("the WasmPlugin selects the gateway's pods",
             plugin["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()),
        ],
    }


def envoy_gateway():
    redis_docs, users = redis_part()
    secret = load("deploy/envoy-gateway/10-webdis-secret.yaml")
    proxy = load("deploy/envoy-gateway/20-envoyproxy.yaml")[0]
    policy = load("deploy/envoy-gateway/40-extension-policy.yaml")[0]
    bootstrap = yaml.safe_load(proxy["spec"]["bootstrap"]["value"])
    patch = proxy["spec"]["provider"]["kubernetes"]["envoyDeployment"]["patch"]["value"]
    # The proxy pods live in Envoy Gateway's namespace, where the Secret must be.
    return {
        "filters": [w["config"] for w in policy["spec"]["wasm"]],
        "clusters": endpoints(bootstrap["static_resources"]["clusters"]),
        "stats_tags": bootstrap["stats_config"]["stats_tags"],
        "webdis": json.loads(find(secret, "Secret", "webdis-config", "envoy-gateway-system")["stringData"]["webdis.json"]),
        "redis_users": users["users.acl"],
        "redis_hosts": k8s_service_hosts(redis_docs),
        "refs": pod_refs(patch["spec"]["template"]["spec"], "envoy-gateway-system"),
        "objects": {(d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]) for d in secret},
        "extra": [("the Merge bootstrap holds no secret", "password" not in proxy["spec"]["bootstrap"]["value"])],
    }


def compose():
    base = "deploy/compose/"
    spec = load(base + "compose.yaml")[0]
    envoy = load(base + "envoy.yaml")[0]
    with open(os.path.join(ROOT, base, "webdis.json"), encoding="utf-8") as f:
        webdis = json.load(f)
    with open(os.path.join(ROOT, base, "redis.conf"), encoding="utf-8") as f:
        redis_conf = f.read()
    module = next(n["filename"] for n in walk(envoy) if isinstance(n, dict) and "filename" in n)
    mounts = {m.split(":")[1]: m.split(":")[0] for s in spec["services"].values() for m in s.get("volumes", [])}
    return {
        "filters": envoy_filters(envoy),
        "clusters": endpoints(envoy["static_resources"]["clusters"]),
        "stats_tags": envoy["stats_config"]["stats_tags"],
        "webdis": webdis,
        "redis_users": redis_conf,
        "redis_hosts": set(spec["services"]),
        "refs": set(),
        "objects": set(),
        "extra": [
            ("the module is mounted from target/dist", mounts.get(module) == "../../target/dist/ratelimit_filter.wasm"),
            ("every mounted file of deploy/compose exists",
             all(os.path.exists(os.path.join(ROOT, base, src)) for src in mounts.values() if src.startswith("./"))),
            ("Webdis shares Envoy's network namespace", spec["services"]["webdis"].get("network_mode") == "service:envoy"),
        ],
    }


def shipped():
    envoy = load("envoy/envoy.yaml")[0]
    with open(os.path.join(ROOT, "envoy/webdis.json"), encoding="utf-8") as f:
        return envoy["stats_config"]["stats_tags"], json.load(f)


def lock_down(webdis):
    """Webdis's settings with the values each deployment sets for itself blanked out."""
    out = copy.deepcopy(webdis)
    for key in ("redis_host", "redis_auth"):
        out.pop(key, None)
    for entry in out.get("acl", []):
        if "http_basic_auth" in entry:
            entry["http_basic_auth"] = entry["http_basic_auth"].split(":")[0]
    return out


def problems(recipe, shipped_tags, shipped_webdis):
    webdis = recipe["webdis"]
    if not recipe["filters"]:
        yield "no rate-limit filter config"
    if webdis.get("http_host") != "127.0.0.1":
        yield f"Webdis listens on {webdis.get('http_host')}, not on loopback"
    users = {e["http_basic_auth"] for e in webdis.get("acl", []) if "http_basic_auth" in e}
    for i, f in enumerate(recipe["filters"]):
        bridge = f.get("bridge", {})
        cluster = bridge.get("cluster", "webdis")
        where = recipe["clusters"].get(cluster)
        if where is None:
            yield f"filter {i}: bridge.cluster {cluster!r} is not a cluster of its Envoy ({sorted(recipe['clusters'])})"
        elif where != ("127.0.0.1", webdis.get("http_port")):
            yield f"filter {i}: cluster {cluster!r} reaches {where}, not Webdis at 127.0.0.1:{webdis.get('http_port')}"
        if f"{bridge.get('username')}:{bridge.get('password')}" not in users:
            yield f"filter {i}: bridge.username/password are not a http_basic_auth user of its Webdis"
    if webdis.get("redis_auth") != default_user_password(recipe["redis_users"]):
        yield "Webdis's redis_auth is not the password of Redis's `default` user"
    if webdis.get("redis_host") not in recipe["redis_hosts"]:
        yield f"Webdis's redis_host {webdis.get('redis_host')!r} is not the recipe's Redis ({sorted(recipe['redis_hosts'])})"
    if lock_down(webdis) != lock_down(shipped_webdis):
        yield "Webdis's settings differ from envoy/webdis.json's (beyond redis_host, redis_auth and passwords)"
    if recipe["stats_tags"] != shipped_tags:
        yield "the stats tags differ from envoy/envoy.yaml's"
    for ref in sorted(recipe["refs"] - recipe["objects"]):
        yield f"a pod mounts {ref[0]} {ref[1]}/{ref[2]}, which the recipe does not define there"
    for what, ok in recipe["extra"]:
        if not ok:
            yield f"not so: {what}"


# Broken copies: each must make problems() report something.
def set_password(r):
    r["filters"][0]["bridge"]["password"] = "other"


def set_cluster(r):
    r["filters"][0].setdefault("bridge", {})["cluster"] = "nowhere"


def set_redis_auth(r):
    r["webdis"]["redis_auth"] = "other"


def set_redis_host(r):
    r["webdis"]["redis_host"] = "elsewhere"


def open_webdis(r):
    r["webdis"]["acl"] = [{"enabled": ["*"]}]


def drop_tag(r):
    r["stats_tags"] = r["stats_tags"][:1]


def move_webdis(r):
    r["webdis"]["http_port"] = 7380


BREAKAGES = [set_password, set_cluster, set_redis_auth, set_redis_host, open_webdis, drop_tag, move_webdis]


def main():
    shipped_tags, shipped_webdis = shipped()
    recipes = {"kubernetes": kubernetes(), "istio": istio(), "envoy-gateway": envoy_gateway(), "compose": compose()}
    failed = False
    for name, recipe in recipes.items():
        for breakage in BREAKAGES:
            broken = copy.deepcopy(recipe)
            breakage(broken)
            if not list(problems(broken, shipped_tags, shipped_webdis)):
                print(f"deploy/{name}: the check misses a broken copy ({breakage.__name__})")
                failed = True
        found = list(problems(recipe, shipped_tags, shipped_webdis))
        for p in found:
            print(f"deploy/{name}: {p}")
        failed |= bool(found)
        if not found:
            print(f"deploy/{name}: ok ({len(recipe['filters'])} filter config, {len(BREAKAGES)} broken copies caught)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
