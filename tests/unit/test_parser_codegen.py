"""The generated parser.py: data from the files enters it only as string literals."""

from __future__ import annotations

import ast
from pathlib import Path

from schemas import parser_codegen
from schemas.parser_codegen import render_parser
from schemas.schema import Feature, Schema, Shard

HOSTILE = "x'); import os; os.system('touch pwned') #\n\"\"\"\\"


def _schema() -> Schema:
    return Schema(
        features=(
            Feature(HOSTILE, "float32", (2,), ("d",), "variable", {"attrs": {"units": "'''\n__import__('os')"}}),
            Feature("index/time", "int64", (), (), "index"),
        ),
        splits={"data": (Shard("data-00000-of-00001.tfrecord", 3, 100),)},
    )


def test_generated_code_has_the_templates_statements_and_string_constants(tmp_path):
    source = render_parser(_schema(), str(tmp_path / HOSTILE))
    template = ast.parse(Path(parser_codegen.__file__).with_name("parser_template.py").read_text())
    generated = ast.parse(source)
    assert len(generated.body) == len(template.body)
    for old, new in zip(template.body, generated.body):
        if ast.dump(old) != ast.dump(new):
            # Only the placeholder assignments differ, and only by a string constant.
            placeholders = ("SCHEMA", "OUTPUT_URL", "NORMALIZATION", "RESIDUALS")
            assert isinstance(new, ast.Assign) and new.targets[0].id in placeholders
            assert isinstance(new.value, ast.Constant) and isinstance(new.value.value, str)


