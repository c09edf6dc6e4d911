"""systemd units: rendered by tools/install-service.sh, then `systemd-analyze verify` must be clean."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service_helpers import fake_install_root

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.executable).parent.parent


def _render(out: Path, *extra: str) -> None:
    subprocess.run([str(ROOT / "tools/install-service.sh"), "--render", str(out),
                    "--venv", str(VENV), *extra], check=True, capture_output=True, timeout=60)


def _verify(folder: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze missing: install the Debian package 'systemd' (tools/bootstrap.sh)"
    return subprocess.run([exe, "verify", "--man=no", "./edge-runtime.socket",
                           "./edge-runtime.service"], cwd=folder, capture_output=True, text=True,
                          timeout=120)


def _unit_messages(stderr: str) -> list[str]:
    # verify may also print notes about the host's own units; only ours matter
    return [line for line in stderr.splitlines() if "edge-runtime." in line]


def test_rendered_units_verify_clean(tmp_path):
    _render(tmp_path, "--memory-high", "3G", "--memory-max", "3500M")
    service = (tmp_path / "edge-runtime.service").read_text()
    assert _exec_argv(service)[:5] == [f"{VENV}/bin/edge-runtime", "serve", "--device", "auto",
                                       "--config"]
    assert "MemoryHigh=3G" in service and "MemoryMax=3500M" in service
    assert "Type=notify" in service and "WatchdogSec=" in service
    settings = [line.split("=", 1)[0] for line in service.splitlines() if not line.startswith("#")]
    assert "MemoryDenyWriteExecute" not in settings  # Triton and CUDA JIT need W+X pages
    assert "ProcSubset" not in settings  # would hide /proc/meminfo from the memory guard
    proc = _verify(tmp_path)
    assert proc.returncode == 0 and not _unit_messages(proc.stderr), proc.stderr


@pytest.mark.parametrize("old,new", [("Type=notify", "Type=notfy"),
                                     ("WantedBy=", "WatnedBy="),
                                     ("ListenStream=", "ListenStrem=")])
def test_verify_catches_a_broken_unit(tmp_path, old, new):
    _render(tmp_path)
    for name in ("edge-runtime.service", "edge-runtime.socket"):
        p = tmp_path / name
        p.write_text(p.read_text().replace(old, new, 1))
    proc = _verify(tmp_path)
    assert proc.returncode != 0 or _unit_messages(proc.stderr)


def test_the_template_serves_on_the_device_torch_finds():
    """The unit as shipped (and as rendered) picks the GPU where CUDA exists, else the CPU."""
    argv = _exec_argv((ROOT / "systemd/edge-runtime.service").read_text())
    assert argv[1:4] == ["serve", "--device", "auto"], argv


def test_socket_unit_hands_over_a_0660_listening_socket():
    text = (ROOT / "systemd/edge-runtime.socket").read_text()
    assert "SocketMode=0660" in text and "Accept=no" in text
    streams = [line for line in text.splitlines() if line.startswith("ListenStream=")]
    assert streams == ["ListenStream=/run/edge-runtime.sock"]  # no TCP unless asked


@pytest.mark.parametrize("listen,stream,keys", [("localhost:8080", "127.0.0.1:8080", False),
                                                ("[::1]:08080", "[::1]:8080", False),
                                                ("0.0.0.0:8443", "0.0.0.0:8443", True)])
def test_a_tcp_listener_is_a_second_listen_stream_and_keys_reach_serve(tmp_path, listen, stream,
                                                                       keys):
    key_args = []
    if keys:
        key_file = tmp_path / "my keys"
        key_file.write_text("k" * 40 + "\n")
        key_file.chmod(0o600)
        key_args = ["--api-keys", str(key_file)]
    out = tmp_path / "units"
    _render(out, "--listen", listen, *key_args, "--memory-high", "3G", "--memory-max", "4G")
    socket_unit = (out / "edge-runtime.socket").read_text()
    streams = [line for line in socket_unit.splitlines() if line.startswith("ListenStream=")]
    assert streams == ["ListenStream=/run/edge-runtime.sock", f"ListenStream={stream}"]
    argv = _exec_argv((out / "edge-runtime.service").read_text())
    assert argv[-2:] == (["--api-keys", str(key_file)] if keys else ["--model",
                                                                      "smollm2-135m-instruct"])
    assert "--listen" not in argv  # the socket comes from systemd
    proc = _verify(out)
    assert proc.returncode == 0 and not _unit_messages(proc.stderr), proc.stderr


def test_memory_limits_come_from_the_budget_plan(tmp_path):
    from edge_runtime.budget import load_budget
    from edge_runtime.engine.placement import resolve
    from edge_runtime.plan import model_for_plan
    from edge_runtime.plan import make_plan
    from edge_runtime.guard_config import GuardConfig
    from edge_runtime.service.unit_limits import RUNTIME_OVERHEAD, unit_memory_limits

    config = ROOT / "configs/orin/orin-nx-16gb.yaml"
    _render(tmp_path, "--config", str(config))
    budget = load_budget(config)
    guard = GuardConfig.from_dict(dict(budget.guard))
    placement = resolve("auto", None, budget, need_device=False)  # what serve will load here
    model, weight_bytes, name = model_for_plan("smollm2-135m-instruct", placement.weight_dtype,
                                               "auto", placement.device)
    plan = make_plan(budget, model, weight_bytes, model_name=name)
    high, hard = unit_memory_limits(budget, plan, guard)
    planned = (plan.weight_bytes + plan.pool_bytes + plan.inline_arena_bytes
               + plan.recent_window_bytes + budget.activation_reserve + RUNTIME_OVERHEAD)
    # the planned load reads two hystereses below the guard's high band of MemoryHigh, and
    # MemoryHigh sits at the guard's critical fraction of MemoryMax
    band_lo = guard.high_used_fraction - guard.hysteresis
    assert abs(planned / high - (guard.high_used_fraction - 2 * guard.hysteresis)) < 1e-6
    assert high / hard >= guard.critical_used_fraction and not band_lo <= high / hard < 0.93
    assert high < hard < budget.device_memory
    service = (tmp_path / "edge-runtime.service").read_text()
    assert f"MemoryHigh={high}\n" in service and f"MemoryMax={hard}\n" in service
    proc = _verify(tmp_path)
    assert proc.returncode == 0 and not _unit_messages(proc.stderr), proc.stderr


def _run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "tools/install-service.sh"), *args], capture_output=True,
                          text=True, timeout=60)


def _exec_argv(service: str) -> list[str]:
    """ExecStart= split as systemd does (double quotes, \\-escapes, %% and $$)."""
    (line,) = [x for x in service.splitlines() if x.startswith("ExecStart=")]
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line[len("ExecStart="):])]


@pytest.mark.parametrize("args,message", [
    (["--config"], "--config needs a value"),
    (["--render"], "--render needs a value"),
    (["--render", "--config", "cpu-dev"], "--render needs a value"),
    (["--config", "/nope/x.yaml"], "--config /nope/x.yaml: no such budget file or name (known: "),
    (["--memory-high", "foo", "--memory-max", "4G"], "--memory-high/--memory-max foo"),
    (["--venv", "relative/venv"], "must be absolute paths"),
    (["--user", "bad user"], "not a valid system user name"),
    (["--listen"], "--listen needs a value"),
    (["--listen", "0.0.0.0:8080"], "--listen 0.0.0.0:8080 is not a loopback address: anyone who "
                                   "can reach it could use the model; give --api-keys FILE too"),
    (["--listen", "[::]:8080"], "--listen [::]:8080 is not a loopback address"),
    (["--listen", "jetson.local:8080"], "--listen jetson.local:8080: give HOST:PORT with an IP "
                                        "address"),
    (["--listen", "127.0.0.1"], "--listen 127.0.0.1: give HOST:PORT"),
    (["--listen", "127.0.0.1:0"], "the port must be 1 to 65535"),
    (["--listen", "127.0.0.1:70000"], "the port must be 1 to 65535"),
    (["--api-keys", "/nope/keys"], "--api-keys /nope/keys: no such readable file"),
])
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, args, message):
    out = tmp_path / "units"
    proc = _run_script("--render", str(out), *args) if args[0] != "--render" else _run_script(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "unbound variable" not in proc.stderr and not out.exists()


def test_a_budget_the_plan_refuses_stops_the_render(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("device_memory: nonsense\n")
    proc = _run_script("--render", str(tmp_path / "units"), "--venv", str(VENV), "--config", str(bad))
    assert proc.returncode == 2 and "device_memory" in proc.stderr, proc.stderr
    assert not (tmp_path / "units").exists()  # never the template's limits in silence


def test_execstart_keeps_odd_paths_whole_and_resolves_budget_names(tmp_path):
    folder = tmp_path / "my budgets"
    folder.mkdir()
    config = folder / "b 1.yaml"
    config.write_text((ROOT / "configs/orin/cpu-dev.yaml").read_text())
    model = 'my $odd%mo"del\\x'
    _render(tmp_path / "a", "--config", str(config), "--model", model,
            "--memory-high", "3G", "--memory-max", "4G")
    argv = _exec_argv((tmp_path / "a/edge-runtime.service").read_text())
    assert argv == [f"{VENV}/bin/edge-runtime", "serve", "--device", "auto", "--config", str(config),
                    "--model", model]
    proc = _verify(tmp_path / "a")
    assert proc.returncode == 0 and not _unit_messages(proc.stderr), proc.stderr
    # a budget name, as `serve --config` takes it, becomes that budget's file, not ./cpu-dev
    _render(tmp_path / "b", "--config", "cpu-dev", "--memory-high", "3G", "--memory-max", "4G")
    argv = _exec_argv((tmp_path / "b/edge-runtime.service").read_text())
    assert argv[5] == str(ROOT / "configs/orin/cpu-dev.yaml")




def _install(tmp_path: Path, env: dict, config: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "tools/install-service.sh"), "--config", config,
                           "--prefix", str(tmp_path / "opt"), "--venv", str(tmp_path / "venv"),
                           "--user", "edge-test"], capture_output=True, text=True, timeout=120,
                          env=env)


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="the install path runs only as root (every system change is stubbed)")
def test_install_touches_etc_only_after_the_plan_and_restarts_a_running_service(tmp_path):
    env, log = fake_install_root(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("device_memory: nonsense\n")
    proc = _install(tmp_path, env, str(bad))
    assert proc.returncode == 2 and "device_memory" in proc.stderr, proc.stderr
    calls = log.read_text()
    assert "/etc/" not in calls and "systemctl" not in calls, calls  # the old install stands
    log.unlink()
    proc = _install(tmp_path, env, "cpu-dev")
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert any(c.startswith("install -m 0644") and c.endswith("/etc/systemd/system/")
               for c in calls), calls
    assert calls[-3:] == ["systemctl daemon-reload", "systemctl enable --now edge-runtime.socket",
                          "systemctl try-restart edge-runtime.service"], calls


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="the install path runs only as root (every system change is stubbed)")
def test_install_puts_the_keys_file_where_only_the_service_user_reads_it(tmp_path):
    env, log = fake_install_root(tmp_path)
    keys = tmp_path / "keys"
    keys.write_text("k" * 40 + "\n")
    proc = subprocess.run([str(ROOT / "tools/install-service.sh"), "--config", "cpu-dev",
                           "--prefix", str(tmp_path / "opt"), "--venv", str(tmp_path / "venv"),
                           "--user", "edge-test", "--memory-high", "3G", "--memory-max", "4G",
                           "--listen", "0.0.0.0:8080", "--api-keys", str(keys)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert f"install -m 0600 -o edge-test -g edge-test {keys} /etc/edge-runtime/api-keys" in calls
    assert calls.index(f"install -m 0600 -o edge-test -g edge-test {keys} "
                       "/etc/edge-runtime/api-keys") < calls.index("systemctl daemon-reload")
    assert "the API also listens on 0.0.0.0:8080" in proc.stdout, proc.stdout


def test_the_template_limits_agree_with_the_default_guard():
    from edge_runtime.guard_config import GuardConfig
    from edge_runtime.service.unit_limits import check_unit_limits, parse_systemd_size

    text = (ROOT / "systemd/edge-runtime.service").read_text()
    value = {k: v for k, _, v in (line.partition("=") for line in text.splitlines())}
    high = parse_systemd_size(value["MemoryHigh"], 8 << 30, "MemoryHigh")
    hard = parse_systemd_size(value["MemoryMax"], 8 << 30, "MemoryMax")
    check_unit_limits(high, hard, 0, GuardConfig())


def test_install_refuses_overrides_inside_the_guard_band(tmp_path):
    """The limits the orin-nx-16gb unit had (MemoryHigh 85.2% of MemoryMax) are refused with the
    numbers; nothing is written."""
    out = tmp_path / "units"
    proc = _run_script("--render", str(out), "--venv", str(VENV), "--config", "orin-nx-16gb",
                       "--memory-high", "11274142336", "--memory-max", "13233699142")
    assert proc.returncode == 2, proc.stderr
    assert "MemoryHigh 10.50 GiB is 85.2% of MemoryMax 12.32 GiB, inside the memory guard's " \
           "high band [82.0%, 93.0%)" in proc.stderr
    assert not out.exists()


def test_limit_nofile_holds_the_default_connection_cap():
    """The service's descriptors (service.max_connections + the rest of the process) must fit the
    unit's soft LimitNOFILE, and the hard one must leave room to raise the cap."""
    from edge_runtime.service.connections import RESERVED_DESCRIPTORS
    from edge_runtime.service_limits import ServiceLimits

    text = (ROOT / "systemd/edge-runtime.service").read_text()
    values = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("LimitNOFILE=")]
    assert len(values) == 1, values
    soft, hard = (int(v) for v in values[0].split(":"))
    assert ServiceLimits().max_connections + RESERVED_DESCRIPTORS <= soft <= hard
