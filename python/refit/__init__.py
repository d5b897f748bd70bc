"""refit: delta-compressed, bit-exact weight sync between RL trainers and inference engines.

A trainer publishes its weights after each optimizer step; an inference worker attaches its own
parameters and applies each version into them in place::

    sender = refit.Sender("refit.toml")                     # trainer rank 0 of 1
    stats = sender.publish(model.state_dict())              # a full sync, then deltas

    receiver = refit.Receiver("refit.toml")                 # inference worker
    receiver.attach(model.named_parameters())               # refit writes into these tensors
    stats = receiver.poll()                                 # None: no new version yet

Tensors are torch tensors (through DLPack, zero copy; CUDA ones staged through host memory),
numpy arrays or anything with __dlpack__; they must be contiguous. Every call into refit releases
the GIL. Errors are refit.Error subclasses carrying refit's message. docs/python.md has more.
"""

import os

from . import _refit, _tensors
from ._errors import (
    AlreadyExistsError,
    ConfigError,
    CorruptError,
    Error,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TimeoutError,
    TransportError,
    UnsupportedError,
    VersionMismatchError,
)
from ._refit import Ack, ApplyStats, Config, DiffStats, SyncStats

__all__ = [
    "Ack", "AlreadyExistsError", "ApplyStats", "Config", "ConfigError", "CorruptError",
    "DiffStats", "Error", "InternalError", "InvalidArgumentError", "NotFoundError", "Receiver",
    "Sender", "SyncStats", "TimeoutError", "TransportError", "UnsupportedError",
    "VersionMismatchError", "apply", "diff", "load_config", "model_digest",
]

def load_config(config):
    """A refit.Config from a Config, a path, or TOML text.

    The rule: a Config is used as is; an os.PathLike is a path; a str is TOML text when it
    contains a newline, otherwise a path (so a mistyped path reports "no such file", not a TOML
    syntax error). Raises ConfigError.
    """
    if isinstance(config, Config):
        return config
    if isinstance(config, os.PathLike):
        return Config.from_file(os.fspath(config))
    if isinstance(config, str):
        return Config.from_string(config) if "\n" in config else Config.from_file(config)
    raise ConfigError(
        f"a {type(config).__name__} is not a config (refit.Config, a path or TOML text)"
    )


class Sender:
    """One trainer rank's sender: diffs its weights against its baseline and publishes versions.

    Reads [sender], [transport], [encoding.*] and [layout] of the config (docs/config.md). Use
    one Sender from one thread at a time (calls from several threads are serialized).
    """

    def __init__(self, config, rank=0, world=1):
        self.config = load_config(config)
        self._core = _refit._Sender(self.config, rank, world)

    def publish(self, named_tensors):
        """Publishes the next version of this rank's weights and returns its SyncStats.

        named_tensors: a dict name -> tensor (state_dict()) or an iterable of (name, tensor)
        pairs (named_parameters()), every version the same names, dtypes and shapes. First waits
        for every configured receiver to acknowledge the previous version (up to
        sender.ack_timeout_s, else TimeoutError), then diffs, encodes and sends. The tensors must
        not change while this runs; the GIL is released meanwhile.
        """
        staged = _tensors.StagedTensors(named_tensors)
        return self._core.publish(staged.entries)

    def wait(self, timeout=None):
        """Waits until every receiver acknowledged the published version, then advances the
        baseline. timeout: seconds (None: the config's sender.ack_timeout_s). TimeoutError when
        it runs out."""
        if timeout is None:
            timeout = float(self.config.get("sender.ack_timeout_s") or 600)
        self._core.wait(float(timeout))

    def metrics(self):
        """This rank's counters in the Prometheus text format 0.0.4 (docs/serve.md): versions
        published, payload bytes, density, seconds per stage, failures by kind, full syncs. With
        sender.metrics_file set, the same text is written to that file after every publish."""
        return self._core.metrics()

    @property
    def published_version(self):
        """The last version this sender published (0: none yet)."""
        return self._core.published_version

    @property
    def baseline_version(self):
        """The version the next delta is taken against (acknowledged by every receiver)."""
        return self._core.baseline_version

    @property
    def acks(self):
        """The receivers' acknowledgements of the published version (after wait())."""
        return self._core.acks


class Receiver:
    """An inference worker's receiver: applies each committed version, verified, into the
    tensors it is attached to (or into its model file in receiver.state_dir when not attached).

    Reads [receiver], [transport] and [encoding.*] of the config (docs/config.md).
    """

    def __init__(self, config):
        self.config = load_config(config)
        self._core = _refit._Receiver(self.config)
        self._staged = None

    def attach(self, named_tensors, loaded_version=None):
        """Binds the receiver to these tensors: from now on every version is written into their
        own memory (a full sync copied in, a delta applied in place, every digest verified).

        Each name must be one of the receiver's tensors, with its dtype and shape; tensors must
        be contiguous, writable, and stay alive (refit keeps a reference). loaded_version: the
        version the tensors already hold (e.g. loaded from a checkpoint after a restart); taken
        only if it is the receiver's committed version and the bits match, otherwise the receiver
        asks for a full sync. CUDA tensors are applied into host copies that poll() writes back.
        """
        staged = _tensors.StagedTensors(named_tensors, pin=True)
        self._core.attach(staged.entries, loaded_version)
        self._staged = staged

    def poll(self):
        """Applies the next committed version if there is one: its ApplyStats, or None.

        VersionMismatchError: the version was a delta on a base this receiver does not hold; it
        asked for a full sync, which a later poll applies. TransportError and CorruptError are
        worth retrying. The GIL is released while refit works.
        """
        stats = self._core.poll()
        if stats is not None and self._staged is not None:
            self._staged.copy_back()
        return stats

    def wait(self, timeout=1.0):
        """Blocks until something may have arrived from the sender, or `timeout` seconds pass:
        True when woken by an arrival (over ucx at once when a commit lands; poll() then), False
        at the timeout. A transport that cannot wake a receiver (disk, s3) just sleeps. Use it
        between polls instead of a sleep; the GIL is released while it waits.
        """
        return self._core.wait(float(timeout))

    @property
    def version(self):
        """The committed version the receiver holds (0: none)."""
        return self._core.version

    @property
    def applying(self):
        """Nonzero while the model holds part of that version (an apply was interrupted)."""
        return self._core.applying

    @property
    def model_path(self):
        """The receiver's model file (when not attached)."""
        return self._core.model_path


def _optional_config(config):
    return None if config is None else load_config(config)


def diff(base, new, out, encoding="auto", config=None):
    """Writes a delta file `out` taking safetensors checkpoint `base` to `new`; its DiffStats.

    encoding: a registered encoding or "auto" (per record the smallest). config: optional, for
    [encoding.*] options and [plugins]. The GIL is released while it runs.
    """
    return _refit.diff(
        os.fspath(base), os.fspath(new), os.fspath(out), encoding, _optional_config(config)
    )


def apply(base, delta, out, config=None):
    """Applies delta file `delta` onto checkpoint `base` and writes `out` atomically; ApplyStats.

    VersionMismatchError when `base` is not the delta's base, CorruptError when the delta is
    damaged; `out` is untouched on any error. The GIL is released while it runs.
    """
    return _refit.apply(os.fspath(base), os.fspath(delta), os.fspath(out), _optional_config(config))


def model_digest(named_tensors):
    """refit's digest of named tensors (names, dtypes, shapes and bits; order-independent)."""
    staged = _tensors.StagedTensors(named_tensors)
    return _refit.model_digest(staged.entries)
