"""What the tests share, imported by full name (``from tests.helpers import engine_oracle``).

The repository root is on ``sys.path`` under pytest (``pythonpath = ["."]`` in
pyproject.toml's ``[tool.pytest.ini_options]``) and in every subprocess a test
starts (``PYTHONPATH``, set by `multiprocess_harness.process_environment`,
``launch/local.sh``, or the test itself), so no test edits ``sys.path``.

* `dcs3gd_reference`: a closed-form numpy DC-S3GD, the oracle of
  tests/decentral/test_dcs3gd.py.
* `engine_oracle`: small models, data and a plain sequential replay of a
  schedule (each gradient's version from the recorded pulls, the server step
  in numpy), the oracle the engine's blocks must match.
* `fault_helpers`: the fault-injection tests' runs (tiny runs reading the
  digits from npz files, in-process or on the command line) and comparisons.
* `multiprocess_harness`: runs one program as N JAX processes on 127.0.0.1
  (gloo) and collects what each wrote; the environment of such a child.
* `programs`: runs a command-line program of the repository as a user does
  (``python -m MODULE FLAGS`` in its root, on JAX's CPU backend), output captured.
* `tiny_run_config`: a config file (``get_config(arg)``) of the smallest real
  training runs (``hardsync``, ``async_dc``, ``dcs3gd``), passed to
  ``stalesgd.cli.train`` by path.
* `train_helpers`: what the training-loop tests share: tiny configs, reading
  a run's outputs, starting ``stalesgd.cli.train`` as a subprocess.
* `workers`: the programs tests start as subprocesses, each run as
  ``python -m tests.helpers.workers.<name>`` (several are also imported, to
  compute an in-process reference with the same code).
"""
