"""``evalstop-sim sweep`` and the runner backends: the same sweep on the process pool and on local Ray gives the same
results; grid files are validated before anything runs; bad flags exit 2 with a one-line reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from platform_sim.cli import main
from platform_sim.sim.sweep import SweepFileError, cell_policies, load_sweep_file, parse_sweep

GRID_TOML = """
seeds = 3
[workload]
gpus = 64
jobs = 40
[grid]
sigma = [0.01, 0.08]
k = [1, 2]
[[policies]]
stop = "evalstop"
[[policies]]
stop = "stop-at-p"
params = { p = 0.65 }
"""

GRID_YAML = """
seeds: 3
workload: {gpus: 64, jobs: 40}
grid:
  sigma: [0.01, 0.08]
  k: [1, 2]
policies:
  - stop: evalstop
  - stop: stop-at-p
    params: {p: 0.65}
"""


@pytest.fixture
def grid(tmp_path: Path) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(GRID_TOML)
    return path


def _sweep_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["sweep", *argv, "--json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


def test_same_sweep_on_pool_and_local_ray_gives_identical_results(grid: Path, capsys) -> None:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    from platform_sim.sim.ray_backend import RayRunner

    pool = _sweep_json(capsys, str(grid), "--backend", "pool", "--workers", "2")
    serial = _sweep_json(capsys, str(grid), "--backend", "serial")
    # One local Ray instance for both (starting Ray is the slow part): the runner starts its own, returns results in
    # task order over uneven chunks and shuts it down; the sweep's runner finds it running, uses it, leaves it on.
    done: list[int] = []
    with RayRunner(workers=2, chunksize=3) as runner:
        out = runner.map(abs, [-i for i in range(10)], progress=done.append)
        assert ray.is_initialized()
        on_ray = _sweep_json(capsys, str(grid), "--backend", "ray", "--workers", "2")
        assert ray.is_initialized()
    assert not ray.is_initialized()
    assert out == list(range(10))
    assert sum(done) == 10
    assert pool["config"]["tasks"] == on_ray["config"]["tasks"] == 4 * 3
    assert (pool["config"]["backend"], on_ray["config"]["backend"]) == ("pool", "ray")
    assert len(pool["rows"]) == 4 * 2
    # Exactly equal, every metric and confidence interval: a task's result depends only on its seed.
    assert pool["rows"] == on_ray["rows"] == serial["rows"]
    # And the sweep did sweep: k=1 stops more healthy jobs than k=2 at sigma 0.08 (the noise the k rule absorbs).
    by = {(r["sigma"], r["k"], r["stop"]): r for r in pool["rows"]}
    assert by[(0.08, 1, "evalstop")]["fpr"] > by[(0.08, 2, "evalstop")]["fpr"]


def test_ray_runner_refuses_bad_sizes() -> None:
    pytest.importorskip("ray", reason="the ray extra is not installed")
    from platform_sim.sim.ray_backend import RayRunner

    with pytest.raises(ValueError, match="workers"):
        RayRunner(workers=0)
    with pytest.raises(ValueError, match="chunksize"):
        RayRunner(chunksize=0)


def test_toml_and_yaml_grids_are_the_same_sweep(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    (tmp_path / "g.toml").write_text(GRID_TOML)
    (tmp_path / "g.yaml").write_text(GRID_YAML)
    a, b = load_sweep_file(tmp_path / "g.toml"), load_sweep_file(tmp_path / "g.yaml")
    assert (a.seeds, a.workload, a.axes, a.policies) == (b.seeds, b.workload, b.axes, b.policies)
    assert a.workload.n_jobs == 40  # the 'jobs' alias
    assert a.cells() == [
        {"sigma": 0.01, "k": 1},
        {"sigma": 0.01, "k": 2},
        {"sigma": 0.08, "k": 1},
        {"sigma": 0.08, "k": 2},
    ]


def test_axes_reach_the_scheduler_and_detector() -> None:
    spec = parse_sweep(
        {
            "seeds": [4, 7],
            "grid": {"base": ["fifo"], "detector.min_delta": [0.01], "k": [3], "stop-at-p.p": [0.5]},
            "policies": [{"stop": "evalstop"}, {"stop": "stop-at-p"}],
        }
    )
    assert spec.seeds == (4, 7)
    evalstop, stop_at_p = cell_policies(spec, spec.cells()[0])
    assert (evalstop.base, evalstop.detector) == ("fifo", {"name": "k-decline", "params": {"k": 3, "min_delta": 0.01}})
    assert (stop_at_p.base, stop_at_p.stop_params, stop_at_p.detector) == ("fifo", {"p": 0.5}, None)
    stops = parse_sweep({"seeds": 1, "grid": {"stop": ["none", "oracle"]}})
    assert [cell_policies(stops, c)[0].stop for c in stops.cells()] == ["none", "oracle"]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"seeds": 0}, "seeds must be >= 1"),
        ({"seeds": [1, 1]}, "seed twice"),
        ({"seeds": "ten"}, "seeds must be a count"),
        ({"grid": {"sigmaa": [0.1]}}, "'sigmaa' is not a sweepable parameter"),
        ({"grid": {"sigma": []}}, "'sigma' has no values"),
        ({"grid": {"sigma": [0.01, -0.5]}}, r"cell \{'sigma': -0.5\}: sigma must be"),
        ({"grid": {"base": ["lifo"]}}, "unknown base scheduler .lifo."),
        ({"grid": {"k": [0]}}, "k must be"),
        ({"workload": {"gpuz": 8}}, r"\[workload\] unknown parameter 'gpuz'"),
        ({"grid": {"stop": ["none"]}, "policies": [{"stop": "evalstop"}]}, "not both"),
        ({"policies": [{"base": "fifo"}]}, "at least stop"),
        ({"policies": [{"stop": "evalstop", "loss": 1}]}, "unknown key"),
        ({"extra": 1}, "unknown top-level key"),
        ({"grid": {"lifo.p": [1]}}, "'lifo.p' is not a sweepable parameter"),
    ],
)
def test_bad_grids_are_refused_before_anything_runs(data: dict, message: str) -> None:
    with pytest.raises(SweepFileError, match=message):
        parse_sweep(data, source="g.toml")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--address", "ray://head:10001"], "--address needs --backend ray"),
        (["--workers", "0"], "--workers must be >= 1"),
        (["--seeds", "0"], "--seeds must be >= 1"),
        (["--backend", "spark"], "--backend: invalid choice"),
    ],
)
def test_bad_flags_exit_2_with_one_line(grid: Path, capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc_info:
        code = main(["sweep", str(grid), *argv])
        raise SystemExit(code)
    assert exc_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.toml", None, "cannot read"),
        ("g.toml", "seeds = [", "not valid TOML"),
        ("g.yml", "grid: [unclosed", "not valid YAML"),
        ("g.json", "{}", "unknown grid format"),
    ],
)
def test_unreadable_grid_file_exits_2_naming_the_file(
    tmp_path: Path, capsys, name: str, content: str | None, message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evalstop-sim sweep: error: GRID ") and str(path) in err and message in err
    assert "\n" not in err


def test_ray_backend_without_ray_installed_exits_2_naming_the_extra(grid: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # what `import ray` sees when it is not installed
    assert main(["sweep", str(grid), "--backend", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "evalstop-sim sweep: error: --backend ray needs Ray: pip install 'evalstop[ray]'"
