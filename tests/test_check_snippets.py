"""tests/check_snippets.py finds what it is for: each kind of snippet that differs from the
shipped files, and each disagreement among the shipped files. Run from the project root:
python3 -m unittest tests/test_check_snippets.py"""

import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_snippets  # noqa: E402

# The README's "Add it to your Envoy" snippet as it was: a bridge password Webdis does not have.
OLD_README = """```yaml
      configuration:
        value: |
          {"bridge": {"cluster": "webdis", "username": "ratelimit", "password": "change-me"},
           "rules": []}
```
"""

# docs/security.md's table as it was: PTTL, which the `default` user has, missing.
OLD_TABLE = """Webdis logs in as the `default` user, which may run only `FCALL`, `FUNCTION LOAD`,
`EVALSHA`, `SCRIPT LOAD` and the commands the decision code calls:

<!-- commands of: envoy/redis.conf user default -->
| command | used by |
|---|---|
| `EXISTS` | key budgets |
| `HGET`, `HMGET`, `HSET` | states |
| `PEXPIRE` | expiry |
| `ZADD`, `ZCARD`, `ZRANGE`, `ZREMRANGEBYSCORE`, `ZREM` | sorted sets |
| `TIME` | the clock |
"""


def found(text):
    check = check_snippets.Check(check_snippets.Shipped())
    return list(check_snippets.doc_problems(check, "doc.md", text))


def shipped_problems(path, old, new):
    """The shipped files' disagreements, with `old` replaced by `new` in `path`."""
    read = check_snippets.read

    def patched(name):
        text = read(name)
        if name == path:
            if old not in text:
                raise AssertionError(f"{path} holds no {old!r}")
            return text.replace(old, new)
        return text

    with mock.patch.object(check_snippets, "read", patched):
        return list(check_snippets.Shipped().problems())


class Credentials(unittest.TestCase):
    def test_a_bridge_password_webdis_does_not_have_is_found(self):
        self.assertEqual(
            found(OLD_README),
            ["doc.md:4: bridge credentials ratelimit:change-me: envoy/webdis.json's "
             "http_basic_auth has ratelimit:ratelimit-demo-secret"],
        )
        self.assertEqual(found(OLD_README.replace("change-me", "ratelimit-demo-secret")), [])
        self.assertEqual(len(found("`bridge: {username: ratelimit, password: hunter2}`")), 1)
        self.assertEqual(len(found("`password: hunter2`")), 1)
        self.assertEqual(len(found('`"http_basic_auth": "ratelimit:hunter2"`')), 1)
        self.assertEqual(len(found("`curl -u ratelimit:hunter2 http://127.0.0.1:7379/`")), 1)

    def test_a_marked_placeholder_is_allowed_and_a_plausible_value_is_not(self):
        for placeholder in ("PASSWORD", "BRIDGE_PASSWORD", "<password>", "$BRIDGE_PASSWORD"):
            self.assertEqual(found(OLD_README.replace("change-me", placeholder)), [], placeholder)
        for value in ("changeme", "password", "secret"):
            self.assertEqual(len(found(OLD_README.replace("change-me", value))), 1, value)

    def test_redis_credentials_are_envoy_redis_confs(self):
        url = "`redis://ratelimit-admin:ratelimit-admin-demo-secret@127.0.0.1:6379`"
        self.assertEqual(found(url), [])
        self.assertEqual(len(found(url.replace("demo-secret", "secret"))), 1)
        self.assertEqual(len(found(url.replace("ratelimit-admin:", "nobody:"))), 1)
        self.assertEqual(len(found(url.replace("demo-secret@127.0.0.1", "x@redis"))), 1)
        self.assertEqual(found("`redis://ratelimit-admin:PASSWORD@HOST:PORT`"), [])
        self.assertEqual(found("`redis-cli --user admin -a admin-demo-secret`"), [])
        self.assertEqual(len(found("`redis-cli --user admin -a hunter2`")), 1)
        self.assertEqual(len(found("`REDISCLI_AUTH=hunter2 redis-cli ping`")), 1)
        self.assertEqual(found('`"redis_auth": "webdis-demo-secret"`'), [])
        self.assertEqual(len(found('`"redis_auth": "hunter2"`')), 1)

    def test_an_acl_line_grants_what_the_shipped_one_does(self):
        line = check_snippets.read("envoy/redis.conf").splitlines()
        admin = next(l for l in line if l.startswith("user ratelimit-admin "))
        placeholder = admin.replace(">ratelimit-admin-demo-secret", ">PASSWORD")
        self.assertEqual(found(f"```\n{admin}\n```\n"), [])
        self.assertEqual(found(f"```\n{placeholder}\n```\n"), [])
        self.assertEqual(len(found(f"```\n{placeholder.replace(' +pttl', '')}\n```\n")), 1)
        wrong = admin.replace("demo-secret", "other")
        self.assertEqual(len(found(f"```\n{wrong}\n```\n")), 1)


