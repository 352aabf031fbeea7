"""Checks every deployment manifest offline (`make deploy-test`, see docs/deploy.md).

For each YAML file under the given directories:
- Kubernetes built-in kinds are validated against the Kubernetes JSON schemas that PyPI's
  kubernetes-validate ships, strictly (an unknown field is an error), for each version given;
- the custom kinds it has no schema for (Istio, Envoy Gateway, Gateway API) get a structural
  check of the fields these recipes use (CRDS below); any other kind is an error;
- compose files get a structural check of their services and configs; Envoy configs are left
  to the filter-config check and to `make validate`;
- every YAML and JSON file is run through ratelimit-check: every filter config in it must be
  valid, and each recipe (directory) must hold at least one.
Before that, each check is shown to fail on a broken input (a bad Deployment, a WasmPlugin
without its url, a copy of a shipped manifest whose first limit is 0).
"""

import argparse
import copy
import pathlib
import re
import subprocess
import sys
import tempfile

import kubernetes_validate
import yaml

# A small schema language for the custom kinds: a check is a function (value, path) -> errors.
def typed(kind, name):
    def check(value, path):
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        return [] if ok else [f"{path}: must be {name}, is {type(value).__name__}"]
    return check


STRING = typed(str, "a string")
INTEGER = typed(int, "an integer")
BOOLEAN = typed(bool, "a boolean")
ANY_OBJECT = typed(dict, "an object")
ANY = lambda value, path: []  # noqa: E731


def enum(*allowed):
    def check(value, path):
        return [] if value in allowed else [f"{path}: must be one of {', '.join(allowed)}, is {value!r}"]
    return check


def list_of(item):
    def check(value, path):
        if not isinstance(value, list):
            return [f"{path}: must be a list"]
        return [e for i, v in enumerate(value) for e in item(v, f"{path}[{i}]")]
    return check


def map_of(item):
    def check(value, path):
        if not isinstance(value, dict):
            return [f"{path}: must be an object"]
        return [e for k, v in value.items() for e in item(v, f"{path}.{k}")]
    return check


def obj(required=None, optional=None, open_=False, one_of=()):
    """An object with these fields; unknown fields are errors unless open_. one_of: at least
    one of these names must be present."""
    required = required or {}
    optional = optional or {}

    def check(value, path):
        if not isinstance(value, dict):
            return [f"{path}: must be an object"]
        errors = [f"{path}.{k}: is required" for k in required if k not in value]
        if one_of and not any(k in value for k in one_of):
            errors.append(f"{path}: needs one of {', '.join(one_of)}")
        for k, v in value.items():
            field = required.get(k) or optional.get(k)
            if field is not None:
                errors += field(v, f"{path}.{k}")
            elif not open_:
                errors.append(f"{path}.{k}: unknown field")
        return errors
    return check


LABELS = map_of(STRING)
OBJECT_REF = obj({"name": STRING}, {"group": STRING, "kind": STRING, "namespace": STRING,
                                    "sectionName": STRING, "port": INTEGER})

