"""``python -m tunelab``: the same as the ``tunelab`` command."""

from tunelab.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
