"""Shared fixtures: the tiny random model (fast) and the real default model (slow)."""

import pytest

from spa.models import load_model


@pytest.fixture(scope="session")
def tiny():
    """A randomly initialised 2-layer Llama with the default tokenizer, in fp32."""
    return load_model("tiny", dtype="fp32")


@pytest.fixture(scope="session")
def smollm():
    """The embedded default model (converted once into the user's cache), in the precision
    this machine runs fast (bf16 where native, else fp32)."""
    return load_model("smollm2-135m-instruct", dtype="auto")
