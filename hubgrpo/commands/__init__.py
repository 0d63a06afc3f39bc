"""CLI command groups. Each module defines ``register(app)`` and imports only typer and the standard library at
module level, so ``hubgrpo --help`` stays fast and never imports torch or gradio."""
