"""evalstop-sim: one run, the paper command, and bad input (one line naming the flag, exit code 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from platform_sim.cli import main


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["run", "--base", "lifo"], "--base"),
        (["run", "--stop", "magic"], "--stop"),
        (["run", "--seed", "-1"], "--seed"),
        (["run", "--sigma", "-0.1"], "--sigma"),
        (["run", "--hack-rate", "1.5"], "--hack-rate"),
        (["run", "--hack-rate", "-0.5"], "--hack-rate"),
        (["run", "--k", "0"], "--k"),
        (["run", "--min-delta", "-1"], "--min-delta"),
        (["run", "--detector", "nope"], "--detector"),
        (["run", "--detector-param", "window"], "--detector-param"),
        (["run", "--detector-param", "window=3"], "--detector-param"),
        (["paper", "--seeds", "0"], "--seeds"),
        (["paper", "--backend", "slurm"], "--backend"),
        (["paper", "--workers", "0"], "--workers"),
    ],
)
def test_bad_input_one_line_naming_the_flag_exit_2(argv, flag, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and flag in err, err


def test_console_script_exit_code():
    proc = subprocess.run(
        [sys.executable, "-m", "platform_sim.cli", "run", "--k", "0"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "--k" in proc.stderr and proc.stderr.count("\n") == 1


def test_run_json(capsys):
    assert (
        main(["run", "--base", "fifo", "--stop", "evalstop", "--seed", "3", "--jobs", "60", "--k", "3", "--json"]) == 0
    )
    m = json.loads(capsys.readouterr().out)
    assert m["jobs"] == 60 and m["scheduler"] == "fifo+evalstop"
    assert m["config"]["detector"] == {"name": "k-decline", "params": {"k": 3, "min_delta": 0.0}}
    for key in ("precision", "recall", "fpr", "fpr_healthy_rlhf", "jct_mean_h", "wasted_gpu_h", "regret"):
        assert key in m


def test_run_table_and_generic_detector_params(capsys):
    assert main(["run", "--jobs", "30", "--detector", "k-decline", "--detector-param", "min_delta=0.01"]) == 0
    out = capsys.readouterr().out
    assert "srtf-est + evalstop" in out and "precision" in out


def test_paper_json_and_files(tmp_path, capsys):
    out_dir = tmp_path / "paper"
    assert (
        main(
            [
                "paper",
                "--seeds",
                "2",
                "--jobs",
                "40",
                "--out",
                str(out_dir),
                "--json",
                "--backend",
                "serial",
                "--no-progress",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    fields = {
        "base",
        "stop",
        "precision",
        "recall",
        "fpr",
        "fpr_healthy_rlhf",
        "jct_mean_h",
        "jct_gain_pct",
        "wasted_gpu_h",
        "wasted_reduction_pct",
        "regret",
        "delay_evals",
    }
    assert [r["stop"] for r in res["main"]] == ["none", "evalstop", "stop-at-p", "loss-plateau", "oracle"]
    for r in res["main"]:
        assert fields <= set(r)
    assert {(r["base"], r["stop"]) for r in res["composability"]} == {
        (b, s) for b in ("fifo", "sjf-est", "srtf-est", "loss-aware") for s in ("none", "evalstop")
    }
    assert [r["sigma"] for r in res["noise"]] == [0.01, 0.02, 0.03, 0.05, 0.08, 0.12]
    assert [r["hack_rate"] for r in res["hack_rate"]] == [0.2, 0.4, 0.6, 0.8]
    assert [r["k"] for r in res["k"]] == [1, 2, 3, 4, 5]
    names = {p.name for p in out_dir.iterdir()}
    assert {
        "report.md",
        "results.json",
        "main.png",
        "composability.png",
        "noise_sweep.png",
        "hack_rate_sweep.png",
        "k_sweep.png",
    } <= names
    assert "## Main table" in (out_dir / "report.md").read_text()
    assert json.loads((out_dir / "results.json").read_text())["main"][1]["stop"] == "evalstop"


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["paper", "--help"])
    assert exc.value.code == 0 and "--seeds" in capsys.readouterr().out


@pytest.mark.parametrize(
    "command, flag",
    [
        ("run", "--stop"),
        ("paper", "--seeds"),
        ("sweep", "GRID"),
        ("replay", "--score-scale"),
        ("detectors", "--parts"),
        ("benchmark", "--tune-envs"),
        ("tune", "--gpus-per-trial"),
    ],
)
def test_every_command_has_help(command, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0 and flag in capsys.readouterr().out


def _sim_import_graph() -> dict[str, set[str]]:
    """Module -> the platform_sim.sim modules it imports, at top level or inside functions."""
    import ast
    from pathlib import Path

    import platform_sim.sim as pkg

    root = Path(pkg.__file__).parent
    names = {p.stem for p in root.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level == 1:
                    targets = [mod.split(".")[0]] if mod else [a.name for a in node.names]
                elif mod.startswith("platform_sim.sim."):
                    targets = [mod.split(".")[2]]
                elif mod == "platform_sim.sim":
                    targets = [a.name for a in node.names]
                else:
                    targets = []
                deps |= {t for t in targets if t in names}
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[2] for a in node.names if a.name.startswith("platform_sim.sim.")}
        graph[path.stem] = deps - {path.stem}
    return graph


def test_no_import_cycle_in_the_simulator_even_through_imports_inside_functions():
    graph = _sim_import_graph()
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            assert state.get(dep) != 1, f"import cycle: {' -> '.join(stack + [node, dep])}"
            if dep not in state:
                visit(dep, stack + [node])
        state[node] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [])
    # the commands import the library; no library module imports the commands or their flag helpers
    commands = {"cli", "cli_args", "cli_output"}
    for mod, deps in graph.items():
        if mod not in commands:
            assert not deps & commands, (mod, deps)


def test_the_engine_never_imports_a_study_nor_an_adapter_even_inside_functions():
    import ast
    from pathlib import Path

    import platform_sim.sim as pkg

    root = Path(pkg.__file__).parent
    relative = []
    for path in sorted(root.rglob("*.py")):
        package = "platform_sim." + ".".join(path.relative_to(root.parent).parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                mods = [f"{base}.{node.module}" if base and node.module else base or node.module or ""]
                relative += mods if node.level else []
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            for mod in mods:
                assert not mod.startswith(("platform_sim.studies", "platform_sim.integrations")), (path, mod)
    assert {"platform_sim.sim.policies.views", "platform_sim.sim.engine"} <= set(relative)  # relative ones resolved


def test_bases_defined_once():
    from platform_sim.sim import experiments
    from platform_sim.studies import replay

    assert replay.REPLAY_BASES is experiments.BASES and replay.REPLAY_STOPS is experiments.MAIN_STOPS


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["run", "--jobs", "0"], "--jobs"),
        (["run", "--gpus", "8"], "--gpus"),
        (["run", "--evals", "1"], "--evals"),
        (["run", "--load", "0"], "--load"),
        (["run", "--est-error", "-1"], "--est-error"),
        (["run", "--hack-gamma", "0"], "--hack-gamma"),
    ],
)
def test_workload_config_checks_are_reported_with_the_flag(argv, flag, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err, err
