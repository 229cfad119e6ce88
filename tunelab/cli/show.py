"""``tunelab show RECIPE``: one recipe with its download and launch commands."""

from __future__ import annotations

from pathlib import Path

from tunelab.cli.common import fail


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser("show", help="print one recipe with its download and launch commands")
    parser.add_argument("recipe", help="a key such as open-llama-7b/lora, or a YAML path")
    parser.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.files import read_text
    from tunelab.recipes import RecipeError, resolve

    try:
        recipe = resolve(args.recipe)
    except RecipeError as e:
        return fail(str(e))
    print(read_text(recipe.path, what="recipe").rstrip())  # the file load() just read, read the same way
    print()
    ckpt = recipe.get("checkpoint_dir")
    present = ckpt and (Path(ckpt) / "lit_model.pth").is_file()
    print(f"# download: {recipe.download_command()}" + ("" if present else "   (not downloaded here yet)"))
    print(f"# launch:   {recipe.launch_command()}")
    print(f"# on the tiny model (CPU): {recipe.tiny_command()}")
    return 0
