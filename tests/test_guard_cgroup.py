"""The guard's used fraction on recorded cgroup and meminfo samples (tests/data/guard_samples).

v1_*: recorded on a cgroup v1 machine (kernel 6.18) in a parent cgroup limited to 512 MiB with an
unlimited child holding the process: `v1_cache_heavy` after writing and reading a 400 MiB file
inside the child, `v1_anon_heavy` with 380 MiB of anonymous memory written. v2_*: the kernel's
v2 file layout (memory.current / memory.max / memory.high / memory.stat) for a unit in
system.slice whose slice, not the unit, is limited to 2 GiB, after a 900 MiB file read, under
anonymous load, and with the unit's own MemoryHigh below its MemoryMax.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from edge_runtime.guard.cgroup_memory import CgroupMemory, TelemetryError
from edge_runtime.guard.telemetry import JtopSource, ProcMeminfoSource

SAMPLES = Path(__file__).parent / "data" / "guard_samples"
MIB = 1 << 20


def _v1_source(tmp_path: Path, case: str, visible_parent: bool = True) -> ProcMeminfoSource:
    """The recorded parent/svc files as /sys/fs/cgroup/memory/parent/svc; without the parent
    visible (a container's namespace), svc's files sit at the mount root."""
    src = SAMPLES / case
    mount = tmp_path / "cgroup" / "memory"
    svc = mount / "parent" / "svc" if visible_parent else mount
    if visible_parent:
        shutil.copytree(src / "parent", mount / "parent")
    shutil.copytree(src / "svc", svc, dirs_exist_ok=True)
    proc = tmp_path / "proc_cgroup"
    proc.write_text("4:memory:/parent/svc\n0::/\n" if visible_parent else "4:memory:/\n0::/\n")
    return ProcMeminfoSource(str(src / "meminfo"), str(tmp_path / "cgroup"), str(proc))


def _v2_source(case: str) -> ProcMeminfoSource:
    proc = SAMPLES / case / "proc_cgroup"
    if not proc.exists():
        proc.write_text("0::/system.slice/edge-runtime.service\n")
    return ProcMeminfoSource(str(SAMPLES / case / "meminfo"), str(SAMPLES / case), str(proc))


def test_v1_page_cache_is_not_pressure(tmp_path):
    """400 MiB of file cache in a 512 MiB cgroup: usage reads 80% (the old fraction: high), the
    working set ~2%."""
    s = _v1_source(tmp_path, "v1_cache_heavy").read()
    c = s.cgroup
    assert c.version == "v1" and c.limit_bytes == 512 * MIB and c.path == "/parent"
    assert c.limit_file == "memory.limit_in_bytes"
    assert c.usage_bytes == 431128576 and c.inactive_file_bytes == 419430400  # the parent's
    assert c.usage_bytes / c.limit_bytes > 0.80
    assert c.working_set_bytes == 431128576 - 419430400
    assert s.cgroup_fraction < 0.03 and s.used_fraction < 0.10


def test_v1_anonymous_memory_is_pressure(tmp_path):
    s = _v1_source(tmp_path, "v1_anon_heavy").read()
    c = s.cgroup
    assert c.path == "/parent"  # its usage (406405120) includes the child's (406392832)
    assert c.inactive_file_bytes == 0 and c.working_set_bytes == c.usage_bytes == 406405120
    assert abs(s.used_fraction - 406405120 / (512 * MIB)) < 1e-12  # 0.757: the cgroup binds
    assert s.machine_fraction < 0.1


def test_v1_hidden_parent_limit_from_hierarchical_memory_limit(tmp_path):
    """Only the service's own cgroup is visible (unlimited itself); memory.stat's
    hierarchical_memory_limit still shows the parent's 512 MiB."""
    s = _v1_source(tmp_path, "v1_anon_heavy", visible_parent=False).read()
    assert s.cgroup.limit_bytes == 512 * MIB
    assert s.cgroup.limit_file == "hierarchical_memory_limit"
    assert abs(s.cgroup_fraction - 406392832 / (512 * MIB)) < 1e-12


def test_v2_cache_heavy_with_a_limited_parent():
    """The unit has no limit, its slice has 2 GiB: the slice binds. 1950 MiB used of which
    930 MiB inactive file: 0.50, where usage / limit would read 0.95 (critical)."""
    s = _v2_source("v2_cache_heavy_limited_parent").read()
    c = s.cgroup
    assert (c.version, c.path, c.limit_file) == ("v2", "/system.slice", "memory.max")
    assert c.limit_bytes == 2 << 30 and c.usage_bytes == 1950 * MIB
    assert c.working_set_bytes == (1950 - 930) * MIB
    assert abs(s.cgroup_fraction - 1020 / 2048) < 1e-12
    assert s.limit_label() == "v2 /system.slice memory.max"


def test_v2_anon_heavy_with_a_limited_parent():
    s = _v2_source("v2_anon_heavy_limited_parent").read()
    assert s.cgroup.path == "/system.slice"
    assert abs(s.used_fraction - (1900 - 25) / 2048) < 1e-12  # 0.916: between high and critical


def test_v2_memory_high_is_the_tightest_limit():
    s = _v2_source("v2_memory_high_binds").read()
    c = s.cgroup
    assert (c.path, c.limit_file, c.limit_bytes) == (
        "/system.slice/edge-runtime.service", "memory.high", 2 << 30)
    assert abs(s.used_fraction - (1800 - 50) / 2048) < 1e-12


def test_v2_inputs_are_all_reported():
    s = _v2_source("v2_cache_heavy_limited_parent").read()
    inputs = s.inputs()
    assert inputs["cgroup_usage_bytes"] == 1950 * MIB
    assert inputs["cgroup_inactive_file_bytes"] == 930 * MIB
    assert inputs["cgroup_working_set_bytes"] == 1020 * MIB
    assert inputs["cgroup_limit_bytes"] == 2 << 30
    assert inputs["available_bytes"] == 11000000 * 1024 and inputs["total_bytes"] == 16000000 * 1024
    assert inputs["gpu_shared_bytes"] == 900000 * 1024
    assert inputs["used_fraction"] == max(inputs["machine_used_fraction"],
                                          inputs["cgroup_used_fraction"])


def test_jtop_figures_with_nvmap_and_the_cgroup(tmp_path):
    """jtop's RAM `used` already leaves cache out (MemTotal - MemFree - Buffers - Cached -
    SReclaimable); NvMap (RAM.shared) is reported beside it. Values recorded from an Orin NX 16 GB
    layout (KiB)."""
    jetson = SimpleNamespace(
        memory={"RAM": {"tot": 15655000, "used": 12524000, "free": 402000, "buffers": 81000,
                        "cached": 2648000, "shared": 3931000},
                "SWAP": {"tot": 7827000, "used": 12000}},
        temperature={}, power={}, ok=lambda spin=False: True)
    cgroup = CgroupMemory.locate(SAMPLES / "v2_anon_heavy_limited_parent",
                                 SAMPLES / "v2_anon_heavy_limited_parent" / "proc_cgroup")
    src = JtopSource(jetson, cgroup)
    s = src.read()
    assert src.name == "jtop+cgroup-v2"
    assert abs(s.machine_fraction - 12524000 / 15655000) < 1e-12  # 0.80
    assert s.gpu_shared_bytes == 3931000 * 1024
    assert s.used_fraction == s.cgroup_fraction  # 0.916 from the slice's limit binds


def test_garbage_memory_stat_is_a_telemetry_error(tmp_path):
    shutil.copytree(SAMPLES / "v2_memory_high_binds", tmp_path / "c")
    (tmp_path / "c" / "system.slice/edge-runtime.service/memory.stat").write_text("anon lots\n")
    (tmp_path / "proc").write_text("0::/system.slice/edge-runtime.service\n")
    src = ProcMeminfoSource(str(tmp_path / "c" / "meminfo"), str(tmp_path / "c"),
                            str(tmp_path / "proc"))
    with pytest.raises(TelemetryError, match="memory.stat: expected 'key bytes' lines"):
        src.read()


def test_metrics_export_every_input_beside_the_fraction():
    from edge_runtime.guard_config import GuardConfig
    from edge_runtime.guard.guard import MemoryGuard
    from edge_runtime.service.metrics import ServiceMetrics, render_prometheus

    guard = MemoryGuard(GuardConfig(), _v2_source("v2_cache_heavy_limited_parent"), None)
    guard.poll()
    text = render_prometheus(ServiceMetrics().snapshot({}, guard.snapshot(), None,
                                                       {"status": "ready"}))
    values = dict(line.rsplit(" ", 1) for line in text.splitlines()
                  if line.startswith("edge_guard_"))
    assert values["edge_guard_cgroup_usage_bytes"] == str(1950 * MIB)
    assert values["edge_guard_cgroup_inactive_file_bytes"] == str(930 * MIB)
    assert values["edge_guard_cgroup_working_set_bytes"] == str(1020 * MIB)
    assert values["edge_guard_cgroup_limit_bytes"] == str(2 << 30)
    assert float(values["edge_guard_cgroup_used_fraction"]) == pytest.approx(1020 / 2048)
    assert float(values["edge_guard_used_fraction"]) == pytest.approx(1020 / 2048)
    assert values["edge_guard_gpu_shared_bytes"] == str(900000 * 1024)
    assert values['edge_guard_cgroup_limit_info{limit="v2 /system.slice memory.max"}'] == "1"
    assert values["edge_guard_admission_paused_seconds"] == "0.0"
