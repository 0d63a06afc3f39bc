"""FFA rounds without their A factors (``hubgrpo.merge.frozen_a``), the upload's binary body
(``hubgrpo.upload_body``) and the update norm with a shared A: what a worker sends is exactly what it trained, what
the coordinator completes is checked like a full adapter, and hostile variants are refused by name."""

from __future__ import annotations

import struct

import pytest
import torch
from safetensors.torch import load, save

from hubgrpo import upload_body
from hubgrpo.errors import InvalidSubmission
from hubgrpo.merge import save_adapter_dir
from hubgrpo.merge.frozen_a import complete_a, is_a_key, strip_a
from hubgrpo.merge.lowrank import difference_sq_norm, gram_sq_norm
from hubgrpo.merge.submission_checks import check_submission
from hubgrpo.merge.untrusted_files import WEIGHTS_NAME, parse_header
from tests.support.adapter_factory import make_adapter

B_KEY = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
A_KEY = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


def _round(global_, folder, mutate=None):
    """A trained ffa round (B moved, A the global's) saved without its A factors, as a worker uploads it."""
    gen = torch.Generator().manual_seed(3)
    weights = {k: v + 0.01 * torch.randn(v.shape, generator=gen) if ".lora_B" in k else v
               for k, v in global_.weights.items()}
    save_adapter_dir(type(global_)(weights=weights, config=global_.config), folder)
    data = strip_a((folder / WEIGHTS_NAME).read_bytes())
    if mutate is not None:
        data = save(mutate(load(data)))
    (folder / WEIGHTS_NAME).write_bytes(data)
    return folder, weights


def test_strip_a_keeps_the_b_tensors_byte_for_byte():
    adapter = make_adapter(seed=1)
    data = save(adapter.weights, metadata={"format": "pt"})
    stripped = strip_a(data)
    parse_header(stripped)  # the coordinator's own layout check of untrusted safetensors
    got = load(stripped)
    assert set(got) == {k for k in adapter.weights if not is_a_key(k)} and got
    assert all(torch.equal(got[k], adapter.weights[k]) for k in got)
    assert (8 + struct.unpack("<Q", stripped[:8])[0]) % 8 == 0  # the data starts aligned
    assert len(stripped) < len(data) * 0.8
    b_only = save(got)
    assert strip_a(b_only) is b_only  # nothing to strip: the same bytes
    with pytest.raises(ValueError):
        strip_a(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")


def test_a_b_only_round_is_completed_with_the_runs_a(tmp_path):
    global_ = make_adapter(seed=0)
    folder, trained = _round(global_, tmp_path / "sub")
    with pytest.raises(InvalidSubmission) as exc:  # a run that does not freeze A: its A factors are missing
        check_submission(folder, global_, max_bytes=10**7)
    assert exc.value.code == "missing_keys"
    adapter = check_submission(folder, global_, max_bytes=10**7, frozen_a=True)
    assert set(adapter.weights) == set(global_.weights)
    assert all(torch.equal(adapter.weights[k], trained[k]) for k in trained)  # exactly what was trained
    assert all(adapter.weights[k] is global_.weights[k] for k in global_.weights if is_a_key(k))


@pytest.mark.parametrize("mutate,code", [
    (lambda w: {**w, B_KEY: torch.zeros(w[B_KEY].shape[0] + 1, w[B_KEY].shape[1])}, "shape"),
    (lambda w: {**w, B_KEY: w[B_KEY].double()}, "dtype"),
    (lambda w: {**w, "base_model.model.lm_head.lora_B.weight": torch.zeros(2, 4)}, "extra_keys"),
    (lambda w: {k: v for k, v in w.items() if k != B_KEY}, "missing_keys"),
    (lambda w: {**w, B_KEY: torch.full_like(w[B_KEY], float("nan"))}, "nonfinite"),
    (lambda w: {**w, A_KEY: torch.zeros(4, 3)}, "shape"),  # an A smuggled in, of another shape
])
def test_hostile_b_only_rounds_are_refused(tmp_path, mutate, code):
    global_ = make_adapter(seed=0)
    folder, _ = _round(global_, tmp_path / "sub", mutate)
    with pytest.raises(InvalidSubmission) as exc:
        check_submission(folder, global_, max_bytes=10**7, frozen_a=True)
    assert exc.value.code == code, exc.value.message


def test_a_smuggled_a_is_kept_for_the_a_changed_check():
    global_ = make_adapter(seed=0)
    other = make_adapter(seed=5).weights[A_KEY]
    completed = complete_a({A_KEY: other}, global_.weights)
    assert completed[A_KEY] is other  # never replaced by the run's: admission refuses it (``a_changed``)
    assert all(completed[k] is v for k, v in global_.weights.items() if is_a_key(k) and k != A_KEY)


def test_the_binary_body_round_trips_and_refuses_what_does_not_add_up():
    files = {"adapter_model.safetensors": b"\x00" * 1000, "submission.json": b"{}"}
    body = upload_body.pack([{"lease_id": "x"}, files, None])
    head, data = upload_body.split(body)
    assert upload_body.files({"adapter_model.safetensors": 1000, "submission.json": 2}, data) == files
    for sizes in ({"a": 1000}, {"a": 1003}, {"a": -1, "b": 1003}, {"a": 1.5}, {"a": True}, [1002]):
        with pytest.raises(ValueError):
            upload_body.files(sizes, data)
    for bad in (b"\x01", struct.pack("<I", len(body)) + body[4:], struct.pack("<I", upload_body.MAX_HEAD + 1)):
        with pytest.raises(ValueError):
            upload_body.split(bad)


def test_the_update_norm_with_a_shared_a_is_the_general_one():
    gen = torch.Generator().manual_seed(0)
    b1, b2, a = torch.randn(40, 4, generator=gen), torch.randn(40, 4, generator=gen), torch.randn(4, 30, generator=gen)
    dense = float(((2.0 * b1 - 0.5 * b2) @ a).double().pow(2).sum())
    assert difference_sq_norm(2.0, b1, a, 0.5, b2, a.clone()) == pytest.approx(dense, rel=1e-5)
    assert difference_sq_norm(2.0, b1, a, 0.5, b2, a) == pytest.approx(gram_sq_norm([(2.0, b1, a), (-0.5, b2, a)]),
                                                                      rel=1e-4)
    assert difference_sq_norm(1.0, b1, a, 1.0, b1, a) == 0.0

