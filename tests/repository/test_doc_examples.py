"""Every complete Python example in README.md and docs/*.md runs as written (issue 21, item 6).

A fenced ```python block is a complete program: its imports, its data and its
calls, run as is with ``sys.executable`` from the repository root on the CPU.
A block meant for pasting into one's own code is marked as a fragment, either
in its fence (```python fragment) or by a first line ``# fragment``, and is
not run. So an unmarked block that does not run fails here.

The blocks of one file run in one subprocess (the imports are paid once), each
in a fresh namespace, so no block uses names another one defined.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
from typing import NamedTuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT = "fragment"
TIMEOUT_S = 300  # per file; the examples take seconds on a quiet machine
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)$")

# Runs each block (read as JSON from stdin) in a fresh namespace, named file:line in tracebacks.
RUNNER = """
import json, sys
for name, source in json.load(sys.stdin):
  print(f"--- {name}", flush=True)
  exec(compile(source, name, "exec"), {"__name__": "__main__"})
"""


class Block(NamedTuple):
  """One fenced code block: where it starts (file:line of its first code line), its fence info and its code."""

  name: str
  info: str
  source: str

  @property
  def is_python(self) -> bool:
    return self.info.split()[:1] in (["python"], ["py"])

  @property
  def is_fragment(self) -> bool:
    first_line = self.source.lstrip().split("\n", 1)[0].strip()
    return FRAGMENT in self.info.split()[1:] or first_line == f"# {FRAGMENT}"


def code_blocks(path: pathlib.Path) -> list[Block]:
  """The fenced blocks of a markdown file, dedented by their fence's indentation (a block in a list item)."""
  blocks, lines, opened = [], path.read_text().splitlines(), None
  for number, line in enumerate(lines, start=1):
    fence = FENCE.match(line)
    if fence is None:
      continue
    if opened is None:
      opened = (number, fence["info"].strip())
    elif not fence["info"].strip():
      start, info = opened
      source = textwrap.dedent("\n".join(lines[start : number - 1])) + "\n"
      blocks.append(Block(f"{path.relative_to(ROOT)}:{start + 1}", info, source))
      opened = None
  assert opened is None, f"{path.relative_to(ROOT)}:{opened[0]}: a code fence is never closed"
  return blocks


def complete_examples(path: pathlib.Path) -> list[Block]:
  return [block for block in code_blocks(path) if block.is_python and not block.is_fragment]


def test_the_examples_are_found_and_fragments_are_marked():
  readme = code_blocks(ROOT / "README.md")
  assert len(complete_examples(ROOT / "README.md")) >= 3  # the transforms, delayed and the engine
  assert any("engine.Engine(loss_fn" in block.source for block in complete_examples(ROOT / "README.md"))
  assert complete_examples(ROOT / "docs" / "own_loop.md")
  assert all(block.is_python for block in readme if "import " in block.source)  # no unlabelled Python blocks
  marked = Block("x", "python fragment", "x = 1\n"), Block("x", "python", "# fragment\nx = 1\n")
  assert all(block.is_fragment for block in marked) and not Block("x", "python", "x = 1\n").is_fragment


@pytest.mark.slow
@pytest.mark.parametrize(
  "path", [path for path in DOCUMENTS if complete_examples(path)], ids=lambda path: str(path.relative_to(ROOT))
)
def test_every_complete_example_runs_as_written(path):

  blocks = complete_examples(path)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  completed = subprocess.run(
    [sys.executable, "-c", RUNNER],
    input=json.dumps([[block.name, block.source] for block in blocks]),
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=TIMEOUT_S,
  )
  ran = re.findall(r"^--- (\S+)$", completed.stdout, re.M)
  assert completed.returncode == 0, (
    f"{ran[-1] if ran else path.name} failed (mark a block meant for pasting as ```python {FRAGMENT}):\n"
    f"{completed.stdout[-2000:]}\n{completed.stderr[-4000:]}"
  )
  assert ran == [block.name for block in blocks]
