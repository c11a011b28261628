"""YAML that cannot hurt: PyYAML's safe loader with limits checked before any Python
object is built (depth, size once aliases are expanded, integer length, duplicate keys),
and its errors as one line. The config and kubeconfigs are read through it."""

from __future__ import annotations

from typing import Any

import yaml


def shown(value: Any) -> str:
    """A value quoted in an error line, never longer than a line should be."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


MAX_DEPTH = 32  # nesting, aliases expanded: the config is at most 5 levels deep
MAX_NODES = 50_000  # scalars, lists and mappings, aliases expanded
MAX_INT_DIGITS = 24  # every number the config takes fits in 64 bits


class _SafeLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader with limits checked before any Python object is built:
    nesting depth, size once aliases are expanded (an alias bomb is a few hundred bytes),
    integer length, and duplicate keys (a second `rails:` would silently win)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.YAMLError(f"line {mark.line + 1}: invalid YAML: nested deeper than "
                                     f"{MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node,
                                                                          yaml.ScalarNode):
                continue
            key = key_node.value
            if key in seen:
                raise yaml.YAMLError(
                    f"line {key_node.start_mark.line + 1}: duplicate key {shown(key)} "
                    f"(first on line {seen[key]})")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = str(node.value).replace("_", "")
        if len(text.lstrip("+-")) > MAX_INT_DIGITS:
            raise yaml.YAMLError(f"line {node.start_mark.line + 1}: integer with more than "
                                 f"{MAX_INT_DIGITS} digits")
        _not_yaml11_only(node, text)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        _not_yaml11_only(node, str(node.value).replace("_", ""))
        return super().construct_yaml_float(node)


def _not_yaml11_only(node: yaml.ScalarNode, text: str) -> None:
    """YAML 1.1 reads `25:00` as 1500 (base 60) and `0100` as 64 (octal): numbers no one
    writing a config means. Refused, so a value is never silently another one."""
    digits = text.lstrip("+-")
    if ":" in digits:
        what = "a base-60 number"
    elif len(digits) > 1 and digits[0] == "0" and digits[1:].isdigit():
        what = "an octal number"
    else:
        return
    raise yaml.YAMLError(f"line {node.start_mark.line + 1}: {shown(node.value)} is {what} in "
                         f"YAML 1.1, not what it looks like: quote it, or write the number "
                         "in decimal")


_SafeLoader.add_constructor("tag:yaml.org,2002:int", _SafeLoader.construct_yaml_int)
_SafeLoader.add_constructor("tag:yaml.org,2002:float", _SafeLoader.construct_yaml_float)


def _check_expanded(root: yaml.Node) -> None:
    """Walk the composed graph as the constructor would, aliases expanded, within limits."""
    count = 0
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise yaml.YAMLError(f"invalid YAML: more than {MAX_NODES} values once aliases "
                                 "are expanded")
        if depth > MAX_DEPTH:
            raise yaml.YAMLError(f"invalid YAML: nested deeper than {MAX_DEPTH} levels once "
                                 "aliases are expanded")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.append((key, depth + 1))
                stack.append((value, depth + 1))


def safe_yaml(text: str) -> Any:
    """YAML text -> Python data, refusing what could exhaust time or memory. Raises
    yaml.YAMLError with a one-line message."""
    loader = _SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_expanded(root)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as one line, with the line it is on."""
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return str(exc).splitlines()[0]
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}: invalid YAML: {problem}"
