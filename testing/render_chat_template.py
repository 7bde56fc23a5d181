"""Renders a chat template with Python's jinja2, set up as Hugging Face
transformers sets it up for `apply_chat_template` (the environment the
templates' authors test against): a sandboxed environment with
`trim_blocks` and `lstrip_blocks`, the loop-controls extension, a `tojson`
filter that keeps non-ASCII text, and the globals `raise_exception` and
`strftime_now` (today's local date and time), and the `{% generation %}`
block (transformers marks the assistant's tokens with it; it renders its
body). `tools` and `documents` stay undefined, as the runtime leaves them
until it takes tools.

Usage: render_chat_template.py < jobs.json, where jobs is a list of objects
holding `template` (a path), `messages`, `add_generation_prompt`,
`bos_token` and `eos_token`; prints a JSON list with, for each job, the
rendered text, or null when the template raised or failed to render.
The runtime's chat tests compare it with the runtime's own rendering.
"""

import json
import sys
from datetime import datetime

from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}`: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def raise_exception(message):
    raise TemplateError(message)


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def render(env, job):
    with open(job.pop("template"), encoding="utf-8") as f:
        source = f.read()
    try:
        return env.from_string(source).render(**job)
    except Exception:  # the template raised or failed: not this script
        return None


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlock])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    json.dump([render(env, job) for job in json.load(sys.stdin)], sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