# (API group, kind) -> (versions, spec check). Fields from each project's CRD reference.
CRDS = {
    ("extensions.istio.io", "WasmPlugin"): (("v1alpha1",), obj({"url": STRING}, {
        "sha256": STRING, "imagePullPolicy": enum("UNSPECIFIED_POLICY", "IfNotPresent", "Always"),
        "imagePullSecret": STRING, "pluginConfig": ANY_OBJECT, "pluginName": STRING,
        "phase": enum("UNSPECIFIED_PHASE", "AUTHN", "AUTHZ", "STATS"), "priority": INTEGER,
        "failStrategy": enum("FAIL_CLOSE", "FAIL_OPEN"), "verificationKey": STRING,
        "vmConfig": ANY_OBJECT, "match": list_of(ANY_OBJECT),
        "type": enum("UNSPECIFIED_PLUGIN_TYPE", "HTTP", "NETWORK"),
        "selector": obj(optional={"matchLabels": LABELS}),
        "targetRef": OBJECT_REF, "targetRefs": list_of(OBJECT_REF)})),
    ("networking.istio.io", "EnvoyFilter"): (("v1alpha3",), obj(optional={
        "workloadSelector": obj(optional={"labels": LABELS}), "priority": INTEGER,
        "targetRefs": list_of(OBJECT_REF),
        "configPatches": list_of(obj({"applyTo": STRING, "patch": obj(
            {"operation": STRING}, {"value": ANY_OBJECT, "filterClass": STRING})},
            {"match": ANY_OBJECT}))})),
    ("networking.istio.io", "ServiceEntry"): (("v1", "v1beta1"), obj({"hosts": list_of(STRING)}, {
        "addresses": list_of(STRING), "exportTo": list_of(STRING), "subjectAltNames": list_of(STRING),
        "location": enum("MESH_EXTERNAL", "MESH_INTERNAL"),
        "resolution": enum("NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN"),
        "ports": list_of(obj({"number": INTEGER, "name": STRING},
                             {"protocol": STRING, "targetPort": INTEGER})),
        "endpoints": list_of(obj(optional={"address": STRING, "ports": map_of(INTEGER),
                                           "labels": LABELS, "network": STRING,
                                           "locality": STRING, "weight": INTEGER})),
        "workloadSelector": obj(optional={"labels": LABELS})})),
    ("networking.istio.io", "DestinationRule"): (("v1", "v1beta1"), obj({"host": STRING}, {
        "exportTo": list_of(STRING), "trafficPolicy": ANY_OBJECT, "subsets": list_of(ANY_OBJECT),
        "workloadSelector": obj(optional={"matchLabels": LABELS})})),
    ("networking.istio.io", "Gateway"): (("v1", "v1beta1"), obj({"servers": list_of(obj(
        {"port": obj({"number": INTEGER, "protocol": STRING}, {"name": STRING, "targetPort": INTEGER}),
         "hosts": list_of(STRING)}, {"tls": ANY_OBJECT, "name": STRING, "bind": STRING,
                                     "defaultEndpoint": STRING}))}, {"selector": LABELS})),
    ("networking.istio.io", "VirtualService"): (("v1", "v1beta1"), obj(optional={
        "hosts": list_of(STRING), "gateways": list_of(STRING), "exportTo": list_of(STRING),
        "http": list_of(ANY_OBJECT), "tcp": list_of(ANY_OBJECT), "tls": list_of(ANY_OBJECT)})),
    ("gateway.envoyproxy.io", "HTTPRouteFilter"): (("v1alpha1",), obj(optional={
        "directResponse": obj(optional={"contentType": STRING, "statusCode": INTEGER,
                                        "body": obj({"type": enum("Inline", "ValueRef")},
                                                    {"inline": STRING, "valueRef": OBJECT_REF})}),
        "urlRewrite": ANY_OBJECT, "credentialInjection": ANY_OBJECT})),
    ("gateway.envoyproxy.io", "EnvoyExtensionPolicy"): (("v1alpha1",), obj(
        optional={"targetRef": OBJECT_REF, "targetRefs": list_of(OBJECT_REF),
                  "targetSelectors": list_of(ANY_OBJECT), "extProc": list_of(ANY_OBJECT),
                  "lua": list_of(ANY_OBJECT),
                  "wasm": list_of(obj({"code": obj({"type": enum("HTTP", "Image", "ConfigMap")}, {
                      "http": obj({"url": STRING}, {"sha256": STRING}),
                      "image": obj({"url": STRING}, {"sha256": STRING, "pullSecretRef": ANY_OBJECT}),
                      "pullPolicy": enum("IfNotPresent", "Always")})},
                      {"name": STRING, "rootID": STRING, "config": ANY, "failOpen": BOOLEAN,
                       "env": ANY_OBJECT}))},
        one_of=("targetRef", "targetRefs", "targetSelectors"))),
    ("gateway.envoyproxy.io", "EnvoyPatchPolicy"): (("v1alpha1",), obj(
        {"type": enum("JSONPatch"), "targetRef": OBJECT_REF},
        {"priority": INTEGER, "jsonPatches": list_of(obj(
            {"type": STRING, "name": STRING, "operation": obj(
                {"op": enum("add", "remove", "replace", "move", "copy", "test")},
                {"path": STRING, "jsonPath": STRING, "from": STRING, "value": ANY})}))})),
    ("gateway.envoyproxy.io", "EnvoyProxy"): (("v1alpha1",), obj(optional={
        "bootstrap": obj(optional={"type": enum("Merge", "Replace", "JSONPatch"), "value": STRING,
                                   "jsonPatches": list_of(ANY_OBJECT)})}, open_=True)),
    ("gateway.envoyproxy.io", "Backend"): (("v1alpha1",), obj(
        {"endpoints": list_of(ANY_OBJECT)}, open_=True)),
    ("gateway.networking.k8s.io", "GatewayClass"): (("v1",), obj(
        {"controllerName": STRING}, {"parametersRef": OBJECT_REF, "description": STRING})),
    ("gateway.networking.k8s.io", "Gateway"): (("v1",), obj(
        {"gatewayClassName": STRING, "listeners": list_of(obj(
            {"name": STRING, "port": INTEGER, "protocol": STRING},
            {"hostname": STRING, "allowedRoutes": ANY_OBJECT, "tls": ANY_OBJECT}))},
        {"addresses": list_of(ANY_OBJECT), "infrastructure": ANY_OBJECT})),
    ("gateway.networking.k8s.io", "HTTPRoute"): (("v1",), obj(optional={
        "parentRefs": list_of(OBJECT_REF), "hostnames": list_of(STRING),
        "rules": list_of(ANY_OBJECT)})),
}

