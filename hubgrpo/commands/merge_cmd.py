"""Placeholder: replaced by the module's owner (registers nothing yet)."""

import typer


def register(app: typer.Typer) -> None:
    return None
