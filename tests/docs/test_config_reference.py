"""docs/config.md is the schema's own reference: every field documented, regenerated with the schema."""

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from rz_agents.cli.train import RunConfig
from rz_agents.config_doc import field_doc, field_docs, undocumented

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location(
        "config_reference", ROOT / "scripts" / "config_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_run_config_field_has_a_doc():
    assert undocumented(RunConfig) == []


def test_docs_config_md_is_the_generated_reference():
    assert _script().main(["--check"]) == 0, "run python3 scripts/config_reference.py"


@dataclass
class _Inner:
    """Inner settings.

    alpha: the first knob,
      continued here.
    beta / gamma: two knobs at once.
    """

    alpha: int = 1
    beta: float = 0.5
    gamma: str = "x"
    delta: int = 3  # the fourth knob
    # the fifth knob,
    # over two lines
    epsilon: bool = False
    zeta: int = 0


@dataclass
class _Outer:
    """Outer."""

    inner: _Inner = field(default_factory=_Inner)
    plain: int = 7


def test_an_undocumented_field_is_reported_by_its_dotted_path():
    assert undocumented(_Outer) == ["inner.zeta", "plain"]


def test_docs_come_from_docstring_entries_and_comments():
    assert field_doc(_Inner, "alpha") == "the first knob, continued here."
    assert field_doc(_Inner, "gamma") == "two knobs at once."
    assert field_doc(_Inner, "delta") == "the fourth knob"
    assert field_doc(_Inner, "epsilon") == "the fifth knob, over two lines"
    rows = {r.path: r for r in field_docs(_Outer)}
    assert rows["inner.beta"].default == "0.5" and rows["inner.beta"].type == "float"
    assert rows["inner"].default == "(section)"


def test_a_subclass_field_without_a_doc_fails_the_reference():
    @dataclass
    class _Extended(RunConfig):
        new_knob: int = 0

    assert "new_knob" in undocumented(_Extended)
    assert "new_knob" not in undocumented(RunConfig)
