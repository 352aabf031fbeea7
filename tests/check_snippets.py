"""Checks that what README.md and docs/*.md show in code (fenced blocks and `inline` spans) is
what the repository ships, so a reader who copies it gets a working setup:

- credentials: a bridge `password`/`username` (JSON or YAML), Webdis's `http_basic_auth` and
  `redis_auth`, a `redis://USER:PASSWORD@` URL, a Redis ACL `user NAME ... >PASSWORD ...` line,
  redis-cli's `-a`/`--user`/`--pass`/`REDISCLI_AUTH=`, curl's `-u USER:PASSWORD`: each must be
  what envoy/webdis.json and envoy/redis.conf hold. A placeholder is allowed only in a form that
  cannot be mistaken for a value: an upper-case name (`PASSWORD`), `<...>` or `$VAR`. An ACL
  line must also grant what the shipped line of that user grants (envoy/redis.conf, or a
  Redis Cluster node's envoy/cluster/redis-node.conf).
- ports: `HOST:PORT`, `:PORT` and `port_value: PORT`. A port is Envoy's (a listener), the
  admin interface's, Webdis's or Redis's when its clause names that component (prose: since the
  sentence began or the port before it; code: before it on its line, else the nearest enclosing
  YAML line that names one), or by a `redis://` URL, and must then be one that component has in
  the demo (envoy/envoy.yaml, envoy/webdis.json, envoy/redis.conf) or in the Redis Cluster demo
  (envoy/cluster/). A port no clause places must be one a file under envoy/ or deploy/ uses,
  or one the same page forwards (`kubectl port-forward ... LOCAL:REMOTE`).
- paths: a path of the module (`.../ratelimit_filter.wasm`) is the Makefile's build output
  (the one envoy/envoy.yaml loads), its `make oci` copy, or `/path/to/ratelimit_filter.wasm`;
  a path under one of the repository's directories exists.
- a table of Redis commands preceded by `<!-- commands of: FILE user NAME -->` lists exactly
  what that ACL line grants (a command may instead be named in the paragraph before it).

It also checks that the shipped files agree where the docs say to copy them together: the
bridge credentials of every Envoy config under envoy/ are a basic-auth user of
envoy/webdis.json, whose `redis_auth` and `redis_port` are envoy/redis.conf's `default` user
and port, the `webdis` cluster's port is Webdis's, envoy/envoy.yaml loads the module the
Makefile builds, and the examples listen where envoy/envoy.yaml does (README: "for the same
ports"). Run from anywhere: python3 tests/check_snippets.py [--list, to print what it checked]"""

import glob
import json
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*|<[^<>]+>|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
ROLE_WORD = re.compile(r"(?<![\w.-])(envoy|admin|webdis|redis)(?![\w.-])", re.I)
ROLE_WORD_LOOSE = re.compile(r"(?<![\w-])(envoy|admin|webdis|redis)(?![\w-])", re.I)
HOST = r"localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1?\]|[A-Za-z][\w-]*(?:\.[\w-]+)*\.[A-Za-z]+"
HOST_PORT = re.compile(rf"(?<![\w.@:/-])(?:https?://)?({HOST}):(\d{{2,5}})\b")
BARE_PORT = re.compile(r"(?:^|(?<=[\s(]))(?<![\w:]):(\d{2,5})\b")
PORT_VALUE = re.compile(r"\bport_value:\s*(\d+)")
REDIS_URL = re.compile(r"redis://(?:([^:@/\s]*):)?([^@/\s]+)@([^\s:/`]+)(?::(\d+))?")
PORT_FORWARD = re.compile(r"port-forward\s+\S+(?:\s+-\S+(?:\s+\S+)?)*\s+(\d+)(?::\d+)?")
MODULE = "ratelimit_filter.wasm"
# The Redis configs a doc's ACL line may show: the demo's, and a Redis Cluster node's.
ACL_FILES = ("envoy/redis.conf", "envoy/cluster/redis-node.conf")


def placeholder(value):
    return PLACEHOLDER.fullmatch(value) is not None


# --- What the repository ships ---


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def acl_users(path):
    """{user: (passwords, grants)} of a Redis config's `user` lines; grants in their order."""
    users = {}
    for line in read(path).splitlines():
        words = line.split()
        if len(words) > 2 and words[0] == "user":
            passwords = {w[1:] for w in words[2:] if w.startswith(">")}
            grants = [w for w in words[2:] if not w.startswith(">")]
            users[words[1]] = (passwords, grants)
    return users


def redis_port(path):
    found = re.search(r"^port\s+(\d+)\s*$", read(path), re.M)
    if not found:
        raise SystemExit(f"{path}: no `port` line")
    return int(found.group(1))


def yaml_context(lines, n):
    """The lines a line of a block-style YAML file sits in, innermost first."""
    def indent(line):
        return len(line) - len(line.lstrip(" "))

    level, item = indent(lines[n]), lines[n].lstrip().startswith("- ")
    context = []
    for line in reversed(lines[:n]):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        dash = line.lstrip().startswith("- ")
        # A list's items may stand at their key's indent.
        if indent(line) < level or (item and indent(line) == level and not dash):
            context.append(line.strip())
            level, item = indent(line), dash
            if level == 0 and not dash:
                break
    return context


def envoy_config(path):
    """An Envoy config's ports by role, the module it loads and the filters' bridges."""
    text = read(path)
    lines = text.splitlines()
    found = {"listener": set(), "admin": set(), "cluster": {}, "modules": set()}
    found["bridges"] = []
    for n, line in enumerate(lines):
        port = PORT_VALUE.search(line)
        if port:
            context = yaml_context(lines, n)
            roots = [c for c in context if re.match(r"[a-z_]+:", c)]
            top = roots[-1] if roots else ""
            if top == "admin:":
                found["admin"].add(int(port.group(1)))
            elif "listeners:" in context:
                found["listener"].add(int(port.group(1)))
            elif "clusters:" in context:
                names = [c for c in context if re.fullmatch(r"- name: \S+", c)]
                name = names[-1].split()[-1] if names else "?"
                found["cluster"].setdefault(name, set()).add(int(port.group(1)))
        module = re.match(r"\s*filename:\s*(\S+)", line)
        if module:
            found["modules"].add(module.group(1))
        value = re.match(r"(\s*)value:\s*\|\s*$", line)
        if value:
            block = []
            for inner in lines[n + 1:]:
                if inner.strip() and len(inner) - len(inner.lstrip()) <= len(value.group(1)):
                    break
                block.append(inner)
            try:
                config = json.loads("\n".join(block))
            except ValueError:
                continue  # not this filter's configuration: `make validate` checks those
            if isinstance(config, dict) and isinstance(config.get("bridge"), dict):
                bridge = config["bridge"]
                found["bridges"].append((n + 1, bridge.get("username"), bridge.get("password")))
    return found


def demo_config(path):
    found = envoy_config(path)
    if not found["admin"] or not found["listener"]:
        raise SystemExit(f"{path}: no admin or listener port found")
    return found


def makefile_variable(name):
    found = re.search(rf"^{name}\s*:?=\s*(\S+)\s*$", read("Makefile"), re.M)
    if not found:
        raise SystemExit(f"Makefile: no {name} variable")
    return found.group(1)


def basic_auth(webdis):
    """The (user, password) pairs of a Webdis config's ACL."""
    pairs = set()
    for entry in webdis.get("acl", []):
        if "http_basic_auth" in entry:
            user, _, password = entry["http_basic_auth"].partition(":")
            pairs.add((user, password))
    return pairs


