"""The KV cache passes under the installed transformers' own name: the engine's generic
path, the shared prefix of SFT and perplexity run without the deprecation that precedes
the old name's removal (transformers 5.40)."""

import logging
import warnings

import pytest
import torch
import transformers  # noqa: F401  (it adds Logger.warning_once, which the fixture resets)

import spa.models.shared_prefix as shared
from spa.models.engine import Engine, SamplingParams


@pytest.fixture
def deprecations():
    """A function giving every warning and transformers log record raised so far, as text."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler, library = Collect(), logging.getLogger("transformers")
    logging.Logger.warning_once.cache_clear()  # it warns once a process otherwise
    library.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield lambda: records + [str(w.message) for w in caught]
    library.removeHandler(handler)


def test_generic_engine_and_shared_prefix_pass_the_cache_without_deprecation(tiny, deprecations):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer)
    engine.fast = False  # the generic path: the model's own forward and cache
    prompts = [[1, 5, 9, 13, 17], [1, 5, 9, 2]]
    out = engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0))
    assert all(len(g.token_ids) == 4 for g in out)
    ids = torch.tensor([list(range(10, 40))] * 2)
    attention = torch.ones_like(ids)
    trained = torch.zeros_like(ids, dtype=torch.bool)
    trained[:, 25:] = True
    with torch.no_grad():
        hidden, offset = shared.hidden_states(model.get_decoder(), ids, attention, trained)
        full = model.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state
    assert offset > 0
    torch.testing.assert_close(hidden, full[:, offset:], atol=1e-5, rtol=1e-5)
    assert not [m for m in deprecations() if "past_key_values" in m]
