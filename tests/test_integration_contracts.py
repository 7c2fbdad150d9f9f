"""Version drift: the frameworks' plug-in contracts still fit the plug-ins.

Nothing here lists the framework API by hand. Every method a plug-in
overrides is compared with the installed base class's signature, and every
call the plug-in source makes into the framework (a base-class method, an
``AudioEmitter`` method, a framework class or function) is bound against
the installed signature with ``inspect``. A framework release that renames,
removes or reorders any of it fails here, naming the call.
"""

from __future__ import annotations

import ast
import inspect
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from livekit.agents import tts as livekit_tts
from packaging.requirements import Requirement

import gateway.integrations.livekit as livekit_plugin
import gateway.integrations.pipecat as pipecat_plugin

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Plugin:
    module: ModuleType
    framework: str  # top-level package of the framework
    distribution: str  # its PyPI name
    extra: str  # our extra that pins it
    # names of local variables that hold a framework object, and its class
    receivers: tuple[tuple[str, type], ...] = ()


PLUGINS = [
    Plugin(pipecat_plugin, "pipecat", "pipecat-ai", "pipecat"),
    Plugin(
        livekit_plugin,
        "livekit",
        "livekit-agents",
        "livekit",
        receivers=(
            ("output_emitter", livekit_tts.AudioEmitter),
            ("emitter", livekit_tts.AudioEmitter),
        ),
    ),
]


def plugin_classes(plugin: Plugin) -> list[type]:
    return [
        obj
        for obj in vars(plugin.module).values()
        if inspect.isclass(obj)
        and obj.__module__ == plugin.module.__name__
        and any(base.__module__.startswith(plugin.framework) for base in obj.__mro__[1:])
    ]


def is_framework(obj: object, plugin: Plugin) -> bool:
    return getattr(obj, "__module__", "").startswith(plugin.framework)


def base_member(cls: type, name: str) -> tuple[type, Any] | None:
    """The nearest framework definition of ``name`` above ``cls``."""
    for base in cls.__mro__[1:]:
        if name in vars(base):
            return base, vars(base)[name]
    return None


def accepts(ours: inspect.Signature, theirs: inspect.Signature) -> list[str]:
    """What a caller of the base signature could pass that the override refuses."""
    params = ours.parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params.values())
    problems = []
    for p in theirs.parameters.values():
        if p.kind is p.VAR_POSITIONAL and not var_pos:
            problems.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD and not var_kw:
            problems.append(f"**{p.name}")
        elif (
            p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and p.name not in params
            and not (var_kw and p.kind is p.KEYWORD_ONLY)
        ):
            problems.append(p.name)
    for p in params.values():
        required = p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        if required and p.name not in theirs.parameters:
            problems.append(f"{p.name} (required by ours only)")
    return problems


def overrides() -> Iterator[tuple[str, type, str, Any, Any]]:
    for plugin in PLUGINS:
        for cls in plugin_classes(plugin):
            for name, ours in vars(cls).items():
                found = base_member(cls, name)
                # Constructors differ by design; their super().__init__ calls are bound below.
                if found is None or name.startswith(("__", "_abc_")):
                    continue
                yield plugin.framework, cls, name, ours, found


OVERRIDES = list(overrides())


def test_the_plugins_override_framework_methods() -> None:
    names = {(cls.__name__, name) for _, cls, name, _, _ in OVERRIDES}
    # the contract each issue names: if these stop being overrides, the scan is broken
    assert ("GatewayTTSService", "run_tts") in names
    assert ("GatewaySynthesizeStream", "_run") in names
    assert ("GatewayTTS", "stream") in names


@pytest.mark.parametrize(
    ("framework", "cls", "name", "ours", "found"),
    OVERRIDES,
    ids=[f"{cls.__name__}.{name}" for _, cls, name, _, _ in OVERRIDES],
)
def test_each_override_still_matches_the_installed_base(
    framework: str, cls: type, name: str, ours: Any, found: tuple[type, Any]
) -> None:
    base, theirs = found
    assert isinstance(ours, property) == isinstance(theirs, property), (
        f"{base.__qualname__}.{name} is no longer a {type(ours).__name__}"
    )
    if isinstance(ours, property) or not callable(ours):
        return
    assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(theirs), (
        f"{base.__qualname__}.{name} changed between sync and async"
    )
    problems = accepts(inspect.signature(ours), inspect.signature(theirs))
    assert not problems, f"{base.__qualname__}.{name}{inspect.signature(theirs)}: {problems}"


