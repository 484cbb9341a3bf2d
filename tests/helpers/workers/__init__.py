"""Programs the tests start as subprocesses: ``python -m tests.helpers.workers.<name>``.

Tests name them by module (``<module>.__name__`` where importing the module
in the test process is harmless), never by file path.

* `dcs3gd_worker`: a few DC-S3GD steps on a small regression problem, as one
  process of a `multiprocess_harness` or ``launch/local.sh`` run.
* `engine_multiprocess_worker`: a few engine blocks with delay compensation, as
  one process of a multi-process run.
* `multiprocess_checkpoint_worker`: one of two processes saving, restoring and
  being preempted with a state sharded across both (tests/training/test_checkpoint.py).
* `paced_main`: ``stalesgd-train`` with a pause before every block, so a test
  can signal it mid-run.
* `resume_loop_worker`: a miniature training loop with checkpoints and metrics,
  interrupted and resumed by tests/training/test_checkpoint.py.
* `sigkill_during_save_worker`: dies by SIGKILL in the middle of an
  asynchronous checkpoint save.
"""
