"""ImageNet (ILSVRC-2012) from a folder tree of JPEGs: ``train/<wnid>/*.JPEG`` and ``val/<wnid>/*.JPEG``.

That is the tree most copies of ImageNet are kept in (the training archive
unpacks to one folder per WordNet id; the usual ``valprep.sh`` sorts the
validation images the same way). The class of an image is its folder's name,
which must be one of the 1,000 WordNet ids of tfds's ``imagenet2012`` labels
(``n01440764`` ...), so label numbers agree with any other tfds preparation. A
validation folder left flat, as the validation archive unpacks
(``ILSVRC2012_val_00000001.JPEG`` ...), is labelled from the validation label
list shipped with tfds.

Images are stored as JPEG bytes, untouched when they are JPEG in RGB or
grayscale; anything else (CMYK JPEGs, PNGs named ``.JPEG``: a few in the
training set) is re-encoded as RGB JPEG (quality `REENCODE_QUALITY`), as tfds's
own builder does. Files are listed once, sorted by class folder then file name,
and read a few hundred ahead of tfds's writer on several threads, so memory
stays flat.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

from PIL import Image

from stalesgd.data.preparation._layouts import MissingInputError, check_directory
from stalesgd.data.preparation._tfds_writer import SplitExamples, ordered_map

NAME = "imagenet2012"
# tfds split -> accepted folder names under --from.
SPLIT_FOLDERS = {"train": ("train",), "validation": ("val", "validation")}
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
REENCODE_QUALITY = 95
_FLAT_VALIDATION_NAME = re.compile(r"ILSVRC2012_val_(\d{8})\.jpe?g", re.IGNORECASE)
# Inside the tensorflow_datasets package: one WordNet id per line, for validation images 1..50,000.
_VALIDATION_LABELS_FILE = "datasets/imagenet2012/validation_labels.txt"


@dataclasses.dataclass(frozen=True)
class ImageFile:
  """One image of the tree: its path and class number."""

  path: str
  label: int


def _is_image(entry: os.DirEntry) -> bool:
  return entry.is_file() and not entry.name.startswith(".") and entry.name.lower().endswith(IMAGE_EXTENSIONS)


def _validation_labels() -> list[str]:
  import tensorflow_datasets as tfds

  path = tfds.core.tfds_path(_VALIDATION_LABELS_FILE)
  if not path.exists():
    raise MissingInputError(
      f"tensorflow_datasets {tfds.__version__} lacks {_VALIDATION_LABELS_FILE}, needed to "
      "label a flat validation folder: sort val/ into one folder per WordNet id instead"
    )
  return path.read_text().split()


def _flat_validation(split_dir: str, images: Sequence[os.DirEntry], label_numbers: dict[str, int]) -> list[ImageFile]:
  labels = _validation_labels()
  files = []
  for entry in images:
    match = _FLAT_VALIDATION_NAME.fullmatch(entry.name)
    if match is None or not 1 <= int(match.group(1)) <= len(labels):
      raise ValueError(
        f"{os.path.join(split_dir, entry.name)}: a flat validation folder must hold "
        f"ILSVRC2012_val_00000001.JPEG .. ILSVRC2012_val_{len(labels):08d}.JPEG (labelled from "
        "tfds's validation label list); otherwise put each image in its class's folder"
      )
    files.append(ImageFile(entry.path, label_numbers[labels[int(match.group(1)) - 1]]))
  return files


def list_split(split_dir: str, label_names: Sequence[str], *, flat_validation: bool = False) -> list[ImageFile]:
  """The images of one split folder, sorted by class folder and file name.

  Args:
    split_dir: ``train/`` or ``val/``: one sub-folder per WordNet id, or (for
      the validation split only) the validation images themselves.
    label_names: the WordNet ids in label order (tfds ``imagenet2012``'s).
    flat_validation: accept ILSVRC-2012 validation images without class
      folders (labelled from tfds's validation label list).

  Raises:
    ValueError: a class folder is not a known WordNet id, or images lie beside
      class folders.
    MissingInputError: the folder holds no images.
  """
  label_numbers = {name: number for number, name in enumerate(label_names)}
  entries = sorted(os.scandir(split_dir), key=lambda entry: entry.name)
  folders = [entry for entry in entries if entry.is_dir() and not entry.name.startswith(".")]
  loose = [entry for entry in entries if _is_image(entry)]
  if loose and not folders and flat_validation:
    return _flat_validation(split_dir, loose, label_numbers)
  if loose:
    raise ValueError(
      f"{split_dir} holds images ({loose[0].name}, ...) beside its class folders: each image must "
      "lie in the folder of its class (a WordNet id such as n01440764)"
    )
  unknown = [entry.name for entry in folders if entry.name not in label_numbers]
  if unknown:
    raise ValueError(
      f"{split_dir}: class folder(s) {unknown[:5]}{' ...' if len(unknown) > 5 else ''} are not "
      f"ImageNet WordNet ids; allowed are the {len(label_names)} ids of tfds imagenet2012, e.g. "
      f"{', '.join(label_names[:3])} ... {label_names[-1]}"
    )
  files = [
    ImageFile(image.path, label_numbers[folder.name])
    for folder in folders
    for image in sorted(os.scandir(folder.path), key=lambda entry: entry.name)
    if _is_image(image)
  ]
  if not files:
    raise MissingInputError(f"{split_dir} holds no images ({'/'.join(IMAGE_EXTENSIONS)} files in class folders)")
  return files


def read_splits(from_dir: str, label_names: Sequence[str]) -> tuple[str, dict[str, list[ImageFile]]]:
  """(what was read, {"train": files, "validation": files}) of the tree under ``from_dir``.

  Raises:
    MissingInputError: ``from_dir`` lacks ``train/`` or ``val/`` (``validation/``),
      or one of them holds no images.
    ValueError: see `list_split`.
  """
  check_directory(from_dir)
  split_dirs = {}
  for split, folder_names in SPLIT_FOLDERS.items():  # Both found before listing (minutes for ImageNet).
    split_dir = next(
      (os.path.join(from_dir, name) for name in folder_names if os.path.isdir(os.path.join(from_dir, name))), None
    )
    if split_dir is None:
      folders = " or ".join(f"{name}/" for name in folder_names)
      raise MissingInputError(
        f"{NAME}: {from_dir} lacks the {split} folder {folders} (expected "
        f"{from_dir}/train/<wnid>/*.JPEG and {from_dir}/val/<wnid>/*.JPEG)"
      )
    split_dirs[split] = split_dir
  splits = {
    split: list_split(split_dir, label_names, flat_validation=split == "validation")
    for split, split_dir in split_dirs.items()
  }
  return f"ImageNet folder tree in {from_dir}", splits


def encoded_jpeg(path: str) -> bytes:
  """The file's bytes if it is an RGB or grayscale JPEG, else the image re-encoded as RGB JPEG."""
  with open(path, "rb") as file:
    data = file.read()
  with Image.open(io.BytesIO(data)) as picture:
    if picture.format == "JPEG" and picture.mode in ("RGB", "L"):
      return data
    buffer = io.BytesIO()
    picture.convert("RGB").save(buffer, format="JPEG", quality=REENCODE_QUALITY)
  return buffer.getvalue()


def file_examples(files: Sequence[ImageFile]) -> SplitExamples:
  """tfds ``imagenet2012`` examples (``image`` JPEG bytes, ``label``, ``file_name``) of ``files``."""

  def generate() -> Iterator[dict[str, Any]]:
    for image, data in zip(files, ordered_map(encoded_jpeg, [image.path for image in files])):
      yield {"image": data, "label": image.label, "file_name": os.path.basename(image.path)}

  return SplitExamples(generate(), len(files))
