"""The quantization schemes are rows of one table (slmlab.quant_schemes): every row resolves to its layer and
decode-plan classes, the refusals and lookups say what they said before, and nothing else in src/slmlab
branches on a scheme's name or method (an AST walk, itself checked on the mistakes it exists for)."""

from __future__ import annotations

import ast
import sys

import pytest
import torch
from torch import nn

from import_graph import SRC
from slmlab.generation import plan
from slmlab.layers.quantized import layer_class, scheme_of_layer
from slmlab.quant_schemes import INT4, INT8, SCHEMES, scheme_named, scheme_with_method

TABLE = SRC / "quant_schemes.py"
WORDS = {word for row in SCHEMES.values() for word in (row.name, row.method)}


def _is_word(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in WORDS


def _holds_word(node: ast.AST) -> bool:
    """A scheme's name or method anywhere in an expression (``"int8"``, ``METHODS["int4"]``, ``("int8", x)``)."""
    return any(_is_word(part) for part in ast.walk(node))


def branches_on_a_scheme(source: str) -> list[int]:
    """Lines of ``source`` that branch on a scheme's name or method, or list the schemes again: a comparison
    with one (``==``, ``!=``, ``in``, ``is``; also through a subscript such as ``METHODS["int4"]``), a
    ``match`` case on one, one chosen by a condition (``"int4" if ... else "int8"``), a dict literal keyed
    by one (a second table by name), or a list, tuple or set literal holding one (a second list of the
    schemes, e.g. a flag's ``choices``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_holds_word(side) for side in (node.left, *node.comparators)):
            found.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and _is_word(node.value):
            found.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(key is not None and _is_word(key) for key in node.keys):
            found.append(node.lineno)
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)) and any(_is_word(item) for item in node.elts):
            found.append(node.lineno)
        elif isinstance(node, ast.IfExp) and (_holds_word(node.body) or _holds_word(node.orelse)):
            found.append(node.lineno)
    return sorted(set(found))


def test_nothing_outside_the_table_branches_on_a_scheme_name():
    found = [f"{path.relative_to(SRC)}:{line}" for path in sorted(SRC.rglob("*.py")) if path != TABLE
             for line in branches_on_a_scheme(path.read_text())]
    assert not found, "scheme names compared outside slmlab/quant_schemes.py (read the row instead):\n" + "\n".join(found)


def test_the_check_catches_each_way_of_branching_on_a_name():
    caught = ['if scheme == "int8": pass', 'ok = "int4" != held', 'ok = name in ("int8", "int4")',
              'ok = record["quant_method"] == "slmlab_int4"', 'bits = {"int8": 8, "int4": 4}[scheme]',
              'match scheme:\n    case "int4":\n        pass', 'ok = method == METHODS["int4"]',
              'p.add_argument("--quantize", choices=["int8", "int4"])', 'held = "int4" if four else "int8"']
    for source in caught:
        assert len(branches_on_a_scheme(source)) == 1, source
    assert branches_on_a_scheme('row = SCHEMES["int8"]\np.add_argument("--scheme", default="int8")') == []
    assert branches_on_a_scheme('if scheme == "int16": pass') == []


def test_rows_have_unique_names_and_methods_and_resolve_to_their_classes():
    assert list(SCHEMES) == ["int8", "int4"] and SCHEMES["int8"] is INT8 and SCHEMES["int4"] is INT4
    assert len({row.method for row in SCHEMES.values()}) == len(SCHEMES)
    for row in SCHEMES.values():
        layer = layer_class(row)(48, 16, True)
        assert scheme_of_layer(layer) is row and layer.for_record(48, 16, True, row.record([], layer.settings()))
        linear = nn.Linear(48, 16)
        stacked = getattr(plan, row.columns).stack((layer_class(row).from_linear(linear),), (None,))
        x = torch.randn(3, 48)
        torch.testing.assert_close(plan.project(x, stacked), linear(x) - linear.bias, atol=0.15, rtol=0.05)
    assert scheme_of_layer(nn.Linear(4, 4)) is None


def test_lookups_say_what_they_said_before():
    assert scheme_named("int4", "--scheme") is INT4
    with pytest.raises(ValueError, match=r"^unknown --scheme 'int2'; choose one of: int8, int4$"):
        scheme_named("int2", "--scheme")
    assert scheme_with_method("slmlab_int8") is INT8 and scheme_with_method("gptq") is None
    assert scheme_with_method(["unhashable"]) is None


def test_refusals_name_the_device_or_the_scheme_held():
    assert INT8.refusal(torch.device("cpu"), None) is None and INT8.refusal(torch.device("cpu"), INT8) is None
    assert INT4.refusal(torch.device("cuda:1"), None) == ("--quantize int4 runs on the CPU (torch's int4 weight"
                                                          " kernel), not on cuda:1; pass --device cpu")
    assert INT8.refusal(torch.device("cpu"), INT4) == (
        "--quantize int8: the model is already int4 (a folder written by slmlab quantize) and cannot be requantized;"
        " drop --quantize, or pass the float run it came from with --quantize int8")


def test_the_table_imports_no_torch():
    """The command line reads the rows to build ``--help`` before any torch import."""
    import subprocess

    code = "import sys, slmlab.quant_schemes\nassert 'torch' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