def test_no_framework_abstract_method_is_left_unimplemented() -> None:
    for plugin in PLUGINS:
        for cls in plugin_classes(plugin):
            assert not getattr(cls, "__abstractmethods__", ()), (
                f"{cls.__name__} misses {sorted(cls.__abstractmethods__)}"
            )


@dataclass(frozen=True)
class Call:
    where: str
    target: Any
    label: str
    positional: int
    keywords: tuple[str, ...]
    bound_method: bool  # a method looked up on a class: ``self`` comes first
    forwards: bool  # passes ``**kwargs`` on: only the named arguments are checked


def framework_calls(plugin: Plugin) -> Iterator[Call]:
    """Every call in the plug-in's source whose callee the framework defines."""
    tree = ast.parse(Path(plugin.module.__file__ or "").read_text())
    classes = {cls.__name__: cls for cls in plugin_classes(plugin)}
    receivers = dict(plugin.receivers)
    for scope in tree.body:  # module-level functions and the plug-in classes
        cls = classes.get(scope.name) if isinstance(scope, ast.ClassDef) else None
        if not (cls is not None or isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
                continue
            keywords = tuple(str(k.arg) for k in node.keywords if k.arg is not None)
            forwards = any(k.arg is None for k in node.keywords)  # **kwargs may fill the rest
            where = f"{plugin.module.__name__}:{node.lineno}"
            func = node.func
            target: Any = None
            label = ""
            bound = False
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                owner = func.value.id
                if owner == "self" and cls is not None and func.attr not in vars(cls):
                    found = base_member(cls, func.attr)
                    if found and is_framework(found[0], plugin):
                        target, label, bound = found[1], f"{found[0].__name__}.{func.attr}", True
                elif owner in receivers:
                    target = inspect.getattr_static(receivers[owner], func.attr)
                    label, bound = f"{receivers[owner].__name__}.{func.attr}", True
                elif isinstance(getattr(plugin.module, owner, None), ModuleType):
                    obj = getattr(getattr(plugin.module, owner), func.attr)
                    if is_framework(obj, plugin):
                        target, label = obj, f"{owner}.{func.attr}"
            elif (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Call)
                and isinstance(func.value.func, ast.Name)
                and func.value.func.id == "super"
                and cls is not None
            ):
                found = base_member(cls, func.attr)
                if found is not None:
                    target, label, bound = found[1], f"super().{func.attr}", True
            elif isinstance(func, ast.Name):
                obj = getattr(plugin.module, func.id, None)
                if obj is not None and is_framework(obj, plugin):
                    target, label = obj, func.id
            if target is not None and callable(target):
                yield Call(where, target, label, len(node.args), keywords, bound, forwards)


CALLS = [call for plugin in PLUGINS for call in framework_calls(plugin)]


def test_the_scan_finds_the_framework_calls() -> None:
    labels = {call.label for call in CALLS}
    assert {"TTSAudioRawFrame", "AudioEmitter.initialize", "AudioEmitter.push"} <= labels


@pytest.mark.parametrize("call", CALLS, ids=[f"{c.label}@{c.where}" for c in CALLS])
def test_each_framework_call_binds_to_the_installed_signature(call: Call) -> None:
    signature = inspect.signature(call.target)
    dummies = [None] * (call.positional + (1 if call.bound_method else 0))
    try:
        bind = signature.bind_partial if call.forwards else signature.bind
        bind(*dummies, **dict.fromkeys(call.keywords))
    except TypeError as e:
        pytest.fail(f"{call.where}: {call.label}{signature} no longer takes this call: {e}")


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.framework for p in PLUGINS])
def test_the_installed_framework_is_the_pinned_one(plugin: Plugin) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (pin,) = [
        Requirement(r) for r in extras[plugin.extra] if Requirement(r).name == plugin.distribution
    ]
    installed = metadata.version(plugin.distribution)
    assert pin.specifier.contains(installed), f"{plugin.distribution} {installed} is not {pin}"
