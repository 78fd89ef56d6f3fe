"""Decoding procedures: batched generation (and, in later issues, speculative and sparse decoding)."""

from algorithms.decoding.generate import GenerateOutput, generate

__all__ = ["GenerateOutput", "generate"]
