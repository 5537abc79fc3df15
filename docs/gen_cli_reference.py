"""The CLI reference page, generated from the Typer app so that it cannot drift from the code.

Two uses:

- an MkDocs hook (``hooks:`` in mkdocs.yml): `on_files` adds ``reference/cli.md``, rendered at build time
  from ``trainsim.cli.app``, to the site; nothing generated is checked in;
- a script: ``python docs/gen_cli_reference.py`` prints the same page (Markdown) on stdout.

The page walks every command and group of the app in the order ``trainsim --help`` lists them: per command
its usage line (as ``--help`` prints it), its help text, and each argument and option with its help record
(the same name, metavar, default and range that ``--help`` shows). Hidden commands and options are left out.
"""

from __future__ import annotations

import re

#: where the page lands in the site (docs-relative)
PAGE = "reference/cli.md"

_INTRO = """\
# CLI reference

Every command and option of `trainsim`, generated from the command-line app itself when the site is built
(`docs/gen_cli_reference.py`), so it says exactly what `trainsim COMMAND --help` says. What the commands
are for, with examples: the [how-to pages](../how-to/simulate-what-if.md) and
[commands in depth](commands.md). Conventions every command shares (`--json`, one-line errors, exit codes):
[errors and exit codes](errors.md).
"""


def _command():
    """The app as a click command tree (typer builds it on demand)."""
    import typer.main

    from trainsim.cli import app

    return typer.main.get_command(app)


def walk(command=None, ctx=None, name: str = "trainsim"):
    """Yield ``(path, command, ctx)`` for the app and every command below it, depth first, in the order
    ``--help`` lists them; ``path`` is the words typed, e.g. ``"trainsim topo show"``."""
    command = command or _command()
    ctx = command.context_class(command, info_name=name, parent=ctx)
    yield ctx.command_path, command, ctx
    for sub_name in getattr(command, "commands", {}) or {}:
        sub = command.commands[sub_name]
        if not sub.hidden:
            yield from walk(sub, ctx, sub_name)


def command_paths() -> list[str]:
    """Every command's words, the app itself first (``trainsim``, ``trainsim version``, ...)."""
    return [path for path, _, _ in walk()]


_CODE = re.compile(r"(`[^`]*`)")


def _text(text: str) -> str:
    """Help text as Markdown (the app's ``rich_markup_mode`` is markdown): kept as written, except that
    ``<`` outside code spans is escaped so that ``<int>`` is not taken for an HTML tag."""
    parts = _CODE.split(" ".join(text.split()))
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;") for part in parts)


def _param_line(param, ctx) -> str | None:
    record = param.get_help_record(ctx)
    if record is None or getattr(param, "hidden", False):
        return None
    names, help_text = record
    required = " (required)" if getattr(param, "required", False) else ""
    help_text = help_text.replace("[required]", "").strip()
    return f"- `{names}`{required}: {_text(help_text)}" if help_text else f"- `{names}`{required}"


def _section(path: str, command, ctx) -> str:
    depth = path.count(" ")
    heading = "#" * min(2 + depth, 4)
    lines = [f"{heading} {path}", "", "```text", command.get_usage(ctx).strip(), "```", ""]
    if command.help:
        lines += [_text(command.help), ""]
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = [p for p in command.params if p.param_type_name == "option"]
    for title, params in (("Arguments", arguments), ("Options", options)):
        rendered = [line for line in (_param_line(p, ctx) for p in params) if line]
        if rendered:
            lines += [f"**{title}**", "", *rendered, ""]
    subcommands = [n for n, c in (getattr(command, "commands", {}) or {}).items() if not c.hidden]
    if subcommands:
        links = ", ".join(f"[`{n}`](#{_anchor(f'{path} {n}')})" for n in subcommands)
        lines += [f"**Commands**: {links}", ""]
    return "\n".join(lines)


def _anchor(path: str) -> str:
    """The id MkDocs' toc extension gives a heading of these words."""
    return re.sub(r"[^\w\- ]", "", path).strip().lower().replace(" ", "-")


def render() -> str:
    """The whole page, Markdown."""
    sections = [_section(path, command, ctx) for path, command, ctx in walk()]
    return _INTRO + "\n" + "\n".join(sections)


def on_files(files, config):
    """MkDocs hook: add the generated page to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    print(render(), end="")
