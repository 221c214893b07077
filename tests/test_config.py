"""spa.config on a small nested schema: loading, overrides, errors, inheritance, save/load."""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
import yaml

from spa.config import (ConfigError, apply_overrides, describe, from_dict, load, parse_override,
                        save, to_dict, with_defaults)


@dataclass
class Env:
    name: Literal["sokoban", "frozenlake"] = field(default="sokoban", metadata={"help": "env name"})
    options: dict[str, Any] = field(default_factory=dict, metadata={"help": "env options"})


@dataclass
class PPO:
    lr: float = field(default=1e-6, metadata={"help": "actor learning rate"})
    steps: int = field(default=10, metadata={"help": "training steps"})
    clip: tuple[float, float] = field(default=(0.2, 0.28), metadata={"help": "clip low, high"})
    normalize: bool = field(default=True, metadata={"help": "normalise advantages"})

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")


@dataclass
class LoRA:
    rank: int = 16
    alpha: float = 32.0
    targets: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])


@dataclass
class Recipe:
    name: str = field(metadata={"help": "run name"})
    env: Env = field(default_factory=Env)
    ppo: PPO = field(default_factory=lambda: PPO(steps=20))
    lora: Optional[LoRA] = field(default=None, metadata={"help": "LoRA adapter; null = full"})
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    out: Path | None = None


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return path


# ---- building -------------------------------------------------------------------------------

def test_from_dict_nested_with_defaults_and_coercion():
    data = {"name": "run", "out": "runs/a", "ppo": {"lr": 3, "clip": [0.1, 0.3]},
            "env": {"name": "frozenlake", "options": {"size": 4}}}
    config = from_dict(Recipe, data)
    assert config == Recipe(name="run", env=Env("frozenlake", {"size": 4}),
                            ppo=PPO(lr=3.0, clip=(0.1, 0.3)), out=Path("runs/a"))
    assert type(config.ppo.lr) is float and type(config.ppo.clip) is tuple
    # A missing section comes from the field's default factory, not the nested class defaults.
    assert from_dict(Recipe, {"name": "x"}).ppo.steps == 20
    assert from_dict(Recipe, {"name": "x", "ppo": {}}).ppo.steps == 10


@pytest.mark.parametrize("data, needles", [
    ({"ppo": {"steps": "ten"}}, ["ppo.steps", "'ten'", "int", "str"]),
    ({"ppo": {"steps": 2.5}}, ["ppo.steps", "2.5", "int"]),
    ({"ppo": {"lr": "fast"}}, ["ppo.lr", "'fast'", "float"]),
    ({"ppo": {"lr": None}}, ["ppo.lr", "None", "float"]),
    ({"ppo": {"normalize": 1}}, ["ppo.normalize", "bool", "true or false"]),
    ({"ppo": {"normalize": "yes"}}, ["ppo.normalize", "'yes'", "true or false"]),
    ({"name": 5}, ["name", "expected str", "quote"]),
    ({"seeds": 3}, ["seeds", "list[int]"]),
    ({"seeds": [1, "two"]}, ["seeds[1]", "'two'", "int"]),
    ({"ppo": {"clip": [0.1]}}, ["ppo.clip", "2 items"]),
    ({"ppo": 3}, ["ppo", "expected PPO"]),
    ({"env": {"options": [1]}}, ["env.options", "dict"]),
])
def test_type_errors_name_key_value_and_type(data, needles):
    with pytest.raises(ConfigError) as error:
        from_dict(Recipe, {"name": "x", **data})
    for needle in needles:
        assert needle in str(error.value)


def test_safe_coercions():
    config = from_dict(Recipe, {"name": "x", "ppo": {"steps": 1e3, "lr": "1e-6"}})
    assert config.ppo.steps == 1000 and type(config.ppo.steps) is int
    assert config.ppo.lr == 1e-6  # a string from plain yaml.safe_load("lr: 1e-6") is accepted


def test_unknown_key_at_depth_suggests_close_match():
    with pytest.raises(ConfigError) as error:
        from_dict(Recipe, {"name": "x", "ppo": {"lrr": 1e-5}})
    message = str(error.value)
    assert "unknown key 'ppo.lrr'" in message and "did you mean 'ppo.lr'?" in message
    assert "valid keys: lr, steps, clip, normalize" in message
    with pytest.raises(ConfigError, match="unknown key 'env.zzz'") as error:
        from_dict(Recipe, {"name": "x", "env": {"zzz": 1}})
    assert "did you mean" not in str(error.value)
    with pytest.raises(ConfigError, match="unknown key 'lora.rnk'.*did you mean 'lora.rank'"):
        load(Recipe, {"name": "x"}, ["lora.rnk=4"])


def test_literal_violation_lists_allowed_values():
    with pytest.raises(ConfigError) as error:
        load(Recipe, {"name": "x"}, ["env.name=sokobann"])
    message = str(error.value)
    assert "env.name" in message and "'sokoban', 'frozenlake'" in message
    assert "did you mean 'sokoban'" in message


