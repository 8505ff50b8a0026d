"""The command line as a user meets it: help texts, and one clear line for each kind of bad input."""

import subprocess
import sys

import pytest
from tiny_models import save_tiny_model, tiny_tokenizer

from pipeline.cli import COMMANDS


def branchpoint(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    # progress bars of model loading may precede it; the error itself is exactly one line
    errors = [line for line in result.stderr.splitlines() if line.startswith("branchpoint ")]
    assert len(errors) == 1 and "error:" in errors[0], result.stderr
    first = errors[0]
    for fragment in fragments:
        assert fragment in first, first


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_subcommand_has_help(command):
    result = branchpoint(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "--set SECTION.KEY=VALUE" in result.stdout and "--params" in result.stdout


def test_top_level_help_lists_commands():
    result = branchpoint("--help")
    assert result.returncode == 0
    for command in COMMANDS:
        assert command in result.stdout


def test_info_without_models_prints_config_and_prompt_counts():
    result = branchpoint("info", "--no-models", "--set", "prompts.max_prompts=12")
    assert result.returncode == 0, result.stderr
    assert '"target": "embedded:smollm2-135m-instruct"' in result.stdout
    assert "prompts: 48 total" in result.stdout  # 4 sources x 12


def test_malformed_params_file(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("decode:\n  max_new_tokenz: 3\n")
    assert_one_line_error(branchpoint("info", "--no-models", "--params", str(bad)), "decode.max_new_tokenz", str(bad))


def test_unknown_prompt_set():
    result = branchpoint("info", "--no-models", "--set", "prompts.sets=[no_such_set]")
    assert_one_line_error(result, "no_such_set", "humaneval")


def test_mismatched_tokenizer_pair(tmp_path):
    target = save_tiny_model(tmp_path / "t", 2, seed=0)
    draft = save_tiny_model(tmp_path / "d", 1, seed=1, tokenizer=tiny_tokenizer(rename={7: "seven"}))
    result = branchpoint("info", "--set", f"model.target=hf:{target}", "--set", f"model.draft=hf:{draft}")
    assert_one_line_error(result, "do not share a tokenizer", "seven")


def test_info_loads_a_local_pair(tmp_path):
    target = save_tiny_model(tmp_path / "t", 2, seed=0)
    draft = save_tiny_model(tmp_path / "d", 1, seed=1)
    result = branchpoint("info", "--set", f"model.target=hf:{target}", "--set", f"model.draft=hf:{draft}")
    assert result.returncode == 0, result.stderr
    assert '"vocab_size": 64' in result.stdout