class Shipped:
    def __init__(self):
        webdis = json.loads(read("envoy/webdis.json"))
        self.bridge = basic_auth(webdis)
        self.redis_auth = webdis["redis_auth"]
        self.redis_users = acl_users("envoy/redis.conf")
        self.acl_files = {f: acl_users(f) for f in ACL_FILES}
        demo = demo_config("envoy/envoy.yaml")
        cluster = demo_config("envoy/cluster/envoy.yaml")
        cluster_webdis = json.loads(read("envoy/cluster/webdis.json"))
        self.demo = demo
        self.wasm = makefile_variable("WASM")
        dist = makefile_variable("DIST") + "/" + MODULE
        self.modules = {self.wasm, dist, "/path/to/" + MODULE}
        self.ports = {
            "envoy": demo["listener"] | cluster["listener"],
            "admin": demo["admin"] | cluster["admin"],
            "webdis": {webdis["http_port"], cluster_webdis["http_port"]},
            "redis": {redis_port(f) for f in ACL_FILES},
        }
        self.webdis = webdis

    def problems(self):
        """Where the shipped files disagree with each other."""
        passwords = self.redis_users.get("default", (set(), []))[0]
        if self.redis_auth not in passwords:
            yield "envoy/webdis.json: redis_auth is not envoy/redis.conf's `default` password"
        if self.webdis["redis_port"] != redis_port("envoy/redis.conf"):
            yield "envoy/webdis.json: redis_port is not envoy/redis.conf's port"
        if self.demo["modules"] != {self.wasm}:
            loads = ", ".join(sorted(self.demo["modules"]))
            yield f"envoy/envoy.yaml: loads {loads}, the Makefile builds {self.wasm}"
        configs = glob.glob(os.path.join(ROOT, "envoy", "**", "*.yaml"), recursive=True)
        for path in sorted(configs):
            name = os.path.relpath(path, ROOT)
            config = envoy_config(name)
            # Each Envoy config calls the Webdis whose config is beside it (the cluster demo's
            # in envoy/cluster/), else envoy/webdis.json.
            beside = os.path.join(os.path.dirname(name), "webdis.json")
            if not os.path.exists(os.path.join(ROOT, beside)):
                beside = "envoy/webdis.json"
            users = basic_auth(json.loads(read(beside)))
            for line, user, password in config["bridges"]:
                if (user, password) not in users:
                    yield f"{name}:{line}: bridge credentials {user}:{password}: not in {beside}"
            webdis = config["cluster"].get("webdis", set())
            if webdis and not webdis <= self.ports["webdis"]:
                yield f"{name}: the webdis cluster's port {sorted(webdis)} is not Webdis's"
            if "/examples/" in name:
                for role in ("listener", "admin"):
                    if config[role] - self.demo[role]:
                        ports = sorted(config[role])
                        yield f"{name}: {role} port {ports}, not envoy/envoy.yaml's"


# --- What the docs show ---


def snippets(text):
    """(line number, code, prose, block) for each fenced line and each inline code span:
    `prose` is the text of the line before a span, `block` the fenced lines before a line."""
    block = None
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            block = None if block is not None else []
            continue
        if block is not None:
            yield n, line, None, list(block)
            block.append(line)
            continue
        for span in re.finditer(r"`([^`]+)`", line):
            yield n, span.group(1), line[: span.start()], None


def roles(text, loose):
    """The components `text` names; `loose` also counts a name followed by a dot (a host or a
    file named after the component, in prose)."""
    pattern = ROLE_WORD_LOOSE if loose else ROLE_WORD
    return {w.lower() for w in pattern.findall(text)}


