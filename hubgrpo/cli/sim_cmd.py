"""``hubgrpo simulate``: a discrete-event simulation of an asynchronous run with N workers, on this machine."""

from __future__ import annotations

from pathlib import Path

import typer


def simulate(
    config: Path = typer.Argument(..., help="YAML config file."),
    workers: int = typer.Option(..., "--workers", "-n", min=1, help="Simulated worker machines."),
    output: Path = typer.Option(
        None,
        "--output",
        "-o",
        help="Folder for simulation.json/.png and the run repo (default: runs/<project>-sim-<N>w-s<seed>).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the run (params.seed) and of the fleet's dropouts."),
    speeds: str = typer.Option(
        "1", "--speeds", help="1 | spread:K (fastest = K × slowest, mean 1) | 1,0.5,2 (a list, cycled)."
    ),
    starts: str = typer.Option(
        "0",
        "--starts",
        help="When each machine asks for its first lease: 0 (all at once) "
        "| spread:S (uniform in the first S virtual seconds) | 0,1.5 (a list, cycled).",
    ),
    dropout: float = typer.Option(
        0.0,
        "--dropout",
        min=0.0,
        max=0.99,
        help="Chance that a round is abandoned (its machine drops out and rejoins --rejoin-s later).",
    ),
    latency_s: float = typer.Option(
        0.0, "--latency-s", min=0.0, help="Virtual seconds for each of a round's lease, download, upload and submit."
    ),
    rejoin_s: float | None = typer.Option(
        None,
        "--rejoin-s",
        min=0.0,
        help="Virtual seconds a machine that dropped out stays away (default: one round at speed 1).",
    ),
    step_s: float | None = typer.Option(
        None,
        "--step-s",
        min=1e-6,
        help="Virtual seconds per GRPO step at speed 1 (built-in models have a measured default).",
    ),
    until_version: int | None = typer.Option(None, "--until-version", min=1, help="Stop at this version."),
    until_reward: float | None = typer.Option(
        None, "--until-reward", help="Stop when the held-out reward reaches this."
    ),
    min_virtual_s: float = typer.Option(
        0.0, "--min-virtual-s", min=0.0, help="--until-reward stops the run only from this virtual time on."
    ),
    max_virtual_s: float | None = typer.Option(None, "--max-virtual-s", help="Stop at this virtual time."),
    target: float | None = typer.Option(
        None,
        "--target",
        help="Held-out reward for time_to_target_s (default: --until-reward, else 90% of the way to the best reached).",
    ),
    eval_samples: int = typer.Option(32, "--eval-samples", min=1, help="Held-out prompts scored per version."),
    eval_every: int = typer.Option(
        1,
        "--eval-every",
        min=1,
        help="Score every k-th version (--until-reward stops at the first scored one past it).",
    ),
    eval_sampled: int = typer.Option(
        0,
        "--eval-sampled",
        min=0,
        help="0: greedy held-out reward; k: the mean of k "
        "sampled passes at the training temperature, fixed seeds (smoother).",
    ),
    jitter: float = typer.Option(
        0.1, "--jitter", min=0.0, max=0.9, help="Each round's duration varies by up to ± this fraction."
    ),
    commit_quota: str = typer.Option(
        "128",
        "--commit-quota",
        help="The Hub's commits per rolling (virtual) hour "
        "on the run repo: past it the simulated repo answers the Hub's 429, and the "
        "coordinator's commit_budget_per_hour is this unless the config sets one. "
        "off: commits are free (the budget lifted).",
    ),
    set_: list[str] = typer.Option([], "--set", help="Override a config field (repeatable)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Simulate an asynchronous run with N machines on a virtual clock: real GRPO rounds, the real coordinator.

    Writes OUTPUT/simulation.json (versions with virtual time, samples, training and held-out reward, staleness;
    the staleness histogram; time to the target) and OUTPUT/simulation.png."""
    from hubgrpo.cli.config_cmd import load_checked
    from hubgrpo.cli.numbers import require_finite
    from hubgrpo.errors import ConfigError
    from hubgrpo.sim.fleet import parse_speeds, parse_starts
    from hubgrpo.sim.loop import SimOptions

    if until_version is None and until_reward is None and max_virtual_s is None:
        raise ConfigError(
            "a simulation needs a stop condition", hint="pass --until-version V, --until-reward R or --max-virtual-s S"
        )
    require_finite(
        {
            "--dropout": dropout,
            "--jitter": jitter,
            "--latency-s": latency_s,
            "--rejoin-s": rejoin_s,
            "--step-s": step_s,
            "--until-reward": until_reward,
            "--min-virtual-s": min_virtual_s,
            "--max-virtual-s": max_virtual_s,
            "--target": target,
        },
        positive=("--max-virtual-s",),
    )
    parse_speeds(speeds, workers), parse_starts(starts, workers, seed)  # bad specs are refused before any work
    from hubgrpo.sim.store import parse_quota

    quota = parse_quota(commit_quota)
    cfg = load_checked(config, [*set_, f"params.seed={seed}"])
    out = output or Path("runs") / f"{cfg.project_name}-sim-{workers}w-s{seed}"
    opts = SimOptions(
        workers=workers,
        speeds=speeds,
        starts=starts,
        dropout=dropout,
        latency_s=latency_s,
        seed=seed,
        step_s=step_s,
        rejoin_s=rejoin_s,
        until_version=until_version,
        until_reward=until_reward,
        min_virtual_s=min_virtual_s,
        max_virtual_s=max_virtual_s,
        eval_samples=eval_samples,
        eval_every=eval_every,
        eval_sampled=eval_sampled,
        jitter=jitter,
        commit_quota=quota,
    )
    _simulate(cfg, opts, out, progress, target if target is not None else until_reward)


def _simulate(cfg, opts, out: Path, progress: bool, target: float | None) -> None:
    """Run the simulation (with a progress bar), write its files and print its summary."""
    from hubgrpo.errors import ConfigError
    from hubgrpo.sim.loop import Simulation
    from hubgrpo.sim.report import finish, summary_lines

    if (out / "repo").exists():
        raise ConfigError(f"{out} already holds a simulation", hint="pass another --output, or delete it")
    with _progress(progress, opts.until_version) as on_version:
        try:
            sim = Simulation(cfg, opts, out, on_version=on_version)
        except ValueError as e:
            raise ConfigError(str(e), hint="pass --step-s") from None
        sim.run()
    result = finish(sim.result(), out, target)
    for line in summary_lines(result):
        typer.echo(line)
    typer.echo(f"wrote {out / 'simulation.json'} and {out / 'simulation.png'}")


def _progress(enabled: bool, total: int | None):
    """A rich progress bar over versions (a context manager yielding ``on_version``)."""
    import contextlib

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextlib.contextmanager
    def bar():
        if not enabled:
            yield None
            return
        cols = [
            TextColumn("simulate"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
        ]
        with Progress(*cols, transient=False) as p:
            task = p.add_task("versions", total=total, info="")

            def on_version(row: dict) -> None:
                ev = row["eval_reward"]
                p.update(
                    task,
                    completed=row["version"],
                    info=f"virtual {row['virtual_time_s'] / 60:.1f} min  held-out {'-' if ev is None else f'{ev:.3f}'}",
                )

            yield on_version

    return bar()


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
