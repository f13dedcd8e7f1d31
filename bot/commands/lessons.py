"""`optbot lessons`: the knowledge base (lessons/<slug>.md)."""
from __future__ import annotations

import click

from bot.commands.common import knowledge_options
from bot.knowledge import OPPORTUNITY_KINDS
from bot.knowledge.lessons import get_lesson, load_lessons, search

_dir_opt = knowledge_options()


@click.group("lessons")
def command():
    """Lessons learned: pattern (what worked) and caveat (what failed, and why).

    \b
    Examples:
      optbot lessons list
      optbot lessons show all-ones-mask-blocks-cudnn
      optbot lessons search rope --pattern attention-waste --engine diffusers --hardware h200
    """


def _line(lesson) -> str:
    cond = ", ".join(f"{k}={v}" for k, v in lesson.applies_to.items())
    return f"{lesson.slug:40} {lesson.kind:8} {lesson.confidence:7} {cond}\n    {lesson.title}"


@command.command("list")
@_dir_opt
@click.option("--kind", type=click.Choice(["pattern", "caveat"]), default=None)
def list_cmd(knowledge, kind):
    """List lessons."""
    found = [lesson for lesson in load_lessons(knowledge.lessons) if kind is None or lesson.kind == kind]
    if not found:
        click.echo(f"no lessons in {knowledge.lessons}")
    for lesson in found:
        click.echo(_line(lesson))


@command.command("show")
@_dir_opt
@click.argument("slug")
def show_cmd(knowledge, slug):
    """Show one lesson (front-matter and body)."""
    click.echo(get_lesson(slug, knowledge.lessons).path.read_text().rstrip())


@command.command("search")
@_dir_opt
@click.argument("query", required=False, default="")
@click.option("--pattern", type=click.Choice(OPPORTUNITY_KINDS), default=None, help="Opportunity kind it must apply to.")
@click.option("--engine", default=None, help="Engine it must apply to (diffusers, sglang).")
@click.option("--hardware", default=None, help="Hardware it must apply to (cpu, h200).")
@click.option("--kind", type=click.Choice(["pattern", "caveat"]), default=None)
def search_cmd(knowledge, query, pattern, engine, hardware, kind):
    """Lessons that apply to PATTERN/ENGINE/HARDWARE, ranked by the words of QUERY they contain."""
    found = search(query, pattern, engine, hardware, kind, knowledge.lessons)
    if not found:
        click.echo("no matching lessons")
    for lesson in found:
        click.echo(_line(lesson))