class Check:
    def __init__(self, shipped):
        self.s = shipped
        self.seen = []
        self.used_ports = set()
        for pattern in ("envoy/**/*", "deploy/**/*"):
            for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
                if os.path.isfile(path):
                    with open(path, encoding="utf-8", errors="replace") as f:
                        numbers = re.findall(r"(?<![\w.])(\d{2,5})(?![\w.])", f.read())
                    self.used_ports |= {int(n) for n in numbers}

    def bridge(self, user, password):
        self.seen.append(f"bridge credentials {user}:{password}")
        has = "envoy/webdis.json's http_basic_auth has " + ", ".join(
            f"{u}:{p}" for u, p in sorted(self.s.bridge)
        )
        user = None if user is None or placeholder(user) else user
        password = None if password is None or placeholder(password) else password
        if user is not None and password is not None:
            if (user, password) not in self.s.bridge:
                yield f"bridge credentials {user}:{password}: {has}"
        elif password is not None and password not in {p for _, p in self.s.bridge}:
            yield f"bridge password {password!r}: {has}"
        elif user is not None and user not in {u for u, _ in self.s.bridge}:
            yield f"bridge user {user!r}: {has}"

    def redis_user(self, user, password):
        self.seen.append(f"Redis user {user}:{password}")
        users = self.s.redis_users
        if user not in users:
            yield f"Redis user {user!r} is not in envoy/redis.conf"
        elif password and not placeholder(password) and password not in users[user][0]:
            yield f"password {password!r} is not envoy/redis.conf's for user {user!r}"

    def credentials(self, code):
        value = r'"?\s*:\s*"?([^\s",}]+)'
        both = re.search(r'"?\busername' + value + r'.*?"?\bpassword' + value, code)
        if both:
            yield from self.bridge(both.group(1), both.group(2))
        else:
            for key, given in re.findall(r'"?\b(username|password)' + value, code):
                if key == "username":
                    yield from self.bridge(given, None)
                else:
                    yield from self.bridge(None, given)
        for user, password in re.findall(r'http_basic_auth"?\s*:\s*"([^":]*):([^"]*)"', code):
            yield from self.bridge(user, password)
        for value in re.findall(r'redis_auth"?\s*:\s*"([^"]*)"', code):
            self.seen.append(f"redis_auth {value}")
            if not placeholder(value) and value != self.s.redis_auth:
                yield f"redis_auth {value!r} is not envoy/webdis.json's"
        for user, password, _, _ in REDIS_URL.findall(code):
            yield from self.redis_user(user or "default", password)
        curl = r"\bcurl\b.*?\s(?:-u|--user)\s+'?([^:\s']+):([^\s']+?)'?(?:\s|$)"
        for user, password in re.findall(curl, code):
            yield from self.bridge(user, password)
        if re.search(r"\bredis-cli\b|REDISCLI_AUTH=", code):
            user = re.search(r"--user\s+(\S+)", code)
            password = re.search(r"(?:\s-a|--pass|REDISCLI_AUTH=)\s*(\S+)", code)
            user = user.group(1) if user else "default"
            yield from self.redis_user(user, password.group(1).strip("'\"") if password else None)
        acl = re.match(r"\s*user\s+(\S+)\s+(.*)$", code)
        if acl and (" on " in f" {acl.group(2)} " or " off " in f" {acl.group(2)} "):
            yield from self.acl_line(acl.group(1), acl.group(2).split())

    def acl_line(self, user, words):
        passwords = {w[1:] for w in words if w.startswith(">")}
        grants = [w for w in words if not w.startswith(">")]
        self.seen.append(f"ACL line of {user}, password {sorted(passwords)}")
        same = [
            (f, u[user][0])
            for f, u in self.s.acl_files.items()
            if user in u and u[user][1] == grants
        ]
        if not same:
            files = ", ".join(self.s.acl_files)
            yield f"ACL line of user {user!r} grants what no line of that user does in {files}"
            return
        for password in passwords:
            if not placeholder(password) and all(password not in p for _, p in same):
                yield f"password {password!r} is not {same[0][0]}'s for user {user!r}"

    def ports(self, code, prose, block, forwarded):
        """A port's component is named in its own clause (prose: since the sentence or the
        port before it; code: on its line before it, else by the nearest enclosing YAML line)."""
        found = []
        for url in REDIS_URL.finditer(code):
            if url.group(4):
                found.append((url.start(4), int(url.group(4)), {"redis"}))
        taken = {start for start, _, _ in found}
        for pattern, group in ((HOST_PORT, 2), (BARE_PORT, 1), (PORT_VALUE, 1)):
            for match in pattern.finditer(code):
                if match.start(group) not in taken:
                    found.append((match.start(group), int(match.group(group)), None))
        if prose is not None:
            prose = re.split(r"[.;:!?]\s|\||:\d{2,5}\b", prose)[-1]
        end = 0
        for start, port, known in sorted(found):
            clause = code[end:start]
            if end == 0 and prose is not None:
                clause = prose + clause
            end = start
            components = known or roles(clause, loose=prose is not None)
            how = "named"
            if not components and block is not None:
                lines = block + [code]
                for line in yaml_context(lines, len(block)):
                    components = roles(line, loose=False)
                    if components:
                        how = "enclosing"
                        break
            whose = "/".join(sorted(components)) + f" ({how})" if components else "any shipped"
            self.seen.append(f"port {port}: {whose}")
            if components:
                ports = set().union(*(self.s.ports[c] for c in components))
                if port not in ports:
                    names = " or ".join(sorted(components))
                    shipped = ", ".join(str(p) for p in sorted(ports))
                    yield f"{names} port {port}: the shipped configs give {shipped}"
            elif port not in self.used_ports and port not in forwarded:
                yield f"port {port}: no file under envoy/ or deploy/ uses it"

    def paths(self, code):
        module = r"(?<![\w./:-])(/?(?:[\w.-]+/)+" + re.escape(MODULE) + r")\b"
        for path in re.findall(module, code):
            self.seen.append(f"module path {path}")
            if path not in self.s.modules:
                yield f"module path {path}: the Makefile builds {self.s.wasm} (and make oci's copy)"
        tops = [
            d
            for d in os.listdir(ROOT)
            if os.path.isdir(os.path.join(ROOT, d)) and not d.startswith(".") and d != "target"
        ]
        pattern = r"(?<![\w./:~$-])((?:" + "|".join(map(re.escape, tops)) + r")/[\w./-]*)"
        for path in re.findall(pattern, code):
            path = path.rstrip(".,:;")
            self.seen.append(f"path {path}")
            if not os.path.exists(os.path.join(ROOT, path)):
                yield f"{path}: no such file in the repository"

    def tables(self, text):
        """Tables of Redis commands marked with the ACL line they list."""
        lines = text.splitlines()
        for n, line in enumerate(lines):
            marker = re.match(r"\s*<!-- commands of: (\S+) user (\S+) -->\s*$", line)
            if not marker:
                continue
            path, user = marker.groups()
            exists = os.path.exists(os.path.join(ROOT, path))
            users = self.s.acl_files.get(path) or (acl_users(path) if exists else {})
            if user not in users:
                yield n + 1, f"{path} has no user {user!r}"
                continue
            granted = {w[1:].replace("|", " ").upper() for w in users[user][1] if w.startswith("+")}
            rows, prose = set(), set()
            end = n + 1
            while end < len(lines) and not lines[end].lstrip().startswith("|"):
                end += 1
            while end < len(lines) and lines[end].lstrip().startswith("|"):
                cells = lines[end].strip().strip("|").split("|")
                rows |= {c.upper() for c in re.findall(r"`([A-Za-z| ]+)`", cells[0])}
                end += 1
            before = "\n".join(lines[:n]).rstrip().split("\n\n")[-1]
            for back in before.splitlines():
                prose |= {c.upper() for c in re.findall(r"`([A-Z][A-Z ]*)`", back)}
            for command in sorted(granted - rows - prose):
                yield n + 1, f"{path} grants user {user!r} {command}, which the table omits"
            for command in sorted(rows - granted):
                yield n + 1, f"the table lists {command}, which {path} denies user {user!r}"
            if not rows:
                yield n + 1, "no table of commands after the marker"


def doc_problems(check, name, text, listing=False):
    """What one page shows that the repository does not ship."""
    forwarded = {int(p) for p in PORT_FORWARD.findall(text)}
    for n, code, prose, block in snippets(text):
        found = list(check.credentials(code))
        found += check.ports(code, prose, block, forwarded)
        found += check.paths(code)
        for p in found:
            yield f"{name}:{n}: {p}"
        if listing:
            for seen in check.seen:
                print(f"{name}:{n}: checked {seen}")
        check.seen.clear()
    for n, p in check.tables(text):
        yield f"{name}:{n}: {p}"


def problems(listing=False):
    """What disagrees; with `listing`, also prints each thing checked."""
    shipped = Shipped()
    yield from shipped.problems()
    check = Check(shipped)
    files = ["README.md"] + sorted(
        os.path.join("docs", f)
        for f in os.listdir(os.path.join(ROOT, "docs"))
        if f.endswith(".md")
    )
    for name in files:
        yield from doc_problems(check, name, read(name), listing)


if __name__ == "__main__":
    found = list(dict.fromkeys(problems(listing="--list" in sys.argv[1:])))
    for p in found:
        print(p, file=sys.stderr)
    sys.exit(1 if found else 0)
