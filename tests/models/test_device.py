import torch

from spa.models.device import model_device, on_device


def test_batch_follows_the_model_to_its_device():
    # The meta device stands in for a GPU: a tensor left on the CPU would show it.
    model = torch.nn.Linear(2, 2, device="meta")
    assert model_device(model) == torch.device("meta")
    moved = on_device([torch.zeros(3), torch.ones(2, 2, dtype=torch.long)], model)
    assert [t.device.type for t in moved] == ["meta", "meta"]
    assert [t.dtype for t in moved] == [torch.float32, torch.long]


def test_on_a_cpu_model_the_tensors_stay_put():
    model = torch.nn.Linear(2, 2)
    t = torch.arange(4)
    assert on_device([t], model)[0] is t
