"""The ``hubgrpo`` command line. Thin: each command lives in ``hubgrpo.cli.*`` and imports heavy libraries
inside its body. Every ``HubGrpoError`` becomes a message, a hint and an exit code."""

from __future__ import annotations

import typer

from hubgrpo import __version__
from hubgrpo.cli import config_cmd, eval_cmd, gc_cmd, launch_cmd, merge_cmd, run_cmd, sim_cmd, space_cmd, train_cmd

app = typer.Typer(
    name="hubgrpo",
    help="Asynchronous GRPO + LoRA fine-tuning across machines, with a Hub repo as the bucket.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hubgrpo {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """hubgrpo: GRPO + LoRA across machines that share only a Hub repo and a Gradio Space."""


for _module in (config_cmd, train_cmd, merge_cmd, run_cmd, eval_cmd, gc_cmd, sim_cmd, space_cmd, launch_cmd):
    _module.register(app)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the typer app and return its exit code. Usage errors are printed by click (exit 2),
    ``typer.Exit(n)`` returns n, and every ``HubGrpoError`` becomes a message, a hint and its exit code."""
    import signal

    from hubgrpo.errors import HubGrpoError

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started with `&` by a shell without job control:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C / SIGINT still stops it cleanly
    try:
        app(args=argv, prog_name="hubgrpo")  # standalone mode: click prints usage errors and raises SystemExit
    except SystemExit as e:
        return _exit_code(e.code)
    except HubGrpoError as e:
        typer.secho(f"error: {e.message}", fg="red", err=True)
        if e.hint:
            typer.secho(f"hint: {e.hint}", err=True)
        return e.exit_code
    except KeyboardInterrupt:
        typer.secho("interrupted", err=True)
        return 130
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    typer.secho(str(code), err=True)
    return 1