def test_missing_required_key_and_post_init_validation():
    with pytest.raises(ConfigError, match="missing required key 'name'"):
        from_dict(Recipe, {})
    with pytest.raises(ConfigError, match="ppo: lr must be positive") as error:
        load(Recipe, {"name": "x"}, ["ppo.lr=-1e-6"])
    assert isinstance(error.value, ValueError)  # callers catching ValueError still work


# ---- overrides ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("ppo.lr=1e-6", (["ppo", "lr"], 1e-6)),
    ("ppo.lr=1.0e6", (["ppo", "lr"], 1e6)),
    ("ppo.normalize=true", (["ppo", "normalize"], True)),
    ("ppo.normalize=False", (["ppo", "normalize"], False)),
    ("x=yes", (["x"], "yes")),  # YAML 1.2: only true/false are booleans
    ("seeds=[1, 2]", (["seeds"], [1, 2])),
    ("lora=null", (["lora"], None)),
    ("name=", (["name"], "")),
    ("name=a=b", (["name"], "a=b")),
    (" ppo . steps = 3 ", (["ppo", "steps"], 3)),
    ("env.options={size: 8}", (["env", "options"], {"size": 8})),
    ("name='1e-6'", (["name"], "1e-6")),
])
def test_parse_override(text, expected):
    keys, value = parse_override(text)
    assert (keys, value) == expected and type(value) is type(expected[1])


@pytest.mark.parametrize("text", ["ppo.lr", "=3", "ppo..lr=1", "ppo.=1", "x=[1, 2"])
def test_malformed_override_is_named(text):
    with pytest.raises(ConfigError) as error:
        apply_overrides({}, [text])
    assert repr(text) in str(error.value)


def test_nested_overrides_do_not_mutate_input():
    data = {"name": "x", "env": {"options": {"size": 6}}}
    out = apply_overrides(data, ["env.options.boxes=2", "ppo.lr=3e-4", "env.name=frozenlake"])
    assert out == {"name": "x", "env": {"name": "frozenlake", "options": {"size": 6, "boxes": 2}},
                   "ppo": {"lr": 3e-4}}
    assert data == {"name": "x", "env": {"options": {"size": 6}}}
    config = from_dict(Recipe, out)
    assert config.env.options == {"size": 6, "boxes": 2} and config.ppo.lr == 3e-4
    with pytest.raises(ConfigError, match="'name' is a str, not a section"):
        apply_overrides(data, ["name.first=1"])


def test_override_replaces_whole_list_and_dict():
    config = load(Recipe, {"name": "x", "seeds": [0, 1, 2], "env": {"options": {"a": 1}}},
                  ["seeds=[7]", "ppo.clip=[0.1, 0.3]", "env.options={b: 2}"])
    assert config.seeds == [7] and config.ppo.clip == (0.1, 0.3)
    assert config.env.options == {"b": 2}  # overrides assign; only YAML layers merge


def test_override_creates_optional_section_from_defaults():
    config = load(Recipe, {"name": "x"}, ["lora.rank=8"])
    assert config.lora == LoRA(rank=8)
    config = load(Recipe, {"name": "x", "lora": None}, ["lora.targets=[o_proj]"])
    assert config.lora == LoRA(targets=["o_proj"])
    assert load(Recipe, {"name": "x", "lora": {"rank": 4}}, ["lora=null"]).lora is None
    assert load(Recipe, {"name": "x", "lora": {}}).lora == LoRA()


# ---- files ----------------------------------------------------------------------------------

def test_yaml_scalars_follow_yaml_1_2(tmp_path):
    path = write(tmp_path / "a.yaml", "name: run\nppo:\n  lr: 1e-5\n  steps: 5\n")
    assert load(Recipe, path).ppo.lr == 1e-5
    write(path, "name: run\nppo:\n  normalize: yes\n")
    with pytest.raises(ConfigError, match="ppo.normalize.*'yes'.*true or false"):
        load(Recipe, path)
    write(path, "name: no\n")  # the "Norway problem": stays a string
    assert load(Recipe, path).name == "no"


def test_defaults_inheritance_across_files(tmp_path):
    write(tmp_path / "presets" / "base.yaml", {
        "ppo": {"lr": 1e-5, "steps": 100}, "env": {"options": {"size": 6, "boxes": 1}},
        "seeds": [1, 2, 3]})
    write(tmp_path / "presets" / "quick.yaml", {"ppo": {"steps": 5}})
    recipe = write(tmp_path / "recipes" / "sokoban.yaml", {
        "defaults": ["../presets/base.yaml", "../presets/quick.yaml"],
        "name": "sokoban-ppo", "env": {"options": {"size": 8}}, "seeds": [9]})
    config = load(Recipe, recipe, ["ppo.lr=2e-6"])
    assert config.name == "sokoban-ppo"
    assert config.ppo == PPO(lr=2e-6, steps=5)  # base < quick < file < overrides
    assert config.env.options == {"size": 8, "boxes": 1}  # dicts merge deeply across files
    assert config.seeds == [9]  # lists are replaced
    # `base` sits under everything, and may be a mapping or a config instance.
    assert load(Recipe, recipe, base={"lora": {"rank": 2}, "ppo": {"lr": 1.0}}).lora == LoRA(rank=2)
    assert load(Recipe, None, base=config) == config


