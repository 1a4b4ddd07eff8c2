"""DataLoaderBuilder: seeded per-epoch order, workers or not, resumable position."""

from __future__ import annotations

import pytest
import torch

from ember import DatasetError
from ember.data import DataLoaderBuilder


class Numbers(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return index


class ListBatcher:
    def batch(self, items):
        return torch.tensor(items)


def order(loader) -> list[int]:
    return torch.cat(list(loader)).tolist()


def build(seed=5, workers=0, n=50):
    return (
        DataLoaderBuilder(ListBatcher())
        .batch_size(8)
        .shuffle(seed)
        .num_workers(workers)
        .build(Numbers(n))
    )


def test_order_depends_only_on_seed_and_epoch():
    a, b = build(), build()
    epoch1, epoch2 = order(a), order(a)
    assert sorted(epoch1) == list(range(50))
    assert epoch1 != epoch2  # reshuffled every epoch
    assert (order(b), order(b)) == (epoch1, epoch2)  # identical across runs
    assert order(build(seed=6)) != epoch1


def test_set_epoch_selects_the_epoch_order():
    loader = build()
    first, second = order(loader), order(loader)
    loader.sampler.set_epoch(2)
    assert order(loader) == second
    loader.sampler.set_epoch(1)
    assert order(loader) == first


def test_workers_give_the_same_batches():
    with_workers = build(workers=2)
    without = build()
    assert [b.tolist() for b in with_workers] == [b.tolist() for b in without]


def test_iterating_does_not_touch_the_global_rng():
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    order(build())
    assert torch.equal(torch.rand(1), expected)


def test_a_torch_data_loader_draws_one_number_a_pass_where_ours_draws_none():
    """What docs/ported.md tells porters: torch's DataLoader takes one int64 from the
    global generator at each iter() (its workers' base seed), so a script's dropout
    masks follow from the loader it uses; DataLoaderBuilder takes none."""
    torch.manual_seed(0)
    torch.empty((), dtype=torch.int64).random_()  # one draw
    once = torch.get_rng_state()
    torch.manual_seed(0)
    list(torch.utils.data.DataLoader(Numbers(10), batch_size=4))
    assert torch.equal(torch.get_rng_state(), once)
    torch.manual_seed(0)
    list(build())
    assert torch.equal(torch.get_rng_state(), torch.manual_seed(0).get_state())


def test_skip_resumes_mid_epoch_without_reading_skipped_items():
    loader = build()
    full = order(loader)
    loader.sampler.set_epoch(1)
    loader.sampler.skip(16)
    assert order(loader) == full[16:]


def test_without_shuffle_the_order_is_sequential():
    loader = DataLoaderBuilder(ListBatcher()).batch_size(4).build(Numbers(10))
    assert order(loader) == list(range(10))
    assert [len(b) for b in loader] == [4, 4, 2]


def test_empty_dataset_and_bad_options_fail_clearly():
    with pytest.raises(DatasetError, match=r"Numbers is empty \(length 0\)"):
        DataLoaderBuilder(ListBatcher()).build(Numbers(0))
    with pytest.raises(ValueError, match=r"batch_size must be a positive int, got 0"):
        DataLoaderBuilder().batch_size(0)


def test_batches_for_a_cuda_device_are_pinned_and_copied_without_blocking(monkeypatch):
    """On a machine without CUDA, a stand-in: torch says CUDA is available, and the
    copy a learner makes records the options it is given."""
    from torch.overrides import TorchFunctionMode

    from ember.data import to_device
    from ember.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    dataset = Numbers(8)
    assert DataLoaderBuilder().device("cuda").build(dataset).pin_memory is True
    assert DataLoaderBuilder().device("cuda:1").build(dataset).pin_memory is True
    assert DataLoaderBuilder().build(dataset).pin_memory is True  # no device: CUDA is there
    assert DataLoaderBuilder().device("cpu").build(dataset).pin_memory is False
    assert DataLoaderBuilder().device("cuda").pin_memory(False).build(dataset).pin_memory is False

    class Copies(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[dict] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.to:
                self.seen.append(dict(kwargs or {}))
            return func(*args, **(kwargs or {}))

    with Copies() as copies:
        to_device({"x": torch.ones(2), "y": [torch.zeros(1)]}, torch.device("cpu"))
    assert [seen.get("non_blocking") for seen in copies.seen] == [True, True]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert DataLoaderBuilder().build(dataset).pin_memory is False
    with pytest.raises(ConfigError, match=r"device\('cuda'\): CUDA is not available"):
        DataLoaderBuilder().device("cuda")
    with pytest.raises(ConfigError, match="device\\(\\): .*Pass e.g. 'cuda'"):
        DataLoaderBuilder().device("gpu")
