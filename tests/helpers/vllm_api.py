"""What a piece of code uses of vLLM, checked against a release's sources by reading them (AST), not importing them.

A GPU wheel cannot be imported on a machine without a GPU, but its Python files can be parsed. `check_uses(code,
tree)` finds, in `code` (a module of specwake's worker, or a file the reference patch adds or changes), every use of
vLLM it can name, and returns one line per use that release `tree` (a folder holding `vllm/`) does not have:

- `from vllm.X import Y` / `import vllm.X`, at any depth: the module exists and defines (or re-exports) Y. Imports
  inside a `try:` whose handler catches ImportError are a fallback: a release may lack them only where the code says
  so, on the handler's line: `except ImportError:  # vLLM < 0.34: why` (`optional_missing` lists them; the caller
  checks that every such import resolves in at least one release, so none is a typo). An import of the handler itself
  is not needed where its `try:` imported everything;
- a call of an imported function or class, or of a method of an imported class (`Factory.register_engine(...)`),
  or of a function of an imported module: the release's signature accepts its positional count and keywords;
- attributes and methods of vLLM objects whose class is known: parameters named as vLLM names its objects
  (`vllm_config`, `model_config`, `load_config`, `runner`, `worker`: the classes each is, per release, with a class
  the release does not have a finding), names assigned from a known object's annotated field
  (`spec = vllm_config.speculative_config`), `self` in a subclass of a vLLM class or in a method the patch changes;
- a method a subclass of a vLLM class overrides: it still takes the base method's parameters.

What it cannot type (plain `Any` receivers, `getattr(obj, "name", default)` probes, torch objects) it leaves alone:
those are the worker's defensive paths, and the real-server tests run them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from specwake.prepare.releases import ByRelease

V1_RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner.GPUModelRunner"

# What vLLM calls its objects in the worker's code (and the patch's): parameter name -> the dotted names of the classes
# it may be an instance of, per release (every one must have what the code uses of it).
KNOWN_PARAMETERS: dict[str, ByRelease[tuple[str, ...]]] = {
    "vllm_config": ByRelease.plain(("vllm.config.vllm.VllmConfig",)),
    "model_config": ByRelease.plain(("vllm.config.model.ModelConfig",)),
    "draft_model_config": ByRelease.plain(("vllm.config.model.ModelConfig",)),
    "load_config": ByRelease.plain(("vllm.config.load.LoadConfig",)),
    # specwake's worker extension runs on the worker's model runner (each CPU runner subclasses one of these). Before
    # 0.34 that is the V2 runner or, under VLLM_USE_V2_MODEL_RUNNER=0 or a configuration V2 does not support, the V1
    # runner: code must hold for both. 0.34 removed the V1 runner.
    "runner": ByRelease.parse({"<0.34": (V1_RUNNER, V2_RUNNER), ">=0.34": (V2_RUNNER,)}),
    # the worker the extension is mixed into (the CPU worker subclasses it)
    "worker": ByRelease.plain(("vllm.v1.worker.gpu_worker.Worker",)),
}
# Members that are what a KNOWN_PARAMETERS name is, whatever they are annotated as: the worker's model runner is
# annotated as the V1 runner before 0.34, but may be either runner.
KNOWN_MEMBERS: dict[tuple[str, str], str] = {("vllm.v1.worker.gpu_worker.Worker", "model_runner"): "runner"}
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class Use:
    line: int
    what: str  # e.g. "from vllm.config import VllmConfig"

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}"


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    optional_missing: list[Use] = field(default_factory=list)  # guarded imports this release does not have
    optional_found: list[Use] = field(default_factory=list)
    checked: int = 0  # uses checked (so a test can see the walk found something)


# ---------------------------------------------------------------------------------------------------------------
# The release's side: modules, the names they define, classes and their members
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    root: Path  # holds vllm/
    named: str | None = None  # the version the caller knows it as (a source tree without a version file)

    @property
    def version(self) -> str | None:
        """The release's `__version__`, as its `vllm/_version.py` (or `vllm/__init__.py`) assigns it, else the one
        it was named."""
        return _version(self.root) or self.named

    def module_file(self, dotted: str) -> Path | None:
        base = self.root.joinpath(*dotted.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def module(self, dotted: str) -> ast.Module | None:
        path = self.module_file(dotted)
        return parsed(path) if path is not None else None

    def lookup(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST | None] | None:
        """Where `module.name` is defined: (defining module, its def/class node or None for a plain value);
        None when the release has no such name. Follows re-exports and submodules."""
        tree = self.module(module)
        if tree is None or depth > 8:
            return None
        for node in _top_level(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return module, node
            if isinstance(node, ast.Assign) and any(_binds(t, name) for t in node.targets):
                return module, None
            if isinstance(node, ast.AnnAssign) and _binds(node.target, name):
                return module, None
            if isinstance(node, ast.ImportFrom):
                source = _absolute(module, node, self.module_file(module))
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.lookup(source, alias.name, depth + 1) or self._submodule(source, alias.name)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname == name:
                        return (alias.name, None) if self.module_file(alias.name) else None
        found = self._submodule(module, name)
        if found is None and any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
            return module, None  # a lazily exported name (PEP 562): exists as far as reading can tell
        return found

    def _submodule(self, module: str, name: str) -> tuple[str, ast.AST | None] | None:
        sub = f"{module}.{name}"
        return (sub, ast.Module(body=[], type_ignores=[])) if self.module_file(sub) else None

    def class_node(self, dotted: str) -> tuple[str, ast.ClassDef] | None:
        module, _, name = dotted.rpartition(".")
        found = self.lookup(module, name)
        if found is None or not isinstance(found[1], ast.ClassDef):
            return None
        return found[0], found[1]

    def members(self, dotted: str) -> tuple[dict[str, ast.AST | None], bool]:
        """Every member a vLLM class has, from its body, `self.X = ...` in its methods and its vLLM bases; and
        whether the class is closed (all bases are vLLM's or plain), so a name it lacks is really missing."""
        return _members(self, dotted)

    def resolve_annotation(self, module: str, annotation: ast.expr | None) -> tuple[str, ...]:
        """The vLLM classes an annotation names (`SpeculativeConfig | None` -> its dotted name)."""
        names: list[str] = []
        for part in _annotation_names(annotation):
            head, _, rest = part.partition(".")
            found = self.lookup(module, head)
            if found is None:
                continue
            where, node = found
            if isinstance(node, ast.ClassDef) and not rest:
                names.append(f"{where}.{node.name}")
        return tuple(names)


@cache
def _version(root: Path) -> str | None:
    for path in (root / "vllm" / "_version.py", root / "vllm" / "__init__.py"):
        if not path.is_file():
            continue
        for node in parsed(path).body:
            if (
                isinstance(node, ast.Assign)
                and any(_binds(t, "__version__") for t in node.targets)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                return node.value.value
    return None


def parsed(path: Path) -> ast.Module:
    """The module at `path`, parsed once per file: an overlay's unpatched files are links to its release's, read
    through each overlay's folder (one parse of the release serves every patch built on it). Not to be changed."""
    return _parse_file(path.resolve())


@cache
def _parse_file(path: Path) -> ast.Module:
    return ast.parse(path.read_bytes(), str(path))


def _top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Statements at module level, including those under `if TYPE_CHECKING:` / `try:` blocks."""
    stack = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If):
            stack.extend(reversed(node.body + node.orelse))
        elif isinstance(node, ast.Try):
            stack.extend(reversed(node.body + [s for h in node.handlers for s in h.body] + node.orelse))


def _binds(target: ast.expr, name: str) -> bool:
    if isinstance(target, ast.Name):
        return target.id == name
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_binds(t, name) for t in target.elts)
    return False


def _absolute(module: str, node: ast.ImportFrom, path: Path | None) -> str:
    if not node.level:
        return node.module or ""
    package = module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _annotation_names(annotation: ast.expr | None) -> Iterator[str]:
    if annotation is None:
        return
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            yield from _annotation_names(ast.parse(annotation.value, mode="eval").body)
        except SyntaxError:
            return
    elif isinstance(annotation, ast.BinOp):
        yield from _annotation_names(annotation.left)
        yield from _annotation_names(annotation.right)
    elif isinstance(annotation, ast.Subscript) and _dotted(annotation.value) in ("Optional", "typing.Optional"):
        yield from _annotation_names(annotation.slice)
    elif (dotted := _dotted(annotation)) is not None and dotted != "None":
        yield dotted


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head is not None else None
    return None


@cache
def _members(release: Release, dotted: str) -> tuple[dict[str, ast.AST | None], bool]:
    found = release.class_node(dotted)
    if found is None:
        return {}, False
    module, cls = found
    members: dict[str, ast.AST | None] = {}
    closed = True
    for base in cls.bases:
        name = _dotted(base.value if isinstance(base, ast.Subscript) else base)
        if name in (None, "object", "Generic", "ABC", "abc.ABC", "Protocol"):
            continue
        head, _, rest = name.partition(".")
        where = release.lookup(module, head)
        base_cls = None
        if where is not None and isinstance(where[1], ast.ClassDef) and not rest:
            base_cls = f"{where[0]}.{where[1].name}"
        if base_cls is None:
            closed = False  # torch's nn.Module, pydantic's BaseModel, ...: members a reading cannot list
            continue
        inherited, base_closed = _members(release, base_cls)
        members.update(inherited)
        closed = closed and base_closed
    # `name: T` alone declares a field where the class makes fields of its annotations (a dataclass, a config class,
    # or bases a reading cannot list: pydantic's BaseModel, NamedTuple, ...); in any other class it only declares a
    # type (a mixin's `get_model: Callable[...]`), and the name is a member only where something assigns it.
    fields = _is_config_class(cls) or not closed or "__dataclass_fields__" in members
    declared: dict[str, ast.AST] = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.value is not None or fields:
                members[node.target.id] = node
            else:
                declared[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name_node in ast.walk(target):
                    if isinstance(name_node, ast.Name):
                        members[name_node.id] = node
    for method in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for node in ast.walk(method):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AnnAssign, ast.AugAssign)) else []  # fmt: skip
            for target in targets:
                if isinstance(target, ast.Attribute) and _dotted(target.value) == "self":
                    typed = declared.get(target.attr) or _typed_self_assign(method, node, target.attr)
                    members.setdefault(target.attr, typed)
    if any(_dotted(d.func if isinstance(d, ast.Call) else d) in ("dataclass", "dataclasses.dataclass") for d in
           cls.decorator_list):  # fmt: skip
        members.setdefault("__dataclass_fields__", None)
    return members, closed


def _typed_self_assign(method: ast.FunctionDef | ast.AsyncFunctionDef, node: ast.AST, attr: str) -> ast.AST:
    """`self.x: T = ...` as it is; `self.x = param` with `param: T` in the method's signature as `x: T`."""
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
        for param in method.args.posonlyargs + method.args.args + method.args.kwonlyargs:
            if param.arg == node.value.id and param.annotation is not None:
                return ast.AnnAssign(target=ast.Name(attr), annotation=param.annotation, simple=1)
    return node


# ---------------------------------------------------------------------------------------------------------------
# Signatures
# ---------------------------------------------------------------------------------------------------------------


def binding_problem(fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, drop_first: bool) -> str | None:
    """Why `call` cannot bind to `fn`'s parameters (None: it can, or a reading cannot tell)."""
    a = fn.args
    positional = [p.arg for p in a.posonlyargs + a.args]
    if drop_first and positional:
        positional = positional[1:]
    n_defaults = len(a.defaults)
    required_pos = positional[: len(positional) - n_defaults] if n_defaults else positional
    keywordable = {p.arg for p in a.args + a.kwonlyargs} - ({(a.posonlyargs + a.args)[0].arg} if drop_first and (
        a.posonlyargs + a.args) else set())  # fmt: skip
    required_kw = {p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None}
    starred = any(isinstance(x, ast.Starred) for x in call.args) or any(k.arg is None for k in call.keywords)
    given_pos = len(call.args)
    given_kw = {k.arg for k in call.keywords if k.arg is not None}
    if given_pos > len(positional) and a.vararg is None and not starred:
        return f"takes {len(positional)} positional arguments, the call passes {given_pos}"
    unknown = sorted(given_kw - keywordable) if a.kwarg is None else []
    if unknown:
        return f"has no parameter {', '.join(unknown)}"
    if starred:
        return None
    missing = [p for p in required_pos[given_pos:] if p not in given_kw] + sorted(required_kw - given_kw)
    if missing:
        return f"requires {', '.join(missing)}, which the call does not pass"
    return None


def _is_static(fn: ast.AST) -> bool:
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        _dotted(d) == "staticmethod" for d in fn.decorator_list
    )


# ---------------------------------------------------------------------------------------------------------------
# The code's side: a walk that keeps what each name refers to
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """What a name in the checked code stands for."""

    kind: str  # "module", "object" (a vLLM function/class/value), "instance" (of vLLM classes)
    dotted: str = ""  # module name, or the object's defining module + "." + name
    node: ast.AST | None = None  # the object's def/class
    classes: tuple[str, ...] = ()  # for "instance"
    own: frozenset[str] = frozenset()  # for `self` in a subclass of ours: the members the subclass itself adds


class Checker:
    def __init__(self, release: Release, lines: set[int] | None, self_classes: dict[str, tuple[str, ...]]) -> None:
        self.release = release
        self.lines = lines  # None: every line; else only uses on these lines are checked
        self.self_classes = self_classes  # class name in the checked code -> the vLLM classes `self` is
        self.report = Report()
        self.alternatives = 0  # > 0 inside the `except ImportError:` of a fallback import
        self.source_lines: list[str] = []
        # the `vLLM <spec>: why` of each enclosing guarded `try:`'s handler, innermost last (None: it gives none);
        # a handler's own body, never run where its `try:` imported everything, is `UNUSED`
        self.absent_where: list[tuple[SpecifierSet, str] | None | str] = []
        self.probed: set[str] = set()  # attributes the code asks for with hasattr/getattr first: it has a fallback
        # KNOWN_PARAMETERS for this release; None where no table entry answers for it
        self.parameters = {name: classes.for_release(release.version) for name, classes in KNOWN_PARAMETERS.items()}

    def wanted(self, node: ast.AST) -> bool:
        return self.lines is None or getattr(node, "lineno", -1) in self.lines

    def problem(self, node: ast.AST, text: str) -> None:
        if self.wanted(node):
            self.report.problems.append(f"line {getattr(node, 'lineno', '?')}: {text}")

    # -- imports ---------------------------------------------------------------------------------------------
    def import_from(self, node: ast.ImportFrom, scope: dict[str, Ref], guarded: bool, module_name: str) -> None:
        source = node.module or ""
        if node.level:
            source = _absolute(module_name, node, self.release.module_file(module_name))
        if not (source == "vllm" or source.startswith("vllm.")):
            return
        for alias in node.names:
            use = Use(node.lineno, f"from {source} import {alias.name}")
            found = None if self.release.module_file(source) is None else self.release.lookup(source, alias.name)
            if self.wanted(node):
                self.report.checked += 1
            if found is None:
                self.missing(node, use, guarded, self._why_missing(source, alias.name))
                continue
            if guarded or self.alternatives:
                self.report.optional_found.append(use)
            where, def_node = found
            if isinstance(def_node, ast.Module):
                scope[alias.asname or alias.name] = Ref("module", where)
            else:
                scope[alias.asname or alias.name] = Ref("object", f"{where}.{alias.name}", def_node)

    def missing(self, node: ast.AST, use: Use, guarded: bool, why: str) -> None:
        """An import the release lacks. Unguarded, a problem. Guarded by `except ImportError`, it may be absent only
        where the code says so: its handler's line names the releases and why (`# vLLM < 0.34: no such cap`), and
        this release is one of them; or it is the alternative of a `try:` that imported everything here."""
        if not guarded:
            self.problem(node, f"{use.what}: {why}")
            return
        where = self.absent_where[-1] if self.absent_where else None
        version = self.release.version
        if where == UNUSED or (
            isinstance(where, tuple) and version is not None and where[0].contains(version, prereleases=True)
        ):
            self.report.optional_missing.append(use)
            return
        said = f"its handler says absent in vLLM {where[0]}" if isinstance(where, tuple) else "its handler says not"
        self.problem(
            node,
            f"{use.what}: {why}; guarded by `except ImportError`, but {said} where vLLM {version or '(unknown)'} is"
            " (write `# vLLM <X.Y: why` on the except line, if the release may lack it)",
        )

    def _why_missing(self, module: str, name: str) -> str:
        return (
            f"release has no module {module}" if self.release.module_file(module) is None else f"{module} has no {name}"
        )

    def _why_missing_class(self, dotted: str) -> str:
        return f"vLLM {self.release.version or '(version unknown)'} has no class {dotted}"

    def known_parameter(self, param: ast.arg) -> Ref:
        """What a parameter KNOWN_PARAMETERS names is in this release; every class it names must be there."""
        classes = self.parameters[param.arg]
        if classes is None:
            which = self.release.version or "(no __version__ in vllm/_version.py)"
            self.problem(param, f"parameter {param.arg}: KNOWN_PARAMETERS names no class for vLLM {which}")
            return Ref("instance")
        for dotted in classes:
            if self.release.class_node(dotted) is None:
                self.problem(param, f"parameter {param.arg}: {self._why_missing_class(dotted)}")
        return Ref("instance", classes=classes)

    def import_(self, node: ast.Import, scope: dict[str, Ref], guarded: bool) -> None:
        for alias in node.names:
            if not (alias.name == "vllm" or alias.name.startswith("vllm.")):
                continue
            if self.wanted(node):
                self.report.checked += 1
            if self.release.module_file(alias.name) is None:
                self.missing(node, Use(node.lineno, f"import {alias.name}"), guarded, "release has no such module")
                continue
            scope[alias.asname or alias.name.partition(".")[0]] = Ref(
                "module", alias.name if alias.asname else alias.name.partition(".")[0]
            )

    # -- expressions -----------------------------------------------------------------------------------------
    def ref_of(self, expr: ast.expr, scope: dict[str, Ref]) -> Ref | None:
        """What an expression stands for, where a reading can tell; reports missing members on the way."""
        if isinstance(expr, ast.Name):
            return scope.get(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.ref_of(expr.value, scope)
            if owner is None:
                return None
            return self.member(owner, expr.attr, expr)
        if isinstance(expr, ast.Call):  # a vLLM class called, or a function annotated to return one
            made = self.ref_of(expr.func, scope)
            if made is not None and made.kind == "object" and isinstance(made.node, ast.ClassDef):
                return Ref("instance", classes=(made.dotted,))
            if made is not None and isinstance(made.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                module = made.dotted.rpartition(".")[0]
                if made.kind == "method":  # Class.method: the annotation is read in the class's module
                    module = module.rpartition(".")[0]
                returned = self.release.resolve_annotation(module, made.node.returns)
                if not returned and made.kind == "method" and made.node.name.startswith("from_"):
                    returned = (made.dotted.rpartition(".")[0],)  # an unannotated alternate constructor
                return Ref("instance", classes=returned) if returned else None
        return None

    def member(self, owner: Ref, attr: str, node: ast.AST) -> Ref | None:
        if owner.kind == "module":
            found = self.release.lookup(owner.dotted, attr)
            if self.wanted(node):
                self.report.checked += 1
            if found is None:
                self.problem(node, f"{owner.dotted}.{attr}: {self._why_missing(owner.dotted, attr)}")
                return None
            where, def_node = found
            if isinstance(def_node, ast.Module):
                return Ref("module", where)
            return Ref("object", f"{where}.{attr}", def_node)
        if owner.kind == "object" and isinstance(owner.node, ast.ClassDef):
            return self._class_member((owner.dotted,), attr, node, on_class=True)
        if owner.kind == "instance" and attr not in owner.own and attr not in self.probed:
            return self._class_member(owner.classes, attr, node, on_class=False)
        return None

    def _class_member(self, classes: tuple[str, ...], attr: str, node: ast.AST, on_class: bool) -> Ref | None:
        result: Ref | None = None
        for dotted in classes:
            members, closed = self.release.members(dotted)
            if self.wanted(node):
                self.report.checked += 1
            if self.release.class_node(dotted) is None:  # a class named by KNOWN_PARAMETERS or self_classes
                self.problem(node, f"{dotted}.{attr}: {self._why_missing_class(dotted)}")
                continue
            if attr not in members:
                if closed and not attr.startswith("__"):
                    self.problem(node, f"{dotted} has no attribute {attr}")
                continue
            found = members[attr]
            module = dotted.rpartition(".")[0]
            if (dotted, attr) in KNOWN_MEMBERS:
                result = Ref("instance", classes=self.parameters[KNOWN_MEMBERS[dotted, attr]] or ())
                continue
            if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(_dotted(d) == "property" for d in found.decorator_list):
                    classes_of = self.release.resolve_annotation(module, found.returns)
                    result = Ref("instance", classes=classes_of) if classes_of else result
                else:
                    result = Ref("method", f"{dotted}.{attr}", found, (dotted,) if on_class else ())
            elif isinstance(found, ast.AnnAssign):
                classes_of = self.release.resolve_annotation(
                    _defining_module(self.release, dotted, attr), found.annotation
                )
                result = Ref("instance", classes=classes_of) if classes_of else result
        return result

    def call(self, node: ast.Call, scope: dict[str, Ref]) -> None:
        ref = self.ref_of(node.func, scope)
        if ref is None or not self.wanted(node):
            return
        fn: ast.AST | None = None
        drop_first = False
        if ref.kind == "object" and isinstance(ref.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = ref.node
        elif ref.kind == "object" and isinstance(ref.node, ast.ClassDef):
            members, _ = self.release.members(ref.dotted)
            init = members.get("__init__")
            if isinstance(init, ast.FunctionDef):
                fn, drop_first = init, True
            elif "__dataclass_fields__" in members or _is_config_class(ref.node):
                fields = [m for m, n in members.items() if isinstance(n, ast.AnnAssign)]
                unknown = sorted({k.arg for k in node.keywords if k.arg is not None} - set(fields))
                if unknown:
                    self.problem(node, f"{ref.dotted}(...) has no field {', '.join(unknown)}")
                return
        elif ref.kind == "method" and isinstance(ref.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = ref.node
            is_class_method = any(_dotted(d) == "classmethod" for d in ref.node.decorator_list)
            # on an instance, or on a class for a classmethod: the first parameter is bound
            drop_first = not _is_static(ref.node) and (not ref.classes or is_class_method)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.report.checked += 1
            why = binding_problem(fn, node, drop_first)
            if why is not None:
                self.problem(node, f"{ref.dotted}() {why}")


def _defining_module(release: Release, dotted: str, attr: str) -> str:
    """The module of the class (dotted or one of its vLLM bases) whose body annotates `attr`."""
    found = release.class_node(dotted)
    if found is None:
        return dotted.rpartition(".")[0]
    module, cls = found
    if any(isinstance(n, ast.AnnAssign) and _binds(n.target, attr) for n in cls.body):
        return module
    for base in cls.bases:
        name = _dotted(base)
        where = release.lookup(module, name) if name and "." not in name else None
        if where is not None and isinstance(where[1], ast.ClassDef):
            base_dotted = f"{where[0]}.{where[1].name}"
            if attr in release.members(base_dotted)[0]:
                return _defining_module(release, base_dotted, attr)
    return module


def _is_config_class(cls: ast.ClassDef) -> bool:
    return any((_dotted(d.func if isinstance(d, ast.Call) else d) or "").endswith(("dataclass", "config")) for d in
               cls.decorator_list)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# The walk
# ---------------------------------------------------------------------------------------------------------------


def check_uses(
    source: str,
    tree: Path,
    *,
    module_name: str = "specwake.worker",
    lines: set[int] | None = None,
    self_classes: dict[str, tuple[str, ...]] | None = None,
    version: str | None = None,
) -> Report:
    """Check `source` against the release in `tree`. `module_name`: the module `source` is (for relative imports
    of a patched vLLM file); `lines`: check only uses on these lines (what a patch adds to a vLLM file);
    `self_classes`: for a class of `source` that is not a vLLM subclass, the vLLM classes its `self` is; `version`:
    the release's version where its tree has no version file (a source checkout)."""
    checker = Checker(Release(tree, version), lines, dict(self_classes or {}))
    checker.source_lines = source.splitlines()
    module = ast.parse(source)
    checker.probed = {
        node.args[1].value
        for node in ast.walk(module)
        if isinstance(node, ast.Call) and _dotted(node.func) in ("hasattr", "getattr") and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
    }  # fmt: skip
    _walk_body(checker, module.body, {}, guarded=False, module_name=module_name, self_ref=None)
    checker.report.problems = list(dict.fromkeys(checker.report.problems))  # a line read twice is one problem
    return checker.report


UNUSED = "unused"  # Checker.absent_where: a handler whose `try:` imported everything (it never runs there)
_ABSENT_WHERE = re.compile(r"#\s*vLLM\s*((?:[<>=!~]=?\s*\d+(?:\.\d+)*\s*,?\s*)+):\s*(\S.*)$")


def _absent_where(lines: list[str], node: ast.Try) -> tuple[SpecifierSet, str] | None:
    """The releases a guarded import may be absent in, and why, as the `except` line of its `try:` says them:
    `except ImportError:  # vLLM < 0.34: no extensible KV cache`. None where no handler says."""
    for handler in node.handlers:
        line = lines[handler.lineno - 1] if 0 < handler.lineno <= len(lines) else ""
        said = _ABSENT_WHERE.search(line)
        if said:
            try:
                return SpecifierSet(said[1].replace(" ", "")), said[2].strip()
            except InvalidSpecifier:
                return None
    return None


def _guarded_try(node: ast.Try) -> bool:
    for handler in node.handlers:
        names = [handler.type] if not isinstance(handler.type, ast.Tuple) else list(handler.type.elts)
        if handler.type is None or any(_dotted(n) in _IMPORT_ERRORS for n in names if n is not None):
            return True
    return False


def _walk_body(
    c: Checker, body: list[ast.stmt], scope: dict[str, Ref], guarded: bool, module_name: str, self_ref: Ref | None
) -> None:
    for stmt in body:
        _walk_stmt(c, stmt, scope, guarded, module_name, self_ref)


def _walk_stmt(
    c: Checker, stmt: ast.stmt, scope: dict[str, Ref], guarded: bool, module_name: str, self_ref: Ref | None
) -> None:
    if isinstance(stmt, ast.ImportFrom):
        c.import_from(stmt, scope, guarded, module_name)
        return
    if isinstance(stmt, ast.Import):
        c.import_(stmt, scope, guarded)
        return
    if isinstance(stmt, ast.Try):
        fallback = _guarded_try(stmt)
        missing_before = (len(c.report.optional_missing), len(c.report.problems))
        if fallback:
            c.absent_where.append(_absent_where(c.source_lines, stmt))
        _walk_body(c, stmt.body, scope, guarded or fallback, module_name, self_ref)
        # `try: from A import x` / `except ImportError: from B import x`: where A is missing, B must be there
        body_complete = (len(c.report.optional_missing), len(c.report.problems)) == missing_before
        c.alternatives += fallback
        if fallback:
            c.absent_where[-1] = UNUSED if body_complete else None
        for handler in stmt.handlers:
            _walk_body(c, handler.body, scope, guarded or (fallback and body_complete), module_name, self_ref)
        if fallback:
            c.absent_where.pop()
        c.alternatives -= fallback
        _walk_body(c, stmt.orelse + stmt.finalbody, scope, guarded, module_name, self_ref)
        return
    if isinstance(stmt, ast.ClassDef):
        _walk_class(c, stmt, scope, guarded, module_name)
        return
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        _walk_function(c, stmt, scope, guarded, module_name, self_ref)
        return
    compound = isinstance(stmt, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Match))
    # the statement's own expressions (a compound statement's header): calls and attribute reads
    headers = [n for n in ast.iter_child_nodes(stmt) if not isinstance(n, ast.stmt)] if compound else [stmt]
    for header in headers:
        for node in ast.walk(header):
            if isinstance(node, ast.Call):
                c.call(node, scope)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                c.ref_of(node, scope)
    # assignments give names a known class
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        _assign(c, stmt.targets[0], stmt.value, scope)
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        _assign(c, stmt.target, stmt.value, scope)
    if compound:
        for block in ("body", "orelse", "finalbody"):
            _walk_body(c, getattr(stmt, block, []), scope, guarded, module_name, self_ref)
        for case in getattr(stmt, "cases", []):
            _walk_body(c, case.body, scope, guarded, module_name, self_ref)


def _assign(c: Checker, target: ast.expr, value: ast.expr, scope: dict[str, Ref]) -> None:
    if isinstance(target, ast.Name):
        ref = _quiet_ref(c, value, scope)
        if ref is not None and ref.kind == "instance":
            scope[target.id] = ref
        else:
            scope.pop(target.id, None)
    elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        for t, v in zip(target.elts, value.elts, strict=True):
            _assign(c, t, v, scope)


def _quiet_ref(c: Checker, expr: ast.expr, scope: dict[str, Ref]) -> Ref | None:
    """ref_of without reporting again (the statement's walk already checked the expression)."""
    saved = (list(c.report.problems), c.report.checked)
    try:
        return c.ref_of(expr, scope)
    finally:
        c.report.problems, c.report.checked = saved


def _walk_class(c: Checker, cls: ast.ClassDef, scope: dict[str, Ref], guarded: bool, module_name: str) -> None:
    vllm_bases: list[str] = []
    for base in cls.bases:
        ref = c.ref_of(base, scope)
        if ref is not None and ref.kind == "object" and isinstance(ref.node, ast.ClassDef):
            vllm_bases.append(ref.dotted)
    own = f"{module_name}.{cls.name}"
    if module_name.startswith("vllm.") and c.release.class_node(own) is not None:
        classes: tuple[str, ...] = (own,)  # a class of a patched vLLM file: `self` is the release's class
        vllm_bases = []
    else:
        classes = tuple(vllm_bases) or c.self_classes.get(cls.name, ())
    self_ref = Ref("instance", classes=classes, own=frozenset(_own_members(cls))) if classes else None
    class_scope = dict(scope)
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and vllm_bases:
            _check_override(c, stmt, tuple(vllm_bases))
        _walk_stmt(c, stmt, class_scope, guarded, module_name, self_ref)


def _own_members(cls: ast.ClassDef) -> set[str]:
    """What a class of the checked code defines itself: methods, class attributes, `self.x = ...`."""
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _dotted(node.value) == "self":
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _check_override(c: Checker, fn: ast.FunctionDef | ast.AsyncFunctionDef, bases: tuple[str, ...]) -> None:
    for base in bases:
        found = c.release.members(base)[0].get(fn.name)
        if not isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name.startswith("__"):
            continue
        c.report.checked += 1
        ours = {p.arg for p in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
        theirs = [p.arg for p in found.args.posonlyargs + found.args.args + found.args.kwonlyargs]
        missing = [p for p in theirs[1:] if p not in ours] if fn.args.kwarg is None else []
        n_ours, n_theirs = len(fn.args.posonlyargs + fn.args.args), len(found.args.posonlyargs + found.args.args)
        if missing or (n_ours < n_theirs and fn.args.vararg is None):
            c.problem(fn, f"{fn.name} overrides {base}.{fn.name}{_signature(found)} but takes {_signature(fn)}")


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return "(" + ", ".join(p.arg for p in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs) + ")"


def _walk_function(
    c: Checker,
    fn: ast.FunctionDef | ast.AsyncFunctionDef,
    scope: dict[str, Ref],
    guarded: bool,
    module_name: str,
    self_ref: Ref | None,
) -> None:
    local = dict(scope)
    params = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    for index, param in enumerate(params):
        if index == 0 and self_ref is not None and param.arg == "self":
            local["self"] = self_ref
        elif param.arg in KNOWN_PARAMETERS:
            local[param.arg] = c.known_parameter(param)
        else:
            local.pop(param.arg, None)
    _walk_body(c, fn.body, local, guarded, module_name, self_ref)
