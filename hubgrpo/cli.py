"""The ``hubgrpo`` command line. Thin: each command lives in ``hubgrpo.commands.*`` and imports heavy libraries
inside its body. Every ``HubGrpoError`` becomes a message, a hint and an exit code."""

from __future__ import annotations

import sys

import typer

from hubgrpo import __version__
from hubgrpo.commands import config_cmd, merge_cmd, run_cmd, space_cmd, train_cmd

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
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """hubgrpo: GRPO + LoRA across machines that share only a Hub repo and a Gradio Space."""


for _module in (config_cmd, train_cmd, merge_cmd, run_cmd, space_cmd):
    _module.register(app)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the typer app, turning hubgrpo errors into a message + hint + exit code."""
    from hubgrpo.errors import HubGrpoError

    try:
        app(args=argv, standalone_mode=False)
    except HubGrpoError as e:
        typer.secho(f"error: {e.message}", fg="red", err=True)
        if e.hint:
            typer.secho(f"hint: {e.hint}", err=True)
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        typer.secho("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        typer.secho("interrupted", err=True)
        return 130
    except Exception as e:  # click usage errors
        import click

        if isinstance(e, click.ClickException):
            e.show()
            return e.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
