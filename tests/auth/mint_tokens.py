"""Mints every JWT the jwt_authn e2e test (tests/tests/auth.rs) needs, in one run.

`mint_tokens.py ISSUER AUDIENCE` prints one JSON object: `jwks`, the JWKS (as a string) that
Envoy verifies with, and `tokens`, a map from the test's name for each token to the token.
An RS256 key pair is made fresh on every run; another key pair makes the forged token. Uses
PyJWT and cryptography from the project's .venv (`make setup-auth`).

Valid tokens are issued by ISSUER for AUDIENCE, expire in an hour and carry `sub` and `plan`
as the test names them. The invalid ones each break one thing a verifier must check.
"""

import base64
import hashlib
import hmac
import json
import sys
import time

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ISSUER, AUDIENCE = sys.argv[1], sys.argv[2]
KID = "test-key-1"
NOW = int(time.time())


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(sub, plan=None, **extra):
    c = {"iss": ISSUER, "aud": AUDIENCE, "iat": NOW, "exp": NOW + 3600, "jti": f"{sub}-{len(tokens)}"}
    if sub is not None:
        c["sub"] = sub
    if plan is not None:
        c["plan"] = plan
    c.update(extra)
    return c


def signed(payload, key=None):
    return jwt.encode(payload, key or private, algorithm="RS256", headers={"kid": KID})


def unsigned(header, payload, signature=b""):
    """A token put together by hand: for shapes PyJWT refuses to make."""
    head = b64(json.dumps(header).encode())
    body = b64(json.dumps(payload).encode())
    return f"{head}.{body}.{b64(signature)}"


private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
jwk.update({"kid": KID, "alg": "RS256", "use": "sig"})
jwks = json.dumps({"keys": [jwk]})

tokens = {}
# Valid: two tokens of one subject (one bucket), a subject per plan, plans no plan names.
tokens["alice"] = signed(claims("alice", "pro"))
tokens["alice2"] = signed(claims("alice", "pro"))
tokens["bob"] = signed(claims("bob", "free"))
# A subject of bytes a URL or a Redis key would mind (the JSON carries it as UTF-8).
tokens["zoe"] = signed(claims("zoë/ü+ x{1}", "free"))
tokens["carol"] = signed(claims("carol", "enterprise"))
tokens["dave"] = signed(claims("dave", "FREE"))
tokens["erin"] = signed(claims("erin"))
# A plan that is not a scalar (a list, an object): not a plan's value, so the default.
tokens["frank"] = signed(claims("frank", ["pro"]))
tokens["grace"] = signed(claims("grace", {"name": "pro"}))

# Invalid, each claiming alice's pro plan: jwt_authn must refuse every one.
tokens["expired"] = signed(claims("alice", "pro", iat=NOW - 7200, exp=NOW - 3600))
tokens["forged"] = signed(claims("alice", "pro"), key=other)
tokens["alg_none"] = unsigned({"alg": "none", "typ": "JWT"}, claims("alice", "pro"))
# bob's genuine header and signature around a payload rewritten to alice's pro plan.
head, _, signature = tokens["bob"].split(".")
body = b64(json.dumps(claims("alice", "pro")).encode())
tokens["tampered"] = f"{head}.{body}.{signature}"
# HS256 keyed with the public key's PEM (the algorithm-confusion attack).
public_pem = private.public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
)
head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": KID}).encode())
body = b64(json.dumps(claims("alice", "pro")).encode())
mac = hmac.new(public_pem, f"{head}.{body}".encode(), hashlib.sha256).digest()
tokens["hs256_public_key"] = f"{head}.{body}.{b64(mac)}"
tokens["other_issuer"] = signed(claims("alice", "pro", iss="https://evil.example.com/"))
tokens["other_audience"] = signed(claims("alice", "pro", aud="https://other.example.com"))

print(json.dumps({"jwks": jwks, "tokens": tokens}))