def test_file_errors_name_the_path(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        load(Recipe, tmp_path / "nope.yaml")
    child = write(tmp_path / "child.yaml", {"defaults": ["gone.yaml"], "name": "x"})
    with pytest.raises(ConfigError, match="gone.yaml.*listed in 'defaults' of .*child.yaml"):
        load(Recipe, child)
    write(tmp_path / "a.yaml", {"defaults": ["b.yaml"]})
    write(tmp_path / "b.yaml", {"defaults": ["a.yaml"]})
    with pytest.raises(ConfigError, match="cycle"):
        load(Recipe, tmp_path / "a.yaml")
    bad = write(tmp_path / "bad.yaml", "name: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: invalid YAML"):
        load(Recipe, bad)
    listy = write(tmp_path / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="list.yaml: the top level must be a mapping"):
        load(Recipe, listy)


# ---- round trips ----------------------------------------------------------------------------

def tricky() -> Recipe:
    # Strings that YAML would read as other things unless the dumper quotes them.
    return Recipe(name="1e-6", env=Env("frozenlake", {"slippery": "yes", "k": "null", "n": 3}),
                  ppo=PPO(lr=3e-7, steps=7, clip=(0.1, 0.3), normalize=False),
                  lora=LoRA(rank=4, targets=["true", "0.5"]), seeds=[], out=Path("runs/x"))


def test_to_dict_is_plain_and_round_trips():
    data = to_dict(tricky())
    assert data["ppo"]["clip"] == [0.1, 0.3] and data["out"] == "runs/x"
    assert yaml.safe_load(yaml.safe_dump(data)) == data  # YAML-safe
    assert from_dict(Recipe, data) == tricky()


def test_a_saved_config_reads_its_missing_keys_as_the_defaults():
    @dataclass
    class Run:
        env: Env = field(default_factory=Env)
        ppo: PPO = field(default_factory=PPO)

    saved = {"env": {"options": {"size": 6}}, "ppo": {"lr": 1e-5, "removed": 1}}  # saved by another version
    assert with_defaults(Run, saved) == {"env": {"name": "sokoban", "options": {"size": 6}},
                                         "ppo": {"lr": 1e-5, "steps": 10, "clip": [0.2, 0.28], "normalize": True,
                                                 "removed": 1}}
    assert saved == {"env": {"options": {"size": 6}}, "ppo": {"lr": 1e-5, "removed": 1}}  # not modified


def test_save_load_equality_and_atomicity(tmp_path):
    path = save(tricky(), tmp_path / "run" / "config.yaml")
    assert load(Recipe, path) == tricky()
    assert os.listdir(tmp_path / "run") == ["config.yaml"]  # no temp file left behind
    save(Recipe(name="second"), path)  # overwrite in place
    assert load(Recipe, path) == Recipe(name="second")
    assert os.listdir(tmp_path / "run") == ["config.yaml"]


def test_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = save(Recipe(name="old"), tmp_path / "config.yaml")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        save(Recipe(name="new"), path)
    monkeypatch.undo()
    assert load(Recipe, path).name == "old" and os.listdir(tmp_path) == ["config.yaml"]
    with pytest.raises(yaml.YAMLError):  # unrepresentable value: fails before touching the file
        save(Recipe(name="new", env=Env(options={"x": object()})), path)
    assert load(Recipe, path).name == "old" and os.listdir(tmp_path) == ["config.yaml"]


# ---- listing --------------------------------------------------------------------------------

def test_describe_lists_every_leaf_with_type_default_and_help():
    rows = {key: (type_name, default, help_text) for key, type_name, default, help_text
            in describe(Recipe)}
    assert list(rows) == ["name", "env.name", "env.options", "ppo.lr", "ppo.steps", "ppo.clip",
                          "ppo.normalize", "lora", "lora.rank", "lora.alpha", "lora.targets",
                          "seeds", "out"]
    assert rows["name"] == ("str", MISSING, "run name")
    assert rows["env.name"] == ("Literal['sokoban', 'frozenlake']", "sokoban", "env name")
    assert rows["ppo.lr"] == ("float", 1e-6, "actor learning rate")
    assert rows["ppo.steps"][1] == 20  # the parent's default instance wins over PPO's own
    assert rows["ppo.clip"][:2] == ("tuple[float, float]", (0.2, 0.28))
    assert rows["lora"][1:] == (None, "LoRA adapter; null = full")
    assert rows["lora.rank"] == ("int", 16, "")
    assert rows["out"][0] == "Path | None"
