"""``coadapt serve ...``: the model server and its version commands (:mod:`coadapt.serve`).

``coadapt.serve`` owns its command line (``python -m coadapt.serve`` works without the CLI
package, like ``coadapt.sparse.online``); this command hands every argument to it untouched,
so ``coadapt serve --help``, ``coadapt serve ls DIR`` and ``coadapt serve --model m=DIR`` are
its help and commands.
"""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(add_completion=False)


@app.command(
    "serve",
    add_help_option=False,  # --help belongs to coadapt.serve's own parser
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
def serve(
    args: Annotated[
        list[str] | None,
        typer.Argument(metavar="ARGS...", show_default=False, help="see `coadapt serve --help`"),
    ] = None,
) -> None:
    """Serve model versions over HTTP (dynamic batching, hot swap); list/verify/activate."""
    from coadapt.serve.__main__ import main

    raise typer.Exit(main(list(args or [])))
