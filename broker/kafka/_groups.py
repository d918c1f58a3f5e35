"""Kafka consumer groups: membership and generations, in memory.

The group protocol as Kafka's consumers speak it (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup): members join, the coordinator waits until every
known member has (re)joined or the rebalance timeout passed, opens the
next generation, picks a protocol (assignor) every member supports and a
leader; the leader assigns the partitions (client side) and sends the
assignments with its SyncGroup; each member gets its own. A member that
sends nothing for its session timeout is removed, which starts a
rebalance. A JoinGroup v4+ with no member id gets one back with
MEMBER_ID_REQUIRED and joins with it.

States: EMPTY -> PREPARING (waiting for joins) -> COMPLETING (waiting for
the leader's assignments) -> STABLE; any join or leave starts PREPARING
again. Nothing here is durable: after a restart members get
UNKNOWN_MEMBER_ID and join again. What is durable, a group's committed
offsets, lives in its subscriptions (see `broker.kafka._handlers`).

A member belongs to the role that joined it (``owner``, None without
authentication): SyncGroup, Heartbeat, LeaveGroup and OffsetCommit as
that member from another role are refused GROUP_AUTHORIZATION_FAILED, so
a member id seen by the group's leader or in DescribeGroups is no
capability to another role.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import struct
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.kafka._session import GROUP_AUTHORIZATION_FAILED

__all__ = ["GroupError", "GroupInfo", "Groups", "JoinResult", "Member", "subscribed_topics"]

# Kafka error codes the group protocol answers with.
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
MEMBER_ID_REQUIRED = 79

INITIAL_REBALANCE_DELAY = 0.1  # seconds an empty group waits for more first joiners
EXPIRY_INTERVAL = 0.5  # seconds between session checks


class GroupError(Exception):
    """A group request refused; ``code`` is Kafka's error code."""

    def __init__(self, code: int, message: str, member_id: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.member_id = member_id


class State(enum.Enum):
    EMPTY = "Empty"
    PREPARING = "PreparingRebalance"
    COMPLETING = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    owner: str | None = None  # the role that joined it
    client_host: str = ""
    last_seen: float = field(default_factory=time.monotonic)
    join: asyncio.Future[JoinResult] | None = None
    sync: asyncio.Future[bytes] | None = None
    assignment: bytes = b""

    def metadata(self, protocol: str) -> bytes:
        return next(meta for name, meta in self.protocols if name == protocol)


@dataclass(frozen=True, slots=True)
class JoinResult:
    generation: int
    protocol_type: str
    protocol: str
    leader: str
    member_id: str
    members: list[tuple[str, str | None, bytes]]  # for the leader only


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A group as DescribeGroups and ListGroups show it: its state (Kafka's
    name), protocol type and protocol, and its members with their
    metadata (for that protocol) and assignments."""

    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: list[tuple[Member, bytes, bytes]]


@dataclass(slots=True)
class _Group:
    group_id: str
    state: State = State.EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol: str = ""
    leader: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)  # ids handed out by MEMBER_ID_REQUIRED
    timer: asyncio.TimerHandle | None = None
    delaying: bool = False  # an empty group's first joins wait a little for more


class Groups:
    """Every consumer group of the listener. `close` stops its timers."""

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._ids = itertools.count()

    def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        for group in self._groups.values():
            if group.timer is not None:
                group.timer.cancel()
            for m in group.members.values():
                for fut in (m.join, m.sync):
                    if fut is not None and not fut.done():
                        fut.cancel()

    def _group(self, group_id: str) -> _Group:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = _Group(group_id)
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().call_later(EXPIRY_INTERVAL, self._expire)
        return group

    # -- queries -----------------------------------------------------------------

    def group_ids(self) -> list[str]:
        return sorted(self._groups)

    def describe(self, group_id: str) -> GroupInfo | None:
        group = self._groups.get(group_id)
        if group is None:
            return None
        members = [
            (
                m,
                next((meta for name, meta in m.protocols if name == group.protocol), b""),
                m.assignment,
            )
            for m in group.members.values()
        ]
        protocol_type = group.protocol_type if group.members else ""
        return GroupInfo(group_id, group.state.value, protocol_type, group.protocol, members)

    def forget(self, group_id: str) -> None:
        """Drop a group that has no members (its deletion)."""
        group = self._groups.get(group_id)
        if group is not None and not group.members:
            if group.timer is not None:
                group.timer.cancel()
            del self._groups[group_id]

    def drop(self, group_id: str, code: int, why: str) -> None:
        """Drop a group and its members, whatever its state (its coordinator
        moved to another broker of the cluster: its members join there); a
        JoinGroup or SyncGroup waiting is answered ``code``."""
        group = self._groups.pop(group_id, None)
        if group is None:
            return
        if group.timer is not None:
            group.timer.cancel()
        for m in group.members.values():
            for fut in (m.join, m.sync):
                if fut is not None and not fut.done():
                    fut.set_exception(GroupError(code, f"group {group_id!r}: {why}"))

    def check_member(
        self, group_id: str, member_id: str, generation: int, owner: str | None = None
    ) -> None:
        """An offset commit's check: a commit with generation -1 and no
        member id comes from outside the group protocol (allowed while the
        group has no members); else the member (of ``owner``'s) and
        generation must be the current ones."""
        group = self._groups.get(group_id)
        if generation < 0 and not member_id:
            if group is not None and group.members:
                raise GroupError(
                    UNKNOWN_MEMBER_ID,
                    f"group {group_id!r} has members: commit as one of them",
                )
            return
        self._check_current(group, group_id, member_id, generation, owner)

    @staticmethod
    def _member(
        group: _Group | None, group_id: str, member_id: str, owner: str | None
    ) -> tuple[_Group, Member]:
        """The group and its member ``member_id``, which ``owner`` joined."""
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            raise GroupError(UNKNOWN_MEMBER_ID, f"no member {member_id!r} in group {group_id!r}")
        if member.owner != owner:
            raise GroupError(
                GROUP_AUTHORIZATION_FAILED,
                f"member {member_id!r} of group {group_id!r} belongs to another role",
            )
        return group, member

    @classmethod
    def _check_current(
        cls, group: _Group | None, group_id: str, member_id: str, generation: int, owner: str | None
    ) -> None:
        """``member_id`` is ``owner``'s member of the group at ``generation``,
        which is not rebalancing; the member is seen now."""
        group, member = cls._member(group, group_id, member_id, owner)
        member.last_seen = time.monotonic()
        if generation != group.generation:
            raise GroupError(
                ILLEGAL_GENERATION,
                f"group {group_id!r} is at generation {group.generation}, not {generation}",
            )
        if group.state is State.PREPARING:
            raise GroupError(REBALANCE_IN_PROGRESS, f"group {group_id!r} is rebalancing")

    # -- JoinGroup -----------------------------------------------------------------

    def join(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        require_known_id: bool,
        owner: str | None = None,
        client_host: str = "",
    ) -> asyncio.Future[JoinResult]:
        """JoinGroup: a future answered once the next generation opens
        (``owner``: the role joining)."""
        group = self._group(group_id)
        if not protocols:
            raise GroupError(INCONSISTENT_GROUP_PROTOCOL, "a JoinGroup names no protocol")
        if group.members and protocol_type != group.protocol_type:
            raise GroupError(
                INCONSISTENT_GROUP_PROTOCOL,
                f"group {group_id!r} runs protocol type {group.protocol_type!r}, "
                f"not {protocol_type!r}",
            )
        if group.members and not self._common(group, protocols, skip=member_id):
            raise GroupError(
                INCONSISTENT_GROUP_PROTOCOL,
                f"no protocol of this member is supported by every member of {group_id!r}",
            )
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_id:
                group.pending.add(member_id)
                raise GroupError(MEMBER_ID_REQUIRED, "join again with this member id", member_id)
        elif member_id not in group.members and member_id not in group.pending:
            raise GroupError(UNKNOWN_MEMBER_ID, f"no member {member_id!r} in group {group_id!r}")
        member = group.members.get(member_id)
        if member is not None:
            self._member(group, group_id, member_id, owner)
        group.pending.discard(member_id)
        if member is None:
            member = group.members[member_id] = Member(
                member_id,
                group_instance_id,
                client_id,
                session_timeout_ms,
                rebalance_timeout_ms,
                list(protocols),
                owner,
                client_host,
            )
        else:
            member.protocols = list(protocols)
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
            member.last_seen = time.monotonic()
        if member.join is not None and not member.join.done():
            member.join.cancel()  # a re-sent join replaces the one waiting
        group.protocol_type = protocol_type
        joined: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join = joined
        self._prepare(group)
        self._maybe_complete(group)
        return joined

    @staticmethod
    def _common(group: _Group, protocols: Sequence[tuple[str, bytes]], skip: str = "") -> list[str]:
        names = [name for name, _ in protocols]
        for m in group.members.values():
            if m.member_id != skip:
                theirs = {name for name, _ in m.protocols}
                names = [n for n in names if n in theirs]
        return names

    def _prepare(self, group: _Group) -> None:
        """Start a rebalance (unless one is being prepared): pending
        SyncGroups learn REBALANCE_IN_PROGRESS."""
        if group.state is State.PREPARING:
            return
        first = group.state is State.EMPTY
        group.state = State.PREPARING
        for m in group.members.values():
            if m.sync is not None and not m.sync.done():
                m.sync.set_exception(
                    GroupError(REBALANCE_IN_PROGRESS, f"group {group.group_id!r} is rebalancing")
                )
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        delay = INITIAL_REBALANCE_DELAY if first else timeout / 1000
        if group.timer is not None:
            group.timer.cancel()
        group.delaying = first
        group.timer = asyncio.get_running_loop().call_later(delay, self._rebalance_due, group)

    def _rebalance_due(self, group: _Group) -> None:
        """The rebalance timeout passed (or an empty group's first delay):
        members that did not rejoin are removed, the rest get the generation."""
        group.timer = None
        group.delaying = False
        if group.state is not State.PREPARING:
            return
        for member_id in [m for m, v in group.members.items() if v.join is None]:
            del group.members[member_id]
        self._complete(group)

    @staticmethod
    def _all_joined(group: _Group) -> bool:
        return bool(group.members) and all(m.join is not None for m in group.members.values())

    def _maybe_complete(self, group: _Group) -> None:
        if group.state is not State.PREPARING or not self._all_joined(group):
            return
        if group.delaying:
            return  # an empty group's first delay: more first joiners may come
        self._complete(group)

    def _complete(self, group: _Group) -> None:
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        if not group.members:
            group.state = State.EMPTY
            group.generation += 1
            return
        group.generation += 1
        members = list(group.members.values())
        if group.leader not in group.members:
            group.leader = members[0].member_id
        leader = group.members[group.leader]
        common = self._common(group, leader.protocols)
        group.protocol = common[0] if common else leader.protocols[0][0]
        group.state = State.COMPLETING
        listing = [(m.member_id, m.group_instance_id, m.metadata(group.protocol)) for m in members]
        now = time.monotonic()
        for m in members:
            m.assignment = b""
            m.last_seen = now
            join, m.join = m.join, None
            if join is not None and not join.done():
                join.set_result(
                    JoinResult(
                        group.generation,
                        group.protocol_type,
                        group.protocol,
                        group.leader,
                        m.member_id,
                        listing if m.member_id == group.leader else [],
                    )
                )

    # -- SyncGroup -------------------------------------------------------------------

    def sync(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        assignments: Sequence[tuple[str, bytes]],
        owner: str | None = None,
    ) -> asyncio.Future[bytes]:
        """SyncGroup: the member's assignment, once the leader has sent them."""
        group, member = self._member(self._groups.get(group_id), group_id, member_id, owner)
        if generation != group.generation:
            raise GroupError(
                ILLEGAL_GENERATION,
                f"group {group_id!r} is at generation {group.generation}, not {generation}",
            )
        if group.state is State.PREPARING:
            raise GroupError(REBALANCE_IN_PROGRESS, f"group {group_id!r} is rebalancing")
        member.last_seen = time.monotonic()
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        if group.state is State.STABLE:
            fut.set_result(member.assignment)
            return fut
        member.sync = fut
        if member_id == group.leader:
            given = dict(assignments)
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
            group.state = State.STABLE
            for m in group.members.values():
                if m.sync is not None and not m.sync.done():
                    m.sync.set_result(m.assignment)
                m.sync = None
        return fut

    # -- Heartbeat, LeaveGroup, expiry --------------------------------------------------

    def heartbeat(
        self, group_id: str, member_id: str, generation: int, owner: str | None = None
    ) -> None:
        self._check_current(self._groups.get(group_id), group_id, member_id, generation, owner)

    def leave(self, group_id: str, member_id: str, owner: str | None = None) -> None:
        group, _ = self._member(self._groups.get(group_id), group_id, member_id, owner)
        self._remove(group, member_id)

    def _remove(self, group: _Group, member_id: str) -> None:
        member = group.members.pop(member_id)
        for fut in (member.join, member.sync):
            if fut is not None and not fut.done():
                fut.set_exception(GroupError(UNKNOWN_MEMBER_ID, f"member {member_id!r} left"))
        if not group.members:
            if group.timer is not None:
                group.timer.cancel()
                group.timer = None
            group.state = State.EMPTY
            group.generation += 1
            return
        self._prepare(group)
        self._maybe_complete(group)

    def _expire(self) -> None:
        self._expiry = asyncio.get_running_loop().call_later(EXPIRY_INTERVAL, self._expire)
        now = time.monotonic()
        for group in self._groups.values():
            for member_id, m in list(group.members.items()):
                waiting = m.join is not None and group.state is State.PREPARING
                if not waiting and now - m.last_seen > m.session_timeout_ms / 1000:
                    self._remove(group, member_id)


def subscribed_topics(metadata: bytes) -> list[str]:
    """The topics of a consumer's ConsumerProtocolSubscription (JoinGroup's
    protocol metadata): a version (int16), then an array (int32 count) of
    strings (int16 length, UTF-8); what follows is left unread. ValueError
    if it is not one."""
    try:
        _, count = struct.unpack_from(">hi", metadata, 0)
        if not 0 <= count <= len(metadata):
            raise ValueError(f"{count} topics")
        pos = 6
        topics = []
        for _ in range(count):
            (size,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if size < 0 or pos + size > len(metadata):
                raise ValueError("a topic name runs past the metadata")
            topics.append(metadata[pos : pos + size].decode())
            pos += size
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None
    return topics
