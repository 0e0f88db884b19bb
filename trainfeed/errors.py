"""The exceptions trainfeed raises. One root, so that callers can catch all of ours at once."""
from __future__ import annotations


class TrainfeedError(Exception):
    """Root of every error trainfeed raises on purpose."""


class InvalidNameError(TrainfeedError, ValueError):
    """A dataset or job name that could escape its folder or is otherwise not allowed."""


class ListFileError(TrainfeedError):
    """A `.list` file that cannot be uploaded; the message names the file and line."""


def _listed(list_path: str, lines: list[str], limit: int = 50) -> str:
    """`list:line: …` rows of a list-wide error, the first `limit` of them."""
    shown = "\n".join(f"  {list_path}:{line}" for line in lines[:limit])
    more = f"\n  … and {len(lines) - limit} more" if len(lines) > limit else ""
    return shown + more


class MissingFilesError(ListFileError):
    """Files named by a `.list` file do not exist. Every one is listed, not only the first."""

    def __init__(self, list_path: str, missing: list[tuple[int, str]]):
        self.list_path = list_path
        self.missing = missing
        super().__init__(
            f"{len(missing)} file(s) named in {list_path} do not exist; nothing was published "
            f"(use --skip-missing to publish the rest):\n"
            + _listed(list_path, [f"{line}: {path}" for line, path in missing]))


class UndecodableImagesError(ListFileError):
    """`upload --check-images` found files that are not decodable images; all are listed."""

    def __init__(self, list_path: str, bad: list[tuple[int, str, str]]):
        self.list_path = list_path
        self.bad = bad
        super().__init__(
            f"{len(bad)} file(s) named in {list_path} are not decodable images; nothing was "
            f"published:\n"
            + _listed(list_path, [f"{line}: {path}: {reason}" for line, path, reason in bad]))


class OutsidePathsError(ListFileError):
    """A file list names files outside its own folder; all are listed."""

    def __init__(self, list_path: str, outside: list[tuple[int, str]]):
        self.list_path = list_path
        self.outside = outside
        super().__init__(
            f"{len(outside)} file(s) named in {list_path} lie outside its folder (absolute "
            f"paths, '..', or symlinks pointing out); nothing was published (use "
            f"--allow-outside if that is intended):\n"
            + _listed(list_path, [f"{line}: {path}" for line, path in outside]))


class HardLinkedFilesError(OutsidePathsError):
    """Files named by a list have other names (hard links), which may lie outside its folder:
    a link's other names cannot be found, so they are refused as a file outside would be."""

    def __init__(self, list_path: str, linked: list[tuple[int, str, int]]):
        self.list_path = list_path
        self.outside = [(line, path) for line, path, _ in linked]
        ListFileError.__init__(
            self,
            f"{len(linked)} file(s) named in {list_path} have more than one name (hard links), "
            f"so their content may come from outside its folder, where a link cannot be "
            f"followed to; nothing was published (use --allow-hard-links if they are meant to "
            f"be packed):\n"
            + _listed(list_path, [f"{line}: {path} ({names} names)"
                                  for line, path, names in linked]))


class OversizeRecordsError(ListFileError):
    """Files larger than the upload's per-record limit; all are listed."""

    def __init__(self, list_path: str, limit: int, big: list[tuple[int, str, int]]):
        self.list_path = list_path
        self.big = big
        super().__init__(
            f"{len(big)} file(s) named in {list_path} are larger than the record limit of "
            f"{limit:,} bytes; nothing was published (raise --max-record-bytes if they are "
            f"meant to be records):\n"
            + _listed(list_path, [f"{line}: {path} ({size:,} bytes)" for line, path, size in big]))


class StorageAccessError(TrainfeedError, PermissionError):
    """Storage refused access (wrong or missing credentials); names the URL and what to set."""


class DatasetNotFoundError(TrainfeedError, LookupError):
    """No complete dataset (no manifest) under that name in that storage."""


class DatasetExistsError(TrainfeedError):
    """An upload would replace a different, already published dataset."""


class ConcurrentUploadError(TrainfeedError):
    """Another upload of the same dataset is running, or replaced it while this one ran; the
    message names the dataset and the other upload, and says what to do."""


class CorruptDatasetError(TrainfeedError):
    """A manifest or shard that does not match what was written (checksum, schema, row counts)."""


class MasterUnavailableError(TrainfeedError, ConnectionError):
    """The master could not be reached within the give-up time."""


class JobError(TrainfeedError):
    """The master refused a job request (unknown dataset, job bound to another dataset, …)."""


class CallCancelled(JobError):
    """A reader's call to the master was cancelled because its caller gave up on it: a pass's
    long-poll for tasks when the reader was closed (from another thread) while the pass was
    still reading. Whether the master acted on the call is unknown, as after any lost answer;
    the pass ends with this error rather than as if the epoch were over."""


class AuthenticationError(JobError):
    """The master refused the caller's token (missing or wrong): retrying cannot help."""


class ConfigurationError(TrainfeedError, ValueError):
    """A setting that cannot work (no token, an unreadable certificate, flags that exclude each
    other); the message names the setting and what to set instead."""


class LostRecordsError(TrainfeedError):
    """A pass ended without some of its epoch's records: partitions that could not be read by
    any reader (after the master's --max-failures tries), each named with its last reason."""


