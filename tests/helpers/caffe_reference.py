"""Caffe's layers in float64 NumPy, written from Caffe's loops and layer definitions, not from stalesgd.

Layout is NHWC as in stalesgd's models (Caffe itself is NCHW; the maths per pixel and channel is the same).
Every function here is independent of the code under test: the convolution is a sum over kernel offsets of
matrix products, the pooling is Caffe's ``PoolingLayer::Forward_cpu`` loop, the normalisations are their
formulas written out.
"""

from __future__ import annotations

import math

import numpy as np


def conv(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, *, stride: int = 1, pad: int = 0, groups: int = 1):
  """Caffe's ConvolutionLayer (a cross-correlation): out[b, i, j, o] = bias[o] + sum_{di, dj, c} x_pad[b, i*s + di,
  j*s + dj, c] kernel[di, dj, c, o], the input channels and the outputs split into ``groups`` equal towers."""
  x = np.pad(np.asarray(x, np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  kernel = np.asarray(kernel, np.float64)
  kh, kw, group_in, features = kernel.shape
  assert x.shape[-1] == group_in * groups and features % groups == 0
  group_out = features // groups
  out_h, out_w = (x.shape[1] - kh) // stride + 1, (x.shape[2] - kw) // stride + 1
  out = np.zeros((x.shape[0], out_h, out_w, features))
  for g in range(groups):
    inputs = x[..., g * group_in : (g + 1) * group_in]
    for di in range(kh):
      for dj in range(kw):
        window = inputs[:, di : di + stride * (out_h - 1) + 1 : stride, dj : dj + stride * (out_w - 1) + 1 : stride]
        out[..., g * group_out : (g + 1) * group_out] += window @ kernel[di, dj, :, g * group_out : (g + 1) * group_out]
  return out + np.asarray(bias, np.float64)


def dense(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
  """Caffe's InnerProductLayer on the flattened input: x W + b."""
  flat = np.asarray(x, np.float64).reshape(x.shape[0], -1)
  return flat @ np.asarray(kernel, np.float64) + np.asarray(bias, np.float64)


def relu(x: np.ndarray) -> np.ndarray:
  return np.maximum(x, 0.0)


def pool(x: np.ndarray, window: int, stride: int, pad: int, mode: str) -> np.ndarray:
  """Caffe's PoolingLayer::Forward_cpu, transcribed loop by loop (NHWC)."""
  batch, height, width, channels = x.shape
  pooled_h = int(math.ceil((height + 2 * pad - window) / stride)) + 1
  pooled_w = int(math.ceil((width + 2 * pad - window) / stride)) + 1
  if pad:
    if (pooled_h - 1) * stride >= height + pad:
      pooled_h -= 1
    if (pooled_w - 1) * stride >= width + pad:
      pooled_w -= 1
  out = np.zeros((batch, pooled_h, pooled_w, channels), np.float64)
  for ph in range(pooled_h):
    for pw in range(pooled_w):
      hstart, wstart = ph * stride - pad, pw * stride - pad
      hend, wend = min(hstart + window, height + pad), min(wstart + window, width + pad)
      pool_size = (hend - hstart) * (wend - wstart)
      hstart, wstart = max(hstart, 0), max(wstart, 0)
      hend, wend = min(hend, height), min(wend, width)
      patch = x[:, hstart:hend, wstart:wend, :]
      if mode == "max":
        out[:, ph, pw, :] = patch.max(axis=(1, 2))
      else:
        out[:, ph, pw, :] = patch.sum(axis=(1, 2)) / pool_size
  return out


def lrn_within(x: np.ndarray, local_size: int, alpha: float, beta: float) -> np.ndarray:
  """y = x (1 + alpha / n^2 sum_{n x n, zero-padded} x^2)^-beta, written out."""
  half = (local_size - 1) // 2
  padded = np.pad(x.astype(np.float64) ** 2, ((0, 0), (half, half), (half, half), (0, 0)))
  out = np.empty_like(x, dtype=np.float64)
  for i in range(x.shape[1]):
    for j in range(x.shape[2]):
      window_sum = padded[:, i : i + local_size, j : j + local_size, :].sum(axis=(1, 2))
      out[:, i, j, :] = x[:, i, j, :] * (1 + alpha * window_sum / local_size**2) ** (-beta)
  return out


def lrn_across(x: np.ndarray, local_size: int, alpha: float, beta: float, k: float) -> np.ndarray:
  """y_c = x_c (k + alpha / n sum_{|c' - c| <= (n - 1) / 2} x_c'^2)^-beta, written out."""
  half = (local_size - 1) // 2
  squares = x.astype(np.float64) ** 2
  out = np.empty_like(x, dtype=np.float64)
  for c in range(x.shape[3]):
    window_sum = squares[..., max(c - half, 0) : c + half + 1].sum(axis=-1)
    out[..., c] = x[..., c] * (k + alpha / local_size * window_sum) ** (-beta)
  return out