# Kustomize's file has its fields at the top level, not under spec.
KUSTOMIZATION = obj(optional={
    "apiVersion": enum("kustomize.config.k8s.io/v1beta1"), "kind": enum("Kustomization"),
    "metadata": ANY_OBJECT, "namespace": STRING, "namePrefix": STRING, "nameSuffix": STRING,
    "resources": list_of(STRING), "components": list_of(STRING), "labels": list_of(ANY_OBJECT),
    "commonLabels": LABELS, "commonAnnotations": LABELS, "images": list_of(ANY_OBJECT),
    "configMapGenerator": list_of(ANY_OBJECT), "secretGenerator": list_of(ANY_OBJECT),
    "generatorOptions": ANY_OBJECT, "patches": list_of(ANY_OBJECT), "replicas": list_of(ANY_OBJECT)})

COMPOSE = obj({"services": map_of(obj(one_of=("image", "build"), open_=True))}, {
    "name": STRING, "version": STRING, "configs": map_of(obj(
        optional={"content": STRING, "file": STRING, "environment": STRING, "name": STRING})),
    "secrets": map_of(ANY_OBJECT), "volumes": map_of(ANY), "networks": map_of(ANY)})


def check_document(doc, k8s_versions):
    """Errors of one YAML document, and what it was checked as."""
    if not isinstance(doc, dict):
        return [f"not an object: {doc!r:.60}"], "?"
    api, kind = doc.get("apiVersion"), doc.get("kind")
    if api and kind:
        name = (doc.get("metadata") or {}).get("name")
        label = f"{kind} {name}"
        group, _, version = api.rpartition("/")
        if kind == "Kustomization":
            return KUSTOMIZATION(doc, "kustomization"), "Kustomization (structure)"
        if (group, kind) in CRDS:
            versions, spec = CRDS[(group, kind)]
            errors = [] if version in versions else [f"apiVersion {api}: checked versions are {versions}"]
            errors += STRING(name, "metadata.name") + spec(doc.get("spec"), "spec")
            return errors, f"{label} (structure)"
        errors = []
        for k8s in k8s_versions:
            try:
                kubernetes_validate.validate(doc, k8s, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append(f"Kubernetes {k8s}: {'.'.join(map(str, e.path))}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError:
                return [f"{api} {kind}: no schema, and no structural check in tests/deploy/manifests.py"], label
        return errors, f"{label} (schema {', '.join(k8s_versions)})"
    if "services" in doc:
        return COMPOSE(doc, "compose"), "compose file (structure)"
    if "static_resources" in doc or "admin" in doc:
        return [], "Envoy config (filter configs only; make validate runs Envoy on envoy/)"
    return ["neither a Kubernetes object, a compose file nor an Envoy config"], "?"


def run_checker(checker, files, allow_none):
    args = [checker] + (["--allow-none"] if allow_none else []) + [str(f) for f in files]
    return subprocess.run(args, capture_output=True, text=True)


def show_checks_fail(checker, k8s_versions, first_config_file):
    """Each check fails on a broken input: a check that cannot fail proves nothing."""
    bad_deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
                      "spec": {"selector": {}, "template": {"spec": {"containers": "envoy"}}}}
    errors, _ = check_document(bad_deployment, k8s_versions)
    assert errors and "containers" in errors[0], errors
    print(f"  a Deployment whose containers is a string: {errors[0]}")
    bad_plugin = {"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
                  "metadata": {"name": "x"}, "spec": {"phase": "AUTHN"}}
    errors, _ = check_document(bad_plugin, k8s_versions)
    assert errors == ["spec.url: is required"], errors
    print(f"  a WasmPlugin without its url: {errors[0]}")

    text = first_config_file.read_text()
    broken, n = re.subn(r'("?\blimit"?\s*:\s*)\d+', r"\g<1>0", text, count=1)
    assert n == 1, f"{first_config_file}: no limit to break"
    with tempfile.TemporaryDirectory() as tmp:
        copy_path = pathlib.Path(tmp) / f"broken-{first_config_file.name}"
        copy_path.write_text(broken)
        result = run_checker(checker, [copy_path], allow_none=False)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "limit: must be >= 1" in result.stderr, result.stderr
    print(f"  a copy of {first_config_file} with its first limit 0 (exit {result.returncode}):")
    for line in result.stderr.splitlines():
        print(f"    {line}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checker", required=True, help="the ratelimit-check binary")
    parser.add_argument("--k8s-version", action="append", required=True)
    parser.add_argument("dirs", nargs="+", type=pathlib.Path)
    args = parser.parse_args()

    yaml_files = sorted(f for d in args.dirs for pattern in ("*.yaml", "*.yml")
                        for f in d.rglob(pattern))
    json_files = sorted(f for d in args.dirs for f in d.rglob("*.json"))
    if not yaml_files:
        sys.exit(f"deploy-test: no manifests under {', '.join(map(str, args.dirs))}")

    failures = 0
    for path in yaml_files:
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as e:
            print(f"FAIL {path}: not valid YAML: {e}")
            failures += 1
            continue
        for i, doc in enumerate(docs, 1):
            errors, what = check_document(doc, args.k8s_version)
            for error in errors:
                print(f"FAIL {path}: document {i} ({what}): {error}")
            failures += bool(errors)
            if not errors:
                print(f"ok   {path}: document {i}: {what}")

    # Each recipe (a directory) holds at least one filter config; a file may hold none.
    for recipe in sorted({f.parent for f in yaml_files}):
        files = [f for f in yaml_files + json_files if f.parent == recipe]
        result = run_checker(args.checker, files, allow_none=True)
        sys.stdout.write(result.stdout)
        sys.stdout.write(result.stderr)
        failures += result.returncode != 0

    print("the checks fail on broken input:")
    # A ConfigMap's filter JSON first, as a user's edit would break it.
    breakable = [f for f in yaml_files if re.search(r'"?\blimit"?\s*:\s*\d', f.read_text())]
    breakable.sort(key=lambda f: "kind: ConfigMap" not in f.read_text())
    first = next(iter(breakable), None)
    if first is None:
        sys.exit("deploy-test: no manifest with a filter limit to break")
    show_checks_fail(args.checker, args.k8s_version, first)

    if failures:
        sys.exit(f"deploy-test: {failures} failed check(s)")
    print(f"deploy-test: {len(yaml_files)} manifests and {len(json_files)} JSON files checked")


if __name__ == "__main__":
    main()
