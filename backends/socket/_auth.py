"""Shared-secret authentication of a connected socket (a mutual HMAC-SHA256 challenge).

Like :mod:`multiprocessing`'s authkey: both ends hold the same secret and each proves
it to the other without sending it. Nothing is unpickled here, and the caller should
not unpickle anything from a socket before one of the handshakes below returned.

The exchange (every message starts with the 8-byte ``MAGIC`` and a type byte, and has
a fixed size, so a peer speaking another protocol is rejected at its first wrong byte)::

    server -> client  HELLO    MAGIC b"H" nonce_s[32]                      41 bytes
    client -> server  ANSWER   MAGIC b"A" nonce_c[32] mac("client", nonce_s) 73 bytes
    server -> client  VERDICT  MAGIC b"V" ok[1] mac("server", nonce_c)     42 bytes
    client -> server  ACK      MAGIC b"K" ok[1]                            10 bytes

with ``mac(role, nonce) = HMAC-SHA256(secret, b"simdist-v1" + role + nonce)``. The role
names the side that answers, so one side's answer can never be replayed as the other's.
A wrong secret is refused in the VERDICT (or the ACK), so both sides raise
:class:`~simdist.AuthenticationError`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import time
from collections.abc import Callable

from simdist.core import AuthenticationError, DistTimeoutError, ProtocolError

from ._frames import MAX_SOCKET_TIMEOUT

__all__ = [
    "MAGIC", "SECRET_ENV", "ServerBusy", "ServerDropped", "authenticated", "client_handshake", "new_secret", "resolve_secret",
    "secret_from_env", "server_handshake",
]  # fmt: skip

SECRET_ENV = "SIMDIST_SECRET"
MAGIC = b"simdist\x01"
_DOMAIN = b"simdist-v1"
_NONCE = 32
_MAC = 32
_HELLO, _ANSWER, _VERDICT, _ACK = b"H", b"A", b"V", b"K"
_SIZES = {_HELLO: _NONCE, _ANSWER: _NONCE + _MAC, _VERDICT: 1 + _MAC, _ACK: 1}
_HINT = f"check that {SECRET_ENV} holds the same secret on every process and host"


def secret_from_env() -> bytes | None:
    """The secret in ``$SIMDIST_SECRET``, UTF-8 encoded; ``None`` when it is unset or empty."""
    value = os.environ.get(SECRET_ENV)
    return value.encode("utf-8") if value else None


def new_secret() -> str:
    """A fresh random secret (64 hex characters) for a launcher to put in ``$SIMDIST_SECRET``."""
    return secrets.token_hex(32)


def _mac(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, _DOMAIN + role + nonce, hashlib.sha256).digest()


def resolve_secret(secret: bytes | str | None) -> bytes:
    """``secret`` as bytes (a str is UTF-8 encoded); ``None`` means ``$SIMDIST_SECRET``.

    Raises:
        TypeError: ``secret`` is not bytes, str or None.
        ValueError: it is empty, or None while ``$SIMDIST_SECRET`` is unset.
    """
    if secret is None:
        secret = secret_from_env()
        if secret is None:
            raise ValueError(f"no secret: pass secret= or set {SECRET_ENV}")
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(f"secret must be bytes or str, got {type(secret).__name__}")
    if not secret:
        raise ValueError(f"secret must not be empty (pass secret= or set {SECRET_ENV})")
    return bytes(secret)


def _peer(sock: socket.socket, role: str) -> str:
    try:
        name = sock.getpeername()
    except OSError:
        return f"the {role}"
    if isinstance(name, tuple):
        return f"{role} {name[0]}:{name[1]}"
    return f"{role} {name}" if name else f"the {role}"


class ServerBusy(ProtocolError):
    """The server closed a new connection before its hello: it was at its cap of connections in the
    handshake (or stopping). Connecting again later may succeed."""


class ServerDropped(ProtocolError):
    """The server reset or closed the connection in the middle of the handshake: on a busy machine, a
    handshake slower than the server's deadline (``HANDSHAKE_DEADLINE_S``) is dropped. Connecting again
    may succeed; a wrong secret is answered with a verdict, never dropped."""


class _Channel:
    """Fixed-size handshake messages over ``sock`` under one overall deadline."""

    def __init__(self, sock: socket.socket, timeout: float, who: str):
        self.sock = sock
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.who = who
        self.heard = False  # whether any byte came from the other side

    def _recv_some(self, n: int, step: str) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DistTimeoutError(f"authentication with {self.who} timed out after {self.timeout:g} s ({step})")
        self.sock.settimeout(min(left, MAX_SOCKET_TIMEOUT))
        try:
            chunk = self.sock.recv(n)
        except TimeoutError:
            raise DistTimeoutError(
                f"authentication with {self.who} timed out after {self.timeout:g} s ({step})"
            ) from None
        except ConnectionResetError as exc:
            raise ServerDropped(f"{self.who} reset the connection during authentication ({step}): {exc}") from exc
        except OSError as exc:
            raise ProtocolError(f"connection to {self.who} failed during authentication ({step}): {exc}") from exc
        if not chunk:
            if not self.heard:
                raise ServerBusy(
                    f"{self.who} closed the connection before its hello (it may be at its cap of "
                    "connections in the handshake, or stopping)"
                )
            raise ServerDropped(f"{self.who} closed the connection during authentication ({step})")
        self.heard = True
        return chunk

    def receive(self, kind: bytes, step: str) -> bytes:
        """The body of the next message, which must be of ``kind``; checks the prefix byte by byte."""
        head = MAGIC + kind
        got = b""
        while len(got) < len(head):
            got += self._recv_some(len(head) - len(got), step)
            if not head.startswith(got):
                raise ProtocolError(
                    f"{self.who} does not speak the simdist protocol (got {got[:16]!r} while waiting for {step})"
                )
        body = bytearray()
        while len(body) < _SIZES[kind]:
            body += self._recv_some(_SIZES[kind] - len(body), step)
        return bytes(body)

    def send(self, kind: bytes, body: bytes, step: str) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DistTimeoutError(f"authentication with {self.who} timed out after {self.timeout:g} s ({step})")
        self.sock.settimeout(min(left, MAX_SOCKET_TIMEOUT))
        try:
            self.sock.sendall(MAGIC + kind + body)
        except TimeoutError:
            raise DistTimeoutError(
                f"authentication with {self.who} timed out after {self.timeout:g} s ({step})"
            ) from None
        except OSError as exc:
            raise ProtocolError(f"connection to {self.who} failed during authentication ({step}): {exc}") from exc


def _ok_byte(value: int, step: str, who: str) -> bool:
    if value not in (0, 1):
        raise ProtocolError(f"{who} sent a malformed {step} (status byte {value})")
    return value == 1


def server_handshake(sock: socket.socket, secret: bytes | str | None, timeout: float) -> None:
    """Authenticate the client on ``sock`` and prove the secret to it; returns when both agree.

    Raises:
        AuthenticationError: the client does not hold ``secret`` (or refused ours).
        DistTimeoutError: the exchange did not finish within ``timeout`` seconds.
        ProtocolError: the client closed early or speaks another protocol.
    """
    secret = resolve_secret(secret)
    previous = sock.gettimeout()
    ch = _Channel(sock, timeout, _peer(sock, "client"))
    try:
        nonce_s = secrets.token_bytes(_NONCE)
        ch.send(_HELLO, nonce_s, "hello")
        body = ch.receive(_ANSWER, "the client's answer")
        nonce_c, answer = body[:_NONCE], body[_NONCE:]
        if not hmac.compare_digest(answer, _mac(secret, b"client", nonce_s)):
            try:
                ch.send(_VERDICT, b"\x00" + bytes(_MAC), "verdict")
            except (ProtocolError, DistTimeoutError):
                pass
            raise AuthenticationError(f"{ch.who} failed the shared-secret challenge (wrong secret); {_HINT}")
        ch.send(_VERDICT, b"\x01" + _mac(secret, b"server", nonce_c), "verdict")
        ack = ch.receive(_ACK, "the client's acknowledgement")
        if not _ok_byte(ack[0], "acknowledgement", ch.who):
            raise AuthenticationError(f"{ch.who} rejected this server's proof of the secret (wrong secret); {_HINT}")
    finally:
        try:
            sock.settimeout(previous)
        except OSError:
            pass


def client_handshake(sock: socket.socket, secret: bytes | str | None, timeout: float) -> None:
    """Prove the secret to the server on ``sock`` and authenticate it; returns when both agree.

    Raises:
        AuthenticationError: the server does not hold ``secret`` (or refused ours).
        DistTimeoutError: the exchange did not finish within ``timeout`` seconds.
        ProtocolError: the server closed early or speaks another protocol.
    """
    secret = resolve_secret(secret)
    previous = sock.gettimeout()
    ch = _Channel(sock, timeout, _peer(sock, "server"))
    try:
        nonce_s = ch.receive(_HELLO, "the server's hello")
        nonce_c = secrets.token_bytes(_NONCE)
        ch.send(_ANSWER, nonce_c + _mac(secret, b"client", nonce_s), "answer")
        verdict = ch.receive(_VERDICT, "the server's verdict")
        if not _ok_byte(verdict[0], "verdict", ch.who):
            raise AuthenticationError(f"{ch.who} rejected this process's secret (wrong secret); {_HINT}")
        if not hmac.compare_digest(verdict[1:], _mac(secret, b"server", nonce_c)):
            try:
                ch.send(_ACK, b"\x00", "acknowledgement")
            except (ProtocolError, DistTimeoutError):
                pass
            raise AuthenticationError(f"{ch.who} failed the shared-secret challenge (wrong secret); {_HINT}")
        ch.send(_ACK, b"\x01", "acknowledgement")
    finally:
        try:
            sock.settimeout(previous)
        except OSError:
            pass


def authenticated(
    connect: Callable[[], socket.socket], secret: bytes | str | None, timeout: float, patience: float
) -> socket.socket:
    """A socket from ``connect()`` that passed :func:`client_handshake`; a server that closes before its
    hello (:class:`ServerBusy`, at its cap of handshakes) or drops a handshake too slow for its deadline
    (:class:`ServerDropped`, a busy machine) is tried again, with backoff, for ``patience`` s.

    Raises:
        ServerBusy, ServerDropped: the server was still busy, or still dropping, after ``patience`` seconds.
        Whatever ``connect`` or :func:`client_handshake` raise otherwise.
    """
    deadline = time.monotonic() + patience
    delay = 0.01
    while True:
        sock = connect()
        try:
            client_handshake(sock, secret, timeout)
            return sock
        except (ServerBusy, ServerDropped):
            sock.close()
            if time.monotonic() + delay > deadline:
                raise
        except BaseException:
            sock.close()
            raise
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
