"""What lets SGLang 0.5.23's HiCache modules import and run on a CPU-only machine (torch 2.13.0+cpu).

`install()` must run before anything imports `sglang` (the rank processes of `--engine sglang-hicache` call it first).
Four import-only stubs, each for a module that needs a GPU or is not installed, none of which the driven code calls:
the `sglang` package shell, `triton` (SGLang's own mock for hosts without it), `custom_all_reduce_v2` (CUDA IPC) and
`torchvision`; and one CPU shim after the imports (`cpu_host_pools`): SGLang's host KV pools pin their memory with
`cudaHostRegister` by default, which a CPU torch cannot do, so they are built with `pin_memory=False` (the value
SGLang's own CPU paths pass). docs/serving-stacks.md lists them, with their reasons.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import types

_installed = False


def _sglang_dir() -> str:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    return list(spec.submodule_search_locations)[0]


def install() -> None:
    global _installed
    if _installed:
        return
    # 1) `sglang` package shell: sglang/__init__.py imports the frontend language API and applies HF
    #    transformers patches (needs transformers, tiktoken, ...). None of it is used by the srt modules
    #    driven here, so the package object is created with the real __path__ but without running __init__.
    _package_shell("sglang", _sglang_dir())
    # 2) triton: sglang.srt.utils.common does `import triton` at module top (for @triton.jit helpers that
    #    are never called on CPU). SGLang ships its own mock for Apple-Silicon hosts; reuse it.
    #    torch decides "triton installed" once (functools.cache) by trying `import triton`; ask it first so
    #    torch.compile decorators met at import (moe_runner/deep_gemm.py) keep torch's no-triton paths.
    if "triton" not in sys.modules and importlib.util.find_spec("triton") is None:
        from torch.utils import _triton as torch_triton
        assert not torch_triton.has_triton_package()
        # torch.compile(...) decorators run at import (moe_runner/deep_gemm.py) and load Inductor, whose
        # runtime/triton_compat.py does its own `try: import triton`; load it now, while the import fails.
        import torch._inductor.compile_fx  # noqa: F401
        from sglang import _platform_stubs as ps  # stdlib-only module
        sys.meta_path.insert(0, ps._TritonFinder())
        triton = ps._make_mock("triton")
        triton.__version__ = "3.0.0"
        triton.cdiv = ps._cdiv
        triton.next_power_of_2 = ps._next_power_of_2
        triton.Config = ps._Config
        # modules made by the finder alone lose their mock attributes (loader None), so pre-make the
        # ones used at import time: `triton.language` (`tl.constexpr` annotations) and `triton.runtime.jit`.
        tl = ps._make_mock("triton.language")
        tl.constexpr = type("constexpr", (), {"__init__": lambda self, value=None: setattr(self, "value", value)})
        triton.language = tl
        runtime = ps._make_mock("triton.runtime")
        triton.runtime = runtime
        jit = ps._make_mock("triton.runtime.jit")
        jit.JITFunction = type("JITFunction", (), {})
        runtime.jit = jit
    # 3) custom_all_reduce_v2: CUDA-IPC custom all-reduce, imports tvm_ffi + JIT CUDA kernels at module top;
    #    dp_attention imports only the class name for isinstance checks. SGLang itself substitutes `()` on
    #    XPU (dp_attention.py: `CustomAllReduceV2 = ()`); do the same.
    _stub("sglang.srt.distributed.device_communicators.custom_all_reduce_v2", CustomAllReduceV2=())
    # 4) torchvision: memory_pool -> sglang.srt.configs/__init__ imports every model config; three of them
    #    (multimodal.internvl_utils, configs.deepseek_ocr) import torchvision.transforms names at module top
    #    and use them only inside image-preprocessing functions. Not installed (it would have to match
    #    torch 2.13.0+cpu); a mock package that answers any attribute is enough for the import.
    #    transformers decides "torchvision available" once (lru_cache) by find_spec; ask it first, before the
    #    mock exists, so it keeps using its PIL-only code paths.
    if importlib.util.find_spec("torchvision") is None:
        from transformers.utils import import_utils
        assert not import_utils.is_torchvision_available()
        from sglang import _platform_stubs as ps
        tv = ps._make_mock("torchvision")
        tv.transforms = ps._make_mock("torchvision.transforms")
        tv.transforms.functional = ps._make_mock("torchvision.transforms.functional")
    _installed = True


def cpu_host_pools() -> None:
    """Build SGLang's MHA host KV pools with `pin_memory=False` (the production builder,
    `hybrid_pool_assembler.build_kv_host_pool`, passes none, and the default pins through CUDA). Idempotent."""
    from sglang.srt.mem_cache.pool_host import mha

    cls = mha.MHATokenToKVPoolHost
    if getattr(cls.__init__, "_shardcheck_cpu", False):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):  # noqa: N807 - the class's own name
        kwargs["pin_memory"] = False
        original(self, *args, **kwargs)

    __init__._shardcheck_cpu = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _package_shell(name: str, path: str) -> types.ModuleType:
    """A package object with the real __path__ whose __init__.py is not executed."""
    pkg = types.ModuleType(name)
    pkg.__path__ = [path]
    pkg.__file__ = os.path.join(path, "__init__.py")
    pkg.__spec__ = importlib.util.spec_from_file_location(name, pkg.__file__, submodule_search_locations=[path])
    sys.modules[name] = pkg
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, pkg)
    return pkg


def _stub(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = f"<import-only stub for {name}>"
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod
