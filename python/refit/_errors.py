"""refit's exceptions: one class per refit::StatusCode, all subclasses of refit.Error.

str(error) is refit's own message (it names the file, key, tensor or version at fault) and
error.code is refit's name of the status code ("corrupt", "version mismatch", ...).
"""

import builtins


class Error(Exception):
    """Base class of every error refit raises."""

    code = "unknown"


class ConfigError(Error, ValueError):
    """A config that is invalid or missing (raised while making a Config, Sender or Receiver)."""

    code = "invalid argument"


class InvalidArgumentError(Error, ValueError):
    """Something passed in is malformed: a tensor refit cannot take, a name or shape that does
    not match, a bad value."""

    code = "invalid argument"


class NotFoundError(Error, LookupError):
    """A file, tensor, plugin or key does not exist."""

    code = "not found"


class TransportError(Error, OSError):
    """The OS or the transport refused a read, write, fsync or rename (retrying may help)."""

    code = "io error"


class CorruptError(Error):
    """Bytes failed validation: truncated, a bad checksum or digest (retrying may help)."""

    code = "corrupt"


class UnsupportedError(Error):
    """Valid but not supported here (a dtype, a device, an ABI version)."""

    code = "unsupported"


class VersionMismatchError(Error):
    """A delta's base is not what the receiver holds; the receiver asked for a full sync, and a
    later poll applies it."""

    code = "version mismatch"


class AlreadyExistsError(Error):
    """A duplicate name or an already published version."""

    code = "already exists"


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 (refit.TimeoutError by design)
    """Waited for acknowledgements or commits longer than allowed."""

    code = "timeout"


class InternalError(Error, RuntimeError):
    """A bug in refit or a plugin that broke its contract."""

    code = "internal"


# refit::StatusCode values (framework/include/refit/status.h; they never change).
_BY_CODE = {
    1: InvalidArgumentError,
    2: NotFoundError,
    3: TransportError,
    4: CorruptError,
    5: UnsupportedError,
    6: VersionMismatchError,
    7: AlreadyExistsError,
    8: TimeoutError,
    9: InternalError,
}


def from_status(code, message, config_stage=False):
    """The exception for a refit::Status (called by the extension's exception translator)."""
    cls = _BY_CODE.get(code, InternalError)
    if config_stage and cls in (InvalidArgumentError, NotFoundError):
        cls = ConfigError
    error = cls(message)
    error.code = _CODE_NAMES.get(code, "unknown")
    return error


_CODE_NAMES = {code: cls.code for code, cls in _BY_CODE.items()}