class Ports(unittest.TestCase):
    def test_each_port_is_its_components(self):
        right = "Envoy on `127.0.0.1:10000` (admin `:9901`), Webdis on `:7379`, Redis on `:6379`."
        self.assertEqual(found(right), [])
        swapped = right.replace(
            "Webdis on `:7379`, Redis on `:6379`", "Webdis on `:6379`, Redis on `:7379`"
        )
        self.assertEqual(
            found(swapped),
            ["doc.md:1: webdis port 6379: the shipped configs give 7379",
             "doc.md:1: redis port 7379: the shipped configs give 6379, 7000"],
        )
        self.assertEqual(len(found("Envoy's admin interface stays on `127.0.0.1:9902`.")), 1)

    def test_a_port_in_yaml_belongs_to_its_enclosing_cluster(self):
        cluster = """```yaml
- name: webdis
  load_assignment:
    endpoints:
    - lb_endpoints:
      - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 7379 } } }
```
"""
        self.assertEqual(found(cluster), [])
        self.assertEqual(len(found(cluster.replace("7379", "6379"))), 1)

    def test_a_port_of_no_component_must_be_used_somewhere(self):
        self.assertEqual(found("`curl http://127.0.0.1:10000/`"), [])
        self.assertEqual(len(found("`curl http://127.0.0.1:54321/`")), 1)
        forwarded = "`kubectl port-forward service/envoy 54321:80`, then `curl localhost:54321/`"
        self.assertEqual(found(forwarded), [])


class Paths(unittest.TestCase):
    def test_the_module_is_where_the_makefile_puts_it(self):
        for path in ("target/wasm32-wasip1/release/", "target/dist/", "/path/to/"):
            self.assertEqual(found(f"`{path}ratelimit_filter.wasm`"), [], path)
        for path in ("target/release/", "/opt/", "target/wasm32-wasi/release/"):
            self.assertEqual(len(found(f"`{path}ratelimit_filter.wasm`")), 1, path)

    def test_a_file_of_the_repository_exists(self):
        self.assertEqual(found("`envoy/examples/plans.yaml`, `lua/*.lua`"), [])
        self.assertEqual(len(found("`envoy/examples/plan.yaml`")), 1)


class Tables(unittest.TestCase):
    def test_a_marked_table_lists_exactly_the_users_commands(self):
        self.assertEqual(
            found(OLD_TABLE),
            ["doc.md:4: envoy/redis.conf grants user 'default' PTTL, which the table omits"],
        )
        fixed = OLD_TABLE + "| `PTTL` | blocks |\n"
        self.assertEqual(found(fixed), [])
        extra = fixed.replace("| `PTTL` | blocks |", "| `PTTL`, `DEL` | blocks |")
        self.assertEqual(len(found(extra)), 1)
        prose = OLD_TABLE.replace("`SCRIPT LOAD` and", "and")
        self.assertIn("SCRIPT LOAD", " ".join(found(prose)))


class ShippedFiles(unittest.TestCase):
    def test_the_shipped_files_agree(self):
        self.assertEqual(list(check_snippets.Shipped().problems()), [])

    def test_each_disagreement_is_found(self):
        cases = [
            ("envoy/webdis.json", '"redis_port": 6379', '"redis_port": 6380', "redis_port"),
            ("envoy/webdis.json", '"redis_auth": "webdis-demo-secret"', '"redis_auth": "x"', "auth"),
            ("envoy/webdis.json", "ratelimit:ratelimit-demo-secret", "ratelimit:x", "bridge"),
            ("envoy/envoy.yaml", "port_value: 7379", "port_value: 7380", "webdis cluster"),
            ("envoy/envoy.yaml", "filename: target/", "filename: /opt/target/", "loads"),
            ("envoy/examples/plans.yaml", "port_value: 10000", "port_value: 10001", "listener"),
            ("envoy/examples/plans.yaml", "port_value: 9901", "port_value: 9902", "admin port"),
        ]
        for path, old, new, what in cases:
            problems = shipped_problems(path, old, new)
            self.assertTrue(any(what in p for p in problems), f"{path}: {new}: {problems}")


if __name__ == "__main__":
    unittest.main()
