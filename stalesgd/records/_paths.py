"""Where a run keeps its files: a local folder or a ``gs://`` URL, through `etils.epath`.

Every file a run writes or reads (``config.json``, ``metrics.jsonl``, TensorBoard
events, ``schedule.npz``, plots, ``summary.json``) goes through `workdir_path`;
orbax and tensorstore write the checkpoints under the same path. Which workdirs
work:

* a local path, relative or absolute;
* ``gs://bucket/path`` with the ``gcs`` extra (``pip install 'stalesgd[gcs]'``:
  gcsfs and google-cloud-storage). `etils.epath` reads and writes through gcsfs
  (or TensorFlow's gfile where TensorFlow is installed), tensorboardX uploads
  its event files with google-cloud-storage, and tensorstore's own GCS driver
  writes the checkpoint arrays.

Refused by `check_workdir`, before anything starts:

* ``gs://`` without those packages, naming what to install;
* ``s3://``, ``az://`` and ``hf://``. epath could write the small files there,
  but orbax-checkpoint 0.12 sends checkpoint arrays to tensorstore's remote
  drivers only for ``gs://``: for any other URL it raises "Checkpoint path
  should be absolute" at the first save, after the data set has loaded and the
  step has compiled. A run that cannot checkpoint is refused rather than started;
* any other scheme (``http://``, a typo such as ``gs:/bucket``).

Object stores rename by copying and cannot append, so on a URL a whole file is
written in one upload (`write_whole`): a reader sees the old object or the new
one, never a part. The README's "What survives what" says which guarantees
hold on a URL workdir and which were tested.
"""

from __future__ import annotations

import importlib.util
import os
import re

from etils import epath

# Scheme -> the modules a URL workdir of that scheme needs, each with the package that provides it.
SUPPORTED_URL_SCHEMES = {
  "gs": (("gcsfs", "gcsfs"), ("google.cloud.storage", "google-cloud-storage")),
}
# Schemes epath knows but a run cannot checkpoint to (see the module docstring).
UNSUPPORTED_URL_SCHEMES = ("s3", "az", "hf")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")


def url_scheme(workdir: str | os.PathLike[str]) -> str | None:
  """``"gs"`` for ``gs://bucket/run``; None for a local path (``C:\\runs`` has no ``:/`` after one letter)."""
  match = _SCHEME.match(os.fspath(workdir))
  if match is None or len(match.group(1)) == 1:
    return None
  return match.group(1).lower()


def is_url(workdir: str | os.PathLike[str]) -> bool:
  """Whether ``workdir`` names an object-store URL rather than a local path."""
  return url_scheme(workdir) is not None


def _module_missing(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is None
  except ModuleNotFoundError:  # a missing parent package (google.cloud)
    return True


def check_workdir(workdir: str | os.PathLike[str], *, field: str = "--workdir") -> None:
  """Raises ValueError, naming ``field``, unless a run can keep its files in ``workdir``.

  A local path always passes (it is created at the first write). A URL passes
  when its scheme is supported and its packages are installed.
  """
  text = os.fspath(workdir)
  scheme = url_scheme(text)
  if scheme is None:
    if not text:
      raise ValueError(f"{field} is empty; allowed: a local path or gs://bucket/path")
    return
  supported = ", ".join(f"{name}://" for name in SUPPORTED_URL_SCHEMES)
  if scheme in UNSUPPORTED_URL_SCHEMES:
    raise ValueError(
      f"{field} = {text!r}: orbax-checkpoint writes checkpoint arrays only to local paths and gs://, so a run "
      f"cannot checkpoint to {scheme}://; allowed: a local path or {supported} (or mount the bucket, e.g. "
      "with a FUSE driver, and give its local path)"
    )
  if scheme not in SUPPORTED_URL_SCHEMES or not text.startswith(f"{scheme}://") or len(text) <= len(scheme) + 3:
    raise ValueError(f"{field} = {text!r}; allowed: a local path or {supported}bucket/path")
  missing = [package for module, package in SUPPORTED_URL_SCHEMES[scheme] if _module_missing(module)]
  if scheme == "gs" and "gcsfs" in missing and not _module_missing("tensorflow"):
    missing.remove("gcsfs")  # epath reads gs:// through TensorFlow's gfile where TensorFlow is installed
  if missing:
    raise ValueError(
      f"{field} = {text!r} needs {' and '.join(missing)}, which this environment lacks; install them with "
      f"`pip install 'stalesgd[{scheme}]'` (or `pip install {' '.join(missing)}`)"
    )


def workdir_path(workdir: str | os.PathLike[str], *, field: str = "--workdir") -> epath.Path:
  """``workdir`` as an `epath.Path` (local or URL), after `check_workdir`."""
  check_workdir(workdir, field=field)
  return epath.Path(workdir)


def write_whole(path: epath.Path, data: str | bytes) -> None:
  """Writes ``path`` so that a reader sees its old content or the new one, never a part.

  Locally: a temporary file beside it, flushed to disk, then renamed over it
  (`os.replace` is atomic on POSIX). On a URL: one upload, which object stores
  make visible whole (they have no atomic rename to use instead).
  """
  data = data.encode("utf-8") if isinstance(data, str) else data
  if is_url(path):
    path.write_bytes(data)
    return
  temporary = os.fspath(path) + f".tmp.{os.getpid()}"
  with open(temporary, "wb") as file:
    file.write(data)
    file.flush()
    os.fsync(file.fileno())
  os.replace(temporary, os.fspath(path))
