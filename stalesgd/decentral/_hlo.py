"""Reading compiled XLA programs: which inputs a collective depends on, and whether it overlapped.

DC-S3GD's speed rests on one property of the compiled step: the all-reduce of
the carried update must not depend on the step's forward/backward, so that a
latency-hiding scheduler can run them concurrently. This module checks that on
the text of a compiled program (``jitted.lower(...).compile().as_text()``):
it parses the entry computation into instructions, walks operand edges back to
the entry parameters, and reports for every all-reduce which parameters it
reads; on a scheduled module it also says whether compute was placed between an
asynchronous all-reduce's start and done.

Assumptions about the text (true of XLA's HLO printer in jaxlib 0.10.x):

* One instruction per line, ``[ROOT] %name = <shape> <opcode>(<operands>), <attributes>``;
  shapes may be tuples ``(f32[2]{0}, s32[])``.
* Computations start with a header line ending in ``{`` and end with a line
  ``}``; the entry computation's header starts with ``ENTRY``.
* Data dependencies are the ``%name`` tokens inside the operand parentheses
  that name instructions of the same computation. Called computations
  (``calls=``, ``to_apply=``, ``body=``) are not entered: a fusion or call is
  treated as depending on all its operands, which over-approximates
  dependencies (safe for proving independence). ``control-predecessors`` are
  ordering, not data, and are ignored.
* Collectives of interest live in the entry computation: ``all-reduce``
  (synchronous, e.g. on CPU), ``all-reduce-start``/``all-reduce-done``
  (asynchronous, e.g. on GPU), or a generic ``async-start``/``async-done`` pair
  whose ``calls=`` computation holds the all-reduce. An all-reduce placed inside
  a ``while`` body or another called computation is not found, nor one that XLA
  decomposed into reduce-scatter and all-gather.
* In a scheduled module (``is_scheduled=true``) the entry's instruction order
  is the execution order.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_OPERAND_NAME = re.compile(r"%([\w.\-]+)")
_PARAMETER_NUMBER = re.compile(r"^parameter\((\d+)\)")
_CALLS = re.compile(r"\bcalls=%([\w.\-]+)")
_MATRIX_LIBRARY_CALL = re.compile(r'custom_call_target="[^"]*(gemm|matmul|conv)', re.IGNORECASE)
_COMPUTATION_HEADER = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")

ALL_REDUCE_OPCODES = ("all-reduce", "all-reduce-start")
# Opcodes that do arithmetic work worth overlapping a collective with.
COMPUTE_OPCODES = (
  "fusion",
  "convolution",
  "dot",
  "custom-call",
  "reduce",
  "reduce-window",
  "select-and-scatter",
  "sort",
  "scatter",
  "gather",
  "while",
  "call",
)


@dataclasses.dataclass(frozen=True)
class Instruction:
  """One HLO instruction of a computation.

  Attributes:
    name: the instruction's name without ``%``.
    opcode: e.g. ``"fusion"``, ``"all-reduce"``, ``"parameter"``.
    operands: names of the instructions it reads, in order.
    parameter_number: for ``parameter`` instructions, their position in the
      computation's signature; otherwise None.
    called: the computation named by ``calls=`` (fusions, async wrappers), or None.
    text: the full line, for error messages.
  """

  name: str
  opcode: str
  operands: tuple[str, ...]
  parameter_number: int | None
  called: str | None
  text: str


def _split_shape(right_hand_side: str) -> str:
  """Drops the leading result shape, returning ``opcode(...)...``."""
  if right_hand_side.startswith("("):
    depth = 0
    for index, char in enumerate(right_hand_side):
      depth += char == "("
      depth -= char == ")"
      if depth == 0:
        return right_hand_side[index + 1 :].lstrip()
    raise ValueError(f"unbalanced tuple shape in HLO line: {right_hand_side!r}")
  return right_hand_side.split(" ", 1)[1].lstrip() if " " in right_hand_side else ""


def _operand_text(after_opcode: str) -> str:
  """The text inside the opcode's parentheses (balanced)."""
  depth = 0
  for index, char in enumerate(after_opcode):
    depth += char == "("
    depth -= char == ")"
    if depth == 0:
      return after_opcode[1:index]
  raise ValueError(f"unbalanced operand list in HLO text: {after_opcode!r}")


