"""`bmrl.rundir`: the one rule for run directories, applied by every command that writes one."""

import os

import pytest


@pytest.mark.parametrize("command", [["train", "--no-progress"], ["sft"], ["reproduce"], ["eval", "--policy", "p"],
                                     ["compare", "--base", "scripted:oracle", "--trained", "scripted:random"]])
def test_cli_refuses_unwritable_out_dir(tmp_path, capsys, command):
    """Every command that writes a run directory refuses one it cannot write (the one rule of
    bmrl.rundir): exit 2 with a message, before any work, nothing written, no traceback."""
    from bmrl.cli import main

    (tmp_path / "file").write_text("x")
    (tmp_path / "cfg.yaml").write_text("seed: 0\n")
    try:
        status = main([command[0], "--config", str(tmp_path / "cfg.yaml"), f"out_dir={tmp_path / 'file' / 'run'}",
                       *command[1:]])
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and "is not a directory" in err and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["cfg.yaml", "file"]
