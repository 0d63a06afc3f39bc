"""A request body with a round's files spliced in is the JSON ``json.dumps`` writes (``hubgrpo.worker.json_body``)."""

from __future__ import annotations

import binascii
import json

import pytest

from hubgrpo.worker.json_body import _MARK, Base64Text, json_body


def plain(payload) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def test_spliced_body_is_the_plain_json():
    files = {"adapter_model.safetensors": Base64Text.of(bytes(range(256)) * 50), "submission.json": Base64Text.of(b"")}
    lease = {"worker": 'w"0\\é', "nested": [{"k": Base64Text.of(b"xy")}, 1.5, None, True], "ctl": "\x00\n"}
    payload = {"data": [lease, files, None, "5"]}
    body = json_body(payload)
    assert body == plain(payload)
    assert json.loads(body)["data"][1]["adapter_model.safetensors"] == files["adapter_model.safetensors"]


def test_a_field_holding_the_mark_falls_back_to_plain_json():
    payload = {"data": [{"echoed": _MARK}, {"f": Base64Text.of(b"round")}]}
    assert json_body(payload) == plain(payload)
    assert json.loads(json_body(payload))["data"][0]["echoed"] == _MARK


def test_no_files_and_nan_refused_like_json():
    assert json_body({"data": [1, "a"]}) == plain({"data": [1, "a"]})
    with pytest.raises(ValueError):
        json_body({"data": [float("nan"), Base64Text.of(b"x")]})


@pytest.mark.parametrize("text", ['ab"c', "abc", "ab=c", "abé=", "a\\b="])
def test_only_base64_text_can_be_marked(text):
    with pytest.raises(binascii.Error, match="not base64"):
        Base64Text(text)
    assert Base64Text("QUJD") == "QUJD"