def parse_instruction(line: str) -> Instruction | None:
  """Parses one instruction line, or returns None for anything else."""
  match = _INSTRUCTION.match(line)
  if match is None:
    return None
  name, right_hand_side = match.group(2), match.group(3)
  rest = _split_shape(right_hand_side)
  opcode_match = re.match(r"([\w\-]+)\(", rest)
  if opcode_match is None:
    return None
  opcode = opcode_match.group(1)
  operands = tuple(_OPERAND_NAME.findall(_operand_text(rest[len(opcode) :])))
  number = _PARAMETER_NUMBER.match(rest)
  called = _CALLS.search(rest)
  return Instruction(
    name=name,
    opcode=opcode,
    operands=operands,
    parameter_number=int(number.group(1)) if number else None,
    called=called.group(1) if called else None,
    text=line.strip(),
  )


def computation_opcodes(hlo_text: str) -> dict[str, set[str]]:
  """Every computation's name mapped to the opcodes of its instructions."""
  opcodes: dict[str, set[str]] = {}
  current = None
  for line in hlo_text.splitlines():
    header = _COMPUTATION_HEADER.match(line)
    if header is not None:
      current = opcodes.setdefault(header.group(1), set())
    elif line.strip() == "}":
      current = None
    elif current is not None and (instruction := parse_instruction(line)) is not None:
      current.add(instruction.opcode)
  return opcodes


def entry_computation(hlo_text: str) -> list[Instruction]:
  """The instructions of the module's ENTRY computation, in printed (scheduled) order.

  Args:
    hlo_text: an HLO module as printed by ``Compiled.as_text()``.

  Returns:
    The entry computation's instructions; operands are restricted to names
    defined in it.

  Raises:
    ValueError: the text has no ENTRY computation.
  """
  lines = hlo_text.splitlines()
  start = next((index for index, line in enumerate(lines) if line.startswith("ENTRY ")), None)
  if start is None:
    raise ValueError("hlo_text has no ENTRY computation")
  instructions = []
  for line in lines[start + 1 :]:
    if line.strip() == "}":
      break
    instruction = parse_instruction(line)
    if instruction is not None:
      instructions.append(instruction)
  defined = {instruction.name for instruction in instructions}
  return [
    dataclasses.replace(instruction, operands=tuple(name for name in instruction.operands if name in defined))
    for instruction in instructions
  ]


def ancestors(instructions: list[Instruction], name: str) -> set[str]:
  """Every instruction ``name`` transitively reads (excluding itself)."""
  by_name = {instruction.name: instruction for instruction in instructions}
  seen: set[str] = set()
  pending = list(by_name[name].operands)
  while pending:
    current = pending.pop()
    if current in seen:
      continue
    seen.add(current)
    pending.extend(by_name[current].operands)
  return seen


def descendants(instructions: list[Instruction], name: str) -> set[str]:
  """Every instruction that transitively reads ``name`` (excluding itself)."""
  readers: dict[str, list[str]] = {}
  for instruction in instructions:
    for operand in instruction.operands:
      readers.setdefault(operand, []).append(instruction.name)
  seen: set[str] = set()
  pending = list(readers.get(name, ()))
  while pending:
    current = pending.pop()
    if current in seen:
      continue
    seen.add(current)
    pending.extend(readers.get(current, ()))
  return seen


def matrix_work(hlo_text: str) -> list[str]:
  """The entry instructions that multiply matrices: ``dot``, ``convolution``, a library call for one (a
  ``custom-call`` whose target names a gemm, matmul or convolution: cuBLAS, cuDNN, oneDNN), or a fusion or call
  whose computation holds a ``dot`` or ``convolution``. They are a step's forward and backward passes; the
  elementwise work around them is left out."""
  called_opcodes = computation_opcodes(hlo_text)
  matrix = {"dot", "convolution"}
  return [
    instruction.name
    for instruction in entry_computation(hlo_text)
    if instruction.opcode in matrix
    or matrix & called_opcodes.get(instruction.called or "", set())
    or (instruction.opcode == "custom-call" and _MATRIX_LIBRARY_CALL.search(instruction.text))
  ]


