"""Encryption at rest of the payloads the Redis store writes (``RUNNER_ENCRYPTION_KEYS``).

``RUNNER_ENCRYPTION_KEYS=kid1:<base64 key>[,kid0:<older key>,...]``: AES-GCM (128, 192 or
256-bit keys), a fresh 96-bit nonce per value. The first key seals; every listed key opens
what it sealed. A sealed value is text, ``enc:<key id>:<base64 of nonce + ciphertext + tag>``,
so the key id is stored beside each value and a reader names the key it lacks. No JSON value
starts with ``e``, so a sealed value is told from a clear one written before encryption was
turned on (both are read; ``runner rekey`` seals the clear ones too).

Each value is sealed with associated data naming its run and place (``<run>|<field>``): a
value copied to another run or field does not open. What is sealed of a checkpoint is
:data:`PAYLOAD` (state, outputs, inputs, answers, questions, feedback, usage, error texts);
what stays clear is what routes and recovers a run: ids, statuses, times, method names,
activations and the record's bookkeeping.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from pydantic_core import from_json

from runner.errors import EncryptionKeyError, InvalidSettings

MARK = "enc:"
"""How every sealed value begins."""
_BMARK = MARK.encode()
_KID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NONCE = 12

_AWAITING: dict[str, Any] = {"message": True, "output": True, "metadata": True}
"""What a question or review holds of the user's: its text, the output under review and the
decorator's metadata (its kind, method, labels and deadline stay clear)."""
PAYLOAD: dict[str, Any] = {
    "state": True,
    "usage": True,
    "error": {"message": True, "traceback": True},
    "record": {"outputs": True},
    "meta": {
        "trigger_payload": True,
        "usage": True,
        "scheduling": {"submitted": True},
        "human": {
            "pause_reason": True,
            "feedback": True,
            "awaiting": _AWAITING,
            "reviews": {"__all__": _AWAITING},
            "answers": {"__all__": {"__all__": {"text": True, "by": True, "awaited": _AWAITING}}},
        },
        "links": {"children": {"__all__": {"before": True, "after": True, "usage": True}}},
    },
}
"""The parts of a checkpoint that are sealed (pydantic's include/exclude shape). A record
sealed before the metadata was grouped (these fields at its top level) opens as it was
written: the clear and sealed parts are merged, then read as any flat metadata."""
PAYLOAD_BY_FIELD = {k: v for k, v in PAYLOAD.items() if k != "state"}
"""... of a checkpoint whose state is stored by field (each value sealed on its own)."""
CLEAR_EXCLUDE: dict[str, Any] = {**PAYLOAD, "seq": True}
"""What the clear part of a sealed snapshot leaves out (``seq`` is the commit script's)."""


class Codec:
    """AES-GCM over the keys of ``RUNNER_ENCRYPTION_KEYS``: the first seals, all open."""

    def __init__(self, keys: Sequence[tuple[str, bytes]]) -> None:
        if not keys:
            raise ValueError("a codec needs at least one key")
        self.kid = keys[0][0]
        """The id of the key that seals."""
        self.kids = [kid for kid, _ in keys]
        """Every key id that opens, the sealing one first."""
        # Imported here: a process without encryption (a cold CLI command) never loads it.
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._keys = {kid: AESGCM(key) for kid, key in keys}
        self._sealer = self._keys[self.kid]
        self._prefix = f"{MARK}{self.kid}:"

    def seal(self, plain: bytes, context: str) -> str:
        """``plain`` sealed with the first key, ``context`` (run and place) bound to it."""
        nonce = os.urandom(_NONCE)
        sealed = self._sealer.encrypt(nonce, plain, context.encode())
        return self._prefix + base64.b64encode(nonce + sealed).decode("ascii")

    def open(self, value: str | bytes, context: str, what: str) -> bytes:
        """The plain bytes of a sealed ``value`` (:class:`EncryptionKeyError` naming the key
        id if no listed key has that id or the key does not open it; ``what`` says whose)."""
        kid, body = split(value, what)
        aead = self._keys.get(kid)
        if aead is None:
            raise missing_key(kid, what)
        from cryptography.exceptions import InvalidTag

        try:
            raw = base64.b64decode(body, validate=True)
            plain: bytes = aead.decrypt(raw[:_NONCE], raw[_NONCE:], context.encode())
            return plain
        except (InvalidTag, binascii.Error, ValueError):
            raise EncryptionKeyError(
                f"{what} does not open with encryption key {kid!r}: the key is not the one "
                f"it was sealed with, or the data was altered (RUNNER_ENCRYPTION_KEYS)",
                key_id=kid,
            ) from None

    def current(self, value: str | bytes) -> bool:
        """Whether ``value`` is sealed with the first key (``runner rekey`` leaves it)."""
        head = self._prefix if isinstance(value, str) else self._prefix.encode()
        return value.startswith(head)  # type: ignore[arg-type]


