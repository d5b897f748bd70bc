"""Type stubs of the _refit extension (the C++ core; use the `refit` package)."""

from typing import Any, Optional, Sequence, Tuple, Union

# (name, exporter, dtype): made by refit._tensors from a torch tensor, numpy array or DLPack object.
Entry = Tuple[str, Any, Optional[str]]
ConfigValue = Union[bool, int, float, str, Sequence[str]]

class Config:
    """A refit TOML config (docs/config.md has every key)."""

    @staticmethod
    def from_file(path: str) -> Config:
        """Parses a TOML file; errors (ConfigError) name file:line and key."""
    @staticmethod
    def from_string(text: str, label: str = "<string>") -> Config:
        """Parses TOML text; `label` stands for the file name in messages."""
    def set(self, key: str, value: ConfigValue) -> None:
        """Overrides a dotted key, e.g. set("sender.state_dir", "/tmp/s")."""
    def get(self, key: str) -> Optional[ConfigValue]:
        """The value of a dotted key, or None if unset."""
    def keys(self) -> list[str]: ...
    @property
    def label(self) -> str: ...
    def __contains__(self, key: str) -> bool: ...

class SyncStats:
    """What one Sender.publish did (this rank's part)."""

    version: int
    base_version: Optional[int]  # None for a full sync
    full: bool
    tensors: int
    payload_bytes: int  # bytes that crossed the transport
    payloads: int
    wait_seconds: float  # waiting for the previous version's acks and the baseline advance
    diff_seconds: float
    encode_seconds: float  # CPU seconds over all encoding threads
    send_seconds: float
    seconds: float  # wall seconds of the publish
    dense_fraction: float  # payload_bytes / one dense copy of the published tensors
    density: float  # fraction of the elements whose bits changed
    changed_elements: int
    total_elements: int
    changed_bytes: int
    model_bytes: int
    records: int

class ApplyStats:
    """What one Receiver.poll or refit.apply applied."""

    version: int
    full: bool
    payloads: int
    payload_bytes: int
    resumed: bool  # an interrupted apply was resumed
    fetch_seconds: float
    apply_seconds: float  # decode + apply + digest verification
    seconds: float  # wall seconds of the apply
    changed_elements: int
    changed_bytes: int
    records: int

class DiffStats:
    """What refit.diff wrote."""

    tensors: int
    delta_bytes: int
    dense_fraction: float  # delta_bytes / one dense copy of the new checkpoint's tensors
    density: float
    changed_elements: int
    total_elements: int
    changed_bytes: int
    model_bytes: int
    records: int

class Ack:
    """A receiver's acknowledgement of a version."""

    receiver: str
    version: int
    apply_seconds: float
    applied_records: int

class _Sender:
    def __init__(self, config: Config, rank: int, world: int) -> None: ...
    def publish(self, entries: list[Entry]) -> SyncStats: ...
    def wait(self, timeout: float) -> None: ...
    def metrics(self) -> str: ...
    @property
    def baseline_version(self) -> int: ...
    @property
    def published_version(self) -> int: ...
    @property
    def acks(self) -> list[Ack]: ...

class _Receiver:
    def __init__(self, config: Config) -> None: ...
    def attach(self, entries: list[Entry], loaded_version: Optional[int]) -> None: ...
    def poll(self) -> Optional[ApplyStats]: ...
    def wait(self, timeout: float) -> bool: ...
    @property
    def version(self) -> int: ...
    @property
    def applying(self) -> int: ...
    @property
    def model_path(self) -> str: ...

def diff(base: str, new: str, out: str, encoding: str, config: Optional[Config]) -> DiffStats: ...
def apply(base: str, delta: str, out: str, config: Optional[Config]) -> ApplyStats: ...
def model_digest(entries: list[Entry]) -> int: ...
