"""Overlap-readiness of the compiled DC-S3GD step and streaming DiLoCo round, and the HLO dependency walker behind them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stalesgd.decentral import DCS3GD, DCS3GDSettings, settings_for_protocol
from stalesgd.decentral import _hlo as hlo
from stalesgd.decentral._streaming import StreamingSettings, init_streaming, sharded_streaming_round
from stalesgd.decentral._streaming_overlap import overlap_report, overlap_windows
from stalesgd.parallel import _sharding as sharding_lib


def conv_loss(params, batch):
  hidden = jax.lax.conv_general_dilated(
    batch["images"], params["conv"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  hidden = jax.nn.relu(hidden + params["conv_bias"]).mean(axis=(1, 2))
  logits = hidden @ params["dense"]
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
  return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["labels"])}


def conv_setup(config):
  rng = np.random.default_rng(0)
  params = {
    "conv": rng.normal(size=(3, 3, 3, 8)).astype(np.float32) * 0.2,
    "conv_bias": np.zeros(8, np.float32),
    "dense": rng.normal(size=(8, 10)).astype(np.float32) * 0.2,
  }
  mesh = sharding_lib.learner_mesh()
  trainer = DCS3GD(conv_loss, optax.sgd(0.1, momentum=0.9), config, mesh)
  batch = sharding_lib.stack_learners(
    lambda learner: {
      "images": np.random.default_rng(learner).normal(size=(4, 8, 8, 3)).astype(np.float32),
      "labels": np.arange(4, dtype=np.int32) + learner,
    },
    mesh,
  )
  return trainer, trainer.init(params), batch


@pytest.mark.slow
@pytest.mark.parametrize(
  "config",
  [
    DCS3GDSettings(staleness=1, dc_lambda=0.2, lambda_mode="layerwise"),
    DCS3GDSettings(staleness=2, dc_lambda=2.0, lambda_mode="adaptive", eager=True),
    settings_for_protocol("s3gd"),
  ],
  ids=["dcs3gd-layerwise", "adaptive-eager-S2", "s3gd"],
)
def test_one_weight_all_reduce_reading_only_the_in_flight_queue(config, devices):
  trainer, state, batch = conv_setup(config)
  report = trainer.overlap_report(state, batch)
  assert report["all_reduces"] == 1, report
  assert report["update_all_reduce_reads"] == [
    "[0].in_flight['conv']",
    "[0].in_flight['conv_bias']",
    "[0].in_flight['dense']",
  ], report
  assert report["overlap_ready"]


def test_synchronous_all_reduce_is_detected_as_not_overlap_ready(devices):
  # Negative control: at staleness 0 the all-reduce needs this step's gradient,
  # and the walker must see the batch and the weights among its inputs.
  trainer, state, batch = conv_setup(settings_for_protocol("allreduce_sync"))
  report = trainer.overlap_report(state, batch)
  assert report["all_reduces"] == 1 and not report["overlap_ready"]
  assert "[1]['images']" in report["update_all_reduce_reads"]
  assert "[0].local_params['conv']" in report["update_all_reduce_reads"]


def test_a_metric_reduced_inside_the_step_would_be_caught(devices):
  # What the design avoids: a loss pmean in the same program as the weight
  # all-reduce. The walker counts it (XLA may even merge the two into one
  # all-reduce that then waits for the backward pass).
  mesh = sharding_lib.learner_mesh()

  def step(queue, local, batch):
    averaged = jax.lax.pmean(queue, "learners")
    loss, grads = jax.value_and_grad(lambda weights: jnp.sum(jnp.tanh(batch * weights)))(local)
    return local + averaged - 0.1 * grads, jax.lax.pmean(loss, "learners")

  spec = jax.sharding.PartitionSpec("learners")
  stepper = jax.jit(
    jax.shard_map(step, mesh=mesh, in_specs=(spec, spec, spec), out_specs=(spec, jax.sharding.PartitionSpec()))
  )
  ones = sharding_lib.stack_learners(lambda learner: np.ones(3, np.float32), mesh)
  found = hlo.all_reduces(stepper.lower(ones, ones, ones).compile().as_text())
  # Not "exactly one all-reduce reading only the queue (parameter 0)". With
  # jaxlib 0.10.2 on CPU the two are merged into one that reads {0, 1, 2}.
  assert any(2 in reduce.parameters for reduce in found)
  assert not (len(found) == 1 and found[0].parameters == frozenset({0}))


SCHEDULED_GPU_LIKE = """\
HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[4]{0}, f32[4]{0}, f32[2,4]{1,0})->f32[4]{0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%fused_backward (p0: f32[2,4], p1: f32[4]) -> f32[4] {
  %p0 = f32[2,4]{1,0} parameter(0)
  %p1 = f32[4]{0} parameter(1)
  ROOT %r = f32[4]{0} reduce(%p0, %p1), dimensions={0}, to_apply=%add
}

ENTRY %main (queue: f32[4], weights: f32[4], batch: f32[2,4]) -> f32[4] {
  %queue = f32[4]{0} parameter(0), sharding={devices=[8]<=[8]}
  %weights = f32[4]{0} parameter(1)
  %batch = f32[2,4]{1,0} parameter(2), metadata={op_name="batch"}
  %all-reduce-start = (f32[4]{0}, f32[4]{0}) all-reduce-start(%queue), channel_id=1, replica_groups={{0,1}}, to_apply=%add
  %backward = f32[4]{0} fusion(%batch, %weights), kind=kLoop, calls=%fused_backward
  %gemm = (f32[4]{0}, s8[16]{0}) custom-call(%backward, %weights), custom_call_target="__cublas$gemm"
  %all-reduce-done = f32[4]{0} all-reduce-done(%all-reduce-start)
  %update = f32[4]{0} get-tuple-element(%gemm), index=0
  ROOT %new = f32[4]{0} add(%all-reduce-done, %update), control-predecessors={%backward}
}
"""


def test_walker_follows_operands_to_entry_parameters():
  instructions = hlo.entry_computation(SCHEDULED_GPU_LIKE)
  by_name = {instruction.name: instruction for instruction in instructions}
  assert by_name["batch"].parameter_number == 2
  assert by_name["backward"].operands == ("batch", "weights")  # not the called computation
  assert by_name["new"].operands == ("all-reduce-done", "update")  # control edges are not data
  assert hlo.parameter_dependencies(instructions, "all-reduce-start") == {0}
  assert hlo.parameter_dependencies(instructions, "new") == {0, 1, 2}
  assert hlo.ancestors(instructions, "update") == {"gemm", "backward", "batch", "weights"}


def test_walker_reports_compute_scheduled_while_an_all_reduce_is_in_flight():
  [reduce] = hlo.all_reduces(SCHEDULED_GPU_LIKE)
  assert reduce.asynchronous and reduce.parameters == frozenset({0})
  assert reduce.compute_while_in_flight == ("backward", "gemm")


ASYNC_WRAPPED = """\
HloModule jit_step, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%wrapped_all_reduce (q: f32[4]) -> f32[4] {
  %q = f32[4]{0} parameter(0)
  ROOT %ar = f32[4]{0} all-reduce(%q), replica_groups={{0,1}}, to_apply=%add
}

ENTRY %main (queue: f32[4], batch: f32[4]) -> f32[4] {
  %queue = f32[4]{0} parameter(0)
  %batch = f32[4]{0} parameter(1)
  %start = ((f32[4]{0}), f32[4]{0}) async-start(%queue), calls=%wrapped_all_reduce
  %conv = f32[4]{0} convolution(%batch, %batch), dim_labels=b0f_0io->b0f
  %done = f32[4]{0} async-done(%start)
  ROOT %out = f32[4]{0} add(%done, %conv)
}
"""


def test_walker_recognises_an_all_reduce_wrapped_in_async_start():
  assert hlo.computation_opcodes(ASYNC_WRAPPED)["wrapped_all_reduce"] == {"parameter", "all-reduce"}
  [reduce] = hlo.all_reduces(ASYNC_WRAPPED)
  assert (reduce.name, reduce.asynchronous, reduce.parameters) == ("start", True, frozenset({0}))
  assert reduce.compute_while_in_flight == ("conv",)


def test_independence_counts_the_matrix_work_on_each_side_of_an_all_reduce():
  # SCHEDULED_GPU_LIKE: the cuBLAS gemm reads the backward fusion and the weights, never the all-reduce; only `new`
  # (an add, not matrix work) reads the all-reduce's result.
  instructions = hlo.entry_computation(SCHEDULED_GPU_LIKE)
  assert hlo.descendants(instructions, "all-reduce-start") == {"all-reduce-done", "new"}
  assert hlo.descendants(instructions, "backward") == {"gemm", "update", "new"}
  assert hlo.matrix_work(SCHEDULED_GPU_LIKE) == ["gemm"]  # the fusion holds a reduce, not a dot
  assert hlo.independence(SCHEDULED_GPU_LIKE, "all-reduce-start") == hlo.Independence(before=0, independent=1, after=0)
  assert hlo.independence(SCHEDULED_GPU_LIKE, "new") == hlo.Independence(before=1, independent=0, after=0)
  # ASYNC_WRAPPED: the convolution runs beside the wrapped all-reduce; `out` reads both.
  assert hlo.matrix_work(ASYNC_WRAPPED) == ["conv"]
  assert hlo.independence(ASYNC_WRAPPED, "start") == hlo.Independence(before=0, independent=1, after=0)
  assert hlo.independence(ASYNC_WRAPPED, "batch") == hlo.Independence(before=0, independent=0, after=1)


def test_walker_parses_tuple_shapes_and_rejects_text_without_entry():
  instruction = hlo.parse_instruction(
    "  %ar = (f32[4,5]{1,0}, f32[5,3]{1,0}) all-reduce(%a.1, %b-2), channel_id=1, to_apply=%region_0.0"
  )
  assert instruction.opcode == "all-reduce" and instruction.operands == ("a.1", "b-2")
  assert hlo.parse_instruction("HloModule m") is None
  with pytest.raises(ValueError, match="no ENTRY"):
    hlo.entry_computation("HloModule m\n")


def mlp_loss(params, batch):
  hidden = jnp.tanh(batch["x"] @ params["w1"])
  return jnp.mean(jnp.square(hidden @ params["w2"] - batch["y"]))


def streaming_report(settings, learners=4):
  """`overlap_report` of one streaming DiLoCo round: a 64-64-64 MLP, fragment 0 = w1, fragment 1 = w2 (strided)."""
  rng = np.random.default_rng(0)
  params = {name: rng.normal(size=(64, 64)).astype(np.float32) * 0.1 for name in ("w1", "w2")}
  inner, outer = optax.sgd(0.1), optax.sgd(0.7, momentum=0.9, nesterov=True)
  mesh = sharding_lib.learner_mesh(devices=jax.devices()[:learners])
  state = init_streaming(inner, outer, params, learners, settings)
  steps = settings.local_steps
  batches = {part: rng.normal(size=(learners, steps, 32, 64)).astype(np.float32) for part in ("x", "y")}
  round_fn = jax.jit(
    lambda state, batches: sharded_streaming_round(mlp_loss, inner, outer, mesh, settings, state, batches),
    keep_unused=True,  # the entry parameters are the flattened (state, batches), numbered as `reads` says
  )
  report = overlap_report(round_fn.lower(state, batches).compile().as_text(), settings)
  paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path((state, batches))[0]]
  for reduce in report["all_reduces"]:
    reduce["reads"] = [paths[number] for number in reduce["reads"]]
  return report


def test_a_mid_round_fragment_all_reduce_leaves_its_overlapped_step_independent(devices):
  # H = 4, P = 2, tau = 1: w1 is synced after step 2 and its mean applied after step 3, so step 3's matrix work
  # (x @ w1, h @ w2, and the backward's three products) must neither feed nor read w1's all-reduce. w2, synced at
  # the round's end, is all-reduced at the next round's start from the carried pseudo-gradients, overlapping step 1.
  report = streaming_report(StreamingSettings(local_steps=4, fragments=2, delay=1, mix=0.5))
  assert report["windows"] == [(0, 1, 1), (2, 0, 1)]
  assert report["matrix_work_per_step"] == 5
  carried, mid_round = report["all_reduces"][:2]
  assert carried["before"] == 0 and carried["independent"] >= 5, report
  assert "[0].unreduced['w2']" in carried["reads"] and all(".unreduced[" in path for path in carried["reads"])
  assert mid_round["before"] <= 2 * 5 and mid_round["independent"] >= 1 * 5, report
  assert report["overlap_ready"], report


def test_the_one_round_delayed_step_all_reduces_carried_state_beside_the_whole_round(devices):
  # P = 1, tau = H (PCCL's asynchronous DiLoCo): the previous round's pseudo-gradients are all-reduced at the start,
  # reading nothing but them, and their mean is applied at the end: all 4 steps' products are independent.
  report = streaming_report(StreamingSettings(local_steps=4, fragments=1, delay=4))
  assert report["windows"] == [(0, 0, 4)]
  [carried] = report["all_reduces"]
  assert (carried["before"], carried["independent"], carried["after"]) == (0, 4 * 5, 0), report
  assert sorted(carried["reads"]) == ["[0].unreduced['w1']", "[0].unreduced['w2']"], report
  assert report["overlap_ready"]


def test_synchronous_diloco_leaves_nothing_to_overlap(devices):
  # Negative control: P = 1, tau = 0: the round's one sync is at its end and the mean is applied at once.
  report = streaming_report(StreamingSettings(local_steps=4, fragments=1, delay=0))
  assert report["windows"] == [(4, 0, 0)]
  first = report["all_reduces"][0]
  assert (first["before"], first["independent"], first["after"]) == (4 * 5, 0, 0), report
  assert "[1]['x']" in first["reads"]
  assert not report["overlap_ready"]


@pytest.mark.xfail(
  strict=True,
  reason="XLA:CPU's all-reduce combiner merges the carried all-reduce into the mid-round one at step 2, where the "
  "first is needed: both lose their overlap (docs/algorithms.md, overlap-readiness)",
)
def test_two_all_reduces_needed_at_one_boundary_stay_apart(devices):
  report = streaming_report(StreamingSettings(local_steps=4, fragments=2, delay=2))
  assert report["windows"] == [(0, 1, 2), (2, 0, 2)]
  assert report["overlap_ready"], report


_APART_WITHOUT_THE_COMBINER = """
import json, jax
jax.config.update("jax_num_cpu_devices", 8)
from stalesgd.decentral._streaming import StreamingSettings
from tests.decentral.test_overlap_hlo import streaming_report
report = streaming_report(StreamingSettings(local_steps=4, fragments=2, delay=2))
print(json.dumps({"windows": report["windows"], "ready": report["overlap_ready"]}))
"""


@pytest.mark.slow
def test_without_xla_cpus_all_reduce_combiner_the_two_all_reduces_stay_apart():
  """The workaround docs/algorithms.md gives for the case above: ``--xla_disable_hlo_passes=cpu-all-reduce-combiner``
  in XLA_FLAGS (read once, when the backend starts: a fresh process) keeps the carried and the mid-round
  all-reduce apart, and the round is overlap-ready."""
  import json
  import os
  import pathlib
  import subprocess
  import sys

  root = pathlib.Path(__file__).resolve().parents[2]
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_disable_hlo_passes=cpu-all-reduce-combiner".strip()
  env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(root)}
  done = subprocess.run(
    [sys.executable, "-c", _APART_WITHOUT_THE_COMBINER], cwd=root, env=env, capture_output=True, text=True, timeout=300
  )
  assert done.returncode == 0, done.stderr[-2000:]
  found = json.loads(done.stdout.strip().splitlines()[-1])
  assert found == {"windows": [[0, 1, 2], [2, 0, 2]], "ready": True}, found


def test_overlap_windows_count_the_steps_between_a_sync_and_the_use_of_its_mean():
  # A round-end sync with tau > 0 is all-reduced at the next round's start, its window tau steps of that round.
  assert overlap_windows(StreamingSettings(local_steps=4, fragments=2, delay=1)) == [(0, 1, 1), (2, 0, 1)]
  assert overlap_windows(StreamingSettings(local_steps=6, fragments=3, delay=5)) == [(0, 2, 5), (2, 0, 4), (4, 1, 2)]
  # Eager updates use a mean at the fragment's next sync: the rest of the round, or a whole round when carried.
  assert overlap_windows(StreamingSettings(local_steps=4, fragments=2, delay=1, eager=True)) == [(0, 1, 4), (2, 0, 2)]
  # The one-round-delayed step: all H steps; synchronous DiLoCo: none.
  assert overlap_windows(StreamingSettings(local_steps=4, fragments=1, delay=4)) == [(0, 0, 4)]
  assert overlap_windows(StreamingSettings(local_steps=4, fragments=1, delay=0)) == [(4, 0, 0)]