def is_sealed(value: str | bytes) -> bool:
    """Whether a stored value is sealed (else it is clear JSON)."""
    return value.startswith(MARK if isinstance(value, str) else _BMARK)  # type: ignore[arg-type]


def split(value: str | bytes, what: str) -> tuple[str, str]:
    """A sealed value's key id and body."""
    text = value if isinstance(value, str) else value.decode("ascii", "replace")
    _, kid, body = [*text.split(":", 2), "", ""][:3]
    if not _KID.fullmatch(kid):
        raise EncryptionKeyError(f"{what} is sealed with no readable key id", key_id="")
    return kid, body


def missing_key(kid: str, what: str) -> EncryptionKeyError:
    """The error of a process that lacks key ``kid``."""
    return EncryptionKeyError(
        f"{what} is encrypted with key {kid!r}, which this process does not have: "
        f"set RUNNER_ENCRYPTION_KEYS to a list holding it",
        key_id=kid,
    )


def open_value(codec: Codec | None, value: str | bytes, context: str, what: str) -> bytes:
    """A stored value's clear bytes: opened if sealed (with ``codec``, else the error
    naming its key), as stored if clear."""
    if not is_sealed(value):
        return value if isinstance(value, bytes) else value.encode()
    if codec is None:
        raise missing_key(split(value, what)[0], what)
    return codec.open(value, context, what)


def parse_keys(text: str) -> list[tuple[str, bytes]]:
    """``kid:base64,...`` as (key id, key) pairs; ``ValueError`` naming what is wrong (never
    a key's bytes)."""
    keys: list[tuple[str, bytes]] = []
    for n, item in enumerate((part.strip() for part in text.split(",") if part.strip()), 1):
        kid, sep, encoded = item.partition(":")
        if not sep or not _KID.fullmatch(kid):
            raise ValueError(
                f"entry {n} is not <key id>:<base64 key> (a key id is 1-64 of A-Z a-z 0-9 _ . -)"
            )
        try:
            key = base64.b64decode(encoded.strip(), validate=True)
        except binascii.Error:
            raise ValueError(f"the key of {kid!r} is not base64") from None
        if len(key) not in (16, 24, 32):
            raise ValueError(f"the key of {kid!r} is {len(key)} bytes, not 16, 24 or 32")
        if any(kid == seen for seen, _ in keys):
            raise ValueError(f"key id {kid!r} is listed twice")
        keys.append((kid, key))
    return keys


@lru_cache(maxsize=4)
def _codec_of(text: str) -> Codec | None:
    try:
        keys = parse_keys(text)
    except ValueError as exc:
        raise InvalidSettings(f"bad setting RUNNER_ENCRYPTION_KEYS: {exc}") from None
    return Codec(keys) if keys else None


def of_settings(settings: Any) -> Codec | None:
    """The codec of a :class:`~runner.settings.RunnerSettings` (``None``: encryption off),
    one per key list in a process."""
    secret = settings.encryption_keys
    return _codec_of(secret.get_secret_value()) if secret is not None else None


def new_key() -> str:
    """A fresh 256-bit key, base64 (``runner rekey --new-key`` prints one)."""
    return base64.b64encode(os.urandom(32)).decode()


# -- a checkpoint's snapshot ---------------------------------------------------------------


def merge(clear: Any, secret: Any) -> Any:
    """``clear`` with the sealed parts ``secret`` put back where they were taken from."""
    if isinstance(clear, dict) and isinstance(secret, dict):
        for key, value in secret.items():
            clear[key] = merge(clear[key], value) if key in clear else value
        return clear
    if isinstance(clear, list) and isinstance(secret, list) and len(clear) == len(secret):
        return [merge(c, s) for c, s in zip(clear, secret, strict=True)]
    return secret


def open_snapshot(
    codec: Codec | None, blob: str | bytes, run_id: str | None, what: str
) -> dict[str, Any] | None:
    """A stored snapshot as a dict, its sealed part opened; ``None`` if it has none (it is
    clear: the caller parses it as it is). ``ValueError`` if it is not JSON. ``run_id``:
    the run it is stored under (``None``: the one it names, for a store that files a
    checkpoint by its id only)."""
    raw = blob.encode() if isinstance(blob, str) else blob
    if b'"sealed":"enc:' not in raw:
        return None
    data = from_json(raw)
    sealed = data.pop("sealed", None) if isinstance(data, dict) else None
    if not isinstance(sealed, str):
        return None
    run = data.get("run_id") if run_id is None else run_id
    secret = from_json(open_value(codec, sealed, snapshot_context(run, data.get("id")), what))
    merged: dict[str, Any] = merge(data, secret)
    return merged


def snapshot_context(run_id: str, checkpoint_id: Any) -> str:
    """The associated data of a snapshot's sealed part."""
    return f"{run_id}|ckpt|{checkpoint_id}"


def field_context(run_id: str, field: str) -> str:
    """The associated data of a state field's value or a metadata field."""
    return f"{run_id}|{field}"
