"""Documents are parsed within bounds (meshplan.bounded_parse): size, nesting, YAML aliases; a
refusal names the bound, never the document's content."""

from __future__ import annotations

import pytest
from bounded_support import BYTES, SECONDS, bounded, one_error_line, run_main

from meshplan.bounded_parse import MAX_DEPTH, brief, load_json, load_toml, load_yaml
from meshplan.errors import InputError


def alias_bomb(levels: int = 9) -> str:
    """A YAML "billion laughs": 9**levels strings from a few hundred bytes."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines + [f"parallelism: {{dp: *a{levels - 1}, tp: 1, pp: 1}}"]) + "\n"


def test_alias_bomb_is_refused_without_expanding_it():
    with pytest.raises(InputError, match="more than 100,000 values once its aliases are expanded") as err:
        load_yaml(alias_bomb(), "plan")
    assert "lol" not in str(err.value)


def test_self_referring_alias():
    with pytest.raises(InputError, match="an alias refers to a value that contains it"):
        load_yaml("a: &a [1, *a]\n", "plan")


@pytest.mark.parametrize("load,text", [
    (load_json, "[" * 100_000), (load_toml, "a = " + "[" * 100_000), (load_yaml, "[" * 100_000),
    (load_json, '{"a": ' * 65 + "1" + "}" * 65),
])
def test_deep_nesting_is_refused_before_parsing(load, text):
    with pytest.raises(InputError, match=f"more than the {MAX_DEPTH}"):
        load(text, "plan")


def test_deep_block_yaml_is_refused():
    text = "".join(" " * i + f"k{i}:\n" for i in range(80)) + " " * 80 + "v: 1\n"
    with pytest.raises(InputError, match=f"values nest more than the {MAX_DEPTH} levels"):
        load_yaml(text, "plan")


def test_brackets_in_strings_do_not_count_and_shallow_documents_parse():
    assert load_json('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "b": [[1]]}', "plan")["b"] == [[1]]
    assert load_yaml("x: &x {a: 1}\ny: *x\n", "plan") == {"x": {"a": 1}, "y": {"a": 1}}


def test_oversized_text():
    with pytest.raises(InputError, match="more than the 1,048,576 a config may"):
        load_json(" " * (1 << 20 + 1), "plan")


def test_brief_is_bounded():
    big = [["x" * 1000] * 1000] * 1000
    assert len(brief(big)) < 200


@pytest.mark.parametrize("name,text", [
    ("bomb.yaml", alias_bomb()), ("deep.json", "[" * 100_000), ("deep.yaml", "[" * 100_000), ("deep.toml", "a = " + "[" * 100_000),
])
@pytest.mark.parametrize("cmd", [["import"], ["estimate", "--plan"], ["estimate", "--model"]])
def test_cli_refuses_in_one_line_within_bounds(tmp_path, name, text, cmd):
    path = tmp_path / name
    path.write_text(text)
    (code, out, err), seconds, peak = bounded(lambda: run_main(cmd + [str(path)]))
    line = one_error_line(code, out, err)
    assert "lol" not in line and seconds < SECONDS and peak < BYTES
