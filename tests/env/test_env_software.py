"""Software facts: the real torch on this machine, a fake horovod install, no torch at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.env.launch import parse_visible_devices
from ddpdoctor.env.software import collect_horovod, collect_software


def test_real_torch_build_is_reported() -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    info = collect_software()
    assert info.torch == torch.__version__
    assert info.torch_cuda == torch.version.cuda
    assert info.backends["gloo"] is dist.is_gloo_available()
    assert info.backends["nccl"] is dist.is_nccl_available()
    if not dist.is_nccl_available():
        assert info.torch_nccl is None


def test_cudnn_version_is_read_without_initialising_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.backends.cudnn.version() initialises CUDA on a GPU machine, after which the probe's
    forked ranks cannot use CUDA: the library is asked directly, and CUDA is not touched."""
    torch = pytest.importorskip("torch")

    def touched(*args: object) -> None:
        raise AssertionError("collect_software touched CUDA")

    class FakeCudnn:
        @staticmethod
        def getVersionInt() -> int:
            return 91002

    for name in ("is_available", "get_device_capability", "get_device_properties", "init", "_lazy_init"):
        monkeypatch.setattr(torch.cuda, name, touched)
    monkeypatch.setattr(torch.backends.cudnn, "version", touched)
    monkeypatch.setattr(torch._C, "_cudnn", FakeCudnn, raising=False)
    assert collect_software().torch_cudnn == "91002"
    monkeypatch.delattr(torch._C, "_cudnn")  # a CPU build has none
    assert collect_software().torch_cudnn is None


def test_horovod_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert collect_horovod().installed is False


def test_horovod_build_read_from_a_fake_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "horovod"
    (package / "torch").mkdir(parents=True)
    (package / "tensorflow").mkdir()
    (package / "__init__.py").write_text("__version__ = '0.28.1'\n")
    (package / "torch" / "__init__.py").write_text(
        "def mpi_built(): return False\n"
        "def gloo_built(): return True\n"
        "def nccl_built(): return 2\n"
        "def ddl_built(): return False\n"
        "def ccl_built(): return False\n"
    )
    (package / "torch" / "mpi_lib_v2.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    (package / "tensorflow" / "__init__.py").write_text("raise ImportError('must not import tf')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        info = collect_horovod()
    finally:
        for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
            del sys.modules[name]
    assert info.installed and info.version == "0.28.1"
    assert info.frameworks == {"TensorFlow": False, "PyTorch": True, "MXNet": False}
    assert info.controllers == {"MPI": False, "Gloo": True}
    assert info.tensor_operations["NCCL"] is True and info.tensor_operations["MPI"] is False
    assert info.error is None


def test_no_torch_and_no_nvml_degrade_to_lines() -> None:
    # A fresh interpreter in which torch and pynvml cannot be imported.
    code = (
        "import sys, json\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['pynvml'] = None\n"
        "from ddpdoctor.env import collect_env, diagnose, summary_lines\n"
        "r = collect_env(environ={})\n"
        "print(json.dumps({'torch': r.software.torch_error, 'nvml': r.software.nvml.message,"
        " 'codes': [f.code for f in diagnose(r, backend='nccl', nproc=2)],"
        " 'summary': summary_lines(r)}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    import json

    payload = json.loads(result.stdout)
    assert payload["torch"] == "torch is not installed"
    assert payload["nvml"].startswith("NVML: nvidia-ml-py is not installed")
    assert "ENV009" in payload["codes"] and "ENV006" in payload["codes"]
    assert "torch: torch is not installed" in payload["summary"]


def test_importing_env_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import ddpdoctor.env, ddpdoctor.env.command, ddpdoctor.env.render\n"
        "assert 'torch' not in sys.modules, 'torch imported at module level'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_visible_devices_without_nvml_counts_entries() -> None:
    parsed = parse_visible_devices("0,GPU-abc,2", None)
    assert parsed.visible is None and parsed.count == 3
    assert parse_visible_devices("1,1", None).count == 0
    assert parse_visible_devices("", None).count == 0
