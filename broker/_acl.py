"""The ACL: which role holds which permission on which resources.

A grant (`AclEntry`) gives a role ``produce`` or ``consume`` on topics,
``consume`` on subscriptions, ``produce`` or KIP-939's
``two_phase_commit`` on transactional ids, each named with wildcards (see
`broker._auth` for what each command needs). `Security` asks
`AclStore.allows`.

The ACL lives in ``acl.json`` in the broker's data directory, written
atomically (a temporary file, fsync, rename, fsync of the directory)
before the change is applied in memory and answered. A broker whose store
is PostgreSQL (``--store``) has no data directory: its ACL is the last
entry of the ledger ``__meta/acl`` in the store, the same JSON document,
each change appended whole and the entries before it trimmed. A JSON file rather
than a ledger in the broker's store: the ACL is a small set, read whole at
start and replaced whole on each change (a ledger would replay a history
of grants and revokes for nothing), and an operator can read it, back it
up and provision it before the broker first starts. A file that does not
parse stops the broker from starting (`AclFileError`): a broken ACL must
neither open nor close everything in silence.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from buffer import quoted
from ledger import Ledger

__all__ = [
    "ACL_FILE",
    "AclEntry",
    "AclError",
    "AclFileError",
    "AclStore",
    "Permission",
    "ResourceType",
    "check_role",
]

ACL_FILE = "acl.json"  # in the broker's data directory
_ROLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+-]{0,199}")
_PATTERN = re.compile(r"[A-Za-z0-9.*_-]{1,200}")
_CACHE_LIMIT = 100_000  # answers `AclStore` remembers before it starts over


class AclError(ValueError):
    """A grant that is not well formed: the message says what is wrong."""


class AclFileError(Exception):
    """The ACL file does not parse: the broker does not start."""


class Permission(enum.StrEnum):
    PRODUCE = "produce"
    CONSUME = "consume"
    TWO_PHASE_COMMIT = "two_phase_commit"  # KIP-939, on a transactional id


class ResourceType(enum.StrEnum):
    TOPIC = "topic"  # topic:<pattern>
    SUBSCRIPTION = "subscription"  # subscription:<topic pattern>/<subscription pattern>
    TRANSACTIONAL_ID = "transactional-id"  # transactional-id:<pattern>


# What may be granted on what.
_GRANTABLE = {
    ResourceType.TOPIC: (Permission.PRODUCE, Permission.CONSUME),
    ResourceType.SUBSCRIPTION: (Permission.CONSUME,),
    ResourceType.TRANSACTIONAL_ID: (Permission.PRODUCE, Permission.TWO_PHASE_COMMIT),
}


def _regex(pattern: str) -> re.Pattern[str]:
    """A name pattern (``*``: any run of characters) as a regex."""
    return re.compile("".join(".*" if c == "*" else re.escape(c) for c in pattern))


def check_role(role: object) -> str:
    if not isinstance(role, str) or not _ROLE.fullmatch(role):
        raise AclError(
            f"invalid role {quoted(role)}: use 1-200 characters from A-Z a-z 0-9 . _ @ : + -, "
            "starting with a letter or digit"
        )
    return role


@dataclass(frozen=True, slots=True, order=True)
class AclEntry:
    """One grant: ``role`` holds ``permission`` on ``resource``
    (``<type>:<pattern>``, see the module docstring)."""

    role: str
    permission: Permission
    resource: str

    @classmethod
    def parse(cls, role: object, permission: object, resource: object) -> AclEntry:
        """A grant from what a client sent; `AclError` says what is wrong."""
        role = check_role(role)
        try:
            perm = Permission(str(permission))
        except ValueError:
            raise AclError(
                f"unknown permission {quoted(permission)}: one of "
                f"{', '.join(p.value for p in Permission)}"
            ) from None
        if not isinstance(resource, str) or ":" not in resource:
            raise AclError(
                f"resource {quoted(resource)} must be topic:<pattern>, "
                "subscription:<topic pattern>/<subscription pattern> or "
                "transactional-id:<pattern>"
            )
        kind_text, _, pattern = resource.partition(":")
        try:
            kind = ResourceType(kind_text)
        except ValueError:
            raise AclError(
                f"unknown resource type {quoted(kind_text)}: one of "
                f"{', '.join(t.value for t in ResourceType)}"
            ) from None
        parts = pattern.split("/") if kind is ResourceType.SUBSCRIPTION else [pattern]
        if kind is ResourceType.SUBSCRIPTION and len(parts) != 2:
            raise AclError(
                f"subscription resource {quoted(resource)} must be "
                "subscription:<topic pattern>/<subscription pattern>"
            )
        for part in parts:
            if not _PATTERN.fullmatch(part):
                raise AclError(
                    f"invalid pattern {quoted(part)} in {quoted(resource)}: use 1-200 "
                    "characters from A-Z a-z 0-9 . _ - and * (any run of characters)"
                )
        if perm not in _GRANTABLE[kind]:
            allowed = ", ".join(p.value for p in _GRANTABLE[kind])
            raise AclError(f"{perm.value} cannot be granted on a {kind.value} (only {allowed})")
        return cls(role, perm, resource)

    @property
    def kind(self) -> ResourceType:
        return ResourceType(self.resource.partition(":")[0])

    @property
    def pattern(self) -> str:
        return self.resource.partition(":")[2]

    def to_json(self) -> dict[str, str]:
        return {"role": self.role, "permission": self.permission.value, "resource": self.resource}


def _parse_acl(raw: bytes, where: str) -> list[AclEntry]:
    """The grants of an ACL document; `AclFileError` if it does not parse."""
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != 1:
            raise AclError('expected {"format": 1, "grants": [...]}')
        grants = doc.get("grants")
        if not isinstance(grants, list):
            raise AclError('"grants" must be a list')
        entries = []
        for g in grants:
            if not isinstance(g, dict):
                raise AclError(f"a grant must be an object, not {quoted(g)}")
            entries.append(AclEntry.parse(g.get("role"), g.get("permission"), g.get("resource")))
    except (ValueError, UnicodeDecodeError) as exc:
        raise AclFileError(f"the ACL in {where} is broken: {exc}") from exc
    return entries


class AclStore:
    """The grants, in memory and in ``path`` or in ``ledger`` (see the
    module docstring). `allows` answers from a cache that every change
    clears."""

    def __init__(
        self, path: Path | None, entries: Iterable[AclEntry] = (), ledger: Ledger | None = None
    ) -> None:
        self.path = path
        self.ledger = ledger
        self._entries: frozenset[AclEntry] = frozenset(entries)
        self._lock = asyncio.Lock()
        # A cluster broker that does not own the ACL's slot: what a grant or
        # revoke raises (`refusals.NotOwner`), nothing changed.
        self.not_writable: Callable[[], Exception] | None = None
        self._index()

    def replace_entries(self, entries: Iterable[AclEntry]) -> None:
        """Take the grants read from the store (a cluster broker that does
        not write the ACL reads it again now and then)."""
        entries = frozenset(entries)
        if entries != self._entries:
            self._entries = entries
            self._index()

    @staticmethod
    def parse(data: bytes, where: str) -> list[AclEntry]:
        """The grants of one ACL document."""
        return _parse_acl(data, where)

    @classmethod
    def load(cls, path: Path) -> AclStore:
        """The ACL in ``path`` (empty if there is none); `AclFileError` if
        the file does not parse."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(path)
        except OSError as exc:
            raise AclFileError(f"cannot read the ACL file {path}: {exc}") from exc
        return cls(path, _parse_acl(raw, f"the file {path}"))

    @classmethod
    async def load_ledger(cls, ledger: Ledger) -> AclStore:
        """The ACL in ``ledger``: its last entry (empty if it has none)."""
        last = await ledger.read(ledger.last_entry_id, ledger.last_entry_id)
        entries = _parse_acl(last[0].data, f"the ledger {ledger.name}") if last else []
        return cls(None, entries, ledger)

    def _index(self) -> None:
        self._by_key: dict[tuple[str, Permission, ResourceType], list[re.Pattern[str]]] = {}
        self._restricted: list[re.Pattern[str]] = []  # subscriptions someone is granted
        for entry in self._entries:
            regex = _regex(entry.pattern)
            self._by_key.setdefault((entry.role, entry.permission, entry.kind), []).append(regex)
            if entry.kind is ResourceType.SUBSCRIPTION:
                self._restricted.append(regex)
        self._cache: dict[tuple[str, Permission, ResourceType, str], bool] = {}
        self._restricted_cache: dict[str, bool] = {}

    def entries(self, role: str | None = None) -> list[AclEntry]:
        return sorted(e for e in self._entries if role is None or e.role == role)

    def allows(self, role: str, permission: Permission, kind: ResourceType, name: str) -> bool:
        """True if a grant gives ``role`` ``permission`` on the resource
        ``name`` of type ``kind`` (a subscription: ``topic/subscription``)."""
        key = (role, permission, kind, name)
        found = self._cache.get(key)
        if found is None:
            regexes = self._by_key.get((role, permission, kind), ())
            found = any(r.fullmatch(name) for r in regexes)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = found
        return found

    def restricted(self, topic: str, subscription: str) -> bool:
        """True if a grant names this subscription (it is then open only to
        the roles granted ``consume`` on it)."""
        name = f"{topic}/{subscription}"
        found = self._restricted_cache.get(name)
        if found is None:
            found = any(r.fullmatch(name) for r in self._restricted)
            if len(self._restricted_cache) >= _CACHE_LIMIT:
                self._restricted_cache.clear()
            self._restricted_cache[name] = found
        return found

    async def grant(self, entry: AclEntry) -> bool:
        """Add ``entry`` (durably, then in memory); False if it was there."""
        async with self._lock:
            self._check_writable()
            if entry in self._entries:
                return False
            await self._replace(self._entries | {entry})
            return True

    async def revoke(self, entry: AclEntry) -> bool:
        """Remove ``entry`` (durably, then in memory); False if it was not there."""
        async with self._lock:
            self._check_writable()
            if entry not in self._entries:
                return False
            await self._replace(self._entries - {entry})
            return True

    def _check_writable(self) -> None:
        if self.ledger is None and self.path is None and self.not_writable is not None:
            raise self.not_writable()

    async def _replace(self, entries: frozenset[AclEntry]) -> None:
        doc = {"format": 1, "grants": [e.to_json() for e in sorted(entries)]}
        text = json.dumps(doc, indent=1) + "\n"
        if self.ledger is not None:  # (the whole document, then the ones before it go)
            last = await self.ledger.append(text.encode())
            await self.ledger.trim(last)
        else:
            assert self.path is not None
            await asyncio.to_thread(_write_atomically, self.path, text)
        self._entries = entries
        self._index()


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