def test_hostile_names_survive_as_data(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    (output / "parser.py").write_text(render_parser(_schema(), str(output)))
    from helpers import import_generated_parser

    parser = import_generated_parser(output)
    assert list(parser.FEATURES) == [HOSTILE, "index/time"]
    assert parser.SCHEMA["features"][0]["source"]["attrs"]["units"] == "'''\n__import__('os')"
    assert not (tmp_path / "pwned").exists()


def test_a_parser_loaded_by_its_path_alone_needs_no_autograph(tmp_path, caplog):
    """Loaded without registering it in sys.modules, TensorFlow would warn it cannot transform its functions."""
    import importlib.util
    import logging

    from synthetic_output import FEATURES, make_columns, write_output

    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addHandler(caplog.handler)
    try:
        for per_record in (1, 4):
            output = tmp_path / f"out{per_record}"
            schema = write_output(output, make_columns(FEATURES, 10), [6, 4], examples_per_record=per_record)
            (output / "parser.py").write_text(render_parser(schema, str(output), {"t": {"mean": 1.0, "std": 2.0}}))
            spec = importlib.util.spec_from_file_location(f"by_path_{per_record}", output / "parser.py")
            module = importlib.util.module_from_spec(spec)  # not in sys.modules
            spec.loader.exec_module(module)
            batches = list(module.make_dataset("data", batch_size=4, normalize=True).as_numpy_iterator())
            assert sorted(i for b in batches for i in b["index/time"].tolist()) == list(range(10))
    finally:
        tf_logger.removeHandler(caplog.handler)
    assert not [r.getMessage() for r in caplog.records if "AutoGraph" in r.getMessage()]


def test_a_parser_refuses_an_output_whose_schema_commits_other_generations(tmp_path):
    """An append stopped during its commit can leave a parser.py written for a commit that never happened: it must not
    serve it. Shards copied elsewhere without their schema.json are still read."""
    import dataclasses
    import shutil

    import pytest
    from synthetic_output import FEATURES, make_columns, write_output, write_schema

    from helpers import import_generated_parser

    output = tmp_path / "out"
    schema = write_output(output, make_columns(FEATURES, 10), [6, 4])
    committed = {**schema.sources, "generations": 1, "generations_sha256": "a" * 64}
    write_schema(output, dataclasses.replace(schema, sources=committed))
    uncommitted = dataclasses.replace(schema, sources={**committed, "generations": 2, "generations_sha256": "b" * 64})
    (output / "parser.py").write_text(render_parser(uncommitted, str(output)))
    parser = import_generated_parser(output)
    with pytest.raises(ValueError, match=r"commits 1 generation\(s\), not the 2 this parser.py was written for"):
        parser.make_dataset("data")
    (output / "schema.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"schema.json: not a schema of this tool"):
        parser.make_dataset("data")
    copied = tmp_path / "copied"  # the shards alone, and their counts
    copied.mkdir()
    for name in [shard.file for shard in schema.splits["data"]] + ["shards.npz"]:
        shutil.copy(output / name, copied)
    batches = list(parser.make_dataset("data", batch_size=4, data_dir=str(copied)).as_numpy_iterator())
    assert sorted(i for b in batches for i in b["index/time"].tolist()) == list(range(10))
    write_schema(copied, uncommitted)  # and beside the schema it was written for
    assert sum(len(b["index/time"]) for b in parser.make_dataset("data", data_dir=str(copied))) == 10


def _built(directory, samples, constants):
    """An output of ``samples`` samples with its own parser.py, normalising t with ``constants``."""
    from synthetic_output import FEATURES, make_columns, write_output

    schema = write_output(directory, make_columns(FEATURES, samples), [samples // 2, samples - samples // 2])
    (directory / "parser.py").write_text(render_parser(schema, str(directory), {"t": constants}))
    return directory


def test_a_parser_refuses_an_output_built_again_since(tmp_path):
    """A parser.py kept from an earlier build would normalise the new data with the old constants, unannounced."""
    import pytest

    from helpers import import_generated_parser

    old = import_generated_parser(_built(tmp_path / "old", 10, {"mean": 1.0, "std": 2.0}))
    rebuilt = _built(tmp_path / "out", 12, {"mean": 5.0, "std": 3.0})
    (rebuilt / "parser.py").write_text((tmp_path / "old" / "parser.py").read_text())  # the old parser copied in
    for make in (lambda: old.make_dataset(data_dir=str(rebuilt)), import_generated_parser(rebuilt).make_dataset):
        with pytest.raises(ValueError) as caught:
            make()
        assert str(caught.value) == (
            f"{rebuilt / 'schema.json'}: not the output this parser.py was generated for (they differ in "
            "num_examples, shards, splits: it was built again or appended to since); use the parser.py written beside "
            "that schema.json"
        )
    (rebuilt / "schema.json").unlink()  # the shards alone: checked against the parser's own schema before reading
    with pytest.raises(ValueError, match=r"shards.npz: not the file schema.json was written with"):
        old.make_dataset(data_dir=str(rebuilt))


def test_a_parser_reads_its_own_output_from_anywhere(tmp_path):
    from helpers import import_generated_parser

    output = _built(tmp_path / "out", 10, {"mean": 1.0, "std": 2.0})
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "parser.py").write_text((output / "parser.py").read_text())
    parser = import_generated_parser(tmp_path / "elsewhere")  # no schema.json beside it: reads OUTPUT_URL
    batches = parser.make_dataset(batch_size=4).as_numpy_iterator()
    assert sorted(i for b in batches for i in b["index/time"].tolist()) == list(range(10))


def test_a_parser_reads_both_formats_alike_and_refuses_a_replaced_sidecar(tmp_path):
    """parser.py finds the shards by rule and their counts in shards.npz (checked against its digest), or listed."""
    import pytest
    from synthetic_output import FEATURES, make_columns, write_output

    from helpers import import_generated_parser

    read = {}
    for listed in (False, True):
        output = tmp_path / f"listed-{listed}"
        schema = write_output(output, make_columns(FEATURES, 30), [9, 0, 21], listed=listed)
        (output / "parser.py").write_text(render_parser(schema, str(output)))
        parser = import_generated_parser(output)
        assert parser.SCHEMA["format"] == ("xarray-tfrecords/1" if listed else "xarray-tfrecords/2")
        assert [Path(p).name for p in parser.shard_paths(parser.SCHEMA, str(output), "data")] == [
            shard.file for shard in schema.splits["data"]
        ]
        read[listed] = sorted(i for b in parser.make_dataset("data", batch_size=7) for i in b["index/time"].numpy())
    assert read[False] == read[True] == list(range(30))
    sidecar = tmp_path / "listed-False" / "shards.npz"
    data = bytearray(sidecar.read_bytes())
    data[-3] ^= 0xFF
    sidecar.write_bytes(bytes(data))
    parser = import_generated_parser(tmp_path / "listed-False")
    with pytest.raises(ValueError, match=r"shards.npz: not the file schema.json was written with"):
        parser.make_dataset("data")