class SyncShortfallError(TrainfeedError):
    """A synchronous rank could not get its epoch's quota of records (partitions were lost, or
    the job's group changed under it): rather than leave the other ranks hanging in an
    all-reduce, the pass fails."""


class PartitionReadError(TrainfeedError):
    """A reader could not read any partition it was given in a pass (bad credentials, a storage
    it cannot reach): raised rather than yielding empty epochs forever."""


class LeadershipError(TrainfeedError):
    """This master does not (or no longer) hold the state store's leadership: another master
    serves the same state. It must stop serving rather than hand out tasks twice."""


class StateStoreError(TrainfeedError):
    """The master's state store did not take a change (etcd unreachable, disk full): the call
    that made it fails, and the change is retried with the next one."""


class ClusterError(TrainfeedError):
    """Kubernetes refused or cannot run a job (no kubeconfig, unknown job, exceeded quota, an image
    that cannot be pulled); the message says what to change."""


class CheckpointError(TrainfeedError, ValueError):
    """A saved reader state (`state_dict()`) that cannot be restored into this reader: a missing
    key, a value of the wrong type or range, or a position the dataset does not have. The
    message names the key, the value and the rule; restore the state the reader saved,
    unchanged, into a reader of the same dataset."""


class SyncGroupBrokenError(SyncShortfallError):
    """A synchronous group lost a rank: it died, left, never arrived, or its rank went to another
    process. The master names the rank(s); the others raise this instead of waiting for records
    that no rank will take (restart the whole group, e.g. torchrun's --max-restarts)."""


class RankTakenError(JobError):
    """A second process claimed a synchronous rank that a live reader holds (two processes with
    the same RANK): the message names the holder and the claimant."""


class DeliveryOrderError(JobError):
    """A reader's sampling options (seed, shuffle, resample, sync) differ from those its job is
    read with: readers of one job must deliver in one order. The message names both and
    suggests another job name."""


class SupersededError(JobError):
    """A reader restored from this reader's checkpoint took over its partitions: this reader
    gets no more tasks (its records would be delivered twice). Close it."""


class ProtocolVersionError(JobError):
    """The master speaks another version of the wire protocol than this reader
    (trainfeed.protocol.PROTOCOL_VERSION): it refused OpenJob with FAILED_PRECONDITION. The
    message names both versions; upgrade trainfeed on the older side so that they match."""


class EtcdUnavailableError(TrainfeedError, ConnectionError):
    """The master's `etcd://` state store could not reach etcd (connection refused or timed
    out); the message names the state URL and the etcd address. Start etcd or correct the
    address in the state URL."""


class DecodeError(TrainfeedError):
    """A record's bytes are not an image this pipeline can decode (damaged, an unknown format,
    over the pixel budget), or a batch mixes image shapes. Raised under the reader's default
    `decode_errors="raise"`; the message names the record, its source file and list line. Fix or
    drop the file, or read with `decode_errors="skip"` to count and log such records instead."""


class PixelBudgetError(TrainfeedError, ValueError):
    """An image's header declares more pixels than the pixel budget allows
    (`$TRAINFEED_MAX_IMAGE_PIXELS`), a possible decompression bomb: refused before a pixel is
    allocated. The decoders report it as a DecodeError naming the record; raise the budget if
    such images are meant to be data."""


class UnknownLabelError(TrainfeedError, ValueError):
    """A record's label is not among the class values the reader maps to ids (e.g. a validation
    set with a class the training set lacks); the message names the record and the label. Pass
    the training reader's class values, or correct the label."""


class PreprocessError(TrainfeedError, ValueError):
    """A source column that `trainfeed.preprocess` cannot pack as MADlib does (missing,
    non-numeric, ragged, an unknown class, too small a `num_classes`); the message names the
    column and the row."""


class SqlError(TrainfeedError):
    """A SQL source's query or connection failed; the message names the database URL (never its
    password) and the database's own error."""


class InvalidQueryError(SqlError, ValueError):
    """A SQL source's query is not exactly one statement (empty, or several separated by ``;``):
    pass one SELECT."""


class UnknownColumnError(SqlError, LookupError):
    """A key or statistics column named for a SQL source that the query's result does not have;
    the message names the column and the ones the result has."""


class IncompleteUploadError(TrainfeedError, RuntimeError):
    """The commit of an upload run as slices (`trainfeed submit-upload`, `upload-slice`) found a
    slice missing, failed or not as planned, and published nothing; the message names each such
    slice and the index to run again."""


class AppendMismatchError(TrainfeedError, ValueError):
    """`trainfeed upload --append` of a list that does not fit the dataset it would extend
    (other fields, another kind, other stored transforms, labels that would renumber its
    classes): the message names the field or setting. Nothing is written then."""


class DecodersUnavailableError(TrainfeedError, ConnectionError):
    """Remote decode (`TRAINFEED_DECODE=remote`): no decoder of `TRAINFEED_DECODERS` answered
    for the pool's give-up time. A ConnectionError: a master-fed pass reports the task failed
    and goes on, as for a storage read that fails."""


class DecoderRefusedError(TrainfeedError, ValueError):
    """A decoder refused a request (over a bound, an option it cannot run, a dataset it cannot
    read): asking another decoder would get the same answer. The message gives the reason."""
