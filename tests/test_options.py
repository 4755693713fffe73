"""The options registry: parsing and validation of every kind, errors, ``--help`` and generated docs."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from nvfs.option_docs import GENERATOR, HELP_WIDTH, render_markdown, with_readme_table
from nvfs.option_registry import BY_NAME, GENERIC_OPTIONS, OPTIONS, Kind, Option, format_size, parse_size
from nvfs.options import MountOptions, OptionError, default_options, parse_options
from nvfs.vfs import VfsConfig
from tests.conftest import nvfs

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
_KINDS = {kind: [option for option in OPTIONS if option.kind is kind] for kind in Kind}
_BOUNDED = [option for option in OPTIONS if option.bounds is not None]


def _parsed(option: Option, text: str | None) -> object:
    """Where ``-o name[=text]`` lands in the parsed options."""
    item = option.name if text is None else f"{option.name}={text}"
    options = parse_options([item])
    where, _, attribute = option.dest.rpartition(".")
    if where == "fuse":
        return attribute in options.fuse
    if where == "backend":
        return options.backend[attribute]
    return getattr(options.vfs if where == "vfs" else options, attribute)


def _refused(spec: str) -> str:
    with pytest.raises(OptionError) as failure:
        parse_options([spec])
    message = str(failure.value)
    assert "\n" not in message
    return message


# ----- the generated documents and --help ------------------------------------------------------

def test_configuration_md_is_what_the_generator_writes():
    committed = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    assert committed == render_markdown(), f"docs/CONFIGURATION.md is stale: run {GENERATOR}"


def test_readme_options_table_is_what_the_generator_writes():
    readme = (ROOT / "README.md").read_text()
    assert readme == with_readme_table(readme), f"README.md's options table is stale: run {GENERATOR}"


def test_configuration_md_names_every_option_once():
    document = render_markdown()
    for option in OPTIONS:
        assert document.count(f"`{option.usage()}`".replace("|", "\\|")) == 1, option.name


def test_mount_help_lists_every_option_with_its_default_within_100_columns():
    result = nvfs("mount", "--help", env={"COLUMNS": str(HELP_WIDTH)})
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for option in OPTIONS:
        assert re.search(rf"^  {re.escape(option.usage())}( |$)", text, re.MULTILINE), option.name
        assert option.default_text().split()[0] in text, option.name
    assert max(len(line) for line in text.splitlines()) <= HELP_WIDTH


# ----- the registry and MountOptions agree ------------------------------------------------------

def test_every_field_of_mount_options_is_some_option_dest():
    own = {option.dest for option in OPTIONS if "." not in option.dest}
    fields = {field.name for field in dataclasses.fields(MountOptions)} - {"vfs", "fuse", "backend"}
    assert own == fields
    vfs_fields = {field.name for field in dataclasses.fields(VfsConfig)}
    assert {option.dest[4:] for option in OPTIONS if option.dest.startswith("vfs.")} <= vfs_fields


def test_defaults_are_what_the_registry_says():
    options = default_options()
    assert options == parse_options([])
    assert options.backend == {} and options.fuse == set()
    for option in OPTIONS:
        where, _, attribute = option.dest.rpartition(".")
        if where in ("", "vfs"):
            assert getattr(options.vfs if where else options, attribute) == option.initial(), option.name


def test_default_values_are_accepted_by_their_own_option():
    """A default shown as a value (``4M``, ``600``) parses back to itself."""
    for option in OPTIONS:
        value = option.initial()
        if option.shown_default is None and value not in (None, False):
            assert option.parse(option.default_text()) == value, option.name


# ----- each kind --------------------------------------------------------------------------------

@pytest.mark.parametrize("option", _KINDS[Kind.FLAG], ids=lambda option: option.name)
def test_flag_is_on_when_given_and_takes_no_value(option):
    assert _parsed(option, None) is True
    assert _refused(f"{option.name}=1") == f"{option.name} takes no value"


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.kind is not Kind.FLAG], ids=lambda o: o.name)
def test_valued_option_without_a_value_is_refused(option):
    assert _refused(option.name) == f"{option.name} needs a value"


@pytest.mark.parametrize("option", _BOUNDED, ids=lambda option: option.name)
def test_bounds_are_inclusive_and_a_step_past_them_is_refused(option):
    """Each bound alone (the deadlines are also checked together: test_s3_deadlines.py)."""
    low, high = option.bounds
    if option.kind is Kind.SECONDS:
        inside, outside = [f"{low:g}", f"{high:g}"], [f"{high + 1:g}", f"{low / 2 if low else -1:g}"]
    else:
        inside, outside = [str(int(low)), str(int(high))], [str(int(high) + 1)]
        if low > 0 or option.kind is Kind.INT:
            outside.append(str(int(low) - 1))
    assert [option.parse(text) for text in inside] == [low, high]
    for text in outside:
        with pytest.raises(OptionError) as failure:
            option.parse(text)
        message = str(failure.value)
        assert re.fullmatch(rf"{option.name}=\S+ is out of range \(\S+\.\.\S+( seconds)?\)", message), message


def test_int_errors_name_the_option_the_range_and_the_value():
    assert _refused("gpu=-1") == "gpu=-1 is out of range (0..255)"
    assert _refused("threads=four") == "threads takes a whole number, not 'four'"
    assert _parsed(BY_NAME["write_procs"], "0") == 0


@pytest.mark.parametrize(("text", "size"), [
    ("4M", 4 << 20), ("512k", 512 << 10), ("1GiB", 1 << 30), ("1gb", 1 << 30), ("2T", 2 << 40),
    ("1048576", 1 << 20), (" 8M ", 8 << 20),
])
def test_sizes_take_binary_units(text, size):
    assert parse_size(text) == size


def test_size_errors_name_the_option_and_the_value():
    assert _refused("chunk_size=abc") == "chunk_size: 'abc' is not a size (examples: 4M, 512k, 1G)"
    assert _refused("chunk_size=4X") .startswith("chunk_size: '4X' is not a size")
    assert _refused("chunk_size=128M") == "chunk_size=134217728 is out of range (65536..67108864)"
    assert _parsed(BY_NAME["cache_size"], "0") == 0


@pytest.mark.parametrize("size", [1, 1000, 64 << 10, 3 << 20, 16 << 40, 1 << 50, (1 << 20) + 1])
def test_format_size_reads_back(size):
    assert parse_size(format_size(size)) == size


def test_seconds_take_fractions_and_refuse_nan_and_infinity():
    assert _parsed(BY_NAME["metadata_ttl"], "0.5") == 0.5
    assert _parsed(BY_NAME["gc_grace"], "0") == 0.0
    assert _refused("read_timeout=soon") == "read_timeout takes seconds, not 'soon'"
    assert _refused("gc_grace=nan") == "gc_grace=nan is out of range (0..604800 seconds)"
    assert _refused("gc_grace=inf") == "gc_grace=inf is out of range (0..604800 seconds)"
    assert _refused("write_timeout=0.5") == "write_timeout=0.5 is out of range (1..86400 seconds)"


@pytest.mark.parametrize("option", _KINDS[Kind.CHOICE], ids=lambda option: option.name)
def test_choice_takes_each_choice_and_names_them_all_when_refusing(option):
    for choice in option.choices:
        assert _parsed(option, choice) == choice
    message = _refused(f"{option.name}=nonsense")
    assert message.startswith(f"{option.name} must be ") and message.endswith(", not 'nonsense'")
    assert all(choice in message for choice in option.choices)


def test_choice_error_reads_as_a_sentence():
    assert _refused("engine=fast") == "engine must be auto, cpu or gpu, not 'fast'"
    assert _refused("codec=lz4") == "codec must be portable or ans, not 'lz4'"


def test_paths_and_names_are_taken_as_given_but_not_empty():
    assert _parsed(BY_NAME["stage_dir"], "/var/stage") == "/var/stage"
    assert _parsed(BY_NAME["log_file"], "relative.log") == "relative.log"
    assert _parsed(BY_NAME["region"], "eu-west-1") == "eu-west-1"
    assert _refused("cache_dir=") == "cache_dir needs a value"
    assert _refused("profile=") == "profile needs a value"


@pytest.mark.parametrize("url", ["http://127.0.0.1:8333", "https://s3.example.com", "https://h/path"])
def test_endpoint_url_takes_http_urls(url):
    assert parse_options([f"endpoint_url={url}"]).backend == {"endpoint_url": url}


@pytest.mark.parametrize("url", ["s3.example.com", "ftp://host", "http://", ""])
def test_endpoint_url_refuses_what_is_not_an_http_url(url):
    assert _refused(f"endpoint_url={url}") == f"endpoint_url must be an http:// or https:// URL, not {url!r}"


# ----- names ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "hint"), [
    ("chunksize", "chunk_size"), ("cache_sise", "cache_size"), ("readahaed", "readahead"),
    ("allow_others", "allow_other"), ("log_levle", "log_level"),
])
def test_unknown_option_suggests_the_closest_name(name, hint):
    assert _refused(f"{name}=1") == f"unknown option {name!r} (did you mean {hint}?)"


def test_unknown_option_far_from_every_name_gets_no_suggestion():
    assert _refused("bogus=1") == "unknown option 'bogus'"
    assert _refused("bogus") == "unknown option 'bogus'"


def test_generic_mount_options_and_comments_are_ignored():
    specs = [",".join(sorted(GENERIC_OPTIONS)), "x-systemd.automount,x-gvfs-show,comment=backup", ",,"]
    assert parse_options(specs) == default_options()


def test_several_specs_and_items_all_apply():
    options = parse_options(["chunk_size=1M,ro", "level=5", " allow_other , async_close "])
    assert options.vfs.chunk_size == 1 << 20 and options.level == 5
    assert options.fuse == {"ro", "allow_other"} and options.vfs.async_close


def test_the_last_of_repeated_options_wins():
    assert parse_options(["level=2,level=7"]).level == 7


def test_s3_settings_are_kept_only_where_given():
    options = parse_options(["region=us-east-1,connect_timeout=2"])
    assert options.backend == {"region": "us-east-1", "connect_timeout": 2.0}


def test_fetch_procs_default_follows_the_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert default_options().fetch_procs == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert default_options().fetch_procs == 0