@dataclasses.dataclass(frozen=True)
class Independence:
  """How an instruction sits among the program's matrix work (`matrix_work`), as counts.

  Attributes:
    before: matrix work it transitively reads (it cannot start before these end).
    independent: matrix work that neither feeds it nor reads it: what a scheduler may run while it is in flight.
    after: matrix work that reads it.
  """

  before: int
  independent: int
  after: int


def independence(hlo_text: str, name: str) -> Independence:
  """`Independence` of entry instruction ``name`` (e.g. an all-reduce from `all_reduces`)."""
  return independences(hlo_text, [name])[0]


def independences(hlo_text: str, names: Sequence[str]) -> list[Independence]:
  """`independence` of each of ``names``, the text parsed once."""
  instructions = entry_computation(hlo_text)
  work = matrix_work(hlo_text)
  found = []
  for name in names:
    feeds, reads = ancestors(instructions, name), descendants(instructions, name)
    found.append(
      Independence(
        before=sum(item in feeds for item in work),
        independent=sum(item not in feeds and item not in reads and item != name for item in work),
        after=sum(item in reads for item in work),
      )
    )
  return found


def parameter_dependencies(instructions: list[Instruction], name: str) -> set[int]:
  """The entry-parameter numbers that instruction ``name`` transitively reads."""
  by_name = {instruction.name: instruction for instruction in instructions}
  return {
    by_name[ancestor].parameter_number
    for ancestor in ancestors(instructions, name)
    if by_name[ancestor].opcode == "parameter"
  }


@dataclasses.dataclass(frozen=True)
class AllReduce:
  """An all-reduce of the entry computation and what it reads.

  Attributes:
    name: its instruction name (the ``-start`` for an asynchronous one).
    asynchronous: whether it is an ``all-reduce-start``/``-done`` pair.
    parameters: entry-parameter numbers its operands transitively read.
    compute_while_in_flight: for asynchronous ones, the compute instructions
      scheduled between start and done (the overlap); empty for synchronous.
  """

  name: str
  asynchronous: bool
  parameters: frozenset[int]
  compute_while_in_flight: tuple[str, ...]


def all_reduces(hlo_text: str) -> list[AllReduce]:
  """Finds every all-reduce of the entry computation with its parameter dependencies.

  Args:
    hlo_text: a compiled HLO module's text.

  Returns:
    One `AllReduce` per ``all-reduce``, ``all-reduce-start`` or all-reduce
    wrapped in ``async-start``, in program order.
  """
  instructions = entry_computation(hlo_text)
  called_opcodes = computation_opcodes(hlo_text)
  position = {instruction.name: index for index, instruction in enumerate(instructions)}
  found = []
  for instruction in instructions:
    wrapped = instruction.opcode == "async-start" and "all-reduce" in called_opcodes.get(
      instruction.called or "", set()
    )
    if instruction.opcode not in ALL_REDUCE_OPCODES and not wrapped:
      continue
    asynchronous = instruction.opcode == "all-reduce-start" or wrapped
    done_opcode = "async-done" if wrapped else "all-reduce-done"
    in_flight: tuple[str, ...] = ()
    if asynchronous:
      done = next(
        (other for other in instructions if other.opcode == done_opcode and instruction.name in other.operands), None
      )
      if done is not None:
        between = instructions[position[instruction.name] + 1 : position[done.name]]
        in_flight = tuple(other.name for other in between if other.opcode in COMPUTE_OPCODES)
    found.append(
      AllReduce(
        name=instruction.name,
        asynchronous=asynchronous,
        parameters=frozenset(parameter_dependencies(instructions, instruction.name)),
        compute_while_in_flight=in_flight,
      )
    )
  return found
