"""The version of the wire protocol (proto/trainfeed/v1/master.proto), in one place that both
sides may import: the master (trainfeed.master) and the reader's lease client (trainfeed.lease).

A reader sends it in OpenJobRequest.protocol_version and the master answers with its own; a master
speaking another version refuses with FAILED_PRECONDITION naming both, rather than letting the
mismatch surface later as a refused lease token.

History: 0 — readers before versioning (they send no field). 1 — never used on the wire (the
protocol up to issue 27). 2 — issue 28: the Watch stream carries give-backs, revocations, epoch
ends and sync-group changes; a reader holding unstarted leases no longer polls. Still 2: the
Session rpc (Watch plus the reader's heartbeats and reports as stream messages, issue 28) was
added without a new version, since both sides of a mixed pair still work: a reader meets a master
without Session with UNIMPLEMENTED and uses Watch and Report calls, and a master serves readers
that never open one as before. Bumping would have refused every such pair at OpenJob.
Still 2: grants on the Session stream (`get_tasks` messages answered with WatchEvent.grant,
issue 28) are offered by the master in its Session stream's first event (`grants`): a reader uses
them only when offered, a master that offers them still answers GetTasks calls and plain
messages, and no existing field changed meaning.
3 — issue 36: one conversation. The GetTasks, Report and Watch rpcs are gone: after OpenJob a
reader speaks only on its Session stream (and LeaveJob); a refused report no longer refuses its
message (the answer lists it), and a broken stream is reopened with the same secret.
"""
from __future__ import annotations

__all__ = ["PROTOCOL_VERSION"]

PROTOCOL_VERSION = 3
