# SPDX-License-Identifier: Apache-2.0
"""Gradient compression for the wire, as horovod.torch.Compression: ``Compression.none`` and
``Compression.fp16`` (float32 and float64 tensors travel as float16 and come back in their own
dtype; other dtypes, bfloat16 included, travel as they are)."""

import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor:
    """compress(tensor) -> (tensor for the wire, context); decompress(tensor, context) ->
    tensor in the original dtype."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    @staticmethod
    def compress(tensor):
        if tensor.dtype in (torch.float32, torch.float64):
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
