"""A local OIDC provider for the secured broker: client-credentials token endpoint and JWKS.

Tokens are RS256 JWTs signed with a key made at start; ``sub`` is the client id, so the broker's
``OAuthBearerValidatorCallbackHandler`` sees the principal ``User:<client id>``.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class OidcProvider:
    def __init__(self, clients: dict[str, str], audience: str) -> None:
        from cryptography.hazmat.primitives.asymmetric import rsa

        self.clients = dict(clients)  # client id -> secret
        self.audience = audience
        self.issued = 0
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._kid = uuid.uuid4().hex[:8]
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/jwks":
                    self.send_error(404)
                    return
                self._json(200, provider.jwks())

            def do_POST(self) -> None:
                body = urllib.parse.parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
                client_id, secret = provider._basic(self.headers.get("Authorization", ""))
                if body.get("grant_type") != ["client_credentials"] or provider.clients.get(client_id) != secret:
                    self._json(401, {"error": "invalid_client"})
                    return
                self._json(200, {"access_token": provider.token(client_id), "token_type": "bearer", "expires_in": 3600})

            def _json(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        self._server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @staticmethod
    def _basic(header: str) -> tuple[str, str]:
        if not header.startswith("Basic "):
            return "", ""
        user, _, secret = base64.b64decode(header[6:]).decode().partition(":")
        return urllib.parse.unquote(user), urllib.parse.unquote(secret)

    def jwks(self) -> dict[str, Any]:
        numbers = self._key.public_key().public_numbers()

        def b64int(n: int) -> str:
            return _b64url(n.to_bytes((n.bit_length() + 7) // 8, "big"))

        key = {"kty": "RSA", "kid": self._kid, "alg": "RS256", "use": "sig"}
        return {"keys": [{**key, "n": b64int(numbers.n), "e": b64int(numbers.e)}]}

    def token(self, subject: str) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "kid": self._kid}
        claims = {"sub": subject, "aud": self.audience, "iss": self.url, "iat": now, "exp": now + 3600}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = self._key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        self.issued += 1
        return f"{signing_input}.{_b64url(signature)}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
