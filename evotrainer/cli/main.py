"""The app: every command registered here, by name, from the module that defines it."""

from __future__ import annotations

import typer
from rich.markup import escape

from evotrainer import __version__
from evotrainer.cli import harness, imports, loop, skills, train
from evotrainer.cli.common import err
from evotrainer.errors import UserError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="RL post-training whose harness evolves with the policy."
)
for name, fn in (
    ("run", loop.run),
    ("resume", loop.resume),
    ("status", loop.status),
    ("report", loop.report),
    ("train", train.train),
    ("eval", train.eval_),
    ("rollouts", train.rollouts),
    ("diagnose", train.diagnose),
    ("backtest", train.backtest),
    ("knobs", harness.knobs),
):
    app.command(name)(fn)
app.add_typer(harness.harness_app, name="harness")
app.add_typer(imports.import_app, name="import")


def _version(value: bool) -> None:
    if value:
        print(f"evotrainer {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit"
    ),
) -> None:
    """RL post-training whose harness evolves with the policy."""


app.add_typer(skills.skills_app, name="skills")


def main() -> None:
    try:
        app(standalone_mode=False)
    except UserError as e:  # ConfigError included
        err.print(f"[red]error:[/] {escape(str(e))}")  # a key may hold [..]: print it, not its markup
        raise SystemExit(2) from None
    except (typer.Exit, SystemExit) as e:
        raise SystemExit(getattr(e, "exit_code", getattr(e, "code", 0))) from None
    except Exception as e:
        # Usage errors (unknown command, bad option) print their message, not a traceback. Checked by
        # shape: typer may vendor click, so its exception classes are not always click's.
        if hasattr(e, "show") and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            raise SystemExit(e.exit_code) from None
        raise
