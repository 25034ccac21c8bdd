"""Where an external data location may lead: the rule that resolves one, or refuses it with one line.

A model's external data is named by the model, which is untrusted: a location could name any file
the user can read (``../../.ssh/id_rsa``), and the conversion would copy its bytes into the output
model the user then shares. The model file itself is the user's choice and is read wherever its
path leads (a symlink into a cache); only the locations the model names are confined:

- A location must be a plain relative path: not absolute (POSIX, Windows drive or UNC), no ``..``
  part, no NUL. Refused without touching the file system.
- The location naming the model file itself (the model's own bytes: how the large weights left
  inside a model file are described, :mod:`amp_compiler.onnx.load.inline_weights`) is the model file,
  wherever its path leads.
- Any other location, with every symlink resolved, must lie inside the model's folder, or inside the
  ``blobs/`` folder of the Hugging Face cache entry the model's folder is a snapshot of. The *cache
  entry* is the folder that holds ``blobs/`` and ``snapshots/`` (``models--org--name``), the model's
  folder being ``snapshots/<revision>/`` or a folder under it, and ``blobs/`` a real folder (not a
  symlink). huggingface_hub stores every file of a snapshot as a relative link into that entry's
  ``blobs/`` (named by the file's hash): exactly the links this admits, and no other. A link that
  leaves the model's folder for anywhere else (another entry, ``refs/``, the home folder), or whose
  blob is itself a link leaving ``blobs/``, stays refused: an entry downloaded from an untrusted
  repository can hold only the files it was served, never a link out of the cache.
- The resolved file must then be a regular file (:func:`amp_compiler.onnx.load.external_data.plan_external_reads`
  checks that): devices, FIFOs and folders are refused.

Other layouts of links (git-annex, DVC, Bazel runfiles, a folder of links made by hand) point
anywhere, often by absolute paths, and nothing tells a link the user made from one a download made:
their external data must be copied (or hard-linked) into the model's folder.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load.text import quote

__all__ = ["hub_blobs", "names_itself", "resolve_location"]

__all__ = ["hub_blobs", "names_itself", "resolve_location"]


def names_itself(location: str, base: Path, itself: Path | None) -> bool:
    """Whether ``location`` (relative to ``base``) names the model file ``itself``, by its own name
    in its own folder."""
    return itself is not None and location == itself.name and Path(base) == itself.parent


def hub_blobs(folder: Path) -> Path | None:
    """The ``blobs/`` folder of the Hugging Face cache entry whose snapshot holds ``folder`` (a
    resolved path), or None (see the module doc)."""
    for snapshot in (folder, *folder.parents):
        entry = snapshot.parent.parent
        if snapshot.parent.name != "snapshots" or entry == snapshot.parent:
            continue
        blobs = entry / "blobs"
        if blobs.is_dir() and not blobs.is_symlink():
            return blobs
        return None
    return None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def resolve_location(location: str, base: Path, where: str, itself: Path | None = None) -> Path:
    """The file an external data ``location`` names (relative to ``base``, the model's folder), every
    link resolved; refused with a :class:`ModelLoadError` unless the module doc's rule admits it.
    ``itself``: the model file (as its path was given)."""
    if not location:
        raise ModelLoadError(f"{where}: stored as external data but names no location")
    if "\x00" in location:
        raise ModelLoadError(f"{where}: external data location {quote(location)} contains a NUL character")
    posix, windows = PurePosixPath(location), PureWindowsPath(location)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or location.startswith(("/", "\\")):
        raise ModelLoadError(
            f"{where}: external data location {quote(location)} is an absolute path; refused "
            "(external data must lie in the model's folder)"
        )
    if ".." in posix.parts or ".." in windows.parts:
        raise ModelLoadError(
            f"{where}: external data location {quote(location)} escapes the model's folder ('..'); refused"
        )
    if itself is not None and names_itself(location, base, itself):
        return Path(os.path.realpath(itself))
    root = Path(os.path.realpath(base))
    target = Path(os.path.realpath(root / location))
    if _inside(target, root):
        return target
    blobs = hub_blobs(root)
    if blobs is not None and _inside(target, blobs) and target != blobs:
        return target
    where_to = "the model's folder" + (" and its Hugging Face cache entry's blobs/" if blobs is not None else "")
    raise ModelLoadError(
        f"{where}: external data location {quote(location)} resolves (through a symlink) outside {where_to}; "
        "refused (copy the file into the model's folder)"
    )
