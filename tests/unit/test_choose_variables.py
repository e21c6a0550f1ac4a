"""One chooser of variables, for the input's variables, input.preprocess's inputs and its outputs."""

from __future__ import annotations

import pytest

from planning.config import parse_config
from planning.features import Candidates, choose_variables
from planning.inputs.metadata import VariableInfo
from schemas.errors import UserError

VARIABLES = {
    "t": VariableInfo("t", ("time", "level", "lat", "lon"), "float32", "int16", {}),
    "q": VariableInfo("q", ("time", "level", "lat", "lon"), "float64", "float64", {}),
    "sst": VariableInfo("sst", ("time", "lat", "lon"), "float32", "float32", {}),
    "orography": VariableInfo("orography", ("lat", "lon"), "float32", "float32", {}),
    "label": VariableInfo("label", ("time", "lat", "lon"), "<U8", "<U8", {}),
}
CANDIDATES = Candidates(
    VARIABLES,
    "variables",
    lambda dims: f"none has {dims}",
    lambda name: f"is missing ({name})",
    "in a.nc",
    "remove it",
    listed_as=" (listed)",
    coordinates=frozenset({"lat2d"}),
)


def config(**sample):
    return parse_config({"input": {"paths": "a.nc"}, "sample": sample, "output": {"path": "out"}})


def names(variables):
    return [v.name for v in variables]


def test_by_default_every_numeric_variable_with_the_sample_dims_the_widest_only_unless_asked():
    patches = config(window={"lat": 3, "lon": 3})
    assert names(choose_variables(patches, CANDIDATES, None)) == ["t", "q"]
    assert names(choose_variables(patches, CANDIDATES, None, widest=False)) == ["t", "q", "sst"]  # not the text
    assert names(choose_variables(patches, CANDIDATES, ["sst", "orography"])) == ["sst", "orography"]


@pytest.mark.parametrize(
    ("sample", "listed", "message"),
    [
        ({"keep": ["depth"]}, None, "none has depth, time"),
        ({}, ["wind"], "variables: 'wind' is missing (wind)"),
        (
            {},
            ["lat2d"],
            "variables: 'lat2d' is a coordinate of the input, not a data variable; list it under `coords:`",
        ),
        (
            {},
            ["label"],
            "variables: 'label' in a.nc has dtype <U8, which a tf.Example cannot hold as numbers; remove it",
        ),
        ({}, ["orography"], "variables: none of ['orography'] (listed) has the dim 'time'; include at least one"),
    ],
)
def test_each_refusal_names_the_key_the_variable_and_the_fix(sample, listed, message):
    with pytest.raises(UserError) as error:
        choose_variables(config(**sample), CANDIDATES, listed)
    assert message in str(error.value) and "\n" not in str(error.value)
