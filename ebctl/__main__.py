"""``python -m ebctl``: the same command line as the ``ebctl`` console script."""

from ebctl.cli import app

if __name__ == "__main__":
    app(prog_name="ebctl")
