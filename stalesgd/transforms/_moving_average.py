"""The exponential moving average that the transforms' statistics share."""

from __future__ import annotations

from typing import Any

import jax


def exponential_moving_average(moment: jax.Array, observation: jax.Array, decay: Any) -> jax.Array:
  r"""One step :math:`m \leftarrow d \, m + (1 - d) \, x`, kept in the dtype of ``moment``.

  Args:
    moment: The running average :math:`m` (its dtype is the state's and is kept).
    observation: The new observation :math:`x`.
    decay: :math:`d`.

  Returns:
    The updated average, in the dtype of ``moment``.
  """
  return (decay * moment + (1 - decay) * observation).astype(moment.dtype)
