"""``.ci/run`` says which CPU family it ran on before the tests (the served int8 model's scores differ
slightly between AVX2, AVX-512 and AVX-512 VNNI machines, so a run is read with its machine)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CI_RUN = Path(__file__).resolve().parents[1] / ".ci" / "run"


def cpu_line(cpuinfo: Path | None) -> str:
    """The line .ci/run prints, from its own cpu_family function, for ``cpuinfo`` (None: a missing file)."""
    script = CI_RUN.read_text(encoding="utf-8")
    function = re.search(r"^cpu_family\(\) \{.*?^\}$", script, re.MULTILINE | re.DOTALL)
    assert function is not None, ".ci/run has no cpu_family function"
    assert "\ncpu_family\n" in script.split(function.group(0), 1)[1].split("scripts/test.sh")[0], "called first"
    env = {"PATH": "/usr/bin:/bin", "CPUINFO": str(cpuinfo) if cpuinfo else "/nonexistent/cpuinfo"}
    done = subprocess.run(["bash", "-c", function.group(0) + "\ncpu_family"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_ci_run_names_the_cpu_family_and_its_instruction_sets(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8259CL\n"
        "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n",
        encoding="utf-8",
    )
    line = cpu_line(info)
    assert line.startswith("CPU: GenuineIntel, Intel(R) Xeon(R) Platinum 8259CL, ")
    assert line.endswith("has: avx2 avx512f avx512_vnni; lacks: avx_vnni")
    info.write_text("vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: sse2 avx avx2\n", encoding="utf-8")
    assert cpu_line(info).endswith("has: avx2; lacks: avx512f avx512_vnni avx_vnni")
    assert "instruction sets unknown" in cpu_line(None)
