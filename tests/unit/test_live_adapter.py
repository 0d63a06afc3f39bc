"""The engine's fast adapter path (``hubgrpo.worker.adapter_io.LiveAdapter``): what it saves is what PEFT's
``save_pretrained`` saves, and what it loads lands where PEFT's ``set_peft_model_state_dict`` puts it."""

from __future__ import annotations

import pytest
import torch
from peft import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file

from hubgrpo.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from hubgrpo.worker.adapter_io import save_adapter
from hubgrpo.worker.engine import RoundEngine
from tests.support.models_fixture import make_lease, tiny_cache, tiny_config  # noqa: F401  (fixture)

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("tiny_cache")]


def _peft_state(engine: RoundEngine) -> dict[str, torch.Tensor]:
    state = get_peft_model_state_dict(engine.trainer.model, adapter_name="default", save_embedding_layers=False)
    return {k: v.detach().clone() for k, v in state.items()}


def test_the_live_adapter_saves_and_loads_what_peft_does(tmp_path):
    engine = RoundEngine(tiny_config(["worker.threads=1"]))
    live = engine._live_adapter()
    assert live is not None and live.params is not None
    first = engine.save_adapter(tmp_path / "first")  # the first save is PEFT's own (its config bytes are kept)
    sub = engine.run_round(first, make_lease(steps=1, indices=[0, 1]), tmp_path / "round")
    assert sub.timings["load"] >= 0
    trained = _peft_state(engine)
    assert any(v.abs().sum() > 0 for k, v in trained.items() if "lora_B" in k)  # training moved B off zero
    ours = engine.save_adapter(tmp_path / "ours")
    peft_dir = save_adapter(engine.trainer.model, tmp_path / "peft")
    mine, theirs = load_file(ours / ADAPTER_WEIGHTS), load_file(peft_dir / ADAPTER_WEIGHTS)
    assert mine.keys() == theirs.keys() == trained.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert (ours / ADAPTER_CONFIG).read_bytes() == (peft_dir / ADAPTER_CONFIG).read_bytes()

    engine.load_adapter(first)  # back to version 0 through the live path
    assert all(torch.equal(v, load_file(first / ADAPTER_WEIGHTS)[k]) for k, v in _peft_state(engine).items())
    set_peft_model_state_dict(engine.trainer.model, trained, adapter_name="default")  # PEFT's way to the round
    through_peft = _peft_state(engine)
    engine.load_adapter(first)
    engine.load_adapter(ours)  # ours to the round
    assert all(torch.equal(v, through_peft[k]) for k, v in _peft_state(engine).items())


def test_a_rebuilt_trainer_gets_a_new_live_adapter():
    engine = RoundEngine(tiny_config(["worker.threads=1"]))
    live = engine._live_adapter()
    lease = make_lease(steps=1, indices=[0, 1])
    params = engine._merge_params(dict(lease.params) | {"num_generations": 2, "per_device_train_batch_size": 2})
    engine._ensure_trainer(params)  # a structural param changed: a fresh model
    again = engine._live_adapter()
    assert again is not live and again is not None and again.model is engine.trainer.model
    pointers = {p.data_ptr() for p in engine.trainer.model.parameters()}
    assert all(t.data_ptr() in pointers for t in engine._adapter_state().values())


def test_a_state_that_is_not_the_parameters_themselves_is_not_bound():
    from hubgrpo.worker.adapter_io import _bound

    layer = torch.nn.Linear(4, 4, bias=False)
    assert _bound({"w": layer.weight.detach()}, layer) == {"w": layer.weight}
    assert _bound({"w": layer.weight.detach().T}, layer) is None  # same storage, transposed
    assert _bound({"w": layer.weight.detach()[:2]}, layer) is None  # a part of it
    assert _bound({"a": layer.weight.detach(), "b": layer.weight.detach()}, layer) is None  # one parameter twice
    assert _bound({"w": layer.weight.detach().clone()}, layer) is None  # a copy
