"""``hubgrpo merge`` (merge adapter folders offline) and ``hubgrpo check`` (run the admission checks).

Only typer, the standard library and the light core are imported here; torch comes in with the command bodies.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from hubgrpo.config.methods import BY_NAME

METHODS = tuple(BY_NAME)  # svd, stack, ffa, naive


def _parse_weights(text: str | None, n: int) -> list[float]:
    if text is None:
        return [1.0 / n] * n
    try:
        weights = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"--weights must be comma-separated numbers, got {text!r}") from None
    if len(weights) != n:
        raise typer.BadParameter(f"--weights has {len(weights)} values for {n} submission folders")
    return weights


def _print_report(report: dict, output: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"merged {report['merged']} adapter(s) into {output}")
    table.add_column("field")
    table.add_column("value")
    rows = [
        ("method", report["method"]),
        ("algorithm", report["algorithm"]),
        ("residual ‖ΔW−B′A′‖/‖ΔW‖", f"{report['residual']:.3e}" + (" (est.)" if report["residual_estimated"] else "")),
        ("update norm", "-" if report["update_norm"] is None else f"{report['update_norm']:.4g}"),
        ("outer lr", str(report["outer_lr"])),
        ("clipped / trimmed", f"{report['clipped']} / {report['trimmed']}"),
        ("seconds", f"{report['seconds']:.2f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)


def merge_command(
    global_dir: Path = typer.Argument(..., metavar="GLOBAL_DIR", help="Folder of the global (base) adapter."),
    sub_dirs: list[Path] = typer.Argument(
        ..., metavar="SUB_DIR", help="Adapter folders to merge (each trained from GLOBAL_DIR)."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Folder to write the merged PEFT adapter to."),
    weights: str | None = typer.Option(None, "--weights", help="Comma-separated weights (default: equal)."),
    method: str = typer.Option("svd", "--method", help=f"One of {', '.join(METHODS)}."),
    rank: int | None = typer.Option(None, "--rank", min=1, help="Output rank for svd (default: the global's)."),
    outer_lr: float = typer.Option(1.0, "--outer-lr", help="Outer learning rate (1 = the weighted mean)."),
    svd_algorithm: str = typer.Option("auto", "--svd-algorithm", help="auto, exact or randomized."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of a table."),
) -> None:
    """Merge SUB_DIR adapters into GLOBAL_DIR's and write a PEFT adapter folder. With the defaults the result is
    the exact weighted mean of the submissions' ΔW, re-factorised to the global's rank."""
    if method not in METHODS:
        raise typer.BadParameter(f"--method must be one of {', '.join(METHODS)}, got {method!r}")
    from hubgrpo.cli.numbers import require_finite
    from hubgrpo.config.merge_section import OUTER_LR_MAX

    require_finite({"--outer-lr": outer_lr}, positive=("--outer-lr",), at_most={"--outer-lr": OUTER_LR_MAX})
    from hubgrpo.merge import MergeOptions, load_adapter_dir, merge, save_adapter_dir

    ws = _parse_weights(weights, len(sub_dirs))
    global_ = load_adapter_dir(global_dir)
    items = [(load_adapter_dir(d), global_, w) for d, w in zip(sub_dirs, ws)]
    options = MergeOptions(method=method, rank=rank, outer_lr=outer_lr, svd_algorithm=svd_algorithm)
    result = merge(global_, items, options)
    save_adapter_dir(result.adapter, output)
    if as_json:
        typer.echo(json.dumps(result.report, indent=2))
    else:
        _print_report(result.report, output)


def check_command(
    global_dir: Path = typer.Argument(
        ..., metavar="GLOBAL_DIR", help="Folder of the global adapter the submission must match."
    ),
    sub_dir: Path = typer.Argument(..., metavar="SUB_DIR", help="Submission folder to check."),
    max_mb: float = typer.Option(512.0, "--max-mb", help="Size limit of the submission in MiB."),
    norm_limit: float | None = typer.Option(
        None, "--norm-limit", help="Refuse updates with a larger ‖ΔW − ΔW_global‖."
    ),
    max_change: float = typer.Option(
        1.0,
        "--max-change",
        help="Refuse a LoRA factor entry that moved farther "
        "than this from GLOBAL_DIR (a sanity bound; a run's coordinator derives a "
        "tighter one, steps × lr × 5, from each lease — see --lr/--steps).",
    ),
    lr: float | None = typer.Option(None, "--lr", help="With --steps: the bound is steps × lr × 5 (AdamW)."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Optimizer steps of the round (with --lr)."),
) -> None:
    """Exit 0 when SUB_DIR passes every admission check against GLOBAL_DIR; exit 1 with the reason otherwise."""
    from hubgrpo.cli.numbers import require_finite
    from hubgrpo.errors import InvalidSubmission
    from hubgrpo.merge import load_adapter_dir
    from hubgrpo.merge.submission_checks import check_step_bound, check_submission, max_submission_bytes

    require_finite(
        {"--max-mb": max_mb, "--norm-limit": norm_limit, "--max-change": max_change, "--lr": lr},
        positive=("--max-mb", "--norm-limit", "--max-change", "--lr"),
    )

    global_ = load_adapter_dir(global_dir)
    bound = steps * lr * 5.0 if lr is not None and steps is not None else max_change
    try:
        limit = min(int(max_mb * 2**20), max_submission_bytes(global_))
        adapter = check_submission(sub_dir, global_, max_bytes=limit, norm_limit=norm_limit)
        check_step_bound(adapter, global_, bound)
    except InvalidSubmission as exc:  # deliberate: the refusal is this command's answer, not a failure
        typer.echo(f"refused [{exc.code}]: {exc.message}")
        if exc.hint:
            typer.echo(f"hint: {exc.hint}")
        raise typer.Exit(1) from None
    typer.echo(f"admitted: {sub_dir}")


def register(app: typer.Typer) -> None:
    """Add ``merge`` and ``check`` to the ``hubgrpo`` app."""
    app.command("merge")(merge_command)
    app.command("check")(check_command)
