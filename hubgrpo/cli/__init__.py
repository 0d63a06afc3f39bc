"""The ``hubgrpo`` command line: the typer app (``main``), one module per group of commands, and ``embedded``
(``hubgrpo run``: coordinator + worker processes on one machine). The only layer that imports every role."""
