"""The options the training commands share (``slmlab.commands._common``)."""

from __future__ import annotations

import argparse

from slmlab.commands._common import add_run_arguments, run_overrides


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slmlab x")
    add_run_arguments(p, "RESUME-HELP", "CHANGE-HELP")
    return p


def test_run_arguments_parse_with_their_defaults():
    args = _parser().parse_args([])
    assert (args.out, args.steps, args.resume, args.resume_from, args.allow_change) == (None, None, False, None, [])
    args = _parser().parse_args(["--out", "runs/a", "--steps", "7", "--resume", "--resume-from", "runs/b",
                                 "--allow-change", "seed", "--allow-change", "data"])
    assert (args.out, args.steps, args.resume, args.resume_from, args.allow_change) == ("runs/a", 7, True, "runs/b",
                                                                                       ["seed", "data"])


def test_run_arguments_carry_the_commands_own_help():
    text = _parser().format_help()
    assert "RESUME-HELP" in text and "CHANGE-HELP" in text and "run folder (= out_dir=...)" in text


def test_run_overrides_name_only_what_was_given_out_dir_first():
    assert run_overrides(_parser().parse_args([])) == []
    assert run_overrides(_parser().parse_args(["--steps", "5"])) == ["max_steps=5"]
    assert run_overrides(_parser().parse_args(["--steps", "5", "--out", "o"])) == ["out_dir=o", "max_steps=5"]
